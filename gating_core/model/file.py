"""The model file: a GatingModel written as ``.npz`` and read back, safely.

One ``.npz`` (``numpy.savez_compressed``) holds plain numeric arrays and one JSON document
(``meta``, a unicode array) with channels, transform, populations, hyperparameters and versions.
Reading never unpickles: :func:`gating_core.model.file_checks.read_archive` reads the archive with
bounded memory and declared sizes checked, every field of the description is type-checked
(:class:`~gating_core.model.file_checks.Fields`), hyperparameters must be ones the constructors accept,
and every array's shape must agree with the description. A model sent by someone else cannot
run code, and a damaged one is a :class:`~gating_core.model.file_checks.ModelFileError` naming the
problem.

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
from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.alignment import ALIGNMENTS, LEVELS
from gating_core.method.classifier import LOSSES, PATIENT_WEIGHTINGS, SOLVERS, MarginalTransferClassifier
from gating_core.method.dica import DICA_MODES, MODEL_DICA_FEATURES, cell_projection_from_arrays
from gating_core.method.features import KERNELS_X, LinearMeanEmbedding, LinearProductFeatures, MeanEmbedding, ProductRFF
from gating_core.method.landmark_alignment import MAX_PEAKS, LandmarkReference
from gating_core.method.priors import PRIOR_SHIFTS
from gating_core.model.file_checks import Fields, ModelFileError, archive_array, check_scalar, parse_json, read_archive

MODEL_FORMAT = "gating_core.model"
# 2: the pooled companion of the marginal method (files of format 1 load without one).
# 3: the companion's weight as fitted (pooled_weight="auto"); format-2 files use their parameter.
# 4: the marginal model's second fit, bandwidth_x_hedge (files of formats 1-3 load without one).
# The research options (n_augment, augment_gain, augment_shift, bandwidth_x_hedge, self_training)
# left GatingModel's parameters for ResearchGatingModel's without a new format: a file storing
# them all at GatingModel's values (as every file did before) is a GatingModel's, one storing any
# other value a ResearchGatingModel's (see _model_params).
# 5: self-training at gating time (now ResearchGatingModel.self_training; files of formats 1-4 gate
#    without it).
# 6: the populations adapted to each patient (GatingModel.adaptive_weight; files of formats 1-5 gate
#    without them).
MODEL_FORMAT_VERSION = 6


def save_model(model, path) -> None:
    """Write the model as .npz (arrays + JSON; no pickle), atomically."""
    model._check_fitted()
    clf = model.classifier_
    meta = {
        "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION,
        "gating_core_version": __version__, "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "params": {k: (v if not isinstance(v, (ChannelTransform, dict)) else "custom")
                   for k, v in model.get_params().items()},
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
        meta["adaptive"] = {"weight": float(model.adaptive_weight_), "em_steps": int(adaptive.em_steps),
                            "min_population_cells": float(adaptive.min_population_cells)}
    arrays = {
        "meta": np.array(json.dumps(meta)),
        "center": model.center_, "scale": model.scale_,
        "coef": clf.coef_, "intercept": clf.intercept_,
        "train_embeddings": clf.train_embeddings_,
        "novelty_nn": model.novelty_nn_, "class_prior": model.class_prior_,
    }
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
    if hedge is not None:
        arrays.update(hedge_coef=hedge.coef_, hedge_intercept=hedge.intercept_,
                      hedge_cell_weights=hedge.feature_map_.cell_weights_, hedge_offsets=hedge.feature_map_.offsets_)
        if hedge.feature_map_.embedding_weights_ is not None:
            arrays["hedge_embedding_weights"] = hedge.feature_map_.embedding_weights_
    path = Path(path)
    _write_atomically(path, arrays)


def _landmark_reference(path, peaks, counts) -> LandmarkReference:
    """The LandmarkReference of ``align="landmarks"`` from its arrays, their values checked."""
    if not np.all((counts >= 0) & (counts <= MAX_PEAKS)):
        raise ModelFileError(path, f"model file is inconsistent: 'reference_peak_counts' outside [0, {MAX_PEAKS}]")
    if any(np.any(np.diff(row[:int(c)]) <= 0) for row, c in zip(peaks, counts)):
        raise ModelFileError(path, "model file is inconsistent: 'reference_peaks' are not increasing")
    return LandmarkReference.from_arrays(peaks.astype(np.float64), counts.astype(np.int64))


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
    if "meta" not in arrays:
        raise ModelFileError(path, "not a gating model file (no model description inside)")
    meta = parse_json(path, str(arrays.pop("meta")))
    if meta.get("format") != MODEL_FORMAT:
        raise ModelFileError(path, "not a gating model file (unknown format tag)")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelFileError(path, f"model description: format_version must be a positive integer, got {version!r}"[:200])
    if version > MODEL_FORMAT_VERSION:
        raise ModelFileError(path, f"written by a newer gating_core (format {version}); upgrade to read it")
    try:
        return model_from_parts(cls, meta, arrays, path=path, research_cls=research_cls)
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelFileError(path, f"model file is incomplete or inconsistent ({exc})") from None


def model_from_parts(cls, meta, arrays, path="model", research_cls=None):
    """Build a fitted model from a checked description and arrays (see :func:`load_model`;
    ``research_cls`` as there).

    Every field is type-checked (:class:`~gating_core.model.file_checks.Fields`); hyperparameters
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
    model.adaptive_lda_, model.adaptive_weight_ = _adaptive_populations(path, top.object("adaptive", optional=True),
                                                                        array, arrays, model.populations_, d_cells)
    return model


