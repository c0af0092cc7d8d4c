"""``GatingModel``: learn gates from expert-gated patients, gate new patients from FCS samples.

It wraps :class:`~gating_core.classifier.MarginalTransferClassifier` with what files need:
channel matching by $PnN / $PnS, compensation, the per-channel transform, standardisation,
model selection over patients, a per-patient novelty score and a safe file format.

Model file: one ``.npz`` (``numpy.savez``) holding plain numeric arrays and one JSON document
(``meta``, a unicode array) with channels, transform, populations, hyperparameters and
versions. Loading never unpickles (``allow_pickle=False``), so a model sent by someone else
cannot run code.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator

from gating_core import __version__
from gating_core.classifier import (LOSSES, PATIENT_WEIGHTINGS, SCORE_BLOCK, SOLVERS, MarginalTransferClassifier,
                                   content_hashes, content_subsample)
from gating_core.cpus import with_blas_threads
from gating_core.errors import GatingCoreError
from gating_core.features import MeanEmbedding, ProductRFF
from gating_core.modelfile import Fields, ModelFileError, check_scalar, parse_json, read_archive
from gating_core.alignment import LEVELS, QuantileRegistration, channel_quantiles
from gating_core.priors import apply_prior_ratio, reestimate_prior, training_prior
from gating_core.transforms import ChannelTransform, default_transform, is_time_like

MODEL_FORMAT = "gating_core.model"
# 2: the pooled companion of the marginal method (files of format 1 load without one).
# 3: the companion's weight as fitted (pooled_weight="auto"); format-2 files use their parameter.
MODEL_FORMAT_VERSION = 3
METHODS = ("marginal", "pooling")
PRIOR_SHIFTS = ("none", "em")
ALIGNMENTS = ("none", "quantile")
DEFAULT_LOSS = "squared"
DEFAULT_AUGMENT = 4
#: Weight of the pooled companion in the marginal method's probabilities (see GatingModel).
#: "auto" (chosen by cross-validation over groups) is an option: measured on held-out centers
#: it did no better than the even blend (README, "Measured").
DEFAULT_POOLED_WEIGHT = 0.5
#: Penalty of the pooled companion's logistic fit: light, as a user would fit the plain baseline.
POOLED_ALPHA = 1e-5


class ChannelMismatchError(GatingCoreError, ValueError):
    """A sample lacks a channel the model needs (named in the message)."""


@dataclass
class Novelty:
    """How far a patient's cell distribution lies from the training patients'.

    ``score``: distance of its embedding to the nearest training embedding, divided by the
    median nearest-neighbour distance among training patients (1 = as close as a typical
    training patient is to its nearest peer). ``is_novel`` when ``score > threshold``.
    """

    score: float
    threshold: float
    is_novel: bool
    nearest_patient: str = ""
    message: str = ""

    def to_dict(self) -> dict:
        return {"score": self.score, "threshold": self.threshold, "is_novel": self.is_novel,
                "nearest_patient": self.nearest_patient, "message": self.message}


@dataclass
class GateResult:
    """Gating of one patient: per-cell population and confidence, per-patient novelty.

    ``populations``: (n_events,) object array of population names (str); ``confidence``:
    (n_events,) float32 in [0, 1], the probability of the assigned population.
    """

    populations: np.ndarray
    confidence: np.ndarray
    novelty: Novelty
    population_names: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    """Events per population, every population of the model listed (zeros included)."""


@dataclass
class StreamedGate:
    """What :meth:`GatingModel.gate_chunks` returns: the per-patient part of a
    :class:`GateResult` (the per-event results went to its ``sink``)."""

    novelty: Novelty
    counts: dict
    n_events: int
    mean_confidence: float
    population_names: list = field(default_factory=list)


@dataclass
class PatientDigest:
    """What training needs from one labeled patient, a few thousand rows instead of the file.

    Built by :func:`digest_patient` where the file is (locally, or on a Dask worker) so that
    only these rows travel. ``train_events`` / ``train_labels``: a seeded uniform draw of at
    most ``cells_per_patient`` events (the cells the solver sees; every patient weighs the same);
    ``embedding_events``: at most ``embedding_cells`` events chosen by content hash (the cells
    the patient's embedding is computed from, independent of event order). Events are
    compensated when the model compensates, on all channels of the file.
    """

    name: str
    channels: list
    keywords: dict
    n_events: int
    train_events: np.ndarray
    train_labels: np.ndarray
    embedding_events: np.ndarray


def digest_patient(sample, labels, cells_per_patient=4000, embedding_cells=20000, seed=0,
                   compensate=True) -> PatientDigest:
    """Reduce one labeled patient to a :class:`PatientDigest` (see there)."""
    labels = np.asarray(labels).astype(str)
    if len(labels) != sample.n_events:
        raise ValueError(f"{sample.name}: {sample.n_events} events but {len(labels)} labels")
    if compensate and sample.has_spillover and not sample.compensated:
        sample = sample.compensate()
    events = sample.events
    rng = np.random.default_rng(seed)
    draw = np.arange(len(events)) if len(events) <= cells_per_patient else np.sort(
        rng.choice(len(events), cells_per_patient, replace=False))
    hashed = [i for i, c in enumerate(sample.channels) if not is_time_like(c.pnn)] or list(range(events.shape[1]))
    chosen = content_subsample(events[:, hashed], embedding_cells)
    return PatientDigest(sample.name, list(sample.channels), dict(sample.keywords), sample.n_events,
                         np.ascontiguousarray(events[draw]), labels[draw], np.ascontiguousarray(events[chosen]))


class GatingModel(BaseEstimator):
    """Automatic gating learned from expert-gated patients.

    Parameters
    ----------
    method : {"marginal", "pooling"}, default="marginal"
        Marginal transfer (the patient's cell distribution is an input) or the pooling baseline.
    channels : list of str or None
        Channels to use ($PnN or $PnS); None: every channel all training patients share, except
        time / event-count channels and constant ones.
    transform : "auto" or ChannelTransform
    compensate : bool, default=True
        Apply a file's spillover matrix before gating.
    select : bool, default=True
        Choose bandwidths and penalty by cross-validation over patients.
    n_features, n_embedding_features, cells_per_patient, embedding_cells, solver,
    bandwidth_x, bandwidth_p, alpha, loss, n_augment, augment_gain, augment_shift,
    patient_weighting :
        Passed to :class:`MarginalTransferClassifier` (bandwidths in standardised units; set
        ones are kept out of the selection).
    pooled_weight : float in [0, 1] or "auto", default=0.5
        The marginal method's probabilities are ``(1 - w) p_marginal + w p_pooled``, where
        ``p_pooled`` comes from a companion that ignores the patient's distribution (a logistic
        regression on the same cell features, every patient weighing the same). The companion
        is the hedge for patients from centers unlike any training one, where the embedding
        extrapolates; averaging the two beat each alone when whole centers were held out
        (README, "Accuracy on centers the model has never seen"). 0: the marginal model alone.
        "auto": w from (0, 0.25, 0.5, 0.75, 1) by cross-validation over groups
        (:func:`~gating_core.selection.select_pooled_weight`), 0.5 unless another weight wins
        on held-out groups by more than 0.2 points (and 0.5 when ``select=False`` or there are
        fewer than two groups). Ignored by ``method="pooling"`` and by solvers other than ``"rff"``.
    prior_shift : {"none", "em"}, default="none"
        "em": re-estimate the population proportions of each gated patient from its own
        unlabeled cells (:mod:`gating_core.priors`) and adjust the probabilities to them.
    align : {"none", "quantile"}, default="none"
        "quantile": register each channel of every patient, training and new, onto reference
        landmarks before the classifier sees it (:mod:`gating_core.alignment`).
    cv_folds, cv_repeats, selection_cells_per_patient, selection_objective :
        model-selection settings (folds hold out whole groups of patients).
    random_state : int

    A scikit-learn estimator (``clone``, ``get_params``, ``set_params``) whose parameters are
    exactly those the model file stores. To scikit-learn's model selection one sample is one
    patient: ``X`` a sequence of samples, ``y`` their per-event label arrays, a splitter's
    ``groups`` the center of each patient (also passed to :meth:`fit` with
    ``params={"groups": centers}``), and :meth:`score` the mean per-patient accuracy::

        cross_val_score(GatingModel(), samples, labels, groups=centers, cv=LeaveOneGroupOut())

    Attributes
    ----------
    channels_ : list of str ($PnN of the first training patient)
    channel_markers_ : list of str ($PnS)
    transform_ : ChannelTransform
    center_, scale_ : ndarray (d,)  standardisation after the transform
    classifier_ : MarginalTransferClassifier
    reference_quantiles_ : ndarray (d, q) or None  landmarks of ``align="quantile"``
    class_prior_ : ndarray (k,)  population shares of the training patients (each weighing the same)
    pooled_classifier_ : MarginalTransferClassifier or None
        The pooled companion (see ``pooled_weight``); None when there is none.
    pooled_weight_ : float  the companion's weight in use (0 when there is no companion)
    populations_ : list of str
    training_patients_ : list of str
    selection_ : dict  the chosen parameters and the CV table
    groups_ : list of str  the group of each training patient (given, or inferred)
    groups_inferred_ : bool  True when the groups were found from the embeddings
    novelty_reference_, novelty_threshold_ : float
    """

    def __init__(self, method="marginal", channels=None, transform="auto", compensate=True, select=True,
                 n_features=512, n_embedding_features=128, cells_per_patient=4000, embedding_cells=20000,
                 solver="rff", bandwidth_x=None, bandwidth_p=None, alpha=None, loss=DEFAULT_LOSS,
                 n_augment=DEFAULT_AUGMENT, augment_gain=0.08, augment_shift=0.15, patient_weighting="uniform",
                 pooled_weight=DEFAULT_POOLED_WEIGHT, prior_shift="none", align="none", cv_folds=5, cv_repeats=2,
                 selection_cells_per_patient=1500, selection_objective="mean", random_state=0):
        self.method = method
        self.channels = channels
        self.transform = transform
        self.compensate = compensate
        self.select = select
        self.n_features = n_features
        self.n_embedding_features = n_embedding_features
        self.cells_per_patient = cells_per_patient
        self.embedding_cells = embedding_cells
        self.solver = solver
        self.bandwidth_x = bandwidth_x
        self.bandwidth_p = bandwidth_p
        self.alpha = alpha
        self.loss = loss
        self.n_augment = n_augment
        self.augment_gain = augment_gain
        self.augment_shift = augment_shift
        self.patient_weighting = patient_weighting
        self.pooled_weight = pooled_weight
        self.prior_shift = prior_shift
        self.align = align
        self.cv_folds = cv_folds
        self.cv_repeats = cv_repeats
        self.selection_cells_per_patient = selection_cells_per_patient
        self.selection_objective = selection_objective
        self.random_state = random_state

    # -- training ------------------------------------------------------------------------------

    def fit(self, samples, labels, progress=None, groups=None):
        """Learn from expert-gated patients.

        Parameters
        ----------
        samples : list of Sample
        labels : list of ndarray of shape (n_events_i,), population names
        progress : callable(stage: str, fraction: float) or None
        groups : sequence of length n_patients or None
            Center / batch / run of each patient. Model selection holds out whole groups.
            None: near-duplicate patients are found from their embeddings
            (:func:`gating_core.groups.infer_groups`) and kept together.
        """
        if len(samples) != len(labels):
            raise ValueError(f"{len(samples)} patients but {len(labels)} label arrays")
        if progress is not None:
            progress("Preparing channels", 0.0)
        digests = [digest_patient(s, y, self.cells_per_patient, self.embedding_cells,
                                  seed=self.digest_seed(i), compensate=self.compensate)
                   for i, (s, y) in enumerate(zip(samples, labels))]
        return self.fit_digests(digests, progress=progress, groups=groups)

    def digest_seed(self, index: int) -> np.random.SeedSequence:
        """Seed of the training-cell draw of the ``index``-th patient (documented, reproducible)."""
        return np.random.SeedSequence([int(self.random_state or 0), 10, int(index)])

    @with_blas_threads  # BLAS sized from the free CPUs: no stalls beside other CPU-bound work
    def fit_digests(self, digests, progress=None, groups=None):
        """Learn from :class:`PatientDigest` objects (what :meth:`fit` does after digesting).

        ``train --workers`` builds the digests on a Dask cluster, where the files are, and
        calls this; the result is identical to :meth:`fit` on the same files.
        """
        report = progress or (lambda stage, fraction: None)
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if len(digests) == 0:
            raise ValueError("no training patients")
        if self.method == "marginal" and len(digests) < 2:
            raise ValueError("marginal transfer learns across patients: give at least two labeled patients")
        report("Transforming events", 0.05)
        cells, embedding_cells, labels = self.prepare_digests(digests)
        samples = digests
        self._set_groups(groups, embedding_cells, [d.name for d in digests])

        params = self._classifier_params()
        self.selection_ = {}
        wants_search = self.bandwidth_x is None or self.alpha is None or (self.method == "marginal" and self.bandwidth_p is None)
        if self.select and len(samples) >= 2 and wants_search:
            from gating_core.selection import select_hyperparameters

            report("Model selection (cross-validation over patients)", 0.15)
            result = select_hyperparameters(
                cells, labels, MarginalTransferClassifier(**params), embedding_samples=embedding_cells,
                cv_folds=self.cv_folds, cv_repeats=self.cv_repeats, cells_per_patient=self.selection_cells_per_patient,
                progress=lambda f: report("Model selection (cross-validation over patients)", 0.15 + 0.65 * f),
                groups=self.groups_, objective=self.selection_objective)
            for key in ("bandwidth_x", "bandwidth_p", "alpha"):
                if params[key] is None:
                    params[key] = result.params[key]
            if self.bandwidth_p is None and not result.params["use_embedding"]:
                params["use_embedding"], params["bandwidth_p"] = False, None
            self.selection_ = {"params": {k: params[k] for k in ("bandwidth_x", "bandwidth_p", "alpha")},
                               "embedding_kept": bool(params["use_embedding"]),
                               "cv_accuracy": result.score, "median_x": result.median_x,
                               "median_p": result.median_p, "table": result.table}
        if self.loss == "logistic" and self.alpha is None:
            from gating_core.selection import select_logistic_alpha

            report("Choosing the logistic penalty (cross-validation over groups)", 0.7)
            params["alpha"] = select_logistic_alpha(cells, labels, MarginalTransferClassifier(**params),
                                                    embedding_samples=embedding_cells, groups=self.groups_,
                                                    cv_folds=self.cv_folds,
                                                    cells_per_patient=self.selection_cells_per_patient)
            self.selection_.setdefault("params", {})["alpha"] = params["alpha"]
        if params["alpha"] is None:
            params["alpha"] = 1e-4
        report("Fitting the final model", 0.8)
        self.classifier_ = MarginalTransferClassifier(**params).fit(cells, labels, embedding_samples=embedding_cells,
                                                                    groups=self.groups_)
        self.pooled_classifier_, self.pooled_weight_ = None, 0.0
        if self._wants_companion():
            self.pooled_weight_ = self._choose_pooled_weight(cells, labels, embedding_cells, params, report)
        if self.pooled_weight_ > 0:
            report("Fitting the pooled companion", 0.9)
            self.pooled_classifier_ = MarginalTransferClassifier(**self._companion_params(params)).fit(
                cells, labels, embedding_samples=embedding_cells, groups=self.groups_)
        self.populations_ = [str(c) for c in self.classifier_.classes_]
        self.class_prior_ = training_prior(labels, self.classifier_.classes_)
        self.training_patients_ = [s.name for s in samples]
        self._fit_novelty()
        report("Done", 1.0)
        return self

    def _wants_companion(self) -> bool:
        if isinstance(self.pooled_weight, str):
            if self.pooled_weight != "auto":
                raise ValueError(f"pooled_weight must be 'auto' or within [0, 1], got {self.pooled_weight!r}")
        elif not 0.0 <= float(self.pooled_weight) <= 1.0:
            raise ValueError(f"pooled_weight must be 'auto' or within [0, 1], got {self.pooled_weight!r}")
        return self.method == "marginal" and self.solver == "rff" and self.pooled_weight != 0

    def _choose_pooled_weight(self, cells, labels, embedding_cells, params, report) -> float:
        if self.pooled_weight != "auto":
            return float(self.pooled_weight)
        from gating_core.selection import PREFERRED_POOLED_WEIGHT, select_pooled_weight

        if not self.select:
            return PREFERRED_POOLED_WEIGHT
        report("Weighing the pooled companion (cross-validation over groups)", 0.82)
        result = select_pooled_weight(
            cells, labels, MarginalTransferClassifier(**params),
            MarginalTransferClassifier(**self._companion_params(params)), embedding_samples=embedding_cells,
            groups=self.groups_, cv_folds=self.cv_folds, cells_per_patient=self.selection_cells_per_patient,
            objective=self.selection_objective,
            progress=lambda f: report("Weighing the pooled companion (cross-validation over groups)", 0.82 + 0.07 * f))
        self.selection_["pooled_weight"] = {"chosen": result.weight, "folds": result.n_folds,
                                            "cv_accuracy": {str(w): s for w, s in result.table.items()}}
        return result.weight

    def _companion_params(self, params: dict) -> dict:
        """The pooled companion: the main model's cell bandwidth and features, no embedding,
        logistic loss, no augmentation, every patient weighing the same."""
        return {**params, "use_embedding": False, "bandwidth_p": None, "loss": "logistic", "alpha": POOLED_ALPHA,
                "n_augment": 0, "patient_weighting": "uniform", "bandwidth_x": self.classifier_.bandwidth_x_}

    def _set_groups(self, groups, embedding_cells, names):
        if groups is not None:
            groups = [str(g) for g in groups]
            if len(groups) != len(names):
                raise ValueError(f"{len(groups)} group labels for {len(names)} patients")
            self.groups_, self.groups_inferred_ = groups, False
            return
        self.groups_ = infer_cell_groups(embedding_cells, names, self.n_embedding_features, self.random_state)
        self.groups_inferred_ = True

    def prepare_digests(self, digests):
        """Choose channels, transform and standardisation from training digests.

        Returns, per patient, the standardised training cells (m_i, d), the standardised cells
        its embedding is computed from (e_i, d) and the training cells' labels (m_i,).
        """
        patients = [_DigestView(d) for d in digests]
        self._choose_channels(patients)
        indices = [self._channel_indices(v) for v in patients]
        embedding_raw = [d.embedding_events[:, i] for d, i in zip(digests, indices)]
        self._fit_scales(embedding_raw, patients[0])
        cells = [self._standardise(d.train_events[:, i]) for d, i in zip(digests, indices)]
        embedding_cells = [self._standardise(r) for r in embedding_raw]
        self.reference_quantiles_ = None
        if self.align not in ALIGNMENTS:
            raise ValueError(f"align must be one of {ALIGNMENTS}, got {self.align!r}")
        if self.align == "quantile":
            landmarks = [channel_quantiles(e) for e in embedding_cells]
            self.reference_quantiles_ = np.mean(landmarks, axis=0)
            maps = [QuantileRegistration(q, self.reference_quantiles_) for q in landmarks]
            cells = [m.transform(x) for m, x in zip(maps, cells)]
            embedding_cells = [m.transform(e) for m, e in zip(maps, embedding_cells)]
        return cells, embedding_cells, [d.train_labels for d in digests]

    def _fit_scales(self, raw_parts, first):
        """The transform (unless given) and the standardisation, from raw events on channels_."""
        if isinstance(self.transform, ChannelTransform):
            self.transform_ = self.transform
        else:
            pooled = np.vstack([r[: 20000] for r in raw_parts])
            ranges = [first.channels[i].range for i in self._channel_indices(first)]
            self.transform_ = default_transform(self.channels_, pooled, first.keywords, ranges)
        pooled = np.vstack([self.transform_.apply(r[content_subsample(r, 5000)]) for r in raw_parts])
        self.center_ = pooled.mean(axis=0).astype(np.float32)
        scale = pooled.std(axis=0)
        self.scale_ = np.where(scale > 0, scale, 1.0).astype(np.float32)

    def standardised_cells(self, sample) -> np.ndarray:
        """A sample's events on the model's channels as the classifier sees them: transformed,
        standardised (and registered, with ``align="quantile"``): (n, d)."""
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        cells = self._standardise(sample.events[:, indices])
        if getattr(self, "reference_quantiles_", None) is None:
            return cells
        return self._registered(cells, self._chosen_cells(sample.events, indices)[0])

    def _classifier_params(self) -> dict:
        return dict(use_embedding=self.method == "marginal", solver=self.solver, n_features=self.n_features,
                    n_embedding_features=self.n_embedding_features, bandwidth_x=self.bandwidth_x,
                    bandwidth_p=self.bandwidth_p if self.method == "marginal" else None, alpha=self.alpha,
                    loss=self.loss, n_augment=self.n_augment, augment_gain=self.augment_gain,
                    augment_shift=self.augment_shift, patient_weighting=self.patient_weighting,
                    cells_per_patient=self.cells_per_patient, embedding_cells=self.embedding_cells,
                    random_state=self.random_state)

    def _compensated(self, sample):
        from gating_core.interop import as_sample  # a flowkit.Sample or an AnnData is welcome too

        sample = as_sample(sample)
        if self.compensate and sample.has_spillover and not sample.compensated:
            return sample.compensate()
        return sample

    def _choose_channels(self, samples):
        first = samples[0]
        if self.channels is not None:
            wanted = list(self.channels)
        else:
            wanted = [c.pnn for c in first.channels if not is_time_like(c.pnn)]
        kept, markers = [], []
        for name in wanted:
            index = _find_channel(first, name)
            if index is None:
                raise ChannelMismatchError(f"{first.name}: no channel {name!r} (channels: {', '.join(first.pnn)})")
            channel = first.channels[index]
            if self.channels is None:
                if any(_find_channel(s, channel.pnn, channel.pns) is None for s in samples[1:]):
                    continue  # not shared by every training patient
                column = first.events[: 100000, index]
                if len(column) and float(np.nanmax(column)) == float(np.nanmin(column)):
                    continue  # constant: carries nothing
            kept.append(channel.pnn)
            markers.append(channel.pns)
        if not kept:
            raise ChannelMismatchError("the training patients share no usable channel")
        self.channels_, self.channel_markers_ = kept, markers
        for s in samples[1:]:
            self._channel_indices(s)

    def _channel_indices(self, sample) -> list[int]:
        indices, missing = [], []
        for pnn, pns in zip(self.channels_, self.channel_markers_):
            index = _find_channel(sample, pnn, pns)
            if index is None:
                missing.append(f"{pnn} ({pns})" if pns and pns != pnn else pnn)
            indices.append(index)
        if missing:
            raise ChannelMismatchError(
                f"{sample.name}: missing channel{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"needed by the model (file has: {', '.join(sample.pnn)})")
        return indices

    def _standardise(self, raw: np.ndarray) -> np.ndarray:
        out = self.transform_.apply(raw)
        out -= self.center_
        out /= self.scale_
        return out

    def _fit_novelty(self):
        embeddings = self._patient_embeddings()
        if len(embeddings) < 2:
            self.novelty_nn_ = np.zeros(len(embeddings))
            self.novelty_reference_ = 1.0
            self.novelty_threshold_ = np.inf
            return
        d = np.sqrt(((embeddings[:, None] - embeddings[None]) ** 2).sum(-1))
        np.fill_diagonal(d, np.inf)
        nn = d.min(axis=1)
        self.novelty_nn_ = nn
        self.novelty_reference_ = float(np.median(nn)) or 1e-12
        # A training patient's own distance to its nearest peer, in reference units, is what
        # "seen before" looks like; beyond the farthest of those (with a margin) is new.
        self.novelty_threshold_ = float(max(1.5, 1.25 * nn.max() / self.novelty_reference_))

    def _patient_embeddings(self) -> np.ndarray:
        """Embeddings of the real training patients (augmented copies excluded)."""
        return self.classifier_.train_embeddings_[: len(self.training_patients_)]

    # -- gating --------------------------------------------------------------------------------

    def _check_fitted(self):
        if not hasattr(self, "classifier_"):
            raise RuntimeError("this GatingModel is not fitted yet: call fit() or GatingModel.load()")

    def patient_embedding(self, sample) -> np.ndarray:
        """Psi of a patient (after compensation): ndarray (2L,)."""
        self._check_fitted()
        sample = self._compensated(sample)
        return self._embedding(sample.events, self._channel_indices(sample))

    def _embedding(self, events, indices) -> np.ndarray:
        """Psi from the content-chosen cells of ``events`` (n, all channels) on ``indices``."""
        return self._patient_frame(events, indices)[1]

    def _patient_frame(self, events, indices):
        """What gating one patient needs from its content-chosen cells (the same whatever the
        chunking): its registration (``align="quantile"``, else None), its embedding Psi (2L,)
        and those cells, standardised and registered (m, d)."""
        registration, chosen = self._chosen_cells(events, indices)
        return registration, self.classifier_.embed(chosen), chosen

    def _chosen_cells(self, events, indices):
        """The patient's registration (or None) and its content-chosen cells, registered."""
        raw = events[:, indices]
        chosen = self._standardise(raw[content_subsample(raw, self.embedding_cells)])
        if getattr(self, "reference_quantiles_", None) is None:
            return None, chosen
        registration = QuantileRegistration(channel_quantiles(chosen), self.reference_quantiles_)
        return registration, registration.transform(chosen)

    @staticmethod
    def _registered(cells, registration):
        return cells if registration is None else registration.transform(cells)

    def novelty(self, sample=None, embedding=None) -> Novelty:
        """Novelty of a patient relative to the training patients (see :class:`Novelty`)."""
        self._check_fitted()
        if embedding is None:
            embedding = self.patient_embedding(sample)
        distances = np.sqrt(((self._patient_embeddings() - embedding) ** 2).sum(axis=1))
        nearest = int(np.argmin(distances))
        score = float(distances[nearest] / self.novelty_reference_)
        is_novel = bool(score > self.novelty_threshold_)
        name = getattr(sample, "name", "this patient")
        if is_novel:
            message = (f"{name} is unlike every training patient (novelty {score:.1f}, threshold "
                       f"{self.novelty_threshold_:.1f}; nearest: {self.training_patients_[nearest]}). "
                       "Review its gates by hand.")
        else:
            message = (f"{name} resembles the training patients (novelty {score:.1f} <= "
                       f"{self.novelty_threshold_:.1f}; nearest: {self.training_patients_[nearest]}).")
        return Novelty(score, self.novelty_threshold_, is_novel, self.training_patients_[nearest], message)

    def gate(self, sample, chunk_size=50_000) -> GateResult:
        """Gate one patient: population and confidence of every event, in file order.

        ``sample``: a :class:`~gating_core.fcs.Sample`, a ``flowkit.Sample`` or an AnnData
        (converted by :func:`gating_core.interop.as_sample`)."""
        self._check_fitted()
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        events = sample.events
        registration, embedding, chosen = self._patient_frame(events, indices)
        ratio = self._prior_ratio(chosen, embedding)
        n = sample.n_events
        # Chunks are whole multiples of the scoring block, so every cell is scored in the same
        # block whatever chunk_size is: results are bitwise independent of it.
        chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
        codes = np.empty(n, dtype=np.int16)
        confidence = np.empty(n, dtype=np.float32)
        for start in range(0, n, chunk_size):
            cells = self._registered(self._standardise(events[start:start + chunk_size][:, indices]), registration)
            proba = self._proba(cells, embedding, chunk_size)
            if ratio is not None:
                apply_prior_ratio(proba, ratio)
            best = np.argmax(proba, axis=1)
            codes[start:start + len(cells)] = best
            confidence[start:start + len(cells)] = proba[np.arange(len(best)), best]
        # An object array shares one str per population: 8 bytes per event instead of 4 x the
        # longest name, which matters on files of millions of events.
        populations = np.asarray(self.populations_, dtype=object)[codes] if n else np.array([], dtype=object)
        counts = np.bincount(codes, minlength=len(self.populations_)) if n else np.zeros(len(self.populations_), int)
        return GateResult(populations, confidence, self.novelty(sample, embedding), list(self.populations_),
                          {name: int(c) for name, c in zip(self.populations_, counts)})

    def predict(self, sample) -> np.ndarray:
        """Population of every event of ``sample``: (n_events,) str."""
        return self.gate(sample).populations

    def predict_proba(self, sample) -> np.ndarray:
        """Probability of each population (columns in ``populations_`` order): (n_events, k)."""
        self._check_fitted()
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        registration, embedding, chosen = self._patient_frame(sample.events, indices)
        cells = self._registered(self._standardise(sample.events[:, indices]), registration)
        proba = self._proba(cells, embedding, 50_000)
        ratio = self._prior_ratio(chosen, embedding)
        return proba if ratio is None else apply_prior_ratio(proba, ratio)

    def _prior_ratio(self, chosen, embedding):
        """New prior / training prior of this patient (``prior_shift="em"``), else None.

        Estimated on the content-chosen cells the embedding comes from (``chosen``, (m, d)),
        so it is bounded in cost and identical whatever the chunking."""
        if self.prior_shift == "none":
            return None
        if self.prior_shift not in PRIOR_SHIFTS:
            raise ValueError(f"prior_shift must be one of {PRIOR_SHIFTS}, got {self.prior_shift!r}")
        prior = reestimate_prior(self._proba(chosen, embedding, 50_000), self.class_prior_)
        return (prior / self.class_prior_).astype(np.float32)

    def _proba(self, cells, embedding, chunk_size) -> np.ndarray:
        """Probabilities of standardised cells of one patient: the marginal model's, blended
        with the pooled companion's (``pooled_weight``) when there is one."""
        proba = self.classifier_.predict_proba(cells, embedding, chunk_size=chunk_size)
        companion = getattr(self, "pooled_classifier_", None)
        if companion is not None:
            weight = np.float32(self.pooled_weight_)
            proba *= np.float32(1.0) - weight
            proba += weight * companion.predict_proba(cells, embedding, chunk_size=chunk_size)
        return proba

    @with_blas_threads
    def gate_chunks(self, sample, chunks, chunk_size=50_000, sink=None) -> "StreamedGate":
        """Gate one patient whose events arrive in chunks: memory bounded by a few chunks and
        the ``embedding_cells`` content-chosen cells, whatever the number of events.

        The result equals :meth:`gate` on the whole sample bit for bit: a first pass keeps the
        rows with the smallest content hashes (the cells :func:`content_subsample` chooses),
        from which the embedding, registration and prior ratio follow; a second pass scores
        every chunk.

        Parameters
        ----------
        sample : Sample
            Describes the patient (name, channels, spillover); its ``events`` are not used.
            The chunks must already be compensated when the model compensates.
        chunks : callable(chunk_events) -> iterable of (start, events)
            Called twice (two passes over the file). Yields the events (m, n_channels) in file
            order, ``m == chunk_events`` except for the last window
            (:meth:`gating_core.fcs.EventStream.chunks` does).
        chunk_size : int
            Events scored at a time (rounded up to whole scoring blocks, as in :meth:`gate`).
        sink : callable(start, events, codes, confidence) or None
            Receives each scored chunk: the events as read (m, n_channels), the population
            codes (m,) int16 into ``populations_`` and the confidences (m,) float32.

        Returns
        -------
        StreamedGate (novelty, counts, number of events, mean confidence).
        """
        self._check_fitted()
        if self.compensate and sample.has_spillover and not sample.compensated:
            raise ValueError(f"{sample.name}: gate_chunks needs compensated chunks (the model compensates)")
        indices = self._channel_indices(sample)
        chosen_raw, n = self._content_chosen_rows(chunks, indices, max(SCORE_BLOCK, int(chunk_size)))
        registration, embedding, chosen = self._patient_frame(chosen_raw, list(range(len(indices))))
        ratio = self._prior_ratio(chosen, embedding)
        chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
        counts = np.zeros(len(self.populations_), dtype=np.int64)
        total_confidence, seen = 0.0, 0
        for start, events in chunks(chunk_size):
            if start != seen or (len(events) != chunk_size and start + len(events) != n):
                raise ValueError(f"{sample.name}: chunks must come in order, {chunk_size} events each")
            cells = self._registered(self._standardised_rows(events, indices), registration)
            proba = self._proba(cells, embedding, chunk_size)
            if ratio is not None:
                apply_prior_ratio(proba, ratio)
            codes = np.argmax(proba, axis=1).astype(np.int16)
            confidence = proba[np.arange(len(codes)), codes].astype(np.float32, copy=False)
            counts += np.bincount(codes, minlength=len(self.populations_))
            total_confidence += float(confidence.sum(dtype=np.float64))
            seen += len(events)
            if sink is not None:
                sink(start, events, codes, confidence)
        if seen != n:
            raise ValueError(f"{sample.name}: the second pass gave {seen} events, the first {n}")
        return StreamedGate(self.novelty(sample, embedding), {p: int(c) for p, c in zip(self.populations_, counts)},
                            n, total_confidence / n if n else 0.0, list(self.populations_))

    def _standardised_rows(self, events, indices) -> np.ndarray:
        """``_standardise(events[:, indices])`` computed on row blocks in parallel (the
        transform is element-wise, so the result is the same bits)."""
        from gating_core.fcs import parallel_rows

        cells = np.empty((len(events), len(indices)), dtype=np.float32)

        def run(bounds):
            lo, hi = bounds
            cells[lo:hi] = self._standardise(events[lo:hi][:, indices])

        parallel_rows(run, len(events))
        return cells

    def _content_chosen_rows(self, chunks, indices, chunk_events):
        """First pass of :meth:`gate_chunks`: the raw rows (model channels, file order) that
        ``content_subsample(events[:, indices], embedding_cells)`` picks, and the event count.

        Keeps the rows of the smallest hashes seen so far (with ties at the cut, which only
        identical rows share); when tied rows straddle the final cut (the order-dependent
        choice ``argpartition`` makes among them), hashes every row once more and lets
        ``content_subsample``'s own selection decide, so the result is always the same."""
        k = int(self.embedding_cells)
        kept_hash = np.empty(0, dtype=np.uint64)
        kept_index = np.empty(0, dtype=np.int64)
        kept_rows = None
        n = 0
        for start, events in chunks(chunk_events):
            raw = events[:, indices]
            kept_hash = np.concatenate([kept_hash, content_hashes(raw)])
            kept_index = np.concatenate([kept_index, np.arange(start, start + len(raw), dtype=np.int64)])
            kept_rows = raw if kept_rows is None else np.concatenate([kept_rows, raw])
            n = start + len(raw)
            if len(kept_hash) > k:
                keep = kept_hash <= np.partition(kept_hash, k - 1)[k - 1]
                kept_hash, kept_index, kept_rows = kept_hash[keep], kept_index[keep], kept_rows[keep]
        if kept_rows is None:
            return np.empty((0, len(indices)), dtype=np.float32), 0
        if n <= k:
            return kept_rows, n
        cut = np.partition(kept_hash, k - 1)[k - 1]
        below = kept_hash < cut
        tied = kept_hash == cut
        if int(tied.sum()) == k - int(below.sum()):
            return kept_rows[below | tied], n
        # Tied rows straddle the cut: reproduce argpartition's choice on all the hashes.
        hashes = np.empty(n, dtype=np.uint64)
        for start, events in chunks(chunk_events):
            hashes[start:start + len(events)] = content_hashes(events[:, indices])
        chosen = np.sort(np.argpartition(hashes, k - 1)[:k])
        del hashes
        rows = []
        for start, events in chunks(chunk_events):
            local = chosen[(chosen >= start) & (chosen < start + len(events))] - start
            rows.append(events[local][:, indices])
        return np.concatenate(rows), n

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the model as .npz (arrays + JSON; no pickle), atomically."""
        self._check_fitted()
        clf = self.classifier_
        meta = {
            "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION,
            "gating_core_version": __version__, "numpy_version": np.__version__,
            "python_version": platform.python_version(),
            "params": {k: (v if not isinstance(v, ChannelTransform) else "custom") for k, v in self.get_params().items()},
            "channels": self.channels_, "channel_markers": self.channel_markers_,
            "transform": self.transform_.to_dict(), "populations": self.populations_,
            "training_patients": self.training_patients_,
            "groups": self.groups_, "groups_inferred": self.groups_inferred_,
            "classifier": {k: v for k, v in clf.get_params().items()},
            "fitted": {"bandwidth_x": clf.bandwidth_x_, "bandwidth_p": clf.bandwidth_p_,
                       "bandwidth_embedding": clf.bandwidth_embedding_, "temperature": clf.temperature_,
                       "n_features_in": clf.n_features_in_},
            "novelty": {"reference": self.novelty_reference_, "threshold": self.novelty_threshold_},
            "selection": {k: v for k, v in self.selection_.items() if k != "table"},
        }
        companion = getattr(self, "pooled_classifier_", None)
        if companion is not None:
            meta["pooled"] = {"classifier": companion.get_params(), "bandwidth_x": companion.bandwidth_x_,
                              "temperature": companion.temperature_, "weight": float(self.pooled_weight_)}
        arrays = {
            "meta": np.array(json.dumps(meta)),
            "center": self.center_, "scale": self.scale_,
            "coef": clf.coef_, "intercept": clf.intercept_,
            "train_embeddings": clf.train_embeddings_, "embedding_frequencies": clf.embedder_.frequencies_,
            "novelty_nn": self.novelty_nn_, "class_prior": self.class_prior_,
        }
        if clf.solver == "rff":
            fm = clf.feature_map_
            arrays.update(cell_weights=fm.cell_weights_, offsets=fm.offsets_)
            if fm.embedding_weights_ is not None:
                arrays["embedding_weights"] = fm.embedding_weights_
        else:
            arrays.update(landmark_cells=clf.landmark_cells_, landmark_embeddings=clf.landmark_embeddings_,
                          landmark_projection=clf.landmark_projection_)
        if getattr(self, "reference_quantiles_", None) is not None:
            arrays["reference_quantiles"] = self.reference_quantiles_
        if companion is not None:
            arrays.update(pooled_coef=companion.coef_, pooled_intercept=companion.intercept_,
                          pooled_cell_weights=companion.feature_map_.cell_weights_,
                          pooled_offsets=companion.feature_map_.offsets_)
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "GatingModel":
        """Read a model written by :meth:`save`; raises ModelFileError for anything else.

        The file is read by :func:`gating_core.modelfile.read_archive` (bounded memory, no
        pickle, declared sizes checked before decompressing); the JSON description is checked
        field by field and the arrays' shapes against it (see :meth:`_from_parts`).
        """
        path = Path(path)
        arrays = read_archive(path)
        if "meta" not in arrays:
            raise ModelFileError(path, "not a gating model file (no model description inside)")
        meta = parse_json(path, str(arrays.pop("meta")))
        if meta.get("format") != MODEL_FORMAT:
            raise ModelFileError(path, "not a gating model file (unknown format tag)")
        version = meta.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ModelFileError(path, f"model description: format_version must be a positive integer, got {version!r}"[:200])
        if version > MODEL_FORMAT_VERSION:
            raise ModelFileError(path, f"written by a newer gating_core (format {version}); upgrade to read it")
        try:
            return cls._from_parts(meta, arrays, path=path)
        except ModelFileError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ModelFileError(path, f"model file is incomplete or inconsistent ({exc})") from None

    @classmethod
    def _from_parts(cls, meta, arrays, path="model") -> "GatingModel":
        """Build a fitted model from a checked description and arrays (see :meth:`load`).

        Every field is type-checked (:class:`~gating_core.modelfile.Fields`); hyperparameters
        must be ones the constructors accept; array shapes must agree with each other and with
        the description. A violation is a ModelFileError.
        """
        top = Fields(path, meta, "model")
        params = _model_params(path, top.object("params"), inspect.signature(cls).parameters)
        model = cls(**params)
        model.channels_ = top.strings("channels", min_length=1, unique=True)
        d = len(model.channels_)
        model.channel_markers_ = top.strings("channel_markers")
        if len(model.channel_markers_) != d:
            raise ValueError(f"{d} channels but {len(model.channel_markers_)} markers")
        model.transform_ = _transform(path, top.object("transform"), d)
        model.populations_ = top.strings("populations", min_length=2, unique=True)
        model.training_patients_ = top.strings("training_patients", min_length=1)
        n_patients = len(model.training_patients_)
        model.groups_ = top.strings("groups", optional=True) or list(model.training_patients_)
        if len(model.groups_) != n_patients:
            raise ModelFileError(path, f"model description: {len(model.groups_)} groups for {n_patients} patients")
        model.groups_inferred_ = bool(top.boolean("groups_inferred", optional=True))
        selection = top.object("selection", optional=True)
        model.selection_ = dict(selection.data) if selection is not None else {}
        if selection is not None:
            selection.number("cv_accuracy", optional=True, nullable=True)
        novelty = top.object("novelty")
        model.novelty_reference_ = novelty.number("reference", positive=True)
        model.novelty_threshold_ = novelty.number("threshold", positive=True, allow_inf=True)
        clf = MarginalTransferClassifier(**_classifier_params(
            path, top.object("classifier"), inspect.signature(MarginalTransferClassifier).parameters))
        fitted = top.object("fitted")
        clf.classes_ = np.asarray(model.populations_)
        clf.n_features_in_ = fitted.integer("n_features_in", minimum=d, maximum=d)
        clf.bandwidth_x_ = fitted.number("bandwidth_x", positive=True)
        clf.bandwidth_p_ = fitted.number("bandwidth_p", positive=True, nullable=True)
        clf.bandwidth_embedding_ = fitted.number("bandwidth_embedding", positive=True)
        clf.temperature_ = fitted.number("temperature", positive=True, within=(0, 1e6))

        def array(name, *shape):
            """The named array, its shape checked; None in ``shape`` takes any length there."""
            if name not in arrays:
                raise ModelFileError(path, f"model file is incomplete (no array {name!r})")
            value = arrays[name]
            if len(value.shape) != len(shape) or any(want is not None and got != want
                                                     for got, want in zip(value.shape, shape)):
                expected = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ")"
                raise ModelFileError(path, f"model file is inconsistent: array {name!r} has shape "
                                           f"{value.shape}, expected {expected} from its description")
            return value

        k, n_patients = len(model.populations_), len(model.training_patients_)
        model.center_ = array("center", d).astype(np.float32, copy=False)
        model.scale_ = array("scale", d).astype(np.float32, copy=False)
        if not np.all(model.scale_ != 0):
            raise ModelFileError(path, "model file is inconsistent: array 'scale' holds zeros")
        model.novelty_nn_ = array("novelty_nn", n_patients)
        # Format 1 files hold no training prior: uniform, used only by prior_shift="em".
        model.class_prior_ = (array("class_prior", k).astype(np.float64) if "class_prior" in arrays
                              else np.full(k, 1.0 / k))
        if not (np.all(model.class_prior_ > 0) and abs(model.class_prior_.sum() - 1) < 1e-6):
            raise ModelFileError(path, "model file is inconsistent: array 'class_prior' is not a distribution")
        model.reference_quantiles_ = None
        if model.align == "quantile":
            landmarks = array("reference_quantiles", d, len(LEVELS)).astype(np.float64)
            if not np.all(np.diff(landmarks, axis=1) > 0):
                raise ModelFileError(path, "model file is inconsistent: 'reference_quantiles' are not increasing")
            model.reference_quantiles_ = landmarks
        frequencies = array("embedding_frequencies", d, None).astype(np.float64, copy=False)
        n_embedding = frequencies.shape[1]
        if n_embedding < 1:
            raise ModelFileError(path, "model file is inconsistent: no embedding frequencies")
        # Training rows: the real patients, then their augmented copies.
        clf.train_embeddings_ = array("train_embeddings", n_patients * (1 + int(clf.n_augment)),
                                      2 * n_embedding).astype(np.float64, copy=False)
        clf.n_patients_ = n_patients
        clf.coef_ = array("coef", None, k).astype(np.float32, copy=False)
        n_out = clf.coef_.shape[0]
        clf.intercept_ = array("intercept", k).astype(np.float32, copy=False)
        embedder = MeanEmbedding.__new__(MeanEmbedding)
        embedder.frequencies_ = frequencies
        embedder.n_features = n_embedding
        embedder.bandwidth = clf.bandwidth_embedding_
        clf.embedder_ = embedder
        if clf.solver == "rff":
            fm = ProductRFF.__new__(ProductRFF)
            fm.cell_weights_ = array("cell_weights", d, n_out).astype(np.float32, copy=False)
            fm.offsets_ = array("offsets", n_out).astype(np.float64, copy=False)
            uses_embedding = clf.use_embedding and clf.bandwidth_p_ is not None
            if uses_embedding:
                fm.embedding_weights_ = array("embedding_weights", 2 * n_embedding, n_out).astype(np.float64, copy=False)
            elif "embedding_weights" in arrays:
                raise ModelFileError(path, "model file is inconsistent: embedding weights in a model that "
                                           "does not use the patient's embedding")
            else:
                fm.embedding_weights_ = None
            fm.n_features = n_out
            fm.bandwidth_x, fm.bandwidth_p = clf.bandwidth_x_, clf.bandwidth_p_
            fm.scale_ = np.float32(np.sqrt(2.0 / fm.n_features))
            clf.feature_map_ = fm
        else:
            clf.landmark_projection_ = array("landmark_projection", None, n_out).astype(np.float64, copy=False)
            m = clf.landmark_projection_.shape[0]
            clf.landmark_cells_ = array("landmark_cells", m, d).astype(np.float64, copy=False)
            clf.landmark_embeddings_ = array("landmark_embeddings", m, 2 * n_embedding).astype(np.float64, copy=False)
        model.classifier_ = clf
        model.pooled_classifier_, model.pooled_weight_ = None, 0.0
        pooled = top.object("pooled", optional=True)
        if pooled is not None:
            model.pooled_classifier_ = _pooled_companion(path, pooled, array, clf, d, k)
            # Format 2 wrote no fitted weight: its parameter was the weight.
            weight = pooled.number("weight", within=(0.0, 1.0), optional=True)
            if weight is None:
                if model.pooled_weight == "auto":
                    raise ModelFileError(path, "model description: the pooled companion has no weight")
                weight = float(model.pooled_weight)
            model.pooled_weight_ = float(weight)
        return model

    # -- the scikit-learn view: one sample is one patient --------------------------------------

    def score(self, X, y, sample_weight=None) -> float:
        """Mean over patients of the share of their events gated into the expert's population.

        How scikit-learn's model selection sees a GatingModel, so that ``cross_val_score``,
        ``GroupKFold`` and ``LeaveOneGroupOut`` run on it: one SAMPLE is one PATIENT.

        Parameters
        ----------
        X : sequence of n_patients samples
            :class:`~gating_core.fcs.Sample`, ``flowkit.Sample`` or AnnData, one per patient
            (what :meth:`fit` takes).
        y : sequence of n_patients ndarray of shape (n_events_i,)
            Each patient's expert populations.
        sample_weight : array-like of shape (n_patients,) or None
            Weight of each patient; None: every patient weighs the same, as in training.

        Returns
        -------
        float
            The (weighted) mean of the patients' accuracies. With a splitter's ``groups`` the
            center of each patient, ``cross_val_score(GatingModel(), X, y, groups=centers,
            cv=LeaveOneGroupOut())`` scores the model on centers it has not seen.
        """
        if len(X) != len(y):
            raise ValueError(f"{len(X)} patients but {len(y)} label arrays")
        if len(X) == 0:
            raise ValueError("no patients to score")
        accuracies = []
        for sample, labels in zip(X, y):
            predicted = self.predict(sample)
            labels = np.asarray(labels).astype(str)
            if len(labels) != len(predicted):
                raise ValueError(f"{getattr(sample, 'name', 'a patient')}: {len(predicted)} events but "
                                 f"{len(labels)} labels")
            accuracies.append(float(np.mean(predicted == labels)) if len(labels) else 0.0)
        return float(np.average(accuracies, weights=sample_weight))

    def describe(self) -> dict:
        """A JSON-friendly summary: method, channels, populations, chosen hyperparameters."""
        self._check_fitted()
        clf = self.classifier_
        return {"method": self.method, "channels": self.channels_, "markers": self.channel_markers_,
                "populations": self.populations_, "training_patients": self.training_patients_,
                "bandwidth_x": clf.bandwidth_x_, "bandwidth_p": clf.bandwidth_p_, "alpha": clf.alpha,
                "n_features": clf.n_features, "cv_accuracy": self.selection_.get("cv_accuracy"),
                "pooled_weight": float(self.pooled_weight_) if getattr(self, "pooled_classifier_", None) else 0.0,
                "transform": self.transform_.to_dict()}


# -- checking a loaded description (GatingModel.load) ------------------------------------------

# Hyperparameters with a specific rule; others the constructor accepts must be JSON scalars.
_COUNTS = ("n_features", "n_embedding_features", "cells_per_patient", "embedding_cells", "cv_folds",
           "cv_repeats", "selection_cells_per_patient")
# Copies of each training patient: the model file holds an embedding per copy.
_AUGMENT_LIMIT = 64
_BANDWIDTHS = ("bandwidth_x", "bandwidth_p", "bandwidth_embedding", "alpha")
# Transform cofactors and scales: float32 arithmetic divides by them.
_SCALES = (1e-6, 1e12)


def _checked_params(path, fields: Fields, accepted, where: str) -> dict:
    out = {}
    for key, value in fields.data.items():
        if key not in accepted or key == "self" or accepted[key].kind in (inspect.Parameter.VAR_POSITIONAL,
                                                                          inspect.Parameter.VAR_KEYWORD):
            raise ModelFileError(path, f"model description: unknown {where} {key!r} (written by another version?)"[:300])
        if key == "method":
            out[key] = fields.string(key, choices=METHODS)
        elif key == "solver":
            out[key] = fields.string(key, choices=SOLVERS)
        elif key in _COUNTS:
            out[key] = fields.integer(key, minimum=1, maximum=10 ** 9)
        elif key in _BANDWIDTHS:
            out[key] = fields.number(key, positive=True, nullable=True)
        elif key == "n_augment":
            out[key] = fields.integer(key, minimum=0, maximum=_AUGMENT_LIMIT)
        elif key in ("augment_gain", "augment_shift"):
            out[key] = "auto" if fields.raw(key) == "auto" else fields.number(key, within=(0.0, 10.0))
        elif key == "loss":
            out[key] = fields.string(key, choices=LOSSES)
        elif key == "patient_weighting":
            out[key] = fields.string(key, choices=PATIENT_WEIGHTINGS)
        elif key == "selection_objective":
            out[key] = fields.string(key, choices=("mean", "worst"))
        elif key == "align":
            out[key] = fields.string(key, choices=ALIGNMENTS)
        elif key == "prior_shift":
            out[key] = fields.string(key, choices=PRIOR_SHIFTS)
        elif key == "pooled_weight":
            out[key] = "auto" if fields.raw(key) == "auto" else fields.number(key, within=(0.0, 1.0))
        elif key in ("compensate", "select", "use_embedding", "calibrate"):
            out[key] = fields.boolean(key)
        elif key == "random_state":
            out[key] = fields.integer(key, minimum=0, maximum=2 ** 63, nullable=True)
        elif key == "channels":
            out[key] = fields.strings(key, nullable=True)
        elif key == "transform":
            fields.string(key, choices=("auto", "custom"))
            out[key] = "auto"  # the fitted transform_ is what gates; a custom one is in meta["transform"]
        else:
            check_scalar(path, f"{fields.where}.{key}", value)
            out[key] = value
    return out


def _pooled_companion(path, fields: Fields, array, main: MarginalTransferClassifier, d: int, k: int):
    """The pooled companion of a loaded marginal model (see GatingModel.pooled_weight)."""
    companion = MarginalTransferClassifier(**_classifier_params(
        path, fields.object("classifier"), inspect.signature(MarginalTransferClassifier).parameters))
    if companion.use_embedding or companion.solver != "rff":
        raise ModelFileError(path, "model description: the pooled companion must be an 'rff' model "
                                   "without the patient's embedding")
    companion.classes_ = main.classes_
    companion.n_features_in_ = d
    companion.bandwidth_x_ = fields.number("bandwidth_x", positive=True)
    companion.bandwidth_p_ = None
    companion.bandwidth_embedding_ = main.bandwidth_embedding_
    companion.temperature_ = fields.number("temperature", positive=True, within=(0, 1e6))
    companion.embedder_ = main.embedder_
    companion.coef_ = array("pooled_coef", None, k).astype(np.float32, copy=False)
    n_out = companion.coef_.shape[0]
    companion.intercept_ = array("pooled_intercept", k).astype(np.float32, copy=False)
    fm = ProductRFF.__new__(ProductRFF)
    fm.cell_weights_ = array("pooled_cell_weights", d, n_out).astype(np.float32, copy=False)
    fm.offsets_ = array("pooled_offsets", n_out).astype(np.float64, copy=False)
    fm.embedding_weights_ = None
    fm.n_features = n_out
    fm.bandwidth_x, fm.bandwidth_p = companion.bandwidth_x_, None
    fm.scale_ = np.float32(np.sqrt(2.0 / fm.n_features))
    companion.feature_map_ = fm
    return companion


def _model_params(path, fields: Fields, accepted) -> dict:
    return _checked_params(path, fields, accepted, "model parameter")


def _classifier_params(path, fields: Fields, accepted) -> dict:
    return _checked_params(path, fields, accepted, "classifier parameter")


def _transform(path, fields: Fields, d: int) -> ChannelTransform:
    kinds = fields.strings("kinds")
    params = fields.raw("params")
    if len(kinds) != d or not isinstance(params, list) or len(params) != d:
        raise ModelFileError(path, f"model description: transform must give kinds and params for {d} channels")
    checked = []
    for j, (kind, p) in enumerate(zip(kinds, params)):
        entry = Fields(path, p, f"transform.params[{j}]")
        if kind == "arcsinh":
            values = {"cofactor": entry.number("cofactor", optional=True, within=_SCALES)}
        elif kind == "linear":
            values = {"scale": entry.number("scale", optional=True, within=_SCALES)}
        elif kind == "logicle":
            values = {key: entry.number(key) for key in ("T", "W", "M", "A")}
            t, w, m, a = (values[key] for key in ("T", "W", "M", "A"))
            if not (t > 0 and m > 0 and 0 <= w <= m / 2 and -w <= a <= m - 2 * w):
                raise ModelFileError(path, f"model description: transform.params[{j}] are not valid logicle "
                                           f"parameters (T={t}, W={w}, M={m}, A={a})")
        else:
            raise ModelFileError(path, f"model description: unknown transform {kind!r} for channel {j + 1}"[:200])
        checked.append({key: value for key, value in values.items() if value is not None})
    return ChannelTransform(kinds, checked)


def infer_cell_groups(embedding_cells, names, n_embedding_features=128, random_state=0) -> list[str]:
    """Groups of near-duplicate patients from their standardised cells (one array per patient).

    Embeds every patient with a median-bandwidth kernel mean embedding and links patients as
    :func:`gating_core.groups.infer_groups` does. Used when no groups are given: by training, and
    by the evaluation to choose what to hold out.
    """
    from gating_core.features import median_pairwise_distance
    from gating_core.groups import infer_groups

    pooled = np.vstack([e[:500] for e in embedding_cells])
    embedder = MeanEmbedding(n_embedding_features, median_pairwise_distance(pooled), pooled.shape[1],
                             random_state=np.random.SeedSequence([int(random_state or 0), 11]))
    return infer_groups(np.vstack([embedder.transform(e) for e in embedding_cells]), names)


def _find_channel(sample, pnn: str, pns: str = "") -> int | None:
    """Index of a channel in ``sample``: same $PnN, else same marker ($PnS), case-insensitively."""
    names = sample.pnn
    if pnn in names:
        return names.index(pnn)
    folded = pnn.casefold()
    for i, c in enumerate(sample.channels):
        if c.pnn.casefold() == folded:
            return i
    targets = {t.casefold() for t in (pns, pnn) if t}
    for i, c in enumerate(sample.channels):
        if c.pns and c.pns.casefold() in targets:
            return i
    return None


class _DigestView:
    """Looks enough like a Sample (name, channels, events, keywords) for channel matching."""

    def __init__(self, digest: PatientDigest):
        self.name = digest.name
        self.channels = digest.channels
        self.keywords = digest.keywords
        self.events = digest.embedding_events

    @property
    def pnn(self):
        return [c.pnn for c in self.channels]
