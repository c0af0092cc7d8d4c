"""Benchmark: the server-side cost of each control change on Explore and Gate at 1,000,000 events.

Replays what ``pages/2_explore.py`` and ``pages/3_gate.py`` compute on a rerun, through the same
cached helpers (``ui.cache``, Streamlit's in-memory cache without a running app) and figure
builders (``ui.charts``), on one simulated 1M-event patient, and prints per control change the
seconds spent in each phase -- channel transform, shared axis range, density binning,
histogram, subsample, figure building, figure serialisation (what ``st.plotly_chart`` does:
validate, then ``plotly.io.to_json``) -- and the serialised figure size sent to the browser.

Each step is the first time the app sees that state (a control change); the last step goes
back to a state already seen, which the caches should answer.

Run: ``.venv/bin/python bench/bench_explore.py [--events N]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

logging.getLogger("streamlit").setLevel(logging.ERROR)  # "no runtime" warnings of st.cache_data


class Phases:
    """Seconds per named phase of one page run."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.payload = 0

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def serialise(fig, phases: Phases) -> None:
    """What ``st.plotly_chart`` does with a figure before sending it."""
    import plotly.io
    import plotly.tools

    with phases.phase("serialise"):
        figure = plotly.tools.return_figure_from_figure_or_data(fig, validate_figure=True)
        spec = plotly.io.to_json(figure, validate=False)
    phases.payload += len(spec)


def explore_run(record, state, scales) -> Phases:
    """One rerun of the Explore page for one patient (``state``: the page's controls)."""
    from gating_core.gates import AxisScale, with_kind
    from gating_core.plotting import histogram_1d, population_colors
    from ui import cache, charts

    p = Phases()
    sample = record.sample
    x_scale = with_kind(scales[state["x"]], state["xs"]).to_dict()
    y_scale = with_kind(scales[state["y"]], state["ys"]).to_dict()
    h_scale = with_kind(scales[state["h"]], state["hs"]).to_dict()
    tokens = (record.token,)
    with p.phase("transform"):
        for ch, sc in ((state["x"], x_scale), (state["y"], y_scale), (state["h"], h_scale)):
            cache.display_values(record.token, ch, sc, sample)
    with p.phase("range"):
        x_range = cache.shared_range(tokens, state["x"], x_scale, [sample])
        y_range = cache.shared_range(tokens, state["y"], y_scale, [sample])
        h_range = cache.shared_range(tokens, state["h"], h_scale, [sample])
    title = f"{record.name} ({sample.n_events:,} events)"
    colors = None
    if state["mode"] == "density":
        with p.phase("binning"):
            grid = cache.density(record.token, "", state["x"], state["y"], x_scale, y_scale, x_range, y_range, 200,
                                 sample)
        panels = [{"title": title, "grid": grid}]
    else:
        with p.phase("subsample"):
            idx = cache.dots(record.token, sample.n_events)
            xs = cache.display_values(record.token, state["x"], x_scale, sample)[idx]
            ys = cache.display_values(record.token, state["y"], y_scale, sample)[idx]
            pops = record.populations
            panels = [{"title": title, "x": xs, "y": ys, "populations": np.asarray(pops)[idx]}]
        with p.phase("counts"):
            counts = cache.population_counts(record.populations_token, pops)
        colors = population_colors(sorted(counts, key=lambda n: (n.casefold() in ("other", "ungated"), n)))
    with p.phase("histogram"):
        hist = histogram_1d(cache.display_values(record.token, state["h"], h_scale, sample), h_range)
    with p.phase("figure"):
        fig = charts.scatter_panels(panels, AxisScale.from_dict(x_scale), AxisScale.from_dict(y_scale), x_range,
                                    y_range, state["x"], state["y"], mode=state["mode"], colors=colors)
        hist_fig = charts.histogram_panels([{"title": record.name, "hist": hist}], AxisScale.from_dict(h_scale),
                                           h_range, state["h"])
    serialise(fig, p)
    serialise(hist_fig, p)
    return p