def _adaptive_populations(path, fields, array, arrays, populations, d: int):
    """The populations adapted to each gated patient (GatingModel.adaptive_weight), and their
    weight: (AdaptiveLDA, weight), or (None, 0.0) for a model without them."""
    if fields is None:
        if any(name.startswith("adaptive_") for name in arrays):
            raise ModelFileError(path, "model file is inconsistent: adaptive arrays in a model without them")
        return None, 0.0
    k = len(populations)
    lda = AdaptiveLDA(em_steps=fields.integer("em_steps", minimum=0, maximum=1000),
                      min_population_cells=fields.number("min_population_cells", within=(0.0, 1e9)))
    lda.classes_ = np.asarray(populations).astype(str)
    lda.means_ = array("adaptive_means", k, d).astype(np.float64)
    lda.covariance_ = array("adaptive_covariance", d, d).astype(np.float64)
    lda.priors_ = array("adaptive_priors", k).astype(np.float64)
    if not (np.all(lda.priors_ > 0) and abs(lda.priors_.sum() - 1) < 1e-6):
        raise ModelFileError(path, "model file is inconsistent: array 'adaptive_priors' is not a distribution")
    if not np.allclose(lda.covariance_, lda.covariance_.T) or np.any(np.linalg.eigvalsh(lda.covariance_) <= 0):
        raise ModelFileError(path, "model file is inconsistent: array 'adaptive_covariance' is not a covariance")
    return lda, fields.number("weight", within=(0.0, 1.0))


# Hyperparameters with a specific rule; others the constructor accepts must be JSON scalars.
_COUNTS = ("n_features", "n_embedding_features", "cells_per_patient", "embedding_cells", "cv_folds",
           "cv_repeats", "selection_cells_per_patient")


# Copies of each training patient: the model file holds an embedding per copy.
_AUGMENT_LIMIT = 64


_BANDWIDTHS = ("bandwidth_x", "bandwidth_p", "bandwidth_embedding", "alpha")


# Transform cofactors and scales: float32 arithmetic divides by them.
_SCALES = (1e-6, 1e12)


