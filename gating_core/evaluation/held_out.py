"""The held-out check by subtraction: one model per fold, without going back to the cells.

Leaving patients out of a ridge problem removes their statistics from a sum
(:class:`~gating_core.method.ridge.RidgeStatistics`). :func:`fold_models` digests every patient
once, computes the random features and statistics of every patient once per bandwidth pair,
and fits each fold -- model selection included, over the fold's own training patients -- from
sums of the others' statistics. Each fold searches on the patients training on its patients
would search on (all of them up to ``SELECTION_MAX_PATIENTS``, beyond that the same seeded
draw among them: :meth:`GatingModel.selection_patients`). The folds' searches run in step and
share what depends only on the patients trained on: an inner fold of the search without
patient a that holds out b trains on what the search without b trains on when it holds out a,
and is decomposed and scored once (:class:`~gating_core.method.selection.HyperparameterSearch`). The
pooled companion's search and fits take views of the marginal model's problems (the same
cells, drawn and embedded once: :func:`~gating_core.method.training_problem.problem_view`). Leaving one
patient out of 8-10 then costs 2.5-3 trainings in CPU time (``bench/bench_check.py``), where
full refits cost one per fold.

What the folds share, and a full refit would not: the channels, transform and standardisation,
the grid's starting points (median distances between cells and between patients' embeddings)
and the shift augmentation's spread are computed once from every patient's unlabeled cells.
No label of a held-out patient reaches its fold's model. Everything fitted on labels -- the
bandwidths and penalty, the coefficients, the calibration, the pooled companion and its
weight, the novelty reference -- is fitted per fold on the fold's training patients.

With the logistic loss (the pooled companion, ``loss="logistic"``) each fold is still an
iterative solve, started from the solution on all patients and stopped at the looser
:data:`FOLD_GTOL`; the folds run side by side on the usable CPUs. Its curvature there is
computed once, and each fold's (minus its held-out patients') preconditions the fold's
iterations (:func:`gating_core.method.solvers.logistic_curvature`): the same optimum, in a third of
the iterations.
"""

from __future__ import annotations

import copy

import numpy as np

from gating_core.cpus import run_side_by_side, score_threads, with_blas_threads
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.losses import loss_for
from gating_core.method.priors import training_prior
from gating_core.method.training_problem import TrainingProblem, problem_view
from gating_core.model.estimator import METHODS
from gating_core.model.research import build_model

#: Where a fold's logistic (or hinge) fit stops when it starts from the fit on all patients (the product's
#: fits stop at lbfgs.LBFGS_GTOL = 1e-6). That start differs from the fold's optimum by the
#: held-out patients only; stopping at 1e-5 took the multicenter check's fold fits from 50-69
#: iterations to 19-41 and left every held-out patient's accuracy within 1e-4 of the tighter
#: tolerance's (bench/bench_check.py).
FOLD_GTOL = 1e-5


