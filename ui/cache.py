"""Cached computations behind the pages.

Events are never hashed (a million-event array would cost more to hash than to bin): every
function takes the sample as an ``_underscore`` argument, which Streamlit does not hash, and a
``token`` that changes whenever the events change (see ``PatientRecord.token``).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from gating_core import plotting
from gating_core.gates import AxisScale

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


@st.cache_data(max_entries=256, show_spinner=False)
def density(token: str, mask_key: str, x_channel: str, y_channel: str, x_scale: dict, y_scale: dict,
            x_range: tuple, y_range: tuple, bins: int, _sample, _mask=None):
    x = display_values(token, x_channel, x_scale, _sample)
    y = display_values(token, y_channel, y_scale, _sample)
    if _mask is not None:
        x, y = x[_mask], y[_mask]
    return plotting.density_grid(x, y, x_range, y_range, bins=bins)


@st.cache_data(max_entries=64, show_spinner=False)
def dots(token: str, n_events: int, max_points: int = MAX_DOTS) -> np.ndarray:
    return plotting.subsample_indices(n_events, max_points, seed=0)


@st.cache_data(max_entries=64, show_spinner=False)
def memberships(token: str, tree_json: str, _sample) -> dict:
    from gating_core.gates import GateTree

    return GateTree.from_json(tree_json).memberships(_sample)


@st.cache_data(max_entries=32, show_spinner=False)
def population_counts(labels_token: str, _labels) -> dict:
    names, counts = np.unique(np.asarray(_labels).astype(str), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return {str(names[i]): int(counts[i]) for i in order}
