"""Gate types as classes: stored trees written before the types were classes still load and
count the same cells, the one-class constructor still builds every kind, each type draws
itself, and a new type needs only its class and a registry entry."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pytest

from gating_core.fcs import Channel, Sample
from gating_core.gates import (
    GATE_KINDS, GATE_TYPES, AxisGate, AxisScale, Band, BooleanGate, Gate, GateError, GateTree, PolygonGate,
    QuadrantGate, RangeGate, RectangleGate, Region, Split, apply_gatingml, boolean_gate, polygon_gate,
    quadrant_gates, range_gate, rectangle_gate,
)
from gating_core.gates.drawing import straight_outline
from gating_core.gates.export import export_gatingml
from gating_core.reports.report import patient_report_html

# A gate tree as the library stored it when one Gate class held every kind (written by that
# code), with each kind: rectangle, polygon, a quadrant split on arcsinh axes, range, boolean.
STORED = """{"format": "gating_core.gate_tree", "version": 1, "gates": [
    {"name": "cells", "x_channel": "A", "y_channel": "B", "kind": "rectangle", "vertices": [[0.0, 0.0], [9.0, 9.0]], "x_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": null},
    {"name": "corner", "x_channel": "A", "y_channel": "B", "kind": "polygon", "vertices": [[-0.5, -0.5], [4.5, -0.5], [-0.5, 4.5]], "x_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells"},
    {"name": "CD3+ CD4+", "x_channel": "A", "y_channel": "B", "kind": "quadrant", "vertices": [[1.6472311463710958, 1.1947632172871092]], "x_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells", "quadrant": "++"},
    {"name": "CD3+ CD4-", "x_channel": "A", "y_channel": "B", "kind": "quadrant", "vertices": [[1.6472311463710958, 1.1947632172871092]], "x_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells", "quadrant": "+-"},
    {"name": "CD3- CD4+", "x_channel": "A", "y_channel": "B", "kind": "quadrant", "vertices": [[1.6472311463710958, 1.1947632172871092]], "x_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells", "quadrant": "-+"},
    {"name": "CD3- CD4-", "x_channel": "A", "y_channel": "B", "kind": "quadrant", "vertices": [[1.6472311463710958, 1.1947632172871092]], "x_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "arcsinh", "cofactor": 2.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells", "quadrant": "--"},
    {"name": "high sum", "x_channel": "C", "y_channel": null, "kind": "range", "vertices": [[10.0, 18.0]], "x_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "CD3+ CD4+"},
    {"name": "not corner", "x_channel": null, "y_channel": null, "kind": "boolean", "vertices": [], "x_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": "cells", "operator": "not", "operands": ["corner"]},
    {"name": "either", "x_channel": null, "y_channel": null, "kind": "boolean", "vertices": [], "x_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "y_scale": {"kind": "linear", "cofactor": 5.0, "top": 262144.0, "width": 0.5, "decades": 4.5}, "parent": null, "operator": "or", "operands": ["CD3- CD4-", "high sum"]}
]}"""
# What that code counted on grid_sample(), gate by gate, and the leaf labels.
STORED_COUNTS = {"cells": 100, "corner": 10, "CD3+ CD4+": 35, "CD3+ CD4-": 15, "CD3- CD4+": 35, "CD3- CD4-": 15,
                 "high sum": 32, "not corner": 90, "either": 47}
STORED_LABELS = {"CD3+ CD4-": 15, "CD3- CD4+": 34, "CD3- CD4-": 6, "corner": 10, "high sum": 32, "not corner": 3}
STORED_AXES = ["A / B", "A / B", "A / B", "C (range)", "A / B", "A / B", "A / B", "NOT corner",
               "CD3- CD4- OR high sum"]


def grid_sample():
    """Events on the integer grid 0..9 x 0..9 (100 events) plus a third channel = x + y."""
    xs, ys = np.meshgrid(np.arange(10.0), np.arange(10.0))
    events = np.column_stack([xs.ravel(), ys.ravel(), xs.ravel() + ys.ravel()])
    return Sample("grid", events, [Channel("A", "CD3"), Channel("B", "CD4"), Channel("C")])


def counts(masks) -> dict:
    return {name: int(mask.sum()) for name, mask in masks.items()}


def every_kind() -> list:
    """One gate of each kind, nested, as the named constructors build them."""
    return [rectangle_gate("cells", "A", "B", (0, 9), (0, 9)),
            polygon_gate("corner", "A", "B", [(-0.5, -0.5), (4.5, -0.5), (-0.5, 4.5)], parent="cells"),
            *quadrant_gates("A", "B", (4.5, 2.5), parent="cells", x_name="CD3", y_name="CD4"),
            range_gate("high sum", "C", 10, 18, parent="CD3+ CD4+"),
            boolean_gate("either", "or", ["CD3- CD4-", "high sum"])]


# ------------------------------------------------------------------------------------ stored trees

def test_a_tree_stored_before_gate_types_were_classes_loads_and_counts_the_same_cells():
    stored = json.loads(STORED)
    tree = GateTree.from_json(STORED)
    assert [type(g) for g in tree.gates] == [RectangleGate, PolygonGate, *[QuadrantGate] * 4, RangeGate,
                                             BooleanGate, BooleanGate]
    assert {g.kind for g in tree.gates} == set(GATE_KINDS)
    sample = grid_sample()
    masks = tree.memberships(sample)
    assert counts(masks) == STORED_COUNTS
    names, label_counts = np.unique(tree.labels(sample, masks).astype(str), return_counts=True)
    assert dict(zip(names.tolist(), label_counts.tolist())) == STORED_LABELS
    assert tree.statistics(sample, masks)["axes"].tolist() == STORED_AXES
    # saved again, it is the same document, field for field: the stored format did not change
    assert tree.to_dict() == stored
    assert [list(g.to_dict()) for g in tree.gates] == [list(g) for g in stored["gates"]]
    assert tree.quadrant_set("CD3- CD4-") == ["CD3+ CD4+", "CD3+ CD4-", "CD3- CD4+", "CD3- CD4-"]


def test_a_stored_gate_of_an_unknown_kind_or_lacking_a_field_is_a_gate_error():
    gate = json.loads(STORED)["gates"][0]
    with pytest.raises(GateError, match="unknown kind 'ellipse'"):
        Gate.from_dict({**gate, "kind": "ellipse"})
    with pytest.raises(GateError, match="lacks 'vertices'"):
        Gate.from_dict({k: v for k, v in gate.items() if k != "vertices"})
    with pytest.raises(GateError, match="not a PolygonGate"):
        PolygonGate.from_dict(gate)  # a rectangle
    assert RectangleGate.from_dict(gate) == Gate.from_dict(gate)


def test_the_one_class_constructor_builds_the_type_of_its_kind():
    built = [Gate("cells", "A", "B", "rectangle", [(0, 0), (9, 9)]),
             Gate("corner", "A", "B", "polygon", [(-0.5, -0.5), (4.5, -0.5), (-0.5, 4.5)], parent="cells"),
             *[Gate(name, "A", "B", "quadrant", [(4.5, 2.5)], AxisScale(), AxisScale(), "cells", quadrant=code)
               for name, code in (("CD3+ CD4+", "++"), ("CD3+ CD4-", "+-"), ("CD3- CD4+", "-+"),
                                  ("CD3- CD4-", "--"))],
             Gate("high sum", "C", "ignored", "range", [(10, 18)], parent="CD3+ CD4+"),
             Gate("either", None, None, "boolean", [], operator="or", operands=["CD3- CD4-", "high sum"])]
    assert built == every_kind()
    assert built[6].y_channel is None  # a range gate has one axis whatever it was given
    with pytest.raises(GateError, match="has no vertices"):
        Gate("b", None, None, "boolean", [(0, 0)], operator="not", operands=["a"])


@pytest.mark.parametrize("gate", every_kind(), ids=lambda g: g.name)
def test_every_type_round_trips_through_its_stored_description(gate):
    assert GATE_TYPES[gate.kind] is type(gate)
    again = Gate.from_dict(json.loads(json.dumps(gate.to_dict())))
    assert again == gate and type(again) is type(gate)


# ------------------------------------------------------------------------------------ drawings

def test_each_type_draws_itself_on_its_own_axes_and_on_others():
    cells, corner, plus_plus, *_, high_sum, either = every_kind()
    asinh = AxisScale("arcsinh", cofactor=2.0)
    box = cells.drawing()
    assert isinstance(box, Region) and box.box == (0.0, 0.0, 9.0, 9.0) and not box.mapped
    assert box.corners.tolist() == [[0, 0], [9, 0], [9, 9], [0, 9]]
    mapped = cells.drawing(asinh, asinh)
    assert mapped.mapped and mapped.box is None and mapped.outline.shape == (4 * 24 + 1, 2)
    assert np.allclose(corner.drawing().outline, corner.outline())
    split = plus_plus.drawing(asinh, None)
    assert split == Split((pytest.approx(np.arcsinh(2.25)), 2.5), "++")
    assert high_sum.drawing(asinh) == Band(pytest.approx(np.arcsinh(5.0)), pytest.approx(np.arcsinh(9.0)))
    assert either.drawing() is None and either.channels == ()
    with pytest.raises(GateError, match="cells come from its tree"):
        either.contains(grid_sample())


# ------------------------------------------------------------------------------------ a new type

@dataclass(kw_only=True)
class CircleGate(AxisGate):
    """A type written for this test: a disc, ``vertices`` = [(centre x, centre y), (radius, 0)]."""

    kind = "circle"
    is_shape = True

    def _checked_vertices(self, verts):
        if verts.shape[0] != 2 or not verts[1, 0] > 0:
            raise GateError(f"gate {self.name!r}: a circle needs its centre and a radius > 0")
        return verts

    def _corners(self):
        (cx, cy), (radius, _) = self.vertices
        angle = np.linspace(0, 2 * np.pi, 64, endpoint=False)
        return np.column_stack([cx + radius * np.cos(angle), cy + radius * np.sin(angle)])

    def contains_points(self, points):
        (cx, cy), (radius, _) = self.vertices
        with np.errstate(invalid="ignore"):
            return np.hypot(points[:, 0] - cx, points[:, 1] - cy) <= radius

    def drawing(self, x_scale=None, y_scale=None):
        return Region(*straight_outline(self._corners(), (self.x_scale, self.y_scale), (x_scale, y_scale)))

    def flowkit_gate(self, writer):
        # GatingML has no circle: its 64-gon, which holds the same grid events
        return polygon_gate(self.name, self.x_channel, self.y_channel, self._corners(), self.x_scale,
                            self.y_scale, self.parent).flowkit_gate(writer)


def test_a_new_type_needs_its_class_and_a_registry_entry(monkeypatch, tmp_path):
    monkeypatch.setitem(GATE_TYPES, "circle", CircleGate)
    tree = GateTree([rectangle_gate("cells", "A", "B", (0, 9), (0, 9)),
                     CircleGate(name="round", x_channel="A", y_channel="B", vertices=[(4, 4), (2.5, 0)],
                                parent="cells")])
    again = GateTree.from_json(tree.to_json())
    assert type(again["round"]) is CircleGate and again == tree
    sample = grid_sample()
    masks = again.memberships(sample)
    assert counts(masks) == {"cells": 100, "round": 21}  # grid points within 2.5 of (4, 4)
    # drawn in the report, exported to GatingML and read back cell for cell
    svgs = re.findall(r"<svg.*?</svg>", patient_report_html("p", sample, again.labels(sample), tree=again))
    svg = next(s for s in svgs if "cells \u2192 round" in s)
    assert svg.count("<polygon") == 1 and ">round " in svg
    labels = apply_gatingml(export_gatingml(again, tmp_path / "circle.xml", sample), sample)
    assert int(np.sum(labels != again.labels(sample, masks))) == 0
