"""Importance-weighted Nystroem KRR (gating_core.method.iw_nystroem): exact in its limits, weights
that track the density ratio, and weighting that helps under covariate shift."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from gating_core.method.iw_nystroem import ImportanceWeightedNystroemKRR, exact_weighted_krr, gaussian_kernel


def _regression(n=250, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = np.sin(2 * x[:, 0]) + x[:, 1] ** 2 / 2 + 0.1 * rng.standard_normal(n)
    return x, y, rng.normal(size=(60, 2))


# A bandwidth (0.2) at which K of 250 cells keeps every eigenvalue above the pseudo-inverse's cut
# (1e-10 of the largest): the Nystroem solve is then exact up to rounding. (At wider
# bandwidths, 0.4 - 0.8, the dropped directions move predictions by 1e-6 - 1e-5.)


def test_all_landmarks_and_unit_weights_is_exact_krr():
    x, y, test = _regression()
    model = ImportanceWeightedNystroemKRR(n_landmarks=len(x), alpha=1e-3, bandwidth=0.2, weighting="none")
    model.fit(x, y, test)
    # exact KRR, independently: (K + lambda n I)^-1 y
    kernel = gaussian_kernel(x, x, 0.2)
    coef = np.linalg.solve(kernel + 1e-3 * len(x) * np.eye(len(x)), y)
    np.testing.assert_allclose(model.predict(test), gaussian_kernel(test, x, 0.2) @ coef, atol=1e-7)
    np.testing.assert_array_equal(model.weights_, np.ones(len(x)))
    assert model.predict(test).shape == (60,)


def test_all_landmarks_with_weights_is_the_direct_weighted_solve():
    x, y, test = _regression(seed=1)
    weights = np.random.default_rng(2).uniform(0.1, 3.0, len(x))
    weights /= weights.mean()
    model = ImportanceWeightedNystroemKRR(n_landmarks=len(x), alpha=1e-3, bandwidth=0.2)
    model.fit(x, y, test, weights=weights)
    kernel = gaussian_kernel(x, x, 0.2)
    direct = np.linalg.solve(np.diag(weights) @ kernel + 1e-3 * len(x) * np.eye(len(x)), weights * y)
    np.testing.assert_allclose(model.predict(test), gaussian_kernel(test, x, 0.2) @ direct, atol=1e-7)
    # and the module's exact baseline agrees with the direct solve
    np.testing.assert_allclose(exact_weighted_krr(x, y, weights, 1e-3, 0.2)[:, 0], direct, atol=1e-8)


def test_weighted_nystroem_solve_matches_its_formula():
    """m < n: alpha = (K_nm^T W K_nm + lambda n K_mm)^+ K_nm^T W Y, computed directly."""
    x, y, test = _regression(seed=3)
    weights = np.random.default_rng(4).uniform(0.2, 2.0, len(x))
    model = ImportanceWeightedNystroemKRR(n_landmarks=40, alpha=1e-2, bandwidth=1.0).fit(x, y, test, weights=weights)
    w = model.weights_
    k_nm = gaussian_kernel(x, model.landmarks_, 1.0)
    k_mm = gaussian_kernel(model.landmarks_, model.landmarks_, 1.0)
    coef = np.linalg.pinv(k_nm.T @ (w[:, None] * k_nm) + 1e-2 * len(x) * k_mm, rcond=1e-12) @ (k_nm.T @ (w * y))
    np.testing.assert_allclose(model.predict(test), gaussian_kernel(test, model.landmarks_, 1.0) @ coef, atol=1e-5)
    assert len(np.unique(model.landmark_indices_)) == 40


def test_estimated_weights_follow_the_density_ratio():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3000, 1))
    new = rng.normal(1.0, 0.6, size=(2000, 1))
    model = ImportanceWeightedNystroemKRR(n_landmarks=50, bandwidth=1.0).fit(x, np.zeros(3000), new)
    true = norm.pdf(x[:, 0], 1.0, 0.6) / norm.pdf(x[:, 0])
    true = np.minimum(true, 20.0)
    assert np.corrcoef(np.log(model.weights_ + 1e-6), np.log(true + 1e-6))[0, 1] > 0.9
    assert model.weights_.mean() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(4))
def test_weighting_lowers_the_error_under_covariate_shift(seed):
    """Train cells ~ N(0, 1), the new patient's ~ N(1.5, 0.4^2), y = sinc(x) + noise; with a
    penalty that biases the fit towards where training cells are dense, the weighted fit's
    error on the new patient is at most 70% of the unweighted one's."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2000, 1))
    y = np.sinc(x[:, 0]) + 0.1 * rng.standard_normal(2000)
    new = rng.normal(1.5, 0.4, size=(1000, 1))
    errors = {}
    for weighting in ("none", "classifier"):
        model = ImportanceWeightedNystroemKRR(n_landmarks=100, alpha=1e-2, bandwidth=1.0, weighting=weighting)
        errors[weighting] = np.mean((model.fit(x, y, new).predict(new) - np.sinc(new[:, 0])) ** 2)
    assert errors["classifier"] < 0.7 * errors["none"], errors


def test_classification_labels_and_leverage_landmarks():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1500, 2))
    labels = np.where(x[:, 0] > 0.3, "CD4", "CD8")
    new = rng.normal(0.5, 0.7, size=(500, 2))
    model = ImportanceWeightedNystroemKRR(n_landmarks=80, alpha=1e-4).fit(x, labels, new)
    assert list(model.classes_) == ["CD4", "CD8"]
    predicted = model.predict(new)
    assert np.mean(predicted == np.where(new[:, 0] > 0.3, "CD4", "CD8")) > 0.95
    assert model.decision_function(new).shape == (500, 2)
    again = ImportanceWeightedNystroemKRR(n_landmarks=80, alpha=1e-4).fit(x, labels, new)
    np.testing.assert_array_equal(again.landmark_indices_, model.landmark_indices_)
    # leverage sampling prefers cells where the new patient is: mean weight of the landmarks > 1
    assert model.weights_[model.landmark_indices_].mean() > 1.0


def test_bad_input_is_named():
    x, y, test = _regression()
    model = ImportanceWeightedNystroemKRR()
    with pytest.raises(ValueError, match="same channels"):
        model.fit(x, y, test[:, :1])
    with pytest.raises(ValueError, match="one per training cell"):
        model.fit(x, y[:-1], test)
    with pytest.raises(ValueError, match="finite"):
        model.fit(np.where(x > 2, np.nan, x), y, test)
    with pytest.raises(ValueError, match="weights"):
        model.fit(x, y, test, weights=-np.ones(len(x)))
    with pytest.raises(ValueError, match="landmarks"):
        ImportanceWeightedNystroemKRR(landmarks="random").fit(x, y, test)
