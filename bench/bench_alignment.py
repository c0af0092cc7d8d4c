"""Per-channel alignment beside none: plain LDA on aligned vs unaligned cells, on groups unseen.

For each data set and protocol, the training patients' cells (``cells_per_patient`` = 4,000 a
patient, drawn uniformly as GatingModel draws them) are transformed and standardised as the
product does, then registered -- or not -- and one LDA (scikit-learn's
LinearDiscriminantAnalysis) is fitted on them pooled; every event of every held-out patient is
registered from its own content-chosen cells and classified. Accuracy is over all events,
"ungated" included.

Alignments:

- ``none``: the transformed, standardised channels;
- ``quantile``: ``align="quantile"`` (quantiles 2-98% onto the training patients' mean);
- ``landmarks``: ``align="landmarks"``, peaks onto the training patients' consensus peaks with
  the skip rule (``SkipRule()``);
- ``landmarks, rule off``: the same warps without skipping (``SkipRule.off()``: unequal peak
  counts matched as well as order allows);
- with ``--ablation``: the rule without each of its parts; with a bound on a peak's move in
  across-patient spreads of the training patients (``max_move_spreads``); with channels whose
  reference peaks barely vary across training patients (spread below 0.05 or 0.1) skipped as
  having nothing to correct; and a patient left whole unless all its channels with a stable
  reference match ("whole patient").

Data sets and protocols:

- ``dlbcl``: the shared FlowCAP-I DLBCL biopsies (flow, channel scale): train on batch 1 and
  gate batch 2, and the reverse;
- ``multicenter``: the shared CyTOF samples (arcsinh(x/5)): train on batch A and gate B, and the
  reverse; leave one replicate pair out;
- ``sim-absent:POP``: ``simulate_centers(4, 3, seed=3, n_events=5000)`` with population POP's
  cells removed from every patient but the first of each center (present in 4 of 12), leaving
  one center out;
- ``sim``: the same cohort with every population, leaving one center out.

"skipped" is the share of (held-out patient, channel) pairs the rule left unregistered;
``--reasons`` tells why, per channel.

The product's path is checked once per data set: ``ResearchGatingModel(align="landmarks")`` gives the
same training and held-out cells as this script's registration.

Run: ``python bench/bench_alignment.py [--data dlbcl multicenter sim-absent:Monocytes ...]
[--ablation] [--reasons] [--csv FILE]`` (about a minute with --ablation).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.method.alignment import QuantileRegistration, channel_quantiles  # noqa: E402
from gating_core.method.landmark_alignment import LandmarkReference, LandmarkRegistration, SkipRule  # noqa: E402
from gating_core.model import GatingModel  # noqa: E402
from gating_core.model.research import ResearchGatingModel  # noqa: E402

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
DEFAULT_DATA = ("dlbcl", "multicenter", "sim", "sim-absent:Monocytes", "sim-absent:B cells")
CELLS_PER_PATIENT = 4000

RULES = {"landmarks": SkipRule(), "landmarks, rule off": SkipRule.off()}
ABLATION = {
    "  rule without same count": dataclasses.replace(SkipRule(), same_count=False),
    "  rule without nearest": dataclasses.replace(SkipRule(), nearest=False),
    "  rule without stretch bound": dataclasses.replace(SkipRule(), max_stretch=None),
    "  rule without agreement": dataclasses.replace(SkipRule(), min_agreement=0.0),
    "  rule + move <= 3 spreads": dataclasses.replace(SkipRule(), max_move_spreads=3.0),
    "  rule + move <= 10 spreads": dataclasses.replace(SkipRule(), max_move_spreads=10.0),
    "  rule + steady channels (< 0.05)": ("steady", 0.05),
    "  rule + steady channels (< 0.1)": ("steady", 0.1),
    "  rule, whole patient": ("whole patient", None),
}


# -- data ------------------------------------------------------------------------------------------

def load_dlbcl(folder=SHARED / "dlbcl"):
    data = [load_labeled_input(p) for p in sorted(Path(folder).glob("dlbcl_*.fcs"))]
    with open(Path(folder) / "groups.csv", newline="") as handle:
        batch = {r["patient"]: r["group"] for r in csv.DictReader(handle)}
    samples, labels = [d[0] for d in data], [d[1] for d in data]
    return samples, labels, [batch[s.name] for s in samples]


def simulated(absent: str | None, seed: int = 3, n_events: int = 5000):
    """4 centers x 3 patients; ``absent``: that population kept in each center's first patient only."""
    from gating_core.synthetic import simulate_centers

    cohort, center_of = simulate_centers(4, 3, seed=seed, n_events=n_events, strength=1.0)
    samples, labels, centers = [], [], []
    for sample, y in cohort:
        if absent is not None and not sample.name.endswith("_patient_01"):
            keep = y != absent
            sample, y = dataclasses.replace(sample, events=sample.events[keep]), y[keep]
        samples.append(sample)
        labels.append(y)
        centers.append(center_of[sample.name])
    return samples, labels, centers


