"""The ``process`` runtime: W local worker processes joined by the TCP mesh (no Spark).

Source: docs/ARCHITECTURE.md ("Execution model").  The driver starts W processes (forked by a
``forkserver`` that has imported the worker's modules once, ``spawn`` where there is none: see
``start_context``) and talks to each over a ``Pipe``: it collects their listening addresses, sends
every worker the address list, and waits for each worker's result, watching the processes:

* a worker that dies (e.g. SIGKILL) fails the job with an error naming it;
* a worker that stops sending heartbeats (a thread of each worker sends one over the pipe every
  ``HEARTBEAT_INTERVAL`` s, whether or not the worker steps) for ``heartbeat_timeout`` s, e.g.
  because it was SIGSTOPped, fails the job as *stalled* (``tokenflow.coordinator.Liveness``);
* ``timeout`` bounds the whole job;
* on a failure the remaining workers are terminated (SIGTERM, then SIGKILL after
  ``TERMINATE_GRACE`` s).

Orphans: a worker dies with its driver.  On Linux it asks for ``SIGKILL`` when its parent
exits (``prctl(PR_SET_PDEATHSIG)``; the kernel sends it when the *thread* that started the worker
ends: the driver's, or the forkserver's, which exits when the driver does; ``execute_process``
only returns once its workers are gone), and its heartbeat thread exits the process when the
parent's pid changes or the pipe breaks (any platform).  On the
driver's main thread, SIGINT and SIGTERM terminate the workers and then raise ``JobInterrupted``
(a ``KeyboardInterrupt``) or ``JobTerminated`` (a ``SystemExit`` with a message: exit status
1); handlers are installed only over the default ones, for the duration of the call.  Worker
processes still running at interpreter exit (e.g. the job ran on another thread) are terminated
by an ``atexit`` hook instead of being waited for.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing as mp
import multiprocessing.util  # noqa: F401 - its atexit hook must be registered before ours
import os
import queue
import secrets
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from tokenflow.comm.auth import new_secret
from tokenflow.comm.tcp import bind_listener
from tokenflow.coordinator import DEFAULT_HEARTBEAT_TIMEOUT, HEARTBEAT_INTERVAL, Liveness
from tokenflow.inputs import partition_inputs

FAILURE_GRACE = 2.0
"""Seconds the driver waits for the root cause after a worker reports a lost peer."""
TERMINATE_GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL when the driver ends its workers after a failure."""
EXIT_WAIT = 5.0
"""Seconds the driver waits for workers to exit after they all sent their results."""
POLL = 0.25
START_TIMEOUT = 60.0
"""Seconds a worker joining a running job may take to start and report its address."""
"""Seconds the driver waits for a message before checking heartbeats and the deadline."""
EXIT_ORPHANED = 70
"""Exit status of a worker whose driver went away."""
_PR_SET_PDEATHSIG = 1

_RUNNING: set[Any] = set()
"""Worker processes (``multiprocessing`` ``Process``) of the jobs running in this process."""


