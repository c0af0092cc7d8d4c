"""``train/gate --method iw-nystroem``: importance-weighted Nystroem KRR refitted for each new patient.

:class:`~gating_core.method.iw_nystroem.ImportanceWeightedNystroemKRR` is transductive: it is fitted
for one new patient, from the training cells and that patient's own unlabeled cells. So the
model a user trains and hands to ``gate`` is not a decision function but what the refit needs:
the preprocessing (channels, transform, standardisation, as :class:`GatingModel` fits them), a
seeded draw of each training patient's standardised cells with their labels (at most
``cells_per_patient`` each: 2,000 by default, so a model of 8 patients on 9 channels holds
16,000 x 9 numbers) and the estimator's parameters. Gating a patient then

1. picks its content-chosen cells (the same ``embedding_cells`` rows, chosen by a hash of
   their values, that GatingModel embeds: independent of event order and of chunking),
2. refits the weighted Nystroem KRR on the stored training cells with weights
   p_new / p_train estimated from those cells (the fit's cost, ``last_fit_seconds_``, is what
   ``gate`` prints per patient),
3. scores every event in chunks (streamed files never held whole).

Probabilities: the KRR's one-hot scores clipped at 0 and normalised per cell. They rank the
populations but are not calibrated as GatingModel's are; ``confidence`` is that normalised
score.

The model file is its own format (tag ``gating_core.iw_model``): plain arrays plus a JSON
description, read with the same checks as a GatingModel file (no pickle, declared sizes and
every field checked; a problem is a :class:`~gating_core.model.file_checks.ModelFileError`),
written and read by :mod:`gating_core.model.iw_file`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from gating_core.method.features import MeanEmbedding, content_subsample, median_pairwise_distance
from gating_core.method.iw_nystroem import ImportanceWeightedNystroemKRR
from gating_core.model.digest import digest_patient
from gating_core.model.iw_file import (IW_FORMAT, MAX_TRAINING_CELLS, NOVELTY_FEATURES, load_iw_model, model_file_format,
                                       save_iw_model)
from gating_core.model.preprocessing import ChannelPreprocessing
from gating_core.model.result import GateResult, Novelty
from gating_core.model.streaming import StreamedGating

IW_METHOD = "iw-nystroem"


@dataclass
class PatientFit:
    """One new patient's refit: the estimator, its embedding (novelty) and the fit's seconds."""

    estimator: ImportanceWeightedNystroemKRR
    embedding: np.ndarray
    seconds: float


class IWNystroemGatingModel(ChannelPreprocessing, StreamedGating, BaseEstimator):
    """Gating by importance-weighted Nystroem KRR, refitted for every new patient.

    Parameters
    ----------
    channels, transform, compensate :
        As :class:`~gating_core.model.estimator.GatingModel` (the same channel choice, transform and
        standardisation).
    cells_per_patient : int, default=2000
        Training cells of each patient kept in the model (a seeded draw, as GatingModel draws).
    embedding_cells : int, default=20000
        Cells of a new patient (content-chosen) its weights are estimated from.
    n_landmarks, alpha, bandwidth, max_weight :
        Passed to :class:`~gating_core.method.iw_nystroem.ImportanceWeightedNystroemKRR` (bandwidth in
        standardised units; None: the median distance between the stored training cells).
    random_state : int

    Attributes
    ----------
    channels_, channel_markers_, transform_, center_, scale_ : as GatingModel
    cells_ : ndarray (n, d) float32  stored standardised training cells
    labels_ : ndarray (n,) int  their population codes into ``populations_``
    populations_ : list of str
    training_patients_ : list of str
    bandwidth_ : float  the kernel bandwidth in use
    embedder_ : MeanEmbedding, train_embeddings_ : ndarray (n_patients, 2L)  for novelty
    novelty_reference_, novelty_threshold_ : float
    last_fit_seconds_ : float  the cost of the last patient's refit (None before any)
    """

    method = IW_METHOD
    align = "none"  # ChannelPreprocessing reads it; quantile registration is not offered here

    def __init__(self, channels=None, transform="auto", compensate=True, cells_per_patient=2000,
                 embedding_cells=20000, n_landmarks=300, alpha=1e-4, bandwidth=None, max_weight=20.0,
                 random_state=0):
        self.channels = channels
        self.transform = transform
        self.compensate = compensate
        self.cells_per_patient = cells_per_patient
        self.embedding_cells = embedding_cells
        self.n_landmarks = n_landmarks
        self.alpha = alpha
        self.bandwidth = bandwidth
        self.max_weight = max_weight
        self.random_state = random_state

    # -- training: keep what the per-patient refit needs ---------------------------------------

    def digest_seed(self, index: int) -> np.random.SeedSequence:
        """Seed of the ``index``-th patient's cell draw (GatingModel's, so the same cells)."""
        return np.random.SeedSequence([int(self.random_state or 0), 10, int(index)])

    def digest(self, sample, labels, index: int):
        """The ``index``-th training patient's :class:`~gating_core.model.digest.PatientDigest`, as
        :meth:`fit` draws it (uniformly: the density ratio is fitted on cells as they come)."""
        return digest_patient(sample, labels, self.cells_per_patient, self.embedding_cells,
                              seed=self.digest_seed(index), compensate=self.compensate)

    def fit(self, samples, labels, progress=None, groups=None):
        """Keep the preprocessing and each patient's seeded cells (samples: list of Sample,
        labels: list of (n_events_i,) population names). ``groups`` is accepted for the
        common interface and not used: nothing is selected across patients."""
        if len(samples) != len(labels):
            raise ValueError(f"{len(samples)} patients but {len(labels)} label arrays")
        digests = [self.digest(s, y, i) for i, (s, y) in enumerate(zip(samples, labels))]
        return self.fit_digests(digests, progress=progress, groups=groups)

    def fit_digests(self, digests, progress=None, groups=None):
        """:meth:`fit` from :class:`~gating_core.model.digest.PatientDigest` objects."""
        report = progress or (lambda stage, fraction: None)
        if len(digests) == 0:
            raise ValueError("no training patients")
        report("Transforming events", 0.1)
        cells, embedding_cells, labels = self.prepare_digests(digests)
        all_labels = np.concatenate([np.asarray(y).astype(str) for y in labels])
        populations, codes = np.unique(all_labels, return_inverse=True)
        if len(populations) < 2:
            raise ValueError(f"the training patients hold one population only ({populations[0]}): nothing to gate")
        self.populations_ = [str(p) for p in populations]
        self.cells_ = np.vstack(cells).astype(np.float32)
        self.labels_ = codes.astype(np.int16)
        if len(self.cells_) > MAX_TRAINING_CELLS:
            raise ValueError(f"{len(self.cells_):,} training cells: at most {MAX_TRAINING_CELLS:,} "
                             "(lower cells_per_patient)")
        self.training_patients_ = [d.name for d in digests]
        self.bandwidth_ = float(self.bandwidth) if self.bandwidth is not None else \
            median_pairwise_distance(self.cells_, random_state=self.random_state)
        report("Embedding the patients (novelty)", 0.5)
        self.embedder_ = MeanEmbedding(NOVELTY_FEATURES, self.bandwidth_, self.cells_.shape[1],
                                       random_state=np.random.SeedSequence([int(self.random_state or 0), 12]))
        self.train_embeddings_ = np.vstack([self.embedder_.transform(e) for e in embedding_cells])
        self._fit_novelty()
        self.last_fit_seconds_ = None
        report("Done", 1.0)
        return self

    def _fit_novelty(self):
        """As GatingModel's: distances to the nearest training patient, in units of the
        training patients' median nearest-neighbour distance."""
        e = self.train_embeddings_
        if len(e) < 2:
            self.novelty_reference_, self.novelty_threshold_ = 1.0, float("inf")
            return
        d = np.sqrt(((e[:, None] - e[None]) ** 2).sum(-1))
        np.fill_diagonal(d, np.inf)
        nn = d.min(axis=1)
        self.novelty_reference_ = float(np.median(nn)) or 1e-12
        self.novelty_threshold_ = float(max(1.5, 1.25 * nn.max() / self.novelty_reference_))

    # -- gating: refit for the patient, then score ---------------------------------------------

    def _check_fitted(self):
        """Raise scikit-learn's NotFittedError (what any estimator raises) before fit or load."""
        if not hasattr(self, "cells_"):
            raise NotFittedError("this IWNystroemGatingModel is not fitted yet: call fit() or load it")

    def estimator(self) -> ImportanceWeightedNystroemKRR:
        """The (unfitted) per-patient estimator with this model's parameters."""
        return ImportanceWeightedNystroemKRR(n_landmarks=self.n_landmarks, alpha=self.alpha, bandwidth=self.bandwidth_,
                                             max_weight=self.max_weight, random_state=self.random_state)

    def _patient_frame(self, events, indices):
        """(registration None, the patient's :class:`PatientFit`, its content-chosen cells):
        what :meth:`StreamedGating.gate_chunks` asks of a model before scoring."""
        raw = events[:, indices]
        chosen = self._standardise(raw[content_subsample(raw, self.embedding_cells)])
        if len(chosen) == 0:
            raise ValueError("no events to gate")
        start = time.perf_counter()
        population_names = np.asarray(self.populations_)[self.labels_]
        estimator = self.estimator().fit(self.cells_, population_names, chosen)
        seconds = time.perf_counter() - start
        self.last_fit_seconds_ = seconds
        return None, PatientFit(estimator, self.embedder_.transform(chosen), seconds), chosen

    def _prior_ratio(self, chosen, frame):
        return None

    @staticmethod
    def _registered(cells, registration):
        return cells

    def _proba(self, cells, frame: PatientFit, chunk_size) -> np.ndarray:
        """Scores clipped at 0 and normalised per cell: (n, k) float32, columns in
        ``populations_`` order (the estimator's classes are the same sorted names)."""
        scores = np.maximum(frame.estimator.decision_function(cells), 0.0)
        total = scores.sum(axis=1, keepdims=True)
        k = scores.shape[1]
        proba = np.divide(scores, total, out=np.full_like(scores, 1.0 / k), where=total > 0)
        return proba.astype(np.float32)

    def novelty(self, sample=None, embedding=None) -> Novelty:
        """Novelty of a patient (``embedding``: its PatientFit or embedding vector)."""
        self._check_fitted()
        if isinstance(embedding, PatientFit):
            embedding = embedding.embedding
        if embedding is None:
            sample = self._compensated(sample)
            raw = sample.events[:, self._channel_indices(sample)]
            embedding = self.embedder_.transform(self._standardise(raw[content_subsample(raw, self.embedding_cells)]))
        distances = np.sqrt(((self.train_embeddings_ - embedding) ** 2).sum(axis=1))
        nearest = int(np.argmin(distances))
        score = float(distances[nearest] / self.novelty_reference_)
        is_novel = bool(score > self.novelty_threshold_)
        name, peer = getattr(sample, "name", "this patient"), self.training_patients_[nearest]
        if is_novel:
            message = (f"{name} is unlike every training patient (novelty {score:.1f}, threshold "
                       f"{self.novelty_threshold_:.1f}; nearest: {peer}). Review its populations by hand.")
        else:
            message = (f"{name} resembles the training patients (novelty {score:.1f} <= "
                       f"{self.novelty_threshold_:.1f}; nearest: {peer}).")
        return Novelty(score, self.novelty_threshold_, is_novel, peer, message)

    def gate(self, sample, chunk_size=50_000, part=None) -> GateResult:
        """Refit for this patient and gate every event (file order): a GateResult, as
        :meth:`GatingModel.gate` returns. The same code path as a streamed file. The model is
        one part: ``part`` must be None."""
        self._check_fitted()
        self._check_part(part)
        sample = self._compensated(sample)
        events = sample.events
        codes = np.empty(sample.n_events, dtype=np.int16)
        confidence = np.empty(sample.n_events, dtype=np.float32)

        def chunks(size):
            for start in range(0, len(events), size):
                yield start, events[start:start + size]

        def sink(start, chunk, chunk_codes, chunk_confidence):
            codes[start:start + len(chunk)] = chunk_codes
            confidence[start:start + len(chunk)] = chunk_confidence

        result = self.gate_chunks(sample, chunks, chunk_size=chunk_size, sink=sink)
        populations = np.asarray(self.populations_, dtype=object)[codes]
        return GateResult(populations, confidence, result.novelty, list(self.populations_), result.counts)

    def predict(self, sample) -> np.ndarray:
        """Population of every event: (n_events,) str."""
        return self.gate(sample).populations

    def describe(self) -> dict:
        """A JSON-friendly summary (as GatingModel.describe)."""
        self._check_fitted()
        return {"method": self.method, "loss": "squared", "task_similarity": None, "channels": self.channels_,
                "markers": self.channel_markers_, "populations": self.populations_,
                "training_patients": self.training_patients_, "training_cells": int(len(self.cells_)),
                "bandwidth_x": self.bandwidth_, "bandwidth_p": None, "alpha": float(self.alpha),
                "n_landmarks": int(self.n_landmarks), "cv_accuracy": None, "pooled_weight": 0.0,
                "transform": self.transform_.to_dict()}

    # -- the model file -------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the model as .npz (arrays + JSON; no pickle), atomically
        (:func:`~gating_core.model.iw_file.save_iw_model`)."""
        self._check_fitted()
        save_iw_model(self, path)

    @classmethod
    def load(cls, path) -> "IWNystroemGatingModel":
        """Read a model written by :meth:`save`; anything else is a ModelFileError
        (:func:`~gating_core.model.iw_file.load_iw_model`)."""
        return load_iw_model(cls, path)


def load_any_model(path):
    """A GatingModel, a ResearchGatingModel or an IWNystroemGatingModel, whichever ``path`` holds
    (checked, no pickle)."""
    if model_file_format(path) == IW_FORMAT:
        return IWNystroemGatingModel.load(path)
    from gating_core.model.research import load_gating_model

    return load_gating_model(path)
