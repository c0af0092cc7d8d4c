"""Uploads into patients, without Streamlit (tests import it without a browser).

:func:`ingest_files` takes uploaded files as ``(name, bytes)`` pairs, writes them under generated
names into a private work folder (an uploaded name is never used as a path), reads them with the
project's readers and returns the patients it could build plus one clear error per file it could
not use. The caller (the Streamlit app, or a test) decides where the patients go.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gating_core.gates import GateImportError, apply_gatingml, apply_workspace, safe_stem
from gating_core.io.labels import Provenance


FCS_SUFFIXES = (".fcs", ".lmd")
LABEL_SUFFIX = ".labels.csv"
WORKSPACE_SUFFIX = ".wsp"
GATINGML_SUFFIX = ".xml"


@dataclass
class LoadedPatient:
    """One patient built from uploaded files.

    ``labels`` is None for a new (unlabeled) patient; ``label_source`` says where labels came
    from: the short name of their :class:`~gating_core.io.labels.Provenance` ("labels CSV",
    "gated CSV", "FlowJo workspace", "GatingML").
    """

    name: str
    sample: object
    labels: np.ndarray | None = None
    label_source: str = ""
    file_name: str = ""


@dataclass
class IngestReport:
    patients: list[LoadedPatient] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (uploaded file name, message)
    notes: list[tuple[str, str]] = field(default_factory=list)   # (uploaded file name, message)


def classify(file_name: str) -> str:
    """``"fcs"``, ``"labels"``, ``"gated"``, ``"workspace"``, ``"gatingml"`` or ``"unknown"``."""
    lowered = str(file_name).lower()
    if lowered.endswith(FCS_SUFFIXES):
        return "fcs"
    if lowered.endswith(LABEL_SUFFIX):
        return "labels"
    if lowered.endswith(".csv"):
        return "gated"
    if lowered.endswith(WORKSPACE_SUFFIX):
        return "workspace"
    if lowered.endswith(GATINGML_SUFFIX):
        return "gatingml"
    return "unknown"


def free_name(name: str, taken) -> str:
    """``name``, or ``name_2``, ``name_3``, ... when a name in ``taken`` already is it (case-insensitively)."""
    return _unique(name, set(taken))


def _unique(name: str, taken: set) -> str:
    if name.casefold() not in {t.casefold() for t in taken}:
        return name
    k = 2
    while f"{name}_{k}".casefold() in {t.casefold() for t in taken}:
        k += 1
    return f"{name}_{k}"


def ingest_files(files, work_dir, existing=None, compensate: bool = True,
                 rename_clashes: bool = True) -> IngestReport:
    """Read a batch of uploaded files into patients.

    Parameters
    ----------
    files : iterable of (file_name, bytes)
        As uploaded; names are used only to classify and to match ``<stem>.labels.csv`` to
        ``<stem>.fcs``.
    work_dir : path
        A private folder; each file is written there as ``upload-<uuid><fixed suffix>``.
    existing : dict of str -> Sample (or any object with ``n_events`` and ``sample``), optional
        Already loaded patients by name: label files may refer to them. Only ``n_events`` is
        read unless labels for that patient arrive.
    compensate : bool
        Apply each FCS file's spillover matrix (FlowJo/GatingML gates get raw events, since
        they carry their own compensation).
    rename_clashes : bool
        True: a patient whose name is already in ``existing`` gets ``name_2``. False: it keeps
        its name, so the caller can ask whether to replace, keep both or skip
        (:func:`split_name_clashes`). Names within one batch are always made unique; the same
        file (name and content) twice in a batch is read once.

    Returns
    -------
    IngestReport
    """
    from gating_core.fcs import FCSError
    from gating_core.io.inputs import read_input

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    existing = dict(existing or {})
    report = IngestReport()
    taken = set(existing) if rename_clashes else set()
    stored: list[tuple[str, str, Path]] = []
    picked: dict[str, list[bytes]] = {}  # file name -> the contents of that name in this batch
    for file_name, data in files:
        kind = classify(file_name)
        if kind == "unknown":
            report.errors.append((file_name, "unsupported file type: expected .fcs, .csv (labels or gated), "
                                             ".wsp (FlowJo) or .xml (GatingML 2.0)"))
            continue
        # One file picked twice (a browser keeps both) is one patient; two files of one name
        # from two folders are two.
        same_name = picked.setdefault(file_name, [])
        if any(bytes(data) == earlier for earlier in same_name):
            report.notes.append((file_name, f"{file_name}: picked twice in this upload; loaded once"))
            continue
        same_name.append(bytes(data))
        suffix = {"fcs": ".fcs", "labels": ".labels.csv", "gated": ".csv", "workspace": ".wsp",
                  "gatingml": ".xml"}[kind]
        path = work_dir / f"upload-{uuid.uuid4().hex}{suffix}"
        path.write_bytes(bytes(data))
        stored.append((file_name, kind, path))

    # FCS first: label files and gates refer to them.
    fcs_by_stem: dict[str, LoadedPatient] = {}
    raw_by_file: dict[str, object] = {}
    for file_name, kind, path in stored:
        if kind != "fcs":
            continue
        try:
            inputs = read_input(path, compensate=False)  # stored under a generated name: no labels file beside it
            raw_samples = [patient.sample for patient in inputs]
        except FCSError as exc:
            report.errors.append((file_name, f"{file_name}: {exc.problem}"))
            continue
        except Exception as exc:  # a reader bug must not take the session down
            report.errors.append((file_name, f"{file_name}: could not be read ({exc})"))
            continue
        stem = safe_stem(file_name, "patient")
        for k, raw in enumerate(raw_samples):
            base = stem if len(raw_samples) == 1 else f"{stem}#{k + 1}"
            name = _unique(base, taken)
            taken.add(name)
            sample = raw.compensate() if compensate else raw
            sample.name = name
            sample.path = None  # the temp path is ours, not the user's
            patient = LoadedPatient(name, sample, file_name=file_name)
            report.patients.append(patient)
            if k == 0:
                fcs_by_stem[stem.casefold()] = patient
                raw_by_file[Path(str(file_name).replace("\\", "/")).name] = raw
        if len(raw_samples) > 1:
            report.notes.append((file_name, f"{file_name}: holds {len(raw_samples)} data sets, loaded as "
                                            f"separate patients"))
        for set_name, problem in inputs.skipped:
            report.notes.append((file_name, f"{file_name}: data set {set_name} not loaded: {problem}"))

    for file_name, kind, path in stored:
        if kind == "labels":
            _attach_labels(file_name, path, fcs_by_stem, existing, report)
        elif kind == "gated":
            _load_gated(file_name, path, taken, report)
        elif kind == "workspace":
            _apply_workspace(file_name, path, raw_by_file, fcs_by_stem, report)
        elif kind == "gatingml":
            _apply_gatingml(file_name, path, raw_by_file, fcs_by_stem, report)
    return report


def split_name_clashes(patients, existing_names):
    """(patients whose name is free, patients whose name a loaded patient already has).

    A labels file for an already loaded patient (same sample object) is not a clash: it gives
    that patient labels.
    """
    taken = {str(n).casefold() for n in existing_names}
    free, clashing = [], []
    for patient in patients:
        gives_labels_only = classify(patient.file_name) == "labels"
        (clashing if patient.name.casefold() in taken and not gives_labels_only else free).append(patient)
    return free, clashing


def _attach_labels(file_name, path, fcs_by_stem, existing, report):
    from gating_core.io.labels import LabelError, read_labels_csv

    stem = safe_stem(file_name, "labels")
    patient = fcs_by_stem.get(stem.casefold())
    if patient is None:
        match = next((n for n in existing if n.casefold() == stem.casefold()), None)
        if match is None:
            report.errors.append((file_name, f"{file_name}: no FCS file {stem}.fcs was loaded with it or "
                                             f"before it, so these labels belong to no patient; take it out of "
                                             f"the uploader and add it again with or after {stem}.fcs"))
            return
        try:
            labels = read_labels_csv(path, existing[match].n_events)
        except LabelError as exc:
            report.errors.append((file_name, _rename_in_message(str(exc), path, file_name)
                                  + f". The patient {match} is unchanged"))
            return
        report.notes.append((file_name, f"{file_name}: labels for the already loaded patient {match}"))
        target = getattr(existing[match], "sample", existing[match])
        report.patients.append(LoadedPatient(match, target, labels, Provenance.SHORT[Provenance.IMPORTED], file_name))
        return
    try:
        labels = read_labels_csv(path, patient.sample.n_events)
    except LabelError as exc:
        # its FCS file loads all the same: say so, or the patient looks labeled to the user
        report.errors.append((file_name, _rename_in_message(str(exc), path, file_name)
                              + f". {patient.name} is loaded without labels, as a new patient: drop a corrected "
                                f"labels file to label it"))
        return
    patient.labels, patient.label_source = labels, Provenance.SHORT[Provenance.IMPORTED]


def _load_gated(file_name, path, taken, report):
    from gating_core.io.inputs import read_input
    from gating_core.io.labels import LabelError

    try:
        [gated] = read_input(path)  # a gated CSV: one labeled patient
    except LabelError as exc:
        report.errors.append((file_name, _rename_in_message(str(exc), path, file_name)))
        return
    except Exception as exc:
        report.errors.append((file_name, f"{file_name}: not a readable gated CSV ({exc})"))
        return
    name = _unique(safe_stem(file_name, "patient"), taken)
    taken.add(name)
    sample = gated.sample
    sample.name, sample.path = name, None
    report.patients.append(LoadedPatient(name, sample, np.asarray(gated.labels).astype(object),
                                         Provenance.short(gated.provenance), file_name))


def _apply_workspace(file_name, path, raw_by_file, fcs_by_stem, report):
    if not raw_by_file:
        report.errors.append((file_name, f"{file_name}: upload the workspace together with its FCS files"))
        return
    try:
        labels_by_file = apply_workspace(path, raw_by_file)
    except GateImportError as exc:
        report.errors.append((file_name, f"{file_name}: {exc.problem}"))
        return
    for fcs_name, labels in labels_by_file.items():
        patient = fcs_by_stem.get(safe_stem(fcs_name).casefold())
        if patient is not None:
            patient.labels, patient.label_source = labels, Provenance.SHORT[Provenance.FLOWJO]
    missing = sorted(set(raw_by_file) - set(labels_by_file))
    if missing:
        report.notes.append((file_name, f"{file_name}: no gates for {', '.join(missing)}"))


def _apply_gatingml(file_name, path, raw_by_file, fcs_by_stem, report):
    if not raw_by_file:
        report.errors.append((file_name, f"{file_name}: upload the GatingML file together with its FCS files"))
        return
    for fcs_name, raw in raw_by_file.items():
        patient = fcs_by_stem.get(safe_stem(fcs_name).casefold())
        if patient is None or patient.labels is not None:
            continue
        try:
            labels = apply_gatingml(path, raw)
        except GateImportError as exc:
            report.errors.append((file_name, f"{file_name}: {exc.problem}"))
            return
        patient.labels, patient.label_source = labels, Provenance.SHORT[Provenance.GATINGML]


def _rename_in_message(message: str, path: Path, file_name: str) -> str:
    """Readers name our generated temp file; show the user's file name instead."""
    return message.replace(path.name, file_name).replace(str(path), file_name)


