"""Per-channel transforms and the defaults that work on flow and on mass cytometry.

Fluorescence and mass cytometry intensities span several decades and, after compensation,
flow data go negative; gating happens on a transformed scale (arcsinh or logicle) where
populations look like compact clusters. The defaults are chosen from what the file is, not
tuned to one data set:

- mass cytometry (CyTOF / Helios / metal-isotope channel names, or non-negative data with
  many exact zeros and no scatter channels): arcsinh(x / 5), the field's convention;
- conventional and spectral flow: arcsinh(x / 150) on fluorescence, and scatter (FSC / SSC)
  on a linear scale divided by its range, since scatter is already linear-distributed;
- values already on a channel scale (:func:`channel_scale_reason`): 10-bit log-amplified channel
  numbers 0-1023, as FlowCAP distributes data and FlowJo's "channel values" CSV export and many
  CSV-to-FCS conversions write them, with ``$PnE 0,0`` and a ``$PnR`` that says nothing: they are
  already on a log scale, so they are used as they are (linear, divided by 1024); an arcsinh on
  top would compress the bright end a second time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

FLOW_COFACTOR = 150.0
MASS_COFACTOR = 5.0
#: The top of the channel scale of 10-bit log-amplified data (channel numbers 0-1023).
CHANNEL_SCALE_TOP = 1024.0
# Below this many distinct values a channel is a flag or a count, not a measurement.
_CHANNEL_SCALE_MIN_LEVELS = 32

_SCATTER = re.compile(r"^(fsc|ssc|fs|ss|sc|bsc|vssc)([-_ ]?[ahw]|[-_ ].*)?$", re.IGNORECASE)
_TIME_LIKE = re.compile(
    r"^(time|event[-_ ]?(count|number|no)?|original[-_ ]?id|index|cell[-_ ]?id|sample[-_ ]?id)$",
    re.IGNORECASE,
)
_METAL = re.compile(r"(^|\()\s*(\d{2,3}[A-Z][a-z]?|[A-Z][a-z]?\d{2,3})\s*(\)|di|dd)", re.IGNORECASE)
_MASS_CYTOMETERS = re.compile(r"cytof|helios|fluidigm|standard\s*bio|hyperion|mass", re.IGNORECASE)


def is_scatter(name: str) -> bool:
    return bool(_SCATTER.match(name.strip()))


def is_time_like(name: str) -> bool:
    return bool(_TIME_LIKE.match(name.strip()))


def looks_like_mass_cytometry(pnn: list[str], keywords: dict | None, data: np.ndarray | None) -> bool:
    """Guess whether the data come from a mass cytometer (see the module docstring)."""
    cytometer = (keywords or {}).get("$CYT", "")
    if _MASS_CYTOMETERS.search(cytometer):
        return True
    if any(is_scatter(n) for n in pnn):
        return False
    if sum(bool(_METAL.search(n)) for n in pnn) >= max(2, len(pnn) // 3):
        return True
    if data is not None and len(data):
        sample = np.asarray(data[: min(len(data), 20000)], dtype=np.float64)
        # Mass cytometry counts ions: no real negatives (some pipelines randomise zeros into
        # [-1, 0]) and many events at or near zero. Compensated flow spreads negatives over
        # hundreds of units and has almost no exact zeros.
        no_negatives = float(np.mean(sample < -1.0)) < 1e-3
        zero_fraction = float(np.median(np.mean(sample == 0, axis=0)))
        near_zero_fraction = float(np.median(np.mean(np.abs(sample) < 1.0, axis=0)))
        return no_negatives and (zero_fraction > 0.02 or near_zero_fraction > 0.05)
    return False


@dataclass
class ChannelTransform:
    """Map raw channel values to the gating scale, channel by channel.

    Parameters
    ----------
    kinds : list of str
        Per channel: ``"arcsinh"``, ``"logicle"`` or ``"linear"``.
    params : list of dict
        Per channel: ``{"cofactor": c}`` for arcsinh, ``{"scale": s}`` for linear (x / s),
        ``{"T": T, "W": W, "M": M, "A": A}`` for logicle.
    """

    kinds: list[str]
    params: list[dict] = field(default_factory=list)

    def __post_init__(self):
        if not self.params:
            self.params = [{} for _ in self.kinds]
        if len(self.params) != len(self.kinds):
            raise ValueError("kinds and params must have the same length")
        for kind in self.kinds:
            if kind not in ("arcsinh", "logicle", "linear"):
                raise ValueError(f"unknown transform {kind!r}")

    def apply(self, events: np.ndarray, out_dtype=np.float32) -> np.ndarray:
        """Transform ``events`` of shape (n, n_channels); returns a new (n, n_channels) array."""
        events = np.asarray(events)
        if events.ndim != 2 or events.shape[1] != len(self.kinds):
            raise ValueError(f"expected {len(self.kinds)} channels, got array of shape {events.shape}")
        out = np.empty(events.shape, dtype=out_dtype)
        for j, (kind, p) in enumerate(zip(self.kinds, self.params)):
            column = events[:, j]
            if kind == "arcsinh":
                out[:, j] = np.arcsinh(column / np.float32(p.get("cofactor", FLOW_COFACTOR)))
            elif kind == "linear":
                out[:, j] = column / np.float32(p.get("scale", 1.0))
            else:
                out[:, j] = _logicle(column, p)
        return out

    def inverse(self, values: np.ndarray, channel: int) -> np.ndarray:
        """Raw values of one channel from transformed ``values`` (for axis tick labels)."""
        kind, p = self.kinds[channel], self.params[channel]
        values = np.asarray(values, dtype=np.float64)
        if kind == "arcsinh":
            return np.sinh(values) * p.get("cofactor", FLOW_COFACTOR)
        if kind == "linear":
            return values * p.get("scale", 1.0)
        from flowutils import transforms

        return transforms.logicle_inverse(values.reshape(-1, 1), [0], t=p["T"], w=p["W"], m=p["M"], a=p["A"])[:, 0]

    def to_dict(self) -> dict:
        return {"kinds": list(self.kinds), "params": [dict(p) for p in self.params]}

    @classmethod
    def from_dict(cls, data: dict) -> "ChannelTransform":
        return cls(list(data["kinds"]), [dict(p) for p in data["params"]])


def _logicle(column: np.ndarray, p: dict) -> np.ndarray:
    from flowutils import transforms

    values = np.asarray(column, dtype=np.float64).reshape(-1, 1)
    return transforms.logicle(values, [0], t=p["T"], w=p["W"], m=p["M"], a=p["A"])[:, 0]


def channel_scale_reason(values: np.ndarray, declared_range: float | None = None) -> str | None:
    """Why one channel's values look already on a channel scale, or None when they do not.

    Channel numbers of 10-bit log-amplified data are whole numbers from 0 to 1023 (1024 at
    most), spread over many levels, whatever ``$PnR`` claims. Linear intensities of a modern
    instrument are not whole numbers below 1024 once compensated, and an 18-bit or float
    channel of raw intensities spans far more than 1024. A declared ``$PnR`` below 1023 rules
    the channel out. ``values`` (n,) are raw (uncompensated
    or compensated) values of the channel; the first 50,000 are looked at.
    """
    if declared_range and declared_range < CHANNEL_SCALE_TOP - 1:
        return None  # a range below 1023 is no 10-bit scale (and says the file was cut to its data)
    sample = np.asarray(values[: min(len(values), 50_000)], dtype=np.float64)
    sample = sample[np.isfinite(sample)]
    if len(sample) < 100:
        return None
    low, high = float(sample.min()), float(sample.max())
    if low < 0 or high > CHANNEL_SCALE_TOP or high < 64:
        return None
    whole = float(np.mean(sample == np.round(sample)))
    if whole < 0.99:
        return None
    levels = len(np.unique(sample))
    if levels < _CHANNEL_SCALE_MIN_LEVELS:
        return None
    declared = f"; $PnR {declared_range:g} says nothing" if declared_range and declared_range > CHANNEL_SCALE_TOP else ""
    return (f"whole numbers from {low:g} to {high:g} ({levels} levels): channel numbers of log-amplified data "
            f"already on a channel scale{declared}")


def channel_scale_channels(pnn: list[str], data: np.ndarray | None,
                           ranges: list[float | None] | None = None) -> dict[str, str]:
    """The channels of ``pnn`` whose values in ``data`` (n, len(pnn)) are already on a channel
    scale, each with the reason (:func:`channel_scale_reason`); scatter and time-like channels
    are left out (they are linear whatever their scale)."""
    found = {}
    if data is None or not len(data):
        return found
    for j, name in enumerate(pnn):
        if is_scatter(name) or is_time_like(name):
            continue
        reason = channel_scale_reason(data[:, j], ranges[j] if ranges is not None else None)
        if reason:
            found[name] = reason
    return found


def _found(pnn: list[str], data: np.ndarray | None, keywords: dict | None,
           ranges: list[float | None] | None) -> tuple[bool, dict[str, str]]:
    """(whether the data are mass cytometry, the channels already on a channel scale with why)."""
    mass = looks_like_mass_cytometry(pnn, keywords, data)
    return mass, ({} if mass else channel_scale_channels(pnn, data, ranges))


def default_transform(pnn: list[str], data: np.ndarray | None = None, keywords: dict | None = None,
                      ranges: list[float | None] | None = None) -> ChannelTransform:
    """The default transform for channels ``pnn`` (see the module docstring).

    ``data`` (n, len(pnn)) raw events and ``keywords`` help decide flow vs mass cytometry, find
    channels already on a channel scale (used as they are, divided by
    :data:`CHANNEL_SCALE_TOP`) and set the linear scale of scatter channels (their 99.9th
    percentile when no $PnR is given). :func:`default_transform_reasons` says why, per channel.
    """
    mass, channel_scale = _found(pnn, data, keywords, ranges)
    kinds, params = [], []
    for j, name in enumerate(pnn):
        if name in channel_scale:
            kinds.append("linear")
            params.append({"scale": CHANNEL_SCALE_TOP})
        elif not mass and is_scatter(name):
            scale = None
            if ranges is not None and ranges[j]:
                scale = float(ranges[j])
            elif data is not None and len(data):
                scale = float(np.percentile(np.abs(data[: min(len(data), 50000), j]), 99.9)) or 1.0
            kinds.append("linear")
            params.append({"scale": scale or 262144.0})
        else:
            kinds.append("arcsinh")
            params.append({"cofactor": MASS_COFACTOR if mass else FLOW_COFACTOR})
    return ChannelTransform(kinds, params)


def default_transform_reasons(pnn: list[str], data: np.ndarray | None = None, keywords: dict | None = None,
                              ranges: list[float | None] | None = None) -> dict[str, str]:
    """Why :func:`default_transform` (same arguments) gives each channel of ``pnn`` its transform:
    channel name -> a short text a user can check against the file."""
    mass, channel_scale = _found(pnn, data, keywords, ranges)
    reasons = {}
    for name in pnn:
        if name in channel_scale:
            reasons[name] = channel_scale[name]
        elif mass:
            reasons[name] = "mass cytometry (ion counts): arcsinh with cofactor 5, the field's convention"
        elif is_scatter(name):
            reasons[name] = "scatter: already linearly distributed, divided by its range"
        else:
            reasons[name] = "flow fluorescence: arcsinh with cofactor 150 (compresses the bright decades)"
    return reasons


def transform_spec(kind: str, params: dict) -> str:
    """The text :func:`parse_transform_spec` reads back into (``kind``, ``params``), logicle up to
    its W, M and A (which it leaves at their standard values)."""
    if kind == "arcsinh":
        return f"arcsinh:{params.get('cofactor', FLOW_COFACTOR):.12g}"
    if kind == "linear" and params.get("scale") == CHANNEL_SCALE_TOP:
        return "channel-scale"
    if kind == "linear":
        return f"linear:{params.get('scale', 1.0):.12g}"
    return f"logicle:{params.get('T', 262144.0):.12g}"


def parse_transform_spec(spec: str) -> tuple[str, dict]:
    """One channel's transform from text: ``arcsinh`` or ``arcsinh:COFACTOR``, ``linear`` or
    ``linear:SCALE`` (x / SCALE), ``channel-scale`` (channel numbers 0-1023 used as they are: x /
    1024), ``logicle`` or ``logicle:T``. Returns (kind, params) for :class:`ChannelTransform`."""
    kind, _, number = str(spec).strip().lower().partition(":")
    value = None
    if number:
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"transform {spec!r}: {number!r} is not a positive number")
    if kind == "arcsinh":
        return "arcsinh", {"cofactor": value or FLOW_COFACTOR}
    if kind == "linear":
        return "linear", {"scale": value or 1.0}
    if kind == "channel-scale" and value is None:
        return "linear", {"scale": CHANNEL_SCALE_TOP}
    if kind == "logicle":
        return "logicle", {"T": value or 262144.0, "W": 0.5, "M": 4.5, "A": 0.0}
    raise ValueError(f"transform {spec!r}: expected arcsinh[:COFACTOR], linear[:SCALE], channel-scale or "
                     "logicle[:T]")


def with_overrides(transform: ChannelTransform, channels: list[str], markers: list[str],
                   overrides: dict) -> ChannelTransform:
    """``transform`` of ``channels`` with some channels' transforms replaced: ``overrides`` maps a
    channel ($PnN or its marker $PnS) to a spec of :func:`parse_transform_spec`."""
    kinds, params = list(transform.kinds), [dict(p) for p in transform.params]
    for name, spec in overrides.items():
        matches = [j for j, (c, m) in enumerate(zip(channels, markers)) if name in (c, m)]
        if not matches:
            raise ValueError(f"transform given for {name!r}, which is none of the model's channels "
                             f"({', '.join(channels)})")
        for j in matches:
            kinds[j], params[j] = parse_transform_spec(spec)
    return ChannelTransform(kinds, params)


def describe_transform(transform: ChannelTransform, channels: list[str]) -> list[str]:
    """One short text per channel: ``"FL1.LOG: channel scale (x / 1024)"``, ``"CD3: arcsinh(x / 5)"``."""
    out = []
    for name, kind, p in zip(channels, transform.kinds, transform.params):
        if kind == "arcsinh":
            out.append(f"{name}: arcsinh(x / {p.get('cofactor', FLOW_COFACTOR):g})")
        elif kind == "linear" and p.get("scale") == CHANNEL_SCALE_TOP:
            out.append(f"{name}: channel scale (x / 1024)")
        elif kind == "linear":
            out.append(f"{name}: linear (x / {p.get('scale', 1.0):g})")
        else:
            out.append(f"{name}: logicle (T {p.get('T', 262144.0):g})")
    return out


def transform_for_display(kind: str, cofactor: float | None = None) -> ChannelTransform:
    """A one-channel transform for plotting (linear / arcsinh / logicle with standard parameters)."""
    if kind == "linear":
        return ChannelTransform(["linear"], [{"scale": 1.0}])
    if kind == "arcsinh":
        return ChannelTransform(["arcsinh"], [{"cofactor": cofactor or FLOW_COFACTOR}])
    if kind == "logicle":
        return ChannelTransform(["logicle"], [{"T": 262144.0, "W": 0.5, "M": 4.5, "A": 0.0}])
    raise ValueError(f"unknown display transform {kind!r}")
