"""The ``thread`` allocator: W workers in one process, messages passed by reference.

Source: docs/ARCHITECTURE.md ("Execution model": the ``thread`` runtime); timely's
``communication/allocator/thread.rs`` and ``process.rs``.  Every (channel, receiver) pair has a
FIFO; a push appends to it, records the channel in the receiver's event queue and wakes the
receiver if it is parked.  ``collections.deque`` appends and pops are atomic under the GIL.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class WorkerAborted(RuntimeError):
    """Another worker of the job failed; this one stops."""


class ThreadFabric:
    """The shared state of ``peers`` in-process workers."""

    def __init__(self, peers: int) -> None:
        if peers < 1:
            raise ValueError(f"workers must be >= 1, got {peers}")
        self.peers = peers
        self.queues: dict[tuple[int, int], deque[Any]] = {}
        self.events: list[deque[int]] = [deque() for _ in range(peers)]
        self.conditions = [threading.Condition() for _ in range(peers)]
        self.parked = [False] * peers
        self.woken = [False] * peers  # ``wake`` called: the next park returns at once
        self.error: tuple[int, BaseException] | None = None
        self._lock = threading.Lock()

    def queue(self, identifier: int, worker: int) -> deque[Any]:
        key = (identifier, worker)
        q = self.queues.get(key)
        if q is None:
            with self._lock:
                q = self.queues.setdefault(key, deque())
        return q

    def deliver(self, identifier: int, sender: int, receiver: int, message: Any) -> None:
        """Append ``message`` to the receiver's FIFO for ``identifier`` and wake it."""
        self.queue(identifier, receiver).append(message)
        self.events[receiver].append(identifier)
        if self.parked[receiver]:
            cond = self.conditions[receiver]
            with cond:
                cond.notify()

    def wake(self, worker: int) -> None:
        """From any thread: end ``worker``'s current or next ``park`` at once."""
        cond = self.conditions[worker]
        with cond:
            self.woken[worker] = True
            cond.notify()

    def abort(self, worker: int, error: BaseException) -> None:
        """Record the first failure and wake everyone so they stop."""
        with self._lock:
            if self.error is None:
                self.error = (worker, error)
        for cond in self.conditions:
            with cond:
                cond.notify_all()

    def allocator(self, index: int) -> ThreadAllocator:
        return ThreadAllocator(self, index)


class ThreadPusher:
    __slots__ = ("fabric", "identifier", "sender", "receiver")

    def __init__(self, fabric: ThreadFabric, identifier: int, sender: int, receiver: int) -> None:
        self.fabric = fabric
        self.identifier = identifier
        self.sender = sender
        self.receiver = receiver

    def push(self, message: Any) -> None:
        self.fabric.deliver(self.identifier, self.sender, self.receiver, message)


class ThreadPuller:
    __slots__ = ("queue",)

    def __init__(self, queue: deque[Any]) -> None:
        self.queue = queue

    def pull(self) -> Any | None:
        q = self.queue
        return q.popleft() if q else None


class ThreadAllocator:
    """Worker ``index``'s view of a ``ThreadFabric``."""

    def __init__(self, fabric: ThreadFabric, index: int) -> None:
        self.fabric = fabric
        self.index = index
        self.peers = fabric.peers

    def allocate(self, identifier: int) -> tuple[list[ThreadPusher], ThreadPuller]:
        """Pushers to every worker (in index order) and this worker's puller for a channel."""
        pushers = [ThreadPusher(self.fabric, identifier, self.index, j) for j in range(self.peers)]
        return pushers, ThreadPuller(self.fabric.queue(identifier, self.index))

    def receive(self) -> set[int]:
        """Identifiers of channels that received messages since the last call.

        Raises:
            WorkerAborted: when another worker failed.
        """
        if self.fabric.error is not None:
            worker, error = self.fabric.error
            if worker != self.index:
                raise WorkerAborted(f"worker {worker} failed: {error!r}")
        events = self.fabric.events[self.index]
        out: set[int] = set()
        while events:
            out.add(events.popleft())
        return out

    def flush(self) -> None:
        """Nothing is buffered in-process."""

    def park(self, timeout: float) -> None:
        """Sleep until a message arrives, ``wake`` is called or ``timeout`` seconds pass."""
        i = self.index
        fabric = self.fabric
        cond = fabric.conditions[i]
        with cond:
            fabric.parked[i] = True  # set before looking, so a concurrent delivery wakes us
            try:
                if not (fabric.events[i] or fabric.error is not None or fabric.woken[i]):
                    cond.wait(timeout)
            finally:
                fabric.parked[i] = False
                fabric.woken[i] = False

    def wake(self) -> None:
        """From any thread: end this worker's current or next ``park`` at once."""
        self.fabric.wake(self.index)
