"""Quality flags of one FCS data set, and which compensation it carries.

What a lab checks before trusting a file:

* **Saturation.** A detector that reaches the top of its range stores ``$PnR - 1`` (the
  largest value its ADC can give); every brighter cell piles up there and its true value is
  lost. :func:`quality_flags` counts, per channel, the events at or above ``$PnR - 1`` on the
  stored (raw) scale and flags a channel when more than ``saturation_threshold`` of the events
  (default 1%) sit there. The time channel is left out (its range is a clock, not a detector).
* **Time drift.** When the file has a time channel, the acquisition is cut into ``n_bins``
  bins of equal duration. Two things are flagged: the event rate (a bin with fewer than
  ``rate_drop`` x the median bin's events: a clog, a bubble, an empty tube; a bin with none
  is a gap), and the median of each fluorescence channel (each bin's median, expressed as the
  percentile it has among all events of the file; without drift every bin's median sits where
  the file's median does, near the 50th percentile; a channel is flagged when some bin's
  median moves more than ``drift_threshold`` percentile points, default 10, away from it).
  Percentiles make the test free of any display transform: it reads the same on linear,
  logicle or arcsinh data. Ties count half below and half above, and the file's own median is
  the reference rather than 50, so a channel where most events share one value (zeros on a
  mass cytometer) does not read as drift.

The reader (:mod:`gating_core.fcs`) returns events on a linear scale: ``$PnE`` log
amplification decoded, ``$PnG`` divided out, and the app's samples are compensated. The
ceiling ``$PnR - 1`` is carried through the same decoding here (and compensation undone with
the sample's own spillover matrix), so the test is the one on the stored values.

:func:`compensation_info` says which spillover matrix a sample carries and from which keyword
(``$SPILLOVER``, ``SPILL``, ``$SPILL``), whether it was applied, and what the file holds that
was not used (``$COMP``, a spillover keyword the reader had to ignore).

Neither function imports pandas at import time; ``to_frame`` methods do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ChannelSaturation", "ChannelDrift", "QualityReport", "CompensationInfo", "quality_flags",
           "compensation_info", "time_channel_index", "raw_ceiling"]

#: Default thresholds (see the module docstring for what each measures).
SATURATION_THRESHOLD = 0.01
DRIFT_THRESHOLD = 10.0
RATE_DROP = 0.5
N_BINS = 10
#: Fewer events than this per time bin and the bin medians are too noisy to judge drift.
MIN_EVENTS_PER_BIN = 100
#: At most this many events (every k-th, in acquisition order) give the file's percentiles.
MAX_REFERENCE_EVENTS = 200_000
# Compensation undone in float64 from float32 values: a saturated event comes back within a
# few millionths of the ceiling, far closer than the next value an ADC can give.
_RELATIVE_TOLERANCE = 2e-6

# Not fluorescence: scatter, Miltenyi's housekeeping (HDR-*), a mass cytometer's event
# descriptors (Fluidigm / Standard BioTools).
_NOT_FLUORESCENCE = re.compile(r"^((FSC|SSC|FS|SS|HDR)([\s\-_].*)?|event_length|center|offset|width|residual)$",
                               re.IGNORECASE)


@dataclass
class ChannelSaturation:
    """Events at the top of one channel's range."""

    channel: str
    label: str
    ceiling: float          # $PnR - 1 carried to the linear scale of Sample.events
    saturated: int          # events at or above it
    fraction: float         # saturated / n_events
    flagged: bool


@dataclass
class ChannelDrift:
    """How far a channel's median moves during the acquisition."""

    channel: str
    label: str
    bin_percentiles: list[float]   # each time bin's median, as a percentile of all events
    reference: float               # the file's median, as a percentile of all events (~50)
    max_shift: float               # largest |bin percentile - reference|, in percentile points
    worst_bin: int                 # the bin where it is largest (0-based)
    flagged: bool


