"""DICA / UDICA (gating_core.method.dica): the primal D x D form against Algorithm 1's quantities, the
paper's toy (unseen domains less spread than after KPCA) and dica-pooling in evaluate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import eigh
from sklearn.decomposition import KernelPCA
from sklearn.linear_model import LogisticRegression

from gating_core.method.dica import DICA, distributional_variance, fourier_features, toy_domains
from gating_core.method.features import MeanEmbedding


def _split(seed, shift_sd=1.0):
    domains = toy_domains(20, seed=seed, shift_sd=shift_sd)
    train, unseen = domains[:10], domains[10:]
    return [d[0] for d in train], [d[1] for d in train], [d[0] for d in unseen], [d[1] for d in unseen]


def test_shapes_and_determinism():
    x, y, unseen, _ = _split(0)
    a = DICA(n_components=3, n_features=100).fit(x, y)
    b = DICA(n_components=3, n_features=100).fit(x, y)
    assert a.transform(unseen[0]).shape == (len(unseen[0]), 3)
    assert a.projection_.shape == (200, 3) and a.numerator_.shape == (200, 200)
    np.testing.assert_array_equal(a.transform(unseen[0]), b.transform(unseen[0]))
    assert np.all(np.diff(a.eigenvalues_) <= 0)
    # chunking does not change the projection
    np.testing.assert_allclose(a.transform(unseen[0], chunk_size=7), a.transform(unseen[0]), atol=1e-12)


def test_random_features_approximate_the_gaussian_kernel():
    x, y, _, _ = _split(1)
    cells = x[0][:50]
    z = fourier_features(cells, MeanEmbedding(4000, 1.5, 5, random_state=0).frequencies_)
    small = DICA(n_features=30, bandwidth=1.5).fit(x, y)
    np.testing.assert_array_equal(small.features(cells), fourier_features(cells, small.frequencies_))
    d2 = ((cells[:, None, :] - cells[None, :, :]) ** 2).sum(-1)
    assert np.abs(z @ z.T - np.exp(-d2 / (2 * 1.5 ** 2))).max() < 0.08


def test_supervised_directions_beyond_the_label_rank_are_udica_like():
    """Binary labels: the supervised term has rank 1. With variance_weight=0 the second
    eigenvalue is zero (an arbitrary direction); with the default it is positive."""
    x, y, _, _ = _split(2)
    plain = DICA(n_components=2, n_features=80, variance_weight=0.0).fit(x, y)
    assert plain.eigenvalues_[1] < 1e-10 * plain.eigenvalues_[0]
    mixed = DICA(n_components=2, n_features=80).fit(x, y)
    assert mixed.eigenvalues_[1] > 1e-4 * mixed.eigenvalues_[0]
    # the label direction barely moves
    cosine = abs(plain.projection_[:, 0] @ mixed.projection_[:, 0]) / (
        np.linalg.norm(plain.projection_[:, 0]) * np.linalg.norm(mixed.projection_[:, 0]))
    assert cosine > 0.9


def test_generalized_eigenproblem_solved_and_normalised():
    x, y, _, _ = _split(2)
    for supervised in (True, False):
        dica = DICA(n_components=4, n_features=80, supervised=supervised, lam=0.05).fit(x, y)
        w, gamma = dica.projection_, dica.eigenvalues_
        b = dica.domain_variance_ + 0.05 * np.eye(160)
        np.testing.assert_allclose(dica.numerator_ @ w, b @ w * gamma, atol=1e-8 * gamma.max())
        np.testing.assert_allclose(w.T @ b @ w, np.eye(4), atol=1e-8)
        # the leading eigenvalues of the whole problem
        all_values = eigh(dica.numerator_, b, eigvals_only=True)
        np.testing.assert_allclose(gamma, np.sort(all_values)[::-1][:4], rtol=1e-6)


def test_domain_variance_is_the_distributional_variance_of_the_projection():
    """tr(W^T V W) is V(S) of the projected training domains under a linear kernel: the primal
    form of Algorithm 1's tr(B^T K Q K B)."""
    x, y, _, _ = _split(3)
    dica = DICA(n_components=3, n_features=60).fit(x, y)
    projected = [dica.transform(d) for d in x]
    expected = np.trace(dica.projection_.T @ dica.domain_variance_ @ dica.projection_)
    assert distributional_variance(projected, kernel="linear", max_cells=10_000) == pytest.approx(expected, rel=1e-9)


def test_supervised_numerator_equals_the_kernel_form():
    """Sigma_XY (Sigma_YY + eps I)^-1 Sigma_YX = (1/n) Phi^T L (L + n eps I)^-1 Phi with
    centred features Phi and L = Y_c Y_c^T (one-hot labels, centred)."""
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(30, 3)), rng.normal(1, 1, size=(25, 3))]
    y = [rng.choice(["a", "b", "c"], 30), rng.choice(["a", "b", "c"], 25)]
    dica = DICA(n_features=20, epsilon=0.1, variance_weight=0.0).fit(x, y)
    phi = dica.features(np.vstack(x)) - dica.feature_mean_
    onehot = (np.concatenate(y)[:, None] == dica.classes_[None, :]).astype(float)
    onehot -= onehot.mean(axis=0)
    n = len(phi)
    gram = onehot @ onehot.T
    kernel_form = phi.T @ gram @ np.linalg.solve(gram + n * 0.1 * np.eye(n), phi) / n
    np.testing.assert_allclose(dica.numerator_, kernel_form, atol=1e-10)


