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
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from tokenflow.progress.antichain import MutableAntichain


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
