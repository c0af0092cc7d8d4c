"""The held-out check's logistic folds, preconditioned by the curvature of the fit on all
patients minus their held-out patients' (solvers.logistic_curvature, solvers._Preconditioned).

The preconditioner changes the path L-BFGS takes, never the problem nor the stopping rule: a
fold reaches the same optimum, in fewer evaluations."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core import cpus, solvers
from gating_core.held_out import FOLD_GTOL


def _patients(seed=0, patients=5, cells=1500, dim=8, k=3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)).astype(np.float32)
    features, targets = [], []
    for i in range(patients):
        y = rng.integers(0, k, cells + 100 * i)
        shift = rng.normal(scale=0.3, size=dim)  # each patient a little apart, as centers are
        features.append((centres[y] + shift + rng.normal(scale=1.5, size=(len(y), dim))).astype(np.float32))
        targets.append(y)
    return features, targets


def _softmax(z):
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _objective(features, targets, weights, k, alpha):
    """The fit's own _RowBlocks objective, captured from fit_weighted_logistic."""
    seen = {}

    def capture(objective, warm, max_iter, gtol, curvature=None):
        seen["objective"] = objective
        return np.zeros((objective.dim, k)), np.zeros(k)

    original = solvers._minimise_linear
    solvers._minimise_linear = capture
    try:
        solvers.fit_weighted_logistic(features, targets, weights, k, alpha)
    finally:
        solvers._minimise_linear = original
    return seen["objective"]


def test_the_curvature_is_the_class_blocks_of_the_losss_hessian(monkeypatch):
    monkeypatch.setattr(solvers, "CURVATURE_MIN_SPREAD", -1.0)  # every cell, to compare exactly
    features, targets = _patients(patients=3, cells=400, dim=4, k=3)
    weights = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(1)
    coef, intercept = rng.normal(size=(4, 3)) * 0.5, rng.normal(size=3) * 0.2
    curvature = solvers.logistic_curvature(features, weights, coef, intercept)
    assert curvature.shape == (3, 5, 5)

    # By the definition: sum_i w_i / n_i sum_j p (1 - p) [x, 1] [x, 1]^T, in float64.
    expected = np.zeros((3, 5, 5))
    for x, w in zip(features, weights):
        design = np.hstack([x.astype(np.float64), np.ones((len(x), 1))])
        z = design[:, :4] @ coef.astype(np.float32) + intercept.astype(np.float32)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        for c in range(3):
            expected[c] += (design * (p[:, c] * (1 - p[:, c]) * w / len(x))[:, None]).T @ design
    np.testing.assert_allclose(curvature, expected, rtol=2e-5, atol=1e-9)

    # And it is the loss's own: each class block of the objective's Hessian, by central
    # differences of its gradient in L-BFGS's centred coordinates, is what the
    # preconditioner factorises (with the penalty on W).
    alpha = 0.01
    objective = _objective(features, targets, weights, 3, alpha)
    theta = objective.centred(coef, intercept)
    pre = solvers._Preconditioned.build(objective, theta, objective, curvature, 1e-6)
    step = 1e-3
    for c in range(3):
        coordinates = [d * 3 + c for d in range(4)] + [4 * 3 + c]
        hessian = np.empty((5, 5))
        for a, index in enumerate(coordinates):
            up, down = theta.copy(), theta.copy()
            up[index] += step
            down[index] -= step
            hessian[:, a] = (objective(up)[1][coordinates] - objective(down)[1][coordinates]) / (2 * step)
        factor = pre.factors[c]
        np.testing.assert_allclose(factor @ factor.T, hessian, rtol=0, atol=2e-4 * np.abs(hessian).max())


def _fold_fit(features, targets, warm, curvature, gtol, monkeypatch):
    """A fold fit on ``features`` from ``warm``; returns (W, b, objective evaluations)."""
    evaluations = []
    call = solvers._RowBlocks.__call__

    def counted(self, theta, pool=None):
        evaluations.append(1)
        return call(self, theta, pool)

    monkeypatch.setattr(solvers._RowBlocks, "__call__", counted)
    n = len(features)
    coef, intercept = solvers.fit_weighted_logistic(features, targets, np.full(n, 1.0 / n), 3, 1e-4, warm=warm,
                                                    gtol=gtol, curvature=curvature)
    monkeypatch.setattr(solvers._RowBlocks, "__call__", call)
    return coef, intercept, len(evaluations)


