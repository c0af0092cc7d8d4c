"""Gate: a population tree of lasso / box, quadrant, range and boolean gates; back-gating."""

import numpy as np
import streamlit as st

from gating_core.gates import (AxisScale, Gate, GateError, GateTree, boolean_gate, quadrant_gates, quadrant_names,
                               range_gate, rectangle_gate)
from ui import cache, charts, gate_view
from ui.app_state import shape_from_selection
from ui.common import (axis_range_editor, channel_label, confirm_action, default_xy, density_bins, get_store,
                       label_versions, plot_bins, plot_range, require_patients, scale_select, show_label_change,
                       transform_editor)

ALL = gate_view.ALL
store = get_store()
st.title("Gate: label patients by hand")
st.caption("Label a patient by hand: choose a population in the tree (its parent's plot opens with its gate), "
           "or a parent population and two channels, then draw a **lasso** or **box** on the plot (toolbar, "
           "top right of the chart), split it into **quadrants**, cut a **range** on a histogram or combine "
           "populations with **AND / OR / NOT**. Gates nest: a gate drawn on a parent population only keeps "
           "the parent's cells. The leaf gates, plus `other` for every cell outside them, become the "
           "patient's training labels. After zooming or panning, pick the lasso or box in the toolbar again to "
           "draw; a double click on the plot shows it whole again.")
if not require_patients(store):
    st.stop()

state = st.session_state
state.setdefault("gate_chart_version", 0)

names = list(store.patients)
top = st.columns([2, 3, 3, 2])
patient = top[0].selectbox("Patient", names, key="gate_patient")
record = store.patients[patient]
sample = record.sample
tree: GateTree = record.gate_tree
tree_json = tree.to_json()
masks = cache.memberships(record.token, tree_json, sample) if len(tree) else {}
channels = sample.pnn
xi, yi = default_xy(channels)
# Choices a rename or delete made for the tree's pickers, applied before the pickers are drawn
# (a widget's value cannot change once it is on the page).
state.update(state.pop("gate_pickers_next", {}))
state.setdefault("g_x", channels[xi])  # seeded here, not by index=: the tree's focus sets them too
state.setdefault("g_y", channels[yi])


def _focus():
    """Choosing a population shows its parent's plot on its channels, with its gate."""
    state.update(gate_view.focus_population(tree, sample, state["gate_focus"]))


names_in_order = gate_view.ordered_names(tree)
focus = top[1].selectbox("Population tree", [ALL] + names_in_order, key="gate_focus", on_change=_focus,
                         format_func=lambda n: gate_view.tree_label(tree, n),
                         help="Choose a population: its parent's plot opens on its channels, its gate highlighted.")
parent = top[2].selectbox("Parent population", [ALL] + names_in_order, key="gate_parent",
                          format_func=lambda n: gate_view.tree_label(tree, n),
                          help="New gates are drawn inside this population.")
parent_mask = masks.get(parent) if parent != ALL else None
parent_count = int(parent_mask.sum()) if parent_mask is not None else sample.n_events
top[3].metric("Events in parent", f"{parent_count:,}",
              help=f"{100 * parent_count / max(sample.n_events, 1):.1f}% of {sample.n_events:,} events")

