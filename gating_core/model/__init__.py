"""The product's estimator, :class:`GatingModel`, and its file.

``estimator`` (:class:`~gating_core.model.estimator.GatingModel`: parameters, fit with selection
and the pooled companion, novelty, gating in memory), ``research``
(:class:`~gating_core.model.research.ResearchGatingModel`, the options its default leaves out,
and ``load_gating_model``), ``preprocessing`` (its channels, compensation, transform and
standardisation), ``streaming`` (its gating of a file in chunks), ``digest`` (a labeled patient
reduced to training rows), ``result`` (``GateResult``, ``Novelty``), ``file`` (the model file:
``.npz`` + JSON, written, and read with its classifier), ``file_parts`` (the model's other fitted
parts read back), ``file_params`` (its hyperparameters and transform checked), ``file_checks``
(reading its archive within memory bounds, without trusting it) and ``file_fields`` (its JSON
description, field by field), and ``iw_model`` (``IWNystroemGatingModel``, refitted per gated
patient) with its own file, ``iw_file``.

``from gating_core.model import GatingModel`` (and the module-level settings that were importable
from ``gating_core.model`` when it was one module: ``METHODS``, ``DEFAULT_POOLED_WEIGHT``, ...)
keeps working: those names are loaded from ``estimator`` on first use, so importing a module of
this package (``gating_core.model.file_checks``, say) does not import the estimator.
"""

from __future__ import annotations

# name -> what gating_core.model.estimator defines (loaded on first access, PEP 562)
_ESTIMATOR_NAMES = (
    "GatingModel", "METHODS", "DEFAULT_LOSS", "DEFAULT_AUGMENT", "DEFAULT_POOLED_WEIGHT", "DEFAULT_CLASS_BALANCE",
    "DEFAULT_BANDWIDTH_X_HEDGE", "POOLED_ALPHA", "SELECTION_MAX_PATIENTS", "ADAPTIVE_WEIGHTS",
    "DEFAULT_ADAPTIVE_WEIGHT", "FALLBACK_ADAPTIVE_WEIGHT", "ADAPTIVE_WEIGHT_TOLERANCE", "EVEN_ADAPTIVE_WEIGHT",
    "EVEN_WEIGHT_MARGIN", "UNKNOWN",
)

__all__ = list(_ESTIMATOR_NAMES)


def __getattr__(name: str):
    if name not in _ESTIMATOR_NAMES:
        raise AttributeError(f"module 'gating_core.model' has no attribute {name!r}")
    from gating_core.model import estimator

    value = getattr(estimator, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ESTIMATOR_NAMES))
