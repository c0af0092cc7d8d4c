"""AppTest: reviewing an auto-gated patient on the Auto-gate page -- gate edits that relabel only
the cells they move, one set of counts across page and exports, every gate kind drawn and
adjustable, gates that cannot be fitted named, depth-first trees, the template a lab drew."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from apptest_helpers import drawing_charts, goto, start, store_of, train_quick_model
from gating_core.gates import GateTree, quadrant_gates, range_gate

NEW = "new_patient_01"
LINEAR = {"kind": "linear"}
QUADRANT_NAMES = {"+-": "CD4 T cells", "-+": "CD8 T cells", "++": "CD4+ CD8+", "--": "CD4- CD8-"}


@pytest.fixture
def loaded(library):
    pytest.importorskip("gating_core.model")
    at = start()
    at.button[0].click()  # the sample data
    at.run()
    assert not at.exception
    return at


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def drawn_tree(store, names, patient="patient_01") -> GateTree:
    """The gates ``names`` (parents first) of the hierarchy a lab draws on the sample data,
    fitted to ``patient``'s labels: a leaf whose children are left out keeps its own outline."""
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, tree_from_labels

    record = store.patients[patient]
    scales = {c: store.panel_transform(c) for c in record.sample.pnn}
    full = tree_from_labels(record.sample, record.labels, SAMPLE_DATA_HIERARCHY, scales)
    return GateTree([full[n] for n in names])


def with_quadrants_and_range(store, tree: GateTree) -> GateTree:
    """``tree`` plus a CD4 / CD8 quadrant split under T cells and a CD19 range under Lymphocytes."""
    scale = {c: store.panel_transform(c) for c in ("FL3-A", "FL6-A", "FL4-A")}
    for gate in quadrant_gates("FL3-A", "FL6-A", (3.0, 3.0), scale["FL3-A"], scale["FL6-A"], parent="T cells",
                               names=QUADRANT_NAMES):
        tree.add(gate)
    tree.add(range_gate("CD19 bright", "FL4-A", 3.0, 9.0, scale["FL4-A"], parent="Lymphocytes"))
    return tree


def autogate(at: AppTest, tree: GateTree, targets=(NEW,), template="patient_01") -> AppTest:
    """``tree`` drawn on ``template``, a quick model of patients 01-03, ``targets`` auto-gated."""
    store = store_of(at)
    store.save_gates(template, tree)
    at = train_quick_model(at)
    assert not at.exception and not at.error
    at = goto(at, "pages/5_autogate.py")
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(list(targets))
    at.button(key="ag_run").click()
    return run(at)


def raw_value(scale, display_value) -> float:
    return float(scale.inverse(np.array([display_value], dtype=np.float64))[0])


def move_first_vertex(at: AppTest, patient: str, tree: GateTree, gate: str, fraction: float):
    """Move ``gate``'s first vertex ``fraction`` of the way to its centre on the Auto-gate page
    (the gate already chosen for adjusting); returns where it was moved to."""
    vertices = np.asarray(tree[gate].vertices)
    inward = vertices[0] + fraction * (vertices.mean(axis=0) - vertices[0])
    # typed in the channels' values, as the axes read them
    at.number_input(key=f"ag_vx_{patient}_{gate}_1").set_value(raw_value(tree[gate].x_scale, inward[0]))
    at.number_input(key=f"ag_vy_{patient}_{gate}_1").set_value(raw_value(tree[gate].y_scale, inward[1]))
    run(at)
    at.button(key="ag_move_vertex").click()
    run(at)
    return inward


def circle_box(at: AppTest, patient: str, x: str, y: str, corners, to=None) -> AppTest:
    """A box drawn around ``corners`` ((x0, y0), (x1, y1)) on the Auto-gate page's ``x`` / ``y``
    plot (linear axes), then, with ``to``, that population chosen to reassign its cells to."""
    at.session_state["ag_pending_shape"] = {"kind": "rectangle", "vertices": [tuple(c) for c in corners],
                                            "patient": patient, "x": x, "y": y,
                                            "x_scale": LINEAR, "y_scale": LINEAR}
    run(at)
    if to is not None:
        at.selectbox(key="ag_to").set_value(to)
        run(at)
    return at


def review_cd4_cd8(at: AppTest, patient: str) -> AppTest:
    """``patient`` picked for review on the Auto-gate page, on its CD4 / CD8 plot."""
    at.selectbox(key="ag_patient").set_value(patient)
    at.selectbox(key="ag_x").set_value("FL3-A")
    at.selectbox(key="ag_y").set_value("FL6-A")
    return run(at)


def plain(options) -> list[str]:
    """Selector options as population names (the tree's indentation and kinds taken off)."""
    return [re.sub(r" \((quadrant|range|boolean)\)$", "", o.replace("\u2003", "").replace("└ ", "")) for o in options]


def gate_table(at: AppTest) -> pd.DataFrame:
    (table,) = [d.value for d in at.dataframe if "F1" in d.value.columns]
    return table.assign(gate=plain(table["gate"])).set_index("gate")


def specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def title_of(spec) -> str:
    notes = spec["layout"].get("annotations") or [{"text": ""}]
    return (spec["layout"].get("title") or {}).get("text") or notes[0].get("text", "")


def report_counts(html: str) -> dict:
    """population -> count of the report's population table."""
    rows = re.findall(r"<tr><td>([^<]*)</td><td>[^<]*</td><td>\d+</td><td>([\d,]+)</td>", html)
    return {name: int(count.replace(",", "")) for name, count in rows}


# ------------------------------------------------------------------------------------ 1


