"""AppTest: the plots' drawing tools, overlaid histograms across patients and axis ranges set by
hand for the panel."""

from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from apptest_helpers import drawing_charts, goto, start, store_of, toolbar_selection_buttons

PATIENT = "patient_01"


@pytest.fixture
def loaded(library):
    at = start()
    at.button[0].click()  # the sample data
    return run(at)


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


# ------------------------------------------------------------------------------ drawing tools


def test_the_toolbar_rule_finds_a_density_plot_without_selection_buttons():
    """What the browser showed before: a heatmap alone gets no lasso or box button, whatever
    the config asks for."""
    heatmap = {"data": [{"type": "heatmap"}], "layout": {"dragmode": "lasso"}}
    assert toolbar_selection_buttons(heatmap, {"modeBarButtonsToAdd": ["lasso2d", "select2d"]},
                                     {"lasso", "box"}) == set()
    lines = {"data": [{"type": "scatter", "mode": "lines"}]}
    assert toolbar_selection_buttons(lines, {}, {"box"}) == set()
    dots = {"data": [{"type": "scattergl", "mode": "markers"}]}
    assert toolbar_selection_buttons(dots, {}, {"lasso", "box"}) == {"lasso2d", "select2d"}
    assert toolbar_selection_buttons(dots, {}, {"box"}) == {"select2d"}


def test_every_gate_plot_offers_the_lasso_and_box_and_keeps_its_drag_mode(loaded):
    at = goto(loaded, "pages/3_gate.py")
    at.selectbox(key="gate_patient").set_value(PATIENT)
    run(at)
    (chart,) = drawing_charts(at)
    assert chart["modes"] == {"lasso", "box"}
    assert chart["buttons"] == {"lasso2d", "select2d"}
    assert chart["spec"]["layout"]["dragmode"] == "lasso"
    # a parent population's plot too
    at.radio(key="gate_tool").set_value("Range (histogram)")
    run(at)
    (chart,) = drawing_charts(at)
    assert chart["modes"] == {"box"} and chart["buttons"] == {"select2d"}
    assert chart["spec"]["layout"]["dragmode"] == "select" and chart["spec"]["layout"]["selectdirection"] == "h"
    at.text_input(key="gate_name").input("bright")
    run(at)
    at.button(key="add_range").click()
    run(at)
    at.selectbox(key="gate_parent").set_value("bright")
    at.radio(key="gate_tool").set_value("Lasso / box")
    run(at)
    (chart,) = drawing_charts(at)
    assert chart["buttons"] == {"lasso2d", "select2d"} and chart["spec"]["layout"]["dragmode"] == "lasso"
    # the plots nobody draws on zoom when dragged
    others = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if not c.proto.selection_mode]
    assert others and all(spec["layout"].get("dragmode", "zoom") == "zoom" for spec in others)  # back-gating


# ------------------------------------------------------------------------------ overlaid histograms


def decoded(trace, axis):
    """A trace's coordinates from the chart's JSON (plain list or plotly's typed-array form)."""
    import base64

    data = trace.get(axis)
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"])).astype(float)
    return np.asarray(data if data is not None else [], dtype=float)


def chart(at, key):
    (found,) = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id]
    return json.loads(found.proto.spec)


