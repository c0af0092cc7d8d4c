"""Data preparation for scatter plots and histograms of cytometry events.

Nothing here draws: it turns events into what a plot needs, cheaply enough for a million events
per patient. Pseudocolor density is a 2-D histogram of *all* events (``numpy.histogram2d``, one
pass); dots colored by population use a fixed, reproducible display subsample, while counts
always come from all events. Axis ticks sit at round *raw* values (0, 10, 100, 1000, ...) placed
at their transformed positions, so an arcsinh or logicle axis still reads in instrument units.
The population view (each bin coloured by its majority population) is
:mod:`gating_core.reports.population_view`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from gating_core.gates import AxisScale, suggest_scale  # noqa: F401  (re-exported for callers)

# Okabe-Ito-like qualitative palette, readable for common colour-vision deficiencies, then more.
PALETTE = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
    "#8C564B", "#9467BD", "#17BECF", "#BCBD22", "#7F7F7F", "#1F77B4", "#FF7F0E", "#2CA02C",
]
OTHER_COLOR = "#B0B0B0"
#: Greys for a second, third... catch-all population (a lab's "other" beside its "ungated").
OTHER_COLORS = (OTHER_COLOR, "#6E6E6E", "#D4D4D4", "#8F8F8F")


def channel_label(pnn: str, pns: str | None = "") -> str:
    """How a channel is named to people: its marker ($PnS) with the detector ($PnN) once.

    ``("FL3-A", "CD4")`` -> ``"CD4 (FL3-A)"``; without a marker, or when the marker is the
    detector name, just ``"FL3-A"``; when the marker text already names the detector
    (``"Forward Scatter (FSC-HLin)"``) it is shown as is, never with the detector a second time.
    Every table, axis and picker of the app names channels through this function.
    """
    pnn = str(pnn)
    marker = str(pns or "").strip()
    if not marker or marker.casefold() == pnn.strip().casefold():
        return pnn
    if pnn.strip() and pnn.strip().casefold() in marker.casefold():
        return marker
    return f"{marker} ({pnn})"


def sample_channel_label(sample, pnn: str) -> str:
    """:func:`channel_label` of the channel ``pnn`` of ``sample`` (``pnn`` itself when absent)."""
    try:
        channel = sample.channels[sample.channel_index(pnn)]
    except (KeyError, IndexError, ValueError):
        return str(pnn)
    return channel_label(channel.pnn, channel.pns)


def subsample_indices(n_events: int, max_points: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of at most ``max_points`` events, the same for the same (n, max, seed)."""
    if n_events <= max_points:
        return np.arange(n_events)
    return _drawn_subsample(int(n_events), int(max_points), int(seed)).copy()


@functools.lru_cache(maxsize=16)
def _drawn_subsample(n_events: int, max_points: int, seed: int) -> np.ndarray:
    # Drawing 500,000 of a million events (a full permutation, then a sort) costs ~50 ms and
    # every robust axis range of a large patient asks for the same draw: kept once per size.
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_events, size=max_points, replace=False))


def display_range(values: np.ndarray, low_pct: float = 0.1, high_pct: float = 99.9, pad: float = 0.05):
    """Robust (lo, hi) of display-coordinate values: percentiles with a small margin.

    Accepts a 1-D array or a list of arrays (several patients share one range).
    """
    if isinstance(values, (list, tuple)):
        parts = [np.asarray(v, dtype=np.float64).ravel() for v in values]
        values = np.concatenate(parts) if parts else np.zeros(1)
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (0.0, 1.0)
    if values.size > 500_000:  # percentiles of a fixed subsample are as good and 10x cheaper
        values = values[subsample_indices(values.size, 500_000)]
    lo, hi = np.percentile(values, [low_pct, high_pct])
    if not hi > lo:
        lo, hi = float(values.min()), float(values.max())
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    margin = (hi - lo) * pad
    return (float(lo - margin), float(hi + margin))