def test_moving_a_vertex_relabels_only_the_cells_it_moves(loaded):
    """A tree covering Lymphocytes -> T cells / NK cells: moving a vertex of Lymphocytes relabels
    only cells whose gate membership changed; every population without a gate keeps exactly the
    model's labels and confidences, and "corrected by hand" counts the relabeled cells."""
    from gating_core.io.export import read_gated_csv
    from ui import exports

    store = store_of(loaded)
    at = autogate(loaded, drawn_tree(store, ["Lymphocytes", "T cells", "NK cells"]))
    record = store.patients[NEW]
    sample = record.sample
    model_labels = np.asarray(record.result.populations).astype(str).copy()
    model_confidence = np.asarray(record.result.confidence, dtype=float).copy()
    tree = GateTree.from_dict(record.autogates["tree"])
    at.selectbox(key=f"ag_edit_gate_{NEW}").set_value("Lymphocytes")
    run(at)
    # both plots a selection is drawn on (the correction's, the gate's parent's) offer the lasso
    # and the box in their toolbar, the lasso chosen
    drawing = drawing_charts(at)
    assert len(drawing) == 2
    assert all(c["buttons"] == {"lasso2d", "select2d"} and c["spec"]["layout"]["dragmode"] == "lasso"
               for c in drawing)
    # the gate's vertices are numbered on its plot as the vertex editor numbers them, the chosen one marked
    corners = np.asarray(tree["Lymphocytes"].drawing().corners)

    def numbered():
        (trace,) = [t for s in specs(at) for t in s["data"] if t.get("name") == "vertices"]
        return trace

    trace = numbered()
    assert trace["text"] == [str(i) for i in range(1, len(corners) + 1)]
    np.testing.assert_allclose(np.column_stack([trace["x"], trace["y"]]), corners)
    assert trace["marker"]["size"] == [11] + [6] * (len(corners) - 1)
    outward = corners - corners.mean(axis=0)  # each number placed away from the polygon's centre
    assert trace["cliponaxis"] is False  # numbers at the plot's edge are not cut off
    assert trace["textposition"] == [("top " if dy >= 0 else "bottom ") + ("right" if dx >= 0 else "left")
                                     for dx, dy in outward]
    at.selectbox(key=f"ag_vertex_{NEW}_Lymphocytes").set_value(3)
    run(at)
    assert numbered()["marker"]["size"] == [6, 6, 11] + [6] * (len(corners) - 3)
    at.selectbox(key=f"ag_vertex_{NEW}_Lymphocytes").set_value(1)
    run(at)
    inward = move_first_vertex(at, NEW, tree, "Lymphocytes", 0.3)
    edited = GateTree.from_dict(record.autogates["tree"])
    assert edited["Lymphocytes"].vertices[0] == pytest.approx(tuple(inward))
    before, after = tree.memberships(sample), edited.memberships(sample)
    changed = np.logical_or.reduce([before[n] != after[n] for n in tree.names])
    # the populations without a gate keep the model's labels and confidences exactly
    populations = np.asarray(record.populations).astype(str)
    untouched = ~np.isin(model_labels, edited.names)
    assert set(model_labels[untouched]) >= {"Granulocytes", "Monocytes", "Debris", "CD4 T cells"}
    np.testing.assert_array_equal(populations[untouched], model_labels[untouched])
    np.testing.assert_array_equal(record.confidence[untouched], model_confidence[untouched])
    # only cells whose gate membership changed are relabeled (the gate shrank: none entered it)
    assert changed.any() and not (after["Lymphocytes"] & ~before["Lymphocytes"]).any()
    relabeled = populations != model_labels
    assert relabeled.any() and not (relabeled & ~changed).any()
    assert any(c.value == f"{int(relabeled.sum()):,} cells corrected by hand." for c in at.caption)
    assert any(f"{int(relabeled.sum()):,} cells relabeled" in s.value for s in at.success)
    # the gated CSV holds the model's populations and confidences for them
    path = store.work_dir / "review.gated.csv"
    path.write_bytes(exports.gated_csv(record.populations_token, record, store.work_dir))
    _, exported, confidence = read_gated_csv(path)
    np.testing.assert_array_equal(np.asarray(exported).astype(str), populations)
    np.testing.assert_allclose(confidence[untouched], model_confidence[untouched], atol=1e-6)
    # fitting the gates again says so (no stale message of the vertex) and keeps the corrections
    at.button(key=f"ag_refit_{NEW}").click()
    run(at)
    (message,) = [s.value for s in at.success if not s.value.startswith(NEW)]
    assert message == (f"Fitted the gates of patient_01 to {NEW} again, around its reviewed cells: the "
                       f"{int(relabeled.sum()):,} cells corrected by hand keep their corrections (run auto-gating "
                       "again to drop them).")
    np.testing.assert_array_equal(np.asarray(record.populations).astype(str), populations)
    # a reload reads the same populations back
    again = goto(start(), "pages/5_autogate.py")
    stored = store_of(again).patients[NEW].load_result()
    np.testing.assert_array_equal(np.asarray(stored.populations).astype(str), populations)


# ------------------------------------------------------------------------------------ 3


def test_page_batch_table_statistics_gated_csv_and_report_count_the_same_cells(loaded):
    """After cells are reassigned by hand, every population has one count wherever it is shown."""
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY
    from gating_core.io.export import read_gated_csv
    from ui import exports

    store = store_of(loaded)
    patient = "new_patient_02"
    at = autogate(loaded, drawn_tree(store, [g[0] for g in SAMPLE_DATA_HIERARCHY]), targets=(patient,))
    record = store.patients[patient]
    predicted = np.asarray(record.populations).astype(str)
    fsc, ssc = (record.sample.events[:, record.sample.pnn.index(c)] for c in ("FSC-A", "SSC-A"))
    cd4 = predicted == "CD4 T cells"
    (x0, x1), (y0, y1) = np.percentile(fsc[cd4], [20, 80]), np.percentile(ssc[cd4], [20, 80])
    circle_box(at, patient, "FSC-A", "SSC-A", [(x0, y0), (x1, y1)])
    at.multiselect(key="ag_from").set_value(["CD4 T cells"])
    at.selectbox(key="ag_to").set_value("CD8 T cells")
    run(at)
    at.button(key="ag_reassign").click()
    run(at)
    populations = np.asarray(record.populations).astype(str)
    moved = int((populations != predicted).sum())
    assert moved > 100

    path = store.work_dir / "counts.gated.csv"
    path.write_bytes(exports.gated_csv(record.populations_token, record, store.work_dir))
    _, exported, _ = read_gated_csv(path)
    truth = pd.Series(np.asarray(exported).astype(str)).value_counts().to_dict()
    assert truth == pd.Series(populations).value_counts().to_dict()
    page = at.dataframe[0].value.set_index("population")["count"].to_dict()
    statistics = pd.read_csv(io.BytesIO(exports.statistics_csv([record]))).set_index("population")["count"]
    batch_csv = pd.read_csv(io.BytesIO(exports.batch_csv([record]))).set_index("population")["count"]
    batch_page = next(d.value for d in at.dataframe if "counted by" in d.value.columns).set_index("population")
    gates = gate_table(at)["count"]
    report = report_counts(exports.patient_report(record).decode("utf-8"))
    for population, count in truth.items():
        assert page[population] == count, population
        assert statistics[population] == count, population
        assert batch_csv[population] == count, population
        assert batch_page.loc[population, "count"] == count, population
        assert report[population] == count, population
        if population in gates.index:
            assert gates[population] == count, population
    # a parent gate counts every cell counted below it
    assert batch_csv["T cells"] >= truth["CD4 T cells"] + truth["CD8 T cells"]
    assert report["T cells"] == batch_csv["T cells"] == gates["T cells"]


