"""Exports keep only the keywords needed to read the data (an allow-list), and say how many they
left out.

Keywords no deny-list names -- what a lab or LIMS writes into a file: a person's name, record
and hospital numbers, PINs, study and vial ids, collection dates, clinical fields -- stay home
unless asked for, on every path: ``export_sample`` (FCS, h5ad), ``gate --format fcs``,
``library export``, a FlowJo workspace, the app's FCS download. The events stay exact; channel
names, markers, the cytometer model and the spillover stay in.
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from gating_core.cli import main as cli_main
from gating_core.fcs import read_fcs, read_fcs_all, write_fcs
from gating_core.io.export import (dropped_keyword_count, export_keywords, export_sample, read_fcs_with_populations)
from gating_core.library import PatientLibrary, is_allowed
from helpers import sample_cohort

# Keywords a lab wrote into a file, names no deny-list foresees (the first four as a real
# clinical cohort's files carry them).
PLANTED = {"CD SEROCONVERSION DATAE": "04/30/1999", "CD AGE": "37", "VIAL ID": "V-5519-0193",
           "FINAL PIN": "55190193", "NAME": "Jane Doe", "MEDICAL RECORD NUMBER": "MRN 4471-22",
           "PIN": "8812", "HOSPITAL NUMBER": "H-209310", "STUDY ID": "HIVCOH-0193",
           "COLLECTED": "2024-03-12", "ACQ START": "09:41:07"}
# Values that must not appear anywhere in a default export's bytes (nor the names).
PLANTED_TEXT = ["04/30/1999", "V-5519-0193", "55190193", "Jane Doe", "MRN 4471-22", "H-209310", "HIVCOH-0193",
                "2024-03-12", "09:41:07", "SEROCONVERSION", "MEDICAL RECORD", "HOSPITAL NUMBER", "VIAL ID"]
# The source's own keywords a default export leaves out beside the planted ones.
SOURCE_DROPPED = {"$CYTSN", "$DATE", "$SRC", "$FIL", "$COM", "SIM_CONDITION"}
MEASUREMENT = {"$P1V": "420", "$VOL": "52.5"}
_WRITER_OWNED = re.compile(r"\$?((BEGIN|END)(DATA|ANALYSIS|STEXT)|BYTEORD|DATATYPE|MODE|NEXTDATA|PAR|TOT|P\d+[BENRS])")


def _folded(keywords) -> set[str]:
    return {str(k).lstrip("$").upper() for k in keywords}


def _planted_in(keywords) -> set[str]:
    return _folded(PLANTED) & _folded(keywords)


@pytest.fixture(scope="module")
def planted(tmp_path_factory, sample_data_dir):
    """new_patient_01 (sample data: 9 channels, a spillover matrix) rewritten with the planted
    keywords: (path, source as read)."""
    source = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    keywords = {k: v for k, v in source.keywords.items() if not _WRITER_OWNED.fullmatch(k)}
    assert SOURCE_DROPPED <= set(keywords) and "$SPILLOVER" in keywords
    path = tmp_path_factory.mktemp("planted") / "planted.fcs"
    write_fcs(path, source.events, source.pnn, source.pns, {**keywords, **PLANTED, **MEASUREMENT},
              ranges=[c.range for c in source.channels])
    sample = read_fcs(path)
    assert {k: sample.keywords[k] for k in PLANTED} == PLANTED
    np.testing.assert_array_equal(sample.events, source.events)
    return path, sample


def assert_reads_the_data(keywords, sample, *, spillover=True):
    """What a reader needs stays: channel names and markers (checked with the events), the
    cytometer model, the channels' settings, the volume and -- for raw events -- the spillover."""
    assert keywords["$CYT"] == sample.keywords["$CYT"]
    assert keywords["$P1V"] == "420" and keywords["$VOL"] == "52.5" and keywords["$P3F"] == "FITC"
    assert ("$SPILLOVER" in keywords) == spillover


def assert_nothing_planted(path):
    keywords = read_fcs(path).keywords
    assert not _planted_in(keywords)
    assert not SOURCE_DROPPED & set(keywords)
    assert all(is_allowed(k) for k in keywords), [k for k in keywords if not is_allowed(k)]
    text = path.read_bytes().decode("latin-1")
    assert not [t for t in PLANTED_TEXT if t in text]