#: A lattice finer than this many of its steps per bin is left to plain bins: one value more or
#: less in a bin then moves its count by at most 1/64.
LATTICE_MAX_STEPS_PER_BIN = 64


def value_lattice(values: np.ndarray, max_values: int = 100_000):
    """(step, origin) of the evenly spaced values every finite value sits on, or None.

    Channel numbers (FlowCAP files, a FACSCalibur's 10-bit data, FlowJo's channel-value exports)
    are integers. Equal bins over them hold 3 or 4 of those values by turns, so a histogram of a
    smooth population comes out as a comb and a density as stripes; :func:`lattice_bins` gives
    bins that each hold the same number of them. The step is the smallest gap between the
    distinct values of a subsample, checked on every value; ``origin`` lies in ``[0, step)``.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    sample = values[subsample_indices(values.size, max_values)] if values.size > max_values else values
    head = np.unique(sample[:2_000])
    if head.size >= 2 and not _on_lattice(head, *_lattice_of(head)):
        return None  # continuous values, told apart on a few (each control change of the app asks)
    distinct = np.unique(sample)
    if distinct.size < 2:
        return None
    step, origin = _lattice_of(distinct)
    if not (_on_lattice(distinct, step, origin) and _on_lattice(values, step, origin)):
        return None
    return step, origin


def _lattice_of(distinct: np.ndarray) -> tuple:
    """(step, origin) of sorted distinct values: their smallest gap, and where its multiples
    start, in ``[0, step)``."""
    step = float(np.min(np.diff(distinct)))
    origin = float(distinct[0] - step * math.floor(distinct[0] / step))
    if origin > step * (1 - 1e-3):  # distinct[0] a hair below a multiple of the step
        origin = 0.0
    return step, origin


def _on_lattice(values: np.ndarray, step: float, origin: float) -> bool:
    position = (values - origin) / step
    return bool(np.max(np.abs(position - np.round(position)), initial=0.0) <= 1e-3)


def lattice_bins(value_range, lattice, bins: int = 200) -> tuple:
    """((low, high), count): equal bins covering ``value_range``, about ``bins`` of them, each
    holding the same whole number of the values of ``lattice`` (:func:`value_lattice`) with its
    edges halfway between two of them. ``lattice`` None, or finer than
    ``LATTICE_MAX_STEPS_PER_BIN`` steps a bin: ``value_range`` and ``bins`` as given."""
    low, high = float(value_range[0]), float(value_range[1])
    if lattice is None or not high > low:
        return (low, high), int(bins)
    step, origin = float(lattice[0]), float(lattice[1])
    per_bin = max(1, math.ceil((high - low) / bins / step - 1e-9))
    if per_bin > LATTICE_MAX_STEPS_PER_BIN:
        return (low, high), int(bins)
    start = origin + (math.floor((low - origin) / step + 0.5) - 0.5) * step  # the half step at or below low
    width = per_bin * step
    count = max(1, math.ceil((high - start) / width - 1e-9))
    return (start, start + count * width), count


#: Bins per axis of a density view of many events.
DENSITY_BINS = 200
#: Fewest bins per axis of a density view, however few its events: fewer turn populations into blocks.
MIN_DENSITY_BINS = 50
#: Bins per axis per square root of the events drawn. With sqrt(n) bins a side the grid holds as
#: many bins as events, so the few bins a population covers average several events each: on the
#: FlowCAP DLBCL and multicenter files, subsampled to 2,000-20,000 events, 33-41% of the filled
#: bins then hold a single event (median 2-3 a filled bin), near the 31% of 200 bins over a
#: 55,000-event file, against 64-86% single-event bins (median 1) at 200 bins for 2,000-4,000
#: events, which read as scattered dashes rather than clusters. 1.2 left 4,000-event files speckled (76 bins); below
#: 0.9, files of 50,000 events would lose bins (0.8: 179).
DENSITY_BINS_PER_ROOT_EVENT = 1.0


def density_bins(n_events: int) -> int:
    """Bins per axis of a density view of ``n_events`` events.

    ``round(DENSITY_BINS_PER_ROOT_EVENT * sqrt(n_events))`` clipped to
    ``[MIN_DENSITY_BINS, DENSITY_BINS]``: 200 bins from 39,801 events up (every file of 50,000
    events or more), 62 for 3,796 events, 50 up to 2,550. Small files get bins coarse enough that
    their populations read as clusters, not as single events scattered over a fine grid.

    Parameters
    ----------
    n_events : int
        The events the density counts (a parent population's, when only those are drawn).

    Returns
    -------
    bins : int
        About this many bins per axis; :func:`lattice_bins` adjusts it for channel numbers.
    """
    wanted = round(DENSITY_BINS_PER_ROOT_EVENT * math.sqrt(max(int(n_events), 0)))
    return int(min(max(wanted, MIN_DENSITY_BINS), DENSITY_BINS))


def bin_counts(bins) -> tuple:
    """(x bins, y bins) of a grid given as one count for both axes or as a pair."""
    if np.ndim(bins) == 0:
        return int(bins), int(bins)
    x_bins, y_bins = bins
    return int(x_bins), int(y_bins)


def density_grid(x: np.ndarray, y: np.ndarray, x_range, y_range, bins=200):
    """2-D histogram of all events in display coordinates.

    bins : int, or (x bins, y bins)

    Returns
    -------
    counts : ndarray (y bins, x bins), int — rows are y bins, columns x bins (heatmap orientation)
    x_centers, y_centers : ndarray (x bins,), (y bins,)
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    counts, x_edges, y_edges = np.histogram2d(x[finite], y[finite], bins=list(bin_counts(bins)),
                                              range=[list(x_range), list(y_range)])
    return counts.T.astype(np.int64), (x_edges[:-1] + x_edges[1:]) / 2, (y_edges[:-1] + y_edges[1:]) / 2


def bin_indices(values: np.ndarray, value_range, bins: int = 200) -> np.ndarray:
    """The histogram bin of every value, for binning the same channel many times over.

    Bins are those of ``numpy.histogram`` / ``numpy.histogram2d`` with ``range=value_range``:
    ``bins`` equal bins between ``numpy.linspace`` edges, each closed on the left, the last
    also on the right, so counting these indices gives exactly their counts.

    Returns
    -------
    indices : ndarray (n,), int16 (int32 above 32,766 bins) -- in ``[0, bins)``, or ``bins``
        for a value outside the range or not finite.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    edges = np.linspace(float(value_range[0]), float(value_range[1]), bins + 1)
    lo, hi = edges[0], edges[-1]
    out = np.full(values.shape, bins, dtype=np.int16 if bins < np.iinfo(np.int16).max else np.int32)
    with np.errstate(invalid="ignore"):
        inside = (values >= lo) & (values <= hi)  # NaN is neither
    kept = values[inside]
    # Arithmetic bin, then moved by one where rounding put a value across an edge -- what
    # numpy.histogram does for equal bins; 5x cheaper than searchsorted on the edges.
    index = ((kept - lo) * (bins / (hi - lo))).astype(np.intp)
    index[index == bins] = bins - 1
    index[kept < edges[index]] -= 1
    index[(kept >= edges[index + 1]) & (index != bins - 1)] += 1
    out[inside] = index
    return out


def bin_centers(value_range, bins: int) -> np.ndarray:
    """Centres of ``bins`` equal bins spanning ``value_range``: ndarray (bins,)."""
    edges = np.linspace(float(value_range[0]), float(value_range[1]), bins + 1)
    return (edges[:-1] + edges[1:]) / 2


def density_from_bins(x_bins: np.ndarray, y_bins: np.ndarray, x_range, y_range, bins=200, mask=None):
    """:func:`density_grid` from :func:`bin_indices` of both channels (same bins, same result):
    one ``numpy.bincount`` instead of a 2-D histogram, 15-25x less time per pair of channels at a
    million events once each channel's bins are known (``bench/bench_explore.py``).

    bins : int, or (x bins, y bins)
    mask : optional (n,) bool, the events to count (a parent population).
    """
    n_x, n_y = bin_counts(bins)
    # the last row and column collect the events outside the ranges
    flat = y_bins.astype(np.int32) * (n_x + 1) + x_bins
    if mask is not None:
        flat = flat[np.asarray(mask, dtype=bool)]
    counts = np.bincount(flat, minlength=(n_x + 1) * (n_y + 1)).reshape(n_y + 1, n_x + 1)[:n_y, :n_x]
    return counts.astype(np.int64), bin_centers(x_range, n_x), bin_centers(y_range, n_y)


def histogram_from_bins(value_bins: np.ndarray, value_range, bins: int = 200, mask=None):
    """:func:`histogram_1d` from :func:`bin_indices` (same bins, same counts)."""
    if mask is not None:
        value_bins = value_bins[np.asarray(mask, dtype=bool)]
    counts = np.bincount(value_bins, minlength=bins + 1)[:bins]
    return counts.astype(np.int64), bin_centers(value_range, bins)


def log_density(counts: np.ndarray) -> np.ndarray:
    """log10(counts) with empty bins as NaN, so they show as background in a heatmap (1 event -> 0)."""
    out = np.full(counts.shape, np.nan)
    filled = counts > 0
    out[filled] = np.log10(counts[filled])
    return out


#: A row or column of density bins holding more than this share of the events, and more than
#: PILE_CONTRAST times as many as the denser of its neighbours, is a pile at one value (the exact
#: zeros of mass cytometry: 2-53% of a channel's events in the multicenter samples; a saturated
#: detector), not a population.
PILE_SHARE = 0.01
PILE_CONTRAST = 5.0


def _pile_lines(totals: np.ndarray, n_events: float) -> np.ndarray:
    """Which of a grid's row (or column) ``totals`` are piles (see :data:`PILE_SHARE`)."""
    padded = np.concatenate([[0.0], totals, [0.0]])
    neighbours = np.maximum(padded[:-2], padded[2:])
    return (totals > PILE_SHARE * n_events) & (totals > PILE_CONTRAST * neighbours)


def density_top(counts: np.ndarray) -> int:
    """The bin count at the top of a density plot's colour scale: the largest bin outside the
    piles at one value, so that a pile holding half the events does not leave every population
    in the scale's lowest colours (its bins show in the top colour). (ny, nx) counts; the largest
    bin of all where every filled bin lies in a pile."""
    counts = np.asarray(counts)
    total = float(counts.sum())
    if total == 0:
        return 0
    keep = ~_pile_lines(counts.sum(axis=1).astype(np.float64), total)[:, None] \
        & ~_pile_lines(counts.sum(axis=0).astype(np.float64), total)[None, :]
    kept = counts[keep]
    return int(kept.max()) if kept.size and kept.max() > 0 else int(counts.max())


def histogram_1d(values: np.ndarray, value_range, bins: int = 200):
    """Counts and bin centers of one channel in display coordinates (all events)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    counts, edges = np.histogram(values, bins=bins, range=tuple(value_range))
    return counts, (edges[:-1] + edges[1:]) / 2


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def _format_raw(value: float) -> str:
    """Short raw-unit label: 0, 10, 1000, 10\u2074 (powers of ten above 10^4 as superscripts)."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    sign = "-" if value < 0 else ""
    exponent = math.log10(magnitude)
    if abs(exponent - round(exponent)) < 1e-9 and (round(exponent) > 6 or round(exponent) < -2):
        return f"{sign}10" + str(int(round(exponent))).translate(_SUPERSCRIPT)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}K"
    return f"{value:g}"


