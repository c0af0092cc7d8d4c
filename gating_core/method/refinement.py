"""Refinement from corrections: one reviewer's lasso moves every similar cell of the patient.

Blanchard et al. (JMLR 2021, section 9; NIPS 2011, section 7) propose that once a few cells of
a new patient T are labeled, its decision function be refitted close to the transferred one:

    min_f  sum_{i corrected} ||f(x_i) - y_i||^2  +  lambda ||f - f0(P_T, .)||^2

with y_i the one-hot label the reviewer gave cell i. Writing f = f0 + delta, with delta linear
in the model's features of the patient, delta(x) = phi(P_T, x) B, the minimiser is a ridge
regression of the residuals R = Y - f0(X_corrected) on the corrected cells' features:

    B = (Phi^T Phi + lambda I)^{-1} Phi^T R              (D x k; Phi: (m, D) corrected cells)

By the representer identity B = Phi^T (Phi Phi^T + lambda I)^{-1} R, delta is a kernel
expansion on the corrected cells, delta(x) = sum_i a_i k_X(x, x_i): cells near the circled ones
(in the model's cell kernel) move with them, far ones keep f0.

What f0 is here -- the blend with the pooled companion
-------------------------------------------------------
A :class:`~gating_core.model.estimator.GatingModel` gates with BLENDED probabilities,
``(1 - w) p_marginal + w p_pooled`` (then the EM prior ratio when ``prior_shift="em"``, then
the self-training step of :mod:`gating_core.method.self_training` when ``self_training``). This
module refines THAT function: f0(x) is the vector of the model's final probabilities of cell x
(what :meth:`GatingModel.gate` takes the argmax of), and the squared loss to the one-hot label is
the Brier loss. Refining the marginal scores alone and re-blending would leave a confidently
wrong companion able to outvote the correction (with w = 0.5, a corrected marginal probability
of 1 only ties a companion probability of 1 for the wrong class). The refined probabilities are
f clipped to [0, 1] and renormalised; the population is their argmax. The features phi are the
marginal classifier's (the patient's embedding fixed), i.e. its cell kernel k_X.

A limit, measured: the features are the model's cell kernel k_X, whose bandwidth is wide (about
the median distance between cells), so delta is smooth over the whole patient. Where the model is
sure, small residuals move nothing (confirming 20 right cells of a typical patient changes no
other cell). Where the blend is a tie almost everywhere (a patient far from every training
one, the marginal model and the companion confidently disagreeing: confidences near 0.5), even
a confirmation tips ties across the patient, towards the confirmed population.

Cells the reviewer circled keep the label given (the reviewer's word is final, whatever the
ridge fit gives them); the refinement decides the others. With no corrections the result is the
model's own gating, exactly.

A correction never empties a population: where the refinement would move more than
``max_moved_share`` of the cells of a population that were not circled, none of them moves
(``RefinedGating.held_back``). On a multicenter mass cytometry sample, 2,561 dim monocytes
circled and given to `other` moved all but 52 of the 23,666 other monocytes with them, since in
the wide cell kernel every monocyte is like the circled ones. Rightly, a population can lose most
of its cells: ten CD4 T cells circled in the sample data's drifted patient, gated Monocytes by a
weak model, move 60% of the other Monocytes (61% of which are CD4 T cells). A population wrong as
a whole is circled as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.method.prediction import SCORE_BLOCK

#: The largest share of a population's cells not circled that the refinement may move elsewhere.
MAX_MOVED_SHARE = 0.9

#: lambda of the refinement (units: the SUM over corrected cells of squared errors). On the
#: sample data (bench/bench_refinement.py) 0.1, 1 and 10 all reached 99% agreement with 25-150
#: corrected cells where relabeling only needed 175-2074; 1 was never worst.
DEFAULT_ALPHA = 1.0


@dataclass
class RefinedGating:
    """A patient's gating refined from a reviewer's corrections.

    Attributes
    ----------
    populations : ndarray of shape (n_events,), object (str)
    confidence : ndarray of shape (n_events,), float32  the refined probability of that population
    probabilities : ndarray of shape (n_events, k), float32  columns in ``model.populations_`` order
    corrected : ndarray of shape (m,), int  the corrected cells (event indices, sorted, unique)
    n_changed : int  events whose population differs from the model's unrefined gating
    n_changed_beyond : int  of those, events that were not corrected by hand
    coef : ndarray of shape (D, k)  B, the refinement's weights on the features
    held_back : dict  population -> its cells the refinement would have moved and did not (more
        than ``max_moved_share`` of its cells not circled); empty when none was held back
    held_back_cells : ndarray of shape (h,), int  those cells (event indices, sorted)
    """

    populations: np.ndarray
    confidence: np.ndarray
    probabilities: np.ndarray
    corrected: np.ndarray
    n_changed: int
    n_changed_beyond: int
    coef: np.ndarray
    held_back: dict = field(default_factory=dict)
    held_back_cells: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def refinement_coef(features, residuals, alpha) -> np.ndarray:
    """B = (Phi^T Phi + alpha I)^{-1} Phi^T R: the ridge step of the refinement.

    Parameters
    ----------
    features : ndarray of shape (m, D)  Phi, the corrected cells' features
    residuals : ndarray of shape (m, k)  R = one-hot labels - f0 of those cells
    alpha : float > 0  lambda

    Returns
    -------
    ndarray of shape (D, k), float64. Solved in the smaller of the primal (D x D) and the dual
    (m x m) systems, which give the same B.
    """
    if not alpha > 0:
        raise ValueError(f"alpha (lambda) must be > 0, got {alpha!r}")
    phi = np.asarray(features, dtype=np.float64)
    r = np.asarray(residuals, dtype=np.float64)
    m, d = phi.shape
    if m == 0:
        return np.zeros((d, r.shape[1]))
    if m < d:  # dual: B = Phi^T (Phi Phi^T + lambda I)^-1 R
        return phi.T @ np.linalg.solve(phi @ phi.T + alpha * np.eye(m), r)
    return np.linalg.solve(phi.T @ phi + alpha * np.eye(d), phi.T @ r)


def corrected_probabilities(f0, shift) -> np.ndarray:
    """f = f0 + phi B clipped to [0, 1] and renormalised: probabilities (n, k) float32 from the
    model's own (f0, (n, k)) and the correction phi B of the same cells (``shift``, (n, k))."""
    f = f0 + shift
    np.clip(f, 0.0, 1.0, out=f)
    total = f.sum(axis=1, keepdims=True)
    kept = total[:, 0] > 0
    # In place on the one new array (the gating step's hot path): the same values as dividing
    # the rows whose total is positive and taking f0 elsewhere.
    np.divide(f, total, out=f, where=kept[:, None])
    if not kept.all():
        # A cell pushed to zero everywhere keeps the model's own probabilities (no information).
        f[~kept] = f0[~kept]
    return f.astype(np.float32, copy=False)


