"""Names coming from users (uploaded file names) made safe to show and to key by."""

from __future__ import annotations

import os
import re

_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_stem(file_name: str, fallback: str = "file") -> str:
    """A display/identifier stem from an uploaded file name; never used as a path by itself.

    Drops any directory part, the extension(s) ``.fcs``/``.csv``/``.labels.csv``/``.gated.csv``,
    and replaces characters outside ``[A-Za-z0-9._+-]`` with ``_``.
    """
    base = os.path.basename(str(file_name).replace("\\", "/"))
    lowered = base.lower()
    for suffix in (".labels.csv", ".gated.csv", ".fcs", ".csv", ".wsp", ".xml", ".lmd"):
        if lowered.endswith(suffix):
            base = base[: -len(suffix)]
            break
    stem = _SAFE.sub("_", base).strip("._")[:80]
    return stem or fallback
