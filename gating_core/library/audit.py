"""The audit log (who did what, when) and the consistency check of catalog and files.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from gating_core.library.common import _actor, _jsonable
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage


class AuditMixin:
    """The audit log (who did what, when) and the consistency check of catalog and files."""

    def _audit(self, conn, action: str, patient_id, patient_name, model_id, details: dict, now: str) -> None:
        conn.execute("INSERT INTO audit (at, action, patient_id, patient_name, model_id, actor, details_json) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (now, action, patient_id, patient_name, model_id, _actor(), json.dumps(_jsonable(details))))

    def change_counter(self) -> int:
        """A number that grows with every change committed to the catalog (each one writes an
        audit entry in its transaction, and entries are never removed): one indexed read, so an
        app may ask on every screen refresh whether anything changed since it last looked.
        The display transforms and the held-out check (JSON files beside the catalog) are not counted."""
        with self._connect() as conn:
            return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM audit").fetchone()[0])

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
