"""Landmark (peak) registration of each channel, per patient: ``GatingModel(align="landmarks")``.

Each channel's density peaks (its populations' modes) are the landmarks. A patient's peaks are
matched in order to the consensus peaks of the training patients and the channel is warped
piecewise-linearly between matched peaks (a shift beyond the outer ones, a plain shift when the
channel has one peak), the idea of flowStats' gaussNorm. Unlike quantiles, a peak does not move
when a population's share changes; but a peak that appears, vanishes or merges changes which
population each peak is, and a wrong match moves cells of one population onto another. The
skip rule (:class:`SkipRule`) leaves such a channel of such a patient as it is.

The measurements behind the skip rule are in docs/alignment.md; the quantile registration and
the option names are in :mod:`gating_core.method.alignment`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Width (standardised units) of the Gaussian smoothing of a channel's histogram: the channels
#: are standardised by the pooled spread, so one width serves every panel.
PEAK_BANDWIDTH = 0.1
#: Histogram bins per smoothing width.
BINS_PER_BANDWIDTH = 4
#: Most bins of one channel's histogram: bounds the work for channels with far outliers.
MAX_BINS = 4096
#: A peak is kept when the dip separating it from a higher neighbour reaches this share of its
#: height (scale free: a spike of exact zeros in mass cytometry dwarfs every other peak's height)...
MIN_RELATIVE_DIP = 0.2
#: ... and when this share of the cells lies between its two valleys (the smaller peaks are
#: merged into their neighbour first).
MIN_PEAK_MASS = 0.03
#: Most peaks per channel (the largest by mass): a cytometry channel separates few populations.
MAX_PEAKS = 3


def channel_peaks(values, bandwidth: float = PEAK_BANDWIDTH):
    """The density peaks of one standardised channel and the share of cells each holds.

    Parameters
    ----------
    values : array-like of shape (n,)
        One channel of one patient, standardised.
    bandwidth : float
        Width of the Gaussian smoothing, in the units of ``values``.

    Returns
    -------
    positions : ndarray of shape (m,), 0 <= m <= MAX_PEAKS
        Increasing positions (tops of the smoothed histogram); empty without finite values.
    masses : ndarray of shape (m,)
        Share of the cells between each peak's two valleys (summing to 1).
    """
    from scipy.signal import find_peaks

    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return np.empty(0), np.empty(0)
    step = bandwidth / BINS_PER_BANDWIDTH
    # The body of the channel: far outliers would only widen the grid.
    low, high = np.quantile(values, (0.001, 0.999))
    pad = 4.0 * bandwidth
    n_bins = int(min(MAX_BINS, np.ceil((high - low + 2 * pad) / step) + 1))
    edges = np.linspace(low - pad, high + pad, n_bins + 1)
    centres = 0.5 * (edges[:-1] + edges[1:])
    counts = np.histogram(values, bins=edges)[0].astype(np.float64)
    width = bandwidth / (edges[1] - edges[0])
    offsets = np.arange(-int(np.ceil(4 * width)), int(np.ceil(4 * width)) + 1)
    kernel = np.exp(-0.5 * (offsets / width) ** 2)
    density = np.convolve(counts, kernel / kernel.sum(), mode="same")
    # Zero-padded ends so that a mode at the grid's edge (a pile of identical values) is a peak.
    padded = np.concatenate([[0.0], density, [0.0]])
    candidates, properties = find_peaks(padded, prominence=0.0)
    keep = properties["prominences"] >= MIN_RELATIVE_DIP * padded[candidates]
    peaks = list(candidates[keep] - 1)
    if not peaks:
        return np.empty(0), np.empty(0)
    while True:
        valleys = [a + int(np.argmin(density[a:b + 1])) for a, b in zip(peaks[:-1], peaks[1:])]
        bounds = [0] + valleys + [len(density)]
        mass = np.array([density[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]) / density.sum()
        smallest = int(np.argmin(mass))
        if len(peaks) == 1 or (mass[smallest] >= MIN_PEAK_MASS and len(peaks) <= MAX_PEAKS):
            break
        # dropped: its cells fall to its neighbours on either side of the new valley
        del peaks[smallest]
    # candidates come in increasing order, so positions and masses are sorted
    return np.array([_refined_position(centres, density, i) for i in peaks]), mass


def _refined_position(centres, density, i: int) -> float:
    """The top of the parabola through the density at bin ``i`` and its neighbours: a peak's
    position finer than the bins, so that it does not depend on where a patient's bins fall."""
    if i == 0 or i == len(density) - 1:
        return float(centres[i])
    left, top, right = density[i - 1], density[i], density[i + 1]
    curvature = left - 2 * top + right
    offset = 0.0 if curvature >= 0 else 0.5 * (left - right) / curvature
    return float(centres[i] + np.clip(offset, -0.5, 0.5) * (centres[1] - centres[0]))


