"""Plotly figures for scatter projections, histograms and gate overlays."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gating_core.gates import AxisScale, Band, Region, Split
from gating_core.reports import plotting, population_view

DENSITY_COLORS = "Turbo"  # the familiar blue-to-red pseudocolor of flow software
#: The largest share of an axis kept between ticks, however many plots stand side by side
#: (beyond it an axis would keep too few ticks to read).
MAX_TICK_GAP_SHARE = 0.2


def _axes(fig, x_scale: AxisScale, y_scale: AxisScale, x_range, y_range, x_title, y_title, n_cols=1):
    # n_cols plots side by side share the page's width: each x axis is 1/n_cols as wide, so its
    # ticks keep n_cols times the share apart ("-1", "0" and "1" overlapped on four mass cytometry plots)
    x_gap = min(plotting.MIN_TICK_GAP * n_cols, MAX_TICK_GAP_SHARE)
    xv, xt = plotting.raw_ticks(x_scale, *x_range, min_gap_share=x_gap)
    yv, yt = plotting.raw_ticks(y_scale, *y_range)
    for col in range(1, n_cols + 1):
        fig.update_xaxes(range=list(x_range), tickvals=xv, ticktext=xt, title_text=x_title, row=1, col=col,
                         showgrid=True, gridcolor="#eeeeee", zeroline=False)
        fig.update_yaxes(range=list(y_range), tickvals=yv, ticktext=yt, row=1, col=col,
                         title_text=y_title if col == 1 else None, showgrid=True, gridcolor="#eeeeee",
                         zeroline=False)


def scatter_panels(panels, x_scale, y_scale, x_range, y_range, x_title, y_title, mode="density",
                   colors=None, height=460, selectable=False):
    """Side-by-side scatter projections sharing both axes.

    mode : "density" (pseudocolour of all events), "population bins" (all events binned, each
        bin in the colour of the population holding most of its events: one image per panel) or
        "population" (a display subsample of dots, one WebGL trace per population).
    panels : list of dicts with ``title`` and ``grid`` = (counts, xc, yc) for density mode;
        ``grid`` = (counts per population (n_populations, bins, bins), xc, yc) and
        ``populations`` (the names of ``counts``' first axis) for population bins; ``x``, ``y``,
        ``populations`` (display subsample) for population (dots).
    colors : dict population name -> ``#rrggbb``; its order is the legend's.
    selectable : the lasso is the drag mode, and the toolbar offers the lasso and the box (see
        :func:`add_selection_anchor`). A density plot needs no points under it for the selection
        itself: Plotly reports the drawn lasso or box over a heatmap too, and the gate is the
        drawn path. (An invisible WebGL layer of 20,000 dots used to be drawn for it; it cost
        the browser 0.4-0.6 s a redraw without a GPU, against 0.07 s for the heatmap alone.)
    """
    n = len(panels)
    fig = make_subplots(rows=1, cols=max(n, 1), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[p["title"] for p in panels], horizontal_spacing=0.03)
    shown_legend = set()
    for col, panel in enumerate(panels, start=1):
        if mode == "density":
            counts, xc, yc = panel["grid"]
            # a pile at one value (exact zeros, a saturated detector) does not set the colours' top
            top = max(float(np.log10(max(plotting.density_top(p["grid"][0]), 10))) for p in panels)
            ticks = [v for v in (0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5) if v <= top]
            # float32 log counts: half the bytes sent to the browser, far finer than the colours
            fig.add_trace(go.Heatmap(z=plotting.log_density(counts).astype(np.float32), x=xc, y=yc,
                                     colorscale=DENSITY_COLORS,
                                     zmin=0, zmax=top, showscale=col == n, hoverinfo="skip",
                                     colorbar=dict(title="events / bin", tickvals=ticks,
                                                   ticktext=[f"{10 ** v:,.0f}" for v in ticks])),
                          row=1, col=col)
        elif mode == "population bins":
            if col == 1:
                top = max(int(p["grid"][0].sum(axis=0).max()) for p in panels)
            fig.add_trace(_population_image(panel, colors, top), row=1, col=col)
        else:
            pops = np.asarray(panel["populations"]).astype(str)
            for name in colors:
                mask = pops == name
                if not mask.any():
                    continue
                fig.add_trace(go.Scattergl(x=panel["x"][mask], y=panel["y"][mask], mode="markers", name=name,
                                           legendgroup=name, showlegend=name not in shown_legend,
                                           marker=dict(size=3, color=colors[name], opacity=0.6),
                                           hovertemplate=f"{name}<extra></extra>"),
                              row=1, col=col)
                shown_legend.add(name)
    legend = dict(itemsizing="constant", title="population")
    if mode == "population bins":
        # Plotly ties an image's axes to square pixels by default: panels would shrink unevenly
        fig.update_xaxes(scaleanchor=False)
        fig.update_yaxes(scaleanchor=False)
        # the legend names the colours; its entries are empty traces, so clicking one would hide nothing
        legend.update(itemclick=False, itemdoubleclick=False)
        for name, color in colors.items():
            if any(name in p["populations"] for p in panels):
                # no point to draw (x, y None), but a legend entry in the population's colour
                fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                         marker=dict(size=10, color=color, symbol="square")), row=1, col=1)
    if selectable:
        for col in range(1, n + 1):
            add_selection_anchor(fig, x_range, y_range, row=1, col=col)
    _axes(fig, x_scale, y_scale, x_range, y_range, x_title, y_title, n_cols=max(n, 1))
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=40, b=50), plot_bgcolor="white",
                      legend=legend, dragmode="lasso" if selectable else "zoom")
    return fig


#: The name of the trace :func:`add_selection_anchor` adds (tests look for it).
SELECTION_ANCHOR = "selection tools"


def add_selection_anchor(fig, x_range, y_range=None, row=None, col=None):
    """Two transparent markers at the plot's corners, so that the toolbar offers the lasso and
    the box. Plotly shows those two buttons only when some trace can hold selected points (a
    trace with markers); a density heatmap, a population image or a histogram line has none, and
    ``config["modeBarButtonsToAdd"]`` cannot add them back (plotly.js drops those names). Without
    the buttons, a user who picked Zoom or Pan had no way back to drawing a gate but a reload.
    ``y_range`` None: a histogram, whose markers sit on the x axis (y 0)."""
    ys = [0.0, 0.0] if y_range is None else [float(y_range[0]), float(y_range[1])]
    trace = go.Scatter(x=[float(x_range[0]), float(x_range[1])], y=ys, mode="markers", name=SELECTION_ANCHOR,
                       marker=dict(size=1, opacity=0), hoverinfo="skip", showlegend=False)
    if row is None:
        fig.add_trace(trace)
    else:
        fig.add_trace(trace, row=row, col=col)
    return fig


def _png_data_uri(rgba: np.ndarray) -> str:
    """An RGBA uint8 image (row 0 at the top) as a PNG data URI: ~15 KB for a 200 x 200 view,
    against ~200 KB as a typed array; the browser decodes it natively."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba), mode="RGBA").save(buffer, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _population_image(panel, colors, top):
    """One panel of the population view: :func:`gating_core.reports.population_view.population_image`
    drawn as an image spanning the density view's bins (so both views share axes). An image, not
    20,000 WebGL dots: the browser draws it without WebGL (bench/bench_browser_render.py)."""
    counts, xc, yc = panel["grid"]
    names = list(panel["populations"])
    rgba = population_view.population_image(counts, [colors[name] for name in names], top=top)
    dx = float(xc[1] - xc[0]) if len(xc) > 1 else 1.0
    dy = float(yc[1] - yc[0]) if len(yc) > 1 else 1.0
    # No hover text: a text per filled bin (~20,000 at a million events) costs the server ~0.1 s
    # a panel to build and serialise and makes its JSON ~10x larger (bench/bench_browser_render.py)
    # on a y axis that is not reversed Plotly draws the image's first row at the bottom (y0)
    return go.Image(source=_png_data_uri(rgba), x0=float(xc[0]), dx=dx, y0=float(yc[0]), dy=dy,
                    hoverinfo="skip", name=panel["title"])


#: A gate's name within this share of the plotted range from its top or a side is written inwards.
LABEL_MARGIN = 0.08


def clipped_polygon(corners, x_range, y_range) -> np.ndarray:
    """The part of a polygon (corners (n, 2)) inside the box ``x_range`` x ``y_range``: its
    corners (m, 2), m = 0 when none of it is inside (Sutherland-Hodgman, one box edge at a time).
    Plotly draws a shape past its axes, over the margins and the colour bar: only this part is."""
    points = [tuple(map(float, c)) for c in np.asarray(corners, dtype=float)]
    edges = ((0, x_range[0], True), (0, x_range[1], False), (1, y_range[0], True), (1, y_range[1], False))
    for axis, limit, lower in edges:
        if not points:
            break

        def inside(point):
            return point[axis] >= limit if lower else point[axis] <= limit

        def crossing(a, b):
            t = (limit - a[axis]) / (b[axis] - a[axis])
            crossed = [a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])]
            crossed[axis] = limit
            return tuple(crossed)

        kept = []
        for i, current in enumerate(points):
            previous = points[i - 1]
            if inside(current):
                if not inside(previous):
                    kept.append(crossing(previous, current))
                kept.append(current)
            elif inside(previous):
                kept.append(crossing(previous, current))
        points = kept
    return np.array(points, dtype=float).reshape(-1, 2)