def gate_run(record, state, scales) -> Phases:
    """One rerun of the Gate page's plot (all events, lasso / box tool, no gates yet)."""
    from gating_core.gates import AxisScale, with_kind
    from ui import cache, charts

    p = Phases()
    sample = record.sample
    x_scale = with_kind(scales[state["x"]], state["xs"]).to_dict()
    y_scale = with_kind(scales[state["y"]], state["ys"]).to_dict()
    tokens = (record.token,)
    with p.phase("transform"):
        cache.display_values(record.token, state["x"], x_scale, sample)
        cache.display_values(record.token, state["y"], y_scale, sample)
    with p.phase("range"):
        x_range = cache.shared_range(tokens, state["x"], x_scale, [sample])
        y_range = cache.shared_range(tokens, state["y"], y_scale, [sample])
    with p.phase("binning"):
        grid = cache.density(record.token, "", state["x"], state["y"], x_scale, y_scale, x_range, y_range, 200,
                             sample, _mask=None)
    with p.phase("subsample"):
        idx = cache.dots(record.token, sample.n_events)
        xs = cache.display_values(record.token, state["x"], x_scale, sample)[idx]
        ys = cache.display_values(record.token, state["y"], y_scale, sample)[idx]
    with p.phase("figure"):
        fig = charts.scatter_panels([{"title": record.name, "grid": grid, "x": xs, "y": ys}],
                                    AxisScale.from_dict(x_scale), AxisScale.from_dict(y_scale), x_range, y_range,
                                    state["x"], state["y"], mode="density", height=560, selectable=True)
    serialise(fig, p)
    return p


PHASES = ("transform", "range", "binning", "subsample", "counts", "histogram", "figure", "serialise")


def run(n_events: int = 1_000_000, seed: int = 7) -> list[tuple[str, Phases]]:
    from gating_core.gates import panel_scale
    from gating_core.synthetic.patients import simulate_patient

    start = time.perf_counter()
    sample, labels = simulate_patient(seed, n_events=n_events, name="big_patient")
    sample = sample.compensate()
    print(f"simulated {sample.n_events:,} events x {len(sample.pnn)} channels in {time.perf_counter() - start:.1f} s")
    scales = {c: panel_scale(c, [sample]) for c in sample.pnn}
    record = SimpleNamespace(name="big_patient", token=uuid.uuid4().hex, sample=sample, populations=labels,
                             populations_token=uuid.uuid4().hex)
    ch = sample.pnn
    # the page's defaults, then one control at a time, as the browser timing test changes them
    state = {"x": ch[0], "y": ch[1], "xs": scales[ch[0]].kind, "ys": scales[ch[1]].kind, "mode": "density",
             "h": ch[0], "hs": scales[ch[0]].kind}
    steps = [("explore: first view", {}),
             ("explore: x channel", {"x": ch[3]}),
             ("explore: y channel", {"y": ch[4]}),
             ("explore: x transform logicle", {"xs": "logicle"}),
             ("explore: view population", {"mode": "population"}),
             ("explore: back to density", {"mode": "density"})]
    results = []
    for name, change in steps:
        state.update(change)
        results.append((name, explore_run(record, state, scales)))
    gate_state = {"x": ch[0], "y": ch[1], "xs": scales[ch[0]].kind, "ys": scales[ch[1]].kind}
    for name, change in [("gate: first view", {}), ("gate: x channel", {"x": ch[5]}),
                         ("gate: y channel", {"y": ch[6]})]:
        gate_state.update(change)
        results.append((name, gate_run(record, gate_state, scales)))
    return results


def report(results) -> None:
    header = f"{'step':32s}" + "".join(f"{p:>10s}" for p in PHASES) + f"{'total':>9s}{'payload':>10s}"
    print(header)
    for name, p in results:
        cells = "".join(f"{p.seconds[k]:10.3f}" if k in p.seconds else f"{'-':>10s}" for k in PHASES)
        print(f"{name:32s}{cells}{p.total:9.3f}{p.payload / 1e3:8.0f}kB")
    changes = [p.total for name, p in results if "first view" not in name and "back to" not in name]
    print(f"control changes: worst {max(changes):.3f} s, median {float(np.median(changes)):.3f} s (server side, "
          "without Streamlit's own run overhead or the browser's drawing)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    report(run(args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
