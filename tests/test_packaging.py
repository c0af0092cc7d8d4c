"""The package as a user installs it: pyproject metadata, public names, import footprint, and a
wheel built from the checkout installed into a fresh virtual environment elsewhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import gating_core

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

# What the library must never pull in: the app's and the cluster's packages.
APP_AND_CLUSTER = ("streamlit", "plotly", "dask", "distributed")


def python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          **kwargs)


def test_import_gating_core_imports_no_app_or_cluster_package():
    # Every public name resolved (so every module they live in imported), then sys.modules checked.
    code = ("import sys, gating_core\n"
            "bare = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'flowkit', 'scipy'))\n"
            "from gating_core import *\n"
            "import gating_core.cli, gating_core.commands.train, gating_core.commands.gate\n"
            "import gating_core.commands.evaluate, gating_core.commands.library_commands\n"
            f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {APP_AND_CLUSTER!r})\n"
            "print(repr((bare, loaded)))")
    result = python(code)
    assert result.returncode == 0, result.stderr
    bare, loaded = eval(result.stdout)
    assert loaded == []
    assert bare == []  # `import gating_core` alone stays light: the CLI's `info` needs no scikit-learn


def test_public_names_resolve_to_their_modules():
    for name in gating_core.__all__:
        assert getattr(gating_core, name) is not None, name
    from gating_core.fcs import read_fcs
    from gating_core.io.interop import from_flowkit, to_anndata
    from gating_core.method.classifier import MarginalTransferClassifier
    from gating_core.model import GatingModel

    assert gating_core.GatingModel is GatingModel and gating_core.read_fcs is read_fcs
    assert gating_core.MarginalTransferClassifier is MarginalTransferClassifier
    assert gating_core.from_flowkit is from_flowkit and gating_core.to_anndata is to_anndata
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        gating_core.not_a_name  # noqa: B018


def test_packages_that_were_modules_keep_their_names_and_load_them_on_first_use():
    # gating_core.model and gating_core.evaluation were modules: what users imported from them
    # still imports, from the module that now defines it, and only when asked for.
    code = ("import sys\n"
            "import gating_core.model.file_checks\n"
            "estimator = 'gating_core.model.estimator' in sys.modules\n"
            "import gating_core.evaluation.held_out\n"
            "print(repr((estimator, 'gating_core.evaluation.protocols' in sys.modules)))\n"
            "from gating_core.model import DEFAULT_POOLED_WEIGHT, METHODS, GatingModel\n"
            "from gating_core.evaluation import leave_one_group_out, summarize\n"
            "print(repr((GatingModel.__module__, leave_one_group_out.__module__, summarize.__module__)))\n"
            "import gating_core.model, gating_core.evaluation\n"
            "print(repr(set(gating_core.model.__all__) <= set(dir(gating_core.model))))\n"
            "try:\n    gating_core.model.not_a_name\nexcept AttributeError as e:\n    print(repr(str(e)))\n")
    result = python(code)
    assert result.returncode == 0, result.stderr
    loaded, modules, listed, missing = map(eval, result.stdout.splitlines())
    assert loaded == (False, False)
    assert modules == ("gating_core.model.estimator", "gating_core.evaluation.protocols",
                       "gating_core.evaluation.protocols")
    assert listed and "no attribute 'not_a_name'" in missing


def test_version_is_defined_once_and_printed_by_the_cli():
    assert re.fullmatch(r"\d+\.\d+\.\d+", gating_core.__version__)
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gating_core.__version__"}
    result = subprocess.run([sys.executable, "-m", "gating_core", "--version"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0
    assert result.stdout.strip() == f"python -m gating_core {gating_core.__version__}"


def test_dependencies_extras_and_console_script():
    project = PYPROJECT["project"]
    names = {re.split(r"[<>=!\[ ]", d)[0].lower() for d in project["dependencies"]}
    assert {"numpy", "scipy", "scikit-learn", "pandas", "pyarrow", "flowio", "flowutils", "flowkit"} <= names
    assert not names & {"streamlit", "plotly", "dask", "anndata"}  # optional: extras only
    extras = project["optional-dependencies"]
    assert {re.split(r"[<>=]", d)[0] for d in extras["app"]} == {"streamlit", "plotly", "pillow"}
    assert extras["dask"] == ["dask[distributed]>=2024.8"]
    assert any(d.startswith("anndata") for d in extras["test"])
    assert project["scripts"] == {"gating-core": "gating_core.cli:main"}
    # requirements.txt still installs the app, through pyproject (one place for the bounds).
    requirements = [line for line in (REPO / "requirements.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
    assert requirements == ["-e .[app,dask]"]
    makefile = (REPO / "Makefile").read_text()
    assert "$(STAMP_RUN): requirements.txt pyproject.toml" in makefile


# ------------------------------------------------------------------------------------ the wheel

def _site_dirs() -> list[Path]:
    """Where this interpreter finds its installed packages (venv site-packages, and any folder a
    .pth file adds, as when a test venv layers itself over another)."""
    dirs = [Path(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages())]
    dirs += [Path(p) for p in sys.path if p.endswith("site-packages")]
    seen, out = set(), []
    for d in dirs:
        if d.is_dir() and d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def _dependency_folder(target: Path) -> Path:
    """A folder of links to this interpreter's installed packages, minus the app, the cluster and
    this project: the fresh venv sees numpy, FlowKit & co. without downloading them again, and
    cannot see streamlit, plotly, dask or the checkout."""
    excluded = re.compile(r"^(_?_?editable_?_?|gating[_-]core|" + "|".join(APP_AND_CLUSTER) + r")([-_.]|$)",
                          re.IGNORECASE)
    target.mkdir()
    for folder in _site_dirs():
        for entry in folder.iterdir():
            if entry.suffix == ".pth" or excluded.match(entry.name) or (target / entry.name).exists():
                continue
            (target / entry.name).symlink_to(entry)
    return target


def _setuptools_builds_wheels() -> bool:
    # setuptools >= 70.1 has bdist_wheel built in; older ones need the `wheel` package too.
    try:
        version = tuple(int(x) for x in metadata.version("setuptools").split(".")[:2])
    except metadata.PackageNotFoundError:
        return False
    return version >= (70, 1)


def test_wheel_installs_in_a_fresh_venv_and_runs_without_streamlit(tmp_path, sample_data_dir):
    # Build from a copy of what the wheel needs, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "gating_core", source / "gating_core", ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "dist")]
    if _setuptools_builds_wheels():
        build.append("--no-build-isolation")  # offline: the test extra brings setuptools
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=600)
    [wheel] = (tmp_path / "dist").glob("gating_core-*.whl")
    assert wheel.name == f"gating_core-{gating_core.__version__}-py3-none-any.whl"
    files = zipfile.ZipFile(wheel).namelist()
    for module in ("gating_core/__init__.py", "gating_core/commands/__init__.py", "gating_core/commands/info.py",
                   "gating_core/library/__init__.py", "gating_core/library/privacy.py", "gating_core/io/interop.py",
                   "gating_core/model/__init__.py", "gating_core/model/estimator.py", "gating_core/method/classifier.py",
                   "gating_core/evaluation/protocols.py", "gating_core/batch/files.py", "gating_core/reports/report.py",
                   "gating_core/fcs/transforms.py"):
        assert module in files
    assert not [f for f in files if f.startswith(("ui/", "pages/", "tests/", "bench/", "app.py"))]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    venv_python = venv / "bin" / "python"
    venv_site = Path(subprocess.run([venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    (venv_site / "installed-dependencies.pth").write_text(f"{_dependency_folder(tmp_path / 'deps')}\n")
    # This interpreter's pip installs into the venv (--python): the wheel alone, from the file.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)

    elsewhere = tmp_path / "elsewhere"  # not the checkout: nothing importable from the cwd
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    def run(*args):
        result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=elsewhere, env=env,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stdout

    script = venv / "bin" / "gating-core"
    assert run(script, "--version").strip() == f"gating-core {gating_core.__version__}"
    [info] = json.loads(run(script, "info", "--json", sample_data_dir / "patient_01.fcs"))
    assert info["n_datasets"] == 1 and info["datasets"][0]["events"] == 12_000
    assert "spillover: yes (7 channels" in run(script, "info", sample_data_dir / "patient_01.fcs")
    probe = ("import importlib.util, sys, gating_core\n"
             "from gating_core import GatingModel, read_fcs, to_flowkit\n"
             "print(gating_core.__file__)\n"
             f"print([m for m in {APP_AND_CLUSTER!r} if importlib.util.find_spec(m)])\n")
    where, importable = run(venv_python, "-c", probe).splitlines()
    assert Path(where).is_relative_to(venv)  # the installed copy, not the checkout
    assert importable == "[]"  # streamlit, plotly and dask are not even installed there


def test_file_notes_are_logged_and_the_library_installs_no_handler(tmp_path, caplog):
    import logging

    import numpy as np

    from gating_core.fcs import read_fcs, write_fcs

    path = tmp_path / "t.fcs"
    write_fcs(path, np.array([[1.0, 10.0], [2.0, 20.0]]), ["Time", "FSC-A"], keywords={"$TIMESTEP": "0"})
    with caplog.at_level(logging.WARNING, logger="gating_core"):
        sample = read_fcs(path)
    [note] = [n for n in sample.notes if "TIMESTEP" in n]
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("gating_core.fcs", logging.WARNING, f"t.fcs: {note}")]
    assert [type(h) for h in logging.getLogger("gating_core").handlers] == [logging.NullHandler]
