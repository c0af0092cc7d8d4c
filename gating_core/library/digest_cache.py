"""Training digests kept beside the library's patients, so a retrain reads only what changed.

Training needs a few thousand rows of each labeled patient (a :class:`~gating_core.model.digest.PatientDigest`:
the seeded draw of training cells with their labels, and the content-chosen embedding cells).
Reading 200 patients' events to draw them again costs more than the rest of reading a
library; :func:`library_digests` keeps each digest in ``digests/<patient id>-<settings key>.npz``
and reads a patient's events only when its digest is missing or stale.

What is cached is patient-local only: the events as stored (compensated when the settings say
so, with the patient's own spillover matrix), before any channel choice, transform or
standardisation. Those are chosen from the whole cohort (``transform="auto"`` looks at every
patient) when the model is fitted, so adding a patient changes them without invalidating
anyone's digest.

A digest is used only when everything that made it is unchanged: the patient's events file and
current labels file (by the SHA-256 the catalog recorded when they were written: library data
files are written once and never modified, so a new labeling is a new file and a new hash), its
spillover matrix, and the settings (``cells_per_patient``, ``embedding_cells``, ``compensate``, the
seed of the draw, the digest format). Names, channel names and keywords are taken from the
catalog at read time, so renaming a patient or a channel keeps its digest. A digest file that
cannot be read or does not match is rebuilt, never trusted; files are read with
``allow_pickle=False``.

Crash safety as for the library's other files: a digest is written under ``tmp/`` with the
writer's pid in its name, flushed, then renamed into ``digests/``; a killed writer leaves a temp
file the next :class:`PatientLibrary` removes. The cache is not in the catalog: losing a digest
only costs a re-read, and a library that cannot be written (read-only) still trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel
import gating_core.library.catalog as catalog
from gating_core.library.common import LibraryError
import gating_core.library.storage as storage
from gating_core.model.digest import PatientDigest

#: Bump when what :func:`~gating_core.model.digest.digest_patient` draws changes: old digests then miss.
DIGEST_FORMAT = 1
DIGEST_DIR = "digests"


@dataclass
class DigestCacheStats:
    """What :func:`library_digests` did: patients served from the cache (``hits``) or read
    (``misses``, one events file and one labels file each), and where the time went."""

    hits: int = 0
    misses: int = 0
    read_seconds: float = 0.0
    digest_seconds: float = 0.0
    cache_read_seconds: float = 0.0
    cache_write_seconds: float = 0.0
    not_stored: list = field(default_factory=list)  # (patient, reason) of digests that could not be written


@dataclass(frozen=True)
class _PatientState:
    """What the catalog says about one labeled patient, read in one snapshot."""

    id: str
    name: str
    channels: list
    keywords: dict
    n_events: int
    events_sha256: str
    labels_sha256: str
    spillover_sha256: str


def digest_settings(cells_per_patient: int, embedding_cells: int, seed: np.random.SeedSequence,
                    compensate: bool, class_balance: float = 0.0) -> dict:
    """The settings a digest is made with, as stored in (and compared against) its file."""
    settings = {"format": DIGEST_FORMAT, "cells_per_patient": int(cells_per_patient),
                "embedding_cells": int(embedding_cells), "compensate": bool(compensate),
                "seed_entropy": _entropy(seed.entropy), "seed_spawn_key": [int(k) for k in seed.spawn_key]}
    if class_balance:  # absent for the uniform draw, so digests stored before it stay valid
        settings["class_balance"] = float(class_balance)
    return settings


def _entropy(entropy):
    return [int(e) for e in entropy] if isinstance(entropy, (list, tuple, np.ndarray)) else int(entropy)


def _settings_key(settings: dict) -> str:
    """Part of the file name: the settings except the patient's position, so that a patient has
    one file per distinct model setting, overwritten when its position (hence its seed) changes.

    ``GatingModel.digest_seed(i)`` is ``SeedSequence([random_state, 10, i])``: the position is the
    entropy's last element."""
    stable = dict(settings)
    entropy = stable.pop("seed_entropy")
    stable["seed_base"] = entropy[:-1] if isinstance(entropy, list) else entropy
    text = json.dumps(stable, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digest_path(library, patient_id: str, settings: dict) -> Path:
    """Where the digest of a patient (by its generated id, never its name) is kept."""
    return library.path / DIGEST_DIR / f"{patient_id}-{_settings_key(settings)}.npz"


def _labeled_states(conn, names) -> list[_PatientState]:
    states = []
    for name in names:
        row = conn.execute("SELECT * FROM patients WHERE name_key = ?", (_key(name),)).fetchone()
        if row is None:
            raise LibraryError("not in the library", patient=name)
        if row["current_labeling"] is None:
            raise LibraryError("has no labels; label it (import, gates or an accepted auto-gate) "
                               "before training on it", patient=row["name"])
        events_sha = conn.execute("SELECT sha256 FROM files WHERE id = ?", (row["events_file"],)).fetchone()[0]
        labels_sha = conn.execute("SELECT f.sha256 FROM labelings l JOIN files f ON f.id = l.labels_file "
                                  "WHERE l.id = ?", (row["current_labeling"],)).fetchone()[0]
        channels = [Channel(r["pnn"], r["pns"], r["range"]) for r in conn.execute(
            "SELECT pnn, pns, range FROM channels WHERE patient_id = ? ORDER BY position", (row["id"],))]
        spillover = (row["spillover_json"] or "") + "|" + row["spillover_channels_json"] + "|" + str(row["compensated"])
        states.append(_PatientState(row["id"], row["name"], channels, json.loads(row["keywords_json"]),
                                    int(row["n_events"]), events_sha, labels_sha,
                                    hashlib.sha256(spillover.encode()).hexdigest()))
    return states


def _key(name: str) -> str:
    from gating_core.library.common import _name_key

    return _name_key(name)


def _identity(state: _PatientState, settings: dict) -> dict:
    """Everything a stored digest must match to be used for ``state`` with ``settings``.

    The spillover hash covers the matrix and its channel names as stored; a channel rename
    renames both, so it would miss once (a re-read), never use a wrong compensation."""
    return {"settings": settings, "events_sha256": state.events_sha256, "labels_sha256": state.labels_sha256,
            "spillover_sha256": state.spillover_sha256, "n_events": state.n_events,
            "n_channels": len(state.channels)}


def read_cached_digest(path: Path, state: _PatientState, settings: dict) -> PatientDigest | None:
    """The stored digest at ``path`` if it was made from exactly this state and these settings,
    else None (missing, unreadable, stale or malformed: the caller rebuilds it)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            identity = json.loads(str(archive["identity"][()]))
            if identity != _identity(state, settings):
                return None
            train_events = archive["train_events"]
            train_labels = archive["train_labels"]
            embedding_events = archive["embedding_events"]
    except (OSError, ValueError, KeyError, EOFError, json.JSONDecodeError):
        return None
    except Exception:  # zipfile.BadZipFile and whatever else a damaged file raises
        return None
    d = len(state.channels)
    n_train = min(state.n_events, settings["cells_per_patient"])
    if (train_events.ndim != 2 or train_events.shape != (n_train, d) or train_labels.shape != (n_train,)
            or train_labels.dtype.kind != "U" or embedding_events.ndim != 2 or embedding_events.shape[1] != d
            or embedding_events.shape[0] > state.n_events):
        return None
    return PatientDigest(state.name, list(state.channels), dict(state.keywords), state.n_events,
                         train_events, train_labels, embedding_events)


def write_cached_digest(library, path: Path, state: _PatientState, settings: dict, digest: PatientDigest) -> None:
    """Store ``digest`` at ``path`` atomically (temp file under ``tmp/``, flushed, renamed)."""
    path.parent.mkdir(exist_ok=True)
    temp = storage.temp_path(library.tmp_dir)
    try:
        with open(temp, "wb") as handle:
            np.savez(handle, identity=np.array(json.dumps(_identity(state, settings), sort_keys=True)),
                     train_events=digest.train_events, train_labels=np.asarray(digest.train_labels, dtype=str),
                     embedding_events=digest.embedding_events)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        storage.fsync_dir(path.parent)
    finally:
        temp.unlink(missing_ok=True)


def library_digests(library, model, names=None, *, start: int = 0, use_cache: bool = True,
                    progress=None) -> tuple[list[PatientDigest], DigestCacheStats]:
    """The training digests of the library's labeled patients (or the named ones), as
    ``model.fit`` would draw them: patient ``i`` gets the seed ``model.digest_seed(start + i)``.

    Each digest comes from ``digests/`` when it matches (see the module docstring), else from
    the patient's events and labels, read one patient at a time (memory: one patient's events,
    not the cohort's) and stored for the next training. Returns the digests in patient order
    and a :class:`DigestCacheStats`. Digests of patients no longer in the library are removed
    (:func:`prune_digests`). Raises LibraryError for an unknown or unlabeled patient or
    an unreadable data file.
    """
    stats = DigestCacheStats()
    with library._connect() as conn, catalog.read_transaction(conn):
        if names is None:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM patients WHERE current_labeling IS NOT NULL ORDER BY created_at, name")]
        states = _labeled_states(conn, names)
    digests = []
    for i, state in enumerate(states):
        settings = digest_settings(model.cells_per_patient, model.embedding_cells, model.digest_seed(start + i),
                                   model.compensate, getattr(model, "class_balance", 0.0))
        path = digest_path(library, state.id, settings)
        digest = None
        if use_cache:
            began = time.perf_counter()
            digest = read_cached_digest(path, state, settings)
            stats.cache_read_seconds += time.perf_counter() - began
        if digest is not None:
            stats.hits += 1
        else:
            stats.misses += 1
            digest = _digest_from_files(library, state, model, settings, start + i, stats)
            if use_cache:
                began = time.perf_counter()
                _store(library, path, state, settings, digest, stats)
                stats.cache_write_seconds += time.perf_counter() - began
        digests.append(digest)
        if progress is not None:
            progress(state.name, (i + 1) / len(states))
    if use_cache:
        try:
            prune_digests(library)
        except OSError:  # a read-only library: stale digests stay, unused
            pass
    return digests, stats


def _store(library, path: Path, state: _PatientState, settings: dict, digest: PatientDigest,
           stats: DigestCacheStats) -> None:
    """Store a freshly made digest, unless the patient changed while it was read (another
    session relabeled it): then its files and ``state`` may disagree, and nothing is stored."""
    with library._connect() as conn, catalog.read_transaction(conn):
        try:
            now = _labeled_states(conn, [state.name])[0]
        except LibraryError:
            now = None
    if now != state:
        stats.not_stored.append((state.name, "changed while it was read"))
        return
    try:
        write_cached_digest(library, path, state, settings, digest)
    except OSError as exc:  # a read-only library still trains, re-reading next time
        stats.not_stored.append((state.name, exc.strerror or str(exc)))


def _digest_from_files(library, state: _PatientState, model, settings: dict, index: int,
                       stats: DigestCacheStats) -> PatientDigest:
    began = time.perf_counter()
    labels = library.load_labels(state.name)
    sample = library.load_sample(state.name, compensate=model.compensate)
    if labels is None:
        raise LibraryError("has no labels (removed by another session?)", patient=state.name)
    if sample.n_events != state.n_events:
        raise LibraryError("was replaced by another session while training read it", patient=state.name)
    read_done = time.perf_counter()
    digest = model.digest(sample, labels, index)
    stats.read_seconds += read_done - began
    stats.digest_seconds += time.perf_counter() - read_done
    return digest


def prune_digests(library) -> list[Path]:
    """Remove stored digests of patients no longer in the library; returns what was removed."""
    folder = library.path / DIGEST_DIR
    if not folder.is_dir():
        return []
    with library._connect() as conn:
        ids = {r[0] for r in conn.execute("SELECT id FROM patients")}
    removed = []
    for path in folder.glob("*.npz"):
        if path.name.split("-", 1)[0] not in ids:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
