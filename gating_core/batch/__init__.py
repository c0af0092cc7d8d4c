"""Work on many files: gating and digesting file by file, serially or on a Dask cluster.

``files`` (``gate_file``: an FCS file gated with a trained model, streamed to a gated CSV or
Parquet, or written whole as FCS / h5ad; ``digest_file``: a labeled training input reduced to
what training needs; what serial and cluster runs share) and ``distributed`` (the same
``gate_file`` and ``digest_file`` as Dask tasks, one file per task; Dask is imported only when a
cluster is used). Import each name from its module; this package re-exports nothing.
"""
