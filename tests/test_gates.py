"""Gates, gate trees, FlowJo/GatingML import, upload ingestion and plot data preparation."""

from __future__ import annotations

import json
import warnings

import flowkit
import numpy as np
import pytest

from gating_core.fcs import Channel, Sample, write_fcs
from gating_core.gates import (
    OTHER, AxisScale, GateError, GateImportError, GateTree, apply_gatingml, apply_workspace,
    polygon_gate, rectangle_gate, safe_stem, suggest_scale,
)
from gating_core.reports import plotting
from ui.app_state import channel_presence, common_channels, rename_channels, shape_from_selection
from ui.ingest import classify, ingest_files


def grid_sample(name="grid"):
    """Events on the integer grid 0..9 x 0..9 (100 events) plus a third channel = x + y."""
    xs, ys = np.meshgrid(np.arange(10.0), np.arange(10.0))
    events = np.column_stack([xs.ravel(), ys.ravel(), xs.ravel() + ys.ravel()])
    return Sample(name, events, [Channel("A", "CD3"), Channel("B", "CD4"), Channel("C")])


def random_sample(n=5000, seed=0, name="rand"):
    rng = np.random.default_rng(seed)
    events = rng.uniform(0, 100, size=(n, 3))
    return Sample(name, events, [Channel("A"), Channel("B"), Channel("C")])


# ------------------------------------------------------------------------------------ geometry

def test_rectangle_counts_grid_points_inclusively():
    gate = rectangle_gate("R", "A", "B", (2, 4), (0, 1))
    inside = gate.contains(grid_sample())
    # x in {2,3,4} and y in {0,1}: 6 points
    assert inside.sum() == 6
    assert gate.vertices == [(2.0, 0.0), (4.0, 1.0)]


def test_polygon_matches_half_plane_and_accepts_marker_names():
    # Triangle below the line y = x (strictly), drawn wide enough to cover the grid's lower half.
    gate = polygon_gate("T", "CD3", "CD4", [(-0.5, -1.0), (20.0, -1.0), (20.0, 19.5)])
    sample = grid_sample()
    inside = gate.contains(sample)
    expected = (sample.events[:, 1] < sample.events[:, 0] - 0.0)  # 45 points with y < x
    # The hypotenuse runs from (-0.5,-1) to (20,19.5): y = x - 0.5, so y < x - 0.5 <=> y < x on the grid.
    assert inside.sum() == 45
    np.testing.assert_array_equal(inside, expected)


def test_gate_in_arcsinh_coordinates_tests_transformed_values():
    scale = AxisScale("arcsinh", cofactor=5.0)
    sample = random_sample()
    lo, hi = np.arcsinh(np.array([10.0, 50.0]) / 5.0)
    gate = rectangle_gate("R", "A", "B", (lo, hi), (lo, hi), scale, scale)
    a, b = sample.events[:, 0], sample.events[:, 1]
    expected = (a >= 10) & (a <= 50) & (b >= 10) & (b <= 50)
    np.testing.assert_array_equal(gate.contains(sample), expected)


def test_logicle_scale_round_trips():
    scale = AxisScale("logicle", top=262144, width=0.5, decades=4.5)
    raw = np.array([-200.0, 0.0, 10.0, 1e3, 1e5, 262144.0])
    shown = scale.forward(raw)
    assert np.all(np.diff(shown) > 0)
    assert shown[-1] == pytest.approx(1.0, abs=1e-6)  # T maps to the top of the display
    np.testing.assert_allclose(scale.inverse(shown), raw, rtol=1e-6, atol=1e-3)


def test_nan_events_are_outside_every_gate():
    sample = grid_sample()
    sample.events[0, 0] = np.nan
    gate = polygon_gate("P", "A", "B", [(-1, -1), (20, -1), (20, 20), (-1, 20)])
    inside = gate.contains(sample)
    assert not inside[0] and inside[1:].all()


@pytest.mark.parametrize("vertices,kind", [([(0, 0), (1, 1)], "polygon"), ([(0, 0), (1, 1), (2, 2)], "polygon"),
                                           ([(0, 0), (0, 5)], "rectangle"), ([(0, 0), (1, np.nan), (2, 0)], "polygon")])
