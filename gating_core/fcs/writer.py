""":func:`write_fcs` writes FCS 3.1 (float32, or float64 when a value needs it) byte by byte,
with a TEXT delimiter that occurs in no keyword name or value (:func:`choose_delimiter`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from gating_core.fcs.data import exact_in_float32
from gating_core.fcs.sample import FCSError
from gating_core.fcs.text import HEADER_LENGTH, HEADER_OFFSET_LIMIT, _float_value


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
    with np.errstate(over="ignore", invalid="ignore"):  # the quick check: a huge finite value overflows it
        quick_finite = not flat.size or np.isfinite(np.dot(flat, flat))
    if not quick_finite and not np.all(np.isfinite(events)):
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
