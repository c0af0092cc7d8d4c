"""The fitted parts of a model read back from its file, each checked against the description:
the classifier's feature maps (random Fourier or linear), the pooled companion, the second fit,
the landmark reference, the populations adapted to each patient and the populations' reach.

:func:`gating_core.model.file.model_from_parts` calls these with ``array(name, *shape)``, which
returns an array of the file with its shape checked (``None``: any length); a part whose arrays
disagree with the description is a :class:`~gating_core.model.file_checks.ModelFileError`.
"""

from __future__ import annotations

import inspect

import numpy as np

from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.landmark_alignment import MAX_PEAKS, LandmarkReference
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.features import LinearProductFeatures, ProductRFF
from gating_core.method.unknown_cells import PopulationReach
from gating_core.method.population_components import MAX_COMPONENTS_PER_POPULATION
from gating_core.model.weight_check import ADAPTIVE_STARTS
from gating_core.model.file_checks import ModelFileError
from gating_core.model.file_fields import Fields
from gating_core.model.file_params import _classifier_params


def _landmark_reference(path, peaks, counts) -> LandmarkReference:
    """The LandmarkReference of ``align="landmarks"`` from its arrays, their values checked."""
    if not np.all((counts >= 0) & (counts <= MAX_PEAKS)):
        raise ModelFileError(path, f"model file is inconsistent: 'reference_peak_counts' outside [0, {MAX_PEAKS}]")
    if any(np.any(np.diff(row[:int(c)]) <= 0) for row, c in zip(peaks, counts)):
        raise ModelFileError(path, "model file is inconsistent: 'reference_peaks' are not increasing")
    return LandmarkReference.from_arrays(peaks.astype(np.float64), counts.astype(np.int64))


def _components(path, array, arrays, k: int):
    """Each component's population index (k_c,) of a model whose adapted populations are split
    into components (format 11), or None: in population order, every population at least once."""
    if "adaptive_components" not in arrays:
        return None
    population_of = array("adaptive_components", None).astype(np.int64)
    if (not k <= len(population_of) <= MAX_COMPONENTS_PER_POPULATION * k or np.any(np.diff(population_of) < 0)
            or not np.array_equal(np.unique(population_of), np.arange(k))):
        raise ModelFileError(path, "model file is inconsistent: array 'adaptive_components' must name every "
                                   "population, in order")
    return population_of


def _population_reach(path, fields, array, arrays, populations, d: int):
    """Where each population reaches (GatingModel.unknown_margin): a PopulationReach, or None
    for a model that calls no cell unknown."""
    if fields is None:
        if any(name.startswith("reach_") for name in arrays):
            raise ModelFileError(path, "model file is inconsistent: reach arrays in a model without them")
        return None
    k = len(populations)
    reach = PopulationReach(reach_quantile=fields.number("quantile", within=(0.0, 1.0)),
                            em_steps=fields.integer("em_steps", minimum=0, maximum=1000))
    reach.classes_ = np.asarray(populations).astype(str)
    reach.means_ = array("reach_means", k, d).astype(np.float64)
    reach.whitening_ = array("reach_whitening", k, d, d).astype(np.float64)
    reach.log_dets_ = array("reach_log_dets", k).astype(np.float64)
    reach.priors_ = array("reach_priors", k).astype(np.float64)
    reach.reach_ = array("reach_distances", k).astype(np.float64)
    reach.typical_ = array("reach_typical", k).astype(np.float64)
    reach.patient_means_ = None  # files of formats 7-12
    if "reach_patient_means" in arrays:
        means = array("reach_patient_means", None, k, d)
        if len(means) < 1:
            raise ModelFileError(path, "model file is inconsistent: array 'reach_patient_means' holds no patient")
        reach.patient_means_ = means.astype(np.float64)
    if not (np.all(reach.priors_ > 0) and abs(reach.priors_.sum() - 1) < 1e-6):
        raise ModelFileError(path, "model file is inconsistent: array 'reach_priors' is not a distribution")
    for name, values in (("reach_distances", reach.reach_), ("reach_typical", reach.typical_)):
        if not np.all(values > 0):
            raise ModelFileError(path, f"model file is inconsistent: array {name!r} must be positive")
    return reach


def _adaptive_populations(path, fields, array, arrays, populations, d: int):
    """The populations adapted to each gated patient (GatingModel.adaptive_weight), their
    weight, where their EM starts and whether they include the own-shape fit: (AdaptiveLDA,
    weight, start, shapes), or (None, 0.0, "training", False) for a model without them."""
    if fields is None:
        if any(name.startswith("adaptive_") for name in arrays):
            raise ModelFileError(path, "model file is inconsistent: adaptive arrays in a model without them")
        return None, 0.0, "training", False
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
    start = fields.string("start", choices=ADAPTIVE_STARTS, optional=True) or "training"  # format 8
    shapes = bool(fields.boolean("shapes", optional=True))  # format 9
    return lda, fields.number("weight", within=(0.0, 1.0)), start, shapes


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
