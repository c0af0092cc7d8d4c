"""Hard cohorts for benchmarks (:func:`simulate_hard_cohort`): multi-center cohorts with one
of the difficulties real expert-gated sets show and the plain simulation lacks.
"""

from __future__ import annotations

import copy
from types import MappingProxyType

from gating_core.synthetic.centers import simulate_centers


#: Kind -> the :func:`simulate_centers` settings that make it (see :func:`simulate_hard_cohort`).
HARD_COHORTS = MappingProxyType({
    # Two batches on the 10-bit channel scale; in the second the B cells sit one decade lower
    # in FL4 (CD19), about channel 450 instead of 650, below the first batch's B cells: like the
    # FlowCAP DLBCL population that moves between channel ~450 and ~700 in FL4 between batches.
    # Mild center effects (strength 0.5) so that the shift, not a center's gain, sets the gap.
    "channel-scale-shift": MappingProxyType({
        "n_centers": 2, "patients_per_center": 5, "strength": 0.5, "scale": "channel",
        "population_shift": {"center_2": {"B cells": {"FL4-A": -1.0}}},
    }),
    # NK cells in 4 of 30 patients (a real set had a population in 4 of its 30 patients), at
    # their typical 5% there: a drawn share can be a handful of events, which would blur
    # "present in few patients" into "rare".
    "partial-population": MappingProxyType({
        "n_centers": 3, "patients_per_center": 10, "strength": 1.0,
        "population_presence": {"NK cells": 4 / 30}, "population_shares": {"NK cells": 0.05},
    }),
    # Two rare populations, each exactly 0.5% of every patient's events.
    "rare": MappingProxyType({
        "n_centers": 3, "patients_per_center": 4, "strength": 1.0,
        "population_shares": {"B cells": 0.005, "NK cells": 0.005},
    }),
})


def simulate_hard_cohort(kind: str, seed: int = 0, n_events: int = 5000, **options):
    """A multi-center cohort with one difficulty real data sets show.

    Kinds (settings in ``HARD_COHORTS``):

    ``"channel-scale-shift"``
        Two batches (``center_1``, ``center_2``; 5 patients each, mild center effects,
        ``strength`` 0.5) written on the 10-bit channel scale (``scale="channel"``: whole
        channel numbers 0..1023, ``$PnR`` 262144, no spillover). In ``center_2`` the B cells
        sit one decade lower in FL4 (CD19), about channel 450 instead of 650: nearly all of
        them lie below the 1st percentile of ``center_1``'s B cells, so a model trained on one
        batch meets the population outside the range it learnt.
    ``"partial-population"``
        Three centers of 10 patients; NK cells are present in only 4 of the 30 patients
        (``population_presence``), as exactly 5% of their events (``population_shares``), and
        absent (zero events) in the others.
    ``"rare"``
        Three centers of 4 patients; B cells and NK cells are each exactly 0.5% of every
        patient's events (``population_shares``).

    Parameters
    ----------
    kind : str
        One of ``HARD_COHORTS``.
    seed : int, default 0
    n_events : int, default 5000
        Events per patient.
    **options
        Any :func:`simulate_centers` argument, overriding the kind's setting: e.g.
        ``patients_per_center=2`` for a small cohort, ``population_shift={"center_2":
        {"NK cells": {"CD8": 1.0}}}`` to move another population, ``population_presence=
        {"Monocytes": 0.2}``.

    Returns
    -------
    cohort : list of (Sample, labels ndarray[str])
        ``n_centers * patients_per_center`` patients named ``c<k>_patient_<j>``, each with
        ``n_events`` events (9 channels) and labels of shape (n_events,).
    groups : dict
        Sample name -> center (batch) name ``center_<k>``.
    """
    if kind not in HARD_COHORTS:
        raise ValueError(f"unknown hard cohort {kind!r}; choose from {sorted(HARD_COHORTS)}")
    # Deep copies: nothing downstream can reach into (and change) the kinds' nested settings.
    settings = {name: copy.deepcopy(value) for name, value in HARD_COHORTS[kind].items()}
    settings.update(options)
    return simulate_centers(seed=seed, n_events=n_events, **settings)
