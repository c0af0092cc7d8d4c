"""HEADER and TEXT segments: the HEADER's offsets, TEXT tokenised (delimiters, FCS 2.0
empty values, padded keyword names) and one data set's keywords with ``$NEXTDATA``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from gating_core.fcs.sample import FCSError


HEADER_LENGTH = 58


SUPPORTED_VERSIONS = ("2.0", "3.0", "3.1", "3.2")


MAX_DATA_SETS = 10_000


# FCS 3.1: HEADER offsets above this are written as 0 (or left blank).
HEADER_OFFSET_LIMIT = 99_999_999


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


#: Files often dropped in place of an FCS file, by their first bytes: named in the error.
_OTHER_FORMATS = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"%PDF", "a PDF document"),
                  (b"PK\x03\x04", "a zip archive (or an Excel / Word file)"), (b"<?xml", "an XML file"),
                  (b"\xd0\xcf\x11\xe0", "an old Excel / Word file"), (b"GIF8", "a GIF image"))


def _looks_like_a_table(raw: bytes) -> bool:
    """Whether the first line of ``raw`` is printable text with a comma, semicolon or tab."""
    line = raw.split(b"\n", 1)[0].rstrip(b"\r")
    return line.isascii() and all(32 <= b < 127 or b == 9 for b in line) and any(c in line for c in b",;\t")


def _parse_header(raw: bytes, path, base: int) -> _Header:
    where = "" if base == 0 else f" of the data set at byte {base}"
    if len(raw) < HEADER_LENGTH:
        if base == 0:
            raise FCSError(path, f"file is {len(raw)} bytes long, too short to hold an FCS HEADER "
                                 f"({HEADER_LENGTH} bytes)")
        raise FCSError(path, f"$NEXTDATA points to byte {base}, too close to the end of the file "
                             f"for another data set ({len(raw)} bytes follow): the file is truncated")
    if raw[:3] != b"FCS":
        shown = raw[:10].decode("latin-1").encode("unicode_escape").decode("ascii")
        kind = next((name for magic, name in _OTHER_FORMATS if raw.startswith(magic)), None) if base == 0 else None
        if kind is None and base == 0 and _looks_like_a_table(raw):
            kind = "a text table (a gated CSV or a labels file?)"
        # a format recognised needs no bytes shown; unknown ones show what the file starts with
        raise FCSError(path, f"not an FCS file: it is {kind}" if kind else
                       f"not an FCS file (the HEADER{where} starts with '{shown}' instead of 'FCS')")
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
