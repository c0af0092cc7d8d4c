"""The simulated instrument and blood: channels, markers, populations, the spillover
matrix, each population's phenotype, the clinical conditions and the detector noise.
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
