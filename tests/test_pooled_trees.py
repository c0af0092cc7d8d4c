"""Pooled gradient-boosted trees beside the transfer model: PooledTrees (scikit-learn's trees held
as arrays), the check that takes them, the mix they enter, the model file."""

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier

from gating_core.method.boosted_trees import PooledTrees
from gating_core.model import GatingModel
from gating_core.model.weight_check import TREES_SHARE, trees_choice
from gating_core.model.file_checks import ModelFileError
from gating_core.model.research import ResearchGatingModel
from helpers import sample_cohort
from modelfile_helpers import rewrite_model_file, saved_arrays


def _cells(seed=0, n=12000):
    """Four channels, one of them whole numbers (ties at the trees' thresholds), and labels that
    need several splits."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 3] = np.round(x[:, 3] * 3)
    labels = np.array(["a", "b", "c", "d"])[(x[:, 0] > 0).astype(int) + 2 * (x[:, 1] ** 2 + x[:, 3] / 3 > 1)]
    return x, labels


def test_the_trees_give_scikit_learns_probabilities():
    x, labels = _cells()
    new, _ = _cells(seed=1, n=3000)
    reference = HistGradientBoostingClassifier(random_state=0).fit(x, labels)
    trees = PooledTrees(random_state=0).fit(x, labels)
    assert list(trees.classes_) == ["a", "b", "c", "d"] and trees.roots_.shape[1] == 4
    np.testing.assert_allclose(trees.proba(new), reference.predict_proba(new), atol=1e-6)
    # Two populations: one score per tree (the second population's log-odds).
    two = np.where(labels < "c", "low", "high")
    reference = HistGradientBoostingClassifier(random_state=0).fit(x, two)
    trees = PooledTrees(random_state=0).fit(x, two)
    assert trees.roots_.shape[1] == 1
    np.testing.assert_allclose(trees.proba(new), reference.predict_proba(new), atol=1e-6)


def test_a_population_the_training_cells_lack_gets_no_probability():
    x, labels = _cells()
    trees = PooledTrees(random_state=0).fit(x, labels, classes=["a", "b", "c", "d", "e"])
    proba = trees.proba(x[:500])
    assert proba.shape == (500, 5) and np.all(proba[:, 4] == 0)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="none of the given populations"):
        PooledTrees().fit(x, labels, classes=["a", "b"])


def _arrays(trees):
    return dict(classes=trees.classes_, columns=trees.columns_, feature=trees.feature_, threshold=trees.threshold_,
                left=trees.left_, right=trees.right_, value=trees.value_, roots=trees.roots_,
                baseline=trees.baseline_, n_channels=4)


def test_trees_read_back_from_their_arrays_and_refuse_arrays_that_are_no_trees():
    x, labels = _cells()
    trees = PooledTrees(random_state=0).fit(x, labels)
    again = PooledTrees.from_arrays(**_arrays(trees))
    np.testing.assert_array_equal(again.proba(x[:2000]), trees.proba(x[:2000]))
    inner = int(np.flatnonzero(trees.left_ != np.arange(len(trees.left_)))[1])
    root = int(trees.roots_[0, 0])
    broken = {
        "a tree points outside its nodes": dict(left=np.where(np.arange(len(trees.left_)) == inner,
                                                              len(trees.left_) + 5, trees.left_)),
        "two parents": dict(left=np.where(np.arange(len(trees.left_)) == inner, root, trees.left_)),  # a loop
        "one child": dict(right=np.where(np.arange(len(trees.right_)) == inner, inner, trees.right_)),
        "channel the model does not have": dict(n_channels=2),
        "populations are not the model's": dict(columns=np.array([0, 1, 2, 2])),
        "one score per population": dict(baseline=trees.baseline_[:2]),
    }
    for message, change in broken.items():
        with pytest.raises(ValueError, match=message):
            PooledTrees.from_arrays(**{**_arrays(trees), **change})
    # One tree of 70 splits in a chain, each with a leaf on its right.
    chain = np.arange(70)
    left = np.concatenate([chain + 1, np.arange(70, 141)])
    left[69] = 140
    right = np.concatenate([chain + 70, np.arange(70, 141)])
    deep = dict(classes=np.array(["a", "b"]), columns=np.array([0, 1]), feature=np.zeros(141, np.int32),
                threshold=np.zeros(141), left=left, right=right, value=np.zeros(141), roots=np.array([[0]]),
                baseline=np.zeros(1), n_channels=4)
    with pytest.raises(ValueError, match="deeper than 64 splits"):
        PooledTrees.from_arrays(**deep)


def test_the_check_takes_trees_only_when_they_score_higher_and_no_fold_falls():
    folds = [0, 0, 1, 1]
    without = [0.90, 0.92, 0.95, 0.96]
    assert trees_choice(without, [0.91, 0.93, 0.95, 0.96], folds)
    assert not trees_choice(without, without, folds)  # a tie leaves them out
    # Higher on average, but the second fold's held-out patients fall.
    assert not trees_choice(without, [0.95, 0.96, 0.949, 0.96], folds)
    # Every fold rises, but the next-to-worst patient falls more than the mean rises.
    assert not trees_choice([0.50, 0.90, 0.90, 0.90], [0.50, 0.85, 0.99, 0.99], folds)


@pytest.fixture(scope="module")
def small_model():
    samples, labels = sample_cohort(range(1, 5))
    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=600,
                        embedding_cells=3000).fit(samples, labels)
    cells = [model.standardised_cells(s) for s in samples]
    trees = PooledTrees(random_state=0).fit(cells, [np.asarray(y).astype(str) for y in labels], model.populations_)
    return model, trees


def test_the_trees_score_only_the_cells_whose_call_they_can_change(small_model):
    model, trees = small_model
    assert 0 < model.adaptive_weight_ < 1
    sample, _ = (x[0] for x in sample_cohort([6]))
    cells, embedding, adjust = model._patient_parts(sample)
    transfer = model._adjusted_proba(cells, embedding, 50_000, adjust, part="transfer")
    plain = model._adjusted_proba(cells, embedding, 50_000, adjust)
    full = adjust.mix((1 - TREES_SHARE) * transfer + TREES_SHARE * trees.proba(cells), cells, model.adaptive_weight_)
    model.pooled_trees_ = trees
    try:
        mixed = model._adjusted_proba(cells, embedding, 50_000, adjust)
    finally:
        model.pooled_trees_ = None
    np.testing.assert_array_equal(np.argmax(mixed, axis=1), np.argmax(full, axis=1))
    scored = np.any(mixed != plain, axis=1)
    assert 0 < scored.mean() < 0.5  # the close calls only
    np.testing.assert_allclose(mixed[scored], full[scored], atol=1e-5)
    # The trees' share of the final mix is bounded, so the rest of the cells keep their call.
    assert np.all(np.abs(full - plain).max(axis=1) <= TREES_SHARE * (1 - model.adaptive_weight_) + 1e-5)


def test_the_trees_survive_the_model_file(small_model, tmp_path):
    model, trees = small_model
    model.pooled_trees_ = trees
    try:
        arrays, meta = saved_arrays(model, tmp_path / "model.npz")
    finally:
        model.pooled_trees_ = None
    loaded = GatingModel.load(tmp_path / "model.npz")
    sample, _ = (x[0] for x in sample_cohort([6]))
    np.testing.assert_array_equal(loaded.pooled_trees_.proba(loaded.standardised_cells(sample)),
                                  trees.proba(model.standardised_cells(sample)))
    assert loaded.describe()["pooled_trees"]
    # A file of an earlier format holds no trees and gates without them.
    older = GatingModel.load(rewrite_model_file(arrays, tmp_path / "old.npz", dict(meta, format_version=13),
                                                drop=[n for n in arrays if n.startswith("trees_")]))
    assert older.pooled_trees_ is None
    np.testing.assert_array_equal(older.predict(sample), model.predict(sample))
    with pytest.raises(ModelFileError, match="lack trees_right"):
        GatingModel.load(rewrite_model_file(arrays, tmp_path / "a.npz", meta, drop=["trees_right"]))
    looped = dict(arrays, trees_left=np.full_like(arrays["trees_left"], int(arrays["trees_roots"][0, 0])))
    with pytest.raises(ModelFileError, match="model file is inconsistent"):
        GatingModel.load(rewrite_model_file(looped, tmp_path / "b.npz", meta))


def test_the_check_records_the_trees_and_can_be_turned_off():
    samples, labels = sample_cohort(range(1, 5))
    settings = dict(select=False, n_features=64, n_embedding_features=16, cells_per_patient=600, embedding_cells=3000)
    model = GatingModel(**settings).fit(samples, labels)
    table = model.selection_["trees"]
    held_out = len(model.selection_["adaptive_weight"]["cv_patient_folds"])
    assert len(table["cv_patients"]) == held_out and table["share"] == TREES_SHARE
    assert table["taken"] == (model.pooled_trees_ is not None)
    off = ResearchGatingModel(trees_check=False, **settings).fit(samples, labels)
    assert "trees" not in off.selection_ and off.pooled_trees_ is None


def test_trees_join_where_the_training_batches_gate_better_with_them(multicenter_dir):
    """Mass cytometry samples of both batches in training: the check's held-out batch gates better
    with the trees, and the two held-out samples are gated as well as without them (within a
    few events of BLAS rounding) and above 0.92."""
    import pandas as pd

    from gating_core.io.inputs import load_labeled_input

    batch = pd.read_csv(multicenter_dir / "groups.csv").set_index("patient")["batch"]
    data = [load_labeled_input(multicenter_dir / f"multicenter_{i:02d}.fcs") for i in range(1, 11)]
    train, held = data[:8], data[8:]
    fit = dict(groups=[str(batch[s.name]) for s, _ in train])
    model = GatingModel().fit([s for s, _ in train], [y for _, y in train], **fit)
    assert model.selection_["trees"]["taken"] and model.pooled_trees_ is not None
    without = ResearchGatingModel(trees_check=False).fit([s for s, _ in train], [y for _, y in train], **fit)
    for sample, labels in held:
        accuracy = np.mean(model.predict(sample) == labels)
        assert accuracy > 0.92 and accuracy >= np.mean(without.predict(sample) == labels) - 0.001


def test_a_file_gated_in_chunks_with_the_trees_is_gated_as_in_memory(small_model, tmp_path):
    import pandas as pd

    from gating_core.batch.files import gate_file
    from helpers import sample_paths

    model, trees = small_model
    model.pooled_trees_ = trees
    try:
        path = sample_paths([6])[0]
        record = gate_file(model, path, tmp_path, chunk_size=7_000)[0]
        sample, _ = (x[0] for x in sample_cohort([6]))
        in_memory = model.gate(sample)
    finally:
        model.pooled_trees_ = None
    assert "error" not in record
    gated = pd.read_csv(record["output"])
    assert np.array_equal(gated["population"].to_numpy().astype(str), np.asarray(in_memory.populations).astype(str))
    np.testing.assert_allclose(gated["confidence"].to_numpy(), in_memory.confidence, atol=1e-4)
    # The trees moved this patient's close calls' confidences: without them the file would differ.
    assert np.abs(model.gate(sample).confidence - in_memory.confidence).max() > 1e-3


def test_arrays_that_share_nodes_or_hold_too_many_trees_are_refused():
    """A model file is a user's input: shared subtrees (2^depth paths to walk), many roots on one
    tree or indices that would wrap are refused before any table is built."""
    x, labels = _cells()
    trees = PooledTrees(random_state=0).fit(x, labels)
    arrays = _arrays(trees)
    inner = int(np.flatnonzero(trees.left_ != np.arange(len(trees.left_)))[1])
    both_to_one = dict(right=np.where(np.arange(len(trees.right_)) == inner, trees.left_[inner], trees.right_))
    with pytest.raises(ValueError, match="two parents"):
        PooledTrees.from_arrays(**{**arrays, **both_to_one})
    same_root = np.full_like(trees.roots_, trees.roots_[0, 0])
    with pytest.raises(ValueError, match="two parents"):
        PooledTrees.from_arrays(**{**arrays, "roots": same_root})
    n = 20_004  # 5,001 iterations of four one-leaf trees
    stumps = dict(feature=np.zeros(n, np.int32), threshold=np.zeros(n), left=np.arange(n), right=np.arange(n),
                  value=np.zeros(n), roots=np.arange(n).reshape(-1, 4))
    with pytest.raises(ValueError, match="20004 trees; a model holds at most 20000"):
        PooledTrees.from_arrays(**{**arrays, **stumps})
    few = {name: a[:400] if name != "roots" else a[:100] for name, a in stumps.items()}
    assert PooledTrees.from_arrays(**{**arrays, **few}).proba(x[:10]).shape == (10, 4)
    wrapped = trees.left_.astype(np.int64)
    wrapped[inner] += 2 ** 32
    with pytest.raises(ValueError, match="out of range"):
        PooledTrees.from_arrays(**{**arrays, "left": wrapped})


def test_a_population_of_one_training_cell_is_left_to_the_other_parts():
    x, labels = _cells()
    labels = labels.copy()
    labels[7] = "e"  # one cell: scikit-learn's stratified hold-out could not split it
    trees = PooledTrees(random_state=0).fit(x, labels, classes=["a", "b", "c", "d", "e"])
    assert np.all(trees.proba(x[:100])[:, 4] == 0)


def _tiny_patient_cohort(sizes, seed=0):
    """Patients of ``sizes`` events on three channels, gated by one threshold."""
    from gating_core import Channel, Sample

    rng = np.random.default_rng(seed)
    samples = [Sample(f"p{i}", (rng.normal(size=(n, 3)) * 100 + 500).astype(np.float32),
                      [Channel(c) for c in "ABC"], {}) for i, n in enumerate(sizes)]
    return samples, [np.where(s.events[:, 0] > 500, "a", "b") for s in samples]


def test_a_check_fold_trained_on_a_single_population_is_left_out():
    """A group of one tiny patient held out leaves the other groups to train on; held in, its fold
    trains on one population, which no classifier can learn: that fold is skipped, not the fit."""
    samples, labels = _tiny_patient_cohort([500, 500, 1])
    assert len(np.unique(labels[2])) == 1
    model = GatingModel().fit(samples, labels, groups=["x", "x", "y"])
    table = model.selection_["adaptive_weight"]
    assert table["folds"] == 1 and len(table["skipped_folds"]["folds"]) == 1
    assert table["cv_patient_folds"] == [table["cv_patient_folds"][0]]  # the tiny patient alone held out
    assert np.mean(model.predict(samples[0]) == labels[0]) > 0.9


def test_trees_too_few_cells_to_fit_in_a_fold_are_not_taken():
    samples, labels = _tiny_patient_cohort([500, 500, 3])
    labels[2] = np.array(["a", "b", "b"])  # two populations, one of a single cell
    assert not PooledTrees.can_fit(labels[2]) and PooledTrees.can_fit(labels[:2])
    model = GatingModel().fit(samples, labels, groups=["x", "x", "y"])
    assert model.selection_["adaptive_weight"]["folds"] == 2
    assert model.selection_["trees"]["taken"] is False and model.pooled_trees_ is None
    assert "fewer than two populations" in model.selection_["trees"]["reason"]
    from gating_core.model.summary import pooled_trees_text

    assert pooled_trees_text(model).startswith("not taken: a fold's training cells")
