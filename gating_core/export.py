"""Writing gating results: gated CSV, FCS 3.1 with a population channel, Parquet and h5ad.

Gated CSV (design.md section 4): one row per event in the original order, one column per
channel named by its $PnN, then ``population`` (text) and ``confidence`` (0..1). Floats are
written as the shortest text that reads back to the same float32 (or float64) value, so a
gated CSV is a lossless training input.

FCS with populations: the events plus a ``population`` channel of integer codes; the keywords
``GATING_POPULATION_CHANNEL`` (the channel's name), ``GATING_POPULATION_COUNT`` (k) and
``GATING_POPULATION_<code>`` (the name of each code 0..k-1) map codes back to names.

Every export -- library, command line, the app's download buttons and zip -- goes through
:func:`export_sample` (or :func:`export_bytes`, its in-memory twin), so there is one keyword
policy (:func:`export_keywords`) and one guarantee: reading an exported FCS gives back exactly
the events and channels the source read gave (``read(export(read(f))) == read(f)``).
"""

from __future__ import annotations

import math
import os
import re
import uuid
from pathlib import Path
from urllib.parse import unquote

import numpy as np

from .fcs import Channel, FCSError, Sample, read_fcs, write_fcs
from .labels import POPULATION_COLUMN, LabelError, _read_csv_table, population_array, read_header
from .library.privacy import is_identifying

__all__ = ["export_sample", "export_bytes", "export_keywords", "write_gated_csv", "read_gated_csv",
           "GatedTableWriter",
           "write_gated_parquet", "write_gated_h5ad",
           "write_fcs_with_populations", "populations_from_sample", "read_fcs_with_populations",
           "POPULATION_KEYWORD"]

CONFIDENCE_COLUMN = "confidence"
POPULATION_KEYWORD = "GATING_POPULATION_CHANNEL"
POPULATION_COUNT_KEYWORD = "GATING_POPULATION_COUNT"
POPULATION_NAME_KEYWORD = "GATING_POPULATION_{}"
EXPORT_FORMATS = ("csv", "fcs", "parquet", "h5ad")
# File suffix of each export format, for callers that name files (``<stem>.gated.<suffix>``).
EXPORT_SUFFIXES = {"csv": ".csv", "fcs": ".fcs", "parquet": ".parquet", "h5ad": ".h5ad"}

# Keywords an exported FCS never copies from its source: the writer sets the layout and the
# channel keywords itself ($PnG, $PnE and $PnR included: the events are written linear, gain
# already divided out, so the file declares gain 1 and no log amplification); $TIMESTEP,
# the spillover and the population keywords are rewritten from the sample.
_NOT_CARRIED = re.compile(r"^\$?((BEGIN|END)(DATA|ANALYSIS|STEXT)|BYTEORD|DATATYPE|MODE|NEXTDATA|PAR|TOT"
                          r"|P\d+[BENRSG]|TIMESTEP|SPILLOVER|SPILL|GATING_POPULATION_.*)$", re.IGNORECASE)
_CHANNEL_KEYWORD = re.compile(r"^\$?P(\d+)[A-Z]", re.IGNORECASE)


