"""``ChangeBatch``: a collection of ``(key, diff)`` updates, always consolidated.

Source: notes on timely-dataflow's ``progress/`` ("SharedProgress"); timely's
``progress/change_batch.rs``.  Timely appends updates and consolidates lazily; here the batch is
a ``dict`` of non-zero totals, updated in place: one lookup and one store (or delete) per update
costs less in Python than an append now and a re-hash of every entry at each consolidation
later, and the batch never holds more entries than keys with a non-zero total.

A batch belongs to one thread (its worker's): ``update`` and the readers are not thread-safe.
Another thread may only call ``defer``, which queues an update on a ``collections.deque``
(whose ``append`` is atomic); the owner folds queued updates in before it reads the batch
(``drain_into``, ``drain``, ``iter``, ``is_empty``, ...).  A ``Capability`` garbage collected on
another worker's thread releases itself this way.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")

_DEFER_LOCK = threading.Lock()
"""Guards the lazy creation of a batch's ``_deferred`` queue (taken at most once per batch)."""


class ChangeBatch(Generic[K]):
    """A multiset of ``key → diff`` (diff an ``int``, may be negative), zero totals dropped.

    ``_updates`` is the ``dict`` of non-zero totals (its truth value: "anything here", apart
    from deferred updates).
    """

    __slots__ = ("_updates", "_deferred")

    def __init__(self, updates: Iterable[tuple[K, int]] | None = None) -> None:
        self._updates: dict[K, int] = {}
        self._deferred: deque[tuple[K, int]] | None = None  # updates from other threads
        if updates is not None:
            self.extend(updates)

    @staticmethod
    def new_from(key: K, diff: int) -> ChangeBatch[K]:
        """A batch holding the single update ``(key, diff)``."""
        batch: ChangeBatch[K] = ChangeBatch()
        batch.update(key, diff)
        return batch

    def update(self, key: K, diff: int) -> None:
        """Add ``diff`` to the count of ``key``."""
        if diff:
            updates = self._updates
            count = updates.get(key, 0) + diff
            if count:
                updates[key] = count
            else:
                del updates[key]

    def defer(self, key: K, diff: int) -> None:
        """Queue ``(key, diff)`` from any thread; the owner applies it at its next read.

        Thread-safe (unlike ``update``): the update goes to a ``deque`` created on first use,
        never to the dict the owner is working on.
        """
        if not diff:
            return
        deferred = self._deferred
        if deferred is None:
            with _DEFER_LOCK:
                deferred = self._deferred
                if deferred is None:
                    deferred = self._deferred = deque()
        deferred.append((key, diff))

    def _absorb(self) -> None:
        """Apply deferred updates (owner thread only)."""
        deferred = self._deferred
        if deferred:  # None or an empty deque: nothing to do
            pop = deferred.popleft
            while True:
                try:
                    key, diff = pop()
                except IndexError:  # emptied (another thread may still append later)
                    break
                self.update(key, diff)

    def extend(self, updates: Iterable[tuple[K, int]]) -> None:
        """Add every ``(key, diff)`` of ``updates``."""
        counts = self._updates
        get = counts.get
        for key, diff in updates:
            if diff:
                count = get(key, 0) + diff
                if count:
                    counts[key] = count
                else:
                    del counts[key]

    def compact(self) -> None:
        """Apply deferred updates (the batch is otherwise always consolidated)."""
        if self._deferred:
            self._absorb()

    def is_empty(self) -> bool:
        """True when every key's total is zero."""
        if self._deferred:
            self._absorb()
        return not self._updates

    def __len__(self) -> int:
        """Number of keys with a non-zero total."""
        self.compact()
        return len(self._updates)

    def __bool__(self) -> bool:
        return not self.is_empty()

    def __iter__(self) -> Iterator[tuple[K, int]]:
        """The ``(key, diff)`` pairs, without draining."""
        return iter(self.iter())

    def iter(self) -> list[tuple[K, int]]:
        """The ``(key, diff)`` pairs as a list, without draining."""
        self.compact()
        return list(self._updates.items())

    def drain(self) -> list[tuple[K, int]]:
        """Remove and return the ``(key, diff)`` pairs (totals, none zero)."""
        if self._deferred:
            self._absorb()
        out = list(self._updates.items())
        self._updates = {}
        return out

    def drain_into(self, other: ChangeBatch[K]) -> None:
        """Move every update of ``self`` into ``other`` (hands over the dict when ``other``
        holds nothing)."""
        if self._deferred:
            self._absorb()
        if self._updates:
            if other._updates:
                other.extend(self._updates.items())
                self._updates = {}
            else:
                other._updates, self._updates = self._updates, other._updates

    def clear(self) -> None:
        """Forget the applied updates (deferred ones, not yet applied, stay queued)."""
        self._updates = {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeBatch):
            return NotImplemented
        return dict(self.iter()) == dict(other.iter())

    def __repr__(self) -> str:
        return f"ChangeBatch({self.iter()!r})"
