"""Putting loaded patients into the session: never a silent rename, never a silent loss.

A patient whose name is already loaded is held back: an upload asks whether to replace the
loaded patient, keep both (the new one under a free name) or skip the file; the sample data,
loaded a second time, is said to be there already. No Streamlit here: the Data page asks.
"""

from __future__ import annotations

from ui.ingest import free_name, split_name_clashes

CLASH_CHOICES = {"replace": "Replace the loaded patient (its labels, gates and results go)",
                 "keep both": "Keep both (the new one gets another name)", "skip": "Skip this file"}


def add_patients(store, patients, notes: list) -> list:
    """Add patients to the store; returns those added (a refusal becomes a note)."""
    added = []
    for patient in patients:
        try:
            store.add_patient(patient.name, patient.sample, patient.labels, patient.label_source, patient.file_name)
        except ValueError as exc:
            notes.append((patient.file_name, f"{patient.file_name}: not added, {exc}"))
        else:
            added.append(patient)
    return added


def same_events_warnings(store, added) -> list:
    """A warning for each added patient whose events another loaded patient already holds (the
    same file loaded twice under two names), as (file name, message) pairs."""
    twins = store.same_events([p.name for p in added]) if added else {}
    return [(p.file_name, f"**{p.name}** ({p.file_name or 'no file name'}) holds exactly the events of "
             + ", ".join(f"**{t}**" for t in twins[p.name]) + ": the same file loaded twice? Training "
             "and a batch's statistics would count that patient twice; if so, delete one below.")
            for p in added if p.name in twins]


def keep_upload_errors(store, report, uploads) -> None:
    """Move the report's errors onto the uploaded files they name, as (file id, name) pairs
    of this upload, so that each stays on show while its file sits in the uploader, however
    many uploads follow (:func:`upload_errors_shown`). An error naming no file of this
    upload stays in the report."""
    ids_by_name: dict[str, list[str]] = {}
    for file_id, file_name in uploads:
        ids_by_name.setdefault(file_name, []).append(file_id)
    unplaced = []
    for file_name, message in report.errors:
        file_ids = ids_by_name.get(file_name)
        if not file_ids:
            unplaced.append((file_name, message))
        for file_id in file_ids or ():
            store.upload_errors.setdefault(file_id, []).append((file_name, message))
    report.errors = unplaced


def upload_errors_shown(store, present_ids) -> list:
    """The errors of the uploaded files still in the uploader, in upload order; those of files
    taken out of it are forgotten."""
    present = set(present_ids)
    for file_id in [i for i in store.upload_errors if i not in present]:
        del store.upload_errors[file_id]
    return [error for errors in store.upload_errors.values() for error in errors]


def summary_lines(patients) -> list[str]:
    return [f"**{p.name}**: {p.sample.n_events:,} events, {len(p.sample.channels)} channels"
            + (f", labeled ({p.label_source})" if p.labels is not None else ", new") for p in patients]


def take_report(store, report, already_loaded_means_skip: bool = False) -> list:
    """Add the report's patients whose names are free and set the store's load messages.
    Returns the patients whose names are taken (to ask about), or [] when
    ``already_loaded_means_skip`` (the sample data: they are noted as already there)."""
    notes = list(report.notes)
    free, clashing = split_name_clashes(report.patients, store.patients)
    if already_loaded_means_skip and clashing:
        notes.append(("", "Already in the library, not loaded again: " + ", ".join(p.name for p in clashing) + "."))
        clashing = []
    added = add_patients(store, free, notes)
    store.load_errors, store.load_notes, store.load_summary = list(report.errors), notes, summary_lines(added)
    store.load_warnings = same_events_warnings(store, added)
    return clashing


def autoload_sample_data(store, folder) -> bool:
    """Fill an empty library with the sample data once, however many sessions open at the same
    moment: the first loads it under the library's lock and leaves a marker
    (``PatientLibrary.run_once``); the others wait for it and then just see the patients, with
    nothing to report. A library that already holds patients gets none. Returns whether this
    session loaded them (its load messages are then set, as for the button)."""
    from ui.ingest import load_folder

    if store.library is None:  # this session only: nobody to share with
        take_report(store, load_folder(folder), already_loaded_means_skip=True)
        return True
    loaded = []

    def load():
        if len(store.library):
            return
        take_report(store, load_folder(folder), already_loaded_means_skip=True)
        loaded.append(True)

    store.library.run_once("sample-data", load)
    store.refresh()
    return bool(loaded)


def resolve_clashes(store, clashing, choices) -> None:
    """Apply the user's choice ("replace", "keep both" or "skip") for each held-back patient."""
    notes, added = [], []
    for patient, choice in zip(clashing, choices):
        if choice == "replace":
            store.remove_patient(patient.name)
            added += add_patients(store, [patient], notes)
        elif choice == "keep both":
            patient.name = patient.sample.name = free_name(patient.name, store.patients)
            added += add_patients(store, [patient], notes)
        else:
            notes.append((patient.file_name, f"{patient.file_name}: skipped, {patient.name} stays as it was."))
    store.load_summary, store.load_notes, store.load_errors = summary_lines(added), notes, []
    store.load_warnings = same_events_warnings(store, added)
