"""Populations adapted to each patient: AdaptiveLDA, and GatingModel's adaptive_weight."""

import json
import zipfile

import numpy as np
import pandas as pd
import pytest

from gating_core import read_fcs
from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.features import content_hashes
from gating_core.method.population_components import LOST_SHARE, adapted_fits, lost_populations
from gating_core.method.ties import TIE_SHARE, TIE_TOLERANCE, break_ties, parts_disagreement, tied_rows, ties_broken
from gating_core.method.unknown_cells import PopulationReach
from gating_core.model import (ADAPTIVE_WEIGHT_TOLERANCE, ADAPTIVE_WEIGHTS, EVEN_ADAPTIVE_WEIGHT,
                               EVEN_WEIGHT_MARGIN, GatingModel)
from gating_core.model.weight_check import TRANSFER_START_WEIGHT, weight_choice
from gating_core.model.file_checks import ModelFileError
from gating_core.model.research import ResearchGatingModel
from modelfile_helpers import rewrite_model_file


def _patient(rng, moved=None, n=3000, shares=(0.6, 0.4)):
    """Two populations in 2-D, A at the origin and B at (3, 0); ``moved``: B's centre in this
    patient (a batch effect)."""
    k = rng.choice(2, size=n, p=shares)
    centres = np.array([[0.0, 0.0], [3.0, 0.0] if moved is None else moved])
    return centres[k] + rng.normal(0, 0.5, (n, 2)), np.where(k == 0, "A", "B")


def test_training_fit_weighs_every_patient_the_same():
    rng = np.random.default_rng(0)
    big, small = _patient(rng, n=4000), _patient(rng, moved=(3.5, 0.5), n=400)
    lda = AdaptiveLDA().fit([big[0], small[0]], [big[1], small[1]])
    # Each patient's cells carry weight 1 / n_i: a patient's population counts by its share there.
    mass = [(c[y == "B"].sum(axis=0) / len(c), np.mean(y == "B")) for c, y in (big, small)]
    expected = sum(m for m, _ in mass) / sum(s for _, s in mass)
    np.testing.assert_allclose(lda.means_[1], expected, rtol=1e-10)
    shares = np.mean([np.mean(big[1] == "A"), np.mean(small[1] == "A")])
    assert lda.priors_[0] == pytest.approx(shares, rel=1e-12)
    assert lda.covariance_.shape == (2, 2) and np.all(np.linalg.eigvalsh(lda.covariance_) > 0)


def test_a_population_moved_beyond_the_training_range_is_followed_by_em():
    rng = np.random.default_rng(1)
    training = [_patient(rng) for _ in range(4)]
    lda = AdaptiveLDA().fit([c for c, _ in training], [y for _, y in training])
    cells, truth = _patient(rng, moved=(1.4, 1.2))  # B now straddles where the training boundary was
    plain = lda.classes_[np.argmax(AdaptiveLDA.proba(cells, lda.training_gaussians()), axis=1)]
    adapted = lda.adapt(cells)
    followed = lda.classes_[np.argmax(AdaptiveLDA.proba(cells, adapted), axis=1)]
    assert np.mean(plain == truth) < 0.85
    assert np.mean(followed == truth) > 0.95
    np.testing.assert_allclose(adapted.means[1], [1.4, 1.2], atol=0.1)  # B's new centre, found without labels
    # No adaptation: the training populations.
    unmoved = AdaptiveLDA(em_steps=0).fit([c for c, _ in training], [y for _, y in training]).adapt(cells)
    np.testing.assert_array_equal(unmoved.means, lda.means_)


def test_adaptation_is_deterministic_and_probabilities_are_distributions():
    rng = np.random.default_rng(2)
    training = [_patient(rng) for _ in range(3)]
    lda = AdaptiveLDA().fit([c for c, _ in training], [y for _, y in training])
    cells, _ = _patient(rng, moved=(2.0, 0.5))
    first, second = lda.adapt(cells), lda.adapt(cells)
    np.testing.assert_array_equal(first.means, second.means)
    proba = AdaptiveLDA.proba(cells, first)
    assert proba.shape == (len(cells), 2) and proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-6)


def test_labels_outside_the_classes_are_refused():
    rng = np.random.default_rng(3)
    cells, labels = _patient(rng)
    with pytest.raises(ValueError, match="not among classes"):
        AdaptiveLDA().fit([cells], [labels], classes=["A"])


@pytest.fixture(scope="module")
def small_cohort():
    from gating_core.synthetic import simulate_centers

    cohort, centers = simulate_centers(3, 2, seed=5, n_events=2500, strength=1.5)
    return [c[0] for c in cohort], [c[1] for c in cohort], [centers[c[0].name] for c in cohort]


@pytest.fixture(scope="module")
def auto_model(small_cohort):
    samples, labels, centers = small_cohort
    return ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500, adaptive_weight="auto").fit(
        samples[:4], labels[:4], groups=centers[:4])


