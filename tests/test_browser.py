"""The app in a real browser: `streamlit run app.py` driven through Debian's Chromium.

Upload an FCS file through the file input and see its event count, draw a gate with the mouse,
train, auto-gate and download the gated CSV, see the auto-gates drawn in a training patient's gate
hierarchy, redraw one and see its count change, reload and find it; screenshots of every page go
to test-artifacts/.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import read_fcs

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def library_with_patients(tmp_path, sample_data_dir):
    """A patient library holding three labeled patients, as a lab would have after importing."""
    from gating_core.io.inputs import load_labeled_input
    from gating_core.library import PatientLibrary

    path = tmp_path / "library"
    library = PatientLibrary(path)
    from gating_core.gates import panel_scale
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels

    loaded = {stem: load_labeled_input(sample_data_dir / f"{stem}.fcs") for stem in ("patient_01", "patient_02",
                                                                                      "patient_04")}
    for stem, (sample, labels) in loaded.items():
        library.add_patient(sample, labels, name=stem)
    # patient_02 was gated as a flow lab would (its gates drawn from its labels): auto-gates come
    # back in its hierarchy
    samples = [library.load_sample(stem, compensate=True) for stem in loaded]
    scales = {c: panel_scale(c, samples) for c in samples[0].pnn}
    tree = tree_from_labels(samples[1], loaded["patient_02"][1], SAMPLE_DATA_HIERARCHY, scales)
    library.save_gates("patient_02", tree.to_dict())
    return path


@contextlib.contextmanager
def serving_app(library: Path, log_path: Path):
    """`streamlit run app.py` on a free port of localhost with the patient library ``library``,
    its output in ``log_path``; yields the app's address once it answers, stops it after."""
    port = free_port()
    env = dict(os.environ, GATING_LIBRARY=str(library), PYTHONPATH=str(REPO))
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.address", "localhost", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://localhost:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("streamlit did not start: " + log_path.read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def app_url(library_with_patients, tmp_path):
    with serving_app(library_with_patients, tmp_path / "streamlit.log") as url:
        yield url


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (make chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def wait_idle(page, timeout=120_000):
    """Wait until Streamlit has finished the current run: no 'running' status widget, and no stale
    element left from the previous run (a widget mounted again sits beside its stale copy until
    the run ends, so a locator would find two)."""
    page.wait_for_timeout(500)
    page.locator("[data-testid=stStatusWidget]").wait_for(state="detached", timeout=timeout)
    page.locator("[data-testid=stElementContainer][data-stale=true]").first.wait_for(state="detached",
                                                                                       timeout=timeout)
    page.wait_for_timeout(300)


def download_clicked(page, button_name, attempts=3):
    """Click a download button and return the download. A click that lands while Streamlit
    re-renders the button is lost (seen once in CI), so wait for quiet and try again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for attempt in range(attempts):
        wait_idle(page)
        try:
            with page.expect_download(timeout=40_000) as info:
                page.get_by_role("button", name=button_name).click()
            return info.value
        except PlaywrightTimeoutError:
            if attempt == attempts - 1:
                raise


HEADINGS = {"Explore": "Explore the cells", "Gate": "Gate: label patients by hand", "Train": "Train a gating model",
            "Auto-gate": "Auto-gate new patients"}


def lasso(page, plot, points):
    """Drag the mouse along ``points`` (fractions of the plot area) with the lasso tool."""
    from playwright.sync_api import Error as PlaywrightError

    for attempt in range(3):  # the mouse only reaches what the viewport shows
        try:
            plot.scroll_into_view_if_needed()
            break
        except PlaywrightError:  # re-rendered while scrolling: the locator finds the new one
            if attempt == 2:
                raise
            wait_idle(page)
    page.wait_for_timeout(300)
    box = plot.locator(".nsewdrag").first.bounding_box()
    x0, y0, w, h = box["x"], box["y"], box["width"], box["height"]
    page.mouse.move(x0 + w * points[0][0], y0 + h * points[0][1])
    page.mouse.down()
    for fx, fy in points[1:]:
        page.mouse.move(x0 + w * fx, y0 + h * fy, steps=8)
    page.mouse.up()


def choose(page, label, option):
    """Pick ``option`` in the select box or multiselect labelled ``label``, with the mouse."""
    widget = page.locator("[data-testid=stSelectbox], [data-testid=stMultiSelect]").filter(
        has=page.get_by_text(label, exact=True)).first
    if widget.locator("input").first.input_value() == option:
        return  # already chosen: the list of a combobox showing its value may not open on a click
    widget.locator("input").first.click()
    page.get_by_role("option", name=option, exact=True).first.click()
    # Close a multiselect's list by clicking the page title: Escape would clear a clearable select box.
    page.locator("h1").first.click()
    wait_idle(page)


def choose_patiently(page, label, option, attempts=3):
    """:func:`choose`, tried again when the list closed before the option could be clicked (a
    rerun that lands between the two clicks, as after a reload while plots still mount)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    widget = page.locator("[data-testid=stSelectbox]").filter(has=page.get_by_text(label, exact=True)).first
    wait_idle(page)
    if widget.locator("input").first.input_value() == option:
        return  # already chosen: the list of a combobox showing its value may not open on a click
    for attempt in range(attempts):
        wait_idle(page)
        widget.locator("input").first.click()
        try:
            page.get_by_role("option", name=option, exact=True).first.click(timeout=15_000)
            break
        except PlaywrightTimeoutError:
            page.locator("h1").first.click()
            if attempt == attempts - 1:
                raise
    wait_idle(page)


def _same_entry(shown, typed):
    """Whether an input shows what was typed, a number input's own format aside ("12" shows "12.00")."""
    try:
        return shown == typed or float(shown) == float(typed)
    except ValueError:
        return False


def type_into(page, label, text, attempts=3):
    """Type ``text`` into the input labelled ``label`` and press Enter, then wait for the rerun.

    While Streamlit reruns, a widget it mounts again can sit beside its stale copy for a moment
    (two inputs with one label, seen once in CI): wait until the label names one input, and type
    again if the rerun swallowed the value."""
    from playwright.sync_api import Error as PlaywrightError

    field = page.get_by_label(label, exact=True)
    for attempt in range(attempts):
        wait_idle(page)
        try:
            field.first.wait_for()
            for _ in range(60):
                if field.count() == 1:
                    break
                page.wait_for_timeout(500)
            field.fill(text)
            field.press("Enter")
            wait_idle(page)
            if _same_entry(field.input_value(), text):
                return
        except PlaywrightError:
            if attempt == attempts - 1:
                raise
    raise AssertionError(f"the input {label!r} did not keep {text!r} (it shows {field.input_value()!r})")


def add_gate(page, name, button="Add gate"):
    """Name the pending gate on the Gate page and add it with ``button``."""
    type_into(page, "Gate name", name)
    page.get_by_role("button", name=button).click()
    page.get_by_text(f"Added gate '{name}'").wait_for()
    wait_idle(page)


def add_quadrants(page, x_label, y_label, x_split, y_split):
    """Quadrants on the Gate page: the two channels, the split point typed, the gate added."""
    page.get_by_text("Quadrant", exact=True).click()
    wait_idle(page)
    choose(page, "X channel", x_label)
    choose(page, "Y channel", y_label)
    for label, value in ((f"Split {x_label} at", x_split), (f"Split {y_label} at", y_split)):
        type_into(page, label, str(value))
    page.get_by_role("button", name="Add quadrant gate").click()
    page.get_by_text("Added quadrants CD4+ CD8+, CD4+ CD8-, CD4- CD8+, CD4- CD8-.").wait_for()
    wait_idle(page)


def open_page(page, title):
    page.get_by_test_id("stSidebarNav").get_by_text(title, exact=True).click()
    page.get_by_role("heading", name=HEADINGS[title]).first.wait_for(timeout=60_000)
    wait_idle(page)


def open_app(browser, app_url, height=2200, downloads=True):
    """A new page on the app, its Data page drawn and settled."""
    page = browser.new_page(viewport={"width": 1500, "height": height}, accept_downloads=downloads)
    page.set_default_timeout(120_000)
    page.goto(app_url)
    page.get_by_role("heading", name="Data: load patients").first.wait_for()
    wait_idle(page)
    return page


def test_upload_gate_train_autogate_download(app_url, browser, artifacts_dir, sample_data_dir, tmp_path,
                                             library_with_patients):
    page = open_app(browser, app_url)

    # Data: the library's patients are listed; upload a new patient through the file input.
    upload = sample_data_dir / "new" / "new_patient_01.fcs"
    n_events = read_fcs(upload).n_events
    page.locator("input[type=file]").first.set_input_files(str(upload))
    page.get_by_text(f"new_patient_01: {n_events:,} events").wait_for()
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "1_data.png"), full_page=True)

    # Explore: pseudocolor density of the patients side by side.
    open_page(page, "Explore")
    page.locator(".js-plotly-plot").first.wait_for()
    page.screenshot(path=str(artifacts_dir / "2_explore.png"), full_page=True)

    # Gate: draw a lasso with the mouse on the density plot, name it, add it.
    open_page(page, "Gate")
    plot = page.locator(".js-plotly-plot").first
    plot.wait_for()
    lasso(page, plot, [(0.15, 0.25), (0.55, 0.1), (0.9, 0.3), (0.8, 0.9), (0.3, 0.85), (0.15, 0.26)])
    page.get_by_text("Selection:").wait_for()
    wait_idle(page)
    add_gate(page, "Main population")
    page.screenshot(path=str(artifacts_dir / "3_gate.png"), full_page=True)
    from gating_core.library import PatientLibrary

    stored = PatientLibrary(library_with_patients).load_gates("patient_01")
    (gate,) = stored["gates"]
    assert gate["name"] == "Main population" and gate["kind"] == "polygon" and len(gate["vertices"]) >= 5
    assert len(page.locator(".js-plotly-plot").first.locator(".shapelayer path").all()) == 1

    # Copy the tree to the uploaded patient: drawn there on the same panel-wide axes.
    choose(page, "Copy this gate tree to", "new_patient_01")
    page.get_by_role("button", name="Copy gate tree").click()
    page.get_by_text("Copied 1 gates to new_patient_01").wait_for()
    wait_idle(page)
    choose(page, "Patient", "new_patient_01")
    page.get_by_text("new_patient_01 · (all events)").wait_for()
    wait_idle(page)
    assert len(page.locator(".js-plotly-plot").first.locator(".shapelayer path").all()) == 1
    page.screenshot(path=str(artifacts_dir / "3b_gate_copied.png"), full_page=True)
    choose(page, "Patient", "patient_01")
    wait_idle(page)

    # Train on the three library patients.
    open_page(page, "Train")
    page.get_by_role("button", name="Train model").click()
    page.get_by_text(re.compile(r"^Trained .* on [0-9,]+ cells")).wait_for(timeout=900_000)
    wait_idle(page)
    page.get_by_role("button", name="Run the check").click()
    # The check's verdict: its worst patient, or that every patient scored the same (as shown).
    page.get_by_text(re.compile(r"^(Worst patient:|Lowest: |All \d+ patients scored)")).first.wait_for(timeout=900_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "4_train.png"), full_page=True)

    # Auto-gate the uploaded patient and download its gated CSV.
    open_page(page, "Auto-gate")
    page.get_by_role("button", name="Run auto-gating").click()
    page.get_by_text("Populations", exact=True).wait_for(timeout=600_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "5_autogate.png"), full_page=True)

    # Correct: lasso a region of the predicted-population scatter, reassign its cells.
    lasso(page, page.locator(".js-plotly-plot").first, [(0.05, 0.05), (0.5, 0.05), (0.5, 0.6), (0.05, 0.6), (0.05, 0.06)])
    unchosen = page.get_by_role("button", name=re.compile(r"^Reassign [0-9,]+ cells$"))
    unchosen.wait_for()
    assert unchosen.is_disabled()  # no population is picked for the user
    wait_idle(page)
    choose(page, "Reassign to", "other")
    reassign = page.get_by_role("button", name=re.compile(r"^Reassign [0-9,]+ cells to other$"))
    try:
        reassign.wait_for()
    finally:
        page.screenshot(path=str(artifacts_dir / "6a_autogate_reassign.png"), full_page=True)
    wait_idle(page)
    reassign.click()
    caption = page.get_by_text(re.compile(r"^[0-9,]+ cells corrected by hand"))
    caption.wait_for()
    n_corrected = int(caption.inner_text().split()[0].replace(",", ""))
    assert n_corrected > 0
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "6_autogate_corrected.png"), full_page=True)
    target = tmp_path / "downloaded.gated.csv"
    download = download_clicked(page, "Gated CSV")
    download.save_as(target)
    assert download.suggested_filename == "new_patient_01.gated.csv"

    from gating_core.io.export import read_gated_csv

    exported, populations, confidence = read_gated_csv(target)
    original = read_fcs(upload, compensate=True)
    assert exported.n_events == n_events
    assert exported.pnn == original.pnn
    np.testing.assert_allclose(exported.events, original.events, rtol=1e-4, atol=1e-2)
    truth = pd.read_csv(sample_data_dir / "truth" / "new_patient_01.labels.csv")["population"].to_numpy(str)
    assert set(populations) <= set(truth) | {"other"}
    assert np.mean(populations.astype(str) == truth) > 0.7
    assert confidence.min() >= 0 and confidence.max() <= 1
    # the download holds the corrected populations, the same the library keeps for this patient
    from gating_core.library import PatientLibrary

    library = PatientLibrary(library_with_patients)
    stored = library.load_gate_result("new_patient_01")
    assert stored.details.get("corrected in review") is True
    np.testing.assert_array_equal(stored.populations.astype(str), populations.astype(str))

    # Accept: the reviewed patient joins the historical (labeled) patients in the library.
    page.get_by_role("button", name="Accept this patient…").click()
    page.get_by_text("its labels now and after accepting").wait_for()
    wait_idle(page)
    assert library.label_history("new_patient_01") == []  # nothing accepted before the confirmation
    page.get_by_role("button", name="Accept: make these its labels").click()
    page.get_by_text("new_patient_01 was accepted").wait_for()
    wait_idle(page)
    assert page.get_by_role("button", name="Accepted").is_disabled()
    np.testing.assert_array_equal(library.load_labels("new_patient_01").astype(str), populations.astype(str))

    # Auto-gates as gates: the result is drawn in patient_02's gate hierarchy, on its parents' plots.
    # corrected above: the gates are fitted to the reviewed cells
    page.get_by_text(re.compile(r"^Gates of patient_02 fitted to new_patient_01's reviewed cells")).wait_for()
    tree_plots = page.locator(".js-plotly-plot").filter(has_text="→")
    assert tree_plots.count() == 5
    assert sum(len(tree_plots.nth(i).locator(".shapelayer path").all()) for i in range(5)) == 9
    page.screenshot(path=str(artifacts_dir / "7_autogates.png"), full_page=True)
    # Redraw the Monocytes gate with the lasso on its parent's plot (all events, CD14 / SSC).
    reviewed = library.load_gate_result("new_patient_01")
    choose_patiently(page, "Gate to adjust", "Monocytes")
    before = page.get_by_text(re.compile(r"^Monocytes: [0-9,]+ events"))
    n_before = int(before.inner_text().split()[1].replace(",", ""))
    lasso(page, page.locator(".js-plotly-plot").last,
          [(0.45, 0.05), (0.98, 0.05), (0.98, 0.95), (0.45, 0.95), (0.45, 0.06)])
    replace = page.get_by_role("button", name=re.compile(r"^Replace Monocytes with the selection"))
    replace.wait_for()
    wait_idle(page)
    replace.click()
    message = page.get_by_text(re.compile(r"^Redrew Monocytes: [0-9,]+ → [0-9,]+ events"))
    message.wait_for()
    old_n, new_n = (int(v.replace(",", "")) for v in re.findall(r"[0-9][0-9,]*", message.inner_text())[:2])
    assert old_n == n_before and new_n != n_before
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "8_autogate_redrawn.png"), full_page=True)
    stored = library.load_gate_result("new_patient_01")
    assert stored.details["autogates"]["edited"] is True
    # only the cells whose gate membership changed follow the gates; the others keep their population
    from gating_core.gates import GateTree
    from gating_core.gates.autogates import relabel_after_edit

    expected, changed = relabel_after_edit(
        GateTree.from_dict(reviewed.details["autogates"]["tree"]), GateTree.from_dict(stored.details["autogates"]["tree"]),
        library.load_sample("new_patient_01", compensate=True), reviewed.populations)
    assert changed.any()
    np.testing.assert_array_equal(stored.populations.astype(str), expected.astype(str))
    # Reload the app: the redrawn gate and its count are still there.
    page.reload()  # stays on the Auto-gate page
    page.get_by_role("heading", name=HEADINGS["Auto-gate"]).first.wait_for()
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "9_autogate_after_reload.png"), full_page=True)
    page.get_by_text(re.compile(r"^Gates of patient_02 fitted to new_patient_01's reviewed cells, then adjusted "
                                r"by hand")).wait_for()
    wait_idle(page)  # the gate adjusted last is the one shown for adjusting
    page.get_by_text(re.compile(rf"^Monocytes: {new_n:,} events")).wait_for()
    page.screenshot(path=str(artifacts_dir / "9_autogate_after_reload.png"), full_page=True)


