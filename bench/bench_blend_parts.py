"""The default's two parts on unseen groups, and what else was tried in their place.

The default gates a patient with ``(1 - w) p_marginal + w p_companion``: the marginal model
(ridge on the product features, shift augmentation) and its pooled companion (logistic, no
augmentation: exactly the pooled-logistic baseline). Whether a change to either part, or to the
way they are combined, beats the pooled-logistic baseline in mean AND worst patient is a
question about every fold at once; refitting the product for every idea is slow. This bench
fits each fold once, keeps every held-out patient's probabilities from both parts and from
alternative marginal models fitted on the same cells, and scores combinations of them offline.

``run`` (one folder of ``.npz`` files, one per fold; existing folds are skipped):

- ``multicenter``: the shared data's folds -- each replicate pair left out, each batch left
  out (both ways) and each patient left out (its twin in training; full refits), the groups
  given to training being the pairs, as in ``bench_centers.py``;
- ``sim:SEED``: ``simulate_centers(4, 3, seed=SEED, strength=2.0)`` (6,000 events a patient,
  10,000 for seed 11), each center left out.

Alternative marginal models fitted on the fold's cells with the fold's selected bandwidths:
``logistic`` (the logistic loss, lambda 1e-5, with augmentation), ``logistic-plain`` (the same
without augmentation), ``wide`` (1,024 features), ``companion-sx`` / ``wider-sx`` (the marginal
model at the companion's selected sigma_X / at the wider of the two models' sigma_X). The held-out patients' standardised cells are
kept (float16) for the transductive rules below.

Further models (``--alternatives``; :data:`EXTRAS`): ``companion-linear`` (the
companion on [its random features, x / sqrt(d)]: a Gaussian + linear kernel), ``lda`` (its
posteriors, blended with the default's at 0.25 and 0.5), ``marginal-plus-linear`` (the
marginal model with x / sqrt(d) appended), each scored alone and in the default's blend.

``score`` prints mean / worst accuracy (``--metric macro-f1``: macro-F1) per protocol for:
``default`` (reproduces ``evaluate``), ``companion`` (= pooled-logistic), ``marginal`` (alone),
each alternative alone and in the default's blend, ``companion-when-pooling`` (the companion
alone where selection dropped the embedding), ``geometric`` (blend of log-probabilities) and
``knn-smooth`` (each cell's blended probabilities averaged over its 10 nearest neighbours
among 20,000 of the patient's own cells: the cluster assumption, applied transductively),
``entropy-weight`` (the companion's share h_m / (h_m + h_c) from the two parts' mean entropy
on the patient's cells; ``+ fade``: averaged with the default's weight; ``surer model``: the part
with the lower entropy alone), ``em`` (the patient's population shares re-estimated by EM from its own cells, Saerens et al.
2002) and, for a model trained on population-balanced draws, ``prior-corrected`` (posteriors
moved back to the training patients' own shares; ``-sqrt``: half way, in log).

Run: ``python bench/bench_blend_parts.py run multicenter sim:11 sim:12 sim:13 sim:14 --out DIR``
then ``python bench/bench_blend_parts.py score DIR [--metric macro-f1]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.method.classifier import MarginalTransferClassifier  # noqa: E402
from gating_core.model.research import ResearchGatingModel  # noqa: E402

ALTERNATIVES = ("logistic", "logistic-plain", "wide", "companion-sx", "wider-sx")
#: What ``run`` fits when ``--alternatives`` is not given.
DEFAULT_ALTERNATIVES = ("logistic", "logistic-plain", "wide")
#: Alternatives that are not a MarginalTransferClassifier refit: fitted by
#: :func:`fit_extra` on the fold's cells, each a predict_proba(x, embedding) callable.
#: ``companion-linear``: the pooled companion's logistic model (same random features, cells,
#: 1/N patient weights, penalty) on [its random Fourier features of x, x / sqrt(d)]: the sum
#: kernel k_Gauss(x, x') + <x, x'> / d, both parts about 1 on the diagonal of standardised cells.
#: ``companion-linear-x1``: the same with x unscaled (<x, x'>, d times more weight on the linear
#: part for the same penalty). ``companion-rff``: the refit without the linear columns (a check
#: that the refit reproduces the companion). ``lda``: scikit-learn's LDA on the fold model's
#: training cells (the same seeded class_balance=0 draws and standardisation as the ``lda``
#: baseline of evaluation/protocols.py), its posteriors.
#: ``marginal-plus-linear``: the default's marginal model (same product features, augmented
#: copies, weights, penalty, calibration) with x / sqrt(d) appended to its features: the kernel
#: k_P k_X + <x, x'> / d (a pooled linear part beside the patient-dependent Gaussian one).
#: ``marginal-refit``: the same refit without the linear columns (the check).
EXTRAS = ("companion-linear", "companion-linear-x1", "companion-rff", "lda", "marginal-plus-linear",
          "marginal-refit")
MARGINAL_EXTRAS = ("marginal-plus-linear", "marginal-refit")


class AppendedLinear:
    """A ProductRFF's features with the cells themselves, scaled, appended: (n, D + d)."""

    def __init__(self, feature_map, scale):
        self.feature_map, self.scale = feature_map, scale

    def patient_phase(self, embedding):
        return self.feature_map.patient_phase(embedding)

    def transform(self, x, phase, out=None):
        f = self.feature_map.transform(x, phase)
        if self.scale is None:
            return f
        return np.hstack([f, np.asarray(x, dtype=np.float32) * np.float32(self.scale)])


