"""Property-based and targeted tests of FCS reading on files written byte by byte here.

``build_fcs`` below is a small test-side FCS writer that covers what ``flowio.create_fcs``
cannot: integer data of any byte width, any $BYTEORD, double data, blank / zero / wrong HEADER
offsets, off-by-one $ENDDATA, several data sets, log amplification and gains.
"""

from __future__ import annotations

import tracemalloc

import flowio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gating_core.fcs import FCSError, fcs_info, read_fcs, read_fcs_all, write_fcs

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _stored_bytes(values: np.ndarray, datatype: str, width: int, order: list[int]) -> np.ndarray:
    """(n, width) stored bytes; ``order[j]`` = significance (0 = least) of stored byte j."""
    n = values.shape[0]
    if datatype == "F":
        little = values.astype("<f4").view(np.uint8).reshape(n, 4)
    elif datatype == "D":
        little = values.astype("<f8").view(np.uint8).reshape(n, 8)
    else:
        little = values.astype("<u8").view(np.uint8).reshape(n, 8)[:, :width]
    if len(order) != width:
        order = list(range(width)) if order == sorted(order) else list(range(width - 1, -1, -1))
    return little[:, order]


def build_dataset(columns, *, datatype="I", widths=None, byteord="1,2,3,4", version="3.1",
                  pnn=None, pns=None, ranges=None, extra=None, header_data="ok",
                  enddata_shift=0, tot=None, nextdata=0, delimiter="/", text_start=58,
                  datatypes=None, data=None, rename=None) -> bytes:
    """One data set (HEADER + TEXT + DATA) as bytes; offsets relative to its first byte.

    ``datatypes``: per-channel I/F/D (FCS 3.2 $PnDATATYPE, written when it differs from
    ``datatype``); ``data``: DATA bytes to write instead of encoding ``columns`` (packed or
    ASCII layouts); ``rename``: applied to every keyword name as written (e.g. padding).
    """
    d = len(columns)
    n = len(columns[0]) if d else 0
    datatypes = datatypes or [datatype] * d
    widths = widths or [{"F": 4, "D": 8}.get(t, 2) for t in datatypes]
    order = [int(x) - 1 for x in byteord.split(",")]
    if data is None:
        data = b""
        if n:
            data = np.concatenate([_stored_bytes(np.asarray(col), t, w, order)
                                   for col, w, t in zip(columns, widths, datatypes)],
                                  axis=1).tobytes()
    keywords = {"$BYTEORD": byteord, "$DATATYPE": datatype, "$MODE": "L", "$PAR": str(d),
                "$TOT": str(n if tot is None else tot), "$NEXTDATA": f"{nextdata:012d}"}
    for i in range(d):
        keywords[f"$P{i + 1}N"] = pnn[i] if pnn else f"CH{i + 1}"
        if pns and pns[i] is not None:
            keywords[f"$P{i + 1}S"] = pns[i]  # "" is written as an empty value (FCS 2.0 style)
        keywords[f"$P{i + 1}B"] = str(8 * widths[i])
        keywords[f"$P{i + 1}R"] = str(ranges[i] if ranges else 2 ** min(8 * widths[i], 62))
        keywords[f"$P{i + 1}E"] = "0,0"
        if datatypes[i] != datatype:
            keywords[f"$P{i + 1}DATATYPE"] = datatypes[i]
    keywords.update(extra or {})
    keywords["$BEGINDATA"] = "0" * 12
    keywords["$ENDDATA"] = "0" * 12

    def text_bytes():
        parts = [delimiter]
        for key, value in keywords.items():
            esc = str(value).replace(delimiter, delimiter * 2)
            name = rename(key) if rename else key
            parts.append(f"{name}{delimiter}{esc}{delimiter}")
        return "".join(parts).encode("utf-8")

    text = text_bytes()
    data_start = text_start + len(text)
    data_stop = data_start + len(data) - 1 + enddata_shift
    keywords["$BEGINDATA"] = f"{data_start:012d}"
    keywords["$ENDDATA"] = f"{data_stop:012d}"
    text = text_bytes()
    assert text_start + len(text) == data_start
    fields = {"ok": (data_start, data_stop), "zero": (0, 0), "wrong": (data_start + 7, data_stop + 7)}
    header = f"FCS{version}    ".encode() + b"%8d%8d" % (text_start, data_start - 1)
    if header_data == "blank":
        header += b" " * 16
    else:
        header += b"%8d%8d" % fields[header_data]
    header += b"%8d%8d" % (0, 0)
    header = header.ljust(text_start, b" ")
    return header + text + data


