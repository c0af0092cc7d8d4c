"""Explore: scatter projections of any channels, several patients side by side; one marker's histograms
overlaid across patients."""

import numpy as np
import streamlit as st

from gating_core.gates import AxisScale
from gating_core.reports.plotting import population_colors
from ui import cache, charts, explore_view
from ui.app_state import common_channels
from ui.common import (axis_range_editor, channel_label, default_xy, density_bins, get_store, plot_bins, plot_range,
                       require_patients, scale_select, transform_editor)

store = get_store()
st.title("Explore the cells")
st.caption("Look at any two channels. Pseudocolor density bins every event; population view bins every "
           "event too and colours each bin by the population holding most of its events, paler where the "
           "bin holds few events. Population dots draw a random subsample of up to "
           f"{cache.MAX_DOTS:,} events per patient (counts always use all events). "
           "Patients shown side by side share their axes, so shifts between patients are visible.")
if not require_patients(store):
    st.stop()

names = list(store.patients)
chosen = st.multiselect("Patients", names, default=names[: min(3, len(names))], key="explore_patients",
                        help="Up to 4 side by side.", max_selections=4)
if not chosen:
    st.info("Pick at least one patient.")
    st.stop()
records = [store.patients[n] for n in chosen]
samples = [r.sample for r in records]
channels = common_channels(samples)
if len(channels) < 1:
    st.error("These patients share no channel name: they hold different panels. Pick patients of one "
             "panel, or match names on the Data page where a marker carries another name.")
    st.stop()
first = samples[0]
# The first view: scatter, or the channels that set the largest population of the first patient
# with populations apart. Chosen once: the same index on every rerun keeps the user's own choice.
first_view = st.session_state.get("ex_first_view")
if first_view is None or max(first_view) >= len(channels):
    shown = next((r for r in records if r.populations is not None), records[0])
    first_view = st.session_state["ex_first_view"] = default_xy(channels, shown.sample, shown.populations)
xi, yi = first_view
tokens = tuple(r.token for r in records)
# the Color choice -> ui.charts.scatter_panels' mode
CHART_MODES = {"density": "density", "population": "population bins", "population dots": "population"}


# A fragment: changing a channel, transform or colour reruns this section alone, not the
# histogram and the editors below (their elements are neither rebuilt nor sent again).
@st.fragment
def scatter_section():
    c1, c2, c3, c4, c5 = st.columns([2, 2, 1.3, 1.3, 1.6])
    x_ch = c1.selectbox("X channel", channels, index=xi, format_func=lambda c: channel_label(first, c),
                        key="ex_x")
    y_ch = c2.selectbox("Y channel", channels, index=yi, format_func=lambda c: channel_label(first, c),
                        key="ex_y")
    x_scale = scale_select(c3, "X transform", x_ch, "ex_xs", store)
    y_scale = scale_select(c4, "Y transform", y_ch, "ex_ys", store)
    has_pops = any(r.populations is not None for r in records)
    mode = c5.radio("Color", ["density", "population", "population dots"] if has_pops else ["density"],
                    key="ex_mode", help="Population colors need labels, drawn gates or an auto-gate result. "
                    "Population dots: a random subsample of events as dots, slower to draw.")

    x_range = plot_range(store, tokens, x_ch, x_scale, samples)
    y_range = plot_range(store, tokens, y_ch, y_scale, samples)
    bins = density_bins([s.n_events for s in samples])
    (x_bin_range, n_x), (y_bin_range, n_y) = (plot_bins(tokens, x_ch, x_scale, samples, x_range, bins),
                                              plot_bins(tokens, y_ch, y_scale, samples, y_range, bins))

    panels = []
    populations = {}
    if mode != "density":
        for r in records:
            populations[r.name] = (r.populations if r.populations is not None
                                   else np.full(r.sample.n_events, "unlabeled", dtype=object))
    all_pops = {p for r in records if mode != "density"
                for p in cache.population_counts(r.populations_token, populations[r.name])}
    colors = population_colors(sorted(all_pops, key=lambda p: (p.casefold() in ("other", "ungated"), p)))
    names = tuple(colors)  # the colour order: a bin's tie goes to the population listed first
    for r in records:
        title = f"{r.name} ({r.sample.n_events:,} events)"
        if mode == "density":
            grid = cache.density(r.token, "", x_ch, y_ch, x_scale, y_scale, x_bin_range, y_bin_range, (n_x, n_y),
                                 r.sample)
            panels.append({"title": title, "grid": grid})
        elif mode == "population":
            grid = cache.population_grid(r.token, r.populations_token, names, x_ch, y_ch, x_scale, y_scale,
                                         x_bin_range, y_bin_range, (n_x, n_y), r.sample, populations[r.name])
            panels.append({"title": title, "grid": grid, "populations": names})
        else:
            idx = cache.dots(r.token, r.sample.n_events)
            xs = cache.display_values(r.token, x_ch, x_scale, r.sample)[idx]
            ys = cache.display_values(r.token, y_ch, y_scale, r.sample)[idx]
            panels.append({"title": title, "x": xs, "y": ys,
                           "populations": np.asarray(populations[r.name])[idx]})
    fig = charts.scatter_panels(panels, AxisScale.from_dict(x_scale), AxisScale.from_dict(y_scale), x_range,
                                y_range, channel_label(first, x_ch), channel_label(first, y_ch), mode=CHART_MODES[mode],
                                colors=colors)
    st.plotly_chart(fig, width="stretch", key="explore_scatter")

    if mode != "density":
        st.markdown("**Population counts (all events)**")
        import pandas as pd

        table = pd.DataFrame({r.name: pd.Series(cache.population_counts(r.populations_token, r.populations))
                              for r in records if r.populations is not None}).fillna(0).astype(int)
        st.dataframe(table, width="stretch")


scatter_section()

explore_view.overlay_section(store, names, chosen, xi)

transform_editor(store, channels, first, "ex_tf")
axis_range_editor(store, channels, first, "ex_ar", tokens, samples)
