"""One gate's polygon fitted to the cells predicted in it, on its parent's plot.

:func:`fit_polygon` works in the display coordinates the gate is defined in:

1. the parent's events are binned on a ``bins`` x ``bins`` grid spanning them (0.05-99.95
   percentiles; the rare events beyond are counted in the edge bins), once for the cells
   predicted in the gate and once for the others, and both histograms are smoothed by a
   Gaussian of ``smoothing`` bins (a kernel density estimate on a grid);
2. the gate's region is where the predicted cells are denser than the others -- the 2-D
   decision that agrees best, cell by cell, with the predictions -- and at least ``core``
   times the predicted cells' peak density (so sparse strays far from the population never
   widen it);
3. only the connected piece of that region holding the most predicted cells is kept, holes
   filled (a gate is one polygon; an outlier island is dropped, not bridged as a convex hull
   would bridge it, and a concave population stays concave);
4. the piece is smoothed: blurred by a Gaussian of ``outline_smoothing`` bins and cut at half
   height, which rounds off the teeth a pixel wide that the noise of two close densities
   leaves on its edge and keeps its broad shape. A piece that would lose more than
   :data:`SMOOTHING_LOSS` of its predicted cells to it (a streak a few bins wide, a small
   population) is kept as it was;
5. its outline is traced along the pixel edges and each edge replaced by its midpoint, so that
   a slanted edge, a staircase of pixels, becomes a straight line; it is simplified
   (Douglas-Peucker, to one bin) to at most ``max_vertices`` vertices a reviewer can drag;
   vertices on the grid's border move out to the data's extreme values, so cells piled on an
   axis end stay inside.

How much smoother that makes the polygons, and what it costs in agreement, is measured in
docs/app.md (`bench/bench_autogates.py`, which also prints each polygon's :func:`total_turning`).

Only numpy and scipy (``scipy.ndimage``) are used: no matplotlib, no shapely.

:func:`~gating_core.gates.autogates.fit_gate_tree` fits a whole tree with it, top-down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage


def _trace_outline(region: np.ndarray) -> np.ndarray:
    """The outer boundary (k, 2) of a binary pixel region, as lattice corners (i, j) in pixel
    units, counter-clockwise. At a corner two pixels share only diagonally the walk turns right
    first, so the whole region stays inside one loop."""
    padded = np.pad(region, 1)
    inside = padded[1:-1, 1:-1]
    edges: dict[tuple, list[tuple]] = {}

    def add(a, b):
        edges.setdefault(a, []).append(b)

    ii, jj = np.nonzero(inside)
    for i, j in zip(ii.tolist(), jj.tolist()):
        pi, pj = i + 1, j + 1  # indices into padded
        if not padded[pi, pj - 1]:
            add((i, j), (i + 1, j))
        if not padded[pi + 1, pj]:
            add((i + 1, j), (i + 1, j + 1))
        if not padded[pi, pj + 1]:
            add((i + 1, j + 1), (i, j + 1))
        if not padded[pi - 1, pj]:
            add((i, j + 1), (i, j))
    start = min(edges)  # the lowest-leftmost corner is on the outer boundary
    loop = [start]
    current, heading = start, None
    used: set[tuple] = set()
    for _ in range(4 * len(ii) + 8):
        options = [b for b in edges[current] if (current, b) not in used]
        if not options:
            break
        if heading is not None and len(options) > 1:
            def turn(b, h=heading, c=current):
                d = (b[0] - c[0], b[1] - c[1])
                cross = h[0] * d[1] - h[1] * d[0]  # > 0 a left turn, < 0 a right turn
                return 0 if cross < 0 else (1 if cross == 0 else 2)
            options.sort(key=turn)
        nxt = options[0]
        used.add((current, nxt))
        heading = (nxt[0] - current[0], nxt[1] - current[1])
        current = nxt
        if current == start:
            break
        loop.append(current)
    return np.asarray(loop, dtype=np.float64)


def _douglas_peucker(points: np.ndarray, tolerance: float) -> np.ndarray:
    """Open polyline simplification: keep the points farther than ``tolerance`` from the chord."""
    if len(points) < 3:
        return points
    keep = np.zeros(len(points), dtype=bool)
    keep[[0, -1]] = True
    stack = [(0, len(points) - 1)]
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        chord = points[b] - points[a]
        seg = points[a + 1:b] - points[a]
        norm = float(np.hypot(*chord))
        if norm == 0:
            dist = np.hypot(seg[:, 0], seg[:, 1])
        else:
            dist = np.abs(chord[0] * seg[:, 1] - chord[1] * seg[:, 0]) / norm
        k = int(np.argmax(dist))
        if dist[k] > tolerance:
            keep[a + 1 + k] = True
            stack += [(a, a + 1 + k), (a + 1 + k, b)]
    return points[keep]


def _simplify_loop(loop: np.ndarray, tolerance: float, max_vertices: int) -> np.ndarray:
    """A closed loop simplified to at most ``max_vertices`` corners (tolerance grows as needed)."""
    far = int(np.argmax(np.hypot(*(loop - loop[0]).T)))
    while True:
        first = _douglas_peucker(loop[:far + 1], tolerance)
        second = _douglas_peucker(np.vstack([loop[far:], loop[:1]]), tolerance)
        simplified = np.vstack([first[:-1], second[:-1]])
        if len(simplified) <= max_vertices or tolerance > 1e3:
            return simplified
        tolerance *= 1.5


#: The share of a region's predicted cells its smoothing may lose; past it the region is kept as
#: it was (see :func:`_smoothed_region`).
SMOOTHING_LOSS = 0.02


def _smoothed_region(region: np.ndarray, counts: np.ndarray, sigma: float) -> np.ndarray:
    """``region`` blurred by a Gaussian of ``sigma`` bins and cut at half height, its largest
    piece by ``counts`` with holes filled; ``region`` itself where that piece holds less than
    1 - :data:`SMOOTHING_LOSS` of the counts ``region`` holds."""
    if sigma <= 0:
        return region
    # "nearest": a region running off the grid is not worn away at the border
    smooth = ndimage.gaussian_filter(region.astype(np.float64), sigma, mode="nearest") > 0.5
    pieces, n_pieces = ndimage.label(smooth)
    if n_pieces == 0:
        return region
    mass = ndimage.sum(counts, pieces, index=np.arange(1, n_pieces + 1))
    smooth = ndimage.binary_fill_holes(pieces == 1 + int(np.argmax(mass)))
    if counts[smooth].sum() < (1.0 - SMOOTHING_LOSS) * counts[region].sum():
        return region
    return smooth


def _edge_midpoints(loop: np.ndarray, bins: int) -> np.ndarray:
    """A traced outline (lattice corners) as the midpoints of its pixel edges, with the corners
    that lie on the grid's border kept too, so that a region filling a corner of the grid keeps
    it (those vertices are moved beyond the data later)."""
    midpoints = 0.5 * (loop + np.roll(loop, -1, axis=0))
    on_border = np.any((loop <= 0) | (loop >= bins), axis=1)
    points = np.empty((len(loop) + int(on_border.sum()), 2))
    # each border corner goes just before the midpoint of the edge it starts
    slots = np.arange(len(loop)) + np.cumsum(on_border)
    points[slots] = midpoints
    points[slots[on_border] - 1] = loop[on_border]
    return points


def total_turning(vertices) -> float:
    """How much a closed polygon's outline turns, in full turns, on axes scaled to its width and
    height: 1 for a convex polygon, about one more for each tooth or notch. vertices (k, 2)."""
    v = np.asarray(vertices, dtype=np.float64)
    v = (v - v.min(axis=0)) / np.where(np.ptp(v, axis=0) > 0, np.ptp(v, axis=0), 1.0)
    step = np.roll(v, -1, axis=0) - v
    heading = np.arctan2(step[:, 1], step[:, 0])
    return float(np.abs(np.angle(np.exp(1j * (np.roll(heading, -1) - heading)))).sum() / (2 * np.pi))


@dataclass
class PolygonFit:
    """What :func:`fit_polygon` found: ``vertices`` (k, 2) in display coordinates, or None when
    the predicted cells are too few to fit; ``grid`` the plot's bins ((x_edges, y_edges))."""

    vertices: np.ndarray | None
    n_predicted: int
    grid: tuple = field(default=(), repr=False)


