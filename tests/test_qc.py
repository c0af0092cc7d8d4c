"""QC flags (saturation at $PnR - 1, time drift) and compensation provenance: gating_core.reports.qc."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.fcs import Channel, Sample, read_fcs, write_fcs
from gating_core.reports.qc import compensation_info, quality_flags, raw_ceiling


def _sample(events, names, ranges, keywords=None, **kwargs):
    channels = [Channel(n, "", r) for n, r in zip(names, ranges)]
    return Sample("synthetic", np.asarray(events), channels, dict(keywords or {}), **kwargs)


# ------------------------------------------------------------------------------ saturation

def test_saturation_counts_events_at_range_minus_one_and_flags_above_threshold():
    n = 2000
    fsc = np.full(n, 500.0)
    fsc[:30] = 1023.0          # at $PnR - 1
    fsc[30:35] = 1022.0        # one below: not saturated
    fl1 = np.full(n, 10.0)
    fl1[:10] = 1023.0          # 0.5%: counted, not flagged at 1%
    report = quality_flags(_sample(np.c_[fsc, fl1], ["FSC-A", "FL1-A"], [1024, 1024]))
    by_channel = {s.channel: s for s in report.saturation}
    assert by_channel["FSC-A"].saturated == 30
    assert by_channel["FSC-A"].fraction == pytest.approx(0.015)
    assert by_channel["FSC-A"].flagged
    assert by_channel["FL1-A"].saturated == 10 and not by_channel["FL1-A"].flagged
    assert report.flags[0].startswith("FSC-A: 30 events (1.5%)")
    assert len(report.flags) == 1
    assert quality_flags(_sample(np.c_[fsc, fl1], ["FSC-A", "FL1-A"], [1024, 1024]),
                         saturation_threshold=0.004).flags[1].startswith("FL1-A: 10 events")
    frame = report.saturation_frame()
    assert frame["% saturated"].tolist() == pytest.approx([1.5, 0.5])


def test_ceiling_follows_log_amplification_and_gain():
    keywords = {"$DATATYPE": "I", "$P1E": "4,1", "$P2E": "0,0", "$P2G": "4", "$P3E": "4,0"}
    sample = _sample(np.zeros((3, 3)), ["FL1-H", "FL2-A", "FL3-H"], [1024, 1024, 1024], keywords)
    assert raw_ceiling(sample, 0) == pytest.approx(10 ** (4 * 1023 / 1024))
    assert raw_ceiling(sample, 1) == pytest.approx(1023 / 4)
    assert raw_ceiling(sample, 2) == pytest.approx(10 ** (4 * 1023 / 1024))   # offset 0 read as 1
    floats = _sample(np.zeros((3, 1)), ["FL1"], [1024], {"$DATATYPE": "F", "$P1E": "4,1", "$P1G": "2"})
    assert raw_ceiling(floats, 0) == 1023.0   # float data are never log-decoded nor gained


def test_compensated_sample_counts_the_stored_values(tmp_path):
    rng = np.random.default_rng(0)
    events = rng.uniform(0, 200_000, size=(5000, 3)).astype(np.float32)
    events[:120, 1] = 262143.0   # saturated in the stored (uncompensated) values
    spill = "3,FL1-A,FL2-A,FL3-A,1,0.2,0.05,0.1,1,0.3,0.02,0.15,1"
    write_fcs(tmp_path / "s.fcs", events, ["FL1-A", "FL2-A", "FL3-A"], keywords={"$SPILLOVER": spill})
    raw = read_fcs(tmp_path / "s.fcs")
    compensated = read_fcs(tmp_path / "s.fcs", compensate=True)
    assert not np.any(compensated.events[:, 1] == 262143.0)   # compensation moved them off the ceiling
    for sample in (raw, compensated):
        counts = {s.channel: s.saturated for s in quality_flags(sample).saturation}
        assert counts == {"FL1-A": 0, "FL2-A": 120, "FL3-A": 0}


CORPUS_SATURATION = {
    # counted on FlowIO's unprocessed values (as_array(preprocess=False)) >= $PnR - 1
    "FACS_Diva/facs_diva_test.fcs": {"FSC-A": 1889, "FSC-W": 2, "SSC-A": 18577, "FITC-A": 1, "PE-A": 45,
                                     "PerCP-A": 7, "PE-Cy7-A": 2, "PacificBlue-A": 36, "APC-A": 0,
                                     "Alexa700-A": 3, "APC-Cy7-A": 0},
    # log-amplified integers ($PnE 4,0): only a stored 1023 is saturated
    "FACSCaliburHTS/Sample_Well_A02.fcs": {"FSC-H": 0, "SSC-H": 1, "FL1-H": 0, "FL2-H": 0, "FL3-H": 0,
                                           "FL2-A": 0, "FL2-W": 0},
}


@pytest.mark.parametrize("relpath", sorted(CORPUS_SATURATION))
def test_saturation_on_real_files_matches_flowio_raw_values(fcs_corpus, relpath):
    flowio = pytest.importorskip("flowio")
    data = flowio.FlowData(str(fcs_corpus / relpath))
    stored = data.as_array(preprocess=False)
    independent = {name: int((stored[:, i] >= float(data.text[f"p{i + 1}r"]) - 1).sum())
                   for i, name in enumerate(data.pnn_labels) if name.lower() != "time"}
    assert independent == CORPUS_SATURATION[relpath]
    for compensate in (False, True):
        report = quality_flags(read_fcs(fcs_corpus / relpath, compensate=compensate))
        assert {s.channel: s.saturated for s in report.saturation} == CORPUS_SATURATION[relpath]


def test_diva_file_flags_scatter_saturation_only(fcs_corpus):
    report = quality_flags(read_fcs(fcs_corpus / "FACS_Diva/facs_diva_test.fcs"))
    flagged = [s.channel for s in report.saturation if s.flagged]
    assert flagged == ["FSC-A", "SSC-A"]     # 2.3% and 22.3%; PE-A's 45 events are 0.05%
    assert report.time_channel == "Time"
    assert sum(report.bin_counts) == 83411
    assert not any(d.flagged for d in report.drift)


def test_log_channels_of_a_cytek_file(fcs_corpus):
    report = quality_flags(read_fcs(fcs_corpus / "Cytek_xP5/Cytek_xP5.fcs"))
    counts = {s.channel: s.saturated for s in report.saturation}
    assert counts == {"FSC": 525, "SSC": 216, "FL1": 0, "FL2": 0, "FL3": 0, "FL4 red": 222, "FL5 red": 0}


# ------------------------------------------------------------------------------ time drift

def _timed(counts_per_bin=None, shift_from=None):
    """10 whole seconds, events at t = k + 0.5; FL1-A steady, FL2-A +200 from bin ``shift_from``."""
    counts_per_bin = counts_per_bin or [200] * 10
    time = np.concatenate([np.full(c, k + 0.5) for k, c in enumerate(counts_per_bin)])
    fl1 = np.concatenate([np.arange(c) % 200 for c in counts_per_bin]).astype(float)
    bins = np.concatenate([np.full(c, k) for k, c in enumerate(counts_per_bin)])
    fl2 = fl1 + (200.0 * (bins >= shift_from) if shift_from is not None else 0.0)
    fsc = 1000.0 * (bins + 1)      # scatter drifting wildly: not a fluorescence channel
    return _sample(np.c_[time, fsc, fl1, fl2], ["Time", "FSC-A", "FL1-A", "FL2-A"], [1e6, 262144, 262144, 262144])


def test_median_drift_in_percentile_points():
    report = quality_flags(_timed(shift_from=7))
    assert report.time_channel == "Time"
    assert report.bin_counts == [200] * 10
    assert report.rate_ratio == 1.0 and report.gaps == 0
    drift = {d.channel: d for d in report.drift}
    assert sorted(drift) == ["FL1-A", "FL2-A"]          # time and scatter left out
    assert drift["FL1-A"].bin_percentiles == [50.0] * 10
    assert drift["FL1-A"].max_shift == 0.0 and not drift["FL1-A"].flagged
    # 1,400 events in [0, 200), 600 in [200, 400): bins 0-6 sit at the 35th percentile, 7-9 at the 85th;
    # the file's median is 142 (each value 0..199 seven times below it): (994 + 1001) / 2 / 2000 = 49.875%
    assert drift["FL2-A"].bin_percentiles == [35.0] * 7 + [85.0] * 3
    assert drift["FL2-A"].reference == 49.875
    assert drift["FL2-A"].max_shift == 35.125 and drift["FL2-A"].worst_bin == 7 and drift["FL2-A"].flagged
    assert report.flags == ["FL2-A: the median moves to the 85th percentile in time bin 8 of 10 (35 points from "
                            "the file's median, threshold 10)"]
    assert quality_flags(_timed(shift_from=7), drift_threshold=40).flags == []


def test_a_channel_mostly_at_one_value_is_not_drift():
    sample = _timed()
    rng = np.random.default_rng(1)
    mostly_zero = np.where(rng.uniform(size=sample.n_events) < 0.7, 0.0, rng.uniform(1, 100, sample.n_events))
    sample.events[:, 2] = mostly_zero           # 70% zeros, the same in every time bin
    drift = {d.channel: d for d in quality_flags(sample).drift}["FL1-A"]
    assert drift.reference == pytest.approx(35.0, abs=1.5)   # the zeros' mid-rank, not 50
    assert drift.max_shift == 0.0 and not drift.flagged


def test_rate_drop_and_gap():
    dropped = quality_flags(_timed([200, 200, 200, 200, 60, 200, 200, 200, 200, 200]))
    assert dropped.bin_counts[4] == 60
    assert dropped.rate_ratio == pytest.approx(0.3)
    assert dropped.flags[0].startswith("event rate: time bin 5 of 10 holds 60 events, 30% of the median bin")
    gap = quality_flags(_timed([200, 200, 200, 0, 200, 200, 200, 200, 200, 200]))
    assert gap.gaps == 1 and gap.bin_counts[3] == 0
    assert gap.flags[0] == "event rate: 1 of 10 time bins hold no events (a gap in the acquisition)"
    assert np.isnan(gap.drift[0].bin_percentiles[3])


def test_no_time_channel_or_too_few_events_is_a_note_not_a_flag(tmp_path):
    report = quality_flags(read_fcs("sample_data/patient_01.fcs"))
    assert report.time_channel is None and report.drift == [] and report.flags == []
    assert report.notes == ["no time channel: drift during the acquisition cannot be checked"]
    small = quality_flags(_timed([50] * 10))
    assert small.drift == [] and "too few" in small.notes[0]


def test_real_file_with_time_channel_flags_early_drift(fcs_corpus):
    # LSR II well: FITC-A sits low during the first fifth of the acquisition (uncompensated values)
    path = fcs_corpus / "HTS_BD_LSR-II/HTS_BD_LSR_II_Mixed_Specimen_001_D6_D06.fcs"
    report = quality_flags(read_fcs(path))
    fitc = report.drift[0]
    assert fitc.channel == "FITC-A" and fitc.flagged and fitc.worst_bin == 1
    assert [round(p, 1) for p in fitc.bin_percentiles] == [39.4, 36.6, 49.6, 52.6, 53.7, 52.7, 51.6, 53.3, 54.4, 54.8]
    assert round(fitc.max_shift, 2) == 13.57
    assert [d.channel for d in report.drift if d.flagged] == ["FITC-A"]
    assert report.bin_counts == [1009, 1125, 1483, 1546, 1571, 1646, 1602, 1632, 1618, 1713]
    # compensated (as the app reads it) the shift is 7.5 points: under the threshold
    compensated = quality_flags(read_fcs(path, compensate=True))
    assert round(compensated.drift[0].max_shift, 1) == 7.5 and not compensated.drift[0].flagged


def test_tied_values_are_not_drift_on_a_real_file(fcs_corpus):
    # FACSCalibur HTS well: log-amplified 10-bit channels, so many events share each value;
    # FL1-H's median, 1.0, is the value of 56% of the events: its mid-rank, the 28th percentile, in every bin
    report = quality_flags(read_fcs(fcs_corpus / "FACSCaliburHTS/Sample_Well_A02.fcs"))
    reference = {d.channel: round(d.reference, 1) for d in report.drift}
    assert reference == {"FL1-H": 28.0, "FL2-H": 50.1, "FL3-H": 32.5, "FL2-A": 27.0, "FL2-W": 48.5}
    assert not any(d.flagged for d in report.drift) and report.flags == []
    assert report.bin_counts == [3690, 3690, 3855, 3855, 3780, 3720, 3660, 3660, 3825, 3660]
    assert report.rate_ratio == pytest.approx(3660 / 3705)   # steady rate: not flagged
    assert not any(f.startswith("event rate") for f in report.flags)


# ------------------------------------------------------------------------------ compensation

def test_compensation_source_keyword_and_matrix_labelled_by_marker(fcs_corpus):
    sample = read_fcs("sample_data/patient_01.fcs", compensate=True)
    info = compensation_info(sample)
    assert info.source == "$SPILLOVER" and info.applied
    np.testing.assert_array_equal(info.matrix, sample.spillover)
    frame = info.to_frame()
    assert list(frame.index) == [sample.channels[sample.channel_index(c)].label for c in sample.spillover_channels]
    assert frame.shape == (7, 7)
    assert info.summary == "7 x 7 spillover matrix from keyword $SPILLOVER, applied"
    assert not compensation_info(read_fcs("sample_data/patient_01.fcs")).applied
    diva = compensation_info(read_fcs(fcs_corpus / "FACS_Diva/facs_diva_test.fcs", compensate=True))
    assert diva.source == "SPILL" and diva.matrix.shape == (8, 8)


def test_compensation_none_ignored_keyword_and_comp(fcs_corpus):
    broken = compensation_info(read_fcs(fcs_corpus / "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs"))
    assert broken.source == "none" and broken.matrix is None
    assert broken.notes == ["$SPILLOVER ignored: 6 channels need 43 values, found 7"]
    comp = compensation_info(_sample(np.zeros((2, 2)), ["FL1", "FL2"], [1024, 1024], {"$COMP": "1,0.1,0.2,1"}))
    assert comp.source == "none"
    assert comp.notes == ["the file holds $COMP, which is not applied (only $SPILLOVER / SPILL are)"]
    assert compensation_info(_sample(np.zeros((2, 1)), ["FL1"], [1024])).summary == \
        "no spillover matrix: events used as stored"