# ------------------------------------------------------------------------------------ 2 and 11


def test_report_draws_quadrant_and_range_gates_and_a_failure_says_why(loaded, monkeypatch):
    from ui import exports

    store = store_of(loaded)
    tree = with_quadrants_and_range(store, drawn_tree(store, ["Debris", "Lymphocytes", "T cells", "NK cells"]))
    at = autogate(loaded, tree)
    record = store.patients[NEW]
    button = next(b for b in at.get("download_button") if b.proto.label == f"Report of {NEW} (HTML)")
    assert not button.proto.disabled
    html = exports.patient_report(record).decode("utf-8")
    svgs = re.findall(r"<svg.*?</svg>", html)
    quadrants = next(s for s in svgs if "T cells \u2192 CD4+ CD8+" in s)
    assert quadrants.count("<line") == 2 and all(f">{n} " in quadrants for n in QUADRANT_NAMES.values())
    band = next(s for s in svgs if "Lymphocytes \u2192 CD19 bright" in s)
    assert 'fill-opacity="0.12"' in band
    # any failure is shown on the page with its reason, the download off
    import gating_core.reports.report

    def broken(*args, **kwargs):
        raise ValueError("the disk is full")

    monkeypatch.setattr(gating_core.reports.report, "patient_report_html", broken)
    exports._patient_report.clear()
    at.run()
    assert any(e.value == f"The report of {NEW} cannot be written: ValueError: the disk is full" for e in at.error)
    button = next(b for b in at.get("download_button") if b.proto.label == f"Report of {NEW} (HTML)")
    assert button.proto.disabled


def test_quadrant_and_range_gates_are_drawn_and_adjusted_on_the_autogate_page(loaded):
    store = store_of(loaded)
    tree = with_quadrants_and_range(store, drawn_tree(store, ["Debris", "Lymphocytes", "T cells", "NK cells"]))
    at = autogate(loaded, tree)
    record = store.patients[NEW]
    drawn = {title_of(s): s for s in specs(at)}
    quadrant_plot = drawn["T cells → CD4+ CD8+, CD4 T cells, CD8 T cells, CD4- CD8-"]
    assert [s["type"] for s in quadrant_plot["layout"]["shapes"]] == ["line", "line"]
    labels = {a["text"] for a in quadrant_plot["layout"]["annotations"]}
    assert {f"<b>{n}</b>" for n in QUADRANT_NAMES.values()} <= labels
    range_plot = drawn["Lymphocytes → CD19 bright"]
    (band,) = range_plot["layout"]["shapes"]
    low, high = tree["CD19 bright"].vertices[0]
    assert (band["x0"], band["x1"]) == pytest.approx((low, high))

    # the quadrant's split point, typed: the four quadrants move together
    at.selectbox(key=f"ag_edit_gate_{NEW}").set_value("CD8 T cells")
    run(at)
    split = tree["CD8 T cells"]
    boxes = at.number_input(key=f"ag_qx_{NEW}_CD8 T cells"), at.number_input(key=f"ag_qy_{NEW}_CD8 T cells")
    assert [box.label for box in boxes] == ["split FL3-A", "split FL6-A"]
    assert [box.value for box in boxes] == pytest.approx([raw_value(split.x_scale, 3.0), raw_value(split.y_scale, 3.0)],
                                                         rel=1e-5)
    boxes[0].set_value(raw_value(split.x_scale, 3.5))
    boxes[1].set_value(raw_value(split.y_scale, 2.5))
    run(at)
    at.button(key="ag_move_split").click()
    run(at)
    edited = GateTree.from_dict(record.autogates["tree"])
    moved = [edited[n].vertices[0] for n in QUADRANT_NAMES.values()]
    assert len(set(moved)) == 1 and moved[0] == pytest.approx((3.5, 2.5))
    assert any(s.value.startswith("Moved the split of CD8 T cells") for s in at.success)
    # the range's bounds, typed
    at.selectbox(key=f"ag_edit_gate_{NEW}").set_value("CD19 bright")
    run(at)
    band_scale = tree["CD19 bright"].x_scale
    at.number_input(key=f"ag_rlo_{NEW}_CD19 bright").set_value(raw_value(band_scale, 2.0))
    at.number_input(key=f"ag_rhi_{NEW}_CD19 bright").set_value(raw_value(band_scale, 8.0))
    run(at)
    at.button(key="ag_set_range").click()
    run(at)
    edited = GateTree.from_dict(record.autogates["tree"])
    assert edited["CD19 bright"].vertices[0] == pytest.approx((2.0, 8.0))
    inside = edited.memberships(record.sample)["CD19 bright"]
    table = gate_table(at)
    assert table.loc["CD19 bright", "in gate"] == inside.sum()
    # no population is predicted in the range or the unnamed quadrants: their F1 is a dash, not "None"
    assert table.loc["CD19 bright", "F1"] == table.loc["CD4+ CD8+", "F1"] == "—"
    scored = table["F1"][table["F1"] != "—"].astype(float)
    assert len(scored) and ((scored >= 0) & (scored <= 1)).all()


