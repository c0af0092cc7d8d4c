"""Quadrant, 1-D range and boolean gates: geometry, tree semantics, JSON, GatingML round trip,
and back-gating."""

from __future__ import annotations

import flowkit
import numpy as np
import pytest

from gating_core.fcs import Channel, Sample, read_fcs
from gating_core.gates import (
    AxisScale, Gate, GateError, GateTree, apply_gatingml, boolean_gate, gate_name_from_xml, polygon_gate,
    quadrant_gates, quadrant_names, range_gate, rectangle_gate,
)
from gating_core.gates.export import export_flowjo_workspace, export_gatingml

ASINH = AxisScale("arcsinh", cofactor=150.0)
LOGICLE = AxisScale("logicle", top=262144.0, width=0.5, decades=4.5)


def grid_sample():
    """Events on the integer grid 0..9 x 0..9 (100 events) plus a third channel = x + y."""
    xs, ys = np.meshgrid(np.arange(10.0), np.arange(10.0))
    events = np.column_stack([xs.ravel(), ys.ravel(), xs.ravel() + ys.ravel()])
    return Sample("grid", events, [Channel("A", "CD3"), Channel("B", "CD4"), Channel("C")])


def counts(masks) -> dict:
    return {name: int(mask.sum()) for name, mask in masks.items()}


# ------------------------------------------------------------------------------------ geometry

def test_quadrant_gates_split_at_a_point_into_four_named_populations():
    gates = quadrant_gates("A", "B", (5, 3), x_name="CD3", y_name="CD4")
    assert [g.name for g in gates] == ["CD3+ CD4+", "CD3+ CD4-", "CD3- CD4+", "CD3- CD4-"]
    assert [g.quadrant for g in gates] == ["++", "+-", "-+", "--"]
    tree = GateTree(gates)
    # x >= 5 is "+" (5 columns), y >= 3 is "+" (7 rows): the split line belongs to "+".
    assert counts(tree.memberships(grid_sample())) == {"CD3+ CD4+": 35, "CD3+ CD4-": 15, "CD3- CD4+": 35,
                                                       "CD3- CD4-": 15}
    labels = tree.labels(grid_sample())
    assert labels[5 * 10 + 5] == "CD3+ CD4+" and labels[2 * 10 + 5] == "CD3+ CD4-"  # (x=5, y=5), (x=5, y=2)
    assert quadrant_names("CD4", "CD8")["+-"] == "CD4+ CD8-"


def test_range_gate_is_inclusive_and_nan_is_outside():
    sample = grid_sample()
    gate = range_gate("mid", "C", 3, 5)
    # x + y in {3, 4, 5}: 4 + 5 + 6 grid points
    assert int(gate.contains(sample).sum()) == 15
    assert gate.y_channel is None and gate.channels == ("C",)
    points = np.array([[3.0], [5.0], [5.0000001], [np.nan]])
    np.testing.assert_array_equal(gate.contains_points(points), [True, True, False, False])


def test_range_gate_tests_display_values_of_its_scale():
    sample = Sample("s", np.array([[10.0], [100.0], [1000.0], [-50.0]]), [Channel("FL1-A")])
    lo, hi = np.arcsinh(np.array([50.0, 500.0]) / 150.0)
    gate = range_gate("mid", "FL1-A", lo, hi, ASINH)
    np.testing.assert_array_equal(gate.contains(sample), [False, True, False, False])


