"""``train``, ``gate`` and ``evaluate``: the command-line contract of design.md section 5."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gating_core.commands import DEFAULT_KEYWORDS_HELP, add_keyword_options, print_json
from gating_core.errors import print_error

# Kept here rather than imported so that the command line starts without numpy and scikit-learn;
# tests/test_transfer.py checks them against gating_core.evaluation.protocols.ALL_METHODS and
# gating_core.model.estimator.DEFAULT_POOLED_WEIGHT; tests/test_class_balance.py DEFAULT_CLASS_BALANCE.
EVALUATION_METHODS = ("marginal", "pooling", "pooled-ridge", "pooled-logistic", "lda", "marginal-alone", "marginal-auto",
                      "marginal-em", "marginal-quantile", "dica-pooling")
EVALUATION_METHODS += ("qda", "trees")
EVALUATION_METHODS += ("marginal-no-adaptive", "adaptive-lda", "marginal-augment", "marginal-second-bandwidth",
                       "marginal-self-training", "previous-default")
EVALUATION_METHODS += ("marginal-hinge", "multitask-0.01", "multitask-0.5", "dica-marginal", "iw-nystroem",
                       "marginal-linear", "marginal-agnostic", "marginal-select-worst")
EVALUATION_METHODS += ("marginal-landmarks",)
# gating_core.method.alignment.ALIGNMENTS (checked by tests/test_landmark_alignment.py).
ALIGNMENTS = ("none", "quantile", "landmarks")
DEFAULT_POOLED_WEIGHT = 0.5
DEFAULT_ADAPTIVE_WEIGHT = "auto"
DEFAULT_CLASS_BALANCE = 0.0
# gating_core.method.unknown_cells.UNKNOWN_MARGIN (checked by tests/test_unknown_cells.py).
UNKNOWN_MARGIN = 3.0
# The choices of ``train`` (gating_core.model.estimator.METHODS and gating_core.method.classifier.LOSSES,
# checked by tests/test_train_choices.py).
TRAIN_METHODS = ("marginal", "pooling", "multitask")
LOSSES = ("squared", "logistic", "hinge")
DEFAULT_LOSS = "squared"
DEFAULT_TASK_SIMILARITY = 0.5
# gating_core.method.features.KERNELS_X (checked by tests/test_linear_kernel.py).
KERNELS_X = ("gaussian", "linear")
# Importance-weighted Nystroem KRR (gating_core.model.iw_model): transductive, refitted for each
# patient at gate time, so its model file keeps training cells (2,000 per patient by default).
IW_METHOD = "iw-nystroem"
DEFAULT_CELLS_PER_PATIENT = 4000
IW_CELLS_PER_PATIENT = 2000


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train", help="learn gates from expert-gated patients",
        description="Train a gating model on labeled patients. INPUT is an FCS file with "
                    "<stem>.labels.csv beside it, or a gated CSV.")
    train.add_argument("--out", required=True, help="model file to write (.npz)")
    train.add_argument("--method", choices=TRAIN_METHODS + (IW_METHOD,), default="marginal",
                       help="marginal transfer (default), the pooling baseline, the multitask baseline "
                            "(k_P = --task-similarity between training patients; NIPS 2011), or iw-nystroem: "
                            "importance-weighted Nystroem KRR, refitted by `gate` for each new patient on its own "
                            "cells (the model file keeps --cells-per-patient training cells each, default "
                            f"{IW_CELLS_PER_PATIENT:,})")
    train.add_argument("--landmarks", type=int, default=300, metavar="M",
                       help="Nystroem landmarks of --method iw-nystroem (default 300)")
    train.add_argument("--loss", choices=LOSSES, default=DEFAULT_LOSS,
                       help="squared (kernel ridge classification, default), logistic (multinomial, its penalty "
                            "chosen over groups) or hinge (cost-sensitive one-vs-rest SVM)")
    train.add_argument("--task-similarity", type=_task_similarity, default=DEFAULT_TASK_SIMILARITY, metavar="TAU",
                       help="tau of --method multitask, within (0, 1]; 1 is pooling "
                            f"(default {DEFAULT_TASK_SIMILARITY}; the NIPS table used 0.01 and 0.5)")
    train.add_argument("--kernel-x", choices=KERNELS_X, default="gaussian",
                       help="cell kernels k_X and k'_X: gaussian (default) or linear, as in the JMLR flow "
                            "experiment (the embedding is the patient's mean cell; each patient's gate is linear "
                            "in the cell; Gaussian kernel on the means)")
    train.add_argument("--library", metavar="DIR", help="also train on the labeled patients of this patient library")
    train.add_argument("--dica", choices=("supervised", "unsupervised"),
                       help="project the standardised cells onto domain-invariant directions first (DICA, "
                            "with the labels, or UDICA; Muandet et al. 2013); stored in the model file")
    train.add_argument("--dica-components", type=int, metavar="K",
                       help="directions DICA keeps (1-600, default 20; with --dica)")
    _cluster_options(train, "read and digest the INPUT files")
    _model_options(train)
    train.add_argument("inputs", nargs="*", metavar="INPUT")
    train.set_defaults(func=run_train)

    gate = subparsers.add_parser(
        "gate", help="gate new patients with a trained model",
        description="Gate FCS files; writes DIR/<stem>.gated.csv per patient (all channels by "
                    "$PnN, then population and confidence, one row per event in file order), or "
                    "<stem>.gated.parquet / .fcs / .h5ad with --format.")
    gate.add_argument("--model", required=True, help="model file written by train")
    gate.add_argument("--method", choices=(IW_METHOD,),
                      help="insist on a model of this method (iw-nystroem: importance-weighted Nystroem KRR, refitted "
                           "for each patient from the training cells its file keeps); default: whatever the model "
                           "file holds")
    gate.add_argument("--out-dir", required=True, help="folder for the gated files")
    gate.add_argument("--chunk-size", type=int, default=50_000,
                      help="events read, gated and written at a time (CSV and Parquet stream the file: bounds memory)")
    _cluster_options(gate, "gate files in parallel")
    gate.add_argument("--format", choices=("csv", "parquet", "fcs", "h5ad"), default="csv",
                      help="output per patient: gated CSV (default), Parquet (same columns, typed), FCS with a "
                           "population channel, or AnnData .h5ad (needs the anndata package). CSV and Parquet "
                           "carry no keywords; FCS and h5ad keep " + DEFAULT_KEYWORDS_HELP)
    add_keyword_options(gate, "an FCS or h5ad output")
    gate.add_argument("--json", action="store_true",
                      help="print one JSON document (a list, one record per patient) instead of text")
    gate.add_argument("fcs", nargs="+", metavar="FCS")
    gate.set_defaults(func=run_gate)

    evaluate = subparsers.add_parser(
        "evaluate", help="leave-one-group-out and leave-one-patient-out evaluation beside the baselines",
        description="Hold out whole groups of INPUT patients (centers, batches, runs: --groups, or "
                    "near-duplicate patients found from their cell distributions), and single patients; "
                    "per patient and method, accuracy, F1 per population and macro-F1; then the mean and "
                    "the worst patient of each method, and accuracy against novelty.")
    evaluate.add_argument("--method", nargs="+", choices=EVALUATION_METHODS,
                          default=["marginal", "pooled-logistic", "lda", "qda", "trees"],
                          help="methods to compare (default: marginal -- the default model --, pooled-logistic, "
                               "lda, qda and trees (gradient-boosted); "
                               "marginal-alone is the marginal model without its pooled companion; marginal-em and "
                               "marginal-quantile add class-prior re-estimation or quantile registration; dica-pooling is "
                               "a pooled logistic regression on DICA components, Muandet et al. 2013; iw-nystroem refits an "
                               "importance-weighted Nystroem KRR for each held-out patient; marginal-agnostic weighs training "
                               "patients towards the worst mixture, marginal-select-worst chooses every hyperparameter "
                               "for the worst held-out group; marginal-no-adaptive gates without the adapted "
                               "populations, adaptive-lda with them alone; marginal-augment, marginal-second-bandwidth "
                               "and marginal-self-training add an option the default leaves out, previous-default all "
                               "three without the adapted populations; marginal-landmarks registers "
                               "each channel's density peaks onto the training patients' consensus peaks, channels "
                               "whose peaks do not match left as they are)")
    evaluate.add_argument("--groups", metavar="FILE|KEYWORD",
                          help="the group (center, batch, run) of each patient: a CSV (patient, group) or an "
                               "FCS keyword such as $CYTSN, $INST or $DATE; default: near-duplicate patients "
                               "found from their embeddings")
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
    evaluate.add_argument("inputs", nargs="+", metavar="INPUT")
    evaluate.set_defaults(func=run_evaluate)


def _cluster_options(parser, what: str) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="K", help=f"{what} on a local Dask cluster of K workers")
    where.add_argument("--scheduler", metavar="ADDRESS", help=f"{what} on an existing Dask cluster (tcp://host:8786)")


def _model_options(parser) -> None:
    group = parser.add_argument_group("model options (defaults suit flow and mass cytometry)")
    group.add_argument("--channels", nargs="+", metavar="NAME", help="channels to use ($PnN or marker); default: all shared")
    group.add_argument("--no-compensation", action="store_true", help="ignore spillover matrices in the files")
    group.add_argument("--transform", action="append", metavar="CHANNEL=KIND", default=[],
                       help="set one channel's transform ($PnN or marker; repeatable): arcsinh[:COFACTOR], "
                            "linear[:SCALE], channel-scale (values 0-1023 used as they are) or logicle[:T]. "
                            "Default: arcsinh(x/5) on mass cytometers, arcsinh(x/150) on flow fluorescence, "
                            "scatter linear, and channels found already on a channel scale (whole numbers "
                            "0-1023) as they are; train prints what each channel got")
    group.add_argument("--no-selection", action="store_true", help="skip cross-validated model selection (heuristic bandwidths)")
    group.add_argument("--select-embedding-bandwidth", action="store_true",
                       help="also choose the embedding bandwidth sigma' by the cross-validation (default: the "
                            "median distance between cells)")
    group.add_argument("--features", type=int, default=512, help="random features D (default 512)")
    group.add_argument("--cells-per-patient", type=int, metavar="N",
                       help=f"training cells drawn per patient (default {DEFAULT_CELLS_PER_PATIENT:,}; "
                            f"{IW_CELLS_PER_PATIENT:,} for iw-nystroem)")
    group.add_argument("--class-balance", type=_class_balance, default=DEFAULT_CLASS_BALANCE, metavar="B",
                       help="how each patient's training cells are drawn: 0 uniformly, 1 the same number from every "
                            "population (as far as its cells go), in between shares proportional to count^(1-B) "
                            f"(default {DEFAULT_CLASS_BALANCE:g})")
    group.add_argument("--pooled-weight", type=_pooled_weight, default=DEFAULT_POOLED_WEIGHT, metavar="W",
                       help="weight of the pooled companion in the marginal method's probabilities, 0 to 1, or "
                            f"'auto' (chosen by cross-validation over groups; default {DEFAULT_POOLED_WEIGHT}; "
                            "0: the marginal model alone)")
    group.add_argument("--augment", type=int, default=0, metavar="N",
                       help="N copies of each training patient with a simulated instrument shift, added to "
                            "training (an option; default 0)")
    group.add_argument("--second-bandwidth", action="store_true",
                       help="also fit the marginal model at half the larger of the selected cell bandwidth and the "
                            "median distance between cells, gating with the mean of the two (an option)")
    group.add_argument("--self-training", action="store_true",
                       help="move each gated patient's gates towards its own confident cells, a self-training "
                            "step at gating time (an option)")
    group.add_argument("--adaptive-weight", type=_pooled_weight, default=DEFAULT_ADAPTIVE_WEIGHT, metavar="W",
                       help="share of each patient's own populations (Gaussians adapted to its cells by EM) in the "
                            "final probabilities, 0 to 1, or 'auto' (default: chosen by cross-validation over "
                            "groups; 0: the transfer model alone)")
    group.add_argument("--unknown-margin", type=_unknown_margin, default=UNKNOWN_MARGIN, metavar="M",
                       help="call a gated cell 'unknown' when it lies beyond every training population: its squared "
                            "distance to each exceeds M times that population's reach (the 99.9th percentile of its "
                            f"training cells'); larger calls fewer cells unknown, 'none' never (default {UNKNOWN_MARGIN:g})")
    group.add_argument("--align", choices=ALIGNMENTS, default="none",
                       help="register each channel of every patient before the kernel model sees it: quantile "
                            "(quantiles onto the training patients' mean) or landmarks (density peaks onto the "
                            "training patients' consensus peaks; a channel whose peaks do not match one-to-one "
                            "is left as it is); default none. Options: each lost on some data set "
                            "(docs/alignment.md)")
    group.add_argument("--patient-weighting", choices=("uniform", "agnostic"), default="uniform",
                       help="how training patients weigh in the objective: 'uniform' (every patient the same, the "
                            "default) or 'agnostic' (towards the worst mixture of training patients, by "
                            "exponentiated-gradient reweighting: the distributionally robust objective)")
    group.add_argument("--selection-objective", choices=("mean", "worst"), default="mean",
                       help="what model selection maximises over held-out groups: their mean accuracy (default) "
                            "or the worst group's")
    group.add_argument("--prior-shift", choices=("none", "em"), default="none",
                       help="'em': re-estimate each gated patient's population shares from its own cells (Saerens "
                            "et al. 2002) and adjust the probabilities to them (default: none)")
    group.add_argument("--seed", type=int, default=0, help="random seed (results are reproducible)")


def _pooled_weight(text):
    """An argparse type: 'auto' or a number within [0, 1] (a value already parsed passes)."""
    if text == "auto" or isinstance(text, float):
        return text
    try:
        weight = float(text)
    except ValueError:
        weight = float("nan")
    if not 0.0 <= weight <= 1.0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a number within [0, 1], got {text!r}")
    return weight


def _unknown_margin(text):
    """An argparse type: 'none' or a positive number (a value already parsed passes)."""
    if text is None or isinstance(text, float):
        return text
    if str(text).lower() == "none":
        return None
    try:
        margin = float(text)
    except ValueError:
        margin = float("nan")
    if not 0.0 < margin < 1e6:
        raise argparse.ArgumentTypeError(f"must be 'none' or a positive number, got {text!r}")
    return margin


def _unit_interval(zero_allowed: bool):
    """An argparse type: a number within [0, 1] (or (0, 1] when 0 is not allowed)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (0.0 <= value if zero_allowed else 0.0 < value) or not value <= 1.0:
            low = "[" if zero_allowed else "("
            raise argparse.ArgumentTypeError(f"must be a number within {low}0, 1], got {text!r}")
        return value
    return parse


