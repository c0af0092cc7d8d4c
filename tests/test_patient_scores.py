"""The per-patient scores of ``evaluate``: the same figures scikit-learn's metrics give."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score

from gating_core.evaluation import patient_scores

POPULATIONS = ["B cells", "CD4 T cells", "Monocytes", "NK cells", "ungated"]


def test_scores_are_sklearns_f1_to_the_last_bit():
    rng = np.random.default_rng(7)
    truth = rng.choice(["B cells", "CD4 T cells", "Monocytes", "ungated"], size=5000, p=[0.1, 0.3, 0.2, 0.4])
    predicted = truth.copy()
    flipped = rng.random(5000) < 0.15
    # Errors into every population, one that is never true (a false population) among them.
    predicted[flipped] = rng.choice(["B cells", "CD4 T cells", "Monocytes", "ungated", "NK cells"], size=flipped.sum())
    row = patient_scores(truth, predicted, POPULATIONS)
    present = sorted(set(truth.tolist()))
    assert row["accuracy"] == float(np.mean(truth == predicted))
    assert row["macro_f1"] == float(f1_score(truth, predicted, labels=present, average="macro", zero_division=0))
    expected = f1_score(truth, predicted, labels=POPULATIONS, average=None, zero_division=0)
    for name, value in zip(POPULATIONS, expected):
        if name == "NK cells":  # absent from the truth: no F1, though it was predicted
            assert np.isnan(row[f"f1:{name}"])
        else:
            assert row[f"f1:{name}"] == float(value)


def test_a_population_never_predicted_scores_zero_and_one_absent_everywhere_is_nan():
    truth = np.array(["B cells"] * 3 + ["ungated"] * 5)
    predicted = np.array(["ungated"] * 8)
    row = patient_scores(truth, predicted, ["B cells", "ungated", "Monocytes"])
    assert row["accuracy"] == pytest.approx(5 / 8)
    assert row["f1:B cells"] == 0.0
    assert row["f1:ungated"] == pytest.approx(2 * 5 / (5 + 8))
    assert np.isnan(row["f1:Monocytes"])
    assert row["macro_f1"] == pytest.approx((0.0 + 10 / 13) / 2)
