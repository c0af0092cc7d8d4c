"""The review loop on real data in a real browser: `streamlit run app.py` driven through Debian's
Chromium on the shared multicenter CyTOF samples (skipped when they are absent).

Upload three labeled samples and a new one; on one, draw a gate tree with the mouse -- a lasso
polygon (after zooming, back to the lasso through the toolbar), a range on a histogram, a quadrant
split inside it; train with hyperparameters set by hand; auto-gate the new sample; move a vertex
of its fitted polygon; correct cells with the lasso; accept; download the gated CSV, the
statistics, the batch table and the report. Every count agrees across the page and the four
downloads, and the populations without a gate keep the model's labels through the vertex move.
Screenshots go to test-artifacts/real_*.png.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import read_fcs
from test_browser import (add_gate, add_quadrants, choose, choose_patiently, download_clicked, lasso,  # noqa: F401
                          open_app, open_page, browser, serving_app, type_into, wait_idle)  # browser: a fixture

pytestmark = pytest.mark.browser

TRAINING = ("multicenter_01", "multicenter_02", "multicenter_03")
NEW = "multicenter_04"
TEMPLATE = "multicenter_01"
COFACTOR = 5.0  # a mass cytometer: the panel's arcsinh cofactor


@pytest.fixture
def app_url(multicenter_dir, tmp_path):
    with serving_app(tmp_path / "library", tmp_path / "streamlit.log") as url:
        yield url


def display(values):
    return np.arcsinh(np.asarray(values, dtype=np.float64) / COFACTOR)


def fractions(points, x_range, y_range):
    """Display coordinates as fractions of a plot's area (y from the top), kept inside it."""
    out = []
    for x, y in points:
        fx = (x - x_range[0]) / (x_range[1] - x_range[0])
        fy = 1.0 - (y - y_range[0]) / (y_range[1] - y_range[0])
        out.append((float(np.clip(fx, 0.01, 0.99)), float(np.clip(fy, 0.01, 0.99))))
    return out


def table_rows(frame) -> pd.DataFrame:
    """An st.dataframe as the browser shows it: the grid's accessible table (its visible rows
    and columns), as text."""
    header = [th.inner_text() for th in frame.locator("table thead th").all()]
    rows = [[td.inner_text() for td in tr.locator("td").all()] for tr in frame.locator("table tbody tr").all()]
    return pd.DataFrame([r[:len(header)] for r in rows if r], columns=header)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def plain(name: str) -> str:
    """A gate as the tree lists it, without its indentation."""
    return name.replace("\u2003", "").replace("└ ", "").strip()


def report_counts(html: str) -> dict:
    """population -> count of the report's population table."""
    rows = re.findall(r"<tr><td>([^<]*)</td><td>[^<]*</td><td>\d+</td><td>([\d,]+)</td>", html)
    return {name: number(count) for name, count in rows}


def modebar_button(page, plot, value):
    plot.hover()
    return plot.locator(f'.modebar-btn[data-val="{value}"]').first


