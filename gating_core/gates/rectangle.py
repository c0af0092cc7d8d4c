"""The rectangle gate: an axis-aligned box on a 2-D plot, edges included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates.base import AxisGate
from gating_core.gates.drawing import Region, straight_outline
from gating_core.gates.errors import GateError


@dataclass(kw_only=True)
class RectangleGate(AxisGate):
    """A rectangle: ``vertices`` are two opposite corners, stored as ``[(x0, y0), (x1, y1)]``
    with x0 < x1 and y0 < y1 whatever corners it was given."""

    kind = "rectangle"
    is_shape = True
    flowjo_workspace = True

    def _checked_vertices(self, verts: np.ndarray) -> np.ndarray:
        if verts.shape[0] != 2:
            raise GateError(f"gate {self.name!r}: a rectangle needs exactly 2 corners")
        lo, hi = verts.min(axis=0), verts.max(axis=0)
        if np.any(hi <= lo):
            raise GateError(f"gate {self.name!r}: the rectangle has no area")
        return np.vstack([lo, hi])

    @property
    def corners(self) -> list:
        """The four corners, counter-clockwise from (x0, y0)."""
        (x0, y0), (x1, y1) = self.vertices
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]

    def contains_points(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64)
        lo, hi = np.asarray(self.vertices, dtype=np.float64)
        finite = np.all(np.isfinite(points), axis=1)
        with np.errstate(invalid="ignore"):
            inside = np.all((points >= lo) & (points <= hi), axis=1)
        return inside & finite

    def outline(self, x_scale=None, y_scale=None, points_per_edge: int = 24) -> np.ndarray:
        """The closed outline (5, 2) in its own display coordinates, or the mapped curve on
        other scales (see :func:`~gating_core.gates.drawing.straight_outline`)."""
        return straight_outline(self.corners, (self.x_scale, self.y_scale), (x_scale, y_scale),
                                points_per_edge)[0]

    def drawing(self, x_scale=None, y_scale=None) -> Region:
        outline, mapped = straight_outline(self.corners, (self.x_scale, self.y_scale), (x_scale, y_scale))
        (x0, y0), (x1, y1) = self.vertices
        return Region(outline, mapped, box=None if mapped else (x0, y0, x1, y1))

    def flowkit_gate(self, writer):
        from flowkit import gates as fk_gates

        (x0, y0), (x1, y1) = self.vertices
        x, y = writer.axis(self.x_channel, self.x_scale), writer.axis(self.y_channel, self.y_scale)
        return fk_gates.RectangleGate(writer.gate_id(self.name), [x.dimension(x0, x1), y.dimension(y0, y1)])


def rectangle_gate(name, x_channel, y_channel, x_range, y_range, x_scale=None, y_scale=None,
                   parent=None) -> RectangleGate:
    """A rectangle gate from display-coordinate ranges ``(lo, hi)`` on each axis."""
    return RectangleGate(name=name, x_channel=x_channel, y_channel=y_channel,
                         vertices=[(x_range[0], y_range[0]), (x_range[1], y_range[1])],
                         x_scale=x_scale, y_scale=y_scale, parent=parent)
