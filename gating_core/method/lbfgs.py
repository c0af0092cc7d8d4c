"""L-BFGS on a linear model's objective, in row blocks: what the iterative solves share.

A solve (:mod:`gating_core.method.solvers`) gives :class:`RowBlocks` the loss and gradient of a
block of rows; :func:`minimise_linear` runs scipy's L-BFGS-B on it, on centred coordinates, and
with a curvature near the solution (the held-out check's folds) on preconditioned ones
(:class:`_Preconditioned`). Blocks are of fixed size and their sums added in block order, so a
fit does not depend on the number of threads.
"""

from __future__ import annotations

import numpy as np

from gating_core.cpus import one_blas_thread

def stacked_rows(features) -> np.ndarray:
    """All rows' features as one (sum n_i, D) float32 array: the ``stacked`` store of a
    :class:`~gating_core.method.training_problem.RowFeatures` as it is (no copy), else the list stacked."""
    stacked = getattr(features, "stacked", None)
    if stacked is not None and stacked.dtype == np.float32:
        return stacked
    return np.vstack(list(features)).astype(np.float32)


#: L-BFGS stops when no entry of the gradient exceeds this (scipy's ``gtol``), unless the float32
#: objective's rounding stops it first (see :func:`minimise_linear`).
LBFGS_GTOL = 1e-6
#: Correction pairs L-BFGS keeps (scipy's ``maxcor``, 10 by default). Its own work per pair is a
#: few vector products of D k + k entries, nothing beside one evaluation over the rows, and a
#: longer memory models the loss's curvature better on most of our problems. Companion fits,
#: iterations with 10 -> 30 pairs: multicenter 84 -> 61, two simulated cohorts 71 -> 59 and
#: 61 -> 44, the multicenter check's eleven fits 418 -> 281 (accuracies the same to 1e-4); but
#: the sample data 29 -> 31 and a 200-patient library 44 -> 51 (docs/scaling.md, "L-BFGS memory").
LBFGS_MEMORY = 30


def cell_weights(features, patient_weights) -> np.ndarray:
    """Each cell's weight, w_i / n_i for the cells of patient i: (sum n_i,) float32."""
    return np.concatenate([np.full(len(x), w / len(x)) for x, w in zip(features, patient_weights)]).astype(np.float32)


#: Rows in each block of an iterative solver's objective. Fixed, whatever the CPUs: the blocks'
#: partial sums are added in block order, so the fitted model does not depend on the thread
#: count (with BLAS threading the whole product, a hinge or logistic fit moved by 2e-4 between
#: one and two threads). A block of 2,048 rows x 512 float32 features (4 MB) is still in cache
#: when its gradient product reads it again: 40 L-BFGS iterations on 30,000 x 512 took 0.63 s
#: in blocks of 2,048 rows against 1.0 s in blocks of 8,192 (1,024: 0.70 s).
SOLVER_BLOCK_ROWS = 2048


class RowBlocks:
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


def minimise_linear(objective: RowBlocks, warm, max_iter: int, gtol: float, curvature=None):
    """L-BFGS on ``objective``'s coordinates (:class:`RowBlocks`), from zero or from the model
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
    (W[:, c], c_c) of :class:`RowBlocks`, and C removes the mean over classes.

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
