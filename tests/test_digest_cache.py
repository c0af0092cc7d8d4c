"""Training digests stored in the patient library (gating_core.library.digest_cache)."""

import os

import numpy as np
import pytest

import gating_core.library.storage as storage
from gating_core.library import PatientLibrary
from gating_core.library.digest_cache import DIGEST_DIR, digest_path, digest_settings, library_digests, prune_digests
from gating_core.library.common import Provenance
from gating_core.model import SELECTION_MAX_PATIENTS, GatingModel
from gating_core.synthetic import simulate_patient
from helpers import run_cli


@pytest.fixture
def reads(monkeypatch):
    """Counts of events files and labels files read from the library."""
    counts = {"events": 0, "labels": 0}
    real_events, real_labels = storage.read_events, storage.read_labels

    def read_events(*args, **kwargs):
        counts["events"] += 1
        return real_events(*args, **kwargs)

    def read_labels(*args, **kwargs):
        counts["labels"] += 1
        return real_labels(*args, **kwargs)

    monkeypatch.setattr(storage, "read_events", read_events)
    monkeypatch.setattr(storage, "read_labels", read_labels)
    return counts


def _add(library, i, n_events=3000):
    sample, labels = simulate_patient((77, i), n_events=n_events, name=f"p{i}")
    library.add_patient(sample, labels)
    return sample, labels


def _fresh_digests(library, model, start=0):
    """What training drew before the cache: every patient read, then digested."""
    samples, labels = library.load_training_set(compensate=model.compensate)
    return [model.digest(s, y, start + i) for i, (s, y) in enumerate(zip(samples, labels))]


def _assert_same(got, expected):
    assert [d.name for d in got] == [d.name for d in expected]
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a.train_events, b.train_events)
        np.testing.assert_array_equal(a.train_labels, b.train_labels)
        np.testing.assert_array_equal(a.embedding_events, b.embedding_events)
        assert a.n_events == b.n_events and [c.pnn for c in a.channels] == [c.pnn for c in b.channels]
        assert a.train_events.dtype == b.train_events.dtype


MODEL = GatingModel(cells_per_patient=500, embedding_cells=1500)


def test_cached_digests_equal_fresh_ones_and_a_retrain_reads_only_the_new_patient(tmp_path, reads):
    library = PatientLibrary(tmp_path / "lib")
    for i in range(3):
        _add(library, i)
    cold, stats = library_digests(library, MODEL)
    assert (stats.hits, stats.misses, reads["events"], reads["labels"]) == (0, 3, 3, 3)
    assert len(list((library.path / DIGEST_DIR).glob("*.npz"))) == 3
    assert not list(library.tmp_dir.iterdir())  # temp files renamed into place, none left
    warm, stats = library_digests(library, MODEL)
    assert (stats.hits, stats.misses, reads["events"], reads["labels"]) == (3, 0, 3, 3)
    _add(library, 3)
    reads.update(events=0, labels=0)
    grown, stats = library_digests(library, MODEL)
    assert (stats.hits, stats.misses, reads["events"], reads["labels"]) == (3, 1, 1, 1)
    expected = _fresh_digests(library, MODEL)
    _assert_same(cold, expected[:3])
    _assert_same(warm, expected[:3])
    _assert_same(grown, expected)
    # Compensated as the model compensates: the cached events are the compensated ones.
    assert library.patient("p0").has_spillover
    raw = library.load_sample("p0", compensate=False)
    assert not np.allclose(grown[0].embedding_events, raw.events[: len(grown[0].embedding_events)])


def test_new_labels_settings_or_position_invalidate_and_renames_do_not(tmp_path, reads):
    library = PatientLibrary(tmp_path / "lib")
    for i in range(3):
        _add(library, i)
    library_digests(library, MODEL)
    # Relabeling one patient: only that one is read again, and its digest has the new labels.
    labels = library.load_labels("p1").copy()
    labels[labels == labels[0]] = "relabeled"
    library.set_labels("p1", labels, Provenance.DRAWN)
    reads.update(events=0)
    digests, stats = library_digests(library, MODEL)
    assert (stats.misses, reads["events"]) == (1, 1)
    assert "relabeled" in set(digests[1].train_labels)
    _assert_same(digests, _fresh_digests(library, MODEL))
    # Restoring the old labels is a change again (their file's hash differs from the current one).
    library.restore_labels("p1", library.label_history("p1")[0]["id"])
    digests, stats = library_digests(library, MODEL)
    assert stats.misses == 1 and "relabeled" not in set(digests[1].train_labels)
    # Renaming a channel keeps the digests and shows the new name.
    library.rename_channels("p0", {"FSC-A": "FSC-Area"})
    digests, stats = library_digests(library, MODEL)
    assert stats.hits == 3 and digests[0].channels[0].pnn == "FSC-Area" and digests[1].channels[0].pnn == "FSC-A"
    # Other settings: every patient read, and both settings' files kept side by side.
    other = GatingModel(cells_per_patient=400, embedding_cells=1500)
    reads.update(events=0)
    digests, stats = library_digests(library, other)
    assert (stats.misses, reads["events"]) == (3, 3) and digests[0].train_events.shape[0] == 400
    assert len(list((library.path / DIGEST_DIR).glob("*.npz"))) == 6
    assert library_digests(library, MODEL)[1].hits == 3
    # A patient's position is part of its seed: an earlier input (start=1) redraws everyone.
    digests, stats = library_digests(library, MODEL, start=1)
    assert stats.misses == 3
    _assert_same(digests, _fresh_digests(library, MODEL, start=1))
    assert library_digests(library, MODEL)[1].misses == 3  # back at positions 0, 1, 2
    # Removing a patient: its stored digests (one per setting) go at the next training.
    gone = library.patient("p2").id
    library.remove_patient("p2")
    assert len(list((library.path / DIGEST_DIR).glob(f"{gone}-*.npz"))) == 2
    digests, stats = library_digests(library, MODEL)
    assert stats.hits == 2 and [d.name for d in digests] == ["p0", "p1"]
    assert not list((library.path / DIGEST_DIR).glob(f"{gone}-*.npz"))
    assert len(list((library.path / DIGEST_DIR).glob("*.npz"))) == 4 and prune_digests(library) == []


