"""The patient library: round trips, persistence, crash safety, concurrency, bad input, privacy."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gating_core.cli import main as cli_main
from gating_core.fcs import Channel, Sample, read_fcs, write_fcs
from gating_core.library import (
    LibraryError,
    PatientLibrary,
    Provenance,
    identifying_keys,
    is_identifying,
    normalise_name,
    strip_identifying,
)
from helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "library_worker.py"

PNN = ["FSC-A", "SSC-A", "FL1-A", "FL2-A"]
PNS = ["", "", "CD4", "CD8"]
IDENTIFYING = {"$SRC": "Jane Roe", "$FIL": "roe_jane_2024-03-01.fcs", "$SMNO": "S-0042",
               "$OP": "Dr Operator", "PATIENT ID": "MRN-889977", "$DATE": "01-MAR-2024", "$BTIM": "09:12:00",
               "$CYTSN": "R66034500123"}
HARMLESS = {"$CYT": "FACSCanto II", "$P1V": "400"}
NOT_NEEDED = {"$SYS": "Windows 10", "CREATOR": "test suite"}  # harmless, but not needed to read the data


# ---------------------------------------------------------------------------- helpers

def synthetic_events(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 4) float32 events and labels from a fixed rule on them (three populations)."""
    rng = np.random.default_rng(seed)
    events = np.abs(rng.normal(1000, 400, size=(n, 4))).astype(np.float32)
    labels = np.where(events[:, 2] > 1100, "CD4 T cells", np.where(events[:, 3] > 1100, "CD8 T cells", "other"))
    return events, labels


def write_patient(folder: Path, stem: str, n: int = 400, seed: int = 0, labels: bool = True,
                  keywords: dict | None = None) -> tuple[Path, np.ndarray, np.ndarray]:
    """Write ``<stem>.fcs`` (and ``<stem>.labels.csv``); return (path, events, labels)."""
    events, y = synthetic_events(n, seed)
    path = folder / f"{stem}.fcs"
    write_fcs(path, events, PNN, PNS, {**IDENTIFYING, **HARMLESS, **NOT_NEEDED, **(keywords or {})})
    if labels:
        (folder / f"{stem}.labels.csv").write_text("population\n" + "\n".join(y) + "\n")
    return path, events, y


def catalog_dump(library: PatientLibrary) -> list[str]:
    conn = sqlite3.connect(library.catalog_path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def state(library: PatientLibrary) -> tuple:
    """Everything a failed operation must leave unchanged: catalog rows and stored files."""
    return (catalog_dump(library), sorted(p.name for p in library.data_dir.iterdir()),
            sorted(p.name for p in library.tmp_dir.iterdir()))


def run_worker(library: Path, *args: str, pause_at: str | None = None, marker: Path | None = None):
    command = [sys.executable, str(WORKER), str(library), *args]
    if pause_at:
        command += ["--pause-at", pause_at, "--marker", str(marker)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def wait_for(marker: Path, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"worker ended before the pause point: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("worker never reached the pause point")
        time.sleep(0.02)


def kill(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


# ---------------------------------------------------------------------------- round trips

def test_unlabeled_fcs_round_trip_keeps_events_channels_and_keywords(tmp_path):
    path, events, _ = write_patient(tmp_path, "new_patient", labels=False)
    library = PatientLibrary(tmp_path / "lib")
    assert library.import_files([path]) == ["new_patient"]

    info = library.patient("new_patient")
    assert (info.n_events, info.n_channels, info.labeled) == (400, 4, False)
    assert info.channels == PNN and info.markers == PNS
    assert info.sources[0]["role"] == "fcs" and info.sources[0]["path"] == str(path.resolve())

    sample = library.load_sample("new_patient")
    original = read_fcs(path)
    assert sample.events.dtype == original.events.dtype == np.float32
    np.testing.assert_array_equal(sample.events, original.events)
    np.testing.assert_array_equal(sample.events, events)
    assert sample.pnn == PNN and sample.pns == PNS
    assert sample.keywords == original.keywords  # identifying ones included: they stay in the library
    assert sample.name == "new_patient"
    assert library.load_labels("new_patient") is None

    out = tmp_path / "out.fcs"
    library.export_patient("new_patient", out)
    exported = read_fcs(out)
    np.testing.assert_array_equal(exported.events, events)
    assert exported.pnn == PNN and exported.pns == PNS


def test_labeled_fcs_round_trip_to_gated_csv(tmp_path):
    from gating_core.io.export import read_gated_csv

    path, events, labels = write_patient(tmp_path, "p01", n=300, seed=1)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path, tmp_path / "p01.labels.csv"])  # the labels file beside it is accepted

    info = library.patient("p01")
    assert info.label_provenance == Provenance.IMPORTED
    names, counts = np.unique(labels, return_counts=True)
    assert info.populations == dict(zip(names.tolist(), counts.tolist()))
    np.testing.assert_array_equal(library.load_labels("p01"), labels)

    out = tmp_path / "p01.gated.csv"
    library.export_patient("p01", out)
    sample, populations, confidence = read_gated_csv(out)
    np.testing.assert_array_equal(populations, labels)
    np.testing.assert_allclose(sample.events, events, rtol=1e-6)
    assert sample.pnn == PNN
    np.testing.assert_array_equal(confidence, np.ones(300))


def test_export_writes_the_compensated_values_the_patient_is_gated_on(tmp_path, sample_data_dir):
    from gating_core.io.export import read_gated_csv

    path = sample_data_dir / "patient_01.fcs"
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path, sample_data_dir / "patient_01.labels.csv"])
    compensated, raw = read_fcs(path, compensate=True), read_fcs(path)
    assert raw.spillover is not None and not np.allclose(compensated.events, raw.events)
    library.export_patient("patient_01", tmp_path / "p.csv")
    sample, populations, _ = read_gated_csv(tmp_path / "p.csv")
    np.testing.assert_allclose(sample.events, compensated.events, rtol=1e-6, atol=1e-3)
    assert len(populations) == compensated.n_events
    library.export_patient("patient_01", tmp_path / "p.fcs")
    exported = read_fcs(tmp_path / "p.fcs", compensate=True)
    assert exported.spillover is None  # compensated once: no reader compensates them again
    assert exported.pnn == [*compensated.pnn, "population"]  # the labels' codes in a channel of their own
    np.testing.assert_array_equal(exported.events[:, :-1], compensated.events)


