"""Where a data set's DATA segment is: whichever of the HEADER / TEXT offsets agrees with
``$TOT`` x bits per event (blank or zero HEADER offsets, off-by-one ``$ENDDATA``).
"""

from __future__ import annotations

from gating_core.fcs.sample import FCSError
from gating_core.fcs.text import _int_keyword


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
