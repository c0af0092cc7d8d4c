"""One gate: polygon, rectangle, quadrant, 1-D range or boolean, in display coordinates."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
from flowutils import gating as fu_gating

from gating_core.gates.errors import GateError
from gating_core.gates.scales import AxisScale

OTHER = "other"
GATE_KINDS = ("polygon", "rectangle", "quadrant", "range", "boolean")
#: Quadrant codes: the sign of x, then of y. "+" is at or above the split point (GatingML's
#: quadrants include their lower bound), "-" below it.
QUADRANTS = ("++", "+-", "-+", "--")
BOOLEAN_OPERATORS = ("and", "or", "not")
_NAME_PATTERN = re.compile(r"^[^\x00-\x1f/]{1,80}$")


@dataclass
class Gate:
    """One gate of a tree, in the display coordinates of the plot it was drawn on.

    Parameters
    ----------
    name : str
        Unique within its tree; becomes the population name when the gate is a leaf.
    x_channel, y_channel : str or None
        Channel names ($PnN, or $PnS as accepted by ``Sample.channel_index``). A range gate has
        no ``y_channel``; a boolean gate has neither.
    kind : {"polygon", "rectangle", "quadrant", "range", "boolean"}
    vertices : list of (x, y)
        - polygon: corners in display coordinates (at least 3);
        - rectangle: two opposite corners ``[(x0, y0), (x1, y1)]``;
        - quadrant: the split point ``[(x, y)]``;
        - range: ``[(low, high)]`` on the x channel's display axis (both ends included);
        - boolean: ``[]``.
    x_scale, y_scale : AxisScale
        The axis transforms of the plot the gate was drawn on.
    parent : str or None
        Name of the parent gate; None means the gate applies to all events.
    quadrant : {"++", "+-", "-+", "--"} or None
        Quadrant gates only: which of the four regions (sign of x, then of y; "+" is at or above
        the split). The four populations of one split are four gates sharing channels, point,
        scales and parent (:func:`quadrant_gates`).
    operator : {"and", "or", "not"} or None
        Boolean gates only. "not" takes one operand, "and" / "or" at least two.
    operands : list of str or None
        Boolean gates only: names of gates of the same tree, each meaning its population (the
        gate and all its ancestors); the result is then restricted to the parent.
    """

    name: str
    x_channel: str | None
    y_channel: str | None
    kind: str
    vertices: list
    x_scale: AxisScale = field(default_factory=AxisScale)
    y_scale: AxisScale = field(default_factory=AxisScale)
    parent: str | None = None
    quadrant: str | None = None
    operator: str | None = None
    operands: list | None = None

    def __post_init__(self):
        self.name = str(self.name).strip()
        if not _NAME_PATTERN.match(self.name) or self.name.casefold() == OTHER:
            raise GateError(f"invalid gate name {self.name!r}: use 1-80 printable characters, no '/', "
                            f"and not {OTHER!r}")
        if self.kind not in GATE_KINDS:
            raise GateError(f"gate {self.name!r}: unknown kind {self.kind!r}")
        if isinstance(self.x_scale, dict):
            self.x_scale = AxisScale.from_dict(self.x_scale)
        if isinstance(self.y_scale, dict):
            self.y_scale = AxisScale.from_dict(self.y_scale)
        if self.parent is not None:
            self.parent = str(self.parent)
        wants = {"boolean": (False, False), "range": (True, False)}.get(self.kind, (True, True))
        for axis, wanted in zip(("x_channel", "y_channel"), wants):
            value = getattr(self, axis)
            if wanted and (value is None or str(value) == ""):
                raise GateError(f"gate {self.name!r}: a {self.kind} gate needs {axis.replace('_', ' ')}")
            setattr(self, axis, str(value) if wanted else None)
        if self.kind != "quadrant":
            self.quadrant = None
        if self.kind != "boolean":
            self.operator, self.operands = None, None
        if self.kind == "boolean":
            self._check_boolean()
            return
        try:
            verts = np.asarray(self.vertices, dtype=np.float64)
        except (TypeError, ValueError):
            raise GateError(f"gate {self.name!r}: vertices must be (x, y) number pairs") from None
        if verts.ndim != 2 or verts.shape[1] != 2 or not np.all(np.isfinite(verts)):
            raise GateError(f"gate {self.name!r}: vertices must be finite (x, y) pairs")
        if self.kind == "polygon":
            if verts.shape[0] >= 2 and np.allclose(verts[0], verts[-1]):
                verts = verts[:-1]  # plotly lasso paths may repeat the first point
            if verts.shape[0] < 3:
                raise GateError(f"gate {self.name!r}: a polygon needs at least 3 vertices")
            if _polygon_area(verts) == 0:
                raise GateError(f"gate {self.name!r}: the polygon has no area")
        elif self.kind == "rectangle":
            if verts.shape[0] != 2:
                raise GateError(f"gate {self.name!r}: a rectangle needs exactly 2 corners")
            lo, hi = verts.min(axis=0), verts.max(axis=0)
            if np.any(hi <= lo):
                raise GateError(f"gate {self.name!r}: the rectangle has no area")
            verts = np.vstack([lo, hi])
        elif self.kind == "quadrant":
            if verts.shape[0] != 1:
                raise GateError(f"gate {self.name!r}: a quadrant gate needs exactly one split point")
            if self.quadrant not in QUADRANTS:
                raise GateError(f"gate {self.name!r}: quadrant must be one of {QUADRANTS}, got {self.quadrant!r}")
        else:  # range
            if verts.shape[0] != 1 or not verts[0, 0] < verts[0, 1]:
                raise GateError(f"gate {self.name!r}: a range gate needs one (low, high) pair with low < high")
        self.vertices = [(float(x), float(y)) for x, y in verts]

    def _check_boolean(self):
        self.operator = str(self.operator or "").lower()
        if self.operator not in BOOLEAN_OPERATORS:
            raise GateError(f"gate {self.name!r}: boolean operator must be one of {BOOLEAN_OPERATORS}, "
                            f"got {self.operator!r}")
        if isinstance(self.operands, str) or not isinstance(self.operands, (list, tuple)):
            raise GateError(f"gate {self.name!r}: a boolean gate needs a list of operand gate names")
        self.operands = [str(o) for o in self.operands]
        if len(set(self.operands)) != len(self.operands):
            raise GateError(f"gate {self.name!r}: an operand is named twice")
        if self.operator == "not" and len(self.operands) != 1:
            raise GateError(f"gate {self.name!r}: NOT takes exactly one gate, got {len(self.operands)}")
        if self.operator != "not" and len(self.operands) < 2:
            raise GateError(f"gate {self.name!r}: {self.operator.upper()} needs at least two gates")
        if self.name in self.operands:
            raise GateError(f"gate {self.name!r}: a boolean gate cannot refer to itself")
        if self.vertices not in ([], (), None):
            raise GateError(f"gate {self.name!r}: a boolean gate has no vertices")
        self.vertices = []

    @property
    def channels(self) -> tuple:
        """The channels the gate tests (none for a boolean gate)."""
        return tuple(c for c in (self.x_channel, self.y_channel) if c is not None)

    @property
    def is_shape(self) -> bool:
        """Whether the gate is a 2-D region drawn on a scatter plot (polygon or rectangle)."""
        return self.kind in ("polygon", "rectangle")

    def display_points(self, sample) -> np.ndarray:
        """(n_events, d) display coordinates of the sample's events on this gate's axes: d = 2,
        or 1 for a range gate. A boolean gate has no axes (GateError)."""
        if self.kind == "boolean":
            raise GateError(f"gate {self.name!r}: a boolean gate has no axes")
        events = sample.events
        columns = [self.x_scale.forward(events[:, _channel_index(sample, self.x_channel)])]
        if self.y_channel is not None:
            columns.append(self.y_scale.forward(events[:, _channel_index(sample, self.y_channel)]))
        return np.column_stack(columns)

    def contains(self, sample) -> np.ndarray:
        """Boolean mask (n_events,) of events inside this gate, ignoring the parent. A boolean
        gate's cells depend on other gates: use :meth:`GateTree.memberships`."""
        if self.kind == "boolean":
            raise GateError(f"gate {self.name!r}: a boolean gate's cells come from its tree "
                            f"(GateTree.memberships)")
        points = self.display_points(sample)
        return self.contains_points(points)

    def contains_points(self, points: np.ndarray) -> np.ndarray:
        """Boolean mask for (n, 2) display-coordinate points ((n, 1) or (n, 2) for a range gate,
        which reads the first column). NaN points are outside."""
        points = np.asarray(points, dtype=np.float64)
        if points.ndim == 1:
            points = points[:, None]
        verts = np.asarray(self.vertices, dtype=np.float64)
        if self.kind == "range":
            values = points[:, 0]
            with np.errstate(invalid="ignore"):
                return (values >= verts[0, 0]) & (values <= verts[0, 1])  # NaN compares False
        finite = np.all(np.isfinite(points), axis=1)
        if self.kind == "quadrant":
            (x0, y0), = verts
            with np.errstate(invalid="ignore"):
                right, top = points[:, 0] >= x0, points[:, 1] >= y0
            side_x = right if self.quadrant[0] == "+" else ~right
            side_y = top if self.quadrant[1] == "+" else ~top
            return side_x & side_y & finite
        if self.kind == "rectangle":
            lo, hi = verts
            with np.errstate(invalid="ignore"):
                inside = np.all((points >= lo) & (points <= hi), axis=1)
            return inside & finite
        if self.kind == "boolean":
            raise GateError(f"gate {self.name!r}: a boolean gate has no geometry")
        inside = np.zeros(points.shape[0], dtype=bool)
        if finite.any():
            inside[finite] = fu_gating.points_in_polygon(verts, points[finite]).astype(bool)
        return inside

    def outline(self, x_scale: AxisScale | None = None, y_scale: AxisScale | None = None,
                points_per_edge: int = 24) -> np.ndarray:
        """The closed outline (k, 2) of a polygon or rectangle gate in the display coordinates
        of ``x_scale`` / ``y_scale`` (default: its own). On other scales its straight edges are
        curves, so each edge is drawn through ``points_per_edge`` points mapped raw -> new scale."""
        if not self.is_shape:
            raise GateError(f"gate {self.name!r}: a {self.kind} gate has no outline")
        verts = np.asarray(self.vertices, dtype=np.float64)
        if self.kind == "rectangle":
            (x0, y0), (x1, y1) = verts
            verts = np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        x_scale, y_scale = x_scale or self.x_scale, y_scale or self.y_scale
        closed = np.vstack([verts, verts[:1]])
        if x_scale.same_mapping(self.x_scale) and y_scale.same_mapping(self.y_scale):
            return closed
        t = np.linspace(0.0, 1.0, points_per_edge, endpoint=False)[:, None]
        dense = np.vstack([a + t * (b - a) for a, b in zip(closed[:-1], closed[1:])] + [closed[:1]])
        x = x_scale.forward(self.x_scale.inverse(dense[:, 0]))
        y = y_scale.forward(self.y_scale.inverse(dense[:, 1]))
        return np.column_stack([x, y])

    def split_point(self, x_scale: AxisScale | None = None, y_scale: AxisScale | None = None) -> tuple:
        """A quadrant gate's split point in the display coordinates of ``x_scale`` / ``y_scale``
        (default: its own)."""
        if self.kind != "quadrant":
            raise GateError(f"gate {self.name!r} is not a quadrant gate")
        (x, y), = self.vertices
        if x_scale is not None:
            x = float(x_scale.forward(self.x_scale.inverse(np.array([x])))[0])
        if y_scale is not None:
            y = float(y_scale.forward(self.y_scale.inverse(np.array([y])))[0])
        return x, y

    def describe(self, channel_name=str) -> str:
        """What the gate tests, in words: its axes, or its boolean expression."""
        if self.kind == "boolean":
            if self.operator == "not":
                return f"NOT {self.operands[0]}"
            return f" {self.operator.upper()} ".join(self.operands)
        if self.kind == "range":
            return f"{channel_name(self.x_channel)} (range)"
        return f"{channel_name(self.x_channel)} / {channel_name(self.y_channel)}"

    def to_dict(self) -> dict:
        out = {"name": self.name, "x_channel": self.x_channel, "y_channel": self.y_channel,
               "kind": self.kind, "vertices": [list(v) for v in self.vertices],
               "x_scale": self.x_scale.to_dict(), "y_scale": self.y_scale.to_dict(),
               "parent": self.parent}
        if self.kind == "quadrant":
            out["quadrant"] = self.quadrant
        if self.kind == "boolean":
            out.update(operator=self.operator, operands=list(self.operands))
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Gate":
        try:
            channels = [None if data[k] is None else str(data[k]) for k in ("x_channel", "y_channel")]
            return cls(name=data["name"], x_channel=channels[0], y_channel=channels[1],
                       kind=str(data["kind"]), vertices=data["vertices"],
                       x_scale=AxisScale.from_dict(data.get("x_scale", {"kind": "linear"})),
                       y_scale=AxisScale.from_dict(data.get("y_scale", {"kind": "linear"})),
                       parent=data.get("parent"), quadrant=data.get("quadrant"),
                       operator=data.get("operator"), operands=data.get("operands"))
        except KeyError as exc:
            raise GateError(f"gate description lacks {exc}") from None
        except TypeError as exc:
            raise GateError(f"invalid gate description: {exc}") from None


