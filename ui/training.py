"""Training and the held-out check as background jobs (see :mod:`ui.jobs`).

The work functions get plain data (samples, labels, settings) and the library object, never
the browser session: the session may be gone by the time they finish. What they produce goes
to the library -- the model file with its training patients, the check's table -- and a session
takes it up from there (:meth:`ui.store.Store.adopt_model`, ``Store.evaluation``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ui.jobs import Job, start_job


#: The Train page's choices (gating_core.model.METHODS, gating_core.classifier.LOSSES).
METHOD_LABELS = {"marginal": "Marginal transfer (recommended)", "pooling": "Pooling",
                 "multitask": "Multitask (baseline)"}
LOSS_LABELS = {"squared": "Squared (kernel ridge; default)", "logistic": "Logistic (multinomial)",
               "hinge": "Hinge (cost-sensitive SVM)"}


def method_params(method: str, loss: str, task_similarity: float) -> dict:
    """GatingModel parameters of the Train page's method, loss and tau choices (tau only
    matters to the multitask method, so it is passed only then)."""
    if method not in METHOD_LABELS:
        raise ValueError(f"method must be one of {tuple(METHOD_LABELS)}, got {method!r}")
    if loss not in LOSS_LABELS:
        raise ValueError(f"loss must be one of {tuple(LOSS_LABELS)}, got {loss!r}")
    params = {"loss": loss}
    if method == "multitask":
        if not 0.0 < float(task_similarity) <= 1.0:
            raise ValueError(f"task similarity must be within (0, 1], got {task_similarity!r}")
        params["task_similarity"] = float(task_similarity)
    return params


def method_label(method: str, loss: str = "squared", task_similarity=None) -> str:
    """``marginal``, ``marginal, hinge loss``, ``multitask tau=0.01``: a model's kind in a word or three."""
    label = f"multitask tau={task_similarity:g}" if method == "multitask" and task_similarity else method
    return label if loss == "squared" else f"{label}, {loss} loss"


def model_kind(model) -> str:
    """:func:`method_label` of a fitted GatingModel (what the Models list says of it)."""
    return method_label(model.method, model.loss, model.task_similarity if model.method == "multitask" else None)


def start_training(store, *, name: str, method: str, channels, params: dict, samples, labels, groups,
                   training_patients) -> Job:
    """Fit a GatingModel in the background; the job stores it in the library when done and
    returns ``{"model", "model_id", "name", "n_cells"}``."""
    library, work_dir = store.library, Path(store.work_dir)
    samples, labels, training_patients = list(samples), list(labels), list(training_patients)

    def work(report):
        from gating_core.model import GatingModel

        model = GatingModel(method=method, channels=channels or None, **params)
        model.fit(samples, labels, progress=report, groups=groups)
        report("Storing the model in the library", 0.99)  # the last moment a cancel stops it
        model_id = None
        if library is not None:
            path = work_dir / f"model-{uuid.uuid4().hex}.npz"
            try:
                model.save(path)
                model_id = library.add_model(path, name, training_patients, None, method)
            finally:
                path.unlink(missing_ok=True)
        return {"model": model, "model_id": model_id, "name": name,
                "n_cells": int(sum(s.n_events for s in samples))}

    return start_job("train", f"Training {name}", store.library_path, work)


def start_check(store, *, samples, labels, groups, model_params: dict, methods=("marginal", "pooling", "lda")) -> Job:
    """Leave-one-group-out (when there are groups; full refits) and leave-one-patient-out (by
    subtraction: about the cost of one training) in the background. The table is stored in the
    library (``save_check_result``) with what it was run on (:func:`check_setup`) and returned."""
    library = store.library
    samples, labels = list(samples), list(labels)
    setup = check_setup(samples, labels, model_params)

    def work(report):
        import pandas as pd

        from gating_core.evaluation import infer_patient_groups, leave_one_group_out, leave_one_patient_out

        found = groups or infer_patient_groups(samples, labels)
        tables = []
        if 1 < len(set(found)) < len(samples):
            tables.append(leave_one_group_out(samples, labels, found, methods=methods, model_params=model_params,
                                              progress=lambda s, f: report(f"held-out group, {s}", f / 2)))
        tables.append(leave_one_patient_out(samples, labels, methods=methods, model_params=model_params,
                                            groups=found,
                                            progress=lambda s, f: report(s, (1 + f) / 2 if tables else f)))
        table = pd.concat(tables, ignore_index=True)
        report("Storing the table in the library", 0.99)
        if library is not None:
            library.save_check_result({"patients": [s.name for s in samples], "table": table.to_dict("records"),
                                       "setup": setup})
        return table

    return start_job("check", f"Check on {len(samples)} patients", store.library_path, work)


def check_setup(samples, labels, model_params: dict) -> dict:
    """What a check is run on, JSON-able: the patients, the populations learned and every model
    setting (GatingModel's parameters but the method: the check runs each method itself)."""
    import json

    import numpy as np

    from gating_core.model import GatingModel

    params = GatingModel(**model_params).get_params()
    params.pop("method", None)
    return {"patients": [s.name for s in samples],
            "populations": sorted({str(p) for y in labels for p in np.unique(np.asarray(y).astype(str))}),
            "params": json.loads(json.dumps(params, default=str))}


def check_matches_model(record: dict | None, model) -> bool | None:
    """Whether a stored check was run on ``model``'s training patients, populations and
    settings; None when the record says nothing about it (a check stored before setups were)."""
    import json

    if not record or "setup" not in record:
        return None
    params = model.get_params()
    params.pop("method", None)
    setup = record["setup"]
    return (setup.get("patients") == list(model.training_patients_)
            and setup.get("populations") == sorted(str(p) for p in model.populations_)
            and setup.get("params") == json.loads(json.dumps(params, default=str)))
