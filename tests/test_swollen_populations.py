"""Rare populations the adapted populations let swell: told from one that moved, and gated by
the transfer model's column in the patient where they swelled."""

import json
import zipfile

import numpy as np
import pytest

from gating_core.fcs import Channel, Sample
from gating_core.method.self_training import PatientAdjustment
from gating_core.method.swollen_populations import (PARTING_SHARE, RARE_SHARE, SWELL_FACTOR, called_shares,
                                                     disagreement_beside, largest_shares, swollen_populations)
from gating_core.method.ties import call_weights
from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.model.research import ResearchGatingModel
from modelfile_helpers import rewrite_model_file


def test_a_swollen_rare_population_is_told_from_one_that_moved_or_grew_in_training():
    prior = [0.01, 0.01, 0.01, 0.01, 0.01, 0.6]
    largest = [0.012, 0.012, 0.012, 0.012, 0.04, 0.7]
    # swelled (the transfer model near the prior); moved (the adapted populations near the prior,
    # the transfer model lost it); within twice the largest share; swelled but the transfer model
    # further still; within twice a training patient that had 4%; large
    adapted = [0.03, 0.011, 0.02, 0.03, 0.07, 0.95]
    transfer = [0.012, 0.001, 0.01, 0.0001, 0.01, 0.6]
    assert swollen_populations(prior, largest, adapted, transfer).tolist() == [True, False, False, False, False,
                                                                                False]
    assert (RARE_SHARE, SWELL_FACTOR) == (0.05, 2.0)
    # rare is below RARE_SHARE in every training patient; swollen beyond SWELL_FACTOR times the largest
    assert swollen_populations([0.02], [0.049], [0.099], [0.02]).tolist() == [True]
    assert swollen_populations([0.02], [0.049], [0.098], [0.02]).tolist() == [False]
    assert swollen_populations([0.02], [0.05], [0.101], [0.02]).tolist() == [False]
    assert swollen_populations([0.01], [0.05], [0.1], [0.01]).tolist() == [False]
    # A catch-all under 5% of the training cells but 12% of one training patient, which the
    # adapted populations call on 58% of a new one (88% of it), the transfer model on 33%: no
    # rare population, whichever half is right.
    assert swollen_populations([0.047], [0.119], [0.58], [0.33]).tolist() == [False]
    # A new center's monocytes moved and grew: 4% of the training cells, 6.6% of one training
    # patient, 19% of the new one by the adapted populations, 6% by the transfer model.
    assert swollen_populations([0.04], [0.066], [0.19], [0.06]).tolist() == [False]
    # a population the transfer model calls on no cell counts as a millionth
    assert swollen_populations([0.01], [0.01], [0.03], [0.0]).tolist() == [False]


def test_the_shares_called_and_the_largest_training_share():
    proba = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.6, 0.3], [0.0, 0.4, 0.6]])
    np.testing.assert_array_equal(called_shares(proba), [0.25, 0.5, 0.25])
    np.testing.assert_array_equal(called_shares(np.zeros((0, 3))), [0.0, 0.0, 0.0])
    labels = [np.array(["a", "a", "b", "c"]), np.array(["a", "b", "b", "b", "b"]), np.array([], dtype=str)]
    np.testing.assert_allclose(largest_shares(labels, ["a", "b", "c"]), [0.5, 0.8, 0.25])


def test_a_tied_cell_counts_evenly_to_the_tied_populations_whatever_their_order():
    # the adapted populations' two fits each sure of another population: 0.5 / 0.5 (within the
    # float32 rounding of the mean), and a three-way tie
    proba = np.array([[0.5, 0.5, 0.0], [0.0, 0.5000001, 0.4999999], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.8, 0.1]],
                     np.float32)
    np.testing.assert_allclose(call_weights(proba), [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3],
                                                     [0.0, 1.0, 0.0]], rtol=0, atol=1e-12)
    expected = [0.5 / 4 + 1 / 12, 0.5 / 4 + 0.5 / 4 + 1 / 12 + 1 / 4, 0.5 / 4 + 1 / 12]
    np.testing.assert_allclose(called_shares(proba), expected, rtol=0, atol=1e-12)
    assert call_weights(np.zeros((0, 3))).shape == (0, 3)
    # by argmax the first two cells would count to the first tied population, and reordering the
    # populations would move the shares
    order = [2, 0, 1]
    np.testing.assert_allclose(called_shares(proba[:, order]), np.asarray(expected)[order], rtol=0, atol=1e-12)


def _one_hot(calls, k=3):
    return np.eye(k, dtype=np.float32)[np.asarray(calls)]