def test_one_marker_of_one_population_overlaid_across_patients(loaded):
    from gating_core.gates import AxisScale

    at = goto(loaded, "pages/2_explore.py")
    store = store_of(at)
    patients = ["patient_01", "patient_02", "patient_03", "patient_04", "patient_05", "new_patient_01"]
    at.multiselect(key="ov_patients").set_value(patients)  # more than the four side by side
    at.selectbox(key="ex_h").set_value("FL3-A")  # CD4
    run(at)
    assert "CD4 T cells" in at.selectbox(key="ov_population").options
    at.selectbox(key="ov_population").set_value("CD4 T cells")
    at.radio(key="ov_y").set_value("cells")
    run(at)
    spec = chart(at, "explore_hist")
    assert [t["name"] for t in spec["data"]] == patients
    assert spec["layout"]["xaxis"]["title"]["text"] == "CD4 (FL3-A) · CD4 T cells"
    low, high = spec["layout"]["xaxis"]["range"]
    scale = AxisScale.from_dict(store.panel_transform("FL3-A").to_dict())
    table = at.dataframe[-1].value.set_index("patient")
    for trace, name in zip(spec["data"][:-1], patients):
        record = store.patients[name]
        raw = record.sample.events[:, record.sample.channel_index("FL3-A")]
        cells = np.asarray(record.populations).astype(str) == "CD4 T cells"
        expected, _ = np.histogram(scale.forward(raw[cells]).astype(np.float32), bins=200, range=(low, high))
        np.testing.assert_array_equal(decoded(trace, "y"), expected)  # exact counts of the population's cells
        assert table.loc[name, "cells"] == cells.sum() > 0
        assert table.loc[name, "median CD4 (FL3-A)"] == pytest.approx(np.median(raw[cells]))
        assert table.loc[name, "CV CD4 (FL3-A)"] == pytest.approx(100 * raw[cells].std(ddof=1) / raw[cells].mean())
    # the new patient has no labels: no CD4 T cells, an empty curve, and the page says so
    assert decoded(spec["data"][-1], "y").sum() == 0 and table.loc["new_patient_01", "cells"] == 0
    assert np.isnan(table.loc["new_patient_01", "median CD4 (FL3-A)"])
    assert any(c.value == "No cells of CD4 T cells in new_patient_01: no curve." for c in at.caption)
    # scaled to each curve's mode, then staggered: curve k starts at 60 k
    at.radio(key="ov_y").set_value("% of mode")
    at.checkbox(key="ov_stagger").check()
    run(at)
    spec = chart(at, "explore_hist")
    heights = [decoded(t, "y") for t in spec["data"]]
    for k, y in enumerate(heights[:-1]):
        assert y.min() == pytest.approx(60.0 * k) and y.max() == pytest.approx(60.0 * k + 100.0)
    assert spec["layout"]["yaxis"]["showticklabels"] is False


# ------------------------------------------------------------------------------ axis ranges


def test_an_axis_range_set_by_hand_holds_on_every_plot_of_the_channel_and_is_kept(loaded):
    at = goto(loaded, "pages/2_explore.py")
    at.selectbox(key="ex_ar_channel").set_value("FSC-A")
    run(at)
    automatic = chart(at, "explore_scatter")["layout"]["xaxis"]["range"]
    at.number_input(key="ex_ar_lo_FSC-A").set_value(20000.0)
    at.number_input(key="ex_ar_hi_FSC-A").set_value(150000.0)
    at.button(key="ex_ar_apply").click()
    run(at)
    scatter = chart(at, "explore_scatter")
    assert scatter["layout"]["xaxis"]["range"] == [20000.0, 150000.0] != automatic  # FSC-A is linear
    centers = decoded(scatter["data"][0], "x")
    assert centers.min() > 20000.0 and centers.max() < 150000.0  # the density is binned over it
    at.selectbox(key="ex_h").set_value("FSC-A")
    run(at)
    assert chart(at, "explore_hist")["layout"]["xaxis"]["range"] == [20000.0, 150000.0]
    assert at.button(key="ex_ar_auto").disabled is False
    # another session on the library: the Gate page draws FSC-A over it, on any transform
    again = goto(start(), "pages/3_gate.py")
    assert store_of(again).axis_range("FSC-A") == (20000.0, 150000.0)
    gate_chart = drawing_charts(again)[0]["spec"]
    assert gate_chart["layout"]["xaxis"]["range"] == [20000.0, 150000.0]
    again.selectbox(key="g_xs_FSC-A").set_value("arcsinh")
    run(again)
    cofactor = store_of(again).panel_transform("FSC-A").cofactor
    assert drawing_charts(again)[0]["spec"]["layout"]["xaxis"]["range"] == pytest.approx(
        list(np.arcsinh(np.array([20000.0, 150000.0]) / cofactor)))
    # a range from high to low is refused; automatic again gives the events' range back
    again.selectbox(key="g_ar_channel").set_value("FSC-A")
    run(again)
    again.number_input(key="g_ar_lo_FSC-A").set_value(9e5)
    again.button(key="g_ar_apply").click()
    again.run()
    assert [e.value for e in again.error] == ["the axis range must go from a lower to a higher number, "
                                              "not 900000 to 150000"]
    again.button(key="g_ar_auto").click()
    run(again)
    assert store_of(again).axis_range("FSC-A") is None and store_of(start()).axis_range("FSC-A") is None
    assert again.button(key="g_ar_auto").disabled


