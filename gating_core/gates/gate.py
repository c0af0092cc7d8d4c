"""The gate types and their constructors, in one place to import from.

Each type lives in its own module (``polygon``, ``rectangle``, ``quadrant``, ``interval`` for
range gates, ``boolean``) on the abstract bases of ``base``; ``registry`` maps stored kinds to
them. ``Gate(name, x_channel, y_channel, kind, vertices, ...)`` still builds the type of ``kind``.
"""

from gating_core.gates.base import OTHER, AxisGate, Gate, is_gate_name
from gating_core.gates.boolean import BOOLEAN_OPERATORS, BooleanGate, boolean_gate
from gating_core.gates.interval import RangeGate, range_gate
from gating_core.gates.polygon import PolygonGate, polygon_gate
from gating_core.gates.quadrant import QUADRANTS, QuadrantGate, quadrant_gates, quadrant_names
from gating_core.gates.rectangle import RectangleGate, rectangle_gate
from gating_core.gates.registry import GATE_KINDS, GATE_TYPES

__all__ = [
    "AxisGate", "BOOLEAN_OPERATORS", "BooleanGate", "GATE_KINDS", "GATE_TYPES", "Gate", "OTHER", "PolygonGate",
    "QUADRANTS", "QuadrantGate", "RangeGate", "RectangleGate", "boolean_gate", "is_gate_name", "polygon_gate",
    "quadrant_gates", "quadrant_names", "range_gate", "rectangle_gate",
]
