"""Patients from runs, batches and centers the model has never seen, on every data set at hand:
the default beside the standard methods and beside itself without each of its parts.

Data sets and protocols (each a line of the tables in docs/unseen_data.md):

- ``mc-pair``: the shared multicenter mass cytometry samples, leave one replicate pair out;
- ``mc-batch``: the same, leave one batch out (train on A, gate B; train on B, gate A);
- ``dlbcl-batch``: the shared FlowCAP DLBCL biopsies (flow, channel scale), train on one batch and
  gate the other, both ways;
- ``dlbcl-folds``: the same biopsies, 2 random folds over patients;
- ``mc-folds``: the multicenter samples, 2 random folds over samples (a held-out sample's run,
  and often its replicate twin, are trained on);
- ``dlbcl-12``: 12 of the biopsies drawn at random (``--seed`` draws others), 2 random folds over
  them: six training patients a fold, as a lab starting with few gated patients has;
- ``dlbcl-batch-4``: four biopsies of one batch drawn at random (``--seed`` draws others), every
  biopsy of the other batch gated, both ways: a lab's few gated patients, all from one run;
- ``sim-<seed>``: a simulated 4-center flow cohort (``simulate_centers(4, 3, seed, 6000,
  strength=2.0)``), leave one center out;
- ``simfolds-<seed>``: the same cohort, 2 random folds over patients (every center trained on);
- ``sim<C>x<P>-<seed>``: a cohort of another shape, ``C`` centers of ``P`` patients (``sim2x6-11``:
  two centers of six, the model trained on one and gating the other), leave one center out;
- ``<set>+<merge>``: a real set with some of its populations merged into one, which is then no
  single Gaussian (as a lab's catch-all gates are): ``+lymphocytes`` (mc: B, CD4 T and CD8 T cells
  one population), ``+b-rest`` (mc: B cells against everything else, a small population beside a
  large multimodal one), ``+cd4-rest`` (mc: CD4 T cells against everything else), ``+t-rest`` and
  ``+fl2-rest`` (DLBCL: FL1+FL4+, or FL2+, against everything else), ``+bnk-rest`` (simulated:
  B cells and NK cells against everything else; on ``hard-rare`` two rare populations beside
  one catch-all);
- ``<set>+rare-<population>``: a real set with one population thinned, in every patient, to a
  small share of the events (its other cells dropped): ``+rare-b`` (mc: B cells at 0.5%),
  ``+rare-t`` (DLBCL: FL1+FL4+ at 1%), as a lab's rare populations are;
- ``<set>+partial-<population>``: a real set with one population kept in a third of the patients
  (drawn at random with ``--seed``) and dropped from every other: ``+partial-b`` (mc: B cells),
  ``+partial-t`` (DLBCL: FL1+FL4+), as a population present in only some patients is;
  ``+partial-<population><n>`` keeps it in ``n`` patients (``dlbcl-folds+partial-t4``: in 4 of 30);
- ``<set>+clip-<channel>-<q>``: a real set whose channel (its ``$PnN`` starting with ``<channel>``,
  case-insensitive) saturates at the q-th percentile of its values over every patient, as an
  instrument's detector does at the top of its range: every value above is set to it, a pile
  at the maximum (``dlbcl-folds+clip-fl4-97``);
- ``hard-<kind>``: the simulator's hard cohorts (``simulate_hard_cohort``): ``channel-scale-shift``
  (train on one batch, gate the other), ``partial-population`` and ``rare`` (leave one center
  out).

Run: ``python bench/bench_unseen.py --sets mc-batch,dlbcl-batch --methods marginal,lda,trees
--csv out.csv`` (``--list`` names the sets); the per-patient rows go to ``--csv``, and the
summary (mean and worst patient accuracy, macro-F1) is printed per set. The models are given their
training patients' groups (the centers, batches); ``--groups-found`` withholds them, and each
model finds them from the cells as ``train`` without ``--groups`` does (the same folds). Shared data are read
from ``../shared/data`` (or ``$GATING_SHARED_DATA``); sets whose data are missing are skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation import (group_held_out_sets, held_out_evaluation, leave_one_group_out,  # noqa: E402
                                    one_group_held_out_sets, patient_fold_sets, patient_folds, summarize,
                                    train_on_one_group)
from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.model.result import DISAGREEMENT_THRESHOLD  # noqa: E402
from gating_core.synthetic import simulate_centers, simulate_hard_cohort  # noqa: E402

SHARED = Path(os.environ.get("GATING_SHARED_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
SETS = ("mc-pair", "mc-batch", "dlbcl-batch", "dlbcl-folds", "dlbcl-12", "dlbcl-batch-4", "sim-11", "sim-13",
        "sim-14", "hard-channel-scale-shift", "hard-partial-population", "hard-rare")


def _shared(name: str, column: str):
    folder = SHARED / name
    if not (folder / "groups.csv").exists():
        return None
    groups = pd.read_csv(folder / "groups.csv").set_index("patient")[column]
    data = [load_labeled_input(p) for p in sorted(folder.glob(f"{name}_*.fcs"))]
    return [s for s, _ in data], [y for _, y in data], [str(groups[s.name]) for s, _ in data]


#: Biopsies of ``dlbcl-12``.
SMALL_COHORT = 12
#: Training biopsies of ``dlbcl-batch-4``, all of one batch.
FEW_OF_ONE_BATCH = 4


#: Population merges of the ``<set>+<merge>`` sets: label -> merged label (others kept).
MERGES = {
    "lymphocytes": {"B cells": "Lymphocytes", "CD4 T cells": "Lymphocytes", "CD8 T cells": "Lymphocytes"},
    "b-rest": {"CD4 T cells": "rest", "CD8 T cells": "rest", "Monocytes": "rest", "ungated": "rest"},
    "t-rest": {"FL2+": "rest", "other": "rest", "ungated": "rest"},
    "fl2-rest": {"FL1+FL4+": "rest", "other": "rest", "ungated": "rest"},
    "cd4-rest": {"B cells": "rest", "CD8 T cells": "rest", "Monocytes": "rest", "ungated": "rest"},
    "bnk-rest": {"Debris": "rest", "Granulocytes": "rest", "Monocytes": "rest", "CD4 T cells": "rest",
                 "CD8 T cells": "rest", "other": "rest"},
}


#: Populations of the ``<set>+rare-<key>`` sets: key -> (population, its share of every patient's
#: events after thinning).
RARE = {"b": ("B cells", 0.005), "t": ("FL1+FL4+", 0.01)}
#: Populations of the ``<set>+partial-<key>`` sets, and the share of patients that keep them.
PARTIAL = {"b": "B cells", "t": "FL1+FL4+"}
PARTIAL_SHARE = 1 / 3


def thin_population(samples, labels, population: str, shares, seed: int):
    """Drop cells of ``population`` at random so that it makes up ``shares[i]`` of patient i's
    events (at most: a patient with fewer keeps them all; 0 drops every one). Returns new
    (samples, labels); the other populations keep every cell, in their order."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3000]))
    thinned_samples, thinned_labels = [], []
    for sample, y, share in zip(samples, labels, shares):
        members = np.flatnonzero(y == population)
        others = len(y) - len(members)
        wanted = len(members) if share >= 1 else min(len(members), int(round(share * others / (1.0 - share))))
        keep = np.ones(len(y), dtype=bool)
        keep[rng.choice(members, len(members) - wanted, replace=False)] = False
        thinned_samples.append(dataclasses.replace(sample, events=sample.events[keep]))
        thinned_labels.append(y[keep])
    return thinned_samples, thinned_labels


