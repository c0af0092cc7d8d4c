"""Results: each patient's latest auto-gate result (and its acceptance as labels) and the last
held-out check.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from gating_core.library.common import LibraryError, Provenance, _as_labels, _jsonable, _now, _population_counts
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
import gating_core.library.common as common
from gating_core.library.labels import UNCHECKED


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


class ResultsMixin:
    """Results: each patient's latest auto-gate result (and its acceptance as labels) and the last
    held-out check."""

    CHECK_RESULT_FILE = "check_result.json"

    def save_check_result(self, result: dict) -> None:
        """Keep the latest held-out check (JSON-able: patients, table records); replaces the previous."""
        self._write_json(self.CHECK_RESULT_FILE, {**_jsonable(result), "saved_at": _now()})

    def load_check_result(self) -> dict | None:
        """The latest held-out check saved by :meth:`save_check_result`, or None."""
        data = self._read_json(self.CHECK_RESULT_FILE)
        return data if isinstance(data, dict) and isinstance(data.get("table"), list) else None

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
        with storage.placing(temp) as placement:
            with self._connect() as conn, catalog.write_transaction(conn):
                row = self._patient_row(conn, name)
                if conn.execute("SELECT 1 FROM models WHERE id = ?", (model_id,)).fetchone() is None:
                    raise LibraryError(f"model {model_id!r} is not in the library; add it with add_model first",
                                       patient=row["name"])
                now = _now()
                file_id, placement.placed = self._register_file(conn, row["id"], "gate-result", temp, ".parquet", now)
                counts = _population_counts(populations)
                cursor = conn.execute(
                    "INSERT INTO gate_results (patient_id, model_id, file_id, counts_json, details_json, status, "
                    "created_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                    (row["id"], model_id, file_id, json.dumps(counts), details_json, now))
                self._audit(conn, "auto-gate", row["id"], row["name"], model_id,
                            {"gate_result_id": cursor.lastrowid, "populations": counts}, now)
                common._checkpoint("files-in-place")
                return cursor.lastrowid

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

    def accept_gate_result(self, name: str, populations=None, *, expected_labeling=UNCHECKED) -> int:
        """Make the latest auto-gate result (or the reviewer's corrected ``populations``) the
        patient's labels, with provenance "auto-gate accepted after review" and the model's id.
        Returns the labeling id. ``expected_labeling``: as :meth:`set_labels` takes it (a review
        based on labels someone has replaced since is refused, not stored over theirs)."""
        result = self.load_gate_result(name)
        if result is None:
            raise LibraryError("has no auto-gate result to accept", patient=name)
        labels = result.populations if populations is None else populations
        edited = populations is not None and not np.array_equal(np.asarray(populations, dtype=str),
                                                                 result.populations)
        return self._set_labels(name, labels, Provenance.AUTO_ACCEPTED,
                                source=f"gate result {result.id}" + (" (edited in review)" if edited else ""),
                                model_id=result.model_id, gate_result_id=result.id,
                                expected_labeling=expected_labeling)