def test_gated_csv_import_export_is_equal_to_the_input(tmp_path):
    from gating_core.io.export import read_gated_csv, write_gated_csv

    events, labels = synthetic_events(250, seed=2)
    source = Sample("src", events, [Channel(n, s) for n, s in zip(PNN, PNS)])
    confidence = np.linspace(0.5, 1.0, 250)
    gated = tmp_path / "patient7.gated.csv"
    write_gated_csv(gated, source, labels, confidence)
    first_sample, first_pop, _ = read_gated_csv(gated)

    library = PatientLibrary(tmp_path / "lib")
    assert library.import_files([gated]) == ["patient7"]  # ".gated" is not part of the name
    assert library.patient("patient7").label_provenance == Provenance.GATED_CSV

    again = tmp_path / "again.csv"
    library.export_patient("patient7", again)
    sample, populations, _ = read_gated_csv(again)
    np.testing.assert_array_equal(sample.events, first_sample.events)
    np.testing.assert_array_equal(populations, first_pop)
    assert sample.pnn == first_sample.pnn


def test_cli_import_list_export_remove(tmp_path, capsys):
    from gating_core.io.export import read_gated_csv

    lib = tmp_path / "lib"
    path_a, events_a, labels_a = write_patient(tmp_path, "alpha", seed=3)
    path_b, _, _ = write_patient(tmp_path, "beta", seed=4, labels=False)
    assert cli_main(["library", "--path", str(lib), "import", str(path_a), str(path_b)]) == 0
    printed = capsys.readouterr()
    assert "2 patient(s) added" in printed.out and not printed.err
    # the same file under another name: added, with a warning naming both
    assert cli_main(["library", "--path", str(lib), "import", str(path_b), "--name", "gamma"]) == 0
    assert capsys.readouterr().err.startswith("warning: beta, gamma hold exactly the same events")
    assert cli_main(["library", "--path", str(lib), "remove", "gamma"]) == 0
    capsys.readouterr()

    assert cli_main(["library", "--path", str(lib), "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["n_events"], p["labeled"]) for p in listing] == [("alpha", 400, True),
                                                                          ("beta", 400, False)]
    assert cli_main(["library", "--path", str(lib), "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["patient", "events", "channels"]
    assert table[1].startswith("alpha") and "imported labels" in table[1]

    out = tmp_path / "alpha.csv"
    assert cli_main(["library", "--path", str(lib), "export", "alpha", "--out", str(out)]) == 0
    sample, populations, _ = read_gated_csv(out)
    np.testing.assert_array_equal(populations, labels_a)
    np.testing.assert_allclose(sample.events, events_a, rtol=1e-6)

    # the format is the suffix's: Parquet holds the gated CSV's columns; an unknown suffix is
    # refused, naming the file, and nothing is written
    pytest.importorskip("pyarrow")
    parquet = tmp_path / "alpha.parquet"
    assert cli_main(["library", "--path", str(lib), "export", "alpha", "--out", str(parquet)]) == 0
    table = pd.read_parquet(parquet)
    assert list(table.columns[-2:]) == ["population", "confidence"]
    np.testing.assert_array_equal(table["population"].astype(str), labels_a)
    capsys.readouterr()
    assert cli_main(["library", "--path", str(lib), "export", "alpha", "--out", str(tmp_path / "alpha.xlsx")]) == 1
    assert "alpha.xlsx: cannot be written as .xlsx: the name must end in .csv, .fcs, .parquet, .h5ad" in \
        capsys.readouterr().err
    assert not (tmp_path / "alpha.xlsx").exists()
    assert PatientLibrary(lib).audit_log("alpha", limit=1)[0]["details"]["format"] == "parquet"

    assert cli_main(["library", "--path", str(lib), "remove", "beta"]) == 0
    assert cli_main(["library", "--path", str(lib), "export", "beta", "--out", str(tmp_path / "b.csv")]) == 1
    assert "patient 'beta': not in the library" in capsys.readouterr().err
    assert PatientLibrary(lib).patient_names() == ["alpha"]
    assert cli_main(["library", "--path", str(lib), "check"]) == 0


def test_cli_runs_as_a_module_and_honours_the_environment_variable(tmp_path):
    path, _, _ = write_patient(tmp_path, "envpatient", labels=False)
    env = {"GATING_LIBRARY": str(tmp_path / "from_env")}
    done = run_cli("library", "import", path, env=env)
    assert done.returncode == 0, done.stderr
    assert PatientLibrary(tmp_path / "from_env").patient_names() == ["envpatient"]
    done = run_cli("library", "import", path, env=env)
    assert done.returncode == 1
    assert "envpatient.fcs: patient 'envpatient': is already in the library" in done.stderr


def test_multicenter_file_round_trip(tmp_path, multicenter_dir):
    from gating_core.io.inputs import load_labeled_input

    path = multicenter_dir / "multicenter_01.fcs"
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path])
    sample, labels = load_labeled_input(path, compensate=False)
    stored = library.load_sample("multicenter_01")
    assert stored.events.dtype == sample.events.dtype
    np.testing.assert_array_equal(stored.events, sample.events)
    assert stored.pnn == sample.pnn and stored.pns == sample.pns
    np.testing.assert_array_equal(library.load_labels("multicenter_01"), labels)
    assert library.patient("multicenter_01").populations == {
        "B cells": 2503, "CD4 T cells": 10329, "CD8 T cells": 6305, "Monocytes": 26656, "ungated": 9828}
    out = tmp_path / "mc.fcs"
    library.export_patient("multicenter_01", out)
    np.testing.assert_array_equal(read_fcs(out).events[:, :8], sample.events)


def test_float64_events_and_spillover_survive_and_compensate_on_request(tmp_path):
    rng = np.random.default_rng(5)
    events = rng.normal(500, 100, size=(200, 3))  # float64
    spill = np.array([[1.0, 0.1], [0.05, 1.0]])
    sample = Sample("s", events, [Channel("FSC-A"), Channel("FL1-A", "CD3", 1024.0), Channel("FL2-A", "CD19")],
                    {"$CYT": "x"}, spill, ["FL1-A", "FL2-A"], "3.0")
    library = PatientLibrary(tmp_path / "lib")
    assert library.add_patient(sample, name="  spilled ") == "spilled"

    stored = PatientLibrary(tmp_path / "lib").load_sample("SPILLED")  # names match case-insensitively
    assert stored.events.dtype == np.float64
    np.testing.assert_array_equal(stored.events, events)
    np.testing.assert_array_equal(stored.spillover, spill)
    assert stored.spillover_channels == ["FL1-A", "FL2-A"] and stored.version == "3.0"
    assert stored.channels[1] == Channel("FL1-A", "CD3", 1024.0)
    assert not stored.compensated
    compensated = library.load_sample("spilled", compensate=True)
    np.testing.assert_allclose(compensated.events, sample.compensate().events)
    assert compensated.compensated


# ---------------------------------------------------------------------------- persistence

def test_everything_survives_a_restart(tmp_path):
    lib_dir = tmp_path / "lib"
    path, events, labels = write_patient(tmp_path, "p1", labels=False)
    library = PatientLibrary(lib_dir)
    library.import_files([path])
    drawn = np.where(events[:, 0] > 1000, "big", "small")
    library.save_gates("p1", {"name": "root", "children": [{"name": "big", "x": [1, 2, 3]}]})
    library.set_labels("p1", drawn, Provenance.DRAWN, source="gate tree v1")

    model_file = tmp_path / "model.npz"
    np.savez(model_file, weights=np.arange(6.0).reshape(2, 3), meta=np.array('{"method": "marginal"}'))
    model_id = library.add_model(model_file, "cd4 model", ["p1", "someone gone"],
                                 {"mean_accuracy": np.float64(0.93), "per_patient": [0.9, 0.96]}, "marginal")
    auto = np.where(events[:, 1] > 1000, "big", "small")
    confidence = np.linspace(0, 1, len(auto))
    result_id = library.save_gate_result("p1", model_id, auto, confidence, {"novelty": {"is_novel": False}})
    del library

    reopened = PatientLibrary(lib_dir)
    assert reopened.load_gates("p1") == {"name": "root", "children": [{"name": "big", "x": [1, 2, 3]}]}
    np.testing.assert_array_equal(reopened.load_labels("p1"), drawn)
    [model] = reopened.models()
    assert (model.id, model.name, model.version, model.method) == (model_id, "cd4 model", 1, "marginal")
    assert model.training_patients == ["p1", "someone gone"]
    assert model.evaluation == {"mean_accuracy": 0.93, "per_patient": [0.9, 0.96]}
    assert reopened.model_path(model_id).read_bytes() == model_file.read_bytes()
    result = reopened.load_gate_result("p1")
    assert (result.id, result.model_id, result.status) == (result_id, model_id, "pending")
    np.testing.assert_array_equal(result.populations, auto)
    np.testing.assert_allclose(result.confidence, confidence, rtol=1e-7)
    assert result.details == {"novelty": {"is_novel": False}}
    # a list of patients carries the novelty it was stored with, the result's file unread
    assert reopened.patient("p1").gate_result == {"id": result_id, "model_id": model_id, "status": "pending",
                                                  "created_at": result.created_at, "novelty": {"is_novel": False}}

    # accept after review with one correction: provenance and model are recorded
    reviewed = auto.copy()
    reviewed[0] = "small" if auto[0] == "big" else "big"
    reopened.accept_gate_result("p1", reviewed)
    third = PatientLibrary(lib_dir)
    np.testing.assert_array_equal(third.load_labels("p1"), reviewed)
    info = third.patient("p1")
    assert (info.label_provenance, info.label_model_id) == (Provenance.AUTO_ACCEPTED, model_id)
    history = third.label_history("p1")
    assert [h["provenance"] for h in history] == [Provenance.DRAWN, Provenance.AUTO_ACCEPTED]
    assert [h["current"] for h in history] == [False, True]
    assert history[1]["source"] == f"gate result {result_id} (edited in review)"
    assert third.load_gate_result("p1").status == "accepted"

    actions = [(e["action"], e["patient"], e["model_id"]) for e in third.audit_log()]
    assert actions == [("import", "p1", None), ("save gates", "p1", None), ("set labels", "p1", None),
                       ("add model", None, model_id), ("auto-gate", "p1", model_id),
                       ("accept auto-gate", "p1", model_id)]
    assert third.check() == []


def test_a_second_model_with_the_same_name_gets_the_next_version(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    model_file = tmp_path / "m.npz"
    np.savez(model_file, w=np.zeros(3))
    first = library.add_model(model_file, "panel A", [], {}, "pooling")
    second = library.add_model(model_file, "panel A", [], {}, "marginal")
    assert [(m.id, m.version) for m in library.models()] == [(first, 1), (second, 2)]
    library.remove_model(first)
    assert [m.id for m in library.models()] == [second]
    with pytest.raises(LibraryError, match="no model with id"):
        library.model_path(first)
    assert library.check() == []


def test_training_set_from_the_library(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    expected = {}
    for i in range(3):
        events, labels = synthetic_events(100 + 10 * i, seed=10 + i)
        spill = np.array([[1.0, 0.2], [0.0, 1.0]])
        sample = Sample(f"t{i}", events, [Channel(n, s) for n, s in zip(PNN, PNS)], {}, spill, ["FL1-A", "FL2-A"])
        library.add_patient(sample, labels if i < 2 else None)
        expected[f"t{i}"] = (sample.compensate().events, labels)
    samples, labels = library.load_training_set()
    assert [s.name for s in samples] == ["t0", "t1"]  # the unlabeled patient is left out
    for s, y in zip(samples, labels):
        np.testing.assert_allclose(s.events, expected[s.name][0])
        assert s.compensated
        np.testing.assert_array_equal(y, expected[s.name][1])
    assert [s.name for s, _ in library.labeled_patients()] == ["t0", "t1"]
    only, _ = library.load_training_set(["T1"])
    assert [s.name for s in only] == ["t1"]
    with pytest.raises(LibraryError, match="patient 't2': has no labels"):
        library.load_training_set(["t0", "t2"])


def test_channels_are_renamed_in_place_keeping_labels_and_history(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    events, labels = synthetic_events(100, 0)
    sample = Sample("r", events, [Channel(n, s) for n, s in zip(PNN, PNS)], {}, np.eye(2), ["FL1-A", "FL2-A"])
    library.add_patient(sample, labels)
    library.save_gates("r", {"x": "FL1-A"})
    before = state(library)
    with pytest.raises(LibraryError, match="renaming would give two channels named FL2-A"):
        library.rename_channels("r", {"FL1-A": "FL2-A"})
    with pytest.raises(LibraryError, match="has no channel named 'CD4'"):
        library.rename_channels("r", {"CD4": "x"})
    assert state(library) == before
    assert library.rename_channels("r", {"FL1-A": "CD4-FITC"}) == ["FSC-A", "SSC-A", "CD4-FITC", "FL2-A"]
    reopened = PatientLibrary(tmp_path / "lib").load_sample("r")
    assert reopened.pnn == ["FSC-A", "SSC-A", "CD4-FITC", "FL2-A"] and reopened.pns == PNS
    assert reopened.spillover_channels == ["CD4-FITC", "FL2-A"]
    np.testing.assert_array_equal(reopened.events, events)
    np.testing.assert_array_equal(library.load_labels("r"), labels)
    assert library.load_gates("r") == {"x": "FL1-A"}
    assert library.audit_log("r")[-1]["details"] == {"renamed": {"FL1-A": "CD4-FITC"}}


def test_an_earlier_label_version_is_restored_and_the_restore_can_be_undone(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    events, expert = synthetic_events(300, 1)
    library.add_patient(Sample("p", events, [Channel(n, s) for n, s in zip(PNN, PNS)]), expert)
    library.add_patient(Sample("q", events, [Channel(n, s) for n, s in zip(PNN, PNS)]), expert)
    drawn = np.where(events[:, 0] > 1000, "Cells", "other")
    first = library.label_history("p")[0]["id"]
    second = library.set_labels("p", drawn, Provenance.DRAWN, source="app")
    np.testing.assert_array_equal(library.load_labels("p"), drawn)
    assert library.restore_labels("p", first) == first
    np.testing.assert_array_equal(library.load_labels("p"), expert)
    history = library.label_history("p")
    assert [(h["id"], h["current"]) for h in history] == [(first, True), (second, False)]
    assert history[1]["populations"] == {"Cells": int((events[:, 0] > 1000).sum()),
                                         "other": int((events[:, 0] <= 1000).sum())}
    entry = library.audit_log("p")[-1]
    assert entry["action"] == "restore labels"
    assert entry["details"] == {"labeling_id": first, "replaced_labeling_id": second, "provenance": Provenance.IMPORTED}
    library.restore_labels("p", second)  # the undo of the undo
    np.testing.assert_array_equal(PatientLibrary(tmp_path / "lib").load_labels("p"), drawn)
    before = state(library)
    q_version = library.label_history("q")[0]["id"]
    with pytest.raises(LibraryError, match=f"has no label version {q_version}"):
        library.restore_labels("p", q_version)  # another patient's labels never become p's
    with pytest.raises(LibraryError, match="has no label version 999"):
        library.restore_labels("p", 999)
    assert state(library) == before


def test_display_transforms_are_kept_and_a_damaged_file_reads_as_none(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    assert library.load_display_transforms() == {}
    transforms = {"FL1-A": {"kind": "arcsinh", "cofactor": 500.0, "top": 262144.0, "width": 0.5, "decades": 4.5},
                  "FSC-A": {"kind": "linear", "cofactor": 150.0, "top": 262144.0, "width": 0.5, "decades": 4.5}}
    library.save_display_transforms(transforms)
    assert PatientLibrary(tmp_path / "lib").load_display_transforms() == transforms
    assert not list((tmp_path / "lib" / "tmp").iterdir())  # no temp file left behind
    (tmp_path / "lib" / PatientLibrary.DISPLAY_TRANSFORMS_FILE).write_text("{not json")
    assert library.load_display_transforms() == {}
    assert library.check() == []


def test_axis_ranges_are_kept_and_a_damaged_entry_is_left_out(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    assert library.load_axis_ranges() == {}
    library.save_axis_ranges({"FL1-A": (-200, 1e5), "FSC-A": [0.0, 250000.0]})
    assert PatientLibrary(tmp_path / "lib").load_axis_ranges() == {"FL1-A": (-200.0, 1e5), "FSC-A": (0.0, 250000.0)}
    (tmp_path / "lib" / PatientLibrary.AXIS_RANGES_FILE).write_text(
        '{"A": [1, 2], "B": [2, 1], "C": "wide", "D": [1, null], "E": [0, Infinity]}')
    assert library.load_axis_ranges() == {"A": (1.0, 2.0)}
    (tmp_path / "lib" / PatientLibrary.AXIS_RANGES_FILE).write_text("[1, 2")
    assert library.load_axis_ranges() == {}
    assert library.check() == []


# ---------------------------------------------------------------------------- bad input

def test_duplicate_patient_names_are_refused_and_change_nothing(tmp_path):
    path, _, _ = write_patient(tmp_path, "dup", labels=False)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path])
    before = state(library)
    with pytest.raises(LibraryError) as err:
        library.import_files([path])
    assert str(err.value) == "dup.fcs: patient 'dup': is already in the library (remove it first or choose another name)"
    other, _, _ = write_patient(tmp_path, "other", labels=False)
    with pytest.raises(LibraryError, match="patient 'DUP': is already in the library"):
        library.import_files([other], name="DUP")
    assert state(library) == before


def test_labels_with_the_wrong_row_count_are_refused(tmp_path):
    path, _, labels = write_patient(tmp_path, "short", n=300)
    (tmp_path / "short.labels.csv").write_text("population\n" + "\n".join(labels[:-1]) + "\n")
    library = PatientLibrary(tmp_path / "lib")
    before = state(library)
    with pytest.raises(LibraryError) as err:
        library.import_files([path])
    message = str(err.value)
    assert "short" in message and "299" in message and "300" in message
    assert state(library) == before

    # the same check for labels handed over in memory
    events, y = synthetic_events(50, seed=1)
    sample = Sample("mem", events, [Channel(n) for n in PNN])
    with pytest.raises(LibraryError, match="patient 'mem': 49 labels for 50 events"):
        library.add_patient(sample, y[:49])
    assert state(library) == before


def test_an_unreadable_fcs_aborts_the_whole_import(tmp_path):
    good, _, _ = write_patient(tmp_path, "good", labels=False)
    broken = tmp_path / "broken.fcs"
    broken.write_bytes(b"FCS3.1    garbage that is not an FCS file" * 3)
    library = PatientLibrary(tmp_path / "lib")
    before = state(library)
    with pytest.raises(LibraryError) as err:
        library.import_files([good, broken])
    assert str(err.value).startswith("broken.fcs: ")
    assert state(library) == before
    assert len(library) == 0
    with pytest.raises(LibraryError, match="missing.fcs: file not found"):
        library.import_files([tmp_path / "missing.fcs"])
    with pytest.raises(LibraryError, match="orphan.labels.csv: is a labels file"):
        library.import_files([tmp_path / "orphan.labels.csv"])
    assert state(library) == before


@pytest.mark.parametrize("bad", ["", "   ", "../etc", "a/b", "a\\b", "tab\tname", "x" * 201, ".."])
def test_patient_names_that_are_not_safe_are_refused(tmp_path, bad):
    library = PatientLibrary(tmp_path / "lib")
    events, _ = synthetic_events(10, 0)
    with pytest.raises(LibraryError):
        library.add_patient(Sample("s", events, [Channel(n) for n in PNN]), name=bad)
    assert len(library) == 0 and list(library.data_dir.iterdir()) == []


def test_names_are_stored_not_used_as_paths(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    events, _ = synthetic_events(10, 0)
    name = "Müller, Anna (2024) ; DROP TABLE patients; --"
    assert library.add_patient(Sample("s", events, [Channel(n) for n in PNN]), name=name) == name
    assert library.patient_names() == [name]
    files = sorted(p.name for p in library.data_dir.iterdir())
    assert len(files) == 1 and files[0].endswith(".parquet") and len(files[0]) == 32 + len(".parquet")
    assert normalise_name("  Cafe\u0301 ") == "Café"


def test_model_files_that_could_run_code_are_refused(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    pickled = tmp_path / "evil.npz"
    np.savez(pickled, payload=np.array([{"a": 1}], dtype=object))
    with pytest.raises(LibraryError, match="evil.npz: not a model file"):
        library.add_model(pickled, "evil", [], {}, "marginal")
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(LibraryError, match="notes.npz: not a model file"):
        library.add_model(text, "text", [], {}, "marginal")
    assert library.models() == [] and list(library.data_dir.iterdir()) == []


def test_gate_results_are_checked_before_storing(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    events, labels = synthetic_events(30, 0)
    library.add_patient(Sample("s", events, [Channel(n) for n in PNN]))
    model_file = tmp_path / "m.npz"
    np.savez(model_file, w=np.zeros(2))
    model_id = library.add_model(model_file, "m", ["s"], {}, "marginal")
    before = state(library)
    with pytest.raises(LibraryError, match="model 'nope' is not in the library"):
        library.save_gate_result("s", "nope", labels, np.ones(30))
    with pytest.raises(LibraryError, match=r"confidence values must lie in \[0, 1\]"):
        library.save_gate_result("s", model_id, labels, np.full(30, 1.5))
    with pytest.raises(LibraryError, match="has no auto-gate result to accept"):
        library.accept_gate_result("s")
    with pytest.raises(LibraryError, match="gates are not valid JSON"):
        library.save_gates("s", "{not json")
    assert state(library) == before


def test_a_damaged_or_missing_catalog_is_reported_and_nothing_is_deleted(tmp_path, capsys):
    lib_dir = tmp_path / "lib"
    path, _, _ = write_patient(tmp_path, "p", labels=False)
    PatientLibrary(lib_dir).import_files([path])
    stored = sorted((lib_dir / "data").iterdir())
    catalog = lib_dir / "catalog.sqlite"

    catalog.rename(tmp_path / "catalog.bak")
    with pytest.raises(LibraryError, match="lib: catalog.sqlite is missing but data/ holds stored files"):
        PatientLibrary(lib_dir)
    assert sorted((lib_dir / "data").iterdir()) == stored

    catalog.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LibraryError, match="catalog.sqlite: catalog cannot be opened"):
        PatientLibrary(lib_dir)
    assert sorted((lib_dir / "data").iterdir()) == stored

    (tmp_path / "catalog.bak").replace(catalog)
    assert PatientLibrary(lib_dir).patient_names() == ["p"]

    # the CLI only creates a library on import; --path may also follow the action
    assert cli_main(["library", "list", "--path", str(tmp_path / "typo")]) == 1
    assert "typo: no patient library here" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()
    assert cli_main(["library", "list", "--path", str(lib_dir), "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == ["p"]


# ---------------------------------------------------------------------------- privacy

def test_only_keywords_needed_to_read_the_data_are_not_identifying():
    # an allow-list: whatever is not needed to read the data may identify a person
    for key in ["$SRC", "$FIL", "$SMNO", "$OP", "$PATIENTID", "PATIENT ID", "Patient_Name", "$EXPFILENAME",
                "EXPORT USER NAME", "DOB", "$INST", "$COM", "SUBJECT ID", "donor",
                "$BTIM", "$ETIM", "$CYTSN", "$PLATENAME", "$PLATEID", "$WELLID", "SAMPLE ID",
                "CASE NUMBER", "TUBE NAME", "EXPERIMENT NAME", "$LAST_MODIFIED", "CST BASELINE DATE",
                # names no list of identifying keywords foresees
                "NAME", "PIN", "FINAL PIN", "VIAL ID", "CD AGE", "COLLECTED", "ACQ START", "LOGIN NAME",
                # harmless, but not needed to read the data
                "CREATOR", "$SYS", "LASER1NAME", "$UNSTAINEDINFO"]:
        assert is_identifying(key), key
    for key in ["$CYT", "$P1N", "$P12S", "$SPILLOVER", "SPILL", "$COMP", "$TOT", "$TIMESTEP", "$VOL", "$P1V",
                "$p3f", "$P2CALIBRATION", "$UNSTAINEDCENTERS", "GATING_POPULATION_0", "GATING_DROPPED_KEYWORDS"]:
        assert not is_identifying(key), key
    assert strip_identifying({"$SRC": "a", "$CYT": "b", "CREATOR": "c"}) == {"$CYT": "b"}
    assert identifying_keys({"$SRC": "a", "$CYT": "b", "CREATOR": "c"}) == ["$SRC", "CREATOR"]


def test_fcs_export_leaves_identifying_keywords_out_unless_asked(tmp_path, capsys):
    path, events, _ = write_patient(tmp_path, "private", labels=False)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path])
    assert library.load_sample("private").keywords["$SRC"] == "Jane Roe"  # kept in the library

    plain = tmp_path / "plain.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", "private", "--out", str(plain)]) == 0
    keywords = read_fcs(plain).keywords
    assert not set(IDENTIFYING) & set(keywords)
    assert "Jane Roe" not in plain.read_bytes().decode("latin-1")
    assert "MRN-889977" not in plain.read_bytes().decode("latin-1")
    for key, value in HARMLESS.items():
        assert keywords[key] == value
    assert not set(NOT_NEEDED) & set(keywords)
    assert "dropped 10 keywords not needed to read the data" in capsys.readouterr().out

    full = tmp_path / "full.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", "private", "--out", str(full),
                     "--include-identifying"]) == 0
    keywords = read_fcs(full).keywords
    for key, value in {**IDENTIFYING, **NOT_NEEDED}.items():
        assert keywords[key] == value
    np.testing.assert_array_equal(read_fcs(full).events, events)
    exports = [e["details"] for e in library.audit_log("private") if e["action"] == "export"]
    assert [(e["file"], e["include_identifying"]) for e in exports] == [("plain.fcs", False), ("full.fcs", True)]


def test_labeled_fcs_export_carries_populations_but_not_identity(tmp_path):
    path, events, labels = write_patient(tmp_path, "lab", seed=8)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path])
    out = tmp_path / "lab_out.fcs"
    library.export_patient("lab", out)
    exported = read_fcs(out)
    assert not set(IDENTIFYING) & set(exported.keywords)
    assert "Jane Roe" not in out.read_bytes().decode("latin-1")
    np.testing.assert_array_equal(exported.events[:, :4], events)
    assert exported.n_events == len(labels) and exported.events.shape[1] == 5  # + population channel


# ---------------------------------------------------------------------------- crashes

def _assert_sound(lib_dir: Path, expected_names: list[str]) -> PatientLibrary:
    library = PatientLibrary(lib_dir)  # the next start works and cleans up
    assert library.check() == []
    assert library.patient_names() == expected_names
    assert list(library.tmp_dir.iterdir()) == []
    return library


@pytest.mark.parametrize("stage", ["staged", "files-in-place"])
def test_an_import_killed_midway_leaves_the_library_as_before(tmp_path, stage):
    lib_dir = tmp_path / "lib"
    first, _, _ = write_patient(tmp_path, "kept", seed=1)
    victim, victim_events, victim_labels = write_patient(tmp_path, "victim", n=2000, seed=2)
    library = PatientLibrary(lib_dir)
    library.import_files([first])
    before = catalog_dump(library)

    marker = tmp_path / "paused"
    worker = run_worker(lib_dir, "import", str(victim), pause_at=stage, marker=marker)
    wait_for(marker, worker)
    kill(worker)

    # the dead import left files behind: temp files, and at the later stage renamed data files
    leftovers = list((lib_dir / "tmp").iterdir()) + [
        p for p in (lib_dir / "data").iterdir()
        if p.name not in {Path(r).name for r in _relpaths(lib_dir)}]
    assert leftovers
    assert catalog_dump(library) == before  # nothing of the dead import is visible

    library = _assert_sound(lib_dir, ["kept"])
    assert catalog_dump(library) == before
    library.import_files([victim])  # and the same import now goes through
    np.testing.assert_array_equal(library.load_sample("victim").events, victim_events)
    np.testing.assert_array_equal(library.load_labels("victim"), victim_labels)
    assert library.check() == []


def _relpaths(lib_dir: Path) -> list[str]:
    conn = sqlite3.connect(lib_dir / "catalog.sqlite")
    try:
        return [r[0] for r in conn.execute("SELECT relpath FROM files")]
    finally:
        conn.close()


def test_a_removal_killed_after_its_commit_finishes_cleanly_at_the_next_start(tmp_path):
    lib_dir = tmp_path / "lib"
    path, _, _ = write_patient(tmp_path, "gone", seed=1)
    library = PatientLibrary(lib_dir)
    library.import_files([path])
    marker = tmp_path / "paused"
    worker = run_worker(lib_dir, "remove", "gone", pause_at="committed-before-unlink", marker=marker)
    wait_for(marker, worker)
    kill(worker)
    assert len(list((lib_dir / "data").iterdir())) == 2  # events + labels, no longer referenced
    library = _assert_sound(lib_dir, [])
    assert list(library.data_dir.iterdir()) == []
    assert [e["action"] for e in library.audit_log("gone")] == ["import", "remove"]


def test_imports_killed_at_random_moments_never_leave_a_half_patient(tmp_path):
    lib_dir = tmp_path / "lib"
    PatientLibrary(lib_dir)
    path, events, labels = write_patient(tmp_path, "big", n=200_000, seed=3)
    probe = run_worker(tmp_path / "probe_lib", "import", str(path))
    assert probe.stdout.readline() == "opened\n"
    started = time.monotonic()
    assert probe.wait(timeout=120) == 0
    import_time = time.monotonic() - started  # from library open to the end of the import

    rng = np.random.default_rng(0)
    outcomes = []
    for delay in rng.uniform(0.0, 1.2 * import_time, size=6):
        worker = run_worker(lib_dir, "import", str(path))
        assert worker.stdout.readline() == "opened\n"
        time.sleep(delay)
        if worker.poll() is None:
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except ProcessLookupError:  # it finished between poll() and the signal
                pass
        worker.wait(timeout=30)
        # Only a kill that landed counts as one: the import may finish just before the signal.
        killed = worker.returncode == -signal.SIGKILL
        leftovers = len(list((lib_dir / "tmp").iterdir())) + len(
            {p.name for p in (lib_dir / "data").iterdir()} - {Path(r).name for r in _relpaths(lib_dir)})
        library = PatientLibrary(lib_dir)
        assert library.check() == []
        assert list(library.tmp_dir.iterdir()) == []
        if "big" in library:  # the import committed before the kill: it must be whole
            outcomes.append(("complete", killed, leftovers))
            np.testing.assert_array_equal(library.load_sample("big").events, events)
            np.testing.assert_array_equal(library.load_labels("big"), labels)
            library.remove_patient("big")
        else:
            outcomes.append(("absent", killed, leftovers))
            assert killed and list(library.data_dir.iterdir()) == []
    # at least one kill landed inside an import (and not after it had finished)
    assert any(outcome == "absent" for outcome, _, _ in outcomes), outcomes


# ---------------------------------------------------------------------------- concurrency

def test_two_processes_importing_at_once_both_succeed(tmp_path):
    lib_dir = tmp_path / "fresh_lib"  # both processes also create the catalog at the same time
    files_a = [write_patient(tmp_path, f"a{i}", n=3000, seed=i)[0] for i in range(5)]
    files_b = [write_patient(tmp_path, f"b{i}", n=3000, seed=10 + i, labels=i % 2 == 0)[0] for i in range(5)]
    go = tmp_path / "go"
    worker_a = run_worker(lib_dir, "import", *map(str, files_a), "--one-by-one", "--start-after", str(go))
    worker_b = run_worker(lib_dir, "import", *map(str, files_b), "--one-by-one", "--start-after", str(go))
    assert worker_a.stdout.readline() == worker_b.stdout.readline() == "opened\n"
    go.touch()
    out_a, err_a = worker_a.communicate(timeout=300)
    out_b, err_b = worker_b.communicate(timeout=300)
    assert worker_a.returncode == 0, err_a
    assert worker_b.returncode == 0, err_b

    library = PatientLibrary(lib_dir)
    assert sorted(library.patient_names()) == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]
    assert library.check() == []
    for i in range(5):
        np.testing.assert_array_equal(library.load_sample(f"b{i}").events, synthetic_events(3000, 10 + i)[0])
    assert [p.labeled for p in library.patients() if p.name.startswith("b")] == [True, False, True, False, True]
    assert sum(e["action"] == "import" for e in library.audit_log()) == 10
    with sqlite3.connect(library.catalog_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_two_processes_adding_the_same_name_one_wins(tmp_path):
    lib_dir = tmp_path / "lib"
    PatientLibrary(lib_dir)
    path, events, _ = write_patient(tmp_path, "contested", n=20_000)
    go = tmp_path / "go"
    workers = [run_worker(lib_dir, "import", str(path), "--start-after", str(go)) for _ in range(2)]
    assert [w.stdout.readline() for w in workers] == ["opened\n"] * 2
    go.touch()
    results = [w.communicate(timeout=300) for w in workers]
    codes = sorted(w.returncode for w in workers)
    assert codes == [0, 3], results
    loser = next(out for (out, _), w in zip(results, workers) if w.returncode == 3)
    assert "patient 'contested': is already in the library" in loser
    library = PatientLibrary(lib_dir)
    assert library.patient_names() == ["contested"]
    np.testing.assert_array_equal(library.load_sample("contested").events, events)
    assert library.check() == []


def test_one_library_object_shared_by_threads(tmp_path):
    """Streamlit sessions are threads sharing one cached PatientLibrary."""
    from concurrent.futures import ThreadPoolExecutor

    library = PatientLibrary(tmp_path / "lib")

    def session(k: int) -> list[str]:
        for i in range(3):
            events, labels = synthetic_events(500, seed=100 * k + i)
            library.add_patient(Sample("s", events, [Channel(n) for n in PNN]), labels, name=f"t{k}-{i}",
                                provenance=Provenance.DRAWN)
            library.save_gates(f"t{k}-{i}", {"session": k, "i": i})
        return library.patient_names()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(session, range(4)))
    assert sorted(library.patient_names()) == sorted(f"t{k}-{i}" for k in range(4) for i in range(3))
    for k in range(4):
        for i in range(3):
            assert library.load_gates(f"t{k}-{i}") == {"session": k, "i": i}
            np.testing.assert_array_equal(library.load_labels(f"t{k}-{i}"), synthetic_events(500, 100 * k + i)[1])
    assert library.check() == []


