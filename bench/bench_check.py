"""What the leave-one-patient-out check costs against one training, same run, same settings.

For each cohort: one training of the default model on all patients; the check by subtraction
(``leave_one_patient_out(..., refit="subtract")``, the default of ``evaluate`` and of the app);
and, unless ``--no-full``, the check by full refits (one training per fold). Prints the times,
the ratios check / training (the target: at most 2) and the accuracies of both checks
per patient, so that what subtraction changes is visible beside what it saves.

Both wall time and this process's CPU time (all its threads) are printed: on a machine shared
with other CPU-bound work the wall-time ratio moves with the load (training sizes its BLAS
threads from the idle CPUs, the check's fold pools from the usable ones), the CPU-time ratio
much less. The 1-minute load average at the start of each cohort is printed with it.

Cohorts: the bundled sample data (8 labeled patients) and the shared multicenter samples
(10 patients) when present.

Run: ``python bench/bench_check.py [--no-full] [--methods marginal,pooled-logistic]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation import METHOD_SETTINGS, leave_one_patient_out, summarize  # noqa: E402
from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.model.research import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MULTICENTER = ROOT.parent / "shared" / "data" / "multicenter"


def cohorts():
    sample = [load_labeled_input(p) for p in sorted((ROOT / "sample_data").glob("patient_*.fcs"))]
    yield "sample data", [d[0] for d in sample], [d[1] for d in sample]
    files = sorted(MULTICENTER.glob("multicenter_*.fcs"))
    if files:
        data = [load_labeled_input(p) for p in files]
        yield "shared multicenter", [d[0] for d in data], [d[1] for d in data]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-full", action="store_true", help="skip the check by full refits")
    parser.add_argument("--methods", default="marginal")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    for name, samples, labels in cohorts():
        for method in methods:
            settings = METHOD_SETTINGS[method]
            load = os.getloadavg()[0]
            start, cpu = time.perf_counter(), time.process_time()
            build_model(settings).fit(samples, labels)
            train_s, train_cpu = time.perf_counter() - start, time.process_time() - cpu
            start, cpu = time.perf_counter(), time.process_time()
            fast = leave_one_patient_out(samples, labels, methods=(method,), refit="subtract")
            fast_s, fast_cpu = time.perf_counter() - start, time.process_time() - cpu
            line = (f"{name}, {method}, {len(samples)} patients (load {load:.1f}): training {train_s:.1f} s "
                    f"({train_cpu:.1f} CPU s); check by subtraction {fast_s:.1f} s ({fast_cpu:.1f} CPU s): "
                    f"x{fast_s / train_s:.2f} one training in time, x{fast_cpu / train_cpu:.2f} in CPU time")
            if not args.no_full:
                start = time.perf_counter()
                full = leave_one_patient_out(samples, labels, methods=(method,), refit="full")
                full_s = time.perf_counter() - start
                line += f"; by full refits {full_s:.1f} s (x{full_s / train_s:.2f}); subtraction saves x{full_s / fast_s:.1f}"
            print(line, flush=True)
            summary = summarize(fast).iloc[0]
            text = f"  by subtraction: mean {summary.mean_accuracy:.4f} / worst {summary.worst_accuracy:.4f}"
            if not args.no_full:
                whole = summarize(full).iloc[0]
                gap = np.abs(fast["accuracy"].to_numpy() - full["accuracy"].to_numpy())
                text += (f"; by full refits: mean {whole.mean_accuracy:.4f} / worst {whole.worst_accuracy:.4f}; "
                         f"largest per-patient difference {gap.max():.4f}")
            print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
