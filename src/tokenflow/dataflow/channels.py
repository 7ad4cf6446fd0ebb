"""Channels and pacts: how messages ``(time, batch)`` move from an output to an input.

Source: docs/ARCHITECTURE.md ("Data plane"); timely's ``dataflow/channels``.  A *batch* is a Python
``list`` of records or a ``pyarrow.RecordBatch``; its size (``len``) is what progress tracking
counts.  A *pact* (parallelization contract) says where each record of a batch goes:
``Pipeline`` keeps it on this worker, ``Exchange`` routes it to the worker chosen by a stable
hash of its key, ``Broadcast`` sends it to every worker.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tokenflow.dataflow.routing import KeyRouter, partition_batch
from tokenflow.state.bins import RoutingTable

Message = tuple[Any, Any]
"""``(time, batch)``."""


class Push(Protocol):
    def push(self, message: Any) -> None: ...


class Pull(Protocol):
    def pull(self) -> Any | None: ...


class ChannelHost(Protocol):
    """What a pact needs from the worker: identifiers, allocation, activation and the job's
    routing table (bin -> worker)."""

    index: int
    peers: int
    routing: RoutingTable | None

    def allocate(self, identifier: int, path: tuple[int, ...]) -> tuple[list[Push], Pull]: ...

    def activate(self, path: tuple[int, ...]) -> None: ...


class LocalQueue:
    """An in-worker FIFO; pushing activates the consuming operator."""

    __slots__ = ("_queue", "_activate", "_path")

    def __init__(self, activate: Callable[[tuple[int, ...]], None], path: tuple[int, ...]) -> None:
        self._queue: deque[Any] = deque()
        self._activate = activate
        self._path = path

    def push(self, message: Any) -> None:
        self._queue.append(message)
        self._activate(self._path)

    def pull(self) -> Any | None:
        return self._queue.popleft() if self._queue else None


class Tee:
    """Fans a stream's messages out to every connected channel.

    With several consumers each gets its own shallow copy of a ``list`` batch, so one consumer
    cannot disturb another (Arrow batches are immutable and shared).
    """

    __slots__ = ("pushers", "replayable")

    def __init__(self) -> None:
        self.pushers: list[Push] = []
        self.replayable = True
        """Whether a message pushed here means the same when a restored job pushes it again
        at another worker count (an aligned checkpoint's channel state,
        ``tokenflow.dataflow.channel_state``): False once a consumer's pact says otherwise
        (``Pact.replayable``)."""

    def add_pusher(self, pusher: Push) -> None:
        self.pushers.append(pusher)

    def push(self, message: Message) -> None:
        pushers = self.pushers
        if len(pushers) == 1:
            pushers[0].push(message)
            return
        time, batch = message
        for i, pusher in enumerate(pushers):
            if i and isinstance(batch, list):
                pusher.push((time, list(batch)))
            else:
                pusher.push(message)


class Pact(Protocol):
    """Connects a stream to an operator input: returns ``(pusher, puller)``.

    A pact may set ``replayable = False`` (default True when absent): its messages depend on
    the worker count (``WatermarkPact``'s copies name their sender and are dealt one per
    worker), so a message across an aligned checkpoint's cut cannot be stored as channel
    state; such a crossing makes the cut inconsistent and the checkpoint is taken again."""

    name: str

    def connect(self, host: ChannelHost, identifier: int, path: tuple[int, ...]) -> tuple[Push, Pull]: ...


class Pipeline:
    """Records stay on the worker that produced them."""

    name = "Pipeline"

    def connect(self, host: ChannelHost, identifier: int, path: tuple[int, ...]) -> tuple[Push, Pull]:
        queue = LocalQueue(host.activate, path)
        return queue, queue


EAGER_RECORDS = 4096
"""Batches of at least this many records are sent to other workers before this worker's own
part is split off (see ``ExchangePusher``)."""


class ExchangePusher:
    """Splits each batch by the route of its records (key -> bin -> owner in ``table``; with
    no table, ``routes_for`` over the pushers: a direct hash, kept for comparisons) and pushes
    each part to its worker.

    With ``local`` (this worker's index) and ``flush`` (sends what is buffered for other
    workers), a batch of ``EAGER_RECORDS`` or more has the other workers' parts split and
    sent first, then its own part split: the peers start on their parts while this worker
    builds and processes its own (the order timely's exchange gets by sending each full
    buffer at once).  Sending sooner keeps each connection's order, so progress is safe."""

    __slots__ = ("pushers", "key", "column", "router", "table", "local", "flush")

    def __init__(self, pushers: Sequence[Push], key: Any, column: str | None,
                 table: RoutingTable | None = None, local: int | None = None,
                 flush: Callable[[], None] | None = None) -> None:
        self.pushers = list(pushers)
        self.key = key
        self.column = column
        self.table = table
        self.router = KeyRouter(key, table if table is not None else len(self.pushers))
        self.local = local
        self.flush = flush

    def push(self, message: Message) -> None:
        time, batch = message
        pushers = self.pushers
        if len(pushers) == 1:
            pushers[0].push(message)
            return
        eager = self.flush if len(batch) >= EAGER_RECORDS else None
        for worker, part in partition_batch(batch, len(pushers), self.key, self.column,
                                             self.router, self.table, self.local, eager):
            pushers[worker].push((time, part))