def fit_marginal_extra(name, model, cells, labels, embedding_cells):
    from gating_core.method.landmarks import cell_features
    from gating_core.method.training_problem import TrainingProblem

    base = model.classifier_
    clf = MarginalTransferClassifier(**base.get_params())
    problem = TrainingProblem(clf, cells, labels, embedding_cells, model.groups_)
    fm = AppendedLinear(problem.feature_map(problem.bandwidth_x, problem.bandwidth_p),
                        1.0 / np.sqrt(base.n_features_in_) if name == "marginal-plus-linear" else None)

    class Rows:  # computed when read: all rows at once would take N x 5 x 4000 x (D + d) floats
        def __len__(self):
            return len(problem.cells)

        def __getitem__(self, r):
            return cell_features(fm, problem.cells[r], problem.embeddings[r], True)

    features = Rows()
    clf.fit_prepared(problem, fm, features, problem.statistics(features), model.groups_)
    coef, intercept, temperature = clf.coef_, clf.intercept_, np.float32(clf.temperature_)

    def proba(x, embedding):
        s = (cell_features(fm, x, embedding, True) @ coef + intercept) * temperature
        s -= s.max(axis=1, keepdims=True)
        np.exp(s, out=s)
        return s / s.sum(axis=1, keepdims=True)
    return proba


def alternative_params(name: str, fitted: MarginalTransferClassifier, model=None) -> dict:
    base = fitted.get_params()
    if name in ("companion-sx", "wider-sx"):
        # The marginal model at the companion's selected sigma_X (or the wider of the two), its
        # own sigma_P and penalty: does its narrower choice cost it on new centers?
        companion = getattr(model, "companion_bandwidth_x_", None) or fitted.bandwidth_x_
        return {**base, "bandwidth_x": companion if name == "companion-sx" else max(companion, fitted.bandwidth_x_)}
    if name == "logistic":
        return {**base, "loss": "logistic", "alpha": 1e-5}
    if name == "logistic-plain":
        return {**base, "loss": "logistic", "alpha": 1e-5, "n_augment": 0}
    if name == "wide":
        return {**base, "n_features": 2 * base["n_features"]}
    raise ValueError(f"unknown alternative {name!r}")