# ------------------------------------------------------------------------------------ 12


def test_gates_that_cannot_be_fitted_are_named_and_kept_as_drawn(loaded):
    """"T cells" names no population of the model (it predicts CD4 and CD8 T cells): it is kept
    as drawn, and so is Lymphocytes, which a fit to NK cells alone would shrink to them."""
    from ui import exports

    store = store_of(loaded)
    template = drawn_tree(store, ["Lymphocytes", "T cells", "NK cells"])
    at = autogate(loaded, template, targets=(NEW, "new_patient_03"))
    for patient in (NEW, "new_patient_03"):
        at.selectbox(key="ag_patient").set_value(patient)
        run(at)
        record = store.patients[patient]
        tree = GateTree.from_dict(record.autogates["tree"])
        assert tree["Lymphocytes"] == template["Lymphocytes"] and tree["T cells"] == template["T cells"]
        unfitted = record.autogates["unfitted"]
        assert unfitted["T cells"] == "no population of the model has this name, so no cell is predicted in it"
        assert unfitted["Lymphocytes"].startswith("T cells below it names no population of the model")
        (warning,) = [w.value for w in at.warning if w.value.startswith("Kept as drawn on patient_01")]
        assert "**T cells**: no population of the model has this name" in warning
        assert "**Lymphocytes**: T cells below it names no population" in warning
        html = exports.patient_report(record).decode("utf-8")
        assert "Gates kept as the template drew them:" in html and "<li>Lymphocytes: T cells below it" in html
    masks = GateTree.from_dict(store.patients[NEW].autogates["tree"]).memberships(store.patients[NEW].sample)
    assert masks["Lymphocytes"].sum() > 2000  # as drawn; a fit to the NK cells alone held a few hundred


# ------------------------------------------------------------------------------------ 14


def test_trees_and_selectors_are_depth_first_everywhere(loaded):
    """NK cells drawn before T cells' quadrants: every list shows T cells' quadrants under it."""
    from ui import exports

    store = store_of(loaded)
    tree = with_quadrants_and_range(store, drawn_tree(store, ["Lymphocytes", "T cells", "NK cells"]))
    assert tree.names.index("NK cells") < tree.names.index("CD4 T cells")
    depth_first = ["Lymphocytes", "T cells", "CD4+ CD8+", "CD4 T cells", "CD8 T cells", "CD4- CD8-", "NK cells",
                   "CD19 bright"]
    store.save_gates("patient_01", tree)
    at = goto(loaded, "pages/3_gate.py")
    at.selectbox(key="gate_patient").set_value("patient_01")
    run(at)
    assert plain(at.selectbox(key="gate_focus").options) == ["(all events)"] + depth_first
    assert plain(at.selectbox(key="gate_parent").options) == ["(all events)"] + depth_first
    assert plain(at.selectbox(key="edit_which").options) == depth_first
    assert plain(at.selectbox(key="backgate_which").options) == depth_first
    (stats,) = [d.value for d in at.dataframe if "axes" in d.value.columns]
    assert plain(stats["gate"]) == depth_first

    at = autogate(at, tree)
    assert list(gate_table(at).index) == depth_first
    assert plain(at.selectbox(key=f"ag_edit_gate_{NEW}").options) == depth_first
    batch = next(d.value for d in at.dataframe if "counted by" in d.value.columns)
    assert batch["population"].tolist()[:len(depth_first)] == depth_first
    report = list(report_counts(exports.patient_report(store.patients[NEW]).decode("utf-8")))
    assert report[:len(depth_first)] == depth_first


# ------------------------------------------------------------------------------------ 15


def test_fit_again_defaults_to_the_training_patient_whose_gates_were_drawn(loaded):
    """An accepted patient carries gates too; the template offered first stays the training
    patient the lab drew the tree on."""
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY

    store = store_of(loaded)
    at = autogate(loaded, drawn_tree(store, [g[0] for g in SAMPLE_DATA_HIERARCHY]), targets=(NEW, "new_patient_02"))
    at.button(key=f"ag_accept_{NEW}").click()
    run(at)
    at.button(key=f"ag_accept_{NEW}_confirm").click()
    run(at)
    assert store.patients[NEW].is_labeled and len(store.patients[NEW].gate_tree)
    at.selectbox(key="ag_patient").set_value("new_patient_02")
    run(at)
    choice = at.selectbox(key="ag_template_new_patient_02")
    assert choice.value == "patient_01" and set(choice.options) == {"patient_01", NEW}
    # a patient gated after the acceptance is fitted from the drawn tree too
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_03"])
    at.button(key="ag_run").click()
    run(at)
    at.selectbox(key="ag_patient").set_value("new_patient_03")
    run(at)
    assert store.patients["new_patient_03"].autogates["template"] == "patient_01"


