"""How a session sees the patient library: its patients and models read into the session's
records (events, labels and results when first used, shared with the other sessions through
:mod:`ui.shared`), and kept up with what other sessions, or the command line, change in it.

Part of :class:`ui.store.Store` (a mixin: it uses the store's ``library``, ``patients``,
``models`` and ``model_ids`` through ``self``). Several people may work on one library at once,
each in their own browser session and store. :meth:`LibraryView.sync`, called on every rerun,
takes up what the others changed (patients added, removed, labeled or accepted; results, gates
and models stored) after one cheap question to the catalog (``change_counter``), and the jobs
this session started. It never switches what a person is looking at: another's model is offered,
not made current; a result under review stays.
"""

from __future__ import annotations

import hashlib
from pathlib import PureWindowsPath
from types import SimpleNamespace

import numpy as np

from gating_core.gates import GateError, GateTree
from gating_core.io.labels import Provenance
from gating_core.library import LibraryError
from gating_core.library.importing import UPLOAD_ROLE
from ui.patient_record import PatientRecord, StoredResult, _new_token

VERSION_FIELDS = ("id", "channels", "labeling", "result", "gates")  # PatientLibrary.patient_versions' tuple


def _library_token(patient_id: str, channels) -> str:
    """The same for every session that reads this patient with these channel names, so that
    the caches keyed by it (``ui.cache``) hold one entry for all of them."""
    names = hashlib.sha1("\x1f".join(channels).encode()).hexdigest()[:12]
    return f"lib:{patient_id}:{names}"


def _file_name(sources) -> str:
    """The file a library patient was read from (its events' file): the name it was uploaded
    under, or an imported file's name without the folders of the machine that imported it; ""
    when the catalog records none."""
    for source in sources:
        if source.get("role") == UPLOAD_ROLE:
            return str(source.get("path", ""))
        if source.get("role") in ("fcs", "gated-csv"):
            return PureWindowsPath(str(source.get("path", ""))).name
    return ""


