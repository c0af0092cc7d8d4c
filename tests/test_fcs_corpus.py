"""Real-instrument FCS files (fcsparser 0.2.8 test corpus) and the shared multicenter data."""

from __future__ import annotations

import warnings

import flowio
import numpy as np
import pytest

from gating_core.fcs import FCSError, fcs_info, read_fcs, read_fcs_all

# file (under FlowCytometers/) -> (events, channels)
SINGLE = {
    "Cytek_xP5/Cytek_xP5.fcs": (23126, 8),
    "FACSCaliburHTS/Sample_Well_A02.fcs": (37395, 8),
    "FACS_Diva/facs_diva_test.fcs": (83411, 12),
    "Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs": (11585, 11),
    "HTS_BD_LSR-II/HTS_BD_LSR_II_Mixed_Specimen_001_D6_D06.fcs": (14945, 11),
    "MiltenyiBiotec/FCS2.0/EY_2013-07-19_PBS_FCS_2.0_Custom_Without_Add_Well_A1.001.fcs": (10000, 16),
    "MiltenyiBiotec/FCS3.0/FCS3.0_Custom_Compatible.fcs": (10000, 16),
    "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Custom_Add_Well_A1.001.fcs": (10000, 19),
    "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Custom_Without_Add_Well_A1.001.fcs": (10000, 19),
    "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs": (10000, 19),
    "MiltenyiBiotec/FCS3.1/SG_2014-09-26_Duplicate_Names.fcs": (8129, 9),
    "cyflow_cube_8/cyflow_cube_8.fcs": (725, 10),
    "fake_bitmask_error/fcs1_cleaned.lmd": (50000, 7),
    "fake_large_fcs/fake_large_fcs.fcs": (11585, 11),
}
GUAVA = "GuavaMuse/Guava Muse.fcs"
GUAVA_EVENTS = [108, 50081, 111496, 50037]
# FlowIO 1.4 reads these (with ignore_offset_error); Cytek (24-bit), Guava (several data sets)
# and fake_large_fcs (blank HEADER offsets) it cannot open directly.
FLOWIO_READABLE = [f for f in SINGLE if not f.startswith(("Cytek", "fake_large"))]


