"""Batch table (patient x population) and the one-page HTML report: gating_core.reports.report,
its plots drawn by gating_core.reports.svg_plots."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import Sample, read_fcs
from gating_core.gates import GateTree, boolean_gate, panel_scale, quadrant_gates, range_gate, rectangle_gate
from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, counted_cells, tree_from_labels
from gating_core.reports.report import ALL_EVENTS, BATCH_COLUMNS, batch_table, patient_report_html, population_rows
from gating_core.reports.svg_plots import svg_histogram, svg_scatter

SAMPLE_DATA = Path(__file__).resolve().parent.parent / "sample_data"


@pytest.fixture(scope="module")
def patient():
    sample = read_fcs(SAMPLE_DATA / "patient_01.fcs", compensate=True)
    labels = pd.read_csv(SAMPLE_DATA / "patient_01.labels.csv")["population"].to_numpy().astype(str)
    return sample, labels


@pytest.fixture(scope="module")
def tree(patient):
    sample, labels = patient
    return tree_from_labels(sample, labels, SAMPLE_DATA_HIERARCHY, {c: panel_scale(c, [sample]) for c in sample.pnn})


def test_flat_rows_are_children_of_all_events_with_exact_counts(patient):
    sample, labels = patient
    confidence = np.linspace(0, 1, labels.size)
    rows = population_rows("patient_01", labels, confidence=confidence, source="labels")
    assert list(rows.columns) == BATCH_COLUMNS
    counts = pd.Series(labels).value_counts()
    assert rows.set_index("population")["count"].to_dict() == counts.to_dict()
    assert rows["population"].iloc[-1] == "other"             # unassigned last, the rest largest first
    assert rows["count"].iloc[:-1].is_monotonic_decreasing
    assert (rows["parent"] == ALL_EVENTS).all() and (rows["depth"] == 1).all()
    assert rows["% of parent"].tolist() == rows["% of total"].tolist()
    assert rows["% of total"].sum() == pytest.approx(100.0)
    b = rows.set_index("population").loc["B cells"]
    assert b["% of total"] == pytest.approx(100.0 * counts["B cells"] / labels.size)
    assert b["mean confidence"] == pytest.approx(confidence[labels == "B cells"].mean())
    assert (rows["counted by"] == "labels").all()


def test_tree_rows_count_the_populations_under_their_parent_gate(patient, tree):
    """The per-event populations are the counts: a gate named like a population counts exactly
    its cells, a parent gate every cell counted below it plus the unassigned cells inside it."""
    sample, labels = patient
    masks = tree.memberships(sample)
    confidence = np.linspace(0, 1, labels.size)
    rows = population_rows("patient_01", labels, tree=tree, sample=sample, confidence=confidence)
    rows = rows.set_index("population")
    assert list(rows.index) == [g.name for g in tree.depth_first()] + ["other"]
    counts = pd.Series(labels).value_counts()
    for leaf in tree.leaves():
        assert rows.loc[leaf.name, "count"] == counts[leaf.name]
        assert rows.loc[leaf.name, "counted by"] == "labels"
    # a cell also counts in a gate naming no population when it lies in it and in its own gate
    agree = labels == "other"
    for name in tree.names:
        agree |= (labels == name) & masks[name]
    t_cells = np.isin(labels, ["CD4 T cells", "CD8 T cells"]) | (agree & masks["T cells"])
    assert rows.loc["T cells", "count"] == t_cells.sum() and rows.loc["T cells", "counted by"] == "labels and gates"
    lymphocytes = np.isin(labels, ["CD4 T cells", "CD8 T cells", "B cells", "NK cells"]) | (agree & masks["Lymphocytes"])
    assert ((labels == "Monocytes") & masks["Monocytes"] & masks["Lymphocytes"]).sum() <= 2  # where two gates touch
    assert rows.loc["Lymphocytes", "count"] == lymphocytes.sum()
    assert rows.loc["other", "count"] == counts["other"] and rows.loc["other", "parent"] == ALL_EVENTS
    assert rows.loc["CD4 T cells", "parent"] == "T cells" and rows.loc["CD4 T cells", "depth"] == 3
    assert rows.loc["Lymphocytes", "parent"] == ALL_EVENTS
    assert rows.loc["CD4 T cells", "% of parent"] == pytest.approx(100.0 * counts["CD4 T cells"] / t_cells.sum())
    assert rows.loc["T cells", "% of total"] == pytest.approx(100.0 * t_cells.sum() / sample.n_events)
    assert rows.loc["NK cells", "mean confidence"] == pytest.approx(confidence[labels == "NK cells"].mean())
    # without populations, the gates are counted by membership
    by_gates = population_rows("patient_01", tree=tree, sample=sample).set_index("population")
    assert by_gates["count"].to_dict() == {n: int(m.sum()) for n, m in masks.items()}
    assert (by_gates["counted by"] == "gates").all()


def test_tree_rows_list_the_populations_no_gate_names(patient, tree):
    """A tree covering part of the populations: its gates first, then every other population
    with its exact count, so the table and the per-cell export agree on every population."""
    sample, labels = patient
    small = GateTree([tree[n] for n in ("Lymphocytes", "T cells", "NK cells")])
    rows = population_rows("p", labels, tree=small, sample=sample).set_index("population")
    counts = pd.Series(labels).value_counts()
    assert list(rows.index[:3]) == ["Lymphocytes", "T cells", "NK cells"]
    assert rows.index[-1] == "other"
    for population, count in counts.items():
        assert rows.loc[population, "count"] == count, population
    masks = small.memberships(sample)
    agree = (labels != "NK cells") | masks["NK cells"]
    assert rows.loc["T cells", "count"] == (agree & masks["T cells"]).sum()
    assert rows.loc["Lymphocytes", "count"] == ((labels == "NK cells") | (agree & masks["Lymphocytes"])).sum()


def test_tree_rows_are_depth_first():
    from gating_core.fcs import Channel

    events = np.array([[0.5, 0.5], [1.5, 0.5], [0.5, 1.5], [3.0, 3.0]])
    sample = Sample("s", events, [Channel("A"), Channel("B")])
    tree = GateTree([rectangle_gate("root", "A", "B", (0, 2), (0, 2)),
                     rectangle_gate("left", "A", "B", (0, 1), (0, 2), parent="root"),
                     rectangle_gate("right", "A", "B", (1, 2), (0, 2), parent="root"),
                     rectangle_gate("left low", "A", "B", (0, 1), (0, 1), parent="left")])
    assert tree.names == ["root", "left", "right", "left low"]
    assert [g.name for g in tree.depth_first()] == ["root", "left", "left low", "right"]
    rows = population_rows("s", np.array(["left low", "right", "left", "x"]), tree=tree, sample=sample)
    assert rows["population"].tolist() == ["root", "left", "left low", "right", "x"]
    assert rows["count"].tolist() == [3, 2, 1, 1, 1]
    assert tree.statistics(sample)["gate"].tolist() == ["root", "left", "left low", "right"]


def test_batch_table_every_patient_and_population(patient, tree):
    sample, labels = patient
    table = batch_table([{"patient": "a", "populations": labels, "source": "labels"},
                         {"patient": "b", "populations": labels, "tree": tree, "sample": sample, "source": "gates"},
                         {"patient": "c", "populations": labels[:100]}])
    assert table["patient"].unique().tolist() == ["a", "b", "c"]
    flat = table[table["parent"] == ALL_EVENTS].groupby("patient")["count"].sum().to_dict()
    assert flat["a"] == labels.size and flat["c"] == 100
    assert (table[table["patient"] == "b"]["population"].tolist()) == tree.names + ["other"]
    csv = table.to_csv(index=False)
    assert pd.read_csv(pd.io.common.StringIO(csv)).shape == table.shape
    assert list(batch_table([]).columns) == BATCH_COLUMNS
    with pytest.raises(ValueError, match="neither populations nor a gate tree"):
        population_rows("x")


def test_svg_scatter_maps_points_and_is_well_formed():
    svg = svg_scatter(np.array([0.0, 10.0]), np.array([0.0, 10.0]), np.array(["#ff0000", "#0000ff"]),
                      (0, 10), (0, 10), title="a < b & c",
                      outlines=[("G\"1", np.array([[0, 0], [5, 0], [5, 5]]), "50%")])
    root = ET.fromstring(svg)   # well-formed XML: every string escaped
    assert root.tag.endswith("svg")
    paths = [e for e in root.iter() if e.tag.endswith("path")]
    # x = 0 -> left edge (48), y = 0 -> bottom of the plot area (24 + 236); 10 -> right (350), top (24)
    assert paths[0].get("d") == "M48.0 260.0h1.6v1.6h-1.6z" and paths[0].get("fill") == "#ff0000"
    assert paths[1].get("d") == "M350.0 24.0h1.6v1.6h-1.6z"
    polygon = [e for e in root.iter() if e.tag.endswith("polygon")][0]
    assert polygon.get("points") == "48.0,260.0 199.0,260.0 199.0,142.0"
    texts = "".join(e.text or "" for e in root.iter() if e.tag.endswith("text"))
    assert "a < b & c" in texts and 'G"1 50%' in texts


def test_report_axes_are_read_in_the_channels_units():
    # ticks inside the range are drawn at their place, outside it dropped; the ends anchored inward
    svg = svg_scatter(np.array([1.0]), np.array([1.0]), np.array(["#000000"]), (0, 10), (0, 10),
                      x_ticks=([0.0, 5.0, 10.0, 12.0], ["0", "5", "10", "12"]), y_ticks=([5.0], ["1K"]))
    root = ET.fromstring(svg)
    texts = {e.text: e for e in root.iter() if e.tag.endswith("text")}
    assert [(texts[t].get("x"), texts[t].get("text-anchor")) for t in ("0", "5", "10")] == \
        [("48.0", "start"), ("199.0", "middle"), ("350.0", "end")]
    assert "12" not in texts and texts["1K"].get("y") == "145.0"  # 24 + 236 / 2, plus 3 to centre the text
    # a report on an arcsinh axis labels decades of the channel's values, not arcsinh units
    from gating_core.reports.plotting import raw_ticks

    scale = panel_scale("FL1-A", [_small_sample()[0]])
    assert scale.kind == "arcsinh"
    positions, labels = raw_ticks(scale, *scale.forward(np.array([-100.0, 1e5])))
    svg = svg_histogram(np.zeros(3), scale.forward(np.array([-100.0, 1e5])), x_ticks=(positions, labels))
    shown = [e.text for e in ET.fromstring(svg).iter() if e.tag.endswith("text")]
    assert shown[-7:-1] == ["-100", "0", "100", "1000", "10K", "100K"]  # the x axis, then the top count


def test_report_is_self_contained_and_holds_table_plots_compensation_and_qc(patient, tree):
    sample, labels = patient
    html = patient_report_html("patient_01", sample, labels, tree=tree, source="labels", file_name="patient_01.fcs",
                               generated="2026-01-01 00:00 UTC")
    assert html.startswith("<!DOCTYPE html>") and html.endswith("</html>")
    assert "<script" not in html and "src=" not in html and "href=" not in html
    assert re.findall(r"https?://[^\"' ]+", html) == ["http://www.w3.org/2000/svg"] * html.count("<svg")
    groups = {(g.parent, g.x_channel, g.y_channel) for g in tree.gates}
    assert html.count("<svg") == len(groups) == 5
    assert html.count("<polygon") == len(tree.gates)
    counted = counted_cells(tree, labels, tree.memberships(sample))
    for gate in tree.gates:
        assert f"<td>{gate.name}</td>" in html
        assert f"<td>{int(counted[gate.name].sum()):,}</td>" in html
    # what each way of counting in the table means, said once under it
    assert "Counted by: <i>labels</i>, each cell in the population it is called, from labels; <i>labels and " \
        "gates</i>, the cells counted below the gate, and those inside it whose population no gate names." in html
    assert html.count("Counted by:") == 1
    assert "7 x 7 spillover matrix from keyword $SPILLOVER, applied" in html
    assert "<td>CD3 (FL1-A)</td>" in html                    # matrix rows named by marker
    assert "no time channel" in html and "No novelty score" in html
    for svg in re.findall(r"<svg.*?</svg>", html):
        ET.fromstring(svg)


def test_report_escapes_every_user_string_and_shows_novelty_confidence_and_flags(patient):
    sample, labels = patient
    hostile = "<script>alert(1)</script>"
    events = np.array(sample.events, copy=True)
    events[:600, 0] = 262143.0                                # 5% of FSC-A at the ceiling
    raw = Sample(sample.name, events, sample.channels, {**sample.keywords, "$FIL": hostile})
    populations = labels.astype(object).copy()
    populations[:10] = hostile
    confidence = np.full(labels.size, 0.9)
    confidence[:1200] = 0.3
    html = patient_report_html(hostile, raw, populations, confidence=confidence, file_name=f"{hostile}.fcs",
                               model_name=hostile, novelty={"score": 3.2, "threshold": 1.5, "is_novel": True})
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "novelty score 3.20 (threshold 1.50): UNLIKE every training patient" in html
    assert "Mean confidence 0.840; 1,200 cells (10.0%) below 0.60." in html
    assert "FSC-A: 600 events (5.0%) at the top of the range" in html
    assert "no spillover matrix" in html
    assert html.count("<svg") == 4  # flat: scatter, then the channels that set the three largest populations apart


def test_report_says_what_review_did_and_keeps_an_accepted_patients_flags_as_history(patient, tree):
    sample, labels = patient
    flagged = {"score": 3.2, "threshold": 1.5, "is_novel": True, "disagreement": 0.31,
               "disagreement_threshold": 0.2}
    to_review = patient_report_html("p", sample, labels, tree=tree, novelty=flagged)
    assert ("<p class='warn'>novelty score 3.20 (threshold 1.50): UNLIKE every training patient: review the "
            "populations by hand.</p>") in to_review
    assert ("<p class='warn'>the transfer model and the patient&#x27;s own populations disagree on 31.0% of its cells "
            "(review above 20%): review the populations by hand.</p>") in to_review
    assert "Reviewed" not in to_review and "adjusted by hand" not in to_review

    corrected = patient_report_html("p", sample, labels, tree=tree, novelty=flagged, cells_corrected=1234,
                                    gates_before_correction=True)
    assert "<p>Reviewed: 1,234 cells corrected by hand.</p>" in corrected
    assert ("<p class='warn'>The gates were adjusted by hand before cells were corrected: they may no longer "
            "enclose the corrected populations.") in corrected
    assert corrected.count(": review the populations by hand.") == 2

    accepted = patient_report_html("p", sample, labels, tree=tree, novelty=flagged, cells_corrected=0,
                                   accepted=True)
    assert "<p>Reviewed: 0 cells corrected by hand; accepted as the patient's labels.</p>" in accepted
    assert ("<p class='meta'>novelty score 3.20 (threshold 1.50): UNLIKE every training patient: flagged for "
            "review when gated; reviewed and accepted.</p>") in accepted
    assert ("disagree on 31.0% of its cells (review above 20%): flagged for review when gated; reviewed and "
            "accepted.</p>") in accepted
    assert "review the populations by hand" not in accepted and "class='warn'>novelty" not in accepted
    calm = {"score": 0.8, "threshold": 1.5, "is_novel": False, "disagreement": 0.05, "disagreement_threshold": 0.2}
    assert ("<p class='ok'>novelty score 0.80 (threshold 1.50): resembles the training patients.</p>"
            in patient_report_html("p", sample, labels, novelty=calm, accepted=True))


def test_report_draws_quadrant_range_and_boolean_gates(patient, tree):
    """Every gate kind is drawn: a quadrant split as its two lines with each quadrant named in
    its corner, a range gate as a band on its parent's histogram; a boolean gate has no plot."""
    sample, labels = patient
    scales = {c: panel_scale(c, [sample]) for c in sample.pnn}
    mixed = tree.copy()
    mixed.remove("CD4 T cells")
    mixed.remove("CD8 T cells")
    for gate in quadrant_gates("FL3-A", "FL6-A", (2.0, 2.0), scales["FL3-A"], scales["FL6-A"], parent="T cells",
                               x_name="CD4", y_name="CD8"):
        mixed.add(gate)
    mixed.add(range_gate("CD19 bright", "FL4-A", 2.0, 8.0, scales["FL4-A"], parent="Lymphocytes"))
    mixed.add(boolean_gate("not T cells", "not", ["T cells"], parent="Lymphocytes"))
    html = patient_report_html("p", sample, labels, tree=mixed)
    svgs = re.findall(r"<svg.*?</svg>", html)
    for svg in svgs:
        ET.fromstring(svg)
    quadrant_plot = next(s for s in svgs if "T cells \u2192 CD4+ CD8+" in s)
    assert quadrant_plot.count("<line") == 2
    for name in ("CD4+ CD8+", "CD4+ CD8-", "CD4- CD8+", "CD4- CD8-"):
        assert f">{name} " in quadrant_plot
    range_plot = next(s for s in svgs if "Lymphocytes \u2192 CD19 bright" in s)
    assert range_plot.count("fill-opacity=\"0.12\"") == 1 and ">CD19 bright " in range_plot
    assert not any("not T cells" in s for s in svgs)
    assert "<td>not T cells</td>" in html
    # a tree of one range gate: the histogram alone
    only = GateTree([range_gate("FSC high", "FSC-A", 1e5, 2e5)])
    html = patient_report_html("p", sample, labels, tree=only)
    assert html.count("<svg") == 1 and "<td>FSC high</td>" in html


