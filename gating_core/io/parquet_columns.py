"""Which columns of a Parquet file to dictionary-encode.

Arrow dictionary-encodes every column by default and gives up on a column only once a row
group's dictionary outgrows its page. Cytometry channels are either floats that hardly repeat
(modern instruments, compensated or transformed values) or integers of 10-18 bits (older
instruments). Measured on 1,000,000 events (docs/scaling.md, "Parquet output"):

- 20 float32 channels of distinct values, 262,144-row groups, snappy: 0.89 s and 129.5 MB with
  Arrow's defaults, 0.12 s and 84.5 MB without dictionaries; one zstd row group: 0.35 s /
  84.8 MB against 0.15 s / 73.8 MB;
- 8 channels of 10-bit integers: the dictionary is smaller (10.2 MB against 22.6 MB, snappy)
  and faster.

So a column is dictionary-encoded when its first rows repeat.
"""

from __future__ import annotations

import numpy as np

__all__ = ["repeating_columns", "MAX_DISTINCT_SHARE", "SAMPLE_ROWS"]

#: A column is dictionary-encoded when its first SAMPLE_ROWS values hold at most this share of
#: distinct values.
MAX_DISTINCT_SHARE = 1 / 8
SAMPLE_ROWS = 16_384


def repeating_columns(table, always=(), never=()) -> list[str]:
    """Names of the columns of the Arrow ``table`` worth dictionary-encoding: those in
    ``always``, and the others (but ``never``) whose first :data:`SAMPLE_ROWS` values hold at
    most :data:`MAX_DISTINCT_SHARE` distinct values. For ``use_dictionary=`` of
    ``pyarrow.parquet.write_table`` / ``ParquetWriter``."""
    chosen = []
    for name in table.column_names:
        if name in always:
            chosen.append(name)
            continue
        column = table.column(name)
        if name in never or not len(column):
            continue
        head = column.slice(0, SAMPLE_ROWS).to_numpy()
        if len(np.unique(head)) <= MAX_DISTINCT_SHARE * len(head):
            chosen.append(name)
    return chosen