def fit_extra(name, model, cells, labels, embedding_cells):
    """One of :data:`EXTRAS` fitted on the fold's cells: a callable (x, embedding) -> proba
    (n, k) in ``model.populations_`` order."""
    populations = [str(c) for c in model.classifier_.classes_]
    if name in MARGINAL_EXTRAS:
        return fit_marginal_extra(name, model, cells, labels, embedding_cells)
    if name == "lda":
        from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

        lda = LinearDiscriminantAnalysis().fit(np.vstack(cells), np.concatenate(labels).astype(str))
        order = [list(lda.classes_).index(c) if c in lda.classes_ else -1 for c in populations]

        def lda_proba(x, embedding):
            p = lda.predict_proba(x)
            return np.stack([p[:, j] if j >= 0 else np.zeros(len(x)) for j in order], axis=1)
        return lda_proba
    from gating_core.method.landmarks import cell_features
    from gating_core.method.solvers import fit_weighted_logistic
    from gating_core.method.training_problem import TrainingProblem

    companion = model.pooled_classifier_
    if companion is None:
        raise ValueError("the fold's model has no pooled companion")
    fm = companion.feature_map_
    scale = {"companion-linear": 1.0 / np.sqrt(companion.n_features_in_), "companion-linear-x1": 1.0,
             "companion-rff": None}[name]

    def features(x):
        f = cell_features(fm, x, None, use_embedding=False)
        if scale is None:
            return f
        return np.hstack([f, np.asarray(x, dtype=np.float32) * np.float32(scale)])

    problem = TrainingProblem(companion, cells, labels, embedding_cells, model.groups_)
    assert [str(c) for c in problem.classes] == populations
    rows = [features(x) for x in problem.cells]
    weights = np.full(len(rows), 1.0 / len(rows))
    coef, intercept = fit_weighted_logistic(rows, problem.targets, weights, len(populations), companion.alpha)
    coef, intercept = coef.astype(np.float32), intercept.astype(np.float32)

    def proba(x, embedding):
        s = features(x) @ coef + intercept
        s -= s.max(axis=1, keepdims=True)
        np.exp(s, out=s)
        return s / s.sum(axis=1, keepdims=True)
    return proba


def multicenter_folds():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from multicenter_data import load_multicenter

    samples, labels, pairs, batches = load_multicenter()
    n = len(samples)
    folds = [(f"multicenter-pair-{p}", [i for i in range(n) if pairs[i] == p]) for p in sorted(set(pairs))]
    folds += [(f"multicenter-batch-{b}", [i for i in range(n) if batches[i] == b]) for b in sorted(set(batches))]
    folds += [(f"multicenter-patient-{i + 1:02d}", [i]) for i in range(n)]
    return samples, labels, pairs, folds


def simulated_folds(seed: int):
    from gating_core.synthetic import simulate_centers

    cohort, centers = simulate_centers(4, 3, seed=seed, n_events=10000 if seed == 11 else 6000, strength=2.0)
    samples, labels = [c[0] for c in cohort], [c[1] for c in cohort]
    groups = [centers[s.name] for s in samples]
    folds = [(f"sim{seed}-{c}", [i for i in range(len(samples)) if groups[i] == c]) for c in sorted(set(groups))]
    return samples, labels, groups, folds