_class_balance = _unit_interval(zero_allowed=True)
_task_similarity = _unit_interval(zero_allowed=False)


def _model_params(args) -> dict:
    params = {"compensate": not args.no_compensation, "select": not args.no_selection,
              "select_embedding_bandwidth": args.select_embedding_bandwidth,
              "n_features": args.features, "cells_per_patient": args.cells_per_patient or DEFAULT_CELLS_PER_PATIENT,
              "class_balance": args.class_balance, "random_state": args.seed}
    params["pooled_weight"] = _pooled_weight(args.pooled_weight)
    params["adaptive_weight"] = _pooled_weight(args.adaptive_weight)
    params["unknown_margin"] = _unknown_margin(args.unknown_margin)
    params["patient_weighting"] = args.patient_weighting
    params["selection_objective"] = args.selection_objective
    params["prior_shift"] = args.prior_shift
    if args.augment < 0 or args.augment > 64:
        raise SystemExit(_usage(f"--augment must be within 0..64, got {args.augment}"))
    # The research options are ResearchGatingModel's parameters: named only when asked for, so
    # that a model without them is a GatingModel (model.research.model_class).
    if args.augment:
        params["n_augment"] = args.augment
    if args.second_bandwidth:
        params["bandwidth_x_hedge"] = 0.5
    if args.self_training:
        params["self_training"] = True
    if args.align != "none":
        params["align"] = args.align
    if args.channels:
        params["channels"] = args.channels
    if args.transform:
        params["transform"] = _transform_overrides(args.transform)
    return params


