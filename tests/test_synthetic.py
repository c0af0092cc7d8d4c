"""Synthetic data: realism of the simulated patients, the JMLR ellipse task, the sample data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import flowkit
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression

from gating_core import synthetic
from gating_core.fcs import read_fcs
from gating_core.synthetic import (CHANNELS, LYMPHOCYTES, MARKERS, POPULATIONS, ellipse_task,
                                   file_digests, simulate_cohort, simulate_patient)

REPO = Path(__file__).resolve().parent.parent


def _f1(predicted: np.ndarray, truth: np.ndarray) -> float:
    true_positives = np.sum(predicted & truth)
    return 2 * true_positives / (predicted.sum() + truth.sum())


def _lymphocyte_box(sample, labels):
    """A fixed FSC/SSC rectangle around one patient's lymphocytes (1st-99th percentiles)."""
    lymphs = np.isin(labels, LYMPHOCYTES)
    fsc, ssc = sample.events[lymphs, 0], sample.events[lymphs, 1]
    return np.percentile(fsc, [1, 99]), np.percentile(ssc, [1, 99])


def _apply_box(box, sample) -> np.ndarray:
    (f_lo, f_hi), (s_lo, s_hi) = box
    fsc, ssc = sample.events[:, 0], sample.events[:, 1]
    return (fsc > f_lo) & (fsc < f_hi) & (ssc > s_lo) & (ssc < s_hi)


def _fixed_gate_f1s(cohort) -> list[float]:
    box = _lymphocyte_box(*cohort[0])
    return [_f1(_apply_box(box, s), np.isin(l, LYMPHOCYTES)) for s, l in cohort]


# --- one patient ----------------------------------------------------------------------------

def test_patient_has_panel_labels_and_spillover():
    sample, labels = simulate_patient(7, n_events=5000)
    assert sample.events.shape == (5000, 9)
    assert sample.pnn == list(CHANNELS)
    assert sample.pns[2:] == list(MARKERS)
    assert {"CD45", "CD3", "CD4", "CD8", "CD19", "CD14", "CD56"} <= set(sample.pns)
    assert labels.shape == (5000,) and labels.dtype.kind == "U"
    assert set(labels) <= set(POPULATIONS)
    # Every population but "other" is present in a typical patient of this size.
    assert set(POPULATIONS) - {"other"} <= set(labels)
    assert not sample.compensated and sample.has_spillover
    assert sample.spillover_channels == [f"FL{i}-A" for i in range(1, 8)]
    assert np.allclose(np.diag(sample.spillover), 1.0)
    assert sample.spillover[0, 1] > 0.15  # FITC spills into the PE detector
    # The $SPILLOVER keyword carries exactly the same matrix.
    parts = sample.keywords["$SPILLOVER"].split(",")
    assert parts[0] == "7" and parts[1:8] == sample.spillover_channels
    assert np.array_equal(np.array(parts[8:], dtype=float).reshape(7, 7), sample.spillover)
    # Scatter is linear pulse area, 0..262144.
    assert sample.events[:, :2].min() >= 0 and sample.events[:, :2].max() < 262144
    # Events are float32-exact, so an FCS round trip cannot change them.
    assert np.array_equal(sample.events.astype(np.float32).astype(np.float64), sample.events)


def test_same_seed_same_patient_and_different_seed_differs():
    a, la = simulate_patient(11, n_events=3000)
    b, lb = simulate_patient(11, n_events=3000)
    c, _ = simulate_patient(12, n_events=3000)
    assert np.array_equal(a.events, b.events) and np.array_equal(la, lb)
    assert not np.array_equal(a.events, c.events)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="n_events"):
        simulate_patient(0, n_events=0)
    with pytest.raises(ValueError, match="unknown condition 'sepsis'"):
        simulate_patient(0, condition="sepsis")
    with pytest.raises(ValueError, match="proportions"):
        simulate_patient(0, proportions=[1, 2, 3])


def test_debris_sits_at_low_forward_scatter():
    sample, labels = simulate_patient(3, n_events=8000, condition="typical")
    fsc = sample.events[:, 0]
    assert np.median(fsc[labels == "Debris"]) < 0.4 * np.median(fsc[np.isin(labels, LYMPHOCYTES)])
    # Granulocytes have the highest side scatter, lymphocytes the lowest.
    ssc = sample.events[:, 1]
    medians = {p: np.median(ssc[labels == p]) for p in ("Granulocytes", "Monocytes", "CD4 T cells")}
    assert medians["Granulocytes"] > medians["Monocytes"] > medians["CD4 T cells"]


def test_compensation_recovers_negatives_with_spillover_spreading():
    sample, labels = simulate_patient(0, n_events=20000, condition="typical")
    compensated = sample.compensate()
    cd56 = sample.channel_index("CD56")
    t_cells, b_cells = labels == "CD4 T cells", labels == "B cells"
    raw = sample.events[t_cells, cd56]
    comp = compensated.events[t_cells, cd56]
    # CD4 T cells are CD56-negative, but bright CD3-FITC spills into the PE detector.
    assert np.median(raw) > 500
    assert abs(np.median(comp)) < 60
    assert np.mean(comp < 0) > 0.25
    # Spillover spreading: the negative is wider where a bright neighbour spills in (CD3+ T
    # cells) than where it does not (CD3- B cells).
    iqr = lambda x: np.subtract(*np.percentile(x, [75, 25]))  # noqa: E731
    assert iqr(comp) > 1.3 * iqr(compensated.events[b_cells, cd56])
    # Positive populations stay clearly positive after compensation.
    cd3 = sample.channel_index("CD3")
    assert np.median(compensated.events[t_cells, cd3]) > 1500