def build_fcs(*datasets_kwargs) -> bytes:
    """Several data sets chained with $NEXTDATA (relative offsets)."""
    blobs = [build_dataset(**kw) for kw in datasets_kwargs]
    out = b""
    for i, kw in enumerate(datasets_kwargs):
        if i < len(blobs) - 1:
            blobs[i] = build_dataset(**kw, nextdata=len(blobs[i]))
        out += blobs[i]
    return out


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

BYTEORDS = {1: ["1"], 2: ["1,2", "2,1"], 4: ["1,2,3,4", "4,3,2,1", "3,4,1,2", "2,1,4,3"],
            8: ["1,2,3,4,5,6,7,8", "8,7,6,5,4,3,2,1", "1,2,3,4", "4,3,2,1"]}


@st.composite
def fcs_layouts(draw):
    datatype = draw(st.sampled_from(["I", "F", "D"]))
    d = draw(st.integers(1, 6))
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if datatype == "I":
        uniform = draw(st.booleans())
        choices = [1, 2, 3, 4, 8]
        if uniform:
            widths = [draw(st.sampled_from(choices))] * d
        else:
            widths = [draw(st.sampled_from(choices)) for _ in range(d)]
        # mixed-endian permutations only make sense with one width; keep plain orders otherwise
        if len(set(widths)) == 1 and widths[0] in (2, 4, 8):
            byteord = draw(st.sampled_from(BYTEORDS[widths[0]][:2] if widths[0] != 4 else BYTEORDS[4]))
        else:
            byteord = draw(st.sampled_from(["1,2,3,4", "4,3,2,1"]))
        # values below $PnR (a power of two <= 2^bits) so masking keeps them
        ranges, columns = [], []
        for w in widths:
            bits = draw(st.integers(1, min(8 * w, 53)))
            ranges.append(2 ** bits)
            columns.append(rng.integers(0, 2 ** bits, size=n, dtype=np.uint64))
    else:
        width = 4 if datatype == "F" else 8
        widths = [width] * d
        byteord = draw(st.sampled_from(BYTEORDS[4] if width == 4 else BYTEORDS[8]))
        ranges = [262144] * d
        dtype = np.float32 if datatype == "F" else np.float64
        columns = [(rng.standard_normal(n) * 10 ** rng.uniform(-3, 6, n)).astype(dtype)
                   for _ in range(d)]
    version = draw(st.sampled_from(["2.0", "3.0", "3.1"]))
    delimiter = draw(st.sampled_from(["/", "|", "\\", "*", "\x0c"]))
    return dict(columns=columns, datatype=datatype, widths=widths, byteord=byteord,
                version=version, ranges=ranges, delimiter=delimiter)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------

@SETTINGS
@given(layout=fcs_layouts(), header_data=st.sampled_from(["ok", "zero", "blank"]),
       enddata_shift=st.sampled_from([0, 0, 1]))
def test_random_valid_files_read_back_exactly(tmp_path, layout, header_data, enddata_shift):
    if layout["version"] == "2.0" and header_data != "ok":
        header_data = "ok"  # FCS 2.0 keeps the DATA offsets in the HEADER only
    path = tmp_path / "random.fcs"
    blob = build_fcs(dict(layout, header_data=header_data, enddata_shift=enddata_shift))
    path.write_bytes(blob + b"\0" * enddata_shift)
    sample = read_fcs(path)
    expected = np.column_stack([np.asarray(c, dtype=np.float64) for c in layout["columns"]])
    assert sample.events.shape == expected.shape
    np.testing.assert_array_equal(sample.events.astype(np.float64), expected)
    if layout["datatype"] == "F":
        assert sample.events.dtype == np.float32
    if layout["datatype"] == "D":
        assert sample.events.dtype == np.float64
    assert sample.pnn == [f"CH{i + 1}" for i in range(len(layout["columns"]))]


