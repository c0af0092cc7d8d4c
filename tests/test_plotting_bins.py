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


@pytest.mark.parametrize("bins", [200, 37, 1, (37, 5)])  # (x bins, y bins): each axis on its own lattice
def test_density_from_bins_equals_histogram2d(bins):
    rng = np.random.default_rng(np.sum(bins))
    x, y = _awkward_values(rng, 30_000)
    x_range, y_range = plotting.display_range(x), plotting.display_range(y)
    n_x, n_y = plotting.bin_counts(bins)
    edges = np.linspace(*x_range, n_x + 1)
    x[100:100 + n_x + 1] = edges  # every edge exactly, the last one included
    x_bins, y_bins = plotting.bin_indices(x, x_range, n_x), plotting.bin_indices(y, y_range, n_y)
    assert x_bins.dtype == np.int16 and x_bins.min() >= 0 and x_bins.max() == n_x  # NaN / out of range
    got = plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins)
    want = plotting.density_grid(x, y, x_range, y_range, bins)
    assert got[0].shape == (n_y, n_x)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    mask = rng.random(x.size) < 0.3
    np.testing.assert_array_equal(plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins, mask=mask)[0],
                                  plotting.density_grid(x[mask], y[mask], x_range, y_range, bins)[0])
    counts, centers = plotting.histogram_from_bins(x_bins, x_range, n_x)
    want_counts, want_centers = plotting.histogram_1d(x, x_range, n_x)
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


def test_value_lattice_finds_channel_numbers_and_nothing_else():
    rng = np.random.default_rng(5)
    channel_numbers = np.round(rng.normal(450, 120, 50_000)).astype(np.float32)
    assert plotting.value_lattice(channel_numbers) == (1.0, 0.0)
    assert plotting.value_lattice(channel_numbers - 3000) == (1.0, 0.0)  # below zero too
    assert plotting.value_lattice(0.25 + 0.5 * channel_numbers) == (0.5, 0.25)
    with_gaps = np.concatenate([channel_numbers, [np.nan, np.inf, -np.inf]])
    assert plotting.value_lattice(with_gaps) == (1.0, 0.0)  # values that are not finite are not drawn
    assert plotting.value_lattice(rng.normal(0, 1, 50_000).astype(np.float32)) is None
    assert plotting.value_lattice(np.full(100, 7.0)) is None and plotting.value_lattice(np.array([])) is None
    # one value off the lattice, beyond the subsample the step is found on, is still seen
    off = channel_numbers.copy()
    off[-1] = 400.5
    assert 49_999 not in plotting.subsample_indices(off.size, 1_000)
    assert plotting.value_lattice(off, max_values=1_000) is None