# A fragment: a change of gate type, channel or transform, and a box or lasso drawn on the plot,
# rerun this part alone: the back-gating plots and tables below are neither rebuilt nor sent to
# the browser again (each unchanged plot still costs the browser a redraw on a full rerun).
@st.fragment
def gating_section():
    tool = st.radio("Gate type", gate_view.TOOLS, horizontal=True, key="gate_tool",
                    help="Lasso / box: draw on the plot. Quadrant: one split point, four populations. Range: low / "
                         "high on a histogram of the X channel. Boolean: AND / OR / NOT of populations.")
    axes = st.columns(4)
    x_ch = axes[0].selectbox("X channel", channels, format_func=lambda c: channel_label(sample, c), key="g_x")
    y_ch = axes[1].selectbox("Y channel", channels, format_func=lambda c: channel_label(sample, c), key="g_y",
                             disabled=tool == "Range (histogram)")
    x_scale_d = scale_select(axes[2], "X transform", x_ch, "g_xs", store)
    y_scale_d = scale_select(axes[3], "Y transform", y_ch, "g_ys", store)
    x_kind, y_kind = x_scale_d["kind"], y_scale_d["kind"]

    tokens = (record.token,)
    x_scale, y_scale = AxisScale.from_dict(x_scale_d), AxisScale.from_dict(y_scale_d)
    x_range = plot_range(store, tokens, x_ch, x_scale_d, [sample])
    y_range = plot_range(store, tokens, y_ch, y_scale_d, [sample])
    mask_key = f"{tree_json}|{parent}" if parent_mask is not None else ""
    bins = density_bins([parent_count])  # the parent's events are what the density counts
    (x_bin_range, n_x), (y_bin_range, n_y) = (plot_bins(tokens, x_ch, x_scale_d, [sample], x_range, bins),
                                              plot_bins(tokens, y_ch, y_scale_d, [sample], y_range, bins))
    grid = cache.density(record.token, mask_key, x_ch, y_ch, x_scale_d, y_scale_d, x_bin_range, y_bin_range,
                         (n_x, n_y), sample, _mask=parent_mask)
    parent_gate = None if parent == ALL else parent
    histogram_view = tool == "Range (histogram)"
    # Every gate on these channels is drawn, mapped onto the current axes when it was drawn on
    # other transforms (a gate keeps the scales it was drawn on, so its cells never change).
    on_plot = gate_view.gates_on(tree, parent_gate, sample, x_ch, y_ch)
    raw_x = x_scale.inverse(np.array(x_range))
    raw_y = y_scale.inverse(np.array(y_range))
    x_label, y_label = channel_label(sample, x_ch), channel_label(sample, y_ch)
    pending_range = None
    if histogram_view:
        # A range gate: drag across the parent's histogram, or type low / high in raw units.
        r1, r2 = st.columns(2)
        range_key = f"range_{patient}_{x_ch}"
        chart_key = f"gate_hist_{state.gate_chart_version}_{patient}_{x_ch}_{x_kind}_{parent}"
        gate_view.seed_range(state, range_key, chart_key, x_scale, raw_x)
        range_lo = r1.number_input(f"{x_label} from", key=f"{range_key}_from", format="%.4g")
        range_hi = r2.number_input(f"{x_label} to", key=f"{range_key}_to", format="%.4g")
        pending_range = tuple(float(v) for v in x_scale.forward(np.array([range_lo, range_hi])))
        values = cache.display_values(record.token, x_ch, x_scale_d, sample)
        fig = charts.range_histogram(values if parent_mask is None else values[parent_mask], x_range, x_scale, x_label,
                                     lattice=cache.lattice(tokens, x_ch, x_scale_d, [sample]),
                                     ranges=gate_view.ranges_on(tree, parent_gate, x_ch, sample, x_scale),
                                     pending=pending_range if pending_range[0] < pending_range[1] else None,
                                     selectable=True)
        st.plotly_chart(fig, width="stretch", key=chart_key, on_select="rerun", selection_mode="box",
                        config={"displaylogo": False})
        event = None
    else:
        fig = charts.scatter_panels([{"title": f"{patient} · {parent}", "grid": grid}], x_scale,
                                    y_scale, x_range, y_range, x_label, y_label, mode="density", height=560,
                                    selectable=True)
        charts.add_gates(fig, on_plot, x_range, y_range, x_scale, y_scale, focus=focus)
        pending_split = None
        if tool == "Quadrant":
            q1, q2 = st.columns(2)
            split_key = f"split_{patient}"
            split_x = q1.number_input(f"Split {x_label} at",
                                      value=float(x_scale.inverse(np.array([np.mean(x_range)]))[0]),
                                      key=f"{split_key}_{x_ch}_x", format="%.4g")
            split_y = q2.number_input(f"Split {y_label} at",
                                      value=float(y_scale.inverse(np.array([np.mean(y_range)]))[0]),
                                      key=f"{split_key}_{y_ch}_y", format="%.4g")
            pending_split = (float(x_scale.forward(np.array([split_x]))[0]),
                             float(y_scale.forward(np.array([split_y]))[0]))
            charts.add_quadrant_lines(fig, pending_split, {}, x_range, y_range, color=charts.FOCUS_COLOR, dash="dash")
        chart_key = f"gate_chart_{state.gate_chart_version}_{patient}_{x_ch}_{y_ch}_{x_kind}_{y_kind}_{parent}"
        event = st.plotly_chart(fig, width="stretch", key=chart_key, on_select="rerun",
                                selection_mode=("lasso", "box"), config={"displaylogo": False})

    # The latest box or lasso becomes the pending shape (display coordinates of these axes).
    shape = shape_from_selection(getattr(event, "selection", None) if event is not None else None)
    if shape is not None:
        shape.update(patient=patient, x=x_ch, y=y_ch, x_scale=x_scale_d, y_scale=y_scale_d,
                     parent=None if parent == ALL else parent)
        state["pending_shape"] = shape

    pending = state.get("pending_shape")
    if pending and ((pending["patient"], pending["x"], pending["y"]) != (patient, x_ch, y_ch)
                    or not AxisScale.from_dict(pending["x_scale"]).same_mapping(x_scale)
                    or not AxisScale.from_dict(pending["y_scale"]).same_mapping(y_scale)):
        pending = None  # drawn on other axes: its coordinates mean something else here


    def _gate_from(shape, name):
        # a selection is stored like a gate of its kind: polygon vertices, or a box's two corners
        return Gate.from_dict({"name": name, "kind": shape["kind"], "x_channel": shape["x"], "y_channel": shape["y"],
                               "vertices": shape["vertices"], "x_scale": shape["x_scale"],
                               "y_scale": shape["y_scale"], "parent": shape["parent"]})


    def _commit(new_tree: GateTree, message: str):
        store.save_gates(patient, new_tree)
        state.pop("pending_shape", None)
        state.gate_chart_version += 1
        state["gate_message"] = message


    def _add(gates, message):
        try:
            new_tree = tree.copy()
            for gate in gates:
                new_tree.add(gate)
            _commit(new_tree, message)
            st.rerun()
        except GateError as exc:
            st.error(str(exc))


    def _count_line(label, inside):
        return f"**{label}**: {int(inside.sum()):,} events ({100 * inside.sum() / max(parent_count, 1):.1f}% of parent)"


    def _parent_only(inside):
        return inside & parent_mask if parent_mask is not None else inside


    left, right = st.columns([1, 1])
    with left:
        st.markdown("#### New gate")
    if tool == "Quadrant":
        with left:
            marker_x = sample.channels[sample.channel_index(x_ch)].pns or x_ch
            marker_y = sample.channels[sample.channel_index(y_ch)].pns or y_ch
            n1, n2 = st.columns(2)
            name_x = n1.text_input("X marker in the names", value=marker_x, key=f"quad_name_x_{x_ch}")
            name_y = n2.text_input("Y marker in the names", value=marker_y, key=f"quad_name_y_{y_ch}")
            quad_names = quadrant_names(name_x.strip() or marker_x, name_y.strip() or marker_y)
            try:
                preview_gates = quadrant_gates(x_ch, y_ch, pending_split, x_scale, y_scale, parent_gate, quad_names)
                st.markdown("  \n".join(_count_line(g.name, _parent_only(g.contains(sample))) for g in preview_gates))
            except GateError as exc:
                preview_gates = []
                st.warning(str(exc))
            taken = [g.name for g in preview_gates if g.name in tree]
            if taken:
                # a second click would only fail on the duplicate names: say so before it
                st.caption(f"Already in the tree: {', '.join(taken)}. Change the marker names above to add "
                           "another split, or move this one with **Adjust** on the Auto-gate page / delete and redraw.")
            if st.button("Add quadrant gate", type="primary", disabled=not preview_gates or bool(taken),
                         key="add_quadrant"):
                _add(preview_gates, f"Added quadrants {', '.join(g.name for g in preview_gates)}.")
    elif tool == "Range (histogram)":
        with left:
            gate_name = st.text_input("Gate name", key="gate_name", placeholder="e.g. CD3+")
            try:
                preview = range_gate(gate_name or "range", x_ch, *pending_range, x_scale, parent_gate)
                st.markdown(_count_line(f"{x_label} from {range_lo:.4g} to {range_hi:.4g}",
                                        _parent_only(preview.contains(sample))))
            except GateError as exc:
                preview = None
                st.warning(str(exc))
            if st.button("Add range gate", type="primary", disabled=preview is None, key="add_range"):
                _add([range_gate(gate_name, x_ch, *pending_range, x_scale, parent_gate)], f"Added gate {gate_name!r}.")
    elif tool == "Boolean":
        with left:
            operator = st.selectbox("Combine", list(gate_view.OPERATORS), format_func=gate_view.OPERATORS.get,
                                    key="bool_op")
            operands = st.multiselect("Populations", names_in_order, key="bool_operands",
                                      help="NOT takes one population; AND / OR two or more. The result is kept "
                                           "inside the parent population chosen above.")
            gate_name = st.text_input("Gate name", key="gate_name", placeholder="e.g. CD3- CD19+")
            try:
                if not operands:
                    raise GateError("choose the populations to combine" if len(tree) else "draw gates first")
                preview = boolean_gate(gate_name or "combined", operator, operands, parent_gate)
                trial = tree.copy()
                trial.add(preview)
                st.markdown(_count_line(preview.describe(), trial.memberships(sample)[preview.name]))
            except GateError as exc:
                preview = None
                st.caption(str(exc))
            if st.button("Add boolean gate", type="primary", disabled=preview is None, key="add_boolean"):
                _add([boolean_gate(gate_name, operator, operands, parent_gate)], f"Added gate {gate_name!r}.")
    else:
        with left:
            try:
                preview = _gate_from(pending, "selection") if pending else None
            except GateError as exc:
                st.warning(f"The selection cannot be a gate: {exc}. Draw it again.")
                state.pop("pending_shape", None)
                pending = preview = None
            if pending:
                inside = preview.contains(sample)
                if parent_mask is not None:
                    inside &= parent_mask
                st.markdown(f"Selection: **{pending['kind']}** → **{int(inside.sum()):,}** events "
                            f"({100 * inside.sum() / max(parent_count, 1):.1f}% of parent)")
            else:
                st.caption("Draw a lasso or box on the plot, or enter a rectangle below.")
            gate_name = st.text_input("Gate name", key="gate_name", placeholder="e.g. Lymphocytes, CD4 T cells")
            if st.button("Add gate", type="primary", disabled=not pending, key="add_gate"):
                try:
                    new_tree = tree.copy()
                    new_tree.add(_gate_from(pending, gate_name))
                    _commit(new_tree, f"Added gate {gate_name!r}.")
                    st.rerun()
                except GateError as exc:
                    st.error(str(exc))
            with st.expander("Enter a rectangle in raw units"):
                raw_x = x_scale.inverse(np.array(x_range))
                raw_y = y_scale.inverse(np.array(y_range))
                r1, r2 = st.columns(2)
                # Keyed by patient and channel: numbers typed for one channel never carry over to another.
                x_label, y_label = channel_label(sample, x_ch), channel_label(sample, y_ch)
                x_key, y_key = f"rect_{patient}_{x_ch}", f"rect_{patient}_{y_ch}_y"
                x_lo = r1.number_input(f"{x_label} from", value=float(raw_x[0]), key=f"{x_key}_from", format="%.4g")
                x_hi = r2.number_input(f"{x_label} to", value=float(raw_x[1]), key=f"{x_key}_to", format="%.4g")
                y_lo = r1.number_input(f"{y_label} from", value=float(raw_y[0]), key=f"{y_key}_from", format="%.4g")
                y_hi = r2.number_input(f"{y_label} to", value=float(raw_y[1]), key=f"{y_key}_to", format="%.4g")
                if st.button("Add rectangle gate", key="add_rect"):
                    try:
                        gate = rectangle_gate(gate_name, x_ch, y_ch, tuple(x_scale.forward(np.array([x_lo, x_hi]))),
                                              tuple(y_scale.forward(np.array([y_lo, y_hi]))), x_scale, y_scale,
                                              None if parent == ALL else parent)
                        new_tree = tree.copy()
                        new_tree.add(gate)
                        _commit(new_tree, f"Added gate {gate_name!r}.")
                        st.rerun()
                    except GateError as exc:
                        st.error(str(exc))

    with right:
        st.markdown("#### Gate tree")
        if state.get("gate_message"):
            st.success(state.pop("gate_message"))
        if not len(tree):
            st.caption("No gates yet for this patient.")
        else:
            stats = tree.statistics(sample, masks, channel_label=channel_label)
            stats["gate"] = ["\u2003" * d + ("└ " if d else "") + g for g, d in zip(stats["gate"], stats["depth"])]
            # The numbers first: in half the page's width the long axes text is what scrolls away.
            stats = stats[["gate", "count", "% of parent", "% of total", "parent", "axes"]]
            st.dataframe(stats, hide_index=True, width="stretch",
                         column_config={"% of parent": st.column_config.NumberColumn(format="%.2f"),
                                        "% of total": st.column_config.NumberColumn(format="%.2f"),
                                        "count": st.column_config.NumberColumn(format="localized")})
        if st.button("↶ Undo", disabled=not record.history.can_undo(), key="undo_gate"):
            store.undo_gates(patient)
            state.gate_chart_version += 1
            st.rerun()
        if len(tree):
            # keyed, so it stays open across the rerun a rename or a delete makes
            with st.expander("Rename or delete a gate", key="gate_edit_open", on_change="rerun"):
                chosen = st.selectbox("Gate", names_in_order, key="edit_which",
                                      format_func=lambda n: gate_view.tree_label(tree, n),
                                      # the tree's focus opens it, unless a rename chose the gate
                                      index=names_in_order.index(focus)
                                      if focus in names_in_order and "edit_which" not in state else 0)
                e1, e2 = st.columns([3, 1])
                new_name = e1.text_input("New name", key=f"rename_to_{chosen}", value=chosen)
                if e2.button("Rename", key="rename_gate", disabled=new_name.strip() in ("", chosen)):
                    try:
                        new_tree = tree.copy()
                        new_tree.rename(chosen, new_name)
                        state["gate_pickers_next"] = {key: new_name.strip() for key in ("gate_parent", "gate_focus")
                                                      if state.get(key) == chosen}
                        # the renamed gate stays chosen, its name field showing the new name
                        state["gate_pickers_next"].update(edit_which=new_name.strip(), gate_edit_open=True)
                        state.pop(f"rename_to_{new_name.strip()}", None)
                        _commit(new_tree, f"Renamed {chosen!r} to {new_name.strip()!r}.")
                        st.rerun()
                    except GateError as exc:
                        st.error(str(exc))
                doomed = tree.removal(chosen)
                if confirm_action(
                        f"delete_gate_{patient}", f"Delete {chosen}", "Delete them",
                        lambda: st.warning(f"This deletes {len(doomed)} gate(s): "
                                           + ", ".join(f"**{n}**" for n in doomed)
                                           + ". Gates nested in it and boolean gates built on them go with it "
                                             "(Undo brings them back)."),
                        help="Names every gate that goes with it, and asks first."):
                    new_tree = tree.copy()
                    gone = new_tree.remove(chosen)
                    state["gate_pickers_next"] = {key: ALL for key in ("gate_parent", "gate_focus")
                                                  if state.get(key) in gone}
                    state["gate_pickers_next"]["gate_edit_open"] = True
                    _commit(new_tree, f"Deleted {', '.join(gone)}.")
                    st.rerun()
            same = [g.name for g in on_plot if g.is_shape]  # regions a selection can replace
            if pending and same:
                adjust = st.selectbox("Adjust a gate on these axes to the current selection", same, key="adjust_which")
                if st.button("Replace its shape", key="adjust_gate"):
                    new_tree = tree.copy()
                    new_tree.replace_geometry(adjust, pending["vertices"], pending["kind"], x_scale, y_scale)
                    _commit(new_tree, f"Adjusted {adjust!r} for {patient}.")
                    st.rerun()


