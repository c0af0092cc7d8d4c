"""Reading and writing FCS files (versions 2.0, 3.0, 3.1).

FlowIO tokenizes the TEXT segment and remains available as a complete second reader
(``engine="flowio"``); this module adds what real instrument files need on top of it:

* every number taken from the HEADER or TEXT is checked against the file size *before*
  anything is allocated, so a damaged keyword cannot ask for terabytes;
* the DATA segment is located from whichever of HEADER / TEXT offsets agrees with
  ``$TOT x bytes per event`` (blank or zero HEADER offsets, off-by-one ``$ENDDATA``,
  HEADER/TEXT disagreements);
* several data sets per file (``$NEXTDATA``);
* any ``$BYTEORD`` permutation and any byte-aligned ``$PnB`` width (8, 16, 24, 32, 64 bits,
  mixed), integer data masked to ``$PnR``;
* ``$PnE`` log amplification decoded, ``$PnG`` gain and ``$TIMESTEP`` applied (as FlowIO and
  FlowKit do), duplicate ``$PnN`` names made unique;
* spillover from ``$SPILLOVER``, ``SPILL`` or ``$SPILL``.

The DATA segment of the common uniform-width files is read with one ``numpy.fromfile`` call
(the reading speed is then the disk's); unusual layouts go through a byte-level numpy path.
Every way a file can be unreadable becomes one exception type, :class:`FCSError`, whose message
names the file and the problem.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import flowio
import numpy as np

from gating_core.errors import GatingCoreError

__all__ = ["FCSError", "Channel", "Sample", "read_fcs", "read_fcs_all", "write_fcs", "fcs_info"]

HEADER_LENGTH = 58
SUPPORTED_VERSIONS = ("2.0", "3.0", "3.1")
MAX_DATA_SETS = 10_000
# FCS 3.1: HEADER offsets above this are written as 0 (or left blank).
HEADER_OFFSET_LIMIT = 99_999_999


class FCSError(GatingCoreError):
    """An FCS file could not be read (or written). ``str(err)`` names the file and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")


@dataclass
class Channel:
    """One measured parameter: ``pnn`` is its short name ($PnN), ``pns`` its stain/marker ($PnS)."""

    pnn: str
    pns: str = ""
    range: float | None = None

    @property
    def label(self) -> str:
        """Human-readable label: ``"CD4 (FL1-A)"`` when a marker is set, else the $PnN."""
        if self.pns and self.pns != self.pnn:
            return f"{self.pns} ({self.pnn})"
        return self.pnn


@dataclass
class Sample:
    """One data set of an FCS file.

    Attributes
    ----------
    name : str
        File stem, or ``"<stem>#<k>"`` (k from 1) when the file holds several data sets.
    events : ndarray of shape (n_events, n_channels), float32 or float64
        Linear-scale values ($PnE log amplification decoded, $PnG gain divided out, time channel
        multiplied by $TIMESTEP). float32 when the file stores float32 or small unscaled
        integers (exact), float64 otherwise.
    channels : list of Channel
        $PnN names are unique (a repeated name gets ``_2``, ``_3``... appended).
    keywords : dict of str -> str
        The TEXT segment, keys upper-cased, with their leading ``$`` when the file had one.
    spillover : ndarray of shape (k, k) or None
    spillover_channels : list of str
        The (unique) $PnN names the spillover matrix applies to, in its order.
    version : str
        ``"2.0"``, ``"3.0"`` or ``"3.1"``.
    path : str or None
    compensated : bool
    notes : list of str
        Things the reader tolerated or could not interpret (e.g. an unparseable spillover
        keyword, an off-by-one $ENDDATA), for display; empty for a clean file.
    """

    name: str
    events: np.ndarray
    channels: list[Channel]
    keywords: dict[str, str] = field(default_factory=dict)
    spillover: np.ndarray | None = None
    spillover_channels: list[str] = field(default_factory=list)
    version: str = "3.1"
    path: str | None = None
    compensated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def n_events(self) -> int:
        return int(self.events.shape[0])

    @property
    def pnn(self) -> list[str]:
        return [c.pnn for c in self.channels]

    @property
    def pns(self) -> list[str]:
        return [c.pns for c in self.channels]

    @property
    def has_spillover(self) -> bool:
        return self.spillover is not None

    def channel_index(self, name: str) -> int:
        """Index of a channel by $PnN, else by $PnS (case-insensitive); KeyError if absent."""
        for i, c in enumerate(self.channels):
            if c.pnn == name:
                return i
        lowered = name.casefold()
        for i, c in enumerate(self.channels):
            if c.pnn.casefold() == lowered or (c.pns and c.pns.casefold() == lowered):
                return i
        raise KeyError(f"{self.name}: no channel named {name!r}")

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame(self.events, columns=self.pnn, copy=False)

    def compensate(self) -> "Sample":
        """Return a copy with the spillover matrix applied (events @ inv(S) on its channels).

        A sample without spillover (or already compensated) is returned unchanged.
        Raises FCSError when the matrix cannot be inverted.
        """
        if self.spillover is None or self.compensated:
            return self
        idx = [self.channel_index(n) for n in self.spillover_channels]
        dtype = np.float64 if self.events.dtype == np.float64 else np.float32
        events = np.array(self.events, dtype=dtype)
        try:
            inverse = np.linalg.inv(np.asarray(self.spillover, dtype=np.float64))
        except np.linalg.LinAlgError:
            raise FCSError(self.path or self.name, "the spillover matrix is singular and cannot be "
                           "used for compensation") from None
        if not np.all(np.isfinite(inverse)):
            raise FCSError(self.path or self.name, "the spillover matrix is numerically singular")
        # Row blocks keep the float64 temporaries small whatever the file size.
        for start in range(0, len(events), 262_144):
            block = events[start:start + 262_144]
            block[:, idx] = (block[:, idx].astype(np.float64) @ inverse).astype(dtype)
        return Sample(self.name, events, list(self.channels), dict(self.keywords), self.spillover,
                      list(self.spillover_channels), self.version, self.path, compensated=True,
                      notes=list(self.notes))