def test_a_fold_preconditioned_by_everyones_curvature_minus_its_own_stops_sooner_and_no_farther(monkeypatch):
    features, targets = _patients()
    n = len(features)
    everyone = solvers.fit_weighted_logistic(features, targets, np.full(n, 1.0 / n), 3, 1e-4, gtol=1e-5)
    total = solvers.logistic_curvature(features, np.ones(n), *everyone)
    held = 2
    kept = [i for i in range(n) if i != held]
    fold_curvature = (total - solvers.logistic_curvature([features[held]], [1.0], *everyone)) / len(kept)
    fold = [features[i] for i in kept], [targets[i] for i in kept]

    # The fold's optimum, to the product's training tolerance (1e-6; float32 sums put a floor
    # under the gradient near there, so tighter is not better).
    reference = _fold_fit(*fold, everyone, None, solvers.LBFGS_GTOL, monkeypatch)
    plain = _fold_fit(*fold, everyone, None, FOLD_GTOL, monkeypatch)
    preconditioned = _fold_fit(*fold, everyone, fold_curvature, FOLD_GTOL, monkeypatch)
    # At the check's tolerance, in fewer evaluations (7 against 14 here) ...
    assert preconditioned[2] < 0.75 * plain[2], (preconditioned[2], plain[2])
    # ... and no farther from the optimum: the held-out patient's probabilities, which are
    # what the check reads.
    probabilities = [_softmax(features[held] @ coef + intercept) for coef, intercept, _ in
                     (reference, plain, preconditioned)]
    plain_error = np.abs(probabilities[1] - probabilities[0]).max()
    preconditioned_error = np.abs(probabilities[2] - probabilities[0]).max()
    assert preconditioned_error <= plain_error, (preconditioned_error, plain_error)
    assert preconditioned_error < 1e-3

    # The stopping rule is the objective's gradient, as plain L-BFGS's: the fit it returns has
    # no gradient entry above gtol.
    objective = _objective(*fold, np.full(len(kept), 1.0 / len(kept)), 3, 1e-4)
    coef, intercept, _ = _fold_fit(*fold, everyone, fold_curvature, 1e-5, monkeypatch)
    assert np.abs(objective(objective.centred(coef, intercept))[1]).max() <= 1e-5


def test_a_curvature_that_does_not_factorise_leaves_plain_lbfgs_and_a_wrong_shape_is_refused(monkeypatch):
    features, targets = _patients(patients=3)
    everyone = solvers.fit_weighted_logistic(features, targets, np.full(3, 1 / 3), 3, 1e-4, gtol=1e-5)
    fold = features[:2], targets[:2]
    plain = _fold_fit(*fold, everyone, None, 1e-5, monkeypatch)
    negative = -np.broadcast_to(np.eye(9), (3, 9, 9)).copy()
    fallback = _fold_fit(*fold, everyone, negative, 1e-5, monkeypatch)
    np.testing.assert_array_equal(fallback[0], plain[0])
    assert fallback[2] == plain[2]
    with pytest.raises(ValueError, match="curvature has shape"):
        _fold_fit(*fold, everyone, np.zeros((3, 8, 8)), 1e-5, monkeypatch)


def test_the_curvature_and_a_preconditioned_fit_are_the_same_bits_on_one_or_two_threads():
    if cpus.current_blas_threads() is None:
        pytest.skip("no BLAS loaded")
    features, targets = _patients(cells=3000)
    n = len(features)
    everyone = solvers.fit_weighted_logistic(features, targets, np.full(n, 1.0 / n), 3, 1e-4, gtol=1e-5)
    results = {}
    for threads in (1, 2):
        with cpus.blas_threads(threads):
            curvature = solvers.logistic_curvature(features[1:], np.ones(n - 1), *everyone, workers=threads) / (n - 1)
            fit = solvers.fit_weighted_logistic(features[1:], targets[1:], np.full(n - 1, 1.0 / (n - 1)), 3, 1e-4,
                                                warm=everyone, gtol=1e-6, curvature=curvature)
        results[threads] = curvature, fit
    np.testing.assert_array_equal(results[1][0], results[2][0])
    np.testing.assert_array_equal(results[1][1][0], results[2][1][0])
    np.testing.assert_array_equal(results[1][1][1], results[2][1][1])
