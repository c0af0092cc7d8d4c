"""Per-event population labels of historical (expert-gated) patients.

The labels file ``<stem>.labels.csv`` (header ``population``, one row per event, in event
order) beside an FCS file, and :class:`Provenance`, where a patient's labels came from. Every way
a labels file can be wrong becomes a :class:`LabelError` naming the file. Reading a labeled
input (FCS + labels file, gated CSV, FCS with a population channel) is
:func:`gating_core.io.inputs.read_input`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gating_core.errors import LabelError

__all__ = ["LabelError", "Provenance", "labels_path_for", "read_labels_csv"]

LABELS_SUFFIX = ".labels.csv"
POPULATION_COLUMN = "population"


class Provenance:
    """Where a patient's labels came from: the values the patient library stores (verbatim, in
    its catalog) and, in :attr:`SHORT`, the short name the app shows for each."""

    IMPORTED = "imported labels"
    GATED_CSV = "imported gated CSV"
    FLOWJO = "FlowJo workspace gates"
    GATINGML = "GatingML gates"
    DRAWN = "gates drawn in the app"
    AUTO_ACCEPTED = "auto-gate accepted after review"

    ALL = (IMPORTED, GATED_CSV, FLOWJO, GATINGML, DRAWN, AUTO_ACCEPTED)

    SHORT = {IMPORTED: "labels CSV", GATED_CSV: "gated CSV", FLOWJO: "FlowJo workspace", GATINGML: "GatingML",
             DRAWN: "gates drawn", AUTO_ACCEPTED: "auto-gate (reviewed)"}

    @classmethod
    def short(cls, provenance: str | None) -> str:
        """The app's short name of a stored provenance (an unknown one is shown as stored)."""
        return cls.SHORT.get(provenance or "", provenance or "")

    @classmethod
    def from_short(cls, short: str, default: str) -> str:
        """The stored provenance of an app's short name; ``default`` for any other text."""
        return next((p for p, s in cls.SHORT.items() if s == short), default)


def labels_path_for(fcs_path: str | os.PathLike) -> Path:
    """``<dir>/<stem>.labels.csv`` for ``<dir>/<stem>.fcs``."""
    fcs_path = Path(fcs_path)
    return fcs_path.with_name(fcs_path.stem + LABELS_SUFFIX)


def _read_csv_table(path: Path, column_types: dict | None = None):
    """A pyarrow Table of the whole CSV, every problem turned into a LabelError."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        if path.stat().st_size == 0:
            raise LabelError(path, "file is empty")
    except FileNotFoundError:
        raise LabelError(path, "file not found") from None
    except OSError as exc:
        raise LabelError(path, f"cannot be opened ({exc.strerror or exc})") from None
    convert = pacsv.ConvertOptions(column_types=column_types or {}, strings_can_be_null=False,
                                   quoted_strings_can_be_null=False)
    try:
        return pacsv.read_csv(path, convert_options=convert)
    except pa.ArrowInvalid as exc:
        message = str(exc).strip().splitlines()[0]
        if "Empty CSV file" in message:
            raise LabelError(path, "file is empty") from None
        if "invalid UTF8" in message:
            line = _first_line_not_utf8(path)
            raise LabelError(path, (f"line {line} is " if line else "holds text ") + "not in UTF-8: save it as "
                                   "UTF-8 text (a spreadsheet's 'CSV UTF-8' format)") from None
        raise LabelError(path, f"not a valid CSV table ({message})") from None
    except OSError as exc:
        raise LabelError(path, f"cannot be read ({exc})") from None


def _first_line_not_utf8(path: Path) -> int | None:
    """The number (from 1) of the first line of ``path`` that is not UTF-8 text, or None."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return None


def _first_blank_line(path: Path) -> int | None:
    """The number (from 1) of the first blank line of ``path`` followed by a line that is not
    blank (a CSV reader skips it, so the rows after it are one short), or None."""
    blank = None
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                if blank is not None:
                    return blank
            elif blank is None:
                blank = number
    return None


def read_header(path: Path) -> list[str]:
    """Column names of a CSV file (first line), as pyarrow will see them."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 16))
        return list(reader.schema.names)
    except FileNotFoundError:
        raise LabelError(path, "file not found") from None
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" in str(exc):
            raise LabelError(path, "file is empty") from None
        raise LabelError(path, f"not a valid CSV table ({str(exc).splitlines()[0]})") from None


def population_array(path: Path, column, n_expected: int | None) -> np.ndarray:
    """Validated population names (ndarray of str) from a pyarrow string column."""
    values = column.to_numpy(zero_copy_only=False).astype(str)
    if n_expected is not None and values.shape[0] != n_expected:
        raise LabelError(path, f"has {values.shape[0]:,} label rows but the sample has "
                               f"{n_expected:,} events (one row per event, in event order)")
    if values.shape[0] == 0:
        raise LabelError(path, "has no label rows")
    stripped = np.char.strip(values)
    empty = np.flatnonzero(stripped == "")
    if empty.size:
        raise LabelError(path, f"row {int(empty[0]) + 2} has an empty population name "
                               f"({empty.size} empty in all)")
    return stripped


def read_labels_csv(path: str | os.PathLike, n_events: int | None) -> np.ndarray:
    """Population names from a labels CSV (header ``population``, one row per event).

    Returns ndarray of str, shape (n_events,). Raises LabelError when the file is missing,
    empty, lacks the ``population`` column, has a wrong row count or empty names.
    """
    import pyarrow as pa

    path = Path(path)
    header = read_header(path)
    if POPULATION_COLUMN not in header:
        raise LabelError(path, f"needs a header line 'population'; found {header[:5]}")
    table = _read_csv_table(path, {POPULATION_COLUMN: pa.string()})
    if n_events is not None and table.num_rows != n_events:
        blank = _first_blank_line(path)
        if blank is not None:
            raise LabelError(path, f"line {blank} is blank: every event needs its population, one row per event "
                                   f"in event order ({table.num_rows} label rows for {n_events} events)")
    return population_array(path, table.column(POPULATION_COLUMN), n_events)
