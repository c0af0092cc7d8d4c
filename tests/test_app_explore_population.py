"""Explore's population view through Streamlit's AppTest: every event binned, one image per
patient, the picture exactly the majority population of each bin of the patient's labels, and
a new picture when the labels change; the dots remain as an option."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
from PIL import Image

from gating_core.gates import AxisScale
from gating_core.reports import plotting, population_view
from apptest_helpers import goto, start, store_of


def _spec(at):
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def _values(data) -> np.ndarray:
    """An array of a figure's JSON spec: a list, or Plotly's typed array (dtype, base64 bytes, shape)."""
    if not isinstance(data, dict):
        return np.asarray(data, dtype=np.float64)
    flat = np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"]))
    shape = data.get("shape")
    return (flat.reshape([int(v) for v in str(shape).split(",")]) if shape else flat).astype(np.float64)


def _decoded(image_trace) -> np.ndarray:
    header, data = image_trace["source"].split(",", 1)
    assert header == "data:image/png;base64"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGBA"))


def _expected_picture(records, x_ch, y_ch, names, colors):
    """The first patient's population image, computed afresh from all events of every patient
    (linear axes: the page's default for scatter channels), with the page's shared range and
    shared full-colour count."""
    values = [[r.sample.events[:, r.sample.channel_index(c)].astype(np.float32) for r in records]
              for c in (x_ch, y_ch)]
    x_range, y_range = plotting.display_range(values[0]), plotting.display_range(values[1])
    bins = plotting.density_bins(min(r.sample.n_events for r in records))  # shared, from the fewest events
    grids = []
    for r, x, y in zip(records, *values):
        pops = np.asarray(r.populations).astype(str)
        grids.append(np.stack([plotting.density_grid(x[pops == n], y[pops == n], x_range, y_range, bins)[0]
                               for n in names]))
    top = max(int(g.sum(axis=0).max()) for g in grids)
    return population_view.population_image(grids[0], [colors[n] for n in names], top=top), grids[0], x_range, y_range


def test_population_view_is_one_image_per_patient_of_every_event(library):
    at = start()
    at.button[0].click()  # the Data page's sample-data button
    at.run()
    at = goto(at, "pages/2_explore.py")
    assert at.radio(key="ex_mode").options == ["density", "population", "population dots"]
    at.radio(key="ex_mode").set_value("population")
    at.run()
    assert not at.exception, at.exception
    store = store_of(at)
    chosen = at.multiselect(key="explore_patients").value
    spec = _spec(at)
    images = [t for t in spec["data"] if t["type"] == "image"]
    assert len(images) == len(chosen) == 3
    assert [t.get("xaxis", "x") for t in images] == ["x", "x2", "x3"]
    legend = [t for t in spec["data"] if t["type"] == "scatter"]
    assert all(t["x"] == [None] and t["y"] == [None] for t in legend)  # legend entries only, nothing drawn
    names = [t["name"] for t in legend]
    assert not [t for t in spec["data"] if t["type"] not in ("image", "scatter")]

    # the first panel's picture is exactly the majority population of each bin of all its events
    records = [store.patients[n] for n in chosen]
    assert all(r.populations is not None for r in records)
    x_ch, y_ch = at.selectbox(key="ex_x").value, at.selectbox(key="ex_y").value
    assert at.selectbox(key=f"ex_xs_{x_ch}").value == at.selectbox(key=f"ex_ys_{y_ch}").value == "linear"
    colors = {t["name"]: t["marker"]["color"] for t in legend}
    assert colors == plotting.population_colors(names)
    want, counts, x_range, y_range = _expected_picture(records, x_ch, y_ch, names, colors)
    got = _decoded(images[0])
    bins = plotting.density_bins(min(r.sample.n_events for r in records))
    assert got.shape == (bins, bins, 4)
    np.testing.assert_array_equal(got, want)
    assert counts.sum() > 0.99 * records[0].n_events  # all events counted, not a subsample
    # the image spans the density view's bins: the same x / y bin centres
    _, x_centers, y_centers = plotting.density_grid(np.zeros(1), np.zeros(1), x_range, y_range, bins)
    assert (images[0]["x0"], images[0]["y0"]) == (x_centers[0], y_centers[0])
    assert np.isclose(images[0]["dx"], x_centers[1] - x_centers[0])
    assert np.isclose(images[0]["dy"], y_centers[1] - y_centers[0])

    # new labels (as drawn gates give): the next run draws them, not the cached old picture
    store.set_labels(records[0].name, np.full(records[0].n_events, names[0], dtype=object), "gates drawn")
    at.run()
    assert not at.exception, at.exception
    got = _decoded([t for t in _spec(at)["data"] if t["type"] == "image"][0])
    want = _expected_picture(records, x_ch, y_ch, names, colors)[0]
    assert not np.array_equal(got, _decoded(images[0]))
    np.testing.assert_array_equal(got, want)

    at.radio(key="ex_mode").set_value("population dots")
    at.run()
    assert not at.exception, at.exception
    assert {t["type"] for t in _spec(at)["data"]} == {"scattergl"}


def test_channel_numbers_are_binned_a_whole_number_of_them_a_bin(library, dlbcl_dir):
    """FlowCAP biopsies hold channel numbers (integers 0-1023): Explore bins the density and the
    overlaid histograms so that each bin holds the same number of them, edges halfway between two."""
    import pandas as pd

    from gating_core.fcs import read_fcs
    from gating_core.library import PatientLibrary

    patients = PatientLibrary(library)
    samples = {}
    for stem in ("dlbcl_01", "dlbcl_02"):
        samples[stem] = read_fcs(dlbcl_dir / f"{stem}.fcs")
        labels = pd.read_csv(dlbcl_dir / f"{stem}.labels.csv")["population"].to_numpy(str)
        patients.add_patient(samples[stem], labels, name=stem)
    at = start("pages/2_explore.py")
    chosen = at.multiselect(key="explore_patients").value
    x_ch, y_ch = at.selectbox(key="ex_x").value, at.selectbox(key="ex_y").value
    assert chosen == ["dlbcl_01", "dlbcl_02"] and at.selectbox(key=f"ex_xs_{x_ch}").value == "linear"

    def aligned(channel, bins=200):
        values = [samples[n].events[:, samples[n].channel_index(channel)].astype(np.float32) for n in chosen]
        return values, plotting.lattice_bins(plotting.display_range(values), (1.0, 0.0), bins)

    # the density: bins for the fewer events of the two (3,796), each a whole number of channel numbers
    density_bins = plotting.density_bins(min(samples[n].n_events for n in chosen))
    assert density_bins == 62
    (xs, ((x_low, x_high), n_x)), (ys, ((y_low, y_high), n_y)) = (aligned(x_ch, density_bins),
                                                                  aligned(y_ch, density_bins))
    assert 50 <= n_x <= 70 and 50 <= n_y <= 70
    for low, high, n in ((x_low, x_high, n_x), (y_low, y_high, n_y)):
        assert low % 1 == high % 1 == 0.5 and (high - low) / n == round((high - low) / n)
    heatmaps = [t for t in _spec(at)["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 2
    np.testing.assert_allclose(_values(heatmaps[0]["x"]), plotting.bin_centers((x_low, x_high), n_x))
    np.testing.assert_allclose(_values(heatmaps[0]["y"]), plotting.bin_centers((y_low, y_high), n_y))
    counts = plotting.density_grid(xs[0], ys[0], (x_low, x_high), (y_low, y_high), (n_x, n_y))[0]
    drawn = _values(heatmaps[0]["z"])
    np.testing.assert_array_equal(np.isnan(drawn), counts == 0)
    np.testing.assert_allclose(10 ** drawn[counts > 0], counts[counts > 0], rtol=1e-5)

    overlay = json.loads(at.get("plotly_chart")[1].proto.spec)
    channel = at.selectbox(key="ex_h").value
    (low, high), n = aligned(channel)[1]
    curves = [t for t in overlay["data"] if t["type"] == "scatter"]
    assert [t["name"] for t in curves] == chosen
    np.testing.assert_allclose(_values(curves[0]["x"]), plotting.bin_centers((low, high), n))

    # arcsinh on channel numbers is allowed, and says what it does to them
    note = (f"{x_ch} holds channel numbers of log-amplified data: arcsinh compresses it a second time; linear "
            "shows it as recorded.")
    assert note not in [c.value for c in at.caption]
    at.selectbox(key=f"ex_xs_{x_ch}").set_value("arcsinh")
    at.run()
    assert not at.exception, at.exception
    assert note in [c.value for c in at.caption]


def test_mass_cytometry_opens_explore_on_the_markers_of_its_largest_population(library, multicenter_dir):
    """No scatter channels: Explore opens on the two channels that set the largest population
    apart (monocytes: CD14 and CD45), not on the panel's first two (CCR6, CD20); Auto-gate does
    the same with the populations it gated (ui.common.default_xy)."""
    import pandas as pd

    from gating_core.fcs import read_fcs
    from gating_core.library import PatientLibrary

    sample = read_fcs(multicenter_dir / "multicenter_09.fcs")
    labels = pd.read_csv(multicenter_dir / "multicenter_09.labels.csv").iloc[:, 0].to_numpy(str)
    PatientLibrary(library).add_patient(sample, labels, name="multicenter_09")
    at = start("pages/2_explore.py")
    marker = {c.pnn: c.pns for c in sample.channels}
    assert [marker[at.selectbox(key=k).value] for k in ("ex_x", "ex_y")] == ["CD14", "CD45"]
    # the user's choice stands over the reruns
    cd3 = next(p for p, m in marker.items() if m == "CD3")
    at.selectbox(key="ex_x").set_value(cd3)
    at.run()
    assert not at.exception and at.selectbox(key="ex_x").value == cd3
    at.radio(key="ex_mode").set_value("population")
    at.run()
    assert not at.exception and at.selectbox(key="ex_x").value == cd3
