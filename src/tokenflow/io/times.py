"""Event times of input columns, and the error for bad input data.

Source: docs/ARCHITECTURE.md ("Data plane"): every source converts or refuses each time unit
explicitly and names the input, column, row and value of bad data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class InputError(ValueError):
    """Bad input data: names the input, column, row and value."""


def event_times(batch: pa.RecordBatch | pa.Table, column: str, input_name: str,
                first_row: int) -> np.ndarray:
    """The ``column`` of ``batch`` as int64 times (timestamps become ms since the Unix epoch,
    floored; floating-point times must hold whole numbers).

    Raises:
        InputError: for a missing column, a null, a fractional or non-finite float, or a type
            that is not an integer, float, date or timestamp (naming the row and value).
    """
    if column not in batch.schema.names:
        raise InputError(f"input {input_name!r}: no time column {column!r} "
                         f"(columns: {batch.schema.names})")
    array = batch.column(column)
    if array.null_count:
        row = int(pc.index(array.is_null(), True).as_py())
        raise InputError(f"input {input_name!r}: null event time in column {column!r} at row "
                         f"{first_row + row}")
    kind = array.type
    if pa.types.is_timestamp(kind):
        # Floor to whole ms (Spark timestamps are µs; a safe cast to ms would fail on them).
        raw = array.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        if kind.unit == "s":
            return raw * 1000
        return raw // {"ms": 1, "us": 1000, "ns": 1_000_000}[kind.unit]
    elif pa.types.is_date(kind):
        array = array.cast(pa.date64()).cast(pa.int64())
    elif pa.types.is_floating(kind):  # e.g. integers that went through pandas with NaN
        values = array.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        whole = np.isfinite(values) & (values == np.floor(values)) & (np.abs(values) < 2.0**63)
        if not whole.all():
            row = int(np.argmin(whole))
            raise InputError(f"input {input_name!r}: non-integer event time {values[row]!r} in "
                             f"column {column!r} at row {first_row + row}")
        return values.astype(np.int64)
    elif not pa.types.is_integer(kind):
        value = array[0].as_py() if len(array) else None
        raise InputError(f"input {input_name!r}: event time column {column!r} has type {kind}, "
                         f"not an integer or timestamp (row {first_row}: {value!r})")
    return array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


__all__ = ["InputError", "event_times"]
