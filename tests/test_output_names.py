"""Output names keep the patient's letters in any script (NFC), never make a path, a hidden
file, a Windows device or an over-long name; inputs of one ``gate`` call whose outputs would
share a name are refused before anything is gated; the app's upload names follow the same rule.
"""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fcs_properties import build_fcs

from gating_core.batch.files import gate_file, output_name_clashes, output_stem
from gating_core.fcs import read_fcs
from gating_core.gates.names import MAX_STEM_BYTES, safe_name, safe_stem
from helpers import SAMPLE_DATA, quick_model_file, run_cli

NEW = SAMPLE_DATA / "new"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return quick_model_file(tmp_path_factory.mktemp("names"))


# -- the rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, stem", [
    ("patient ü 東京 03", "patient_ü_東京_03"),
    (unicodedata.normalize("NFD", "patient ü 東京 03"), "patient_ü_東京_03"),  # macOS spelling, same name
    ("Guava Muse#2", "Guava_Muse_2"),
    ("EY_2013-07-19_PBS_FCS_3.1_Well_A1.001", "EY_2013-07-19_PBS_FCS_3.1_Well_A1.001"),
    ("Привет мир", "Привет_мир"),
    ("हिन्दी", "हिन्दी"),  # vowel signs (combining marks) stay with their letters
    ("../../etc/passwd", "etc_passwd"),
    ("..\\..\\Windows\\x", "Windows_x"),
    ("a..b", "a.b"),
    (".hidden", "hidden"),
    ("..", "patient"),
    ("", "patient"),
    ("a\x00b\x1bc\u202ed", "a_b_c_d"),  # control and bidi-override characters
    ("CON", "CON_"),
    ("nul.x", "nul_.x"),
    ("COM1", "COM1_"),
    ("LPT9 ", "LPT9_"),
])
def test_output_stems(name, stem):
    assert output_stem(name) == stem