def test_svg_histogram_bands_are_placed_on_the_axis():
    svg = svg_histogram(np.array([0.0, 1.0, 1.0, 9.0]), (0, 10), title="t", bands=[("G", 0.0, 5.0, "50%")])
    root = ET.fromstring(svg)
    band = [e for e in root.iter() if e.tag.endswith("rect") and e.get("fill-opacity") == "0.12"][0]
    assert band.get("x") == "48.0" and band.get("width") == "151.0"   # 0..5 of 0..10 over 302 px


def _small_sample():
    """Nine events of a flow panel (so arcsinh cofactor 150): FSC-A, CD4 on FL1-A, and Time."""
    from gating_core.fcs import Channel

    events = np.array([[100.0, 1.0, 0], [200.0, 2.0, 1], [400.0, 4.0, 2],             # x
                       [1e3, -50.0, 3], [1e4, 0.0, 4], [1e5, 50.0, 5], [5e4, 1000.0, 6],  # y
                       [300.0, -10.0, 7], [300.0, 5.0, 8]])                              # w
    sample = Sample("s", events, [Channel("FSC-A"), Channel("FL1-A", "CD4"), Channel("Time")])
    return sample, np.array(["x"] * 3 + ["y"] * 4 + ["w"] * 2)


def test_each_row_has_the_median_geometric_mean_and_cv_of_every_marker():
    """Exact values on a small known sample. The geometric mean is 150 sinh(mean(arcsinh(x / 150))):
    close to exp(mean(log x)) for cells well above the cofactor, defined at zero and below."""
    sample, labels = _small_sample()
    rows = population_rows("s", labels, sample=sample)
    markers = ["FSC-A", "CD4 (FL1-A)"]
    assert list(rows.columns) == BATCH_COLUMNS + [f"{s} {m}" for s in ("median", "geometric mean", "CV")
                                                  for m in markers]  # no Time
    rows = rows.set_index("population")
    assert rows["count"].to_dict() == {"y": 4, "x": 3, "w": 2}
    x, y, w = rows.loc["x"], rows.loc["y"], rows.loc["w"]
    assert (x["median FSC-A"], x["median CD4 (FL1-A)"]) == (200.0, 2.0)
    assert x["CV FSC-A"] == pytest.approx(65.4653670707977, rel=1e-12)      # SD (n - 1) / mean, in %
    assert x["CV CD4 (FL1-A)"] == pytest.approx(65.4653670707977, rel=1e-12)
    assert x["geometric mean FSC-A"] == pytest.approx(211.48502167071024, rel=1e-12)  # 200 by logs
    assert x["geometric mean CD4 (FL1-A)"] == pytest.approx(2.333247219443062, rel=1e-12)  # far below 150
    assert (y["median FSC-A"], y["median CD4 (FL1-A)"]) == (30000.0, 25.0)
    assert y["geometric mean FSC-A"] == pytest.approx(14974.200913214592, rel=1e-12)  # 14,953.5 by logs
    assert y["geometric mean CD4 (FL1-A)"] == pytest.approx(104.32229524536234, rel=1e-12)  # values <= 0 too
    assert y["CV FSC-A"] == pytest.approx(112.22143260690024, rel=1e-12)
    assert y["CV CD4 (FL1-A)"] == pytest.approx(200.6655592438988, rel=1e-12)
    assert w["geometric mean FSC-A"] == pytest.approx(300.0, rel=1e-12) and w["CV FSC-A"] == 0.0
    assert w["geometric mean CD4 (FL1-A)"] == pytest.approx(-2.4968817096105473, rel=1e-12)
    assert np.isnan(w["CV CD4 (FL1-A)"])  # a mean at or below zero: no CV
    # a gate's row: the statistics of the cells it counts
    tree = GateTree([rectangle_gate("big", "FSC-A", "FL1-A", (5e3, 2e5), (-100.0, 2000.0))])
    gated = population_rows("s", labels, tree=tree, sample=sample).set_index("population")
    assert gated.loc["big", "count"] == 3 and gated.loc["big", "median FSC-A"] == 5e4
    # the report's own table keeps to the counts; no events, no marker columns
    assert list(population_rows("s", labels).columns) == BATCH_COLUMNS
    assert "median FSC-A" not in patient_report_html("s", sample, labels)