# --------------------------------------------------------------------------------------------
# HEADER and TEXT
# --------------------------------------------------------------------------------------------

@dataclass
class _Header:
    version: str
    text_start: int | None
    text_stop: int | None
    data_start: int | None
    data_stop: int | None
    analysis_start: int | None
    analysis_stop: int | None


_HEADER_FIELDS = (("TEXT start", 10), ("TEXT end", 18), ("DATA start", 26), ("DATA end", 34),
                  ("ANALYSIS start", 42), ("ANALYSIS end", 50))


def _parse_header(raw: bytes, path, base: int) -> _Header:
    where = "" if base == 0 else f" of the data set at byte {base}"
    if len(raw) < HEADER_LENGTH:
        if base == 0:
            raise FCSError(path, f"file is {len(raw)} bytes long, too short to hold an FCS HEADER "
                                 f"({HEADER_LENGTH} bytes)")
        raise FCSError(path, f"$NEXTDATA points to byte {base}, too close to the end of the file "
                             "for another data set")
    if raw[:3] != b"FCS":
        shown = raw[:10].decode("latin-1").encode("unicode_escape").decode("ascii")
        raise FCSError(path, f"not an FCS file: the HEADER{where} starts with {shown!r} instead "
                             "of 'FCS'")
    version = raw[3:6].decode("latin-1")
    if version not in SUPPORTED_VERSIONS:
        raise FCSError(path, f"unsupported FCS version {version!r} (supported: 2.0, 3.0, 3.1)")
    values = []
    for label, start in _HEADER_FIELDS:
        text = raw[start:start + 8].decode("latin-1").strip()
        if text == "":
            values.append(None)
        elif text.isdigit():
            values.append(int(text))
        elif label.startswith("ANALYSIS"):
            values.append(None)  # never needed to read events
        else:
            raise FCSError(path, f"HEADER field '{label}'{where} is not a number: {text!r}")
    return _Header(version, *values)


# FlowIO's TEXT tokenizer (handles delimiter choice and doubled delimiters; returns lower-case
# keys without '$').
_parse_pairs = flowio.FlowData._FlowData__parse_pairs


def _decode_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _tokenize_text(text: str, path, segment: str) -> tuple[dict[str, str], set[str]]:
    """Keywords (lower-case, no '$') and the set of keyword names written with a '$'."""
    if len(text) < 2:
        raise FCSError(path, f"the {segment} segment is empty")
    try:
        pairs = _parse_pairs(text)
    except Exception as exc:  # noqa: BLE001 - FlowIO raises assorted types on garbage
        raise FCSError(path, f"the {segment} segment cannot be parsed ({exc})") from None
    delimiter = re.escape(text[0])
    dollar_names = {m.lower() for m in re.findall(f"{delimiter}\\$([^{delimiter}]+)", text)}
    return pairs, dollar_names


# --------------------------------------------------------------------------------------------
# One data set's layout (everything but the event values)
# --------------------------------------------------------------------------------------------