def test_degenerate_shapes_are_rejected(vertices, kind):
    with pytest.raises(GateError):
        if kind == "polygon":
            polygon_gate("bad", "A", "B", vertices)
        else:
            rectangle_gate("bad", "A", "B", (vertices[0][0], vertices[1][0]), (vertices[0][1], vertices[1][1]))


def test_lasso_path_repeating_first_point_is_closed_once():
    gate = polygon_gate("L", "A", "B", [(0, 0), (5, 0), (5, 5), (0, 0)])
    assert len(gate.vertices) == 3


@pytest.mark.parametrize("name", ["", "other", "OTHER", "a/b", "x" * 81])
def test_bad_gate_names_are_rejected(name):
    with pytest.raises(GateError):
        rectangle_gate(name, "A", "B", (0, 1), (0, 1))


def test_gate_on_missing_channel_names_the_sample_and_channel():
    gate = rectangle_gate("R", "FSC-A", "B", (0, 1), (0, 1))
    with pytest.raises(GateError, match="grid.*FSC-A"):
        gate.contains(grid_sample())


# ------------------------------------------------------------------------------------ trees

def lymph_tree():
    tree = GateTree()
    tree.add(rectangle_gate("Lymphocytes", "A", "B", (0, 50), (0, 50)))
    tree.add(polygon_gate("T cells", "A", "C", [(0, 0), (50, 0), (0, 50)], parent="Lymphocytes"))
    tree.add(rectangle_gate("B cells", "B", "C", (30, 50), (60, 100), parent="Lymphocytes"))
    tree.add(rectangle_gate("Monocytes", "A", "B", (60, 100), (60, 100)))
    return tree


def test_nested_memberships_labels_and_statistics():
    sample = random_sample()
    tree = lymph_tree()
    a, b, c = sample.events.T
    lymph = (a <= 50) & (b <= 50)
    t_cells = lymph & (a + c < 50)
    b_cells = lymph & (b >= 30) & (c >= 60)
    mono = (a >= 60) & (b >= 60)
    masks = tree.memberships(sample)
    np.testing.assert_array_equal(masks["Lymphocytes"], lymph)
    np.testing.assert_array_equal(masks["T cells"], t_cells)
    np.testing.assert_array_equal(masks["B cells"], b_cells)
    assert [g.name for g in tree.leaves()] == ["T cells", "B cells", "Monocytes"]
    labels = tree.labels(sample)
    assert (labels == "T cells").sum() == t_cells.sum()
    assert (labels == "B cells").sum() == (b_cells & ~t_cells).sum()
    assert (labels == "Monocytes").sum() == mono.sum()
    assert (labels == OTHER).sum() == sample.n_events - (t_cells | b_cells | mono).sum()
    stats = tree.statistics(sample).set_index("gate")
    assert stats.loc["T cells", "count"] == t_cells.sum()
    assert stats.loc["T cells", "% of parent"] == pytest.approx(100 * t_cells.sum() / lymph.sum())
    assert stats.loc["T cells", "% of total"] == pytest.approx(100 * t_cells.sum() / sample.n_events)
    assert stats.loc["T cells", "depth"] == 1 and stats.loc["Monocytes", "parent"] == "(all events)"


def test_tree_json_round_trip_keeps_labels():
    sample = random_sample(seed=3)
    tree = lymph_tree()
    tree.add(polygon_gate("CD4", "B", "C", [(0, 0), (40, 0), (40, 40), (0, 40)],
                          AxisScale("arcsinh", cofactor=5), AxisScale("logicle", top=1000, width=0.3), "T cells"))
    text = tree.to_json()
    json.loads(text)  # plain JSON
    again = GateTree.from_json(text)
    assert again == tree
    np.testing.assert_array_equal(again.labels(sample), tree.labels(sample))


def test_tree_structure_errors_and_removal_with_undo():
    tree = lymph_tree()
    with pytest.raises(GateError, match="already exists"):
        tree.add(rectangle_gate("Monocytes", "A", "B", (0, 1), (0, 1)))
    with pytest.raises(GateError, match="parent gate 'nope'"):
        tree.add(rectangle_gate("X", "A", "B", (0, 1), (0, 1), parent="nope"))
    from ui.gate_history import GateHistory  # the page's undo lives with the app

    history = GateHistory()
    history.push(tree)
    removed = tree.remove("Lymphocytes")
    assert sorted(removed) == ["B cells", "Lymphocytes", "T cells"]
    assert tree.names == ["Monocytes"]
    restored = history.undo()
    assert restored.names == ["Lymphocytes", "T cells", "B cells", "Monocytes"]
    assert not history.can_undo()
    with pytest.raises(GateError):
        history.undo()