def _checked_params(path, fields: Fields, accepted, where: str, methods) -> dict:
    out = {}
    for key, value in fields.data.items():
        if key not in accepted or key == "self" or accepted[key].kind in (inspect.Parameter.VAR_POSITIONAL,
                                                                          inspect.Parameter.VAR_KEYWORD):
            raise ModelFileError(path, f"model description: unknown {where} {key!r} (written by another version?)"[:300])
        if key == "method":
            out[key] = fields.string(key, choices=methods)
        elif key == "solver":
            out[key] = fields.string(key, choices=SOLVERS)
        elif key in _COUNTS:
            out[key] = fields.integer(key, minimum=1, maximum=10 ** 9)
        elif key in _BANDWIDTHS:
            out[key] = fields.number(key, positive=True, nullable=True)
        elif key == "n_augment":
            out[key] = fields.integer(key, minimum=0, maximum=_AUGMENT_LIMIT)
        elif key in ("augment_gain", "augment_shift"):
            out[key] = "auto" if fields.raw(key) == "auto" else fields.number(key, within=(0.0, 10.0))
        elif key == "loss":
            out[key] = fields.string(key, choices=LOSSES)
        elif key == "patient_weighting":
            out[key] = fields.string(key, choices=PATIENT_WEIGHTINGS)
        elif key == "selection_objective":
            out[key] = fields.string(key, choices=("mean", "worst"))
        elif key == "align":
            out[key] = fields.string(key, choices=ALIGNMENTS)
        elif key == "dica":
            out[key] = None if fields.raw(key) is None else fields.string(key, choices=DICA_MODES)
        elif key == "dica_components":
            out[key] = fields.integer(key, minimum=1, maximum=2 * MODEL_DICA_FEATURES)
        elif key == "kernel_x":
            out[key] = fields.string(key, choices=KERNELS_X)
        elif key == "prior_shift":
            out[key] = fields.string(key, choices=PRIOR_SHIFTS)
        elif key == "class_balance":
            out[key] = fields.number(key, within=(0.0, 1.0))
        elif key == "bandwidth_x_hedge":
            out[key] = fields.number(key, positive=True, within=(0.0, 1.0), nullable=True)
        elif key == "task_similarity":
            out[key] = fields.number(key, positive=True, within=(0.0, 1.0), nullable=True)
        elif key in ("pooled_weight", "adaptive_weight"):
            out[key] = "auto" if fields.raw(key) == "auto" else fields.number(key, within=(0.0, 1.0))
        elif key in ("compensate", "select", "use_embedding", "calibrate", "select_embedding_bandwidth",
                     "self_training"):
            out[key] = fields.boolean(key)
        elif key == "random_state":
            out[key] = fields.integer(key, minimum=0, maximum=2 ** 63, nullable=True)
        elif key == "channels":
            out[key] = fields.strings(key, nullable=True)
        elif key == "transform":
            fields.string(key, choices=("auto", "custom"))
            out[key] = "auto"  # the fitted transform_ is what gates; a custom one is in meta["transform"]
        else:
            check_scalar(path, f"{fields.where}.{key}", value)
            out[key] = value
    return out


def _pooled_companion(path, fields: Fields, array, main: MarginalTransferClassifier, d: int, k: int):
    """The pooled companion of a loaded marginal model (see GatingModel.pooled_weight)."""
    companion = MarginalTransferClassifier(**_classifier_params(
        path, fields.object("classifier"), inspect.signature(MarginalTransferClassifier).parameters))
    if companion.use_embedding or companion.solver != "rff" or companion.kernel_x != main.kernel_x:
        raise ModelFileError(path, "model description: the pooled companion must be an 'rff' model "
                                   "without the patient's embedding, with the main model's kernel_x")
    companion.classes_ = main.classes_
    companion.n_features_in_ = d
    companion.bandwidth_x_ = fields.number("bandwidth_x", positive=True)
    companion.bandwidth_p_ = None
    companion.bandwidth_embedding_ = main.bandwidth_embedding_
    companion.temperature_ = fields.number("temperature", positive=True, within=(0, 1e6))
    companion.embedder_ = main.embedder_
    companion.coef_ = array("pooled_coef", None, k).astype(np.float32, copy=False)
    n_out = companion.coef_.shape[0]
    companion.intercept_ = array("pooled_intercept", k).astype(np.float32, copy=False)
    if companion.kernel_x == "linear":
        companion.feature_map_ = _linear_feature_map(path, array, {}, companion, d, n_out, "pooled_")
        return companion
    companion.feature_map_ = _rff_map(path, array, {}, "pooled_", d, n_out, 0, companion.bandwidth_x_, None)
    return companion


