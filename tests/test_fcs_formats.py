"""Less common FCS layouts and writer quirks, on files written byte by byte (``build_fcs``).

FCS 3.2 (per-channel $PnDATATYPE), keyword names padded with spaces (Partec/Sysmex CyFlow),
FCS 2.0 empty keyword values (BD CellQuest), files with an unreadable data set next to
readable ones (Beckman FC500 LMD), packed 10-bit and ASCII event data, and keyword values that
must not be applied ($TIMESTEP <= 0, negative $PnG, a $BYTEORD shorter than the values).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fcs_properties import build_dataset, build_fcs

from gating_core.fcs import FCSError, fcs_info, read_fcs, read_fcs_all


def _write(tmp_path, name, blob):
    path = tmp_path / name
    path.write_bytes(blob)
    return path


# ---------------------------------------------------------------------------------------------
# 4. FCS 3.2
# ---------------------------------------------------------------------------------------------

def test_fcs32_with_per_channel_datatypes_and_new_keywords(tmp_path):
    rng = np.random.default_rng(3)
    n = 25
    columns = [rng.integers(0, 2 ** 20, n, dtype=np.uint64),          # Time, integer
               (rng.standard_normal(n) * 1e4).astype(np.float32),     # FSC-A, float
               rng.integers(0, 2 ** 16, n, dtype=np.uint64),          # an index, 16-bit int
               rng.standard_normal(n) * 1e5]                          # a double channel
    extra = {"$CARRIERID": "plate-7", "$CARRIERTYPE": "96-well", "$LOCATIONID": "B03",
             "$P1TYPE": "Time", "$P2TYPE": "Forward_Scatter", "$P3TYPE": "Index",
             "$P4TYPE": "Raw_Fluorescence", "$P4ANALYTE": "CD4", "$P4FEATURE": "Area",
             "$BEGINDATETIME": "2024-05-01T10:00:00", "$TIMESTEP": "0.5"}
    blob = build_dataset(columns, datatype="F", datatypes=["I", "F", "I", "D"],
                         widths=[4, 4, 2, 8], ranges=[2 ** 20, 262144, 2 ** 16, 262144],
                         version="3.2", pnn=["Time", "FSC-A", "IDX", "FL1-A"], extra=extra)
    path = _write(tmp_path, "discover.fcs", blob)
    sample = read_fcs(path)
    assert sample.version == "3.2"
    assert sample.events.shape == (n, 4)
    np.testing.assert_array_equal(sample.events[:, 0], columns[0].astype(np.float64) * 0.5)
    np.testing.assert_array_equal(sample.events[:, 1], columns[1])
    np.testing.assert_array_equal(sample.events[:, 2], columns[2].astype(np.float64))
    np.testing.assert_array_equal(sample.events[:, 3], columns[3])
    assert sample.events.dtype == np.float64
    assert sample.keywords["$CARRIERID"] == "plate-7"
    assert sample.keywords["$P4ANALYTE"] == "CD4"
    assert not any("BYTEORD" in n for n in sample.notes)  # 1,2,3,4 covers 64-bit values too
    info = fcs_info(path)
    assert info["version"] == "3.2" and info["datasets"][0]["events"] == n
    # the FlowIO engine cannot read per-channel data types: the numpy reader is used instead
    np.testing.assert_array_equal(read_fcs(path, engine="flowio").events, sample.events)


def test_fcs32_without_mode_keyword_and_bad_pndatatype(tmp_path):
    columns = [np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32) * 2]
    text_ok = build_dataset(columns, datatype="F", version="3.2")
    # $MODE is deprecated in 3.2: a file without it is list mode.
    without_mode = text_ok.replace(b"$MODE/L/", b"$SYS/XY/")  # same length: offsets hold
    path = _write(tmp_path, "nomode.fcs", without_mode)
    np.testing.assert_array_equal(read_fcs(path).events[:, 1], columns[1])
    bad = build_dataset(columns, datatype="F", version="3.2", extra={"$P2DATATYPE": "Q"})
    with pytest.raises(FCSError, match=r"\$P2DATATYPE must be I, F or D"):
        read_fcs(_write(tmp_path, "bad.fcs", bad))
    hist = build_dataset(columns, datatype="F", version="3.2", extra={"$MODE": "C"})
    with pytest.raises(FCSError, match="histogram"):
        read_fcs(_write(tmp_path, "hist.fcs", hist))


# ---------------------------------------------------------------------------------------------
# 5. Keyword names padded with spaces / in lower case (Partec / Sysmex CyFlow)
# ---------------------------------------------------------------------------------------------

def test_keyword_names_padded_with_spaces_are_normalised(tmp_path):
    columns = [np.array([1, 2, 300], dtype=np.uint64), np.array([4, 5, 6], dtype=np.uint64)]
    blob = build_dataset(columns, datatype="I", widths=[2, 2], ranges=[1024, 1024],
                         pnn=["FSC", "FL1"], extra={"$TIMESTEP": "0.1", "COM": "cyflow"},
                         rename=lambda k: "  " + (k.lower() if k.startswith("$P") else k) + " ")
    path = _write(tmp_path, "cyflow.fcs", blob)
    sample = read_fcs(path)
    np.testing.assert_array_equal(sample.events, np.column_stack(columns).astype(np.float32))
    assert sample.pnn == ["FSC", "FL1"]
    assert sample.keywords["$DATATYPE"] == "I"
    assert sample.keywords["$P1N"] == "FSC"
    assert sample.keywords["COM"] == "cyflow"
    assert any("padded" in n for n in sample.notes)


# ---------------------------------------------------------------------------------------------
# 6. Several data sets, one unreadable; packed and ASCII integers
# ---------------------------------------------------------------------------------------------

def _pack(columns, bits, msb_first):
    stream = []
    for row in zip(*columns):
        for value, b in zip(row, bits):
            word = [(int(value) >> k) & 1 for k in range(b)]
            stream.extend(word[::-1] if msb_first else word)
    stream += [0] * (-len(stream) % 8)
    return np.packbits(np.array(stream, dtype=np.uint8),
                       bitorder="big" if msb_first else "little").tobytes()


def test_unreadable_data_set_is_skipped_and_reported(tmp_path):
    good = [np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 10]
    hist = dict(columns=[np.arange(8, dtype=np.uint64)], datatype="I", widths=[2],
                ranges=[1024], extra={"$MODE": "U"})
    path = _write(tmp_path, "lmd.fcs", build_fcs(hist, dict(columns=good, datatype="F"),
                                                 dict(columns=good, datatype="F")))
    samples = read_fcs_all(path)
    assert [s.name for s in samples] == ["lmd#2", "lmd#3"]
    assert samples.skipped == [("lmd#1", samples.skipped[0][1])]
    assert "histogram" in samples.skipped[0][1]
    for s in samples:
        np.testing.assert_array_equal(s.events[:, 1], good[1])
        assert any(n.startswith("data set lmd#1 skipped") and "histogram" in n for n in s.notes)
    with pytest.raises(FCSError, match=r"data set 1 of 3 .*histogram"):
        read_fcs(path)
    np.testing.assert_array_equal(read_fcs(path, dataset=2).events[:, 0], good[0])
    info = fcs_info(path)
    assert info["n_datasets"] == 3
    assert info["datasets"][0]["name"] == "lmd#1" and "histogram" in info["datasets"][0]["error"]
    assert info["datasets"][1]["events"] == 4


def test_all_data_sets_unreadable_is_an_error(tmp_path):
    hist = dict(columns=[np.arange(8, dtype=np.uint64)], datatype="I", widths=[2],
                ranges=[1024], extra={"$MODE": "U"})
    path = _write(tmp_path, "allbad.fcs", build_fcs(hist, hist))
    with pytest.raises(FCSError, match="none of the 2 data sets"):
        read_fcs_all(path)
    with pytest.raises(FCSError, match="none of the 2 data sets"):
        fcs_info(path)


@pytest.mark.parametrize("byteord,msb_first", [("1,2,3,4", False), ("4,3,2,1", True)])
def test_packed_10_bit_integers(tmp_path, byteord, msb_first):
    rng = np.random.default_rng(1)
    n, bits = 13, [10, 10, 12]  # 32 bits an event, 13 events: not byte aligned per value
    columns = [rng.integers(0, 2 ** b, n, dtype=np.uint64) for b in bits]
    extra = {f"$P{i + 1}B": str(b) for i, b in enumerate(bits)}
    blob = build_dataset(columns, datatype="I", byteord=byteord, ranges=[2 ** b for b in bits],
                         version="2.0", extra=extra, data=_pack(columns, bits, msb_first))
    sample = read_fcs(_write(tmp_path, "packed.fcs", blob))
    np.testing.assert_array_equal(sample.events, np.column_stack(columns).astype(np.float32))
    assert any("packed" in note for note in sample.notes)


def test_packed_odd_total_bits(tmp_path):
    columns = [np.array([1, 1023, 512, 7, 0], dtype=np.uint64)] * 3
    extra = {f"$P{i}B": "10" for i in (1, 2, 3)}
    data = _pack(columns, [10] * 3, msb_first=True)
    assert len(data) == 19  # 150 bits
    blob = build_dataset(columns, datatype="I", byteord="2,1", ranges=[1024] * 3, extra=extra,
                         data=data)
    np.testing.assert_array_equal(read_fcs(_write(tmp_path, "odd.fcs", blob)).events[:, 2],
                                  columns[2])


def test_fc500_lmd_10_bit_set_stored_in_16_bit_words_and_float_set(tmp_path):
    """FC500 LMD: an FCS 2.0 set with $PnB 10 whose values sit in 16-bit words, then FCS 3.0."""
    ints = [np.array([0, 1023, 77, 1024 + 5], dtype=np.uint64)] * 2
    first = dict(columns=ints, datatype="I", widths=[2, 2], ranges=[1024, 1024], version="2.0",
                 byteord="1,2", extra={"$P1B": "10", "$P2B": "10", "$SYS": "CXP"})
    floats = [np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32)] * 2
    path = _write(tmp_path, "fc500.lmd", build_fcs(first, dict(columns=floats, datatype="F",
                                                                version="3.0")))
    one, two = read_fcs_all(path)
    np.testing.assert_array_equal(one.events[:, 0], [0, 1023, 77, 5])
    assert any("16-bit" in n for n in one.notes)
    np.testing.assert_array_equal(read_fcs(path, engine="flowio").events, one.events)
    np.testing.assert_array_equal(two.events[:, 1], floats[1])


def test_ascii_fixed_width_and_delimited(tmp_path):
    columns = [np.array([0, 12, 345, 1023], dtype=np.uint64), np.array([7, 8, 9, 10], dtype=np.uint64)]
    fixed = b"".join(b"%4d%3d" % (a, b) for a, b in zip(*columns))
    blob = build_dataset(columns, datatype="A", ranges=[1024, 1024], version="2.0",
                         extra={"$P1B": "4", "$P2B": "3", "$P2E": "2,1", "$P2R": "10"},
                         data=fixed)
    sample = read_fcs(_write(tmp_path, "fixed.fcs", blob))
    np.testing.assert_array_equal(sample.events[:, 0], columns[0])
    np.testing.assert_allclose(sample.events[:, 1], 10 ** (2 * columns[1] / 10))
    delimited = b"0,7\r\n12 8\n345\t9\n1023,10\n"
    blob = build_dataset(columns, datatype="A", ranges=[1024, 1024], version="3.0",
                         extra={"$P1B": "*", "$P2B": "*"}, data=delimited)
    sample = read_fcs(_write(tmp_path, "delim.fcs", blob))
    np.testing.assert_array_equal(sample.events, np.column_stack(columns))
    garbage = build_dataset(columns, datatype="A", ranges=[1024, 1024],
                            extra={"$P1B": "*", "$P2B": "*"}, data=b"1,2,x3,4,5,6,7,8 ")
    with pytest.raises(FCSError, match="ASCII"):
        read_fcs(_write(tmp_path, "garbage.fcs", garbage))
    short = build_dataset(columns, datatype="A", ranges=[1024, 1024],
                          extra={"$P1B": "*", "$P2B": "*"}, data=b"1,2,3,4,5,6,7     ")
    with pytest.raises(FCSError, match="ASCII"):
        read_fcs(_write(tmp_path, "short.fcs", short))
    huge = build_dataset(columns, datatype="A", ranges=[1024, 1024], tot=10 ** 9,
                         extra={"$P1B": "*", "$P2B": "*"}, data=delimited)
    with pytest.raises(FCSError, match="cannot fit"):
        fcs_info(_write(tmp_path, "huge.fcs", huge))


# ---------------------------------------------------------------------------------------------
# 7. FCS 2.0 empty keyword values (BD CellQuest)
# ---------------------------------------------------------------------------------------------

def test_fcs20_empty_values_do_not_shift_keywords(tmp_path):
    columns = [np.arange(5, dtype=np.uint64) + k for k in range(6)]
    pnn = ["FSC-H", "SSC-H", "FL1-H", "FL2-H", "FL3-H", "FL1-A"]
    pns = ["", "", "", "CD4", "", "CD8"]
    blob = build_dataset(columns, datatype="I", widths=[2] * 6, ranges=[1024] * 6, pnn=pnn,
                         pns=pns, version="2.0", extra={"$SRC": "", "$CYT": "FACSCalibur"})
    assert b"/$P3S//$P3B/" in blob  # the CellQuest pattern: an empty value
    sample = read_fcs(_write(tmp_path, "cellquest.fcs", blob))
    assert sample.pnn == pnn
    assert sample.pns == pns
    assert sample.keywords["$P3S"] == "" and sample.keywords["$P4S"] == "CD4"
    assert sample.keywords["$SRC"] == "" and sample.keywords["$CYT"] == "FACSCalibur"
    np.testing.assert_array_equal(sample.events, np.column_stack(columns).astype(np.float32))
    assert any("empty value" in n and "$P3S" in n for n in sample.notes)


def test_doubled_delimiter_stays_an_escape_elsewhere(tmp_path):
    columns = [np.arange(3, dtype=np.float32)]
    # a value with an escaped delimiter (3.x and 2.0), and a 2.0 key followed by a non-keyword
    for version in ("2.0", "3.1"):
        blob = build_dataset(columns, datatype="F", version=version,
                             extra={"$COM": "a/b//c", "$SMNO": "12/34", "$FIL": "/data/x.fcs",
                                    "$SRC": "tube/"})
        sample = read_fcs(_write(tmp_path, f"esc{version}.fcs", blob))
        assert sample.keywords["$COM"] == "a/b//c"
        assert sample.keywords["$SMNO"] == "12/34"
        assert sample.keywords["$FIL"] == "/data/x.fcs"  # a value starting with the delimiter
        assert sample.keywords["$SRC"] == "tube/"  # ... and one ending with it
        assert not any("empty value" in n for n in sample.notes)


# ---------------------------------------------------------------------------------------------
# 8. Values that must not be applied
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("timestep", ["0", "-0.01"])
def test_nonpositive_timestep_is_ignored_with_a_note(tmp_path, timestep):
    columns = [np.array([0, 10, 20], dtype=np.uint64), np.array([1, 2, 3], dtype=np.uint64)]
    blob = build_dataset(columns, datatype="I", widths=[2, 2], ranges=[1024, 1024],
                         pnn=["Time", "FSC"], extra={"$TIMESTEP": timestep})
    sample = read_fcs(_write(tmp_path, "ts.fcs", blob))
    np.testing.assert_array_equal(sample.events[:, 0], [0, 10, 20])
    assert any("$TIMESTEP" in n and "ignored" in n for n in sample.notes)


def test_negative_gain_is_ignored_with_a_note(tmp_path):
    columns = [np.array([4, 8], dtype=np.uint64), np.array([4, 8], dtype=np.uint64)]
    blob = build_dataset(columns, datatype="I", widths=[2, 2], ranges=[1024, 1024],
                         extra={"$P1G": "-2", "$P2G": "2"})
    sample = read_fcs(_write(tmp_path, "gain.fcs", blob))
    np.testing.assert_array_equal(sample.events[:, 0], [4, 8])
    np.testing.assert_array_equal(sample.events[:, 1], [2, 4])
    assert any("$P1G" in n and "ignored" in n for n in sample.notes)
    assert not any("$P2G" in n for n in sample.notes)


@pytest.mark.parametrize("byteord,endian", [("1", "little"), ("1,2", "little"), ("2,1", "big")])
def test_byteord_shorter_than_the_values_is_noted(tmp_path, byteord, endian):
    values = np.array([1, 70000, 2 ** 31 + 5], dtype=np.uint64)
    raw = values.astype(("<" if endian == "little" else ">") + "u4").tobytes()
    blob = build_dataset([values], datatype="I", widths=[4], ranges=[2 ** 32], byteord=byteord,
                         data=raw)
    sample = read_fcs(_write(tmp_path, "bo.fcs", blob))
    np.testing.assert_array_equal(sample.events[:, 0], values)
    assert any("$BYTEORD" in n and endian in n for n in sample.notes)


def test_upload_report_names_a_skipped_data_set(tmp_path):
    from ui.ingest import ingest_files

    good = [np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) + 10]
    hist = dict(columns=[np.arange(8, dtype=np.uint64)], datatype="I", widths=[2],
                ranges=[1024], extra={"$MODE": "U"})
    blob = build_fcs(hist, dict(columns=good, datatype="F"))
    report = ingest_files([("fc500.lmd.fcs", blob)], tmp_path / "work", compensate=False)
    assert len(report.patients) == 1 and report.patients[0].sample.n_events == 4
    assert not report.errors
    assert any("data set" in m and "#1" in m and "histogram" in m for _, m in report.notes)


def test_batch_gating_records_a_skipped_data_set(tmp_path):
    from gating_core.batch.files import gate_file

    class NoModel:  # what gate_file's streamed path uses: .compensate, .gated_populations, .gate_chunks
        compensate = False

        def gated_populations(self):
            return ["a", "b"]

        def gate_chunks(self, sample, chunks, chunk_size, sink):
            n_events = sum(len(events) for _, events in chunks(chunk_size))  # the readable data set is read
            raise ValueError(f"not gated ({n_events} events)")

    good = [np.arange(4, dtype=np.float32)] * 2
    hist = dict(columns=[np.arange(8, dtype=np.uint64)], datatype="I", widths=[2],
                ranges=[1024], extra={"$MODE": "U"})
    path = _write(tmp_path, "two.fcs", build_fcs(hist, dict(columns=good, datatype="F")))
    records = gate_file(NoModel(), path, tmp_path)
    by_patient = {r["patient"]: r["error"] for r in records}
    assert by_patient["two#2"] == f"{path}: not gated (4 events)"  # the path given, not only its name
    assert by_patient["two#1"].startswith(f"{path}: data set two#1 cannot be read: histogram")


def test_flowio_engine_falls_back_on_normalised_text(tmp_path):
    columns = [np.array([1, 2, 3], dtype=np.uint64), np.array([4, 5, 6], dtype=np.uint64)]
    padded = build_dataset(columns, datatype="I", widths=[2, 2], ranges=[1024, 1024],
                           rename=lambda k: " " + k)
    empty = build_dataset(columns, datatype="I", widths=[2, 2], ranges=[1024, 1024],
                          version="2.0", pns=["", "CD4"])
    for name, blob in (("padded.fcs", padded), ("empty.fcs", empty)):
        sample = read_fcs(_write(tmp_path, name, blob), engine="flowio")
        np.testing.assert_array_equal(sample.events, np.column_stack(columns).astype(np.float32))
        assert any("FlowIO cannot read" in n for n in sample.notes)


def test_a_sample_shows_as_a_one_line_summary(sample_data_dir):
    from gating_core import read_fcs

    sample = read_fcs(sample_data_dir / "patient_01.fcs")
    assert repr(sample) == ("Sample('patient_01', 12,000 events x 9 channels [FSC-A, SSC-A, FL1-A, FL2-A, FL3-A, "
                            "FL4-A, FL5-A, FL6-A, ...], float32, FCS 3.1, spillover of 7 channels, "
                            f"{len(sample.keywords)} keywords)")
    assert repr(sample.compensate()).endswith(f"spillover of 7 channels, compensated, {len(sample.keywords)} keywords)")
