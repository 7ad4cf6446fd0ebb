"""Spark data in and out: ``from_dataframe``, ``to_parquet``, ``collect``.

Source: the issue "Spark runtime" (items 3–4), DESIGN.md ("Data plane": per-epoch Parquet files
with atomic rename, so re-running an epoch overwrites instead of duplicating).  The operators
work on Arrow batches and run on every runtime; on ``spark`` a worker's input is its Spark
partition.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenflow.dataflow.operators.capture import Capture, capture
from tokenflow.dataflow.operators.generic import sink, source


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


def arrow_source(scope: Any, batches: Iterable[pa.RecordBatch], time: str, name: str = "ArrowSource",
                 lateness: int = 0, max_rows: int = 65536) -> Any:
    """A stream of Arrow batches timestamped by the event-time column ``time``.

    Each output message holds the rows of one time.  The input must be sorted by ``time``, or
    out of order by at most ``lateness`` time units; the source holds a token at
    ``max(time seen) - lateness`` (the input frontier advances as the partition is consumed)
    and drops it at the end.  At most ``max_rows`` rows are read per activation.

    Raises:
        InputError: a null or non-integer time, a record later than the declared lateness
            allows (checked per row, whatever the batch boundaries), or a time before the
            first epoch 0 (naming input, column, row and value).
    """

    def constructor(cap: Any, info: Any) -> Any:
        it: Iterator[pa.RecordBatch] = iter(batches)
        state = {"row": 0, "max": None}
        pending: list[pa.RecordBatch] = []
        token = [cap]

        def next_batch() -> pa.RecordBatch | None:
            if pending:
                return pending.pop()
            for batch in it:
                if batch.num_rows > max_rows:
                    parts = [batch.slice(o, max_rows) for o in range(0, batch.num_rows, max_rows)]
                    pending.extend(reversed(parts[1:]))
                    return parts[0]
                if batch.num_rows:
                    return batch
            return None

        metrics = getattr(scope.worker, "metrics", {})

        def logic(output: Any) -> None:
            cap = token[0]
            if cap is None:
                return
            batch = next_batch()
            if batch is None:
                cap.drop()
                token[0] = None
                return
            first = state["row"]
            state["row"] = first + batch.num_rows
            metrics["records_in"] = metrics.get("records_in", 0) + batch.num_rows
            times = event_times(batch, time, name, first)
            # Per row, the latest time seen so far (this batch and earlier ones): a row more
            # than ``lateness`` behind it is an error, wherever the batch boundaries fall.
            latest_so_far = np.maximum.accumulate(times)
            if state["max"] is not None:
                latest_so_far = np.maximum(latest_so_far, state["max"])
            late = np.flatnonzero(times < latest_so_far - lateness)
            if len(late):
                row = int(late[0])
                if lateness == 0:
                    raise InputError(
                        f"input {name!r}: column {time!r} is not sorted at row {first + row}: "
                        f"{times[row]} after {latest_so_far[row]} (declare lateness= to allow this)")
                raise InputError(
                    f"input {name!r}: column {time!r} at row {first + row} has value "
                    f"{int(times[row])}, more than lateness={lateness} behind the latest time "
                    f"{int(latest_so_far[row])}")
            if int(times.min()) < cap.time:  # only before the first time (e.g. negative times)
                row = int(np.argmin(times))
                raise InputError(
                    f"input {name!r}: column {time!r} at row {first + row} has value "
                    f"{int(times[row])}, before the source's first time {cap.time}")
            if lateness:
                order = np.argsort(times, kind="stable")
                if (order != np.arange(len(order))).any():
                    batch = batch.take(pa.array(order))
                    times = times[order]
            bounds = np.flatnonzero(np.diff(times)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [len(times)]))
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                output.give_batch(cap, batch.slice(s, e - s), time=int(times[s]))
            latest = int(times[-1]) if state["max"] is None else max(state["max"], int(times[-1]))
            state["max"] = latest
            target = latest - lateness
            if target > cap.time:
                cap.downgrade(target)
            info.activate()

        return logic

    return source(scope, name, constructor)


def from_dataframe(scope: Any, input: str, time: str, lateness: int = 0,
                   max_rows: int = 65536) -> Any:
    """The stream of this worker's partition of the job input ``input``, timed by ``time``.

    Pass the DataFrame (or Arrow table) to ``execute(..., inputs={input: df},
    sort_by={input: time})``; worker ``i`` reads partition ``i``.  Times: integer columns as
    they are, timestamps as ms since the Unix epoch.

    Raises:
        KeyError: when the job has no input of that name.
        InputError: see ``arrow_source``.
    """
    inputs = getattr(scope.worker, "inputs", None) or {}
    if input not in inputs:
        raise KeyError(f"job has no input {input!r} (inputs: {sorted(inputs)}); pass "
                       f"inputs={{{input!r}: dataframe}} to execute()")
    return arrow_source(scope, inputs[input], time, input, lateness, max_rows)


def _as_table(batches: list[Any], columns: list[str] | None, name: str) -> pa.Table:
    if all(isinstance(b, (pa.RecordBatch, pa.Table)) for b in batches):
        tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in batches]
        return pa.concat_tables(tables)
    rows = [r for b in batches for r in b]
    if rows and isinstance(rows[0], dict):
        return pa.Table.from_pylist(rows)
    if columns is None:
        raise TypeError(f"{name}: records are {type(rows[0]).__name__}, give columns=[...] names")
    return pa.Table.from_arrays([pa.array(list(c)) for c in zip(*rows, strict=True)], names=columns)


def to_parquet(stream: Any, path: str | os.PathLike[str], columns: list[str] | None = None,
               name: str = "ToParquet", granularity: int | None = None,
               partition: str = "time") -> None:
    """Write each completed epoch as ``path/<partition>=<t>/worker-<i>.parquet`` (atomic rename).

    Batches may be Arrow batches, lists of dicts, or lists of tuples (with ``columns``).  A file
    appears only when the input frontier has passed its epoch; re-running an epoch replaces the
    file rather than adding a duplicate.  ``spark.read.parquet(path)`` reads the dataset, with
    ``partition`` (default ``time``) as a partition column.

    With ``granularity`` (integer times only), the records of times ``[b, b + granularity)``
    go to one file per worker in ``<partition>=<b>`` (``b`` a multiple of ``granularity``),
    written once the frontier passes ``b + granularity - 1``: fewer, larger files when the
    stream's times are finer than the epochs a reader cares about.

    Raises:
        ValueError: ``granularity <= 0``.
        TypeError: records without names (tuples) and no ``columns``; a non-integer time with
            ``granularity`` (raised by the operator, naming it and the time).
    """
    if granularity is not None and granularity <= 0:
        raise ValueError(f"{name}: granularity must be > 0, got {granularity}")
    root = os.fspath(path)
    worker = stream.scope.worker_index

    def bin_of(t: Any) -> Any:
        if granularity is None:
            return t
        if not isinstance(t, int):
            raise TypeError(f"{name}: granularity needs integer times, got time {t!r}")
        return t - t % granularity

    def make() -> Any:
        pending: dict[Any, list[Any]] = {}

        def logic(inp: Any) -> None:
            for ref, batch in inp:
                pending.setdefault(bin_of(ref.time), []).append(batch)
            for b in sorted(pending):
                last = b if granularity is None else b + granularity - 1
                if inp.frontier.less_equal(last):
                    break
                table = _as_table(pending.pop(b), columns, name)
                directory = os.path.join(root, f"{partition}={b}")
                os.makedirs(directory, exist_ok=True)
                final = os.path.join(directory, f"worker-{worker:05d}.parquet")
                tmp = f"{final}.{uuid.uuid4().hex}.tmp"
                pq.write_table(table, tmp)
                os.replace(tmp, final)

        return logic

    sink(stream, "pipeline", name, make())


def collect(stream: Any, name: str = "Collect") -> Capture:
    """Keep this worker's records of ``stream`` (for small results): return the handle from the
    worker function and read ``.records()`` / ``.by_time()`` on the driver."""
    return capture(stream, name)
