"""Auto-gates as gates: an auto-gate result brought back into a training patient's gate tree.

The model predicts a population for every cell; a lab reviews gates. Given a *template* gate
tree (the hierarchy a training patient was gated with: each gate's parent, its two channels and
their axis scales) and the predicted population of each of a new patient's events, this module
fits every gate's polygon to the predicted cells on its parent's plot, top-down, so each child
is fitted among the events of its already fitted parent. The result is an ordinary
:class:`~gating_core.gates.GateTree` for the new patient: drawn, edited, exported and stored like
any hand-drawn tree.

Which cells a gate should hold: a leaf gate named like a population holds that population; a
gate with children holds every population of the leaves below it (a "T cells" gate above "CD4 T
cells" and "CD8 T cells" holds both). A gate that cannot be fitted is kept as the template drew
it, and :class:`AutoGateFit` says why: its subtree names no population, too few of its cells are
predicted, or a gate below it names no population the model knows (a "T cells" leaf beside "NK
cells" when the model predicts CD4 and CD8 T cells): a parent fitted to the other populations
alone would cut those cells away, so it stays as drawn.

How a polygon is fitted (:func:`fit_polygon`), in the display coordinates the gate is defined in:

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
4. its outline is traced along the pixel edges and simplified (Douglas-Peucker) to at most
   ``max_vertices`` vertices a reviewer can drag; vertices on the grid's border move out to
   the data's extreme values, so cells piled on an axis end stay inside.

Only numpy and scipy (``scipy.ndimage``) are used: no matplotlib, no shapely.

:func:`agreement` measures how well the fitted gates hold the predicted cells (F1 per gate of
the gate's membership against the cells predicted in it), :func:`flat_statistics` presents a
result whose training labels were flat (every population a child of all events).

After review the per-cell populations stay the one source of counts: :func:`relabel_after_edit`
relabels only the cells whose gate membership an adjusted gate changed, and
:func:`counted_cells` gives each gate the cells it counts from the populations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from gating_core.gates import OTHER, Gate, GateError, GateTree, gate_membership, polygon_gate, rectangle_gate

ALL_EVENTS = "(all events)"
#: Populations that name no gate (cells no leaf gate claimed). For a gate with children they do
#: not vote: a "T cells" gate rightly holds CD4- CD8- T cells no leaf below it claims.
UNASSIGNED = (OTHER, "ungated")


# --------------------------------------------------------------------------------------------
# Which populations each gate holds


def gate_populations(tree: GateTree, populations) -> dict[str, set[str]]:
    """Gate name -> the populations its cells should be: a leaf named like a population holds
    it; a parent holds the union of its leaves'. Gates whose subtree names no population map to
    an empty set (they cannot be fitted)."""
    known = {str(p) for p in populations}
    out: dict[str, set[str]] = {}
    for gate in reversed(tree.gates):  # children come after their parents
        children = tree.children(gate.name)
        if not children:
            out[gate.name] = {gate.name} & known
        else:
            out[gate.name] = set().union(*(out[c.name] for c in children))
    return {g.name: out[g.name] for g in tree.gates}


def template_matches(tree: GateTree, populations) -> list[str]:
    """Names of the template's leaf gates that are populations of ``populations`` (a model's)."""
    known = {str(p) for p in populations}
    return [g.name for g in tree.leaves() if g.name in known]


# --------------------------------------------------------------------------------------------
# Fitting one polygon


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


@dataclass
class PolygonFit:
    """What :func:`fit_polygon` found: ``vertices`` (k, 2) in display coordinates, or None when
    the predicted cells are too few to fit; ``grid`` the plot's bins ((x_edges, y_edges))."""

    vertices: np.ndarray | None
    n_predicted: int
    grid: tuple = field(default=(), repr=False)


