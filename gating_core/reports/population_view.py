"""The population view: every event binned on the density grid, each bin coloured by its
majority population and shaded by its count (a picture of millions of events, drawn as one
image).

:func:`population_grid_from_bins` counts each population in each bin from the bins
:func:`~gating_core.reports.plotting.bin_indices` gives; :func:`majority_population` picks each
bin's population; :func:`population_image` paints the RGBA image.
"""

from __future__ import annotations

import numpy as np

from gating_core.reports.plotting import bin_centers, bin_counts

MIN_SHADE = 0.2  # a bin of one event: 20% of its population's colour over white, still visible


def population_grid_from_bins(x_bins: np.ndarray, y_bins: np.ndarray, codes: np.ndarray, n_populations: int,
                              x_range, y_range, bins=200):
    """Events of each population in each bin of the density grid (the bins of
    :func:`~gating_core.reports.plotting.density_from_bins`), from
    :func:`~gating_core.reports.plotting.bin_indices` of both channels: one ``numpy.bincount``
    over (bin x population), so the population view counts every event at the cost of a density.

    Parameters
    ----------
    x_bins, y_bins : ndarray (n,), ``bin_indices`` of the two channels (``bins`` = outside).
    codes : ndarray (n,), int -- each event's population as an index in ``[0, n_populations)``.
    n_populations : int
    bins : int, or (x bins, y bins)

    Returns
    -------
    counts : ndarray (n_populations, y bins, x bins), int64 -- ``counts[p]`` is population
        ``p``'s ``density_grid`` (rows y bins, columns x bins); events outside either range are
        left out.
    x_centers, y_centers : ndarray (x bins,), (y bins,)
    """
    codes = np.asarray(codes)
    if codes.shape != x_bins.shape or x_bins.shape != y_bins.shape:
        raise ValueError(f"population codes {codes.shape} and bin indices {x_bins.shape}, {y_bins.shape} "
                         "must hold one entry per event")
    n_populations = int(n_populations)
    if codes.size and (codes.min() < 0 or codes.max() >= n_populations):
        raise ValueError(f"population codes must lie in [0, {n_populations})")
    n_x, n_y = bin_counts(bins)
    # the last row and column collect the events outside the ranges
    flat = (y_bins.astype(np.int64) * (n_x + 1) + x_bins) * n_populations + codes
    counts = np.bincount(flat, minlength=(n_x + 1) * (n_y + 1) * n_populations).reshape(n_y + 1, n_x + 1,
                                                                                         n_populations)
    return (np.ascontiguousarray(counts[:n_y, :n_x].transpose(2, 0, 1)).astype(np.int64),
            bin_centers(x_range, n_x), bin_centers(y_range, n_y))


def majority_population(counts: np.ndarray):
    """The population holding most events of each bin of :func:`population_grid_from_bins`.

    A tie goes to the population listed first (the lowest index; ``numpy.argmax`` keeps the
    first maximum), so the same counts always give the same picture.

    Returns
    -------
    winner : ndarray (bins, bins), int64 -- population index, -1 for an empty bin
    winner_count : ndarray (bins, bins), int64 -- its events in the bin (0 when empty)
    total : ndarray (bins, bins), int64 -- events of all populations in the bin
    """
    counts = np.asarray(counts)
    total = counts.sum(axis=0)
    winner = counts.argmax(axis=0).astype(np.int64)
    winner_count = np.take_along_axis(counts, winner[None], axis=0)[0].astype(np.int64)
    winner[total == 0] = -1
    return winner, winner_count, total.astype(np.int64)


def _rgb(color: str) -> tuple:
    text = str(color).lstrip("#")
    if len(text) != 6:
        raise ValueError(f"colour {color!r} is not #rrggbb")
    return tuple(int(text[i:i + 2], 16) for i in (0, 2, 4))


def population_image(counts: np.ndarray, colors, top: int | None = None) -> np.ndarray:
    """The population view as an RGBA image: each bin in the colour of its majority population
    (:func:`majority_population`), mixed with white by the bin's event count on a log scale --
    one event ``MIN_SHADE`` of the colour, ``top`` events (default: the fullest bin) all of it --
    so sparse bins are pale and dense bins full colour; empty bins transparent (the white plot
    background shows, with its grid, as in the density view).

    Parameters
    ----------
    counts : ndarray (n_populations, bins, bins), :func:`population_grid_from_bins`'s counts
    colors : n_populations ``#rrggbb`` colours, in the order of ``counts``
    top : events of a full-colour bin (several panels share one, to compare them)

    Returns
    -------
    rgba : ndarray (bins, bins, 4), uint8 -- row 0 is the lowest y bin
    """
    winner, _, total = majority_population(counts)
    palette = np.array([_rgb(c) for c in colors], dtype=np.float64).reshape(-1, 3)
    if palette.shape[0] != counts.shape[0]:
        raise ValueError(f"{palette.shape[0]} colours for {counts.shape[0]} populations")
    top = max(int(total.max()) if top is None else int(top), 10)
    filled = total > 0
    shade = np.zeros(total.shape)
    shade[filled] = MIN_SHADE + (1 - MIN_SHADE) * np.clip(np.log10(total[filled]) / np.log10(top), 0, 1)
    colour = palette[np.maximum(winner, 0)]
    mixed = 255.0 + (colour - 255.0) * shade[..., None]
    rgba = np.zeros(total.shape + (4,), dtype=np.uint8)
    rgba[..., :3] = np.rint(mixed).astype(np.uint8)
    rgba[..., 3] = np.where(filled, 255, 0)
    return rgba
