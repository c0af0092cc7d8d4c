"""What many test files share: the command line run as a user runs it, the bundled sample
patients read with their labels, and a small model file trained from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gating_core.io.inputs import load_labeled_input

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO / "sample_data"
#: The labeled sample patients: sample_data/patient_01.fcs ... patient_08.fcs.
SAMPLE_PATIENTS = range(1, 9)


def run_cli(*args, cwd=None, env=None, timeout=900, python_options=(), text=True) -> subprocess.CompletedProcess:
    """``python -m gating_core ARGS`` in a fresh interpreter; returns the completed process with
    its output captured (str, or bytes when ``text=False``).

    Arguments may be str, paths, numbers or bytes; bytes reach argv unchanged (file names that
    are not UTF-8). The child imports this checkout whatever ``cwd`` is (default: the
    repository), runs BLAS on one thread (tests share the machine, and BLAS threads that compete
    for it only slow each other down; a fit is the same on one thread or two) and writes UTF-8
    whatever the machine's locale. ``env``: further environment variables. ``python_options``
    go to the interpreter, e.g. ``("-W", "error::RuntimeWarning")``."""
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "LC_ALL": "C.UTF-8",
                   "PYTHONPATH": python_path, **(env or {})}
    return subprocess.run([sys.executable, *python_options, "-m", "gating_core", *argv], capture_output=True,
                          text=text, cwd=cwd or REPO, timeout=timeout, env=environment)


def sample_paths(patients=SAMPLE_PATIENTS) -> list[Path]:
    """The FCS files of the labeled sample patients numbered ``patients`` (1-8), in that order."""
    return [SAMPLE_DATA / f"patient_{number:02d}.fcs" for number in patients]


def sample_cohort(patients=SAMPLE_PATIENTS) -> tuple[list, list]:
    """(samples, labels) of the labeled sample patients numbered ``patients`` (1-8), read as a
    user's labeled input is (``load_labeled_input``: compensated, labels from the labels file).
    Read afresh on every call: a caller may change what it gets."""
    pairs = [load_labeled_input(path) for path in sample_paths(patients)]
    return [sample for sample, _ in pairs], [labels for _, labels in pairs]


def quick_model_file(folder: Path) -> Path:
    """``folder/model.npz``: a small model trained in seconds on sample patients 1-3 (no selection,
    64 features), for tests of files and commands rather than of accuracy."""
    from gating_core.model import GatingModel

    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=300,
                        embedding_cells=1000).fit(*sample_cohort(range(1, 4)))
    path = folder / "model.npz"
    model.save(path)
    return path
