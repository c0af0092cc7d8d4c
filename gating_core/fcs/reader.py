"""Reading whole data sets: every data set of a file walked (``$NEXTDATA``; an unreadable one
skipped when others can be read), :func:`read_fcs`, :func:`read_fcs_all`, :func:`fcs_info`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gating_core.errors import open_input
from gating_core.fcs.data import _check_finite, _events_from_raw, _raw_values, _raw_values_flowio
from gating_core.fcs.layout import _Layout, _layout_from_text, _unique_names
from gating_core.fcs.sample import FCSError, Sample, SampleList
from gating_core.fcs.spillover import _channels_and_spillover, _parse_spillover
from gating_core.fcs.text import MAX_DATA_SETS, _read_data_set_text


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
        try:
            dst = _read_data_set_text(fh, path, base, file_size)
        except FCSError as exc:
            if not entries:
                raise
            # A later data set whose HEADER or TEXT cannot be read (cut short, overwritten):
            # listed as unreadable, the ones before it are read.
            previous = entries[-1]
            version = previous.header.version if isinstance(previous, _Layout) else previous.version
            entries.append(_Unreadable(base, version, exc))
            break
        try:
            entry = _layout_from_text(dst, path, file_size)
        except FCSError as exc:
            entry = _Unreadable(base, dst.header.version, exc)
        entries.append(entry)
        if dst.nextdata == 0:
            break
        next_base = base + dst.nextdata
        if dst.nextdata > 0 and next_base >= file_size:
            # The next data set lies past the end: the file was cut short. It is listed as
            # unreadable (gate and info report it), the data sets before it are read.
            entries.append(_Unreadable(next_base, dst.header.version, FCSError(
                path, f"$NEXTDATA of data set {len(entries)} points to byte {next_base} but the file "
                      f"has only {file_size} bytes: the file is truncated")))
            break
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


def data_set_names(path: str | os.PathLike) -> list[str]:
    """The names :func:`read_fcs_all` gives the data sets of ``path`` (``<stem>``, or
    ``<stem>#k`` when there are several), from the HEADER and TEXT segments only; an empty list
    when the file cannot be read at all."""
    path = Path(path)
    try:
        with _open(path) as fh:
            entries = _walk_layouts(fh, path, os.fstat(fh.fileno()).st_size)
    except FCSError:
        return []
    return _names(path, len(entries))


def fcs_info(path: str | os.PathLike) -> dict:
    """Describe an FCS file without reading its events (offsets and sizes are validated).

    Returns a JSON-ready dict: ``file``, ``version``, ``n_datasets`` and ``datasets``, a list of
    ``{name, events, n_channels, channels: [{pnn, pns, range, log_decades, gain}], datatype,
    spillover, spillover_channels, notes}`` (``range``: $PnR, or None; ``log_decades``: $PnE's
    decades, 0 for a linear channel; ``gain``: $PnG, 1 when absent); a data set that cannot be
    read is ``{name, error, notes}``.
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
            "channels": [{"pnn": n, "pns": s, "range": r, "log_decades": float(d), "gain": float(g)}
                         for n, s, r, d, g in zip(unique_pnn, layout.pns, layout.ranges, layout.decades,
                                                  layout.gains)],
            "datatype": layout.datatype,
            "spillover": spillover is not None,
            "spillover_channels": spill_channels,
            "notes": notes,
        })
    version = entries[0].header.version if isinstance(entries[0], _Layout) else entries[0].version
    return {"file": str(path), "version": version, "n_datasets": len(entries),
            "datasets": datasets}