@dataclass
class _Layout:
    path: Path
    base: int                      # byte offset of this data set's HEADER
    header: _Header
    text: dict[str, str]           # lower-case keys, no '$'
    keywords: dict[str, str]       # display keys
    n_events: int
    n_channels: int
    datatype: str                  # 'I', 'F', 'D'
    byte_significance: list[int]   # BYTEORD as 0-based significance of each stored byte
    widths: list[int]              # bytes per value, per channel
    ranges: list[float | None]
    pnn: list[str]
    pns: list[str]
    decades: list[float]
    log_zero: list[float]
    gains: list[float]
    time_index: int | None
    timestep: float | None
    data_start: int                # absolute file offsets, inclusive start
    data_bytes: int                # bytes the events occupy (n_events * bytes per event)
    data_from: str                 # 'TEXT' or 'HEADER'
    nextdata: int
    notes: list[str]

    @property
    def bytes_per_event(self) -> int:
        return sum(self.widths)


def _int_keyword(text, key, path, *, required=True, default=None, minimum=0):
    raw = text.get(key)
    if raw is None or raw.strip() == "":
        if required:
            raise FCSError(path, f"TEXT segment lacks the required keyword ${key.upper()}")
        return default
    value = raw.strip()
    if not re.fullmatch(r"[+-]?\d+", value):
        raise FCSError(path, f"${key.upper()} is not an integer: {value[:40]!r}")
    number = int(value)
    if number < minimum:
        raise FCSError(path, f"${key.upper()} is {number}, below the minimum {minimum}")
    return number


def _float_value(raw: str, what: str, path) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise FCSError(path, f"{what} is not a number: {raw.strip()[:40]!r}") from None
    if not math.isfinite(value):
        raise FCSError(path, f"{what} is not finite: {raw.strip()!r}")
    return value


def _byte_significance(byteord: str, path) -> list[int]:
    parts = [p for p in re.split(r"[,\s]+", byteord.strip()) if p]
    try:
        order = [int(p) for p in parts]
    except ValueError:
        raise FCSError(path, f"$BYTEORD is not a list of byte numbers: {byteord[:40]!r}") from None
    if sorted(order) != list(range(1, len(order) + 1)) or len(order) not in (1, 2, 3, 4, 8):
        raise FCSError(path, f"$BYTEORD {byteord.strip()!r} is not a permutation of 1..n")
    return [o - 1 for o in order]


def _significance_for_width(order: list[int], width: int, path) -> list[int]:
    """Significance of each stored byte of a ``width``-byte value under $BYTEORD ``order``."""
    if len(order) == width:
        return order
    if order == sorted(order):
        return list(range(width))
    if order == sorted(order, reverse=True):
        return list(range(width - 1, -1, -1))
    raise FCSError(path, f"$BYTEORD {','.join(str(o + 1) for o in order)} cannot be applied to "
                         f"{8 * width}-bit values")


def _display_keywords(text: dict[str, str], dollar_names: set[str]) -> dict[str, str]:
    return {("$" + k.upper() if k in dollar_names else k.upper()): v for k, v in text.items()}


def _unique_names(names: list[str]) -> list[str]:
    seen = set(names)
    counts: dict[str, int] = {}
    unique = []
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == 1:
            unique.append(name)
            continue
        k = counts[name]
        while f"{name}_{k}" in seen:
            k += 1
        candidate = f"{name}_{k}"
        seen.add(candidate)
        unique.append(candidate)
    return unique


def _next_power_of_two(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(x))) if x > 1 else 1