def add_gate_shapes(fig, gates, x_scale=None, y_scale=None, color="#222222", focus=None, clip=None):
    """Outline the gates that draw a 2-D region (polygon, rectangle) on a single-panel figure,
    labelled by name, in the display coordinates of ``x_scale`` / ``y_scale`` (default: each
    gate's own scales); an outline mapped from other scales is dotted. The gate named ``focus``
    (the population chosen in the tree) is drawn in the focus colour. ``clip``: (x_range,
    y_range), the plotted ranges, to which outlines are cut (:func:`clipped_polygon`)."""
    base_color = color
    for gate in gates:
        region = gate.drawing(x_scale, y_scale)
        if not isinstance(region, Region):
            continue  # quadrant splits: add_gates; range and boolean gates have no 2-D outline
        color = FOCUS_COLOR if gate.name == focus else base_color
        if region.box is not None:
            x0, y0, x1, y1 = region.box
            lx, ly = x0, y1
            if clip is not None:
                (xl, xh), (yl, yh) = clip
                x0, x1 = float(np.clip(x0, xl, xh)), float(np.clip(x1, xl, xh))
                y0, y1 = float(np.clip(y0, yl, yh)), float(np.clip(y1, yl, yh))
            if x0 != x1 and y0 != y1:
                fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=color, width=2))
        else:
            corners = region.corners
            lx, ly = corners[np.argmax(corners[:, 1])]
            drawn = corners if clip is None else clipped_polygon(corners, *clip)
            if len(drawn) >= 3:
                path = "M " + " L ".join(f"{x},{y}" for x, y in drawn) + " Z"
                line = dict(color=color, width=2, dash="dot") if region.mapped else dict(color=color, width=2)
                fig.add_shape(type="path", path=path, line=line)
        fig.add_annotation(x=lx, y=ly, text=f"<b>{gate.name}</b>", showarrow=False, yshift=10,
                           font=dict(color=color, size=12), bgcolor="rgba(255,255,255,0.7)")
    return fig


