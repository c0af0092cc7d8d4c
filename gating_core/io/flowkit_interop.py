"""FlowKit: between ``flowkit.Sample`` and this project's :class:`~gating_core.fcs.Sample`.

:func:`from_flowkit` / :func:`to_flowkit` carry the events exactly, channel names and markers,
keywords and the spillover matrix. A sample goes to FlowKit through the product's one export
path (an FCS file written by :func:`gating_core.io.export.export_sample`, read back by FlowKit), so
FlowKit sees what any other tool would: :func:`flowkit_sample_via_fcs`, which the FlowJo
workspace export uses too.

FlowKit is imported inside the functions that need it, so importing this module never imports
it. Users import these names from :mod:`gating_core.io.interop` (or ``gating_core`` itself).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel, Sample, exact_in_float32
from gating_core.io.export import export_sample

__all__ = ["from_flowkit", "to_flowkit", "flowkit_sample_via_fcs"]

# FCS 3.1 keyword names (without '$') that FlowIO / FlowKit strip of their '$'; from_flowkit
# puts it back so keyword lookups written against files read by this project keep working.
_FCS_STANDARD = {
    "ABRT", "BEGINANALYSIS", "BEGINDATA", "BEGINSTEXT", "BTIM", "BYTEORD", "CELLS", "COM", "CSMODE",
    "CSVBITS", "CYT", "CYTSN", "DATATYPE", "DATE", "ENDANALYSIS", "ENDDATA", "ENDSTEXT", "ETIM",
    "EXP", "FIL", "GATE", "GATING", "INST", "LAST_MODIFIED", "LAST_MODIFIER", "LOST", "MODE",
    "NEXTDATA", "ORIGINALITY", "OP", "PAR", "PLATEID", "PLATENAME", "PROJ", "SMNO", "SPILLOVER",
    "SRC", "SYS", "TIMESTEP", "TOT", "TR", "VOL", "WELLID", "UNICODE", "COMP",
}
# $PnX of FCS 3.1 / 3.2 only: vendors' own channel keywords (BD's P1DISPLAY, P1BS) have no '$'.
_FCS_CHANNEL_KEYWORD = re.compile(r"^P\d+(B|D|E|F|G|L|N|O|P|R|S|T|V|CALIBRATION|DATATYPE|DET|TAG|ANALYTE|FEATURE)$")
_SPILLOVER_KEYS = ("spillover", "spill", "$spill")


def _is_flowkit_sample(obj) -> bool:
    return type(obj).__module__.startswith("flowkit") and hasattr(obj, "get_events")


def _keyword_name(flowkit_key: str) -> str:
    """FlowKit's ``'p1n'`` / ``'cyt'`` / ``'my key'`` -> this project's ``'$P1N'`` / ``'$CYT'`` / ``'MY KEY'``."""
    name = str(flowkit_key).strip().upper()
    bare = name.lstrip("$")
    if name.startswith("$") or bare in _FCS_STANDARD or _FCS_CHANNEL_KEYWORD.match(bare):
        return "$" + bare
    return name


def _parse_spillover_text(text: str, pnn: list[str], where: str):
    """(matrix, channels) from FCS spillover text ``"n,ch1,...,chn,v11,...,vnn"``."""
    tokens = [t.strip() for t in str(text).split(",")]
    try:
        n = int(tokens[0])
        names = tokens[1:n + 1]
        values = np.array([float(v) for v in tokens[n + 1:n + 1 + n * n]], dtype=np.float64)
    except (ValueError, IndexError):
        raise ValueError(f"{where}: the spillover keyword is not 'n, n channel names, n x n values'") from None
    if n < 1 or len(names) != n or values.size != n * n:
        raise ValueError(f"{where}: the spillover keyword declares {tokens[0]} channels but does not hold "
                         "that many names and values")
    unknown = [c for c in names if c not in pnn]
    if unknown:
        raise ValueError(f"{where}: the spillover matrix names channels the sample lacks: {unknown}")
    return values.reshape(n, n), names


def from_flowkit(fk_sample, *, name: str | None = None) -> Sample:
    """A :class:`~gating_core.fcs.Sample` from a ``flowkit.Sample``.

    The events are FlowKit's *raw* events (gain, log amplification and time step applied, not
    compensated, not transformed) -- the values :func:`~gating_core.fcs.read_fcs` gives -- as
    float32 when every value is a float32 (as this project's reader returns them), else float64.
    The spillover comes from the FlowKit sample's compensation matrix when one was applied,
    else from its ``$SPILLOVER`` / ``SPILL`` keyword; the returned sample is not compensated
    (call ``.compensate()``, or let the model do it). Keywords keep their values; their names
    are upper-cased and standard FCS keywords get back the ``$`` FlowKit drops.

    Parameters
    ----------
    fk_sample : flowkit.Sample
    name : patient name; default: the FlowKit sample id without a ``.fcs`` suffix.
    """
    if not _is_flowkit_sample(fk_sample):
        raise TypeError(f"expected a flowkit.Sample, not {type(fk_sample).__name__}")
    sample_id = str(fk_sample.id) if fk_sample.id is not None else "flowkit-sample"
    name = name or (sample_id[:-4] if sample_id.lower().endswith(".fcs") else sample_id)
    events = np.asarray(fk_sample.get_events(source="raw"))
    events = events.astype(np.float32) if exact_in_float32(events) else np.asarray(events, dtype=np.float64)
    pnn = [str(p) for p in fk_sample.pnn_labels]
    pns = [str(p) if p else "" for p in fk_sample.pns_labels]
    ranges = [None] * len(pnn)
    if "pnr" in getattr(fk_sample, "channels", {}):
        ranges = [None if r is None or not np.isfinite(r) else float(r)
                  for r in np.asarray(fk_sample.channels["pnr"], dtype=np.float64)]
    channels = [Channel(n, s, r) for n, s, r in zip(pnn, pns, ranges)]
    metadata = dict(fk_sample.get_metadata())
    keywords = {_keyword_name(k): str(v) for k, v in metadata.items()}
    spillover, spillover_channels = None, []
    compensation = getattr(fk_sample, "compensation", None)
    if compensation is not None and hasattr(compensation, "matrix"):
        spillover = np.array(compensation.matrix, dtype=np.float64)
        spillover_channels = [str(d) for d in compensation.detectors]
    else:
        text = next((metadata[k] for k in _SPILLOVER_KEYS if k in metadata), None)
        if text:
            spillover, spillover_channels = _parse_spillover_text(text, pnn, name)
    return Sample(name, np.ascontiguousarray(events), channels, keywords, spillover, spillover_channels,
                  version=str(getattr(fk_sample, "version", "3.1") or "3.1"), path=None, compensated=False)


def to_flowkit(sample: Sample, *, include_identifying: bool = False, keep_keywords=()):
    """A ``flowkit.Sample`` holding exactly ``sample``'s events, channels, keywords and spillover.

    The sample goes through the product's one export path (an FCS 3.1 file in a temporary
    folder, read back by FlowKit), so FlowKit sees what any other tool would: linear values
    (``get_events(source="raw")`` equals ``sample.events``), ``$PnN`` / ``$PnS``, the keywords of
    :func:`~gating_core.io.export.export_keywords` and the spillover as ``$SPILLOVER`` in
    ``metadata["spillover"]`` (compensate with
    ``fk.apply_compensation(fk.metadata["spillover"])``, FlowKit's own step).

    ``include_identifying`` keeps every keyword. By default only those needed to read the data
    are kept (:mod:`gating_core.library.privacy`, as every export does), and the ones named in
    ``keep_keywords``: FlowKit writes a Sample out with its keywords.

    Raises ValueError for a sample that is already compensated: FlowKit keeps raw events and
    compensates them itself, so convert the sample as read (``read_fcs(..., compensate=False)``).
    """
    if sample.compensated:
        raise ValueError(f"{sample.name}: the sample is already compensated; FlowKit keeps raw events and "
                         "compensates them itself, so convert the sample as read (compensate=False)")
    return flowkit_sample_via_fcs(sample, sample.name, include_identifying, keep_keywords)


def flowkit_sample_via_fcs(sample: Sample, sample_id: str, include_identifying: bool, keep_keywords=()):
    """``flowkit.Sample(sample_id)`` read from ``sample`` exported as FCS (the one export path,
    with its keyword policy)."""
    import flowkit

    with tempfile.TemporaryDirectory(prefix="gating-core-flowkit-") as folder:
        path = Path(folder) / "sample.fcs"
        export_sample(path, sample, format="fcs", include_identifying=include_identifying,
                      keep_keywords=keep_keywords)
        # subsample=0: FlowKit's default draws 10,000 events for its plots at load time.
        return flowkit.Sample(str(path), sample_id=sample_id, subsample=0)
