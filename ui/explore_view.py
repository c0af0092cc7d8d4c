"""The Explore page's overlaid histograms: one marker of one population across patients."""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core.gates import AxisScale
from ui import cache, charts
from ui.app_state import common_channels
from ui.common import channel_label, plot_bins, plot_range, scale_select

ALL = "(all events)"
#: How each curve is scaled: FlowJo's "normalized to mode" first, the usual view of an overlay.
Y_SCALES = ("% of mode", "% of cells", "cells")
MAX_OVERLAID = 12


def population_options(records) -> list[str]:
    """The populations a histogram can be restricted to: every one some of ``records`` holds
    (labels, drawn gates' labels or an auto-gate result), largest total first."""
    totals: dict[str, int] = {}
    for record in records:
        if record.populations is None:
            continue
        for name, count in cache.population_counts(record.populations_token, record.populations).items():
            totals[name] = totals.get(name, 0) + count
    return [ALL] + sorted(totals, key=lambda n: (n.casefold() in ("other", "ungated", "unlabeled"), -totals[n], n))


def population_mask(record, population: str):
    """The events of ``population`` in ``record`` (None: every event), from the cached codes."""
    if population == ALL:
        return None
    if record.populations is None:
        return np.zeros(record.sample.n_events, dtype=bool)
    names = tuple(cache.population_counts(record.populations_token, record.populations))
    if population not in names:
        return np.zeros(record.sample.n_events, dtype=bool)
    codes = cache.population_codes(record.populations_token, names, record.populations)
    return codes == names.index(population)


def overlay_curves(records, channel: str, scale: dict, value_range: tuple, population: str = ALL,
                   bins: int = 200) -> list[dict]:
    """One curve per patient: the histogram of ``channel`` (display coordinates of ``scale``)
    over ``value_range`` for the events of ``population``: {"name", "counts", "centers",
    "cells"} (cells: events of the population, those outside the range included)."""
    from gating_core.reports import plotting

    curves = []
    bin_range, bins = plot_bins(tuple(r.token for r in records), channel, scale, [r.sample for r in records],
                                value_range, bins)
    for record in records:
        mask = population_mask(record, population)
        value_bins = cache.bin_indices(record.token, channel, scale, tuple(bin_range), bins, record.sample)
        counts, centers = plotting.histogram_from_bins(value_bins, bin_range, bins=bins, mask=mask)
        curves.append({"name": record.name, "counts": counts, "centers": centers,
                       "cells": int(record.sample.n_events if mask is None else mask.sum())})
    return curves


def overlay_section(store, names: list[str], default: list[str], first_index: int) -> None:
    """Histograms of one marker of one population, one curve per patient, overlaid or staggered,
    with each patient's count, median, geometric mean and CV of the marker over those cells."""
    st.subheader("Overlaid histograms")
    st.caption("One marker across patients, for all events or one population, each curve scaled to its own mode "
               "(or its cells) so patients of different sizes compare. Stagger offsets the curves to read many.")
    chosen = st.multiselect("Patients to overlay", names, default=default, key="ov_patients",
                            max_selections=MAX_OVERLAID, help=f"Up to {MAX_OVERLAID}.")
    if not chosen:
        st.info("Pick at least one patient to overlay.")
        return
    records = [store.patients[n] for n in chosen]
    samples = [r.sample for r in records]
    channels = common_channels(samples)
    if not channels:
        st.error("These patients share no channel name: they hold different panels. Pick patients of one "
                 "panel, or match names on the Data page where a marker carries another name.")
        return
    first = samples[0]
    c1, c2, c3, c4, c5 = st.columns([2, 1, 2, 1.3, 0.8])
    channel = c1.selectbox("Channel", channels, index=min(first_index, len(channels) - 1),
                           format_func=lambda c: channel_label(first, c), key="ex_h")
    scale = scale_select(c2, "Transform", channel, "ex_hs", store)
    population = c3.selectbox("Population", population_options(records), key="ov_population",
                              help="Labels, drawn gates' labels or the auto-gate result of each patient.")
    y_scale = c4.radio("Scale", Y_SCALES, key="ov_y", horizontal=False)
    stagger = c5.checkbox("Stagger", key="ov_stagger", help="Offset each curve above the one before.")
    tokens = tuple(r.token for r in records)
    value_range = plot_range(store, tokens, channel, scale, samples)
    curves = overlay_curves(records, channel, scale, value_range, population)
    label = channel_label(first, channel)
    title = label if population == ALL else f"{label} · {population}"
    st.plotly_chart(charts.overlay_histogram(curves, AxisScale.from_dict(scale), value_range, title, y_scale, stagger),
                    width="stretch", key="explore_hist")
    missing = [c["name"] for c in curves if c["cells"] == 0]
    if missing:
        st.caption(f"No cells of {population} in {', '.join(missing)}: no curve.")
    st.dataframe(overlay_table(records, channel, population, label), hide_index=True, width="stretch",
                 key="ov_table", column_config={"cells": st.column_config.NumberColumn(format="localized")})


def overlay_table(records, channel: str, population: str, label: str):
    """Per patient: the population's cells, and the median, geometric mean and CV of the marker
    over them (:class:`gating_core.reports.marker_stats.MarkerStatistics`, raw units)."""
    import pandas as pd

    from gating_core.gates import panel_scale
    from gating_core.reports.marker_stats import MarkerStatistics

    rows = []
    for record in records:
        sample = record.sample
        mask = population_mask(record, population)
        mask = np.ones(sample.n_events, dtype=bool) if mask is None else mask
        values = sample.events[:, [sample.channel_index(channel)]]
        stats = MarkerStatistics(values, [label], [panel_scale(channel, [sample]).cofactor])
        rows.append({"patient": record.name, "population": population, "cells": int(mask.sum()), **stats(mask)})
    return pd.DataFrame(rows)
