"""``ResearchGatingModel``: the product's model with the method's family and the options its
default leaves out, as parameters.

:class:`~gating_core.model.estimator.GatingModel` is the product's estimator, with the parameters
a lab sets. Everything else the method can be -- the pooling and multitask baselines, the hinge and
logistic losses, the Nystroem and exact solvers, agnostic patient weights, the linear cell
kernel, DICA, alignment, the EM prior shift, population-balanced training cells, selecting sigma'
or for the worst group -- and the options measured and left out of the default (shift
augmentation, a second cell bandwidth, self-training, a second start for EM) are kept here, in one place, as the
parameters of a subclass. ``train``'s options for them and ``evaluate``'s method variants build
their models with it (:func:`build_model` chooses the class from the parameters);
:func:`load_gating_model` reads a model file into whichever of the two it holds.
"""

from __future__ import annotations

import inspect
import numbers

from gating_core.method.alignment import ALIGNMENTS
from gating_core.method.classifier import LOSSES, PATIENT_WEIGHTINGS, SOLVERS
from gating_core.method.dica import DICA_MODES, MODEL_DICA_FEATURES
from gating_core.method.features import KERNELS_X
from gating_core.method.population_components import MAX_COMPONENTS_PER_POPULATION
from gating_core.method.priors import PRIOR_SHIFTS
from gating_core.model.estimator import METHODS, GatingModel
from gating_core.model.file import load_model
from gating_core.parameters import BOOLEAN, NONE, Interval, Options

#: ResearchGatingModel's own parameters (GatingModel's class attributes of the same names hold
#: the values GatingModel runs with, which are these parameters' defaults).
RESEARCH_OPTIONS = GatingModel.RESEARCH_OPTIONS