def saturated(samples, channel: str, percent: str):
    """The samples with the channel whose ``$PnN`` starts with ``channel`` (case-insensitive)
    held at the ``percent``-th percentile of its values over every sample: one ceiling for the
    whole set, as one instrument's."""
    [index] = [i for i, name in enumerate(samples[0].pnn) if name.lower().startswith(channel.lower())]
    ceiling = np.percentile(np.concatenate([s.events[:, index] for s in samples]), float(percent))
    out = []
    for sample in samples:
        events = sample.events.copy()
        np.minimum(events[:, index], events.dtype.type(ceiling), out=events[:, index])
        out.append(dataclasses.replace(sample, events=events))
    return out


def _derived(base: str, change: str, seed: int):
    loaded = load_set(base, seed)
    if loaded is None:
        return None
    samples, labels, groups = loaded
    kind, _, key = change.partition("-")
    if kind == "rare" and key in RARE:
        population, share = RARE[key]
        return (*thin_population(samples, labels, population, [share] * len(samples), seed), groups)
    if kind == "partial" and key[:1] in PARTIAL and (key[1:] == "" or key[1:].isdigit()):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3001]))
        kept = int(key[1:]) if key[1:] else max(2, round(PARTIAL_SHARE * len(samples)))
        keeping = set(rng.choice(len(samples), min(kept, len(samples)), replace=False))
        shares = [1.0 if i in keeping else 0.0 for i in range(len(samples))]
        return (*thin_population(samples, labels, PARTIAL[key[:1]], shares, seed), groups)
    if kind == "clip" and key.count("-") == 1 and key.rsplit("-", 1)[1].replace(".", "", 1).isdigit():
        return (saturated(samples, *key.rsplit("-", 1)), labels, groups)
    if change in MERGES:
        mapping = MERGES[change]
        return samples, [np.array([mapping.get(v, v) for v in y]) for y in labels], groups
    known = [*MERGES, *(f"rare-{k}" for k in RARE), *(f"partial-{k}" for k in PARTIAL), "clip-<channel>-<q>"]
    raise SystemExit(f"unknown change {change!r}: one of {', '.join(known)}")


