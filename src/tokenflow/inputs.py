"""Named tabular inputs of a job, partitioned among its workers.

``execute(fn, workers=W, runtime=..., inputs={"name": table}, sort_by={"name": "col"})`` gives
worker ``i`` the ``i``-th of W partitions of each input as ``worker.inputs["name"]`` (an iterable
of Arrow record batches, sorted by the ``sort_by`` column), read by
``tokenflow.spark.from_dataframe``.  On the ``spark`` runtime the partitions are the Spark
partitions of the DataFrame; here (``thread`` / ``process``) rows are dealt round-robin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def as_table(value: Any, name: str) -> pa.Table:
    """An Arrow table from a ``pa.Table``, ``pa.RecordBatch`` or pandas DataFrame.

    Raises:
        TypeError: for anything else (a Spark DataFrame needs ``runtime="spark"``).
    """
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    if type(value).__module__.startswith("pandas"):
        return pa.Table.from_pandas(value, preserve_index=False)
    raise TypeError(f"input {name!r}: expected an Arrow table or pandas DataFrame, got "
                    f"{type(value).__name__} (Spark DataFrames need runtime='spark')")


def partition_inputs(inputs: dict[str, Any] | None, workers: int,
                     sort_by: dict[str, str] | None = None,
                     batch_rows: int = 65536) -> list[dict[str, list[pa.RecordBatch]]]:
    """Split each input into ``workers`` round-robin partitions, each sorted by its time column.

    Raises:
        KeyError: when a ``sort_by`` column is missing from its input.
    """
    parts: list[dict[str, list[pa.RecordBatch]]] = [{} for _ in range(workers)]
    for name, value in (inputs or {}).items():
        table = as_table(value, name)
        column = (sort_by or {}).get(name)
        if column is not None and column not in table.column_names:
            raise KeyError(f"input {name!r} has no column {column!r} (columns: {table.column_names})")
        for i in range(workers):
            part = table.take(pa.array(np.arange(i, table.num_rows, workers)))
            if column is not None:
                part = part.sort_by([(column, "ascending")])
            parts[i][name] = part.to_batches(max_chunksize=batch_rows)
    return parts
