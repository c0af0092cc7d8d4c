"""Feature maps of the marginal-transfer kernel: embeddings and random features.

The kernel on (patient distribution P, cell x) is the product
k((P1, x1), (P2, x2)) = k_P(Psi(P1), Psi(P2)) * k_X(x1, x2) with Gaussian k_P and k_X, and
Psi(P) the kernel mean embedding of P under a Gaussian kernel k'_X (Blanchard et al., JMLR 2021).

Two stages of random Fourier features (JMLR appendix A.6) make it linear:

1. ``MeanEmbedding``: z(x) = [cos(W^T x), sin(W^T x)] / sqrt(L) with W ~ N(0, I / sigma'^2), so
   <z(x), z(x')> ~= k'_X(x, x'); Psi(P) ~= mean_j z(X_j), a 2L vector.
2. ``ProductRFF``: phi(P, x) = sqrt(2 / D) cos(A^T Psi(P) / sigma_P + B^T x / sigma_X + b) with
   A, B ~ N(0, I), b ~ U[0, 2 pi). Then <phi(P, x), phi(P', x')> ~= k_P * k_X. The embedding
   term is one phase offset per patient, so featurising a cell costs a d x D product and a
   cosine, whatever the embedding size.

``ExactKernel`` computes the same product kernel exactly, for small problems and for tests
that the approximations converge.
"""

from __future__ import annotations

import numpy as np