def load_set(name: str, seed: int = 0):
    """(samples, labels, groups) of a set, or None when its shared data are missing. ``seed``
    draws the biopsies of ``dlbcl-12`` and the cells and patients the ``+rare`` and
    ``+partial`` sets keep."""
    if "+" in name:
        return _derived(*name.split("+", 1), seed)
    if name == "mc-folds":
        return _shared("multicenter", "batch")
    if name.startswith("mc-"):
        return _shared("multicenter", "pair" if name == "mc-pair" else "batch")
    if name == "dlbcl-12":
        loaded = _shared("dlbcl", "group")
        if loaded is None:
            return None
        drawn = sorted(np.random.default_rng(1000 + seed).choice(len(loaded[0]), SMALL_COHORT, replace=False))
        return tuple([part[i] for i in drawn] for part in loaded)
    if name.startswith("dlbcl-"):
        return _shared("dlbcl", "group")
    shape = re.fullmatch(r"sim(\d+)x(\d+)-(\d+)", name)
    if shape:
        n_centers, per_center, cohort_seed = (int(v) for v in shape.groups())
        if n_centers < 2 or per_center < 1:
            raise SystemExit(f"{name}: leaving one center out needs two centers or more of one patient or more")
        cohort, center_of = simulate_centers(n_centers, per_center, seed=cohort_seed, n_events=6000, strength=2.0)
    elif name.startswith(("sim-", "simfolds-")):
        cohort_seed = int(name.rsplit("-", 1)[1])
        cohort, center_of = simulate_centers(4, 3, seed=cohort_seed, n_events=6000, strength=2.0)
    elif name.startswith("hard-"):
        cohort, center_of = simulate_hard_cohort(name[5:], seed=1)
    else:
        raise SystemExit(f"unknown set {name!r}; --list names them")
    samples = [c[0] for c in cohort]
    return samples, [np.asarray(c[1]).astype(str) for c in cohort], [center_of[s.name] for s in samples]


#: The sets whose protocol is train-on-one-group, and those split in 2 folds over patients (the
#: rest leave one group out).
TRAIN_ON_ONE_GROUP = ("dlbcl-batch", "hard-channel-scale-shift")
PATIENT_FOLDS = ("dlbcl-folds", "dlbcl-12", "mc-folds")