def _transform_overrides(items) -> dict:
    """``--transform CHANNEL=KIND`` options as GatingModel's ``transform`` dict (usage errors exit 2)."""
    from gating_core.fcs.transforms import parse_transform_spec

    overrides = {}
    for item in items:
        name, sep, spec = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(_usage(f"--transform {item!r}: expected CHANNEL=KIND, e.g. FL1.LOG=channel-scale"))
        try:
            parse_transform_spec(spec)
        except ValueError as exc:
            raise SystemExit(_usage(f"--transform {name.strip()}: {exc}"))
        overrides[name.strip()] = spec.strip()
    return overrides


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
            errors.append(str(exc))
            continue
        samples.append(sample)
        labels.append(populations)
    _check_unique([s.name for s in samples], errors)
    return samples, labels, errors


def _check_unique(names, errors) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(f"the same patient name appears twice: {', '.join(duplicates)}")


def _fail(message: str) -> int:
    """A bad input file or folder, or work that failed: the message, exit status 1."""
    print_error(message)
    return 1


def _usage(message: str) -> int:
    """A command line that cannot be carried out as given (found before any file is read):
    the message, exit status 2, as argparse does for its own usage errors."""
    print_error(message)
    return 2


def _model_out_problem(out: Path) -> str | None:
    """Why ``train --out`` cannot be written (a folder, a missing parent folder), else None."""
    if out.is_dir():
        return f"{out}: --out names a folder; give the model file to write (e.g. {out / 'model.npz'})"
    if out.exists() and not out.is_file():
        return f"{out}: --out names something that is not a file"
    parent = Path(os.path.abspath(out)).parent
    if not parent.exists():
        return f"{out}: the folder {parent} does not exist"
    if not parent.is_dir():
        return f"{out}: {parent} is not a folder"
    return None