def _parse_layout(fh, path: Path, base: int, file_size: int) -> _Layout:
    fh.seek(base)
    header = _parse_header(fh.read(HEADER_LENGTH), path, base)
    notes: list[str] = []
    if header.text_start is None or header.text_stop is None:
        raise FCSError(path, "HEADER does not give the TEXT segment's offsets")
    if not (HEADER_LENGTH <= header.text_start <= header.text_stop):
        raise FCSError(path, f"HEADER gives an impossible TEXT segment (bytes {header.text_start}"
                             f"-{header.text_stop})")
    if base + header.text_stop >= file_size:
        raise FCSError(path, f"file is truncated: the TEXT segment should end at byte "
                             f"{base + header.text_stop} but the file has {file_size} bytes")
    fh.seek(base + header.text_start)
    raw_text = _decode_text(fh.read(header.text_stop - header.text_start + 1))
    text, dollar_names = _tokenize_text(raw_text, path, "TEXT")

    # Supplemental TEXT (FCS 3.x) adds keywords; the primary TEXT wins on conflicts.
    s_start = _int_keyword(text, "beginstext", path, required=False, default=0)
    s_stop = _int_keyword(text, "endstext", path, required=False, default=0)
    if s_start and s_stop > s_start and base + s_stop < file_size:
        fh.seek(base + s_start)
        extra_text = _decode_text(fh.read(s_stop - s_start + 1))
        try:
            extra, extra_dollar = _tokenize_text(extra_text, path, "supplemental TEXT")
            text = {**extra, **text}
            dollar_names |= extra_dollar
        except FCSError as exc:
            notes.append(f"supplemental TEXT ignored: {exc.problem}")

    n_channels = _int_keyword(text, "par", path, minimum=1)
    if n_channels > len(text):
        raise FCSError(path, f"$PAR says {n_channels} channels but the TEXT segment has only "
                             f"{len(text)} keywords")
    datatype = text.get("datatype", "").strip().upper()
    if datatype == "A":
        raise FCSError(path, "ASCII event data ($DATATYPE A) is not supported")
    if datatype not in ("I", "F", "D"):
        raise FCSError(path, f"$DATATYPE must be I, F or D, found {datatype[:20]!r}")
    mode = text.get("mode", "L").strip().upper() or "L"
    if mode != "L":
        raise FCSError(path, f"histogram data ($MODE {mode}) is not supported, only list mode (L)")
    if "byteord" not in text:
        raise FCSError(path, "TEXT segment lacks the required keyword $BYTEORD")
    order = _byte_significance(text["byteord"], path)

    widths, ranges, pnn, pns, decades, log_zero, gains = [], [], [], [], [], [], []
    text_gain_ignored: set[int] = set()
    for i in range(1, n_channels + 1):
        raw_bits = text.get(f"p{i}b", "").strip()
        if datatype == "F":
            bits = 32
        elif datatype == "D":
            bits = 64
        else:
            if not raw_bits.isdigit():
                raise FCSError(path, f"$P{i}B (bits of channel {i}) is missing or not a number: "
                                     f"{raw_bits[:20]!r}")
            bits = int(raw_bits)
            if bits == 0 or bits % 8 or bits > 64:
                raise FCSError(path, f"$P{i}B = {bits}: only byte-aligned integer widths up to "
                                     "64 bits are supported")
        if datatype in "FD" and raw_bits.isdigit() and int(raw_bits) != bits:
            notes.append(f"$P{i}B is {raw_bits} but $DATATYPE {datatype} means {bits} bits; "
                         f"read as {bits}")
        widths.append(bits // 8)

        raw_range = text.get(f"p{i}r")
        ranges.append(_float_value(raw_range, f"$P{i}R", path) if raw_range and raw_range.strip()
                      else None)

        name = text.get(f"p{i}n", "").strip()
        pnn.append(name or f"P{i}")
        pns.append(text.get(f"p{i}s", "").strip())

        f1, f2 = 0.0, 0.0
        raw_e = text.get(f"p{i}e", "").strip()
        if raw_e:
            parts = raw_e.split(",")
            if len(parts) != 2:
                raise FCSError(path, f"$P{i}E must be 'decades,offset', found {raw_e[:40]!r}")
            f1 = _float_value(parts[0], f"$P{i}E", path)
            f2 = _float_value(parts[1], f"$P{i}E", path)
        if f1 < 0:
            raise FCSError(path, f"$P{i}E has negative decades: {raw_e!r}")
        if f1 > 0 and datatype != "I":
            # FCS 3.1: floating-point data are linear; $PnE must be 0,0. Guava writes log10
            # values with $PnE 4,1 -- decoding them with the integer formula would be garbage.
            notes.append(f"$P{i}E = {raw_e}: floating-point values kept as stored (FCS 3.1: "
                         "float data are not log-amplified)")
            f1 = 0.0
            raw_g = text.get(f"p{i}g", "").strip()
            if raw_g and _float_value(raw_g, f"$P{i}G", path) not in (0.0, 1.0):
                notes.append(f"$P{i}G = {raw_g} not applied to channel {i}: its $PnE marks it "
                             "logarithmic")
            text_gain_ignored.add(i)
        if f1 > 0:
            if ranges[-1] is None or ranges[-1] <= 0:
                raise FCSError(path, f"channel {i} is log-amplified ($P{i}E {raw_e}) but has no "
                                     "valid $P{i}R to decode it")
            if f2 == 0:
                f2 = 1.0  # FCS standard: 0 is invalid here, use 1
        decades.append(f1)
        log_zero.append(f2)

        raw_g = text.get(f"p{i}g", "").strip()
        gain = _float_value(raw_g, f"$P{i}G", path) if raw_g else 1.0
        # FCS 3.1: $PnG applies to linear channels only.
        gains.append(1.0 if f1 > 0 or i in text_gain_ignored else gain)

    # Time channel: scaled by $TIMESTEP, its $PnG ignored (FlowIO / FlowKit convention).
    time_index = next((i for i, n in enumerate(pnn) if n.lower() == "time"), None)
    timestep = None
    if time_index is not None and text.get("timestep", "").strip():
        try:
            timestep = _float_value(text["timestep"], "$TIMESTEP", path)
        except FCSError as exc:
            notes.append(f"{exc.problem}; time channel left in clock ticks")
    if time_index is not None:
        gains[time_index] = 1.0

    bytes_per_event = sum(widths)
    declared_events = _int_keyword(text, "tot", path, required=False)
    data_start, data_bytes, data_from, n_events = _locate_data(
        path, header, text, base, file_size, bytes_per_event, declared_events, notes)

    nextdata = _int_keyword(text, "nextdata", path, required=False, default=0, minimum=-(1 << 62))
    return _Layout(path, base, header, text, _display_keywords(text, dollar_names), n_events,
                   n_channels, datatype, order, widths, ranges, pnn, pns, decades, log_zero, gains,
                   time_index, timestep, data_start, data_bytes, data_from, nextdata, notes)


def _locate_data(path, header, text, base, file_size, bytes_per_event, declared_events, notes):
    """Choose the DATA segment among the HEADER and TEXT offsets.

    The event count $TOT times the bytes per event is what the segment must hold; the
    candidate whose length matches (exactly, or one byte long -- a common writer bug) wins.
    Returns (absolute start, bytes to read, source, events).
    """
    candidates = []
    text_start = _int_keyword(text, "begindata", path, required=False) if "begindata" in text else None
    text_stop = _int_keyword(text, "enddata", path, required=False) if "enddata" in text else None
    from_text = (text_start, text_stop, "TEXT")
    from_header = (header.data_start, header.data_stop, "HEADER")
    # FCS 2.0 defines the offsets in the HEADER only; 3.x prefers TEXT (HEADER may be 0 for
    # large files).
    for start, stop, source in ((from_header, from_text) if header.version == "2.0"
                                else (from_text, from_header)):
        if start is None or stop is None or start <= 0 or stop < start:
            continue
        if (start, stop) in [(c[0], c[1]) for c in candidates]:
            continue
        candidates.append((start, stop, source))
    if not candidates:
        if declared_events == 0:
            return base, 0, "TEXT", 0
        raise FCSError(path, "neither the HEADER nor the TEXT segment gives a usable DATA "
                             "segment location")

    if declared_events is None:
        start, stop, source = candidates[0]
        length = stop - start + 1
        if length % bytes_per_event not in (0, 1):
            raise FCSError(path, f"$TOT is missing and the DATA segment ({length} bytes) is not a "
                                 f"whole number of {bytes_per_event}-byte events")
        declared_events = length // bytes_per_event
        notes.append("$TOT missing; event count taken from the DATA segment length")

    needed = declared_events * bytes_per_event
    problems = []
    for exact_only in (True, False):
        for start, stop, source in candidates:
            length = stop - start + 1
            available = file_size - (base + start)
            if available <= 0:
                problems.append(f"the file ends at byte {file_size}, before its DATA segment "
                                f"(byte {base + start}, {source} offsets): it holds only HEADER "
                                "and TEXT, or was cut short")
                continue
            if needed > available:
                problems.append(
                    f"$TOT = {declared_events} events x {bytes_per_event} bytes = {needed} bytes "
                    f"from byte {base + start} ({source} offsets), but only {max(available, 0)} "
                    "bytes follow")
                continue
            if exact_only and length not in (needed, needed + 1, needed - 1):
                continue
            if length != needed:
                notes.append(f"DATA segment per {source} offsets is {length} bytes, expected "
                             f"{needed}; read {needed} bytes from byte {base + start}")
            if source != candidates[0][2]:
                notes.append(f"DATA located from the {source} offsets (the "
                             f"{candidates[0][2]} offsets do not fit $TOT)")
            return base + start, needed, source, declared_events
    # No candidate fits: the file is shorter than its keywords claim.
    raise FCSError(path, "file is truncated or its offsets are wrong: " + problems[0]
                   if problems else "the DATA segment cannot be located")


def _walk_layouts(fh, path: Path, file_size: int) -> list[_Layout]:
    """Layouts of the data sets in file order (TEXT only; the events are not read)."""
    layouts = []
    base = 0
    seen = set()
    while True:
        layout = _parse_layout(fh, path, base, file_size)
        layouts.append(layout)
        if layout.nextdata == 0:
            return layouts
        next_base = base + layout.nextdata
        if layout.nextdata < 0 or next_base >= file_size or next_base in seen:
            # A broken chain after valid data sets: keep what was read, say so.
            layout.notes.append(f"$NEXTDATA {layout.nextdata} does not point to another data set "
                                "inside the file; ignored")
            return layouts
        if len(layouts) >= MAX_DATA_SETS:
            raise FCSError(path, f"more than {MAX_DATA_SETS} data sets chained by $NEXTDATA")
        seen.add(next_base)
        base = next_base


# --------------------------------------------------------------------------------------------
# DATA
# --------------------------------------------------------------------------------------------

_FLOAT_KINDS = {"F": "f4", "D": "f8"}
_INT_KINDS = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}