def run_fold(path: Path, train, test, groups, alternatives, class_balance=0.0) -> None:
    model = ResearchGatingModel(random_state=0, class_balance=class_balance)
    digests = [model.digest(s, y, i) for i, (s, y) in enumerate(train)]
    model.fit_digests(digests, groups=groups)
    cells, embedding_cells, labels = model.prepare_digests(digests)
    fitted = {name: MarginalTransferClassifier(**alternative_params(name, model.classifier_, model)).fit(
        cells, labels, embedding_samples=embedding_cells, groups=model.groups_)
        for name in alternatives if name not in EXTRAS}
    fitted.update({name: fit_extra(name, model, cells, labels, embedding_cells)
                   for name in alternatives if name in EXTRAS})
    populations = list(model.populations_)
    arrays, patients = {}, []
    for sample, truth in test:
        compensated = model._compensated(sample)
        indices = model._channel_indices(compensated)
        _, embedding, _ = model._patient_frame(compensated.events, indices)
        x = model._standardise(compensated.events[:, indices])
        key = sample.name
        arrays[f"{key}/truth"] = np.array([populations.index(v) if v in populations else -1
                                           for v in np.asarray(truth).astype(str)], dtype=np.int16)
        arrays[f"{key}/cells"] = x.astype(np.float16)
        arrays[f"{key}/marginal"] = model.classifier_.predict_proba(x, embedding).astype(np.float16)
        arrays[f"{key}/companion"] = model.pooled_classifier_.predict_proba(x, embedding).astype(np.float16)
        for name, clf in fitted.items():
            proba = clf(x, embedding) if callable(clf) else clf.predict_proba(x, embedding)
            arrays[f"{key}/{name}"] = proba.astype(np.float16)
        patients.append({"name": key, "companion_weight": model.companion_weight(embedding),
                         "novelty": model.novelty(sample, embedding).score})
    # The prior the model learned under (its drawn cells) and the training patients' own one.
    true_prior = [[float(np.mean(np.asarray(y).astype(str) == c)) for c in populations] for _, y in train]
    meta = {"populations": populations, "embedding_kept": bool(model.selection_.get("embedding_kept", True)),
            "class_prior": model.class_prior_.tolist(), "true_prior": np.mean(true_prior, axis=0).tolist(),
            "class_balance": float(model.class_balance),
            "params": model.selection_.get("params"), "patients": patients, "alternatives": list(alternatives)}
    np.savez(path, meta=json.dumps(meta, default=float), **arrays)


