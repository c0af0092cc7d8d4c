"""Spillover: the matrix from ``$SPILLOVER``, ``SPILL`` or ``$SPILL``, its channels resolved
by name, marker or number, and a data set's channels as every reader describes them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from gating_core.fcs.layout import _Layout, _unique_names
from gating_core.fcs.sample import Channel, FCSError
from gating_core.fcs.text import _is_digits

# What the reader tolerated in a file (Sample.notes) is also logged, under the package's name
# (gating_core.fcs), for scripts and services that collect logs rather than inspect samples.
logger = logging.getLogger(__package__)


SPILLOVER_KEYWORDS = ("spillover", "spill")  # FlowIO folds $SPILL and SPILL into "spill"


def _parse_spillover(layout: _Layout, unique_pnn: list[str], notes: list[str]):
    """(matrix, channel names) from $SPILLOVER / SPILL / $SPILL, or (None, []) with a note
    appended to ``notes``."""
    for key in SPILLOVER_KEYWORDS:
        value = layout.text.get(key, "").strip()
        if not value:
            continue
        label = "$SPILLOVER" if key == "spillover" else "$SPILL/SPILL"
        parts = [p.strip() for p in value.replace("\n", ",").split(",")]
        try:
            k = int(float(parts[0]))
        except ValueError:
            notes.append(f"{label} ignored: it does not start with the channel count")
            return None, []
        if k < 1 or len(parts) != 1 + k + k * k:
            notes.append(f"{label} ignored: {k} channels need {1 + k + k * k} values, "
                                f"found {len(parts)}")
            return None, []
        names, numbers = parts[1:1 + k], parts[1 + k:]
        try:
            matrix = np.array([float(x) for x in numbers], dtype=np.float64).reshape(k, k)
        except ValueError:
            notes.append(f"{label} ignored: its matrix holds non-numbers")
            return None, []
        if not np.all(np.isfinite(matrix)):
            notes.append(f"{label} ignored: its matrix holds non-finite values")
            return None, []
        resolved = []
        for name in names:
            index = _resolve_channel(name, layout)
            if index is None:
                notes.append(f"{label} ignored: it names channel {name!r}, which the file "
                                    "does not have")
                return None, []
            resolved.append(unique_pnn[index])
        if len(set(resolved)) != k:
            notes.append(f"{label} ignored: it names a channel twice")
            return None, []
        return matrix, resolved
    return None, []


def _resolve_channel(name: str, layout: _Layout) -> int | None:
    if name in layout.pnn:
        return layout.pnn.index(name)
    if name in layout.pns:
        return layout.pns.index(name)
    if _is_digits(name) and 1 <= int(name) <= layout.n_channels:
        return int(name) - 1  # some writers refer to channels by number
    return None


def _channels_and_spillover(layout: _Layout, notes: list[str], compensate: bool):
    """(channels, spillover matrix or None, its channel names) of a data set, as
    :func:`read_fcs` and :class:`EventStream` both describe it. Appends what was tolerated to
    ``notes`` and logs every note; FCSError when compensation is asked for but the spillover
    keyword had to be ignored."""
    unique_pnn = _unique_names(layout.pnn)
    if unique_pnn != layout.pnn:
        notes.append("duplicate $PnN names made unique: " + ", ".join(
            u for u, o in zip(unique_pnn, layout.pnn) if u != o))
    channels = [Channel(u, s, r) for u, s, r in zip(unique_pnn, layout.pns, layout.ranges)]
    spill_notes: list[str] = []
    spillover, spill_channels = _parse_spillover(layout, unique_pnn, spill_notes)
    notes += spill_notes
    for note in notes:
        logger.warning("%s: %s", Path(layout.path).name, note)
    broken = [n for n in spill_notes if "ignored" in n]
    if compensate and broken:
        raise FCSError(layout.path, f"compensation requested but {broken[0]}: to use the values as stored, "
                                    "turn compensation off (command line: --no-compensation; Python: "
                                    "compensate=False)")
    return channels, spillover, spill_channels