# --- patient-to-patient variation -------------------------------------------------------------

def test_proportions_vary_across_patients_and_follow_the_condition():
    cohort = simulate_cohort(8, seed=5, n_events=6000, conditions=["typical"] * 8)
    shares = np.array([[np.mean(l == p) for p in POPULATIONS] for _, l in cohort])
    assert np.ptp(shares[:, POPULATIONS.index("Granulocytes")]) > 0.08
    assert np.ptp(shares[:, POPULATIONS.index("CD4 T cells")]) > 0.04
    lymph_share = lambda l: np.mean(np.isin(l, LYMPHOCYTES))  # noqa: E731
    typical = np.mean([lymph_share(simulate_patient(s, n_events=6000, condition="typical")[1])
                       for s in range(4)])
    lymphopenic = np.mean([lymph_share(simulate_patient(s, n_events=6000, condition="lymphopenia")[1])
                           for s in range(4)])
    assert lymphopenic < 0.5 * typical
    _, depleted = simulate_patient(1, n_events=6000, condition="cd4_depletion")
    assert np.mean(depleted == "CD4 T cells") < np.mean(depleted == "CD8 T cells")


def test_a_fixed_gate_fails_on_drifted_patients_but_not_without_drift():
    conditions = ["typical"] * 8
    drifted = _fixed_gate_f1s(simulate_cohort(8, seed=2026, conditions=conditions))
    steady = _fixed_gate_f1s(simulate_cohort(8, seed=2026, conditions=conditions, drift=0.0))
    # The gate fits the patient it was drawn on ...
    assert drifted[0] > 0.95 and steady[0] > 0.95
    # ... holds up when only biology varies ...
    assert min(steady[1:]) > steady[0] - 0.06
    # ... and visibly fails on instrument-drifted patients.
    assert min(drifted[1:]) < drifted[0] - 0.3
    assert sum(f < drifted[0] - 0.15 for f in drifted[1:]) >= 3


def test_fixed_gate_fails_on_the_committed_sample_data(sample_data_dir):
    historical = [(read_fcs(sample_data_dir / f"patient_{i:02d}.fcs"),
                   pd.read_csv(sample_data_dir / f"patient_{i:02d}.labels.csv")["population"].to_numpy(str))
                  for i in range(1, 9)]
    f1s = _fixed_gate_f1s(historical)
    assert f1s[0] > 0.95
    assert min(f1s[1:]) < f1s[0] - 0.15


def test_unusual_new_patient_is_the_farthest_from_the_historical_ones(sample_data_dir):
    def summary(path):
        events = read_fcs(path).events
        return np.concatenate([np.log(np.percentile(events[:, :2], [25, 50, 75], axis=0)).ravel(),
                               np.arcsinh(np.percentile(events[:, 2:], [50, 90, 99], axis=0) / 150).ravel()])

    historical = np.array([summary(sample_data_dir / f"patient_{i:02d}.fcs") for i in range(1, 9)])
    scale = historical.std(axis=0)

    def nearest(v, exclude=None):
        return min(np.linalg.norm((v - h) / scale) for k, h in enumerate(historical) if k != exclude)

    historical_nn = max(nearest(v, k) for k, v in enumerate(historical))
    new = {i: nearest(summary(sample_data_dir / "new" / f"new_patient_{i:02d}.fcs")) for i in (1, 2, 3)}
    assert new[3] > historical_nn
    assert new[3] > max(new[1], new[2])


# --- files ------------------------------------------------------------------------------------

def test_written_fcs_reads_back_exactly_and_compensates_in_flowkit(tmp_path):
    sample, labels = simulate_patient(21, n_events=4000)
    path = tmp_path / "p.fcs"
    synthetic.write_sample(path, sample)
    synthetic.write_labels_csv(tmp_path / "p.labels.csv", labels)

    back = read_fcs(path)
    assert np.array_equal(back.events, sample.events)
    assert back.pnn == sample.pnn and back.pns == sample.pns
    assert back.version == "3.1"

    fk_sample = flowkit.Sample(str(path))
    fk_sample.apply_compensation(fk_sample.metadata["spillover"])
    assert np.allclose(fk_sample.get_events(source="comp"), sample.compensate().events, atol=1e-3)
    assert fk_sample.metadata["p3r"] == "262144"

    table = pd.read_csv(tmp_path / "p.labels.csv")
    assert list(table.columns) == ["population"]
    assert np.array_equal(table["population"].to_numpy(str), labels)