def test_the_review_starts_again_from_the_transfer_model_alone(loaded):
    """A calm patient (its parts agree, so the comparison starts closed): gated with each part,
    then reviewed from the transfer model alone; the batch table and the library say so."""
    from apptest_helpers import reload
    from ui import exports

    at = train_quick_model(loaded)
    at = goto(at, "pages/5_autogate.py")
    store = store_of(at)
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value([NEW])
    at.button(key="ag_run").click()
    at = run(at)
    (comparison,) = [e for e in at.expander if e.label == "Compare the model's parts"]
    assert not comparison.proto.expanded
    model = store.models[store.current_model]
    assert model.gating_parts() == ("transfer", "adapted")
    at.button(key="ag_parts_run").click()
    at = run(at)
    assert "ag_parts_run" not in [b.key for b in at.button]  # done: the comparison is drawn without it
    record = store.patients[NEW]
    expected = model.gate(record.sample, part="transfer")
    (table,) = [d.value for d in at.dataframe if "under review" in d.value.columns]
    counts = table["the transfer model alone"].drop("cells unlike the gating under review")
    assert {k: v for k, v in counts.items() if v} == {k: v for k, v in expected.counts.items() if v}

    def choice():
        return at.radio(key=f"ag_parts_choice_{NEW}_{record.result_token}")

    assert choice().value == ""  # the model's own gating is under review
    choice().set_value("transfer")
    at = run(at)
    token = record.result_token
    at.button(key=f"ag_parts_apply_{NEW}_{token}").click()
    at = run(at)
    at.button(key=f"ag_parts_apply_{NEW}_{token}_confirm").click()
    at = run(at)
    assert record.result.part == "transfer" and record.corrected is None
    np.testing.assert_array_equal(record.populations.astype(str), expected.populations.astype(str))
    source = f"auto-gate ({store.current_model}, the transfer model alone)"
    assert set(exports.batch_frame([record])["source"]) == {source}
    assert choice().value == "transfer"
    again = reload(at, "pages/5_autogate.py")
    assert store_of(again).patients[NEW].load_result().part == "transfer"
    # gated again by the model: the comparison starts from the model's own gating again
    at.button(key="ag_run").click()
    at = run(at)
    assert record.result.part is None and choice().value == ""
    assert not any(b.label.startswith("Review from") for b in at.button)


def test_a_correction_refits_the_fitted_gates_and_keeps_one_confidence(loaded):
    """Cells reassigned by hand: gates fitted from the template are fitted again around the
    corrected cells; gates adjusted by hand are kept and marked as drawn before the correction;
    the circled cells' confidence is 1.0 (those already in the chosen population too), and the
    library holds the same confidences as the page."""
    from apptest_helpers import reload
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY, fit_gate_tree

    store = store_of(loaded)
    patient = "new_patient_02"
    at = autogate(loaded, drawn_tree(store, [g[0] for g in SAMPLE_DATA_HIERARCHY]), targets=(patient,))
    review_cd4_cd8(at, patient)
    record = store.patients[patient]
    sample = record.sample
    predicted = np.asarray(record.populations).astype(str)
    fitted_before = GateTree.from_dict(record.autogates["tree"])
    fl3, fl6 = (sample.events[:, sample.pnn.index(c)] for c in ("FL3-A", "FL6-A"))
    # a box over the cores of both the CD4 and the CD8 T cells on the CD4 / CD8 plot
    cores = [np.percentile(np.stack([fl3, fl6], axis=1)[predicted == p], [20, 80], axis=0)
             for p in ("CD4 T cells", "CD8 T cells")]
    (x0, y0), (x1, y1) = np.min([c[0] for c in cores], axis=0), np.max([c[1] for c in cores], axis=0)
    circle_box(at, patient, "FL3-A", "FL6-A", [(x0, y0), (x1, y1)])
    at.multiselect(key="ag_from").set_value(["CD4 T cells", "CD8 T cells"])
    at.selectbox(key="ag_to").set_value("CD8 T cells")
    run(at)
    inside = (fl3 >= x0) & (fl3 <= x1) & (fl6 >= y0) & (fl6 <= y1) & np.isin(predicted, ["CD4 T cells", "CD8 T cells"])
    already = int((predicted[inside] == "CD8 T cells").sum())
    assert already > 0 and (predicted[inside] == "CD4 T cells").sum() > 100
    at.button(key="ag_reassign").click()
    run(at)
    (message,) = [s.value for s in at.success if s.value.startswith("Reassigned")]
    assert message == (f"Reassigned {int(inside.sum()):,} circled cells to CD8 T cells ({already:,} of them were "
                       "CD8 T cells already). The gates of patient_01 were fitted again to the corrected cells.")
    populations = np.asarray(record.populations).astype(str)
    assert (populations[inside] == "CD8 T cells").all()
    # the gates now are the template's fitted to the reviewed cells, not to the model's gating
    refitted = GateTree.from_dict(record.autogates["tree"])
    assert not record.autogates.get("edited")
    template = store.patients["patient_01"].gate_tree
    known = [str(p) for p in store.models[store.current_model].populations_]
    expected = fit_gate_tree(template, sample, populations, known=known).tree
    assert refitted.to_dict() == expected.to_dict()
    assert fit_gate_tree(template, sample, predicted, known=known).tree.to_dict() == fitted_before.to_dict()
    assert refitted["CD4 T cells"].to_dict() != fitted_before["CD4 T cells"].to_dict()
    # every circled cell is a human decision, those already CD8 T cells included
    confidence = record.confidence
    assert (confidence[inside] == 1.0).all()
    np.testing.assert_array_equal(confidence[~inside], np.asarray(record.result.confidence, dtype=float)[~inside])
    low = int((confidence < 0.6).sum())
    assert any(m.value.startswith(f"**Confidence** · {low:,} cells") for m in at.markdown)
    again = reload(at, "pages/5_autogate.py")
    stored = store_of(again).patients[patient].load_result()
    np.testing.assert_allclose(stored.confidence, confidence, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(stored.populations).astype(str), populations)
    assert stored.details["cells corrected"] == int((populations != predicted).sum())
    # refined in a later session: the model gates the patient again, and the review read back
    # stands over that gating as corrections, shown and stored as they were
    assert not again.checkbox(key="ag_refine").disabled
    assert any(c.value.startswith("Corrected in an earlier session: applying corrections to similar cells gates")
               for c in again.caption)
    again.checkbox(key="ag_refine").check()
    run(again)
    reopened = store_of(again).patients[patient]
    np.testing.assert_array_equal(np.asarray(reopened.result.populations).astype(str), predicted)
    np.testing.assert_array_equal(np.asarray(reopened.populations).astype(str), populations)
    np.testing.assert_allclose(reopened.confidence, confidence, atol=1e-6)
    assert reopened.corrected_count() == int((populations != predicted).sum()) and reopened.is_reviewed
    # a refined correction then keeps every earlier one outside its lasso
    again.selectbox(key="ag_x").set_value("FL3-A")
    again.selectbox(key="ag_y").set_value("FL6-A")
    lx0, lx1 = np.percentile(fl3, [70, 80])
    ly0, ly1 = np.percentile(fl6, [70, 80])
    circle_box(again, patient, "FL3-A", "FL6-A", [(lx0, ly0), (lx1, ly1)], to="CD4 T cells")
    again.button(key="ag_reassign").click()
    run(again)
    assert any(m.value.startswith("Reassigned") and "the refinement moved" in m.value for m in again.success)
    lassoed = (fl3 >= lx0) & (fl3 <= lx1) & (fl6 >= ly0) & (fl6 <= ly1)
    earlier = (populations != predicted) & ~lassoed
    assert earlier.any()
    refined_now = np.asarray(reopened.populations).astype(str)
    np.testing.assert_array_equal(refined_now[earlier], populations[earlier])
    assert (refined_now[lassoed] == "CD4 T cells").all()

    # a gate adjusted by hand, then another correction: the gates stay as adjusted, and say so
    at.selectbox(key=f"ag_edit_gate_{patient}").set_value("Lymphocytes")
    run(at)
    move_first_vertex(at, patient, refitted, "Lymphocytes", 0.2)
    adjusted = record.autogates["tree"]
    circle_box(at, patient, "FL3-A", "FL6-A", [(x0, y0), (x1, y1)], to="CD4 T cells")
    at.button(key="ag_reassign").click()
    run(at)
    (message,) = [s.value for s in at.success if s.value.startswith("Reassigned")]
    assert message.endswith("The gates adjusted by hand are kept as they were: fit them again (Gates) to follow "
                            "the corrections.")
    assert record.autogates["tree"] == adjusted and record.autogates["before correction"]
    assert any("adjusted by hand before cells were corrected" in w.value for w in at.warning)
    kept = store_of(reload(at, "pages/5_autogate.py")).patients[patient]
    kept.load_result()
    assert kept.autogates["before correction"]
    # gates fitted again in a later session (a template drawn since, say) keep the review
    count = kept.load_result().details["cells corrected"]
    assert count == int((np.asarray(record.populations).astype(str) != predicted).sum())
    later = store_of(reload(at, "pages/5_autogate.py"))
    later.set_autogates(patient, refitted, "patient_01")
    details = store_of(reload(at, "pages/5_autogate.py")).patients[patient].load_result().details
    assert details["corrected in review"] and details["cells corrected"] == count


