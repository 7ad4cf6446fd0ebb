"""Exactly-once recovery: periodic checkpoints, restart after a crash, resume after the driver
died, graceful stop.

Source: the distributed-DBSP design, "Fault tolerance" (a per-worker two-version state
database committed together by a coordinator; recovery loads the latest checkpoint and replays
the input from there, discarding output produced again), "Input", "Output" and
"Input/output synchronization"; docs/ARCHITECTURE.md ("Recovery").

``CheckpointedJob`` runs a job under the control plane and, every ``interval`` seconds, takes
a checkpoint at a common epoch: by default aligned (``tokenflow.control``): no source waits
for the driver, each worker captures its state as soon as the job has finished the epochs
before the checkpoint's (records of later epochs wait at its operators' inputs meanwhile)
and goes on at once; the parts are written in the background, and the driver commits the
checkpoint (manifest last) when every part is durable.  Parts are incremental (a bin whose
bytes did not change is referenced in the previous checkpoint), and all but the ``keep``
newest checkpoints are pruned (with the input log below the oldest kept).

When a worker dies (or raises), the runtime fails the job; the driver starts it again (all
workers: on Spark a barrier stage is relaunched whole anyway) from the latest checkpoint that
reads back intact (a corrupt or half-written one is skipped with a log line naming the file),
with ``Worker.replay`` set: sources restart from the recorded positions, input handles replay
their log, committing sinks discard epochs already committed.  The checkpoint directory also
holds the job's definition (``JOB.json``), so ``tokenflow resume DIR`` continues a job whose
driver died, at any worker count.

Layout of a checkpoint directory::

    JOB.json                       the job's definition (written by the CLI)
    snapshot-<epoch, 20 digits>/   a checkpoint (``tokenflow.state.snapshot``)
    inputs/                        the input log (``tokenflow.io.inputlog``)
    .stop-request                  ``tokenflow stop DIR`` asks the job to checkpoint and stop
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokenflow.control import ControlError, SnapshotStats, take_snapshot
from tokenflow.execute import JobTimeoutError, WorkerError
from tokenflow.job import JobHandle, JobSpec, job_name, start
from tokenflow.state.bins import DEFAULT_BINS
from tokenflow.state.snapshot import Snapshot, SnapshotError, committed_epochs, prune

log = logging.getLogger("tokenflow.recovery")

JOB_FILE = "JOB.json"
"""The job's definition in its checkpoint directory (``write_definition``)."""
STOP_REQUEST = ".stop-request"
"""The file ``tokenflow stop DIR`` creates in a checkpoint directory."""
COMMIT_NICE = 10
"""How much lower than the driver's the CPU priority of the thread committing manifests and
pruning old checkpoints is (Linux: a nice value per thread).  That bookkeeping (6-12 ms of
CPU a commit, 6-17 ms a prune for q5's parts) ran while the workers went on with the next
epochs; on a machine with as many cores as workers it took CPU from them, and the epochs
right after a checkpoint took 18-53 ms where the others took 1-2 ms (q5 at half load, the
process runtime, 2 workers on 2 cores).  Nothing the workers wait for comes after the commit
(``tokenflow.control.take_snapshot``), so the commit can wait for them."""


