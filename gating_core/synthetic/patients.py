""":func:`simulate_patient`: one patient's blood as an uncompensated 9-parameter flow file
(see the package's docstring for the physics), and :func:`simulate_cohort`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gating_core.fcs import Channel, Sample
from gating_core.synthetic.center_effects import Center
from gating_core.synthetic.panel import (CONDITIONS, FLUORESCENCE_PANEL, MARKERS, POPULATIONS, RANGE_MAX, SCALES,
                                         SCATTER_CHANNELS, _BASE_SPILLOVER, _CONDITION_NAMES, _CONDITION_PROBABILITIES,
                                         _ELECTRONIC_SD, _NEG, _PHENOTYPES, _PHOTON_GAIN, _SCATTER_NOISE_SD,
                                         _TYPICAL_PROPORTIONS, _as_rng, _check_population_presence,
                                         _check_population_shares, _population_offsets, intensity_to_channel,
                                         scatter_to_channel)

def _spillover_string(matrix: np.ndarray, channels: Sequence[str]) -> str:
    """FCS 3.1 ``$SPILLOVER`` value: ``k,name1,...,namek,v11,v12,...`` (row-major)."""
    values = ",".join(f"{v:.6g}" for v in matrix.ravel())
    return f"{len(channels)},{','.join(channels)},{values}"


def simulate_patient(seed, n_events: int = 12000, drift: float = 1.0, variation: float = 1.0,
                     condition: str | None = None, name: str | None = None,
                     proportions: Sequence[float] | None = None, center: Center | None = None, *,
                     population_shares: Mapping[str, float] | None = None, scale: str = "linear"):
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
        effects every patient of that center shares, on top of the patient's own ``drift``;
        its ``population_shift`` moves single populations in single channels. None (the
        default) leaves the simulation exactly as without centers.
    population_shares : mapping of str to float, or None
        Population name -> its exact share of the events: the population gets
        ``round(share * n_events)`` events (halves rounded up; 0 makes it absent, 0.005 rare)
        and the other populations share the remaining events in their drawn proportions; the
        events come in random order. Shares lie in [0, 1] and add up to at most 1. None (the
        default) draws every population's count.
    scale : {"linear", "channel"}, default "linear"
        ``"linear"``: raw detector values of a modern instrument (0..262144). ``"channel"``:
        the file a log-amplified instrument (or a "channel values" export) holds: fluorescence
        compensated with the patient's spillover matrix, then mapped to 10-bit log channel
        numbers by :func:`intensity_to_channel` (whole numbers 0..1023, 256 per decade); scatter
        mapped linearly to 0..1023 by :func:`scatter_to_channel`. Every ``$PnR`` stays 262144
        (as converted files declare, though it says nothing about the values), the file holds
        no ``$SPILLOVER`` (channel numbers cannot be compensated) and the keyword
        ``SIM_SCALE`` is ``"channel"``. The random draws are the same as on the linear scale:
        the same seed gives the same cells on either scale.

    Returns
    -------
    sample : gating_core.fcs.Sample
        ``events`` of shape (n_events, 9), float64 holding float32-exact values (so writing
        and reading back the FCS gives the same numbers). On the linear scale: raw detector
        values, NOT compensated, with ``spillover`` (7, 7) and ``spillover_channels`` set and
        the ``$SPILLOVER`` keyword. On the channel scale: whole channel numbers 0..1023,
        ``spillover`` None.
    labels : ndarray of shape (n_events,), dtype str
        Population name per event.
    """
    if n_events < 1:
        raise ValueError(f"n_events must be positive, got {n_events}")
    if drift < 0 or variation < 0:
        raise ValueError("drift and variation must be non-negative")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {list(SCALES)}")
    fixed_shares = _check_population_shares(population_shares)
    # Center-specific moves of single populations; None keeps the arithmetic of the plain path.
    offsets = (_population_offsets(center.population_shift)
               if center is not None and center.population_shift else None)
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
    if fixed_shares:
        population_index = _draw_with_fixed_shares(rng, fractions, fixed_shares, n_events)
    else:
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
        if offsets is not None:
            fsc = fsc * 10.0 ** offsets[p, 0]
            ssc = ssc * 10.0 ** offsets[p, 1]
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
            if offsets is not None:
                # After the compression, so that the population moves by exactly the offset.
                log_intensity = log_intensity + offsets[p, len(SCATTER_CHANNELS) + j]
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
    # platform-dependent exp/log implementations or BLAS kernels (the spillover product).
    events = np.round(np.hstack([scatter, detector]), 2).astype(np.float32).astype(np.float64)

    fl_names = [p[0] for p in FLUORESCENCE_PANEL]
    spillover = np.round(recorded_spillover, 6)
    name = name or f"synthetic_{condition}"
    channels = ([Channel(c, "", RANGE_MAX) for c in SCATTER_CHANNELS]
                + [Channel(pnn, marker, RANGE_MAX) for pnn, marker, _ in FLUORESCENCE_PANEL])
    if scale == "channel":
        events = _to_channel_scale(events, spillover)
        keywords = _keywords(name, condition, None, fl_names)
        keywords["SIM_SCALE"] = "channel"
        spillover, spillover_channels = None, []
    else:
        keywords = _keywords(name, condition, spillover, fl_names)
        spillover_channels = fl_names
    sample = Sample(name=name, events=events, channels=channels, keywords=keywords,
                    spillover=spillover, spillover_channels=spillover_channels, version="3.1", path=None,
                    compensated=False)
    return sample, labels


