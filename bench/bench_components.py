"""What splitting populations into Gaussian components costs: the default model against the same
model with every population one Gaussian (``population_components=1``), trained on the same
patients in the same run, alternating, best of ``--repeats``; which populations each training
splits; and both models' gating speed (events/s, best of ``--repeats``, ``GatingModel.gate`` in
memory on every patient of the set that the models were not trained on, or on every patient where
they were trained on all).

Sets: ``bench_unseen.py``'s (``--sets``, default the multicenter samples, the second DLBCL batch,
and that batch with FL2+ against everything else, where a split is kept). Where no population
is split, gating runs on the same arrays; a split population adds a component to both
generative fits' per-cell products.

Run: ``python bench/bench_components.py --sets mc-pair,dlbcl-batch,dlbcl-batch+fl2-rest``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_unseen import load_set  # noqa: E402

from gating_core.model.research import build_model  # noqa: E402


def _train(samples, labels, groups, components: int) -> tuple:
    model = build_model({"population_components": components, "random_state": 0})
    start = time.perf_counter()
    model.fit(samples, labels, groups=groups)
    return time.perf_counter() - start, model


def _gating_rate(model, samples) -> float:
    """Events per second of gating ``samples`` one after the other."""
    start = time.perf_counter()
    for sample in samples:
        model.gate(sample)
    return sum(len(sample.events) for sample in samples) / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="mc-pair,dlbcl-batch,dlbcl-batch+fl2-rest")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"{'set':<24} {'patients':>8} {'whole s':>8} {'split s':>8} {'ratio':>6} {'gated':>8} "
          f"{'whole ev/s':>10} {'split ev/s':>10} {'ratio':>6}  split populations")
    for name in [s for s in args.sets.split(",") if s]:
        loaded = load_set(name)
        if loaded is None:
            print(f"{name:<24} data not found, skipped")
            continue
        samples, labels, groups = loaded
        # One group's patients (the last one's: the second DLBCL batch), as one fold of the set's protocol
        # trains on; the others are gated. Without groups to spare, every patient is both.
        gated = samples
        if name.split("+")[0] in ("dlbcl-batch", "mc-batch"):
            kept = [i for i, g in enumerate(groups) if g == groups[-1]]
            gated = [samples[i] for i in range(len(samples)) if i not in kept]
            samples, labels, groups = ([part[i] for i in kept] for part in (samples, labels, groups))
        whole, split, whole_rate, split_rate = [], [], [], []
        for _ in range(args.repeats):
            seconds, whole_model = _train(samples, labels, groups, 1)
            whole.append(seconds)
            seconds, split_model = _train(samples, labels, groups, 3)
            split.append(seconds)
            whole_rate.append(_gating_rate(whole_model, gated))
            split_rate.append(_gating_rate(split_model, gated))
        found = split_model.describe()["split_populations"]
        print(f"{name:<24} {len(samples):>8} {min(whole):>8.1f} {min(split):>8.1f} {min(split) / min(whole):>6.2f} "
              f"{sum(len(s.events) for s in gated):>8} {max(whole_rate):>10,.0f} {max(split_rate):>10,.0f} "
              f"{max(split_rate) / max(whole_rate):>6.2f}  {found or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