def test_corrections_are_undone_last_first_gates_and_library_included(loaded):
    """Two reassignments, then undo twice: each undo puts back the populations, confidence and
    fitted gates as they were before that correction, in the page and in the library."""
    from apptest_helpers import reload
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY

    store = store_of(loaded)
    patient = "new_patient_02"
    at = autogate(loaded, drawn_tree(store, [g[0] for g in SAMPLE_DATA_HIERARCHY]), targets=(patient,))
    review_cd4_cd8(at, patient)
    assert "ag_undo_last" not in [b.key for b in at.button]  # nothing corrected yet
    record = store.patients[patient]
    predicted = np.asarray(record.populations).astype(str)
    model_confidence = np.asarray(record.confidence, dtype=float)
    gates_before = record.autogates["tree"]
    sample = record.sample
    fl3, fl6 = (sample.events[:, sample.pnn.index(c)] for c in ("FL3-A", "FL6-A"))
    states = []
    for low, to in ((20, "CD8 T cells"), (60, "CD4 T cells")):
        x0, x1 = np.percentile(fl3, [low, low + 20])
        y0, y1 = np.percentile(fl6, [low, low + 20])
        circle_box(at, patient, "FL3-A", "FL6-A", [(x0, y0), (x1, y1)], to=to)
        states.append((np.asarray(record.populations).astype(str).copy(), record.confidence.copy(),
                       record.autogates["tree"]))
        at.button(key="ag_reassign").click()
        run(at)
    after_two = np.asarray(record.populations).astype(str)
    assert (after_two != states[1][0]).any() and (states[1][0] != predicted).any()
    assert at.button(key="ag_undo_last").label == "Undo the last correction (2 to undo)"
    at.button(key="ag_undo_last").click()
    run(at)
    assert any(s.value == "The last correction was undone." for s in at.success)
    np.testing.assert_array_equal(np.asarray(record.populations).astype(str), states[1][0])
    np.testing.assert_array_equal(record.confidence, states[1][1])
    assert record.autogates["tree"] == states[1][2] and record.is_reviewed
    at.button(key="ag_undo_last").click()
    run(at)
    # back to the model's gating: nothing corrected, the gates fitted to its prediction
    assert record.corrected is None and not record.is_reviewed
    np.testing.assert_array_equal(np.asarray(record.populations).astype(str), predicted)
    np.testing.assert_array_equal(record.confidence, model_confidence)
    assert record.autogates["tree"] == gates_before
    assert "ag_undo_last" not in [b.key for b in at.button]
    stored = store_of(reload(at, "pages/5_autogate.py")).patients[patient].load_result()
    np.testing.assert_array_equal(np.asarray(stored.populations).astype(str), predicted)
    assert "corrected in review" not in stored.details and stored.details["autogates"]["tree"] == gates_before


def test_the_review_starts_at_the_first_patient_to_review_and_keeps_the_choice(loaded):
    """Three gated patients, the second flagged: the picker opens on it; a patient chosen by hand
    is still chosen after a visit to another page."""
    import dataclasses

    from apptest_helpers import reload

    at = train_quick_model(loaded)
    store = store_of(at)
    model = store.models[store.current_model]
    for name in (NEW, "new_patient_02", "new_patient_03"):
        result = model.gate(store.patients[name].sample)
        if name == "new_patient_02":
            result.novelty = dataclasses.replace(result.novelty, disagreement=0.5)
        store.set_result(name, result, store.current_model)
    from ui.app_state import review_worklist

    names = [NEW, "new_patient_02", "new_patient_03"]
    worklist = review_worklist({n: store.patients[n].result_novelty for n in names})
    flagged = list(worklist.loc[worklist["review"] != "", "patient"])
    assert "new_patient_02" in flagged and NEW not in flagged
    at = goto(at, "pages/5_autogate.py")
    picker = at.selectbox(key="ag_patient")
    assert picker.value == flagged[0] and picker.options[1] == "new_patient_02 · to review"
    chosen = next(n for n in names[1:] if n != flagged[0])  # neither the first listed nor the default
    picker.set_value(chosen)
    run(at)
    at = goto(goto(at, "pages/1_data.py"), "pages/5_autogate.py")
    assert at.selectbox(key="ag_patient").value == chosen
    # accepted, the flagged patient is no longer to review, in this tab or after a reload
    store.accept("new_patient_02")
    for shown in (run(at), reload(at, "pages/5_autogate.py")):
        picker = shown.selectbox(key="ag_patient")
        assert "new_patient_02" in picker.options and "new_patient_02 · to review" not in picker.options


