"""Kernels and feature maps: random features converge to the exact kernels they approximate."""

import numpy as np
import pytest

from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.features import content_hashes, content_subsample
from gating_core.method.features import (ExactKernel, MeanEmbedding, ProductRFF, exact_embedding_inner,
                                         median_pairwise_distance)
from gating_core.synthetic import ellipse_task


def _rff_kernel_error(n_features, seed=0):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 3))
    psi = rng.normal(size=(60, 4)) * 0.3
    fm = ProductRFF(n_features, 3, 4, bandwidth_x=1.5, bandwidth_p=0.7, random_state=seed)
    # Each row has its own "patient" embedding: features row by row.
    features = np.vstack([fm.transform(x[i:i + 1], fm.patient_phase(psi[i])) for i in range(len(x))])
    approx = features.astype(np.float64) @ features.T.astype(np.float64)
    exact = ExactKernel(1.5, 0.7)(psi, x, psi, x)
    return np.abs(approx - exact).max()


def test_product_rff_inner_products_approach_the_exact_product_kernel():
    errors = [np.mean([_rff_kernel_error(d, seed) for seed in range(3)]) for d in (64, 1024, 16384)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.05
    # Monte Carlo rate: 256x the features gives about 16x smaller error.
    assert errors[0] / errors[2] > 6


def test_pooling_feature_map_ignores_the_embedding():
    fm = ProductRFF(128, 2, 0, bandwidth_x=1.0, bandwidth_p=None, random_state=0)
    x = np.random.default_rng(0).normal(size=(10, 2))
    np.testing.assert_array_equal(fm.patient_phase(None), fm.patient_phase(np.ones(8)))
    gram = fm.transform(x, fm.patient_phase(None)) @ fm.transform(x, fm.patient_phase(None)).T
    assert np.abs(gram - ExactKernel(1.0, None)(None, x, None, x)).max() < 0.35


def test_mean_embedding_inner_product_approximates_the_mean_kernel():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(400, 2)), rng.normal(loc=0.7, size=(300, 2))
    exact = exact_embedding_inner(a, b, bandwidth=1.2)
    estimates = [MeanEmbedding(4096, 1.2, 2, random_state=s) for s in range(3)]
    approx = np.mean([e.transform(a) @ e.transform(b) for e in estimates])
    assert approx == pytest.approx(exact, abs=0.01)


def test_embeddings_of_identical_samples_coincide_and_differ_for_shifted_ones():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 3)).astype(np.float32)
    embedder = MeanEmbedding(64, 1.0, 3, random_state=0)
    np.testing.assert_array_equal(embedder.transform(x), embedder.transform(x.copy()))
    shuffled = x[rng.permutation(len(x))]
    np.testing.assert_allclose(embedder.transform(shuffled), embedder.transform(x), atol=1e-12)
    shifted = x + np.float32(0.5)
    assert np.linalg.norm(embedder.transform(shifted) - embedder.transform(x)) > 0.05


def test_mean_embedding_is_the_float64_embedding_to_1e_9_whatever_the_layout_and_chunks():
    # Cosines in float32 for speed: the embedding must stay the float64 formula's, and the
    # same cells must give the same bits through any layout or chunking the paths use.
    rng = np.random.default_rng(5)
    x = rng.normal(scale=1.5, size=(30_000, 12))
    embedder = MeanEmbedding(128, 0.6, 12, random_state=2)  # narrow sigma': phases up to ~100
    phases = x @ embedder.frequencies_
    reference = np.concatenate([np.cos(phases).mean(axis=0), np.sin(phases).mean(axis=0)]) / np.sqrt(128)
    psi = embedder.transform(x)
    assert np.abs(psi - reference).max() < 1e-9
    assert np.abs(reference).max() > 1e-3  # the tolerance is far below the entries themselves
    np.testing.assert_array_equal(embedder.transform(np.asfortranarray(x)), psi)
    np.testing.assert_array_equal(embedder.transform(np.hstack([x, x])[:, :12]), psi)  # a strided view
    np.testing.assert_array_equal(embedder.transform(x.astype(np.float32)),
                                  embedder.transform(x.astype(np.float32).astype(np.float64)))
    chunked = embedder.transform(x, chunk_size=7_000)
    np.testing.assert_allclose(chunked, psi, rtol=0, atol=1e-15)


