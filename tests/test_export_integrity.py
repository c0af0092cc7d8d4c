"""Exports keep the data and drop the person (data integrity and privacy).

* every export path round-trips: read(export(read(f))) == read(f) on every channel, with a
  $TIMESTEP time channel, $PnG gains and $PnE log channels in the source;
* one keyword policy for the library, the CLI and the app's downloads: only the keywords
  needed to read the data (an allow-list, ``gating_core.library.privacy``) unless asked;
* keyword names and values holding the TEXT delimiter export and read back identically.

Sources are written byte by byte with the test writer of ``test_fcs_properties``.
"""

from __future__ import annotations

import types

import flowio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fcs_properties import build_dataset

from gating_core import fcs as fcs_module
from gating_core.cli import main as cli_main
from gating_core.fcs import writer as fcs_writer
from gating_core.fcs import FCSError, choose_delimiter, read_fcs, write_fcs
from gating_core.io.export import (export_bytes, export_keywords, export_sample, read_fcs_with_populations,
                                   write_fcs_with_populations)
from gating_core.library import PatientLibrary, is_identifying

# What a clinical instrument writes about the person and the run (all must stay home) ...
IDENTIFYING = {"$SRC": "Jane Roe", "$FIL": "roe_jane.fcs", "$DATE": "01-MAR-2024", "$OP": "Dr Who",
               "$INST": "St Elsewhere", "$BTIM": "09:12:00", "$ETIM": "09:14:31", "$CYTSN": "R6603450",
               "$PLATENAME": "ROE plate", "$WELLID": "A01", "SAMPLE ID": "S-0042", "PATIENT ID": "MRN-889977",
               "CASE NUMBER": "C-17", "TUBE NAME": "Roe tube 1", "EXPORT USER NAME": "jdoe"}
# ... what describes the measurement (carried) ...
HARMLESS = {"$CYT": "LSRFortessa", "$P1V": "350"}
# ... and what is harmless but not needed to read the data (left out like any keyword not on
# the allow-list).
NOT_NEEDED = {"CREATOR": "BD FACSDiva Software Version 8.0.1"}
PNN = ["FSC-A", "Time", "FL1-A", "SSC-A"]


def fortessa_like(path, n=300, seed=0, extra=None, delimiter="/", pnn=None):
    """Integer data with what made exports wrong: a Time channel with $TIMESTEP, a $PnG gain
    and a log-amplified channel."""
    rng = np.random.default_rng(seed)
    columns = [rng.integers(0, 2 ** 16, n, dtype=np.uint64), np.sort(rng.integers(0, 2 ** 20, n, dtype=np.uint64)),
               rng.integers(0, 1024, n, dtype=np.uint64), rng.integers(0, 2 ** 16, n, dtype=np.uint64)]
    keywords = {"$TIMESTEP": "0.01", "$P1G": "2.5", "$P3E": "4,1", "$P4G": "1.7", **HARMLESS, **NOT_NEEDED,
                **(extra or {})}
    path.write_bytes(build_dataset(columns, datatype="I", widths=[4, 4, 2, 4], pnn=pnn or PNN,
                                   ranges=[2 ** 16, 2 ** 20, 1024, 2 ** 16], extra=keywords,
                                   delimiter=delimiter))
    return read_fcs(path)


def assert_same_events(back, source):
    assert back.pnn == source.pnn and back.pns == source.pns
    np.testing.assert_array_equal(back.events, source.events)


def assert_flowio_reads(path, source, extra_channels=0):
    flow = flowio.FlowData(str(path))
    values = flow.as_array(preprocess=True)
    np.testing.assert_array_equal(values[:, :values.shape[1] - extra_channels], source.events.astype(np.float64))


def labels_for(n, seed=0):
    return np.random.default_rng(seed).choice(["B cells", "CD4+/CD8-", "ünicode", "other"], n)


# ---------------------------------------------------------------------------- 1. round trips

