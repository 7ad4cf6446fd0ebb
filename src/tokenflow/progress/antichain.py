"""``Antichain`` and ``MutableAntichain``: frontiers of partially ordered elements.

Source: notes on timely-dataflow's ``progress/`` ("Per-Port Information"); timely's
``progress/frontier.rs``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from tokenflow.order.partial_order import less_equal, less_than
from tokenflow.progress.change_batch import ChangeBatch


class Antichain:
    """A set of mutually incomparable elements: the minimal elements inserted so far.

    Elements are timestamps or path summaries (anything with the partial order of
    :mod:`tokenflow.order`).  An empty antichain is the "done" frontier: nothing is ≥ it.
    """

    __slots__ = ("_elements",)

    def __init__(self, elements: Iterable[Any] = ()) -> None:
        self._elements: list[Any] = []
        for e in elements:
            self.insert(e)

    @staticmethod
    def from_elem(element: Any) -> Antichain:
        a = Antichain()
        a._elements.append(element)
        return a

    def insert(self, element: Any) -> bool:
        """Insert ``element`` unless some element is ≤ it; remove elements it is ≤ to.

        Returns True when the antichain changed.
        """
        for e in self._elements:
            if less_equal(e, element):
                return False
        self._elements = [e for e in self._elements if not less_equal(element, e)]
        self._elements.append(element)
        return True

    def extend(self, elements: Iterable[Any]) -> bool:
        changed = False
        for e in elements:
            changed |= self.insert(e)
        return changed

    def less_equal(self, time: Any) -> bool:
        """True when some element is ≤ ``time`` (``time`` is at or beyond this frontier)."""
        return any(less_equal(e, time) for e in self._elements)

    def less_than(self, time: Any) -> bool:
        """True when some element is < ``time``."""
        return any(less_than(e, time) for e in self._elements)

    def dominates(self, other: Antichain) -> bool:
        """True when every element of ``other`` is ≥ some element of ``self``."""
        return all(self.less_equal(t) for t in other._elements)

    def elements(self) -> list[Any]:
        return list(self._elements)

    def is_empty(self) -> bool:
        return not self._elements

    def __iter__(self) -> Iterator[Any]:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Antichain):
            return NotImplemented
        return sorted(self._elements) == sorted(other._elements)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._elements)))

    def __repr__(self) -> str:
        return f"Antichain({sorted(self._elements)!r})"


class MutableAntichain:
    """Counts per element plus the frontier of elements with positive count.

    ``update_iter`` applies ``(time, diff)`` updates (counts may go transiently negative; only
    positive counts shape the frontier) and returns the frontier's changes as ``(time, ±1)``.
    Source: timely's ``MutableAntichain``.

    For integer times (a total order) a min-heap of the times that became positive finds the
    next frontier element in O(log n), so holding many pending times stays cheap; partially
    ordered times rebuild the frontier from all positive counts.
    """

    __slots__ = ("_counts", "_frontier", "_heap")

    def __init__(self) -> None:
        self._counts: dict[Any, int] = {}
        self._frontier: list[Any] = []
        # Times that became positive (lazily pruned); None once a non-int time was seen.
        self._heap: list[int] | None = []

    @staticmethod
    def new_bottom(bottom: Any) -> MutableAntichain:
        """A mutable antichain holding ``bottom`` once."""
        m = MutableAntichain()
        m._counts[bottom] = 1
        m._frontier.append(bottom)
        m._became_positive(bottom)
        return m

    def _became_positive(self, time: Any) -> None:
        heap = self._heap
        if heap is not None:
            if time.__class__ is int:
                heapq.heappush(heap, time)
            else:
                self._heap = None

    def frontier(self) -> list[Any]:
        """The minimal elements with positive count (a fresh list)."""
        return list(self._frontier)

    def is_empty(self) -> bool:
        """True when the frontier is empty."""
        return not self._frontier

    def less_equal(self, time: Any) -> bool:
        """True when some frontier element is ≤ ``time`` (checked for every message received:
        ``int`` elements compared inline)."""
        for f in self._frontier:
            if (f <= time) if f.__class__ is int else f.less_equal(time):
                return True
        return False

    def less_than(self, time: Any) -> bool:
        """True when some frontier element is < ``time``."""
        for f in self._frontier:
            if (f < time) if f.__class__ is int else f.less_than(time):
                return True
        return False

    def count_for(self, time: Any) -> int:
        """The accumulated count of ``time`` (not of times ≤ it)."""
        return self._counts.get(time, 0)

    def positive(self) -> list[Any]:
        """Every element with a positive count, not only the minimal ones (unordered)."""
        return [t for t, c in self._counts.items() if c > 0]

    def update_iter(self, updates: Iterable[tuple[Any, int]]) -> list[tuple[Any, int]]:
        """Apply ``updates``; return the changes to the frontier as ``(time, +1 | -1)``.

        Example: ``MutableAntichain.new_bottom(1).update_iter([(1, -1), (2, 7)])`` returns
        ``[(1, -1), (2, 1)]`` and leaves the frontier ``[2]``.
        """
        counts = self._counts
        frontier = self._frontier
        rebuild = False
        for time, diff in updates:
            if not diff:
                continue
            old = counts.get(time, 0)
            count = old + diff
            if count:
                counts[time] = count
            else:
                del counts[time]
            if count > 0 >= old:
                self._became_positive(time)
            if rebuild:
                continue
            if diff > 0:
                # A newly positive time moves the frontier unless it is already dominated.
                if count > 0 and not any(less_equal(f, time) for f in frontier):
                    rebuild = True
            elif count <= 0 and time in frontier:
                # A frontier element lost its last count.
                rebuild = True
        return self._rebuild() if rebuild else []

    def _rebuild(self) -> list[tuple[Any, int]]:
        heap = self._heap
        old = self._frontier
        if heap is not None:  # int times: the frontier is the least positive time, if any
            counts = self._counts
            while heap and counts.get(heap[0], 0) <= 0:
                heapq.heappop(heap)
            if not heap:
                self._frontier = []
                return [(old[0], -1)] if old else []
            least = heap[0]
            if old and old[0] == least:
                return []
            self._frontier = [least]
            return [(old[0], -1), (least, 1)] if old else [(least, 1)]
        new_frontier = self._minimal_positive()
        self._frontier = new_frontier
        if old == new_frontier:
            return []
        changes = [(t, -1) for t in old if t not in new_frontier]
        changes.extend((t, 1) for t in new_frontier if t not in old)
        return changes

    def _minimal_positive(self) -> list[Any]:
        positive = [t for t, c in self._counts.items() if c > 0]
        new_frontier: list[Any] = []
        if positive:
            positive.sort()  # a total order extending the partial order
            for t in positive:
                if not any(less_equal(f, t) for f in new_frontier):
                    new_frontier.append(t)
        return new_frontier

    def update(self, time: Any, diff: int) -> list[tuple[Any, int]]:
        """Apply one update; same result as ``update_iter([(time, diff)])``, faster."""
        if not diff:
            return []
        counts = self._counts
        old = counts.get(time, 0)
        count = old + diff
        if count:
            counts[time] = count
        else:
            del counts[time]
        frontier = self._frontier
        if diff > 0:
            if old > 0 or count <= 0:
                return []
            heap = self._heap
            if heap is not None and time.__class__ is int:  # int times: one least element
                heapq.heappush(heap, time)
                if not frontier:
                    self._frontier = [time]
                    return [(time, 1)]
                least = frontier[0]
                if least <= time:
                    return []
                self._frontier = [time]
                return [(least, -1), (time, 1)]
            self._became_positive(time)
            for f in frontier:
                if less_equal(f, time):
                    return []
            # A new minimal element: it replaces the frontier elements it is below.
            removed = [f for f in frontier if less_equal(time, f)]
            if removed:
                self._frontier = [f for f in frontier if f not in removed]
                self._frontier.append(time)
            else:
                frontier.append(time)
            changes = [(f, -1) for f in removed]
            changes.append((time, 1))
            return changes
        if old > 0 and count <= 0 and time in frontier:
            return self._rebuild()
        return []

    def __repr__(self) -> str:
        return f"MutableAntichain(frontier={sorted(self._frontier)!r})"


def frontier_changes(batch: ChangeBatch[Any], antichain: MutableAntichain) -> ChangeBatch[Any]:
    """Apply ``batch`` to ``antichain`` and return its frontier changes as a ``ChangeBatch``."""
    return ChangeBatch(antichain.update_iter(batch.drain()))
