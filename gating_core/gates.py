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
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flowutils import gating as fu_gating
from flowutils import transforms as fu_transforms

from gating_core.errors import GatingCoreError

OTHER = "other"
GATE_KINDS = ("polygon", "rectangle", "quadrant", "range", "boolean")
#: Quadrant codes: the sign of x, then of y. "+" is at or above the split point (GatingML's
#: quadrants include their lower bound), "-" below it.
QUADRANTS = ("++", "+-", "-+", "--")
BOOLEAN_OPERATORS = ("and", "or", "not")
_SCALE_KINDS = ("linear", "arcsinh", "logicle")
_NAME_PATTERN = re.compile(r"^[^\x00-\x1f/]{1,80}$")


class GateError(GatingCoreError, ValueError):
    """A gate or gate tree is invalid (bad geometry, unknown parent, duplicate name, ...)."""


class GateImportError(GatingCoreError, ValueError):
    """A FlowJo workspace or GatingML file could not be applied. ``str()`` names the file."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")


# --------------------------------------------------------------------------------------------
# Axis scales


@dataclass(frozen=True)
class AxisScale:
    """A monotone map from raw channel values to display coordinates.

    Parameters
    ----------
    kind : {"linear", "arcsinh", "logicle"}
    cofactor : float
        arcsinh: display = asinh(raw / cofactor). Typical: 5 for mass cytometry, 150 for flow.
    top : float
        logicle T, the top of the raw scale.
    width : float
        logicle W, decades of linear-like region near zero.
    decades : float
        logicle M, total display width in decades.
    """

    kind: str = "linear"
    cofactor: float = 5.0
    top: float = 262144.0
    width: float = 0.5
    decades: float = 4.5

    def __post_init__(self):
        if self.kind not in _SCALE_KINDS:
            raise GateError(f"unknown axis scale {self.kind!r}; expected one of {_SCALE_KINDS}")
        if self.kind == "arcsinh" and not self.cofactor > 0:
            raise GateError(f"arcsinh cofactor must be > 0, got {self.cofactor}")
        if self.kind == "logicle" and not (self.top > 0 and self.decades > 0 and 0 <= self.width <= self.decades / 2):
            raise GateError(f"invalid logicle parameters T={self.top}, W={self.width}, M={self.decades}")

    def forward(self, values: np.ndarray) -> np.ndarray:
        """Raw values (any shape) -> display coordinates (float64, same shape)."""
        values = np.asarray(values, dtype=np.float64)
        if self.kind == "linear":
            return values.copy()
        if self.kind == "arcsinh":
            return np.arcsinh(values / self.cofactor)
        flat = values.reshape(-1, 1)
        out = fu_transforms.logicle(flat, [0], t=self.top, m=self.decades, w=self.width, a=0)
        return out.reshape(values.shape)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """Display coordinates -> raw values (float64, same shape)."""
        values = np.asarray(values, dtype=np.float64)
        if self.kind == "linear":
            return values.copy()
        if self.kind == "arcsinh":
            return np.sinh(values) * self.cofactor
        flat = values.reshape(-1, 1)
        out = fu_transforms.logicle_inverse(flat, [0], t=self.top, m=self.decades, w=self.width, a=0)
        return out.reshape(values.shape)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "cofactor": float(self.cofactor), "top": float(self.top),
                "width": float(self.width), "decades": float(self.decades)}

    @classmethod
    def from_dict(cls, data: dict) -> "AxisScale":
        try:
            return cls(kind=str(data["kind"]), cofactor=float(data.get("cofactor", 5.0)),
                       top=float(data.get("top", 262144.0)), width=float(data.get("width", 0.5)),
                       decades=float(data.get("decades", 4.5)))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateError(f"invalid axis scale {data!r}: {exc}") from None

    def same_mapping(self, other: "AxisScale") -> bool:
        """Whether both scales map raw values alike (only the fields their kind uses count:
        two linear scales are the same whatever cofactor they carry)."""
        if self.kind != other.kind:
            return False
        if self.kind == "arcsinh":
            return self.cofactor == other.cofactor
        if self.kind == "logicle":
            return (self.top, self.width, self.decades) == (other.top, other.width, other.decades)
        return True

    @property
    def description(self) -> str:
        if self.kind == "arcsinh":
            return f"arcsinh (cofactor {self.cofactor:g})"
        if self.kind == "logicle":
            return f"logicle (T={self.top:g}, W={self.width:g}, M={self.decades:g})"
        return "linear"


def suggest_scale(kind: str, raw: np.ndarray) -> AxisScale:
    """An :class:`AxisScale` of ``kind`` with parameters suited to one channel's raw values.

    arcsinh cofactor: 5 for mass-cytometry-like ranges (99.9th percentile below 10^4), else 150.
    logicle T: the 99.99th percentile rounded up to a power of ten (at least 1000); W from the
    negative tail as in Parks et al. (2006), clipped to [0, 1].
    """
    raw = np.asarray(raw, dtype=np.float64)
    finite = raw[np.isfinite(raw)]
    if finite.size == 0:
        finite = np.zeros(1)
    if kind == "linear":
        return AxisScale("linear")
    high = float(np.percentile(finite, 99.9))
    if kind == "arcsinh":
        return AxisScale("arcsinh", cofactor=5.0 if high < 1e4 else 150.0)
    top = max(1000.0, 10 ** math.ceil(math.log10(max(float(np.percentile(finite, 99.99)), 1.0))))
    decades = 4.5
    negative = finite[finite < 0]
    width = 0.5
    if negative.size:
        r = float(np.percentile(negative, 5))
        if r < 0:
            width = (decades - math.log10(top / abs(r))) / 2
    width = float(min(max(width, 0.0), 1.0))
    return AxisScale("logicle", top=top, width=width, decades=decades)


def panel_scale(pnn: str, samples) -> AxisScale:
    """The display and gating scale of channel ``pnn`` for a whole panel, from what the
    instrument is, never from one patient's values, so every patient of the panel gets the same
    axes and a gate tree copied between patients keeps its meaning.

    - default kind: linear for scatter channels (FSC, SSC, time-like), arcsinh otherwise;
    - arcsinh cofactor: 5 on a mass cytometer (``$CYT``, metal channel names or ion-count data
      of the first patient), else 150;
    - logicle T: the channel's largest ``$PnR`` over the patients (else 262144), W 0.5, M 4.5.

    Returns an :class:`AxisScale` whose ``kind`` is the default kind and whose other fields hold
    the parameters of every kind (``dataclasses.replace(scale, kind=...)`` switches kind).
    """
    from gating_core.transforms import (FLOW_COFACTOR, MASS_COFACTOR, is_scatter, is_time_like,
                                        looks_like_mass_cytometry)

    samples = list(samples)
    mass = False
    if samples:
        first = samples[0]
        mass = looks_like_mass_cytometry(first.pnn, first.keywords, first.events[:20000])
    kind = "linear" if (is_scatter(pnn) or is_time_like(pnn)) and not mass else "arcsinh"
    ranges = []
    for sample in samples:
        try:
            channel = sample.channels[sample.channel_index(pnn)]
        except KeyError:
            continue
        if channel.range and channel.range > 0:
            ranges.append(float(channel.range))
    top = max(ranges) if ranges else 262144.0
    return AxisScale(kind, cofactor=MASS_COFACTOR if mass else FLOW_COFACTOR, top=max(top, 10.0))


def with_kind(scale: AxisScale, kind: str) -> AxisScale:
    """``scale``'s parameters under another kind (linear / arcsinh / logicle)."""
    import dataclasses

    return dataclasses.replace(scale, kind=kind)


