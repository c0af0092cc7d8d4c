"""Data: load FCS files (with labels, gated CSVs, FlowJo/GatingML gates) or the sample data."""

import os
from types import SimpleNamespace

import pandas as pd
import streamlit as st

from gating_core.app_state import channel_presence, ingest_files, load_folder
from ui import cache
from ui.common import SAMPLE_DATA, get_store, show_messages

store = get_store()
st.title("Data: load patients")
st.caption("Drop the FCS files of your patients here. A patient is **historical** when it comes with "
           "expert labels (a `<name>.labels.csv` beside `<name>.fcs`, a gated CSV exported by this tool, "
           "or a FlowJo `.wsp` / GatingML `.xml` file uploaded together with its FCS files), and **new** "
           "otherwise. Files stay on this computer.")


def _take_report(report):
    notes = list(report.notes)
    for patient in report.patients:
        try:
            store.add_patient(patient.name, patient.sample, patient.labels, patient.label_source, patient.file_name)
        except ValueError as exc:
            notes.append((patient.file_name, f"{patient.file_name}: not added, {exc}"))
    store.load_errors = list(report.errors)
    store.load_notes = notes
    store.load_summary = [f"**{p.name}**: {p.sample.n_events:,} events, {len(p.sample.channels)} channels"
                          + (f", labeled ({p.label_source})" if p.labels is not None else ", new")
                          for p in report.patients]


upload_col, sample_col = st.columns([3, 1])
with upload_col:
    uploads = st.file_uploader(
        "FCS files, label CSVs, gated CSVs, FlowJo workspaces, GatingML",
        type=["fcs", "lmd", "csv", "wsp", "xml"], accept_multiple_files=True, key="uploads",
        help="Select or drag several files at once. `patient.labels.csv` is matched to `patient.fcs` by name.")
with sample_col:
    st.write("")
    st.write("")
    if st.button("Load sample data", type="primary", width="stretch",
                 help="Synthetic patients bundled with the tool: labeled historical patients and new ones."):
        with st.spinner("Reading sample data…"):
            _take_report(load_folder(SAMPLE_DATA))

# `make run` asks for the bundled sample data to be ready on first start (an empty library).
if (os.environ.get("GATING_LOAD_SAMPLE_DATA") == "1" and not store.patients
        and not st.session_state.get("sample_data_autoloaded")):
    st.session_state["sample_data_autoloaded"] = True
    with st.spinner("Reading sample data…"):
        _take_report(load_folder(SAMPLE_DATA))
    st.rerun()  # so that the sidebar counts include them

fresh = [f for f in (uploads or []) if f.file_id not in store.seen_uploads]
if fresh:
    with st.spinner(f"Reading {len(fresh)} file(s)…"):
        report = ingest_files([(f.name, f.getvalue()) for f in fresh], store.work_dir,
                              existing=store.patients)
    store.seen_uploads.update(f.file_id for f in fresh)
    _take_report(report)

summary = getattr(store, "load_summary", [])
if summary:
    st.success("Loaded " + ("  \n".join(summary) if len(summary) <= 6 else
                            f"{len(summary)} patients ({sum(1 for s in summary if 'labeled' in s)} labeled)"))
show_messages(store.load_errors, store.load_notes)

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
             column_config={"events": st.column_config.NumberColumn(format="%d")})

with st.expander("Remove a patient"):
    doomed = st.selectbox("Patient", list(store.patients), key="remove_patient")
    if st.button("Remove from session", key="remove_button"):
        store.remove_patient(doomed)
        st.rerun()

st.subheader("Channels")
presence = channel_presence({n: SimpleNamespace(pnn=p.channel_names) for n, p in store.patients.items()})
mismatched = presence[~presence.all(axis=1)]
if mismatched.empty:
    st.success(f"All patients share the same {len(presence)} channels.")
    with st.expander("Channel list"):
        first = next(iter(store.patients.values())).sample
        st.dataframe(pd.DataFrame({"channel ($PnN)": first.pnn, "marker ($PnS)": first.pns}),
                     hide_index=True)
else:
    st.warning(f"{len(mismatched)} channel names differ between patients. Match them below so the same "
               "marker has the same name everywhere (training and auto-gating use the shared channels).")
    st.dataframe(mismatched.replace({True: "✓", False: "—"}), width="stretch")
    cols = st.columns(4)
    patient = cols[0].selectbox("In patient", list(store.patients), key="rename_patient")
    channel = cols[1].selectbox("rename channel", store.patients[patient].channel_names, key="rename_from")
    target = cols[2].selectbox("to", list(presence.index), key="rename_to",
                               help="A name the other patients use.")
    cols[3].write("")
    if cols[3].button("Rename channel", key="rename_button"):
        try:
            store.rename_channels(patient, {channel: target})
            st.rerun()
        except ValueError as exc:
            st.error(str(exc))
