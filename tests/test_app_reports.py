"""AppTest: QC flags and compensation on the Data page; batch table and HTML report on the Auto-gate page."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from gating_core.fcs import read_fcs, write_fcs
from gating_core.gates import GateTree
from apptest_helpers import goto, start, store_of, train_quick_model


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _saturated_file(tmp_path, sample_data_dir) -> Path:
    """new_patient_02 with 5% of FSC-A at the ceiling and a time channel whose rate halves in bin 6."""
    s = read_fcs(sample_data_dir / "new" / "new_patient_02.fcs")
    events = np.array(s.events, dtype=np.float32)
    events[:600, 0] = 262143.0
    n = s.n_events
    counts = [1250] * 5 + [250] + [1250] * 3 + [n - 8 * 1250 - 250]
    time = np.concatenate([np.linspace(k, k + 0.999, c) for k, c in enumerate(counts)]).astype(np.float32)
    keywords = {k: v for k, v in s.keywords.items() if k.upper().startswith(("$SPILLOVER", "$CYT"))}
    path = tmp_path / "saturated.fcs"
    write_fcs(path, np.c_[events, time], s.pnn + ["Time"], s.pns + [""], keywords)
    return path


def test_qc_flags_shown_on_load_and_compensation_matrix_by_marker(library, tmp_path, sample_data_dir):
    path = _saturated_file(tmp_path, sample_data_dir)
    at = start()
    at.file_uploader(key="uploads").set_value([
        ("saturated.fcs", path.read_bytes(), "application/octet-stream"),
        ("patient_03.fcs", (sample_data_dir / "patient_03.fcs").read_bytes(), "application/octet-stream")])
    at.run()
    assert not at.exception
    warnings = [w.value for w in at.warning if w.value.startswith("**QC")]
    assert len(warnings) == 1                                   # patient_03 is clean
    assert any("channel names differ" in w.value for w in at.warning)   # Time is in one file only
    assert warnings[0].startswith("**QC: saturated**")
    assert "FSC-A: 600 events (5.0%) at the top of the range (>= $PnR - 1)" in warnings[0]
    assert "event rate: time bin 6 of 10 holds 250 events, 20% of the median bin" in warnings[0]
    summary = frame_with(at, "QC flags").set_index("patient")
    assert summary.loc["saturated", "QC flags"] == 2 and summary.loc["patient_03", "QC flags"] == 0
    assert summary.loc["saturated", "saturated channels"] == "FSC-A (5.0%)"
    assert summary.loc["saturated", "time drift"].startswith("event rate: time bin 6")
    assert summary.loc["patient_03", "time drift"] == "not checked"
    assert summary.loc["patient_03", "compensation"] == "7 x 7 spillover matrix from keyword $SPILLOVER, applied"
    # the expander: the matrix, rows and columns named by marker (detector)
    at.selectbox(key="qc_patient").set_value("patient_03")
    at.run()
    sample = read_fcs(sample_data_dir / "patient_03.fcs")
    matrix = next(d.value for d in at.dataframe if d.value.shape == sample.spillover.shape)
    labels = [sample.channels[sample.channel_index(c)].label for c in sample.spillover_channels]
    assert list(matrix.index) == labels == list(matrix.columns)
    assert labels[0] == "CD3 (FL1-A)"
    np.testing.assert_array_equal(matrix.to_numpy(), sample.spillover)
    assert any("7 x 7 spillover matrix from keyword $SPILLOVER, applied" in m.value for m in at.markdown)
    at.selectbox(key="qc_patient").set_value("saturated")
    at.run()
    saturation = frame_with(at, "% saturated").set_index("label")
    assert saturation.loc["FSC-A", "saturated"] == 600
    assert any("events per time bin 1,250, 1,250, 1,250, 1,250, 1,250, 250" in m.value for m in at.markdown)


def test_sample_data_loads_without_qc_warnings(library):
    at = start()
    at.button[0].click()
    at.run()
    assert not at.exception and not at.warning
    summary = frame_with(at, "QC flags")
    assert (summary["QC flags"] == 0).all() and len(summary) == 11
    assert (summary["compensation"] == "7 x 7 spillover matrix from keyword $SPILLOVER, applied").all()
    # after a restart the library's patients are read lazily: checked on demand, not all at once
    again = start()
    store = store_of(again)
    assert not any("QC flags" in d.value.columns for d in again.dataframe)   # none read when the table was built
    # the first patient is read for the details below, so it is not listed as unchecked
    assert any(c.value.startswith("Not read yet from the library, so not checked: patient_02, patient_03")
               for c in again.caption)
    # only the first patient was read (the channel list and the details expander show it)
    assert [n for n, p in store.patients.items() if p._sample is not None] == ["patient_01"]
    again.selectbox(key="qc_patient").set_value("new_patient_03")
    again.run()
    assert not again.exception
    (unread,) = [c.value for c in again.caption if c.value.startswith("Not read yet from the library")]
    assert "new_patient_03" not in unread
    saturation = frame_with(again, "% saturated").set_index("label")
    assert saturation.loc["FSC-A", "saturated"] == 31           # 0.26%: counted, not flagged
    assert not saturation["flagged"].any()


# ------------------------------------------------------------------------------------ Auto-gate

@pytest.fixture
def gated(library, sample_data_dir):
    """Sample data, a model trained on three patients (one carries a gate tree), new_patient_02 auto-gated."""
    pytest.importorskip("gating_core.model")
    from gating_core.gates import panel_scale
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels
    at = start()
    at.button[0].click()
    at.run()
    store = store_of(at)
    record = store.patients["patient_01"]
    scales = {c: panel_scale(c, [record.sample]) for c in record.sample.pnn}
    store.save_gates("patient_01", tree_from_labels(record.sample, record.labels, SAMPLE_DATA_HIERARCHY, scales))
    at = train_quick_model(at)
    assert not at.exception
    at = goto(at, "pages/5_autogate.py")
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_02"])
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    return at


def test_batch_table_and_report_downloads(gated):
    at = gated
    from gating_core.gates.autogates import counted_cells
    from ui import exports

    store = store_of(at)
    record = store.patients["new_patient_02"]
    assert record.autogates is not None                       # gates fitted from patient_01's tree
    tree = GateTree.from_dict(record.autogates["tree"])
    tree_masks = tree.memberships(record.sample)
    populations = np.asarray(record.populations).astype(str)
    counted = counted_cells(tree, populations, tree_masks, record.autogates["populations"])
    labels = [b.label for b in at.get("download_button")]
    assert "Batch table (CSV, 1 patients)" in labels and "Report of new_patient_02 (HTML)" in labels
    # the batch table the CSV download serves: the auto-gates, each under its parent gate,
    # counted from the cells' populations (a gate named like a population: exactly its cells)
    batch = pd.read_csv(io.BytesIO(exports.batch_csv([record])))
    assert batch["patient"].unique().tolist() == ["new_patient_02"]
    rows = batch.set_index("population")
    assert list(rows.index[:len(tree)]) == tree.names
    assert {g: rows.loc[g, "count"] for g in tree.names} == {g: int(m.sum()) for g, m in counted.items()}
    for leaf in tree.leaves():
        assert rows.loc[leaf.name, "count"] == (populations == leaf.name).sum()
    assert rows.loc["CD4 T cells", "parent"] == "T cells"
    assert rows.loc["CD4 T cells", "% of parent"] == pytest.approx(
        100 * counted["CD4 T cells"].sum() / counted["T cells"].sum())
    assert rows["source"].iloc[0].startswith("auto-gate (marginal, 3 patients")
    confidence = np.asarray(record.result.confidence, dtype=float)
    assert rows.loc["B cells", "mean confidence"] == pytest.approx(confidence[populations == "B cells"].mean())
    shown = frame_with(at, "counted by")
    assert shown.set_index("population")["count"].to_dict() == rows["count"].to_dict()
    # with the labeled patients: every patient counted from its labels
    at.checkbox(key="rp_labeled").check()
    at.run()
    assert not at.exception
    table = frame_with(at, "counted by")
    assert table["patient"].unique().tolist()[0] == "new_patient_02"
    assert set(table["patient"]) == {"new_patient_02"} | set(store.labeled())
    p08 = table[table["patient"] == "patient_08"]
    truth = pd.Series(store.patients["patient_08"].labels.astype(str)).value_counts()
    assert p08.set_index("population")["count"].to_dict() == truth.to_dict()
    assert (p08["counted by"] == "labels").all()
    p01 = table[table["patient"] == "patient_01"].set_index("population")
    p01_truth = pd.Series(store.patients["patient_01"].labels.astype(str)).value_counts()
    assert {p: p01.loc[p, "count"] for p in p01_truth.index} == p01_truth.to_dict()
    # the report: the patient's name, its counts, novelty and confidence, one plot per parent
    html = exports.patient_report(record).decode("utf-8")
    assert "<h1>new_patient_02</h1>" in html
    for gate, mask in counted.items():
        assert f"<td>{gate}</td>" in html and f"<td>{int(mask.sum()):,}</td>" in html
    novelty = record.result.novelty
    assert f"novelty score {novelty.score:.2f} (threshold {novelty.threshold:.2f})" in html
    assert f"Mean confidence {confidence.mean():.3f}" in html
    assert "7 x 7 spillover matrix from keyword $SPILLOVER, applied" in html
    assert html.count("<svg") == 5 and "<script" not in html
