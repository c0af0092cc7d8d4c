"""The Auto-gate page's gates: an auto-gated patient's result in the training patients' gate
tree, fitted, drawn (every gate kind), counted from the reviewed cells and adjusted by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from gating_core.gates import Band, GateError, GateTree, Region, Split
from gating_core.gates.agreement import agreement
from gating_core.gates.autogates import counted_cells, fit_gate_tree
from ui import cache, charts
from ui.app_state import autogate_templates, shape_from_selection
from ui.common import channel_label, density_bins, plot_bins, plot_range

ALL = "all events"
#: Bins a side of the gate plots, at most (smaller panels than the Gate page's).
GATE_PLOT_BINS = 150


def templates_for(store, patient: str) -> tuple[dict, list[str]]:
    """(patient -> gate tree of the labeled patients but ``patient``, the template patients in
    the order offered: the training patients of the model that gated ``patient`` first)."""
    trees = {n: store.patients[n].gate_tree for n in store.labeled() if n != patient}
    trained_on = getattr(store.gating_model(patient), "training_patients_", None) or ()
    return trees, autogate_templates(trees, store.gating_populations(patient), trained_on)


def fit_from_template(store, patient: str, template: str) -> None:
    """Fit ``template``'s gate tree to the patient's reviewed cells (the model's gating, or its
    corrections) and keep it with its result; gates that cannot be fitted keep the template's
    geometry, with the reason. The populations a gate can name are those of the model that
    gated the patient, whichever model is current."""
    record, drawn = store.patients[patient], store.patients[template]
    populations = store.gating_populations(patient)
    # the template patient's events are read only when a gate of its tree names no population
    evidence = drawn.is_labeled and any(g.name not in set(populations) for g in drawn.gate_tree.leaves())
    fitted = fit_gate_tree(drawn.gate_tree, record.sample, record.populations, known=populations,
                           template_sample=drawn.sample if evidence else None,
                           template_labels=drawn.labels if evidence else None)
    store.set_autogates(patient, fitted.tree, template, unfitted=fitted.unfitted)


def before_correction(record) -> None:
    """Gates adjusted by hand stay as the reviewer left them when cells are corrected: marked so
    that the page says they were drawn before the correction (kept with the result)."""
    if record.autogates is not None and record.autogates.get("edited"):
        record.autogates["before correction"] = True


def after_correction(store, patient: str) -> str:
    """Gates fitted from a template (not adjusted by hand) are fitted again to the corrected
    cells, so that they enclose the populations every export counts. Returns a sentence for the
    page's message ('' when the patient has no gates)."""
    record = store.patients[patient]
    gates = record.autogates
    if gates is None:
        return ""
    if gates.get("edited"):
        return (" The gates adjusted by hand are kept as they were: fit them again (Gates) to follow the "
                "corrections.")
    template = gates["template"]
    if template not in store.patients or not store.patients[template].gate_tree.gates:
        return f" The gates of {template} cannot be fitted again: that patient or its gates are gone."
    try:
        fit_from_template(store, patient, template)
    except Exception as exc:  # the correction is kept whatever befalls the gates: say it, go on
        return f" The gates of {template} could not be fitted to the corrected cells ({exc})."
    forget_typed_values(patient)
    return f" The gates of {template} were fitted again to the corrected cells."


def refined_review(gating_model, sample, circled: dict, pop_names, part, max_moved_share):
    """The populations and confidences of a patient refined from every cell ``circled`` so far
    ({event index: population}), and the refinement's ``held_back`` populations. Cells given a
    population the model does not know keep it, with confidence 1; the model refits to the
    others. Also the cells held back (their event indices). ValueError when the refinement
    cannot be made."""
    from gating_core.method.refinement import refine_gating

    known = {i: p for i, p in circled.items() if p in pop_names}
    refined = refine_gating(gating_model, sample, list(known), list(known.values()),
                            part=part if part in gating_model.gating_parts() else None,
                            max_moved_share=max_moved_share)
    populations = np.asarray(refined.populations).astype(object)
    confidence = np.asarray(refined.confidence, dtype=float).copy()
    named = np.array([i for i, p in circled.items() if p not in pop_names], dtype=np.int64)
    if len(named):
        populations[named] = [circled[int(i)] for i in named]
        confidence[named] = 1.0
    return populations, confidence, refined.held_back, refined.held_back_cells


