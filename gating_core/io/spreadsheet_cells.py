"""Text cells of the CSV files we write, made safe to open in a spreadsheet.

Excel, LibreOffice and Google Sheets evaluate a cell that begins with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return as a formula (OWASP, "CSV injection"). The text cells of our
CSV files come from other people: channel names ($PnN) from an FCS file of another lab,
population names from a model file someone sent, patient names from uploaded file names. Such
a cell is written with a leading apostrophe, which a spreadsheet shows as text and does not
evaluate. Cells that already begin with apostrophes before one of those characters get one
more, so that :func:`cell_text` gives back every name exactly: a gated CSV read by this product
is still a lossless training input. Numbers are never touched (``-1.5`` is a value, not a
formula), and names that begin with a letter or a digit are written as they are.
"""

from __future__ import annotations

import re

__all__ = ["FORMULA_STARTS", "safe_cell", "cell_text", "safe_arrow_cells", "arrow_cell_texts", "safe_frame",
           "STATISTIC_DIGITS", "statistics_table_csv"]

#: The first characters that make a spreadsheet evaluate a cell.
FORMULA_STARTS = "=+-@\t\r"
_ESCAPE = "'"
_NEEDS_ESCAPE = re.compile(r"'*[=+\-@\t\r]")
_ESCAPED = re.compile(r"'+[=+\-@\t\r]")


def safe_cell(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet evaluates: an apostrophe before it when it begins
    with a formula character (after any apostrophes); else unchanged."""
    return _ESCAPE + text if _NEEDS_ESCAPE.match(text) else text


def cell_text(cell: str) -> str:
    """The text :func:`safe_cell` was given: one leading apostrophe dropped where it wrote one."""
    return cell[1:] if _ESCAPED.match(cell) else cell


def safe_arrow_cells(column):
    """:func:`safe_cell` over a pyarrow string array, with Arrow's kernels (no loop per row)."""
    import pyarrow.compute as pc

    escape = pc.match_substring_regex(column, "^" + _NEEDS_ESCAPE.pattern)
    if not pc.any(escape).as_py():
        return column
    return pc.if_else(escape, pc.binary_join_element_wise(_ESCAPE, column, ""), column)


def arrow_cell_texts(column):
    """:func:`cell_text` over a pyarrow string array."""
    import pyarrow.compute as pc

    escaped = pc.match_substring_regex(column, "^" + _ESCAPED.pattern)
    if not pc.any(escaped).as_py():
        return column
    return pc.if_else(escaped, pc.utf8_slice_codeunits(column, 1), column)


def safe_frame(frame):
    """A copy of a pandas DataFrame whose column names and text cells are :func:`safe_cell`'d,
    ready for ``to_csv``; numeric columns are left as they are."""
    from pandas.api.types import is_numeric_dtype

    out = frame.rename(columns=lambda name: safe_cell(name) if isinstance(name, str) else name)
    for name in out.columns:
        column = out[name]
        # Text is object, str (pandas 3's default), string or category: anything not numeric.
        if not is_numeric_dtype(column.dtype):
            out[name] = column.map(lambda v: safe_cell(v) if isinstance(v, str) else v)
    return out


#: Significant digits of a statistic in a CSV for people to read: what a float32 event value
#: holds (24 bits, 7.2 digits). A median of float32 values printed in full (139.468994140625)
#: shows digits no instrument measured.
STATISTIC_DIGITS = 7


def statistics_table_csv(frame) -> bytes:
    """A table of statistics (counts, shares, marker medians) as CSV bytes for a spreadsheet:
    :func:`safe_frame`'d, floats to :data:`STATISTIC_DIGITS` significant digits, integers whole."""
    return safe_frame(frame).to_csv(index=False, float_format=f"%.{STATISTIC_DIGITS}g").encode()
