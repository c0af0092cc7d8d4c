"""Gated CSV and FCS-with-populations writing, labels CSV reading, labeled inputs."""

from __future__ import annotations

import flowio
import flowkit as fk
import numpy as np
import pytest

from gating_core.fcs import FCSError, Sample, Channel, read_fcs
from gating_core.io.export import (read_fcs_with_populations, read_gated_csv, write_fcs_with_populations,
                                   write_gated_csv)
from gating_core.io.inputs import load_labeled_input
from gating_core.io.labels import LabelError, read_labels_csv

POPULATIONS = np.array(["B cells", "CD4 T cells", 'odd, "quoted"', "CD8+/CD4-", "ünicode", "NA"])


@pytest.fixture
def diva(fcs_corpus):
    return read_fcs(fcs_corpus / "FACS_Diva/facs_diva_test.fcs")


def _labels(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.choice(POPULATIONS, n), rng.random(n)


def test_gated_csv_round_trip_float32_exact(tmp_path, diva):
    pops, conf = _labels(diva.n_events)
    path = tmp_path / "facs_diva_test.gated.csv"
    write_gated_csv(path, diva, pops, conf)
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert header == ",".join(f'"{c}"' for c in diva.pnn + ["population", "confidence"])
    sample, populations, confidence = read_gated_csv(path)
    assert sample.name == "facs_diva_test"
    assert sample.pnn == diva.pnn
    assert sample.events.dtype == np.float32
    np.testing.assert_array_equal(sample.events, diva.events)
    np.testing.assert_array_equal(populations, pops)
    np.testing.assert_array_equal(confidence, conf.astype(np.float32))
    assert len(path.read_text(encoding="utf-8").splitlines()) == diva.n_events + 1


def test_gated_csv_round_trip_float64_exact(tmp_path):
    rng = np.random.default_rng(3)
    events = rng.standard_normal((500, 3)) * 1e4
    sample = Sample("s", events, [Channel("A"), Channel("B"), Channel("C")])
    pops = rng.choice(["x", "y"], 500)
    write_gated_csv(tmp_path / "s.csv", sample, pops)  # no confidence column
    back, populations, confidence = read_gated_csv(tmp_path / "s.csv", dtype=np.float64)
    np.testing.assert_array_equal(back.events, events)
    assert confidence is None
    np.testing.assert_array_equal(populations, pops)


BAD_GATED = {
    "empty.csv": ("", "file is empty"),
    "noheaderpop.csv": ("A,B\n1,2\n", "no 'population' column"),
    "headeronly.csv": ("A,population\n", "no event rows"),
    "nonnumeric.csv": ("A,population\n1,x\nabc,y\n", "not a valid CSV table"),
    "missing.csv": ("A,population\n1,x\n,y\n", "1 empty or NaN cells"),
    "ragged.csv": ("A,population\n1,x\n2\n", "not a valid CSV table"),
    "badconf.csv": ("A,population,confidence\n1,x,1.5\n", "outside \\[0, 1\\]"),
    "nochannels.csv": ("population\nx\n", "no channel columns"),
    "emptypop.csv": ("A,population\n1,\n", "empty population name"),
    "nan.csv": ("A,population\nnan,x\n", "empty or NaN cells"),
    "inf.csv": ("A,population\ninf,x\n", "NaN or infinite"),
}


@pytest.mark.parametrize("name", sorted(BAD_GATED))
def test_bad_gated_csv_gives_label_error(tmp_path, name):
    content, message = BAD_GATED[name]
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LabelError, match=message) as err:
        read_gated_csv(path)
    assert str(err.value).startswith(f"{name}: ")


def test_labels_csv_reading_and_errors(tmp_path):
    path = tmp_path / "p.labels.csv"
    path.write_text("population\nB cells\nCD4 T cells\nNA\n", encoding="utf-8")
    np.testing.assert_array_equal(read_labels_csv(path, 3), ["B cells", "CD4 T cells", "NA"])
    with pytest.raises(LabelError, match="has 3 label rows but the sample has 4 events") as err:
        read_labels_csv(path, 4)
    assert str(err.value).startswith("p.labels.csv: ")
    with pytest.raises(LabelError) as err:
        read_labels_csv(path, 11_908)
    assert str(err.value) == ("p.labels.csv: has 3 label rows but the sample has 11,908 events (one row per event, "
                              "in event order)")
    wrong = tmp_path / "w.labels.csv"
    wrong.write_text("label\nB\n", encoding="utf-8")
    with pytest.raises(LabelError, match="header line 'population'"):
        read_labels_csv(wrong, 1)
    empty = tmp_path / "e.labels.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(LabelError, match="e.labels.csv: file is empty"):
        read_labels_csv(empty, 1)
    with pytest.raises(LabelError, match="file not found"):
        read_labels_csv(tmp_path / "none.labels.csv", 1)
    # a blank line inside the rows (a CSV reader skips it) is named; blank lines at the end are
    # no row at all and read as before
    gap = tmp_path / "g.labels.csv"
    gap.write_text("population\nB cells\n\nT cells\nT cells\n\n\n", encoding="utf-8")
    np.testing.assert_array_equal(read_labels_csv(tmp_path / "p.labels.csv", 3), ["B cells", "CD4 T cells", "NA"])
    with pytest.raises(LabelError) as err:
        read_labels_csv(gap, 4)
    assert str(err.value) == ("g.labels.csv: line 3 is blank: every event needs its population, one row per event "
                              "in event order (3 label rows for 4 events)")
    trailing = tmp_path / "t.labels.csv"
    trailing.write_text("population\nB cells\nT cells\n\n", encoding="utf-8")
    np.testing.assert_array_equal(read_labels_csv(trailing, 2), ["B cells", "T cells"])
    # text that is not UTF-8 (a spreadsheet's Latin-1 CSV) is named with its line
    latin = tmp_path / "l.labels.csv"
    latin.write_bytes("population\nB cells\nCD4+ T cells\nmonocytes \u00e0 part\n".encode("latin-1"))
    with pytest.raises(LabelError) as err:
        read_labels_csv(latin, 3)
    assert str(err.value) == ("l.labels.csv: line 4 is not in UTF-8: save it as UTF-8 text (a spreadsheet's "
                              "'CSV UTF-8' format)")


