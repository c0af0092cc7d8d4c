"""Patients from centers the model has never seen: every method on the same splits.

Protocols (design.md section 3), each printed as mean and worst patient per method:

- shared multicenter CyTOF (../shared/data/multicenter, when present; groups from its
  ``groups.csv``): leave one replicate PAIR out, leave the later BATCH out (train on batch A,
  gate batch B), and leave one patient out (where the held-out patient's twin is in training);
- a simulated multi-center flow cohort (``gating_core.synthetic.simulate_centers``: center-level
  gains, offsets, background, compression, compensation errors and population proportions):
  leave one CENTER out, and leave one patient out;

then accuracy against the marginal model's novelty score over every held-out patient.
Methods: the product's default (``marginal``: the marginal model blended with its pooled
companion), ``marginal-alone`` (the same without the companion), ``pooling`` (same estimator, k_P = 1),
``pooled-ridge`` (pooling without shift augmentation: the product's previous pooling),
``pooled-logistic`` (plain pooled random-feature logistic regression, 1/n_i weights) and LDA.

Run: ``python bench/bench_centers.py [--quick] [--multicenter-only] [--groups-only]
[--methods a,b,...]`` (``--quick``: synthetic cohort only; ``--groups-only``: no
leave-one-patient-out; ``--methods``: e.g. the options ``marginal-em,marginal-quantile``);
``--cohorts 12,13,14`` instead prints leave-one-center-out on further simulated cohorts
(4 centers x 3 patients x 6,000 events, one line per seed), to see how much a margin on one
cohort depends on its draw.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation import (held_out_evaluation, leave_one_group_out, leave_one_patient_out,  # noqa: E402
                                    novelty_curve, repeat_over_seeds, summarize, summarize_seeds)
from gating_core.synthetic import simulate_centers  # noqa: E402
from multicenter_data import MULTICENTER, load_multicenter  # noqa: E402

METHODS = ("marginal", "marginal-alone", "pooling", "pooled-ridge", "pooled-logistic", "lda")


def _print(title, table):
    summary = summarize(table)
    with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
        print(f"\n== {title}")
        print(summary[["protocol", "method", "mean_accuracy", "worst_accuracy", "worst_patient",
                       "mean_macro_f1", "worst_macro_f1"]].to_string(index=False), flush=True)
        best = summary.set_index("method")
        for other in METHODS[1:]:
            if "marginal" in best.index and other in best.index:
                print(f"   marginal - {other}: mean {best.loc['marginal', 'mean_accuracy'] - best.loc[other, 'mean_accuracy']:+.4f}, "
                      f"worst {best.loc['marginal', 'worst_accuracy'] - best.loc[other, 'worst_accuracy']:+.4f}")


def _timed(title, run, protocol=None):
    """Run one protocol, name it, print its summary with the time it took; returns the table."""
    start = time.time()
    table = run()
    if protocol:
        table["protocol"] = protocol
    _print(f"{title} ({time.time() - start:.0f} s)", table)
    return table


def multicenter(methods, patient_protocol=True):
    samples, labels, pairs, batches = load_multicenter()
    later = [i for i, b in enumerate(batches) if b == sorted(set(batches))[-1]]
    return pd.concat([
        _timed("multicenter, leave one replicate pair out",
               lambda: leave_one_group_out(samples, labels, pairs, methods=methods), "leave-one-pair-out"),
        _timed("multicenter, train on the earlier batch, gate the later one",
               lambda: held_out_evaluation(samples, labels, [later], "leave-later-batch-out", methods=methods,
                                           groups=pairs, names=["batch " + batches[later[0]]])),
    ] + ([_timed("multicenter, leave one patient out (twin in training)",
                 lambda: leave_one_patient_out(samples, labels, methods=methods, groups=pairs, refit="full"))]
         if patient_protocol else []), ignore_index=True)


def synthetic(methods, n_centers=4, per_center=3, n_events=10000, seed=11, patient_protocol=True):
    cohort, centers = simulate_centers(n_centers, per_center, seed=seed, n_events=n_events, strength=2.0)
    samples, labels = [c[0] for c in cohort], [c[1] for c in cohort]
    groups = [centers[s.name] for s in samples]
    return pd.concat([
        _timed(f"synthetic {n_centers} centers x {per_center} patients, leave one center out",
               lambda: leave_one_group_out(samples, labels, groups, methods=methods), "leave-one-center-out"),
    ] + ([_timed("synthetic, leave one patient out",
                 lambda: leave_one_patient_out(samples, labels, methods=methods, groups=groups, refit="full"))]
         if patient_protocol else []), ignore_index=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="synthetic cohort only")
    parser.add_argument("--multicenter-only", action="store_true", help="the shared multicenter protocols only")
    parser.add_argument("--methods", help="comma-separated methods instead of the default set "
                                          "(for example marginal,marginal-em,marginal-quantile)")
    parser.add_argument("--groups-only", action="store_true",
                        help="skip the leave-one-patient-out protocols (the group protocols only)")
    parser.add_argument("--csv", help="write every per-patient row here")
    parser.add_argument("--cohorts", metavar="SEEDS", help="comma-separated seeds: other simulated cohorts only")
    parser.add_argument("--model-seeds", metavar="SEEDS",
                        help="with --cohorts: repeat each cohort with these model seeds (comma-separated) and print "
                             "the mean over them of each seed's mean / worst patient, and the seeds each method led")
    args = parser.parse_args(argv)
    if args.cohorts:
        for seed in (int(s) for s in args.cohorts.split(",")):
            cohort, centers = simulate_centers(4, 3, seed=seed, n_events=6000, strength=2.0)
            samples, labels = [c[0] for c in cohort], [c[1] for c in cohort]
            methods = tuple(args.methods.split(",")) if args.methods else METHODS
            if args.model_seeds:
                groups = [centers[x.name] for x in samples]
                table = repeat_over_seeds(lambda p: leave_one_group_out(samples, labels, groups, methods=methods,
                                                                        model_params=p),
                                          [int(s) for s in args.model_seeds.split(",")])
                if args.csv:
                    table.assign(cohort=seed).to_csv(args.csv, mode="a", index=False, header=not Path(args.csv).exists())
                over = summarize_seeds(table).set_index("method")
                print(f"seed {seed}: " + ", ".join(
                    f"{m} {over.loc[m, 'mean_accuracy']:.4f} / {over.loc[m, 'worst_accuracy']:.4f} "
                    f"(sd {over.loc[m, 'mean_accuracy_sd']:.4f} / {over.loc[m, 'worst_accuracy_sd']:.4f}; led "
                    f"{over.loc[m, 'best_mean_in']} / {over.loc[m, 'best_worst_in']})" for m in methods), flush=True)
                continue
            summary = summarize(leave_one_group_out(samples, labels, [centers[x.name] for x in samples],
                                                    methods=methods)).set_index("method")
            print(f"seed {seed}: " + ", ".join(f"{m} {summary.loc[m, 'mean_accuracy']:.4f} / "
                                               f"{summary.loc[m, 'worst_accuracy']:.4f}" for m in methods), flush=True)
        return 0
    methods = tuple(args.methods.split(",")) if args.methods else METHODS
    patient_protocol = not args.groups_only
    tables = [] if args.multicenter_only else [synthetic(methods, patient_protocol=patient_protocol)]
    if not args.quick and MULTICENTER.exists():
        tables.append(multicenter(methods, patient_protocol))
    elif not args.quick:
        print("\n(../shared/data/multicenter absent: real-data protocols skipped)")
    table = pd.concat(tables, ignore_index=True)
    if args.csv:
        table.to_csv(args.csv, index=False)
    if "marginal" not in set(table["method"]):
        return 0  # the curve is over the default model's novelty score
    curve = novelty_curve(table)
    with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
        print("\n== accuracy against novelty (marginal model's score; all held-out patients above)")
        print(curve.pivot(index="novelty_bin", columns="method", values="mean_accuracy").join(
            curve[curve["method"] == "marginal"].set_index("novelty_bin")["patients"]).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
