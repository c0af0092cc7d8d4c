"""The command-line contract: train, gate, evaluate (design.md section 5)."""

import shutil

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import Channel, Sample, read_fcs, write_fcs
from gating_core.io.export import write_gated_csv
from gating_core.synthetic import ellipse_task
from helpers import run_cli


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory, sample_data_dir):
    folder = tmp_path_factory.mktemp("cli")
    model = folder / "model.npz"
    result = run_cli("train", "--out", model, *sorted(sample_data_dir.glob("patient_*.fcs")))
    assert result.returncode == 0, result.stderr
    assert "Training (marginal) on 8 patients, 96,000 events" in result.stdout
    assert "Cross-validated accuracy over patients" in result.stdout
    from gating_core.model import GatingModel
    from gating_core.model.summary import adapted_populations_text

    adapted = adapted_populations_text(GatingModel.load(model))  # the weight and its reason, kept in the file
    assert adapted.startswith("weight ")
    assert f"Adapted populations: {adapted} (--adaptive-weight 0 turns them off)\n" in result.stdout
    assert ("Unknown cells: a gated cell beyond every population (3 x its reach) is called 'unknown' "
            "(--unknown-margin none turns this off)\n") in result.stdout
    return model


def test_gate_writes_one_gated_csv_per_patient_in_file_order(trained_model, sample_data_dir, tmp_path):
    new = sorted((sample_data_dir / "new").glob("*.fcs"))
    result = run_cli("gate", "--model", trained_model, "--out-dir", tmp_path / "out", *new)
    assert result.returncode == 0, result.stderr
    for path in new:
        gated = pd.read_csv(tmp_path / "out" / f"{path.stem}.gated.csv")
        sample = read_fcs(path, compensate=True)
        assert list(gated.columns) == sample.pnn + ["population", "confidence"]
        assert len(gated) == sample.n_events
        np.testing.assert_allclose(gated[sample.pnn].to_numpy(), sample.events, rtol=1e-6)
        truth = pd.read_csv(sample_data_dir / "truth" / f"{path.stem}.labels.csv")["population"]
        accuracy = np.mean(gated["population"].to_numpy() == truth.to_numpy())
        assert accuracy > (0.95 if path.stem == "new_patient_03" else 0.98), (path.stem, accuracy)
        assert gated["confidence"].between(0, 1).all()
    assert "WARNING: new_patient_03 is unlike every training patient" in result.stdout
    assert result.stdout.count("WARNING") == 1
    assert "new_patient_01: 12,000 events" in result.stdout


def test_gate_reports_a_bad_file_and_finishes_the_others(trained_model, sample_data_dir, tmp_path):
    bad = tmp_path / "broken.fcs"
    bad.write_bytes((sample_data_dir / "new" / "new_patient_01.fcs").read_bytes()[:5000])
    good = sample_data_dir / "new" / "new_patient_02.fcs"
    result = run_cli("gate", "--model", trained_model, "--out-dir", tmp_path / "out", bad, good)
    assert result.returncode == 1
    assert "broken.fcs" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "out" / "new_patient_02.gated.csv").exists()
    assert not (tmp_path / "out" / "broken.gated.csv").exists()


def test_gate_refuses_inputs_that_would_overwrite_each_other(trained_model, sample_data_dir, tmp_path):
    twin = tmp_path / "elsewhere" / "new_patient_01.fcs"
    twin.parent.mkdir()
    shutil.copy(sample_data_dir / "new" / "new_patient_01.fcs", twin)
    result = run_cli("gate", "--model", trained_model, "--out-dir", tmp_path / "out",
                     sample_data_dir / "new" / "new_patient_01.fcs", twin)
    assert result.returncode == 2
    assert "would write the same gated CSV" in result.stderr and str(twin) in result.stderr
    assert not (tmp_path / "out").exists()


def test_gate_refuses_a_file_that_is_not_a_model(tmp_path, sample_data_dir):
    fake = tmp_path / "model.npz"
    fake.write_bytes(b"PK\x03\x04 definitely not a model")
    result = run_cli("gate", "--model", fake, "--out-dir", tmp_path, sample_data_dir / "new" / "new_patient_01.fcs")
    assert result.returncode == 1  # a bad input file (2 is for a wrong command line)
    assert "model.npz: not a gating model file" in result.stderr


def test_train_names_a_missing_labels_file(tmp_path, sample_data_dir):
    lonely = tmp_path / "lonely.fcs"
    shutil.copy(sample_data_dir / "new" / "new_patient_01.fcs", lonely)
    result = run_cli("train", "--out", tmp_path / "m.npz", lonely, sample_data_dir / "patient_01.fcs")
    assert result.returncode == 1  # a bad input file (2 is for a wrong command line)
    assert "lonely" in result.stderr and "labels" in result.stderr
    assert not (tmp_path / "m.npz").exists()


