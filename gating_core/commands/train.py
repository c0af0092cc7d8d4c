"""``train``: a gating model learnt from labeled patients (INPUT files, a patient library, or
both, digested here or on a Dask cluster) and written to ``--out``; its options and checks."""

from __future__ import annotations

import os
from pathlib import Path

from gating_core.commands.model_options import (DEFAULT_ADAPTIVE_WEIGHT, DEFAULT_CLASS_BALANCE, DEFAULT_POOLED_WEIGHT,
                                                IW_CELLS_PER_PATIENT, IW_METHOD, UNKNOWN_MARGIN, _check_unique,
                                                _cluster_options, _fail, _model_options, _model_params,
                                                _unit_interval, _usage, writable_folder_problem)
from gating_core.errors import describe_error, print_error

# Kept here rather than imported so that the command line starts without numpy and scikit-learn:
# the choices of ``train`` (gating_core.model.estimator.METHODS and gating_core.method.classifier.LOSSES,
# checked by tests/test_train_choices.py).
TRAIN_METHODS = ("marginal", "pooling", "multitask")
LOSSES = ("squared", "logistic", "hinge")
DEFAULT_LOSS = "squared"
DEFAULT_TASK_SIMILARITY = 0.5
# gating_core.method.features.KERNELS_X (checked by tests/test_linear_kernel.py).
KERNELS_X = ("gaussian", "linear")

_task_similarity = _unit_interval(zero_allowed=False)


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
    return writable_folder_problem(parent, f"{out}: ")


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
            return _fail(describe_error(exc))
    else:
        from gating_core.batch.files import digest_file
        from gating_core.fcs import FCSError
        from gating_core.io.labels import LabelError

        digests, errors = [], []
        for i, path in enumerate(args.inputs):
            try:
                digests.append(digest_file(path, i, model))
            except (FCSError, LabelError, OSError, ValueError) as exc:
                errors.append(describe_error(exc))
    if args.library:
        from gating_core.library import LibraryError, PatientLibrary

        from gating_core.library.digest_cache import library_digests

        # One patient's events in memory at a time; digests kept in the library, so a retrain
        # reads only the patients added or relabeled since the last one.
        try:
            library = PatientLibrary(args.library, create=False)
            library_part, cache = library_digests(library, model, start=len(digests))
            trained = {d.name for d in library_part}
            unlabeled = [name for name in library.patient_names() if name not in trained]
        except LibraryError as exc:
            errors.append(describe_error(exc))
        else:
            digests += library_part
            left_out = ""
            if unlabeled:
                shown = ", ".join(unlabeled[:5]) + (", ..." if len(unlabeled) > 5 else "")
                left_out = f"; {len(unlabeled)} without labels left out ({shown})"
            print(f"Library: {cache.hits} patients from stored digests, {cache.misses} read{left_out}")
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
        return _fail(describe_error(exc))
    model.save(out)
    info = model.describe()
    print(f"Method: {_method_label(info['method'], info['loss'], info['task_similarity'])}")
    print(f"Channels: {', '.join(info['channels'])}")
    from gating_core.fcs.transforms import ChannelTransform, describe_transform

    print("Transform: " + "; ".join(describe_transform(ChannelTransform.from_dict(info["transform"]),
                                                         info["channels"])))
    print(f"Populations: {', '.join(info['populations'])}")
    bandwidth_p = "-" if info["bandwidth_p"] is None else f"{info['bandwidth_p']:.4g}"
    if info["bandwidth_p"] is None and info["method"] == "marginal":
        # Selection scored the patients' cells pooled above every use of their embedding.
        bandwidth_p = "none (the patient's embedding did not help in selection: its cells are pooled)"
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
    from gating_core.model.summary import (adapted_populations_text, few_events_note, few_patients_note,
                                          mismatched_labels_notes, pooled_trees_text, saturated_note,
                                          similar_names_note, unknown_cells_text, unknown_name_note)

    adapted, unknown, trees = adapted_populations_text(model), unknown_cells_text(model), pooled_trees_text(model)
    if adapted:
        print(f"Adapted populations: {adapted}"
              + ("" if adapted.startswith("off") else " (--adaptive-weight 0 turns them off)"))
    if trees:
        print(f"Pooled trees: {trees}")
    if unknown:
        print(f"Unknown cells: {unknown} (--unknown-margin none turns this off)")
    if args.method == IW_METHOD:
        print(f"Kept {info['training_cells']:,} training cells and {info['n_landmarks']} landmarks per refit: "
              "`gate` refits the model for each new patient")
    from gating_core.io.inputs import labelled_data_sets_note

    names = [d.name for d in digests]
    notes = (few_patients_note(model), unknown_name_note(model), similar_names_note(model), saturated_note(model),
             few_events_note(names, [d.n_events for d in digests]),
             *mismatched_labels_notes(names, [d.train_labels for d in digests]),
             *map(labelled_data_sets_note, args.inputs))
    for note in notes:
        if note:
            print(f"Note: {note}")
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
                        ("--transfer-start", args.transfer_start),
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