def held_back_message(held_back: dict) -> str:
    """What the page says when the refinement would have emptied populations
    (:attr:`RefinedGating.held_back`: population -> cells kept in it)."""
    from gating_core.method.refinement import MAX_MOVED_SHARE

    kept = " and ".join(f"{count:,} {name}" for name, count in sorted(held_back.items()))
    return (f"Not moved: {kept} that the refinement would have taken along with your correction "
            f"(more than {MAX_MOVED_SHARE:.0%} of those you did not circle). A correction does not "
            "empty a population unless you say so: look at where they lie, then move them below, or "
            "circle them.")


def tree_label(tree: GateTree, name: str) -> str:
    return "\u2003" * tree.depth(name) + ("└ " if tree.depth(name) else "") + name


def gate_table(tree: GateTree, sample, result_populations, masks, counted):
    """The gates, depth-first: count and percentages from the reviewed cells, events inside the
    gate, and F1 of the gate against the cells the model predicted in it."""
    table = agreement(tree, sample, result_populations, masks, counted=counted)
    table["gate"] = [tree_label(tree, g) for g in table["gate"]]
    table["F1"] = pd.to_numeric(table["F1"], errors="coerce")  # None where no population is predicted
    return table[["gate", "parent", "count", "% of parent", "% of total", "in gate", "F1"]]


def _plot_groups(tree: GateTree) -> dict:
    """(parent, x channel, y channel or None) -> its gates, depth-first; gates without axes
    (boolean) have no plot."""
    groups: dict = {}
    for gate in tree.depth_first():
        if gate.channels:
            groups.setdefault((gate.parent, gate.x_channel, gate.y_channel), []).append(gate)
    return groups


