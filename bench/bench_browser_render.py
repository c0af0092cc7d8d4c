"""Benchmark: what the browser spends drawing each kind of scatter figure the app sends.

The app's figures are built by ``ui.charts`` from one simulated patient: a density heatmap
(Explore, Gate, Auto-gate), the same with a layer of invisible points under it (the other way
to carry lasso selection, as WebGL or as SVG points: what it would cost), Explore's population
view as dots (up to 20,000 coloured WebGL dots: its "population dots" option and Auto-gate's
plot) and as an image (every event binned, each bin in its majority population's colour: one
PNG image), beside the same picture sent as an RGBA array, as a discrete-colour heatmap, and
with hover text per bin.
Each figure is serialised as ``st.plotly_chart`` sends it and drawn with Plotly's own ``newPlot``
in the Chromium the browser tests use (headless, no GPU: WebGL is drawn in software),
``--repeats`` times, from a blank plot to the first frame after it; the printed figures are the
milliseconds of each repeat, the JSON's size, and each figure's median as a ratio to the heatmap
alone and (population views) to the 20,000 dots, measured in the same run.

Run: ``.venv/bin/python bench/bench_browser_render.py [--repeats 5] [--dots 20000]``. Needs
``/usr/bin/chromium`` (``make chromium``) and Playwright.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.gates import AxisScale  # noqa: E402
from gating_core.reports import plotting, population_view  # noqa: E402
from gating_core.synthetic.patients import simulate_patient  # noqa: E402
from ui import charts  # noqa: E402

CHROMIUM = "/usr/bin/chromium"

DRAW_JS = """(spec) => { const t0 = performance.now(); Plotly.purge('g');
  return Plotly.newPlot('g', spec.data, spec.layout, {displaylogo: false}).then(() =>
    new Promise((done) => requestAnimationFrame(() => setTimeout(() => done(performance.now() - t0), 0)))); }"""


def figures(n_dots: int) -> dict:
    """The figures to draw, as Plotly JSON dicts, from one simulated 200,000-event patient."""
    import plotly.graph_objects as go

    sample, labels = simulate_patient(14, n_events=200_000, name="render")
    x, y = (sample.events[:, sample.channel_index(c)] for c in ("FSC-A", "SSC-A"))
    scale = AxisScale.from_dict({"kind": "linear"})
    x_range, y_range = plotting.display_range([x]), plotting.display_range([y])
    grid = plotting.density_grid(x, y, x_range, y_range, 200)
    dots = plotting.subsample_indices(len(x), n_dots, seed=0)
    panel = {"title": "render", "grid": grid}
    density = charts.scatter_panels([panel], scale, scale, x_range, y_range, "FSC-A", "SSC-A", mode="density",
                                     height=560, selectable=True)
    out = {"density (Gate, Explore)": density}
    for name, trace, count in (("density + invisible WebGL layer (Gate before)", go.Scattergl, n_dots),
                               ("density + 2,000 invisible SVG points", go.Scatter, 2000)):
        fig = go.Figure(density)
        keep = dots[:count]
        fig.add_trace(trace(x=x[keep], y=y[keep], mode="markers", showlegend=False, hoverinfo="skip",
                            marker=dict(size=2, opacity=0.0)))
        out[name] = fig
    colours = plotting.population_colors(sorted(set(np.asarray(labels).astype(str))))
    population = {"title": "render", "x": x[dots], "y": y[dots], "populations": np.asarray(labels)[dots]}
    out[f"population dots, {n_dots:,} WebGL dots (Explore before)"] = charts.scatter_panels(
        [population], scale, scale, x_range, y_range, "FSC-A", "SSC-A", mode="population", colors=colours,
        height=560)
    # Explore's population view now: every event binned, one PNG image (ui.charts), and two other
    # ways to send the same picture, to see which the browser draws fastest
    names = list(colours)
    codes = np.searchsorted(names, np.asarray(labels).astype(str))
    x_bins, y_bins = plotting.bin_indices(x, x_range, 200), plotting.bin_indices(y, y_range, 200)
    grid = population_view.population_grid_from_bins(x_bins, y_bins, codes, len(names), x_range, y_range, 200)
    binned = charts.scatter_panels([{"title": "render", "grid": grid, "populations": names}], scale, scale, x_range,
                                   y_range, "FSC-A", "SSC-A", mode="population bins", colors=colours, height=560)
    out["population bins, PNG image (Explore now)"] = binned
    rgba = population_view.population_image(grid[0], [colours[n] for n in names])
    as_array = go.Figure(binned)
    as_array.data[0].update(source=None, z=rgba, colormodel="rgba")
    out["population bins, RGBA array image"] = as_array
    out["population bins, discrete-colour heatmap"] = _discrete_heatmap(binned, grid, names, colours)
    with_hover = go.Figure(binned)
    winner, winner_count, total = population_view.majority_population(grid[0])
    text = np.array([[f"{names[w]}: {c:,} of {t:,}" if t else "" for w, c, t in zip(*row)]
                     for row in zip(winner, winner_count, total)], dtype=object)
    with_hover.data[0].update(hovertext=text, hoverinfo="text")
    out["population bins, PNG image + hover text per bin"] = with_hover
    # serialised as st.plotly_chart sends them (numpy arrays as base64 typed arrays)
    import plotly.io

    return {name: json.loads(plotly.io.to_json(fig, validate=False)) for name, fig in out.items()}


def _discrete_heatmap(binned, grid, names, colours, levels: int = 8):
    """The population picture as a Heatmap: z = population x ``levels`` + shade level, on a
    stepwise colour scale of every (population, shade) pair."""
    import plotly.graph_objects as go

    counts, xc, yc = grid
    winner, _, total = population_view.majority_population(counts)
    top = max(int(total.max()), 10)
    filled = total > 0
    level = np.zeros(total.shape, dtype=np.int64)
    level[filled] = np.minimum((np.log10(total[filled]) / np.log10(top) * levels).astype(int), levels - 1)
    z = np.where(filled, winner * levels + level, np.nan)
    steps = []
    n = len(names) * levels
    for p, name in enumerate(names):
        rgb = np.array(population_view._rgb(colours[name]), dtype=float)
        for lv in range(levels):
            shade = population_view.MIN_SHADE + (1 - population_view.MIN_SHADE) * (lv + 0.5) / levels
            r, g, b = np.rint(255 + (rgb - 255) * shade).astype(int)
            k = p * levels + lv
            steps += [[k / n, f"rgb({r},{g},{b})"], [(k + 1) / n, f"rgb({r},{g},{b})"]]
    fig = go.Figure(binned)
    fig.data = fig.data[1:]
    fig.add_trace(go.Heatmap(z=z.astype(np.float32), x=xc, y=yc, colorscale=steps, zmin=0, zmax=n,
                             showscale=False, hoverinfo="skip"))
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dots", type=int, default=20_000)
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: run `make chromium` first")
        return 1
    import plotly
    from playwright.sync_api import sync_playwright

    bundle = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    specs = figures(args.dots)
    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "render.html"
        page_file.write_text("<html><body><div id='g' style='width:1200px;height:560px'></div><script>"
                             + bundle.read_text() + "</script></body></html>")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(page_file.as_uri())
            page.evaluate(DRAW_JS, next(iter(specs.values())))  # warm-up: Plotly's first plot
            medians = {}
            print(f"load average {os.getloadavg()[0]:.1f}; ms per newPlot, {args.repeats} repeats")
            for name, spec in specs.items():
                times = [page.evaluate(DRAW_JS, spec) for _ in range(args.repeats)]
                medians[name] = float(np.median(times))
                size = len(json.dumps(spec)) / 1e3
                print(f"  {name:52s} {' '.join(f'{t:6.0f}' for t in times)}   median {medians[name]:6.0f}"
                      f"   ({size:,.0f} KB of JSON)")
            browser.close()
    base = next(iter(medians.values()))
    print("median, as a ratio to the density heatmap alone:")
    for name, median in medians.items():
        print(f"  {name:52s} x{median / base:.1f}")
    dots = next(m for name, m in medians.items() if name.startswith("population dots"))
    print("population views, median as a ratio to the 20,000 WebGL dots:")
    for name, median in medians.items():
        if name.startswith("population bins"):
            print(f"  {name:52s} x{median / dots:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
