"""How the default combines its parts, and other ways to combine them, on every set of
``bench_unseen.py``.

The default gates a patient with ``(1 - w) p_T + w (p_S + p_O) / 2``: the transfer model (with
its pooled companion), the patient's populations adapted by EM with one shared covariance, and
the same populations each in its own training shape; ``w`` is 2/3 unless the training folds
show it clearly worse (docs/unseen_data.md, "The parts of the default"). Whether another way of
combining them, or another model beside them, gates new patients better is a question about
every fold of every set at once; refitting for every idea would take hours. This bench fits each
fold once and keeps every held-out patient's probabilities from each part, beside those of
the standard methods fitted on the same patients as ``bench_unseen.py``'s baselines (pooled LDA,
gradient-boosted trees and the pooled logistic regression on random features), and scores the
combinations offline.

``run SET ... --out DIR``: one ``.npz`` per fold (existing folds are skipped). The sets are
``bench_unseen.py``'s (same protocols, seeds and folds), and ``mc-patient`` / ``dlbcl-patient``:
each patient left out, the batches given to training as its groups (with a ``bench_unseen.py``
change too: ``mc-patient+rare-b``).

``review DIR ...``: the default's accuracy against the share of cells on which its transfer model
and adapted populations disagree (gating's review flag), over every held-out patient of the
folders (several: other seeds' runs of the same sets).

``parts DIR ...``: what a reviewer gets who gates a patient with each part alone and keeps the
better gating (``gate --part``, the Auto-gate page's comparison): per held-out patient the
default's accuracy, the transfer model's alone, the adapted populations' alone and the best of the
three, flagged patients apart from the others.

``population NAME DIR ...``: how the default, each of its parts and each standard method call one
population (a rare one, where a few hundred cells decide its F1): per set, the cells called it,
those of them right, precision and recall, pooled over every held-out patient of the folders.

``score DIR [--metric macro-f1]``: mean / worst patient per set for each rule, then per rule
the sets where it gains or loses more than 0.1 point against the default. The rules:

- ``default``: the model's own probabilities (they reproduce ``bench_unseen.py``'s ``marginal``
  rows, but for cells the model calls unknown);
- ``geometric``: the log-linear pool of the same parts at the same weights, ``exp(sum_j w_j log
  p_j)`` normalised: a population must be likely under every part;
- ``geometric-generative``: the transfer model as in the default, the two generative fits pooled
  geometrically;
- ``plus-lda`` / ``plus-trees``: three quarters the default, one quarter pooled LDA / trees;
- ``vote``: each cell to the population two of the three parts call (the default's call where
  all three differ);
- ``confidence``: each part's weight times its largest probability, per cell;
- ``novelty-faded``: the adapted share ``w min(1, novelty)``: a patient as near the training
  patients as they are to each other leans to the transfer model.
- ``familiar-trees``: ``(1 - t) p_default + t p_trees`` with ``t = 0.5 max(0, 1 - novelty /
  threshold)`` where the parts disagree on less than a tenth of the cells, else 0: a patient
  like the training ones (the novelty warning's measure, below its threshold) and gated alike by
  both halves is where a flexible pooled model, which cannot follow a shift, is at its best.
- ``own-checked``: the own-shape fit replaced by the shared-covariance fit for a patient where the
  two name different populations for more than half of its cells (the own-shape fit then
  followed a population elsewhere);
- ``flagged-lda``: a quarter pooled LDA for a patient the review flags (its transfer model and
  adapted populations disagree on more than DISAGREEMENT_THRESHOLD of its cells), where the
  default is least sure of itself;
- ``trees-for-transfer``: the default's mix with pooled trees in place of the transfer model,
  ``(1 - w) p_trees + w (p_S + p_O) / 2``: the adapted populations beside a flexible model
  that knows nothing of the patient's distribution;
- ``half-trees``: the transfer model's share split evenly between it and pooled trees;
- ``adapted-third``: the default's mix with the adapted populations at a third instead of the
  fold's weight (two thirds unless the check moved it): the transfer model, whose calls of a
  rare population are the most precise of the parts, at two thirds;
- ``embedding-trees`` / ``embedding-trees-for-transfer``: the patient's embedding fed to a
  stronger learner (:class:`EmbeddingTrees`, fitted by ``run --embedding-trees``), alone and in
  place of the transfer model in the default's mix.
- ``aligned-trees`` / ``aligned-trees-for-transfer`` / ``half-aligned-trees``: pooled trees on the
  patient's cells moved back by the shift its adapted populations found (:func:`aligned_cells`,
  kept by ``run --aligned-trees``), alone, in place of the transfer model, and beside it (the
  transfer model's share split evenly).
- ``familiar``: the adapted populations at a third on the cells that lie within the training
  reach (``PopulationReach``'s, :data:`FAMILIAR_MARGIN` times it) of both the population the
  transfer model calls and the one the adapted populations call (every one of them where a part's
  top populations tie): a disagreement inside the training range is about an edge the transfer
  model learned from the experts;
- ``rare-columns``: the transfer model alone in the column of every population the adapted
  populations find at less than :data:`RARE_SHARE` of the patient's cells;
- ``plain-mix``: the default's parts mixed at the fold's weight in every column, without the
  check of rare populations the adapted populations let swell (``swollen_check``: the default
  takes such a population's column from the transfer model);
- ``rare-shared``: for every population rare in every training patient (the check of swelling's
  rarity, from the fold file's ``largest_shares``), the adapted populations' column is the
  shared-covariance fit's alone, rows normalised, before the default's check of swelling;
- ``rare-disjoint``: the same, only in a patient where the two generative fits' calls of the rare
  population overlap on less than :data:`DISJOINT_OVERLAP` of the cells either calls it;
- ``lda``, ``trees``, ``pooled-logistic``: the standard methods alone (a fold file written before
  pooled logistic was kept has none: its patients are not scored by that rule).

Run: ``python bench/bench_blend_parts.py run mc-pair mc-batch dlbcl-batch dlbcl-folds --out DIR``
then ``python bench/bench_blend_parts.py score DIR`` (``--rules default,trees,...``: those alone).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_unseen import SETS, held_out_sets, load_set, print_review  # noqa: E402
from gating_core.evaluation import patient_scores  # noqa: E402
from gating_core.evaluation.baselines import PooledBaseline  # noqa: E402
from gating_core.evaluation.protocols import METHOD_SETTINGS  # noqa: E402
from gating_core.method.adaptive_lda import AdaptiveLDA  # noqa: E402
from gating_core.method.population_components import population_proba  # noqa: E402
from gating_core.method.swollen_populations import (PARTING_SHARE, called_shares, disagreement_beside,  # noqa: E402
                                                    swollen_populations)
from gating_core.method.ties import call_weights, parts_disagreement, ties_broken  # noqa: E402
from gating_core.model.result import DISAGREEMENT_THRESHOLD  # noqa: E402
from gating_core.model.estimator import GatingModel  # noqa: E402
from gating_core.model.research import build_model  # noqa: E402

#: One patient left out, the batches as the model's groups: the set each is drawn from.
PATIENT_SETS = {"mc-patient": "mc-batch", "dlbcl-patient": "dlbcl-batch"}
#: A probability's floor inside the logarithm of the geometric pools.
LOG_FLOOR = 1e-6
#: ``familiar-trees``: the parts agree on a patient where they differ on less than this share of cells.
FAMILIAR_AGREEMENT = 0.1
#: ``own-checked``: the share of a patient's cells on which the two generative fits may differ.
OWN_CHECK_DISAGREEMENT = 0.5
#: ``familiar``: a cell lies within a population's training reach up to this many times it.
FAMILIAR_MARGIN = 1.0
#: ``rare-columns``: a population is rare below this share of the cells.
RARE_SHARE = 0.05
#: ``rare-disjoint``: the two generative fits disagree on where a rare population is when their
#: calls of it overlap (intersection over union) on less than this.
DISJOINT_OVERLAP = 0.5
#: ``run --embedding-trees``: at most this many principal components of the training patients'
#: embeddings go beside each cell.
EMBEDDING_COMPONENTS = 4


def fold_sets(name: str, groups, seed: int):
    if name.partition("+")[0] in PATIENT_SETS:
        return [[i] for i in range(len(groups))]
    return held_out_sets(name, groups, seed)


def source_set(name: str) -> str:
    """The ``bench_unseen.py`` set a ``run`` set's patients come from: ``mc-patient+rare-b`` is
    ``mc-batch+rare-b``'s patients, each left out in turn."""
    base, plus, change = name.partition("+")
    return PATIENT_SETS.get(base, base) + plus + change


