"""Training and the held-out check as background jobs (see :mod:`ui.jobs`).

The work functions get plain data (samples, labels, settings) and the library object, never
the browser session: the session may be gone by the time they finish. What they produce goes
to the library -- the model file with its training patients, the check's table -- and the
session that started the job takes it up from there (:meth:`ui.store.Store.adopt_model`,
``Store.evaluation``); other sessions are offered the model (:meth:`ui.store.Store.offer_model`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ui.jobs import Job, start_job


#: The Train page's choices (gating_core.model.estimator.METHODS, gating_core.method.classifier.LOSSES).
METHOD_LABELS = {"marginal": "Marginal transfer (recommended)", "pooling": "Pooling",
                 "multitask": "Multitask (baseline)",
                 "iw-nystroem": "Importance-weighted Nystroem (refitted per patient)"}
LOSS_LABELS = {"squared": "Squared (kernel ridge; default)", "logistic": "Logistic (multinomial)",
               "hinge": "Hinge (cost-sensitive SVM)"}
#: DICA choices of the kernel methods (GatingModel's ``dica``; "none": no projection).
DICA_LABELS = {"none": "None (the channels as they are)", "supervised": "DICA (supervised: uses the labels)",
               "unsupervised": "UDICA (unsupervised)"}
DEFAULT_DICA_COMPONENTS = 20
#: The cell kernels k_X / k'_X of the kernel methods (GatingModel's ``kernel_x``).
KERNEL_LABELS = {"gaussian": "Gaussian (default)", "linear": "Linear (JMLR flow experiment: Psi the mean cell)"}
#: The importance-weighted Nystroem model (gating_core.model.iw_model): a sibling of GatingModel that
#: keeps training cells and refits for each new patient, with the command line's defaults
#: (``train --method iw-nystroem``: 2,000 cells per patient, 300 landmarks).
IW_METHOD = "iw-nystroem"
IW_DEFAULTS = {"cells_per_patient": 2000, "n_landmarks": 300}


def is_transductive(model) -> bool:
    """Whether ``model`` refits for each patient it gates (the importance-weighted Nystroem model)."""
    return getattr(model, "method", None) == IW_METHOD


def refit_caption(seconds: dict) -> str:
    """What the Auto-gate page says of an importance-weighted Nystroem model's per-patient refit:
    ``seconds`` maps patient names to the refit's seconds (``last_fit_seconds_``)."""
    head = ("This model refits for each patient it gates (importance-weighted Nystroem KRR: weights "
            "p_patient/p_train from the patient's own cells, then a weighted fit on the training cells it keeps)")
    if not seconds:
        return head + ": the refit's cost per patient is shown here once patients are gated."
    each = ", ".join(f"{name} {s:.1f} s" for name, s in seconds.items() if s is not None)
    return f"{head}. Refit per patient: {each}."


def model_class(method: str):
    """The estimator class the Train page's ``method`` trains (imported when asked for)."""
    if method == IW_METHOD:
        from gating_core.model.iw_model import IWNystroemGatingModel

        return IWNystroemGatingModel
    from gating_core.model import GatingModel

    return GatingModel


def method_params(method: str, loss: str, task_similarity: float, dica: str = "none",
                  dica_components: int = DEFAULT_DICA_COMPONENTS, kernel_x: str = "gaussian") -> dict:
    """Model parameters of the Train page's method, loss, tau, DICA and cell-kernel choices
    (tau only matters to the multitask method, so it is passed only then; DICA and the linear
    kernel only when chosen). The importance-weighted Nystroem model has none of these (a
    squared-loss KRR on the channels): its parameters are :data:`IW_DEFAULTS`, and loss, DICA
    or kernel choices other than the defaults are refused rather than dropped."""
    if method not in METHOD_LABELS:
        raise ValueError(f"method must be one of {tuple(METHOD_LABELS)}, got {method!r}")
    if loss not in LOSS_LABELS:
        raise ValueError(f"loss must be one of {tuple(LOSS_LABELS)}, got {loss!r}")
    if dica not in DICA_LABELS:
        raise ValueError(f"DICA must be one of {tuple(DICA_LABELS)}, got {dica!r}")
    if kernel_x not in KERNEL_LABELS:
        raise ValueError(f"the cell kernel must be one of {tuple(KERNEL_LABELS)}, got {kernel_x!r}")
    if method == IW_METHOD:
        if loss != "squared" or dica != "none" or kernel_x != "gaussian":
            raise ValueError("the importance-weighted Nystroem model is a squared-loss KRR on the channels: "
                             "no other loss, no DICA, its own kernel")
        return dict(IW_DEFAULTS)
    params = {"loss": loss}
    if method == "multitask":
        if not 0.0 < float(task_similarity) <= 1.0:
            raise ValueError(f"task similarity must be within (0, 1], got {task_similarity!r}")
        params["task_similarity"] = float(task_similarity)
    if dica != "none":
        from gating_core.method.dica import check_dica_settings

        check_dica_settings(dica, int(dica_components))
        params.update(dica=dica, dica_components=int(dica_components))
    if kernel_x != "gaussian":
        params["kernel_x"] = kernel_x
    return params


