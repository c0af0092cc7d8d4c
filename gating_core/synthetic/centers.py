"""Multi-center cohorts: each :class:`Center` an instrument and staining of its own
(:func:`draw_center`), patients drawn through it (:func:`simulate_centers`, :func:`write_centers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gating_core.synthetic.panel import FLUORESCENCE_PANEL, POPULATIONS, _as_rng
from gating_core.synthetic.patients import simulate_patient
from gating_core.synthetic.sample_data import _write_pair


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
