"""The JMLR 2021 synthetic "ellipse" task (design.md section 3): test error of marginal transfer
and pooling, one cell or the paper's whole table.

Protocol of every figure (docs/ellipse.md says why): N training tasks of n points each
(:func:`~gating_core.synthetic.ellipse_task`); model selection by cross-validation over tasks
(:func:`~gating_core.method.selection.select_hyperparameters`, 5 folds x 2 repeats, on the n points of
every task); the final model fitted on all N tasks. Then 10 test tasks, each drawn with
n + FRESH_POINTS points: a test task's embedding is built from its first n points only (an
unlabeled sample of the size the training tasks had), and its error is measured on the
FRESH_POINTS others, which the embedding never saw (as the authors' code does with 1,000-point
test tasks). The error of a seed is the mean over the 10 test tasks; a cell is the mean over
seeds (``--test-tasks 40`` for 40 test tasks a seed: docs/ellipse.md's table uses ten seeds and
40). Probabilities are not calibrated (``calibrate=False``): calibration never changes a label.
Beside each cell the grid prints the PCA-axis reference (:func:`pca_axis_error`): each test
task's rule read off its n embedding points by a method that knows the rule's form.

Paper (Blanchard et al., JMLR 2021, Table 1, marginal transfer): 7.22% at N = 64, n = 256 and
1.27% at N = 256, n = 256; the table's other cells were not found in any stored copy of the
paper and are printed as "-".

Run: ``python bench/bench_ellipse.py [--tasks 64 256] [--points 256]`` (one line per seed; ``make
bench`` runs N = 64, n = 256), ``python bench/bench_ellipse.py --grid [--quick] [--seeds ...]``
(the table: N in 16, 64, 256 x n in 8, 16, 32, 256, ours beside the paper's, wall time per
cell). Options to study the gap at one cell: ``--loss hinge``, ``--embedding-frequencies L``,
``--select-embedding`` (sigma' chosen by cross-validation), ``--solver exact``, ``--features D``;
``--authors squared-hinge|squared`` runs the authors' protocol instead (:func:`authors_cell_error`;
``--authors-bandwidths product`` keeps the product's bandwidths and selects C alone).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.method.classifier import MarginalTransferClassifier  # noqa: E402
from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS, select_hyperparameters  # noqa: E402
from gating_core.synthetic import ellipse_task  # noqa: E402

#: The paper's marginal-transfer test error, (N, n) -> error; only the cells found in the text.
PAPER = {(64, 256): 0.0722, (256, 256): 0.0127}
GRID_TASKS = (16, 64, 256)
GRID_POINTS = (8, 16, 32, 256)
TEST_TASKS = 10
#: Points of a test task the error is measured on, none of them in its embedding (the authors'
#: test tasks have 1,000 points).
FRESH_POINTS = 1000
DEFAULT_SEEDS = (2021, 0, 1)


@dataclass
class CellResult:
    """Test error of one (N, n, seed) run: ``error`` (mean over test tasks), ``task_errors``
    (one per test task), ``params`` (the selected hyperparameters), ``seconds`` (wall time of
    selection, fit and test)."""

    error: float
    task_errors: list = field(default_factory=list)
    params: dict = field(default_factory=dict)
    seconds: float = 0.0


def cell_error(n_tasks: int, n_points: int, seed: int, use_embedding: bool = True, *, loss: str = "squared",
               n_embedding_features: int = 128, select_embedding: bool = False, solver: str = "rff",
               n_features: int = 512, fresh_points: int = FRESH_POINTS, test_tasks: int = TEST_TASKS,
               cv_repeats: int = 2, density: str = "area") -> CellResult:
    """Marginal transfer (or pooling: ``use_embedding=False``) on one (N, n) cell of the table.

    Parameters
    ----------
    n_tasks, n_points : int
        N training tasks of n points; each test task's embedding is built from n points too.
    seed : int
        Seed of the data (training and test tasks); the model's own seed is fixed (0).
    loss : {"squared", "hinge"}
        "hinge": bandwidths selected with the squared loss (the closed-form search), then the
        hinge penalty chosen by cross-validation over tasks (:func:`select_hinge_alpha`).
    n_embedding_features : int
        L, frequencies of the mean embedding.
    select_embedding : bool
        Choose sigma' by cross-validation (DEFAULT_EMBEDDING_FACTORS) instead of the median start.
    solver : {"rff", "nystroem", "exact"}
    n_features : int
        D of the final model (the search uses at most 256).
    fresh_points : int
        Points of each test task the error is measured on (never in its embedding).
    density : {"area", "chord"}
        How a task's points spread over its ellipse (:func:`~gating_core.synthetic.ellipse_task`):
        uniform in area, or as the authors' generator draws them.
    """
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    train_x, train_y = ellipse_task(n_tasks, n_points, rng, density=density)
    test_x, test_y = ellipse_task(test_tasks, n_points + fresh_points, rng, density=density)
    base = MarginalTransferClassifier(use_embedding=use_embedding, solver=solver, n_features=n_features,
                                      n_embedding_features=n_embedding_features, cells_per_patient=n_points,
                                      calibrate=False, random_state=0)
    chosen = select_hyperparameters(train_x, train_y, base, cells_per_patient=n_points, cv_repeats=cv_repeats,
                                    embedding_factors=DEFAULT_EMBEDDING_FACTORS if select_embedding else None)
    params = {**base.get_params(), **chosen.params}
    if loss != "squared":
        params["loss"] = loss
        params["alpha"] = select_hinge_alpha(train_x, train_y, params)
    clf = MarginalTransferClassifier(**params).fit(train_x, train_y)
    task_errors = []
    for x, y in zip(test_x, test_y):
        # ellipse_task shuffles every task's points: the first n are a random sample of it.
        embedding = clf.embed(x[:n_points]) if clf.use_embedding else None
        predicted = clf.predict(x[n_points:], embedding=embedding)
        task_errors.append(float(np.mean(predicted != y[n_points:].astype(str))))
    kept = {k: params[k] for k in ("bandwidth_x", "bandwidth_p", "bandwidth_embedding", "alpha", "use_embedding")}
    return CellResult(float(np.mean(task_errors)), task_errors, kept, time.perf_counter() - start)


def pca_axis_error(n_tasks: int, n_points: int, seed: int, *, fresh_points: int = FRESH_POINTS,
                   test_tasks: int = TEST_TASKS, density: str = "area") -> float:
    """Test error of a reference that knows the task family, on :func:`cell_error`'s test tasks.

    Each test task's major axis is estimated as the leading principal axis of the same n points
    that build its embedding, oriented into the angle range (sin a > 0, so the sign is never a
    guess), and a point is labeled 1 on the side of that axis's normal (-sin a, cos a). It
    learns nothing from the training tasks: it says how well n unlabeled points can pin down a
    task's rule when the form of the rule is known, i.e. what the embedding's sample size
    allows. The training tasks are drawn (and discarded) so that the test tasks are
    :func:`cell_error`'s for the same seed.
    """
    rng = np.random.default_rng(seed)
    ellipse_task(n_tasks, n_points, rng, density=density)
    test_x, test_y = ellipse_task(test_tasks, n_points + fresh_points, rng, density=density)
    errors = []
    for x, y in zip(test_x, test_y):
        _, vectors = np.linalg.eigh(np.cov(x[:n_points].T))
        axis = vectors[:, -1] * np.sign(vectors[1, -1] or 1.0)
        predicted = (x[n_points:] @ np.array([-axis[1], axis[0]])) > 0
        errors.append(float(np.mean(predicted != (y[n_points:] == 1))))
    return float(np.mean(errors))


#: Penalties of the hinge loss compared by :func:`select_hinge_alpha`: the authors' code
#: searches liblinear's C over 0.1..10, i.e. lambda = 1 / (2 C N n), 4e-7..5e-3 over the table.
HINGE_ALPHAS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3)


def select_hinge_alpha(samples, labels, params: dict, alphas=HINGE_ALPHAS, folds: int = 5) -> float:
    """The hinge loss's lambda at ``params``' bandwidths, by cross-validation over tasks (whole
    tasks held out, mean held-out accuracy); ties go to the larger penalty."""
    from gating_core.method.groups import group_folds

    probe = {**params, "n_features": min(params["n_features"], 256), "calibrate": False}
    scores = np.zeros(len(alphas))
    for held_out in group_folds(list(range(len(samples))), folds, 1, 0):
        held = set(held_out)
        train = [i for i in range(len(samples)) if i not in held]
        for a, alpha in enumerate(alphas):
            clf = MarginalTransferClassifier(**{**probe, "alpha": alpha}).fit([samples[i] for i in train],
                                                                              [labels[i] for i in train])
            scores[a] += np.mean([np.mean(clf.predict(samples[i]) == labels[i].astype(str)) for i in held_out])
    best = scores.max()
    return float(max(a for a, s in zip(alphas, scores) if s >= best - 1e-12))


# -- the authors' protocol (docs/ellipse.md, "The authors' protocol, measured") -------------------
#
# Written from the description of their code in docs/ellipse.md, not copied. The kernel is the
# product's (Gaussian k_P on the embedding times Gaussian k_X, the embedding a random-Fourier mean
# embedding); what differs is how it is approximated, which loss is minimised and how the
# bandwidths are chosen: one random-feature stage [cos(v W), sin(v W)] / sqrt(Q) over
# v = [Psi(P) / sigma_P, x / sigma_X] (Q frequencies, 2Q features, no random phase), no intercept,
# liblinear's cost C (0.5 |w|^2 + C sum of losses), and a coordinate search over one absolute
# log grid with 5-fold cross-validation over tasks.

#: The authors' absolute grid of the three bandwidths and of the cost C.
AUTHORS_BANDWIDTHS = tuple(np.logspace(-2, 4, 20))
AUTHORS_COSTS = tuple(np.logspace(-1, 1, 10))
#: L (embedding frequencies) and Q (joint frequencies) of the authors' experiments.
AUTHORS_L, AUTHORS_Q = 100, 100
AUTHORS_LOSSES = ("squared-hinge", "squared")


class JointFeatures:
    """The authors' feature map, for one choice of bandwidths.

    Psi(P) = [mean cos(x W'), mean sin(x W')] / sqrt(L) with W' ~ N(0, I / sigma'^2) (d, L), and
    phi(P, x) = [cos(v W), sin(v W)] / sqrt(Q) with v = [Psi(P) / sigma_P, x / sigma_X] and
    W ~ N(0, I) of shape (2L + d, Q): <phi, phi'> ~= k_P(Psi, Psi') k_X(x, x'). ``bandwidth_p``
    None drops the embedding (pooling). The random draws depend on ``random_state`` only, so two
    grid points differ by their bandwidths, not by their draws.
    """

    def __init__(self, n_dims, bandwidth_x, bandwidth_embedding, bandwidth_p, n_embedding=AUTHORS_L,
                 n_joint=AUTHORS_Q, random_state=0):
        rng = np.random.default_rng(random_state)
        self.embedding_frequencies = rng.standard_normal((n_dims, n_embedding)) / bandwidth_embedding
        self.joint_x = rng.standard_normal((n_dims, n_joint)) / bandwidth_x
        self.joint_p = None if bandwidth_p is None else rng.standard_normal((2 * n_embedding, n_joint)) / bandwidth_p
        self.n_embedding, self.n_joint = n_embedding, n_joint

    def embed(self, x) -> np.ndarray:
        """Psi of one task's points x (n, d): shape (2L,)."""
        projection = np.asarray(x, dtype=np.float64) @ self.embedding_frequencies
        return np.concatenate([np.cos(projection).mean(0), np.sin(projection).mean(0)]) / np.sqrt(self.n_embedding)

    def transform(self, x, embedding=None) -> np.ndarray:
        """phi(P, x) of points x (n, d) of a task with embedding Psi(P): (n, 2Q) float32."""
        phase = np.asarray(x, dtype=np.float64) @ self.joint_x
        if self.joint_p is not None:
            phase += embedding @ self.joint_p
        phase = phase.astype(np.float32)
        return np.hstack([np.cos(phase), np.sin(phase)]) * np.float32(1.0 / np.sqrt(self.n_joint))

    def tasks(self, samples, embeddings=None) -> np.ndarray:
        """Features of every point of every task, each with its own task's embedding (computed
        unless given: they depend on sigma' and the draw only): (sum n_i, 2Q)."""
        if self.joint_p is None:
            return np.vstack([self.transform(x) for x in samples])
        embeddings = [self.embed(x) for x in samples] if embeddings is None else embeddings
        return np.vstack([self.transform(x, e) for x, e in zip(samples, embeddings)])


def fit_squared_hinge(features, signs, cost, warm=None, max_iter=100, gram=None, rhs=None) -> np.ndarray:
    """min_w 0.5 |w|^2 + cost * sum_i max(0, 1 - s_i <w, f_i>)^2 (liblinear's -s 1 problem, no bias).

    Primal Newton on the active set (the points inside the margin; Keerthi and DeCoste, JMLR
    2005): for a fixed active set the problem is a ridge regression, solved exactly; a step that
    does not decrease the objective is halved. The active set's Gram matrix is updated by the
    points that enter or leave it, so an iteration after the first costs little. ``features``
    (n, D), ``signs`` (n,) in {-1, +1}; ``gram`` = F^T F and ``rhs`` = F^T s when already known
    (used when starting from w = 0, where every point is active); returns w (D,).
    """
    f = np.asarray(features)
    s = np.asarray(signs, dtype=f.dtype)
    eye = np.eye(f.shape[1])
    w = np.zeros(f.shape[1]) if warm is None else np.array(warm, dtype=np.float64)
    margins = s * (f @ w.astype(f.dtype))
    active = margins < 1.0
    if warm is not None or gram is None or rhs is None:
        fa = f[active]
        gram, rhs = fa.T @ fa, fa.T @ s[active]
    gram, rhs = np.array(gram, dtype=np.float64), np.array(rhs, dtype=np.float64)

    def objective(margin, vec):
        slack = np.maximum(0.0, 1.0 - margin.astype(np.float64))
        return 0.5 * vec @ vec + cost * slack @ slack

    value = objective(margins, w)
    for _ in range(max_iter):
        target = np.linalg.solve(eye + 2.0 * cost * gram, 2.0 * cost * rhs)
        step = 1.0
        while True:
            candidate = w + step * (target - w)
            new_margins = s * (f @ candidate.astype(f.dtype))
            new_value = objective(new_margins, candidate)
            if new_value <= value or step < 1e-6:
                break
            step /= 2.0
        converged = value - new_value <= 1e-10 * max(1.0, abs(value))
        if new_value <= value:
            w, value, margins = candidate, new_value, new_margins
        if converged:
            return w
        now_active = margins < 1.0
        for rows, sign in ((now_active & ~active, 1.0), (active & ~now_active, -1.0)):
            if rows.any():
                fr = f[rows]
                gram += sign * (fr.T @ fr)
                rhs += sign * (fr.T @ s[rows])
        active = now_active
    return w


def fit_squared(features, signs, cost, gram=None, rhs=None) -> np.ndarray:
    """min_w 0.5 |w|^2 + cost * sum_i (s_i - <w, f_i>)^2: the squared loss with liblinear's cost.
    ``gram`` = F^T F and ``rhs`` = F^T s when already known."""
    f = np.asarray(features)
    gram = (f.T @ f).astype(np.float64) if gram is None else gram
    rhs = (f.T @ np.asarray(signs, f.dtype)).astype(np.float64) if rhs is None else rhs
    return np.linalg.solve(np.eye(len(gram)) + 2.0 * cost * gram, 2.0 * cost * rhs)


def _fold_errors(features, signs, task_of_point, folds, costs, loss) -> np.ndarray:
    """Mean held-out error over ``folds`` (lists of held-out tasks), one per cost (increasing)."""
    errors = np.zeros(len(costs))
    held_masks = [np.isin(task_of_point, held) for held in folds]
    # Every fold's statistics are the total minus the held-out block's.
    blocks = [(features[m].T @ features[m], features[m].T @ signs[m]) for m in held_masks]
    total_gram = sum(b[0].astype(np.float64) for b in blocks)
    total_rhs = sum(b[1].astype(np.float64) for b in blocks)
    for k, test in enumerate(held_masks):
        w = None
        for c, cost in enumerate(costs):
            if loss == "squared":
                w = fit_squared(None, None, cost, total_gram - blocks[k][0], total_rhs - blocks[k][1])
            else:  # each fit starts from the previous cost's solution
                w = fit_squared_hinge(features[~test], signs[~test], cost, warm=w,
                                      gram=total_gram - blocks[k][0], rhs=total_rhs - blocks[k][1])
            errors[c] += np.mean(np.sign(features[test] @ w.astype(features.dtype)) != signs[test]) / len(folds)
    return errors


def authors_select(samples, labels, loss="squared-hinge", bandwidths=AUTHORS_BANDWIDTHS, costs=AUTHORS_COSTS,
                   folds=5, rounds=2, random_state=0) -> dict:
    """The authors' coordinate search: (sigma_X, C) for pooling, then (sigma', sigma_P) on the
    bandwidth grid squared, then (sigma_X, C), then (sigma', sigma_P) again (``rounds`` = 2 pairs
    of steps after the pooling step), each by 5-fold cross-validation over tasks.

    Returns the chosen ``bandwidth_x``, ``bandwidth_embedding``, ``bandwidth_p``, ``cost`` and the
    cross-validated error of the last step (``cv_error``).
    """
    n_dims = samples[0].shape[1]
    signs = np.concatenate([np.where(np.asarray(y) == 1, 1.0, -1.0) for y in labels]).astype(np.float32)
    task_of_point = np.concatenate([np.full(len(x), i) for i, x in enumerate(samples)])
    order = np.random.default_rng(random_state).permutation(len(samples))
    fold_tasks = [part for part in np.array_split(order, folds)]
    costs = sorted(costs)
    embeddings = {}  # sigma' -> the tasks' embeddings

    def errors(bx, be, bp, cost_list):
        jf = JointFeatures(n_dims, bx, be, bp, random_state=random_state)
        if bp is not None and be not in embeddings:
            embeddings[be] = [jf.embed(x) for x in samples]
        features = jf.tasks(samples, embeddings.get(be) if bp is not None else None)
        return _fold_errors(features, signs, task_of_point, fold_tasks, cost_list, loss)

    def search_x_and_cost(be, bp):
        table = np.array([errors(bx, be, bp, costs) for bx in bandwidths])
        i, c = np.unravel_index(np.argmin(table), table.shape)
        return bandwidths[i], costs[c], table[i, c]

    def search_embedding(bx, cost):
        table = np.array([[errors(bx, be, bp, [cost])[0] for bp in bandwidths] for be in bandwidths])
        i, j = np.unravel_index(np.argmin(table), table.shape)
        return bandwidths[i], bandwidths[j], table[i, j]

    bx, cost, _ = search_x_and_cost(1.0, None)  # pooling: sigma' is unused without sigma_P
    be, bp, cv_error = search_embedding(bx, cost)
    for _ in range(rounds - 1):
        bx, cost, _ = search_x_and_cost(be, bp)
        be, bp, cv_error = search_embedding(bx, cost)
    return {"bandwidth_x": float(bx), "bandwidth_embedding": float(be), "bandwidth_p": float(bp),
            "cost": float(cost), "cv_error": float(cv_error)}


def authors_select_cost(samples, labels, loss, bandwidth_x, bandwidth_embedding, bandwidth_p, costs=AUTHORS_COSTS,
                        folds=5, random_state=0) -> dict:
    """C alone by the authors' 5-fold cross-validation over tasks, at given bandwidths."""
    signs = np.concatenate([np.where(np.asarray(y) == 1, 1.0, -1.0) for y in labels]).astype(np.float32)
    task_of_point = np.concatenate([np.full(len(x), i) for i, x in enumerate(samples)])
    fold_tasks = np.array_split(np.random.default_rng(random_state).permutation(len(samples)), folds)
    jf = JointFeatures(samples[0].shape[1], bandwidth_x, bandwidth_embedding, bandwidth_p, random_state=random_state)
    costs = sorted(costs)
    errors = _fold_errors(jf.tasks(samples), signs, task_of_point, fold_tasks, costs, loss)
    best = int(np.argmin(errors))
    return {"bandwidth_x": float(bandwidth_x), "bandwidth_embedding": float(bandwidth_embedding),
            "bandwidth_p": float(bandwidth_p), "cost": float(costs[best]), "cv_error": float(errors[best])}


def product_bandwidths(samples, labels, n_points: int) -> dict:
    """sigma_X, sigma' and sigma_P as :func:`cell_error` selects them (the product's squared-loss
    search, default model)."""
    base = MarginalTransferClassifier(cells_per_patient=n_points, calibrate=False, random_state=0)
    chosen = select_hyperparameters(samples, labels, base, cells_per_patient=n_points, cv_repeats=2)
    fitted = MarginalTransferClassifier(**{**base.get_params(), **chosen.params}).fit(samples, labels)
    return {"bandwidth_x": fitted.bandwidth_x_, "bandwidth_embedding": fitted.bandwidth_embedding_,
            "bandwidth_p": fitted.bandwidth_p_}


def authors_cell_error(n_tasks: int, n_points: int, seed: int, loss: str = "squared-hinge", *,
                       bandwidths_from="search", bandwidths=AUTHORS_BANDWIDTHS, costs=AUTHORS_COSTS, rounds=2,
                       fresh_points: int = FRESH_POINTS, test_tasks: int = TEST_TASKS,
                       density: str = "area") -> CellResult:
    """One (N, n) cell with the authors' protocol; the same data and test protocol as
    :func:`cell_error` (same seed, same tasks, error on each test task's fresh points).

    Parameters
    ----------
    loss : {"squared-hinge", "squared"}
        The loss of the search and of the final model, both with liblinear's cost C.
    bandwidths_from : "search", "product" or dict
        "search": the authors' coordinate search (:func:`authors_select`) over ``bandwidths``
        (``rounds`` rounds); "product": the bandwidths the product's own search chooses
        (:func:`product_bandwidths`), then C alone by cross-validation; a dict of
        ``bandwidth_x``, ``bandwidth_embedding``, ``bandwidth_p``: those, then C alone.
    """
    if loss not in AUTHORS_LOSSES:
        raise ValueError(f"loss must be one of {AUTHORS_LOSSES}, not {loss!r}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    train_x, train_y = ellipse_task(n_tasks, n_points, rng, density=density)
    test_x, test_y = ellipse_task(test_tasks, n_points + fresh_points, rng, density=density)
    if bandwidths_from == "search":
        chosen = authors_select(train_x, train_y, loss, bandwidths, costs, rounds=rounds)
    else:
        fixed = product_bandwidths(train_x, train_y, n_points) if bandwidths_from == "product" else bandwidths_from
        chosen = authors_select_cost(train_x, train_y, loss, fixed["bandwidth_x"], fixed["bandwidth_embedding"],
                                     fixed["bandwidth_p"], costs)
    jf = JointFeatures(2, chosen["bandwidth_x"], chosen["bandwidth_embedding"], chosen["bandwidth_p"],
                       random_state=1)  # the final model's draw differs from the search's, as theirs
    signs = np.concatenate([np.where(y == 1, 1.0, -1.0) for y in train_y]).astype(np.float32)
    features = jf.tasks(train_x)
    w = fit_squared_hinge(features, signs, chosen["cost"]) if loss == "squared-hinge" else \
        fit_squared(features, signs, chosen["cost"])
    task_errors = []
    for x, y in zip(test_x, test_y):
        predicted = np.sign(jf.transform(x[n_points:], jf.embed(x[:n_points])) @ w.astype(np.float32))
        task_errors.append(float(np.mean(predicted != np.where(y[n_points:] == 1, 1.0, -1.0))))
    return CellResult(float(np.mean(task_errors)), task_errors, chosen, time.perf_counter() - start)

def run_cell(n_tasks: int, n_points: int, seeds, **options) -> dict:
    """Marginal transfer and pooling at (N, n) over ``seeds``: errors per seed and wall time, and
    the PCA-axis reference (:func:`pca_axis_error`) on the same test tasks."""
    start = time.perf_counter()
    marginal = [cell_error(n_tasks, n_points, s, True, **options) for s in seeds]
    pooling_options = {k: v for k, v in options.items() if k not in ("n_embedding_features", "select_embedding")}
    pooling = [cell_error(n_tasks, n_points, s, False, **pooling_options) for s in seeds]
    seconds = time.perf_counter() - start
    reference = {k: options[k] for k in ("fresh_points", "test_tasks", "density") if k in options}
    return {"marginal": [r.error for r in marginal], "pooling": [r.error for r in pooling],
            "params": [r.params for r in marginal], "seconds": seconds,
            "pca_axis": [pca_axis_error(n_tasks, n_points, s, **reference) for s in seeds]}


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def print_grid(tasks, points, seeds, **options) -> dict:
    """The table, one line per cell as it finishes; returns (N, n) -> run_cell's dict."""
    print(f"== JMLR ellipse table: marginal transfer test error (%), mean over seeds {list(seeds)}, "
          f"{options.get('test_tasks', TEST_TASKS)} test tasks, error on {options.get('fresh_points', FRESH_POINTS)} "
          f"fresh points each ==", flush=True)
    print(f"{'N':>4} {'n':>4} | {'ours':>6} {'s.e.':>5} {'min-max':>13} | {'paper':>6} {'diff':>6} | {'pooling':>7} | "
          f"{'PCA axis':>8} | time", flush=True)
    table = {}
    for n_tasks in tasks:
        for n_points in points:
            cell = run_cell(n_tasks, n_points, seeds, **options)
            table[(n_tasks, n_points)] = cell
            ours, paper = float(np.mean(cell["marginal"])), PAPER.get((n_tasks, n_points))
            spread = f"{_percent(min(cell['marginal']))}-{_percent(max(cell['marginal']))}"
            # Standard error of the mean over seeds (each seed: new tasks, new test tasks).
            error = float(np.std(cell["marginal"], ddof=1) / np.sqrt(len(seeds))) if len(seeds) > 1 else None
            diff = "-" if paper is None else f"{100 * (ours - paper):+.2f}"
            print(f"{n_tasks:>4} {n_points:>4} | {_percent(ours):>6} {_percent(error):>5} {spread:>13} | "
                  f"{_percent(paper):>6} {diff:>6} | {_percent(float(np.mean(cell['pooling']))):>7} | "
                  f"{_percent(float(np.mean(cell['pca_axis']))):>8} | {cell['seconds']:.0f} s", flush=True)
    return table


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="the whole table (N x n), ours beside the paper's")
    parser.add_argument("--quick", action="store_true",
                        help="with --grid: one seed, and N = 256 only at n = 8 and 256 (a fraction of the full run)")
    parser.add_argument("--tasks", type=int, nargs="+", help="numbers of training tasks N")
    parser.add_argument("--points", type=int, nargs="+", help="points per task n")
    parser.add_argument("--seeds", type=int, nargs="+", help=f"data seeds (default {list(DEFAULT_SEEDS)})")
    parser.add_argument("--loss", choices=("squared", "hinge"), default="squared")
    parser.add_argument("--embedding-frequencies", type=int, default=128, help="L, frequencies of the embedding")
    parser.add_argument("--select-embedding", action="store_true", help="choose sigma' by cross-validation")
    parser.add_argument("--solver", choices=("rff", "nystroem", "exact"), default="rff")
    parser.add_argument("--features", type=int, default=512, help="D of the final model")
    parser.add_argument("--fresh-points", type=int, default=FRESH_POINTS)
    parser.add_argument("--test-tasks", type=int, default=TEST_TASKS,
                        help="test tasks per seed (a task's error depends on its angle: more tasks, less noise)")
    parser.add_argument("--density", choices=("area", "chord"), default="area",
                        help="points uniform over each ellipse's area, or spread as the authors' generator does")
    parser.add_argument("--authors", choices=AUTHORS_LOSSES,
                        help="the authors' protocol with this loss instead of the product (marginal transfer only)")
    parser.add_argument("--authors-bandwidths", choices=("search", "product"), default="search",
                        help="with --authors: their coordinate search, or the product's bandwidths and C alone")
    parser.add_argument("--authors-grid-step", type=int, default=1,
                        help="with --authors: every k-th value of their 20-value bandwidth grid (2: 10 values)")
    args = parser.parse_args(list(argv))
    if args.authors:
        for n_tasks in args.tasks or (256,):
            for n_points in args.points or (256,):
                print(f"== Ellipse task, N = {n_tasks}, n = {n_points}, the authors' protocol ({args.authors}, "
                      f"bandwidths: {args.authors_bandwidths}) ==", flush=True)
                for seed in args.seeds or DEFAULT_SEEDS:
                    result = authors_cell_error(n_tasks, n_points, seed, args.authors,
                                                bandwidths_from=args.authors_bandwidths,
                                                bandwidths=AUTHORS_BANDWIDTHS[::args.authors_grid_step],
                                                fresh_points=args.fresh_points, density=args.density,
                                                test_tasks=args.test_tasks)
                    chosen = ", ".join(f"{k} {v:.3g}" for k, v in result.params.items())
                    print(f"seed {seed}: {result.error:.2%}  ({chosen})  [{result.seconds:.0f} s]", flush=True)
        return 0
    options = dict(loss=args.loss, n_embedding_features=args.embedding_frequencies,
                   select_embedding=args.select_embedding, solver=args.solver, n_features=args.features,
                   fresh_points=args.fresh_points, density=args.density, test_tasks=args.test_tasks)
    if args.grid:
        seeds = args.seeds or ((DEFAULT_SEEDS[0],) if args.quick else DEFAULT_SEEDS)
        tasks, points = args.tasks or GRID_TASKS, args.points or GRID_POINTS
        start = time.perf_counter()
        if args.quick and not (args.tasks or args.points):
            print_grid((16, 64), points, seeds, **options)
            print_grid((256,), (8, 256), seeds, **options)
        else:
            print_grid(tasks, points, seeds, **options)
        print(f"total {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    seeds = args.seeds or DEFAULT_SEEDS
    for n_tasks in args.tasks or (64,):
        for n_points in args.points or (256,):
            print(f"== Ellipse task, N = {n_tasks} training tasks, n = {n_points}, {args.test_tasks} test tasks, "
                  f"error on {args.fresh_points} fresh points each ==", flush=True)
            paper = PAPER.get((n_tasks, n_points))
            for seed in seeds:
                start = time.perf_counter()
                marginal = cell_error(n_tasks, n_points, seed, True, **options)
                pooling = cell_error(n_tasks, n_points, seed, False, **{
                    k: v for k, v in options.items() if k not in ("n_embedding_features", "select_embedding")})
                note = f" (paper, marginal: {paper:.2%})" if paper is not None else ""
                print(f"seed {seed}: marginal transfer {marginal.error:.2%}, pooling {pooling.error:.2%}{note}  "
                      f"[{time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
