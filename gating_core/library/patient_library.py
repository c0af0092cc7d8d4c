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
"""

from __future__ import annotations

import getpass
import json
import math
import os
import sqlite3
import unicodedata
import dataclasses
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from gating_core.errors import GatingCoreError
from gating_core.fcs import Channel, FCSError, Sample
import gating_core.library.catalog as catalog  # siblings by their full names: no import through the package
import gating_core.library.storage as storage

LIBRARY_ENV = "GATING_LIBRARY"
DEFAULT_LIBRARY = "workspace"
CATALOG_NAME = "catalog.sqlite"
MAX_NAME_LENGTH = 200


class Provenance:
    """Where a patient's labels came from (stored verbatim in the catalog)."""

    IMPORTED = "imported labels"
    GATED_CSV = "imported gated CSV"
    FLOWJO = "FlowJo workspace gates"
    GATINGML = "GatingML gates"
    DRAWN = "gates drawn in the app"
    AUTO_ACCEPTED = "auto-gate accepted after review"

    ALL = (IMPORTED, GATED_CSV, FLOWJO, GATINGML, DRAWN, AUTO_ACCEPTED)


class LibraryError(GatingCoreError):
    """A library operation was refused or failed; nothing was changed.

    ``str(err)`` names the file (``.path``) and/or the patient (``.patient``) and the problem.
    """

    def __init__(self, problem: str, *, path=None, patient: str | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.patient = patient
        prefix = ""
        if self.path is not None:
            prefix += f"{Path(self.path).name}: "
        if patient is not None:
            prefix += f"patient {patient!r}: "
        super().__init__(prefix + problem)


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


@dataclass(frozen=True)
class PatientInfo:
    """What the catalog knows about one patient (no events loaded)."""

    name: str
    id: str
    created_at: str
    n_events: int
    n_channels: int
    channels: list[str]
    markers: list[str]
    dtype: str
    compensated: bool
    has_spillover: bool
    labeled: bool
    label_provenance: str | None
    label_model_id: str | None
    populations: dict[str, int]
    sources: list[dict]
    has_gates: bool
    gate_result: dict | None  # latest auto-gate result: id, model_id, status, created_at

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    """A stored model: its file, what it was trained on and how it scored."""

    id: str
    name: str
    version: int
    method: str | None
    created_at: str
    training_patients: list[str]
    evaluation: dict
    sha256: str
    size: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GateResultRecord:
    """One stored auto-gate result of a patient.

    populations : ndarray of str, shape (n_events,)
    confidence : ndarray of float32, shape (n_events,), in [0, 1]
    """

    id: int
    patient: str
    model_id: str
    created_at: str
    status: str  # "pending" or "accepted"
    counts: dict[str, int]
    details: dict
    populations: np.ndarray = field(repr=False)
    confidence: np.ndarray = field(repr=False)


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

    def temps(self) -> list[storage.TempFile]:
        return [t for t in (self.events_temp, self.labels_temp) if t is not None]


class PatientLibrary:
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

    # ------------------------------------------------------------------ connections

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

    # ------------------------------------------------------------------ recovery

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

    # ------------------------------------------------------------------ lookups

    def _patient_row(self, conn: sqlite3.Connection, name: str) -> sqlite3.Row:
        if not isinstance(name, str):
            raise LibraryError(f"patient name must be text, got {type(name).__name__}")
        row = conn.execute("SELECT * FROM patients WHERE name_key = ?", (_name_key(name),)).fetchone()
        if row is None:
            raise LibraryError("not in the library", patient=name)
        return row

    def __contains__(self, name: str) -> bool:
        with self._connect() as conn:
            return conn.execute("SELECT 1 FROM patients WHERE name_key = ?",
                                (_name_key(str(name)),)).fetchone() is not None

    def __len__(self) -> int:
        with self._connect() as conn:
            return conn.execute("SELECT COUNT(*) FROM patients").fetchone()[0]

    def patient_names(self) -> list[str]:
        """Names of all patients, in the order they were added."""
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM patients ORDER BY created_at, name")]

    def _info(self, conn: sqlite3.Connection, row: sqlite3.Row) -> PatientInfo:
        channels = conn.execute("SELECT pnn, pns FROM channels WHERE patient_id = ? ORDER BY position",
                                (row["id"],)).fetchall()
        labeling = None
        populations: dict[str, int] = {}
        if row["current_labeling"] is not None:
            labeling = conn.execute("SELECT * FROM labelings WHERE id = ?", (row["current_labeling"],)).fetchone()
            populations = {r["name"]: r["count"] for r in conn.execute(
                "SELECT name, count FROM populations WHERE labeling_id = ? ORDER BY name", (labeling["id"],))}
        sources = [{"role": r["role"], "path": r["path"], "sha256": r["sha256"]} for r in conn.execute(
            "SELECT role, path, sha256 FROM sources WHERE patient_id = ? ORDER BY id", (row["id"],))]
        has_gates = conn.execute("SELECT 1 FROM gate_sets WHERE patient_id = ? LIMIT 1",
                                 (row["id"],)).fetchone() is not None
        result = conn.execute("SELECT id, model_id, status, created_at FROM gate_results WHERE patient_id = ? "
                              "ORDER BY id DESC LIMIT 1", (row["id"],)).fetchone()
        return PatientInfo(
            name=row["name"], id=row["id"], created_at=row["created_at"], n_events=row["n_events"],
            n_channels=row["n_channels"], channels=[c["pnn"] for c in channels],
            markers=[c["pns"] for c in channels], dtype=row["dtype"], compensated=bool(row["compensated"]),
            has_spillover=row["spillover_json"] is not None, labeled=labeling is not None,
            label_provenance=labeling["provenance"] if labeling else None,
            label_model_id=labeling["model_id"] if labeling else None, populations=populations,
            sources=sources, has_gates=has_gates, gate_result=dict(result) if result else None)

    def patients(self) -> list[PatientInfo]:
        """Every patient, in the order they were added."""
        with self._connect() as conn, catalog.read_transaction(conn):
            rows = conn.execute("SELECT * FROM patients ORDER BY created_at, name").fetchall()
            return [self._info(conn, row) for row in rows]

    def patient(self, name: str) -> PatientInfo:
        with self._connect() as conn, catalog.read_transaction(conn):
            return self._info(conn, self._patient_row(conn, name))

    def labeled_patient_names(self) -> list[str]:
        with self._connect() as conn:
            return [r[0] for r in conn.execute(
                "SELECT name FROM patients WHERE current_labeling IS NOT NULL ORDER BY created_at, name")]

    # ------------------------------------------------------------------ adding patients

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

        Returns the stored patient name. Raises LibraryError and changes nothing on bad input.
        """
        staged = self._prepare(sample, labels, sample.name if name is None else name, provenance if labels is not None else None,
                               label_source, [(role, Path(p)) for role, p in source_files])
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
        from gating_core.labels import LabelError

        try:
            if path.suffix.lower() == ".csv":
                from gating_core.export import read_gated_csv

                sample, populations, _confidence = read_gated_csv(path)
                stem = path.name[: -len(".csv")]
                if stem.casefold().endswith(".gated"):
                    stem = stem[: -len(".gated")]
                return [_Staged(stem, sample, populations, Provenance.GATED_CSV, path.name,
                                [("gated-csv", path)])]
            labels_path = path.with_name(path.stem + ".labels.csv")
            if labels_path.exists():
                from gating_core.labels import load_labeled_input

                # Stored as measured; compensation is applied when training (see load_training_set).
                sample, labels = load_labeled_input(path, compensate=False)
                return [_Staged(path.stem, sample, labels, Provenance.IMPORTED, labels_path.name,
                                [("fcs", path), ("labels", labels_path)])]
            from gating_core.fcs import read_fcs_all

            samples = read_fcs_all(path, compensate=False)
            return [_Staged(s.name if len(samples) > 1 else path.stem, s, None, None, None, [("fcs", path)])
                    for s in samples]
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
        _checkpoint("staged")
        placed: list[Path] = []
        try:
            with self._connect() as conn, catalog.write_transaction(conn):
                for item in staged:
                    if conn.execute("SELECT 1 FROM patients WHERE name_key = ?",
                                    (_name_key(item.name),)).fetchone():
                        raise LibraryError("is already in the library (added meanwhile by another session)",
                                           patient=item.name)
                    placed += self._insert_patient(conn, item, action)
                storage.fsync_dir(self.data_dir)
                _checkpoint("files-in-place")
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

    def _insert_labeling(self, conn, patient_id: str, labels: np.ndarray, temp: storage.TempFile, provenance: str,
                         source: str | None, model_id: str | None, gate_result_id: int | None,
                         now: str) -> tuple[int, Path]:
        file_id, final = self._register_file(conn, patient_id, "labels", temp, ".parquet", now)
        cursor = conn.execute(
            "INSERT INTO labelings (patient_id, provenance, source, model_id, gate_result_id, labels_file, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (patient_id, provenance, source, model_id, gate_result_id, file_id, now))
        labeling_id = cursor.lastrowid
        conn.executemany("INSERT INTO populations (labeling_id, name, count) VALUES (?, ?, ?)",
                         [(labeling_id, n, c) for n, c in _population_counts(labels).items()])
        conn.execute("UPDATE patients SET current_labeling = ? WHERE id = ?", (labeling_id, patient_id))
        return labeling_id, final

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
        final = self._file_path(f"data/{events_file_id}.parquet")
        os.replace(item.events_temp.path, final)
        placed.append(final)
        details = {"n_events": sample.n_events, "n_channels": len(sample.channels),
                   "sources": [p.name for _, p in item.sources]}
        if item.labels is not None:
            _, labels_final = self._insert_labeling(conn, patient_id, item.labels, item.labels_temp,
                                                    item.provenance, item.label_source, None, None, now)
            placed.append(labels_final)
            details["labels"] = item.provenance
        self._audit(conn, action, patient_id, item.name, None, details, now)
        return placed

    # ------------------------------------------------------------------ reading patients

    def load_sample(self, name: str, *, compensate: bool = False) -> Sample:
        """The patient's events as imported: a Sample named by the patient name.

        ``compensate=True`` applies the stored spillover matrix (a no-op without one or when the
        events were stored compensated).
        """
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            channels = [Channel(r["pnn"], r["pns"], r["range"]) for r in conn.execute(
                "SELECT pnn, pns, range FROM channels WHERE patient_id = ? ORDER BY position", (row["id"],))]
            relpath = conn.execute("SELECT relpath FROM files WHERE id = ?", (row["events_file"],)).fetchone()[0]
        events = self._read_file(relpath, row["name"], lambda p: storage.read_events(p, row["n_channels"]))
        if events.shape[0] != row["n_events"]:
            raise LibraryError(f"events file holds {events.shape[0]} events, the catalog says {row['n_events']}",
                               patient=row["name"], path=relpath)
        spillover = None if row["spillover_json"] is None else np.asarray(json.loads(row["spillover_json"]))
        sample = Sample(row["name"], events, channels, json.loads(row["keywords_json"]), spillover,
                        json.loads(row["spillover_channels_json"]), row["fcs_version"] or "3.1", None,
                        bool(row["compensated"]), notes=json.loads(row["notes_json"]))
        if not compensate:
            return sample
        try:
            return sample.compensate()
        except FCSError as exc:
            raise LibraryError(f"cannot be compensated: {exc.problem}", patient=row["name"]) from None

    def _read_file(self, relpath: str, patient: str, reader):
        path = self._file_path(relpath)
        try:
            return reader(path)
        except FileNotFoundError:
            raise LibraryError("data file is missing (removed by another session?)",
                               patient=patient, path=path) from None
        except Exception as exc:
            raise LibraryError(f"data file cannot be read ({exc})", patient=patient, path=path) from None

    def _labels_of(self, conn, labeling_id: int) -> str:
        return conn.execute("SELECT f.relpath FROM labelings l JOIN files f ON f.id = l.labels_file "
                            "WHERE l.id = ?", (labeling_id,)).fetchone()[0]

    def load_labels(self, name: str) -> np.ndarray | None:
        """The patient's current labels, str ndarray of shape (n_events,), or None if unlabeled."""
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            if row["current_labeling"] is None:
                return None
            relpath = self._labels_of(conn, row["current_labeling"])
        return self._read_file(relpath, row["name"], lambda p: storage.read_labels(p)[0])

    def label_history(self, name: str) -> list[dict]:
        """Every labeling of the patient, oldest first: id, provenance, source, model_id, created_at,
        populations, current."""
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            history = []
            for lab in conn.execute("SELECT * FROM labelings WHERE patient_id = ? ORDER BY id", (row["id"],)):
                populations = {r["name"]: r["count"] for r in conn.execute(
                    "SELECT name, count FROM populations WHERE labeling_id = ? ORDER BY name", (lab["id"],))}
                history.append({"id": lab["id"], "provenance": lab["provenance"], "source": lab["source"],
                                "model_id": lab["model_id"], "gate_result_id": lab["gate_result_id"],
                                "created_at": lab["created_at"], "populations": populations,
                                "current": lab["id"] == row["current_labeling"]})
            return history

    def labeled_patients(self, *, compensate: bool = True) -> list[tuple[Sample, np.ndarray]]:
        """(Sample, labels) of every labeled patient, compensated like ``load_labeled_input``."""
        samples, labels = self.load_training_set(compensate=compensate)
        return list(zip(samples, labels))

    def load_training_set(self, names: Sequence[str] | None = None, *,
                          compensate: bool = True) -> tuple[list[Sample], list[np.ndarray]]:
        """Samples and labels for training: all labeled patients, or the named ones (which must
        be labeled). Events are compensated by default, as the ``train`` command reads files."""
        if names is None:
            names = self.labeled_patient_names()
        samples, labels = [], []
        for name in names:
            y = self.load_labels(name)
            if y is None:
                raise LibraryError("has no labels; label it (import, gates or an accepted auto-gate) "
                                   "before training on it", patient=name)
            samples.append(self.load_sample(name, compensate=compensate))
            labels.append(y)
        return samples, labels

    # ------------------------------------------------------------------ changing labels

    def set_labels(self, name: str, labels, provenance: str, *, source: str | None = None,
                   model_id: str | None = None) -> int:
        """Make ``labels`` (str, shape (n_events,)) the patient's current labels; the earlier ones
        stay in :meth:`label_history`. Returns the labeling id."""
        return self._set_labels(name, labels, provenance, source=source, model_id=model_id)

    def _set_labels(self, name, labels, provenance, *, source=None, model_id=None, gate_result_id=None) -> int:
        if provenance not in Provenance.ALL:
            raise LibraryError(f"unknown label provenance {provenance!r}; one of {Provenance.ALL}", patient=name)
        info = self.patient(name)
        labels = _as_labels(labels, info.n_events, patient=info.name)
        temp = storage.write_labels_temp(self.tmp_dir, labels)
        placed = None
        try:
            with self._connect() as conn, catalog.write_transaction(conn):
                row = self._patient_row(conn, name)
                if row["id"] != info.id:
                    raise LibraryError("was replaced by another session meanwhile", patient=name)
                if gate_result_id is not None:
                    conn.execute("UPDATE gate_results SET status = 'accepted' WHERE id = ?", (gate_result_id,))
                now = _now()
                labeling_id, placed = self._insert_labeling(conn, row["id"], labels, temp, provenance, source,
                                                            model_id, gate_result_id, now)
                action = "accept auto-gate" if provenance == Provenance.AUTO_ACCEPTED else "set labels"
                self._audit(conn, action, row["id"], row["name"], model_id,
                            {"provenance": provenance, "source": source, "labeling_id": labeling_id,
                             "populations": _population_counts(labels)}, now)
                _checkpoint("files-in-place")
        except BaseException:
            temp.path.unlink(missing_ok=True)
            if placed is not None:
                placed.unlink(missing_ok=True)
            raise
        return labeling_id

    def restore_labels(self, name: str, labeling_id: int) -> int:
        """Make an earlier labeling (an id from :meth:`label_history`) the patient's current labels
        again: the undo of a replacement. Nothing is deleted, so a restore can itself be undone by
        restoring the labeling it replaced. Returns ``labeling_id``."""
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            found = conn.execute("SELECT id, provenance FROM labelings WHERE id = ? AND patient_id = ?",
                                 (int(labeling_id), row["id"])).fetchone()
            if found is None:
                raise LibraryError(f"has no label version {labeling_id}", patient=row["name"])
            conn.execute("UPDATE patients SET current_labeling = ? WHERE id = ?", (found["id"], row["id"]))
            self._audit(conn, "restore labels", row["id"], row["name"], None,
                        {"labeling_id": found["id"], "replaced_labeling_id": row["current_labeling"],
                         "provenance": found["provenance"]}, _now())
        return int(found["id"])

    # ------------------------------------------------------------------ panel display transforms

    DISPLAY_TRANSFORMS_FILE = "display_transforms.json"
    CHECK_RESULT_FILE = "check_result.json"

    def save_check_result(self, result: dict) -> None:
        """Keep the latest held-out check (JSON-able: patients, table records); replaces the previous."""
        self._write_json(self.CHECK_RESULT_FILE, {**_jsonable(result), "saved_at": _now()})

    def load_check_result(self) -> dict | None:
        """The latest held-out check saved by :meth:`save_check_result`, or None."""
        data = self._read_json(self.CHECK_RESULT_FILE)
        return data if isinstance(data, dict) and isinstance(data.get("table"), list) else None

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

    def load_display_transforms(self) -> dict:
        """The panel's display and gating transform per channel ($PnN -> AxisScale dict), as
        saved by :meth:`save_display_transforms`; empty when none was saved or the file is unreadable."""
        data = self._read_json(self.DISPLAY_TRANSFORMS_FILE)
        if not isinstance(data, dict):
            return {}
        return {str(k): dict(v) for k, v in data.items() if isinstance(v, dict)}

    def save_display_transforms(self, transforms: dict) -> None:
        """Store the per-channel display transforms ($PnN -> AxisScale dict)."""
        self._write_json(self.DISPLAY_TRANSFORMS_FILE, {str(k): dict(v) for k, v in transforms.items()})

    def rename_channels(self, name: str, mapping: dict[str, str]) -> list[str]:
        """Rename channels ($PnN old -> new) in one transaction; events, labels, gates and
        results are untouched (events are stored by position). Returns the new $PnN list."""
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            old = [r[0] for r in conn.execute("SELECT pnn FROM channels WHERE patient_id = ? ORDER BY position",
                                              (row["id"],))]
            unknown = sorted(set(mapping) - set(old))
            if unknown:
                raise LibraryError(f"has no channel named {', '.join(map(repr, unknown))}", patient=row["name"])
            new = [mapping.get(c, c) for c in old]
            if any(not isinstance(c, str) or not c.strip() for c in new):
                raise LibraryError("channel names must be non-empty text", patient=row["name"])
            if len(set(new)) != len(new):
                dupes = sorted({c for c in new if new.count(c) > 1})
                raise LibraryError(f"renaming would give two channels named {', '.join(dupes)}", patient=row["name"])
            conn.executemany("UPDATE channels SET pnn = ? WHERE patient_id = ? AND position = ?",
                             [(c, row["id"], i) for i, c in enumerate(new)])
            spill = [mapping.get(c, c) for c in json.loads(row["spillover_channels_json"])]
            conn.execute("UPDATE patients SET spillover_channels_json = ? WHERE id = ?", (json.dumps(spill), row["id"]))
            changed = {k: v for k, v in mapping.items() if k != v}
            self._audit(conn, "rename channels", row["id"], row["name"], None, {"renamed": changed}, _now())
            return new

    # ------------------------------------------------------------------ gates drawn in the app

    def save_gates(self, name: str, gates_json) -> int:
        """Store the patient's gate tree: JSON text, or a JSON-serialisable object. Earlier versions
        are kept. Returns the gate set id."""
        if isinstance(gates_json, (str, bytes)):
            text = gates_json.decode() if isinstance(gates_json, bytes) else gates_json
            try:
                json.loads(text)
            except ValueError as exc:
                raise LibraryError(f"gates are not valid JSON ({exc})", patient=name) from None
        else:
            try:
                text = json.dumps(_jsonable(gates_json))
            except TypeError as exc:
                raise LibraryError(f"gates cannot be stored as JSON ({exc})", patient=name) from None
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            now = _now()
            cursor = conn.execute("INSERT INTO gate_sets (patient_id, gates_json, created_at) VALUES (?, ?, ?)",
                                  (row["id"], text, now))
            self._audit(conn, "save gates", row["id"], row["name"], None, {"gate_set_id": cursor.lastrowid}, now)
            return cursor.lastrowid

    def load_gates(self, name: str, *, as_text: bool = False):
        """The patient's latest gate tree, decoded from JSON (or the JSON text), or None."""
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            found = conn.execute("SELECT gates_json FROM gate_sets WHERE patient_id = ? ORDER BY id DESC LIMIT 1",
                                 (row["id"],)).fetchone()
        if found is None:
            return None
        return found[0] if as_text else json.loads(found[0])

    # ------------------------------------------------------------------ models

    def add_model(self, model_file_path: str | os.PathLike, name: str, training_patients: Iterable = (),
                  evaluation: dict | None = None, method: str | None = None) -> str:
        """Store a model file (the .npz written by ``GatingModel.save``) and what it was trained on.

        ``training_patients`` are patient names (or Samples); ``evaluation`` is a JSON-able dict
        of figures (a DataFrame is stored as records). Models with the same name get increasing
        versions. Returns the new model id.
        """
        source = Path(model_file_path)
        name = normalise_name(name, "model")
        if not source.is_file():
            raise LibraryError("model file not found", path=source)
        self._check_npz(source)
        patients = [getattr(p, "name", p) for p in training_patients]
        try:
            evaluation_json = json.dumps(_jsonable(dict(evaluation or {})))
        except (TypeError, ValueError) as exc:
            raise LibraryError(f"evaluation cannot be stored as JSON ({exc})", path=source) from None
        try:
            temp = storage.copy_temp(self.tmp_dir, source)
        except OSError as exc:
            raise LibraryError(f"model file cannot be copied ({exc.strerror or exc})", path=source) from None
        placed = None
        try:
            with self._connect() as conn, catalog.write_transaction(conn):
                now = _now()
                model_id = storage.new_id()[:12]
                version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM models WHERE name = ?",
                                       (name,)).fetchone()[0]
                conn.execute("INSERT INTO models (id, name, version, method, file_id, evaluation_json, created_at) "
                             "VALUES (?, ?, ?, ?, '', ?, ?)", (model_id, name, version, method, evaluation_json, now))
                file_id, placed = self._register_file(conn, None, "model", temp, ".npz", now)
                conn.execute("UPDATE models SET file_id = ? WHERE id = ?", (file_id, model_id))
                for position, patient in enumerate(patients):
                    found = conn.execute("SELECT id, name FROM patients WHERE name_key = ?",
                                         (_name_key(str(patient)),)).fetchone()
                    conn.execute("INSERT INTO model_training_patients (model_id, position, patient_name, patient_id) "
                                 "VALUES (?, ?, ?, ?)", (model_id, position, str(patient), found["id"] if found else None))
                self._audit(conn, "add model", None, None, model_id,
                            {"name": name, "version": version, "method": method, "training_patients": patients}, now)
                _checkpoint("files-in-place")
        except BaseException:
            temp.path.unlink(missing_ok=True)
            if placed is not None:
                placed.unlink(missing_ok=True)
            raise
        return model_id

    @staticmethod
    def _check_npz(path: Path) -> None:
        """Refuse anything but a pickle-free .npz, without importing the model code."""
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = list(archive.files)
                for key in names:
                    archive[key]  # object arrays raise here instead of unpickling
        except Exception as exc:
            raise LibraryError(f"not a model file (.npz of plain arrays): {exc}", path=path) from None
        if not names:
            raise LibraryError("not a model file: the archive is empty", path=path)

    def _model_info(self, conn, row) -> ModelInfo:
        training = [r[0] for r in conn.execute(
            "SELECT patient_name FROM model_training_patients WHERE model_id = ? ORDER BY position", (row["id"],))]
        file_row = conn.execute("SELECT sha256, size FROM files WHERE id = ?", (row["file_id"],)).fetchone()
        return ModelInfo(row["id"], row["name"], row["version"], row["method"], row["created_at"], training,
                         json.loads(row["evaluation_json"]), file_row["sha256"], file_row["size"])

    def models(self) -> list[ModelInfo]:
        """Every stored model, oldest first."""
        with self._connect() as conn, catalog.read_transaction(conn):
            return [self._model_info(conn, r) for r in conn.execute("SELECT * FROM models ORDER BY created_at")]

    def model(self, model_id: str) -> ModelInfo:
        with self._connect() as conn, catalog.read_transaction(conn):
            row = conn.execute("SELECT * FROM models WHERE id = ?", (model_id,)).fetchone()
            if row is None:
                raise LibraryError(f"no model with id {model_id!r} in the library")
            return self._model_info(conn, row)

    def model_path(self, model_id: str) -> Path:
        """Path of the stored model file; open it with ``GatingModel.load``. Do not modify it."""
        with self._connect() as conn:
            row = conn.execute("SELECT f.relpath FROM models m JOIN files f ON f.id = m.file_id WHERE m.id = ?",
                               (model_id,)).fetchone()
        if row is None:
            raise LibraryError(f"no model with id {model_id!r} in the library")
        path = self._file_path(row[0])
        if not path.is_file():
            raise LibraryError(f"file of model {model_id!r} is missing", path=path)
        return path

    def remove_model(self, model_id: str) -> None:
        """Remove a model; labels accepted from its results keep its id as provenance."""
        with self._connect() as conn, catalog.write_transaction(conn):
            row = conn.execute("SELECT m.name, m.version, f.id AS file_id, f.relpath FROM models m "
                               "JOIN files f ON f.id = m.file_id WHERE m.id = ?", (model_id,)).fetchone()
            if row is None:
                raise LibraryError(f"no model with id {model_id!r} in the library")
            conn.execute("DELETE FROM models WHERE id = ?", (model_id,))
            conn.execute("DELETE FROM files WHERE id = ?", (row["file_id"],))
            self._audit(conn, "remove model", None, None, model_id, {"name": row["name"], "version": row["version"]},
                        _now())
        _checkpoint("committed-before-unlink")
        self._file_path(row["relpath"]).unlink(missing_ok=True)

    # ------------------------------------------------------------------ auto-gate results

    def save_gate_result(self, name: str, model_id: str, populations, confidence, details: dict | None = None) -> int:
        """Store an auto-gate result (populations str (n_events,), confidence in [0, 1]) made by a
        stored model. ``details`` (JSON-able: novelty, counts...) is kept beside. Returns its id."""
        info = self.patient(name)
        populations = _as_labels(populations, info.n_events, patient=info.name)
        confidence = np.asarray(confidence, dtype=np.float64)
        if confidence.shape != (info.n_events,):
            raise LibraryError(f"confidence of shape {confidence.shape} for {info.n_events} events",
                               patient=info.name)
        if not np.all((confidence >= 0) & (confidence <= 1)):
            raise LibraryError("confidence values must lie in [0, 1]", patient=info.name)
        try:
            details_json = json.dumps(_jsonable(dict(details or {})))
        except (TypeError, ValueError) as exc:
            raise LibraryError(f"details cannot be stored as JSON ({exc})", patient=info.name) from None
        temp = storage.write_labels_temp(self.tmp_dir, populations, confidence)
        placed = None
        try:
            with self._connect() as conn, catalog.write_transaction(conn):
                row = self._patient_row(conn, name)
                if conn.execute("SELECT 1 FROM models WHERE id = ?", (model_id,)).fetchone() is None:
                    raise LibraryError(f"model {model_id!r} is not in the library; add it with add_model first",
                                       patient=row["name"])
                now = _now()
                file_id, placed = self._register_file(conn, row["id"], "gate-result", temp, ".parquet", now)
                counts = _population_counts(populations)
                cursor = conn.execute(
                    "INSERT INTO gate_results (patient_id, model_id, file_id, counts_json, details_json, status, "
                    "created_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                    (row["id"], model_id, file_id, json.dumps(counts), details_json, now))
                self._audit(conn, "auto-gate", row["id"], row["name"], model_id,
                            {"gate_result_id": cursor.lastrowid, "populations": counts}, now)
                _checkpoint("files-in-place")
                return cursor.lastrowid
        except BaseException:
            temp.path.unlink(missing_ok=True)
            if placed is not None:
                placed.unlink(missing_ok=True)
            raise

    def load_gate_result(self, name: str) -> GateResultRecord | None:
        """The patient's latest auto-gate result, or None."""
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            result = conn.execute("SELECT g.*, f.relpath FROM gate_results g JOIN files f ON f.id = g.file_id "
                                  "WHERE g.patient_id = ? ORDER BY g.id DESC LIMIT 1", (row["id"],)).fetchone()
        if result is None:
            return None
        populations, confidence = self._read_file(result["relpath"], row["name"], storage.read_labels)
        return GateResultRecord(result["id"], row["name"], result["model_id"], result["created_at"], result["status"],
                                json.loads(result["counts_json"]), json.loads(result["details_json"]),
                                populations, confidence)

    def accept_gate_result(self, name: str, populations=None) -> int:
        """Make the latest auto-gate result (or the reviewer's corrected ``populations``) the
        patient's labels, with provenance "auto-gate accepted after review" and the model's id.
        Returns the labeling id."""
        result = self.load_gate_result(name)
        if result is None:
            raise LibraryError("has no auto-gate result to accept", patient=name)
        labels = result.populations if populations is None else populations
        edited = populations is not None and not np.array_equal(np.asarray(populations, dtype=str),
                                                                 result.populations)
        return self._set_labels(name, labels, Provenance.AUTO_ACCEPTED,
                                source=f"gate result {result.id}" + (" (edited in review)" if edited else ""),
                                model_id=result.model_id, gate_result_id=result.id)

    # ------------------------------------------------------------------ removal

    def remove_patient(self, name: str) -> None:
        """Remove a patient with its labels, gates and results (its audit entries stay)."""
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            relpaths = [r[0] for r in conn.execute("SELECT relpath FROM files WHERE patient_id = ?", (row["id"],))]
            conn.execute("DELETE FROM patients WHERE id = ?", (row["id"],))
            self._audit(conn, "remove", row["id"], row["name"], None, {"files": len(relpaths)}, _now())
        # Files go after the commit: a crash here leaves unreferenced files, removed at next open.
        _checkpoint("committed-before-unlink")
        for relpath in relpaths:
            self._file_path(relpath).unlink(missing_ok=True)

    # ------------------------------------------------------------------ export

    def export_patient(self, name: str, out: str | os.PathLike, *, include_identifying: bool = False) -> Path:
        """Write the patient as a gated CSV (default) or, when ``out`` ends in ``.fcs``, as FCS.

        Labels are the current labels (confidence 1) or, for an unlabeled patient, the latest
        auto-gate result. FCS export of an unlabeled patient without a result writes the events
        alone. Written by :func:`gating_core.export.export_sample`: identifying keywords (see
        :mod:`gating_core.library.privacy`) are left out unless ``include_identifying``, and the
        exported FCS reads back with exactly the stored events.
        """
        out = Path(out)
        sample = self.load_sample(name)
        populations = self.load_labels(name)
        confidence = None
        if populations is None:
            result = self.load_gate_result(name)
            if result is not None:
                populations, confidence = result.populations, result.confidence
        else:
            confidence = np.ones(sample.n_events, dtype=np.float32)
        is_fcs = out.suffix.lower() == ".fcs"
        if not is_fcs and populations is None:
            raise LibraryError("has no labels and no auto-gate result; export it as .fcs, or label "
                               "or auto-gate it first", patient=sample.name)
        from gating_core.export import export_sample

        try:
            export_sample(out, sample, populations, confidence, format="fcs" if is_fcs else "csv",
                          include_identifying=include_identifying)
        except FCSError as exc:
            raise LibraryError(exc.problem, path=out, patient=sample.name) from None
        except OSError as exc:
            raise LibraryError(f"cannot be written ({exc.strerror or exc})", path=out) from None
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            self._audit(conn, "export", row["id"], row["name"], None,
                        {"file": out.name, "format": "fcs" if is_fcs else "gated-csv",
                         "include_identifying": bool(include_identifying)}, _now())
        return out

    # ------------------------------------------------------------------ audit and checks

    def _audit(self, conn, action: str, patient_id, patient_name, model_id, details: dict, now: str) -> None:
        conn.execute("INSERT INTO audit (at, action, patient_id, patient_name, model_id, actor, details_json) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (now, action, patient_id, patient_name, model_id, _actor(), json.dumps(_jsonable(details))))

    def audit_log(self, patient: str | None = None, *, limit: int | None = None) -> list[dict]:
        """Audit entries, oldest first: at, action, patient, model_id, actor, details.
        ``patient`` filters by name (entries of removed patients with that name included)."""
        query = "SELECT * FROM audit"
        params: list = []
        if patient is not None:
            query += " WHERE patient_name = ? COLLATE NOCASE"
            params.append(unicodedata.normalize("NFC", patient).strip())
        query += " ORDER BY id"
        with self._connect() as conn:
            rows = conn.execute(query, params).fetchall()
        entries = [{"at": r["at"], "action": r["action"], "patient": r["patient_name"], "model_id": r["model_id"],
                    "actor": r["actor"], "details": json.loads(r["details_json"])} for r in rows]
        return entries[-limit:] if limit else entries

    def check(self, *, verify_hashes: bool = True) -> list[str]:
        """Consistency of catalog and files; returns the problems found (empty when sound)."""
        problems = []
        with self._connect() as conn, catalog.read_transaction(conn):
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            if integrity != "ok":
                problems.append(f"catalog integrity: {integrity}")
            fk = conn.execute("PRAGMA foreign_key_check").fetchall()
            if fk:
                problems.append(f"catalog has {len(fk)} rows pointing at missing rows")
            files = {r["id"]: r for r in conn.execute("SELECT * FROM files")}
            for r in conn.execute("SELECT name, events_file FROM patients"):
                if r["events_file"] not in files:
                    problems.append(f"patient {r['name']!r}: events file row missing")
            for r in conn.execute("SELECT id, labels_file FROM labelings"):
                if r["labels_file"] not in files:
                    problems.append(f"labeling {r['id']}: labels file row missing")
            for r in conn.execute("SELECT id, file_id FROM models"):
                if r["file_id"] not in files:
                    problems.append(f"model {r['id']}: file row missing")
        for row in files.values():
            path = self._file_path(row["relpath"])
            if not path.is_file():
                problems.append(f"{row['relpath']}: missing")
            elif path.stat().st_size != row["size"]:
                problems.append(f"{row['relpath']}: size {path.stat().st_size}, catalog says {row['size']}")
            elif verify_hashes and storage.sha256_of(path) != row["sha256"]:
                problems.append(f"{row['relpath']}: content differs from the catalog's checksum")
        known = {Path(r["relpath"]).name for r in files.values()}
        for path in self.data_dir.iterdir():
            if path.name not in known:
                problems.append(f"data/{path.name}: not in the catalog")
        return problems
