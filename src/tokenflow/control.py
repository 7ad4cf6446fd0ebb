"""The control plane: commands from the driver that take effect at logical times, and the
snapshot protocol built on them.

Source: the distributed-DBSP design, "Fault tolerance", "Synchronization", "Coordinator" and
"Coordinator/worker synchronization" (a coordinator tells every worker when to commit its
state; a checkpoint is the basis for recovery once every worker's part is durable) and
"Layout changes" (cold: stop at a checkpoint, restart with another layout);
docs/ARCHITECTURE.md ("Sources, sinks and the control plane").

Transport: on the ``process`` and ``spark`` runtimes the driver's ``Coordinator`` and each
worker's ``Reporter`` (``tokenflow.coordinator``: msgpack frames, token-authenticated, never
pickle); on the ``thread`` runtime in-process queues (``QueueHub``).  Every message is a map
with a ``"kind"``.

A snapshot is taken at a common epoch ``e`` (a boundary of every source's epochs) by one of
two protocols.  Both leave every worker's state holding the effect of every record before
``e`` and of none at or after it (a consistent cut; the distributed-DBSP design,
"Synchronization": the workers' states are committed together at one step).

*Aligned* (the default, ``take_snapshot(aligned=True)``): no source waits for the driver or
for another worker's capture, only for the job to finish the records before ``e``.  ``hold``
raises each worker's *barrier* (``tokenflow.worker.Traffic``) at its own point, ``checkpoint``
moves it to ``e``: from then until the worker's capture, an operator input sets aside every
message at a time ``>= e`` instead of handing it to its operator (records of ``e`` and later
wait at the input; the messages behind one still come).  The sources emit everything before ``e`` and
stop there; the worker captures its state as soon as its sources hold at ``e``, it has
nothing left to run, and its view of the dataflow holds no record in flight before ``e`` and
no token before ``e`` but on operators that have received all their input before ``e``
(``Worker.aligned_at``: timely's progress tracking is conservative, so this holds on every
worker).  Right after its capture the worker lowers its barrier and resumes its sources; its
records of ``e`` and later flow at once (a worker still aligning holds them at its inputs), and
what it sends at a time before ``e`` (a token held over the cut, e.g. a sink's unfinished bin
of epochs) is kept back until every worker has captured (``cut``; ``Traffic.defer``).  So no
record is received before its receiver's capture that was sent after its sender's (the
Chandy-Lamport condition; an asynchronous-barrier-snapshot alignment with the frontier as the
barrier).  A record sent before its sender's capture but received after its receiver's (one
at a time ``>= e`` sent while the job finished the epochs before ``e``, by an operator sending
later than the token it holds) is channel state: an operator's output records it while its
worker's barrier is up (``Traffic.crossing``), and the capture stores it with the worker's
part and leaves it out of ``sent`` (``tokenflow.dataflow.channel_state``; a restored job
sends it again).  One the worker did not record (sent before ``hold``, through a pact whose
messages depend on the worker count, or a migrating operator's state move at ``e``) makes the
sums of the ``sent`` and ``received`` counters taken at the captures differ; the driver then discards
the captures (nothing is committed; the job goes on) and tries once more at a later epoch
(``ALIGNED_ATTEMPTS``: an operator that sends when the frontier reaches a window's end does so
at few epochs, so the next epoch is most often a consistent cut), then takes the snapshot at
once by the quiescent protocol, as it does at once when a migrating operator has a move at or
before ``e`` still to send (``settled``) or an alignment did not complete in time.

*Quiescent* (``aligned=False``; the fallback, and the only protocol before): the sources stop
at ``e``, the job drains, and every worker waits without stepping until every worker captured.

Commands (driver -> workers) and replies (workers -> driver):

``hold`` ``margin``, ``barrier``
    every source of the worker pauses at its *safe point* (the least epoch boundary after
    everything it has emitted) plus ``margin`` epochs of its own length (default 0: at once;
    with a margin the sources go on while the driver gathers the replies), but no later than
    a pause the job set on it (``SourceHandle.hold_at``: the control plane's pause is its own,
    and ``resume`` lifts only that); with ``barrier``
    (aligned) the worker's barrier goes up at its point (without a source: below every
    time); reply ``held`` with ``point`` (the greatest such epoch of the worker's sources, or
    None without sources), ``granularity`` (the least common multiple of its sources' epoch
    lengths: the common pause epoch must be a boundary of all), ``align`` (false with
    migrating operators: the driver then takes the snapshot by the quiescent protocol, whose
    ``pause_at`` lowers the barrier) and (aligned) ``busy``, the epoch boundaries at or
    after its point at which operators hold tokens (``Worker.token_times``), which the driver
    does not choose as the epoch (``BUSY_TIMES``).
``checkpoint`` ``epoch``, ``root``, ``job``, ``previous``, ``resume``  (aligned)
    sources emit everything before ``epoch`` and nothing at or after it; the barrier moves
    to ``epoch``; the worker steps on and, once aligned (above), captures its part as
    ``snapshot`` below does and replies ``captured`` with its ``sent`` and ``received``
    counters at the capture, ``settled`` and ``phases`` (seconds: ``run up``
    from the command until its sources held at ``epoch``, ``align`` from then until aligned,
    ``capture``).  With ``resume`` true it then lowers the barrier and resumes its sources at
    once, while a background thread writes the part (``written`` / ``write_failed``);
    otherwise it awaits ``resume`` or ``stop`` without stepping.
``cut``  (aligned, after every ``captured``)
    push the messages at times before the epoch kept back since the capture.
``pause_at`` ``epoch``  (quiescent)
    sources emit everything before ``epoch`` and nothing at or after it; the worker steps on
    and replies ``paused`` once all its sources hold at ``epoch`` (worker code feeding an
    ``InputHandle`` may need other workers to step to get there, e.g. waiting on a probe, so
    nobody blocks yet).
``drain``  (quiescent)
    (once every worker is paused) the worker steps until it has nothing to do, then replies
    ``idle`` with its ``Traffic`` counters (``sent``, ``received``) and ``settled`` (false
    while one of its migrating operators has a move at a time ``<=`` the epoch still to send,
    or records at such times still to route, ``tokenflow.rescale``) — and waits, not
    stepping, for the verdict:
``continue``  (quiescent)
    not quiescent yet (the job's records sent and received differ, or a worker is not
    settled): step and reply ``idle`` again.
``snapshot`` ``root``, ``job``, ``epoch``, ``previous``, ``resume``  (quiescent)
    capture this worker's part of the snapshot (``tokenflow.state.snapshot``: every declared
    state's bins changed since the committed snapshot at epoch ``previous``, or all of them,
    read now (``tokenflow.state.changes``; what a state can leave for later, e.g. a
    columnar state's split into bins, is done by the writer), and the source positions as
    metadata) and reply ``captured``; a background thread writes the part (incremental: bins
    unchanged since the worker's part of the committed snapshot at epoch ``previous`` are
    referenced, not written) and replies ``written`` with ``bins_exported`` (or
    ``write_failed`` with the ``error``).  With ``resume`` true, the worker then resumes its sources at once
    and steps on while the files are written (an asynchronous checkpoint); otherwise it awaits
    the next command (``resume`` or ``stop``) without stepping.  Resuming without waiting for
    the other workers' captures is safe: when the driver sends ``snapshot`` every worker is
    waiting for the verdict without stepping, and it captures as soon as the command comes,
    before it steps again, so what a resumed worker sends (times at or after the epoch) waits
    unread in the mesh until its receiver has captured.
``resume`` / ``stop``
    sources go on (the barrier comes down, messages kept back go out) / the worker ends its
    dataflows and returns.
``bin_bytes``
    reply ``bin_bytes`` with ``sizes``: the bytes per bin of the state of the worker's
    migrating operators (``Controller.bin_bytes``, summed over operators; ``pack_sizes``;
    None without such state), read between two steps, their number ``bins``, and
    ``weighed`` (false when a state does not weigh its bins: the driver then sends none).
``rescale`` ``roster``, ``strategy``, ``replace``, ``sizes`` (to worker 0)
    its migrating operators move to the table for ``roster`` (``rescale_roster``; with
    ``sizes``, the sum of the workers' ``bin_bytes``, the bins that move are chosen by
    bytes) or, with ``replace`` ``[old, new]``, move every bin of ``old`` to ``new``; replies
    ``rescaled`` with the ``steps`` (or an ``error``).

Quiescence (the quiescent protocol): a worker replies ``idle`` only with nothing left to run,
and it takes no step until the verdict, so after its reply it sends nothing.  A record counted
as sent by one worker is therefore either received before its receiver's reply or still in
flight; when the sums of ``sent`` and ``received`` over all replies are equal, nothing is in
flight and every worker is idle: no operator can change its state until the sources resume,
and the states written hold the effect of every record before the pause epoch and of none at
or after it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tokenflow.dataflow.channel_state import KEY as CHANNEL_STATE
from tokenflow.faults import crash_point
from tokenflow.membership import COMMANDS as MEMBERSHIP_COMMANDS
from tokenflow.membership import MembershipAgent
from tokenflow.state.bins import RoutingTable
from tokenflow.state.changes import ChangeLog
from tokenflow.state.snapshot import SnapshotError, WorkerPart, commit_snapshot, write_worker_part


class ControlError(RuntimeError):
    """The control protocol failed: a worker did not answer in time or answered wrongly."""


class ReplyTimeout(ControlError):
    """A reply did not come within the time allowed (``gather``), or a worker did not
    connect to the coordinator within it (``CoordinatorHub.send``)."""


class Hub(Protocol):
    """The driver's side: send commands, receive replies."""

    def send(self, worker: int, message: dict[str, Any]) -> None: ...

    def receive(self, timeout: float) -> dict[str, Any] | None: ...

    def gone(self) -> set[int]:
        """Workers that will answer no more commands (they returned or died)."""
        ...

    def started(self) -> set[int]:
        """Workers that have started: they take commands, or took them and are gone."""
        ...


