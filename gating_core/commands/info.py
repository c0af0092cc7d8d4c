"""``python -m gating_core info FILE...``: what each FCS file holds, without reading its events.

Per file: FCS version, data sets, events, channels ($PnN / $PnS, with $PnR, $PnE and $PnG as the
file states them), spillover. The events are not read, so a channel whose values are already on
a channel scale (0-1023 under a meaningless $PnR) is found by ``train`` and the app, not here.
``--json`` prints
one JSON document (a list, one entry per file; unreadable files carry ``"error"``, and so do the
unreadable data sets of a file whose other data sets are readable). A file that
cannot be read gets its message on stderr and the exit status becomes 1; the other files are
still reported.
"""

from __future__ import annotations

from . import print_json
from ..errors import describe_error, print_error
from ..fcs import FCSError, fcs_info


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "info", help="describe FCS files (version, data sets, events, channels, spillover)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("files", nargs="+", metavar="FILE", help="FCS files")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=run)


def _describe(info: dict) -> str:
    lines = [info["file"], f"  FCS version: {info['version']}", f"  data sets: {info['n_datasets']}"]
    for ds in info["datasets"]:
        indent = "  "
        if info["n_datasets"] > 1:
            lines.append(f"  [{ds['name']}]")
            indent = "    "
        if "error" in ds:  # a data set that cannot be read next to others that can
            lines.append(f"{indent}not readable: {ds['error']}")
            lines.extend(f"{indent}note: {note}" for note in ds["notes"])
            continue
        lines.append(f"{indent}events: {ds['events']}")
        lines.append(f"{indent}channels: {ds['n_channels']}")
        width = max(len(c["pnn"]) for c in ds["channels"])
        markers = [c["pns"] if c["pns"] and c["pns"] != c["pnn"] else "" for c in ds["channels"]]
        marker_width = max(len(m) for m in markers)
        for i, (c, marker) in enumerate(zip(ds["channels"], markers), start=1):
            marker = f"  {marker:<{marker_width}}" if marker_width else ""
            lines.append(f"{indent}  {i:>3}  {c['pnn']:<{width}}{marker}  {_scale(c)}")
        if ds["spillover"]:
            lines.append(f"{indent}spillover: yes ({len(ds['spillover_channels'])} channels: "
                         f"{', '.join(ds['spillover_channels'])})")
        else:
            lines.append(f"{indent}spillover: no")
        for note in ds["notes"]:
            lines.append(f"{indent}note: {note}")
    return "\n".join(lines)


def _scale(channel: dict) -> str:
    """A channel's $PnR, $PnE and $PnG as the file states them, in words."""
    stated = [f"range {channel['range']:g}" if channel.get("range") else "no range",
              f"log, {channel['log_decades']:g} decades" if channel.get("log_decades") else "linear"]
    if channel.get("gain", 1.0) not in (1.0, 0.0):
        stated.append(f"gain {channel['gain']:g}")
    return "[" + ", ".join(stated) + "]"


def run(args) -> int:
    status = 0
    results = []
    for path in args.files:
        try:
            info = fcs_info(path)
        except FCSError as exc:
            print_error(describe_error(exc))
            results.append({"file": path, "error": exc.problem})
            status = 1
            continue
        results.append(info)
        if not args.json:
            print(_describe(info))
    if args.json:
        print_json(results, ensure_ascii=False)
    return status