def test_marker_statistics_of_bright_cells_are_their_geometric_mean_and_empty_cells_have_none():
    from gating_core.reports.marker_stats import MarkerStatistics

    stats = MarkerStatistics(np.array([[1e3], [1e4], [1e5]]), ["CD4"], [5.0])  # a mass cytometer's cofactor
    values = stats(np.ones(3, bool))
    assert values["geometric mean CD4"] == pytest.approx(1e4, rel=3e-6)
    assert values["median CD4"] == 1e4
    empty = stats(np.zeros(3, bool))
    assert all(np.isnan(v) for v in empty.values()) and list(empty) == stats.columns
    one = stats(np.array([True, False, False]))
    assert one["median CD4"] == 1e3 and one["geometric mean CD4"] == pytest.approx(1e3) and np.isnan(one["CV CD4"])
    with pytest.raises(ValueError):
        MarkerStatistics(np.zeros((3, 2)), ["A"], [5.0])


def test_statistics_table_holds_the_same_marker_statistics():
    from gating_core.reports.marker_stats import MarkerStatistics
    from gating_core.reports.plotting import population_table, sample_channel_label

    sample, labels = _small_sample()
    markers = MarkerStatistics.of_sample(sample, sample_channel_label)
    assert markers.labels == ["FSC-A", "CD4 (FL1-A)"] and markers.cofactors.tolist() == [150.0, 150.0]
    table = population_table(markers.events, markers.labels, labels, cofactors=markers.cofactors)
    rows = population_rows("s", labels, sample=sample)
    columns = markers.columns
    pd.testing.assert_frame_equal(table.set_index("population")[columns].sort_index(),
                                  rows.set_index("population")[columns].sort_index())


