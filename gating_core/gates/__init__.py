"""Hand-drawn gates, nested gate trees and expert gates imported from FlowJo / GatingML.

A gate is drawn on a 2-D scatter plot whose axes may be transformed (arcsinh, logicle), so its
geometry lives in the *display* coordinates of the plot it was drawn on. Each gate therefore
records the :class:`AxisScale` of both axes; testing an event maps the raw channel values through
the same scales before the point-in-polygon test (FlowUtils' compiled ``points_in_polygon``).

Besides polygons and rectangles a tree holds the gates a lab expects: quadrant gates (one split
point on two channels, four populations such as "CD4+ CD8-"), 1-D range gates (low/high on one
channel, drawn on a histogram) and boolean gates (AND / OR / NOT of other gates' populations).

Gates nest: a gate names its parent gate, and an event belongs to a gate only if it also
belongs to the parent. :meth:`GateTree.labels` flattens the tree into training labels: each
event gets the name of the leaf gate it falls in, or ``"other"``.

Everything here is plain data (``to_dict`` / ``from_dict``), so trees are stored as JSON.

Each gate type is a class owning its geometry (``contains``), its stored description
(``to_dict`` / ``from_dict``), its FlowKit export (``flowkit_gate``) and what a plot draws of it
(``drawing``): callers call these and never test a gate's kind.

The package: ``scales`` (AxisScale), ``base`` (the abstract Gate and AxisGate), one module per
gate type (``polygon``, ``rectangle``, ``quadrant``, ``interval`` for range gates, ``boolean``),
``registry`` (stored kind -> class), ``drawing`` (what plots draw), ``gate`` (every type and
constructor in one import), ``tree`` (GateTree, memberships), ``imports`` (FlowJo / GatingML
import), ``names`` (safe stems), ``errors``. Every name is importable from ``gating_core.gates``.

Beside them, imported from their own modules (not re-exported here, so importing the gates stays
free of FlowKit's writers): ``export`` (a tree as GatingML 2.0 / FlowJo workspace),
``autogates`` (an auto-gated patient's gates fitted in the training hierarchy, the cells an
adjusted gate relabels, the cells each gate counts) with ``polygon_fit`` (one gate's polygon
fitted to its predicted cells) and ``agreement`` (how well the fitted gates hold those cells),
and ``backgating`` (a population's cells on its ancestors' plots).
"""

from gating_core.gates.drawing import Band, Region, Split
from gating_core.gates.errors import GateError, GateImportError
from gating_core.gates.gate import (
    BOOLEAN_OPERATORS, GATE_KINDS, GATE_TYPES, OTHER, QUADRANTS, AxisGate, BooleanGate, Gate, PolygonGate,
    QuadrantGate, RangeGate, RectangleGate, boolean_gate, is_gate_name, polygon_gate, quadrant_gates, quadrant_names,
    range_gate, rectangle_gate,
)
from gating_core.gates.imports import apply_gatingml, apply_workspace, gate_name_from_xml, xml_gate_id
from gating_core.gates.names import safe_stem
from gating_core.gates.scales import AxisScale, panel_scale, suggest_scale, with_kind
from gating_core.gates.tree import GateTree, gate_membership

__all__ = [
    "AxisGate", "AxisScale", "BOOLEAN_OPERATORS", "Band", "BooleanGate", "GATE_KINDS", "GATE_TYPES", "Gate",
    "GateError", "GateImportError", "GateTree", "OTHER", "PolygonGate", "QUADRANTS", "QuadrantGate", "RangeGate",
    "RectangleGate", "Region", "Split", "apply_gatingml", "apply_workspace", "boolean_gate", "gate_membership",
    "gate_name_from_xml", "is_gate_name", "panel_scale", "polygon_gate", "quadrant_gates", "quadrant_names", "range_gate",
    "rectangle_gate", "safe_stem", "suggest_scale", "with_kind", "xml_gate_id",
]
