"""Populations that are no single Gaussian: split into components for the adapted populations."""

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
from sklearn.mixture import GaussianMixture

from gating_core import read_fcs
from gating_core.fcs import Channel, Sample
from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.population_components import (MIN_COMPONENT_SHARE, MIN_SEPARATION, _within_patients, adapted_fits,
                                                       component_start, population_proba, population_starts,
                                                       split_populations)
from gating_core.method.self_training import PatientAdjustment
from gating_core.method.unknown_cells import PopulationReach
from gating_core.model.file_checks import ModelFileError
from gating_core.model.summary import adapted_populations_text
from gating_core.model import GatingModel
from gating_core.model.research import ResearchGatingModel, load_gating_model
from modelfile_helpers import rewrite_model_file


def _catch_all_patient(rng, target=(0.0, 0.0), n=3000):
    """'rest' is two clusters, at (-4, 0) and (4, 0), a catch-all gate around 'target' between
    them (a lymphocyte gate among monocytes and debris); ``target``: its centre in this patient."""
    k = rng.choice(3, size=n, p=(0.4, 0.4, 0.2))
    centres = np.array([[-4.0, 0.0], [4.0, 0.0], target])
    cells = centres[k] + rng.normal(0, 0.6, (n, 2))
    return cells, np.where(k == 2, "target", "rest")


def test_separate_clusters_are_split_and_one_skewed_cluster_is_not():
    rng = np.random.default_rng(0)
    patients = [_catch_all_patient(rng) for _ in range(3)]
    # A third population, one cluster with a long tail (log-normal in one channel).
    skewed = [np.c_[np.exp(rng.normal(0, 0.5, 1000)) + 10, rng.normal(0, 0.5, 1000)] for _ in patients]
    cells = [np.r_[c, s] for (c, _), s in zip(patients, skewed)]
    labels = [np.r_[y, np.full(len(s), "tail")] for (_, y), s in zip(patients, skewed)]
    parts, names, population_of = split_populations(cells, labels, ["rest", "tail", "target"])
    np.testing.assert_array_equal(names, ["0000.00", "0000.01", "0001.00", "0002.00"])
    np.testing.assert_array_equal(population_of, [0, 0, 1, 2])
    for x, y, p in zip(cells, labels, parts):
        rest = y == "rest"
        # Each cluster of 'rest' is one component, the other population's cells keep theirs.
        left = p[rest & (x[:, 0] < 0)]
        right = p[rest & (x[:, 0] > 0)]
        assert len(set(left)) == 1 and len(set(right)) == 1 and left[0] != right[0]
        assert set(p[y == "tail"]) == {"0001.00"} and set(p[y == "target"]) == {"0002.00"}
    # One component at most: every population whole, the populations' own order.
    whole, names1, population_of1 = split_populations(cells, labels, ["rest", "tail", "target"], max_components=1)
    np.testing.assert_array_equal(population_of1, [0, 1, 2])
    assert all(set(np.unique(w)) <= set(names1) for w in whole)


def test_clusters_closer_than_the_separation_stay_one_population():
    rng = np.random.default_rng(1)
    gap = 0.8 * MIN_SEPARATION
    cells = [np.r_[rng.normal(0, 1, (2000, 2)), rng.normal(0, 1, (2000, 2)) + [gap, 0]] for _ in range(2)]
    labels = [np.full(4000, "one") for _ in cells]
    _, names, _ = split_populations(cells, labels, ["one"])
    assert list(names) == ["0000.00"]


def test_a_population_that_each_center_puts_elsewhere_is_not_split():
    """Pooled over two centers whose run moved the population far, one cluster is two; within
    each patient it is one, and stays whole. The catch-all of the same patients is split."""
    rng = np.random.default_rng(4)
    cells, labels = [], []
    for center in range(2):
        for _ in range(3):
            x, y = _catch_all_patient(rng, target=(0.0, 10.0 * center))
            cells.append(x)
            labels.append(y)
    _, names, population_of = split_populations(cells, labels, ["rest", "target"])
    np.testing.assert_array_equal(population_of, [0, 0, 1])