def _uniform_dtype(layout: _Layout) -> np.dtype | None:
    """numpy dtype for one value when every channel shares a plain layout, else None."""
    width = layout.widths[0]
    if any(w != width for w in layout.widths):
        return None
    significance = _significance_for_width(layout.byte_significance, width, layout.path)
    if significance == list(range(width)):
        endian = "<"
    elif significance == list(range(width - 1, -1, -1)):
        endian = ">"
    else:
        return None
    kind = _FLOAT_KINDS.get(layout.datatype) or _INT_KINDS.get(width)
    return None if kind is None else np.dtype(endian + kind)


def _read_exact(fh, layout: _Layout, dtype: np.dtype, count: int) -> np.ndarray:
    fh.seek(layout.data_start)
    values = np.fromfile(fh, dtype=dtype, count=count)
    if values.size != count:
        raise FCSError(layout.path, f"file is truncated: the DATA segment ended after "
                                    f"{values.size * dtype.itemsize} of {layout.data_bytes} bytes")
    return values


def _raw_values(fh, layout: _Layout) -> np.ndarray:
    """Stored values, shape (n_events, n_channels): native floats or unsigned integers."""
    n, d = layout.n_events, layout.n_channels
    dtype = _uniform_dtype(layout)
    if dtype is not None:
        values = _read_exact(fh, layout, dtype, n * d).reshape(n, d)
        if not dtype.isnative:
            values = values.byteswap(inplace=True).view(dtype.newbyteorder("="))
        return values

    # General layout: mixed widths, 24/40/48/56-bit integers, mixed-endian byte orders.
    raw = _read_exact(fh, layout, np.dtype("u1"), layout.data_bytes).reshape(n, layout.bytes_per_event)
    if layout.datatype in _FLOAT_KINDS:
        width = layout.widths[0]
        significance = _significance_for_width(layout.byte_significance, width, layout.path)
        little = np.empty((n * d, width), dtype=np.uint8)
        stored = raw.reshape(n * d, width)
        for j, s in enumerate(significance):
            little[:, s] = stored[:, j]
        return little.view("<" + _FLOAT_KINDS[layout.datatype]).reshape(n, d).astype(
            _FLOAT_KINDS[layout.datatype])
    values = np.zeros((n, d), dtype=np.uint64)
    offset = 0
    for c, width in enumerate(layout.widths):
        significance = _significance_for_width(layout.byte_significance, width, layout.path)
        column = values[:, c]
        for j, s in enumerate(significance):
            column |= raw[:, offset + j].astype(np.uint64) << np.uint64(8 * s)
        offset += width
    return values


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


