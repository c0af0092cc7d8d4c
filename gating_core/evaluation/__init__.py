"""Measuring the model against the baselines on held-out patients and groups.

``protocols`` (leave one group / patient out, train on one group, patient folds, beside pooling,
pooled logistic and LDA; repeated over model seeds and summarised across them), ``baselines``
(the pooled baselines on the model's own cells: LDA / QDA / trees, DICA then pooling) and
``held_out`` (the check by subtraction: every fold's selection and fit from the statistics of all
patients minus the held-out ones).

The public names of ``protocols`` stay importable from the package, as when ``evaluation`` was
one module (``from gating_core.evaluation import leave_one_group_out, summarize``); they are
loaded on first use, so importing ``gating_core.evaluation.held_out`` alone does not import the
protocols.
"""

from __future__ import annotations

# what gating_core.evaluation.protocols defines (loaded on first access, PEP 562)
_PROTOCOL_NAMES = (
    "METHODS", "ALL_METHODS", "PREDICTOR_METHODS", "METHOD_SETTINGS", "REFITS",
    "infer_patient_groups", "patient_scores", "leave_one_patient_out", "leave_one_group_out", "train_on_one_group",
    "patient_folds", "held_out_evaluation", "group_held_out_sets", "one_group_held_out_sets", "patient_fold_sets",
    "summarize", "summarize_seeds", "repeat_over_seeds", "novelty_curve",
)

__all__ = list(_PROTOCOL_NAMES)


def __getattr__(name: str):
    if name not in _PROTOCOL_NAMES:
        raise AttributeError(f"module 'gating_core.evaluation' has no attribute {name!r}")
    from gating_core.evaluation import protocols

    value = getattr(protocols, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PROTOCOL_NAMES))