class Exchange:
    """Route each record to the owner of its key's bin in the job's ``RoutingTable``
    (``bin = top log2(S) bits of stable_hash(key)``; see ``tokenflow.dataflow.routing`` and
    ``tokenflow.state.bins``: the same bin on every runtime, in every process and at every
    worker count).

    Args:
        key: ``record -> key`` for list batches (ints and strings hash stably across
            processes; Python's salted ``hash()`` is never used); None routes by the record.
        column: for Arrow batches, the name of the key column (hashed vectorized).
    """

    name = "Exchange"

    def __init__(self, key: Callable[[Any], Any] | None = None, column: str | None = None) -> None:
        self.key = key
        self.column = column

    def connect(self, host: ChannelHost, identifier: int, path: tuple[int, ...]) -> tuple[Push, Pull]:
        pushers, puller = host.allocate(identifier, path)
        return ExchangePusher(pushers, self.key, self.column, getattr(host, "routing", None),
                              getattr(host, "index", None), getattr(host, "flush", None)), puller


class BroadcastPusher:
    """Pushes every message to each worker of ``host.roster`` (read at every push, so the
    copies follow workers joining and leaving; every worker slot when the host has none)."""

    __slots__ = ("pushers", "host")

    def __init__(self, pushers: Sequence[Push], host: Any = None) -> None:
        self.pushers = list(pushers)
        self.host = host

    def push(self, message: Message) -> None:
        time, batch = message
        roster = getattr(self.host, "roster", None)
        targets = self.pushers if roster is None else [self.pushers[j] for j in roster]
        for i, pusher in enumerate(targets):
            pusher.push((time, list(batch)) if i and isinstance(batch, list) else message)


class Broadcast:
    """Every record goes to every worker.

    Each record sent arrives ``peers`` times in total, which ``copies`` tells progress
    tracking (the edge's weight).
    """

    name = "Broadcast"

    @staticmethod
    def copies(peers: int) -> int:
        return peers

    def connect(self, host: ChannelHost, identifier: int, path: tuple[int, ...]) -> tuple[Push, Pull]:
        pushers, puller = host.allocate(identifier, path)
        return BroadcastPusher(pushers, host), puller


def as_pact(pact: Any) -> Any:
    """Accept a pact object, ``"pipeline"``, ``"broadcast"``, or a key function (exchange)."""
    if pact is None or pact == "pipeline":
        return Pipeline()
    if pact == "broadcast":
        return Broadcast()
    if callable(pact) and not hasattr(pact, "connect"):
        return Exchange(pact)
    if isinstance(pact, str):
        raise ValueError(f"unknown pact {pact!r} (use 'pipeline', 'broadcast' or Exchange(...))")
    return pact
