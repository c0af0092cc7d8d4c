"""Data: load FCS files (with labels, gated CSVs, FlowJo/GatingML gates) or the sample data."""

import os
from types import SimpleNamespace

import pandas as pd
import streamlit as st

from gating_core.reports import qc
from ui import cache, exports
from ui.app_state import channel_presence, some_names, unrelated_panels
from ui.common import SAMPLE_DATA, channel_label, get_store, refresh_status, show_messages
from ui.ingest import ingest_files, load_folder
from ui.loading import (CLASH_CHOICES, autoload_sample_data, keep_upload_errors, resolve_clashes, take_report,
                        upload_errors_shown)

store = get_store()
st.title("Data: load patients")
st.caption("Drop the FCS files of your patients here. A patient is **historical** when it comes with "
           "expert labels (a `<name>.labels.csv` beside `<name>.fcs`, a gated CSV exported by this tool, "
           "or a FlowJo `.wsp` / GatingML `.xml` file uploaded together with its FCS files), and **new** "
           "otherwise. Files stay on this computer.")


def _take_report(report, already_loaded_means_skip: bool = False):
    st.session_state["pending_clashes"] = take_report(store, report, already_loaded_means_skip)
    refresh_status(store)


upload_col, sample_col = st.columns([3, 1])
with upload_col:
    uploads = st.file_uploader(
        "FCS files, label CSVs, gated CSVs, FlowJo workspaces, GatingML",
        type=["fcs", "lmd", "csv", "wsp", "xml"], accept_multiple_files=True, key="uploads",
        help="Select or drag several files at once. `patient.labels.csv` is matched to `patient.fcs` by name.")
with sample_col:
    st.write("")
    st.write("")
    # The first step on an empty library; beside a lab's own patients (or files in the uploader,
    # loaded further down this run), a quiet button, so that synthetic patients are not mixed in
    # by a click meant for the uploader.
    quiet = bool(store.patients or uploads)
    if st.button("Load sample data", key="load_sample_data", type="secondary" if quiet else "primary", width="stretch",
                 help="Synthetic patients bundled with the tool: labeled historical patients and new ones."):
        with st.spinner("Reading sample data…"):
            _take_report(load_folder(SAMPLE_DATA), already_loaded_means_skip=True)

# `make run` asks for the bundled sample data to be ready on first start (an empty library),
# loaded once whichever of the sessions opening at that moment comes first.
if (os.environ.get("GATING_LOAD_SAMPLE_DATA") == "1" and not store.patients
        and not st.session_state.get("sample_data_autoloaded")):
    st.session_state["sample_data_autoloaded"] = True
    with st.spinner("Reading sample data…"):
        autoload_sample_data(store, SAMPLE_DATA)
    st.rerun()  # so that the sidebar counts include them

fresh = [f for f in (uploads or []) if f.file_id not in store.seen_uploads]
if fresh:
    with st.spinner(f"Reading {len(fresh)} file(s)…"):
        report = ingest_files([(f.name, f.getvalue()) for f in fresh], store.work_dir,
                              existing=store.patients, rename_clashes=False)
    store.seen_uploads.update(f.file_id for f in fresh)
    keep_upload_errors(store, report, [(f.file_id, f.name) for f in fresh])
    _take_report(report)

# A file whose patient name is already loaded: the user decides, nothing is renamed silently.
clashing = st.session_state.get("pending_clashes") or []
if clashing:
    st.warning(f"{len(clashing)} uploaded patient(s) have the name of a patient already loaded. Choose for each:")
    for k, patient in enumerate(clashing):
        loaded = store.patients.get(patient.name)
        st.radio(f"**{patient.name}** ({patient.file_name}, {patient.sample.n_events:,} events"
                 + (f"; the loaded one has {loaded.n_events:,})" if loaded is not None else ")"),
                 list(CLASH_CHOICES), format_func=CLASH_CHOICES.get, index=None, key=f"clash_{k}_{patient.name}",
                 horizontal=True)
    choices = [st.session_state.get(f"clash_{k}_{p.name}") for k, p in enumerate(clashing)]
    if st.button("Apply these choices", key="clash_apply", type="primary", disabled=None in choices):
        resolve_clashes(store, clashing, choices)
        st.session_state["pending_clashes"] = []
        st.rerun()

