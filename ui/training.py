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
    """Leave-one-group-out (when there are groups) and leave-one-patient-out in the background;
    the table is stored in the library (``save_check_result``) and returned."""
    library = store.library
    samples, labels = list(samples), list(labels)

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
            library.save_check_result({"patients": [s.name for s in samples], "table": table.to_dict("records")})
        return table

    return start_job("check", f"Check on {len(samples)} patients", store.library_path, work)
