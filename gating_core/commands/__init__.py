"""Sub-commands of ``gating-core`` / ``python -m gating_core``; one module per group.

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
