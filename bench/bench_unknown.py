"""Cells beyond every training population, called "unknown" by the default model: how many cells
of patients with nothing new it calls unknown, and how many cells of a planted new population.

For every data set and protocol of ``bench_unseen.py`` (train on some groups, gate the others'
patients), each held-out patient is gated twice by the default ``GatingModel``:

- as it is: the share of its cells called unknown (its expert labels name only populations the
  model was trained on, so every one is a cell lost to a known population);
- with a planted population: a copy of 5% of its events, drawn from its largest population, with
  one channel moved up by ``shift`` standard deviations of that channel on the model's scale (its
  transform and standardisation; the channel changes from patient to patient), appended to its
  events. The planted
  cells lie where no training population was; reported: the share of them called unknown and
  the share of the patient's own cells called unknown beside them.

Run: ``python bench/bench_unknown.py --sets sim-11,mc-pair --shifts 2,4,8 --margins 1.5,3 --csv out.csv``
(``--margins``: the model is fitted once and gates with each ``unknown_margin``); ``--time``: what
the call costs on a million cells, with and without the training patients' means.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_unseen import SETS, held_out_sets, load_set  # noqa: E402
from gating_core.model import UNKNOWN, GatingModel  # noqa: E402
from gating_core.method.unknown_cells import UNKNOWN_MARGIN, PopulationReach  # noqa: E402

#: Share of a patient's events planted as a new population.
PLANTED_SHARE = 0.05
#: The sets whose training is one group (with two groups, leaving one out is training on the other).
ONE_GROUP = ("mc-batch", "dlbcl-batch", "hard-channel-scale-shift")


def splits(name: str, groups, seed: int):
    """(training patients, held-out patients) of each fold of the set's protocol."""
    n = len(groups)
    if name == "mc-folds" or name.startswith("simfolds-"):
        for held in held_out_sets(name, groups, seed):
            yield [i for i in range(n) if i not in held], held
        return
    if name == "dlbcl-folds":
        order = np.random.default_rng(np.random.SeedSequence([seed, 41])).permutation(n)
        for k in range(2):
            held = sorted(int(i) for i in order[k::2])
            yield [i for i in range(n) if i not in held], held
        return
    for group in sorted(set(groups), key=str):
        inside = [i for i in range(n) if groups[i] == group]
        outside = [i for i in range(n) if groups[i] != group]
        yield (inside, outside) if name in ONE_GROUP else (outside, inside)


def planted(sample, labels, model, shift: float, seed):
    """``sample`` with a new population appended (see the module docstring): (sample, mask of the
    planted events)."""
    sample = model._compensated(sample)  # planted after compensation: the shift stays in its channel
    rng = np.random.default_rng(seed)
    names, counts = np.unique(labels, return_counts=True)
    source = np.flatnonzero(labels == names[np.argmax(counts)])
    rows = rng.choice(source, size=max(1, int(PLANTED_SHARE * sample.n_events)), replace=True)
    pnn = [c.pnn for c in sample.channels]
    j = int(rng.integers(len(model.channels_)))
    column = pnn.index(model.channels_[j])
    new = sample.events[rows].copy()
    # Moved on the model's own scale of the channel (its transform), by ``shift`` of the spread
    # its standardisation divides by: the same distance on a log-like and a linear channel.
    transformed = model.transform_.apply(new[:, [pnn.index(c) for c in model.channels_]], out_dtype=np.float64)[:, j]
    new[:, column] = model.transform_.inverse(transformed + shift * float(model.scale_[j]), j)
    events = np.vstack([sample.events, new.astype(sample.events.dtype)])
    mask = np.r_[np.zeros(sample.n_events, bool), np.ones(len(new), bool)]
    return dataclasses.replace(sample, events=events, name=f"{sample.name}+planted"), mask


