"""The ``manual`` allocator: every message waits until the test delivers it.

Used for randomized-schedule tests.  ``ManualFabric`` has the interface of ``ThreadFabric`` /
``ThreadAllocator`` (``allocator(i)`` gives worker ``i`` an allocator with ``allocate``,
``receive``, ``flush`` and ``park``), but a push does not reach the receiver: it is held in a
pending buffer, per link ``(channel, sender, receiver)`` in FIFO order, until the test calls
``deliver_one(rng)`` (the head message of a randomly chosen non-empty link is delivered, so
messages of one link are never reordered, while messages of different links -- data and
progress, different senders, different channels -- arrive in any interleaving) or
``deliver_all()``.  All workers are meant to be driven from a single thread::

    fabric = ManualFabric(3)
    workers = [Worker(fabric.allocator(i)) for i in range(3)]
    ...
    rng = random.Random(seed)
    while ...:
        if rng.random() < 0.5:
            fabric.deliver_one(rng)
        else:
            rng.choice(workers).step()

Nothing here is thread-safe, and ``park`` never blocks (a single thread drives every worker).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

Link = tuple[int, int, int]
"""``(channel identifier, sender, receiver)``."""


class ManualFabric:
    """The shared state of ``peers`` workers whose messages are delivered by hand.

    Args:
        peers: the number of workers (>= 1).

    Attributes:
        delivered_count: messages delivered so far (for tests and statistics).
        pushed_count: messages pushed so far.
    """

    def __init__(self, peers: int) -> None:
        if peers < 1:
            raise ValueError(f"workers must be >= 1, got {peers}")
        self.peers = peers
        # Delivered messages, waiting for the receiver to pull them.
        self.queues: dict[tuple[int, int], deque[Any]] = {}
        # Channel identifiers that received messages since the receiver's last ``receive()``.
        self.events: list[set[int]] = [set() for _ in range(peers)]
        # Pushed but not yet delivered messages, FIFO per link.
        self.pending: dict[Link, deque[Any]] = {}
        # Links with pending messages, as a list for O(1) random choice (with positions).
        self._links: list[Link] = []
        self._positions: dict[Link, int] = {}
        self._pending_count = 0
        self.pushed_count = 0
        self.delivered_count = 0

    # -- plumbing ------------------------------------------------------------------------------

    def queue(self, identifier: int, worker: int) -> deque[Any]:
        """Worker ``worker``'s queue of delivered messages of channel ``identifier``."""
        key = (identifier, worker)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = deque()
        return q

    def allocator(self, index: int) -> ManualAllocator:
        """Worker ``index``'s allocator."""
        if not 0 <= index < self.peers:
            raise ValueError(f"worker index {index} out of range for {self.peers} workers")
        return ManualAllocator(self, index)

    def push(self, identifier: int, sender: int, receiver: int, message: Any) -> None:
        """Hold ``message`` on its link until it is delivered."""
        link = (identifier, sender, receiver)
        q = self.pending.get(link)
        if q is None:
            q = self.pending[link] = deque()
        if not q:
            self._positions[link] = len(self._links)
            self._links.append(link)
        q.append(message)
        self._pending_count += 1
        self.pushed_count += 1

    # -- delivery ------------------------------------------------------------------------------

    def pending_count(self) -> int:
        """Messages pushed but not yet delivered."""
        return self._pending_count

    def pending_links(self) -> list[Link]:
        """Links with at least one pending message (in no particular order)."""
        return list(self._links)

    def _deliver_head(self, link: Link) -> None:
        q = self.pending[link]
        message = q.popleft()
        if not q:
            # Remove ``link`` from ``_links`` by swapping the last entry into its place.
            pos = self._positions.pop(link)
            last = self._links.pop()
            if last != link:
                self._links[pos] = last
                self._positions[last] = pos
        self._pending_count -= 1
        identifier, _sender, receiver = link
        self.queue(identifier, receiver).append(message)
        self.events[receiver].add(identifier)
        self.delivered_count += 1

    def deliver_one(self, rng: random.Random) -> bool:
        """Deliver the oldest pending message of a link chosen uniformly at random.

        Returns False when nothing was pending.
        """
        if not self._links:
            return False
        self._deliver_head(self._links[rng.randrange(len(self._links))])
        return True

    def deliver_link(self, identifier: int, sender: int, receiver: int) -> bool:
        """Deliver the oldest pending message of one link; False when it has none."""
        link = (identifier, sender, receiver)
        if not self.pending.get(link):
            return False
        self._deliver_head(link)
        return True

    def deliver_all(self) -> int:
        """Deliver every pending message (FIFO per link); returns how many were delivered."""
        n = 0
        while self._links:
            self._deliver_head(self._links[-1])
            n += 1
        return n


class ManualPusher:
    """Pushes into the fabric's pending buffer for one link."""

    __slots__ = ("fabric", "identifier", "sender", "receiver")

    def __init__(self, fabric: ManualFabric, identifier: int, sender: int, receiver: int) -> None:
        self.fabric = fabric
        self.identifier = identifier
        self.sender = sender
        self.receiver = receiver

    def push(self, message: Any) -> None:
        self.fabric.push(self.identifier, self.sender, self.receiver, message)


class ManualPuller:
    """Pulls delivered messages of one channel at one worker."""

    __slots__ = ("queue",)

    def __init__(self, queue: deque[Any]) -> None:
        self.queue = queue

    def pull(self) -> Any | None:
        q = self.queue
        return q.popleft() if q else None


class ManualAllocator:
    """Worker ``index``'s view of a ``ManualFabric`` (the ``ThreadAllocator`` interface)."""

    def __init__(self, fabric: ManualFabric, index: int) -> None:
        self.fabric = fabric
        self.index = index
        self.peers = fabric.peers

    def allocate(self, identifier: int) -> tuple[list[ManualPusher], ManualPuller]:
        """Pushers to every worker (in index order) and this worker's puller for a channel."""
        pushers = [ManualPusher(self.fabric, identifier, self.index, j) for j in range(self.peers)]
        return pushers, ManualPuller(self.fabric.queue(identifier, self.index))

    def receive(self) -> set[int]:
        """Identifiers of channels that had messages delivered since the last call."""
        events = self.fabric.events[self.index]
        out = set(events)
        events.clear()
        return out

    def flush(self) -> None:
        """Nothing to flush: pushes are already in the pending buffer."""

    def park(self, timeout: float) -> None:
        """Return at once: one thread drives every worker, so blocking would deadlock."""

    def wake(self) -> None:
        """Nothing to wake: ``park`` never blocks."""
