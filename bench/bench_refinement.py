"""How many corrected cells reach 99% agreement with the truth: refinement vs relabeling only.

A simulated reviewer corrects a new patient of the sample data round by round. Each round it
takes the commonest kind of error left (true population A gated as B), picks one such cell at
random (seeded) and circles the ``--per-round`` cells of the same kind nearest to it (in the
model's standardised channels) -- what a lasso on the A/B region with "Only cells now in B"
gives. Two reviews run side by side from the model's gating:

- relabel only: the circled cells take label A, nothing else moves (the app without the option);
- refinement: every correction so far refits the patient's decision function
  (:func:`gating_core.method.refinement.refine_gating`), so similar cells move too.

Printed: the curve (corrected cells -> agreement with the truth) for both, and the corrected
cells each needed to reach ``--target`` agreement. Models: trained on all eight sample patients
(the product's defaults), on three (select=False, no augmentation), and on the same three as
the marginal model alone (no companion, no self-training: a weak model, many errors).

``--data dlbcl``: the real DLBCL biopsies of ``../shared/data/dlbcl`` (or
``$GATING_SHARED_DATA``) instead, the default model trained on the second batch (dlbcl_19-30)
and the first batch's patients reviewed (``--patients dlbcl_17 dlbcl_16``): the model errs on
thousands of their cells. ``--lasso all``: the reviewer's lasso takes every cell near the chosen
one, whatever the model called it and whatever it is, and gives them all the chosen cell's
population -- a careless lasso, some of whose cells were right already or belong elsewhere (the
default, ``error``, circles only cells of the error kind).

    python bench/bench_refinement.py [--patients new_patient_03] [--per-round 25] [--alpha 1.0]
    python bench/bench_refinement.py --data dlbcl --patients dlbcl_17 dlbcl_16 --per-round 100 --target 0.95 --budget 1500 [--lasso all]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.fcs import read_fcs  # noqa: E402
from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.io.labels import read_labels_csv  # noqa: E402
from gating_core.method.refinement import DEFAULT_ALPHA, MAX_MOVED_SHARE, _PatientFrame, refine_gating  # noqa: E402
from gating_core.model import GatingModel  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
SHARED = Path(os.environ.get("GATING_SHARED_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))


def next_circle(current, truth, corrected_mask, cells, per_round, rng, lasso="error"):
    """The reviewer's next lasso: indices of ``per_round`` cells of the commonest error kind
    nearest a cell of that kind drawn at random (``lasso="all"``: the ``per_round`` uncorrected
    cells nearest it, of any kind), and the population they are given: the drawn cell's."""
    wrong = np.flatnonzero((current != truth) & ~corrected_mask)
    if len(wrong) == 0:
        return None, None
    pairs, counts = np.unique(np.char.add(np.char.add(truth[wrong].astype(str), "\t"),
                                          current[wrong].astype(str)), return_counts=True)
    true_pop, shown_pop = pairs[np.argmax(counts)].split("\t")
    kind = wrong[(truth[wrong] == true_pop) & (current[wrong] == shown_pop)]
    seed = rng.choice(kind)
    pool = kind if lasso == "error" else np.flatnonzero(~corrected_mask)
    distance = ((cells[pool] - cells[seed]) ** 2).sum(axis=1)
    return pool[np.argsort(distance, kind="stable")[:per_round]], true_pop


def review(model, sample, truth, base, cells, refine, per_round, target, budget, alpha, seed, lasso="error",
           max_moved_share=MAX_MOVED_SHARE):
    """One simulated review: list of (corrected cells, agreement, changed beyond circled)."""
    rng = np.random.default_rng(seed)
    current = np.asarray(base.populations).astype(str)
    corrected, given = [], []
    mask = np.zeros(len(truth), dtype=bool)
    curve = [(0, float(np.mean(current == truth)), 0)]
    while curve[-1][1] < target and len(corrected) < budget:
        circle, label = next_circle(current, truth, mask, cells, per_round, rng, lasso)
        if circle is None:
            break
        corrected.extend(circle.tolist())
        given.extend([label] * len(circle))
        mask[circle] = True
        if refine:
            result = refine_gating(model, sample, corrected, given, alpha=alpha, base=base,
                                   max_moved_share=max_moved_share)
            current = np.asarray(result.populations).astype(str)
            beyond = result.n_changed_beyond
        else:
            current = current.copy()
            current[circle] = label
            beyond = 0
        curve.append((len(corrected), float(np.mean(current == truth)), beyond))
    return curve


def cells_to_reach(curve, target):
    for n, accuracy, _ in curve:
        if accuracy >= target:
            return n
    return None