def test_catch_all_populations_are_grey_each_in_its_own_shade():
    from gating_core.reports.plotting import OTHER_COLORS, PALETTE, population_colors

    colors = population_colors(["B cells", "other", "T cells", "ungated", "Unlabeled"])
    assert [colors[n] for n in ("other", "ungated", "Unlabeled")] == list(OTHER_COLORS[:3])
    assert [colors["B cells"], colors["T cells"]] == list(PALETTE[:2])


def test_a_result_without_gates_is_drawn_on_the_channels_that_set_its_populations_apart(patient):
    """Scatter first, then for the largest populations the two channels most apart from the rest
    (the catch-all `other` chooses none); without populations, the first two other channels."""
    from gating_core.reports.report import channel_pairs

    sample, labels = patient
    assert channel_pairs(sample, labels) == [("FSC-A", "SSC-A"), ("FL7-A", "FL1-A"), ("FL3-A", "FL1-A"),
                                                 ("FL5-A", "FL1-A")]  # CD45, CD4 and CD14 against CD3
    assert channel_pairs(sample) == [("FSC-A", "SSC-A"), ("FL1-A", "FL2-A")]
    html = patient_report_html("p", sample, labels)
    assert html.count("<svg") == 4 and "CD14" in html


def test_a_mass_cytometry_result_without_gates_is_drawn_on_its_populations_markers(multicenter_dir):
    from gating_core.reports.report import channel_pairs

    sample = read_fcs(multicenter_dir / "multicenter_09.fcs")
    labels = pd.read_csv(multicenter_dir / "multicenter_09.labels.csv").iloc[:, 0].to_numpy().astype(str)
    marker = {c.pnn: c.pns or c.pnn for c in sample.channels}
    pairs = [(marker[x], marker[y]) for x, y in channel_pairs(sample, labels)]
    # monocytes, CD4 T cells, B cells, CD8 T cells; `ungated` chooses none
    assert pairs == [("CD14", "CD45"), ("CD3", "CD4"), ("CD20", "CCR6"), ("CD8", "CD3")]
    assert [(marker[x], marker[y]) for x, y in channel_pairs(sample)] == [("CCR6", "CD20")]
    # the report's plots, 300 pixels wide, keep their ticks a tenth of the axis apart: no "-1", "0"
    # and "1" run together on the CD4 axis
    html = patient_report_html("multicenter_09", sample, labels)
    assert html.count("<svg") == 4 and ">0<" in html and ">-1<" not in html
