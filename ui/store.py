"""The session's patients, gate trees, models and auto-gate results.

Pages talk only to :class:`Store`. The store writes every change through to the persistent
patient library (``gating_core.library.PatientLibrary``: SQLite catalog + Parquet files), so a
page reload or a restart of the app finds the work again, and the command line sees the same
patients and models. Events are read from the library lazily, when a page first needs them,
and shared with the other sessions on the library (:mod:`ui.shared`) rather than copied.
If the library cannot be opened, the store keeps working in memory and says so.

Several people may work on one library at once, each in their own browser session and store:
how a session reads the library and keeps up with what the others change is
:class:`ui.library_view.LibraryView`, which :class:`Store` is made of with what it writes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import weakref
from pathlib import Path

import numpy as np

from gating_core.gates import AxisScale, GateError, GateTree, panel_scale
from gating_core.io.labels import Provenance
from gating_core.library.storage import events_digest
from ui.library_view import LibraryView, _library_token
from ui.patient_record import REVIEWED_DETAIL, PatientRecord, _new_token, _novelty_details

DEFAULT_LIBRARY = "workspace"


def _session_ended(work_dir: str) -> None:
    """When a session's store is gone: its temporary folder goes, and the memory it held is
    handed back to the system rather than kept by the allocator."""
    from ui.shared import release_free_memory_soon

    shutil.rmtree(work_dir, ignore_errors=True)
    release_free_memory_soon()



def _review_details(record: PatientRecord) -> dict:
    """What a result's details say of its review: {} for the model's own gating, else that it
    was corrected in review and how many cells were corrected. A result read back from the
    library after a review is already the reviewed gating: its corrections count beside this
    session's (a cell corrected in both counts twice: the model's own gating is not kept)."""
    if not record.is_reviewed:
        return {}
    return {REVIEWED_DETAIL: True, "cells corrected": record.cells_corrected()}


def events_fingerprint(sample) -> str:
    """The digest of a sample's events (:func:`storage.events_digest`), as the library keeps it:
    equal for the same file read twice."""
    return events_digest(sample.events)


class Store(LibraryView):
    """All state of one browser session, written through to the patient library."""

    def __init__(self, library_path: str | os.PathLike | None = None, session_id: str | None = None,
                 session_name: str = ""):
        self.session_id = session_id or uuid.uuid4().hex[:8]
        self.session_name = session_name
        self.patients: dict[str, PatientRecord] = {}
        self.display_transforms: dict[str, AxisScale] = {}  # $PnN -> the panel's scale (see panel_transform)
        self.axis_ranges: dict[str, tuple] = {}  # $PnN -> (low, high) raw units set by hand (see axis_range)
        self.models: dict[str, object] = {}
        self.model_ids: dict[str, str] = {}
        self.current_model: str | None = None
        self.evaluation = None  # DataFrame from leave_one_patient_out
        self.check_record = None  # what the shown check was run on: its setup and time, no table
        self.load_errors: list[tuple[str, str]] = []
        self.load_notes: list[tuple[str, str]] = []
        # the same events as a patient already loaded (same_events), shown as warnings
        self.load_warnings: list[tuple[str, str]] = []
        self.warnings: list[str] = []
        self.seen_uploads: set[str] = set()
        # uploader file id -> its errors, shown while the file sits in the uploader (upload_errors_shown)
        self.upload_errors: dict[str, list[tuple[str, str]]] = {}
        self._fingerprints: dict[str, str] = {}  # events token -> events_fingerprint (same_events)
        self.adopted_jobs: set[str] = set()  # background jobs whose results this session took up
        # Models others trained, offered rather than made current: {"model_id", "label", "by", "settings"}
        self.model_offers: list[dict] = []
        self.changes_seen: list[str] = []  # what others changed, said once on the page that shows it
        self._unplaced_models: list[str] = []  # new in the library; offered once it is known who trained them
        self._seen_changes: int | None = None
        self.work_dir = Path(tempfile.mkdtemp(prefix="gating-app-"))
        weakref.finalize(self, _session_ended, str(self.work_dir))
        self.library = None
        self.library_error: str | None = None
        self.library_path = str(library_path or os.environ.get("GATING_LIBRARY") or DEFAULT_LIBRARY)
        self.open_library(self.library_path)

    # library ------------------------------------------------------------------------------
    def open_library(self, path) -> None:
        """(Re)open the library at ``path`` and read its catalog; events stay on disk until used."""
        from gating_core.library import LibraryError, PatientLibrary

        self.library_path = str(path)
        self.patients, self.models, self.model_ids, self.current_model = {}, {}, {}, None
        self.display_transforms, self.model_offers, self._unplaced_models = {}, [], []
        self.axis_ranges = {}
        try:
            library = PatientLibrary(path)
            # Read before the catalog: a change committed meanwhile is taken up at the next sync.
            self._seen_changes = library.change_counter()
            infos = library.patients()
            versions = library.patient_versions()
            model_infos = library.models()
        except LibraryError as exc:
            self.library, self.library_error = None, str(exc)
            return
        self.library, self.library_error = library, None
        for pnn, stored in library.load_display_transforms().items():
            try:
                self.display_transforms[pnn] = AxisScale.from_dict(stored)
            except GateError as exc:
                self.warnings.append(f"display transform of {pnn} could not be read ({exc})")
        self.axis_ranges = library.load_axis_ranges()
        for minfo in model_infos:  # before the patients: their results name these models
            self._register_stored_model(minfo)
        for info in infos:
            self.patients[info.name] = self._record_of(info, versions.get(info.name))
        self.evaluation = None
        check = self.reload_check_record()
        if check is not None:
            import pandas as pd

            self.evaluation = pd.DataFrame(check["table"])

    def reload_check_record(self) -> dict | None:
        """Read the library's latest check; keep what it was run on (its setup and time, not
        its table) as ``check_record``. Returns the whole stored check, or None."""
        check = self.library.load_check_result() if self.library is not None else None
        self.check_record = None if check is None else {k: v for k, v in check.items() if k != "table"}
        return check

    def _persist(self, action: str, fn, *args, **kwargs):
        """Run a library write; on failure keep the session going and report it."""
        if self.library is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self.warnings.append(f"Not saved to the library ({action}): {exc}")
            return None

    # patients -----------------------------------------------------------------------------
    def add_patient(self, name, sample, labels=None, label_source="", file_name="") -> PatientRecord:
        """Add a patient (or, when ``sample`` is the one already held, give it labels)."""
        record = self.patients.get(name)
        if record is not None and record._sample is sample:
            if labels is not None:
                self.set_labels(name, labels, label_source)
            return record
        if record is not None:
            raise ValueError(f"a patient named {name!r} is already loaded")
        record = PatientRecord(name, sample, labels=None, file_name=file_name)
        if labels is not None:
            record.set_labels(labels, label_source)
        if self.library is not None:
            from gating_core.library import ConflictError
            from gating_core.library.importing import UPLOAD_ROLE

            try:
                self.library.add_patient(sample, None if labels is None else record.labels, name=name,
                                         provenance=Provenance.from_short(label_source, Provenance.IMPORTED),
                                         label_source=file_name or None,
                                         source_files=[(UPLOAD_ROLE, file_name)] if file_name else ())
            except ConflictError:
                self.refresh()  # shows theirs
                raise ValueError("another session added a patient of that name meanwhile; "
                                 "it is in the list, this file was not loaded again") from None
            except Exception as exc:
                self.warnings.append(f"Not saved to the library (add patient): {exc}")
        self.patients[name] = record
        return record

    def set_labels(self, name: str, labels, source: str) -> None:
        record = self.patients[name]
        record.set_labels(labels, source)
        if self.library is not None:
            labeling = self._persist("labels", self.library.set_labels, name, record.labels,
                                     Provenance.from_short(source, Provenance.DRAWN), source=source)
            if labeling is not None:
                self._note_version(name, labeling=labeling)
                record.review_labeling = labeling

    def label_versions(self, name: str) -> list[dict]:
        """Every labeling the library keeps for the patient, oldest first (``label_history``)."""
        if self.library is None or name not in self.library:
            return []
        return self._persist("read label versions", self.library.label_history, name) or []

    def restore_labels(self, name: str, labeling_id: int) -> None:
        """Make an earlier label version current again (the undo of a replacement)."""
        from gating_core.library import LibraryError

        record = self.patients[name]
        try:
            labeling = self.library.restore_labels(name, labeling_id)
            self._note_version(name, labeling=labeling)
            record.review_labeling = labeling
            labels = self.library.load_labels(name)
            provenance = next(v["provenance"] for v in self.library.label_history(name) if v["current"])
        except LibraryError as exc:
            raise ValueError(str(exc)) from None
        record.set_labels(labels, Provenance.short(provenance))

    def save_gates(self, name: str, tree: GateTree, push_history: bool = True) -> None:
        record = self.patients[name]
        if push_history:
            record.history.push(record.gate_tree)
        record.gate_tree = tree
        self._save_gates(name, tree)

    def undo_gates(self, name: str) -> None:
        record = self.patients[name]
        record.gate_tree = record.history.undo()
        self._save_gates(name, record.gate_tree)

    def _save_gates(self, name: str, tree: GateTree) -> None:
        if self.library is not None:
            gate_set = self._persist("gates", self.library.save_gates, name, tree.to_dict())
            if gate_set is not None:
                self._note_version(name, gates=gate_set)

    def same_events(self, names) -> dict[str, list[str]]:
        """For each of ``names``, the other loaded patients that hold exactly its events (the same
        file loaded twice under two names); names without such a twin are left out. From the
        library's stored files where there is one, else from the events in memory."""
        if self.library is not None:
            try:
                groups = self.library.same_events()
            except Exception as exc:  # the check is a courtesy: a library that cannot answer loads on
                self.warnings.append(f"Could not compare the new patients with the library's: {exc}")
                return {}
        else:
            by_content: dict[str, list[str]] = {}
            fingerprints = {}
            for name, record in self.patients.items():
                if record.sample_loaded and record.sample is not None:
                    # hashed once per version of a patient's events (its token), not at every upload
                    digest = self._fingerprints.get(record.token) or events_fingerprint(record.sample)
                    fingerprints[record.token] = digest
                    by_content.setdefault(digest, []).append(name)
            self._fingerprints = fingerprints
            groups = list(by_content.values())
        twins = {}
        for group in groups:
            present = [n for n in group if n in self.patients]
            for name in names:
                if name in present and len(present) > 1:
                    twins[name] = [n for n in present if n != name]
        return twins

    def remove_patient(self, name: str) -> None:
        self.patients.pop(name, None)
        if self.library is not None and name in self.library:
            self._persist("remove patient", self.library.remove_patient, name)

    def rename_channels(self, name: str, mapping: dict) -> None:
        """Rename a patient's channels ($PnN old -> new); labels, gates and results stay."""
        from ui.app_state import rename_channels

        record = self.patients[name]
        sample = rename_channels(record.sample, mapping)  # ValueError on a clash, before any change
        if self.library is not None and name in self.library:
            from gating_core.library import LibraryError

            try:
                self.library.rename_channels(name, mapping)
            except LibraryError as exc:
                raise ValueError(str(exc)) from None
        record._sample, record._sample_loader = sample, None
        record.channel_names = list(sample.pnn)
        if record.version is not None:
            self._note_version(name, channels=tuple(sample.pnn))
            record.token = _library_token(record.version["id"], sample.pnn)
        else:
            record.token = _new_token()

    # the panel's display and gating transforms ----------------------------------------------
    def panel_transform(self, pnn: str) -> AxisScale:
        """Channel ``pnn``'s scale for every patient: the user's choice, else the scale the
        stored gates on it use, else decided once from the instrument (``panel_scale``). The
        ``kind`` is the default view; the other fields hold the parameters of every kind."""
        scale = self.display_transforms.get(pnn)
        if scale is None:
            scale = self._scale_of_gates(pnn)
            if scale is None:
                holders = [r for r in self.patients.values() if pnn in r.channel_names][:1]
                scale = panel_scale(pnn, [r.sample for r in holders])
            self.set_panel_transform(pnn, scale)
        return scale

    def _scale_of_gates(self, pnn: str) -> AxisScale | None:
        for record in self.patients.values():
            for gate in record.gate_tree.gates:
                for channel, scale in gate.axes:
                    if channel == pnn:
                        return scale
        return None

    def set_panel_transform(self, pnn: str, scale: AxisScale) -> None:
        """Keep ``scale`` as channel ``pnn``'s transform for the whole panel (saved in the library)."""
        self.display_transforms[pnn] = scale
        if self.library is not None:
            self._persist("display transforms", self.library.save_display_transforms,
                          {k: v.to_dict() for k, v in self.display_transforms.items()})

    def axis_range(self, pnn: str) -> tuple | None:
        """Channel ``pnn``'s axis range set by hand for the whole panel, (low, high) in raw
        units, or None: drawn on its events' own range."""
        return self.axis_ranges.get(pnn)

    def set_axis_range(self, pnn: str, limits) -> None:
        """Draw channel ``pnn`` from ``limits`` = (low, high), raw units, on every plot of the
        panel (None: its events' own range again); saved in the library like the transforms."""
        if limits is None:
            self.axis_ranges.pop(pnn, None)
        else:
            low, high = float(limits[0]), float(limits[1])
            if not (np.isfinite(low) and np.isfinite(high) and low < high):
                raise ValueError(f"the axis range must go from a lower to a higher number, not {low:g} to {high:g}")
            self.axis_ranges[pnn] = (low, high)
        if self.library is not None:
            self._persist("axis ranges", self.library.save_axis_ranges, dict(self.axis_ranges))

    def labeled(self) -> list[str]:
        return [n for n, p in self.patients.items() if p.is_labeled]

    def unlabeled(self) -> list[str]:
        return [n for n, p in self.patients.items() if not p.is_labeled]

    def samples(self, names=None) -> dict:
        names = list(self.patients) if names is None else names
        return {n: self.patients[n].sample for n in names}

    # models -------------------------------------------------------------------------------
    def add_model(self, name: str, model, training_patients=(), evaluation=None) -> str:
        """Keep a model for the session and store its file in the library; returns its label."""
        label = name
        if self.library is not None:
            path = self.work_dir / f"model-{uuid.uuid4().hex}.npz"
            try:
                model.save(path)
                model_id = self._persist("model", self.library.add_model, path, name, list(training_patients),
                                         evaluation, getattr(model, "method", None))
            finally:
                path.unlink(missing_ok=True)
            if model_id:
                return self._make_current(model, model_id)
        self.models[label] = model
        self.current_model = label
        return label

    def _make_current(self, model, model_id: str) -> str:
        """Make a model the library holds as ``model_id`` the current one; returns its label."""
        info = self.library.model(model_id)
        label = f"{info.name} (v{info.version})"
        self.models[label] = model
        self.model_ids[label] = model_id
        self.current_model = label
        return label

    def adopt_model(self, model, model_id: str | None, name: str) -> str:
        """Make the model this session's training produced (stored in the library as
        ``model_id``, read from there when ``model`` is None) the current one; returns its label.
        A model this session already knows is not added twice."""
        self.model_offers = [o for o in self.model_offers if o["model_id"] != model_id]
        for label, known_id in self.model_ids.items():
            if model_id is not None and known_id == model_id:
                self.current_model = label
                return label
        if model_id is None or self.library is None:
            if name not in self.models:
                self.models[name] = model
            self.current_model = name
            return name
        if model is None:
            from ui import shared

            model = shared.library_model(self.library, model_id)
        return self._make_current(model, model_id)

    def model(self):
        return self.models.get(self.current_model) if self.current_model else None

    # auto-gate results --------------------------------------------------------------------
    def set_result(self, name: str, result, model_label: str) -> None:
        """Keep an auto-gate result with the label of the model that made it (stored with it)."""
        record = self.patients[name]
        record.set_result(result, model_label)
        # The review starts from the labels the patient has now: accepting it later replaces
        # these, and is refused if someone else replaced them first.
        record.review_labeling = record.version["labeling"] if record.version is not None else None
        self._save_result(name, result.populations, result.confidence, model_label, _novelty_details(result))

    def correct(self, name: str, populations, confidence) -> None:
        """The reviewed populations and their confidence (a circled cell's: 1.0) replace the
        gating shown, exported and stored; the model's own gating stays in the session."""
        record = self.patients[name]
        record.load_result()
        record.set_corrected(populations, confidence)
        details = {**_novelty_details(record.result), **_review_details(record)}
        self._save_result(name, record.corrected, record.confidence, record.result_model, details)

    def reopen_review(self, name: str, base) -> None:
        """Refine a review made in an earlier session: ``base`` is the patient gated again by the
        model (and part) that gated it; the review read back stands over it as this session's
        corrections, so that the refinement starts from the model's gating and keeps them.
        Nothing is stored: the library already holds the review."""
        self.patients[name].reopen(base)

    def undo_correction(self, name: str, snapshot) -> None:
        """Put a patient's review back as it stood before a correction (``snapshot``:
        :meth:`PatientRecord.snapshot`, taken then), gates included, and store it so."""
        record = self.patients[name]
        record.load_result()
        record.restore(snapshot)
        details = {**_novelty_details(record.result), **_review_details(record)}
        self._save_result(name, record.populations, record.confidence, record.result_model, details)

    def gating_model(self, name: str):
        """The model that gated ``name`` (None when it is no longer in the session)."""
        return self.models.get(self.patients[name].result_model)

    def gating_populations(self, name: str) -> list[str]:
        """Every population the model that gated ``name`` can name, present in its result or not;
        kept with the patient's gates, so that they outlive the model ([] when neither is known)."""
        model = self.gating_model(name)
        if model is not None:
            return [str(p) for p in model.populations_]
        return [str(p) for p in (self.patients[name].autogates or {}).get("populations", [])]

    def set_autogates(self, name: str, tree: GateTree, template: str, edited: bool = False,
                      adjusted: str | None = None, unfitted: dict | None = None) -> None:
        """Keep the gates fitted to (or adjusted on) an auto-gated patient with its result.
        After an edit only the cells whose gate membership changed follow the gates
        (``autogates.relabel_after_edit``); every other cell keeps its population and confidence.
        ``unfitted``: gates kept as the template drew them, with the reason."""
        from gating_core.gates.autogates import relabel_after_edit, unassigned_name

        record = self.patients[name]
        record.load_result()
        before = record.autogates
        known = self.gating_populations(name)
        record.autogates = {"tree": tree.to_dict(), "template": str(template), "edited": bool(edited),
                            "adjusted": adjusted,  # the gate adjusted last, shown first on a return
                            "unfitted": dict(unfitted if unfitted is not None else
                                             (before or {}).get("unfitted", {}) if edited else {}),
                            "populations": known}  # the model's: a gate named like one counts only its cells
        details = _novelty_details(record.result)
        if edited and before is not None:
            current = np.asarray(record.populations).astype(str)
            labels, _ = relabel_after_edit(GateTree.from_dict(before["tree"]), tree, record.sample, current,
                                           unassigned_name(known or np.unique(current)))
            # a cell the edited gate moved is a human decision; the others keep their confidence
            moved = np.asarray(labels).astype(str) != current
            record.set_corrected(labels, np.where(moved, 1.0, record.confidence))
        else:
            record.result_token = _new_token()
        details.update(_review_details(record))
        self._save_result(name, record.populations, record.confidence, record.result_model, details)

    def _save_result(self, name, populations, confidence, model_label, details) -> None:
        autogates = self.patients[name].autogates if name in self.patients else None
        if autogates is not None:
            details = {**details, "autogates": autogates}
        model_id = self.model_ids.get(model_label)
        if self.library is None or model_id is None:
            return
        details = {**details, "model": str(model_label)}
        result_id = self._persist("auto-gate result", self.library.save_gate_result, name, model_id,
                                  np.asarray(populations).astype(str),
                                  np.clip(np.asarray(confidence, dtype=float), 0, 1), details)
        if result_id is not None:
            self._note_version(name, result=result_id)

    def accept(self, name: str) -> None:
        """The reviewed populations become the patient's labels (it joins the historical ones).

        Refused (ValueError, nothing changed) when another session replaced the patient's labels
        since this review started, e.g. accepted it first: the message says whose they are now,
        and a second accept, made knowing it, replaces them (theirs stay as a label version)."""
        from gating_core.library import ConflictError, LibraryError
        from gating_core.library.labels import UNCHECKED

        record = self.patients[name]
        populations = np.asarray(record.populations).astype(object)
        if self.library is not None:
            expected = record.review_labeling if record.version is not None else UNCHECKED
            try:
                has_result = (record.version["result"] is not None if record.version is not None
                              else self.library.patient(name).gate_result is not None)
                if has_result:
                    labeling = self.library.accept_gate_result(name, populations.astype(str),
                                                               expected_labeling=expected)
                else:
                    labeling = self.library.set_labels(name, populations.astype(str), "auto-gate accepted after review",
                                                       source="app review", expected_labeling=expected)
            except ConflictError as exc:
                record.review_labeling = self.library.current_labeling(name)
                self.refresh()
                raise ValueError(f"{name} was not accepted: {exc.problem}. Your review was not stored; accept "
                                 "again to replace those labels with it (they stay as an earlier label "
                                 "version).") from None
            except LibraryError as exc:
                self.warnings.append(f"Not saved to the library (accept): {exc}")
            else:
                self._note_version(name, labeling=labeling)
                record.review_labeling = labeling
        if record.autogates is not None:  # the reviewed auto-gates become the patient's gates
            self.save_gates(name, GateTree.from_dict(record.autogates["tree"]))
        record.set_labels(populations, "auto-gate (reviewed)")


def describe_library(store: Store) -> str:
    if store.library is None:
        return f"Library unavailable ({store.library_error}); work is kept for this session only."
    return f"Library: `{store.library_path}`"


def dumps(obj) -> str:  # pragma: no cover - convenience for debugging sessions
    return json.dumps(obj, default=str)
