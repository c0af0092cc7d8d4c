"""The losses of the marginal-transfer classifier: one small object per loss.

:class:`~gating_core.method.classifier.MarginalTransferClassifier` takes its loss by name
(``loss="squared"``, a string, so that ``get_params``, ``clone`` and the model file keep it as it
is) and asks the object :func:`loss_for` makes of that name for everything that differs by loss:

- whether it is fitted from the ridge statistics (sums per patient,
  :class:`~gating_core.method.ridge.RidgeStatistics`) or from the features row by row;
- its fit on some training rows with some row weights (a solver of :mod:`gating_core.method.solvers`);
- each training row's mean loss, from which the agnostic patient weighting finds the patients
  the model gates worst;
- its calibration: the refit on a calibration fold's rows, or none when its softmax is already
  a probability;
- what the held-out check and the model need: a preconditioner for warm-started fits, and
  whether the penalty needs its own search.

A new loss is a class here and its name in :data:`LOSSES`; the classifier does not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gating_core.method.lbfgs import LBFGS_GTOL
from gating_core.method.ridge import RidgeStatistics, multitask_ridge_solve
from gating_core.method.solvers import fit_weighted_hinge, fit_weighted_logistic, logistic_curvature

#: L-BFGS iterations of a calibration fold's refit, which starts from the fit on all rows: the
#: fold's optimum differs from it by the held-out patients only.
CALIBRATION_MAX_ITER = 100


@dataclass
class TrainingRows:
    """What a loss is fitted on: every training row (a patient or an augmented copy).

    Attributes
    ----------
    features : sequence of ndarray of shape (m_r, D), float32
        Each row's features (a list, or a :class:`~gating_core.method.training_problem.RowFeatures`
        whose ``stacked`` store the iterative solvers read without a copy).
    targets : sequence of ndarray of shape (m_r,)
        Each row's class indices.
    n_classes : int
    stats : RidgeStatistics or None
        The rows' ridge statistics; needed only by a loss whose ``uses_statistics`` is True.
    """

    features: Sequence[np.ndarray]
    targets: Sequence[np.ndarray]
    n_classes: int
    stats: RidgeStatistics | None = None


class Loss:
    """What the classifier asks of a loss; one subclass per loss.

    Parameters
    ----------
    alpha : float, default=1e-4
        lambda, the penalty on ||f||^2.

    Class attributes
    ----------------
    name : str
        The ``loss`` parameter's value that selects this loss.
    uses_statistics : bool
        Fitted from the ridge statistics (a fit on any subset of rows is a sum), rather than by
        iterations that read every row's features.
    gives_probabilities : bool
        The softmax of its scores is already a probability: no temperature is fitted (it is 1).
    searches_own_penalty : bool
        The penalty the ridge path selects does not carry over to it: when none is given, it is
        chosen by cross-validated refits with this loss
        (:func:`~gating_core.method.companion_selection.select_logistic_alpha`).
    """

    name = ""
    uses_statistics = False
    gives_probabilities = False
    searches_own_penalty = False

    def __init__(self, alpha=1e-4):
        self.alpha = alpha

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha!r})"

    def fit(self, data: TrainingRows, rows, weights=None, *, warm=None, max_iter=300, gtol=None, curvature=None):
        """Coefficients and intercept fitted on training ``rows`` of ``data``.

        Parameters
        ----------
        data : TrainingRows
        rows : iterable of int
            The training rows fitted on.
        weights : ndarray of shape (n_rows,) or None
            Weight of every row of ``data`` (those of ``rows`` are read, normalised to sum 1);
            None: equal.
        warm : (ndarray of shape (D, k), ndarray of shape (k,)) or None
            Starting point of an iterative solver.
        max_iter : int
            Iterations of an iterative solver.
        gtol : float or None
            Where an iterative solver stops (largest gradient entry); None:
            :data:`~gating_core.method.lbfgs.LBFGS_GTOL`.
        curvature : ndarray of shape (k, D + 1, D + 1) or None
            The loss's curvature near the solution (:meth:`curvature`), with ``warm``: a
            preconditioner, for the losses that take one.

        Returns
        -------
        coef : ndarray of shape (D, k)
        intercept : ndarray of shape (k,)
        """
        raise NotImplementedError

    def fit_calibration_fold(self, data: TrainingRows, rows, weights, start):
        """The fit on a calibration fold's training ``rows``, whose held-out scores the
        temperature is fitted on; ``start`` (coef (D, k), intercept (k,)) is the fit on all
        rows. Arguments and returns as in :meth:`fit`."""
        return self.fit(data, rows, weights)

    def patient_losses(self, data: TrainingRows, coef, intercept) -> np.ndarray:
        """Mean loss over each training row's cells at scores ``features @ coef + intercept``:
        ndarray of shape (n_rows,). Read by the agnostic patient weighting."""
        coef32, intercept32 = coef.astype(np.float32), intercept.astype(np.float32)
        losses = np.empty(len(data.features))
        for i, (f, t) in enumerate(zip(data.features, data.targets)):
            losses[i] = self.mean_loss(f @ coef32 + intercept32, t)
        return losses

    def mean_loss(self, scores, targets) -> float:
        """The loss of scores (n, k) against class indices (n,), averaged over the n cells."""
        raise NotImplementedError

    def curvature(self, features, row_weights, coef, intercept, workers: int = 1):
        """The loss's curvature at (``coef``, ``intercept``) over the rows ``features``, which
        preconditions a warm-started fit (:meth:`fit`'s ``curvature``); None for a loss whose
        solver takes no preconditioner."""
        return None


class SquaredLoss(Loss):
    """Squared loss on one-hot targets: kernel ridge classification, solved in closed form from
    the ridge statistics.

    Parameters
    ----------
    alpha : float, default=1e-4
    task_similarity : float in (0, 1] or None, default=None
        tau of the multitask kernel (:func:`~gating_core.method.ridge.multitask_ridge_solve`); None:
        the plain ridge solve (:meth:`RidgeStatistics.fit`).
    """

    name = "squared"
    uses_statistics = True

    def __init__(self, alpha=1e-4, task_similarity=None):
        super().__init__(alpha)
        self.task_similarity = task_similarity

    def __repr__(self) -> str:
        return f"SquaredLoss(alpha={self.alpha!r}, task_similarity={self.task_similarity!r})"

    def fit(self, data, rows, weights=None, *, warm=None, max_iter=300, gtol=None, curvature=None):
        # Closed form: no starting point, iterations or preconditioner to use.
        if self.task_similarity is not None:
            return multitask_ridge_solve(data.stats, rows, weights, self.alpha, float(self.task_similarity))
        return data.stats.fit(rows, self.alpha, weights)

    def mean_loss(self, scores, targets) -> float:
        onehot = np.zeros_like(scores)
        onehot[np.arange(len(targets)), targets] = 1.0
        return float(np.mean(((scores - onehot) ** 2).sum(axis=1)))


class _IterativeLoss(Loss):
    """A loss fitted by L-BFGS over every row's features; :meth:`_solve` names the solver."""

    def fit(self, data, rows, weights=None, *, warm=None, max_iter=300, gtol=None, curvature=None):
        rows = list(rows)
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)[rows]
        w = w / w.sum()
        features = data.features
        if getattr(features, "stacked", None) is not None and rows == list(range(len(features))):
            chosen = features  # every row in order: the solver reads the stacked store, no copy
        else:
            chosen = [features[i] for i in rows]
        return self._solve(chosen, [data.targets[i] for i in rows], w, data.n_classes, warm=warm, max_iter=max_iter,
                           gtol=LBFGS_GTOL if gtol is None else gtol, curvature=curvature)

    def fit_calibration_fold(self, data, rows, weights, start):
        # From the fit on all rows: a short path to the fold's optimum.
        return self.fit(data, rows, weights, warm=start, max_iter=CALIBRATION_MAX_ITER)

    def _solve(self, features, targets, row_weights, n_classes, *, warm, max_iter, gtol, curvature):
        raise NotImplementedError


