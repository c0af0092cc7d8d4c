"""The model description's settings, checked on reading: the hyperparameters (which class to
build, with which parameters, each value one its constructor accepts) and the channel transform.
"""

from __future__ import annotations

import inspect

from gating_core.fcs.transforms import ChannelTransform
from gating_core.method.alignment import ALIGNMENTS
from gating_core.method.classifier import LOSSES, PATIENT_WEIGHTINGS, SOLVERS
from gating_core.method.dica import DICA_MODES, MODEL_DICA_FEATURES
from gating_core.method.features import KERNELS_X
from gating_core.method.priors import PRIOR_SHIFTS
from gating_core.model.file_checks import ModelFileError
from gating_core.model.file_fields import Fields, check_scalar


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
        elif key == "unknown_margin":
            out[key] = fields.number(key, positive=True, within=(0.0, 1e6), nullable=True)
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
            out[key] = _transform_param(path, fields, key)
        else:
            check_scalar(path, f"{fields.where}.{key}", value)
            out[key] = value
    return out


def _transform_param(path, fields: Fields, key: str):
    """The ``transform`` parameter: "auto", or the channels whose transform the user set, each
    with its text (:func:`~gating_core.fcs.transforms.parse_transform_spec`), as trained. A
    ChannelTransform object given whole is stored as "custom" and read back as "auto": the fitted
    transform (``meta["transform"]``) is what gates either way."""
    from gating_core.fcs.transforms import parse_transform_spec

    value = fields.raw(key)
    if not isinstance(value, dict):
        fields.string(key, choices=("auto", "custom"))
        return "auto"
    if len(value) > 10_000:
        raise ModelFileError(path, "model description: params.transform names more than 10,000 channels")
    for channel, spec in value.items():
        try:
            if not isinstance(spec, str) or not channel:
                raise ValueError("expected a channel name and a transform text")
            parse_transform_spec(spec)
        except ValueError as exc:
            raise ModelFileError(path, f"model description: params.transform[{channel!r}]: {exc}"[:300]) from None
    return {str(channel): spec for channel, spec in value.items()}


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
