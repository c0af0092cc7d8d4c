"""``python -m gating_core library [--path DIR] ACTION ...``: the patient library from the shell.

Actions: ``import FILE...``, ``list [--json]``, ``show PATIENT [--json]``,
``export PATIENT --out F [--include-identifying] [--keep-keyword NAME]``,
``export-gates PATIENT --out F.xml|F.wsp``,
``remove PATIENT``, ``models [--json]``,
``audit [--patient P] [--json]``, ``check``.
"""

from __future__ import annotations

import argparse
import json
import sys

from gating_core.commands import DEFAULT_KEYWORDS_HELP, add_keyword_options, print_json
from gating_core.errors import print_error


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "library", help="the patient library: import, list, export and remove patients",
        description="Manage the patient library (default ./workspace, or $GATING_LIBRARY).")
    parser.add_argument("--path", metavar="DIR", default=None,
                        help="library folder (default: $GATING_LIBRARY, else ./workspace)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    # --path is also accepted after the action ("library import --path DIR F"); SUPPRESS keeps
    # the value given before the action when it is not repeated.
    path_after = argparse.ArgumentParser(add_help=False)
    path_after.add_argument("--path", metavar="DIR", default=argparse.SUPPRESS, help="library folder")

    p = actions.add_parser("import", parents=[path_after], help="add patients: FCS (+ <stem>.labels.csv beside it), gated CSV, "
                                          "or FCS alone for a new unlabeled patient")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--name", help="patient name (one file only; default: the file stem)")
    p.set_defaults(func=_import)

    p = actions.add_parser("list", parents=[path_after], help="list the patients")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_list)

    p = actions.add_parser("show", parents=[path_after], help="one patient's details and label history")
    p.add_argument("patient")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_show)

    p = actions.add_parser("export", parents=[path_after],
                           help="write a patient as gated CSV, FCS, Parquet or h5ad, by --out's suffix",
                           description="Write a patient in the format of --out's suffix: .csv (gated CSV, no "
                                       "keywords), .fcs, .parquet (the gated CSV's columns, typed, no keywords) or "
                                       ".h5ad (AnnData); an FCS or h5ad export keeps " + DEFAULT_KEYWORDS_HELP + ".")
    p.add_argument("patient")
    p.add_argument("--out", required=True, metavar="FILE", help="F.csv, F.fcs, F.parquet or F.h5ad")
    add_keyword_options(p, "an FCS or h5ad export")
    p.set_defaults(func=_export)

    p = actions.add_parser("export-gates", parents=[path_after],
                           help="write the gates drawn on a patient as GatingML 2.0 (--out F.xml) or as a FlowJo "
                                "workspace (--out F.wsp)")
    p.add_argument("patient")
    p.add_argument("--out", required=True, metavar="FILE", help="F.xml (GatingML 2.0) or F.wsp (FlowJo 10)")
    add_keyword_options(p, "a FlowJo workspace")
    p.set_defaults(func=_export_gates)

    p = actions.add_parser("remove", parents=[path_after], help="remove a patient (its audit entries stay)")
    p.add_argument("patient")
    p.set_defaults(func=_remove)

    p = actions.add_parser("models", parents=[path_after], help="list the stored models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_models)

    p = actions.add_parser("audit", parents=[path_after], help="print the audit log")
    p.add_argument("--patient")
    p.add_argument("--limit", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_audit)

    p = actions.add_parser("check", parents=[path_after], help="verify catalog and files against each other")
    p.set_defaults(func=_check)


def _open(args, create: bool = False):
    """Open the library; only ``import`` may create a new one (a typo in --path should not)."""
    from gating_core.library import PatientLibrary

    return PatientLibrary(args.path, create=create)


def _guard(action):
    """Run an action, turning LibraryError into a one-line message and exit code 1."""
    from gating_core.library import LibraryError

    def run(args) -> int:
        try:
            return action(args)
        except LibraryError as exc:
            print_error(exc)
            return 1

    return run


@_guard
def _import(args) -> int:
    library = _open(args, create=True)
    names = library.import_files(args.files, name=args.name)
    for name in names:
        info = library.patient(name)
        labels = f"{len(info.populations)} populations ({info.label_provenance})" if info.labeled else "unlabeled"
        print(f"imported {name}: {info.n_events} events x {info.n_channels} channels, {labels}")
    print(f"{len(names)} patient(s) added to {library.path}")
    added = set(names)
    for group in library.same_events():
        if added & set(group):
            print(f"warning: {', '.join(group)} hold exactly the same events (the same file under several "
                  "names?); training on them, or counting them in a batch's statistics, counts that patient "
                  "more than once", file=sys.stderr)
    return 0


@_guard
def _list(args) -> int:
    library = _open(args)
    patients = library.patients()
    if args.json:
        print_json([p.to_dict() for p in patients])
        return 0
    if not patients:
        print(f"no patients in {library.path}")
        return 0
    rows = [("patient", "events", "channels", "labels", "populations", "added")]
    for p in patients:
        rows.append((p.name, str(p.n_events), str(p.n_channels), p.label_provenance or "unlabeled",
                     str(len(p.populations)) if p.labeled else "-", p.created_at[:19].replace("T", " ")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


@_guard
def _show(args) -> int:
    library = _open(args)
    info = library.patient(args.patient).to_dict()
    info["label_history"] = library.label_history(args.patient)
    if args.json:
        print_json(info)
        return 0
    for key in ("name", "n_events", "n_channels", "dtype", "compensated", "has_spillover", "created_at"):
        print(f"{key}: {info[key]}")
    print("channels: " + ", ".join(f"{n} ({m})" if m else n for n, m in zip(info["channels"], info["markers"])))
    for source in info["sources"]:
        print(f"source ({source['role']}): {source['path']}")
    if info["populations"]:
        print("populations: " + ", ".join(f"{k} {v}" for k, v in info["populations"].items()))
    for lab in info["label_history"]:
        mark = "*" if lab["current"] else " "
        model = f", model {lab['model_id']}" if lab["model_id"] else ""
        print(f"{mark} labels {lab['id']}: {lab['provenance']}{model} ({lab['created_at'][:19]})")
    return 0


@_guard
def _export(args) -> int:
    from pathlib import Path

    from gating_core.library.privacy import dropped_note

    is_fcs = Path(args.out).suffix.lower() == ".fcs"
    if (args.include_identifying or args.keep_keywords) and Path(args.out).suffix.lower() not in (".fcs", ".h5ad"):
        print_error("--include-identifying and --keep-keyword apply to an FCS or h5ad export (--out F.fcs, "
                    "F.h5ad): a gated CSV or Parquet file carries no keywords")
        return 2
    library = _open(args)
    out = library.export_patient(args.patient, args.out, include_identifying=args.include_identifying,
                                 keep_keywords=args.keep_keywords)
    print(f"wrote {out}")
    if is_fcs:
        # the count export_patient recorded in the audit log (and wrote into the file)
        [entry] = library.audit_log(args.patient, limit=1)
        if entry["details"].get("dropped_keywords"):
            print("  " + dropped_note(entry["details"]["dropped_keywords"]))
    return 0


@_guard
def _export_gates(args) -> int:
    from pathlib import Path

    from gating_core.gates import GateError, GateTree
    from gating_core.gates.export import export_flowjo_workspace, export_gatingml

    out = Path(args.out)
    if out.suffix.lower() not in (".xml", ".wsp"):
        print_error(f"{out.name}: --out must end in .xml (GatingML 2.0) or .wsp (FlowJo workspace)")
        return 2
    library = _open(args)
    stored = library.load_gates(args.patient)
    if not stored:
        print_error(f"{args.patient}: no gates drawn on this patient")
        return 1
    # The app draws and applies gates on the compensated events; the file describes those.
    sample = library.load_sample(args.patient, compensate=True)
    try:
        tree = GateTree.from_dict(stored)
        if out.suffix.lower() == ".wsp":
            export_flowjo_workspace(tree, out, [sample], include_identifying=args.include_identifying,
                                    keep_keywords=args.keep_keywords)
        else:
            export_gatingml(tree, out, sample)
    except GateError as exc:
        print_error(f"{args.patient}: {exc}")
        return 1
    print(f"wrote {len(tree)} gate(s) of {args.patient} to {out}")
    if out.suffix.lower() == ".wsp":
        from gating_core.io.export import dropped_keyword_count
        from gating_core.library.privacy import dropped_note

        dropped = dropped_keyword_count(sample, include_identifying=args.include_identifying,
                                        keep_keywords=args.keep_keywords)
        if dropped:
            print("  " + dropped_note(dropped))
    return 0


@_guard
def _remove(args) -> int:
    library = _open(args)
    library.remove_patient(args.patient)
    print(f"removed {args.patient}")
    return 0


@_guard
def _models(args) -> int:
    library = _open(args)
    models = library.models()
    if args.json:
        print_json([m.to_dict() for m in models])
        return 0
    if not models:
        print(f"no models in {library.path}")
    for m in models:
        print(f"{m.id}  {m.name} v{m.version}  {m.method or ''}  trained on {len(m.training_patients)} patient(s)"
              f"  {m.created_at[:19].replace('T', ' ')}")
    return 0


@_guard
def _audit(args) -> int:
    library = _open(args)
    entries = library.audit_log(args.patient, limit=args.limit)
    if args.json:
        print_json(entries)
        return 0
    for e in entries:
        who = f" {e['patient']}" if e["patient"] else ""
        model = f" model={e['model_id']}" if e["model_id"] else ""
        print(f"{e['at'][:19].replace('T', ' ')}  {e['action']}{who}{model}  {json.dumps(e['details'])}")
    return 0


@_guard
def _check(args) -> int:
    library = _open(args)
    problems = library.check()
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in {library.path}", file=sys.stderr)
        return 1
    print(f"{library.path}: {len(library)} patient(s), catalog and files consistent")
    return 0