def run_train(args) -> int:
    from gating_core.model.research import build_model
    from gating_core.model.result import ChannelMismatchError
    from gating_core.progress import StageProgress

    problem = _model_out_problem(Path(args.out))
    if problem:  # before any input is read or any training starts
        return _fail(problem)
    if args.dica_components is not None and not args.dica:
        return _usage("--dica-components needs --dica supervised or --dica unsupervised")
    if args.dica_components is not None and not 1 <= args.dica_components <= 600:
        return _usage(f"--dica-components must be within [1, 600], got {args.dica_components}")
    dica = {"dica": args.dica, "dica_components": args.dica_components or 20} if args.dica else {}
    if args.method == IW_METHOD:
        if dica:
            return _usage("--dica is an option of the kernel methods, not of --method iw-nystroem")
        model = _iw_model(args)
        if isinstance(model, int):
            return model
        # what the cluster's digest needs; GatingModel draws the same cells from these
        digest_params = {k: getattr(model, k) for k in ("compensate", "cells_per_patient", "embedding_cells",
                                                         "random_state")}
        digest_params["class_balance"] = 0.0  # its draw is uniform
    else:
        params = {"method": args.method, "loss": args.loss, "task_similarity": args.task_similarity,
                  "kernel_x": args.kernel_x, **_model_params(args), **dica}
        # --augment, --second-bandwidth, --self-training: a ResearchGatingModel.
        model = build_model(params)
        digest_params = model.get_params()
    if args.workers or args.scheduler:
        from gating_core.batch.distributed import ClusterError, digest_files_distributed

        try:
            digests, errors = digest_files_distributed(args.inputs, digest_params, workers=args.workers,
                                                       scheduler=args.scheduler)
        except ClusterError as exc:
            return _fail(str(exc))
    else:
        from gating_core.batch.files import digest_file
        from gating_core.fcs import FCSError
        from gating_core.io.labels import LabelError

        digests, errors = [], []
        for i, path in enumerate(args.inputs):
            try:
                digests.append(digest_file(path, i, model))
            except (FCSError, LabelError, OSError, ValueError) as exc:
                errors.append(str(exc))
    if args.library:
        from gating_core.library import LibraryError, PatientLibrary

        from gating_core.library.digest_cache import library_digests

        # One patient's events in memory at a time; digests kept in the library, so a retrain
        # reads only the patients added or relabeled since the last one.
        try:
            library_part, cache = library_digests(PatientLibrary(args.library, create=False), model,
                                                  start=len(digests))
        except LibraryError as exc:
            errors.append(str(exc))
        else:
            digests += library_part
            print(f"Library: {cache.hits} patients from stored digests, {cache.misses} read")
    _check_unique([d.name for d in digests], errors)
    for message in errors:
        print_error(message)
    if errors:
        return 1
    if not digests:
        return _usage("no labeled patients given (INPUT files or --library)")
    out = Path(args.out)
    print(f"Training ({_method_label(args.method, args.loss, args.task_similarity)}) on {len(digests)} patients, {sum(d.n_events for d in digests):,} events")
    try:
        with StageProgress("train") as progress:
            model.fit_digests(digests, progress=progress)
    except (ChannelMismatchError, ValueError) as exc:
        return _fail(str(exc))
    model.save(out)
    info = model.describe()
    print(f"Method: {_method_label(info['method'], info['loss'], info['task_similarity'])}")
    print(f"Channels: {', '.join(info['channels'])}")
    from gating_core.fcs.transforms import ChannelTransform, describe_transform

    print("Transform: " + "; ".join(describe_transform(ChannelTransform.from_dict(info["transform"]),
                                                         info["channels"])))
    print(f"Populations: {', '.join(info['populations'])}")
    bandwidth_p = "-" if info["bandwidth_p"] is None else f"{info['bandwidth_p']:.4g}"
    if info.get("kernel_x") == "linear":  # no sigma_X (or sigma') to report
        print(f"Cell kernel: linear (embedding = mean cell), sigma_P = {bandwidth_p}, lambda = {info['alpha']:.1e}")
    else:
        print(f"sigma_X = {info['bandwidth_x']:.4g}, sigma_P = {bandwidth_p}, lambda = {info['alpha']:.1e}")
    if "bandwidth_embedding" in getattr(model, "selection_", {}):
        print(f"sigma' (embedding, selected) = {model.selection_['bandwidth_embedding']:.4g}")
    elif getattr(model, "select_embedding_bandwidth", False) and info["bandwidth_p"] is None:
        print("sigma' (embedding): not used (the model gates without the patient's embedding)")
    if info.get("class_balance"):
        print(f"Training cells: population-balanced draw (class_balance = {info['class_balance']:g})")
    if info["cv_accuracy"] is not None:
        print(f"Cross-validated accuracy over patients: {info['cv_accuracy']:.4f}")
    if getattr(model, "align", "none") == "landmarks":
        print("Alignment: landmarks (each channel's density peaks onto the training patients' consensus peaks; "
              "a channel whose peaks do not match one-to-one is left as it is)")
    elif getattr(model, "align", "none") == "quantile":
        print("Alignment: quantile (each channel's quantiles onto the training patients' mean)")
    if info.get("self_training"):
        print("Gating: each patient's gates follow its own confident cells (self-training)")
    chosen = getattr(model, "selection_", {}).get("adaptive_weight", {})
    if info.get("adaptive_weight"):
        how = ("chosen by cross-validation over groups" if chosen.get("folds") else
               chosen.get("reason", "as set")).rstrip(".")
        print(f"Adapted populations: weight {info['adaptive_weight']:g} ({how}; each patient's populations are "
              "refitted to its own cells by EM; --adaptive-weight 0 turns them off)")
    if info.get("unknown_margin") is not None:
        print(f"Unknown cells: a gated cell beyond every population ({info['unknown_margin']:g} x its reach) is "
              "called 'unknown' (--unknown-margin none turns this off)")
    if args.method == IW_METHOD:
        print(f"Kept {info['training_cells']:,} training cells and {info['n_landmarks']} landmarks per refit: "
              "`gate` refits the model for each new patient")
    print(f"Model written to {out}")
    return 0


