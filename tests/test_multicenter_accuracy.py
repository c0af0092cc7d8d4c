"""Patients from centers the model has never seen: real and simulated multi-center data.

The protocols hold out whole groups, as a new patient from a new run will be held out:
- the shared multicenter CyTOF samples (skipped when absent) are five pairs of technical
  replicates in two batches; leaving one PAIR out keeps a held-out patient's twin from training;
- the simulated cohort has four centers with their own instrument, staining, compensation
  errors and population proportions; leaving one CENTER out is the product's promise.
Every method runs in the same test on the same split with default settings.
"""

import numpy as np
import pytest

from gating_core.evaluation import leave_one_group_out, summarize
from gating_core.inputs import load_labeled_input
from gating_core.synthetic import simulate_centers


@pytest.mark.slow
def test_unseen_simulated_centers_gated_better_than_pooled_ridge_and_lda():
    # The benchmark cohort of bench/bench_centers.py. Measured: marginal (blended with its pooled
    # companion) 0.9913 mean / 0.9660 worst, pooled ridge 0.970 / 0.882, LDA 0.951 / 0.767. Other simulated cohorts give smaller or
    # negative margins against a pooled logistic regression (see the README): this test guards
    # the mechanism (shift augmentation + group-aware selection), not a general claim.
    cohort, centers = simulate_centers(4, 3, seed=11, n_events=10000, strength=2.0)
    samples, labels = [c[0] for c in cohort], [c[1] for c in cohort]
    groups = [centers[s.name] for s in samples]
    table = leave_one_group_out(samples, labels, groups, methods=("marginal", "pooled-ridge", "lda"))
    summary = summarize(table).set_index("method")
    print(summary.to_string())
    marginal = summary.loc["marginal"]
    for baseline in ("pooled-ridge", "lda"):
        assert marginal["mean_accuracy"] > summary.loc[baseline, "mean_accuracy"] + 0.01, baseline
        assert marginal["worst_accuracy"] > summary.loc[baseline, "worst_accuracy"] + 0.05, baseline
    assert marginal["mean_accuracy"] > 0.985 and marginal["worst_accuracy"] > 0.95


@pytest.mark.slow
def test_leaving_a_replicate_pair_out_of_the_shared_multicenter_data(multicenter_dir):
    data = [load_labeled_input(p) for p in sorted(multicenter_dir.glob("multicenter_*.fcs"))]
    assert len(data) == 10
    pairs = [f"pair_{(i // 2) + 1}" for i in range(10)]
    table = leave_one_group_out([d[0] for d in data], [d[1] for d in data], pairs,
                                methods=("marginal", "pooled-ridge", "lda"))
    summary = summarize(table).set_index("method")
    print(summary.to_string())
    marginal, pooled, lda = (summary.loc[m] for m in ("marginal", "pooled-ridge", "lda"))
    # Measured with these defaults: marginal (blended with its pooled companion) 0.9685 mean /
    # 0.9125 worst, pooled ridge 0.9684 / 0.9092, LDA 0.9507 / 0.9069; the marginal model alone
    # 0.9671 / 0.9071. The later batch (samples 09, 10) is the worst for every method.
    assert marginal["mean_accuracy"] > lda["mean_accuracy"] + 0.01
    assert marginal["mean_accuracy"] > pooled["mean_accuracy"] - 0.002
    assert marginal["worst_accuracy"] > pooled["worst_accuracy"] + 0.001
    assert marginal["worst_accuracy"] > 0.91
    assert marginal["worst_patient"] in ("multicenter_09", "multicenter_10")
    by_patient = table.pivot(index="patient", columns="method", values="accuracy")
    assert np.all(by_patient.loc[[f"multicenter_0{i}" for i in range(1, 9)], "marginal"] > 0.97)
