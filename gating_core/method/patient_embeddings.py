"""Patients' kernel mean embeddings: each from the cells chosen by content, side by side, shared
within a training.

:func:`embed_cells` embeds one patient from at most ``max_cells`` of its cells (chosen by
content hash, so the same cells give the same embedding wherever they are read);
:func:`embed_patients` embeds many side by side on threads; within :func:`shared_embeddings`,
identical cells under the same embedder are embedded once. :func:`median_embedding_distance`
is sigma_P's data-driven start.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading

import numpy as np

from gating_core.cpus import run_side_by_side, score_threads
from gating_core.method.features import MeanEmbedding, content_subsample

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


def median_embedding_distance(embeddings) -> float:
    """Median distance between distinct patients' embeddings (rows of ``embeddings``)."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    if len(embeddings) < 2:
        return 1.0
    diff = embeddings[:, None, :] - embeddings[None, :, :]
    distances = np.sqrt((diff ** 2).sum(-1))[np.triu_indices(len(embeddings), 1)]
    positive = distances[distances > 0]
    return float(np.median(positive)) if len(positive) else 1.0