def method_label(method: str, loss: str = "squared", task_similarity=None, dica=None, dica_components=None,
                 kernel_x="gaussian") -> str:
    """``marginal``, ``marginal, hinge loss``, ``multitask tau=0.01``, ``pooling, DICA (20)``,
    ``marginal, linear kernel``, ``iw-nystroem (refitted per patient)``: a model's kind in a
    word or three."""
    if method == IW_METHOD:
        return f"{IW_METHOD} (refitted per patient)"
    label = f"multitask tau={task_similarity:g}" if method == "multitask" and task_similarity else method
    if loss != "squared":
        label = f"{label}, {loss} loss"
    if dica in ("supervised", "unsupervised"):
        name = "DICA" if dica == "supervised" else "UDICA"
        label = f"{label}, {name}" + (f" ({dica_components})" if dica_components else "")
    if kernel_x == "linear":
        label = f"{label}, linear kernel"
    return label


def model_kind(model) -> str:
    """:func:`method_label` of a fitted model (what the Models list says of it)."""
    if is_transductive(model):
        return (f"importance-weighted Nystroem KRR, refitted for each patient it gates "
                f"({model.n_landmarks} landmarks, {len(model.cells_):,} training cells kept)")
    return method_label(model.method, model.loss, model.task_similarity if model.method == "multitask" else None,
                        getattr(model, "dica", None), getattr(model, "dica_components", None),
                        getattr(model, "kernel_x", "gaussian"))


def training_settings(method_text: str, patients, populations, channels, hand: dict | None = None) -> str:
    """What a training was asked for, in a line others can read: method, patients, populations,
    channels and the hyperparameters set by hand."""
    patients, populations = [str(p) for p in patients], [str(p) for p in populations]
    named = ", ".join(patients[:4]) + (f" and {len(patients) - 4} more" if len(patients) > 4 else "")
    line = (f"{method_text}; {len(patients)} patients ({named}); populations: {', '.join(populations) or 'none'}; "
            f"{len(list(channels or [])) or 'all shared'} channels")
    if hand:
        line += "; set by hand: " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in sorted(hand.items()))
    return line


def start_training(store, *, name: str, method: str, channels, params: dict, samples, labels, groups,
                   training_patients, settings: str = "") -> Job:
    """Fit a GatingModel (or, ``method="iw-nystroem"``, an IWNystroemGatingModel) in the
    background, as the session ``store`` (its id and name go with the job); the job stores it
    in the library when done and returns ``{"model", "model_id", "name", "n_cells"}``, where
    ``model`` is None once the library holds it (sessions read it from there, so a finished
    job keeps no model in memory). Started while another training runs, it waits for it."""
    library, work_dir = store.library, Path(store.work_dir)
    samples, labels, training_patients = list(samples), list(labels), list(training_patients)

    def work(report):
        if method == IW_METHOD:
            model = model_class(method)(channels=channels or None, **params)
        else:  # the product's GatingModel, or a ResearchGatingModel for another method, loss, DICA ...
            from gating_core.model.research import build_model

            model = build_model({"method": method, "channels": channels or None, **params})
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
        return {"model": None if model_id else model, "model_id": model_id, "name": name,
                "n_cells": int(sum(s.n_events for s in samples))}

    return start_job("train", f"Training {name}", store.library_path, work, owner=store.session_id,
                     owner_name=store.session_name, settings=settings or name)


#: Each method's share of the check's time, measured on the sample data (8 patients, one
#: leave-one-patient-out check on 2 CPUs: marginal 14.6 s, pooling 7.7 s, LDA 1.7 s of 24 s).
#: The methods report their progress each as an equal part; re-weighted by these shares, the
#: fraction done grows about as time does, which is what the time estimate assumes.
CHECK_METHOD_COST = {"marginal": 0.61, "pooling": 0.32, "lda": 0.07}