@SETTINGS
@given(layout=fcs_layouts())
def test_numpy_and_flowio_engines_agree(tmp_path, layout):
    widths = set(layout["widths"])
    supported_by_flowio = (layout["byteord"] in ("1,2,3,4", "4,3,2,1", "1,2", "2,1")
                           and (layout["datatype"] != "I" or widths <= {1, 2, 4})
                           and layout["delimiter"] not in ("\x0c",))
    if not supported_by_flowio:
        return
    path = tmp_path / "agree.fcs"
    path.write_bytes(build_fcs(layout))
    np.testing.assert_array_equal(read_fcs(path).events, read_fcs(path, engine="flowio").events)


@SETTINGS
@given(n=st.integers(1, 300), d=st.integers(1, 8), seed=st.integers(0, 2 ** 32 - 1))
def test_write_fcs_round_trip(tmp_path, n, d, seed):
    rng = np.random.default_rng(seed)
    events = (rng.standard_normal((n, d)) * 1000).astype(np.float32)
    pnn = [f"FL{i}-A" for i in range(d)]
    pns = [f"CD{i}" if i % 2 else "" for i in range(d)]
    path = tmp_path / "w.fcs"
    write_fcs(path, events, pnn, pns, {"$CYT": "test", "MYKEY": "a//b"})
    sample = read_fcs(path)
    np.testing.assert_array_equal(sample.events, events)
    assert sample.pnn == pnn and sample.pns == pns and sample.version == "3.1"
    assert sample.keywords["$CYT"] == "test" and sample.keywords["MYKEY"] == "a//b"
    flow = flowio.FlowData(str(path))
    np.testing.assert_array_equal(flow.as_array(preprocess=False), events.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Damage: only FCSError, never anything else, never NaN
# ---------------------------------------------------------------------------------------------

def _valid_blob(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, 1024, 20, dtype=np.uint64) for _ in range(3)]
    return build_fcs(dict(columns=cols, datatype="I", widths=[2, 2, 2], ranges=[1024] * 3,
                          extra={"$SPILLOVER": "2,CH1,CH2,1,0.1,0.2,1", "$TIMESTEP": "0.5"},
                          pnn=["Time", "CH2", "CH3"]))


def _read_or_fcserror(path):
    try:
        samples = read_fcs_all(path)
    except FCSError as err:
        assert path.name in str(err)
        return None
    for sample in samples:
        assert np.isfinite(sample.events).all()
        assert sample.events.ndim == 2 and sample.events.shape[1] == len(sample.channels)
    try:
        fcs_info(path)
    except FCSError:
        pass
    return samples


@SETTINGS
@given(seed=st.integers(0, 1000), data=st.data())
def test_damaged_header_or_text_only_raises_fcserror(tmp_path, seed, data):
    blob = bytearray(_valid_blob(seed))
    text_end = int(blob[18:26])
    n_changes = data.draw(st.integers(1, 8))
    for _ in range(n_changes):
        position = data.draw(st.integers(0, text_end))
        blob[position] = data.draw(st.sampled_from(
            [ord(c) for c in "0123456789 /$,-.eE|\\"] + [0, 255, data.draw(st.integers(0, 255))]))
    path = tmp_path / "damaged.fcs"
    path.write_bytes(bytes(blob))
    _read_or_fcserror(path)


@SETTINGS
@given(seed=st.integers(0, 1000), cut=st.floats(0, 1, exclude_max=True))
def test_truncated_file_only_raises_fcserror(tmp_path, seed, cut):
    blob = _valid_blob(seed)
    path = tmp_path / "cut.fcs"
    path.write_bytes(blob[: int(cut * len(blob))])
    with pytest.raises(FCSError):
        read_fcs(path)


@SETTINGS
@given(seed=st.integers(0, 1000), data=st.data())
def test_damaged_keyword_values_only_raise_fcserror(tmp_path, seed, data):
    """Replace keyword values with hostile ones (huge, negative, junk), offsets recomputed."""
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, 256, 10, dtype=np.uint64) for _ in range(2)]
    hostile = st.sampled_from(["0", "-1", "1000000000000", "x", " ", "1e9", "99999999999999999999",
                               "3", "8", "24", "4,3,2,1", "1,1", "2,0.5", "A", "Q", "C"])
    extra = {data.draw(st.sampled_from(["$TOT", "$PAR", "$P1B", "$P2B", "$P1R", "$P1E", "$P2G",
                                        "$BYTEORD", "$DATATYPE", "$MODE", "$NEXTDATA",
                                        "$BEGINSTEXT", "$ENDSTEXT", "$TIMESTEP"])): data.draw(hostile)
             for _ in range(data.draw(st.integers(1, 3)))}
    blob = build_fcs(dict(columns=cols, datatype="I", widths=[1, 1], ranges=[256, 256],
                          extra=extra, pnn=["Time", "B"]))
    path = tmp_path / "hostile.fcs"
    path.write_bytes(blob)
    _read_or_fcserror(path)


