"""The squared loss in closed form: per-patient ridge statistics, and the multitask solve.

- :class:`RidgeStatistics`: the squared loss's per-patient sufficient statistics, so that a
  fit on any subset of patients, for any penalty, is a sum and one eigendecomposition
  (model selection, calibration and the held-out check all lean on that);
- :func:`multitask_ridge_solve`: the squared loss with the multitask kernel k_P = tau off the
  diagonal (each training patient a task), from the same statistics.

The iterative losses' solves are in :mod:`gating_core.method.solvers`.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh

from gating_core.cpus import one_blas_thread

#: Eigendecompositions up to this width run on one BLAS thread (see RidgeStatistics.eigen).
SINGLE_THREAD_EIGEN = 512
#: A ridge fit at one penalty factorises (Cholesky) when the penalty is at least this times the
#: centred Gram's mean diagonal, else it decomposes (see RidgeStatistics.fit). Float32 Grams
#: carry rounding of about 1e-7 of their scale: 1e-3 leaves it four orders below the penalty.
CHOLESKY_MIN_PENALTY = 1e-3


class RidgeStatistics:
    """Per-patient sufficient statistics of the weighted ridge problem on features F_i.

    For patient i with features F_i (n_i, D) and one-hot targets Y_i (n_i, k), holds
    G_i = F_i^T F_i / n_i, s_i = mean(F_i), B_i = F_i^T Y_i / n_i, t_i = mean(Y_i), so that the
    solution for any subset of patients and any lambda follows without touching cells again.
    """

    def __init__(self, n_features: int, n_classes: int):
        self.gram, self.cross = PerRowMatrices(), PerRowMatrices()
        self.feature_mean, self.target_mean = [], []
        self.n_features, self.n_classes = n_features, n_classes

    def add_patient(self, feature_chunks, target_chunks) -> int:
        """Accumulate one patient from iterables of (m, D) features and (m, k) targets."""
        g = np.zeros((self.n_features, self.n_features))
        b = np.zeros((self.n_features, self.n_classes))
        s = np.zeros(self.n_features)
        t = np.zeros(self.n_classes)
        n = chunks = 0
        for f, y in zip(feature_chunks, target_chunks):
            g_chunk, b_chunk = f.T @ f, f.T @ y
            g += g_chunk.astype(np.float64)
            b += b_chunk.astype(np.float64)
            s += f.sum(axis=0, dtype=np.float64)
            t += y.sum(axis=0, dtype=np.float64)
            n += len(f)
            chunks += 1
        if chunks == 1 and g_chunk.dtype == np.float32 and b_chunk.dtype == np.float32:
            # One float32 product: kept as it is (half the memory: 1 MB a row at D = 512, 1 GB
            # for 200 patients x 5 copies) and divided on reading, which gives the same float64
            # values as dividing now (0 + x is x exactly).
            self.gram.append((g_chunk, n))
            self.cross.append((b_chunk, n))
        else:
            self.gram.append(g / n)
            self.cross.append(b / n)
        self.feature_mean.append(s / n)
        self.target_mean.append(t / n)
        return len(self.gram) - 1

    @classmethod
    def concatenate(cls, parts) -> "RidgeStatistics":
        """One RidgeStatistics holding the rows of ``parts`` in order (all of one D and k)."""
        out = cls(parts[0].n_features, parts[0].n_classes)
        for part in parts:
            for r in range(len(part.feature_mean)):
                out.gram.append(part.gram._entries[r])
                out.cross.append(part.cross._entries[r])
                out.feature_mean.append(part.feature_mean[r])
                out.target_mean.append(part.target_mean[r])
        return out

    def eigen(self, patients, weights=None):
        """Eigendecomposition of the centred Gram matrix of ``patients``, for :meth:`solve` at
        any penalty.

        ``weights`` (one per patient index, any scale) weigh the patients; default: equal.
        """
        return self._decomposed(*self._centred(patients, weights))

    @staticmethod
    def _decomposed(g_c, b_c, mu, t):
        if len(g_c) <= SINGLE_THREAD_EIGEN:
            # A few-hundred-wide eigendecomposition gains nothing from threads, and beside other
            # CPU-bound work their waiting made it 12x slower (0.35 s against 0.03 s at 256).
            with one_blas_thread():
                values, vectors = eigh(g_c, driver="evd")
        else:
            values, vectors = eigh(g_c, driver="evd")
        return np.maximum(values, 0.0), vectors, vectors.T @ b_c, mu, t

    def fit(self, patients, alpha: float, weights=None):
        """Coefficients (D, k) and intercept (k,) of the ridge fit on ``patients`` at one penalty
        ``alpha``: :meth:`solve` of :meth:`eigen`, by a Cholesky factorisation where ``alpha``
        dominates the Gram matrix's rounding (15x faster than the eigendecomposition at
        D = 513: 1.5 ms against 22 ms; a fit and its calibration's five folds are six of them;
        the same solution to 1e-10).

        The Gram matrices are float32 sums, so the centred Gram's smallest eigenvalues are
        rounding, some of them negative; :meth:`eigen` clips those at zero. Below
        ``CHOLESKY_MIN_PENALTY`` times the mean diagonal the penalty would not hide them (the
        factorisation fails, or answers along those directions differently): eigen then."""
        from scipy.linalg import LinAlgError, cho_factor, cho_solve

        g_c, b_c, mu, t = self._centred(patients, weights)
        diagonal = np.diag_indices_from(g_c)
        if alpha >= CHOLESKY_MIN_PENALTY * max(float(np.mean(g_c[diagonal])), 0.0) and alpha > 0:
            g_c[diagonal] += alpha
            try:
                with one_blas_thread():
                    coef = cho_solve(cho_factor(g_c, lower=True, check_finite=False), b_c, check_finite=False)
                return coef, t - mu @ coef
            except LinAlgError:
                g_c[diagonal] -= alpha
        return self.solve(self._decomposed(g_c, b_c, mu, t), alpha)

    def _centred(self, patients, weights=None):
        """The centred Gram (D, D) and cross (D, k) statistics of ``patients``, and the means of
        their features (D,) and targets (k,)."""
        patients = list(patients)
        if weights is None and 2 * len(patients) > len(self.gram) and len(set(patients)) == len(patients):
            # Equal weights over most patients: the totals minus the few left out (a fold).
            left_out = sorted(set(range(len(self.gram))) - set(patients))
            total = self._totals()
            n = len(patients)
            g, mu, b, t = ((whole - sum((parts[i] for i in left_out), np.zeros_like(whole))) / n
                           for whole, parts in zip(total, (self.gram, self.feature_mean, self.cross,
                                                           self.target_mean)))
        else:
            w = np.ones(len(patients)) if weights is None else np.asarray(weights, dtype=np.float64)[patients]
            w = w / w.sum()
            g = sum(wi * self.gram[i] for wi, i in zip(w, patients))
            mu = sum(wi * self.feature_mean[i] for wi, i in zip(w, patients))
            b = sum(wi * self.cross[i] for wi, i in zip(w, patients))
            t = sum(wi * self.target_mean[i] for wi, i in zip(w, patients))
        return g - np.outer(mu, mu), b - np.outer(mu, t), mu, t

    def _totals(self):
        """Sums over every patient of the four statistics, kept until a patient is added."""
        if getattr(self, "_total_count", None) != len(self.gram):
            # Accumulated one patient at a time: stacking them would cost N copies at once.
            totals = []
            for parts in (self.gram, self.feature_mean, self.cross, self.target_mean):
                total = parts[0].copy()
                for i in range(1, len(parts)):
                    total += parts[i]
                totals.append(total)
            self._total = tuple(totals)
            self._total_count = len(self.gram)
        return self._total

    def subset(self, rows, class_columns=None):
        """Statistics of ``rows`` only (a new object sharing the per-row arrays); with
        ``class_columns``, of those target columns only (the classes a subset still holds)."""
        rows = [int(r) for r in rows]
        out = RidgeStatistics(self.n_features, self.n_classes if class_columns is None else len(class_columns))
        out.gram = self.gram.take(rows)
        out.feature_mean = [self.feature_mean[r] for r in rows]
        out.cross = self.cross.take(rows, class_columns)
        out.target_mean = [self.target_mean[r] if class_columns is None else self.target_mean[r][class_columns]
                           for r in rows]
        return out

    @staticmethod
    def solve(eigen, alpha: float):
        """Coefficients (D, k) and intercept (k,) for ridge penalty ``alpha`` from ``eigen``."""
        values, vectors, projected, mu, t = eigen
        coef = vectors @ (projected / (values + alpha)[:, None])
        return coef, t - mu @ coef


class PerRowMatrices:
    """A list of per-row matrices of :class:`RidgeStatistics`: each entry a float64 array, or a
    (float32 sum, count) pair read as ``sum.astype(float64) / count``.

    Reading an entry gives a float64 array (a new one for a pair); :meth:`take` selects rows
    (and columns) without reading them.
    """

    def __init__(self, entries=()):
        self._entries = list(entries)

    def append(self, entry) -> None:
        self._entries.append(entry)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i):
        entry = self._entries[i]
        if isinstance(entry, tuple):
            raw, n = entry
            return raw.astype(np.float64) / n
        return entry

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def take(self, rows, columns=None) -> "PerRowMatrices":
        """Entries ``rows`` (shared, not copied); with ``columns``, those columns of each."""
        if columns is None:
            return PerRowMatrices(self._entries[r] for r in rows)
        out = PerRowMatrices()
        for r in rows:
            entry = self._entries[r]
            out.append((entry[0][:, columns], entry[1]) if isinstance(entry, tuple) else entry[:, columns])
        return out



def multitask_ridge_solve(stats: RidgeStatistics, rows, weights, alpha: float, tau: float):
    """Squared loss with the multitask kernel k_P(i, j) = tau + (1 - tau) [i == j]; the shared part.

    Each training row of ``stats`` is a task. With features [phi(x), 1] (the constant carries the
    intercepts), the kernel is that of the feature map [sqrt(tau) phi, sqrt(1 - tau) phi (x) e_i]:
    f_i(x) = sqrt(tau) <w, phi(x)> + sqrt(1 - tau) <v_i, phi(x)>, penalty alpha (||w||^2 +
    sum_i ||v_i||^2), loss sum_i a_i mean_j ||f_i(x_ij) - y_ij||^2 (a_i = ``weights``, normalised).
    Eliminating each v_i (per-task ridge) leaves a D x D system for the shared w:

        (I + tau sum_i a_i M_i G_i) w = sqrt(tau) sum_i a_i M_i C_i,   M_i = ((1 - tau) a_i G_i + alpha I)^-1

    with G_i, C_i the task's uncentred Gram and cross statistics. A NEW patient has no task of
    its own (no e_T: its kernel with every training task is tau): its decision function is the
    shared part, sqrt(tau) <w, [phi(x), 1]>, returned as (coef (D, k), intercept (k,)).
    tau = 1 is pooling (one task); tau -> 0 leaves the shared part nothing to learn.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"task similarity tau must be within (0, 1], got {tau!r}")
    rows = list(rows)
    a = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)[rows]
    a = a / a.sum()
    dim = stats.n_features + 1
    lhs = np.eye(dim)
    rhs = np.zeros((dim, stats.n_classes))
    for ai, r in zip(a, rows):
        gram = np.empty((dim, dim))
        gram[:-1, :-1], gram[:-1, -1], gram[-1, :-1], gram[-1, -1] = (stats.gram[r], stats.feature_mean[r],
                                                                      stats.feature_mean[r], 1.0)
        cross = np.vstack([stats.cross[r], stats.target_mean[r][None, :]])
        values, vectors = eigh(gram, driver="evd")
        values = np.maximum(values, 0.0)
        shrink = 1.0 / ((1.0 - tau) * ai * values + alpha)  # M_i in G_i's eigenbasis
        lhs += tau * ai * (vectors * (shrink * values)) @ vectors.T
        rhs += np.sqrt(tau) * ai * (vectors * shrink) @ (vectors.T @ cross)
    shared = np.linalg.solve(lhs, rhs) * np.sqrt(tau)
    return shared[:-1], shared[-1]