def test_an_unreadable_upload_keeps_its_error_until_its_file_is_taken_out(app_url, browser, sample_data_dir,
                                                                           tmp_path, library_with_patients):
    from gating_core.library import PatientLibrary

    page = open_app(browser, app_url, downloads=False)
    bad = tmp_path / "scan.fcs"
    bad.write_bytes(b"FCS3.0    not an FCS file")
    upload = page.locator("input[type=file]").first
    errors = page.get_by_test_id("stAlertContentError")

    upload.set_input_files(str(bad))
    errors.filter(has_text="scan.fcs:").wait_for()
    wait_idle(page)
    # a good file uploaded next is loaded, and the bad one, still in the uploader, keeps its error
    good = sample_data_dir / "new" / "new_patient_01.fcs"
    upload.set_input_files(str(good))
    page.get_by_text(f"new_patient_01: {read_fcs(good).n_events:,} events").wait_for()
    wait_idle(page)
    assert [e.inner_text().split("scan.fcs:")[1].strip() for e in errors.all()] == [
        "file is 25 bytes long, too short to hold an FCS HEADER (58 bytes)"]

    page.get_by_role("button", name="Remove scan.fcs").click()
    wait_idle(page)
    errors.first.wait_for(state="detached")
    assert page.get_by_test_id("stFileChipName").all_inner_texts() == ["new_patient_01.fcs"]
    assert "new_patient_01" in PatientLibrary(library_with_patients).patient_names()


