"""Labeled patients made ready for the solver: cells drawn, embeddings, features, statistics.

:class:`TrainingProblem` is what :class:`~gating_core.method.classifier.MarginalTransferClassifier`
solves once, model selection (:mod:`gating_core.method.selection`) solves for many bandwidths and
penalties, and the held-out check (:mod:`gating_core.evaluation.held_out`) solves for many subsets of
patients; :func:`problem_view` gives one problem under another estimator's settings without
drawing or embedding again. Its parts: the patients' embeddings
(:mod:`~gating_core.method.patient_embeddings`), the feature maps (random Fourier features in
:mod:`~gating_core.method.features`, Nystroem / exact landmarks in
:mod:`~gating_core.method.landmarks`) and the simulated instrument shifts of augmentation
(:mod:`~gating_core.method.augmentation`).
"""

from __future__ import annotations

import copy

import numpy as np

from gating_core.cpus import allowed_workers, run_side_by_side
from gating_core.method.augmentation import augment_patients, shift_spread
from gating_core.method.features import (LinearMeanEmbedding, LinearProductFeatures, MeanEmbedding, ProductRFF,
                                         median_pairwise_distance)
from gating_core.method.landmarks import LandmarkFeatures, cell_features
from gating_core.method.patient_embeddings import embed_cells, embed_patients, median_embedding_distance
from gating_core.method.ridge import RidgeStatistics


class TrainingProblem:
    """Labeled patients made ready for the solver under one classifier's settings; nothing fitted.

    :meth:`MarginalTransferClassifier.fit` solves it once and sets the estimator's fitted
    attributes from it; model selection (:mod:`gating_core.method.selection`) builds one and solves it
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
                raise ValueError(f"training labels hold a single population ('{self.classes[0]}'): one class "
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
                random_state=_seed(p.random_state, 5), shift_embedding_cells=bool(p.use_embedding))
        self.cells, self.labels = cells, train_y
        self.targets = None if train_y is None else [np.searchsorted(self.classes, y) for y in train_y]
        pooled = np.vstack([x[:500] for x in cells[: self.n_patients]])
        self.median_distance_x = median_pairwise_distance(pooled, random_state=p.random_state)
        self.bandwidth_x = float(p.bandwidth_x or self.median_distance_x)
        self.bandwidth_embedding = float(p.bandwidth_embedding or self.median_distance_x)
        self.kernel_x = getattr(p, "kernel_x", "gaussian")
        if self.kernel_x == "linear":  # linear k'_X: Psi(P) is the mean cell (sigma' unused)
            self.embedder = LinearMeanEmbedding(d)
            self.embeddings = np.vstack([embed_cells(self.embedder, x, p.embedding_cells) for x in sources])
        else:
            self.embedder = MeanEmbedding(p.n_embedding_features, self.bandwidth_embedding, d,
                                          random_state=_seed(p.random_state, 1))
            if p.use_embedding:
                self.embeddings = embed_patients(self.embedder, sources, p.embedding_cells)
            else:
                # k_P = 1: no row's features read its embedding. Only the real patients' are
                # kept (novelty reads them); an augmented copy takes its source's.
                self.embeddings = embed_patients(self.embedder, sources[: self.n_patients],
                                                 p.embedding_cells)[self.source]
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
            if self.kernel_x == "linear":  # sigma_X has no meaning for the linear k_X
                return LinearProductFeatures(self.n_features, self.n_features_in, embedding_dim, bandwidth_p,
                                             random_state=_seed(self.random_state, 2))
            return ProductRFF(self.n_features, self.n_features_in, embedding_dim, bandwidth_x, bandwidth_p,
                              random_state=_seed(self.random_state, 2))
        return LandmarkFeatures.from_training(self.cells, self.embeddings, bandwidth_x, bandwidth_p,
                                              max_landmarks=self.n_features if self.solver == "nystroem" else None,
                                              random_state=_seed(self.random_state, 3))

    def features(self, feature_map) -> list:
        """Features of every training row under ``feature_map``: list of (m_r, D) float32.

        Rows are computed side by side on the threads BLAS was allowed here (the cosines are
        one thread's work each; a row's values do not depend on the thread that computes it)."""
        return run_side_by_side(lambda r: cell_features(feature_map, self.cells[r], self.embeddings[r],
                                                        self.use_embedding),
                                range(len(self.cells)), allowed_workers(len(self.cells)))

    def row_features(self, feature_map, store: bool = False) -> "RowFeatures":
        """The rows' features as :meth:`features` gives them, without holding them all as a list
        of separate arrays: recomputed whenever a row is read (``store=False``: memory of one
        row), or written once into one (sum m_r, D) float32 array (``store=True``: what an
        iterative solver reads at every step, with no second stacked copy)."""
        return RowFeatures(self, feature_map, store)

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

    def onehot(self, r: int) -> np.ndarray:
        """One-hot targets of training row ``r``: (m_r, n_classes) float32."""
        return (self.targets[r][:, None] == np.arange(len(self.classes))[None, :]).astype(np.float32)

    def statistics(self, features) -> RidgeStatistics:
        """The ridge problem's per-row sufficient statistics for ``features`` (a list, or
        :meth:`row_features`: then each thread holds one row's features and targets at a time).

        Rows run side by side on the threads BLAS was allowed here (one inside a pool of our
        own threads), each row's products on one BLAS thread: the statistics are the same bits
        on any number of threads (BLAS's threaded F^T F moved by 1e-3 in float32 between one
        thread and two, and the fitted model's probabilities by 1e-6)."""

        def row(r):
            f = features[r]
            one = RidgeStatistics(f.shape[1], len(self.classes))
            one.add_patient([f], [self.onehot(r)])
            return one

        parts = run_side_by_side(row, range(len(features)), allowed_workers(len(features)))
        return RidgeStatistics.concatenate(parts) if parts else None


class RowFeatures:
    """The features of a :class:`TrainingProblem`'s rows under one feature map, as a sequence:
    ``features[r]`` is ``cell_features(feature_map, problem.cells[r], problem.embeddings[r], ...)``,
    exactly what :meth:`TrainingProblem.features` lists.

    With ``store=False`` nothing is kept: a row is computed whenever it is read (a pass over
    the rows holds one row's (m_r, D) features). With ``store=True`` every row is computed once
    into ``stacked`` (sum m_r, D) float32 and read as a view of it.

    Attributes
    ----------
    bounds : ndarray of shape (n_rows + 1,)   row r is ``stacked[bounds[r]:bounds[r + 1]]``
    stacked : ndarray of shape (bounds[-1], D) float32, or None (``store=False``)
    """

    def __init__(self, problem: TrainingProblem, feature_map, store: bool = False):
        self.problem, self.feature_map = problem, feature_map
        self.bounds = np.concatenate([[0], np.cumsum([len(x) for x in problem.cells])]).astype(np.int64)
        self.stacked = None
        if store:
            first = self._compute(0)
            self.stacked = np.empty((int(self.bounds[-1]), first.shape[1]), dtype=np.float32)
            self.stacked[: self.bounds[1]] = first

            def write(r):  # each row into its own slice: rows side by side, the same bits
                lo, hi = self.bounds[r], self.bounds[r + 1]
                if isinstance(feature_map, LandmarkFeatures):
                    self.stacked[lo:hi] = self._compute(r)
                else:  # written in place: no (m_r, D) temporary
                    cell_features(feature_map, problem.cells[r], problem.embeddings[r], problem.use_embedding,
                                  out=self.stacked[lo:hi])

            run_side_by_side(write, range(1, len(self)), allowed_workers(len(self) - 1))

    def _compute(self, r: int) -> np.ndarray:
        p = self.problem
        return cell_features(self.feature_map, p.cells[r], p.embeddings[r], p.use_embedding)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, r):
        r = int(r)
        if not -len(self) <= r < len(self):
            raise IndexError(f"row {r} of {len(self)}")
        r %= len(self)
        if self.stacked is not None:
            return self.stacked[self.bounds[r]:self.bounds[r + 1]]
        return self._compute(r)

    def __iter__(self):
        return (self[r] for r in range(len(self)))


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


