"""Domain-Invariant Component Analysis (DICA / UDICA), in random-feature form.

Muandet, Balduzzi, Schoelkopf, "Domain Generalization via Invariant Feature Representation",
ICML 2013, Algorithm 1. Given N domains (patients) of cells, DICA finds directions b in the
RKHS of a Gaussian kernel k that keep the label-relevant variation (supervised: the central
subspace term b^T Sigma_XY (Sigma_YY + eps I)^-1 Sigma_YX b, Algorithm 1's
C = L (L + n eps I)^-1 K^2; unsupervised UDICA: the total variance, C = K^2) while making the
patients' distributions of the projected cells alike: the denominator is the distributional
variance of the projected domains (Algorithm 1's K Q K) plus ||b||^2 (its K term).

Algorithm 1 works on the n x n Gram matrix of every cell of every patient, out of reach for
flow cytometry (10^5 - 10^6 cells). Here k(x, x') ~= <z(x), z(x')> with D random Fourier
features z (Rahimi and Recht 2007), every direction is b = W^T z(.) with W in R^{D x m}, and
each term of Algorithm 1 becomes a D x D matrix accumulated patient by patient:

- distributional variance: (1/N) sum_i (mu_i - mu_bar)(mu_i - mu_bar)^T, mu_i the mean
  feature vector of patient i (its kernel mean embedding), mu_bar their mean -- the primal
  form of tr(K Q K) with Q's blocks (N-1)/(N^2 n_i^2) and -1/(N^2 n_i n_j);
- supervised numerator: Sigma_XY (Sigma_YY + eps I)^-1 Sigma_YX with one-hot labels (a
  linear kernel on Y, so L (L + n eps I)^-1 reduces to a c x c inverse by the push-through
  identity); unsupervised: the features' covariance Sigma_XX;
- the generalized symmetric eigenproblem S W = (V + lam I) W Gamma in D x D, of which the m
  leading eigenvectors are kept.

With lam = 1 this is Algorithm 1's denominator K Q K + K (its extra lambda I is a ridge for
the n x n dual problem; the primal D x D problem is already positive definite). Smaller lam
weighs the distributional variance more against the norm of the directions.

Cost: one pass over the cells, O(n D^2) for the unsupervised covariance (O(n D c)
supervised) and O(D^3) for the eigenproblem; memory O(D^2) plus one patient's features.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh

from gating_core.cpus import one_blas_thread
from gating_core.method.features import MeanEmbedding, median_pairwise_distance


class DICA:
    """Domain-invariant projection of cells: ``fit(domains, labels)``, ``transform(cells)``.

    Parameters
    ----------
    n_components : int, default=10
        m, the number of invariant directions kept.
    supervised : bool, default=True
        DICA (labels needed) or UDICA (labels ignored).
    n_features : int, default=400
        D / 2 random frequencies; the cells' feature vectors have D = 2 * n_features entries.
    bandwidth : float or None, default=None
        sigma of the Gaussian kernel k on cells; None: the median distance between cells.
    lam : float, default=0.01
        Weight of ||b||^2 against the distributional variance in the denominator (1: the
        paper's K Q K + K). The default, lower, weighs invariance more: on the toy with a batch
        shift (``toy_domains(shift_sd=1)``, 10 seeds, 2 components) the unseen domains'
        distributional variance is 0.061 at lam=1, 0.051 at 0.1, 0.011 at 0.01 and 0.010 at
        0.001, against KPCA's 0.080.
    epsilon : float, default=1e-3
        eps of the conditional covariance operator (supervised only).
    variance_weight : float, default=0.01
        Supervised only: UDICA's numerator Sigma_XX added with this weight. With c classes the
        supervised term has rank c - 1 (one-hot labels under a linear kernel), so directions
        beyond the (c-1)-th would be arbitrary vectors of its null space; the small variance
        term ranks them like UDICA and leaves the first c - 1 nearly unchanged. 0: the paper's
        term alone.
    cells_per_domain : int or None, default=None
        Cap on the cells used from each domain (a seeded draw); None: all of them.
    random_state : int, default=0

    Attributes
    ----------
    bandwidth_ : float
    frequencies_ : ndarray (d, n_features)
    feature_mean_ : ndarray (D,), the mean feature vector of all training cells
    numerator_ : ndarray (D, D), S: Sigma_XY (Sigma_YY + eps I)^-1 Sigma_YX + variance_weight
        Sigma_XX, or Sigma_XX (UDICA)
    domain_variance_ : ndarray (D, D), V: the covariance of the domains' mean features
    projection_ : ndarray (D, m), W, columns normalised so that W^T (V + lam I) W = I
    eigenvalues_ : ndarray (m,), Gamma, decreasing
    classes_ : ndarray (c,) (supervised only)
    """

    def __init__(self, n_components=10, supervised=True, n_features=400, bandwidth=None, lam=0.01, epsilon=1e-3,
                 variance_weight=0.01, cells_per_domain=None, random_state=0):
        self.n_components = n_components
        self.supervised = supervised
        self.n_features = n_features
        self.bandwidth = bandwidth
        self.lam = lam
        self.epsilon = epsilon
        self.variance_weight = variance_weight
        self.cells_per_domain = cells_per_domain
        self.random_state = random_state

    # -- fitting --------------------------------------------------------------------------
    def fit(self, domains, labels=None):
        """Learn the projection from a list of N domains.

        Parameters
        ----------
        domains : list of ndarray (n_i, d), the cells of each training patient
        labels : list of ndarray (n_i,) or None; required when ``supervised``
        """
        domains, labels = self._checked(domains, labels)
        rng = np.random.default_rng(self.random_state)
        if self.cells_per_domain is not None:
            drawn = [self._draw(len(x), rng) for x in domains]
            domains = [x[i] for x, i in zip(domains, drawn)]
            labels = None if labels is None else [y[i] for y, i in zip(labels, drawn)]
        d = domains[0].shape[1]
        if self.bandwidth is not None:
            self.bandwidth_ = float(self.bandwidth)
        else:  # the median distance over a seeded draw of every domain (cells may come sorted by population)
            share = max(1, 2000 // len(domains))
            self.bandwidth_ = median_pairwise_distance(
                np.vstack([x[rng.choice(len(x), min(share, len(x)), replace=False)] for x in domains]),
                random_state=self.random_state)
        self.frequencies_ = MeanEmbedding(self.n_features, self.bandwidth_, d,
                                          random_state=self.random_state).frequencies_
        D = 2 * self.n_features
        if labels is not None:
            self.classes_ = np.unique(np.concatenate(labels))
        n = sum(len(x) for x in domains)
        total = np.zeros(D)
        second = np.zeros((D, D))
        cross = np.zeros((D, len(self.classes_))) if self.supervised else None
        counts = np.zeros(len(self.classes_)) if self.supervised else None
        domain_means = np.empty((len(domains), D))
        chunk = 20_000  # one chunk's features (chunk x D) in memory at a time
        for i, x in enumerate(domains):
            domain_sum = np.zeros(D)
            for start in range(0, len(x), chunk):
                z = self.features(x[start:start + chunk])
                domain_sum += z.sum(axis=0)
                if self.supervised:
                    onehot = (labels[i][start:start + chunk, None] == self.classes_[None, :]).astype(np.float64)
                    cross += z.T @ onehot
                    counts += onehot.sum(axis=0)
                second += z.T @ z
            total += domain_sum
            domain_means[i] = domain_sum / len(x)
        self.feature_mean_ = total / n
        self.numerator_ = numerator = self._numerator(second, cross, counts, n)
        centred_means = domain_means - domain_means.mean(axis=0)
        self.domain_variance_ = centred_means.T @ centred_means / len(domains)
        denominator = self.domain_variance_ + self.lam * np.eye(D)
        m = int(min(self.n_components, D))
        # One BLAS thread: LAPACK's result moves in the last bits with the thread count (which
        # follows the load average), and a refit must give the same projection.
        with one_blas_thread():
            values, vectors = eigh((numerator + numerator.T) / 2, denominator, subset_by_index=[D - m, D - 1])
        order = np.argsort(values)[::-1]
        vectors = vectors[:, order]
        # Eigenvectors are defined up to sign: make each one's largest entry positive, so that
        # refits give the same projection.
        signs = np.sign(vectors[np.abs(vectors).argmax(axis=0), np.arange(m)])
        self.projection_ = vectors * np.where(signs == 0, 1.0, signs)
        self.eigenvalues_ = values[order]
        return self

    def _numerator(self, second, cross, counts, n):
        mean = self.feature_mean_
        sigma_xx = second / n - np.outer(mean, mean)  # the features' covariance
        if not self.supervised:
            return sigma_xx
        proportions = counts / n
        sigma_xy = cross / n - np.outer(mean, proportions)
        sigma_yy = np.diag(proportions) - np.outer(proportions, proportions)
        inner = np.linalg.solve(sigma_yy + self.epsilon * np.eye(len(proportions)), sigma_xy.T)
        return sigma_xy @ inner + self.variance_weight * sigma_xx

    # -- using it -------------------------------------------------------------------------
    def features(self, cells: np.ndarray) -> np.ndarray:
        """Random Fourier features z(x) of cells (n, d): (n, D), <z(x), z(x')> ~= k(x, x')."""
        return fourier_features(cells, self.frequencies_)

    def transform(self, cells: np.ndarray, chunk_size: int = 50_000) -> np.ndarray:
        """Projected cells W^T (z(x) - mean): (n, m)."""
        cells = np.asarray(cells, dtype=np.float64)
        out = np.empty((len(cells), self.projection_.shape[1]))
        for start in range(0, len(cells), chunk_size):
            part = self.features(cells[start:start + chunk_size]) - self.feature_mean_
            out[start:start + chunk_size] = part @ self.projection_
        return out

    def fit_transform(self, domains, labels=None) -> list:
        """Fit, then the projected cells of each training domain: list of (n_i, m)."""
        self.fit(domains, labels)
        return [self.transform(x) for x in domains]

    # -- checks ---------------------------------------------------------------------------
    def _checked(self, domains, labels):
        domains = [np.asarray(x, dtype=np.float64) for x in domains]
        if len(domains) < 2:
            raise ValueError(f"DICA needs at least two domains, got {len(domains)}")
        dims = {x.shape[1] if x.ndim == 2 else -1 for x in domains}
        if len(dims) != 1 or -1 in dims:
            raise ValueError("every domain must be a 2-D array (cells, channels) with the same channels")
        if any(len(x) == 0 for x in domains):
            raise ValueError("every domain needs at least one cell")
        if not self.supervised:
            return domains, None
        if labels is None:
            raise ValueError("supervised DICA needs the labels of every domain (or supervised=False)")
        labels = [np.asarray(y).astype(str) for y in labels]
        if len(labels) != len(domains) or any(len(y) != len(x) for x, y in zip(domains, labels)):
            raise ValueError("labels must give one label per cell of every domain")
        return domains, labels

    def _draw(self, n, rng):
        return np.sort(rng.choice(n, self.cells_per_domain, replace=False)) if n > self.cells_per_domain \
            else np.arange(n)


def fourier_features(cells: np.ndarray, frequencies: np.ndarray) -> np.ndarray:
    """[cos(x W), sin(x W)] / sqrt(L) of cells (n, d) for frequencies W (d, L): (n, 2L). With
    W ~ N(0, I / sigma^2), <z(x), z(x')> ~= exp(-||x - x'||^2 / (2 sigma^2))."""
    angles = np.asarray(cells, dtype=np.float64) @ frequencies
    return np.hstack([np.cos(angles), np.sin(angles)]) / np.sqrt(frequencies.shape[1])


def distributional_variance(domains, kernel="gaussian", bandwidth=None, max_cells=500, random_state=0) -> float:
    """Distributional variance V(S) = (1/N) tr G - (1/N^2) sum G of N samples (Muandet et al.).

    ``domains``: list of (n_i, m) arrays. G_ij = <mu_i, mu_j> is the Gram matrix of their mean
    embeddings, computed exactly on at most ``max_cells`` seeded cells of each domain.
    ``kernel="linear"``: embeddings are the domains' means. ``"gaussian"``: the domains are
    first standardised together (every column to unit variance over the pooled cells, so the
    figure does not depend on the scale of a projection) and ``bandwidth`` defaults to the
    median distance between their cells.
    """
    rng = np.random.default_rng(random_state)
    domains = [np.asarray(x, dtype=np.float64) for x in domains]
    domains = [x[rng.choice(len(x), max_cells, replace=False)] if len(x) > max_cells else x for x in domains]
    if kernel == "linear":
        means = np.array([x.mean(axis=0) for x in domains])
        gram = means @ means.T
    elif kernel == "gaussian":
        pooled = np.vstack(domains)
        scale = pooled.std(axis=0)
        scale[scale == 0] = 1.0
        domains = [(x - pooled.mean(axis=0)) / scale for x in domains]
        sigma = bandwidth if bandwidth is not None else median_pairwise_distance(np.vstack(domains))
        gram = np.empty((len(domains), len(domains)))
        for i, a in enumerate(domains):
            for j in range(i, len(domains)):
                b = domains[j]
                d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
                gram[i, j] = gram[j, i] = np.exp(-np.maximum(d2, 0) / (2 * sigma ** 2)).mean()
    else:
        raise ValueError(f"kernel must be 'gaussian' or 'linear', got {kernel!r}")
    n = len(domains)
    return float(np.trace(gram) / n - gram.sum() / n ** 2)


def toy_domains(n_domains=10, n_dims=5, mean_cells=200, shift_sd=0.0, seed=0):
    """The paper's toy domains (section 5.1), as we read it: each domain's cells from a
    Gaussian whose covariance is drawn from a Wishart distribution W(0.2 I, 10), a
    Poisson(mean_cells) number of cells per domain, and the same labelling function in every
    domain, y = sign(x_1 + x_2 + noise) -- the conditional stays, the marginals move.

    ``shift_sd`` > 0 adds a batch effect: each domain's mean moves by N(0, shift_sd^2) along
    the last two channels (shared nuisance directions, as a center's offsets on a few
    channels). With ``shift_sd=0`` (zero-mean domains, the paper's) the domains differ in
    covariance only, in directions that do not repeat from one domain to the next.

    Returns a list of (cells (n_i, d), labels (n_i,) of "+1"/"-1")."""
    from scipy.stats import wishart

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_domains):
        cov = wishart(df=10, scale=0.2 * np.eye(n_dims)).rvs(random_state=rng)
        n = max(int(rng.poisson(mean_cells)), 10)
        mean = np.zeros(n_dims)
        mean[-2:] = shift_sd * rng.standard_normal(2)
        x = rng.multivariate_normal(mean, cov, size=n)
        y = np.where(x[:, 0] + x[:, 1] + 0.1 * rng.standard_normal(n) > 0, "+1", "-1")
        out.append((x, y))
    return out


# -- DICA inside a GatingModel (``GatingModel(dica="supervised")``) --------------------------------

#: What ``GatingModel(dica=...)`` accepts (besides None: no projection).
DICA_MODES = ("supervised", "unsupervised")
#: L, random frequencies of the projection inside a GatingModel (D = 2L features per cell), as
#: :class:`gating_core.evaluation.baselines.DICAPooling`: every gated event costs O(d L + L m).
MODEL_DICA_FEATURES = 300


def check_dica_settings(mode, n_components) -> None:
    """Raise ValueError naming the parameter when ``dica`` / ``dica_components`` are invalid."""
    if mode is not None and mode not in DICA_MODES:
        raise ValueError(f"dica must be None or one of {DICA_MODES}, got {mode!r}")
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) \
            or not 1 <= n_components <= 2 * MODEL_DICA_FEATURES:
        raise ValueError(f"dica_components must be an integer within [1, {2 * MODEL_DICA_FEATURES}], "
                         f"got {n_components!r}")


def fit_cell_projection(cells, labels, mode, n_components, random_state=0) -> DICA:
    """DICA (``mode`` "supervised") or UDICA ("unsupervised") fitted on training patients'
    standardised cells (list of (m_i, d), with their labels (m_i,)), its projection rescaled so
    every component has unit variance over those cells: the classifier's bandwidths and
    model selection work in standardised units, and the eigenvectors' scales differ by orders.
    ``transform`` then gives (n, n_components) cells, centred on the training cells' mean."""
    check_dica_settings(mode, n_components)
    dica = DICA(n_components=int(n_components), supervised=mode == "supervised", n_features=MODEL_DICA_FEATURES,
                random_state=random_state).fit(cells, labels if mode == "supervised" else None)
    spread = np.vstack([dica.transform(x) for x in cells]).std(axis=0)
    dica.projection_ = dica.projection_ / np.where(spread > 0, spread, 1.0)
    return dica


def cell_projection_from_arrays(frequencies, feature_mean, projection) -> DICA:
    """A fitted projection from the three arrays a model file stores (frequencies (d, L),
    feature mean (2L,), projection (2L, m)); raises ValueError when their shapes disagree."""
    frequencies, feature_mean, projection = (np.asarray(a, dtype=np.float64)
                                             for a in (frequencies, feature_mean, projection))
    if frequencies.ndim != 2 or feature_mean.shape != (2 * frequencies.shape[1],) \
            or projection.ndim != 2 or projection.shape[0] != feature_mean.shape[0] or projection.shape[1] < 1:
        raise ValueError(f"DICA arrays of shapes {frequencies.shape}, {feature_mean.shape}, {projection.shape} "
                         "do not fit together ((d, L), (2L,), (2L, m))")
    if not (np.isfinite(frequencies).all() and np.isfinite(feature_mean).all() and np.isfinite(projection).all()):
        raise ValueError("DICA arrays hold non-finite values")
    dica = DICA(n_components=projection.shape[1], n_features=frequencies.shape[1])
    dica.frequencies_, dica.feature_mean_, dica.projection_ = frequencies, feature_mean, projection
    return dica
