"""Simulator options real data sets call for (channel scale, a population shifted at one center,
a population in only some patients, rare populations) and the hard benchmark cohorts built from
them. Small files: a few thousand events per patient."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gating_core.fcs import read_fcs
from gating_core.fcs.transforms import CHANNEL_SCALE_TOP, channel_scale_channels, default_transform
from gating_core.synthetic import (CHANNEL_MAX, CHANNELS, HARD_COHORTS, LOG_AMPLIFIER_BASELINE, LOG_AMPLIFIER_FLOOR,
                                   POPULATIONS, RANGE_MAX, Center, channel_column, draw_center,
                                   intensity_to_channel, scatter_to_channel, simulate_centers, simulate_cohort,
                                   simulate_hard_cohort, simulate_patient, write_sample)

REPO = Path(__file__).resolve().parent.parent
FLUORESCENCE = list(CHANNELS[2:])
FL4 = CHANNELS.index("FL4-A")


def _counts(labels) -> dict[str, int]:
    return {p: int(np.sum(labels == p)) for p in POPULATIONS}


def _same_cohort(a, b) -> bool:
    return all(sa.name == sb.name and np.array_equal(sa.events, sb.events) and np.array_equal(la, lb)
               for (sa, la), (sb, lb) in zip(a, b, strict=True))


# --- channel scale ----------------------------------------------------------------------------

def test_intensity_to_channel_is_256_channels_per_decade_of_the_amplifier_input():
    # Amplifier inputs (intensity + baseline) 8, 80, 800, 8000 are channels 0, 256, 512, 768.
    inputs = LOG_AMPLIFIER_FLOOR * 10.0 ** np.arange(4)
    assert np.array_equal(intensity_to_channel(inputs - LOG_AMPLIFIER_BASELINE), [0, 256, 512, 768])
    # No light, negative light and saturation stay on the 10-bit scale.
    assert intensity_to_channel(0.0) == 281
    assert intensity_to_channel(-1e4) == 0 and intensity_to_channel(1e7) == CHANNEL_MAX
    values = intensity_to_channel(np.linspace(-500, 2e5, 5000))
    assert np.all(np.diff(values) >= 0) and np.array_equal(values, np.round(values))
    assert np.array_equal(scatter_to_channel([0, RANGE_MAX / 2, RANGE_MAX - 1, 1e9]), [0, 512, 1023, 1023])


def test_channel_scale_patient_is_the_same_cells_on_10_bit_channel_numbers():
    linear, labels = simulate_patient(4, n_events=3000, condition="typical")
    channel, channel_labels = simulate_patient(4, n_events=3000, condition="typical", scale="channel")
    # The same random draws: the same cells, only written differently.
    assert np.array_equal(labels, channel_labels)
    events = channel.events
    assert events.shape == (3000, 9)
    assert events.min() >= 0 and events.max() <= CHANNEL_MAX and np.array_equal(events, np.round(events))
    assert np.array_equal(events[:, :2], scatter_to_channel(linear.events[:, :2]))
    # Fluorescence: compensated with the file's matrix, then log-mapped (a matrix product computed
    # another way may move a value sitting on a rounding edge by one channel).
    expected = intensity_to_channel(linear.compensate().events[:, 2:])
    assert np.abs(events[:, 2:] - expected).max() <= 1 and np.mean(events[:, 2:] != expected) < 1e-3
    # Channel numbers carry no spillover; the ranges are the converted files' 262144.
    assert channel.spillover is None and not channel.has_spillover and channel.spillover_channels == []
    assert "$SPILLOVER" not in channel.keywords and channel.keywords["SIM_SCALE"] == "channel"
    assert [c.range for c in channel.channels] == [RANGE_MAX] * 9
    # The populations stay apart: CD4 T cells bright in CD4 (FL3), B cells not.
    fl3 = CHANNELS.index("FL3-A")
    assert np.median(events[labels == "CD4 T cells", fl3]) > np.median(events[labels == "B cells", fl3]) + 200
    # Negatives form a cloud (not a spike at channel 0) and nothing saturates here.
    assert np.mean(events[:, 2:] == 0) < 0.05 and np.mean(events == CHANNEL_MAX) < 0.001


def test_channel_scale_files_are_detected_as_channel_scale(tmp_path):
    sample, labels = simulate_patient(9, n_events=2500, scale="channel", name="channel_patient")
    path = tmp_path / "channel_patient.fcs"
    write_sample(path, sample)
    back = read_fcs(path)
    assert np.array_equal(back.events, sample.events) and back.spillover is None
    assert all(back.keywords[f"$P{i}E"] == "0,0" for i in range(1, 10))
    assert all(back.keywords[f"$P{i}R"] == "262144" for i in range(1, 10))
    ranges = [c.range for c in back.channels]
    found = channel_scale_channels(back.pnn, back.events, ranges)
    assert sorted(found) == FLUORESCENCE  # scatter is linear whatever its scale
    assert all("$PnR 262144 says nothing" in reason for reason in found.values())
    transform = default_transform(back.pnn, back.events, back.keywords, ranges)
    assert transform.kinds == ["linear"] * 9
    assert all(p == {"scale": CHANNEL_SCALE_TOP} for p in transform.params[2:])
    # The linear file of the same patient is not taken for channel numbers.
    linear, _ = simulate_patient(9, n_events=2500)
    assert channel_scale_channels(linear.pnn, linear.events, [c.range for c in linear.channels]) == {}


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="unknown scale 'log'"):
        simulate_patient(0, n_events=100, scale="log")


# --- one population shifted at one center -------------------------------------------------------

def test_population_shift_moves_one_population_in_one_channel_at_one_center():
    # Nominal centers and no patient drift: compensation is exact and baselines are zero, so the
    # compensated CD19 of the B cells shows the one-decade move itself.
    kwargs = dict(n_centers=2, patients_per_center=2, seed=3, n_events=3000, strength=0.0, patient_drift=0.0)
    plain, groups = simulate_centers(**kwargs)
    shifted, shifted_groups = simulate_centers(**kwargs, population_shift={"center_2": {"B cells": {"FL4-A": -1.0}}})
    assert groups == shifted_groups
    for (a, la), (b, lb) in zip(plain, shifted):
        assert np.array_equal(la, lb)  # the same events, the same populations
        if groups[a.name] == "center_1":
            assert np.array_equal(a.events, b.events)
            continue
        b_cells = lb == "B cells"
        # Everything but the B cells is exactly as without the shift ...
        assert np.array_equal(a.events[~b_cells], b.events[~b_cells])
        # ... and so are the B cells' scatter and the detectors PE-Cy7 (FL4) does not spill into.
        untouched = [channel_column(c) for c in ("FSC-A", "SSC-A", "FL1-A", "FL5-A", "FL7-A")]
        assert np.array_equal(a.events[np.ix_(b_cells, untouched)], b.events[np.ix_(b_cells, untouched)])
        # In FL4 the B cells' (compensated) CD19 drops by one decade.
        before = np.median(a.compensate().events[b_cells, FL4])
        after = np.median(b.compensate().events[b_cells, FL4])
        assert abs(np.log10(after / before) + 1.0) < 0.05


def test_population_shift_names_a_channel_by_detector_or_marker_and_moves_scatter_too():
    def shifted(channel):
        return simulate_centers(1, 1, seed=2, n_events=2000,
                                population_shift={"center_1": {"B cells": {channel: 0.5}}})[0]

    assert _same_cohort(shifted("FL4-A"), shifted("CD19"))
    assert not _same_cohort(shifted("FL4-A"), simulate_centers(1, 1, seed=2, n_events=2000)[0])
    (plain, labels), = simulate_centers(1, 1, seed=2, n_events=4000)[0]
    (moved, _), = simulate_centers(1, 1, seed=2, n_events=4000,
                                   population_shift={"center_1": {"Granulocytes": {"SSC-A": 0.1}}})[0]
    granulocytes = labels == "Granulocytes"
    ssc = CHANNELS.index("SSC-A")
    ratio = np.median(moved.events[granulocytes, ssc]) / np.median(plain.events[granulocytes, ssc])
    assert ratio == pytest.approx(10 ** 0.1, rel=0.03)
    assert np.array_equal(moved.events[~granulocytes], plain.events[~granulocytes])


def test_population_shift_is_validated():
    center = draw_center(0)
    assert center.population_shift == {}  # drawn centers move no single population
    with pytest.raises(ValueError, match="unknown centers"):
        simulate_centers(2, 1, n_events=100, population_shift={"center_3": {"B cells": {"FL4-A": 1.0}}})
    with pytest.raises(ValueError, match="unknown population 'Plasma cells'"):
        Center(**{**vars(center), "population_shift": {"Plasma cells": {"FL4-A": 1.0}}})
    with pytest.raises(ValueError, match="unknown channel 'FL9-A'"):
        simulate_centers(1, 1, n_events=100, population_shift={"center_1": {"B cells": {"FL9-A": 1.0}}})


# --- a population in only some patients; exact shares ------------------------------------------

def test_population_presence_keeps_a_population_in_an_exact_number_of_patients():
    cohort = simulate_cohort(10, seed=4, n_events=1500, population_presence={"NK cells": 0.3})
    nk = np.array([np.sum(labels == "NK cells") for _, labels in cohort])
    assert np.sum(nk > 0) == 3 and np.sum(nk == 0) == 7
    assert all(s.n_events == 1500 for s, _ in cohort)
    assert nk[nk > 0].min() >= 0.005 * 1500
    again = simulate_cohort(10, seed=4, n_events=1500, population_presence={"NK cells": 0.3})
    assert _same_cohort(cohort, again)
    other_seed = simulate_cohort(10, seed=5, n_events=1500, population_presence={"NK cells": 0.3})
    assert [np.sum(l == "NK cells") > 0 for _, l in other_seed] != list(nk > 0)


def test_absent_population_leaves_the_others_in_their_proportions():
    proportions = np.array([0.05, 0.40, 0.10, 0.10, 0.10, 0.15, 0.08, 0.02])
    _, labels = simulate_patient(6, n_events=20000, proportions=proportions, population_shares={"Monocytes": 0.0})
    counts = _counts(labels)
    assert counts["Monocytes"] == 0 and sum(counts.values()) == 20000
    expected = np.delete(proportions, POPULATIONS.index("Monocytes")) / (1 - proportions[2])
    observed = np.array([counts[p] for p in POPULATIONS if p != "Monocytes"]) / 20000
    np.testing.assert_allclose(observed, expected, atol=0.012)


def test_population_shares_give_exact_counts_and_rescale_the_others():
    _, labels = simulate_patient(8, n_events=3001, population_shares={"B cells": 0.005, "NK cells": 0.005})
    counts = _counts(labels)
    assert counts["B cells"] == counts["NK cells"] == 15  # round(0.005 * 3001)
    assert sum(counts.values()) == 3001
    proportions = np.array([0.05, 0.40, 0.10, 0.10, 0.10, 0.15, 0.08, 0.02])
    _, labels = simulate_patient(8, n_events=20000, proportions=proportions, population_shares={"Granulocytes": 0.1})
    counts = _counts(labels)
    assert counts["Granulocytes"] == 2000
    free = np.delete(proportions, 1)
    expected = 0.9 * free / free.sum()
    observed = np.array([counts[p] for p in POPULATIONS if p != "Granulocytes"]) / 20000
    np.testing.assert_allclose(observed, expected, atol=0.012)
    # The rare events are spread through the acquisition, not stacked at its end.
    _, labels = simulate_patient(8, n_events=4000, population_shares={"B cells": 0.01})
    positions = np.flatnonzero(labels == "B cells")
    assert positions.size == 40 and positions.min() < 1000 and positions.max() > 3000


@pytest.mark.parametrize("shares, message", [
    ({"B cells": 0.7, "NK cells": 0.4}, "add up to 1.1"),
    ({"B cells": -0.1}, r"must lie in \[0, 1\]"),
    ({"Plasma cells": 0.1}, "unknown population 'Plasma cells'"),
    ({p: 0.1 for p in POPULATIONS}, "leave 200 events to populations that have none"),
])
def test_bad_population_shares_raise_clear_errors(shares, message):
    with pytest.raises(ValueError, match=message):
        simulate_patient(0, n_events=1000, population_shares=shares)


def test_bad_population_presence_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        simulate_cohort(3, n_events=100, population_presence={"NK cells": 1.5})


# --- hard cohorts ---------------------------------------------------------------------------------

def test_channel_scale_shift_cohort_moves_the_b_cells_beyond_the_other_batch():
    cohort, groups = simulate_hard_cohort("channel-scale-shift", seed=0, n_events=3000)
    assert sorted(set(groups.values())) == ["center_1", "center_2"] and len(cohort) == 10
    for sample, _ in cohort:
        found = channel_scale_channels(sample.pnn, sample.events, [c.range for c in sample.channels])
        assert sorted(found) == FLUORESCENCE
    b_cells = {center: np.concatenate([s.events[l == "B cells", FL4] for s, l in cohort if groups[s.name] == center])
               for center in ("center_1", "center_2")}
    # Like the FlowCAP DLBCL population at channel ~700 in one batch and ~450 in the other.
    assert 560 < np.median(b_cells["center_1"]) < 760
    assert 380 < np.median(b_cells["center_2"]) < 520
    floor = np.percentile(b_cells["center_1"], 1)
    assert np.mean(b_cells["center_2"] < floor) > 0.85
    # Only the B cells move: without the shift every other event is the same.
    unshifted, _ = simulate_hard_cohort("channel-scale-shift", seed=0, n_events=3000, population_shift={})
    for (sample, labels), (plain, _) in zip(cohort, unshifted):
        others = labels != "B cells"
        assert np.array_equal(sample.events[others], plain.events[others])


def test_partial_population_cohort_has_the_population_in_4_of_30_patients():
    cohort, groups = simulate_hard_cohort("partial-population", seed=1, n_events=1000)
    assert len(cohort) == 30 and len(set(groups.values())) == 3
    nk = np.array([np.sum(labels == "NK cells") for _, labels in cohort])
    assert np.sum(nk > 0) == 4 and np.all(nk[nk > 0] == 50)  # 5% of 1000 where present


def test_rare_cohort_has_two_populations_at_half_a_percent():
    cohort, _ = simulate_hard_cohort("rare", seed=2, n_events=2000, patients_per_center=2)
    assert len(cohort) == 6
    for _, labels in cohort:
        counts = _counts(labels)
        assert counts["B cells"] == counts["NK cells"] == 10
        assert counts["CD4 T cells"] > 50


@pytest.mark.parametrize("kind", sorted(HARD_COHORTS))
def test_hard_cohorts_are_reproducible(kind):
    first = simulate_hard_cohort(kind, seed=5, n_events=800, patients_per_center=2)
    second = simulate_hard_cohort(kind, seed=5, n_events=800, patients_per_center=2)
    other = simulate_hard_cohort(kind, seed=6, n_events=800, patients_per_center=2)
    assert first[1] == second[1] and _same_cohort(first[0], second[0])
    assert not np.array_equal(first[0][0][0].events, other[0][0][0].events)


def test_hard_cohort_options_override_the_kind_and_leave_it_unchanged():
    cohort, _ = simulate_hard_cohort("channel-scale-shift", seed=0, n_events=500, patients_per_center=1,
                                     population_shift={"center_2": {"NK cells": {"CD8": 1.0}}})
    assert len(cohort) == 2
    assert HARD_COHORTS["channel-scale-shift"]["population_shift"] == {"center_2": {"B cells": {"FL4-A": -1.0}}}
    with pytest.raises(ValueError, match="unknown hard cohort 'easy'"):
        simulate_hard_cohort("easy")


def test_command_writes_a_hard_cohort(tmp_path):
    out = tmp_path / "rare"
    result = subprocess.run([sys.executable, "-m", "gating_core.synthetic", "--out", str(out), "--hard", "rare",
                             "--events", "600", "--patients-per-center", "1"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 7 files" in result.stdout
    groups = pd.read_csv(out / "groups.csv")
    assert list(groups.columns) == ["patient", "center"] and len(groups) == 3
    labels = pd.read_csv(out / "c1_patient_01.labels.csv")["population"]
    assert read_fcs(out / "c1_patient_01.fcs").n_events == len(labels) == 600
    assert np.sum(labels == "B cells") == 3


# --- defaults unchanged -------------------------------------------------------------------------

def test_default_options_are_the_plain_simulation():
    kwargs = dict(n_centers=2, patients_per_center=1, seed=7, n_events=1500)
    explicit = simulate_centers(**kwargs, population_shift=None, population_shares=None,
                                population_presence=None, scale="linear")
    plain = simulate_centers(**kwargs)
    assert explicit[1] == plain[1] and _same_cohort(explicit[0], plain[0])
    assert _same_cohort(simulate_cohort(2, seed=7, n_events=1500, population_presence={}),
                        simulate_cohort(2, seed=7, n_events=1500))
    # Byte-identical sample data: tests/test_synthetic.py regenerates sample_data/ and compares hashes.
