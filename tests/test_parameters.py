"""GatingModel's parameters: keyword-only, every one declared with what it may hold, checked once
when the model is fitted, with a message naming the parameter, what it may be and what it got."""

from __future__ import annotations

import inspect
import numbers

import numpy as np
import pytest

from gating_core.model import GatingModel
from gating_core.parameters import BOOLEAN, NONE, InstanceOf, Interval, Options, validate_parameters
from helpers import sample_cohort


def test_every_parameter_is_keyword_only_and_declared():
    signature = inspect.signature(GatingModel.__init__)
    params = [p for name, p in signature.parameters.items() if name != "self"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert list(GatingModel._parameter_constraints) == [p.name for p in params]
    with pytest.raises(TypeError):
        GatingModel("marginal")


def test_the_defaults_are_valid():
    validate_parameters(GatingModel())


@pytest.mark.parametrize("name, value, message", [
    ("method", "pool", "method must be one of ('marginal', 'pooling', 'multitask'), got 'pool'"),
    ("adaptive_weight", 1.5, "adaptive_weight must be 'auto' or a number within [0, 1], got 1.5"),
    ("adaptive_weight", "Auto", "adaptive_weight must be 'auto' or a number within [0, 1], got 'Auto'"),
    ("pooled_weight", -0.1, "pooled_weight must be 'auto' or a number within [0, 1], got -0.1"),
    ("bandwidth_x_hedge", 1.0, "bandwidth_x_hedge must be None or a number within (0, 1), got 1.0"),
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
    model = GatingModel(**{name: value})
    with pytest.raises(ValueError) as caught:
        validate_parameters(model)
    assert str(caught.value) == message
    # fit checks first: nothing is read or digested (a list that is not samples would fail later)
    with pytest.raises(ValueError, match="^" + name + " must be"):
        model.fit([object(), object()], [np.zeros(1), np.zeros(1)])


def test_numpy_numbers_are_numbers():
    validate_parameters(GatingModel(n_features=np.int64(64), adaptive_weight=np.float32(0.25),
                                    compensate=np.bool_(True)))


def test_a_valid_model_still_fits_and_set_params_is_checked_at_the_next_fit():
    samples, labels = sample_cohort([1, 2])
    model = GatingModel(select=False, cells_per_patient=300, adaptive_weight=0.0).fit(samples, labels)
    assert model.populations_
    model.set_params(loss="cross-entropy")
    with pytest.raises(ValueError, match="^loss must be one of"):
        model.fit(samples, labels)


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
