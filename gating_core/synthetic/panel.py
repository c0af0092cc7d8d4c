"""The simulated instrument and blood: channels, markers, populations, the spillover
matrix, each population's phenotype, the clinical conditions and the detector noise; the
10-bit channel scale of log-amplified files (:func:`intensity_to_channel`); the checks of the
population options (shifts, shares, presence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


SCATTER_CHANNELS = ("FSC-A", "SSC-A")


#: (detector $PnN, marker $PnS, fluorochrome) in detector order; neighbours spill into each other.
FLUORESCENCE_PANEL = (
    ("FL1-A", "CD3", "FITC"),
    ("FL2-A", "CD56", "PE"),
    ("FL3-A", "CD4", "PerCP-Cy5.5"),
    ("FL4-A", "CD19", "PE-Cy7"),
    ("FL5-A", "CD14", "APC"),
    ("FL6-A", "CD8", "APC-H7"),
    ("FL7-A", "CD45", "V500"),
)


CHANNELS = SCATTER_CHANNELS + tuple(p[0] for p in FLUORESCENCE_PANEL)


MARKERS = tuple(p[1] for p in FLUORESCENCE_PANEL)


RANGE_MAX = 262144.0


#: Population names used as labels, in a fixed order.
POPULATIONS = ("Debris", "Granulocytes", "Monocytes", "B cells", "NK cells",
               "CD4 T cells", "CD8 T cells", "other")


LYMPHOCYTES = ("B cells", "NK cells", "CD4 T cells", "CD8 T cells", "other")


# Nominal spillover (row: fluorochrome, column: detector, diagonal 1). Values are typical of a
# 3-laser instrument: FITC into PE, PE into PerCP, PerCP-Cy5.5 into PE-Cy7, APC into APC-H7 ...
_BASE_SPILLOVER = np.array([
    # FL1    FL2    FL3    FL4    FL5    FL6    FL7
    [1.000, 0.220, 0.030, 0.005, 0.000, 0.000, 0.000],  # FITC
    [0.015, 1.000, 0.180, 0.040, 0.002, 0.000, 0.000],  # PE
    [0.000, 0.010, 1.000, 0.120, 0.020, 0.030, 0.000],  # PerCP-Cy5.5
    [0.000, 0.020, 0.050, 1.000, 0.000, 0.090, 0.000],  # PE-Cy7
    [0.000, 0.000, 0.010, 0.005, 1.000, 0.140, 0.000],  # APC
    [0.000, 0.000, 0.000, 0.030, 0.040, 1.000, 0.000],  # APC-H7
    [0.060, 0.010, 0.000, 0.000, 0.000, 0.000, 1.000],  # V500
])


# Marker level on the log10 scale of true (compensated) intensity: None = negative
# (autofluorescence only), else (mean, sd) for the positive part.
_NEG = None


@dataclass(frozen=True)
class _Phenotype:
    fsc: tuple[float, float]          # mean, sd (linear)
    ssc: tuple[float, float]          # mean, sd (linear; SSC is drawn log-normal around it)
    scatter_corr: float
    markers: dict                     # marker -> (log10 mean, log10 sd) or _NEG
    autofluorescence: float           # log10 of the autofluorescence level


_PHENOTYPES = {
    "Debris": _Phenotype((14000, 9000), (9000, 7000), 0.5,
                         {"CD45": (2.2, 0.6)}, 1.2),
    "Granulocytes": _Phenotype((118000, 14000), (115000, 26000), 0.35,
                               {"CD45": (3.25, 0.15), "CD14": (2.35, 0.2)}, 1.9),
    "Monocytes": _Phenotype((105000, 13000), (62000, 12000), 0.4,
                            {"CD45": (3.75, 0.12), "CD14": (3.75, 0.22), "CD4": (2.75, 0.18)}, 1.6),
    "B cells": _Phenotype((64000, 7000), (20000, 4500), 0.3,
                          {"CD45": (4.0, 0.1), "CD19": (3.55, 0.2)}, 1.3),
    "NK cells": _Phenotype((68000, 7500), (24000, 5000), 0.3,
                           {"CD45": (3.95, 0.1), "CD56": (3.3, 0.25), "CD8": (2.5, 0.35)}, 1.3),
    "CD4 T cells": _Phenotype((63000, 6500), (19000, 4000), 0.3,
                              {"CD45": (4.05, 0.1), "CD3": (3.6, 0.15), "CD4": (3.65, 0.13)}, 1.3),
    "CD8 T cells": _Phenotype((62000, 6500), (19500, 4000), 0.3,
                              {"CD45": (4.05, 0.1), "CD3": (3.6, 0.15), "CD8": (3.85, 0.17)}, 1.3),
    # Double-negative (CD3+ CD4- CD8-) T cells: a real minority no leaf gate claims.
    "other": _Phenotype((63000, 7000), (20000, 4500), 0.3,
                        {"CD45": (4.0, 0.1), "CD3": (3.5, 0.2)}, 1.3),
}


# Typical adult peripheral blood after lysis (fractions of all events).
_TYPICAL_PROPORTIONS = np.array([0.07, 0.52, 0.07, 0.05, 0.05, 0.14, 0.08, 0.02])


#: Clinical conditions: multipliers on the typical proportions (renormalised afterwards).
CONDITIONS = {
    "typical": np.ones(len(POPULATIONS)),
    "lymphopenia": np.array([1.0, 1.3, 1.1, 0.3, 0.35, 0.3, 0.3, 0.3]),
    "cd4_depletion": np.array([1.0, 1.0, 1.0, 1.0, 1.2, 0.25, 1.8, 1.5]),
    "monocytosis": np.array([1.0, 0.9, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    "b_cell_depletion": np.array([1.0, 1.0, 1.0, 0.05, 1.0, 1.0, 1.0, 1.0]),
}


_CONDITION_NAMES = tuple(CONDITIONS)


_CONDITION_PROBABILITIES = np.array([0.55, 0.15, 0.1, 0.12, 0.08])


# Detector noise: photon statistics (variance = signal * _PHOTON_GAIN) and electronics.
_PHOTON_GAIN = 4.0


_ELECTRONIC_SD = 18.0


_SCATTER_NOISE_SD = 600.0


def _as_rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


# --- channel scale (10-bit log-amplified data) ---------------------------------------------------

#: Scales a simulated patient can be written on: ``"linear"`` (a modern digital instrument,
#: 0..262144) or ``"channel"`` (10-bit channel numbers of a log amplifier, see
#: :func:`intensity_to_channel`).
SCALES = ("linear", "channel")


#: Highest channel number of a 10-bit scale.
CHANNEL_MAX = 1023


#: Channel numbers per decade of intensity: a 4-decade log amplifier spread over 1024 channels.
CHANNELS_PER_DECADE = 256


#: Dark baseline added to the light before the log amplifier. Compensated negatives spread
#: around zero (with negative values); with the baseline they form a cloud in the lower
#: channels, as in real log-amplified files, instead of a spike at channel 0.
LOG_AMPLIFIER_BASELINE = 100.0


#: Amplifier input (baseline included) at channel 0. The 4 decades of the amplifier then cover
#: inputs 8 .. about 79,000: the brightest stains (CD45 on lymphocytes, about 10^4.4 in a
#: bright patient) stay below the top channel.
LOG_AMPLIFIER_FLOOR = 8.0


def intensity_to_channel(intensity) -> np.ndarray:
    """Map linear fluorescence intensities to 10-bit log channel numbers.

    ``channel = round(256 * log10(max(intensity + 100, 8) / 8))`` clipped to 0..1023:
    256 channels per decade (``CHANNELS_PER_DECADE``) of the amplifier's input, which is the
    intensity plus a dark baseline (``LOG_AMPLIFIER_BASELINE`` = 100); channel 0 at an input
    of ``LOG_AMPLIFIER_FLOOR`` = 8 or less, 1023 from about 79,000 up. Bright populations
    (intensity well above 100) sit 256 channels apart per decade; the baseline compresses the
    first decade, where the negatives are (intensity 0 maps to channel 281).

    Parameters
    ----------
    intensity : array-like of any shape
        Linear (compensated) intensities; may be negative.

    Returns
    -------
    channels : ndarray of the same shape, float64
        Whole numbers in 0..1023.
    """
    amplifier_input = np.asarray(intensity, dtype=np.float64) + LOG_AMPLIFIER_BASELINE
    ratio = np.maximum(amplifier_input, LOG_AMPLIFIER_FLOOR) / LOG_AMPLIFIER_FLOOR
    return np.clip(np.round(CHANNELS_PER_DECADE * np.log10(ratio)), 0, CHANNEL_MAX)


def scatter_to_channel(scatter) -> np.ndarray:
    """Map linear scatter (0..262144) to 10-bit linear channel numbers: ``round(x * 1024 /
    262144)`` clipped to 0..1023 (scatter stays linear on a log-amplified instrument).

    Parameters
    ----------
    scatter : array-like of any shape

    Returns
    -------
    channels : ndarray of the same shape, float64, whole numbers in 0..1023
    """
    linear = np.asarray(scatter, dtype=np.float64) * ((CHANNEL_MAX + 1) / RANGE_MAX)
    return np.clip(np.round(linear), 0, CHANNEL_MAX)


# --- population options: where a population sits, how much of the sample it is ---------------

def channel_column(channel: str) -> int:
    """Column of ``channel`` in a simulated patient's events, by detector name ($PnN, e.g.
    ``"FL4-A"``, ``"FSC-A"``) or by marker (e.g. ``"CD19"``); ValueError when unknown."""
    if channel in CHANNELS:
        return CHANNELS.index(channel)
    if channel in MARKERS:
        return len(SCATTER_CHANNELS) + MARKERS.index(channel)
    raise ValueError(f"unknown channel {channel!r}; choose a detector of {list(CHANNELS)} "
                     f"or a marker of {list(MARKERS)}")


def _check_population(population: str, option: str) -> int:
    if population not in POPULATIONS:
        raise ValueError(f"{option}: unknown population {population!r}; choose from {list(POPULATIONS)}")
    return POPULATIONS.index(population)


def _population_offsets(population_shift) -> np.ndarray:
    """Per population and channel log10 offsets from a ``{population: {channel: offset}}`` map.

    Parameters
    ----------
    population_shift : mapping of str to mapping of str to float, or None
        Population name -> channel (detector or marker name) -> offset in decades (log10 of
        the intensity; for scatter, of the linear value). ``{"B cells": {"FL4-A": -1.0}}``
        moves the B cells one decade down in FL4 and leaves every other population alone.

    Returns
    -------
    offsets : ndarray of shape (len(POPULATIONS), len(CHANNELS))
        Zero where nothing moves.
    """
    offsets = np.zeros((len(POPULATIONS), len(CHANNELS)))
    for population, channel_offsets in (population_shift or {}).items():
        p = _check_population(population, "population_shift")
        for channel, offset in channel_offsets.items():
            offset = float(offset)
            if not np.isfinite(offset):
                raise ValueError(f"population_shift: the offset of {population!r} in {channel!r} "
                                 f"must be finite, got {offset}")
            offsets[p, channel_column(channel)] += offset
    return offsets


def _check_population_shares(population_shares) -> dict[int, float]:
    """Validate ``{population: share}`` (each share in [0, 1], together at most 1); returns
    ``{population index: share}``."""
    shares = {}
    for population, share in (population_shares or {}).items():
        share = float(share)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"population_shares: the share of {population!r} must lie in [0, 1], got {share}")
        shares[_check_population(population, "population_shares")] = share
    if sum(shares.values()) > 1.0 + 1e-12:
        raise ValueError(f"population_shares add up to {sum(shares.values()):g}, more than 1")
    return shares


def _check_population_presence(population_presence) -> dict[int, float]:
    """Validate ``{population: fraction of patients that have it}`` (each in [0, 1]); returns
    ``{population index: fraction}``."""
    presence = {}
    for population, fraction in (population_presence or {}).items():
        fraction = float(fraction)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"population_presence: the fraction of patients with {population!r} must "
                             f"lie in [0, 1], got {fraction}")
        presence[_check_population(population, "population_presence")] = fraction
    return presence
