"""The DATA segment's values: raw bytes (one ``numpy.fromfile`` for uniform widths, a
byte-level path for unusual layouts, packed bits, ASCII; FlowIO as a second reader) to
linear-scale events (range mask, log decoding, gain, ``$TIMESTEP``).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import flowio
import numpy as np

from gating_core.fcs.layout import (FLOAT32_MAX, _Layout, _is_big_endian, _next_power_of_two,
                                    _significance_for_width)
from gating_core.fcs.sample import FCSError
from gating_core.fcs.text import HEADER_OFFSET_LIMIT


_FLOAT_KINDS = {"F": "f4", "D": "f8"}


_INT_KINDS = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}


_PACKED_BLOCK = 8192  # events per block when unpacking bits (a multiple of 8: byte-aligned)


def _uniform_dtype(layout: _Layout) -> np.dtype | None:
    """numpy dtype for one value when every channel shares a plain layout, else None."""
    width = layout.widths[0]
    if any(w != width for w in layout.widths) or len(set(layout.datatypes)) != 1:
        return None
    significance = _significance_for_width(layout.byte_significance, width, layout.path)
    if significance == list(range(width)):
        endian = "<"
    elif significance == list(range(width - 1, -1, -1)):
        endian = ">"
    else:
        return None
    kind = _FLOAT_KINDS.get(layout.datatypes[0]) or _INT_KINDS.get(width)
    return None if kind is None else np.dtype(endian + kind)


def _read_exact(fh, layout: _Layout, dtype: np.dtype, count: int) -> np.ndarray:
    fh.seek(layout.data_start)
    values = np.fromfile(fh, dtype=dtype, count=count)
    if values.size != count:
        raise FCSError(layout.path, f"file is truncated: the DATA segment ended after "
                                    f"{values.size * dtype.itemsize} of {layout.data_bytes} bytes")
    return values


def _raw_values(fh, layout: _Layout) -> np.ndarray | list[np.ndarray]:
    """Stored values: an (n_events, n_channels) array of native floats or unsigned integers,
    or, when the channels differ in data type (or are ASCII), one array per channel."""
    if layout.storage == "packed":
        return _packed_values(fh, layout)
    if layout.storage.startswith("ascii"):
        return _ascii_values(fh, layout)
    n, d = layout.n_events, layout.n_channels
    dtype = _uniform_dtype(layout)
    if dtype is not None:
        values = _read_exact(fh, layout, dtype, n * d).reshape(n, d)
        if not dtype.isnative:
            values = values.byteswap(inplace=True).view(dtype.newbyteorder("="))
        return values

    # General layout: mixed widths or data types, 24/40/48/56-bit integers, mixed-endian orders.
    raw = _read_exact(fh, layout, np.dtype("u1"), layout.data_bytes).reshape(n, layout.bytes_per_event)
    columns = []
    offset = 0
    for kind, width in zip(layout.datatypes, layout.widths):
        significance = _significance_for_width(layout.byte_significance, width, layout.path)
        stored = raw[:, offset:offset + width]
        if kind in _FLOAT_KINDS:
            little = np.empty((n, width), dtype=np.uint8)
            for j, s in enumerate(significance):
                little[:, s] = stored[:, j]
            columns.append(little.view("<" + _FLOAT_KINDS[kind]).reshape(n).astype(_FLOAT_KINDS[kind]))
        else:
            column = np.zeros(n, dtype=np.uint64)
            for j, s in enumerate(significance):
                column |= stored[:, j].astype(np.uint64) << np.uint64(8 * s)
            columns.append(column)
        offset += width
    if len(set(layout.datatypes)) == 1:
        return np.column_stack(columns) if columns else np.zeros((n, 0))
    return columns


def _packed_values(fh, layout: _Layout) -> np.ndarray:
    """Integers of any bit width packed back to back in one bit stream (FCS 2.0 / 3.0)."""
    n, d = layout.n_events, layout.n_channels
    per_event = sum(layout.bits)
    msb_first = _is_big_endian(layout.byte_significance)
    raw = _read_exact(fh, layout, np.dtype("u1"), layout.data_bytes)
    values = np.zeros((n, d), dtype=np.uint64)
    weights = []
    for b in layout.bits:
        powers = np.uint64(1) << np.arange(b, dtype=np.uint64)
        weights.append(powers[::-1] if msb_first else powers)
    for start in range(0, n, _PACKED_BLOCK):
        m = min(_PACKED_BLOCK, n - start)
        first_byte = start * per_event // 8
        last_byte = (start * per_event + m * per_event + 7) // 8
        stream = np.unpackbits(raw[first_byte:last_byte], bitorder="big" if msb_first else "little")
        stream = stream[:m * per_event].reshape(m, per_event)
        offset = 0
        for c, b in enumerate(layout.bits):
            values[start:start + m, c] = (stream[:, offset:offset + b].astype(np.uint64)
                                          * weights[c]).sum(axis=1, dtype=np.uint64)
            offset += b
    return values


def _ascii_values(fh, layout: _Layout) -> list[np.ndarray]:
    """ASCII event data: fixed-width fields of $PnB characters, or values separated by
    blanks / commas when $PnB is '*'."""
    n, d = layout.n_events, layout.n_channels
    raw = _read_exact(fh, layout, np.dtype("u1"), layout.data_bytes)
    if layout.storage == "ascii-delimited":
        fields = re.split(rb"[\s,]+", raw.tobytes().strip())
        fields = [f for f in fields if f]
        if len(fields) < n * d:
            raise FCSError(layout.path, f"ASCII DATA segment holds {len(fields)} values, $TOT x "
                                        f"$PAR needs {n * d}")
        try:
            values = np.array(fields[:n * d]).astype(np.float64).reshape(n, d)
        except ValueError as exc:
            raise FCSError(layout.path, f"ASCII DATA segment holds a value that is not a number "
                                        f"({exc})") from None
        return [values[:, c] for c in range(d)]
    table = raw[:n * sum(layout.bits)].reshape(n, sum(layout.bits))
    columns = []
    offset = 0
    for c, chars in enumerate(layout.bits):
        field_bytes = np.ascontiguousarray(table[:, offset:offset + chars]).view(f"S{chars}")
        try:
            columns.append(field_bytes.reshape(n).astype(np.float64))
        except ValueError as exc:
            raise FCSError(layout.path, f"ASCII DATA of channel {c + 1} ({chars} characters a "
                                        f"value) holds a value that is not a number ({exc})") from None
        offset += chars
    return columns


def _raw_values_flowio(path: Path, layout: _Layout) -> np.ndarray:
    """The same stored values through FlowIO's own DATA reader (reference / fallback path)."""
    import warnings

    with _HeaderNormalizedFile(path, layout) as handle:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                flow = flowio.FlowData(handle, ignore_offset_error=True,
                                       ignore_offset_discrepancy=True,
                                       use_header_offsets=layout.data_from == "HEADER",
                                       nextdata_offset=layout.base)
                values = flow.as_array(preprocess=False)
        except Exception as exc:  # noqa: BLE001
            raise FCSError(path, f"FlowIO cannot read the DATA segment ({exc})") from None
    if values.shape[0] < layout.n_events:
        raise FCSError(path, f"FlowIO read {values.shape[0]} events, $TOT says {layout.n_events}")
    return values[:layout.n_events]


