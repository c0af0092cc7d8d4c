"""Unseen centers: augmentation, group-aware selection, the logistic loss, agnostic weights."""

from __future__ import annotations

import numpy as np
import pytest
from modelfile_helpers import rewrite_model_file

from gating_core.method.augmentation import augment_patients, shift_spread
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.selection import select_hyperparameters
from gating_core.method.solvers import fit_weighted_logistic
from gating_core.synthetic import ellipse_task


def _blobs(n_patients, n=400, seed=0, shift_scale=1.0):
    """Two classes whose boundary moves with a per-patient shift of the whole sample."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(n_patients):
        shift = rng.normal(0, shift_scale, 2)
        y = rng.integers(0, 2, n)
        x = rng.normal(0, 0.5, (n, 2)) + np.where(y[:, None] == 1, 1.5, -1.5) + shift
        xs.append(x.astype(np.float32))
        ys.append(np.where(y == 1, "pos", "neg"))
    return xs, ys


def test_augmented_copies_follow_their_source():
    xs, ys = _blobs(3, n=50)
    cells, labels, emb, source = augment_patients(xs, ys, xs, 2, 0.1, 0.2, random_state=0)
    assert len(cells) == len(labels) == len(emb) == 9
    assert source.tolist() == [0, 1, 2, 0, 0, 1, 1, 2, 2]
    for i in range(3, 9):
        s = source[i]
        np.testing.assert_array_equal(labels[i], ys[s])
        # one affine map per copy and channel, shared by training and embedding cells
        gain = (cells[i][1] - cells[i][0]) / (xs[s][1] - xs[s][0])
        np.testing.assert_allclose(cells[i], xs[s] * gain + (cells[i][0] - xs[s][0] * gain), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(emb[i], cells[i], rtol=1e-6)


def test_shift_spread_counts_groups_not_replicates():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, (2000, 2))
    # two centers two units apart on channel 0, each measured twice identically
    samples = [base, base, base + [2.0, 0.0], base + [2.0, 0.0]]
    gain, shift = shift_spread(samples, groups=["a", "a", "b", "b"])
    assert shift[0] == pytest.approx(0.5)  # capped: std of (0, 2) with ddof=1 is 1.41
    assert shift[1] == pytest.approx(0.0, abs=1e-12) and np.all(gain < 1e-9)
    assert shift_spread(samples, groups=["a"] * 4)[1].tolist() == [0.0, 0.0]


def test_classifier_records_sources_and_gates_with_augmentation():
    xs, ys = _blobs(6, seed=1)
    clf = MarginalTransferClassifier(n_augment=3, augment_gain=0.1, augment_shift=0.3, n_features=128,
                                     cells_per_patient=300).fit(xs, ys)
    assert clf.n_patients_ == 6 and clf.train_embeddings_.shape[0] == 24
    assert clf.patient_source_.tolist()[:6] == list(range(6))
    test_x, test_y = _blobs(1, seed=99)
    assert np.mean(clf.predict(test_x[0]) == test_y[0]) > 0.95


def test_selection_falls_back_to_pooling_unless_the_embedding_wins_by_the_margin(monkeypatch):
    import gating_core.method.selection as selection

    xs, ys = _blobs(6, n=200, seed=3)
    base = MarginalTransferClassifier(n_features=64)
    kwargs = dict(cells_per_patient=200, x_factors=(1.0,), p_factors=(1.0,))
    monkeypatch.setattr(selection, "POOLING_MARGIN", 1.0)  # the embedding can never win by that much
    result = select_hyperparameters(xs, ys, base, **kwargs)
    assert result.params["use_embedding"] is False and result.params["bandwidth_p"] is None
    assert any(row["p_factor"] is None for row in result.table)
    monkeypatch.setattr(selection, "POOLING_MARGIN", -1.0)  # pooling can never win
    result = select_hyperparameters(xs, ys, base, **kwargs)
    assert result.params["use_embedding"] is True and result.params["bandwidth_p"] > 0


def test_selection_keeps_the_embedding_on_the_ellipse_task():
    x, y = ellipse_task(24, 128, 5)
    labels = [np.where(t > 0, "up", "down") for t in y]
    result = select_hyperparameters(x, labels, MarginalTransferClassifier(n_features=256), cells_per_patient=128)
    assert result.params["use_embedding"] is True and result.params["bandwidth_p"] > 0


def test_selection_never_splits_a_group():
    xs, ys = _blobs(6, n=100, seed=4)
    seen = []

    import gating_core.method.groups as groups_module

    original = groups_module.group_folds

    def spy(groups, *args, **kwargs):
        folds = original(groups, *args, **kwargs)
        seen.append((list(groups), folds))
        return folds

    groups_module.group_folds = spy
    try:
        select_hyperparameters(xs, ys, MarginalTransferClassifier(n_features=64, n_augment=1, augment_gain=0.1,
                                                                  augment_shift=0.1),
                               groups=["a", "a", "b", "b", "c", "c"], cells_per_patient=100,
                               x_factors=(1.0,), p_factors=(1.0,))
    finally:
        groups_module.group_folds = original
    groups, folds = seen[0]
    for fold in folds:
        held = {groups[i] for i in fold}
        assert sorted(fold) == [i for i, g in enumerate(groups) if g in held]


def test_weighted_logistic_matches_scikit_learn():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    f = [rng.normal(0, 1, (200, 5)).astype(np.float32) for _ in range(2)]
    t = [(x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1) for x in f]
    alpha = 1e-2
    coef, intercept = fit_weighted_logistic(f, t, np.array([0.5, 0.5]), 3, alpha)
    # Same objective in scikit-learn's form: C * sum_i w_i loss_i + 0.5 ||W||^2 with w = 1/(N n_i).
    reference = LogisticRegression(C=1 / (2 * alpha), tol=1e-10, max_iter=5000).fit(
        np.vstack(f), np.concatenate(t), sample_weight=np.full(400, 1 / 400))
    np.testing.assert_allclose(coef, reference.coef_.T, atol=2e-3)
    np.testing.assert_allclose(intercept - intercept.mean(), reference.intercept_ - reference.intercept_.mean(),
                               atol=2e-3)


def test_logistic_loss_gives_calibrated_probabilities():
    xs, ys = _blobs(5, seed=2)
    clf = MarginalTransferClassifier(loss="logistic", alpha=1e-4, n_features=128, cells_per_patient=300).fit(xs, ys)
    assert clf.temperature_ == 1.0
    test_x, test_y = _blobs(1, seed=42)
    proba = clf.predict_proba(test_x[0])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert np.mean(clf.predict(test_x[0]) == test_y[0]) > 0.95


def test_agnostic_weighting_moves_weight_to_the_hardest_patient():
    xs, ys = _blobs(5, seed=6)
    rng = np.random.default_rng(0)
    # Patient 4 has 30% of its labels flipped: no model gates it well.
    flip = rng.random(len(ys[4])) < 0.3
    ys[4] = np.where(flip, np.where(ys[4] == "pos", "neg", "pos"), ys[4])
    clf = MarginalTransferClassifier(patient_weighting="agnostic", n_features=128, cells_per_patient=300,
                                     alpha=1e-3, bandwidth_x=1.0, bandwidth_p=1.0).fit(xs, ys)
    assert clf.patient_weights_.sum() == pytest.approx(1.0)
    assert int(np.argmax(clf.patient_weights_)) == 4
    assert clf.patient_weights_[4] > 1.5 / 5


# -- the pooled companion of the marginal method ------------------------------------------------

@pytest.fixture(scope="module")
def small_centers():
    from gating_core.synthetic import simulate_centers

    cohort, centers = simulate_centers(3, 2, seed=5, n_events=2500, strength=1.5)
    return [c[0] for c in cohort], [c[1] for c in cohort], centers


@pytest.fixture(scope="module")
def blended(small_centers):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    # Without the adapted populations: these tests follow the blend itself
    # (tests/test_adaptive_lda.py). One shift-augmented copy of each patient (a research option).
    return ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500,
                               adaptive_weight=0.0).fit(samples[:4], labels[:4])


def test_marginal_probabilities_are_the_weighted_mean_with_the_pooled_companion(blended, small_centers):
    samples, labels, _ = small_centers
    companion = blended.pooled_classifier_
    assert companion is not None and companion.use_embedding is False and companion.loss == "logistic"
    assert companion.n_augment == 0 and companion.bandwidth_x_ == blended.classifier_.bandwidth_x_
    assert companion.classes_.tolist() == blended.populations_
    new = samples[5]
    cells, psi = blended.standardised_cells(new), blended.patient_embedding(new)
    alone = blended.classifier_.predict_proba(cells, psi)
    pooled = companion.predict_proba(cells, psi)
    blend = blended.predict_proba(new)
    # Patient 5's center is not in training: the marginal model's share fades with k_P to its
    # nearest training patient, exp(-d^2 / (2 sigma_P^2)) (0.55 measured, so the companion weighs 0.72).
    train_psi = blended.classifier_.train_embeddings_[:4]
    support = np.exp(-((train_psi - psi) ** 2).sum(axis=1).min() / (2 * blended.classifier_.bandwidth_p_ ** 2))
    assert 0.4 < support < 0.7
    assert blended.embedding_support(psi) == pytest.approx(support, rel=1e-12)
    weight = 1 - 0.5 * support
    assert blended.companion_weight(psi) == pytest.approx(weight, rel=1e-12)
    np.testing.assert_allclose(blend, (1 - weight) * alone + weight * pooled, atol=1e-6)
    result = blended.gate(new)
    np.testing.assert_array_equal(result.populations, np.asarray(blended.populations_)[blend.argmax(axis=1)])
    assert blended.describe()["pooled_weight"] == 0.5
    # A training patient is within reach: the even blend, exactly.
    own = blended.patient_embedding(samples[0])
    assert blended.embedding_support(own) == 1.0 and blended.companion_weight(own) == 0.5
    # The marginal model alone extrapolates badly to patient 5 (0.34 when measured); the companion
    # pulls the blend back up (0.69 with the even blend, 0.854 with the fading one, measured).
    accuracy_alone = np.mean(blended.classifier_.classes_[alone.argmax(axis=1)] == labels[5])
    assert np.mean(result.populations == labels[5]) > accuracy_alone + 0.4
    assert np.mean(blended.predict(samples[4]) == labels[4]) > 0.95


def test_selected_companion_is_the_pooled_logistic_model_at_its_own_bandwidth(small_centers):
    """With selection, the companion's sigma_X is chosen for it (pooled, no augmentation), not
    borrowed from the marginal model: it is exactly the pooled logistic regression a user would
    fit, so the blend is never built on a pooled model weaker than the baseline."""
    from gating_core.model.research import ResearchGatingModel

    samples, labels, centers = small_centers
    small = dict(n_features=96, cells_per_patient=600, selection_cells_per_patient=300, cv_repeats=1)
    groups = [centers[s.name] for s in samples[:4]]
    model = ResearchGatingModel(n_augment=1, adaptive_weight=0.0, **small).fit(samples[:4], labels[:4], groups=groups)
    baseline = ResearchGatingModel(method="pooling", loss="logistic", alpha=1e-5, adaptive_weight=0.0, **small).fit(
        samples[:4], labels[:4], groups=groups)
    companion = model.pooled_classifier_
    assert model.selection_["companion"]["bandwidth_x"] == companion.bandwidth_x_ == model.companion_bandwidth_x_
    assert companion.bandwidth_x_ == baseline.classifier_.bandwidth_x_
    new = samples[5]
    np.testing.assert_allclose(model.standardised_cells(new), baseline.standardised_cells(new))
    cells, psi = model.standardised_cells(new), model.patient_embedding(new)
    np.testing.assert_allclose(companion.predict_proba(cells, psi), baseline.predict_proba(new), atol=1e-9)
    # A sigma_X given by the user is the companion's too, and nothing is selected for it.
    fixed = ResearchGatingModel(n_augment=1, bandwidth_x=2.0, adaptive_weight=0.0, **small).fit(
        samples[:4], labels[:4], groups=groups)
    assert fixed.pooled_classifier_.bandwidth_x_ == 2.0 and "companion" not in fixed.selection_


def test_pooled_weight_zero_and_pooling_fit_no_companion(small_centers):
    from gating_core.model import GatingModel
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    alone = GatingModel(select=False, pooled_weight=0.0, adaptive_weight=0.0, cells_per_patient=800).fit(
        samples[:3], labels[:3])
    assert alone.pooled_classifier_ is None and alone.describe()["pooled_weight"] == 0.0
    new = samples[4]
    np.testing.assert_array_equal(
        alone.predict_proba(new),
        alone.classifier_.predict_proba(alone.standardised_cells(new), alone.patient_embedding(new)))
    pooling = ResearchGatingModel(method="pooling", select=False, adaptive_weight=0.0,
                          cells_per_patient=800).fit(samples[:3], labels[:3])
    assert pooling.pooled_classifier_ is None
    with pytest.raises(ValueError, match="pooled_weight must be 'auto' or a number within"):
        GatingModel(select=False, pooled_weight=1.5, cells_per_patient=800).fit(samples[:3], labels[:3])


def test_companion_survives_save_and_load_and_older_files_load_without_it(blended, small_centers, tmp_path):
    import json
    import zipfile

    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.research import ResearchGatingModel

    samples, _, _ = small_centers
    path = tmp_path / "blend.npz"
    blended.save(path)
    loaded = ResearchGatingModel.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(samples[5]), blended.predict_proba(samples[5]))
    assert loaded.pooled_classifier_.bandwidth_x_ == blended.pooled_classifier_.bandwidth_x_

    arrays = dict(np.load(path))
    meta = json.loads(str(arrays["meta"]))

    def rewrite(name, meta, drop=()):
        return rewrite_model_file(arrays, tmp_path / name, meta, drop)

    # A format-1 file has no companion: it gates with the marginal model alone.
    old = {k: v for k, v in meta.items() if k != "pooled"}
    old["format_version"] = 1
    previous = ResearchGatingModel.load(rewrite("old.npz", old, drop=[k for k in arrays if k.startswith("pooled_")]))
    assert previous.pooled_classifier_ is None
    cells, psi = blended.standardised_cells(samples[5]), blended.patient_embedding(samples[5])
    np.testing.assert_array_equal(previous.predict_proba(samples[5]), blended.classifier_.predict_proba(cells, psi))

    bad = json.loads(json.dumps(meta))
    bad["pooled"]["classifier"]["use_embedding"] = True
    with pytest.raises(ModelFileError, match="pooled companion"):
        ResearchGatingModel.load(rewrite("bad.npz", bad))
    with pytest.raises(ModelFileError, match="pooled_coef"):
        ResearchGatingModel.load(rewrite("missing.npz", meta, drop=["pooled_coef"]))
    assert zipfile.is_zipfile(path)


def test_the_even_blend_is_kept_unless_another_weight_clearly_wins_on_held_out_groups():
    from gating_core.method.companion_selection import POOLED_WEIGHT_MARGIN, choose_pooled_weight

    assert POOLED_WEIGHT_MARGIN == 0.002
    # Within the margin of the best: the weight nearest 0.5 (ties: the lower one).
    assert choose_pooled_weight({0.0: 0.950, 0.25: 0.9612, 0.5: 0.9600, 0.75: 0.9615, 1.0: 0.958}) == 0.5
    assert choose_pooled_weight({0.0: 0.950, 0.25: 0.9650, 0.5: 0.9600, 0.75: 0.9615, 1.0: 0.958}) == 0.25
    assert choose_pooled_weight({0.0: 0.90, 0.25: 0.91, 0.5: 0.92, 0.75: 0.95, 1.0: 0.951}) == 0.75
    assert choose_pooled_weight({0.0: 0.90, 0.25: 0.91, 0.5: 0.92, 0.75: 0.93, 1.0: 0.951}) == 1.0
    assert choose_pooled_weight({0.0: 0.97, 1.0: 0.97}) == 0.0


@pytest.fixture(scope="module")
def auto_weighted(small_centers):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, centers = small_centers
    groups = [centers[s.name] for s in samples]
    # Two patients of each of three centers: three folds, each holding out a whole center. The
    # cell bandwidth is given (the one selection chose here), so the companion shares it and
    # "auto" keeps a companion on this cohort (0.25); with its own selected sigma_X the companion
    # is nearly linear here and "auto" drops it (0.0), which leaves no blend to check.
    model = ResearchGatingModel(n_augment=1, cells_per_patient=1000, selection_cells_per_patient=600, cv_folds=3,
                                adaptive_weight=0.0, cv_repeats=1, pooled_weight="auto",
                                bandwidth_x=3.85).fit(samples, labels, groups=groups)
    return model


def test_auto_weight_is_chosen_over_held_out_centers_and_is_the_weight_used(auto_weighted, small_centers):
    from gating_core.method.companion_selection import DEFAULT_POOLED_WEIGHTS, choose_pooled_weight

    samples, _, _ = small_centers
    model = auto_weighted
    record = model.selection_["pooled_weight"]
    assert record["folds"] == 3
    table = {float(w): s for w, s in record["cv_accuracy"].items()}
    assert sorted(table) == list(DEFAULT_POOLED_WEIGHTS)
    assert all(0.3 < s <= 1.0 for s in table.values())
    assert model.pooled_weight_ == record["chosen"] == choose_pooled_weight(table)
    assert model.describe()["pooled_weight"] == model.pooled_weight_
    assert model.pooled_weight_ > 0 and model.pooled_classifier_ is not None
    new = samples[5]
    cells, psi = model.standardised_cells(new), model.patient_embedding(new)
    w = np.float32(model.pooled_weight_)
    expected = model.classifier_.predict_proba(cells, psi) * (np.float32(1) - w) + \
        w * model.pooled_classifier_.predict_proba(cells, psi)
    np.testing.assert_array_equal(model.predict_proba(new), expected)


def test_auto_weight_survives_save_and_format_2_files_use_their_parameter(auto_weighted, small_centers, tmp_path):
    import json

    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.research import ResearchGatingModel

    samples, _, _ = small_centers
    path = tmp_path / "auto.npz"
    auto_weighted.save(path)
    loaded = ResearchGatingModel.load(path)
    assert loaded.pooled_weight == "auto" and loaded.pooled_weight_ == auto_weighted.pooled_weight_
    np.testing.assert_array_equal(loaded.predict_proba(samples[4]), auto_weighted.predict_proba(samples[4]))

    arrays = dict(np.load(path))
    meta = json.loads(str(arrays["meta"]))
    older = json.loads(json.dumps(meta))
    older["format_version"] = 2
    del older["pooled"]["weight"]
    older["params"]["pooled_weight"] = 0.25
    np.savez_compressed(tmp_path / "v2.npz", **{**arrays, "meta": np.array(json.dumps(older))})
    assert ResearchGatingModel.load(tmp_path / "v2.npz").pooled_weight_ == 0.25
    # "auto" without the fitted weight cannot be gated honestly: refuse the file.
    older["params"]["pooled_weight"] = "auto"
    np.savez_compressed(tmp_path / "bad.npz", **{**arrays, "meta": np.array(json.dumps(older))})
    with pytest.raises(ModelFileError, match="no weight"):
        ResearchGatingModel.load(tmp_path / "bad.npz")
    meta["pooled"]["weight"] = 1.5
    np.savez_compressed(tmp_path / "range.npz", **{**arrays, "meta": np.array(json.dumps(meta))})
    with pytest.raises(ModelFileError, match="weight"):
        ResearchGatingModel.load(tmp_path / "range.npz")


def test_pooled_weight_option_takes_auto_or_a_weight():
    import argparse

    from gating_core.commands.model_options import _pooled_weight

    assert _pooled_weight("auto") == "auto"
    assert _pooled_weight("0.25") == 0.25 and _pooled_weight("0") == 0.0
    for bad in ("1.5", "-0.1", "half", "nan"):
        # An argparse type: argparse turns it into a usage error (exit status 2) naming the option.
        with pytest.raises(argparse.ArgumentTypeError, match="must be 'auto' or a number within"):
            _pooled_weight(bad)


def test_command_line_names_match_the_library():
    from gating_core.commands import evaluate, model_options
    from gating_core.evaluation import ALL_METHODS
    from gating_core.evaluation.protocols import METHOD_SETTINGS
    from gating_core.model import DEFAULT_ADAPTIVE_WEIGHT, DEFAULT_POOLED_WEIGHT

    assert sorted(evaluate.EVALUATION_METHODS) == sorted(ALL_METHODS)
    # every method given settings can be asked for by name
    assert set(METHOD_SETTINGS) <= set(ALL_METHODS)
    assert model_options.DEFAULT_POOLED_WEIGHT == DEFAULT_POOLED_WEIGHT
    assert model_options.DEFAULT_ADAPTIVE_WEIGHT == DEFAULT_ADAPTIVE_WEIGHT


# -- class-prior re-estimation (prior_shift="em") -----------------------------------------------

def test_em_recovers_a_shifted_prior_from_calibrated_posteriors():
    from gating_core.method.priors import reestimate_prior

    rng = np.random.default_rng(0)
    # Two unit-variance Gaussians at -1 and +1: exact posteriors under a 50/50 training prior.
    truth = np.array([0.8, 0.2])
    y = rng.choice(2, 20000, p=truth)
    x = rng.normal(np.where(y == 1, 1.0, -1.0), 1.0)
    like = np.stack([np.exp(-(x + 1) ** 2 / 2), np.exp(-(x - 1) ** 2 / 2)], axis=1)
    proba = like / like.sum(axis=1, keepdims=True)
    prior = reestimate_prior(proba, np.array([0.5, 0.5]))
    np.testing.assert_allclose(prior, truth, atol=0.015)
    assert abs(proba.mean(axis=0)[0] - 0.8) > 0.1  # the naive mean of posteriors is biased


def test_prior_shift_em_gates_with_adjusted_probabilities(blended, small_centers, tmp_path):
    from sklearn.base import clone  # noqa: F401  (GatingModel params are plain values)

    from gating_core.method.features import content_subsample
    from gating_core.method.priors import apply_prior_ratio, reestimate_prior
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    assert blended.class_prior_.shape == (len(blended.populations_),)
    np.testing.assert_allclose(blended.class_prior_.sum(), 1.0)
    path = tmp_path / "m.npz"
    blended.save(path)
    em = ResearchGatingModel.load(path)
    em.prior_shift = "em"
    new = samples[4]
    plain = blended.predict_proba(new)
    idx = em._channel_indices(new)
    raw = new.events[:, idx]
    chosen = em.standardised_cells(new)[content_subsample(raw, em.embedding_cells)]
    prior = reestimate_prior(blended._proba(chosen, blended.patient_embedding(new), 50_000), blended.class_prior_)
    expected = apply_prior_ratio(plain.copy(), (prior / blended.class_prior_).astype(np.float32))
    np.testing.assert_allclose(em.predict_proba(new), expected, atol=1e-6)
    result = em.gate(new, chunk_size=700)
    # The gated labels are those probabilities' argmax wherever a difference within that 1e-6
    # cannot swap the two best.
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2e-6
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(result.populations[clear],
                                  np.asarray(em.populations_)[expected.argmax(axis=1)][clear])
    # An option, not the default: here it moves accuracy from 0.97 to 0.92 (measured), because
    # the posteriors are not calibrated on a new center; it must not do worse than that.
    assert np.mean(result.populations == labels[4]) > 0.9


# -- quantile registration (align="quantile") ----------------------------------------------------

def test_registration_undoes_an_instrument_gain_and_offset():
    from gating_core.method.alignment import LEVELS, QuantileRegistration, channel_quantiles

    rng = np.random.default_rng(3)
    reference_cells = np.column_stack([rng.normal(0, 1, 20000), rng.gamma(2.0, 1.0, 20000)])
    measured = reference_cells * [1.6, 0.7] + [0.5, -0.3]  # another center's gains and offsets
    registration = QuantileRegistration(channel_quantiles(measured), channel_quantiles(reference_cells))
    back = registration.transform(measured)
    assert back.dtype == np.float32 and back.shape == measured.shape
    # an affine change is undone exactly between landmarks and beyond them (end slopes)
    np.testing.assert_allclose(back, reference_cells, atol=2e-3)
    np.testing.assert_allclose(registration.transform(channel_quantiles(measured).T), channel_quantiles(reference_cells).T,
                               atol=1e-5)
    assert len(LEVELS) == channel_quantiles(measured).shape[1]


def test_registration_survives_ties_and_bounds_its_slopes():
    from gating_core.method.alignment import MIN_GAP, SLOPE_LIMITS, QuantileRegistration, channel_quantiles

    piled = np.zeros((1000, 1))
    piled[-30:, 0] = np.linspace(1, 2, 30)  # 97% of the events at exactly zero
    landmarks = channel_quantiles(piled)
    assert np.all(np.diff(landmarks, axis=1) >= MIN_GAP - 1e-12)
    wide = np.linspace(-50, 50, landmarks.shape[1])[None, :]
    registration = QuantileRegistration(landmarks, wide)
    out = registration.transform(np.array([[-10.0], [0.0], [10.0]]))
    assert np.all(np.isfinite(out)) and out[0, 0] < out[1, 0] < out[2, 0]
    assert registration.low_slope[0] == SLOPE_LIMITS[1] and registration.high_slope[0] <= SLOPE_LIMITS[1]
    with pytest.raises(ValueError, match="landmarks"):
        QuantileRegistration(landmarks, wide[:, :3])


def test_quantile_registered_model_round_trips_and_ignores_chunking(small_centers, tmp_path):
    from gating_core.model.research import ResearchGatingModel
    from gating_core.model.file_checks import ModelFileError

    samples, labels, _ = small_centers
    model = ResearchGatingModel(select=False, align="quantile", cells_per_patient=1500,
                        adaptive_weight=0.0).fit(samples[:4], labels[:4])
    assert model.reference_quantiles_.shape == (len(model.channels_), 7)
    new = samples[5]
    result = model.gate(new)
    np.testing.assert_array_equal(model.gate(new, chunk_size=300).populations, result.populations)
    np.testing.assert_array_equal(np.asarray(model.populations_)[model.predict_proba(new).argmax(axis=1)],
                                  result.populations)
    # measured 0.86 against 0.69 without registration on this center (an option, see README)
    assert np.mean(result.populations == labels[5]) > 0.8
    path = tmp_path / "q.npz"
    model.save(path)
    np.testing.assert_array_equal(ResearchGatingModel.load(path).predict_proba(new), model.predict_proba(new))
    arrays = dict(np.load(path))
    arrays["reference_quantiles"] = arrays["reference_quantiles"][:, ::-1].copy()
    np.savez_compressed(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ModelFileError, match="not increasing"):
        ResearchGatingModel.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="align must be one of"):
        ResearchGatingModel(select=False, align="warp").fit(samples[:2], labels[:2])


# -- further baselines: the hinge loss and the multitask kernel -----------------------------------

def test_weighted_hinge_is_the_cost_sensitive_svm():
    from scipy.optimize import minimize

    from gating_core.method.solvers import fit_weighted_hinge

    rng = np.random.default_rng(1)
    f = [rng.normal(0, 1, (n, 3)).astype(np.float32) for n in (40, 15)]  # unequal n_i: the costs differ
    t = [(x[:, 0] - 0.7 * x[:, 1] + 0.3 * rng.normal(size=len(x)) > 0.2).astype(int) for x in f]
    alpha = 5e-3
    coef, intercept = fit_weighted_hinge(f, t, np.array([0.5, 0.5]), 2, alpha, smoothing=1e-3, max_iter=5000)
    # The reference: the SVM's quadratic programme, min alpha ||w||^2 + sum_j c_j xi_j subject to
    # xi_j >= 0 and xi_j >= 1 - y_j (w x_j + b), with the cell costs c_j = w_i / n_i
    # (= 1/(lambda N n_i) once divided by lambda), solved by SLSQP on (w, b, xi).
    x, y = np.vstack(f).astype(np.float64), np.where(np.concatenate(t) == 1, 1.0, -1.0)
    costs = np.concatenate([np.full(len(v), 0.5 / len(v)) for v in f])
    n, d = x.shape
    objective = lambda v: alpha * v[:d] @ v[:d] + costs @ v[d + 1:]
    margins = {"type": "ineq", "fun": lambda v: v[d + 1:] - 1 + y * (x @ v[:d] + v[d]),
               "jac": lambda v: np.hstack([(y[:, None] * x), y[:, None], np.eye(n)])}
    slack = {"type": "ineq", "fun": lambda v: v[d + 1:], "jac": lambda v: np.hstack([np.zeros((n, d + 1)), np.eye(n)])}
    qp = minimize(objective, np.concatenate([np.zeros(d + 1), np.ones(n)]), method="SLSQP",
                  jac=lambda v: np.concatenate([2 * alpha * v[:d], [0.0], costs]), constraints=[margins, slack],
                  options={"maxiter": 1000, "ftol": 1e-12})
    assert qp.success
    # one-vs-rest: the column of class 1 is the binary SVM
    np.testing.assert_allclose(coef[:, 1], qp.x[:d], atol=1e-2)
    assert intercept[1] == pytest.approx(qp.x[d], abs=1e-2)
    hinge = lambda w, b: alpha * w @ w + costs @ np.maximum(0, 1 - y * (x @ w + b))
    assert hinge(coef[:, 1], intercept[1]) == pytest.approx(qp.fun, rel=1e-3)


def test_hinge_loss_classifier_gates_and_is_calibrated_on_held_out_patients():
    xs, ys = _blobs(5, seed=2)
    clf = MarginalTransferClassifier(loss="hinge", alpha=1e-3, n_features=128, cells_per_patient=300,
                                     bandwidth_x=1.0, bandwidth_p=1.0).fit(xs, ys)
    assert clf.temperature_ != 10.0 and clf.temperature_ > 0  # fitted on out-of-patient margins
    test_x, test_y = _blobs(1, seed=42)
    assert np.mean(clf.predict(test_x[0]) == test_y[0]) > 0.95
    np.testing.assert_allclose(clf.predict_proba(test_x[0]).sum(axis=1), 1.0, rtol=1e-5)


def _tiny_statistics(rng, n_tasks=3, dim=4, k=2):
    from gating_core.method.ridge import RidgeStatistics

    stats = RidgeStatistics(dim, k)
    features, targets = [], []
    for n in rng.integers(5, 12, n_tasks):
        f = rng.normal(size=(n, dim))
        y = np.eye(k)[rng.integers(0, k, n)]
        stats.add_patient([f], [y])
        features.append(f)
        targets.append(y)
    return stats, features, targets


def test_the_one_penalty_ridge_fit_is_the_weighted_ridge_solution():
    """RidgeStatistics.fit (a Cholesky solve) against the closed form on the stacked cells:
    minimise sum_i a_i mean_j ||F_ij W + b - Y_ij||^2 + alpha ||W||^2, b free."""
    rng = np.random.default_rng(5)
    stats, features, targets = _tiny_statistics(rng, n_tasks=4)
    alpha = 0.05
    for rows, weights in (([0, 1, 2], None), ([0, 1, 2, 3], np.array([0.1, 0.2, 0.3, 0.4])), ([1, 3], None)):
        a = np.ones(len(rows)) if weights is None else weights[rows]
        a = a / a.sum()
        cell_w = np.concatenate([np.full(len(features[r]), ai / len(features[r])) for ai, r in zip(a, rows)])
        f, y = np.vstack([features[r] for r in rows]), np.vstack([targets[r] for r in rows])
        mu, t = cell_w @ f, cell_w @ y
        fc = f - mu
        expected = np.linalg.solve(fc.T @ (fc * cell_w[:, None]) + alpha * np.eye(f.shape[1]),
                                   fc.T @ ((y - t) * cell_w[:, None]))
        coef, intercept = stats.fit(rows, alpha, weights)
        np.testing.assert_allclose(coef, expected, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(intercept, t - mu @ expected, rtol=1e-9, atol=1e-12)
        eigen_coef, eigen_intercept = type(stats).solve(stats.eigen(rows, weights), alpha)
        np.testing.assert_allclose(coef, eigen_coef, rtol=1e-9, atol=1e-12)


def test_a_penalty_below_the_grams_rounding_takes_the_eigendecomposition():
    """Duplicate float32 feature columns make the centred Gram singular up to rounding; at a
    penalty far below that rounding the Cholesky route would fail or differ, so the fit is the
    eigendecomposition's (negative rounding eigenvalues clipped at zero), to the bit."""
    from gating_core.method.ridge import RidgeStatistics

    rng = np.random.default_rng(9)
    stats = RidgeStatistics(6, 2)
    for _ in range(3):
        f = rng.normal(size=(40, 3)).astype(np.float32)
        stats.add_patient([np.hstack([f, f])], [np.eye(2, dtype=np.float32)[rng.integers(0, 2, 40)]])
    for alpha in (1e-12, 1e-9):
        coef, intercept = stats.fit([0, 1, 2], alpha)
        expected = RidgeStatistics.solve(stats.eigen([0, 1, 2]), alpha)
        np.testing.assert_array_equal(coef, expected[0])
        np.testing.assert_array_equal(intercept, expected[1])


