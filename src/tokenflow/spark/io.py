"""Spark data in and out: ``from_dataframe``, ``to_parquet``, ``collect``.

Source: docs/ARCHITECTURE.md ("Data plane"); ``to_parquet`` is the committing sink of
``tokenflow.io.parquet`` (per-epoch directories swapped in whole, a manifest written last),
re-exported here.  The operators
work on Arrow batches and run on every runtime; on ``spark`` a worker's input is its Spark
partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.operators.capture import Capture, capture
from tokenflow.dataflow.operators.generic import source
from tokenflow.io.parquet import to_parquet
from tokenflow.io.times import InputError, event_times


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


def collect(stream: Any, name: str = "Collect") -> Capture:
    """Keep this worker's records of ``stream`` (for small results): return the handle from the
    worker function and read ``.records()`` / ``.by_time()`` on the driver."""
    return capture(stream, name)


__all__ = ["InputError", "arrow_source", "collect", "event_times", "from_dataframe", "to_parquet"]
