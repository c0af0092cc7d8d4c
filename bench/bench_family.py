"""The marginal-transfer family on groups the model has never seen: every method in the same run.

On the shared multicenter CyTOF data (../shared/data/multicenter; ``groups.csv`` with columns
patient, pair, batch), two protocols that hold out whole groups (as ``bench_centers.py``):

- leave one replicate PAIR out (5 folds);
- train on the earlier BATCH, gate the later one.

Methods, all on the same splits: ``marginal`` (the product's default), ``pooled-logistic`` and
``lda`` (the baselines), and the papers' further systems ``dica-pooling`` (DICA, then a pooled
logistic regression), ``dica-marginal`` (DICA, then marginal transfer on the projected cells),
``marginal-hinge`` (the papers' hinge loss), ``multitask-0.01`` and ``multitask-0.5`` (k_P = tau
between training patients). Prints mean / worst-patient accuracy per method and protocol, and
writes that table as CSV (plus the per-patient rows beside it, ``<csv stem>.patients.csv``).

Run: ``python bench/bench_family.py OUT.csv [--methods a,b] [--protocols p,q] [--cells-per-patient N]``
(``--cells-per-patient``: the kernel methods' training cells per patient, passed as
``model_params``; default: the model's own default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.evaluation import held_out_evaluation, leave_one_group_out, summarize  # noqa: E402
from multicenter_data import MULTICENTER, load_multicenter  # noqa: E402

METHODS = ("marginal", "pooled-logistic", "lda", "dica-pooling", "dica-marginal", "marginal-hinge",
           "multitask-0.01", "multitask-0.5")


PROTOCOLS = ("leave-one-pair-out", "leave-later-batch-out")


def run(methods, model_params=None, folder=MULTICENTER, protocols=PROTOCOLS) -> pd.DataFrame:
    """Per-patient rows of both protocols (columns of ``leave_one_group_out`` plus ``seconds``:
    the method's time over the protocol's folds, fitting and gating)."""
    samples, labels, pairs, batches = load_multicenter(folder)
    later = [i for i, b in enumerate(batches) if b == sorted(set(batches))[-1]]
    protocols_ = {
        "leave-one-pair-out": lambda m: leave_one_group_out(samples, labels, pairs, methods=[m],
                                                            model_params=model_params),
        "leave-later-batch-out": lambda m: held_out_evaluation(
            samples, labels, [later], "leave-later-batch-out", methods=[m], model_params=model_params,
            groups=pairs, names=["batch " + batches[later[0]]]),
    }
    tables = []
    for protocol, evaluate in [(p, protocols_[p]) for p in protocols]:
        for method in methods:  # one method at a time, so each one's cost is measured
            start = time.time()
            table = evaluate(method)
            table["protocol"] = protocol
            table["seconds"] = time.time() - start
            summary = summarize(table).iloc[0]
            print(f"{protocol:22s} {method:16s} mean {summary['mean_accuracy']:.4f}  worst "
                  f"{summary['worst_accuracy']:.4f}  ({table['seconds'].iloc[0]:.0f} s)", flush=True)
            tables.append(table)
    return pd.concat(tables, ignore_index=True)


def family_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per protocol and method: mean and worst accuracy and macro-F1, worst patient, seconds."""
    summary = summarize(rows)
    seconds = rows.groupby(["protocol", "method"], sort=False)["seconds"].first().rename("seconds")
    return summary.join(seconds, on=["protocol", "method"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="write the summary table (mean / worst per method and protocol) here")
    parser.add_argument("--methods", help=f"comma-separated methods (default: {','.join(METHODS)})")
    parser.add_argument("--cells-per-patient", type=int, help="training cells per patient of the kernel methods")
    parser.add_argument("--data", default=str(MULTICENTER), help="the multicenter folder")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help=f"comma-separated protocols (default: {','.join(PROTOCOLS)})")
    args = parser.parse_args(argv)
    if not Path(args.data).exists():
        print(f"{args.data} absent: nothing to measure")
        return 1
    methods = tuple(args.methods.split(",")) if args.methods else METHODS
    params = {"cells_per_patient": args.cells_per_patient} if args.cells_per_patient else None
    start = time.time()
    protocols = tuple(args.protocols.split(","))
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            parser.error(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    rows = run(methods, params, args.data, protocols)
    table = family_table(rows)
    with pd.option_context("display.width", 200, "display.float_format", "{:.4f}".format):
        print(f"\n== multicenter CyTOF, unseen groups ({time.time() - start:.0f} s; model_params {params})")
        print(table[["protocol", "method", "mean_accuracy", "worst_accuracy", "worst_patient", "mean_macro_f1",
                     "seconds"]].to_string(index=False))
        wide = table.pivot(index="method", columns="protocol", values=["mean_accuracy", "worst_accuracy"])
        print("\n" + wide.loc[[m for m in methods if m in wide.index]].to_string())
    out = Path(args.csv)
    table.to_csv(out, index=False)
    rows.to_csv(out.with_name(out.stem + ".patients.csv"), index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