def patient_peaks(cells) -> list:
    """:func:`channel_peaks` of every channel of ``cells`` (n, d): a list of d (positions,
    masses) pairs."""
    cells = np.asarray(cells)
    if len(cells) == 0:
        raise ValueError("no cells to register")
    return [channel_peaks(cells[:, j]) for j in range(cells.shape[1])]


@dataclass(frozen=True)
class SkipRule:
    """When landmark registration leaves a channel of a patient as it is.

    Parameters
    ----------
    same_count : bool, default=True
        Skip unless the patient has exactly as many peaks as the reference (one-to-one): a peak
        more or fewer is a population present, absent or merged, and matching the rest would
        guess which one it is.
    nearest : bool, default=True
        Skip unless the patient's largest peak (the most cells) is nearer its own reference peak
        than any other, and so is every other matched peak once the channel is shifted to put
        the largest one on its reference peak: the whole channel may move, as an instrument
        moves it, but a peak that lands nearer another population's reference peak could as
        well be that one.
    max_stretch : float or None, default=3.0
        Skip when the warp would stretch or squeeze the distance between two neighbouring peaks
        by more than this factor (None: no bound). A guard: it fired on none of the measured
        data sets, where ``nearest`` already refuses the squeezes.
    max_move_spreads : float or None, default=None
        Skip when a peak would move by more than this many across-patient spreads of its
        reference peak (None: no bound; a reference read from a model file keeps no spreads and
        ignores it). Measured, not used: a batch moves a peak by many spreads of the patients
        of one batch (docs/alignment.md).
    min_agreement : float, default=0.5
        Skip the channel for every patient when fewer than this share of the training patients
        have the reference's number of peaks: its peaks are no stable landmarks.
    """

    same_count: bool = True
    nearest: bool = True
    max_stretch: float | None = 3.0
    max_move_spreads: float | None = None
    min_agreement: float = 0.5

    @classmethod
    def off(cls) -> "SkipRule":
        """No skipping: every channel with a peak is warped, unequal counts matched as well as
        order allows (for measuring what the rule does)."""
        return cls(same_count=False, nearest=False, max_stretch=None, max_move_spreads=None, min_agreement=0.0)


#: Floor of a reference peak's across-patient spread (standardised units) for ``max_move_spreads``:
#: a few replicate patients agree to the histogram's resolution.
MIN_SPREAD = PEAK_BANDWIDTH / 2