def _nice_linear_ticks(lo: float, hi: float, target: int = 6) -> np.ndarray:
    span = hi - lo
    if not span > 0:
        return np.array([lo])
    raw_step = span / target
    power = 10 ** math.floor(math.log10(raw_step))
    step = min((m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw_step), default=10 * power)
    start = math.ceil(lo / step) * step
    return np.arange(start, hi + step * 1e-9, step)


#: A stretch of an arcsinh / logicle axis wider than this share of the axis with no decade tick
#: in it (between two ticks, or between an end and its nearest tick) gets 5·10^k, then 2·10^k ticks.
UNLABELLED_STRETCH = 1 / 3


def _widest_stretches(positions, display_lo: float, display_hi: float) -> list:
    """(low, high) of the stretches of the axis between its ends and the sorted tick
    ``positions``, widest first."""
    bounds = [display_lo, *positions, display_hi]
    stretches = list(zip(bounds[:-1], bounds[1:]))
    return sorted(stretches, key=lambda stretch: stretch[0] - stretch[1])


def _fill_unlabelled_stretches(scale: AxisScale, kept_raw: list, display_lo: float, display_hi: float,
                               raw_lo: float, raw_hi: float, min_gap: float, max_ticks: int) -> list:
    """``kept_raw`` (the raw values of the decade ticks) with 5·10^k, then 2·10^k added in the
    stretches of the axis wider than ``UNLABELLED_STRETCH`` of it, nearest a stretch's middle
    first, each at least ``min_gap`` from every tick, up to ``max_ticks`` ticks.

    Channel numbers (0-1023) on an arcsinh axis of cofactor 150 span 0 to 10^3: decade ticks
    at 0, 100 and 1000 leave the upper part of the axis, where the populations sit, unlabelled.
    Typical flow and mass cytometry axes have no such stretch and keep their decades alone.
    """
    kept_raw = list(kept_raw)
    longest = (display_hi - display_lo) * UNLABELLED_STRETCH
    for multiplier in (5.0, 2.0):
        raw = np.array([sign * multiplier * 10.0 ** k for k in range(-3, 10) for sign in (1.0, -1.0)])
        raw = raw[(raw >= raw_lo) & (raw <= raw_hi)]
        positions = scale.forward(raw)
        while len(kept_raw) < max_ticks:
            taken = np.sort(scale.forward(np.array(kept_raw, dtype=np.float64)))
            added = False
            for low, high in _widest_stretches(taken, display_lo, display_hi):
                if high - low <= longest:
                    break
                fits = [i for i in range(raw.size) if low < positions[i] < high
                        and np.all(np.abs(taken - positions[i]) >= min_gap)]
                if fits:
                    middle = (low + high) / 2
                    kept_raw.append(float(raw[min(fits, key=lambda i: abs(positions[i] - middle))]))
                    added = True
                    break
            if not added:
                break
    return sorted(kept_raw)


