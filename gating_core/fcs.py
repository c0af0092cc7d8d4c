"""Reading and writing FCS files (versions 2.0, 3.0, 3.1, 3.2).

The TEXT segment is tokenised here (FlowIO remains available as a second DATA reader,
``engine="flowio"``); this module adds what real instrument files need:

* keyword names normalised before lookup (case-folded, spaces around them removed, as Partec /
  Sysmex CyFlow pad them); in FCS 2.0 files a doubled delimiter right after a keyword and
  before another is an empty value (BD CellQuest), not an escaped delimiter;
* every number taken from the HEADER or TEXT is checked against the file size *before*
  anything is allocated, so a damaged keyword cannot ask for terabytes;
* the DATA segment is located from whichever of HEADER / TEXT offsets agrees with
  ``$TOT x bits per event`` (blank or zero HEADER offsets, off-by-one ``$ENDDATA``,
  HEADER/TEXT disagreements);
* several data sets per file (``$NEXTDATA``); one that cannot be read is reported and skipped
  when others can (``read_fcs_all(...).skipped``, notes, ``fcs_info``);
* any ``$BYTEORD`` permutation (one shorter than the values is applied by its direction, with
  a note) and any ``$PnB`` width: byte-aligned (8, 16, 24, 32, 64 bits, mixed), packed
  (e.g. 10-bit integers in one bit stream), FCS 3.2 ``$PnDATATYPE`` per channel, ASCII
  (``$DATATYPE A``, fixed width or delimited); integer data masked to ``$PnR``;
* ``$PnE`` log amplification decoded, ``$PnG`` gain and ``$TIMESTEP`` applied (as FlowIO and
  FlowKit do; non-positive ones are ignored with a note), duplicate ``$PnN`` names made unique;
* spillover from ``$SPILLOVER``, ``SPILL`` or ``$SPILL``.

The DATA segment of the common uniform-width files is read with one ``numpy.fromfile`` call
(the reading speed is then the disk's); unusual layouts go through a byte-level numpy path.
Every way a file can be unreadable becomes one exception type, :class:`FCSError`, whose message
names the file and the problem; what was tolerated is listed in ``Sample.notes``.

:func:`write_fcs` writes FCS 3.1 (float32, or float64 when a value needs it) byte by byte, with
a TEXT delimiter that occurs in no keyword name or value (see :func:`choose_delimiter`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import flowio
import numpy as np

from gating_core.errors import GatingCoreError, open_input

__all__ = ["FCSError", "Channel", "Sample", "SampleList", "read_fcs", "read_fcs_all", "write_fcs",
           "fcs_info"]

# What the reader tolerated in a file (Sample.notes) is also logged here, for scripts and services
# that collect logs rather than inspect samples; the package installs no handler of its own.
logger = logging.getLogger(__name__)

HEADER_LENGTH = 58
SUPPORTED_VERSIONS = ("2.0", "3.0", "3.1", "3.2")
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
        The TEXT segment, keys upper-cased and stripped of padding, with their leading ``$``
        when the file had one.
    spillover : ndarray of shape (k, k) or None
    spillover_channels : list of str
        The (unique) $PnN names the spillover matrix applies to, in its order.
    version : str
        ``"2.0"``, ``"3.0"``, ``"3.1"`` or ``"3.2"``.
    path : str or None
    compensated : bool
    notes : list of str
        Things the reader tolerated or could not interpret (e.g. an unparseable spillover
        keyword, an off-by-one $ENDDATA, an ignored negative $PnG, a data set of the same file
        that was skipped), for display; empty for a clean file.
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


def _is_digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also accepts '²' and other digits int() refuses)."""
    return text.isascii() and text.isdigit()


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
        raise FCSError(path, f"unsupported FCS version {version!r} (supported: 2.0, 3.0, 3.1, 3.2)")
    values = []
    for label, start in _HEADER_FIELDS:
        text = raw[start:start + 8].decode("latin-1").strip()
        if text == "":
            values.append(None)
        elif _is_digits(text):
            values.append(int(text))
        elif label.startswith("ANALYSIS"):
            values.append(None)  # never needed to read events
        else:
            raise FCSError(path, f"HEADER field '{label}'{where} is not a number: {text!r}")
    return _Header(version, *values)


def _decode_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


# What may follow a doubled delimiter for it to be read as an empty value (FCS 2.0 only).
_KEYWORD_LIKE = re.compile(r"\s*(\$[A-Za-z][A-Za-z0-9_]*|[A-Za-z][A-Za-z0-9 _\-.#()]{0,63})\s*")