def _flowio(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flowio.FlowData(str(path), ignore_offset_error=True, **kwargs)


def _float_channels_with_log_pne(flow):
    """Channels where FlowIO decodes $PnE on floating-point data (we keep them linear)."""
    if flow.data_type == "I":
        return []
    return [n - 1 for n, ch in flow.channels.items() if ch["pne"][0] > 0]


@pytest.mark.parametrize("relpath", sorted(SINGLE))
def test_every_file_loads_with_its_true_shape(fcs_corpus, relpath):
    sample = read_fcs(fcs_corpus / relpath)
    assert sample.events.shape == SINGLE[relpath]
    assert len(sample.channels) == SINGLE[relpath][1]
    assert len(set(sample.pnn)) == len(sample.pnn)
    assert np.isfinite(sample.events).all()
    assert sample.version in ("2.0", "3.0", "3.1")
    assert sample.name == (fcs_corpus / relpath).stem
    info = fcs_info(fcs_corpus / relpath)
    assert info["n_datasets"] == 1
    assert info["datasets"][0]["events"] == SINGLE[relpath][0]


@pytest.mark.parametrize("relpath", FLOWIO_READABLE)
def test_values_match_flowio(fcs_corpus, relpath):
    """Stored values equal FlowIO's raw values; scaled values equal FlowIO's preprocessing."""
    path = fcs_corpus / relpath
    sample = read_fcs(path)
    flow = _flowio(path)
    assert sample.pnn == flow.pnn_labels
    # Raw values through our FlowIO engine (no numpy fast path) ...
    via_flowio = read_fcs(path, engine="flowio")
    assert via_flowio.events.dtype == sample.events.dtype
    np.testing.assert_array_equal(via_flowio.events, sample.events)
    # ... and gain / log / timestep scaling like FlowIO's as_array(preprocess=True),
    # except $PnE on floating-point channels (FCS 3.1: float data are linear).
    expected = flow.as_array(preprocess=True)
    raw = flow.as_array(preprocess=False)
    for c in _float_channels_with_log_pne(flow):
        expected[:, c] = raw[:, c]
    for n, ch in flow.channels.items():  # FCS 3.1: no $PnG on log-amplified channels
        if ch["pne"][0] > 0 and ch["png"] not in (0, 1):
            expected[:, n - 1] *= ch["png"]
    np.testing.assert_allclose(sample.events, expected, rtol=1e-6, atol=1e-9)
    # spot checks, exact: first, middle and last event
    for row in (0, sample.n_events // 2, sample.n_events - 1):
        if sample.events.dtype == np.float32 and not any(
                ch["png"] not in (0, 1) for ch in flow.channels.values()) and "timestep" not in flow.text:
            np.testing.assert_array_equal(sample.events[row], raw[row].astype(np.float32))


def test_float_dtype_kept_float32(fcs_corpus):
    assert read_fcs(fcs_corpus / "Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs").events.dtype == np.float32
    # 16-bit integer data with gain/log decoding: float64
    assert read_fcs(fcs_corpus / "fake_bitmask_error/fcs1_cleaned.lmd").events.dtype == np.float64


def test_cytek_24bit_big_endian_decoded(fcs_corpus):
    """FlowIO cannot read 24-bit integers; check against the bytes themselves."""
    path = fcs_corpus / "Cytek_xP5/Cytek_xP5.fcs"
    sample = read_fcs(path)
    raw = path.read_bytes()
    start = 4096  # $BEGINDATA
    bytes_per_event = 8 * 3
    for row in (0, 1, 11111, 23125):
        for c in range(8):
            offset = start + row * bytes_per_event + 3 * c
            stored = int.from_bytes(raw[offset:offset + 3], "big")
            pnr = 30000 if c == 0 else 1024
            mask_limit = 32768 if c == 0 else 1024
            stored &= mask_limit - 1
            if c == 0:  # TIME: x $TIMESTEP 0.001
                expected = stored * 0.001
            elif c < 3:  # FSC, SSC linear
                expected = float(stored)
            else:  # FL1..FL5: $PnE 4.0,1.0 over $PnR 1024
                expected = 10 ** (4.0 * stored / pnr)
            assert sample.events[row, c] == pytest.approx(expected, rel=1e-12)
    assert sample.pnn == ["TIME", "FSC", "SSC", "FL1", "FL2", "FL3", "FL4 red", "FL5 red"]


def test_blank_header_offsets_fall_back_to_text(fcs_corpus):
    large = read_fcs(fcs_corpus / "fake_large_fcs/fake_large_fcs.fcs")
    same = read_fcs(fcs_corpus / "Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs")
    np.testing.assert_array_equal(large.events, same.events)
    np.testing.assert_array_equal(read_fcs(fcs_corpus / "fake_large_fcs/fake_large_fcs.fcs",
                                           engine="flowio").events, same.events)


def test_miltenyi_off_by_one_enddata_is_tolerated_and_noted(fcs_corpus):
    sample = read_fcs(fcs_corpus / "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs")
    assert any("760001 bytes, expected 760000" in n for n in sample.notes)
    # A truncated $SPILLOVER (names only) is ignored, and refusing to compensate with it is loud
    assert sample.spillover is None
    assert any("$SPILLOVER ignored" in n for n in sample.notes)
    with pytest.raises(FCSError, match="compensation requested.*turn compensation off .command line: --no-compensation"):
        read_fcs(fcs_corpus / "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs",
                 compensate=True)


def test_bitmask_applied_to_pnr(fcs_corpus):
    path = fcs_corpus / "fake_bitmask_error/fcs1_cleaned.lmd"
    sample = read_fcs(path)
    flow = _flowio(path)
    raw = flow.as_array(preprocess=False)
    assert raw.max() <= 1023  # FlowIO masks to $PnR 1024 too
    unmasked = np.frombuffer(path.read_bytes()[4232:4232 + 50000 * 14], dtype="<u2").reshape(-1, 7)
    assert (unmasked > 1023).any()  # the file does carry bits above the range
    np.testing.assert_array_equal(sample.events[:, 0], (unmasked[:, 0] & 1023) / 2.0)  # $P1G 2
    np.testing.assert_array_equal(sample.events[:, 1], (unmasked[:, 1] & 1023) / 10.0)  # $P2G 10
    np.testing.assert_allclose(sample.events[:, 2], 10 ** (4.0 * (unmasked[:, 2] & 1023) / 1024) * 0.1024,
                               rtol=1e-12)


def test_guava_multiple_data_sets(fcs_corpus):
    path = fcs_corpus / GUAVA
    samples = read_fcs_all(path)
    assert [s.n_events for s in samples] == GUAVA_EVENTS
    assert [s.name for s in samples] == [f"Guava Muse#{k}" for k in range(1, 5)]
    assert all(s.events.shape[1] == 10 for s in samples)
    references = flowio.read_multiple_data_sets(str(path))
    # Linear channels FSC/YEL/RED-HLin carry gains 2.95, 18.22, 117.38; TIME x $TIMESTEP.
    # The HLog channels hold log10 values as floats with $PnE 4,1: kept as stored, no gain.
    scale = np.array([2.95, 1, 18.22, 1, 117.38, 1, 1 / 0.000025, 1, 1, 1])
    for sample, ref in zip(samples, references):
        raw = ref.as_array(preprocess=False)
        np.testing.assert_allclose(sample.events, raw / scale, rtol=1e-6)
        np.testing.assert_array_equal(sample.events[:, 7:], raw[:, 7:].astype(np.float32))
    np.testing.assert_allclose(10 ** samples[1].events[:, 7], references[1].as_array(False)[:, 0],
                               rtol=1e-3)  # FSC-HLog = log10(FSC-HLin stored)
    third = read_fcs(path, dataset=2)
    assert third.name == "Guava Muse#3"
    np.testing.assert_array_equal(third.events, samples[2].events)
    with pytest.raises(FCSError, match="data set 4 requested but the file holds 4"):
        read_fcs(path, dataset=4)
    info = fcs_info(path)
    assert info["n_datasets"] == 4
    assert [d["events"] for d in info["datasets"]] == GUAVA_EVENTS


def test_spillover_parsed_and_applied(fcs_corpus):
    path = fcs_corpus / "FACS_Diva/facs_diva_test.fcs"
    sample = read_fcs(path)
    assert sample.has_spillover
    assert sample.spillover.shape == (8, 8)
    assert sample.spillover_channels == ["FITC-A", "PE-A", "PerCP-A", "PE-Cy7-A", "PacificBlue-A",
                                         "APC-A", "Alexa700-A", "APC-Cy7-A"]
    assert sample.spillover[0, 1] == 0.1839411109727794
    assert np.all(np.diag(sample.spillover) == 1)
    assert "SPILL" in sample.keywords  # written without '$' by DIVA
    compensated = read_fcs(path, compensate=True)
    assert compensated.compensated
    idx = [sample.channel_index(n) for n in sample.spillover_channels]
    expected = sample.events[:, idx].astype(np.float64) @ np.linalg.inv(sample.spillover)
    np.testing.assert_allclose(compensated.events[:, idx], expected, rtol=1e-5, atol=1e-3)
    others = [i for i in range(12) if i not in idx]
    np.testing.assert_array_equal(compensated.events[:, others], sample.events[:, others])
    # compensating back: events @ S recovers the raw values
    np.testing.assert_allclose(compensated.events[:, idx] @ sample.spillover, sample.events[:, idx],
                               rtol=1e-4, atol=0.05)


@pytest.mark.parametrize("relpath", ["Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs",
                                     "HTS_BD_LSR-II/HTS_BD_LSR_II_Mixed_Specimen_001_D6_D06.fcs"])
def test_spill_keyword_of_bd_files(fcs_corpus, relpath):
    sample = read_fcs(fcs_corpus / relpath)
    assert sample.spillover.shape == (4, 4)
    assert sample.spillover_channels[0] == "FITC-A"


def test_corrupted_file_clear_error(fcs_corpus):
    with pytest.raises(FCSError) as err:
        read_fcs(fcs_corpus / "corrupted/corrupted.fcs")
    assert str(err.value).startswith("corrupted.fcs: ")
    assert "too short" in err.value.problem
    assert err.value.path.endswith("corrupted.fcs")


def test_header_only_file_clear_error(fcs_corpus):
    with pytest.raises(FCSError) as err:
        read_fcs(fcs_corpus / "cytek-nl-2000/sample_header.fcs")
    assert str(err.value).startswith("sample_header.fcs: ")
    assert "before its DATA segment" in err.value.problem
    with pytest.raises(FCSError):
        fcs_info(fcs_corpus / "cytek-nl-2000/sample_header.fcs")


def test_missing_and_directory(tmp_path):
    with pytest.raises(FCSError, match="nothere.fcs: file not found"):
        read_fcs(tmp_path / "nothere.fcs")
    with pytest.raises(FCSError, match="directory"):
        read_fcs(tmp_path)


def test_multicenter_sample(multicenter_dir):
    path = multicenter_dir / "multicenter_01.fcs"
    sample = read_fcs(path)
    assert sample.events.shape == (55621, 8)
    names = ["CCR6", "CD20", "CD45", "CD14", "CD16", "CD8", "CD3", "CD4"]
    assert sample.pnn == names
    assert sample.pns == names
    assert sample.events.dtype == np.float32
    np.testing.assert_array_equal(sample.events, _flowio(path).as_array(preprocess=False).astype(np.float32))
    assert not sample.has_spillover


def test_all_multicenter_samples_read(multicenter_dir):
    counts = {1: 55621, 2: 48352, 3: 47581, 4: 46570, 5: 48713, 6: 72762, 7: 66766, 8: 63258,
              9: 68888, 10: 65177}
    for k, n in counts.items():
        assert fcs_info(multicenter_dir / f"multicenter_{k:02d}.fcs")["datasets"][0]["events"] == n


def test_cyflow_supplemental_text_that_is_a_zip_is_not_read_as_keywords(fcs_corpus):
    """CyFlow Cube 8 points $BEGINSTEXT at a ZIP archive: no keywords come from it."""
    sample = read_fcs(fcs_corpus / "cyflow_cube_8/cyflow_cube_8.fcs")
    assert all(name.isprintable() for name in sample.keywords)
    assert sample.keywords["$CYT"].strip()
    assert any("supplemental TEXT" in n and "ignored" in n for n in sample.notes)
