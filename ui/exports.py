"""Export files of auto-gated patients, built on demand and cached per result version."""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core.plotting import population_table
from ui.app_state import zip_files


def _confidence(record) -> np.ndarray:
    """Model confidence, with 1.0 for cells a person reassigned (a human decision)."""
    if record.result is None:
        return np.ones(record.sample.n_events)
    confidence = np.asarray(record.result.confidence, dtype=np.float64).copy()
    if record.corrected is not None:
        changed = np.asarray(record.corrected).astype(str) != np.asarray(record.result.populations).astype(str)
        confidence[changed] = 1.0
    return confidence


@st.cache_data(max_entries=16, show_spinner="Writing the gated CSV…")
def gated_csv(token: str, _record, _work_dir) -> bytes:
    """The gated CSV download (also what the zip holds), through the one export path."""
    from gating_core.export import export_bytes

    return export_bytes(_record.sample, _record.populations, _confidence(_record), format="csv",
                        work_dir=_work_dir)


@st.cache_data(max_entries=16, show_spinner="Writing the FCS file…")
def gated_fcs(token: str, _record, _work_dir) -> bytes:
    """The "FCS with population channel" download: identifying keywords left out
    (:func:`gating_core.export.export_sample`'s default policy)."""
    from gating_core.export import export_bytes

    return export_bytes(_record.sample, _record.populations, format="fcs", work_dir=_work_dir)


@st.cache_data(max_entries=32, show_spinner=False)
def statistics(token: str, _record):
    from gating_core.plotting import sample_channel_label

    sample = _record.sample
    frame = population_table(sample.events, [sample_channel_label(sample, c) for c in sample.pnn],
                             _record.populations,
                             confidence=_confidence(_record))
    frame.insert(0, "patient", _record.name)
    return frame


def statistics_csv(records) -> bytes:
    import pandas as pd

    return pd.concat([statistics(r.populations_token, r) for r in records]).to_csv(index=False).encode()


def all_as_zip(records, work_dir) -> bytes:
    files = {f"{r.name}.gated.csv": gated_csv(r.populations_token, r, work_dir) for r in records}
    files["statistics.csv"] = statistics_csv(records)
    return zip_files(files)