def test_lattice_bins_hold_the_same_number_of_channel_numbers():
    rng = np.random.default_rng(6)
    flat = np.repeat(np.arange(0, 1000), 7).astype(np.float32)  # every channel number 0-999, 7 events each
    value_range = plotting.display_range(flat)
    (low, high), count = plotting.lattice_bins(value_range, (1.0, 0.0), 200)
    assert low <= value_range[0] and high >= value_range[1]
    assert low % 1 == 0.5 and high % 1 == 0.5  # every edge halfway between two channel numbers
    assert 100 < count <= 201
    counts, centers = plotting.histogram_1d(flat, (low, high), count)
    inside = counts[(centers > 10) & (centers < 990)]
    assert inside.min() == inside.max() == 7 * round((high - low) / count)  # flat, as the events are
    plain, plain_centers = plotting.histogram_1d(flat, value_range, 200)
    plain = plain[(plain_centers > 10) & (plain_centers < 990)]
    assert plain.max() / plain.min() >= 6 / 5  # equal bins of 5 or 6 channel numbers by turns: a comb
    # a coarse lattice: one value a bin
    (low, high), count = plotting.lattice_bins((-1.0, 101.0), (10.0, 0.0), 200)
    assert (low, high, count) == (-5.0, 105.0, 11)
    # a lattice far finer than the bins, none, or an empty range: the bins as asked
    assert plotting.lattice_bins((0.0, 262_144.0), (1.0, 0.0), 200) == ((0.0, 262_144.0), 200)
    assert plotting.lattice_bins((0.0, 1.0), None, 200) == ((0.0, 1.0), 200)
    assert plotting.lattice_bins((3.0, 3.0), (1.0, 0.0), 200) == ((3.0, 3.0), 200)
    smooth = np.round(rng.normal(500, 100, 400_000))
    (low, high), count = plotting.lattice_bins(plotting.display_range(smooth), plotting.value_lattice(smooth), 200)
    counts, _ = plotting.histogram_1d(smooth, (low, high), count)
    middle = counts[count // 2 - 10:count // 2 + 10].astype(float)
    assert np.abs(middle[1:] / middle[:-1] - 1).max() < 0.1  # neighbouring bins differ by noise only


def test_the_shared_files_lattices(dlbcl_dir, multicenter_dir):
    from gating_core.fcs import read_fcs

    flow = read_fcs(dlbcl_dir / "dlbcl_01.fcs")  # FlowCAP channel numbers, stored as float32
    assert [plotting.value_lattice(flow.events[:, j]) for j in range(flow.events.shape[1])] == [(1.0, 0.0)] * 3
    mass = read_fcs(multicenter_dir / "multicenter_01.fcs")  # mass cytometry intensities
    assert all(plotting.value_lattice(np.arcsinh(mass.events[:, j] / 5)) is None for j in range(mass.events.shape[1]))


def test_density_bins_shrink_for_few_events_only():
    """sqrt(n) bins a side, between 50 and 200: files of 50,000 events and more keep 200."""
    got = {n: plotting.density_bins(n) for n in (0, 1_856, 2_550, 2_551, 3_796, 10_000, 20_000, 39_800, 39_801,
                                                  50_000, 1_000_000)}
    assert got == {0: 50, 1_856: 50, 2_550: 50, 2_551: 51, 3_796: 62, 10_000: 100, 20_000: 141, 39_800: 199,
                   39_801: 200, 50_000: 200, 1_000_000: 200}


def test_fewer_density_bins_still_hold_whole_channel_numbers():
    """A 3,796-event file of channel numbers (0-1023): about 62 bins, each holding the same whole
    number of channel numbers, edges halfway between two."""
    rng = np.random.default_rng(3)
    values = np.clip(np.round(rng.normal(600, 150, 3_796)), 0, 1023).astype(np.float32)
    value_range = plotting.display_range(values)
    bins = plotting.density_bins(values.size)
    (low, high), count = plotting.lattice_bins(value_range, plotting.value_lattice(values), bins)
    assert low <= value_range[0] and high >= value_range[1]
    assert low % 1 == 0.5 and high % 1 == 0.5
    per_bin = (high - low) / count
    assert per_bin == round(per_bin) and abs(count - bins) <= 0.1 * bins
    channel_numbers = np.arange(np.ceil(low), high)
    held, _ = plotting.histogram_1d(channel_numbers, (low, high), count)
    assert held.min() == held.max() == per_bin  # no comb, no stripes


def test_a_pile_at_one_value_does_not_set_the_top_of_the_density_colours():
    from gating_core.reports import plotting

    counts = np.zeros((50, 50), dtype=np.int64)
    counts[20:30, 20:30] = 12  # a population: 1,200 events, 12 a bin
    counts[25, 26] = 40  # its densest bin
    assert plotting.density_top(counts) == 40
    counts[:, 3] = 100  # exact zeros on x: a column holding 5,000 events, next to empty ones
    assert counts.max() == 100 and plotting.density_top(counts) == 40
    counts[47, :] = 60  # and a saturated y detector: a row of 3,000
    assert plotting.density_top(counts) == 40
    # a population as wide as a line of bins but no denser than its neighbours is no pile
    wide = np.zeros((50, 50), dtype=np.int64)
    wide[10:40, 5:8] = 30
    assert plotting.density_top(wide) == 30
    # only piles: the largest bin
    only = np.zeros((10, 10), dtype=np.int64)
    only[:, 0] = 7
    assert plotting.density_top(only) == 7
    assert plotting.density_top(np.zeros((4, 4))) == 0


def test_mass_cytometry_zeros_leave_the_colours_to_the_populations(multicenter_dir):
    """CD4 against CD8 of a multicenter sample: 18% and 28% of the events are exact zeros, piled
    in one column and one row of bins; they held the scale's top (2,432 events a bin) and left
    every population in its lowest colours."""
    from gating_core.fcs import read_fcs
    from gating_core.gates import AxisScale
    from gating_core.reports import plotting

    sample = read_fcs(multicenter_dir / "multicenter_01.fcs")
    channel = {c.pns: c.pnn for c in sample.channels}
    scale = AxisScale("arcsinh", cofactor=5)
    x, y = (scale.forward(sample.events[:, sample.channel_index(channel[m])]) for m in ("CD4", "CD8"))
    counts = plotting.density_grid(x, y, plotting.display_range(x), plotting.display_range(y))[0]
    top = plotting.density_top(counts)
    assert counts.max() > 2000 and 10 <= top < 100
    # a pile of 9.9% (CD14's zeros) against CD3 too: it held the top at 394 events a bin
    x14, y3 = (scale.forward(sample.events[:, sample.channel_index(channel[m])]) for m in ("CD14", "CD3"))
    counts = plotting.density_grid(x14, y3, plotting.display_range(x14), plotting.display_range(y3))[0]
    assert counts.max() > 300 and plotting.density_top(counts) < 100
    x3, y3 = (scale.forward(sample.events[:, sample.channel_index(channel[m])]) for m in ("CD3", "CD45"))
    clean = plotting.density_grid(x3, y3, plotting.display_range(x3), plotting.display_range(y3))[0]
    assert plotting.density_top(clean) == clean.max()  # no pile: the scale as before
