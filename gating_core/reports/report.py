"""What a lab hands on: a batch table of every patient x population, and a one-page report.

* :func:`population_rows` / :func:`batch_table`: one row per patient and population with its
  parent, count, % of parent and % of total (and mean confidence when the populations come
  from a model), then the median, geometric mean and CV of each marker over the row's cells
  when the events are given (:mod:`gating_core.reports.marker_stats`). Counts come from the per-event populations, the one source every export
  shares (the gated CSV holds them): with a gate tree the rows are its gates in depth-first
  order, each under its parent gate and counting the cells of the populations below it
  (:func:`gating_core.gates.autogates.counted_cells`), then the populations no gate names; without
  one every population is a child of all events (% of parent is then % of total).
* :func:`patient_report_html`: one self-contained HTML page per patient (no script, no
  network): plots of the events with the gates drawn (inline SVG drawn here, so nothing needs
  plotly's static export), the population table, novelty and confidence, compensation and QC
  flags. Every string that comes from a user or a file (patient and file names, population and
  gate names, channel names, keywords) is HTML-escaped.

Nothing here imports streamlit or plotly; pandas is imported when a table is built.
"""

from __future__ import annotations

import datetime as _dt
import html
import math

import numpy as np

from gating_core.reports.plotting import display_range, population_colors, sample_channel_label, subsample_indices

__all__ = ["ALL_EVENTS", "BATCH_COLUMNS", "population_rows", "batch_table", "patient_report_html", "svg_scatter",
           "svg_histogram"]

ALL_EVENTS = "(all events)"
BATCH_COLUMNS = ["patient", "source", "population", "parent", "depth", "count", "% of parent", "% of total",
                 "mean confidence", "counted by"]
#: Dots drawn per plot of the report (a fixed subsample; counts always use every event).
REPORT_DOTS = 3000


def population_rows(patient: str, populations=None, *, tree=None, sample=None, memberships=None,
                    confidence=None, source: str = "", known=(), markers: bool = True):
    """Rows of :func:`batch_table` for one patient.

    Parameters
    ----------
    patient : str
    populations : array of shape (n_events,), optional
        Per-event population names (labels, a model's result or a reviewed result): the counts.
        Without them a tree's gates are counted by membership.
    tree : gating_core.gates.GateTree, optional
        When it holds gates, its gates come first, depth-first, each under its parent gate,
        counting the cells :func:`gating_core.gates.autogates.counted_cells` gives it; the populations
        no gate names follow as children of all events.
    sample : gating_core.fcs.Sample, optional
        Needed with a tree when ``memberships`` is not given. With ``markers``, each row also
        holds the median, geometric mean and CV of every marker over its cells
        (:class:`gating_core.reports.marker_stats.MarkerStatistics`, channels labelled "CD4 (FL3-A)").
    memberships : dict gate name -> bool array of shape (n_events,), optional
    confidence : array of shape (n_events,), optional
        Per-event confidence; gives the mean confidence of each row's events.
    source : str
        Where the populations come from ("labels", "auto-gate (model ...)"), copied to each row.
    known : population names of the model beside those present (see ``counted_cells``).
    markers : the marker statistics' columns, when ``sample`` is given.

    Returns
    -------
    DataFrame with :data:`BATCH_COLUMNS` (then the marker statistics' columns).
    """
    import pandas as pd

    from gating_core.gates.autogates import counted_cells
    from gating_core.reports.marker_stats import MarkerStatistics

    conf = None if confidence is None else np.asarray(confidence, dtype=np.float64)
    if populations is None and (tree is None or not len(tree)):
        raise ValueError(f"{patient}: neither populations nor a gate tree to count")
    rows = []
    stats = MarkerStatistics.of_sample(sample, sample_channel_label) if markers and sample is not None else None

    def row(name, parent, depth, cells, parent_count, total, counted_by):
        count = int(np.count_nonzero(cells))
        rows.append({"patient": patient, "source": source, "population": name, "parent": parent or ALL_EVENTS,
                     "depth": depth, "count": count,
                     "% of parent": 100.0 * count / parent_count if parent_count else 0.0,
                     "% of total": 100.0 * count / total if total else 0.0,
                     "mean confidence": float(conf[cells].mean()) if conf is not None and count else math.nan,
                     "counted by": counted_by, **(stats(cells) if stats is not None else {})})

    labels = None if populations is None else np.asarray(populations).astype(str)
    names = []
    if tree is not None and len(tree):
        masks = memberships if memberships is not None else tree.memberships(sample)
        total = int(labels.size) if labels is not None else int(next(iter(masks.values())).shape[0])
        if labels is None:
            cells_of = {n: np.asarray(m, dtype=bool) for n, m in masks.items()}
            named = set()
        else:
            cells_of = counted_cells(tree, labels, masks, known)
            named = set(np.unique(labels).tolist()) | {str(p) for p in known}
        for gate in tree.depth_first():
            parent_count = total if gate.parent is None else int(np.count_nonzero(cells_of[gate.parent]))
            counted_by = ("gates" if labels is None else "labels" if gate.name in named else "labels and gates")
            row(gate.name, gate.parent, tree.depth(gate.name) + 1, cells_of[gate.name], parent_count, total,
                counted_by)
        names = tree.names
    if labels is not None:
        total = int(labels.size)
        left, counts = np.unique(labels[~np.isin(labels, names)] if names else labels, return_counts=True)
        unassigned = {"other", "ungated"}
        order = sorted(range(len(left)), key=lambda i: (left[i].casefold() in unassigned, -counts[i], left[i]))
        for i in order:
            row(str(left[i]), None, 1, labels == left[i], total, total, "labels")
    return pd.DataFrame(rows, columns=BATCH_COLUMNS + (stats.columns if stats is not None else []))


