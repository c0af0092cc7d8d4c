"""The marginal-transfer classifier on arrays: f(P, x) learned from labeled samples.

``MarginalTransferClassifier`` is the array-level estimator (scikit-learn conventions). It
knows nothing of FCS files, channels or transforms; :class:`gating_core.model.GatingModel`
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
right on patients the model had not seen, and the calibration never changes the predicted label.
"""

from __future__ import annotations

import copy
import os

import numpy as np
from scipy.linalg import eigh
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

try:
    from sklearn.utils.validation import validate_data
except ImportError:  # scikit-learn < 1.6: the same check was a private method of the estimator
    def validate_data(estimator, X, y="no_validation", **kwargs):
        return estimator._validate_data(X, y, **kwargs)

from gating_core.features import ExactKernel, MeanEmbedding, ProductRFF, median_pairwise_distance

SOLVERS = ("rff", "nystroem", "exact")
LOSSES = ("squared", "logistic")
PATIENT_WEIGHTINGS = ("uniform", "agnostic")
SCORE_BLOCK = 2048


def score_threads() -> int:
    """Threads that score blocks of cells: ``$GATING_SCORE_THREADS``, else up to 4 usable CPUs.

    Dask workers set it to 1 (one thread per worker process, parallelism across files).
    """
    from gating_core.cpus import usable_cpus  # the CPUs this process may use, not the machine's

    value = os.environ.get("GATING_SCORE_THREADS", "")
    return max(1, int(value)) if value.isdigit() else min(4, usable_cpus())


def content_subsample(x: np.ndarray, max_cells: int) -> np.ndarray:
    """Indices of at most ``max_cells`` rows of ``x`` chosen by a hash of each row's values.

    Unlike a random draw, the choice depends only on the cells themselves, not on their order,
    so a patient's embedding (and thus every prediction) is invariant to permuting its cells.
    """
    n = len(x)
    if n <= max_cells:
        return np.arange(n)
    return np.sort(np.argpartition(content_hashes(x), max_cells - 1)[:max_cells])


def content_hashes(x: np.ndarray) -> np.ndarray:
    """The hash of each row's float32 values that :func:`content_subsample` ranks: (n,) uint64.

    Each row's hash depends on that row alone, so it can be computed chunk by chunk."""
    n = len(x)
    # Widen one column at a time: a whole (n, d) uint64 copy would cost twice the event array.
    rows = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    golden = np.uint64(0x9E3779B97F4A7C15)
    h = np.full(n, golden, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows.shape[1]):
            h ^= rows[:, j].astype(np.uint64) + golden + (h << np.uint64(6)) + (h >> np.uint64(2))
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
    return h


class RidgeStatistics:
    """Per-patient sufficient statistics of the weighted ridge problem on features F_i.

    For patient i with features F_i (n_i, D) and one-hot targets Y_i (n_i, k), holds
    G_i = F_i^T F_i / n_i, s_i = mean(F_i), B_i = F_i^T Y_i / n_i, t_i = mean(Y_i), so that the
    solution for any subset of patients and any lambda follows without touching cells again.
    """

    def __init__(self, n_features: int, n_classes: int):
        self.gram, self.feature_mean, self.cross, self.target_mean = [], [], [], []
        self.n_features, self.n_classes = n_features, n_classes

    def add_patient(self, feature_chunks, target_chunks) -> int:
        """Accumulate one patient from iterables of (m, D) features and (m, k) targets."""
        g = np.zeros((self.n_features, self.n_features))
        b = np.zeros((self.n_features, self.n_classes))
        s = np.zeros(self.n_features)
        t = np.zeros(self.n_classes)
        n = 0
        for f, y in zip(feature_chunks, target_chunks):
            g += (f.T @ f).astype(np.float64)
            b += (f.T @ y).astype(np.float64)
            s += f.sum(axis=0, dtype=np.float64)
            t += y.sum(axis=0, dtype=np.float64)
            n += len(f)
        self.gram.append(g / n)
        self.cross.append(b / n)
        self.feature_mean.append(s / n)
        self.target_mean.append(t / n)
        return len(self.gram) - 1

    def eigen(self, patients, weights=None):
        """Eigendecomposition of the centred Gram matrix of ``patients``.

        ``weights`` (one per patient index, any scale) weigh the patients; default: equal.
        """
        patients = list(patients)
        w = np.ones(len(patients)) if weights is None else np.asarray(weights, dtype=np.float64)[patients]
        w = w / w.sum()
        g = sum(wi * self.gram[i] for wi, i in zip(w, patients))
        mu = sum(wi * self.feature_mean[i] for wi, i in zip(w, patients))
        b = sum(wi * self.cross[i] for wi, i in zip(w, patients))
        t = sum(wi * self.target_mean[i] for wi, i in zip(w, patients))
        g_c = g - np.outer(mu, mu)
        b_c = b - np.outer(mu, t)
        values, vectors = eigh(g_c, driver="evd")
        return np.maximum(values, 0.0), vectors, vectors.T @ b_c, mu, t

    def subset(self, rows, class_columns=None):
        """Statistics of ``rows`` only (a new object sharing the per-row arrays); with
        ``class_columns``, of those target columns only (the classes a subset still holds)."""
        rows = [int(r) for r in rows]
        out = RidgeStatistics(self.n_features, self.n_classes if class_columns is None else len(class_columns))
        out.gram = [self.gram[r] for r in rows]
        out.feature_mean = [self.feature_mean[r] for r in rows]
        out.cross = [self.cross[r] if class_columns is None else self.cross[r][:, class_columns] for r in rows]
        out.target_mean = [self.target_mean[r] if class_columns is None else self.target_mean[r][class_columns]
                           for r in rows]
        return out

    @staticmethod
    def solve(eigen, alpha: float):
        """Coefficients (D, k) and intercept (k,) for ridge penalty ``alpha`` from ``eigen``."""
        values, vectors, projected, mu, t = eigen
        coef = vectors @ (projected / (values + alpha)[:, None])
        return coef, t - mu @ coef


