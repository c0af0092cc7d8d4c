"""The loss objects of gating_core.method.losses: the name table, and what each loss's fit through
MarginalTransferClassifier is (the closed-form ridge solution, a stationary point of the
logistic objective, a hinge classifier that gates like the ridge one).

Float tolerances, not bit equality: the features are float32 BLAS products whose rounding
depends on the CPU's kernel, and the references here are computed another way, in float64."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from gating_core.method import classifier
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.losses import LOSSES, HingeLoss, LogisticLoss, SquaredLoss, TrainingRows, loss_for
from gating_core.method.training_problem import TrainingProblem

SMALL = dict(n_features=64, n_embedding_features=8, cells_per_patient=200, alpha=1e-2, random_state=0)
CLASSES = np.array(["a", "b", "c"])


def _blobs(n_patients, n=300, seed=0, separation=1.5):
    """Three well separated classes, each patient's cells shifted a little as a whole."""
    rng = np.random.default_rng(seed)
    centres = np.array([[-separation, -separation], [separation, -separation], [0.0, separation]])
    cells, labels = [], []
    for _ in range(n_patients):
        y = rng.integers(0, len(centres), n)
        x = rng.normal(0, 0.5, (n, 2)) + centres[y] + rng.normal(0, 0.3, 2)
        cells.append(x.astype(np.float32))
        labels.append(CLASSES[y])
    return cells, labels


@pytest.fixture(scope="module")
def training():
    """Patients, the training rows the classifier builds from them, and their stacked float64
    features (n_cells, D), one-hot targets (n_cells, k) and cell weights (n_cells,): 1 / (N n_i),
    every patient weighing the same."""
    cells, labels = _blobs(4)
    problem = TrainingProblem(MarginalTransferClassifier(**SMALL), cells, labels)
    features = problem.features(problem.feature_map(problem.bandwidth_x, problem.bandwidth_p))
    data = TrainingRows(features, problem.targets, len(problem.classes), problem.statistics(features))
    stacked = np.vstack(features).astype(np.float64)
    onehot = np.eye(data.n_classes)[np.concatenate(problem.targets)]
    cell_weights = np.concatenate([np.full(len(f), 1.0 / (len(features) * len(f))) for f in features])
    return cells, labels, data, stacked, onehot, cell_weights


def test_loss_for_refuses_an_unknown_name_naming_the_losses_there_are():
    with pytest.raises(ValueError, match="loss must be one of") as refused:
        loss_for("absolute")
    for name in ("squared", "logistic", "hinge"):
        assert repr(name) in str(refused.value)
    assert "'absolute'" in str(refused.value)
    with pytest.raises(ValueError, match="loss must be one of"):
        loss_for(None)
    with pytest.raises(ValueError, match="loss must be one of"):
        MarginalTransferClassifier(loss="absolute").fit(*_blobs(2, n=50))


def test_the_table_names_each_loss_and_the_classifier_keeps_the_name():
    assert LOSSES == {"squared": SquaredLoss, "logistic": LogisticLoss, "hinge": HingeLoss}
    assert classifier.LOSSES == ("squared", "logistic", "hinge")  # what the model file checks
    for name, kind in LOSSES.items():
        loss = loss_for(name, alpha=0.5)
        assert type(loss) is kind and loss.name == name and loss.alpha == 0.5
    assert loss_for("squared", task_similarity=0.3).task_similarity == 0.3
    # Only the squared loss is fitted from the ridge statistics; only the logistic loss's
    # softmax is a probability already, and only its penalty is searched apart.
    assert [n for n, k in LOSSES.items() if k.uses_statistics] == ["squared"]
    assert [n for n, k in LOSSES.items() if k.gives_probabilities] == ["logistic"]
    assert [n for n, k in LOSSES.items() if k.searches_own_penalty] == ["logistic"]
    # The estimator's parameter stays a string: get_params, clone and the model file see a name.
    estimator = MarginalTransferClassifier(loss="hinge")
    assert estimator.get_params()["loss"] == "hinge" and clone(estimator).loss == "hinge"


def test_the_squared_loss_fit_is_the_closed_form_ridge_solution(training):
    """min_W,b sum_ij c_ij ||F_ij W + b - Y_ij||^2 + alpha ||W||^2 (b free), solved in float64
    on the stacked cells, against the classifier's fit from the per-patient statistics."""
    cells, labels, data, f, y, c = training
    alpha = SMALL["alpha"]
    mean_f, mean_y = c @ f, c @ y
    centred = f - mean_f
    coef = np.linalg.solve(centred.T @ (centred * c[:, None]) + alpha * np.eye(f.shape[1]),
                           centred.T @ ((y - mean_y) * c[:, None]))
    intercept = mean_y - mean_f @ coef

    fitted = MarginalTransferClassifier(loss="squared", **SMALL).fit(cells, labels)
    np.testing.assert_allclose(fitted.coef_, coef, atol=1e-5)
    np.testing.assert_allclose(fitted.intercept_, intercept, atol=1e-5)
    # The loss object alone, on the same rows: the same solution.
    own_coef, own_intercept = loss_for("squared", alpha=alpha).fit(data, range(len(data.features)))
    np.testing.assert_allclose(own_coef, coef, atol=1e-5)
    np.testing.assert_allclose(own_intercept, intercept, atol=1e-5)
    # Its per-patient losses: each patient's mean squared distance to the one-hot targets.
    losses = SquaredLoss().patient_losses(data, own_coef, own_intercept)
    start = 0
    for i, rows in enumerate(data.features):
        scores = f[start:start + len(rows)] @ own_coef + own_intercept
        assert losses[i] == pytest.approx(np.mean(((scores - y[start:start + len(rows)]) ** 2).sum(axis=1)),
                                          rel=1e-4)
        start += len(rows)