def test_huge_event_count_fails_fast_without_allocating(tmp_path):
    cols = [np.arange(10, dtype=np.uint64)] * 2
    path = tmp_path / "huge.fcs"
    path.write_bytes(build_fcs(dict(columns=cols, datatype="F", tot=10 ** 12)))
    tracemalloc.start()
    try:
        with pytest.raises(FCSError, match=r"1000000000000 events .* lies whole in the file but is 80 bytes"):
            read_fcs(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_a_count_the_whole_data_segment_cannot_hold_is_not_called_a_truncation(tmp_path):
    """$TOT (or $PAR, $PnB) edited upward leaves the DATA segment whole: the keywords are wrong,
    and copying the file again would not help."""
    cols = [np.arange(10, dtype=np.float32)] * 2
    path = tmp_path / "edited.fcs"
    path.write_bytes(build_fcs(dict(columns=cols, datatype="F", tot=12)))
    with pytest.raises(FCSError) as error:
        read_fcs(path)
    assert "truncated" not in str(error.value)
    assert "lies whole in the file but is 80 bytes, and $TOT with the channels' sizes" in str(error.value)
    cut = tmp_path / "cut.fcs"
    cut.write_bytes(build_fcs(dict(columns=cols, datatype="F"))[:-8])
    with pytest.raises(FCSError, match="the file is truncated"):
        read_fcs(cut)


def test_huge_par_fails_fast(tmp_path):
    cols = [np.arange(10, dtype=np.uint64)]
    path = tmp_path / "par.fcs"
    path.write_bytes(build_fcs(dict(columns=cols, datatype="F", extra={"$PAR": "1000000000"})))
    with pytest.raises(FCSError, match=r"\$PAR says 1000000000 channels"):
        read_fcs(path)


# ---------------------------------------------------------------------------------------------
# Targeted behaviour
# ---------------------------------------------------------------------------------------------

def test_duplicate_pnn_made_unique(tmp_path):
    cols = [np.arange(5, dtype=np.float32) + k for k in range(4)]
    path = tmp_path / "dup.fcs"
    path.write_bytes(build_fcs(dict(columns=cols, datatype="F", pnn=["FSC", "FL1", "FSC", "FSC"],
                                    extra={"$SPILLOVER": "2,FL1,FSC,1,0.5,0,1"})))
    sample = read_fcs(path)
    assert sample.pnn == ["FSC", "FL1", "FSC_2", "FSC_3"]
    assert any("duplicate $PnN" in n for n in sample.notes)
    np.testing.assert_array_equal(sample.events[:, 2], cols[2])
    assert sample.spillover_channels == ["FL1", "FSC"]
    info = fcs_info(path)
    assert [c["pnn"] for c in info["datasets"][0]["channels"]] == ["FSC", "FL1", "FSC_2", "FSC_3"]


def test_log_amplification_gain_and_timestep(tmp_path):
    stored = [np.array([0, 256, 512, 1023], dtype=np.uint64)] * 3
    extra = {"$P1E": "4,1", "$P2E": "0,0", "$P2G": "4", "$TIMESTEP": "0.01", "$P3G": "7"}
    path = tmp_path / "log.fcs"
    path.write_bytes(build_fcs(dict(columns=stored, datatype="I", widths=[2, 2, 2],
                                    ranges=[1024] * 3, extra=extra, pnn=["FL1-H", "FSC", "Time"])))
    sample = read_fcs(path)
    x = stored[0].astype(np.float64)
    np.testing.assert_allclose(sample.events[:, 0], 10 ** (4 * x / 1024), rtol=1e-12)
    np.testing.assert_array_equal(sample.events[:, 1], x / 4)
    np.testing.assert_allclose(sample.events[:, 2], x * 0.01, rtol=1e-12)  # time gain ignored
    np.testing.assert_allclose(read_fcs(path, engine="flowio").events, sample.events, rtol=1e-12)


def test_log_zero_offset_defaults_to_one(tmp_path):
    path = tmp_path / "log0.fcs"
    path.write_bytes(build_fcs(dict(columns=[np.array([0, 512], dtype=np.uint64)], datatype="I",
                                    widths=[2], ranges=[1024], extra={"$P1E": "2,0"})))
    np.testing.assert_allclose(read_fcs(path).events[:, 0], [1.0, 10.0])


def test_integer_bits_above_range_are_masked(tmp_path):
    values = np.array([5, 1023, 1024 + 7, 65535], dtype=np.uint64)
    path = tmp_path / "mask.fcs"
    path.write_bytes(build_fcs(dict(columns=[values], datatype="I", widths=[2], ranges=[1000])))
    np.testing.assert_array_equal(read_fcs(path).events[:, 0], values & 1023)


def test_header_text_disagreement_resolved_by_tot(tmp_path):
    cols = [np.arange(6, dtype=np.float32)] * 2
    path = tmp_path / "wrong.fcs"
    path.write_bytes(build_fcs(dict(columns=cols, datatype="F", header_data="wrong")) + b"\0" * 7)
    sample = read_fcs(path)
    np.testing.assert_array_equal(sample.events[:, 0], cols[0])


def test_several_data_sets_and_picking_one(tmp_path):
    a = [np.arange(3, dtype=np.float32)] * 2
    b = [np.arange(5, dtype=np.uint64)] * 3
    path = tmp_path / "multi.fcs"
    path.write_bytes(build_fcs(dict(columns=a, datatype="F"),
                               dict(columns=b, datatype="I", widths=[1, 2, 4], ranges=[256] * 3)))
    samples = read_fcs_all(path)
    assert [s.name for s in samples] == ["multi#1", "multi#2"]
    assert [s.events.shape for s in samples] == [(3, 2), (5, 3)]
    np.testing.assert_array_equal(read_fcs(path, dataset=1).events, samples[1].events)
    assert fcs_info(path)["n_datasets"] == 2


def test_nan_in_float_data_is_an_error(tmp_path):
    col = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    path = tmp_path / "nan.fcs"
    path.write_bytes(build_fcs(dict(columns=[col, col + 1], datatype="F", pnn=["A", "B"])))
    with pytest.raises(FCSError, match="2 NaN/infinite values"):
        read_fcs(path)


def test_unsupported_layouts_are_clear(tmp_path):
    col = [np.arange(3, dtype=np.uint64)]
    cases = {
        # binary values read as 2-character ASCII fields (ASCII itself is read: test_fcs_formats)
        "ascii.fcs": ({"$DATATYPE": "A", "$P1B": "2"}, "ASCII DATA .* not a number"),
        "hist.fcs": ({"$MODE": "C"}, "histogram"),
        "bits.fcs": ({"$P1B": "65"}, "1 to 64 bits"),
        "type.fcs": ({"$DATATYPE": "X"}, "must be I, F, D or A"),
    }
    for name, (extra, message) in cases.items():
        (tmp_path / name).write_bytes(build_fcs(dict(columns=col, datatype="I", widths=[2],
                                                     ranges=[1024], extra=extra)))
        with pytest.raises(FCSError, match=message):
            read_fcs(tmp_path / name)
    (tmp_path / "v4.fcs").write_bytes(b"FCS4.0" + b" " * 100)
    with pytest.raises(FCSError, match="unsupported FCS version '4.0'"):
        read_fcs(tmp_path / "v4.fcs")
    (tmp_path / "png.fcs").write_bytes(b"\x89PNG\r\n" + b"\0" * 100)
    with pytest.raises(FCSError, match="not an FCS file"):
        read_fcs(tmp_path / "png.fcs")


def test_write_fcs_refuses_unrepresentable_input(tmp_path):
    with pytest.raises(FCSError, match="do not match"):
        write_fcs(tmp_path / "a.fcs", np.zeros((3, 2)), ["A"])
    with pytest.raises(FCSError, match="NaN"):
        write_fcs(tmp_path / "a.fcs", np.array([[np.nan]]), ["A"])
    with pytest.raises(FCSError, match="unique"):
        write_fcs(tmp_path / "a.fcs", np.zeros((1, 2)), ["A", "A"])
    with pytest.raises(FCSError, match="empty value"):
        write_fcs(tmp_path / "a.fcs", np.zeros((1, 1)), ["A"], keywords={"K": ""})
    assert not list(tmp_path.iterdir())  # nothing half-written left behind
