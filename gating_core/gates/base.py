"""What every gate type is: the abstract :class:`Gate` and :class:`AxisGate`, a gate on channel axes.

Each gate type (polygon, rectangle, quadrant, range, boolean) is a subclass in a module of its
own that implements, for its geometry, the membership test, the stored description, the
FlowKit gate it exports as and the drawing a plot shows. Callers use these methods and never
test the kind.

A stored description names its type by ``kind``: :data:`GATE_TYPES` maps each kind to its class
and :func:`gate_from_fields` builds the gate of a description. The table is defined here, where
reading a description needs it, and filled by :mod:`gating_core.gates.registry`, which imports
every type: this module imports none of them (they import it), and the package imports the
registry before anyone can build a gate.
"""

from __future__ import annotations

import re
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from gating_core.gates.errors import GateError
from gating_core.gates.scales import AxisScale

OTHER = "other"
#: kind -> gate class, in the order the types are offered; filled by :mod:`gating_core.gates.registry`.
GATE_TYPES: dict[str, type["Gate"]] = {}
_NAME_PATTERN = re.compile(r"^[^\x00-\x1f/]{1,80}$")


def is_gate_name(name: str) -> bool:
    """Whether ``name`` can name a gate, and so a population: 1-80 printable characters, no '/',
    and not ``other`` (the cells no gate claims)."""
    return bool(_NAME_PATTERN.match(str(name))) and str(name).casefold() != OTHER


class _GateClass(ABCMeta):
    """The metaclass of gates. ``Gate(name, x_channel, y_channel, kind, vertices, ...)`` was the
    constructor of every gate when one class held all kinds, and code written for it still calls
    it: calling the abstract base builds the registered type of ``kind`` instead."""

    def __call__(cls, *args, **kwargs):
        if cls is Gate:
            return gate_from_fields(_one_class_fields(*args, **kwargs))
        return super().__call__(*args, **kwargs)


def _one_class_fields(name, x_channel, y_channel, kind, vertices, x_scale=None, y_scale=None, parent=None,
                      quadrant=None, operator=None, operands=None) -> dict:
    """The arguments of the one-class constructor as a stored description."""
    fields = {"name": name, "x_channel": x_channel, "y_channel": y_channel, "kind": kind, "vertices": vertices,
              "x_scale": x_scale, "y_scale": y_scale, "parent": parent}
    extras = {"quadrant": quadrant, "operator": operator, "operands": operands}
    fields.update({key: value for key, value in extras.items() if value is not None})
    return fields


