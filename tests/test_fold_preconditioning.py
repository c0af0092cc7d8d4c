"""The held-out check's logistic folds, preconditioned by the curvature of the fit on all
patients minus their held-out patients' (solvers.logistic_curvature, lbfgs._Preconditioned).

The preconditioner changes the path L-BFGS takes, never the problem nor the stopping rule: a
fold reaches the same optimum, to the same tolerance, in fewer evaluations.

The product's objective sums float32 products through BLAS, whose rounding depends on the CPU's
kernel (OpenBLAS picks one per CPU: Haswell, SkylakeX, ...). Where a check needs more than
float32 precision (finite differences, the optimum itself), the same objective code runs on
float64 features (``_float64_rows``)."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core import cpus
from gating_core.evaluation.held_out import FOLD_GTOL
from gating_core.method import lbfgs, solvers


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


def _float64_rows(features):
    """``solvers.stacked_rows`` keeping the features float64: the objective's own code (the
    same blocks, the same centring) then evaluates in float64, free of float32 BLAS rounding;
    only W and b are still rounded to float32 by ``lbfgs.RowBlocks`` (2^-24 relative)."""
    return np.vstack([np.asarray(x, dtype=np.float64) for x in features])


def _objective(features, targets, weights, k, alpha):
    """The fit's own RowBlocks objective, captured from fit_weighted_logistic."""
    seen = {}

    def capture(objective, warm, max_iter, gtol, curvature=None):
        seen["objective"] = objective
        return np.zeros((objective.dim, k)), np.zeros(k)

    original = solvers.minimise_linear
    solvers.minimise_linear = capture
    try:
        solvers.fit_weighted_logistic(features, targets, weights, k, alpha)
    finally:
        solvers.minimise_linear = original
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
    # Float32 sums of ~500 products per patient: 8e-7 relative measured on the Haswell and
    # SkylakeX kernels; no entry here is below 1% of the largest, so no cancellation hides.
    np.testing.assert_allclose(curvature, expected, rtol=2e-5, atol=1e-9)

    # And it is the loss's own: each class block of the objective's Hessian, by central
    # differences of its gradient in L-BFGS's centred coordinates, is what the
    # preconditioner factorises (with the penalty on W). The differences are taken of the
    # objective evaluated in float64: its float32 gradient carries BLAS rounding of ~1e-6 that
    # differs between kernels, which a step of 1e-3 turns into errors of 1e-4 to 1e-3 of the
    # Hessian (SkylakeX). In float64 what is left holds on any kernel: the curvature's own
    # float32 sums (within 2e-5 relative, checked above), the step's truncation (step^2 x third
    # derivatives, ~1e-6) and W rounded to float32 inside the objective (2^-24 |W| / step,
    # at most ~3e-5 of one column): 1.4e-5 of the largest entry measured, under 1e-4 on any
    # kernel. Leaving out the penalty (2 alpha = 0.02, 4% of the largest entry here) or the
    # centring fails it.
    alpha = 0.01
    monkeypatch.setattr(solvers, "stacked_rows", _float64_rows)
    objective = _objective(features, targets, weights, 3, alpha)
    theta = objective.centred(coef, intercept)
    pre = lbfgs._Preconditioned.build(objective, theta, objective, curvature, 1e-6)
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
        np.testing.assert_allclose(factor @ factor.T, hessian, rtol=0, atol=1e-4 * np.abs(hessian).max())


def _fold_fit(features, targets, warm, curvature, gtol, monkeypatch):
    """A fold fit on ``features`` from ``warm``; returns (W, b, objective evaluations)."""
    evaluations = []
    call = lbfgs.RowBlocks.__call__

    def counted(self, theta, pool=None):
        evaluations.append(1)
        return call(self, theta, pool)

    monkeypatch.setattr(lbfgs.RowBlocks, "__call__", counted)
    n = len(features)
    coef, intercept = solvers.fit_weighted_logistic(features, targets, np.full(n, 1.0 / n), 3, 1e-4, warm=warm,
                                                    gtol=gtol, curvature=curvature)
    monkeypatch.setattr(lbfgs.RowBlocks, "__call__", call)
    return coef, intercept, len(evaluations)


def _fold_optimum(fold, warm, alpha):
    """The fold's optimum as closely as float64 allows: L-BFGS on the fold's objective evaluated
    in float64 (``_float64_rows``), stopped by nothing but its gradient (no relative-reduction
    test: ``ftol=0``). Returns (the float64 objective, theta)."""
    from scipy.optimize import minimize

    with pytest.MonkeyPatch.context() as m:
        m.setattr(solvers, "stacked_rows", _float64_rows)
        objective = _objective(*fold, np.full(len(fold[0]), 1.0 / len(fold[0])), 3, alpha)
    result = minimize(objective, objective.centred(*warm), jac=True, method="L-BFGS-B",
                      options={"ftol": 0.0, "gtol": 1e-10, "maxiter": 1000, "maxcor": 30})
    return objective, result.x


