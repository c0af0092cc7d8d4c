"""GatingModel: training, gating, novelty, channel matching, safe save/load."""

import json

import numpy as np
import pytest

from gating_core.model.research import ResearchGatingModel
from gating_core.fcs import Channel, Sample
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.model.result import ChannelMismatchError
from gating_core.synthetic import simulate_patient
from helpers import sample_cohort


@pytest.fixture(scope="module")
def cohort():
    """(samples, labels) of the eight labeled sample patients."""
    return sample_cohort()


@pytest.fixture(scope="module")
def model(cohort):
    samples, labels = cohort
    return GatingModel(random_state=0).fit(list(samples), list(labels))


def test_model_learns_every_population_and_gates_new_patients_accurately(model, sample_data_dir):
    assert model.populations_ == ["B cells", "CD4 T cells", "CD8 T cells", "Debris", "Granulocytes",
                                  "Monocytes", "NK cells", "other"]
    assert model.channels_[:2] == ["FSC-A", "SSC-A"] and len(model.channels_) == 9
    assert model.transform_.kinds[:3] == ["linear", "linear", "arcsinh"]
    from gating_core.fcs import read_fcs
    from gating_core.io.labels import read_labels_csv

    for stem in ("new_patient_01", "new_patient_02"):
        sample = read_fcs(sample_data_dir / "new" / f"{stem}.fcs", compensate=True)
        truth = read_labels_csv(sample_data_dir / "truth" / f"{stem}.labels.csv", sample.n_events)
        result = model.gate(sample)
        assert result.populations.shape == (sample.n_events,)
        assert np.mean(result.populations == truth) > 0.98
        assert result.confidence.min() >= 0 and result.confidence.max() <= 1
        assert sum(result.counts.values()) == sample.n_events
        assert not result.novelty.is_novel


def test_novelty_warning_fires_on_a_strongly_drifted_patient(model, sample_data_dir):
    from gating_core.fcs import read_fcs

    drifted = read_fcs(sample_data_dir / "new" / "new_patient_03.fcs", compensate=True)
    typical = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs", compensate=True)
    assert model.novelty(drifted).is_novel
    assert model.novelty(drifted).score > model.novelty(typical).score
    assert "unlike every training patient" in model.gate(drifted).novelty.message


def test_confidence_is_lower_on_misclassified_cells(model, sample_data_dir):
    """The new patients as measured make one error in 12,000 cells or none; on an instrument
    whose every channel reads 2 or 3 times higher they make a few dozen (measured 37 in
    72,000), and the confidence of those is lower (measured 0.55 against 0.77 on average)."""
    from gating_core.fcs import read_fcs
    from gating_core.io.labels import read_labels_csv

    wrong_confidence, right_confidence = [], []
    for name in ("new_patient_01", "new_patient_02", "new_patient_03"):
        sample = read_fcs(sample_data_dir / "new" / f"{name}.fcs", compensate=True)
        truth = read_labels_csv(sample_data_dir / "truth" / f"{name}.labels.csv", sample.n_events)
        for gain in (2.0, 3.0):
            drifted = Sample(name, sample.events * gain, sample.channels, sample.keywords, compensated=True)
            result = model.gate(drifted)
            wrong = result.populations != truth
            wrong_confidence.append(result.confidence[wrong])
            right_confidence.append(result.confidence[~wrong])
    wrong_confidence, right_confidence = np.concatenate(wrong_confidence), np.concatenate(right_confidence)
    assert wrong_confidence.size > 10
    assert wrong_confidence.mean() < right_confidence.mean() - 0.1


def test_permuting_cells_does_not_change_predictions(model, sample_data_dir):
    from gating_core.fcs import read_fcs

    sample = read_fcs(sample_data_dir / "new" / "new_patient_02.fcs", compensate=True)
    order = np.random.default_rng(0).permutation(sample.n_events)
    shuffled = Sample(sample.name, sample.events[order], sample.channels, sample.keywords, compensated=True)
    a, b = model.gate(sample), model.gate(shuffled)
    # Same embedding, same cells: identical up to float rounding inside BLAS blocks (a cell at
    # an exact tie between two populations could flip; none should here).
    assert np.sum(a.populations[order] != b.populations) <= 1
    np.testing.assert_allclose(a.confidence[order], b.confidence, atol=1e-5)
    assert a.novelty.score == pytest.approx(b.novelty.score, rel=1e-6)