# ------------------------------------------------------------------------------ train page


def test_a_labs_unassigned_name_is_said_to_be_learned_as_other(loaded):
    """A lab's labels name the cells of no population "ungated": the Train page leaves it out of
    the populations to learn, and says that those cells are learned (and shown) as `other`."""
    from apptest_helpers import goto

    store = store_of(loaded)
    for name in store.labeled():
        labels = np.asarray(store.patients[name].labels).astype(object)
        labels[labels == "other"] = "ungated"
        store.set_labels(name, labels, "test: the lab's own name")
    at = run(goto(loaded, "pages/4_train.py"))
    learned = at.multiselect(key="train_pops").value
    assert "ungated" not in learned and "B cells" in learned
    (note,) = [c.value for c in at.caption if c.value.startswith("Learned as `other`")]
    assert "`ungated`" in note and "`other`" not in note.split(":", 1)[1].split(".")[0]
    # chosen to be learned: nothing to say
    at.multiselect(key="train_pops").set_value(learned + ["ungated"])
    at = run(at)
    assert not [c.value for c in at.caption if c.value.startswith("Learned as `other`")]


def test_a_gate_reaching_past_the_plot_keeps_its_name_on_it():
    import plotly.graph_objects as go

    from gating_core.gates import rectangle_gate
    from ui import charts

    fig = go.Figure()
    fig.add_annotation(x=0, y=200, text="a title")  # not a gate's name: left where it is
    charts.add_gates(fig, [rectangle_gate("high", "A", "B", (10, 40), (50, 150)),
                           rectangle_gate("inside", "A", "B", (10, 40), (20, 30))], (0, 100), (0, 100))
    notes = {n.text: n for n in fig.layout.annotations}
    assert notes["a title"].y == 200
    assert notes["<b>high</b>"].y == 100 and notes["<b>high</b>"].yshift == -12
    assert 20 <= notes["<b>inside</b>"].y <= 30 and notes["<b>inside</b>"].yshift == 10


def test_gate_outlines_are_cut_to_the_plotted_range_and_names_written_inwards():
    import plotly.graph_objects as go

    from gating_core.gates import polygon_gate, rectangle_gate
    from ui import charts

    square = [(-10, -10), (50, -10), (50, 50), (-10, 50)]
    clipped = charts.clipped_polygon(square, (0, 100), (0, 100))
    assert sorted(map(tuple, clipped.tolist())) == [(0.0, 0.0), (0.0, 50.0), (50.0, 0.0), (50.0, 50.0)]
    # the box's corner cut off by the triangle (0, 0), (150, 0), (0, 150): five corners
    cut = charts.clipped_polygon([(0, 0), (150, 0), (0, 150)], (0, 100), (0, 100))
    assert sorted(map(tuple, cut.tolist())) == [(0.0, 0.0), (0.0, 100.0), (50.0, 100.0), (100.0, 0.0), (100.0, 50.0)]
    assert charts.clipped_polygon([(200, 200), (300, 200), (250, 300)], (0, 100), (0, 100)).shape == (0, 2)

    fig = go.Figure()
    charts.add_gates(fig, [polygon_gate("wide", "A", "B", [(60, 20), (140, 20), (140, 97), (60, 97)]),
                           rectangle_gate("gone", "A", "B", (200, 300), (200, 300))], (0, 100), (0, 100))
    [shape] = fig.layout.shapes  # the gate wholly past the range draws no outline
    corners = [tuple(map(float, p.split(","))) for p in shape.path[2:-2].split(" L ")]
    assert max(x for x, _ in corners) == 100 and min(x for x, _ in corners) == 60
    notes = {n.text: n for n in fig.layout.annotations}
    # its top is within 8% of the plot's: the name goes under it, away from the title
    assert notes["<b>wide</b>"].y == 97 and notes["<b>wide</b>"].yshift == -12
    # the gate past the range keeps its name at the plot's corner, written inwards
    assert (notes["<b>gone</b>"].x, notes["<b>gone</b>"].y) == (100, 100) and notes["<b>gone</b>"].xanchor == "right"