class LandmarkReference:
    """Consensus peaks of each channel over the training patients (``align="landmarks"``).

    Per channel, the reference has the most common number of peaks K among the training
    patients (ties: the most); the patients with K peaks are clustered by rank (their first
    peaks together, their second ones...) and each reference peak is the median of its cluster.

    Parameters
    ----------
    peaks : list of d ndarrays, each (K_j,) increasing
        Reference peaks of each channel (K_j = 0: the channel is never registered).
    agreement : ndarray of shape (d,) or None
        Share of the training patients with K_j peaks (1 when not known, as in a model file).
    spread : list of d ndarrays (K_j,) or None
        Across-patient standard deviation of each reference peak (only ``max_move_spreads``
        reads it).
    rule : SkipRule or None
        The skip rule (default: ``SkipRule()``).
    """

    def __init__(self, peaks, agreement=None, spread=None, rule=None):
        self.peaks = [np.asarray(p, dtype=np.float64).reshape(-1) for p in peaks]
        for p in self.peaks:
            if len(p) > MAX_PEAKS or not np.all(np.isfinite(p)) or np.any(np.diff(p) <= 0):
                raise ValueError(f"reference peaks must be at most {MAX_PEAKS} increasing numbers per channel")
        d = len(self.peaks)
        self.agreement = np.ones(d) if agreement is None else np.asarray(agreement, dtype=np.float64)
        self.spread = spread
        self.rule = SkipRule() if rule is None else rule

    @classmethod
    def fit(cls, patients, rule=None) -> "LandmarkReference":
        """The reference of training patients.

        Parameters
        ----------
        patients : list of array-like (n_i, d)
            Each training patient's standardised cells.
        rule : SkipRule or None

        Returns
        -------
        reference : LandmarkReference
        """
        found = [[positions for positions, _ in patient_peaks(cells)] for cells in patients]
        if not found:
            raise ValueError("no training patients to take reference peaks from")
        d = len(found[0])
        peaks, agreement, spread = [], np.zeros(d), []
        for j in range(d):
            counts = np.array([len(f[j]) for f in found])
            tally = np.bincount(counts)
            # On a tie the more peaks: a peak fewer is more often two populations merged (or
            # one absent) than a population split in two.
            modal = int(len(tally) - 1 - np.argmax(tally[::-1]))
            agreeing = np.array([f[j] for f in found if len(f[j]) == modal]).reshape(-1, modal)
            agreement[j] = np.mean(counts == modal)
            centre = np.median(agreeing, axis=0) if modal else np.empty(0)
            peaks.append(centre)
            spread.append(agreeing.std(axis=0) if modal else np.empty(0))
        return cls(peaks, agreement, spread, rule)

    def as_arrays(self):
        """The reference as a model file keeps it: peaks (d, MAX_PEAKS) float64, zero-padded,
        and the number of each channel's peaks (d,) int64."""
        d = len(self.peaks)
        table = np.zeros((d, MAX_PEAKS))
        counts = np.zeros(d, dtype=np.int64)
        for j, p in enumerate(self.peaks):
            usable = self._usable(j)
            counts[j] = len(p) if usable else 0
            table[j, :counts[j]] = p if usable else []
        return table, counts

    @classmethod
    def from_arrays(cls, table, counts) -> "LandmarkReference":
        """Inverse of :meth:`as_arrays` (the channels the rule excluded keep no peaks)."""
        table = np.asarray(table, dtype=np.float64)
        counts = np.asarray(counts)
        if table.ndim != 2 or table.shape[1] != MAX_PEAKS or counts.shape != (table.shape[0],):
            raise ValueError(f"reference peaks must be (d, {MAX_PEAKS}) with (d,) counts")
        if not np.all((counts >= 0) & (counts <= MAX_PEAKS)):
            raise ValueError(f"reference peak counts must be within [0, {MAX_PEAKS}]")
        return cls([table[j, :int(c)] for j, c in enumerate(counts)])

    def _usable(self, j: int) -> bool:
        return len(self.peaks[j]) > 0 and self.agreement[j] >= self.rule.min_agreement

    def registration(self, cells) -> "LandmarkRegistration":
        """The registration of one patient from its (content-chosen) standardised cells (n, d)."""
        found = patient_peaks(cells)
        if len(found) != len(self.peaks):
            raise ValueError(f"cells have {len(found)} channels, the reference {len(self.peaks)}")
        sources, targets, skipped = [], [], []
        for j, (mine, mass) in enumerate(found):
            source, target, reason = self._match(j, mine, mass)
            sources.append(source)
            targets.append(target)
            skipped.append(reason)
        return LandmarkRegistration(sources, targets, skipped)

    def _match(self, j: int, mine: np.ndarray, mass: np.ndarray):
        """(patient peaks, reference peaks they go to, None) or (empty, empty, why skipped)."""
        reference, rule = self.peaks[j], self.rule
        none = np.empty(0)
        if len(reference) == 0 or self.agreement[j] < rule.min_agreement:
            return none, none, "no stable reference peaks"
        if len(mine) == 0:
            return none, none, "no peak"
        if len(mine) != len(reference):
            if rule.same_count:
                return none, none, f"{len(mine)} peaks, reference {len(reference)}"
            mine, mass, reference = _ordered_match(mine, mass, reference)
        if rule.nearest:
            # The largest peak is the best-identified population: it must be nearest its own
            # reference peak as it is; the others once the channel is shifted along with it.
            largest = int(np.argmax(mass))
            shifted = mine + (reference[largest] - mine[largest])
            shifted[largest] = mine[largest]
            nearest = np.argmin(np.abs(shifted[:, None] - self.peaks[j][None, :]), axis=1)
            if np.any(self.peaks[j][nearest] != reference):
                return none, none, "a peak is nearer another reference peak"
        if rule.max_stretch is not None and len(mine) > 1:
            ratio = np.diff(reference) / np.diff(mine)
            if np.any(ratio > rule.max_stretch) or np.any(ratio < 1.0 / rule.max_stretch):
                return none, none, "the warp would stretch a gap too far"
        if rule.max_move_spreads is not None and self.spread is not None:
            spread = np.maximum(self.spread[j], MIN_SPREAD)
            matched = np.searchsorted(self.peaks[j], reference)
            if np.any(np.abs(mine - reference) > rule.max_move_spreads * spread[matched]):
                return none, none, "a peak would move too far"
        return mine, reference, None


