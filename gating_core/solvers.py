"""The solvers of the marginal-transfer objective on random features, and the calibration.

- :class:`RidgeStatistics`: the squared loss's per-patient sufficient statistics, so that a
  fit on any subset of patients, for any penalty, is a sum and one eigendecomposition
  (model selection, calibration and the held-out check all lean on that);
- :func:`fit_weighted_logistic`: the multinomial logistic loss with patient weights (L-BFGS);
- :func:`fit_temperature`: the softmax temperature that makes ridge scores probabilities.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh

#: Eigendecompositions up to this width run on one BLAS thread (see RidgeStatistics.eigen).
SINGLE_THREAD_EIGEN = 512


class RidgeStatistics:
    """Per-patient sufficient statistics of the weighted ridge problem on features F_i.

    For patient i with features F_i (n_i, D) and one-hot targets Y_i (n_i, k), holds
    G_i = F_i^T F_i / n_i, s_i = mean(F_i), B_i = F_i^T Y_i / n_i, t_i = mean(Y_i), so that the
    solution for any subset of patients and any lambda follows without touching cells again.
    """

    def __init__(self, n_features: int, n_classes: int):
        self.gram, self.feature_mean, self.cross, self.target_mean = [], [], [], []
        self.n_features, self.n_classes = n_features, n_classes

    def add_patient(self, feature_chunks, target_chunks) -> int:
        """Accumulate one patient from iterables of (m, D) features and (m, k) targets."""
        g = np.zeros((self.n_features, self.n_features))
        b = np.zeros((self.n_features, self.n_classes))
        s = np.zeros(self.n_features)
        t = np.zeros(self.n_classes)
        n = 0
        for f, y in zip(feature_chunks, target_chunks):
            g += (f.T @ f).astype(np.float64)
            b += (f.T @ y).astype(np.float64)
            s += f.sum(axis=0, dtype=np.float64)
            t += y.sum(axis=0, dtype=np.float64)
            n += len(f)
        self.gram.append(g / n)
        self.cross.append(b / n)
        self.feature_mean.append(s / n)
        self.target_mean.append(t / n)
        return len(self.gram) - 1

    def eigen(self, patients, weights=None):
        """Eigendecomposition of the centred Gram matrix of ``patients``.

        ``weights`` (one per patient index, any scale) weigh the patients; default: equal.
        """
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
        g_c = g - np.outer(mu, mu)
        b_c = b - np.outer(mu, t)
        if len(g_c) <= SINGLE_THREAD_EIGEN:
            # A few-hundred-wide eigendecomposition gains nothing from threads, and beside other
            # CPU-bound work their waiting made it 12x slower (0.35 s against 0.03 s at 256).
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1, user_api="blas"):
                values, vectors = eigh(g_c, driver="evd")
        else:
            values, vectors = eigh(g_c, driver="evd")
        return np.maximum(values, 0.0), vectors, vectors.T @ b_c, mu, t

    def _totals(self):
        """Sums over every patient of the four statistics, kept until a patient is added."""
        if getattr(self, "_total_count", None) != len(self.gram):
            # Accumulated one patient at a time: stacking them would cost N copies at once.
            self._total = tuple(sum(parts[1:], parts[0].copy()) for parts in (self.gram, self.feature_mean,
                                                                            self.cross, self.target_mean))
            self._total_count = len(self.gram)
        return self._total

    def subset(self, rows, class_columns=None):
        """Statistics of ``rows`` only (a new object sharing the per-row arrays); with
        ``class_columns``, of those target columns only (the classes a subset still holds)."""
        rows = [int(r) for r in rows]
        out = RidgeStatistics(self.n_features, self.n_classes if class_columns is None else len(class_columns))
        out.gram = [self.gram[r] for r in rows]
        out.feature_mean = [self.feature_mean[r] for r in rows]
        out.cross = [self.cross[r] if class_columns is None else self.cross[r][:, class_columns] for r in rows]
        out.target_mean = [self.target_mean[r] if class_columns is None else self.target_mean[r][class_columns]
                           for r in rows]
        return out

    @staticmethod
    def solve(eigen, alpha: float):
        """Coefficients (D, k) and intercept (k,) for ridge penalty ``alpha`` from ``eigen``."""
        values, vectors, projected, mu, t = eigen
        coef = vectors @ (projected / (values + alpha)[:, None])
        return coef, t - mu @ coef


def fit_weighted_logistic(features, targets, patient_weights, n_classes, alpha, warm=None, max_iter=300):
    """Multinomial logistic regression with patient weights and an L2 penalty.

    Minimises sum_i w_i mean_j CE(softmax(F_ij W + b), Y_ij) + alpha ||W||^2 (b unpenalised)
    by L-BFGS. ``features``: list of (n_i, D) float32; ``targets``: list of (n_i,) class
    indices; ``patient_weights``: (N,) summing to 1. Returns W (D, k) and b (k,).
    """
    from scipy.optimize import minimize

    f = np.vstack(features).astype(np.float32)
    t = np.concatenate(targets)
    cell_w = np.concatenate([np.full(len(x), w / len(x)) for x, w in zip(features, patient_weights)]).astype(np.float32)
    n, dim = f.shape
    k = n_classes
    onehot = np.zeros((n, k), dtype=np.float32)
    onehot[np.arange(n), t] = 1.0

    def objective(theta):
        w = theta[: dim * k].reshape(dim, k).astype(np.float32)
        b = theta[dim * k:].astype(np.float32)
        z = f @ w + b
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        norm = z.sum(axis=1, keepdims=True)
        p = z / norm
        log_like = np.log(p[np.arange(n), t] + 1e-30)
        value = -float(cell_w @ log_like) + alpha * float((w.astype(np.float64) ** 2).sum())
        residual = (p - onehot) * cell_w[:, None]
        grad_w = (f.T @ residual).astype(np.float64) + 2 * alpha * w
        grad_b = residual.sum(axis=0).astype(np.float64)
        return value, np.concatenate([grad_w.ravel(), grad_b])

    if warm is None:
        theta0 = np.zeros(dim * k + k)
    else:
        theta0 = np.concatenate([np.asarray(warm[0], dtype=np.float64).ravel(), np.asarray(warm[1], dtype=np.float64)])
    result = minimize(objective, theta0, jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "gtol": 1e-6})
    theta = result.x
    return theta[: dim * k].reshape(dim, k), theta[dim * k:]


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
