"""One exit status for one class of problem, from every command: 0 done, 1 a bad file or folder
(input or output) or work that failed, 2 a wrong command line (argparse's own usage errors and
ours). ``--help`` and the README say so. ``train --out`` that cannot be written is refused
before any training.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import REPO, SAMPLE_DATA, quick_model_file, run_cli, sample_paths

PATIENTS = sample_paths(range(1, 4))
NEW_PATIENT = SAMPLE_DATA / "new" / "new_patient_01.fcs"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return quick_model_file(tmp_path_factory.mktemp("exit"))


@pytest.fixture
def bad(tmp_path) -> dict:
    not_fcs = tmp_path / "notes.fcs"
    not_fcs.write_text("these are notes, not events\n" * 10)
    labels = tmp_path / "notes.labels.csv"
    labels.write_text("population\nB\n")
    cut = tmp_path / "cut.fcs"
    cut.write_bytes(NEW_PATIENT.read_bytes()[:-5000])
    not_model = tmp_path / "model.npz"
    not_model.write_bytes(b"PK\x03\x04 definitely not a model")
    return {"fcs": not_fcs, "cut": cut, "model": not_model}


def test_every_command_exits_1_on_a_bad_input_file(model_file, bad, tmp_path):
    cases = {
        "info": ["info", bad["cut"]],
        "train": ["train", "--no-selection", "--out", tmp_path / "m.npz", bad["fcs"], *PATIENTS],
        "gate": ["gate", "--model", model_file, "--out-dir", tmp_path / "out", bad["cut"]],
        "gate --model": ["gate", "--model", bad["model"], "--out-dir", tmp_path / "out", NEW_PATIENT],
        "evaluate": ["evaluate", "--no-selection", bad["fcs"], *PATIENTS],
        "library import": ["library", "--path", tmp_path / "lib", "import", bad["cut"]],
    }
    wrong = {}
    for name, args in cases.items():
        result = run_cli(*args)
        if result.returncode != 1 or not result.stderr.startswith("error: ") or "Traceback" in result.stderr:
            wrong[name] = (result.returncode, result.stderr[-400:])
    assert not wrong, wrong
    assert not (tmp_path / "m.npz").exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_every_command_exits_2_on_a_wrong_command_line(model_file, tmp_path):
    cases = {
        "info": ["info", "--no-such-option", NEW_PATIENT],
        "train": ["train", "--out", tmp_path / "m.npz", "--no-such-option", *PATIENTS],
        "train --pooled-weight": ["train", "--out", tmp_path / "m.npz", "--pooled-weight", "7", *PATIENTS],
        "train --dica-components": ["train", "--out", tmp_path / "m.npz", "--dica-components", "5", *PATIENTS],
        "gate": ["gate", "--model", model_file, NEW_PATIENT],  # no --out-dir
        "evaluate": ["evaluate", "--protocol", "sideways", *PATIENTS],
        "evaluate, two patients": ["evaluate", "--protocol", "one-group", *PATIENTS[:2]],
        "library": ["library", "--path", tmp_path / "lib", "frobnicate"],
        "no command": [],
    }
    wrong = {}
    for name, args in cases.items():
        result = run_cli(*args)
        if result.returncode != 2 or "Traceback" in result.stderr:
            wrong[name] = (result.returncode, result.stderr[-400:])
    assert not wrong, wrong
    assert not (tmp_path / "m.npz").exists()
    result = run_cli("evaluate", "--protocol", "one-group", *PATIENTS[:2])
    assert "training on one group and gating another needs at least three labeled patients, got 2" in result.stderr


def test_the_exit_status_is_documented_in_help_and_readme():
    for args in ([], ["info"], ["train"], ["gate"], ["evaluate"], ["library"]):
        result = run_cli(*args, "--help")
        assert result.returncode == 0, result.stderr
        text = " ".join(result.stdout.split())
        assert "exit status: 0 done; 1 a file or folder" in text and "2 the command line is wrong" in text, args
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "Exit status: 0 done, 1 a file or folder" in readme and "2 a wrong command line" in readme


# -- train --out ------------------------------------------------------------------------------------


def test_train_refuses_an_out_that_is_a_folder_before_training(tmp_path):
    out = tmp_path / "models"
    out.mkdir()
    result = run_cli("train", "--no-selection", "--out", out, *PATIENTS)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {out}: --out names a folder"), result.stderr
    assert "Training" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"] and list(out.iterdir()) == []


def test_train_refuses_an_out_in_a_missing_folder_before_training(tmp_path):
    out = tmp_path / "no" / "such" / "m.npz"
    result = run_cli("train", "--no-selection", "--out", out, *PATIENTS)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {out}: the folder {out.parent} does not exist"), result.stderr
    assert "Training" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_an_out_inside_a_file_before_training(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    result = run_cli("train", "--no-selection", "--out", a_file / "m.npz", *PATIENTS)
    assert result.returncode == 1
    assert "is not a folder" in result.stderr and "Training" not in result.stdout


def test_a_failed_model_save_leaves_no_part_file(model_file, tmp_path):
    from gating_core.model import GatingModel

    model = GatingModel.load(model_file)
    target = tmp_path / "taken"
    target.mkdir()
    with pytest.raises(OSError):
        model.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    shutil.rmtree(target)


def test_train_with_a_good_out_writes_the_model_and_exits_0(tmp_path):
    out = tmp_path / "m.npz"
    result = run_cli("train", "--no-selection", "--features", "64", "--cells-per-patient", "300", "--out", out,
                     *PATIENTS)
    assert result.returncode == 0, result.stderr
    assert f"Model written to {out}" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]
    # so few training patients are said to be few
    assert f"Note: {len(PATIENTS)} training patients: the model has seen little of how patients differ" in result.stdout
    assert "training cells of one patient only" not in result.stdout


def test_train_points_out_a_population_only_one_patient_has(tmp_path):
    shutil.copy(PATIENTS[2], tmp_path / "typo.fcs")
    rows = (PATIENTS[2].parent / f"{PATIENTS[2].stem}.labels.csv").read_text().splitlines()
    rows[1:1201] = ["Martians"] * 1200  # a tenth of the events: in any draw of training cells
    (tmp_path / "typo.labels.csv").write_text("\n".join(rows) + "\n")
    result = run_cli("train", "--no-selection", "--features", "64", "--cells-per-patient", "300", "--out",
                     tmp_path / "m.npz", *PATIENTS[:2], tmp_path / "typo.fcs")
    assert result.returncode == 0, result.stderr
    [note] = [line for line in result.stdout.splitlines() if "of one patient only" in line]
    assert note.startswith("Note: training cells of one patient only: 'Martians' (typo, ")


def test_train_says_a_labelled_file_of_several_data_sets_gives_its_first(tmp_path):
    import numpy as np
    from test_fcs_properties import build_fcs

    from gating_core.fcs import read_fcs

    first = read_fcs(PATIENTS[0])
    columns = [first.events[:, j].astype(np.float32) for j in range(len(first.pnn))]
    (tmp_path / "runs.fcs").write_bytes(build_fcs(dict(columns=columns, datatype="F", pnn=first.pnn),
                                                  dict(columns=[c[:50] for c in columns], datatype="F", pnn=first.pnn)))
    shutil.copy(PATIENTS[0].parent / f"{PATIENTS[0].stem}.labels.csv", tmp_path / "runs.labels.csv")
    result = run_cli("train", "--no-selection", "--features", "64", "--cells-per-patient", "300", "--out",
                     tmp_path / "m.npz", tmp_path / "runs.fcs", *PATIENTS[1:])
    assert result.returncode == 0, result.stderr
    assert ("Note: runs.fcs: the file holds 2 data sets; its labels are taken as the first one's (runs#1) and the "
            "other 1 are left out of training") in result.stdout
