"""A labeled patient reduced to what training needs, where its file is.

:func:`digest_patient` draws a few thousand seeded training cells with their labels and the
content-chosen cells of the patient's embedding (compensated when the model compensates), so that
only those rows travel (to a Dask worker's caller, to the held-out check). :class:`DigestView`
lets channel matching treat a digest like a sample; :func:`infer_cell_groups` finds near-duplicate
patients from their cells when no groups are given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.fcs.transforms import is_time_like
from gating_core.method.features import MeanEmbedding, content_subsample


@dataclass
class PatientDigest:
    """What training needs from one labeled patient, a few thousand rows instead of the file.

    Built by :func:`digest_patient` where the file is (locally, or on a Dask worker) so that
    only these rows travel. ``train_events`` / ``train_labels``: a seeded draw of at most
    ``cells_per_patient`` events (the cells the solver sees; every patient weighs the same),
    uniform or stratified by population (:func:`training_rows`);
    ``embedding_events``: at most ``embedding_cells`` events chosen by content hash (the cells
    the patient's embedding is computed from: the same cells whatever the event order). Events
    are compensated when the model compensates, on all channels of the file.
    """

    name: str
    channels: list
    keywords: dict
    n_events: int
    train_events: np.ndarray
    train_labels: np.ndarray
    embedding_events: np.ndarray


def population_allocation(counts, n: int, class_balance: float) -> np.ndarray:
    """How many of ``n`` drawn cells each population gets: shares proportional to
    ``count ** (1 - class_balance)``, no population given more cells than it has, the cells a
    small population cannot fill handed to the others in proportion (water filling), rounding
    by largest remainder. ``class_balance`` 0 is proportional (a uniform draw's expectation),
    1 equal shares. Sums to ``min(n, sum(counts))``."""
    counts = np.asarray(counts, dtype=np.int64)
    n = int(min(n, counts.sum()))
    weights = np.where(counts > 0, counts.astype(float) ** (1.0 - float(class_balance)), 0.0)
    target = np.zeros(len(counts))
    capped = counts == 0
    while True:
        free = ~capped
        left = n - counts[capped].sum()
        target[capped] = counts[capped]
        target[free] = left * weights[free] / weights[free].sum() if free.any() else 0.0
        over = free & (target > counts)
        if not over.any():
            break
        capped |= over
    allocation = np.floor(target + 1e-9).astype(np.int64)
    short = n - allocation.sum()
    room = np.flatnonzero(allocation < counts)
    order = room[np.argsort(-(target[room] - allocation[room]), kind="stable")]
    allocation[order[:short]] += 1
    return allocation


def training_rows(labels, n: int, rng: np.random.Generator, class_balance: float = 0.0) -> np.ndarray:
    """Sorted indices of the training cells drawn from a patient's ``labels`` (n_events,).

    All events when there are at most ``n``. Else ``class_balance`` 0: a uniform draw of ``n``
    (every cell equally likely, population shares as in the file); above 0: within each
    population a uniform draw of the cells :func:`population_allocation` gives it, so that a
    population of 0.5% of the events brings more than 0.5% of the cells the model learns from
    (1: every population the same number, as far as its cells go)."""
    labels = np.asarray(labels)
    if len(labels) <= n:
        return np.arange(len(labels))
    if not class_balance:
        return np.sort(rng.choice(len(labels), n, replace=False))
    _, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
    allocation = population_allocation(counts, n, class_balance)
    rows = [rng.choice(np.flatnonzero(codes == c), int(a), replace=False) for c, a in enumerate(allocation) if a]
    return np.sort(np.concatenate(rows))


def embedding_rows(sample, embedding_cells=20000) -> np.ndarray:
    """The rows of ``sample``'s events its embedding is computed from: at most ``embedding_cells``,
    chosen by a content hash of the events on every channel but time-like ones."""
    events = sample.events
    hashed = [i for i, c in enumerate(sample.channels) if not is_time_like(c.pnn)] or list(range(events.shape[1]))
    return content_subsample(events[:, hashed], embedding_cells)


def _missing_labels(labels) -> np.ndarray:
    """(n,) bool: the labels that name no population (None, NaN, empty or blank text)."""
    if labels.dtype.kind in "iub":
        return np.zeros(len(labels), dtype=bool)
    import pandas as pd

    # Each distinct label once (millions of events, a handful of populations); None and NaN are -1.
    codes, names = pd.factorize(labels, use_na_sentinel=True)
    blank = [k for k, name in enumerate(names) if not str(name).strip()]
    return (codes < 0) | np.isin(codes, blank)


def digest_patient(sample, labels, cells_per_patient=4000, embedding_cells=20000, seed=0,
                   compensate=True, class_balance=0.0) -> PatientDigest:
    """Reduce one labeled patient to a :class:`PatientDigest` (see there); ``class_balance``
    as in :func:`training_rows`."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{sample.name}: the labels must be one population name per event, shape "
                         f"({sample.n_events},), not {labels.shape}")
    if len(labels) != sample.n_events:
        raise ValueError(f"{sample.name}: {sample.n_events} events but {len(labels)} labels")
    if sample.n_events == 0:
        raise ValueError(f"{sample.name}: the sample holds no events")
    missing = _missing_labels(labels)
    if missing.any():
        raise ValueError(f"{sample.name}: {int(missing.sum())} events have no population (empty, None or "
                         f"NaN labels, the first at event {int(np.argmax(missing))}); give every event one")
    labels = labels.astype(str)
    if not 0.0 <= float(class_balance) <= 1.0:
        raise ValueError(f"class_balance must be within [0, 1], got {class_balance!r}")
    if compensate and sample.has_spillover and not sample.compensated:
        sample = sample.compensate()
    events = sample.events
    draw = training_rows(labels, cells_per_patient, np.random.default_rng(seed), class_balance)
    chosen = embedding_rows(sample, embedding_cells)
    return PatientDigest(sample.name, list(sample.channels), dict(sample.keywords), sample.n_events,
                         np.ascontiguousarray(events[draw]), labels[draw], np.ascontiguousarray(events[chosen]))


def infer_cell_groups(embedding_cells, names, n_embedding_features=128, random_state=0) -> list[str]:
    """Groups of near-duplicate patients from their standardised cells (one array per patient).

    Embeds every patient with a median-bandwidth kernel mean embedding and links patients as
    :func:`gating_core.method.groups.infer_groups` does. Used when no groups are given: by training, and
    by the evaluation to choose what to hold out.
    """
    from gating_core.method.features import median_pairwise_distance
    from gating_core.method.groups import infer_groups
    from gating_core.method.patient_embeddings import embed_patients

    pooled = np.vstack([e[:500] for e in embedding_cells])
    embedder = MeanEmbedding(n_embedding_features, median_pairwise_distance(pooled), pooled.shape[1],
                             random_state=np.random.SeedSequence([int(random_state or 0), 11]))
    # every cell of each patient (max_cells = the largest patient), on the usable CPUs
    embeddings = embed_patients(embedder, embedding_cells, max(len(e) for e in embedding_cells))
    return infer_groups(embeddings, names)


def find_channel(sample, pnn: str, pns: str = "") -> int | None:
    """Index of a channel in ``sample``: same $PnN, else same marker ($PnS), case-insensitively."""
    names = sample.pnn
    if pnn in names:
        return names.index(pnn)
    folded = pnn.casefold()
    for i, c in enumerate(sample.channels):
        if c.pnn.casefold() == folded:
            return i
    targets = {t.casefold() for t in (pns, pnn) if t}
    for i, c in enumerate(sample.channels):
        if c.pns and c.pns.casefold() in targets:
            return i
    return None


class DigestView:
    """Looks enough like a Sample (name, channels, events, keywords) for channel matching."""

    def __init__(self, digest: PatientDigest):
        self.name = digest.name
        self.channels = digest.channels
        self.keywords = digest.keywords
        self.events = digest.embedding_events

    @property
    def pnn(self):
        return [c.pnn for c in self.channels]
