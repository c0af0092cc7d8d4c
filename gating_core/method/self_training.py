"""Self-training at gating time: a new patient's gates follow its own populations.

On a patient from a center the model has never seen, most errors sit where a population's
boundary has moved with the instrument (the background of ``ungated`` rises, positive signals
compress), while the cores of the populations are still gated with confidence. Self-training
takes those confident cells as the patient's own labels and moves the model's function towards
them, with the refinement of :mod:`gating_core.method.refinement` (JMLR 2021, section 9), whose
corrections here come from the model instead of a reviewer:

    f = f0 + phi(P_T, x) B,   B = argmin  sum_{j pseudo-labeled} ||f(x_j) - y_j||^2 + lambda ||B||^2

f0 is the model's final probabilities of the patient's cells, phi its marginal classifier's
features with the patient's embedding fixed (the cell kernel k_X), and y_j the one-hot label of
the population the model gives cell j. The pseudo-labeled cells are, in each population the
model finds in the patient, the more confident part of its cells (confidence at or above that
population's ``SELF_TRAINING_QUANTILE``), at most ``SELF_TRAINING_CELLS`` of them: every
population the same number, so that a rare one weighs as much as a large one. delta = phi B is
smooth in k_X (a kernel expansion on the pseudo-labeled cells), so cells near a population's
confident core move towards it and a moved boundary follows the patient's cells. Nothing of the
patient's true labels is used.

The cells come from the patient's content-chosen cells (the embedding's), so the adjustment is
the same whatever the chunking and costs one pass over at most ``embedding_cells`` cells; for
every gated cell the correction phi B comes from the features the marginal classifier scores it
with (k more columns in the scoring product, :meth:`MarginalTransferClassifier.predict_proba_and_project`).
"""

from __future__ import annotations

import numpy as np

from gating_core.method.population_components import adapted_proba
from gating_core.method.priors import apply_prior_ratio
from gating_core.method.refinement import corrected_probabilities, refinement_coef

#: A population's cells whose confidence is at or above this quantile of its cells' confidences
#: are candidates for its pseudo-labels (0.5: the more confident half).
SELF_TRAINING_QUANTILE = 0.5
#: Pseudo-labeled cells drawn per population (all its candidates when it has fewer).
SELF_TRAINING_CELLS = 300
#: lambda of the fit (units: the sum over pseudo-labeled cells of squared errors; features of
#: unit norm). Smaller follows the confident cells more closely.
SELF_TRAINING_ALPHA = 0.03


def pseudo_labels(proba: np.ndarray, quantile: float = SELF_TRAINING_QUANTILE,
                  per_population: int = SELF_TRAINING_CELLS, random_state=0):
    """The cells self-training learns from, and their populations.

    Parameters
    ----------
    proba : ndarray of shape (m, k)  the model's probabilities of the candidate cells
    quantile : float in [0, 1]
    per_population : int >= 1
    random_state : int or None  the draw among a population's candidates

    Returns
    -------
    rows : ndarray of shape (r,), int  rows of ``proba``, population by population
    codes : ndarray of shape (r,), int  the population (column of ``proba``) of each
    """
    proba = np.asarray(proba)
    best = np.argmax(proba, axis=1)
    confidence = proba[np.arange(len(best)), best]
    rng = np.random.default_rng(random_state)
    rows, codes = [], []
    for code in np.unique(best):
        members = np.flatnonzero(best == code)
        members = members[confidence[members] >= np.quantile(confidence[members], quantile)]
        if len(members) > per_population:
            members = np.sort(rng.choice(members, per_population, replace=False))
        rows.append(members)
        codes.append(np.full(len(members), code))
    if not rows:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    return np.concatenate(rows).astype(np.intp), np.concatenate(codes).astype(np.intp)


