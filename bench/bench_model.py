"""Model benchmark: training time with default model selection, gating throughput, peak memory.

- Training: 10 simulated patients of 50,000 cells (9 channels, flow), default ``GatingModel``
  (cross-validated selection on), against LDA trained on the same data in the same run.
- Gating: one 1,000,000-event FCS file, file reading included, streamed in chunks; events per
  second and peak memory, against LDA's predict on the same events in the same run.
- Real data: when ../shared/data/multicenter is present, training on its 10 samples too.

Run: ``python bench/bench_model.py`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation.baselines import LDABaseline  # noqa: E402
from gating_core.fcs import read_fcs, write_fcs  # noqa: E402
from gating_core.model import GatingModel  # noqa: E402
from gating_core.synthetic import simulate_patient  # noqa: E402

MULTICENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multicenter"


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def bench_training(n_patients=10, n_events=50_000) -> dict:
    cohort = [simulate_patient((7, i), n_events=n_events) for i in range(n_patients)]
    samples = [s.compensate() for s, _ in cohort]
    labels = [y for _, y in cohort]
    start = time.perf_counter()
    model = GatingModel().fit(samples, labels)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    LDABaseline().fit(samples, labels)
    lda_seconds = time.perf_counter() - start
    start = time.perf_counter()
    GatingModel(select=False).fit(samples, labels)
    no_selection = time.perf_counter() - start
    return {"model": model, "train_seconds": train_seconds, "train_no_selection_seconds": no_selection,
            "lda_train_seconds": lda_seconds}


def bench_multicenter_training() -> dict | None:
    if not (MULTICENTER / "multicenter_01.fcs").exists():
        return None
    from gating_core.io.inputs import load_labeled_input

    data = [load_labeled_input(p) for p in sorted(MULTICENTER.glob("multicenter_*.fcs"))]
    start = time.perf_counter()
    GatingModel().fit([d[0] for d in data], [d[1] for d in data])
    return {"patients": len(data), "events": sum(d[0].n_events for d in data),
            "train_seconds": time.perf_counter() - start}


def bench_gating(model: GatingModel, n_events=1_000_000, repeats=2) -> dict:
    sample, _ = simulate_patient((7, 99), n_events=n_events)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.fcs"
        spill = ",".join([str(len(sample.spillover_channels))] + sample.spillover_channels
                         + [repr(float(v)) for v in np.asarray(sample.spillover).ravel()])
        write_fcs(path, sample.events, sample.pnn, sample.pns, {"$SPILLOVER": spill})
        del sample
        best = np.inf
        _reset_peak()
        base_rss = _peak_rss_mb()
        for _ in range(repeats):
            start = time.perf_counter()
            loaded = read_fcs(path, compensate=True)
            result = model.gate(loaded)
            best = min(best, time.perf_counter() - start)
        peak = _peak_rss_mb() - base_rss
        event_mb = loaded.events.nbytes / 2**20
        lda = LDABaseline()
        lda.preprocessing_ = model
        from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

        cells = model.standardised_cells(loaded)
        lda.lda_ = LinearDiscriminantAnalysis().fit(cells[::20], result.populations[::20])
        lda_best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            read_fcs(path, compensate=True)
            lda.predict(loaded)
            lda_best = min(lda_best, time.perf_counter() - start)
    return {"events": n_events, "seconds": best, "events_per_second": n_events / best,
            "lda_seconds": lda_best, "ratio_to_lda": best / lda_best, "peak_mb": peak, "event_array_mb": event_mb}


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the gated file")
    args = parser.parse_args(list(argv))
    print("== Model: training (10 patients x 50,000 cells, default selection) ==", flush=True)
    training = bench_training()
    print(f"train (default, CV selection): {training['train_seconds']:.1f} s   target <= 60 s")
    print(f"train (no selection):          {training['train_no_selection_seconds']:.1f} s")
    print(f"LDA train (same data):         {training['lda_train_seconds']:.2f} s   "
          f"ratio {training['train_seconds'] / training['lda_train_seconds']:.0f}x")
    real = bench_multicenter_training()
    if real:
        print(f"train on multicenter ({real['patients']} patients, {real['events']:,} events): {real['train_seconds']:.1f} s")
    print(f"== Model: gating one {args.events:,}-event FCS file (reading + compensation included) ==", flush=True)
    gating = bench_gating(training["model"], args.events)
    print(f"gate: {gating['seconds']:.2f} s = {gating['events_per_second'] / 1e6:.2f} M events/s   target >= 1.0 M events/s")
    print(f"LDA (read + predict, same file): {gating['lda_seconds']:.2f} s; gate / LDA time ratio {gating['ratio_to_lda']:.1f}x")
    print(f"peak memory growth while gating: {gating['peak_mb']:.0f} MB "
          f"(event array {gating['event_array_mb']:.0f} MB; {gating['peak_mb'] / gating['event_array_mb']:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
