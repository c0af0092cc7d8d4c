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

Each polygon is fitted by :func:`~gating_core.gates.polygon_fit.fit_polygon` (smoothed 2-D
histograms of the predicted cells and the others on the parent's plot; the region where the
predicted cells are denser, its outline simplified to vertices a reviewer can drag).

How well the fitted gates hold the predicted cells is :func:`~gating_core.gates.agreement.agreement`.

After review the per-cell populations stay the one source of counts: :func:`relabel_after_edit`
relabels only the cells whose gate membership an adjusted gate changed, and
:func:`counted_cells` gives each gate the cells it counts from the populations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.gates import OTHER, Gate, GateError, GateTree, gate_membership, polygon_gate, rectangle_gate
from gating_core.gates.polygon_fit import fit_polygon

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
        elif gate.is_shape and target is None and not template.children(gate.name):
            unfitted[gate.name] = "no cell of this patient is predicted in its population"
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
