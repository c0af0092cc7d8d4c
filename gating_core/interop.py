"""Interoperability with the Python cytometry ecosystem: FlowKit samples and AnnData.

* :func:`from_flowkit` / :func:`to_flowkit`: between ``flowkit.Sample`` and this project's
  :class:`~gating_core.fcs.Sample`, events exact, channel names and markers, keywords and the
  spillover matrix carried.
* :func:`to_anndata` / :func:`from_anndata`: a gated patient as an ``anndata.AnnData`` (events in
  ``X``, channels in ``var``, ``population`` and ``confidence`` in ``obs``, keywords in ``uns``),
  the layout scanpy / scverse tools expect. anndata is an optional dependency
  (``pip install gating-core[anndata]``).
* :func:`as_sample`: whatever a caller hands the model (our Sample, a ``flowkit.Sample``, an
  AnnData) as our Sample; :meth:`GatingModel.gate` goes through it.

Gates go the other way in :mod:`gating_core.gate_export` (GatingML 2.0 and FlowJo workspaces).

FlowKit and anndata are imported inside the functions that need them, so importing this module
costs nothing and never imports either.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel, Sample, exact_in_float32

__all__ = ["from_flowkit", "to_flowkit", "to_anndata", "from_anndata", "as_sample"]

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


def _is_anndata(obj) -> bool:
    return type(obj).__module__.startswith("anndata") and hasattr(obj, "obs") and hasattr(obj, "var")


def as_sample(obj) -> Sample:
    """``obj`` as a :class:`~gating_core.fcs.Sample`: a Sample is returned unchanged, a
    ``flowkit.Sample`` goes through :func:`from_flowkit`, an AnnData through :func:`from_anndata`.

    Raises TypeError naming the type for anything else.
    """
    if isinstance(obj, Sample):
        return obj
    if _is_flowkit_sample(obj):
        return from_flowkit(obj)
    if _is_anndata(obj):
        return from_anndata(obj)
    if all(hasattr(obj, a) for a in ("name", "events", "channels")):
        return obj  # a Sample look-alike (the model's digests); used as it is
    raise TypeError(f"expected a gating_core Sample, a flowkit.Sample or an AnnData, not {type(obj).__name__}")


# --------------------------------------------------------------------------------------------
# FlowKit


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


def to_flowkit(sample: Sample, *, include_identifying: bool = True, keep_keywords=()):
    """A ``flowkit.Sample`` holding exactly ``sample``'s events, channels, keywords and spillover.

    The sample goes through the product's one export path (an FCS 3.1 file in a temporary
    folder, read back by FlowKit), so FlowKit sees what any other tool would: linear values
    (``get_events(source="raw")`` equals ``sample.events``), ``$PnN`` / ``$PnS``, the keywords of
    :func:`~gating_core.export.export_keywords` and the spillover as ``$SPILLOVER`` in
    ``metadata["spillover"]`` (compensate with
    ``fk.apply_compensation(fk.metadata["spillover"])``, FlowKit's own step).

    ``include_identifying`` keeps every keyword (default: kept, as this is an in-memory
    conversion); pass False before sharing the result to keep only those needed to read the
    data (:mod:`gating_core.library.privacy`) and the ones named in ``keep_keywords``.

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

    from gating_core.export import export_sample

    with tempfile.TemporaryDirectory(prefix="gating-core-flowkit-") as folder:
        path = Path(folder) / "sample.fcs"
        export_sample(path, sample, format="fcs", include_identifying=include_identifying,
                      keep_keywords=keep_keywords)
        # subsample=0: FlowKit's default draws 10,000 events for its plots at load time.
        return flowkit.Sample(str(path), sample_id=sample_id, subsample=0)


# --------------------------------------------------------------------------------------------
# AnnData


def _require_anndata():
    try:
        import anndata
    except ImportError:
        raise ImportError("AnnData conversion needs the anndata package: pip install 'gating-core[anndata]'") from None
    return anndata


def _encode_key(key: str) -> str:
    # h5ad stores uns dicts as HDF5 groups, whose member names cannot hold '/'.
    return key.replace("%", "%25").replace("/", "%2F")


def _decode_key(key: str) -> str:
    return key.replace("%2F", "/").replace("%25", "%")


def to_anndata(sample: Sample, result=None, *, populations=None, confidence=None, include_identifying: bool = True,
               keep_keywords=()):
    """One patient as an ``anndata.AnnData``: the layout scverse tools (scanpy, pytometry) read.

    * ``X``: the events, (n_events, n_channels), float32 or float64 as read (no copy).
    * ``var``: one row per channel, indexed by ``$PnN``; columns ``pnn``, ``pns`` (marker) and
      ``range`` (``$PnR``, NaN when unknown).
    * ``obs``: one row per event in file order (index ``"0"``, ``"1"``, ...); ``population``
      (categorical) and ``confidence`` (float32) when a gating result is given.
    * ``uns``: ``name``, ``fcs_version``, ``compensated``, ``keywords`` (dict; a ``/`` in a
      keyword name is written ``%2F`` because h5ad cannot store it), ``dropped_keywords`` (how
      many keywords the keyword policy left out; 0 with ``include_identifying``) and
      ``keyword_policy`` (the policy in words), ``spillover`` and
      ``spillover_channels`` when the sample has a spillover matrix, and ``gating``
      (``populations``, ``novelty``) when ``result`` is a :class:`~gating_core.gate_result.GateResult`.

    Parameters
    ----------
    sample : Sample
    result : GateResult from ``GatingModel.gate``, or None.
    populations, confidence : per-event arrays, instead of ``result``.
    include_identifying : keep every keyword (default True: an in-memory conversion). With
        False only those needed to read the data are kept (the allow-list of
        :mod:`gating_core.library.privacy`, as the h5ad export of
        :func:`~gating_core.export.export_sample` does by default), plus ``keep_keywords``.
    keep_keywords : names of further keywords to keep (case-insensitive; ``$PnV`` for every
        channel's).
    """
    anndata = _require_anndata()
    import pandas as pd

    from gating_core.library.privacy import policy_note, split_keywords

    if result is not None:
        populations = result.populations if populations is None else populations
        confidence = result.confidence if confidence is None else confidence
    n = sample.n_events
    obs = pd.DataFrame(index=pd.Index([str(i) for i in range(n)], dtype=object))
    if populations is not None:
        populations = np.asarray(populations).astype(str)
        if populations.shape != (n,):
            raise ValueError(f"{sample.name}: {populations.shape[0] if populations.ndim else 0} populations "
                             f"for {n} events")
        obs["population"] = pd.Categorical(populations)
    if confidence is not None:
        confidence = np.asarray(confidence, dtype=np.float32)
        if confidence.shape != (n,):
            raise ValueError(f"{sample.name}: confidence of shape {confidence.shape} for {n} events")
        obs["confidence"] = confidence
    ranges = [np.nan if c.range is None else float(c.range) for c in sample.channels]
    var = pd.DataFrame({"pnn": sample.pnn, "pns": sample.pns, "range": ranges},
                       index=pd.Index(sample.pnn, dtype=object))
    kept, dropped = split_keywords({str(k): v for k, v in sample.keywords.items()},
                                   include_identifying=include_identifying, keep_keywords=keep_keywords)
    keywords = {_encode_key(k): str(v) for k, v in kept.items()}
    uns = {"name": sample.name, "fcs_version": sample.version or "", "compensated": bool(sample.compensated),
           "keywords": keywords, "dropped_keywords": len(dropped),
           "keyword_policy": policy_note(include_identifying=include_identifying, keep_keywords=keep_keywords)}
    if sample.spillover is not None:
        uns["spillover"] = np.asarray(sample.spillover, dtype=np.float64)
        uns["spillover_channels"] = list(sample.spillover_channels)
    if result is not None and hasattr(result, "novelty"):
        novelty = result.novelty.to_dict() if hasattr(result.novelty, "to_dict") else dict(result.novelty)
        uns["gating"] = {"populations": [str(p) for p in getattr(result, "population_names", [])]
                         or sorted(set(map(str, populations))), "novelty": novelty}
    return anndata.AnnData(X=sample.events, obs=obs, var=var, uns=uns)


def from_anndata(adata, *, name: str | None = None) -> Sample:
    """A :class:`~gating_core.fcs.Sample` from an AnnData laid out as :func:`to_anndata` writes it.

    Channels come from ``var`` (``pnn`` / ``pns`` columns, else the var names); keywords,
    spillover and name from ``uns`` when present. An AnnData from elsewhere works too, as long
    as ``X`` holds one row per event and one column per channel (sparse ``X`` is densified).
    The per-event ``population`` / ``confidence`` stay in ``adata.obs``.
    """
    if not _is_anndata(adata):
        raise TypeError(f"expected an anndata.AnnData, not {type(adata).__name__}")
    matrix = adata.X
    if hasattr(matrix, "toarray"):
        matrix = matrix.toarray()
    events = np.asarray(matrix)
    if events.dtype not in (np.float32, np.float64):
        events = events.astype(np.float64)
    uns = dict(adata.uns)
    name = name or str(uns.get("name", "anndata"))
    var = adata.var
    pnn = [str(v) for v in (var["pnn"] if "pnn" in var.columns else adata.var_names)]
    pns = [str(v) for v in var["pns"]] if "pns" in var.columns else [""] * len(pnn)
    ranges = [None] * len(pnn)
    if "range" in var.columns:
        ranges = [None if not np.isfinite(r) else float(r) for r in np.asarray(var["range"], dtype=np.float64)]
    keywords = {_decode_key(str(k)): str(v) for k, v in dict(uns.get("keywords", {})).items()}
    spillover, spillover_channels = None, []
    if "spillover" in uns:
        spillover = np.asarray(uns["spillover"], dtype=np.float64)
        spillover_channels = [str(c) for c in uns.get("spillover_channels", [])]
    return Sample(name, np.ascontiguousarray(events), [Channel(n, s, r) for n, s, r in zip(pnn, pns, ranges)], keywords,
                  spillover, spillover_channels, version=str(uns.get("fcs_version", "")),
                  compensated=bool(uns.get("compensated", False)))
