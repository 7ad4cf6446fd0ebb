"""``FrontierNotificator``: Naiad-style notifications as a library idiom on tokens.

Source: the timestamp-tokens paper §4 ("We have implemented Naiad notifications in library
operator logic"); timely's ``dataflow/operators/generic/notificator.rs``.  The notificator
holds a token per requested time and hands it back, in time order, once no input frontier is
≤ that time (no more data at or before it can arrive).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokenflow.dataflow.capability import Capability
from tokenflow.order.partial_order import less_equal
from tokenflow.progress.antichain import MutableAntichain


class FrontierNotificator:
    """Pending notifications, delivered once the given input frontiers pass their times.

    Args:
        frontiers: the input frontiers to watch (an operator's ``input.frontier`` objects).
    """

    def __init__(self, frontiers: Sequence[MutableAntichain]) -> None:
        self.frontiers = list(frontiers)
        self.pending: list[Capability] = []
        self.available: list[Capability] = []

    def notify_at(self, capability: Capability) -> None:
        """Request a notification at ``capability.time``; the notificator now owns the token."""
        self.pending.append(capability)

    def _complete(self, time: Any) -> bool:
        return not any(f.less_equal(time) for f in self.frontiers)

    def make_available(self) -> None:
        """Move pending tokens whose times are complete to the (sorted, deduplicated) queue."""
        if not self.pending:
            return
        keep: list[Capability] = []
        ready: list[Capability] = []
        for cap in self.pending:
            (ready if self._complete(cap.time) else keep).append(cap)
        self.pending = keep
        if ready:
            ready.extend(self.available)
            ready.sort(key=lambda c: c.time)
            dedup: list[Capability] = []
            for cap in ready:
                if dedup and dedup[-1].time == cap.time:
                    cap.drop()
                else:
                    dedup.append(cap)
            self.available = dedup

    def next(self) -> Capability | None:
        """The least complete notification's token, or None."""
        if not self.available:
            self.make_available()
        if self.available:
            return self.available.pop(0)
        return None

    def for_each(self, fn: Callable[[Capability, FrontierNotificator], None]) -> None:
        """Call ``fn(capability, self)`` for every complete notification, in time order.

        The token is dropped after ``fn`` returns unless ``fn`` kept a copy.
        """
        while True:
            cap = self.next()
            if cap is None:
                return
            fn(cap, self)
            cap.drop()

    def pending_times(self) -> list[Any]:
        return sorted(c.time for c in self.pending)

    def frontier_passed(self, time: Any) -> bool:
        """True when no watched frontier is ≤ ``time``."""
        return self._complete(time)

    def is_dominated(self, time: Any) -> bool:
        return any(less_equal(c.time, time) for c in self.pending)
