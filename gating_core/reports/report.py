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
  network): plots of the events with the gates drawn (inline SVG, chosen here and drawn by
  :mod:`gating_core.reports.svg_plots`, so nothing needs plotly's static export), the population table, novelty and confidence, compensation and QC
  flags. Every string that comes from a user or a file (patient and file names, population and
  gate names, channel names, keywords) is HTML-escaped.

Nothing here imports streamlit or plotly; pandas is imported when a table is built.
"""

from __future__ import annotations

import datetime as _dt
import math

import numpy as np

from gating_core.reports.plotting import (display_range, population_colors, raw_ticks, sample_channel_label,
                                         subsample_indices)
from gating_core.reports.svg_plots import _e, svg_histogram, svg_scatter

__all__ = ["ALL_EVENTS", "BATCH_COLUMNS", "population_rows", "batch_table", "patient_report_html"]

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
# The page's plots

def _axis_label(sample, pnn, scale) -> str:
    """Channel label, with the display transform when it is not linear (the axes are in it)."""
    label = sample_channel_label(sample, pnn)
    return label if scale.kind == "linear" else f"{label} [{scale.kind}]"


def _scale_of(sample, pnn):
    from gating_core.gates import panel_scale

    return panel_scale(pnn, [sample])


#: The report's plots are about 300 pixels wide: ticks keep a tenth of the axis (30 px) apart,
#: where "-1", "0" and "1" at the 4% of the app's wider plots ran together.
REPORT_TICK_GAP = 0.1
#: At most this many plots for a result without a gate tree.
MAX_FLAT_PLOTS = 4
#: Populations that collect what the others leave: no channel pair of their own is looked for.
CATCH_ALL_NAMES = ("other", "ungated", "unknown", "unlabeled", "unlabelled")
#: Events that choose the plots' channels (drawn evenly, as the plots' dots are).
PAIR_CHOICE_EVENTS = 50_000


def channel_pairs(sample, populations=None) -> list[tuple[str, str]]:
    """The plots of a result without a gate tree: scatter (FSC / SSC) when the file has it, then,
    for each population (the largest first, catch-alls left out), the two other channels that set
    it apart most from the rest of the cells (difference of means over the pooled spread, on the
    panel's display scale), each pair once; without populations, the first two other channels.
    The first two channels of a mass cytometry panel rarely separate anything: in a multicenter
    sample, CCR6 and CD20 put the T cells and the monocytes in one corner."""
    from gating_core.reports.qc import fluorescence_channels, time_channel_index

    names = sample.pnn
    fsc = next((n for n in names if n.upper().startswith("FSC") and n.upper().endswith("-A")),
               next((n for n in names if n.upper().startswith("FS")), None))
    ssc = next((n for n in names if n.upper().startswith("SSC") and n.upper().endswith("-A")),
               next((n for n in names if n.upper().startswith("SS")), None))
    other = [names[i] for i in fluorescence_channels(sample, time_channel_index(sample))]
    other = [n for n in other if n not in (fsc, ssc)]
    pairs = []
    if fsc and ssc:
        pairs.append((fsc, ssc))
    if len(other) >= 2 and populations is not None:
        pairs += _separating_pairs(sample, np.asarray(populations).astype(str), other, MAX_FLAT_PLOTS - len(pairs))
    if len(pairs) < 2 and len(other) >= 2 and (other[0], other[1]) not in pairs:
        pairs.append((other[0], other[1]))
    if not pairs and len(names) >= 2:
        pairs.append((names[0], names[1]))
    return pairs


def _separating_pairs(sample, labels, channels, limit: int) -> list[tuple[str, str]]:
    idx = subsample_indices(sample.n_events, PAIR_CHOICE_EVENTS, seed=0)
    values = np.column_stack([_scale_of(sample, c).forward(sample.events[idx, sample.channel_index(c)])
                              for c in channels]).astype(np.float64)
    labels = labels[idx]
    found, counts = np.unique(labels, return_counts=True)
    pairs: list[tuple[str, str]] = []
    for name in found[np.argsort(-counts, kind="stable")]:
        if len(pairs) >= limit:
            break
        inside = labels == name
        if str(name).casefold() in CATCH_ALL_NAMES or inside.sum() < 2 or (~inside).sum() < 2:
            continue
        spread = np.sqrt((values[inside].var(axis=0) + values[~inside].var(axis=0)) / 2)
        apart = np.abs(values[inside].mean(axis=0) - values[~inside].mean(axis=0)) / np.maximum(spread, 1e-12)
        best = np.argsort(-apart, kind="stable")[:2]
        pair = (channels[best[0]], channels[best[1]])
        if not any(set(pair) == set(p) for p in pairs):
            pairs.append(pair)
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
                                          clip_id=f"clip{len(svgs)}", x_ticks=raw_ticks(first.x_scale, *x_range, min_gap_share=REPORT_TICK_GAP)))
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
                                    splits=list(splits.items()), clip_id=f"clip{len(svgs)}",
                                    x_ticks=raw_ticks(first.x_scale, *x_range, min_gap_share=REPORT_TICK_GAP),
                                    y_ticks=raw_ticks(first.y_scale, *y_range, min_gap_share=REPORT_TICK_GAP)))
        return svgs
    labels = np.asarray(populations).astype(str)
    names = sorted(set(labels.tolist()), key=lambda p: (p.casefold() in ("other", "ungated"), p))
    colors = population_colors(names)
    dot_colors = np.array([colors[p] for p in labels[idx]])
    for xc, yc in channel_pairs(sample, labels):
        xs, ys = _scale_of(sample, xc), _scale_of(sample, yc)
        x = xs.forward(sample.events[:, sample.channel_index(xc)])
        y = ys.forward(sample.events[:, sample.channel_index(yc)])
        x_range, y_range = display_range(x), display_range(y)
        svgs.append(svg_scatter(x[idx], y[idx], dot_colors, x_range, y_range,
                                title="populations", x_label=_axis_label(sample, xc, xs),
                                y_label=_axis_label(sample, yc, ys), legend=colors,
                                clip_id=f"clip{len(svgs)}", x_ticks=raw_ticks(xs, *x_range, min_gap_share=REPORT_TICK_GAP),
                                y_ticks=raw_ticks(ys, *y_range, min_gap_share=REPORT_TICK_GAP)))
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


def _novelty_html(novelty, accepted: bool = False) -> str:
    """The report's novelty lines from a Novelty or its stored dict (the reports sit beside the
    model and import nothing of it, so the fields are read here). Once the populations were
    reviewed and ``accepted``, a flag is what the gating said, not a task left."""
    if novelty is None:
        return "<p class='meta'>No novelty score: these populations are labels, not a model's result.</p>"
    get = (lambda k: novelty.get(k)) if isinstance(novelty, dict) else (lambda k: getattr(novelty, k, None))
    score, threshold, novel = get("score"), get("threshold"), bool(get("is_novel"))
    disagreement, review_above = get("disagreement"), get("disagreement_threshold")
    disagree = disagreement is not None and review_above is not None and float(disagreement) > float(review_above)
    task = ": flagged for review when gated; reviewed and accepted." if accepted else ": review the populations by hand."
    text = (f"novelty score {float(score):.2f} (threshold {float(threshold):.2f}): "
            + (f"UNLIKE every training patient{task}" if novel else "resembles the training patients."))
    html = f"<p class='{_flag_class(novel, accepted)}'>{_e(text)}</p>"
    if disagreement is not None:
        text = (f"the transfer model and the patient's own populations disagree on {float(disagreement):.1%} "
                f"of its cells (review above {float(review_above):.0%})" + (task if disagree else "."))
        html += f"<p class='{_flag_class(disagree, accepted)}'>{_e(text)}</p>"
    return html


def _flag_class(flagged: bool, accepted: bool) -> str:
    return "ok" if not flagged else "meta" if accepted else "warn"


def _review_html(cells_corrected: int | None, accepted: bool, gates_before_correction: bool) -> str:
    """What a person did to the model's populations: cells corrected, accepted as labels, and
    gates adjusted before cells were corrected (which may no longer enclose them)."""
    lines = []
    if cells_corrected is not None:
        lines.append(f"<p>Reviewed: {cells_corrected:,} cells corrected by hand"
                     + ("; accepted as the patient's labels." if accepted else ".") + "</p>")
    elif accepted:
        lines.append("<p>Reviewed and accepted as the patient's labels.</p>")
    if gates_before_correction:
        lines.append("<p class='warn'>The gates were adjusted by hand before cells were corrected: they may no "
                     "longer enclose the corrected populations. The counts and the shares on the plots are of the "
                     "corrected cells, not of the events inside each gate.</p>")
    return "".join(lines)


def patient_report_html(patient: str, sample, populations, *, confidence=None, novelty=None, tree=None,
                        memberships=None, source: str = "", model_name: str = "", file_name: str = "",
                        low_confidence: float = 0.6, qc=None, compensation=None, generated: str | None = None,
                        max_dots: int = REPORT_DOTS, known=(), gate_notes=None, cells_corrected: int | None = None,
                        accepted: bool = False, gates_before_correction: bool = False) -> str:
    """One self-contained HTML page for one patient.

    Parameters
    ----------
    patient : str
    sample : Sample with events of shape (n_events, n_channels)
    populations : array (n_events,) of population names
    confidence : array (n_events,), optional (a model's result; absent for labels)
    novelty : object or dict with score, threshold, is_novel (and disagreement,
        disagreement_threshold when measured), optional
    tree, memberships : gate tree of the patient and its memberships, optional
    source, model_name, file_name : shown in the header (escaped)
    low_confidence : the confidence below which cells are counted as uncertain
    qc : gating_core.reports.qc.QualityReport, optional (computed when None)
    compensation : gating_core.reports.qc.CompensationInfo, optional (computed when None)
    generated : timestamp text (default: now, UTC)
    known : population names of the model beside those present (see ``population_rows``)
    gate_notes : dict gate name -> text, optional: gates kept as the template drew them and why
    cells_corrected : cells a person corrected in review, optional (None: not reviewed)
    accepted : whether a person accepted these populations as the patient's labels
    gates_before_correction : whether the gates were adjusted by hand before cells were corrected

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
    parts.append("<h2>Novelty and confidence</h2>" + _novelty_html(novelty, accepted)
                 + _review_html(cells_corrected, accepted, gates_before_correction))
    if confidence is not None:
        conf = np.asarray(confidence, dtype=np.float64)
        low = int((conf < low_confidence).sum())
        parts.append(f"<p>Mean confidence {conf.mean():.3f}; {low:,} cells ({100.0 * low / max(conf.size, 1):.1f}%) "
                     f"below {low_confidence:.2f}.</p>")
    parts.append("<h2>Populations</h2>" + _table_html(shown, {"count": "{:,}", "% of parent": "{:.1f}",
                                                            "% of total": "{:.2f}", "mean confidence": "{:.3f}"}))
    ways = set(shown["counted by"]) if "counted by" in shown else set()
    if ways:
        meaning = {"labels": "each cell in the population it is called, from " + (source or "its labels"),
                   "gates": "the cells inside the drawn gate",
                   "labels and gates": "the cells counted below the gate, and those inside it whose population "
                                       "no gate names"}
        parts.append("<p class='meta'>Counted by: " + "; ".join(f"<i>{_e(w)}</i>, {_e(meaning[w])}" for w in
                                                                  sorted(ways) if w in meaning) + ".</p>")
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