# ---------------------------------------------------------------------------- several sessions at once

def _add(library: PatientLibrary, name: str, seed: int = 0, labeled: bool = True):
    events, labels = synthetic_events(300, seed)
    library.add_patient(Sample("s", events, [Channel(n) for n in PNN]), labels if labeled else None, name=name,
                        provenance=Provenance.DRAWN)
    return labels


def test_the_change_counter_and_patient_versions_move_with_every_change(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    assert library.change_counter() == 0 and library.patient_versions() == {}
    labels = _add(library, "p1")
    _add(library, "p2", labeled=False)
    counter, versions = library.change_counter(), library.patient_versions()
    patient_id, channels, labeling, result, gates = versions["p1"]
    assert channels == tuple(PNN) and labeling == library.current_labeling("p1") and (result, gates) == (None, None)
    assert versions["p2"][2:] == (None, None, None)
    assert (library.change_counter(), library.patient_versions()) == (counter, versions)  # reading changes nothing
    for change in (lambda: library.save_gates("p1", {"gates": []}),
                   lambda: library.set_labels("p2", labels, Provenance.DRAWN),
                   lambda: library.rename_channels("p2", {"FL1-A": "CD4"}),
                   lambda: library.remove_patient("p1")):
        change()
        assert library.change_counter() > counter and library.patient_versions() != versions
        counter, versions = library.change_counter(), library.patient_versions()
    assert list(versions) == ["p2"] and versions["p2"][1] == ("FSC-A", "SSC-A", "CD4", "FL2-A")


def test_labels_replaced_meanwhile_are_not_overwritten_when_the_caller_says_what_it_saw(tmp_path):
    from gating_core.library import ConflictError

    library = PatientLibrary(tmp_path / "lib")
    labels = _add(library, "p1", labeled=False)
    seen = library.current_labeling("p1")
    assert seen is None
    first = library.set_labels("p1", labels, Provenance.AUTO_ACCEPTED, expected_labeling=seen)  # one session
    before = state(library)
    with pytest.raises(ConflictError, match=r"its labels were changed meanwhile by another session \(its labels "
                                            r"are now \"auto-gate accepted after review\", saved "):
        library.set_labels("p1", np.full(len(labels), "other"), Provenance.AUTO_ACCEPTED, expected_labeling=seen)
    assert state(library) == before
    assert library.set_labels("p1", labels, Provenance.DRAWN, expected_labeling=first) > first  # having seen it
    assert library.set_labels("p1", labels, Provenance.DRAWN) > first  # unchecked, as before


def test_run_once_runs_once_across_threads_and_processes_and_again_after_a_failure(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    library = PatientLibrary(tmp_path / "lib")
    runs = []

    def slow():
        time.sleep(0.3)  # long enough for every other caller to arrive meanwhile
        runs.append(1)

    with ThreadPoolExecutor(max_workers=4) as pool:
        ran = list(pool.map(lambda _: PatientLibrary(tmp_path / "lib").run_once("demo-data", slow), range(4)))
    assert sorted(ran) == [False, False, False, True] and runs == [1]
    assert (tmp_path / "lib" / "demo-data.done").is_file()
    script = ("import sys; from gating_core.library import PatientLibrary; "
              "print(PatientLibrary(sys.argv[1]).run_once('demo-data', lambda: None))")
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path / "lib")], capture_output=True, text=True,
                           cwd=REPO, check=True)
    assert other.stdout.strip() == "False"  # another process sees the marker

    def failing():
        raise RuntimeError("no sample data here")

    with pytest.raises(RuntimeError):
        library.run_once("other-work", failing)
    assert library.run_once("other-work", lambda: runs.append(2)) and runs == [1, 2]
    with pytest.raises(ValueError):
        library.run_once("../escape", slow)
    assert library.check() == []


