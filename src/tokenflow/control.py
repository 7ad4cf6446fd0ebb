"""The control plane: commands from the driver that take effect at logical times, and the
snapshot protocol built on them.

Source: the distributed-DBSP design, "Coordinator" and "Coordinator/worker synchronization"
(a coordinator tells every worker when to commit its state; a checkpoint is the basis for
recovery once every worker's part is durable) and "Layout changes" (cold: stop at a
checkpoint, restart with another layout); docs/ARCHITECTURE.md ("Sources, sinks and the
control plane").

Transport: on the ``process`` and ``spark`` runtimes the driver's ``Coordinator`` and each
worker's ``Reporter`` (``tokenflow.coordinator``: msgpack frames, token-authenticated, never
pickle); on the ``thread`` runtime in-process queues (``QueueHub``).  Every message is a map
with a ``"kind"``.

Commands (driver -> workers) and replies (workers -> driver):

``hold``
    every source of the worker pauses at once at its *safe point* (the least epoch boundary
    after everything it has emitted); reply ``held`` with ``point`` (the greatest such epoch
    of the worker's sources, or None without sources) and ``granularity`` (the least common
    multiple of its sources' epoch lengths: the common pause epoch must be a boundary of all).
``pause_at`` ``epoch``
    sources emit everything before ``epoch`` and nothing at or after it; the worker steps on
    and replies ``paused`` once all its sources hold at ``epoch`` (worker code feeding an
    ``InputHandle`` may need other workers to step to get there, e.g. waiting on a probe, so
    nobody blocks yet).
``drain``
    (once every worker is paused) the worker steps until it has nothing to do, then replies
    ``idle`` with its ``Traffic`` counters (``sent``, ``received``) — and waits, not stepping,
    for the verdict:
``continue``
    not quiescent yet (the job's records sent and received differ): step and reply ``idle``
    again.
``snapshot`` ``root``, ``job``, ``epoch``
    write this worker's part of the snapshot (``tokenflow.state.snapshot``: every declared
    state's bins, and the source positions as metadata); reply ``written``.
``resume`` / ``stop``
    sources go on / the worker ends its dataflows and returns.

Quiescence: a worker replies ``idle`` only with nothing left to run, and it takes no step
until the verdict, so after its reply it sends nothing.  A record counted as sent by one
worker is therefore either received before its receiver's reply or still in flight; when the
sums of ``sent`` and ``received`` over all replies are equal, nothing is in flight and every
worker is idle: no operator can change its state until the sources resume, and the states
written hold the effect of every record before the pause epoch and of none at or after it.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tokenflow.state.bins import RoutingTable
from tokenflow.state.snapshot import WorkerPart, commit_snapshot, write_worker_part


class ControlError(RuntimeError):
    """The control protocol failed: a worker did not answer in time or answered wrongly."""


class Hub(Protocol):
    """The driver's side: send commands, receive replies."""

    def send(self, worker: int, message: dict[str, Any]) -> None: ...

    def receive(self, timeout: float) -> dict[str, Any] | None: ...


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

    def send(self, worker: int, message: dict[str, Any]) -> None:
        self.commands[worker].put(dict(message))

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def link(self, worker: int) -> QueueLink:
        """The worker's end."""
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


class CoordinatorHub:
    """A ``Hub`` over the driver's ``Coordinator`` (process and spark runtimes)."""

    def __init__(self, coordinator: Any, connect_timeout: float = 60.0,
                 alive: Callable[[], bool] | None = None) -> None:
        self.coordinator = coordinator
        self.connect_timeout = connect_timeout
        self.alive = alive
        """Whether the job still runs (a worker of an ended job never connects)."""

    def send(self, worker: int, message: dict[str, Any]) -> None:
        """Send to ``worker``, waiting up to ``connect_timeout`` s for it to connect (workers
        connect when they start).

        Raises:
            ControlError: the worker did not connect in time.
        """
        deadline = time.monotonic() + self.connect_timeout
        while worker not in self.coordinator.connected():
            if self.alive is not None and not self.alive():
                raise ControlError(f"the job ended before worker {worker} connected to the "
                                   "coordinator (nothing left to snapshot?)")
            if time.monotonic() > deadline:
                raise ControlError(f"worker {worker} did not connect to the coordinator within "
                                   f"{self.connect_timeout} s")
            time.sleep(0.01)
        self.coordinator.send(worker, message)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.coordinator.inbox.get(timeout=timeout)  # type: ignore[no-any-return]
        except queue.Empty:
            return None


