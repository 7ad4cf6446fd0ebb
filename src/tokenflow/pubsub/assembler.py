"""A subscriber's merge of several publisher partitions into whole epochs.  Pure logic, no
sockets (``tokenflow.pubsub.subscriber`` feeds it).

Source: the Strymon publish/subscribe protocol, "Subscriber Logic": wait for every partition's
initial snapshot, merge the upper frontiers into a maximal antichain (the filter) and the lower
frontiers into a minimal one.  An epoch is released when the merged lower frontier has passed
it, that is when every partition completed it, with all of its batches, so a consumer never
sees part of an epoch.  Each partition's frontier counts only after its replay-end marker
(its retained epochs are sent before the marker, each before the frontier that completes it).

Resume: ``position()`` is the merged lower frontier; every epoch not ``≥`` it was released.
After a partition reconnects with ``since = position()``, its batches of unreleased epochs
received before the disconnect are dropped (the publisher sends them again).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tokenflow.pubsub.frontiers import EpochFilter, maximal, minimal, passed


class EpochAssembler:
    """Buffers batches per epoch and partition, releases complete epochs.

    Args:
        partitions: the number of publisher partitions.
    """

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._lower: list[dict[Any, int] | None] = [None] * partitions  # None: not yet counted
        # None: the partition's frontier was not known at its snapshot (the bottom element)
        self._snapshot_lower: list[list[Any] | None] = [None] * partitions
        self._buffer: dict[Any, dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
        self.filter: EpochFilter | None = None
        self.released = 0
        self.finished = False
        self.last_position: list[Any] | None = None
        """The last known merged lower frontier (it stays while a reconnected partition
        replays): a resume position that repeats nothing."""

    # -- joining ----------------------------------------------------------------------------

    @staticmethod
    def join_filter(uppers: list[list[Any]]) -> EpochFilter:
        """The filter of a fresh subscription: drop every epoch ``≤`` a partition's upper
        frontier (or, for ``earliest``, its dropped frontier)."""
        return EpochFilter(maximal(t for upper in uppers for t in upper))

    def snapshot(self, partition: int, lower: list[Any], known: bool = True) -> None:
        """Partition ``partition`` sent its snapshot (again, after a reconnect): its frontier
        counts from its replay-end marker on (``known=False``: from its first frontier update
        after the marker, the publisher having seen none yet); its unreleased batches are
        dropped."""
        self._lower[partition] = None
        self._snapshot_lower[partition] = list(lower) if known else None
        for parts in self._buffer.values():
            parts.pop(partition, None)

    # -- frames -----------------------------------------------------------------------------

    def data(self, partition: int, time: Any, batch: Any) -> None:
        """A batch of ``time`` from ``partition`` (dropped unless the filter passes it)."""
        if self.filter is None or self.filter.passes(time):
            self._buffer[time][partition].append(batch)

    def lower(self, partition: int, updates: list[tuple[Any, int]],
              replayed: bool = False) -> list[tuple[Any, list[Any]]]:
        """A LOWER frame: apply ``updates`` (or, for the replay-end marker, start counting the
        snapshot's frontier); returns the epochs now complete as ``(time, batches)``, oldest
        first (lexicographic order, a linear extension of ``Product``'s order)."""
        counts = self._lower[partition]
        if replayed:
            start = self._snapshot_lower[partition]
            if start is None:
                return []  # counted from the first update on (relative to the empty frontier)
            counts = self._lower[partition] = {t: 1 for t in start}
        if counts is None:
            if self._snapshot_lower[partition] is not None:
                return []  # an update before the replay-end marker: impossible, ignored
            counts = self._lower[partition] = {}
        for time, delta in updates:
            n = counts.get(time, 0) + delta
            if n:
                counts[time] = n
            else:
                counts.pop(time, None)
        return self._release()

    def done(self, partition: int) -> bool:
        """True once ``partition``'s frontier is counted and empty: it sent its whole stream."""
        counts = self._lower[partition]
        return counts is not None and not any(n > 0 for n in counts.values())

    def position(self) -> list[Any] | None:
        """The merged lower frontier (minimal antichain), or None while some partition's
        frontier is not counted yet."""
        if any(c is None for c in self._lower):
            return None
        return minimal(t for c in self._lower if c is not None for t, n in c.items() if n > 0)

    def _release(self) -> list[tuple[Any, list[Any]]]:
        merged = self.position()
        if merged is None:
            return []
        self.last_position = merged
        if self.filter is not None:
            self.filter.relax(merged)
        ready = sorted(t for t in self._buffer if passed(merged, t))
        out = []
        for t in ready:
            parts = self._buffer.pop(t)
            out.append((t, [b for p in sorted(parts) for b in parts[p]]))
        self.released += len(out)
        if not merged:
            self.finished = True
        return out
