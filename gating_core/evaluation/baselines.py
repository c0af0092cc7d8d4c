"""The pooled baselines evaluation measures the method against: a standard classifier on every
training patient's cells pooled, on the product's own cells.

* :class:`PooledBaseline`: LDA, QDA or gradient-boosted trees on the transformed, standardised
  channels (``evaluate`` methods ``lda``, ``qda``, ``trees``); :func:`LDABaseline`.
* :class:`DICAPooling`: DICA (Muandet et al. 2013) fitted on the training patients, then a
  pooled logistic regression on the projected cells (``dica-pooling``).

Each takes its cells from a :class:`~gating_core.model.estimator.GatingModel` (channels, transform,
standardisation, the seeded draw of each patient's cells), so the baselines and the method see
the same cells. ``fit(samples, labels)``, ``predict(sample) -> (n,)`` labels.
"""

from __future__ import annotations

import numpy as np
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from gating_core.method.dica import DICA
from gating_core.model.estimator import GatingModel

__all__ = ["PooledBaseline", "LDABaseline", "DICAPooling"]


class PooledBaseline:
    """A standard classifier on the transformed, standardised channels, trained on all
    patients' cells pooled: LDA (``"lda"``), QDA (``"qda"``) or gradient-boosted trees
    (``"trees"``, scikit-learn's HistGradientBoostingClassifier with its defaults).

    Each training patient contributes the same seeded uniform draw of cells as a GatingModel
    with ``class_balance=0`` (a :class:`~gating_core.model.digest.PatientDigest`); channels and
    transform are chosen the same way, from ``channels`` and ``transform`` as GatingModel takes
    them (the user's, when a model beside it is given them).
    """

    def __init__(self, kind="lda", cells_per_patient=4000, compensate=True, random_state=0, channels=None,
                 transform="auto"):
        self.kind = kind
        self.cells_per_patient = cells_per_patient
        self.compensate = compensate
        self.random_state = random_state
        self.channels = channels
        self.transform = transform

    def _estimator(self):
        if self.kind == "lda":
            return LinearDiscriminantAnalysis()
        if self.kind == "qda":
            # A light ridge on each population's covariance: a small population with a flat
            # channel would otherwise have a singular one.
            return QuadraticDiscriminantAnalysis(reg_param=1e-3)
        if self.kind == "trees":
            return HistGradientBoostingClassifier(random_state=self.random_state)
        raise ValueError(f"unknown baseline {self.kind!r}")

    def fit(self, samples, labels):
        self.preprocessing_ = GatingModel(compensate=self.compensate, cells_per_patient=self.cells_per_patient,
                                          random_state=self.random_state, channels=self.channels,
                                          transform=self.transform)  # training cells drawn uniformly
        cells, drawn_labels = self.preprocessing_.standardised_training_cells(samples, labels)
        self.estimator_ = self._estimator().fit(np.vstack(cells), np.concatenate(drawn_labels))
        self.populations_ = [str(c) for c in self.estimator_.classes_]
        return self

    def predict(self, sample) -> np.ndarray:
        return self.estimator_.predict(self.preprocessing_.standardised_cells(sample))


def LDABaseline(cells_per_patient=4000, compensate=True, random_state=0) -> PooledBaseline:
    """LDA on the transformed, standardised channels (:class:`PooledBaseline`)."""
    return PooledBaseline("lda", cells_per_patient, compensate, random_state)


class DICAPooling:
    """DICA as preprocessing before pooling: one classifier on every patient's projected cells.

    Cells are the product's (the channels, transform and standardisation a
    :class:`~gating_core.model.estimator.GatingModel` chooses, each patient's seeded draw of
    ``cells_per_patient`` cells); :class:`~gating_core.method.dica.DICA` is fitted on the training
    patients, then a multinomial logistic regression on the projected cells of all of them
    pooled.
    ``fit(samples, labels)``, ``predict(sample) -> (n,)`` labels.

    ``features``: "dica" (supervised), "udica" (unsupervised) or "input" (no projection: the
    standardised channels themselves, the baseline of the paper's Table 2 on the same cells).
    """

    FEATURES = ("dica", "udica", "input")

    def __init__(self, features="dica", n_components=20, n_features=300, lam=0.01, cells_per_patient=2000,
                 compensate=True, random_state=0):
        self.features = features
        self.n_components = n_components
        self.n_features = n_features
        self.lam = lam
        self.cells_per_patient = cells_per_patient
        self.compensate = compensate
        self.random_state = random_state

    def fit(self, samples, labels):
        self.preprocessing_ = GatingModel(compensate=self.compensate, cells_per_patient=self.cells_per_patient,
                                          random_state=self.random_state)  # training cells drawn uniformly
        cells, drawn_labels = self.preprocessing_.standardised_training_cells(samples, labels)
        if self.features not in self.FEATURES:
            raise ValueError(f"features must be one of {self.FEATURES}, got {self.features!r}")
        self.dica_ = None if self.features == "input" else DICA(
            n_components=self.n_components, supervised=self.features == "dica", n_features=self.n_features,
            lam=self.lam, random_state=self.random_state).fit(cells, drawn_labels)
        projected = np.vstack([self._projected(x) for x in cells])
        self.scale_ = projected.std(axis=0) + 1e-12  # the eigenvectors' scales differ by orders
        self.classifier_ = LogisticRegression(max_iter=1000).fit(projected / self.scale_,
                                                                 np.concatenate(drawn_labels))
        self.populations_ = [str(c) for c in self.classifier_.classes_]
        return self

    def predict(self, sample) -> np.ndarray:
        cells = self.preprocessing_.standardised_cells(sample)
        return self.classifier_.predict(self._projected(cells) / self.scale_)

    def _projected(self, cells):
        return cells if self.dica_ is None else self.dica_.transform(cells)