def rectangle_gate(name, x_channel, y_channel, x_range, y_range, x_scale=None, y_scale=None, parent=None) -> Gate:
    """A rectangle gate from display-coordinate ranges ``(lo, hi)`` on each axis."""
    return Gate(name, x_channel, y_channel, "rectangle", [(x_range[0], y_range[0]), (x_range[1], y_range[1])],
                x_scale or AxisScale(), y_scale or AxisScale(), parent)


def polygon_gate(name, x_channel, y_channel, vertices, x_scale=None, y_scale=None, parent=None) -> Gate:
    """A polygon gate from display-coordinate vertices."""
    return Gate(name, x_channel, y_channel, "polygon", list(vertices), x_scale or AxisScale(),
                y_scale or AxisScale(), parent)


def quadrant_names(x_name: str, y_name: str) -> dict:
    """Quadrant code -> population name, as labs write them: ``{"+-": "CD4+ CD8-", ...}``."""
    return {code: f"{x_name}{code[0]} {y_name}{code[1]}" for code in QUADRANTS}


def quadrant_gates(x_channel, y_channel, point, x_scale=None, y_scale=None, parent=None, names=None,
                   x_name=None, y_name=None) -> list:
    """The four gates of one quadrant split at display-coordinate ``point`` = (x, y).

    ``names``: quadrant code ("++", "+-", "-+", "--") -> gate name; by default
    :func:`quadrant_names` of ``x_name`` / ``y_name`` (default: the channel names), e.g.
    "CD4+ CD8-". Returns a list of 4 :class:`Gate`, in the order of :data:`QUADRANTS`.
    """
    names = dict(names) if names else quadrant_names(x_name or x_channel, y_name or y_channel)
    missing = [code for code in QUADRANTS if code not in names]
    if missing:
        raise GateError(f"quadrant names missing for {', '.join(missing)}")
    if len({str(names[code]).strip() for code in QUADRANTS}) != 4:
        raise GateError("the four quadrants need four different names")
    return [Gate(names[code], x_channel, y_channel, "quadrant", [tuple(point)], x_scale or AxisScale(),
                 y_scale or AxisScale(), parent, quadrant=code) for code in QUADRANTS]


def range_gate(name, channel, low, high, scale=None, parent=None) -> Gate:
    """A 1-D range gate: events whose display value on ``channel`` lies in [low, high]."""
    return Gate(name, channel, None, "range", [(low, high)], scale or AxisScale(), AxisScale(), parent)


def boolean_gate(name, operator, operands, parent=None) -> Gate:
    """A boolean gate: "and" / "or" of two or more gates' populations, or "not" of one."""
    return Gate(name, None, None, "boolean", [], AxisScale(), AxisScale(), parent, operator=operator,
                operands=list(operands))


def _polygon_area(verts: np.ndarray) -> float:
    x, y = verts[:, 0], verts[:, 1]
    return abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))) / 2


def _channel_index(sample, name: str) -> int:
    try:
        return sample.channel_index(name)
    except KeyError:
        raise GateError(f"{sample.name}: the gate needs channel {name!r}, which this sample lacks") from None
