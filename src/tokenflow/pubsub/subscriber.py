"""``Subscription``: a plain Python client of a published topic, an iterator of whole epochs.

Source: the Strymon publish/subscribe protocol, "Subscriber Logic" (consult the catalog, connect
to every partition, wait for all initial snapshots, merge them into one filter, release an
epoch once every partition completed it); ``tokenflow.pubsub.assembler`` holds the merge.

Beyond the seed: the filter is sent to the publishers, so dropped epochs never cross the
network; ``start="earliest"`` joins at the oldest epoch the publishers still hold instead of the
next latent one; a partition that disconnects (a slow subscriber, a network fault) is
reconnected with ``since`` = the subscription's position, so no epoch is lost, repeated or cut;
``since=`` resumes a subscription another process left (``position`` tells where).
"""

from __future__ import annotations

import queue
import secrets
import socket
import threading
import time as clock
from collections.abc import Iterator
from typing import Any, NamedTuple

import pyarrow as pa

from tokenflow.pubsub import wire
from tokenflow.pubsub.assembler import EpochAssembler
from tokenflow.pubsub.catalog import lookup
from tokenflow.pubsub.frontiers import EpochFilter, maximal, minimal

RECONNECTS = 5
"""Attempts to reconnect a lost partition (with back-off) before the iterator raises."""


class Epoch(NamedTuple):
    """One complete epoch of a topic: its time and every row of it, over all partitions."""

    time: Any
    batch: pa.RecordBatch

    def to_pandas(self) -> Any:
        """The epoch's rows as a ``pandas.DataFrame``."""
        return self.batch.to_pandas()


def concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch of ``batches`` (same schema)."""
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]  # pragma: no cover


class Snapshot(NamedTuple):
    """The first item of a ``start="snapshot"`` subscription: the latest row per key of every
    epoch not ``≥`` an element of ``as_of`` (``None``, with ``batch`` None, when no epoch was
    complete yet); the epochs after it follow as ``Epoch``s."""

    as_of: list[Any] | None
    batch: pa.RecordBatch | None

    def to_pandas(self) -> Any:
        """The snapshot's rows as a ``pandas.DataFrame`` (empty when there are none)."""
        import pandas as pd

        return pd.DataFrame() if self.batch is None else self.batch.to_pandas()


class _Lost(NamedTuple):
    partition: int
    generation: int
    reason: str
    refused: bool = False  # the publisher refused (e.g. a resume position it no longer holds)