class WorkerProcessError(RuntimeError):
    """A worker process failed, died or stalled; ``worker`` is its index (-1: the job as a
    whole, e.g. its ``timeout``); ``timed_out`` marks the timeout."""

    def __init__(self, worker: int, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.worker = worker
        self.timed_out = timed_out


class JobInterrupted(KeyboardInterrupt):
    """The driver got SIGINT during ``execute_process``; the workers were terminated."""


class JobTerminated(SystemExit):
    """The driver got SIGTERM during ``execute_process``; the workers were terminated.  Its
    ``code`` is the message (an uncaught one prints it and exits with status 1)."""


# -- the worker side ---------------------------------------------------------------------------


def _die_with_driver(driver: int, parent: int) -> None:
    """Ask the kernel for SIGKILL when the parent goes (Linux), and exit at once if the driver
    already has.  ``parent`` is the driver (``spawn``) or its forkserver, which exits when the
    driver does (its end of the server's pipe closes), so a worker dies with either."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the thread below
            pass
    if os.getppid() != parent or not _alive(driver):
        os._exit(EXIT_ORPHANED)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a process of another user took the pid
        return False
    return True


class _DriverLink:
    """The worker's end of the pipe: sends under a lock shared with the heartbeat thread,
    which also ends the process when the driver is gone."""

    def __init__(self, conn: Connection, parent: int, interval: float) -> None:
        self.conn = conn
        self.parent = parent  # the driver or its forkserver: gone when the driver is
        self.interval = interval
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="tokenflow-heartbeat")
        self.thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(message)

    def _beat(self) -> None:
        while not self.stopped.wait(self.interval):
            if os.getppid() != self.parent:
                os._exit(EXIT_ORPHANED)
            with self.lock:
                if self.stopped.is_set():
                    return
                try:
                    self.conn.send(("heartbeat",))
                except (OSError, ValueError):  # the driver closed the pipe or is gone
                    os._exit(EXIT_ORPHANED)

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()


def _worker_main(index: int, peers: int, secret: bytes, job: str, payload: bytes,
                 conn: Connection, host: str, max_frame: int | None,
                 report_to: tuple[str, int, str] | None, spec: Any = None,
                 driver: int | None = None, environ: dict[str, str] | None = None) -> None:
    from tokenflow.cluster import run_worker

    if environ is not None:  # the driver's, now (a forkserver's children inherit its own)
        os.environ.clear()
        os.environ.update(environ)
    parent = os.getppid()  # the driver, or the forkserver it started (which dies with it)
    if driver is not None:
        _die_with_driver(driver, parent)
    link = _DriverLink(conn, parent, HEARTBEAT_INTERVAL)
    try:
        listener = bind_listener(host, 0)
        link.send(("address", listener.getsockname()[:2]))
        kind, addresses, inputs, roster, joining = conn.recv()
        fn = cloudpickle.loads(payload)

        def configure(worker: Any) -> None:
            worker.inputs = inputs

        result = run_worker(fn, index, peers, listener, addresses, secret, job, configure,
                            max_frame=max_frame, report_to=report_to, spec=spec,
                            roster=roster, joining=joining)
        link.send(("result", cloudpickle.dumps(result)))
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        try:
            link.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                       _is_consequence(exc)))
        except Exception:  # pragma: no cover - the driver is gone
            pass
    finally:
        link.stop()
        conn.close()


def _is_consequence(exc: BaseException) -> bool:
    """True for a worker failing only because a peer went away (``PeerLostError``: its
    connection closed or reset): the peer's own report or death is the root cause to name.
    A refused frame (``FrameRefusedError``) is a root cause itself."""
    from tokenflow.comm.tcp import PeerLostError

    return isinstance(exc, PeerLostError)


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:  # pragma: no cover
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- the driver side ---------------------------------------------------------------------------


PRELOAD = ["tokenflow.process", "tokenflow.cluster", "tokenflow.comm.tcp", "cloudpickle",
           "pandas"]
"""Modules a forkserver imports once, before it forks any worker: what every worker imports
anyway (pyarrow and numpy through these; pandas, which pyarrow imports on its first
conversion)."""


def start_context() -> Any:
    """The multiprocessing context workers start from: ``forkserver`` where the platform has it
    (Linux), with ``PRELOAD`` imported once in the server, so a worker starts in about 10 ms
    instead of the 0.3-0.6 s a fresh interpreter takes to import them (``spawn``, the fallback).
    A forked worker gets the driver's ``sys.path`` and working directory from multiprocessing
    and its environment from ``_worker_main``'s ``environ``, as a spawned one would."""
    if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - not Linux
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx




class _Run:
    """The driver's view of one job's worker processes.

    ``active``: workers that have not yet sent their result or error; ``events()`` waits for
    their messages, records heartbeats, and raises for the deadline or a stalled worker.
    """

    def __init__(self, workers: int, job: str, timeout: float | None,
                 heartbeat_timeout: float | None) -> None:
        self.workers = workers
        self.job = job
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.liveness = None if heartbeat_timeout is None else Liveness(workers, heartbeat_timeout)
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.active: set[int] = set()
        self.open: set[int] = set()  # workers whose pipe has not reached its end
        self.exited: set[int] = set()  # workers whose process has ended
        self.backlog: list[tuple[int, Any]] = []
        self.launcher: Callable[[int, list[int]], None] | None = None
        self.joined_results: dict[int, Any] = {}  # results of workers that joined later
        self._launches: queue.Queue[tuple[int, list[int], threading.Event, list[Any]]] = \
            queue.Queue()

    def request_launch(self, k: int, members: list[int], timeout: float = 60.0) -> None:
        """Have the driver's event loop start worker ``k`` (called from another thread:
        ``JobHandle.add_worker``).

        Raises:
            WorkerProcessError: the worker did not start; TimeoutError: no answer in time.
        """
        done, error = threading.Event(), []
        self._launches.put((k, members, done, error))
        if not done.wait(timeout):
            raise TimeoutError(f"worker {k} was not started within {timeout:g} s")
        if error:
            raise error[0]

    def serve_launches(self) -> None:
        """Start the workers requested by ``request_launch`` (on the event loop's thread)."""
        while not self._launches.empty():
            k, members, done, error = self._launches.get()
            try:
                if self.launcher is None:
                    raise WorkerProcessError(k, "this job has no free worker slots")
                self.launcher(k, members)
            except BaseException as exc:  # noqa: BLE001 - handed to the requesting thread
                error.append(exc)
            done.set()

    def spawn(self, ctx: Any, args: Callable[[int, Connection], tuple[Any, ...]]) -> None:
        for i in range(self.workers):
            self.spawn_one(ctx, i, args)

    def spawn_one(self, ctx: Any, i: int, args: Callable[[int, Connection], tuple[Any, ...]]) -> None:
        """Start worker ``i`` (the next index: workers joining later are appended)."""
        assert i == len(self.procs), f"worker {i} started out of order"
        parent, child = ctx.Pipe()
        self.conns.append(parent)
        p = ctx.Process(target=_worker_main, name=f"tokenflow-worker-{i}", args=args(i, child))
        p.start()
        self.procs.append(p)
        _RUNNING.add(p)
        child.close()
        if self.liveness is not None and i >= self.workers:  # joining: watched from now
            self.liveness.watch(i)
        self.active.add(i)
        self.open.add(i)

    def finish(self, i: int) -> None:
        """Worker ``i`` sent its result or error: no longer watched."""
        self.active.discard(i)
        if self.liveness is not None:
            self.liveness.finish(i)

    def _drain(self, i: int) -> None:
        """Read everything waiting on worker ``i``'s pipe: heartbeats are recorded, other
        messages (and ``None`` for the end of the pipe) go to the backlog."""
        conn = self.conns[i]
        try:
            while i in self.open and conn.poll(0):
                msg = conn.recv()
                if self.liveness is not None:
                    self.liveness.beat(i)
                if msg[0] != "heartbeat":
                    self.backlog.append((i, msg))
        except (EOFError, OSError):
            self.open.discard(i)
            self.backlog.append((i, None))

    def _check(self) -> None:
        """Raise for the deadline or a stalled worker."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WorkerProcessError(-1, f"job {self.job} timed out after {self.timeout:g} s",
                                     timed_out=True)
        if self.liveness is None or self.liveness.stalled() is None:
            return
        for i in sorted(self.active):  # heartbeats may wait unread if this thread was held up
            self._drain(i)
        stalled = self.liveness.stalled()
        if stalled is not None and not self.backlog:
            i, why = stalled
            raise WorkerProcessError(i, f"worker {i} {why}")

    def events(self, cap: float | None = None) -> list[tuple[int, Any]]:
        """Wait up to ``POLL`` s (or ``cap``) for messages from the active workers; returns
        ``(worker, message)`` pairs, the message ``None`` when the worker's pipe ended or its
        process exited with an error.

        Raises:
            WorkerProcessError: the deadline passed or a worker stalled.
        """
        self._check()
        if not self.backlog:
            left = POLL if cap is None else max(0.0, min(POLL, cap))
            if self.deadline is not None:
                left = max(0.0, min(left, self.deadline - time.monotonic()))
            conns = {self.conns[i]: i for i in self.active if i in self.open}
            sentinels = {self.procs[i].sentinel: i for i in self.active - self.exited}
            for r in wait(list(conns) + list(sentinels), timeout=left):
                if r in conns:
                    self._drain(conns[r])
                else:
                    i = sentinels[r]
                    self.exited.add(i)
                    self._drain(i)  # its last words first
                    self.procs[i].join(0.1)
                    if self.procs[i].exitcode not in (0, None):
                        self.backlog.append((i, None))
        out, self.backlog = self.backlog, []
        return out

    def died(self, i: int) -> WorkerProcessError:
        self.procs[i].join(1)
        return WorkerProcessError(i, f"worker {i} {_describe_exit(self.procs[i].exitcode)}")

    def shutdown(self, failed: bool) -> None:
        """End every worker process: after a success, wait for them to exit; after a failure
        (or when they do not exit), SIGTERM, then SIGKILL ``TERMINATE_GRACE`` s later (a
        stopped process only ends with SIGKILL)."""
        if not failed:
            end = time.monotonic() + EXIT_WAIT
            for p in self.procs:
                p.join(max(0.0, end - time.monotonic()))
        alive = [p for p in self.procs if p.is_alive()]
        for p in alive:
            p.terminate()
        end = time.monotonic() + TERMINATE_GRACE
        for p in alive:
            p.join(max(0.0, end - time.monotonic()))
        for p in alive:
            if p.is_alive():
                p.kill()
                p.join()
        for p in self.procs:
            _RUNNING.discard(p)
        for conn in self.conns:
            conn.close()


def _terminate_running() -> None:
    """At interpreter exit: end worker processes that a job on another thread left running
    (``multiprocessing`` would otherwise wait for them)."""
    procs = [p for p in list(_RUNNING) if p.is_alive()]
    for p in procs:
        p.terminate()
    end = time.monotonic() + TERMINATE_GRACE
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


atexit.register(_terminate_running)


class _SignalGuard:
    """On the main thread, SIGINT and SIGTERM raise ``JobInterrupted`` / ``JobTerminated``
    (once) while the guard is entered.  Inside ``held()`` and after ``closing()`` a signal is
    only recorded (so it cannot interrupt spawning or cut the clean-up short) and raised when
    ``held()`` or the guard ends.  Handlers other than Python's defaults are left alone."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.signal: int | None = None
        self.raised = False
        self.depth = 0
        self.closed = False
        self.previous: dict[int, Any] = {}

    def error(self) -> BaseException:
        assert self.signal is not None
        name = signal.Signals(self.signal).name
        message = f"the driver got {name}: terminated the job's {self.workers} worker processes"
        return JobInterrupted(message) if self.signal == signal.SIGINT else JobTerminated(message)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            return
        self.signal = signum
        if self.depth == 0 and not self.closed:
            self.raised = True
            raise self.error()

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGINT, signal.default_int_handler),
                                 (signal.SIGTERM, signal.SIG_DFL)):
                if signal.getsignal(sig) is default:
                    self.previous[sig] = signal.signal(sig, self._handler)
        return self

    @contextmanager
    def held(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        self._raise_recorded()

    def closing(self) -> None:
        self.closed = True

    def _raise_recorded(self) -> None:
        if self.signal is not None and not self.raised:
            self.raised = True
            raise self.error()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        self._raise_recorded()


def execute_process(fn: Callable[[Any], Any], workers: int, host: str = "127.0.0.1",
                    timeout: float | None = None, max_frame: int | None = None,
                    secret: bytes | None = None, job: str | None = None,
                    on_addresses: Callable[[list[tuple[str, int]], str], None] | None = None,
                    inputs: dict[str, Any] | None = None, sort_by: dict[str, str] | None = None,
                    report_to: tuple[str, int, str] | None = None,
                    spec: Any = None,
                    heartbeat_timeout: float | None = DEFAULT_HEARTBEAT_TIMEOUT,
                    slots: int | None = None, control_hub: Any = None,
                    ) -> list[Any]:
    """Run ``fn`` on ``workers`` local processes; returns the per-worker results in order.

    Args:
        fn: the worker function (pickled with cloudpickle, so closures work).
        workers: number of worker processes (a ``ContentionWarning`` when above the cores
            available).
        host: interface the workers listen on.
        timeout: seconds before the job is cancelled (None: no limit).
        max_frame: largest frame payload a worker accepts (bytes).
        secret, job: the per-job secret and name (generated when omitted).
        on_addresses: called with the workers' addresses and the job name once known (tests use
            it to probe the mesh).
        inputs, sort_by: named tables for ``from_dataframe`` (see ``tokenflow.inputs``).
        report_to: a coordinator endpoint ``(host, port, token)`` for progress reports.
        spec: the job's ``tokenflow.job.JobSpec`` (routing table, snapshot to restore,
            control plane).
        heartbeat_timeout: seconds without a heartbeat after which a worker is stalled (None:
            never).
        slots: worker slots (default ``workers``): with more, workers can join the running
            job (``JobHandle.add_worker``, through ``control_hub.launch``); the result then
            has one entry per slot (None for a slot never used).
        control_hub: the control plane's hub, given the ``launch`` of joining workers.

    Raises:
        WorkerProcessError: when a worker raises, dies or stalls, naming the first one to fail,
            or when the job times out (``timed_out``).
        JobInterrupted, JobTerminated: the driver got SIGINT or SIGTERM (main thread only).
    """
    from tokenflow.execute import ContentionWarning, available_cores, contention

    message = contention(workers, available_cores())
    if message is not None:
        warnings.warn(message, ContentionWarning, stacklevel=2)
    ctx = start_context()
    secret = secret or new_secret()
    job = job or f"tokenflow-{os.getpid()}-{secrets.token_hex(4)}"
    payload = cloudpickle.dumps(fn)
    slots = workers if slots is None else slots
    if slots < workers:
        raise ValueError(f"slots ({slots}) must be >= workers ({workers})")
    run = _Run(workers, job, timeout, heartbeat_timeout)
    driver = os.getpid()

    def args(i: int, child: Connection) -> tuple[Any, ...]:
        return (i, slots, secret, job, payload, child, host, max_frame, report_to, spec, driver,
                dict(os.environ))

    roster = list(range(workers)) if slots > workers else None
    with _SignalGuard(workers) as guard:
        failed = True
        try:
            with guard.held():
                run.spawn(ctx, args)
            addresses: list[Any] = _addresses(run)
            parts = partition_inputs(inputs, workers, sort_by)
            for conn, part in zip(run.conns, parts, strict=True):
                conn.send(("addresses", addresses + [None] * (slots - workers), part, roster,
                           False))
            if on_addresses is not None:
                on_addresses(addresses, job)
            if control_hub is not None and slots > workers:
                control_hub.launch = run.request_launch
                run.launcher = lambda k, members: _launch(run, ctx, args, addresses, slots, k,
                                                          members)
            results = _results(run) + [None] * (slots - workers)
            for k, result in run.joined_results.items():
                results[k] = result
            failed = False
            return results
        finally:
            guard.closing()
            run.shutdown(failed)


def _launch(run: _Run, ctx: Any, args: Callable[[int, Connection], tuple[Any, ...]],
            addresses: list[Any], slots: int, k: int, members: list[int]) -> None:
    """Start worker ``k`` to join the running job whose workers are ``members`` (``k``
    included): it learns the others' addresses and dials them (``tokenflow.membership``)."""
    if k != len(run.procs) or k >= slots:
        raise ValueError(f"worker slot {k} is not the next free one (slots {slots}, "
                         f"started {len(run.procs)})")
    run.spawn_one(ctx, k, args)
    conn = run.conns[k]
    if not conn.poll(START_TIMEOUT):
        raise WorkerProcessError(k, f"joining worker {k} sent no address within "
                                    f"{START_TIMEOUT:g} s")
    msg = conn.recv()
    if msg[0] != "address":
        raise WorkerProcessError(k, f"joining worker {k} failed to start: {msg[1]}")
    addresses.append((str(msg[1][0]), int(msg[1][1])))
    conn.send(("addresses", addresses + [None] * (slots - len(addresses)), {}, members, True))


def _addresses(run: _Run) -> list[tuple[str, int]]:
    addresses: list[tuple[str, int] | None] = [None] * run.workers
    while any(a is None for a in addresses):
        for i, msg in run.events():
            if msg is None:
                raise run.died(i)
            if msg[0] != "address":
                raise WorkerProcessError(i, f"worker {i} failed to start: {msg[1]}\n{msg[2]}")
            addresses[i] = (str(msg[1][0]), int(msg[1][1]))
    return [a for a in addresses if a is not None]


def _results(run: _Run) -> list[Any]:
    results: list[Any] = [None] * run.workers
    # A worker that lost a peer reports it at about the time the peer reports its own
    # failure (or dies): wait a little for the root cause before naming anyone.
    deferred: tuple[int, Any] | None = None
    grace_end = 0.0
    while run.active:
        run.serve_launches()
        if deferred is not None and time.monotonic() >= grace_end:
            _raise_first(run.procs, *deferred)
        cap = None if deferred is None else grace_end - time.monotonic()
        for i, msg in run.events(cap):
            if i not in run.active:
                continue
            if msg is None:
                raise run.died(i)
            run.finish(i)
            if msg[0] == "result":
                if i < run.workers:
                    results[i] = cloudpickle.loads(msg[1])
                else:
                    run.joined_results[i] = cloudpickle.loads(msg[1])
            elif len(msg) > 3 and msg[3] and run.active:
                if deferred is None:
                    deferred, grace_end = (i, msg), time.monotonic() + FAILURE_GRACE
            else:
                _raise_first(run.procs, i, msg)
    if deferred is not None:
        _raise_first(run.procs, *deferred)
    return results


def _raise_first(procs: list[Any], i: int, msg: tuple[Any, ...]) -> None:
    """A worker reported an error: prefer naming a worker that died, if one did."""
    time.sleep(0.2)  # let a killed peer's exit status arrive
    for j, p in enumerate(procs):
        if j != i and p.exitcode is not None and p.exitcode < 0:
            raise WorkerProcessError(j, f"worker {j} {_describe_exit(p.exitcode)} "
                                        f"(worker {i} reported: {msg[1]})")
    raise WorkerProcessError(i, f"worker {i} failed: {msg[1]}\n{msg[2]}")


def execute_runtime(fn: Callable[[Any], Any], workers: int, **options: Any) -> list[Any]:
    """Entry point used by ``tokenflow.execute(..., runtime="process")``; wraps failures in
    ``WorkerError`` (``JobTimeoutError`` for the timeout)."""
    from tokenflow.execute import JobTimeoutError, WorkerError

    try:
        return execute_process(fn, workers, **options)
    except WorkerProcessError as exc:
        if exc.timed_out:
            raise JobTimeoutError(str(exc)) from exc
        raise WorkerError(exc.worker, exc, str(exc)) from exc
