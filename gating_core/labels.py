"""Per-event population labels of historical (expert-gated) patients.

A labeled input is either an FCS file with ``<stem>.labels.csv`` beside it (header
``population``, one row per event, in event order), a gated CSV as written by
:func:`gating_core.export.write_gated_csv`, or an FCS written by
:func:`gating_core.export.write_fcs_with_populations` (population codes as a channel).
Every way a labels file can be wrong becomes a :class:`LabelError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gating_core.errors import GatingCoreError

__all__ = ["LabelError", "labels_path_for", "read_labels_csv", "load_labeled_input"]

LABELS_SUFFIX = ".labels.csv"
POPULATION_COLUMN = "population"


class LabelError(GatingCoreError, ValueError):
    """A labels file or gated CSV is missing or unusable; ``str(err)`` names the file and problem."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")


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
        raise LabelError(path, f"not a valid CSV table ({message})") from None
    except OSError as exc:
        raise LabelError(path, f"cannot be read ({exc})") from None


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
        raise LabelError(path, f"has {values.shape[0]} label rows but the sample has "
                               f"{n_expected} events (one row per event, in event order)")
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
    return population_array(path, table.column(POPULATION_COLUMN), n_events)


def load_labeled_input(path: str | os.PathLike, compensate: bool = True):
    """(Sample, populations ndarray[str]) from a labeled input.

    ``path`` ending in ``.csv`` is read as a gated CSV; anything else as an FCS file whose labels
    are in ``<stem>.labels.csv`` beside it (or, failing that, in a population channel written by
    :func:`gating_core.export.write_fcs_with_populations`). ``compensate`` applies the FCS
    spillover matrix when present. Raises LabelError (labels) or FCSError (FCS file).
    """
    from .export import POPULATION_KEYWORD, populations_from_sample, read_gated_csv
    from .fcs import read_fcs

    path = Path(path)
    if path.suffix.lower() == ".csv":
        sample, populations, _ = read_gated_csv(path)
        return sample, populations
    labels_path = labels_path_for(path)
    sample = read_fcs(path, compensate=compensate)
    if labels_path.exists():
        return sample, read_labels_csv(labels_path, sample.n_events)
    if POPULATION_KEYWORD in sample.keywords:
        return populations_from_sample(sample)
    raise LabelError(labels_path, f"labels file is missing: {path.name} needs {labels_path.name} "
                                  "beside it (header 'population', one row per event)")
