"""Cached computations behind the pages.

Events are never hashed (a million-event array would cost more to hash than to bin): every
function takes the sample as an ``_underscore`` argument, which Streamlit does not hash, and a
``token`` that changes whenever the events change (see ``PatientRecord.token``).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core.gates import AxisScale
from gating_core.reports import plotting, population_view

MAX_DOTS = 20_000


@st.cache_data(max_entries=256, show_spinner=False)
def display_values(token: str, channel: str, scale: dict, _sample) -> np.ndarray:
    """One channel of all events in display coordinates (float32 to halve the cache)."""
    index = _sample.channel_index(channel)
    return AxisScale.from_dict(scale).forward(_sample.events[:, index]).astype(np.float32)


@st.cache_data(max_entries=128, show_spinner=False)
def shared_range(tokens: tuple, channel: str, scale: dict, _samples) -> tuple:
    values = [display_values(t, channel, scale, s) for t, s in zip(tokens, _samples)]
    return plotting.display_range(values)


@st.cache_data(max_entries=128, show_spinner=False)
def lattice(tokens: tuple, channel: str, scale: dict, _samples):
    """The evenly spaced values all these patients' events of one channel sit on in display
    coordinates (:func:`gating_core.reports.plotting.value_lattice`), or None when they do not
    share one."""
    found = {plotting.value_lattice(display_values(t, channel, scale, s)) for t, s in zip(tokens, _samples)}
    return found.pop() if len(found) == 1 else None


@st.cache_data(max_entries=128, show_spinner=False)
def channel_numbers_reason(token: str, channel: str, _sample) -> str | None:
    """Why one patient's channel holds channel numbers of log-amplified data (already on a channel
    scale: :func:`gating_core.fcs.transforms.channel_scale_reason`), or None when it does not."""
    from gating_core.fcs.transforms import channel_scale_reason

    j = _sample.channel_index(channel)
    return channel_scale_reason(_sample.events[:, j], _sample.channels[j].range)


@st.cache_data(max_entries=128, show_spinner=False)  # 2 MB each at a million events
def bin_indices(token: str, channel: str, scale: dict, value_range: tuple, bins: int, _sample) -> np.ndarray:
    """The density / histogram bin of every event of one channel on one axis (int16): binning
    a pair of channels is then one ``bincount``, whichever channel it is paired with."""
    return plotting.bin_indices(display_values(token, channel, scale, _sample), value_range, bins)


@st.cache_data(max_entries=256, show_spinner=False)
def density(token: str, mask_key: str, x_channel: str, y_channel: str, x_scale: dict, y_scale: dict,
            x_range: tuple, y_range: tuple, bins: int, _sample, _mask=None):
    """Counts of all events (or the ``_mask`` events, named by ``mask_key``) on a grid of
    ``bins`` (one count, or (x bins, y bins)): :func:`gating_core.reports.plotting.density_grid`'s
    result, from cached bin indices."""
    n_x, n_y = plotting.bin_counts(bins)
    x_bins = bin_indices(token, x_channel, x_scale, tuple(x_range), n_x, _sample)
    y_bins = bin_indices(token, y_channel, y_scale, tuple(y_range), n_y, _sample)
    return plotting.density_from_bins(x_bins, y_bins, x_range, y_range, bins=bins, mask=_mask)


@st.cache_data(max_entries=256, show_spinner=False)
def histogram(token: str, channel: str, scale: dict, value_range: tuple, bins: int, _sample):
    """:func:`gating_core.reports.plotting.histogram_1d` of all events of one channel, from cached bins."""
    return plotting.histogram_from_bins(bin_indices(token, channel, scale, tuple(value_range), bins, _sample),
                                        value_range, bins=bins)


@st.cache_data(max_entries=64, show_spinner=False)
def dots(token: str, n_events: int, max_points: int = MAX_DOTS) -> np.ndarray:
    return plotting.subsample_indices(n_events, max_points, seed=0)


@st.cache_data(max_entries=64, show_spinner=False)
def memberships(token: str, tree_json: str, _sample) -> dict:
    from gating_core.gates import GateTree

    return GateTree.from_json(tree_json).memberships(_sample)


@st.cache_data(max_entries=32, show_spinner=False)
def labels_are_gates(token: str, tree_json: str, labels_token: str, _tree, _sample, _masks, _labels) -> bool:
    """Whether the patient's labels ``_labels`` are exactly the populations its gate tree gives
    (``tree.labels``). Asked on every rerun of the Gate page, it compares two million-string
    arrays (~1 s at a million events): kept per (events, tree, labels)."""
    if _labels is None:
        return False
    gated = _tree.labels(_sample, _masks)
    return bool(np.array_equal(np.asarray(_labels).astype(str), gated.astype(str)))


@st.cache_data(max_entries=32, show_spinner=False)
def population_counts(labels_token: str, _labels) -> dict:
    """Events per population name, most first (ties by name). Counted by hashing (pandas),
    not by sorting a million strings as ``numpy.unique`` would (0.6 s -> 0.1 s at a million)."""
    import pandas as pd

    counted = pd.Series(np.asarray(_labels, dtype=object)).value_counts(dropna=False, sort=False)
    totals: dict[str, int] = {}
    for name, count in counted.items():
        key = str(name)  # as astype(str) names them: None -> "None"
        totals[key] = totals.get(key, 0) + int(count)
    return dict(sorted(totals.items(), key=lambda item: (-item[1], item[0])))


@st.cache_data(max_entries=32, show_spinner=False)
def population_codes(populations_token: str, names: tuple, _populations) -> np.ndarray:
    """Each event's population as its index in ``names`` (int16), named as
    :func:`population_counts` names them (``str`` of the label). Kept per populations version
    (``PatientRecord.populations_token``, new whenever labels, the auto-gate result or its
    corrections change) and list of names; factorised by hashing (pandas), not by sorting."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(np.asarray(_populations, dtype=object)), use_na_sentinel=False)
    position = {name: i for i, name in enumerate(names)}
    missing = sorted({str(u) for u in uniques} - set(position))
    if missing:
        raise ValueError(f"populations {missing} are not among the names to colour {list(names)}")
    lookup = np.array([position[str(u)] for u in uniques], dtype=np.int16)
    return lookup[codes]


@st.cache_data(max_entries=32, show_spinner=False)  # 1.6 MB each for ten populations
def population_grid(token: str, populations_token: str, names: tuple, x_channel: str, y_channel: str,
                    x_scale: dict, y_scale: dict, x_range: tuple, y_range: tuple, bins: int, _sample,
                    _populations):
    """Events of each population of ``names`` per bin of the density grid (the population view):
    :func:`gating_core.reports.population_view.population_grid_from_bins` from the density's cached
    bin indices.
    Keyed by the events (``token``) and by the populations' version (``populations_token``):
    editing gates or correcting an auto-gate gives a new version, so no stale colours are drawn."""
    n_x, n_y = plotting.bin_counts(bins)
    x_bins = bin_indices(token, x_channel, x_scale, tuple(x_range), n_x, _sample)
    y_bins = bin_indices(token, y_channel, y_scale, tuple(y_range), n_y, _sample)
    codes = population_codes(populations_token, tuple(names), _populations)
    counts, x_centers, y_centers = population_view.population_grid_from_bins(x_bins, y_bins, codes, len(names),
                                                                             x_range, y_range, bins=bins)
    return counts.astype(np.int32), x_centers, y_centers  # int32: half the cache, a million fits
