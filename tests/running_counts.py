"""Oracle for running per-key counts (shared by the rescaling tests): what a per-key counting
fold emits, computed with a plain ``Counter``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any


def running_counts(epochs: Iterable[Iterable[Hashable]]) -> dict[int, Counter[Any]]:
    """Per epoch index, the multiset of ``(key, running count)`` a fold emitting one record
    per input key emits: counts continue across epochs; within an epoch any order of the
    records gives the same multiset."""
    counts: Counter[Hashable] = Counter()
    out: dict[int, Counter[Any]] = {}
    for e, keys in enumerate(epochs):
        emitted: Counter[Any] = Counter()
        for key, n in Counter(keys).items():
            for i in range(1, n + 1):
                emitted[(key, counts[key] + i)] += 1
            counts[key] += n
        out[e] = emitted
    return out
