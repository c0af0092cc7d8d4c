"""The gate types by the ``kind`` their stored descriptions carry.

A stored gate tree (the patient library's JSON) names each gate's type by ``kind``; reading it
looks the class up in :data:`~gating_core.gates.base.GATE_TYPES`, which this module fills. A new
gate type is a module with its :class:`~gating_core.gates.Gate` subclass and one entry here.
"""

from __future__ import annotations

from gating_core.gates.base import GATE_TYPES
from gating_core.gates.boolean import BooleanGate
from gating_core.gates.interval import RangeGate
from gating_core.gates.polygon import PolygonGate
from gating_core.gates.quadrant import QuadrantGate
from gating_core.gates.rectangle import RectangleGate

GATE_TYPES.update({cls.kind: cls for cls in (PolygonGate, RectangleGate, QuadrantGate, RangeGate, BooleanGate)})
GATE_KINDS = tuple(GATE_TYPES)

__all__ = ["GATE_TYPES", "GATE_KINDS"]