# ---------------------------------------------------------------------------- the Python API

def test_fcs_export_keeps_only_what_reads_the_data(planted, tmp_path):
    path, sample = planted
    populations = np.where(sample.events[:, 0] > 90_000, "big", "small")
    out = export_sample(tmp_path / "default.fcs", sample, populations)
    assert_nothing_planted(out)
    back, read_populations = read_fcs_with_populations(out)
    assert back.pnn == sample.pnn and back.pns == sample.pns
    np.testing.assert_array_equal(back.events, sample.events)
    np.testing.assert_array_equal(read_populations, populations)
    np.testing.assert_array_equal(back.spillover, sample.spillover)
    assert_reads_the_data(back.keywords, sample)
    # the file says how many keywords it left out, not which
    assert back.keywords["GATING_DROPPED_KEYWORDS"] == str(len(PLANTED) + len(SOURCE_DROPPED))
    assert "not listed" in back.keywords["GATING_KEYWORD_POLICY"]
    assert dropped_keyword_count(sample) == len(PLANTED) + len(SOURCE_DROPPED)

    full = read_fcs(export_sample(tmp_path / "full.fcs", sample, populations, include_identifying=True))
    assert {k: full.keywords[k] for k in PLANTED} == PLANTED
    assert full.keywords["GATING_DROPPED_KEYWORDS"] == "0"

    one = read_fcs(export_sample(tmp_path / "one.fcs", sample, keep_keywords=["cd age"]))
    assert _planted_in(one.keywords) == {"CD AGE"} and one.keywords["CD AGE"] == "37"
    assert one.keywords["GATING_DROPPED_KEYWORDS"] == str(len(PLANTED) + len(SOURCE_DROPPED) - 1)


def test_keep_keywords_match_case_dollar_and_channel_patterns(planted):
    _, sample = planted
    keywords = export_keywords(sample, keep_keywords=["$date", "Vial Id", "$PnF"])
    assert keywords["$DATE"] == sample.keywords["$DATE"] and keywords["VIAL ID"] == PLANTED["VIAL ID"]
    assert keywords["$P9F"] == "V500"  # kept anyway: on the allow-list
    assert is_allowed("$P12V") and is_allowed("spill") and is_allowed("$unstainedcenters")
    for name in ("$CYTSN", "$SYS", "CREATOR", "$UNSTAINEDINFO", "$P1DATATYPE", "P1DISPLAY", "LOGIN NAME", "PIN",
                 "$PLATEID", "$WELLID", "$LAST_MODIFIED", "$CELLS"):
        assert not is_allowed(name), name
    # a source's $PnDATATYPE (FCS 3.2) never reaches the export: every channel is written in one type
    fcs32 = types.SimpleNamespace(keywords={"$P1DATATYPE": "I", "$P1V": "1"}, channels=sample.channels[:1],
                                  spillover=None, compensated=False)
    assert "$P1DATATYPE" not in export_keywords(fcs32, include_identifying=True)


def test_h5ad_uns_keeps_only_what_reads_the_data(planted, tmp_path):
    anndata = pytest.importorskip("anndata")
    _, sample = planted
    populations = np.where(sample.events[:, 0] > 90_000, "big", "small")
    adata = anndata.read_h5ad(export_sample(tmp_path / "p.h5ad", sample, populations))
    keywords = adata.uns["keywords"]
    assert not _planted_in(keywords) and not SOURCE_DROPPED & set(keywords)
    assert all(is_allowed(k) for k in keywords)
    assert_reads_the_data(keywords, sample)
    assert keywords["$P1N"] == "FSC-A" and keywords["$P3S"] == "CD3"
    assert adata.uns["dropped_keywords"] == len(PLANTED) + len(SOURCE_DROPPED)
    assert "not listed" in adata.uns["keyword_policy"]
    np.testing.assert_array_equal(adata.X, sample.events)

    adata = anndata.read_h5ad(export_sample(tmp_path / "one.h5ad", sample, populations, keep_keywords=["CD AGE"]))
    assert _planted_in(adata.uns["keywords"]) == {"CD AGE"}
    adata = anndata.read_h5ad(export_sample(tmp_path / "all.h5ad", sample, populations, include_identifying=True))
    assert {k: adata.uns["keywords"][k] for k in PLANTED} == PLANTED and adata.uns["dropped_keywords"] == 0