@pytest.mark.parametrize("transfer_start", [False, True])
def test_auto_weight_keeps_the_even_thirds_unless_the_folds_find_them_clearly_worse(small_cohort, auto_model,
                                                                                      transfer_start):
    if transfer_start:
        samples, labels, centers = small_cohort
        auto_model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500, transfer_start=True,
                                         adaptive_weight="auto").fit(samples[:4], labels[:4], groups=centers[:4])
    table = auto_model.selection_["adaptive_weight"]
    assert table["folds"] == 2  # two training centers
    score = {float(w): v for w, v in table["cv_score"].items()}
    assert sorted(score) == list(ADAPTIVE_WEIGHTS)
    for w, accuracies in table["cv_patients"].items():  # one per held-out training patient
        assert len(accuracies) == 4 and all(0 <= a <= 1 for a in accuracies)
        assert np.mean(accuracies) == pytest.approx(table["cv_accuracy"][w])
        assert min(accuracies) == table["cv_worst"][w]
        # the mean plus the next-to-worst patient's accuracy
        assert table["cv_score"][w] == pytest.approx(np.mean(accuracies) + sorted(accuracies)[1])
    # each fold's mean accuracy, from its held-out patients
    folds = np.asarray(table["cv_patient_folds"])
    assert sorted(set(folds.tolist())) == [0, 1]
    for w, accuracies in table["cv_patients"].items():
        want = [np.mean(np.asarray(accuracies)[folds == j]) for j in (0, 1)]
        np.testing.assert_allclose(table["cv_fold_accuracy"][w], want)
    best = max(score.values())
    # The second start is scored (and can be taken) only when the option asks for it.
    assert ("cv_transfer_start" in table) == transfer_start
    transfer = table["cv_transfer_start"]["score"] if transfer_start else -np.inf
    if transfer > best + ADAPTIVE_WEIGHT_TOLERANCE:
        assert (table["chosen"], table["start"]) == (TRANSFER_START_WEIGHT, "transfer")
    else:
        chosen, _, _ = weight_choice({float(w): a for w, a in table["cv_patients"].items()}, folds)
        assert (table["chosen"], table["start"]) == (chosen, "training")
        if score[EVEN_ADAPTIVE_WEIGHT] >= best - EVEN_WEIGHT_MARGIN:
            assert chosen == EVEN_ADAPTIVE_WEIGHT
    assert table["chosen"] == auto_model.adaptive_weight_ and table["start"] == auto_model.adaptive_start_
    assert (auto_model.adaptive_lda_ is None) == (auto_model.adaptive_weight_ == 0)


def test_the_weight_is_left_only_when_the_margin_and_every_fold_say_so():
    # The check of one training half of 12 DLBCL biopsies (six, three of each batch; a fold holds
    # one batch out): fold 0 gates its patients better at the even weight, fold 1 far worse. The
    # new biopsies were gated better at the even weight (dlbcl_03: 0.55 against 0.11 at weight 0).
    accuracy = {0.0: [0.907, 0.8955, 0.874, 0.9489, 0.7997, 0.8713],
                1 / 3: [0.9093, 0.9385, 0.879, 0.96, 0.7405, 0.87],
                2 / 3: [0.9458, 0.9693, 0.8885, 0.843, 0.6958, 0.677],
                1.0: [0.9255, 0.9628, 0.883, 0.7379, 0.6379, 0.3538]}
    folds = [0, 0, 0, 1, 1, 1]
    chosen, score, fold_means = weight_choice(accuracy, folds)
    assert score[0.0] - score[2 / 3] > EVEN_WEIGHT_MARGIN  # the margin alone would leave the even weight
    assert fold_means[2 / 3][0] > fold_means[0.0][0]
    assert chosen == EVEN_ADAPTIVE_WEIGHT
    # every fold agreeing: weight 0
    agreeing = {**accuracy, 2 / 3: [0.9, 0.89, 0.87, 0.843, 0.6958, 0.677]}
    assert weight_choice(agreeing, folds)[0] == 0.0
    # within the margin: the even weight, however the folds lean
    close = {**accuracy, 2 / 3: [a - 0.01 for a in accuracy[0.0]]}
    assert weight_choice(close, folds)[0] == EVEN_ADAPTIVE_WEIGHT
    # ties at the best score go to the most adapted weight
    tied = {0.0: [0.9] * 6, 1 / 3: [0.6] * 6, 2 / 3: [0.5] * 6, 1.0: [0.9] * 6}
    assert weight_choice(tied, folds)[0] == 1.0


def test_auto_weight_leaves_the_generative_fits_where_populations_are_no_gaussians():
    """The JMLR ellipse task: each label is one half of a filled ellipse, which no Gaussian
    (shared covariance or its own) describes. The held-out groups find the even thirds far
    worse than the transfer model, and "auto" leaves them."""
    from gating_core.fcs import Channel, Sample
    from gating_core.synthetic import ellipse_task

    rng = np.random.default_rng(64)
    xs, ys = ellipse_task(64, 256, rng)
    samples = [Sample(f"task_{i:02d}", x.astype(np.float32), [Channel("x"), Channel("y")]) for i, x in enumerate(xs)]
    labels = [np.where(y == 1, "left", "right") for y in ys]
    model = GatingModel().fit(samples, labels)  # as tests/test_model_cli.py trains it from the command line
    table = model.selection_["adaptive_weight"]
    score = {float(w): v for w, v in table["cv_score"].items()}
    assert score[EVEN_ADAPTIVE_WEIGHT] < max(score.values()) - EVEN_WEIGHT_MARGIN
    # Measured: 1.84 at weight 0 (the transfer model alone), 1.26 at the even thirds.
    assert model.adaptive_weight_ == 0.0 and model.adaptive_lda_ is None