def test_review_loop_on_real_samples_counts_agree_everywhere(app_url, browser, artifacts_dir, multicenter_dir,
                                                             tmp_path):
    from gating_core.reports.plotting import display_range

    page = open_app(browser, app_url)

    # Data: three labeled samples and a new one, in one drop.
    files = [multicenter_dir / f"{s}.{ext}" for s in TRAINING for ext in ("fcs", "labels.csv")]
    files.append(multicenter_dir / f"{NEW}.fcs")
    page.locator("input[type=file]").first.set_input_files([str(f) for f in files])
    new_events = read_fcs(multicenter_dir / f"{NEW}.fcs").n_events
    page.get_by_text(re.compile(rf"{NEW}: {new_events:,} events")).wait_for(timeout=300_000)
    wait_idle(page)
    listing = page.locator("[data-testid=stDataFrame]").first
    # The grid fills its (hidden) accessible table after it draws; on a busy machine, later.
    listing.locator("table tbody tr td").first.wait_for(state="attached")
    patients = table_rows(listing).set_index("patient")
    assert sorted(patients.index) == sorted(TRAINING + (NEW,))
    assert (patients.loc[list(TRAINING), "status"] == "historical (labeled)").all()
    page.screenshot(path=str(artifacts_dir / "real_1_data.png"), full_page=True)

    template = read_fcs(multicenter_dir / f"{TEMPLATE}.fcs", compensate=True)
    labels = pd.read_csv(multicenter_dir / f"{TEMPLATE}.labels.csv")["population"].to_numpy(str)

    def channel(sample, name):
        return display(sample.events[:, sample.channel_index(name)])

    # Gate: the toolbar offers the lasso and the box; zoom, then back to the lasso through it.
    open_page(page, "Gate")
    choose_patiently(page, "Patient", TEMPLATE)
    choose(page, "X channel", "CD14")
    choose(page, "Y channel", "CD3")
    plot = page.locator(".js-plotly-plot").first
    plot.wait_for()
    assert modebar_button(page, plot, "lasso").count() == 1 and modebar_button(page, plot, "select").count() == 1
    modebar_button(page, plot, "zoom").click()
    box = plot.locator(".nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + 0.2 * box["width"], box["y"] + 0.2 * box["height"])
    page.mouse.down()
    page.mouse.move(box["x"] + 0.6 * box["width"], box["y"] + 0.7 * box["height"], steps=8)
    page.mouse.up()
    page.wait_for_timeout(500)
    zoomed = plot.locator(".xtick").all_inner_texts()
    page.screenshot(path=str(artifacts_dir / "real_2a_gate_zoomed.png"), full_page=False)
    plot.locator(".nsewdrag").first.dblclick()  # the whole plot again
    page.wait_for_timeout(500)
    assert plot.locator(".xtick").all_inner_texts() != zoomed
    modebar_button(page, plot, "lasso").click()
    assert "active" in modebar_button(page, plot, "lasso").get_attribute("class")
    # a lasso around the monocytes (CD14+ CD3-), in the plot's display coordinates
    cd14_range, cd3_range = display_range(channel(template, "CD14")), display_range(channel(template, "CD3"))
    lasso(page, plot, fractions([(2.8, -0.3), (4.5, -0.4), (6.6, -0.3), (6.6, 2.2), (4.5, 2.4), (2.8, 2.2),
                                 (2.8, -0.25)], cd14_range, cd3_range))
    page.get_by_text("Selection:").wait_for()
    wait_idle(page)
    add_gate(page, "Monocytes")
    page.screenshot(path=str(artifacts_dir / "real_2_gate_lasso.png"), full_page=True)

    # A range on the CD3 histogram, dragged with the box from the toolbar's drag mode.
    page.get_by_text("Range (histogram)", exact=True).click()
    wait_idle(page)
    choose(page, "X channel", "CD3")
    histogram = page.locator(".js-plotly-plot").first
    assert modebar_button(page, histogram, "select").count() == 1
    (low_frac, _), (high_frac, _) = fractions([(3.0, 0.0), (6.6, 0.0)], cd3_range, (0.0, 1.0))
    lasso(page, histogram, [(low_frac, 0.5), (high_frac, 0.6)])
    wait_idle(page)
    cd3_low = float(page.get_by_label("CD3 from").input_value())
    assert cd3_low == pytest.approx(COFACTOR * np.sinh(3.0), rel=0.05)
    add_gate(page, "CD3+", "Add range gate")
    page.screenshot(path=str(artifacts_dir / "real_3_gate_range.png"), full_page=True)

    # Quadrants on CD4 / CD8 inside CD3+, split between the CD4 and the CD8 T cells.
    choose(page, "Parent population", "CD3+ (range)")
    add_quadrants(page, "CD4", "CD8", 12, 18)
    page.screenshot(path=str(artifacts_dir / "real_4_gate_quadrants.png"), full_page=True)
    tree = table_rows(page.locator("[data-testid=stDataFrame]").first)
    assert [plain(g) for g in tree["gate"]] == ["Monocytes", "CD3+", "CD4+ CD8+", "CD4+ CD8-", "CD4- CD8+",
                                                "CD4- CD8-"]
    monocytes = number(tree.loc[0, "count"])
    assert 0.9 * (labels == "Monocytes").sum() < monocytes < 1.1 * (labels == "Monocytes").sum()

    # Train on the three labeled samples (their uploaded labels), hyperparameters by hand.
    open_page(page, "Train")
    page.get_by_text("Channels, their transforms and hyperparameters (automatic unless you change them)").click()
    wait_idle(page)
    # Mass cytometry ion counts: every channel found on arcsinh(x / 5), and the table says why.
    table = page.locator("[data-testid=stDataFrame]").filter(has_text="panel view").first
    table.locator("table tbody tr td").first.wait_for(state="attached")
    transforms = table_rows(table)
    assert len(transforms) == 8 and set(transforms["found"]) == {"arcsinh:5"}
    assert all(why.startswith("mass cytometry") for why in transforms["why"])
    page.get_by_text("Set hyperparameters by hand", exact=True).click()
    wait_idle(page)
    page.locator("[data-testid=stCheckbox]").filter(has_text=re.compile(r"^select$")).first.click()
    wait_idle(page)
    type_into(page, "cells_per_patient", "1500")
    page.get_by_role("button", name="Train model").click()
    page.get_by_text(re.compile(r"^Trained .* on [0-9,]+ cells")).wait_for(timeout=900_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "real_5_train.png"), full_page=True)

    # Auto-gate the new sample: the tree drawn on the template comes back as its gates.
    open_page(page, "Auto-gate")
    page.get_by_role("button", name="Run auto-gating").click()
    page.get_by_text(re.compile(rf"^Gates of {TEMPLATE} fitted to {NEW}'s predicted cells")).wait_for(timeout=600_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "real_6_autogate.png"), full_page=True)

    from gating_core.gates import GateTree
    from gating_core.gates.autogates import relabel_after_edit
    from gating_core.library import PatientLibrary

    library = PatientLibrary(tmp_path / "library")
    sample = library.load_sample(NEW, compensate=True)
    gated = library.load_gate_result(NEW)
    model_labels = np.asarray(gated.populations).astype(str)
    fitted = GateTree.from_dict(gated.details["autogates"]["tree"])
    assert set(fitted.names) == {"Monocytes", "CD3+", "CD4+ CD8+", "CD4+ CD8-", "CD4- CD8+", "CD4- CD8-"}

    # Move a vertex of the fitted Monocytes polygon a third of the way to its centre.
    choose_patiently(page, "Gate to adjust", "Monocytes")
    gate = fitted["Monocytes"]
    vertices = np.asarray(gate.drawing().corners)
    inward = vertices[0] + 0.35 * (vertices.mean(axis=0) - vertices[0])
    # typed in the channels' values, as the axes read them, in boxes named by the channels
    for label, scale, value in ((gate.x_channel, gate.x_scale, inward[0]), (gate.y_channel, gate.y_scale, inward[1])):
        type_into(page, label, f"{float(scale.inverse(np.array([value]))[0]):.6g}")
    page.get_by_role("button", name="Move the vertex").click()
    moved = page.get_by_text(re.compile(r"^Moved a vertex of Monocytes: [0-9,]+ → [0-9,]+ events; [0-9,]+ cells "
                                        r"relabeled"))
    moved.wait_for()
    before_n, after_n, relabeled_n = (number(v) for v in re.findall(r"[0-9][0-9,]*", moved.inner_text())[:3])
    assert after_n < before_n and relabeled_n > 0
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "real_7_vertex_moved.png"), full_page=True)
    after_move = library.load_gate_result(NEW)
    moved_labels = np.asarray(after_move.populations).astype(str)
    edited = GateTree.from_dict(after_move.details["autogates"]["tree"])
    expected, changed = relabel_after_edit(fitted, edited, sample, model_labels)
    np.testing.assert_array_equal(moved_labels, expected.astype(str))
    assert int((moved_labels != model_labels).sum()) == relabeled_n
    # the populations without a gate keep the model's labels, every cell of them
    no_gate = ~np.isin(model_labels, edited.names)
    assert set(model_labels[no_gate]) >= {"B cells", "CD4 T cells", "CD8 T cells"}
    np.testing.assert_array_equal(moved_labels[no_gate], model_labels[no_gate])
    assert not (changed & ~np.asarray(fitted.memberships(sample)["Monocytes"])).any()  # the gate shrank

    # Correct: lasso cells on the predicted populations' plot and give them to "other" (the app's name for the cells outside every gate, "ungated" in the labels files).
    review = page.locator(".js-plotly-plot").first
    review.scroll_into_view_if_needed()
    lasso(page, review, [(0.6, 0.05), (0.95, 0.05), (0.95, 0.35), (0.6, 0.35), (0.6, 0.06)])
    page.get_by_role("button", name=re.compile(r"^Reassign [0-9,]+ cells$")).wait_for()
    wait_idle(page)
    choose(page, "Reassign to", "other")
    page.get_by_role("button", name=re.compile(r"^Reassign [0-9,]+ cells to other$")).click()
    page.get_by_text(re.compile(r"^Reassigned [0-9,]+ circled cells to other")).wait_for()
    wait_idle(page)
    corrected = np.asarray(library.load_gate_result(NEW).populations).astype(str)
    assert ((corrected != moved_labels) & (corrected == "other")).sum() > 0
    assert ((corrected != moved_labels) <= (corrected == "other")).all()
    page.screenshot(path=str(artifacts_dir / "real_8_corrected.png"), full_page=True)

    # Accept: the reviewed sample's populations become its labels.
    page.get_by_role("button", name="Accept this patient…").click()
    page.get_by_text("its labels now and after accepting").wait_for()
    wait_idle(page)
    page.get_by_role("button", name="Accept: make these its labels").click()
    page.get_by_text(f"{NEW} was accepted").wait_for()
    wait_idle(page)
    np.testing.assert_array_equal(library.load_labels(NEW).astype(str), corrected)

    # The four downloads.
    def download(name, target):
        item = download_clicked(page, name)
        item.save_as(tmp_path / target)
        return tmp_path / target

    from gating_core.io.export import read_gated_csv

    exported, populations, _ = read_gated_csv(download("Gated CSV", "gated.csv"))
    populations = np.asarray(populations).astype(str)
    np.testing.assert_array_equal(populations, corrected)
    truth = pd.Series(populations).value_counts().to_dict()
    statistics = pd.read_csv(download("Statistics (CSV, all gated patients)", "statistics.csv"))
    statistics = statistics[statistics["patient"] == NEW].set_index("population")
    batch = pd.read_csv(download(re.compile(r"^Batch table \(CSV, 1 patients\)$"), "batch.csv")).set_index("population")
    report_button = f"Report of {NEW} (HTML)"
    report = report_counts(download(report_button, "report.html").read_text(encoding="utf-8"))

    # The page: the populations, the gates and the batch table as the browser shows them.
    frames = page.locator("[data-testid=stDataFrame]")
    shown = [table_rows(frames.nth(i)) for i in range(frames.count())]
    page_populations = next(t for t in shown if list(t.columns[:2]) == ["population", "count"]).set_index("population")
    page_gates = next(t for t in shown if "F1" in "".join(t.columns) and "gate" in t.columns)
    page_gates = page_gates.assign(gate=[plain(g) for g in page_gates["gate"]]).set_index("gate")
    page.get_by_text("Batch table", exact=True).click()
    wait_idle(page)
    frames = page.locator("[data-testid=stDataFrame]")
    page_batch = table_rows(frames.nth(frames.count() - 1)).set_index("population")
    page.screenshot(path=str(artifacts_dir / "real_9_accepted_downloads.png"), full_page=True)

    for population, count in truth.items():
        assert number(page_populations.loc[population, "count"]) == count, population
        assert statistics.loc[population, "count"] == count, population
        assert batch.loc[population, "count"] == count, population
        assert number(page_batch.loc[population, "count"]) == count, population
        assert report[population] == count, population
    assert truth["Monocytes"] == number(page_gates.loc["Monocytes", "count"])  # a gate named like a population
    for gate in edited.names:
        assert batch.loc[gate, "count"] == number(page_gates.loc[gate, "count"]) == report[gate] \
            == number(page_batch.loc[gate, "count"]), gate
    # the batch table's marker statistics are those of the exported cells
    cd14 = exported.events[:, exported.channel_index("CD14")]
    cells = populations == "Monocytes"
    assert batch.loc["Monocytes", "median CD14"] == pytest.approx(np.median(cd14[cells]), rel=1e-4)
    assert statistics.loc["Monocytes", "geometric mean CD14"] == pytest.approx(
        COFACTOR * np.sinh(np.mean(display(cd14[cells]))), rel=1e-4)
    assert statistics.loc["Monocytes", "CV CD14"] == pytest.approx(
        100 * cd14[cells].std(ddof=1) / cd14[cells].mean(), rel=1e-4)
