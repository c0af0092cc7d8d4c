"""GatingModel's parameters: keyword-only, every one declared with what it may hold, checked once
when the model is fitted, with a message naming the parameter, what it may be and what it got.
The research options are ResearchGatingModel's parameters alone, and its model files say so."""

from __future__ import annotations

import inspect
import json
import numbers

import numpy as np
import pytest

from sklearn.base import clone

from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.model.iw_model import load_any_model
from gating_core.model.research import (RESEARCH_OPTIONS, ResearchGatingModel, build_model, load_gating_model,
                                        model_class)
from gating_core.parameters import BOOLEAN, NONE, InstanceOf, Interval, Options, validate_parameters
from helpers import sample_cohort
from modelfile_helpers import rewrite_model_file

#: The research options' defaults, which every GatingModel file written while they were its
#: parameters stores: the options left out of the default, then the method's family.
RESEARCH_DEFAULTS = {"n_augment": 0, "augment_gain": 0.08, "augment_shift": 0.15, "bandwidth_x_hedge": None,
                     "self_training": False, "transfer_start": False, "adaptive_shapes": True,
                     "population_components": 3, "swollen_check": True, "trees_check": True,
                     "method": "marginal", "solver": "rff", "loss": "squared",
                     "patient_weighting": "uniform", "kernel_x": "gaussian", "select_embedding_bandwidth": False,
                     "selection_objective": "mean", "prior_shift": "none", "align": "none", "task_similarity": 0.5,
                     "dica": None, "dica_components": 20, "class_balance": 0.0}
#: What a lab sets: GatingModel's parameters.
PRODUCT_PARAMETERS = ["channels", "transform", "compensate", "select", "cells_per_patient", "embedding_cells",
                      "n_features", "n_embedding_features", "bandwidth_x", "bandwidth_p", "alpha", "pooled_weight",
                      "adaptive_weight", "unknown_margin", "cv_folds", "cv_repeats", "selection_cells_per_patient",
                      "random_state"]


