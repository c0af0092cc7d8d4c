"""One data set's layout (everything but the event values): ``$DATATYPE`` and
``$PnDATATYPE``, ``$BYTEORD``, ``$PnB`` widths (aligned, packed, ASCII), ranges, gains,
log amplification, the time channel; built from the keywords with every number checked.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from gating_core.fcs.locate import _locate_ascii_data, _locate_data
from gating_core.fcs.sample import FCSError
from gating_core.fcs.text import _DataSetText, _Header, _float_value, _int_keyword, _is_digits


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


#: The largest float32: events and everything computed from them (models, exports) fit in it.
FLOAT32_MAX = 3.4028234663852886e38


def _timestep_fits(timestep: float, kind: str, bits: int, pnr: float | None) -> bool:
    """Whether the largest tick the time channel can store, times ``timestep``, stays within
    float32: integers up to 2^bits - 1 (or the $PnR mask), ASCII up to its digits, floating-point
    values up to $PnR (larger stored values are checked when the events are read)."""
    if kind == "I":
        top = float((1 << bits) - 1)
        if pnr is not None and pnr >= 1:
            top = min(top, float(_next_power_of_two(pnr) - 1))
    elif kind == "A" and bits:
        top = 10.0 ** bits - 1
    else:
        top = pnr if pnr is not None and pnr > 0 else 1.0
    return timestep <= FLOAT32_MAX and timestep * max(top, 1.0) <= FLOAT32_MAX


def _next_power_of_two(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(x))) if x > 1 else 1


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
        if timestep is not None and not _timestep_fits(timestep, types[time_index], bits[time_index],
                                                       ranges[time_index]):
            notes.append(f"$TIMESTEP = {text['timestep'].strip()} would scale the time channel "
                         f"{pnn[time_index]} beyond the largest number the events can hold "
                         f"({FLOAT32_MAX:.4g}); ignored, time channel left in clock ticks")
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
