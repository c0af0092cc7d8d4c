"""What a plot draws for a gate: the few drawing primitives gate types map their geometry to.

A gate's :meth:`~gating_core.gates.Gate.drawing` returns one of these in the display
coordinates of the plot asked for, so the report's SVG and the app's Plotly charts draw every
gate type from three cases (a new type drawn as a region needs no change there):

* :class:`Region` - a closed 2-D outline (polygon, rectangle);
* :class:`Split` - one region of a quadrant split: two lines through a point;
* :class:`Band` - an interval on a histogram's axis (range gate).

A gate with no axes (boolean) draws nothing (None).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates.scales import AxisScale


@dataclass(frozen=True, eq=False)
class Region:
    """A closed 2-D region.

    Attributes
    ----------
    outline : ndarray (k, 2)
        The closed outline (the last point repeats the first).
    mapped : bool
        Whether the outline was mapped from the scales the gate was drawn on onto other ones:
        its straight edges then are curves, sampled densely (the app draws it dotted).
    box : (x0, y0, x1, y1) or None
        The corners of an axis-aligned box, when the region is one on these axes (a chart draws
        it as a rectangle).
    """

    outline: np.ndarray
    mapped: bool = False
    box: tuple | None = None

    @property
    def corners(self) -> np.ndarray:
        """The outline without its closing point."""
        return self.outline[:-1]


@dataclass(frozen=True)
class Split:
    """One region of a quadrant split: ``region`` ("++", "+-", "-+", "--": sign of x, then of
    y) of the split at ``point``; the gates split at one point draw one pair of lines."""

    point: tuple
    region: str


@dataclass(frozen=True)
class Band:
    """The interval [low, high] on a histogram's (x) axis."""

    low: float
    high: float


def straight_outline(corners, own: tuple, wanted: tuple, points_per_edge: int = 24) -> tuple:
    """(closed outline (k, 2), mapped) of a region with straight edges between ``corners`` in
    the display coordinates of scales ``own`` = (x, y), drawn on scales ``wanted`` (None: own).

    On other scales straight edges are curves, so each edge is drawn through
    ``points_per_edge`` points mapped raw -> new scale.
    """
    corners = np.asarray(corners, dtype=np.float64)
    x_scale, y_scale = (want or have for want, have in zip(wanted, own))
    closed = np.vstack([corners, corners[:1]])
    if x_scale.same_mapping(own[0]) and y_scale.same_mapping(own[1]):
        return closed, False
    t = np.linspace(0.0, 1.0, points_per_edge, endpoint=False)[:, None]
    dense = np.vstack([a + t * (b - a) for a, b in zip(closed[:-1], closed[1:])] + [closed[:1]])
    x = x_scale.forward(own[0].inverse(dense[:, 0]))
    y = y_scale.forward(own[1].inverse(dense[:, 1]))
    return np.column_stack([x, y]), True


def mapped_value(value: float, own: AxisScale, wanted: AxisScale | None) -> float:
    """A display coordinate on scale ``own`` as one on scale ``wanted`` (None: unchanged)."""
    if wanted is None:
        return float(value)
    return float(wanted.forward(own.inverse(np.array([value])))[0])
