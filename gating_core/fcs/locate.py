"""Where a data set's DATA segment is: whichever of the HEADER / TEXT offsets gives a segment
that lies inside the file, after the HEADER and TEXT (not overlapping them or ANALYSIS), and
holds exactly ``$TOT`` x bits per event.

Offsets that disagree for a known reason are read: blank or zero HEADER offsets (files past
99,999,999 bytes), an ``$ENDDATA`` one byte off, a segment padded by less than one event, a
``$BEGINDATA`` that points into the spaces a writer left between TEXT and DATA (the HEADER
offset after them is taken). Anything else -- a file cut short inside DATA, offsets pointing
into TEXT, a segment of another length than ``$TOT`` implies -- is an :class:`FCSError`: the
reader never returns values read from bytes that are not the events.
"""

from __future__ import annotations

from dataclasses import dataclass

from gating_core.fcs.sample import FCSError
from gating_core.fcs.text import HEADER_LENGTH, _int_keyword, _is_digits

#: Most bytes between two candidate starts examined for writer padding (spaces).
_PADDING_PEEK = 4096


@dataclass(frozen=True)
class _Candidate:
    start: int    # relative to the data set's HEADER, inclusive
    stop: int     # relative, inclusive, as declared
    source: str   # 'HEADER' or 'TEXT'

    @property
    def length(self) -> int:
        return self.stop - self.start + 1


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
        if (start, stop) in [(c.start, c.stop) for c in candidates]:
            continue
        candidates.append(_Candidate(start, stop, source))
    return candidates


def _lenient_int(text, key) -> int | None:
    raw = text.get(key, "").strip()
    return int(raw) if _is_digits(raw) else None


def _other_segments(header, text) -> list[tuple[str, int, int]]:
    """The segments DATA may not overlap, relative offsets inclusive: HEADER, TEXT, ANALYSIS
    (from the HEADER or TEXT offsets, when given)."""
    segments = [("HEADER", 0, HEADER_LENGTH - 1), ("TEXT", header.text_start, header.text_stop)]
    analyses = {(header.analysis_start, header.analysis_stop),
                (_lenient_int(text, "beginanalysis"), _lenient_int(text, "endanalysis"))}
    for start, stop in sorted(a for a in analyses if None not in a):
        if 0 < start <= stop:
            segments.append(("ANALYSIS", start, stop))
    return segments


def _where(c: _Candidate, base: int) -> str:
    return f"bytes {base + c.start}-{base + c.stop} per the {c.source} offsets"


def _problem(c: _Candidate, needed: int, per_event_bytes: float, segments, base: int,
             file_size: int, exact: bool) -> str | None:
    """Why ``c`` cannot be the DATA segment (None when it can)."""
    read_stop = c.start + max(needed, 1) - 1  # the last byte that would be read
    for label, lo, hi in segments:
        if c.start <= hi and read_stop >= lo:
            return (f"the DATA segment ({_where(c, base)}) overlaps the {label} segment (bytes "
                    f"{base + lo}-{base + hi})")
    if base + c.start >= file_size:
        return (f"the file ends at byte {file_size}, before its DATA segment ({_where(c, base)}): "
                "it holds only HEADER and TEXT, or was cut short")
    if base + c.start + needed > file_size:
        if 0 < c.length < needed and base + c.start + c.length <= file_size:
            # The segment the offsets give is whole: what sizes an event, or $TOT, is wrong.
            return (f"the DATA segment ({_where(c, base)}) lies whole in the file but is {c.length} bytes, "
                    f"and $TOT with the channels' sizes ($PAR, $PnB, $DATATYPE) implies {needed}")
        return (f"the DATA segment ({_where(c, base)}) ends at byte {base + c.start + needed} "
                f"but the file has only {file_size} bytes; only {file_size - base - c.start} bytes "
                "follow its start: the file is truncated")
    if c.length in (needed - 1, needed, needed + 1):
        return None
    if not exact and needed < c.length < needed + per_event_bytes:
        return None  # padded to a word or block: less than one more event
    return (f"the DATA segment ({_where(c, base)}) is {c.length} bytes, but $TOT implies "
            f"{needed}")


def _padding_between(path, first: int, second: int) -> bool:
    """Whether the bytes ``first`` .. ``second`` - 1 of the file are all spaces."""
    if not 0 < second - first <= _PADDING_PEEK:
        return False
    with open(path, "rb") as fh:
        fh.seek(first)
        gap = fh.read(second - first)
    return len(gap) == second - first and gap == b" " * len(gap)