#: scikit-learn estimator checks that cannot apply to a marginal-transfer classifier, with why.
#: :func:`expected_failed_checks` gives those that apply to one estimator.
EXPECTED_FAILED_CHECKS = {
    "check_methods_subset_invariance": (
        "predictions depend on the patient's whole cell distribution (its kernel mean embedding): "
        "without groups, the cells passed together are one patient, so a subset of them is another "
        "patient with another embedding. Per patient (groups=...), results do not depend on batching."),
}


def expected_failed_checks(estimator) -> dict:
    """The :data:`EXPECTED_FAILED_CHECKS` that apply to ``estimator``: none without the
    embedding (``use_embedding=False``, pooling), whose predictions do not depend on the batch."""
    return dict(EXPECTED_FAILED_CHECKS) if getattr(estimator, "use_embedding", False) else {}


class MarginalTransferClassifier(ClassifierMixin, BaseEstimator):
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
    loss : {"squared", "logistic"}, default="squared"
        Squared loss on one-hot targets (kernel ridge classification; closed form, and the
        statistics that make cross-validation a subtraction) or multinomial cross-entropy
        (iterative; probabilities without a separate calibration).
    n_augment : int, default=0
        Copies of every training patient with a simulated instrument shift (a random gain and
        offset per channel, in standardised units) added to training as further patients, with
        the source's labels. They teach the model how a center's shift moves both the cells
        and the embedding, so that it adapts to a shifted new patient instead of extrapolating.
    augment_gain, augment_shift : float or "auto", default=0.08 and 0.15
        Standard deviations of the log-gain and of the offset of those shifts (standardised
        units: 0.15 moves a channel by 15% of its spread across all cells). "auto" measures
        them per channel from the training patients themselves: how much the groups' (centers')
        channel medians and log inter-quartile ranges differ (:func:`shift_spread`). Centers
        that differ a lot teach large shifts; near-identical runs teach almost none.
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
    their reasons in :data:`EXPECTED_FAILED_CHECKS` (the predictions' dependence on the batch
    of cells is the method, not a defect): ``check_estimator(clf,
    expected_failed_checks=expected_failed_checks(clf))``.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    bandwidth_x_, bandwidth_p_, bandwidth_embedding_ : float (bandwidth_p_ None for pooling)
    embedder_ : MeanEmbedding
    train_embeddings_ : ndarray of shape (n_patients * (1 + n_augment), 2L)
        Embeddings of the training patients, then of their augmented copies.
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
                 calibrate=True, random_state=0):
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
            caller chose them (as :class:`~gating_core.model.GatingModel` does); default:
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
        features = problem.features(feature_map)
        # The logistic loss never reads the ridge statistics (its temperature is 1).
        stats = problem.statistics(features) if self.loss == "squared" else None
        return self.fit_prepared(problem, feature_map, features, stats, patient_groups)

    def fit_prepared(self, problem, feature_map, features, stats=None, groups=None, warm_start=None):
        """Fit from a :class:`TrainingProblem` already built: what :meth:`fit` does once the
        features are computed.

        The held-out check (:mod:`gating_core.held_out`) builds one problem for all patients
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

        Returns
        -------
        self
        """
        self._forget_fit()
        self._check_options()
        targets, n_classes, n_rows = problem.targets, len(problem.classes), problem.n_rows
        if self.loss == "squared" and stats is None:
            stats = problem.statistics(features)
        weights = np.full(n_rows, 1.0 / n_rows)
        if self.loss == "squared":
            coef, intercept = self._ridge_fit(stats, range(n_rows))
        else:
            coef, intercept = self._logistic_fit(features, targets, range(n_rows), n_classes, warm=warm_start)
        if self.patient_weighting == "agnostic":
            coef, intercept, weights = self._fit_agnostic(problem, stats, features, coef, intercept)
        coef, intercept = coef.astype(np.float32), intercept.astype(np.float32)
        temperature = self._fit_calibration(problem, stats, features, weights, groups)
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
                                     ("patient_weighting", self.patient_weighting, PATIENT_WEIGHTINGS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
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

    def _ridge_fit(self, stats, rows, weights=None):
        return RidgeStatistics.solve(stats.eigen(rows, weights), self.alpha)

    def _logistic_fit(self, features, targets, rows, n_classes, weights=None, warm=None):
        rows = list(rows)
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)[rows]
        w = w / w.sum()
        return fit_weighted_logistic([features[i] for i in rows], [targets[i] for i in rows], w,
                                     n_classes, self.alpha, warm=warm)

    def _patient_losses(self, features, targets, coef, intercept):
        losses = np.empty(len(features))
        for i, (f, t) in enumerate(zip(features, targets)):
            scores = f @ coef.astype(np.float32) + intercept.astype(np.float32)
            if self.loss == "squared":
                onehot = np.zeros_like(scores)
                onehot[np.arange(len(t)), t] = 1.0
                losses[i] = float(np.mean(((scores - onehot) ** 2).sum(axis=1)))
            else:
                z = scores.astype(np.float64)
                z -= z.max(axis=1, keepdims=True)
                losses[i] = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(t)), t]))
        return losses

    def _fit_agnostic(self, problem, stats, features, coef, intercept, rounds=8, step=1.0):
        """Exponentiated-gradient updates of the patient weights towards the worst mixture.

        The weights of the copies of one real patient move together: the adversary reweighs
        patients, not instrument shifts. Returns the coefficients, intercept and row weights.
        """
        source, n_patients, targets = problem.source, problem.n_patients, problem.targets
        q = np.full(n_patients, 1.0 / n_patients)
        for _ in range(rounds):
            losses = self._patient_losses(features, targets, coef, intercept)
            per_patient = np.bincount(source, weights=losses, minlength=n_patients) / np.bincount(source)
            q = q * np.exp(step * per_patient / max(per_patient.mean(), 1e-12))
            q /= q.sum()
            weights = q[source] / np.bincount(source)[source]
            rows = range(len(features))
            if self.loss == "squared":
                coef, intercept = self._ridge_fit(stats, rows, weights)
            else:
                coef, intercept = self._logistic_fit(features, targets, rows, len(problem.classes), weights,
                                                     warm=(coef, intercept))
        return coef, intercept, q[source] / np.bincount(source)[source]

    def _fit_calibration(self, problem, stats, features, weights, groups=None) -> float:
        """Softmax temperature fitted on out-of-group scores.

        One scalar keeps the decision (the argmax) unchanged and turns scores into
        probabilities that are honest on patients the model has not seen. The logistic loss
        gives probabilities already: its temperature is 1.
        """
        from gating_core.groups import group_folds

        n_patients = problem.n_patients
        if self.loss == "logistic":
            return 1.0
        if not self.calibrate or n_patients < 2:
            return 10.0  # no patient to hold out: a fixed, moderate sharpness
        labels = list(range(n_patients)) if groups is None else list(groups)
        folds = group_folds(labels, 5, 1, random_state=_seed(self.random_state, 4))
        source = problem.source
        scores, held_targets = [], []
        for held in folds:
            held = set(held)
            rows = [r for r in range(len(features)) if int(source[r]) not in held]
            coef, intercept = self._ridge_fit(stats, rows, weights)
            for i in sorted(held):
                scores.append(features[i] @ coef.astype(np.float32) + intercept.astype(np.float32))
                held_targets.append(problem.targets[i])
        return fit_temperature(scores, held_targets)

    # -- features and prediction ------------------------------------------------------------

    def embed(self, x) -> np.ndarray:
        """Psi of one patient's cells ``x`` (n, d): ndarray of shape (2L,)."""
        check_is_fitted(self)
        return embed_cells(self.embedder_, x, self.embedding_cells)

    def _features(self, x, embedding, out=None):
        if self.solver == "rff":
            return cell_features(self.feature_map_, x, embedding, self.use_embedding, out=out)
        landmarks = LandmarkFeatures(self.landmark_cells_, self.landmark_embeddings_, self.landmark_projection_,
                                     self.bandwidth_x_, self.bandwidth_p_)
        return landmarks.transform(x, embedding)

    def ridge_scores(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Uncalibrated ridge scores of cells: (n_cells, n_classes) float32.

        Parameters
        ----------
        X : ndarray of shape (n_cells, d)
        embedding : ndarray of shape (2L,) or None
            The embedding of the patient ALL of ``X`` belongs to, when the caller has it (as
            :class:`~gating_core.model.GatingModel`, which scores a patient chunk by chunk);
            ``X`` is then only shape-checked. None: computed from ``X`` (or from each patient
            of ``groups``).
        chunk_size : int
            Cells featurised at once on the Nystroem / exact path (bounds memory).
        groups : array-like of shape (n_cells,) or None
            The patient of each cell; each patient's cells are scored with that patient's
            embedding. None: all of ``X`` is one patient.
        """
        return self._scores(X, embedding, chunk_size, groups, calibrated=False)

    def _scores(self, X, embedding, chunk_size, groups, calibrated):
        check_is_fitted(self)
        if embedding is not None:
            if groups is not None:
                raise ValueError("embedding= is one patient's: give groups= or embedding=, not both")
            return self._patient_scores(self._check_cells(X), embedding, chunk_size, calibrated)
        # float64 and float32 cells are scored as they are (no rounding the caller did not ask for).
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        rows = patient_rows(groups, len(X))
        if len(rows) == 1:
            return self._patient_scores(X, self.embed(X), chunk_size, calibrated)
        scores = np.empty((len(X), len(self.classes_)), dtype=np.float32)
        for r in rows:
            x = X[r]
            scores[r] = self._patient_scores(x, self.embed(x), chunk_size, calibrated)
        return scores

    def _patient_scores(self, x, embedding, chunk_size, calibrated):
        """Ridge scores of the cells ``x`` of ONE patient with embedding ``embedding``, times
        the temperature when ``calibrated``: (n, n_classes) float32."""
        scores = np.empty((len(x), len(self.classes_)), dtype=np.float32)
        if self.solver == "rff":
            self._rff_scores(x, embedding, scores)
        else:
            for start in range(0, len(x), chunk_size):
                chunk = x[start:start + chunk_size]
                np.matmul(self._features(chunk, embedding), self.coef_, out=scores[start:start + len(chunk)])
        scores += self.intercept_
        if calibrated:
            scores *= np.float32(self.temperature_)
        return scores

    def _rff_scores(self, x, embedding, scores):
        """scores = cos(x B / sigma_X + phase) (sqrt(2/D) coef), block by block.

        Blocks of SCORE_BLOCK cells keep the (block, D) feature matrix inside the CPU cache, so
        the matmul, cosine and projection run at compute speed rather than memory speed; blocks
        are spread over threads (numpy releases the GIL) with BLAS itself single-threaded, which
        beats BLAS's own threading on such skinny products. The phase and the feature scale are
        folded into the weights so that no extra pass over the features is needed.
        """
        from concurrent.futures import ThreadPoolExecutor

        from threadpoolctl import threadpool_limits

        fm = self.feature_map_
        phase = fm.patient_phase(embedding if self.use_embedding else None)
        weights = np.vstack([fm.cell_weights_, phase[None, :]]).astype(np.float32)
        projection = (self.coef_ * fm.scale_).astype(np.float32)
        d = x.shape[1]

        def run(bounds):
            lo, hi = bounds
            block = np.empty((hi - lo, d + 1), dtype=np.float32)
            block[:, :d] = x[lo:hi]
            block[:, d] = 1.0
            features = block @ weights
            np.cos(features, out=features)
            np.matmul(features, projection, out=scores[lo:hi])

        bounds = [(lo, min(lo + SCORE_BLOCK, len(x))) for lo in range(0, len(x), SCORE_BLOCK)]
        threads = max(1, min(score_threads(), len(bounds)))
        with threadpool_limits(1):
            if threads == 1:
                for b in bounds:
                    run(b)
            else:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(run, bounds))

    def decision_function(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Calibrated class scores.

        Returns
        -------
        ndarray of shape (n_cells, n_classes): log-probabilities up to a per-cell constant;
        with two classes, shape (n_cells,): the log-odds of ``classes_[1]`` (scikit-learn's
        convention; positive means ``classes_[1]``). Arguments as in :meth:`ridge_scores`.
        """
        scores = self._scores(X, embedding, chunk_size, groups, calibrated=True)
        if scores.shape[1] == 2:
            return scores[:, 1] - scores[:, 0]
        return scores

    def predict_proba(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Probability of each class (columns in ``classes_`` order): (n_cells, n_classes).

        Arguments as in :meth:`ridge_scores`: ``groups`` gives each cell's patient (None: one
        patient), or ``embedding`` the embedding of the one patient ``X`` belongs to.
        """
        scores = self._scores(X, embedding, chunk_size, groups, calibrated=True)
        scores -= scores.max(axis=1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=1, keepdims=True)
        return scores

    def predict(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Class of each cell: (n_cells,). Arguments as in :meth:`ridge_scores`."""
        scores = self._scores(X, embedding, chunk_size, groups, calibrated=True)
        return self.classes_[np.argmax(scores, axis=1)]

    def _check_cells(self, x):
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            raise ValueError(f"expected cells with {self.n_features_in_} channels, got shape {x.shape}")
        return x


def _is_patient_list(X) -> bool:
    """True for the list form of the training data: a list/tuple of 2-D per-patient arrays."""
    return isinstance(X, (list, tuple)) and len(X) > 0 and np.ndim(X[0]) == 2


def patient_rows(groups, n_cells: int) -> list:
    """Row indices of each patient of ``groups`` (the patient of each of ``n_cells`` cells).

    Patients in order of their first cell, each patient's rows in increasing order, so that
    stacking per-patient arrays and splitting them again gives back the same arrays in the same
    order. ``groups=None``: one patient holding every row.
    """
    if groups is None:
        return [np.arange(n_cells)]
    groups = np.asarray(groups)
    if groups.shape != (n_cells,):
        raise ValueError(f"groups has shape {groups.shape}; expected the patient of each cell ({n_cells},)")
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.intp)
    rank[np.argsort(first)] = np.arange(len(first))
    codes = rank[inverse.ravel()]
    ordered = np.argsort(codes, kind="stable")
    return np.split(ordered, np.cumsum(np.bincount(codes, minlength=len(first)))[:-1])