gating_section()

if len(tree):
    st.markdown("#### Use the gates")
    u1, u2 = st.columns(2)
    with u1:
        leaves = [n for n in names_in_order if n in {g.name for g in tree.leaves()}]
        st.caption(f"Training labels: {', '.join(leaves)} and `other`.")
        current = record.labels if record.is_labeled else None
        # the gates' labels are built only when asked for: a million-event comparison per rerun is cached
        if cache.labels_are_gates(record.token, tree_json, record.labels_token, tree, sample, masks, current):
            st.caption(f"{patient}'s labels are these gates' populations.")
        elif confirm_action(
                f"gates_to_labels_{patient}", "Use these gates as this patient's labels", "Replace the labels",
                lambda: (st.markdown(f"**{patient}**: labels now ({record.label_source or 'none'}) and from the "
                                     "gates, cells per population:"),
                         show_label_change(current, tree.labels(sample, masks))),
                help="Shows the population counts before and after, and asks before replacing anything."):
            store.set_labels(patient, tree.labels(sample, masks), "gates drawn")
            state["gate_message"] = f"{patient} is now a labeled (historical) patient."
            st.rerun()
        label_versions(store, patient, f"gate_versions_{patient}")
    with u2:
        others = [n for n in names if n != patient]
        targets = st.multiselect("Copy this gate tree to", others, key="copy_targets",
                                 help="The copy replaces the target's gates; adjust them there per patient.")
        if st.button("Copy gate tree", disabled=not targets, key="copy_tree"):
            problems = []
            for target in targets:
                other = store.patients[target]
                missing = tree.check_channels(other.sample)
                if missing:
                    problems.append(f"{target} lacks {', '.join(missing)}")
                    continue
                store.save_gates(target, tree.copy())
            if problems:
                st.error("Not copied: " + "; ".join(problems))
            else:
                state["gate_message"] = f"Copied {len(tree)} gates to {', '.join(targets)}."
                st.rerun()

if len(tree):
    gate_view.export_section(patient, record, tree, tree_json, store.work_dir)
    gate_view.backgating_section(record, tree, masks, focus if focus != ALL else None, store.axis_ranges)

transform_editor(store, channels, sample, "g_tf")
axis_range_editor(store, channels, sample, "g_ar", (record.token,), [sample])
