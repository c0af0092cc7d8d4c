"""Multi-center cohorts: each center an instrument and staining of its own
(:class:`~gating_core.synthetic.center_effects.Center`, drawn by
:func:`~gating_core.synthetic.center_effects.draw_center`), patients drawn through it
(:func:`simulate_centers`, :func:`write_centers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from gating_core.synthetic.center_effects import draw_center
from gating_core.synthetic.patients import _absent_populations, _patient_shares, simulate_patient
from gating_core.synthetic.sample_data import _write_pair


def simulate_centers(n_centers: int = 4, patients_per_center: int = 3, seed: int = 0,
                     n_events: int = 12000, strength: float = 1.0, patient_drift: float = 0.3,
                     variation: float = 1.0, *,
                     population_shift: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
                     population_shares: Mapping[str, float] | None = None,
                     population_presence: Mapping[str, float] | None = None, scale: str = "linear"):
    """A multi-center cohort: patients grouped by the center that measured them.

    Within a center patients differ by biology and a small drift (``patient_drift``); between
    centers by the center effects of :class:`Center` (scaled by ``strength``). This is the
    benchmark for patients from a center the model has never seen: leave one center out.

    Parameters
    ----------
    n_centers, patients_per_center : int
    seed : int, default 0
        Center ``k`` is drawn from ``(seed, 7, k)``, its patient ``j`` from ``(seed, 8, k, j)``.
    n_events : int
        Events per patient.
    strength : float, default 1.0
        How far centers depart from the nominal instrument (see :func:`draw_center`).
    patient_drift, variation : float
        Each patient's own ``drift`` and ``variation`` (see :func:`simulate_patient`).
    population_shift : mapping or None
        Center name (``"center_<k>"``) -> ``{population: {channel: offset}}``: moves single
        populations in single channels at that center only (offsets in decades; see
        :class:`Center`). ``{"center_2": {"B cells": {"FL4-A": -1.0}}}`` puts the B cells of
        center 2 one decade lower in FL4 than elsewhere.
    population_shares : mapping of str to float, or None
        Exact shares of events for named populations in every patient (see
        :func:`simulate_patient`).
    population_presence : mapping of str to float, or None
        Population name -> fraction of all patients (over every center) that have it; the
        others lack it (see :func:`simulate_cohort`). Drawn from ``(seed, 9)``.
    scale : {"linear", "channel"}, default "linear"
        The scale the files are written on (see :func:`simulate_patient`).

    Returns
    -------
    cohort : list of (Sample, labels ndarray[str]), names ``c<k>_patient_<j>``
    groups : dict mapping each sample name to its center name ``center_<k>``
    """
    center_names = [f"center_{c + 1}" for c in range(n_centers)]
    unknown = sorted(set(population_shift or {}) - set(center_names))
    if unknown:
        raise ValueError(f"population_shift names unknown centers {unknown}; the centers are {center_names}")
    absent = _absent_populations(population_presence, n_centers * patients_per_center, (seed, 9))
    cohort, groups = [], {}
    for c in range(n_centers):
        center = draw_center((seed, 7, c), name=center_names[c], strength=strength)
        if population_shift and center.name in population_shift:
            center = dataclasses.replace(center, population_shift=population_shift[center.name])
        for j in range(patients_per_center):
            name = f"c{c + 1}_patient_{j + 1:02d}"
            shares = _patient_shares(population_shares, absent[c * patients_per_center + j])
            sample, labels = simulate_patient((seed, 8, c, j), n_events=n_events, drift=patient_drift,
                                              variation=variation, name=name, center=center,
                                              population_shares=shares, scale=scale)
            cohort.append((sample, labels))
            groups[name] = center.name
    return cohort, groups


def write_centers(out_dir, **kwargs) -> list[Path]:
    """Write :func:`simulate_centers` as FCS + labels files and ``groups.csv``; returns paths."""
    return write_cohort(out_dir, *simulate_centers(**kwargs))


def write_cohort(out_dir, cohort, groups) -> list[Path]:
    """Write a ``(cohort, groups)`` pair (of :func:`simulate_centers` or
    :func:`simulate_hard_cohort`) as ``<name>.fcs`` + ``<name>.labels.csv`` per patient and
    ``groups.csv`` (header ``patient,center``); returns the paths written (sorted)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for sample, labels in cohort:
        written += _write_pair(out_dir / f"{sample.name}.fcs", out_dir / f"{sample.name}.labels.csv",
                               sample, labels)
    table = out_dir / "groups.csv"
    table.write_text("patient,center\n" + "".join(f"{p},{c}\n" for p, c in groups.items()),
                     encoding="utf-8", newline="\n")
    return sorted(written + [table])
