"""The model file: a GatingModel written as ``.npz`` and read back, safely.

One ``.npz`` (``numpy.savez_compressed``) holds plain numeric arrays and one JSON document
(``meta``, a unicode array) with channels, transform, populations, hyperparameters and versions.
Reading never unpickles: :func:`gating_core.model.file_checks.read_archive` reads the archive with
bounded memory and declared sizes checked, every field of the description is type-checked
(:class:`~gating_core.model.file_fields.Fields`), hyperparameters must be ones the constructors accept,
and every array's shape must agree with the description. A model sent by someone else cannot
run code, and a damaged one is a :class:`~gating_core.model.file_checks.ModelFileError` naming the
problem. This module writes the file and reads its classifier; the other fitted parts are read
by :mod:`gating_core.model.file_parts`, the hyperparameters and the channel transform checked
by :mod:`gating_core.model.file_params`.

This module sits below :mod:`gating_core.model.estimator`, whose ``GatingModel.save`` / ``GatingModel.load``
call :func:`save_model` / :func:`load_model`, and so never imports it: :func:`load_model` is
given the class to build, and reads the choices of its ``method`` and the names of the research
options (``RESEARCH_OPTIONS``, parameters of
:class:`~gating_core.model.research.ResearchGatingModel` only) from it.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
from pathlib import Path

import numpy as np

from gating_core import __version__
from gating_core.fcs.transforms import ChannelTransform
from gating_core.method.alignment import LEVELS
from gating_core.method.landmark_alignment import MAX_PEAKS
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.dica import cell_projection_from_arrays
from gating_core.method.features import LinearMeanEmbedding, LinearProductFeatures, MeanEmbedding
from gating_core.model.file_checks import ModelFileError, archive_array, read_archive
from gating_core.model.file_fields import Fields, read_description
from gating_core.model.file_params import _classifier_params, _model_params, _transform
from gating_core.method.boosted_trees import PooledTrees
from gating_core.method.population_components import component_names
from gating_core.model.file_parts import (_adaptive_populations, _components, _hedge_model,
                                          _landmark_reference, _linear_feature_map, _pooled_companion,
                                          _population_reach, _rff_map)

MODEL_FORMAT = "gating_core.model"
# 2: the pooled companion of the marginal method (files of format 1 load without one).
# 3: the companion's weight as fitted (pooled_weight="auto"); format-2 files use their parameter.
# 4: the marginal model's second fit, bandwidth_x_hedge (files of formats 1-3 load without one).
# The research options (n_augment, augment_gain, augment_shift, bandwidth_x_hedge, self_training)
# left GatingModel's parameters for ResearchGatingModel's without a new format: a file storing
# them all at GatingModel's values (as every file did before) is a GatingModel's, one storing any
# other value a ResearchGatingModel's (see file_params._model_params).
# 5: self-training at gating time (now ResearchGatingModel.self_training; files of formats 1-4 gate
#    without it).
# 6: the populations adapted to each patient (GatingModel.adaptive_weight; files of formats 1-5 gate
#    without them).
# 7: the populations' reach, which calls cells beyond all of them unknown (GatingModel.unknown_margin;
#    files of formats 1-6 call no cell unknown).
# 8: where the adapted populations' EM starts ("adaptive": {"start": ...}; files of formats 6-7 start
#    from the training populations).
# 9: the adapted populations' own-shape fit ("adaptive": {"shapes": true}, on the populations'
#    reach, which a model then holds with or without unknown_margin; files of formats 6-8 adapt
#    the shared-covariance fit alone).
# 10: the transforms a user set for some channels (params.transform: channel -> text, read back as
#    given; files of formats 1-9 say "auto" or "custom" and read back "auto").
# 11: populations split into Gaussian components for the adapted populations and the reach
#    (adaptive_components: each component's population; the adaptive_ and reach_ arrays have a
#    row per component).
# 12: each population's largest share in a training patient (largest_shares), against which a
#    rare population the adapted populations let swell is told (files of formats 1-11 mix every
#    population alike).
# 13: each training patient's means of the populations in the reach (reach_patient_means): a cell
#    where a training patient had a population is not unknown (files of formats 7-12 measure the
#    new patient's own means alone).
# 14: pooled gradient-boosted trees taking half the transfer model's part (trees_*), where the
#    weight's check took them (files of formats 1-13 gate without them).
MODEL_FORMAT_VERSION = 14

#: The pooled trees' arrays (:class:`~gating_core.method.boosted_trees.PooledTrees`), by file name
#: and attribute.
TREE_ARRAYS = {"trees_columns": "columns_", "trees_feature": "feature_", "trees_threshold": "threshold_",
               "trees_left": "left_", "trees_right": "right_", "trees_value": "value_", "trees_roots": "roots_",
               "trees_baseline": "baseline_"}


def _param_value(value):
    """A parameter as the description holds it: channel -> transform text for the transforms a
    user set (``transform={...}``; read back as given), "custom" for a whole ChannelTransform."""
    if isinstance(value, dict):
        return {str(channel): str(spec) for channel, spec in value.items()}
    if isinstance(value, ChannelTransform):
        return "custom"
    return value


def save_model(model, path) -> None:
    """Write the model as .npz (arrays + JSON; no pickle), atomically."""
    model._check_fitted()
    clf = model.classifier_
    meta = {
        "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION,
        "gating_core_version": __version__, "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "params": {k: _param_value(v) for k, v in model.get_params().items()},
        "channels": model.channels_, "channel_markers": model.channel_markers_,
        "transform": model.transform_.to_dict(), "populations": model.populations_,
        "training_patients": model.training_patients_,
        "groups": model.groups_, "groups_inferred": model.groups_inferred_,
        "classifier": {k: v for k, v in clf.get_params().items()},
        "fitted": {"bandwidth_x": clf.bandwidth_x_, "bandwidth_p": clf.bandwidth_p_,
                   "bandwidth_embedding": clf.bandwidth_embedding_, "temperature": clf.temperature_,
                   "n_features_in": clf.n_features_in_},
        "novelty": {"reference": model.novelty_reference_, "threshold": model.novelty_threshold_},
        "selection": {k: v for k, v in model.selection_.items() if k != "table"},
    }
    companion = getattr(model, "pooled_classifier_", None)
    if companion is not None:
        meta["pooled"] = {"classifier": companion.get_params(), "bandwidth_x": companion.bandwidth_x_,
                          "temperature": companion.temperature_, "weight": float(model.pooled_weight_)}
    hedge = getattr(model, "hedge_classifier_", None)
    if hedge is not None:
        _check_hedge_shares_embedding(hedge, clf)
        meta["hedge"] = {"bandwidth_x": hedge.bandwidth_x_, "temperature": hedge.temperature_}
    adaptive = getattr(model, "adaptive_lda_", None)
    if adaptive is not None:
        meta["adaptive"] = {"weight": float(model.adaptive_weight_), "start": str(model.adaptive_start_),
                            "em_steps": int(adaptive.em_steps),
                            "min_population_cells": float(adaptive.min_population_cells),
                            "shapes": bool(getattr(model, "adaptive_shapes_", False))}
    reach = getattr(model, "population_reach_", None)
    if reach is not None:
        meta["reach"] = {"quantile": float(reach.reach_quantile), "em_steps": int(reach.em_steps)}
    arrays = {
        "meta": np.array(json.dumps(meta)),
        "center": model.center_, "scale": model.scale_,
        "coef": clf.coef_, "intercept": clf.intercept_,
        "train_embeddings": clf.train_embeddings_,
        "novelty_nn": model.novelty_nn_, "class_prior": model.class_prior_,
    }
    if getattr(model, "largest_shares_", None) is not None:
        arrays["largest_shares"] = model.largest_shares_
    trees = getattr(model, "pooled_trees_", None)
    if trees is not None:
        arrays.update({name: getattr(trees, attribute) for name, attribute in TREE_ARRAYS.items()})
    if isinstance(clf.embedder_, MeanEmbedding):  # the linear k'_X (mean cell) has no frequencies
        arrays["embedding_frequencies"] = clf.embedder_.frequencies_
    if isinstance(getattr(clf, "feature_map_", None), LinearProductFeatures):
        # kernel_x="linear": the k_P frequencies only (none without the embedding)
        if clf.feature_map_.embedding_weights_ is not None:
            arrays.update(embedding_weights=clf.feature_map_.embedding_weights_, offsets=clf.feature_map_.offsets_)
    elif clf.solver == "rff":
        fm = clf.feature_map_
        arrays.update(cell_weights=fm.cell_weights_, offsets=fm.offsets_)
        if fm.embedding_weights_ is not None:
            arrays["embedding_weights"] = fm.embedding_weights_
    else:
        arrays.update(landmark_cells=clf.landmark_cells_, landmark_embeddings=clf.landmark_embeddings_,
                      landmark_projection=clf.landmark_projection_)
    if getattr(model, "reference_quantiles_", None) is not None:
        arrays["reference_quantiles"] = model.reference_quantiles_
    if getattr(model, "reference_landmarks_", None) is not None:
        arrays["reference_peaks"], arrays["reference_peak_counts"] = model.reference_landmarks_.as_arrays()
    dica = getattr(model, "dica_", None)
    if dica is not None:  # the DICA projection after standardisation (GatingModel's ``dica``)
        arrays.update(dica_frequencies=dica.frequencies_, dica_feature_mean=dica.feature_mean_,
                      dica_projection=dica.projection_)
    if companion is not None:
        arrays.update(pooled_coef=companion.coef_, pooled_intercept=companion.intercept_)
        if not isinstance(companion.feature_map_, LinearProductFeatures):  # a linear companion is [x, 1] alone
            arrays.update(pooled_cell_weights=companion.feature_map_.cell_weights_,
                          pooled_offsets=companion.feature_map_.offsets_)
    if adaptive is not None:
        arrays.update(adaptive_means=adaptive.means_, adaptive_covariance=adaptive.covariance_,
                      adaptive_priors=adaptive.priors_)
        if getattr(model, "adaptive_components_", None) is not None:
            arrays["adaptive_components"] = np.asarray(model.adaptive_components_, dtype=np.int64)
    if reach is not None:
        arrays.update(reach_means=reach.means_, reach_whitening=reach.whitening_, reach_log_dets=reach.log_dets_,
                      reach_priors=reach.priors_, reach_distances=reach.reach_, reach_typical=reach.typical_)
        if getattr(reach, "patient_means_", None) is not None:
            arrays["reach_patient_means"] = reach.patient_means_
    if hedge is not None:
        arrays.update(hedge_coef=hedge.coef_, hedge_intercept=hedge.intercept_,
                      hedge_cell_weights=hedge.feature_map_.cell_weights_, hedge_offsets=hedge.feature_map_.offsets_)
        if hedge.feature_map_.embedding_weights_ is not None:
            arrays["hedge_embedding_weights"] = hedge.feature_map_.embedding_weights_
    path = Path(path)
    _write_atomically(path, arrays)


def _pooled_trees(path, arrays, populations, n_channels):
    """The pooled trees the file holds (all of ``TREE_ARRAYS``), or None (none of them)."""
    present = [name for name in TREE_ARRAYS if name in arrays]
    if not present:
        return None
    if len(present) != len(TREE_ARRAYS):
        missing = ", ".join(name for name in TREE_ARRAYS if name not in arrays)
        raise ModelFileError(path, f"model file is inconsistent: the pooled trees lack {missing}")
    shapes = {"trees_roots": (None, None)}
    values = {attribute.rstrip("_"): archive_array(path, arrays, name, *shapes.get(name, (None,)))
              for name, attribute in TREE_ARRAYS.items()}
    try:
        return PooledTrees.from_arrays(populations, n_channels=n_channels, **values)
    except ValueError as exc:
        raise ModelFileError(path, f"model file is inconsistent: {exc}") from None


def _check_hedge_shares_embedding(hedge, main) -> None:
    """The file stores one embedding map and one set of training embeddings, the main model's:
    the second fit (the same patients, draw and seed) must have the same ones."""
    if not (isinstance(hedge.embedder_, MeanEmbedding) and isinstance(main.embedder_, MeanEmbedding)
            and np.array_equal(hedge.embedder_.frequencies_, main.embedder_.frequencies_)
            and np.array_equal(hedge.train_embeddings_, main.train_embeddings_)):
        raise ValueError("the second fit does not share the main model's embedding: cannot be saved")


def _write_atomically(path: Path, arrays: dict) -> None:
    """``arrays`` as a compressed .npz at ``path``: written beside it as ``<name>.part``, then
    renamed; nothing is left behind when either step fails (``path`` a folder, a full disk)."""
    tmp = path.with_name(path.name + ".part")
    try:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_model(cls, path, research_cls=None):
    """Read a ``cls`` (GatingModel) written by :func:`save_model`; raises ModelFileError for anything else.

    ``research_cls``: the class to build instead when ``cls`` lacks a research option the file
    stores away from ``cls``'s value (ResearchGatingModel); None: such a file is a
    ModelFileError naming what reads it. The file is read by :func:`gating_core.model.file_checks.read_archive` (bounded memory, no
    pickle, declared sizes checked before decompressing); the JSON description is checked
    field by field and the arrays' shapes against it (see :func:`model_from_parts`).
    """
    path = Path(path)
    arrays = read_archive(path)
    meta = read_description(path, arrays, MODEL_FORMAT, MODEL_FORMAT_VERSION,
                            "not a gating model file (unknown format tag)")
    try:
        return model_from_parts(cls, meta, arrays, path=path, research_cls=research_cls)
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelFileError(path, f"model file is incomplete or inconsistent ({exc})") from None


def model_from_parts(cls, meta, arrays, path="model", research_cls=None):
    """Build a fitted model from a checked description and arrays (see :func:`load_model`;
    ``research_cls`` as there).

    Every field is type-checked (:class:`~gating_core.model.file_fields.Fields`); hyperparameters
    must be ones the constructors accept; array shapes must agree with each other and with
    the description. A violation is a ModelFileError.
    """
    top = Fields(path, meta, "model")
    cls, params = _model_params(path, top.object("params"), cls, research_cls)
    model = cls(**params)
    model.channels_ = top.strings("channels", min_length=1, unique=True)
    d = len(model.channels_)
    model.channel_markers_ = top.strings("channel_markers")
    if len(model.channel_markers_) != d:
        raise ValueError(f"{d} channels but {len(model.channel_markers_)} markers")
    model.transform_ = _transform(path, top.object("transform"), d)
    model.populations_ = top.strings("populations", min_length=2, unique=True)
    model.training_patients_ = top.strings("training_patients", min_length=1)
    n_patients = len(model.training_patients_)
    model.groups_ = top.strings("groups", optional=True) or list(model.training_patients_)
    if len(model.groups_) != n_patients:
        raise ModelFileError(path, f"model description: {len(model.groups_)} groups for {n_patients} patients")
    model.groups_inferred_ = bool(top.boolean("groups_inferred", optional=True))
    selection = top.object("selection", optional=True)
    model.selection_ = dict(selection.data) if selection is not None else {}
    if selection is not None:
        selection.number("cv_accuracy", optional=True, nullable=True)
    novelty = top.object("novelty")
    model.novelty_reference_ = novelty.number("reference", positive=True)
    model.novelty_threshold_ = novelty.number("threshold", positive=True, allow_inf=True)
    clf = MarginalTransferClassifier(**_classifier_params(
        path, top.object("classifier"), inspect.signature(MarginalTransferClassifier).parameters))
    fitted = top.object("fitted")
    clf.classes_ = np.asarray(model.populations_)
    # The classifier sees d standardised channels, or dica_components projected ones.
    d_cells = d if model.dica is None else model.dica_components
    clf.n_features_in_ = fitted.integer("n_features_in", minimum=d_cells, maximum=d_cells)
    clf.bandwidth_x_ = fitted.number("bandwidth_x", positive=True)
    clf.bandwidth_p_ = fitted.number("bandwidth_p", positive=True, nullable=True)
    clf.bandwidth_embedding_ = fitted.number("bandwidth_embedding", positive=True)
    clf.temperature_ = fitted.number("temperature", positive=True, within=(0, 1e6))

    def array(name, *shape):
        return archive_array(path, arrays, name, *shape)

    k, n_patients = len(model.populations_), len(model.training_patients_)
    model.center_ = array("center", d).astype(np.float32, copy=False)
    model.scale_ = array("scale", d).astype(np.float32, copy=False)
    if not np.all(model.scale_ != 0):
        raise ModelFileError(path, "model file is inconsistent: array 'scale' holds zeros")
    model.novelty_nn_ = array("novelty_nn", n_patients)
    # Format 1 files hold no training prior: uniform, used only by prior_shift="em".
    model.class_prior_ = (array("class_prior", k).astype(np.float64) if "class_prior" in arrays
                          else np.full(k, 1.0 / k))
    if not (np.all(model.class_prior_ > 0) and abs(model.class_prior_.sum() - 1) < 1e-6):
        raise ModelFileError(path, "model file is inconsistent: array 'class_prior' is not a distribution")
    model.largest_shares_ = None
    if "largest_shares" in arrays:
        model.largest_shares_ = array("largest_shares", k).astype(np.float64)
        if not np.all((model.largest_shares_ >= 0) & (model.largest_shares_ <= 1)):
            raise ModelFileError(path, "model file is inconsistent: array 'largest_shares' holds values outside [0, 1]")
    model.pooled_trees_ = _pooled_trees(path, arrays, model.populations_, d_cells)
    model.dica_ = None
    if model.dica is not None:
        n_dica = array("dica_frequencies", d, None).shape[1]
        model.dica_ = cell_projection_from_arrays(array("dica_frequencies", d, n_dica),
                                                  array("dica_feature_mean", 2 * n_dica),
                                                  array("dica_projection", 2 * n_dica, d_cells))
    elif any(name.startswith("dica_") for name in arrays):
        raise ModelFileError(path, "model file is inconsistent: DICA arrays in a model without DICA")
    model.reference_quantiles_ = None
    if model.align == "quantile":
        landmarks = array("reference_quantiles", d_cells, len(LEVELS)).astype(np.float64)
        if not np.all(np.diff(landmarks, axis=1) > 0):
            raise ModelFileError(path, "model file is inconsistent: 'reference_quantiles' are not increasing")
        model.reference_quantiles_ = landmarks
    model.reference_landmarks_ = None
    if model.align == "landmarks":
        model.reference_landmarks_ = _landmark_reference(path, array("reference_peaks", d_cells, MAX_PEAKS),
                                                         array("reference_peak_counts", d_cells))
    linear = clf.kernel_x == "linear"
    if linear and clf.solver != "rff":
        raise ModelFileError(path, "model description: kernel_x='linear' needs solver='rff'")
    if linear:  # Psi(P) is the mean cell: d_cells entries, no frequencies
        if "embedding_frequencies" in arrays or "cell_weights" in arrays:
            raise ModelFileError(path, "model file is inconsistent: Gaussian kernel arrays in a model with "
                                       "kernel_x='linear'")
        embedding_size = d_cells
    else:
        frequencies = array("embedding_frequencies", d_cells, None).astype(np.float64, copy=False)
        n_embedding = frequencies.shape[1]
        if n_embedding < 1:
            raise ModelFileError(path, "model file is inconsistent: no embedding frequencies")
        embedding_size = 2 * n_embedding
    # Training rows: the real patients, then their augmented copies.
    clf.train_embeddings_ = array("train_embeddings", n_patients * (1 + int(clf.n_augment)),
                                  embedding_size).astype(np.float64, copy=False)
    clf.n_patients_ = n_patients
    clf.coef_ = array("coef", None, k).astype(np.float32, copy=False)
    n_out = clf.coef_.shape[0]
    clf.intercept_ = array("intercept", k).astype(np.float32, copy=False)
    if linear:
        clf.embedder_ = LinearMeanEmbedding(d_cells)
        clf.feature_map_ = _linear_feature_map(path, array, arrays, clf, d_cells, n_out, "")
    else:
        embedder = MeanEmbedding.__new__(MeanEmbedding)
        embedder.frequencies_ = frequencies
        embedder.n_features = n_embedding
        embedder.bandwidth = clf.bandwidth_embedding_
        clf.embedder_ = embedder
    if not linear and clf.solver == "rff":
        uses_embedding = clf.use_embedding and clf.bandwidth_p_ is not None
        clf.feature_map_ = _rff_map(path, array, arrays, "", d_cells, n_out, 2 * n_embedding if uses_embedding else 0,
                                    clf.bandwidth_x_, clf.bandwidth_p_)
    elif not linear:
        clf.landmark_projection_ = array("landmark_projection", None, n_out).astype(np.float64, copy=False)
        m = clf.landmark_projection_.shape[0]
        clf.landmark_cells_ = array("landmark_cells", m, d_cells).astype(np.float64, copy=False)
        clf.landmark_embeddings_ = array("landmark_embeddings", m, 2 * n_embedding).astype(np.float64, copy=False)
    model.classifier_ = clf
    hedge = top.object("hedge", optional=True)
    model.hedge_classifier_ = None if hedge is None else _hedge_model(path, hedge, array, arrays, clf, d_cells, k)
    if hedge is None and any(name.startswith("hedge_") for name in arrays):
        raise ModelFileError(path, "model file is inconsistent: hedge arrays in a model without a hedge")
    model.pooled_classifier_, model.pooled_weight_ = None, 0.0
    pooled = top.object("pooled", optional=True)
    if pooled is not None:
        model.pooled_classifier_ = _pooled_companion(path, pooled, array, clf, d_cells, k)
        # Format 2 wrote no fitted weight: its parameter was the weight.
        weight = pooled.number("weight", within=(0.0, 1.0), optional=True)
        if weight is None:
            if model.pooled_weight == "auto":
                raise ModelFileError(path, "model description: the pooled companion has no weight")
            weight = float(model.pooled_weight)
        model.pooled_weight_ = float(weight)
    model.adaptive_components_ = _components(path, array, arrays, len(model.populations_))
    parts = (model.populations_ if model.adaptive_components_ is None
             else list(component_names(model.adaptive_components_)))
    (model.adaptive_lda_, model.adaptive_weight_, model.adaptive_start_,
     model.adaptive_shapes_) = _adaptive_populations(path, top.object("adaptive", optional=True), array, arrays,
                                                     parts, d_cells)
    if model.adaptive_lda_ is None and model.adaptive_components_ is not None:
        raise ModelFileError(path, "model file is inconsistent: components without the adapted populations")
    model.population_reach_ = _population_reach(path, top.object("reach", optional=True), array, arrays,
                                                parts, d_cells)
    if model.population_reach_ is None:
        if model.adaptive_shapes_:
            raise ModelFileError(path, "model file is inconsistent: the adapted populations' own shapes "
                                       "without the populations' reach")
        model.unknown_margin = None  # files before format 7, or fitted with unknown_margin=None
    elif model.unknown_margin is None and not model.adaptive_shapes_:
        raise ModelFileError(path, "model file is inconsistent: the populations' reach in a model without "
                                   "unknown_margin or the adapted populations' own shapes")
    return model
