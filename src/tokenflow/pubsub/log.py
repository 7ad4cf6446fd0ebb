"""One publisher partition's view of its stream: lower and upper frontiers, the retained recent
frames, and what each connected subscriber is owed.  Pure logic, no sockets (the server in
``tokenflow.pubsub.publisher`` moves the bytes).

Source: the Strymon publish/subscribe protocol, "Publisher Logic" (a progress message updates
the lower frontier and is broadcast; a data batch updates the upper frontier and is broadcast;
a new subscriber gets a snapshot of both first).  Beyond the seed:

* **retention**: frames are kept, oldest first, until they exceed ``retain_bytes`` *and* their
  epoch is complete; ``dropped`` is the maximal antichain of the epochs whose frames were let go.
  A subscriber may then join at the earliest held epoch (filter ``drop_upto = dropped``) or
  resume after a disconnect from its own lower frontier (``since``), exactly-once, as long as no
  epoch ``≥`` that position was let go;
* **publisher-side filtering**: each subscriber's ``EpochFilter`` is applied here, so epochs it
  would drop never cross the network;
* **bounded queues**: a subscriber whose queued bytes exceed ``max_queue`` is disconnected
  (``Subscriber.overflowed``) instead of slowing the job; it resumes from its frontier.

Joining is two steps, as a subscriber of several partitions must merge their snapshots before
it can name its filter: ``join()`` returns the snapshot and queues everything after it
unfiltered; ``start(filter)`` then replays the retained frames before the snapshot that pass the
filter, a replay-end marker, and the queued frames, filtered.  Frames are not pruned while a
subscriber is between the two steps.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenflow.pubsub import wire
from tokenflow.pubsub.compaction import KeyedCompaction, as_batch
from tokenflow.pubsub.frontiers import EpochFilter, UpperFrontier, passed

log = logging.getLogger("tokenflow.pubsub")

DEFAULT_RETAIN = 64 * 1024 * 1024
"""Bytes of complete epochs a partition keeps for late joiners and reconnects."""
DEFAULT_MAX_QUEUE = 64 * 1024 * 1024
"""Bytes queued for one subscriber before it is disconnected as too slow."""


@dataclass
class Snapshot:
    """The seed's ``InitialFrontierSnapshot`` plus what retention let go."""

    lower: list[Any]
    upper: list[Any]
    dropped: list[Any]
    known: bool = True
    """False before the stream's first frontier reached the publisher: ``lower`` is then the
    unknown bottom element (no epoch is complete), not the empty frontier."""


class ResumeRefused(ValueError):
    """The subscriber's resume position needs epochs this partition no longer holds."""


class Subscriber:
    """What one connection is owed: a queue of frames (bytes) and its filter.

    The sending side calls ``take(timeout)`` and writes what it gets; ``None`` means closed.
    """

    def __init__(self, name: str, max_queue: int, on_overflow: Callable[[Subscriber], None]) -> None:
        self.name = name
        self.filter: EpochFilter | None = None  # None: between join() and start()
        self.overflowed = False
        self.closed = False
        self.refusal: str | None = None
        self.sending = False
        """True while the writer holds frames taken but not yet written."""
        self.sent_frames = 0
        self._max_queue = max_queue
        self._on_overflow = on_overflow
        self._queue: collections.deque[bytes] = collections.deque()
        self._pending: list[tuple[Any, bytes]] = []  # (time or None for LOWER, frame)
        self._bytes = 0
        self._cond = threading.Condition()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def _put(self, data: bytes, counted: bool = True) -> None:
        """Queue ``data``; ``counted=False`` for frames replayed from retention (they are the
        retained bytes objects themselves, so they cost no memory of their own)."""
        if self.closed:
            return
        with self._cond:
            self._queue.append(data)
            if counted:
                self._bytes += len(data)
            self._cond.notify()
        if self._bytes > self._max_queue:
            self._overflow()

    def _hold(self, time: Any, data: bytes) -> None:
        self._pending.append((time, data))
        self._bytes += len(data)
        if self._bytes > self._max_queue:
            self._overflow()

    def _overflow(self) -> None:
        """Too far behind: drop what is queued and close (the sender then disconnects)."""
        with self._cond:
            self.overflowed = True
            self.closed = True
            self._queue.clear()
            self._pending = []
            self._bytes = 0
            self._cond.notify()
        self._on_overflow(self)

    def fail(self, reason: str) -> None:
        """Refuse this subscriber: drop what is queued, send a REFUSED frame and close
        (``refusal`` says why; the sending side logs it once)."""
        with self._cond:
            self.refusal = reason
            self._queue.clear()
            self._pending = []
            self._bytes = 0
            self._queue.append(wire.frame(wire.REFUSED, {"reason": reason[:500]}))
            self.closed = True
            self._cond.notify()

    def take(self, timeout: float) -> list[bytes] | None:
        """Every queued frame (waiting up to ``timeout`` s for one); None once closed."""
        with self._cond:
            if not self._queue and not self.closed:
                self._cond.wait(timeout)
            if self.closed and not self._queue:
                return None
            out = list(self._queue)
            self._queue.clear()
            self._bytes = 0
            self.sending = bool(out)
            return out

    def drained(self) -> bool:
        """Nothing queued and nothing being written (the writer clears ``sending``)."""
        return not self._queue and not self.sending

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify()