def embed_cells(embedder: MeanEmbedding, x, max_cells: int) -> np.ndarray:
    """Psi of one patient's cells ``x`` (n, d), from at most ``max_cells`` of them chosen by
    content (:func:`content_subsample`): ndarray of shape (2L,)."""
    x = np.asarray(x)
    return embedder.transform(x[content_subsample(x, max_cells)])


def cell_features(feature_map, x, embedding, use_embedding=True, out=None) -> np.ndarray:
    """phi(P, x) of cells ``x`` (n, d) of one patient with embedding Psi(P): (n, D) float32.

    ``feature_map``: a :class:`~gating_core.features.ProductRFF` or a :class:`LandmarkFeatures`;
    ``use_embedding=False`` ignores the embedding (k_P = 1).
    """
    if isinstance(feature_map, LandmarkFeatures):
        return feature_map.transform(x, embedding)
    return feature_map.transform(x, feature_map.patient_phase(embedding if use_embedding else None), out=out)


class LandmarkFeatures:
    """Features K((Psi, x), Z) K_ZZ^{-1/2} on landmark (embedding, cell) pairs Z.

    They reproduce the kernel on the landmarks' span: the Nystroem solver, or, with every
    training cell a landmark, the exact kernel machine.

    Parameters
    ----------
    cells : ndarray of shape (m, d);  embeddings : ndarray of shape (m, 2L)
        The landmarks: cells and the embedding of the patient each comes from.
    projection : ndarray of shape (m, D')
    bandwidth_x, bandwidth_p : float (bandwidth_p None: k_P = 1)
    """

    def __init__(self, cells, embeddings, projection, bandwidth_x, bandwidth_p):
        self.cells, self.embeddings, self.projection = cells, embeddings, projection
        self.bandwidth_x, self.bandwidth_p = bandwidth_x, bandwidth_p

    @classmethod
    def from_training(cls, cells, embeddings, bandwidth_x, bandwidth_p, max_landmarks=None, random_state=0):
        """Landmarks from per-patient training cells (list of (m_i, d)) and their patients'
        embeddings (rows of ``embeddings``): all cells, or a seeded draw of ``max_landmarks``."""
        rng = np.random.default_rng(random_state)
        owners = np.concatenate([np.full(len(x), i) for i, x in enumerate(cells)])
        stacked = np.vstack(cells)
        if max_landmarks is not None and len(stacked) > max_landmarks:
            keep = np.sort(rng.choice(len(stacked), max_landmarks, replace=False))
            stacked, owners = stacked[keep], owners[keep]
        landmark_cells = stacked.astype(np.float64)
        landmark_embeddings = embeddings[owners]
        kernel = ExactKernel(bandwidth_x, bandwidth_p)
        gram = kernel(landmark_embeddings, landmark_cells, landmark_embeddings, landmark_cells)
        values, vectors = eigh(gram, driver="evd")
        keep = values > values.max() * 1e-12
        return cls(landmark_cells, landmark_embeddings, vectors[:, keep] / np.sqrt(values[keep]),
                   bandwidth_x, bandwidth_p)

    def transform(self, x, embedding) -> np.ndarray:
        """Features of cells ``x`` (n, d) of one patient with embedding (2L,): (n, D') float32."""
        kernel = ExactKernel(self.bandwidth_x, self.bandwidth_p)
        psi = np.broadcast_to(embedding, (len(x), len(embedding)))
        gram = kernel(psi, x, self.embeddings, self.cells)
        return (gram @ self.projection).astype(np.float32)