class GateFigures:
    """Plots of one patient's gates: each on its parent's events, as the reviewer adjusts them."""

    def __init__(self, record, tree: GateTree, masks: dict, counted: dict, store=None):
        self.record, self.tree, self.masks, self.counted = record, tree, masks, counted
        self.sample = record.sample
        self.tree_json = tree.to_json()
        self.store = store  # its axis ranges set by hand, when given

    def _range(self, channel, scale: dict) -> tuple:
        pnn = self.sample.pnn[self.sample.channel_index(channel)]
        if self.store is not None:
            return plot_range(self.store, (self.record.token,), pnn, scale, [self.sample])
        return cache.shared_range((self.record.token,), pnn, scale, [self.sample])

    def _bins(self, channel, scale: dict, value_range, n_events: int) -> tuple:
        # fewer for a small parent population, so that it reads as clusters
        return plot_bins((self.record.token,), channel, scale, [self.sample], value_range,
                         bins=min(GATE_PLOT_BINS, density_bins([n_events])))

    def _parent_mask(self, parent):
        return self.masks[parent] if parent is not None else None

    def figure(self, parent, gates, title, selectable=False, height=360):
        first = gates[0]
        if first.y_channel is None:
            return self._histogram(parent, gates, title, height)
        record, sample = self.record, self.sample
        xs_d, ys_d = first.x_scale.to_dict(), first.y_scale.to_dict()
        xr, yr = self._range(first.x_channel, xs_d), self._range(first.y_channel, ys_d)
        pmask = self._parent_mask(parent)
        n_parent = sample.n_events if pmask is None else int(np.count_nonzero(pmask))
        (x_bin_range, n_x), (y_bin_range, n_y) = (self._bins(first.x_channel, xs_d, xr, n_parent),
                                                  self._bins(first.y_channel, ys_d, yr, n_parent))
        grid = cache.density(record.token, f"{self.tree_json}|{parent}" if pmask is not None else "",
                             first.x_channel, first.y_channel, xs_d, ys_d, x_bin_range, y_bin_range, (n_x, n_y), sample,
                             _mask=pmask)
        dots_idx = cache.dots(record.token, sample.n_events)
        if pmask is not None:
            dots_idx = dots_idx[pmask[dots_idx]]
        fig = charts.scatter_panels(
            [{"title": title, "grid": grid,
              "x": cache.display_values(record.token, first.x_channel, xs_d, sample)[dots_idx],
              "y": cache.display_values(record.token, first.y_channel, ys_d, sample)[dots_idx]}],
            first.x_scale, first.y_scale, xr, yr, channel_label(sample, first.x_channel),
            channel_label(sample, first.y_channel), mode="density", height=height, selectable=selectable)
        return charts.add_gates(fig, gates, xr, yr, first.x_scale, first.y_scale)

    def _histogram(self, parent, gates, title, height):
        record, sample = self.record, self.sample
        first = gates[0]
        xs_d = first.x_scale.to_dict()
        xr = self._range(first.x_channel, xs_d)
        values = cache.display_values(record.token, first.x_channel, xs_d, sample)
        pmask = self._parent_mask(parent)
        fig = charts.range_histogram(values if pmask is None else values[pmask], xr, first.x_scale,
                                     channel_label(sample, first.x_channel),
                                     lattice=cache.lattice((record.token,), first.x_channel, xs_d, [sample]),
                                     ranges=charts.gate_ranges(gates, first.x_scale), height=height)
        fig.update_layout(title=dict(text=title, font=dict(size=13)), margin=dict(l=50, r=10, t=40, b=40))
        return fig

    def draw_all(self, key_prefix: str) -> None:
        """One plot per parent and pair of axes (a histogram for range gates), depth-first."""
        groups = _plot_groups(self.tree)
        # at most three a row; one plot alone takes half the width, not a third
        columns = st.columns(min(3, max(2, len(groups))))
        for i, ((parent, _, _), gates) in enumerate(groups.items()):
            title = f"{parent or ALL} → " + ", ".join(g.name for g in gates)
            with columns[i % 3]:
                st.plotly_chart(self.figure(parent, gates, title), width="stretch", key=f"{key_prefix}_{i}")


def adjustable_gates(tree: GateTree) -> list[str]:
    """Gates a reviewer can adjust on this page, depth-first: polygons and rectangles (vertices
    or a redrawn shape), quadrants (the split point, which moves the four together) and ranges:
    the gates whose drawing has an editor here."""
    return [g.name for g in tree.depth_first() if type(g.drawing()) in _EDITORS]


def commit_edit(store, patient: str, record, trial: GateTree, which: str, message: str) -> None:
    """Keep the adjusted tree; only the cells whose gate membership changed are relabeled."""
    before = np.asarray(record.populations).astype(str)
    store.set_autogates(patient, trial, record.autogates["template"], edited=True, adjusted=which)
    relabeled = int((np.asarray(record.populations).astype(str) != before).sum())
    st.session_state["ag_gate_message"] = f"{message}; {relabeled:,} cells relabeled."
    st.session_state.ag_chart_version += 1
    st.rerun()