def sample_data_cases():
    """The models of the sample data and a reader of its new patients' (sample, truth)."""
    cohort = [load_labeled_input(p) for p in sorted(SAMPLE.glob("patient_*.fcs"))]
    samples, labels = (list(v) for v in zip(*cohort))
    models = {
        "8 patients, defaults": lambda: GatingModel(random_state=0).fit(samples, labels),
        "3 patients, select=False, n_augment=0": lambda: GatingModel(random_state=0, select=False).fit(
            samples[:3], labels[:3]),
        # The same without the companion and self-training, which rescue that model on this patient:
        # a model with many errors, as a reviewer meets on a patient unlike the training ones.
        "3 patients, marginal model alone (select=False, n_augment=0, pooled_weight=0, self_training=False)":
            lambda: GatingModel(random_state=0, select=False, pooled_weight=0).fit(samples[:3], labels[:3]),
    }

    def load(stem):
        sample = read_fcs(SAMPLE / "new" / f"{stem}.fcs", compensate=True)
        return sample, read_labels_csv(SAMPLE / "truth" / f"{stem}.labels.csv", sample.n_events).astype(str)

    return models, load


def dlbcl_cases():
    """The default model of the DLBCL biopsies' second batch and a reader of any biopsy's (sample, truth)."""
    folder = SHARED / "dlbcl"
    if not folder.is_dir():
        raise SystemExit(f"no DLBCL data in {folder}: set GATING_SHARED_DATA to the shared data folder")
    samples, labels = (list(v) for v in zip(*[load_labeled_input(folder / f"dlbcl_{i:02d}.fcs")
                                               for i in range(19, 31)]))
    models = {"defaults, trained on the second batch (dlbcl_19-30)":
              lambda: GatingModel(random_state=0).fit(samples, labels)}

    def load(stem):
        sample = read_fcs(folder / f"{stem}.fcs", compensate=True)
        return sample, read_labels_csv(folder / f"{stem}.labels.csv", sample.n_events).astype(str)

    return models, load


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("sample", "dlbcl"), default="sample")
    parser.add_argument("--patients", nargs="+", help="default: new_patient_03; with --data dlbcl, dlbcl_17 dlbcl_16")
    parser.add_argument("--per-round", type=int, default=25)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--alpha", type=float, nargs="+", default=[DEFAULT_ALPHA])
    parser.add_argument("--lasso", choices=("error", "all"), default="error",
                        help="error: the lasso circles cells of the error kind only; all: every cell near the chosen one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-held-back", action="store_true",
                        help="the refinement in full: populations it would empty are not held back (the reviewer "
                             "moves them with the page's button)")
    args = parser.parse_args(argv)

    models, load = dlbcl_cases() if args.data == "dlbcl" else sample_data_cases()
    patients = args.patients or (["dlbcl_17", "dlbcl_16"] if args.data == "dlbcl" else ["new_patient_03"])
    for model_name, build in models.items():
        start = time.perf_counter()
        model = build()
        print(f"\n== model: {model_name} (fitted in {time.perf_counter() - start:.1f} s)")
        for stem in patients:
            sample, truth = load(stem)
            base = model.gate(sample)
            frame = _PatientFrame(model, sample)
            cells = model._registered(model._standardise(frame.events[:, frame.indices]), frame.registration)
            print(f"-- {stem}: {sample.n_events} events, model agreement {np.mean(base.populations == truth):.4f}")
            relabel = review(model, sample, truth, base, cells, False, args.per_round, args.target, args.budget,
                             None, args.seed, args.lasso)
            print(f"   relabel only: {cells_to_reach(relabel, args.target)} corrected cells to reach {args.target:.0%}")
            for alpha in args.alpha:
                start = time.perf_counter()
                refined = review(model, sample, truth, base, cells, True, args.per_round, args.target, args.budget,
                                 alpha, args.seed, args.lasso, None if args.no_held_back else MAX_MOVED_SHARE)
                seconds = (time.perf_counter() - start) / max(1, len(refined) - 1)
                print(f"   refinement (lambda={alpha:g}): {cells_to_reach(refined, args.target)} corrected cells "
                      f"to reach {args.target:.0%} ({seconds:.2f} s per refit)")
                print("     corrected  relabel-only  refined  changed-beyond-circled")
                for i, (n, accuracy, beyond) in enumerate(refined):
                    r = relabel[min(i, len(relabel) - 1)]
                    print(f"     {n:9d}  {r[1]:12.4f}  {accuracy:7.4f}  {beyond:8d}")
                print(f"     (relabel only goes on to {relabel[-1][1]:.4f} at {relabel[-1][0]} corrected cells)")

if __name__ == "__main__":
    main()