def _choose(path, usable: list[_Candidate], base: int, needed: int, notes) -> _Candidate:
    """One of several usable candidates: the same start is the same segment; two starts are
    resolved by writer padding (the earlier start would read spaces), else by the version's
    preference (the first), with a note."""
    starts = sorted({c.start for c in usable})
    if len(starts) == 1:
        return min(usable, key=lambda c: c.length != needed)  # stable: preference order kept
    first, later = starts[0], starts[-1]
    if len(starts) == 2 and _padding_between(path, base + first, base + later):
        chosen = next(c for c in usable if c.start == later)
        other = next(c for c in usable if c.start == first)
        notes.append(f"the {other.source} offsets put DATA at byte {base + first}, in the spaces "
                     f"after TEXT; read from byte {base + later} ({chosen.source} offsets)")
        return chosen
    chosen = usable[0]
    others = ", ".join(f"{c.source} {base + c.start}-{base + c.stop}" for c in usable[1:])
    notes.append(f"HEADER and TEXT offsets disagree ({chosen.source} {base + chosen.start}-"
                 f"{base + chosen.stop}, {others}); read from the {chosen.source} offsets")
    return chosen


def _locate_data(path, header, text, base, file_size, bits_per_event, declared_events, notes,
                 exact_only=False):
    """Choose the DATA segment among the HEADER and TEXT offsets.

    A candidate must lie after the HEADER and TEXT segments (overlapping neither, nor an
    ANALYSIS segment), fit in the file, and hold $TOT times the bits per event (rounded up to
    whole bytes): exactly, one byte more or less (a common writer bug), or padded by less than
    one event. Returns (absolute start, bytes to read, source, events); with ``exact_only``,
    None when no candidate matches exactly (length within one byte). Raises FCSError naming
    the problem when no candidate is usable.
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
    segments = _other_segments(header, text)

    if declared_events is None:
        # The count comes from the segment: the first that lies inside the file, after TEXT.
        placed = [c for c in candidates
                  if _problem(c, c.length, 0, segments, base, file_size, exact=True) is None]
        if not placed:
            problem = _problem(candidates[0], candidates[0].length, 0, segments, base, file_size,
                               exact=True)
            raise FCSError(path, f"$TOT is missing and {problem}")
        length = placed[0].length
        declared_events = 8 * length // bits_per_event
        if 8 * length - declared_events * bits_per_event >= 16:
            raise FCSError(path, f"$TOT is missing and the DATA segment ({length} bytes) is not a "
                                 f"whole number of {per_event} events")
        notes.append("$TOT missing; event count taken from the DATA segment length")

    needed = (declared_events * bits_per_event + 7) // 8
    if needed == 0:
        return base + candidates[0].start, 0, candidates[0].source, 0
    problems = {c: _problem(c, needed, bits_per_event / 8, segments, base, file_size,
                            exact=exact_only) for c in candidates}
    usable = [c for c in candidates if problems[c] is None]
    if not usable:
        if exact_only:
            return None
        # what a user can act on first: a file cut short in copying or acquisition, said once
        cut = all(p.endswith(("the file is truncated", "or was cut short")) for p in problems.values())
        listed = "; ".join(problems[c].removesuffix(": the file is truncated") if cut else problems[c]
                           for c in candidates)
        raise FCSError(path, ("the file is truncated (cut short when copied or written): " if cut else "")
                       + f"the DATA segment cannot be located: $TOT = {declared_events} "
                         f"events x {per_event} = {needed} bytes; {listed}")
    chosen = _choose(path, usable, base, needed, notes)
    if chosen.length != needed:
        notes.append(f"DATA segment per {chosen.source} offsets is {chosen.length} bytes, expected "
                     f"{needed}; read {needed} bytes from byte {base + chosen.start}")
    if chosen.source != candidates[0].source and problems[candidates[0]] is not None:
        notes.append(f"DATA located from the {chosen.source} offsets (the "
                     f"{candidates[0].source} offsets are unusable: {problems[candidates[0]]})")
    return base + chosen.start, needed, chosen.source, declared_events


def _locate_ascii_data(path, header, text, base, file_size, declared_events, n_channels):
    """DATA segment of delimited ASCII values: its length is not implied by $TOT, but each
    value takes at least one character and one separator; the segment must lie inside the file
    and after TEXT."""
    if declared_events is None:
        raise FCSError(path, "delimited ASCII data ($PnB *) need $TOT to be read")
    segments = _other_segments(header, text)
    problems = []
    for c in _data_candidates(header, text, path):
        problem = _problem(c, c.length, 0, segments, base, file_size, exact=True)
        if problem is not None:
            problems.append(problem)
            continue
        if declared_events * n_channels > (c.length + 1) // 2:
            raise FCSError(path, f"$TOT = {declared_events} events x {n_channels} delimited "
                                 f"ASCII values cannot fit in the {c.length}-byte DATA segment")
        return base + c.start, c.length, c.source, declared_events
    if declared_events == 0:
        return base, 0, "TEXT", 0
    raise FCSError(path, "the DATA segment of the delimited ASCII data cannot be located: "
                         + ("; ".join(problems) if problems else "no offsets given"))
