"""The gate types by the ``kind`` their stored descriptions carry.

A stored gate tree (the patient library's JSON) names each gate's type by ``kind``; reading it
looks the class up here. A new gate type is a module with its :class:`~gating_core.gates.Gate`
subclass and one entry in :data:`GATE_TYPES`.
"""

from __future__ import annotations

from gating_core.gates.base import Gate
from gating_core.gates.boolean import BooleanGate
from gating_core.gates.errors import GateError
from gating_core.gates.interval import RangeGate
from gating_core.gates.polygon import PolygonGate
from gating_core.gates.quadrant import QuadrantGate
from gating_core.gates.rectangle import RectangleGate

#: kind -> gate class, in the order the types are offered.
GATE_TYPES: dict[str, type[Gate]] = {cls.kind: cls for cls in (
    PolygonGate, RectangleGate, QuadrantGate, RangeGate, BooleanGate)}
GATE_KINDS = tuple(GATE_TYPES)


def gate_from_fields(fields: dict) -> Gate:
    """The gate of a stored description (``Gate.to_dict``'s format): its ``kind``'s class reads it.

    Raises GateError for a missing field, an unknown kind or a description that is no gate.
    """
    try:
        kind = str(fields["kind"])
        if kind not in GATE_TYPES:
            raise GateError(f"gate {fields['name']!r}: unknown kind {kind!r}")
        return GATE_TYPES[kind].from_fields(fields)
    except KeyError as exc:
        raise GateError(f"gate description lacks {exc}") from None
    except TypeError as exc:
        raise GateError(f"invalid gate description: {exc}") from None
