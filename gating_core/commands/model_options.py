"""What ``train``, ``gate`` and ``evaluate`` share: the model options and their argparse types,
the model's parameters built from them, the Dask cluster options, and the exit statuses of a
bad input (1) and of a command line that cannot be carried out (2).
"""

from __future__ import annotations

import argparse

from gating_core.errors import print_error
from gating_core.commands import positive_int

# Kept here rather than imported so that the command line starts without numpy and scikit-learn;
# tests check each against the library's: gating_core.method.alignment.ALIGNMENTS
# (tests/test_landmark_alignment.py), gating_core.model.estimator.DEFAULT_POOLED_WEIGHT and
# DEFAULT_ADAPTIVE_WEIGHT (tests/test_transfer.py) and DEFAULT_CLASS_BALANCE (tests/test_class_balance.py),
# gating_core.method.unknown_cells.UNKNOWN_MARGIN (tests/test_unknown_cells.py).
ALIGNMENTS = ("none", "quantile", "landmarks")
DEFAULT_POOLED_WEIGHT = 0.5
DEFAULT_ADAPTIVE_WEIGHT = "auto"
DEFAULT_CLASS_BALANCE = 0.0
UNKNOWN_MARGIN = 3.0
# Importance-weighted Nystroem KRR (gating_core.model.iw_model): transductive, refitted for each
# patient at gate time, so its model file keeps training cells (2,000 per patient by default).
IW_METHOD = "iw-nystroem"
DEFAULT_CELLS_PER_PATIENT = 4000
IW_CELLS_PER_PATIENT = 2000


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
    group.add_argument("--features", type=positive_int, default=512, help="random features D (default 512)")
    group.add_argument("--cells-per-patient", type=positive_int, metavar="N",
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
    group.add_argument("--transfer-start", action="store_true",
                       help="with --adaptive-weight auto, also let each patient's EM start from the transfer "
                            "model's posteriors when the held-out groups say that gates better (an option)")
    group.add_argument("--adaptive-weight", type=_pooled_weight, default=DEFAULT_ADAPTIVE_WEIGHT, metavar="W",
                       help="share of each patient's own populations (two Gaussian fits adapted to its cells by "
                            "EM: one covariance shared by all populations, and each population's own shape) in the "
                            "final probabilities, 0 to 1, or 'auto' (default: 2/3, the transfer model and the two "
                            "fits a third each, unless cross-validation over groups finds it clearly worse; 0: the "
                            "transfer model alone)")
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


def _model_params(args) -> dict:
    cells_per_patient = DEFAULT_CELLS_PER_PATIENT if args.cells_per_patient is None else args.cells_per_patient
    params = {"compensate": not args.no_compensation, "select": not args.no_selection,
              "select_embedding_bandwidth": args.select_embedding_bandwidth,
              "n_features": args.features, "cells_per_patient": cells_per_patient,
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
    if args.transfer_start:
        if params["adaptive_weight"] != "auto":
            raise SystemExit(_usage("--transfer-start is scored by the cross-validation of --adaptive-weight auto: "
                                    "give both"))
        params["transfer_start"] = True
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


def _check_unique(names, errors) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(f"the same patient name appears twice: {', '.join(duplicates)}")


def _fail(message: str) -> int:
    """A bad input file or folder, or work that failed: the message, exit status 1."""
    print_error(message)
    return 1


def writable_folder_problem(folder, prefix: str = "") -> str | None:
    """Why files cannot be written into the existing ``folder`` (tried with a file of our own,
    removed at once: permissions, a read-only or virtual file system), else None."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gating-write-check-"):
            pass
    except OSError as exc:
        return f"{prefix}cannot write into the folder {folder} ({exc.strerror or exc})"
    return None


def _usage(message: str) -> int:
    """A command line that cannot be carried out as given (found before any file is read):
    the message, exit status 2, as argparse does for its own usage errors."""
    print_error(message)
    return 2
