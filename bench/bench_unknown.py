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
(``--margins``: the model is fitted once and gates with each ``unknown_margin``).
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
from gating_core.method.unknown_cells import UNKNOWN_MARGIN  # noqa: E402

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated sets (default: all)")
    parser.add_argument("--shifts", default="2,4,8", help="the planted population's shift, in standard deviations")
    parser.add_argument("--margins", default=str(UNKNOWN_MARGIN),
                        help=f"comma-separated unknown_margin values to gate with (default {UNKNOWN_MARGIN:g})")
    parser.add_argument("--seed", type=int, default=0, help="model seed")
    parser.add_argument("--csv", help="write every per-patient row here")
    args = parser.parse_args(argv)
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
