"""``ResearchGatingModel``: the product's model with the options its default leaves out.

:class:`~gating_core.model.estimator.GatingModel` is the product's estimator; three options measured
against it and not in its default (docs/unseen_data.md, docs/method.md "Options") are kept here,
in one place, as the five parameters of a subclass: shift augmentation (``n_augment``,
``augment_gain``, ``augment_shift``), a second fit at a narrower cell bandwidth
(``bandwidth_x_hedge``) and self-training at gating time (``self_training``). The command line's
``train --augment N / --second-bandwidth / --self-training`` and ``evaluate``'s
``marginal-augment``, ``marginal-second-bandwidth``, ``marginal-self-training`` and
``previous-default`` build their models with it (:func:`model_class` chooses the class from
the parameters); :func:`load_gating_model` reads a model file into whichever of the two it holds.
"""

from __future__ import annotations

import inspect
import numbers

from gating_core.model.estimator import GatingModel
from gating_core.model.file import load_model
from gating_core.parameters import BOOLEAN, NONE, Interval, Options

#: ResearchGatingModel's own parameters (GatingModel's class attributes of the same names hold
#: the values GatingModel runs with, which are these parameters' defaults).
RESEARCH_OPTIONS = GatingModel.RESEARCH_OPTIONS


class ResearchGatingModel(GatingModel):
    """:class:`~gating_core.model.estimator.GatingModel` with the research options as parameters.

    Every parameter of GatingModel (keyword-only, as there), and:

    Parameters
    ----------
    n_augment : int, default=0
        Copies of every training patient with a simulated instrument shift (a random gain and
        offset per channel, in standardised units) added to training as further patients
        (:class:`~gating_core.method.classifier.MarginalTransferClassifier`'s ``n_augment``). An
        option: measured in docs/unseen_data.md it gained on one simulated cohort only and cost
        another. ``train --augment N``.
    augment_gain, augment_shift : float or "auto", default=0.08 and 0.15
        Standard deviations of the log-gain and of the offset of those shifts ("auto": measured
        per channel from how much the training groups differ); used only with ``n_augment``.
    bandwidth_x_hedge : float in (0, 1) or None, default=None
        An option: fit the marginal model a second time at ``bandwidth_x_hedge`` times the
        larger of the selected sigma_X and the median distance between cells, and gate with the
        mean of the two fits' probabilities (a hedge for a new center needing the bandwidth the
        cross-validation did not choose). Measured in docs/unseen_data.md it changed nothing on
        the real sets: not in the default. It costs a second ridge fit and a
        second set of features in gating. Only with ``select``, sigma_X not given,
        ``solver="rff"`` and the Gaussian cell kernel. ``train --second-bandwidth`` is 0.5.
    self_training : bool, default=False
        An option: at gating time, move each patient's gates towards its own confident cells
        (:mod:`gating_core.method.self_training`): the more confident half of every population the
        model finds among the patient's content-chosen cells, at most 300 cells a population,
        become pseudo-labels, and a ridge fit of their residuals on the marginal classifier's
        features (the refinement of JMLR section 9, with the model's labels instead of a
        reviewer's) is added to the final probabilities. No label of the patient is used.
        Measured in docs/unseen_data.md it gained half a point on the mass cytometry sets and
        cost a real flow set and two simulated cohorts: not in the default. Only
        ``method="marginal"`` with ``solver="rff"``. ``train --self-training``.

    With all five at their defaults it fits and gates as a GatingModel. Its model file stores
    them; :func:`load_gating_model` (and so ``gating-core gate`` and the app) reads a file with
    any of them set back as a ResearchGatingModel, and :meth:`load` reads any GatingModel file
    as one.
    """

    _parameter_constraints = {
        **GatingModel._parameter_constraints,
        "n_augment": [Interval(numbers.Integral, 0)],
        "augment_gain": [Options("auto"), Interval(numbers.Real, 0)],
        "augment_shift": [Options("auto"), Interval(numbers.Real, 0)],
        "bandwidth_x_hedge": [NONE, Interval(numbers.Real, 0, 1, "neither")],
        "self_training": [BOOLEAN],
    }

    def __init__(self, *, n_augment=GatingModel.n_augment, augment_gain=GatingModel.augment_gain,
                 augment_shift=GatingModel.augment_shift, bandwidth_x_hedge=GatingModel.bandwidth_x_hedge,
                 self_training=GatingModel.self_training, **kwargs):
        super().__init__(**kwargs)
        self.n_augment = n_augment
        self.augment_gain = augment_gain
        self.augment_shift = augment_shift
        self.bandwidth_x_hedge = bandwidth_x_hedge
        self.self_training = self_training


def _full_signature() -> inspect.Signature:
    """GatingModel's parameters, then these five: scikit-learn's ``get_params`` and ``clone``
    read the parameters from the signature of ``__init__``, where ``**kwargs`` would hide
    GatingModel's (a clone would then lose them)."""
    own = inspect.signature(ResearchGatingModel.__init__).parameters
    inherited = inspect.signature(GatingModel.__init__).parameters
    return inspect.Signature([*inherited.values()] + [own[name] for name in RESEARCH_OPTIONS])


ResearchGatingModel.__init__.__signature__ = _full_signature()


def model_class(params) -> type:
    """The class that takes ``params`` (names of model parameters): ResearchGatingModel when they
    name any of its options (even at its default: the caller asked for the option), else
    GatingModel."""
    return ResearchGatingModel if any(name in params for name in RESEARCH_OPTIONS) else GatingModel


def build_model(params: dict) -> GatingModel:
    """``model_class(params)(**params)``: a GatingModel, or a ResearchGatingModel when ``params``
    name any of its options."""
    return model_class(params)(**params)


def load_gating_model(path) -> GatingModel:
    """The GatingModel file at ``path`` as whichever model it holds: a ResearchGatingModel when it
    stores a research option away from its default, a GatingModel otherwise (the files written
    before the options left GatingModel store all five, at their defaults when unused). Checked
    as :meth:`GatingModel.load` checks; no pickle."""
    return load_model(GatingModel, path, research_cls=ResearchGatingModel)