def median_pairwise_distance(x: np.ndarray, max_points: int = 2000, random_state=0) -> float:
    """Median Euclidean distance between distinct rows of ``x`` (n, d), on a seeded subsample."""
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    if len(x) > max_points:
        x = x[rng.choice(len(x), max_points, replace=False)]
    sq = np.sum(x * x, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    iu = np.triu_indices(len(x), k=1)
    distances = np.sqrt(np.maximum(d2[iu], 0.0))
    positive = distances[distances > 0]
    return float(np.median(positive)) if len(positive) else 1.0


class MeanEmbedding:
    """Random-Fourier kernel mean embedding of a sample.

    Parameters
    ----------
    n_features : int
        L, the number of frequencies; the embedding has 2L entries.
    bandwidth : float
        sigma' of the Gaussian kernel k'_X.
    n_dims : int
        d, the number of channels.
    random_state : int
    """

    def __init__(self, n_features: int, bandwidth: float, n_dims: int, random_state=0):
        self.n_features = int(n_features)
        self.bandwidth = float(bandwidth)
        rng = np.random.default_rng(random_state)
        self.frequencies_ = (rng.standard_normal((n_dims, self.n_features)) / self.bandwidth).astype(np.float64)

    def transform(self, x: np.ndarray, chunk_size: int = 100_000) -> np.ndarray:
        """Psi of the empirical distribution of ``x`` (n, d): a vector of shape (2L,)."""
        x = np.asarray(x)
        if len(x) == 0:
            raise ValueError("cannot embed an empty sample")
        total = np.zeros(2 * self.n_features, dtype=np.float64)
        for start in range(0, len(x), chunk_size):
            proj = np.asarray(x[start:start + chunk_size], dtype=np.float64) @ self.frequencies_
            total[: self.n_features] += np.cos(proj).sum(axis=0)
            total[self.n_features:] += np.sin(proj).sum(axis=0)
        return total / (len(x) * np.sqrt(self.n_features))


class ProductRFF:
    """Random Fourier features of the product kernel k_P(Psi, Psi') * k_X(x, x').

    Parameters
    ----------
    n_features : int
        D, the number of output features.
    n_dims : int
        d, the number of channels.
    embedding_dim : int
        2L, the size of Psi; 0 switches the embedding off (k_P = 1: the pooling baseline).
    bandwidth_x, bandwidth_p : float
        sigma_X and sigma_P.
    random_state : int
    """

    def __init__(self, n_features: int, n_dims: int, embedding_dim: int, bandwidth_x: float,
                 bandwidth_p: float | None, random_state=0):
        self.n_features = int(n_features)
        self.bandwidth_x = float(bandwidth_x)
        self.bandwidth_p = None if bandwidth_p is None else float(bandwidth_p)
        rng = np.random.default_rng(random_state)
        self.cell_weights_ = (rng.standard_normal((n_dims, self.n_features)) / self.bandwidth_x).astype(np.float32)
        if embedding_dim and self.bandwidth_p is not None:
            self.embedding_weights_ = rng.standard_normal((embedding_dim, self.n_features)) / self.bandwidth_p
        else:
            self.embedding_weights_ = None
        self.offsets_ = rng.uniform(0.0, 2.0 * np.pi, self.n_features)
        self.scale_ = np.float32(np.sqrt(2.0 / self.n_features))

    def patient_phase(self, embedding: np.ndarray | None) -> np.ndarray:
        """The per-patient phase A^T Psi / sigma_P + b, shape (D,), float32."""
        phase = self.offsets_.copy()
        if self.embedding_weights_ is not None:
            if embedding is None:
                raise ValueError("this feature map needs the patient's embedding")
            phase += np.asarray(embedding, dtype=np.float64) @ self.embedding_weights_
        return phase.astype(np.float32)

    def transform(self, x: np.ndarray, phase: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Features of cells ``x`` (n, d) of one patient with phase (D,): array (n, D) float32."""
        x = np.asarray(x, dtype=np.float32)
        features = np.matmul(x, self.cell_weights_, out=out)
        features += phase
        np.cos(features, out=features)
        features *= self.scale_
        return features


class ExactKernel:
    """The exact product kernel on (embedding, cell) pairs, for small problems and tests.

    ``k((psi1, x1), (psi2, x2)) = exp(-|psi1 - psi2|^2 / (2 sigma_P^2)) * exp(-|x1 - x2|^2 / (2 sigma_X^2))``;
    ``bandwidth_p=None`` gives k_P = 1 (pooling).
    """

    def __init__(self, bandwidth_x: float, bandwidth_p: float | None):
        self.bandwidth_x = float(bandwidth_x)
        self.bandwidth_p = None if bandwidth_p is None else float(bandwidth_p)

    def __call__(self, psi1: np.ndarray, x1: np.ndarray, psi2: np.ndarray, x2: np.ndarray) -> np.ndarray:
        """Gram matrix between rows (psi1 (n, m), x1 (n, d)) and (psi2 (k, m), x2 (k, d)): (n, k)."""
        gram = np.exp(-_squared_distances(x1, x2) / (2.0 * self.bandwidth_x ** 2))
        if self.bandwidth_p is not None:
            gram *= np.exp(-_squared_distances(psi1, psi2) / (2.0 * self.bandwidth_p ** 2))
        return gram


def exact_embedding_inner(x1: np.ndarray, x2: np.ndarray, bandwidth: float) -> float:
    """<Psi(P1), Psi(P2)> exactly: the mean of k'_X over all pairs of cells."""
    return float(np.mean(np.exp(-_squared_distances(x1, x2) / (2.0 * bandwidth ** 2))))


def _squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    d2 = np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * (a @ b.T)
    return np.maximum(d2, 0.0)


def content_subsample(x: np.ndarray, max_cells: int) -> np.ndarray:
    """Indices of at most ``max_cells`` rows of ``x`` chosen by a hash of each row's values.

    Unlike a random draw, the choice depends only on the cells themselves, not on their order,
    so a patient's embedding (and thus every prediction) is invariant to permuting its cells.
    """
    n = len(x)
    if n <= max_cells:
        return np.arange(n)
    return np.sort(np.argpartition(content_hashes(x), max_cells - 1)[:max_cells])


def content_hashes(x: np.ndarray) -> np.ndarray:
    """The hash of each row's float32 values that :func:`content_subsample` ranks: (n,) uint64.

    Each row's hash depends on that row alone, so it can be computed chunk by chunk."""
    n = len(x)
    # Widen one column at a time: a whole (n, d) uint64 copy would cost twice the event array.
    rows = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    golden = np.uint64(0x9E3779B97F4A7C15)
    h = np.full(n, golden, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows.shape[1]):
            h ^= rows[:, j].astype(np.uint64) + golden + (h << np.uint64(6)) + (h >> np.uint64(2))
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h