def run(datasets, out: Path, alternatives, class_balance=0.0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for dataset in datasets:
        if dataset == "multicenter":
            samples, labels, groups, folds = multicenter_folds()
        elif dataset.startswith("sim:"):
            samples, labels, groups, folds = simulated_folds(int(dataset[4:]))
        else:
            raise SystemExit(f"unknown data set {dataset!r}: multicenter or sim:SEED")
        for tag, held in folds:
            path = out / f"{tag}.npz"
            if path.exists():
                continue
            start = time.time()
            train = [i for i in range(len(samples)) if i not in held]
            run_fold(path, [(samples[i], labels[i]) for i in train], [(samples[i], labels[i]) for i in held],
                     [groups[i] for i in train], alternatives, class_balance)
            print(f"{tag}: {time.time() - start:.0f} s", flush=True)


# -- scoring ---------------------------------------------------------------------------------------

def protocol_of(tag: str) -> str:
    return tag.rsplit("-", 1)[0] if tag.startswith("multicenter") else tag.split("-", 1)[0]


def knn_smooth(cells, proba, k=10, reference=20000, seed=0):
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(seed)
    ref = rng.choice(len(cells), min(reference, len(cells)), replace=False)
    _, nearest = NearestNeighbors(n_neighbors=k).fit(cells[ref]).kneighbors(cells)
    return proba[ref][nearest].mean(axis=1)


def mean_entropy(proba) -> float:
    p = np.clip(proba, 1e-9, 1.0)
    return float(-(p * np.log(p)).sum(axis=1).mean())


def combinations(meta, patient, parts, fast=False) -> dict:
    w = patient["companion_weight"]
    marginal, companion = parts["marginal"], parts["companion"]
    default = (1 - w) * marginal + w * companion
    out = {"default": default, "companion": companion, "marginal": marginal,
           "companion-when-pooling": default if meta["embedding_kept"] else companion,
           "geometric": np.exp((1 - w) * np.log(marginal + 1e-6) + w * np.log(companion + 1e-6))}
    # The companion's share from the two models' confidence on this patient's own cells: the
    # larger, the less sure the marginal model is (mean entropy of its probabilities).
    h_marginal, h_companion = mean_entropy(marginal), mean_entropy(companion)
    share = h_marginal / max(h_marginal + h_companion, 1e-12)
    out["entropy-weight"] = (1 - share) * marginal + share * companion
    both = 0.5 * (share + w)
    out["entropy-weight + fade"] = (1 - both) * marginal + both * companion
    out["surer model"] = marginal if h_marginal < h_companion else companion
    if not fast:
        out["knn-smooth"] = knn_smooth(parts["cells"], default)
    from gating_core.method.priors import apply_prior_ratio, reestimate_prior

    drawn, true = np.asarray(meta["class_prior"]), np.maximum(np.asarray(meta["true_prior"]), 1e-6)
    if meta.get("class_balance", 0.0) > 0:  # a population-balanced draw: its prior, corrected
        out["prior-corrected"] = apply_prior_ratio(default.copy(), (true / drawn).astype(np.float32))
        out["prior-corrected-sqrt"] = apply_prior_ratio(default.copy(), np.sqrt(true / drawn).astype(np.float32))
    out["em"] = apply_prior_ratio(default.copy(), (reestimate_prior(default[::10], drawn) / drawn).astype(np.float32))
    for name in meta["alternatives"]:
        out[name] = parts[name]
        if name == "lda":  # the default's probabilities blended with LDA's posteriors
            for share in (0.25, 0.5):
                out[f"default + lda {share}"] = (1 - share) * default + share * parts[name]
        elif name in MARGINAL_EXTRAS:  # a marginal model in place of the default's, the same w
            out[f"{name} + companion"] = (1 - w) * parts[name] + w * companion
            if "companion-linear" in parts:
                out[f"{name} + companion-linear"] = (1 - w) * parts[name] + w * parts["companion-linear"]
        elif name in EXTRAS:  # a companion in place of the default's, the same weight w
            out[f"marginal + {name}"] = (1 - w) * marginal + w * parts[name]
        else:
            out[f"{name} + companion"] = (1 - w) * parts[name] + w * companion
    return out


def patient_score(proba, truth, metric: str) -> float:
    predicted = np.argmax(proba, axis=1)
    if metric == "accuracy":
        return float(np.mean(predicted == truth))
    f1 = []
    for c in np.unique(truth[truth >= 0]):
        tp = np.sum((predicted == c) & (truth == c))
        f1.append(2 * tp / (np.sum(predicted == c) + np.sum(truth == c)))
    return float(np.mean(f1))


def score(folder: Path, metric: str, fast=False) -> None:
    results = {}  # protocol -> combination -> [per-patient scores]
    for path in sorted(folder.glob("*.npz")):
        archive = np.load(path)
        meta = json.loads(str(archive["meta"]))
        for patient in meta["patients"]:
            prefix = patient["name"] + "/"
            parts = {key[len(prefix):]: archive[key].astype(np.float32) for key in archive.files
                     if key.startswith(prefix) and key != prefix + "truth"}
            truth = archive[prefix + "truth"]
            for name, proba in combinations(meta, patient, parts, fast).items():
                results.setdefault(protocol_of(path.stem), {}).setdefault(name, []).append(
                    patient_score(proba, truth, metric))
    protocols = list(results)
    names = list(next(iter(results.values()))) if results else []
    print(f"{metric}: mean / worst held-out patient")
    print(f"{'':26s}" + "".join(f"{p:>26s}" for p in protocols))
    for name in names:
        cells = [results[p].get(name) for p in protocols]
        print(f"{name:26s}" + "".join(f"{np.mean(c):>17.4f} / {np.min(c):.4f}" if c else " " * 26 for c in cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="fit every fold once and keep the held-out probabilities")
    run_parser.add_argument("datasets", nargs="+", help="multicenter and/or sim:SEED")
    run_parser.add_argument("--out", required=True, type=Path)
    run_parser.add_argument("--class-balance", type=float, default=0.0,
                            help="GatingModel's class_balance for every fold (default 0, the uniform draw)")
    run_parser.add_argument("--alternatives", default=",".join(DEFAULT_ALTERNATIVES),
                            help=f"comma-separated, from {', '.join(ALTERNATIVES + EXTRAS)} (empty: none)")
    score_parser = sub.add_parser("score", help="mean / worst of each combination per protocol")
    score_parser.add_argument("folder", type=Path)
    score_parser.add_argument("--metric", choices=("accuracy", "macro-f1"), default="accuracy")
    score_parser.add_argument("--fast", action="store_true", help="skip knn-smooth (a neighbour search per patient)")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.datasets, args.out, [a for a in args.alternatives.split(",") if a], args.class_balance)
    else:
        score(args.folder, args.metric, args.fast)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
