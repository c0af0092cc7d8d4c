"""The Train page's method and loss choices: hinge loss and the multitask baseline
reach the model a user trains in the app, its library copy and its summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from apptest_helpers import finish_jobs, goto, start, store_of, train_on_the_page
from ui.training import method_label, method_params


def test_method_params_pass_tau_only_to_multitask():
    assert method_params("marginal", "hinge", 0.01) == {"loss": "hinge"}
    assert method_params("multitask", "squared", 0.01) == {"loss": "squared", "task_similarity": 0.01}
    assert method_label("marginal", "hinge") == "marginal, hinge loss"
    assert method_label("multitask", "squared", 0.01) == "multitask tau=0.01"
    assert method_label("pooling") == "pooling"
    with pytest.raises(ValueError, match="loss must be one of"):
        method_params("marginal", "absolute", 0.5)
    with pytest.raises(ValueError, match="within"):
        method_params("multitask", "squared", 0.0)


def _train_on_the_page(at, method=None, loss=None, tau=None):
    choices = [(key, value) for key, value in (("train_method", method), ("train_loss", loss), ("train_tau", tau))
               if value is not None]
    return train_on_the_page(at, choices, {"hp_select": False, "hp_cells_per_patient": 500, "hp_n_features": 64})


def test_hinge_loss_picked_on_the_train_page_trains_a_hinge_model(library):
    at = _train_on_the_page(start(), loss="hinge")
    store = store_of(at)
    model = store.model()
    assert (model.method, model.loss) == ("marginal", "hinge")
    assert model.classifier_.loss == "hinge" and model.n_features == 64
    assert any("Method: marginal, hinge loss" in m.value for m in at.markdown)
    assert store.current_model.startswith("marginal, hinge loss, 3 patients")
    # the library's copy (the model file) is the same hinge model
    from gating_core.library import PatientLibrary
    from gating_core.model.research import load_gating_model

    model_id = store.model_ids[store.current_model]
    stored = load_gating_model(PatientLibrary(library, create=False).model_path(model_id))
    assert stored.loss == "hinge"
    sample = store.patients["new_patient_01"].sample
    np.testing.assert_array_equal(stored.predict(sample), model.predict(sample))


def test_multitask_with_its_tau_on_the_train_page(library):
    at = _train_on_the_page(start(), method="multitask", tau=0.01)
    model = store_of(at).model()
    assert (model.method, model.loss, model.task_similarity) == ("multitask", "squared", 0.01)
    assert model.classifier_.task_similarity == 0.01 and not model.classifier_.use_embedding
    assert any("Method: multitask tau=0.01" in m.value for m in at.markdown)


def test_the_linear_cell_kernel_picked_on_the_train_page(library, sample_data_dir):
    assert method_params("marginal", "squared", 0.5, kernel_x="linear") == {"loss": "squared", "kernel_x": "linear"}
    assert method_params("marginal", "squared", 0.5) == {"loss": "squared"}
    assert method_label("marginal", kernel_x="linear") == "marginal, linear kernel"
    with pytest.raises(ValueError, match="cell kernel"):
        method_params("marginal", "squared", 0.5, kernel_x="cubic")
    with pytest.raises(ValueError, match="its own kernel"):
        method_params("iw-nystroem", "squared", 0.5, kernel_x="linear")
    at = train_on_the_page(start(), [("train_kernel", "linear")],
                           {"hp_select": False, "hp_cells_per_patient": 500, "hp_n_features": 128})
    store = store_of(at)
    model = store.model()
    assert model.kernel_x == "linear" and model.classifier_.kernel_x == "linear"
    assert any("Method: marginal, linear kernel" in m.value for m in at.markdown)
    truth = pd.read_csv(sample_data_dir / "truth" / "new_patient_01.labels.csv")["population"].to_numpy().astype(str)
    accuracy = np.mean(model.predict(store.patients["new_patient_01"].sample) == truth)
    assert accuracy > 0.99  # 1.0 measured


def test_a_channel_transform_set_on_the_train_page_reaches_the_model_and_its_file(library):
    from gating_core.library import PatientLibrary
    from gating_core.model.research import load_gating_model
    from ui.training import check_differences, check_matches_model, check_setup

    at = start()
    at.button[0].click()  # the Data page's sample-data button
    at.run()
    at = goto(at, "pages/4_train.py")
    at.multiselect(key="train_patients").set_value(["patient_01", "patient_02", "patient_03"])
    at.run()
    table = next(d.value for d in at.dataframe if "found" in d.value.columns)
    found = dict(zip(table["channel"], table["found"]))
    assert found["FSC-A"].startswith("linear:") and found["FL1-A"] == "arcsinh:150"
    at.selectbox(key="train_transform_channel").set_value("FL1-A")
    at.text_input(key="train_transform_text").set_value("square")
    at.button(key="train_transform_set").click()
    at.run()
    assert any("FL1-A" in e.value and "expected arcsinh" in e.value for e in at.error)
    at.text_input(key="train_transform_text").set_value(" ArcSinh:40 ")
    at.button(key="train_transform_set").click()
    at.run()
    table = next(d.value for d in at.dataframe if "found" in d.value.columns).set_index("channel")
    assert tuple(table.loc["FL1-A", ["found", "used", "why"]]) == ("arcsinh:150", "arcsinh:40", "set by you")
    assert table.loc["FL2-A", "used"] == "arcsinh:150"
    # By default the panel's views (Explore, Gate) are what the model learns on; one changed there
    # is offered, and taken on a click.
    assert not any(b.key == "train_transform_panel" for b in at.button)
    from gating_core.gates import AxisScale

    store_of(at).set_panel_transform("FL2-A", AxisScale("arcsinh", cofactor=400.0))
    store_of(at).set_panel_transform("FSC-A", AxisScale("linear"))  # linear: the same to the model
    at.run()
    assert at.button(key="train_transform_panel").label == "Use the panel's views (FL2-A)"
    at.button(key="train_transform_panel").click()
    at.run()
    table = next(d.value for d in at.dataframe if "found" in d.value.columns).set_index("channel")
    assert tuple(table.loc["FL2-A", ["used", "panel view", "why"]]) == ("arcsinh:400", "arcsinh:400", "set by you")
    at.checkbox(key="train_hand").check()
    at.run()
    at.checkbox(key="hp_select").uncheck()
    at.number_input(key="hp_cells_per_patient").set_value(500)
    at.number_input(key="hp_n_features").set_value(64)
    at.run()
    at.button(key="train_button").click()
    at.run()
    at = finish_jobs(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    store = store_of(at)
    model = store.model()
    by_channel = dict(zip(model.channels_, zip(model.transform_.kinds, model.transform_.params)))
    assert by_channel["FL1-A"] == ("arcsinh", {"cofactor": 40.0})
    assert by_channel["FL2-A"] == ("arcsinh", {"cofactor": 400.0})
    assert by_channel["FL3-A"] == ("arcsinh", {"cofactor": 150.0})
    assert any("FL1-A: arcsinh(x / 40)" in m.value and "Channel transforms:" in m.value for m in at.markdown)
    from gating_core.model.summary import adapted_populations_text, unknown_cells_text

    (shown,) = [m.value for m in at.markdown if "Channel transforms:" in m.value]
    assert f"Each patient's own populations: {adapted_populations_text(model)}" in shown
    assert shown.endswith("Unknown cells: a gated cell beyond every population (3 x its reach) is called 'unknown'")
    assert unknown_cells_text(model) in shown
    stored = load_gating_model(PatientLibrary(library, create=False).model_path(store.model_ids[store.current_model]))
    assert stored.transform == {"FL1-A": "arcsinh:40", "FL2-A": "arcsinh:400"}
    # A check run with these settings is the stored model's check; one without them is not.
    records = [store.patients[n] for n in ("patient_01", "patient_02", "patient_03")]
    samples = [r.sample for r in records]
    labels = [np.where(np.isin(np.asarray(r.labels).astype(str), stored.populations_), np.asarray(r.labels).astype(str),
                       "other") for r in records]
    params = {k: v for k, v in stored.get_params().items() if k != "method"}
    assert check_matches_model({"setup": check_setup(samples, labels, params)}, stored) is True
    assert check_differences({"setup": check_setup(samples, labels, params)}, stored) == []
    assert check_differences({"setup": check_setup(samples[:2], labels[:2], params)}, stored) == [
        "the check held 2 patients, the model learned from 3 (the model also learned from patient_03)"]
    params["transform"] = "auto"
    assert check_matches_model({"setup": check_setup(samples, labels, params)}, stored) is False
    assert check_differences({"setup": check_setup(samples, labels, params)}, stored) == ["other settings"]
    # "As found" puts every channel back.
    at = goto(at, "pages/4_train.py")
    at.button(key="train_transform_reset").click()
    at.run()
    table = next(d.value for d in at.dataframe if "found" in d.value.columns)
    assert (table["used"] == table["found"]).all()


def test_a_labeled_twin_is_not_chosen_for_training_and_its_labels_are_compared(library, sample_data_dir):
    """The same FCS file loaded again under other names, once with its own labels and once with
    100 of them changed: neither copy is chosen by default, each says why, and choosing one back
    is warned about."""
    at = start()
    at.button(key="load_sample_data").click()
    at.run()
    data = (sample_data_dir / "patient_02.fcs").read_bytes()
    labels = pd.read_csv(sample_data_dir / "patient_02.labels.csv")
    changed = labels.copy()
    populations = changed["population"].to_numpy().astype(object)
    first = populations[0]
    moved = np.flatnonzero(populations != first)[:100]
    populations[moved] = first
    changed["population"] = populations
    at.file_uploader(key="uploads").set_value([
        ("copy.fcs", data, "application/octet-stream"),
        ("copy.labels.csv", labels.to_csv(index=False).encode(), "text/csv"),
        ("mixed.fcs", data, "application/octet-stream"),
        ("mixed.labels.csv", changed.to_csv(index=False).encode(), "text/csv")])
    at.run()
    store = store_of(at)
    assert store.patients["copy"].is_labeled and store.patients["mixed"].is_labeled
    at = goto(at, "pages/4_train.py")
    chosen = at.multiselect(key="train_patients").value
    assert "patient_02" in chosen and "copy" not in chosen and "mixed" not in chosen
    captions = [c.value for c in at.caption]
    n = len(labels)
    assert ("copy holds exactly the events of patient_02, with the same labels (the same file loaded twice?). "
            "It is not chosen.") in captions
    assert (f"mixed holds exactly the events of patient_02, with other labels on 100 of its {n:,} cells: one of "
            "the two label files may belong to another patient. It is not chosen.") in captions
    at.multiselect(key="train_patients").set_value([*chosen, "mixed"])
    at.run()
    assert [w.value for w in at.warning if w.value.startswith("mixed")] == [
        f"mixed holds exactly the events of patient_02, with other labels on 100 of its {n:,} cells: one of the "
        "two label files may belong to another patient: learned from both, the model is taught two labelings of "
        "the same cells."]
