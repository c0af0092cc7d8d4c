"""The marginal-transfer classifier on arrays: f(P, x) learned from labeled samples.

``MarginalTransferClassifier`` is the array-level estimator (scikit-learn conventions). It
knows nothing of FCS files, channels or transforms; :class:`gating_core.model.estimator.GatingModel`
wraps it with those. Inputs are already on the gating scale (transformed, standardised).

Objective (Blanchard et al., JMLR 2021, eq. 5) with every patient weighing the same:

    min_f (1/N) sum_i (1/n_i) sum_j loss(f(P_i, X_ij), Y_ij) + lambda ||f||^2

The solver is regularised least squares on one-hot targets (kernel ridge classification) in the
random-feature space. Its sufficient statistics are per-patient D x D Gram matrices, accumulated
in chunks (O(D^2) memory whatever the number of cells), so that leaving patients out for
cross-validation is a subtraction and a whole path of lambda values costs one eigendecomposition.
That is what makes model selection over patients affordable by default. Probabilities come from
a softmax of the ridge scores whose temperature is fitted on out-of-patient predictions (the same
idea as a calibrated linear SVM): a cell's confidence reflects how often scores like its own were
right on patients the model had not seen, and the calibration never changes the predicted label
(:mod:`gating_core.method.calibration`). Scoring cells is in :mod:`gating_core.method.prediction`.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from gating_core.method.calibration import out_of_group_temperature
from gating_core.method.features import KERNELS_X
from gating_core.method.landmarks import LandmarkFeatures
from gating_core.method.losses import LOSSES as LOSS_TYPES
from gating_core.method.losses import Loss, TrainingRows, loss_for
from gating_core.method.prediction import ClassifierPrediction, patient_rows, validate_data
from gating_core.method.training_problem import TrainingProblem, check_training_set

SOLVERS = ("rff", "nystroem", "exact")
LOSSES = tuple(LOSS_TYPES)  # the names, as the model file and the command line check them
PATIENT_WEIGHTINGS = ("uniform", "agnostic")


class MarginalTransferClassifier(ClassifierPrediction, ClassifierMixin, BaseEstimator):
    """Classifier f(P, x) over cells x of a patient whose cell distribution is P.

    Parameters
    ----------
    use_embedding : bool, default=True
        False sets k_P = 1: one classifier on all cells (the pooling baseline).
    solver : {"rff", "nystroem", "exact"}, default="rff"
        Two-stage random Fourier features, Nystroem landmarks, or the exact kernel machine
        (all training cells as landmarks; only for small problems).
    n_features : int, default=512
        D, random features (rff) or landmarks (nystroem).
    n_embedding_features : int, default=128
        L, frequencies of the mean embedding (the embedding has 2L entries).
    bandwidth_x : float or None
        sigma_X of the cell kernel; None: the median distance between training cells.
    bandwidth_p : float or None
        sigma_P of the kernel on embeddings; None: the median distance between training
        embeddings.
    bandwidth_embedding : float or None
        sigma' of the embedding kernel k'_X; None: the median distance between training cells.
    alpha : float, default=1e-4
        lambda, the penalty on ||f||^2.
    loss : {"squared", "logistic", "hinge"}, default="squared"
        Squared loss on one-hot targets (kernel ridge classification; closed form, and the
        statistics that make cross-validation a subtraction), multinomial cross-entropy
        (iterative; probabilities without a separate calibration), or the hinge loss of the
        papers' experiments: a cost-sensitive linear SVM on the features (one-vs-rest, cell
        costs c_ij = 1/(lambda N n_i); :func:`~gating_core.method.solvers.fit_weighted_hinge`), a
        baseline; its margins are calibrated like the ridge scores (refits on held-out groups).
        Each is an object of :mod:`gating_core.method.losses` (:func:`~gating_core.method.losses.loss_for`).
    task_similarity : float in (0, 1] or None, default=None
        tau of the multitask kernel k_P(P_i, P_j) = tau for two different training patients,
        1 for the same one (NIPS 2011 / JMLR 2021 section 7.1), instead of a kernel on the
        embeddings: each training patient (and augmented copy) is a task, squared loss
        (:func:`~gating_core.method.ridge.multitask_ridge_solve`). A new patient has no task of its
        own, so it is gated by the part shared across tasks. Needs ``use_embedding=False`` and
        the squared loss. None: no multitask kernel.
    kernel_x : {"gaussian", "linear"}, default="gaussian"
        The cell kernels k_X and k'_X. "linear", as in the JMLR flow-cytometry experiment
        (section 8.5): k'_X(x, x') = <x, x'>, so Psi(P) is the patient's mean cell
        (:class:`~gating_core.method.features.LinearMeanEmbedding`, d entries), and the kernel is
        k_P(Psi, Psi') (<x, x'> + 1) with Gaussian k_P
        (:class:`~gating_core.method.features.LinearProductFeatures`; ``n_features`` is the budget
        D_P (d + 1)); without the embedding, a linear model on [x, 1]. ``bandwidth_x`` and
        ``bandwidth_embedding`` are then unused. Needs ``solver="rff"``.
    n_augment : int, default=0
        Copies of every training patient with a simulated instrument shift (a random gain and
        offset per channel, in standardised units) added to training as further patients, with
        the source's labels. They teach the model how a center's shift moves both the cells
        and the embedding, so that it adapts to a shifted new patient instead of extrapolating.
    augment_gain, augment_shift : float or "auto", default=0.08 and 0.15
        Standard deviations of the log-gain and of the offset of those shifts (standardised
        units: 0.15 moves a channel by 15% of its spread across all cells). "auto" measures
        them per channel from the training patients themselves: how much the groups' (centers')
        channel medians and log inter-quartile ranges differ
        (:func:`~gating_core.method.augmentation.shift_spread`). Centers that differ a lot teach
        large shifts; near-identical runs teach almost none.
    patient_weighting : {"uniform", "agnostic"}, default="uniform"
        "uniform" weighs every patient the same (the 1/n_i objective). "agnostic" minimises the
        loss of the worst mixture of training patients: the patient weights are updated by
        exponentiated gradient on each patient's loss (a few refits), so that patients the
        model gates badly count more.
    cells_per_patient : int, default=4000
        Cells drawn (seeded, uniformly) from each training patient for the solver.
    embedding_cells : int, default=20000
        At most this many cells (chosen by content hash) make up a patient's embedding.
    calibrate : bool, default=True
        Fit the probability calibration on out-of-patient scores (needs two or more patients).
    random_state : int, default=0

    Data (see :meth:`fit`): the array form ``fit(X, y, groups=patient_of_each_cell)`` /
    ``predict(X, groups=...)``, as scikit-learn tools pass it, or the list form ``fit(list of
    per-patient arrays, list of label arrays, groups=center_of_each_patient)``; the same cells
    give identical models either way. Without ``groups`` the array form is ONE patient. A cell's
    prediction depends on its patient's whole cell distribution: predicting part of a patient
    (a subset of its cells) is predicting another distribution. The centers / batches / runs of
    the patients (``groups`` of the list form, ``centers`` of the array form) make calibration
    hold out whole centers, and augmented copies stay with their source.

    ``sklearn.utils.estimator_checks.check_estimator`` passes, except the checks listed with
    their reasons in :data:`~gating_core.method.sklearn_checks.EXPECTED_FAILED_CHECKS` (the
    predictions' dependence on the batch of cells is the method, not a defect):
    ``check_estimator(clf, expected_failed_checks=expected_failed_checks(clf))``.

    Prediction (``predict``, ``predict_proba``, ``decision_function``, ``ridge_scores``,
    ``embed``) is the mixin :class:`~gating_core.method.prediction.ClassifierPrediction`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    bandwidth_x_, bandwidth_p_, bandwidth_embedding_ : float (bandwidth_p_ None for pooling)
    embedder_ : MeanEmbedding
    train_embeddings_ : ndarray of shape (n_patients * (1 + n_augment), 2L)
        Embeddings of the training patients, then of their augmented copies (without the
        embedding, ``use_embedding=False``, a copy holds its source patient's: nothing reads it).
    n_patients_ : int
        Real training patients (the first rows of ``train_embeddings_``).
    patient_source_ : ndarray of shape (n_patients * (1 + n_augment),)
        The real patient each training row (or augmented copy) comes from.
    patient_weights_ : ndarray of shape (n_patients * (1 + n_augment),)
        Weight of each training patient in the objective (sums to 1).
    coef_ : ndarray of shape (D, n_classes);  intercept_ : ndarray of shape (n_classes,)
        Ridge scores s = features @ coef_ + intercept_.
    temperature_ : float
        Probabilities softmax(temperature_ * s).
    n_features_in_ : int
    """

    def __init__(self, use_embedding=True, solver="rff", n_features=512, n_embedding_features=128,
                 bandwidth_x=None, bandwidth_p=None, bandwidth_embedding=None, alpha=1e-4,
                 loss="squared", n_augment=0, augment_gain=0.08, augment_shift=0.15,
                 patient_weighting="uniform", cells_per_patient=4000, embedding_cells=20000,
                 calibrate=True, random_state=0, task_similarity=None, kernel_x="gaussian"):
        self.use_embedding = use_embedding
        self.solver = solver
        self.n_features = n_features
        self.n_embedding_features = n_embedding_features
        self.bandwidth_x = bandwidth_x
        self.bandwidth_p = bandwidth_p
        self.bandwidth_embedding = bandwidth_embedding
        self.alpha = alpha
        self.loss = loss
        self.n_augment = n_augment
        self.augment_gain = augment_gain
        self.augment_shift = augment_shift
        self.patient_weighting = patient_weighting
        self.cells_per_patient = cells_per_patient
        self.embedding_cells = embedding_cells
        self.calibrate = calibrate
        self.random_state = random_state
        self.task_similarity = task_similarity
        self.kernel_x = kernel_x

    # -- fitting -----------------------------------------------------------------------------

    def fit(self, X, y, groups=None, *, embedding_samples=None, centers=None):
        """Learn from labeled patients.

        Two forms of the same data, with identical results for the same cells:

        - array form (scikit-learn's): ``X`` of shape (n_cells, d), ``y`` of shape (n_cells,) and
          ``groups`` of shape (n_cells,), the patient of each cell. Patients are taken in order
          of their first cell, each patient's cells in input order. ``groups=None`` makes all
          cells ONE patient (a single cell distribution: the embedding is then constant and
          the model is a plain kernel classifier, calibrated at a fixed temperature).
          Labels keep their type (``classes_`` is ``np.unique(y)``).
        - list form (a convenience): ``X`` a list of (n_i, d) arrays, one per patient, ``y`` a
          list of (n_i,) label arrays. Labels are compared as strings (``classes_`` holds str).

        Parameters
        ----------
        X : ndarray of shape (n_cells, d), or list of ndarray of shape (n_i, d)
        y : ndarray of shape (n_cells,), or list of ndarray of shape (n_i,)
        groups : array-like
            Array form: (n_cells,), the patient of each cell (None: one patient).
            List form: (n_patients,), the center / batch / run of each patient: calibration
            holds out whole groups, and augmented copies stay with their source.
        embedding_samples : list of ndarray of shape (m_i, d) or None
            List form only: the cells each patient's embedding is computed from, when the
            caller chose them (as :class:`~gating_core.model.estimator.GatingModel` does); default:
            ``X``.
        centers : array-like of shape (n_cells,) or None
            Array form only: the center / batch / run of each cell's patient (constant within
            a patient); what ``groups`` is in the list form.

        Returns
        -------
        self
        """
        self._forget_fit()
        samples, labels, patient_groups = self._training_patients(X, y, groups, embedding_samples, centers)
        self._check_options()
        problem = TrainingProblem(self, samples, labels, embedding_samples, patient_groups)
        feature_map = problem.feature_map(problem.bandwidth_x, problem.bandwidth_p)
        uses_statistics = self._loss_function().uses_statistics
        if uses_statistics and self.patient_weighting == "uniform":
            # The statistics read each row once and calibration each row once more (the rows
            # it holds out): features recomputed row by row rather than all held at once, so
            # memory does not grow with rows x cells x D (8 GB at 200 patients x 5 copies).
            features = problem.row_features(feature_map)
            stats = problem.statistics(features)
        else:
            # Iterative solvers read every row at every step: one stacked float32 store. The
            # iterative losses never read the ridge statistics (their calibration refits too).
            features = problem.row_features(feature_map, store=True)
            stats = problem.statistics(features) if uses_statistics else None
        return self.fit_prepared(problem, feature_map, features, stats, patient_groups)

    def fit_prepared(self, problem, feature_map, features, stats=None, groups=None, warm_start=None, gtol=None,
                     curvature=None):
        """Fit from a :class:`TrainingProblem` already built: what :meth:`fit` does once the
        features are computed.

        The held-out check (:mod:`gating_core.evaluation.held_out`) builds one problem for all patients
        and fits each fold on :meth:`TrainingProblem.subset` of it, without touching cells again.

        Parameters
        ----------
        problem : TrainingProblem (built with this estimator's parameters)
        feature_map : the map ``features`` came from (:meth:`TrainingProblem.feature_map`)
        features : list of ndarray of shape (m_r, D), one per training row of ``problem``
        stats : RidgeStatistics or None
            ``problem.statistics(features)``; needed by the squared loss only.
        groups : sequence of length problem.n_patients or None
            Center / batch / run of each real patient (calibration holds out whole groups).
        warm_start : (coef (D, k), intercept (k,)) or None
            Starting point of the logistic loss's iterations (ignored by the squared loss).
        gtol : float or None
            Where the logistic or hinge loss's L-BFGS stops (largest gradient entry); None:
            :data:`gating_core.method.lbfgs.LBFGS_GTOL`, as :meth:`fit` does.
        curvature : ndarray of shape (k, D + 1, D + 1) or None
            The logistic loss's curvature near the solution (:func:`gating_core.method.solvers.logistic_curvature`),
            with ``warm_start``: preconditions its iterations (the same stopping rule).

        Returns
        -------
        self
        """
        self._forget_fit()
        self._check_options()
        loss, n_rows = self._loss_function(), problem.n_rows
        if loss.uses_statistics and stats is None:
            stats = problem.statistics(features)
        data = TrainingRows(features, problem.targets, len(problem.classes), stats)
        weights = np.full(n_rows, 1.0 / n_rows)
        coef, intercept = loss.fit(data, range(n_rows), warm=warm_start, gtol=gtol, curvature=curvature)
        if self.patient_weighting == "agnostic":
            coef, intercept, weights = self._fit_agnostic(problem, loss, data, coef, intercept)
        coef, intercept = coef.astype(np.float32), intercept.astype(np.float32)
        temperature = out_of_group_temperature(problem, loss, data, weights, groups, start=(coef, intercept),
                                               calibrate=self.calibrate, random_state=self.random_state)
        self._set_fitted(problem, feature_map, coef, intercept, weights, temperature)
        return self

    def _forget_fit(self):
        """Drop the fitted state of an earlier fit, so that a refit (or a failed one) leaves
        nothing stale behind (e.g. ``feature_map_`` after switching to ``solver="exact"``)."""
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("__")]:
            delattr(self, name)

    def _training_patients(self, X, y, groups, embedding_samples, centers):
        """Validated (per-patient cells, per-patient labels, per-patient groups) of either form."""
        if _is_patient_list(X):
            if centers is not None:
                raise ValueError("centers= goes with the array form; in the list form (one array per "
                                 "patient) groups= gives each patient's center")
            samples, labels = check_training_set(X, y)
            if groups is not None and len(groups) != len(samples):
                raise ValueError(f"{len(groups)} group labels for {len(samples)} patients")
            if embedding_samples is not None and len(embedding_samples) != len(samples):
                raise ValueError(f"{len(embedding_samples)} embedding samples for {len(samples)} patients")
            return samples, labels, groups
        if embedding_samples is not None:
            raise ValueError("embedding_samples= goes with the list form (one array per patient)")
        # float32 is what the solver works in (as check_training_set gives the list form).
        X, y = validate_data(self, X, y, dtype=np.float32)
        check_classification_targets(y)
        rows = patient_rows(groups, len(X))
        patient_groups = None
        if centers is not None:
            centers = np.asarray(centers)
            if centers.shape != (len(X),):
                raise ValueError(f"centers has shape {centers.shape}; expected one entry per cell ({len(X)},)")
            patient_groups = []
            for r in rows:
                values = np.unique(centers[r])
                if len(values) != 1:
                    raise ValueError(f"patient {groups[r[0]]!r} has cells in {len(values)} centers; a patient "
                                     "belongs to one center")
                patient_groups.append(values[0])
        if len(rows) == 1:
            return [X], [y], patient_groups
        return [X[r] for r in rows], [y[r] for r in rows], patient_groups

    def _check_options(self):
        for name, value, allowed in (("solver", self.solver, SOLVERS), ("loss", self.loss, LOSSES),
                                     ("patient_weighting", self.patient_weighting, PATIENT_WEIGHTINGS),
                                     ("kernel_x", self.kernel_x, KERNELS_X)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.kernel_x == "linear" and self.solver != "rff":
            raise ValueError(f"kernel_x='linear' needs solver='rff' (its features are exact in the cells), "
                             f"got solver={self.solver!r}")
        if self.task_similarity is not None:
            if not 0.0 < float(self.task_similarity) <= 1.0:
                raise ValueError(f"task_similarity must be within (0, 1] or None, got {self.task_similarity!r}")
            if self.use_embedding or not loss_for(self.loss).uses_statistics:
                raise ValueError("the multitask kernel (task_similarity) replaces the embedding's kernel and "
                                 "uses the squared loss: set use_embedding=False and loss='squared'")
        if int(self.n_augment) < 0:
            raise ValueError(f"n_augment must be >= 0, got {self.n_augment!r}")

    def _set_fitted(self, problem, feature_map, coef, intercept, weights, temperature):
        """The fitted state, set in one place at the end of :meth:`fit`."""
        self.n_features_in_ = problem.n_features_in
        self.classes_ = problem.classes
        self.n_patients_ = problem.n_patients
        self.patient_source_ = problem.source
        if problem.augment_gain is not None:
            self.augment_gain_, self.augment_shift_ = problem.augment_gain, problem.augment_shift
        self.median_distance_x_, self.median_distance_p_ = problem.median_distance_x, problem.median_distance_p
        self.bandwidth_x_, self.bandwidth_p_ = problem.bandwidth_x, problem.bandwidth_p
        self.bandwidth_embedding_ = problem.bandwidth_embedding
        self.embedder_ = problem.embedder
        self.train_embeddings_ = problem.embeddings
        if isinstance(feature_map, LandmarkFeatures):
            self.landmark_cells_ = feature_map.cells
            self.landmark_embeddings_ = feature_map.embeddings
            self.landmark_projection_ = feature_map.projection
        else:
            self.feature_map_ = feature_map
        self.patient_weights_ = weights
        self.coef_, self.intercept_ = coef, intercept
        self.temperature_ = temperature

    def _loss_function(self) -> Loss:
        """The :mod:`~gating_core.method.losses` object of ``loss`` at this penalty (and multitask kernel)."""
        if self.task_similarity is None:
            return loss_for(self.loss, alpha=self.alpha)
        return loss_for(self.loss, alpha=self.alpha, task_similarity=float(self.task_similarity))

    def _fit_agnostic(self, problem, loss, data, coef, intercept, rounds=8, step=1.0):
        """Exponentiated-gradient updates of the patient weights towards the worst mixture.

        The weights of the copies of one real patient move together: the adversary reweighs
        patients, not instrument shifts. Returns the coefficients, intercept and row weights.
        """
        source, n_patients = problem.source, problem.n_patients
        q = np.full(n_patients, 1.0 / n_patients)
        for _ in range(rounds):
            losses = loss.patient_losses(data, coef, intercept)
            per_patient = np.bincount(source, weights=losses, minlength=n_patients) / np.bincount(source)
            q = q * np.exp(step * per_patient / max(per_patient.mean(), 1e-12))
            q /= q.sum()
            weights = q[source] / np.bincount(source)[source]
            coef, intercept = loss.fit(data, range(len(data.features)), weights, warm=(coef, intercept))
        return coef, intercept, q[source] / np.bincount(source)[source]


def _is_patient_list(X) -> bool:
    """True for the list form of the training data: a list/tuple of 2-D per-patient arrays."""
    return isinstance(X, (list, tuple)) and len(X) > 0 and np.ndim(X[0]) == 2