class Link(Protocol):
    """A worker's side: send replies, receive commands."""

    def send(self, message: dict[str, Any]) -> None: ...

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None: ...


class QueueHub:
    """In-process transport for the ``thread`` runtime: one command queue per worker and one
    reply queue."""

    def __init__(self, workers: int) -> None:
        self.commands: list[queue.Queue[dict[str, Any]]] = [queue.Queue() for _ in range(workers)]
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._finished: set[int] = set()
        self._wake: dict[int, Callable[[], None]] = {}  # worker -> its ``Worker.unpark``

    def finish(self, worker: int) -> None:
        """``worker`` returned: it answers no more commands."""
        self._finished.add(worker)

    def gone(self) -> set[int]:
        """Workers that answer no more commands (they returned)."""
        return set(self._finished)

    def started(self) -> set[int]:
        """Every worker: threads take commands from their start."""
        return set(range(len(self.commands)))

    def send(self, worker: int, message: dict[str, Any]) -> None:
        self.commands[worker].put(dict(message))
        wake = self._wake.get(worker)
        if wake is not None:
            wake()  # a parked worker reads the command now, not when its park times out

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def link(self, worker: int, wake: Callable[[], None] | None = None) -> QueueLink:
        """The worker's end; ``wake`` (the worker's ``unpark``) is called after each command
        sent to it."""
        if wake is not None:
            self._wake[worker] = wake
        return QueueLink(self.commands[worker], self.replies)


class QueueLink:
    """A worker's end of a ``QueueHub``."""

    def __init__(self, commands: queue.Queue[dict[str, Any]], replies: queue.Queue[dict[str, Any]]) -> None:
        self._commands = commands
        self._replies = replies

    def send(self, message: dict[str, Any]) -> None:
        self._replies.put(dict(message))

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None:
        try:
            if timeout == 0.0:
                return self._commands.get_nowait()
            return self._commands.get(timeout=timeout)
        except queue.Empty:
            return None


_deadlines = threading.local()


@contextlib.contextmanager
def command_deadline(timeout: float) -> Iterator[None]:
    """Within the block, this thread's ``CoordinatorHub.send`` waits for a worker that has
    not connected yet until ``timeout`` s after the block began, not ``connect_timeout``: a
    command with a timeout of its own (``JobHandle.rescale(timeout=5)``) fails within it
    instead of waiting a minute for a worker that never connects.  Blocks nest (the earlier
    deadline holds); other threads' commands keep their own."""
    previous: float | None = getattr(_deadlines, "at", None)
    at = time.monotonic() + timeout
    _deadlines.at = at if previous is None else min(previous, at)
    try:
        yield
    finally:
        _deadlines.at = previous


