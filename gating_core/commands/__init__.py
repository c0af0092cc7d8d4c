"""Sub-commands of ``gating-core`` / ``python -m gating_core``; one module per command (``library``: one
module for its group), and ``model_options`` for what ``train``, ``gate`` and ``evaluate`` share.

Every ``--json`` output goes through :func:`print_json`: one valid JSON document on stdout,
NaN and infinities as ``null`` (``json.dumps`` would print the invalid ``NaN``).
"""

from __future__ import annotations

import json
import math


def json_safe(value):
    """``value`` with NaN / infinities as None and numpy scalars and arrays as Python values."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":  # numpy scalar or array
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_json(document, *, indent: int | None = 2, ensure_ascii: bool = True) -> None:
    """Print ``document`` as one valid JSON document (see :func:`json_safe`)."""
    print(json.dumps(json_safe(document), indent=indent, ensure_ascii=ensure_ascii, allow_nan=False))


# What an export keeps by default, for the help of every option that changes it.
DEFAULT_KEYWORDS_HELP = ("only the keywords needed to read the data: data layout, channel names, markers and "
                         "settings ($PnN, $PnS, $PnV, ...), $TIMESTEP, spillover, $CYT, $VOL")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (counts and sizes)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _keyword_name(text: str) -> str:
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("needs a keyword name")
    return text.strip()


def add_keyword_options(parser, what: str) -> None:
    """``--include-identifying`` and ``--keep-keyword NAME`` (repeatable) for an export into ``what``."""
    parser.add_argument("--include-identifying", action="store_true",
                        help=f"keep every keyword of the source in {what}, including those that may identify a "
                             f"person (names, ids, dates, serial numbers, free text); default: "
                             f"{DEFAULT_KEYWORDS_HELP}")
    parser.add_argument("--keep-keyword", action="append", default=[], metavar="NAME", dest="keep_keywords",
                        type=_keyword_name,
                        help=f"also keep this keyword in {what} (case-insensitive; $PnV keeps every channel's "
                             f"$P1V, $P2V, ...); repeatable")