def _events_from_raw(layout: _Layout, raw: np.ndarray) -> np.ndarray:
    """Masked, decoded, linear-scale events from stored values."""
    d = layout.n_channels
    transformed = [c for c in range(d) if layout.decades[c] > 0 or layout.gains[c] not in (0.0, 1.0)]
    if layout.time_index is not None and layout.timestep not in (None, 1.0):
        transformed.append(layout.time_index)

    if layout.datatype == "I":
        effective_bits = []
        for c in range(d):
            bits = 8 * layout.widths[c]
            limit = layout.ranges[c]
            if limit is not None and limit >= 1 and _next_power_of_two(limit) < (1 << bits):
                # FCS: bits above the range are not data (some writers leave flags there).
                mask = _next_power_of_two(limit) - 1
                raw[:, c] &= np.asarray(mask, dtype=raw.dtype)
                bits = int(math.log2(mask + 1))
            effective_bits.append(bits)
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
            column *= layout.timestep
    return events


def _check_finite(layout: _Layout, events: np.ndarray) -> None:
    # A dot product (BLAS) propagates NaN/inf and is cheaper than isfinite() over the whole
    # array; only when it is not finite (NaN/inf present, or squares that overflow) look closer.
    flat = events.reshape(-1)
    if flat.size == 0 or np.isfinite(np.dot(flat, flat)):
        return
    bad = ~np.isfinite(events)
    count = int(bad.sum())
    if count:
        channels = [layout.pnn[c] for c in np.flatnonzero(bad.any(axis=0))[:5]]
        raise FCSError(layout.path, f"DATA segment holds {count} NaN/infinite values (channels "
                                    f"{', '.join(channels)}): the file is damaged or was written "
                                    "incorrectly")


