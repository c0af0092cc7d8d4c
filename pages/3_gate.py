"""Gate: draw nested polygon / rectangle gates to label historical patients."""

import numpy as np
import pandas as pd
import streamlit as st

from gating_core.gates import AxisScale, GateError, GateTree, polygon_gate, rectangle_gate
from ui import cache, charts
from ui.app_state import shape_from_selection
from ui.common import (channel_label, confirm_action, default_xy, get_store, label_versions, require_patients,
                       scale_select, show_label_change, transform_editor)

ALL = "(all events)"
store = get_store()
st.title("Gate: label patients by hand")
st.caption("Label a patient by hand: choose the parent population and two channels, draw a **lasso** or "
           "**box** on the plot (toolbar, top right of the chart), name the gate and add it. Gates nest: a "
           "gate drawn on a parent population only keeps the parent's cells. The leaf gates, plus `other` "
           "for every cell outside them, become the patient's training labels.")
if not require_patients(store):
    st.stop()

state = st.session_state
state.setdefault("gate_chart_version", 0)

names = list(store.patients)
top = st.columns([2, 2, 2])
patient = top[0].selectbox("Patient", names, key="gate_patient")
record = store.patients[patient]
sample = record.sample
tree: GateTree = record.gate_tree
tree_json = tree.to_json()
masks = cache.memberships(record.token, tree_json, sample) if len(tree) else {}
parent = top[1].selectbox("Parent population", [ALL] + tree.names, key="gate_parent",
                          help="New gates are drawn inside this population.")
parent_mask = masks.get(parent) if parent != ALL else None
parent_count = int(parent_mask.sum()) if parent_mask is not None else sample.n_events
top[2].metric("Events in parent", f"{parent_count:,}",
              help=f"{100 * parent_count / max(sample.n_events, 1):.1f}% of {sample.n_events:,} events")

channels = sample.pnn
xi, yi = default_xy(channels)
axes = st.columns(4)
x_ch = axes[0].selectbox("X channel", channels, index=xi, format_func=lambda c: channel_label(sample, c), key="g_x")
y_ch = axes[1].selectbox("Y channel", channels, index=yi, format_func=lambda c: channel_label(sample, c), key="g_y")
x_scale_d = scale_select(axes[2], "X transform", x_ch, "g_xs", store)
y_scale_d = scale_select(axes[3], "Y transform", y_ch, "g_ys", store)
x_kind, y_kind = x_scale_d["kind"], y_scale_d["kind"]

tokens = (record.token,)
x_scale, y_scale = AxisScale.from_dict(x_scale_d), AxisScale.from_dict(y_scale_d)
x_range = cache.shared_range(tokens, x_ch, x_scale_d, [sample])
y_range = cache.shared_range(tokens, y_ch, y_scale_d, [sample])
mask_key = f"{tree_json}|{parent}" if parent_mask is not None else ""
grid = cache.density(record.token, mask_key, x_ch, y_ch, x_scale_d, y_scale_d, x_range, y_range, 200, sample,
                     _mask=parent_mask)
idx = cache.dots(record.token, sample.n_events)
if parent_mask is not None:
    idx = idx[parent_mask[idx]]
xs = cache.display_values(record.token, x_ch, x_scale_d, sample)[idx]
ys = cache.display_values(record.token, y_ch, y_scale_d, sample)[idx]
fig = charts.scatter_panels([{"title": f"{patient} · {parent}", "grid": grid, "x": xs, "y": ys}], x_scale, y_scale,
                            x_range, y_range, channel_label(sample, x_ch), channel_label(sample, y_ch),
                            mode="density", height=560, selectable=True)
# Every gate on these two channels is drawn, mapped onto the current axes when it was drawn on
# other transforms (a gate keeps the scales it was drawn on, so its cells never change).
same_axes = [g for g in tree.gates if g.x_channel == x_ch and g.y_channel == y_ch
             and g.parent == (None if parent == ALL else parent)]
charts.add_gate_shapes(fig, same_axes, x_scale, y_scale)
chart_key = f"gate_chart_{state.gate_chart_version}_{patient}_{x_ch}_{y_ch}_{x_kind}_{y_kind}_{parent}"
event = st.plotly_chart(fig, width="stretch", key=chart_key, on_select="rerun",
                        selection_mode=("lasso", "box"),
                        config={"modeBarButtonsToAdd": ["lasso2d", "select2d"], "displaylogo": False})

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
    maker = polygon_gate if shape["kind"] == "polygon" else None
    xsc, ysc = AxisScale.from_dict(shape["x_scale"]), AxisScale.from_dict(shape["y_scale"])
    if maker is None:
        (x0, y0), (x1, y1) = shape["vertices"]
        return rectangle_gate(name, shape["x"], shape["y"], (x0, x1), (y0, y1), xsc, ysc, shape["parent"])
    return polygon_gate(name, shape["x"], shape["y"], shape["vertices"], xsc, ysc, shape["parent"])


def _commit(new_tree: GateTree, message: str):
    store.save_gates(patient, new_tree)
    state.pop("pending_shape", None)
    state.gate_chart_version += 1
    state["gate_message"] = message


left, right = st.columns([1, 1])
with left:
    st.markdown("#### New gate")
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
        st.dataframe(stats.drop(columns=["depth"]), hide_index=True, width="stretch",
                     column_config={"% of parent": st.column_config.NumberColumn(format="%.1f"),
                                    "% of total": st.column_config.NumberColumn(format="%.2f"),
                                    "count": st.column_config.NumberColumn(format="%d")})
    b1, b2 = st.columns(2)
    if b1.button("↶ Undo", disabled=not record.history.can_undo(), key="undo_gate"):
        store.undo_gates(patient)
        state.gate_chart_version += 1
        st.rerun()
    if len(tree):
        with b2.popover("Delete gate"):
            doomed = st.selectbox("Gate", tree.names, key="delete_which")
            if st.button("Delete it and its sub-gates", key="delete_gate"):
                new_tree = tree.copy()
                gone = new_tree.remove(doomed)
                _commit(new_tree, f"Deleted {', '.join(sorted(gone))}.")
                st.rerun()
        same = [g.name for g in same_axes]
        if pending and same:
            adjust = st.selectbox("Adjust a gate on these axes to the current selection", same, key="adjust_which")
            if st.button("Replace its shape", key="adjust_gate"):
                new_tree = tree.copy()
                new_tree.replace_geometry(adjust, pending["vertices"], pending["kind"], x_scale, y_scale)
                _commit(new_tree, f"Adjusted {adjust!r} for {patient}.")
                st.rerun()

if len(tree):
    st.markdown("#### Use the gates")
    u1, u2 = st.columns(2)
    with u1:
        leaves = [g.name for g in tree.leaves()]
        st.caption(f"Training labels: {', '.join(leaves)} and `other`.")
        new_labels = tree.labels(sample, masks)
        current = record.labels if record.is_labeled else None
        if current is not None and np.array_equal(np.asarray(current).astype(str), new_labels.astype(str)):
            st.caption(f"{patient}'s labels are these gates' populations.")
        elif confirm_action(
                f"gates_to_labels_{patient}", "Use these gates as this patient's labels", "Replace the labels",
                lambda: (st.markdown(f"**{patient}**: labels now ({record.label_source or 'none'}) and from the "
                                     "gates, cells per population:"), show_label_change(current, new_labels)),
                help="Shows the population counts before and after, and asks before replacing anything."):
            store.set_labels(patient, new_labels, "gates drawn")
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

transform_editor(store, channels, sample, "g_tf")
