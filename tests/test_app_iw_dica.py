"""The Train page reaches DICA and the importance-weighted Nystroem model: each is
chosen on the page, trained as a background job, stored in the library, named in the model
summary, and gates on the Auto-gate page; an IW model file written elsewhere can be uploaded."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from apptest_helpers import finish_jobs, goto, start, store_of, train_on_the_page
from helpers import sample_cohort
from ui.training import (IW_DEFAULTS, is_transductive, method_label, method_params, model_kind, refit_caption)


def truth_of(sample_data_dir, patient):
    return pd.read_csv(sample_data_dir / "truth" / f"{patient}.labels.csv")["population"].to_numpy().astype(str)


def test_dica_and_iw_choices_become_model_parameters():
    assert method_params("marginal", "squared", 0.5, "supervised", 10) == {
        "loss": "squared", "dica": "supervised", "dica_components": 10}
    assert method_params("pooling", "hinge", 0.5, "unsupervised", 3) == {
        "loss": "hinge", "dica": "unsupervised", "dica_components": 3}
    assert method_params("marginal", "squared", 0.5, "none", 10) == {"loss": "squared"}
    assert method_params("iw-nystroem", "squared", 0.5) == {"cells_per_patient": 2000, "n_landmarks": 300}
    with pytest.raises(ValueError, match="dica_components must be an integer within"):
        method_params("marginal", "squared", 0.5, "supervised", 0)
    with pytest.raises(ValueError, match="DICA must be one of"):
        method_params("marginal", "squared", 0.5, "kpca", 10)
    with pytest.raises(ValueError, match="no other loss, no DICA"):
        method_params("iw-nystroem", "hinge", 0.5)
    with pytest.raises(ValueError, match="no other loss, no DICA"):
        method_params("iw-nystroem", "squared", 0.5, "supervised", 10)
    assert method_label("marginal", "squared", None, "supervised", 10) == "marginal, DICA (10)"
    assert method_label("pooling", "hinge", None, "unsupervised", 3) == "pooling, hinge loss, UDICA (3)"
    assert method_label("iw-nystroem") == "iw-nystroem (refitted per patient)"
    assert refit_caption({"a": 2.345, "b": 0.61}).endswith("Refit per patient: a 2.3 s, b 0.6 s.")
    assert "once patients are gated" in refit_caption({})


def test_the_app_trains_iw_models_with_the_command_lines_defaults():
    from gating_core.commands.model_options import IW_CELLS_PER_PATIENT
    from gating_core.model.iw_model import IW_METHOD, IWNystroemGatingModel

    assert IW_DEFAULTS == {"cells_per_patient": IW_CELLS_PER_PATIENT,
                           "n_landmarks": IWNystroemGatingModel().n_landmarks}
    assert is_transductive(IWNystroemGatingModel()) and IWNystroemGatingModel.method == IW_METHOD


def _train_on_the_page(at, method=None, dica=None, dica_components=None, hand=None):
    """Sample data loaded, patients 01-03 chosen, the choices made, hyperparameters by hand
    (``hand``: widget key -> value), trained; the page after the job."""
    choices = [("train_method", method)] if method else []
    if dica:
        choices += [("train_dica", dica), ("train_dica_components", dica_components)]
    return train_on_the_page(at, choices, hand)


def test_supervised_dica_picked_on_the_train_page(library, sample_data_dir):
    from gating_core.library import PatientLibrary
    from gating_core.method.dica import DICA
    from gating_core.model.research import load_gating_model

    at = _train_on_the_page(start(), dica="supervised", dica_components=10,
                            hand={"hp_select": False, "hp_cells_per_patient": 500, "hp_n_features": 64})
    store = store_of(at)
    model = store.model()
    assert (model.method, model.dica, model.dica_components) == ("marginal", "supervised", 10)
    assert isinstance(model.dica_, DICA) and model.dica_.n_components == 10
    assert any("Method: marginal, DICA (10)" in m.value for m in at.markdown)
    assert store.current_model.startswith("marginal, DICA (10), 3 patients")
    # the library's copy is the same DICA model, and it gates: new_patient_01 measured at 0.9986
    # agreement with the truth (three patients, 500 cells each, 64 features, no selection)
    stored = load_gating_model(PatientLibrary(library, create=False).model_path(store.model_ids[store.current_model]))
    assert stored.dica == "supervised" and stored.dica_.n_components == 10
    sample = store.patients["new_patient_01"].sample
    predicted = stored.predict(sample)
    np.testing.assert_array_equal(predicted, model.predict(sample))
    assert np.mean(predicted.astype(str) == truth_of(sample_data_dir, "new_patient_01")) > 0.995


IW_HAND = {"hp_iw_cells_per_patient": 500, "hp_iw_n_landmarks": 100}


@pytest.fixture
def iw_trained(library):
    return _train_on_the_page(start(), method="iw-nystroem", hand=IW_HAND)


def test_iw_model_trained_on_the_page_is_stored_checked_and_gates(iw_trained, library, sample_data_dir):
    from gating_core.library import PatientLibrary
    from gating_core.model.iw_model import IWNystroemGatingModel, load_any_model

    at = iw_trained
    store = store_of(at)
    model = store.model()
    assert isinstance(model, IWNystroemGatingModel)
    assert (model.cells_per_patient, model.n_landmarks) == (500, 100) and model.cells_.shape == (1500, 9)
    assert store.current_model.startswith("iw-nystroem (refitted per patient), 3 patients")
    assert any("Method: importance-weighted Nystroem KRR, refitted for each patient it gates (100 landmarks, "
               "1,500 training cells kept)" in m.value for m in at.markdown)
    # the check does not offer it, and says so
    assert at.button(key="lopo_button").disabled
    assert any("does not offer the importance-weighted Nystroem model" in c.value for c in at.caption)
    # the library keeps its own file format, and a new session loads it back as what it is
    stored = load_any_model(PatientLibrary(library, create=False).model_path(store.model_ids[store.current_model]))
    assert isinstance(stored, IWNystroemGatingModel)
    np.testing.assert_array_equal(stored.cells_, model.cells_)
    again = start()
    assert isinstance(store_of(again).model(), IWNystroemGatingModel)
    assert not [w for w in store_of(again).warnings if "could not be loaded" in w]

    # Auto-gate: the patient is refitted for and gated; the refit's cost is shown. Agreement with
    # the truth measured at 0.9998 (new_patient_01; the same settings in a script).
    at = goto(at, "pages/5_autogate.py")
    assert any("refits for each patient it gates" in c.value and "once patients are gated" in c.value
               for c in at.caption)
    at.multiselect(key=f"ag_targets_{store.current_model}").set_value(["new_patient_01"])
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    record = store.patients["new_patient_01"]
    assert np.mean(np.asarray(record.populations).astype(str) == truth_of(sample_data_dir, "new_patient_01")) > 0.995
    seconds = at.session_state["ag_refit_seconds"][store.current_model]["new_patient_01"]
    assert seconds == model.last_fit_seconds_ and seconds > 0
    assert any(f"Refit per patient: new_patient_01 {seconds:.1f} s." in c.value for c in at.caption)
    # novelty is the IW model's own (it has one), and refinement is not offered
    assert any("resembles the training patients" in s.value for s in at.success)
    assert at.checkbox(key="ag_refine").disabled
    assert any("does not offer refinement from corrections" in c.value for c in at.caption)


def test_an_iw_model_file_uploads_and_a_corrupt_one_is_refused(library, tmp_path):
    from gating_core.model.iw_model import IWNystroemGatingModel

    model = IWNystroemGatingModel(cells_per_patient=300, n_landmarks=50).fit(*sample_cohort([1, 2, 4]))
    path = tmp_path / "iw.npz"
    model.save(path)
    data = path.read_bytes()

    at = start()
    at.button[0].click()
    at.run()
    at = goto(at, "pages/4_train.py")
    at.file_uploader(key="model_upload").set_value(("cli_iw_model.npz", data, "application/octet-stream"))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(s.value.startswith("Loaded a model (importance-weighted Nystroem KRR") for s in at.success)
    store = store_of(at)
    loaded = store.model()
    assert isinstance(loaded, IWNystroemGatingModel) and store.current_model.startswith("loaded: cli_iw_model.npz")
    np.testing.assert_array_equal(loaded.cells_, model.cells_)
    assert loaded.training_patients_ == ["patient_01", "patient_02", "patient_04"]

    # a truncated copy of the same file: a clear error naming the uploaded file, the session intact
    models_before, current_before = dict(store.models), store.current_model
    at.file_uploader(key="model_upload").set_value(("broken.npz", data[: len(data) // 2], "application/octet-stream"))
    at.run()
    assert not at.exception
    [error] = at.error
    assert error.value.startswith("broken.npz: ") and "upload-" not in error.value
    assert store.models == models_before and store.current_model == current_before
    assert len(store.library.models()) == 1


def test_model_kind_of_a_dica_model_without_fitting():
    from gating_core.model.research import ResearchGatingModel

    model = ResearchGatingModel(method="pooling", dica="unsupervised", dica_components=7)
    assert model_kind(model) == "pooling, UDICA (7)"


def test_the_check_runs_with_the_dica_chosen_and_belongs_to_the_dica_model(library):
    at = _train_on_the_page(start(), method="pooling", dica="unsupervised", dica_components=5,
                            hand={"hp_select": False, "hp_cells_per_patient": 300, "hp_n_features": 32})
    assert any("each fold is a full training" in c.value for c in at.caption)
    at.button(key="lopo_button").click()
    at.run()
    at = finish_jobs(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    store = store_of(at)
    table = store.evaluation
    assert sorted(set(table["method"])) == ["lda", "marginal", "pooling"]
    assert sorted(set(table["patient"])) == ["patient_01", "patient_02", "patient_03"]
    setup = store.check_record["setup"]["params"]
    assert (setup["dica"], setup["dica_components"]) == ("unsupervised", 5)
    assert any("run on the current model's patients" in c.value for c in at.caption)