def test_chunk_size_does_not_change_the_result(model, sample_data_dir):
    from gating_core.fcs import read_fcs

    sample = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs", compensate=True)
    a, b = model.gate(sample, chunk_size=997), model.gate(sample, chunk_size=50_000)
    np.testing.assert_array_equal(a.populations, b.populations)
    np.testing.assert_array_equal(a.confidence, b.confidence)


def test_save_load_round_trip_reproduces_predictions_exactly(model, sample_data_dir, tmp_path):
    from gating_core.fcs import read_fcs

    path = tmp_path / "model.npz"
    model.save(path)
    loaded = GatingModel.load(path)
    sample = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs", compensate=True)
    a, b = model.gate(sample), loaded.gate(sample)
    np.testing.assert_array_equal(a.populations, b.populations)
    np.testing.assert_array_equal(a.confidence, b.confidence)
    assert a.novelty.score == b.novelty.score
    assert loaded.describe() == model.describe()
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        assert all(data[k].dtype != object for k in data.files)
    assert meta["format"] == "gating_core.model" and meta["channels"] == model.channels_


def test_loading_foreign_or_damaged_files_gives_a_clear_error(model, tmp_path):
    good = tmp_path / "good.npz"
    model.save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ModelFileError, match="truncated.npz"):
        GatingModel.load(truncated)
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(ModelFileError, match="not a gating model file"):
        GatingModel.load(text)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.ones(3))  # another program's arrays: refused by their names
    with pytest.raises(ModelFileError, match="not a gating model file: it holds a member 'weights.npy'"):
        GatingModel.load(other)
    no_meta = tmp_path / "no_meta.npz"
    np.savez(no_meta, coef=np.ones((3, 3)))
    with pytest.raises(ModelFileError, match="no model description"):
        GatingModel.load(no_meta)
    # An object array (which np.load could only read by unpickling) is refused, not executed.
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, meta=np.array([{"format": "gating_core.model"}], dtype=object))
    with pytest.raises(ModelFileError):
        GatingModel.load(pickled)
    # A tampered description whose arrays no longer match is caught.
    tampered = tmp_path / "tampered.npz"
    with np.load(good, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    meta["channels"] = meta["channels"][:3]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tampered, **arrays)
    with pytest.raises(ModelFileError, match="inconsistent"):
        GatingModel.load(tampered)
    with pytest.raises(ModelFileError, match="file not found"):
        GatingModel.load(tmp_path / "absent.npz")


def test_missing_channel_is_named_in_the_error(model):
    sample, _ = simulate_patient(3, n_events=500)
    channels = list(sample.channels)
    channels[4] = Channel("FL3-H", "")  # CD4 is gone
    broken = Sample("broken", sample.events, channels, compensated=True)
    with pytest.raises(ChannelMismatchError, match=r"broken: missing channel FL3-A \(CD4"):
        model.gate(broken)


def test_channels_are_matched_by_marker_when_names_differ(model, sample_data_dir):
    from gating_core.fcs import read_fcs

    sample = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs", compensate=True)
    renamed = [Channel(f"Detector{i}", c.pns or c.pnn) for i, c in enumerate(sample.channels)]
    other = Sample("renamed", sample.events[:, ::-1].copy(), renamed[::-1], compensated=True)
    np.testing.assert_array_equal(model.gate(sample).populations, model.gate(other).populations)


def test_marginal_transfer_needs_two_patients_and_two_populations(cohort):
    (sample, other), (labels, other_labels) = (part[:2] for part in cohort)
    with pytest.raises(ValueError, match="at least two labeled patients"):
        GatingModel().fit([sample], [labels])
    with pytest.raises(ValueError, match="single population"):
        GatingModel(select=False).fit([sample, other], [np.full(sample.n_events, "x"), np.full(other.n_events, "x")])
    with pytest.raises(ValueError, match="events but"):
        GatingModel().fit([sample, other], [labels[:10], other_labels])


