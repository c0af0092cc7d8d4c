"""The iterative solves of the marginal-transfer objective on random features.

- :func:`fit_weighted_logistic`: the multinomial logistic loss with patient weights (L-BFGS),
  and :func:`logistic_curvature`, its curvature near a solution (the held-out check's folds
  start from the fit on all patients, preconditioned by it);
- :func:`fit_weighted_hinge`: the cost-sensitive linear SVM (one-vs-rest hinge) with patient
  weights, the loss of the NIPS 2011 / JMLR 2021 experiments (L-BFGS on a Huber-smoothed hinge).

The squared loss's closed form (ridge statistics, the multitask solve) is in
:mod:`gating_core.method.ridge`; the L-BFGS both solves here run on, in
:mod:`gating_core.method.lbfgs`; the calibration's temperature in
:mod:`gating_core.method.calibration`.
"""

from __future__ import annotations

import numpy as np

from gating_core.method.lbfgs import (LBFGS_GTOL, SOLVER_BLOCK_ROWS, RowBlocks, cell_weights, minimise_linear,
                                      stacked_rows)

def fit_weighted_logistic(features, targets, patient_weights, n_classes, alpha, warm=None, max_iter=300,
                          gtol=LBFGS_GTOL, curvature=None):
    """Multinomial logistic regression with patient weights and an L2 penalty.

    Minimises sum_i w_i mean_j CE(softmax(F_ij W + b), Y_ij) + alpha ||W||^2 (b unpenalised)
    by L-BFGS. ``features``: list of (n_i, D) float32 (or a stored RowFeatures); ``targets``:
    list of (n_i,) class indices; ``patient_weights``: (N,) summing to 1. Returns W (D, k) and b (k,).

    ``curvature``: the loss's curvature blocks near the solution, (k, D + 1, D + 1) as
    :func:`logistic_curvature` gives them, to precondition the iterations (the held-out check's
    folds, each started from the fit on all patients:
    :func:`~gating_core.method.lbfgs.minimise_linear`). It changes
    the path, not the stopping rule.
    """
    f = stacked_rows(features)
    t = np.concatenate(targets)
    cell_w = cell_weights(features, patient_weights)
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

    return minimise_linear(RowBlocks(block, f, cell_w, alpha, k), warm, max_iter, gtol, curvature)


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
    cell_w = cell_weights(features, patient_weights)
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

    return minimise_linear(RowBlocks(block, f, cell_w, alpha, k), warm, max_iter, gtol)