def test_copy_is_independent_and_geometry_adjusts_per_patient():
    tree = lymph_tree()
    other = tree.copy()
    other.replace_geometry("Monocytes", [(70, 70), (100, 100)])
    assert tree["Monocytes"].vertices == [(60.0, 60.0), (100.0, 100.0)]
    assert other["Monocytes"].vertices == [(70.0, 70.0), (100.0, 100.0)]
    other.rename("Lymphocytes", "Lymphs")
    assert other["T cells"].parent == "Lymphs" and tree["T cells"].parent == "Lymphocytes"


def test_check_channels_reports_missing():
    tree = lymph_tree()
    tree.add(rectangle_gate("Z", "FSC-A", "A", (0, 1), (0, 1)))
    assert tree.check_channels(random_sample()) == ["FSC-A"]


# ------------------------------------------------------------------------------------ FlowKit import

def flowkit_strategy():
    # GatingML gate ids are XML IDs: no spaces.
    strategy = flowkit.GatingStrategy()
    dims = [flowkit.Dimension("A", range_min=0, range_max=50), flowkit.Dimension("B", range_min=0, range_max=50)]
    strategy.add_gate(flowkit.gates.RectangleGate("Lymphocytes", dims), ("root",))
    strategy.add_gate(flowkit.gates.PolygonGate("T_cells", [flowkit.Dimension("A"), flowkit.Dimension("C")],
                                                [(0, 0), (50, 0), (0, 50)]), ("root", "Lymphocytes"))
    dims = [flowkit.Dimension("A", range_min=60, range_max=100), flowkit.Dimension("B", range_min=60, range_max=100)]
    strategy.add_gate(flowkit.gates.RectangleGate("Monocytes", dims), ("root",))
    return strategy


def our_equivalent_tree():
    tree = GateTree()
    tree.add(rectangle_gate("Lymphocytes", "A", "B", (0, 50), (0, 50)))
    tree.add(polygon_gate("T_cells", "A", "C", [(0, 0), (50, 0), (0, 50)], parent="Lymphocytes"))
    tree.add(rectangle_gate("Monocytes", "A", "B", (60, 100), (60, 100)))
    return tree


def test_gatingml_file_written_by_flowkit_gives_leaf_labels(tmp_path):
    path = tmp_path / "expert.xml"
    with open(path, "wb") as handle:
        flowkit.export_gatingml(flowkit_strategy(), handle)
    sample = random_sample(seed=5)
    labels = apply_gatingml(path, sample)
    np.testing.assert_array_equal(labels, our_equivalent_tree().labels(sample))
    assert set(labels) == {"T_cells", "Monocytes", OTHER}


def test_flowjo_workspace_written_by_flowkit_gives_leaf_labels(tmp_path):
    s1, s2 = random_sample(seed=6, name="p1"), random_sample(seed=7, name="p2")
    session = flowkit.Session(gating_strategy=flowkit_strategy(), fcs_samples=[
        flowkit.Sample(s.events, sample_id=f"{s.name}.fcs", channel_labels=["A", "B", "C"]) for s in (s1, s2)])
    path = tmp_path / "expert.wsp"
    with open(path, "wb") as handle:
        session.export_wsp(handle, "All Samples")
    result = apply_workspace(path, {"p1.fcs": s1, "p2.fcs": s2})
    assert sorted(result) == ["p1.fcs", "p2.fcs"]
    np.testing.assert_array_equal(result["p2.fcs"], our_equivalent_tree().labels(s2))


def test_bad_gatingml_and_unmatched_workspace_name_the_file(tmp_path):
    bad = tmp_path / "broken.xml"
    bad.write_text("<gating:Gating-ML><unclosed>")
    with pytest.raises(GateImportError, match="broken.xml"):
        apply_gatingml(bad, random_sample())
    session = flowkit.Session(gating_strategy=flowkit_strategy(), fcs_samples=[
        flowkit.Sample(random_sample().events, sample_id="p1.fcs", channel_labels=["A", "B", "C"])])
    wsp = tmp_path / "w.wsp"
    with open(wsp, "wb") as handle:
        session.export_wsp(handle, "All Samples")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FlowKit's note on each sample not loaded stays inside
        with pytest.raises(GateImportError, match=r"w.wsp.*names samples \['p1.fcs'\] but none of the loaded "
                                                  r"files \(\['other.fcs'\]\)"):
            apply_workspace(wsp, {"other.fcs": random_sample()})


