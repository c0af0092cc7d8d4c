"""``train --loss / --method multitask / --task-similarity``: each choice reaches the model, the
model file and back, and gates the same after the round trip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gating_core.commands import train
from gating_core.fcs import read_fcs
from gating_core.method.classifier import LOSSES
from gating_core.model import METHODS, GatingModel
from gating_core.model.research import build_model, load_gating_model
from helpers import run_cli, sample_cohort, sample_paths

SMALL = ("--features", "64", "--cells-per-patient", "500", "--no-selection")
SMALL_PARAMS = {"n_features": 64, "cells_per_patient": 500, "select": False}

# (CLI flags, the parameters they must set, the method label train prints, accuracy floor on
# the two ordinary new patients: measured 0.9997-0.9999 (hinge, logistic) and 0.990-0.999
# (multitask) at these small settings)
CHOICES = {
    "hinge": (("--loss", "hinge"), {"method": "marginal", "loss": "hinge"}, "marginal, hinge loss", 0.995),
    "logistic-pooling": (("--method", "pooling", "--loss", "logistic"), {"method": "pooling", "loss": "logistic"},
                         "pooling, logistic loss", 0.995),
    "multitask-0.01": (("--method", "multitask", "--task-similarity", "0.01"),
                       {"method": "multitask", "loss": "squared", "task_similarity": 0.01}, "multitask tau=0.01", 0.985),
    # The distributionally robust ("agnostic") objective: patients weighted towards the worst mixture.
    "agnostic": (("--patient-weighting", "agnostic"),
                 {"method": "marginal", "loss": "squared", "patient_weighting": "agnostic"}, "marginal", 0.995),
    "prior-shift-em": (("--prior-shift", "em"), {"method": "marginal", "loss": "squared", "prior_shift": "em"},
                       "marginal", 0.995),
}


def test_the_command_line_offers_what_the_model_accepts():
    assert train.TRAIN_METHODS == METHODS
    assert train.LOSSES == LOSSES
    assert train.DEFAULT_LOSS == GatingModel().loss
    assert train.DEFAULT_TASK_SIMILARITY == GatingModel().task_similarity


@pytest.mark.parametrize("tau", ["0", "1.5", "much"])
def test_a_task_similarity_outside_its_range_is_refused(tau, sample_data_dir, tmp_path):
    result = run_cli("train", "--method", "multitask", "--task-similarity", tau, "--out", tmp_path / "m.npz",
                     sample_data_dir / "patient_01.fcs", sample_data_dir / "patient_02.fcs")
    assert result.returncode == 2
    assert "--task-similarity: must be a number within (0, 1]" in result.stderr
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_each_choice_trains_saves_loads_and_gates_the_same(choice, sample_data_dir, tmp_path):
    flags, expected, label, floor = CHOICES[choice]
    path = tmp_path / "model.npz"
    result = run_cli("train", *flags, *SMALL, "--out", path, *sample_paths())
    assert result.returncode == 0, result.stderr
    assert f"Training ({label}) on 8 patients, 96,000 events" in result.stdout
    assert f"Method: {label}\n" in result.stdout

    loaded = load_gating_model(path)
    for key, value in expected.items():
        assert getattr(loaded, key) == value, key
    assert loaded.classifier_.get_params()["loss"] == expected["loss"]
    summary = loaded.describe()
    assert summary["method"] == expected["method"] and summary["loss"] == expected["loss"]
    assert summary["task_similarity"] == expected.get("task_similarity")
    if expected["method"] != "marginal":
        assert loaded.classifier_.use_embedding is False and loaded.pooled_classifier_ is None

    # The same model fitted in this process (the library, not the command line) gates as the
    # file does (probabilities to 1e-6), and that model after its own save / load exactly as
    # itself (the same arrays through the same code).
    fitted = build_model({**expected, **SMALL_PARAMS}).fit(*sample_cohort())
    again_path = tmp_path / "again.npz"
    fitted.save(again_path)
    again = load_gating_model(again_path)
    new = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    reference = fitted.predict_proba(new)
    np.testing.assert_array_equal(again.predict_proba(new), reference)
    np.testing.assert_allclose(loaded.predict_proba(new), reference, rtol=0, atol=1e-6)
    # ... so the same labels wherever a difference within that 1e-6 cannot swap the two best.
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2e-6
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(loaded.predict(new)[clear], fitted.predict(new)[clear])

    out = tmp_path / "gated"
    new_files = sorted((sample_data_dir / "new").glob("new_patient_0[12].fcs"))
    gated = run_cli("gate", "--model", path, "--out-dir", out, *new_files)
    assert gated.returncode == 0, gated.stderr
    for fcs in new_files:
        predicted = pd.read_csv(out / f"{fcs.stem}.gated.csv")["population"].to_numpy()
        truth = pd.read_csv(sample_data_dir / "truth" / f"{fcs.stem}.labels.csv")["population"].to_numpy()
        accuracy = float(np.mean(predicted == truth))
        print(choice, fcs.stem, f"{accuracy:.4f}")
        assert accuracy > floor, (choice, fcs.stem, accuracy)


def test_the_research_options_train_a_research_model_that_gate_reads(sample_data_dir, tmp_path):
    """``--augment N`` and ``--second-bandwidth`` (and ``--self-training``) are ResearchGatingModel's
    parameters: train builds one, its file loads back as one and ``gate`` gates with it; without
    them the model is the product's GatingModel."""
    from gating_core.model.research import ResearchGatingModel, load_gating_model

    path = tmp_path / "research.npz"
    result = run_cli("train", "--augment", "1", *SMALL, "--out", path, *sample_paths(range(1, 5)))
    assert result.returncode == 0, result.stderr
    loaded = load_gating_model(path)
    assert type(loaded) is ResearchGatingModel and loaded.n_augment == 1
    assert loaded.classifier_.n_augment == 1
    out = tmp_path / "gated"
    new = sample_data_dir / "new" / "new_patient_01.fcs"
    gated = run_cli("gate", "--model", path, "--out-dir", out, new)
    assert gated.returncode == 0, gated.stderr
    predicted = pd.read_csv(out / f"{new.stem}.gated.csv")["population"].to_numpy()
    truth = pd.read_csv(sample_data_dir / "truth" / f"{new.stem}.labels.csv")["population"].to_numpy()
    assert np.mean(predicted == truth) > 0.98

    plain = tmp_path / "plain.npz"
    assert run_cli("train", *SMALL, "--out", plain, *sample_paths(range(1, 5))).returncode == 0
    assert type(load_gating_model(plain)) is GatingModel


