"""Per-patient registration of each channel: options ``GatingModel(align="quantile")`` and
``align="landmarks"``.

A center's instrument moves and compresses a channel's whole distribution (raised negative
background, compressed positive signal). Registration maps each patient's channel, by a
monotone piecewise-linear function, onto a reference taken from the training patients. It is
fitted on the patient's own unlabeled cells, so a new patient needs no labels.

- ``"quantile"``: the channel's quantiles at fixed levels land on reference quantiles (the mean
  over training patients) -- in its simplest form CytoNorm's quantile splines.
- ``"landmarks"``: the channel's density peaks land on the training patients' consensus peaks
  (flowStats' gaussNorm idea), and a measured skip rule leaves a channel of a patient as it is
  when its peaks cannot be matched one-to-one (docs/alignment.md); in
  :mod:`gating_core.method.landmark_alignment`.

Both also move real biology: a patient with twice the share of one population has different
quantiles for a reason, and a patient lacking a population has a peak fewer. Hence options,
measured beside the default (docs/alignment.md), not the default.
"""

from __future__ import annotations

import numpy as np

#: Quantile levels used as landmarks: the body of each channel, clear of the extreme tails.
LEVELS = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
#: GatingModel's ``align`` options.
ALIGNMENTS = ("none", "quantile", "landmarks")
#: Smallest gap between consecutive landmarks (standardised units): ties (a channel piled up at
#: zero) would otherwise give infinite slopes.
MIN_GAP = 1e-3
#: Slopes of the map beyond the outer landmarks stay within these bounds.
SLOPE_LIMITS = (0.25, 4.0)


def channel_quantiles(cells, levels=LEVELS) -> np.ndarray:
    """Landmarks of each channel of ``cells`` (n, d): ndarray (d, len(levels)), strictly increasing."""
    cells = np.asarray(cells, dtype=np.float64)
    if len(cells) == 0:
        raise ValueError("no cells to register")
    q = np.quantile(cells, levels, axis=0).T
    for j in range(1, q.shape[1]):
        q[:, j] = np.maximum(q[:, j], q[:, j - 1] + MIN_GAP)
    return q


class QuantileRegistration:
    """Monotone per-channel map taking ``source`` landmarks (d, q) onto ``reference`` (d, q)."""

    def __init__(self, source, reference):
        self.source = np.asarray(source, dtype=np.float64)
        self.reference = np.asarray(reference, dtype=np.float64)
        if self.source.shape != self.reference.shape or self.source.ndim != 2 or self.source.shape[1] < 2:
            raise ValueError(f"landmarks must be two (d, q>=2) arrays of one shape, got "
                             f"{self.source.shape} and {self.reference.shape}")
        slopes = np.diff(self.reference, axis=1) / np.diff(self.source, axis=1)
        self.low_slope = np.clip(slopes[:, 0], *SLOPE_LIMITS)
        self.high_slope = np.clip(slopes[:, -1], *SLOPE_LIMITS)

    def transform(self, x) -> np.ndarray:
        """Registered cells: (n, d) float32."""
        x = np.asarray(x)
        out = np.empty(x.shape, dtype=np.float32)
        for j in range(x.shape[1]):
            src, ref = self.source[j], self.reference[j]
            col = x[:, j].astype(np.float64)
            mapped = np.interp(col, src, ref)
            below, above = col < src[0], col > src[-1]
            mapped[below] = ref[0] + self.low_slope[j] * (col[below] - src[0])
            mapped[above] = ref[-1] + self.high_slope[j] * (col[above] - src[-1])
            out[:, j] = mapped
        return out
