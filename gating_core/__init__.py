"""gating_core: automatic gating of flow cytometry data by marginal transfer learning.

A plain library: importing it never imports streamlit, plotly or dask (the app and the Dask
cluster path import those themselves). The public names below are importable from the package
itself and are loaded on first use, so ``import gating_core`` (and the command line's ``info``)
stay fast and do not pay for scikit-learn or FlowKit until a name that needs them is used::

    from gating_core import read_fcs, GatingModel, to_anndata

Packages, by concept (each ``__init__`` says what it holds):

- ``fcs``: reading FCS 2.0/3.0/3.1/3.2 files into :class:`~gating_core.fcs.Sample` objects,
  writing FCS 3.1, the :class:`~gating_core.fcs.FCSError` raised for unreadable files, and
  ``fcs.transforms``: per-channel arcsinh / logicle transforms and their defaults.
- ``io``: files in and out. ``io.inputs`` (:func:`~gating_core.io.inputs.read_input`, the one
  reader of an input file -- FCS with ``<stem>.labels.csv``, FCS alone, gated CSV -- into
  patients, and ``load_labeled_input``), ``io.labels`` (the labels CSV beside an FCS file, and
  ``Provenance``), ``io.export`` (the one export path: gated CSV, FCS with a population channel,
  Parquet, h5ad), ``io.gated_table`` (the gated CSV / Parquet writers, ``read_gated_csv``),
  ``io.interop`` (FlowKit samples and AnnData).
- ``method``: the marginal-transfer kernel classifier on arrays (features, solvers, losses,
  ``method.classifier``, model selection, alignment, DICA, ...); it knows nothing of files.
- ``model``: the product's estimator, :class:`~gating_core.model.estimator.GatingModel`
  (importable as ``gating_core.model.GatingModel``), its preprocessing, streamed gating,
  ``GateResult``, training digests and its model file (``model.file``, read within memory
  bounds through ``model.file_checks``).
- ``gates``: hand-drawn and imported gates and gate trees; ``gates.export`` writes them as
  GatingML 2.0 / FlowJo workspace; ``gates.autogates`` fits an auto-gated patient's gates.
- ``reports``: plot data, marker statistics, quality flags and the HTML report.
- ``evaluation``: leave-one-group-out / leave-one-patient-out evaluation beside the baselines,
  and the held-out check by subtraction.
- ``batch``: gating and digesting files one by one, or on a Dask cluster.
- ``synthetic``: the multi-patient flow simulator and the JMLR ellipse task.
- ``library``: the persistent patient library (SQLite catalog + Parquet events).
- ``commands``: the command line's commands.

And modules: ``errors`` (:class:`~gating_core.errors.GatingCoreError`, root of every bad-input
error, and every one of those errors), ``parameters`` (what an estimator's parameters may hold),
``cpus`` (CPUs, BLAS threads and the thread pools), ``progress``, and ``cli`` (``gating-core ...``
/ ``python -m gating_core ...``).
"""

from __future__ import annotations

import importlib
import logging

# A library logs (file notes, tolerated oddities) and leaves the handlers to the application.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# The one place the version is defined: pyproject.toml reads it (setuptools dynamic version,
# parsed without importing the package) and ``gating-core --version`` prints it.
__version__ = "0.1.0"

# public name -> module that defines it (imported on first access, PEP 562)
_PUBLIC = {
    # FCS files and samples
    "read_fcs": "fcs", "read_fcs_all": "fcs", "write_fcs": "fcs", "fcs_info": "fcs",
    "Sample": "fcs", "Channel": "fcs", "FCSError": "errors",
    # labels and exports
    "read_input": "io.inputs", "load_labeled_input": "io.inputs", "LabelError": "errors", "Provenance": "io.labels",
    "export_sample": "io.export", "read_gated_csv": "io.export", "read_fcs_with_populations": "io.export",
    # the model
    "GatingModel": "model.estimator", "GateResult": "model.result", "Novelty": "model.result",
    "ChannelMismatchError": "errors",
    "MarginalTransferClassifier": "method.classifier",
    # hand-drawn and imported gates
    "Gate": "gates", "GateTree": "gates", "AxisScale": "gates", "GateError": "errors",
    "apply_gatingml": "gates", "apply_workspace": "gates",
    # interoperability
    "from_flowkit": "io.interop", "to_flowkit": "io.interop", "to_anndata": "io.interop",
    "from_anndata": "io.interop", "as_sample": "io.interop",
    "export_gatingml": "gates.export", "export_flowjo_workspace": "gates.export",
    # errors
    "GatingCoreError": "errors",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'gating_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gating_core.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