class ControlAgent:
    """The worker side of the control protocol, run after every step (``Worker.on_step``).

    Args:
        link: the transport to the driver.
        wait: seconds to wait for a verdict before failing (the driver is gone).
    """

    def __init__(self, link: Link, wait: float = 120.0) -> None:
        self.link = link
        self.wait = wait
        self.pause_epoch: int | None = None
        self.announced = False  # told the driver that every source holds at the pause
        self.draining = False  # the driver asked for idle reports
        self.stopped = False

    def __call__(self, worker: Any) -> None:
        message: dict[str, Any] | None = self.link.poll(0.0)
        while message is not None:
            message = self._handle(worker, message)
        if self.pause_epoch is None:
            return
        if not self.announced and self._paused(worker):
            self.announced = True
            self.link.send({"kind": "paused", "worker": worker.index, "epoch": self.pause_epoch})
        if self.draining and self._paused(worker) and worker.activations.is_empty():
            self._report_idle(worker)

    def _sources(self, worker: Any) -> list[Any]:
        return list(getattr(worker, "sources", {}).values())

    def _paused(self, worker: Any) -> bool:
        return all(s.paused for s in self._sources(worker))

    def _report_idle(self, worker: Any) -> None:
        """Reply ``idle`` and wait, without stepping, for the verdict."""
        self.link.send({"kind": "idle", "worker": worker.index, "epoch": self.pause_epoch,
                        "sent": worker.traffic.sent, "received": worker.traffic.received})
        message: dict[str, Any] | None = self._await(worker)
        while message is not None:
            message = self._handle(worker, message)

    def _await(self, worker: Any) -> dict[str, Any]:
        message = self.link.poll(self.wait)
        if message is None:
            raise ControlError(f"worker {worker.index}: no command from the driver for {self.wait} s "
                               "while paused")
        return message

    def _handle(self, worker: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Carry out one command; returns a command to carry out next (one that must follow
        without a step in between), or None."""
        kind = message.get("kind")
        if kind == "hold":
            points, step = [], 1
            for source in self._sources(worker):
                point = source.safe_point()
                step = math.lcm(step, int(source.granularity))
                if point is not None:
                    source.pause_at(point)
                    points.append(point)
            self.link.send({"kind": "held", "worker": worker.index,
                            "point": max(points) if points else None, "granularity": step})
        elif kind == "pause_at":
            epoch = int(message["epoch"])
            for source in self._sources(worker):
                source.pause_at(epoch)
            self.pause_epoch = epoch
            self.announced = self.draining = False
        elif kind == "drain":
            self.draining = True
        elif kind == "continue":
            return None
        elif kind == "snapshot":
            part = write_worker_part(
                message["root"], job=message["job"], epoch=int(message["epoch"]),
                worker=worker.index, bins=worker.routing.bins, states=worker.export_states(),
                meta={"sources": {key: s.positions() for key, s in getattr(worker, "sources", {}).items()}})
            self.link.send({"kind": "written", "worker": worker.index, "index_path": part.index_path,
                            "crc32": part.crc32, "bytes_written": part.bytes_written})
            return self._await(worker)
        elif kind == "resume":
            self.pause_epoch = None
            self.draining = False
            for source in self._sources(worker):
                source.resume()
        elif kind == "stop":
            self.pause_epoch = None
            self.draining = False
            self.stopped = True
            worker.stop()
        else:
            raise ControlError(f"worker {worker.index}: unknown command {message!r}")
        return None


def _gather(hub: Hub, kind: str, workers: Iterable[int], timeout: float,
            alive: Callable[[], bool] | None = None) -> dict[int, dict[str, Any]]:
    """One reply of ``kind`` from each of ``workers``.

    Raises:
        ControlError: a reply of another kind, none within ``timeout`` seconds, or the job
            ended (``alive()`` false) before every worker replied.
    """
    waiting = set(workers)
    replies: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while waiting:
        left = deadline - time.monotonic()
        message = hub.receive(min(0.1, left)) if left > 0 else None
        if message is None:
            if left > 0 and (alive is None or alive()):
                continue
            if left > 0:
                raise ControlError(f"the job ended before workers {sorted(waiting)} sent "
                                   f"{kind!r} (nothing left to snapshot?)")
            raise ControlError(f"no {kind!r} reply from workers {sorted(waiting)} within {timeout} s")
        if message.get("kind") != kind:
            raise ControlError(f"expected {kind!r} replies, worker {message.get('worker')} sent {message!r}")
        worker = message.get("worker")
        if worker not in waiting:
            raise ControlError(f"unexpected {kind!r} reply from worker {worker!r}")
        waiting.discard(worker)
        replies[worker] = message
    return replies


def take_snapshot(hub: Hub, workers: list[int], root: str, job: str, routing: RoutingTable,
                  stop: bool = True, timeout: float = 60.0,
                  on_epoch: Callable[[int], None] | None = None,
                  alive: Callable[[], bool] | None = None) -> int:
    """Pause every source at a common epoch, wait for quiescence, write and commit the
    snapshot, then stop the job (or resume it).  Returns the snapshot's epoch.  ``alive()``
    tells whether the job still runs (a job that ends cannot answer).

    Raises:
        ControlError: a worker does not answer within ``timeout`` seconds, or the job ended.
        SnapshotError: a worker's part cannot be committed.
    """
    for w in workers:
        hub.send(w, {"kind": "hold"})
    held = _gather(hub, "held", workers, timeout, alive)
    points = [int(r["point"]) for r in held.values() if r.get("point") is not None]
    step = math.lcm(*(int(r.get("granularity", 1)) for r in held.values()))
    epoch = max(points) if points else 0
    epoch = -(-epoch // step) * step  # a boundary of every source's granularity
    if on_epoch is not None:
        on_epoch(epoch)
    for w in workers:
        hub.send(w, {"kind": "pause_at", "epoch": epoch})
    _gather(hub, "paused", workers, timeout, alive)
    for w in workers:  # every source holds at the pause: no worker waits on another's input
        hub.send(w, {"kind": "drain"})
    while True:
        idle = _gather(hub, "idle", workers, timeout, alive)
        sent = sum(int(r["sent"]) for r in idle.values())
        received = sum(int(r["received"]) for r in idle.values())
        if sent == received:
            break
        for w in workers:
            hub.send(w, {"kind": "continue"})
    for w in workers:
        hub.send(w, {"kind": "snapshot", "root": root, "job": job, "epoch": epoch})
    written = _gather(hub, "written", workers, timeout, alive)
    parts = [WorkerPart(w, r["index_path"], int(r["crc32"]), int(r["bytes_written"]))
             for w, r in sorted(written.items())]
    commit_snapshot(root, job=job, epoch=epoch, bins=routing.bins, routing=routing, parts=parts)
    for w in workers:
        hub.send(w, {"kind": "stop" if stop else "resume"})
    return epoch


__all__ = ["ControlAgent", "ControlError", "CoordinatorHub", "Hub", "Link", "QueueHub", "QueueLink",
           "take_snapshot"]