def test_flowjo_workspace_keeps_only_what_reads_the_data(planted, tmp_path):
    pytest.importorskip("flowkit")
    from gating_core.gates import GateTree, rectangle_gate
    from gating_core.gates.export import export_flowjo_workspace

    _, sample = planted
    tree = GateTree([rectangle_gate("Cells", "FSC-A", "SSC-A", (10_000, 200_000), (0, 150_000))])
    text = export_flowjo_workspace(tree, tmp_path / "g.wsp", [sample]).read_text(encoding="utf-8")
    assert not [t for t in PLANTED_TEXT if t in text]
    assert not [k for k in PLANTED if f'name="{k}"' in text]
    assert 'name="$CYT"' in text and 'name="$DATE"' not in text
    text = export_flowjo_workspace(tree, tmp_path / "k.wsp", [sample], keep_keywords=["CD AGE"]).read_text("utf-8")
    assert [k for k in PLANTED if f'name="{k}"' in text] == ["CD AGE"]


def test_app_fcs_download_keeps_only_what_reads_the_data_and_says_so(planted, tmp_path):
    from ui import exports

    _, sample = planted
    populations = np.where(sample.events[:, 0] > 90_000, "big", "small")
    record = types.SimpleNamespace(sample=sample, populations=populations, populations_token="planted-app",
                                   result=None, corrected=None, name=sample.name)
    out = tmp_path / "app.fcs"
    out.write_bytes(exports.gated_fcs("planted-app", record, tmp_path))
    assert_nothing_planted(out)
    note = exports.fcs_keyword_note(record)
    assert f"leaves out {len(PLANTED) + len(SOURCE_DROPPED)} keywords" in note
    assert not [t for t in PLANTED_TEXT if t in note]


def test_gated_csv_and_parquet_carry_no_keywords(planted, tmp_path):
    pytest.importorskip("pyarrow")
    _, sample = planted
    populations = np.where(sample.events[:, 0] > 90_000, "big", "small")
    for suffix in ("csv", "parquet"):
        out = export_sample(tmp_path / f"p.{suffix}", sample, populations, include_identifying=True)
        data = out.read_bytes().decode("latin-1")
        assert not [t for t in PLANTED_TEXT + [sample.keywords["$CYTSN"]] if t in data], suffix
        assert dropped_keyword_count(sample, format=suffix) is None


# ---------------------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from gating_core import GatingModel

    model = GatingModel(select=False, n_features=128, cells_per_patient=500).fit(*sample_cohort(range(1, 5)))
    path = tmp_path_factory.mktemp("keywords-model") / "model.npz"
    model.save(path)
    return path


def test_gate_format_fcs_keeps_only_what_reads_the_data(planted, model_path, tmp_path, capsys):
    path, sample = planted
    compensated = read_fcs(path, compensate=True)

    def gate(folder, *options):
        code = cli_main(["gate", "--model", str(model_path), "--out-dir", str(tmp_path / folder), "--format", "fcs",
                         *options, str(path)])
        assert code == 0
        return tmp_path / folder / "planted.gated.fcs", capsys.readouterr().out

    out, printed = gate("default")
    assert_nothing_planted(out)
    back, populations = read_fcs_with_populations(out)
    assert back.pnn == sample.pnn and back.pns == sample.pns
    np.testing.assert_array_equal(back.events, compensated.events)
    assert len(populations) == sample.n_events
    # gate writes compensated events, so no spillover (a reader would compensate twice)
    assert_reads_the_data(back.keywords, sample, spillover=False)
    dropped = len(PLANTED) + len(SOURCE_DROPPED)
    assert back.keywords["GATING_DROPPED_KEYWORDS"] == str(dropped)
    assert (f"dropped {dropped} keywords not needed to read the data; --include-identifying or "
            f"--keep-keyword NAME to keep them") in printed

    out, printed = gate("full", "--include-identifying")
    assert {k: read_fcs(out).keywords[k] for k in PLANTED} == PLANTED
    assert "dropped" not in printed

    out, printed = gate("one", "--keep-keyword", "CD AGE")
    assert _planted_in(read_fcs(out).keywords) == {"CD AGE"}
    assert f"dropped {dropped - 1} keywords" in printed

    # a gated CSV carries no keywords: asking to keep some is an error, not silently ignored
    assert cli_main(["gate", "--model", str(model_path), "--out-dir", str(tmp_path / "csv"), "--keep-keyword",
                     "CD AGE", str(path)]) == 2
    assert "carries no keywords" in capsys.readouterr().err


