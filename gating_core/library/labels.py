"""Labels: every version of a patient's labels with its provenance; the training set.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from gating_core.fcs import Sample
from gating_core.library.common import (ConflictError, LibraryError, Provenance, _as_labels, _now,
                                        _population_counts)
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
import gating_core.library.common as common

#: ``expected_labeling``'s default: labels are replaced whatever they are now.
UNCHECKED = object()


class LabelsMixin:
    """Labels: every version of a patient's labels with its provenance; the training set."""

    def labeled_patient_names(self) -> list[str]:
        with self._connect() as conn:
            return [r[0] for r in conn.execute(
                "SELECT name FROM patients WHERE current_labeling IS NOT NULL ORDER BY created_at, name")]

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

    def set_labels(self, name: str, labels, provenance: str, *, source: str | None = None,
                   model_id: str | None = None, expected_labeling=UNCHECKED) -> int:
        """Make ``labels`` (str, shape (n_events,)) the patient's current labels; the earlier ones
        stay in :meth:`label_history`. Returns the labeling id.

        ``expected_labeling``: the labeling id (None: no labels) the caller last saw as current;
        when given and the patient's current labels are another (someone replaced them since),
        a :class:`ConflictError` says whose they are and nothing is changed."""
        return self._set_labels(name, labels, provenance, source=source, model_id=model_id,
                                expected_labeling=expected_labeling)

    def current_labeling(self, name: str) -> int | None:
        """The id of the patient's current labels (None when unlabeled): what ``expected_labeling`` takes."""
        with self._connect() as conn:
            return self._patient_row(conn, name)["current_labeling"]

    @staticmethod
    def _labels_changed(conn, row) -> ConflictError:
        found = conn.execute("SELECT provenance, created_at FROM labelings WHERE id = ?",
                             (row["current_labeling"],)).fetchone()
        now = (f"its labels are now \"{found['provenance']}\", saved {found['created_at'][:16].replace('T', ' ')} UTC"
               if found is not None else "its labels were removed")
        return ConflictError(f"its labels were changed meanwhile by another session ({now})", patient=row["name"])

    def _set_labels(self, name, labels, provenance, *, source=None, model_id=None, gate_result_id=None,
                    expected_labeling=UNCHECKED) -> int:
        if provenance not in Provenance.ALL:
            raise LibraryError(f"unknown label provenance {provenance!r}; one of {Provenance.ALL}", patient=name)
        info = self.patient(name)
        labels = _as_labels(labels, info.n_events, patient=info.name)
        temp = storage.write_labels_temp(self.tmp_dir, labels)
        with storage.placing(temp) as placement:
            with self._connect() as conn, catalog.write_transaction(conn):
                row = self._patient_row(conn, name)
                if row["id"] != info.id:
                    raise ConflictError("was replaced by another session meanwhile", patient=name)
                if expected_labeling is not UNCHECKED and row["current_labeling"] != expected_labeling:
                    raise self._labels_changed(conn, row)
                if gate_result_id is not None:
                    conn.execute("UPDATE gate_results SET status = 'accepted' WHERE id = ?", (gate_result_id,))
                now = _now()
                labeling_id, placement.placed = self._insert_labeling(
                    conn, row["id"], labels, temp, provenance, source, model_id, gate_result_id, now)
                action = "accept auto-gate" if provenance == Provenance.AUTO_ACCEPTED else "set labels"
                self._audit(conn, action, row["id"], row["name"], model_id,
                            {"provenance": provenance, "source": source, "labeling_id": labeling_id,
                             "populations": _population_counts(labels)}, now)
                common._checkpoint("files-in-place")
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
