"""AnnData: a gated patient as an ``anndata.AnnData`` and back, and the h5ad export.

* :func:`to_anndata` / :func:`from_anndata`: events in ``X``, channels in ``var``,
  ``population`` and ``confidence`` in ``obs``, keywords in ``uns``: the layout scanpy /
  scverse tools expect.
* :func:`write_gated_h5ad`: that AnnData written as ``.h5ad``, the h5ad format of
  :func:`gating_core.io.export.export_sample`.

anndata is an optional dependency (``pip install gating-core[anndata]``), imported inside the
functions that need it, so importing this module never imports it. Users import these names
from :mod:`gating_core.io.interop` (or ``gating_core`` itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gating_core.fcs import Channel, Sample
from gating_core.io.gated_table import _atomic_target, _check_lengths

__all__ = ["to_anndata", "from_anndata", "write_gated_h5ad"]


def _is_anndata(obj) -> bool:
    return type(obj).__module__.startswith("anndata") and hasattr(obj, "obs") and hasattr(obj, "var")


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


def to_anndata(sample: Sample, result=None, *, populations=None, confidence=None, include_identifying: bool = False,
               keep_keywords=()):
    """One patient as an ``anndata.AnnData``: the layout scverse tools (scanpy, pytometry) read.

    * ``X``: the events, (n_events, n_channels), float32 or float64 as read (no copy).
    * ``var``: one row per channel, indexed by ``$PnN``; columns ``pnn``, ``pns`` (marker) and
      ``range`` (``$PnR``, NaN when unknown).
    * ``obs``: one row per event in file order (index ``"0"``, ``"1"``, ...); ``population``
      (categorical: the model's populations in its order with ``result``, so that the tables
      of several patients concatenate; else the names present, sorted) and ``confidence``
      (float32) when a gating result is given.
    * ``uns``: ``name``, ``fcs_version``, ``compensated``, ``keywords`` (dict; a ``/`` in a
      keyword name is written ``%2F`` because h5ad cannot store it; without the FCS file's byte
      offsets, ``$BEGINDATA`` and the like, which point into a file the h5ad is not), ``dropped_keywords`` (how
      many keywords the keyword policy left out; 0 with ``include_identifying``) and
      ``keyword_policy`` (the policy in words), ``spillover`` and
      ``spillover_channels`` when the sample has a spillover matrix, and ``gating``
      (``populations``, ``novelty``) when ``result`` is a :class:`~gating_core.model.result.GateResult`.

    Parameters
    ----------
    sample : Sample
    result : GateResult from ``GatingModel.gate``, or None.
    populations, confidence : per-event arrays, instead of ``result``.
    include_identifying : keep every keyword. By default only those needed to read the data
        are kept (the allow-list of :mod:`gating_core.library.privacy`, as every export does),
        plus ``keep_keywords``: an AnnData object is often written out and shared as it is.
    keep_keywords : names of further keywords to keep (case-insensitive; ``$PnV`` for every
        channel's).
    """
    anndata = _require_anndata()
    import pandas as pd

    from gating_core.library.privacy import is_file_offset, policy_note, split_keywords

    if result is not None:  # a streamed gating holds no per-event results
        populations = getattr(result, "populations", None) if populations is None else populations
        confidence = getattr(result, "confidence", None) if confidence is None else confidence
    n = sample.n_events
    obs = pd.DataFrame(index=pd.Index([str(i) for i in range(n)], dtype=object))
    if populations is not None:
        populations = np.asarray(populations).astype(str)
        if populations.shape != (n,):
            raise ValueError(f"{sample.name}: {populations.shape[0] if populations.ndim else 0} populations "
                             f"for {n} events")
        names = [str(p) for p in getattr(result, "population_names", None) or []]
        # A population the caller gave beside the result's (an edited gating) is kept, after them.
        names += sorted(set(np.unique(populations)) - set(names))
        obs["population"] = pd.Categorical(populations, categories=names)
    if confidence is not None:
        confidence = np.asarray(confidence, dtype=np.float32)
        if confidence.shape != (n,):
            raise ValueError(f"{sample.name}: confidence of shape {confidence.shape} for {n} events")
        obs["confidence"] = confidence
    ranges = [np.nan if c.range is None else float(c.range) for c in sample.channels]
    var = pd.DataFrame({"pnn": sample.pnn, "pns": sample.pns, "range": ranges},
                       index=pd.Index(sample.pnn, dtype=object))
    kept, dropped = split_keywords({str(k): v for k, v in sample.keywords.items()
                                    if not is_file_offset(str(k))},
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


def write_gated_h5ad(path: str | os.PathLike, sample: Sample, populations=None, confidence=None, *,
                     include_identifying: bool = False, keep_keywords=(), result=None) -> None:
    """The gated patient as an AnnData ``.h5ad`` (layout of :func:`to_anndata`, with
    ``result``'s gating when given); ``uns["keywords"]`` holds only the keywords needed to read
    the data (the allow-list of :mod:`gating_core.library.privacy`) and those named in
    ``keep_keywords``, or every keyword with ``include_identifying``; ``uns["dropped_keywords"]``
    counts the ones left out."""
    path = Path(path)
    if populations is not None:
        populations, confidence = _check_lengths(sample, populations, confidence, path)
    adata = to_anndata(sample, result, populations=populations, confidence=confidence,
                       include_identifying=include_identifying, keep_keywords=keep_keywords)
    tmp = _atomic_target(path)
    try:
        adata.write_h5ad(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
