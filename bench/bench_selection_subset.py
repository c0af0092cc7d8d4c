"""Benchmark: does model selection on a seeded subset of the patients cost accuracy?

``GatingModel`` runs its hyperparameter search on at most ``SELECTION_MAX_PATIENTS`` (50)
patients, a seeded draw beyond that (``GatingModel.selection_patients``); the final fit uses
every patient. Checking that at 200 patients would need a full selection over 200 (the cost the
limit avoids), so the limit is lowered here to half the training patients and the search on the
subset is compared with the search on all, everything else equal:

- real data (``../shared/data/multicenter``, 10 CyTOF samples in 5 replicate pairs): leave one
  pair out, train on 8 (groups = pairs), selection on all 8 vs on a seeded 4; accuracy of the
  held-out pair's events. Skipped when the data are absent.
- synthetic (``--synthetic``): 30 training patients of 20,000 events, selection on 30 vs 10;
  accuracy on 10 further patients.

Prints the chosen parameters, held-out accuracy (mean and worst patient) and the fit's CPU seconds.
Run: ``nice -n 15 .venv/bin/python bench/bench_selection_subset.py [--synthetic]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MULTICENTER = REPO.parent / "shared" / "data" / "multicenter"


def _fit(train_samples, train_labels, limit, groups=None):
    import gating_core.model.transfer as transfer_module
    from gating_core.model import GatingModel

    saved = transfer_module.SELECTION_MAX_PATIENTS
    transfer_module.SELECTION_MAX_PATIENTS = limit
    try:
        cpu = time.process_time()
        model = GatingModel().fit(train_samples, train_labels, groups=groups)
        return model, time.process_time() - cpu
    finally:
        transfer_module.SELECTION_MAX_PATIENTS = saved


def _accuracy(model, sample, labels) -> float:
    return float(np.mean(model.predict(sample) == np.asarray(labels).astype(str)))


def real_data(folder: Path) -> None:
    from gating_core.io.inputs import load_labeled_input

    rows = list(csv.DictReader(open(folder / "groups.csv", encoding="utf-8")))
    pair_of = {r["patient"]: r["pair"] for r in rows}
    data = {name: load_labeled_input(folder / f"{name}.fcs") for name in pair_of}
    print("== Real data: leave one replicate pair out, selection on all 8 training patients vs a seeded 4 ==")
    for limit in (len(data), 4):
        accuracy, cpu = {}, 0.0
        for pair in sorted(set(pair_of.values())):
            train = [n for n in data if pair_of[n] != pair]
            model, seconds = _fit([data[n][0] for n in train], [data[n][1] for n in train], limit,
                                  groups=[pair_of[n] for n in train])
            cpu += seconds
            for n in data:
                if pair_of[n] == pair:
                    accuracy[n] = _accuracy(model, *data[n])
            params = {k: (None if v is None else float(f"{v:.3g}")) for k, v in model.selection_["params"].items()}
            print(f"  selection on {model.selection_['n_patients']}, {pair} held out: {params} -> "
                  f"{', '.join(f'{accuracy[n]:.4f}' for n in data if pair_of[n] == pair)}")
        values = np.array(list(accuracy.values()))
        print(f"selection on {'all 8' if limit > 8 else 'a seeded 4'}: held-out accuracy mean {values.mean():.4f}, "
              f"worst {values.min():.4f}; fit CPU {cpu:.0f} s for 5 trainings")


def synthetic() -> None:
    from gating_core.synthetic import simulate_cohort

    cohort = simulate_cohort(40, seed=5, n_events=20_000)
    train, test = cohort[:30], cohort[30:]
    print("== Synthetic: 30 training patients, selection on all 30 vs a seeded 10; 10 held-out patients ==")
    for limit in (30, 10):
        model, cpu = _fit([s for s, _ in train], [y for _, y in train], limit)
        values = np.array([_accuracy(model, s, y) for s, y in test])
        print(f"selection on {model.selection_['n_patients']}: {model.selection_['params']}, held-out accuracy mean "
              f"{values.mean():.4f}, worst {values.min():.4f}; fit CPU {cpu:.0f} s")


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="also the synthetic comparison")
    args = parser.parse_args(list(argv))
    if (MULTICENTER / "groups.csv").exists():
        real_data(MULTICENTER)
    else:
        print(f"real data not found at {MULTICENTER}: skipped")
    if args.synthetic:
        synthetic()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
