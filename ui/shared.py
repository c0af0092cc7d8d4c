"""What sessions on one patient library share instead of each holding a copy: the events of a
stored patient and a stored model, read once per server process while any session uses them.

A value stays here as long as some session (or cache entry, or job) holds it, and no longer: the
tables hold weak references, so the last session that lets go of a patient frees its events.
Shared events are read-only (numpy's ``writeable`` flag off): a change must make a new sample,
as channel renames and compensation do, never write into one every session sees.

The keys name what the value was read from (the library folder, the patient's id and channel
names, or the model's id), so a patient renamed or replaced is read again rather than served stale.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

_guard = threading.Lock()
_values: "weakref.WeakValueDictionary[tuple, object]" = weakref.WeakValueDictionary()
_loading: dict[tuple, threading.Lock] = {}


def shared(key: tuple, load):
    """The value kept under ``key``, else ``load()``'s (one loader at a time per key: sessions
    that ask at once wait for the first rather than reading the same file twice)."""
    with _guard:
        value = _values.get(key)
        if value is not None:
            return value
        lock = _loading.setdefault(key, threading.Lock())
    try:
        with lock:
            with _guard:
                value = _values.get(key)
            if value is None:
                value = load()
                if value is not None:
                    with _guard:
                        _values[key] = value
    finally:
        with _guard:
            if _loading.get(key) is lock and not lock.locked():
                del _loading[key]
    return value


def library_sample(library, info_id: str, name: str, channels) -> object:
    """Patient ``name``'s compensated events from ``library``, shared between sessions."""
    from ui.jobs import library_key

    def load():
        sample = library.load_sample(name, compensate=True)
        sample.events.flags.writeable = False
        return sample

    return shared(("sample", library_key(library.path), info_id, tuple(channels)), load)


def compact_labels(values) -> np.ndarray:
    """Per-event population names as an object array whose elements point at one string per
    population, rather than one string object per event (~60 bytes each: 12 MB for 200,000
    events, against 1.6 MB of pointers)."""
    import pandas as pd

    codes, names = pd.factorize(np.asarray(values).astype(str, copy=False), use_na_sentinel=False)
    return np.array([str(n) for n in names], dtype=object)[codes] if len(names) else np.empty(0, dtype=object)


def library_labels(library, patient_id: str, labeling_id: int, name: str):
    """The labels ``labeling_id`` of patient ``name`` (compact, read-only), shared between sessions."""
    from ui.jobs import library_key

    def load():
        labels = library.load_labels(name)
        if labels is None:  # removed meanwhile: nothing to keep
            return None
        labels = compact_labels(labels)
        labels.flags.writeable = False
        return labels

    return shared(("labels", library_key(library.path), patient_id, labeling_id), load)


def library_model(library, model_id: str):
    """The stored model ``model_id`` (a GatingModel or an IW Nystroem model), shared between sessions."""
    from gating_core.model.iw_model import load_any_model
    from ui.jobs import library_key

    return shared(("model", library_key(library.path), model_id), lambda: load_any_model(library.model_path(model_id)))


def held() -> int:
    """How many shared values are alive (for tests and the memory benchmark)."""
    with _guard:
        return len(_values)


_libc = None
_trim_pending = threading.Event()


def release_free_memory_soon(delay: float = 1.0) -> None:
    """:func:`release_free_memory` in ``delay`` seconds, once for however many calls meanwhile:
    called when a session's store is collected, the rest of what it held is freed only after."""
    if _trim_pending.is_set():
        return
    _trim_pending.set()

    def run():
        _trim_pending.clear()
        release_free_memory()

    timer = threading.Timer(delay, run)
    timer.daemon = True
    timer.start()


def release_free_memory() -> None:
    """Hand memory Python has freed back to the system. glibc keeps freed blocks in the arena of
    the thread that used them, and every rerun of every session runs in a thread of its own: a
    server whose sessions have all ended would otherwise stay near its peak (the figures:
    ``bench/bench_sessions_memory.py``). A no-op where the C library has no ``malloc_trim``."""
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util

        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _libc = False
    trim = getattr(_libc, "malloc_trim", None) if _libc else None
    if trim is not None:
        trim(0)

