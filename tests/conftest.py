"""Shared fixtures: the real-instrument FCS corpus and the shared multicenter data."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("GATING_SHARED_DATA", REPO.parent / "shared" / "data"))
MULTICENTER = SHARED_DATA / "multicenter"
DLBCL = SHARED_DATA / "dlbcl"
SAMPLE_DATA = REPO / "sample_data"
CACHE = REPO / ".cache"
ARTIFACTS = REPO / "test-artifacts"

FCSPARSER_WHEEL = "fcsparser-0.2.8-py2.py3-none-any.whl"


def _obtain_fcsparser_corpus() -> Path:
    """Download the fcsparser 0.2.8 wheel (never imported) and unpack its FCS test files."""
    target = CACHE / "fcsparser-corpus"
    marker = target / ".complete"
    if marker.exists():
        return target / "fcsparser" / "tests" / "data" / "FlowCytometers"
    CACHE.mkdir(exist_ok=True)
    wheel_dir = CACHE / "wheels"
    wheels = list(wheel_dir.glob("fcsparser-0.2.8-*.whl")) if wheel_dir.exists() else []
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--dest", str(wheel_dir), "fcsparser==0.2.8"],
            check=True,
        )
        wheels = list(wheel_dir.glob("fcsparser-0.2.8-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist() if "/tests/data/" in m]
        wheel.extractall(target, members)
    marker.touch()
    return target / "fcsparser" / "tests" / "data" / "FlowCytometers"


@pytest.fixture(scope="session")
def fcs_corpus() -> Path:
    """Folder ``FlowCytometers/`` of real-instrument FCS files from the fcsparser wheel."""
    try:
        return _obtain_fcsparser_corpus()
    except Exception as exc:  # no registry reachable: the corpus tests cannot run here
        if os.environ.get("CI"):
            raise
        pytest.skip(f"fcsparser wheel not obtainable: {exc}")


@pytest.fixture(scope="session")
def multicenter_dir() -> Path:
    """The shared multicenter CyTOF data; tests using it skip when it is absent."""
    if not (MULTICENTER / "multicenter_01.fcs").exists():
        pytest.skip(f"shared multicenter data not found at {MULTICENTER}")
    return MULTICENTER


@pytest.fixture(scope="session")
def dlbcl_dir() -> Path:
    """The shared FlowCAP-I DLBCL biopsies (flow, channel scale, two batches); skip when absent."""
    if not (DLBCL / "dlbcl_01.fcs").exists():
        pytest.skip(f"shared DLBCL data not found at {DLBCL}")
    return DLBCL


@pytest.fixture(scope="session")
def three_centers():
    """A small simulated cohort of three centers x two patients (2,500 events each):
    (samples, labels, center of each patient)."""
    from gating_core.synthetic import simulate_centers

    cohort, center_of = simulate_centers(3, 2, seed=5, n_events=2500, strength=1.5)
    samples = [c[0] for c in cohort]
    return samples, [c[1] for c in cohort], [center_of[s.name] for s in samples]


@pytest.fixture(scope="session")
def sample_data_dir() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A fresh patient library for the app under test (GATING_LIBRARY)."""
    path = tmp_path / "library"
    monkeypatch.setenv("GATING_LIBRARY", str(path))
    return path
