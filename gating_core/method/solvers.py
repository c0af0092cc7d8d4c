"""The solvers of the marginal-transfer objective on random features, and the calibration.

- :class:`RidgeStatistics`: the squared loss's per-patient sufficient statistics, so that a
  fit on any subset of patients, for any penalty, is a sum and one eigendecomposition
  (model selection, calibration and the held-out check all lean on that);
- :func:`fit_weighted_logistic`: the multinomial logistic loss with patient weights (L-BFGS);
- :func:`fit_weighted_hinge`: the cost-sensitive linear SVM (one-vs-rest hinge) with patient
  weights, the loss of the NIPS 2011 / JMLR 2021 experiments (L-BFGS on a Huber-smoothed hinge);
- :func:`multitask_ridge_solve`: the squared loss with the multitask kernel k_P = tau off the
  diagonal (each training patient a task), from the same statistics;
- :func:`fit_temperature`: the softmax temperature that makes ridge scores probabilities.
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


def stacked_rows(features) -> np.ndarray:
    """All rows' features as one (sum n_i, D) float32 array: the ``stacked`` store of a
    :class:`~gating_core.method.training_problem.RowFeatures` as it is (no copy), else the list stacked."""
    stacked = getattr(features, "stacked", None)
    if stacked is not None and stacked.dtype == np.float32:
        return stacked
    return np.vstack(list(features)).astype(np.float32)


#: L-BFGS stops when no entry of the gradient exceeds this (scipy's ``gtol``), unless the float32
#: objective's rounding stops it first (see :func:`_minimise_linear`).
LBFGS_GTOL = 1e-6
#: Correction pairs L-BFGS keeps (scipy's ``maxcor``, 10 by default). Its own work per pair is a
#: few vector products of D k + k entries, nothing beside one evaluation over the rows, and a
#: longer memory models the loss's curvature better on most of our problems. Companion fits,
#: iterations with 10 -> 30 pairs: multicenter 84 -> 61, two simulated cohorts 71 -> 59 and
#: 61 -> 44, the multicenter check's eleven fits 418 -> 281 (accuracies the same to 1e-4); but
#: the sample data 29 -> 31 and a 200-patient library 44 -> 51 (docs/scaling.md, "L-BFGS memory").
LBFGS_MEMORY = 30


def fit_weighted_logistic(features, targets, patient_weights, n_classes, alpha, warm=None, max_iter=300,
                          gtol=LBFGS_GTOL, curvature=None):
    """Multinomial logistic regression with patient weights and an L2 penalty.

    Minimises sum_i w_i mean_j CE(softmax(F_ij W + b), Y_ij) + alpha ||W||^2 (b unpenalised)
    by L-BFGS. ``features``: list of (n_i, D) float32 (or a stored RowFeatures); ``targets``:
    list of (n_i,) class indices; ``patient_weights``: (N,) summing to 1. Returns W (D, k) and b (k,).

    ``curvature``: the loss's curvature blocks near the solution, (k, D + 1, D + 1) as
    :func:`logistic_curvature` gives them, to precondition the iterations (the held-out check's
    folds, each started from the fit on all patients: :func:`_minimise_linear`). It changes
    the path, not the stopping rule.
    """
    f = stacked_rows(features)
    t = np.concatenate(targets)
    cell_w = _cell_weights(features, patient_weights)
    k = n_classes

    def block(rows, w, b):
        x = f[rows]
        z = x @ w
        z += b
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        picked = np.arange(len(z)), t[rows]
        value = -float(cell_w[rows] @ np.log(z[picked] + 1e-30))
        z[picked] -= 1.0
        z *= cell_w[rows, None]  # the residual (p - onehot) * cell weight
        # (R^T X)^T rather than X^T R: the same sums, and BLAS runs the (k, n) x (n, D) form
        # about a quarter faster for k of a few classes.
        return value, (z.T @ x).T, z.sum(axis=0, dtype=np.float64)

    return _minimise_linear(_RowBlocks(block, f, cell_w, alpha, k), warm, max_iter, gtol, curvature)


#: Cells whose p (1 - p) for a class is at most this are left out of that class's curvature
#: block (:func:`logistic_curvature`). It is only a preconditioner, so this moves no solution:
#: on the multicenter companion those cells are 30-80% of the cells and carry 1-6% of each
#: block's weight; leaving them out halves the cost and the folds' iterations are the same.
CURVATURE_MIN_SPREAD = 1e-3


def logistic_curvature(features, patient_weights, coef, intercept, workers: int = 1) -> np.ndarray:
    """The block-diagonal part of the weighted multinomial loss's Hessian at (W, b).

    For each class c: sum_i w_i / n_i sum_j p_ijc (1 - p_ijc) [x_ij, 1] [x_ij, 1]^T, with p the
    model's probabilities, over the cells where p_ijc (1 - p_ijc) exceeds
    :data:`CURVATURE_MIN_SPREAD`; the penalty is not included. ``features``: list of (n_i, D)
    float32 (or a stored RowFeatures), one per row; ``patient_weights``: (N,), the weight of
    each row (with 1 for every row, a fold's curvature is the total minus its held-out rows',
    divided by the rows it keeps). Returns (k, D + 1, D + 1) float64.

    Each row's blocks are computed on one BLAS thread (``workers`` rows side by side) and added
    in row order: the same bits on any number of threads.
    """
    from gating_core.cpus import run_side_by_side

    coef32, intercept32 = np.asarray(coef, dtype=np.float32), np.asarray(intercept, dtype=np.float32)
    d, k = coef32.shape
    if len(features) == 0:
        return np.zeros((k, d + 1, d + 1))
    blocks = run_side_by_side(lambda i: _row_curvature(features[i], coef32, intercept32, float(patient_weights[i])),
                              range(len(features)), workers)
    total = np.zeros_like(blocks[0])
    for block in blocks:
        total += block
    return total


def _row_curvature(x, coef, intercept, weight: float) -> np.ndarray:
    """One row's curvature blocks, (k, D + 1, D + 1) float64."""
    d, k = coef.shape
    out = np.zeros((k, d + 1, d + 1))
    scale = weight / max(len(x), 1)
    for lo in range(0, len(x), 4 * SOLVER_BLOCK_ROWS):
        chunk = np.asarray(x[lo:lo + 4 * SOLVER_BLOCK_ROWS], dtype=np.float32)
        p = chunk @ coef
        p += intercept
        p -= p.max(axis=1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(axis=1, keepdims=True)
        spread = p * (1.0 - p)
        for c in range(k):
            keep = np.flatnonzero(spread[:, c] > CURVATURE_MIN_SPREAD)
            design = np.empty((len(keep), d + 1), dtype=np.float32)
            design[:, :d] = chunk[keep]
            design[:, d] = 1.0
            design *= np.sqrt(spread[keep, c] * scale).astype(np.float32)[:, None]
            out[c] += design.T @ design
    return out


#: Width h of the Huber-smoothed hinge (Chapelle, Neural Computation 2007): the hinge
#: max(0, 1 - m) with its kink replaced by a parabola on |1 - m| < h, so that L-BFGS applies.
HINGE_SMOOTHING = 0.05


def fit_weighted_hinge(features, targets, patient_weights, n_classes, alpha, warm=None, max_iter=300,
                       smoothing=HINGE_SMOOTHING, gtol=LBFGS_GTOL):
    """Cost-sensitive linear SVM, one-vs-rest, with patient weights and an L2 penalty.

    Minimises sum_i w_i mean_j sum_c hinge(y_ijc s_ijc) + alpha ||W||^2 with s = F W + b
    (b unpenalised) and y_ijc = +1 for the cell's class, -1 for the others: with w_i = 1/N,
    the marginal-transfer objective (1/N) sum_i (1/n_i) sum_j loss + lambda ||f||^2 with the
    hinge loss, i.e. an SVM whose cell costs are c_ij = 1/(lambda N n_i). The hinge is
    Huber-smoothed over ``smoothing`` (see HINGE_SMOOTHING). Arguments as in
    :func:`fit_weighted_logistic`; returns W (D, k) and b (k,).
    """
    f = stacked_rows(features)
    t = np.concatenate(targets)
    cell_w = _cell_weights(features, patient_weights)
    k = n_classes
    h = float(smoothing)

    def block(rows, w, b):
        sign = np.full((len(t[rows]), k), -1.0, dtype=np.float32)
        sign[np.arange(len(sign)), t[rows]] = 1.0
        gap = 1.0 - sign * (f[rows] @ w + b)  # > 0: inside the margin
        linear = gap > h
        band = np.abs(gap) <= h
        loss = np.where(linear, gap, np.where(band, (gap + h) ** 2 / (4 * h), 0.0))
        d_margin = np.where(linear, -1.0, np.where(band, -(gap + h) / (2 * h), 0.0)).astype(np.float32)
        value = float(cell_w[rows] @ loss.sum(axis=1, dtype=np.float64))
        residual = d_margin * sign * cell_w[rows, None]
        return value, f[rows].T @ residual, residual.sum(axis=0, dtype=np.float64)

    return _minimise_linear(_RowBlocks(block, f, cell_w, alpha, k), warm, max_iter, gtol)


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


def fit_temperature(scores, targets) -> float:
    """The t > 0 minimising the patient-weighted log-loss of softmax(t * scores).

    ``scores``: list of (n_i, k) arrays, ``targets``: list of (n_i,) class indices.
    """
    from scipy.optimize import minimize_scalar

    def loss(log_t):
        total = 0.0
        for s, y in zip(scores, targets):
            z = np.exp(log_t) * s.astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            log_p = z[np.arange(len(y)), y] - np.log(np.exp(z).sum(axis=1))
            total -= log_p.mean()
        return total / len(scores)

    result = minimize_scalar(loss, bounds=(np.log(0.1), np.log(1000.0)), method="bounded")
    return float(np.exp(result.x))


def _cell_weights(features, patient_weights) -> np.ndarray:
    """Each cell's weight, w_i / n_i for the cells of patient i: (sum n_i,) float32."""
    return np.concatenate([np.full(len(x), w / len(x)) for x, w in zip(features, patient_weights)]).astype(np.float32)


#: Rows in each block of an iterative solver's objective. Fixed, whatever the CPUs: the blocks'
#: partial sums are added in block order, so the fitted model does not depend on the thread
#: count (with BLAS threading the whole product, a hinge or logistic fit moved by 2e-4 between
#: one and two threads). A block of 2,048 rows x 512 float32 features (4 MB) is still in cache
#: when its gradient product reads it again: 40 L-BFGS iterations on 30,000 x 512 took 0.63 s
#: in blocks of 2,048 rows against 1.0 s in blocks of 8,192 (1,024: 0.70 s).
SOLVER_BLOCK_ROWS = 2048


class _RowBlocks:
    """The objective of a linear model on row blocks: ``block(rows, W, b)`` returns the rows'
    loss, their gradient for W (D, k) and for b (k,); the penalty alpha ||W||^2 is added here.

    Blocks run on the threads BLAS was allowed when the objective was built (one inside a pool
    of our own threads), each block on one BLAS thread, and their sums are added in block
    order: the value and gradient are the same on any number of threads.

    L-BFGS runs on centred coordinates: theta = (W, c) with the intercept b = c - m W, m the
    cell-weighted mean of the features (the penalty leaves b free, so the minimiser is the same
    model). Random Fourier features are far from centred, which couples the intercept to every
    coefficient; centring took the multicenter companion's cold fit from 103 iterations to 84."""

    def __init__(self, block, features, cell_weights, alpha: float, k: int):
        from gating_core.cpus import allowed_workers

        n_rows, self.dim = features.shape
        self.block, self.alpha, self.k = block, float(alpha), k
        self.slices = [slice(start, min(start + SOLVER_BLOCK_ROWS, n_rows))
                       for start in range(0, n_rows, SOLVER_BLOCK_ROWS)]
        self.workers = allowed_workers(len(self.slices))
        with one_blas_thread():
            total = np.zeros(self.dim)
            for rows in self.slices:
                total += cell_weights[rows] @ features[rows]
        self.centre = total / max(float(cell_weights.sum(dtype=np.float64)), 1e-300)

    def centred(self, coef, intercept) -> np.ndarray:
        """theta for L-BFGS from a model's W (D, k) and b (k,)."""
        coef = np.asarray(coef, dtype=np.float64)
        return np.concatenate([coef.ravel(), np.asarray(intercept, dtype=np.float64) + self.centre @ coef])

    def model(self, theta):
        """W (D, k) and b (k,) of L-BFGS's theta."""
        coef = theta[: self.dim * self.k].reshape(self.dim, self.k)
        return coef, theta[self.dim * self.k:] - self.centre @ coef

    def __call__(self, theta, pool=None):
        w64, b64 = self.model(theta)
        w, b = w64.astype(np.float32), b64.astype(np.float32)
        parts = (pool.map(lambda rows: self.block(rows, w, b), self.slices) if pool is not None
                 else [self.block(rows, w, b) for rows in self.slices])
        value = self.alpha * float((w.astype(np.float64) ** 2).sum())
        grad_w, grad_b = 2 * self.alpha * w.astype(np.float64), np.zeros(self.k)
        for part_value, part_w, part_b in parts:
            value += part_value
            grad_w += part_w
            grad_b += part_b
        grad_w -= np.outer(self.centre, grad_b)  # d/dW at fixed c: b moves with W
        return value, np.concatenate([grad_w.ravel(), grad_b])


def _minimise_linear(objective: _RowBlocks, warm, max_iter: int, gtol: float, curvature=None):
    """L-BFGS on ``objective``'s coordinates (:class:`_RowBlocks`), from zero or from the model
    ``warm`` = (W (D, k), b (k,)); it stops when no gradient entry exceeds ``gtol``, or before
    when an iteration no longer lowers the objective beyond its float32 rounding (L-BFGS-B's
    relative-reduction test), which can leave entries a few times gtol (2.8e-5 seen at
    gtol = 1e-5, with the Haswell and SkylakeX kernels alike). Returns W and b.

    With ``curvature`` (:func:`logistic_curvature` near the solution) and a warm start, the
    iterations run on preconditioned coordinates (:class:`_Preconditioned`); the stopping rule
    is the same, on the objective's own gradient."""
    dim, k = objective.dim, objective.k
    theta0 = objective.centred(np.zeros((dim, k)) if warm is None else warm[0],
                               np.zeros(k) if warm is None else warm[1])
    options = {"maxiter": max_iter, "gtol": gtol, "maxcor": LBFGS_MEMORY}
    curvature = curvature if warm is not None else None  # a preconditioner for a start near the solution
    with one_blas_thread():  # L-BFGS's own vector products too: the same bits on any machine load
        if objective.workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            # One pool for the whole solve, not run_side_by_side's pool per evaluation: that
            # cost 15-20% of a 40-iteration fit on 30,000 x 512 (0.43 s against 0.36 s).
            with ThreadPoolExecutor(objective.workers) as pool:
                theta = _run_lbfgs(lambda theta: objective(theta, pool), theta0, options, objective, curvature)
        else:
            theta = _run_lbfgs(objective, theta0, options, objective, curvature)
    return objective.model(theta)


def _run_lbfgs(function, theta0, options, objective, curvature):
    """scipy's L-BFGS-B on ``function`` (``objective``'s value and gradient) from theta0;
    preconditioned when there is a curvature (:class:`_Preconditioned`). Returns theta."""
    from scipy.optimize import minimize

    preconditioned = _Preconditioned.build(function, theta0, objective, curvature, options["gtol"])
    if preconditioned is None:
        return minimize(function, theta0, jac=True, method="L-BFGS-B", options=options).x
    try:
        start = preconditioned.scale_to_newton()
        # Its own gtol is on the preconditioned gradient: the objective's is checked instead.
        result = minimize(preconditioned, start, jac=True, method="L-BFGS-B", options={**options, "gtol": 0.0})
    except _Converged as done:
        return done.theta
    return preconditioned.theta(result.x)


def _centred_block(block, m) -> np.ndarray:
    """A curvature block in [x, 1] coordinates moved to the centred [x - m, 1]: U^T C U with
    U = [[I, 0], [-m, 1]], written out (C = [[A, b], [b^T, s]]) in O(D^2) rather than two
    (D + 1)^3 products."""
    a, b, s = block[:-1, :-1], block[:-1, -1], block[-1, -1]
    out = np.empty_like(block)
    out[:-1, :-1] = a - np.outer(b, m) - np.outer(m, b) + s * np.outer(m, m)
    out[:-1, -1] = out[-1, :-1] = b - s * m
    out[-1, -1] = s
    return out


class _Converged(Exception):
    def __init__(self, theta):
        super().__init__("converged")
        self.theta = theta


class _Preconditioned:
    """The objective on coordinates u with theta = theta0 + C P u, P = blockdiag(L_c^-T), where
    L_c L_c^T is class c's curvature block (the penalty added) in the centred coordinates
    (W[:, c], c_c) of :class:`_RowBlocks`, and C removes the mean over classes.

    A fold of the held-out check differs from the fit on all patients by its held-out
    patients; with the curvature there minus theirs, the fold's problem is nearly the identity
    in u, and L-BFGS needs a few iterations instead of 20-25 (multicenter companion, 10 folds:
    4-7 against 18-26, and closer to each fold's optimum; docs/scaling.md, "The check").

    Why C: adding one vector to every class's column of W (or one number to every intercept)
    leaves the softmax as it is, so the loss has no curvature that way, only the penalty's
    2 alpha, which the class blocks cannot show. The penalised optimum has columns summing to
    zero (the loss's gradient sums to zero over classes, so 2 alpha sum_c W_c = 0 there), so
    the start is moved there (the same probabilities) and the steps kept there.

    Evaluating a point whose gradient has no entry above ``gtol`` ends the solve
    (:class:`_Converged`), plain L-BFGS's rule."""

    def __init__(self, function, theta0, factors, dim: int, k: int, gtol: float):
        self.function, self.factors = function, factors
        self.dim, self.k, self.gtol = dim, k, gtol
        self.theta0 = self._without_class_mean(theta0)
        self.scale = 1.0  # u = scale v, v the coordinates L-BFGS sees (scale_to_newton)
        self._last = None  # (v, (value, gradient)) of the last evaluation

    @classmethod
    def build(cls, function, theta0, objective, curvature, gtol):
        """None when there is no curvature or a block does not factorise (plain L-BFGS then)."""
        from scipy.linalg import cholesky

        if curvature is None:
            return None
        dim, k = objective.dim, objective.k
        if curvature.shape != (k, dim + 1, dim + 1):
            raise ValueError(f"curvature has shape {curvature.shape}, the problem needs {(k, dim + 1, dim + 1)}")
        m = objective.centre
        factors = []
        for block in curvature:
            centred = _centred_block(block, m)
            centred[np.arange(dim), np.arange(dim)] += 2.0 * objective.alpha
            try:
                factors.append(cholesky(centred, lower=True, check_finite=False))
            except np.linalg.LinAlgError:
                return None
        return cls(function, theta0, factors, dim, k, gtol)

    def _without_class_mean(self, vector) -> np.ndarray:
        dim, k = self.dim, self.k
        coef = vector[:dim * k].reshape(dim, k)
        intercept = vector[dim * k:]
        return np.concatenate([(coef - coef.mean(axis=1, keepdims=True)).ravel(), intercept - intercept.mean()])

    def _solve(self, vector, transposed: bool) -> np.ndarray:
        from scipy.linalg import solve_triangular

        dim, k = self.dim, self.k
        columns = np.vstack([vector[:dim * k].reshape(dim, k), vector[dim * k:][None, :]])  # (D + 1, k)
        out = np.empty_like(columns)
        for c, factor in enumerate(self.factors):
            out[:, c] = solve_triangular(factor, columns[:, c], lower=True, trans=1 if transposed else 0,
                                         check_finite=False)
        return np.concatenate([out[:dim].ravel(), out[dim]])

    def theta(self, v) -> np.ndarray:
        return self.theta0 + self._without_class_mean(self._solve(self.scale * v, transposed=True))

    def scale_to_newton(self) -> np.ndarray:
        """Evaluate the start (v = 0) and scale v so that L-BFGS's first step is the Newton step
        with the curvature given. That step is u = minus the preconditioned gradient; L-BFGS-B
        makes its first step of unit length, which overshoots it (on the multicenter folds by
        ~100x, and the line search then backtracks). Returns the start, v = 0."""
        zero = np.zeros(self.dim * self.k + self.k)
        _, gradient = self(zero)
        norm = float(np.linalg.norm(gradient))
        if norm > 0.0:
            self.scale, self._last = norm, (zero, (self._last[1][0], gradient * norm))
        return zero

    def __call__(self, v):
        if self._last is not None and np.array_equal(self._last[0], v):
            return self._last[1]  # L-BFGS asks for its start, which scale_to_newton evaluated
        theta = self.theta(v)
        value, gradient = self.function(theta)
        if np.abs(gradient).max() <= self.gtol:
            raise _Converged(theta)
        result = value, self.scale * self._solve(self._without_class_mean(gradient), transposed=False)
        self._last = np.array(v, copy=True), result
        return result
