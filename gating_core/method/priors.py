"""Class-prior re-estimation on a new patient's unlabeled cells (Saerens, Latinne, Decaestecker,
Neural Computation 2002).

A new patient's population proportions differ from the training patients' (a center whose
'ungated' share is twice the others'). With calibrated posteriors p(c | x) learned under the
training prior pi_0, the EM iteration

    q(c | x) ~ p(c | x) pi(c) / pi_0(c),     pi(c) <- mean over cells of q(c | x)

converges to the maximum-likelihood prior of the new patient; the adjusted posteriors q are
then the gate. It uses no label of the new patient. It is an option (``prior_shift="em"``):
it helps only where the posteriors are calibrated on the new patient, which a new center does
not guarantee (README: measured gains and losses by data set).
"""

from __future__ import annotations

import numpy as np

PRIOR_FLOOR = 1e-6
#: The choices of GatingModel's ``prior_shift``: no re-estimation, or the EM re-estimation here.
PRIOR_SHIFTS = ("none", "em")


def training_prior(labels, classes) -> np.ndarray:
    """The prior the classifier learned under: each patient weighing the same.

    labels : list of ndarray (n_i,), the training cells' populations per patient
    classes : sequence of the k population names (classifier order)
    Returns ndarray (k,), summing to 1.
    """
    classes = np.asarray(classes)
    shares = np.array([[np.mean(np.asarray(y) == c) for c in classes] for y in labels])
    prior = np.maximum(shares.mean(axis=0), PRIOR_FLOOR)
    return prior / prior.sum()


def reestimate_prior(proba, prior, max_iter=200, tol=1e-7) -> np.ndarray:
    """The new patient's prior by EM from posteriors ``proba`` (n, k) computed under ``prior`` (k,)."""
    proba = np.asarray(proba, dtype=np.float64)
    prior = np.asarray(prior, dtype=np.float64)
    current = prior.copy()
    for _ in range(max_iter):
        adjusted = proba * (current / prior)
        adjusted /= np.maximum(adjusted.sum(axis=1, keepdims=True), 1e-300)
        updated = np.maximum(adjusted.mean(axis=0), PRIOR_FLOOR)
        updated /= updated.sum()
        if np.abs(updated - current).max() < tol:
            return updated
        current = updated
    return current


def apply_prior_ratio(proba, ratio) -> np.ndarray:
    """Posteriors (n, k) re-weighted by ``ratio`` = new prior / training prior, in place."""
    proba *= np.asarray(ratio, dtype=proba.dtype)
    proba /= proba.sum(axis=1, keepdims=True)
    return proba
