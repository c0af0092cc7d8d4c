"""Real data: leave-one-patient-out on the shared multicenter CyTOF samples (skipped when absent).

Marginal transfer must beat pooling and LDA in mean accuracy and in worst-patient accuracy,
all measured in the same run with default settings (about four minutes on two cores).
"""

import pytest

from gating_core.evaluation import leave_one_patient_out, summarize
from gating_core.labels import load_labeled_input


@pytest.mark.slow
def test_marginal_transfer_beats_pooling_and_lda_on_multicenter_cytof(multicenter_dir):
    data = [load_labeled_input(p) for p in sorted(multicenter_dir.glob("multicenter_*.fcs"))]
    assert len(data) == 10
    table = leave_one_patient_out([d[0] for d in data], [d[1] for d in data])
    summary = summarize(table).set_index("method")
    print(summary.to_string())
    marginal, pooling, lda = (summary.loc[m] for m in ("marginal", "pooling", "lda"))
    assert marginal["mean_accuracy"] > pooling["mean_accuracy"]
    assert marginal["mean_accuracy"] > lda["mean_accuracy"]
    assert marginal["worst_accuracy"] > pooling["worst_accuracy"]
    assert marginal["worst_accuracy"] > lda["worst_accuracy"]
    assert marginal["mean_accuracy"] > 0.975
    assert marginal["worst_accuracy"] > 0.955
    # The shifted centre (samples 09 and 10) is where the embedding pays off.
    by_patient = table.pivot(index="patient", columns="method", values="accuracy")
    for patient in ("multicenter_09", "multicenter_10"):
        assert by_patient.loc[patient, "marginal"] > by_patient.loc[patient, "pooling"] + 0.002
