"""A damaged FCS file never gives numbers: where the DATA segment cannot be located
consistently (cut short, offsets into TEXT or ANALYSIS, a length $TOT does not explain) every
reader refuses with an FCSError naming the file, and the commands exit non-zero; offsets that
disagree for a known reason still read. A $TIMESTEP that would overflow never lets a numpy
warning reach the user.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_fcs_properties import build_dataset, build_fcs

from gating_core.fcs import FCSError, fcs_info, read_fcs, read_fcs_all, stream_fcs_all, write_fcs
from helpers import SAMPLE_DATA, quick_model_file, run_cli

NEW_PATIENT = SAMPLE_DATA / "new" / "new_patient_01.fcs"
#: The commands run with numpy's warnings as errors: a warning reaching the user fails them.
WARNINGS_FAIL = ("-W", "error::RuntimeWarning")


def _header_offsets(blob: bytes) -> tuple[int, int]:
    return int(blob[26:34]), int(blob[34:42])


def _set_header_data(blob: bytes, start: int, stop: int) -> bytes:
    return blob[:26] + b"%8d%8d" % (start, stop) + blob[42:]


def _set_text_data(blob: bytes, start: int, stop: int) -> bytes:
    """Rewrite $BEGINDATA / $ENDDATA in place (the writers here give them 12 or 20 digits)."""
    def replace(match, value):
        return match.group(1) + str(value).zfill(len(match.group(2))).encode()

    blob = re.sub(rb"(\$BEGINDATA.)(\d+)", lambda m: replace(m, start), blob, count=1)
    return re.sub(rb"(\$ENDDATA.)(\d+)", lambda m: replace(m, stop), blob, count=1)


def _refuses(path: Path, *problem: str) -> None:
    """Every reader refuses ``path`` with an FCSError naming it and each of ``problem``."""
    for read in (read_fcs, read_fcs_all, fcs_info, stream_fcs_all):
        with pytest.raises(FCSError) as err:
            read(path)
        assert str(err.value).startswith(f"{path.name}: "), (read.__name__, str(err.value))
        for words in problem:
            assert words in err.value.problem, (read.__name__, err.value.problem)


def _cut_with_header_in_text(source: bytes, cut: int, into_text: int) -> bytes:
    """``source`` with its HEADER DATA offsets moved ``into_text`` bytes back (into TEXT) and
    its last ``cut`` bytes (inside DATA) gone."""
    start, stop = _header_offsets(source)
    return _set_header_data(source, start - into_text, stop - into_text)[:len(source) - cut]


# -- cut inside DATA -------------------------------------------------------------------------------


def test_a_file_cut_inside_data_never_reads_text_as_events(tmp_path):
    """The TEXT offsets no longer fit the cut file; the HEADER offsets point into TEXT and would
    leave enough bytes: reading them gave TEXT bytes as events. Now every reader refuses."""
    cols = [np.full(2000, 997.6, dtype=np.float32), np.arange(2000, dtype=np.float32)]
    blob = build_dataset(cols, datatype="F", pnn=["FSC-A", "SSC-A"], extra={"$CYT": "x" * 50})
    path = tmp_path / "cut.fcs"
    path.write_bytes(_cut_with_header_in_text(blob, cut=50, into_text=100))
    _refuses(path, "the file is truncated", "overlaps the TEXT segment")
    with pytest.raises(FCSError, match=r"ends at byte 16326 but the file has only 16276 bytes"):
        read_fcs(path)


@pytest.mark.parametrize("cut", [1, 7, 1000, 15_999])
def test_any_cut_inside_data_is_refused(tmp_path, cut):
    cols = [np.arange(2000, dtype=np.float32)] * 2
    blob = build_dataset(cols, datatype="F")
    path = tmp_path / "cut.fcs"
    path.write_bytes(blob[:len(blob) - cut])
    _refuses(path, "the file is truncated")
    with pytest.raises(FCSError) as err:
        read_fcs(path)
    assert err.value.problem.startswith("the file is truncated (cut short when copied or written): ")
    assert err.value.problem.count("truncated") == 1


def test_a_picture_dropped_for_an_fcs_file_is_named(tmp_path):
    path = tmp_path / "scan.fcs"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    _refuses(path, "not an FCS file: it is a PNG image")
    with pytest.raises(FCSError) as err:
        read_fcs(path)
    assert str(err.value) == "scan.fcs: not an FCS file: it is a PNG image"  # no bytes shown once it is named
    path.write_bytes(b"not fcs at all" + bytes(100))
    _refuses(path, "not an FCS file (the HEADER starts with 'not fcs at' instead of 'FCS')")
    path.write_text("FSC-A,SSC-A,population,confidence\n1.0,2.0,T cells,0.9\n" * 3)
    _refuses(path, "not an FCS file: it is a text table (a gated CSV or a labels file?)")


def test_a_real_instrument_file_cut_inside_data_is_refused(fcs_corpus, tmp_path):
    source = (fcs_corpus / "Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs").read_bytes()
    path = tmp_path / "fortessa_cut.fcs"
    path.write_bytes(source[:len(source) - 3000])
    _refuses(path, "the file is truncated")
    path.write_bytes(_cut_with_header_in_text(source, cut=40, into_text=60))
    _refuses(path, "the file is truncated", "overlaps the TEXT segment")


def test_streamed_reads_refuse_before_the_first_chunk(tmp_path):
    cols = [np.arange(5000, dtype=np.float32)] * 3
    path = tmp_path / "cut.fcs"
    path.write_bytes(_cut_with_header_in_text(build_dataset(cols, datatype="F"), cut=8, into_text=30))
    with pytest.raises(FCSError, match="cut.fcs: .*the file is truncated"):
        stream_fcs_all(path)


def test_a_file_cut_between_data_sets_reports_the_missing_one(tmp_path):
    """$NEXTDATA points at or past the end of the cut file: the data sets before it are read,
    the missing one is listed as truncated (not just noted)."""
    first = [np.arange(10, dtype=np.float32)] * 2
    blob = build_fcs(dict(columns=first, datatype="F"), dict(columns=first, datatype="F"))
    boundary = int(re.search(rb"\$NEXTDATA.(\d+)", blob).group(1))
    for cut in (boundary, boundary + 30):
        path = tmp_path / "two.fcs"
        path.write_bytes(blob[:cut])
        samples = read_fcs_all(path)
        assert [s.name for s in samples] == ["two#1"]
        np.testing.assert_array_equal(samples[0].events, np.column_stack(first))
        if cut == boundary:
            assert samples.skipped == [("two#2", f"$NEXTDATA of data set 1 points to byte {boundary} but the "
                                                 f"file has only {boundary} bytes: the file is truncated")]
        else:
            assert samples.skipped[0][0] == "two#2" and "truncated" in samples.skipped[0][1]
        assert [s.sample.name for s in stream_fcs_all(path)] == ["two#1"]
        assert "truncated" in fcs_info(path)["datasets"][1]["error"]


def test_a_real_multi_data_set_file_cut_between_data_sets(fcs_corpus, tmp_path):
    source = (fcs_corpus / "GuavaMuse/Guava Muse.fcs").read_bytes()
    path = tmp_path / "guava.fcs"
    path.write_bytes(source[:6477524])  # the fourth data set's HEADER starts here
    samples = read_fcs_all(path)
    assert [s.n_events for s in samples] == [108, 50081, 111496]
    assert samples.skipped and samples.skipped[0][0] == "guava#4" and "truncated" in samples.skipped[0][1]


# -- offsets that cannot be the DATA segment -------------------------------------------------------


def test_a_data_segment_of_another_length_than_tot_is_refused(tmp_path):
    """Both offsets agree on a segment two events longer than $TOT: which events are meant is
    unknown (a wrong $TOT or wrong widths), so nothing is read."""
    cols = [np.arange(12, dtype=np.float32)] * 2
    path = tmp_path / "long.fcs"
    path.write_bytes(build_dataset(cols, datatype="F", tot=10))
    _refuses(path, "is 96 bytes, but $TOT implies 80")


def test_data_overlapping_the_analysis_segment_is_refused(tmp_path):
    cols = [np.arange(20, dtype=np.float32)] * 2
    blob = build_dataset(cols, datatype="F", extra={"$BEGINANALYSIS": "0" * 12, "$ENDANALYSIS": "0" * 12})
    start, stop = _header_offsets(blob)
    blob = re.sub(rb"(\$BEGINANALYSIS.)\d{12}", lambda m: m.group(1) + b"%012d" % (start + 40), blob)
    blob = re.sub(rb"(\$ENDANALYSIS.)\d{12}", lambda m: m.group(1) + b"%012d" % stop, blob)
    path = tmp_path / "analysis.fcs"
    path.write_bytes(blob)
    _refuses(path, "overlaps the ANALYSIS segment")


# -- offsets that disagree for a known reason still read --------------------------------------------


def _values(path):
    return read_fcs(path).events


@pytest.mark.parametrize("header_data", ["zero", "blank"])
def test_blank_or_zero_header_offsets_still_read(tmp_path, header_data):
    """Files past 99,999,999 bytes write 0 (or nothing) in the HEADER: TEXT has the offsets."""
    cols = [np.arange(50, dtype=np.float32), np.arange(50, dtype=np.float32) * 2]
    path = tmp_path / f"{header_data}.fcs"
    path.write_bytes(build_dataset(cols, datatype="F", header_data=header_data))
    np.testing.assert_array_equal(_values(path), np.column_stack(cols))


@pytest.mark.parametrize("shift", [1, -1])
def test_enddata_off_by_one_still_reads(tmp_path, shift):
    cols = [np.arange(50, dtype=np.float32), np.arange(50, dtype=np.float32) + 7]
    path = tmp_path / "offbyone.fcs"
    path.write_bytes(build_dataset(cols, datatype="F", enddata_shift=shift) + b"\0" * max(shift, 0))
    sample = read_fcs(path)
    np.testing.assert_array_equal(sample.events, np.column_stack(cols))
    assert any("expected 400" in note for note in sample.notes)


@pytest.mark.parametrize("version", ["3.1", "2.0"])
def test_header_offsets_off_by_one_still_read_from_the_other_offsets(tmp_path, version):
    """HEADER DATA offsets one byte early (on TEXT's last byte) or one byte long."""
    cols = [np.arange(50, dtype=np.float32), np.arange(50, dtype=np.float32) + 7]
    blob = build_dataset(cols, datatype="F", version=version)
    start, stop = _header_offsets(blob)
    for header in ((start - 1, stop - 1), (start, stop + 1)):
        path = tmp_path / "header.fcs"
        path.write_bytes(_set_header_data(blob, *header) + b"\0")
        np.testing.assert_array_equal(_values(path), np.column_stack(cols))


def test_begindata_in_the_spaces_after_text_reads_from_the_header_offset(tmp_path):
    """FACSDiva pads TEXT with spaces and may give $BEGINDATA two bytes early, in the padding
    (the HEADER offset is right): the spaces are not read as event bytes."""
    cols = [np.array([33471.2, 1.5, 2.5], dtype=np.float32), np.array([10.0, 20.0, 30.0], dtype=np.float32)]
    blob = build_dataset(cols, datatype="F", byteord="4,3,2,1", version="3.0")
    start, stop = _header_offsets(blob)
    padded = blob[:start] + b"    " + blob[start:]  # four spaces between TEXT and DATA
    padded = _set_header_data(padded, start + 4, stop + 4)
    padded = _set_text_data(padded, start + 2, stop + 2)
    path = tmp_path / "diva.fcs"
    path.write_bytes(padded)
    sample = read_fcs(path)
    np.testing.assert_array_equal(sample.events, np.column_stack(cols))
    assert any("in the spaces after TEXT" in note for note in sample.notes)


def test_real_instrument_files_with_disagreeing_offsets_still_read(fcs_corpus):
    """Blank HEADER offsets (fake_large_fcs) and an $ENDDATA one byte long (Miltenyi)."""
    large = read_fcs(fcs_corpus / "fake_large_fcs/fake_large_fcs.fcs")
    assert large.events.shape == (11585, 11)
    miltenyi = read_fcs(fcs_corpus / "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs")
    assert miltenyi.events.shape == (10000, 19)


# -- the commands ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    return quick_model_file(tmp_path_factory.mktemp("damaged"))


def test_info_and_gate_refuse_a_file_cut_inside_data(small_model, tmp_path):
    path = tmp_path / "patient cut.fcs"
    path.write_bytes(_cut_with_header_in_text(NEW_PATIENT.read_bytes(), cut=50, into_text=200))
    info = run_cli("info", path, python_options=WARNINGS_FAIL)
    assert info.returncode == 1, info.stdout
    assert info.stderr.startswith(f"error: {path}: ") and "the file is truncated" in info.stderr
    out = tmp_path / "out"
    for fmt in ("csv", "fcs"):  # streamed and whole-file reads
        gate = run_cli("gate", "--model", small_model, "--out-dir", out, "--format", fmt, path,
                       python_options=WARNINGS_FAIL)
        assert gate.returncode == 1, gate.stdout
        assert gate.stderr.startswith(f"error: {path}: ") and "the file is truncated" in gate.stderr
        assert "Traceback" not in gate.stderr
    assert not out.exists() or list(out.iterdir()) == []


# -- $TIMESTEP that would overflow -----------------------------------------------------------------


def _with_time(tmp_path, timestep: str, name="time.fcs", ranges=None) -> Path:
    sample = read_fcs(NEW_PATIENT)
    ticks = np.arange(sample.n_events, dtype=np.float32)
    path = tmp_path / name
    write_fcs(path, np.column_stack([sample.events, ticks]), sample.pnn + ["Time"], sample.pns + [""],
              {"$TIMESTEP": timestep}, ranges=ranges)
    return path


@pytest.mark.parametrize("timestep", ["1e308", "1e39", "1e36"])
def test_an_overflowing_timestep_is_ignored_with_a_note_and_no_numpy_warning(tmp_path, timestep):
    path = _with_time(tmp_path, timestep)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample = read_fcs(path)
        streamed = stream_fcs_all(path)[0].read()
        info = fcs_info(path)
    time = sample.events[:, sample.channel_index("Time")]
    np.testing.assert_array_equal(time, np.arange(sample.n_events))  # left in clock ticks
    np.testing.assert_array_equal(streamed.events, sample.events)
    for notes in (sample.notes, info["datasets"][0]["notes"]):
        assert any(f"$TIMESTEP = {timestep} would scale the time channel Time" in n and "ignored" in n
                   for n in notes), notes


def test_ticks_beyond_their_range_times_timestep_are_an_error_naming_the_keyword(tmp_path):
    """Floating-point ticks above their $PnR: the overflow shows only in the values."""
    ranges = [262144] * 9 + [1]
    path = _with_time(tmp_path, "1e37", ranges=ranges)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for read in (read_fcs, lambda p: [s.read() for s in stream_fcs_all(p)]):
            with pytest.raises(FCSError, match=r"time.fcs: \$TIMESTEP = 1e\+37 scales the time channel Time"):
                read(path)


def test_a_plausible_timestep_still_scales_the_time_channel(tmp_path):
    path = _with_time(tmp_path, "0.01")
    sample = read_fcs(path)
    np.testing.assert_allclose(sample.events[:, sample.channel_index("Time")],
                               np.arange(sample.n_events, dtype=np.float32) * np.float32(0.01))


def test_info_and_gate_show_no_runtime_warning_for_an_overflowing_timestep(small_model, tmp_path):
    path = _with_time(tmp_path, "1e308")
    info = run_cli("info", path, python_options=WARNINGS_FAIL)
    assert info.returncode == 0, info.stderr
    assert "RuntimeWarning" not in info.stderr and "$TIMESTEP = 1e308" in info.stdout
    gate = run_cli("gate", "--model", small_model, "--out-dir", tmp_path / "out", path, python_options=WARNINGS_FAIL)
    assert gate.returncode == 0, gate.stderr
    assert gate.stderr == ""
    bad = _with_time(tmp_path, "1e37", name="bad_time.fcs", ranges=[262144] * 9 + [1])
    gate = run_cli("gate", "--model", small_model, "--out-dir", tmp_path / "out2", bad, python_options=WARNINGS_FAIL)
    assert gate.returncode == 1
    assert gate.stderr.startswith(f"error: {bad}: $TIMESTEP = 1e+37") and "RuntimeWarning" not in gate.stderr


@pytest.mark.parametrize("value", [1e30, -1e30, 3e38])
def test_an_event_far_beyond_every_population_is_unknown_in_every_format(small_model, tmp_path, value):
    """A value no instrument measures (a broken file's 1e30 on a linear scatter channel) would
    overflow the kernels' squares into NaN: it is a cell beyond every population, confidence 0,
    and every format is written, with no numpy warning."""
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[-1, sample.pnn.index("FSC-A")] = value
    path = tmp_path / "far.fcs"
    write_fcs(path, events, sample.pnn, sample.pns, keywords={k: v for k, v in sample.keywords.items()
                                                              if k.upper().startswith(("$SPILL", "SPILL"))})
    for format in ("csv", "fcs"):
        gate = run_cli("gate", "--model", small_model, "--out-dir", tmp_path / format, "--format", format, path,
                       python_options=WARNINGS_FAIL)
        assert gate.returncode == 0, gate.stderr
    import pandas as pd

    table = pd.read_csv(tmp_path / "csv" / "far.gated.csv")
    assert len(table) == len(events) and table["population"].iloc[-1] == "unknown"
    assert table["confidence"].between(0, 1).all() and table["confidence"].iloc[-1] == 0


def test_a_file_of_no_events_is_said_to_hold_none(small_model, tmp_path):
    sample = read_fcs(NEW_PATIENT, compensate=False)
    write_fcs(tmp_path / "empty.fcs", sample.events[:0], sample.pnn, sample.pns)
    gate = run_cli("gate", "--model", small_model, "--out-dir", tmp_path / "out", tmp_path / "empty.fcs")
    assert gate.returncode == 1 and gate.stderr.strip() == f"error: {tmp_path / 'empty.fcs'}: empty: the sample holds no events"
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_values_compensation_pushes_beyond_float32_are_refused_alike_in_every_format(small_model, tmp_path):
    """Compensation in float64 of 3e38 and -3e38 overflows float32: the streamed formats refuse the
    patient as the whole-file ones do, naming the channel, with no numpy warning."""
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[-1, sample.pnn.index("FL1-A")], events[-1, sample.pnn.index("FL2-A")] = 3e38, -3e38
    path = tmp_path / "over.fcs"
    write_fcs(path, events, sample.pnn, sample.pns,
              keywords={k: v for k, v in sample.keywords.items() if k.upper().startswith(("$SPILL", "SPILL"))})
    assert read_fcs(path).has_spillover
    messages = set()
    for format in ("csv", "fcs"):
        gate = run_cli("gate", "--model", small_model, "--out-dir", tmp_path / format, "--format", format, path,
                       python_options=WARNINGS_FAIL)
        assert gate.returncode == 1 and "Traceback" not in gate.stderr, gate.stderr
        messages.add(gate.stderr.strip())
        assert not (tmp_path / format).exists() or list((tmp_path / format).iterdir()) == []
    [message] = messages
    assert message.startswith(f"error: {path}: over: 1 events hold NaN or infinite values (channels FL")


def test_training_refuses_values_no_instrument_measures(tmp_path):
    """One such value would make its channel's standardisation infinite, and the model written
    would be refused by every later load: training names the patient and the channel instead."""
    source = SAMPLE_DATA / "patient_01.fcs"
    sample = read_fcs(source, compensate=False)
    events = sample.events.copy()
    events[::10, sample.pnn.index("FSC-A")] = 1e30
    write_fcs(tmp_path / "broken.fcs", events, sample.pnn, sample.pns)
    (tmp_path / "broken.labels.csv").write_bytes((SAMPLE_DATA / "patient_01.labels.csv").read_bytes())
    train = run_cli("train", "--no-selection", "--features", "64", "--cells-per-patient", "300", "--out",
                    tmp_path / "m.npz", tmp_path / "broken.fcs", SAMPLE_DATA / "patient_02.fcs",
                    python_options=WARNINGS_FAIL)
    assert train.returncode == 1 and not (tmp_path / "m.npz").exists()
    assert train.stderr.startswith("error: broken: ") and "values beyond 1e+15 (channels FSC-A)" in train.stderr
