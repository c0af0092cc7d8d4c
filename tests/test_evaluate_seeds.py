"""``evaluate --seeds``: every protocol repeated over model seeds, and what stays across them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gating_core.evaluation import summarize_seeds
from helpers import run_cli, sample_cohort, sample_paths


def _evaluate(*options):
    done = run_cli("evaluate", "--protocol", "patient", "--no-selection", "--method", "marginal", "lda", "--json",
                   *options, "--", *sample_paths(range(1, 5)))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_seed_is_the_run_with_that_seed_and_the_summary_says_what_stays():
    repeated = _evaluate("--seeds", "3", "0")
    alone = _evaluate("--seed", "3")
    per_seed = pd.DataFrame(repeated["summary"])
    assert sorted(per_seed["seed"].unique()) == [0, 3]
    for row in alone["summary"]:  # seed 3 of the repeated run is exactly the run with --seed 3
        match = per_seed[(per_seed["seed"] == 3) & (per_seed["method"] == row["method"])].iloc[0]
        assert match["mean_accuracy"] == row["mean_accuracy"] and match["worst_accuracy"] == row["worst_accuracy"]
    over = pd.DataFrame(repeated["summary_over_seeds"]).set_index("method")
    assert set(over["seeds"]) == {2}
    for method in ("marginal", "lda"):
        mine = per_seed[per_seed["method"] == method]
        assert over.loc[method, "mean_accuracy"] == pytest.approx(mine["mean_accuracy"].mean(), abs=1e-12)
        assert over.loc[method, "worst_accuracy_sd"] == pytest.approx(mine["worst_accuracy"].std(), abs=1e-12)
    wins = (per_seed.pivot(index="seed", columns="method", values="mean_accuracy")
            .pipe(lambda t: (t["marginal"] >= t["lda"]).sum()))
    assert over.loc["marginal", "best_mean_in"] == wins
    assert over.loc["marginal", "best_mean_in"] + over.loc["lda", "best_mean_in"] >= 2


def test_summarize_seeds_counts_ties_for_each_method():
    rows = []
    for seed, (a, b) in enumerate([(0.9, 0.8), (0.7, 0.7), (0.6, 0.8)]):
        rows += [{"protocol": "p", "seed": seed, "method": "a", "patient": "x", "accuracy": a, "macro_f1": a},
                 {"protocol": "p", "seed": seed, "method": "b", "patient": "x", "accuracy": b, "macro_f1": b}]
    over = summarize_seeds(pd.DataFrame(rows)).set_index("method")
    assert over.loc["a", "best_mean_in"] == 2 and over.loc["b", "best_mean_in"] == 2
    assert over.loc["a", "mean_accuracy"] == pytest.approx(np.mean([0.9, 0.7, 0.6]))
    assert over.loc["b", "worst_accuracy_sd"] == pytest.approx(np.std([0.8, 0.7, 0.8], ddof=1))


def test_the_worst_patient_methods_fit_what_their_names_say():
    from gating_core.evaluation.protocols import _fold_models

    samples, labels = sample_cohort(range(1, 4))
    fitted = {}
    for method in ("marginal-agnostic", "marginal-select-worst"):
        model = next(_fold_models(method, samples, labels, [[0]], {"cv_folds": 2, "cv_repeats": 1}, None, "full",
                                  lambda *a: None))
        fitted[method] = model
    agnostic = fitted["marginal-agnostic"]
    assert agnostic.patient_weighting == "agnostic" and agnostic.selection_objective == "mean"
    # The exponentiated-gradient weights moved away from uniform over the two training patients.
    weights = agnostic.classifier_.patient_weights_[:2]
    assert not np.allclose(weights, weights[0])
    worst = fitted["marginal-select-worst"]
    assert worst.selection_objective == "worst" and worst.patient_weighting == "uniform"