def test_cells_can_be_named_as_a_population_the_model_lacks(loaded):
    """A cluster the model has no population for is named in review; the refinement, which can
    only spread the model's populations, leaves those cells as named; accepting says the
    population is new."""
    from ui.app_state import new_population_name

    assert new_population_name("  blasts ", ["B cells"]) == ("blasts", None)
    assert new_population_name("b CELLS", ["B cells"]) == ("B cells", None)
    assert new_population_name("", ["B cells"])[0] is None
    assert new_population_name("Unknown", ["B cells"])[1].startswith("'unknown' is what the model calls")
    # a patient with unknown cells has 'unknown' among its populations: still no name to give
    assert new_population_name("unknown", ["B cells", "unknown"])[0] is None
    assert new_population_name("CD4/CD8", ["B cells"])[1].startswith("A population's name is 1-80")

    at = autogate(loaded, drawn_tree(store_of(loaded), ["Lymphocytes"]))
    store = store_of(at)
    record = store.patients[NEW]
    predicted = np.asarray(record.populations).astype(str)
    fsc, ssc = (record.sample.events[:, record.sample.pnn.index(c)] for c in ("FSC-A", "SSC-A"))
    granulocytes = predicted == "Granulocytes"
    (x0, x1), (y0, y1) = np.percentile(fsc[granulocytes], [30, 70]), np.percentile(ssc[granulocytes], [30, 70])

    def circle(to, name=None, refine=False):
        circle_box(at, NEW, "FSC-A", "SSC-A", [(x0, y0), (x1, y1)])
        at.multiselect(key="ag_from").set_value(["Granulocytes"] if to != "New population…" else [])
        at.checkbox(key="ag_refine").set_value(refine)
        at.selectbox(key="ag_to").set_value(to)
        run(at)
        if name is not None:
            at.text_input(key="ag_new_population").input(name)
            run(at)

    circle("New population…", "blasts", refine=True)
    assert "blasts is no population of the model: only the circled cells change." in [c.value for c in at.caption]
    at.button(key="ag_reassign").click()
    run(at)
    inside = (fsc >= x0) & (fsc <= x1) & (ssc >= y0) & (ssc <= y1)
    populations = np.asarray(record.populations).astype(str)
    assert (populations[inside] == "blasts").all() and (populations[~inside] == predicted[~inside]).all()
    assert (record.confidence[inside] == 1.0).all()
    # a refined correction to one of the model's populations elsewhere keeps the named cells
    (x0, x1), (y0, y1) = np.percentile(fsc[~inside], [1, 5]), np.percentile(ssc[~inside], [1, 5])
    circle("Debris", refine=True)
    at.button(key="ag_reassign").click()
    run(at)
    populations = np.asarray(record.populations).astype(str)
    assert (populations[inside] == "blasts").all()
    at.button(key=f"ag_accept_{NEW}").click()
    run(at)
    box = at.checkbox(key=f"ag_accept_{NEW}_ack")
    assert "blasts, named in this review, is a new population the next training learns from" in box.label
    # gated again, its review discarded as the page asks first: the corrections of the earlier
    # gating are not carried into the new one's refinement
    assert at.button(key="ag_run").disabled
    at.checkbox(key="ag_discard_review").check()
    run(at)
    at.button(key="ag_run").click()
    run(at)
    assert "blasts" not in set(np.asarray(record.populations).astype(str))
    circle("Debris", refine=True)
    at.button(key="ag_reassign").click()
    run(at)
    assert "blasts" not in set(np.asarray(record.populations).astype(str))
    base, cells = at.session_state["ag_circled"][NEW]
    assert base == id(record.result) and set(cells.values()) == {"Debris"}


def test_gates_are_fitted_with_the_populations_of_the_model_that_gated_the_patient(loaded):
    """A patient gated by one model is reviewed while another, trained without NK cells, is the
    current model: the gates are fitted again with the gating model's populations. Its NK cells
    gate names a population that model predicts (none of this patient's cells after the review),
    so the Lymphocytes gate above it is fitted, not kept as drawn for a gate named like nothing."""
    from gating_core.model import GatingModel

    store = store_of(loaded)
    at = autogate(loaded, drawn_tree(store, ["Lymphocytes", "T cells", "CD4 T cells", "CD8 T cells", "B cells",
                                             "NK cells"]))
    gated_by = store.patients[NEW].result_model
    assert "NK cells" in store.gating_populations(NEW)
    # the reviewer gives every NK cell to the B cells
    reviewed = np.asarray(store.patients[NEW].populations).astype(str).astype(object)
    assert (reviewed == "NK cells").sum() > 100
    reviewed[reviewed == "NK cells"] = "B cells"
    store.correct(NEW, reviewed, store.patients[NEW].confidence)

    trained_on = ["patient_02", "patient_03"]
    merged = [np.where(np.asarray(store.patients[n].labels).astype(str) == "NK cells", "B cells",
                       np.asarray(store.patients[n].labels).astype(str)) for n in trained_on]
    other = GatingModel(select=False, cells_per_patient=500, embedding_cells=2000, random_state=0).fit(
        [store.patients[n].sample for n in trained_on], merged)
    assert "NK cells" not in other.populations_
    store.add_model("without NK cells", other, trained_on)
    assert store.current_model != gated_by
    run(at)
    assert at.selectbox(key="ag_model").value == store.current_model
    at.button(key=f"ag_refit_{NEW}").click()
    run(at)
    gates = store.patients[NEW].autogates
    assert gates["template"] == "patient_01"
    assert "NK cells" in gates["populations"]
    assert "Lymphocytes" not in gates["unfitted"], gates["unfitted"]
    assert gates["unfitted"]["NK cells"] == "no cell of this patient is predicted in its population"