def test_library_fcs_export_round_trips_time_gain_and_log_channels(tmp_path):
    source_path = tmp_path / "beads.fcs"
    source = fortessa_like(source_path)
    assert source.events[:, 1].max() < 2 ** 20 * 0.01 + 1  # time read in seconds
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([source_path])

    out = tmp_path / "beads_export.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", "beads", "--out", str(out)]) == 0
    back = read_fcs(out)
    assert_same_events(back, source)  # the time channel once scaled, not twice
    assert_flowio_reads(out, source)
    again = tmp_path / "again.fcs"
    export_sample(again, back)
    assert_same_events(read_fcs(again), source)


def test_labeled_exports_round_trip_every_channel(tmp_path):
    source_path = tmp_path / "labeled.fcs"
    source = fortessa_like(source_path, seed=1)
    labels = labels_for(source.n_events)
    (tmp_path / "labeled.labels.csv").write_text("population\n" + "\n".join(labels) + "\n", encoding="utf-8")
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([source_path])

    out = tmp_path / "out.fcs"
    library.export_patient("labeled", out)
    back, populations = read_fcs_with_populations(out)
    assert_same_events(back, source)
    np.testing.assert_array_equal(populations, labels)
    assert_flowio_reads(out, source, extra_channels=1)

    direct = tmp_path / "direct.fcs"
    write_fcs_with_populations(direct, source, labels)
    back, populations = read_fcs_with_populations(direct)
    assert_same_events(back, source)
    np.testing.assert_array_equal(populations, labels)


def test_exported_file_declares_linear_values():
    # the keywords an export carries never ask a reader to transform again
    sample = types.SimpleNamespace(keywords={"$TIMESTEP": "0.01", "$P1G": "2.5", "$P1E": "4,1", "$P1R": "1024",
                                             "$SPILL": "1,FSC-A,1", "$P9V": "1", **HARMLESS, **NOT_NEEDED},
                                   channels=[fcs_module.Channel("FSC-A"), fcs_module.Channel("Time")],
                                   spillover=None, compensated=False)
    keywords = export_keywords(sample)
    policy = keywords.pop("GATING_KEYWORD_POLICY")
    # CREATOR is left out (not needed to read the data) and counted; the layout keywords and
    # $P9V (no such channel) are not the policy's doing
    assert keywords == {"$TIMESTEP": "1", "$CYT": "LSRFortessa", "$P1V": "350", "GATING_DROPPED_KEYWORDS": "1"}
    assert "left out" in policy


# ---------------------------------------------------------------------------- 2. privacy

def _record(sample, populations, token):
    # a labeled patient without an auto-gate result: every cell at confidence 1 (PatientRecord's rule)
    return types.SimpleNamespace(sample=sample, populations=populations, populations_token=token,
                                 result=None, corrected=None, name=sample.name, confidence=np.ones(len(populations)))


def assert_private(path, source, labels=None):
    """Only keywords on the allow-list, the measurement's kept, the events exact."""
    back = read_fcs(path)
    assert not set(IDENTIFYING) & set(back.keywords)
    assert not set(NOT_NEEDED) & set(back.keywords)
    assert not [k for k in back.keywords if is_identifying(k)]
    assert {k: back.keywords.get(k) for k in HARMLESS} == HARMLESS
    if labels is not None:
        back, populations = read_fcs_with_populations(path)
        np.testing.assert_array_equal(populations, labels)
    assert_same_events(back, source)


@pytest.fixture
def private(tmp_path):
    source_path = tmp_path / "private.fcs"
    source = fortessa_like(source_path, extra=IDENTIFYING)
    assert {k: source.keywords[k] for k in IDENTIFYING} == IDENTIFYING
    return source_path, source, labels_for(source.n_events, seed=2)


def test_app_fcs_download_leaves_identifying_keywords_out(tmp_path, private):
    from ui import exports  # the function behind the app's "FCS with population channel" button

    _, source, labels = private
    out = tmp_path / "app.fcs"
    out.write_bytes(exports.gated_fcs("privacy-test", _record(source, labels, "t"), tmp_path))
    assert_private(out, source, labels)


def test_library_and_cli_exports_leave_identifying_keywords_out(tmp_path, private):
    source_path, source, labels = private
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([source_path])
    out = tmp_path / "cli.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", "private", "--out", str(out)]) == 0
    assert_private(out, source)
    library.set_labels("private", labels, "imported labels")
    assert_private(library.export_patient("private", tmp_path / "labeled.fcs"), source, labels)
    # asked for explicitly, they are kept
    full = tmp_path / "full.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", "private", "--out", str(full),
                     "--include-identifying"]) == 0
    assert {k: read_fcs(full).keywords.get(k) for k in IDENTIFYING} == IDENTIFYING


