"""Progress of long command-line steps: a bar on a terminal, a line now and then in a log."""

from __future__ import annotations

from gating_core import progress as progress_module
from gating_core.progress import StageProgress


def test_off_a_terminal_a_long_run_writes_a_line_now_and_then(capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    progress = StageProgress("evaluate", enabled=False, log_interval=60)
    progress("fold 1 of 4", 0.1)
    now[0] += 59
    progress("fold 2 of 4", 0.3)
    assert capsys.readouterr().err == ""  # a short run prints nothing
    now[0] += 2
    progress("fold 3 of 4", 0.55)
    now[0] += 30
    progress("fold 4 of 4", 0.8)
    assert capsys.readouterr().err == "evaluate: 55% (fold 3 of 4)\n"
    quiet = StageProgress("train", enabled=False, log_interval=None)
    now[0] += 1000
    quiet("all", 1.0)
    assert capsys.readouterr().err == ""
