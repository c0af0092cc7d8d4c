"""What self-training at gating time (``ResearchGatingModel.self_training``, an option) costs,
against the same fitted model gating without it, in the same run on the same patient.

The model is the default trained on simulated cohort 14's first three centers (9 patients, as in
``bench_second_bandwidth.py``). One simulated patient of ``--events`` events is gated in memory
(``GatingModel.gate``) both ways, alternating, ``--repeats`` times, fastest kept; events per
second and the ratio. The self-training step scores the patient's content-chosen cells once
(at most ``embedding_cells``), fits the pseudo-labels, then adds one set of the marginal model's
features to every gated cell.

Run: ``python bench/bench_self_training.py [--events 1000000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_second_bandwidth import _fastest_of_each  # noqa: E402

from gating_core.model.research import ResearchGatingModel  # noqa: E402
from gating_core.synthetic import simulate_centers  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cohort, centers = simulate_centers(4, 3, seed=14, n_events=6000, strength=2.0)
    kept = [i for i, (s, _) in enumerate(cohort) if centers[s.name] != "center_4"]
    start = time.perf_counter()
    model = ResearchGatingModel().fit([cohort[i][0] for i in kept], [cohort[i][1] for i in kept],
                              groups=[centers[cohort[i][0].name] for i in kept])
    print(f"== trained the default on simulated cohort 14, centers 1-3 (9 patients): "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    sample = simulate_centers(1, 1, seed=99, n_events=args.events, strength=2.0)[0][0][0]
    print(f"== gating one simulated patient of {sample.n_events:,} events (in memory)", flush=True)

    def gate(flag):
        model.self_training = flag
        return model.gate(sample)

    seconds, results = _fastest_of_each({"without self-training": lambda: gate(False),
                                         "self-training (default)": lambda: gate(True)}, args.repeats)
    rates = {}
    for label, best in seconds.items():
        rates[label] = sample.n_events / best
        print(f"   {label}: {best:.2f} s = {rates[label]:,.0f} events/s", flush=True)
    changed = np.mean(results["self-training (default)"].populations != results["without self-training"].populations)
    print(f"   self-training / without: x{rates['self-training (default)'] / rates['without self-training']:.2f} "
          f"of the throughput; {changed:.2%} of the events change population")
    return 0


if __name__ == "__main__":
    sys.exit(main())
