"""``ChangeBatch``: a collection of ``(key, diff)`` updates, compacted lazily.

Source: notes on timely-dataflow's ``progress/`` ("SharedProgress"); timely's
``progress/change_batch.rs``.  Updates are appended (O(1)); the batch consolidates (sums diffs
per key, drops zeros) only when asked for its contents or when it holds more than twice as many
entries as after the last consolidation, so a hot loop of updates costs a list append each.

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
    """A lazily consolidated multiset of ``key → diff`` (diff an ``int``, may be negative)."""

    __slots__ = ("_updates", "_clean", "_deferred")

    def __init__(self, updates: Iterable[tuple[K, int]] | None = None) -> None:
        self._updates: list[tuple[K, int]] = []
        self._clean = 0
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
            updates.append((key, diff))
            n = len(updates)  # ``_maintain`` inlined: this is the progress hot path
            if n > 32 and n >> 1 >= self._clean:
                self.compact()

    def defer(self, key: K, diff: int) -> None:
        """Queue ``(key, diff)`` from any thread; the owner applies it at its next read.

        Thread-safe (unlike ``update``): the update goes to a ``deque`` created on first use,
        never to the list the owner is working on.
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
        """Move deferred updates into the batch (owner thread only)."""
        deferred = self._deferred
        if deferred:  # None or an empty deque: nothing to do
            pop = deferred.popleft
            append = self._updates.append
            while True:
                try:
                    append(pop())
                except IndexError:  # emptied (another thread may still append later)
                    break

    def extend(self, updates: Iterable[tuple[K, int]]) -> None:
        """Add every ``(key, diff)`` of ``updates``."""
        self._updates.extend(u for u in updates if u[1])
        self._maintain()

    def _maintain(self) -> None:
        n = len(self._updates)
        if n > 32 and n >> 1 >= self._clean:
            self.compact()

    def compact(self) -> None:
        """Consolidate: one entry per key with a non-zero total."""
        if self._deferred:
            self._absorb()
        n = len(self._updates)
        if n <= 1:  # zero diffs are never stored, so one update is already consolidated
            self._clean = n
            return
        acc: dict[K, int] = {}
        get = acc.get
        for key, diff in self._updates:
            acc[key] = get(key, 0) + diff
        self._updates = [(k, d) for k, d in acc.items() if d]
        self._clean = len(self._updates)

    def is_empty(self) -> bool:
        """True when every key's total is zero."""
        if self._deferred:
            self._absorb()
        if self._clean == len(self._updates):
            return self._clean == 0
        self.compact()
        return not self._updates

    def __len__(self) -> int:
        """Number of keys with a non-zero total (consolidates)."""
        self.compact()
        return len(self._updates)

    def __bool__(self) -> bool:
        return not self.is_empty()

    def __iter__(self) -> Iterator[tuple[K, int]]:
        """The consolidated ``(key, diff)`` pairs, without draining."""
        self.compact()
        return iter(list(self._updates))

    def iter(self) -> list[tuple[K, int]]:
        """The consolidated ``(key, diff)`` pairs as a list, without draining."""
        self.compact()
        return list(self._updates)

    def drain(self) -> list[tuple[K, int]]:
        """Remove and return the consolidated ``(key, diff)`` pairs."""
        self.compact()
        out = self._updates
        self._updates = []
        self._clean = 0
        return out

    def drain_into(self, other: ChangeBatch[K]) -> None:
        """Move every update of ``self`` into ``other`` (without consolidating first)."""
        if self._deferred:
            self._absorb()
        if self._updates:
            other._updates.extend(self._updates)
            other._maintain()
            self._updates = []
            self._clean = 0

    def clear(self) -> None:
        """Forget the applied updates (deferred ones, not yet applied, stay queued)."""
        self._updates = []
        self._clean = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeBatch):
            return NotImplemented
        return dict(self.iter()) == dict(other.iter())

    def __repr__(self) -> str:
        return f"ChangeBatch({self.iter()!r})"