def add_vertex_numbers(fig, corners, chosen: int | None = None):
    """A region's vertices numbered on its plot as the vertex editor numbers them (1 to n, in
    the order of ``corners``, display coordinates), ``chosen`` marked larger in the focus colour,
    so that a typed vertex is found on the plot before it is moved."""
    corners = np.asarray(corners, dtype=np.float64).reshape(-1, 2)
    numbers = np.arange(1, len(corners) + 1)
    picked = numbers == chosen
    # each number outside the polygon, away from its centre, where the outline does not cross it
    outward = corners - corners.mean(axis=0)
    positions = [f"{'top' if dy >= 0 else 'bottom'} {'right' if dx >= 0 else 'left'}" for dx, dy in outward]
    fig.add_trace(go.Scatter(
        x=corners[:, 0].tolist(), y=corners[:, 1].tolist(), mode="markers+text", text=[str(n) for n in numbers],
        textposition=positions,
        textfont=dict(size=np.where(picked, 14, 11).tolist(), color=np.where(picked, FOCUS_COLOR, "#222222").tolist()),
        marker=dict(size=np.where(picked, 11, 6).tolist(), color=np.where(picked, FOCUS_COLOR, "#222222").tolist(),
                    line=dict(width=1, color="white")),
        hovertext=[f"vertex {n}" for n in numbers], hoverinfo="text", showlegend=False, name="vertices",
        cliponaxis=False))  # a vertex at the plot's edge keeps its number, drawn over the margin
    return fig


