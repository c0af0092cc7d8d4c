"""Adding patients: files read, validated and written to temp files outside any lock, then
committed in one transaction.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from gating_core.fcs import FCSError, Sample
from gating_core.library.common import (ConflictError, LibraryError, Provenance, _as_labels, _is_utf8, _name_key,
                                        _now, _printable, normalise_name)
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
import gating_core.library.common as common

#: The role of a source that is the name a browser gave an uploaded file.
UPLOAD_ROLE = "upload"


@dataclass
class _Staged:
    """One patient read and written to temp files, waiting for the commit."""

    name: str
    sample: Sample
    labels: np.ndarray | None
    provenance: str | None
    label_source: str | None
    sources: list[tuple[str, Path]]
    events_temp: storage.TempFile | None = None
    labels_temp: storage.TempFile | None = None
    events_digest: str | None = None

    def temps(self) -> list[storage.TempFile]:
        return [t for t in (self.events_temp, self.labels_temp) if t is not None]


class ImportMixin:
    """Adding patients: files read, validated and written to temp files outside any lock, then
    committed in one transaction."""

    def add_patient(self, sample: Sample, labels=None, *, name: str | None = None,
                    provenance: str = Provenance.IMPORTED, label_source: str | None = None,
                    source_files: Iterable[tuple[str, str | os.PathLike]] = ()) -> str:
        """Store a patient held in memory (for example a file the app has read).

        Parameters
        ----------
        sample : Sample
            Events (n_events, n_channels) are stored in their dtype, with channels, keywords and
            spillover.
        labels : array of str, shape (n_events,), optional
            Expert labels; None for a new, unlabeled patient.
        name : str, optional
            Patient name; default ``sample.name``. Must not already be in the library.
        provenance : one of :class:`Provenance`
            Where ``labels`` came from.
        label_source : str, optional
            Free text kept with the provenance (a file name, a gate set's description).
        source_files : pairs (role, path)
            Original files recorded in the catalog (role: "fcs", "labels", "gated-csv", ...).
            Role ``"upload"``: the name a browser gave a file, kept as text and never opened.

        Returns the stored patient name. Raises LibraryError and changes nothing on bad input.
        """
        staged = self._prepare(sample, labels, sample.name if name is None else name, provenance if labels is not None else None,
                               label_source, [(role, p if role == UPLOAD_ROLE else Path(p)) for role, p in source_files])
        return self._commit_patients([staged], action="add patient")[0]

    def import_files(self, paths: Sequence[str | os.PathLike], *, name: str | None = None) -> list[str]:
        """Import FCS files (with ``<stem>.labels.csv`` beside them, or alone) and gated CSVs.

        All files are imported in one transaction: either every patient is added or, on any
        error, none is. A ``<stem>.labels.csv`` given beside its FCS is taken as that FCS's labels.
        ``name`` overrides the patient name and is only allowed for a single patient.

        Returns the names of the added patients. Raises LibraryError naming the file.
        """
        paths = [Path(p) for p in paths]
        if not paths:
            raise LibraryError("no files to import")
        is_labels = [p.name.casefold().endswith(".labels.csv") for p in paths]
        if name is not None and len(paths) - sum(is_labels) != 1:
            raise LibraryError("a patient name can only be given when importing one file")
        fcs_stems = {p.with_suffix("").as_posix().casefold() for p in paths if p.suffix.lower() != ".csv"}
        staged: list[_Staged] = []
        try:
            for path, labels_file in zip(paths, is_labels):
                if labels_file:
                    stem = path.name[: -len(".labels.csv")]
                    if path.with_name(stem).as_posix().casefold() in fcs_stems:
                        continue  # read together with its FCS file
                    raise LibraryError(f"is a labels file: import the FCS file beside it ({stem}.fcs)", path=path)
                items = self._read_input(path)
                if name is not None:
                    if len(items) > 1:
                        raise LibraryError("holds several data sets; import it without a name "
                                           "(they are named <stem>#1, <stem>#2, ...)", path=path)
                    items[0].name = name
                for item in items:
                    staged.append(self._prepare(item.sample, item.labels, item.name, item.provenance,
                                                item.label_source, item.sources, path=path, staged=staged))
            return self._commit_patients(staged, action="import")
        except BaseException:
            for item in staged:
                for temp in item.temps():
                    temp.path.unlink(missing_ok=True)
            raise

    def import_file(self, path: str | os.PathLike, *, name: str | None = None) -> list[str]:
        """:meth:`import_files` for one file (several patients when the FCS holds several data sets)."""
        return self.import_files([path], name=name)

    def _read_input(self, path: Path) -> list[_Staged]:
        """Read one input file into patients (not yet written anywhere)."""
        if not _is_utf8(str(path)):
            raise LibraryError("the file name is not valid UTF-8 (bytes the catalog cannot store); "
                               "rename the file", path=_printable(str(path)))
        if not path.exists():
            raise LibraryError("file not found", path=path)
        if not path.is_file():
            raise LibraryError("is not a file", path=path)
        from gating_core.io.inputs import read_input  # the one reader of input files
        from gating_core.io.labels import LabelError

        try:
            # Stored as measured; compensation is applied when training (see load_training_set).
            return [_Staged(p.name, p.sample, p.labels, p.provenance, p.label_source, p.sources)
                    for p in read_input(path, compensate=False)]
        except FCSError as exc:
            raise LibraryError(exc.problem, path=exc.path or path) from None
        except LabelError as exc:
            raise LibraryError(str(exc)) from None
        except LibraryError:
            raise
        except Exception as exc:  # a reader we do not own failed in a way it did not plan for
            raise LibraryError(f"could not be read ({type(exc).__name__}: {exc})", path=path) from None

    def _prepare(self, sample: Sample, labels, name: str, provenance: str | None, label_source: str | None,
                 sources: list[tuple[str, Path]], *, path=None, staged: Sequence[_Staged] = ()) -> _Staged:
        """Validate one patient and write its temp files (outside any lock)."""
        name = normalise_name(name)
        if provenance is not None and provenance not in Provenance.ALL:
            raise LibraryError(f"unknown label provenance {provenance!r}; one of {Provenance.ALL}", patient=name)
        events = np.asarray(sample.events)
        if events.ndim != 2 or events.shape[1] != len(sample.channels):
            raise LibraryError(f"events of shape {events.shape} do not match {len(sample.channels)} channels",
                               patient=name, path=path)
        if events.dtype.kind != "f":
            if events.dtype.kind not in "iu":
                raise LibraryError(f"events must be numbers, got dtype {events.dtype}", patient=name, path=path)
            events = events.astype(np.float64)
        if labels is not None:
            labels = _as_labels(labels, events.shape[0], patient=name, path=path)
        key = _name_key(name)
        if any(_name_key(s.name) == key for s in staged):
            raise LibraryError("appears twice among the files being imported", patient=name, path=path)
        if name in self:  # fail before writing anything; the commit checks again under the lock
            raise LibraryError("is already in the library (remove it first or choose another name)",
                               patient=name, path=path)
        item = _Staged(name, sample, labels, provenance, label_source, sources)
        item.sample = dataclasses.replace(sample, events=events)
        item.events_digest = storage.events_digest(events)
        try:
            item.events_temp = storage.write_events_temp(self.tmp_dir, events, sample.pnn)
            if labels is not None:
                item.labels_temp = storage.write_labels_temp(self.tmp_dir, labels)
        except OSError as exc:
            for temp in item.temps():
                temp.path.unlink(missing_ok=True)
            raise LibraryError(f"could not write to the library ({exc.strerror or exc})", patient=name) from None
        return item

    def _commit_patients(self, staged: list[_Staged], action: str) -> list[str]:
        common._checkpoint("staged")
        placed: list[Path] = []
        try:
            with self._connect() as conn, catalog.write_transaction(conn):
                for item in staged:
                    if conn.execute("SELECT 1 FROM patients WHERE name_key = ?",
                                    (_name_key(item.name),)).fetchone():
                        raise ConflictError("is already in the library (added meanwhile by another session)",
                                            patient=item.name)
                    placed += self._insert_patient(conn, item, action)
                storage.fsync_dir(self.data_dir)
                common._checkpoint("files-in-place")
        except BaseException as exc:
            for path in placed:  # the rows were rolled back, so these files belong to nobody
                path.unlink(missing_ok=True)
            for item in staged:
                for temp in item.temps():
                    temp.path.unlink(missing_ok=True)
            if isinstance(exc, sqlite3.DatabaseError):
                raise LibraryError(f"catalog write failed ({exc}); nothing was changed",
                                   path=self.catalog_path) from None
            raise
        return [item.name for item in staged]

    def _register_file(self, conn, patient_id: str | None, kind: str, temp: storage.TempFile, suffix: str,
                       now: str) -> tuple[str, Path]:
        """Insert a files row and rename ``temp`` to its final name (inside the caller's transaction)."""
        file_id = storage.new_id()
        relpath = f"data/{file_id}{suffix}"
        conn.execute("INSERT INTO files (id, patient_id, kind, relpath, sha256, size, n_rows, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (file_id, patient_id, kind, relpath, temp.sha256, temp.size, temp.n_rows, now))
        final = self._file_path(relpath)
        os.replace(temp.path, final)
        return file_id, final

    def _insert_patient(self, conn, item: _Staged, action: str) -> list[Path]:
        now = _now()
        sample = item.sample
        patient_id = storage.new_id()
        spillover = None if sample.spillover is None else json.dumps(np.asarray(sample.spillover).tolist())
        events_file_id = storage.new_id()
        conn.execute(
            "INSERT INTO patients (id, name, name_key, created_at, n_events, n_channels, dtype, events_file, "
            "keywords_json, spillover_json, spillover_channels_json, fcs_version, compensated, notes_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (patient_id, item.name, _name_key(item.name), now, sample.n_events, len(sample.channels),
             str(sample.events.dtype), events_file_id, json.dumps(dict(sample.keywords)), spillover,
             json.dumps(list(sample.spillover_channels)), sample.version, int(bool(sample.compensated)),
             json.dumps([str(n) for n in getattr(sample, "notes", [])])))
        conn.executemany(
            "INSERT INTO channels (patient_id, position, pnn, pns, range) VALUES (?, ?, ?, ?, ?)",
            [(patient_id, i, c.pnn, c.pns or "", c.range) for i, c in enumerate(sample.channels)])
        for role, path in item.sources:
            if role == UPLOAD_ROLE:
                # A name the user's browser gave: recorded as text, never looked up on this disk.
                conn.execute("INSERT INTO sources (patient_id, role, path) VALUES (?, ?, ?)",
                             (patient_id, role, str(path)))
                continue
            size, digest = None, None
            try:
                size, digest = path.stat().st_size, storage.sha256_of(path)
            except OSError:
                pass
            conn.execute("INSERT INTO sources (patient_id, role, path, size, sha256) VALUES (?, ?, ?, ?, ?)",
                         (patient_id, role, str(path.resolve()) if path.exists() else str(path), size, digest))
        placed = []
        conn.execute("INSERT INTO files (id, patient_id, kind, relpath, sha256, size, n_rows, created_at) "
                     "VALUES (?, ?, 'events', ?, ?, ?, ?, ?)",
                     (events_file_id, patient_id, f"data/{events_file_id}.parquet", item.events_temp.sha256,
                      item.events_temp.size, item.events_temp.n_rows, now))
        conn.execute("INSERT INTO events_digests (file_id, digest) VALUES (?, ?)",
                     (events_file_id, item.events_digest))
        final = self._file_path(f"data/{events_file_id}.parquet")
        os.replace(item.events_temp.path, final)
        placed.append(final)
        details = {"n_events": sample.n_events, "n_channels": len(sample.channels),
                   "sources": [p if role == UPLOAD_ROLE else p.name for role, p in item.sources]}
        if item.labels is not None:
            _, labels_final = self._insert_labeling(conn, patient_id, item.labels, item.labels_temp,
                                                    item.provenance, item.label_source, None, None, now)
            placed.append(labels_final)
            details["labels"] = item.provenance
        self._audit(conn, action, patient_id, item.name, None, details, now)
        return placed