def test_content_subsample_is_invariant_to_cell_order():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10000, 4)).astype(np.float32)
    order = rng.permutation(len(x))
    chosen = {tuple(r) for r in x[content_subsample(x, 500)]}
    chosen_after_shuffle = {tuple(r) for r in x[order][content_subsample(x[order], 500)]}
    assert len(chosen) == 500
    assert chosen == chosen_after_shuffle
    np.testing.assert_array_equal(content_subsample(x[:100], 500), np.arange(100))


def test_content_hashes_in_parallel_blocks_are_the_same_bits():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(70_001, 5)).astype(np.float32)  # several blocks, the last one short
    serial = content_hashes(x)
    np.testing.assert_array_equal(content_hashes(x, parallel=True), serial)
    np.testing.assert_array_equal(content_subsample(x, 2_000, parallel=True), content_subsample(x, 2_000))
    # A row's hash is its own: the same row anywhere gets the same hash, two rows differ.
    assert serial[3] == content_hashes(x[3:4])[0] and len(np.unique(serial)) == len(x)


def test_median_pairwise_distance_of_a_known_configuration():
    # Four corners of a unit square: distances 1, 1, 1, 1, sqrt2, sqrt2 -> median 1.
    square = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=float)
    assert median_pairwise_distance(square) == pytest.approx(1.0)



def test_median_pairwise_distance_leaves_out_repeated_rows_and_large_offsets_stay_exact():
    # Far from the origin the Gram form |x|^2 + |y|^2 - 2<x, y> loses the distances to
    # cancellation; from the differences they are exact. Repeated rows (distance 0) are left out.
    points = np.array([[1e8, 0.0], [1e8, 0.0], [1e8 + 3.0, 0.0], [1e8, 4.0]])
    # distances: 0 (left out), 3, 4, 3, 4, 5 -> median of (3, 3, 4, 4, 5) is 4
    assert median_pairwise_distance(points) == 4.0
    assert median_pairwise_distance(np.zeros((5, 3))) == 1.0  # no positive distance: the fallback

def _decision_gap(solver, n_features, data):
    xs, ys, xt = data
    common = dict(bandwidth_x=0.4, bandwidth_p=0.5, bandwidth_embedding=0.5, alpha=1e-3, calibrate=False,
                  cells_per_patient=60, random_state=0)
    exact = MarginalTransferClassifier(solver="exact", **common).fit(xs, ys)
    approx = MarginalTransferClassifier(solver=solver, n_features=n_features, **common).fit(xs, ys)
    return np.mean([np.abs(exact.ridge_scores(x) - approx.ridge_scores(x)).mean() for x in xt])


@pytest.fixture(scope="module")
def small_ellipse_problem():
    rng = np.random.default_rng(7)
    xs, ys = ellipse_task(6, 60, rng)
    xt, _ = ellipse_task(3, 60, rng)
    return xs, ys, xt


def test_rff_solver_converges_to_the_exact_kernel_machine(small_ellipse_problem):
    gaps = [_decision_gap("rff", d, small_ellipse_problem) for d in (32, 256, 2048)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.25 * gaps[0]


def test_nystroem_solver_converges_to_the_exact_kernel_machine(small_ellipse_problem):
    gaps = [_decision_gap("nystroem", m, small_ellipse_problem) for m in (20, 120, 360)]
    assert gaps[0] > gaps[1] > gaps[2]
    # With every training cell a landmark, Nystroem is the exact machine.
    assert gaps[2] < 1e-4