def test_boolean_and_or_not_within_the_parent():
    sample = grid_sample()
    tree = GateTree()
    tree.add(rectangle_gate("left", "A", "B", (0, 4), (0, 9)))        # x <= 4: 50
    tree.add(rectangle_gate("low", "A", "B", (0, 9), (0, 2)))         # y <= 2: 30
    tree.add(boolean_gate("left and low", "and", ["left", "low"]))     # 5 x 3 = 15
    tree.add(boolean_gate("left or low", "OR", ["left", "low"]))       # 50 + 30 - 15 = 65
    tree.add(boolean_gate("not left", "not", ["left"]))                # 50
    tree.add(boolean_gate("low, not left", "not", ["left"], parent="low"))  # x >= 5, y <= 2: 15
    masks = tree.memberships(sample)
    assert counts(masks) == {"left": 50, "low": 30, "left and low": 15, "left or low": 65, "not left": 50,
                             "low, not left": 15}
    x, y = sample.events[:, 0], sample.events[:, 1]
    np.testing.assert_array_equal(masks["low, not left"], (x >= 5) & (y <= 2))
    assert tree["left or low"].operator == "or"
    stats = tree.statistics(sample, masks).set_index("gate")
    assert stats.loc["left and low", "axes"] == "left AND low"
    assert stats.loc["not left", "axes"] == "NOT left"
    assert stats.loc["low, not left", "% of parent"] == pytest.approx(50.0)


def test_boolean_needs_known_operands_and_its_arity():
    tree = GateTree([rectangle_gate("a", "A", "B", (0, 4), (0, 9)), rectangle_gate("b", "A", "B", (0, 9), (0, 2))])
    with pytest.raises(GateError, match="no gate named 'c'"):
        tree.add(boolean_gate("x", "and", ["a", "c"]))
    with pytest.raises(GateError, match="NOT takes exactly one gate"):
        boolean_gate("x", "not", ["a", "b"])
    with pytest.raises(GateError, match="AND needs at least two gates"):
        boolean_gate("x", "and", ["a"])
    with pytest.raises(GateError, match="operator must be one of"):
        boolean_gate("x", "xor", ["a", "b"])
    with pytest.raises(GateError, match="cannot refer to itself"):
        boolean_gate("a", "not", ["a"])
    with pytest.raises(GateError, match="boolean gate's cells come from its tree"):
        boolean_gate("x", "not", ["a"]).contains(grid_sample())


def test_invalid_quadrants_and_ranges_are_rejected():
    with pytest.raises(GateError, match="low < high"):
        range_gate("r", "A", 5, 5)
    with pytest.raises(GateError, match="quadrant must be one of"):
        Gate("q", "A", "B", "quadrant", [(1, 1)], quadrant="+")
    with pytest.raises(GateError, match="exactly one split point"):
        Gate("q", "A", "B", "quadrant", [(1, 1), (2, 2)], quadrant="++")
    with pytest.raises(GateError, match="four different names"):
        quadrant_gates("A", "B", (1, 1), names={"++": "a", "+-": "a", "-+": "b", "--": "c"})
    with pytest.raises(GateError, match="needs x channel"):
        Gate("r", None, None, "range", [(0, 1)])
    with pytest.raises(GateError, match="has no outline"):
        range_gate("r", "A", 0, 1).outline()


# ------------------------------------------------------------------------------------ tree editing

def edit_tree() -> GateTree:
    tree = GateTree()
    tree.add(rectangle_gate("cells", "A", "B", (0, 9), (0, 9)))
    for gate in quadrant_gates("A", "B", (5, 3), parent="cells", x_name="CD3", y_name="CD4"):
        tree.add(gate)
    tree.add(range_gate("high sum", "C", 10, 18, parent="CD3+ CD4+"))
    tree.add(boolean_gate("not T helper", "not", ["CD3+ CD4+"], parent="cells"))
    tree.add(range_gate("low sum", "C", 0, 4, parent="not T helper"))
    tree.add(boolean_gate("either", "or", ["CD3- CD4-", "high sum"]))
    return tree


def test_rename_updates_parents_and_boolean_operands():
    tree = edit_tree()
    before = counts(tree.memberships(grid_sample()))
    tree.rename("CD3+ CD4+", "T helper")
    assert tree["high sum"].parent == "T helper"
    assert tree["not T helper"].operands == ["T helper"]
    assert tree["T helper"].quadrant == "++"
    after = counts(tree.memberships(grid_sample()))
    assert after.pop("T helper") == before.pop("CD3+ CD4+") == 35
    assert after == before
    with pytest.raises(GateError, match="already exists"):
        tree.rename("T helper", "either")