def test_api_exports_follow_the_same_policy(tmp_path, private):
    _, source, labels = private
    write_fcs_with_populations(tmp_path / "wfp.fcs", source, labels)
    assert_private(tmp_path / "wfp.fcs", source, labels)
    assert_private(export_sample(tmp_path / "api.fcs", source), source)
    full = export_sample(tmp_path / "full.fcs", source, labels, include_identifying=True)
    assert {k: read_fcs(full).keywords.get(k) for k in IDENTIFYING} == IDENTIFYING


def test_gated_csv_downloads_and_zip_go_through_the_export_function(tmp_path, monkeypatch):
    from gating_core.io import export
    from ui import exports

    source = fortessa_like(tmp_path / "z.fcs")
    labels = labels_for(source.n_events)
    calls = []
    real = export.export_sample
    monkeypatch.setattr(export, "export_sample", lambda *a, **k: calls.append(k) or real(*a, **k))
    record = _record(source, labels, "zip-test")
    exports.all_as_zip([record], tmp_path)
    exports.gated_fcs("zip-test-fcs", record, tmp_path)
    assert [c["format"] for c in calls] == ["csv", "fcs"]
    assert all(not c.get("include_identifying") for c in calls)


# ---------------------------------------------------------------------------- 3. delimiters

DELIMITER_KEYWORDS = {"INST/FIL": "Lab A", "CD GAG/100": "/leading", "TRAILING": "trailing/",
                      "BOTH": "/both/", "DOUBLED": "a//b", "ONLY": "/", "/KEY/": "v", "PIPE": "a|b*c\\d"}


def test_keywords_holding_the_delimiter_export_and_read_back(tmp_path):
    source_path = tmp_path / "slashes.fcs"
    source = fortessa_like(source_path, extra=DELIMITER_KEYWORDS, delimiter="!", pnn=["FSC/A", "Time", "FL1-A", "SSC-A"])
    for key, value in DELIMITER_KEYWORDS.items():
        assert source.keywords[key] == value
    library = PatientLibrary(tmp_path / "lib")
    library.import_files([source_path])
    out = tmp_path / "slashes_out.fcs"
    keep = [option for key in DELIMITER_KEYWORDS for option in ("--keep-keyword", key)]
    assert cli_main(["library", "--path", str(library.path), "export", "slashes", "--out", str(out), *keep]) == 0
    back = read_fcs(out)
    assert_same_events(back, source)
    flow = flowio.FlowData(str(out))
    for key, value in DELIMITER_KEYWORDS.items():
        assert back.keywords[key] == value
        assert flow.text[key.lower()] == value
    assert flow.pnn_labels == source.pnn


def test_delimiter_choice_avoids_doubling_when_it_can():
    assert choose_delimiter(["$TOT", "12", "K", "a b"]) == ("/", False)
    assert choose_delimiter(["/lead", "x|y", "a*b", "c\\d"]) == ("~", False)
    everything = "".join(fcs_module.TEXT_DELIMITERS)
    # every candidate occurs, '/' only inside a value: the FCS escape with '/'
    assert choose_delimiter(["K", f"x{everything}x"]) == ("/", True)
    # '/' starts a value: the first doubling-safe delimiter that touches no boundary
    assert choose_delimiter(["K", f"x{everything}x", "/v"]) == ("~", True)
    with pytest.raises(FCSError, match="no TEXT delimiter"):
        choose_delimiter(["K", f"x{everything}x", *(f"{d}v" for d in fcs_module.TEXT_DELIMITERS)])


