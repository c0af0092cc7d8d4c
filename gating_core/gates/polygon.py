"""The polygon gate: a region bounded by straight edges between vertices drawn on a 2-D plot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flowutils import gating as fu_gating

from gating_core.gates.base import AxisGate
from gating_core.gates.drawing import Region, straight_outline
from gating_core.gates.errors import GateError


@dataclass(kw_only=True)
class PolygonGate(AxisGate):
    """A polygon: ``vertices`` are its corners in display coordinates (at least 3; a path whose
    last point repeats the first, as a Plotly lasso gives it, is closed already)."""

    kind = "polygon"
    is_shape = True
    flowjo_workspace = True

    def _checked_vertices(self, verts: np.ndarray) -> np.ndarray:
        if verts.shape[0] >= 2 and np.allclose(verts[0], verts[-1]):
            verts = verts[:-1]  # plotly lasso paths may repeat the first point
        if verts.shape[0] < 3:
            raise GateError(f"gate {self.name!r}: a polygon needs at least 3 vertices")
        if polygon_area(verts) == 0:
            raise GateError(f"gate {self.name!r}: the polygon has no area")
        return verts

    def contains_points(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64)
        finite = np.all(np.isfinite(points), axis=1)
        inside = np.zeros(points.shape[0], dtype=bool)
        if finite.any():
            # FlowUtils' compiled test: what FlowKit applies to a GatingML polygon
            verts = np.asarray(self.vertices, dtype=np.float64)
            inside[finite] = fu_gating.points_in_polygon(verts, points[finite]).astype(bool)
        return inside

    def outline(self, x_scale=None, y_scale=None, points_per_edge: int = 24) -> np.ndarray:
        """The closed outline (k, 2) in the display coordinates of ``x_scale`` / ``y_scale``
        (default: its own; on other scales each straight edge is drawn through
        ``points_per_edge`` points, see :func:`~gating_core.gates.drawing.straight_outline`)."""
        return straight_outline(self.vertices, (self.x_scale, self.y_scale), (x_scale, y_scale),
                                points_per_edge)[0]

    def drawing(self, x_scale=None, y_scale=None) -> Region:
        outline, mapped = straight_outline(self.vertices, (self.x_scale, self.y_scale), (x_scale, y_scale))
        return Region(outline, mapped)

    def flowkit_gate(self, writer):
        from flowkit import gates as fk_gates

        x, y = writer.axis(self.x_channel, self.x_scale), writer.axis(self.y_channel, self.y_scale)
        points = [[x.coordinate(a), y.coordinate(b)] for a, b in self.vertices]
        return fk_gates.PolygonGate(writer.gate_id(self.name), [x.dimension(), y.dimension()], points)


def polygon_area(verts: np.ndarray) -> float:
    """The area inside vertices (k, 2) (shoelace formula)."""
    x, y = verts[:, 0], verts[:, 1]
    return abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))) / 2


def polygon_gate(name, x_channel, y_channel, vertices, x_scale=None, y_scale=None, parent=None) -> PolygonGate:
    """A polygon gate from display-coordinate vertices."""
    return PolygonGate(name=name, x_channel=x_channel, y_channel=y_channel, vertices=list(vertices),
                       x_scale=x_scale, y_scale=y_scale, parent=parent)
