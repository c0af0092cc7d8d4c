"""The pooled companion's settings, by cross-validation over groups: its logistic penalty
(:func:`select_logistic_alpha`) and its weight in the blend (:func:`select_pooled_weight`).

Both run at most ``selection.SEARCH_FEATURES`` random features, as the hyperparameter search
(:mod:`gating_core.method.selection`) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import gating_core.method.selection as selection
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.ridge import RidgeStatistics
from gating_core.method.training_problem import TrainingProblem, check_training_set


DEFAULT_LOGISTIC_ALPHAS = (1e-5, 1e-4, 1e-3)


def select_logistic_alpha(samples, labels, base: MarginalTransferClassifier, embedding_samples=None, groups=None,
                          cv_folds=5, cells_per_patient=1500, alphas=DEFAULT_LOGISTIC_ALPHAS, progress=None) -> float:
    """The penalty of the logistic loss, by cross-validation over groups at base's bandwidths.

    The ridge path's closed form does not carry over to the logistic loss, so each fold is an
    L-BFGS solve; the path runs from the strongest penalty to the weakest with warm starts.
    """
    from gating_core.method.groups import group_folds
    from gating_core.method.solvers import fit_weighted_logistic

    samples, labels = check_training_set(samples, labels)
    probe = MarginalTransferClassifier(**{**base.get_params(), "cells_per_patient": cells_per_patient,
                                          "n_features": min(base.n_features, selection.SEARCH_FEATURES)})
    problem = TrainingProblem(probe, samples, labels, embedding_samples, groups)
    features = problem.features(problem.feature_map(problem.bandwidth_x, problem.bandwidth_p))
    targets = problem.targets
    source = problem.source
    folds = group_folds(list(range(len(samples))) if groups is None else list(groups), cv_folds, 1,
                        probe.random_state)
    ordered = sorted(alphas, reverse=True)
    scores = np.zeros(len(ordered))
    for f, held_out in enumerate(folds):
        held = set(held_out)
        rows = [r for r in range(len(features)) if int(source[r]) not in held]
        warm = None
        for a, alpha in enumerate(ordered):
            coef, intercept = fit_weighted_logistic([features[r] for r in rows], [targets[r] for r in rows],
                                                    np.full(len(rows), 1.0 / len(rows)), len(problem.classes),
                                                    alpha, warm=warm)
            warm = (coef, intercept)
            scores[a] += np.mean([np.mean(np.argmax(features[i] @ coef + intercept, axis=1) == targets[i])
                                  for i in held_out])
        if progress is not None:
            progress((f + 1) / len(folds))
    return float(ordered[int(np.argmax(scores))])


#: Weights of the pooled companion the selection compares (see GatingModel.pooled_weight).
DEFAULT_POOLED_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The weight kept unless another wins on held-out groups by more than POOLED_WEIGHT_MARGIN:
#: an even blend of two models that err differently is the safe choice when folds cannot tell.
PREFERRED_POOLED_WEIGHT = 0.5
POOLED_WEIGHT_MARGIN = 0.002


@dataclass
class PooledWeightResult:
    """Outcome of :func:`select_pooled_weight`: the chosen weight, the held-out score of every
    weight compared (``table``: weight -> score) and the number of folds (0: nothing to
    compare, the preferred weight was kept)."""

    weight: float
    table: dict
    n_folds: int


def choose_pooled_weight(scores: dict, preferred=PREFERRED_POOLED_WEIGHT, margin=POOLED_WEIGHT_MARGIN) -> float:
    """The weight to keep from held-out ``scores`` (weight -> score): among the weights within
    ``margin`` of the best score, the one nearest ``preferred``."""
    top = max(scores.values())
    close = [w for w, s in scores.items() if s >= top - margin]
    return float(min(close, key=lambda w: (abs(w - preferred), w)))


def select_pooled_weight(samples, labels, main: MarginalTransferClassifier, companion: MarginalTransferClassifier,
                         embedding_samples=None, groups=None, cv_folds=5, cells_per_patient=1500,
                         weights=DEFAULT_POOLED_WEIGHTS, objective="mean", progress=None) -> PooledWeightResult:
    """Weight of the pooled companion in the blend, by cross-validation over groups.

    On each fold the marginal model (ridge, from the shared statistics as in
    :func:`~gating_core.method.selection.select_hyperparameters`, its scores calibrated by one
    temperature fitted on all held-out scores) and the pooled companion (logistic, one L-BFGS
    solve) are fitted on the training groups at most ``selection.SEARCH_FEATURES`` random
    features and ``cells_per_patient`` cells per patient; every weight in ``weights`` blends
    their probabilities on the held-out patients.
    Where the patient's distribution helps on unseen groups the weight stays low; where the
    embedding only extrapolates (centers that differ more than their patients do) it moves to
    the companion. Scores as in :func:`~gating_core.method.selection.select_hyperparameters`
    (``objective``).

    Parameters
    ----------
    samples : list of ndarray (n_i, d), labels : list of ndarray (n_i,)
    main, companion : MarginalTransferClassifier
        Unfitted, with the parameters the final models will use (bandwidths and penalties set).
    embedding_samples : list of ndarray (m_i, d) or None
    groups : sequence (n_patients,) or None
        Center / batch / run of each patient; None: every patient its own group.
    """
    from gating_core.method.calibration import fit_temperature
    from gating_core.method.groups import group_folds
    from gating_core.method.solvers import fit_weighted_logistic

    samples, labels = check_training_set(samples, labels)
    if objective not in ("mean", "worst"):
        raise ValueError(f"objective must be 'mean' or 'worst', got {objective!r}")
    labels_of_group = list(range(len(samples))) if groups is None else list(groups)
    if len(labels_of_group) != len(samples):
        raise ValueError(f"{len(labels_of_group)} group labels for {len(samples)} patients")
    if len(samples) < 3 or len(set(labels_of_group)) < 2:
        # Two patients leave one to train on: no blend can be judged from that.
        return PooledWeightResult(PREFERRED_POOLED_WEIGHT, {}, 0)
    weights = np.asarray(weights, dtype=np.float64)

    def probe(model):
        return MarginalTransferClassifier(**{**model.get_params(), "cells_per_patient": cells_per_patient,
                                             "n_features": min(model.n_features, selection.SEARCH_FEATURES)})

    # Both problems draw the same cells of each patient (same seed and count); the marginal one
    # adds its augmented copies after the real patients.
    marginal, pooled = probe(main), probe(companion)
    problem = TrainingProblem(marginal, samples, labels, embedding_samples, groups)
    features = problem.features(problem.feature_map(problem.bandwidth_x, problem.bandwidth_p))
    stats, targets = problem.statistics(features), problem.targets
    plain = TrainingProblem(pooled, samples, labels, embedding_samples, groups)
    pooled_features = plain.features(plain.feature_map(plain.bandwidth_x, None))
    n_classes, source = len(problem.classes), problem.source
    folds = group_folds(labels_of_group, cv_folds, 1, main.random_state)
    held_scores, held_pooled, held_targets, held_fold = [], [], [], []
    for f, held_out in enumerate(folds):
        held = set(held_out)
        coef, intercept = RidgeStatistics.solve(
            stats.eigen([r for r in range(len(features)) if int(source[r]) not in held]), marginal.alpha)
        rows = [i for i in range(len(samples)) if i not in held]
        p_coef, p_intercept = fit_weighted_logistic([pooled_features[i] for i in rows], [targets[i] for i in rows],
                                                    np.full(len(rows), 1.0 / len(rows)), n_classes, pooled.alpha)
        for i in held_out:
            held_scores.append(features[i] @ coef.astype(np.float32) + intercept.astype(np.float32))
            logits = pooled_features[i] @ p_coef.astype(np.float32) + p_intercept.astype(np.float32)
            held_pooled.append(_softmax(logits))
            held_targets.append(targets[i])
            held_fold.append(f)
        if progress is not None:
            progress((f + 1) / len(folds))
    temperature = fit_temperature(held_scores, held_targets)
    accuracy = np.zeros((len(weights), len(held_targets)))
    for j, (scores, p_pooled, truth) in enumerate(zip(held_scores, held_pooled, held_targets)):
        p_marginal = _softmax(temperature * scores)
        for a, w in enumerate(weights):
            accuracy[a, j] = np.mean(np.argmax((1.0 - w) * p_marginal + w * p_pooled, axis=1) == truth)
    if objective == "mean":
        per_weight = accuracy.mean(axis=1)
    else:
        fold_of = np.asarray(held_fold)
        per_weight = np.min([accuracy[:, fold_of == f].mean(axis=1) for f in np.unique(fold_of)], axis=0)
    table = {float(w): float(s) for w, s in zip(weights, per_weight)}
    return PooledWeightResult(choose_pooled_weight(table), table, len(folds))


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = np.asarray(scores, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    return z / z.sum(axis=1, keepdims=True)
