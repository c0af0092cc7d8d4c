"""Probabilities finished block by block in the scoring threads (intercept, temperature,
softmax; MarginalTransferClassifier._rff_scores) are the same bits as the whole-array passes
they replace: softmax(temperature * (ridge scores + intercept))."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.prediction import SCORE_BLOCK, _softmax


def _reference_softmax(scores):
    scores = scores.copy()
    scores -= scores.max(axis=1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1, keepdims=True)
    return scores


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(4)
    centres = rng.normal(scale=2.0, size=(4, 3))
    cells, labels = [], []
    for shift in rng.normal(scale=0.5, size=(5, 3)):
        y = rng.integers(0, 4, 1500)
        cells.append((centres[y] + shift + rng.normal(size=(1500, 3))).astype(np.float32))
        labels.append(y)
    model = MarginalTransferClassifier(n_features=96, n_embedding_features=16).fit(cells, labels)
    # More cells than one scoring block, ending inside one: the blocks' edges are crossed.
    new = (centres[rng.integers(0, 4, 3 * SCORE_BLOCK + 123)] + rng.normal(size=(3 * SCORE_BLOCK + 123, 3)))
    return model, new.astype(np.float32)


def test_the_softmax_is_the_row_wise_reference_to_the_bit():
    rng = np.random.default_rng(0)
    scores = (rng.normal(size=(5000, 7)) * 30).astype(np.float32)
    scores[:10, 3] = scores[:10, 5]  # ties
    scores[10:20] = 88.0  # a whole row alike, at float32 exp's edge
    np.testing.assert_array_equal(_softmax(scores.copy()), _reference_softmax(scores))
    strided = np.hstack([scores, scores])[:, :7]  # a view whose rows are not contiguous
    np.testing.assert_array_equal(_softmax(strided.copy()), _reference_softmax(scores))


def test_probabilities_are_the_softmax_of_the_calibrated_ridge_scores(fitted):
    model, new = fitted
    embedding = model.embed(new)
    ridge = model.ridge_scores(new, embedding)
    calibrated = ridge * np.float32(model.temperature_)  # the ridge scores hold the intercept
    expected = _reference_softmax(calibrated)
    np.testing.assert_array_equal(model.predict_proba(new, embedding), expected)
    np.testing.assert_array_equal(model.decision_function(new, embedding), calibrated)
    # With a projection beside them (the self-training step's), the same probabilities to
    # float32 rounding: the features meet a (D, k + 2) matrix instead of (D, k), another product
    # shape, which a BLAS kernel may round differently (the same bits on Haswell and SkylakeX
    # here, not promised). Logits to 1e-6 of their scale, probabilities to half that.
    extra = np.random.default_rng(1).normal(size=(96, 2)).astype(np.float32)
    proba, projected = model.predict_proba_and_project(new, embedding, extra)
    scale = float(np.abs(calibrated).max())
    np.testing.assert_allclose(proba, expected, rtol=0, atol=0.5e-6 * scale)
    # ... and the projection is the features' (the feature scale folded into the weights there:
    # 3e-7 of the largest entry apart, measured on both kernels).
    features = model._features(new, embedding)
    direct = features @ extra
    np.testing.assert_allclose(projected, direct, rtol=0, atol=1e-5 * float(np.abs(direct).max()))
    assert projected.shape == (len(new), 2)


def test_several_patients_are_finished_each_with_its_own_embedding(fitted):
    model, new = fitted
    groups = np.repeat([0, 1], [SCORE_BLOCK + 5, len(new) - SCORE_BLOCK - 5])
    both = model.predict_proba(new, groups=groups)
    for g in (0, 1):
        rows = groups == g
        np.testing.assert_array_equal(both[rows], model.predict_proba(new[rows]))