class LogisticLoss(_IterativeLoss):
    """Weighted multinomial logistic loss (cross-entropy of the softmax), by L-BFGS
    (:func:`~gating_core.method.solvers.fit_weighted_logistic`); its probabilities need no temperature."""

    name = "logistic"
    gives_probabilities = True
    searches_own_penalty = True

    def _solve(self, features, targets, row_weights, n_classes, *, warm, max_iter, gtol, curvature):
        return fit_weighted_logistic(features, targets, row_weights, n_classes, self.alpha, warm=warm,
                                     max_iter=max_iter, gtol=gtol, curvature=curvature)

    def mean_loss(self, scores, targets) -> float:
        z = scores.astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(targets)), targets]))

    def curvature(self, features, row_weights, coef, intercept, workers: int = 1):
        return logistic_curvature(features, row_weights, coef, intercept, workers=workers)


class HingeLoss(_IterativeLoss):
    """Cost-sensitive one-vs-rest hinge loss (a linear SVM on the features, Huber-smoothed for
    L-BFGS: :func:`~gating_core.method.solvers.fit_weighted_hinge`), the loss of the papers'
    experiments; its margins are calibrated like the ridge scores."""

    name = "hinge"

    def _solve(self, features, targets, row_weights, n_classes, *, warm, max_iter, gtol, curvature):
        # The smoothed hinge's solver takes no preconditioner: ``curvature`` is not used.
        return fit_weighted_hinge(features, targets, row_weights, n_classes, self.alpha, warm=warm,
                                  max_iter=max_iter, gtol=gtol)

    def mean_loss(self, scores, targets) -> float:
        # The plain hinge, not the solver's smoothed one: how badly each patient is gated.
        onehot = np.zeros_like(scores)
        onehot[np.arange(len(targets)), targets] = 1.0
        return float(np.mean(np.maximum(0.0, 1.0 - (2 * onehot - 1) * scores).sum(axis=1)))


#: The losses by the name the ``loss`` parameter gives.
LOSSES = {loss.name: loss for loss in (SquaredLoss, LogisticLoss, HingeLoss)}


def loss_for(name: str, **params) -> Loss:
    """The loss object named ``name`` (a key of :data:`LOSSES`), made with ``params``
    (``alpha``, and ``task_similarity`` for the squared loss).

    Raises
    ------
    ValueError
        ``name`` is not one of the losses; the message names those that are.
    """
    if not isinstance(name, str) or name not in LOSSES:
        raise ValueError(f"loss must be one of {tuple(LOSSES)}, got {name!r}")
    return LOSSES[name](**params)