def fit_polygon(points: np.ndarray, predicted: np.ndarray, *, bins: int = 96, smoothing: float = 1.2,
                core: float = 0.01, max_vertices: int = 30, min_events: int = 10) -> PolygonFit:
    """Fit one polygon to the predicted cells among a parent's events on one plot.

    Parameters
    ----------
    points : ndarray (n_parent_events, 2)
        The parent's events in the gate's display coordinates (NaN rows are ignored).
    predicted : ndarray of bool (n_parent_events,)
        Which of them the model put in this gate's populations.
    bins, smoothing, core, max_vertices, min_events : see the module docstring.

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
    loop = _trace_outline(region)
    corners = _simplify_loop(loop, 0.75, max_vertices)
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


# --------------------------------------------------------------------------------------------
# Fitting a tree


@dataclass
class AutoGateFit:
    """The result of :func:`fit_gate_tree`.

    Attributes
    ----------
    tree : GateTree
        The patient's gates, same names, parents, channels and scales as the template.
    fitted : list of str
        Gates whose polygon was fitted to this patient; the others keep the template's geometry.
    memberships : dict of str -> ndarray of bool (n_events,)
        Each gate's events (inside it and all its ancestors).
    targets : dict of str -> ndarray of bool (n_events,)
        The cells predicted in each gate's populations.
    unfitted : dict of str -> str
        Every polygon or rectangle gate kept as the template drew it, with the reason in words
        (a quadrant, range or boolean gate is never fitted and is not listed).
    """

    tree: GateTree
    fitted: list
    memberships: dict
    targets: dict
    unfitted: dict = field(default_factory=dict)


#: A parent gate is fitted only when the fit keeps at least this share of the events of the
#: gates below it that name no population (the model says nothing about where those cells are,
#: so a fit to the other children alone may cut them away).
KEEP_UNNAMED = 0.9


def fit_gate_tree(template: GateTree, sample, populations, unassigned=UNASSIGNED, known=None,
                  template_sample=None, template_labels=None, **polygon_options) -> AutoGateFit:
    """Fit the template's gates to one patient's predicted populations, top-down.

    Parameters
    ----------
    template : GateTree
        A training patient's gate tree (its structure, channels and scales are kept).
    sample : Sample
        The patient's events (compensated as the model saw them).
    populations : array-like of str (n_events,)
        The predicted population of each event (``GatingModel.gate(sample).populations``), or
        corrected / expert labels.
    unassigned : sequence of str
        Populations of cells no leaf gate claims. A gate with children is fitted without them
        (neither inside nor outside: such cells may lie in a parent gate, below no leaf).
    known : sequence of str, optional
        Every population the model can predict (default: those in ``populations``). A leaf
        gate named like none of them holds cells the model never names: it is kept as drawn,
        and so is a parent whose fit to the populations below it would leave out its events
        (:data:`KEEP_UNNAMED`).
    template_sample, template_labels : Sample and its labels (n_events,), optional
        The patient the template was drawn on. With them, whether the populations below a
        parent hold the events of its unnamed gates is read where the gates were drawn (an
        instrument drift on this patient cannot hide it); without them, on this patient.
    **polygon_options
        Passed to :func:`fit_polygon` (bins, smoothing, core, max_vertices, min_events).

    Returns
    -------
    AutoGateFit

    Raises GateError when the sample lacks a channel the template needs.
    """
    populations = np.asarray(populations).astype(str)
    if populations.shape != (sample.n_events,):
        raise GateError(f"{sample.name}: {populations.shape[0]} populations for {sample.n_events} events")
    missing = template.check_channels(sample)
    if missing:
        raise GateError(f"{sample.name} lacks {', '.join(missing)}, which the template gates use")
    present = np.unique(populations)
    known = {str(p) for p in (known if known is not None else present)} | set(present.tolist())
    wanted = gate_populations(template, present)
    unnamed = [g.name for g in template.leaves() if g.name not in known]
    template_masks = template.memberships(sample) if unnamed else {}
    drawn_on = None
    if unnamed and template_sample is not None and template_labels is not None:
        drawn_on = (template.memberships(template_sample), np.asarray(template_labels).astype(str),
                    gate_populations(template, known))
    min_events = int(polygon_options.get("min_events", 10))
    tree = GateTree()
    masks: dict[str, np.ndarray] = {}
    targets: dict[str, np.ndarray] = {}
    fitted, unfitted = [], {}
    for gate in template.gates:  # parents precede children
        parent_mask = masks[gate.parent] if gate.parent is not None else np.ones(sample.n_events, dtype=bool)
        target = np.isin(populations, sorted(wanted[gate.name])) if wanted[gate.name] else None
        new_gate = gate
        if target is not None:
            targets[gate.name] = target
        below = set(template.descendants(gate.name))
        unnamed_below = [n for n in unnamed if n in below]
        # Only 2-D shapes are fitted; a quadrant split, a range or a boolean gate keeps the
        # template's definition (its cells still follow this patient's events).
        if gate.is_shape and gate.name in unnamed:
            unfitted[gate.name] = "no population of the model has this name, so no cell is predicted in it"
        elif gate.is_shape and target is None:
            unfitted[gate.name] = "no gate below it names a population of the model"
        elif gate.is_shape:
            points = gate.display_points(sample)
            voters = parent_mask.copy()
            if template.children(gate.name):
                voters &= ~np.isin(populations, list(unassigned))
            fit = fit_polygon(points[voters], target[voters], **polygon_options)
            candidate = None
            if fit.vertices is None:
                unfitted[gate.name] = (f"{fit.n_predicted:,} of its predicted cells lie in "
                                       f"{gate.parent or 'all events'}, too few to fit (at least {min_events})"
                                       if fit.n_predicted < min_events
                                       else "its predicted cells form no region denser than the other cells")
            else:
                try:
                    candidate = polygon_gate(gate.name, gate.x_channel, gate.y_channel, fit.vertices.tolist(),
                                             gate.x_scale, gate.y_scale, gate.parent)
                except GateError as exc:
                    unfitted[gate.name] = f"the fitted outline is no gate ({exc})"
            if candidate is not None and unnamed_below:
                why = _unnamed_cut(gate, candidate, points, parent_mask, unnamed_below, template_masks, drawn_on,
                                   min_events, unassigned)
                if why:
                    unfitted[gate.name], candidate = why, None
            if candidate is not None:
                new_gate = candidate
                fitted.append(gate.name)
        new_gate = Gate.from_dict(new_gate.to_dict())  # never share a template's objects
        tree.add(new_gate)
        masks[gate.name] = gate_membership(new_gate, sample, masks)
    return AutoGateFit(tree, fitted, masks, targets, unfitted)


def _unnamed_cut(gate, candidate, points, parent_mask, unnamed_below, template_masks, drawn_on,
                 min_events, unassigned) -> str | None:
    """Why ``candidate`` (fitted to the populations below ``gate``) must not replace it, or None:
    the gates below it that name no population hold events those populations do not. Unassigned
    events do not count against the fit: they do not vote in it (a "CD4- CD8-" quadrant of
    "other" T cells stays inside a T cells gate fitted to CD4 and CD8 T cells)."""
    what = (f"{', '.join(unnamed_below)} below it {'names' if len(unnamed_below) == 1 else 'name'} "
            f"no population of the model")
    its = "its" if len(unnamed_below) == 1 else "their"
    if drawn_on is not None:
        masks, labels, wanted = drawn_on
        drawn = np.logical_or.reduce([masks[n] for n in unnamed_below])
        covered = int((drawn & np.isin(labels, sorted(wanted[gate.name]) + list(unassigned))).sum())
        n_drawn = int(drawn.sum())
        if n_drawn >= min_events and covered < KEEP_UNNAMED * n_drawn:
            return (f"{what}: where the gates were drawn, {covered:,} of {n_drawn:,} of {its} events are of the "
                    f"populations the gate would be fitted to (or of none)")
        return None
    drawn = np.logical_or.reduce([template_masks[n] for n in unnamed_below]) & parent_mask
    kept, n_drawn = int((drawn & candidate.contains_points(points)).sum()), int(drawn.sum())
    if n_drawn < min_events:
        return (f"{what}, and {its} gates as drawn hold {n_drawn:,} events here: too few to tell whether a fit "
                f"to the other populations keeps them")
    if kept < KEEP_UNNAMED * n_drawn:
        return f"{what}, and a gate fitted to the other populations would keep {kept:,} of {n_drawn:,} of {its} events"
    return None


def tree_from_labels(sample, labels, hierarchy, scales) -> GateTree:
    """A gate tree drawn from expert labels: each gate of ``hierarchy`` fitted to the labeled
    cells on its parent's plot (the same fit as an auto-gate). For data sets whose experts left
    labels but no gates (the bundled sample data, the multicenter data).

    Parameters
    ----------
    hierarchy : list of (name, x_channel, y_channel, parent)
        Parents before children; leaf names are population names.
    scales : dict of channel -> AxisScale
    """
    skeleton = GateTree()
    for name, x_channel, y_channel, parent in hierarchy:
        skeleton.add(rectangle_gate(name, x_channel, y_channel, (0, 1), (0, 1), scales[x_channel],
                                    scales[y_channel], parent))
    return fit_gate_tree(skeleton, sample, labels).tree


# --------------------------------------------------------------------------------------------
# The cells after a gate is adjusted, and the cells each gate counts


def unassigned_name(populations) -> str:
    """The name a lab gives cells of no population: ``ungated`` when its populations use that
    name and not ``other``, else ``other``."""
    names = {str(p) for p in populations}
    return "ungated" if "ungated" in names and OTHER not in names else OTHER


def relabel_after_edit(before: GateTree, after: GateTree, sample, populations, unassigned: str = OTHER,
                       before_masks=None, after_masks=None):
    """The populations of a reviewed patient after its gates changed from ``before`` to ``after``.

    The populations come from the model (or an earlier review), cell by cell; the gates are a
    view of them. Moving a gate is a statement about the cells it gains or loses, so only cells
    whose membership of some gate differs between the two trees are relabeled:

    * a cell that entered a leaf gate takes its name;
    * a cell still in the leaf gate its population names keeps it;
    * a cell that left the leaf gate its population names, or now lies inside a gate whose
      geometry changed, takes the first leaf gate holding it, else ``unassigned``;
    * any other cell (its population is no gate of the tree, and no adjusted gate now holds
      it) keeps its population.

    Every other cell keeps its population, so populations the tree has no gate for keep the
    model's labels.

    Returns
    -------
    labels : object ndarray (n_events,)
    changed : bool ndarray (n_events,)
        The cells whose membership of some gate changed (the only ones that may be relabeled).
    """
    labels = np.asarray(populations).astype(object).copy()
    if labels.shape != (sample.n_events,):
        raise GateError(f"{sample.name}: {labels.shape[0]} populations for {sample.n_events} events")
    old = before_masks if before_masks is not None else before.memberships(sample)
    new = after_masks if after_masks is not None else after.memberships(sample)
    none = np.zeros(sample.n_events, dtype=bool)
    changed = none.copy()
    for name in set(old) | set(new):
        changed |= old.get(name, none) != new.get(name, none)
    if not changed.any():
        return labels, changed
    text = labels.astype(str)
    leaves = [g.name for g in after.leaves()]
    adjusted = [g.name for g in after.gates if g.name not in before or before[g.name].to_dict() != g.to_dict()]
    in_adjusted = np.logical_or.reduce([new[n] for n in adjusted]) if adjusted else none
    decided = np.zeros(sample.n_events, dtype=bool)
    for leaf in leaves:  # entered a leaf
        take = changed & ~decided & new[leaf] & ~old.get(leaf, none)
        labels[take] = leaf
        decided |= take
    for leaf in leaves:  # still in the leaf its population names
        decided |= changed & new[leaf] & (text == leaf)
    moved = changed & ~decided & (np.isin(text, leaves) | in_adjusted)
    labels[moved] = unassigned
    for leaf in reversed(leaves):  # the first leaf holding the cell wins, as in GateTree.labels
        labels[moved & new[leaf]] = leaf
    return labels, changed


def counted_cells(tree: GateTree, populations, memberships, known=()) -> dict[str, np.ndarray]:
    """The cells each gate of ``tree`` counts, from the per-cell populations: gate name -> bool
    mask (n_events,).

    The populations are the one source of counts (what a gated CSV holds), so a gate named like
    a population counts exactly the cells of that population, and each gate counts every cell
    counted below it. A gate that names no population also counts the cells inside it whose
    population names no gate (``other``, or a population the tree has no gate for: a "T cells"
    gate holds the CD4- CD8- T cells no leaf claims), and those inside it that also lie in the
    gate named by their population (a "CD19 bright" range beside a "B cells" gate holds the B
    cells in both); a cell its gate does not hold stays out (a cell the model calls a monocyte
    inside the lymphocyte gate is a monocyte, not a lymphocyte).

    known : population names beside those in ``populations`` (a model's), whose gates count
        only their own cells even where no cell carries that name.
    """
    labels = np.asarray(populations).astype(str)
    named = set(np.unique(labels).tolist()) | {str(p) for p in known}
    unplaced = ~np.isin(labels, tree.names)
    agree = unplaced.copy()  # cells the gate named by their population holds
    for name in tree.names:
        own = labels == name
        agree[own] = np.asarray(memberships[name], dtype=bool)[own]
    out: dict[str, np.ndarray] = {}
    for gate in reversed(tree.gates):  # children before their parents
        if gate.references:
            continue  # computed from other gates' cells: below, once those are known
        cells = labels == gate.name
        for child in tree.children(gate.name):
            if not child.references:
                cells |= out[child.name]
        if gate.name not in named:
            cells |= agree & np.asarray(memberships[gate.name], dtype=bool)
        out[gate.name] = cells
    for gate in tree.gates:  # operands precede the boolean gates that use them
        if not gate.references:
            continue
        cells = labels == gate.name
        if gate.name not in named:
            inside = gate.combine(out)
            if gate.parent is not None:
                inside = inside & out[gate.parent]
            cells = cells | inside
        for child in tree.children(gate.name):
            cells = cells | out[child.name]
        out[gate.name] = cells
    for gate in tree.gates:  # a boolean gate's cells count in its parents too
        if gate.references and gate.parent is not None:
            parent = gate.parent
            while parent is not None:
                out[parent] = out[parent] | out[gate.name]
                parent = tree[parent].parent
    return {g.name: out[g.name] for g in tree.gates}


# --------------------------------------------------------------------------------------------
# Agreement and statistics


def agreement(tree: GateTree, sample, populations, memberships=None, unassigned=UNASSIGNED, counted=None):
    """How well the gates hold the cells predicted in them: DataFrame, one row per gate in
    depth-first order, with gate, parent, populations, count, % of parent, % of total, in gate
    (events inside the gate), predicted (cells predicted in the gate's populations), both
    (those also in the gate), precision, recall, F1 (NaN for a gate with no population). For a
    gate with children, cells predicted in an ``unassigned`` population are left out of
    predicted / both / precision / recall / F1, as they are left out of its fit.

    counted : dict gate name -> bool mask, optional
        The cells each gate counts (:func:`counted_cells`); count and the percentages come from
        them. Default: from the gates (count = in gate).
    """
    import pandas as pd

    populations = np.asarray(populations).astype(str)
    masks = memberships if memberships is not None else tree.memberships(sample)
    counts = counted if counted is not None else masks
    wanted = gate_populations(tree, np.unique(populations))
    total = sample.n_events
    rows = []
    for gate in tree.depth_first():
        inside = masks[gate.name]
        count = int(np.count_nonzero(counts[gate.name]))
        parent_count = total if gate.parent is None else int(np.count_nonzero(counts[gate.parent]))
        pops = sorted(wanted[gate.name])
        row = {"gate": gate.name, "parent": gate.parent or ALL_EVENTS, "populations": ", ".join(pops),
               "count": count, "% of parent": 100.0 * count / parent_count if parent_count else 0.0,
               "% of total": 100.0 * count / total if total else 0.0, "in gate": int(inside.sum())}
        if pops:
            target = np.isin(populations, pops)
            if tree.children(gate.name):
                kept = ~np.isin(populations, list(unassigned))
                inside, target = inside & kept, target & kept
            both = int((inside & target).sum())
            n_t, n_g = int(target.sum()), int(inside.sum())
            precision = both / n_g if n_g else float("nan")
            recall = both / n_t if n_t else float("nan")
            f1 = 2 * both / (n_t + n_g) if (n_t + n_g) else float("nan")
            row.update(predicted=n_t, both=both, precision=precision, recall=recall, F1=f1)
        else:
            row.update(predicted=0, both=0, precision=float("nan"), recall=float("nan"), F1=float("nan"))
        rows.append(row)
    return pd.DataFrame(rows, columns=["gate", "parent", "populations", "count", "% of parent", "% of total",
                                       "in gate", "predicted", "both", "precision", "recall", "F1"])


def flat_statistics(populations):
    """A flat result presented as a one-level tree: DataFrame (population, parent = "(all
    events)", count, % of parent, % of total), one row per population, largest first. With no
    gate tree, % of parent is % of total: there is no intermediate gate to be a parent."""
    import pandas as pd

    populations = np.asarray(populations).astype(str)
    names, counts = np.unique(populations, return_counts=True)
    order = sorted(range(len(names)), key=lambda i: (names[i] == OTHER, -counts[i], names[i]))
    total = max(int(populations.size), 1)
    rows = [{"population": str(names[i]), "parent": ALL_EVENTS, "count": int(counts[i]),
             "% of parent": 100.0 * counts[i] / total, "% of total": 100.0 * counts[i] / total} for i in order]
    return pd.DataFrame(rows, columns=["population", "parent", "count", "% of parent", "% of total"])


# --------------------------------------------------------------------------------------------
# Hierarchies for data that carry labels but no gates

#: The bundled sample data (flow, ``sample_data/``): a hierarchy a flow lab would draw.
SAMPLE_DATA_HIERARCHY = [
    ("Debris", "FSC-A", "SSC-A", None),
    ("Granulocytes", "FSC-A", "SSC-A", None),
    ("Monocytes", "FL5-A", "SSC-A", None),            # CD14 / SSC
    ("Lymphocytes", "FSC-A", "SSC-A", None),
    ("T cells", "FL1-A", "FL2-A", "Lymphocytes"),      # CD3 / CD56
    ("CD4 T cells", "FL3-A", "FL6-A", "T cells"),      # CD4 / CD8
    ("CD8 T cells", "FL3-A", "FL6-A", "T cells"),
    ("B cells", "FL1-A", "FL4-A", "Lymphocytes"),      # CD3 / CD19
    ("NK cells", "FL1-A", "FL2-A", "Lymphocytes"),     # CD3 / CD56
]

#: The multicenter mass cytometry data (``../shared/data/multicenter``).
MULTICENTER_HIERARCHY = [
    ("Monocytes", "CD14", "CD45", None),
    ("B cells", "CD3", "CD20", None),
    ("T cells", "CD3", "CD20", None),
    ("CD4 T cells", "CD4", "CD8", "T cells"),
    ("CD8 T cells", "CD4", "CD8", "T cells"),
]