def refine_gating(model, sample, cells, labels, alpha=DEFAULT_ALPHA, chunk_size=50_000,
                  base=None, part=None, max_moved_share=MAX_MOVED_SHARE) -> RefinedGating:
    """Refit one patient's gating to a reviewer's corrections (see the module's docstring).

    Parameters
    ----------
    model : fitted :class:`~gating_core.model.estimator.GatingModel`
    sample : the patient (a :class:`~gating_core.fcs.Sample` or what ``model.gate`` takes)
    cells : array-like of int, shape (m,)  event indices the reviewer corrected (repeats: last wins)
    labels : array-like of str, shape (m,)  the population given to each, one of ``model.populations_``
    alpha : float > 0  lambda, the pull towards the model's own gating
    chunk_size : int  events scored at once (bounds memory)
    base : GateResult or None  ``model.gate(sample, part=part)`` when the caller has it (saves a pass)
    part : str or None  the model's part the review started from (``model.gate``'s ``part``; taken
        from ``base`` when not given): f0 is that part's probabilities
    max_moved_share : float in (0, 1] or None  where the refinement would move more than this
        share of the cells of one population of ``base`` that were not circled, those cells keep
        ``base``'s population and probabilities (None: no such limit)

    Returns
    -------
    RefinedGating
    """
    model._check_fitted()
    part = getattr(base, "part", None) if part is None else part
    model._check_part(part)
    populations = [str(p) for p in model.populations_]
    cells = np.asarray(cells, dtype=np.int64).ravel()
    labels = np.asarray(labels).astype(str).ravel()
    if cells.shape != labels.shape:
        raise ValueError(f"{len(cells)} corrected cells but {len(labels)} labels")
    unknown = sorted(set(labels) - set(populations))
    if unknown:
        raise ValueError(f"unknown population(s) {unknown}: the model gates {populations}")
    n_events = int(sample.n_events) if hasattr(sample, "n_events") else None
    if base is None:
        base = model.gate(sample, chunk_size=chunk_size, part=part)
    n = len(base.populations) if n_events is None else n_events
    if len(cells) and (cells.min() < 0 or cells.max() >= n):
        raise ValueError(f"corrected cell indices must be within 0..{n - 1}")
    # One label per cell: the last correction of a cell is the one that stands.
    last = {int(c): lab for c, lab in zip(cells, labels)}
    cells = np.array(sorted(last), dtype=np.int64)
    codes = np.array([populations.index(last[int(c)]) for c in cells], dtype=np.int64)
    if len(cells) == 0:
        unchanged = np.asarray(base.populations)
        return RefinedGating(unchanged, np.asarray(base.confidence, dtype=np.float32),
                             _probabilities_of(model, sample, chunk_size, part), cells, 0, 0,
                             np.zeros((0, len(populations))))

    frame = _PatientFrame(model, sample, part)
    f0_corrected, phi_corrected = frame.scores_and_features(cells)
    targets = np.zeros_like(f0_corrected, dtype=np.float64)
    targets[np.arange(len(cells)), codes] = 1.0
    coef = refinement_coef(phi_corrected, targets - f0_corrected, alpha)

    probabilities = np.empty((n, len(populations)), dtype=np.float32)
    unrefined = np.empty_like(probabilities)
    chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
    coef32 = coef.astype(np.float32)
    for start in range(0, n, chunk_size):
        rows = np.arange(start, min(start + chunk_size, n))
        f0, phi = frame.scores_and_features(rows)
        unrefined[rows] = f0
        probabilities[rows] = corrected_probabilities(f0, phi @ coef32)
    probabilities[cells] = 0.0
    probabilities[cells, codes] = 1.0  # circled cells: the reviewer's label, with certainty
    best = np.argmax(probabilities, axis=1)
    refined = np.asarray(populations, dtype=object)[best]
    confidence = probabilities[np.arange(n), best]
    before = np.asarray(base.populations).astype(str)
    circled = np.zeros(n, dtype=bool)
    circled[cells] = True
    held_back = {}
    kept = np.zeros(n, dtype=bool)
    if max_moved_share is not None:
        moved = (refined.astype(str) != before) & ~circled
        names, members = np.unique(before[~circled], return_counts=True)
        for name, count in zip(names, members):
            if name not in populations:
                continue  # cells gated unknown: the refinement, which knows no such population, decides them
            away = moved & (before == name)
            if away.sum() > max_moved_share * count:
                held_back[str(name)] = int(away.sum())
                kept |= away
                refined[away] = np.asarray(base.populations, dtype=object)[away]
                probabilities[away] = unrefined[away]
                confidence[away] = np.asarray(base.confidence, dtype=np.float32)[away]
    changed = refined.astype(str) != before
    return RefinedGating(refined, confidence, probabilities, cells, int(changed.sum()),
                         int((changed & ~circled).sum()), coef, held_back, np.flatnonzero(kept))


