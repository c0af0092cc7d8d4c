"""Leave-one-patient-out evaluation beside the baselines (design.md section 3).

Every method is measured in the same run on the same split: marginal transfer, pooling (the
same estimator without the embedding) and linear discriminant analysis on the transformed
channels (Abdelaal et al., Cytometry A 2019: the strongest simple published baseline for
transferring cell types between cytometry samples). Reported per patient: accuracy, F1 per
population and macro-F1; then the mean and the worst patient of each method.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.metrics import f1_score

from gating_core.model import GatingModel, digest_patient

METHODS = ("marginal", "pooling", "lda")


class LDABaseline:
    """LDA on the transformed, standardised channels, trained on all patients' cells pooled.

    Each training patient contributes the same seeded draw of cells as in GatingModel (a
    :class:`~gating_core.model.PatientDigest`); channels and transform are chosen the same way.
    """

    def __init__(self, cells_per_patient=4000, compensate=True, random_state=0):
        self.cells_per_patient = cells_per_patient
        self.compensate = compensate
        self.random_state = random_state

    def fit(self, samples, labels):
        self.preprocessing_ = GatingModel(compensate=self.compensate, cells_per_patient=self.cells_per_patient,
                                          random_state=self.random_state)
        digests = [digest_patient(s, y, self.cells_per_patient, self.preprocessing_.embedding_cells,
                                  seed=self.preprocessing_.digest_seed(i), compensate=self.compensate)
                   for i, (s, y) in enumerate(zip(samples, labels))]
        cells, _, drawn_labels = self.preprocessing_.prepare_digests(digests)
        self.lda_ = LinearDiscriminantAnalysis().fit(np.vstack(cells), np.concatenate(drawn_labels))
        self.populations_ = [str(c) for c in self.lda_.classes_]
        return self

    def predict(self, sample) -> np.ndarray:
        return self.lda_.predict(self.preprocessing_.standardised_cells(sample))


def patient_scores(truth, predicted, populations) -> dict:
    """Accuracy, macro-F1 and F1 of each population for one patient."""
    truth = np.asarray(truth).astype(str)
    predicted = np.asarray(predicted).astype(str)
    present = sorted(set(truth.tolist()))
    row = {"accuracy": float(np.mean(truth == predicted)),
           "macro_f1": float(f1_score(truth, predicted, labels=present, average="macro", zero_division=0))}
    per_population = f1_score(truth, predicted, labels=list(populations), average=None, zero_division=0)
    for name, value in zip(populations, per_population):
        row[f"f1:{name}"] = float(value) if name in present else np.nan
    return row


def leave_one_patient_out(samples, labels, methods=METHODS, model_params=None, progress=None) -> pd.DataFrame:
    """Train on all patients but one, gate that one; for every patient and method.

    Parameters
    ----------
    samples : list of Sample;  labels : list of ndarray (n_i,)
    methods : iterable of "marginal", "pooling", "lda"
    model_params : dict or None, extra GatingModel parameters (for both kernel methods)
    progress : callable(stage: str, fraction: float) or None

    Returns
    -------
    DataFrame with one row per (patient, method): patient, method, accuracy, macro_f1, and
    ``f1:<population>`` columns (NaN where the patient has no such cells).
    """
    if len(samples) < 3:
        raise ValueError("leave-one-patient-out needs at least three labeled patients")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    labels = [np.asarray(y).astype(str) for y in labels]
    populations = sorted(set(np.concatenate(labels).tolist()))
    rows = []
    steps = len(samples) * len(methods)
    done = 0
    for held_out, (sample, truth) in enumerate(zip(samples, labels)):
        train_samples = [s for i, s in enumerate(samples) if i != held_out]
        train_labels = [y for i, y in enumerate(labels) if i != held_out]
        for method in methods:
            if progress is not None:
                progress(f"{method}: testing on {sample.name}", done / steps)
            if method == "lda":
                predicted = LDABaseline().fit(train_samples, train_labels).predict(sample)
                novelty = np.nan
            else:
                model = GatingModel(method=method, **(model_params or {})).fit(train_samples, train_labels)
                result = model.gate(sample)
                predicted, novelty = result.populations, result.novelty.score
            rows.append({"patient": sample.name, "method": method, **patient_scores(truth, predicted, populations),
                         "novelty": novelty})
            done += 1
    if progress is not None:
        progress("done", 1.0)
    return pd.DataFrame(rows)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean and worst-patient accuracy and macro-F1, and which patient was worst."""
    out = []
    for method, group in table.groupby("method", sort=False):
        worst = group.loc[group["accuracy"].idxmin()]
        out.append({"method": method, "mean_accuracy": group["accuracy"].mean(),
                    "worst_accuracy": group["accuracy"].min(), "worst_patient": worst["patient"],
                    "mean_macro_f1": group["macro_f1"].mean(), "worst_macro_f1": group["macro_f1"].min()})
    return pd.DataFrame(out)
