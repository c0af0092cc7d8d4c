"""How well auto-gates fitted as gates agree with the cell-level predictions they come from.

For each data set: a template gate tree is drawn from one training patient's expert labels
(``gating_core.gates.autogates.tree_from_labels`` with the data set's hierarchy: the data carry labels,
not gates), a model is trained on the training patients, each new patient is gated, and the
template's gates are fitted to its predicted populations (``fit_gate_tree``). Printed per
population: F1 of the fitted gate's membership against the cells predicted in it (what the
reviewer sees as gates vs what the model said), and, for context, F1 of the same gate against the
expert labels and of the cell-level prediction against the expert labels; and each fitted
polygon's vertices and total turning (``gating_core.gates.polygon_fit.total_turning``: 1 for a
convex polygon, about one more for each tooth or notch).

    python bench/bench_autogates.py [--sample-only | --multicenter-only] [--no-select]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gating_core import GatingModel, load_labeled_input, read_fcs
from gating_core.gates import panel_scale
from gating_core.gates.agreement import agreement
from gating_core.gates.autogates import (MULTICENTER_HIERARCHY, SAMPLE_DATA_HIERARCHY, UNASSIGNED, fit_gate_tree,
                                         gate_populations, tree_from_labels)
from gating_core.gates.polygon_fit import total_turning

REPO = Path(__file__).resolve().parent.parent
MULTICENTER = REPO.parent / "shared" / "data" / "multicenter"


def _f1(a: np.ndarray, b: np.ndarray) -> float:
    total = int(a.sum() + b.sum())
    return 2 * int((a & b).sum()) / total if total else float("nan")


def run(name, training, new, truth, hierarchy, select):
    """training: list of (Sample, labels); new: list of Samples; truth: list of label arrays."""
    samples = [s for s, _ in training]
    scales = {c: panel_scale(c, samples) for c in samples[0].pnn}
    t0 = time.perf_counter()
    template = tree_from_labels(samples[0], training[0][1], hierarchy, scales)
    t_template = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = GatingModel(select=select, random_state=0).fit(samples, [y for _, y in training])
    t_train = time.perf_counter() - t0
    rows, fit_times = [], []
    for sample, expert in zip(new, truth):
        result = model.gate(sample)
        predicted = np.asarray(result.populations).astype(str)
        t0 = time.perf_counter()
        fit = fit_gate_tree(template, sample, predicted)
        fit_times.append(time.perf_counter() - t0)
        table = agreement(fit.tree, sample, predicted, fit.memberships)
        wanted = gate_populations(fit.tree, np.unique(expert))
        for row in table.itertuples():
            expert_target = np.isin(expert, sorted(wanted[row.gate]))
            predicted_target = np.isin(predicted, sorted(wanted[row.gate]))
            inside = fit.memberships[row.gate]
            if fit.tree.children(row.gate):  # as agreement(): unclaimed cells do not count for a parent gate
                counted = ~np.isin(expert, UNASSIGNED) & ~np.isin(predicted, UNASSIGNED)
                expert_target, predicted_target, inside = expert_target & counted, predicted_target & counted, \
                    inside & counted
            gate = fit.tree[row.gate]
            polygon = gate.kind == "polygon"
            rows.append({"data": name, "patient": sample.name, "gate": row.gate, "parent": row.parent,
                         "% of parent": row._5, "F1 gates vs predicted": row.F1,
                         "F1 gates vs expert": _f1(inside, expert_target),
                         "F1 predicted vs expert": _f1(predicted_target, expert_target),
                         "vertices": len(gate.vertices) if polygon else np.nan,
                         "turns": total_turning(gate.vertices) if polygon else np.nan})
    table = pd.DataFrame(rows)
    print(f"\n== {name}: template from {samples[0].name}; model trained on {len(samples)} patients in "
          f"{t_train:.1f} s (select={select}); template drawn in {t_template:.2f} s; fitting the gates of one "
          f"patient: {np.mean(fit_times):.2f} s on average")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.round(3).to_string(index=False))
        summary = table.groupby("gate", sort=False)[["F1 gates vs predicted", "F1 gates vs expert",
                                                       "F1 predicted vs expert"]].agg(["mean", "min"])
        print(f"\n{name}, per gate over the new patients (mean, min):")
        print(summary.round(3).to_string())
    print(f"\n{name}: fitted polygons, mean over gates and new patients: {table['vertices'].mean():.1f} vertices, "
          f"{table['turns'].mean():.2f} turns (largest {table['turns'].max():.2f})")
    return table


def sample_data(select):
    training = [load_labeled_input(REPO / "sample_data" / f"patient_{i:02d}.fcs") for i in range(1, 9)]
    new, truth = [], []
    for i in (1, 2, 3):
        new.append(read_fcs(REPO / "sample_data" / "new" / f"new_patient_{i:02d}.fcs", compensate=True))
        truth.append(pd.read_csv(REPO / "sample_data" / "truth" / f"new_patient_{i:02d}.labels.csv")["population"]
                     .to_numpy(str))
    return run("sample data", training, new, truth, SAMPLE_DATA_HIERARCHY, select)


def multicenter(select):
    if not MULTICENTER.exists():
        print(f"\n(multicenter data not found at {MULTICENTER}: skipped)")
        return None
    # Train on pairs 01-06 (three replicate pairs of batch A); gate 07-08 (an unseen pair) and
    # 09-10 (batch B, unlike every training sample).
    loaded = [load_labeled_input(MULTICENTER / f"multicenter_{i:02d}.fcs") for i in range(1, 11)]
    training = loaded[:6]
    new = [s for s, _ in loaded[6:]]
    truth = [np.asarray(y).astype(str) for _, y in loaded[6:]]
    return run("multicenter", training, new, truth, MULTICENTER_HIERARCHY, select)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample-only", action="store_true")
    parser.add_argument("--multicenter-only", action="store_true")
    parser.add_argument("--no-select", action="store_true",
                        help="skip the model's hyperparameter selection (faster, a weaker model)")
    args = parser.parse_args(argv)
    if not args.multicenter_only:
        sample_data(not args.no_select)
    if not args.sample_only:
        multicenter(not args.no_select)
    return 0


if __name__ == "__main__":
    sys.exit(main())