def protocols(name: str):
    """(samples, labels, [(protocol, training indices, held-out indices), ...])."""
    if name == "dlbcl":
        samples, labels, batch = load_dlbcl()
        one = [i for i, b in enumerate(batch) if b == "batch1"]
        two = [i for i, b in enumerate(batch) if b == "batch2"]
        return samples, labels, [("batch1 -> batch2", [one], [two]), ("batch2 -> batch1", [two], [one])]
    if name == "multicenter":
        from multicenter_data import load_multicenter

        samples, labels, pairs, batches = load_multicenter()
        a = [i for i, b in enumerate(batches) if b == "A"]
        b = [i for i, x in enumerate(batches) if x == "B"]
        folds = sorted(set(pairs))
        out = [[i for i, p in enumerate(pairs) if p == f] for f in folds]
        rest = [[i for i in range(len(samples)) if i not in o] for o in out]
        return samples, labels, [("A -> B", [a], [b]), ("B -> A", [b], [a]), ("leave one pair out", rest, out)]
    if name == "sim" or name.startswith("sim-absent:"):
        samples, labels, centers = simulated(None if name == "sim" else name.split(":", 1)[1])
        folds = sorted(set(centers))
        out = [[i for i, c in enumerate(centers) if c == f] for f in folds]
        rest = [[i for i in range(len(samples)) if i not in o] for o in out]
        return samples, labels, [("leave one center out", rest, out)]
    raise SystemExit(f"unknown data set {name!r}")


# -- one split -------------------------------------------------------------------------------------

class Split:
    """The product's preprocessing of one split, without registration: training cells and
    content-chosen cells per training patient, every event and the content-chosen cells per
    held-out patient."""

    def __init__(self, samples, labels, train, test):
        self.model = GatingModel(cells_per_patient=CELLS_PER_PATIENT, random_state=0)
        digests = [self.model.digest(samples[i], labels[i], k) for k, i in enumerate(train)]
        self.cells, self.embedding_cells, self.labels = self.model.prepare_digests(digests)
        self.test_cells, self.test_chosen, self.test_labels = [], [], []
        for i in test:
            sample = self.model._compensated(samples[i])
            indices = self.model._channel_indices(sample)
            self.test_cells.append(self.model._standardise(sample.events[:, indices]))
            self.test_chosen.append(self.model._chosen_cells(sample.events, indices)[1])
            self.test_labels.append(np.asarray(labels[i]).astype(str))

    def registered(self, alignment: str, rule=None):
        """(training cells, held-out cells, the held-out patients' registrations or None).

        ``rule``: a SkipRule, or one of the bench's variants of the rule: ("steady", spread),
        ("whole patient", None)."""
        if alignment == "none":
            return self.cells, self.test_cells, None
        if alignment == "quantile":
            reference = np.mean([channel_quantiles(e) for e in self.embedding_cells], axis=0)
            train = [QuantileRegistration(channel_quantiles(e), reference).transform(x)
                     for e, x in zip(self.embedding_cells, self.cells)]
            test = [QuantileRegistration(channel_quantiles(c), reference).transform(x)
                    for c, x in zip(self.test_chosen, self.test_cells)]
            return train, test, None
        variant = None
        if isinstance(rule, tuple):
            variant, rule = rule
        reference = LandmarkReference.fit(self.embedding_cells, rule=rule if variant is None else SkipRule())
        if variant == "steady":  # nothing to correct where the training patients agree
            steady = [len(s) > 0 and s.max() < rule for s in reference.spread]
            reference = LandmarkReference([np.empty(0) if q else p for p, q in zip(reference.peaks, steady)],
                                          reference.agreement, reference.spread, reference.rule)

        def registration(cells):
            found = reference.registration(cells)
            if variant == "whole patient" and any(r not in (None, "no stable reference peaks") for r in found.skipped):
                d = len(found.sources)
                return LandmarkRegistration([np.empty(0)] * d, [np.empty(0)] * d)
            return found

        train = [registration(e).transform(x) for e, x in zip(self.embedding_cells, self.cells)]
        registrations = [registration(c) for c in self.test_chosen]
        test = [r.transform(x) for r, x in zip(registrations, self.test_cells)]
        return train, test, registrations

    def accuracies(self, train, test) -> list[float]:
        lda = LinearDiscriminantAnalysis().fit(np.vstack(train), np.concatenate(self.labels))
        return [float(np.mean(lda.predict(x) == y)) for x, y in zip(test, self.test_labels)]


