"""Unseen centers: augmentation, group-aware selection, the logistic loss, agnostic weights."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.classifier import MarginalTransferClassifier, augment_patients, fit_weighted_logistic, shift_spread
from gating_core.selection import select_hyperparameters
from gating_core.synthetic import ellipse_task


def _blobs(n_patients, n=400, seed=0, shift_scale=1.0):
    """Two classes whose boundary moves with a per-patient shift of the whole sample."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(n_patients):
        shift = rng.normal(0, shift_scale, 2)
        y = rng.integers(0, 2, n)
        x = rng.normal(0, 0.5, (n, 2)) + np.where(y[:, None] == 1, 1.5, -1.5) + shift
        xs.append(x.astype(np.float32))
        ys.append(np.where(y == 1, "pos", "neg"))
    return xs, ys


def test_augmented_copies_follow_their_source():
    xs, ys = _blobs(3, n=50)
    cells, labels, emb, source = augment_patients(xs, ys, xs, 2, 0.1, 0.2, random_state=0)
    assert len(cells) == len(labels) == len(emb) == 9
    assert source.tolist() == [0, 1, 2, 0, 0, 1, 1, 2, 2]
    for i in range(3, 9):
        s = source[i]
        np.testing.assert_array_equal(labels[i], ys[s])
        # one affine map per copy and channel, shared by training and embedding cells
        gain = (cells[i][1] - cells[i][0]) / (xs[s][1] - xs[s][0])
        np.testing.assert_allclose(cells[i], xs[s] * gain + (cells[i][0] - xs[s][0] * gain), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(emb[i], cells[i], rtol=1e-6)


def test_shift_spread_counts_groups_not_replicates():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, (2000, 2))
    # two centers two units apart on channel 0, each measured twice identically
    samples = [base, base, base + [2.0, 0.0], base + [2.0, 0.0]]
    gain, shift = shift_spread(samples, groups=["a", "a", "b", "b"])
    assert shift[0] == pytest.approx(0.5)  # capped: std of (0, 2) with ddof=1 is 1.41
    assert shift[1] == pytest.approx(0.0, abs=1e-12) and np.all(gain < 1e-9)
    assert shift_spread(samples, groups=["a"] * 4)[1].tolist() == [0.0, 0.0]


def test_classifier_records_sources_and_gates_with_augmentation():
    xs, ys = _blobs(6, seed=1)
    clf = MarginalTransferClassifier(n_augment=3, augment_gain=0.1, augment_shift=0.3, n_features=128,
                                     cells_per_patient=300).fit(xs, ys)
    assert clf.n_patients_ == 6 and clf.train_embeddings_.shape[0] == 24
    assert clf.patient_source_.tolist()[:6] == list(range(6))
    test_x, test_y = _blobs(1, seed=99)
    assert np.mean(clf.predict(test_x[0]) == test_y[0]) > 0.95


def test_selection_falls_back_to_pooling_unless_the_embedding_wins_by_the_margin(monkeypatch):
    import gating_core.selection as selection

    xs, ys = _blobs(6, n=200, seed=3)
    base = MarginalTransferClassifier(n_features=64)
    kwargs = dict(cells_per_patient=200, x_factors=(1.0,), p_factors=(1.0,))
    monkeypatch.setattr(selection, "POOLING_MARGIN", 1.0)  # the embedding can never win by that much
    result = select_hyperparameters(xs, ys, base, **kwargs)
    assert result.params["use_embedding"] is False and result.params["bandwidth_p"] is None
    assert any(row["p_factor"] is None for row in result.table)
    monkeypatch.setattr(selection, "POOLING_MARGIN", -1.0)  # pooling can never win
    result = select_hyperparameters(xs, ys, base, **kwargs)
    assert result.params["use_embedding"] is True and result.params["bandwidth_p"] > 0


def test_selection_keeps_the_embedding_on_the_ellipse_task():
    x, y = ellipse_task(24, 128, 5)
    labels = [np.where(t > 0, "up", "down") for t in y]
    result = select_hyperparameters(x, labels, MarginalTransferClassifier(n_features=256), cells_per_patient=128)
    assert result.params["use_embedding"] is True and result.params["bandwidth_p"] > 0


def test_selection_never_splits_a_group():
    xs, ys = _blobs(6, n=100, seed=4)
    seen = []

    import gating_core.groups as groups_module

    original = groups_module.group_folds

    def spy(groups, *args, **kwargs):
        folds = original(groups, *args, **kwargs)
        seen.append((list(groups), folds))
        return folds

    groups_module.group_folds = spy
    try:
        select_hyperparameters(xs, ys, MarginalTransferClassifier(n_features=64, n_augment=1, augment_gain=0.1,
                                                                  augment_shift=0.1),
                               groups=["a", "a", "b", "b", "c", "c"], cells_per_patient=100,
                               x_factors=(1.0,), p_factors=(1.0,))
    finally:
        groups_module.group_folds = original
    groups, folds = seen[0]
    for fold in folds:
        held = {groups[i] for i in fold}
        assert sorted(fold) == [i for i, g in enumerate(groups) if g in held]


def test_weighted_logistic_matches_scikit_learn():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    f = [rng.normal(0, 1, (200, 5)).astype(np.float32) for _ in range(2)]
    t = [(x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1) for x in f]
    alpha = 1e-2
    coef, intercept = fit_weighted_logistic(f, t, np.array([0.5, 0.5]), 3, alpha)
    # Same objective in scikit-learn's form: C * sum_i w_i loss_i + 0.5 ||W||^2 with w = 1/(N n_i).
    reference = LogisticRegression(C=1 / (2 * alpha), tol=1e-10, max_iter=5000).fit(
        np.vstack(f), np.concatenate(t), sample_weight=np.full(400, 1 / 400))
    np.testing.assert_allclose(coef, reference.coef_.T, atol=2e-3)
    np.testing.assert_allclose(intercept - intercept.mean(), reference.intercept_ - reference.intercept_.mean(),
                               atol=2e-3)


def test_logistic_loss_gives_calibrated_probabilities():
    xs, ys = _blobs(5, seed=2)
    clf = MarginalTransferClassifier(loss="logistic", alpha=1e-4, n_features=128, cells_per_patient=300).fit(xs, ys)
    assert clf.temperature_ == 1.0
    test_x, test_y = _blobs(1, seed=42)
    proba = clf.predict_proba(test_x[0])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert np.mean(clf.predict(test_x[0]) == test_y[0]) > 0.95


def test_agnostic_weighting_moves_weight_to_the_hardest_patient():
    xs, ys = _blobs(5, seed=6)
    rng = np.random.default_rng(0)
    # Patient 4 has 30% of its labels flipped: no model gates it well.
    flip = rng.random(len(ys[4])) < 0.3
    ys[4] = np.where(flip, np.where(ys[4] == "pos", "neg", "pos"), ys[4])
    clf = MarginalTransferClassifier(patient_weighting="agnostic", n_features=128, cells_per_patient=300,
                                     alpha=1e-3, bandwidth_x=1.0, bandwidth_p=1.0).fit(xs, ys)
    assert clf.patient_weights_.sum() == pytest.approx(1.0)
    assert int(np.argmax(clf.patient_weights_)) == 4
    assert clf.patient_weights_[4] > 1.5 / 5
