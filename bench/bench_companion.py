"""What the pooled companion of the marginal method costs: training and gating time, same run.

Trains the default model (``pooled_weight=0.5``) and the marginal model alone
(``pooled_weight=0``) on the same patients, gates the same held-out patient three times with
each, and prints the times and their ratio (blend / alone). Uses the shared multicenter
samples when present (8 train, 1 gated), else a simulated cohort.

Run: ``python bench/bench_companion.py``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.model import GatingModel  # noqa: E402
from gating_core.synthetic import simulate_centers  # noqa: E402

MULTICENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multicenter"


def cohort():
    files = sorted(MULTICENTER.glob("multicenter_*.fcs"))
    if files:
        data = [load_labeled_input(p) for p in files]
        return "shared multicenter", [d[0] for d in data], [d[1] for d in data]
    data, _ = simulate_centers(3, 3, seed=11, n_events=50000, strength=2.0)
    return "simulated", [d[0] for d in data], [d[1] for d in data]


def main() -> int:
    name, samples, labels = cohort()
    train, new, truth = samples[:8], samples[-1], labels[-1]
    timings = {}
    for weight in (0.0, 0.5):
        start = time.perf_counter()
        model = GatingModel(pooled_weight=weight).fit(train, labels[:8])
        fit_s = time.perf_counter() - start
        model.gate(new)  # warm-up
        start = time.perf_counter()
        for _ in range(3):
            result = model.gate(new)
        gate_s = (time.perf_counter() - start) / 3
        timings[weight] = (fit_s, gate_s)
        print(f"{name}, pooled_weight={weight}: training 8 patients {fit_s:.1f} s; gating {new.n_events:,} events "
              f"{gate_s:.3f} s ({new.n_events / gate_s / 1e6:.2f} M events/s); accuracy on {new.name} "
              f"{np.mean(result.populations == truth):.4f}", flush=True)
    print(f"blend / alone: training x{timings[0.5][0] / timings[0.0][0]:.2f}, "
          f"gating x{timings[0.5][1] / timings[0.0][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
