"""``publish``: serve a stream's partition on this worker to any number of subscribers.

Source: the Strymon publish/subscribe protocol ("Publisher Logic"); beyond it, retention for
late joiners and reconnects, publisher-side filtering and bounded per-subscriber queues
(``tokenflow.pubsub.log``).  Every worker serves its own partition (partition = worker index),
registered in the job's catalog (``tokenflow.pubsub.catalog``).

A subscriber's connection (``tokenflow.pubsub.wire`` frames)::

    publisher -> HELLO {"role": "publisher", "nonce": Ns, "topic", "partition", "partitions", "time"}
    client    -> SUBSCRIBE {"mac": MAC(token, "subscribe", Ns), "nonce": Nc, "topic"}
    publisher -> SNAPSHOT {"mac": MAC(token, "publisher", Nc), "lower", "upper", "dropped"}
    client    -> FILTER {"drop_upto": antichain, "since": antichain | None}
    publisher -> DATA / LOWER frames (first the retained epochs that pass the filter, then a
                 LOWER {"updates": [], "replayed": true} marker, then live), BYE at the end

The job never waits for a subscriber: the worker only appends frames to queues; one thread per
subscriber writes them.  A subscriber more than ``max_queue`` bytes behind is disconnected and
resumes from its own lower frontier.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time as clock
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tokenflow.pubsub import wire
from tokenflow.pubsub.catalog import request
from tokenflow.pubsub.compaction import KeyedCompaction
from tokenflow.pubsub.frontiers import EpochFilter
from tokenflow.pubsub.log import DEFAULT_MAX_QUEUE, DEFAULT_RETAIN, PartitionLog, ResumeRefused, Subscriber
from tokenflow.pubsub.server import Endpoint

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream

log = logging.getLogger("tokenflow.pubsub")

LINGER = 5.0
"""Seconds a finished publisher waits for its subscribers' queues to drain before closing."""


