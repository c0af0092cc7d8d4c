"""Landmark (peak) registration, ``align="landmarks"``: peaks moved onto the reference, the skip
rule, the model file, determinism and the command line."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.method.landmark_alignment import (MAX_PEAKS, LandmarkReference, LandmarkRegistration, SkipRule,
                                                   channel_peaks)
from helpers import sample_cohort


def _bimodal(rng, n, low=-1.0, high=1.5, share_high=0.3, width=0.25):
    """One channel of n cells: a negative and a positive population."""
    high_cells = rng.random(n) < share_high
    return np.where(high_cells, rng.normal(high, width, n), rng.normal(low, width, n))


def _reference_patients(seed=0, n=6000, count=5):
    """Training patients of two channels: bimodal, and one population only."""
    rng = np.random.default_rng(seed)
    return [np.column_stack([_bimodal(rng, n, share_high=rng.uniform(0.2, 0.4)), rng.normal(0.3, 0.4, n)])
            for _ in range(count)]


def test_channel_peaks_finds_the_populations_and_ignores_cell_order():
    rng = np.random.default_rng(1)
    values = _bimodal(rng, 8000)
    positions, masses = channel_peaks(values)
    np.testing.assert_allclose(positions, [-1.0, 1.5], atol=0.05)
    np.testing.assert_allclose(masses, [0.7, 0.3], atol=0.03)
    again = channel_peaks(rng.permutation(values))
    np.testing.assert_array_equal(again[0], positions)  # a histogram: the order of cells is irrelevant
    # a small bump (1% of the cells) is no population; a pile of identical values is one
    with_bump = np.concatenate([values, rng.normal(4.0, 0.1, 80)])
    assert len(channel_peaks(with_bump)[0]) == 2
    piled = np.concatenate([np.zeros(5000), rng.normal(2.0, 0.3, 2000)])
    np.testing.assert_allclose(channel_peaks(piled)[0], [0.0, 2.0], atol=0.05)
    assert len(channel_peaks(np.array([]))[0]) == 0


def test_registration_moves_a_shifted_channels_peaks_onto_the_reference():
    patients = _reference_patients()
    reference = LandmarkReference.fit(patients)
    np.testing.assert_allclose(reference.peaks[0], [-1.0, 1.5], atol=0.06)
    np.testing.assert_allclose(reference.peaks[1], [0.3], atol=0.06)
    rng = np.random.default_rng(7)
    # another instrument: channel 0 stretched and offset, channel 1 offset
    measured = np.column_stack([1.4 * _bimodal(rng, 6000) + 0.6, rng.normal(0.3, 0.4, 6000) - 0.8])
    registration = reference.registration(measured)
    assert registration.skipped == [None, None] and registration.registered_channels.all()
    back = registration.transform(measured)
    assert back.dtype == np.float32 and back.shape == measured.shape
    # the patient's peaks land on the reference peaks exactly...
    np.testing.assert_allclose(registration.sources[0], [-1.0 * 1.4 + 0.6, 1.5 * 1.4 + 0.6], atol=0.08)
    for j in range(2):
        peaks = np.full((len(registration.sources[j]), 2), np.nan)
        peaks[:, j] = registration.sources[j]
        np.testing.assert_allclose(registration.transform(np.nan_to_num(peaks))[:, j], reference.peaks[j], atol=1e-5)
    # ... and the registered cells' peaks are found there again (a stretched population is
    # squeezed on its inner side only: its mode moves by a fraction of the smoothing width)
    for j in range(2):
        np.testing.assert_allclose(channel_peaks(back[:, j])[0], reference.peaks[j], atol=0.1)
    # one peak: a plain shift (the spread is kept)
    np.testing.assert_allclose(np.std(back[:, 1]), np.std(measured[:, 1]), rtol=1e-5)
    # the warp is monotone and a shift beyond the outer peaks
    column = np.linspace(-5, 8, 200)[:, None].repeat(2, axis=1)
    warped = registration.transform(column)
    assert np.all(np.diff(warped[:, 0]) > 0)
    src, ref = registration.sources[0], registration.targets[0]
    np.testing.assert_allclose(warped[-1, 0] - column[-1, 0], ref[-1] - src[-1], atol=1e-5)
    np.testing.assert_allclose(warped[0, 0] - column[0, 0], ref[0] - src[0], atol=1e-5)


def test_the_skip_rule_leaves_unmatched_channels_as_they_are():
    reference = LandmarkReference.fit(_reference_patients())
    rng = np.random.default_rng(11)
    # channel 0 lacks its positive population: one peak where the reference has two
    lacking = np.column_stack([rng.normal(-0.4, 0.25, 5000), rng.normal(0.5, 0.4, 5000)])
    registration = reference.registration(lacking)
    assert registration.skipped[0] == "1 peaks, reference 2"
    assert registration.skipped[1] is None
    out = registration.transform(lacking)
    np.testing.assert_array_equal(out[:, 0], lacking[:, 0].astype(np.float32))
    # without the rule that peak is matched to one reference peak and the channel moves
    unruled = LandmarkReference(reference.peaks, reference.agreement, reference.spread, SkipRule.off())
    assert unruled.registration(lacking).registered_channels[0]
    # two peaks, both of the negative side (a split negative, no positive population): as many
    # peaks as the reference, but the upper one would land on the positive population
    split = np.column_stack([np.concatenate([rng.normal(-2.4, 0.2, 3000), rng.normal(-1.1, 0.2, 3000)]),
                             rng.normal(0.3, 0.4, 6000)])
    assert reference.registration(split).skipped[0] == "a peak is nearer another reference peak"
    assert unruled.registration(split).registered_channels[0]
    # a gap three times as wide as the reference's is no instrument's doing
    stretched = np.column_stack([_bimodal(rng, 6000, low=-1.0, high=7.0), rng.normal(0.3, 0.4, 6000)])
    assert reference.registration(stretched).skipped[0] == "the warp would stretch a gap too far"
    assert unruled.registration(stretched).registered_channels[0]


def test_a_channel_without_stable_peaks_is_never_registered():
    rng = np.random.default_rng(5)
    # channel 0: two peaks in two patients, one in two others, three in the fifth
    patients = []
    for count in (2, 2, 1, 1, 3):
        centres = {1: [0.0], 2: [-1.0, 1.5], 3: [-2.0, 0.0, 2.0]}[count]
        values = np.concatenate([rng.normal(c, 0.2, 2000) for c in centres])
        patients.append(np.column_stack([values, rng.normal(0, 0.4, len(values))]))
    reference = LandmarkReference.fit(patients)
    assert reference.agreement[0] == pytest.approx(0.4)
    registration = reference.registration(patients[0])
    assert registration.skipped[0] == "no stable reference peaks"
    table, counts = reference.as_arrays()
    assert table.shape == (2, MAX_PEAKS) and list(counts) == [0, 1]  # the file keeps no unusable peaks
    loaded = LandmarkReference.from_arrays(table, counts)
    assert loaded.registration(patients[0]).skipped[0] == "no stable reference peaks"


def test_landmark_registration_checks_its_input():
    with pytest.raises(ValueError, match="increasing"):
        LandmarkRegistration([np.array([1.0, 0.0])], [np.array([0.0, 1.0])])
    with pytest.raises(ValueError, match="increasing"):
        LandmarkReference([np.array([0.5, 0.5])])
    with pytest.raises(ValueError, match="counts"):
        LandmarkReference.from_arrays(np.zeros((2, MAX_PEAKS)), np.array([1, MAX_PEAKS + 1]))
    with pytest.raises(ValueError, match="no cells"):
        LandmarkReference.fit(_reference_patients(count=2)).registration(np.empty((0, 2)))


@pytest.fixture(scope="module")
def small_centers():
    from gating_core.synthetic import simulate_centers

    cohort, centers = simulate_centers(3, 2, seed=5, n_events=2500, strength=1.5)
    return [c[0] for c in cohort], [c[1] for c in cohort], centers


@pytest.fixture(scope="module")
def landmark_model(small_centers):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    return ResearchGatingModel(select=False, align="landmarks", cells_per_patient=1500,
                       adaptive_weight=0.0).fit(samples[:4], labels[:4])


def test_a_landmark_registered_model_round_trips_and_gates_identically(small_centers, landmark_model, tmp_path):
    from gating_core.model.research import ResearchGatingModel
    from gating_core.model.file_checks import ModelFileError

    samples, labels, _ = small_centers
    model = landmark_model
    assert model.reference_quantiles_ is None
    assert len(model.reference_landmarks_.peaks) == len(model.channels_)
    new = samples[5]
    result = model.gate(new)
    np.testing.assert_array_equal(model.gate(new, chunk_size=300).populations, result.populations)
    registration, _, _ = model._patient_frame(new.events, model._channel_indices(new))
    assert isinstance(registration, LandmarkRegistration) and registration.registered_channels.any()
    path = tmp_path / "landmarks.npz"
    model.save(path)
    loaded = ResearchGatingModel.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(new), model.predict_proba(new))
    np.testing.assert_array_equal(loaded.gate(new).populations, result.populations)
    np.testing.assert_array_equal(loaded.standardised_cells(new), model.standardised_cells(new))
    arrays = dict(np.load(path))
    table, counts = arrays["reference_peaks"], arrays["reference_peak_counts"]
    assert table.shape == (len(model.channels_), MAX_PEAKS) and counts.dtype.kind == "i"
    # damaged files are refused, naming the problem
    j = int(np.argmax(counts))
    assert counts[j] >= 2, "the simulated panel has a channel with two peaks"
    bad = dict(arrays, reference_peaks=table.copy())
    bad["reference_peaks"][j, :counts[j]] = bad["reference_peaks"][j, :counts[j]][::-1]
    np.savez_compressed(tmp_path / "bad.npz", **bad)
    with pytest.raises(ModelFileError, match="'reference_peaks' are not increasing"):
        ResearchGatingModel.load(tmp_path / "bad.npz")
    np.savez_compressed(tmp_path / "counts.npz", **dict(arrays, reference_peak_counts=counts + MAX_PEAKS))
    with pytest.raises(ModelFileError, match="'reference_peak_counts' outside"):
        ResearchGatingModel.load(tmp_path / "counts.npz")
    np.savez_compressed(tmp_path / "shape.npz", **dict(arrays, reference_peaks=table[:, :2].copy()))
    with pytest.raises(ModelFileError, match="'reference_peaks' has shape"):
        ResearchGatingModel.load(tmp_path / "shape.npz")
    np.savez_compressed(tmp_path / "missing.npz", **{k: v for k, v in arrays.items() if k != "reference_peak_counts"})
    with pytest.raises(ModelFileError, match="no array 'reference_peak_counts'"):
        ResearchGatingModel.load(tmp_path / "missing.npz")


def test_landmark_registration_is_deterministic(small_centers, landmark_model):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    again = ResearchGatingModel(**landmark_model.get_params()).fit(samples[:4], labels[:4])
    for a, b in zip(again.reference_landmarks_.as_arrays(), landmark_model.reference_landmarks_.as_arrays()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again.predict_proba(samples[5]), landmark_model.predict_proba(samples[5]))


def test_the_command_line_offers_the_alignments():
    import argparse

    from gating_core.commands import evaluate, model_options, train
    from gating_core.method import alignment

    assert model_options.ALIGNMENTS == alignment.ALIGNMENTS
    assert "marginal-landmarks" in evaluate.EVALUATION_METHODS
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    train.register(subparsers)
    evaluate.register(subparsers)
    for command in (["train", "--out", "m.npz", "x.fcs"], ["evaluate", "x.fcs"]):
        args = parser.parse_args(command + ["--align", "landmarks"])
        assert model_options._model_params(args)["align"] == "landmarks"
        assert "align" not in model_options._model_params(parser.parse_args(command))
    args = parser.parse_args(["train", "--out", "m.npz", "--method", "iw-nystroem", "--align", "quantile", "x.fcs"])
    assert train._iw_model(args) == 2  # a usage error: iw-nystroem registers nothing


def test_real_batches_skip_the_channel_whose_peaks_change(multicenter_dir):
    """Shared CyTOF samples: batch B's raised CD4 background leaves one CD4 peak (the monocytes'
    dim one) where batch A has two; trained on A, B's CD4 is left as it is, its CD14, CD8 and
    CD3 are registered."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from multicenter_data import load_multicenter

    from gating_core.model.research import ResearchGatingModel

    samples, labels, _, batches = load_multicenter(multicenter_dir)
    a = [i for i, b in enumerate(batches) if b == "A"][:4]
    b = [i for i, x in enumerate(batches) if x == "B"][0]
    model = ResearchGatingModel(cells_per_patient=500, embedding_cells=8000, class_balance=0.0, align="landmarks")
    model.standardised_training_cells([samples[i] for i in a], [labels[i] for i in a])
    sample = samples[b]
    registration = model._chosen_cells(sample.events, model._channel_indices(sample))[0]
    skipped = dict(zip(model.channels_, registration.skipped))
    assert skipped["CD4"] is not None and "reference 2" in skipped["CD4"]
    assert all(skipped[c] is None for c in ("CD14", "CD8", "CD3"))


def test_streamed_gating_registers_as_model_gate(sample_data_dir):
    """Gating a file chunk by chunk (``gate`` on large files) registers each patient from the
    same content-chosen cells as gating it whole."""
    from gating_core.fcs import read_fcs, stream_fcs_all
    from gating_core.model.research import ResearchGatingModel

    model = ResearchGatingModel(select=False, n_features=128, n_embedding_features=32, cells_per_patient=1000,
                        embedding_cells=3000, align="landmarks", random_state=3).fit(
        *sample_cohort(range(5, 9)))
    path = sample_data_dir / "new" / "new_patient_02.fcs"
    result = model.gate(read_fcs(path, compensate=True), chunk_size=2048)
    stream = stream_fcs_all(path, compensate=True)[0]
    codes = []
    model.gate_chunks(stream.sample, stream.chunks, chunk_size=2048, sink=lambda start, events, c, p: codes.append(c))
    np.testing.assert_array_equal(np.asarray(model.gated_populations(), dtype=object)[np.concatenate(codes)],
                                  result.populations)