def test_quadrant_gate_in_the_browser_with_its_tree_and_backgating(app_url, browser, artifacts_dir,
                                                                   library_with_patients):
    """Split CD3+ cells into CD4 / CD8 quadrants with the page's controls, see the split on the
    plot, choose a quadrant in the population tree and see it back-gated on its ancestors' plots."""
    page = open_app(browser, app_url, height=2600, downloads=False)
    open_page(page, "Gate")
    page.locator(".js-plotly-plot").first.wait_for()

    # A range gate on the CD3 histogram, then quadrants on CD4 / CD8 inside it.
    page.get_by_text("Range (histogram)", exact=True).click()
    wait_idle(page)
    choose(page, "X channel", "CD3 (FL1-A)")
    before = float(page.get_by_label("CD3 (FL1-A) from").input_value())
    # Drag a box across the right half of the histogram: the range inputs follow it.
    histogram = page.locator(".js-plotly-plot").first
    histogram.scroll_into_view_if_needed()
    box = histogram.locator(".nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + 0.62 * box["width"], box["y"] + 0.5 * box["height"])
    page.mouse.down()
    page.mouse.move(box["x"] + 0.99 * box["width"], box["y"] + 0.6 * box["height"], steps=10)
    page.mouse.up()
    wait_idle(page)
    low = float(page.get_by_label("CD3 (FL1-A) from").input_value())
    high = float(page.get_by_label("CD3 (FL1-A) to").input_value())
    assert before < low < high
    add_gate(page, "CD3+", "Add range gate")

    choose(page, "Parent population", "CD3+ (range)")
    add_quadrants(page, "CD4 (FL3-A)", "CD8 (FL6-A)", 200, 300)
    gate_plot = page.locator(".js-plotly-plot").first
    for name in ("CD4+ CD8-", "CD4- CD8+"):
        assert gate_plot.get_by_text(name, exact=True).count() >= 1
    # the stored split (two lines) and the next split's dashed preview (two more)
    assert len(gate_plot.locator(".shapelayer path").all()) == 4
    page.screenshot(path=str(artifacts_dir / "3c_gate_quadrants.png"), full_page=True)

    from gating_core.library import PatientLibrary

    stored = PatientLibrary(library_with_patients).load_gates("patient_01")
    quadrants = [g for g in stored["gates"] if g["kind"] == "quadrant"]
    assert sorted(g["quadrant"] for g in quadrants) == ["++", "+-", "-+", "--"]
    assert {g["parent"] for g in quadrants} == {"CD3+"}

    # Back-gating CD4+ CD8-: coloured on the CD3 histogram of all events and on CD3+'s CD4 / CD8 plot.
    choose(page, "Population to back-gate", re.compile(r"CD4\+ CD8- \(quadrant\)$"))
    page.get_by_text(re.compile(r"^CD4\+ CD8- · on CD3\+ · [0-9,]+ cells")).first.wait_for()
    page.get_by_text(re.compile(r"^CD3\+ · on \(all events\) · [0-9,]+ cells")).first.wait_for()
    page.screenshot(path=str(artifacts_dir / "3d_gate_backgating.png"), full_page=True)