def check_progress(report, methods, low: float = 0.0, high: float = 1.0, prefix: str = ""):
    """A progress callback for one held-out run over ``methods`` (its stages named
    ``"<method>: ..."``, each method an equal part of its fraction) that reports to ``report``
    between ``low`` and ``high``, each method weighted by :data:`CHECK_METHOD_COST`."""
    methods = list(methods)
    weights = [CHECK_METHOD_COST.get(m, 0.3) for m in methods]
    total = sum(weights)
    starts = [sum(weights[:k]) / total for k in range(len(methods))]

    def say(stage, fraction):
        name = str(stage).split(":", 1)[0]
        if name in methods:
            m = methods.index(name)
            within = min(max(float(fraction) * len(methods) - m, 0.0), 1.0)
            fraction = starts[m] + weights[m] / total * within
        report(prefix + str(stage), low + (high - low) * float(fraction))

    return say


def start_check(store, *, samples, labels, groups, model_params: dict, methods=("marginal", "pooling", "lda"),
                settings: str = "") -> Job:
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
        n_groups = len(set(found))
        # A fold of the group check is a whole training; the patient check costs about one.
        split = n_groups / (n_groups + 1) if 1 < n_groups < len(samples) else 0.0
        if split:
            tables.append(leave_one_group_out(samples, labels, found, methods=methods, model_params=model_params,
                                              progress=check_progress(report, methods, 0.0, split,
                                                                      "held-out group, ")))
        tables.append(leave_one_patient_out(samples, labels, methods=methods, model_params=model_params,
                                            groups=found, progress=check_progress(report, methods, split, 1.0)))
        table = pd.concat(tables, ignore_index=True)
        report("Storing the table in the library", 0.99)
        if library is not None:
            library.save_check_result({"patients": [s.name for s in samples], "table": table.to_dict("records"),
                                       "setup": setup})
        return table

    return start_job("check", f"Check on {len(samples)} patients", store.library_path, work,
                     owner=store.session_id, owner_name=store.session_name,
                     settings=settings or f"{len(samples)} patients")


def check_setup(samples, labels, model_params: dict) -> dict:
    """What a check is run on, JSON-able: the patients, the populations learned and every model
    setting (GatingModel's parameters but the method: the check runs each method itself)."""
    import json

    import numpy as np

    from gating_core.model.research import build_model

    params = build_model(dict(model_params)).get_params()
    params.pop("method", None)
    return {"patients": [s.name for s in samples],
            "populations": sorted({str(p) for y in labels for p in np.unique(np.asarray(y).astype(str))}),
            "params": json.loads(json.dumps(params, default=str))}


def check_differences(record: dict, model) -> list[str]:
    """What differs between a stored check's setup and ``model``'s training, in words (empty
    when they agree or the record says nothing)."""
    import json

    setup = (record or {}).get("setup") or {}
    if not setup:
        return []
    out = []
    checked, trained = list(setup.get("patients") or []), list(model.training_patients_)
    if checked != trained:
        extra = [p for p in checked if p not in trained]
        missing = [p for p in trained if p not in checked]

        def names(items):
            return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")

        detail = "; ".join(([f"the check also held {names(extra)}"] if extra else [])
                           + ([f"the model also learned from {names(missing)}"] if missing else []))
        out.append(f"the check held {len(checked)} patients, the model learned from {len(trained)}"
                   + (f" ({detail})" if detail else " (in another order)"))
    if setup.get("populations") != sorted(str(p) for p in model.populations_):
        out.append("other populations")
    params = model.get_params()
    params.pop("method", None)
    if setup.get("params") != json.loads(json.dumps(params, default=str)):
        out.append("other settings")
    return out


def check_matches_model(record: dict | None, model) -> bool | None:
    """Whether a stored check was run on ``model``'s training patients, populations and
    settings; None when the record says nothing about it (a check stored before setups were)."""
    import json

    if not record or "setup" not in record:
        return None
    if is_transductive(model):
        return False  # the check runs the kernel methods and LDA; it never measured this model
    params = model.get_params()
    params.pop("method", None)
    setup = record["setup"]
    return (setup.get("patients") == list(model.training_patients_)
            and setup.get("populations") == sorted(str(p) for p in model.populations_)
            and setup.get("params") == json.loads(json.dumps(params, default=str)))