@dataclass(kw_only=True)
class Gate(metaclass=_GateClass):
    """One gate of a tree: a named population inside its parent's.

    Parameters
    ----------
    name : str
        Unique within its tree; becomes the population name when the gate is a leaf.
    parent : str or None
        Name of the parent gate; None means the gate applies to all events.

    Attributes
    ----------
    kind : str
        The type's name in stored descriptions ("polygon", ...); its key in :data:`GATE_TYPES`.
    is_shape : bool
        Whether the gate is a 2-D region a reviewer redraws and auto-gating refits as a polygon.
    flowjo_workspace : bool
        Whether FlowKit's FlowJo workspace writer can write the gate (GatingML takes every type).
    """

    name: str
    parent: str | None = None

    kind: ClassVar[str]
    is_shape: ClassVar[bool] = False
    flowjo_workspace: ClassVar[bool] = False

    def __post_init__(self):
        self.name = str(self.name).strip()
        if not is_gate_name(self.name):
            raise GateError(f"invalid gate name {self.name!r}: use 1-80 printable characters, no '/', "
                            f"and not {OTHER!r}")
        if self.parent is not None:
            self.parent = str(self.parent)

    # structure ------------------------------------------------------------------------------
    @property
    def axes(self) -> tuple:
        """((channel, AxisScale), ...) of the plot the gate was drawn on; empty without axes."""
        return ()

    @property
    def channels(self) -> tuple:
        """The channels the gate tests (none for a gate computed from other gates)."""
        return tuple(channel for channel, _ in self.axes)

    @property
    def references(self) -> tuple:
        """Names of the other gates whose populations this gate is computed from (besides its
        parent); a tree keeps them before it and deletes it with them."""
        return ()

    def rename_reference(self, old: str, new: str) -> None:
        """Follow the renaming of gate ``old`` to ``new`` (in place)."""
        if self.parent == old:
            self.parent = new

    def shares_geometry_with(self, other: "Gate") -> bool:
        """Whether ``other`` (another gate of the tree) is drawn and moved with this one."""
        return False

    def reshaped(self, vertices, kind: str | None = None, x_scale=None, y_scale=None) -> "Gate":
        """A copy with new geometry (see :meth:`AxisGate.reshaped`)."""
        raise GateError(f"gate {self.name!r}: a {self.kind} gate has no geometry to change")

    # membership -----------------------------------------------------------------------------
    def contains(self, sample) -> np.ndarray:
        """Boolean mask (n_events,) of the sample's events inside this gate, ignoring the parent."""
        raise GateError(f"gate {self.name!r}: a {self.kind} gate's cells come from its tree "
                        f"(GateTree.memberships)")

    def combine(self, populations: dict) -> np.ndarray:
        """The events of a gate computed from other gates (:attr:`references`), from their
        populations ``{name: mask}``."""
        raise GateError(f"gate {self.name!r}: a {self.kind} gate is not computed from other gates")

    @abstractmethod
    def events_inside(self, sample, memberships: dict) -> np.ndarray:
        """Boolean mask (n_events,) of the events inside this gate, ignoring the parent, given
        the memberships of the gates before it in its tree."""

    # words, drawing, export -----------------------------------------------------------------
    @abstractmethod
    def describe(self, channel_name=str) -> str:
        """What the gate tests, in words: its axes, or its expression."""

    @abstractmethod
    def drawing(self, x_scale: AxisScale | None = None, y_scale: AxisScale | None = None):
        """What a plot draws for the gate in the display coordinates of ``x_scale`` / ``y_scale``
        (default: its own): a :class:`~gating_core.gates.drawing.Region`, ``Split`` or ``Band``,
        or None for a gate with no axes."""

    @abstractmethod
    def flowkit_gate(self, writer):
        """The FlowKit gate this gate exports as; ``writer`` is the
        :class:`~gating_core.gates.export.StrategyWriter` building the strategy."""

    def write_flowkit(self, writer) -> None:
        """Add this gate to the writer's GatingStrategy, under its parent."""
        writer.add(self, self.flowkit_gate(writer))

    # serialisation --------------------------------------------------------------------------
    @abstractmethod
    def to_dict(self) -> dict:
        """The stored description (JSON-ready): name, x_channel, y_channel, kind, vertices,
        x_scale, y_scale, parent, as every stored gate has them, then the type's own fields."""

    @classmethod
    @abstractmethod
    def from_fields(cls, fields: dict) -> "Gate":
        """The gate of a stored description (``fields["kind"]`` is this type's)."""

    @classmethod
    def from_dict(cls, data: dict) -> "Gate":
        """The gate of a stored description, of the type its ``kind`` names."""
        gate = gate_from_fields(data)
        if not isinstance(gate, cls):
            raise GateError(f"gate {gate.name!r} is a {gate.kind} gate, not a {cls.__name__}")
        return gate

    def _stored(self, **values) -> dict:
        """The stored description with ``values`` for the type's fields; a gate without axes
        writes empty ones, as every stored gate has them."""
        out = {"name": self.name, "x_channel": None, "y_channel": None, "kind": self.kind, "vertices": [],
               "x_scale": AxisScale().to_dict(), "y_scale": AxisScale().to_dict(), "parent": self.parent}
        out.update(values)
        return out


