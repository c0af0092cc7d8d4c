"""Synthetic data: simulated multi-patient flow cytometry, and the JMLR ellipse task.

Flow cytometry
--------------
:func:`simulate_patient` draws one patient's blood as a conventional 9-parameter flow file:
``FSC-A`` and ``SSC-A`` on a linear 0..262144 scale and seven fluorescence detectors
``FL1-A``..``FL7-A`` stained for CD3, CD56, CD4, CD19, CD14, CD8 and CD45. Every event belongs to
one population (``POPULATIONS``). The simulation follows the physics that makes real files hard
to gate with one fixed polygon:

- each population has a phenotype (log-normal marker intensities, correlated scatter);
- fluorochromes spill into neighbouring detectors (a spillover matrix, stored in the file as
  ``$SPILLOVER``); the file holds the UNcompensated detector values, so applying the inverse
  spillover matrix recovers the marker intensities;
- detectors add photon-counting noise that grows with the total light they receive, plus
  electronic noise, so after compensation the negative populations spread around zero (with
  negative values) and spread more where a bright neighbour spills in;
- patients differ: Dirichlet-varied population proportions around a clinical condition
  (typical, lymphopenia, CD4 depletion, monocytosis, B-cell depletion), modest per-population
  shape changes (biology), and per-channel gains and offsets (instrument and staining drift).

Ellipse task
------------
:func:`ellipse_task` is the synthetic domain-generalisation problem of Blanchard et al.
(JMLR 2021, Algorithm 1): each task is a filled ellipse (semi-axes 1 and 0.2) whose major axis
is rotated by an angle drawn uniformly in [pi/4, 3pi/4]; the label is the side of the major
axis. Within a task a linear rule is perfect; the rule changes with the (observable) rotation.

Command line
------------
``python -m gating_core.synthetic --out sample_data [--seed 2026]`` writes the committed demo
folder (see :func:`write_sample_data`). Output is byte-identical for a given seed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel, Sample, write_fcs

# ---------------------------------------------------------------------------------------------
# Panel
# ---------------------------------------------------------------------------------------------

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

# ---------------------------------------------------------------------------------------------
# Phenotypes
# ---------------------------------------------------------------------------------------------

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


def _spillover_string(matrix: np.ndarray, channels: Sequence[str]) -> str:
    """FCS 3.1 ``$SPILLOVER`` value: ``k,name1,...,namek,v11,v12,...`` (row-major)."""
    values = ",".join(f"{v:.6g}" for v in matrix.ravel())
    return f"{len(channels)},{','.join(channels)},{values}"


def simulate_patient(seed, n_events: int = 12000, drift: float = 1.0, variation: float = 1.0,
                     condition: str | None = None, name: str | None = None,
                     proportions: Sequence[float] | None = None, center: "Center | None" = None):
    """Simulate one patient's (uncompensated) flow cytometry file.

    Parameters
    ----------
    seed : int, sequence of int, or numpy Generator
        Everything random derives from it; the same seed gives the same patient.
    n_events : int
        Number of events (cells and debris).
    drift : float, default 1.0
        Scale of instrument/staining drift: per-channel multiplicative gain and additive offset.
        0 disables it; 2-3 makes an unusual patient.
    variation : float, default 1.0
        Scale of biological variation: Dirichlet spread of proportions and per-population
        shifts/widths of marker levels and scatter. 0 gives the canonical phenotypes.
    condition : str or None
        One of ``CONDITIONS``; drawn at random (mostly "typical") when None.
    name : str or None
        Sample name; defaults to ``"synthetic_<condition>"``.
    proportions : sequence of float or None
        Fix the population fractions (in ``POPULATIONS`` order) instead of drawing them.
    center : Center or None
        The measuring center (instrument, staining protocol, compensation controls) whose
        effects every patient of that center shares, on top of the patient's own ``drift``.
        None (the default) leaves the simulation exactly as without centers.

    Returns
    -------
    sample : gating_core.fcs.Sample
        ``events`` of shape (n_events, 9), float64 holding float32-exact values (so writing
        and reading back the FCS gives the same numbers); raw detector values, NOT compensated,
        with ``spillover`` (7, 7) and ``spillover_channels`` set and the ``$SPILLOVER`` keyword.
    labels : ndarray of shape (n_events,), dtype str
        Population name per event.
    """
    if n_events < 1:
        raise ValueError(f"n_events must be positive, got {n_events}")
    if drift < 0 or variation < 0:
        raise ValueError("drift and variation must be non-negative")
    rng = _as_rng(seed)
    if condition is None:
        condition = _CONDITION_NAMES[rng.choice(len(_CONDITION_NAMES), p=_CONDITION_PROBABILITIES)]
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; choose from {sorted(CONDITIONS)}")

    # --- population sizes ------------------------------------------------------------------
    if proportions is None:
        mean = _TYPICAL_PROPORTIONS * CONDITIONS[condition]
        if center is not None:
            mean = mean * center.proportion_shift
        mean = mean / mean.sum()
        if variation > 0:
            concentration = 60.0 / variation ** 2
            fractions = rng.dirichlet(mean * concentration)
        else:
            fractions = mean
    else:
        fractions = np.asarray(proportions, dtype=float)
        if fractions.shape != (len(POPULATIONS),) or np.any(fractions < 0) or fractions.sum() <= 0:
            raise ValueError(f"proportions must be {len(POPULATIONS)} non-negative numbers")
        fractions = fractions / fractions.sum()
    population_index = rng.choice(len(POPULATIONS), size=n_events, p=fractions)
    labels = np.array(POPULATIONS, dtype=object)[population_index].astype(str)

    # --- true intensities per population -----------------------------------------------------
    n_fl = len(FLUORESCENCE_PANEL)
    scatter = np.empty((n_events, 2))
    fluorochrome = np.empty((n_events, n_fl))
    for p, pop in enumerate(POPULATIONS):
        rows = np.flatnonzero(population_index == p)
        m = rows.size
        pheno = _PHENOTYPES[pop]
        # Biology moves each population a little: location and width per patient.
        fsc_mean = pheno.fsc[0] * np.exp(variation * rng.normal(0, 0.04))
        ssc_mean = pheno.ssc[0] * np.exp(variation * rng.normal(0, 0.06))
        width = np.exp(variation * rng.normal(0, 0.08, size=2))
        if pop == "Debris":
            # Debris piles up against the FSC threshold: gamma-shaped, not Gaussian.
            fsc = rng.gamma(1.6, fsc_mean / 1.6 * width[0], size=m)
            ssc = rng.gamma(1.4, ssc_mean / 1.4 * width[1], size=m) + 0.2 * fsc
        else:
            z = rng.standard_normal((m, 2))
            r = pheno.scatter_corr
            z[:, 1] = r * z[:, 0] + np.sqrt(1 - r * r) * z[:, 1]
            fsc = fsc_mean + pheno.fsc[1] * width[0] * z[:, 0]
            # Side scatter is right-skewed: log-normal around its mean.
            ssc_log_sd = pheno.ssc[1] / pheno.ssc[0] * width[1]
            ssc = ssc_mean * np.exp(ssc_log_sd * z[:, 1] - 0.5 * ssc_log_sd ** 2)
        scatter[rows, 0] = fsc
        scatter[rows, 1] = ssc

        auto = pheno.autofluorescence + variation * rng.normal(0, 0.05)
        if center is not None:
            auto += center.background
        for j, marker in enumerate(MARKERS):
            level = pheno.markers.get(marker, _NEG)
            shift = variation * rng.normal(0, 0.08)
            spread = np.exp(variation * rng.normal(0, 0.1))
            if level is _NEG:
                log_intensity = auto + 0.3 * rng.standard_normal(m)
            else:
                log_intensity = level[0] + shift + level[1] * spread * rng.standard_normal(m)
                if center is not None:
                    # A center's detector settings compress bright signals towards the
                    # negatives (a lower PMT voltage): positives lose decades, negatives do not.
                    log_intensity = auto + (log_intensity - auto) * center.compression[j]
            fluorochrome[rows, j] = 10.0 ** log_intensity

    # --- instrument: drift, spillover, detector noise ----------------------------------------
    # Staining/laser drift multiplies a fluorochrome's brightness, which keeps the spillover
    # matrix valid (compensation stays exact); detector baselines shift additively.
    fl_gain = np.exp(drift * rng.normal(0, 0.3, size=n_fl))
    fl_offset = drift * rng.normal(0, 25.0, size=n_fl)
    scatter_gain = np.exp(drift * rng.normal(0, 0.15, size=2))
    scatter_offset = drift * rng.normal(0, 2000.0, size=2)
    # Each day's single-stain controls give a slightly different matrix.
    off_diagonal = _BASE_SPILLOVER - np.eye(n_fl)
    spillover = np.eye(n_fl) + off_diagonal * np.exp(rng.normal(0, 0.08, size=off_diagonal.shape))

    electronic_sd = _ELECTRONIC_SD
    recorded_spillover = spillover
    if center is not None:
        fl_gain = fl_gain * center.fl_gain
        fl_offset = fl_offset + center.fl_offset
        scatter_gain = scatter_gain * center.scatter_gain
        electronic_sd = _ELECTRONIC_SD * center.noise
        # The center's single-stain controls are off by its own factors: the matrix written
        # to the file (and so the compensation) is not the one the light went through.
        recorded_spillover = np.eye(n_fl) + (spillover - np.eye(n_fl)) * center.spillover_error

    light = (fluorochrome * fl_gain) @ spillover
    detector = (light + np.sqrt(_PHOTON_GAIN * light) * rng.standard_normal(light.shape)
                + electronic_sd * rng.standard_normal(light.shape) + fl_offset)
    scatter = (scatter * scatter_gain + scatter_offset
               + _SCATTER_NOISE_SD * rng.standard_normal(scatter.shape))
    # Scatter is pulse area: never negative; everything saturates at the top of the range.
    scatter = np.clip(scatter, 0.0, RANGE_MAX - 1)
    detector = np.minimum(detector, RANGE_MAX - 1)

    # Round to 0.01 before float32 so the stored values do not hinge on the last bit of
    # platform-dependent exp/log implementations.
    events = np.round(np.hstack([scatter, detector]), 2).astype(np.float32).astype(np.float64)

    fl_names = [p[0] for p in FLUORESCENCE_PANEL]
    spillover = np.round(recorded_spillover, 6)
    name = name or f"synthetic_{condition}"
    keywords = _keywords(name, condition, spillover, fl_names)
    channels = ([Channel(c, "", RANGE_MAX) for c in SCATTER_CHANNELS]
                + [Channel(pnn, marker, RANGE_MAX) for pnn, marker, _ in FLUORESCENCE_PANEL])
    sample = Sample(name=name, events=events, channels=channels, keywords=keywords,
                    spillover=spillover, spillover_channels=fl_names, version="3.1", path=None,
                    compensated=False)
    return sample, labels


def _keywords(name: str, condition: str, spillover: np.ndarray, fl_names: list[str]) -> dict:
    # Deterministic content only (no clock): the committed sample data must regenerate
    # byte-for-byte.
    keywords = {
        "$CYT": "SimCyt 3L-9C (synthetic)",
        "$CYTSN": "SIM-0001",
        "$DATE": "01-JAN-2026",
        "$SRC": name,
        "$FIL": f"{name}.fcs",
        "$COM": "Simulated by gating_core.synthetic; not a real patient",
        "$SPILLOVER": _spillover_string(spillover, fl_names),
        "SIM_CONDITION": condition,
    }
    for i, (pnn, _marker, fluor) in enumerate(FLUORESCENCE_PANEL, start=len(SCATTER_CHANNELS) + 1):
        keywords[f"$P{i}F"] = fluor
    return keywords


def simulate_cohort(n_patients: int, seed: int = 0, n_events: int = 12000, drift: float = 1.0,
                    variation: float = 1.0, conditions: Sequence[str | None] | None = None):
    """Simulate ``n_patients`` independent patients.

    Patient ``i`` uses the seed ``(seed, i)``, so a cohort's first patients do not change when
    the cohort grows. ``conditions`` optionally fixes each patient's condition (None = random).

    Returns
    -------
    list of (Sample, labels ndarray[str]) with names ``patient_01``, ``patient_02``, ...
    """
    if conditions is not None and len(conditions) != n_patients:
        raise ValueError("conditions must have one entry per patient")
    cohort = []
    for i in range(n_patients):
        condition = None if conditions is None else conditions[i]
        cohort.append(simulate_patient((seed, i), n_events=n_events, drift=drift,
                                       variation=variation, condition=condition,
                                       name=f"patient_{i + 1:02d}"))
    return cohort


@dataclass(frozen=True)
class Center:
    """What every patient measured at one center shares: instrument, staining, controls.

    ``fl_gain`` (7,): brightness per fluorochrome (laser power, antibody lot, PMT voltage);
    ``fl_offset`` (7,): detector baselines; ``background``: log10 shift of autofluorescence
    (raises the negative populations); ``compression`` (7,): exponent <= 1 that pulls bright
    signals towards the negatives; ``scatter_gain`` (2,); ``noise``: electronic-noise multiplier;
    ``spillover_error`` (7, 7): factors on the off-diagonal spillover the center's controls
    record (compensation error); ``proportion_shift`` (8,): multipliers on the typical
    population fractions (the center's patient population and lysis protocol).
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


def simulate_centers(n_centers: int = 4, patients_per_center: int = 3, seed: int = 0,
                     n_events: int = 12000, strength: float = 1.0, patient_drift: float = 0.3,
                     variation: float = 1.0):
    """A multi-center cohort: patients grouped by the center that measured them.

    Within a center patients differ by biology and a small drift (``patient_drift``); between
    centers by the center effects of :class:`Center` (scaled by ``strength``). This is the
    benchmark for patients from a center the model has never seen: leave one center out.

    Returns
    -------
    cohort : list of (Sample, labels ndarray[str]), names ``c<k>_patient_<j>``
    groups : dict mapping each sample name to its center name ``center_<k>``
    """
    cohort, groups = [], {}
    for c in range(n_centers):
        center = draw_center((seed, 7, c), name=f"center_{c + 1}", strength=strength)
        for j in range(patients_per_center):
            name = f"c{c + 1}_patient_{j + 1:02d}"
            sample, labels = simulate_patient((seed, 8, c, j), n_events=n_events, drift=patient_drift,
                                              variation=variation, name=name, center=center)
            cohort.append((sample, labels))
            groups[name] = center.name
    return cohort, groups


def write_centers(out_dir, **kwargs) -> list[Path]:
    """Write :func:`simulate_centers` as FCS + labels files and ``groups.csv``; returns paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cohort, groups = simulate_centers(**kwargs)
    written = []
    for sample, labels in cohort:
        written += _write_pair(out_dir / f"{sample.name}.fcs", out_dir / f"{sample.name}.labels.csv",
                               sample, labels)
    table = out_dir / "groups.csv"
    table.write_text("patient,center\n" + "".join(f"{p},{c}\n" for p, c in groups.items()),
                     encoding="utf-8", newline="\n")
    return sorted(written + [table])


# ---------------------------------------------------------------------------------------------
# JMLR 2021 ellipse task
# ---------------------------------------------------------------------------------------------

def ellipse_task(n_tasks: int, n_points: int, rng_or_seed=None, *, semi_major: float = 1.0,
                 semi_minor: float = 0.2, angle_range=(np.pi / 4, 3 * np.pi / 4),
                 return_angles: bool = False):
    """The synthetic domain-generalisation task of Blanchard et al. (JMLR 2021, Algorithm 1).

    Each task draws an angle uniformly in ``angle_range``; its points are uniform over a filled
    ellipse centred at the origin (semi-axes ``semi_major`` and ``semi_minor``, as in the
    authors' reference code) whose major axis is rotated by that angle. The label is the side
    of the major axis: 1 on the side its normal (-sin a, cos a) points to, else 0. As in the
    reference code, half the points (rounded down) of each task have label 1.

    Returns
    -------
    Xs : list of n_tasks arrays of shape (n_points, 2)
    ys : list of n_tasks int arrays of shape (n_points,)
    angles : ndarray of shape (n_tasks,), only when ``return_angles``
    """
    if n_tasks < 1 or n_points < 2:
        raise ValueError("need at least one task and two points per task")
    rng = _as_rng(rng_or_seed)
    angles = rng.uniform(angle_range[0], angle_range[1], size=n_tasks)
    Xs, ys = [], []
    for angle in angles:
        n_pos = n_points // 2
        upper = _uniform_half_ellipse(rng, n_pos, semi_major, semi_minor)
        lower = _uniform_half_ellipse(rng, n_points - n_pos, semi_major, semi_minor)
        lower[:, 1] *= -1
        points = np.vstack([upper, lower])
        labels = np.concatenate([np.ones(n_pos, dtype=int), np.zeros(n_points - n_pos, dtype=int)])
        order = rng.permutation(n_points)
        c, s = np.cos(angle), np.sin(angle)
        rotation = np.array([[c, -s], [s, c]])
        Xs.append(points[order] @ rotation.T)
        ys.append(labels[order])
    if return_angles:
        return Xs, ys, angles
    return Xs, ys


def _uniform_half_ellipse(rng: np.random.Generator, n: int, a: float, b: float) -> np.ndarray:
    """``n`` points uniform over the upper half (y >= 0) of the ellipse x^2/a^2 + y^2/b^2 <= 1."""
    out = np.empty((0, 2))
    while out.shape[0] < n:
        # Rejection from the bounding box keeps the density exactly uniform in area.
        candidates = rng.uniform([-1.0, 0.0], [1.0, 1.0], size=(2 * (n - out.shape[0]) + 8, 2))
        inside = candidates[(candidates ** 2).sum(axis=1) <= 1.0]
        out = np.vstack([out, inside])
    return out[:n] * np.array([a, b])


# ---------------------------------------------------------------------------------------------
# Committed sample data
# ---------------------------------------------------------------------------------------------

#: (file stem, condition, drift) for the historical, expert-gated patients.
HISTORICAL_PLAN = (
    ("patient_01", "typical", 1.0),
    ("patient_02", "typical", 1.0),
    ("patient_03", "lymphopenia", 1.0),
    ("patient_04", "typical", 1.0),
    ("patient_05", "cd4_depletion", 1.0),
    ("patient_06", "monocytosis", 1.0),
    ("patient_07", "typical", 1.0),
    ("patient_08", "b_cell_depletion", 1.0),
)
#: New, unlabeled patients; the third is strongly drifted so the novelty warning should fire.
NEW_PLAN = (
    ("new_patient_01", "typical", 1.0),
    ("new_patient_02", "cd4_depletion", 1.0),
    ("new_patient_03", "typical", 5.0),
)
SAMPLE_EVENTS = 12000


def write_labels_csv(path, labels) -> None:
    """Write ``<stem>.labels.csv``: header ``population``, one row per event, ``\\n`` endings."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("population\n")
        handle.write("".join(f"{label}\n" for label in labels))
    os.replace(tmp, path)


def write_sample(path, sample: Sample) -> None:
    """Write a simulated Sample as FCS 3.1 (float32) with its keywords, $PnS and ranges."""
    keywords = dict(sample.keywords)
    for i, channel in enumerate(sample.channels, start=1):
        keywords[f"$P{i}R"] = str(int(channel.range or RANGE_MAX))
    write_fcs(path, sample.events, sample.pnn, sample.pns, keywords)


def write_sample_data(out_dir, seed: int = 2026, n_events: int = SAMPLE_EVENTS) -> list[Path]:
    """Write the demo folder; returns the paths written (sorted).

    Layout::

        out_dir/patient_01.fcs + patient_01.labels.csv ... patient_08   (historical, gated)
        out_dir/new/new_patient_01.fcs ... new_patient_03.fcs            (to gate)
        out_dir/truth/new_patient_01.labels.csv ...                      (held-out truth)
        out_dir/README.md
    """
    out_dir = Path(out_dir)
    (out_dir / "new").mkdir(parents=True, exist_ok=True)
    (out_dir / "truth").mkdir(parents=True, exist_ok=True)
    written = []
    summary = []
    for i, (stem, condition, drift) in enumerate(HISTORICAL_PLAN):
        sample, labels = simulate_patient((seed, 0, i), n_events=n_events, drift=drift,
                                          condition=condition, name=stem)
        written += _write_pair(out_dir / f"{stem}.fcs", out_dir / f"{stem}.labels.csv", sample, labels)
        summary.append((f"{stem}.fcs", condition, drift, labels))
    for i, (stem, condition, drift) in enumerate(NEW_PLAN):
        sample, labels = simulate_patient((seed, 1, i), n_events=n_events, drift=drift,
                                          condition=condition, name=stem)
        written += _write_pair(out_dir / "new" / f"{stem}.fcs", out_dir / "truth" / f"{stem}.labels.csv",
                               sample, labels)
        summary.append((f"new/{stem}.fcs", condition, drift, labels))
    readme = out_dir / "README.md"
    readme.write_text(_readme_text(seed, n_events, summary), encoding="utf-8", newline="\n")
    written.append(readme)
    return sorted(written)


def _write_pair(fcs_path: Path, labels_path: Path, sample: Sample, labels) -> list[Path]:
    write_sample(fcs_path, sample)
    write_labels_csv(labels_path, labels)
    return [fcs_path, labels_path]


def _readme_text(seed: int, n_events: int, summary) -> str:
    header = "| file | condition | drift | " + " | ".join(POPULATIONS) + " |"
    rule = "|" + "---|" * (3 + len(POPULATIONS))
    rows = []
    for file, condition, drift, labels in summary:
        shares = [f"{100 * np.mean(labels == p):.1f}%" for p in POPULATIONS]
        rows.append(f"| {file} | {condition} | {drift:g} | " + " | ".join(shares) + " |")
    panel = ", ".join(f"{pnn} = {marker} ({fluor})" for pnn, marker, fluor in FLUORESCENCE_PANEL)
    return f"""# Sample data (synthetic)

Simulated flow cytometry for trying the product end to end. No real patient is in here.
Regenerate, byte for byte, with:

    python -m gating_core.synthetic --out sample_data --seed {seed}

(`tests/test_synthetic.py` regenerates it and compares hashes with these files.)

## Content

- `patient_01.fcs` ... `patient_08.fcs`: eight "historical" patients, each with its expert
  labels in `patient_NN.labels.csv` (header `population`, one row per event, in event order).
  Use them to train.
- `new/new_patient_01.fcs` ... `new_patient_03.fcs`: three new patients to gate.
  `new_patient_03` was measured with strong instrument drift (5x the usual), so it lies outside
  what the historical patients cover: the novelty warning should fire on it.
- `truth/new_patient_NN.labels.csv`: the true labels of the new patients, kept apart so that
  accuracy can be demonstrated after gating.

Each file holds {n_events} events and 9 channels, FCS 3.1, float32: FSC-A and SSC-A (linear,
0..262144) and {panel}.
The stored values are UNcompensated; the spillover matrix is in `$SPILLOVER`. After
compensation, negative populations spread around zero, with negative values.

Populations (labels): {", ".join(POPULATIONS)}. `other` holds CD3+ CD4- CD8- T cells,
which no leaf gate claims.

Patients differ the way real ones do: population proportions (Dirichlet around a clinical
condition), population shapes (biology), and channel gains and offsets (instrument and
staining drift), so one fixed polygon gate does not fit all of them.

{header}
{rule}
""" + "\n".join(rows) + "\n"


def file_digests(folder) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, keyed by POSIX relative path."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gating_core.synthetic",
                                     description="Write the synthetic sample-data folder, or a "
                                                 "multi-center benchmark (--centers).")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=int, default=2026, help="random seed (default 2026)")
    parser.add_argument("--events", type=int, default=SAMPLE_EVENTS,
                        help=f"events per patient (default {SAMPLE_EVENTS})")
    parser.add_argument("--centers", type=int, metavar="K",
                        help="write a multi-center benchmark of K centers (with groups.csv) instead")
    parser.add_argument("--patients-per-center", type=int, default=3)
    parser.add_argument("--strength", type=float, default=2.0,
                        help="how far centers depart from the nominal instrument (default 2)")
    args = parser.parse_args(argv)
    if args.centers:
        paths = write_centers(args.out, n_centers=args.centers, patients_per_center=args.patients_per_center,
                              seed=args.seed, n_events=args.events, strength=args.strength)
    else:
        paths = write_sample_data(args.out, seed=args.seed, n_events=args.events)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1e6:.1f} MB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
