"""The Gate page's population tree, gate-type tools and back-gating, kept out of the page."""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core.gates import AxisScale, Band, GateTree, Region, Split
from ui import cache, charts
from ui.common import channel_label

ALL = "(all events)"
TOOLS = ("Lasso / box", "Quadrant", "Range (histogram)", "Boolean")
#: The tool that draws each kind of drawing a gate type makes (a gate with none: Boolean).
TOOL_OF_DRAWING = {Region: "Lasso / box", Split: "Quadrant", Band: "Range (histogram)"}
OPERATORS = {"and": "AND (in every one)", "or": "OR (in any)", "not": "NOT (outside it)"}
MAX_BACKGATE_PLOTS = 6


def pnn_of(sample, channel: str) -> str:
    """A gate's channel (a $PnN or a marker) as the $PnN the channel pickers list."""
    return sample.pnn[sample.channel_index(channel)]


def ordered_names(tree: GateTree) -> list[str]:
    """The tree's populations as a lab reads them: depth-first, each gate above what it holds."""
    return [g.name for g in tree.depth_first()]


def tree_label(tree: GateTree, name: str) -> str:
    """A population as a line of the tree: indented by depth, with its kind when not a shape."""
    if name == ALL:
        return ALL
    gate = tree[name]
    kind = "" if gate.is_shape else f" ({gate.kind})"
    return "\u2003" * tree.depth(name) + ("└ " if gate.parent else "") + name + kind


def focus_population(tree: GateTree, sample, name: str) -> dict:
    """Session-state values that show population ``name`` where it was drawn: its parent's
    plot on its channels, with the tool of its kind (a range gate: the histogram)."""
    if name == ALL or name not in tree:
        return {"gate_parent": ALL}
    gate = tree[name]
    out = {"gate_parent": gate.parent or ALL, "gate_tool": TOOL_OF_DRAWING.get(type(gate.drawing()), "Boolean")}
    out.update(zip(("g_x", "g_y"), (pnn_of(sample, channel) for channel in gate.channels)))
    return out


def gates_on(tree: GateTree, parent, sample, x_ch: str, y_ch: str | None = None) -> list:
    """The gates drawn on ``parent``'s plot of channels ``x_ch`` / ``y_ch`` ($PnN), or on its
    histogram of ``x_ch`` when ``y_ch`` is None."""
    wanted = (x_ch,) if y_ch is None else (x_ch, y_ch)
    return [g for g in tree.gates
            if g.parent == parent and tuple(pnn_of(sample, channel) for channel in g.channels) == wanted]


def ranges_on(tree: GateTree, parent, x_ch: str, sample, scale: AxisScale) -> list[tuple]:
    """(name, low, high) of the range gates on ``parent``'s histogram of ``x_ch``, in the display
    coordinates of ``scale``."""
    return charts.gate_ranges(gates_on(tree, parent, sample, x_ch), scale)


def range_from_selection(selection) -> tuple | None:
    """(low, high) display coordinates of the latest box dragged across a histogram, or None."""
    boxes = (selection or {}).get("box") or []
    if not boxes:
        return None
    xs = [float(v) for v in boxes[-1].get("x") or []]
    if len(xs) != 2 or xs[0] == xs[1]:
        return None
    return min(xs), max(xs)


def seed_range(state, range_key: str, chart_key: str, scale: AxisScale, raw_limits) -> None:
    """Set the range inputs ``{range_key}_from`` / ``_to`` (raw units) before they are drawn: to
    the histogram's range at first, then to each new box dragged across the chart ``chart_key``."""
    state.setdefault(f"{range_key}_from", float(raw_limits[0]))
    state.setdefault(f"{range_key}_to", float(raw_limits[1]))
    chart = state.get(chart_key)
    dragged = range_from_selection(chart.get("selection") if chart else None)
    if dragged is not None and state.get(f"{range_key}_dragged") != dragged:
        state[f"{range_key}_dragged"] = dragged  # applied once: typing afterwards still wins
        low, high = scale.inverse(np.array(dragged))
        state[f"{range_key}_from"], state[f"{range_key}_to"] = float(low), float(high)


def export_section(patient: str, record, tree: GateTree, tree_json: str, work_dir) -> None:
    """Download buttons for the patient's gates as GatingML 2.0 and as a FlowJo workspace, for
    FlowJo, FlowKit or another lab's tool to apply to the patient's FCS file."""
    from gating_core.gates import GateError
    from gating_core.gates.export import drawn_compensated, workspace_sample_id
    from ui import exports

    st.markdown("#### Export the gates")
    sample = record.sample
    st.caption("For FlowJo, FlowKit or another tool, to apply to the patient's FCS file"
               + (" (drawn on values compensated by the file's own spillover matrix, as the files say)"
                  if drawn_compensated(sample) else "") + f". The workspace refers to the file as `{workspace_sample_id(sample)}`.")
    gatingml, flowjo = st.columns(2)
    try:
        # GatingML holds the gates alone: written at once (cached per tree)
        data = exports.gates_file("gatingml", tree_json, record.token, sample, str(work_dir))
        suffix, label = exports.GATE_FILES["gatingml"]
        gatingml.download_button(label, data=data, file_name=f"{patient}.gates{suffix}",
                                 mime="application/xml", key="gates_gatingml")
    except GateError as exc:
        gatingml.caption(f"{exports.GATE_FILES['gatingml'][1]}: {exc}")
    problem = workspace_problem(tree)
    if problem:
        flowjo.button(exports.GATE_FILES["flowjo"][1], disabled=True, key="gates_flowjo", help=problem)
    else:
        # A workspace carries the patient's keywords, read from the whole file: written when asked for.
        suffix, label = exports.GATE_FILES["flowjo"]
        flowjo.download_button(label, file_name=f"{patient}.gates{suffix}",
                               data=lambda: exports.gates_file("flowjo", tree_json, record.token, sample,
                                                               str(work_dir)),
                               mime="application/xml", key="gates_flowjo")