def test_bad_patients_are_refused_naming_the_patient_and_the_problem(cohort, model):
    import dataclasses

    (sample, other), (labels, other_labels) = (part[:2] for part in cohort)
    quick = GatingModel(select=False, n_features=64, cells_per_patient=300)
    for bad, message in ((np.where(np.arange(len(labels)) == 7, None, labels.astype(object)), "1 events have no "
                          "population .* the first at event 7"),
                         (np.where(np.arange(len(labels)) < 3, "", labels), "3 events have no population"),
                         (np.full(len(labels), np.nan), f"{len(labels)} events have no population"),
                         (labels[:, None], r"the labels must be one population name per event, shape \(12000,\), not \(12000, 1\)")):
        with pytest.raises(ValueError, match=f"^{sample.name}: {message}"):
            quick.fit([sample, other], [bad, other_labels])
    empty = dataclasses.replace(sample, events=sample.events[:0])
    with pytest.raises(ValueError, match=f"^{sample.name}: the sample holds no events"):
        quick.fit([empty, other], [labels[:0], other_labels])
    holed = sample.events.copy()
    holed[[5, 9], 3] = np.nan
    holed[9, 4] = np.inf
    with pytest.raises(ValueError, match=f"^{sample.name}: 2 events hold NaN or infinite values \\(channels "
                                         f"{sample.pnn[3]}, {sample.pnn[4]}\\)"):
        model.gate(dataclasses.replace(sample, events=holed))
    with pytest.raises(ValueError, match=f"^{sample.name}: the sample holds no events"):
        model.gate(empty)


def test_pooling_is_the_same_estimator_without_the_embedding(cohort):
    samples, labels = (part[:4] for part in cohort)
    pooling = ResearchGatingModel(method="pooling", select=False).fit(list(samples), list(labels))
    assert pooling.classifier_.use_embedding is False
    assert pooling.classifier_.feature_map_.embedding_weights_ is None
    # Its predictions do not depend on the patient: a cell gets the same label in any context.
    cell = samples[0].compensate().events[:5]
    host_a = Sample("a", np.vstack([cell, samples[1].compensate().events]), samples[1].channels, compensated=True)
    host_b = Sample("b", np.vstack([cell, samples[2].compensate().events]), samples[2].channels, compensated=True)
    np.testing.assert_allclose(pooling.predict_proba(host_a)[:5], pooling.predict_proba(host_b)[:5], atol=1e-6)


def test_selection_is_reproducible_and_recorded(cohort):
    samples, labels = (part[:4] for part in cohort)
    a = GatingModel(random_state=3).fit(list(samples), list(labels))
    b = GatingModel(random_state=3).fit(list(samples), list(labels))
    assert a.selection_["params"] == b.selection_["params"]
    assert 0.9 < a.selection_["cv_accuracy"] <= 1.0
    np.testing.assert_array_equal(a.classifier_.coef_, b.classifier_.coef_)


def test_ellipse_task_marginal_transfer_beats_the_paper_and_pooling():
    """JMLR 2021 synthetic task: N=64 tasks of n=256 points, 10 test tasks (paper: 7.22%)."""
    from gating_core.method.selection import select_hyperparameters
    from gating_core.synthetic import ellipse_task

    rng = np.random.default_rng(2021)
    train_x, train_y = ellipse_task(64, 256, rng)
    test_x, test_y = ellipse_task(10, 256, rng)
    errors = {}
    for use_embedding in (True, False):
        base = MarginalTransferClassifier(use_embedding=use_embedding, cells_per_patient=256, random_state=0)
        chosen = select_hyperparameters(train_x, train_y, base, cells_per_patient=256, cv_repeats=1)
        clf = MarginalTransferClassifier(**{**base.get_params(), **chosen.params}).fit(train_x, train_y)
        errors[use_embedding] = np.mean([np.mean(clf.predict(x) != y.astype(str)) for x, y in zip(test_x, test_y)])
    assert errors[True] <= 0.0722
    assert errors[False] > 0.15
    assert errors[False] > 4 * errors[True]


def test_training_patients_without_a_shared_channel_are_named_with_their_channels():
    rng = np.random.default_rng(0)
    labels = [np.array(["a", "b"] * 50)] * 2
    mass = Sample("mass", rng.normal(size=(100, 2)).astype(np.float32), [Channel("CD3"), Channel("CD19")])
    flow = Sample("flow", rng.normal(size=(100, 2)).astype(np.float32), [Channel("FL1"), Channel("FL2")])
    with pytest.raises(ChannelMismatchError, match=r"share no usable channel \(mass: CD3, CD19; flow: FL1, FL2\)"):
        GatingModel(select=False).fit([mass, flow], labels)