def test_a_split_by_run_is_refused_where_some_patients_hold_a_tail_of_the_other_run():
    """Two runs put a population at (0, 0) and (0, 10); two patients of the first run and one of
    the second hold a tail of it where the other run has it. Each component then holds 5% of the
    population in four or five of the six patients, but only those three hold both: a split by
    run, refused. A catch-all of two clusters in every patient is accepted."""
    rng = np.random.default_rng(5)
    target, rest, patient_of = [], [], []
    for i, tail in enumerate([0.15, 0.1, 0.0, 0.1, 0.0, 0.0]):
        x, y = _catch_all_patient(rng, target=(0.0, 10.0 * (i // 3)))
        own = x[y == "target"].copy()
        own[: int(tail * len(own)), 1] += 10.0 if i < 3 else -10.0
        target.append(own)
        rest.append(x[y == "rest"])
        patient_of.append(np.full(len(own), i))
    cells, patient_of = np.concatenate(target), np.concatenate(patient_of)
    mixture = GaussianMixture(2, random_state=0).fit(cells)
    assigned = mixture.predict(cells)
    for m in range(2):
        holding = [np.mean(assigned[patient_of == p] == m) >= MIN_COMPONENT_SHARE for p in range(6)]
        assert sum(holding) > 3
    assert not _within_patients(mixture, assigned, patient_of)
    catch_all = np.concatenate(rest)
    rest_of = np.repeat(np.arange(6), [len(x) for x in rest])
    mixture = GaussianMixture(2, random_state=0).fit(catch_all)
    assert _within_patients(mixture, mixture.predict(catch_all), rest_of)


def test_a_split_is_scored_with_tied_cells_counting_half_whatever_the_names(monkeypatch):
    from types import SimpleNamespace

    import gating_core.method.population_components as components

    fitted = SimpleNamespace(fit=lambda *args, **kwargs: None)
    monkeypatch.setattr(components, "AdaptiveLDA", lambda: fitted)
    monkeypatch.setattr(components, "PopulationReach", lambda: fitted)
    monkeypatch.setattr(components, "adapted_fits", lambda lda, reach, x: (None, None))
    # the two fits each sure of another population on every cell but the last
    tied = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.9, 0.1]], np.float32)
    monkeypatch.setattr(components, "adapted_proba", lambda x, gaussians, shapes, starts: tied)
    cells, parts = [np.zeros((4, 2))], [np.zeros(4, object)]
    score = components._adapted_accuracy(cells, [np.array([0, 0, 0, 0])], parts, ["a", "b"], [0, 1])
    assert score == pytest.approx((3 * 0.5 + 1) / 4)
    # cells of the second population score as much on the tied cells: by argmax, they would
    # score none there
    score = components._adapted_accuracy(cells, [np.array([1, 1, 1, 0])], parts, ["a", "b"], [0, 1])
    assert score == pytest.approx((3 * 0.5 + 1) / 4)


def test_population_probabilities_sum_their_components():
    proba = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.25, 0.0, 0.25]], dtype=np.float32)
    starts = population_starts([0, 0, 1, 2])
    np.testing.assert_array_equal(starts, [0, 2, 3])
    np.testing.assert_allclose(population_proba(proba, starts), [[0.3, 0.3, 0.4], [0.75, 0.0, 0.25]], rtol=1e-6)
    assert population_proba(proba, population_starts([0, 1, 2, 3])) is proba


def _adapted_accuracy(train, patient, components: bool) -> float:
    """Accuracy on ``patient`` (cells, labels) of the adapted populations (both generative fits,
    as gating mixes them) fitted on ``train``, with or without components."""
    cells, labels = [c for c, _ in train], [y for _, y in train]
    classes = sorted(set(np.concatenate(labels)))
    if components:
        labels, names, population_of = split_populations(cells, labels, classes)
        starts = population_starts(population_of)
    else:
        names, starts = classes, None
    lda = AdaptiveLDA().fit(cells, labels, classes=names)
    reach = PopulationReach().fit(cells, labels, names)
    x, truth = patient
    gaussians, own = adapted_fits(lda, reach, x)
    adjust = PatientAdjustment(gaussians=gaussians, shapes=(reach, own), components=starts)
    return float(np.mean(np.asarray(classes)[np.argmax(adjust.adapted(x), axis=1)] == truth))


def test_a_catch_all_population_in_components_keeps_a_moved_population():
    """One Gaussian for 'rest' sits between its clusters, where 'target' is: in a patient whose
    target moved, EM lets 'rest' take it. Its two components hold their own clusters."""
    rng = np.random.default_rng(2)
    train = [_catch_all_patient(rng) for _ in range(4)]
    moved = _catch_all_patient(rng, target=(1.5, 1.5))
    whole = _adapted_accuracy(train, moved, components=False)
    split = _adapted_accuracy(train, moved, components=True)
    assert split > 0.97
    assert split > whole + 0.05


