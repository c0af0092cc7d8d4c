"""Ties of the adapted populations, and counting calls without the populations' names.

The adapted populations are the mean of two generative fits. Where each fit is sure of another
population, the mean is 0.5 / 0.5, and ``np.argmax`` would give the cell to the population listed
first: whatever counts such calls would then change with the populations' names. Here a tie is
broken by another model's choice (:func:`ties_broken`), or counted without a name
(:func:`parts_disagreement`, :func:`call_weights`).
"""

from __future__ import annotations

import numpy as np


#: Two populations whose adapted probabilities differ by at most this are tied: the two fits,
#: each sure of another population, average to 0.5 / 0.5, and float32 rounding of a mean of
#: saturated posteriors leaves a few units of 6e-8 between them.
TIE_TOLERANCE = np.float32(1e-6)
#: The share of a tied row's probability that goes to the tied population a tie-breaker prefers:
#: far above float32 rounding, too little to move any probability by more than that.
TIE_SHARE = np.float32(1e-3)


def tied_rows(proba: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``proba`` (n, k) whose two likeliest populations are tied (within
    ``TIE_TOLERANCE``), whose call ``argmax`` would give to the population listed first."""
    if proba.shape[1] < 2 or len(proba) == 0:
        return np.empty(0, dtype=np.intp)
    top = np.partition(proba, -2, axis=1)[:, -2:]
    return np.flatnonzero(top[:, 1] - top[:, 0] <= TIE_TOLERANCE)


def break_ties(proba: np.ndarray, rows: np.ndarray, breaker: np.ndarray) -> np.ndarray:
    """``proba`` (n, k) with the ties of its rows ``rows`` broken by ``breaker`` (len(rows), k),
    in place: of the populations tied for a row's top, the one the breaker finds likeliest takes
    ``TIE_SHARE`` of the row's probability (the transfer model's choice, for the adapted populations
    alone; where the breaker ties too, the one listed first); every other row keeps its bits."""
    if len(rows):
        tied = proba[rows]
        candidates = tied >= tied.max(axis=1, keepdims=True) - TIE_TOLERANCE
        winner = np.argmax(np.where(candidates, np.asarray(breaker, dtype=np.float64), -np.inf), axis=1)
        tied *= np.float32(1.0) - TIE_SHARE
        tied[np.arange(len(rows)), winner] += TIE_SHARE
        proba[rows] = tied
    return proba


def ties_broken(proba: np.ndarray, breaker_of) -> np.ndarray:
    """``proba`` (n, k) with its tied rows (:func:`tied_rows`) broken (:func:`break_ties`), in
    place, by ``breaker_of(rows)``: the tie-breaker's probabilities of those rows (len(rows), k),
    asked for only where a row ties (scoring a model on every cell would cost what it saves)."""
    rows = tied_rows(proba)
    return break_ties(proba, rows, breaker_of(rows)) if len(rows) else proba


def parts_disagreement(transfer: np.ndarray, adapted: np.ndarray) -> float:
    """The share of a patient's cells (rows of the transfer model's probabilities ``transfer`` and
    the adapted populations' ``adapted``, both (m, k)) on which the two do not name the same
    population. A cell the adapted populations tie on (:func:`tied_rows`: their two fits each sure
    of another population) counts among them whatever the transfer model calls it: there the
    adapted populations name none of their own, and counting the tie's first population instead
    would make the share depend on the populations' names. 0.0 for no cell."""
    if len(transfer) == 0:
        return 0.0
    differ = np.argmax(transfer, axis=1) != np.argmax(adapted, axis=1)
    differ[tied_rows(adapted)] = True
    return float(np.mean(differ))


def call_weights(proba: np.ndarray) -> np.ndarray:
    """Each cell's call (n, k) float64 from probabilities ``proba`` (n, k): 1 on its likeliest
    population, or, where populations tie for the top (within ``TIE_TOLERANCE``), an even share
    of 1 on each of them. Counted over cells, these are the expected counts of ``argmax`` with ties
    broken at random, whatever order the populations are listed in."""
    proba = np.asarray(proba, dtype=np.float64)
    if len(proba) == 0:
        return np.zeros(proba.shape)
    top = proba >= proba.max(axis=1, keepdims=True) - float(TIE_TOLERANCE)
    return top / top.sum(axis=1, keepdims=True)