def _split_text(text: str, empty_values: bool) -> tuple[list[str], list[str]]:
    """Tokens of a TEXT segment (keyword, value, keyword, ...) and the keywords read as empty.

    The first character is the delimiter; a doubled delimiter inside a keyword or value stands
    for the delimiter character itself (FCS 3.x). An odd run of delimiters is escapes plus one
    separator: after a keyword the separator comes first (values may start with the delimiter,
    keywords do not), after a value it comes last. FCS 2.0 allowed empty values, written as two
    delimiters in a row: with ``empty_values``, a doubled delimiter right after a keyword that
    is followed by something keyword-like ends the keyword and gives it an empty value (the
    reading flowCore applies to such files), instead of joining the two keywords.
    """
    delimiter = text[0]
    body = text[1:]
    runs = list(re.finditer(re.escape(delimiter) + "+", body))
    tokens: list[str] = []
    empties: list[str] = []
    piece: list[str] = []
    pos = 0
    for k, run in enumerate(runs):
        piece.append(body[pos:run.start()])
        pos = run.end()
        length = run.end() - run.start()
        if length == 1:
            tokens.append("".join(piece))
            piece = []
            continue
        if empty_values and length == 2 and len(tokens) % 2 == 0 and "".join(piece).strip():
            following = body[run.end():runs[k + 1].start() if k + 1 < len(runs) else len(body)]
            if run.end() == len(body) or _KEYWORD_LIKE.fullmatch(following):
                keyword = "".join(piece)
                tokens += [keyword, ""]
                empties.append(keyword.strip())
                piece = []
                continue
        escaped = delimiter * (length // 2)
        if length % 2 == 0:
            piece.append(escaped)
        elif len(tokens) % 2 == 0:
            # Odd run after a keyword: the keyword ends first, the value starts with delimiters.
            tokens.append("".join(piece))
            piece = [escaped]
        else:
            # Odd run after a value: the value ends with delimiters, then the next keyword.
            tokens.append("".join(piece) + escaped)
            piece = []
    piece.append(body[pos:])
    if "".join(piece):
        tokens.append("".join(piece))  # TEXT not closed by a delimiter
    return tokens, empties


@dataclass
class _Text:
    values: dict[str, str]     # normalised names (case-folded, no '$', no padding) -> value
    display: dict[str, str]    # normalised name -> name as shown ("$P1N", "SPILL", ...)
    notes: list[str]
    quirks: bool = False       # padded names or FCS 2.0 empty values (FlowIO misreads both)


def _tokenize_text(text: str, path, segment: str, version: str) -> _Text:
    """Keywords of a TEXT segment, with names normalised for lookup (see :class:`_Text`)."""
    if len(text) < 2:
        raise FCSError(path, f"the {segment} segment is empty")
    tokens, empties = _split_text(text, empty_values=version == "2.0")
    notes = []
    if len(tokens) % 2 and tokens[-1].strip():
        notes.append(f"{segment} ends with {tokens[-1].strip()[:40]!r} without a value; ignored")
    values: dict[str, str] = {}
    display: dict[str, str] = {}
    padded = []
    for raw_name, value in zip(tokens[0::2], tokens[1::2]):
        name = raw_name.strip()
        if name != raw_name:
            padded.append(raw_name)
        has_dollar = name.startswith("$")
        key = (name[1:] if has_dollar else name).strip().casefold()
        if not key:
            continue
        values[key] = value
        display[key] = ("$" if has_dollar else "") + key.upper()
    if padded:
        notes.append(f"{len(padded)} keyword names in {segment} padded with spaces (e.g. "
                     f"{padded[0][:40]!r}); read without the padding")
    if empties:
        shown = ", ".join(empties[:8]) + (", ..." if len(empties) > 8 else "")
        notes.append(f"FCS 2.0 {segment}: {len(empties)} keywords with an empty value ({shown}); "
                     "their doubled delimiters read as empty values, not escaped delimiters")
    return _Text(values, display, notes, quirks=bool(padded or empties))


# --------------------------------------------------------------------------------------------
# One data set's layout (everything but the event values)
# --------------------------------------------------------------------------------------------

@dataclass
class _Layout:
    path: Path
    base: int                      # byte offset of this data set's HEADER
    header: _Header
    text: dict[str, str]           # normalised keys (case-folded, no '$')
    keywords: dict[str, str]       # display keys
    n_events: int
    n_channels: int
    datatype: str                  # $DATATYPE: 'I', 'F', 'D' or 'A'
    byte_significance: list[int]   # BYTEORD as 0-based significance of each stored byte
    widths: list[int]              # bytes per value, per channel (byte-aligned storage)
    ranges: list[float | None]
    pnn: list[str]
    pns: list[str]
    decades: list[float]
    log_zero: list[float]
    gains: list[float]
    time_index: int | None
    timestep: float | None
    data_start: int                # absolute file offsets, inclusive start
    data_bytes: int                # bytes the events occupy
    data_from: str                 # 'TEXT' or 'HEADER'
    nextdata: int
    notes: list[str]
    datatypes: list[str] = field(default_factory=list)  # per channel ($PnDATATYPE, FCS 3.2)
    bits: list[int] = field(default_factory=list)       # stored bits (ASCII: characters, 0 = '*')
    storage: str = "aligned"       # 'aligned', 'packed', 'ascii-fixed', 'ascii-delimited'
    numpy_only: str = ""           # why FlowIO's DATA reader cannot be used, if it cannot

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


def _is_big_endian(order: list[int]) -> bool:
    """Direction of a $BYTEORD: most significant byte first (a single byte counts as little)."""
    return len(order) > 1 and order == sorted(order, reverse=True)


def _significance_for_width(order: list[int], width: int, path) -> list[int]:
    """Significance of each stored byte of a ``width``-byte value under $BYTEORD ``order``."""
    if len(order) == width:
        return order
    if _is_big_endian(order):
        return list(range(width - 1, -1, -1))
    if order == sorted(order):
        return list(range(width))
    raise FCSError(path, f"$BYTEORD {','.join(str(o + 1) for o in order)} cannot be applied to "
                         f"{8 * width}-bit values")


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


@dataclass
class _DataSetText:
    """HEADER and keywords of one data set: enough to find the next one."""
    base: int
    header: _Header
    text: dict[str, str]
    display: dict[str, str]
    notes: list[str]
    nextdata: int
    text_quirks: bool = False   # the primary TEXT had padded names or FCS 2.0 empty values


def _read_data_set_text(fh, path: Path, base: int, file_size: int) -> _DataSetText:
    fh.seek(base)
    header = _parse_header(fh.read(HEADER_LENGTH), path, base)
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
    primary = _tokenize_text(raw_text, path, "TEXT", header.version)
    text, display, notes = primary.values, primary.display, list(primary.notes)

    # Supplemental TEXT (FCS 3.x) adds keywords; the primary TEXT wins on conflicts.
    s_start = _int_keyword(text, "beginstext", path, required=False, default=0)
    s_stop = _int_keyword(text, "endstext", path, required=False, default=0)
    if s_start and s_stop > s_start and base + s_stop < file_size:
        fh.seek(base + s_start)
        extra_text = _decode_text(fh.read(s_stop - s_start + 1))
        if extra_text[:1] != raw_text[:1]:
            # FCS 3.x: supplemental TEXT uses the primary TEXT's delimiter. CyFlow files point
            # $BEGINSTEXT at a ZIP archive of settings instead.
            notes.append(f"supplemental TEXT (bytes {s_start}-{s_stop}) does not start with the "
                         "TEXT delimiter, so it holds no keywords; ignored")
            extra_text = ""
        try:
            extra = _tokenize_text(extra_text, path, "supplemental TEXT", header.version) \
                if extra_text else _Text({}, {}, [])
            text = {**extra.values, **text}
            display = {**extra.display, **display}
            notes += extra.notes
        except FCSError as exc:
            notes.append(f"supplemental TEXT ignored: {exc.problem}")
    nextdata = _int_keyword(text, "nextdata", path, required=False, default=0, minimum=-(1 << 62))
    return _DataSetText(base, header, text, display, notes, nextdata, primary.quirks)


def _channel_datatypes(text, n_channels: int, path) -> tuple[str, list[str]]:
    datatype = text.get("datatype", "").strip().upper()
    if datatype not in ("I", "F", "D", "A"):
        raise FCSError(path, f"$DATATYPE must be I, F, D or A, found {datatype[:20]!r}")
    types = []
    for i in range(1, n_channels + 1):
        # FCS 3.2: $PnDATATYPE overrides $DATATYPE for one channel.
        own = text.get(f"p{i}datatype", "").strip().upper()
        if own and own not in ("I", "F", "D"):
            raise FCSError(path, f"$P{i}DATATYPE must be I, F or D, found {own[:20]!r}")
        if own and datatype == "A":
            raise FCSError(path, f"$P{i}DATATYPE cannot be combined with ASCII data ($DATATYPE A)")
        types.append(own or datatype)
    return datatype, types


def _channel_bits(text, types: list[str], path, notes: list[str]) -> list[int]:
    bits = []
    for i, kind in enumerate(types, start=1):
        raw_bits = text.get(f"p{i}b", "").strip()
        if kind in "FD":
            value = 32 if kind == "F" else 64
            if _is_digits(raw_bits) and int(raw_bits) != value:
                notes.append(f"$P{i}B is {raw_bits} but data type {kind} means {value} bits; "
                             f"read as {value}")
        elif kind == "A":
            if raw_bits == "*":
                value = 0
            elif _is_digits(raw_bits) and 1 <= int(raw_bits) <= 64:
                value = int(raw_bits)
            else:
                raise FCSError(path, f"$P{i}B of ASCII data must be '*' or a number of digits "
                                     f"(1-64), found {raw_bits[:20]!r}")
        else:
            if not _is_digits(raw_bits):
                raise FCSError(path, f"$P{i}B (bits of channel {i}) is missing or not a number: "
                                     f"{raw_bits[:20]!r}")
            value = int(raw_bits)
            if value == 0 or value > 64:
                raise FCSError(path, f"$P{i}B = {value}: integer widths must be 1 to 64 bits")
        bits.append(value)
    if "A" in types and 0 < bits.count(0) < len(bits):
        raise FCSError(path, "ASCII data mixing delimited ('*') and fixed-width $PnB is not "
                             "supported")
    return bits


def _layout_from_text(dst: _DataSetText, path: Path, file_size: int) -> _Layout:
    text, header, base = dst.text, dst.header, dst.base
    notes = list(dst.notes)
    n_channels = _int_keyword(text, "par", path, minimum=1)
    if n_channels > len(text):
        raise FCSError(path, f"$PAR says {n_channels} channels but the TEXT segment has only "
                             f"{len(text)} keywords")
    datatype, types = _channel_datatypes(text, n_channels, path)
    # $MODE is deprecated in FCS 3.2 (list mode is the only mode left); absent means L.
    mode = text.get("mode", "L").strip().upper() or "L"
    if mode != "L":
        raise FCSError(path, f"histogram data ($MODE {mode}) is not supported, only list mode (L)")
    if "byteord" not in text:
        if datatype != "A":
            raise FCSError(path, "TEXT segment lacks the required keyword $BYTEORD")
        text = {**text, "byteord": "1"}  # irrelevant to ASCII data
    order = _byte_significance(text["byteord"], path)
    bits = _channel_bits(text, types, path, notes)

    ranges, pnn, pns, decades, log_zero, gains = [], [], [], [], [], []
    for i in range(1, n_channels + 1):
        kind = types[i - 1]
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
        gain_ignored = False
        raw_g = text.get(f"p{i}g", "").strip()
        gain = _float_value(raw_g, f"$P{i}G", path) if raw_g else 1.0
        if f1 > 0 and kind in "FD":
            # FCS 3.1: floating-point data are linear; $PnE must be 0,0. Guava writes log10
            # values with $PnE 4,1 -- decoding them with the integer formula would be garbage.
            notes.append(f"$P{i}E = {raw_e}: floating-point values kept as stored (FCS 3.1: "
                         "float data are not log-amplified)")
            f1 = 0.0
            if gain not in (0.0, 1.0):
                notes.append(f"$P{i}G = {raw_g} not applied to channel {i}: its $PnE marks it "
                             "logarithmic")
            gain_ignored = True
        elif gain < 0 or (gain == 0 and raw_g):
            notes.append(f"$P{i}G = {raw_g} is not a valid gain; ignored (channel {i} read "
                         "with gain 1)")
            gain_ignored = True
        if f1 > 0:
            if ranges[-1] is None or ranges[-1] <= 0:
                raise FCSError(path, f"channel {i} is log-amplified ($P{i}E {raw_e}) but has no "
                                     "valid $P{i}R to decode it")
            if f2 == 0:
                f2 = 1.0  # FCS standard: 0 is invalid here, use 1
        decades.append(f1)
        log_zero.append(f2)
        # FCS 3.1: $PnG applies to linear channels only.
        gains.append(1.0 if f1 > 0 or gain_ignored else gain)

    # Time channel: scaled by $TIMESTEP, its $PnG ignored (FlowIO / FlowKit convention). FCS 3.2
    # can also mark it with $PnTYPE Time.
    time_index = next((i for i, n in enumerate(pnn) if n.lower() == "time"), None)
    if time_index is None:
        time_index = next((i for i in range(n_channels)
                           if text.get(f"p{i + 1}type", "").strip().lower() == "time"), None)
    timestep = None
    if time_index is not None and text.get("timestep", "").strip():
        try:
            timestep = _float_value(text["timestep"], "$TIMESTEP", path)
        except FCSError as exc:
            notes.append(f"{exc.problem}; time channel left in clock ticks")
        if timestep is not None and timestep <= 0:
            notes.append(f"$TIMESTEP = {text['timestep'].strip()} is not positive; ignored, time "
                         "channel left in clock ticks")
            timestep = None
    if time_index is not None:
        gains[time_index] = 1.0

    # Storage: byte-aligned binary, packed integers, or ASCII characters.
    declared_events = _int_keyword(text, "tot", path, required=False)
    words_wider_than_pnb = False
    if datatype == "A":
        storage = "ascii-delimited" if bits[0] == 0 else "ascii-fixed"
    elif any(b % 8 for b in bits):
        storage = "packed"
        # Beckman Coulter CXP (FC500) writes $PnB 10 for values kept in 16-bit words: when the
        # DATA segment has exactly that size, read it so; otherwise the bits are packed.
        padded = [8 * ((b + 7) // 8) for b in bits]
        if _locate_data(path, header, text, base, file_size, sum(padded), declared_events, [],
                        exact_only=True) is not None:
            notes.append(f"$PnB {'/'.join(sorted({str(b) for b in bits if b % 8}))} but the DATA "
                         f"segment holds {'/'.join(sorted({str(p) for p in padded}))}-bit words "
                         "(as Beckman Coulter CXP writes them); read as such")
            storage, bits, words_wider_than_pnb = "aligned", padded, True
        else:
            notes.append(f"integers packed in {'+'.join(str(b) for b in bits)} bits an event, "
                         f"read as one bit stream ({'most' if _is_big_endian(order) else 'least'}"
                         f"-significant bit first, from $BYTEORD {text['byteord'].strip()})")
    else:
        storage = "aligned"
    widths = [b // 8 for b in bits]
    if storage != "ascii-delimited" and storage != "ascii-fixed" and len(order) > 1 \
            and not _is_big_endian(order) and order != sorted(order) \
            and any(w != len(order) for w in widths):
        raise FCSError(path, f"$BYTEORD {text['byteord'].strip()!r} cannot be applied to "
                             f"{8 * next(w for w in widths if w != len(order))}-bit values")
    # FCS 3.1/3.2: the 4-byte orders 1,2,3,4 / 4,3,2,1 give the endianness of every width; a
    # shorter order on wider values is applied by its direction, with a note.
    short = sorted({w for w in widths if w > len(order)}) \
        if storage == "aligned" and len(order) < 4 else []
    if short:
        direction = "big" if _is_big_endian(order) else "little"
        notes.append(f"$BYTEORD {text['byteord'].strip()} covers {len(order)} byte(s) but "
                     f"values are {'/'.join(str(8 * w) for w in short)} bits; read as "
                     f"{direction}-endian (the direction of the given order)")

    # What FlowIO's DATA reader (engine="flowio") cannot read.
    if storage != "aligned":
        numpy_only = "ASCII data" if datatype == "A" else "integers that are not byte-aligned"
    elif words_wider_than_pnb:
        numpy_only = "values in words wider than their $PnB"
    elif len(set(types)) > 1:
        numpy_only = "per-channel data types ($PnDATATYPE)"
    elif short:
        numpy_only = "a $BYTEORD shorter than the values"
    elif dst.text_quirks:
        numpy_only = "a TEXT segment that needed normalising"
    else:
        numpy_only = ""

    if storage == "ascii-delimited":
        data_start, data_bytes, data_from, n_events = _locate_ascii_data(
            path, header, text, base, file_size, declared_events, n_channels)
    else:
        bits_per_event = sum(bits) if storage != "ascii-fixed" else 8 * sum(bits)
        data_start, data_bytes, data_from, n_events = _locate_data(
            path, header, text, base, file_size, bits_per_event, declared_events, notes)
    return _Layout(path, base, header, text, {dst.display[k]: v for k, v in text.items()
                                              if k in dst.display},
                   n_events, n_channels, datatype, order, widths, ranges, pnn, pns, decades,
                   log_zero, gains, time_index, timestep, data_start, data_bytes, data_from,
                   dst.nextdata, notes, types, bits, storage, numpy_only)


def _data_candidates(header, text, path):
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
    return candidates


def _locate_data(path, header, text, base, file_size, bits_per_event, declared_events, notes,
                 exact_only=False):
    """Choose the DATA segment among the HEADER and TEXT offsets.

    The event count $TOT times the bits per event (rounded up to whole bytes) is what the
    segment must hold; the candidate whose length matches (exactly, or one byte long -- a
    common writer bug) wins. Returns (absolute start, bytes to read, source, events); with
    ``exact_only``, None when no candidate matches exactly.
    """
    candidates = _data_candidates(header, text, path)
    if exact_only and (not candidates or declared_events is None):
        return None
    if not candidates:
        if declared_events == 0:
            return base, 0, "TEXT", 0
        raise FCSError(path, "neither the HEADER nor the TEXT segment gives a usable DATA "
                             "segment location")
    per_event = (f"{bits_per_event // 8} bytes" if bits_per_event % 8 == 0
                 else f"{bits_per_event} bits")

    if declared_events is None:
        start, stop, source = candidates[0]
        length = stop - start + 1
        declared_events = 8 * length // bits_per_event
        if 8 * length - declared_events * bits_per_event >= 16:
            raise FCSError(path, f"$TOT is missing and the DATA segment ({length} bytes) is not a "
                                 f"whole number of {per_event} events")
        notes.append("$TOT missing; event count taken from the DATA segment length")

    needed = (declared_events * bits_per_event + 7) // 8
    problems = []
    for exact in ((True,) if exact_only else (True, False)):
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
                    f"$TOT = {declared_events} events x {per_event} = {needed} bytes "
                    f"from byte {base + start} ({source} offsets), but only {max(available, 0)} "
                    "bytes follow")
                continue
            if exact and length not in (needed, needed + 1, needed - 1):
                continue
            if length != needed:
                notes.append(f"DATA segment per {source} offsets is {length} bytes, expected "
                             f"{needed}; read {needed} bytes from byte {base + start}")
            if source != candidates[0][2]:
                notes.append(f"DATA located from the {source} offsets (the "
                             f"{candidates[0][2]} offsets do not fit $TOT)")
            return base + start, needed, source, declared_events
    if exact_only:
        return None
    # No candidate fits: the file is shorter than its keywords claim.
    raise FCSError(path, "file is truncated or its offsets are wrong: " + problems[0]
                   if problems else "the DATA segment cannot be located")


def _locate_ascii_data(path, header, text, base, file_size, declared_events, n_channels):
    """DATA segment of delimited ASCII values: its length is not implied by $TOT, but each
    value takes at least one character and one separator."""
    if declared_events is None:
        raise FCSError(path, "delimited ASCII data ($PnB *) need $TOT to be read")
    for start, stop, source in _data_candidates(header, text, path):
        if base + stop < file_size:
            length = stop - start + 1
            if declared_events * n_channels > (length + 1) // 2:
                raise FCSError(path, f"$TOT = {declared_events} events x {n_channels} delimited "
                                     f"ASCII values cannot fit in the {length}-byte DATA segment")
            return base + start, length, source, declared_events
    if declared_events == 0:
        return base, 0, "TEXT", 0
    raise FCSError(path, "file is truncated or its offsets are wrong: no DATA segment of the "
                         "delimited ASCII data lies inside the file")


@dataclass
class _Unreadable:
    """A data set whose HEADER and TEXT were read but whose events cannot be."""
    base: int
    version: str
    error: FCSError
    notes: list[str] = field(default_factory=list)


def _walk_layouts(fh, path: Path, file_size: int) -> list[_Layout | _Unreadable]:
    """Layouts of the data sets in file order (TEXT only; the events are not read).

    A data set whose TEXT can be read but whose layout cannot becomes an :class:`_Unreadable`
    entry, so the others still load; FCSError when no data set is readable.
    """
    entries: list[_Layout | _Unreadable] = []
    base = 0
    seen = set()
    while True:
        dst = _read_data_set_text(fh, path, base, file_size)
        try:
            entry = _layout_from_text(dst, path, file_size)
        except FCSError as exc:
            entry = _Unreadable(base, dst.header.version, exc)
        entries.append(entry)
        if dst.nextdata == 0:
            break
        next_base = base + dst.nextdata
        if dst.nextdata < 0 or next_base >= file_size or next_base in seen:
            # A broken chain after valid data sets: keep what was read, say so.
            entry.notes.append(f"$NEXTDATA {dst.nextdata} does not point to another data set "
                               "inside the file; ignored")
            break
        if len(entries) >= MAX_DATA_SETS:
            raise FCSError(path, f"more than {MAX_DATA_SETS} data sets chained by $NEXTDATA")
        seen.add(next_base)
        base = next_base
    if all(isinstance(e, _Unreadable) for e in entries):
        if len(entries) == 1:
            raise entries[0].error
        raise _none_readable(path, [e.error.problem for e in entries])
    return entries


def _none_readable(path, problems: list[str]) -> FCSError:
    listed = "; ".join(f"data set {k}: {p}" for k, p in enumerate(problems[:3], start=1))
    return FCSError(path, f"none of the {len(problems)} data sets can be read ({listed}"
                          f"{'; ...' if len(problems) > 3 else ''})")


# --------------------------------------------------------------------------------------------
# DATA
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def _open(path: Path):
    return open_input(path, FCSError, "is a directory, not an FCS file")


def _names(path: Path, count: int) -> list[str]:
    return [path.stem] if count == 1 else [f"{path.stem}#{k}" for k in range(1, count + 1)]


def _sample_from_layout(fh, layout: _Layout, name: str, engine: str, compensate: bool) -> Sample:
    notes = list(layout.notes)
    if engine == "flowio" and layout.numpy_only:
        notes.append(f"FlowIO cannot read {layout.numpy_only}; read with the numpy reader")
        engine = "numpy"
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
    channels, spillover, spill_channels = _channels_and_spillover(layout, notes, compensate)
    sample = Sample(name, events, channels, layout.keywords, spillover, spill_channels,
                    layout.header.version, str(layout.path), compensated=False, notes=notes)
    return sample.compensate() if compensate else sample


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
        raise FCSError(layout.path, f"compensation requested but {broken[0]}")
    return channels, spillover, spill_channels


class SampleList(list):
    """What :func:`read_fcs_all` returns: the samples read, in file order, and ``skipped``,
    a list of ``(name, problem)`` for the data sets of the file that could not be read."""

    def __init__(self, samples=(), skipped=()):
        super().__init__(samples)
        self.skipped: list[tuple[str, str]] = list(skipped)


def _unreadable_error(path, entries, k: int) -> FCSError:
    readable = [str(i + 1) for i, e in enumerate(entries) if isinstance(e, _Layout)]
    return FCSError(path, f"data set {k + 1} of {len(entries)} cannot be read: "
                          f"{entries[k].error.problem} (readable: data set "
                          f"{', '.join(readable)}; read_fcs_all reads those)")


def read_fcs(path: str | os.PathLike, dataset: int = 0, compensate: bool = False, *,
             engine: str = "numpy") -> Sample:
    """Read one data set of an FCS file.

    Parameters
    ----------
    path : path of an FCS 2.0 / 3.0 / 3.1 / 3.2 file.
    dataset : index (from 0) of the data set to read when the file holds several ($NEXTDATA).
    compensate : apply the file's spillover matrix (no-op when the file has none).
    engine : ``"numpy"`` (fast) or ``"flowio"`` (FlowIO's DATA reader; same results; layouts
        FlowIO cannot read go through the numpy reader, with a note).

    Returns
    -------
    Sample with ``events`` of shape (n_events, n_channels).

    Raises
    ------
    FCSError naming the file and the problem (missing, truncated, corrupted, unsupported), also
    when the requested data set is unreadable even though others in the file are not.
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        entries = _walk_layouts(fh, path, file_size)
        if not 0 <= dataset < len(entries):
            raise FCSError(path, f"data set {dataset} requested but the file holds {len(entries)}")
        if isinstance(entries[dataset], _Unreadable):
            raise _unreadable_error(path, entries, dataset)
        name = _names(path, len(entries))[dataset]
        return _sample_from_layout(fh, entries[dataset], name, engine, compensate)


def read_fcs_all(path: str | os.PathLike, compensate: bool = False, *,
                 engine: str = "numpy") -> SampleList:
    """Read every data set of an FCS file; names are ``<stem>#<k>`` when there are several.

    A data set that cannot be read (unsupported layout, damaged DATA...) in a file with others
    that can is left out: it is listed in the result's ``skipped`` as ``(name, problem)`` and
    each sample read carries a note naming it. FCSError when no data set can be read.
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        entries = _walk_layouts(fh, path, file_size)
        samples = _readable_data_sets(path, entries, lambda entry, name: _sample_from_layout(
            fh, entry, name, engine, compensate))
    for sample in samples:
        sample.notes += _skipped_notes(samples.skipped)
    return samples


def _readable_data_sets(path: Path, entries, build) -> SampleList:
    """``build(layout, name)`` for every data set of a file that can be read; the others are
    listed in the result's ``skipped`` as ``(name, problem)``. A lone data set's error, or no
    readable data set at all, is an FCSError naming the file."""
    built, skipped = [], []
    for entry, name in zip(entries, _names(path, len(entries))):
        if isinstance(entry, _Unreadable):
            skipped.append((name, entry.error.problem))
            continue
        try:
            built.append(build(entry, name))
        except FCSError as exc:
            if len(entries) == 1:
                raise
            skipped.append((name, exc.problem))
    if not built:
        raise _none_readable(path, [problem for _, problem in skipped])
    return SampleList(built, skipped)


def _skipped_notes(skipped) -> list[str]:
    return [f"data set {name} skipped: {problem}" for name, problem in skipped]


def fcs_info(path: str | os.PathLike) -> dict:
    """Describe an FCS file without reading its events (offsets and sizes are validated).

    Returns a JSON-ready dict: ``file``, ``version``, ``n_datasets`` and ``datasets``, a list of
    ``{name, events, n_channels, channels: [{pnn, pns}], datatype, spillover,
    spillover_channels, notes}``; a data set that cannot be read is ``{name, error, notes}``.
    Raises FCSError when no data set can be read.
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        entries = _walk_layouts(fh, path, file_size)
    names = _names(path, len(entries))
    datasets = []
    for layout, name in zip(entries, names):
        if isinstance(layout, _Unreadable):
            datasets.append({"name": name, "error": layout.error.problem,
                             "notes": list(layout.notes)})
            continue
        unique_pnn = _unique_names(layout.pnn)
        notes = list(layout.notes)
        spillover, spill_channels = _parse_spillover(layout, unique_pnn, notes)
        datasets.append({
            "name": name,
            "events": layout.n_events,
            "n_channels": layout.n_channels,
            "channels": [{"pnn": n, "pns": s} for n, s in zip(unique_pnn, layout.pns)],
            "datatype": layout.datatype,
            "spillover": spillover is not None,
            "spillover_channels": spill_channels,
            "notes": notes,
        })
    version = entries[0].header.version if isinstance(entries[0], _Layout) else entries[0].version
    return {"file": str(path), "version": version, "n_datasets": len(entries),
            "datasets": datasets}


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

# TEXT delimiters the writer may use, in order of preference. The FCS standard allows any byte
# 1-126; this list keeps to bytes every reader we know tokenizes correctly (FlowIO builds a
# regular expression from the delimiter and escapes only '|', '*' and '\\'; C0 controls from
# 0x1c on and 0x09-0x0d count as white space to Python's str.strip and are avoided).
TEXT_DELIMITERS = ("/", "|", "*", "\\", "~", "!", "#", "&", ";", "@", "`", "%", "=", ":", "<", ">",
                   "'", '"', ",", "_", "\x01", "\x02", "\x03", "\x04", "\x05", "\x06", "\x07",
                   "\x08", "\x0e", "\x0f", "\x10", "\x11", "\x12", "\x13", "\x14", "\x15",
                   "\x16", "\x17", "\x18", "\x19", "\x1a", "\x1b")
# Delimiters a reader can un-double: FlowIO un-doubles the escaped form of '|', '*' and '\\'
# (r'\|\|') instead of the doubled character, so those three are only used when no doubling
# is needed.
_DOUBLING_SAFE = tuple(d for d in TEXT_DELIMITERS if d not in ("|", "*", "\\"))

# Keywords the writer derives from the events and the channel lists; a caller may not set them.
_WRITER_KEYWORDS = re.compile(r"^\$?((BEGIN|END)(DATA|ANALYSIS|STEXT)|BYTEORD|DATATYPE|MODE|NEXTDATA|PAR"
                              r"|TOT|P\d+[BENS])$", re.IGNORECASE)
_OFFSET_DIGITS = 20  # fixed-width $BEGINDATA / $ENDDATA: the TEXT length does not depend on them


def choose_delimiter(tokens, path=None) -> tuple[str, bool]:
    """The TEXT delimiter for these keyword names and values: ``(delimiter, doubling)``.

    The first of :data:`TEXT_DELIMITERS` that occurs in no token needs no escaping at all.
    When every one occurs somewhere, the FCS escape (the delimiter doubled inside a name or
    value) is used with the first delimiter that starts or ends no token: a doubled delimiter
    next to a separating one (``///``) cannot be split unambiguously. Raises FCSError when no
    delimiter qualifies.
    """
    tokens = [str(t) for t in tokens]
    text = "".join(tokens)
    for delimiter in TEXT_DELIMITERS:
        if delimiter not in text:
            return delimiter, False
    for delimiter in _DOUBLING_SAFE:
        if not any(t.startswith(delimiter) or t.endswith(delimiter) for t in tokens):
            return delimiter, True
    raise FCSError(path or "FCS file", "no TEXT delimiter can be used: every candidate character "
                   "occurs at the start or end of a keyword name or value")


def _text_segment(pairs: list[tuple[str, str]], delimiter: str, doubling: bool) -> bytes:
    def escape(token: str) -> str:
        return token.replace(delimiter, delimiter * 2) if doubling else token

    parts = [delimiter]
    for key, value in pairs:
        parts.append(f"{escape(key)}{delimiter}{escape(value)}{delimiter}")
    return "".join(parts).encode("utf-8")


def _number_text(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


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


def write_fcs(path: str | os.PathLike, events: np.ndarray, pnn: list[str], pns: list[str] | None = None,
              keywords: dict[str, str] | None = None, *, ranges=None, datatype: str = "F") -> None:
    """Write an FCS 3.1 file (one data set, list mode, little-endian floats).

    Parameters
    ----------
    events : array of shape (n_events, len(pnn)); finite values.
    pnn, pns : channel names ($PnN, unique and non-empty) and markers ($PnS, "" for none).
    keywords : further TEXT keywords; names may carry a leading ``$``, values are non-empty
        text. The layout keywords ($BEGINDATA, $TOT, $PnB, $PnN, ...) are the writer's own and
        are refused here; ``$PnR`` given here overrides ``ranges``.
    ranges : $PnR per channel (default 262144).
    datatype : ``"F"`` stores float32 (values rounded to float32), ``"D"`` float64, ``"auto"``
        float32 when every value is exactly a float32, else float64 -- the events read back
        exactly either way.

    Names and values may contain any character; the TEXT delimiter is chosen so that none
    needs escaping, else the FCS escape (doubled delimiter) is used (see
    :func:`choose_delimiter`). The file appears atomically (temp + rename).
    """
    path = Path(path)
    events = np.asarray(events)
    if events.ndim != 2 or events.shape[1] != len(pnn):
        raise FCSError(path, f"events of shape {events.shape} do not match {len(pnn)} channel names")
    if datatype == "auto":
        datatype = "F" if exact_in_float32(events) else "D"
    if datatype not in ("F", "D"):
        raise ValueError(f"datatype must be 'F', 'D' or 'auto', not {datatype!r}")
    stored = "<f4" if datatype == "F" else "<f8"
    events = np.ascontiguousarray(events, dtype=stored)
    flat = events.reshape(-1)
    if flat.size and not np.isfinite(np.dot(flat, flat)) and not np.all(np.isfinite(events)):
        raise FCSError(path, "events hold NaN or infinite values, which FCS cannot store portably")
    names = [str(n) for n in pnn]
    if len(set(names)) != len(names) or any(n.strip() == "" for n in names):
        raise FCSError(path, "channel names ($PnN) must be unique and non-empty")
    markers = [str(s) for s in pns] if pns else [""] * len(names)
    if len(markers) != len(names):
        raise FCSError(path, f"{len(markers)} markers ($PnS) for {len(names)} channels")
    d = len(names)
    pnr = [262144.0] * d if ranges is None else [262144.0 if r is None else float(r) for r in ranges]
    extra: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for key, value in (keywords or {}).items():
        key, value = str(key), str(value)
        if key.strip() == "" or key.strip("$") == "":
            raise FCSError(path, f"keyword name {key!r} is empty")
        if value == "":
            raise FCSError(path, f"keyword {key!r} has an empty value, which FCS does not allow")
        if _WRITER_KEYWORDS.match(key):
            raise FCSError(path, f"keyword {key!r} is set by the writer from the events and channels")
        folded = key.lstrip("$").upper()  # readers fold case and the '$'
        if folded in seen:
            raise FCSError(path, f"keywords {seen[folded]!r} and {key!r} are the same FCS keyword")
        seen[folded] = key
        match = re.fullmatch(r"\$?P(\d+)R", key, re.IGNORECASE)
        if match and 1 <= int(match.group(1)) <= d:
            pnr[int(match.group(1)) - 1] = _float_value(value, key, path)
            continue
        extra.append((key, value))
    if not all(math.isfinite(r) for r in pnr):
        raise FCSError(path, "channel ranges ($PnR) must be finite")

    n = events.shape[0]
    pairs = [("$BEGINANALYSIS", "0"), ("$ENDANALYSIS", "0"), ("$BEGINSTEXT", "0"), ("$ENDSTEXT", "0"),
             ("$BEGINDATA", "0" * _OFFSET_DIGITS), ("$ENDDATA", "0" * _OFFSET_DIGITS),
             ("$BYTEORD", "1,2,3,4"), ("$DATATYPE", datatype), ("$MODE", "L"), ("$NEXTDATA", "0"),
             ("$PAR", str(d)), ("$TOT", str(n))]
    for i in range(d):
        pairs += [(f"$P{i + 1}N", names[i]), (f"$P{i + 1}B", "32" if datatype == "F" else "64"),
                  (f"$P{i + 1}E", "0,0"), (f"$P{i + 1}R", _number_text(pnr[i]))]
        if markers[i]:
            pairs.append((f"$P{i + 1}S", markers[i]))
    pairs += extra
    delimiter, doubling = choose_delimiter([t for pair in pairs for t in pair], path)
    text_start = HEADER_LENGTH
    text_length = len(_text_segment(pairs, delimiter, doubling))
    data_start = text_start + text_length
    data_bytes = events.nbytes
    data_stop = data_start + data_bytes - 1 if data_bytes else 0
    if not data_bytes:
        data_start = 0
    pairs[4] = ("$BEGINDATA", f"{data_start:0{_OFFSET_DIGITS}d}")
    pairs[5] = ("$ENDDATA", f"{data_stop:0{_OFFSET_DIGITS}d}")
    text = _text_segment(pairs, delimiter, doubling)
    assert len(text) == text_length
    text_stop = text_start + text_length - 1
    if text_stop > HEADER_OFFSET_LIMIT:
        raise FCSError(path, "the TEXT segment is too long for the FCS HEADER")
    header_data = (data_start, data_stop) if data_stop <= HEADER_OFFSET_LIMIT else (0, 0)
    header = (b"FCS3.1    " + b"%8d%8d%8d%8d%8d%8d" % (text_start, text_stop, *header_data, 0, 0))
    assert len(header) == HEADER_LENGTH
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as handle:
            handle.write(header)
            handle.write(text)
            for start in range(0, n, 262_144):
                handle.write(events[start:start + 262_144].tobytes())
        os.replace(tmp, path)
    except OSError as exc:
        raise FCSError(path, f"cannot be written ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            tmp.unlink()


# --------------------------------------------------------------------------------------------
# Chunked reading: bounded memory on files of any size
# --------------------------------------------------------------------------------------------

#: Compensation's row block in :meth:`Sample.compensate`; chunked reads compensate the same way.
_COMPENSATION_BLOCK = 262_144


class EventStream:
    """One data set of an FCS file, read in chunks of events instead of whole.

    ``sample`` describes the data set as :func:`read_fcs` would return it (name, channels,
    keywords, spillover, notes, ``compensated``) but holds no events: its ``events`` is an
    empty (0, n_channels) array of the dtype the chunks have. :meth:`chunks` reads the DATA
    segment window by window (``chunk_events`` events at a time), decodes, checks and
    compensates each window exactly as :func:`read_fcs` does the whole segment, so the
    concatenated chunks equal ``read_fcs(path, compensate=...).events`` bit for bit. Every
    call to :meth:`chunks` reads the file again (a pass), so memory stays a few chunks
    whatever the file size.

    Packed and aligned binary layouts are read window by window; ASCII data sets come as a
    single chunk (their values have no fixed place in the segment).
    """

    def __init__(self, layout: _Layout, name: str, compensate: bool):
        self._layout = layout
        notes = list(layout.notes)
        channels, spillover, spill_channels = _channels_and_spillover(layout, notes, compensate)
        with open(layout.path, "rb") as fh:
            dtype = _events_from_raw(self._window(0, 0), _raw_values(fh, self._window(0, 0))).dtype
        self._inverse = None
        self._spill_index: list[int] = []
        if compensate and spillover is not None:
            dtype = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
        self.sample = Sample(name, np.empty((0, layout.n_channels), dtype=dtype), channels, layout.keywords,
                             spillover, spill_channels, layout.header.version, str(layout.path),
                             compensated=False, notes=notes)
        if compensate and spillover is not None:
            self._spill_index = [self.sample.channel_index(n) for n in spill_channels]
            self._inverse = _compensation_inverse(self.sample)
            self.sample.compensated = True
        self.n_events = layout.n_events

    def _window(self, start: int, count: int) -> _Layout:
        """The layout of events ``start`` .. ``start + count`` as a data set of its own."""
        layout = self._layout
        if layout.storage == "packed":
            per_event = sum(layout.bits)
            first = start * per_event // 8  # whole bytes: windows start at multiples of 8 events
            stop = (start * per_event + count * per_event + 7) // 8
            offset, size = first, stop - first
        else:
            offset, size = start * layout.bytes_per_event, count * layout.bytes_per_event
        return _replace_layout(layout, n_events=count, data_start=layout.data_start + offset, data_bytes=size)

    def chunks(self, chunk_events: int = _COMPENSATION_BLOCK):
        """Yield ``(start, events)`` windows in file order: events (m, n_channels), linear
        scale, compensated when asked, ``m <= chunk_events`` (a multiple of 8 is used)."""
        layout = self._layout
        n = layout.n_events
        step = n if layout.storage.startswith("ascii") else max(8, -(-int(chunk_events) // 8) * 8)
        with _open(Path(layout.path)) as fh:
            for start in range(0, n, max(step, 1)):
                count = min(step, n - start)
                window = self._window(start, count) if count != n else layout
                events = _events_from_raw(window, _raw_values(fh, window))
                _check_finite(window, events)
                if self._inverse is not None:
                    events = self._compensated(events)
                yield start, events

    def _compensated(self, events: np.ndarray) -> np.ndarray:
        # Same arithmetic and row blocks as Sample.compensate (rows do not interact), so the
        # chunks are bitwise the whole-file result.
        dtype = np.float64 if events.dtype == np.float64 else np.float32
        events = np.array(events, dtype=dtype)
        idx = self._spill_index

        def compensate(bounds):
            block = events[bounds[0]:bounds[1]]
            block[:, idx] = (block[:, idx].astype(np.float64) @ self._inverse).astype(dtype)

        parallel_rows(compensate, len(events), _COMPENSATION_BLOCK)
        return events

    def read(self) -> Sample:
        """The whole data set in memory (what :func:`read_fcs` returns)."""
        parts = [events for _, events in self.chunks()]
        events = np.concatenate(parts) if parts else self.sample.events
        s = self.sample
        return Sample(s.name, events, list(s.channels), s.keywords, s.spillover, list(s.spillover_channels),
                      s.version, s.path, s.compensated, list(s.notes))


def parallel_rows(function, n_rows: int, max_block: int = 262_144, min_block: int = 8192) -> None:
    """Call ``function((lo, hi))`` on row blocks covering ``range(n_rows)``, on the scoring
    pool's number of threads when the rows are many, with BLAS at one thread meanwhile.

    For row-wise work (compensation, transforms) whose result for a row does not depend on
    the block it is in: numpy releases the GIL, so the blocks run in parallel."""
    from gating_core.classifier import score_threads

    threads = max(1, min(score_threads(), n_rows // min_block))
    step = min(max_block, -(-n_rows // threads)) if n_rows else 1
    bounds = [(lo, min(lo + step, n_rows)) for lo in range(0, n_rows, step)]
    if threads == 1:
        for b in bounds:
            function(b)
        return
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), ThreadPoolExecutor(threads) as pool:
        list(pool.map(function, bounds))


def _replace_layout(layout: _Layout, **changes) -> _Layout:
    import dataclasses

    return dataclasses.replace(layout, **changes)


def _compensation_inverse(sample: Sample) -> np.ndarray:
    """inv(spillover), checked as :meth:`Sample.compensate` checks it."""
    try:
        inverse = np.linalg.inv(np.asarray(sample.spillover, dtype=np.float64))
    except np.linalg.LinAlgError:
        raise FCSError(sample.path or sample.name, "the spillover matrix is singular and cannot be "
                       "used for compensation") from None
    if not np.all(np.isfinite(inverse)):
        raise FCSError(sample.path or sample.name, "the spillover matrix is numerically singular")
    return inverse


def stream_fcs_all(path: str | os.PathLike, compensate: bool = False) -> SampleList:
    """Every readable data set of an FCS file as an :class:`EventStream` (TEXT read, DATA not).

    Like :func:`read_fcs_all` but without loading events: the result is a list of streams with
    ``skipped`` listing ``(name, problem)`` for data sets whose layout cannot be read (damage in
    the DATA itself shows when a stream's chunks are read). Raises FCSError naming the file
    when no data set can be read (missing, not FCS, truncated before its DATA...).
    """
    path = Path(path)
    with _open(path) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        entries = _walk_layouts(fh, path, file_size)
    streams = _readable_data_sets(path, entries, lambda entry, name: EventStream(entry, name, compensate))
    for stream in streams:
        stream.sample.notes += _skipped_notes(streams.skipped)
    return streams
