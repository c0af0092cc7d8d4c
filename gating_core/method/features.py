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

from gating_core.cpus import parallel_rows


def median_pairwise_distance(x: np.ndarray, max_points: int = 2000, random_state=0) -> float:
    """Median Euclidean distance between distinct rows of ``x`` (n, d), on a seeded subsample.

    Distances come from scipy's ``pdist`` (each from its differences: exact zeros for repeated
    rows, which are left out), 6x faster than the Gram-matrix form at 2,000 rows."""
    from scipy.spatial.distance import pdist

    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    if len(x) > max_points:
        x = x[rng.choice(len(x), max_points, replace=False)]
    distances = pdist(x)
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
        # Cosines and sines in float32, phases and sums in float64: numpy's float64 cos/sin run
        # scalar (about 0.06 G/s a thread here, against 1.3-1.8 G/s vectorised in float32),
        # which made the embeddings the largest cost of training on many patients. Psi moves by
        # about 1e-9 (entries of 1e-3 to 1e-1), far below what the kernels on it resolve. The
        # phases stay a float64 product: with a float32 one the streamed and in-memory gating
        # of the same file no longer agreed bit for bit (tests/test_stream.py).
        total = np.zeros(2 * self.n_features, dtype=np.float64)
        for start in range(0, len(x), chunk_size):
            proj = (np.asarray(x[start:start + chunk_size], dtype=np.float64) @ self.frequencies_).astype(np.float32)
            total[: self.n_features] += np.cos(proj).sum(axis=0, dtype=np.float64)
            total[self.n_features:] += np.sin(proj, out=proj).sum(axis=0, dtype=np.float64)
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


def content_subsample(x: np.ndarray, max_cells: int, parallel: bool = False) -> np.ndarray:
    """Indices of at most ``max_cells`` rows of ``x`` chosen by a hash of each row's values.

    Unlike a random draw, the choice depends only on the cells themselves, not on their order,
    so permuting a patient's cells embeds the same cells: its embedding changes by float64
    rounding of the sums at most, and its predictions by float32 rounding (a score's rounding
    may depend on the row's position in a BLAS product: 4.2e-7 at most in a probability on the
    sample data).
    ``parallel``: hash row blocks on the scoring pool's threads (:func:`content_hashes`).
    """
    n = len(x)
    if n <= max_cells:
        return np.arange(n)
    return np.sort(np.argpartition(content_hashes(x, parallel), max_cells - 1)[:max_cells])


def content_hashes(x: np.ndarray, parallel: bool = False) -> np.ndarray:
    """The hash of each row's float32 values that :func:`content_subsample` ranks: (n,) uint64.

    Each row's hash depends on that row alone, so it can be computed chunk by chunk, and with
    ``parallel`` on row blocks side by side (the same bits; for gating a file, where hashing
    every event costs several percent of the gating step, not from inside other pools)."""
    if parallel:

        hashes = np.empty(len(x), dtype=np.uint64)

        def run(bounds):
            hashes[bounds[0]:bounds[1]] = content_hashes(x[bounds[0]:bounds[1]])

        parallel_rows(run, len(x))
        return hashes
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


#: The cell kernels k_X (and k'_X of the embedding) a MarginalTransferClassifier can use.
KERNELS_X = ("gaussian", "linear")


class LinearMeanEmbedding:
    """The mean embedding of a sample under the LINEAR kernel k'_X(x, x') = <x, x'>.

    Its feature map is the identity, so Psi(P) = E_P[X]: the mean of the patient's
    (standardised) cells, a d-vector. The JMLR flow-cytometry experiment (Blanchard et al.,
    2021, section 8.5) uses linear k_X and k'_X with a Gaussian k_P; the text of that section
    could not be read here (only the paper's abstract was reachable), so the Gaussian k_P on
    Psi and its bandwidth (median heuristic, then cross-validation over groups) follow this
    module's Gaussian kernels, not a quoted setting.

    Parameters
    ----------
    n_dims : int
        d, the number of channels.
    """

    def __init__(self, n_dims: int):
        self.n_dims = int(n_dims)

    def transform(self, x: np.ndarray, chunk_size: int = 100_000) -> np.ndarray:
        """Psi of the empirical distribution of ``x`` (n, d): its mean, shape (d,), float64."""
        x = np.asarray(x)
        if len(x) == 0:
            raise ValueError("cannot embed an empty sample")
        total = np.zeros(x.shape[1], dtype=np.float64)
        for start in range(0, len(x), chunk_size):  # float64 sums: no drift over 10^6 cells
            total += np.asarray(x[start:start + chunk_size], dtype=np.float64).sum(axis=0)
        return total / len(x)


