"""Bad inputs end a command with ``error: <file>: <problem>`` and a non-zero status, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from gating_core.batch.distributed import ClusterError
from gating_core.errors import GatingCoreError
from gating_core.fcs import FCSError
from gating_core.gates import GateError, GateImportError
from gating_core.io.labels import LabelError
from gating_core.library import LibraryError, PatientLibrary
from gating_core.model.file_checks import ModelFileError
from gating_core.model.result import ChannelMismatchError
from helpers import quick_model_file, run_cli

UNDECODABLE = os.fsdecode(b"x\xff")  # a file name that is not UTF-8 (surrogateescape on Linux)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return quick_model_file(tmp_path_factory.mktemp("errors"))


def _bad_inputs(model_path: Path, sample_data_dir: Path, folder: Path) -> dict:
    """name -> CLI arguments that must fail cleanly."""
    fcs = sample_data_dir / "patient_01.fcs"
    truncated = folder / "truncated.npz"
    truncated.write_bytes(model_path.read_bytes()[:3000])
    with np.load(model_path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    meta["format_version"] = "1"
    arrays["meta"] = np.array(json.dumps(meta))
    bad_json = folder / "bad_json.npz"
    np.savez(bad_json, **arrays)
    meta["format_version"] = 1
    arrays["meta"] = np.array("[" * 100_000 + "]" * 100_000)
    deep_json = folder / "deep_json.npz"
    np.savez(deep_json, **arrays)
    undecodable = folder / (UNDECODABLE + ".fcs")
    shutil.copy(fcs, undecodable)
    not_fcs = folder / "notes.fcs"
    not_fcs.write_text("these are notes, not events\n" * 10)
    short = folder / "short"
    short.mkdir()
    for i in (1, 2, 3):
        shutil.copy(sample_data_dir / f"patient_0{i}.fcs", short)
        lines = (sample_data_dir / f"patient_0{i}.labels.csv").read_text().splitlines()
        (short / f"patient_0{i}.labels.csv").write_text("\n".join(lines[:100]) + "\n")
    a_file = folder / "a_file"
    a_file.write_text("x")
    out = folder / "out"
    return {
        "gate with a truncated model": ["gate", "--model", truncated, "--out-dir", out, fcs],
        "gate with format_version a string": ["gate", "--model", bad_json, "--out-dir", out, fcs],
        "gate with deeply nested JSON": ["gate", "--model", deep_json, "--out-dir", out, fcs],
        "gate with an FCS file as model": ["gate", "--model", fcs, "--out-dir", out, fcs],
        "gate into a file": ["gate", "--model", model_path, "--out-dir", a_file, fcs],
        "gate with a non-UTF-8 model name": ["gate", "--model", os.fsencode(folder) + b"/m\xff.npz",
                                             "--out-dir", out, fcs],
        "library import of a non-UTF-8 file name": ["library", "--path", folder / "lib", "import", undecodable],
        "library import with a non-UTF-8 name": ["library", "--path", folder / "lib2", "import", "--name",
                                                 b"p\xfe", fcs],
        "library in a non-UTF-8 folder": ["library", "--path", os.fsencode(folder) + b"/lib\xff", "import", fcs],
        "train on a non-FCS file": ["train", "--no-selection", "--out", folder / "m.npz", not_fcs],
        "evaluate with labels of the wrong length": ["evaluate", "--no-selection", *sorted(short.glob("*.fcs"))],
        "info on a folder": ["info", folder],
    }


def test_bad_inputs_give_one_error_line_and_no_traceback(model_path, sample_data_dir, tmp_path):
    failures = []
    for name, args in _bad_inputs(model_path, sample_data_dir, tmp_path).items():
        result = run_cli(*args, text=False)  # the output may name files that are not UTF-8
        stderr = result.stderr.decode("utf-8", "replace")
        if result.returncode == 0 or "Traceback" in stderr or not stderr.startswith("error: "):
            failures.append(f"{name}: exit {result.returncode}\n{stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_error_messages_name_the_file_and_the_problem(model_path, sample_data_dir, tmp_path):
    cases = _bad_inputs(model_path, sample_data_dir, tmp_path)
    stderr = run_cli(*cases["gate with format_version a string"], text=False).stderr.decode()
    assert stderr.startswith(f"error: {tmp_path / 'bad_json.npz'}: model description: format_version must be")
    stderr = run_cli(*cases["library import of a non-UTF-8 file name"], text=False).stderr.decode()
    assert stderr.startswith("error: x\\xff.fcs: the file name is not valid UTF-8")
    stderr = run_cli(*cases["gate into a file"], text=False).stderr.decode()
    assert stderr.startswith("error: ") and stderr.rstrip().endswith("a_file: --out-dir names a file, not a folder")


def test_errors_name_the_path_given_so_that_files_of_one_name_are_told_apart(sample_data_dir, tmp_path):
    """Two inputs called x.fcs in different folders: each error names its own, as typed."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.fcs").write_bytes(b"garbage")
    shutil.copy(sample_data_dir / "patient_01.fcs", tmp_path / "b" / "x.fcs")  # no labels beside it
    train = run_cli("train", "--out", "m.npz", "a/x.fcs", "b/x.fcs", cwd=tmp_path)
    assert train.returncode == 1 and "Traceback" not in train.stderr
    lines = train.stderr.splitlines()
    assert "error: a/x.fcs: file is 7 bytes long, too short to hold an FCS HEADER (58 bytes)" in lines
    assert any(line.startswith("error: b/x.labels.csv: labels file is missing") for line in lines)
    info = run_cli("info", "a/x.fcs", cwd=tmp_path)
    assert info.returncode == 1 and info.stderr.startswith("error: a/x.fcs: file is 7 bytes long")
    gate = run_cli("gate", "--model", "a/x.fcs", "--out-dir", "out", "b/x.fcs", cwd=tmp_path)
    assert gate.returncode == 1 and gate.stderr.startswith("error: a/x.fcs: not a gating model file")


