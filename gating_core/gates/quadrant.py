"""Quadrant gates: one split point on two channels, four populations such as "CD4+ CD8-"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates.base import AxisGate
from gating_core.gates.drawing import Split, mapped_value
from gating_core.gates.errors import GateError

#: Quadrant codes: the sign of x, then of y. "+" is at or above the split point (GatingML's
#: quadrants include their lower bound), "-" below it.
QUADRANTS = ("++", "+-", "-+", "--")


@dataclass(kw_only=True)
class QuadrantGate(AxisGate):
    """One of the four regions of a split: ``vertices`` is the split point ``[(x, y)]`` and
    ``quadrant`` which region ("++", "+-", "-+", "--": sign of x, then of y; "+" is at or above
    the split). The four populations of one split are four gates sharing channels, point,
    scales and parent (:func:`quadrant_gates`), moved together."""

    quadrant: str | None = None

    kind = "quadrant"

    def _checked_vertices(self, verts: np.ndarray) -> np.ndarray:
        if verts.shape[0] != 1:
            raise GateError(f"gate {self.name!r}: a quadrant gate needs exactly one split point")
        if self.quadrant not in QUADRANTS:
            raise GateError(f"gate {self.name!r}: quadrant must be one of {QUADRANTS}, got {self.quadrant!r}")
        return verts

    def contains_points(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64)
        (x0, y0), = self.vertices
        finite = np.all(np.isfinite(points), axis=1)
        with np.errstate(invalid="ignore"):
            right, top = points[:, 0] >= x0, points[:, 1] >= y0
        side_x = right if self.quadrant[0] == "+" else ~right
        side_y = top if self.quadrant[1] == "+" else ~top
        return side_x & side_y & finite

    def shares_geometry_with(self, other) -> bool:
        """Whether ``other`` is a quadrant of the same split (same parent, channels, scales, point)."""
        return (isinstance(other, QuadrantGate) and other.parent == self.parent
                and other.channels == self.channels and other.vertices == self.vertices
                and other.x_scale.same_mapping(self.x_scale) and other.y_scale.same_mapping(self.y_scale))

    def split_point(self, x_scale=None, y_scale=None) -> tuple:
        """The split point in the display coordinates of ``x_scale`` / ``y_scale`` (default: its own)."""
        (x, y), = self.vertices
        return mapped_value(x, self.x_scale, x_scale), mapped_value(y, self.y_scale, y_scale)

    def drawing(self, x_scale=None, y_scale=None) -> Split:
        return Split(self.split_point(x_scale, y_scale), self.quadrant)

    def flowkit_gate(self, writer):
        """The GatingML QuadrantGate of the whole split: two dividers, one Quadrant per population
        of the split ("+" is [split, inf), "-" is (-inf, split), as here)."""
        from flowkit import QuadrantDivider, gates as fk_gates

        x_axis, y_axis = writer.axis(self.x_channel, self.x_scale), writer.axis(self.y_channel, self.y_scale)
        (x, y), = self.vertices
        dividers = [QuadrantDivider("x_divider", x_axis.pnn, x_axis.compensation_ref, [x_axis.coordinate(x)],
                                    x_axis.transform_id),
                    QuadrantDivider("y_divider", y_axis.pnn, y_axis.compensation_ref, [y_axis.coordinate(y)],
                                    y_axis.transform_id)]
        quadrants = []
        for member in _split_of(self, writer.tree):
            bounds = [(axis.coordinate(v), None) if sign == "+" else (None, axis.coordinate(v))
                      for axis, v, sign in ((x_axis, x, member.quadrant[0]), (y_axis, y, member.quadrant[1]))]
            quadrants.append(fk_gates.Quadrant(writer.gate_id(member.name), ["x_divider", "y_divider"], bounds))
        return fk_gates.QuadrantGate(writer.container_id("Quadrants"), dividers, quadrants)

    def write_flowkit(self, writer) -> None:
        """Write the split once, with its first quadrant; GatingML nests each quadrant's gates
        under the QuadrantGate and that Quadrant."""
        writer.add_container(self.flowkit_gate(writer), self, _split_of(self, writer.tree))

    def to_dict(self) -> dict:
        return {**super().to_dict(), "quadrant": self.quadrant}

    @classmethod
    def _own_fields(cls, fields: dict) -> dict:
        return {"quadrant": fields.get("quadrant")}


def _split_of(gate: QuadrantGate, tree) -> list:
    """The quadrant gates of ``gate``'s split in ``tree``, in tree order."""
    return [tree[name] for name in tree.sharing_geometry(gate.name)]


def quadrant_names(x_name: str, y_name: str) -> dict:
    """Quadrant code -> population name, as labs write them: ``{"+-": "CD4+ CD8-", ...}``."""
    return {code: f"{x_name}{code[0]} {y_name}{code[1]}" for code in QUADRANTS}


def quadrant_gates(x_channel, y_channel, point, x_scale=None, y_scale=None, parent=None, names=None,
                   x_name=None, y_name=None) -> list:
    """The four gates of one quadrant split at display-coordinate ``point`` = (x, y).

    ``names``: quadrant code ("++", "+-", "-+", "--") -> gate name; by default
    :func:`quadrant_names` of ``x_name`` / ``y_name`` (default: the channel names), e.g.
    "CD4+ CD8-". Returns a list of 4 :class:`QuadrantGate`, in the order of :data:`QUADRANTS`.
    """
    names = dict(names) if names else quadrant_names(x_name or x_channel, y_name or y_channel)
    missing = [code for code in QUADRANTS if code not in names]
    if missing:
        raise GateError(f"quadrant names missing for {', '.join(missing)}")
    if len({str(names[code]).strip() for code in QUADRANTS}) != 4:
        raise GateError("the four quadrants need four different names")
    return [QuadrantGate(name=names[code], x_channel=x_channel, y_channel=y_channel, vertices=[tuple(point)],
                         x_scale=x_scale, y_scale=y_scale, parent=parent, quadrant=code) for code in QUADRANTS]