def problem_view(problem: TrainingProblem, estimator) -> TrainingProblem:
    """``problem`` under ``estimator``'s settings without drawing or embedding again: what
    ``TrainingProblem(estimator, ...)`` builds from the same patients, when ``estimator`` draws
    and embeds them as ``problem``'s estimator did (same ``cells_per_patient``,
    ``embedding_cells``, ``n_embedding_features``, ``bandwidth_embedding`` and
    ``random_state``) and either augments them as it did or not at all.

    Without augmentation (``n_augment=0``, the pooled companion) only the real patients' rows
    are kept: the cells are drawn before any copy is made, so they are the same cells. The
    solver, feature count, embedding switch and bandwidths are ``estimator``'s.
    """
    kernel_x = getattr(estimator, "kernel_x", "gaussian")
    if kernel_x != getattr(problem, "kernel_x", "gaussian"):
        raise ValueError("problem_view needs a problem embedded with the estimator's cell kernel")
    if kernel_x == "linear":  # Psi is the mean cell: no bandwidth, no frequencies to compare
        embedded_alike = True
    else:
        expected_embedding = float(estimator.bandwidth_embedding or problem.median_distance_x)
        embedded_alike = (problem.embedder.bandwidth == expected_embedding
                          and problem.embedder.n_features == int(estimator.n_embedding_features))
    if (problem.random_state != estimator.random_state or not embedded_alike
            or max(len(x) for x in problem.cells) > int(estimator.cells_per_patient)):
        raise ValueError("problem_view needs a problem drawn and embedded as the estimator would draw and embed")
    out = copy.copy(problem)
    if int(estimator.n_augment) == 0 and problem.n_rows > problem.n_patients:
        n = problem.n_patients
        out.cells, out.embeddings, out.source = problem.cells[:n], problem.embeddings[:n], problem.source[:n]
        if problem.labels is not None:
            out.labels, out.targets = problem.labels[:n], problem.targets[:n]
        out.parent_rows = np.arange(n)
        out.augment_gain = out.augment_shift = None
    elif problem.n_rows != problem.n_patients * (1 + int(estimator.n_augment)):
        raise ValueError(f"problem_view: the problem holds {problem.n_rows} rows for {problem.n_patients} patients, "
                         f"not {1 + int(estimator.n_augment)} per patient")
    out.solver, out.n_features, out.use_embedding = estimator.solver, estimator.n_features, estimator.use_embedding
    out.bandwidth_x = float(estimator.bandwidth_x or problem.median_distance_x)
    out.bandwidth_p = float(estimator.bandwidth_p or problem.median_distance_p) if estimator.use_embedding else None
    return out



def _draw(n, m, rng):
    return np.arange(n) if n <= m else np.sort(rng.choice(n, m, replace=False))


def _seed(random_state, stream):
    return np.random.SeedSequence([int(random_state or 0), stream])
