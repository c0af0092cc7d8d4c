"""Streamlit AppTest flows through every page: data, explore, gate, train, auto-gate, export."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from gating_core.fcs import read_fcs, write_fcs
from gating_core.gates import GateTree
from apptest_helpers import finish_jobs, goto, reload, start, store_of, train_quick_model


def load_sample_data(at: AppTest) -> AppTest:
    at.button[0].click()
    at.run()
    assert not at.exception
    return at


def patients_table(at: AppTest) -> pd.DataFrame:
    return at.dataframe[0].value.set_index("patient")


def plotly_spec(at: AppTest, index=0) -> dict:
    return json.loads(at.get("plotly_chart")[index].proto.spec)


# ------------------------------------------------------------------------------------ Data

def test_sample_data_button_lists_patients_with_counts(library, sample_data_dir):
    at = load_sample_data(start())
    table = patients_table(at)
    fcs = sorted(p.stem for p in sample_data_dir.glob("*.fcs")) + sorted(p.stem for p in (sample_data_dir / "new").glob("*.fcs"))
    assert sorted(table.index) == sorted(fcs)
    assert (table.loc[[n for n in table.index if n.startswith("patient_")], "status"] == "historical (labeled)").all()
    assert (table.loc[[n for n in table.index if n.startswith("new_")], "status"] == "new").all()
    sample = read_fcs(sample_data_dir / "patient_01.fcs")
    assert table.loc["patient_01", "events"] == sample.n_events
    assert table.loc["patient_01", "channels"] == len(sample.channels)
    counts = pd.read_csv(sample_data_dir / "patient_01.labels.csv")["population"].value_counts()
    top, n = counts.index[0], counts.iloc[0]
    assert table.loc["patient_01", "populations (count)"].startswith(f"{top} {n:,}")
    assert any("share the same" in m.value for m in at.success)


def test_upload_several_files_bad_one_reported_in_place(library, tmp_path, sample_data_dir):
    at = start()
    good = (sample_data_dir / "new" / "new_patient_02.fcs").read_bytes()
    labeled = (sample_data_dir / "patient_03.fcs").read_bytes()
    labels = (sample_data_dir / "patient_03.labels.csv").read_bytes()
    at.file_uploader(key="uploads").set_value([
        ("new_patient_02.fcs", good, "application/octet-stream"),
        ("patient_03.fcs", labeled, "application/octet-stream"),
        ("patient_03.labels.csv", labels, "text/csv"),
        ("scan.fcs", b"FCS3.0    garbage that is not an FCS file", "application/octet-stream"),
        ("truncated.labels.csv", b"population\nB cells\n", "text/csv"),
    ])
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 2
    assert any(e.startswith("scan.fcs: ") for e in errors)
    assert any("truncated.labels.csv" in e for e in errors)
    table = patients_table(at)
    assert sorted(table.index) == ["new_patient_02", "patient_03"]
    assert "**new_patient_02**: 12,000 events, 9 channels, new" in at.success[0].value
    assert table.loc["patient_03", "status"] == "historical (labeled)"
    assert table.loc["new_patient_02", "events"] == read_fcs(sample_data_dir / "new" / "new_patient_02.fcs").n_events
    # the session carries on: the other pages work
    goto(at, "pages/2_explore.py")


def test_an_upload_error_stays_while_its_file_sits_in_the_uploader():
    from types import SimpleNamespace

    from ui.loading import keep_upload_errors, upload_errors_shown

    store = SimpleNamespace(upload_errors={})
    first = SimpleNamespace(errors=[("scan.fcs", "scan.fcs: not an FCS file")])
    keep_upload_errors(store, first, [("id-1", "scan.fcs"), ("id-2", "good.fcs")])
    assert first.errors == []
    assert upload_errors_shown(store, ["id-1", "id-2"]) == [("scan.fcs", "scan.fcs: not an FCS file")]
    # a later upload: its own errors join the earlier ones, in upload order; one naming none of
    # its files stays with the report
    second = SimpleNamespace(errors=[("bad.labels.csv", "bad.labels.csv: no population column"),
                                     ("elsewhere.fcs", "elsewhere.fcs: missing")])
    keep_upload_errors(store, second, [("id-3", "bad.labels.csv"), ("id-4", "bad.labels.csv")])
    assert second.errors == [("elsewhere.fcs", "elsewhere.fcs: missing")]
    shown = upload_errors_shown(store, ["id-1", "id-2", "id-3", "id-4"])
    assert [name for name, _ in shown] == ["scan.fcs", "bad.labels.csv", "bad.labels.csv"]
    # the user takes scan.fcs and one of the two same-named files out of the uploader
    assert upload_errors_shown(store, ["id-2", "id-4"]) == [("bad.labels.csv", "bad.labels.csv: no population column")]
    assert set(store.upload_errors) == {"id-4"}
    assert upload_errors_shown(store, []) == [] and store.upload_errors == {}


def test_mismatched_channel_names_are_shown_and_matched(library, tmp_path, sample_data_dir):
    s = read_fcs(sample_data_dir / "patient_01.fcs")
    renamed = [("CD3-FITC" if c == "FL1-A" else c) for c in s.pnn]
    path = tmp_path / "other.fcs"
    write_fcs(path, s.events, renamed)
    at = start()
    at.file_uploader(key="uploads").set_value([
        ("patient_01.fcs", (sample_data_dir / "patient_01.fcs").read_bytes(), "application/octet-stream"),
        ("other.fcs", path.read_bytes(), "application/octet-stream")])
    at.run()
    assert "channel names differ" in at.warning[0].value
    mismatch = at.dataframe[1].value
    assert sorted(mismatch.index) == ["CD3 (FL1-A)", "CD3-FITC"]  # marker with detector, once
    at.selectbox(key="rename_patient").set_value("other")
    at.run()
    at.selectbox(key="rename_from").set_value("CD3-FITC")
    at.selectbox(key="rename_to").set_value("FL1-A")
    at.button(key="rename_button").click()
    at.run()
    assert not at.exception
    assert store_of(at).patients["other"].sample.pnn == s.pnn
    assert any("share the same" in m.value for m in at.success)
    assert store_of(start()).patients["other"].channel_names == s.pnn  # kept in the library


# ------------------------------------------------------------------------------------ Explore

def test_explore_density_counts_all_events_and_population_view(library):
    at = load_sample_data(start())
    at = goto(at, "pages/2_explore.py")
    store = store_of(at)
    chosen = at.multiselect(key="explore_patients").value
    assert len(chosen) == 3
    spec = plotly_spec(at)
    heatmaps = [t for t in spec["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3
    # the colorbar ticks read in events; axes ticks are raw units
    assert spec["layout"]["xaxis"]["ticktext"][:2] == ["0", "50K"]  # FSC-A linear, ticks in raw units
    at.selectbox(key="ex_xs_FSC-A").set_value("arcsinh")
    at.radio(key="ex_mode").set_value("population")
    at.run()
    assert not at.exception
    assert not [c.value for c in at.caption if "holds channel numbers" in c.value]  # linear intensities
    spec = plotly_spec(at)
    assert [t["type"] for t in spec["data"]].count("image") == 3  # every event binned, one image per patient
    counts = at.dataframe[0].value
    for name in chosen:
        expected = pd.Series(store.patients[name].labels).value_counts()
        assert counts[name].loc[expected.index].tolist() == expected.tolist()
    # The population view colours the scatter only: the histogram section below stays, one curve
    # of all events per chosen patient.
    assert "Overlaid histograms" in [s.value for s in at.subheader]
    histogram = plotly_spec(at, 1)
    assert all(t["type"] == "scatter" and t["mode"] == "lines" for t in histogram["data"])
    assert sorted(t["name"] for t in histogram["data"]) == sorted(chosen)


# ------------------------------------------------------------------------------------ Gate

def test_gate_nested_rectangles_stats_undo_copy_labels_and_persist(library):
    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    at.selectbox(key="gate_patient").set_value("new_patient_01")
    at.run()
    sample = store_of(at).patients["new_patient_01"].sample
    # Gate 1 on FSC-A / SSC-A, linear axes, raw units
    assert at.selectbox(key="g_xs_FSC-A").value == "linear"  # scatter channels start linear
    assert at.selectbox(key="g_ys_SSC-A").value == "linear"
    at.text_input(key="gate_name").input("Cells")
    at.number_input(key="rect_new_patient_01_FSC-A_from").set_value(40000.0)
    at.number_input(key="rect_new_patient_01_FSC-A_to").set_value(250000.0)
    at.number_input(key="rect_new_patient_01_SSC-A_y_from").set_value(0.0)
    at.number_input(key="rect_new_patient_01_SSC-A_y_to").set_value(150000.0)
    at.button(key="add_rect").click()
    at.run()
    assert not at.exception and not at.error
    fsc, ssc = sample.events[:, sample.channel_index("FSC-A")], sample.events[:, sample.channel_index("SSC-A")]
    cells = (fsc >= 40000) & (fsc <= 250000) & (ssc >= 0) & (ssc <= 150000)
    stats = at.dataframe[0].value.set_index("gate")
    assert stats.loc["Cells", "count"] == cells.sum()
    # Gate 2 nested in Cells, on arcsinh-transformed FL1-A (CD3) / FL3-A (CD4)
    at.selectbox(key="gate_parent").set_value("Cells")
    at.selectbox(key="g_x").set_value("FL1-A")
    at.selectbox(key="g_y").set_value("FL3-A")
    at.run()
    assert at.selectbox(key="g_xs_FL1-A").value == "arcsinh"  # fluorescence starts arcsinh
    assert at.selectbox(key="g_ys_FL3-A").value == "arcsinh"
    at.text_input(key="gate_name").input("CD3+")
    at.number_input(key="rect_new_patient_01_FL1-A_from").set_value(1000.0)
    at.number_input(key="rect_new_patient_01_FL1-A_to").set_value(1e6)
    at.number_input(key="rect_new_patient_01_FL3-A_y_from").set_value(-1e6)
    at.number_input(key="rect_new_patient_01_FL3-A_y_to").set_value(1e6)
    at.button(key="add_rect").click()
    at.run()
    assert not at.exception and not at.error
    cd3 = sample.events[:, sample.channel_index("FL1-A")]
    expected_cd3 = cells & (cd3 >= 1000 * (1 - 1e-9)) & (cd3 <= 1e6)
    stats = at.dataframe[0].value
    assert list(stats.columns) == ["gate", "count", "% of parent", "% of total", "parent", "axes"]
    row = stats[stats["gate"].str.contains("CD3")].iloc[0]
    assert row["parent"] == "Cells"
    assert abs(row["count"] - expected_cd3.sum()) <= 1  # the edge value is transformed and back
    assert row["% of parent"] == pytest.approx(100 * row["count"] / cells.sum())
    # undo removes CD3+, the gate tree stays consistent
    at.button(key="undo_gate").click()
    at.run()
    assert list(at.dataframe[0].value["gate"]) == ["Cells"]
    # copy to another patient, then turn gates into labels
    at.multiselect(key="copy_targets").set_value(["new_patient_02"])
    at.run()
    at.button(key="copy_tree").click()
    at.run()
    assert "Copied 1 gates to new_patient_02" in at.success[0].value
    at.button(key="gates_to_labels_new_patient_01").click()
    at.run()
    at.button(key="gates_to_labels_new_patient_01_confirm").click()
    at.run()
    store = store_of(at)
    labels = store.patients["new_patient_01"].labels
    assert (labels == "Cells").sum() == cells.sum() and (labels == "other").sum() == (~cells).sum()
    assert store.patients["new_patient_02"].gate_tree.names == ["Cells"]
    # a new session (page reload) finds gates and labels in the library
    again = goto(start(), "pages/3_gate.py")
    again.selectbox(key="gate_patient").set_value("new_patient_02")
    again.run()
    assert list(again.dataframe[0].value["gate"]) == ["Cells"]
    reloaded = store_of(again).patients["new_patient_01"]
    assert reloaded.label_source == "gates drawn"
    np.testing.assert_array_equal(reloaded.labels.astype(str), labels.astype(str))


def test_gate_from_a_lasso_selection(library):
    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    store = store_of(at)
    record = store.patients["patient_01"]
    # What the chart reports for a lasso: its path in display coordinates of the current axes.
    spec = plotly_spec(at)
    x_range, y_range = spec["layout"]["xaxis"]["range"], spec["layout"]["yaxis"]["range"]
    xm, ym = np.mean(x_range), np.mean(y_range)
    at.session_state["pending_shape"] = {
        "kind": "polygon", "vertices": [(x_range[0], y_range[0]), (xm, y_range[0]), (xm, ym), (x_range[0], ym)],
        "patient": "patient_01", "x": "FSC-A", "y": "SSC-A", "parent": None,
        "x_scale": store_scale(at, "FSC-A"), "y_scale": store_scale(at, "SSC-A")}
    at.run()
    assert "Selection: **polygon**" in " ".join(m.value for m in at.markdown)
    at.text_input(key="gate_name").input("Lower left")
    at.button(key="add_gate").click()
    at.run()
    assert not at.exception and not at.error
    tree = record.gate_tree
    assert tree.names == ["Lower left"] and tree["Lower left"].kind == "polygon"
    assert at.dataframe[0].value.iloc[0]["count"] == tree.memberships(record.sample)["Lower left"].sum() > 0


def store_scale(at, channel):
    """The scale the Gate page draws ``channel`` on: the panel's (scatter channels linear)."""
    return store_of(at).panel_transform(channel).to_dict()