def test_the_disagreement_beside_the_swollen_populations():
    transfer = _one_hot([0, 1, 1, 2, 2, 2, 0, 0])
    adapted = _one_hot([0, 2, 1, 1, 2, 0, 1, 0])
    # beside population 1: the cells neither half calls 1 are 0, 4, 5 and 7; they differ on 5
    assert disagreement_beside(transfer, adapted, [False, True, False]) == pytest.approx(0.25)
    # beside nothing: every cell, 4 of 8 differ
    assert disagreement_beside(transfer, adapted, [False, False, False]) == pytest.approx(0.5)
    # every cell called one of them by a half, or no cell: nothing to count
    assert disagreement_beside(transfer, adapted, [True, True, False]) == 0.0
    assert disagreement_beside(np.zeros((0, 2)), np.zeros((0, 2)), [False, True]) == 0.0
    assert PARTING_SHARE == 0.2


def test_a_tie_of_the_adapted_populations_parts_the_halves_by_its_expected_count():
    transfer = _one_hot([0, 0, 2, 2])
    # cell 0: the adapted populations tie 0 / 2 (the transfer model calls 0): beside population 1,
    # half a cell agreeing and half disagreeing; cell 1: a tie 0 / 1 (1 the swollen one): half of
    # it counted, agreeing; cells 2 and 3 untied, one agreeing and one not
    adapted = np.array([[0.5, 0.0, 0.5], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], np.float32)
    swollen = [False, True, False]
    assert disagreement_beside(transfer, adapted, swollen) == pytest.approx(1.5 / 3.5)
    # the same whatever order the populations are listed in (by argmax, the first tie would agree
    # in this order and disagree in the reverse one)
    order = [2, 1, 0]
    assert disagreement_beside(transfer[:, order], adapted[:, order],
                               np.asarray(swollen)[order]) == pytest.approx(1.5 / 3.5)
    # a cell whose only tie is with the swollen population, as the one cell left: half a cell
    # counted, and the halves agree on it
    assert disagreement_beside(transfer[1:2], adapted[1:2], swollen) == 0.0


def test_mixing_takes_the_transfer_columns_from_the_transfer_model_alone():
    class Adapted(PatientAdjustment):
        def adapted(self, cells):
            return np.array([[0.1, 0.9, 0.0], [0.5, 0.5, 0.0]], np.float32)

    transfer = np.array([[0.8, 0.1, 0.1], [0.2, 0.2, 0.6]], np.float32)
    adjust = Adapted(gaussians=object())
    np.testing.assert_allclose(adjust.mix(transfer.copy(), None, 0.75),
                               [[0.275, 0.7, 0.025], [0.425, 0.425, 0.15]], atol=1e-6)
    # the second population's column from the transfer model: (0.275, 0.1, 0.025) and
    # (0.425, 0.2, 0.15), each normalised
    adjust.transfer_columns = np.array([False, True, False])
    mixed = adjust.mix(transfer.copy(), None, 0.75)
    np.testing.assert_allclose(mixed, [[0.275 / 0.4, 0.1 / 0.4, 0.025 / 0.4], [0.425 / 0.775, 0.2 / 0.775,
                                                                                 0.15 / 0.775]], atol=1e-6)
    assert mixed.dtype == np.float32


def _patient(name, rng, spread=1.0, n=6000):
    """A large cluster whose cells stretch to the right into a continuum, the experts' edge at
    x = 2 cutting its last percent off as 'rare'; a second large cluster 'big' apart. ``spread``
    widens the continuum, and the rare cells with it."""
    k = rng.choice(2, size=n, p=(0.5, 0.5))
    x = np.where(k == 0, rng.normal(0, spread, n), rng.normal(8, 0.7, n))
    y = np.where(k == 0, rng.normal(0, 1.0, n), rng.normal(5, 0.7, n))
    labels = np.where(k == 0, np.where(x > 2.0, "rare", "rest"), "big")
    cells = (np.column_stack([x, y]) * 100 + 1000).astype(np.float32)
    return Sample(name, cells, [Channel("FSC-A"), Channel("SSC-A")]), labels


@pytest.fixture(scope="module")
def continuum():
    rng = np.random.default_rng(0)
    training = [_patient(f"p{i}", rng) for i in range(5)]
    model = GatingModel(random_state=0).fit([s for s, _ in training], [y for _, y in training],
                                            groups=["a", "a", "b", "b", "b"])
    return model, training, _patient("wide", rng, spread=1.3)


def _rare_f1(model, sample, truth):
    called = np.asarray(model.populations_)[np.argmax(model.predict_proba(sample), axis=1)]
    right = np.sum((called == "rare") & (truth == "rare"))
    return 2 * right / (np.sum(called == "rare") + np.sum(truth == "rare"))