def self_training_coef(features: np.ndarray, proba: np.ndarray, alpha: float = SELF_TRAINING_ALPHA,
                       quantile: float = SELF_TRAINING_QUANTILE, per_population: int = SELF_TRAINING_CELLS,
                       random_state=0) -> np.ndarray:
    """B of the self-training step from the candidate cells' features and probabilities.

    Parameters
    ----------
    features : ndarray of shape (m, D)  phi of the candidate cells
    proba : ndarray of shape (m, k)  f0 of the same cells
    alpha, quantile, per_population, random_state : see the module's constants

    Returns
    -------
    ndarray of shape (D, k), float32 (zeros when there is no candidate cell)
    """
    proba = np.asarray(proba, dtype=np.float64)
    rows, codes = pseudo_labels(proba, quantile, per_population, random_state)
    targets = np.zeros((len(rows), proba.shape[1]))
    targets[np.arange(len(rows)), codes] = 1.0
    coef = refinement_coef(np.asarray(features)[rows], targets - proba[rows], alpha)
    return coef.astype(np.float32)


class PatientAdjustment:
    """What gating one patient does to the model's probabilities after the blend: the prior
    ratio of ``prior_shift="em"`` (``ratio``, (k,), or None), then the self-training step
    (``coef``, B of shape (D, k), or None).

    Called on probabilities (n, k) and, with a self-training step, the correction phi B of the
    same cells (``shift``, (n, k): the marginal classifier's features projected on ``coef``),
    it adjusts the probabilities in place and returns them.

    ``gaussians`` (a :class:`~gating_core.method.adaptive_lda.PatientGaussians`, or None) are the
    patient's own populations adapted by EM, sharing one covariance; ``shapes`` (a pair of
    :class:`~gating_core.method.unknown_cells.PopulationReach` and
    :class:`~gating_core.method.unknown_cells.PatientReach`, or None) the same populations each in
    its own training shape. The model mixes their
    posteriors in with :meth:`mix`, at its weight ``adaptive_weight_``. ``reach`` (a
    :class:`~gating_core.method.unknown_cells.PatientReach`, or None) is where its populations reach:
    the model calls cells beyond all of them unknown. ``transfer_columns`` ((k,) bool, or None) are
    the populations whose column :meth:`mix` takes from the given probabilities alone (rare
    populations the adapted ones let swell:
    :func:`~gating_core.method.swollen_populations.swollen_populations`); ``disagreement`` the share
    of the patient's content-chosen cells on which the two halves differ, when computed.
    """

    def __init__(self, ratio=None, coef=None, gaussians=None, reach=None, shapes=None, components=None):
        self.ratio, self.coef, self.gaussians, self.reach, self.shapes = ratio, coef, gaussians, reach, shapes
        self.components = components
        self.transfer_columns = None
        self.disagreement = None

    def adapted(self, cells: np.ndarray) -> np.ndarray:
        """The adapted populations' posteriors of cells (n, d): (n, k) float32, the mean of the
        shared-covariance fit's and (with ``shapes``) the own-shape fit's."""
        return adapted_proba(cells, self.gaussians, self.shapes, self.components)

    def mix(self, proba: np.ndarray, cells: np.ndarray, weight: float, adapted=None) -> np.ndarray:
        """``(1 - weight) proba + weight`` :meth:`adapted`, in place; unchanged without
        gaussians or at weight 0. With ``transfer_columns``, those columns keep ``proba``'s
        values alone and every row is normalised to sum to 1. ``adapted``: :meth:`adapted` of
        ``cells`` when already computed."""
        if self.gaussians is None or weight <= 0:
            return proba
        adapted = self.adapted(cells) if adapted is None else adapted
        if self.transfer_columns is None:
            proba *= np.float32(1.0 - weight)
            proba += np.float32(weight) * adapted
            return proba
        weights = np.where(self.transfer_columns, np.float32(0.0), np.float32(weight)).astype(np.float32)
        proba *= np.float32(1.0) - weights
        proba += weights * adapted
        proba /= proba.sum(axis=1, keepdims=True)
        return proba

    def __call__(self, proba: np.ndarray, shift=None) -> np.ndarray:
        if self.ratio is not None:
            apply_prior_ratio(proba, self.ratio)
        if self.coef is not None:
            proba[:] = corrected_probabilities(proba, shift)
        return proba
