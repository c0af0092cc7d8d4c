"""The Train page's method and loss choices (issue 10): hinge loss and the multitask baseline
reach the model a user trains in the app, its library copy and its summary."""

from __future__ import annotations

import numpy as np
import pytest

from apptest_helpers import finish_jobs, goto, start, store_of
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
    at.button[0].click()  # the Data page's sample-data button
    at.run()
    at = goto(at, "pages/4_train.py")
    at.multiselect(key="train_patients").set_value(["patient_01", "patient_02", "patient_03"])
    at.run()
    if method:
        at.radio(key="train_method").set_value(method)
        at.run()
    if loss:
        at.radio(key="train_loss").set_value(loss)
    if tau is not None:
        at.number_input(key="train_tau").set_value(tau)
    at.checkbox(key="train_hand").check()
    at.run()
    at.checkbox(key="hp_select").uncheck()
    at.number_input(key="hp_cells_per_patient").set_value(500)
    at.number_input(key="hp_n_features").set_value(64)
    at.run()
    at.button(key="train_button").click()
    at.run()
    at = finish_jobs(at)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success and at.success[0].value.startswith("Trained")
    return at


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
    from gating_core.model import GatingModel

    model_id = store.model_ids[store.current_model]
    stored = GatingModel.load(PatientLibrary(library, create=False).model_path(model_id))
    assert stored.loss == "hinge"
    sample = store.patients["new_patient_01"].sample
    np.testing.assert_array_equal(stored.predict(sample), model.predict(sample))


def test_multitask_with_its_tau_on_the_train_page(library):
    at = _train_on_the_page(start(), method="multitask", tau=0.01)
    model = store_of(at).model()
    assert (model.method, model.loss, model.task_similarity) == ("multitask", "squared", 0.01)
    assert model.classifier_.task_similarity == 0.01 and not model.classifier_.use_embedding
    assert any("Method: multitask tau=0.01" in m.value for m in at.markdown)
