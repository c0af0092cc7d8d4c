"""Chunked reading: :class:`EventStream` reads one data set window by window, so memory stays
a few chunks whatever the file size; :func:`stream_fcs_all`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gating_core.cpus import parallel_rows
from gating_core.fcs.data import _check_finite, _events_from_raw, _raw_values
from gating_core.fcs.layout import _Layout
from gating_core.fcs.reader import _open, _readable_data_sets, _skipped_notes, _walk_layouts
from gating_core.fcs.sample import Sample, SampleList, _compensation_inverse
from gating_core.fcs.spillover import _channels_and_spillover


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
            with np.errstate(over="ignore"):  # beyond float32: inf, which gating refuses by name
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


def _replace_layout(layout: _Layout, **changes) -> _Layout:
    import dataclasses

    return dataclasses.replace(layout, **changes)


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
