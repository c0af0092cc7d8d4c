"""The pooled companion's own cell bandwidth, against the marginal model's, on unseen groups.

The default marginal method blends the marginal model with a pooled logistic companion
(``pooled_weight=0.5``). Until this bench the companion borrowed the marginal model's sigma_X;
now model selection chooses one for it (pooled, no augmentation, cross-validation over groups),
which makes it the plain pooled-logistic baseline. Per held-out fold, from the same fits:

- ``default``: the product's default (marginal model + companion at its own sigma_X);
- ``previous``: the marginal model + a companion refitted at the marginal model's sigma_X (the
  earlier default);
- ``marginal-alone``: the marginal model without a companion;
- ``pooled-logistic``: the baseline of ``gating_core.evaluation.protocols`` (``METHOD_SETTINGS``).

Protocols: the shared multicenter data (when present) leaving one replicate pair out, training on
batch A and gating batch B, and leaving one patient out; simulated cohorts
(``simulate_centers(4, 3, strength=2.0)``, 10,000 events for seed 11, 6,000 for the others)
leaving one center out. Prints mean / worst held-out patient accuracy per protocol and method.

Run: ``python bench/bench_companion_bandwidth.py [--seeds 11,12,13,14] [--no-multicenter]
[--no-patient-protocol]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation import METHOD_SETTINGS  # noqa: E402
from gating_core.method.classifier import MarginalTransferClassifier  # noqa: E402
from gating_core.model import GatingModel  # noqa: E402
from gating_core.model.research import build_model  # noqa: E402
from gating_core.synthetic import simulate_centers  # noqa: E402
from multicenter_data import MULTICENTER, load_multicenter  # noqa: E402

METHODS = ("default", "previous", "marginal-alone", "pooled-logistic")


def fold_accuracies(samples, labels, groups, held) -> dict:
    """Accuracy of each method on each held-out patient of one fold: {method: [acc, ...]}."""
    train = [i for i in range(len(samples)) if i not in held]
    train_samples = [samples[i] for i in train]
    train_labels = [np.asarray(labels[i]).astype(str) for i in train]
    train_groups = [groups[i] for i in train]
    model = GatingModel().fit(train_samples, train_labels, groups=train_groups)
    baseline = build_model(METHOD_SETTINGS["pooled-logistic"]).fit(train_samples, train_labels,
                                                                     groups=train_groups)
    # The earlier companion: the same logistic fit at the marginal model's sigma_X, on the same cells.
    cells, drawn = model.standardised_training_cells(train_samples, train_labels)
    previous = MarginalTransferClassifier(**model._companion_params(
        model.classifier_.get_params(), bandwidth_x=model.classifier_.bandwidth_x_)).fit(
        cells, drawn, groups=model.groups_)
    populations = np.asarray(model.populations_)
    out = defaultdict(list)
    for i in held:
        truth = np.asarray(labels[i]).astype(str)
        new_cells, psi = model.standardised_cells(samples[i]), model.patient_embedding(samples[i])
        alone = model.classifier_.predict_proba(new_cells, psi)
        probabilities = {"default": model.predict_proba(samples[i]), "marginal-alone": alone,
                         "previous": 0.5 * alone + 0.5 * previous.predict_proba(new_cells, psi),
                         "pooled-logistic": baseline.predict_proba(samples[i])}
        for method, p in probabilities.items():
            out[method].append(float(np.mean(populations[p.argmax(axis=1)] == truth)))
    return out


def run(title, samples, labels, groups, folds) -> None:
    start = time.time()
    accuracies = defaultdict(list)
    for held in folds:
        for method, values in fold_accuracies(samples, labels, groups, held).items():
            accuracies[method].extend(values)
    print(f"\n== {title} ({len(accuracies['default'])} patients, {time.time() - start:.0f} s)", flush=True)
    for method in METHODS:
        values = np.asarray(accuracies[method])
        print(f"   {method:16s} {values.mean():.4f} / {values.min():.4f}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="11,12,13,14", help="simulated cohorts (comma-separated seeds; '' for none)")
    parser.add_argument("--no-multicenter", action="store_true")
    parser.add_argument("--no-patient-protocol", action="store_true", help="skip leave one patient out")
    args = parser.parse_args(argv)
    if not args.no_multicenter and MULTICENTER.exists():
        samples, labels, pairs, batches = load_multicenter()
        n = len(samples)
        run("multicenter, leave one replicate pair out", samples, labels, pairs,
            [[i for i in range(n) if pairs[i] == p] for p in sorted(set(pairs))])
        run("multicenter, train on batch A, gate batch B", samples, labels, pairs,
            [[i for i in range(n) if batches[i] == sorted(set(batches))[-1]]])
        if not args.no_patient_protocol:
            run("multicenter, leave one patient out (twin in training)", samples, labels, pairs,
                [[i] for i in range(n)])
    for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
        cohort, centers = simulate_centers(4, 3, seed=seed, n_events=10000 if seed == 11 else 6000, strength=2.0)
        samples, labels = [c[0] for c in cohort], [c[1] for c in cohort]
        groups = [centers[s.name] for s in samples]
        run(f"simulated seed {seed}, leave one center out", samples, labels, groups,
            [[i for i in range(len(samples)) if groups[i] == c] for c in sorted(set(groups))])
    return 0


if __name__ == "__main__":
    sys.exit(main())