class TrainingProblem:
    """Labeled patients made ready for the solver under one classifier's settings; nothing fitted.

    :meth:`MarginalTransferClassifier.fit` solves it once and sets the estimator's fitted
    attributes from it; model selection (:mod:`gating_core.selection`) builds one and solves it
    for many bandwidths and penalties. The estimator is only read (its parameters).

    Parameters
    ----------
    estimator : MarginalTransferClassifier
    samples : list of ndarray of shape (n_i, d), labels : list of ndarray of shape (n_i,) or None
        Validated (:func:`check_training_set`) per-patient cells and labels.
    embedding_samples : list of ndarray of shape (m_i, d) or None
        The cells each patient's embedding comes from; default: ``samples``.
    groups : sequence of length n_patients or None
        Center / batch / run of each patient (for ``augment_gain="auto"``).

    Attributes
    ----------
    cells : list of ndarray of shape (m_r, d), float32
        Per training row: a seeded draw of at most ``cells_per_patient`` cells of each real
        patient, then the augmented copies (``n_augment``) in source order.
    labels, targets : list of ndarray of shape (m_r,)
        Their labels, and the labels as indices into ``classes`` (None without labels).
    classes : ndarray of shape (n_classes,)
    embeddings : ndarray of shape (n_rows, 2L);  embedder : MeanEmbedding
    source : ndarray of shape (n_rows,);  n_patients : int
        The real patient each row comes from; the number of real patients.
    n_features_in : int
    median_distance_x, median_distance_p : float
        Median distance between cells, and between real patients' embeddings.
    bandwidth_x, bandwidth_p, bandwidth_embedding : float (bandwidth_p None without embedding)
        The estimator's, or the medians where it leaves them None.
    augment_gain, augment_shift : ndarray of shape (d,) or None (no augmentation)
    """

    def __init__(self, estimator, samples, labels=None, embedding_samples=None, groups=None):
        p = estimator
        self.solver, self.n_features, self.use_embedding = p.solver, p.n_features, p.use_embedding
        self.random_state = p.random_state
        d = samples[0].shape[1]
        self.n_features_in = d
        rng = np.random.default_rng(p.random_state)
        picks = [_draw(len(x), p.cells_per_patient, rng) for x in samples]
        cells = [np.asarray(x[idx], dtype=np.float32) for x, idx in zip(samples, picks)]
        train_y, self.classes = None, None
        if labels is not None:
            train_y = [np.asarray(y)[idx] for y, idx in zip(labels, picks)]
            self.classes = np.unique(np.concatenate(train_y))
            if len(self.classes) < 2:
                raise ValueError(f"training labels hold a single population ({self.classes[0]!r}): one class "
                                 "only; need two or more")
        sources = list(samples if embedding_samples is None else embedding_samples)
        self.n_patients = len(cells)
        self.source = np.arange(len(cells))
        self.augment_gain = self.augment_shift = None
        if int(p.n_augment) > 0:
            wants_auto = "auto" in (p.augment_gain, p.augment_shift)
            gain_sd, shift_sd = shift_spread(sources, groups) if wants_auto else (None, None)
            self.augment_gain = gain_sd if p.augment_gain == "auto" else np.full(d, float(p.augment_gain))
            self.augment_shift = shift_sd if p.augment_shift == "auto" else np.full(d, float(p.augment_shift))
            cells, train_y, sources, self.source = augment_patients(
                cells, train_y, sources, int(p.n_augment), self.augment_gain, self.augment_shift,
                random_state=_seed(p.random_state, 5))
        self.cells, self.labels = cells, train_y
        self.targets = None if train_y is None else [np.searchsorted(self.classes, y) for y in train_y]
        pooled = np.vstack([x[:500] for x in cells[: self.n_patients]])
        self.median_distance_x = median_pairwise_distance(pooled, random_state=p.random_state)
        self.bandwidth_x = float(p.bandwidth_x or self.median_distance_x)
        self.bandwidth_embedding = float(p.bandwidth_embedding or self.median_distance_x)
        self.embedder = MeanEmbedding(p.n_embedding_features, self.bandwidth_embedding, d,
                                      random_state=_seed(p.random_state, 1))
        self.embeddings = np.vstack([embed_cells(self.embedder, x, p.embedding_cells) for x in sources])
        self.median_distance_p = median_embedding_distance(self.embeddings[: self.n_patients])
        self.bandwidth_p = float(p.bandwidth_p or self.median_distance_p) if p.use_embedding else None
        self.parent_rows = np.arange(len(self.cells))  # see subset()
        self.class_columns = None if self.classes is None else np.arange(len(self.classes))

    @property
    def n_rows(self) -> int:
        """Training rows: the real patients and their augmented copies."""
        return len(self.cells)

    def feature_map(self, bandwidth_x, bandwidth_p):
        """The feature map of the estimator's solver at these bandwidths (seeded: the same
        bandwidths give the same map): a ProductRFF or a :class:`LandmarkFeatures`."""
        if self.solver == "rff":
            embedding_dim = self.embeddings.shape[1] if self.use_embedding else 0
            return ProductRFF(self.n_features, self.n_features_in, embedding_dim, bandwidth_x, bandwidth_p,
                              random_state=_seed(self.random_state, 2))
        return LandmarkFeatures.from_training(self.cells, self.embeddings, bandwidth_x, bandwidth_p,
                                              max_landmarks=self.n_features if self.solver == "nystroem" else None,
                                              random_state=_seed(self.random_state, 3))

    def features(self, feature_map) -> list:
        """Features of every training row under ``feature_map``: list of (m_r, D) float32."""
        return [cell_features(feature_map, x, psi, self.use_embedding) for x, psi in zip(self.cells, self.embeddings)]

    def subset(self, patients):
        """The same problem without every real patient not in ``patients`` (and their augmented
        copies): a new TrainingProblem sharing this one's draws, embeddings, starting points
        (median distances, hence default bandwidths) and augmentation.

        ``patients``: indices of the real patients kept. The result's ``parent_rows`` gives, for
        each of its rows, the row of this problem it is (to subset features and statistics);
        its classes are those of the kept labels.
        """
        keep = sorted(set(int(i) for i in patients))
        if not keep:
            raise ValueError("a training problem needs at least one patient")
        renumber = {old: new for new, old in enumerate(keep)}
        rows = np.array([r for r in range(self.n_rows) if int(self.source[r]) in renumber], dtype=int)
        out = copy.copy(self)
        out.parent_rows = rows
        out.n_patients = len(keep)
        out.source = np.array([renumber[int(self.source[r])] for r in rows], dtype=int)
        out.cells = [self.cells[r] for r in rows]
        out.embeddings = self.embeddings[rows]
        if self.labels is not None:
            out.labels = [self.labels[r] for r in rows]
            out.classes = np.unique(np.concatenate(out.labels))
            out.targets = [np.searchsorted(out.classes, y) for y in out.labels]
            # Columns of the parent's one-hot targets that the kept classes occupy.
            out.class_columns = np.searchsorted(self.classes, out.classes)
        return out

    def onehots(self) -> list:
        """One-hot targets of every training row: list of (m_r, n_classes) float32."""
        k = len(self.classes)
        return [(t[:, None] == np.arange(k)[None, :]).astype(np.float32) for t in self.targets]

    def statistics(self, features) -> RidgeStatistics:
        """The ridge problem's per-row sufficient statistics for ``features``."""
        stats = RidgeStatistics(features[0].shape[1], len(self.classes))
        for f, onehot in zip(features, self.onehots()):
            stats.add_patient([f], [onehot])
        return stats