def add_gates(fig, gates, x_range, y_range, x_scale=None, y_scale=None, focus=None):
    """Every gate of a 2-D plot on a single-panel figure, as each draws itself: regions outlined
    (:func:`add_gate_shapes`), each quadrant split as two lines with its quadrants' names in the
    corners (:func:`add_quadrant_lines`), in the focus colour when it holds ``focus``."""
    named = len(fig.layout.annotations)
    add_gate_shapes(fig, gates, x_scale, y_scale, focus=focus, clip=(x_range, y_range))
    # A gate reaching past the plotted range (a copied gate, cells piled on an axis end) keeps
    # its name on the plot; a name at the top goes under the edge (above it is the title), one at
    # a side is written inwards (past it is the colour bar).
    x_span, y_span = x_range[1] - x_range[0], y_range[1] - y_range[0]
    for note in fig.layout.annotations[named:]:
        if note.x is not None and note.y is not None:
            note.x = float(np.clip(note.x, x_range[0], x_range[1]))
            if note.y >= y_range[1] - LABEL_MARGIN * y_span:
                note.y, note.yshift = float(min(note.y, y_range[1])), -12
            elif note.y < y_range[0]:
                note.y, note.yshift = float(y_range[0]), 12
            if note.x >= x_range[1] - LABEL_MARGIN * x_span:
                note.xanchor = "right"
            elif note.x <= x_range[0] + LABEL_MARGIN * x_span:
                note.xanchor = "left"
    splits: dict = {}  # split point -> {quadrant code: gate name}
    for gate in gates:
        split = gate.drawing(x_scale, y_scale)
        if isinstance(split, Split):
            splits.setdefault(split.point, {})[split.region] = gate.name
    for point, labels in splits.items():
        add_quadrant_lines(fig, point, labels, x_range, y_range,
                           color=FOCUS_COLOR if focus in labels.values() else QUADRANT_COLOR)
    return fig


def gate_ranges(gates, scale=None) -> list[tuple]:
    """(name, low, high) of the gates drawn as a band on a histogram (range gates), in the
    display coordinates of ``scale`` (default: each gate's own): :func:`range_histogram`'s ranges."""
    bands = [(gate.name, gate.drawing(scale)) for gate in gates]
    return [(name, band.low, band.high) for name, band in bands if isinstance(band, Band)]


def histogram_panels(panels, scale, value_range, title, height=320):
    """Overlaid per-patient histograms (all events) of one channel, as a fraction of events."""
    fig = go.Figure()
    for panel in panels:
        counts, centers = panel["hist"]
        total = max(int(counts.sum()), 1)
        fig.add_trace(go.Scatter(x=centers, y=counts / total, mode="lines", name=panel["title"],
                                 line=dict(width=2, shape="hvh")))
    xv, xt = plotting.raw_ticks(scale, *value_range)
    fig.update_xaxes(range=list(value_range), tickvals=xv, ticktext=xt, title_text=title)
    fig.update_yaxes(title_text="fraction of events", rangemode="tozero")
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=20, b=50), plot_bgcolor="white")
    return fig