class ResearchGatingModel(GatingModel):
    """:class:`~gating_core.model.estimator.GatingModel` with the research options as parameters.

    Every parameter of GatingModel (keyword-only, as there), and these (each defaults to the
    value GatingModel runs with):

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
    transfer_start : bool, default=False
        An option: with ``adaptive_weight="auto"``, the folds also score EM started from the
        transfer model's posteriors of the patient's cells (mixed in at
        ``TRANSFER_START_WEIGHT``), and that start is taken (``adaptive_start_ = "transfer"``)
        when it gates the held-out patients better than every weight of the training start by
        more than ``ADAPTIVE_WEIGHT_TOLERANCE``. Measured in docs/unseen_data.md it gained on the
        simulated cohorts only: on the real sets it was never better, and leaving one patient out
        it cost a flow biopsy 23 points. ``train --transfer-start``.
    population_components : int in [1, 8], default=3
        Gaussian components a population may be split into for the adapted populations and the
        reach, when its training cells form separate clusters within most patients
        (:func:`~gating_core.method.population_components.split_populations`). 1: every
        population one Gaussian (``evaluate --method marginal-whole-populations``).
    adaptive_shapes : bool, default=True
        Whether the adapted populations include the own-shape fit (every population a Gaussian
        of its own training shape, :class:`~gating_core.method.unknown_cells.PopulationReach`)
        beside the shared-covariance one. False: the shared-covariance fit alone, for measuring
        what the own shapes add (``evaluate --method marginal-shared-covariance``).
    swollen_check : bool, default=True
        Whether gating takes the column of a rare population from the transfer model alone in a
        patient where the adapted populations let it swell over its neighbours' cells
        (:mod:`~gating_core.method.swollen_populations`). False: the plain mix, for measuring what
        the check adds (``evaluate --method marginal-no-swollen-check``).
    trees_check : bool, default=True
        Whether the check of ``adaptive_weight="auto"`` also scores pooled gradient-boosted trees
        taking half the transfer model's part, and takes them where its held-out groups gate
        better with them (:func:`~gating_core.model.weight_check.trees_choice`). False: never, for
        measuring what they add (``evaluate --method marginal-no-trees``).

    method : {"marginal", "pooling", "multitask"}, default="marginal"
        Marginal transfer, or the pooling / multitask baselines (multitask: k_P =
        ``task_similarity`` between two training patients, 1 within one; a new patient is gated by
        the part shared across patients). The baselines gate without the adapted populations.
    solver : {"rff", "nystroem", "exact"}, default="rff"
    loss : {"squared", "logistic", "hinge"}, default="squared"
    patient_weighting : {"uniform", "agnostic"}, default="uniform"
    kernel_x : {"gaussian", "linear"}, default="gaussian"
        Passed to :class:`~gating_core.method.classifier.MarginalTransferClassifier`.
    select_embedding_bandwidth : bool, default=False
        Also select sigma' of the embedding (JMLR section 8.1).
    selection_objective : {"mean", "worst"}, default="mean"
        What selection maximises over held-out groups.
    prior_shift : {"none", "em"}, default="none"
        "em": re-estimate each gated patient's population shares from its own cells
        (:mod:`gating_core.method.priors`) and adjust the probabilities to them.
    align : {"none", "quantile", "landmarks"}, default="none"
        Register each channel of every patient first (:mod:`gating_core.method.alignment`;
        measured in docs/alignment.md).
    task_similarity : float in (0, 1], default=0.5
        tau of ``method="multitask"``.
    dica : {None, "supervised", "unsupervised"}, default=None
        (U)DICA projection of the cells after standardisation onto ``dica_components``
        directions (:mod:`gating_core.method.dica`).
    dica_components : int, default=20
    class_balance : float in [0, 1], default=0
        0: training cells drawn uniformly; 1: as many from every population as it has
        (:func:`~gating_core.model.digest.training_rows`).

    With all of them at their defaults it fits and gates as a GatingModel. Its model file stores
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
        "transfer_start": [BOOLEAN],
        "adaptive_shapes": [BOOLEAN],
        "population_components": [Interval(numbers.Integral, 1, MAX_COMPONENTS_PER_POPULATION)],
        "swollen_check": [BOOLEAN],
        "trees_check": [BOOLEAN],
        "method": [Options(*METHODS)],
        "solver": [Options(*SOLVERS)],
        "loss": [Options(*LOSSES)],
        "patient_weighting": [Options(*PATIENT_WEIGHTINGS)],
        "kernel_x": [Options(*KERNELS_X)],
        "select_embedding_bandwidth": [BOOLEAN],
        "selection_objective": [Options("mean", "worst")],
        "prior_shift": [Options(*PRIOR_SHIFTS)],
        "align": [Options(*ALIGNMENTS)],
        "task_similarity": [Interval(numbers.Real, 0, 1, "right")],
        "dica": [NONE, Options(*DICA_MODES)],
        "dica_components": [Interval(numbers.Integral, 1, 2 * MODEL_DICA_FEATURES)],
        "class_balance": [Interval(numbers.Real, 0, 1)],
    }

    def __init__(self, **params):
        own = {name: params.pop(name, getattr(GatingModel, name)) for name in RESEARCH_OPTIONS}
        super().__init__(**params)  # an unknown name is GatingModel's TypeError
        for name, value in own.items():
            setattr(self, name, value)


def _full_signature() -> inspect.Signature:
    """GatingModel's parameters, then the research options with GatingModel's values as their
    defaults: scikit-learn's ``get_params`` and ``clone`` read the parameters from the signature
    of ``__init__``, where ``**params`` would hide them (a clone would then lose them)."""
    inherited = inspect.signature(GatingModel.__init__).parameters
    own = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(GatingModel, name))
           for name in RESEARCH_OPTIONS]
    return inspect.Signature([*inherited.values()] + own)


ResearchGatingModel.__init__.__signature__ = _full_signature()


def model_class(params) -> type:
    """The class that takes ``params`` (model parameters): ResearchGatingModel when they set any
    of its options away from GatingModel's value, else GatingModel."""
    asked = any(name in params and params[name] != getattr(GatingModel, name) for name in RESEARCH_OPTIONS)
    return ResearchGatingModel if asked else GatingModel


def build_model(params: dict) -> GatingModel:
    """The model of ``params``: a ResearchGatingModel when they set any of its options away from
    GatingModel's value, else a GatingModel (research options at those values dropped: it runs
    with them)."""
    cls = model_class(params)
    if cls is GatingModel:
        params = {name: value for name, value in params.items() if name not in RESEARCH_OPTIONS}
    return cls(**params)


def load_gating_model(path) -> GatingModel:
    """The GatingModel file at ``path`` as whichever model it holds: a ResearchGatingModel when it
    stores a research option away from its default, a GatingModel otherwise (the files written
    before the options left GatingModel store all five, at their defaults when unused). Checked
    as :meth:`GatingModel.load` checks; no pickle."""
    return load_model(GatingModel, path, research_cls=ResearchGatingModel)