class _HeaderNormalizedFile:
    """Read-only file view whose HEADER offsets are the validated ones (blank -> numbers).

    FlowIO's HEADER parser fails on blank offset fields (large-file writers leave them blank);
    this view shows it the offsets this module resolved instead, and never returns more bytes
    than the file holds.
    """

    def __init__(self, path: Path, layout: _Layout):
        self._fh = open(path, "rb")
        self.name = str(path)
        self._size = os.fstat(self._fh.fileno()).st_size
        h = layout.header
        start = layout.data_start - layout.base
        stop = start + max(layout.data_bytes, 1) - 1
        fields = [h.text_start, h.text_stop, start, stop, 0, 0]
        self._patch = (b"FCS" + h.version.encode() + b"    "
                       + b"".join(b"%8d" % (v if v <= HEADER_OFFSET_LIMIT else 0) for v in fields))
        self._base = layout.base

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def seek(self, offset, whence=0):
        return self._fh.seek(offset, whence)

    def tell(self):
        return self._fh.tell()

    def close(self):
        self._fh.close()

    def read(self, n=-1):
        pos = self._fh.tell()
        if n is None or n < 0 or pos + n > self._size:
            n = max(0, self._size - pos)
        data = self._fh.read(n)
        lo, hi = self._base, self._base + len(self._patch)
        if pos < hi and pos + len(data) > lo:
            buf = bytearray(data)
            for i in range(max(pos, lo), min(pos + len(data), hi)):
                buf[i - pos] = self._patch[i - lo]
            data = bytes(buf)
        return data


