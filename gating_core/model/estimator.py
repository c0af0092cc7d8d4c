"""``GatingModel``: learn gates from expert-gated patients, gate new patients from FCS samples.

It wraps :class:`~gating_core.method.classifier.MarginalTransferClassifier` with what files need:
channel matching by $PnN / $PnS, compensation, the per-channel transform, standardisation,
model selection over patients and a per-patient novelty score. The model file (no pickle, every
field checked on reading) is :mod:`gating_core.model.file`.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from gating_core.cpus import with_blas_threads
from gating_core.fcs.transforms import ChannelTransform
from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.alignment import ALIGNMENTS
from gating_core.method.classifier import LOSSES, PATIENT_WEIGHTINGS, SOLVERS, MarginalTransferClassifier
from gating_core.method.dica import DICA_MODES, MODEL_DICA_FEATURES
from gating_core.method.features import KERNELS_X, content_hashes, content_subsample
from gating_core.method.losses import loss_for
from gating_core.method.prediction import SCORE_BLOCK
from gating_core.method.priors import PRIOR_SHIFTS, reestimate_prior, training_prior
from gating_core.method.self_training import PatientAdjustment, self_training_coef
from gating_core.model.digest import digest_patient, infer_cell_groups
from gating_core.model.file import load_model, save_model
from gating_core.model.preprocessing import ChannelPreprocessing
from gating_core.model.result import GateResult, Novelty
from gating_core.model.streaming import StreamedGating
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
#: Penalty of the pooled companion's logistic fit: light, as a user would fit the plain baseline.
POOLED_ALPHA = 1e-5
#: Model selection runs on at most this many patients (a seeded draw beyond: selection_patients).
SELECTION_MAX_PATIENTS = 50
#: The adapted populations' share of the final probabilities (GatingModel's ``adaptive_weight``):
#: chosen among these by cross-validation over groups ("auto").
ADAPTIVE_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_ADAPTIVE_WEIGHT = "auto"
#: With nothing to hold out (one training patient), "auto" takes this weight.
FALLBACK_ADAPTIVE_WEIGHT = 0.5
#: Weights whose held-out mean-plus-worst accuracy is within this of the best are not told apart
#: by the few patients a fold holds out; "auto" takes the largest of them (see
#: GatingModel._choose_adaptive_weight).
ADAPTIVE_WEIGHT_TOLERANCE = 0.01


class GatingModel(ChannelPreprocessing, StreamedGating, BaseEstimator):
    """Automatic gating learned from expert-gated patients.

    Parameters
    ----------
    method : {"marginal", "pooling", "multitask"}, default="marginal"
        Marginal transfer (the patient's cell distribution is an input), the pooling baseline,
        or the multitask baseline (k_P = ``task_similarity`` between two training patients, 1
        within one; a new patient is gated by the part shared across patients: see
        :func:`~gating_core.method.solvers.multitask_ridge_solve`). Multitask uses the squared loss;
        its bandwidth and penalty are selected as pooling's.
    channels : list of str or None
        Channels to use ($PnN or $PnS); None: every channel all training patients share, except
        time / event-count channels and constant ones.
    transform : "auto", ChannelTransform or dict
        "auto": chosen from what the files are (:func:`~gating_core.fcs.transforms.default_transform`:
        arcsinh(x / 5) on a mass cytometer, arcsinh(x / 150) on flow fluorescence, scatter linear,
        channels already on a 0-1023 channel scale used as they are); a dict changes some
        channels of that choice, ``{"FL1.LOG": "arcsinh:150", "CD3": "channel-scale"}`` (keys
        $PnN or marker; values as :func:`~gating_core.fcs.transforms.parse_transform_spec` reads).
    compensate : bool, default=True
        Apply a file's spillover matrix before gating.
    select : bool, default=True
        Choose bandwidths and penalty by cross-validation over patients.
    select_embedding_bandwidth : bool, default=False
        Also choose the embedding bandwidth sigma' (the kernel k'_X of the mean embedding) by
        that cross-validation, from ``DEFAULT_EMBEDDING_FACTORS`` x the median distance between
        cells (JMLR section 8.1 selects it); False: sigma' is that median distance. Only with
        ``select`` and the marginal method; the choice is ``selection_["bandwidth_embedding"]``.
    n_features, n_embedding_features, cells_per_patient, embedding_cells, solver,
    bandwidth_x, bandwidth_p, alpha, loss, patient_weighting :
        Passed to :class:`MarginalTransferClassifier` (bandwidths in standardised units; set
        ones are kept out of the selection).
    pooled_weight : float in [0, 1] or "auto", default=0.5
        The marginal method's probabilities are ``(1 - w) p_marginal + w p_pooled``, where
        ``p_pooled`` comes from a companion that ignores the patient's distribution (a logistic
        regression on cell features of the same kind, every patient weighing the same, no shift
        augmentation). Its sigma_X is selected for it (by the same cross-validation over groups,
        without the embedding and without augmentation) rather than borrowed from the marginal
        model: a pooled model gates a new center best at its own bandwidth. The companion
        is the hedge for patients from centers unlike any training one, where the embedding
        extrapolates; averaging the two beat each alone when whole centers were held out
        (docs/method.md). That w holds for a patient
        within the embedding's reach; beyond it the marginal model's share fades with k_P
        (:meth:`companion_weight`), so a patient far from every training patient is gated by
        the companion. 0: the marginal model alone (nothing fades then).
        "auto": w from (0, 0.25, 0.5, 0.75, 1) by cross-validation over groups
        (:func:`~gating_core.method.selection.select_pooled_weight`), 0.5 unless another weight wins
        on held-out groups by more than 0.2 points (and 0.5 when ``select=False`` or there are
        fewer than two groups). Ignored by ``method="pooling"`` and by solvers other than ``"rff"``.
    prior_shift : {"none", "em"}, default="none"
        "em": re-estimate the population proportions of each gated patient from its own
        unlabeled cells (:mod:`gating_core.method.priors`) and adjust the probabilities to them.
    align : {"none", "quantile", "landmarks"}, default="none"
        "quantile": register each channel of every patient, training and new, onto reference
        landmarks before the classifier sees it (:mod:`gating_core.method.alignment`).
        "landmarks": move each channel's density peaks onto the training patients' consensus
        peaks, leaving a channel of a patient as it is when its peaks do not match one-to-one
        (measured in docs/alignment.md).
    cv_folds, cv_repeats, selection_cells_per_patient, selection_objective :
        model-selection settings (folds hold out whole groups of patients).
    random_state : int
    task_similarity : float in (0, 1], default=0.5
        tau of ``method="multitask"`` (ignored by the other methods).
    dica : {None, "supervised", "unsupervised"}, default=None
        Domain-invariant component analysis (Muandet et al. 2013; :mod:`gating_core.method.dica`)
        after standardisation: DICA (with the expert labels) or UDICA, fitted on the training
        patients' cells, projects every cell -- training, embedding and gated -- onto
        ``dica_components`` directions along which the patients' distributions differ least
        (each scaled to unit variance over the training cells). With ``method="marginal"`` the
        patient's embedding is of its projected cells (the paper's distributional variant).
        The projection is fitted once on all training patients, before model selection, so
        the selection's held-out patients helped shape it (its CV accuracy is optimistic);
        ``select=False`` leaves the bandwidths to heuristics that suit the projected cells
        less well than the channels (sample cohort: 0.76 against 0.96 on one patient).
    dica_components : int, default=20
        m, the directions kept (1 to 600).
    class_balance : float in [0, 1], default=DEFAULT_CLASS_BALANCE
        How each patient's ``cells_per_patient`` training cells are drawn: 0 uniformly (each
        population in proportion to its share of the events), 1 the same number of cells from
        every population as far as its cells go, in between shares proportional to
        ``count ** (1 - class_balance)`` (:func:`~gating_core.model.digest.training_rows`). A rare
        population (B or NK cells at 0.5%) brings 20 of 4,000 cells to a uniform draw. Measured
        on held-out centers, 1 raised macro-F1 where populations are rare and lowered accuracy
        on the real data's batch protocol (docs/method.md): an option.
    kernel_x : {"gaussian", "linear"}, default="gaussian"
        The cell kernels (see :class:`MarginalTransferClassifier`). "linear" (the JMLR
        flow-cytometry experiment): the embedding is the patient's mean standardised cell and
        each patient's gate is linear in the cell, k_P(Psi, Psi') (<x, x'> + 1); sigma_X and
        sigma' are not selected (they mean nothing to it). Its pooled companion is kept and is
        consistent with it: a logistic regression on [x, 1] (a linear logistic model), with no
        sigma_X to select. Needs ``solver="rff"``.
    adaptive_weight : "auto" or float in [0, 1], default="auto"
        The share of the patient's own populations in the final probabilities:
        ``(1 - g) p_transfer + g p_adapted``, where ``p_adapted`` comes from Gaussian
        populations with one shared covariance (LDA) fitted on the training patients and
        adapted to each gated patient by EM over its own content-chosen cells
        (:class:`~gating_core.method.adaptive_lda.AdaptiveLDA`). A discriminative model, however
        flexible, extrapolates its training boundaries when a patient's population sits beyond
        where any training patient had it (a batch or center effect); the adapted populations
        follow it. Where populations are no single Gaussians, the transfer model is the better
        one. "auto": g from ``ADAPTIVE_WEIGHTS`` by cross-validation over groups (each fold
        refits both parts with the hyperparameters selected on all patients and scores the
        held-out groups' patients): the largest g whose sum of mean and worst-patient accuracy
        is within ``ADAPTIVE_WEIGHT_TOLERANCE`` (0.01) of the best. The folds see only the shifts
        between the training groups and a new run can move further: among the weights they
        cannot tell apart, the most adapted. 0: the transfer model alone. Only ``method="marginal"``; the baselines
        gate as fitted.
    The research options (shift augmentation, a second fit at a narrower cell bandwidth,
    self-training at gating time) are not parameters of this model: they are those of
    :class:`~gating_core.model.research.ResearchGatingModel`, a subclass. This model runs with
    them off (the class attributes ``n_augment``, ``augment_gain``, ``augment_shift``,
    ``bandwidth_x_hedge`` and ``self_training``, which its code reads).

    A scikit-learn estimator (``clone``, ``get_params``, ``set_params``) whose parameters are
    keyword-only and exactly those the model file stores. What each may hold is declared in
    ``_parameter_constraints`` and checked once, when :meth:`fit` starts
    (:func:`gating_core.parameters.validate_parameters`): a bad value is a ``ValueError`` naming
    the parameter before any file is read. To scikit-learn's model selection one sample is one
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
    reference_landmarks_ : LandmarkReference or None  consensus peaks of ``align="landmarks"``
    class_prior_ : ndarray (k,)  population shares of the training patients (each weighing the same)
    pooled_classifier_ : MarginalTransferClassifier or None
        The pooled companion (see ``pooled_weight``); None when there is none.
    pooled_weight_ : float  the companion's weight for patients within the embedding's reach (0 when there
        is no companion; per patient see :meth:`companion_weight`)
    companion_bandwidth_x_ : float or None  the companion's own selected sigma_X (None: the main model's)
    hedge_classifier_ : MarginalTransferClassifier or None
        The marginal model's second fit (ResearchGatingModel's ``bandwidth_x_hedge``); None when
        there is none.
    adaptive_lda_ : AdaptiveLDA or None
        The populations as Gaussians (see ``adaptive_weight``); None when the weight is 0.
    adaptive_weight_ : float  the adapted populations' share of the final probabilities
    populations_ : list of str
    training_patients_ : list of str
    selection_ : dict  the chosen parameters and the CV table
    groups_ : list of str  the group of each training patient (given; inferred from the embeddings
        when none were given, or within the one group given to every patient, as "group/cluster")
    groups_inferred_ : bool  True when the groups were found from the embeddings
    novelty_reference_, novelty_threshold_ : float
    dica_ : DICA or None  the fitted projection (``dica``), (d,) -> (dica_components,)
    """

    #: The choices of ``method``; the model file's checks read them from here, as
    #: :mod:`gating_core.model.file` sits below this module and cannot import it.
    METHODS = METHODS

    # The research options at the values this model runs with. They are ResearchGatingModel's
    # parameters (gating_core.model.research), not this model's; the code below reads them as
    # attributes, so one code path serves both classes.
    n_augment = DEFAULT_AUGMENT
    augment_gain = 0.08
    augment_shift = 0.15
    bandwidth_x_hedge = DEFAULT_BANDWIDTH_X_HEDGE
    self_training = False
    #: Their names, for the model file (gating_core.model.file reads them from the class it is given:
    #: a file storing them at these values is this model's, otherwise a ResearchGatingModel's).
    RESEARCH_OPTIONS = ("n_augment", "augment_gain", "augment_shift", "bandwidth_x_hedge", "self_training")

    _parameter_constraints = {
        "method": [Options(*METHODS)],
        "channels": [NONE, InstanceOf((list, tuple), "a list of channel names")],
        "transform": [Options("auto"), InstanceOf(dict, "a dict of channel -> transform"),
                      InstanceOf(ChannelTransform, "a ChannelTransform")],
        "compensate": [BOOLEAN],
        "select": [BOOLEAN],
        "select_embedding_bandwidth": [BOOLEAN],
        "n_features": [Interval(numbers.Integral, 1)],
        "n_embedding_features": [Interval(numbers.Integral, 1)],
        "cells_per_patient": [Interval(numbers.Integral, 1)],
        "embedding_cells": [Interval(numbers.Integral, 1)],
        "solver": [Options(*SOLVERS)],
        "bandwidth_x": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "bandwidth_p": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "alpha": [NONE, Interval(numbers.Real, 0, None, "neither")],
        "loss": [Options(*LOSSES)],
        "patient_weighting": [Options(*PATIENT_WEIGHTINGS)],
        "pooled_weight": [Options("auto"), Interval(numbers.Real, 0, 1)],
        "prior_shift": [Options(*PRIOR_SHIFTS)],
        "align": [Options(*ALIGNMENTS)],
        "cv_folds": [Interval(numbers.Integral, 2)],
        "cv_repeats": [Interval(numbers.Integral, 1)],
        "selection_cells_per_patient": [Interval(numbers.Integral, 1)],
        "selection_objective": [Options("mean", "worst")],
        "random_state": [NONE, Interval(numbers.Integral, 0)],
        "task_similarity": [Interval(numbers.Real, 0, 1, "right")],
        "dica": [NONE, Options(*DICA_MODES)],
        "dica_components": [Interval(numbers.Integral, 1, 2 * MODEL_DICA_FEATURES)],
        "kernel_x": [Options(*KERNELS_X)],
        "class_balance": [Interval(numbers.Real, 0, 1)],
        "adaptive_weight": [Options("auto"), Interval(numbers.Real, 0, 1)],
    }

    def __init__(self, *, method="marginal", channels=None, transform="auto", compensate=True, select=True,
                 select_embedding_bandwidth=False,
                 n_features=512, n_embedding_features=128, cells_per_patient=4000, embedding_cells=20000,
                 solver="rff", bandwidth_x=None, bandwidth_p=None, alpha=None, loss=DEFAULT_LOSS,
                 patient_weighting="uniform",
                 pooled_weight=DEFAULT_POOLED_WEIGHT, prior_shift="none", align="none", cv_folds=5, cv_repeats=2,
                 selection_cells_per_patient=1500, selection_objective="mean", random_state=0,
                 task_similarity=0.5, dica=None, dica_components=20, kernel_x="gaussian",
                 class_balance=DEFAULT_CLASS_BALANCE, adaptive_weight=DEFAULT_ADAPTIVE_WEIGHT):
        self.method = method
        self.channels = channels
        self.transform = transform
        self.compensate = compensate
        self.select = select
        self.select_embedding_bandwidth = select_embedding_bandwidth
        self.n_features = n_features
        self.n_embedding_features = n_embedding_features
        self.cells_per_patient = cells_per_patient
        self.embedding_cells = embedding_cells
        self.solver = solver
        self.bandwidth_x = bandwidth_x
        self.bandwidth_p = bandwidth_p
        self.alpha = alpha
        self.loss = loss
        self.patient_weighting = patient_weighting
        self.pooled_weight = pooled_weight
        self.prior_shift = prior_shift
        self.align = align
        self.cv_folds = cv_folds
        self.cv_repeats = cv_repeats
        self.selection_cells_per_patient = selection_cells_per_patient
        self.selection_objective = selection_objective
        self.random_state = random_state
        self.task_similarity = task_similarity
        self.dica = dica
        self.dica_components = dica_components
        self.kernel_x = kernel_x
        self.class_balance = class_balance
        self.adaptive_weight = adaptive_weight

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
        ``embedding_cells``, compensation, seed :meth:`digest_seed`)."""
        return digest_patient(sample, labels, self.cells_per_patient, self.embedding_cells,
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
        cells, embedding_cells, labels = self.prepare_digests(digests)
        samples = digests
        self._set_groups(groups, embedding_cells, [d.name for d in digests])

        params = self._classifier_params()
        self.selection_ = {}
        if self.select and len(samples) >= 2 and self._wants_search():
            from gating_core.method.selection import select_hyperparameters

            report("Model selection (cross-validation over patients)", 0.15)
            chosen = self.selection_patients(len(cells))
            result = select_hyperparameters(
                [cells[i] for i in chosen], [labels[i] for i in chosen], MarginalTransferClassifier(**params),
                embedding_samples=[embedding_cells[i] for i in chosen],
                cv_folds=self.cv_folds, cv_repeats=self.cv_repeats, cells_per_patient=self.selection_cells_per_patient,
                progress=lambda f: report("Model selection (cross-validation over patients)", 0.15 + 0.65 * f),
                groups=[self.groups_[i] for i in chosen], objective=self.selection_objective,
                embedding_factors=self._embedding_factors())
            self.selection_ = self._apply_selection(params, result)
            self.selection_["n_patients"] = len(chosen)
        if self.alpha is None and loss_for(self.loss).searches_own_penalty:
            from gating_core.method.companion_selection import select_logistic_alpha

            report("Choosing the logistic penalty (cross-validation over groups)", 0.7)
            params["alpha"] = select_logistic_alpha(cells, labels, MarginalTransferClassifier(**params),
                                                    embedding_samples=embedding_cells, groups=self.groups_,
                                                    cv_folds=self.cv_folds,
                                                    cells_per_patient=self.selection_cells_per_patient)
            self.selection_.setdefault("params", {})["alpha"] = params["alpha"]
        if params["alpha"] is None:
            params["alpha"] = 1e-4
        self._fit_transfer(cells, embedding_cells, labels, params, report)
        self.populations_ = [str(c) for c in self.classifier_.classes_]
        self.class_prior_ = training_prior(labels, self.classifier_.classes_)
        self.training_patients_ = [s.name for s in samples]
        self._fit_novelty()
        self._fit_adaptive(cells, embedding_cells, labels, params, report)
        report("Done", 1.0)
        return self

    def _fit_transfer(self, cells, embedding_cells, labels, params, report, fixed=None):
        """The transfer model: the classifier, its second fit and its pooled companion.
        ``fixed`` ({"companion_bandwidth_x", "pooled_weight"}) takes the companion's settings as
        given instead of choosing them (the folds of :meth:`_choose_adaptive_weight`)."""
        report("Fitting the final model", 0.8)
        self.classifier_ = MarginalTransferClassifier(**params).fit(cells, labels, embedding_samples=embedding_cells,
                                                                    groups=self.groups_)
        self.hedge_classifier_ = None
        hedge = self._hedge_params(params, self.selection_)
        if hedge is not None:
            report("Fitting the second model (the narrower cell bandwidth)", 0.8)
            self.hedge_classifier_ = MarginalTransferClassifier(**hedge).fit(
                cells, labels, embedding_samples=embedding_cells, groups=self.groups_)
        self.pooled_classifier_, self.pooled_weight_, self.companion_bandwidth_x_ = None, 0.0, None
        if fixed is not None:
            self.companion_bandwidth_x_, self.pooled_weight_ = fixed["companion_bandwidth_x"], fixed["pooled_weight"]
        elif self._wants_companion():
            self.companion_bandwidth_x_ = self._select_companion_bandwidth(cells, labels, embedding_cells, params,
                                                                           report)
            self.pooled_weight_ = self._choose_pooled_weight(cells, labels, embedding_cells, params, report)
        if self.pooled_weight_ > 0:
            report("Fitting the pooled companion", 0.9)
            self.pooled_classifier_ = MarginalTransferClassifier(**self._companion_params(params)).fit(
                cells, labels, embedding_samples=embedding_cells, groups=self.groups_)

    def _fit_adaptive(self, cells, embedding_cells, labels, params, report):
        """The adapted populations (``adaptive_lda_``) and their share (``adaptive_weight_``)."""
        self.adaptive_lda_, self.adaptive_weight_ = None, 0.0
        if self.method != "marginal":  # the baselines (pooling, multitask) gate as fitted
            return
        if self.adaptive_weight != "auto" and float(self.adaptive_weight) == 0.0:
            return
        if self.adaptive_weight == "auto":
            report("Weighing the adapted populations (cross-validation over groups)", 0.92)
            weight = self._choose_adaptive_weight(cells, embedding_cells, labels, params)
        else:
            weight = float(self.adaptive_weight)
        if weight > 0:
            self.adaptive_lda_ = AdaptiveLDA().fit(cells, labels, classes=self.populations_)
            self.adaptive_weight_ = weight

    def _choose_adaptive_weight(self, cells, embedding_cells, labels, params) -> float:
        """``adaptive_weight="auto"``: the largest weight of ``ADAPTIVE_WEIGHTS`` whose mixture
        gates the held-out groups' patients within ``ADAPTIVE_WEIGHT_TOLERANCE`` of the best
        (mean plus worst-patient accuracy).

        Each fold holds out whole groups and refits the transfer model on the others with the
        hyperparameters selected on all patients (refitting the search in every fold would
        multiply training by the folds), and the Gaussians likewise; each held-out patient is
        gated as a new one (its embedding, self-training and EM from its content-chosen cells)
        on its labeled training cells. The table is ``selection_["adaptive_weight"]``."""
        groups = list(self.groups_)
        if len(set(groups)) < 2:
            # One group (every patient near-duplicates of the others, or one center given):
            # patients are then the only units to hold out.
            groups = list(self.training_patients_)
        unique = sorted(set(groups))
        if len(unique) < 2:
            self.selection_["adaptive_weight"] = {"chosen": FALLBACK_ADAPTIVE_WEIGHT, "folds": 0,
                                                  "reason": "fewer than two patients to hold out"}
            return FALLBACK_ADAPTIVE_WEIGHT
        rng = np.random.default_rng(np.random.SeedSequence([int(self.random_state or 0), 31]))
        order = [unique[i] for i in rng.permutation(len(unique))]
        n_folds = min(int(self.cv_folds), len(unique))
        accuracy = {w: [] for w in ADAPTIVE_WEIGHTS}
        fixed = {"companion_bandwidth_x": self.companion_bandwidth_x_, "pooled_weight": self.pooled_weight_}
        fold_params = dict(params)  # the selected hyperparameters, kept in every fold
        for j in range(n_folds):
            held_groups = set(order[j::n_folds])
            train = [i for i, g in enumerate(groups) if g not in held_groups]
            held = [i for i, g in enumerate(groups) if g in held_groups]
            fold = self._fold_copy([self.groups_[i] for i in train], [self.training_patients_[i] for i in train])
            fold._fit_transfer([cells[i] for i in train], [embedding_cells[i] for i in train],
                               [labels[i] for i in train], fold_params, lambda stage, f: None, fixed=fixed)
            fold.populations_ = [str(c) for c in fold.classifier_.classes_]
            fold.class_prior_ = training_prior([labels[i] for i in train], fold.classifier_.classes_)
            gaussians = AdaptiveLDA().fit([cells[i] for i in train], [labels[i] for i in train],
                                          classes=fold.populations_)
            columns = np.searchsorted(np.asarray(self.populations_), np.asarray(fold.populations_))
            for i in held:
                embedding = fold.classifier_.embed(embedding_cells[i])
                adjust = fold._patient_adjustment(embedding_cells[i], embedding)
                transfer = fold._adjusted_proba(cells[i], embedding, 50_000, adjust)
                adapted = AdaptiveLDA.proba(cells[i], gaussians.adapt(embedding_cells[i]))
                truth = np.asarray(labels[i]).astype(str)
                for w in ADAPTIVE_WEIGHTS:
                    mixed = (1.0 - w) * transfer + w * adapted
                    predicted = np.asarray(self.populations_)[columns[np.argmax(mixed, axis=1)]]
                    accuracy[w].append(float(np.mean(predicted == truth)))
        means = {w: float(np.mean(a)) for w, a in accuracy.items()}
        worst = {w: float(np.min(a)) for w, a in accuracy.items()}
        # A lab signs every patient: the weight is judged by the mean AND the worst held-out
        # patient, equally.
        score = {w: means[w] + worst[w] for w in ADAPTIVE_WEIGHTS}
        best = max(score.values())
        # The held-out patients come from the training groups, so the folds see only the shifts
        # between those groups; a new run can move further, and the adapted populations are what
        # follows it. Among the weights the folds cannot tell apart, the most adapted one.
        chosen = max(w for w, v in score.items() if v >= best - ADAPTIVE_WEIGHT_TOLERANCE)
        self.selection_["adaptive_weight"] = {
            "chosen": chosen, "folds": n_folds,
            "cv_accuracy": {str(w): m for w, m in means.items()},
            "cv_worst": {str(w): v for w, v in worst.items()}}
        return chosen

    def _fold_copy(self, groups, patients) -> "GatingModel":
        """A model with this one's parameters and preprocessing, to fit on some patients only."""
        fold = type(self)(**self.get_params(deep=False))  # a subclass's folds keep its options
        for name in ("channels_", "channel_markers_", "transform_", "center_", "scale_", "dica_",
                     "reference_quantiles_", "reference_landmarks_"):
            setattr(fold, name, getattr(self, name, None))
        fold.groups_, fold.groups_inferred_ = list(groups), self.groups_inferred_
        fold.selection_ = dict(self.selection_)
        fold.training_patients_ = list(patients)
        return fold

    def selection_patients(self, n_patients: int) -> list[int]:
        """Indices of the patients the hyperparameter search runs on: all of them up to
        ``SELECTION_MAX_PATIENTS``, beyond that a seeded draw of that many (sorted).

        Why: the search is 39-45% of a training at up to 50 patients and grows with them; on a
        seeded half of the patients it chose parameters of the same held-out accuracy where
        that could be compared with a full search (docs/scaling.md,
        bench/bench_selection_subset.py). The final fit still uses every patient. Up to
        ``SELECTION_MAX_PATIENTS`` patients nothing changes."""
        if n_patients <= SELECTION_MAX_PATIENTS:
            return list(range(n_patients))
        rng = np.random.default_rng(np.random.SeedSequence([int(self.random_state or 0), 12]))
        return sorted(int(i) for i in rng.choice(n_patients, SELECTION_MAX_PATIENTS, replace=False))

    def _wants_search(self) -> bool:
        """Whether a hyperparameter is left to model selection."""
        wants_x = self.bandwidth_x is None and self.kernel_x != "linear"  # the linear k_X has no sigma_X
        return wants_x or self.alpha is None or (self.method == "marginal" and self.bandwidth_p is None)

    def _embedding_factors(self):
        """The sigma' grid the selection searches (None: sigma' is not selected)."""
        from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS

        return DEFAULT_EMBEDDING_FACTORS if self.select_embedding_bandwidth else None

    def _apply_selection(self, params: dict, result) -> dict:
        """Fill the classifier ``params`` the user left None from a selection ``result`` (in
        place; the embedding dropped when selection fell back to pooling) and return the
        ``selection_`` record."""
        for key in ("bandwidth_x", "bandwidth_p", "alpha"):
            if params[key] is None:
                params[key] = result.params[key]
        if self.bandwidth_p is None and not result.params["use_embedding"]:
            params["use_embedding"], params["bandwidth_p"] = False, None
        record = {"params": {k: params[k] for k in ("bandwidth_x", "bandwidth_p", "alpha")},
                  "embedding_kept": bool(params["use_embedding"]), "cv_accuracy": result.score,
                  "median_x": result.median_x, "median_p": result.median_p, "table": result.table}
        # sigma' only when the search chose it (its table rows carry an e_factor)
        if params["use_embedding"] and any("e_factor" in row for row in result.table):
            params["bandwidth_embedding"] = result.params["bandwidth_embedding"]
            record["bandwidth_embedding"] = float(params["bandwidth_embedding"])
        return record

    def _hedge_params(self, params: dict, selection: dict):
        """Parameters of the marginal method's second fit (``bandwidth_x_hedge``), or None when it
        has none: sigma_X given by the user or not selected, another method, solver or cell kernel,
        or a second bandwidth equal to the selected one."""
        f = self.bandwidth_x_hedge
        if f is None:
            return None
        if (self.method != "marginal" or self.solver != "rff" or self.kernel_x != "gaussian"
                or self.bandwidth_x is not None or "median_x" not in selection):
            return None
        chosen = float(params["bandwidth_x"])
        other = f * max(chosen, float(selection["median_x"]))
        if abs(np.log(other / chosen)) < 1e-9:
            return None
        return {**params, "bandwidth_x": other}

    def _wants_companion(self) -> bool:
        return self.method == "marginal" and self.solver == "rff" and self.pooled_weight != 0

    def _choose_pooled_weight(self, cells, labels, embedding_cells, params, report) -> float:
        if self.pooled_weight != "auto":
            return float(self.pooled_weight)
        from gating_core.method.companion_selection import PREFERRED_POOLED_WEIGHT, select_pooled_weight

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

    def _companion_params(self, params: dict, bandwidth_x=None) -> dict:
        """The pooled companion: the main model's features without the embedding, logistic
        loss, no augmentation, every patient weighing the same; its own selected cell bandwidth
        (``companion_bandwidth_x_``), else the main model's."""
        if bandwidth_x is None:
            bandwidth_x = getattr(self, "companion_bandwidth_x_", None) or self.classifier_.bandwidth_x_
        return {**params, "use_embedding": False, "bandwidth_p": None, "loss": "logistic", "alpha": POOLED_ALPHA,
                "n_augment": 0, "patient_weighting": "uniform", "bandwidth_x": bandwidth_x}

    def _companion_search_base(self, params: dict):
        """The classifier whose sigma_X the companion's selection chooses, or None when the
        companion takes the main model's (sigma_X given by the user, or no selection)."""
        if not self.select or self.bandwidth_x is not None or self.kernel_x == "linear":
            return None
        return MarginalTransferClassifier(**{**self._companion_params(params, bandwidth_x=1.0), "bandwidth_x": None})

    def _select_companion_bandwidth(self, cells, labels, embedding_cells, params, report):
        base = self._companion_search_base(params)
        if base is None or len(cells) < 2:
            return None
        from gating_core.method.selection import select_hyperparameters

        report("Choosing the pooled companion's bandwidth (cross-validation over groups)", 0.88)
        chosen = self.selection_patients(len(cells))
        result = select_hyperparameters([cells[i] for i in chosen], [labels[i] for i in chosen], base,
                                        embedding_samples=[embedding_cells[i] for i in chosen],
                                        cv_folds=self.cv_folds, cv_repeats=self.cv_repeats,
                                        cells_per_patient=self.selection_cells_per_patient,
                                        groups=[self.groups_[i] for i in chosen], objective=self.selection_objective)
        self.selection_["companion"] = {"bandwidth_x": result.params["bandwidth_x"], "cv_accuracy": result.score}
        return result.params["bandwidth_x"]

    def _set_groups(self, groups, embedding_cells, names):
        if groups is not None:
            groups = [str(g) for g in groups]
            if len(groups) != len(names):
                raise ValueError(f"{len(groups)} group labels for {len(names)} patients")
            if len(set(groups)) > 1 or len(groups) < 2:
                self.groups_, self.groups_inferred_ = groups, False
                return
        # No groups, or one for every patient (training on a single center or batch): which
        # patients may validate which is then found from the embeddings, so that replicate twins
        # are never on both sides of a selection fold. Folding one batch's patients one by one
        # chose, on the shared data, a model that gated the other batch at 0.897 in worst
        # patient, against 0.9125 with its near-duplicate pairs kept together.
        inferred = infer_cell_groups(embedding_cells, names, self.n_embedding_features, self.random_state)
        self.groups_ = inferred if groups is None else [f"{g}/{i}" for g, i in zip(groups, inferred)]
        self.groups_inferred_ = True

    def _classifier_params(self) -> dict:
        return dict(use_embedding=self.method == "marginal", solver=self.solver, n_features=self.n_features,
                    n_embedding_features=self.n_embedding_features, bandwidth_x=self.bandwidth_x,
                    bandwidth_p=self.bandwidth_p if self.method == "marginal" else None, alpha=self.alpha,
                    loss=self.loss, n_augment=self.n_augment, augment_gain=self.augment_gain,
                    augment_shift=self.augment_shift, patient_weighting=self.patient_weighting,
                    cells_per_patient=self.cells_per_patient, embedding_cells=self.embedding_cells,
                    random_state=self.random_state,
                    task_similarity=self.task_similarity if self.method == "multitask" else None,
                    kernel_x=self.kernel_x)

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

    def _nearest_training_patient(self, embedding) -> tuple[int, float]:
        """(index, squared Euclidean distance) of the real training patient whose embedding is
        nearest Psi (what novelty and the companion's share per patient both measure)."""
        squared = ((self._patient_embeddings() - np.asarray(embedding, dtype=np.float64)) ** 2).sum(axis=1)
        nearest = int(np.argmin(squared))
        return nearest, float(squared[nearest])

    def _patient_embeddings(self) -> np.ndarray:
        """Embeddings of the real training patients (augmented copies excluded)."""
        return self.classifier_.train_embeddings_[: len(self.training_patients_)]

    # -- gating --------------------------------------------------------------------------------

    def _check_fitted(self):
        """Raise scikit-learn's NotFittedError (what any estimator raises) before fit or load."""
        if not hasattr(self, "classifier_"):
            raise NotFittedError("this GatingModel is not fitted yet: call fit() or GatingModel.load()")

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
        chosen = self._standardise(raw[content_subsample(raw, self.embedding_cells, parallel=True)])
        registration = self._patient_registration(chosen)  # gating_core.model.preprocessing
        return registration, self._registered(chosen, registration)

    @staticmethod
    def _registered(cells, registration):
        return cells if registration is None else registration.transform(cells)

    def novelty(self, sample=None, embedding=None) -> Novelty:
        """Novelty of a patient relative to the training patients (see :class:`Novelty`)."""
        self._check_fitted()
        if embedding is None:
            embedding = self.patient_embedding(sample)
        nearest, squared = self._nearest_training_patient(embedding)
        score = float(np.sqrt(squared) / self.novelty_reference_)
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
        (converted by :func:`gating_core.io.interop.as_sample`)."""
        self._check_fitted()
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        events = sample.events
        registration, embedding, chosen = self._patient_frame(events, indices)
        adjust = self._patient_adjustment(chosen, embedding)
        n = sample.n_events
        # Chunks are whole multiples of the scoring block, so with random features (the default
        # solver) every cell is scored in the same block whatever chunk_size is: results are
        # bitwise independent of it. The linear cell kernel (products of up to 65,536 rows from
        # the chunk's start) and the Nystroem / exact solvers (one product per chunk) put a cell
        # in another product when chunk_size changes, which BLAS may round differently:
        # independent of chunk_size to float32 rounding only.
        chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
        codes = np.empty(n, dtype=np.int16)
        confidence = np.empty(n, dtype=np.float32)
        for start in range(0, n, chunk_size):
            cells = self._registered(self._standardise(events[start:start + chunk_size][:, indices]), registration)
            proba = self._adjusted_proba(cells, embedding, chunk_size, adjust)
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
        return self._adjusted_proba(cells, embedding, 50_000, self._patient_adjustment(chosen, embedding))

    def _adjusted_proba(self, cells, embedding, chunk_size, adjust: PatientAdjustment) -> np.ndarray:
        """The final probabilities of standardised (registered) cells of one patient: the blend
        (:meth:`_proba`), then ``adjust`` (its prior ratio and self-training step), then the
        patient's adapted populations mixed in (``adaptive_weight_``)."""
        if adjust.coef is None:
            proba = adjust(self._proba(cells, embedding, chunk_size))
        else:
            proba = adjust(*self._proba(cells, embedding, chunk_size, project=adjust.coef))
        return adjust.mix(proba, cells, float(getattr(self, "adaptive_weight_", 0.0)))

    def _patient_adjustment(self, chosen, embedding) -> PatientAdjustment:
        """What gating this patient does after the blend (:class:`~gating_core.method.self_training.PatientAdjustment`):
        the EM prior ratio (``prior_shift="em"``), the self-training step (``self_training``)
        and the populations adapted by EM (``adaptive_weight_``), all from its content-chosen
        cells ``chosen`` (m, d), standardised and registered."""
        adjust = self._transfer_adjustment(chosen, embedding)
        lda = getattr(self, "adaptive_lda_", None)
        if lda is not None and float(getattr(self, "adaptive_weight_", 0.0)) > 0:
            # In the order of their content hashes: EM's sums, hence every bit of the adapted
            # populations, then do not depend on the order of the patient's events.
            ordered = chosen[np.argsort(content_hashes(chosen), kind="stable")] if len(chosen) else chosen
            adjust.gaussians = lda.adapt(ordered)
        return adjust

    def _transfer_adjustment(self, chosen, embedding) -> PatientAdjustment:
        """The transfer model's part of :meth:`_patient_adjustment`."""
        ratio = self._prior_ratio(chosen, embedding)
        if not self._self_trains() or len(chosen) == 0:
            return PatientAdjustment(ratio)
        # In the order of their content hashes: the pseudo-labels drawn (and, for the same
        # embedding and prior ratio, every bit of the fit) then do not depend on the order of
        # the patient's events.
        chosen = chosen[np.argsort(content_hashes(chosen), kind="stable")]
        proba = PatientAdjustment(ratio)(self._proba(chosen, embedding, 50_000))
        coef = self_training_coef(self.classifier_._features(chosen, embedding), proba, random_state=self.random_state)
        return PatientAdjustment(ratio, coef)

    def _self_trains(self) -> bool:
        """Whether gating takes the self-training step: ``self_training`` on a marginal model of
        random features (the baselines, pooling and multitask, are left as they are)."""
        return bool(getattr(self, "self_training", False)) and self.method == "marginal" and self.solver == "rff"

    def _prior_ratio(self, chosen, embedding):
        """New prior / training prior of this patient (``prior_shift="em"``), else None.

        Estimated on the content-chosen cells the embedding comes from (``chosen``, (m, d)),
        so it is bounded in cost and identical whatever the chunking."""
        if self.prior_shift == "none":
            return None
        prior = reestimate_prior(self._proba(chosen, embedding, 50_000), self.class_prior_)
        return (prior / self.class_prior_).astype(np.float32)

    def _proba(self, cells, embedding, chunk_size, project=None):
        """Probabilities of standardised cells of one patient: the marginal model's (the mean of
        its two fits when it has a second, ``bandwidth_x_hedge``), blended with the pooled
        companion's (:meth:`companion_weight`) when there is one. With ``project`` (D, k2), also
        the marginal classifier's features of the cells projected on it, from the same
        features: (probabilities, projection)."""
        if project is None:
            proba = self.classifier_.predict_proba(cells, embedding, chunk_size=chunk_size)
        else:
            proba, projected = self.classifier_.predict_proba_and_project(cells, embedding, project)
        hedge = getattr(self, "hedge_classifier_", None)
        if hedge is not None:
            proba += hedge.predict_proba(cells, embedding, chunk_size=chunk_size)
            proba *= np.float32(0.5)
        companion = getattr(self, "pooled_classifier_", None)
        if companion is not None:
            weight = np.float32(self.companion_weight(embedding))
            proba *= np.float32(1.0) - weight
            proba += weight * companion.predict_proba(cells, embedding, chunk_size=chunk_size)
        return proba if project is None else (proba, projected)

    def embedding_support(self, embedding) -> float:
        """How far the marginal model's training reaches to a patient of embedding Psi (2L,):
        k_P(Psi, Psi_i) = exp(-||Psi - Psi_i||^2 / (2 sigma_P^2)) for the nearest real training
        patient i, in [0, 1]; 1 when the model does not use the embedding (k_P = 1).

        The kernel machine's decision for a patient is a sum over training patients weighted
        by k_P, so it fades as k_P does; its random-feature approximation does not fade, it
        turns to noise. Trained on one replicate pair (sigma_P then chosen narrow) and asked
        to gate eight patients of another batch at 2-4 sigma_P away, the marginal model alone
        gated them at 0.12-0.22 accuracy (docs/method.md, "The pooled companion")."""
        self._check_fitted()
        clf = self.classifier_
        if not clf.use_embedding or clf.bandwidth_p_ is None or embedding is None:
            return 1.0
        squared = self._nearest_training_patient(embedding)[1]
        return float(np.exp(-squared / (2.0 * float(clf.bandwidth_p_) ** 2)))

    def companion_weight(self, embedding) -> float:
        """The pooled companion's share of the blend for a patient of embedding Psi:
        ``1 - (1 - pooled_weight_) * s`` with s = :meth:`embedding_support`. Among patients
        like the training ones (s = 1) it is ``pooled_weight_``; as a patient leaves what
        the embedding was trained on, the marginal model's share fades with k_P, as the
        exact kernel machine's would, and the gates become the pooled companion's. 0 when
        there is no companion."""
        if getattr(self, "pooled_classifier_", None) is None:
            return 0.0
        keep = 1.0 - float(self.pooled_weight_)
        return 1.0 - keep * self.embedding_support(embedding)

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
                "transform": self.transform_.to_dict()}


# -- checking a loaded description (GatingModel.load) ------------------------------------------