MAX_SHIFT_SD, MAX_GAIN_SD = 0.5, 0.3


def shift_spread(embedding_cells, groups=None):
    """How much groups of patients differ, per channel: (log-gain sd (d,), offset sd (d,)).

    Per patient and channel, the median and the log inter-quartile range of its cells; averaged
    within each group (center, batch, run; every patient its own group when ``groups`` is None)
    so that replicates count once; then the standard deviation across groups. Capped at
    ``MAX_GAIN_SD`` / ``MAX_SHIFT_SD`` (standardised units): beyond that a shift is not an
    instrument effect but a different panel.
    """
    medians = np.array([np.median(e, axis=0) for e in embedding_cells])
    q25, q75 = zip(*[np.percentile(e, [25, 75], axis=0) for e in embedding_cells])
    log_iqr = np.log(np.maximum(np.array(q75) - np.array(q25), 1e-3))
    labels = list(range(len(medians))) if groups is None else list(groups)
    names = sorted(set(labels), key=labels.index)
    if len(names) < 2:
        return np.zeros(medians.shape[1]), np.zeros(medians.shape[1])
    by_group = lambda values: np.array([values[[i for i, g in enumerate(labels) if g == n]].mean(axis=0) for n in names])
    gain = np.std(by_group(log_iqr), axis=0, ddof=1)
    shift = np.std(by_group(medians), axis=0, ddof=1)
    return np.minimum(gain, MAX_GAIN_SD), np.minimum(shift, MAX_SHIFT_SD)


