"""What a fitted model does to a new patient beyond its transfer model, as the training summary
of `train` and the app's list of models say it."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.io.inputs import load_labeled_input
from gating_core.model import GatingModel
from gating_core.model.summary import adapted_populations_text, unknown_cells_text


@pytest.fixture(scope="module")
def patients(sample_data_dir):
    data = [load_labeled_input(p) for p in sorted(sample_data_dir.glob("patient_0[1-3].fcs"))]
    return [s for s, _ in data], [y for _, y in data]


def _fitted(patients, **params):
    samples, labels = patients
    return GatingModel(select=False, n_features=64, cells_per_patient=300, **params).fit(samples, labels)


def test_a_weight_set_by_hand_and_the_unknown_call(patients):
    model = _fitted(patients, adaptive_weight=0.5, unknown_margin=2.5)
    assert adapted_populations_text(model) == (
        "weight 0.5 (as set); each patient's populations are refitted to its own cells by EM, EM started from "
        "the training populations; one covariance shared by all populations, and each population's own shape")
    assert unknown_cells_text(model) == "a gated cell beyond every population (2.5 x its reach) is called 'unknown'"


def test_the_weight_chosen_by_the_held_out_patients(patients, tmp_path):
    model = _fitted(patients)  # adaptive_weight="auto": the check over held-out patients
    table = model.selection_["adaptive_weight"]
    reason = ("a third each for the transfer model and the two fits; not every fold of held-out groups found that "
              "clearly worse" if table["chosen"] == 2 / 3 else
              "every fold of held-out groups found the even thirds clearly worse")
    assert table["folds"] >= 2
    assert adapted_populations_text(model).startswith(f"weight {model.adaptive_weight_:.3g} ({reason}); ")
    model.save(tmp_path / "model.npz")
    assert adapted_populations_text(GatingModel.load(tmp_path / "model.npz")) == adapted_populations_text(model)


def test_nothing_to_say_when_neither_is_used(patients):
    model = _fitted(patients, adaptive_weight=0.0, unknown_margin=None)
    assert adapted_populations_text(model) is None and unknown_cells_text(model) is None
    assert adapted_populations_text(object()) is None and unknown_cells_text(object()) is None  # not a model



def test_a_weight_the_held_out_groups_turned_off_is_said(patients):
    model = _fitted(patients, adaptive_weight=0.0)
    # as the check records a weight it chose (its table), not one set by hand
    model.selection_["adaptive_weight"] = {"chosen": 0.0, "folds": 3}
    assert adapted_populations_text(model).startswith("off: every fold of held-out groups gated better with the "
                                                      "transfer model alone")


def test_a_model_of_few_patients_says_so(patients):
    from gating_core.model.summary import FEW_TRAINING_PATIENTS, few_patients_note

    model = _fitted(patients, adaptive_weight=0.0)
    assert len(model.training_patients_) == 3 <= FEW_TRAINING_PATIENTS
    assert few_patients_note(model).startswith("3 training patients: the model has seen little of how patients differ")
    model.training_patients_ = [f"p{i}" for i in range(FEW_TRAINING_PATIENTS + 1)]
    assert few_patients_note(model) is None and few_patients_note(object()) is None


def test_a_population_named_unknown_in_training_is_said_to_share_the_unknown_call(patients):
    from gating_core.model.summary import unknown_name_note

    model = _fitted(patients, adaptive_weight=0.0)
    assert unknown_name_note(model) is None  # no population named so
    model.populations_ = [*model.populations_[:-1], "unknown"]
    assert unknown_name_note(model).startswith("a training population is named 'unknown', the name gating gives")
    model.unknown_margin = None  # a model that calls no cell unknown: the name is the population's alone
    assert unknown_name_note(model) is None and unknown_name_note(object()) is None


def test_populations_differing_only_in_case_or_spaces_are_pointed_out():
    from types import SimpleNamespace

    from gating_core.model.summary import similar_names_note

    assert similar_names_note(SimpleNamespace(populations_=["B cells", "T cells", "ungated"])) is None
    note = similar_names_note(SimpleNamespace(populations_=["B  cells", "B cells", "T cells", "Ungated", "ungated"]))
    assert note == ("training populations that differ only in letter case or spaces are learned apart ('B  cells' "
                    "and 'B cells'; 'Ungated' and 'ungated'): if each pair is one population, give it one name in "
                    "every patient's labels")
    assert similar_names_note(object()) is None


def test_labels_that_do_not_match_across_patients_are_pointed_out():
    from gating_core.model.summary import mismatched_labels_notes

    same = [np.array(["T", "B", "T"]), np.array(["B", "T"]), np.array(["T", "B", "B"])]
    assert mismatched_labels_notes(["p1", "p2", "p3"], same) == []
    numbered = [np.array(["T", "B"]), np.array(["B", "T", "T"]), np.array(["0", "1", "2", "1"])]
    assert mismatched_labels_notes(["p1", "p2", "p3"], numbered) == [
        "p3's training cells share no population with the other patients' (its own: 0, 1, 2): if its labels "
        "name the same populations otherwise, give each population one name in every patient's labels"]
    typo = [np.array(["T", "B"]), np.array(["B", "T"]), np.array(["T", "B", "Martians", "Martians"])]
    assert mismatched_labels_notes(["p1", "p2", "p3"], typo) == [
        "training cells of one patient only: 'Martians' (p3, 2 cells); a misspelt name is learned "
        "as a population of its own"]
    # Two patients: a population of one of them is no sign of a typo; sharing nothing still is.
    assert mismatched_labels_notes(["p1", "p2"], typo[1:]) == []
    assert len(mismatched_labels_notes(["p1", "p2"], [np.array(["a"]), np.array(["b"])])) == 2
    assert mismatched_labels_notes(["p1"], [np.array(["a"])]) == []


def test_training_patients_of_few_events_are_pointed_out():
    from gating_core.model.summary import FEW_TRAINING_EVENTS, few_events_note

    assert few_events_note(["p1", "p2"], [12_000, FEW_TRAINING_EVENTS]) is None
    assert few_events_note(["p1", "p2", "p3"], [12_000, 1, 2]) == (
        "training patients of few events: p2 (1), p3 (2); every training patient weighs the same, so their few "
        "cells count as much as another patient's thousands")