# ------------------------------------------------------------------------------------ uploads

def fcs_bytes(tmp_path, sample, name="x.fcs"):
    path = tmp_path / name
    write_fcs(path, sample.events, sample.pnn)
    return path.read_bytes()


def test_ingest_fcs_with_labels_bad_file_and_hostile_names(tmp_path):
    pytest.importorskip("gating_core.io.labels")
    sample = random_sample(n=300, seed=1)
    tree = lymph_tree()
    labels = tree.labels(sample)
    label_csv = ("population\n" + "\n".join(labels) + "\n").encode()
    work = tmp_path / "work"
    files = [
        ("../../etc/patient A.fcs", fcs_bytes(tmp_path, sample)),
        ("patient A.labels.csv", label_csv),
        ("broken.fcs", b"FCS3.1 not really an fcs file"),
        ("orphan.labels.csv", label_csv),
        ("notes.docx", b"hello"),
        ("new one.fcs", fcs_bytes(tmp_path, random_sample(n=200, seed=2), "y.fcs")),
    ]
    report = ingest_files(files, work)
    by_name = {p.name: p for p in report.patients}
    assert sorted(by_name) == ["new_one", "patient_A"]
    assert by_name["patient_A"].sample.n_events == 300
    np.testing.assert_array_equal(by_name["patient_A"].labels, labels)
    assert by_name["patient_A"].label_source == "labels CSV"
    assert by_name["new_one"].labels is None
    errors = dict(report.errors)
    assert sorted(errors) == ["broken.fcs", "notes.docx", "orphan.labels.csv"]
    assert errors["broken.fcs"].startswith("broken.fcs: ")
    assert "no FCS file orphan.fcs" in errors["orphan.labels.csv"]
    # a labels file that does not fit its FCS file: the patient loads, unlabeled, and the error says so
    short = ingest_files([("p9.fcs", fcs_bytes(tmp_path, random_sample(n=50, seed=3), "p9.fcs")),
                          ("p9.labels.csv", label_csv)], tmp_path / "work9")
    assert [p.name for p in short.patients] == ["p9"] and short.patients[0].labels is None
    ((name, message),) = short.errors
    assert name == "p9.labels.csv" and "label rows but the sample has 50 events" in message
    assert message.endswith("p9 is loaded without labels, as a new patient: drop a corrected labels file to label it")
    # every written file lives in the work folder under a generated name
    written = sorted(p.name for p in work.iterdir())
    assert all(n.startswith("upload-") for n in written) and len(written) == 5
    assert not (tmp_path.parent / "etc").exists()


def test_ingest_workspace_with_its_fcs_files(tmp_path):
    s1 = random_sample(n=400, seed=8, name="p1")
    session = flowkit.Session(gating_strategy=flowkit_strategy(), fcs_samples=[
        flowkit.Sample(s1.events, sample_id="p1.fcs", channel_labels=["A", "B", "C"])])
    wsp = tmp_path / "w.wsp"
    with open(wsp, "wb") as handle:
        session.export_wsp(handle, "All Samples")
    report = ingest_files([("p1.fcs", fcs_bytes(tmp_path, s1)), ("w.wsp", wsp.read_bytes())], tmp_path / "work")
    assert report.errors == []
    (patient,) = report.patients
    assert patient.label_source == "FlowJo workspace"
    expected = our_equivalent_tree().labels(Sample("p1", patient.sample.events, s1.channels))
    np.testing.assert_array_equal(patient.labels, expected)


def test_classify_and_safe_stem():
    assert classify("a.FCS") == "fcs" and classify("a.labels.csv") == "labels" and classify("a.gated.csv") == "gated"
    assert classify("x.wsp") == "workspace" and classify("x.xml") == "gatingml" and classify("x.exe") == "unknown"
    assert safe_stem("..\\..\\Windows\\evil name.fcs") == "evil_name"
    assert safe_stem("p.labels.csv") == "p" and safe_stem("...") == "file"