class Publisher:
    """One partition's server: a ``PartitionLog`` behind an ``Endpoint``.

    Args:
        topic, partition, partitions: what is served.
        token: what subscribers must hold.
        host, port: where to listen.
        retain_bytes, max_queue: see ``PartitionLog``.
        key: key columns of an upsert stream: subscribers may then join with a snapshot of
            the latest row per key (``tokenflow.pubsub.compaction``).
    """

    def __init__(self, topic: str, partition: int, partitions: int, token: str,
                 host: str = "127.0.0.1", port: int = 0, retain_bytes: int = DEFAULT_RETAIN,
                 max_queue: int = DEFAULT_MAX_QUEUE, key: list[str] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.partitions = partitions
        self.time_type: str | None = None
        self._token = token
        self.log = PartitionLog(retain_bytes, max_queue, self._overflow,
                                KeyedCompaction(key) if key else None)
        self.disconnected = 0
        """Subscribers disconnected for being too slow."""
        self.endpoint = Endpoint(f"publisher {topic}/{partition}",
                                 {"role": "publisher", "topic": topic, "partition": partition,
                                  "partitions": partitions}, self._handle, host, port)
        self.address = self.endpoint.address

    def register(self, url: str, time_type: str | None = None,
                 schema: list[list[str]] | None = None, host: str | None = None) -> None:
        """Register this partition in the catalog at ``url`` (``time_type``: ``"int"``,
        ``"product"`` or None while unknown; ``schema`` as ``[[name, type], ...]``), advertised
        at ``host`` (default: the address this process reaches the catalog from).

        Raises:
            wire.AuthenticationError / wire.ProtocolError / OSError: see ``catalog.request``.
        """
        request(url, self._token, wire.REGISTER, lambda local: {
            "topic": self.topic, "partition": self.partition, "partitions": self.partitions,
            "host": host or local, "port": self.address[1], "time": time_type, "schema": schema})

    def _overflow(self, sub: Subscriber) -> None:
        self.disconnected += 1
        log.warning("publisher %s/%d: subscriber %s is more than %d bytes behind; disconnected "
                    "(it resumes from its lower frontier)", self.topic, self.partition, sub.name,
                    self.log.max_queue)

    def _handle(self, sock: socket.socket, nonce: bytes, peer: str) -> None:
        _, meta, _ = wire.receive(sock, (wire.SUBSCRIBE,))
        wire.check_mac(self._token, "subscribe", nonce, meta)
        client_nonce = wire.field(meta, "nonce", bytes, "SUBSCRIBE")
        topic = wire.field(meta, "topic", str, "SUBSCRIBE")
        if topic != self.topic:
            raise wire.ProtocolError(f"this publisher serves {self.topic!r}, not {wire.shown(topic)}")
        snap, sub, mark = self.log.join(peer)
        try:
            wire.send(sock, wire.SNAPSHOT, {
                "mac": wire.mac(self._token, "publisher", client_nonce),
                "lower": wire.encode_antichain(snap.lower), "upper": wire.encode_antichain(snap.upper),
                "dropped": wire.encode_antichain(snap.dropped),
                "known": snap.known})
            _, request_, _ = wire.receive(sock, (wire.FILTER,))
            since, at = request_.get("since"), request_.get("snapshot_at")
            filt = EpochFilter(wire.decode_antichain(request_.get("drop_upto", [])),
                               None if since is None else wire.decode_antichain(since))
            try:
                self.log.start(sub, mark, filt, None if at is None else wire.decode_antichain(at))
            except ResumeRefused as exc:
                raise wire.ProtocolError(f"cannot resume: {exc}") from None
            sock.settimeout(WRITE_POLL)
            self._pump(sock, sub, peer)
        finally:
            self.log.leave(sub)
            if sub.refusal is not None:  # refused by the log (its REFUSED frame is queued)
                self.endpoint.refuse(peer, sub.refusal)

    def _pump(self, sock: socket.socket, sub: Subscriber, peer: str) -> None:
        while True:
            frames = sub.take(0.5)
            if frames is None:
                if sub.overflowed:
                    sock.shutdown(socket.SHUT_RDWR)
                return
            if frames:
                send_frames(sock, frames, lambda: sub.overflowed)
                sub.sent_frames += len(frames)
            sub.sending = False
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:  # a subscriber sends nothing after FILTER: EOF, or a stray frame
                if sock.recv(1, socket.MSG_PEEK):
                    self.endpoint.refuse(peer, "a frame after FILTER", sock)
                return

    def data(self, time: Any, batch: pa.RecordBatch) -> None:
        """Publish ``batch`` at ``time``."""
        self.log.data(time, wire.frame(wire.DATA, {"time": wire.encode_time(time)},
                                       wire.encode_batch(batch)))

    def advance(self, frontier: list[Any]) -> None:
        """The published stream's frontier is now ``frontier``."""
        self.log.advance(frontier)

    def finish(self, linger: float = LINGER, expect: int = 0) -> None:
        """Wait up to ``linger`` s for subscribers to receive what is queued (and, with
        ``expect``, for that many subscribers to have joined at all), then close."""
        deadline = clock.monotonic() + linger
        while clock.monotonic() < deadline and (self.log.started < expect or any(
                not s.drained() for s in self.log.subscribers)):
            clock.sleep(0.01)
        self.log.close()  # queues a BYE for each subscriber
        while clock.monotonic() < deadline and self.endpoint.connections:
            clock.sleep(0.01)  # each writer sends its BYE, then its connection ends
        self.endpoint.close()


COALESCE_BYTES = 64 * 1024
"""Frames smaller than this are joined into one write; larger ones are written as they are."""
WRITE_POLL = 1.0
"""Seconds a blocked write waits before it checks whether its subscriber was disconnected: a
subscriber that stops reading is dropped by its queue bound (``max_queue``), counted and
logged, never by a socket timeout."""


def _write(sock: socket.socket, data: bytes, give_up: Callable[[], bool]) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except TimeoutError:
            if give_up():
                raise ConnectionError("subscriber disconnected while a write was blocked") from None


def send_frames(sock: socket.socket, frames: list[bytes],
                give_up: Callable[[], bool] = lambda: False) -> None:
    """Write ``frames`` in order: small ones joined (fewer system calls), large ones directly
    (no copy of a large backlog).  A write blocked by a full socket buffer keeps waiting
    (``sock``'s timeout is a polling period) until ``give_up()`` says the subscriber was
    disconnected.

    Raises:
        ConnectionError / OSError: the connection failed, or ``give_up()``.
    """
    small: list[bytes] = []
    size = 0
    for frame in frames:
        if len(frame) >= COALESCE_BYTES:
            if small:
                _write(sock, b"".join(small), give_up)
                small, size = [], 0
            _write(sock, frame, give_up)
            continue
        small.append(frame)
        size += len(frame)
        if size >= COALESCE_BYTES:
            _write(sock, b"".join(small), give_up)
            small, size = [], 0
    if small:
        _write(sock, b"".join(small), give_up)


def _record_batches(batch: Any, columns: list[str] | None) -> list[pa.RecordBatch]:
    """A stream batch as Arrow record batches: Arrow as is; a list of dicts by key; a list of
    tuples with ``columns``; a list of scalars as one column ``value``."""
    if isinstance(batch, pa.RecordBatch):
        return [batch]
    if isinstance(batch, pa.Table):
        return batch.combine_chunks().to_batches()
    records = list(batch)
    if not records:
        return []
    first = records[0]
    if isinstance(first, dict):
        return [pa.RecordBatch.from_pylist(records)]
    if isinstance(first, tuple) and columns is not None:
        if len(columns) != len(first):
            raise ValueError(f"{len(columns)} columns {columns} for records of {len(first)} fields")
        return [pa.RecordBatch.from_arrays([pa.array(list(c)) for c in zip(*records, strict=True)], columns)]
    if isinstance(first, tuple):
        raise ValueError("tuple records need column names: publish(topic, columns=[...])")
    return [pa.RecordBatch.from_arrays([pa.array(records)], ["value"])]


def publish(stream: Stream, topic: str, *, columns: list[str] | None = None,
            catalog: tuple[str, int, str] | None = None, host: str | None = None,
            retain_bytes: int = DEFAULT_RETAIN, max_queue: int = DEFAULT_MAX_QUEUE,
            linger: float = LINGER, expect: int = 0, key: list[str] | None = None,
            name: str | None = None) -> Publisher:
    """Publish ``stream`` as ``topic``: this worker serves its partition (partition = worker
    index of ``peers``) and registers it in the job's catalog.

    Batches: Arrow record batches or tables as they are; ``list`` batches of dicts, of tuples
    (named by ``columns``) or of scalars (one column ``value``) are converted.  Every batch must
    have the first batch's schema.  Times: ``int`` or ``Product``.

    Args:
        catalog: ``(host, port, token)`` of the catalog (default: the job's, from
            ``execute(..., catalog=...)``).
        host: the address to listen on (default: the address this worker reaches the catalog
            from, so subscribers on other hosts can connect).
        retain_bytes: bytes of complete epochs kept for late joiners and reconnects.
        max_queue: bytes queued for one subscriber before it is disconnected as too slow.
        linger: seconds the finished stream's publisher waits for subscribers to drain.
        expect: subscribers the finished stream's publisher waits for to join (within
            ``linger``) before it closes, so that ones known to come late (``start="earliest"``)
            still get the retained stream.
        key: the key columns of an upsert stream (each row replaces the key's earlier row):
            subscribers may then join with ``start="snapshot"``, receiving the latest row per
            key as of the frontier every partition has passed, then every later epoch.

    Returns:
        This worker's ``Publisher`` (``address``, ``disconnected``, ``log.frames``).

    Raises:
        ValueError: no catalog; at run time, a batch that cannot be converted, another schema
            than the first batch's, or a time that is neither ``int`` nor ``Product`` (the
            message names the operator, the time and the batch).
    """
    from tokenflow.dataflow.operators.generic import sink

    op = name or f"Publish[{topic}]"
    catalog = catalog or getattr(stream.scope.worker, "catalog", None)
    if catalog is None:
        raise ValueError(f"{op}: publishing needs the job's catalog: run the job with "
                         f"execute(..., catalog=Catalog().endpoint) or `tokenflow run --publish`")
    cat_host, cat_port, token = catalog
    url = f"tokenflow://{cat_host}:{cat_port}"
    index, peers = stream.scope.worker_index, stream.scope.peers
    loopback = cat_host in ("127.0.0.1", "localhost", "::1")
    publisher = Publisher(topic, index, peers, token,
                          host or ("127.0.0.1" if loopback else "0.0.0.0"),
                          retain_bytes=retain_bytes, max_queue=max_queue, key=key)
    schema: list[pa.Schema] = []

    def register(time_type: str | None, fields: list[list[str]] | None) -> None:
        publisher.register(url, time_type, fields, host)

    register(None, None)
    finished = False

    def logic(inp: Any) -> None:
        nonlocal finished
        for ref, batch in inp:
            time = ref.time
            try:
                for rb in _record_batches(batch, columns):
                    if not schema:
                        schema.append(rb.schema)
                        publisher.time_type = wire.time_kind(time)
                        threading.Thread(target=register, daemon=True, args=(
                            publisher.time_type,
                            [[f.name, str(f.type)] for f in rb.schema])).start()
                    elif rb.schema != schema[0]:
                        rb = rb.cast(schema[0])
                    publisher.data(time, rb)
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise ValueError(f"{op} on worker {index}: cannot publish the batch at time "
                                 f"{time!r} ({wire.shown(batch, 120)}): {exc}") from exc
        frontier = inp.frontier.frontier()
        publisher.advance(frontier)
        if not frontier and not finished:
            finished = True
            publisher.finish(linger, expect)

    sink(stream, "pipeline", op, logic)
    return publisher
