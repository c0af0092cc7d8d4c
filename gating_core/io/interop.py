"""Interoperability with the Python cytometry ecosystem: FlowKit samples and AnnData.

* :func:`from_flowkit` / :func:`to_flowkit`: between ``flowkit.Sample`` and this project's
  :class:`~gating_core.fcs.Sample`, events exact, channel names and markers, keywords and the
  spillover matrix carried (defined in :mod:`gating_core.io.flowkit_interop`).
* :func:`to_anndata` / :func:`from_anndata`: a gated patient as an ``anndata.AnnData`` (events in
  ``X``, channels in ``var``, ``population`` and ``confidence`` in ``obs``, keywords in ``uns``),
  the layout scanpy / scverse tools expect (defined in :mod:`gating_core.io.anndata_interop`).
  anndata is an optional dependency (``pip install gating-core[anndata]``).
* :func:`as_sample`: whatever a caller hands the model (our Sample, a ``flowkit.Sample``, an
  AnnData) as our Sample; :meth:`GatingModel.gate` goes through it.

The two conversions live in modules of their own because they sit on either side of the export
path: the h5ad export is written through :func:`to_anndata`, while :func:`to_flowkit` goes
through an exported FCS file. This module, above both, is where users import them from.

Gates go the other way in :mod:`gating_core.gates.export` (GatingML 2.0 and FlowJo workspaces).

FlowKit and anndata are imported inside the functions that need them, so importing this module
costs nothing and never imports either.
"""

from __future__ import annotations

from gating_core.fcs import Sample
from gating_core.io.anndata_interop import _is_anndata, from_anndata, to_anndata
from gating_core.io.flowkit_interop import _is_flowkit_sample, from_flowkit, to_flowkit

__all__ = ["from_flowkit", "to_flowkit", "to_anndata", "from_anndata", "as_sample"]


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
