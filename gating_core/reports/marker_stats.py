"""Per-population statistics of each marker, as a flow lab reads them beside a count: median,
geometric mean and coefficient of variation (CV).

They are computed on the values every export holds (the events as read, compensated when the
file has a spillover matrix), over the cells a row counts, never on display bins:

* **median**: ``numpy.median`` of the cells' values.
* **geometric mean**: ``c * sinh(mean(arcsinh(x / c)))``, with ``c`` the channel's arcsinh
  cofactor of the instrument (5 on a mass cytometer, 150 on flow:
  :func:`gating_core.gates.panel_scale`). For cells well above ``c`` it is the geometric mean
  ``exp(mean(log x))`` (relative difference below ``(c / 2x)^2``: 0.6% at x = 10 c); unlike it,
  it stays defined when compensation or background subtraction leaves values at or below zero,
  where the geometric mean has no value (FlowJo takes it on its display scale for the same
  reason, Floreada and FCS Express refuse it). The cofactor is the instrument's, not a
  cofactor edited for display, so the figure does not move with how a plot is drawn.
* **CV**: ``100 * SD / mean`` (SD with n - 1), in percent as FlowJo shows it; no value (NaN)
  when the mean is at or below zero or the population has fewer than two cells.

Channels: every channel but time-like ones (:func:`gating_core.fcs.transforms.is_time_like`).
Nothing here imports streamlit or plotly.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MARKER_STATISTICS", "MarkerStatistics", "marker_channels", "statistic_column"]

#: The statistics of each marker, in the order of their columns.
MARKER_STATISTICS = ("median", "geometric mean", "CV")


def statistic_column(statistic: str, label: str) -> str:
    """The column of ``statistic`` for the channel labelled ``label``, e.g. "median CD4 (FL3-A)"."""
    return f"{statistic} {label}"


def marker_channels(sample) -> list[str]:
    """The channels ($PnN) whose statistics a table shows: every channel but time-like ones."""
    from gating_core.fcs.transforms import is_time_like

    return [pnn for pnn in sample.pnn if not is_time_like(pnn)]


class MarkerStatistics:
    """The marker statistics of any subset of one patient's events.

    Parameters
    ----------
    events : array (n_events, n_channels) of the values the statistics are of.
    labels : names of the columns of ``events`` as the table shows them.
    cofactors : arcsinh cofactor of each column (the geometric mean's).

    Calling it with a boolean mask of the events gives {column: value}, columns named by
    :func:`statistic_column`, statistic by statistic (every median, then every geometric mean,
    then every CV).
    """

    def __init__(self, events, labels, cofactors):
        self.events = np.asarray(events, dtype=np.float64)
        self.labels = [str(label) for label in labels]
        self.cofactors = np.asarray(cofactors, dtype=np.float64).reshape(-1)
        if (self.events.ndim != 2 or self.events.shape[1] != len(self.labels)
                or self.cofactors.shape != (len(self.labels),)):
            raise ValueError(f"{self.events.shape} events, {len(self.labels)} labels and "
                             f"{self.cofactors.shape[0]} cofactors do not match")
        self._asinh = None  # every event's arcsinh, made once for all the rows of a patient

    @classmethod
    def of_sample(cls, sample, label=None):
        """The statistics of ``sample``'s marker channels (:func:`marker_channels`), each
        labelled by ``label(sample, pnn)`` (default: its $PnN), with the instrument's cofactors."""
        from gating_core.gates import panel_scale

        channels = marker_channels(sample)
        columns = [sample.channel_index(pnn) for pnn in channels]
        # the cofactor is the instrument's (mass or flow), the same for every channel
        cofactor = panel_scale(channels[0], [sample]).cofactor if channels else 1.0
        return cls(sample.events[:, columns], [label(sample, pnn) if label else pnn for pnn in channels],
                   np.full(len(channels), cofactor))

    @property
    def columns(self) -> list[str]:
        return [statistic_column(s, label) for s in MARKER_STATISTICS for label in self.labels]

    def __call__(self, cells) -> dict:
        cells = np.asarray(cells, dtype=bool)
        values = self.events[cells]
        n = values.shape[0]
        d = len(self.labels)
        if n == 0:
            medians = geometric = cv = np.full(d, np.nan)
        else:
            if self._asinh is None:
                self._asinh = np.arcsinh(self.events / self.cofactors)
            medians = np.median(values, axis=0)
            geometric = self.cofactors * np.sinh(self._asinh[cells].mean(axis=0))
            mean = values.mean(axis=0)
            cv = np.full(d, np.nan)
            if n > 1:
                sd = values.std(axis=0, ddof=1)
                positive = mean > 0
                cv[positive] = 100.0 * sd[positive] / mean[positive]
        out = {}
        for statistic, row in zip(MARKER_STATISTICS, (medians, geometric, cv)):
            for label, value in zip(self.labels, row):
                out[statistic_column(statistic, label)] = float(value)
        return out