class CoordinatorHub:
    """A ``Hub`` over the driver's ``Coordinator`` (process and spark runtimes)."""

    def __init__(self, coordinator: Any, connect_timeout: float = 60.0,
                 alive: Callable[[], bool] | None = None) -> None:
        self.coordinator = coordinator
        self.connect_timeout = connect_timeout
        self.alive = alive
        """Whether the job still runs (a worker of an ended job never connects)."""
        self._seen: set[int] = set()

    def gone(self) -> set[int]:
        """Workers that were connected and are no longer (they returned, or died)."""
        return self._seen - set(self.coordinator.connected())

    def started(self) -> set[int]:
        """Workers that have connected to the coordinator (now or before)."""
        self._seen.update(self.coordinator.connected())
        return set(self._seen)

    def send(self, worker: int, message: dict[str, Any]) -> None:
        """Send to ``worker``, waiting up to ``connect_timeout`` s for it to connect (workers
        connect when they start), or until the deadline of the ``command_deadline`` block
        the calling thread is in, if that comes first.

        Raises:
            ReplyTimeout: the worker did not connect in time.
            ControlError: it was connected and is gone, or the job ended.
        """
        start = time.monotonic()
        deadline = start + self.connect_timeout
        command: float | None = getattr(_deadlines, "at", None)
        by_command = command is not None and command < deadline
        if by_command:
            deadline = command  # type: ignore[assignment]
        while worker not in self.coordinator.connected():
            if worker in self._seen:
                raise ControlError(f"worker {worker} has ended (its connection closed)")
            if self.alive is not None and not self.alive():
                raise ControlError(f"the job ended before worker {worker} connected to the "
                                   "coordinator")
            if time.monotonic() > deadline:
                raise ReplyTimeout(f"worker {worker} did not connect to the coordinator within "
                                   + (f"{time.monotonic() - start:.1f} s (the command's timeout)"
                                      if by_command else f"{self.connect_timeout} s"))
            time.sleep(0.01)
        self._seen.add(worker)
        self.coordinator.send(worker, message)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.coordinator.inbox.get(timeout=timeout)  # type: ignore[no-any-return]
        except queue.Empty:
            return None


TOKEN_GRACE = 0.05
"""Seconds an aligning worker waits while the only work before the checkpoint's epoch left in
its view is tokens of operators that have all their input before it (``Worker.aligned_at``):
one about to act on that frontier on another worker sends a record before the epoch within a
progress exchange, which, arriving after the capture, would make the capture not a consistent
cut (and the checkpoint be taken again quiescent); one that stays (a sink's unfinished bin of
epochs) is captured as its state after this wait."""

WRITER_SWITCH_INTERVAL = 0.0005
"""Seconds of the interpreter's switch interval (``sys.setswitchinterval``; Python's default
is 0.005) while a snapshot part is written on a worker's background thread.  The writer runs
Python code for milliseconds at a time (splitting states into bins, serializing them); each
time the worker's own thread gives the GIL up (a socket read or send, a ``select``) it waits
up to this interval to get it back.  With the default, an epoch during a write took up to
tens of ms longer; q8 at half load, epoch p99 with checkpoints every 1 s, median of 4 runs
each: 16.8 ms with the default, 7.1 ms with this (6-7 ms without checkpoints)."""

_switch_lock = threading.Lock()
_switch_writers = 0  # writers running in this process (the thread runtime has several)
_switch_default = 0.005


@contextlib.contextmanager
def _short_switch_interval() -> Iterator[None]:
    """``WRITER_SWITCH_INTERVAL`` while any writer of this process runs, then the interval
    there was before the first."""
    global _switch_writers, _switch_default
    with _switch_lock:
        if _switch_writers == 0:
            _switch_default = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_default, WRITER_SWITCH_INTERVAL))
        _switch_writers += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_writers -= 1
            if _switch_writers == 0:
                sys.setswitchinterval(_switch_default)


WRITER_WAIT = 0.025
"""Seconds a checkpoint's writer waits, before a piece of its work (a state's export and
split by bin, serializing a blob), for its worker to park with nothing to run (``Worker.wait_parked``),
unless it parks sooner.  The writer runs on the worker's interpreter; while both want it they share it,
and an epoch that arrived during a write took as long again: q5 at half load, with a
checkpoint every second, the epoch of each checkpoint took 10-30 ms where the others took
about 1 ms, and 0.6-4 ms when the writer started 200 ms later instead (one run each).  At
half load a worker parks most of the time, so the write goes on in its idle moments."""
WRITER_WAIT_TOTAL = 0.2
"""Seconds a writer waits for its worker to park over one part at most, after which it
writes on without waiting: a worker that never parks (full load) still gets its part
written, about this much later, and the next checkpoint's capture (which waits for the part
in flight) is not held up."""
WRITER_PIECE = 0.001
"""Seconds of work a writer does between two waits: pieces shorter than this (a small
blob) follow each other without one."""


class _WhenParked:
    """The wait a writer of ``worker``'s part makes before each piece of its work
    (``WRITER_WAIT``, ``WRITER_WAIT_TOTAL``, ``WRITER_PIECE``)."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._waited = 0.0
        self._since: float | None = None  # when the last wait ended

    def __call__(self) -> None:
        now = time.monotonic()
        if (self._since is not None and now - self._since < WRITER_PIECE) \
                or self._waited >= WRITER_WAIT_TOTAL:
            return
        wait = getattr(self._worker, "wait_parked", None)
        if wait is not None:
            wait(min(WRITER_WAIT, WRITER_WAIT_TOTAL - self._waited))
        self._since = time.monotonic()
        self._waited += self._since - now


BUSY_TIMES = 16
"""An aligned checkpoint's epoch is not a time at which an operator holds a token (``hold``
replies ``busy``, the first this many such epoch boundaries at or after the worker's point;
``Worker.token_times``): such an operator (a window ending there) sends at that time as soon
as the job has finished the epochs before it, which is during the alignment.  Its messages
are then channel state (``tokenflow.dataflow.channel_state``) unless they go through a pact
whose messages depend on the worker count, when the captures are not a consistent cut and the
checkpoint is taken again (q5, windows sliding by 5 epochs: 2-3 discarded attempts in each of
4 runs of 10 s at half load with 9 checkpoints before channel state and this; none in 3 runs
with this).  The epoch moves on by the sources' granularity, at most this many times."""
ALIGNED_ATTEMPTS = 2
"""Aligned attempts a snapshot makes before the quiescent protocol, when their captures are
not a consistent cut.  The quiescent protocol stops every source until the job drains, which
delays the epochs around it by tens of ms (q8 at half load, one traced run: 42-67 ms where
the others took 1-2 ms), where an aligned attempt
holds each source only until the epochs before its ``e`` are done."""

_EVERYTHING = -(1 << 62)
"""The barrier ``hold`` raises on a worker without a source to name a point: every message
waits until ``checkpoint`` names the epoch."""