def test_damaged_or_pickled_digest_files_are_rebuilt_not_trusted(tmp_path, reads):
    library = PatientLibrary(tmp_path / "lib")
    for i in range(2):
        _add(library, i)
    expected, _ = library_digests(library, MODEL)
    info = library.patient("p0")
    path = digest_path(library, info.id, digest_settings(MODEL.cells_per_patient, MODEL.embedding_cells,
                                                         MODEL.digest_seed(0), MODEL.compensate,
                                                         MODEL.class_balance))
    assert path.is_file()
    path.write_bytes(path.read_bytes()[:200])  # truncated
    digests, stats = library_digests(library, MODEL)
    assert stats.misses == 1
    _assert_same(digests, expected)
    # An archive holding an object array (unpickled only with allow_pickle=True): refused, rebuilt.
    with open(path, "wb") as handle:
        np.savez(handle, identity=np.array([{"settings": 1}], dtype=object), train_events=np.zeros((500, 9)))
    digests, stats = library_digests(library, MODEL)
    assert stats.misses == 1
    _assert_same(digests, expected)
    # A digest whose arrays do not fit the patient (here: another patient's file) is refused too.
    other = digest_path(library, library.patient("p1").id, digest_settings(
        MODEL.cells_per_patient, MODEL.embedding_cells, MODEL.digest_seed(1), MODEL.compensate, MODEL.class_balance))
    path.write_bytes(other.read_bytes())
    assert library_digests(library, MODEL)[1].misses == 1


def test_a_library_where_digests_cannot_be_written_still_trains(tmp_path, reads, monkeypatch):
    library = PatientLibrary(tmp_path / "lib")
    for i in range(2):
        _add(library, i)
    real_replace = os.replace

    def failing_replace(src, dst):
        if DIGEST_DIR in str(dst):
            raise PermissionError(13, "Permission denied")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    digests, stats = library_digests(library, MODEL)
    assert stats.misses == 2 and [name for name, _ in stats.not_stored] == ["p0", "p1"]
    assert "Permission denied" in stats.not_stored[0][1]
    assert not list(library.tmp_dir.iterdir())  # the temp files were removed
    _assert_same(digests, _fresh_digests(library, MODEL))


def test_selection_runs_on_a_seeded_subset_of_patients_only_beyond_the_limit():
    model = GatingModel(random_state=3)
    assert model.selection_patients(SELECTION_MAX_PATIENTS) == list(range(SELECTION_MAX_PATIENTS))
    chosen = model.selection_patients(200)
    assert len(chosen) == SELECTION_MAX_PATIENTS == len(set(chosen)) and chosen == sorted(chosen)
    assert 0 <= chosen[0] and chosen[-1] < 200
    assert chosen == GatingModel(random_state=3).selection_patients(200)
    assert chosen != GatingModel(random_state=4).selection_patients(200)


def _arrays(path):
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k != "meta"}


def test_train_library_command_reuses_stored_digests(tmp_path):
    library = PatientLibrary(tmp_path / "lib")
    for i in range(3):
        _add(library, i, n_events=4000)
    first = run_cli("train", "--library", library.path, "--no-selection", "--out", tmp_path / "a.npz")
    assert first.returncode == 0, first.stderr
    assert "Library: 0 patients from stored digests, 3 read" in first.stdout
    _add(library, 3, n_events=4000)
    second = run_cli("train", "--library", library.path, "--no-selection", "--out", tmp_path / "b.npz")
    assert second.returncode == 0, second.stderr
    assert "Library: 3 patients from stored digests, 1 read" in second.stdout
    third = run_cli("train", "--library", library.path, "--no-selection", "--out", tmp_path / "c.npz")
    assert "Library: 4 patients from stored digests, 0 read\n" in third.stdout
    b, c = _arrays(tmp_path / "b.npz"), _arrays(tmp_path / "c.npz")
    # a patient without labels is left out, and said to be
    unlabeled, _ = simulate_patient((77, 9), n_events=2000, name="new_one")
    library.add_patient(unlabeled)
    fourth = run_cli("train", "--library", library.path, "--no-selection", "--out", tmp_path / "d.npz")
    assert fourth.returncode == 0, fourth.stderr
    assert "Library: 4 patients from stored digests, 0 read; 1 without labels left out (new_one)" in fourth.stdout
    assert b.keys() == c.keys()
    for key in b:
        np.testing.assert_array_equal(b[key], c[key], err_msg=key)
