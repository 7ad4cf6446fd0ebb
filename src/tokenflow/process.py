"""The ``process`` runtime: W local worker processes joined by the TCP mesh (no Spark).

Source: docs/ARCHITECTURE.md ("Execution model").  The driver spawns W processes (``spawn`` start method),
collects their listening addresses, sends every worker the address list, and waits for each
worker's result, watching the processes: a worker that dies (e.g. SIGKILL) fails the job with an
error naming it, and the remaining workers are terminated.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from tokenflow.comm.auth import new_secret
from tokenflow.comm.tcp import bind_listener
from tokenflow.inputs import partition_inputs


class WorkerProcessError(RuntimeError):
    """A worker process failed or died; ``worker`` is its index."""

    def __init__(self, worker: int, message: str) -> None:
        super().__init__(message)
        self.worker = worker


def _worker_main(index: int, peers: int, secret: bytes, job: str, payload: bytes,
                 conn: Connection, host: str, max_frame: int | None,
                 report_to: tuple[str, int, str] | None, spec: Any = None) -> None:
    from tokenflow.cluster import run_worker

    try:
        listener = bind_listener(host, 0)
        conn.send(("address", listener.getsockname()[:2]))
        kind, addresses, inputs = conn.recv()
        fn = cloudpickle.loads(payload)

        def configure(worker: Any) -> None:
            worker.inputs = inputs

        result = run_worker(fn, index, peers, listener, addresses, secret, job, configure,
                            max_frame=max_frame, report_to=report_to, spec=spec)
        conn.send(("result", cloudpickle.dumps(result)))
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                       _is_consequence(exc)))
        except Exception:  # pragma: no cover - the driver is gone
            pass
    finally:
        conn.close()


FAILURE_GRACE = 2.0
"""Seconds the driver waits for the root cause after a worker reports a lost peer."""


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


def execute_process(fn: Callable[[Any], Any], workers: int, host: str = "127.0.0.1",
                    timeout: float | None = None, max_frame: int | None = None,
                    secret: bytes | None = None, job: str | None = None,
                    on_addresses: Callable[[list[tuple[str, int]], str], None] | None = None,
                    inputs: dict[str, Any] | None = None, sort_by: dict[str, str] | None = None,
                    report_to: tuple[str, int, str] | None = None,
                    spec: Any = None,
                    ) -> list[Any]:
    """Run ``fn`` on ``workers`` local processes; returns the per-worker results in order.

    Args:
        fn: the worker function (pickled with cloudpickle, so closures work).
        workers: number of worker processes.
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

    Raises:
        WorkerProcessError: when a worker raises or dies, naming the first one to fail.
    """
    ctx = mp.get_context("spawn")
    secret = secret or new_secret()
    job = job or f"tokenflow-{os.getpid()}-{secrets.token_hex(4)}"
    payload = cloudpickle.dumps(fn)
    conns: list[Connection] = []
    procs = []
    for i in range(workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker_main, name=f"tokenflow-worker-{i}",
                        args=(i, workers, secret, job, payload, child, host, max_frame, report_to,
                              spec))
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        addresses = [None] * workers
        for i, conn in enumerate(conns):
            msg = _recv(conn, procs[i], i, deadline)
            if msg[0] != "address":
                raise WorkerProcessError(i, f"worker {i} failed to start: {msg[1]}\n{msg[2]}")
            addresses[i] = tuple(msg[1])  # type: ignore[call-overload]
        parts = partition_inputs(inputs, workers, sort_by)
        for conn, part in zip(conns, parts, strict=True):
            conn.send(("addresses", addresses, part))
        if on_addresses is not None:
            on_addresses(addresses, job)  # type: ignore[arg-type]
        results: list[Any] = [None] * workers
        pending = {conn: i for i, conn in enumerate(conns)}
        sentinels = {p.sentinel: i for i, p in enumerate(procs)}
        # A worker that lost a peer reports it at about the time the peer reports its own
        # failure (or dies): wait a little for the root cause before naming anyone.
        deferred: tuple[int, Any] | None = None
        grace_end = 0.0
        while pending:
            now = time.monotonic()
            if deferred is not None and now >= grace_end:
                _raise_first(procs, *deferred)
            left = None if deadline is None else max(0.0, deadline - now)
            if left == 0.0:
                raise WorkerProcessError(-1, f"job {job} timed out after {timeout} s")
            if deferred is not None:
                left = grace_end - now if left is None else min(left, grace_end - now)
            ready = wait(list(pending) + list(sentinels), timeout=left)
            died: list[int] = []
            for r in ready:
                if r in pending:
                    i = pending[r]
                    try:
                        msg = r.recv()
                    except EOFError:
                        died.append(i)
                        del pending[r]
                        continue
                    del pending[r]
                    if msg[0] == "result":
                        results[i] = cloudpickle.loads(msg[1])
                    elif len(msg) > 3 and msg[3] and pending:
                        if deferred is None:
                            deferred, grace_end = (i, msg), time.monotonic() + FAILURE_GRACE
                    else:
                        _raise_first(procs, i, msg)
                elif r in sentinels:
                    i = sentinels.pop(r)
                    procs[i].join(0.1)
                    if procs[i].exitcode not in (0, None) and conns[i] in pending:
                        died.append(i)
            for i in died:
                procs[i].join(1)
                raise WorkerProcessError(i, f"worker {i} {_describe_exit(procs[i].exitcode)}")
        if deferred is not None:
            _raise_first(procs, *deferred)
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.join(timeout=2 if p.exitcode is None else 0)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in conns:
            conn.close()


def _recv(conn: Connection, proc: Any, i: int, deadline: float | None) -> Any:
    while True:
        left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
        if left <= 0:
            raise WorkerProcessError(i, f"worker {i} did not start in time")
        if conn.poll(left):
            try:
                return conn.recv()
            except EOFError:
                proc.join(1)
                raise WorkerProcessError(i, f"worker {i} {_describe_exit(proc.exitcode)}") from None
        if not proc.is_alive():
            raise WorkerProcessError(i, f"worker {i} {_describe_exit(proc.exitcode)}")


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
    ``WorkerError``."""
    from tokenflow.execute import WorkerError

    try:
        return execute_process(fn, workers, **options)
    except WorkerProcessError as exc:
        raise WorkerError(exc.worker, exc, str(exc)) from exc