def test_the_logistic_loss_fit_is_a_stationary_point_with_non_negative_patient_losses(training):
    cells, labels, data, f, y, c = training
    alpha = SMALL["alpha"]
    fitted = MarginalTransferClassifier(loss="logistic", **SMALL).fit(cells, labels)
    assert fitted.temperature_ == 1.0  # its softmax is the probability: no temperature fitted
    coef, intercept = fitted.coef_.astype(np.float64), fitted.intercept_.astype(np.float64)

    def gradient(coef, intercept):
        """Of sum_ij c_ij CE(softmax(F_ij W + b), Y_ij) + alpha ||W||^2, in float64."""
        z = f @ coef + intercept
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        residual = (p - y) * c[:, None]
        return np.concatenate([(f.T @ residual + 2 * alpha * coef).ravel(), residual.sum(axis=0)])

    at_zero = np.abs(gradient(np.zeros_like(coef), np.zeros_like(intercept))).max()
    at_fit = np.abs(gradient(coef, intercept)).max()
    # L-BFGS stops at 1e-6 in its own coordinates; float32 coefficients add about as much.
    assert at_fit < 1e-4 and at_fit < 1e-3 * at_zero

    losses = LogisticLoss(alpha).patient_losses(data, fitted.coef_, fitted.intercept_)
    assert losses.shape == (len(data.features),) and np.all(losses >= 0) and np.all(np.isfinite(losses))
    # Cross-entropy of the model's own probabilities: below log(k), what knowing nothing costs.
    assert np.all(losses < np.log(data.n_classes))
    # Its curvature preconditions warm-started fits: one (D + 1)-square block per class.
    d = f.shape[1]
    curvature = LogisticLoss().curvature(data.features, np.ones(len(data.features)), coef, intercept)
    assert curvature.shape == (data.n_classes, d + 1, d + 1)
    assert SquaredLoss().curvature(data.features, None, coef, intercept) is None
    assert HingeLoss().curvature(data.features, None, coef, intercept) is None


def test_the_hinge_loss_gates_an_easy_problem_as_the_squared_loss_does(training):
    cells, labels, data, f, y, c = training
    squared = MarginalTransferClassifier(loss="squared", **SMALL).fit(cells, labels)
    hinge = MarginalTransferClassifier(loss="hinge", **SMALL).fit(cells, labels)
    assert hinge.temperature_ > 0 and hinge.temperature_ != 10.0  # fitted on held-out patients' margins
    new_cells, new_labels = _blobs(2, seed=9)
    for x, truth in zip(new_cells, new_labels):
        assert np.mean(hinge.predict(x) == squared.predict(x)) > 0.95
        assert np.mean(hinge.predict(x) == truth) > 0.95
        np.testing.assert_allclose(hinge.predict_proba(x).sum(axis=1), 1.0, rtol=1e-5)
    losses = HingeLoss().patient_losses(data, hinge.coef_, hinge.intercept_)
    assert np.all(losses >= 0) and np.all(np.isfinite(losses))


def test_a_calibration_fold_of_the_hinge_loss_reaches_the_folds_own_optimum(training):
    """The hinge loss's calibration folds start from the fit on all rows (a short path): the
    fold's model is the one a cold fit on the fold's rows finds, to the solver's tolerance."""
    cells, labels, data, f, y, c = training
    loss = HingeLoss(SMALL["alpha"])
    weights = np.full(len(data.features), 1.0 / len(data.features))
    everyone = loss.fit(data, range(len(data.features)), weights)
    fold_rows = list(range(1, len(data.features)))  # the first patient held out
    warm_coef, warm_intercept = loss.fit_calibration_fold(data, fold_rows, weights, everyone)
    cold_coef, cold_intercept = loss.fit(data, fold_rows, weights)
    warm, cold, full = (f @ coef + intercept for coef, intercept in
                        ((warm_coef, warm_intercept), (cold_coef, cold_intercept), everyone))
    assert np.abs(warm - full).max() > 0.05  # the fold moved away from its start ...
    np.testing.assert_allclose(warm, cold, atol=5e-3)  # ... to the fold's optimum
    assert np.mean(np.argmax(warm, axis=1) == np.argmax(cold, axis=1)) > 0.999