@dataclass
class QualityReport:
    """Quality flags of one sample (see :func:`quality_flags`).

    ``flags`` holds one sentence per problem found, for display; empty for a clean file.
    ``notes`` says what could not be checked and why.
    """

    sample_name: str
    n_events: int
    saturation: list[ChannelSaturation]
    time_channel: str | None = None
    bin_edges: list[float] = field(default_factory=list)     # n_bins + 1 times, in the file's unit
    bin_counts: list[int] = field(default_factory=list)      # events per time bin
    rate_ratio: float | None = None                          # fewest events in a bin / median bin
    gaps: int = 0                                            # bins without a single event
    drift: list[ChannelDrift] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    def saturation_frame(self):
        """DataFrame: channel, label, ceiling, saturated, % saturated, flagged."""
        import pandas as pd

        return pd.DataFrame([{"channel": s.channel, "label": s.label, "ceiling": s.ceiling,
                              "saturated": s.saturated, "% saturated": 100.0 * s.fraction,
                              "flagged": s.flagged} for s in self.saturation],
                            columns=["channel", "label", "ceiling", "saturated", "% saturated", "flagged"])

    def drift_frame(self):
        """DataFrame: channel, label, max shift (percentile points), worst bin (1-based), flagged."""
        import pandas as pd

        return pd.DataFrame([{"channel": d.channel, "label": d.label, "max shift (percentile points)": d.max_shift,
                              "worst bin": d.worst_bin + 1, "flagged": d.flagged} for d in self.drift],
                            columns=["channel", "label", "max shift (percentile points)", "worst bin", "flagged"])


def _keyword(keywords: dict, name: str) -> str:
    """A keyword's value whatever its case and leading ``$`` ("" when absent)."""
    wanted = name.lstrip("$").upper()
    for key, value in keywords.items():
        if str(key).lstrip("$").strip().upper() == wanted:
            return str(value).strip()
    return ""