class ControlAgent:
    """The worker side of the control protocol, run after every step (``Worker.on_step``).

    Args:
        link: the transport to the driver.
        wait: seconds to wait for a verdict before failing (the driver is gone).
    """

    def __init__(self, link: Link, wait: float = 120.0) -> None:
        self.link = link
        self.wait = wait
        self.membership = MembershipAgent(link)
        """Carries out workers joining and leaving (``tokenflow.membership``)."""
        self.pause_epoch: int | None = None
        self.announced = False  # told the driver that every source holds at the pause
        self.draining = False  # the driver asked for idle reports
        self.stopped = False
        self.round: Any = None  # the protocol round of the last command, echoed in replies
        self._writer: threading.Thread | None = None
        self._parts: dict[int, dict[str, dict[int, list[int]]]] = {}  # epoch -> blob entries
        self._changes = ChangeLog()  # bins changed per capture not yet committed
        self.holding = False  # a round is on: from ``hold`` until ``resume`` or ``stop``
        self._stalled_since: float | None = None  # since when every source holds, in a round
        self._stalled = 0.0  # seconds every source held in this round, before ``_stalled_since``
        self.aligning: dict[str, Any] | None = None
        """The ``checkpoint`` command of an aligned snapshot not captured yet (else None)."""
        self._align_times: list[float] = []  # command received, sources held at the epoch
        self._relaxed_since: float | None = None  # aligned but for tokens before the epoch

    def __call__(self, worker: Any) -> None:
        message: dict[str, Any] | None = self.link.poll(0.0)
        while message is not None:
            message = self._handle(worker, message)
        self.membership.poll(worker)
        if self.holding:
            if not self._paused(worker):
                if self._stalled_since is not None:
                    self._stalled += time.monotonic() - self._stalled_since
                    self._stalled_since = None
            elif self._stalled_since is None:
                self._stalled_since = time.monotonic()
        if self.aligning is not None:
            self._align(worker)
            return
        if self.pause_epoch is None:
            return
        if not self.announced and self._paused(worker):
            self.announced = True
            self.link.send({"kind": "paused", "worker": worker.index, "epoch": self.pause_epoch,
                            "round": self.round})
        if self.draining and self._paused(worker) and worker.activations.is_empty():
            self._report_idle(worker)

    def _settled(self, worker: Any) -> bool:
        """No migrating operator of this worker has a move at a time ``<=`` the pause epoch
        still to send, nor records at such times still to route (``tokenflow.rescale``: a
        checkpoint's epoch is one where no move is in flight).  An unsettled worker says so
        in its ``idle`` reply and the driver answers ``continue`` (the move needs other
        workers' progress, which they send only while they step)."""
        epoch = self.pause_epoch
        return epoch is None or all(
            r.settled(epoch) is None for r in getattr(worker, "rescalers", ()))

    def _sources(self, worker: Any) -> list[Any]:
        return list(getattr(worker, "sources", {}).values())

    def _paused(self, worker: Any) -> bool:
        return all(s.paused for s in self._sources(worker))

    def _report_idle(self, worker: Any) -> None:
        """Reply ``idle`` and wait, without stepping, for the verdict."""
        self.link.send({"kind": "idle", "worker": worker.index, "epoch": self.pause_epoch,
                        "round": self.round,
                        "sent": worker.traffic.sent, "received": worker.traffic.received,
                        "settled": self._settled(worker)})
        message: dict[str, Any] | None = self._await(worker)
        while message is not None:
            message = self._handle(worker, message)

    def _await(self, worker: Any) -> dict[str, Any]:
        """The driver's next command.  Meanwhile the worker's mesh keeps moving (``pump``: what
        peers send is read and queued, what this worker queued goes out), since a peer may
        need this worker to read before it can finish its step and reply in turn."""
        pump = getattr(worker.allocator, "pump", None)
        if pump is None:
            message = self.link.poll(self.wait)
        else:
            deadline = time.monotonic() + self.wait
            message = self.link.poll(0.0)
            while message is None and time.monotonic() < deadline:
                pump(0.001)
                message = self.link.poll(0.001)
        if message is None:
            raise ControlError(f"worker {worker.index}: no command from the driver for {self.wait} s "
                               "while paused")
        return message

    def _capture(self, worker: Any, message: dict[str, Any], extra: dict[str, Any] | None = None,
                 phases: dict[str, float] | None = None, began: float | None = None,
                 crossing: list[Any] | None = None) -> None:
        """Capture every state (incrementally: the bins changed since the checkpoint named
        ``previous``, ``tokenflow.state.changes``), the messages ``crossing`` the cut (an
        aligned capture's channel state, ``Traffic.take_crossing``; none for a quiescent
        one) and the source positions now, reply
        ``captured`` (with ``extra`` fields, and ``phases`` plus the capture's own seconds
        since ``began``) and write the part on a background thread, which replies ``written``
        or ``write_failed``."""
        began = time.monotonic() if began is None else began
        if self._writer is not None:
            self._writer.join()  # one part in flight per worker
        epoch = int(message["epoch"])
        previous = message.get("previous")
        rescalers = getattr(worker, "rescalers", ())
        if not self._parts and getattr(worker, "restore", None) is not None:
            entries = worker.restore.entries(worker.index, worker.routing)
            for r in rescalers:  # bins owned under the operator's own table: written in full
                for key in r.states:
                    entries.pop(key, None)
            self._parts = {int(worker.restore.epoch): entries}
        base = self._parts.get(int(previous)) if previous is not None else None
        if crossing or CHANNEL_STATE in getattr(worker, "states", {}):
            worker.channel_state().record(crossing or [])
        capture = self._changes.capture(getattr(worker, "states", {}), epoch,
                                        None if previous is None else int(previous), base)
        changed = capture.changed
        meta: dict[str, Any] = {
            "sources": {key: s.positions() for key, s in getattr(worker, "sources", {}).items()}}
        if rescalers:  # each migrating operator's routing table at the epoch
            from tokenflow.rescale.megaphone import ROUTING_META

            meta[ROUTING_META] = {r.key: r.table_at(epoch).to_json() for r in rescalers if r.key}
            if previous is not None:  # later checkpoints are at epochs after the committed one
                for r in rescalers:
                    if r.keep_from is not None:
                        r.keep_from = max(r.keep_from, int(previous))
        index, bins = worker.index, worker.routing.bins
        round_ = self.round
        since = self._stalled_since
        stalled = self._stalled + (0.0 if since is None else time.monotonic() - since)
        reply = {"kind": "captured", "worker": index, "epoch": epoch, "round": round_,
                 "full": len(capture.full),
                 "stalled": stalled, **(extra or {})}
        if phases is not None:
            reply["phases"] = {**phases, "capture": time.monotonic() - began}
        self.link.send(reply)

        between = _WhenParked(worker)

        def write() -> None:
            try:
                with _short_switch_interval():
                    states = capture.resolve(between).tables  # a piece per state's export
                    part = write_worker_part(message["root"], job=message["job"], epoch=epoch,
                                             worker=index, bins=bins, states=states, meta=meta,
                                             previous=base, changed=changed, between=between)
            except Exception as exc:  # noqa: BLE001 - reported to the driver
                self.link.send({"kind": "write_failed", "worker": index, "round": round_,
                                "error": f"{type(exc).__name__}: {exc}"[:2000]})
                return
            # the next part builds on the committed one the driver names: keep the last few
            self._parts[epoch] = part.entries or {}
            for old in sorted(self._parts)[:-3]:
                del self._parts[old]
            self.link.send({"kind": "written", "worker": index, "round": round_,
                            "index_path": part.index_path,
                            "crc32": part.crc32, "bytes_written": part.bytes_written,
                            "bytes_reused": part.bytes_reused, "bins_exported": capture.exported})

        self._writer = threading.Thread(target=write, name=f"tokenflow-snapshot-{index}", daemon=True)
        self._writer.start()

    def _align(self, worker: Any) -> None:
        """An aligned snapshot (module docstring): capture once this worker's sources hold at
        the epoch, nothing is left to run and no pointstamp before the epoch remains in its
        view; then, unless the snapshot stops the job, lower the barrier and resume."""
        message = self.aligning
        assert message is not None
        epoch = int(message["epoch"])
        if not self._paused(worker):
            return
        times = self._align_times
        if len(times) == 1:
            times.append(time.monotonic())  # the sources hold at the epoch
            crash_point("checkpoint.align")
        if not worker.activations.is_empty() or not worker.aligned_at(epoch):
            self._relaxed_since = None
            return
        if not worker.aligned_at(epoch, strict=True):
            # tokens before the epoch on operators that have all their input before it: a
            # sink's unfinished bin stays (captured as its state), but one that is about to
            # act (an epoch's file, a window) sends a record before the epoch once its worker
            # sees the frontier this worker sees now: give it ``TOKEN_GRACE`` to appear
            now = time.monotonic()
            if self._relaxed_since is None:
                self._relaxed_since = now
                activate_after = getattr(worker, "activate_after", None)
                if activate_after is not None:  # a parked worker steps when the grace ends
                    activate_after((), TOKEN_GRACE)
            if now - self._relaxed_since < TOKEN_GRACE:
                return
        self._relaxed_since = None
        aligned = time.monotonic()
        self.aligning = None
        self.pause_epoch = epoch  # for ``_settled``
        traffic = worker.traffic
        crossing, counted = traffic.take_crossing(epoch)  # the cut's channel state
        counters = {"sent": traffic.sent - counted, "received": traffic.received,
                    "settled": self._settled(worker), "held": len(traffic.held),
                    "crossing": len(crossing)}
        self._capture(worker, message, counters, {"run up": times[1] - times[0],
                                                  "align": aligned - times[1]}, aligned,
                      crossing)
        if message.get("resume"):
            traffic.defer = epoch  # until ``cut``: every worker has captured
            self._resume(worker)
            crash_point("checkpoint.resumed")
            return
        command: dict[str, Any] | None = self._await(worker)  # a stopping snapshot
        while command is not None:
            command = self._handle(worker, command)

    def _lift(self, worker: Any) -> None:
        """Lower the barrier: the inputs that held a message back hand it over at their
        operator's next scheduling."""
        traffic = getattr(worker, "traffic", None)
        if traffic is not None and traffic.barrier is not None:
            for held in traffic.lift():
                held.release()

    def _undefer(self, worker: Any) -> None:
        """Every worker has captured (or the round ended): push what was kept back."""
        traffic = getattr(worker, "traffic", None)
        if traffic is not None and traffic.defer is not None:
            traffic.release_deferred()

    def _resume(self, worker: Any) -> None:
        self.pause_epoch = None
        self.draining = False
        self.aligning = None
        self.holding, self._stalled_since = False, None
        self._lift(worker)
        traffic = getattr(worker, "traffic", None)
        if traffic is not None:
            traffic.crossing = []
        for source in self._sources(worker):
            source.release_hold()

    def finish(self) -> None:
        """Wait for a part still being written (before the worker returns)."""
        if self._writer is not None:
            self._writer.join()

    def _handle(self, worker: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Carry out one command; returns a command to carry out next (one that must follow
        without a step in between), or None."""
        kind = message.get("kind")
        self.round = message.get("round")
        if kind == "hold":
            points, step = [], 1
            margin = int(message.get("margin", 0))
            self.holding, self._stalled_since, self._stalled = True, None, 0.0
            for source in self._sources(worker):
                point = source.safe_point()
                step = math.lcm(step, int(source.granularity))
                if point is not None:
                    point += margin * int(source.granularity)
                    if source.job_pause is not None:  # the job paused it: hold no later
                        point = min(point, source.job_pause)
                    source.hold_at(point)
                    points.append(point)
            busy: list[int] = []
            worker.traffic.crossing = []  # what an earlier round recorded is not this one's
            if message.get("barrier"):  # an aligned snapshot: hold later records until it
                worker.traffic.barrier = max(points) if points else _EVERYTHING
                if points:
                    busy = sorted(t for t in worker.token_times(min(points))
                                  if t % step == 0)[:BUSY_TIMES]
            self.link.send({"kind": "held", "worker": worker.index, "round": self.round,
                            "point": max(points) if points else None, "granularity": step,
                            "align": not getattr(worker, "rescalers", ()), "busy": busy})
        elif kind == "checkpoint":
            epoch = int(message["epoch"])
            for source in self._sources(worker):
                source.hold_at(epoch)
            self._lift(worker)  # the barrier ``hold`` raised is at or before the epoch
            worker.traffic.barrier = epoch
            self.aligning = message
            self._align_times = [time.monotonic()]
        elif kind == "pause_at":
            epoch = int(message["epoch"])
            for source in self._sources(worker):
                source.hold_at(epoch)
            self._lift(worker)  # a quiescent snapshot after all: every record is delivered
            self.pause_epoch = epoch
            self.announced = self.draining = False
        elif kind == "drain":
            self.draining = True
        elif kind == "continue":
            return None
        elif kind == "snapshot":
            self._capture(worker, message)
            if message.get("resume"):
                self._resume(worker)  # see ``snapshot`` in the module docstring
                return None
            return self._await(worker)
        elif kind == "resume":
            self._resume(worker)
            self._undefer(worker)
        elif kind == "cut":
            self._undefer(worker)
        elif kind == "rescale":
            roster = [int(w) for w in message["roster"]]
            strategy = str(message.get("strategy", "batched"))
            replace = message.get("replace")
            # operators whose data has ended have nothing left to move (their state is
            # final); a change none of them can make is refused rather than acknowledged
            live = [r for r in worker.rescalers if not r.ended]
            if worker.rescalers and not live:
                self.link.send({"kind": "rescaled", "worker": worker.index, "round": self.round,
                                "steps": 0, "error": "the data of every migrating operator "
                                "has ended: no logical time is left to move bins at"})
                return None
            if replace is not None:  # a rolling upgrade: [old, new]
                old, new = (int(w) for w in replace)
                steps = sum(r.replace_owner(old, new, strategy) for r in live)
            else:
                try:
                    packed = message.get("sizes")
                    sizes = unpack_sizes(packed, live[0].table.bins) \
                        if live and packed is not None else None
                except ControlError as exc:
                    self.link.send({"kind": "rescaled", "worker": worker.index,
                                    "round": self.round, "steps": 0, "error": str(exc)})
                    return None
                steps = sum(r.rescale_roster(roster, strategy, sizes) for r in live)
            self.link.send({"kind": "rescaled", "worker": worker.index, "round": self.round,
                            "steps": steps})
        elif kind == "bin_bytes":
            held, weighed = _held_bytes(worker.rescalers)
            self.link.send({"kind": "bin_bytes", "worker": worker.index, "round": self.round,
                            "weighed": weighed, "bins": 0 if held is None else len(held),
                            "sizes": None if held is None else pack_sizes(held)})
        elif kind in MEMBERSHIP_COMMANDS:
            self.membership.handle(worker, message)
        elif kind == "stop":
            self.finish()
            self.pause_epoch = None
            self.draining = False
            self.holding = False
            self.aligning = None
            self._lift(worker)
            self._undefer(worker)
            self.stopped = True
            worker.stop()
        else:
            raise ControlError(f"worker {worker.index}: unknown command {message!r}")
        return None


SIZE_ENTRIES = 8192
"""Most numbers a ``bin_bytes`` reply or a ``rescale``'s ``sizes`` carries (float32: 32 KB of
a control frame's 64 KB, ``tokenflow.coordinator.MAX_REPORT``); a job of more bins sends sums
over groups of consecutive bins (``pack_sizes``)."""


def pack_sizes(sizes: np.ndarray) -> dict[str, Any]:
    """Bytes per bin (one number per bin; the bin count a power of two) as a control message
    field: ``{"group": g, "bytes": float32 little-endian sums over each g consecutive bins}``,
    with g the least power of two that keeps them within ``SIZE_ENTRIES``."""
    group = max(1, len(sizes) // SIZE_ENTRIES)
    sums = np.asarray(sizes, dtype=np.float64).reshape(-1, group).sum(axis=1)
    return {"group": group, "bytes": sums.astype("<f4").tobytes()}


def unpack_sizes(packed: Any, bins: int) -> np.ndarray:
    """``pack_sizes``' field as one float64 per bin (a group's sum spread evenly over it).

    Raises:
        ControlError: a malformed field (not a map of a group dividing ``bins`` and
            ``bins / group`` float32 values that are finite and >= 0).
    """
    try:
        group, data = int(packed["group"]), packed["bytes"]
        if group < 1 or bins % group or not isinstance(data, bytes) or \
                len(data) != 4 * (bins // group):
            raise ValueError(f"group {group} and {len(data)} bytes for {bins} bins")
        sums = np.frombuffer(data, dtype="<f4").astype(np.float64)
        if not np.isfinite(sums).all() or (sums < 0).any():
            raise ValueError("sizes must be finite and >= 0")
    except (TypeError, KeyError, ValueError) as exc:
        raise ControlError(f"malformed sizes per bin: {exc}") from exc
    return np.repeat(sums / group, group)


def _held_bytes(rescalers: Iterable[Any]) -> tuple[np.ndarray | None, bool]:
    """The bytes per bin of this worker's migrating operators' state, summed over them
    (``Controller.bin_bytes``; None when none declared a state), and whether every state
    weighed itself (False: one did not, ``BinnedState.bin_bytes`` None, or two weighed
    different bin counts: a sum would leave bytes out)."""
    total: np.ndarray | None = None
    for r in rescalers:
        if r.bin_bytes is None:
            continue
        sizes = r.bin_bytes()
        if sizes is None or (total is not None and len(sizes) != len(total)):
            return None, False
        sizes = np.asarray(sizes, dtype=np.float64)
        total = sizes.copy() if total is None else total + sizes
    return total, True


_LATER = {"captured": ("written", "write_failed"), "dismissed": ("left",)}
"""Replies that may overtake the ones gathered: a worker that captured its state early may
report its part written before a slower worker reports its capture; a leaving worker may
report it left (``tokenflow.membership``) before the last of the others reports it dismissed."""


def gather(hub: Hub, kind: str, workers: Iterable[int], timeout: float,
            alive: Callable[[], bool] | None = None, round_: Any = None,
            stash: list[dict[str, Any]] | None = None) -> dict[int, dict[str, Any]]:
    """One reply of ``kind`` from each of ``workers``; replies of another protocol round
    than ``round_`` (left over from a round that failed) are dropped, and replies that may
    overtake these (``_LATER``) are kept in ``stash`` for the gather that wants them.

    Raises:
        ControlError: a reply of another kind, none within ``timeout`` seconds
            (``ReplyTimeout``), or the job ended (``alive()`` false) before every worker
            replied.
    """
    waiting = set(workers)
    replies: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    stash = stash if stash is not None else []
    early = [m for m in stash if m.get("kind") in (kind, "write_failed")]
    for m in early:
        stash.remove(m)
    while waiting:
        left = deadline - time.monotonic()
        if early:
            message: dict[str, Any] | None = early.pop(0)
        else:
            message = hub.receive(min(0.1, left)) if left > 0 else None
        if message is None:
            ended = waiting & hub.gone()
            if ended:
                raise ControlError(f"workers {sorted(ended)} ended before they sent {kind!r}")
            if left > 0 and (alive is None or alive()):
                continue
            if left > 0:
                raise ControlError(f"the job ended before workers {sorted(waiting)} sent "
                                   f"{kind!r}")
            raise ReplyTimeout(f"no {kind!r} reply from workers {sorted(waiting)} within {timeout} s")
        if message.get("round") != round_:
            continue  # a reply to an earlier, abandoned round
        if message.get("kind") in _LATER.get(kind, ()):
            stash.append(message)
            continue
        if message.get("kind") == "write_failed":
            raise ControlError(f"worker {message.get('worker')} could not write its snapshot "
                               f"part: {message.get('error')}")
        if message.get("kind") != kind:
            raise ControlError(f"expected {kind!r} replies, worker {message.get('worker')} sent {message!r}")
        worker = message.get("worker")
        if worker not in waiting:
            raise ControlError(f"unexpected {kind!r} reply from worker {worker!r}")
        waiting.discard(worker)
        replies[worker] = message
    return replies


class InconsistentCut(ControlError):
    """An aligned snapshot's captures were not a consistent cut: a record sent before its
    sender's capture was received after its receiver's (the sums of the ``sent`` and
    ``received`` counters at the captures differ), or a migrating operator had a move at or
    before the epoch still to send; or (``stuck``) not every worker captured in time.  Nothing
    was committed; ``take_snapshot`` retries with the quiescent protocol."""

    def __init__(self, message: str, stuck: bool = False) -> None:
        super().__init__(message)
        self.stuck = stuck


@dataclass(frozen=True)
class SnapshotStats:
    """What one snapshot cost (``take_snapshot(..., stats=...)``).

    Attributes:
        epoch: the snapshot's epoch.
        paused: seconds from ``hold`` until every worker had captured its state (the job
            resumes then; with the aligned protocol each worker resumes at its own capture).
        total: seconds from ``hold`` until the manifest was written.
        bytes_written: bytes of the files written by all workers.
        bytes_reused: bytes of unchanged blobs referenced in earlier snapshots.
        phases: seconds from ``hold`` until each protocol step completed: ``held``, then
            (quiescent) ``paused`` (every source at the epoch) and ``idle`` (quiescent), then
            ``captured`` (every worker captured) and ``written``.
        bins_exported: (state, bin) tables exported by all workers' captures (the changed
            bins of an incremental capture, every bin of a full one).
        stalled: seconds, the longest any worker's sources stood still for this snapshot:
            the time from ``hold`` to its capture during which all of them held (at the
            ``hold`` point or at the epoch), counted from the step after which they did.
        protocol: ``"aligned"`` or ``"quiescent"`` (module docstring).
        worker_phases: (aligned) per phase, the longest over the workers, in seconds: ``run
            up`` (``checkpoint`` received until the worker's sources held at the epoch),
            ``align`` (until no record before the epoch remained anywhere and the worker had
            nothing to run), ``capture`` (exporting its state).
        discarded: why each aligned attempt discarded before this snapshot was (``InconsistentCut``:
            not a consistent cut, or the alignment did not complete in time).
        held: (aligned) operator inputs, summed over the workers, that held records of the
            epoch or later back at the worker's capture (sent by workers that had captured,
            or the worker's own).
        stuck: one of the ``discarded`` attempts did not complete its alignment in time (some
            operator keeps a record before the epoch in flight until every worker has
            captured): ``CheckpointedJob`` then takes quiescent checkpoints only.
        crossing: (aligned) messages at the epoch or later that operators sent before their
            worker's capture, stored as the snapshot's channel state
            (``tokenflow.dataflow.channel_state``), summed over the workers.
    """

    epoch: int
    paused: float
    total: float
    bytes_written: int
    bytes_reused: int
    phases: dict[str, float] = field(default_factory=dict)
    bins_exported: int = 0
    stalled: float = 0.0
    protocol: str = "quiescent"
    worker_phases: dict[str, float] = field(default_factory=dict)
    discarded: list[str] = field(default_factory=list)
    held: int = 0
    stuck: bool = False
    crossing: int = 0


def take_snapshot(hub: Hub, workers: list[int], root: str, job: str, routing: RoutingTable,
                  stop: bool = True, timeout: float = 60.0,
                  on_epoch: Callable[[int], None] | None = None,
                  alive: Callable[[], bool] | None = None, previous: int | None = None,
                  stats: list[SnapshotStats] | None = None, margin: int = 0,
                  aligned: bool = True, align_timeout: float = 10.0,
                  committer: Executor | None = None) -> int | None:
    """Bring every source to a common epoch, capture every worker's state there and commit
    the snapshot, then stop the job (or let it go on).  Returns the snapshot's epoch.
    ``alive()`` tells whether the job still runs (a job that ends cannot answer).

    ``aligned``: the aligned protocol (module docstring: the job keeps running while each
    worker captures as soon as the epochs before the snapshot's are done, and resumes at
    once); if its captures turn out not to be a consistent cut, they are discarded and the
    snapshot is tried again at a later epoch, up to ``ALIGNED_ATTEMPTS`` aligned attempts in
    all; after that, or at once when not every worker has captured within ``align_timeout``
    seconds, it is taken by the quiescent protocol (``aligned=False``: sources stop at the
    epoch, the job drains, every worker waits for the others' captures).  A job with migrating operators
    (``tokenflow.rescale``) is always snapshotted by the quiescent protocol: a state move at the
    epoch is sent before the cut, and a router holds records before the epoch that it routes
    after it.

    With ``stop=False`` the job resumes as soon as each worker captured its state, while
    the parts are written (asynchronous).  ``previous``: the epoch of the last committed
    snapshot of this run under ``root`` (incremental parts build on it); when the common
    epoch is not after it (nothing new since), nothing is written, the job resumes (or
    stops) and None is returned.  ``stats``: a list the snapshot's ``SnapshotStats`` is appended to.
    ``margin``: epochs (of each source's length) beyond its safe point that a source may still
    emit after ``hold`` (``hold`` in the module docstring): the snapshot's epoch comes later,
    and sources do not stand still while the driver gathers the workers' points.
    ``committer``: an executor the manifest's commit runs on (this call waits for it; default:
    the calling thread).  Nothing the workers wait for comes after the commit but ``stop``, so
    ``CheckpointedJob`` commits on a thread of low CPU priority (``tokenflow.recovery``).

    Raises:
        ControlError: a worker does not answer within ``timeout`` seconds, or the job ended.
        SnapshotError: a worker's part cannot be committed.
    """
    discarded: list[str] = []
    stuck = False
    while True:
        round_ = next(_ROUNDS)

        def send_all(kind: str, round_: int = round_, **fields: Any) -> None:
            for w in workers:
                hub.send(w, {"kind": kind, "round": round_, **fields})

        stash: list[dict[str, Any]] = []

        def gather_round(kind: str, limit: float = timeout, round_: int = round_,
                         stash: list[dict[str, Any]] = stash) -> dict[int, dict[str, Any]]:
            return gather(hub, kind, workers, limit, alive, round_, stash)

        try:
            return _snapshot_round(send_all, gather_round, root, job, routing, stop, on_epoch,
                                   previous, stats, margin, aligned, discarded,
                                   min(timeout, align_timeout), stuck, committer)
        except InconsistentCut as exc:
            _resume_all(hub, workers, round_, alive)
            discarded.append(str(exc))
            stuck = stuck or exc.stuck
            # again at a later epoch, or by the protocol that does not depend on the cut
            aligned = aligned and not stuck and len(discarded) < ALIGNED_ATTEMPTS
        except (ControlError, SnapshotError):
            _resume_all(hub, workers, round_, alive)
            raise


def _resume_all(hub: Hub, workers: list[int], round_: int, alive: Callable[[], bool] | None) -> None:
    """After a failed round: whoever is still paused goes on (its replies are ignored)."""
    if alive is None or alive():
        for w in workers:
            try:
                hub.send(w, {"kind": "resume", "round": round_})
            except (ControlError, OSError, KeyError):
                pass  # ended or gone


_ROUNDS = itertools.count(int(time.time() * 1000) % 10**9)
"""Protocol round numbers: every command of a ``take_snapshot`` carries one, every reply
echoes it, so a reply to an abandoned round is never taken for one of the current round."""


def _snapshot_round(send_all: Callable[..., None], gather: Callable[..., dict[int, dict[str, Any]]],
                    root: str, job: str, routing: RoutingTable, stop: bool,
                    on_epoch: Callable[[int], None] | None, previous: int | None,
                    stats: list[SnapshotStats] | None, margin: int = 0, aligned: bool = True,
                    discarded: list[str] | None = None, align_timeout: float = 10.0,
                    stuck: bool = False, committer: Executor | None = None) -> int | None:
    began = time.monotonic()
    send_all("hold", margin=margin, barrier=aligned)
    held = gather("held")
    phases = {"held": time.monotonic() - began}
    aligned = aligned and all(r.get("align", True) for r in held.values())
    points = [int(r["point"]) for r in held.values() if r.get("point") is not None]
    step = math.lcm(*(int(r.get("granularity", 1)) for r in held.values()))
    epoch = max(points) if points else 0
    epoch = -(-epoch // step) * step  # a boundary of every source's granularity
    if aligned:  # not at a time an operator holds a token at: it sends there while aligning
        busy = {int(t) for r in held.values() for t in r.get("busy", ())}
        for _ in range(BUSY_TIMES):
            if epoch not in busy:
                break
            epoch += step
    if previous is not None and epoch <= previous:
        # nothing new since the previous snapshot: it stands for this one
        send_all("stop" if stop else "resume")
        return None
    if on_epoch is not None:
        on_epoch(epoch)
    worker_phases: dict[str, float] = {}
    if aligned:
        send_all("checkpoint", root=root, job=job, epoch=epoch, previous=previous,
                 resume=not stop)
        try:
            captured = gather("captured", align_timeout)
        except ReplyTimeout as exc:
            raise InconsistentCut(f"the alignment at epoch {epoch} did not complete: {exc}",
                                  stuck=True) from exc
        paused = phases["captured"] = time.monotonic() - began
        sent = sum(int(r["sent"]) for r in captured.values())
        received = sum(int(r["received"]) for r in captured.values())
        unsettled = sorted(w for w, r in captured.items() if not r.get("settled", True))
        if not stop:
            send_all("cut")  # what a worker sends at times before the epoch after its capture
        if sent != received or unsettled:
            raise InconsistentCut(
                f"the captures at epoch {epoch} are not a consistent cut: {sent} records sent "
                f"and {received} received before them" +
                (f", workers {unsettled} with a move at or before the epoch" if unsettled else ""))
        for r in captured.values():
            for name, seconds in (r.get("phases") or {}).items():
                worker_phases[name] = max(worker_phases.get(name, 0.0), float(seconds))
    else:
        send_all("pause_at", epoch=epoch)
        gather("paused")
        phases["paused"] = time.monotonic() - began
        send_all("drain")  # every source holds at the pause: no worker waits on another's input
        while True:
            idle = gather("idle")
            sent = sum(int(r["sent"]) for r in idle.values())
            received = sum(int(r["received"]) for r in idle.values())
            if sent == received and all(r.get("settled", True) for r in idle.values()):
                phases["idle"] = time.monotonic() - began
                break
            send_all("continue")
        # without stop, each worker resumes its sources as soon as it has captured its state
        send_all("snapshot", root=root, job=job, epoch=epoch, previous=previous, resume=not stop)
        captured = gather("captured")
        paused = phases["captured"] = time.monotonic() - began
    written = gather("written")
    phases["written"] = time.monotonic() - began
    parts = [WorkerPart(w, r["index_path"], int(r["crc32"]), int(r["bytes_written"]),
                        int(r.get("bytes_reused", 0)))
             for w, r in sorted(written.items())]
    def commit() -> None:
        commit_snapshot(root, job=job, epoch=epoch, bins=routing.bins, routing=routing, parts=parts)

    if committer is None:
        commit()
    else:
        committer.submit(commit).result()
    if stop:
        send_all("stop")
    if stats is not None:
        stats.append(SnapshotStats(epoch, paused, time.monotonic() - began,
                                   sum(p.bytes_written for p in parts),
                                   sum(p.bytes_reused for p in parts), phases,
                                   sum(int(r.get("bins_exported", 0)) for r in written.values()),
                                   max(float(r.get("stalled", 0.0)) for r in captured.values()),
                                   "aligned" if aligned else "quiescent", worker_phases,
                                   list(discarded or ()),
                                   sum(int(r.get("held", 0)) for r in captured.values()), stuck,
                                   sum(int(r.get("crossing", 0)) for r in captured.values())))
    return epoch


__all__ = ["ALIGNED_ATTEMPTS", "ControlAgent", "ControlError", "CoordinatorHub", "Hub",
           "InconsistentCut", "Link", "QueueHub", "QueueLink", "ReplyTimeout", "SnapshotStats",
           "take_snapshot"]
