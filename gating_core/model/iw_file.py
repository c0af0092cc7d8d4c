"""The :class:`~gating_core.model.iw_model.IWNystroemGatingModel` file: plain arrays and a JSON
description in an ``.npz``, written atomically and read with the same checks as a GatingModel
file (no pickle, declared sizes and every field checked; a problem is a
:class:`~gating_core.model.file_checks.ModelFileError`).

Its format tag, written into every file, is ``gating_core.iw_model`` (a name, not a module path).
Below :mod:`gating_core.model.iw_model`, whose ``save`` / ``load`` call it: it is given the
model, or the class to build, and never imports it. :func:`model_file_format` reads which
format a file holds.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np

from gating_core import __version__
from gating_core.method.features import MeanEmbedding
from gating_core.model.file_checks import Member, ModelFileError, archive_array, read_archive
from gating_core.model.file_fields import Fields, parse_json, read_description

IW_FORMAT = "gating_core.iw_model"
# 2: the transforms a user set for some channels (params.transform: channel -> text, read back as
#    given; files of format 1 read back "auto").
IW_FORMAT_VERSION = 2
#: Frequencies of the kernel mean embedding the novelty score is computed from.
NOVELTY_FEATURES = 64
#: The most training cells a file may hold (the refit is O(n m^2) per patient).
MAX_TRAINING_CELLS = 2_000_000

IW_MEMBERS = {
    "meta": Member("U", 0, itemsizes=None, finite=False),
    "center": Member("f", 1),
    "scale": Member("f", 1),
    "cells": Member("f", 2),
    "labels": Member("i", 1, itemsizes=(1, 2, 4, 8)),
    "train_embeddings": Member("f", 2),
    "embedding_frequencies": Member("f", 2),
}


def save_iw_model(model, path) -> None:
    """Write ``model`` (fitted) as .npz (arrays + JSON; no pickle), atomically."""
    from gating_core.model.file import _param_value  # the transform a user set, as GatingModel files keep it

    params = {k: (v if isinstance(v, (str, int, float, bool, list, type(None))) else _param_value(v))
              for k, v in model.get_params().items()}
    meta = {"format": IW_FORMAT, "format_version": IW_FORMAT_VERSION, "gating_core_version": __version__,
            "numpy_version": np.__version__, "python_version": platform.python_version(),
            "params": params, "channels": model.channels_, "channel_markers": model.channel_markers_,
            "transform": model.transform_.to_dict(), "populations": model.populations_,
            "training_patients": model.training_patients_, "bandwidth": model.bandwidth_,
            "novelty": {"reference": model.novelty_reference_, "threshold": model.novelty_threshold_}}
    arrays = {"meta": np.array(json.dumps(meta)), "center": model.center_, "scale": model.scale_,
              "cells": model.cells_, "labels": model.labels_, "train_embeddings": model.train_embeddings_,
              "embedding_frequencies": model.embedder_.frequencies_}
    path = Path(path)
    from gating_core.model.file import _write_atomically

    _write_atomically(path, arrays)


def load_iw_model(cls, path):
    """Read a file written by :func:`save_iw_model` into a new ``cls``; anything else is a
    ModelFileError."""
    path = Path(path)
    arrays = read_archive(path, IW_MEMBERS)
    meta = read_description(path, arrays, IW_FORMAT, IW_FORMAT_VERSION, f"not an {cls.method} model file")
    try:
        return _from_parts(cls, path, Fields(path, meta, "model"), arrays)
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelFileError(path, f"model file is incomplete or inconsistent ({exc})") from None


def _from_parts(cls, path, top: Fields, arrays):
    from gating_core.model.file import _transform  # the transform's checks, shared with GatingModel files
    from gating_core.model.file_params import _transform_param

    params = top.object("params")
    known = set(cls().get_params())
    unknown = sorted(set(params.data) - known)
    if unknown:
        raise ModelFileError(path, f"model description: unknown model parameter {unknown[0]!r}"[:300])
    model = cls(channels=params.strings("channels", nullable=True, optional=True),
                transform=_transform_param(path, params, "transform") if params.has("transform") else "auto",
                compensate=bool(params.boolean("compensate")),
                cells_per_patient=params.integer("cells_per_patient", minimum=1, maximum=10 ** 9),
                embedding_cells=params.integer("embedding_cells", minimum=1, maximum=10 ** 9),
                n_landmarks=params.integer("n_landmarks", minimum=1, maximum=100_000),
                alpha=params.number("alpha", positive=True),
                bandwidth=params.number("bandwidth", positive=True, nullable=True),
                max_weight=params.number("max_weight", positive=True),
                random_state=params.integer("random_state", minimum=0, maximum=2 ** 63, nullable=True))
    model.channels_ = top.strings("channels", min_length=1, unique=True)
    d = len(model.channels_)
    model.channel_markers_ = top.strings("channel_markers")
    if len(model.channel_markers_) != d:
        raise ModelFileError(path, f"model description: {d} channels but {len(model.channel_markers_)} markers")
    model.transform_ = _transform(path, top.object("transform"), d)
    model.populations_ = top.strings("populations", min_length=2, unique=True)
    model.training_patients_ = top.strings("training_patients", min_length=1)
    model.bandwidth_ = top.number("bandwidth", positive=True)
    novelty = top.object("novelty")
    model.novelty_reference_ = novelty.number("reference", positive=True)
    model.novelty_threshold_ = novelty.number("threshold", positive=True, allow_inf=True)

    def array(name, *shape):
        return archive_array(path, arrays, name, *shape)

    model.center_ = array("center", d).astype(np.float32)
    model.scale_ = array("scale", d).astype(np.float32)
    if not np.all(model.scale_ != 0):
        raise ModelFileError(path, "model file is inconsistent: array 'scale' holds zeros")
    model.cells_ = array("cells", None, d).astype(np.float32)
    n = len(model.cells_)
    if not 2 <= n <= MAX_TRAINING_CELLS:
        raise ModelFileError(path, f"model file is inconsistent: {n} training cells (2 to {MAX_TRAINING_CELLS:,})")
    labels = array("labels", n)
    k = len(model.populations_)
    if labels.min() < 0 or labels.max() >= k:
        raise ModelFileError(path, f"model file is inconsistent: labels outside the {k} populations")
    model.labels_ = labels.astype(np.int16)
    n_patients = len(model.training_patients_)
    frequencies = array("embedding_frequencies", d, NOVELTY_FEATURES).astype(np.float64)
    model.train_embeddings_ = array("train_embeddings", n_patients, 2 * NOVELTY_FEATURES).astype(np.float64)
    embedder = MeanEmbedding.__new__(MeanEmbedding)
    embedder.n_features, embedder.bandwidth, embedder.frequencies_ = NOVELTY_FEATURES, model.bandwidth_, frequencies
    model.embedder_ = embedder
    model.last_fit_seconds_ = None
    return model


def model_file_format(path) -> str:
    """The format tag of a model file (``gating_core.model`` or ``gating_core.iw_model``),
    reading its description only; a ModelFileError when it has none."""
    path = Path(path)
    from gating_core.model.file_checks import MODEL_MEMBERS

    # Any member of either format may be there (the loader then checks its own); only the
    # description is read.
    arrays = read_archive(path, {**MODEL_MEMBERS, **IW_MEMBERS}, only=("meta",))
    if "meta" not in arrays:
        raise ModelFileError(path, "not a gating model file (no model description inside)")
    return str(parse_json(path, str(arrays["meta"])).get("format"))
