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


def test_evaluate_reports_one_rising_fraction_over_both_protocols(monkeypatch, tmp_path, capsys):
    from gating_core import cli
    from gating_core.synthetic import write_centers

    paths = write_centers(tmp_path, n_centers=2, patients_per_center=2, seed=4, n_events=600, strength=1.0)
    seen = []
    monkeypatch.setattr(StageProgress, "__call__", lambda self, stage, fraction: seen.append((stage, fraction)))
    assert cli.main(["evaluate", "--groups", str(tmp_path / "groups.csv"), "--method", "lda",
                     *[str(p) for p in paths if p.suffix == ".fcs"]]) == 0
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and 0 <= fractions[0] and fractions[-1] <= 1
    stages = [s for s, _ in seen]
    assert any(s.startswith("groups: ") for s in stages) and any(s.startswith("patients: ") for s in stages)
    assert max(f for s, f in seen if s.startswith("groups: ")) <= 0.5 <= min(
        f for s, f in seen if s.startswith("patients: "))


def test_evaluate_over_seeds_reports_one_rising_fraction(monkeypatch, tmp_path):
    from gating_core import cli
    from gating_core.synthetic import write_centers

    paths = write_centers(tmp_path, n_centers=2, patients_per_center=2, seed=4, n_events=600, strength=1.0)
    seen = []
    monkeypatch.setattr(StageProgress, "__call__", lambda self, stage, fraction: seen.append((stage, fraction)))
    assert cli.main(["evaluate", "--groups", str(tmp_path / "groups.csv"), "--method", "lda",
                     *[str(p) for p in paths if p.suffix == ".fcs"], "--seeds", "1", "2"]) == 0
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[-1] <= 1
    assert {s.split(":")[0] for s, _ in seen} == {"seed 1", "seed 2"}
    assert max(f for s, f in seen if s.startswith("seed 1:")) <= 0.5 <= min(f for s, f in seen if s.startswith("seed 2:"))
