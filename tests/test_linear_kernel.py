"""Linear k_X / k'_X as in the JMLR flow-cytometry experiment.

``kernel_x="linear"``: Psi(P) is the patient's mean cell, the kernel k_P(Psi, Psi') (<x, x'> + 1)
with Gaussian k_P, approximated by z_P(Psi) (x) [x, 1]; without the embedding a linear model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gating_core.model.research import ResearchGatingModel, load_gating_model
from gating_core.fcs import read_fcs
from gating_core.io.inputs import load_labeled_input
from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.features import (KERNELS_X, ExactLinearProductKernel, LinearMeanEmbedding,
                                         LinearProductFeatures, ProductRFF)
from gating_core.method.landmarks import cell_features
from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS, select_hyperparameters
from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from helpers import run_cli, sample_cohort, sample_paths


def shifted_patients(n_patients=6, n_cells=800, seed=0):
    """Patients whose class boundary moves with their mean: x0 > mean0 is class "a"."""
    rng = np.random.default_rng(seed)
    samples, labels = [], []
    for _ in range(n_patients):
        shift = rng.normal(0.0, 0.6, 3)
        x = rng.normal(0.0, 1.0, (n_cells, 3)) + shift
        samples.append(x.astype(np.float32))
        labels.append(np.where(x[:, 0] > shift[0], "a", "b"))
    return samples, labels


def test_features_reproduce_the_exact_kernel_in_expectation():
    rng = np.random.default_rng(3)
    d, n_patients, per_patient, sigma_p = 3, 4, 6, 0.8
    psi = rng.normal(0.0, 0.5, (n_patients, d))
    cells = rng.normal(0.0, 1.0, (n_patients, per_patient, d))
    fm = LinearProductFeatures(40_000 * (d + 1), d, d, sigma_p, random_state=1)
    assert fm.n_embedding_features == 40_000 and fm.n_features == 40_000 * (d + 1)
    features = np.vstack([fm.transform(x, fm.patient_phase(p)) for p, x in zip(psi, cells)]).astype(np.float64)
    rows_psi = np.repeat(psi, per_patient, axis=0)
    rows_x = cells.reshape(-1, d)
    exact = ExactLinearProductKernel(sigma_p)(rows_psi, rows_x, rows_psi, rows_x)
    # z(Psi) has 40,000 frequencies: <z, z'> is within ~3 / sqrt(40,000) of k_P, scaled by <x, x'> + 1.
    scale = np.abs(rows_x @ rows_x.T) + 1.0
    assert np.max(np.abs(features @ features.T - exact) / scale) < 0.03
    # k_P is not constant here: the approximation tracks it, not a flat kernel.
    assert np.ptp(exact / (rows_x @ rows_x.T + 1.0)) > 0.3
    # A smaller map is a worse approximation of the same kernel (the error shrinks with D_P).
    small = LinearProductFeatures(100 * (d + 1), d, d, sigma_p, random_state=1)
    f_small = np.vstack([small.transform(x, small.patient_phase(p)) for p, x in zip(psi, cells)]).astype(np.float64)
    assert np.max(np.abs(f_small @ f_small.T - exact) / scale) > np.max(np.abs(features @ features.T - exact) / scale)


def test_without_the_embedding_the_features_are_the_cell_and_a_one():
    x = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=np.float32)
    fm = LinearProductFeatures(512, 3, 0, None)
    assert fm.n_features == 4 and fm.embedding_weights_ is None
    features = cell_features(fm, x, embedding=None, use_embedding=False)
    np.testing.assert_array_equal(features, np.array([[1.0, -2.0, 0.5, 1.0], [0.0, 3.0, -1.0, 1.0]], dtype=np.float32))
    # exactly the kernel <x, x'> + 1
    np.testing.assert_allclose(features @ features.T, x @ x.T + 1.0, rtol=1e-6)


def test_linear_embedding_is_the_mean_of_the_cells():
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, (2500, 4)).astype(np.float32)
    embedder = LinearMeanEmbedding(4)
    np.testing.assert_allclose(embedder.transform(x), x.astype(np.float64).mean(axis=0), rtol=1e-12)
    # chunked sums give the same mean
    np.testing.assert_allclose(embedder.transform(x, chunk_size=7), x.astype(np.float64).mean(axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="empty"):
        embedder.transform(x[:0])
    samples, labels = shifted_patients()
    clf = MarginalTransferClassifier(kernel_x="linear", n_features=64, embedding_cells=100_000).fit(samples, labels)
    assert isinstance(clf.embedder_, LinearMeanEmbedding)
    assert clf.train_embeddings_.shape == (6, 3)
    np.testing.assert_allclose(clf.train_embeddings_, [s.astype(np.float64).mean(axis=0) for s in samples], rtol=1e-9)
    np.testing.assert_allclose(clf.embed(samples[2]), samples[2].astype(np.float64).mean(axis=0), rtol=1e-9)
    # With a cap on embedding cells, the mean of the content-chosen cells (order-independent).
    capped = MarginalTransferClassifier(kernel_x="linear", n_features=64, embedding_cells=300).fit(samples, labels)
    e = capped.embed(samples[0])
    np.testing.assert_allclose(e, capped.embed(samples[0][::-1].copy()), rtol=1e-12)
    assert not np.allclose(e, samples[0].astype(np.float64).mean(axis=0), rtol=1e-6)


def test_the_per_patient_linear_scores_equal_features_times_coefficients():
    samples, labels = shifted_patients()
    clf = MarginalTransferClassifier(kernel_x="linear", n_features=64).fit(samples, labels)
    fm = clf.feature_map_
    assert isinstance(fm, LinearProductFeatures)
    assert fm.n_embedding_features == 16 and clf.coef_.shape == (64, 2)
    for x in samples[:3]:
        embedding = clf.embed(x)
        expected = cell_features(fm, x, embedding) @ clf.coef_ + clf.intercept_
        np.testing.assert_allclose(clf.ridge_scores(x, embedding), expected, atol=1e-4)
    # The boundary follows the patient's mean: the linear pooled model cannot do that.
    marginal = np.mean([np.mean(clf.predict(x) == y) for x, y in zip(samples, labels)])
    pooled = MarginalTransferClassifier(kernel_x="linear", use_embedding=False).fit(samples, labels)
    assert pooled.coef_.shape == (4, 2)
    pooling = np.mean([np.mean(pooled.predict(x) == y) for x, y in zip(samples, labels)])
    assert marginal > 0.97 and pooling < 0.9, (marginal, pooling)


def test_kernel_x_is_checked():
    samples, labels = shifted_patients(3, 200)
    with pytest.raises(ValueError, match="kernel_x must be one of"):
        MarginalTransferClassifier(kernel_x="cubic").fit(samples, labels)
    with pytest.raises(ValueError, match="needs solver='rff'"):
        MarginalTransferClassifier(kernel_x="linear", solver="exact").fit(samples, labels)
    # The Gaussian default is unchanged.
    assert MarginalTransferClassifier().kernel_x == "gaussian" and GatingModel.kernel_x == "gaussian"
    assert isinstance(MarginalTransferClassifier(n_features=32).fit(samples, labels).feature_map_, ProductRFF)


def test_selection_searches_neither_sigma_x_nor_sigma_prime_for_the_linear_kernel():
    samples, labels = shifted_patients()
    base = MarginalTransferClassifier(kernel_x="linear", n_features=64)
    result = select_hyperparameters(samples, labels, base, cv_folds=3, cv_repeats=1, cells_per_patient=300,
                                    embedding_factors=DEFAULT_EMBEDDING_FACTORS)
    assert {row["x_factor"] for row in result.table} == {1.0}
    assert not any("e_factor" in row for row in result.table)
    assert len({row["p_factor"] for row in result.table}) >= 5  # sigma_P is searched
    assert result.params["use_embedding"]
    gaussian = select_hyperparameters(samples, labels, MarginalTransferClassifier(n_features=64), cv_folds=3,
                                      cv_repeats=1, cells_per_patient=300)
    assert len({row["x_factor"] for row in gaussian.table}) >= 4


@pytest.fixture(scope="module")
def cohort():
    return sample_cohort()


@pytest.fixture(scope="module")
def linear_model(cohort):
    samples, labels = cohort
    return ResearchGatingModel(kernel_x="linear", cells_per_patient=800, embedding_cells=4000).fit(samples, labels)


def test_linear_model_is_linear_throughout_and_survives_save_and_load(linear_model, sample_data_dir, tmp_path):
    model = linear_model
    d = len(model.channels_)
    assert isinstance(model.classifier_.feature_map_, LinearProductFeatures)
    assert model.classifier_.train_embeddings_.shape[1] == d
    # sigma_X was not searched; the pooled companion is a linear logistic model on [x, 1].
    assert {row["x_factor"] for row in model.selection_["table"]} == {1.0}
    assert "companion" not in model.selection_
    companion = model.pooled_classifier_
    assert companion.kernel_x == "linear" and companion.loss == "logistic"
    assert companion.coef_.shape == (d + 1, len(model.populations_))
    assert model.describe()["kernel_x"] == "linear"
    path = tmp_path / "linear.npz"
    model.save(path)
    loaded = ResearchGatingModel.load(path)
    assert loaded.kernel_x == "linear" and loaded.classifier_.kernel_x == "linear"
    for name in ("new_patient_01", "new_patient_03"):
        sample = read_fcs(sample_data_dir / "new" / f"{name}.fcs", compensate=True)
        a, b = model.gate(sample), loaded.gate(sample)
        np.testing.assert_array_equal(a.populations, b.populations)
        np.testing.assert_array_equal(a.confidence, b.confidence)
        # chunked gating (the streaming path's blocks) gives the same answer to float32
        # rounding: the linear kernel scores a chunk in products of up to 65,536 rows, so chunks
        # of 2,048 put the cells in other product blocks, which BLAS may round differently (a
        # float32 ulp on a few cells seen). The same labels wherever the two best probabilities
        # are further apart than that.
        c = loaded.gate(sample, chunk_size=997)
        np.testing.assert_allclose(c.confidence, a.confidence, rtol=1e-6)
        top2 = np.sort(loaded.predict_proba(sample), axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2e-6
        assert clear.mean() > 0.99
        np.testing.assert_array_equal(c.populations[clear], a.populations[clear])
        truth = pd.read_csv(sample_data_dir / "truth" / f"{name}.labels.csv")["population"].to_numpy()
        assert np.mean(a.populations == truth) > (0.95 if name == "new_patient_01" else 0.9)


def test_a_linear_model_file_with_mismatched_arrays_is_refused(linear_model, tmp_path):
    path = tmp_path / "linear.npz"
    linear_model.save(path)
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays["coef"] = arrays["coef"][:-1]  # one row short of D_P (d + 1)
    bad = tmp_path / "bad.npz"
    np.savez_compressed(bad, **arrays)
    with pytest.raises(ModelFileError, match="linear kernel's features"):
        ResearchGatingModel.load(bad)


def test_linear_marginal_transfer_leaving_one_patient_out_on_sample_data(cohort):
    from gating_core.evaluation import leave_one_patient_out

    samples, labels = cohort
    table = leave_one_patient_out(samples, labels, methods=("marginal-linear", "pooling"),
                                  model_params=dict(cells_per_patient=1000, embedding_cells=4000, kernel_x="linear"))
    summary = table.groupby("method")["accuracy"].agg(["mean", "min"])
    # Measured: marginal-linear 0.9996 mean / 0.9986 worst; linear pooling 0.9921 / 0.9728.
    assert summary.loc["marginal-linear", "mean"] > 0.997
    assert summary.loc["marginal-linear", "min"] > 0.995
    assert summary.loc["marginal-linear", "min"] > summary.loc["pooling", "min"] + 0.01


def test_command_line_trains_and_gates_with_the_linear_kernel(sample_data_dir, tmp_path):
    model = tmp_path / "linear.npz"
    result = run_cli("train", "--out", model, "--kernel-x", "linear", "--cells-per-patient", "600",
                     *sample_paths(range(1, 6)))
    assert result.returncode == 0, result.stderr
    assert "Cell kernel: linear" in result.stdout and "sigma_X =" not in result.stdout
    assert load_gating_model(model).kernel_x == "linear"
    new = sample_data_dir / "new" / "new_patient_02.fcs"
    result = run_cli("gate", "--model", model, "--out-dir", tmp_path / "out", new)
    assert result.returncode == 0, result.stderr
    gated = pd.read_csv(tmp_path / "out" / "new_patient_02.gated.csv")
    truth = pd.read_csv(sample_data_dir / "truth" / "new_patient_02.labels.csv")["population"].to_numpy()
    assert np.mean(gated["population"].to_numpy() == truth) > 0.95
    refused = run_cli("train", "--out", tmp_path / "x.npz", "--kernel-x", "cubic", sample_data_dir / "patient_01.fcs")
    assert refused.returncode == 2 and "invalid choice" in refused.stderr
    iw = run_cli("train", "--out", tmp_path / "iw.npz", "--method", "iw-nystroem", "--kernel-x", "linear",
                 sample_data_dir / "patient_01.fcs")
    assert iw.returncode == 2 and "--kernel-x does not apply" in iw.stderr


def test_command_line_names_match_the_library():
    from gating_core.commands.train import KERNELS_X as CLI_KERNELS
    from gating_core.evaluation import METHOD_SETTINGS

    assert CLI_KERNELS == KERNELS_X
    assert METHOD_SETTINGS["marginal-linear"] == {"method": "marginal", "kernel_x": "linear", "adaptive_weight": 0.0}


def test_linear_marginal_transfer_gates_a_held_out_multicenter_pair(multicenter_dir):
    from gating_core.evaluation import held_out_evaluation

    data = [load_labeled_input(p) for p in sorted(multicenter_dir.glob("multicenter_*.fcs"))]
    pairs = [f"pair_{(i // 2) + 1}" for i in range(len(data))]
    table = held_out_evaluation([d[0] for d in data], [d[1] for d in data], [[0, 1]], "leave-one-group-out",
                                methods=("marginal-linear",), groups=pairs, names=["pair_1"])
    accuracy = table.set_index("patient")["accuracy"]
    # Measured (evaluate --protocol group): multicenter_01 0.9721, multicenter_02 0.9736.
    assert accuracy["multicenter_01"] > 0.96 and accuracy["multicenter_02"] > 0.96, accuracy.to_dict()
