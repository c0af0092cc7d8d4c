"""Training cells piled at a channel's top value: a detector saturated, and the cells' true values
lie somewhere above it.

Real files often hold such piles (scatter channels of a FACSDiva or Cytek file at 2-22% of the
events, width channels up to 47%; a 10-bit FACSCalibur channel at 1023). A pile is no place a
population sits: fitted with it, the populations' shared covariance is squeezed along that
channel and the piled population's mean pulled to the ceiling, and a new patient's EM, started
there, misses the population where it truly lies (docs/unseen_data.md, "A detector
saturating"). The shared-covariance fit of the patients' own populations is therefore fitted
without the piled cells. Everything else keeps them: the own-shape fit and the components of a
population, which must still reach the piled cells of a new patient (left out there too, a
catch-all population's piled cells were lost to the populations beside it), the transfer model,
the trees, and gating (left out of the new patient's EM, the piled cells lost more than they
gained: they still say which population is there).

Only the top of a channel: a pile at its bottom (mass cytometry's zeros, a log channel's first
value) is where a negative population does sit. The piles are looked for in the values the
model is fitted on: a compensated file's fluorescence pile is spread by compensation over many
values and is not found (its scatter and width channels, outside the spillover matrix, are).
"""

from __future__ import annotations

import numpy as np

#: A pile: at least this share of a patient's training cells at one channel's largest value...
PILE_SHARE = 0.005
#: ... and at least this many cells.
MIN_PILE_CELLS = 5


def piled_cells(cells) -> tuple[np.ndarray, np.ndarray]:
    """Which of one patient's cells (m, d) sit at a pile (m,) bool, and which channels hold a
    pile (d,) bool: at least ``PILE_SHARE`` of the cells, and ``MIN_PILE_CELLS``, at the
    channel's largest value. A channel of one value (a detector off) holds no pile: its top is
    not a ceiling the others were cut at."""
    cells = np.asarray(cells)
    if len(cells) == 0:
        return np.zeros(0, dtype=bool), np.zeros(cells.shape[1] if cells.ndim == 2 else 0, dtype=bool)
    top = cells.max(axis=0)
    at_top = cells == top
    piles = (at_top.sum(axis=0) >= max(MIN_PILE_CELLS, PILE_SHARE * len(cells))) & (cells.min(axis=0) < top)
    return (at_top[:, piles].any(axis=1) if piles.any() else np.zeros(len(cells), dtype=bool)), piles


def without_piles(cells, labels) -> tuple[list, list, dict]:
    """Each training patient's cells and labels without the cells of its piles (:func:`piled_cells`).

    A patient keeps every cell where leaving the piled ones out would leave fewer than two, or
    take away one of its labels whole (a population, or a population's component, all at the
    ceiling still needs its Gaussian). The populations' training shares are then counted without
    the piled cells too.

    Parameters
    ----------
    cells : list of ndarray of shape (n_i, d)
    labels : list of ndarray of shape (n_i,)

    Returns
    -------
    cells, labels : lists of the kept rows, the input arrays themselves for a patient without piles.
    left_out : dict of patient index -> (number of cells left out, (d,) bool of the channels piled).
    """
    kept_cells, kept_labels, left_out = [], [], {}
    for i, (x, y) in enumerate(zip(cells, labels)):
        piled, piles = piled_cells(x)
        y = np.asarray(y)
        keep = ~piled
        if piled.any() and keep.sum() >= 2 and len(np.unique(y[keep])) == len(np.unique(y)):
            kept_cells.append(np.asarray(x)[keep])
            kept_labels.append(y[keep])
            left_out[i] = (int(piled.sum()), piles)
        else:
            kept_cells.append(x)
            kept_labels.append(labels[i])
    return kept_cells, kept_labels, left_out