def overlay_histogram(curves, scale, value_range, title, y_scale="% of mode", stagger=False, height=380):
    """Histograms of one channel overlaid, one line per curve ({"name", "counts", "centers"}).

    y_scale : "% of mode" (each curve's highest bin is 100, FlowJo's "normalized to mode"),
        "% of cells" (each curve's bins sum to 100 over the range) or "cells" (counts).
    stagger : each curve drawn above the one before by 60% of the tallest curve, FlowJo's
        offset overlay: many patients stay readable; the y axis then reads per curve only.
    """
    fig = go.Figure()
    heights = []
    scaled = []
    for curve in curves:
        counts = np.asarray(curve["counts"], dtype=np.float64)
        if y_scale == "% of mode":
            values = 100.0 * counts / max(counts.max(initial=0.0), 1.0)
        elif y_scale == "% of cells":
            values = 100.0 * counts / max(counts.sum(), 1.0)
        else:
            values = counts
        scaled.append(values)
        heights.append(values.max(initial=0.0))
    step = 0.6 * max(heights, default=0.0) if stagger else 0.0
    for k, (curve, values) in enumerate(zip(curves, scaled)):
        base = k * step
        fig.add_trace(go.Scatter(x=curve["centers"], y=values + base, mode="lines", name=curve["name"],
                                 line=dict(width=2, shape="hvh"), hovertemplate=f"{curve['name']}<extra></extra>"))
    xv, xt = plotting.raw_ticks(scale, *value_range)
    fig.update_xaxes(range=list(value_range), tickvals=xv, ticktext=xt, title_text=title)
    fig.update_yaxes(title_text=y_scale + (" (curves offset)" if stagger else ""), rangemode="tozero",
                     showticklabels=not stagger)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=20, b=50), plot_bgcolor="white",
                      legend=dict(traceorder="reversed" if stagger else "normal"))
    return fig


def confidence_histogram(confidence, threshold, height=280):
    """Histogram of per-cell confidence; bars below ``threshold`` in red."""
    counts, edges = np.histogram(np.asarray(confidence, dtype=float), bins=40, range=(0, 1))
    centers = (edges[:-1] + edges[1:]) / 2
    colors = ["#D55E00" if c < threshold else "#0072B2" for c in centers]
    fig = go.Figure(go.Bar(x=centers, y=counts, marker_color=colors, width=1 / 40,
                           hovertemplate="confidence %{x:.3f}: %{y} cells<extra></extra>"))
    fig.add_vline(x=threshold, line=dict(color="#D55E00", dash="dash"))
    fig.update_xaxes(title_text="confidence", range=[0, 1])
    # log counts: the few hesitant cells stay visible beside the confident majority
    # ticks at powers of ten only: plotly's 2 and 5 between them read as '5, 2, 1000'
    fig.update_yaxes(title_text="cells (log scale)", type="log", dtick=1)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=20, b=50), plot_bgcolor="white", bargap=0)
    return fig


QUADRANT_COLOR = "#222222"
HIGHLIGHT_COLOR = "#D55E00"  # the back-gated population, on top of its ancestors' events
FOCUS_COLOR = "#D55E00"


def add_quadrant_lines(fig, point, labels, x_range, y_range, color=QUADRANT_COLOR, dash=None):
    """A quadrant split on a single-panel figure: a vertical and a horizontal line through
    ``point`` (display coordinates of the figure's axes) and each quadrant's label in its corner.

    labels : dict quadrant code ("++", "+-", "-+", "--") -> text (codes left out get no label).
    """
    x, y = point
    line = dict(color=color, width=2, dash=dash)
    fig.add_shape(type="line", x0=x, x1=x, y0=y_range[0], y1=y_range[1], line=line)
    fig.add_shape(type="line", x0=x_range[0], x1=x_range[1], y0=y, y1=y, line=line)
    corners = {"++": (x_range[1], y_range[1], "right", "top"), "+-": (x_range[1], y_range[0], "right", "bottom"),
               "-+": (x_range[0], y_range[1], "left", "top"), "--": (x_range[0], y_range[0], "left", "bottom")}
    for code, text in labels.items():
        cx, cy, xanchor, yanchor = corners[code]
        fig.add_annotation(x=cx, y=cy, text=f"<b>{text}</b>", showarrow=False, xanchor=xanchor, yanchor=yanchor,
                           font=dict(color=color, size=12), bgcolor="rgba(255,255,255,0.7)")
    return fig