@with_blas_threads
def fold_models(samples, labels, held_out_sets, model_params=None, groups=None, progress=None) -> list:
    """A fitted GatingModel for each set of held-out patients, trained on all the others.

    Parameters
    ----------
    samples : list of Sample;  labels : list of ndarray of shape (n_events_i,)
    held_out_sets : list of list of int
        Patient indices held out of each fold.
    model_params : dict or None
        GatingModel parameters (as ``GatingModel(**model_params)``), or ResearchGatingModel ones
        when they name any of its options (:func:`gating_core.model.research.build_model`).
    groups : sequence of length n_patients or None
        Center / batch / run of each patient (None: inferred from the embeddings of all
        patients, as :meth:`GatingModel.fit` would); each fold's selection holds out whole
        groups of its own training patients.
    progress : callable(stage: str, fraction: float) or None

    Returns
    -------
    list of GatingModel, one per held-out set, each as if fitted on its training patients
    (``training_patients_``, ``groups_``, ``selection_`` are the fold's).
    """
    report = progress or (lambda stage, fraction: None)
    base = build_model(dict(model_params or {}))
    if base.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {base.method!r}")
    if len(samples) != len(labels):
        raise ValueError(f"{len(samples)} patients but {len(labels)} label arrays")
    held_out_sets = [sorted(set(int(i) for i in held)) for held in held_out_sets]
    for held in held_out_sets:
        if not held or held[0] < 0 or held[-1] >= len(samples):
            raise ValueError(f"held-out set {held} does not name patients 0..{len(samples) - 1}")
        if len(samples) - len(held) < 2:
            raise ValueError("every fold needs at least two training patients")
    report("Preparing channels", 0.0)
    digests = [base.digest(s, y, i) for i, (s, y) in enumerate(zip(samples, labels))]
    report("Transforming events", 0.05)
    cells, embedding_cells, drawn = base.prepare_digests(digests)
    names = [d.name for d in digests]
    base._set_groups(groups, embedding_cells, names)
    kept_sets = [[i for i in range(len(samples)) if i not in set(held)] for held in held_out_sets]

    params = base._classifier_params()
    fold_params = [dict(params) for _ in kept_sets]
    selections = [{} for _ in kept_sets]
    # Each fold's searches run on the seeded subset of its training patients that training on
    # them would search on (GatingModel.selection_patients): all of them up to 50.
    searched_sets = [[kept[j] for j in base.selection_patients(len(kept))] for kept in kept_sets]
    search_exclusions = [sorted(set(range(len(samples))) - set(searched)) for searched in searched_sets]
    search = None
    if base.select and base._wants_search():
        from gating_core.method.selection import HyperparameterSearch

        report("Model selection in every fold (cross-validation over patients)", 0.1)
        search = HyperparameterSearch(cells, drawn, MarginalTransferClassifier(**params), embedding_cells,
                                      base.cv_folds, base.cv_repeats, base.selection_cells_per_patient,
                                      groups=base.groups_, objective=base.selection_objective)
        results = search.run(search_exclusions, progress=lambda f: report(
            "Model selection in every fold (cross-validation over patients)", 0.1 + 0.5 * f))
        selections = [base._apply_selection(p, result) for p, result in zip(fold_params, results)]
        for selection, searched in zip(selections, searched_sets):
            selection["n_patients"] = len(searched)
    if base.alpha is None and loss_for(base.loss).searches_own_penalty:
        from gating_core.method.companion_selection import select_logistic_alpha

        for f, (p, kept) in enumerate(zip(fold_params, kept_sets)):
            report("Choosing the logistic penalty in every fold", 0.6 + 0.05 * f / len(kept_sets))
            p["alpha"] = select_logistic_alpha([cells[i] for i in kept], [drawn[i] for i in kept],
                                               MarginalTransferClassifier(**p),
                                               embedding_samples=[embedding_cells[i] for i in kept],
                                               groups=[base.groups_[i] for i in kept], cv_folds=base.cv_folds,
                                               cells_per_patient=base.selection_cells_per_patient)
            selections[f].setdefault("params", {})["alpha"] = p["alpha"]
    for p in fold_params:
        if p["alpha"] is None:
            p["alpha"] = 1e-4

    report("Fitting every fold", 0.65)
    problems = _SharedProblems(cells, drawn, embedding_cells, base.groups_)
    classifiers = problems.fit_folds(fold_params, kept_sets)
    models = []
    for f, (kept, clf) in enumerate(zip(kept_sets, classifiers)):
        model = copy.copy(base)
        model.classifier_ = clf
        model.groups_ = [base.groups_[i] for i in kept]
        model.selection_ = selections[f]
        model.hedge_classifier_ = None
        models.append(model)
    hedges = [base._hedge_params(p, selection) for p, selection in zip(fold_params, selections)]
    hedged = [f for f, h in enumerate(hedges) if h is not None]
    if hedged:
        report("Fitting every fold's second model (the narrower cell bandwidth)", 0.7)
        for f, clf in zip(hedged, problems.fit_folds([hedges[f] for f in hedged], [kept_sets[f] for f in hedged])):
            models[f].hedge_classifier_ = clf

    companion_base = base._companion_search_base(params) if base._wants_companion() else None
    for model in models:
        model.companion_bandwidth_x_ = None
    if companion_base is not None:
        from gating_core.method.selection import HyperparameterSearch

        report("Choosing the pooled companion's bandwidth in every fold", 0.75)
        # The companion's cells are the main search's real patients' (same draw): its problem
        # is a view of the main search's, not a second draw and embedding of every patient.
        companion_search = HyperparameterSearch(cells, drawn, companion_base, embedding_cells, base.cv_folds,
                                                base.cv_repeats, base.selection_cells_per_patient, groups=base.groups_,
                                                objective=base.selection_objective,
                                                problem_from=None if search is None else search.problem)
        for model, result in zip(models, companion_search.run(search_exclusions)):
            model.companion_bandwidth_x_ = result.params["bandwidth_x"]
            model.selection_["companion"] = {"bandwidth_x": result.params["bandwidth_x"], "cv_accuracy": result.score}

    report("Fitting the pooled companion in every fold", 0.8)
    companion_params, weights = [], []
    for model, p, kept in zip(models, fold_params, kept_sets):
        weight = 0.0
        if model._wants_companion():
            weight = model._choose_pooled_weight([cells[i] for i in kept], [drawn[i] for i in kept],
                                                 [embedding_cells[i] for i in kept], p, report)
        weights.append(weight)
        companion_params.append(model._companion_params(p) if weight > 0 else None)
    with_companion = [f for f, w in enumerate(weights) if w > 0]
    companions = problems.fit_folds([companion_params[f] for f in with_companion],
                                    [kept_sets[f] for f in with_companion])
    for model, weight in zip(models, weights):
        model.pooled_classifier_, model.pooled_weight_ = None, weight
    for f, companion in zip(with_companion, companions):
        models[f].pooled_classifier_ = companion

    for f, (model, kept) in enumerate(zip(models, kept_sets)):
        fold_labels = [drawn[i] for i in kept]
        model.populations_ = [str(c) for c in model.classifier_.classes_]
        model.class_prior_ = training_prior(fold_labels, model.classifier_.classes_)
        model.training_patients_ = [names[i] for i in kept]
        model._fit_novelty()
        report("Weighing the adapted populations in every fold", 0.85 + 0.15 * f / len(models))
        components = model._fit_adaptive([cells[i] for i in kept], [embedding_cells[i] for i in kept], fold_labels,
                                          fold_params[f], lambda stage, fraction: None)
        model._fit_reach([cells[i] for i in kept], fold_labels, components)
    report("Done", 1.0)
    return models