# --------------------------------------------------------------------------------------------
# Spillover
# --------------------------------------------------------------------------------------------

SPILLOVER_KEYWORDS = ("spillover", "spill")  # FlowIO folds $SPILL and SPILL into "spill"


def _parse_spillover(layout: _Layout, unique_pnn: list[str]):
    """(matrix, channel names) from $SPILLOVER / SPILL / $SPILL, or (None, []) with a note."""
    for key in SPILLOVER_KEYWORDS:
        value = layout.text.get(key, "").strip()
        if not value:
            continue
        label = "$SPILLOVER" if key == "spillover" else "$SPILL/SPILL"
        parts = [p.strip() for p in value.replace("\n", ",").split(",")]
        try:
            k = int(float(parts[0]))
        except ValueError:
            layout.notes.append(f"{label} ignored: it does not start with the channel count")
            return None, []
        if k < 1 or len(parts) != 1 + k + k * k:
            layout.notes.append(f"{label} ignored: {k} channels need {1 + k + k * k} values, "
                                f"found {len(parts)}")
            return None, []
        names, numbers = parts[1:1 + k], parts[1 + k:]
        try:
            matrix = np.array([float(x) for x in numbers], dtype=np.float64).reshape(k, k)
        except ValueError:
            layout.notes.append(f"{label} ignored: its matrix holds non-numbers")
            return None, []
        if not np.all(np.isfinite(matrix)):
            layout.notes.append(f"{label} ignored: its matrix holds non-finite values")
            return None, []
        resolved = []
        for name in names:
            index = _resolve_channel(name, layout)
            if index is None:
                layout.notes.append(f"{label} ignored: it names channel {name!r}, which the file "
                                    "does not have")
                return None, []
            resolved.append(unique_pnn[index])
        if len(set(resolved)) != k:
            layout.notes.append(f"{label} ignored: it names a channel twice")
            return None, []
        return matrix, resolved
    return None, []


def _resolve_channel(name: str, layout: _Layout) -> int | None:
    if name in layout.pnn:
        return layout.pnn.index(name)
    if name in layout.pns:
        return layout.pns.index(name)
    if name.isdigit() and 1 <= int(name) <= layout.n_channels:
        return int(name) - 1  # some writers refer to channels by number
    return None


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def _open(path: Path):
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise FCSError(path, "file not found") from None
    except IsADirectoryError:
        raise FCSError(path, "is a directory, not an FCS file") from None
    except OSError as exc:
        raise FCSError(path, f"cannot be opened ({exc.strerror or exc})") from None
    return fh


def _names(path: Path, count: int) -> list[str]:
    return [path.stem] if count == 1 else [f"{path.stem}#{k}" for k in range(1, count + 1)]


def _sample_from_layout(fh, layout: _Layout, name: str, engine: str, compensate: bool) -> Sample:
    if engine == "numpy":
        raw = _raw_values(fh, layout)
    elif engine == "flowio":
        raw = _raw_values_flowio(layout.path, layout)
        if layout.datatype == "I":
            raw = raw.astype(np.uint64)
        elif layout.datatype == "F":
            raw = raw.astype(np.float32)
    else:
        raise ValueError(f"engine must be 'numpy' or 'flowio', not {engine!r}")
    events = _events_from_raw(layout, raw)
    _check_finite(layout, events)
    unique_pnn = _unique_names(layout.pnn)
    if unique_pnn != layout.pnn:
        layout.notes.append("duplicate $PnN names made unique: " + ", ".join(
            u for u, o in zip(unique_pnn, layout.pnn) if u != o))
    channels = [Channel(u, s, r) for u, s, r in zip(unique_pnn, layout.pns, layout.ranges)]
    spillover, spill_channels = _parse_spillover(layout, unique_pnn)
    sample = Sample(name, events, channels, layout.keywords, spillover, spill_channels,
                    layout.header.version, str(layout.path), compensated=False,
                    notes=list(layout.notes))
    if compensate:
        broken = [n for n in layout.notes if "SPILL" in n and "ignored" in n]
        if broken:
            raise FCSError(layout.path, f"compensation requested but {broken[0]}")
        sample = sample.compensate()
    return sample


