"""What splitting populations into Gaussian components costs in training: the default model
against the same model with every population one Gaussian (``population_components=1``), trained
on the same patients in the same run, alternating, best of ``--repeats``; and which populations
each training splits.

Sets: ``bench_unseen.py``'s (``--sets``, default the multicenter samples, the second DLBCL batch,
and that batch with FL2+ against everything else, where a split is kept). Gating costs nothing
more where no population is split (the same arrays); a split population adds a component to
both generative fits' per-cell products.

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
    return time.perf_counter() - start, model.describe()["split_populations"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="mc-pair,dlbcl-batch,dlbcl-batch+fl2-rest")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"{'set':<24} {'patients':>8} {'whole s':>8} {'split s':>8} {'ratio':>6}  split populations")
    for name in [s for s in args.sets.split(",") if s]:
        loaded = load_set(name)
        if loaded is None:
            print(f"{name:<24} data not found, skipped")
            continue
        samples, labels, groups = loaded
        # One group's patients (the last one's: the second DLBCL batch), as one fold of the set's protocol
        # trains on.
        if name.split("+")[0] in ("dlbcl-batch", "mc-batch"):
            kept = [i for i, g in enumerate(groups) if g == groups[-1]]
            samples, labels, groups = ([part[i] for i in kept] for part in (samples, labels, groups))
        whole, split, found = [], [], {}
        for _ in range(args.repeats):
            whole.append(_train(samples, labels, groups, 1)[0])
            seconds, found = _train(samples, labels, groups, 3)
            split.append(seconds)
        print(f"{name:<24} {len(samples):>8} {min(whole):>8.1f} {min(split):>8.1f} {min(split) / min(whole):>6.2f}  "
              f"{found or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
