"""``evaluate``: the model beside the baselines on held-out groups and patients (leave one group
out, leave one patient out, one group against the others, folds, over several seeds), printed
per patient and summarised; its options and checks."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gating_core.commands import print_json
from gating_core.commands.model_options import (_check_unique, _fail, _model_options, _model_params, _usage,
                                             writable_folder_problem)
from gating_core.errors import describe_error, print_error

# Kept here rather than imported so that the command line starts without numpy and scikit-learn;
# tests/test_transfer.py checks it against gating_core.evaluation.protocols.ALL_METHODS.
EVALUATION_METHODS = ("marginal", "pooling", "pooled-ridge", "pooled-logistic", "lda", "marginal-alone", "marginal-auto",
                      "marginal-em", "marginal-quantile", "dica-pooling")
EVALUATION_METHODS += ("qda", "trees")
EVALUATION_METHODS += ("marginal-no-adaptive", "adaptive-lda", "marginal-augment", "marginal-second-bandwidth",
                       "marginal-self-training", "previous-default", "marginal-transfer-start")
EVALUATION_METHODS += ("marginal-hinge", "multitask-0.01", "multitask-0.5", "dica-marginal", "iw-nystroem",
                       "marginal-linear", "marginal-agnostic", "marginal-select-worst")
EVALUATION_METHODS += ("marginal-whole-populations",)
EVALUATION_METHODS += ("marginal-landmarks",)
EVALUATION_METHODS += ("marginal-shared-covariance", "marginal-even-weight")
EVALUATION_METHODS += ("marginal-no-swollen-check", "marginal-no-trees")


def _looks_like_input(value: str) -> bool:
    path = Path(value)
    return bool(path.suffix) or os.sep in value or "/" in value or path.exists()


class _MethodNames(argparse.Action):
    """``--method``'s names; what follows them that is no method name but a path starts the
    INPUTs, so that ``evaluate --method lda trees a.fcs b.fcs`` reads as the usage line does
    (argparse alone would take the files for method names)."""

    def __call__(self, parser, namespace, values, option_string=None):
        methods = []
        for value in values:
            if value not in EVALUATION_METHODS:
                break
            methods.append(value)
        rest = list(values[len(methods):])
        if not methods or (rest and not _looks_like_input(rest[0])):
            wrong = rest[0] if methods else values[0]
            parser.error(f"argument --method: invalid choice: {wrong!r} (choose from {', '.join(EVALUATION_METHODS)})")
        setattr(namespace, self.dest, methods)
        if getattr(namespace, "inputs", None):  # `a.fcs --method lda b.fcs`: b after a, in the order given
            namespace.inputs = list(namespace.inputs) + rest
        else:
            namespace.method_inputs = list(getattr(namespace, "method_inputs", None) or []) + rest


def register(subparsers) -> None:
    evaluate = subparsers.add_parser(
        "evaluate", help="leave-one-group-out and leave-one-patient-out evaluation beside the baselines",
        description="Hold out whole groups of INPUT patients (centers, batches, runs: --groups, or "
                    "near-duplicate patients found from their cell distributions), and single patients; "
                    "per patient and method, accuracy, F1 per population and macro-F1; then the mean and "
                    "the worst patient of each method, accuracy against novelty, and the accuracy of the "
                    "patients flagged for review against the others.")
    evaluate.add_argument("--method", nargs="+", action=_MethodNames, metavar="METHOD",
                          default=["marginal", "pooled-logistic", "lda", "qda", "trees"],
                          help="methods to compare (default: marginal -- the default model --, pooled-logistic, "
                               "lda, qda and trees (gradient-boosted); "
                               "marginal-alone is the marginal model without its pooled companion; marginal-em and "
                               "marginal-quantile add class-prior re-estimation or quantile registration; dica-pooling is "
                               "a pooled logistic regression on DICA components, Muandet et al. 2013; iw-nystroem refits an "
                               "importance-weighted Nystroem KRR for each held-out patient; marginal-agnostic weighs training "
                               "patients towards the worst mixture, marginal-select-worst chooses every hyperparameter "
                               "for the worst held-out group; marginal-no-adaptive gates without the adapted "
                               "populations, adaptive-lda with them alone; marginal-augment, marginal-second-bandwidth, "
                               "marginal-self-training and marginal-transfer-start add an option the default leaves out, "
                               "previous-default the first three without the adapted populations; marginal-landmarks registers "
                               "each channel's density peaks onto the training patients' consensus peaks, channels "
                               "whose peaks do not match left as they are; marginal-shared-covariance adapts the "
                               "populations without their own shapes, marginal-even-weight weighs the transfer model "
                               "and the two fits a third each whatever the held-out groups say, marginal-whole-populations "
                               "fits every population as one Gaussian, never as components, marginal-no-swollen-check "
                               "mixes a rare population the adapted populations let swell as any other, "
                               "marginal-no-trees never lets the pooled trees join). Names: "
                               + ", ".join(EVALUATION_METHODS))
    evaluate.add_argument("--groups", metavar="FILE|KEYWORD",
                          help="the group (center, batch, run) of each patient: a CSV (patient, group) or an "
                               "FCS keyword such as $CYTSN, $INST or $DATE; default: near-duplicate patients "
                               "found from their embeddings")
    evaluate.add_argument("--group-column", metavar="NAME",
                          help="the column of the --groups CSV to read (default: the first of group, center, "
                               "batch, run and pair it has, else its second column)")
    evaluate.add_argument("--protocol", choices=("both", "group", "patient", "one-group", "folds"), default="both",
                          help="leave one group out, leave one patient out, or both (default); 'one-group': train "
                               "on one group and gate the patients of all others, each group in turn; 'folds': "
                               "--folds K random folds over patients")
    evaluate.add_argument("--folds", type=int, default=2, metavar="K",
                          help="folds over patients of --protocol folds (default 2)")
    evaluate.add_argument("--refit", choices=("subtract", "full"),
                          help="how each fold's kernel model is fitted: 'subtract' from the statistics of all "
                               "patients minus the held-out ones, selection included per fold, at about the cost "
                               "of one training (the held-out cells still shape the shared standardisation); "
                               "'full' refits a model per fold from its training files alone (one training per "
                               "fold). Default: subtract when leaving one patient out, full when leaving a group out")
    evaluate.add_argument("--seeds", type=int, nargs="+", metavar="S",
                          help="repeat every protocol with each of these model seeds (the training cells drawn, "
                               "the random features, the selection folds) and report, per method, the mean and "
                               "spread over seeds and in how many seeds it had the best mean and the best worst "
                               "patient (default: the one --seed)")
    evaluate.add_argument("--csv", metavar="FILE", help="also write the per-patient table as CSV")
    evaluate.add_argument("--json", action="store_true", help="print the tables as JSON")
    _model_options(evaluate)
    # "*": the INPUTs may follow --method's names (_MethodNames); at least one is checked in run_evaluate
    evaluate.add_argument("inputs", nargs="*", metavar="INPUT")
    evaluate.set_defaults(func=run_evaluate)


def _load_inputs(paths, compensate: bool):
    """Labeled patients from INPUT paths; returns (samples, labels, errors)."""
    from gating_core.fcs import FCSError
    from gating_core.io.inputs import load_labeled_input
    from gating_core.io.labels import LabelError

    samples, labels, errors = [], [], []
    for path in paths:
        try:
            sample, populations = load_labeled_input(path, compensate=compensate)
        except (FCSError, LabelError, OSError) as exc:
            errors.append(describe_error(exc))
            continue
        samples.append(sample)
        labels.append(populations)
    _check_unique([s.name for s in samples], errors)
    return samples, labels, errors


def _names_a_file(text: str) -> bool:
    """Whether ``--groups``' value reads as a path (a folder in it, or a table's suffix) rather
    than an FCS keyword such as ``$SRC`` or ``CENTER``."""
    return "/" in text or "\\" in text or Path(text).suffix.lower() in (".csv", ".tsv", ".txt") \
        or Path(text).is_dir()


def _evaluation_groups(args, samples, labels):
    """(groups, how they were found) for ``evaluate``."""
    from gating_core.evaluation.protocols import infer_patient_groups
    from gating_core.method.groups import groups_csv_column, groups_from_csv, groups_from_keyword

    if args.groups:
        if Path(args.groups).is_file():
            column = groups_csv_column(args.groups, args.group_column)
            return (groups_from_csv(args.groups, [s.name for s in samples], args.group_column),
                    f"from {Path(args.groups).name}, column {column}")
        return groups_from_keyword(samples, args.groups), f"from the keyword {args.groups}"
    return infer_patient_groups(samples, labels), "inferred (near-duplicate patients kept together)"


def run_evaluate(args) -> int:
    args.inputs = list(getattr(args, "method_inputs", None) or []) + list(args.inputs)
    if not args.inputs:
        return _usage("evaluate: give at least one INPUT (FCS files with their labels, or gated CSVs)")
    if args.group_column and not (args.groups and Path(args.groups).is_file()):
        return _usage("--group-column names a column of the --groups CSV file: give --groups FILE")
    if args.groups and not Path(args.groups).is_file() and _names_a_file(args.groups):
        # a mistyped path would otherwise be looked up, after every input is read, as a keyword
        what = "is a folder, not a CSV file" if Path(args.groups).is_dir() else "no such file"
        print_error(f"{args.groups}: {what} (--groups takes a CSV file, or the name of an FCS keyword)")
        return 1
    if args.csv:
        # found before the evaluation runs, which it would otherwise throw away at the end
        folder = Path(args.csv).absolute().parent
        problem = (f"{args.csv}: the folder {folder} does not exist" if not folder.is_dir()
                   else writable_folder_problem(folder, f"{args.csv}: "))
        if problem:
            print_error(f"{problem} (--csv)")
            return 1
    import pandas as pd

    from gating_core.evaluation.protocols import (leave_one_group_out, leave_one_patient_out, novelty_curve,
                                                  patient_folds, repeat_over_seeds, review_split, summarize,
                                                  summarize_seeds, train_on_one_group)
    from gating_core.method.groups import GroupsError
    from gating_core.model.result import DISAGREEMENT_THRESHOLD, ChannelMismatchError
    from gating_core.progress import StageProgress

    samples, labels, errors = _load_inputs(args.inputs, not args.no_compensation)
    for message in errors:
        print_error(message)
    if errors:
        return 1
    if len(samples) < 3:
        wanted = {"both": "evaluation", "group": "leaving a group out", "patient": "leave-one-patient-out",
                  "one-group": "training on one group and gating another", "folds": "folds over patients"}
        return _usage(f"{wanted[args.protocol]} needs at least three labeled patients, got {len(samples)}")
    params = _model_params(args)
    params.pop("compensate", None)
    # The held-out check by subtraction (gating_core.evaluation.held_out) does not search sigma' yet: with
    # --select-embedding-bandwidth every fold is a full refit, which does.
    patient_refit = args.refit or "subtract"
    if args.select_embedding_bandwidth:
        if args.refit == "subtract":
            return _usage("--select-embedding-bandwidth needs --refit full (the check by subtraction does not "
                         "select sigma')")
        patient_refit = "full"
    try:
        groups, origin = _evaluation_groups(args, samples, labels)
    except GroupsError as exc:
        return _fail(describe_error(exc))
    distinct = sorted(set(groups))
    singletons = len(distinct) == len(samples)
    if args.protocol in ("group", "one-group") and len(distinct) < 2:
        return _fail(f"leaving a group out or training on one needs two or more groups; groups {origin}: {distinct}")
    seeds = sorted(set(args.seeds)) if args.seeds else None

    def protocols(model_params, progress):
        runs = []
        if args.protocol in ("both", "group") and len(distinct) >= 2 and not (singletons and args.protocol == "both"):
            runs.append(("groups", lambda report: leave_one_group_out(
                samples, labels, groups, methods=args.method, model_params=model_params, progress=report,
                refit=args.refit or "full")))
        if args.protocol in ("both", "patient"):
            runs.append(("patients", lambda report: leave_one_patient_out(
                samples, labels, methods=args.method, model_params=model_params, progress=report, groups=groups,
                refit=patient_refit)))
        if args.protocol == "one-group":
            runs.append(("one group", lambda report: train_on_one_group(
                samples, labels, groups, methods=args.method, model_params=model_params, progress=report)))
        if args.protocol == "folds":
            runs.append(("folds", lambda report: patient_folds(
                samples, labels, args.folds, methods=args.method, model_params=model_params, progress=report,
                groups=groups, seed=model_params.get("random_state", 0))))
        tables = []
        for i, (name, run) in enumerate(runs):
            # One bar over every protocol: each reports its own 0-100%, which would restart the bar.
            def report(stage, fraction, i=i, name=name):
                progress(f"{name}: {stage}" if len(runs) > 1 else stage, (i + fraction) / len(runs))

            tables.append(run(report))
        return pd.concat(tables, ignore_index=True)

    def over_seeds_run(progress):
        """One run of the protocols per seed, on one rising bar."""

        def run(model_params):
            k = seeds.index(model_params["random_state"])

            def report(stage, fraction):
                progress(f"seed {seeds[k]}: {stage}", (k + fraction) / len(seeds))

            return protocols(model_params, report)

        return run

    try:
        with StageProgress("evaluate") as progress:
            table = (protocols(params, progress) if seeds is None else
                     repeat_over_seeds(over_seeds_run(progress), seeds, params))
    except (ChannelMismatchError, ValueError) as exc:
        return _fail(describe_error(exc))
    summary = summarize(table)
    over_seeds = None if seeds is None else summarize_seeds(table)
    curve = novelty_curve(table) if "marginal" in args.method else None
    review = review_split(table)
    if args.csv:
        from gating_core.io.spreadsheet_cells import safe_frame

        safe_frame(table).to_csv(args.csv, index=False)
    if args.json:
        document = {"groups": dict(zip([s.name for s in samples], groups)), "groups_origin": origin,
                    "patients": table.to_dict(orient="records"), "summary": summary.to_dict(orient="records"),
                    "summary_over_seeds": [] if over_seeds is None else over_seeds.to_dict(orient="records"),
                    "novelty_curve": [] if curve is None else curve.astype({"novelty_bin": str}).to_dict(orient="records"),
                    "review": [] if review is None else review.to_dict(orient="records")}
        print_json(document, indent=None)
        return 0
    f1_columns = [c for c in table.columns if c.startswith("f1:")]
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.float_format", "{:.4f}".format):
        print(f"Groups {origin}: " + ", ".join(f"{g} ({groups.count(g)})" for g in distinct))
        if singletons and args.protocol == "both":
            print("Every patient is its own group: leaving one group out is leaving one patient out.")
        seed_column = ["seed"] if seeds is not None else []
        for protocol, part in table.groupby("protocol", sort=False):
            print()
            print(f"{protocol}, per patient")
            shown = part[seed_column + ["held_out", "patient", "method", "accuracy", "macro_f1", "novelty"]
                         + (["disagreement"] if part["disagreement"].notna().any() else [])
                         + (["unknown"] if part["unknown"].any() else []) + f1_columns
                         ].rename(columns={c: f"F1 {c[3:]}" for c in f1_columns})
            print(_split_column_shown(shown, protocol).to_string(index=False))
        print()
        print("Summary (mean and worst patient, per protocol" + (" and seed)" if seeds else ")")
              + "; worst_patient: the patient of worst_accuracy")
        print(summary.to_string(index=False))
        if over_seeds is not None:
            print()
            print(f"Over the seeds {seeds}: mean (sd) of each seed's mean and worst patient; best_mean_in / "
                  "best_worst_in: seeds in which the method had the best mean / worst patient")
            print(over_seeds.to_string(index=False))
        if curve is not None:
            print()
            print("Accuracy against novelty (novelty of the marginal model; all protocols)")
            print(curve.to_string(index=False))
        if review is not None:
            print()
            print(f"The marginal model's patients flagged for review (review: its transfer model and adapted "
                  f"populations disagree on more than {DISAGREEMENT_THRESHOLD:.0%} of the cells) and the others")
            print(review.to_string(index=False))
    return 0


def _split_column_shown(table, protocol: str):
    """The per-patient table with its split column named for the reader: ``trained on`` (the group
    each model learned from) when training on one group, ``held out`` otherwise."""
    if protocol == "train-on-one-group":
        trained_on = table["held_out"].astype(str).str.removeprefix("trained on ")
        return table.assign(held_out=trained_on).rename(columns={"held_out": "trained on"})
    return table.rename(columns={"held_out": "held out"})
