"""Model selection by cross-validation over patients (JMLR 2021, section 8.1).

Folds are made of whole patients, never of cells of one patient: the question is how well the
model gates a patient it has not seen. Bandwidths are searched on a log grid of multiples of the
data-driven starting points (the median distance between cells for sigma_X, between patients'
embeddings for sigma_P), and the ridge penalty lambda on a log grid; the grid is extended when
the best value sits on its edge, within the paper's range 1e-2..1e4 of the starting point. For
every bandwidth pair, the whole lambda path costs one eigendecomposition per fold
(:class:`~gating_core.method.ridge.RidgeStatistics`), which keeps the default search practical.

The search is coordinate-wise: sigma_X (with lambda), then sigma_P (with lambda), then, when
asked (``embedding_factors``), the embedding bandwidth sigma' on a small grid around its median
start (sigma_P follows as the same multiple of the new embeddings' median distance), then
sigma_X again at the chosen sigma_P. The lambda grid is extended by decades at an edge that is
strictly best, within ALPHA_LIMITS, at every bandwidth pair. The score is the mean over held-out
patients of their accuracy, averaged over repeated random fold splits; a held-out patient is
scored with the fitted intercept, s = F coef + intercept, exactly as the fitted model scores it
(tests/test_transfer.py checks the two agree).

Folds hold out whole GROUPS (centers, batches, runs; :mod:`gating_core.method.groups`) when they are
known or inferred: a sigma_P chosen on folds where every held-out patient's twin is in training
favours a narrow k_P that cannot reach a new center. Augmented copies of a patient (see
``MarginalTransferClassifier.n_augment``) always leave training with their source, and only
real patients are scored.

The ridge fits the runs and folds share are :class:`~gating_core.method.fold_fits.SharedFolds`;
the pooled companion's penalty and weight are chosen in
:mod:`gating_core.method.companion_selection`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.cpus import one_blas_thread, run_side_by_side, score_threads
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.fold_fits import SharedFolds
from gating_core.method.training_problem import TrainingProblem, check_training_set, problem_view

DEFAULT_X_FACTORS = (0.25, 0.5, 1.0, 2.0)
DEFAULT_P_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
# Wide enough that the best penalty does not sit on an edge (every value costs one solve on the
# shared eigendecomposition, so breadth is nearly free).
DEFAULT_ALPHAS = (1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Pooling must lose by more than this (in held-out accuracy) for the embedding to be kept:
# k_P = 1 is the simpler model, and the score of a handful of held-out groups is noisy.
POOLING_MARGIN = 0.001
FACTOR_LIMITS = (1e-2, 1e4)
#: Range the lambda grid may be extended over when its best value sits on an edge.
ALPHA_LIMITS = (1e-12, 1e2)
#: Grid of sigma' (the embedding kernel k'_X) around its starting point, the median distance
#: between cells, when the search is asked to select it (``embedding_factors=``).
DEFAULT_EMBEDDING_FACTORS = (0.5, 1.0, 2.0)
SEARCH_FEATURES = 256
#: The decompositions of one key's training sets are kept while the key is scored up to this
#: size (a lambda beyond the grid then reuses them); beyond, each is dropped once scored.
ROTATIONS_KEPT_BYTES = 256 * 2 ** 20


@dataclass
class SelectionResult:
    """Outcome of :func:`select_hyperparameters`.

    ``params``: the chosen ``bandwidth_x``, ``bandwidth_p`` (None for pooling), ``alpha``,
    ``bandwidth_embedding`` (sigma'; selected only when asked) and ``use_embedding`` (False when
    held-out groups were gated better without the embedding); ``table``: one dict per evaluated
    (x factor, p factor, alpha) with its CV score, and its ``e_factor`` (sigma' / its start)
    when sigma' was searched.
    """

    params: dict
    score: float
    table: list = field(default_factory=list)
    median_x: float = 1.0
    median_p: float = 1.0


def select_hyperparameters(samples, labels, base: MarginalTransferClassifier, embedding_samples=None,
                           cv_folds=5, cv_repeats=2, cells_per_patient=1500, x_factors=DEFAULT_X_FACTORS, p_factors=DEFAULT_P_FACTORS,
                           alphas=DEFAULT_ALPHAS, progress=None, groups=None, objective="mean",
                           embedding_factors=None) -> SelectionResult:
    """Choose sigma_X, sigma_P and lambda for ``base`` by cross-validation over patients.

    Parameters
    ----------
    samples : list of ndarray (n_i, d), labels : list of ndarray (n_i,)
        At least two patients.
    base : MarginalTransferClassifier
        Supplies everything but the selected parameters (features, embedding, seed).
    embedding_samples : list of ndarray (m_i, d) or None
        As in :meth:`MarginalTransferClassifier.fit`.
    cells_per_patient : int
        Cells per patient used for the search (seeded draw); the final fit uses base's own.
    progress : callable(fraction) or None
    groups : sequence (n_patients,) or None
        Center / batch / run of each patient: folds never split a group. None: every patient
        is its own group.
    objective : {"mean", "worst"}
        Score of a setting: the mean held-out patient accuracy, or that of the worst held-out
        group (the agnostic criterion), each averaged over the fold repeats.
    embedding_factors : sequence of float or None
        Multiples of the starting sigma' (the median distance between cells) to choose the
        embedding bandwidth from, after sigma_P (e.g. DEFAULT_EMBEDDING_FACTORS); None: sigma'
        stays at ``base``'s (its median start when None). Ignored without the embedding or when
        ``base.bandwidth_embedding`` is set.
    """
    samples, labels = check_training_set(samples, labels)
    if len(samples) < 2:
        raise ValueError("model selection over patients needs at least two labeled patients")
    search = HyperparameterSearch(samples, labels, base, embedding_samples, cv_folds, cv_repeats, cells_per_patient,
                                  x_factors, p_factors, alphas, groups, objective, embedding_factors)
    return search.run([()], progress=progress)[0]


class HyperparameterSearch:
    """The search of :func:`select_hyperparameters`, run for one or several sets of excluded
    patients at once (the held-out check: one selection per fold, each without its held-out
    patients).

    The random features and ridge statistics of every patient are computed once per
    bandwidth pair and shared by every run: a run without some patients sums the statistics of
    the others, so a whole nested selection costs about what one selection costs in features.
    The runs advance in step, asking for bandwidth pairs; each pair's features exist only while
    it is scored, so memory stays that of one selection.
    """

    def __init__(self, samples, labels, base, embedding_samples=None, cv_folds=5, cv_repeats=2,
                 cells_per_patient=1500, x_factors=DEFAULT_X_FACTORS, p_factors=DEFAULT_P_FACTORS,
                 alphas=DEFAULT_ALPHAS, groups=None, objective="mean", embedding_factors=None, problem_from=None):
        """Arguments as in :func:`select_hyperparameters`; ``problem_from``: a TrainingProblem
        of the same patients that drew and embedded them as this search would (another search's,
        e.g. the marginal model's for its pooled companion): :func:`problem_view` of it is used
        instead of drawing and embedding every patient again."""
        if objective not in ("mean", "worst"):
            raise ValueError(f"objective must be 'mean' or 'worst', got {objective!r}")
        self.groups = list(range(len(samples))) if groups is None else list(groups)
        if len(self.groups) != len(samples):
            raise ValueError(f"{len(self.groups)} group labels for {len(samples)} patients")
        # The search runs on at most SEARCH_FEATURES random features: the ridge penalty acts on the
        # spectrum of the kernel operator, which RFF Gram matrices (trace ~1) approximate at any D,
        # so choices made at 256 features carry over to the final model's D.
        self.probe = MarginalTransferClassifier(**{**base.get_params(), "cells_per_patient": cells_per_patient,
                                                   "n_features": min(base.n_features, SEARCH_FEATURES)})
        # The embeddings come from all cells (or the caller's choice), as at gating time.
        self.problem = (TrainingProblem(self.probe, samples, labels, embedding_samples, groups) if problem_from is None
                        else problem_view(problem_from, self.probe))
        self.cv_folds, self.cv_repeats = cv_folds, cv_repeats
        self.x_factors, self.p_factors, self.alphas = x_factors, p_factors, alphas
        linear = getattr(base, "kernel_x", "gaussian") == "linear"
        if linear:  # sigma_X (and sigma') mean nothing to the linear cell kernel: not searched
            self.x_factors = (1.0,)
        self.objective = objective
        self.use_embedding = bool(base.use_embedding)
        searches_e = (embedding_factors is not None and self.use_embedding and base.bandwidth_embedding is None
                      and not linear)
        self.e_factors = tuple(embedding_factors) if searches_e else None
        self._problems = {None: self.problem, 1.0: self.problem}
        self._embedding_samples, self._samples, self._labels, self._groups = embedding_samples, samples, labels, groups

    def problem_at(self, e_factor) -> TrainingProblem:
        """The training problem whose embeddings use sigma' = e_factor x its start (None: base's)."""
        if e_factor not in self._problems:
            probe = MarginalTransferClassifier(**{**self.probe.get_params(),
                                                  "bandwidth_embedding": e_factor * self.problem.bandwidth_embedding})
            self._problems[e_factor] = TrainingProblem(probe, self._samples, self._labels, self._embedding_samples,
                                                       self._groups)
        return self._problems[e_factor]

    def folds(self, excluded) -> list:
        """Held-out patient sets (indices into all patients) of a run without ``excluded``."""
        from gating_core.method.groups import group_folds

        excluded = set(excluded)
        if not excluded:
            return group_folds(self.groups, self.cv_folds, self.cv_repeats, self.probe.random_state)
        kept = [i for i in range(len(self.groups)) if i not in excluded]
        inner = group_folds([self.groups[i] for i in kept], self.cv_folds, self.cv_repeats, self.probe.random_state)
        return [[kept[j] for j in fold] for fold in inner]

    def run(self, exclusions, progress=None) -> list:
        """One :class:`SelectionResult` per set of excluded patient indices in ``exclusions``."""
        problem = self.problem
        median_x = problem.median_distance_x
        runs = {}
        for k, excluded in enumerate(exclusions):
            if problem.n_patients - len(set(excluded)) < 2:
                raise ValueError("model selection over patients needs at least two labeled patients")
            search = _coordinate_search(self.x_factors, self.p_factors, self.use_embedding, self.e_factors)
            runs[k] = {"search": search, "folds": self.folds(excluded), "excluded": set(excluded),
                       "wants": next(search), "scores": {}}
        planned = len(self.x_factors) + (len(self.p_factors) + len(self.x_factors) + len(self.e_factors or ())
                                         if self.use_embedding else 0)
        outcome, evaluated = {}, 0
        while any("wants" in r for r in runs.values()):
            key = min((r["wants"] for r in runs.values() if "wants" in r), key=_sort_key)
            fx, fp, fe = key
            at = self.problem_at(fe)
            features = at.features(at.feature_map(fx * median_x, None if fp is None else fp * at.median_distance_p))
            stats = at.statistics(features)
            asking = [k for k, r in runs.items() if r.get("wants") == key]
            for k, scored in zip(asking, self._score_runs(features, stats, [runs[k] for k in asking])):
                r = runs[k]
                r["scores"][key] = scored
                try:  # a search never asks twice for a key: it keeps the scores it was given
                    r["wants"] = r["search"].send(scored[1])
                except StopIteration as done:
                    del r["wants"]
                    outcome[k] = done.value
            del features, stats
            evaluated += 1
            if progress is not None:
                progress(min(evaluated / max(planned, 1), 0.99))
        results = []
        for k in range(len(exclusions)):
            best_x, best_p, best_e, embedding_kept = outcome[k]
            cache = runs[k]["scores"]
            alphas, scores = cache[(best_x, best_p, best_e)]
            table = [{"x_factor": fx, "p_factor": fp, **({} if fe is None else {"e_factor": fe}), "alpha": float(a),
                      "cv_accuracy": float(v)}
                     for (fx, fp, fe), (grid, values) in cache.items() for a, v in zip(grid, values)]
            chosen = self.problem_at(best_e)
            results.append(SelectionResult(
                params={"bandwidth_x": best_x * median_x,
                        "bandwidth_p": None if best_p is None else best_p * chosen.median_distance_p,
                        "alpha": float(alphas[int(np.argmax(scores))]),
                        "bandwidth_embedding": chosen.bandwidth_embedding, "use_embedding": embedding_kept},
                score=float(scores.max()), table=table, median_x=median_x, median_p=chosen.median_distance_p))
        if progress is not None:
            progress(1.0)
        return results

    def _score_runs(self, features, stats, runs) -> list:
        """:meth:`_score` of one key for each of ``runs``.

        Runs that train a fold on the same patients share its decomposition and held-out
        scores (:class:`SharedFolds`): in the held-out check, the inner fold of the run without
        patient k that holds out patient j trains on what the run without j trains on when it
        holds out k (80 folds over 8 patients are 42 distinct training sets). The distinct
        training sets are decomposed and scored on the starting lambda grid side by side on the
        CPUs this process may use; each run then reads its scores, identical to what it would
        compute alone (the same rows, the same arithmetic, in one BLAS thread).
        """
        scored_on = {}  # training set (as the patients left out) -> the patients scored on it
        for run in runs:
            for held_out in run["folds"]:
                scored_on.setdefault(frozenset(held_out) | frozenset(run["excluded"]), set()).update(held_out)
        grid = sorted(float(a) for a in self.alphas)
        width = features[0].shape[1]
        shared = SharedFolds(features, stats, self.problem,
                              keep_rotations=len(scored_on) * width * width * 8 <= ROTATIONS_KEPT_BYTES)

        def prepare(held):
            shared.prepare(held, sorted(scored_on[held]), grid)

        # Small products and eigendecompositions, many of them: BLAS threads only wait on each
        # other (beside other work, 12x slower), so each task gets one and the tasks share the
        # CPUs (numpy releases the GIL).
        ordered = sorted(scored_on, key=sorted)
        workers = min(score_threads(), len(ordered))
        run_side_by_side(prepare, ordered, workers)
        with one_blas_thread():
            return [self._score(features, stats, run["folds"], run["excluded"], shared) for run in runs]

    def _score(self, features, stats, folds, excluded, shared=None):
        """Held-out accuracy of every alpha (averaged as ``objective`` says) over ``folds``,
        training on every patient neither held out nor in ``excluded``: (alphas, scores).

        The lambda grid starts as ``self.alphas`` and is extended by a decade at an edge while
        that edge is strictly the best (within ALPHA_LIMITS); each further lambda costs one
        solve per fold on the fold's eigendecomposition. ``shared``: the :class:`SharedFolds`
        of these features (None: a fresh one).
        """
        shared = SharedFolds(features, stats, self.problem) if shared is None else shared
        trained_without = [frozenset(held_out) | frozenset(excluded) for held_out in folds]

        def scores_of(alpha) -> float:
            # s(lambda) = F coef + intercept: the fitted model's own scores (SharedFolds.accuracy).
            fold_scores = [[shared.accuracy(held, i, alpha) for i in held_out]
                           for held_out, held in zip(folds, trained_without)]
            if self.objective == "mean":
                return float(np.mean(np.concatenate(fold_scores)))
            return float(np.min([np.mean(f) for f in fold_scores]))

        alphas = sorted(float(a) for a in self.alphas)
        scores = [scores_of(a) for a in alphas]
        while len(alphas) >= 2:
            best = int(np.argmax(scores))
            if best == 0 and scores[0] > scores[1] and alphas[0] / 10 >= ALPHA_LIMITS[0]:
                alphas.insert(0, alphas[0] / 10)
                scores.insert(0, scores_of(alphas[0]))
            elif best == len(alphas) - 1 and scores[-1] > scores[-2] and alphas[-1] * 10 <= ALPHA_LIMITS[1]:
                alphas.append(alphas[-1] * 10)
                scores.append(scores_of(alphas[-1]))
            else:
                break
        return np.array(alphas), np.array(scores)


def _sort_key(key):
    """Order of (x, p, e) factor triples, None (no embedding / sigma' not searched) first."""
    return tuple((v is not None, v or 0.0) for v in key)


def _coordinate_search(x_factors, p_factors, use_embedding, e_factors=None):
    """The coordinate-wise search as a generator: it yields the (x factor, p factor, e factor)
    it wants scored and receives that triple's score per alpha; it returns (x factor, p factor
    or None, e factor or None, embedding kept).

    sigma_X (with lambda), then sigma_P (with lambda), then sigma' when ``e_factors`` is given,
    then sigma_X again at the chosen sigma_P (and sigma'); an edge of a grid is extended while
    it is strictly the best, within FACTOR_LIMITS.
    """
    cache = {}
    e_start = None if e_factors is None else 1.0

    def score(fx, fp, fe):
        if (fx, fp, fe) not in cache:
            cache[(fx, fp, fe)] = yield (fx, fp, fe)
        return cache[(fx, fp, fe)]

    def search(axis, factors, fixed):
        factors = sorted(factors)
        while True:
            value = {}
            for f in factors:
                key = {"x": (f, *fixed), "p": (fixed[0], f, fixed[1]), "e": (*fixed, f)}[axis]
                per_alpha = yield from score(*key)
                value[f] = float(per_alpha.max())
            top = max(value.values())
            # Prefer the factor nearest the data-driven start among ties.
            best = min((f for f in factors if value[f] >= top - 1e-12), key=lambda f: abs(np.log(f)))
            if len(factors) < 2:
                return best  # a single value given: nothing to compare an edge with
            # Extend only when the edge is strictly better than its neighbour: a flat score
            # says nothing more is to be found that way.
            if best == factors[0] and value[best] > value[factors[1]] and best / 2 >= FACTOR_LIMITS[0]:
                factors = [best / 2] + factors
            elif best == factors[-1] and value[best] > value[factors[-2]] and best * 2 <= FACTOR_LIMITS[1]:
                factors = factors + [best * 2]
            else:
                return best

    p_start = 1.0 if use_embedding else None
    best_e = e_start
    best_x = yield from search("x", x_factors, (p_start, best_e))
    best_p = p_start
    if not use_embedding:
        return best_x, best_p, None, False
    best_p = yield from search("p", p_factors, (best_x, best_e))
    if e_factors is not None:
        best_e = yield from search("e", e_factors, (best_x, best_p))
    best_x = yield from search("x", x_factors, (best_p, best_e))
    # sigma_P -> infinity is pooling (k_P = 1). When the embedding does not help on held-out
    # GROUPS, the model falls back to it: the patient's distribution then adds only noise.
    pooled = yield from score(best_x, None, None)
    if float(pooled.max()) >= float(cache[(best_x, best_p, best_e)].max()) - POOLING_MARGIN:
        return best_x, None, None, False
    return best_x, best_p, best_e, True
