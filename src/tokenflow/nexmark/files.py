"""Read NEXMark events from Parquet: the datasets ``tokenflow nexmark generate`` writes.

Source: docs/NEXMARK.md (field names); ``tokenflow.nexmark.generator.SCHEMAS``.

``read_events(directory)`` reads ``directory/person``, ``directory/auction`` and
``directory/bid`` (each a Parquet file or a directory of them, as Spark or
``write_parquet`` writes) into Arrow tables with exactly the generator's schemas, sorted by
``dateTime`` (ms since the Unix epoch).  Anything else is an ``InputError`` that names the path,
and for bad values the column and row.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from tokenflow.nexmark.generator import KINDS, SCHEMAS
from tokenflow.spark.io import InputError, event_times


def read_kind(directory: str | os.PathLike[str], kind: str) -> pa.Table:
    """``directory/kind`` as a table with ``SCHEMAS[kind]`` (columns in that order, integer
    columns cast to int64), sorted by ``dateTime`` (stable).

    Raises:
        InputError: the path does not exist or is not readable Parquet; a column is missing or
            has a type that cannot be cast losslessly to the schema's; a ``dateTime`` is null
            (naming the row in file order).
    """
    path = os.path.join(os.fspath(directory), kind)
    if not os.path.exists(path):
        raise InputError(f"no {kind} events at {path!r}: expected {', '.join(KINDS)} under "
                         f"{os.fspath(directory)!r} (as `tokenflow nexmark generate` writes)")
    try:
        table = ds.dataset(path, format="parquet").to_table()
    except (OSError, pa.ArrowException) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"cannot read Parquet dataset {path!r}: {reason}") from exc
    schema = SCHEMAS[kind]
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            raise InputError(f"{path!r}: no column {field.name!r} (columns: {table.column_names})")
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)  # safe cast: int32 -> int64 ok, lossy casts raise
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InputError(f"{path!r}: column {field.name!r} has type {column.type}, "
                                 f"expected {field.type}") from exc
        columns.append(column)
    table = pa.Table.from_arrays(columns, schema=schema)
    values = event_times(table, "dateTime", path, 0)  # raises on a null, naming the row
    if len(values) > 1 and (np.diff(values) < 0).any():
        table = table.take(np.argsort(values, kind="stable"))
    return table.combine_chunks()


def read_events(directory: str | os.PathLike[str]) -> dict[str, pa.Table]:
    """``{"person", "auction", "bid"}`` tables from ``directory`` (see ``read_kind``).

    Raises:
        InputError: see ``read_kind``.
    """
    return {kind: read_kind(directory, kind) for kind in KINDS}


def worker_share(table: pa.Table, worker: int, peers: int) -> pa.RecordBatch:
    """Rows ``worker, worker + peers, ...`` of ``table`` as one record batch (a round-robin share
    keeps each worker's rows spread over the whole event-time range, in order)."""
    part = table.take(np.arange(worker, table.num_rows, peers, dtype=np.int64)).combine_chunks()
    batches = part.to_batches()  # one batch: the columns are single chunks
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


__all__ = ["read_events", "read_kind", "worker_share"]
