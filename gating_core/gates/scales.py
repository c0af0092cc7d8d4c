"""Axis scales: the display transforms (linear, arcsinh, logicle) a gate is drawn on."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flowutils import transforms as fu_transforms

from gating_core.gates.errors import GateError

_SCALE_KINDS = ("linear", "arcsinh", "logicle")


@dataclass(frozen=True)
class AxisScale:
    """A monotone map from raw channel values to display coordinates.

    Parameters
    ----------
    kind : {"linear", "arcsinh", "logicle"}
    cofactor : float
        arcsinh: display = asinh(raw / cofactor). Typical: 5 for mass cytometry, 150 for flow.
    top : float
        logicle T, the top of the raw scale.
    width : float
        logicle W, decades of linear-like region near zero.
    decades : float
        logicle M, total display width in decades.
    """

    kind: str = "linear"
    cofactor: float = 5.0
    top: float = 262144.0
    width: float = 0.5
    decades: float = 4.5

    def __post_init__(self):
        if self.kind not in _SCALE_KINDS:
            raise GateError(f"unknown axis scale {self.kind!r}; expected one of {_SCALE_KINDS}")
        if self.kind == "arcsinh" and not self.cofactor > 0:
            raise GateError(f"arcsinh cofactor must be > 0, got {self.cofactor}")
        if self.kind == "logicle" and not (self.top > 0 and self.decades > 0 and 0 <= self.width <= self.decades / 2):
            raise GateError(f"invalid logicle parameters T={self.top}, W={self.width}, M={self.decades}")

    def forward(self, values: np.ndarray) -> np.ndarray:
        """Raw values (any shape) -> display coordinates (float64, same shape)."""
        values = np.asarray(values, dtype=np.float64)
        if self.kind == "linear":
            return values.copy()
        if self.kind == "arcsinh":
            return np.arcsinh(values / self.cofactor)
        flat = values.reshape(-1, 1)
        out = fu_transforms.logicle(flat, [0], t=self.top, m=self.decades, w=self.width, a=0)
        return out.reshape(values.shape)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """Display coordinates -> raw values (float64, same shape)."""
        values = np.asarray(values, dtype=np.float64)
        if self.kind == "linear":
            return values.copy()
        if self.kind == "arcsinh":
            return np.sinh(values) * self.cofactor
        flat = values.reshape(-1, 1)
        out = fu_transforms.logicle_inverse(flat, [0], t=self.top, m=self.decades, w=self.width, a=0)
        return out.reshape(values.shape)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "cofactor": float(self.cofactor), "top": float(self.top),
                "width": float(self.width), "decades": float(self.decades)}

    @classmethod
    def from_dict(cls, data: dict) -> "AxisScale":
        try:
            return cls(kind=str(data["kind"]), cofactor=float(data.get("cofactor", 5.0)),
                       top=float(data.get("top", 262144.0)), width=float(data.get("width", 0.5)),
                       decades=float(data.get("decades", 4.5)))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateError(f"invalid axis scale {data!r}: {exc}") from None

    def same_mapping(self, other: "AxisScale") -> bool:
        """Whether both scales map raw values alike (only the fields their kind uses count:
        two linear scales are the same whatever cofactor they carry)."""
        if self.kind != other.kind:
            return False
        if self.kind == "arcsinh":
            return self.cofactor == other.cofactor
        if self.kind == "logicle":
            return (self.top, self.width, self.decades) == (other.top, other.width, other.decades)
        return True

    @property
    def description(self) -> str:
        if self.kind == "arcsinh":
            return f"arcsinh (cofactor {self.cofactor:g})"
        if self.kind == "logicle":
            return f"logicle (T={self.top:g}, W={self.width:g}, M={self.decades:g})"
        return "linear"


def suggest_scale(kind: str, raw: np.ndarray) -> AxisScale:
    """An :class:`AxisScale` of ``kind`` with parameters suited to one channel's raw values.

    arcsinh cofactor: 5 for mass-cytometry-like ranges (99.9th percentile below 10^4), else 150.
    logicle T: the 99.99th percentile rounded up to a power of ten (at least 1000); W from the
    negative tail as in Parks et al. (2006), clipped to [0, 1].
    """
    raw = np.asarray(raw, dtype=np.float64)
    finite = raw[np.isfinite(raw)]
    if finite.size == 0:
        finite = np.zeros(1)
    if kind == "linear":
        return AxisScale("linear")
    high = float(np.percentile(finite, 99.9))
    if kind == "arcsinh":
        return AxisScale("arcsinh", cofactor=5.0 if high < 1e4 else 150.0)
    top = max(1000.0, 10 ** math.ceil(math.log10(max(float(np.percentile(finite, 99.99)), 1.0))))
    decades = 4.5
    negative = finite[finite < 0]
    width = 0.5
    if negative.size:
        r = float(np.percentile(negative, 5))
        if r < 0:
            width = (decades - math.log10(top / abs(r))) / 2
    width = float(min(max(width, 0.0), 1.0))
    return AxisScale("logicle", top=top, width=width, decades=decades)


def panel_scale(pnn: str, samples) -> AxisScale:
    """The display and gating scale of channel ``pnn`` for a whole panel, from what the
    instrument is, never from one patient's values, so every patient of the panel gets the same
    axes and a gate tree copied between patients keeps its meaning.

    - default kind: linear for scatter channels (FSC, SSC, time-like) and for channels whose
      values are already on a channel scale (:func:`~gating_core.fcs.transforms.channel_scale_reason`),
      arcsinh otherwise;
    - arcsinh cofactor: 5 on a mass cytometer (``$CYT``, metal channel names or ion-count data
      of the first patient), else 150;
    - logicle T: the channel's largest ``$PnR`` over the patients (else 262144), W 0.5, M 4.5.

    Returns an :class:`AxisScale` whose ``kind`` is the default kind and whose other fields hold
    the parameters of every kind (``dataclasses.replace(scale, kind=...)`` switches kind).
    """
    from gating_core.fcs.transforms import (FLOW_COFACTOR, MASS_COFACTOR, channel_scale_reason, is_scatter,
                                            is_time_like, looks_like_mass_cytometry)

    samples = list(samples)
    mass = channel_scale = False
    if samples:
        first = samples[0]
        mass = looks_like_mass_cytometry(first.pnn, first.keywords, first.events[:20000])
        if not mass and pnn in first.pnn:
            j = first.channel_index(pnn)
            channel_scale = channel_scale_reason(first.events[:50000, j], first.channels[j].range) is not None
    kind = "linear" if ((is_scatter(pnn) or is_time_like(pnn)) and not mass) or channel_scale else "arcsinh"
    ranges = []
    for sample in samples:
        try:
            channel = sample.channels[sample.channel_index(pnn)]
        except KeyError:
            continue
        if channel.range and channel.range > 0:
            ranges.append(float(channel.range))
    top = max(ranges) if ranges else 262144.0
    return AxisScale(kind, cofactor=MASS_COFACTOR if mass else FLOW_COFACTOR, top=max(top, 10.0))


def with_kind(scale: AxisScale, kind: str) -> AxisScale:
    """``scale``'s parameters under another kind (linear / arcsinh / logicle)."""
    import dataclasses

    return dataclasses.replace(scale, kind=kind)