def range_histogram(values, value_range, scale: AxisScale, title, ranges=(), pending=None, highlight=None,
                    bins=200, height=420, selectable=False, lattice="find"):
    """Histogram of one channel's display values (the parent population), with range gates.

    lattice : the evenly spaced values the channel sits on
        (:func:`gating_core.reports.plotting.value_lattice`; "find": from ``values``), for bins
        that each hold the same number of them; None: plain bins.
    ranges : list of (name, low, high) in the figure's display coordinates, shaded and named.
    pending : (low, high) or None, the range being drawn (dashed).
    highlight : display values of a population to draw on top (back-gating), or None.
    selectable : a range is dragged across it: the box is the drag mode (horizontal only) and
        the toolbar offers it (:func:`add_selection_anchor`); otherwise dragging zooms.
    """
    values = np.asarray(values, dtype=float)
    if isinstance(lattice, str):
        lattice = plotting.value_lattice(values)
    bin_range, bins = plotting.lattice_bins(value_range, lattice, bins)
    counts, centers = plotting.histogram_1d(values, bin_range, bins=bins)
    fig = go.Figure(go.Scatter(x=centers, y=counts, mode="lines", name="events", line=dict(width=2, shape="hvh",
                                                                                            color="#555555")))
    if highlight is not None:
        hc, _ = plotting.histogram_1d(np.asarray(highlight, dtype=float), bin_range, bins=bins)
        fig.add_trace(go.Scatter(x=centers, y=hc, mode="lines", name="population", fill="tozeroy",
                                 line=dict(width=1, shape="hvh", color=HIGHLIGHT_COLOR)))
    for name, lo, hi in ranges:
        fig.add_vrect(x0=lo, x1=hi, fillcolor="#0072B2", opacity=0.12, line_width=1,
                      annotation_text=f"<b>{name}</b>", annotation_position="top left")
    if pending is not None:
        fig.add_vrect(x0=pending[0], x1=pending[1], fillcolor=FOCUS_COLOR, opacity=0.12,
                      line=dict(color=FOCUS_COLOR, dash="dash"))
    xv, xt = plotting.raw_ticks(scale, *value_range)
    fig.update_xaxes(range=list(value_range), tickvals=xv, ticktext=xt, title_text=title)
    fig.update_yaxes(title_text="events", rangemode="tozero")
    if selectable:
        add_selection_anchor(fig, value_range)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=20, b=50), plot_bgcolor="white", showlegend=False,
                      dragmode="select" if selectable else "zoom", selectdirection="h")
    return fig


def backgate_figure(title, x, y, hx, hy, x_scale, y_scale, x_range, y_range, x_title, y_title, population,
                    height=320, ranges=()):
    """One ancestor plot of a back-gated population: the plot's events in grey, the population's
    cells coloured on top. ``x``/``y``: display values of (a subsample of) the plot's events;
    ``hx``/``hy``: those of the population's cells. ``y`` None: a histogram of ``x`` with the
    range gates ``ranges`` ((name, low, high), display coordinates) shaded."""
    if y is None:
        fig = range_histogram(x, x_range, x_scale, x_title, ranges=ranges, highlight=hx, height=height)
        fig.data[-1].name = population
        fig.update_layout(title=dict(text=title, font=dict(size=13)), margin=dict(l=50, r=10, t=40, b=40))
        return fig
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=x, y=y, mode="markers", name="events", hoverinfo="skip",
                               marker=dict(size=2, color="#bbbbbb", opacity=0.5)))
    fig.add_trace(go.Scattergl(x=hx, y=hy, mode="markers", name=population, hoverinfo="skip",
                               marker=dict(size=3, color=HIGHLIGHT_COLOR, opacity=0.8)))
    xv, xt = plotting.raw_ticks(x_scale, *x_range)
    yv, yt = plotting.raw_ticks(y_scale, *y_range)
    fig.update_xaxes(range=list(x_range), tickvals=xv, ticktext=xt, title_text=x_title, showgrid=True,
                     gridcolor="#eeeeee", zeroline=False)
    fig.update_yaxes(range=list(y_range), tickvals=yv, ticktext=yt, title_text=y_title, showgrid=True,
                     gridcolor="#eeeeee", zeroline=False)
    fig.update_layout(height=height, margin=dict(l=50, r=10, t=40, b=40), plot_bgcolor="white", showlegend=False,
                      title=dict(text=title, font=dict(size=13)))
    return fig
