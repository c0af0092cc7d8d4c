"""The patients: lookups, their events, channel renames, removal, export.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel, FCSError, Sample
from gating_core.library.common import LibraryError, _name_key, _now
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
import gating_core.library.common as common


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
    gate_result: dict | None  # latest auto-gate result: id, model_id, status, created_at, novelty (dict or None)

    def to_dict(self) -> dict:
        return asdict(self)


class PatientsMixin:
    """The patients: lookups, their events, channel renames, removal, export."""

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
        result = conn.execute("SELECT id, model_id, status, created_at, details_json FROM gate_results "
                              "WHERE patient_id = ? ORDER BY id DESC LIMIT 1", (row["id"],)).fetchone()
        if result is not None:
            result = {key: result[key] for key in ("id", "model_id", "status", "created_at")} | {
                "novelty": _stored_novelty(result["details_json"])}
        return PatientInfo(
            name=row["name"], id=row["id"], created_at=row["created_at"], n_events=row["n_events"],
            n_channels=row["n_channels"], channels=[c["pnn"] for c in channels],
            markers=[c["pns"] for c in channels], dtype=row["dtype"], compensated=bool(row["compensated"]),
            has_spillover=row["spillover_json"] is not None, labeled=labeling is not None,
            label_provenance=labeling["provenance"] if labeling else None,
            label_model_id=labeling["model_id"] if labeling else None, populations=populations,
            sources=sources, has_gates=has_gates, gate_result=result)

    def patients(self) -> list[PatientInfo]:
        """Every patient, in the order they were added."""
        with self._connect() as conn, catalog.read_transaction(conn):
            rows = conn.execute("SELECT * FROM patients ORDER BY created_at, name").fetchall()
            return [self._info(conn, row) for row in rows]

    def patient_versions(self) -> dict[str, tuple]:
        """What may change of each patient, in one query and without reading any file: name ->
        (patient id, channel names, current labeling id, latest auto-gate result id, latest gate
        set id). Two calls give equal tuples when nothing of that patient changed between them."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT p.name, p.id, p.current_labeling, "
                "(SELECT group_concat(pnn, char(31)) FROM "
                " (SELECT pnn FROM channels c WHERE c.patient_id = p.id ORDER BY position)), "
                "(SELECT MAX(id) FROM gate_results g WHERE g.patient_id = p.id), "
                "(SELECT MAX(id) FROM gate_sets s WHERE s.patient_id = p.id) "
                "FROM patients p ORDER BY p.created_at, p.name").fetchall()
        return {r[0]: (r[1], tuple((r[3] or "").split("\x1f")), r[2], r[4], r[5]) for r in rows}

    def same_events(self) -> list[list[str]]:
        """Patients that hold the same events: groups of two or more names (each in the order the
        patients were added, the groups by their first), [] when every patient's events differ.

        Found from each events file's content digest (:func:`storage.events_digest`, kept in the
        catalog): the same FCS file loaded twice under two names (renamed, re-exported, uploaded
        from two folders, before and after an upgrade of the Parquet writer) holds the same
        events, whatever its labels. Training on both, or counting both in a batch's statistics,
        counts that patient twice. A file stored without a digest (by an older copy of this
        program) is read once and its digest kept; one that cannot be read is left out."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT p.name, p.n_channels, p.events_file, f.relpath, d.digest FROM patients p "
                "JOIN files f ON f.id = p.events_file LEFT JOIN events_digests d ON d.file_id = p.events_file "
                "ORDER BY p.created_at, p.name").fetchall()
        found = {}
        for row in rows:
            if row["digest"] is not None:
                continue
            try:
                events = self._read_file(row["relpath"], row["name"],
                                         lambda p, n=row["n_channels"]: storage.read_events(p, n))
            except LibraryError:
                continue  # a damaged file is the integrity check's to report, not a twin
            found[row["events_file"]] = storage.events_digest(events)
        if found:
            try:
                with self._connect() as conn, catalog.write_transaction(conn):
                    conn.executemany("INSERT OR IGNORE INTO events_digests (file_id, digest) "
                                     "SELECT ?, ? WHERE EXISTS (SELECT 1 FROM files WHERE id = ?)",
                                     [(file_id, digest, file_id) for file_id, digest in found.items()])
            except sqlite3.DatabaseError:
                pass  # a read-only catalog: the answer stands, the digests are computed again next time
        groups: dict[str, list[str]] = {}
        for row in rows:
            digest = row["digest"] or found.get(row["events_file"])
            if digest is not None:
                groups.setdefault(digest, []).append(row["name"])
        return [names for names in groups.values() if len(names) > 1]

    def patient(self, name: str) -> PatientInfo:
        with self._connect() as conn, catalog.read_transaction(conn):
            return self._info(conn, self._patient_row(conn, name))

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

    def remove_patient(self, name: str) -> None:
        """Remove a patient with its labels, gates and results (its audit entries stay)."""
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            relpaths = [r[0] for r in conn.execute("SELECT relpath FROM files WHERE patient_id = ?", (row["id"],))]
            conn.execute("DELETE FROM patients WHERE id = ?", (row["id"],))
            self._audit(conn, "remove", row["id"], row["name"], None, {"files": len(relpaths)}, _now())
        # Files go after the commit: a crash here leaves unreferenced files, removed at next open.
        common._checkpoint("committed-before-unlink")
        for relpath in relpaths:
            self._file_path(relpath).unlink(missing_ok=True)

    def export_patient(self, name: str, out: str | os.PathLike, *, include_identifying: bool = False,
                       keep_keywords=()) -> Path:
        """Write the patient as a gated CSV (``out`` ending in ``.csv``), FCS (``.fcs``), Parquet
        (``.parquet``) or AnnData (``.h5ad``, with the anndata package); another suffix is refused.

        Labels are the current labels (confidence 1) or, for an unlabeled patient, the latest
        auto-gate result. FCS export of an unlabeled patient without a result writes the events
        alone. The values are those the patient is labeled and gated on: its events compensated
        by its spillover matrix where it has one (every export's rule, docs/exports.md). Written by
        :func:`gating_core.io.export.export_sample`: an FCS export keeps only the keywords needed
        to read the data (see :mod:`gating_core.library.privacy`), plus ``keep_keywords``, or
        every keyword with ``include_identifying``, and no spillover once compensated; it reads
        back with exactly those values. The audit entry records how many keywords were left out
        (``dropped_keywords``), never which.
        """
        out = Path(out)
        sample = self.load_sample(name, compensate=True)
        populations = self.load_labels(name)
        confidence = None
        if populations is None:
            result = self.load_gate_result(name)
            if result is not None:
                populations, confidence = result.populations, result.confidence
        else:
            confidence = np.ones(sample.n_events, dtype=np.float32)
        from gating_core.io.export import EXPORT_SUFFIXES, dropped_keyword_count, export_sample
        from gating_core.library.privacy import keep_names

        by_suffix = {suffix: kind for kind, suffix in EXPORT_SUFFIXES.items()}
        kind = by_suffix.get(out.suffix.lower())
        if kind is None:
            raise LibraryError(f"cannot be written as {out.suffix or 'a file without a suffix'}: the name must "
                               f"end in {', '.join(EXPORT_SUFFIXES.values())} (the format is the suffix's)",
                               path=out)
        is_fcs = kind == "fcs"
        if not is_fcs and populations is None:
            raise LibraryError("has no labels and no auto-gate result; export it as .fcs, or label "
                               "or auto-gate it first", patient=sample.name)
        keep_keywords = keep_names(keep_keywords)
        try:
            export_sample(out, sample, populations, confidence, format=kind,
                          include_identifying=include_identifying, keep_keywords=keep_keywords)
        except FCSError as exc:
            raise LibraryError(exc.problem, path=out, patient=sample.name) from None
        except ImportError as exc:
            raise LibraryError(f"cannot be written: {exc}", path=out) from None
        except OSError as exc:
            raise LibraryError(f"cannot be written ({exc.strerror or exc})", path=out) from None
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            details = {"file": out.name, "format": "gated-csv" if kind == "csv" else kind,
                       "include_identifying": bool(include_identifying)}
            if is_fcs:
                details["keep_keywords"] = list(keep_keywords)
                details["dropped_keywords"] = dropped_keyword_count(
                    sample, include_identifying=include_identifying, keep_keywords=keep_keywords)
            self._audit(conn, "export", row["id"], row["name"], None, details, _now())
        return out


def _stored_novelty(details_json: str | None) -> dict | None:
    """The novelty a gate result was stored with (a dict: score, threshold, is_novel, and the
    parts' disagreement when measured), or None: what a list of patients shows without reading
    the result's file."""
    try:
        novelty = json.loads(details_json or "{}").get("novelty")
    except (ValueError, AttributeError):
        return None
    return novelty if isinstance(novelty, dict) else None