def test_a_rare_population_swollen_in_a_new_patient_is_gated_by_the_transfer_model(continuum, tmp_path):
    model, training, (wide, truth) = continuum
    assert model.populations_ == ["big", "rare", "rest"] and 0.0 < model.adaptive_weight_ < 1.0
    # the largest share among the training cells the model drew from each patient
    _, drawn = model.standardised_training_cells([s for s, _ in training], [y for _, y in training])
    shares = [[np.mean(y == p) for p in model.populations_] for y in drawn]
    np.testing.assert_allclose(model.largest_shares_, np.max(shares, axis=0), atol=1e-12)
    assert 0.008 < model.largest_shares_[1] < 0.016
    largest = model.largest_shares_
    # The wider continuum holds 3.5% rare cells; the adapted populations' Gaussian for them
    # reaches back over the edge and calls about twice that, the transfer model about the truth.
    assert 0.03 < np.mean(truth == "rare") < 0.04
    adjust = model._patient_parts(wide)[2]
    assert adjust.transfer_columns.tolist() == [False, True, False]
    checked = _rare_f1(model, wide, truth)
    model.largest_shares_ = None  # as a model without the check gates it
    try:
        assert model._patient_parts(wide)[2].transfer_columns is None
        plain = _rare_f1(model, wide, truth)
    finally:
        model.largest_shares_ = largest
    assert checked > 0.93 and plain < 0.9
    # A patient like the training ones: nothing swelled, the plain mix.
    assert model._patient_parts(training[0][0])[2].transfer_columns is None
    # The review flag's disagreement is computed with the check, from the same cells.
    assert model.gate(wide).novelty.disagreement == pytest.approx(adjust.disagreement)


def test_no_column_is_taken_where_the_halves_part_ways_beside_it(continuum, monkeypatch):
    model, _, (wide, _) = continuum
    adjust = model._patient_parts(wide)[2]
    assert adjust.transfer_columns.tolist() == [False, True, False]
    transfer, adapted = model._halves(*_chosen_and_embedding(model, wide), adjust)
    calls_a = np.argmax(adapted, axis=1)
    # the halves agree on the wide patient's cells beside the swollen population
    assert disagreement_beside(transfer, adapted, [False, True, False]) < 0.02
    # A transfer model that does not fit the patient: it calls a third of the cells the adapted
    # populations call 'big' 'rest' instead (the rare population's shares as before).
    big = np.flatnonzero(calls_a == 0)
    moved = big[: len(calls_a) // 3]
    lost = transfer.copy()
    lost[moved] = np.array([0.0, 0.0, 1.0], np.float32)
    assert disagreement_beside(lost, adapted, [False, True, False]) > PARTING_SHARE
    # the rare population still swelled by the shares alone: only the condition leaves the mix plain
    assert swollen_populations(model.class_prior_, model.largest_shares_, called_shares(adapted),
                               called_shares(lost)).tolist() == [False, True, False]
    monkeypatch.setattr(type(model), "_halves", lambda self, chosen, embedding, a: (lost, adapted))
    again = model._patient_parts(wide)[2]
    assert again.transfer_columns is None
    assert again.disagreement == pytest.approx(np.mean(np.argmax(lost, axis=1) != calls_a))


def _chosen_and_embedding(model, sample):
    """The content-chosen cells and embedding gating takes for ``sample``."""
    registration, embedding, chosen = model._patient_frame(sample.events, model._channel_indices(sample))
    return chosen, embedding


def test_the_model_file_keeps_the_largest_shares_and_older_files_gate_without_the_check(continuum, tmp_path):
    model, _, (wide, _) = continuum
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = GatingModel.load(path)
    np.testing.assert_array_equal(loaded.largest_shares_, model.largest_shares_)
    np.testing.assert_array_equal(loaded.predict_proba(wide), model.predict_proba(wide))
    assert loaded.describe()["swollen_check"]
    with zipfile.ZipFile(path) as z:
        arrays = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    meta = json.loads(str(arrays.pop("meta")))
    old = rewrite_model_file(arrays, tmp_path / "old.npz", dict(meta, format_version=11), drop=("largest_shares",))
    older = GatingModel.load(old)
    assert older.largest_shares_ is None and not older.describe()["swollen_check"]
    assert older._patient_parts(wide)[2].transfer_columns is None
    bad = rewrite_model_file({**arrays, "largest_shares": np.array([0.5, 1.5, 0.5])}, tmp_path / "bad.npz", meta)
    with pytest.raises(ModelFileError, match="'largest_shares' holds values outside"):
        GatingModel.load(bad)
    wrong = rewrite_model_file({**arrays, "largest_shares": np.array([0.5, 0.5])}, tmp_path / "wrong.npz", meta)
    with pytest.raises(ModelFileError, match="largest_shares"):
        GatingModel.load(wrong)


def test_the_check_is_a_research_option(continuum):
    _, training, (wide, _) = continuum
    plain = ResearchGatingModel(swollen_check=False, random_state=0).fit(
        [s for s, _ in training], [y for _, y in training], groups=["a", "a", "b", "b", "b"])
    assert plain.largest_shares_ is None and plain._patient_parts(wide)[2].transfer_columns is None
    assert GatingModel.swollen_check and "swollen_check" in GatingModel.RESEARCH_OPTIONS
