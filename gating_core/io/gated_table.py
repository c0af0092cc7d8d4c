"""Gated tables: the events with each one's population (and confidence) as CSV or Parquet,
written whole or chunk by chunk (:class:`GatedTableWriter`), and a gated CSV read back.

Gated CSV (design.md section 4): one row per event in the original order, one column per
channel named by its $PnN, then ``population`` (text) and ``confidence`` (0..1). Floats are
written as the shortest text that reads back to the same float32 (or float64) value, so a
gated CSV is a lossless training input. Channel and population names that a spreadsheet would
evaluate as a formula are written with a leading apostrophe, and read back without it
(:mod:`gating_core.io.spreadsheet_cells`). Every file is written under a temporary name and
renamed when complete. Exports go through :func:`gating_core.io.export.export_sample`, which
calls these writers (and, for h5ad, :func:`gating_core.io.anndata_interop.write_gated_h5ad`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gating_core.cpus import score_threads
from gating_core.fcs import Channel, Sample
from gating_core.io.labels import POPULATION_COLUMN, LabelError, _read_csv_table, population_array, read_header
from gating_core.io.parquet_columns import repeating_columns
from gating_core.io.spreadsheet_cells import arrow_cell_texts, cell_text, safe_arrow_cells, safe_cell

__all__ = ["GatedTableWriter", "write_gated_csv", "read_gated_csv", "write_gated_parquet", "CONFIDENCE_COLUMN"]


CONFIDENCE_COLUMN = "confidence"


def _check_lengths(sample: Sample, populations, confidence, path: Path):
    populations = np.asarray(populations)
    if populations.shape != (sample.n_events,):
        raise ValueError(f"{path.name}: {populations.shape[0] if populations.ndim else 0} "
                         f"populations for {sample.n_events} events")
    if confidence is not None:
        confidence = np.asarray(confidence, dtype=np.float64)
        if confidence.shape != (sample.n_events,):
            raise ValueError(f"{path.name}: confidence of shape {confidence.shape} for "
                             f"{sample.n_events} events")
        if not np.all((confidence >= 0) & (confidence <= 1)):
            raise ValueError(f"{path.name}: confidence values must lie in [0, 1]")
    return populations.astype(str), confidence


def _atomic_target(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.part")


CSV_BATCH_ROWS = 131_072
#: Fewest rows worth a thread of their own when formatting CSV text.
CSV_MIN_BLOCK_ROWS = 16_384


def _csv_header(names) -> bytes:
    """The header line Arrow's CSV writer writes (``quoting_style="needed"``): every name quoted,
    and made safe for a spreadsheet (:mod:`gating_core.io.spreadsheet_cells`)."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    schema = pa.schema([(safe_cell(name), pa.string()) for name in names])
    out = io.BytesIO()
    pacsv.write_csv(schema.empty_table(), out, write_options=pacsv.WriteOptions(quoting_style="needed"))
    return out.getvalue()