def test_removal_names_descendants_and_the_boolean_gates_built_on_them():
    tree = edit_tree()
    # Deleting a quadrant takes its nested range gate, the NOT built on it, the NOT's child and
    # the OR built on the nested range gate.
    assert tree.removal("CD3+ CD4+") == ["CD3+ CD4+", "high sum", "not T helper", "low sum", "either"]
    assert tree.removal("low sum") == ["low sum"]
    gone = tree.remove("CD3+ CD4+")
    assert gone == ["CD3+ CD4+", "high sum", "not T helper", "low sum", "either"]
    assert tree.names == ["cells", "CD3+ CD4-", "CD3- CD4+", "CD3- CD4-"]
    assert counts(tree.memberships(grid_sample())) == {"cells": 100, "CD3+ CD4-": 15, "CD3- CD4+": 35,
                                                       "CD3- CD4-": 15}
    with pytest.raises(GateError, match="no gate named"):
        tree.removal("nothing")


def test_moving_one_quadrant_moves_its_whole_split():
    tree = edit_tree()
    assert tree.quadrant_set("CD3- CD4-") == ["CD3+ CD4+", "CD3+ CD4-", "CD3- CD4+", "CD3- CD4-"]
    tree.replace_geometry("CD3- CD4-", [(2, 2)])
    masks = counts(tree.memberships(grid_sample()))
    assert [masks[n] for n in tree.quadrant_set("CD3+ CD4+")] == [64, 16, 16, 4]
    assert tree["CD3+ CD4+"].split_point() == (2.0, 2.0)
    assert tree["CD3+ CD4+"].split_point(AxisScale("arcsinh", cofactor=2.0))[0] == pytest.approx(np.arcsinh(1.0))


def test_json_round_trip_of_every_kind_and_old_documents_still_load():
    tree = edit_tree()
    again = GateTree.from_json(tree.to_json())
    assert again == tree
    assert counts(again.memberships(grid_sample())) == counts(tree.memberships(grid_sample()))
    # A polygon's description is what it was before these gate kinds existed.
    old = {"name": "p", "x_channel": "A", "y_channel": "B", "kind": "polygon",
           "vertices": [[0, 0], [4, 0], [0, 4]], "x_scale": {"kind": "linear"}, "y_scale": {"kind": "linear"},
           "parent": None}
    gate = Gate.from_dict(old)
    assert set(gate.to_dict()) == set(old)
    assert tree["either"].to_dict()["operands"] == ["CD3- CD4-", "high sum"]
    assert tree["CD3+ CD4-"].to_dict()["quadrant"] == "+-"


# ------------------------------------------------------------------------------------ real file, GatingML

@pytest.fixture(scope="module")
def patient(sample_data_dir):
    return read_fcs(sample_data_dir / "patient_01.fcs", compensate=True)


def lab_tree() -> GateTree:
    """Every kind, nested, on linear, arcsinh and logicle axes, channels by marker and by $PnN."""
    tree = GateTree()
    tree.add(rectangle_gate("Leukocytes", "FSC-A", "SSC-A", (20000, 150000), (5000, 90000)))
    tree.add(range_gate("CD3+", "CD3", 1.5, 5.6, ASINH, parent="Leukocytes"))
    for gate in quadrant_gates("CD4", "CD8", (1.5, 1.5), ASINH, ASINH, parent="CD3+"):
        tree.add(gate)
    tree.add(range_gate("CD4 large", "FSC-A", 60000, 150000, parent="CD4+ CD8-"))
    tree.add(boolean_gate("Not T", "not", ["CD3+"], parent="Leukocytes"))
    tree.add(range_gate("CD19+", "CD19", 0.5, 0.9, LOGICLE))
    tree.add(boolean_gate("B cells", "and", ["Not T", "CD19+"]))
    tree.add(boolean_gate("CD4-", "or", ["CD4- CD8+", "CD4- CD8-"], parent="CD3+"))
    return tree


