"""The data a reader returns: :class:`Sample` (one data set), :class:`Channel`,
:class:`SampleList`, and :class:`FCSError`, the one error of every unreadable file (defined
with every other error in :mod:`gating_core.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.errors import FCSError


@dataclass
class Channel:
    """One measured parameter: ``pnn`` is its short name ($PnN), ``pns`` its stain/marker ($PnS)."""

    pnn: str
    pns: str = ""
    range: float | None = None

    @property
    def label(self) -> str:
        """Human-readable label: ``"CD4 (FL1-A)"`` when a marker is set, else the $PnN."""
        if self.pns and self.pns != self.pnn:
            return f"{self.pns} ({self.pnn})"
        return self.pnn


@dataclass
class Sample:
    """One data set of an FCS file.

    Attributes
    ----------
    name : str
        File stem, or ``"<stem>#<k>"`` (k from 1) when the file holds several data sets.
    events : ndarray of shape (n_events, n_channels), float32 or float64
        Linear-scale values ($PnE log amplification decoded, $PnG gain divided out, time channel
        multiplied by $TIMESTEP). float32 when the file stores float32 or small unscaled
        integers (exact), float64 otherwise.
    channels : list of Channel
        $PnN names are unique (a repeated name gets ``_2``, ``_3``... appended).
    keywords : dict of str -> str
        The TEXT segment, keys upper-cased and stripped of padding, with their leading ``$``
        when the file had one.
    spillover : ndarray of shape (k, k) or None
    spillover_channels : list of str
        The (unique) $PnN names the spillover matrix applies to, in its order.
    version : str
        ``"2.0"``, ``"3.0"``, ``"3.1"`` or ``"3.2"``.
    path : str or None
    compensated : bool
    notes : list of str
        Things the reader tolerated or could not interpret (e.g. an unparseable spillover
        keyword, an off-by-one $ENDDATA, an ignored negative $PnG, a data set of the same file
        that was skipped), for display; empty for a clean file.
    """

    name: str
    events: np.ndarray
    channels: list[Channel]
    keywords: dict[str, str] = field(default_factory=dict)
    spillover: np.ndarray | None = None
    spillover_channels: list[str] = field(default_factory=list)
    version: str = "3.1"
    path: str | None = None
    compensated: bool = False
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        # A summary: the dataclass's own repr prints every event and keyword (pages in a notebook).
        spillover = (f", spillover of {len(self.spillover_channels)} channels"
                     + (", compensated" if self.compensated else "")) if self.spillover is not None else ""
        return (f"Sample({self.name!r}, {self.n_events:,} events x {len(self.channels)} channels "
                f"[{', '.join(self.pnn[:8])}{', ...' if len(self.channels) > 8 else ''}], "
                f"{self.events.dtype}, FCS {self.version}{spillover}, {len(self.keywords)} keywords)")

    @property
    def n_events(self) -> int:
        return int(self.events.shape[0])

    @property
    def pnn(self) -> list[str]:
        return [c.pnn for c in self.channels]

    @property
    def pns(self) -> list[str]:
        return [c.pns for c in self.channels]

    @property
    def has_spillover(self) -> bool:
        return self.spillover is not None

    def channel_index(self, name: str) -> int:
        """Index of a channel by $PnN, else by $PnS (case-insensitive); KeyError if absent."""
        for i, c in enumerate(self.channels):
            if c.pnn == name:
                return i
        lowered = name.casefold()
        for i, c in enumerate(self.channels):
            if c.pnn.casefold() == lowered or (c.pns and c.pns.casefold() == lowered):
                return i
        raise KeyError(f"{self.name}: no channel named {name!r}")

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame(self.events, columns=self.pnn, copy=False)

    def compensate(self) -> "Sample":
        """Return a copy with the spillover matrix applied (events @ inv(S) on its channels).

        A sample without spillover (or already compensated) is returned unchanged.
        Raises FCSError when the matrix cannot be inverted.
        """
        if self.spillover is None or self.compensated:
            return self
        return self._with_matrix_applied(_compensation_inverse(self), compensated=True)

    def uncompensated(self) -> "Sample":
        """The events as the file holds them: a compensated sample's copy with the spillover
        matrix taken back out (events @ S on its channels), equal to the read values up to
        float rounding. Any other sample is returned unchanged."""
        if self.spillover is None or not self.compensated:
            return self
        return self._with_matrix_applied(np.asarray(self.spillover, dtype=np.float64), compensated=False)

    def _with_matrix_applied(self, matrix: np.ndarray, compensated: bool) -> "Sample":
        """A copy with its spillover channels' events multiplied by ``matrix`` (k, k), in float64,
        kept in the events' dtype (float64 stays, anything else is float32)."""
        idx = [self.channel_index(n) for n in self.spillover_channels]
        dtype = np.float64 if self.events.dtype == np.float64 else np.float32
        events = np.array(self.events, dtype=dtype)
        # Row blocks keep the float64 temporaries small whatever the file size.
        for start in range(0, len(events), 262_144):
            block = events[start:start + 262_144]
            with np.errstate(over="ignore"):  # beyond float32: inf, which gating refuses by name
                block[:, idx] = (block[:, idx].astype(np.float64) @ matrix).astype(dtype)
        return Sample(self.name, events, list(self.channels), dict(self.keywords), self.spillover,
                      list(self.spillover_channels), self.version, self.path, compensated=compensated,
                      notes=list(self.notes))


class SampleList(list):
    """What :func:`read_fcs_all` returns: the samples read, in file order, and ``skipped``,
    a list of ``(name, problem)`` for the data sets of the file that could not be read."""

    def __init__(self, samples=(), skipped=()):
        super().__init__(samples)
        self.skipped: list[tuple[str, str]] = list(skipped)


def _compensation_inverse(sample: Sample) -> np.ndarray:
    """inv(spillover), checked as :meth:`Sample.compensate` checks it."""
    try:
        inverse = np.linalg.inv(np.asarray(sample.spillover, dtype=np.float64))
    except np.linalg.LinAlgError:
        raise FCSError(sample.path or sample.name, "the spillover matrix is singular and cannot be "
                       "used for compensation") from None
    if not np.all(np.isfinite(inverse)):
        raise FCSError(sample.path or sample.name, "the spillover matrix is numerically singular")
    return inverse