def _iw_model(args):
    """The IWNystroemGatingModel of ``train --method iw-nystroem``, or an exit status when an
    option of the kernel models was asked of it."""
    from gating_core.model.iw_model import IWNystroemGatingModel

    for flag, given in (("--loss", args.loss != DEFAULT_LOSS), ("--pooled-weight", args.pooled_weight != DEFAULT_POOLED_WEIGHT),
                        ("--task-similarity", args.task_similarity != DEFAULT_TASK_SIMILARITY),
                        ("--kernel-x", args.kernel_x != "gaussian"),
                        ("--class-balance", args.class_balance != DEFAULT_CLASS_BALANCE),
                        ("--select-embedding-bandwidth", args.select_embedding_bandwidth),
                        ("--augment", args.augment != 0),
                        ("--second-bandwidth", args.second_bandwidth),
                        ("--self-training", args.self_training),
                        ("--adaptive-weight", args.adaptive_weight != DEFAULT_ADAPTIVE_WEIGHT),
                        ("--unknown-margin", args.unknown_margin != UNKNOWN_MARGIN),
                        ("--align", args.align != "none")):
        if given:
            return _usage(f"{flag} does not apply to --method {IW_METHOD} (a squared-loss KRR refitted per patient)")
    if args.landmarks < 1:
        return _usage(f"--landmarks must be a positive number, got {args.landmarks}")
    return IWNystroemGatingModel(channels=args.channels or None, compensate=not args.no_compensation,
                                 cells_per_patient=args.cells_per_patient or IW_CELLS_PER_PATIENT,
                                 n_landmarks=args.landmarks, random_state=args.seed)