def adjust_section(store, patient: str, record, tree: GateTree, figures: GateFigures) -> None:
    """Choose a gate and adjust it: a polygon or rectangle by a redrawn selection or a vertex, a
    quadrant by its split point, a range by its bounds (display coordinates of its plot)."""
    state = st.session_state
    sample, masks = record.sample, figures.masks
    names = adjustable_gates(tree)
    if not names:
        st.caption("Every gate of this tree is a boolean gate: nothing to adjust.")
        return
    st.markdown("**Adjust a gate**: redraw a polygon or rectangle with the lasso or box on its parent's plot, "
                "or type a vertex, a quadrant's split point or a range's bounds.")
    last = record.autogates.get("adjusted")
    which = st.selectbox("Gate to adjust", names, key=f"ag_edit_gate_{patient}",
                         index=names.index(last) if last in names else 0,
                         format_func=lambda n: tree_label(tree, n) + ("" if tree[n].is_shape else f" ({tree[n].kind})"))
    gate = tree[which]
    in_gate = int(masks[which].sum())
    parent_n = int(masks[gate.parent].sum()) if gate.parent else sample.n_events
    e1, e2 = st.columns([3, 2])
    with e1:
        group = [tree[n] for n in tree.sharing_geometry(which)]  # a quadrant with its whole split
        figure = figures.figure(gate.parent, group, f"{patient} · {gate.parent or ALL} · {which}",
                                selectable=gate.is_shape, height=480)
        drawing = gate.drawing()
        if isinstance(drawing, Region):
            charts.add_vertex_numbers(figure, drawing.corners, state.get(f"ag_vertex_{patient}_{which}", 1))
        edit_event = st.plotly_chart(
            figure, width="stretch", on_select="rerun" if gate.is_shape else "ignore",
            selection_mode=("lasso", "box"), key=f"ag_edit_chart_{state.ag_chart_version}_{patient}_{which}")
    with e2:
        st.markdown(f"**{which}**: {in_gate:,} events ({100 * in_gate / max(parent_n, 1):.1f}% of "
                    f"{gate.parent or ALL})")
        _EDITORS[type(gate.drawing())](store, patient, record, tree, which, in_gate, edit_event)


#: The typed coordinates of a gate are the channel's values, as the plot's axis ticks read them.
RAW_HELP = "In the channel's values, as the plot's axis reads them (not its arcsinh or logicle coordinates)."


def _raw(scale, display_value: float) -> float:
    """A display coordinate of ``scale`` as the channel's value, rounded to 6 significant digits
    (what the box shows): typed back unchanged, it names the same place on the axis."""
    return float(f"{float(scale.inverse(np.array([display_value]))[0]):.6g}")


def _display(scale, raw_value: float) -> float:
    return float(scale.forward(np.array([raw_value], dtype=np.float64))[0])


def _adjust_shape(store, patient, record, tree, which, in_gate, edit_event) -> None:
    """A region: replaced by the selection drawn on its plot, or one corner moved (it becomes a polygon)."""
    sample, gate = record.sample, tree[which]
    redrawn = shape_from_selection(getattr(edit_event, "selection", None) if edit_event is not None else None)
    if redrawn is not None:
        try:
            trial = tree.copy()
            trial.replace_geometry(which, redrawn["vertices"], redrawn["kind"])
            n_new = int(trial.memberships(sample)[which].sum())
            if st.button(f"Replace {which} with the selection ({n_new:,} events)", key="ag_redraw"):
                commit_edit(store, patient, record, trial, which, f"Redrew {which}: {in_gate:,} → {n_new:,} events")
        except GateError as exc:
            st.caption(f"The selection cannot be a gate ({exc}).")
    corners = [(float(x), float(y)) for x, y in gate.drawing().corners]
    vertex = st.selectbox("Vertex", list(range(1, len(corners) + 1)), key=f"ag_vertex_{patient}_{which}",
                          help="Numbered on the plot (the chosen one larger).")
    vx, vy = _raw(gate.x_scale, corners[vertex - 1][0]), _raw(gate.y_scale, corners[vertex - 1][1])
    v1, v2 = st.columns(2)
    new_x = v1.number_input(gate.x_channel, value=vx, format="%g", key=f"ag_vx_{patient}_{which}_{vertex}",
                            help=RAW_HELP)
    new_y = v2.number_input(gate.y_channel, value=vy, format="%g", key=f"ag_vy_{patient}_{which}_{vertex}",
                            help=RAW_HELP)
    if st.button("Move the vertex", key="ag_move_vertex", disabled=(new_x, new_y) == (vx, vy)):
        moved = list(corners)
        moved[vertex - 1] = (_display(gate.x_scale, new_x), _display(gate.y_scale, new_y))
        trial = tree.copy()
        try:
            trial.replace_geometry(which, moved, "polygon")
            n_new = int(trial.memberships(sample)[which].sum())
        except GateError as exc:
            st.error(str(exc))
            return
        commit_edit(store, patient, record, trial, which, f"Moved a vertex of {which}: {in_gate:,} → {n_new:,} events")


