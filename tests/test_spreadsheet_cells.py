"""Text cells of our CSV files are never evaluated by a spreadsheet, and read back exactly."""

import csv
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from gating_core.fcs import Channel, Sample
from gating_core.io.gated_table import read_gated_csv, write_gated_csv
from gating_core.io.spreadsheet_cells import (FORMULA_STARTS, arrow_cell_texts, cell_text, safe_arrow_cells,
                                              safe_cell, safe_frame)

NAMES = ["=1+1", "+CD4", "-ve", "@SUM(A1)", "\t=x", "\r=x", "'=x", "''=x", "'-", "'abc", "'", "CD4+",
         "CD3-CD19+", "ungated", "", "=", "-", "a=b", "=HYPERLINK(\"http://example.org\",\"x\")",
         "=cmd|' /C calc'!A0"]


@pytest.mark.parametrize("name", NAMES)
def test_a_cell_is_never_a_formula_and_reads_back_exactly(name):
    cell = safe_cell(name)
    assert not cell.startswith(tuple(FORMULA_STARTS))
    assert cell_text(cell) == name


def test_only_names_a_spreadsheet_would_evaluate_change():
    assert safe_cell("=1+1") == "'=1+1"
    assert safe_cell("'=1+1") == "''=1+1"
    for name in ("CD4+", "CD3-CD19+", "ungated", "'abc", "a=b", ""):
        assert safe_cell(name) == name
        assert cell_text(name) == name


def test_the_arrow_kernels_agree_with_the_scalar_rule():
    column = pa.array(NAMES, type=pa.string())
    assert safe_arrow_cells(column).to_pylist() == [safe_cell(n) for n in NAMES]
    assert arrow_cell_texts(safe_arrow_cells(column)).to_pylist() == NAMES
    plain = pa.array(["CD4+", "ungated"])
    assert safe_arrow_cells(plain) is plain  # nothing to escape: the column as it was


def test_a_gated_csv_of_hostile_names_opens_as_text_and_reads_back(tmp_path):
    channels = ["FSC-A", "=HYPERLINK(\"http://example.org\",\"x\")", "@CD3"]
    populations = np.array(["=cmd|' /C calc'!A0", "-ve", "CD4+", "'=x", "-ve"])
    events = np.array([[-1.5, 2.0, 3.0], [4.0, -5.25, 6.0], [7.0, 8.0, -9.0], [1.0, 2.0, 3.0],
                       [0.0, 0.0, 0.0]], dtype=np.float32)
    sample = Sample("hostile", events, [Channel(c) for c in channels])
    path = tmp_path / "hostile.gated.csv"
    write_gated_csv(path, sample, populations, np.full(5, 0.5))

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert header == ["FSC-A", "'=HYPERLINK(\"http://example.org\",\"x\")", "'@CD3", "population", "confidence"]
    assert [r[3] for r in body] == ["'=cmd|' /C calc'!A0", "'-ve", "CD4+", "''=x", "'-ve"]
    assert [r[0] for r in body] == ["-1.5", "4", "7", "1", "0"]  # numbers stay numbers

    back, back_populations, confidence = read_gated_csv(path)
    assert back.pnn == channels
    assert back_populations.tolist() == populations.tolist()
    np.testing.assert_array_equal(back.events, events)
    np.testing.assert_array_equal(confidence, np.full(5, 0.5, dtype=np.float32))


def test_a_table_for_a_spreadsheet_escapes_text_only():
    frame = pd.DataFrame({"patient": ["=evil", "p2"], "population": pd.Categorical(["-ve", "B"]),
                          "share": [-0.5, 0.25], "=count": [3, 4]})
    safe = safe_frame(frame)
    assert list(safe.columns) == ["patient", "population", "share", "'=count"]
    assert safe["patient"].tolist() == ["'=evil", "p2"]
    assert list(safe["population"]) == ["'-ve", "B"]
    assert safe["share"].tolist() == [-0.5, 0.25]
    assert frame["patient"].tolist() == ["=evil", "p2"]  # the caller's frame is not changed


def test_a_statistics_table_keeps_the_digits_a_float32_value_holds():
    from gating_core.io.spreadsheet_cells import statistics_table_csv

    median = float(np.float32(139.469))  # 139.468994140625 as a float64
    frame = pd.DataFrame({"population": ["=B", "T"], "count": [289, 1_048_576], "% of total": [100 / 3, 66.5],
                          "median CD3": [median, -0.000123456789], "CV CD3": [np.nan, 1e9 / 7]})
    lines = statistics_table_csv(frame).decode().splitlines()
    assert lines == ["population,count,% of total,median CD3,CV CD3",
                     "'=B,289,33.33333,139.469,",
                     "T,1048576,66.5,-0.0001234568,1.428571e+08"]
    back = pd.read_csv(io.StringIO("\n".join(lines)))
    np.testing.assert_allclose(back["median CD3"], frame["median CD3"], rtol=5e-7)
    assert back["count"].tolist() == [289, 1_048_576]