def _method_label(method: str, loss: str, task_similarity: float) -> str:
    """``marginal``, ``marginal, hinge loss``, ``multitask tau=0.01``: what ``train`` fits."""
    label = f"multitask tau={task_similarity:g}" if method == "multitask" else method
    return label if loss == DEFAULT_LOSS else f"{label}, {loss} loss"


def run_gate(args) -> int:
    from gating_core.batch.files import output_name_clashes
    from gating_core.library.privacy import dropped_note
    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.iw_model import IW_METHOD as iw_method, load_any_model

    # Two inputs whose patients map to one output name (the same stem from different folders,
    # names differing only in case or in characters a file name cannot hold, a data set of a
    # multi-data-set file) would overwrite each other's output: refused before anything is
    # gated, so an output file is always the patient its name says.
    clashes = output_name_clashes(args.fcs, args.format)
    if clashes:
        return _usage(f"these inputs would write the same gated {args.format.upper()}; rename one or gate "
                      "them into separate folders: " + "; ".join(" and ".join(c) for c in clashes))
    if (args.include_identifying or args.keep_keywords) and args.format not in ("fcs", "h5ad"):
        return _usage("--include-identifying and --keep-keyword apply to --format fcs and h5ad: "
                      f"a gated {'CSV' if args.format == 'csv' else 'Parquet'} file carries no keywords")
    if args.format == "h5ad":
        try:
            import anndata  # noqa: F401
        except ImportError:
            return _usage("--format h5ad needs the anndata package: pip install 'gating-core[anndata]'")
    try:
        model = load_any_model(args.model)
    except ModelFileError as exc:
        return _fail(str(exc))
    transductive = model.method == iw_method
    if args.method == IW_METHOD and not transductive:
        return _fail(f"{args.model}: not an {IW_METHOD} model (it holds a {model.method} model); "
                     f"train one with `train --method {IW_METHOD}`")
    if transductive and (args.workers or args.scheduler):
        return _fail(f"{args.model}: an {IW_METHOD} model refits for each patient and gates on this machine; "
                     "drop --workers / --scheduler")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.workers or args.scheduler:
        from gating_core.batch.distributed import ClusterError, gate_files_distributed

        try:
            records = gate_files_distributed(args.model, args.fcs, out_dir, workers=args.workers,
                                             scheduler=args.scheduler, chunk_size=args.chunk_size,
                                             format=args.format, include_identifying=args.include_identifying,
                                             keep_keywords=args.keep_keywords)
        except ClusterError as exc:
            return _fail(str(exc))
    else:
        from gating_core.batch.files import gate_file

        records = []
        iterator = args.fcs
        if sys.stderr.isatty() and len(args.fcs) > 1:
            from tqdm import tqdm

            iterator = tqdm(args.fcs, desc="gate", unit="file", file=sys.stderr, leave=False)
        for path in iterator:
            records.extend(gate_file(model, path, out_dir, chunk_size=args.chunk_size, format=args.format,
                                     include_identifying=args.include_identifying, keep_keywords=args.keep_keywords))
    failed = sum("error" in record for record in records)
    if args.json:
        print_json(records)
        return 1 if failed else 0
    for record in records:
        if "error" in record:
            print_error(record["error"])
            continue
        counts = ", ".join(f"{name} {count:,}" for name, count in record["counts"].items())
        print(f"{record['patient']}: {record['events']:,} events -> {record['output']}")
        print(f"  {counts}")
        if "fit_seconds" in record:
            print(f"  {IW_METHOD} refit for this patient: {record['fit_seconds']:.1f} s")
        novelty = record["novelty"]
        prefix = "  WARNING: " if novelty["is_novel"] else "  "
        print(prefix + novelty["message"])
        if record.get("dropped_keywords"):
            print("  " + dropped_note(record["dropped_keywords"]))
    return 1 if failed else 0