def test_em_can_start_from_another_models_posteriors():
    rng = np.random.default_rng(4)
    training = [_patient(rng) for _ in range(3)]
    lda = AdaptiveLDA().fit([c for c, _ in training], [y for _, y in training])
    cells, truth = _patient(rng, moved=(1.4, 1.2))
    # Started from the training populations' own posteriors, it is the EM that starts from them.
    logits = cells @ lda.training_gaussians().coef + lda.training_gaussians().intercept
    own = np.exp(logits - logits.max(axis=1, keepdims=True))
    own /= own.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(lda.adapt(cells, own).means, lda.adapt(cells).means)
    # Started from the true labels, the first M-step puts every population at its own cells.
    exact = np.stack([truth == "A", truth == "B"], axis=1).astype(float)
    one_step = AdaptiveLDA(em_steps=1).fit([c for c, _ in training], [y for _, y in training]).adapt(cells, exact)
    np.testing.assert_allclose(one_step.means[1], cells[truth == "B"].mean(axis=0), rtol=1e-10)
    assert np.mean(lda.classes_[np.argmax(AdaptiveLDA.proba(cells, lda.adapt(cells, exact)), 1)] == truth) > 0.95
    with pytest.raises(ValueError, match="start must be"):
        lda.adapt(cells, exact[:10])


@pytest.fixture(scope="module")
def new_center_fit():
    """Simulated 4-center cohort (seed 22): trained on centers 1, 2 and 4, center 3 held out;
    the model with the second start for EM (ResearchGatingModel's transfer_start, which the
    weight's cross-validation scores), the shared-covariance fit alone."""
    from gating_core.synthetic import simulate_centers

    cohort, centers = simulate_centers(4, 3, seed=22, n_events=6000, strength=2.0)
    train = [c for c in cohort if centers[c[0].name] != "center_3"]
    held = [c for c in cohort if centers[c[0].name] == "center_3"]
    model = ResearchGatingModel(random_state=0, transfer_start=True, adaptive_weight="auto", adaptive_shapes=False).fit(
        [c[0] for c in train], [c[1] for c in train], groups=[centers[c[0].name] for c in train])
    return model, held


def test_em_starts_from_the_transfer_model_where_the_held_out_centers_ask_for_it(new_center_fit, tmp_path):
    """On this new center EM from the training populations lets the monocytes take a third of
    the granulocytes; the held-out training centers say EM from the transfer model's posteriors
    is better (0.996 / 0.985 against 0.962 / 0.818 for the best weight), and so the option takes
    it here."""
    model, held = new_center_fit
    table = model.selection_["adaptive_weight"]
    assert (model.adaptive_start_, model.adaptive_weight_) == ("transfer", TRANSFER_START_WEIGHT)
    assert table["start"] == "transfer"

    def accuracies(m):
        return [np.mean(m.predict(s) == np.asarray(y).astype(str)) for s, y in held]

    chosen = accuracies(model)
    # Measured: 0.991 mean, 0.978 worst patient; EM from the training populations at weight 1
    # (what the default, without the option, gates this center with): 0.636 / 0.402.
    assert np.mean(chosen) > 0.95 and np.min(chosen) > 0.9
    model.adaptive_start_, model.adaptive_weight_ = "training", 1.0
    try:
        assert np.mean(accuracies(model)) < 0.8
    finally:
        model.adaptive_start_, model.adaptive_weight_ = "transfer", TRANSFER_START_WEIGHT
    # The model file keeps the option and the start (a ResearchGatingModel's file); files before
    # format 8 start from the training populations.
    path = tmp_path / "m.npz"
    model.save(path)
    with pytest.raises(ModelFileError, match="transfer_start"):
        GatingModel.load(path)
    loaded = ResearchGatingModel.load(path)
    assert loaded.adaptive_start_ == "transfer" and loaded.transfer_start
    np.testing.assert_array_equal(loaded.predict_proba(held[0][0]), model.predict_proba(held[0][0]))
    with zipfile.ZipFile(path) as z:
        arrays = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    meta = json.loads(str(arrays.pop("meta")))
    old = dict(meta, format_version=7, adaptive={k: v for k, v in meta["adaptive"].items() if k != "start"})
    assert ResearchGatingModel.load(rewrite_model_file(arrays, tmp_path / "old.npz", old)).adaptive_start_ == "training"
    bad = dict(meta, adaptive=dict(meta["adaptive"], start="elsewhere"))
    with pytest.raises(ModelFileError, match="start"):
        ResearchGatingModel.load(rewrite_model_file(arrays, tmp_path / "bad.npz", bad))
    # A file written while the second start was the default's (a GatingModel's, without the
    # option) still gates with the start it stored.
    earlier = dict(meta, format_version=8, adaptive={k: v for k, v in meta["adaptive"].items() if k != "shapes"},
                   params={k: v for k, v in meta["params"].items() if k not in ("transfer_start", "adaptive_shapes")})
    assert GatingModel.load(rewrite_model_file(arrays, tmp_path / "earlier.npz", earlier)).adaptive_start_ == "transfer"
    with pytest.raises(ValueError, match="transfer_start is scored by the cross-validation"):
        ResearchGatingModel(transfer_start=True, adaptive_weight=0.5).fit([h[0] for h in held], [h[1] for h in held])