def _adjust_quadrant(store, patient, record, tree, which, in_gate, edit_event=None) -> None:
    """A quadrant split: its point, which moves the four quadrants together."""
    sample, gate = record.sample, tree[which]
    members = tree.sharing_geometry(which)
    cx, cy = (_raw(scale, v) for scale, v in zip((gate.x_scale, gate.y_scale), gate.drawing().point))
    q1, q2 = st.columns(2)
    new_x = q1.number_input(f"split {gate.x_channel}", value=cx, format="%g", key=f"ag_qx_{patient}_{which}",
                            help=RAW_HELP)
    new_y = q2.number_input(f"split {gate.y_channel}", value=cy, format="%g", key=f"ag_qy_{patient}_{which}",
                            help=RAW_HELP)
    st.caption(f"Moving the split moves its four quadrants: {', '.join(members)}.")
    if st.button("Move the split", key="ag_move_split", disabled=(new_x, new_y) == (cx, cy)):
        trial = tree.copy()
        try:
            trial.replace_geometry(which, [(_display(gate.x_scale, new_x), _display(gate.y_scale, new_y))])
            n_new = int(trial.memberships(sample)[which].sum())
        except GateError as exc:
            st.error(str(exc))
            return
        commit_edit(store, patient, record, trial, which, f"Moved the split of {which}: {in_gate:,} → {n_new:,} events")


def _adjust_range(store, patient, record, tree, which, in_gate, edit_event=None) -> None:
    """A range: its bounds."""
    sample, gate = record.sample, tree[which]
    band = gate.drawing()
    low, high = _raw(gate.x_scale, band.low), _raw(gate.x_scale, band.high)
    r1, r2 = st.columns(2)
    new_low = r1.number_input(f"{gate.x_channel} from", value=low, format="%g", key=f"ag_rlo_{patient}_{which}",
                              help=RAW_HELP)
    new_high = r2.number_input("to", value=high, format="%g", key=f"ag_rhi_{patient}_{which}", help=RAW_HELP)
    if st.button("Set the range", key="ag_set_range", disabled=(new_low, new_high) == (low, high)):
        trial = tree.copy()
        try:
            trial.replace_geometry(which, [(_display(gate.x_scale, new_low), _display(gate.x_scale, new_high))])
            n_new = int(trial.memberships(sample)[which].sum())
        except GateError as exc:
            st.error(str(exc))
            return
        commit_edit(store, patient, record, trial, which, f"Set the range of {which}: {in_gate:,} → {n_new:,} events")


#: The editor of each drawing a gate type makes; a gate without a drawing (boolean) has none.
_EDITORS = {Region: _adjust_shape, Split: _adjust_quadrant, Band: _adjust_range}


def forget_typed_values(patient: str) -> None:
    """Numbers typed for the old gates mean nothing for gates fitted again."""
    state = st.session_state
    for key in [k for k in state if isinstance(k, str) and k.startswith(
            tuple(f"ag_{p}_{patient}_" for p in ("vx", "vy", "qx", "qy", "rlo", "rhi", "vertex")))]:
        del state[key]