def test_multitask_solve_equals_ridge_on_the_explicit_multitask_features():
    from gating_core.method.ridge import multitask_ridge_solve

    rng = np.random.default_rng(3)
    stats, features, targets = _tiny_statistics(rng)
    weights = np.array([0.2, 0.5, 0.3])
    alpha, tau = 0.05, 0.3
    coef, intercept = multitask_ridge_solve(stats, range(3), weights, alpha, tau)
    # explicit feature map [sqrt(tau) z, sqrt(1 - tau) z (x) e_i] with z = [phi, 1], weighted ridge
    n_tasks, dim = len(features), features[0].shape[1] + 1
    rows, ys, cell_w = [], [], []
    for i, (f, y) in enumerate(zip(features, targets)):
        z = np.hstack([f, np.ones((len(f), 1))])
        task = np.zeros((len(f), n_tasks * dim))
        task[:, i * dim:(i + 1) * dim] = np.sqrt(1 - tau) * z
        rows.append(np.hstack([np.sqrt(tau) * z, task]))
        ys.append(y)
        cell_w.append(np.full(len(f), weights[i] / len(f)))
    big, y, w = np.vstack(rows), np.vstack(ys), np.concatenate(cell_w)
    theta = np.linalg.solve(big.T @ (w[:, None] * big) + alpha * np.eye(big.shape[1]), big.T @ (w[:, None] * y))
    shared = np.sqrt(tau) * theta[:dim]  # a new patient: kernel tau with every task, no task of its own
    np.testing.assert_allclose(coef, shared[:-1], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(intercept, shared[-1], rtol=1e-8, atol=1e-10)


def test_multitask_with_tau_one_is_one_ridge_on_all_tasks_and_tau_is_checked():
    from gating_core.method.ridge import multitask_ridge_solve

    rng = np.random.default_rng(4)
    stats, features, targets = _tiny_statistics(rng)
    alpha = 0.1
    coef, intercept = multitask_ridge_solve(stats, [0, 2], None, alpha, 1.0)
    z = [np.hstack([features[i], np.ones((len(features[i]), 1))]) for i in (0, 2)]
    gram = sum(0.5 * x.T @ x / len(x) for x in z)
    cross = sum(0.5 * x.T @ targets[i] / len(x) for x, i in zip(z, (0, 2)))
    expected = np.linalg.solve(gram + alpha * np.eye(gram.shape[0]), cross)
    np.testing.assert_allclose(np.vstack([coef, intercept[None]]), expected, rtol=1e-8, atol=1e-10)
    for tau in (0.0, 1.5):
        with pytest.raises(ValueError, match="tau"):
            multitask_ridge_solve(stats, [0, 1], None, alpha, tau)
    with pytest.raises(ValueError, match="use_embedding=False"):
        MarginalTransferClassifier(task_similarity=0.5).fit(*_blobs(2, n=50))


@pytest.fixture(scope="module")
def further_baselines(small_centers):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    fixed = dict(select=False, cells_per_patient=1000, bandwidth_x=2.0, alpha=1e-4)
    return {name: ResearchGatingModel(**fixed, **settings).fit(samples[:4], labels[:4])
            for name, settings in (("hinge", {"loss": "hinge"}),
                                   ("multitask", {"method": "multitask", "task_similarity": 0.01}))}


def test_hinge_and_multitask_models_gate_new_centers_and_survive_save_and_load(further_baselines, small_centers,
                                                                                tmp_path):
    from gating_core.model.research import ResearchGatingModel

    samples, labels, _ = small_centers
    for name, model in further_baselines.items():
        accuracy = np.mean([np.mean(model.predict(s) == np.asarray(y).astype(str))
                            for s, y in zip(samples[4:], labels[4:])])
        assert accuracy > 0.85, (name, accuracy)
        path = tmp_path / f"{name}.npz"
        model.save(path)
        loaded = ResearchGatingModel.load(path)
        assert loaded.get_params() == model.get_params()
        for s in samples[4:]:
            np.testing.assert_array_equal(loaded.predict(s), model.predict(s))
    assert further_baselines["multitask"].classifier_.task_similarity == 0.01
    assert further_baselines["multitask"].pooled_classifier_ is None  # no embedding, no companion
    assert further_baselines["hinge"].classifier_.loss == "hinge"


def test_a_model_file_with_a_bad_task_similarity_is_refused(further_baselines, tmp_path):
    import json

    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.research import ResearchGatingModel

    path = tmp_path / "multitask.npz"
    further_baselines["multitask"].save(path)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    text = json.dumps(meta)
    assert '"task_similarity": 0.01' in text
    for bad_value in ("2.5", "0"):
        arrays["meta"] = np.array(text.replace('"task_similarity": 0.01', f'"task_similarity": {bad_value}'))
        bad = tmp_path / "bad.npz"
        np.savez(bad, **arrays)
        with pytest.raises(ModelFileError, match="task_similarity"):
            ResearchGatingModel.load(bad)


# -- model selection: intercept in the held-out scores, lambda's edge, sigma' ---------------------

def test_held_out_scores_are_those_of_the_fitted_model_intercept_included():
    from gating_core.method.ridge import RidgeStatistics
    from gating_core.method.selection import HyperparameterSearch

    xs, ys = _blobs(6, n=300, seed=3)
    # three cells in four of one class: the intercept carries that prior
    ys = [np.where(np.arange(len(y)) % 4 == 0, y, "neg") for y in ys]
    search = HyperparameterSearch(xs, ys, MarginalTransferClassifier(n_features=64, cells_per_patient=300),
                                  cells_per_patient=300, alphas=(1e-4, 1e-2))
    problem = search.problem
    features = problem.features(problem.feature_map(problem.median_distance_x, problem.median_distance_p))
    stats = problem.statistics(features)
    folds = [[0, 1], [2, 3], [4, 5]]
    alphas, scores = search._score(features, stats, folds, set())
    assert {1e-4, 1e-2} <= set(alphas.tolist())  # (extended if an edge was strictly best)
    for a, alpha in enumerate(alphas):
        accuracy, without_intercept = [], []
        for held in folds:
            rows = [r for r in range(problem.n_rows) if int(problem.source[r]) not in held]
            coef, intercept = RidgeStatistics.solve(stats.eigen(rows), alpha)
            for i in held:
                accuracy.append(np.mean(np.argmax(features[i] @ coef + intercept, axis=1) == problem.targets[i]))
                without_intercept.append(np.mean(np.argmax(features[i] @ coef, axis=1) == problem.targets[i]))
        assert scores[a] == pytest.approx(np.mean(accuracy), abs=1e-12)
        # and the intercept does decide cells here: without it, other cells would be right
        assert np.mean(without_intercept) != pytest.approx(np.mean(accuracy), abs=1e-6)


def test_lambda_grid_is_extended_at_its_edge_and_results_are_unchanged_inside_it():
    xs, ys = _blobs(6, n=300, seed=0)
    base = MarginalTransferClassifier(use_embedding=False, n_features=128, cells_per_patient=300)
    # a grid whose best value is its smallest: the search goes on down by decades
    narrow = select_hyperparameters(xs, ys, base, cells_per_patient=300, alphas=(10.0, 100.0))
    tried = sorted({row["alpha"] for row in narrow.table})
    assert tried[0] < 10.0 and narrow.params["alpha"] < 10.0
    # inside the grid, the choice is the one the search made before the extension existed
    # (values recorded from that version on the same data), only the table has the extra rows
    chosen = select_hyperparameters(xs, ys, MarginalTransferClassifier(n_features=128, cells_per_patient=300),
                                    cells_per_patient=300)
    assert chosen.params == {"bandwidth_x": pytest.approx(2.979724448071709), "use_embedding": True,
                             "bandwidth_p": pytest.approx(0.38545588853961726), "alpha": 0.01,
                             "bandwidth_embedding": pytest.approx(2.979724448071709)}
    assert chosen.score == pytest.approx(0.9988888888888888, abs=1e-12)


def test_the_embedding_bandwidth_is_selected_when_asked():
    from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS

    x, y = ellipse_task(10, 32, 0)[:2]
    base = MarginalTransferClassifier(n_features=64, n_embedding_features=32, cells_per_patient=32)
    fixed = select_hyperparameters(x, y, base, cells_per_patient=32, cv_repeats=1)
    searched = select_hyperparameters(x, y, base, cells_per_patient=32, cv_repeats=1,
                                      embedding_factors=DEFAULT_EMBEDDING_FACTORS)
    assert all("e_factor" not in row for row in fixed.table)
    factors = {row["e_factor"] for row in searched.table if "e_factor" in row}
    assert set(DEFAULT_EMBEDDING_FACTORS) <= factors
    start = fixed.params["bandwidth_embedding"]  # the median distance between cells
    chosen = searched.params["bandwidth_embedding"] / start
    assert any(abs(chosen - f) < 1e-9 for f in factors)
    if searched.params["use_embedding"]:
        # the chosen sigma' scored best among those tried at the chosen sigma_X, sigma_P
        best = max(row["cv_accuracy"] for row in searched.table if row.get("e_factor") is not None)
        assert searched.score == pytest.approx(best) or searched.score >= fixed.score
    clf = MarginalTransferClassifier(n_features=64, n_embedding_features=32, **{k: searched.params[k] for k in
                                                        ("bandwidth_x", "bandwidth_p", "alpha", "bandwidth_embedding")},
                                     use_embedding=searched.params["use_embedding"]).fit(x, y)
    assert clf.bandwidth_embedding_ == pytest.approx(searched.params["bandwidth_embedding"])