def test_committed_sample_data_layout_and_size(sample_data_dir):
    names = sorted(file_digests(sample_data_dir))
    expected = (["README.md"]
                + [f"new/new_patient_{i:02d}.fcs" for i in (1, 2, 3)]
                + [f"patient_{i:02d}{ext}" for i in range(1, 9) for ext in (".fcs", ".labels.csv")]
                + [f"truth/new_patient_{i:02d}.labels.csv" for i in (1, 2, 3)])
    assert names == sorted(expected)
    total = sum(p.stat().st_size for p in sample_data_dir.rglob("*") if p.is_file())
    assert total < 10_000_000
    for i in range(1, 9):
        sample = read_fcs(sample_data_dir / f"patient_{i:02d}.fcs")
        labels = pd.read_csv(sample_data_dir / f"patient_{i:02d}.labels.csv")["population"]
        assert 10_000 <= sample.n_events == len(labels) <= 20_000
        assert set(labels) <= set(POPULATIONS)
    for i in (1, 2, 3):
        sample = read_fcs(sample_data_dir / "new" / f"new_patient_{i:02d}.fcs")
        truth = pd.read_csv(sample_data_dir / "truth" / f"new_patient_{i:02d}.labels.csv")
        assert sample.n_events == len(truth)
        assert not (sample_data_dir / "new" / f"new_patient_{i:02d}.labels.csv").exists()


def test_command_regenerates_the_committed_sample_data_byte_for_byte(tmp_path, sample_data_dir):
    out = tmp_path / "sample_data"
    result = subprocess.run([sys.executable, "-m", "gating_core.synthetic", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote 23 files" in result.stdout
    assert file_digests(out) == file_digests(sample_data_dir)


def test_different_seed_gives_different_sample_data(tmp_path, sample_data_dir):
    synthetic.write_sample_data(tmp_path, seed=7, n_events=2000)
    digests = file_digests(tmp_path)
    assert digests["patient_01.labels.csv"] != file_digests(sample_data_dir)["patient_01.labels.csv"]
    assert read_fcs(tmp_path / "patient_01.fcs").n_events == 2000


# --- JMLR ellipse task ----------------------------------------------------------------------

def test_ellipse_tasks_have_balanced_labels_on_the_rotated_ellipse():
    Xs, ys, angles = ellipse_task(20, 256, 0, return_angles=True)
    assert len(Xs) == len(ys) == 20
    assert np.all((angles >= np.pi / 4) & (angles <= 3 * np.pi / 4))
    for X, y, angle in zip(Xs, ys, angles):
        assert X.shape == (256, 2) and y.shape == (256,) and y.dtype.kind == "i"
        assert y.sum() == 128
        major = np.array([np.cos(angle), np.sin(angle)])
        normal = np.array([-np.sin(angle), np.cos(angle)])
        u, v = X @ major, X @ normal
        # Inside the ellipse with semi-axes 1 and 0.2, and filling it.
        assert np.all((u / 1.0) ** 2 + (v / 0.2) ** 2 <= 1 + 1e-12)
        assert np.abs(u).max() > 0.9 and np.abs(v).max() > 0.17
        # The label is the side of the major axis.
        assert np.array_equal(y, (v > 0).astype(int))


def test_ellipse_points_are_uniform_over_the_area():
    Xs, _, angles = ellipse_task(1, 40000, 3, return_angles=True)
    major = np.array([np.cos(angles[0]), np.sin(angles[0])])
    u = Xs[0] @ major
    # Uniform over the area: P(|u| < 0.5) = area share of the central strip of a disc.
    strip = (np.arcsin(0.5) + 0.5 * np.sqrt(0.75)) * 2 / np.pi
    assert abs(np.mean(np.abs(u) < 0.5) - strip) < 0.01


def test_ellipse_task_pooling_fails_while_the_marginal_identifies_the_rule():
    train_X, train_y = ellipse_task(64, 256, 1)
    test_X, test_y = ellipse_task(10, 256, 2)
    pooled = LogisticRegression().fit(np.vstack(train_X), np.concatenate(train_y))
    pooled_error = 1 - pooled.score(np.vstack(test_X), np.concatenate(test_y))
    # One rule for all tasks cannot fit rotating tasks (an error rate near 28% here; the
    # per-task rule below reaches a few percent).
    assert pooled_error > 0.2

    # The unlabeled points of a task (its marginal) reveal the rotation: the principal axis
    # gives the major axis, the angle range fixes its orientation.
    errors = []
    for X, y in zip(test_X, test_y):
        eigenvalues, eigenvectors = np.linalg.eigh(np.cov(X.T))
        major = eigenvectors[:, np.argmax(eigenvalues)]
        if major[1] < 0:  # angles lie in [pi/4, 3pi/4]: the major axis points upward
            major = -major
        normal = np.array([-major[1], major[0]])
        errors.append(np.mean((X @ normal > 0).astype(int) != y))
    assert np.mean(errors) < 0.05
    assert pooled_error > 4 * np.mean(errors)


def test_ellipse_task_is_reproducible_and_validates_arguments():
    a, _ = ellipse_task(3, 10, 5)
    b, _ = ellipse_task(3, 10, np.random.default_rng(5))
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    with pytest.raises(ValueError):
        ellipse_task(0, 10, 0)
