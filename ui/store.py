"""The session's patients, gate trees, models and auto-gate results.

Pages talk only to :class:`Store`; the store keeps everything in memory for the session and,
when the patient library (``gating_core.library``) is available, writes through to it so a page
reload or a restart of the app finds the work again.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gating_core.gates import GateHistory, GateTree

DEFAULT_LIBRARY = "workspace"


@dataclass
class PatientRecord:
    """One patient in the session.

    ``labels`` (n_events,) str, or None for a new patient; ``result`` is the latest auto-gate
    result (GateResult) and ``corrected`` its populations after the user's corrections.
    ``token`` changes whenever the events change, so caches keyed by it stay correct.
    """

    name: str
    sample: object
    labels: np.ndarray | None = None
    label_source: str = ""
    file_name: str = ""
    gate_tree: GateTree = field(default_factory=GateTree)
    history: GateHistory = field(default_factory=GateHistory)
    result: object | None = None
    result_model: str = ""
    corrected: np.ndarray | None = None
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    labels_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    result_token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def populations_token(self) -> str:
        """Changes whenever :attr:`populations` may change (cache key)."""
        return f"{self.token}:{self.labels_token}:{self.result_token}"

    def set_result(self, result, model_name: str) -> None:
        self.result, self.result_model, self.corrected = result, model_name, None
        self.result_token = uuid.uuid4().hex

    def set_corrected(self, populations) -> None:
        self.corrected = np.asarray(populations).astype(object)
        self.result_token = uuid.uuid4().hex

    @property
    def is_labeled(self) -> bool:
        return self.labels is not None

    @property
    def role(self) -> str:
        return "historical (labeled)" if self.is_labeled else "new"

    @property
    def populations(self) -> np.ndarray | None:
        """The populations to show: corrected auto-gate, else auto-gate, else labels."""
        if self.corrected is not None:
            return self.corrected
        if self.result is not None:
            return self.result.populations
        return self.labels

    def set_labels(self, labels, source: str) -> None:
        labels = np.asarray(labels).astype(object)
        if labels.shape != (self.sample.n_events,):
            raise ValueError(f"{self.name}: {labels.shape[0]} labels for {self.sample.n_events} events")
        self.labels, self.label_source = labels, source
        self.labels_token = uuid.uuid4().hex


class Store:
    """All state of one browser session (see module docstring)."""

    def __init__(self, library_path: str | None = None):
        self.patients: dict[str, PatientRecord] = {}
        self.models: dict[str, object] = {}
        self.current_model: str | None = None
        self.evaluation = None  # DataFrame from leave_one_patient_out
        self.load_errors: list[tuple[str, str]] = []
        self.load_notes: list[tuple[str, str]] = []
        self.seen_uploads: set[str] = set()
        self.work_dir = Path(tempfile.mkdtemp(prefix="gating-app-"))
        self.library_path = library_path or os.environ.get("GATING_LIBRARY", DEFAULT_LIBRARY)

    # patients ---------------------------------------------------------------------------
    def add_patient(self, name, sample, labels=None, label_source="", file_name="") -> PatientRecord:
        record = self.patients.get(name)
        if record is not None and record.sample is sample:
            if labels is not None:
                record.set_labels(labels, label_source)
            return record
        record = PatientRecord(name, sample, file_name=file_name)
        if labels is not None:
            record.set_labels(labels, label_source)
        self.patients[name] = record
        return record

    def remove_patient(self, name: str) -> None:
        self.patients.pop(name, None)

    def replace_sample(self, name: str, sample) -> None:
        record = self.patients[name]
        record.sample = sample
        record.token = uuid.uuid4().hex

    def labeled(self) -> list[str]:
        return [n for n, p in self.patients.items() if p.is_labeled]

    def unlabeled(self) -> list[str]:
        return [n for n, p in self.patients.items() if not p.is_labeled]

    def samples(self, names=None) -> dict:
        names = list(self.patients) if names is None else names
        return {n: self.patients[n].sample for n in names}

    # models -----------------------------------------------------------------------------
    def add_model(self, name: str, model) -> None:
        self.models[name] = model
        self.current_model = name

    def model(self):
        return self.models.get(self.current_model) if self.current_model else None
