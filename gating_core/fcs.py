"""Reading and writing FCS files.

FlowIO parses the bytes; this module turns what it finds into a :class:`Sample` and turns every
way a file can be unreadable into one exception type, :class:`FCSError`, whose message names
the file and the problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import flowio
import numpy as np


class FCSError(Exception):
    """An FCS file could not be read (or written). ``str(err)`` names the file and the problem."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")


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
        Linear-scale values ($PnE log amplification decoded, $PnG gain divided out).
    channels : list of Channel
    keywords : dict of str -> str
        The TEXT segment, keys upper-cased with their leading ``$`` kept.
    spillover : ndarray of shape (k, k) or None
    spillover_channels : list of str
        The $PnN names the spillover matrix applies to, in its order.
    version : str
        ``"2.0"``, ``"3.0"`` or ``"3.1"``.
    path : str or None
    compensated : bool
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
        """Return a copy with the spillover matrix applied (events @ inv(S) on its channels)."""
        if self.spillover is None or self.compensated:
            return self
        idx = [self.channel_index(n) for n in self.spillover_channels]
        events = np.array(self.events, dtype=np.float64 if self.events.dtype == np.float64 else np.float32)
        inverse = np.linalg.inv(self.spillover).astype(events.dtype)
        events[:, idx] = events[:, idx] @ inverse
        return Sample(self.name, events, list(self.channels), dict(self.keywords), self.spillover,
                      list(self.spillover_channels), self.version, self.path, compensated=True)


def read_fcs(path: str | os.PathLike, dataset: int = 0, compensate: bool = False) -> Sample:
    """Read one data set (``dataset``, from 0) of an FCS file. Raises FCSError."""
    samples = read_fcs_all(path, compensate=compensate)
    if not 0 <= dataset < len(samples):
        raise FCSError(path, f"data set {dataset} requested but the file holds {len(samples)}")
    return samples[dataset]


def read_fcs_all(path: str | os.PathLike, compensate: bool = False) -> list[Sample]:
    """Read every data set of an FCS file. Raises FCSError."""
    path = Path(path)
    try:
        flow = flowio.FlowData(str(path))
        events = np.asarray(flow.as_array(preprocess=True))
    except FileNotFoundError:
        raise FCSError(path, "file not found") from None
    except Exception as exc:  # FlowIO raises many types
        raise FCSError(path, f"not a readable FCS file ({exc})") from None
    channels = []
    for i in range(1, flow.channel_count + 1):
        pnn = flow.text.get(f"p{i}n", f"P{i}")
        channels.append(Channel(pnn, flow.text.get(f"p{i}s", ""), None))
    keywords = {("$" + k.upper()): str(v) for k, v in flow.text.items()}
    sample = Sample(path.stem, events, channels, keywords, version=str(flow.version), path=str(path))
    return [sample.compensate() if compensate else sample]


def write_fcs(path: str | os.PathLike, events: np.ndarray, pnn: list[str], pns: list[str] | None = None,
              keywords: dict[str, str] | None = None) -> None:
    """Write an FCS 3.1 file of float32 events with the given $PnN / $PnS and extra keywords."""
    events = np.asarray(events, dtype=np.float32)
    if events.ndim != 2 or events.shape[1] != len(pnn):
        raise FCSError(path, f"events of shape {events.shape} do not match {len(pnn)} channel names")
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as handle:
        flowio.create_fcs(handle, events.ravel(), list(pnn), opt_channel_names=list(pns) if pns else None,
                          metadata_dict=dict(keywords or {}))
    os.replace(tmp, path)