def test_distributional_variance_exact_values():
    a = np.array([[0.0, 0.0], [2.0, 0.0]])  # mean (1, 0)
    b = np.array([[3.0, 2.0]])              # mean (3, 2)
    # N = 2: V = (1/4) ||m1 - m2||^2
    assert distributional_variance([a, b], kernel="linear") == pytest.approx(0.25 * 8)
    assert distributional_variance([a, a, a], kernel="linear") == pytest.approx(0.0, abs=1e-12)
    assert distributional_variance([a, a.copy()]) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="kernel"):
        distributional_variance([a, b], kernel="cubic")


def test_bad_input_is_named():
    x, y, _, _ = _split(0)
    with pytest.raises(ValueError, match="labels"):
        DICA().fit(x)
    with pytest.raises(ValueError, match="two domains"):
        DICA(supervised=False).fit(x[:1])
    with pytest.raises(ValueError, match="one label per cell"):
        DICA().fit(x, [yy[:-1] for yy in y])
    DICA(supervised=False, n_features=20).fit(x)  # UDICA needs no labels


def _kpca(x, bandwidth):
    return KernelPCA(2, kernel="rbf", gamma=1 / (2 * bandwidth ** 2)).fit(np.vstack(x))


@pytest.mark.parametrize("seed", [0, 1])
def test_training_domains_less_spread_than_kpca_and_identity(seed):
    x, y, _, _ = _split(seed)
    for supervised in (True, False):
        dica = DICA(n_components=2, n_features=200, supervised=supervised).fit(x, y)
        kpca = _kpca(x, dica.bandwidth_)
        ours = distributional_variance([dica.transform(d) for d in x])
        assert ours < distributional_variance([kpca.transform(d) for d in x])
        assert ours < distributional_variance(x)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_paper_toy_unseen_domains_less_spread_than_kpca(seed):
    """The paper's toy, small: 10 training domains, 5-D, Wishart covariances (plus a shared
    batch shift, without which no method reduces the spread of unseen domains, see the
    bench); the distributional variance of 10 UNSEEN domains is lower after DICA and UDICA
    than after KPCA, by at least a third."""
    x, y, unseen, _ = _split(seed)
    for supervised in (True, False):
        dica = DICA(n_components=2, n_features=200, supervised=supervised).fit(x, y)
        kpca = _kpca(x, dica.bandwidth_)
        ours = distributional_variance([dica.transform(d) for d in unseen])
        theirs = distributional_variance([kpca.transform(d) for d in unseen])
        assert ours < 0.67 * theirs, (supervised, ours, theirs)


def test_supervised_projection_keeps_the_labels():
    """Two DICA directions still carry y = sign(x1 + x2): a logistic regression on them gates
    unseen domains at >= 85%; UDICA's (no labels) does worse."""
    x, y, unseen, unseen_y = _split(4)
    scores = {}
    for supervised in (True, False):
        dica = DICA(n_components=2, n_features=200, supervised=supervised).fit(x, y)
        clf = LogisticRegression().fit(np.vstack([dica.transform(d) for d in x]), np.concatenate(y))
        scores[supervised] = np.mean(clf.predict(np.vstack([dica.transform(d) for d in unseen]))
                                     == np.concatenate(unseen_y))
    assert scores[True] >= 0.85, scores
    assert scores[True] > scores[False]


def test_dica_pooling_in_evaluation():
    from gating_core.evaluation import ALL_METHODS, leave_one_patient_out
    from gating_core.synthetic import simulate_cohort

    assert "dica-pooling" in ALL_METHODS
    cohort = simulate_cohort(3, seed=5, n_events=3000)
    table = leave_one_patient_out([c[0] for c in cohort], [c[1] for c in cohort], methods=["dica-pooling"])
    assert list(table["method"].unique()) == ["dica-pooling"] and len(table) == 3
    assert table["accuracy"].min() >= 0.85, table[["patient", "accuracy"]]
    assert table["novelty"].isna().all()


@pytest.mark.parametrize("supervised", [True, False])
def test_the_projection_does_not_depend_on_the_blas_thread_count(supervised):
    """Training sizes BLAS from the load average, so two fits of the same patients may run on
    one thread or two; they must give the same projection (LAPACK's generalised eigensolver
    moved it by 5e-15 between 1 and 2 threads)."""
    from gating_core import cpus

    if cpus.current_blas_threads() is None:
        pytest.skip("no BLAS loaded")
    domains, labels, _, _ = _split(0)
    projections = []
    for threads in (1, 2, 1):
        with cpus.blas_threads(threads):
            projections.append(DICA(n_components=4, supervised=supervised).fit(
                domains, labels if supervised else None).projection_)
    np.testing.assert_array_equal(projections[0], projections[1])
    np.testing.assert_array_equal(projections[0], projections[2])
