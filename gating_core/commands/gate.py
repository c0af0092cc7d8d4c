"""``gate``: new patients gated with a trained model, one output file per patient (CSV, Parquet,
FCS or h5ad), here or on a Dask cluster; its options and checks."""

from __future__ import annotations

import sys
from pathlib import Path

from gating_core.commands import DEFAULT_KEYWORDS_HELP, add_keyword_options, positive_int, print_json
from gating_core.commands.model_options import IW_METHOD, _cluster_options, _fail, _usage, writable_folder_problem
from gating_core.errors import describe_error, print_error
from gating_core.model.result import GATING_PARTS, PART_TITLES, review_order, review_reasons


def register(subparsers) -> None:
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
    gate.add_argument("--chunk-size", type=positive_int, default=50_000,
                      help="events read, gated and written at a time (CSV and Parquet stream the file: bounds memory)")
    _cluster_options(gate, "gate files in parallel")
    gate.add_argument("--format", choices=("csv", "parquet", "fcs", "h5ad"), default="csv",
                      help="output per patient: gated CSV (default), Parquet (same columns, typed), FCS with a "
                           "population channel, or AnnData .h5ad (needs the anndata package). CSV and Parquet "
                           "carry no keywords; FCS and h5ad keep " + DEFAULT_KEYWORDS_HELP)
    add_keyword_options(gate, "an FCS or h5ad output")
    gate.add_argument("--part", choices=GATING_PARTS,
                      help="gate with one part of the model alone: its transfer model (the training patients' "
                           "boundaries, extrapolated) or the patient's own populations (its clusters, adapted by "
                           "EM). Where the two disagree a patient is flagged for review and either may be the "
                           "right one; written as <stem>.<part>.gated.csv beside the model's own gating "
                           "(<stem>.gated.csv, the default, which mixes them)")
    gate.add_argument("--json", action="store_true",
                      help="print one JSON document (a list, one record per patient) instead of text")
    gate.add_argument("fcs", nargs="+", metavar="FCS")
    gate.set_defaults(func=run_gate)


def run_gate(args) -> int:
    from gating_core.batch.files import output_name_clashes
    from gating_core.library.privacy import dropped_note
    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.iw_model import IW_METHOD as iw_method, load_any_model

    # Two inputs whose patients map to one output name (the same stem from different folders,
    # names differing only in case or in characters a file name cannot hold, a data set of a
    # multi-data-set file) would overwrite each other's output: refused before anything is
    # gated, so an output file is always the patient its name says.
    clashes = output_name_clashes(args.fcs, args.format, args.part)
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
        return _fail(describe_error(exc))
    transductive = model.method == iw_method
    if args.method == IW_METHOD and not transductive:
        return _fail(f"{args.model}: not an {IW_METHOD} model (it holds a {model.method} model); "
                     f"train one with `train --method {IW_METHOD}`")
    if transductive and (args.workers or args.scheduler):
        return _fail(f"{args.model}: an {IW_METHOD} model refits for each patient and gates on this machine; "
                     "drop --workers / --scheduler")
    if args.part is not None and args.part not in model.gating_parts():
        return _fail(f"{args.model}: this model does not mix a transfer model with the patients' own populations, "
                     f"so it has no part to gate with alone; drop --part {args.part}")
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        return _fail(f"{out_dir}: --out-dir names a file, not a folder")
    created = not out_dir.exists()  # removed again if every patient fails
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _fail(f"{out_dir}: cannot create the output folder ({exc.strerror or exc})")
    problem = writable_folder_problem(out_dir, f"{out_dir}: ")
    if problem:
        return _fail(problem)
    if args.workers or args.scheduler:
        from gating_core.batch.distributed import ClusterError, gate_files_distributed

        try:
            records = gate_files_distributed(args.model, args.fcs, out_dir, workers=args.workers,
                                             scheduler=args.scheduler, chunk_size=args.chunk_size,
                                             format=args.format, include_identifying=args.include_identifying,
                                             keep_keywords=args.keep_keywords, part=args.part)
        except ClusterError as exc:
            return _fail(describe_error(exc))
    else:
        from gating_core.batch.files import gate_file

        records = []
        iterator = args.fcs
        if sys.stderr.isatty() and len(args.fcs) > 1:
            from tqdm import tqdm

            iterator = tqdm(args.fcs, desc="gate", unit="file", file=sys.stderr, leave=False)
        for path in iterator:
            records.extend(gate_file(model, path, out_dir, chunk_size=args.chunk_size, format=args.format,
                                     include_identifying=args.include_identifying, keep_keywords=args.keep_keywords,
                                     part=args.part))
    failed = sum("error" in record for record in records)
    if created and not any(out_dir.iterdir()):
        try:
            out_dir.rmdir()
        except OSError:  # another run wrote into it meanwhile: it stays
            pass
    if args.json:
        print_json(records)
        return 1 if failed else 0
    for record in records:
        if "error" in record:
            print_error(record["error"])
            continue
        counts = ", ".join(f"{name} {count:,}" for name, count in record["counts"].items())
        gated_by = f" (gated by {PART_TITLES[record['part']]})" if record.get("part") else ""
        print(f"{record['patient']}: {record['events']:,} events -> {record['output']}{gated_by}")
        print(f"  {counts}")
        if "fit_seconds" in record:
            print(f"  {IW_METHOD} refit for this patient: {record['fit_seconds']:.1f} s")
        novelty = record["novelty"]
        prefix = "  WARNING: " if review_reasons(novelty) else "  "
        print(prefix + novelty["message"])
        if record.get("dropped_keywords"):
            print("  " + dropped_note(record["dropped_keywords"]))
    review = patients_to_review([r for r in records if "error" not in r])
    if len(records) > 1 and review:
        print(f"Review first ({len(review)} of {len(records) - failed} gated): " + "; ".join(review))
    return 1 if failed else 0


def patients_to_review(records) -> list[str]:
    """The gated patients of ``records`` flagged for review, in the order to review them
    (:func:`~gating_core.model.result.review_order`), each with why."""
    novelties = {record["patient"]: record["novelty"] for record in records}
    flagged = []
    for patient in review_order(novelties):
        why = review_reasons(novelties[patient])
        if why:
            flagged.append(f"{patient} ({', '.join(why)})")
    return flagged
