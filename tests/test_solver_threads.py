"""A fit is the same bits on any number of BLAS threads: the iterative solvers (logistic,
hinge), and the default model as a whole.

Before their objective was summed over fixed row blocks, BLAS threaded the whole product and
the fitted coefficients moved by about 2e-4 between one and two threads: a model trained from
the command line and the same model trained in another process could gate differently.
"""

from __future__ import annotations

import numpy as np
import pytest

from gating_core import cpus
from gating_core.method import lbfgs, solvers
from helpers import sample_cohort


def _problem(seed=0, patients=3, cells=7000, dim=24, k=4):
    """Row counts that end inside a block (7,000 x 3 = 21,000 rows)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, dim)).astype(np.float32)
    features, targets = [], []
    for _ in range(patients):
        y = rng.integers(0, k, cells)
        features.append((centers[y] + rng.normal(scale=2.0, size=(cells, dim))).astype(np.float32))
        targets.append(y)
    return features, targets, np.full(patients, 1.0 / patients)


@pytest.mark.parametrize("solve", [solvers.fit_weighted_logistic, solvers.fit_weighted_hinge])
def test_one_and_two_threads_fit_the_same_bits(solve):
    if cpus.current_blas_threads() is None:
        pytest.skip("no BLAS loaded")
    features, targets, weights = _problem()
    assert sum(len(f) for f in features) > 2 * lbfgs.SOLVER_BLOCK_ROWS
    fits = {}
    for threads in (1, 2):
        with cpus.blas_threads(threads):
            fits[threads] = solve(features, targets, weights, 4, 1e-3, max_iter=60)
    np.testing.assert_array_equal(fits[1][0], fits[2][0])
    np.testing.assert_array_equal(fits[1][1], fits[2][1])


def test_the_blocked_objective_is_the_whole_objective():
    """The blocks' sums give the logistic loss and gradient computed on all rows at once."""
    features, targets, weights = _problem(seed=1, patients=2, cells=9000, dim=6, k=3)
    f = np.vstack(features).astype(np.float64)
    t = np.concatenate(targets)
    cell_w = np.concatenate([np.full(len(x), w / len(x)) for x, w in zip(features, weights)])
    rng = np.random.default_rng(2)
    w, b, alpha = rng.normal(size=(6, 3)) * 0.3, rng.normal(size=3) * 0.1, 0.01
    z = f @ w.astype(np.float32).astype(np.float64) + b.astype(np.float32)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    value = -cell_w @ np.log(p[np.arange(len(t)), t]) + alpha * (w.astype(np.float32).astype(np.float64) ** 2).sum()
    onehot = np.eye(3)[t]
    grad_w = f.T @ ((p - onehot) * cell_w[:, None]) + 2 * alpha * w.astype(np.float32)

    seen = {}

    def capture(objective, warm, max_iter, gtol, curvature=None):
        theta = objective.centred(w, b)
        back = objective.model(theta)
        np.testing.assert_allclose(back[0], w, rtol=0, atol=0)
        np.testing.assert_allclose(back[1], b, rtol=0, atol=1e-12)
        seen["value"], seen["grad"] = objective(theta)
        seen["centre"] = objective.centre
        return np.zeros((objective.dim, objective.k)), np.zeros(objective.k)

    original = solvers.minimise_linear
    solvers.minimise_linear = capture
    try:
        solvers.fit_weighted_logistic(features, targets, weights, 3, alpha)
    finally:
        solvers.minimise_linear = original
    blocks = lbfgs.RowBlocks(None, np.vstack(features), cell_w.astype(np.float32), alpha, 3)
    assert len(blocks.slices) == -(-18000 // lbfgs.SOLVER_BLOCK_ROWS) > 1
    np.testing.assert_allclose(seen["centre"], cell_w @ f / cell_w.sum(), rtol=1e-5)
    # The value is the model's; the gradient is taken in the centred coordinates (W, c), b = c - m W.
    assert seen["value"] == pytest.approx(value, rel=1e-5)
    grad_b = ((p - onehot) * cell_w[:, None]).sum(axis=0)
    np.testing.assert_allclose(seen["grad"][18:], grad_b, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(seen["grad"][:18].reshape(6, 3), grad_w - np.outer(seen["centre"], grad_b),
                               rtol=1e-4, atol=1e-7)


def test_the_default_model_is_the_same_bits_on_one_or_two_blas_threads(sample_data_dir, monkeypatch):
    """Training sizes BLAS from the load average (cpus.idle_cpus), so the same command may run on
    one thread today and two tomorrow. Small products (a patient's cells times the feature
    weights, calibration scores), F^T F and the solvers' sums all moved with it by 1e-9 to 1e-3
    before they were pinned to one BLAS thread per worker; the gates must not."""
    if cpus.current_blas_threads() is None or cpus.current_blas_threads() < 2:
        pytest.skip("BLAS runs one thread here")
    from gating_core.fcs import read_fcs
    from gating_core.model import GatingModel

    samples, labels = sample_cohort(range(1, 7))
    new = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    fitted = {}
    for threads in (1, 2):
        monkeypatch.setattr(cpus, "idle_cpus", lambda usable=None, load=None, threads=threads: threads)
        model = GatingModel(cells_per_patient=1000).fit(list(samples), list(labels))
        fitted[threads] = (model, model.predict_proba(new))
    (one, p1), (two, p2) = fitted[1], fitted[2]
    assert one.selection_ == two.selection_
    assert one.classifier_.temperature_ == two.classifier_.temperature_
    np.testing.assert_array_equal(one.pooled_classifier_.coef_, two.pooled_classifier_.coef_)
    np.testing.assert_array_equal(p1, p2)