def held_out_sets(name: str, groups, seed: int) -> list[list[int]]:
    """The patients' indices each fold of a set's protocol holds out (as :func:`run_set` runs it)."""
    name = name.split("+", 1)[0]
    if name in PATIENT_FOLDS or name.startswith("simfolds-"):
        return patient_fold_sets(len(groups), 2, seed)
    if name == "dlbcl-batch-4":
        return [held for _, held in few_of_one_group(groups, seed)]
    if name in TRAIN_ON_ONE_GROUP:
        return one_group_held_out_sets(groups, len(groups))
    return group_held_out_sets(groups, len(groups))


def few_of_one_group(groups, seed: int) -> list[tuple[str, list[int]]]:
    """``dlbcl-batch-4``'s folds: for each group in order of appearance, (the group, the indices
    of every patient but FEW_OF_ONE_BATCH of that group drawn at random). Only the other groups'
    patients are scored (:func:`run_set`); the group's patients left out of training are not."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2000]))
    folds = []
    for group in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        drawn = set(int(i) for i in rng.choice(members, FEW_OF_ONE_BATCH, replace=False))
        folds.append((group, [i for i in range(len(groups)) if i not in drawn]))
    return folds


def run_set(name: str, methods, seed: int, groups_found: bool = False) -> pd.DataFrame | None:
    """The per-patient rows of a set's protocol. ``groups_found``: the models are not given their
    training patients' groups and find them from the cells, as ``train`` without ``--groups``
    does; the folds still hold out the set's groups (the same folds as without it)."""
    loaded = load_set(name, seed)
    if loaded is None:
        return None
    samples, labels, groups = loaded
    params = {"random_state": seed}
    if groups_found:
        if name.startswith("dlbcl-batch-4"):
            raise SystemExit("--groups-found: dlbcl-batch-4 scores only some of each fold's held-out patients; "
                             "not supported")
        held = held_out_sets(name, groups, seed)
        base = name.split("+", 1)[0]
        # each fold named as the set's own protocol names it, so that the two runs' rows line up
        if base in PATIENT_FOLDS or base.startswith("simfolds-"):
            names = [f"fold {k + 1}" for k in range(len(held))]
        elif base in TRAIN_ON_ONE_GROUP:
            names = [f"trained on {group}" for group in dict.fromkeys(str(g) for g in groups)]
        else:
            names = [str(groups[h[0]]) for h in held]
        return held_out_evaluation(samples, labels, held, "groups-found", methods, params, names=names)
    name = name.split("+", 1)[0]
    if name in PATIENT_FOLDS or name.startswith("simfolds-"):
        return patient_folds(samples, labels, 2, methods=methods, model_params=params, groups=groups, seed=seed)
    if name == "dlbcl-batch-4":
        folds = few_of_one_group(groups, seed)
        names = [f"trained on {FEW_OF_ONE_BATCH} of {group}" for group, _ in folds]
        table = held_out_evaluation(samples, labels, [held for _, held in folds], "few-of-one-group", methods,
                                    params, groups=groups, names=names, refit="full")
        group_of = {s.name: g for s, g in zip(samples, groups)}
        trained_group = dict(zip(names, (group for group, _ in folds)))
        other = [group_of[p] != trained_group[h] for p, h in zip(table["patient"], table["held_out"])]
        return table[other].reset_index(drop=True)
    if name in TRAIN_ON_ONE_GROUP:
        return train_on_one_group(samples, labels, groups, methods=methods, model_params=params)
    return leave_one_group_out(samples, labels, groups, methods=methods, model_params=params)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated sets (default: all)")
    parser.add_argument("--methods", default="marginal,pooled-logistic,lda,qda,trees",
                        help="comma-separated evaluate methods (default: the default and the standard methods)")
    parser.add_argument("--seed", type=int, default=0, help="model seed")
    parser.add_argument("--csv", help="write every per-patient row here (appended per set)")
    parser.add_argument("--groups-found", action="store_true",
                        help="the models find their training patients' groups from the cells, as train without "
                             "--groups does (the folds are the set's own)")
    parser.add_argument("--list", action="store_true", help="name the sets and stop")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(SETS))
        return 0
    methods = [m for m in args.methods.split(",") if m]
    tables = []
    for name in [s for s in args.sets.split(",") if s]:
        start = time.time()
        table = run_set(name, methods, args.seed, args.groups_found)
        if table is None:
            print(f"== {name}: data not found, skipped", flush=True)
            continue
        table.insert(0, "set", name)
        tables.append(table)
        summary = summarize(table)
        with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
            print(f"\n== {name} ({time.time() - start:.0f} s)")
            print(summary[["method", "mean_accuracy", "worst_accuracy", "worst_patient", "mean_macro_f1",
                           "worst_macro_f1"]].to_string(index=False), flush=True)
        if args.csv:
            pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
    if tables and "marginal" in methods:
        print_review(pd.concat(tables, ignore_index=True))
    return 0