class Subscription:
    """Subscribe to ``topic`` of the job whose catalog is at ``url``; iterate over ``Epoch``s.

    Args:
        url: the catalog, ``tokenflow://host:port``.
        topic: a published topic.
        token: the job's token (default ``$TOKENFLOW_TOKEN``).
        start: ``"latent"`` (the seed: the first epoch no partition had begun when joining),
            ``"earliest"`` (the oldest complete epochs the publishers still retain) or
            ``"snapshot"`` (for a topic published with ``key=``: first a ``Snapshot``, the
            latest row per key as of the frontier all partitions have passed, then every
            later epoch).
        since: resume at this antichain (a ``position`` of an earlier subscription): every
            epoch ``≥`` an element of it, exactly once.
        max_body: largest Arrow body accepted (bytes).
        timeout: seconds to wait for the topic in the catalog and for connections.

    Raises:
        LookupError: the topic is not in the catalog in time.
        wire.AuthenticationError: a wrong token (either side).
        wire.ProtocolError: a publisher broke the protocol, or refused (e.g. a resume position
            older than what it retains).
        ConnectionError: while iterating, a partition stayed unreachable for ``RECONNECTS``
            attempts.
    """

    def __init__(self, url: str, topic: str, token: str | None = None, *, start: str = "latent",
                 since: list[Any] | None = None, max_body: int = wire.MAX_BODY,
                 timeout: float = 30.0, buffer: int = 256) -> None:
        if start not in ("latent", "earliest", "snapshot"):
            raise ValueError(f"start must be 'latent', 'earliest' or 'snapshot', not {start!r}")
        self.url, self.topic = url, topic
        self._token = wire.token_from(token)
        self._timeout = timeout
        self._max_body = max_body
        entry = lookup(url, topic, self._token, timeout)
        self.schema: list[list[str]] | None = entry.get("schema")
        self.time_type: str | None = entry.get("time")
        self._partitions = [(p["host"], p["port"]) for p in entry["partitions"]]
        self._assembler = EpochAssembler(len(self._partitions))
        self._events: queue.Queue[Any] = queue.Queue(maxsize=buffer)
        self._generation = [0] * len(self._partitions)
        self._sockets: list[socket.socket | None] = [None] * len(self._partitions)
        self._closed = False
        self.reconnects = 0
        """Partition connections re-established so far."""
        self._stuck: tuple[Any, int] = (None, 0)  # (position, reconnects at it)
        self._yielding: list[Any] | None = None
        snapshots = [self._connect(p) for p in range(len(self._partitions))]
        self._snapshot: dict[int, Any] | None = None  # partition -> its part, while pending
        self._as_of: list[Any] | None = None
        at = None
        if since is not None:
            filt = EpochFilter([], list(since))
        elif start == "snapshot" and all(s["known"] for s in snapshots):
            at = self._as_of = minimal(t for s in snapshots for t in s["lower"])
            filt = EpochFilter([], list(at))
            self._snapshot = {}
        else:  # a snapshot of nothing yet complete is empty: join at the earliest epoch
            key = "upper" if start == "latent" else "dropped"
            filt = EpochFilter(maximal(t for s in snapshots for t in s[key]))
            if start == "snapshot":
                self._snapshot = {p: None for p in range(len(snapshots))}
        self._assembler.filter = filt
        for p, snap in enumerate(snapshots):
            self._start(p, snap, filt, at)

    @property
    def partitions(self) -> int:
        return len(self._partitions)

    @property
    def position(self) -> list[Any] | None:
        """Where this subscription stands: every epoch not ``≥`` an element was delivered
        (None until every partition's frontier is known); pass it as ``since=`` to resume.
        While epochs released together are being yielded, it names the next of them."""
        if self._yielding is not None:
            return self._yielding
        return self._assembler.last_position

    # -- connections -------------------------------------------------------------------------

    def _connect(self, p: int) -> dict[str, Any]:
        host, port = self._partitions[p]
        sock = socket.create_connection((host, port), timeout=self._timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _, hello, _ = wire.receive(sock, (wire.HELLO,))
            if hello.get("role") != "publisher" or hello.get("topic") != self.topic \
                    or hello.get("partition") != p:
                raise wire.ProtocolError(f"{host}:{port} is not partition {p} of {self.topic!r} "
                                         f"({wire.shown(hello)})")
            nonce = secrets.token_bytes(wire.NONCE_SIZE)
            wire.send(sock, wire.SUBSCRIBE, {"mac": wire.mac(self._token, "subscribe",
                                                             wire.field(hello, "nonce", bytes, "HELLO")),
                                             "nonce": nonce, "topic": self.topic})
            kind, meta, _ = wire.receive(sock, (wire.SNAPSHOT, wire.REFUSED))
            if kind == wire.REFUSED:
                raise wire.AuthenticationError(f"partition {p} of {self.topic!r} refused: "
                                               f"{meta.get('reason')}")
            wire.check_mac(self._token, "publisher", nonce, meta)
            snap: dict[str, Any] = {k: wire.decode_antichain(meta.get(k))
                                    for k in ("lower", "upper", "dropped")}
            snap["known"] = bool(meta.get("known", True))
        except BaseException:
            sock.close()
            raise
        self._sockets[p] = sock
        return snap

    def _start(self, p: int, snap: dict[str, Any], filt: EpochFilter,
               snapshot_at: list[Any] | None = None) -> None:
        sock = self._sockets[p]
        assert sock is not None
        self._assembler.snapshot(p, snap["lower"], snap["known"])
        wire.send(sock, wire.FILTER, {
            "drop_upto": wire.encode_antichain(filt.drop_upto),
            "since": None if filt.since is None else wire.encode_antichain(filt.since),
            "snapshot_at": None if snapshot_at is None else wire.encode_antichain(snapshot_at)})
        sock.settimeout(None)
        generation = self._generation[p]
        threading.Thread(target=self._read, args=(p, sock, generation), daemon=True,
                         name=f"tokenflow-subscribe-{self.topic}-{p}").start()

    def _read(self, p: int, sock: socket.socket, generation: int) -> None:
        try:
            while True:
                kind, meta, body = wire.receive(sock, (wire.DATA, wire.LOWER, wire.BYE, wire.REFUSED),
                                                self._max_body)
                if kind == wire.DATA and "snapshot" in meta:
                    event: Any = (p, generation, "snapshot", wire.decode_batch(body) if body else None)
                elif kind == wire.DATA:
                    event = (p, generation, wire.decode_time(meta.get("time")),
                             wire.decode_batch(body))
                elif kind == wire.LOWER:
                    updates = meta.get("updates")
                    if not isinstance(updates, list):
                        raise wire.ProtocolError("LOWER without updates")
                    event = (p, generation, [(wire.decode_time(u[0]), _delta(u)) for u in updates],
                             bool(meta.get("replayed")))
                elif kind == wire.REFUSED:
                    self._events.put(_Lost(p, generation, str(meta.get("reason")), refused=True))
                    return
                else:
                    raise ConnectionError(f"BYE: {meta.get('reason')}")
                self._events.put(event)
        except (OSError, ConnectionError, wire.ProtocolError) as exc:
            if not self._closed:
                self._events.put(_Lost(p, generation, f"{type(exc).__name__}: {exc}"))

    def _reconnect(self, lost: _Lost) -> None:
        p = lost.partition
        if self._snapshot is not None and p not in self._snapshot:
            self.close()
            raise ConnectionError(f"partition {p} of {self.topic!r} was lost before it sent its "
                                  f"part of the snapshot ({lost.reason}); subscribe again")
        old = self._sockets[p]
        if old is not None:
            old.close()
        self._generation[p] += 1
        assembler = self._assembler
        assert assembler.filter is not None
        filt = EpochFilter(list(assembler.filter.drop_upto), assembler.last_position)
        at, count = self._stuck
        self._stuck = (filt.since, count + 1 if at == filt.since else 1)
        if self._stuck[1] > RECONNECTS:
            self.close()
            raise ConnectionError(f"partition {p} of {self.topic!r} disconnected {RECONNECTS + 1} "
                                  f"times at position {filt.since} ({lost.reason}): this subscriber "
                                  f"reads slower than the topic is published")
        error: Exception | None = None
        for attempt in range(RECONNECTS):
            try:
                snap = self._connect(p)
                self._start(p, snap, filt)
                self.reconnects += 1
                return
            except wire.AuthenticationError:
                raise
            except (OSError, wire.ProtocolError) as exc:
                error = exc
                clock.sleep(min(0.1 * 2 ** attempt, 2.0))
        host, port = self._partitions[p]
        raise ConnectionError(f"partition {p} of {self.topic!r} at {host}:{port} lost "
                              f"({lost.reason}) and not reconnected: {error}")

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Epoch | Snapshot]:
        assembler = self._assembler
        while not assembler.finished:
            event = self._events.get()
            if isinstance(event, _Lost):
                if assembler.done(event.partition) and not event.refused:
                    continue  # a partition that completed its stream may say BYE early
                if event.refused:
                    self.close()
                    raise wire.ProtocolError(f"partition {event.partition} of {self.topic!r} "
                                             f"refused: {event.reason}")
                if event.generation == self._generation[event.partition] and not assembler.finished:
                    self._reconnect(event)
                continue
            p, generation = event[0], event[1]
            if generation != self._generation[p]:
                continue  # from a connection given up
            if isinstance(event[2], str):  # this partition's part of the snapshot
                assert self._snapshot is not None
                self._snapshot[p] = event[3]
                continue
            if isinstance(event[3], pa.RecordBatch):
                assembler.data(p, event[2], event[3])
                continue
            ready = assembler.lower(p, event[2], event[3])
            if self._snapshot is not None and assembler.position() is not None:
                parts = [b for b in self._snapshot.values() if b is not None]
                self._snapshot = None
                yield Snapshot(self._as_of, concat(parts) if parts else None)
            for i, (time, batches) in enumerate(ready):
                self._yielding = minimal([t for t, _ in ready[i + 1:]] + (assembler.last_position or []))
                yield Epoch(time, concat(batches))
            self._yielding = None
        self.close()

    def epochs(self, limit: int | None = None) -> list[Epoch | Snapshot]:
        """The next ``limit`` items (all, until the stream ends, when None)."""
        out = []
        for epoch in self:
            out.append(epoch)
            if limit is not None and len(out) >= limit:
                break
        return out

    def close(self) -> None:
        """Disconnect from every partition."""
        self._closed = True
        for s in self._sockets:
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _delta(update: Any) -> int:
    if not isinstance(update, (list, tuple)) or len(update) != 2 or update[1] not in (1, -1):
        raise wire.ProtocolError(f"malformed frontier update {wire.shown(update)}")
    return int(update[1])


def subscribe(url: str, topic: str, token: str | None = None, **options: Any) -> Subscription:
    """``Subscription(url, topic, token, **options)``."""
    return Subscription(url, topic, token, **options)
