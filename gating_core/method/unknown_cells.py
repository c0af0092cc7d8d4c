"""Cells of a population the model has never seen: far from every training population.

Every classifier puts each cell in one of the populations it was trained on, however far the
cell lies from all of them: blasts in a patient whose training set had none would be called
whichever known population is least unlikely. Here each training population is a Gaussian of
its own shape (covariance within a patient, shrunk toward the pooled within-population
covariance when its cells are few) with a reach: the ``REACH_QUANTILE`` quantile of its own
training cells' squared Mahalanobis distance to their patient's mean of the population. A cell of
a new patient is unknown when its squared distance to every population exceeds ``margin`` times
that population's reach.

Populations move from patient to patient and batch to batch (a population at channel 450 in one
batch and 700 in the next), and an instrument can spread them wider. So the distances are taken
to the new patient's own population means -- EM over its content-chosen cells, started from the
training means, the shapes fixed, then a few steps without the cells already beyond the margin --
and each population's reach is widened by its spread in the patient (the median distance of the
cells nearest to it, over its training cells' median). A new population among the cells leaves
those medians where they were.

A population can also sit elsewhere in one center than in the others (a center's CD4 T cells a
few standard deviations from the rest), and EM, which starts from the average training mean,
may not reach it when the patient holds few of those cells: the population's mean then stays
at its training mean. So a cell is unknown only when it is also beyond the reach of each such
population around every training patient's own mean of it: where a training patient had a
population the patient seems to lack, its cells are not new.

What it cannot see: a new population close to a known one (within about the margin of its
reach), and one that draws a small known population's mean to itself in EM (that population
then reaches it). Where the experts' labels hold a catch-all population ("ungated", "other"),
whose reach covers the whole panel, every cell is within it: such cells are gated to it, as the
experts' gates would have left them. Measured in docs/unseen_data.md.

Scoring is one (n, d) x (d, d) product per population.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.cpus import one_blas_thread, parallel_rows

#: Quantile of a population's training cells' squared distances that defines its reach.
REACH_QUANTILE = 0.999
#: A cell is unknown when its squared distance to every population exceeds ``margin`` times
#: that population's reach (the default of ``GatingModel.unknown_margin``).
UNKNOWN_MARGIN = 3.0
#: EM steps that move the training means to a new patient's cells.
EM_STEPS = 10
#: Then steps without the cells beyond the margin (PopulationReach.patient_populations).
TRIM_STEPS = 3
#: A population with fewer expected cells than this in a patient keeps its training mean there.
MIN_POPULATION_CELLS = 3
#: A population's spread in a patient is measured from at least this many of its cells.
MIN_SPREAD_CELLS = 20
#: Shrinkage of a population's covariance toward the pooled one, in cells per dimension.
_SHRINK_CELLS_PER_DIMENSION = 2.0
#: Relative ridge added to covariances (in units of their mean variance).
_RIDGE = 1e-3
#: Cells whose distances are computed at a time inside a thread (their (block, k d) projection
#: stays in the CPU cache).
DISTANCE_BLOCK = 2048


@dataclass(frozen=True)
class PatientReach:
    """One patient's populations for :meth:`PopulationReach.unknown`: their means (k, d), their
    spread in the patient (k,), each >= 1, and the margin; and for :meth:`PopulationReach.proba`
    their log shares in the patient (k,)."""

    means: np.ndarray
    spread: np.ndarray
    margin: float
    log_shares: np.ndarray


class PopulationReach:
    """Where each training population reaches, to call cells beyond all of them unknown.

    Parameters
    ----------
    reach_quantile : float, default=REACH_QUANTILE
    em_steps : int, default=EM_STEPS
        EM steps that move the population means to a new patient (0: training means).

    Attributes
    ----------
    classes_ : ndarray of shape (k,)
    means_ : ndarray of shape (k, d)
        Population means over the training patients, every patient weighing the same.
    whitening_ : ndarray of shape (k, d, d)
        Per population, W with W W^T its precision: the squared distance of x is
        ||(x - mean) W||^2.
    log_dets_ : ndarray of shape (k,)
        Log-determinant of each population's covariance.
    priors_ : ndarray of shape (k,)
        Population shares over the training patients, every patient weighing the same.
    reach_ : ndarray of shape (k,)
        The ``reach_quantile`` quantile of each population's training cells' squared distance
        to their own patient's mean of that population.
    patient_means_ : ndarray of shape (n_patients, k, d) or None
        Each training patient's mean of each population (the population's mean over the
        patients, ``means_``, where a patient has none of its cells). None in a model read
        from a file that predates them: the patient's own means are then the only ones.
    """

    def __init__(self, reach_quantile=REACH_QUANTILE, em_steps=EM_STEPS):
        self.reach_quantile = reach_quantile
        self.em_steps = em_steps

    def fit(self, cells, labels, classes):
        """Fit on training patients: ``cells`` list of (n_i, d) standardised cells, ``labels``
        list of (n_i,) population names, ``classes`` (k,) the populations in model order."""
        self.classes_ = np.asarray(classes).astype(str)
        k, d = len(self.classes_), np.asarray(cells[0]).shape[1]
        order = np.argsort(self.classes_)
        sums, shares = np.zeros((k, d)), np.zeros(k)
        scatter, counts = np.zeros((k, d, d)), np.zeros(k)
        patients = []
        for x, y in zip(cells, labels):
            x = np.asarray(x, dtype=np.float64)
            codes = self._codes(np.asarray(y).astype(str), order)
            means = np.zeros((k, d))
            for j in np.unique(codes):
                own = x[codes == j]
                means[j] = own.mean(axis=0)
                centred = own - means[j]
                scatter[j] += centred.T @ centred
                counts[j] += len(own)
                sums[j] += means[j] * len(own) / len(x)
                shares[j] += len(own) / len(x)
            patients.append((x, codes, means))
        if np.any(counts == 0):
            raise ValueError(f"no training cell of population(s) {', '.join(self.classes_[counts == 0])}")
        self.means_ = sums / shares[:, None]
        self.patient_means_ = np.stack([np.where(np.isin(np.arange(k), np.unique(codes))[:, None], means, self.means_)
                                        for _, codes, means in patients])
        self.priors_ = shares / shares.sum()
        pooled = scatter.sum(axis=0) / counts.sum()
        prior_cells = _SHRINK_CELLS_PER_DIMENSION * d
        covariances = (scatter + prior_cells * pooled) / (counts + prior_cells)[:, None, None]
        ridge = _RIDGE * np.trace(covariances, axis1=1, axis2=2) / d
        covariances += np.maximum(ridge, 1e-12)[:, None, None] * np.eye(d)
        self.whitening_ = np.stack([np.linalg.cholesky(np.linalg.inv(c)) for c in covariances])
        self.log_dets_ = np.array([np.linalg.slogdet(c)[1] for c in covariances])
        distances = [[] for _ in range(k)]
        for x, codes, means in patients:
            for j in np.unique(codes):
                distances[j].append(self._squared(x[codes == j], means[j], j))
        self.reach_ = np.array([np.quantile(np.concatenate(v), self.reach_quantile) for v in distances])
        self.reach_ = np.maximum(self.reach_, 1e-12)
        # Each population's typical cell: the median distance (in reach units) of its training
        # cells to their patient's mean of it, what a patient spread as the training patients
        # were shows at its median.
        self.typical_ = np.array([max(float(np.median(np.concatenate(v))) / r, 1e-12)
                                  for v, r in zip(distances, self.reach_)])
        return self

    def patient_spread(self, cells, means) -> np.ndarray:
        """How much wider than in the training patients each population of a patient spreads
        around its mean (k,), at least 1: the median distance of the patient's cells (m, d) nearest
        to the population (``means`` (k, d)) over the training patients' (:attr:`typical_`). A new
        population among the cells leaves a known population's median where it was; an
        instrument that spreads a population wider moves it, and that population's reach
        widens with it instead of calling its tails unknown. 1 for a population with fewer than
        ``MIN_SPREAD_CELLS`` cells nearest to it."""
        spread = np.ones(len(means))
        if len(cells) == 0:
            return spread
        scaled = self.squared_distances(cells, means) / self.reach_
        nearest = scaled.argmin(axis=1)
        for j in range(len(means)):
            own = scaled[nearest == j, j]
            if len(own) >= MIN_SPREAD_CELLS:
                spread[j] = max(1.0, float(np.median(own)) / self.typical_[j])
        return spread

    def _codes(self, labels, order):
        codes = order[np.searchsorted(self.classes_[order], labels).clip(0, len(order) - 1)]
        if np.any(self.classes_[codes] != labels):
            raise ValueError("labels hold populations that are not among classes")
        return codes

    def _squared(self, x, mean, j) -> np.ndarray:
        projected = (x - mean) @ self.whitening_[j]
        return np.einsum("nd,nd->n", projected, projected)

    def for_patient(self, cells, margin=UNKNOWN_MARGIN, shares=None, means=None) -> PatientReach:
        """The reach of one patient's populations from its cells (m, d): their means and shares
        (:meth:`patient_populations`, EM started from ``shares`` and ``means``) and the patient's
        spread (:meth:`patient_spread`)."""
        means, shares = self.patient_populations(cells, margin, shares=shares, means=means)
        return PatientReach(means, self.patient_spread(cells, means), float(margin), np.log(shares))

    def patient_populations(self, cells, margin=UNKNOWN_MARGIN, trim_steps=TRIM_STEPS, shares=None,
                            means=None) -> tuple:
        """The population means (k, d) and shares (k,) of one patient, from its cells (m, d) by
        EM started from ``means`` (k, d) (None: the training means) and ``shares`` (k,) (None:
        the training shares), the shapes fixed; then ``trim_steps`` more steps in which cells
        beyond ``margin`` (:meth:`distance`) take no part, so that a new population the first
        steps pulled a known one towards lets it go. A population with too few of the patient's
        cells takes its training mean. Deterministic: fixed steps in float64."""
        z = np.asarray(cells, dtype=np.float64)
        if means is None:
            means = self.means_.copy()
        else:
            means = np.array(means, dtype=np.float64)
            if means.shape != self.means_.shape or not np.all(np.isfinite(means)):
                raise ValueError(f"means must be {self.means_.shape[0]} x {self.means_.shape[1]} finite numbers")
        if shares is None:
            shares = self.priors_.copy()
        else:
            shares = np.asarray(shares, dtype=np.float64)
            if shares.shape != self.priors_.shape or not np.all(shares >= 0) or shares.sum() <= 0:
                raise ValueError(f"shares must be {len(self.priors_)} non-negative numbers, not all 0")
            shares = shares / shares.sum()
        if len(z) == 0:
            return means, shares
        for step in range(self.em_steps + trim_steps):
            squared = self.squared_distances(z, means)
            logits = -0.5 * (squared + self.log_dets_) + np.log(np.maximum(shares, 1e-9))
            logits -= logits.max(axis=1, keepdims=True)
            resp = np.exp(logits)
            resp /= resp.sum(axis=1, keepdims=True)
            if step >= self.em_steps:
                resp[(squared / self.reach_).min(axis=1) > margin] = 0.0
            expected = resp.sum(axis=0)
            shares = np.maximum(expected / max(expected.sum(), 1.0), 1e-9)
            movable = expected >= MIN_POPULATION_CELLS
            means = np.where(movable[:, None], (resp.T @ z) / np.maximum(expected, 1e-12)[:, None], self.means_)
        return means, shares

    def log_likelihood(self, cells, patient: PatientReach) -> float:
        """The mean log-likelihood of a patient's cells (m, d) under its populations (``patient``:
        :meth:`for_patient`), each a Gaussian of its own training shape around the patient's mean
        weighed by the patient's share, without the constant term: two fits of one patient's cells
        compare by it. In float64."""
        z = np.asarray(cells, dtype=np.float64)
        if len(z) == 0:
            return 0.0
        logits = np.asarray(patient.log_shares) - 0.5 * (self.squared_distances(z, patient.means) + self.log_dets_)
        top = logits.max(axis=1)
        return float(np.mean(top + np.log(np.exp(logits - top[:, None]).sum(axis=1))))

    def proba(self, cells, patient: PatientReach) -> np.ndarray:
        """Posterior population probabilities (n, k) float32 of a patient's cells (n, d) under
        its populations, each a Gaussian of its own training shape around the patient's mean,
        weighed by the patient's shares (``patient``: :meth:`for_patient`). In float32 (as
        :meth:`distance`), block by block on threads; a cell's probabilities do not depend on
        its block."""
        whitening, offsets, sums = self._stacked(patient.means, np.float32)
        sums *= np.float32(-0.5)
        intercept = (np.asarray(patient.log_shares) - 0.5 * self.log_dets_).astype(np.float32)
        z = np.asarray(cells)
        out = np.empty((len(z), len(intercept)), dtype=np.float32)

        def run(bounds):
            lo, hi = bounds
            block = out[lo:hi]
            np.matmul(_centred_squares(z[lo:hi], whitening, offsets), sums, out=block)
            block += intercept
            block -= block.max(axis=1, keepdims=True)
            np.exp(block, out=block)
            block /= block.sum(axis=1, keepdims=True)

        # One BLAS thread even for a single block: OpenBLAS rounds these products differently
        # with more threads, and a chunk's cells must get the same bits however gating runs
        # (whole file or streamed, where the chunks are scored inside pools of our own).
        with one_blas_thread():
            parallel_rows(run, len(z), max_block=DISTANCE_BLOCK)
        return out

    def squared_distances(self, cells, means, dtype=np.float64) -> np.ndarray:
        """Squared Mahalanobis distance of each cell (n, d) to each population (k,) around
        ``means`` (k, d), in its own shape: (n, k) of ``dtype``. One (n, d) x (d, k d) product."""
        whitening, offsets, sums = self._stacked(means, dtype)
        projected = np.asarray(cells, dtype=dtype) @ whitening
        projected -= offsets
        np.square(projected, out=projected)
        return projected @ sums

    def distance(self, cells, means, spread=None) -> np.ndarray:
        """How far each cell (n, d) lies beyond every population: min over populations j of
        squared distance to ``means[j]`` / (``reach_[j]`` x ``spread[j]``) (n,); ``spread``
        (k,) None: 1. Above the margin: unknown. Computed in float32 (the margin is no
        finer than that), block by block on threads so that each block's (block, k d)
        projection stays in the CPU cache; a cell's distance does not depend on its block."""
        reach = self.reach_ if spread is None else self.reach_ * np.asarray(spread)
        whitening, offsets, sums = self._stacked(means, np.float32)
        sums /= reach.astype(np.float32)  # each population's sum of squares over its reach, in the same product
        z = np.asarray(cells)
        out = np.empty(len(z), dtype=np.float32)

        def run(bounds):
            lo, hi = bounds
            out[lo:hi] = (_centred_squares(z[lo:hi], whitening, offsets) @ sums).min(axis=1)

        parallel_rows(run, len(z), max_block=DISTANCE_BLOCK)
        return out

    def _stacked(self, means, dtype):
        """The populations side by side, for one product with the cells: the whitenings
        (d, k d), the whitened means (k d,) and the (k d, k) matrix of 0 and 1 whose product with
        the squared coordinates sums each population's d of them (several times faster than
        numpy's sum over a short last axis), all of ``dtype``."""
        k, d = self.whitening_.shape[:2]
        whitening = np.ascontiguousarray(self.whitening_.transpose(1, 0, 2).reshape(d, k * d), dtype=dtype)
        offsets = np.einsum("kd,kde->ke", np.asarray(means, dtype=np.float64), self.whitening_).reshape(-1)
        sums = np.kron(np.eye(k, dtype=dtype), np.ones((d, 1), dtype=dtype))
        return whitening, offsets.astype(dtype), sums

    def unknown(self, cells, patient: PatientReach) -> np.ndarray:
        """Whether each cell (n, d) of a patient is beyond every one of its populations, each
        population's reach widened by its spread in the patient, and, for the populations EM
        left at their training means, beyond each training patient's own mean of them
        (:attr:`patient_means_`) with the same reach: (n,) bool."""
        far = self.distance(cells, patient.means, patient.spread) > patient.margin
        training = getattr(self, "patient_means_", None)
        # The populations EM left at their training mean (too few of the patient's cells came
        # to them): where a training patient had one of those, its cells are not new.
        stayed = np.flatnonzero(np.all(np.asarray(patient.means) == self.means_, axis=1))
        if training is None or not len(stayed) or not far.any():
            return far
        # Only the cells still far are measured again (a patient of nothing new has none), and
        # only against the populations that stayed, around every training patient's mean.
        index = np.flatnonzero(far)
        limit = patient.margin * self.reach_[stayed] * np.asarray(patient.spread, dtype=np.float64)[stayed]
        for start in range(0, len(index), DISTANCE_BLOCK):
            rows = index[start:start + DISTANCE_BLOCK]
            x = np.asarray(cells[rows], dtype=np.float64)
            near = np.zeros(len(rows), dtype=bool)
            for j, population in enumerate(stayed):
                whitening = self.whitening_[population]
                centred = (x @ whitening)[:, None, :] - (training[:, population] @ whitening)[None]
                near |= np.einsum("npd,npd->np", centred, centred).min(axis=1) <= limit[j]
            far[rows[near]] = False
        return far


def _centred_squares(cells, whitening, offsets) -> np.ndarray:
    """Each cell's whitened coordinates around every population's mean, squared: (n, k d)
    float32 from cells (n, d), stacked whitenings (d, k d) and whitened means (k d,)."""
    projected = np.asarray(cells, dtype=np.float32) @ whitening
    projected -= offsets
    np.square(projected, out=projected)
    return projected
