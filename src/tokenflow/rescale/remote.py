"""Rescaling a running job from the driver: a schedule, and requests from outside the job
(``tokenflow scale``) through the job's coordinator.

Source: docs/ARCHITECTURE.md ("Elasticity", "Security": the coordinator faces the network,
authenticates every connection with the job's token and never unpickles);
``tokenflow.coordinator`` (the hello and the sealed msgpack frames this reuses).

* ``ScaleCoordinator`` is the job's ``Coordinator`` that also takes *scale requests*: an
  authenticated connection (the workers' hello, with the job's token) sends the msgpack map
  ``{"kind": "scale", "workers": n, "strategy": s}`` (``n >= 1``, ``s`` one of
  ``STRATEGIES``); the request is queued (``requests``) for the driver, which answers on the
  same connection ``{"kind": "scaled", "workers": n, "steps": k}`` or
  ``{"kind": "scale_failed", "error": text}``.  A malformed request is refused (logged, the
  connection goes on), like a malformed report.
* ``request_scale(endpoint, n)`` is the client (``tokenflow scale``).
* ``ScaleDriver`` runs on the driver next to a ``JobHandle``: one thread that follows a
  schedule (seconds after the start : workers) and the coordinator's requests, one rescale at
  a time (``JobHandle.rescale``), and records each as a ``RescaleEvent``.
* ``write_control_file`` / ``read_control_file``: where a running job's coordinator is
  (``{"host", "port", "token", "job", "workers", "pid"}``, JSON, mode 0600, removed when the
  job ends), so that ``tokenflow scale`` finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenflow.coordinator import Coordinator, Reporter, ReportError
from tokenflow.rescale.megaphone import STRATEGIES

MAX_WORKERS = 1 << 16
"""Largest worker count a scale request may name."""


@dataclass(frozen=True)
class ScaleRequest:
    """A request from outside the job: spread the state over ``workers`` workers."""

    workers: int
    strategy: str
    reply: Callable[[dict[str, Any]], None]


def validate_scale(message: dict[str, Any]) -> tuple[int, str]:
    """``(workers, strategy)`` of a scale request map.

    Raises:
        ReportError: ``workers`` is not an integer in ``[1, MAX_WORKERS]`` or ``strategy``
            not one of ``STRATEGIES`` (naming the field).
    """
    workers = message.get("workers")
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ReportError(f"scale request: 'workers' must be an integer in [1, {MAX_WORKERS}], "
                          f"got {workers!r:.60}")
    strategy = message.get("strategy", "batched")
    if strategy not in STRATEGIES:
        raise ReportError(f"scale request: 'strategy' must be one of {', '.join(STRATEGIES)}, "
                          f"got {strategy!r:.60}")
    return workers, str(strategy)


class ScaleCoordinator(Coordinator):
    """The job's ``Coordinator`` that also queues scale requests (module notes).

    Attributes:
        requests: ``ScaleRequest``s in arrival order (``ScaleDriver`` takes them).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.requests: queue.Queue[ScaleRequest] = queue.Queue()
        super().__init__(*args, **kwargs)

    def _take(self, message: dict[str, Any], channel: Any) -> None:
        if message.get("kind") == "scale":
            workers, strategy = validate_scale(message)

            def reply(answer: dict[str, Any]) -> None:
                with contextlib.suppress(OSError):  # the client may have given up
                    channel.send(answer)

            self.requests.put(ScaleRequest(workers, strategy, reply))
            return
        super()._take(message, channel)


def request_scale(endpoint: tuple[str, int, str], workers: int, strategy: str = "batched",
                  timeout: float = 60.0) -> dict[str, Any]:
    """Ask the job whose coordinator is at ``endpoint`` (``(host, port, token)``) to spread
    its state over ``workers`` workers; returns its answer (``{"kind": "scaled", "steps"}``
    or ``{"kind": "scale_failed", "error"}``).

    Raises:
        ConnectionError: the coordinator cannot be reached or failed the token check.
        TimeoutError: no answer within ``timeout`` s.
    """
    client = Reporter(endpoint)
    if client.sock is None:
        raise ConnectionError(f"cannot reach the job's coordinator at {endpoint[0]}:{endpoint[1]} "
                              f"(not running, or a wrong token)")
    try:
        client.send({"kind": "scale", "workers": workers, "strategy": strategy})
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            answer = client.poll(left)
            if answer is not None and answer.get("kind") in ("scaled", "scale_failed"):
                return answer
        raise TimeoutError(f"the job did not answer the scale request within {timeout:g} s")
    finally:
        client.close()