def test_transfer_start_is_an_option_of_train(tmp_path):
    """``--transfer-start``: the folds also score EM started from the transfer model's posteriors;
    the model is a ResearchGatingModel whose file keeps the option and the table."""
    from gating_core.model.research import ResearchGatingModel, load_gating_model

    path = tmp_path / "start.npz"
    refused = run_cli("train", "--transfer-start", "--adaptive-weight", "0.5", *SMALL, "--out", path,
                      *sample_paths(range(1, 5)))
    assert refused.returncode == 2 and "--adaptive-weight auto" in refused.stderr and not path.exists()
    result = run_cli("train", "--transfer-start", *SMALL, "--out", path, *sample_paths(range(1, 5)))
    assert result.returncode == 0, result.stderr
    loaded = load_gating_model(path)
    assert type(loaded) is ResearchGatingModel and loaded.transfer_start is True
    table = loaded.selection_["adaptive_weight"]
    started = table["cv_transfer_start"]
    assert set(started) == {"accuracy", "worst", "score"}
    # the score is the mean plus the next-to-worst held-out patient's accuracy (4 held out here)
    # (a2 <= (a2 + a3 + a4) / 3, so the score is at most (7 mean - worst) / 3)
    mean, worst = started["accuracy"], started["worst"]
    assert mean + worst - 1e-12 <= started["score"] <= (7 * mean - worst) / 3 + 1e-12
    assert len(table["cv_patients"]) == 4 and all(len(a) == 4 for a in table["cv_patients"].values())
    assert table["start"] == loaded.adaptive_start_ in ("training", "transfer")
    assert "EM started from" in result.stdout
