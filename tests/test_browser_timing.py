"""Explore and Gate on a 1,000,000-event patient in a real browser, each control change timed.

The patient is simulated (``gating_core.synthetic``), written as FCS 3.1 with its labels CSV and
imported into a fresh library the app opens. The test changes the X channel, the Y channel, an
axis transform and the colour view on Explore (density, population bins -- a channel changed
there too -- and population dots), and the X channel on Gate, and checks each time
that the chart shows what was asked for. How long each re-render took (from the click to the
chart redrawn with the script run finished) goes to a timing log -- ``browser_timing.json`` in
the test's tmp dir and in ``test-artifacts/``, and stdout -- never to an assertion: the figures
depend on the machine and its load.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from test_browser import app_url, browser, wait_idle  # noqa: F401  (fixtures used by name)

pytestmark = pytest.mark.browser

N_EVENTS = 1_000_000
PATIENT = "million_events"

# A fingerprint of what one Plotly chart shows: axis titles and tick labels, legend, a hash of
# the heatmap image and the number of drawn traces. It changes when the chart is redrawn with
# other data, whatever the control was.
CHART_SIGNATURE_JS = """
(index) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[index];
  if (!gd) return null;
  const texts = (sel) => Array.from(gd.querySelectorAll(sel)).map((e) => e.textContent).join('|');
  let hash = 0;
  for (const image of gd.querySelectorAll('image')) {
    const href = image.getAttribute('href') || image.getAttribute('xlink:href') || '';
    for (let i = 0; i < href.length; i++) hash = (hash * 31 + href.charCodeAt(i)) | 0;
  }
  return [texts('.xtitle'), texts('.ytitle'), texts('.xtick'), texts('.ytick'), texts('.legendtext'), hash,
          gd.querySelectorAll('.trace').length].join('#');
}
"""
# Records when the app's script run starts and ends (the attribute Streamlit sets on stApp), so the
# log can split a re-render into the server's run and what the browser does around it.
RUN_OBSERVER_JS = """
window.__scriptStates = [];
new MutationObserver((changes) => {
  for (const change of changes) {
    window.__scriptStates.push([change.target.getAttribute('data-test-script-state'), performance.now()]);
  }
}).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-test-script-state']});
window.__longTasks = [];
new PerformanceObserver((list) => {
  for (const task of list.getEntries()) window.__longTasks.push([task.startTime, task.duration]);
}).observe({type: 'longtask', buffered: true});
"""
RUN_SPLIT_JS = """
(since) => {
  const after = window.__scriptStates.filter(([state, t]) => t >= since);
  const started = after.find(([state]) => state === 'running');
  const ended = after.filter(([state]) => state === 'notRunning').pop();
  const busy = window.__longTasks.filter(([t]) => t >= since).reduce((sum, [t, d]) => sum + d, 0);
  return {now: performance.now(), started: started ? started[1] : null, ended: ended ? ended[1] : null,
          runs: after.filter(([state]) => state === 'running').length, busy: busy};
}
"""
SCRIPT_STATE_JS = "() => document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')"


@pytest.fixture
def library_with_patients(tmp_path):
    """A library holding one simulated 1,000,000-event labeled patient with a gate tree (overrides
    test_browser's fixture of the same name, which ``app_url`` uses)."""
    from gating_core.library import PatientLibrary
    from gating_core.synthetic.patients import simulate_patient
    from gating_core.synthetic.sample_data import write_labels_csv, write_sample

    sample, labels = simulate_patient(14, n_events=N_EVENTS, name=PATIENT)
    files = tmp_path / "files"
    files.mkdir()
    write_sample(files / f"{PATIENT}.fcs", sample)
    write_labels_csv(files / f"{PATIENT}.labels.csv", labels)
    path = tmp_path / "library"
    library = PatientLibrary(path)
    library.import_files([files / f"{PATIENT}.fcs", files / f"{PATIENT}.labels.csv"])
    # a gate tree drawn from its labels, as a lab would have: the Gate page shows its statistics,
    # its gates and back-gating, all over a million events
    from gating_core.gates import panel_scale
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels

    stored = library.load_sample(PATIENT, compensate=True)
    tree = tree_from_labels(stored, labels, SAMPLE_DATA_HIERARCHY, {c: panel_scale(c, [stored]) for c in stored.pnn})
    library.save_gates(PATIENT, tree.to_dict())
    return path


class TimingLog:
    """Seconds per timed step, written as JSON after every step (so a failure keeps the rest)."""

    def __init__(self, paths):
        self.paths = paths
        self.steps: list[dict] = []

    def add(self, step: str, seconds: float, split: dict | None = None) -> None:
        # the machine is shared: the 1-minute load average says how busy it was at that moment
        entry = {"step": step, "seconds": round(seconds, 3), "load average": round(os.getloadavg()[0], 1)}
        if split:
            entry.update({k: round(v, 3) for k, v in split.items()})
        self.steps.append(entry)
        parts = ", ".join(f"{k} {v:.2f} s" if k != "script runs" else f"{v} script runs"
                          for k, v in split.items()) if split else ""
        print(f"[browser timing] {step}: {seconds:.2f} s" + (f" ({parts})" if parts else "")
              + f", load average {entry['load average']}", flush=True)
        text = json.dumps({"n_events": N_EVENTS, "steps": self.steps}, indent=1)
        for path in self.paths:
            path.write_text(text)


def signature(page, index=0):
    return page.evaluate(CHART_SIGNATURE_JS, index)


def wait_redrawn(page, before, index=0, timeout=120_000):
    """Wait until chart ``index`` differs from ``before`` and the script run has finished."""
    page.wait_for_function(
        """([index, before]) => {
             const sig = (%s)(index);
             const state = document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state');
             return sig !== null && sig !== before && state === 'notRunning';
           }""" % CHART_SIGNATURE_JS, arg=[index, before], timeout=timeout)


def tick_positions(page, index=0):
    """(label, screen x) of chart ``index``'s x-axis ticks."""
    return page.evaluate("""(index) => Array.from(document.querySelectorAll('.js-plotly-plot')[index]
        .querySelectorAll('.xtick text')).map((t) => [t.textContent, Math.round(t.getBoundingClientRect().x)])""",
                         index)


def run_split(page, since) -> dict:
    """Seconds from the click (``since``, performance.now()) to the script run's start, of the
    run itself (as the browser sees it: its end is read between the browser's own tasks), from
    its end to the chart seen redrawn; how many script runs; the browser's long tasks (> 50 ms:
    drawing, parsing) in seconds."""
    marks = page.evaluate(RUN_SPLIT_JS, since)
    if marks["started"] is None or marks["ended"] is None:
        return {}
    return {"to run start": (marks["started"] - since) / 1e3, "script run": (marks["ended"] - marks["started"]) / 1e3,
            "after run": (marks["now"] - marks["ended"]) / 1e3, "script runs": marks["runs"],
            "browser busy": marks["busy"] / 1e3}


def timed_choice(page, log, step, label, option, index=0):
    """Pick ``option`` in the select box ``label`` and log the time from the click on the option
    to chart ``index`` redrawn."""
    widget = page.locator("[data-testid=stSelectbox]").filter(has=page.get_by_text(label, exact=True)).first
    widget.locator("input").first.click()
    target = page.get_by_role("option", name=option, exact=True).first
    target.wait_for()
    timed_click(page, log, step, target, index)


def timed_first_view(page, log, step, page_name, shown_text):
    """Open ``page_name`` from the sidebar and log the time until ``shown_text`` is on it and the
    script run has finished."""
    start = time.perf_counter()
    page.get_by_test_id("stSidebarNav").get_by_text(page_name, exact=True).click()
    page.get_by_text(shown_text).first.wait_for(timeout=300_000)
    page.wait_for_function(f"() => ({SCRIPT_STATE_JS})() === 'notRunning'", timeout=300_000)
    log.add(step, time.perf_counter() - start)
    wait_idle(page)


def timed_click(page, log, step, locator, index=0):
    """Click ``locator`` and log the time from the click to chart ``index`` redrawn."""
    before = signature(page, index)
    since = page.evaluate("performance.now()")
    start = time.perf_counter()
    locator.click()
    wait_redrawn(page, before, index)
    log.add(step, time.perf_counter() - start, run_split(page, since))
    wait_idle(page)


def test_explore_and_gate_on_a_million_events_timed(app_url, browser, artifacts_dir, tmp_path):  # noqa: F811
    log = TimingLog([tmp_path / "browser_timing.json", artifacts_dir / "browser_timing.json"])
    print(f"[browser timing] log: {tmp_path / 'browser_timing.json'}", flush=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    page.add_init_script(RUN_OBSERVER_JS)
    page.set_default_timeout(120_000)
    page.goto(app_url)
    page.get_by_role("heading", name="Data: load patients").first.wait_for()
    wait_idle(page)

    # Explore: the first view reads the patient from the library and bins every event.
    timed_first_view(page, log, "explore: first view (reads the patient, bins all events)", "Explore",
                     f"{PATIENT} ({N_EVENTS:,} events)")
    scatter = page.locator(".js-plotly-plot").first
    assert scatter.locator(".xtitle").text_content() == "FSC-A"
    assert scatter.locator(".ytitle").text_content() == "SSC-A"

    timed_choice(page, log, "explore: x channel", "X channel", "CD3 (FL1-A)")
    assert scatter.locator(".xtitle").text_content() == "CD3 (FL1-A)"
    timed_choice(page, log, "explore: y channel", "Y channel", "CD19 (FL4-A)")
    assert scatter.locator(".ytitle").text_content() == "CD19 (FL4-A)"
    ticks_before = tick_positions(page)
    timed_choice(page, log, "explore: x transform logicle", "X transform", "logicle")
    assert tick_positions(page) != ticks_before  # the same raw values, placed elsewhere
    radio = page.get_by_test_id("stRadio").filter(has=page.get_by_text("Color", exact=True)).first
    timed_click(page, log, "explore: view population", radio.get_by_text("population", exact=True))
    legend = set(scatter.locator(".legendtext").all_text_contents())
    assert {"B cells", "CD4 T cells", "Monocytes", "other"} <= legend, legend
    # every event binned: one image, the other traces are the legend's empty entries
    types = page.evaluate("() => document.querySelectorAll('.js-plotly-plot')[0].data.map((t) => t.type)")
    assert types.count("image") == 1 and set(types) == {"image", "scatter"}, types
    page.get_by_text("Population counts (all events)").wait_for()
    scatter.screenshot(path=str(artifacts_dir / "timing_explore_population.png"))
    # a control change inside the population view: the new channel's bins, then one seen before
    timed_choice(page, log, "explore: population view, y channel", "Y channel", "CD4 (FL3-A)")
    assert scatter.locator(".ytitle").text_content() == "CD4 (FL3-A)"
    timed_choice(page, log, "explore: population view, y channel back (seen before)", "Y channel", "CD19 (FL4-A)")
    # the old population view, for comparison in the same run: 20,000 WebGL dots
    timed_click(page, log, "explore: view population dots", radio.get_by_text("population dots", exact=True))
    assert set(scatter.locator(".legendtext").all_text_contents()) == legend
    assert "scattergl" in page.evaluate("() => document.querySelectorAll('.js-plotly-plot')[0].data.map((t) => t.type)")
    timed_click(page, log, "explore: view density (seen before)", radio.get_by_text("density", exact=True))
    assert scatter.locator(".legendtext").count() == 0
    timed_choice(page, log, "explore: x channel back to FSC-A", "X channel", "FSC-A")
    page.screenshot(path=str(artifacts_dir / "timing_explore.png"), full_page=True)

    # Gate: the density plot of all events, then another X channel.
    timed_first_view(page, log, "gate: first view", "Gate", f"{PATIENT} · (all events)")
    gate_plot = page.locator(".js-plotly-plot").first
    timed_choice(page, log, "gate: x channel", "X channel", "CD4 (FL3-A)")
    assert gate_plot.locator(".xtitle").text_content() == "CD4 (FL3-A)"
    timed_choice(page, log, "gate: y channel", "Y channel", "CD8 (FL6-A)")
    assert gate_plot.locator(".ytitle").text_content() == "CD8 (FL6-A)"
    events = page.get_by_test_id("stMetric").filter(has_text="Events in parent").first.inner_text()
    assert re.search(r"1,000,000", events), events
    page.screenshot(path=str(artifacts_dir / "timing_gate.png"), full_page=True)
    print("[browser timing] " + json.dumps(log.steps), flush=True)
