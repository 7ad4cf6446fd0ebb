"""Timed records: messages whose records carry their own times.

Source: the timestamp-tokens paper §5 (an operator holds tokens at its own granularity and
talks to progress tracking as often as *it* needs to, not once per timestamp); differential
dataflow's update batches (``(data, time, diff)`` sent under a capability ≤ every update's time).

A *timed stream* carries ``(time, record)`` pairs.  Each message's time is ≤ the time of every
pair in it, so a message (one channel push, one progress count) can carry records of many
times; ``InputHandle.send_at`` produces such a stream.  The stream's frontier keeps its meaning
for the pairs' times: a pair at ``t`` travels in a message at or before ``t``, so once an
input's frontier has passed ``t`` no pair at ``t`` can still arrive.  An operator reading a
timed stream therefore learns that a record time is complete exactly as it would for a message
time, and holds a token at or before every time it has buffered:

- with tokens, one ``Capability`` at its least buffered time (``TimedBuffer.least``), sending
  the complete times' output as one timed message under it;
- with notifications (``FrontierNotificator``), one token per distinct buffered time
  (``ref.delayed(t)`` for each new time ``TimedBuffer.add`` reports), each delivered and sent
  separately: a timed stream lowers what the data path pays per timestamp, not what a
  notification does.

The pairs keep their time through every channel: exchange them with ``Exchange(timed_key(key))``
(the key of the record, not of the pair).

The columnar form is an Arrow ``RecordBatch`` with a time column (``TIME_COLUMN``, int64), each
row's time ≥ the message's time (``InputHandle.send_batch_at``); ``TimedBatches`` buffers such
batches and hands over the complete rows, sorted by time, batch-at-a-time.  ``coalesce_times``
turns a stream of per-time Arrow batches (a source's, say) into that form, one message per
activation, so an exchange after it routes and sends once per activation instead of once per
time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.operators.generic import unary
from tokenflow.progress.antichain import MutableAntichain

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream

TIME_COLUMN = "time"
"""The time column of a columnar timed batch (int64)."""


def timed_key(key: Callable[[Any], Any]) -> Callable[[tuple[Any, Any]], Any]:
    """The exchange key of a ``(time, record)`` pair: ``key(record)``."""

    def pair_key(pair: tuple[Any, Any]) -> Any:
        return key(pair[1])

    return pair_key


def least_time(frontiers: Iterable[MutableAntichain]) -> Any:
    """The least time in any of ``frontiers`` (totally ordered times, e.g. ``int``), or None
    when every frontier is empty (all inputs ended): times before it are complete."""
    least: Any = None
    for f in frontiers:
        for t in f.frontier():
            if least is None or t < least:
                least = t
    return least


def coalesce_times(stream: Stream, column: str = TIME_COLUMN,
                   name: str = "CoalesceTimes") -> Stream:
    """The Arrow batches each activation receives, as one columnar timed batch.

    Input: ``pa.RecordBatch``es at integer times (e.g. ms since the Unix epoch); batches of one
    activation may differ in nullability only (they are cast to the first one's schema).
    Output (pipeline, no state): per activation one batch, the input rows in arrival order
    with an int64 column ``column`` appended holding each row's message time, sent at the
    least of those times.  Downstream, an operator finds a row's time in ``column`` and knows
    a time ``t`` complete once its input frontier has passed ``t`` (see the module docstring);
    ``TimedBatches(column)`` buffers such batches.

    Raises (at run time):
        TypeError: a message that is not a ``RecordBatch``, or a time that is not an ``int``
            (naming the operator and the time).
        ValueError: a batch that already has a column named ``column``.
    """

    def constructor(capability: Any, info: Any) -> Any:
        capability.drop()

        def logic(inp: Any, output: Any) -> None:
            parts: list[pa.RecordBatch] = []
            times: list[int] = []
            least: Any = None
            for ref, batch in inp:
                t = ref.time
                if type(batch) is not pa.RecordBatch or type(t) is not int:
                    raise TypeError(f"{name}: needs RecordBatches at int times, got a "
                                    f"{type(batch).__name__} at {t!r}")
                if column in batch.schema.names:
                    raise ValueError(f"{name}: the batch at {t!r} already has a column "
                                     f"{column!r}")
                if batch.num_rows:
                    parts.append(batch)
                    times.append(t)
                    if least is None or t < least.time:
                        least = ref
            if least is None:
                return
            schema = parts[0].schema
            parts = [p if p.schema.equals(schema) else p.cast(schema) for p in parts]
            whole = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
            stamps = np.repeat(np.asarray(times, dtype=np.int64), [p.num_rows for p in parts])
            output.give_batch(least, whole.append_column(column, pa.array(stamps)))

        return logic

    return unary(stream, "pipeline", name, constructor)


class TimedBuffer:
    """Records of a timed stream waiting for their times to complete.

    ``add`` files each ``(time, record)`` pair under its time; ``pop_before(bound)`` returns
    the complete times (``< bound``) least first and ``take(t)`` their records in arrival
    order.  Times must be totally ordered (a heap keeps them; ``int`` epochs, nanoseconds).
    Cost: O(1) per pair plus O(log n) per distinct time.
    """

    __slots__ = ("by_time", "heap")

    def __init__(self) -> None:
        self.by_time: dict[Any, list[Any]] = {}
        self.heap: list[Any] = []

    def add(self, pairs: Iterable[tuple[Any, Any]]) -> list[Any]:
        """Buffer ``pairs``; the times not buffered before, in order of first arrival."""
        by_time = self.by_time
        new: list[Any] = []
        for t, record in pairs:
            held = by_time.get(t)
            if held is None:
                by_time[t] = [record]
                heapq.heappush(self.heap, t)
                new.append(t)
            else:
                held.append(record)
        return new

    def least(self) -> Any:
        """The least buffered time (None when empty)."""
        return self.heap[0] if self.heap else None

    def pop_before(self, bound: Any) -> list[Any]:
        """Remove and return the buffered times ``< bound`` (all when ``bound`` is None), least
        first; their records stay until ``take``."""
        heap = self.heap
        done: list[Any] = []
        while heap and (bound is None or heap[0] < bound):
            done.append(heapq.heappop(heap))
        return done

    def take(self, time: Any) -> list[Any]:
        """Remove and return the records buffered at ``time`` (popped by ``pop_before``).

        Raises:
            KeyError: nothing is buffered at ``time``.
        """
        return self.by_time.pop(time)

    def __len__(self) -> int:
        """The number of distinct buffered times."""
        return len(self.by_time)

    def clear(self) -> None:
        """Drop everything buffered."""
        self.by_time.clear()
        self.heap.clear()


class TimedBatches:
    """Arrow batches of a timed stream (a ``column`` of int64 times) waiting for their times
    to complete, handed over batch-at-a-time.

    ``add`` keeps a batch; ``least`` is the least buffered time; ``take_before(bound)`` removes
    the rows at times ``< bound`` and returns them as one batch sorted by time (stable: rows of
    one time keep their arrival order).  Cost: one vectorized filter and sort over the buffered
    rows per call, nothing per row in Python.
    """

    __slots__ = ("batches", "column", "_least")

    def __init__(self, column: str = TIME_COLUMN) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.column = column
        self._least: int | None = None

    def add(self, batch: pa.RecordBatch) -> int | None:
        """Buffer ``batch`` (empty batches are ignored); the least time in it (None when
        empty)."""
        if batch.num_rows == 0:
            return None
        low = int(np.min(batch.column(self.column).to_numpy()))
        self.batches.append(batch)
        if self._least is None or low < self._least:
            self._least = low
        return low

    def least(self) -> int | None:
        """The least buffered time (None when empty)."""
        return self._least

    def take_before(self, bound: int | None) -> pa.RecordBatch | None:
        """Remove and return the rows at times ``< bound`` (all when None), sorted by time;
        None when there are none."""
        if self._least is None or (bound is not None and self._least >= bound):
            return None
        batches = self.batches
        whole = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        times = whole.column(self.column).to_numpy()
        if bound is None or int(times.max()) < bound:
            done, self.batches, self._least = whole, [], None
        else:
            complete = times < bound
            done = whole.filter(pa.array(complete))
            rest = whole.filter(pa.array(~complete))
            self.batches = [rest]
            self._least = int(np.min(rest.column(self.column).to_numpy()))
        done_times = done.column(self.column).to_numpy()
        if done.num_rows > 1 and bool(np.any(done_times[1:] < done_times[:-1])):
            done = done.take(pa.array(np.argsort(done_times, kind="stable")))
        return done

    def clear(self) -> None:
        """Drop everything buffered."""
        self.batches = []
        self._least = None