def test_the_same_events_under_two_names_are_found_whatever_their_labels(tmp_path):
    path, _, _ = write_patient(tmp_path, "p1", seed=0)  # labeled
    other, _, _ = write_patient(tmp_path, "p2", seed=1, labels=False)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path, path.with_name("p1.labels.csv"), other])
    assert library.same_events() == []
    # the same FCS file again, without its labels, under another name; then a third copy
    assert library.import_file(path, name="p1 copy") == ["p1 copy"]
    library.add_patient(read_fcs(path), name="p1 again")
    assert [sorted(group) for group in library.same_events()] == [["p1", "p1 again", "p1 copy"]]
    library.remove_patient("p1 copy")
    library.remove_patient("p1 again")
    assert library.same_events() == []


def test_the_same_events_are_found_whatever_parquet_writer_stored_them_and_in_an_older_catalog(tmp_path):
    import pyarrow.parquet as pq

    from gating_core.library.storage import sha256_of

    path, _, _ = write_patient(tmp_path, "p1", seed=0)
    other, _, _ = write_patient(tmp_path, "p2", seed=1, labels=False)
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([path, path.with_name("p1.labels.csv"), other])
    library.import_file(path, name="p1 again")
    conn = sqlite3.connect(library.catalog_path)
    events_files = "SELECT p.name, f.id, f.relpath, f.sha256 FROM patients p JOIN files f ON f.id = p.events_file "
    # another Parquet writer (here another compression) stores the same events in other bytes
    _, file_id, relpath, _ = conn.execute(events_files + "WHERE p.name = 'p1 again'").fetchone()
    stored = library.path / relpath
    pq.write_table(pq.read_table(stored), stored, compression="gzip")
    conn.execute("UPDATE files SET sha256 = ?, size = ? WHERE id = ?", (sha256_of(stored), stored.stat().st_size, file_id))
    conn.commit()
    checksums = {name: sha for name, _, _, sha in conn.execute(events_files)}
    assert checksums["p1"] != checksums["p1 again"]
    assert library.same_events() == [["p1", "p1 again"]] and library.check() == []
    # a catalog an older copy of the program wrote: no digests; opening it adds their table and
    # keeps its schema version, and the first question reads each events file once
    conn.execute("DROP TABLE events_digests")
    conn.commit()
    library = PatientLibrary(library.path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM events_digests").fetchone()[0] == 0
    assert library.same_events() == [["p1", "p1 again"]]
    assert conn.execute("SELECT COUNT(*) FROM events_digests").fetchone()[0] == 3
    library.remove_patient("p1 again")  # its digest goes with its events file
    assert conn.execute("SELECT COUNT(*) FROM events_digests").fetchone()[0] == 2
    assert library.same_events() == [] and library.check() == []
    conn.close()