def augment_patients(cells, labels, embedding_cells, n_copies, gain_sd, shift_sd, random_state=0):
    """Add ``n_copies`` shifted copies of every patient, as further patients.

    Each copy multiplies each channel by exp(N(0, gain_sd^2)) and adds N(0, shift_sd^2)
    (``gain_sd``, ``shift_sd``: scalars or per-channel arrays), the same draw for its training
    cells and its embedding cells, and keeps the source's labels: an instrument or staining
    shift moves the cells and the expert's gates together.

    Returns the lists extended (real patients first, then copies in source order) and the
    source index of every entry.
    """
    rng = np.random.default_rng(random_state)
    d = cells[0].shape[1]
    out_x, out_y, out_e = list(cells), None if labels is None else list(labels), list(embedding_cells)
    source = list(range(len(cells)))
    for i in range(len(cells)):
        for _ in range(n_copies):
            gain = np.exp(rng.normal(0.0, 1.0, d) * gain_sd).astype(np.float32)
            shift = (rng.normal(0.0, 1.0, d) * shift_sd).astype(np.float32)
            out_x.append(cells[i] * gain + shift)
            out_e.append(np.asarray(embedding_cells[i], dtype=np.float32) * gain + shift)
            if out_y is not None:
                out_y.append(labels[i])
            source.append(i)
    return out_x, out_y, out_e, np.asarray(source)


