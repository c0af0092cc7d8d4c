"""Labeled patients made ready for the solver: cells drawn, embeddings, features, statistics.

:class:`TrainingProblem` is what :class:`~gating_core.method.classifier.MarginalTransferClassifier`
solves once, model selection (:mod:`gating_core.method.selection`) solves for many bandwidths and
penalties, and the held-out check (:mod:`gating_core.evaluation.held_out`) solves for many subsets of
patients. Beside it: the content-chosen cells of an embedding, the feature maps (random Fourier
features or Nystroem / exact landmarks), and the simulated instrument shifts of augmentation.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import threading

import numpy as np
from scipy.linalg import eigh

from gating_core.cpus import allowed_workers, one_blas_thread, run_side_by_side, score_threads
from gating_core.method.features import (ExactKernel, LinearMeanEmbedding, LinearProductFeatures, MeanEmbedding,
                                         ProductRFF, content_subsample, median_pairwise_distance)
from gating_core.method.ridge import RidgeStatistics

MAX_SHIFT_SD, MAX_GAIN_SD = 0.5, 0.3


def embed_cells(embedder: MeanEmbedding, x, max_cells: int) -> np.ndarray:
    """Psi of one patient's cells ``x`` (n, d), from at most ``max_cells`` of them chosen by
    content (:func:`content_subsample`): ndarray of shape (2L,)."""
    x = np.asarray(x)
    return embedder.transform(x[content_subsample(x, max_cells)])


#: The embeddings computed within :func:`shared_embeddings` (None outside it): cache key -> Psi.
_SHARED_EMBEDDINGS: contextvars.ContextVar = contextvars.ContextVar("shared_embeddings", default=None)


@contextlib.contextmanager
def shared_embeddings():
    """Within the block, every :class:`TrainingProblem` reuses the embeddings already computed
    for the same cells under the same embedder (frequencies) instead of computing them again.

    A training builds several problems from the same patients: model selection's, the final
    fit's, the pooled companion's selection and fit. Where two of them embed identical cells
    (same draw, same augmentation shift) with the same sigma', the result is the same array, so
    it is computed once. The key is the cells' bytes and the embedder's frequencies, so a
    different sigma' (selection draws fewer cells, hence another median start) or another
    augmentation draw is simply another entry: nothing is reused that would differ. Nested
    blocks share the outer block's cache; it is dropped when the outermost block ends.
    """
    if _SHARED_EMBEDDINGS.get() is not None:
        yield
        return
    token = _SHARED_EMBEDDINGS.set({})
    try:
        yield
    finally:
        _SHARED_EMBEDDINGS.reset(token)


def _embedding_key(embedder: MeanEmbedding, x: np.ndarray, max_cells: int) -> tuple:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(embedder.frequencies_).tobytes())
    x = np.ascontiguousarray(x)
    h.update(x.tobytes())
    return (h.hexdigest(), x.shape, x.dtype.str, int(max_cells))


def embed_patients(embedder: MeanEmbedding, samples, max_cells: int) -> np.ndarray:
    """Psi of each patient's cells (list of (n_i, d)): ndarray of shape (n_patients, 2L).

    Row i is exactly ``embed_cells(embedder, samples[i], max_cells)``. The patients are embedded
    side by side on :func:`~gating_core.cpus.score_threads` threads (numpy's cos and sin
    release the GIL), each with one BLAS thread, whatever the pool size, so the result does not
    depend on the number of threads; on a thread of a ``concurrent.futures`` pool, serially.
    Within :func:`shared_embeddings`, a patient embedded before is not embedded again.
    """
    cache = _SHARED_EMBEDDINGS.get()
    keys = [None] * len(samples) if cache is None else [_embedding_key(embedder, x, max_cells) for x in samples]
    out = np.empty((len(samples), 2 * embedder.n_features))
    todo = []
    for i, key in enumerate(keys):
        if key is not None and key in cache:
            out[i] = cache[key]
        else:
            todo.append(i)

    def run(i):
        out[i] = embed_cells(embedder, samples[i], max_cells)

    # A pool thread (ours, or any concurrent.futures pool) already holds one CPU's worth of work:
    # no second pool inside it. Other threads (the app's script thread) may start one.
    in_pool = threading.current_thread().name.startswith("ThreadPoolExecutor")
    workers = 1 if in_pool else max(1, min(score_threads(), len(todo)))
    run_side_by_side(run, todo, workers)
    if cache is not None:
        for i in todo:
            cache.setdefault(keys[i], out[i].copy())
    return out


def cell_features(feature_map, x, embedding, use_embedding=True, out=None) -> np.ndarray:
    """phi(P, x) of cells ``x`` (n, d) of one patient with embedding Psi(P): (n, D) float32.

    ``feature_map``: a :class:`~gating_core.method.features.ProductRFF` or a :class:`LandmarkFeatures`;
    ``use_embedding=False`` ignores the embedding (k_P = 1).
    """
    # One BLAS thread: OpenBLAS computes a small product (a patient of 2,000 cells times d x D)
    # differently on one thread and on two (1e-6 apart), and training sizes BLAS from the load
    # average; a product with d inner terms gains nothing from threads beside the cosine.
    with one_blas_thread():
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


def augment_patients(cells, labels, embedding_cells, n_copies, gain_sd, shift_sd, random_state=0,
                     shift_embedding_cells=True):
    """Add ``n_copies`` shifted copies of every patient, as further patients.

    Each copy multiplies each channel by exp(N(0, gain_sd^2)) and adds N(0, shift_sd^2)
    (``gain_sd``, ``shift_sd``: scalars or per-channel arrays), the same draw for its training
    cells and its embedding cells, and keeps the source's labels: an instrument or staining
    shift moves the cells and the expert's gates together. ``shift_embedding_cells=False``
    (a model without the embedding) gives each copy its source's embedding cells, unshifted
    and not copied; the draws, hence the copies' training cells, are the same.

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
            out_e.append(np.asarray(embedding_cells[i], dtype=np.float32) * gain + shift if shift_embedding_cells
                         else embedding_cells[i])
            if out_y is not None:
                out_y.append(labels[i])
            source.append(i)
    return out_x, out_y, out_e, np.asarray(source)


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
