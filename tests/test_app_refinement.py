"""Auto-gate page: "Apply corrections to similar cells" (gating_core.method.refinement) in the app."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from apptest_helpers import goto, start, train_quick_model
from gating_core.gates import AxisScale, rectangle_gate

LINEAR = {"kind": "linear"}


@pytest.fixture
def autogated(library):
    """The sample data, a quick marginal model of three patients, every new patient auto-gated.
    The model has no pooled companion: with one, new_patient_03 (strong drift, far from the
    three) is gated mostly by the companion and leaves too few errors to correct."""
    at = start()
    at.button[0].click()  # load the sample data
    at.run()
    # The transfer model alone: a three-patient model that gets cells of the drifted patient wrong.
    at = goto(train_quick_model(at, pooled_weight=0.0, adaptive_weight=0.0), "pages/5_autogate.py")
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    return at


def lasso_on_errors(record, truth, n_cells=15):
    """A box on FSC-A / SSC-A around ``n_cells`` cells of the commonest error kind (true A gated
    as B), as the reviewer would draw it: (box in display coordinates, A, B)."""
    populations = np.asarray(record.populations).astype(str)
    wrong = np.flatnonzero(populations != truth)
    kinds, counts = np.unique(np.char.add(np.char.add(truth[wrong], "|"), populations[wrong]), return_counts=True)
    true_pop, shown = kinds[np.argmax(counts)].split("|")
    kind = wrong[(truth[wrong] == true_pop) & (populations[wrong] == shown)]
    sample = record.sample
    xy = np.column_stack([sample.events[:, sample.pnn.index("FSC-A")], sample.events[:, sample.pnn.index("SSC-A")]])
    spread = xy.std(axis=0)
    nearest = kind[np.argsort((((xy[kind] - xy[kind[0]]) / spread) ** 2).sum(axis=1), kind="stable")[:n_cells]]
    (x0, y0), (x1, y1) = xy[nearest].min(axis=0), xy[nearest].max(axis=0)
    return [(float(x0), float(y0)), (float(x1), float(y1))], true_pop, shown


def circle(at, patient, vertices):
    at.session_state["ag_pending_shape"] = {"kind": "rectangle", "vertices": vertices, "patient": patient,
                                            "x": "FSC-A", "y": "SSC-A", "x_scale": LINEAR, "y_scale": LINEAR}
    at.run()
    assert not at.exception, at.exception


def inside_box(record, vertices, from_pop):
    (x0, y0), (x1, y1) = vertices
    box = rectangle_gate("selection", "FSC-A", "SSC-A", (x0, x1), (y0, y1), AxisScale.from_dict(LINEAR),
                         AxisScale.from_dict(LINEAR))
    return box.contains(record.sample) & (np.asarray(record.populations).astype(str) == from_pop)


def circle_errors(at, sample_data_dir, patient="new_patient_03"):
    """Open ``patient`` on the Auto-gate page, circle a box of wrongly gated cells and choose
    their true population as the target. ``new_patient_03`` is measured with strong drift: the
    three-patient model gets cells wrong there. Returns (record, truth, populations before,
    true population, cells inside the box)."""
    at.selectbox(key="ag_patient").set_value(patient)
    at.run()
    record = at.session_state["store"].patients[patient]
    truth = pd.read_csv(sample_data_dir / "truth" / f"{patient}.labels.csv")["population"].to_numpy().astype(str)
    before = np.asarray(record.populations).astype(str).copy()
    vertices, true_pop, shown = lasso_on_errors(record, truth)
    circle(at, patient, vertices)
    inside = inside_box(record, vertices, shown)
    at.multiselect(key="ag_from").set_value([shown])
    at.selectbox(key="ag_to").set_value(true_pop)
    return record, truth, before, true_pop, inside


def test_a_correction_with_refinement_moves_similar_cells_and_says_how_many(autogated, sample_data_dir):
    from gating_core.method.refinement import refine_gating

    at = autogated
    store = at.session_state["store"]
    record, truth, before, true_pop, inside = circle_errors(at, sample_data_dir)
    patient = record.name
    assert inside.sum() >= 15
    at.checkbox(key="ag_refine").check()
    at.run()
    assert at.button(key="ag_reassign").label == f"Reassign {int(inside.sum()):,} cells to {true_pop}"
    at.button(key="ag_reassign").click()
    at.run()
    assert not at.exception and not at.error
    after = np.asarray(store.patients[patient].populations).astype(str)
    assert (after[inside] == true_pop).all()
    further = int(((after != before) & ~inside).sum())
    assert further > 100  # one small box moved many cells outside it
    messages = " ".join(s.value for s in at.success)
    assert f"Reassigned {int(inside.sum()):,} circled cells to {true_pop}; the refinement moved {further:,} " \
           "further similar cells." in messages
    # exactly what the library gives for those circled cells, and better than relabeling them only
    model = store.models[store.current_model]
    expected = refine_gating(model, record.sample, np.flatnonzero(inside), [true_pop] * int(inside.sum()))
    np.testing.assert_array_equal(after, expected.populations.astype(str))
    relabel_only = before.copy()
    relabel_only[inside] = true_pop
    assert np.mean(after == truth) > np.mean(relabel_only == truth) + 0.01
    # the pending lasso is used up: no reassign button until a new one is drawn
    assert not [b for b in at.button if b.key == "ag_reassign"]


def test_without_the_option_only_the_circled_cells_change(autogated, sample_data_dir):
    at = autogated
    store = at.session_state["store"]
    record, _, before, true_pop, inside = circle_errors(at, sample_data_dir)
    patient = record.name
    at.run()
    assert not at.checkbox(key="ag_refine").value
    at.button(key="ag_reassign").click()
    at.run()
    assert not at.exception and not at.error
    after = np.asarray(store.patients[patient].populations).astype(str)
    np.testing.assert_array_equal(after != before, inside & (before != true_pop))
    assert f"Reassigned {int(inside.sum()):,} circled cells to {true_pop}." in " ".join(s.value for s in at.success)


def test_a_correction_at_a_populations_edge_leaves_the_rest_of_it_and_says_so(autogated):
    """A box over the Monocytes lowest in FSC-A, given to `other` with the refinement on: the
    other Monocytes, which the refinement would all have taken along, keep their population,
    and the page says how many and why."""
    at = autogated
    store = at.session_state["store"]
    patient = "new_patient_01"
    at.selectbox(key="ag_patient").set_value(patient)
    at.run()
    record = store.patients[patient]
    before = np.asarray(record.populations).astype(str).copy()
    fsc, ssc = (record.sample.events[:, record.sample.pnn.index(c)] for c in ("FSC-A", "SSC-A"))
    monocytes = before == "Monocytes"
    vertices = [(float(fsc.min()), float(ssc.min())), (float(np.quantile(fsc[monocytes], 0.1)), float(ssc.max()))]
    circle(at, patient, vertices)
    inside = inside_box(record, vertices, "Monocytes")
    assert inside.sum() > 100 and (monocytes & ~inside).sum() > 1000
    at.multiselect(key="ag_from").set_value(["Monocytes"])
    at.selectbox(key="ag_to").set_value("other")
    at.checkbox(key="ag_refine").check()
    at.run()
    at.button(key="ag_reassign").click()
    at.run()
    assert not at.exception and not at.error
    after = np.asarray(store.patients[patient].populations).astype(str)
    assert (after[inside] == "other").all() and (after[monocytes & ~inside] == "Monocytes").all()
    (warning,) = [w.value for w in at.warning if w.value.startswith("Not moved")]
    assert warning.startswith("Not moved: ") and " Monocytes that the refinement would have taken along" in warning
    # the reviewer, having looked, moves them too: the refinement in full, undoable
    from gating_core.method.refinement import refine_gating

    button = at.button(key="ag_release_held")
    assert button.label == f"Move the {int((monocytes & ~inside).sum()):,} held-back cells too"
    button.click()
    at.run()
    assert not at.exception and not at.error
    model = store.models[store.current_model]
    full = refine_gating(model, record.sample, np.flatnonzero(inside), ["other"] * int(inside.sum()),
                         max_moved_share=None)
    np.testing.assert_array_equal(np.asarray(store.patients[patient].populations).astype(str),
                                  full.populations.astype(str))
    assert any(s.value.startswith("Moved ") and "held-back cells, as the refinement would." in s.value
               for s in at.success)
    assert not [b for b in at.button if b.key == "ag_release_held"]
    at.button(key="ag_undo_last").click()
    at.run()
    np.testing.assert_array_equal(np.asarray(store.patients[patient].populations).astype(str)[monocytes & ~inside],
                                  "Monocytes")
    # held back again, the offer is back
    assert at.button(key="ag_release_held").label == button.label