@pytest.mark.parametrize("cls", [GatingModel, ResearchGatingModel])
def test_every_parameter_is_keyword_only_and_declared(cls):
    signature = inspect.signature(cls.__init__)
    params = [p for name, p in signature.parameters.items() if name != "self"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert list(cls._parameter_constraints) == [p.name for p in params]
    assert list(cls().get_params()) == sorted(p.name for p in params)
    with pytest.raises(TypeError):
        cls("marginal")


def test_the_research_options_are_research_gating_model_parameters_only():
    assert RESEARCH_OPTIONS == tuple(RESEARCH_DEFAULTS)
    assert list(inspect.signature(GatingModel).parameters) == PRODUCT_PARAMETERS  # 18, from 31
    gating = inspect.signature(GatingModel).parameters
    research = inspect.signature(ResearchGatingModel).parameters
    assert not set(RESEARCH_DEFAULTS) & set(gating)
    # GatingModel's parameters, then the research options, with the defaults GatingModel runs with.
    assert list(research) == list(gating) + list(RESEARCH_DEFAULTS)
    assert {name: research[name].default for name in RESEARCH_DEFAULTS} == RESEARCH_DEFAULTS
    assert {name: getattr(GatingModel(), name) for name in RESEARCH_DEFAULTS} == RESEARCH_DEFAULTS
    for name in RESEARCH_DEFAULTS:
        with pytest.raises(TypeError):
            GatingModel(**{name: RESEARCH_DEFAULTS[name]})
    with pytest.raises(TypeError):
        GatingModel(n_augment=4)
    validate_parameters(ResearchGatingModel())
    with pytest.raises(ValueError, match="^n_augment must be an integer >= 0, got -1$"):
        validate_parameters(ResearchGatingModel(n_augment=-1))


def test_clone_and_get_params_round_trip_both_classes():
    plain = GatingModel(alpha=1e-3, adaptive_weight=0.25)
    copy = clone(plain)
    assert type(copy) is GatingModel and copy.get_params() == plain.get_params()
    assert not set(RESEARCH_DEFAULTS) & set(plain.get_params())
    research = ResearchGatingModel(alpha=1e-3, n_augment=4, augment_gain="auto", bandwidth_x_hedge=0.5,
                                   self_training=True)
    copy = clone(research)
    assert type(copy) is ResearchGatingModel and copy.get_params() == research.get_params()
    assert copy.get_params()["alpha"] == 1e-3 and copy.get_params()["augment_shift"] == 0.15
    assert set(copy.get_params()) == set(plain.get_params()) | set(RESEARCH_DEFAULTS)
    copy.set_params(n_augment=2, select=False)
    assert (copy.n_augment, copy.select) == (2, False)
    # A fold of the model's own selection keeps its class and options.
    research.groups_inferred_, research.selection_ = False, {}  # what a fit sets before its folds
    fold = research._fold_copy(["a", "b"], ["p1", "p2"])
    assert type(fold) is ResearchGatingModel and fold.get_params() == research.get_params()


def test_the_class_follows_the_parameters():
    assert model_class({"alpha": 1e-3}) is GatingModel
    # An option at the value GatingModel runs with asks for nothing GatingModel does not do.
    assert model_class({"alpha": 1e-3, "self_training": False, "loss": "squared"}) is GatingModel
    assert type(build_model({"alpha": 1e-3, "loss": "squared"})) is GatingModel
    assert model_class({"alpha": 1e-3, "loss": "hinge"}) is ResearchGatingModel
    assert type(build_model({"n_augment": 4})) is ResearchGatingModel and build_model({}).n_augment == 0
    assert build_model({"method": "pooling"}).method == "pooling"
    from gating_core.evaluation import METHOD_SETTINGS

    for method in ("marginal-augment", "marginal-second-bandwidth", "marginal-self-training", "previous-default"):
        assert model_class(METHOD_SETTINGS[method]) is ResearchGatingModel
    assert model_class(METHOD_SETTINGS["marginal"]) is GatingModel


@pytest.fixture(scope="module")
def research_file(tmp_path_factory):
    samples, labels = sample_cohort([1, 2, 3])
    model = ResearchGatingModel(select=False, cells_per_patient=300, n_features=64, n_embedding_features=16,
                                embedding_cells=1000, n_augment=1, self_training=True).fit(samples, labels)
    path = tmp_path_factory.mktemp("research") / "research.npz"
    model.save(path)
    return model, path, samples


def test_a_research_model_file_loads_as_one_and_gates_alike(research_file):
    model, path, samples = research_file
    for loaded in (load_gating_model(path), load_any_model(path), ResearchGatingModel.load(path)):
        assert type(loaded) is ResearchGatingModel and loaded.get_params() == model.get_params()
        np.testing.assert_array_equal(loaded.predict_proba(samples[0]), model.predict_proba(samples[0]))
    # GatingModel.load cannot build it (it has no such parameters) and says what reads it.
    with pytest.raises(ModelFileError, match="n_augment=1, self_training=True.*load_gating_model"):
        GatingModel.load(path)


def test_an_older_file_with_the_options_at_their_defaults_loads_as_a_gating_model(tmp_path):
    samples, labels = sample_cohort([1, 2, 3])
    model = GatingModel(select=False, cells_per_patient=300, n_features=64, n_embedding_features=16,
                        embedding_cells=1000).fit(samples, labels)
    path = tmp_path / "now.npz"
    model.save(path)
    arrays = dict(np.load(path))
    meta = json.loads(str(arrays["meta"]))
    assert not set(RESEARCH_DEFAULTS) & set(meta["params"])  # a GatingModel's file stores none of them
    # Written before the options left GatingModel's parameters: all five stored, at their defaults.
    meta["params"].update(RESEARCH_DEFAULTS)
    old = rewrite_model_file(arrays, tmp_path / "old.npz", meta)
    expected = model.predict_proba(samples[0])
    for loaded in (GatingModel.load(old), load_gating_model(old), load_any_model(old)):
        assert type(loaded) is GatingModel and loaded.get_params() == model.get_params()
        np.testing.assert_array_equal(loaded.predict_proba(samples[0]), expected)
    # The subclass reads any GatingModel file, as itself.
    research = ResearchGatingModel.load(old)
    assert type(research) is ResearchGatingModel and research.n_augment == 0
    np.testing.assert_array_equal(research.predict_proba(samples[0]), expected)
    # One option away from its default: a ResearchGatingModel's file.
    meta["params"]["augment_gain"] = "auto"
    other = rewrite_model_file(arrays, tmp_path / "other.npz", meta)
    assert type(load_gating_model(other)) is ResearchGatingModel and load_gating_model(other).augment_gain == "auto"
    with pytest.raises(ModelFileError, match="augment_gain='auto'"):
        GatingModel.load(other)


@pytest.mark.parametrize("name, value, message", [
    ("method", "pool", "method must be one of ('marginal', 'pooling', 'multitask'), got 'pool'"),
    ("adaptive_weight", 1.5, "adaptive_weight must be 'auto' or a number within [0, 1], got 1.5"),
    ("adaptive_weight", "Auto", "adaptive_weight must be 'auto' or a number within [0, 1], got 'Auto'"),
    ("pooled_weight", -0.1, "pooled_weight must be 'auto' or a number within [0, 1], got -0.1"),
    ("n_features", True, "n_features must be an integer >= 1, got True"),
    ("n_features", 64.0, "n_features must be an integer >= 1, got 64.0"),
    ("cv_folds", 1, "cv_folds must be an integer >= 2, got 1"),
    ("alpha", 0.0, "alpha must be None or a number > 0, got 0.0"),
    ("bandwidth_x", float("nan"), "bandwidth_x must be None or a number > 0, got nan"),
    ("compensate", "yes", "compensate must be True or False, got 'yes'"),
    ("transform", "logicle",
     "transform must be 'auto', a dict of channel -> transform or a ChannelTransform, got 'logicle'"),
    ("dica_components", 601, "dica_components must be an integer within [1, 600], got 601"),
    ("prior_shift", "EM", "prior_shift must be one of ('none', 'em'), got 'EM'"),
])
def test_a_bad_value_is_refused_naming_the_parameter_before_any_work(name, value, message):
    model = (GatingModel if name in PRODUCT_PARAMETERS else ResearchGatingModel)(**{name: value})
    with pytest.raises(ValueError) as caught:
        validate_parameters(model)
    assert str(caught.value) == message
    # fit checks first: nothing is read or digested (a list that is not samples would fail later)
    with pytest.raises(ValueError, match="^" + name + " must be"):
        model.fit([object(), object()], [np.zeros(1), np.zeros(1)])


def test_a_bad_research_option_is_refused_naming_it_before_any_work():
    model = ResearchGatingModel(bandwidth_x_hedge=1.0)
    with pytest.raises(ValueError, match=r"^bandwidth_x_hedge must be None or a number within \(0, 1\), got 1.0$"):
        model.fit([object(), object()], [np.zeros(1), np.zeros(1)])


def test_numpy_numbers_are_numbers():
    validate_parameters(GatingModel(n_features=np.int64(64), adaptive_weight=np.float32(0.25),
                                    compensate=np.bool_(True)))


def test_a_valid_model_still_fits_and_set_params_is_checked_at_the_next_fit():
    samples, labels = sample_cohort([1, 2])
    model = GatingModel(select=False, cells_per_patient=300, adaptive_weight=0.0).fit(samples, labels)
    assert model.populations_
    model.set_params(pooled_weight=2.0)
    with pytest.raises(ValueError, match="^pooled_weight must be"):
        model.fit(samples, labels)
    with pytest.raises(ValueError, match="Invalid parameter 'loss'"):
        model.set_params(loss="hinge")  # a ResearchGatingModel's parameter


def test_constraints_describe_themselves():
    assert Interval(numbers.Real, 0, 1, "right").describe() == "a number within (0, 1]"
    assert Interval(numbers.Integral, None, 10, "left").describe() == "an integer < 10"
    assert Interval(numbers.Real).describe() == "a number"
    assert Options("a").describe() == "'a'"
    assert not Options(1).accepts(True) and not Options(True).accepts(1)
    assert NONE.accepts(None) and not NONE.accepts(0)
    assert BOOLEAN.accepts(False) and not BOOLEAN.accepts(0)
    assert InstanceOf(dict, "a dict").accepts({}) and not InstanceOf(dict, "a dict").accepts([])
    with pytest.raises(ValueError, match="closed must be"):
        Interval(numbers.Real, 0, 1, "open")
