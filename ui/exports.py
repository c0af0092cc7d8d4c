"""Export files of auto-gated patients, built on demand and cached per result version."""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core.model.result import PART_TITLES
from gating_core.reports.plotting import population_table
from ui.app_state import zip_files


@st.cache_data(max_entries=16, show_spinner="Writing the gated CSV…")
def gated_csv(token: str, _record, _work_dir) -> bytes:
    """The gated CSV download (also what the zip holds), through the one export path."""
    from gating_core.io.export import export_bytes

    return export_bytes(_record.sample, _record.populations, _record.confidence, format="csv",
                        work_dir=_work_dir)


@st.cache_data(max_entries=16, show_spinner="Writing the FCS file…")
def gated_fcs(token: str, _record, _work_dir) -> bytes:
    """The "FCS with population channel" download: only the keywords needed to read the data
    (:func:`gating_core.io.export.export_sample`'s default policy)."""
    from gating_core.io.export import export_bytes

    return export_bytes(_record.sample, _record.populations, format="fcs", work_dir=_work_dir)


def fcs_keyword_note(record) -> str | None:
    """What the FCS download leaves out, in one line (None when it leaves nothing out)."""
    from gating_core.io.export import dropped_keyword_count

    dropped = dropped_keyword_count(record.sample)
    if not dropped:
        return None
    noun = "keyword" if dropped == 1 else "keywords"
    return (f"The FCS download leaves out {dropped} {noun} of the source file not needed to read the data "
            f"(they may identify a person; their names are not listed). The library keeps them: "
            f"`library export --out F.fcs --include-identifying` or `--keep-keyword NAME` writes them.")


@st.cache_data(max_entries=32, show_spinner=False)
def statistics(token: str, _record):
    """Each population's count, shares, mean confidence and its markers' median, geometric mean
    and CV (:mod:`gating_core.reports.marker_stats`): the Populations table and the statistics CSV."""
    from gating_core.reports.marker_stats import MarkerStatistics
    from gating_core.reports.plotting import sample_channel_label

    markers = MarkerStatistics.of_sample(_record.sample, sample_channel_label)
    frame = population_table(markers.events, markers.labels, _record.populations,
                             confidence=_record.confidence, cofactors=markers.cofactors)
    frame.insert(0, "patient", _record.name)
    return frame


def statistics_csv(records) -> bytes:
    import pandas as pd

    from gating_core.io.spreadsheet_cells import statistics_table_csv

    return statistics_table_csv(pd.concat([statistics(r.populations_token, r) for r in records]))


def all_as_zip(records, work_dir) -> bytes:
    files = {f"{r.name}.gated.csv": gated_csv(r.populations_token, r, work_dir) for r in records}
    files["statistics.csv"] = statistics_csv(records)
    return zip_files(files)


# ------------------------------------------------------------------------------------------
# Quality flags, compensation, batch table and per-patient report (gating_core.reports.qc / .report)

@st.cache_data(max_entries=256, show_spinner=False)
def quality(token: str, _record):
    """:func:`gating_core.reports.qc.quality_flags` of a patient, once per version of its events."""
    from gating_core.reports.qc import quality_flags

    return quality_flags(_record.sample)


@st.cache_data(max_entries=256, show_spinner=False)
def compensation(token: str, _record):
    """:func:`gating_core.reports.qc.compensation_info` of a patient."""
    from gating_core.reports.qc import compensation_info

    return compensation_info(_record.sample)


def _gates_of(record):
    """The gate tree a patient's rows are counted by: its auto-gates, else the gates drawn on it."""
    from gating_core.gates import GateTree

    if record.load_result() is not None:
        return GateTree.from_dict(record.autogates["tree"]) if record.autogates is not None else None
    return record.gate_tree if len(record.gate_tree) else None


def _population_entry(record) -> dict:
    """Keyword arguments of :func:`gating_core.reports.report.population_rows` for one patient."""
    from ui import cache

    result = record.load_result()
    tree = _gates_of(record)
    entry = {"patient": record.name, "populations": record.populations, "sample": record.sample}
    if result is not None:
        part = getattr(result, "part", None)
        entry.update(confidence=record.confidence, source=f"auto-gate ({record.result_model or 'model'}"
                     + (f", {PART_TITLES[part]}" if part else "") + ")"
                     + (", reviewed" if record.is_reviewed else ""))
    else:
        entry["source"] = f"labels ({record.label_source})" if record.label_source else "labels"
    if tree is not None:
        entry.update(tree=tree, memberships=cache.memberships(record.token, tree.to_json(), record.sample))
        if result is not None and record.autogates is not None:
            entry["known"] = tuple(record.autogates.get("populations") or ())
    return entry


