"""Real flow data in a real browser: `streamlit run app.py` driven through Debian's Chromium on
the shared DLBCL biopsies (FACSCalibur, channel numbers of log-amplified data; skipped when they
are absent).

Upload four labeled biopsies of one batch and a fifth of the same batch; the Train page finds
every channel already on a channel scale and says why; train with the defaults; auto-gate the
fifth; its populations agree with the experts' and the gated CSV downloaded from the page holds
the file's own channel values and the gated labels. Screenshots go to test-artifacts/flow_*.png.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import read_fcs
from test_browser import browser, download_clicked, open_app, open_page, serving_app, wait_idle  # noqa: F401
from test_browser_real import number, table_rows

pytestmark = pytest.mark.browser

TRAINING = ("dlbcl_19", "dlbcl_20", "dlbcl_21", "dlbcl_22")
NEW = "dlbcl_23"


@pytest.fixture
def app_url(dlbcl_dir, tmp_path):
    with serving_app(tmp_path / "library", tmp_path / "streamlit.log") as url:
        yield url


def test_channel_scale_flow_biopsies_train_and_gate_in_the_browser(app_url, browser, artifacts_dir, dlbcl_dir,
                                                                   tmp_path):
    from gating_core.io.gated_table import read_gated_csv
    from gating_core.library import PatientLibrary

    page = open_app(browser, app_url)
    files = [dlbcl_dir / f"{s}.{ext}" for s in TRAINING for ext in ("fcs", "labels.csv")] + [dlbcl_dir / f"{NEW}.fcs"]
    page.locator("input[type=file]").first.set_input_files([str(f) for f in files])
    new_sample = read_fcs(dlbcl_dir / f"{NEW}.fcs")
    page.get_by_text(re.compile(rf"{NEW}: {new_sample.n_events:,} events")).wait_for(timeout=300_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "flow_1_data.png"), full_page=True)

    # Train: whole numbers up to 1023 with a meaningless $PnR are channel numbers, shown as they are.
    open_page(page, "Train")
    page.get_by_text("Channels, their transforms and hyperparameters (automatic unless you change them)").click()
    wait_idle(page)
    table = page.locator("[data-testid=stDataFrame]").filter(has_text="panel view").first
    table.locator("table tbody tr td").first.wait_for(state="attached")
    transforms = table_rows(table)
    assert transforms["channel"].tolist() == ["FL1.LOG", "FL2.LOG", "FL4.LOG"]
    assert set(transforms["found"]) == {"channel-scale"} and set(transforms["used"]) == {"channel-scale"}
    assert set(transforms["panel view"]) == {"linear"}
    assert all("already on a channel scale" in why and "$PnR 262144 says nothing" in why for why in transforms["why"])
    page.get_by_role("button", name="Train model").click()
    page.get_by_text(re.compile(r"^Trained .* on [0-9,]+ cells")).wait_for(timeout=900_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "flow_2_trained.png"), full_page=True)

    open_page(page, "Auto-gate")
    page.get_by_role("button", name="Run auto-gating").click()
    page.get_by_text(re.compile(rf"^{NEW} resembles the training patients")).wait_for(timeout=600_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "flow_3_autogate.png"), full_page=True)

    # Four biopsies of its own batch gate the fifth as the experts did, nearly (0.95 from the
    # command line on the same patients).
    truth = pd.read_csv(dlbcl_dir / f"{NEW}.labels.csv")["population"].to_numpy(str)
    gated = np.asarray(PatientLibrary(tmp_path / "library").load_gate_result(NEW).populations).astype(str)
    assert len(gated) == len(truth) and np.mean(gated == truth) > 0.9

    item = download_clicked(page, "Gated CSV")
    item.save_as(tmp_path / "gated.csv")
    exported, populations, _ = read_gated_csv(tmp_path / "gated.csv")
    np.testing.assert_array_equal(np.asarray(populations).astype(str), gated)
    assert exported.pnn == new_sample.pnn
    np.testing.assert_array_equal(exported.events, new_sample.events)

    # The model's parts, each alone: the reviewer compares them and starts the review from the
    # patient's own populations; the library keeps that gating and which part made it.
    wait_idle(page)  # the download's rerun ends before the next click (a loaded machine can take long)
    page.get_by_text("Compare the model's parts").click()
    wait_idle(page)
    page.get_by_role("button", name="Gate with each part alone").click()
    page.get_by_text("Start the review from").wait_for(timeout=600_000)
    wait_idle(page)
    comparison = page.locator("[data-testid=stDataFrame]").filter(has_text="under review").first
    comparison.locator("table tbody tr td").first.wait_for(state="attached")
    counts = table_rows(comparison)
    assert list(counts.columns)[1:] == ["under review", "the transfer model alone",
                                        "the patient's own populations alone"]
    page.get_by_text("the patient's own populations alone", exact=True).last.click()
    wait_idle(page)
    page.get_by_role("button", name="Review from the patient's own populations alone…").click()
    wait_idle(page)
    page.get_by_role("button", name="Replace the gating under review").click()
    page.get_by_text(re.compile(r"by the patient's own populations alone")).first.wait_for(timeout=300_000)
    wait_idle(page)
    page.screenshot(path=str(artifacts_dir / "flow_4_parts.png"), full_page=True)
    stored = PatientLibrary(tmp_path / "library").load_gate_result(NEW)
    assert stored.details["part"] == "adapted"
    adapted = np.asarray(stored.populations).astype(str)
    assert np.mean(adapted == truth) > 0.85
    shown = counts.set_index(counts.columns[0])["the patient's own populations alone"]
    for population in np.unique(adapted):
        assert number(shown[population]) == int((adapted == population).sum())