def _ordered_match(mine: np.ndarray, mass: np.ndarray, reference: np.ndarray):
    """The order-keeping one-to-one match of min(m, K) peaks with the least squared distance:
    the patient's matched peaks, their masses and the reference peaks they go to (at most
    MAX_PEAKS a side: every subset is tried; ties keep the first)."""
    from itertools import combinations

    pairs = min(len(mine), len(reference))
    best, best_cost = None, np.inf
    for left in combinations(range(len(mine)), pairs):
        for right in combinations(range(len(reference)), pairs):
            cost = float(np.sum((mine[list(left)] - reference[list(right)]) ** 2))
            if cost < best_cost:
                best, best_cost = (left, right), cost
    return mine[list(best[0])], mass[list(best[0])], reference[list(best[1])]


class LandmarkRegistration:
    """One patient's monotone per-channel warp taking its peaks onto the reference peaks.

    Between matched peaks the map is linear; beyond the outer matched peaks it shifts by their
    displacement (slope 1: the tails keep their shape); one matched peak gives a plain shift; a
    skipped channel is left as it is.

    Parameters
    ----------
    sources, targets : lists of d ndarrays (m_j,), increasing, of equal lengths per channel
        The patient's matched peaks and the reference peaks they go to (empty: skipped).
    skipped : list of d (str or None)
        Why each channel was skipped (None: registered).
    """

    def __init__(self, sources, targets, skipped=None):
        self.sources = [np.asarray(s, dtype=np.float64) for s in sources]
        self.targets = [np.asarray(t, dtype=np.float64) for t in targets]
        self.skipped = list(skipped) if skipped is not None else [None if len(s) else "no peak" for s in self.sources]
        for s, t in zip(self.sources, self.targets):
            if s.shape != t.shape or np.any(np.diff(s) <= 0) or np.any(np.diff(t) <= 0):
                raise ValueError("matched peaks must be increasing lists of one length per channel")

    @property
    def registered_channels(self) -> np.ndarray:
        """Which channels are warped: (d,) bool."""
        return np.array([len(s) > 0 for s in self.sources])

    def transform(self, x) -> np.ndarray:
        """Registered cells: (n, d) float32."""
        x = np.asarray(x)
        out = np.array(x, dtype=np.float32, copy=True)
        for j, (src, ref) in enumerate(zip(self.sources, self.targets)):
            if len(src) == 0:
                continue
            col = x[:, j].astype(np.float64)
            mapped = np.interp(col, src, ref)
            below, above = col < src[0], col > src[-1]
            mapped[below] = col[below] + (ref[0] - src[0])
            mapped[above] = col[above] + (ref[-1] - src[-1])
            out[:, j] = mapped
        return out