def _encode_name(name: str) -> str:
    # FlowIO's TEXT tokenizer (this project's too) drops every '$': percent-encode it (and '%'
    # itself) so every name survives exactly. '/' stays encoded as files written before the
    # writer chose its delimiter did, so readers of either kind of file decode the same way.
    return name.replace("%", "%25").replace("/", "%2F").replace("$", "%24")


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
    """The header line Arrow's CSV writer writes (``quoting_style="needed"``): every name quoted."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    schema = pa.schema([(name, pa.string()) for name in names])
    out = io.BytesIO()
    pacsv.write_csv(schema.empty_table(), out, write_options=pacsv.WriteOptions(quoting_style="needed"))
    return out.getvalue()


def _csv_rows(events, dtype, populations, confidence) -> bytes:
    """CSV text of rows, byte for byte what Arrow's CSV writer (``quoting_style="needed"``)
    writes for the same columns: floats by Arrow's shortest round-trip cast to text,
    unquoted; population text always quoted, quotes doubled; ``\\n`` after each row.

    Built with Arrow's string kernels (cast, element-wise join), so no Python loop runs per
    row; the joined rows' character buffer is the text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    events = np.asarray(events, dtype=dtype)
    parts = [pc.cast(pa.array(np.ascontiguousarray(events[:, i])), pa.string()) for i in range(events.shape[1])]
    names = pa.array(populations, type=pa.string())
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

    A whole-sample write (:func:`write_gated_csv`) goes through this class too, so the
    bytes of a gated CSV do not depend on how the events were chunked.
    """

    def __init__(self, path, sample: Sample, format: str = "csv", with_confidence: bool = True):
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
        populations = pa.array(populations, type=pa.string())
        arrays.append(populations if self.format == "csv" else populations.dictionary_encode())
        if self.with_confidence:
            arrays.append(pa.array(np.asarray(confidence).astype(np.float32)))
        return pa.RecordBatch.from_arrays(arrays, names=self.names)

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
        from gating_core.classifier import score_threads  # our pools' size: usable CPUs, 1 on a Dask worker

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
            self._writer = pq.ParquetWriter(self._tmp, table.schema)
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
    channel_names = [c for c in header if c not in (POPULATION_COLUMN, CONFIDENCE_COLUMN)]
    if not channel_names:
        raise LabelError(path, "is not a gated CSV: no channel columns before 'population'")
    if any(name.strip() == "" for name in channel_names):
        raise LabelError(path, "header has an empty channel name")
    types = {name: pa.float64() for name in channel_names}
    types[POPULATION_COLUMN] = pa.string()
    has_confidence = CONFIDENCE_COLUMN in header
    if has_confidence:
        types[CONFIDENCE_COLUMN] = pa.float64()
    table = _read_csv_table(path, types)
    if table.num_rows == 0:
        raise LabelError(path, "has a header but no event rows")
    events = np.empty((table.num_rows, len(channel_names)), dtype=dtype)
    for i, name in enumerate(channel_names):
        column = table.column(name)
        if column.null_count:
            raise LabelError(path, f"column {name!r} has {column.null_count} empty or NaN cells")
        values = column.to_numpy()
        if not np.all(np.isfinite(values)):
            raise LabelError(path, f"column {name!r} holds NaN or infinite values")
        events[:, i] = values
    populations = population_array(path, table.column(POPULATION_COLUMN), table.num_rows)
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
        pq.write_table(pa.table(columns), tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_gated_h5ad(path: str | os.PathLike, sample: Sample, populations=None, confidence=None, *,
                     include_identifying: bool = False) -> None:
    """The gated patient as an AnnData ``.h5ad`` (layout of :func:`gating_core.interop.to_anndata`);
    keywords that may identify a person are left out unless ``include_identifying``."""
    from .interop import to_anndata

    path = Path(path)
    if populations is not None:
        populations, confidence = _check_lengths(sample, populations, confidence, path)
    adata = to_anndata(sample, populations=populations, confidence=confidence,
                       include_identifying=include_identifying)
    tmp = _atomic_target(path)
    try:
        adata.write_h5ad(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def export_keywords(sample: Sample, *, include_identifying: bool = False) -> dict[str, str]:
    """The TEXT keywords an exported FCS of ``sample`` carries (the one export policy).

    * Keywords that may identify a person (:func:`gating_core.library.privacy.is_identifying`)
      are left out unless ``include_identifying``.
    * Layout and channel keywords are the writer's ($PnB, $PnE, $PnG, $PnN, $PnR, $PnS, ...):
      the events are written as the reader returned them -- linear, gain divided out -- so the
      file declares $PnE 0,0 and no gain, and a reader gets the same values back. Other
      channel keywords ($PnV, $PnD, ...) are carried for the sample's own channels.
    * A time channel's values are in seconds already ($TIMESTEP applied on reading): the file
      says ``$TIMESTEP 1`` when the source had a usable $TIMESTEP, so no reader scales twice.
    * The spillover matrix is written as ``$SPILLOVER`` from the sample, and left out when the
      events are already compensated (a reader would compensate twice).
    * Empty values are dropped (FCS forbids them).
    """
    d = len(sample.channels)
    keep: dict[str, str] = {}
    for key, value in sample.keywords.items():
        key, value = str(key), "" if value is None else str(value)
        if value == "" or _NOT_CARRIED.match(key):
            continue
        if not include_identifying and is_identifying(key):
            continue
        if sample.compensated and key.lstrip("$").upper() == "COMP":
            continue
        channel = _CHANNEL_KEYWORD.match(key)
        if channel and not 1 <= int(channel.group(1)) <= d:
            continue  # describes a channel the sample does not have
        keep[key] = value
    timestep = next((str(v) for k, v in sample.keywords.items() if k.lstrip("$").upper() == "TIMESTEP"), "")
    has_time = any(c.pnn.strip().lower() == "time" for c in sample.channels)
    if has_time and _usable_timestep(timestep):
        keep["$TIMESTEP"] = "1"
    if sample.spillover is not None and not sample.compensated:
        values = ",".join(repr(float(v)) for v in np.asarray(sample.spillover, dtype=np.float64).ravel())
        keep["$SPILLOVER"] = f"{len(sample.spillover_channels)}," + ",".join(sample.spillover_channels) \
            + "," + values
    return keep


def _usable_timestep(text: str) -> bool:
    try:
        return math.isfinite(float(text.strip()))
    except ValueError:
        return False


def _write_fcs_export(path: Path, sample: Sample, populations, include_identifying: bool) -> None:
    keywords = export_keywords(sample, include_identifying=include_identifying)
    ranges = [c.range for c in sample.channels]
    if populations is None:
        write_fcs(path, sample.events, sample.pnn, sample.pns, keywords, ranges=ranges, datatype="auto")
        return
    populations, _ = _check_lengths(sample, populations, None, path)
    names, codes = np.unique(populations, return_inverse=True)
    if any(n.strip() == "" for n in names):
        raise ValueError(f"{path.name}: population names must not be empty")
    channel = POPULATION_COLUMN
    k = 2
    while channel in sample.pnn:
        channel = f"{POPULATION_COLUMN}_{k}"
        k += 1
    dtype = sample.events.dtype if sample.events.dtype in (np.float32, np.float64) else np.float64
    events = np.empty((sample.n_events, len(sample.channels) + 1), dtype=dtype)
    events[:, :-1] = sample.events
    events[:, -1] = codes
    keywords[POPULATION_KEYWORD] = channel
    keywords[POPULATION_COUNT_KEYWORD] = str(len(names))
    for code, name in enumerate(names):
        keywords[POPULATION_NAME_KEYWORD.format(code)] = _encode_name(str(name))
    write_fcs(path, events, sample.pnn + [channel], sample.pns + ["population code"], keywords,
              ranges=ranges + [max(len(names), 1)], datatype="auto")


def export_sample(path: str | os.PathLike, sample: Sample, populations=None, confidence=None, *,
                  format: str | None = None, include_identifying: bool = False) -> Path:
    """Write one patient for use outside the product: the single export path.

    Parameters
    ----------
    path : output file.
    sample : the events as read (linear scale).
    populations : array-like of str, shape (n_events,), or None (FCS only: events alone).
    confidence : array-like of float in [0, 1] (gated CSV only), or None.
    format : ``"csv"`` (gated CSV), ``"fcs"`` (FCS 3.1 with a population channel when
        ``populations`` is given), ``"parquet"`` (the gated CSV's columns, typed) or ``"h5ad"``
        (AnnData, :func:`gating_core.interop.to_anndata`; needs the anndata package); default
        from the suffix (``.fcs``, ``.parquet``, ``.h5ad``), else CSV.
    include_identifying : keep the keywords that may identify a person (default: left out,
        see :mod:`gating_core.library.privacy`). A gated CSV or Parquet file carries no
        keywords at all.

    An exported FCS reads back (this project's reader, FlowIO, FlowKit) with exactly the
    source sample's events on every channel: float32 when the values are float32, else
    float64. Raises FCSError (FCS), ValueError (lengths, names), ImportError (h5ad without
    anndata) or OSError.
    """
    path = Path(path)
    by_suffix = {suffix: name for name, suffix in EXPORT_SUFFIXES.items()}
    format = format or by_suffix.get(path.suffix.lower(), "csv")
    if format not in EXPORT_FORMATS:
        raise ValueError(f"export format must be one of {EXPORT_FORMATS}, not {format!r}")
    if format in ("csv", "parquet") and populations is None:
        raise ValueError(f"{path.name}: a gated {format.upper() if format == 'csv' else 'Parquet'} file needs populations")
    if format == "csv":
        write_gated_csv(path, sample, populations, confidence)
    elif format == "parquet":
        write_gated_parquet(path, sample, populations, confidence)
    elif format == "h5ad":
        write_gated_h5ad(path, sample, populations, confidence, include_identifying=include_identifying)
    else:
        _write_fcs_export(path, sample, populations, include_identifying)
    return path


def export_bytes(sample: Sample, populations=None, confidence=None, *, format: str,
                 include_identifying: bool = False, work_dir: str | os.PathLike | None = None) -> bytes:
    """:func:`export_sample` into memory (for downloads): the file's bytes.

    The file is written in ``work_dir`` (default: the system temp folder) and removed.
    """
    import tempfile

    folder = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir())
    path = folder / f"export-{uuid.uuid4().hex}.{format}"
    try:
        export_sample(path, sample, populations, confidence, format=format,
                      include_identifying=include_identifying)
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def write_fcs_with_populations(path: str | os.PathLike, sample: Sample, populations, *,
                               include_identifying: bool = False) -> None:
    """Write the sample as FCS 3.1 with an extra channel of population codes.

    Codes are 0..k-1 in sorted order of the population names; keywords
    ``GATING_POPULATION_<code>`` hold the names. Readable by FlowIO and FlowKit. Same file as
    ``export_sample(path, sample, populations, format="fcs")``.
    """
    export_sample(path, sample, populations, format="fcs", include_identifying=include_identifying)


def populations_from_sample(sample: Sample):
    """Split a sample read from :func:`write_fcs_with_populations` output.

    Returns (sample without the population channel, populations ndarray[str]).
    Raises FCSError when the keywords or codes are inconsistent.
    """
    where = sample.path or sample.name
    channel = sample.keywords.get(POPULATION_KEYWORD)
    if channel is None:
        raise FCSError(where, f"has no {POPULATION_KEYWORD} keyword: no population channel")
    try:
        index = sample.pnn.index(channel)
        count = int(sample.keywords[POPULATION_COUNT_KEYWORD])
        names = np.array([unquote(sample.keywords[POPULATION_NAME_KEYWORD.format(c)])
                          for c in range(count)], dtype=str)
    except (ValueError, KeyError) as exc:
        raise FCSError(where, f"population keywords are incomplete ({exc})") from None
    codes = sample.events[:, index]
    if codes.size and (codes.min() < 0 or codes.max() >= count or np.any(codes != np.round(codes))):
        raise FCSError(where, f"population channel {channel!r} holds codes outside 0..{count - 1}")
    keep = [i for i in range(len(sample.channels)) if i != index]
    rest = Sample(sample.name, np.ascontiguousarray(sample.events[:, keep]),
                  [sample.channels[i] for i in keep], dict(sample.keywords), sample.spillover,
                  list(sample.spillover_channels), sample.version, sample.path,
                  sample.compensated, list(sample.notes))
    return rest, names[codes.astype(np.intp)]


def read_fcs_with_populations(path: str | os.PathLike, compensate: bool = False):
    """(Sample without the population channel, populations) from such an FCS file."""
    return populations_from_sample(read_fcs(path, compensate=compensate))