def run(names, out: Path, seed: int, embedding_trees: bool = False, aligned_trees: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        loaded = load_set(source_set(name), seed)
        if loaded is None:
            print(f"== {name}: data not found, skipped", flush=True)
            continue
        samples, labels, groups = loaded
        labels = [np.asarray(y).astype(str) for y in labels]
        for k, held in enumerate(fold_sets(name, groups, seed)):
            path = out / f"{name}__{k:02d}.npz"
            if path.exists():
                continue
            start = time.time()
            train = [i for i in range(len(samples)) if i not in held]
            if name == "dlbcl-batch-4":  # as bench_unseen.py scores it: the other batch only
                held = [i for i in held if groups[i] != groups[train[0]]]
            arrays = fit_fold([samples[i] for i in train], [labels[i] for i in train], [groups[i] for i in train],
                              [samples[i] for i in held], [labels[i] for i in held], seed, embedding_trees,
                              aligned_trees)
            np.savez_compressed(path, **arrays)
            print(f"{name} fold {k + 1}: {len(held)} held out, weight {float(arrays['weight']):.2f} "
                  f"({time.time() - start:.0f} s)", flush=True)


def fit_fold(train_samples, train_labels, train_groups, held_samples, held_labels, seed,
             embedding_trees=False, aligned_trees=False) -> dict:
    """Every held-out patient's probabilities (n, k) from each part, its labels and novelty
    (and with ``embedding_trees`` those of :class:`EmbeddingTrees`, with ``aligned_trees`` the
    pooled trees' on the cells moved back by the patient's adapted shift, :func:`aligned_cells`)."""
    model = GatingModel(random_state=seed).fit(train_samples, train_labels, groups=train_groups)
    populations = np.asarray(model.populations_)
    pooled = {kind: PooledBaseline(kind, random_state=seed).fit(train_samples, train_labels)
              for kind in ("lda", "trees")}
    logistic = build_model({**METHOD_SETTINGS["pooled-logistic"], "random_state": seed}).fit(
        train_samples, train_labels, groups=train_groups)
    beside = EmbeddingTrees(random_state=seed).fit(model, train_samples, train_labels) if embedding_trees else None
    trees = pooled["trees"]
    if aligned_trees and not _same_space(trees.preprocessing_, model):
        raise RuntimeError("the pooled trees do not see the model's cells: moved cells would be misread")
    # The weight's check as the fold's model made it (each held-out training patient's accuracy
    # at each weight): other rules for the weight can be scored offline too.
    arrays = {"populations": populations, "weight": np.float64(model.adaptive_weight_),
              "weight_check": np.asarray(json.dumps(model.selection_.get("adaptive_weight", {}))),
              "prior": np.asarray(model.class_prior_, np.float64)}
    if getattr(model, "largest_shares_", None) is not None:  # rules on rare populations need them
        arrays["largest_shares"] = np.asarray(model.largest_shares_, np.float64)
    for p, (sample, truth) in enumerate(zip(held_samples, held_labels)):
        cells, embedding, adjust = model._patient_parts(sample)
        arrays[f"{p}:transfer"] = model._proba(cells, embedding, 50_000)
        if adjust.gaussians is not None:  # weight 0: the fold's model scores the transfer model alone
            # A population split into components has a column per component: summed per population.
            per_population = ((lambda proba: proba) if adjust.components is None else
                              (lambda proba: population_proba(proba, adjust.components)))
            shared = AdaptiveLDA.proba(cells, adjust.gaussians)  # a column per component, as the means
            reach, patient = adjust.shapes
            own = reach.proba(cells, patient)
            arrays[f"{p}:shared"], arrays[f"{p}:own"] = per_population(shared), per_population(own)
            # Each cell's squared distance to every population's training mean in its own
            # shape, over that population's reach (the nearest component's for a split one).
            scaled = (reach.squared_distances(cells, reach.means_) / reach.reach_).astype(np.float32)
            if adjust.components is not None:
                scaled = np.minimum.reduceat(scaled, np.asarray(adjust.components), axis=1)
            arrays[f"{p}:training_reach"] = scaled
            if aligned_trees:
                moved = aligned_cells(cells, (shared + own) / 2,
                                      adjust.gaussians.means - model.adaptive_lda_.means_)
                arrays[f"{p}:aligned_trees"] = _in_order(trees.estimator_.predict_proba(moved),
                                                         trees.estimator_.classes_, populations)
        arrays[f"{p}:default"] = model._adjusted_proba(cells, embedding, 50_000, adjust)
        for kind, baseline in pooled.items():
            proba = baseline.estimator_.predict_proba(baseline.preprocessing_.standardised_cells(sample))
            arrays[f"{p}:{kind}"] = _in_order(proba, baseline.estimator_.classes_, populations)
        arrays[f"{p}:pooled_logistic"] = _in_order(logistic.predict_proba(sample), logistic.populations_, populations)
        if aligned_trees and f"{p}:aligned_trees" not in arrays:  # nothing adapted, nothing moved
            arrays[f"{p}:aligned_trees"] = arrays[f"{p}:trees"]
        if beside is not None:
            arrays[f"{p}:embedding_trees"] = beside.proba(sample, embedding, populations)
        arrays[f"{p}:truth"] = truth
        arrays[f"{p}:name"] = np.asarray(sample.name)
        novelty = model.novelty(sample, embedding)
        arrays[f"{p}:novelty"] = np.float64(novelty.score)
        arrays[f"{p}:novelty_threshold"] = np.float64(novelty.threshold)
    return arrays


def aligned_cells(cells, responsibilities, shift) -> np.ndarray:
    """Cells (n, d) moved back by their populations' shift in this patient,
    ``x - sum_k r_k(x) (m_k - mu_k)``: ``responsibilities`` (n, k) the adapted fits' posteriors,
    ``shift`` (k, d) the adapted means less the training means (a row per component where a
    population is split, as the posteriors' columns). Where the populations stayed, the cells
    stay; a population that moved beyond the training range is brought back into it."""
    moved = np.asarray(cells, np.float64) - np.asarray(responsibilities, np.float64) @ np.asarray(shift, np.float64)
    return moved.astype(np.float32)


def _same_space(preprocessing, model) -> bool:
    """Whether a baseline's standardised cells are the model's: the same channels, centre and
    scale, and no registration."""
    return (list(preprocessing.channels_) == list(model.channels_)
            and np.array_equal(preprocessing.center_, model.center_)
            and np.array_equal(preprocessing.scale_, model.scale_)
            and getattr(model, "reference_quantiles_", None) is None
            and getattr(model, "reference_landmarks_", None) is None)


class EmbeddingTrees:
    """The patient's embedding fed to a stronger learner: gradient-boosted trees on each cell
    beside a summary of its patient, ``[x, z(P)]``. ``x``: the pooled trees baseline's cells,
    settings and standardisation (``PooledBaseline("trees")``); ``z(P)``: the fold model's kernel
    mean embedding of the patient (``patient_embedding``, as at gate time) on the first
    ``min(EMBEDDING_COMPONENTS, n_training - 1)`` principal components of the training
    patients' embeddings."""

    def __init__(self, cells_per_patient=4000, random_state=0):
        self.cells_per_patient = cells_per_patient
        self.random_state = random_state

    def fit(self, model, samples, labels):
        from sklearn.ensemble import HistGradientBoostingClassifier

        self.preprocessing_ = GatingModel(cells_per_patient=self.cells_per_patient, random_state=self.random_state)
        cells, drawn = self.preprocessing_.standardised_training_cells(samples, labels)
        embeddings = np.vstack([model.patient_embedding(s) for s in samples]).astype(np.float64)
        self.pca_ = PCA(n_components=max(1, min(EMBEDDING_COMPONENTS, len(samples) - 1)),
                        random_state=self.random_state).fit(embeddings)
        z = self.pca_.transform(embeddings)
        features = np.vstack([np.hstack([x, np.repeat(zi[None, :], len(x), axis=0)]) for x, zi in zip(cells, z)])
        self.estimator_ = HistGradientBoostingClassifier(random_state=self.random_state).fit(
            features, np.concatenate(drawn))
        return self

    def proba(self, sample, embedding, populations) -> np.ndarray:
        """(n_events, k) in ``populations`` order; ``embedding``: the patient's, as the model gated it."""
        x = self.preprocessing_.standardised_cells(sample)
        z = self.pca_.transform(np.asarray(embedding, np.float64)[None, :])
        proba = self.estimator_.predict_proba(np.hstack([x, np.repeat(z, len(x), axis=0)]))
        return _in_order(proba, self.estimator_.classes_, populations)


def _in_order(proba, classes, populations) -> np.ndarray:
    """A classifier's probabilities (n, len(classes)) as float32 columns in ``populations``'
    order (sorted), zero for a population the classifier never saw."""
    out = np.zeros((len(proba), len(populations)), np.float32)
    out[:, np.searchsorted(populations, np.asarray(classes).astype(str))] = proba
    return out


def patients(path: Path):
    """Each held-out patient of a fold's file: a dict of its arrays, the fold's populations and weight."""
    with np.load(path, allow_pickle=False) as z:
        count = len({key.split(":")[0] for key in z.files if ":" in key})
        for p in range(count):
            patient = {key.split(":")[1]: z[key] for key in z.files if key.startswith(f"{p}:")}
            patient["populations"], patient["weight"] = z["populations"], float(z["weight"])
            for key in ("prior", "largest_shares"):
                if key in z.files:
                    patient[key] = z[key]
            yield patient


def held_out_patients(folders):
    """(set, folder, patient) of every held-out patient in the fold files of ``run`` folders, in
    file order (:func:`patients`)."""
    for folder in folders:
        for path in sorted(Path(folder).glob("*.npz")):
            for patient in patients(path):
                yield path.name.split("__")[0], folder, patient


def _normalised(proba):
    return proba / np.maximum(proba.sum(axis=1, keepdims=True), 1e-30)


def _geometric(parts, weights):
    logs = sum(w * np.log(np.asarray(p, np.float64) + LOG_FLOOR) for p, w in zip(parts, weights))
    return _normalised(np.exp(logs - logs.max(axis=1, keepdims=True)))


def _parts(patient):
    """The default's parts of a patient and their weights (the transfer model alone at weight 0)."""
    w = patient["weight"]
    if "shared" not in patient:
        return [patient["transfer"]], [1.0]
    return [patient["transfer"], patient["shared"], patient["own"]], [1.0 - w, w / 2, w / 2]


def _adapted_at(patient, w, transfer=None):
    """The default's mix at weight ``w``, with ``transfer`` in place of the transfer model's
    probabilities when given."""
    transfer = patient["transfer"] if transfer is None else transfer
    if "shared" not in patient:
        return transfer
    return (1.0 - w) * transfer + w * (patient["shared"] + patient["own"]) / 2


def _vote(patient):
    default = patient["default"]
    if "shared" not in patient:
        return default
    transfer, shared, own = (np.argmax(patient[part], axis=1) for part in ("transfer", "shared", "own"))
    called = np.where((shared == own) | (shared == transfer), shared,
                      np.where(transfer == own, transfer, np.argmax(default, axis=1)))
    return np.eye(default.shape[1], dtype=np.float32)[called]


def _adapted_mean(patient) -> np.ndarray:
    """The adapted populations' probabilities (n, k) float32: the mean of the two fits', as gating
    averages them."""
    return ((patient["shared"] + patient["own"]) * np.float32(0.5)).astype(np.float32)


def _adapted_alone(patient) -> np.ndarray:
    """The adapted populations' probabilities alone, their ties broken by the transfer model's as
    gating breaks them (:func:`~gating_core.method.ties.ties_broken`)."""
    return ties_broken(_adapted_mean(patient), lambda rows: patient["transfer"][rows])


def _disagreement(patient) -> float:
    """The share of cells on which the transfer model and the adapted populations do not name the
    same population, as gating counts it (:func:`~gating_core.method.ties.parts_disagreement`)."""
    if "shared" not in patient:
        return 0.0
    return parts_disagreement(patient["transfer"], _adapted_mean(patient))


def _familiar_trees(patient):
    familiar = max(0.0, 1.0 - float(patient["novelty"]) / float(patient["novelty_threshold"]))
    share = 0.5 * familiar if _disagreement(patient) < FAMILIAR_AGREEMENT else 0.0
    return (1.0 - share) * patient["default"] + share * patient["trees"]


def _own_checked(patient):
    if "shared" not in patient:
        return patient["default"]
    differ = np.mean(np.argmax(patient["own"], axis=1) != np.argmax(patient["shared"], axis=1))
    own = patient["shared"] if differ > OWN_CHECK_DISAGREEMENT else patient["own"]
    w = patient["weight"]
    return (1.0 - w) * patient["transfer"] + w * (patient["shared"] + own) / 2


def _geometric_generative(patient):
    if "shared" not in patient:
        return patient["default"]
    pooled = _normalised(np.sqrt(patient["shared"].astype(np.float64) * patient["own"]) + 1e-12)
    return (1.0 - patient["weight"]) * patient["transfer"] + patient["weight"] * pooled


def _familiar(patient, margin=None):
    """``familiar``'s probabilities; None for a fold file without ``training_reach``."""
    if "shared" not in patient:
        return patient["default"]
    if "training_reach" not in patient:
        return None
    reach = patient["training_reach"]
    adapted = (patient["shared"] + patient["own"]) / 2
    rows = np.arange(len(reach))
    margin = FAMILIAR_MARGIN if margin is None else margin
    # A cell whose top populations tie is familiar only if each of them is within the reach.
    near = reach <= margin
    familiar = (np.all(near | (call_weights(patient["transfer"]) == 0), axis=1)
                & np.all(near | (call_weights(adapted) == 0), axis=1))
    w = np.where(familiar, min(patient["weight"], 1.0 / 3.0), patient["weight"]).astype(np.float32)[:, None]
    return (1.0 - w) * patient["transfer"] + w * adapted


def _column_mix(patient, transfer_columns, adapted=None):
    """The default's mix with the transfer model alone in the columns ``transfer_columns`` (k,)
    bool, renormalised (``adapted``: the adapted populations' probabilities, (n, k), when not
    the mean of the two fits')."""
    adapted = (patient["shared"] + patient["own"]) / 2 if adapted is None else adapted
    w = np.where(transfer_columns, 0.0, patient["weight"]).astype(np.float32)
    return _normalised((1.0 - w) * patient["transfer"] + w * adapted)


def _rare_columns(patient):
    if "shared" not in patient:
        return patient["default"]
    return _column_mix(patient, ((patient["shared"] + patient["own"]) / 2).mean(axis=0) < RARE_SHARE)


def _checked_mix(patient, adapted):
    """The default's mix of the transfer model and ``adapted`` (n, k), with its check of rare
    populations that swell (a fold file without ``largest_shares``: none), which does not act
    where the halves part ways on more than ``PARTING_SHARE`` of the other cells."""
    swollen = np.zeros(len(patient["populations"]), bool)
    if "largest_shares" in patient:
        swollen = swollen_populations(patient["prior"], patient["largest_shares"], called_shares(adapted),
                                      called_shares(patient["transfer"]))
        if swollen.any() and disagreement_beside(patient["transfer"], adapted, swollen) > PARTING_SHARE:
            swollen[:] = False
    return _column_mix(patient, swollen, adapted)


def _rare_shared(patient, disjoint_only=False):
    """``rare-shared`` (``disjoint_only``: ``rare-disjoint``); None for a fold file without
    ``largest_shares``."""
    if "largest_shares" not in patient:
        return None
    if "shared" not in patient:
        return patient["default"]
    adapted = (patient["shared"] + patient["own"]) / 2
    columns = np.asarray(patient["largest_shares"]) < RARE_SHARE
    if disjoint_only:
        shared, own = np.argmax(patient["shared"], axis=1), np.argmax(patient["own"], axis=1)
        for j in np.flatnonzero(columns):
            either = int(np.sum((shared == j) | (own == j)))
            columns[j] = either > 0 and np.sum((shared == j) & (own == j)) / either < DISJOINT_OVERLAP
    if columns.any():
        adapted = _normalised(np.where(columns[None, :], patient["shared"], adapted))
    return _checked_mix(patient, adapted)


def _given(part, combine):
    """A rule that needs ``part``, which only some runs keep (``run --embedding-trees``, ...):
    None for a patient whose fold file has none, so that it is not scored."""
    return lambda patient: combine(patient) if part in patient else None


RULES = {
    "default": lambda p: p["default"],
    "geometric": lambda p: _geometric(*_parts(p)),
    "geometric-generative": _geometric_generative,
    "plus-lda": lambda p: 0.75 * p["default"] + 0.25 * p["lda"],
    "plus-trees": lambda p: 0.75 * p["default"] + 0.25 * p["trees"],
    "vote": _vote,
    "confidence": lambda p: _normalised(sum(w * q * q.max(axis=1, keepdims=True) for q, w in zip(*_parts(p)))),
    "novelty-faded": lambda p: _adapted_at(p, p["weight"] * min(1.0, float(p["novelty"]))),
    "familiar-trees": _familiar_trees,
    "own-checked": _own_checked,
    "flagged-lda": lambda p: (0.75 * p["default"] + 0.25 * p["lda"] if _disagreement(p) > DISAGREEMENT_THRESHOLD
                              else p["default"]),
    "trees-for-transfer": lambda p: _adapted_at(p, p["weight"], p["trees"]),
    "half-trees": lambda p: _adapted_at(p, p["weight"], (p["transfer"] + p["trees"]) / 2),
    "adapted-third": lambda p: _adapted_at(p, 1.0 / 3.0),
    "embedding-trees-for-transfer": _given("embedding_trees",
                                           lambda p: _adapted_at(p, p["weight"], p["embedding_trees"])),
    "embedding-trees": lambda p: p.get("embedding_trees"),
    "aligned-trees": lambda p: p.get("aligned_trees"),
    "aligned-trees-for-transfer": _given("aligned_trees", lambda p: _adapted_at(p, p["weight"], p["aligned_trees"])),
    "half-aligned-trees": _given("aligned_trees",
                                 lambda p: _adapted_at(p, p["weight"], (p["transfer"] + p["aligned_trees"]) / 2)),
    "familiar": _familiar,
    "rare-columns": _rare_columns,
    "plain-mix": lambda p: _adapted_at(p, p["weight"]),
    "rare-shared": _rare_shared,
    "rare-disjoint": lambda p: _rare_shared(p, disjoint_only=True),
    "lda": lambda p: p["lda"],
    "trees": lambda p: p["trees"],
    "pooled-logistic": lambda p: p.get("pooled_logistic"),
}


def score(folder: Path, metric: str, rules=None) -> dict:
    """{set: {rule: [score of each held-out patient]}} from a ``run`` folder; ``rules``: names
    of RULES to score (the default is always scored, first), every rule when None."""
    key = "accuracy" if metric == "accuracy" else "macro_f1"
    unknown = sorted(set(rules or ()) - set(RULES))
    if unknown:
        raise ValueError(f"unknown rules: {', '.join(unknown)} (known: {', '.join(RULES)})")
    chosen = {rule: RULES[rule] for rule in (["default"] + [r for r in rules if r != "default"] if rules else RULES)}
    table = {}
    for name, _, patient in held_out_patients([folder]):
        rows = table.setdefault(name, {rule: [] for rule in chosen})
        populations = patient["populations"]
        for rule, combine in chosen.items():
            proba = combine(patient)
            if proba is None:  # a part this fold's run did not fit (run --embedding-trees, --aligned-trees)
                continue
            called = populations[np.argmax(proba, axis=1)]
            rows[rule].append(patient_scores(patient["truth"], called, populations)[key])
    return table


def report(table: dict) -> None:
    order = [s for s in SETS + tuple(PATIENT_SETS) if s in table] + sorted(set(table) - set(SETS) - set(PATIENT_SETS))
    rules = list(next(iter(table.values())))
    print("set".ljust(26) + "".join(rule[:15].rjust(16) for rule in rules))
    for name in order:
        print(name.ljust(26) + "".join((f"{np.mean(v):.3f}/{np.min(v):.3f}" if v else "-").rjust(16)
                                       for v in table[name].values()))
    print("\nsets where a rule gains / loses more than 0.1 point against the default (mean; worst patient)")
    for rule in rules:
        scored = [s for s in order if table[s][rule]]
        mean = [np.mean(table[s][rule]) - np.mean(table[s]["default"]) for s in scored]
        worst = [np.min(table[s][rule]) - np.min(table[s]["default"]) for s in scored]
        print(f"{rule:<22} mean +{sum(d > 1e-3 for d in mean)} -{sum(d < -1e-3 for d in mean)}; "
              f"worst +{sum(d > 1e-3 for d in worst)} -{sum(d < -1e-3 for d in worst)}")


def review_table(folders) -> pd.DataFrame:
    """Every held-out patient of ``run`` folders with both adapted fits: its set, the default's
    accuracy, and the share of its cells on which the transfer model and the adapted populations
    name different populations (what gating measures on the content-chosen cells, here on the
    fold file's cells), for ``bench_unseen.print_review``."""
    rows = []
    for name, folder, patient in held_out_patients(folders):
        if "shared" not in patient:
            continue
        populations = patient["populations"]
        rows.append({"set": name, "folder": str(folder), "patient": str(patient["name"]), "method": "marginal",
                     "accuracy": float(np.mean(populations[np.argmax(patient["default"], axis=1)] == patient["truth"])),
                     "disagreement": _disagreement(patient),
                     "novelty": float(patient["novelty"]),
                     "novelty_threshold": float(patient["novelty_threshold"])
                     if "novelty_threshold" in patient else np.nan})
    return pd.DataFrame(rows)


#: ``parts``: the gatings a reviewer compares, each patient's probabilities of one.
REVIEW_ALTERNATIVES = {"default": lambda p: p["default"], "transfer": lambda p: p["transfer"],
                       "adapted": _adapted_alone}


def parts_table(folders) -> pd.DataFrame:
    """Every held-out patient of ``run`` folders whose model mixes both parts (a weight strictly
    between 0 and 1: where ``gate --part`` can give each): its set, whether the review flags it,
    and the accuracy of each of :data:`REVIEW_ALTERNATIVES` and of the best."""
    rows = []
    for name, _, patient in held_out_patients(folders):
        if "shared" not in patient or not 0.0 < patient["weight"] < 1.0:
            continue
        populations = patient["populations"]
        row = {"set": name, "patient": str(patient["name"]),
               "flagged": _disagreement(patient) > DISAGREEMENT_THRESHOLD}
        for alternative, proba in REVIEW_ALTERNATIVES.items():
            row[alternative] = float(np.mean(populations[np.argmax(proba(patient), axis=1)] == patient["truth"]))
        row["best"] = max(row[alternative] for alternative in REVIEW_ALTERNATIVES)
        rows.append(row)
    return pd.DataFrame(rows)


def print_parts(table: pd.DataFrame, poor: float = 0.8) -> None:
    columns = [*REVIEW_ALTERNATIVES, "best"]
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        for name, rows in (("flagged", table[table["flagged"]]), ("not flagged", table[~table["flagged"]])):
            if rows.empty:
                continue
            print(f"== {name}: {len(rows)} patients; mean / worst accuracy")
            print("  " + "  ".join(f"{c} {rows[c].mean():.3f} / {rows[c].min():.3f}" for c in columns))
            for c in REVIEW_ALTERNATIVES:
                if c != "default":
                    better = rows[c] > rows["default"] + 0.01
                    gain = (rows.loc[better, c] - rows.loc[better, "default"]).mean() if better.any() else 0.0
                    print(f"  {c} alone beats the default by more than a point on {int(better.sum())} "
                          f"(by {gain:.3f} on average)")
            low = rows["default"] < poor
            print(f"  gated below {poor} by the default: {int(low.sum())}; the best part lifts "
                  f"{int((low & (rows['best'] >= poor)).sum())} of them to {poor} or more")
        flagged = table[table["flagged"]]
        if len(flagged):
            print("per set, flagged patients: default -> best")
            print(flagged.groupby("set")[["default", "best"]].agg(["count", "mean", "min"]).to_string())


#: ``population``: the parts and standard methods whose calls of one population are counted.
POPULATION_PARTS = ("default", "transfer", "shared", "own", "lda", "trees", "pooled_logistic")


def population_table(folders, population: str) -> pd.DataFrame:
    """How each of :data:`POPULATION_PARTS` calls one population, per set over every held-out
    patient of ``run`` folders: the cells it calls that population (``called``), those of them
    the experts gated there (``right``) and the population's cells (``cells``), pooled, then
    ``precision`` and ``recall``. A fold without the population, or without a part, adds nothing
    to that part."""
    counts = {}
    for name, _, patient in held_out_patients(folders):
        populations = [str(p) for p in patient["populations"]]
        if population not in populations:
            continue
        column = populations.index(population)
        truth = patient["truth"] == population
        for part in POPULATION_PARTS:
            if part not in patient:
                continue
            called = np.argmax(patient[part], axis=1) == column
            row = counts.setdefault((name, part), [0, 0, 0])
            row[0] += int(called.sum())
            row[1] += int((called & truth).sum())
            row[2] += int(truth.sum())
    table = pd.DataFrame([{"set": s, "part": part, "called": c, "right": r, "cells": n}
                          for (s, part), (c, r, n) in counts.items()])
    if table.empty:
        return table
    table["precision"] = table["right"] / table["called"].clip(lower=1)
    table["recall"] = table["right"] / table["cells"].clip(lower=1)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("run", help="fit each fold once and keep every part's probabilities")
    fit.add_argument("sets", nargs="+", help=f"sets of bench_unseen.py ({', '.join(SETS)}, sim-<seed>) "
                                             f"or {', '.join(PATIENT_SETS)}")
    fit.add_argument("--out", required=True, type=Path, help="folder of the folds' .npz files")
    fit.add_argument("--seed", type=int, default=0, help="model seed")
    fit.add_argument("--embedding-trees", action="store_true",
                     help="also fit gradient-boosted trees on each cell beside its patient's embedding")
    fit.add_argument("--aligned-trees", action="store_true",
                     help="also keep the pooled trees' probabilities of the cells moved back by the shift "
                          "of the patient's adapted populations")
    scoring = commands.add_parser("score", help="score every rule on a run's folder")
    scoring.add_argument("folder", type=Path)
    scoring.add_argument("--metric", choices=("accuracy", "macro-f1"), default="accuracy")
    scoring.add_argument("--rules", help=f"comma-separated rules to score, the default's beside them "
                                         f"(default: every one: {', '.join(RULES)})")
    reviewing = commands.add_parser("review", help="the default's accuracy against its parts' disagreement "
                                                   "(the review flag), over one or more run folders")
    reviewing.add_argument("folders", type=Path, nargs="+")
    comparing = commands.add_parser("parts", help="the default against each part alone and the best of them, "
                                                  "flagged patients apart, over one or more run folders")
    comparing.add_argument("folders", type=Path, nargs="+")
    counting = commands.add_parser("population", help="each part's precision and recall of one population, "
                                                      "per set, over one or more run folders")
    counting.add_argument("name", help="the population, as labelled (e.g. 'B cells')")
    counting.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "population":
        table = population_table(args.folders, args.name)
        if table.empty:
            print(f"no held-out patient with population {args.name!r} in {', '.join(map(str, args.folders))}",
                  file=sys.stderr)
            return 1
        with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
            print(table.to_string(index=False))
        return 0
    if args.command == "parts":
        table = parts_table(args.folders)
        if table.empty:
            print(f"no folds with adapted populations in {', '.join(map(str, args.folders))}", file=sys.stderr)
            return 1
        print_parts(table)
        return 0
    if args.command == "run":
        run(args.sets, args.out, args.seed, args.embedding_trees, args.aligned_trees)
        return 0
    if args.command == "review":
        table = review_table(args.folders)
        if table.empty:
            print(f"no folds with adapted populations in {', '.join(map(str, args.folders))}", file=sys.stderr)
            return 1
        print_review(table)
        return 0
    try:
        table = score(args.folder, args.metric, args.rules.split(",") if args.rules else None)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not table:
        print(f"no folds in {args.folder}", file=sys.stderr)
        return 1
    report(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