def run_set(name: str, shifts, margins, seed: int) -> pd.DataFrame | None:
    loaded = load_set(name)
    if loaded is None:
        return None
    samples, labels, groups = loaded
    labels = [np.asarray(y).astype(str) for y in labels]
    rows = []
    for k, (train, held) in enumerate(splits(name, groups, seed)):
        model = GatingModel(random_state=seed).fit([samples[i] for i in train], [labels[i] for i in train],
                                                   groups=[groups[i] for i in train])
        for i in held:
            probabilities = model.predict_proba(samples[i])
            known_population = np.asarray(model.populations_, dtype=object)[probabilities.argmax(axis=1)]
            plants = [planted(samples[i], labels[i], model, shift, [seed, k, i]) for shift in shifts]
            for margin in margins:
                model.unknown_margin = margin  # gating reads it; the reach is fitted once
                unknown = model.gate(samples[i]).populations == UNKNOWN
                row = {"set": name, "fold": k, "patient": samples[i].name, "margin": margin,
                       "unknown": float(unknown.mean()),
                       "accuracy": float(np.mean(np.where(unknown, UNKNOWN, known_population) == labels[i])),
                       "accuracy_without_unknown": float(np.mean(known_population == labels[i]))}
                for shift, (with_new, mask) in zip(shifts, plants):
                    called = model.gate(with_new).populations == UNKNOWN
                    row[f"planted_unknown@{shift:g}"] = float(called[mask].mean())
                    row[f"others_unknown@{shift:g}"] = float(called[~mask].mean())
                rows.append(row)
    return pd.DataFrame(rows)


def time_the_call(n_events: int = 1_000_000, n_patients: int = 30, repeats: int = 3) -> None:
    """What the unknown call costs on a million cells (8 channels, 8 populations, ``n_patients``
    training patients), best of ``repeats``: a patient with nothing new, and the case the training
    patients' means are measured in -- one population EM left at its training mean, 5% of the
    cells far from everything -- with and without them (the same run)."""
    rng = np.random.default_rng(0)
    d = k = 8
    centres = rng.normal(0.0, 4.0, (k, d))

    def patient(n, present=k):
        codes = rng.integers(0, present, n)
        return centres[codes] + rng.normal(0.0, 0.5, (n, d)), np.array([f"p{j}" for j in codes])

    training = [patient(4000) for _ in range(n_patients)]
    reach = PopulationReach().fit([x for x, _ in training], [y for _, y in training], [f"p{j}" for j in range(k)])
    known, _ = patient(n_events, present=k)
    lacking, _ = patient(n_events - n_events // 20, present=k - 1)
    cases = {"nothing new": known.astype(np.float32),
             "5% new, a population absent": np.vstack([lacking, rng.normal(30.0, 0.5, (n_events // 20, d))])
             .astype(np.float32)}
    saved = reach.patient_means_
    print(f"unknown call on {n_events:,} cells, {n_patients} training patients (best of {repeats}):")
    for case, cells in cases.items():
        # EM on the patient's known cells, as on its content-chosen ones: the new cells stay far.
        patient_reach = reach.for_patient(cells[:len(lacking)][::50], UNKNOWN_MARGIN)
        timings = {}
        for label, means in (("patient's own means", None), ("and the training patients'", saved)):
            reach.patient_means_ = means
            best = np.inf
            for _ in range(repeats):
                start = time.perf_counter()
                called = reach.unknown(cells, patient_reach)
                best = min(best, time.perf_counter() - start)
            timings[label] = best
            print(f"  {case:28s} {label:28s} {best:.3f} s, {called.mean():.4f} unknown")
        ratio = timings["and the training patients'"] / timings["patient's own means"]
        print(f"  {case:28s} ratio {ratio:.2f}")
    reach.patient_means_ = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated sets (default: all)")
    parser.add_argument("--shifts", default="2,4,8", help="the planted population's shift, in standard deviations")
    parser.add_argument("--margins", default=str(UNKNOWN_MARGIN),
                        help=f"comma-separated unknown_margin values to gate with (default {UNKNOWN_MARGIN:g})")
    parser.add_argument("--seed", type=int, default=0, help="model seed")
    parser.add_argument("--csv", help="write every per-patient row here")
    parser.add_argument("--time", action="store_true", help="time the unknown call on a million cells and stop")
    args = parser.parse_args(argv)
    if args.time:
        time_the_call()
        return 0
    shifts = [float(s) for s in args.shifts.split(",") if s]
    margins = [float(m) for m in args.margins.split(",") if m]
    tables = []
    for name in [s for s in args.sets.split(",") if s]:
        start = time.time()
        table = run_set(name, shifts, margins, args.seed)
        if table is None:
            print(f"== {name}: data not found, skipped", flush=True)
            continue
        tables.append(table)
        columns = ["unknown", "accuracy", "accuracy_without_unknown"] + [
            f"{what}_unknown@{s:g}" for s in shifts for what in ("planted", "others")]
        summary = table.groupby("margin")[columns].agg(["mean", "min", "max"]).T
        with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
            print(f"\n== {name} ({time.time() - start:.0f} s, {len(table)} held-out patients)")
            print(summary.to_string(), flush=True)
        if args.csv:
            pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
