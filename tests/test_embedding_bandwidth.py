"""sigma' (the embedding bandwidth) chosen by GatingModel's cross-validation when asked
(``select_embedding_bandwidth``, ``--select-embedding-bandwidth``; JMLR section 8.1)."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.fcs import read_fcs
from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS
from gating_core.model.research import ResearchGatingModel, load_gating_model
from helpers import run_cli, sample_cohort, sample_paths
# With one shift-augmented copy of each patient (a ResearchGatingModel option).
QUICK = dict(n_features=64, cells_per_patient=500, selection_cells_per_patient=300, cv_folds=3, cv_repeats=1,
             n_augment=1)


@pytest.fixture(scope="module")
def patients():
    return sample_cohort(range(1, 7))


def test_sigma_prime_is_selected_stored_and_round_trips(patients, tmp_path, sample_data_dir):
    plain = ResearchGatingModel(**QUICK).fit(*patients)
    assert "bandwidth_embedding" not in plain.selection_
    assert not any("e_factor" in row for row in plain.selection_["table"])
    start = plain.classifier_.bandwidth_embedding_  # the median distance between cells

    # sigma_P given: on these simulated patients the search would otherwise fall back to pooling
    # (k_P = 1), where sigma' plays no part
    model = ResearchGatingModel(select_embedding_bandwidth=True, bandwidth_p=1.0, **QUICK).fit(*patients)
    assert model.selection_["embedding_kept"]
    table = model.selection_["table"]
    searched = sorted({row["e_factor"] for row in table if "e_factor" in row})
    assert searched == sorted(DEFAULT_EMBEDDING_FACTORS)
    chosen = model.selection_["bandwidth_embedding"]
    assert model.classifier_.bandwidth_embedding_ == chosen
    # a factor of the median start as the search measured it, on its own smaller draw of cells
    # (selection_cells_per_patient): within a few percent of the final fit's median
    assert min(abs(chosen / start / f - 1) for f in DEFAULT_EMBEDDING_FACTORS) < 0.05
    # the chosen factor scored best among the sigma' rows of the search's last sigma_X, sigma_P
    chosen_factor = min(DEFAULT_EMBEDDING_FACTORS, key=lambda f: abs(chosen / start - f))
    at_chosen = [row for row in table if row.get("e_factor") == chosen_factor]
    assert max(row["cv_accuracy"] for row in at_chosen) == pytest.approx(model.selection_["cv_accuracy"])

    path = tmp_path / "model.npz"
    model.save(path)
    loaded = ResearchGatingModel.load(path)
    assert loaded.select_embedding_bandwidth is True
    assert loaded.selection_["bandwidth_embedding"] == chosen
    assert loaded.classifier_.bandwidth_embedding_ == chosen
    sample = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    np.testing.assert_array_equal(loaded.predict_proba(sample), model.predict_proba(sample))


def test_the_command_line_asks_for_it(tmp_path):
    out = tmp_path / "m.npz"
    result = run_cli("train", "--select-embedding-bandwidth", "--features", "64", "--cells-per-patient", "500",
                     "--out", out, *sample_paths(range(1, 5)))
    assert result.returncode == 0, result.stderr
    model = load_gating_model(out)
    assert model.select_embedding_bandwidth is True
    if model.selection_["embedding_kept"]:
        line = next(l for l in result.stdout.splitlines() if l.startswith("sigma' (embedding, selected) = "))
        assert float(line.split("= ")[1]) == pytest.approx(model.selection_["bandwidth_embedding"], rel=1e-3)
    else:  # the selection fell back to pooling (these simulated patients): sigma' plays no part
        assert "bandwidth_embedding" not in model.selection_
        assert "sigma' (embedding): not used (the model gates without the patient's embedding)" in result.stdout


def test_the_check_by_subtraction_is_not_asked_to_select_it():
    """gating_core.evaluation.held_out does not search sigma': evaluate refuses that pairing by name
    (and leaves one patient out by full refits when --refit is not given)."""
    result = run_cli("evaluate", "--select-embedding-bandwidth", "--refit", "subtract", *sample_paths(range(1, 4)))
    assert result.returncode == 2
    assert "--select-embedding-bandwidth needs --refit full" in result.stderr