def _probability_per_gradient(objective, theta, cells):
    """How far, to first order, a probability of ``cells`` can be from its value at the optimum
    ``theta`` for each unit of the largest gradient entry: max over cells and classes of
    ||dp/dtheta H^-1||_1, with H the objective's Hessian at theta (central differences of its
    float64 gradient) on the directions that move probabilities (a shift common to every class
    moves none, and the intercepts' has no curvature at all)."""
    k, rows = objective.k, objective.dim + 1
    step = 1e-3
    columns = []
    for index in range(len(theta)):
        up, down = theta.copy(), theta.copy()
        up[index] += step
        down[index] -= step
        columns.append((objective(up)[1] - objective(down)[1]) / (2 * step))
    hessian = np.array(columns)
    hessian = (hessian + hessian.T) / 2
    # Orthonormal class-mean-free directions of each row (d, or the intercept) of theta = (D + 1, k).
    values, vectors = np.linalg.eigh(np.eye(k) - 1.0 / k)
    free = np.kron(np.eye(rows), vectors[:, values > 0.5])
    reduced = np.linalg.inv(free.T @ hessian @ free)
    coef, intercept = objective.model(theta)
    p = _softmax(cells.astype(np.float64) @ coef + intercept)
    design = np.hstack([cells.astype(np.float64) - objective.centre, np.ones((len(cells), 1))])
    worst = 0.0
    for c in range(k):
        # dp_c / dtheta[d, c'] = p_c ([c == c'] - p_c') design_d
        spread = p[:, c, None] * ((np.arange(k) == c) - p)  # (n, k)
        jacobian = (design[:, :, None] * spread[:, None, :]).reshape(len(cells), -1)
        worst = max(worst, float(np.abs(jacobian @ free @ reduced @ free.T).sum(axis=1).max()))
    return worst


def test_a_fold_preconditioned_by_everyones_curvature_minus_its_own_stops_sooner_within_its_tolerance(monkeypatch):
    features, targets = _patients()
    n = len(features)
    everyone = solvers.fit_weighted_logistic(features, targets, np.full(n, 1.0 / n), 3, 1e-4, gtol=1e-5)
    total = solvers.logistic_curvature(features, np.ones(n), *everyone)
    held = 2
    kept = [i for i in range(n) if i != held]
    fold_curvature = (total - solvers.logistic_curvature([features[held]], [1.0], *everyone)) / len(kept)
    fold = [features[i] for i in kept], [targets[i] for i in kept]

    plain = _fold_fit(*fold, everyone, None, FOLD_GTOL, monkeypatch)
    preconditioned = _fold_fit(*fold, everyone, fold_curvature, FOLD_GTOL, monkeypatch)
    # At the check's tolerance, in fewer evaluations (6-7 against 14-17 on the Haswell and
    # SkylakeX kernels) ...
    assert preconditioned[2] < 0.75 * plain[2], (preconditioned[2], plain[2])

    # ... and as near the fold's optimum as that tolerance asks: the held-out patient's
    # probabilities, which are what the check reads, within FOLD_GTOL times the most a
    # probability moves per unit of gradient there (to first order, whatever the gradient's
    # direction). That bound is the problem's, computed in float64, not the CPU's: 3.4e-4
    # here, where the fits end 6e-6 (preconditioned) and 1.2e-5 (plain) from the optimum on
    # the Haswell kernel, 1.3e-4 and 5.4e-5 on SkylakeX, and the warm start 0.21.
    objective, optimum = _fold_optimum(fold, everyone, 1e-4)
    assert np.abs(objective(optimum)[1]).max() <= 1e-7  # 5e-9 to 9e-9 measured
    held_cells = features[held]
    bound = FOLD_GTOL * _probability_per_gradient(objective, optimum, held_cells)
    assert 1e-5 < bound < 1e-3, bound
    reference = _softmax(held_cells @ objective.model(optimum)[0] + objective.model(optimum)[1])
    for name, (coef, intercept, _) in (("plain", plain), ("preconditioned", preconditioned)):
        error = np.abs(_softmax(held_cells @ coef + intercept) - reference).max()
        assert error <= bound, (name, error, bound)
    assert np.abs(_softmax(held_cells @ everyone[0] + everyone[1]) - reference).max() > 100 * bound

    # The stopping rule is the objective's gradient, as plain L-BFGS's: the fit it returns has
    # no gradient entry above gtol. Checked on the objective evaluated in float64: on float32
    # sums, L-BFGS-B's other test (an iteration no longer lowering the objective beyond its
    # rounding) may end a fit first, plain or preconditioned, with entries a few times gtol
    # (the preconditioned fit above on SkylakeX: 2.8e-5, still 1.3e-4 from the optimum, inside
    # the bound because its gradient is not the worst-aligned one).
    with pytest.MonkeyPatch.context() as m:
        m.setattr(solvers, "stacked_rows", _float64_rows)
        coef, intercept, evaluations = _fold_fit(*fold, everyone, fold_curvature, FOLD_GTOL, m)
    assert np.abs(objective(objective.centred(coef, intercept))[1]).max() <= FOLD_GTOL
    assert evaluations < 0.75 * plain[2]


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