@st.cache_data(max_entries=256, show_spinner=False)
def _rows(key: str, _record):
    from gating_core.reports.report import population_rows

    return population_rows(**_population_entry(_record))


def batch_frame(records):
    """Every patient x population of ``records`` (see :func:`gating_core.reports.report.batch_table`);
    each patient's rows cached until its populations or gates change."""
    import pandas as pd

    from gating_core.reports.report import BATCH_COLUMNS

    frames = [_rows(_report_key(r), r) for r in records if r.populations is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=BATCH_COLUMNS)


def batch_csv(records) -> bytes:
    from gating_core.io.spreadsheet_cells import statistics_table_csv

    return statistics_table_csv(batch_frame(records))


def _report_key(record) -> str:
    tree = _gates_of(record)
    known = (record.autogates or {}).get("populations") or ()
    before = bool((record.autogates or {}).get("before correction"))
    return (f"{record.populations_token}|{tree.to_json() if tree is not None else ''}|{','.join(known)}"
            f"|{record.label_source}|{before}")


@st.cache_data(max_entries=16, show_spinner="Writing the report…")
def _patient_report(key: str, _record) -> bytes:
    from gating_core.reports.report import patient_report_html

    entry = _population_entry(_record)
    result = _record.load_result()
    text = patient_report_html(
        _record.name, _record.sample, entry["populations"], confidence=entry.get("confidence"),
        novelty=getattr(result, "novelty", None) if result is not None else None, tree=entry.get("tree"),
        memberships=entry.get("memberships"), source=entry["source"], model_name=_record.result_model,
        file_name=_record.file_name, qc=quality(_record.token, _record),
        compensation=compensation(_record.token, _record), known=entry.get("known", ()),
        gate_notes=(_record.autogates or {}).get("unfitted") if entry.get("tree") is not None else None,
        cells_corrected=_record.cells_corrected() if result is not None and _record.is_reviewed else None,
        accepted=result is not None and _record.is_accepted,
        gates_before_correction=bool((_record.autogates or {}).get("before correction"))
        and entry.get("tree") is not None)
    return text.encode("utf-8")


def patient_report(record) -> bytes:
    """The one-page HTML report of a patient (UTF-8), rebuilt when its populations or gates change."""
    return _patient_report(_report_key(record), record)


def patient_report_or_reason(record) -> tuple[bytes | None, str | None]:
    """(the report, None), or (None, why it could not be written): a download whose file fails
    says only "Failed to generate file", so the page builds the report first and shows why."""
    try:
        return patient_report(record), None
    except Exception as exc:  # any failure: the page shows it rather than a silent download error
        return None, f"{type(exc).__name__}: {exc}"


#: The gate exports of the Gate page: file kind -> (suffix, button label).
GATE_FILES = {"gatingml": (".xml", "Gates (GatingML 2.0)"), "flowjo": (".wsp", "Gates (FlowJo workspace)")}


@st.cache_data(max_entries=16, show_spinner="Writing the gates…")
def gates_file(kind: str, tree_json: str, sample_token: str, _sample, _work_dir) -> bytes:
    """A patient's gate tree as GatingML 2.0 (``kind`` "gatingml") or a FlowJo workspace
    ("flowjo"), on the values they were drawn on (compensated ones refer to the file's matrix:
    :mod:`gating_core.gates.export`). Raises GateError for gates a workspace cannot hold."""
    import tempfile
    from pathlib import Path

    from gating_core.gates import GateTree
    from gating_core.gates.export import export_flowjo_workspace, export_gatingml

    tree = GateTree.from_json(tree_json)
    with tempfile.TemporaryDirectory(dir=_work_dir, prefix="gates-") as folder:
        path = Path(folder) / f"gates{GATE_FILES[kind][0]}"
        if kind == "flowjo":
            export_flowjo_workspace(tree, path, [_sample])
        else:
            export_gatingml(tree, path, _sample)
        return path.read_bytes()