def _number(text: str, default: float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return default
    return value if np.isfinite(value) else default


def time_channel_index(sample) -> int | None:
    """Index of the time channel ($PnN "Time" in any case, else $PnTYPE Time), or None."""
    for i, name in enumerate(sample.pnn):
        if name.strip().lower() == "time":
            return i
    for i in range(len(sample.channels)):
        if _keyword(sample.keywords, f"P{i + 1}TYPE").lower() == "time":
            return i
    return None


def raw_ceiling(sample, index: int) -> float | None:
    """``$PnR - 1`` of channel ``index`` on the scale of ``sample.events`` (None without $PnR).

    The reader's decoding, applied to the ceiling: integer data with ``$PnE f1,f2`` (f1 > 0)
    give ``10 ** (f1 * (R - 1) / R) * f2`` (f2 = 0 read as 1); linear data are divided by a
    positive ``$PnG``; floating-point data are never log-decoded, and their ``$PnG`` is not
    applied when ``$PnE`` marks them logarithmic (as in :mod:`gating_core.fcs`).
    """
    channel = sample.channels[index]
    limit = channel.range
    if limit is None or not np.isfinite(limit) or limit <= 1:
        return None
    k = index + 1
    datatype = (_keyword(sample.keywords, f"P{k}DATATYPE") or _keyword(sample.keywords, "DATATYPE") or "F").upper()
    decades, offset = 0.0, 0.0
    parts = _keyword(sample.keywords, f"P{k}E").split(",")
    if len(parts) == 2:
        decades, offset = _number(parts[0], 0.0), _number(parts[1], 0.0)
    gain = _number(_keyword(sample.keywords, f"P{k}G"), 1.0)
    if decades > 0 and datatype in ("F", "D"):
        return float(limit - 1)  # stored as is, gain not applied
    if decades > 0:
        return float(10.0 ** (decades * (limit - 1) / limit) * (offset if offset != 0 else 1.0))
    return float((limit - 1) / gain) if gain > 0 else float(limit - 1)


def _stored_scale(sample) -> np.ndarray:
    """The events before compensation: compensated samples are multiplied back by their matrix."""
    if not (sample.compensated and sample.spillover is not None):
        return sample.events
    idx = [sample.channel_index(n) for n in sample.spillover_channels]
    events = np.array(sample.events, dtype=np.float64)
    events[:, idx] = events[:, idx] @ np.asarray(sample.spillover, dtype=np.float64)
    return events


def _label(sample, index: int) -> str:
    return sample.channels[index].label


def _saturation(sample, events, time_index, threshold) -> list[ChannelSaturation]:
    n = max(sample.n_events, 1)
    rows = []
    for i, channel in enumerate(sample.channels):
        if i == time_index:
            continue
        ceiling = raw_ceiling(sample, i)
        if ceiling is None:
            continue
        tolerance = _RELATIVE_TOLERANCE * abs(ceiling) if sample.compensated else 0.0
        count = int(np.count_nonzero(events[:, i] >= ceiling - tolerance))
        fraction = count / n
        rows.append(ChannelSaturation(channel.pnn, _label(sample, i), ceiling, count, fraction,
                                      fraction > threshold))
    return rows


def _mid_percentile(sorted_values: np.ndarray, value: float) -> float:
    """Percentile of ``value`` among ``sorted_values``, ties counted half below, half above."""
    below = np.searchsorted(sorted_values, value, side="left")
    upto = np.searchsorted(sorted_values, value, side="right")
    return 100.0 * (below + upto) / (2.0 * len(sorted_values))


def fluorescence_channels(sample, time_index=None) -> list[int]:
    """Channels that are neither time, scatter (FSC / SSC / FS / SS names) nor instrument
    housekeeping (HDR-*, Event_length, Center, Offset, Width, Residual)."""
    return [i for i, c in enumerate(sample.channels)
            if i != time_index and not _NOT_FLUORESCENCE.match(c.pnn.strip())]


def quality_flags(sample, *, saturation_threshold: float = SATURATION_THRESHOLD, n_bins: int = N_BINS,
                  drift_threshold: float = DRIFT_THRESHOLD, rate_drop: float = RATE_DROP) -> QualityReport:
    """Saturation and time-drift flags of one sample.

    Parameters
    ----------
    sample : gating_core.fcs.Sample
        Events of shape (n_events, n_channels), compensated or not (compensation is undone
        for the saturation count).
    saturation_threshold : float
        A channel is flagged when more than this fraction of events sit at or above its
        ``$PnR - 1``.
    n_bins : int
        Time bins of equal duration for the drift checks.
    drift_threshold : float
        Percentile points a bin's median may move from the file's median (both as
        percentiles of the whole file).
    rate_drop : float
        A time bin with fewer events than this times the median bin's is a rate drop.

    Returns
    -------
    QualityReport
    """
    events = np.asarray(sample.events)
    time_index = time_channel_index(sample)
    report = QualityReport(sample.name, sample.n_events, [], thresholds={
        "saturation": saturation_threshold, "drift": drift_threshold, "rate drop": rate_drop, "bins": n_bins})
    report.saturation = _saturation(sample, _stored_scale(sample), time_index, saturation_threshold)
    for s in report.saturation:
        if s.flagged:
            report.flags.append(f"{s.label}: {s.saturated:,} events ({100 * s.fraction:.1f}%) at the top of "
                                f"the range (>= $PnR - 1), above the {100 * saturation_threshold:g}% threshold")
    if time_index is None:
        report.notes.append("no time channel: drift during the acquisition cannot be checked")
        return report
    report.time_channel = sample.pnn[time_index]
    if sample.n_events < n_bins * MIN_EVENTS_PER_BIN:
        report.notes.append(f"{sample.n_events:,} events: too few for {n_bins} time bins of at least "
                            f"{MIN_EVENTS_PER_BIN} events; drift not checked")
        return report
    time = events[:, time_index].astype(np.float64)
    start, stop = float(time.min()), float(time.max())
    if not stop > start:
        report.notes.append(f"the time channel {report.time_channel} is constant; drift not checked")
        return report
    if np.any(np.diff(time) < 0):
        report.notes.append(f"the time channel {report.time_channel} goes backwards (several acquisitions "
                            "or a clock reset?); events binned by their time value")
    edges = np.linspace(start, stop, n_bins + 1)
    bins = np.clip(np.searchsorted(edges, time, side="right") - 1, 0, n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    report.bin_edges = [float(e) for e in edges]
    report.bin_counts = [int(c) for c in counts]
    median_count = float(np.median(counts))
    report.rate_ratio = float(counts.min() / median_count) if median_count > 0 else 0.0
    report.gaps = int(np.count_nonzero(counts == 0))
    low = np.flatnonzero(counts < rate_drop * median_count)
    if report.gaps:
        report.flags.append(f"event rate: {report.gaps} of {n_bins} time bins hold no events (a gap in the "
                            "acquisition)")
    elif low.size:
        report.flags.append(f"event rate: time bin {int(low[0]) + 1} of {n_bins} holds {int(counts[low[0]]):,} "
                            f"events, {100 * report.rate_ratio:.0f}% of the median bin (threshold "
                            f"{100 * rate_drop:.0f}%): a clog, a bubble or an emptying tube?")
    step = max(1, -(-sample.n_events // MAX_REFERENCE_EVENTS))
    usable = counts >= MIN_EVENTS_PER_BIN
    for i in fluorescence_channels(sample, time_index):
        column = events[:, i]
        ordered = np.sort(column[::step].astype(np.float64))
        reference = float(_mid_percentile(ordered, float(np.median(ordered))))
        percentiles = [float(_mid_percentile(ordered, float(np.median(column[bins == b])))) if usable[b]
                       else float("nan") for b in range(n_bins)]
        shifts = np.abs(np.asarray(percentiles) - reference)
        worst = int(np.nanargmax(shifts))
        drift = ChannelDrift(sample.pnn[i], _label(sample, i), percentiles, reference, float(shifts[worst]),
                             worst, bool(shifts[worst] > drift_threshold))
        report.drift.append(drift)
        if drift.flagged:
            report.flags.append(f"{drift.label}: the median moves to the {percentiles[worst]:.0f}th percentile "
                                f"in time bin {worst + 1} of {n_bins} ({drift.max_shift:.0f} points from the "
                                f"file's median, threshold {drift_threshold:g})")
    return report


# --------------------------------------------------------------------------------------------
# Compensation

@dataclass
class CompensationInfo:
    """Which spillover matrix a sample carries, where it came from, and whether it was applied.

    ``source`` is ``"$SPILLOVER"``, ``"SPILL"``, ``"$SPILL"`` (the keyword as the file spells
    it) or ``"none"``; ``matrix`` (k, k) and ``channels`` ($PnN) / ``labels`` ("marker (PnN)")
    name its rows and columns. ``notes`` lists what the file holds that was not used.
    """

    source: str
    applied: bool
    matrix: np.ndarray | None = None
    channels: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        if self.matrix is None:
            return "no spillover matrix: events used as stored" + (f" ({self.notes[0]})" if self.notes else "")
        k = len(self.channels)
        state = "applied" if self.applied else "not applied"
        return f"{k} x {k} spillover matrix from keyword {self.source}, {state}"

    def to_frame(self):
        """The matrix as a DataFrame, rows and columns labelled by marker (detector)."""
        import pandas as pd

        if self.matrix is None:
            return pd.DataFrame()
        return pd.DataFrame(self.matrix, index=self.labels, columns=self.labels)


def compensation_info(sample) -> CompensationInfo:
    """What :class:`CompensationInfo` describes, read from the sample's keywords and matrix.

    The keyword is the one the reader takes first: ``$SPILLOVER`` (or ``SPILLOVER``), then
    ``SPILL`` / ``$SPILL``. ``$COMP`` (FCS 2.0/3.0) is named in ``notes`` when present: the
    reader does not apply it.
    """
    keys = {str(k).lstrip("$").strip().upper(): str(k) for k in sample.keywords}
    notes = [n for n in sample.notes if "SPILL" in n.upper() and "ignored" in n]
    if "COMP" in keys and _keyword(sample.keywords, "COMP"):
        notes.append(f"the file holds {keys['COMP']}, which is not applied (only $SPILLOVER / SPILL are)")
    if sample.spillover is None:
        return CompensationInfo("none", False, notes=notes)
    source = next((keys[k] for k in ("SPILLOVER", "SPILL") if k in keys), "spillover matrix (source unknown)")
    labels = []
    for name in sample.spillover_channels:
        try:
            labels.append(_label(sample, sample.channel_index(name)))
        except KeyError:
            labels.append(name)
    return CompensationInfo(source, bool(sample.compensated), np.asarray(sample.spillover, dtype=np.float64),
                            list(sample.spillover_channels), labels, notes)