def test_gating_mixes_the_adapted_populations_at_the_weight(small_cohort, auto_model):
    samples, _, _ = small_cohort
    new = samples[5]
    for weight in (0.0, 0.5, 1.0):
        model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500,
                                    adaptive_weight=weight).fit(samples[:4], small_cohort[1][:4])
        proba = model.predict_proba(new)
        transfer = model._proba(model.standardised_cells(new), model.patient_embedding(new), 50_000)
        if weight == 0:
            assert model.adaptive_lda_ is None
            np.testing.assert_allclose(proba, transfer, atol=1e-6)
            continue
        chosen = model._patient_frame(model._compensated(new).events, model._channel_indices(new))[2]
        ordered = chosen[np.argsort(content_hashes(chosen), kind="stable")]
        cells = model.standardised_cells(new)
        reach = model.population_reach_
        gaussians, patient = adapted_fits(model.adaptive_lda_, reach, ordered, model.unknown_margin)
        shared = AdaptiveLDA.proba(cells, gaussians)
        own = reach.proba(cells, patient)
        np.testing.assert_allclose(proba, (1 - weight) * transfer + weight * (shared + own) / 2, atol=1e-5)


def test_the_default_weighs_the_transfer_model_and_each_generative_fit_a_third(small_cohort):
    samples, labels, _ = small_cohort
    model = GatingModel(select=False, cells_per_patient=1500, adaptive_weight=EVEN_ADAPTIVE_WEIGHT).fit(
        samples[:4], labels[:4])
    assert model.adaptive_weight_ == pytest.approx(2 / 3) and model.adaptive_shapes_
    assert GatingModel().adaptive_weight == "auto" and EVEN_ADAPTIVE_WEIGHT == pytest.approx(2 / 3)
    new = samples[5]
    cells = model.standardised_cells(new)
    transfer = model._proba(cells, model.patient_embedding(new), 50_000)
    adjust = _adjustment(model, new)
    shared = AdaptiveLDA.proba(cells, adjust.gaussians)
    own = model.population_reach_.proba(cells, adjust.shapes[1])
    np.testing.assert_allclose(model.predict_proba(new), (transfer + shared + own) / 3, atol=1e-5)
    # Without the own shapes (a research option), the shared-covariance fit takes their share.
    alone = ResearchGatingModel(select=False, cells_per_patient=1500, adaptive_shapes=False).fit(samples[:4],
                                                                                                 labels[:4])
    assert not alone.adaptive_shapes_ and _adjustment(alone, new).shapes is None


def test_ties_of_the_adapted_populations_are_found_and_broken_by_another_model():
    half = np.float32(0.5)
    proba = np.array([[half, half, 0.0],                       # the two fits each sure of another
                      [0.0, half + np.float32(3e-7), half - np.float32(3e-7)],  # float32 rounding apart
                      [0.1, 0.6, 0.3],
                      [0.4999, 0.5001, 0.0],                   # apart by 2e-4: no tie
                      [1 / 3, 1 / 3, 1 / 3],
                      [0.0, half, half]], dtype=np.float32)
    rows = tied_rows(proba)
    np.testing.assert_array_equal(rows, [0, 1, 4, 5])
    assert tied_rows(proba[:, :1]).size == 0 and tied_rows(proba[:0]).size == 0
    breaker = np.array([[0.0, 0.3, 0.7],     # prefers column 1 of the tied 0 and 1; 2 is no candidate
                        [0.0, 4e-7, 5e-7],   # prefers the column 2, tied with 1, however slightly
                        [0.2, 0.2, 0.6],
                        [0.9, 0.05, 0.05]],  # ties too between the tied 1 and 2: the first listed
                       dtype=np.float32)
    before = proba.copy()
    broken = break_ties(proba, rows, breaker)
    assert broken is proba and broken.dtype == np.float32
    np.testing.assert_array_equal(broken.argmax(axis=1), [1, 2, 1, 1, 2, 1])
    np.testing.assert_array_equal(broken[[2, 3]], before[[2, 3]])  # untied rows keep their bits
    assert np.abs(broken - before).max() <= TIE_SHARE
    np.testing.assert_allclose(broken.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(broken[0], [0.4995, 0.5005, 0.0], atol=1e-7)
    assert TIE_TOLERANCE < TIE_SHARE
    # The breaker is asked about the tied rows only, and not at all where none ties.
    asked = []

    def breaker_of(tied):
        asked.append(tied.copy())
        return breaker[: len(tied)]

    np.testing.assert_array_equal(ties_broken(before.copy(), breaker_of), broken)
    np.testing.assert_array_equal(asked[0], [0, 1, 4, 5])
    untied = before[[2, 3]].copy()
    assert ties_broken(untied, breaker_of) is untied and len(asked) == 1
    np.testing.assert_array_equal(untied, before[[2, 3]])


def test_the_parts_disagree_where_the_adapted_populations_tie_whatever_the_names():
    transfer = np.array([[0.8, 0.1, 0.1],   # a; adapted a: agree
                         [0.1, 0.8, 0.1],   # b; adapted a: differ
                         [0.1, 0.8, 0.1],   # b; adapted tie a / b: differ (they name none)
                         [0.8, 0.1, 0.1],   # a; adapted tie a / b: differ
                         [0.1, 0.1, 0.8]],  # c; adapted c, by 2e-4 over b: no tie, agree
                        dtype=np.float32)
    adapted = np.array([[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0],
                        [0.0, 0.4999, 0.5001]], dtype=np.float32)
    assert parts_disagreement(transfer, adapted) == pytest.approx(0.6)
    # The populations in another order (other names): the same share, where a tie's first
    # population would have moved it.
    order = [2, 1, 0]
    assert parts_disagreement(transfer[:, order], adapted[:, order]) == pytest.approx(0.6)
    assert parts_disagreement(transfer[:0], adapted[:0]) == 0.0


def test_the_review_flag_counts_the_adapted_populations_ties(small_cohort):
    samples, labels, _ = small_cohort
    model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500,
                                adaptive_weight=EVEN_ADAPTIVE_WEIGHT).fit(samples[:4], labels[:4])
    new = samples[5]
    _, embedding, chosen = model._patient_frame(model._compensated(new).events, model._channel_indices(new))
    adjust = model._patient_adjustment(chosen, embedding)
    transfer = model._transfer_proba(chosen, embedding, 50_000, adjust)
    calls = transfer.argmax(axis=1)
    # Every third cell tied between the transfer model's choice and another population; the
    # others called as the transfer model calls them.
    other = (calls + 1) % transfer.shape[1]
    tied = np.arange(len(chosen)) % 3 == 0
    proba = np.zeros_like(transfer)
    proba[np.arange(len(chosen)), calls] = np.where(tied, 0.5, 1.0)
    proba[np.arange(len(chosen))[tied], other[tied]] = 0.5
    adjust.adapted = lambda c: proba[:len(c)].copy()
    adjust.disagreement = None
    assert model._parts_disagreement(chosen, embedding, adjust) == pytest.approx(np.mean(tied))


