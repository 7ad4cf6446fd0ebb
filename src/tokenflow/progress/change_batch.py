"""``ChangeBatch``: a collection of ``(key, diff)`` updates, compacted lazily.

Source: progress-tracking-notes.md ("SharedProgress"); timely's ``progress/change_batch.rs``.
Updates are appended (O(1)); the batch consolidates (sums diffs per key, drops zeros) only when
asked for its contents or when it holds more than twice as many entries as after the last
consolidation, so a hot loop of updates costs a list append each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")


class ChangeBatch(Generic[K]):
    """A lazily consolidated multiset of ``key → diff`` (diff an ``int``, may be negative)."""

    __slots__ = ("_updates", "_clean")

    def __init__(self, updates: Iterable[tuple[K, int]] | None = None) -> None:
        self._updates: list[tuple[K, int]] = []
        self._clean = 0
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
        if self._updates:
            other._updates.extend(self._updates)
            other._maintain()
            self._updates = []
            self._clean = 0

    def clear(self) -> None:
        self._updates = []
        self._clean = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeBatch):
            return NotImplemented
        return dict(self.iter()) == dict(other.iter())

    def __repr__(self) -> str:
        return f"ChangeBatch({self.iter()!r})"