@dataclass
class RescaleEvent:
    """One rescale the driver asked for.

    Attributes:
        seconds: when, after the driver started following (s).
        workers: the roster asked for (workers ``0..workers-1``).
        strategy: the migration strategy.
        steps: migration steps worker 0 planned (0: nothing moved, or it failed).
        source: ``"schedule"`` or ``"request"`` (``tokenflow scale``).
        error: why it failed, or None.
    """

    seconds: float
    workers: int
    strategy: str
    steps: int
    source: str
    error: str | None = None


class ScaleDriver:
    """Follow ``schedule`` (``[(seconds after start, workers)]``, increasing) and, when given,
    a ``ScaleCoordinator``'s requests, rescaling ``handle`` (a ``JobHandle``) one at a time
    from a daemon thread until the job ends or ``stop``.  ``on_event(event)`` is called after
    each rescale (from that thread).

    Requests for more workers than the job's processes are answered ``scale_failed``.  A job
    started with free worker slots (``start(..., slots=M)``) grows and shrinks by worker
    processes joining and leaving (``JobHandle.scale``); otherwise the roster changes among the
    processes it started with (``JobHandle.rescale``).
    """

    def __init__(self, handle: Any, schedule: Sequence[tuple[float, int]] = (),
                 strategy: str = "batched", coordinator: Any = None,
                 on_event: Callable[[RescaleEvent], None] | None = None) -> None:
        self.handle = handle
        self.schedule = list(schedule)
        self.strategy = strategy
        self.requests: queue.Queue[ScaleRequest] | None = getattr(coordinator, "requests", None)
        self.on_event = on_event
        self.events: list[RescaleEvent] = []
        self._stop = threading.Event()
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tokenflow-scale")

    def start(self) -> ScaleDriver:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _rescale(self, workers: int, strategy: str, source: str) -> RescaleEvent:
        at = time.monotonic() - self._began
        try:
            if getattr(self.handle, "slots", 0) > getattr(self.handle, "workers", 0):
                self.handle.scale(workers, strategy)  # worker processes join or leave
                steps = int(self.handle.scale_steps)
            else:
                steps = int(self.handle.rescale(workers, strategy))
            event = RescaleEvent(at, workers, strategy, steps, source)
        except Exception as exc:  # noqa: BLE001 - reported; the job goes on
            event = RescaleEvent(at, workers, strategy, 0, source, f"{type(exc).__name__}: {exc}")
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        return event

    def _run(self) -> None:
        pending = list(self.schedule)
        while not self._stop.is_set() and self.handle.running:
            wait = 0.1
            if pending:
                wait = min(wait, max(0.0, self._began + pending[0][0] - time.monotonic()))
                if wait <= 0:
                    self._rescale(pending.pop(0)[1], self.strategy, "schedule")
                    continue
            if self.requests is None:
                self._stop.wait(wait)
                continue
            try:
                request = self.requests.get(timeout=wait)
            except queue.Empty:
                continue
            event = self._rescale(request.workers, request.strategy, "request")
            if event.error is None:
                request.reply({"kind": "scaled", "workers": event.workers, "steps": event.steps})
            else:
                request.reply({"kind": "scale_failed", "error": event.error[:4096]})
        if self.requests is not None:  # the job ended: answer what is left
            while True:
                try:
                    request = self.requests.get_nowait()
                except queue.Empty:
                    break
                request.reply({"kind": "scale_failed", "error": "the job has ended"})


def write_control_file(path: Path, endpoint: tuple[str, int, str], job: str, workers: int) -> None:
    """Write where the running job's coordinator is (JSON, mode 0600: it holds the token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"host": endpoint[0], "port": endpoint[1], "token": endpoint[2], "job": job,
                   "workers": workers, "pid": os.getpid()}, f)
    os.replace(partial, path)


def read_control_file(path: Path) -> dict[str, Any]:
    """The control file's map.

    Raises:
        FileNotFoundError: no job wrote it (or it ended).
        ValueError: not a control file (a field missing or of the wrong type).
    """
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("host"), str) or \
            not isinstance(data.get("port"), int) or not isinstance(data.get("token"), str):
        raise ValueError(f"{path} is not a tokenflow control file")
    return data


@contextlib.contextmanager
def control_file(path: Path | None, endpoint: tuple[str, int, str], job: str,
                 workers: int) -> Iterator[None]:
    """``write_control_file`` for the duration of the block (nothing when ``path`` is None);
    removed afterwards if it is still this process's."""
    if path is None:
        yield
        return
    write_control_file(path, endpoint, job, workers)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if read_control_file(path).get("pid") == os.getpid():
                path.unlink()


__all__ = ["MAX_WORKERS", "RescaleEvent", "ScaleCoordinator", "ScaleDriver", "ScaleRequest",
           "control_file", "read_control_file", "request_scale", "validate_scale",
           "write_control_file"]