#: Ticks of an arcsinh / logicle axis keep at least this share of the axis between them.
MIN_TICK_GAP = 0.04


def raw_ticks(scale: AxisScale, display_lo: float, display_hi: float, max_ticks: int = 9,
              min_gap_share: float = MIN_TICK_GAP):
    """Tick positions (display coordinates) and labels (raw units) for an axis.

    Linear axes get round steps. arcsinh / logicle axes get 0 and ±10^k within the range,
    thinned so that no two are closer than ``min_gap_share`` of the axis (a narrow axis, such
    as one of several plots side by side, needs a larger share for its labels not to collide)
    and to at most ``max_ticks``; where those leave a stretch wider than ``UNLABELLED_STRETCH``
    of the axis unlabelled (a short range such as channel numbers 0-1023), 5·10^k and then
    2·10^k ticks are added in it.

    Returns
    -------
    tickvals : list of float (display coordinates)
    ticktext : list of str (raw values)
    """
    if scale.kind == "linear":
        ticks = _nice_linear_ticks(display_lo, display_hi)
        return [float(t) for t in ticks], [_format_raw(float(t)) for t in ticks]
    raw_lo, raw_hi = (float(v) for v in scale.inverse(np.array([display_lo, display_hi])))
    candidates = [0.0]
    for k in range(-3, 10):
        candidates.extend([10.0 ** k, -(10.0 ** k)])
    candidates = sorted(c for c in candidates if raw_lo <= c <= raw_hi)
    if not candidates:
        ticks = _nice_linear_ticks(display_lo, display_hi)
        raw = scale.inverse(ticks)
        return [float(t) for t in ticks], [f"{r:.3g}" for r in raw]
    positions = scale.forward(np.array(candidates))
    # Keep ticks at least 4% of the axis apart; 0 first, then large magnitudes, so a crowded
    # region near zero loses its small +-1, +-10 ticks rather than the decades users read.
    min_gap = (display_hi - display_lo) * min_gap_share
    priority = sorted(range(len(candidates)), key=lambda i: (candidates[i] != 0, -abs(candidates[i])))
    accepted: list[int] = []
    for i in priority:
        if all(abs(positions[i] - positions[j]) >= min_gap for j in accepted):
            accepted.append(i)
    kept_raw = _fill_unlabelled_stretches(scale, [candidates[i] for i in accepted], display_lo, display_hi,
                                          raw_lo, raw_hi, min_gap, max_ticks)
    kept_vals = [float(v) for v in scale.forward(np.array(kept_raw))]
    kept_text = [_format_raw(v) for v in kept_raw]
    while len(kept_vals) > max_ticks:
        kept_vals, kept_text = kept_vals[::2], kept_text[::2]
    return kept_vals, kept_text


