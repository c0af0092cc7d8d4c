"""Dictionary encoding in the Parquet files we write: only columns whose values repeat
(gating_core.io.parquet_columns), in the library's event files and the gated tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gating_core.fcs import Sample, read_fcs
from gating_core.io.export import export_sample
from gating_core.io.gated_table import GatedTableWriter
from gating_core.io.parquet_columns import MAX_DISTINCT_SHARE, SAMPLE_ROWS, repeating_columns
from gating_core.library.storage import read_events, write_events_temp


def _dictionary_encoded(path) -> dict:
    """Column name -> whether its first row group is dictionary-encoded."""
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    return {meta.schema.column(i).name: any("DICTIONARY" in e for e in group.column(i).encodings)
            for i in range(meta.num_columns)}


def test_a_column_is_chosen_by_the_share_of_distinct_values_in_its_first_rows():
    n = SAMPLE_ROWS
    limit = int(MAX_DISTINCT_SHARE * n)
    table = pa.table({
        "at_limit": np.arange(11 * n) % limit,
        "over_limit": np.arange(11 * n) % (limit + 1),
        "late_repeats": np.concatenate([np.arange(n), np.zeros(10 * n)]),  # only the first rows are read
        "constant": np.zeros(11 * n),
        "forced": np.arange(11 * n, dtype=np.float64),
    })
    assert repeating_columns(table, always=("forced",), never=("constant",)) == ["at_limit", "forced"]
    assert repeating_columns(table.slice(0, 0)) == []


def test_the_library_stores_float_channels_plain_and_integer_channels_as_dictionaries(tmp_path):
    rng = np.random.default_rng(3)
    events = np.column_stack([rng.normal(size=50_000), rng.integers(0, 1024, 50_000)]).astype(np.float32)
    stored = write_events_temp(tmp_path, events, ["FSC-A", "CD3"])
    assert list(_dictionary_encoded(stored.path).values()) == [False, True]
    back = read_events(stored.path, 2)
    assert back.dtype == np.float32 and np.array_equal(back, events)


def test_gated_parquet_dictionary_encodes_populations_and_repeating_channels_only(sample_data_dir, tmp_path):
    """Arrow would dictionary-encode every column; on float channels of distinct values that
    makes the write 7x slower and the file 1.5x larger, on integer-valued channels it halves it."""
    raw_patient = read_fcs(sample_data_dir / "patient_01.fcs")
    events = raw_patient.events.copy()
    events[:, 1] = np.floor(events[:, 1] / 256)  # 10-bit values, as older instruments record them
    sample = Sample("p", events, raw_patient.channels, raw_patient.keywords)
    populations = np.where(events[:, 0] > 90_000, "big", "small")
    confidence = np.linspace(0, 1, sample.n_events)
    assert len(np.unique(events[:, 0])) > 0.9 * sample.n_events  # the simulator's floats do not repeat
    whole = tmp_path / "whole.parquet"
    export_sample(whole, sample, populations, confidence)
    streamed = tmp_path / "streamed.parquet"
    with GatedTableWriter(streamed, sample, "parquet") as writer:
        for lo in range(0, sample.n_events, 5000):
            writer.write(events[lo:lo + 5000], populations[lo:lo + 5000], confidence[lo:lo + 5000])
    for path in (whole, streamed):
        encoded = _dictionary_encoded(path)
        expected = {name: name in (sample.pnn[1], "population") for name in sample.pnn + ["population", "confidence"]}
        assert encoded == expected, path.name
        table = pq.read_table(path)
        assert np.array_equal(table.column(sample.pnn[1]).to_numpy(), events[:, 1])
        assert table.column("population").to_pylist() == populations.tolist()