def test_channel_presence_and_rename():
    s1 = random_sample(n=10, name="a")
    s2 = Sample("b", s1.events, [Channel("A"), Channel("B"), Channel("Cx")])
    presence = channel_presence({"a": s1, "b": s2})
    assert list(presence.index) == ["A", "B", "C", "Cx"]
    assert presence.loc["C"].tolist() == [True, False] and presence.loc["Cx"].tolist() == [False, True]
    fixed = rename_channels(s2, {"Cx": "C"})
    assert fixed.pnn == ["A", "B", "C"] and fixed.events is s2.events
    assert common_channels([s1, fixed]) == ["A", "B", "C"]
    with pytest.raises(ValueError, match="two channels named A"):
        rename_channels(s2, {"B": "A"})


# ------------------------------------------------------------------------------------ plotting

def test_density_grid_counts_every_event_in_range():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=20000), rng.normal(size=20000)
    counts, xc, yc = plotting.density_grid(x, y, (-10, 10), (-10, 10), bins=50)
    assert counts.shape == (50, 50) and counts.sum() == 20000
    assert xc[0] == pytest.approx(-9.8) and yc[-1] == pytest.approx(9.8)
    # orientation: rows are y bins
    counts, _, _ = plotting.density_grid(np.array([9.0]), np.array([-9.0]), (-10, 10), (-10, 10), bins=10)
    assert counts[0, 9] == 1


def test_subsample_is_reproducible_and_bounded():
    a = plotting.subsample_indices(1_000_000, 20_000)
    b = plotting.subsample_indices(1_000_000, 20_000)
    np.testing.assert_array_equal(a, b)
    assert a.size == 20_000 and np.all(np.diff(a) > 0)
    assert plotting.subsample_indices(50, 100).tolist() == list(range(50))


def test_ticks_are_in_raw_units():
    scale = AxisScale("arcsinh", cofactor=5)
    lo, hi = scale.forward(np.array([-20.0, 20000.0]))
    vals, text = plotting.raw_ticks(scale, lo, hi)
    assert text == ["-10", "0", "10", "100", "1000", "10K"]
    np.testing.assert_allclose(scale.inverse(np.array(vals)), [-10, 0, 10, 100, 1000, 10000], rtol=1e-9)
    vals, text = plotting.raw_ticks(AxisScale("linear"), 0, 262144)
    assert text == ["0", "50K", "100K", "150K", "200K", "250K"]


def test_suggest_scale_picks_cofactor_by_range():
    rng = np.random.default_rng(0)
    assert suggest_scale("arcsinh", rng.uniform(0, 500, 1000)).cofactor == 5
    assert suggest_scale("arcsinh", rng.uniform(0, 200000, 1000)).cofactor == 150
    logicle = suggest_scale("logicle", rng.uniform(-50, 200000, 1000))
    assert logicle.top == 1e6 or logicle.top == 1e5 * 10  # 99.99th pct ~2e5 rounds up to 10^6
    assert 0 <= logicle.width <= 1


def test_population_table_counts_percentages_and_medians():
    events = np.array([[1.0, 10], [3, 30], [5, 50], [7, 70]])
    pops = np.array(["T", "T", "T", "B"])
    table = plotting.population_table(events, ["A", "B"], pops, parents={"T": "B"},
                                      confidence=np.array([1.0, 0.5, 0.0, 1.0])).set_index("population")
    assert table.loc["T", "count"] == 3 and table.loc["T", "% of total"] == 75.0
    assert table.loc["T", "% of parent"] == 300.0  # parent B has one cell: the API takes the mapping as given
    assert table.loc["T", "median A"] == 3.0 and table.loc["B", "median B"] == 70.0
    assert table.loc["T", "mean confidence"] == 0.5