@pytest.mark.skipif(sys.platform != "linux", reason="/proc, which takes no new file for any user, is Linux's")
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(model_path, sample_data_dir, tmp_path):
    """/proc takes no new files for any user, root included: the refusal comes before training
    or gating, and names the folder given, not a temporary file."""
    fcs = sample_data_dir / "new" / "new_patient_01.fcs"
    train = run_cli("train", "--out", "/proc/model.npz", sample_data_dir / "patient_01.fcs")
    assert train.returncode == 1 and train.stderr.startswith("error: /proc/model.npz: cannot write into the folder /proc")
    gate = run_cli("gate", "--model", model_path, "--out-dir", "/proc/gated", fcs)
    assert gate.returncode == 1 and gate.stderr.startswith("error: /proc/gated: cannot create the output folder")
    # a folder in the way of a gated file: said as such, the other patients gated
    out = tmp_path / "out"
    (out / "new_patient_01.gated.csv").mkdir(parents=True)
    both = run_cli("gate", "--model", model_path, "--out-dir", out, fcs, sample_data_dir / "new" / "new_patient_02.fcs")
    assert both.returncode == 1 and "Traceback" not in both.stderr
    assert f"error: {fcs}: cannot write {out / 'new_patient_01.gated.csv'}: a folder of that name is " \
           "in the way" in both.stderr
    assert (out / "new_patient_02.gated.csv").is_file()
    # a folder made for the outputs and left empty, every patient failing, is not left behind
    none = run_cli("gate", "--model", model_path, "--out-dir", tmp_path / "made", sample_data_dir / "patient_01.labels.csv")
    assert none.returncode == 1 and not (tmp_path / "made").exists()
    (tmp_path / "there").mkdir()  # one that was there before stays, empty or not
    none = run_cli("gate", "--model", model_path, "--out-dir", tmp_path / "there", sample_data_dir / "patient_01.labels.csv")
    assert none.returncode == 1 and (tmp_path / "there").is_dir()