# ------------------------------------------------------------------------------------ Train + Auto-gate + Export

@pytest.fixture
def trained(library):
    pytest.importorskip("gating_core.model")
    at = train_quick_model(load_sample_data(start()))
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success and at.success[0].value.startswith("Trained")
    return at


def test_train_lopo_autogate_correct_accept_export(trained, sample_data_dir):
    at = trained
    store = store_of(at)
    model = store.model()
    assert store.current_model.startswith("marginal, 3 patients")
    assert "other" in list(map(str, model.populations_)) or len(model.populations_) >= 7
    # a patient measured with a gross instrument shift, beside the three new patients
    from gating_core.fcs import Sample

    base = read_fcs(sample_data_dir / "new" / "new_patient_02.fcs", compensate=True)
    store.add_patient("drifted", Sample("drifted", base.events * 3, base.channels, compensated=True))
    at = goto(at, "pages/5_autogate.py")
    assert at.multiselect(key=f"ag_targets_{store.current_model}").value == [
        "new_patient_01", "new_patient_02", "new_patient_03", "drifted"]
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    record = store.patients["new_patient_01"]
    result = record.result
    assert result.populations.shape == (record.n_events,)
    truth = pd.read_csv(sample_data_dir / "truth" / "new_patient_01.labels.csv")["population"].to_numpy()
    assert np.mean(result.populations.astype(str) == truth) > 0.8
    # novelty: the drifted patient is flagged on screen, a typical one is not
    at.selectbox(key="ag_patient").set_value("drifted")
    at.run()
    assert store.patients["drifted"].result.novelty.is_novel
    assert any("drifted is unlike the training patients" in w.value for w in at.warning)
    # the list of gated patients puts the one to review first on top, with its reason
    worklist = at.table[0].value
    assert list(worklist.index)[0] == "drifted" and worklist.loc["drifted", "review"].startswith("unlike")
    assert set(worklist.index) == {"new_patient_01", "new_patient_02", "new_patient_03", "drifted"}
    shown = store.patients["new_patient_01"].result.novelty.disagreement
    assert worklist.loc["new_patient_01", "parts disagree on"] == f"{shown:.1%}"
    # a new session lists them as stored in the library
    fresh = start()
    assert store_of(fresh).patients["drifted"].result_novelty["is_novel"]  # read without the result
    assert store_of(fresh).patients["drifted"].result is None
    assert goto(fresh, "pages/5_autogate.py").table[0].value.equals(worklist)
    at.selectbox(key="ag_patient").set_value("new_patient_01")
    at.run()
    assert not result.novelty.is_novel
    assert not at.warning and "resembles the training patients" in at.success[0].value
    # the parts' disagreement, measured and below the review threshold, said beside it
    disagreement = result.novelty.disagreement
    assert disagreement is not None and not result.novelty.parts_disagree
    assert f"different populations for {disagreement:.1%} of its cells (review above 20%)" in at.success[0].value
    # the download area says how many keywords the FCS download leaves out ($CYTSN, $DATE, $SRC,
    # $FIL, $COM and SIM_CONDITION of the sample data), not which
    assert any("The FCS download leaves out 6 keywords" in c.value for c in at.caption)
    stats = at.dataframe[0].value.set_index("population")
    counts = pd.Series(result.populations.astype(str)).value_counts()
    assert stats["count"].to_dict() == counts.to_dict()
    assert stats["% of total"].sum() == pytest.approx(100.0)
    # export: the gated CSV the download button serves
    from gating_core.io.export import read_gated_csv
    from ui import exports

    path = Path(store.work_dir) / "check.gated.csv"
    path.write_bytes(exports.gated_csv(record.populations_token, record, store.work_dir))
    exported, populations, confidence = read_gated_csv(path)
    assert exported.n_events == record.n_events
    np.testing.assert_array_equal(populations.astype(str), result.populations.astype(str))
    assert set(populations) <= set(map(str, model.populations_))
    np.testing.assert_allclose(confidence, result.confidence, atol=1e-6)
    archive = zipfile.ZipFile(io.BytesIO(exports.all_as_zip([store.patients[n] for n in
                                                           ("new_patient_01", "new_patient_02")], store.work_dir)))
    assert sorted(archive.namelist()) == ["new_patient_01.gated.csv", "new_patient_02.gated.csv", "statistics.csv"]
    stats_csv = pd.read_csv(archive.open("statistics.csv"))
    assert stats_csv.groupby("patient")["count"].sum().to_dict() == {
        "new_patient_01": record.n_events, "new_patient_02": store.patients["new_patient_02"].n_events}
    # correct: reassign the cells of a box to one population, then accept
    at.session_state  # the chart selection is what the browser test drives; here we correct directly
    target = str(model.populations_[0])
    corrected = result.populations.astype(object).copy()
    corrected[:10] = target
    store.correct("new_patient_01", corrected, np.ones(record.n_events))
    at.run()
    at.button(key="ag_accept_new_patient_01").click()
    at.run()
    at.button(key="ag_accept_new_patient_01_confirm").click()
    at.run()
    assert not at.exception
    assert store.patients["new_patient_01"].is_labeled
    # after a reload, the model, the results and the acceptance are still there
    again = start()
    new_store = store_of(again)
    assert new_store.current_model == store.current_model
    assert new_store.patients["new_patient_01"].label_source == "auto-gate (reviewed)"
    np.testing.assert_array_equal(new_store.patients["new_patient_01"].labels.astype(str), corrected.astype(str))
    again = goto(again, "pages/5_autogate.py")
    assert "new_patient_02" in again.selectbox(key="ag_patient").options