def _check_hedge_shares_embedding(hedge, main) -> None:
    """The file stores one embedding map and one set of training embeddings, the main model's:
    the second fit (the same patients, draw and seed) must have the same ones."""
    if not (isinstance(hedge.embedder_, MeanEmbedding) and isinstance(main.embedder_, MeanEmbedding)
            and np.array_equal(hedge.embedder_.frequencies_, main.embedder_.frequencies_)
            and np.array_equal(hedge.train_embeddings_, main.train_embeddings_)):
        raise ValueError("the second fit does not share the main model's embedding: cannot be saved")


def _hedge_model(path, fields: Fields, array, arrays, main: MarginalTransferClassifier, d: int, k: int):
    """The marginal model's second fit (ResearchGatingModel.bandwidth_x_hedge): the main model's
    settings, embedding map and training embeddings, its own sigma_X and weights."""
    if not (main.solver == "rff" and main.kernel_x == "gaussian"):
        raise ModelFileError(path, "model description: a second fit needs an 'rff' model with the Gaussian "
                                   "cell kernel")
    hedge = MarginalTransferClassifier(**main.get_params())
    hedge.bandwidth_x = hedge.bandwidth_x_ = fields.number("bandwidth_x", positive=True)
    hedge.temperature_ = fields.number("temperature", positive=True, within=(0, 1e6))
    for name in ("classes_", "n_features_in_", "bandwidth_p_", "bandwidth_embedding_", "embedder_",
                 "train_embeddings_", "n_patients_"):
        setattr(hedge, name, getattr(main, name))
    hedge.coef_ = array("hedge_coef", None, k).astype(np.float32, copy=False)
    n_out = hedge.coef_.shape[0]
    hedge.intercept_ = array("hedge_intercept", k).astype(np.float32, copy=False)
    embedding_rows = main.train_embeddings_.shape[1] if main.feature_map_.embedding_weights_ is not None else 0
    hedge.feature_map_ = _rff_map(path, array, arrays, "hedge_", d, n_out, embedding_rows, hedge.bandwidth_x_,
                                  hedge.bandwidth_p_)
    return hedge


def _rff_map(path, array, arrays, prefix: str, d: int, n_out: int, embedding_rows: int, bandwidth_x, bandwidth_p):
    """The ProductRFF stored under ``prefix``: cell weights (d, D) and offsets (D,), and embedding
    weights (``embedding_rows``, D) when it uses the patient's embedding (``embedding_rows`` > 0;
    such weights in ``arrays`` otherwise are an inconsistency)."""
    fm = ProductRFF.__new__(ProductRFF)
    fm.cell_weights_ = array(prefix + "cell_weights", d, n_out).astype(np.float32, copy=False)
    fm.offsets_ = array(prefix + "offsets", n_out).astype(np.float64, copy=False)
    if embedding_rows:
        fm.embedding_weights_ = array(prefix + "embedding_weights", embedding_rows, n_out).astype(np.float64, copy=False)
    elif prefix + "embedding_weights" in arrays:
        raise ModelFileError(path, "model file is inconsistent: embedding weights in a model that "
                                   "does not use the patient's embedding")
    else:
        fm.embedding_weights_ = None
    fm.n_features = n_out
    fm.bandwidth_x, fm.bandwidth_p = bandwidth_x, bandwidth_p
    fm.scale_ = np.float32(np.sqrt(2.0 / fm.n_features))
    return fm