def _probabilities_of(model, sample, chunk_size, part=None):
    frame = _PatientFrame(model, sample, part)
    n = frame.n_events
    out = np.empty((n, len(model.populations_)), dtype=np.float32)
    for start in range(0, n, chunk_size):
        rows = np.arange(start, min(start + chunk_size, n))
        out[rows] = frame.scores_and_features(rows, features=False)[0]
    return out


class _PatientFrame:
    """One patient as the model gates it: its embedding, registration and prior ratio, computed
    once from its content-chosen cells (as :meth:`GatingModel.gate` does), then f0 and the
    features of any of its events."""

    def __init__(self, model, sample, part=None):
        self.model, self.part = model, part
        sample = model._compensated(sample)
        self.indices = model._channel_indices(sample)
        self.events = sample.events
        self.n_events = len(self.events)
        self.registration, self.embedding, chosen = model._patient_frame(self.events, self.indices)
        self.adjustment = model._patient_adjustment(chosen, self.embedding)

    def scores_and_features(self, rows, features=True):
        """f0 (the model's final probabilities, (r, k)) and phi(P_T, x) ((r, D)) of events ``rows``."""
        model = self.model
        cells = model._registered(model._standardise(self.events[rows][:, self.indices]), self.registration)
        proba = model._adjusted_proba(cells, self.embedding, max(1, len(cells)), self.adjustment, self.part)
        return proba, model.classifier_._features(cells, self.embedding) if features else None