@pytest.mark.parametrize("candidates", [("/", "#"), ("#", "/")])
def test_doubled_delimiter_files_read_back_in_both_readers(tmp_path, monkeypatch, candidates):
    # Only '/' and '#' allowed, both in use: '#' sits inside values only, '/' at a boundary.
    monkeypatch.setattr(fcs_writer, "TEXT_DELIMITERS", candidates)
    monkeypatch.setattr(fcs_writer, "_DOUBLING_SAFE", candidates)
    keywords = {"A": "/lead", "B": "x#y", "C": "x##y", "D#E": "F"}
    assert choose_delimiter([t for kv in keywords.items() for t in kv]) == ("#", True)
    path = tmp_path / "doubled.fcs"
    events = np.arange(12, dtype=np.float32).reshape(6, 2)
    write_fcs(path, events, ["A#1", "B"], ["", "CD#4"], keywords)
    assert path.read_bytes()[58:59] == b"#"
    back = read_fcs(path)
    flow = flowio.FlowData(str(path))
    for key, value in keywords.items():
        assert back.keywords[key] == value
        assert flow.text[key.lower()] == value
    assert back.pnn == flow.pnn_labels == ["A#1", "B"] and back.pns == ["", "CD#4"]
    np.testing.assert_array_equal(back.events, events)
    # a boundary delimiter with no other choice is refused, not written ambiguously
    with pytest.raises(FCSError, match="no TEXT delimiter"):
        write_fcs(tmp_path / "x.fcs", events, ["A", "B"], None, {"A": "/lead", "B": "#x"})


def test_writer_refuses_layout_keywords_and_duplicates(tmp_path):
    events = np.zeros((2, 1), dtype=np.float32)
    for bad in ({"$TOT": "5"}, {"$P1N": "x"}, {"$BEGINDATA": "0"}, {"K": ""}, {"$K": "a", "k": "b"}):
        with pytest.raises(FCSError):
            write_fcs(tmp_path / "x.fcs", events, ["A"], keywords=bad)
    assert not (tmp_path / "x.fcs").exists()


# ---------------------------------------------------------------------------- property

KEY_CHARS = st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="$")
VALUE_CHARS = st.one_of(st.sampled_from(list("/|*\\!~#,")), st.just("/"),
                        st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="$",
                                      blacklist_categories=("Cs", "Cc")))