# --------------------------------------------------------------------------------------------
# Gates


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


# --------------------------------------------------------------------------------------------
# Gate trees


class GateTree:
    """An ordered set of nested gates. Parents always come before their children.

    Examples
    --------
    >>> tree = GateTree()
    >>> tree.add(rectangle_gate("Lymphocytes", "FSC-A", "SSC-A", (0, 5e4), (0, 3e4)))
    >>> tree.add(polygon_gate("T cells", "CD3", "CD19", [(2, 0), (6, 0), (6, 1.5)], parent="Lymphocytes"))
    >>> labels = tree.labels(sample)   # "T cells" or "other" per event
    """

    def __init__(self, gates=None):
        self._gates: list[Gate] = []
        for gate in gates or []:
            self.add(gate)

    # structure -------------------------------------------------------------------------
    @property
    def gates(self) -> list[Gate]:
        return list(self._gates)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self._gates]

    def __len__(self) -> int:
        return len(self._gates)

    def __contains__(self, name) -> bool:
        return any(g.name == name for g in self._gates)

    def __getitem__(self, name: str) -> Gate:
        for gate in self._gates:
            if gate.name == name:
                return gate
        raise KeyError(name)

    def children(self, name: str | None) -> list[Gate]:
        return [g for g in self._gates if g.parent == name]

    def leaves(self) -> list[Gate]:
        parents = {g.parent for g in self._gates}
        return [g for g in self._gates if g.name not in parents]

    def depth(self, name: str) -> int:
        depth, gate = 0, self[name]
        while gate.parent is not None:
            depth, gate = depth + 1, self[gate.parent]
        return depth

    def descendants(self, name: str) -> list[str]:
        out, frontier = [], [name]
        while frontier:
            current = frontier.pop()
            for child in self.children(current):
                out.append(child.name)
                frontier.append(child.name)
        return out

    def add(self, gate: Gate) -> None:
        """Add a gate. Raises GateError for a duplicate name or an unknown parent."""
        if not isinstance(gate, Gate):
            raise GateError(f"expected a Gate, got {type(gate).__name__}")
        if gate.name in self:
            raise GateError(f"a gate named {gate.name!r} already exists")
        if gate.parent is not None and gate.parent not in self:
            raise GateError(f"gate {gate.name!r}: parent gate {gate.parent!r} does not exist")
        unknown = [o for o in gate.operands or [] if o not in self]
        if unknown:
            raise GateError(f"gate {gate.name!r}: no gate named {', '.join(map(repr, unknown))} to combine")
        self._gates.append(gate)

    def removal(self, name: str) -> list[str]:
        """The gates :meth:`remove` would delete with ``name``, in tree order: the gate, the
        gates nested inside it, and every boolean gate built on one of those (with its own
        nested gates), which would otherwise refer to a population that no longer exists."""
        if name not in self:
            raise GateError(f"no gate named {name!r}")
        doomed = {name}
        changed = True
        while changed:
            changed = False
            for gate in self._gates:  # parents and operands precede the gates that use them
                if gate.name not in doomed and (gate.parent in doomed or doomed & set(gate.operands or [])):
                    doomed.add(gate.name)
                    changed = True
        return [g.name for g in self._gates if g.name in doomed]

    def remove(self, name: str) -> list[str]:
        """Delete a gate, all gates nested inside it and the boolean gates built on them;
        returns the deleted names (tree order, see :meth:`removal`)."""
        doomed = self.removal(name)
        self._gates = [g for g in self._gates if g.name not in set(doomed)]
        return doomed

    def quadrant_set(self, name: str) -> list[str]:
        """Names of the quadrant gates split at the same point as quadrant gate ``name``
        (same parent, channels, scales and point), itself included, in tree order."""
        gate = self[name]
        if gate.kind != "quadrant":
            raise GateError(f"gate {name!r} is not a quadrant gate")
        return [g.name for g in self._gates if _same_split(g, gate)]

    def rename(self, old: str, new: str) -> None:
        if old not in self:
            raise GateError(f"no gate named {old!r}")
        if new != old and new in self:
            raise GateError(f"a gate named {new!r} already exists")
        gate = self[old]
        replacement = dataclasses.replace(gate, name=new)  # re-validates the new name
        self._gates = [replacement if g.name == old else g for g in self._gates]
        for g in self._gates:
            if g.parent == old:
                g.parent = replacement.name
            if g.operands and old in g.operands:
                g.operands = [replacement.name if o == old else o for o in g.operands]

    def replace_geometry(self, name: str, vertices, kind: str | None = None, x_scale: AxisScale | None = None,
                         y_scale: AxisScale | None = None) -> None:
        """Adjust one gate's shape (used after copying a tree to another patient). ``vertices``
        are in the display coordinates of ``x_scale`` / ``y_scale`` (default: the gate's own),
        which the gate keeps from then on."""
        gate = self[name]
        if gate.kind == "quadrant":
            # One split point serves four populations: moving one quadrant moves its set.
            members = set(self.quadrant_set(name))
            self._gates = [dataclasses.replace(g, vertices=list(vertices), x_scale=x_scale or g.x_scale,
                                               y_scale=y_scale or g.y_scale) if g.name in members else g
                           for g in self._gates]
            return
        updated = dataclasses.replace(gate, kind=kind or gate.kind, vertices=vertices, x_scale=x_scale or gate.x_scale,
                                      y_scale=y_scale or gate.y_scale)
        self._gates = [updated if g.name == name else g for g in self._gates]

    def copy(self) -> "GateTree":
        return GateTree(copy.deepcopy(self._gates))

    # evaluation ------------------------------------------------------------------------
    def memberships(self, sample) -> dict[str, np.ndarray]:
        """Gate name -> boolean mask (n_events,) of events in the gate AND all its ancestors."""
        masks: dict[str, np.ndarray] = {}
        for gate in self._gates:  # parents and operands precede the gates that use them
            masks[gate.name] = gate_membership(gate, sample, masks)
        return masks

    def labels(self, sample, memberships=None) -> np.ndarray:
        """Per-event training labels: the leaf gate each event falls in, else ``"other"``.

        Where sibling leaves overlap, the leaf added first wins, so labels stay deterministic.
        Returns an object ndarray of str, shape (n_events,).
        """
        masks = memberships if memberships is not None else self.memberships(sample)
        labels = np.full(sample.n_events, OTHER, dtype=object)
        assigned = np.zeros(sample.n_events, dtype=bool)
        for leaf in self.leaves():
            take = masks[leaf.name] & ~assigned
            labels[take] = leaf.name
            assigned |= take
        return labels

    def statistics(self, sample, memberships=None, channel_label=None):
        """DataFrame: gate, parent, depth, axes, count, % of parent, % of total, one row per gate.

        ``channel_label(sample, pnn)`` names the channels in ``axes`` (default: the $PnN).
        """
        import pandas as pd

        name_of = (lambda ch: channel_label(sample, ch)) if channel_label is not None else str
        masks = memberships if memberships is not None else self.memberships(sample)
        total = sample.n_events
        rows = []
        for gate in self._gates:
            count = int(masks[gate.name].sum())
            parent_count = total if gate.parent is None else int(masks[gate.parent].sum())
            rows.append({
                "gate": gate.name,
                "parent": gate.parent or "(all events)",
                "depth": self.depth(gate.name),
                "axes": gate.describe(name_of),
                "count": count,
                "% of parent": 100.0 * count / parent_count if parent_count else 0.0,
                "% of total": 100.0 * count / total if total else 0.0,
            })
        return pd.DataFrame(rows, columns=["gate", "parent", "depth", "axes", "count", "% of parent", "% of total"])

    def check_channels(self, sample) -> list[str]:
        """Names of channels the tree needs that the sample lacks (empty when it fits)."""
        missing = []
        for gate in self._gates:
            for ch in gate.channels:
                try:
                    sample.channel_index(ch)
                except KeyError:
                    if ch not in missing:
                        missing.append(ch)
        return missing

    # serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": "gating_core.gate_tree", "version": 1, "gates": [g.to_dict() for g in self._gates]}

    @classmethod
    def from_dict(cls, data: dict) -> "GateTree":
        if not isinstance(data, dict) or not isinstance(data.get("gates"), list):
            raise GateError("not a gate tree: expected an object with a 'gates' list")
        return cls([Gate.from_dict(g) for g in data["gates"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "GateTree":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GateError(f"gate tree is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def __eq__(self, other) -> bool:
        return isinstance(other, GateTree) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"GateTree({self.names})"


def gate_membership(gate: Gate, sample, masks: dict) -> np.ndarray:
    """Boolean mask (n_events,) of the events in ``gate`` and all its ancestors, given the
    memberships ``masks`` of the gates before it (its parent and, for a boolean gate, its
    operands)."""
    if gate.kind == "boolean":
        try:
            operands = [masks[o] for o in gate.operands]
        except KeyError as exc:
            raise GateError(f"gate {gate.name!r}: gate {exc} must come before it") from None
        if gate.operator == "not":
            inside = ~operands[0]
        elif gate.operator == "and":
            inside = np.logical_and.reduce(operands)
        else:
            inside = np.logical_or.reduce(operands)
        inside = np.array(inside, dtype=bool)
    else:
        inside = gate.contains(sample)
    if gate.parent is not None:
        inside &= masks[gate.parent]
    return inside


def _same_split(a: Gate, b: Gate) -> bool:
    return (a.kind == b.kind == "quadrant" and a.parent == b.parent and (a.x_channel, a.y_channel) ==
            (b.x_channel, b.y_channel) and a.vertices == b.vertices and a.x_scale.same_mapping(b.x_scale)
            and a.y_scale.same_mapping(b.y_scale))


class GateHistory:
    """Undo stack of gate-tree snapshots (JSON dicts, so snapshots never alias)."""

    def __init__(self, limit: int = 50):
        self.limit = limit
        self._snapshots: list[dict] = []

    def push(self, tree: GateTree) -> None:
        self._snapshots.append(tree.to_dict())
        del self._snapshots[:-self.limit]

    def can_undo(self) -> bool:
        return bool(self._snapshots)

    def undo(self) -> GateTree:
        if not self._snapshots:
            raise GateError("nothing to undo")
        return GateTree.from_dict(self._snapshots.pop())


# --------------------------------------------------------------------------------------------
# Expert gates from FlowJo workspaces and GatingML 2.0 (via FlowKit)


def _flowkit_sample(sample, sample_id: str):
    import flowkit

    return flowkit.Sample(np.asarray(sample.events, dtype=np.float64), sample_id=sample_id,
                          channel_labels=list(sample.pnn), subsample=0)


_XML_ESCAPE = re.compile(r"_x([0-9A-F]{4,6})_")
_XML_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")


def xml_gate_id(name: str) -> str:
    """A gate name as a GatingML id (an XML NCName): characters an NCName cannot hold become
    ``_xHHHH_`` (XML's usual name escape), so ``"T cells"`` is ``"T_x0020_cells"``.
    :func:`gate_name_from_xml` reverses it; the importers below apply that to every gate id."""
    out = []
    for i, char in enumerate(name):
        escape = not _XML_NAME_CHAR.match(char) or (i == 0 and not (char.isalpha() or char == "_")) \
            or (char == "_" and _XML_ESCAPE.match(name, i))
        out.append(f"_x{ord(char):04X}_" if escape else char)
    return "".join(out)


def gate_name_from_xml(gate_id: str) -> str:
    """The gate name behind a GatingML id written by :func:`xml_gate_id` (others unchanged)."""
    return _XML_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), gate_id)


def _leaf_labels(gate_ids, membership, n_events: int) -> tuple[np.ndarray, list[str]]:
    """Flatten flowkit (name, path) gate ids into leaf labels; duplicate leaf names get their parent."""
    ids = [(name, tuple(path)) for name, path in gate_ids]
    parent_paths = {other_path for _, other_path in ids}
    leaves = [(name, path) for name, path in ids if path + (name,) not in parent_paths]
    counts: dict[str, int] = {}
    for name, _ in leaves:
        counts[name] = counts.get(name, 0) + 1
    labels = np.full(n_events, OTHER, dtype=object)
    assigned = np.zeros(n_events, dtype=bool)
    names = []
    for name, path in leaves:
        label = gate_name_from_xml(name) if counts[name] == 1 else \
            "/".join(gate_name_from_xml(part) for part in [*path[1:], name])
        mask = np.asarray(membership(name, path), dtype=bool)
        if mask.shape[0] != n_events:
            raise ValueError(f"gate {name!r} returned {mask.shape[0]} memberships for {n_events} events")
        take = mask & ~assigned
        labels[take] = label
        assigned |= take
        names.append(label)
    return labels, names


def apply_gatingml(gatingml_path, sample) -> np.ndarray:
    """Apply a GatingML 2.0 file's gates to a Sample; returns leaf labels (n_events,) of str.

    Raises GateImportError naming the file when it cannot be parsed or applied.
    """
    import flowkit

    path = Path(gatingml_path)
    try:
        strategy = flowkit.parse_gating_xml(str(path))
    except Exception as exc:
        raise GateImportError(path, f"not a readable GatingML 2.0 file ({exc})") from None
    gate_ids = strategy.get_gate_ids()
    if not gate_ids:
        raise GateImportError(path, "the file defines no gates")
    try:
        results = strategy.gate_sample(_flowkit_sample(sample, sample.name))
        labels, _ = _leaf_labels(gate_ids, lambda n, p: results.get_gate_membership(n, gate_path=p),
                                 sample.n_events)
    except Exception as exc:
        raise GateImportError(path, f"its gates could not be applied to {sample.name} ({exc})") from None
    return labels


def apply_workspace(wsp_path, samples: dict) -> dict:
    """Apply a FlowJo workspace's gates to the samples it names.

    Parameters
    ----------
    wsp_path : path of the .wsp file
    samples : dict of str -> Sample
        Keyed by the FCS file name the workspace refers to (for example ``"patient_01.fcs"``).

    Returns
    -------
    dict of str -> ndarray of str
        Sample key -> leaf labels (n_events,), for every sample the workspace gates.
        Raises GateImportError when the workspace cannot be read or matches none of the samples.
    """
    import flowkit

    path = Path(wsp_path)
    fk_samples = [_flowkit_sample(s, key) for key, s in samples.items()]
    try:
        workspace = flowkit.Workspace(str(path), fcs_samples=fk_samples)
    except Exception as exc:
        raise GateImportError(path, f"not a readable FlowJo workspace ({exc})") from None
    known = set(workspace.get_sample_ids())
    matched = [key for key in samples if key in known]
    if not matched:
        raise GateImportError(path, f"the workspace names samples {sorted(known)[:5]} but none of the "
                                    f"loaded files ({sorted(samples)[:5]})")
    out = {}
    for key in matched:
        try:
            workspace.analyze_samples(sample_id=key, use_mp=False)
            gate_ids = workspace.get_gate_ids(key)
            labels, _ = _leaf_labels(gate_ids, lambda n, p, k=key: workspace.get_gate_membership(k, n, gate_path=p),
                                     samples[key].n_events)
        except Exception as exc:
            raise GateImportError(path, f"its gates could not be applied to {key} ({exc})") from None
        out[key] = labels
    return out


# --------------------------------------------------------------------------------------------
# Helpers for names coming from users


_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_stem(file_name: str, fallback: str = "file") -> str:
    """A display/identifier stem from an uploaded file name; never used as a path by itself.

    Drops any directory part, the extension(s) ``.fcs``/``.csv``/``.labels.csv``/``.gated.csv``,
    and replaces characters outside ``[A-Za-z0-9._+-]`` with ``_``.
    """
    base = os.path.basename(str(file_name).replace("\\", "/"))
    lowered = base.lower()
    for suffix in (".labels.csv", ".gated.csv", ".fcs", ".csv", ".wsp", ".xml", ".lmd"):
        if lowered.endswith(suffix):
            base = base[: -len(suffix)]
            break
    stem = _SAFE.sub("_", base).strip("._")[:80]
    return stem or fallback
