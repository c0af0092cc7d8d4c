"""What one center does to every patient it measures: :class:`Center` (instrument, staining,
controls) and :func:`draw_center`, a random one.

:func:`~gating_core.synthetic.patients.simulate_patient` measures a patient through a Center;
:mod:`gating_core.synthetic.centers` draws multi-center cohorts from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gating_core.synthetic.panel import FLUORESCENCE_PANEL, POPULATIONS, _as_rng, _population_offsets

__all__ = ["Center", "draw_center"]


@dataclass(frozen=True)
class Center:
    """What every patient measured at one center shares: instrument, staining, controls.

    ``fl_gain`` (7,): brightness per fluorochrome (laser power, antibody lot, PMT voltage);
    ``fl_offset`` (7,): detector baselines; ``background``: log10 shift of autofluorescence
    (raises the negative populations); ``compression`` (7,): exponent <= 1 that pulls bright
    signals towards the negatives; ``scatter_gain`` (2,); ``noise``: electronic-noise multiplier;
    ``spillover_error`` (7, 7): factors on the off-diagonal spillover the center's controls
    record (compensation error); ``proportion_shift`` (8,): multipliers on the typical
    population fractions (the center's patient population and lysis protocol);
    ``population_shift``: ``{population: {channel: offset}}``, offsets in decades (log10) that
    move one population alone in one channel (a reagent lot, a clone or a disease that changes
    one population's level), channels named by detector (``"FL4-A"``) or marker (``"CD19"``).
    Unlike the other effects it is never drawn: :func:`draw_center` leaves it empty and
    :func:`simulate_centers` sets it from its ``population_shift`` argument.
    """

    name: str
    fl_gain: np.ndarray
    fl_offset: np.ndarray
    background: float
    compression: np.ndarray
    scatter_gain: np.ndarray
    noise: float
    spillover_error: np.ndarray
    proportion_shift: np.ndarray
    population_shift: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self):
        _population_offsets(self.population_shift)  # unknown populations or channels fail here


def draw_center(seed, name: str = "center", strength: float = 1.0) -> Center:
    """A random :class:`Center`; ``strength`` scales how far it departs from the nominal one."""
    rng = _as_rng(seed)
    n_fl = len(FLUORESCENCE_PANEL)
    return Center(
        name=name,
        fl_gain=np.exp(strength * rng.normal(0, 0.35, n_fl)),
        fl_offset=strength * rng.normal(0, 60.0, n_fl),
        background=float(strength * rng.normal(0, 0.25)),
        compression=1.0 - strength * rng.uniform(0.0, 0.15, n_fl),
        scatter_gain=np.exp(strength * rng.normal(0, 0.1, 2)),
        noise=float(np.exp(strength * rng.normal(0, 0.3))),
        spillover_error=np.exp(strength * rng.normal(0, 0.3, (n_fl, n_fl))),
        proportion_shift=np.exp(strength * rng.normal(0, 0.3, len(POPULATIONS))),
    )
