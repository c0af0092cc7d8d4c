"""Dictionary encoding in the Parquet files we write: only columns whose values repeat
(gating_core.parquet_columns; the gated tables are checked in tests/test_interop.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gating_core.library.storage import read_events, write_events_temp
from gating_core.parquet_columns import MAX_DISTINCT_SHARE, SAMPLE_ROWS, repeating_columns


def _dictionary_encoded(path) -> list[bool]:
    meta = pq.ParquetFile(path).metadata
    return [any("DICTIONARY" in e for e in meta.row_group(0).column(i).encodings) for i in range(meta.num_columns)]


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
    assert _dictionary_encoded(stored.path) == [False, True]
    back = read_events(stored.path, 2)
    assert back.dtype == np.float32 and np.array_equal(back, events)
