"""The population view's grid: every event binned on the density view's grid, each bin given to
the population holding most of its events (ties to the population listed first), coloured by
it and shaded by the bin's event count; and its cache, which must follow the populations when
they change (gates edited, labels replaced) rather than show the old colours."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.reports import plotting, population_view


def _bins(x, y, x_range, y_range, bins):
    n_x, n_y = plotting.bin_counts(bins)
    return plotting.bin_indices(x, x_range, n_x), plotting.bin_indices(y, y_range, n_y)


def test_hand_made_grid_winners_ties_and_empty_bins():
    # 3 x 3 bins over [0, 3) x [0, 3): bin (row y, column x)
    #   (0, 0): A A B        -> A, 2 of 3
    #   (0, 1): A B          -> tie, A (listed first)
    #   (1, 2): C C B B B    -> B, 3 of 5
    #   (2, 2): C            -> C, 1 of 1
    #   one event outside the x range and one NaN: counted nowhere
    events = [(0.5, 0.5, "A"), (0.2, 0.9, "A"), (0.7, 0.1, "B"),
              (1.5, 0.5, "B"), (1.5, 0.5, "A"),
              (2.5, 1.5, "C"), (2.1, 1.2, "C"), (2.9, 1.9, "B"), (2.5, 1.5, "B"), (2.2, 1.1, "B"),
              (2.5, 2.5, "C"), (7.0, 0.5, "A"), (np.nan, 0.5, "C")]
    x = np.array([e[0] for e in events])
    y = np.array([e[1] for e in events])
    names = ["A", "B", "C"]
    codes = np.array([names.index(e[2]) for e in events])
    x_bins, y_bins = _bins(x, y, (0, 3), (0, 3), 3)
    counts, xc, yc = population_view.population_grid_from_bins(x_bins, y_bins, codes, 3, (0, 3), (0, 3), bins=3)
    assert counts.shape == (3, 3, 3) and counts.dtype == np.int64
    np.testing.assert_array_equal(xc, [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(yc, [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(counts[0], [[2, 1, 0], [0, 0, 0], [0, 0, 0]])  # A
    np.testing.assert_array_equal(counts[1], [[1, 1, 0], [0, 0, 3], [0, 0, 0]])  # B
    np.testing.assert_array_equal(counts[2], [[0, 0, 0], [0, 0, 2], [0, 0, 1]])  # C
    winner, winner_count, total = population_view.majority_population(counts)
    np.testing.assert_array_equal(winner, [[0, 0, -1], [-1, -1, 1], [-1, -1, 2]])
    np.testing.assert_array_equal(winner_count, [[2, 1, 0], [0, 0, 3], [0, 0, 1]])
    np.testing.assert_array_equal(total, [[3, 2, 0], [0, 0, 5], [0, 0, 1]])
    # the tie goes to whichever population is listed first: listed B first, B wins it
    swapped = population_view.majority_population(counts[[1, 0, 2]])[0]
    assert swapped[0, 1] == 0 and swapped[0, 0] == 1  # B (now 0) wins the tie, A (now 1) still wins (0, 0)


def test_population_image_colours_shades_and_leaves_empty_bins_clear():
    counts = np.zeros((2, 2, 3), dtype=np.int64)
    counts[0, 0, 0] = 1000  # A, the fullest bin: its full colour
    counts[1, 0, 1] = 1     # B, one event: MIN_SHADE of its colour over white
    counts[0, 1, 2], counts[1, 1, 2] = 5, 5  # tie: A; 10 events, a third of the way up log10(1000)
    rgba = population_view.population_image(counts, ["#0072B2", "#D55E00"])
    assert rgba.shape == (2, 3, 4) and rgba.dtype == np.uint8
    np.testing.assert_array_equal(rgba[0, 0], [0x00, 0x72, 0xB2, 255])
    shade = population_view.MIN_SHADE
    np.testing.assert_array_equal(rgba[0, 1], [247, 223, 204, 255])  # 255 + (#D55E00 - 255) * 0.2, rounded
    assert shade == 0.2
    third = shade + (1 - shade) / 3
    np.testing.assert_array_equal(rgba[1, 2, :3], np.rint(255 + (np.array([0x00, 0x72, 0xB2]) - 255) * third))
    for empty in (rgba[0, 2], rgba[1, 0], rgba[1, 1]):
        assert empty[3] == 0
    # a shared top (another panel's fullest bin) pales this panel's bins
    shared = population_view.population_image(counts, ["#0072B2", "#D55E00"], top=10 ** 6)
    assert shared[0, 0, 0] > rgba[0, 0, 0] and shared[0, 0, 3] == 255
    with pytest.raises(ValueError, match="1 colours for 2 populations"):
        population_view.population_image(counts, ["#0072B2"])


@pytest.mark.parametrize("bins", [200, 17, (23, 11)])  # (x bins, y bins): each axis on its own lattice
def test_counts_per_population_equal_histogram2d(bins):
    rng = np.random.default_rng(bins)
    n = 50_000
    x = rng.normal(0, 2, n).astype(np.float32)
    y = rng.lognormal(0, 1, n).astype(np.float32)
    x[:10], y[10:20] = np.nan, np.inf
    codes = rng.integers(0, 5, n).astype(np.int16)
    x_range, y_range = plotting.display_range(x), plotting.display_range(y)
    n_x, n_y = plotting.bin_counts(bins)
    x[100:100 + n_x + 1] = np.linspace(*x_range, n_x + 1)  # every bin edge, the last one included
    x_bins, y_bins = _bins(x, y, x_range, y_range, bins)
    counts, xc, yc = population_view.population_grid_from_bins(x_bins, y_bins, codes, 5, x_range, y_range, bins=bins)
    assert counts.shape == (5, n_y, n_x) and xc.shape == (n_x,) and yc.shape == (n_y,)
    for p in range(5):
        want, want_xc, want_yc = plotting.density_grid(x[codes == p], y[codes == p], x_range, y_range, bins)
        np.testing.assert_array_equal(counts[p], want)
    np.testing.assert_array_equal(xc, want_xc)
    np.testing.assert_array_equal(yc, want_yc)
    np.testing.assert_array_equal(counts.sum(axis=0),
                                  plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins)[0])


def test_grid_rejects_codes_that_do_not_fit():
    bins = np.zeros(4, dtype=np.int16)
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
        population_view.population_grid_from_bins(bins, bins, np.array([0, 1, 2, 0]), 2, (0, 1), (0, 1), bins=3)
    with pytest.raises(ValueError, match="one entry per event"):
        population_view.population_grid_from_bins(bins, bins, np.array([0, 1]), 2, (0, 1), (0, 1), bins=3)


def test_cached_grid_follows_the_populations_when_they_change():
    from gating_core.synthetic.patients import simulate_patient
    from ui import cache
    from ui.patient_record import PatientRecord

    sample, labels = simulate_patient(3, n_events=5_000, name="cached")
    record = PatientRecord("cached", sample, labels=np.asarray(labels).astype(object))
    scale = {"kind": "linear"}
    x_range = cache.shared_range((record.token,), "FSC-A", scale, [sample])
    y_range = cache.shared_range((record.token,), "SSC-A", scale, [sample])
    names = tuple(sorted(set(np.asarray(labels).astype(str))) + ["relabelled"])

    def grid(populations=None):
        return cache.population_grid(record.token, record.populations_token, names, "FSC-A", "SSC-A", scale, scale,
                                     x_range, y_range, 50, record.sample,
                                     record.populations if populations is None else populations)

    def expected(populations):
        x, y = (sample.events[:, sample.channel_index(c)] for c in ("FSC-A", "SSC-A"))
        pops = np.asarray(populations).astype(str)
        return np.stack([plotting.density_grid(x[pops == n], y[pops == n], x_range, y_range, 50)[0] for n in names])

    first = grid()
    np.testing.assert_array_equal(first[0], expected(labels))
    changed = np.asarray(labels).astype(object).copy()
    changed[: 2_000] = "relabelled"
    # the key alone decides: other labels under the same populations version get the cached grid,
    # which is why every change of populations must give a new version
    np.testing.assert_array_equal(grid(changed)[0], first[0])
    record.set_labels(changed, "gates drawn")  # as a gate edit does
    second = grid()
    np.testing.assert_array_equal(second[0], expected(changed))
    assert second[0][names.index("relabelled")].sum() > 0 and not np.array_equal(second[0], first[0])
    record.set_corrected(np.full(sample.n_events, names[0], dtype=object), np.ones(sample.n_events))  # a correction
    third = grid()[0]
    assert third[0].sum() == third.sum() and third[1:].sum() == 0