def fit_weighted_logistic(features, targets, patient_weights, n_classes, alpha, warm=None, max_iter=300):
    """Multinomial logistic regression with patient weights and an L2 penalty.

    Minimises sum_i w_i mean_j CE(softmax(F_ij W + b), Y_ij) + alpha ||W||^2 (b unpenalised)
    by L-BFGS. ``features``: list of (n_i, D) float32; ``targets``: list of (n_i,) class
    indices; ``patient_weights``: (N,) summing to 1. Returns W (D, k) and b (k,).
    """
    from scipy.optimize import minimize

    f = np.vstack(features).astype(np.float32)
    t = np.concatenate(targets)
    cell_w = np.concatenate([np.full(len(x), w / len(x)) for x, w in zip(features, patient_weights)]).astype(np.float32)
    n, dim = f.shape
    k = n_classes
    onehot = np.zeros((n, k), dtype=np.float32)
    onehot[np.arange(n), t] = 1.0

    def objective(theta):
        w = theta[: dim * k].reshape(dim, k).astype(np.float32)
        b = theta[dim * k:].astype(np.float32)
        z = f @ w + b
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        norm = z.sum(axis=1, keepdims=True)
        p = z / norm
        log_like = np.log(p[np.arange(n), t] + 1e-30)
        value = -float(cell_w @ log_like) + alpha * float((w.astype(np.float64) ** 2).sum())
        residual = (p - onehot) * cell_w[:, None]
        grad_w = (f.T @ residual).astype(np.float64) + 2 * alpha * w
        grad_b = residual.sum(axis=0).astype(np.float64)
        return value, np.concatenate([grad_w.ravel(), grad_b])

    if warm is None:
        theta0 = np.zeros(dim * k + k)
    else:
        theta0 = np.concatenate([np.asarray(warm[0], dtype=np.float64).ravel(), np.asarray(warm[1], dtype=np.float64)])
    result = minimize(objective, theta0, jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "gtol": 1e-6})
    theta = result.x
    return theta[: dim * k].reshape(dim, k), theta[dim * k:]