summary = getattr(store, "load_summary", [])
if summary:
    st.success("Loaded " + ("  \n".join(summary) if len(summary) <= 6 else
                            f"{len(summary)} patients ({sum(1 for s in summary if 'labeled' in s)} labeled)"))
# A file that could not be read keeps its error while it sits in the uploader, past later uploads.
show_messages(upload_errors_shown(store, [f.file_id for f in uploads or []]) + store.load_errors, store.load_notes,
              getattr(store, "load_warnings", []))

st.subheader("Loaded patients")
if not store.patients:
    st.info("Nothing loaded yet: drop files above or press **Load sample data**.")
    st.stop()

rows = []
for name, p in store.patients.items():
    pops = ""
    if p.labels is not None:
        counts = cache.population_counts(p.populations_token, p.labels)
        pops = " · ".join(f"{k} {v:,}" for k, v in counts.items())
    rows.append({"patient": name, "status": "historical (labeled)" if p.is_labeled else "new",
                 "events": p.n_events, "channels": len(p.channel_names),
                 "labels from": p.label_source or "—", "populations (count)": pops or "—",
                 "file": p.file_name})
table = pd.DataFrame(rows)
st.dataframe(table, hide_index=True, width="stretch",
             column_config={"events": st.column_config.NumberColumn(format="localized")})

# QC on load: saturation at $PnR - 1 and drift along the time channel (gating_core.reports.qc), once per
# version of each patient's events; the details are at the bottom of the page. Patients of the
# library whose events are not read yet are checked on demand there (reading the whole library
# to fill a table would cost its size in memory).
quality = {name: exports.quality(p.token, p) for name, p in store.patients.items() if p.sample_loaded}
for name, report in quality.items():
    if report.flags:
        st.warning(f"**QC: {name}**\n" + "\n".join(f"- {flag}" for flag in report.flags),
                   icon=":material/report:")

with st.expander("Remove a patient from the library"):
    # no patient chosen until the user picks one: a deletion starts from a deliberate choice
    doomed = st.selectbox("Patient", list(store.patients), key="remove_patient", index=None,
                          placeholder="Choose the patient to remove")
    st.caption("Removing deletes the patient from the library: its events, every version of its labels, "
               "its gates and auto-gate results. The audit log keeps a record of the removal.")
    if doomed is not None and st.session_state.get("confirm_remove") != doomed:
        if st.button(f"Remove {doomed}…", key="remove_button"):
            st.session_state["confirm_remove"] = doomed
            st.rerun()
    elif doomed is not None:
        st.warning(f"Delete **{doomed}** from the library? This cannot be undone in the app.")
        yes, no = st.columns(2)
        if yes.button(f"Yes, delete {doomed}", key="remove_confirm", type="primary"):
            store.remove_patient(doomed)
            st.session_state.pop("confirm_remove", None)
            st.rerun()
        if no.button("Cancel", key="remove_cancel"):
            st.session_state.pop("confirm_remove", None)
            st.rerun()

st.subheader("Channels")
presence = channel_presence({n: SimpleNamespace(pnn=p.channel_names) for n, p in store.patients.items()})
mismatched = presence[~presence.all(axis=1)]
if mismatched.empty:
    st.success(f"All patients share the same {len(presence)} channels.")
    with st.expander("Channel list"):
        first = next(iter(store.patients.values())).sample
        st.dataframe(pd.DataFrame({"channel": [channel_label(first, c) for c in first.pnn],
                                   "range ($PnR)": [c.range for c in first.channels]}),
                     hide_index=True)
