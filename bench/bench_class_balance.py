"""Population-balanced training draws (``class_balance``) on groups the model has never seen.

For each data set, each ``class_balance`` and each model seed (``random_state``: the cell draws,
the random features and the selection folds), the default model is evaluated leaving one group
out; the table gives, per data set and ``class_balance``, the mean over the model seeds of the
run's mean and worst held-out patient, in accuracy and in macro-F1 (the F1 of every population
weighs the same, so rare populations count).

Data sets:

- ``multicenter``: the shared CyTOF samples (when present), leaving one replicate pair out;
- ``sim:SEED``: ``simulate_centers(4, 3, seed=SEED, strength=2.0)``, 6,000 events a patient,
  leaving one center out;
- ``rare:SEED``: the same simulator's centers (strength 1.5) with B and NK cells at a tenth of
  their usual share (about 0.5% of the events each), 20,000 events a patient, population shares
  drawn per patient around the center's (Dirichlet, concentration 300), leaving one center out.

Run: ``python bench/bench_class_balance.py [--data multicenter sim:13 rare:31 ...]
[--balance 0 1] [--seeds 0 1 2] [--csv FILE]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gating_core.evaluation import leave_one_group_out  # noqa: E402

DEFAULT_DATA = ("multicenter", "sim:11", "sim:13", "sim:14", "rare:31", "rare:32")


def rare_cohort(seed: int, n_events: int = 20000, factor: float = 0.1, strength: float = 1.5,
                concentration: float = 300.0):
    """4 centers x 3 patients whose B and NK cells are ``factor`` of their usual share."""
    from gating_core.synthetic import draw_center
    from gating_core.synthetic.panel import _TYPICAL_PROPORTIONS, POPULATIONS
    from gating_core.synthetic.patients import simulate_patient

    mean = _TYPICAL_PROPORTIONS.copy()
    for name in ("B cells", "NK cells"):
        mean[POPULATIONS.index(name)] *= factor
    samples, labels, groups = [], [], []
    for c in range(4):
        center = draw_center((seed, 7, c), name=f"center_{c + 1}", strength=strength)
        for j in range(3):
            shares = mean * center.proportion_shift
            shares = np.random.default_rng([seed, 9, c, j]).dirichlet(shares / shares.sum() * concentration)
            sample, y = simulate_patient((seed, 8, c, j), n_events=n_events, drift=0.3,
                                         name=f"c{c + 1}_patient_{j + 1:02d}", center=center, proportions=shares)
            samples.append(sample)
            labels.append(y)
            groups.append(center.name)
    return samples, labels, groups


def load(name: str):
    if name == "multicenter":
        from multicenter_data import MULTICENTER, load_multicenter

        if not MULTICENTER.exists():
            return None
        samples, labels, pairs, _ = load_multicenter()
        return samples, labels, pairs
    kind, _, seed = name.partition(":")
    if kind == "sim":
        from gating_core.synthetic import simulate_centers

        cohort, centers = simulate_centers(4, 3, seed=int(seed), n_events=6000, strength=2.0)
        return [c[0] for c in cohort], [c[1] for c in cohort], [centers[c[0].name] for c in cohort]
    if kind == "rare":
        return rare_cohort(int(seed))
    raise SystemExit(f"unknown data set {name!r}: multicenter, sim:SEED or rare:SEED")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=list(DEFAULT_DATA))
    parser.add_argument("--balance", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--csv", help="write every held-out patient's row here")
    args = parser.parse_args(argv)
    rows = []
    for name in args.data:
        data = load(name)
        if data is None:
            print(f"{name}: not here, skipped", flush=True)
            continue
        samples, labels, groups = data
        for balance in args.balance:
            for seed in args.seeds:
                start = time.time()
                table = leave_one_group_out(samples, labels, groups, methods=("marginal",),
                                            model_params={"class_balance": balance, "random_state": seed})
                table["data"], table["class_balance"], table["seed"] = name, balance, seed
                rows.append(table)
                print(f"{name}, class_balance {balance:g}, seed {seed}: accuracy {table['accuracy'].mean():.4f} / "
                      f"{table['accuracy'].min():.4f}, macro-F1 {table['macro_f1'].mean():.4f} / "
                      f"{table['macro_f1'].min():.4f}  [{time.time() - start:.0f} s]", flush=True)
    if not rows:
        return 0
    everything = pd.concat(rows, ignore_index=True)
    if args.csv:
        everything.to_csv(args.csv, index=False)
    runs = everything.groupby(["data", "class_balance", "seed"]).agg(
        accuracy=("accuracy", "mean"), worst_accuracy=("accuracy", "min"),
        macro_f1=("macro_f1", "mean"), worst_macro_f1=("macro_f1", "min")).reset_index()
    summary = runs.groupby(["data", "class_balance"], sort=False)[
        ["accuracy", "worst_accuracy", "macro_f1", "worst_macro_f1"]].mean()
    print(f"\nMean over model seeds {args.seeds} of each run's mean and worst held-out patient:")
    with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
        print(summary.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