def test_alone_the_adapted_populations_give_a_tie_to_the_transfer_models_choice(small_cohort):
    """Where the shared-covariance and own-shape fits are each sure of another population, their
    mean ties; the call then follows the transfer model, at a weight of 1 and in the adapted part,
    not the first population name, and the other cells keep the adapted populations' bits."""
    samples, labels, _ = small_cohort
    model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500, adaptive_weight=1.0).fit(
        samples[:4], labels[:4])
    new = samples[5]
    cells = model.standardised_cells(new)[:600]
    embedding = model.patient_embedding(new)
    adjust = _adjustment(model, new)
    transfer = model._transfer_proba(cells, embedding, 50_000, adjust)
    assert transfer.shape[1] >= 3
    # Every other cell tied between the transfer model's second and third choices (where those
    # lie apart by far more than rounding), the others clear of any tie.
    order = np.argsort(-transfer, axis=1, kind="stable")
    rows = np.arange(len(cells))
    second, third = order[:, 1], order[:, 2]
    apart = transfer[rows, second] - transfer[rows, third] > 1e-4
    tied = (rows % 2 == 0) & apart
    proba = np.zeros_like(transfer)
    proba[rows, second] = np.where(tied, 0.5, 0.6)
    proba[rows, third] = np.where(tied, 0.5, 0.4)
    adjust.adapted = lambda c: proba[:len(c)].copy()
    by_name = np.minimum(second, third)
    assert tied.sum() > 100 and np.mean(second[tied] != by_name[tied]) > 0.2  # a break by name would differ
    for part in ("adapted", None):
        gated = model._adjusted_proba(cells, embedding, 50_000, adjust, part=part)
        np.testing.assert_array_equal(gated.argmax(axis=1)[tied], second[tied])
        np.testing.assert_array_equal(gated[~tied], proba[~tied])
        np.testing.assert_allclose(gated, proba, atol=float(TIE_SHARE))


def test_the_weight_check_scores_the_adapted_populations_alone_with_their_ties_broken(small_cohort, monkeypatch):
    """The check's score of a weight of 1 is that of gating at it: every held-out cell tied between
    the first population and the largest one goes where the fold's transfer model sends it."""
    from gating_core.method.self_training import PatientAdjustment

    samples, labels, centers = small_cohort
    names = sorted(np.unique(np.concatenate(labels[:4])).tolist())
    counts = pd.Series(np.concatenate(labels[:4])).value_counts()
    largest = names.index(counts.index[0])
    assert largest != 0

    def tied(self, cells):
        proba = np.zeros((len(cells), len(names)), dtype=np.float32)
        proba[:, [0, largest]] = 0.5
        return proba

    monkeypatch.setattr(PatientAdjustment, "adapted", tied)
    model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500, adaptive_weight="auto").fit(
        samples[:4], labels[:4], groups=centers[:4])
    scored = model.selection_["adaptive_weight"]["cv_patients"]["1.0"]
    assert len(scored) == 4
    first_share = [np.mean(np.asarray(y) == names[0]) for y in labels[:4]]
    largest_share = [np.mean(np.asarray(y) == names[largest]) for y in labels[:4]]
    # By name every held-out cell would be called the first population (its share the patient's
    # accuracy); broken by the transfer model, the largest population's cells are mostly called
    # right. (The check lists its patients fold by fold: compared in
    # order of accuracy; the check scores the 1,500 cells drawn of each, so the shares within 0.03.)
    floor = sorted(f + 0.8 * l - 0.03 for f, l in zip(first_share, largest_share))
    assert all(a >= f for a, f in zip(sorted(scored), floor)), (scored, floor)


def _adjustment(model, sample):
    """What the model does for this patient beyond the transfer model (its PatientAdjustment)."""
    _, embedding, chosen = model._patient_frame(model._compensated(sample).events, model._channel_indices(sample))
    return model._patient_adjustment(chosen, embedding)


