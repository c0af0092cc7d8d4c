"""Density and histograms from cached per-channel bin indices count exactly what numpy's
histogram2d / histogram count, on the values that sit on bin edges, outside the range or are
not finite; with and without a mask of events."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.reports import plotting


def _awkward_values(rng, n):
    """float32 display values with NaN, +-inf, values outside the range and on every edge."""
    x = rng.normal(0.0, 3.0, n).astype(np.float32)
    y = rng.lognormal(0.0, 1.0, n).astype(np.float32)
    x[:20], y[20:30], x[30:40] = np.nan, np.inf, -np.inf
    return x, y


@pytest.mark.parametrize("bins", [200, 37, 1])
def test_density_from_bins_equals_histogram2d(bins):
    rng = np.random.default_rng(bins)
    x, y = _awkward_values(rng, 30_000)
    x_range, y_range = plotting.display_range(x), plotting.display_range(y)
    edges = np.linspace(*x_range, bins + 1)
    x[100:100 + bins + 1] = edges  # every edge exactly, the last one included
    x_bins, y_bins = plotting.bin_indices(x, x_range, bins), plotting.bin_indices(y, y_range, bins)
    assert x_bins.dtype == np.int16 and x_bins.min() >= 0 and x_bins.max() == bins  # NaN / out of range
    got = plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins)
    want = plotting.density_grid(x, y, x_range, y_range, bins)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    mask = rng.random(x.size) < 0.3
    np.testing.assert_array_equal(plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins, mask=mask)[0],
                                  plotting.density_grid(x[mask], y[mask], x_range, y_range, bins)[0])
    counts, centers = plotting.histogram_from_bins(x_bins, x_range, bins)
    want_counts, want_centers = plotting.histogram_1d(x, x_range, bins)
    np.testing.assert_array_equal(counts, want_counts)
    np.testing.assert_array_equal(centers, want_centers)


def test_bin_indices_put_edges_where_numpy_does():
    # on the edges of (-1.7, 2.3) in 200 bins, plain (v - lo) * bins / width puts 15 of them in
    # the bin below: each edge must open its own bin, as in numpy
    edges = np.linspace(-1.7, 2.3, 201)
    values = np.concatenate([edges, [2.3000001, -1.7000001, np.nan]])
    index = plotting.bin_indices(values, (-1.7, 2.3), 200)
    assert index[:200].tolist() == list(range(200))
    assert index[200] == 199  # the top edge belongs to the last bin
    assert index[201:].tolist() == [200, 200, 200]  # above, below, NaN: outside


def test_subsample_is_drawn_once_and_callers_get_their_own_copy():
    a = plotting.subsample_indices(1_000_000, 500_000)
    a[:] = 0
    b = plotting.subsample_indices(1_000_000, 500_000)
    assert b[0] != b[-1] and np.all(np.diff(b) > 0)