def test_fcs_with_populations_readable_by_flowio_and_flowkit(tmp_path, diva):
    pops, _ = _labels(diva.n_events, seed=1)
    path = tmp_path / "gated.fcs"
    write_fcs_with_populations(path, diva, pops)
    names = np.unique(pops)
    codes = np.searchsorted(names, pops)

    flow = flowio.FlowData(str(path))
    assert flow.pnn_labels == diva.pnn + ["population"]
    raw = flow.as_array(preprocess=False)
    np.testing.assert_array_equal(raw[:, -1], codes)
    np.testing.assert_array_equal(raw[:, :-1], diva.events.astype(np.float64))
    assert flow.text["gating_population_count"] == str(len(names))
    assert flow.text["gating_population_2"] == "CD8+%2FCD4-"  # '/' percent-encoded

    flowkit_sample = fk.Sample(str(path))
    assert flowkit_sample.pnn_labels[-1] == "population"
    np.testing.assert_array_equal(flowkit_sample.get_events(source="raw")[:, -1], codes)

    rest, populations = read_fcs_with_populations(path)
    np.testing.assert_array_equal(populations, pops)
    np.testing.assert_array_equal(rest.events, diva.events)
    assert rest.pnn == diva.pnn and rest.pns == diva.pns
    assert rest.has_spillover  # spillover carried (events were not compensated)
    np.testing.assert_allclose(rest.spillover, diva.spillover)


def test_populations_from_fcs_without_keywords_is_an_error(fcs_corpus):
    with pytest.raises(FCSError, match="no population channel"):
        read_fcs_with_populations(fcs_corpus / "FACS_Diva/facs_diva_test.fcs")


def test_load_labeled_input_variants(tmp_path, diva):
    pops, conf = _labels(diva.n_events, seed=2)
    fcs = tmp_path / "patient.fcs"
    write_fcs_with_populations(tmp_path / "with_pops.fcs", diva, pops)
    from gating_core.fcs import write_fcs
    write_fcs(fcs, diva.events, diva.pnn)
    # FCS without labels file -> LabelError saying so
    with pytest.raises(LabelError, match="labels file is missing: patient.fcs needs patient.labels.csv"):
        load_labeled_input(fcs)
    import csv
    with open(tmp_path / "patient.labels.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["population"])
        writer.writerows([p] for p in pops)
    sample, labels = load_labeled_input(fcs)
    np.testing.assert_array_equal(labels, pops)
    np.testing.assert_array_equal(sample.events, diva.events)
    # gated CSV
    write_gated_csv(tmp_path / "patient.gated.csv", diva, pops, conf)
    sample, labels = load_labeled_input(tmp_path / "patient.gated.csv")
    assert sample.name == "patient"
    np.testing.assert_array_equal(labels, pops)
    # FCS carrying a population channel
    sample, labels = load_labeled_input(tmp_path / "with_pops.fcs", compensate=False)
    np.testing.assert_array_equal(labels, pops)
    assert "population" not in sample.pnn
    # FCS errors stay FCSError
    (tmp_path / "broken.fcs").write_bytes(b"garbage")
    with pytest.raises(FCSError, match="broken.fcs"):
        load_labeled_input(tmp_path / "broken.fcs")


def test_multicenter_labels(multicenter_dir):
    sample, labels = load_labeled_input(multicenter_dir / "multicenter_01.fcs")
    assert sample.events.shape == (55621, 8)
    values, counts = np.unique(labels, return_counts=True)
    assert dict(zip(values, counts)) == {"ungated": 9828, "B cells": 2503, "CD4 T cells": 10329,
                                         "CD8 T cells": 6305, "Monocytes": 26656}


def test_writers_validate_lengths(tmp_path, diva):
    with pytest.raises(ValueError, match="populations for 83411 events"):
        write_gated_csv(tmp_path / "x.csv", diva, np.array(["a"] * 5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        write_gated_csv(tmp_path / "x.csv", diva, np.array(["a"] * diva.n_events),
                        np.full(diva.n_events, 2.0))
    assert not (tmp_path / "x.csv").exists()


def test_labels_of_a_file_of_several_data_sets_are_said_to_be_the_first_ones(tmp_path, caplog):
    import logging

    from test_fcs_properties import build_fcs

    first = [np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32) * 2]
    second = [np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32)]
    (tmp_path / "runs.fcs").write_bytes(build_fcs(dict(columns=first, datatype="F"), dict(columns=second, datatype="F")))
    (tmp_path / "runs.labels.csv").write_text("population\na\nb\na\nb\n")
    with caplog.at_level(logging.WARNING, logger="gating_core"):
        sample, labels = load_labeled_input(tmp_path / "runs.fcs")
    assert sample.n_events == 4 and list(labels) == ["a", "b", "a", "b"]
    assert [r.getMessage() for r in caplog.records] == [
        "runs.fcs: the file holds 2 data sets; its labels are taken as the first one's (runs#1) and the other 1 "
        "are left out of training"]