class PartitionLog:
    """Frames of one partition and its subscribers (see the module docstring).  Thread-safe:
    the worker calls ``data``/``advance``; connection threads call ``join``/``start``/``leave``.

    Args:
        retain_bytes: bytes of frames of complete epochs to keep (0: keep only incomplete
            epochs' frames).
        max_queue: bytes queued for one subscriber before it is disconnected.
        on_overflow: called with a subscriber that was disconnected (under the log's lock:
            it must not call back into the log).
        compaction: fold the frames let go into the latest row per key, so subscribers can
            join with a snapshot (``tokenflow.pubsub.compaction``); None: no snapshots.
    """

    def __init__(self, retain_bytes: int = DEFAULT_RETAIN, max_queue: int = DEFAULT_MAX_QUEUE,
                 on_overflow: Callable[[Subscriber], None] | None = None,
                 compaction: KeyedCompaction | None = None) -> None:
        self.compaction = compaction
        self.retain_bytes = retain_bytes
        self.max_queue = max_queue
        self._on_overflow = on_overflow or (lambda s: None)
        self._lock = threading.Lock()
        self.lower: list[Any] | None = None  # None: not known yet (the sink has not run)
        self.upper = UpperFrontier()
        self.dropped = UpperFrontier()
        self._retained: collections.deque[tuple[int, Any, bytes]] = collections.deque()
        self._retained_bytes = 0
        self._seq = 0
        self._subscribers: list[Subscriber] = []
        self._joining = 0
        self.frames = 0
        self.closed = False
        self.started = 0
        """Subscribers that completed their join (``start``) so far."""
        self.time_kind: str | None = None
        """``"int"`` or ``"product"`` once a time was seen (``wire.time_kind``)."""

    # -- the worker's side ----------------------------------------------------------------

    def data(self, time: Any, frame: bytes) -> None:
        """A DATA frame of ``time`` was produced."""
        with self._lock:
            self.upper.insert(time)
            self._retained.append((self._seq, time, frame))
            self._seq += 1
            self._retained_bytes += len(frame)
            self.frames += 1
            if self.time_kind is None:
                self.time_kind = wire.time_kind(time)
            for s in self._subscribers:
                if s.closed:
                    continue
                if s.filter is None:
                    s._hold(time, frame)
                elif self._passes(s, time):
                    s._put(frame)
            self._prune()

    def advance(self, frontier: list[Any]) -> None:
        """The stream's frontier is now ``frontier``; sends the changes as a LOWER frame."""
        with self._lock:
            old = self.lower or []
            if self.lower is not None and set(old) == set(frontier):
                return
            updates = [[wire.encode_time(t), -1] for t in old if t not in frontier] + \
                      [[wire.encode_time(t), 1] for t in frontier if t not in old]
            self.lower = list(frontier)
            frame = wire.frame(wire.LOWER, {"updates": updates})
            if self.time_kind is None and frontier:
                self.time_kind = wire.time_kind(frontier[0])
            for s in self._subscribers:
                if s.closed:
                    continue
                if s.filter is None:
                    s._hold(None, frame)
                else:
                    try:
                        s.filter.relax(frontier)
                    except (TypeError, AttributeError) as exc:
                        self._refuse(s, frontier, exc)
                        continue
                    s._put(frame)
            self._prune()

    def _passes(self, sub: Subscriber, time: Any) -> bool:
        assert sub.filter is not None
        try:
            return sub.filter.passes(time)
        except (TypeError, AttributeError) as exc:  # a filter of another time type
            self._refuse(sub, time, exc)
            return False

    def _refuse(self, sub: Subscriber, time: Any, exc: Exception) -> None:
        """A subscriber whose filter does not compare with the stream's times is refused;
        the job goes on (the publisher logs the refusal once, when it closes the connection)."""
        sub.fail(f"its filter does not compare with the stream's time {time!r} ({exc})")

    def _prune(self) -> None:
        if self._joining:
            return
        lower = self.lower
        retained = self._retained
        let_go = []
        while retained and self._retained_bytes > self.retain_bytes and lower is not None \
                and passed(lower, retained[0][1]):
            _, time, frame = retained.popleft()
            self._retained_bytes -= len(frame)
            self.dropped.insert(time)
            let_go.append(frame)
        if let_go and self.compaction is not None:
            self.compaction.fold(let_go)

    # -- a subscriber's side ---------------------------------------------------------------

    def join(self, name: str) -> tuple[Snapshot, Subscriber, int]:
        """Register a subscriber; returns the snapshot, the subscriber (holding later frames
        unfiltered) and the mark to pass to ``start``."""
        with self._lock:
            sub = Subscriber(name, self.max_queue, self._on_overflow)
            self._subscribers.append(sub)
            self._joining += 1
            lower = list(self.lower) if self.lower is not None else None
            snap = Snapshot(lower if lower is not None else [], list(self.upper.elements),
                            list(self.dropped.elements), lower is not None)
            return snap, sub, self._seq

    def start(self, sub: Subscriber, mark: int, filt: EpochFilter,
              snapshot_at: list[Any] | None = None) -> None:
        """Set ``sub``'s filter: queue the retained frames before ``mark`` that pass it, a
        replay-end LOWER frame, then the frames held since the snapshot.  With
        ``snapshot_at`` (a frontier every partition has passed; ``filt.since`` should be it),
        first a DATA frame ``{"snapshot": snapshot_at}`` holding the latest row per key of
        every epoch it passed.

        Raises:
            ResumeRefused: the filter passes an epoch this partition let go (a resume position
                or a join filter older than what retention holds), or a snapshot was asked of
                a stream published without a key, or as of epochs already folded.
        """
        with self._lock:
            self._joining -= 1
            try:
                kinds = {wire.time_kind(t) for t in [*filt.drop_upto, *(filt.since or []),
                                                      *(snapshot_at or [])]}
                if self.time_kind is not None and kinds - {self.time_kind}:
                    raise ResumeRefused(f"the filter has {'/'.join(sorted(kinds))} times, the "
                                        f"stream {self.time_kind} times")
                if snapshot_at is not None:
                    sub._put(self._snapshot_frame(mark, snapshot_at), counted=False)
                # An epoch t <= d passing the filter implies d passes it: checking the
                # maximal let-go epochs is exact.
                lost = [d for d in self.dropped.elements if filt.passes(d)]
                if lost:
                    raise ResumeRefused(f"epochs up to {lost} are no longer held "
                                        f"(retention {self.retain_bytes} bytes)")
                for seq, time, frame in self._retained:
                    if seq >= mark:
                        break
                    if filt.passes(time):
                        sub._put(frame, counted=False)
                sub._put(wire.frame(wire.LOWER, {"updates": [], "replayed": True}))
                pending, sub._pending = sub._pending, []
                sub._bytes -= sum(len(f) for _, f in pending)
                for time, frame in pending:
                    if time is None or filt.passes(time):
                        sub._put(frame)
                sub.filter = filt
                self.started += 1
                if self.lower is not None:
                    filt.relax(self.lower)
            except BaseException:
                self._drop(sub)
                raise
            finally:
                self._prune()

    def _snapshot_frame(self, mark: int, at: list[Any]) -> bytes:
        if self.compaction is None:
            raise ResumeRefused("this topic is published without a key, so it has no snapshot "
                                "(publish(topic, key=[...]))")
        folded_late = [d for d in self.dropped.elements if not passed(at, d)]
        if folded_late:
            raise ResumeRefused(f"a snapshot as of {at} is gone: epochs {folded_late} after it "
                                f"were already folded (retention {self.retain_bytes} bytes)")
        table = self.compaction.snapshot(f for seq, time, f in self._retained
                                         if seq < mark and passed(at, time))
        body = b"" if table is None else wire.encode_batch(as_batch(table))
        return wire.frame(wire.DATA, {"snapshot": wire.encode_antichain(at)}, body)

    def leave(self, sub: Subscriber) -> None:
        with self._lock:
            if sub.filter is None and sub in self._subscribers:
                self._joining -= 1
            self._drop(sub)

    def _drop(self, sub: Subscriber) -> None:
        sub.close()
        if sub in self._subscribers:
            self._subscribers.remove(sub)

    @property
    def subscribers(self) -> list[Subscriber]:
        with self._lock:
            return list(self._subscribers)

    def close(self) -> None:
        """End every subscription (after a BYE frame each)."""
        with self._lock:
            self.closed = True
            bye = wire.frame(wire.BYE, {"reason": "publisher closed"})
            for s in self._subscribers:
                s._put(bye)
                s.close()
            self._subscribers = []