def test_shape_from_plotly_selection():
    assert shape_from_selection(None) is None
    assert shape_from_selection({"points": [], "box": [], "lasso": []}) is None
    box = {"points": [], "box": [{"xref": "x", "yref": "y", "x": [5.0, 1.0], "y": [2.0, 7.5]}], "lasso": []}
    assert shape_from_selection(box) == {"kind": "rectangle", "vertices": [(1.0, 2.0), (5.0, 7.5)]}
    lasso = {"box": [], "lasso": [{"x": [0, 1], "y": [0, 1]}, {"x": [-.5, 4.5, 4.5, -.5], "y": [-.5, -.5, 3.5, 3.5]}]}
    shape = shape_from_selection(lasso)
    assert shape == {"kind": "polygon", "vertices": [(-0.5, -0.5), (4.5, -0.5), (4.5, 3.5), (-0.5, 3.5)]}
    gate = polygon_gate("g", "A", "B", shape["vertices"])
    assert gate.contains(grid_sample()).sum() == 20  # x in 0..4, y in 0..3 on the grid
    assert shape_from_selection({"lasso": [{"x": [1, 2], "y": [1, 2]}], "box": []}) is None


# ---------------------------------------------------------------------------- panel transforms

def test_panel_scale_is_the_same_for_every_patient_of_a_panel(sample_data_dir):
    from gating_core.fcs import read_fcs
    from gating_core.gates import panel_scale, with_kind

    p01 = read_fcs(sample_data_dir / "patient_01.fcs", compensate=True)
    n03 = read_fcs(sample_data_dir / "new" / "new_patient_03.fcs", compensate=True)
    # chosen from each patient's values, CD4 (FL3-A) gets two different cofactors ...
    per_patient = {suggest_scale("arcsinh", s.events[:, s.channel_index("FL3-A")]).cofactor for s in (p01, n03)}
    assert per_patient == {5.0, 150.0}
    # ... chosen for the panel, one, whichever patient comes first
    scales = {panel_scale("FL3-A", order) for order in ([p01], [n03], [p01, n03], [n03, p01])}
    assert scales == {AxisScale("arcsinh", cofactor=150.0, top=262144.0, width=0.5, decades=4.5)}
    assert panel_scale("FSC-A", [p01]).kind == "linear"
    assert with_kind(panel_scale("FSC-A", [p01]), "logicle").top == 262144.0  # from $PnR
    # a mass cytometer: cofactor 5 on every channel, whatever the values
    mass = Sample("cytof", np.abs(np.random.default_rng(0).normal(0, 50, (500, 2))),
                  [Channel("Nd142Di", "CD19", 10000.0), Channel("Nd148Di", "CD4", 10000.0)], {"$CYT": "Helios"})
    assert panel_scale("Nd148Di", [mass]) == AxisScale("arcsinh", cofactor=5.0, top=10000.0)


def test_a_gate_is_outlined_on_other_scales_through_raw_values():
    old = AxisScale("arcsinh", cofactor=5.0)
    new = AxisScale("arcsinh", cofactor=150.0)
    gate = rectangle_gate("R", "A", "B", tuple(old.forward(np.array([10.0, 1000.0]))),
                          tuple(old.forward(np.array([-20.0, 500.0]))), old, old)
    own = gate.outline()
    assert own.shape == (5, 2) and np.allclose(own[0], own[-1])
    mapped = gate.outline(new, new)
    assert mapped.shape == (4 * 24 + 1, 2)
    raw = np.column_stack([new.inverse(mapped[:, 0]), new.inverse(mapped[:, 1])])
    # every outline point stays on the gate's raw boundary: corners exactly, edges along it
    assert raw[:, 0].min() == pytest.approx(10.0) and raw[:, 0].max() == pytest.approx(1000.0)
    assert raw[:, 1].min() == pytest.approx(-20.0) and raw[:, 1].max() == pytest.approx(500.0)
    assert AxisScale("linear", cofactor=5.0).same_mapping(AxisScale("linear", cofactor=150.0))
    assert not old.same_mapping(new)
    assert not AxisScale("logicle", width=0.5).same_mapping(AxisScale("logicle", width=1.0))


def test_replace_geometry_on_new_scales_and_statistics_name_channels():
    sample = grid_sample()
    tree = GateTree()
    tree.add(rectangle_gate("low", "A", "B", (-0.5, 4.5), (-0.5, 4.5), AxisScale("linear"), AxisScale("linear")))
    arcsinh = AxisScale("arcsinh", cofactor=1.0)
    tree.replace_geometry("low", [tuple(arcsinh.forward(np.array([-0.5, -0.5]))),
                                  tuple(arcsinh.forward(np.array([2.5, 2.5])))], "rectangle", arcsinh, arcsinh)
    assert tree["low"].x_scale == arcsinh
    assert tree.memberships(sample)["low"].sum() == 9  # 0..2 x 0..2
    from gating_core.reports.plotting import sample_channel_label

    stats = tree.statistics(sample, channel_label=sample_channel_label)
    assert stats.loc[0, "axes"] == "CD3 (A) / CD4 (B)"
    assert tree.statistics(sample).loc[0, "axes"] == "A / B"