def _evaluation_groups(args, samples, labels):
    """(groups, how they were found) for ``evaluate``."""
    from gating_core.evaluation.protocols import infer_patient_groups
    from gating_core.method.groups import groups_from_csv, groups_from_keyword

    if args.groups:
        if Path(args.groups).is_file():
            return groups_from_csv(args.groups, [s.name for s in samples]), f"from {Path(args.groups).name}"
        return groups_from_keyword(samples, args.groups), f"from the keyword {args.groups}"
    return infer_patient_groups(samples, labels), "inferred (near-duplicate patients kept together)"


def run_evaluate(args) -> int:
    import pandas as pd

    from gating_core.evaluation.protocols import (leave_one_group_out, leave_one_patient_out, novelty_curve,
                                                  patient_folds, repeat_over_seeds, summarize, summarize_seeds,
                                                  train_on_one_group)
    from gating_core.method.groups import GroupsError
    from gating_core.model.result import ChannelMismatchError
    from gating_core.progress import StageProgress

    samples, labels, errors = _load_inputs(args.inputs, not args.no_compensation)
    for message in errors:
        print_error(message)
    if errors:
        return 1
    if len(samples) < 3:
        return _usage("leave-one-patient-out needs at least three labeled patients")
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
        return _fail(str(exc))
    distinct = sorted(set(groups))
    singletons = len(distinct) == len(samples)
    if args.protocol in ("group", "one-group") and len(distinct) < 2:
        return _fail(f"leaving a group out or training on one needs two or more groups; groups {origin}: {distinct}")
    seeds = sorted(set(args.seeds)) if args.seeds else None

    def protocols(model_params, progress):
        tables = []
        if args.protocol in ("both", "group") and len(distinct) >= 2 and not (singletons and args.protocol == "both"):
            tables.append(leave_one_group_out(samples, labels, groups, methods=args.method, model_params=model_params,
                                              progress=progress, refit=args.refit or "full"))
        if args.protocol in ("both", "patient"):
            tables.append(leave_one_patient_out(samples, labels, methods=args.method, model_params=model_params,
                                                progress=progress, groups=groups, refit=patient_refit))
        if args.protocol == "one-group":
            tables.append(train_on_one_group(samples, labels, groups, methods=args.method, model_params=model_params,
                                             progress=progress))
        if args.protocol == "folds":
            tables.append(patient_folds(samples, labels, args.folds, methods=args.method, model_params=model_params,
                                        progress=progress, groups=groups, seed=model_params.get("random_state", 0)))
        return pd.concat(tables, ignore_index=True)

    try:
        with StageProgress("evaluate") as progress:
            table = (protocols(params, progress) if seeds is None else
                     repeat_over_seeds(lambda p: protocols(p, progress), seeds, params))
    except (ChannelMismatchError, ValueError) as exc:
        return _fail(str(exc))
    summary = summarize(table)
    over_seeds = None if seeds is None else summarize_seeds(table)
    curve = novelty_curve(table) if "marginal" in args.method else None
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.json:
        document = {"groups": dict(zip([s.name for s in samples], groups)), "groups_origin": origin,
                    "patients": table.to_dict(orient="records"), "summary": summary.to_dict(orient="records"),
                    "summary_over_seeds": [] if over_seeds is None else over_seeds.to_dict(orient="records"),
                    "novelty_curve": [] if curve is None else curve.astype({"novelty_bin": str}).to_dict(orient="records")}
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
                         + (["unknown"] if part["unknown"].any() else []) + f1_columns
                         ].rename(columns={c: c[3:] for c in f1_columns})
            print(shown.to_string(index=False))
        print()
        print("Summary (mean and worst patient, per protocol" + (" and seed)" if seeds else ")"))
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
    return 0