def test_cells_corrected_in_two_sessions_are_counted_together_on_the_page_and_in_the_report(loaded):
    """Cells corrected in one session and more in the next: the page counts both (naming the
    earlier session's share), the library stores the sum, and the HTML report says so; once
    accepted, the page and the report keep the gating's flags as history, not as a task."""
    from apptest_helpers import reload
    from gating_core.gates.autogates import SAMPLE_DATA_HIERARCHY
    from ui import exports

    store = store_of(loaded)
    patient = "new_patient_02"
    at = autogate(loaded, drawn_tree(store, [g[0] for g in SAMPLE_DATA_HIERARCHY]), targets=(patient,))
    review_cd4_cd8(at, patient)
    record = store.patients[patient]
    predicted = np.asarray(record.populations).astype(str)
    sample = record.sample
    fl3, fl6 = (sample.events[:, sample.pnn.index(c)] for c in ("FL3-A", "FL6-A"))
    first = [tuple(np.percentile(fl3, [10, 30])), tuple(np.percentile(fl6, [10, 30]))]
    circle_box(at, patient, "FL3-A", "FL6-A", [(first[0][0], first[1][0]), (first[0][1], first[1][1])],
               to="CD8 T cells")
    at.button(key="ag_reassign").click()
    run(at)
    earlier = int((np.asarray(record.populations).astype(str) != predicted).sum())
    assert earlier > 50
    assert any(c.value == f"{earlier:,} cells corrected by hand." for c in at.caption)

    again = reload(at, "pages/5_autogate.py")
    review_cd4_cd8(again, patient)
    kept = store_of(again).patients[patient]
    reviewed = np.asarray(kept.populations).astype(str).copy()
    (x0, x1), (y0, y1) = np.percentile(fl3, [60, 80]), np.percentile(fl6, [60, 80])
    circle_box(again, patient, "FL3-A", "FL6-A", [(x0, y0), (x1, y1)], to="CD4 T cells")
    again.button(key="ag_reassign").click()
    run(again)
    now = np.asarray(kept.populations).astype(str)
    this_session = int((now != reviewed).sum())
    assert this_session > 50 and kept.corrected_count() == this_session
    total = earlier + this_session
    assert kept.cells_corrected() == total
    assert any(c.value == f"{total:,} cells corrected by hand ({earlier:,} of them in an earlier session)."
               for c in again.caption)
    stored = store_of(reload(again, "pages/5_autogate.py")).patients[patient].load_result()
    assert stored.details["cells corrected"] == total
    report = exports.patient_report(kept).decode()
    assert f"<p>Reviewed: {total:,} cells corrected by hand.</p>" in report

    # accepted: the picker and the page no longer ask for a review, and the report says accepted
    store_of(again).accept(patient)
    run(again)
    assert again.selectbox(key="ag_patient").format_func(patient) == patient
    assert any(i.value == f"{patient} was accepted: it is a historical patient for the next training."
               for i in again.info)
    assert not [w.value for w in again.warning if "review its populations by hand" in w.value]
    report = exports.patient_report(kept).decode()
    assert f"<p>Reviewed: {total:,} cells corrected by hand; accepted as the patient's labels.</p>" in report
    assert ": review the populations by hand." not in report


def test_gating_again_asks_before_it_discards_a_review(loaded):
    """A patient with corrected cells is left out of the next run by default, and gated again
    only once the reviewer ticks that its review is to be discarded."""
    from apptest_helpers import reload

    store = store_of(loaded)
    patient = "new_patient_02"
    at = autogate(loaded, drawn_tree(store, ["Debris", "Lymphocytes", "T cells"]), targets=(patient, "new_patient_03"))
    review_cd4_cd8(at, patient)
    record = store.patients[patient]
    sample = record.sample
    fl3, fl6 = (sample.events[:, sample.pnn.index(c)] for c in ("FL3-A", "FL6-A"))
    circle_box(at, patient, "FL3-A", "FL6-A", [(float(np.median(fl3)), float(fl6.min())), (float(fl3.max()), float(fl6.max()))],
               to="other")
    at.button(key="ag_reassign").click()
    run(at)
    assert record.is_reviewed
    reviewed = np.asarray(record.populations).astype(str).copy()
    # the targets of the last run are kept: the run waits for the reviewer's word
    targets = f"ag_targets_{store.current_model}"
    assert patient in at.multiselect(key=targets).value
    discard = at.checkbox(key="ag_discard_review")
    assert discard.label == f"Discard the review of {patient} and gate it again" and not discard.value
    assert at.button(key="ag_run").disabled
    # a fresh visit leaves it out, and says why
    again = reload(at, "pages/5_autogate.py")
    assert at.multiselect  # the page drew its picker
    assert patient not in again.multiselect(key=targets).value
    assert f"{patient} is not selected: it is under review, and gating it again would discard its corrections." in [
        c.value for c in again.caption]
    assert not again.button(key="ag_run").disabled and not [c for c in again.checkbox if c.key == "ag_discard_review"]
    again_record = store_of(again).patients[patient]
    np.testing.assert_array_equal(np.asarray(again_record.populations).astype(str), reviewed)
    # ticked: gated again, the corrections discarded
    at.checkbox(key="ag_discard_review").check()
    run(at)
    assert not at.button(key="ag_run").disabled
    at.button(key="ag_run").click()
    run(at)
    assert not record.is_reviewed
    np.testing.assert_array_equal(np.asarray(record.populations).astype(str),
                                  np.asarray(record.result.populations).astype(str))