def test_upload_name_clashes_and_model_channel_check(tmp_path, sample_data_dir):
    from types import SimpleNamespace

    from ui.app_state import missing_model_channels
    from ui.ingest import split_name_clashes

    data = (sample_data_dir / "new" / "new_patient_01.fcs").read_bytes()
    labels = (sample_data_dir / "patient_01.labels.csv").read_bytes()
    existing = {"new_patient_01": SimpleNamespace(n_events=12000)}
    renamed = ingest_files([("new_patient_01.fcs", data)], tmp_path, existing=existing)
    assert [p.name for p in renamed.patients] == ["new_patient_01_2"]
    kept = ingest_files([("new_patient_01.fcs", data), ("New_Patient_01.fcs", data)], tmp_path,
                        existing=existing, rename_clashes=False)
    assert [p.name for p in kept.patients] == ["new_patient_01", "New_Patient_01_2"]  # unique within a batch
    free, clashing = split_name_clashes(kept.patients, existing)
    assert [p.name for p in free] == ["New_Patient_01_2"] and [p.name for p in clashing] == ["new_patient_01"]
    # labels for a loaded patient are no clash: they label it
    p01 = {"patient_01": SimpleNamespace(n_events=12000, sample=None)}
    only_labels = ingest_files([("patient_01.labels.csv", labels)], tmp_path, existing=p01, rename_clashes=False)
    assert split_name_clashes(only_labels.patients, p01)[1] == []
    assert only_labels.notes == [("patient_01.labels.csv",
                                  "patient_01.labels.csv: labels for the already loaded patient patient_01")]
    # labels of the wrong length for a loaded patient: an error naming the file, and no note that
    # they were taken
    wrong = ingest_files([("patient_01.labels.csv", labels)], tmp_path,
                         existing={"patient_01": SimpleNamespace(n_events=500, sample=None)}, rename_clashes=False)
    assert wrong.patients == [] and wrong.notes == []
    [(file_name, message)] = wrong.errors
    assert file_name == "patient_01.labels.csv" and message.startswith("patient_01.labels.csv")
    assert message.endswith(". The patient patient_01 is unchanged")
    model = SimpleNamespace(channels_=["FSC-A", "FL1-A", "FL9-A"], channel_markers_=["", "CD3", "CD99"])
    channels = [Channel("FSC-A", ""), Channel("B1-A", "CD3"), Channel("FL2-A", "CD56")]
    assert missing_model_channels(model, channels) == ["FL9-A"]  # FL1-A found by its marker


def test_label_change_table_and_label_set_checks():
    from ui.app_state import (incompatible_label_sets, label_change_table, label_set_disagreements,
                                       lost_populations)

    before = np.array(["B", "T", "T", "NK", "other"])
    after = np.array(["Cells", "Cells", "Cells", "other", "other"])
    table = label_change_table(before, after).set_index("population")
    assert table.to_dict("index") == {"T": {"before": 2, "after": 0, "change": -2},
                                      "B": {"before": 1, "after": 0, "change": -1},
                                      "NK": {"before": 1, "after": 0, "change": -1},
                                      "other": {"before": 1, "after": 2, "change": 1},
                                      "Cells": {"before": 0, "after": 3, "change": 3}}
    assert lost_populations(before, after) == ["B", "NK", "T"]
    assert lost_populations(None, after) == [] and (label_change_table(None, after)["before"] == 0).all()
    expert = {"B cells", "T cells", "NK cells", "Monocytes"}
    sets = {"p1": expert, "p2": expert, "depleted": expert - {"B cells"}}
    assert label_set_disagreements(sets) == {"B cells": ["depleted"]}
    assert incompatible_label_sets(sets) == []  # one population missing: possibly biology
    sets["drawn"] = {"Cells"}
    assert incompatible_label_sets(sets) == ["drawn"]
    assert label_set_disagreements({"a": expert, "b": expert}) == {}