def test_leave_one_patient_out_table_marks_the_worst_patient(trained):
    pytest.importorskip("gating_core.evaluation.protocols")
    at = trained
    store = store_of(at)
    at.button(key="lopo_button").click()
    at.run()
    finish_jobs(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    table = store.evaluation
    assert sorted(table["patient"].unique()) == ["patient_01", "patient_02", "patient_03"]
    assert set(table["method"]) == {"marginal", "pooling", "lda"}
    assert table["accuracy"].between(0, 1).all() and table["macro_f1"].between(0, 1).all()
    scores = table[table["method"] == "marginal"].set_index("patient")["macro_f1"]
    from ui.app_state import worst_patient_note

    kind, message, _ = worst_patient_note(scores, "macro-F1 (marginal)")
    assert any(e.value == message for e in getattr(at, kind))
    spec = plotly_spec(at)
    assert [t["name"] for t in spec["data"]] == ["marginal", "pooling", "lda"]
    assert spec["data"][0]["x"] == ["patient_01", "patient_02", "patient_03"]  # the table's order
    # the check ran as a background job and left its table in the library: a reload shows it
    again = goto(start(), "pages/4_train.py")
    pd.testing.assert_frame_equal(store_of(again).evaluation.reset_index(drop=True)[list(table.columns)],
                                  table.reset_index(drop=True), check_dtype=False)
    assert any(message in m.value for m in [*again.warning, *again.success])
    # ... stored with what it was run on: the current model's patients and settings
    assert any("run on the current model's patients" in c.value for c in again.caption)


def test_model_save_and_load_round_trip_in_the_app(trained, tmp_path):
    from ui.models import load_model_bytes, model_bytes

    store = store_of(trained)
    model = store.model()
    data = model_bytes(model, tmp_path)
    assert data[:2] == b"PK"  # a zip (.npz), not a pickle
    loaded = load_model_bytes(data, tmp_path)
    sample = store.patients["new_patient_02"].sample
    np.testing.assert_array_equal(loaded.predict(sample), model.predict(sample))
    at = goto(trained, "pages/4_train.py")
    at.file_uploader(key="model_upload").set_value(("evil.npz", b"\x80\x04not a model", "application/octet-stream"))
    at.run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("evil.npz: ")


def test_flowjo_workspace_uploaded_with_its_fcs_labels_the_patient(library, tmp_path, sample_data_dir):
    import flowkit

    fcs = sample_data_dir / "patient_05.fcs"
    raw = read_fcs(fcs)
    strategy = flowkit.GatingStrategy()
    dims = [flowkit.Dimension("FSC-A", range_min=40000, range_max=200000),
            flowkit.Dimension("SSC-A", range_min=0, range_max=60000)]
    strategy.add_gate(flowkit.gates.RectangleGate("Mononuclear", dims), ("root",))
    session = flowkit.Session(gating_strategy=strategy, fcs_samples=[
        flowkit.Sample(raw.events.astype(float), sample_id="patient_05.fcs", channel_labels=raw.pnn)])
    wsp = tmp_path / "expert.wsp"
    with open(wsp, "wb") as handle:
        session.export_wsp(handle, "All Samples")
    at = start()
    at.file_uploader(key="uploads").set_value([
        ("patient_05.fcs", fcs.read_bytes(), "application/octet-stream"),
        ("expert.wsp", wsp.read_bytes(), "application/xml")])
    at.run()
    assert not at.exception and not at.error
    table = patients_table(at)
    assert table.loc["patient_05", "labels from"] == "FlowJo workspace"
    fsc, ssc = raw.events[:, raw.channel_index("FSC-A")], raw.events[:, raw.channel_index("SSC-A")]
    inside = int(((fsc >= 40000) & (fsc <= 200000) & (ssc >= 0) & (ssc <= 60000)).sum())
    assert table.loc["patient_05", "populations (count)"].startswith(
        f"Mononuclear {inside:,} · other {raw.n_events - inside:,}" if inside >= raw.n_events / 2
        else f"other {raw.n_events - inside:,} · Mononuclear {inside:,}")


# ------------------------------------------------------------ Channel names, confirmations, background jobs

def sidebar_text(at: AppTest) -> str:
    """The sidebar's session status. (AppTest drops sidebar elements drawn before the page on
    reruns; the status a page redraws after changing the session is what this reads.)"""
    return " ".join(m.value for m in at.sidebar.markdown)


def test_channel_label_shows_marker_with_detector_once():
    from gating_core.reports.plotting import channel_label

    assert channel_label("FL3-A", "CD4") == "CD4 (FL3-A)"
    assert channel_label("FL3-A", "") == "FL3-A"
    assert channel_label("FL3-A", None) == "FL3-A"
    assert channel_label("CD4", "cd4") == "CD4"
    assert channel_label("FSC-HLin", "Forward Scatter (FSC-HLin)") == "Forward Scatter (FSC-HLin)"


def test_tables_name_channels_by_marker_with_detector(trained):
    at = goto(trained, "pages/1_data.py")
    with_markers = at.dataframe[1].value  # the channel list of the Data page
    assert "CD4 (FL3-A)" in list(with_markers["channel"]) and "FSC-A" in list(with_markers["channel"])
    at = goto(at, "pages/4_train.py")
    assert "Channels: FSC-A, SSC-A, CD3 (FL1-A)" in " ".join(m.value for m in at.markdown)
    at = goto(at, "pages/5_autogate.py")
    at.button(key="ag_run").click()
    at.run()
    stats = at.dataframe[0].value
    assert "median CD4 (FL3-A)" in stats.columns and "median FL3-A" not in stats.columns
    assert not [c for c in stats.columns if c.count("FL3-A") > 1]


def test_gate_tree_axes_named_by_marker(library):
    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    at.selectbox(key="g_x").set_value("FL1-A")
    at.selectbox(key="g_y").set_value("FL3-A")
    at.run()
    at.text_input(key="gate_name").input("CD3+")
    at.number_input(key="rect_patient_01_FL1-A_from").set_value(1000.0)
    at.button(key="add_rect").click()
    at.run()
    assert at.dataframe[0].value.iloc[0]["axes"] == "CD3 (FL1-A) / CD4 (FL3-A)"


def test_transform_is_decided_once_per_panel_and_copied_gates_are_drawn(library, sample_data_dir):
    from gating_core.gates import suggest_scale

    # The defect: a cofactor chosen from each patient's own values differs between patients.
    p01 = read_fcs(sample_data_dir / "patient_01.fcs", compensate=True)
    n03 = read_fcs(sample_data_dir / "new" / "new_patient_03.fcs", compensate=True)
    cd4 = lambda s: s.events[:, s.channel_index("FL3-A")]  # noqa: E731
    assert suggest_scale("arcsinh", cd4(p01)).cofactor != suggest_scale("arcsinh", cd4(n03)).cofactor

    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    store = store_of(at)
    at.selectbox(key="g_x").set_value("FL1-A")
    at.selectbox(key="g_y").set_value("FL3-A")
    at.run()
    spec = plotly_spec(at)
    at.text_input(key="gate_name").input("CD4+")
    at.number_input(key="rect_patient_01_FL3-A_y_from").set_value(2000.0)
    at.button(key="add_rect").click()
    at.run()
    gate = store.patients["patient_01"].gate_tree["CD4+"]
    assert gate.y_scale.kind == "arcsinh" and gate.y_scale.cofactor == 150.0  # flow panel: 150, not 5
    at.multiselect(key="copy_targets").set_value(["new_patient_03"])
    at.run()
    at.button(key="copy_tree").click()
    at.run()
    # new_patient_03 is drawn on the same axes as patient_01, with the copied gate on them
    at.selectbox(key="gate_patient").set_value("new_patient_03")
    at.run()
    assert not at.exception
    spec_03 = plotly_spec(at)
    assert spec_03["layout"]["yaxis"]["tickvals"] == spec["layout"]["yaxis"]["tickvals"] or \
        spec_03["layout"]["yaxis"]["ticktext"][:3] == spec["layout"]["yaxis"]["ticktext"][:3]
    shapes = spec_03["layout"].get("shapes", [])
    assert len(shapes) == 1 and shapes[0]["type"] == "rect"
    assert [a["text"] for a in spec_03["layout"]["annotations"] if "CD4+" in a["text"]] == ["<b>CD4+</b>"]
    y_lo = shapes[0]["y0"]
    assert y_lo == pytest.approx(np.arcsinh(2000.0 / 150.0))
    counts_before = int(store.patients["new_patient_03"].gate_tree.memberships(n03)["CD4+"].sum())
    (x0, y0), (x1, y1) = gate.vertices
    cd3 = n03.events[:, n03.channel_index("FL1-A")]
    raw_x, raw_y = gate.x_scale.inverse(np.array([x0, x1])), gate.y_scale.inverse(np.array([y0, y1]))
    expected = (cd3 >= raw_x[0]) & (cd3 <= raw_x[1]) & (cd4(n03) >= raw_y[0]) & (cd4(n03) <= raw_y[1])
    assert abs(counts_before - int(expected.sum())) <= 2 and counts_before > 100  # edges go through float32

    # The user sets CD4's cofactor for the whole panel; it is kept in the library.
    at.selectbox(key="g_tf_channel").set_value("FL3-A")
    at.run()
    at.number_input(key="g_tf_cofactor_FL3-A").set_value(500.0)
    at.button(key="g_tf_apply").click()
    at.run()
    assert not at.exception and store.panel_transform("FL3-A").cofactor == 500.0
    spec_500 = plotly_spec(at)
    # the gate drawn on cofactor 150 keeps its cells, and is drawn mapped onto the new axis
    (shape,) = spec_500["layout"]["shapes"]
    assert shape["type"] == "path"
    assert int(store.patients["new_patient_03"].gate_tree.memberships(n03)["CD4+"].sum()) == counts_before
    again = store_of(start())
    assert again.panel_transform("FL3-A").cofactor == 500.0
    assert again.panel_transform("FL1-A").cofactor == 150.0
    assert again.panel_transform("FSC-A").kind == "linear"


def test_gates_as_labels_asks_with_counts_and_can_be_undone(library, sample_data_dir):
    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    store = store_of(at)
    expert = pd.read_csv(sample_data_dir / "patient_01.labels.csv")["population"].to_numpy(str)
    at.text_input(key="gate_name").input("Cells")
    at.number_input(key="rect_patient_01_FSC-A_from").set_value(40000.0)
    at.button(key="add_rect").click()
    at.run()
    inside = store.patients["patient_01"].gate_tree.memberships(store.patients["patient_01"].sample)["Cells"]
    at.button(key="gates_to_labels_patient_01").click()
    at.run()
    # asked first: before/after counts per population, and the expert populations that would go
    change = at.dataframe[1].value.set_index("population")
    expert_counts = pd.Series(expert).value_counts()
    assert change.loc["CD4 T cells", "before"] == expert_counts["CD4 T cells"] == 2495
    assert change.loc["CD4 T cells", "after"] == 0
    assert change.loc["Cells", "before"] == 0 and change.loc["Cells", "after"] == inside.sum()
    assert change.loc["other", "after"] == (~inside).sum()
    assert any("B cells, CD4 T cells, CD8 T cells, Debris, Granulocytes, Monocytes, NK cells" in w.value for w in at.warning)
    np.testing.assert_array_equal(store.patients["patient_01"].labels.astype(str), expert)  # nothing changed yet
    at.button(key="gates_to_labels_patient_01_cancel").click()
    at.run()
    np.testing.assert_array_equal(store.patients["patient_01"].labels.astype(str), expert)
    at.button(key="gates_to_labels_patient_01").click()
    at.run()
    at.button(key="gates_to_labels_patient_01_confirm").click()
    at.run()
    assert not at.exception
    assert set(store.patients["patient_01"].labels) == {"Cells", "other"}

    # Training on it beside expert-labeled patients is refused unless the user insists.
    at = goto(at, "pages/4_train.py")
    assert any("patient_01" in e.value and "not like the others" in e.value for e in at.error)
    assert at.button(key="train_button").disabled
    at.checkbox(key="train_anyway").check()
    at.run()
    assert not at.button(key="train_button").disabled

    # Undo: the expert labels are an earlier version, restored in the app.
    at = goto(at, "pages/3_gate.py")
    versions = at.dataframe[1].value
    assert list(versions["from"]) == ["gates drawn in the app", "imported labels"]
    assert list(versions["current"]) == ["✓", ""]
    at.button(key="gate_versions_patient_01_restore").click()
    at.run()
    assert not at.exception
    np.testing.assert_array_equal(store.patients["patient_01"].labels.astype(str), expert)
    assert store.patients["patient_01"].label_source == "labels CSV"
    reloaded = store_of(start()).patients["patient_01"]
    np.testing.assert_array_equal(reloaded.labels.astype(str), expert)

    # patient_08 has no B cells (depleted): a warning, not a refusal
    at = goto(at, "pages/4_train.py")
    assert not at.error
    assert any("B cells**: none in patient_08" in w.value for w in at.warning)
    assert not at.button(key="train_button").disabled


def test_sample_data_twice_says_already_loaded(library):
    at = start()
    assert at.button[0].label == "Load sample data" and at.button[0].proto.type == "primary"
    at = load_sample_data(at)
    assert "11" in sidebar_text(at) and "**11** patients loaded" in sidebar_text(at)  # same run, not stale
    at = load_sample_data(at)
    assert not at.success or "Loaded" not in at.success[0].value
    notes = [m.value for m in at.info]
    assert any(n.startswith("Already in the library, not loaded again: patient_01, ") for n in notes)
    assert not any("not added" in n for n in notes)
    assert len(store_of(at).patients) == 11
    # beside loaded patients the button no longer draws the eye away from the uploader
    assert at.button[0].label == "Load sample data" and at.button[0].proto.type == "secondary"


def test_a_later_twin_of_a_loaded_patient_is_not_ticked_for_auto_gating(library, sample_data_dir):
    """The same file loaded twice under two names: Auto-gate ticks the first only (gating both
    would count that patient twice in a batch's statistics) and says why the other is not."""
    pytest.importorskip("gating_core.model")
    from ui.app_state import later_twins

    order = ["a", "b", "c", "d", "e"]
    twins = {"d": ["b", "e"], "e": ["b", "d"], "c": []}
    assert later_twins(["c", "d", "e"], order, twins) == {"d": "b", "e": "b"}
    assert later_twins(["b", "d"], order, {"b": ["d"], "d": ["b"]}) == {"d": "b"}
    assert later_twins(["a"], order, {}) == {}

    at = load_sample_data(start())
    data = (sample_data_dir / "new" / "new_patient_02.fcs").read_bytes()
    at.file_uploader(key="uploads").set_value([("p02 again.fcs", data, "application/octet-stream")])
    at.run()
    assert "p02_again" in store_of(at).patients
    at = train_quick_model(at)
    at = goto(at, "pages/5_autogate.py")
    model = store_of(at).current_model
    assert at.multiselect(key=f"ag_targets_{model}").value == ["new_patient_01", "new_patient_02", "new_patient_03"]
    assert [c.value for c in at.caption if c.value.startswith("p02_again")] == [
        "p02_again is not selected: it holds exactly the events of new_patient_02 (the same file loaded twice?)."]


def test_the_same_file_under_another_name_is_loaded_with_a_warning(library, sample_data_dir, monkeypatch):
    at = start()
    data = (sample_data_dir / "new" / "new_patient_02.fcs").read_bytes()
    other = (sample_data_dir / "new" / "new_patient_03.fcs").read_bytes()
    at.file_uploader(key="uploads").set_value([("new_patient_02.fcs", data, "application/octet-stream"),
                                               ("new_patient_03.fcs", other, "application/octet-stream")])
    at.run()
    assert not at.warning
    # files in the uploader: the sample data's button is quiet from the run that loads them
    assert at.button(key="load_sample_data").proto.type == "secondary"
    # renamed on the way (a browser's name with folders in it too): loaded, and said to be a twin
    at.file_uploader(key="uploads").set_value([("../copies/p02 again.fcs", data, "application/octet-stream")])
    at.run()
    store = store_of(at)
    assert sorted(store.patients) == ["new_patient_02", "new_patient_03", "p02_again"]
    (warning,) = [w.value for w in at.warning]
    assert warning.startswith("**p02_again** (../copies/p02 again.fcs) holds exactly the events of **new_patient_02**")
    assert store.same_events(["p02_again", "new_patient_03"]) == {"p02_again": ["new_patient_02"]}
    # the session's memory alone (no library) finds it from the events, each version of a
    # patient's events hashed once
    import hashlib

    import ui.store

    hashed = []

    def fingerprint(sample):
        hashed.append(sample.name)
        return hashlib.sha256(sample.events.tobytes()).hexdigest()

    monkeypatch.setattr(ui.store, "events_fingerprint", fingerprint)
    store.library = None
    assert store.same_events(["new_patient_02"]) == {"new_patient_02": ["p02_again"]}
    assert store.same_events(["p02_again"]) == {"p02_again": ["new_patient_02"]}
    assert len(hashed) == 3
    store.patients["new_patient_03"].token = "its events changed"
    assert store.same_events(["new_patient_03"]) == {} and len(hashed) == 4


def test_reupload_asks_replace_keep_both_or_skip(library, sample_data_dir):
    at = start()
    data = (sample_data_dir / "new" / "new_patient_02.fcs").read_bytes()
    other = (sample_data_dir / "new" / "new_patient_03.fcs").read_bytes()
    at.file_uploader(key="uploads").set_value([("new_patient_02.fcs", data, "application/octet-stream")])
    at.run()
    assert list(store_of(at).patients) == ["new_patient_02"]
    assert "**1** patients loaded" in sidebar_text(at)
    # the same name again: nothing happens until the user chooses
    at.file_uploader(key="uploads").set_value([("new_patient_02.fcs", other, "application/octet-stream")])
    at.run()
    assert list(store_of(at).patients) == ["new_patient_02"]
    assert any("have the name of a patient already loaded" in w.value for w in at.warning)
    assert at.button(key="clash_apply").disabled
    at.radio(key="clash_0_new_patient_02").set_value("keep both")
    at.run()
    at.button(key="clash_apply").click()
    at.run()
    store = store_of(at)
    assert list(store.patients) == ["new_patient_02", "new_patient_02_2"]
    assert store.patients["new_patient_02_2"].n_events == read_fcs(sample_data_dir / "new" / "new_patient_03.fcs").n_events
    # replace
    at.file_uploader(key="uploads").set_value([("new_patient_02.fcs", other, "application/octet-stream")])
    at.run()
    at.radio(key="clash_0_new_patient_02").set_value("replace")
    at.run()
    at.button(key="clash_apply").click()
    at.run()
    store = store_of(at)
    assert sorted(store.patients) == ["new_patient_02", "new_patient_02_2"]
    np.testing.assert_array_equal(store.patients["new_patient_02"].sample.events,
                                  read_fcs(sample_data_dir / "new" / "new_patient_03.fcs", compensate=True).events)
    # skip
    at.file_uploader(key="uploads").set_value([("new_patient_02.fcs", data, "application/octet-stream")])
    at.run()
    at.radio(key="clash_0_new_patient_02").set_value("skip")
    at.run()
    at.button(key="clash_apply").click()
    at.run()
    assert sorted(store_of(at).patients) == ["new_patient_02", "new_patient_02_2"]
    assert any("skipped" in m.value for m in at.info)
    assert sorted(store_of(start()).patients) == ["new_patient_02", "new_patient_02_2"]  # the library agrees


def test_remove_asks_before_deleting_from_the_library(library):
    at = load_sample_data(start())
    # nothing chosen to begin with, and nothing to remove
    assert at.selectbox(key="remove_patient").value is None and "remove_button" not in [b.key for b in at.button]
    at.selectbox(key="remove_patient").set_value("patient_02")
    at.run()
    at.button(key="remove_button").click()
    at.run()
    assert "patient_02" in store_of(at).patients
    assert any("Delete **patient_02** from the library?" in w.value for w in at.warning)
    at.button(key="remove_cancel").click()
    at.run()
    assert "patient_02" in store_of(at).patients and "patient_02" in store_of(start()).patients
    at.button(key="remove_button").click()
    at.run()
    at.button(key="remove_confirm").click()
    at.run()
    assert "patient_02" not in store_of(at).patients
    assert "patient_02" not in store_of(start()).patients


def test_typed_rectangle_numbers_follow_the_channel(library):
    at = load_sample_data(start())
    at = goto(at, "pages/3_gate.py")
    at.number_input(key="rect_patient_01_FSC-A_from").set_value(40000.0)
    at.run()
    at.selectbox(key="g_x").set_value("FL1-A")
    at.run()
    typed_for_fsc = 40000.0
    fl1_from = at.number_input(key="rect_patient_01_FL1-A_from").value
    assert fl1_from != typed_for_fsc and fl1_from < 0  # the FL1-A (arcsinh) axis starts below zero
    assert at.number_input(key="rect_patient_01_FL1-A_from").label == "CD3 (FL1-A) from"


def test_autogate_targets_compatible_patients_and_accept_asks(trained, sample_data_dir):
    from gating_core.fcs import Sample

    at = trained
    store = store_of(at)
    assert "Model: **marginal, 3 patients" in sidebar_text(at)  # the sidebar follows the training
    base = read_fcs(sample_data_dir / "new" / "new_patient_02.fcs", compensate=True)
    keep = [i for i, c in enumerate(base.channels) if c.pnn != "FL5-A"]
    store.add_patient("no_cd14", Sample("no_cd14", base.events[:, keep], [base.channels[i] for i in keep],
                                        compensated=True))
    store.add_patient("drifted", Sample("drifted", base.events * 3, base.channels, compensated=True))
    at = goto(at, "pages/5_autogate.py")
    targets = at.multiselect(key=f"ag_targets_{store.current_model}")
    assert targets.value == ["new_patient_01", "new_patient_02", "new_patient_03", "drifted"]
    assert any("no_cd14 is not selected: it lacks FL5-A" in c.value for c in at.caption)
    # chosen by hand anyway: a warning that it cannot be gated, not "is not selected"
    chosen = list(targets.value)
    targets.set_value(chosen + ["no_cd14"])
    at.run()
    assert any("no_cd14 lacks FL5-A" in w.value and "cannot be gated" in w.value for w in at.warning)
    assert not any("no_cd14 is not selected" in c.value for c in at.caption)
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(chosen)
    at.run()
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    assert "Auto-gated: **4**" in sidebar_text(at)
    # accepting a novel patient needs a tick that it was reviewed
    at.selectbox(key="ag_patient").set_value("drifted")
    at.run()
    at.button(key="ag_accept_drifted").click()
    at.run()
    (change,) = [d.value.set_index("population") for d in at.dataframe if "after" in d.value.columns]
    counts = pd.Series(store.patients["drifted"].result.populations.astype(str)).value_counts()
    assert change["after"].to_dict() == counts.to_dict() and list(change.columns) == ["after"]
    assert "It has no labels yet: these become its labels." in [c.value for c in at.caption]
    assert at.button(key="ag_accept_drifted_confirm").disabled
    at.checkbox(key="ag_accept_drifted_ack").check()
    at.run()
    at.button(key="ag_accept_drifted_confirm").click()
    at.run()
    assert not at.exception and store.patients["drifted"].is_labeled
    assert at.button(key="ag_accept_drifted").disabled  # accepted: nothing left to accept
    assert "drifted" in store_of(start()).labeled()  # kept in the library


def test_training_runs_in_the_background_survives_a_reload_and_can_be_cancelled(library, monkeypatch, request):
    import threading

    from gating_core.library import PatientLibrary
    from gating_core.model import GatingModel
    from ui.jobs import CANCELLED, DONE, jobs_for

    # Each training holds after its first progress report until the test lets it go, so the
    # checks below see it running whatever the machine's speed, and the cancel arrives before
    # the fit's next report (no race with a training that finishes first).
    holds = [threading.Event(), threading.Event()]
    request.addfinalizer(lambda: [hold.set() for hold in holds])  # a failed test leaves no thread waiting
    calls = []
    original_fit = GatingModel.fit

    def held_fit(self, samples, labels, progress=None, groups=None):
        hold = holds[len(calls)]
        calls.append(hold)
        progress("Waiting for the test", 0.01)
        assert hold.wait(600)
        return original_fit(self, samples, labels, progress=progress, groups=groups)

    monkeypatch.setattr(GatingModel, "fit", held_fit)
    at = load_sample_data(start())
    at = goto(at, "pages/4_train.py")
    at.multiselect(key="train_patients").set_value(["patient_01", "patient_02", "patient_03"])
    at.run()
    at.button(key="train_button").click()
    at.run()
    (job,) = jobs_for(store_of(at).library_path, "train")
    assert job.running and at.button(key="train_button").disabled
    assert at.get("progress") and "Training marginal, 3 patients" in at.get("progress")[0].proto.text
    # leave the page, then a reload (a new session of the same tab, on the same library) finds the running job
    goto(at, "pages/1_data.py")
    assert job.running
    other = reload(at)
    assert any(c.value.startswith("Training marginal, 3 patients: ") and "in the background" in c.value
               for c in other.sidebar.caption)  # every page's sidebar says a training goes on
    other = goto(other, "pages/4_train.py")
    assert other.button(key="train_job_cancel") is not None and other.button(key="train_button").disabled
    holds[0].set()
    assert job.wait(600) and job.status == DONE
    other.run()
    assert other.success and other.success[0].value.startswith("Trained **marginal, 3 patients (v1)** on ")
    assert store_of(other).current_model == "marginal, 3 patients (v1)"
    assert [m.name for m in PatientLibrary(library).models()] == ["marginal, 3 patients"]
    assert PatientLibrary(library).models()[0].training_patients == ["patient_01", "patient_02", "patient_03"]

    # a second training, cancelled: nothing is stored
    other.button(key="train_button").click()
    other.run()
    second = jobs_for(store_of(other).library_path, "train")[-1]
    assert second is not job and second.running
    other.button(key="train_job_cancel").click()
    other.run()
    holds[1].set()  # its next progress report stops it
    assert second.wait(600) and second.status == CANCELLED
    other.run()
    assert any(m.value.startswith("Training cancelled after ") for m in other.info)
    assert len(PatientLibrary(library).models()) == 1
    assert len(calls) == 2


def test_background_job_reports_progress_estimates_time_and_stops_when_cancelled(tmp_path):
    import threading

    from ui.jobs import CANCELLED, DONE, FAILED, format_seconds, jobs_for, running_job, start_job

    gate = threading.Event()
    steps = []

    def work(report):
        for k in range(1000):
            report(f"step {k}", k / 1000)
            steps.append(k)
            if k == 10:
                gate.wait(30)  # hold here until the test has looked and cancelled
        return "finished"

    job = start_job("train", "Training a test", tmp_path, work)
    assert running_job(tmp_path, "train") is job and jobs_for(tmp_path / "." , "train") == [job]
    while len(steps) < 11:
        threading.Event().wait(0.01)
    assert job.stage == "step 10" and job.fraction == pytest.approx(0.01)
    assert job.remaining_seconds() is None  # under 2%: too early to guess (the estimate: test_app_sessions.py)
    job.cancel()
    gate.set()
    assert job.wait(30) and job.status == CANCELLED and job.result is None
    assert steps[-1] == 10  # the next report stopped it
    assert running_job(tmp_path, "train") is None

    done = start_job("check", "A check", tmp_path, lambda report: report("only step", 0.5) or 42)
    failed = start_job("check", "A failing check", tmp_path, lambda report: 1 / 0)
    assert done.wait(30) and failed.wait(30)
    assert (done.status, done.result, done.fraction) == (DONE, 42, 1.0)
    assert failed.status == FAILED and "division by zero" in failed.error
    assert [j.title for j in jobs_for(tmp_path)] == ["Training a test", "A check", "A failing check"]
    assert (format_seconds(5), format_seconds(125), format_seconds(3725)) == ("5 s", "2 min 05 s", "1 h 02 min")


# ------------------------------------------------------------------------------------ Auto-gates as gates

def _gate_table(at: AppTest) -> pd.DataFrame:  # the Auto-gate page's table of gates, by gate name
    (table,) = [d.value for d in at.dataframe if "F1" in d.value.columns]
    return table.assign(gate=table["gate"].str.replace("\u2003", "").str.replace("└ ", "")).set_index("gate")


def test_autogate_comes_back_as_editable_gates_in_the_training_hierarchy(trained, sample_data_dir):
    from gating_core.gates import panel_scale
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, counted_cells, relabel_after_edit, tree_from_labels
    from gating_core.library import PatientLibrary

    at = trained
    store = store_of(at)
    # patient_02 (a training patient) carries a gate tree: the hierarchy the result comes back in
    train = store.patients["patient_02"]
    scales = {c: store.panel_transform(c) for c in train.sample.pnn}
    assert scales["FL3-A"] == panel_scale("FL3-A", [train.sample])
    template = tree_from_labels(train.sample, train.labels, SAMPLE_DATA_HIERARCHY, scales)
    store.save_gates("patient_02", template)
    at = goto(at, "pages/5_autogate.py")
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_01"])
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error, at.exception
    record = store.patients["new_patient_01"]
    assert record.autogates["template"] == "patient_02" and not record.autogates["edited"]
    tree = GateTree.from_dict(record.autogates["tree"])
    assert [(g.name, g.x_channel, g.y_channel, g.parent) for g in tree.gates] == SAMPLE_DATA_HIERARCHY
    assert tree != template  # fitted to this patient
    table = _gate_table(at)
    masks = tree.memberships(record.sample)
    assert table["in gate"].to_dict() == {n: int(m.sum()) for n, m in masks.items()}
    # counts are the cells' populations (what the exports hold); a leaf counts its population
    predicted = np.asarray(record.result.populations).astype(str)
    counted = counted_cells(tree, predicted, masks, record.autogates["populations"])
    assert table["count"].to_dict() == {n: int(m.sum()) for n, m in counted.items()}
    assert table.loc["CD4 T cells", "count"] == (predicted == "CD4 T cells").sum()
    assert table.loc["CD4 T cells", "% of parent"] == pytest.approx(
        100 * counted["CD4 T cells"].sum() / counted["T cells"].sum())
    assert table.loc["T cells", "parent"] == "Lymphocytes"
    assert (table["F1"].astype(float) > 0.9).all(), table["F1"].to_dict()  # shown as text: "0.993", "—"
    # drawn on the parents' plots: 5 plots of the tree (all events x 2 axes pairs, Lymphocytes x 2,
    # T cells), each with its gates as shapes, then the plot of the gate being adjusted
    specs = [plotly_spec(at, i) for i in range(len(at.get("plotly_chart")))]
    tree_plots = [s for s in specs if "→" in (s["layout"].get("annotations") or [{"text": ""}])[0]["text"]]
    shapes = {s["layout"]["annotations"][0]["text"]: len(s["layout"]["shapes"]) for s in tree_plots}
    assert shapes == {"all events → Debris, Granulocytes, Lymphocytes": 3, "all events → Monocytes": 1,
                      "Lymphocytes → T cells, NK cells": 2, "T cells → CD4 T cells, CD8 T cells": 2,
                      "Lymphocytes → B cells": 1}

    # move a vertex of CD4 T cells: the count and the cells follow the gate
    at.selectbox(key="ag_edit_gate_new_patient_01").set_value("CD4 T cells")
    at.run()
    gate = tree["CD4 T cells"]
    x0, y0 = gate.vertices[0]
    centre = np.mean(np.asarray(gate.vertices), axis=0)
    # typed in the channels' values, as the axes read them; the gate keeps display coordinates
    boxes = [at.number_input(key=f"ag_v{axis}_new_patient_01_CD4 T cells_1") for axis in "xy"]
    assert [box.label for box in boxes] == [gate.x_channel, gate.y_channel]
    for box, scale, shown, target in zip(boxes, (gate.x_scale, gate.y_scale), (x0, y0), centre):
        assert box.value == pytest.approx(float(scale.inverse(np.array([shown]))[0]), rel=1e-5)
        box.set_value(float(scale.inverse(np.array([target]))[0]))
    at.run()
    at.button(key="ag_move_vertex").click()
    at.run()
    assert not at.exception, at.exception
    edited = GateTree.from_dict(record.autogates["tree"])
    assert record.autogates["edited"] and edited["CD4 T cells"].vertices[0] == pytest.approx(tuple(centre))
    new_count = int(edited.memberships(record.sample)["CD4 T cells"].sum())
    assert new_count < int(masks["CD4 T cells"].sum())
    assert _gate_table(at).loc["CD4 T cells", "in gate"] == new_count
    assert any(f"Moved a vertex of CD4 T cells: {int(masks['CD4 T cells'].sum()):,} → {new_count:,} events" in s.value
               for s in at.success)
    # the cells that left the gate follow it; every other cell keeps the model's population
    gate_labels, changed = relabel_after_edit(tree, edited, record.sample, predicted)
    gate_labels = gate_labels.astype(str)
    np.testing.assert_array_equal(np.asarray(record.populations).astype(str), gate_labels)
    assert changed.any() and (gate_labels[~changed] == predicted[~changed]).all()
    populations = at.dataframe[0].value.set_index("population")
    assert populations.loc["CD4 T cells", "count"] == (gate_labels == "CD4 T cells").sum()
    assert _gate_table(at).loc["CD4 T cells", "count"] == (gate_labels == "CD4 T cells").sum()

    # accept: the gates and the labels go to the library; a reload finds the edited gates
    at.button(key="ag_accept_new_patient_01").click()
    at.run()
    at.button(key="ag_accept_new_patient_01_confirm").click()
    at.run()
    assert not at.exception
    library = PatientLibrary(store.library_path)
    assert GateTree.from_dict(library.load_gates("new_patient_01")) == edited
    np.testing.assert_array_equal(library.load_labels("new_patient_01").astype(str), gate_labels)
    fresh = start()
    print("DEBUG0", {n: r.result is not None for n, r in store_of(fresh).patients.items()})
    again = goto(fresh, "pages/5_autogate.py")
    print("DEBUG1", {n: r.result is not None for n, r in store_of(again).patients.items()})
    again.selectbox(key="ag_patient").set_value("new_patient_01")
    again.run()
    assert not again.exception
    assert _gate_table(again).loc["CD4 T cells", "in gate"] == new_count
    assert _gate_table(again).loc["CD4 T cells", "count"] == (gate_labels == "CD4 T cells").sum()
    assert store_of(again).patients["new_patient_01"].gate_tree == edited


def test_autogate_keeps_range_and_boolean_gates_of_the_template_and_adjusts_only_shapes(trained):
    from gating_core.gates import boolean_gate, range_gate
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels

    at = trained
    store = store_of(at)
    train = store.patients["patient_02"]
    scales = {c: store.panel_transform(c) for c in train.sample.pnn}
    template = tree_from_labels(train.sample, train.labels, SAMPLE_DATA_HIERARCHY, scales)
    template.add(range_gate("FL3 bright", "FL3-A", 2.0, 10.0, scale=scales["FL3-A"]))
    template.add(boolean_gate("not T cells", "not", ["T cells"]))
    store.save_gates("patient_02", template)
    at = goto(at, "pages/5_autogate.py")
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_01"])
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error, at.exception
    record = store.patients["new_patient_01"]
    tree = GateTree.from_dict(record.autogates["tree"])
    assert tree["FL3 bright"] == template["FL3 bright"]  # kept as the template defines it
    assert tree["not T cells"].operands == ["T cells"]
    masks = tree.memberships(record.sample)
    table = _gate_table(at)
    assert table.loc["not T cells", "in gate"] == int((~masks["T cells"]).sum())
    assert table.loc["FL3 bright", "in gate"] == int(masks["FL3 bright"].sum())
    # polygons, rectangles and ranges are offered for adjusting, depth-first; a boolean gate is not
    options = [o.replace("\u2003", "").replace("└ ", "").replace(" (range)", "")
               for o in at.selectbox(key="ag_edit_gate_new_patient_01").options]
    assert options == [g[0] for g in SAMPLE_DATA_HIERARCHY] + ["FL3 bright"]


def test_autogate_with_flat_training_labels_shows_populations_under_all_events(trained):
    at = goto(trained, "pages/5_autogate.py")
    store = store_of(at)
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_02"])
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception
    assert store.patients["new_patient_02"].autogates is None
    assert any("children of all events" in c.value for c in at.caption)
    flat = [d.value for d in at.dataframe if "parent" in d.value.columns and "population" in d.value.columns][0]
    counts = pd.Series(store.patients["new_patient_02"].result.populations.astype(str)).value_counts()
    assert flat.set_index("population")["count"].to_dict() == counts.to_dict()
    assert (flat["parent"] == "(all events)").all()
    assert flat["% of parent"].tolist() == pytest.approx(flat["% of total"].tolist())
