"""Files in and out, and the conversions to other tools' objects.

``inputs`` (:func:`~gating_core.io.inputs.read_input`: the one reader of an input file -- FCS
with ``<stem>.labels.csv``, FCS alone, gated CSV -- into patients; ``load_labeled_input`` for
training), ``labels`` (the ``<stem>.labels.csv`` format and ``Provenance``), ``export`` (the one
export path: keyword policy, ``export_sample`` / ``export_bytes``, FCS with a population
channel), ``gated_table`` (gated CSV / Parquet, written chunk by chunk, and
``read_gated_csv``), ``parquet_columns`` (which Parquet columns to dictionary-encode),
``spreadsheet_cells`` (CSV text cells no spreadsheet evaluates as a formula),
``interop`` (where users import the conversions from) with ``flowkit_interop`` (FlowKit
samples) and ``anndata_interop`` (AnnData, h5ad). Import each name from its module (or the
public ones from ``gating_core`` itself); this package re-exports nothing, so reading a labels
file does not import FlowKit. (Imports are absolute: ``gating_core.io`` never shadows the
standard library's ``io``.)
"""