class LinearProductFeatures:
    """Features of k_P(Psi, Psi') * (<x, x'> + 1): Gaussian k_P on embeddings, linear k_X.

    phi(P, x) = z(Psi(P)) (x) [x, 1], the outer product of D_P random Fourier features of the
    Gaussian k_P, z(Psi) = sqrt(2 / D_P) cos(A^T Psi / sigma_P + b), with the cell vector and a
    constant; flattened, (D_P * (d + 1),). Then <phi(P, x), phi(P', x')> = <z, z'> (<x, x'> + 1)
    ~= k_P(Psi, Psi') (<x, x'> + 1). The constant lets each patient have its own intercept.
    Without the embedding (``embedding_dim=0``, pooling) D_P = 1 and z = 1: phi = [x, 1], a
    linear model.

    Same interface as :class:`ProductRFF`: :meth:`patient_phase` gives the per-patient part
    (here z(Psi)), :meth:`transform` the features of its cells. The decision function of one
    patient is linear in x, f(P, x) = [x, 1] M(P) with M(P) = sum_p z_p(Psi) W_p
    (:meth:`patient_coefficients`), so gating costs a d x k product per cell.

    Parameters
    ----------
    n_features : int
        Budget D for the output: D_P = max(1, D // (d + 1)) frequencies of k_P, so that the
        features (and the ridge statistics, D x D) stay the size a Gaussian model of the same
        ``n_features`` has.
    n_dims : int
        d, the number of channels.
    embedding_dim : int
        The size of Psi (d for :class:`LinearMeanEmbedding`); 0 switches the embedding off.
    bandwidth_p : float or None
        sigma_P (None: no embedding).
    random_state : int
    """

    def __init__(self, n_features: int, n_dims: int, embedding_dim: int, bandwidth_p: float | None, random_state=0):
        self.n_dims = int(n_dims)
        self.bandwidth_p = None if bandwidth_p is None else float(bandwidth_p)
        rng = np.random.default_rng(random_state)
        if embedding_dim and self.bandwidth_p is not None:
            self.n_embedding_features = max(1, int(n_features) // (self.n_dims + 1))
            self.embedding_weights_ = (rng.standard_normal((embedding_dim, self.n_embedding_features))
                                       / self.bandwidth_p)
            self.offsets_ = rng.uniform(0.0, 2.0 * np.pi, self.n_embedding_features)
        else:
            self.n_embedding_features = 1
            self.embedding_weights_ = None
            self.offsets_ = None
        self.n_features = self.n_embedding_features * (self.n_dims + 1)

    def patient_phase(self, embedding: np.ndarray | None) -> np.ndarray:
        """z(Psi), the per-patient factor of the features: shape (D_P,), float32 (``[1]``
        without the embedding)."""
        if self.embedding_weights_ is None:
            return np.ones(1, dtype=np.float32)
        if embedding is None:
            raise ValueError("this feature map needs the patient's embedding")
        z = np.cos(np.asarray(embedding, dtype=np.float64) @ self.embedding_weights_ + self.offsets_)
        return (z * np.sqrt(2.0 / self.n_embedding_features)).astype(np.float32)

    def transform(self, x: np.ndarray, phase: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Features of cells ``x`` (n, d) of one patient with factor ``phase`` (D_P,): (n, D) float32,
        column p * (d + 1) + j holding z_p [x, 1]_j."""
        x = np.asarray(x, dtype=np.float32)
        n, d = x.shape
        if d != self.n_dims:
            raise ValueError(f"expected cells with {self.n_dims} channels, got shape {x.shape}")
        if out is None:
            out = np.empty((n, self.n_features), dtype=np.float32)
        blocks = out.reshape(n, self.n_embedding_features, d + 1)
        z = np.asarray(phase, dtype=np.float32)[None, :, None]
        np.multiply(z, x[:, None, :], out=blocks[:, :, :d])
        blocks[:, :, d] = z[:, :, 0]
        return out

    def patient_coefficients(self, phase: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """M(P) of f(P, x) = [x, 1] M(P) for the model ``coef`` (D, k): shape (d + 1, k), float32."""
        k = coef.shape[1]
        per_frequency = np.asarray(coef, dtype=np.float64).reshape(self.n_embedding_features, self.n_dims + 1, k)
        return np.tensordot(np.asarray(phase, dtype=np.float64), per_frequency, axes=1).astype(np.float32)


class ExactLinearProductKernel:
    """The exact kernel k_P(Psi1, Psi2) (<x1, x2> + 1) that :class:`LinearProductFeatures`
    approximates, with Gaussian k_P (``bandwidth_p=None``: k_P = 1), for tests."""

    def __init__(self, bandwidth_p: float | None):
        self.bandwidth_p = None if bandwidth_p is None else float(bandwidth_p)

    def __call__(self, psi1: np.ndarray, x1: np.ndarray, psi2: np.ndarray, x2: np.ndarray) -> np.ndarray:
        """Gram matrix between rows (psi1 (n, m), x1 (n, d)) and (psi2 (k, m), x2 (k, d)): (n, k)."""
        gram = np.asarray(x1, dtype=np.float64) @ np.asarray(x2, dtype=np.float64).T + 1.0
        if self.bandwidth_p is not None:
            gram *= np.exp(-_squared_distances(psi1, psi2) / (2.0 * self.bandwidth_p ** 2))
        return gram
