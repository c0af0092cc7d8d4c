"""Stored models: the checked ``.npz`` file, its training patients, removal.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from gating_core.library.common import LibraryError, _jsonable, _name_key, _now, normalise_name
import gating_core.library.catalog as catalog
import gating_core.library.storage as storage
import gating_core.library.common as common


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


class ModelsMixin:
    """Stored models: the checked ``.npz`` file, its training patients, removal."""

    def add_model(self, model_file_path: str | os.PathLike, name: str, training_patients: Iterable = (),
                  evaluation: dict | None = None, method: str | None = None) -> str:
        """Store a model file (the .npz written by ``GatingModel.save`` or
        ``IWNystroemGatingModel.save``) and what it was trained on.

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
        with storage.placing(temp) as placement:
            with self._connect() as conn, catalog.write_transaction(conn):
                now = _now()
                model_id = storage.new_id()[:12]
                version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM models WHERE name = ?",
                                       (name,)).fetchone()[0]
                conn.execute("INSERT INTO models (id, name, version, method, file_id, evaluation_json, created_at) "
                             "VALUES (?, ?, ?, ?, '', ?, ?)", (model_id, name, version, method, evaluation_json, now))
                file_id, placement.placed = self._register_file(conn, None, "model", temp, ".npz", now)
                conn.execute("UPDATE models SET file_id = ? WHERE id = ?", (file_id, model_id))
                for position, patient in enumerate(patients):
                    found = conn.execute("SELECT id, name FROM patients WHERE name_key = ?",
                                         (_name_key(str(patient)),)).fetchone()
                    conn.execute("INSERT INTO model_training_patients (model_id, position, patient_name, patient_id) "
                                 "VALUES (?, ?, ?, ?)", (model_id, position, str(patient), found["id"] if found else None))
                self._audit(conn, "add model", None, None, model_id,
                            {"name": name, "version": version, "method": method, "training_patients": patients}, now)
                common._checkpoint("files-in-place")
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
        """Path of the stored model file; open it with ``gating_core.model.iw_model.load_any_model`` (a
        GatingModel or an importance-weighted Nystroem model file). Do not modify it."""
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
        common._checkpoint("committed-before-unlink")
        self._file_path(row["relpath"]).unlink(missing_ok=True)