# No CD4+ CD8+ T cells in this synthetic patient: an empty quadrant must stay empty through export.
EXPECTED = {"Leukocytes": 8298, "CD3+": 3949, "CD4+ CD8+": 0, "CD4+ CD8-": 2498, "CD4- CD8+": 1112,
            "CD4- CD8-": 339, "CD4 large": 1972, "Not T": 4349, "CD19+": 501, "B cells": 500, "CD4-": 1451}


def test_every_kind_counts_exactly_on_a_real_file(patient):
    masks = lab_tree().memberships(patient)
    assert counts(masks) == EXPECTED
    # The same cells computed from raw thresholds, without the gate code.
    raw = {c: patient.events[:, patient.channel_index(c)] for c in ("FSC-A", "SSC-A", "CD3", "CD4", "CD8", "CD19")}
    leuko = (raw["FSC-A"] >= 20000) & (raw["FSC-A"] <= 150000) & (raw["SSC-A"] >= 5000) & (raw["SSC-A"] <= 90000)
    t = np.arcsinh(raw["CD3"] / 150)
    cd3 = leuko & (t >= 1.5) & (t <= 5.6)
    split = 150 * np.sinh(1.5)
    cd4_pos, cd8_pos = raw["CD4"] >= split * (1 - 1e-12), raw["CD8"] >= split * (1 - 1e-12)
    np.testing.assert_array_equal(masks["CD3+"], cd3)
    np.testing.assert_array_equal(masks["CD4+ CD8-"], cd3 & cd4_pos & ~cd8_pos)
    np.testing.assert_array_equal(masks["CD4-"], cd3 & ~cd4_pos)
    np.testing.assert_array_equal(masks["Not T"], leuko & ~cd3)
    lo, hi = LOGICLE.inverse(np.array([0.5, 0.9]))
    np.testing.assert_array_equal(masks["B cells"], leuko & ~cd3 & (raw["CD19"] >= lo * (1 - 1e-12))
                                  & (raw["CD19"] <= hi * (1 + 1e-12)))


def test_gatingml_export_reimports_every_kind_with_zero_mismatched_events(patient, tmp_path):
    tree = lab_tree()
    masks = tree.memberships(patient)
    path = export_gatingml(tree, tmp_path / "lab.xml", patient)
    text = path.read_text(encoding="utf-8")
    assert text.count("<gating:QuadrantGate") == 1 and text.count("<gating:Quadrant ") == 4
    assert text.count("<gating:BooleanGate") == 3

    labels = apply_gatingml(path, patient)  # the product's own import
    assert int(np.sum(labels != tree.labels(patient, masks))) == 0
    names, leaf_counts = np.unique(labels.astype(str), return_counts=True)
    assert dict(zip(names.tolist(), leaf_counts.tolist())) == {
        "CD19+": 1, "CD4 large": 1972, "CD4- CD8+": 1112, "CD4- CD8-": 339, "Not T": 4349, "other": 4227}

    # FlowKit alone, gate by gate (the QuadrantGate itself is a container, not a population).
    strategy = flowkit.parse_gating_xml(str(path))
    fk = flowkit.Sample(patient.events.astype(np.float64), sample_id="p", channel_labels=patient.pnn, subsample=0)
    results = strategy.gate_sample(fk)
    seen = set()
    for gate_id, gate_path in strategy.get_gate_ids():
        name = gate_name_from_xml(gate_id)
        if name not in tree:
            assert name == "Quadrants 1"
            continue
        membership = results.get_gate_membership(gate_id, gate_path=gate_path)
        assert int(np.sum(membership != masks[name])) == 0, name
        assert int(membership.sum()) == EXPECTED[name], name
        seen.add(name)
    assert seen == set(tree.names)


