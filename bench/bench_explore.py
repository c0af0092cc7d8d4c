"""Benchmark: the server-side cost of each control change on Explore and Gate at 1,000,000 events.

Replays what ``pages/2_explore.py`` and ``pages/3_gate.py`` compute on a rerun, through the same
cached helpers (``ui.cache``, Streamlit's in-memory cache without a running app) and figure
builders (``ui.charts``), on one simulated 1M-event patient, and prints per control change the
seconds spent in each phase -- channel transform, shared axis range, the bins' lattice of channel
numbers (``ui.common.plot_bins``), density binning, histogram, subsample, figure building, figure
serialisation (what ``st.plotly_chart`` does: validate, then ``plotly.io.to_json``) -- and the
serialised figure size sent to the browser.

Each step is the first time the app sees that state (a control change); the last step goes
back to a state already seen, which the caches should answer. The sequence runs ``--repeats``
times as a patient the caches have not seen, and each figure is the fastest repeat: the machine
is shared, and other processes only ever add time. To compare with the code before a change, run
this file from an export of the older commit at the same moment (both see the same load).

Then the same control changes as whole page reruns in Streamlit's AppTest (every widget, table
and figure of the page; the Gate page with a gate tree and its back-gating), which is the
server's share of what the browser timing test (tests/test_browser_timing.py) logs.

Run: ``.venv/bin/python bench/bench_explore.py [--events N] [--no-pages]``.
"""

from __future__ import annotations

import argparse
import logging
import os
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
    from gating_core.reports.plotting import histogram_1d, population_colors
    from ui import cache, charts
    from ui.common import plot_bins

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
    with p.phase("lattice"):
        (x_bin_range, n_x), (y_bin_range, n_y), (h_bin_range, n_h) = (
            plot_bins(tokens, ch, sc, [sample], r) for ch, sc, r in ((state["x"], x_scale, x_range),
                                                                     (state["y"], y_scale, y_range),
                                                                     (state["h"], h_scale, h_range)))
    title = f"{record.name} ({sample.n_events:,} events)"
    colors = None
    if state["mode"] == "density":
        with p.phase("binning"):
            grid = cache.density(record.token, "", state["x"], state["y"], x_scale, y_scale, x_bin_range, y_bin_range,
                                 (n_x, n_y), sample)
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
        if hasattr(cache, "histogram"):
            hist = cache.histogram(record.token, state["h"], h_scale, h_bin_range, n_h, sample)
        else:  # the code before the bin cache (to measure the baseline with this same bench)
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
    from ui.common import plot_bins

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
    with p.phase("lattice"):
        (x_bin_range, n_x), (y_bin_range, n_y) = (plot_bins(tokens, state["x"], x_scale, [sample], x_range),
                                                  plot_bins(tokens, state["y"], y_scale, [sample], y_range))
    with p.phase("binning"):
        grid = cache.density(record.token, "", state["x"], state["y"], x_scale, y_scale, x_bin_range, y_bin_range,
                             (n_x, n_y), sample, _mask=None)
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


PHASES = ("transform", "range", "lattice", "binning", "subsample", "counts", "histogram", "figure", "serialise")


def run(n_events: int = 1_000_000, seed: int = 7, repeats: int = 3) -> list[tuple[str, Phases]]:
    """The control-change sequence ``repeats`` times, each time as a patient the caches have
    not seen (new tokens); per step and phase the fastest repeat (the shared machine's load
    only ever adds time)."""
    from gating_core.gates import panel_scale
    from gating_core.synthetic.patients import simulate_patient

    start = time.perf_counter()
    sample, labels = simulate_patient(seed, n_events=n_events, name="big_patient")
    sample = sample.compensate()
    print(f"simulated {sample.n_events:,} events x {len(sample.pnn)} channels in {time.perf_counter() - start:.1f} s")
    scales = {c: panel_scale(c, [sample]) for c in sample.pnn}
    binning_check(sample, {c: scales[c] for c in ("FL1-A", "FL4-A")})
    labels = labels.astype(object)  # as the app holds them (PatientRecord)
    ch = sample.pnn
    best: dict[str, Phases] = {}
    for _ in range(repeats):
        record = SimpleNamespace(name="big_patient", token=uuid.uuid4().hex, sample=sample, populations=labels,
                                 populations_token=uuid.uuid4().hex)
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
        for name, phases in results:
            if name in best:
                for key, seconds in phases.seconds.items():
                    best[name].seconds[key] = min(best[name].seconds[key], seconds)
            else:
                best[name] = phases
    return list(best.items())