@dataclass(kw_only=True)
class AxisGate(Gate):
    """A gate drawn on one or two channel axes, in the display coordinates of that plot.

    Parameters
    ----------
    x_channel, y_channel : str, str or None
        Channel names ($PnN, or $PnS as accepted by ``Sample.channel_index``); ``y_channel`` is
        None for a one-axis gate.
    vertices : list of (x, y)
        The geometry in display coordinates; what the pairs mean is the type's.
    x_scale, y_scale : AxisScale
        The axis transforms of the plot the gate was drawn on.

    Attributes
    ----------
    n_axes : int
        How many channels the type tests: 2, or 1 (``y_channel`` then is None).
    """

    x_channel: str | None
    y_channel: str | None = None
    vertices: list
    x_scale: AxisScale = field(default_factory=AxisScale)
    y_scale: AxisScale = field(default_factory=AxisScale)

    n_axes: ClassVar[int] = 2

    def __post_init__(self):
        super().__post_init__()
        self.x_scale, self.y_scale = _scale(self.x_scale), _scale(self.y_scale)
        for axis, wanted in zip(("x_channel", "y_channel"), (True, self.n_axes == 2)):
            value = getattr(self, axis)
            if wanted and (value is None or str(value) == ""):
                raise GateError(f"gate {self.name!r}: a {self.kind} gate needs {axis.replace('_', ' ')}")
            setattr(self, axis, str(value) if wanted else None)
        try:
            verts = np.asarray(self.vertices, dtype=np.float64)
        except (TypeError, ValueError):
            raise GateError(f"gate {self.name!r}: vertices must be (x, y) number pairs") from None
        if verts.ndim != 2 or verts.shape[1] != 2 or not np.all(np.isfinite(verts)):
            raise GateError(f"gate {self.name!r}: vertices must be finite (x, y) pairs")
        self.vertices = [(float(x), float(y)) for x, y in self._checked_vertices(verts)]

    @abstractmethod
    def _checked_vertices(self, verts: np.ndarray) -> np.ndarray:
        """The type's vertices (k, 2), normalised, or GateError when they are no such gate."""

    @abstractmethod
    def contains_points(self, points: np.ndarray) -> np.ndarray:
        """Boolean mask for (n, 2) display-coordinate points ((n, 1) for a one-axis gate). NaN
        points are outside."""

    @property
    def axes(self) -> tuple:
        return ((self.x_channel, self.x_scale), (self.y_channel, self.y_scale))[:self.n_axes]

    def display_points(self, sample) -> np.ndarray:
        """(n_events, n_axes) display coordinates of the sample's events on this gate's axes."""
        return np.column_stack([scale.forward(sample.events[:, _channel_index(sample, channel)])
                                for channel, scale in self.axes])

    def contains(self, sample) -> np.ndarray:
        return self.contains_points(self.display_points(sample))

    def events_inside(self, sample, memberships: dict) -> np.ndarray:
        return self.contains(sample)

    def describe(self, channel_name=str) -> str:
        return " / ".join(channel_name(channel) for channel in self.channels)

    def outline(self, x_scale: AxisScale | None = None, y_scale: AxisScale | None = None,
                points_per_edge: int = 24) -> np.ndarray:
        """The closed outline (k, 2) of a 2-D region; other types have none (GateError)."""
        raise GateError(f"gate {self.name!r}: a {self.kind} gate has no outline")

    def reshaped(self, vertices, kind: str | None = None, x_scale=None, y_scale=None) -> "Gate":
        """A copy with ``vertices`` in the display coordinates of ``x_scale`` / ``y_scale``
        (default: its own), which it keeps, as a gate of ``kind`` (default: its own: a moved
        rectangle corner makes a polygon)."""
        fields = self.to_dict()
        fields.update(kind=kind or self.kind, vertices=vertices, x_scale=x_scale or self.x_scale,
                      y_scale=y_scale or self.y_scale)
        return gate_from_fields(fields)

    def to_dict(self) -> dict:
        return self._stored(x_channel=self.x_channel, y_channel=self.y_channel,
                            vertices=[list(v) for v in self.vertices], x_scale=self.x_scale.to_dict(),
                            y_scale=self.y_scale.to_dict())

    @classmethod
    def from_fields(cls, fields: dict) -> "AxisGate":
        return cls(name=fields["name"], x_channel=_channel(fields["x_channel"]),
                   y_channel=_channel(fields.get("y_channel")), vertices=fields["vertices"],
                   x_scale=_scale(fields.get("x_scale")), y_scale=_scale(fields.get("y_scale")),
                   parent=fields.get("parent"), **cls._own_fields(fields))

    @classmethod
    def _own_fields(cls, fields: dict) -> dict:
        """The type's constructor arguments beyond those of every axis gate."""
        return {}


def _scale(value) -> AxisScale:
    """An AxisScale from itself, its stored dict, or None (linear)."""
    if value is None:
        return AxisScale()
    return value if isinstance(value, AxisScale) else AxisScale.from_dict(value)


def _channel(value) -> str | None:
    return None if value is None else str(value)


def _channel_index(sample, name: str) -> int:
    try:
        return sample.channel_index(name)
    except KeyError:
        raise GateError(f"{sample.name}: the gate needs channel {name!r}, which this sample lacks") from None


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