def test_own_shape_posteriors_are_those_of_the_gaussians():
    """PopulationReach.proba: each population a Gaussian of its own covariance around the
    patient's mean, weighed by the patient's shares; checked against the densities written out."""

    rng = np.random.default_rng(3)
    training = [_patient(rng) for _ in range(3)]
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], ["A", "B"])
    cells, truth = _patient(rng, moved=(3.6, 0.8), shares=(0.3, 0.7))
    patient = reach.for_patient(cells)
    means, shares = reach.patient_populations(cells)
    np.testing.assert_array_equal(patient.means, means)
    assert shares.sum() == pytest.approx(1.0) and shares[1] > shares[0]  # the patient's own shares
    proba = reach.proba(cells, patient)
    logs = []
    for j in range(2):
        precision = reach.whitening_[j] @ reach.whitening_[j].T
        centred = cells - means[j]
        logs.append(np.log(shares[j]) - 0.5 * reach.log_dets_[j]
                    - 0.5 * np.einsum("nd,de,ne->n", centred, precision, centred))
    logs = np.stack(logs, axis=1)
    expected = np.exp(logs - logs.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    assert proba.dtype == np.float32
    np.testing.assert_allclose(proba, expected, atol=1e-4)
    assert np.mean(np.array(["A", "B"])[proba.argmax(axis=1)] == truth) > 0.95


def test_the_model_file_keeps_the_adapted_populations(tmp_path, small_cohort):
    samples, labels, _ = small_cohort
    model = ResearchGatingModel(select=False, n_augment=1, cells_per_patient=1500,
                                adaptive_weight=0.5).fit(samples[:4], labels[:4])
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = ResearchGatingModel.load(path)
    assert loaded.adaptive_weight_ == 0.5 and loaded.adaptive_shapes_
    np.testing.assert_array_equal(loaded.adaptive_lda_.means_, model.adaptive_lda_.means_)
    np.testing.assert_array_equal(loaded.predict_proba(samples[5]), model.predict_proba(samples[5]))
    # A file of format 8 adapted the shared-covariance fit alone, and still does.
    with zipfile.ZipFile(path) as z:
        arrays8 = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    meta8 = json.loads(str(arrays8.pop("meta")))
    meta8 = dict(meta8, format_version=8, adaptive={k: v for k, v in meta8["adaptive"].items() if k != "shapes"},
                 params={k: v for k, v in meta8["params"].items() if k != "adaptive_shapes"})
    eight = ResearchGatingModel.load(rewrite_model_file(arrays8, tmp_path / "eight.npz", meta8))
    assert not eight.adaptive_shapes_
    model.adaptive_shapes_ = False
    try:
        np.testing.assert_allclose(eight.predict_proba(samples[5]), model.predict_proba(samples[5]), atol=1e-6)
    finally:
        model.adaptive_shapes_ = True
    # The own shapes without the populations' shapes and reach: refused.
    meta9 = json.loads(str(np.load(path)["meta"]))
    shapeless = {k: v for k, v in meta9.items() if k != "reach"}
    with pytest.raises(ModelFileError, match="own shapes without the populations' reach"):
        ResearchGatingModel.load(rewrite_model_file(arrays8, tmp_path / "shapeless.npz", shapeless,
                                                    drop=[n for n in arrays8 if n.startswith("reach_")]))
    # A file written before the adapted populations gates without them.
    with zipfile.ZipFile(path) as z:
        arrays = {n[:-4]: np.load(z.open(n)) for n in z.namelist()}
    meta = json.loads(str(arrays.pop("meta")))
    meta["format_version"] = 5
    del meta["adaptive"], meta["params"]["adaptive_weight"]
    old = rewrite_model_file(arrays, tmp_path / "old.npz", meta,
                             drop=("adaptive_means", "adaptive_covariance", "adaptive_priors", "adaptive_components"))
    previous = ResearchGatingModel.load(old)
    assert previous.adaptive_weight == 0.0 and previous.adaptive_lda_ is None
    # Arrays without their description, or a covariance that is none, are refused.
    with pytest.raises(ModelFileError, match="adaptive arrays in a model without them"):
        ResearchGatingModel.load(rewrite_model_file({**arrays}, tmp_path / "stray.npz", meta))
    meta6 = json.loads(str(np.load(path)["meta"]))
    broken = dict(arrays, adaptive_covariance=-np.eye(len(model.channels_)))
    with pytest.raises(ModelFileError, match="not a covariance"):
        ResearchGatingModel.load(rewrite_model_file(broken, tmp_path / "bad.npz", meta6))


@pytest.mark.parametrize("weight", [-0.1, 1.5, "half", True])
def test_a_bad_adaptive_weight_is_refused(weight, small_cohort):
    samples, labels, _ = small_cohort
    with pytest.raises(ValueError, match="adaptive_weight must be 'auto' or a number within"):
        GatingModel(select=False, adaptive_weight=weight).fit(samples[:3], labels[:3])


def test_adapted_populations_follow_the_shared_flow_batch_shift(dlbcl_dir):
    """Real data: FlowCAP DLBCL, trained on batch 1, gated on batch 2 where the FL1+FL4+ cluster
    sits at FL4 680-810 against 350-540: LDA refitted to each patient by EM beats plain LDA."""
    groups = pd.read_csv(dlbcl_dir / "groups.csv")
    first = [p for p, g in zip(groups["patient"], groups["group"]) if g == "batch1"]
    second = [p for p, g in zip(groups["patient"], groups["group"]) if g == "batch2"]

    def load(name):
        sample = read_fcs(dlbcl_dir / f"{name}.fcs")
        labels = pd.read_csv(dlbcl_dir / f"{name}.labels.csv")["population"].astype(str).to_numpy()
        return sample.events / 1024.0, labels  # channel numbers, as the default transform takes them

    rng = np.random.default_rng(0)
    train = [load(p) for p in first]
    drawn = [rng.choice(len(x), min(len(x), 4000), replace=False) for x, _ in train]
    lda = AdaptiveLDA().fit([x[i] for (x, _), i in zip(train, drawn)], [y[i] for (_, y), i in zip(train, drawn)])
    plain, adapted = [], []
    for name in second:
        cells, truth = load(name)
        plain.append(np.mean(lda.classes_[np.argmax(AdaptiveLDA.proba(cells, lda.training_gaussians()), 1)] == truth))
        adapted.append(np.mean(lda.classes_[np.argmax(AdaptiveLDA.proba(cells, lda.adapt(cells)), 1)] == truth))
    # Measured: plain 0.901 mean / 0.761 worst patient; adapted 0.936 / 0.868.
    assert np.mean(adapted) > np.mean(plain) + 0.02
    assert np.min(adapted) > np.min(plain) + 0.05


def _three_populations(rng, n, shares, means, spreads):
    counts = rng.multinomial(n, shares)
    cells = np.concatenate([rng.multivariate_normal(m, np.eye(2) * s, size=k) for m, s, k in zip(means, spreads, counts)])
    return cells, np.repeat(np.array(["A", "B", "C"]), counts)


def test_a_population_absent_from_the_patient_does_not_take_the_cluster_of_a_rare_one():
    """Training: A holds 60% of the cells, B (a wide catch-all) 10%. The new patient has no A
    cell and 85% B, tighter and closer to where A was. Started from the training shares, the
    own-shape EM gives the cluster to A, whose shape fits it; started from the shares the
    shared-covariance fit found in the patient, B keeps it."""
    rng = np.random.default_rng(1)
    means, spreads = [(0, 0), (4, 0), (0, 5)], [1.0, 2.0, 0.5]
    training = [_three_populations(rng, 3000, [0.6, 0.1, 0.3], [np.add(m, rng.normal(0, 0.2, 2)) for m in means],
                                   spreads) for _ in range(5)]
    cells, truth = _three_populations(rng, 3000, [0.0, 0.85, 0.15], [(0, 0), (3.5, 0), (0, 5)], [1.0, 0.6, 0.5])
    classes = np.array(["A", "B", "C"])
    lda = AdaptiveLDA().fit([c for c, _ in training], [y for _, y in training], classes=classes)
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], classes)
    gaussians, own = adapted_fits(lda, reach, cells)
    np.testing.assert_allclose(own.log_shares, reach.for_patient(cells, shares=np.exp(gaussians.log_shares)).log_shares)
    assert np.exp(gaussians.log_shares)[0] < 0.15
    assert np.mean(classes[np.argmax(reach.proba(cells, own), 1)] == truth) > 0.95
    from_training = reach.for_patient(cells)
    assert np.mean(classes[np.argmax(reach.proba(cells, from_training), 1)] == truth) < 0.5


