"""What the app's AppTest files share: starting the app, changing page, the session store."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")


def start(page: str | None = None) -> AppTest:
    """The app, run once (and on ``page`` when given), with no exception raised."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    assert not at.exception
    if page:
        goto(at, page)
    return at


def reload(at: AppTest, page: str | None = None) -> AppTest:
    """A reload of ``at``'s browser tab: a new session with the same address (so the same
    session id in it), run once, on ``page`` when given."""
    again = AppTest.from_file(APP, default_timeout=300)
    again.query_params.update(at.query_params)
    again.run()
    assert not again.exception
    if page:
        goto(again, page)
    return again


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(page)
    at.run()
    assert not at.exception, at.exception
    return at


def store_of(at: AppTest):
    return at.session_state["store"]


def finish_jobs(at: AppTest, timeout: float = 600) -> AppTest:
    """Wait for the background jobs on this session's library, then let the page show them."""
    from ui.jobs import jobs_for

    for job in jobs_for(store_of(at).library_path):
        assert job.wait(timeout), f"{job.title} did not finish"
    at.run()
    return at


def train_quick_model(at: AppTest, patients=("patient_01", "patient_02", "patient_03"),
                      pooled_weight=None, adaptive_weight=None) -> AppTest:
    """On the Train page, a marginal model of ``patients`` with hyperparameters by hand (no
    cross-validated selection, 1,500 cells each, so the test stays quick; the companion's
    ``pooled_weight`` and the adapted populations' ``adaptive_weight`` when given), its job
    finished."""
    at = goto(at, "pages/4_train.py")
    at.multiselect(key="train_patients").set_value(list(patients))
    at.run()
    at.checkbox(key="train_hand").check()
    at.run()
    at.checkbox(key="hp_select").uncheck()
    at.number_input(key="hp_cells_per_patient").set_value(1500)
    if pooled_weight is not None:
        at.number_input(key="hp_pooled_weight").set_value(pooled_weight)
    if adaptive_weight is not None:
        at.number_input(key="hp_adaptive_weight").set_value(adaptive_weight)
    at.run()
    at.button(key="train_button").click()
    at.run()
    return finish_jobs(at)


def train_on_the_page(at: AppTest, choices=(), hand=None,
                      patients=("patient_01", "patient_02", "patient_03")) -> AppTest:
    """The sample data loaded, ``patients`` chosen on the Train page, then ``choices`` made in
    order ((widget key, value): a str for a radio, a number for a number input; a rerun after
    each), hyperparameters set by hand (``hand``: widget key -> value, a bool for a checkbox),
    trained, and the job finished without an error."""
    at.button[0].click()  # the Data page's sample-data button
    at.run()
    at = goto(at, "pages/4_train.py")
    at.multiselect(key="train_patients").set_value(list(patients))
    at.run()
    for key, value in choices:
        (at.radio(key=key) if isinstance(value, str) else at.number_input(key=key)).set_value(value)
        at.run()
    at.checkbox(key="train_hand").check()
    at.run()
    for key, value in (hand or {}).items():
        (at.checkbox(key=key) if isinstance(value, bool) else at.number_input(key=key)).set_value(value)
    at.run()
    at.button(key="train_button").click()
    at.run()
    at = finish_jobs(at)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success and at.success[0].value.startswith("Trained")
    return at


def drawing_charts(at: AppTest) -> list[dict]:
    """Every chart of the page on which a selection can be drawn: its figure (``spec``), its
    Plotly config, the selection modes Streamlit reports, and the selection buttons the
    browser's toolbar shows on it (:func:`toolbar_selection_buttons`)."""
    import json

    from streamlit.proto.PlotlyChart_pb2 import PlotlyChart

    names = {PlotlyChart.SelectionMode.BOX: "box", PlotlyChart.SelectionMode.LASSO: "lasso",
             PlotlyChart.SelectionMode.POINTS: "points"}
    charts = []
    for chart in at.get("plotly_chart"):
        modes = {names[m] for m in chart.proto.selection_mode}
        if not modes:
            continue
        spec, config = json.loads(chart.proto.spec), json.loads(chart.proto.config or "{}")
        charts.append({"spec": spec, "config": config, "modes": modes,
                       "buttons": toolbar_selection_buttons(spec, config, modes)})
    return charts


def toolbar_selection_buttons(spec: dict, config: dict, modes: set) -> set:
    """The selection buttons ("lasso2d", "select2d") of a chart's toolbar in the browser.

    plotly.js (``src/components/modebar/manage.js``) adds both only when some trace can hold
    selected points -- a scatter-like trace drawing markers or text, a box or violin drawing all
    its points, or another type that selects points (a bar, a histogram) --, never for a
    heatmap or an image alone, and ``config["modeBarButtonsToAdd"]`` cannot add them; Streamlit
    then removes the button of each selection mode the chart was not given, and any the config
    removes."""
    selectable = False
    for trace in spec.get("data", []):
        kind = trace.get("type", "scatter")
        if kind in ("scatter", "scattergl", "scatterpolar", "scatterternary", "scattergeo", "scattermap"):
            mode = trace.get("mode", "lines")
            selectable |= "markers" in mode or "text" in mode
        elif kind in ("box", "violin"):
            selectable |= trace.get("boxpoints", trace.get("points")) == "all"
        elif kind in ("bar", "histogram", "scattercarpet", "splom", "parcats"):
            selectable = True
    if not selectable:
        return set()
    shown = {"lasso2d", "select2d"}
    if "lasso" not in modes:
        shown.discard("lasso2d")
    if "box" not in modes:
        shown.discard("select2d")
    return shown - set(config.get("modeBarButtonsToRemove", []))
