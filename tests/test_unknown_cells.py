"""Cells beyond every training population: PopulationReach, and GatingModel's "unknown" cells."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gating_core.commands import model_options
from gating_core.evaluation import summarize
from gating_core.model import UNKNOWN, GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.method.unknown_cells import UNKNOWN_MARGIN, PopulationReach
from helpers import run_cli, sample_cohort, sample_paths
from modelfile_helpers import rewrite_model_file, saved_arrays

CENTRES = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0]])


def _patient(rng, n=4000, shift=(0.0, 0.0, 0.0), novel=None, novel_share=0.1):
    """Two populations in 3-D (A at the origin, B at (4, 0, 0), sd 0.5 in every direction), both
    moved by ``shift``; with ``novel`` (a centre), a share of cells from a third population there."""
    k = rng.choice(2, size=n, p=(0.6, 0.4))
    cells = CENTRES[k] + np.asarray(shift) + rng.normal(0, 0.5, (n, 3))
    labels = np.where(k == 0, "A", "B").astype(object)
    if novel is not None:
        m = int(novel_share * n)
        cells = np.vstack([cells, np.asarray(novel) + rng.normal(0, 0.5, (m, 3))])
        labels = np.concatenate([labels, np.full(m, "new", dtype=object)])
    return cells, labels


@pytest.fixture(scope="module")
def reach():
    rng = np.random.default_rng(0)
    patients = [_patient(rng, shift=rng.normal(0, 0.2, 3)) for _ in range(4)]
    return PopulationReach().fit([c for c, _ in patients], [y for _, y in patients], ["A", "B"])


def test_reach_is_the_quantile_of_each_populations_own_distances(reach):
    # Gaussian populations in 3-D: the squared Mahalanobis distance of a population's own cells is
    # chi-square with 3 degrees of freedom, whose 0.999 quantile is 16.27 (the reach).
    np.testing.assert_allclose(reach.reach_, 16.27, rtol=0.15)
    assert reach.whitening_.shape == (2, 3, 3) and reach.means_.shape == (2, 3)
    np.testing.assert_allclose(reach.means_, CENTRES, atol=0.35)  # the patients are moved by sd 0.2
    # The typical cell: the chi-square median (2.366) in units of the reach.
    np.testing.assert_allclose(reach.typical_, 2.366 / 16.27, rtol=0.15)


def test_a_far_population_is_unknown_and_the_known_ones_are_not(reach):
    rng = np.random.default_rng(1)
    cells, labels = _patient(rng, novel=(2.0, 6.0, 0.0))
    patient = reach.for_patient(cells, UNKNOWN_MARGIN)
    unknown = reach.unknown(cells, patient)
    assert unknown[labels == "new"].mean() > 0.95
    assert unknown[labels != "new"].mean() < 0.002
    np.testing.assert_allclose(patient.spread, 1.0, atol=0.2)


def test_populations_moved_by_a_batch_are_followed_not_called_unknown(reach):
    rng = np.random.default_rng(2)
    cells, _ = _patient(rng, shift=(0.0, 4.0, 0.0))  # 8 sd of each population, beyond training
    patient = reach.for_patient(cells, UNKNOWN_MARGIN)
    np.testing.assert_allclose(patient.means, CENTRES + [0.0, 4.0, 0.0], atol=0.1)
    assert reach.unknown(cells, patient).mean() < 0.002
    # Judged from the training means instead, the moved populations' cells would be unknown.
    fixed = dataclasses.replace(patient, means=reach.means_)
    assert reach.unknown(cells, fixed).mean() > 0.5


def test_a_patient_spread_wider_widens_the_reach(reach):
    rng = np.random.default_rng(3)
    cells, labels = _patient(rng)
    codes = (labels == "B").astype(int)
    wide = CENTRES[codes] + 2.5 * (cells - CENTRES[codes])  # every population 2.5 x wider
    patient = reach.for_patient(wide, UNKNOWN_MARGIN)
    assert np.all(patient.spread > 4.0)  # squared distances grow by 2.5 ** 2
    assert reach.unknown(wide, patient).mean() < 0.002
    assert reach.unknown(wide, dataclasses.replace(patient, spread=1.0)).mean() > 0.01


def test_a_larger_margin_calls_fewer_cells_unknown(reach):
    rng = np.random.default_rng(4)
    cells, labels = _patient(rng, novel=(2.0, 3.0, 0.0))
    counts = [int(reach.unknown(cells, reach.for_patient(cells, m)).sum()) for m in (1.0, 3.0, 10.0)]
    assert counts[0] > counts[1] > counts[2]


def _placed(rng, a_centre, n=4000, a_share=0.3, c_centre=(3.5, 6.0, 0.0)):
    """A at ``a_centre``, B at (4, 0, 0) and C at ``c_centre``, sd 0.5: B and C share the rest."""
    centres = np.array([a_centre, CENTRES[1], c_centre])
    k = rng.choice(3, size=n, p=(a_share, (1 - a_share) / 2, (1 - a_share) / 2))
    return centres[k] + rng.normal(0, 0.5, (n, 3)), np.array(["A", "B", "C"], dtype=object)[k]


def test_a_population_where_one_training_patient_had_it_is_not_unknown():
    # One training patient (its center) has A 16 sd higher in the second channel than the others.
    # A new patient of that center with few A cells: EM, started from A's average training mean,
    # gives them to the large C nearer them, and A's mean stays where no A cell of the patient is.
    rng = np.random.default_rng(6)
    training = [_placed(rng, (0.0, 0.0, 0.0)), _placed(rng, (0.0, 0.0, 0.0)), _placed(rng, (0.0, 8.0, 0.0))]
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], ["A", "B", "C"])
    np.testing.assert_allclose(reach.patient_means_[:, 0], [[0, 0, 0], [0, 0, 0], [0, 8, 0]], atol=0.05)
    assert reach.patient_means_.shape == (3, 3, 3)
    cells, labels = _placed(rng, (0.0, 8.0, 0.0), a_share=0.03)
    novel = np.array([8.0, -6.0, 0.0]) + rng.normal(0, 0.5, (100, 3))
    cells, labels = np.vstack([cells, novel]), np.concatenate([labels, np.full(100, "new", dtype=object)])
    patient = reach.for_patient(cells, UNKNOWN_MARGIN)
    assert np.linalg.norm(patient.means[0] - [0.0, 8.0, 0.0]) > 3.0  # EM did not reach them
    unknown = reach.unknown(cells, patient)
    assert unknown[labels == "A"].mean() < 0.01
    assert unknown[labels == "new"].mean() > 0.95
    assert unknown[(labels == "B") | (labels == "C")].mean() < 0.002
    # Measured around the patient's own means alone (a model file of format 12 or earlier).
    reach.patient_means_ = None
    assert reach.unknown(cells, patient)[labels == "A"].mean() > 0.9


def test_fit_refuses_labels_outside_the_classes():
    rng = np.random.default_rng(5)
    cells, labels = _patient(rng)
    with pytest.raises(ValueError, match="not among classes"):
        PopulationReach().fit([cells], [labels], ["A"])
    with pytest.raises(ValueError, match="no training cell of population"):
        PopulationReach().fit([cells], [labels], ["A", "B", "C"])


# -- in the model -----------------------------------------------------------------------------

def _with_planted_population(model, sample, labels, source="CD4 T cells", share=0.05, channel="FL1-A", shift=6.0):
    """``sample`` (compensated) with ``share`` of its events added: copies of its ``source`` cells
    moved ``shift`` standard deviations up in ``channel`` on the model's scale, a compact
    population where no training population is."""
    sample = model._compensated(sample)
    rng = np.random.default_rng(0)
    rows = rng.choice(np.flatnonzero(labels == source), size=int(share * sample.n_events), replace=True)
    pnn = [c.pnn for c in sample.channels]
    j = model.channels_.index(channel)
    new = sample.events[rows].copy()
    transformed = model.transform_.apply(new[:, [pnn.index(c) for c in model.channels_]], np.float64)[:, j]
    new[:, pnn.index(channel)] = model.transform_.inverse(transformed + shift * float(model.scale_[j]), j)
    events = np.vstack([sample.events, new.astype(sample.events.dtype)])
    planted = np.r_[np.zeros(sample.n_events, bool), np.ones(len(new), bool)]
    return dataclasses.replace(sample, events=events, name=sample.name + "+new"), planted


@pytest.fixture(scope="module")
def model():
    samples, labels = sample_cohort(range(1, 5))
    return GatingModel(select=False, n_features=128, cells_per_patient=1000, embedding_cells=4000,
                       adaptive_weight=0.5).fit(samples, labels)


def test_the_model_gates_a_new_population_as_unknown_and_counts_it(model):
    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, planted = _with_planted_population(model, sample, labels)
    result = model.gate(with_new)
    unknown = result.populations == UNKNOWN
    assert unknown[planted].mean() > 0.9
    assert unknown[~planted].mean() < 0.002
    assert result.population_names == model.populations_ + [UNKNOWN] == model.gated_populations()
    assert result.counts[UNKNOWN] == int(unknown.sum())
    assert sum(result.counts.values()) == with_new.n_events
    assert np.all(result.confidence[unknown] == 0.0)
    # Without the planted cells, the patient's own cells are (almost) all known.
    plain = model.gate(sample)
    assert np.mean(plain.populations == UNKNOWN) < 0.002
    assert np.mean(plain.populations == labels) > 0.97


def test_streamed_gating_calls_the_same_cells_unknown(model, tmp_path):
    from gating_core.fcs import read_fcs, write_fcs
    from gating_core.batch.files import gate_file

    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, planted = _with_planted_population(model, sample, labels)
    path = tmp_path / "with_new.fcs"
    # Written compensated and without a spillover matrix: the file is read as gated in memory.
    write_fcs(path, with_new.events.astype(np.float32), [c.pnn for c in with_new.channels],
              [c.pns for c in with_new.channels])
    in_memory = model.gate(read_fcs(path), chunk_size=4096)
    (tmp_path / "out").mkdir()
    records = gate_file(model, path, tmp_path / "out", chunk_size=4096)
    assert "error" not in records[0], records[0]
    assert records[0]["counts"] == in_memory.counts
    gated = pd.read_csv(records[0]["output"])
    assert np.array_equal(gated["population"].to_numpy(dtype=str), in_memory.populations.astype(str))
    assert in_memory.counts[UNKNOWN] >= 0.9 * planted.sum()


def test_unknown_margin_none_calls_no_cell_unknown(model):
    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, _ = _with_planted_population(model, sample, labels)
    fresh = GatingModel(**{**model.get_params(), "unknown_margin": None}).fit(*sample_cohort(range(1, 5)))
    # The populations' shapes stay: the adapted populations' own-shape fit uses them.
    assert fresh.population_reach_ is not None and fresh.adaptive_shapes_ and not fresh._unknown_called()
    result = fresh.gate(with_new)
    assert UNKNOWN not in set(result.populations) and UNKNOWN not in result.counts
    assert fresh.gated_populations() == fresh.populations_ == result.population_names


def test_the_reach_survives_the_model_file(model, tmp_path):
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = GatingModel.load(path)
    for name in ("means_", "whitening_", "log_dets_", "priors_", "reach_", "typical_", "patient_means_"):
        np.testing.assert_array_equal(getattr(loaded.population_reach_, name), getattr(model.population_reach_, name))
    assert loaded.unknown_margin == model.unknown_margin
    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, _ = _with_planted_population(model, sample, labels)
    assert np.array_equal(loaded.gate(with_new).populations, model.gate(with_new).populations)


def test_model_files_without_the_reach_gate_every_cell_to_a_known_population(model, tmp_path):
    arrays, meta = saved_arrays(model, tmp_path / "model.npz")
    reach_arrays = [name for name in arrays if name.startswith("reach_")]
    older = {**{k: v for k, v in meta.items() if k != "reach"}, "format_version": 6}
    older["params"] = {k: v for k, v in meta["params"].items() if k != "unknown_margin"}
    older["adaptive"] = {k: v for k, v in meta["adaptive"].items() if k not in ("start", "shapes")}
    old = GatingModel.load(rewrite_model_file(arrays, tmp_path / "old.npz", older, drop=reach_arrays))
    assert old.population_reach_ is None and old.unknown_margin is None
    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, _ = _with_planted_population(model, sample, labels)
    assert UNKNOWN not in set(old.gate(with_new).populations)
    # Reach arrays without their description, or a description without its arrays: refused.
    with pytest.raises(ModelFileError, match="reach arrays in a model without them"):
        GatingModel.load(rewrite_model_file(arrays, tmp_path / "a.npz", {k: v for k, v in meta.items() if k != "reach"}))
    with pytest.raises(ModelFileError, match="reach_whitening"):
        GatingModel.load(rewrite_model_file(arrays, tmp_path / "b.npz", meta, drop=["reach_whitening"]))


def test_model_files_without_the_training_patients_means_measure_the_patients_own(model, tmp_path):
    arrays, meta = saved_arrays(model, tmp_path / "model.npz")
    assert arrays["reach_patient_means"].shape == (4, *model.population_reach_.means_.shape)
    older = GatingModel.load(rewrite_model_file(arrays, tmp_path / "old.npz", dict(meta, format_version=12),
                                                drop=["reach_patient_means"]))
    assert older.population_reach_.patient_means_ is None
    sample, labels = (x[0] for x in sample_cohort([6]))
    with_new, planted = _with_planted_population(model, sample, labels)
    assert np.array_equal(older.gate(with_new).populations == UNKNOWN, model.gate(with_new).populations == UNKNOWN)
    wrong = dict(arrays, reach_patient_means=arrays["reach_patient_means"][:, :-1])
    with pytest.raises(ModelFileError, match="reach_patient_means"):
        GatingModel.load(rewrite_model_file(wrong, tmp_path / "wrong.npz", meta))


def test_evaluation_counts_the_unknown_share_of_each_patient():
    table = pd.DataFrame({"protocol": "p", "method": "marginal", "patient": ["a", "b"], "accuracy": [0.9, 0.8],
                          "macro_f1": [0.8, 0.7], "unknown": [0.0, 0.02]})
    row = summarize(table).iloc[0]
    assert row["mean_unknown"] == pytest.approx(0.01) and row["max_unknown"] == pytest.approx(0.02)


def test_the_command_line_default_is_the_models():
    assert model_options.UNKNOWN_MARGIN == UNKNOWN_MARGIN == GatingModel().unknown_margin


def test_train_takes_unknown_margin_none_and_refuses_a_bad_margin(tmp_path):
    bad = run_cli("train", *sample_paths(range(1, 3)), "--out", tmp_path / "m.npz", "--unknown-margin", "-1")
    assert bad.returncode == 2 and "--unknown-margin" in bad.stderr and "positive number" in bad.stderr
    out = tmp_path / "none.npz"
    done = run_cli("train", *sample_paths(range(1, 3)), "--out", out, "--unknown-margin", "none", "--no-selection",
                   "--features", "64", "--cells-per-patient", "300")
    assert done.returncode == 0, done.stderr
    assert "Unknown cells" not in done.stdout
    assert not GatingModel.load(out)._unknown_called()
    # Without the adapted populations either, the model keeps no populations' shapes.
    bare = tmp_path / "bare.npz"
    done = run_cli("train", *sample_paths(range(1, 3)), "--out", bare, "--unknown-margin", "none", "--no-selection",
                   "--features", "64", "--cells-per-patient", "300", "--adaptive-weight", "0")
    assert done.returncode == 0, done.stderr
    assert GatingModel.load(bare).population_reach_ is None


def test_the_auto_gate_page_reports_unknown_cells_and_asks_before_accepting_them():
    from ui.app_state import acceptance_acknowledgement, unknown_cells_notice

    populations = np.array(["A"] * 990 + [UNKNOWN] * 10, dtype=object)
    notice = unknown_cells_notice("p1", populations, ["A", "B"])
    assert notice.startswith("**10 cells of p1 (1%) lie beyond every population")
    assert unknown_cells_notice("p1", populations[:990], ["A", "B"]) is None
    # A lab that named a population "unknown" trained the model on it: nothing to report.
    assert unknown_cells_notice("p1", populations, ["A", UNKNOWN]) is None
    assert acceptance_acknowledgement("p1", False, populations[:990], ["A", "B"]) is None
    assert acceptance_acknowledgement("p1", False, populations, ["A", "B"]) == (
        f"its '{UNKNOWN}' cells become a population '{UNKNOWN}' of the next training.")
    assert acceptance_acknowledgement("p1", True, populations[:990], ["A", "B"]) == (
        "p1 is unlike every training patient; I reviewed its populations by hand.")