def fit_polygon(points: np.ndarray, predicted: np.ndarray, *, bins: int = 96, smoothing: float = 1.2,
                core: float = 0.01, outline_smoothing: float = 1.5, max_vertices: int = 30,
                min_events: int = 10) -> PolygonFit:
    """Fit one polygon to the predicted cells among a parent's events on one plot.

    Parameters
    ----------
    points : ndarray (n_parent_events, 2)
        The parent's events in the gate's display coordinates (NaN rows are ignored).
    predicted : ndarray of bool (n_parent_events,)
        Which of them the model put in this gate's populations.
    bins, smoothing, core, outline_smoothing, max_vertices, min_events : see the module docstring.

    Returns
    -------
    PolygonFit
    """
    points = np.asarray(points, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=bool)
    finite = np.all(np.isfinite(points), axis=1)
    points, predicted = points[finite], predicted[finite]
    n_pred = int(predicted.sum())
    if n_pred < min_events:
        return PolygonFit(None, n_pred)
    lo = np.percentile(points, 0.05, axis=0)
    hi = np.percentile(points, 99.95, axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    lo, hi = lo - 0.02 * span, hi + 0.02 * span
    clipped = np.clip(points, lo, hi)
    x_edges = np.linspace(lo[0], hi[0], bins + 1)
    y_edges = np.linspace(lo[1], hi[1], bins + 1)
    pos, _, _ = np.histogram2d(clipped[predicted, 0], clipped[predicted, 1], bins=(x_edges, y_edges))
    neg, _, _ = np.histogram2d(clipped[~predicted, 0], clipped[~predicted, 1], bins=(x_edges, y_edges))
    pos = ndimage.gaussian_filter(pos, smoothing, mode="constant")
    neg = ndimage.gaussian_filter(neg, smoothing, mode="constant")
    region = (pos > neg) & (pos >= core * pos.max())
    components, n_components = ndimage.label(region)
    if n_components == 0:
        return PolygonFit(None, n_pred, (x_edges, y_edges))
    # the piece holding the most predicted cells (raw counts, not smoothed)
    raw_pos, _, _ = np.histogram2d(clipped[predicted, 0], clipped[predicted, 1], bins=(x_edges, y_edges))
    mass = ndimage.sum(raw_pos + 1e-9 * pos, components, index=np.arange(1, n_components + 1))
    region = ndimage.binary_fill_holes(components == 1 + int(np.argmax(mass)))
    region = _smoothed_region(region, raw_pos, outline_smoothing)
    outline = _edge_midpoints(_trace_outline(region), bins)
    corners = _simplify_loop(outline, 1.0, max_vertices)
    if len(corners) < 3:
        return PolygonFit(None, n_pred, (x_edges, y_edges))
    # lattice corner (i, j) -> display coordinates; the grid's border -> beyond every event
    x = np.interp(corners[:, 0], np.arange(bins + 1), x_edges)
    y = np.interp(corners[:, 1], np.arange(bins + 1), y_edges)
    data_lo, data_hi = points.min(axis=0), points.max(axis=0)
    pad = 0.01 * span
    x = np.where(corners[:, 0] <= 0, min(data_lo[0], lo[0]) - pad[0], x)
    x = np.where(corners[:, 0] >= bins, max(data_hi[0], hi[0]) + pad[0], x)
    y = np.where(corners[:, 1] <= 0, min(data_lo[1], lo[1]) - pad[1], y)
    y = np.where(corners[:, 1] >= bins, max(data_hi[1], hi[1]) + pad[1], y)
    return PolygonFit(np.column_stack([x, y]), n_pred, (x_edges, y_edges))