def binning_check(sample, scales) -> None:
    """The cached-bin density against numpy.histogram2d on the same million events: identical
    counts, and what each costs (the bins of a channel once, then a bincount per pair)."""
    from gating_core.reports import plotting

    if not hasattr(plotting, "bin_indices"):
        return  # the code before the bin cache
    x = scales["FL1-A"].forward(sample.events[:, sample.channel_index("FL1-A")]).astype(np.float32)
    y = scales["FL4-A"].forward(sample.events[:, sample.channel_index("FL4-A")]).astype(np.float32)
    x_range, y_range = plotting.display_range(x), plotting.display_range(y)
    start = time.perf_counter()
    reference = plotting.density_grid(x, y, x_range, y_range, bins=200)
    t_hist2d = time.perf_counter() - start
    start = time.perf_counter()
    x_bins, y_bins = plotting.bin_indices(x, x_range, 200), plotting.bin_indices(y, y_range, 200)
    t_bins = (time.perf_counter() - start) / 2
    start = time.perf_counter()
    grid = plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins=200)
    t_count = time.perf_counter() - start
    same = all(np.array_equal(a, b) for a, b in zip(grid, reference))
    print(f"binning {sample.n_events:,} events: histogram2d {t_hist2d:.3f} s; bins of one channel {t_bins:.3f} s "
          f"(cached), then bincount of a pair {t_count:.4f} s ({t_hist2d / t_count:.0f}x less); "
          f"identical counts: {same}")


def page_reruns(n_events: int = 1_000_000, seed: int = 7, repeats: int = 3) -> list[tuple[str, float]]:
    """Whole page reruns in Streamlit's AppTest (every widget, table and figure of the page, the
    Gate page with a gate tree from the labels and its back-gating), per control change: the
    fastest of ``repeats`` sessions."""
    import tempfile

    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import AppTest, local_script_runner

    from gating_core.gates import panel_scale
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels
    from gating_core.library import PatientLibrary
    from gating_core.synthetic.patients import simulate_patient
    from gating_core.synthetic.sample_data import write_labels_csv, write_sample

    # AppTest compiles the page anew on every run; a running server keeps the compiled page
    shared = ScriptCache()
    local_script_runner.ScriptCache = lambda: shared
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sample, labels = simulate_patient(seed, n_events=n_events, name="big_patient")
        write_sample(tmp / "big_patient.fcs", sample)
        write_labels_csv(tmp / "big_patient.labels.csv", labels)
        library = PatientLibrary(tmp / "library")
        library.import_files([tmp / "big_patient.fcs", tmp / "big_patient.labels.csv"])
        stored = library.load_sample("big_patient", compensate=True)
        scales = {c: panel_scale(c, [stored]) for c in stored.pnn}
        tree = tree_from_labels(stored, labels, SAMPLE_DATA_HIERARCHY, scales)
        library.save_gates("big_patient", tree.to_dict())
        os.environ["GATING_LIBRARY"] = str(tmp / "library")
        for _ in range(repeats):  # a new session each time: the patient gets new tokens, caches miss
            at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=600)
            at.run()

            def timed(name, change=None, page=None):
                if page:
                    at.switch_page(page)
                if change:
                    change()
                start = time.perf_counter()
                at.run()
                assert not at.exception, at.exception
                seconds = time.perf_counter() - start
                best[name] = min(best.get(name, seconds), seconds)

            timed("explore: first view (reads the patient)", page="pages/2_explore.py")
            timed("explore: x channel", lambda: at.selectbox(key="ex_x").set_value("FL1-A"))
            timed("explore: y channel", lambda: at.selectbox(key="ex_y").set_value("FL4-A"))
            timed("explore: x transform logicle", lambda: at.selectbox(key="ex_xs_FL1-A").set_value("logicle"))
            timed("explore: view population", lambda: at.radio(key="ex_mode").set_value("population"))
            timed("explore: view density (seen before)", lambda: at.radio(key="ex_mode").set_value("density"))
            timed("gate: first view (9 gates)", page="pages/3_gate.py")
            timed("gate: x channel", lambda: at.selectbox(key="g_x").set_value("FL3-A"))
            timed("gate: y channel", lambda: at.selectbox(key="g_y").set_value("FL6-A"))
            timed("gate: parent population", lambda: at.selectbox(key="gate_parent").set_value("T cells"))
    return list(best.items())


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
    parser.add_argument("--repeats", type=int, default=3, help="fastest of this many runs per step")
    parser.add_argument("--no-pages", action="store_true", help="skip the whole-page reruns (AppTest)")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    report(run(args.events, repeats=args.repeats))
    if not args.no_pages:
        reruns = page_reruns(args.events, repeats=args.repeats)
        print(f"\nwhole page reruns (AppTest, server side, fastest of {args.repeats} sessions):")
        for name, seconds in reruns:
            print(f"  {name:42s}{seconds:7.3f} s")
        changes = [s for name, s in reruns if "first view" not in name and "seen before" not in name]
        print(f"page reruns on a control change: worst {max(changes):.3f} s, median {float(np.median(changes)):.3f} s")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