def batch_table(entries):
    """Every patient x population: the rows of :func:`population_rows` for each entry.

    ``entries``: iterable of dicts of :func:`population_rows` keyword arguments, each with a
    ``patient`` key. Returns a DataFrame with :data:`BATCH_COLUMNS`, patients in the given order.
    """
    import pandas as pd

    frames = [population_rows(**entry) for entry in entries]
    if not frames:
        return pd.DataFrame(columns=BATCH_COLUMNS)
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------------------
# SVG scatter plots

_W, _H = 360, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 10, 24, 40


def _e(value) -> str:
    return html.escape(str(value), quote=True)



def _svg_frame(title, x_label, y_label, pw, ph, clip_id) -> list:
    """The opening of a report plot: the svg element, the plot area, title and axis labels, and
    a group clipped to the plot area (closed by the caller)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img" aria-label="{_e(title)}">',
            f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#888"/>',
            f'<text x="{_W / 2}" y="15" text-anchor="middle" font-size="12">{_e(title)}</text>',
            f'<text x="{_LEFT + pw / 2}" y="{_H - 8}" text-anchor="middle" font-size="11">{_e(x_label)}</text>',
            f'<text x="12" y="{_TOP + ph / 2}" text-anchor="middle" font-size="11" '
            f'transform="rotate(-90 12 {_TOP + ph / 2})">{_e(y_label)}</text>',
            f'<clipPath id="{_e(clip_id)}"><rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}"/></clipPath>',
            f'<g clip-path="url(#{_e(clip_id)})">']

def svg_scatter(x, y, colors, x_range, y_range, *, title: str = "", x_label: str = "", y_label: str = "",
                outlines=(), legend=None, clip_id: str = "clip", splits=()) -> str:
    """A scatter plot as an inline ``<svg>`` element.

    x, y : arrays (m,) in display coordinates; colors : array (m,) of "#rrggbb" strings;
    x_range, y_range : (lo, hi) of the axes; outlines : list of (name, (k, 2) array, text)
    polygons drawn over the dots with their name and a text (e.g. "12.3% of parent");
    legend : dict name -> color; clip_id : id of the plot area's clip path (unique per page);
    splits : list of ((x, y), {quadrant code: text}) quadrant splits, each drawn as its two
    dividing lines with every quadrant's text in its corner ("++": top right, "-+": top left...).
    Dots are 1.6 px squares, one path per colour.
    """
    x0, x1 = float(x_range[0]), float(x_range[1])
    y0, y1 = float(y_range[0]), float(y_range[1])
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    sx = pw / (x1 - x0) if x1 > x0 else 1.0
    sy = ph / (y1 - y0) if y1 > y0 else 1.0

    def px(v):
        return _LEFT + (np.asarray(v, dtype=np.float64) - x0) * sx

    def py(v):
        return _TOP + ph - (np.asarray(v, dtype=np.float64) - y0) * sy

    parts = _svg_frame(title, x_label, y_label, pw, ph, clip_id)
    xs, ys = px(x), py(y)
    colors = np.asarray(colors).astype(str)
    ok = np.isfinite(xs) & np.isfinite(ys)
    for color in dict.fromkeys(colors.tolist()):
        pick = ok & (colors == color)
        if not pick.any():
            continue
        path = "".join(f"M{a:.1f} {b:.1f}h1.6v1.6h-1.6z" for a, b in zip(xs[pick], ys[pick]))
        parts.append(f'<path fill="{_e(color)}" fill-opacity="0.7" d="{path}"/>')
    for name, outline, text in outlines:
        outline = np.asarray(outline, dtype=np.float64)
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px(outline[:, 0]), py(outline[:, 1])))
        parts.append(f'<polygon points="{points}" fill="none" stroke="#C00000" stroke-width="1.5"/>')
        cx = float(np.clip(px(outline[:, 0]).mean(), _LEFT + 4, _LEFT + pw - 4))
        cy = float(np.clip(py(outline[:, 1]).min() - 4, _TOP + 10, _TOP + ph - 4))
        parts.append(f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="middle" font-size="10" fill="#C00000">'
                     f'{_e(name)} {_e(text)}</text>')
    for (sx_, sy_), texts in splits:
        cx, cy = float(px(sx_)), float(py(sy_))
        parts.append(f'<line x1="{cx:.1f}" y1="{_TOP}" x2="{cx:.1f}" y2="{_TOP + ph}" stroke="#C00000" '
                     f'stroke-width="1.5"/><line x1="{_LEFT}" y1="{cy:.1f}" x2="{_LEFT + pw}" y2="{cy:.1f}" '
                     f'stroke="#C00000" stroke-width="1.5"/>')
        for code, text in texts.items():
            right, top = code[0] == "+", code[1] == "+"
            tx = _LEFT + pw - 4 if right else _LEFT + 4
            ty = _TOP + 12 if top else _TOP + ph - 5
            parts.append(f'<text x="{tx}" y="{ty}" text-anchor="{"end" if right else "start"}" font-size="10" '
                         f'fill="#C00000">{_e(text)}</text>')
    parts.append("</g>")
    for value, anchor_x, anchor in ((x0, _LEFT, "start"), (x1, _LEFT + pw, "end")):
        parts.append(f'<text x="{anchor_x}" y="{_TOP + ph + 12}" text-anchor="{anchor}" font-size="9" '
                     f'fill="#555">{value:.3g}</text>')
    for value, anchor_y in ((y0, _TOP + ph), (y1, _TOP + 8)):
        parts.append(f'<text x="{_LEFT - 3}" y="{anchor_y}" text-anchor="end" font-size="9" fill="#555">'
                     f'{value:.3g}</text>')
    if legend:
        for k, (name, color) in enumerate(legend.items()):
            parts.append(f'<rect x="{_LEFT + 4}" y="{_TOP + 4 + 11 * k}" width="8" height="8" fill="{_e(color)}"/>'
                         f'<text x="{_LEFT + 15}" y="{_TOP + 11 + 11 * k}" font-size="9">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_histogram(values, value_range, *, title: str = "", x_label: str = "", bands=(), bins: int = 120,
                  clip_id: str = "clip") -> str:
    """A histogram of one channel as an inline ``<svg>`` element, with range gates as bands.

    values : array (n,) in display coordinates; value_range : (lo, hi) of the axis;
    bands : list of (name, low, high, text), each shaded from low to high and named.
    """
    x0, x1 = float(value_range[0]), float(value_range[1])
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    sx = pw / (x1 - x0) if x1 > x0 else 1.0
    values = np.asarray(values, dtype=np.float64)
    counts, edges = np.histogram(values[np.isfinite(values)], bins=bins, range=(x0, x1))
    top = max(int(counts.max()) if counts.size else 0, 1)

    def px(v):
        return _LEFT + (float(v) - x0) * sx

    parts = _svg_frame(title, x_label, "events", pw, ph, clip_id)
    for k, (name, low, high, text) in enumerate(bands):
        a, b = px(low), px(high)
        parts.append(f'<rect x="{a:.1f}" y="{_TOP}" width="{max(b - a, 0.5):.1f}" height="{ph}" fill="#C00000" '
                     f'fill-opacity="0.12" stroke="#C00000" stroke-width="1.2"/>')
        cx = float(np.clip((a + b) / 2, _LEFT + 4, _LEFT + pw - 4))
        parts.append(f'<text x="{cx:.1f}" y="{_TOP + 12 + 11 * k}" text-anchor="middle" font-size="10" '
                     f'fill="#C00000">{_e(name)} {_e(text)}</text>')
    base = _TOP + ph
    path = [f"M{px(edges[0]):.1f} {base}"]
    for count, left, right in zip(counts, edges[:-1], edges[1:]):
        y = base - ph * count / top
        path.append(f"L{px(left):.1f} {y:.1f}L{px(right):.1f} {y:.1f}")
    path.append(f"L{px(edges[-1]):.1f} {base}Z")
    parts.append(f'<path fill="#3B5B92" fill-opacity="0.5" stroke="#3B5B92" d="{"".join(path)}"/>')
    parts.append("</g>")
    for value, anchor_x, anchor in ((x0, _LEFT, "start"), (x1, _LEFT + pw, "end")):
        parts.append(f'<text x="{anchor_x}" y="{_TOP + ph + 12}" text-anchor="{anchor}" font-size="9" '
                     f'fill="#555">{value:.3g}</text>')
    parts.append(f'<text x="{_LEFT - 3}" y="{_TOP + 8}" text-anchor="end" font-size="9" fill="#555">{top:,}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _axis_label(sample, pnn, scale) -> str:
    """Channel label, with the display transform when it is not linear (the axes are in it)."""
    label = sample_channel_label(sample, pnn)
    return label if scale.kind == "linear" else f"{label} [{scale.kind}]"


def _scale_of(sample, pnn):
    from gating_core.gates import panel_scale

    return panel_scale(pnn, [sample])


def _default_channels(sample) -> list[tuple[str, str]]:
    """Two plots for a flat result: scatter (FSC / SSC) and the first two other channels."""
    from gating_core.reports.qc import fluorescence_channels, time_channel_index

    names = sample.pnn
    fsc = next((n for n in names if n.upper().startswith("FSC") and n.upper().endswith("-A")),
               next((n for n in names if n.upper().startswith("FS")), None))
    ssc = next((n for n in names if n.upper().startswith("SSC") and n.upper().endswith("-A")),
               next((n for n in names if n.upper().startswith("SS")), None))
    other = [names[i] for i in fluorescence_channels(sample, time_channel_index(sample))]
    pairs = []
    if fsc and ssc:
        pairs.append((fsc, ssc))
    if len(other) >= 2:
        pairs.append((other[0], other[1]))
    if not pairs and len(names) >= 2:
        pairs.append((names[0], names[1]))
    return pairs


def _plots(sample, populations, tree, memberships, max_dots: int, counted=None) -> list[str]:
    from gating_core.gates import Band, Region, Split

    idx = subsample_indices(sample.n_events, max_dots, seed=0)
    svgs = []
    if tree is not None and len(tree):
        counted = counted if counted is not None else memberships
        groups: dict = {}
        for gate in tree.depth_first():
            if not gate.channels:
                continue  # no axes (a boolean gate): its cells are in the table
            groups.setdefault((gate.parent, gate.x_channel, gate.y_channel), []).append(gate)
        for (parent, xc, yc), gates in groups.items():
            first = gates[0]
            in_parent = np.ones(sample.n_events, bool) if parent is None else np.asarray(memberships[parent])
            parent_count = int(np.count_nonzero(counted[parent])) if parent is not None else sample.n_events

            def share(g):
                return f"{100.0 * int(np.count_nonzero(counted[g.name])) / max(parent_count, 1):.1f}%"

            title = f"{parent or ALL_EVENTS} \u2192 " + ", ".join(g.name for g in gates)
            # every gate drawn on the first one's axes, as it draws itself
            drawn = [(g, g.drawing(first.x_scale, first.y_scale)) for g in gates]
            x = first.x_scale.forward(sample.events[:, sample.channel_index(xc)])
            # the parent's events set the axes; a gate reaching past them is clipped, as on screen
            x_range = display_range(x[in_parent] if in_parent.any() else x)
            if yc is None:
                bands = [(g.name, d.low, d.high, share(g)) for g, d in drawn if isinstance(d, Band)]
                svgs.append(svg_histogram(x[in_parent], x_range, title=title,
                                          x_label=_axis_label(sample, xc, first.x_scale), bands=bands,
                                          clip_id=f"clip{len(svgs)}"))
                continue
            y = first.y_scale.forward(sample.events[:, sample.channel_index(yc)])
            y_range = display_range(y[in_parent] if in_parent.any() else y)
            shown = idx[in_parent[idx]]
            outlines = [(g.name, d.outline, share(g)) for g, d in drawn if isinstance(d, Region)]
            splits: dict = {}  # split point -> {quadrant code: label}: one pair of lines per split
            for g, d in drawn:
                if isinstance(d, Split):
                    splits.setdefault(d.point, {})[d.region] = f"{g.name} {share(g)}"
            svgs.append(svg_scatter(x[shown], y[shown], np.full(shown.size, "#3B5B92"), x_range, y_range,
                                    title=title, x_label=_axis_label(sample, xc, first.x_scale),
                                    y_label=_axis_label(sample, yc, first.y_scale), outlines=outlines,
                                    splits=list(splits.items()), clip_id=f"clip{len(svgs)}"))
        return svgs
    labels = np.asarray(populations).astype(str)
    names = sorted(set(labels.tolist()), key=lambda p: (p.casefold() in ("other", "ungated"), p))
    colors = population_colors(names)
    dot_colors = np.array([colors[p] for p in labels[idx]])
    for xc, yc in _default_channels(sample):
        xs, ys = _scale_of(sample, xc), _scale_of(sample, yc)
        x = xs.forward(sample.events[:, sample.channel_index(xc)])
        y = ys.forward(sample.events[:, sample.channel_index(yc)])
        svgs.append(svg_scatter(x[idx], y[idx], dot_colors, display_range(x), display_range(y),
                                title="populations", x_label=_axis_label(sample, xc, xs),
                                y_label=_axis_label(sample, yc, ys), legend=colors,
                                clip_id=f"clip{len(svgs)}"))
    return svgs


# --------------------------------------------------------------------------------------------
# The page

_STYLE = """
body{font-family:Helvetica,Arial,sans-serif;font-size:12px;margin:18px;color:#111;max-width:1150px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:14px;margin:14px 0 4px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}.warn{color:#9C2B00;font-weight:bold}.ok{color:#1B6B2B}
.plots svg{margin:2px;border:0}.meta{color:#555}ul{margin:2px 0 2px 18px;padding:0}
@media print{body{margin:0}.plots svg{width:32%;height:auto}}
"""


def _table_html(frame, formats: dict) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row):
            fmt = formats.get(column)
            if isinstance(value, float) and math.isnan(value):
                text = "\u2014"
            elif fmt is not None:
                text = fmt.format(value)
            else:
                text = str(value)
            cells.append(f"<td>{_e(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _novelty_html(novelty) -> str:
    if novelty is None:
        return "<p class='meta'>No novelty score: these populations are labels, not a model's result.</p>"
    get = (lambda k: novelty.get(k)) if isinstance(novelty, dict) else (lambda k: getattr(novelty, k, None))
    score, threshold, novel = get("score"), get("threshold"), bool(get("is_novel"))
    text = (f"novelty score {float(score):.2f} (threshold {float(threshold):.2f}): "
            + ("UNLIKE every training patient: review the populations by hand." if novel
               else "resembles the training patients."))
    return f"<p class='{'warn' if novel else 'ok'}'>{_e(text)}</p>"


def patient_report_html(patient: str, sample, populations, *, confidence=None, novelty=None, tree=None,
                        memberships=None, source: str = "", model_name: str = "", file_name: str = "",
                        low_confidence: float = 0.6, qc=None, compensation=None, generated: str | None = None,
                        max_dots: int = REPORT_DOTS, known=(), gate_notes=None) -> str:
    """One self-contained HTML page for one patient.

    Parameters
    ----------
    patient : str
    sample : Sample with events of shape (n_events, n_channels)
    populations : array (n_events,) of population names
    confidence : array (n_events,), optional (a model's result; absent for labels)
    novelty : object or dict with score, threshold, is_novel, optional
    tree, memberships : gate tree of the patient and its memberships, optional
    source, model_name, file_name : shown in the header (escaped)
    low_confidence : the confidence below which cells are counted as uncertain
    qc : gating_core.reports.qc.QualityReport, optional (computed when None)
    compensation : gating_core.reports.qc.CompensationInfo, optional (computed when None)
    generated : timestamp text (default: now, UTC)
    known : population names of the model beside those present (see ``population_rows``)
    gate_notes : dict gate name -> text, optional: gates kept as the template drew them and why

    Returns
    -------
    str: the HTML document (UTF-8 text, no external resource).
    """
    from gating_core.reports.qc import compensation_info, quality_flags

    qc = qc if qc is not None else quality_flags(sample)
    compensation = compensation if compensation is not None else compensation_info(sample)
    if tree is not None and len(tree) and memberships is None:
        memberships = tree.memberships(sample)
    generated = generated or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    # the marker statistics stay in the batch table and the statistics CSV: a page holds the counts
    table = population_rows(patient, populations, tree=tree, sample=sample, memberships=memberships,
                            confidence=confidence, source=source, known=known, markers=False)
    counted = None
    if tree is not None and len(tree):
        from gating_core.gates.autogates import counted_cells

        counted = counted_cells(tree, populations, memberships, known)
    shown = table.drop(columns=["patient", "source"] + (["mean confidence"] if confidence is None else []))
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{_e(patient)}: gating report</title><style>{_STYLE}</style></head><body>",
             f"<h1>{_e(patient)}</h1>",
             "<p class='meta'>" + " \u00b7 ".join(_e(t) for t in (
                 f"{sample.n_events:,} events, {len(sample.channels)} channels",
                 f"file {file_name}" if file_name else "", f"populations: {source}" if source else "",
                 f"model {model_name}" if model_name else "", f"generated {generated}") if t) + "</p>"]
    parts.append("<h2>Novelty and confidence</h2>" + _novelty_html(novelty))
    if confidence is not None:
        conf = np.asarray(confidence, dtype=np.float64)
        low = int((conf < low_confidence).sum())
        parts.append(f"<p>Mean confidence {conf.mean():.3f}; {low:,} cells ({100.0 * low / max(conf.size, 1):.1f}%) "
                     f"below {low_confidence:.2f}.</p>")
    parts.append("<h2>Populations</h2>" + _table_html(shown, {"count": "{:,}", "% of parent": "{:.1f}",
                                                            "% of total": "{:.2f}", "mean confidence": "{:.3f}"}))
    if gate_notes:
        parts.append("<p class='warn'>Gates kept as the template drew them:</p><ul>"
                     + "".join(f"<li>{_e(name)}: {_e(why)}</li>" for name, why in gate_notes.items()) + "</ul>")
    parts.append("<div class='plots'>" + "".join(_plots(sample, populations, tree, memberships, max_dots, counted))
                 + "</div>")
    parts.append("<h2>Compensation</h2><p>" + _e(compensation.summary) + "</p>")
    if compensation.notes:
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in compensation.notes) + "</ul>")
    if compensation.matrix is not None:
        matrix = compensation.to_frame().reset_index().rename(columns={"index": "spillover"})
        parts.append(_table_html(matrix, {c: "{:.4f}" for c in matrix.columns[1:]}))
    parts.append("<h2>Quality flags</h2>")
    if qc.flags:
        parts.append("<ul>" + "".join(f"<li class='warn'>{_e(f)}</li>" for f in qc.flags) + "</ul>")
    else:
        parts.append("<p class='ok'>No saturation above "
                     f"{100 * qc.thresholds.get('saturation', 0.01):g}% and no drift flagged.</p>")
    if qc.notes:
        parts.append("<ul>" + "".join(f"<li class='meta'>{_e(n)}</li>" for n in qc.notes) + "</ul>")
    parts.append("</body></html>")
    return "".join(parts)