def test_library_export_keeps_only_what_reads_the_data(planted, tmp_path, capsys):
    path, sample = planted
    library = PatientLibrary(tmp_path / "lib")
    [name] = library.import_files([path])
    assert {k: library.load_sample(name).keywords[k] for k in PLANTED} == PLANTED  # the library keeps them

    def export(file, *options):
        out = tmp_path / file
        assert cli_main(["library", "--path", str(library.path), "export", name, "--out", str(out), *options]) == 0
        return out, capsys.readouterr().out

    out, printed = export("default.fcs")
    assert_nothing_planted(out)
    back = read_fcs(out)
    assert back.pnn == sample.pnn and back.pns == sample.pns
    # the values the patient is labeled on: compensated, so no spillover for a reader to apply again
    np.testing.assert_array_equal(back.events, sample.compensate().events)
    assert back.spillover is None
    assert_reads_the_data(back.keywords, sample, spillover=False)
    dropped = len(PLANTED) + len(SOURCE_DROPPED)
    assert f"dropped {dropped} keywords not needed to read the data" in printed

    out, printed = export("full.fcs", "--include-identifying")
    assert {k: read_fcs(out).keywords[k] for k in PLANTED} == PLANTED
    assert "dropped" not in printed

    out, printed = export("one.fcs", "--keep-keyword", "CD AGE")
    assert _planted_in(read_fcs(out).keywords) == {"CD AGE"}
    assert f"dropped {dropped - 1} keywords" in printed

    details = [e["details"] for e in library.audit_log(name) if e["action"] == "export"]
    assert [(d["file"], d["dropped_keywords"], d["keep_keywords"]) for d in details] == [
        ("default.fcs", dropped, []), ("full.fcs", 0, []), ("one.fcs", dropped - 1, ["CD AGE"])]


# ---------------------------------------------------------------------------- real files

# Keywords of the real-instrument corpus that identify a person, a place, an instrument or a run
# (a login name, a street address, a serial number, a data folder under a user's name, run and
# file GUIDs, a clock time, a lab's name), none of them named by any deny-list.
REAL_IDENTIFYING = {
    "FACSCaliburHTS/Sample_Well_A02.fcs": {"LOGIN NAME": "Manoshi Datta", "FILE GUID": None, "CYTNUM": None},
    "fake_bitmask_error/fcs1_cleaned.lmd": {"@LOCATION": "Max-Lebsche-Platz 32", "@CYTOMETERID": "AS50332",
                                            "$RUNNUMBER": None, "@FILEGUID": None},
    "GuavaMuse/Guava Muse.fcs": {"GTI$DATASETNAME": "Administrator", "GTI$ACCESSRIGHTS": None,
                                 "GTI$ANALYSISTIME": None, "GTI$RUNGUID": None},
    "FACS_Diva/facs_diva_test.fcs": {"CYTOMETER CONFIG NAME": "St. Anna CCRI"},
    "MiltenyiBiotec/FCS3.1/EY_2013-07-19_PBS_FCS_3.1_Well_A1.001.fcs": {"@MB_SESSIONID": None},
}


@pytest.mark.parametrize("relpath", sorted(REAL_IDENTIFYING))
def test_real_instrument_files_export_without_their_identifying_keywords(fcs_corpus, tmp_path, relpath):
    expected = REAL_IDENTIFYING[relpath]
    for k, source in enumerate(read_fcs_all(fcs_corpus / relpath)):
        assert set(expected) <= set(source.keywords)
        out = export_sample(tmp_path / f"{k}.fcs", source)
        back = read_fcs(out)
        assert not set(expected) & set(back.keywords)
        assert all(is_allowed(key) for key in back.keywords)
        text = out.read_bytes().decode("latin-1")
        assert not [v for v in expected.values() if v and v in text]
        assert back.pnn == source.pnn and back.pns == source.pns
        np.testing.assert_array_equal(back.events, source.events)
        assert int(back.keywords["GATING_DROPPED_KEYWORDS"]) == dropped_keyword_count(source) >= len(expected)
        if source.spillover is not None:
            np.testing.assert_array_equal(back.spillover, source.spillover)
