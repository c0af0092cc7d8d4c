"""Populations as Gaussians that move with each patient: linear discriminant analysis fitted on
the training patients, then adapted to every new patient by EM over its own unlabeled cells.

A population is one Gaussian; all populations share one covariance (LDA's model: Abdelaal et
al., Cytometry A 2019 found plain LDA the strongest simple method for transferring cell types
between cytometry samples). Trained on expert-gated patients, every patient weighing the same.
A new patient's populations sit where its own run put them, which can be beyond anything seen
in training (a population at channel 700 in one batch and 450 in another): discriminative
models, flexible or linear, extrapolate their training boundaries there and fail. A generative
model can follow: starting from the training Gaussians' posteriors, a few EM steps over the
patient's cells re-estimate each population's mean, the shared covariance and the population
shares, no label used (the mixture-model gating of FLAME / flowClust, started from the experts'
populations instead of a clustering).

The posterior of a shared-covariance mixture is linear in the cell, so scoring a patient is one
(n, d) x (d, k) product: cheap enough for every event of a large file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.cpus import parallel_rows

#: EM steps over a new patient's cells. The means settle within a few steps from the training
#: start; a fixed count keeps gating time and results independent of tolerances.
EM_STEPS = 10
#: A population with fewer expected cells than this in a patient keeps its training mean there
#: (a mean of a handful of cells would wander).
MIN_POPULATION_CELLS = 3
#: Relative ridge added to covariances (in units of their mean variance).
_RIDGE = 1e-6
#: Cells scored at a time inside a thread: their (block, k) logits stay in the CPU cache.
PROBA_BLOCK = 4096


@dataclass(frozen=True)
class PatientGaussians:
    """One patient's populations: means (k, d), shared precision (d, d) and log shares (k,),
    as float64. Scoring weights: ``coef`` (d, k), ``intercept`` (k,)."""

    means: np.ndarray
    precision: np.ndarray
    log_shares: np.ndarray

    @property
    def coef(self) -> np.ndarray:
        return self.precision @ self.means.T

    @property
    def intercept(self) -> np.ndarray:
        return -0.5 * np.einsum("kd,kd->k", self.means @ self.precision, self.means) + self.log_shares


class AdaptiveLDA:
    """LDA on training patients, adapted to each new patient by EM (see the module docstring).

    Parameters
    ----------
    em_steps : int, default=EM_STEPS
        EM steps over a new patient's cells (0: plain LDA, no adaptation).
    min_population_cells : float, default=MIN_POPULATION_CELLS

    Attributes
    ----------
    classes_ : ndarray of shape (k,)
    means_ : ndarray of shape (k, d)
        Population means over the training patients, every patient weighing the same.
    covariance_ : ndarray of shape (d, d)
        The pooled within-population covariance.
    priors_ : ndarray of shape (k,)
        Population shares over the training patients, every patient weighing the same.
    """

    def __init__(self, em_steps=EM_STEPS, min_population_cells=MIN_POPULATION_CELLS):
        self.em_steps = em_steps
        self.min_population_cells = min_population_cells

    def fit(self, cells, labels, classes=None):
        """Fit on training patients.

        Parameters
        ----------
        cells : list of ndarray of shape (n_i, d)
            Standardised cells of each training patient.
        labels : list of ndarray of shape (n_i,)
        classes : array-like of shape (k,) or None
            The populations, in the order probabilities are returned (default: sorted labels).
        """
        if not len(cells):
            raise ValueError("no training patients")
        labels = [np.asarray(y).astype(str) for y in labels]
        self.classes_ = np.asarray(sorted(set(np.concatenate(labels))) if classes is None else classes).astype(str)
        k, d = len(self.classes_), np.asarray(cells[0]).shape[1]
        sums, weights = np.zeros((k, d)), np.zeros(k)
        for x, y in zip(cells, labels):
            x = np.asarray(x, dtype=np.float64)
            codes = np.searchsorted(self.classes_, y)
            if np.any(self.classes_[np.minimum(codes, k - 1)] != y):
                raise ValueError("labels hold populations that are not among classes")
            w = 1.0 / len(x)
            np.add.at(sums, codes, x * w)
            weights += np.bincount(codes, minlength=k) * w
        if np.any(weights == 0):
            missing = ", ".join(self.classes_[weights == 0])
            raise ValueError(f"no training cell of population(s) {missing}")
        self.means_ = sums / weights[:, None]
        self.priors_ = weights / weights.sum()
        scatter = np.zeros((d, d))
        for x, y in zip(cells, labels):
            centred = np.asarray(x, dtype=np.float64) - self.means_[np.searchsorted(self.classes_, y)]
            scatter += centred.T @ centred / len(x)
        self.covariance_ = _regularised(scatter / len(cells))
        return self

    def training_gaussians(self) -> PatientGaussians:
        """The populations as trained (no adaptation)."""
        return PatientGaussians(self.means_, np.linalg.inv(self.covariance_), np.log(self.priors_))

    def adapt(self, cells, start=None) -> PatientGaussians:
        """The populations of one patient, from its cells (m, d) by EM. Deterministic: a fixed
        number of steps in float64.

        ``start`` None: EM starts from the training Gaussians. Else (m, k) probabilities of the
        cells' populations (columns in ``classes_`` order), another model's: the first M-step
        takes them as its responsibilities. EM finds the nearest fit to its start, so a start
        that already labels the patient well (a transfer model's posteriors) keeps the
        Gaussians from settling where the training populations would have led them."""
        z = np.asarray(cells, dtype=np.float64)
        gaussians = self.training_gaussians()
        if len(z) == 0 or self.em_steps == 0:
            return gaussians
        if start is not None and np.shape(start) != (len(z), len(self.means_)):
            raise ValueError(f"start must be ({len(z)}, {len(self.means_)}) probabilities, got {np.shape(start)}")
        # Every cell's responsibilities sum to 1, so the scatter around the means,
        # sum_j sum_i r_ij (z_i - m_j)(z_i - m_j)', is z'z - sum_j (m_j s_j' + s_j m_j' - n_j m_j m_j')
        # with s_j = sum_i r_ij z_i and n_j = sum_i r_ij: one (d, d) product over the cells, not k.
        gram = z.T @ z
        for step in range(self.em_steps):
            if step == 0 and start is not None:
                resp = np.asarray(start, dtype=np.float64)
            else:
                resp = _softmax(z @ gaussians.coef + gaussians.intercept)
            expected = resp.sum(axis=0)
            shares = np.maximum(expected / len(z), 1e-9)
            movable = expected >= self.min_population_cells
            sums = resp.T @ z
            means = np.where(movable[:, None], sums / np.maximum(expected, 1e-12)[:, None], self.means_)
            cross = means.T @ sums
            scatter = gram - cross - cross.T + (means * expected[:, None]).T @ means
            covariance = _regularised(scatter / len(z))
            gaussians = PatientGaussians(means, np.linalg.inv(covariance), np.log(shares))
        return gaussians

    @staticmethod
    def proba(cells, gaussians: PatientGaussians) -> np.ndarray:
        """Posterior population probabilities (n, k) float32 of cells (n, d) under ``gaussians``.

        In float32, block by block on threads: a cell's probabilities do not depend on the
        block it is scored in, and float32's 7 digits are finer than any posterior gating
        reads (the cells are standardised, so the logits are a few hundred at most)."""
        z = np.asarray(cells)
        coef = np.asarray(gaussians.coef, dtype=np.float32)
        intercept = np.asarray(gaussians.intercept, dtype=np.float32)
        out = np.empty((len(z), len(intercept)), dtype=np.float32)

        def run(bounds):
            lo, hi = bounds
            block = out[lo:hi]
            np.matmul(np.asarray(z[lo:hi], dtype=np.float32), coef, out=block)
            block += intercept
            _softmax(block)

        parallel_rows(run, len(z), max_block=PROBA_BLOCK)
        return out


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``logits`` (n, k), in place; returns them."""
    logits -= logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=1, keepdims=True)
    return logits


def _regularised(covariance: np.ndarray) -> np.ndarray:
    d = len(covariance)
    return covariance + _RIDGE * max(float(np.trace(covariance)) / d, 1e-12) * np.eye(d)