def check_product_path(samples, labels, train, test, split: Split) -> None:
    """ResearchGatingModel(align="landmarks") registers training and held-out cells as :class:`Split` does."""
    model = ResearchGatingModel(cells_per_patient=CELLS_PER_PATIENT, random_state=0, align="landmarks")
    cells, _ = model.standardised_training_cells([samples[i] for i in train], [labels[i] for i in train])
    mine, held_out, _ = split.registered("landmarks", SkipRule())
    for a, b in zip(cells, mine):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.standardised_cells(samples[test[0]]), held_out[0])


# -- the tables ------------------------------------------------------------------------------------

MAIN = ("none", "quantile", "landmarks", "landmarks, rule off")
#: Short column names of the rule's reasons (a differing peak count is "peak count differs").
REASONS = {"registered": "registered", "peak count differs": "peak count differs",
           "a peak is nearer another reference peak": "nearer another peak",
           "the warp would stretch a gap too far": "stretch", "no stable reference peaks": "no stable reference",
           "no peak": "no peak"}


def run(data_sets, ablation: bool):
    """(one row per data set, protocol and alignment; skip reasons of the rule per channel)."""
    variants = [("none", "none", None), ("quantile", "quantile", None)]
    variants += [(label, "landmarks", rule) for label, rule in RULES.items()]
    if ablation:
        variants += [(label, "landmarks", rule) for label, rule in ABLATION.items()]
    rows, reasons = [], []
    for name in data_sets:
        samples, labels, splits = protocols(name)
        checked = False
        for protocol, trains, tests in splits:
            scores = {label: [] for label, _, _ in variants}
            skipped = {label: [] for label, _, _ in variants}
            for train, test in zip(trains, tests):
                split = Split(samples, labels, train, test)
                if not checked:
                    check_product_path(samples, labels, train, test, split)
                    checked = True
                for label, alignment, rule in variants:
                    x_train, x_test, registrations = split.registered(alignment, rule)
                    scores[label] += split.accuracies(x_train, x_test)
                    skipped[label] += [~r.registered_channels for r in registrations or []]
                    if label == "landmarks":
                        reasons += [{"data": name, "protocol": protocol, "channel": channel,
                                     "reason": why or "registered"}
                                    for r in registrations for channel, why in zip(split.model.channels_, r.skipped)]
            for label, _, _ in variants:
                rows.append({"data": name, "protocol": protocol, "alignment": label,
                             "mean": np.mean(scores[label]), "worst": np.min(scores[label]),
                             "patients": len(scores[label]),
                             "skipped": np.mean(skipped[label]) if skipped[label] else np.nan})
    return pd.DataFrame(rows), pd.DataFrame(reasons)


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per data set and protocol: mean / worst of each main alignment, the rule's skips."""
    out = []
    for (name, protocol), part in table.groupby(["data", "protocol"], sort=False):
        row = {"data": name, "protocol": protocol, "patients": int(part["patients"].iloc[0])}
        by = part.set_index("alignment")
        for label in MAIN:
            row[label] = f"{by.loc[label, 'mean']:.3f} / {by.loc[label, 'worst']:.3f}"
        row["skipped (rule)"] = f"{by.loc['landmarks', 'skipped']:.0%}"
        out.append(row)
    return pd.DataFrame(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=list(DEFAULT_DATA))
    parser.add_argument("--ablation", action="store_true", help="also the rule without each of its parts, and "
                                                                "other rules measured")
    parser.add_argument("--reasons", action="store_true", help="also why the rule skipped, per channel")
    parser.add_argument("--csv", metavar="FILE", help="write the long table (every alignment) as CSV")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    table, reasons = run(args.data, args.ablation)
    if args.csv:
        table.to_csv(args.csv, index=False)
    print("LDA accuracy, mean / worst held-out patient; skipped: share of (held-out patient, channel) pairs "
          "the rule left unregistered\n")
    print(wide(table).to_string(index=False))
    if args.ablation:
        shown = table[~table["alignment"].isin(("none", "quantile", "landmarks, rule off"))].copy()
        shown["skipped"] = [("" if np.isnan(v) else f"{v:.0%}") for v in shown["skipped"]]
        print("\nThe rule's parts and other rules (landmarks = the rule as shipped)\n")
        print(shown.drop(columns="patients").to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if args.reasons:
        reasons["reason"] = [REASONS.get(r, "peak count differs" if "peaks, reference" in r else r)
                             for r in reasons["reason"]]
        tally = reasons.groupby(["data", "protocol", "channel", "reason"], sort=False).size().unstack(fill_value=0)
        tally = tally[[c for c in REASONS.values() if c in tally.columns] +
                      [c for c in tally.columns if c not in REASONS.values()]]
        print("\nHeld-out patients per channel, registered or why skipped (the rule as shipped)\n")
        print(tally.to_string())
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
