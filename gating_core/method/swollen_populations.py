"""Rare populations that the adapted populations let swell over a new patient's other cells.

A population of a percent of the events beside large ones is where the two halves of the model
part ways. The experts' gate around it often cuts through a continuum of cells (B cells beside
'ungated' cells): the transfer model, trained on the experts' labels, learned that edge; the
adapted populations model the population as a Gaussian, whose density reaches past the edge, and
EM over the patient can widen it further. With the population at 0.5% of the events, the adapted
populations call it about twice as often as it is there, and the mix follows them.

Both halves estimate how much of the patient the population is. Where a population rare in every
training patient is called by the adapted populations on more than ``SWELL_FACTOR`` times the
largest share any training patient had, while the transfer model's share of it is nearer the
training share, the population swelled: its column of the mix is the transfer model's alone.
Where the halves disagree the other way, the adapted populations are right: a rare population
that moved beyond the training range is lost by the transfer model and followed by the adapted
populations at about its training share. A population that a training patient had at 5% or
more is no rare population even where it is rare on average: a new center's monocytes at 19%
of the events (training patients at most 7%) moved and grew; a biopsy can be made mostly of
`other` cells, a few percent of most training biopsies.
(docs/unseen_data.md, "Rare populations, and populations only some patients have".)

The transfer model's share is taken as the reference only where the halves agree on the rest of
the patient: where they name different populations on more than ``PARTING_SHARE`` of the cells
that neither calls a swollen one, the patient is one the transfer model may not fit (a center
unlike every training one, a model trained on one center), its share is no better evidence than
the adapted populations', and gating keeps the plain mix (:func:`disagreement_beside`). The
bound is not a clean divide: on the patients of a model of one simulated center the halves parted
ways on 20-37% of those cells, and the check had been right on some of them.
"""

from __future__ import annotations

import numpy as np

from gating_core.method.ties import call_weights

#: A population is rare when its share is below this in every training patient. Larger
#: populations differ from patient to patient by more than any factor: a biopsy made of one
#: population's cells is no swelling. A catch-all that is a few percent of most patients and more
#: of one (`ungated`, 1-19% of the DLBCL biopsies) is no rare population either: a few training
#: patients understate how much of it a new one can hold.
RARE_SHARE = 0.05
#: How many times the largest training patient's share the adapted populations must call a rare
#: population on for it to have swelled.
SWELL_FACTOR = 2.0
#: Shares below this count as this in the log ratio (a population called on no cell).
_SHARE_FLOOR = 1e-6
#: Beyond this share of the cells beside the swollen populations on which the halves name
#: different populations, no column is taken from the transfer model. The review flag's bound
#: (gating_core.model.result.DISAGREEMENT_THRESHOLD) has the same value, chosen on every benchmark
#: patient: beyond it patients were gated at 0.80 mean accuracy, within it at 0.955. Kept apart so
#: that moving the flag does not move gating.
PARTING_SHARE = 0.2


def called_shares(proba) -> np.ndarray:
    """The share of cells (n,) called each population (k,) by probabilities ``proba`` (n, k): the
    population of highest probability, a cell whose top populations tie counting evenly to each
    of them (:func:`~gating_core.method.ties.call_weights`)."""
    proba = np.asarray(proba)
    if len(proba) == 0:
        return np.zeros(proba.shape[1])
    return call_weights(proba).mean(axis=0)


def largest_shares(labels, classes) -> np.ndarray:
    """The largest share (k,) of each population among the training patients' cells.

    labels : list of ndarray (n_i,), each training patient's cell populations
    classes : sequence of the k population names
    """
    classes = np.asarray(classes).astype(str)
    return np.array([[np.mean(np.asarray(y).astype(str) == c) if len(y) else 0.0 for c in classes]
                     for y in labels]).max(axis=0)


def swollen_populations(prior, largest, adapted_share, transfer_share) -> np.ndarray:
    """Which populations (k,) bool swelled in one patient: rarer than ``RARE_SHARE`` in every
    training patient, called by the adapted populations on more than ``SWELL_FACTOR`` times the
    largest training share and by the transfer model on a share nearer the training share in log
    ratio (see the module docstring).

    prior : (k,) training shares, every patient weighing the same
    largest : (k,) the largest share of each population among the training patients
        (:func:`largest_shares`)
    adapted_share, transfer_share : (k,) the share of the patient's cells each half calls each
        population (:func:`called_shares`)
    """
    prior = np.asarray(prior, dtype=np.float64)
    largest = np.asarray(largest, dtype=np.float64)
    adapted_share = np.asarray(adapted_share, dtype=np.float64)

    def distance(share):
        return np.abs(np.log(np.maximum(np.asarray(share, dtype=np.float64), _SHARE_FLOOR) / prior))

    return ((largest < RARE_SHARE) & (adapted_share > SWELL_FACTOR * largest)
            & (distance(transfer_share) < distance(adapted_share)))


def disagreement_beside(transfer, adapted, populations) -> float:
    """The share of one patient's cells on which the two halves name different populations,
    counted over the cells that neither calls one of ``populations`` ((k,) bool): how far the
    halves part ways beside those populations. 0.0 where no cell is left to count (none at all,
    or every one called one of them by a half): nothing says the halves part ways, and the check
    acts as it would without the condition.

    transfer, adapted : (n, k) each half's probabilities of the cells. A cell whose top populations
        tie counts as each of them by an even share (:func:`~gating_core.method.ties.call_weights`):
        the result is the expected number of cells the halves differ on over the expected number
        counted, ties broken at random, whatever the populations' names.
    """
    populations = np.asarray(populations, dtype=bool)
    if len(transfer) == 0:
        return 0.0
    calls_t, calls_a = call_weights(transfer), call_weights(adapted)
    # By cell: how much of it neither half calls one of the populations, and how much of that
    # they call the same population.
    beside = (1.0 - calls_t[:, populations].sum(axis=1)) * (1.0 - calls_a[:, populations].sum(axis=1))
    agree = (calls_t[:, ~populations] * calls_a[:, ~populations]).sum(axis=1)
    counted = float(beside.sum())
    if counted < 1e-9:  # no cell beside them, but for rounding
        return 0.0
    return float((beside - agree).sum() / counted)
