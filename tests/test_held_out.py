"""The held-out check by subtraction (gating_core.evaluation.held_out): each fold fitted from the statistics
of all patients minus the held-out ones, selection included, without refitting from files."""

import numpy as np
import pytest

from gating_core.evaluation import leave_one_group_out, leave_one_patient_out, summarize
from gating_core.evaluation.held_out import _SharedProblems, fold_models
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.selection import HyperparameterSearch, select_hyperparameters
from gating_core.method.training_problem import TrainingProblem
from gating_core.synthetic import simulate_centers


@pytest.fixture(scope="module")
def cohort():
    # Three centers of two patients: small enough for a unit test, different enough to matter.
    patients, centers = simulate_centers(3, 2, seed=5, n_events=3000, strength=2.0)
    samples, labels = [p[0] for p in patients], [np.asarray(p[1]).astype(str) for p in patients]
    return samples, labels, [centers[s.name] for s in samples]


def _standardised(samples, labels, n_cells=800):
    """Per-patient standardised cells (fewer than cells_per_patient: every cell is drawn)."""
    from gating_core.model import GatingModel
    from gating_core.model.digest import digest_patient

    model = GatingModel(cells_per_patient=n_cells)
    digests = [digest_patient(s, y, n_cells, 5000, seed=model.digest_seed(i)) for i, (s, y) in
               enumerate(zip(samples, labels))]
    return model.prepare_digests(digests)