def test_every_input_error_shares_one_root_and_keeps_its_old_base():
    from gating_core.errors import CatalogVersionError, ConflictError, GroupsError

    for error, old_base in [(FCSError, Exception), (ModelFileError, Exception), (LabelError, ValueError),
                            (LibraryError, Exception), (ChannelMismatchError, ValueError), (GateError, ValueError),
                            (GateImportError, ValueError), (ClusterError, RuntimeError), (GroupsError, ValueError),
                            (ConflictError, LibraryError), (CatalogVersionError, RuntimeError)]:
        assert issubclass(error, GatingCoreError) and issubclass(error, old_base), error


# Where each error was defined before gating_core.errors held them all: those imports keep working.
OLD_HOMES = {"gating_core.fcs": ["FCSError"], "gating_core.fcs.sample": ["FCSError"],
             "gating_core.io.labels": ["LabelError"], "gating_core.method.groups": ["GroupsError"],
             "gating_core.gates": ["GateError", "GateImportError"],
             "gating_core.gates.errors": ["GateError", "GateImportError"],
             "gating_core.model.result": ["ChannelMismatchError"], "gating_core.model.file_checks": ["ModelFileError"],
             "gating_core.library": ["LibraryError", "ConflictError"],
             "gating_core.library.common": ["LibraryError", "ConflictError"],
             "gating_core.library.catalog": ["CatalogVersionError"], "gating_core.batch.distributed": ["ClusterError"],
             "gating_core": ["FCSError", "LabelError", "GateError", "ChannelMismatchError", "GatingCoreError"]}


def test_every_error_class_is_defined_in_errors_py_with_a_one_line_docstring():
    import ast
    import importlib
    import inspect

    from gating_core import errors

    classes = {name: value for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, GatingCoreError)}
    assert len(classes) >= 13
    for name, cls in classes.items():
        assert cls.__module__ == "gating_core.errors", name
        doc = inspect.getdoc(cls) if "__doc__" in vars(cls) else None
        assert doc and "\n" not in doc, f"{name}: wants a one-line docstring"
    # No module of the library defines an error class of its own: a class deriving from one of
    # gating_core.errors' classes anywhere else would escape the one exceptions module.
    root = Path(errors.__file__).parent
    elsewhere = []
    for path in root.rglob("*.py"):
        if path.name == "errors.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & set(classes):
                    elsewhere.append(f"{path.relative_to(root)}: {node.name}")
    assert elsewhere == []
    for module, names in OLD_HOMES.items():
        for name in names:
            assert getattr(importlib.import_module(module), name) is classes[name], f"{module}.{name}"


def test_library_refuses_a_non_utf8_file_name_with_a_library_error(sample_data_dir, tmp_path):
    undecodable = tmp_path / (UNDECODABLE + ".fcs")
    shutil.copy(sample_data_dir / "patient_01.fcs", undecodable)
    library = PatientLibrary(tmp_path / "lib")
    with pytest.raises(LibraryError, match="not valid UTF-8"):
        library.import_files([undecodable])
    assert library.patients() == []


def test_evaluate_reads_its_inputs_after_the_method_names(tmp_path):
    """`evaluate --method lda trees a.fcs b.fcs`, as the usage line reads: the files are the
    inputs, not method names; a misspelled name is refused as one."""
    from gating_core.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["evaluate", "--method", "lda", "trees", "a.fcs", "b/c.fcs"])
    assert args.method == ["lda", "trees"] and args.method_inputs == ["a.fcs", "b/c.fcs"] and args.inputs == []
    args = parser.parse_args(["evaluate", "--protocol", "patient", "x.fcs", "--method", "lda"])
    assert args.method == ["lda"] and args.inputs == ["x.fcs"]
    args = parser.parse_args(["evaluate", "a.fcs", "--method", "lda", "b.fcs"])  # in the order given
    assert args.inputs == ["a.fcs", "b.fcs"] and not getattr(args, "method_inputs", None)
    for wrong in (["--method", "treez", "a.fcs"], ["--method", "lda", "treez", "a.fcs"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["evaluate", *wrong])
    done = run_cli("evaluate", "--method", "lda")
    assert done.returncode == 2 and "give at least one INPUT" in done.stderr
