"""The range gate: an interval [low, high] on one channel, drawn on a histogram."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates.base import AxisGate
from gating_core.gates.drawing import Band, mapped_value
from gating_core.gates.errors import GateError


@dataclass(kw_only=True)
class RangeGate(AxisGate):
    """Events whose display value on ``x_channel`` lies in [low, high], both ends included;
    ``vertices`` is ``[(low, high)]`` and ``y_channel`` is None."""

    kind = "range"
    n_axes = 1
    flowjo_workspace = True

    def _checked_vertices(self, verts: np.ndarray) -> np.ndarray:
        if verts.shape[0] != 1 or not verts[0, 0] < verts[0, 1]:
            raise GateError(f"gate {self.name!r}: a range gate needs one (low, high) pair with low < high")
        return verts

    @property
    def bounds(self) -> tuple:
        """(low, high) in its own display coordinates."""
        (low, high), = self.vertices
        return low, high

    def contains_points(self, points: np.ndarray) -> np.ndarray:
        """Boolean mask for (n,) or (n, d) display-coordinate points (the first column is read)."""
        points = np.asarray(points, dtype=np.float64)
        values = points if points.ndim == 1 else points[:, 0]
        low, high = self.bounds
        with np.errstate(invalid="ignore"):
            return (values >= low) & (values <= high)  # NaN compares False

    def describe(self, channel_name=str) -> str:
        return f"{channel_name(self.x_channel)} (range)"

    def drawing(self, x_scale=None, y_scale=None) -> Band:
        low, high = self.bounds
        return Band(mapped_value(low, self.x_scale, x_scale), mapped_value(high, self.x_scale, x_scale))

    def flowkit_gate(self, writer):
        """A GatingML rectangle with one dimension."""
        from flowkit import gates as fk_gates

        low, high = self.bounds
        axis = writer.axis(self.x_channel, self.x_scale)
        return fk_gates.RectangleGate(writer.gate_id(self.name), [axis.dimension(low, high)])


def range_gate(name, channel, low, high, scale=None, parent=None) -> RangeGate:
    """A 1-D range gate: events whose display value on ``channel`` lies in [low, high]."""
    return RangeGate(name=name, x_channel=channel, vertices=[(low, high)], x_scale=scale, parent=parent)
