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

Options real data sets call for
-------------------------------
All off by default (the default simulation, and so ``sample_data/``, is unchanged):

- ``scale="channel"`` (:func:`simulate_patient`, :func:`simulate_cohort`,
  :func:`simulate_centers`): files as log-amplified instruments, FlowJo "channel values"
  exports and many CSV-to-FCS conversions hold them: fluorescence compensated, then 10-bit
  log channel numbers (whole numbers 0..1023, 256 per decade, :func:`intensity_to_channel`),
  scatter linear on 0..1023 (:func:`scatter_to_channel`), ``$PnE 0,0``, a meaningless
  ``$PnR`` 262144 and no ``$SPILLOVER``. ``gating_core.fcs.transforms.channel_scale_reason``
  recognises such channels.
- ``population_shift`` (:class:`Center`, :func:`simulate_centers`): one population moves in one
  channel at one center only (offsets in decades), e.g. beyond where the other centers have it.
- ``population_presence`` (:func:`simulate_cohort`, :func:`simulate_centers`): a population
  present in only a fraction of the patients (an exact number of them, chosen from the seed);
  in the others it has no event and the other populations are renormalised.
- ``population_shares`` (:func:`simulate_patient` and the cohorts): exact shares of events for
  named populations, e.g. 0.005 for a rare population (0 makes it absent).

:func:`simulate_hard_cohort` builds the benchmark cohorts from them (``HARD_COHORTS``):
``"channel-scale-shift"``, ``"partial-population"`` and ``"rare"``.

Ellipse task
------------
:func:`ellipse_task` is the synthetic domain-generalisation problem of Blanchard et al.
(JMLR 2021, Algorithm 1): each task is a filled ellipse (semi-axes 1 and 0.2) whose major axis
is rotated by an angle drawn uniformly in [pi/4, 3pi/4]; the label is the side of the major
axis. Within a task a linear rule is perfect; the rule changes with the (observable) rotation.

Modules: ``panel`` (channels, populations, phenotypes, conditions, noise, the channel scale),
``patients`` (:func:`simulate_patient`, :func:`simulate_cohort`), ``center_effects``
(:class:`Center`: what one center does to its measurements), ``centers`` (multi-center
cohorts), ``hard`` (:func:`simulate_hard_cohort`), ``ellipse`` (:func:`ellipse_task`),
``sample_data`` (the demo folder and the file writers); every public name is importable from
``gating_core.synthetic`` itself.

Command line
------------
``python -m gating_core.synthetic --out sample_data [--seed 2026]`` writes the committed demo
folder (see :func:`write_sample_data`). Output is byte-identical for a given seed.
``--centers K`` writes a multi-center cohort instead, ``--hard KIND`` a hard cohort.
"""

from __future__ import annotations

from gating_core.synthetic.panel import (CHANNEL_MAX, CHANNELS, CHANNELS_PER_DECADE, CONDITIONS, FLUORESCENCE_PANEL,
                                         LOG_AMPLIFIER_BASELINE, LOG_AMPLIFIER_FLOOR, LYMPHOCYTES, MARKERS,
                                         POPULATIONS, RANGE_MAX, SCALES, SCATTER_CHANNELS, channel_column,
                                         intensity_to_channel, scatter_to_channel)
from gating_core.synthetic.patients import simulate_cohort, simulate_patient
from gating_core.synthetic.center_effects import Center, draw_center
from gating_core.synthetic.centers import simulate_centers, write_centers, write_cohort
from gating_core.synthetic.hard import HARD_COHORTS, simulate_hard_cohort
from gating_core.synthetic.ellipse import ellipse_task
from gating_core.synthetic.sample_data import (HISTORICAL_PLAN, NEW_PLAN, SAMPLE_EVENTS, file_digests, write_labels_csv,
                                               write_sample, write_sample_data)

__all__ = ["CHANNELS", "CONDITIONS", "FLUORESCENCE_PANEL", "LYMPHOCYTES", "MARKERS", "POPULATIONS", "RANGE_MAX",
           "SCATTER_CHANNELS", "SCALES", "CHANNEL_MAX", "CHANNELS_PER_DECADE", "LOG_AMPLIFIER_BASELINE",
           "LOG_AMPLIFIER_FLOOR", "channel_column", "intensity_to_channel", "scatter_to_channel",
           "simulate_cohort", "simulate_patient", "Center", "draw_center", "simulate_centers",
           "write_centers", "write_cohort", "HARD_COHORTS", "simulate_hard_cohort", "ellipse_task",
           "HISTORICAL_PLAN", "NEW_PLAN", "SAMPLE_EVENTS", "file_digests", "write_labels_csv", "write_sample",
           "write_sample_data"]