def _linear_feature_map(path, array, arrays, clf, d: int, n_out: int, prefix: str) -> LinearProductFeatures:
    """The LinearProductFeatures of a loaded kernel_x='linear' classifier: the k_P frequencies
    and offsets when it uses the embedding, nothing else; ``coef`` must have D_P (d + 1) rows."""
    fm = LinearProductFeatures.__new__(LinearProductFeatures)
    fm.n_dims, fm.bandwidth_p = d, clf.bandwidth_p_
    if clf.use_embedding and clf.bandwidth_p_ is not None:
        fm.embedding_weights_ = array("embedding_weights", d, None).astype(np.float64, copy=False)
        fm.n_embedding_features = fm.embedding_weights_.shape[1]
        fm.offsets_ = array("offsets", fm.n_embedding_features).astype(np.float64, copy=False)
    else:
        if "embedding_weights" in arrays:
            raise ModelFileError(path, "model file is inconsistent: embedding weights in a model that "
                                       "does not use the patient's embedding")
        fm.embedding_weights_, fm.offsets_, fm.n_embedding_features = None, None, 1
    fm.n_features = fm.n_embedding_features * (d + 1)
    if n_out != fm.n_features:
        raise ModelFileError(path, f"model file is inconsistent: array {prefix + 'coef'!r} has {n_out} rows, "
                                   f"expected {fm.n_features} from the linear kernel's features")
    return fm


def _model_params(path, fields: Fields, cls, research_cls=None) -> tuple:
    """The class to build and its parameters in the description: (``cls``, the names its
    constructor accepts, ``method`` one of ``cls.METHODS``), or (``research_cls``, its
    parameters) when the file stores a research option ``cls`` lacks away from ``cls``'s value."""
    accepted = dict(inspect.signature(cls).parameters)
    # The research options ``cls`` has as class attributes only: every file written while they
    # were GatingModel's parameters stores them, at these values unless they were asked for.
    absent = [name for name in getattr(cls, "RESEARCH_OPTIONS", ()) if name not in accepted]
    accepted.update({name: inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in absent})
    params = _checked_params(path, fields, accepted, "model parameter", cls.METHODS)
    # Files written before class_balance existed drew their training cells uniformly.
    params.setdefault("class_balance", 0.0)
    # ... and before the adapted populations. (Files written before self-training existed gate
    # without it: its default.)
    params.setdefault("adaptive_weight", 0.0)
    stored = {name: params.pop(name) for name in absent if name in params}
    asked = {name: value for name, value in stored.items() if value != getattr(cls, name)}
    if not asked:
        return cls, params
    if research_cls is None:
        described = ", ".join(f"{name}={value!r}" for name, value in asked.items())
        raise ModelFileError(path, f"a ResearchGatingModel's file ({described}): read it with "
                                   "gating_core.model.research.load_gating_model or ResearchGatingModel.load")
    return research_cls, {**params, **stored}


def _classifier_params(path, fields: Fields, accepted) -> dict:
    return _checked_params(path, fields, accepted, "classifier parameter", methods=())


def _transform(path, fields: Fields, d: int) -> ChannelTransform:
    kinds = fields.strings("kinds")
    params = fields.raw("params")
    if len(kinds) != d or not isinstance(params, list) or len(params) != d:
        raise ModelFileError(path, f"model description: transform must give kinds and params for {d} channels")
    checked = []
    for j, (kind, p) in enumerate(zip(kinds, params)):
        entry = Fields(path, p, f"transform.params[{j}]")
        if kind == "arcsinh":
            values = {"cofactor": entry.number("cofactor", optional=True, within=_SCALES)}
        elif kind == "linear":
            values = {"scale": entry.number("scale", optional=True, within=_SCALES)}
        elif kind == "logicle":
            values = {key: entry.number(key) for key in ("T", "W", "M", "A")}
            t, w, m, a = (values[key] for key in ("T", "W", "M", "A"))
            if not (t > 0 and m > 0 and 0 <= w <= m / 2 and -w <= a <= m - 2 * w):
                raise ModelFileError(path, f"model description: transform.params[{j}] are not valid logicle "
                                           f"parameters (T={t}, W={w}, M={m}, A={a})")
        else:
            raise ModelFileError(path, f"model description: unknown transform {kind!r} for channel {j + 1}"[:200])
        checked.append({key: value for key, value in values.items() if value is not None})
    return ChannelTransform(kinds, checked)
