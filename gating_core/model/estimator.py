"""``GatingModel``: learn gates from expert-gated patients, gate new patients from FCS samples.

The estimator itself: its parameters and their checks, fit, the model file, scikit-learn's
view. Its parts are mixins, one module each: ``preprocessing`` (channels, compensation,
transform, standardisation), ``transfer`` (selection, the marginal classifier, its pooled
companion), ``adaptation`` (the patient's own populations, unknown cells, per-patient
adjustments), ``novelty``, ``gating`` (a patient in memory) and ``streaming`` (a file in chunks).
The model file (no pickle, every field checked on reading) is :mod:`gating_core.model.file`.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from gating_core.cpus import with_blas_threads
from gating_core.fcs.transforms import ChannelTransform
from gating_core.method.population_components import MAX_COMPONENTS
from gating_core.method.swollen_populations import largest_shares
from gating_core.method.priors import training_prior
from gating_core.method.unknown_cells import UNKNOWN_MARGIN
from gating_core.model.adaptation import PatientAdaptation
from gating_core.model.weight_check import (ADAPTIVE_WEIGHT_TOLERANCE, ADAPTIVE_WEIGHTS, EVEN_ADAPTIVE_WEIGHT,  # noqa: F401
                                           EVEN_WEIGHT_MARGIN, FALLBACK_ADAPTIVE_WEIGHT)
from gating_core.model.digest import digest_patient
from gating_core.model.file import load_model, save_model
from gating_core.model.gating import PatientGating
from gating_core.model.novelty import PatientNovelty
from gating_core.model.preprocessing import ChannelPreprocessing
from gating_core.model.streaming import UNKNOWN, StreamedGating  # noqa: F401  (UNKNOWN: importable from here)
from gating_core.model.transfer import POOLED_ALPHA, SELECTION_MAX_PATIENTS, TransferFit  # noqa: F401
from gating_core.parameters import BOOLEAN, NONE, InstanceOf, Interval, Options, validate_parameters

METHODS = ("marginal", "pooling", "multitask")
DEFAULT_LOSS = "squared"
#: Shift-augmented copies of each training patient (an option of ResearchGatingModel; measured in
#: docs/unseen_data.md, it gained on one simulated cohort only and cost another: not in the default).
DEFAULT_AUGMENT = 0
#: Weight of the pooled companion in the marginal method's probabilities (see GatingModel).
#: "auto" (chosen by cross-validation over groups) is an option: measured on held-out centers
#: it did no better than the even blend (docs/method.md).
DEFAULT_POOLED_WEIGHT = 0.5
#: Population balance of each patient's training-cell draw (see GatingModel's class_balance).
DEFAULT_CLASS_BALANCE = 0.0
#: The marginal method's second fit is at this multiple of the larger of the selected sigma_X and
#: the median distance between cells (ResearchGatingModel's ``bandwidth_x_hedge``; None: no second fit).
DEFAULT_BANDWIDTH_X_HEDGE = None
DEFAULT_ADAPTIVE_WEIGHT = "auto"


class GatingModel(TransferFit, PatientAdaptation, PatientNovelty, PatientGating, ChannelPreprocessing,
                  StreamedGating, BaseEstimator):
    """Automatic gating learned from expert-gated patients (docs/method.md, part by part).

    Its parameters are what the default uses and what a lab would set. Bandwidths are in
    standardised units; a parameter set by hand is kept out of model selection. The method's
    family (pooling and multitask baselines, losses, solvers, DICA, alignment, ...) and the
    options measured and left out of the default are the parameters of
    :class:`~gating_core.model.research.ResearchGatingModel`; this model runs with the default's
    choices (class attributes its code reads).

    Parameters
    ----------
    channels : list of str or None
        Channels to use ($PnN or $PnS); None: every channel all training patients share, except
        time / event-count channels and constant ones.
    transform : "auto", ChannelTransform or dict
        "auto": from what the files are (:func:`~gating_core.fcs.transforms.default_transform`:
        arcsinh on fluorescence and mass channels, scatter linear, channel-scale data as they are);
        a dict changes some channels of that choice, ``{"CD3": "channel-scale"}``.
    compensate : bool, default=True
        Apply a file's spillover matrix.
    select : bool, default=True
        Choose bandwidths and penalty by cross-validation over groups of patients.
    cells_per_patient, embedding_cells : int, default=4000 and 20000
        Training cells drawn per patient; cells of a patient its embedding is computed from.
    n_features, n_embedding_features : int, default=512 and 128
        Random features of the classifier and of the embedding.
    bandwidth_x, bandwidth_p, alpha : float or None
        sigma_X, sigma_P and the penalty of :class:`~gating_core.method.classifier.MarginalTransferClassifier`
        (None: selected).
    pooled_weight : float in [0, 1] or "auto", default=0.5
        The pooled companion's share beside the marginal model, for patients within the
        embedding's reach (:meth:`companion_weight` fades the marginal model's share beyond it).
    adaptive_weight : "auto" or float in [0, 1], default="auto"
        g in ``(1 - g) p_transfer + g p_adapted``: the patient's own populations adapted by EM
        to its cells, the mean of two generative fits' posteriors -- every population a Gaussian
        sharing one covariance (:class:`~gating_core.method.adaptive_lda.AdaptiveLDA`) and every
        population a Gaussian of its own training shape
        (:class:`~gating_core.method.unknown_cells.PopulationReach`); a population made of separate
        clusters is their Gaussian components in both
        (:mod:`~gating_core.method.population_components`). "auto": ``EVEN_ADAPTIVE_WEIGHT``
        (2/3: the transfer model and the two fits a third each) unless cross-validation over
        groups finds a weight of ``ADAPTIVE_WEIGHTS`` whose held-out mean plus next-to-worst
        patient's accuracy is higher by more than ``EVEN_WEIGHT_MARGIN``, and whose held-out
        mean is at least as high in every fold.
    unknown_margin : float > 0 or None, default=UNKNOWN_MARGIN (3.0)
        A cell whose squared distance to every population exceeds this many times that
        population's reach is gated ``"unknown"`` (confidence 0;
        :class:`~gating_core.method.unknown_cells.PopulationReach`). None: never.
    cv_folds, cv_repeats, selection_cells_per_patient : int
        Model selection (folds hold out whole groups of patients).
    random_state : int

    A scikit-learn estimator (``clone``, ``get_params``, ``set_params``): keyword-only parameters,
    exactly those the model file stores, each declared in ``_parameter_constraints`` and checked
    once when :meth:`fit` starts. One sample is one patient: ``X`` a sequence of samples, ``y``
    their per-event labels, ``groups`` the center of each patient, :meth:`score` the mean
    per-patient accuracy::

        cross_val_score(GatingModel(), samples, labels, groups=centers, cv=LeaveOneGroupOut())

    Attributes
    ----------
    channels_, channel_markers_ : list of str  ($PnN of the first training patient, $PnS)
    transform_ : ChannelTransform
    center_, scale_ : ndarray (d,)  standardisation after the transform
    classifier_ : MarginalTransferClassifier
    pooled_classifier_ : MarginalTransferClassifier or None  the pooled companion
    pooled_weight_ : float  its share within the embedding's reach (0 without one)
    companion_bandwidth_x_ : float or None  its own selected sigma_X
    hedge_classifier_ : MarginalTransferClassifier or None  ResearchGatingModel's second fit
    adaptive_lda_ : AdaptiveLDA or None;  adaptive_weight_ : float;  adaptive_start_ : str
        where each patient's EM starts: "training" populations or "transfer" model's posteriors
    adaptive_shapes_ : bool  whether the adapted populations include the own-shape fit
    adaptive_components_ : ndarray (k_c,) or None  the population of each Gaussian component of the
        adapted populations and the reach (None: one per population)
    population_reach_ : PopulationReach or None  each population's own shape and reach (the
        own-shape fit; cells beyond every reach are unknown when ``unknown_margin`` is set)
    populations_, training_patients_ : list of str
    class_prior_ : ndarray (k,)  population shares of the training patients (each weighing the same)
    largest_shares_ : ndarray (k,) or None  each population's largest share in a training patient,
        against which a rare population the adapted populations let swell is told (None: not checked)
    pooled_trees_ : PooledTrees or None  gradient-boosted trees on the pooled training cells,
        taking half the transfer model's part where the check of ``adaptive_weight="auto"`` finds
        that they gate its held-out groups better (None: not taken)
    selection_ : dict  the chosen parameters and the cross-validation tables
    groups_ : list of str;  groups_inferred_ : bool  (found from the embeddings when not given)
    novelty_reference_, novelty_threshold_ : float
    reference_quantiles_, reference_landmarks_ : the references of ``align`` (or None)
    dica_ : DICA or None
    """

    #: The choices of ``method``; the model file's checks read them from here, as
    #: :mod:`gating_core.model.file` sits below this module and cannot import it.
    METHODS = METHODS

    # The research options and the method's family at the values this model runs with. They are
    # ResearchGatingModel's parameters (gating_core.model.research), not this model's; the code
    # reads them as attributes, so one code path serves both classes.
    n_augment = DEFAULT_AUGMENT
    augment_gain = 0.08
    augment_shift = 0.15
    bandwidth_x_hedge = DEFAULT_BANDWIDTH_X_HEDGE
    self_training = False
    transfer_start = False
    adaptive_shapes = True
    population_components = MAX_COMPONENTS
    swollen_check = True
    trees_check = True
    # ... and the method's family at the default's choices.
    method = "marginal"
    solver = "rff"
    loss = DEFAULT_LOSS
    patient_weighting = "uniform"
    kernel_x = "gaussian"
    select_embedding_bandwidth = False
    selection_objective = "mean"
    prior_shift = "none"
    align = "none"
    task_similarity = 0.5
    dica = None
    dica_components = 20
    class_balance = DEFAULT_CLASS_BALANCE
    #: Their names, for the model file (gating_core.model.file reads them from the class it is given:
    #: a file storing them at these values is this model's, otherwise a ResearchGatingModel's).
    RESEARCH_OPTIONS = ("n_augment", "augment_gain", "augment_shift", "bandwidth_x_hedge", "self_training",
                        "transfer_start", "adaptive_shapes", "population_components", "swollen_check",
                        "trees_check", "method", "solver", "loss", "patient_weighting", "kernel_x", "select_embedding_bandwidth",
                        "selection_objective", "prior_shift", "align", "task_similarity", "dica",
                        "dica_components", "class_balance")

    _parameter_constraints = {
        "channels": [NONE, InstanceOf((list, tuple), "a list of channel names")],
        "transform": [Options("auto"), InstanceOf(dict, "a dict of channel -> transform"),
                      InstanceOf(ChannelTransform, "a ChannelTransform")],
        "compensate": [BOOLEAN],
        "select": [BOOLEAN],
        "cells_per_patient": [Interval(numbers.Integral, 1)],
        "embedding_cells": [Interval(numbers.Integral, 1)],
        "n_features": [Interval(numbers.Integral, 1)],
        "n_embedding_features": [Interval(numbers.Integral, 1)],
        "bandwidth_x": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "bandwidth_p": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "alpha": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "pooled_weight": [Options("auto"), Interval(numbers.Real, 0, 1)],
        "adaptive_weight": [Options("auto"), Interval(numbers.Real, 0, 1)],
        "unknown_margin": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "cv_folds": [Interval(numbers.Integral, 2)],
        "cv_repeats": [Interval(numbers.Integral, 1)],
        "selection_cells_per_patient": [Interval(numbers.Integral, 1)],
        "random_state": [NONE, Interval(numbers.Integral, 0)],
    }

    def __init__(self, *, channels=None, transform="auto", compensate=True, select=True,
                 cells_per_patient=4000, embedding_cells=20000, n_features=512, n_embedding_features=128,
                 bandwidth_x=None, bandwidth_p=None, alpha=None, pooled_weight=DEFAULT_POOLED_WEIGHT,
                 adaptive_weight=DEFAULT_ADAPTIVE_WEIGHT, unknown_margin=UNKNOWN_MARGIN,
                 cv_folds=5, cv_repeats=2, selection_cells_per_patient=1500, random_state=0):
        self.channels = channels
        self.transform = transform
        self.compensate = compensate
        self.select = select
        self.cells_per_patient = cells_per_patient
        self.embedding_cells = embedding_cells
        self.n_features = n_features
        self.n_embedding_features = n_embedding_features
        self.bandwidth_x = bandwidth_x
        self.bandwidth_p = bandwidth_p
        self.alpha = alpha
        self.pooled_weight = pooled_weight
        self.adaptive_weight = adaptive_weight
        self.unknown_margin = unknown_margin
        self.cv_folds = cv_folds
        self.cv_repeats = cv_repeats
        self.selection_cells_per_patient = selection_cells_per_patient
        self.random_state = random_state

    # -- training ------------------------------------------------------------------------------

    def fit(self, samples, labels, progress=None, groups=None):
        """Learn from expert-gated patients.

        Parameters
        ----------
        samples : list of Sample, flowkit.Sample or AnnData
            One per patient, as read from its file (compensated by its spillover matrix when
            ``compensate``).
        labels : list of ndarray of shape (n_events_i,), population names
        progress : callable(stage: str, fraction: float) or None
        groups : sequence of length n_patients or None
            Center / batch / run of each patient. Model selection holds out whole groups.
            None: near-duplicate patients are found from their embeddings
            (:func:`gating_core.method.groups.infer_groups`) and kept together; the same within a
            single group given to every patient.
        """
        validate_parameters(self)
        if len(samples) != len(labels):
            raise ValueError(f"{len(samples)} patients but {len(labels)} label arrays")
        if progress is not None:
            progress("Preparing channels", 0.0)
        digests = [self.digest(s, y, i) for i, (s, y) in enumerate(zip(samples, labels))]
        return self.fit_digests(digests, progress=progress, groups=groups)

    def standardised_training_cells(self, samples, labels):
        """Fit the channels, transform and standardisation on these labeled patients, as
        :meth:`fit` does first, and return each one's seeded draw of training cells as the
        classifier would see them, with their labels: (list of (m_i, d), list of (m_i,)).

        What the baselines that are not kernel machines (LDA, DICA) train on.
        """
        digests = [self.digest(s, y, i) for i, (s, y) in enumerate(zip(samples, labels))]
        cells, _, drawn_labels = self.prepare_digests(digests)
        return cells, drawn_labels

    def digest_seed(self, index: int) -> np.random.SeedSequence:
        """Seed of the training-cell draw of the ``index``-th patient (documented, reproducible)."""
        return np.random.SeedSequence([int(self.random_state or 0), 10, int(index)])

    def digest(self, sample, labels, index: int):
        """The :class:`~gating_core.model.digest.PatientDigest` of the ``index``-th training patient,
        drawn as :meth:`fit` draws it (``cells_per_patient``, ``class_balance``,
        ``embedding_cells``, compensation, seed :meth:`digest_seed`). ``sample``: a
        :class:`~gating_core.fcs.Sample`, ``flowkit.Sample`` or AnnData."""
        from gating_core.io.interop import as_sample  # FlowKit / AnnData only when given one

        return digest_patient(as_sample(sample), labels, self.cells_per_patient, self.embedding_cells,
                              seed=self.digest_seed(index), compensate=self.compensate,
                              class_balance=self.class_balance)

    @with_blas_threads  # BLAS sized from the free CPUs: no stalls beside other CPU-bound work
    def fit_digests(self, digests, progress=None, groups=None):
        """Learn from :class:`PatientDigest` objects (what :meth:`fit` does after digesting).

        ``train --workers`` builds the digests on a Dask cluster, where the files are, and
        calls this; the result is identical to :meth:`fit` on the same files.
        """
        from gating_core.method.patient_embeddings import shared_embeddings

        validate_parameters(self)
        # Selection, the final fit and the companion embed the same patients: each once.
        with shared_embeddings():
            return self._fit_digests(digests, progress, groups)

    def _fit_digests(self, digests, progress=None, groups=None):
        report = progress or (lambda stage, fraction: None)
        if len(digests) == 0:
            raise ValueError("no training patients")
        if self.method == "marginal" and len(digests) < 2:
            raise ValueError("marginal transfer learns across patients: give at least two labeled patients")
        report("Transforming events", 0.05)
        self.population_reach_ = None  # the folds of a refit do not inherit it
        cells, embedding_cells, labels = self.prepare_digests(digests)
        samples = digests
        self._set_groups(groups, embedding_cells, [d.name for d in digests])

        params = self._select(cells, embedding_cells, labels, report)
        self._fit_transfer(cells, embedding_cells, labels, params, report)
        self.populations_ = [str(c) for c in self.classifier_.classes_]
        self.class_prior_ = training_prior(labels, self.classifier_.classes_)
        self.largest_shares_ = (largest_shares(labels, self.classifier_.classes_)
                                if self.swollen_check and self.method == "marginal" else None)
        self.training_patients_ = [s.name for s in samples]
        self._fit_novelty()
        components = self._fit_adaptive(cells, embedding_cells, labels, params, report)
        self._fit_reach(cells, labels, components)
        report("Done", 1.0)
        return self

    # -- gating --------------------------------------------------------------------------------

    def _check_fitted(self):
        """Raise scikit-learn's NotFittedError (what any estimator raises) before fit or load."""
        if not hasattr(self, "classifier_"):
            raise NotFittedError("this GatingModel is not fitted yet: call fit() or GatingModel.load()")

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the model as .npz (arrays + JSON; no pickle), atomically (:func:`gating_core.model.file.save_model`)."""
        save_model(self, path)

    @classmethod
    def load(cls, path) -> "GatingModel":
        """Read a model written by :meth:`save`; raises ModelFileError for anything else
        (:func:`gating_core.model.file.load_model`: no pickle, every field and shape checked)."""
        return load_model(cls, path)

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
        return {"method": self.method, "loss": self.loss, "kernel_x": self.kernel_x,
                "class_balance": float(self.class_balance),
                "task_similarity": self.task_similarity if self.method == "multitask" else None,
                "channels": self.channels_, "markers": self.channel_markers_,
                "populations": self.populations_, "training_patients": self.training_patients_,
                "bandwidth_x": clf.bandwidth_x_, "bandwidth_p": clf.bandwidth_p_, "alpha": clf.alpha,
                "n_features": clf.n_features, "cv_accuracy": self.selection_.get("cv_accuracy"),
                "pooled_weight": float(self.pooled_weight_) if getattr(self, "pooled_classifier_", None) else 0.0,
                "second_bandwidth_x": (self.hedge_classifier_.bandwidth_x_
                                       if getattr(self, "hedge_classifier_", None) is not None else None),
                "self_training": self._self_trains(),
                "adaptive_weight": float(getattr(self, "adaptive_weight_", 0.0)),
                "adaptive_start": str(getattr(self, "adaptive_start_", "training")),
                "adaptive_shapes": bool(getattr(self, "adaptive_shapes_", False)),
                "split_populations": self._split_populations(),
                "swollen_check": getattr(self, "largest_shares_", None) is not None,
                "pooled_trees": getattr(self, "pooled_trees_", None) is not None,
                "unknown_margin": None if not self._unknown_called() else float(self.unknown_margin),
                "transform": self.transform_.to_dict()}


# -- checking a loaded description (GatingModel.load) ------------------------------------------


