"""Population-balanced training draws (``class_balance``): the allocation, the draw, and how
training, the patient library's digests, the model file and the command line carry it."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.model import DEFAULT_CLASS_BALANCE
from gating_core.model.research import ResearchGatingModel
from gating_core.model.digest import digest_patient, population_allocation, training_rows
from gating_core.synthetic import simulate_patient
from helpers import run_cli


@pytest.mark.parametrize("balance, expected", [
    (0.0, [2700, 270, 30]),    # in proportion to the counts
    (1.0, [2000, 900, 100]),   # 1,000 each; C's and then B's shortfall handed on
    (0.5, [2203, 697, 100]),   # sqrt(counts): 2108.6 / 666.9 / 222.3, C capped, its 122.3 shared 0.76 / 0.24
])
def test_population_allocation(balance, expected):
    allocation = population_allocation([9000, 900, 100], 3000, balance)
    assert allocation.tolist() == expected
    assert allocation.sum() == 3000


def test_population_allocation_edges():
    assert population_allocation([5, 0, 3], 100, 1.0).tolist() == [5, 0, 3]   # fewer cells than asked: all
    assert population_allocation([10, 10, 10], 7, 1.0).tolist() == [3, 2, 2]  # rounding by largest remainder
    assert population_allocation([0, 50], 20, 1.0).tolist() == [0, 20]


def test_the_uniform_draw_is_the_one_training_always_made():
    labels = np.repeat(np.array(["a", "b", "c"]), [9000, 900, 100])
    seed = np.random.SeedSequence([0, 10, 3])
    expected = np.sort(np.random.default_rng(seed).choice(len(labels), 3000, replace=False))
    np.testing.assert_array_equal(training_rows(labels, 3000, np.random.default_rng(seed), 0.0), expected)
    np.testing.assert_array_equal(training_rows(labels[:2000], 3000, np.random.default_rng(seed), 1.0),
                                  np.arange(2000))  # all events when there are fewer than asked


def test_a_balanced_draw_takes_the_allocation_from_each_population():
    rng = np.random.default_rng(5)
    labels = rng.permutation(np.repeat(np.array(["a", "b", "c"]), [9000, 900, 100]))
    rows = training_rows(labels, 3000, np.random.default_rng(1), 1.0)
    assert np.all(np.diff(rows) > 0)  # sorted, no repeats
    names, counts = np.unique(labels[rows], return_counts=True)
    assert dict(zip(names.tolist(), counts.tolist())) == {"a": 2000, "b": 900, "c": 100}


def test_digests_and_training_follow_class_balance():
    sample, labels = simulate_patient(3, n_events=6000, name="p")
    labels = np.asarray(labels)
    uniform = digest_patient(sample, labels, 1000, 2000, seed=0)
    balanced = digest_patient(sample, labels, 1000, 2000, seed=0, class_balance=1.0)
    np.testing.assert_array_equal(uniform.embedding_events, balanced.embedding_events)  # the embedding is untouched
    shares = {p: np.mean(labels == p) for p in np.unique(labels)}
    rare = min(shares, key=shares.get)
    assert np.sum(balanced.train_labels == rare) == min(np.sum(labels == rare), 1000 // len(shares))
    assert np.sum(balanced.train_labels == rare) > 3 * np.sum(uniform.train_labels == rare)
    with pytest.raises(ValueError, match="class_balance"):
        digest_patient(sample, labels, 1000, 2000, class_balance=2.0)

    model = ResearchGatingModel(class_balance=1.0, cells_per_patient=1000, embedding_cells=2000)
    _, drawn = model.standardised_training_cells([sample], [labels])
    expected = digest_patient(sample, labels, 1000, 2000, seed=model.digest_seed(0), class_balance=1.0)
    np.testing.assert_array_equal(drawn[0], expected.train_labels)  # what fit draws for its first patient



def test_the_library_keeps_a_digest_per_class_balance(tmp_path):
    from gating_core.library import PatientLibrary
    from gating_core.library.digest_cache import digest_settings, library_digests

    library = PatientLibrary(tmp_path / "lib")
    for i in range(2):
        sample, labels = simulate_patient((77, i), n_events=3000, name=f"p{i}")
        library.add_patient(sample, labels)
    seed = np.random.SeedSequence([0, 10, 0])
    assert "class_balance" not in digest_settings(500, 1500, seed, True)  # digests stored before it stay valid
    assert digest_settings(500, 1500, seed, True, 1.0)["class_balance"] == 1.0
    uniform, _ = library_digests(library, ResearchGatingModel(cells_per_patient=500, embedding_cells=1500, class_balance=0.0))
    balanced, stats = library_digests(library, ResearchGatingModel(cells_per_patient=500, embedding_cells=1500,
                                                           class_balance=1.0))
    assert stats.misses == 2  # a different draw: not served from the uniform draw's files
    again, stats = library_digests(library, ResearchGatingModel(cells_per_patient=500, embedding_cells=1500,
                                                        class_balance=1.0))
    assert stats.hits == 2
    for a, b in zip(balanced, again):
        np.testing.assert_array_equal(a.train_labels, b.train_labels)
    assert not all(np.array_equal(a.train_labels, b.train_labels) for a, b in zip(uniform, balanced))


def test_the_command_line_default_is_the_model_default_and_bad_values_are_refused(tmp_path):
    from gating_core.commands import model_options

    assert model_options.DEFAULT_CLASS_BALANCE == DEFAULT_CLASS_BALANCE
    done = run_cli("train", "--out", tmp_path / "m.npz", "--class-balance", "1.5", "x.fcs")
    assert done.returncode != 0 and "--class-balance" in done.stderr and "within [0, 1]" in done.stderr