def read_fcs(path: str | os.PathLike, dataset: int = 0, compensate: bool = False, *,
             engine: str = "numpy") -> Sample:
    """Read one data set of an FCS file.

    Parameters
    ----------
    path : path of an FCS 2.0 / 3.0 / 3.1 file.
    dataset : index (from 0) of the data set to read when the file holds several ($NEXTDATA).
    compensate : apply the file's spillover matrix (no-op when the file has none).
    engine : ``"numpy"`` (fast) or ``"flowio"`` (FlowIO's DATA reader; same results).

    Returns
    -------
    Sample with ``events`` of shape (n_events, n_channels).

    Raises
    ------
    FCSError naming the file and the problem (missing, truncated, corrupted, unsupported).
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        layouts = _walk_layouts(fh, path, file_size)
        if not 0 <= dataset < len(layouts):
            raise FCSError(path, f"data set {dataset} requested but the file holds {len(layouts)}")
        name = _names(path, len(layouts))[dataset]
        return _sample_from_layout(fh, layouts[dataset], name, engine, compensate)


def read_fcs_all(path: str | os.PathLike, compensate: bool = False, *,
                 engine: str = "numpy") -> list[Sample]:
    """Read every data set of an FCS file; names are ``<stem>#<k>`` when there are several."""
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        layouts = _walk_layouts(fh, path, file_size)
        names = _names(path, len(layouts))
        return [_sample_from_layout(fh, layout, name, engine, compensate)
                for layout, name in zip(layouts, names)]


def fcs_info(path: str | os.PathLike) -> dict:
    """Describe an FCS file without reading its events (offsets and sizes are validated).

    Returns a JSON-ready dict: ``file``, ``version``, ``n_datasets`` and ``datasets``, a list of
    ``{name, events, n_channels, channels: [{pnn, pns}], datatype, spillover,
    spillover_channels, notes}``. Raises FCSError.
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        layouts = _walk_layouts(fh, path, file_size)
    names = _names(path, len(layouts))
    datasets = []
    for layout, name in zip(layouts, names):
        unique_pnn = _unique_names(layout.pnn)
        spillover, spill_channels = _parse_spillover(layout, unique_pnn)
        datasets.append({
            "name": name,
            "events": layout.n_events,
            "n_channels": layout.n_channels,
            "channels": [{"pnn": n, "pns": s} for n, s in zip(unique_pnn, layout.pns)],
            "datatype": layout.datatype,
            "spillover": spillover is not None,
            "spillover_channels": spill_channels,
            "notes": list(layout.notes),
        })
    return {"file": str(path), "version": layouts[0].header.version,
            "n_datasets": len(layouts), "datasets": datasets}


def _fcs_text_value(key: str, value: str, path) -> str:
    value = str(value)
    if value == "":
        raise FCSError(path, f"keyword {key!r} has an empty value, which FCS does not allow")
    # FlowIO (our writer's delimiter is '/') mis-splits values that start or end with it.
    if value.startswith("/") or value.endswith("/") or "/" in str(key):
        raise FCSError(path, f"keyword {key!r}: names and values must not start or end with '/' "
                             f"(found {value[:40]!r})")
    return value


def write_fcs(path: str | os.PathLike, events: np.ndarray, pnn: list[str], pns: list[str] | None = None,
              keywords: dict[str, str] | None = None) -> None:
    """Write an FCS 3.1 file of float32 events with the given $PnN / $PnS and extra keywords.

    ``events`` has shape (n_events, len(pnn)). The file appears atomically (temp + rename).
    Keyword names may carry a leading ``$``; values must be non-empty text.
    """
    from array import array

    path = Path(path)
    events = np.asarray(events)
    if events.ndim != 2 or events.shape[1] != len(pnn):
        raise FCSError(path, f"events of shape {events.shape} do not match {len(pnn)} channel names")
    events = np.ascontiguousarray(events, dtype="<f4")
    if not np.all(np.isfinite(events)):
        raise FCSError(path, "events hold NaN or infinite values, which FCS cannot store portably")
    names = [str(n) for n in pnn]
    if len(set(names)) != len(names) or any(n.strip() == "" for n in names):
        raise FCSError(path, "channel names ($PnN) must be unique and non-empty")
    metadata = {k: _fcs_text_value(k, v, path) for k, v in (keywords or {}).items()}
    for i, name in enumerate(names + [str(s) for s in (pns or []) if str(s)], start=1):
        _fcs_text_value(f"channel name {i}", name, path)
    flat = array("f")
    flat.frombytes(events.tobytes())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as handle:
            flowio.create_fcs(handle, flat, names,
                              opt_channel_names=[str(s) for s in pns] if pns else None,
                              metadata_dict=metadata)
        os.replace(tmp, path)
    except OSError as exc:
        raise FCSError(path, f"cannot be written ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