def test_the_model_file_keeps_the_components(tmp_path):
    rng = np.random.default_rng(3)
    patients = [_catch_all_patient(rng, target=(rng.normal(0, 0.3), rng.normal(0, 0.3)), n=2000) for _ in range(5)]
    samples = [Sample(f"p{i}", (c * 100 + 1000).astype(np.float32), [Channel("FSC-A"), Channel("SSC-A")])
               for i, (c, _) in enumerate(patients)]
    labels = [y for _, y in patients]
    model = GatingModel(select=False, cells_per_patient=1000, adaptive_weight=2 / 3).fit(samples[:4], labels[:4])
    np.testing.assert_array_equal(model.adaptive_components_, [0, 0, 1])
    assert list(model.adaptive_lda_.classes_) == ["0000.00", "0000.01", "0001.00"]
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = load_gating_model(path)
    assert type(loaded) is GatingModel
    np.testing.assert_array_equal(loaded.adaptive_components_, model.adaptive_components_)
    assert loaded.describe()["split_populations"] == {"rest": 2}
    assert adapted_populations_text(loaded).endswith(
        "one covariance shared by all populations, and each population's own shape; rest as 2 clusters")
    np.testing.assert_array_equal(loaded.predict_proba(samples[4]), model.predict_proba(samples[4]))
    assert loaded.predict_proba(samples[4]).shape == (len(samples[4].events), 2)
    with zipfile.ZipFile(path) as z:
        arrays = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    meta = json.loads(str(arrays.pop("meta")))
    # Components out of population order, or missing a population: refused.
    for bad in ([0, 1, 0], [0, 0, 0]):
        with pytest.raises(ModelFileError, match="'adaptive_components' must name every population"):
            GatingModel.load(rewrite_model_file(dict(arrays, adaptive_components=np.array(bad)),
                                                        tmp_path / "bad.npz", meta))
    # Components whose arrays have a row per population: refused (the shapes disagree).
    with pytest.raises(ModelFileError):
        GatingModel.load(rewrite_model_file(dict(arrays, adaptive_components=np.array([0, 0, 1, 1])),
                                                    tmp_path / "rows.npz", meta))


def test_em_starts_from_another_models_populations_shared_among_their_components():
    rng = np.random.default_rng(5)
    train = [_catch_all_patient(rng) for _ in range(3)]
    labels, names, population_of = split_populations([c for c, _ in train], [y for _, y in train], ["rest", "target"])
    lda = AdaptiveLDA().fit([c for c, _ in train], labels, classes=names)
    cells, truth = _catch_all_patient(rng)
    proba = np.c_[(truth == "rest") * 0.9 + 0.05, (truth == "target") * 0.9 + 0.05]
    start = component_start(proba, lda, cells, population_of)
    assert start.shape == (len(cells), 3)
    np.testing.assert_allclose(population_proba(start, population_starts(population_of)), proba, rtol=1e-9)
    # Each 'rest' cell's share goes to the component of its own cluster.
    left = (truth == "rest") & (cells[:, 0] < 0)
    assert np.mean(np.argmax(start[left], axis=1) == np.argmax(start[left].mean(axis=0))) > 0.99
    assert component_start(proba, lda, cells, None) is proba


def test_flow_biopsies_whose_catch_all_gate_holds_a_tumour_cluster(dlbcl_dir):
    """Real data: FlowCAP DLBCL with every population but FL2+ merged into one catch-all 'rest'
    (T cells, the experts' other gates and the ungated cells: several clusters). Trained on the
    second batch, the adapted populations gate dlbcl_03, whose tumour cluster (FL2+ high, in
    'rest') sits beside the training FL2+ cells: one Gaussian for 'rest' lets FL2+ take it."""
    groups = pd.read_csv(dlbcl_dir / "groups.csv")
    second = [p for p, g in zip(groups["patient"], groups["group"]) if g == "batch2"]

    def load(name):
        sample = read_fcs(dlbcl_dir / f"{name}.fcs")
        labels = pd.read_csv(dlbcl_dir / f"{name}.labels.csv")["population"].astype(str).to_numpy()
        return sample.events / 1024.0, np.where(labels == "FL2+", "FL2+", "rest")

    rng = np.random.default_rng(0)
    train = []
    for x, y in (load(p) for p in second):
        drawn = rng.choice(len(x), min(len(x), 4000), replace=False)
        train.append((x[drawn], y[drawn]))
    patient = load("dlbcl_03")
    whole = _adapted_accuracy(train, patient, components=False)
    split = _adapted_accuracy(train, patient, components=True)
    assert split > whole + 0.2