def fit_temperature(scores, targets) -> float:
    """The t > 0 minimising the patient-weighted log-loss of softmax(t * scores).

    ``scores``: list of (n_i, k) arrays, ``targets``: list of (n_i,) class indices.
    """
    from scipy.optimize import minimize_scalar

    def loss(log_t):
        total = 0.0
        for s, y in zip(scores, targets):
            z = np.exp(log_t) * s.astype(np.float64)
            z -= z.max(axis=1, keepdims=True)
            log_p = z[np.arange(len(y)), y] - np.log(np.exp(z).sum(axis=1))
            total -= log_p.mean()
        return total / len(scores)

    result = minimize_scalar(loss, bounds=(np.log(0.1), np.log(1000.0)), method="bounded")
    return float(np.exp(result.x))


def check_training_set(samples, labels):
    """Validate a list of per-patient cell arrays and label arrays; returns them as arrays."""
    if len(samples) != len(labels):
        raise ValueError(f"{len(samples)} samples but {len(labels)} label arrays")
    if len(samples) == 0:
        raise ValueError("no training samples")
    samples = [np.asarray(x, dtype=np.float32) for x in samples]
    labels = [np.asarray(y).astype(str) for y in labels]
    d = samples[0].shape[1]
    for i, (x, y) in enumerate(zip(samples, labels)):
        if x.ndim != 2 or x.shape[1] != d:
            raise ValueError(f"sample {i} has shape {x.shape}; expected (n, {d})")
        if len(y) != len(x):
            raise ValueError(f"sample {i}: {len(x)} cells but {len(y)} labels")
        if len(x) == 0:
            raise ValueError(f"sample {i} has no cells")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"sample {i} holds NaN or infinite values")
    return samples, labels


def median_embedding_distance(embeddings) -> float:
    """Median distance between distinct patients' embeddings (rows of ``embeddings``)."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    if len(embeddings) < 2:
        return 1.0
    diff = embeddings[:, None, :] - embeddings[None, :, :]
    distances = np.sqrt((diff ** 2).sum(-1))[np.triu_indices(len(embeddings), 1)]
    positive = distances[distances > 0]
    return float(np.median(positive)) if len(positive) else 1.0


def _draw(n, m, rng):
    return np.arange(n) if n <= m else np.sort(rng.choice(n, m, replace=False))


def _seed(random_state, stream):
    return np.random.SeedSequence([int(random_state or 0), stream])
