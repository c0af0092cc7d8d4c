"""Files of the library: atomic placement and the Parquet layout of events and labels.

Every data file is written under ``tmp/`` with a name that carries the writer's process id,
flushed to disk, and only then renamed to its final name under ``data/``. Readers therefore
see either no file or a complete one. Final files are named by generated ids, never by user
input.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gating_core.io.parquet_columns import repeating_columns

TEMP_SUFFIX = ".part"
# A temp file whose writer is still alive is left alone unless it is older than this.
STALE_TEMP_SECONDS = 24 * 3600


@dataclass
class TempFile:
    """A fully written file under ``tmp/`` waiting to be renamed into place."""

    path: Path
    sha256: str
    size: int
    n_rows: int | None = None


@dataclass
class Placement:
    """Where a :class:`TempFile` went: ``placed`` is set once it is renamed into ``data/``."""

    temp: TempFile
    placed: Path | None = None


@contextmanager
def placing(temp: TempFile):
    """Guard a transaction that renames ``temp`` into place: if anything in it fails, the rows
    roll back, so the temp file and the file it became belong to nobody and are removed."""
    placement = Placement(temp)
    try:
        yield placement
    except BaseException:
        temp.path.unlink(missing_ok=True)
        if placement.placed is not None:
            placement.placed.unlink(missing_ok=True)
        raise


def new_id() -> str:
    return uuid.uuid4().hex


def temp_path(tmp_dir: Path) -> Path:
    return tmp_dir / f"{os.getpid()}-{uuid.uuid4().hex}{TEMP_SUFFIX}"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def events_digest(events: np.ndarray) -> str:
    """SHA-256 of an (n_events, n_channels) array's dtype, shape and values: equal for the same
    events however they were read or stored (a stored file's own bytes change with the Parquet
    writer's version)."""
    events = np.ascontiguousarray(events)
    digest = hashlib.sha256(f"{events.dtype.str}{events.shape}".encode())
    digest.update(memoryview(events).cast("B"))
    return digest.hexdigest()


def _finish(path: Path, n_rows: int | None) -> TempFile:
    _fsync_file(path)
    return TempFile(path, sha256_of(path), path.stat().st_size, n_rows)


def write_events_temp(tmp_dir: Path, events: np.ndarray, pnn: list[str]) -> TempFile:
    """Write an (n_events, n_channels) array as one Parquet column per channel.

    The dtype is kept as read (float32 stays float32). Columns are named by position and
    $PnN, because $PnN may repeat in odd files; readers take columns by position.
    """
    events = np.asarray(events)
    columns = [pa.array(np.ascontiguousarray(events[:, i])) for i in range(events.shape[1])]
    names = [f"{i}:{name}" for i, name in enumerate(pnn)]
    table = pa.Table.from_arrays(columns, names=names)
    path = temp_path(tmp_dir)
    try:
        pq.write_table(table, path, compression="zstd", use_dictionary=repeating_columns(table))
        return _finish(path, events.shape[0])
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read_events(path: Path, n_channels: int) -> np.ndarray:
    """Inverse of :func:`write_events_temp`: (n_events, n_channels) in the stored dtype."""
    table = pq.read_table(path)
    if table.num_columns != n_channels:
        raise ValueError(f"{path.name} holds {table.num_columns} columns, the catalog says {n_channels}")
    if n_channels == 0:
        return np.empty((table.num_rows, 0))
    first = table.column(0).to_numpy()
    events = np.empty((table.num_rows, n_channels), dtype=first.dtype)
    events[:, 0] = first
    for i in range(1, n_channels):
        events[:, i] = table.column(i).to_numpy()
    return events


def write_labels_temp(tmp_dir: Path, populations: np.ndarray, confidence: np.ndarray | None = None) -> TempFile:
    """Write per-event population names (dictionary-encoded) and, optionally, confidences."""
    arrays = [pa.array(np.asarray(populations, dtype=object), type=pa.string()).dictionary_encode()]
    names = ["population"]
    if confidence is not None:
        arrays.append(pa.array(np.asarray(confidence, dtype=np.float32)))
        names.append("confidence")
    table = pa.Table.from_arrays(arrays, names=names)
    path = temp_path(tmp_dir)
    try:
        pq.write_table(table, path, compression="zstd")
        return _finish(path, table.num_rows)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read_labels(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Inverse of :func:`write_labels_temp`: (populations str ndarray, confidence or None)."""
    table = pq.read_table(path)
    populations = table.column("population").combine_chunks()
    if isinstance(populations.type, pa.DictionaryType):
        dictionary = np.asarray(populations.dictionary.to_pylist(), dtype=str)
        codes = populations.indices.to_numpy(zero_copy_only=False)
        labels = dictionary[codes] if len(dictionary) else np.empty(len(codes), dtype=str)
    else:
        labels = np.asarray(populations.to_pylist(), dtype=str)
    confidence = None
    if "confidence" in table.column_names:
        confidence = table.column("confidence").to_numpy()
    return labels, confidence


def copy_temp(tmp_dir: Path, source: Path) -> TempFile:
    """Copy an outside file (a model) to a temp file."""
    path = temp_path(tmp_dir)
    try:
        with open(source, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return _finish(path, None)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name == "nt":  # os.kill would terminate the process there; rely on the age rule
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but belongs to someone else, or we cannot tell
    return True


def clean_temp_dir(tmp_dir: Path) -> list[Path]:
    """Remove temp files left by writers that died; returns what was removed."""
    removed = []
    now = time.time()
    for path in tmp_dir.glob(f"*{TEMP_SUFFIX}"):
        pid_text = path.name.split("-", 1)[0]
        try:
            pid = int(pid_text)
        except ValueError:
            pid = -1
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if pid <= 0 or not _pid_alive(pid) or age > STALE_TEMP_SECONDS:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