def load_folder(folder, labeled_pattern: str = "*.fcs", new_subfolder: str = "new") -> IngestReport:
    """Patients from a folder like ``sample_data/``: ``<stem>.fcs`` (+ ``<stem>.labels.csv``) are
    historical when labels are beside them, and ``new/*.fcs`` are new patients."""
    from gating_core.fcs import FCSError
    from gating_core.io.inputs import read_input
    from gating_core.io.labels import LabelError

    def add(path: Path, shown_as: str, labeled: bool) -> None:
        try:
            inputs = read_input(path, compensate=True)
        except (FCSError, LabelError) as exc:
            report.errors.append((path.name, str(exc)))
            return
        for patient in inputs:
            labels = np.asarray(patient.labels).astype(object) if labeled and patient.labels is not None else None
            report.patients.append(LoadedPatient(patient.name, patient.sample, labels,
                                                 Provenance.short(patient.provenance) if labels is not None else "",
                                                 shown_as))

    folder = Path(folder)
    report = IngestReport()
    for path in sorted(folder.glob(labeled_pattern)):
        add(path, path.name, labeled=True)
    new_dir = folder / new_subfolder
    if new_dir.is_dir():
        for path in sorted(new_dir.glob("*.fcs")):
            add(path, f"new/{path.name}", labeled=False)  # new patients: labels beside them are not theirs to use
    if not report.patients and not report.errors:
        report.errors.append((str(folder), f"{folder.name}: no FCS files found"))
    return report