def lower_priority() -> None:
    """Lower the calling thread's CPU priority by ``COMMIT_NICE`` (Linux, where the nice
    value is per thread; elsewhere, or where not permitted, nothing happens).  Only for a
    thread that starts no thread or process: they would inherit it."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + COMMIT_NICE)
    except (AttributeError, OSError):
        pass


class RecoveryError(RuntimeError):
    """The job cannot be recovered: restarts exhausted, or no usable checkpoint definition."""


@dataclass
class Event:
    """One thing that happened to a checkpointed job (``CheckpointedJob.events``).

    Attributes:
        kind: ``"checkpoint"``, ``"restart"``, ``"fallback"`` (a checkpoint skipped as
            unusable), ``"restore"`` (an attempt starts from a checkpoint), ``"rescale"``
            (a rescale of the schedule) or ``"stop"``.
        at: ``time.time()`` when it happened.
        epoch: the checkpoint's epoch, where there is one.
        detail: a human-readable line.
    """

    kind: str
    at: float
    epoch: int | None = None
    detail: str = ""


def latest_usable(root: str, job: str, bins: int = DEFAULT_BINS,
                  on_fallback: Callable[[int, str], None] | None = None) -> int | None:
    """The epoch of the newest committed checkpoint under ``root`` whose every file reads
    back intact (``Snapshot.verify``), or None if there is none.  Each checkpoint skipped is
    passed to ``on_fallback(epoch, reason)`` (the reason names the file).

    Raises:
        SnapshotError: a checkpoint of another job or bin count (a wrong directory, not a
            corruption: never skipped).
    """
    for epoch in reversed(committed_epochs(root)):
        try:
            snapshot = Snapshot.open(root, epoch)
        except SnapshotError as exc:
            if on_fallback is not None:
                on_fallback(epoch, str(exc))
            continue
        if snapshot.job != job or snapshot.bins != bins:
            raise SnapshotError(f"{root}: checkpoint at epoch {epoch} is of job {snapshot.job!r} "
                                f"with {snapshot.bins} bins, expected {job!r} with {bins}")
        try:
            snapshot.verify()
        except SnapshotError as exc:
            if on_fallback is not None:
                on_fallback(epoch, str(exc))
            continue
        return epoch
    return None


def write_definition(root: str, definition: dict[str, Any]) -> None:
    """Store the job's definition (JSON: what ``tokenflow resume`` needs to start it again,
    e.g. ``{"target": "mod:fn", "workers": 2, "runtime": "process", ...}``) as
    ``root/JOB.json``, atomically.

    Raises:
        TypeError: ``definition`` is not JSON-serializable.
    """
    os.makedirs(root, exist_ok=True)
    data = json.dumps(definition, indent=2, sort_keys=True).encode()
    tmp = os.path.join(root, f".{JOB_FILE}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, os.path.join(root, JOB_FILE))


def read_definition(root: str) -> dict[str, Any]:
    """The definition stored by ``write_definition``.

    Raises:
        RecoveryError: ``root/JOB.json`` is missing or not a JSON object.
    """
    path = os.path.join(root, JOB_FILE)
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
    except FileNotFoundError:
        raise RecoveryError(f"{path}: no job definition (was the job started with "
                            f"--checkpoint {root}?)") from None
    except (OSError, ValueError) as exc:
        raise RecoveryError(f"{path}: unreadable job definition: {exc}") from exc
    if not isinstance(document, dict):
        raise RecoveryError(f"{path}: the job definition is not a JSON object")
    return document


@dataclass
class _Attempt:
    handle: JobHandle
    previous: int | None
    began: float = field(default_factory=time.monotonic)


class CheckpointedJob:
    """A job run with periodic checkpoints under ``checkpoint`` that restarts itself from the
    latest one when a worker fails (``start``, ``stop``, ``result``).

    Args:
        fn, workers, runtime, options: as for ``tokenflow.execute`` (``coordinator=`` is
            reused across restarts).
        checkpoint: the checkpoint directory (local path; on a cluster a directory every
            executor can reach).
        interval: seconds between the end of one checkpoint and the start of the next.
        name: the job's name (default: the function's qualified name).
        bins: bins of the routing table.
        restarts: failures to recover from before the job fails for good.
        keep: committed checkpoints to retain (at least 2: the previous one is the fallback).
        restore: start from the latest usable checkpoint under ``checkpoint`` if there is one
            (a resumed job); False: a fresh run (the directory must hold no checkpoint).
        margin: epochs a source may still emit beyond its safe point once a periodic
            checkpoint begins (``take_snapshot(margin=)``: sources do not stand still while
            the driver gathers the workers' points); a stopping checkpoint uses 0.
        rescale_schedule: ``[(seconds after start(), n)]``, increasing: spread the bins of
            the job's migrating operators (``tokenflow.rescale``) over workers ``0..n-1`` at
            those times (``JobHandle.rescale``, from the thread that takes the checkpoints,
            never during one).  After a restart the restored operators route by the table of
            the checkpoint, the roster asked for last before the failure is asked for again at
            once, and the rest of the schedule keeps its times (docs/ARCHITECTURE.md,
            "Elasticity": replaying a step or not does not change the output).
        strategy: the migration strategy of the schedule's rescales.
        aligned: take checkpoints by the aligned protocol (``tokenflow.control``: each
            worker captures its state as soon as the epochs before the checkpoint's are done
            and goes on at once; no source waits for the driver or for another worker's
            capture); False: the quiescent one (sources stop, the job drains, every worker
            waits for all captures), as an aligned checkpoint whose captures were not a
            consistent cut is taken again.  After an aligned checkpoint whose alignment did not
            complete in time (``take_snapshot(align_timeout=)``) every later checkpoint is
            quiescent; a job with migrating operators always takes quiescent ones.

    Raises (constructor):
        ValueError: ``interval <= 0``, ``keep < 2``, ``restarts < 0`` or ``margin < 0``; a
            fresh run over a directory that holds checkpoints; worker ``slots`` beyond
            ``workers`` (workers joining and leaving are not checkpointed).
    """

    def __init__(self, fn: Callable[[Any], Any], workers: int = 1, runtime: str = "process", *,
                 checkpoint: str | os.PathLike[str], interval: float = 1.0, name: str | None = None,
                 bins: int = DEFAULT_BINS, restarts: int = 3, keep: int = 2, restore: bool = False,
                 margin: int = 1, rescale_schedule: Sequence[tuple[float, int]] = (),
                 strategy: str = "batched", aligned: bool = True, **options: Any) -> None:
        slots = options.get("slots")
        if slots is not None and slots > workers:
            raise ValueError(f"a checkpointed job cannot have worker slots beyond its {workers} "
                             f"workers (slots={slots}): workers joining and leaving are not "
                             f"checkpointed (the roster and a joined worker's progress state are "
                             f"not part of a checkpoint); rescale among the started workers")
        if interval <= 0:
            raise ValueError(f"the checkpoint interval must be > 0 s, got {interval}")
        if keep < 2:
            raise ValueError(f"keep at least 2 checkpoints (the previous one is the fallback), got {keep}")
        if restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {restarts}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0 epochs, got {margin}")
        self.root = os.path.abspath(os.fspath(checkpoint))
        if not restore and committed_epochs(self.root):
            raise ValueError(f"{self.root} holds checkpoints of an earlier run: resume it "
                             f"(`tokenflow resume {self.root}`) or choose another directory")
        self.fn = fn
        self.workers = workers
        self.runtime = runtime
        self.interval = interval
        self.name = name or job_name(fn)
        self.bins = bins
        self.restarts = restarts
        self.keep = keep
        self.margin = margin
        self.aligned = aligned
        self.options = options
        self.resumed = restore
        """A resumed job: the checkpoint directory may hold output and input log of an
        earlier run even without a checkpoint."""
        self.stats: list[SnapshotStats] = []
        """Every checkpoint taken, in order."""
        self.events: list[Event] = []
        self.failures = 0
        """Failures recovered from so far."""
        self.last_committed: int | None = None
        """Epoch of the latest committed checkpoint (None before the first)."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._result: list[Any] | None = None
        self._error: BaseException | None = None
        self._attempt: _Attempt | None = None
        self._thread: threading.Thread | None = None
        self.schedule = sorted((float(at), int(n)) for at, n in rescale_schedule)
        self.strategy = strategy
        self.rescales: list[Any] = []
        """``RescaleEvent``s of the schedule's rescales (and of their repeats after a
        restart), in order; one cut short by the job ending or failing is not recorded (it is
        asked for again after a restart)."""
        self._began = 0.0
        self._asked: int | None = None  # the roster asked for last (of any attempt)
        self._next = 0  # the schedule's next entry
        self._committer = ThreadPoolExecutor(1, "tokenflow-commit", initializer=lower_priority)
        """Commits manifests and prunes old checkpoints (``COMMIT_NICE``)."""

    # -- control -------------------------------------------------------------------------------

    def start(self) -> CheckpointedJob:
        """Start the job (and its checkpoints) in the background; returns ``self``."""
        os.makedirs(self.root, exist_ok=True)
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="tokenflow-recovery")
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Ask the job to take a last checkpoint and stop (returns at once; ``result()``
        waits).  A later resume redoes no epoch."""
        self._stop.set()
        self._wake.set()

    def result(self, timeout: float | None = None) -> list[Any]:
        """The per-worker results once the job ends (or stopped).

        Raises:
            TimeoutError: still running after ``timeout`` s.
            WorkerError: the job failed more than ``restarts`` times (the last failure).
        """
        if self._thread is None:
            raise RuntimeError("the job was not started")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result or []

    def run(self) -> list[Any]:
        """``start()`` then ``result()``; Ctrl-C stops the job at a checkpoint."""
        self.start()
        try:
            return self.result()
        except KeyboardInterrupt:
            self.stop()
            return self.result()

    # -- the supervisor ------------------------------------------------------------------------

    def _note(self, kind: str, epoch: int | None, detail: str, level: int = logging.INFO) -> None:
        self.events.append(Event(kind, time.time(), epoch, detail))
        log.log(level, "%s: %s", self.name, detail)

    def _supervise(self) -> None:
        try:
            self._result = self._attempts()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc
        finally:
            self._committer.shutdown(wait=False)

    def _attempts(self) -> list[Any]:
        while True:
            epoch = latest_usable(self.root, self.name, self.bins, lambda e, why: self._note(
                "fallback", e, f"checkpoint at epoch {e} is unusable, falling back to the "
                               f"previous one: {why}", logging.WARNING))
            if epoch is not None:
                self._note("restore", epoch, f"starting from the checkpoint at epoch {epoch}")
            self.last_committed = epoch
            spec = JobSpec.create(self.name, self.workers, self.bins,
                                  self.root if epoch is not None else None, epoch,
                                  control=True,
                                  replay=self.failures > 0 or epoch is not None or self.resumed,
                                  log_root=self.root)
            coordinator = self.options.get("coordinator")
            if coordinator is not None:
                _drain(coordinator)
            handle = start(self.fn, self.workers, self.runtime, spec=spec, **self.options)
            self._attempt = _Attempt(handle, epoch)
            self._checkpoint_loop(self._attempt)
            try:
                return handle.result()
            except (JobTimeoutError, KeyboardInterrupt):
                raise
            except WorkerError as exc:
                if self._stop.is_set() or self.failures >= self.restarts:
                    raise
                self.failures += 1
                self._note("restart", self.last_committed,
                           f"worker {exc.worker} failed ({exc}); restart {self.failures} of "
                           f"{self.restarts} from the latest checkpoint", logging.WARNING)

    def _rescale(self, handle: JobHandle, workers: int) -> None:
        """Ask the job to spread its migrating state over workers ``0..workers-1`` (between
        two checkpoints: both use the same control connection)."""
        from tokenflow.rescale.remote import RescaleEvent

        at = time.monotonic() - self._began
        try:
            steps = int(handle.rescale(workers, self.strategy))
            event = RescaleEvent(at, workers, self.strategy, steps, "schedule")
        except Exception as exc:  # noqa: BLE001 - recorded; a failed job is seen by the loop
            handle.wait(0.5)
            if not handle.running:  # the attempt ended or failed meanwhile: not this one's fault
                self._note("rescale", None, f"rescale to {workers} workers skipped: the job "
                                            f"ended ({exc}); asked again after a restart")
                return
            event = RescaleEvent(at, workers, self.strategy, 0, "schedule",
                                 f"{type(exc).__name__}: {exc}")
        self.rescales.append(event)
        self._note("rescale", None, f"rescale to {workers} workers: "
                                    f"{event.error or f'{event.steps} steps'}")

    def _follow_schedule(self, handle: JobHandle) -> None:
        """The schedule's next entry if it is due (seconds after ``start``): one per call,
        so a schedule whose rescales take longer than its spacing (they fall behind) still
        lets the checkpoint between two of them be taken, rather than starving every
        checkpoint until the schedule is done."""
        if self._next < len(self.schedule) and handle.running and \
                time.monotonic() - self._began >= self.schedule[self._next][0]:
            self._asked = self.schedule[self._next][1]
            self._next += 1
            self._rescale(handle, self._asked)

    def _checkpoint_loop(self, attempt: _Attempt) -> None:
        handle = attempt.handle
        if self._asked is not None:
            # restored: the operators route by the checkpoint's table; ask for the roster
            # asked for last again (the output does not depend on it, the final roster does)
            self._rescale(handle, self._asked)
        workers = set(range(self.workers))
        while handle.running and not workers <= handle.hub.started():
            # the first interval begins once every worker has started: a checkpoint asked
            # for earlier waits for their start and counts the wait as its pause
            handle.wait(0.02)
            self._follow_schedule(handle)
        while handle.running:
            deadline = time.monotonic() + self.interval
            while handle.running and not self._wake.is_set() and time.monotonic() < deadline:
                handle.wait(0.02)  # a job that ends (or fails) is seen at once
                self._follow_schedule(handle)
            self._wake.clear()
            if not handle.running:
                return
            request = os.path.join(self.root, STOP_REQUEST)
            if os.path.exists(request):
                os.remove(request)
                self._stop.set()
            stop = self._stop.is_set()
            try:
                epoch = take_snapshot(handle.hub, list(range(self.workers)), self.root, self.name,
                                      handle.spec.table, stop=stop, alive=lambda: handle.running,
                                      previous=attempt.previous, stats=self.stats,
                                      margin=0 if stop else self.margin,
                                      aligned=self.aligned, committer=self._committer)
            except (ControlError, SnapshotError, OSError) as exc:
                handle.wait(0.5)  # a job that just ended cannot answer: not worth a warning
                if not handle.running:
                    return  # the job ended or failed meanwhile: the supervisor sees which
                self._note("checkpoint", None, f"checkpoint failed: {exc}", logging.WARNING)
                continue
            if epoch is not None:
                attempt.previous = self.last_committed = epoch
                last = self.stats[-1] if self.stats else None
                if last is not None and last.stuck and self.aligned:
                    self.aligned = False  # see ``aligned``
                    self._note("checkpoint", epoch, "an aligned checkpoint did not complete in "
                               f"time ({last.discarded[-1]}); quiescent checkpoints from now on",
                               logging.WARNING)
                how = "" if last is None or last.epoch != epoch else \
                    f" ({last.protocol}" + (f", after a discarded aligned attempt: "
                                            f"{last.discarded[-1]}" if last.discarded else "") + ")"
                self._note("checkpoint", epoch, f"checkpoint at epoch {epoch} committed{how}")
                self._committer.submit(self._prune).result()
            if stop:
                self._note("stop", self.last_committed, "stopped at a checkpoint")
                return

    def _prune(self) -> None:
        prune(self.root, self.keep)
        kept = committed_epochs(self.root)
        if kept:
            from tokenflow.io.inputlog import truncate
            truncate(self.root, kept[0], job=self.name)


def _drain(coordinator: Any) -> None:
    """Drop control replies left from an earlier attempt."""
    inbox = getattr(coordinator, "inbox", None)
    while inbox is not None and not inbox.empty():
        inbox.get_nowait()


def run_checkpointed(fn: Callable[[Any], Any], workers: int = 1, runtime: str = "process", *,
                     checkpoint: str | os.PathLike[str], interval: float = 1.0,
                     **options: Any) -> list[Any]:
    """Run ``fn`` like ``execute`` with checkpoints every ``interval`` s under ``checkpoint``,
    recovering from worker failures (``CheckpointedJob``; ``options`` as there).  Returns the
    per-worker results.

    Raises:
        WorkerError: the job failed more often than ``restarts`` (default 3).
    """
    return CheckpointedJob(fn, workers, runtime, checkpoint=checkpoint, interval=interval,
                           **options).run()


__all__ = ["JOB_FILE", "STOP_REQUEST", "CheckpointedJob", "Event", "RecoveryError", "latest_usable",
           "read_definition", "run_checkpointed", "write_definition"]