def _draw_with_fixed_shares(rng: np.random.Generator, fractions: np.ndarray, fixed_shares: dict[int, float],
                            n_events: int) -> np.ndarray:
    """Population index per event (n_events,): the populations of ``fixed_shares`` get exactly
    ``round(share * n_events)`` events, the others the rest, drawn with ``fractions`` renormalised
    over them; the events come in random order, as in an acquisition."""
    fixed_counts = {p: int(np.floor(share * n_events + 0.5)) for p, share in fixed_shares.items()}
    n_free = n_events - sum(fixed_counts.values())
    if n_free < 0:
        raise ValueError(f"population_shares ask for {sum(fixed_counts.values())} of {n_events} events")
    free = fractions.copy()
    free[list(fixed_counts)] = 0.0
    if n_free > 0:
        if free.sum() <= 0:
            raise ValueError(f"population_shares leave {n_free} events to populations that have none")
        drawn = rng.choice(len(POPULATIONS), size=n_free, p=free / free.sum())
    else:
        drawn = np.empty(0, dtype=np.int64)
    fixed = np.repeat(np.array(list(fixed_counts), dtype=np.int64), list(fixed_counts.values()))
    return rng.permutation(np.concatenate([drawn, fixed]))


def _to_channel_scale(events: np.ndarray, spillover: np.ndarray) -> np.ndarray:
    """Linear events (n, 9) -> 10-bit channel numbers (n, 9): scatter linear, fluorescence
    compensated and then log-mapped."""
    # A log-amplified instrument compensates before the log (in hardware, or the export does):
    # channel numbers cannot be compensated afterwards, as compensation is linear in intensity.
    n_scatter = len(SCATTER_CHANNELS)
    compensated = events[:, n_scatter:] @ np.linalg.inv(spillover)
    return np.hstack([scatter_to_channel(events[:, :n_scatter]), intensity_to_channel(compensated)])


def _keywords(name: str, condition: str, spillover: np.ndarray | None, fl_names: list[str]) -> dict:
    # Deterministic content only (no clock): the committed sample data must regenerate
    # byte-for-byte (so the keywords and their order stay as they were).
    keywords = {
        "$CYT": "SimCyt 3L-9C (synthetic)",
        "$CYTSN": "SIM-0001",
        "$DATE": "01-JAN-2026",
        "$SRC": name,
        "$FIL": f"{name}.fcs",
        "$COM": "Simulated by gating_core.synthetic; not a real patient",
    }
    if spillover is not None:
        keywords["$SPILLOVER"] = _spillover_string(spillover, fl_names)
    keywords["SIM_CONDITION"] = condition
    for i, (pnn, _marker, fluor) in enumerate(FLUORESCENCE_PANEL, start=len(SCATTER_CHANNELS) + 1):
        keywords[f"$P{i}F"] = fluor
    return keywords