def gates_section(store, patient: str, record) -> GateTree | None:
    """The result as gates: fitted from a template, drawn, counted, adjusted. Returns the
    patient's gate tree, or None when no labeled patient carries a tree to fit."""
    state = st.session_state
    sample, result = record.sample, record.load_result()
    trees, templates = templates_for(store, patient)
    if record.autogates is None and templates:
        try:
            fit_from_template(store, patient, templates[0])
        except GateError as exc:
            st.warning(f"The gates of {templates[0]} cannot be fitted to {patient}: {exc}")
    if record.autogates is None:
        return None
    tree = GateTree.from_dict(record.autogates["tree"])
    masks = cache.memberships(record.token, tree.to_json(), sample)
    counted = counted_cells(tree, record.populations, masks, store.gating_populations(patient))
    g1, g2 = st.columns([3, 2])
    g1.caption(f"Gates of **{record.autogates['template']}** fitted to {patient}'s "
               + ("reviewed cells" if record.is_reviewed else "predicted cells")
               + (", then adjusted by hand: the cells whose gate membership changed follow the gates."
                  if record.autogates.get("edited") else ".")
               + " Counts are of the reviewed cells (what every export holds); *in gate*: events inside the "
                 "gate; F1: agreement of each gate with the cells predicted in it.")
    with g2.popover("Fit again from a template"):
        choices = templates or [record.autogates["template"]]
        template_choice = st.selectbox("Template patient", choices, key=f"ag_template_{patient}",
                                       help="The model's training patients come first: the gates a lab drew.")
        if st.button("Fit the gates again", key=f"ag_refit_{patient}", disabled=template_choice not in trees):
            try:
                fit_from_template(store, patient, template_choice)
            except GateError as exc:
                st.error(f"The gates of {template_choice} cannot be fitted to {patient}: {exc}")
            else:
                forget_typed_values(patient)
                corrected = record.corrected_count()
                state["ag_gate_message"] = (f"Fitted the gates of {template_choice} to {patient} again"
                                            + (f", around its reviewed cells: the {corrected:,} cells corrected by "
                                               "hand keep their corrections (run auto-gating again to drop them)."
                                               if corrected else "."))
                state.ag_chart_version += 1
                st.rerun()
    if record.autogates.get("before correction"):
        st.warning("These gates were adjusted by hand before cells were corrected: they may no longer enclose "
                   "the corrected populations (compare *count* and *in gate* below). Fit them again from a "
                   "template to follow the corrections, or adjust them.", icon=":material/warning:")
    unfitted = record.autogates.get("unfitted") or {}
    if unfitted:
        st.warning("Kept as drawn on " + record.autogates["template"] + " (not fitted to this patient): "
                   + "; ".join(f"**{name}**: {why}" for name, why in unfitted.items())
                   + ". Check them on the plots and adjust them below.", icon=":material/warning:")
    fixed = [g.name for g in tree.depth_first() if not g.is_shape]
    if fixed:
        st.caption(f"Quadrant, range and boolean gates keep the template's definition ({', '.join(fixed)}); "
                   "quadrants and ranges can be adjusted below.")
    # F1 against the model's predictions; a result read back from the library after a review
    # holds the reviewed cells only, and the column says so.
    reviewed_only = record.reviewed_earlier
    table = gate_table(tree, sample, result.populations, masks, counted)
    # A gate no population is predicted in (a quadrant or range kept as drawn) has no F1: shown
    # as a dash; the grid would show a missing number as the word "None".
    table["F1"] = [f"{v:.3f}" if np.isfinite(v) else "—" for v in table["F1"]]
    st.dataframe(table, hide_index=True, width="stretch",
                 key=f"ag_gate_table_{state.ag_chart_version}",
                 column_config={"% of parent": st.column_config.NumberColumn(format="%.2f"),
                                "% of total": st.column_config.NumberColumn(format="%.2f"),
                                "F1": st.column_config.TextColumn(
                                    "F1 vs reviewed cells" if reviewed_only else "F1 vs predicted"),
                                "count": st.column_config.NumberColumn(format="localized"),
                                "in gate": st.column_config.NumberColumn(format="localized")})
    if state.get("ag_gate_message"):
        st.success(state.pop("ag_gate_message"))
    figures = GateFigures(record, tree, masks, counted, store)
    figures.draw_all(f"ag_tree_{state.ag_chart_version}_{patient}")
    adjust_section(store, patient, record, tree, figures)
    return tree