def test_the_own_shape_em_starts_again_where_it_lost_a_population_the_shared_fit_found():
    """Training: A, tight (variance 0.1), holds 60% of the cells beside B, wide (variance 3). In
    the new patient A moved by (2, 2), six of its own standard deviations: from the training
    means the own-shape EM gives A's cells to B and leaves A none, while the shared-covariance fit
    finds A's share. Started again from the shared fit's means, the own-shape fit keeps A; moved
    by (1, 1), it follows A itself and is not fitted again."""
    rng = np.random.default_rng(2)
    means, spreads = [(0, 0), (5, 0), (0, 6)], [0.1, 3.0, 0.5]
    training = [_three_populations(rng, 3000, [0.6, 0.2, 0.2], [np.add(m, rng.normal(0, 0.1, 2)) for m in means],
                                   spreads) for _ in range(5)]
    classes = np.array(["A", "B", "C"])
    lda = AdaptiveLDA().fit([c for c, _ in training], [y for _, y in training], classes=classes)
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], classes)

    def accuracy(cells, truth, patient):
        return np.mean(classes[np.argmax(reach.proba(cells, patient), 1)] == truth)

    cells, truth = _three_populations(rng, 3000, [0.6, 0.2, 0.2], [(2, 2), (5, 0), (0, 6)], spreads)
    gaussians, own = adapted_fits(lda, reach, cells)
    shares = np.exp(gaussians.log_shares)
    from_training = reach.for_patient(cells, shares=shares)
    assert shares[0] > 0.55 and np.exp(from_training.log_shares)[0] * len(cells) < 3
    np.testing.assert_array_equal(lost_populations(shares, np.exp(from_training.log_shares), len(cells)),
                                  [True, False, False])
    assert accuracy(cells, truth, from_training) < 0.5
    np.testing.assert_allclose(own.means, reach.for_patient(cells, shares=shares, means=gaussians.means).means)
    assert reach.log_likelihood(cells, own) > reach.log_likelihood(cells, from_training) + 1.0
    assert np.exp(own.log_shares)[0] > 0.55
    assert accuracy(cells, truth, own) > 0.95

    # Had no training patient held more than a quarter of A, its 60% here would be a swelling.
    np.testing.assert_array_equal(adapted_fits(lda, reach, cells, largest=[0.25, 1.0, 1.0])[1].means,
                                  from_training.means)

    class StartsBadly(PopulationReach):
        """Scores every fit started away from the training means as the less likely."""

        def log_likelihood(self, cells, patient):
            return -np.inf if not np.allclose(patient.means, from_training.means) else 0.0

    unlikely = StartsBadly()
    unlikely.__dict__.update(reach.__dict__)
    np.testing.assert_array_equal(adapted_fits(lda, unlikely, cells)[1].means, from_training.means)

    cells, truth = _three_populations(rng, 3000, [0.6, 0.2, 0.2], [(1, 1), (5, 0), (0, 6)], spreads)
    gaussians, own = adapted_fits(lda, reach, cells)
    from_training = reach.for_patient(cells, shares=np.exp(gaussians.log_shares))
    assert not lost_populations(np.exp(gaussians.log_shares), np.exp(from_training.log_shares), len(cells)).any()
    np.testing.assert_array_equal(own.means, from_training.means)
    assert accuracy(cells, truth, own) > 0.95