def test_long_names_are_cut_to_a_file_name_in_utf8():
    assert len(output_stem("東" * 300).encode()) <= MAX_STEM_BYTES
    assert output_stem("東" * 300) == "東" * (MAX_STEM_BYTES // 3)
    assert len(output_stem("a" * 1000)) == MAX_STEM_BYTES


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_any_name_becomes_one_safe_file_name(text):
    for stem in (safe_name(text, "patient"), safe_stem(text, "patient")):
        assert stem and stem == unicodedata.normalize("NFC", stem)
        assert "/" not in stem and "\\" not in stem and ".." not in stem
        assert not stem.startswith(".") and not stem.endswith(".")
        assert all(ch.isprintable() and not ch.isspace() for ch in stem)
        assert Path(stem).name == stem and len(stem.encode()) <= MAX_STEM_BYTES
        assert stem.split(".")[0].upper() not in {"CON", "PRN", "AUX", "NUL", "COM1", "LPT1"}
    # letters and digits are never lost
    kept = [ch for ch in unicodedata.normalize("NFC", text) if ch.isalnum()]
    assert [ch for ch in safe_name(text, "") if ch.isalnum()][:len(kept)] == kept[:len(safe_name(text, ""))] \
        or len(safe_name(text, "").encode()) >= MAX_STEM_BYTES - 4


def test_app_upload_names_keep_letters_and_stay_safe(tmp_path):
    from ui.ingest import ingest_files

    blob = (NEW / "new_patient_01.fcs").read_bytes()
    report = ingest_files([("patient ü 東京 03.fcs", blob), ("../../.evil\x00name.fcs", blob),
                           ("CON.fcs", blob), ("patient é 東京 03.fcs", blob)], tmp_path / "work", compensate=False)
    assert not report.errors
    names = [p.name for p in report.patients]
    assert names == ["patient_ü_東京_03", "evil_name", "CON_", "patient_é_東京_03"]
    assert sorted(p.name for p in (tmp_path / "work").iterdir())[0].startswith("upload-")
    from gating_core.library import PatientLibrary

    library = PatientLibrary(tmp_path / "lib")
    for patient in report.patients:
        library.add_patient(patient.sample, name=patient.name)
    assert sorted(library.patient_names()) == sorted(names)


def test_one_file_picked_twice_in_an_upload_is_one_patient(tmp_path):
    """A browser hands over a file picked twice as two files: read once, with a note; two
    different files of one name (from two folders) stay two patients."""
    from ui.ingest import ingest_files

    blob = (NEW / "new_patient_01.fcs").read_bytes()
    other = (NEW / "new_patient_02.fcs").read_bytes()
    report = ingest_files([("p.fcs", blob), ("q.fcs", blob), ("p.fcs", blob), ("p.fcs", other)], tmp_path / "work",
                          compensate=False)
    assert not report.errors
    assert [p.name for p in report.patients] == ["p", "q", "p_2"]
    assert [p.sample.n_events for p in report.patients] == [read_fcs(NEW / n).n_events for n in
                                                            ("new_patient_01.fcs", "new_patient_01.fcs",
                                                             "new_patient_02.fcs")]
    assert report.notes == [("p.fcs", "p.fcs: picked twice in this upload; loaded once")]
    assert len(list((tmp_path / "work").iterdir())) == 3


# -- gate -------------------------------------------------------------------------------------------


def test_gate_keeps_unicode_names_and_two_patients_never_share_an_output(model_file, tmp_path):
    """Two patients whose names differ only in a non-ASCII letter, gated in separate calls into
    one folder: two outputs, each with its own patient's events."""
    first = tmp_path / "a" / "patient ü 東京 03.fcs"
    second = tmp_path / "b" / "patient é 東京 03.fcs"
    for path, source in ((first, "new_patient_01.fcs"), (second, "new_patient_02.fcs")):
        path.parent.mkdir()
        shutil.copy(NEW / source, path)
    out = tmp_path / "out"
    for path in (first, second):
        result = run_cli("gate", "--model", model_file, "--out-dir", out, path)
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["patient_é_東京_03.gated.csv", "patient_ü_東京_03.gated.csv"]
    for path, output in ((first, "patient_ü_東京_03.gated.csv"), (second, "patient_é_東京_03.gated.csv")):
        gated = pd.read_csv(out / output)
        np.testing.assert_allclose(gated["FSC-A"].to_numpy(), read_fcs(path).events[:, 0], rtol=1e-6)


def test_gate_refuses_inputs_whose_data_sets_would_share_an_output(model_file, tmp_path):
    """``a.fcs`` holds two data sets (``a#1`` -> ``a_1``), beside an input ``a_1.fcs``."""
    columns = [np.arange(5, dtype=np.float32)] * 2
    two_sets = tmp_path / "a.fcs"
    two_sets.write_bytes(build_fcs(dict(columns=columns, datatype="F"), dict(columns=columns, datatype="F")))
    single = tmp_path / "a_1.fcs"
    shutil.copy(NEW / "new_patient_01.fcs", single)
    assert output_name_clashes([two_sets, single]) == [[f"{two_sets} (data set a#1)", str(single)]]
    out = tmp_path / "out"
    result = run_cli("gate", "--model", model_file, "--out-dir", out, two_sets, single)
    assert result.returncode == 2
    assert "would write the same gated CSV" in result.stderr and "data set a#1" in result.stderr
    assert not out.exists()


def test_gate_refuses_names_that_differ_only_in_case(model_file, tmp_path):
    upper, lower = tmp_path / "x" / "Patient 7.fcs", tmp_path / "y" / "patient 7.fcs"
    for path in (upper, lower):
        path.parent.mkdir()
        shutil.copy(NEW / "new_patient_01.fcs", path)
    result = run_cli("gate", "--model", model_file, "--out-dir", tmp_path / "out", upper, lower)
    assert result.returncode == 2
    assert str(upper) in result.stderr and str(lower) in result.stderr
    assert not (tmp_path / "out").exists()


def test_gate_file_names_its_output_by_the_unicode_rule(model_file, tmp_path):
    from gating_core.model import GatingModel

    path = tmp_path / "Ångström 01.fcs"
    shutil.copy(NEW / "new_patient_01.fcs", path)
    (tmp_path / "out").mkdir()
    [record] = gate_file(GatingModel.load(model_file), path, tmp_path / "out")
    assert Path(record["output"]).name == "Ångström_01.gated.csv"
