"""Benchmark: the app server's memory with several browser sessions on one patient library.

Several sessions of the app run in one process (Streamlit's AppTest: the same scripts, the same
``st.cache_data`` caches and module-level state as the server), each on the same library of
simulated patients: the Data page, Explore (three patients side by side), Gate, and Auto-gate
(the new patients gated with the library's model). A round opens ``--sessions`` sessions at
once and then closes them all; ``--rounds`` rounds follow one another, as people come and go.

Printed after each step: the process's resident memory (RSS, from /proc) and the Python heap
traced by ``tracemalloc`` (numpy's arrays included; what the process holds, not what the
allocator keeps from the system). What to look at: how much one more session costs, and what
stays once every session has gone.

Run: ``.venv/bin/python bench/bench_sessions_memory.py [--sessions 3] [--rounds 2] [--events 200000]``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
logging.getLogger("streamlit").setLevel(logging.ERROR)

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def heap_mb() -> float:
    return tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else float("nan")


def shared_values() -> str:
    try:
        from ui.shared import held
    except ImportError:  # code from before events were shared between sessions
        return ""
    return f"   shared values {held()}"


def report(step: str, rows: list) -> None:
    gc.collect()
    row = (step, rss_mb(), heap_mb())
    rows.append(row)
    print(f"{step:<44} RSS {row[1]:7.1f} MB   heap {row[2]:7.1f} MB{shared_values()}", flush=True)


def top(n: int) -> None:
    if n <= 0 or not tracemalloc.is_tracing():
        return
    for stat in tracemalloc.take_snapshot().statistics("lineno")[:n]:
        frame = stat.traceback[0]
        print(f"    {stat.size / 2**20:8.1f} MB  {stat.count:7d} blocks  {frame.filename}:{frame.lineno}")


def build_library(path: Path, n_labeled: int, n_new: int, n_events: int) -> None:
    """Simulated patients (labeled and new) and one quick model, stored in the library."""
    from gating_core.library import PatientLibrary
    from gating_core.model import GatingModel
    from gating_core.synthetic import simulate_patient

    library = PatientLibrary(path)
    samples, labels = [], []
    for i in range(n_labeled + n_new):
        name = f"patient_{i + 1:02d}" if i < n_labeled else f"new_patient_{i - n_labeled + 1:02d}"
        sample, y = simulate_patient((7, i), n_events=n_events, name=name, drift=1.0 if i < n_labeled else 1.5)
        library.add_patient(sample, y if i < n_labeled else None, name=name)
        if i < n_labeled:
            samples.append(library.load_sample(name, compensate=True))
            labels.append(y)
    model = GatingModel(select=False, cells_per_patient=1500, random_state=0).fit(samples, labels)
    model_file = path.parent / "bench-model.npz"
    model.save(model_file)
    library.add_model(model_file, f"marginal, {n_labeled} patients", [s.name for s in samples], None, "marginal")
    model_file.unlink()


def browse(at) -> None:
    """What one person does: every page, three patients explored, the new patients auto-gated."""
    for page in ("pages/2_explore.py", "pages/3_gate.py", "pages/5_autogate.py"):
        at.switch_page(page)
        at.run()
        assert not at.exception, at.exception
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception, at.exception
    at.switch_page("pages/1_data.py")
    at.run()
    assert not at.exception, at.exception


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=3, help="sessions open at once in a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--events", type=int, default=200_000, help="events per patient")
    parser.add_argument("--labeled", type=int, default=6)
    parser.add_argument("--new", type=int, default=3)
    parser.add_argument("--no-tracemalloc", action="store_true", help="RSS only (tracemalloc slows the run)")
    parser.add_argument("--top", type=int, default=0, metavar="N",
                        help="also print the N code lines holding most memory with every session open and after")
    parser.add_argument("--build", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:
        build_library(Path(args.build), args.labeled, args.new, args.events)
        return 0

    from streamlit.testing.v1 import AppTest

    rows: list = []
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        library = Path(tmp) / "library"
        t0 = time.perf_counter()
        # Built by another process: what this one holds is then the app's alone.
        subprocess.run([sys.executable, __file__, "--build", str(library), "--labeled", str(args.labeled),
                        "--new", str(args.new), "--events", str(args.events)], check=True)
        os.environ["GATING_LIBRARY"] = str(library)
        os.environ.pop("GATING_LOAD_SAMPLE_DATA", None)
        print(f"library: {args.labeled} labeled + {args.new} new patients x {args.events:,} events "
              f"({time.perf_counter() - t0:.0f} s to build); {args.sessions} sessions x {args.rounds} rounds",
              flush=True)
        if not args.no_tracemalloc:
            tracemalloc.start()
        # A first session alone warms imports and Streamlit's machinery, then goes.
        warm = AppTest.from_file(APP, default_timeout=900)
        warm.run()
        del warm
        report("before any session (imports warm)", rows)
        for r in range(1, args.rounds + 1):
            sessions = []
            for s in range(args.sessions):
                at = AppTest.from_file(APP, default_timeout=900)
                at.run()
                browse(at)
                sessions.append(at)
                report(f"round {r}: {s + 1} session(s) open", rows)
            top(args.top)
            del sessions, at
            gc.collect()
            time.sleep(3)  # what the server does a few seconds after the last browser closed
            report(f"round {r}: every session closed", rows)
            top(args.top)
        tracemalloc.stop()
    first, last = rows[0], rows[-1]
    peak = max(rows, key=lambda row: row[1])
    print(f"\nRSS {first[1]:.0f} MB before, {peak[1]:.0f} MB at most, {last[1]:.0f} MB after every session closed "
          f"(heap {first[2]:.0f} -> {peak[2]:.0f} -> {last[2]:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