def test_a_population_is_lost_when_the_own_shape_fit_leaves_it_no_cell_the_shared_fit_gives_it():
    shared = np.array([0.5, LOST_SHARE, 0.4 - LOST_SHARE / 2, LOST_SHARE / 2])
    own = np.array([1e-9, 1e-9, 0.6, 0.4 - 2e-9])
    # 1,000 cells: a share under 0.003 is fewer than 3 cells.
    np.testing.assert_array_equal(lost_populations(shared, own, 1000), [True, True, False, False])
    # 10 of 1,000 cells are still a population the own-shape EM followed.
    np.testing.assert_array_equal(lost_populations(shared, [0.01, 0.01, 0.58, 0.4], 1000), [False] * 4)
    # Shares need not be normalised.
    np.testing.assert_array_equal(lost_populations(2 * shared, 3 * own, 1000), [True, True, False, False])
    # With components, a population is lost only when all its components are: the first two
    # columns are one population, whose second component kept the cells.
    np.testing.assert_array_equal(lost_populations(shared, [1e-9, 0.5, 0.3, 0.2], 1000, starts=[0, 2, 3]),
                                  [False, False, False])
    np.testing.assert_array_equal(lost_populations(shared, own, 1000, starts=[0, 2, 3]), [True, False, False])
    # A population the shared fit gives more than twice its largest training share swelled
    # there: it is not taken for lost.
    largest = np.array([0.2, LOST_SHARE / 2, 0.5, 0.1])
    np.testing.assert_array_equal(lost_populations(shared, own, 1000, largest=largest), [False, True, False, False])


def test_the_own_shape_log_likelihood_is_the_mixture_density_without_its_constant():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(3)
    training = [_three_populations(rng, 800, [0.5, 0.3, 0.2], [(0, 0), (4, 0), (0, 5)], [1.0, 2.0, 0.5])
                for _ in range(3)]
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], np.array(["A", "B", "C"]))
    cells = training[0][0][:300]
    patient = reach.for_patient(cells)
    covariances = [np.linalg.inv(w @ w.T) for w in reach.whitening_]
    density = sum(np.exp(s) * multivariate_normal(m, c).pdf(cells)
                  for s, m, c in zip(patient.log_shares, patient.means, covariances))
    expected = np.mean(np.log(density)) + np.log(2 * np.pi)  # d / 2 log(2 pi), d = 2
    assert reach.log_likelihood(cells, patient) == pytest.approx(expected, rel=1e-9)
    assert reach.log_likelihood(cells[:0], patient) == 0.0


def test_the_own_shape_em_refuses_means_it_cannot_start_from():
    rng = np.random.default_rng(0)
    training = [_three_populations(rng, 600, [0.5, 0.3, 0.2], [(0, 0), (4, 0), (0, 5)], [1.0, 1.0, 1.0]) for _ in range(2)]
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], np.array(["A", "B", "C"]))
    for means in (np.zeros((2, 2)), np.zeros((3, 3)), [[0, 0], [np.nan, 0], [0, 5]]):
        with pytest.raises(ValueError, match="means"):
            reach.for_patient(training[0][0], means=means)
    # Started at the training means, the EM is the one without a start.
    np.testing.assert_array_equal(reach.patient_populations(training[0][0], means=reach.means_)[0],
                                  reach.patient_populations(training[0][0])[0])


def test_the_own_shape_em_refuses_shares_it_cannot_start_from():
    rng = np.random.default_rng(0)
    training = [_three_populations(rng, 600, [0.5, 0.3, 0.2], [(0, 0), (4, 0), (0, 5)], [1.0, 1.0, 1.0]) for _ in range(2)]
    reach = PopulationReach().fit([c for c, _ in training], [y for _, y in training], np.array(["A", "B", "C"]))
    for shares in ([0.5, 0.5], [0.0, 0.0, 0.0], [0.5, -0.1, 0.6]):
        with pytest.raises(ValueError, match="shares"):
            reach.for_patient(training[0][0], shares=shares)
    np.testing.assert_allclose(reach.patient_populations(training[0][0], shares=[2.0, 1.0, 1.0])[1].sum(), 1.0)