def _mask_to_range(layout: _Layout, c: int, column: np.ndarray) -> int:
    """Clear the bits of stored integers above $PnR (in place); the bits that remain."""
    bits = layout.bits[c]
    limit = layout.ranges[c]
    if limit is not None and limit >= 1 and _next_power_of_two(limit) < (1 << bits):
        # FCS: bits above the range are not data (some writers leave flags there).
        mask = _next_power_of_two(limit) - 1
        column &= np.asarray(mask, dtype=column.dtype)
        bits = int(math.log2(mask + 1))
    return bits


def _events_from_raw(layout: _Layout, raw: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """Masked, decoded, linear-scale events from stored values."""
    d = layout.n_channels
    transformed = [c for c in range(d) if layout.decades[c] > 0 or layout.gains[c] not in (0.0, 1.0)]
    if layout.time_index is not None and layout.timestep not in (None, 1.0):
        transformed.append(layout.time_index)

    if isinstance(raw, list):  # per-channel arrays: mixed data types, ASCII
        events = np.empty((layout.n_events, d), dtype=np.float64)
        for c, column in enumerate(raw):
            if column.dtype.kind == "u":
                _mask_to_range(layout, c, column)
            events[:, c] = column
    elif layout.datatypes[0] == "I":
        effective_bits = [_mask_to_range(layout, c, raw[:, c]) for c in range(d)]
        exact_in_float32 = max(effective_bits) <= 24 and not transformed
        events = raw.astype(np.float32 if exact_in_float32 else np.float64)
    else:
        events = raw

    for c in transformed:
        column = events[:, c]
        if layout.decades[c] > 0:
            column[:] = np.power(10.0, layout.decades[c] * column / layout.ranges[c]) * layout.log_zero[c]
        elif layout.gains[c] not in (0.0, 1.0):
            column /= layout.gains[c]
        if c == layout.time_index and layout.timestep not in (None, 1.0):
            _scale_time(layout, column)
    return events


def _scale_time(layout: _Layout, column: np.ndarray) -> None:
    """Multiply the time channel by $TIMESTEP in place (in the column's own precision, as
    always); an FCSError naming the keyword when a stored tick would become infinite or leave
    float32's range, never a numpy overflow warning.

    The layout already ignores a $TIMESTEP that overflows the channel's declared range; this
    catches floating-point ticks beyond their $PnR."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = column * layout.timestep
        overflow = ~(np.abs(scaled) <= FLOAT32_MAX) & np.isfinite(column)
    if overflow.any():
        tick = column[int(np.flatnonzero(overflow)[0])]
        raise FCSError(layout.path, f"$TIMESTEP = {layout.timestep:g} scales the time channel "
                                    f"{layout.pnn[layout.time_index]} beyond the largest number the "
                                    f"events can hold (a stored value of {tick:g} ticks becomes "
                                    f"{float(tick) * layout.timestep:g}); the file's $TIMESTEP is wrong")
    column[:] = scaled


def _check_finite(layout: _Layout, events: np.ndarray) -> None:
    # A dot product (BLAS) propagates NaN/inf and is cheaper than isfinite() over the whole
    # array; only when it is not finite (NaN/inf present, or squares that overflow) look closer.
    flat = events.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):  # large finite values square to inf
        if flat.size == 0 or np.isfinite(np.dot(flat, flat)):
            return
    bad = ~np.isfinite(events)
    count = int(bad.sum())
    if count:
        channels = [layout.pnn[c] for c in np.flatnonzero(bad.any(axis=0))[:5]]
        raise FCSError(layout.path, f"DATA segment holds {count} NaN/infinite values (channels "
                                    f"{', '.join(channels)}): the file is damaged or was written "
                                    "incorrectly")


def exact_in_float32(events: np.ndarray, block: int = 262_144) -> bool:
    """True when every value of ``events`` survives a round trip through float32."""
    if events.dtype == np.float32 or events.size == 0:
        return True
    flat = events.reshape(-1)
    for start in range(0, flat.size, block):
        part = np.asarray(flat[start:start + block], dtype=np.float64)
        with np.errstate(over="ignore"):
            if not np.array_equal(part.astype(np.float32).astype(np.float64), part):
                return False
    return True