def simulate_cohort(n_patients: int, seed: int = 0, n_events: int = 12000, drift: float = 1.0,
                    variation: float = 1.0, conditions: Sequence[str | None] | None = None, *,
                    population_shares: Mapping[str, float] | None = None,
                    population_presence: Mapping[str, float] | None = None, scale: str = "linear"):
    """Simulate ``n_patients`` independent patients.

    Patient ``i`` uses the seed ``(seed, i)``, so a cohort's first patients do not change when
    the cohort grows (as long as ``population_presence`` is not used: which patients lack a
    population depends on the cohort's size).

    Parameters
    ----------
    n_patients : int
    seed : int, default 0
    n_events, drift, variation :
        As in :func:`simulate_patient`, for every patient.
    conditions : sequence of str or None, optional
        Each patient's condition (None = random); one entry per patient.
    population_shares : mapping of str to float, or None
        Exact shares of events for named populations in every patient (e.g. ``{"B cells":
        0.005}`` for rare B cells); see :func:`simulate_patient`.
    population_presence : mapping of str to float, or None
        Population name -> fraction of patients that have it. Exactly
        ``round(fraction * n_patients)`` patients (halves rounded up), chosen at random from
        ``seed``, keep the population; in the others its share is zero (no event) and the
        other populations are renormalised. ``{"B cells": 4 / 30}`` in a cohort of 30 gives B
        cells to 4 patients.
    scale : {"linear", "channel"}, default "linear"
        The scale the files are written on; see :func:`simulate_patient`.

    Returns
    -------
    list of (Sample, labels ndarray[str]) with names ``patient_01``, ``patient_02``, ...
    """
    if conditions is not None and len(conditions) != n_patients:
        raise ValueError("conditions must have one entry per patient")
    absent = _absent_populations(population_presence, n_patients, (seed, 0, 9))
    cohort = []
    for i in range(n_patients):
        condition = None if conditions is None else conditions[i]
        cohort.append(simulate_patient((seed, i), n_events=n_events, drift=drift,
                                       variation=variation, condition=condition,
                                       name=f"patient_{i + 1:02d}",
                                       population_shares=_patient_shares(population_shares, absent[i]),
                                       scale=scale))
    return cohort


def _absent_populations(population_presence, n_patients: int, seed) -> list[tuple[str, ...]]:
    """For each of ``n_patients`` patients, the populations of ``population_presence`` it lacks.

    A population with fraction ``f`` is kept by exactly ``round(f * n_patients)`` patients
    (halves rounded up), drawn without replacement from ``seed`` (populations in
    ``POPULATIONS`` order, so the draw does not depend on the mapping's order).
    """
    presence = _check_population_presence(population_presence)
    absent: list[list[str]] = [[] for _ in range(n_patients)]
    if not presence:
        return [tuple(a) for a in absent]
    rng = _as_rng(seed)
    for p in sorted(presence):
        n_present = int(np.floor(presence[p] * n_patients + 0.5))
        keeps = np.zeros(n_patients, dtype=bool)
        keeps[rng.choice(n_patients, size=n_present, replace=False)] = True
        for i in np.flatnonzero(~keeps):
            absent[i].append(POPULATIONS[p])
    return [tuple(a) for a in absent]


def _patient_shares(population_shares, absent: Sequence[str]) -> dict[str, float] | None:
    """One patient's ``population_shares``: the cohort's, with its absent populations at 0
    (absence wins over a fixed share); None when nothing is fixed."""
    shares = dict(population_shares or {})
    shares.update({population: 0.0 for population in absent})
    return shares or None
