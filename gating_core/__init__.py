"""gating_core: automatic gating of flow cytometry data by marginal transfer learning.

A plain library (it never imports streamlit). Modules:

- ``fcs``: reading FCS 2.0/3.0/3.1/3.2 files into :class:`~gating_core.fcs.Sample` objects,
  writing FCS 3.1, and the :class:`~gating_core.fcs.FCSError` raised for unreadable files.
- ``export``: the gated CSV contract and FCS export with a population channel.
- ``labels``: loading expert labels (labels CSV, gated CSV, FlowJo / GatingML gates).
- ``transforms``: per-channel arcsinh / logicle transforms and their defaults.
- ``features`` / ``model``: the marginal-transfer kernel classifier.
- ``modelfile``: reading a model ``.npz`` within memory bounds, with a typed description.
- ``errors``: :class:`~gating_core.errors.GatingCoreError`, root of every bad-input error.
- ``evaluation``: leave-one-patient-out evaluation beside the pooling and LDA baselines.
- ``synthetic``: the multi-patient flow simulator and the JMLR ellipse task.
- ``library``: the persistent patient library (SQLite catalog + Parquet events).
- ``cli``: ``python -m gating_core ...``.
"""

__version__ = "0.1.0"