@st.composite
def exportable_samples(draw):
    """A random valid instrument file: integer, float or double data, a Time channel with
    $TIMESTEP, gains, maybe a log channel, identifying and delimiter-holding keywords."""
    n = draw(st.integers(1, 60))
    d = draw(st.integers(1, 5))
    datatype = draw(st.sampled_from(["I", "F", "D"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    pnn = [f"CH{i + 1}" for i in range(d)] + ["Time"]
    time_at = draw(st.integers(0, d))
    pnn.insert(time_at, pnn.pop())
    columns, ranges, extra = [], [], {}
    for i in range(d + 1):
        if datatype == "I":
            columns.append(rng.integers(0, 2 ** 16, n, dtype=np.uint64))
            ranges.append(2 ** 16)
        else:
            columns.append((rng.standard_normal(n) * 10 ** rng.uniform(-2, 5)).astype(
                np.float32 if datatype == "F" else np.float64))
            ranges.append(262144)
        if draw(st.booleans()):
            extra[f"$P{i + 1}G"] = draw(st.sampled_from(["2", "0.37", "1.7", "4"]))
    if datatype == "I" and draw(st.booleans()):
        extra[f"$P{draw(st.integers(1, d + 1))}E"] = "4,1"
    extra["$TIMESTEP"] = draw(st.sampled_from(["0.01", "1e-05", "0.0001", "1"]))
    keys = draw(st.lists(st.text(KEY_CHARS, min_size=1, max_size=8).map(lambda k: "K" + k.upper().strip()),
                         max_size=4, unique=True))
    for key in keys:
        extra[key] = draw(st.text(VALUE_CHARS, min_size=1, max_size=10))
    if draw(st.booleans()):  # delimiter candidates inside and at the ends of values
        extra["KDELIMITED"] = draw(st.text(st.sampled_from("/~|ab"), min_size=1, max_size=6))
    if draw(st.booleans()):
        extra.update(IDENTIFYING)
    delimiter = draw(st.sampled_from(["\x1b", "\x01"]))  # in no key or value of the source
    labeled = draw(st.booleans())
    return dict(columns=columns, datatype=datatype, pnn=pnn, ranges=ranges, extra=extra,
                widths=[{"I": 2, "F": 4, "D": 8}[datatype]] * (d + 1), delimiter=delimiter), labeled


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=exportable_samples(), include_identifying=st.booleans(), only_two_delimiters=st.booleans())
def test_export_round_trips_random_valid_samples(tmp_path, drawn, include_identifying, only_two_delimiters):
    layout, labeled = drawn
    source_path = tmp_path / "source.fcs"
    source_path.write_bytes(build_dataset(**layout))
    source = read_fcs(source_path)
    populations = labels_for(source.n_events) if labeled else None
    with pytest.MonkeyPatch.context() as patch:
        if only_two_delimiters:  # exercise the doubled-delimiter escape (and its refusal)
            patch.setattr(fcs_writer, "TEXT_DELIMITERS", ("/", "~"))
            patch.setattr(fcs_writer, "_DOUBLING_SAFE", ("/", "~"))
        try:
            out = export_sample(tmp_path / "out.fcs", source, populations, include_identifying=include_identifying)
        except FCSError as exc:
            # the only acceptable refusal: both delimiters start or end some name or value
            assert only_two_delimiters and "no TEXT delimiter" in str(exc)
            return
        download = export_bytes(source, populations, format="fcs", work_dir=tmp_path,
                                include_identifying=include_identifying)
    assert download == out.read_bytes()  # bytes for a download are the same file

    back = read_fcs(out)
    if labeled:
        back, read_populations = read_fcs_with_populations(out)
        np.testing.assert_array_equal(read_populations, populations)
    assert_same_events(back, source)
    assert [c.range for c in back.channels] == [c.range for c in source.channels]
    assert_flowio_reads(out, source, extra_channels=int(labeled))
    carried = {k: v for k, v in source.keywords.items()
               if k.startswith("K") and (include_identifying or not is_identifying(k))}
    for key, value in carried.items():
        assert back.keywords[key] == value
        assert flowio.FlowData(str(out)).text[key.lower()] == value
    kept = set(IDENTIFYING) & set(back.keywords)
    assert kept == (set(IDENTIFYING) & set(source.keywords) if include_identifying else set())
    if not include_identifying:
        assert not [k for k in back.keywords if is_identifying(k)]


# ---------------------------------------------------------------------------- real files

def _corpus_files():
    from test_fcs_corpus import GUAVA, SINGLE

    return sorted(SINGLE) + [GUAVA]


@pytest.mark.parametrize("relpath", _corpus_files())
def test_real_instrument_files_round_trip_through_export(tmp_path, fcs_corpus, relpath):
    """read(export(read(f))) == read(f) for every data set of the real-instrument corpus, with
    every keyword carried (names and values as instruments write them)."""
    for k, source in enumerate(fcs_module.read_fcs_all(fcs_corpus / relpath)):
        for labeled in (False, True):
            populations = labels_for(source.n_events, seed=k) if labeled else None
            out = export_sample(tmp_path / f"{k}_{labeled}.fcs", source, populations, include_identifying=True)
            back = read_fcs(out)
            if labeled:
                back, read_populations = read_fcs_with_populations(out)
                np.testing.assert_array_equal(read_populations, populations)
            assert_same_events(back, source)
            assert_flowio_reads(out, source, extra_channels=int(labeled))
            for key, value in export_keywords(source, include_identifying=True).items():
                assert back.keywords[key] == value, key
            if source.spillover is not None:
                np.testing.assert_array_equal(back.spillover, source.spillover)
                assert back.spillover_channels == source.spillover_channels


def test_library_export_of_the_fortessa_file_keeps_its_time_scale(tmp_path, fcs_corpus):
    source_path = fcs_corpus / "Fortessa/FCS_3.0_Fortessa_PBS_Specimen_001_A1_A01.fcs"
    source = read_fcs(source_path)
    assert float(source.keywords["$TIMESTEP"]) != 1 and "Time" in source.pnn
    library = PatientLibrary(tmp_path / "lib")
    [name] = library.import_files([source_path])
    out = tmp_path / "fortessa.fcs"
    assert cli_main(["library", "--path", str(library.path), "export", name, "--out", str(out)]) == 0
    time = source.pnn.index("Time")
    np.testing.assert_array_equal(read_fcs(out).events[:, time], source.events[:, time])
    assert_same_events(read_fcs(out), source.compensate())  # the values its labels are made on