def _csv_rows(events, dtype, populations, confidence) -> bytes:
    """CSV text of rows, byte for byte what Arrow's CSV writer (``quoting_style="needed"``)
    writes for the same columns: floats by Arrow's shortest round-trip cast to text,
    unquoted; population text always quoted, quotes doubled, made safe for a spreadsheet
    (:func:`~gating_core.io.spreadsheet_cells.safe_arrow_cells`); ``\\n`` after each row.

    Built with Arrow's string kernels (cast, element-wise join), so no Python loop runs per
    row; the joined rows' character buffer is the text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    events = np.asarray(events, dtype=dtype)
    parts = [pc.cast(pa.array(np.ascontiguousarray(events[:, i])), pa.string()) for i in range(events.shape[1])]
    names = safe_arrow_cells(pa.array(populations, type=pa.string()))
    parts.append(pc.binary_join_element_wise('"', pc.replace_substring(names, '"', '""'), '"', ""))
    if confidence is not None:
        parts.append(pc.cast(pa.array(np.asarray(confidence).astype(np.float32)), pa.string()))
    parts[-1] = pc.binary_join_element_wise(parts[-1], "", "\n")  # the row's line end
    rows = pc.binary_join_element_wise(*parts, ",") if len(parts) > 1 else parts[0]
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int64 if rows.type == pa.large_string() else np.int32)
    first, last = int(offsets[rows.offset]), int(offsets[rows.offset + len(rows)])
    return memoryview(rows.buffers()[2])[first:last].tobytes()


#: Rows of one Parquet row group when the table is written chunk by chunk.
PARQUET_GROUP_ROWS = 262_144


def _parquet_dictionary_columns(table) -> list[str]:
    """The gated table's columns to dictionary-encode: ``population``, and the channels whose
    values repeat (:func:`gating_core.io.parquet_columns.repeating_columns`)."""
    return repeating_columns(table, always=(POPULATION_COLUMN,), never=(CONFIDENCE_COLUMN,))


class GatedTableWriter:
    """Writes a gated CSV or Parquet file chunk by chunk: memory stays a chunk whatever the
    number of events. Used as a context manager; the file appears under its name only when
    the block ends without an exception (written to a hidden temporary name in the same
    folder, then renamed), so a failure never leaves a partial file behind.

    Parameters
    ----------
    path : output file.
    sample : Sample whose ``pnn`` names the channel columns and whose ``events.dtype`` decides
        float32 / float64 columns (its events may be empty).
    format : ``"csv"`` or ``"parquet"``.
    with_confidence : write the ``confidence`` column.
    categories : the population names a Parquet file's ``population`` column holds, in order
        (a model's ``gated_populations()``), or None. Given, every file gated by one model has
        the same categories in the same order, so that tables of several patients concatenate
        as one categorical column; a name outside them is written as the rows come.

    A whole-sample write (:func:`write_gated_csv`) goes through this class too, so the
    bytes of a gated CSV do not depend on how the events were chunked.
    """

    def __init__(self, path, sample: Sample, format: str = "csv", with_confidence: bool = True, categories=None):
        if format not in ("csv", "parquet"):
            raise ValueError(f"GatedTableWriter writes csv or parquet, not {format!r}")
        self.path = Path(path)
        self.format = format
        reserved = {POPULATION_COLUMN, CONFIDENCE_COLUMN} & set(sample.pnn)
        if reserved:
            what = "CSV" if format == "csv" else "table"
            raise ValueError(f"{self.path.name}: channel name(s) {sorted(reserved)} clash with the gated "
                             f"{what}'s own columns")
        # float32 stays float32 (shortest round-trip text); everything else as float64.
        self.dtype = np.float32 if sample.events.dtype == np.float32 else np.float64
        self.with_confidence = with_confidence
        self.categories = None if categories is None else [str(c) for c in categories]
        self._dictionary = None  # the categories as one Arrow array, shared by every batch
        self.names = list(sample.pnn) + [POPULATION_COLUMN] + ([CONFIDENCE_COLUMN] if with_confidence else [])
        self.n_channels = len(sample.pnn)
        self.rows = 0
        self._tmp = _atomic_target(self.path)
        self._writer = None
        self._pending: list = []
        self._pending_rows = 0

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.abort()
        return False

    def _batch(self, events, populations, confidence):
        import pyarrow as pa

        events = np.asarray(events, dtype=self.dtype)
        arrays = [pa.array(np.ascontiguousarray(events[:, i])) for i in range(events.shape[1])]
        arrays.append(self._population_column(populations))
        if self.with_confidence:
            arrays.append(pa.array(np.asarray(confidence).astype(np.float32)))
        return pa.RecordBatch.from_arrays(arrays, names=self.names)

    def _population_column(self, populations):
        """The ``population`` column of a batch: text (CSV), or dictionary-encoded (Parquet) on
        :attr:`categories` when every name is one of them."""
        import pyarrow as pa

        column = pa.array(populations, type=pa.string())
        if self.format == "csv":
            return column
        if self.categories is not None:
            import pandas as pd

            codes = pd.Categorical(np.asarray(populations, dtype=object), categories=self.categories).codes
            codes = codes.astype(np.int32)
            if len(codes) == 0 or codes.min() >= 0:
                if self._dictionary is None:
                    self._dictionary = pa.array(self.categories, type=pa.string())
                return pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), self._dictionary)
        return column.dictionary_encode()

    def write(self, events, populations, confidence=None) -> None:
        """Append rows: events (m, n_channels), populations (m,) str, confidence (m,) in [0, 1]."""
        populations = np.asarray(populations)
        m = len(populations)
        if np.shape(events) != (m, self.n_channels):
            raise ValueError(f"{self.path.name}: {m} populations for events of shape {np.shape(events)}")
        if self.with_confidence:
            confidence = np.asarray(confidence, dtype=np.float64)
            if confidence.shape != (m,):
                raise ValueError(f"{self.path.name}: confidence of shape {confidence.shape} for {m} events")
            if not np.all((confidence >= 0) & (confidence <= 1)):
                raise ValueError(f"{self.path.name}: confidence values must lie in [0, 1]")
        if self.format == "csv":
            self._write_csv(events, populations, confidence)
        else:
            self._pending.append(self._batch(events, populations, confidence))
            self._pending_rows += m
            if self._pending_rows >= PARQUET_GROUP_ROWS:
                self._flush_parquet()
        self.rows += m

    def _write_csv(self, events, populations, confidence) -> None:
        if self._writer is None:
            self._writer = open(self._tmp, "wb")
            self._writer.write(_csv_header(self.names))
        m = len(populations)
        if m == 0:
            return
        # Formatting floats is the cost (about 0.1 us a value): row blocks are formatted in
        # parallel (Arrow's kernels release the GIL) and written in order.
        threads = max(1, min(score_threads(), m // CSV_MIN_BLOCK_ROWS))
        step = min(CSV_BATCH_ROWS, -(-m // threads))
        blocks = [(lo, min(lo + step, m)) for lo in range(0, m, step)]

        def render(bounds):
            lo, hi = bounds
            return _csv_rows(events[lo:hi], self.dtype, populations[lo:hi],
                             confidence[lo:hi] if self.with_confidence else None)

        if threads == 1:
            for b in blocks:
                self._writer.write(render(b))
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            for group in range(0, len(blocks), threads):  # a few blocks of text in memory at a time
                for text in pool.map(render, blocks[group:group + threads]):
                    self._writer.write(text)

    def _flush_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending).unify_dictionaries().combine_chunks()
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, table.schema,
                                            use_dictionary=_parquet_dictionary_columns(table))
        self._writer.write_table(table, row_group_size=PARQUET_GROUP_ROWS)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        """Finish the file and give it its name."""
        try:
            if self.format == "csv" and self._writer is None:
                self._write_csv(np.empty((0, self.n_channels), dtype=self.dtype), np.empty(0, dtype=str),
                                np.empty(0))
            if self.format == "parquet":
                if self._writer is None and not self._pending:
                    empty = np.empty((0, self.n_channels), dtype=self.dtype)
                    self._pending.append(self._batch(empty, np.empty(0, dtype=str), np.empty(0)))
                self._flush_parquet()
            self._writer.close()
            self._writer = None
            os.replace(self._tmp, self.path)
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the temporary file (nothing appears under the final name)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the file is being thrown away
                pass
            self._writer = None
        if self._tmp.exists():
            self._tmp.unlink()


def write_gated_csv(path: str | os.PathLike, sample: Sample, populations, confidence=None) -> None:
    """Write one row per event: channels by $PnN, ``population``, ``confidence`` (if given).

    Parameters
    ----------
    sample : Sample with ``events`` of shape (n_events, n_channels).
    populations : array-like of str, shape (n_events,).
    confidence : array-like of float in [0, 1], shape (n_events,), or None (column omitted).
    """
    path = Path(path)
    populations, confidence = _check_lengths(sample, populations, confidence, path)
    with GatedTableWriter(path, sample, "csv", with_confidence=confidence is not None) as writer:
        writer.write(sample.events, populations, confidence)


def read_gated_csv(path: str | os.PathLike, dtype=np.float32):
    """Read a gated CSV back.

    Returns
    -------
    sample : Sample named after the file (``<stem>`` without ``.gated``), events of shape
        (n_events, n_channels) in ``dtype`` (float32 reads back float32-written values exactly).
    populations : ndarray of str, shape (n_events,).
    confidence : ndarray of float32, shape (n_events,), or None when the column is absent.

    Raises LabelError naming the file on a wrong header, non-numeric or missing values,
    confidence outside [0, 1], or no rows.
    """
    import pyarrow as pa

    path = Path(path)
    header = read_header(path)
    if len(set(header)) != len(header):
        raise LabelError(path, "header repeats a column name")
    if POPULATION_COLUMN not in header:
        raise LabelError(path, "is not a gated CSV: no 'population' column in the header "
                               f"(found {header[:6]})")
    columns = [c for c in header if c not in (POPULATION_COLUMN, CONFIDENCE_COLUMN)]
    channel_names = [cell_text(c) for c in columns]  # as written: safe for a spreadsheet
    if not channel_names:
        raise LabelError(path, "is not a gated CSV: no channel columns before 'population'")
    if any(name.strip() == "" for name in channel_names):
        raise LabelError(path, "header has an empty channel name")
    types = {column: pa.float64() for column in columns}
    types[POPULATION_COLUMN] = pa.string()
    has_confidence = CONFIDENCE_COLUMN in header
    if has_confidence:
        types[CONFIDENCE_COLUMN] = pa.float64()
    table = _read_csv_table(path, types)
    if table.num_rows == 0:
        raise LabelError(path, "has a header but no event rows")
    events = np.empty((table.num_rows, len(channel_names)), dtype=dtype)
    for i, name in enumerate(channel_names):
        column = table.column(columns[i])
        if column.null_count:
            raise LabelError(path, f"column {name!r} has {column.null_count} empty or NaN cells")
        values = column.to_numpy()
        if not np.all(np.isfinite(values)):
            raise LabelError(path, f"column {name!r} holds NaN or infinite values")
        events[:, i] = values
    populations = population_array(path, arrow_cell_texts(table.column(POPULATION_COLUMN)), table.num_rows)
    confidence = None
    if has_confidence:
        column = table.column(CONFIDENCE_COLUMN)
        if column.null_count:
            raise LabelError(path, f"column 'confidence' has {column.null_count} empty cells")
        confidence = column.to_numpy().astype(np.float32)  # written as float32
        if not np.all((confidence >= 0) & (confidence <= 1)):
            raise LabelError(path, "column 'confidence' has values outside [0, 1]")
    name = path.name[: -len(".gated.csv")] if path.name.endswith(".gated.csv") else path.stem
    sample = Sample(name, events, [Channel(c) for c in channel_names], {}, version="",
                    path=str(path))
    return sample, populations, confidence


def write_gated_parquet(path: str | os.PathLike, sample: Sample, populations, confidence=None) -> None:
    """The gated table as Parquet: the gated CSV's columns, typed (channels float32 / float64 as
    read, ``population`` dictionary-encoded text, ``confidence`` float32), no keywords."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    populations, confidence = _check_lengths(sample, populations, confidence, path)
    reserved = {POPULATION_COLUMN, CONFIDENCE_COLUMN} & set(sample.pnn)
    if reserved:
        raise ValueError(f"{path.name}: channel name(s) {sorted(reserved)} clash with the gated table's own columns")
    dtype = np.float32 if sample.events.dtype == np.float32 else np.float64
    columns = {name: pa.array(np.asarray(sample.events[:, i], dtype=dtype)) for i, name in enumerate(sample.pnn)}
    columns[POPULATION_COLUMN] = pa.array(populations, type=pa.string()).dictionary_encode()
    if confidence is not None:
        columns[CONFIDENCE_COLUMN] = pa.array(confidence.astype(np.float32))
    tmp = _atomic_target(path)
    try:
        table = pa.table(columns)
        pq.write_table(table, tmp, use_dictionary=_parquet_dictionary_columns(table))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
