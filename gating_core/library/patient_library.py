"""The patient library: historical patients, their labels, gates, models and auto-gate results.

Layout of a library folder::

    catalog.sqlite      SQLite catalog (WAL): patients, channels, label provenance, models, audit
    data/<id>.parquet   events of one patient, or one version of its labels, or one auto-gate
                        result; written once, never modified, named by a generated id
    data/<id>.npz       a stored model file
    tmp/                files being written (``<pid>-<uuid>.part``)

How nothing is lost or half-written: a change first writes its data files under ``tmp/`` and
flushes them; it then takes the catalog's write lock (``BEGIN IMMEDIATE``), inserts its rows,
renames the files into ``data/`` and commits. A process killed before the commit leaves rows
that SQLite rolls back and, at worst, an unreferenced file in ``data/`` or ``tmp/``; the next
:class:`PatientLibrary` opened on the folder removes those (orphans are removed while holding
the write lock, so a file another process is about to commit is never taken for one).
Removing a patient commits first and deletes its files afterwards, for the same reason.

The class is assembled from one part per thing stored, each in its own module of this package:
``patients`` (lookups, events, renames, removal, export), ``importing`` (adding patients),
``labels`` (label versions and their provenance, the training set), ``gates`` (gate trees and
the panel's display transforms), ``models``, ``results`` (auto-gate results, the held-out
check) and ``audit`` (the audit log, the consistency check); ``common`` holds what they share
(:class:`LibraryError`, :class:`Provenance`, name rules). This module keeps the folder, the
catalog connection and the recovery of what a killed writer left.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: the lock holds between the threads of one process only
    fcntl = None

from gating_core.library.common import CATALOG_NAME, LibraryError, _jsonable, _now, default_library_path
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
from gating_core.library.patients import PatientsMixin
from gating_core.library.importing import ImportMixin
from gating_core.library.labels import LabelsMixin
from gating_core.library.gates import GatesMixin
from gating_core.library.models import ModelsMixin
from gating_core.library.results import ResultsMixin
from gating_core.library.audit import AuditMixin
# The names this module held before it was split by what the library stores; still importable here.
from gating_core.library.common import (DEFAULT_LIBRARY, LIBRARY_ENV, MAX_NAME_LENGTH, Provenance,  # noqa: F401
                                        normalise_name)
from gating_core.library.models import ModelInfo  # noqa: F401
from gating_core.library.patients import PatientInfo  # noqa: F401
from gating_core.library.results import GateResultRecord  # noqa: F401


_folder_locks: dict[str, threading.Lock] = {}
_folder_locks_guard = threading.Lock()


class PatientLibrary(PatientsMixin, ImportMixin, LabelsMixin, GatesMixin, ModelsMixin, ResultsMixin,
                     AuditMixin):
    """A persistent library of patients, labels, gates, models and auto-gate results.

    Parameters
    ----------
    path : str or Path, optional
        The library folder; default ``$GATING_LIBRARY`` or ``./workspace``. Created when missing
        (unless ``create=False``).

    Every method opens its own short catalog connection, so one object may be shared between
    threads, and several processes may use the same folder at once.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True):
        self.path = Path(path if path is not None else default_library_path()).expanduser()
        self.catalog_path = self.path / CATALOG_NAME
        self.data_dir = self.path / "data"
        self.tmp_dir = self.path / "tmp"
        if self.path.exists() and not self.path.is_dir():
            raise LibraryError("is not a folder", path=self.path)
        if not self.catalog_path.exists():
            if not create:
                raise LibraryError("no patient library here (catalog.sqlite missing); "
                                   "importing files creates one", path=self.path)
            if self.data_dir.is_dir() and any(self.data_dir.iterdir()):
                # Opening would create an empty catalog and take every stored file for an orphan.
                raise LibraryError("catalog.sqlite is missing but data/ holds stored files; restore the "
                                   "catalog (or move data/ away) before using this folder", path=self.path)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.tmp_dir.mkdir(exist_ok=True)
            with self._connect() as conn:
                catalog.ensure_wal(conn)
                catalog.create_schema(conn)
        except catalog.CatalogVersionError as exc:
            raise LibraryError(str(exc), path=self.catalog_path) from None
        except sqlite3.DatabaseError as exc:
            raise LibraryError(f"catalog cannot be opened ({exc})", path=self.catalog_path) from None
        except OSError as exc:
            raise LibraryError(f"library folder cannot be used ({exc.strerror or exc})", path=self.path) from None
        self._recover()

    def __repr__(self) -> str:
        return f"PatientLibrary({str(self.path)!r})"

    class _Connection:
        def __init__(self, path: Path):
            self.conn = catalog.connect(path)

        def __enter__(self) -> sqlite3.Connection:
            return self.conn

        def __exit__(self, *exc):
            self.conn.close()

    def _connect(self) -> "PatientLibrary._Connection":
        return PatientLibrary._Connection(self.catalog_path)

    def _file_path(self, relpath: str) -> Path:
        return self.path / relpath

    def _recover(self) -> None:
        """Remove what dead writers left: temp files, and data files no catalog row names."""
        storage.clean_temp_dir(self.tmp_dir)
        on_disk = {p.name for p in self.data_dir.iterdir() if p.is_file()}
        if not on_disk:
            return
        with self._connect() as conn:
            known = {Path(r[0]).name for r in conn.execute("SELECT relpath FROM files")}
            if not on_disk - known:
                return
            # Re-check under the write lock: a file renamed into place by a writer that has not
            # committed yet looks like an orphan from outside its transaction.
            with catalog.write_transaction(conn):
                known = {Path(r[0]).name for r in conn.execute("SELECT relpath FROM files")}
                for name in sorted(on_disk - known):
                    (self.data_dir / name).unlink(missing_ok=True)

    def run_once(self, name: str, work) -> bool:
        """Run ``work()`` once for this library folder, whichever thread or process asks first.

        Callers queue on a lock (a lock file beside the catalog, held with ``flock`` where the
        system has it, and a lock per folder between the threads of this process). The first
        finds no marker ``<name>.done``, runs ``work`` and writes the marker when it returns; the
        others wait until then and return False without running anything. A ``work`` that raises
        writes no marker, so the next caller runs it again. Returns whether this call ran it."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", name):
            raise ValueError(f"run_once name must be lowercase letters, digits and '-', got {name!r}")
        marker = self.path / f"{name}.done"
        if marker.exists():
            return False
        with self._exclusive(name):
            if marker.exists():
                return False
            work()
            self._write_json(marker.name, {"done_at": _now()})
        return True

    @contextmanager
    def _exclusive(self, name: str):
        key = f"{self.path.resolve()}/{name}"
        with _folder_locks_guard:
            lock = _folder_locks.setdefault(key, threading.Lock())
        with lock, open(self.path / f"{name}.lock", "a") as handle:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file is closed
            yield

    def _read_json(self, file_name: str):
        try:
            return json.loads((self.path / file_name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _write_json(self, file_name: str, data) -> None:
        """Write a small JSON file beside the catalog: temp file then rename, so a crash leaves the
        old or the new file, never half of one."""
        text = json.dumps(_jsonable(data), sort_keys=True)
        temp = storage.temp_path(self.tmp_dir)
        try:
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, self.path / file_name)
        finally:
            temp.unlink(missing_ok=True)
