"""What every part of the patient library shares: its error, label provenance, name rules,
the crash-test checkpoints, and the conversions of labels and details to stored values.
"""

from __future__ import annotations

import getpass
import math
import os
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gating_core.errors import ConflictError, LibraryError  # noqa: F401  (the library's errors, importable from here)
from gating_core.io.labels import Provenance  # noqa: F401  (the library's name for it since the start)


LIBRARY_ENV = "GATING_LIBRARY"


DEFAULT_LIBRARY = "workspace"


CATALOG_NAME = "catalog.sqlite"


MAX_NAME_LENGTH = 200


def default_library_path() -> Path:
    """``$GATING_LIBRARY`` when set, else ``./workspace``."""
    return Path(os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY)


def _checkpoint(stage: str) -> None:
    """Named points of a change; a no-op. Tests replace it to kill a process at a known step.

    Stages: ``"staged"`` (temp files written, no lock held), ``"files-in-place"`` (files renamed
    into ``data/``, catalog transaction not yet committed), ``"committed-before-unlink"``
    (removal committed, files not yet deleted).
    """


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return ""


def normalise_name(name: str, what: str = "patient") -> str:
    """Validate a user-given name and return it in NFC form, stripped of outer spaces.

    Names are only ever stored in the catalog (files are named by generated ids), but path
    separators and control characters are refused anyway: they make names that cannot be
    shown or typed back reliably, and no export should ever have to guess what they meant.
    """
    if not isinstance(name, str):
        raise LibraryError(f"{what} name must be text, got {type(name).__name__}")
    if not _is_utf8(name):
        raise LibraryError(f"{what} name \"{_printable(name)}\" is not valid UTF-8 text (it has undecodable bytes)")
    cleaned = unicodedata.normalize("NFC", name).strip()
    if not cleaned:
        raise LibraryError(f"{what} name is empty")
    if len(cleaned) > MAX_NAME_LENGTH:
        raise LibraryError(f"{what} name is longer than {MAX_NAME_LENGTH} characters", patient=cleaned[:40])
    if cleaned in (".", ".."):
        raise LibraryError(f"{what} name {cleaned!r} is not allowed")
    bad = [c for c in cleaned if c in "/\\" or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise LibraryError(f"{what} name may not contain path separators or control characters "
                           f"(found {bad[0]!r})", patient=cleaned)
    return cleaned


def _is_utf8(text: str) -> bool:
    """False for text holding surrogates: a file name's undecodable bytes (surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(text: str) -> str:
    from gating_core.errors import printable

    return printable(text)


def _name_key(name: str) -> str:
    return unicodedata.normalize("NFC", name).strip().casefold()


def _jsonable(value):
    """Convert numpy scalars/arrays and pandas frames to plain JSON values (NaN -> None)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a pandas DataFrame
        return _jsonable(value.to_dict(orient="records"))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def _as_labels(labels, n_events: int, *, patient: str, path=None) -> np.ndarray:
    """Validate per-event population names; returns a str ndarray of shape (n_events,)."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise LibraryError(f"labels must be one name per event, got an array of shape {array.shape}",
                           patient=patient, path=path)
    if array.shape[0] != n_events:
        raise LibraryError(f"{array.shape[0]} labels for {n_events} events; every event needs exactly "
                           "one label, in event order", patient=patient, path=path)
    if array.dtype.kind == "O":
        for i, value in enumerate(array):
            if not isinstance(value, str):
                raise LibraryError(f"label of event {i} is {value!r}, not a population name",
                                   patient=patient, path=path)
        array = array.astype(str)
    elif array.dtype.kind in "iu":
        array = array.astype(str)
    elif array.dtype.kind != "U":
        raise LibraryError(f"labels must be population names (text), got dtype {array.dtype}",
                           patient=patient, path=path)
    if n_events and (array == "").any():
        first = int(np.flatnonzero(array == "")[0])
        raise LibraryError(f"label of event {first} is empty; every event needs a population name",
                           patient=patient, path=path)
    return array


def _population_counts(labels: np.ndarray) -> dict[str, int]:
    names, counts = np.unique(labels, return_counts=True)
    return {str(n): int(c) for n, c in zip(names, counts)}