def population_colors(populations) -> dict:
    """Stable colour per population name; ``other``/``ungated`` are grey, each its own shade."""
    colors, k, grey = {}, 0, 0
    for name in populations:
        if name in colors:
            continue
        if str(name).casefold() in ("other", "ungated", "unlabeled", "unlabelled"):
            colors[name] = OTHER_COLORS[grey % len(OTHER_COLORS)]
            grey += 1
        else:
            colors[name] = PALETTE[k % len(PALETTE)]
            k += 1
    return colors


def population_table(events: np.ndarray, channel_names, populations: np.ndarray,
                     parents: dict | None = None, confidence: np.ndarray | None = None, cofactors=None):
    """Per-population statistics: count, % of total, % of parent, median of every channel.

    Parameters
    ----------
    events : (n, d) raw values
    channel_names : list of d names
    populations : (n,) str labels
    parents : dict population -> parent population (its share uses the parent's count);
        populations without a parent use all events, so % of parent equals % of total.
    confidence : optional (n,) confidences; adds a mean-confidence column.
    cofactors : optional (d,) arcsinh cofactors: the median, geometric mean and CV of every
        channel instead of its median alone (:class:`gating_core.reports.marker_stats.MarkerStatistics`).
    """
    import pandas as pd

    from gating_core.reports.marker_stats import MarkerStatistics

    stats = MarkerStatistics(events, channel_names, cofactors) if cofactors is not None else None

    populations = np.asarray(populations).astype(str)
    total = populations.shape[0]
    names, inverse, counts = np.unique(populations, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    parents = parents or {}
    count_of = dict(zip(names, counts))
    rows = []
    for i in order:
        name = names[i]
        mask = inverse == i
        parent = parents.get(name)
        parent_count = count_of.get(parent, total) if parent else total
        row = {"population": name, "count": int(counts[i]), "% of total": 100.0 * counts[i] / total,
               "% of parent": 100.0 * counts[i] / parent_count if parent_count else 0.0}
        if confidence is not None:
            row["mean confidence"] = float(np.mean(confidence[mask]))
        if stats is not None:
            row.update(stats(mask))
            rows.append(row)
            continue
        medians = np.median(events[mask], axis=0) if mask.any() else np.full(len(channel_names), np.nan)
        for ch, med in zip(channel_names, medians):
            row[f"median {ch}"] = float(med)
        rows.append(row)
    return pd.DataFrame(rows)