def workspace_problem(tree: GateTree) -> str | None:
    """Why a FlowJo workspace cannot hold the tree (FlowKit writes polygon, rectangle and range
    gates, one scale per channel), or None."""
    unsupported = [g.name for g in tree.gates if not g.flowjo_workspace]
    if unsupported:
        return (f"A FlowJo workspace cannot hold {', '.join(unsupported)} (quadrant and boolean gates): "
                "export GatingML instead")
    scales: dict = {}
    for gate in tree.gates:
        for channel, scale in ((gate.x_channel, gate.x_scale), (gate.y_channel, gate.y_scale)):
            if channel is not None:
                scales.setdefault(channel, set()).add(scale)
    twice = sorted(channel for channel, seen in scales.items() if len(seen) > 1)
    if twice:
        return (f"A FlowJo workspace holds one scale per channel; {', '.join(twice)} "
                f"{'is' if len(twice) == 1 else 'are'} drawn on two: export GatingML instead")
    return None


def backgating_section(record, tree: GateTree, masks: dict, default: str | None, axis_ranges=None) -> None:
    """Back-gating: the chosen population coloured on top of each ancestor plot. ``axis_ranges``:
    the panel's ranges set by hand ($PnN -> (low, high) raw units; :meth:`Store.axis_range`)."""
    from gating_core.gates.backgating import backgating

    sample = record.sample
    st.markdown("#### Back-gating")
    names = ordered_names(tree)
    index = names.index(default) if default in names else len(names) - 1
    name = st.selectbox("Population to back-gate", names, index=index, key="backgate_which",
                        format_func=lambda n: tree_label(tree, n),
                        help="Its cells, coloured, on the plot of every gate above it, from all events down.")
    plots = backgating(tree, name, sample, masks)
    if not plots:
        st.caption(f"{name} is a boolean gate of boolean gates: no plot to show it on.")
        return
    shown = plots[-MAX_BACKGATE_PLOTS:]
    if len(plots) > len(shown):
        st.caption(f"The last {len(shown)} of {len(plots)} plots on the way to {name}.")
    columns = st.columns(min(len(shown), 3))
    tree_json = tree.to_json()
    for i, plot in enumerate(shown):
        limits = tuple((axis_ranges or {}).get(pnn_of(sample, c)) for c in (plot.x_channel, plot.y_channel) if c)
        fig = _backgate_figure(record.token, tree_json, name, plot.gate, limits, record, tree, plot)
        columns[i % len(columns)].plotly_chart(fig, width="stretch", key=f"backgate_{i}_{name}_{plot.gate}",
                                               config={"displaylogo": False})


@st.cache_resource(max_entries=64, show_spinner=False)
def _backgate_figure(token: str, tree_json: str, population: str, gate_name: str, limits: tuple, _record, _tree,
                     _plot):
    """The back-gating plot of ``population`` on the plot of ``gate_name``, built once per (events,
    gate tree, population, axis ranges set by hand): Plotly figures cost ~50 ms each to build and
    the section is drawn on every rerun of the page, whatever control changed. st.plotly_chart
    only reads the figure. ``limits``: the raw (low, high) set by hand of its x and y channels, or None."""
    record, tree, plot, name = _record, _tree, _plot, population
    sample = record.sample

    def axis(pnn, scale, limit):
        if limit is None:  # cached: not a million-event percentile per plot
            return cache.shared_range((record.token,), pnn, scale, [sample])
        low, high = AxisScale.from_dict(scale).forward(np.array(limit, dtype=np.float64))
        return float(low), float(high)

    idx = cache.dots(record.token, sample.n_events, 8000)
    x_pnn, x_scale = pnn_of(sample, plot.x_channel), plot.x_scale.to_dict()
    x_all = cache.display_values(record.token, x_pnn, x_scale, sample)
    x_range = axis(x_pnn, x_scale, limits[0] if limits else None)
    title = f"{plot.gate} · on {plot.parent or ALL} · {plot.count:,} cells"
    if plot.y_channel is None:
        return charts.backgate_figure(title, x_all[plot.events], None, x_all[plot.highlight], None, plot.x_scale,
                                      None, x_range, None, channel_label(sample, pnn_of(sample, plot.x_channel)),
                                      None, name, ranges=charts.gate_ranges([tree[plot.gate]]))
    y_pnn, y_scale = pnn_of(sample, plot.y_channel), plot.y_scale.to_dict()
    y_all = cache.display_values(record.token, y_pnn, y_scale, sample)
    y_range = axis(y_pnn, y_scale, limits[1] if len(limits) > 1 else None)
    keep = idx[plot.events[idx]]
    lit = idx[plot.highlight[idx]]
    fig = charts.backgate_figure(title, x_all[keep], y_all[keep], x_all[lit], y_all[lit], plot.x_scale,
                                 plot.y_scale, x_range, y_range,
                                 channel_label(sample, pnn_of(sample, plot.x_channel)),
                                 channel_label(sample, pnn_of(sample, plot.y_channel)), name)
    # the gate with those drawn with it (a quadrant's whole split), on its own axes
    return charts.add_gates(fig, [tree[n] for n in tree.sharing_geometry(plot.gate)], x_range, y_range)
