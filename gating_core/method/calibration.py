"""Calibration: the softmax temperature that makes scores probabilities, fitted on held-out groups.

:func:`out_of_group_temperature` refits the loss without each group of patients in turn and
fits :func:`fit_temperature` on the held-out patients' scores: one scalar, so the decision (the
argmax) is unchanged and the probabilities are honest on patients the model has not seen.
"""

from __future__ import annotations

import numpy as np

from gating_core.cpus import one_blas_thread
from gating_core.method.training_problem import _seed


def out_of_group_temperature(problem, loss, data, weights, groups=None, start=None, calibrate=True,
                             random_state=0) -> float:
    """Softmax temperature fitted on out-of-group scores.

    One scalar keeps the decision (the argmax) unchanged and turns scores into
    probabilities that are honest on patients the model has not seen. A loss that gives
    probabilities already (the logistic loss) has temperature 1; ``calibrate=False`` or a
    single patient, a fixed 10. ``problem``, ``loss``, ``data`` and ``weights`` are the fit's
    (:meth:`~gating_core.method.classifier.MarginalTransferClassifier.fit_prepared`), ``start``
    its solution (the folds' refits may start from it), ``groups`` the patients' centers (folds
    hold out whole groups), ``calibrate`` and ``random_state`` the estimator's.
    """
    from gating_core.method.groups import group_folds

    n_patients = problem.n_patients
    if loss.gives_probabilities:
        return 1.0
    if not calibrate or n_patients < 2:
        return 10.0  # no patient to hold out: a fixed, moderate sharpness
    labels = list(range(n_patients)) if groups is None else list(groups)
    folds = group_folds(labels, 5, 1, random_state=_seed(random_state, 4))
    source = problem.source
    scores, held_targets = [], []
    for held in folds:
        held = set(held)
        rows = [r for r in range(len(data.features)) if int(source[r]) not in held]
        coef, intercept = loss.fit_calibration_fold(data, rows, weights, start)
        with one_blas_thread():  # a small product's bits depend on BLAS's thread count
            for i in sorted(held):
                scores.append(data.features[i] @ coef.astype(np.float32) + intercept.astype(np.float32))
                held_targets.append(problem.targets[i])
    return fit_temperature(scores, held_targets)


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