#: Bins of the parts' disagreement in :func:`print_review`.
DISAGREEMENT_BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
#: Other thresholds of the review flag shown by :func:`print_review`.
REVIEW_THRESHOLDS = (0.1, 0.15, 0.3)
#: A patient "gated poorly" in :func:`print_review`.
POOR_ACCURACY = 0.8


def print_review(table: pd.DataFrame) -> None:
    """Whether the default's review flag (its parts disagree on more than DISAGREEMENT_THRESHOLD
    of a patient's cells) picks the patients it gates worst: over every held-out patient of the
    sets run, accuracy per disagreement bin, then flagged against not flagged."""
    rows = table[(table["method"] == "marginal") & table["disagreement"].notna()]
    if rows.empty:
        return
    flagged = rows["disagreement"] > DISAGREEMENT_THRESHOLD
    bins = pd.cut(rows["disagreement"], list(DISAGREEMENT_BINS), include_lowest=True)
    per_bin = rows.groupby(bins, observed=True)["accuracy"].agg(patients="count", mean_accuracy="mean",
                                                                worst_accuracy="min")
    poor = rows["accuracy"] < POOR_ACCURACY
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(f"\n== review flag: the default's accuracy against the share of cells its parts disagree on "
              f"({len(rows)} held-out patients)")
        print(per_bin.to_string())
        for name, part in (("flagged", rows[flagged]), ("not flagged", rows[~flagged])):
            if len(part):
                print(f"{name} (disagreement {'>' if name == 'flagged' else '<='} {DISAGREEMENT_THRESHOLD}): "
                      f"{len(part)} patients, mean accuracy {part['accuracy'].mean():.3f}, "
                      f"worst {part['accuracy'].min():.3f}")
        print(f"patients gated below {POOR_ACCURACY}: {int(poor.sum())}, flagged: {int((poor & flagged).sum())}")
        for threshold in REVIEW_THRESHOLDS:
            above = rows["disagreement"] > threshold
            print(f"  at {threshold}: {int(above.sum())} flagged, mean accuracy {rows.loc[above, 'accuracy'].mean():.3f}; "
                  f"{int((poor & above).sum())} of the {int(poor.sum())} below {POOR_ACCURACY}")
        error = 1.0 - rows["accuracy"]
        print(f"rank correlation with the error: disagreement {rows['disagreement'].corr(error, method='spearman'):.2f}, "
              f"novelty {rows['novelty'].corr(error, method='spearman'):.2f}")
        if "novelty_threshold" in rows and rows["novelty_threshold"].notna().all():
            novel = rows["novelty"] > rows["novelty_threshold"]
            print(f"beside it, the novelty warning: {int(novel.sum())} patients, mean accuracy "
                  f"{rows.loc[novel, 'accuracy'].mean():.3f}, {int((poor & novel).sum())} of them below "
                  f"{POOR_ACCURACY}; the others {rows.loc[~novel, 'accuracy'].mean():.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
