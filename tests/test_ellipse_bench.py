"""The ellipse bench (bench/bench_ellipse.py) on the smallest cell of the JMLR table, so that the
bench cannot rot: N = 16 training tasks of n = 8 points, 10 test tasks, error on fresh points.

Measured (docs/ellipse.md): marginal transfer 21.57% at seed 2021 (21.5-25.7% over seeds 2021,
0, 1, 2, 3), pooling 30.05% at seed 2021 (26.1-34.4%).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_ellipse  # noqa: E402


@pytest.fixture(scope="module")
def smallest_cell():
    return {use_embedding: bench_ellipse.cell_error(16, 8, 2021, use_embedding) for use_embedding in (True, False)}


def test_smallest_cell_marginal_transfer_error_below_threshold(smallest_cell):
    marginal = smallest_cell[True]
    assert marginal.error < 0.30
    assert marginal.params["use_embedding"] is True
    assert marginal.params["bandwidth_p"] is not None


def test_smallest_cell_marginal_transfer_beats_pooling(smallest_cell):
    assert smallest_cell[False].params["use_embedding"] is False
    assert smallest_cell[True].error < smallest_cell[False].error - 0.03


def test_error_is_measured_on_fresh_points_of_every_test_task(smallest_cell):
    errors = np.asarray(smallest_cell[True].task_errors)
    assert errors.shape == (bench_ellipse.TEST_TASKS,)
    # Each test task's error is a count out of FRESH_POINTS (1,000) points, not out of n + 1,000.
    counts = errors * bench_ellipse.FRESH_POINTS
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-9)
    assert smallest_cell[True].error == pytest.approx(errors.mean())


def test_grid_prints_ours_beside_the_paper(capsys):
    table = bench_ellipse.print_grid((16,), (8,), (2021,), fresh_points=200)
    out = capsys.readouterr().out
    assert (16, 8) in table and len(table[(16, 8)]["marginal"]) == 1
    line = next(row for row in out.splitlines() if row.split()[:2] == ["16", "8"])
    assert line.rstrip().endswith(" s")
    assert bench_ellipse.PAPER[(256, 256)] == 0.0127 and bench_ellipse.PAPER[(64, 256)] == 0.0722