else:
    panels = unrelated_panels({n: p.channel_names for n, p in store.patients.items()})
    if len(panels) > 1:
        st.warning("These patients hold panels that share no channel name: "
                   + "; ".join(f"{some_names(panel)} ({len(store.patients[panel[0]].channel_names)} channels)"
                               for panel in panels)
                   + ". A model learns from and gates the patients of one panel (Train picks the panel of the "
                     "most labeled patients). Rename channels below only where the same marker carries "
                     "another name.")
    else:
        st.warning(f"{len(mismatched)} channel names differ between patients. Match them below so the same "
                   "marker has the same name everywhere (training and auto-gating use the shared channels).")
    samples_by_channel = {c: next(p.sample for p in store.patients.values() if c in p.channel_names)
                          for c in presence.index}
    shown = mismatched.replace({True: "✓", False: "—"})
    shown.index = [channel_label(samples_by_channel[c], c) for c in mismatched.index]
    st.dataframe(shown, width="stretch")
    cols = st.columns(4)
    patient = cols[0].selectbox("In patient", list(store.patients), key="rename_patient")
    channel = cols[1].selectbox("rename channel", store.patients[patient].channel_names, key="rename_from",
                                format_func=lambda c: channel_label(store.patients[patient].sample, c))
    # a name the chosen patient lacks: renaming to one it has would clash
    lacking = [c for c in presence.index if c not in set(store.patients[patient].channel_names)]
    target = cols[2].selectbox("to", lacking, key="rename_to",
                               format_func=lambda c: channel_label(samples_by_channel[c], c),
                               help="A name the other patients use.")
    cols[3].write("")
    if cols[3].button("Rename channel", key="rename_button", disabled=target is None):
        try:
            store.rename_channels(patient, {channel: target})
            st.rerun()
        except ValueError as exc:
            st.error(str(exc))

st.subheader("Quality and compensation", anchor="quality")
st.caption(f"Saturation: events at or above `$PnR - 1` on the stored scale, flagged above "
           f"{100 * qc.SATURATION_THRESHOLD:g}% of a channel's events. Drift: the acquisition cut into "
           f"{qc.N_BINS} time bins; flagged when a bin holds under {100 * qc.RATE_DROP:g}% of the median bin's "
           f"events, or when a fluorescence channel's median in a bin moves more than {qc.DRIFT_THRESHOLD:g} "
           "percentile points from the file's median.")
qc_rows = []
for name, p in store.patients.items():
    if name not in quality:
        continue
    report, comp = quality[name], exports.compensation(p.token, p)
    qc_rows.append({"patient": name, "compensation": comp.summary,
                    "saturated channels": ", ".join(f"{s.label} ({100 * s.fraction:.1f}%)"
                                                   for s in report.saturation if s.flagged) or "—",
                    "time drift": (", ".join([d.label for d in report.drift if d.flagged]
                                             + [f for f in report.flags if f.startswith("event rate")]) or "none")
                    if report.drift or report.bin_counts else "not checked",
                    "QC flags": len(report.flags)})
if qc_rows:
    st.dataframe(pd.DataFrame(qc_rows), hide_index=True, width="stretch",
                 column_config={"QC flags": st.column_config.NumberColumn(format="localized")})
# the patient chosen in the details below is read there, checked, and not listed
inspected = st.session_state.get("qc_patient")
inspected = inspected if inspected in store.patients else next(iter(store.patients), None)
unread = [name for name in store.patients if name not in quality and name != inspected]
if unread:
    st.caption(f"Not read yet from the library, so not checked: {', '.join(unread[:12])}"
               + (f" and {len(unread) - 12} more" if len(unread) > 12 else "") + ". Choose one below to check it.")
with st.expander("Compensation matrix and QC details of a patient"):
    inspected = st.selectbox("Patient", list(store.patients), key="qc_patient")
    record = store.patients[inspected]
    comp = exports.compensation(record.token, record)
    report = quality.get(inspected) or exports.quality(record.token, record)
    st.markdown(f"**Compensation**: {comp.summary}.")
    for note in comp.notes:
        st.caption(note)
    if comp.matrix is not None:
        st.dataframe(comp.to_frame(), width="stretch",
                     column_config={c: st.column_config.NumberColumn(format="%.4f") for c in comp.labels})
    st.markdown("**Saturation** (events at or above `$PnR - 1`)")
    st.dataframe(report.saturation_frame().drop(columns=["channel"]), hide_index=True, width="stretch",
                 column_config={"% saturated": st.column_config.NumberColumn(format="%.2f"),
                                "ceiling": st.column_config.NumberColumn(format="%.6g")})
    if report.time_channel:
        st.markdown(f"**Drift** along {report.time_channel}: events per time bin "
                    + ", ".join(f"{c:,}" for c in report.bin_counts))
        st.dataframe(report.drift_frame().drop(columns=["channel"]), hide_index=True, width="stretch",
                     column_config={"max shift (percentile points)": st.column_config.NumberColumn(format="%.1f")})
    for note in report.notes:
        st.caption(note)