def test_a_fold_by_subtraction_is_the_fit_on_its_training_patients(cohort):
    # With the bandwidths given and no augmentation, nothing is drawn from the random stream
    # per patient, so a fold fitted by subtraction must equal a fit on its patients alone.
    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    params = {**MarginalTransferClassifier().get_params(), "cells_per_patient": 1000, "n_features": 128,
              "bandwidth_x": 2.0, "bandwidth_p": 0.6, "bandwidth_embedding": 2.0, "alpha": 1e-3, "n_augment": 0}
    kept = [0, 1, 3, 5]
    by_subtraction = _SharedProblems(cells, drawn, embedding_cells, groups).fit_folds([params], [kept])[0]
    direct = MarginalTransferClassifier(**params).fit(
        [cells[i] for i in kept], [drawn[i] for i in kept], groups=[groups[i] for i in kept],
        embedding_samples=[embedding_cells[i] for i in kept])
    np.testing.assert_allclose(by_subtraction.coef_, direct.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(by_subtraction.intercept_, direct.intercept_, rtol=1e-5, atol=1e-6)
    assert by_subtraction.temperature_ == pytest.approx(direct.temperature_, rel=1e-5)
    assert by_subtraction.n_patients_ == 4
    np.testing.assert_array_equal(by_subtraction.classes_, direct.classes_)
    np.testing.assert_allclose(by_subtraction.train_embeddings_, direct.train_embeddings_, rtol=1e-6)


def test_a_subset_drops_the_classes_only_the_held_out_patients_had():
    rng = np.random.default_rng(0)
    cells = [rng.normal(size=(50, 2)).astype(np.float32) for _ in range(3)]
    labels = [np.array(["a", "b"] * 25), np.array(["a", "b"] * 25), np.array(["a", "c"] * 25)]
    problem = TrainingProblem(MarginalTransferClassifier(n_features=16, n_embedding_features=8), cells, labels)
    sub = problem.subset([0, 1])
    assert list(sub.classes) == ["a", "b"] and list(sub.class_columns) == [0, 1]
    assert sub.n_patients == 2 and list(sub.parent_rows) == [0, 1]
    stats = problem.statistics(problem.features(problem.feature_map(1.0, 1.0)))
    assert stats.subset(sub.parent_rows, sub.class_columns).cross[0].shape == (16, 2)


def test_selection_runs_for_several_exclusions_at_once_as_it_would_alone(cohort):
    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    base = MarginalTransferClassifier(n_features=128)
    alone = select_hyperparameters(cells, drawn, base, embedding_cells, cells_per_patient=400, groups=groups)
    search = HyperparameterSearch(cells, drawn, base, embedding_cells, cells_per_patient=400, groups=groups)
    together = search.run([(), (0, 1), (4,)])
    assert together[0].params == alone.params and together[0].table == alone.table
    # A run without patients 0 and 1 scores folds of the other four only.
    assert all(not {0, 1} & set(fold) for fold in search.folds((0, 1)))
    assert sorted(set().union(*map(set, search.folds((0, 1))))) == [2, 3, 4, 5]
    assert together[1].params["bandwidth_x"] > 0 and 0 < together[1].score <= 1


def test_no_label_of_a_held_out_patient_reaches_its_fold(cohort):
    samples, labels, groups = cohort
    settings = {"n_features": 128, "cells_per_patient": 1000, "selection_cells_per_patient": 400}
    scrambled = list(labels)
    scrambled[2] = np.random.default_rng(1).permutation(labels[2])
    first = fold_models(samples, labels, [[2]], settings, groups)[0]
    second = fold_models(samples, scrambled, [[2]], settings, groups)[0]
    np.testing.assert_array_equal(first.classifier_.coef_, second.classifier_.coef_)
    np.testing.assert_array_equal(first.pooled_classifier_.coef_, second.pooled_classifier_.coef_)
    assert first.selection_["params"] == second.selection_["params"]
    assert first.training_patients_ == [s.name for i, s in enumerate(samples) if i != 2]
    assert first.groups_ == [g for i, g in enumerate(groups) if i != 2]
    assert first.pooled_weight_ == 0.5
    # The held-out patient is new to its fold's novelty reference.
    assert len(first.novelty_nn_) == 5


def test_leaving_one_patient_out_by_subtraction_agrees_with_full_refits(cohort):
    samples, labels, groups = cohort
    settings = {"n_features": 128, "cells_per_patient": 1000, "selection_cells_per_patient": 400}
    fast = leave_one_patient_out(samples, labels, methods=("marginal", "pooled-logistic"), model_params=settings,
                                 groups=groups)
    full = leave_one_patient_out(samples, labels, methods=("marginal", "pooled-logistic"), model_params=settings,
                                 groups=groups, refit="full")
    assert list(fast["patient"]) == list(full["patient"]) and list(fast["method"]) == list(full["method"])
    difference = np.abs(fast["accuracy"].to_numpy() - full["accuracy"].to_numpy())
    print(fast.assign(full=full["accuracy"])[["patient", "method", "accuracy", "full"]].to_string())
    assert difference.max() < 0.04  # measured 0.023
    fast_summary, full_summary = summarize(fast).set_index("method"), summarize(full).set_index("method")
    assert abs(fast_summary.loc["marginal", "mean_accuracy"] - full_summary.loc["marginal", "mean_accuracy"]) < 0.01


def test_leaving_a_center_out_by_subtraction_flatters_it_so_it_is_not_the_default(cohort):
    # A held-out center takes a third of the shared standardisation here; full refits are the
    # default of leave_one_group_out for that reason. This pins the size of the effect.
    samples, labels, groups = cohort
    settings = {"n_features": 128, "cells_per_patient": 1000, "selection_cells_per_patient": 400}
    fast = leave_one_group_out(samples, labels, groups, methods=("marginal",), model_params=settings,
                               refit="subtract")
    full = leave_one_group_out(samples, labels, groups, methods=("marginal",), model_params=settings)
    by_center = fast.groupby("held_out")["accuracy"].mean() - full.groupby("held_out")["accuracy"].mean()
    print(by_center)
    assert by_center.max() > 0.05


def test_bad_held_out_sets_are_refused(cohort):
    samples, labels, groups = cohort
    with pytest.raises(ValueError, match="does not name patients"):
        fold_models(samples, labels, [[7]], {"n_features": 64})
    with pytest.raises(ValueError, match="at least two training patients"):
        fold_models(samples, labels, [[0, 1, 2, 3, 4]], {"n_features": 64})
    with pytest.raises(ValueError, match="refit must be one of"):
        leave_one_patient_out(samples, labels, methods=("lda",), refit="sometimes")


def test_runs_that_train_on_the_same_patients_share_one_decomposition(cohort, monkeypatch):
    # Leaving patient a out and holding out b in an inner fold trains on what leaving b out and
    # holding out a does: one eigendecomposition per distinct training set and key, and every
    # run's result is what it gives when run alone.
    from gating_core.method.ridge import RidgeStatistics

    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    base = MarginalTransferClassifier(n_features=64)
    exclusions = [(i,) for i in range(6)]
    alone = [HyperparameterSearch(cells, drawn, base, embedding_cells, cells_per_patient=300).run([excluded])[0]
             for excluded in exclusions]
    decomposed = []
    eigen = RidgeStatistics.eigen
    monkeypatch.setattr(RidgeStatistics, "eigen", lambda self, rows, weights=None: (
        decomposed.append((self, tuple(rows))) or eigen(self, rows, weights)))
    search = HyperparameterSearch(cells, drawn, base, embedding_cells, cells_per_patient=300)
    together = search.run(exclusions)
    for one, other in zip(together, alone):
        assert one.params == other.params and one.table == other.table and one.score == other.score
    # Every (features, training rows) pair decomposed once, though the runs' folds repeat them.
    distinct = {(id(stats), rows) for stats, rows in decomposed}  # (the list keeps each stats alive)
    assert len(decomposed) == len(distinct)
    folds = sum(len(search.folds(excluded)) for excluded in exclusions)
    keys = len({(row["x_factor"], row["p_factor"]) for result in together for row in result.table})
    assert len(decomposed) < folds * keys


def test_a_problem_view_is_what_a_fresh_problem_builds(cohort):
    # The pooled companion's problem, taken from the marginal model's (augmented) problem.
    from gating_core.method.training_problem import problem_view

    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    main = MarginalTransferClassifier(n_features=64, cells_per_patient=300, n_augment=2)
    companion = MarginalTransferClassifier(n_features=64, cells_per_patient=300, use_embedding=False, n_augment=0,
                                           loss="logistic", bandwidth_x=1.5)
    problem = TrainingProblem(main, cells, drawn, embedding_cells, groups)
    view, fresh = problem_view(problem, companion), TrainingProblem(companion, cells, drawn, embedding_cells, groups)
    assert view.n_rows == fresh.n_rows == 6 and problem.n_rows == 18
    for name in ("cells", "labels", "targets"):
        for a, b in zip(getattr(view, name), getattr(fresh, name)):
            np.testing.assert_array_equal(a, b)
    for name in ("embeddings", "source", "classes", "parent_rows", "class_columns"):
        np.testing.assert_array_equal(getattr(view, name), getattr(fresh, name))
    for name in ("median_distance_x", "median_distance_p", "bandwidth_x", "bandwidth_p", "bandwidth_embedding",
                 "use_embedding", "augment_gain", "augment_shift", "n_patients"):
        assert getattr(view, name) == getattr(fresh, name), name
    for a, b in zip(view.features(view.feature_map(1.5, None)), fresh.features(fresh.feature_map(1.5, None))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="drawn and embedded"):
        problem_view(problem, MarginalTransferClassifier(n_features=64, cells_per_patient=300, random_state=3))


def test_a_fold_searches_on_the_seeded_subset_that_training_on_its_patients_would(cohort, monkeypatch):
    # GatingModel.fit searches on at most SELECTION_MAX_PATIENTS patients (a seeded draw); so
    # does each fold, among its own training patients. A patient outside that draw trains the
    # fold's model but its labels never reach the fold's selection.
    import gating_core.model.transfer

    monkeypatch.setattr(gating_core.model.transfer, "SELECTION_MAX_PATIENTS", 3)
    samples, labels, groups = cohort
    settings = {"n_features": 128, "cells_per_patient": 1000, "selection_cells_per_patient": 400}
    first = fold_models(samples, labels, [[2]], settings, groups)[0]
    kept = [0, 1, 3, 4, 5]
    searched = [kept[j] for j in first.selection_patients(len(kept))]
    assert len(searched) == 3 and first.selection_["n_patients"] == 3
    outside = next(i for i in kept if i not in searched)
    scrambled = list(labels)
    scrambled[outside] = np.random.default_rng(1).permutation(labels[outside])
    second = fold_models(samples, scrambled, [[2]], settings, groups)[0]
    assert first.selection_["params"] == second.selection_["params"]
    assert first.selection_["table"] == second.selection_["table"]
    assert first.selection_["companion"] == second.selection_["companion"]
    assert not np.array_equal(first.classifier_.coef_, second.classifier_.coef_)
    # Without the cap, all five training patients are searched on: another selection.
    monkeypatch.setattr(gating_core.model.transfer, "SELECTION_MAX_PATIENTS", 50)
    everyone = fold_models(samples, labels, [[2]], settings, groups)[0]
    assert everyone.selection_["n_patients"] == 5
    assert everyone.selection_["table"] != first.selection_["table"]


def test_logistic_folds_started_from_everyone_stop_at_the_fold_tolerance_and_predict_alike(cohort, monkeypatch):
    import gating_core.evaluation.held_out as held_out
    from gating_core.method import solvers

    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    params = {**MarginalTransferClassifier().get_params(), "cells_per_patient": 1000, "n_features": 128,
              "bandwidth_x": 2.0, "bandwidth_p": None, "alpha": 1e-5, "n_augment": 0, "loss": "logistic"}
    kept_sets = [[1, 2, 3, 4, 5], [0, 1, 2, 3, 4]]
    calls, minimise = [], solvers.minimise_linear

    def spy(objective, warm, max_iter, gtol=None, curvature=None):
        calls.append((warm is not None, gtol, curvature is not None))
        return minimise(objective, warm, max_iter, gtol, curvature)

    monkeypatch.setattr(solvers, "minimise_linear", spy)
    loose = _SharedProblems(cells, drawn, embedding_cells, groups).fit_folds([params, params], kept_sets)
    # everyone (only the folds' starting point: fitted to their tolerance), then the folds,
    # preconditioned by its curvature minus their held-out patient's
    assert calls == [(False, held_out.FOLD_GTOL, False), (True, held_out.FOLD_GTOL, True),
                     (True, held_out.FOLD_GTOL, True)]
    monkeypatch.setattr(held_out, "FOLD_GTOL", solvers.LBFGS_GTOL)
    tight = _SharedProblems(cells, drawn, embedding_cells, groups).fit_folds([params, params], kept_sets)
    for held, a, b in zip((0, 5), loose, tight):
        assert not np.array_equal(a.coef_, b.coef_)  # the tolerance did stop the loose fit earlier
        # At most 3 of the 800 cells apart (plain L-BFGS: 1 and 0; preconditioned: 2 and 0, and
        # its probabilities within 0.01 of the tight fit's where plain's were within 0.02).
        agreement = np.mean(a.predict(cells[held]) == b.predict(cells[held]))
        assert agreement >= 0.996, agreement
        assert np.abs(a.predict_proba(cells[held]) - b.predict_proba(cells[held])).max() < 0.02


def test_a_bandwidth_one_fold_chose_starts_from_the_nearest_fit_on_everyone(cohort, monkeypatch):
    from gating_core.method import solvers

    samples, labels, groups = cohort
    cells, embedding_cells, drawn = _standardised(samples, labels)
    params = {**MarginalTransferClassifier().get_params(), "cells_per_patient": 1000, "n_features": 128,
              "bandwidth_x": 2.0, "bandwidth_p": None, "alpha": 1e-5, "n_augment": 0, "loss": "logistic"}
    alone = {**params, "bandwidth_x": 2.5}
    far = {**params, "bandwidth_x": 8.0, "n_features": 64}  # another feature count: never a start
    kept_sets = [[1, 2, 3, 4, 5], [0, 2, 3, 4, 5], [0, 1, 3, 4, 5], [0, 1, 2, 4, 5]]
    calls, minimise = [], solvers.minimise_linear

    def spy(objective, warm, max_iter, gtol=None, curvature=None):
        calls.append((objective.dim, None if warm is None else np.asarray(warm[0]).copy(), curvature is not None))
        return minimise(objective, warm, max_iter, gtol, curvature)

    monkeypatch.setattr(solvers, "minimise_linear", spy)
    problems = _SharedProblems(cells, drawn, embedding_cells, groups)
    fitted = problems.fit_folds([alone, params, far, params], kept_sets)
    # The bandwidth two folds chose first: its fit on everyone (cold), then those two folds from it;
    # then the fold at 2.5 from that fit; the fold with 64 features, which no fit shares, cold.
    assert [warm is None for _, warm, _ in calls] == [True, False, False, False, True]
    assert [dim for dim, _, _ in calls] == [128, 128, 128, 128, 64]
    # The curvature of everyone's fit preconditions the folds of its own features only.
    assert [curved for _, _, curved in calls] == [False, True, True, False, False]
    np.testing.assert_array_equal(calls[1][1], calls[3][1])  # the 2.5 fold started where the 2.0 folds did
    assert fitted[0].bandwidth_x_ == 2.5 and fitted[2].bandwidth_x_ == 8.0


def test_the_standard_methods_see_the_cells_the_model_beside_them_sees(cohort, monkeypatch):
    # A user's transform, channels and draw reach LDA, QDA and trees too, not only the model.
    import gating_core.evaluation.protocols as protocols
    from gating_core.evaluation.baselines import PooledBaseline

    samples, labels, groups = cohort
    fitted = []
    real_fit = PooledBaseline.fit

    def recording_fit(self, *args):
        fitted.append(self)
        return real_fit(self, *args)

    monkeypatch.setattr(PooledBaseline, "fit", recording_fit)
    channels = samples[0].pnn[:5]
    params = {"random_state": 3, "cells_per_patient": 700, "channels": channels,
              "transform": {channels[2]: "linear"}}
    table = leave_one_group_out(samples, labels, groups, methods=["lda"], model_params=params)
    assert len(table) == len(samples) and len(fitted) == len(set(groups))
    for baseline in fitted:
        model = baseline.preprocessing_
        assert model.channels_ == channels and model.cells_per_patient == 700 and model.random_state == 3
        assert model.transform_.kinds[2] == "linear" and model.transform_.kinds[3] != "linear"
    with pytest.raises(ValueError, match="transform given for 'FL9', which is none of the model's channels"):
        protocols.leave_one_group_out(samples, labels, groups, methods=["lda"],
                                      model_params={"transform": {"FL9": "linear"}})