class _SharedProblems:
    """Training problems over ALL patients, built once per classifier setting, and their
    features and statistics once per bandwidth pair; folds are fitted on subsets of them."""

    def __init__(self, cells, labels, embedding_cells, groups):
        self.cells, self.labels, self.embedding_cells, self.groups = cells, labels, embedding_cells, groups
        self._problems = {}

    def fit_folds(self, fold_params, kept_sets) -> list:
        """A fitted MarginalTransferClassifier per (parameters, kept patients) pair.

        Folds that share bandwidths share one feature set, computed once (and freed before the
        next). With the logistic loss, every fold starts from the fit on all patients, which
        differs from each fold by the held-out patients only. The folds of one feature set are
        fitted side by side on the usable CPUs, one BLAS thread each (a fold alone takes BLAS's
        threads); each fold's result does not depend on the others, so the order of fitting
        changes nothing.
        """
        fitted = [None] * len(fold_params)
        keys = [self._feature_key(p) for p in fold_params]
        starts = {}  # feature key -> (coef, intercept) of the fit on all patients
        # Bandwidths most folds chose first: a bandwidth only one fold chose starts from the fit
        # on all patients at the nearest bandwidth computed before it, not from zero.
        for key in sorted(set(keys), key=lambda key: (-keys.count(key), key)):
            folds = [f for f in range(len(fold_params)) if keys[f] == key]
            params = fold_params[folds[0]]
            problem = self._problem(params)
            feature_map = problem.feature_map(*key[-2:])
            features = problem.features(feature_map)
            loss = loss_for(MarginalTransferClassifier(**params).loss)
            stats = problem.statistics(features) if loss.uses_statistics else None
            start = total_curvature = None
            if not loss.uses_statistics and len(folds) > 1:
                # Only a starting point: fitted to the folds' tolerance (multicenter: 84 -> 63
                # iterations; the folds' own iterations and accuracies unchanged).
                everyone = self._with_bandwidths(problem.subset(range(problem.n_patients)), key)
                start = MarginalTransferClassifier(**params).fit_prepared(everyone, feature_map, features, None,
                                                                           self.groups, gtol=FOLD_GTOL)
                start = starts[key] = (start.coef_, start.intercept_)
                # Each fold's curvature is this minus its held-out rows': a subtraction (None for
                # a loss whose solver takes no preconditioner).
                total_curvature = loss.curvature(features, np.ones(problem.n_rows), *start, workers=score_threads())
            elif not loss.uses_statistics:
                start = self._nearest_start(starts, key)

            def fit(f):
                sub = self._with_bandwidths(problem.subset(kept_sets[f]), key)
                sub_features = [features[r] for r in sub.parent_rows]
                sub_stats = None if stats is None else stats.subset(sub.parent_rows, sub.class_columns)
                warm = start if start is not None and len(start[1]) == len(sub.classes) else None
                curvature = None
                if warm is not None and total_curvature is not None:
                    kept_rows = set(sub.parent_rows)
                    held_rows = [r for r in range(problem.n_rows) if r not in kept_rows]
                    curvature = total_curvature - loss.curvature([features[r] for r in held_rows],
                                                                 np.ones(len(held_rows)), *warm)
                    curvature /= len(sub.parent_rows)
                return MarginalTransferClassifier(**fold_params[f]).fit_prepared(
                    sub, feature_map, sub_features, sub_stats, [self.groups[i] for i in kept_sets[f]],
                    warm_start=warm, gtol=FOLD_GTOL if warm is not None else None, curvature=curvature)

            workers = min(score_threads(), len(folds))
            if workers <= 1:
                # One fold alone (a bandwidth no other fold chose: a cold start, as long as a
                # training's fit) takes BLAS's threads, as the fit on all patients does.
                results = [fit(f) for f in folds]
            else:
                results = run_side_by_side(fit, folds, workers)
            for f, model in zip(folds, results):
                fitted[f] = model
            features = stats = None  # freed before the next bandwidths' features
        return fitted

    @staticmethod
    def _nearest_start(starts: dict, key):
        """The fit on all patients at the bandwidths nearest ``key``'s (log ratio), among those
        of the same problem and feature count; None when there is none. Features at nearby
        bandwidths share their random directions and phases, so that fit is closer to the
        fold's solution than zero is."""
        alike = [other for other in starts if other[:-2] == key[:-2] and (other[-1] is None) == (key[-1] is None)]
        if not alike:
            return None

        def distance(other):
            return sum(abs(np.log(a / b)) for a, b in zip(other[-2:], key[-2:]) if a is not None)

        return starts[min(alike, key=distance)]

    @staticmethod
    def _with_bandwidths(problem, key):
        # The shared problem was built with another fold's parameters: these are this one's.
        problem.bandwidth_x, problem.bandwidth_p = key[-2:]
        return problem

    def _problem(self, params) -> TrainingProblem:
        key = self._problem_key(params)
        if key not in self._problems:
            # A problem that drew and embedded the patients alike (the marginal model's, for the
            # pooled companion or for folds whose selection fell back to pooling) gives a view.
            estimator = MarginalTransferClassifier(**params)
            alike = [problem for other, problem in self._problems.items()
                     if self._draw_key(other) == self._draw_key(key)
                     and (self._augment_key(other) == self._augment_key(key) or int(params["n_augment"]) == 0)]
            self._problems[key] = (problem_view(alike[0], estimator) if alike else
                                   TrainingProblem(estimator, self.cells, self.labels, self.embedding_cells,
                                                   self.groups))
        return self._problems[key]

    _KEY_FIELDS = ("solver", "n_features", "use_embedding", "n_embedding_features", "bandwidth_embedding",
                   "cells_per_patient", "embedding_cells", "n_augment", "augment_gain", "augment_shift", "random_state",
                   "kernel_x")

    @classmethod
    def _draw_key(cls, key) -> tuple:
        """The fields of a problem key that decide the cells drawn and the embeddings."""
        return tuple(key[cls._KEY_FIELDS.index(k)] for k in ("n_embedding_features", "bandwidth_embedding",
                                                               "cells_per_patient", "embedding_cells", "random_state",
                                                               "kernel_x"))

    @classmethod
    def _augment_key(cls, key) -> tuple:
        return tuple(key[cls._KEY_FIELDS.index(k)] for k in ("n_augment", "augment_gain", "augment_shift"))

    @staticmethod
    def _problem_key(params) -> tuple:
        # What a TrainingProblem depends on besides the bandwidths (which its features take).
        return tuple(str(params.get(k)) for k in _SharedProblems._KEY_FIELDS)

    def _feature_key(self, params) -> tuple:
        """The problem's key and the bandwidths (sigma_X, sigma_P or None) of the features; a
        bandwidth left None is the problem's default (a median distance), as in ``fit``."""
        problem = self._problem(params)
        bandwidth_x = float(params["bandwidth_x"] or problem.median_distance_x)
        bandwidth_p = float(params["bandwidth_p"] or problem.median_distance_p) if params["use_embedding"] else None
        return self._problem_key(params) + (bandwidth_x, bandwidth_p)
