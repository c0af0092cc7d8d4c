"""AppTest flows of the Gate page's population tree: quadrant, range and boolean gates with
exact counts, rename, delete after a confirmation naming what goes, the tree driving the plot,
and back-gating overlays."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from gating_core.reports import plotting

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")
PATIENT = "patient_01"


@pytest.fixture
def gate_page(tmp_path, monkeypatch, sample_data_dir):
    monkeypatch.setenv("GATING_LIBRARY", str(tmp_path / "library"))
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.button[0].click()  # the sample data
    at.run()
    at.switch_page("pages/3_gate.py")
    at.run()
    assert not at.exception
    at.selectbox(key="gate_patient").set_value(PATIENT)
    at.run()
    return at


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def record_of(at):
    return at.session_state["store"].patients[PATIENT]


def raw(at, channel):
    sample = record_of(at).sample
    return sample.events[:, sample.channel_index(channel)]


def gate_table(at):
    table = at.dataframe[0].value
    table["gate"] = table["gate"].str.replace("\u2003", "").str.replace("└ ", "")
    return table.set_index("gate")


def values(trace, axis):
    """A trace's coordinates from the chart's JSON (plain list or plotly's typed-array form)."""
    data = trace.get(axis)
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"]))
    return np.asarray(data if data is not None else [], dtype=float)


def add_quadrants(at, x="FL3-A", y="FL6-A", split=(200.0, 300.0), parent=None):
    if parent:
        at.selectbox(key="gate_parent").set_value(parent)
    at.radio(key="gate_tool").set_value("Quadrant")
    run(at)
    at.selectbox(key="g_x").set_value(x)
    at.selectbox(key="g_y").set_value(y)
    run(at)
    at.number_input(key=f"split_{PATIENT}_{x}_x").set_value(split[0])
    at.number_input(key=f"split_{PATIENT}_{y}_y").set_value(split[1])
    run(at)
    at.button(key="add_quadrant").click()
    return run(at)


def add_range(at, name, channel, low, high, parent=None):
    if parent:
        at.selectbox(key="gate_parent").set_value(parent)
    at.radio(key="gate_tool").set_value("Range (histogram)")
    at.selectbox(key="g_x").set_value(channel)
    run(at)
    at.number_input(key=f"range_{PATIENT}_{channel}_from").set_value(low)
    at.number_input(key=f"range_{PATIENT}_{channel}_to").set_value(high)
    at.text_input(key="gate_name").input(name)
    run(at)
    at.button(key="add_range").click()
    return run(at)


def add_boolean(at, name, operator, operands, parent=None):
    at.selectbox(key="gate_parent").set_value(parent or "(all events)")
    at.radio(key="gate_tool").set_value("Boolean")
    run(at)
    at.selectbox(key="bool_op").set_value(operator)
    at.multiselect(key="bool_operands").set_value(operands)
    at.text_input(key="gate_name").input(name)
    run(at)
    at.button(key="add_boolean").click()
    return run(at)


def asinh(values):
    return np.arcsinh(np.asarray(values, dtype=float) / 150.0)  # the panel's flow cofactor


def test_range_quadrant_and_boolean_gates_count_exactly(gate_page):
    at = add_range(gate_page, "CD3+", "FL1-A", 1000.0, 1e6)
    cd3_display = asinh(raw(at, "FL1-A"))
    cd3 = (cd3_display >= asinh(1000.0)) & (cd3_display <= asinh(1e6))
    assert "Added gate 'CD3+'" in at.success[0].value
    assert gate_table(at).loc["CD3+", "count"] == cd3.sum() == 3880

    at = add_quadrants(at, parent="CD3+")
    cd4, cd8 = asinh(raw(at, "FL3-A")) >= asinh(200.0), asinh(raw(at, "FL6-A")) >= asinh(300.0)
    table = gate_table(at)
    expected = {"CD4+ CD8+": cd3 & cd4 & cd8, "CD4+ CD8-": cd3 & cd4 & ~cd8, "CD4- CD8+": cd3 & ~cd4 & cd8,
                "CD4- CD8-": cd3 & ~cd4 & ~cd8}
    assert {n: int(table.loc[n, "count"]) for n in expected} == {n: int(m.sum()) for n, m in expected.items()}
    assert {n: int(m.sum()) for n, m in expected.items()} == {"CD4+ CD8+": 0, "CD4+ CD8-": 2495,
                                                              "CD4- CD8+": 1110, "CD4- CD8-": 275}
    assert all(table.loc[n, "parent"] == "CD3+" for n in expected)
    tree = record_of(at).gate_tree
    assert {tree[n].quadrant for n in expected} == {"++", "+-", "-+", "--"}

    at = add_boolean(at, "not T", "not", ["CD3+"])
    at = add_boolean(at, "single positive", "or", ["CD4+ CD8-", "CD4- CD8+"], parent="CD3+")
    table = gate_table(at)
    assert table.loc["not T", "count"] == (~cd3).sum() == 12000 - 3880
    assert table.loc["not T", "axes"] == "NOT CD3+"
    assert table.loc["single positive", "count"] == 2495 + 1110
    # The library keeps every kind: a new session (reload) reads the same tree back.
    again = AppTest.from_file(APP, default_timeout=300)
    again.run()
    assert again.session_state["store"].patients[PATIENT].gate_tree == tree.__class__.from_dict(
        record_of(at).gate_tree.to_dict())


def test_rename_and_delete_with_a_confirmation_naming_what_goes(gate_page):
    at = add_range(gate_page, "CD3+", "FL1-A", 1000.0, 1e6)
    at = add_quadrants(at, parent="CD3+")
    at = add_boolean(at, "not T", "not", ["CD3+"])
    # Rename CD3+ while it is the parent population shown: the pickers follow the new name.
    at.selectbox(key="gate_focus").set_value("CD3+")  # opens its parent's plot: all events
    run(at)
    at.selectbox(key="gate_parent").set_value("CD3+")
    run(at)
    at.selectbox(key="edit_which").set_value("CD3+")
    run(at)
    at.text_input(key="rename_to_CD3+").input("T cells")
    run(at)
    at.button(key="rename_gate").click()
    run(at)
    assert "Renamed 'CD3+' to 'T cells'" in at.success[0].value
    table = gate_table(at)
    assert table.loc["CD4+ CD8-", "parent"] == "T cells" and table.loc["not T", "axes"] == "NOT T cells"
    assert table.loc["T cells", "count"] == 3880
    assert at.selectbox(key="gate_parent").value == "T cells" and at.selectbox(key="gate_focus").value == "T cells"
    # Delete T cells: the confirmation names the gates nested in it and the boolean gate on it.
    at.selectbox(key="edit_which").set_value("T cells")
    run(at)
    at.button(key=f"delete_gate_{PATIENT}").click()
    run(at)
    warning = " ".join(w.value for w in at.warning)
    for name in ("T cells", "CD4+ CD8+", "CD4+ CD8-", "CD4- CD8+", "CD4- CD8-", "not T"):
        assert f"**{name}**" in warning
    assert "This deletes 6 gate(s)" in warning
    assert len(record_of(at).gate_tree) == 6  # nothing gone before the confirmation
    at.button(key=f"delete_gate_{PATIENT}_confirm").click()
    run(at)
    assert len(record_of(at).gate_tree) == 0
    assert at.selectbox(key="gate_parent").value == "(all events)"
    assert "Deleted T cells, CD4+ CD8+, CD4+ CD8-, CD4- CD8+, CD4- CD8-, not T" in at.success[0].value
    # Undo brings all six back.
    at.button(key="undo_gate").click()
    run(at)
    assert record_of(at).gate_tree.names == ["T cells", "CD4+ CD8+", "CD4+ CD8-", "CD4- CD8+", "CD4- CD8-", "not T"]


def test_the_population_tree_drives_the_plot_and_backgating_colours_ancestors(gate_page):
    at = add_range(gate_page, "CD3+", "FL1-A", 1000.0, 1e6)
    at = add_quadrants(at, parent="CD3+")
    # Elsewhere on the page: all events, FSC / SSC, lasso tool.
    at.selectbox(key="gate_parent").set_value("(all events)")
    at.radio(key="gate_tool").set_value("Lasso / box")
    run(at)
    at.selectbox(key="g_x").set_value("FSC-A")
    at.selectbox(key="g_y").set_value("SSC-A")
    run(at)
    # Choosing CD4+ CD8- in the tree opens its parent's (CD3+) plot on CD4 / CD8 with its split.
    at.selectbox(key="gate_focus").set_value("CD4+ CD8-")
    run(at)
    assert at.selectbox(key="gate_parent").value == "CD3+"
    assert (at.selectbox(key="g_x").value, at.selectbox(key="g_y").value) == ("FL3-A", "FL6-A")
    assert at.radio(key="gate_tool").value == "Quadrant"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    labels = {a["text"] for a in spec["layout"]["annotations"]}
    assert {"<b>CD4+ CD8-</b>", "<b>CD4- CD8+</b>"} <= labels
    # The density, and only two transparent markers for the toolbar's lasso and box: Plotly
    # reports a lasso over a heatmap, so no points are drawn under it (WebGL points cost the
    # browser half a second per redraw without a GPU).
    assert [t["type"] for t in spec["data"]] == ["heatmap", "scatter"]
    assert spec["data"][1]["name"] == "selection tools" and len(spec["data"][1]["x"]) == 2
    assert spec["layout"]["dragmode"] == "lasso"
    # Choosing the range gate opens the histogram of all events' CD3.
    at.selectbox(key="gate_focus").set_value("CD3+")
    run(at)
    assert at.radio(key="gate_tool").value == "Range (histogram)"
    assert at.selectbox(key="g_x").value == "FL1-A" and at.selectbox(key="gate_parent").value == "(all events)"

    # Back-gating CD4+ CD8-: coloured on the all-events CD3 histogram and on CD3+'s CD4 / CD8 plot.
    at.selectbox(key="backgate_which").set_value("CD4+ CD8-")
    run(at)
    record = record_of(at)
    masks = record.gate_tree.memberships(record.sample)
    population = masks["CD4+ CD8-"]
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    backgate = [c for c in charts if any(t.get("name") == "CD4+ CD8-" for t in c["data"])]
    assert len(backgate) == 2
    histogram, scatter = backgate
    assert values([t for t in histogram["data"] if t["name"] == "CD4+ CD8-"][0], "y").sum() == population.sum() == 2495
    idx = plotting.subsample_indices(record.sample.n_events, 8000, seed=0)
    lit = [t for t in scatter["data"] if t["name"] == "CD4+ CD8-"][0]
    grey = [t for t in scatter["data"] if t["name"] == "events"][0]
    assert len(values(lit, "x")) == int(population[idx].sum()) > 0
    assert len(values(grey, "x")) == int(masks["CD3+"][idx].sum())
    assert "2,495 cells" in scatter["layout"]["title"]["text"]


def test_a_box_dragged_across_the_histogram_sets_the_range():
    from gating_core.gates import AxisScale
    from ui.gate_view import range_from_selection, seed_range

    assert range_from_selection({"box": [{"x": [3.0, 1.0], "y": [0, 9]}]}) == (1.0, 3.0)
    assert range_from_selection({"box": [], "lasso": []}) is None
    assert range_from_selection({"box": [{"x": [2.0, 2.0]}]}) is None
    state = {}
    scale = AxisScale("arcsinh", cofactor=150.0)
    seed_range(state, "r", "chart", scale, (-10.0, 1e5))
    assert (state["r_from"], state["r_to"]) == (-10.0, 1e5)
    state["chart"] = {"selection": {"box": [{"x": [np.arcsinh(2.0), np.arcsinh(20.0)], "y": [0, 1]}]}}
    seed_range(state, "r", "chart", scale, (-10.0, 1e5))
    assert state["r_from"] == pytest.approx(300.0) and state["r_to"] == pytest.approx(3000.0)
    state["r_from"] = 500.0  # typed afterwards: the same box is not applied again
    seed_range(state, "r", "chart", scale, (-10.0, 1e5))
    assert state["r_from"] == 500.0


def test_rename_keeps_the_gate_chosen_and_a_split_cannot_be_added_twice(gate_page):
    at = add_range(gate_page, "CD3+", "FL1-A", 1000.0, 1e6)
    at.selectbox(key="edit_which").set_value("CD3+")
    run(at)
    at.text_input(key="rename_to_CD3+").input("T cells")
    run(at)
    at.button(key="rename_gate").click()
    run(at)
    # the renamed gate stays chosen with its new name in the field, and the section stays open
    assert at.selectbox(key="edit_which").value == "T cells"
    assert at.text_input(key="rename_to_T cells").value == "T cells"
    assert at.session_state["gate_edit_open"] is True
    # a quadrant split added once: the button is off for the same names, and says why
    at = add_quadrants(at, parent="T cells")
    assert len(record_of(at).gate_tree) == 5
    assert at.button(key="add_quadrant").disabled
    assert any(c.value.startswith("Already in the tree: CD4+ CD8+, CD4+ CD8-") for c in at.caption)


def test_the_gates_download_as_gatingml_and_a_flowjo_workspace_that_count_on_the_fcs_file(gate_page,
                                                                                          sample_data_dir):
    import flowkit

    from gating_core.gates import gate_name_from_xml
    from ui import exports

    at = add_range(gate_page, "CD3+", "FL1-A", 1000.0, 1e6)
    record = record_of(at)
    tree_json = record.gate_tree.to_json()
    buttons = {b.proto.label: b for b in at.get("download_button")}
    assert {"Gates (GatingML 2.0)", "Gates (FlowJo workspace)"} <= set(buttons)
    assert any("drawn on values compensated by the file's own spillover matrix" in c.value for c in at.caption)
    work_dir = str(at.session_state["store"].work_dir)
    fcs = flowkit.Sample(str(sample_data_dir / f"{PATIENT}.fcs"), subsample=0)
    gatingml = exports.gates_file("gatingml", tree_json, record.token, record.sample, work_dir)
    path = Path(work_dir) / "check.xml"
    path.write_bytes(gatingml)
    strategy = flowkit.parse_gating_xml(str(path))
    results = strategy.gate_sample(fcs)
    assert {gate_name_from_xml(g): int(results.get_gate_membership(g, gate_path=p).sum())
            for g, p in strategy.get_gate_ids()} == {"CD3+": 3880}
    workspace = exports.gates_file("flowjo", tree_json, record.token, record.sample, work_dir)
    path = Path(work_dir) / "check.wsp"
    path.write_bytes(workspace)
    flowjo = flowkit.Workspace(str(path), fcs_samples=[fcs])
    flowjo.analyze_samples(sample_id=f"{PATIENT}.fcs", use_mp=False)
    assert int(flowjo.get_gate_membership(f"{PATIENT}.fcs", "CD3+").sum()) == 3880
    # Quadrants: GatingML only, the workspace's button off and saying why.
    at = add_quadrants(at, parent="CD3+")
    button = next(b for b in at.button if b.key == "gates_flowjo")
    assert button.disabled and "cannot hold CD4+ CD8+" in button.help
    assert "Gates (GatingML 2.0)" in {b.proto.label for b in at.get("download_button")}