def test_quadrant_and_boolean_gates_are_refused_by_the_workspace_writer(patient, tmp_path):
    with pytest.raises(GateError, match="quadrant or boolean gates"):
        export_flowjo_workspace(lab_tree(), tmp_path / "x.wsp", [patient])
    assert not (tmp_path / "x.wsp").exists()


def test_a_polygon_nested_in_a_quadrant_and_a_boolean_over_branches_round_trip(patient, tmp_path):
    tree = GateTree()
    for gate in quadrant_gates("CD3", "CD19", (1.5, 1.5), ASINH, ASINH, x_name="CD3", y_name="CD19"):
        tree.add(gate)
    tree.add(polygon_gate("small T", "FSC-A", "SSC-A", [(20000, 0), (80000, 0), (80000, 60000), (20000, 60000)],
                          parent="CD3+ CD19-"))
    tree.add(boolean_gate("B or small T", "or", ["CD3- CD19+", "small T"]))
    masks = tree.memberships(patient)
    path = export_gatingml(tree, tmp_path / "q.xml", patient)
    labels = apply_gatingml(path, patient)
    assert int(np.sum(labels != tree.labels(patient, masks))) == 0
    assert counts(masks)["CD3+ CD19+"] == 43 and counts(masks)["CD3- CD19+"] == 1493


# ------------------------------------------------------------------------------------ back-gating

def test_backgating_highlights_the_population_on_every_ancestor_plot(patient):
    from gating_core.gates.backgating import backgating, gate_path

    tree = lab_tree()
    masks = tree.memberships(patient)
    plots = backgating(tree, "CD4 large", patient, masks)
    # All events on FSC/SSC, Leukocytes on CD3, CD3+ on CD4/CD8, CD4+ CD8- on FSC (histogram).
    assert [(p.gate, p.parent, p.x_channel, p.y_channel) for p in plots] == [
        ("Leukocytes", None, "FSC-A", "SSC-A"), ("CD3+", "Leukocytes", "CD3", None),
        ("CD4+ CD8-", "CD3+", "CD4", "CD8"), ("CD4 large", "CD4+ CD8-", "FSC-A", None)]
    assert [int(p.events.sum()) for p in plots] == [12000, 8298, 3949, 2498]
    assert [p.count for p in plots] == [1972] * 4
    for plot in plots:
        np.testing.assert_array_equal(plot.highlight, masks["CD4 large"])
        assert not np.any(plot.highlight & ~plot.events)
    # A boolean population is shown on its operands' paths.
    assert gate_path(tree, "B cells") == ["Leukocytes", "CD3+", "CD19+"]
    plots = backgating(tree, "B cells", patient, masks)
    # every B cell is a leukocyte, so all 500 show on each plot (outside the CD3+ range on the second)
    assert [p.count for p in plots] == [500, 500, 500]
    cd3 = np.arcsinh(patient.events[:, patient.channel_index("CD3")] / 150)
    assert not np.any((cd3[plots[1].highlight] >= 1.5) & (cd3[plots[1].highlight] <= 5.6))


def test_range_gates_round_trip_through_a_flowjo_workspace(patient, tmp_path):
    from gating_core.gates import apply_workspace
    from gating_core.gates.export import workspace_sample_id

    tree = GateTree([rectangle_gate("Leukocytes", "FSC-A", "SSC-A", (20000, 150000), (5000, 90000)),
                     range_gate("CD3+", "CD3", 1.5, 5.6, ASINH, parent="Leukocytes"),
                     range_gate("large", "FSC-A", 60000, 150000, parent="CD3+")])
    path = export_flowjo_workspace(tree, tmp_path / "r.wsp", [patient])
    labels = apply_workspace(path, {workspace_sample_id(patient): patient})[workspace_sample_id(patient)]
    assert int(np.sum(labels != tree.labels(patient))) == 0
    names, leaf_counts = np.unique(labels.astype(str), return_counts=True)
    assert dict(zip(names.tolist(), leaf_counts.tolist())) == {"large": 2975, "other": 9025}