def test_gated_csv_output_is_valid_training_input(trained_model, sample_data_dir, tmp_path):
    """Gated CSVs written by `gate` train a pooling model that gates like the original."""
    new = sorted((sample_data_dir / "new").glob("new_patient_0[12].fcs"))
    assert run_cli("gate", "--model", trained_model, "--out-dir", tmp_path, *new).returncode == 0
    gated = sorted(tmp_path.glob("*.gated.csv"))
    result = run_cli("train", "--method", "pooling", "--no-selection", "--out", tmp_path / "pooled.npz", *gated)
    assert result.returncode == 0, result.stderr
    assert "Training (pooling) on 2 patients, 24,000 events" in result.stdout
    out = tmp_path / "again"
    assert run_cli("gate", "--model", tmp_path / "pooled.npz", "--out-dir", out,
                   sample_data_dir / "new" / "new_patient_01.fcs").returncode == 0
    again = pd.read_csv(out / "new_patient_01.gated.csv")["population"]
    truth = pd.read_csv(sample_data_dir / "truth" / "new_patient_01.labels.csv")["population"]
    assert np.mean(again.to_numpy() == truth.to_numpy()) > 0.97


def test_evaluate_prints_every_method_per_patient_and_the_worst(sample_data_dir, tmp_path):
    inputs = sorted(sample_data_dir.glob("patient_0[1-4].fcs"))
    table = tmp_path / "lopo.csv"
    result = run_cli("evaluate", "--csv", table, *inputs)
    assert result.returncode == 0, result.stderr
    assert "leave-one-patient-out, per patient" in result.stdout
    assert "Summary (mean and worst patient, per protocol); worst_patient: the patient of worst_accuracy" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("held out"))
    assert "F1 CD4 T cells" in header and "F1 Granulocytes" in header
    # Four distinct simulated patients: each is its own inferred group, so one protocol runs.
    assert "Every patient is its own group" in result.stdout
    rows = pd.read_csv(table)
    assert len(rows) == 4 * 5
    assert set(rows["method"]) == {"marginal", "pooled-logistic", "lda", "qda", "trees"}
    assert set(rows["protocol"]) == {"leave-one-patient-out"}
    assert {"accuracy", "macro_f1", "f1:CD4 T cells", "f1:Granulocytes"} <= set(rows.columns)
    marginal = rows[rows["method"] == "marginal"]
    assert marginal["accuracy"].min() > 0.97
    assert rows[rows["method"] == "lda"]["accuracy"].mean() < marginal["accuracy"].mean()


def _ellipse_gated_csv(path, x, y):
    sample = Sample(path.stem, x.astype(np.float32), [Channel("x"), Channel("y")])
    write_gated_csv(path, sample, np.where(y == 1, "left", "right"))


def test_ellipse_task_through_the_command_line(tmp_path):
    """JMLR synthetic task, train/gate from the CLI with no flags: error <= the paper's 7.22%."""
    rng = np.random.default_rng(64)
    train_x, train_y = ellipse_task(64, 256, rng)
    test_x, test_y = ellipse_task(10, 256, rng)
    inputs = []
    for i, (x, y) in enumerate(zip(train_x, train_y)):
        inputs.append(tmp_path / f"task_{i:02d}.gated.csv")
        _ellipse_gated_csv(inputs[-1], x, y)
    tests = []
    for i, x in enumerate(test_x):
        tests.append(tmp_path / f"test_{i:02d}.fcs")
        write_fcs(tests[-1], x, ["x", "y"])
    errors = {}
    for method in ("marginal", "pooling"):
        model = tmp_path / f"{method}.npz"
        result = run_cli("train", "--method", method, "--out", model, *inputs)
        assert result.returncode == 0, result.stderr
        if method == "marginal":  # no population is a Gaussian here: the check turns them off, and says so
            assert "Adapted populations: off: every fold of held-out groups gated better with the transfer model " \
                   "alone" in result.stdout
        out = tmp_path / method
        assert run_cli("gate", "--model", model, "--out-dir", out, *tests).returncode == 0
        wrong = []
        for path, y in zip(tests, test_y):
            predicted = pd.read_csv(out / f"{path.stem}.gated.csv")["population"].to_numpy()
            wrong.append(np.mean(predicted != np.where(y == 1, "left", "right")))
        errors[method] = float(np.mean(wrong))
    assert errors["marginal"] <= 0.0722, errors
    assert errors["pooling"] > 3 * errors["marginal"], errors