class LibraryView:
    """The library as this session holds it, and what others changed in it (see the module)."""

    def _record_of(self, info, version) -> PatientRecord:
        """A patient of the library as this session holds it: events, labels and result read
        when first used, events shared with the other sessions."""
        from ui import shared

        library, name = self.library, info.name
        version = dict(zip(VERSION_FIELDS, version)) if version is not None else None
        record = PatientRecord(
            name, sample_loader=lambda: shared.library_sample(library, info.id, name, info.channels),
            n_events=info.n_events, labels_loader=self._labels_loader(info.id, name, version), labeled=info.labeled,
            channel_names=info.channels, label_source=Provenance.short(info.label_provenance))
        record.token = _library_token(info.id, info.channels)
        record.file_name = _file_name(info.sources)
        if info.has_gates:
            try:
                record.gate_tree = GateTree.from_dict(library.load_gates(name))
            except (GateError, LibraryError) as exc:
                self.warnings.append(f"{name}: stored gates could not be read ({exc})")
        if info.gate_result:
            record.result_loader = lambda: self._stored_result(name)
            record.stored_novelty = info.gate_result.get("novelty")
            record.result_model = self._model_label(str(info.gate_result.get("model_id", "")))
            record.result_token = f"lib-result:{info.gate_result['id']}"
        record.version = version
        record.review_labeling = version["labeling"] if version is not None else None
        if version is not None and version["labeling"] is not None:
            record.labels_token = f"lib-labels:{version['labeling']}"
        return record

    def _labels_loader(self, patient_id: str, name: str, version: dict | None):
        from ui import shared

        library = self.library
        if version is None or version["labeling"] is None:
            return lambda: library.load_labels(name)
        return lambda: shared.library_labels(library, patient_id, version["labeling"], name)

    def _model_label(self, model_id: str, details: dict | None = None) -> str:
        """What to call the model that made a stored result: its label here, else the label the
        result was stored with, else its id (a model since removed from the library)."""
        for label, known in self.model_ids.items():
            if known == model_id:
                return label
        stored = (details or {}).get("model")
        return str(stored) if stored else f"model {model_id} (no longer in the library)"

    def _stored_result(self, name):
        record = self.library.load_gate_result(name)
        if record is None:
            return None
        novelty = record.details.get("novelty")
        if name in self.patients:
            self.patients[name].result_model = self._model_label(record.model_id, record.details)
        from ui.shared import compact_labels

        return StoredResult(compact_labels(record.populations), np.asarray(record.confidence, dtype=float),
                            SimpleNamespace(**novelty) if novelty else None, dict(record.counts), dict(record.details))

    def _register_stored_model(self, minfo, current: bool = True) -> str | None:
        from ui import shared

        label = f"{minfo.name} (v{minfo.version})"
        try:
            model = shared.library_model(self.library, minfo.id)
        except Exception as exc:  # a model file from another version: shown, not fatal
            self.warnings.append(f"model {label} could not be loaded ({exc})")
            return None
        self.models[label] = model
        self.model_ids[label] = minfo.id
        if current:
            self.current_model = label
        return label

    # what others changed ---------------------------------------------------------------------
    @property
    def session_label(self) -> str:
        """How this session is named to others: the name typed, else a short id."""
        return self.session_name or f"session {self.session_id[:6]}"

    def sync(self) -> None:
        """Take up what changed since the last rerun: the library (:meth:`refresh`) and the
        background jobs on it (:meth:`take_up_jobs`)."""
        self.refresh()
        self.take_up_jobs()

    def refresh(self) -> bool:
        """Take up what other sessions (or the command line) changed in the library: patients
        added or removed, labels replaced or accepted, results and gates stored, channels
        renamed, models added. Costs one indexed read of the catalog when nothing changed.
        What this session shows under review stays: its auto-gate result and gates edited here
        are not replaced, and a new model is offered (:attr:`model_offers`), never made current.
        Returns whether anything was read."""
        if self.library is None:
            return False
        try:
            counter = self.library.change_counter()
            if counter == self._seen_changes:
                return False
            versions = self.library.patient_versions()
            model_infos = self.library.models()
        except Exception as exc:  # the next rerun asks again
            message = f"The library could not be read ({exc})"
            if message not in self.warnings[-1:]:
                self.warnings.append(message)
            return False
        for name in [n for n in self.patients if n not in versions and self.patients[n].version is not None]:
            del self.patients[name]
            self.changes_seen.append(f"{name} was removed from the library by another session.")
        for name, version in versions.items():
            try:
                self._refresh_patient(name, dict(zip(VERSION_FIELDS, version)))
            except LibraryError as exc:  # removed again meanwhile: the next sync sees it
                self.warnings.append(str(exc))
        known = set(self.model_ids.values())
        for minfo in model_infos:
            if minfo.id not in known and self._register_stored_model(minfo, current=False):
                self._unplaced_models.append(minfo.id)
        self._seen_changes = counter
        return True

    def _refresh_patient(self, name: str, version: dict) -> None:
        record = self.patients.get(name)
        if record is None:
            self.patients[name] = self._record_of(self.library.patient(name), tuple(version.values()))
            return
        seen = record.version
        if seen is None:  # added by this session: what the library holds is what it wrote
            record.version = version
            record.review_labeling = version["labeling"]
            return
        if seen == version:
            return
        if seen["id"] != version["id"] or seen["channels"] != version["channels"]:
            # Replaced or renamed elsewhere: read it again (a result under review here goes with it).
            self.patients[name] = self._record_of(self.library.patient(name), tuple(version.values()))
            self.patients[name].review_labeling = record.review_labeling
            return
        info = None
        if seen["labeling"] != version["labeling"]:
            info = self.library.patient(name)
            record._labels, record._labeled = None, info.labeled
            record._labels_loader = self._labels_loader(version["id"], name, version)
            record.label_source = Provenance.short(info.label_provenance)
            record.labels_token = f"lib-labels:{version['labeling']}" if version["labeling"] else _new_token()
            if info.label_provenance == Provenance.AUTO_ACCEPTED:
                self.changes_seen.append(f"{name} was accepted by another session: it is a historical patient now.")
        if seen["result"] != version["result"] and record.result is None and version["result"] is not None:
            info = info or self.library.patient(name)
            record.result_loader = lambda: self._stored_result(name)
            record.stored_novelty = info.gate_result.get("novelty")
            record.result_model = self._model_label(str(info.gate_result.get("model_id", "")))
            record.result_token = f"lib-result:{version['result']}"
            record.corrected, record.corrected_confidence, record.autogates = None, None, None
        if seen["gates"] != version["gates"] and not record.history.can_undo() and version["gates"] is not None:
            try:
                record.gate_tree = GateTree.from_dict(self.library.load_gates(name))
            except GateError as exc:
                self.warnings.append(f"{name}: stored gates could not be read ({exc})")
        record.version = version

    def _note_version(self, name: str, **changes) -> None:
        """Record this session's own write, so that :meth:`refresh` does not take it for another's."""
        record = self.patients.get(name)
        if record is not None and record.version is not None:
            record.version = {**record.version, **changes}

    def take_up_jobs(self) -> None:
        """The jobs on this library that finished: this session's trainings make their model the
        current one and its checks the table shown; a model trained by someone else is offered
        with who trained it and how (a model added from elsewhere, once no training of this
        session could be its source, is offered as such)."""
        from ui import jobs

        finished = jobs.jobs_for(self.library_path) if self.library_path else []
        for job in finished:
            if job.status != jobs.DONE or job.id in self.adopted_jobs:
                continue
            mine = job.owner == self.session_id
            if job.kind == "train" and mine:
                self.adopted_jobs.add(job.id)
                result = job.result
                self.adopt_model(result.get("model"), result.get("model_id"), result["name"])
            elif job.kind == "check" and mine:
                self.adopted_jobs.add(job.id)
                self.evaluation = job.result
                self.reload_check_record()
        trained_by = {j.result.get("model_id"): j for j in finished
                      if j.kind == "train" and j.status == jobs.DONE and isinstance(j.result, dict)}
        own_running = any(j.running and j.owner == self.session_id for j in finished if j.kind == "train")
        for model_id in list(self._unplaced_models):
            job = trained_by.get(model_id)
            if job is None and own_running:
                continue  # it may be this session's training, still storing it
            self._unplaced_models.remove(model_id)
            if job is not None and job.owner == self.session_id:
                continue  # adopted above
            label = next((lbl for lbl, known in self.model_ids.items() if known == model_id), None)
            if label is None or label == self.current_model:
                continue
            if self.current_model is None:  # nothing to review yet: nothing to switch under anyone
                self.current_model = label
                continue
            by = job.started_by if job is not None else "another session or the command line"
            self.model_offers.append({"model_id": model_id, "label": label, "by": by,
                                      "settings": job.settings if job is not None else ""})

    def take_offer(self, model_id: str) -> str | None:
        """Make an offered model the current one; returns its label."""
        self.model_offers = [o for o in self.model_offers if o["model_id"] != model_id]
        label = next((lbl for lbl, known in self.model_ids.items() if known == model_id), None)
        if label is not None:
            self.current_model = label
        return label

    def dismiss_offer(self, model_id: str) -> None:
        """Leave an offered model in the model list without making it current."""
        self.model_offers = [o for o in self.model_offers if o["model_id"] != model_id]
