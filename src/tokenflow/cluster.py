"""Running one worker of a multi-process job: mesh formation, the worker loop, shutdown.

Shared by the ``process`` runtime (local processes) and the ``spark`` runtime (barrier tasks):
both give each worker its index, the peers' addresses, the per-job secret and the user's
function (cloudpickled), and collect its cloudpickled result.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from tokenflow.comm.tcp import Address, MeshSetupError, TcpAllocator, TcpMesh
from tokenflow.coordinator import Reporter, attach
from tokenflow.dataflow.input import JobStopped
from tokenflow.worker import Worker

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 10.0
"""Seconds a worker joining a running job tries to reach the roster's workers."""


ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
"""Arrow's own environment variable naming its default allocator (``system``, ``mimalloc``,
``jemalloc``); a worker uses the pool it names instead of the system allocator
(``use_system_allocator``)."""

_POOLS: dict[str, Callable[[], pa.MemoryPool]] = {
    "system": pa.system_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
    "jemalloc": pa.jemalloc_memory_pool}


def use_system_allocator() -> str:
    """Make the C library's allocator (``pa.system_memory_pool()``) pyarrow's default in this
    worker process, or the pool ``ARROW_DEFAULT_MEMORY_POOL`` names (read here, since a
    forkserver or Spark daemon set up pyarrow's default before the job's environment reached
    the worker; a name pyarrow does not know, or a pool this build lacks, leaves the default
    as it is); returns the default pool's ``backend_name``.

    pyarrow's default, mimalloc (3.4 in pyarrow 25.0.1), maps fresh pages (transparent huge
    pages where the kernel allows them) for a buffer above its small sizes and hands them back
    a second after they are freed (its ``purge_delay``), so the next buffer of that size faults
    them in again: in a loaded worker on a 2-core VM a 1 MB buffer cost 4.4-5.5 ms of CPU, which
    landed in the rare large allocations of a stream: a live migration's state tables. glibc
    keeps freed heap memory for reuse. Measured side by side (paced NEXMark q8 at 330,000
    events/s, 4 workers, all-at-once 2 -> 3 -> 4 -> 3 -> 2; the longest block a migration held
    a worker, per change; 2026-12-01): four runs with mimalloc 10.7-17.5, 4.3-6.7, 10.0-20.6
    and 10.4-21.5 ms, three with the system allocator 4.5-8.5, 4.4-5.9, 7.4-8.8 and 5.6-8.0 ms;
    the new owner's longest load on the first change 2.8-8.4 against 2.0-2.6 ms. Closed-loop
    throughput did not drop (q4, q5 and q8 over 3M events and the flights job, two runs each:
    q4 equal, the others 2-18 % faster)."""
    make = _POOLS.get(os.environ.get(ARROW_POOL_VARIABLE, "system").strip().lower())
    if make is not None:
        try:
            pa.set_memory_pool(make())
        except NotImplementedError:  # pyarrow built without that allocator
            pass
    return str(pa.default_memory_pool().backend_name)


def warm_arrow() -> None:
    """Pay pyarrow's one-time costs before the first epoch: its first array conversion imports
    pandas (0.2-0.4 s of CPU here), which otherwise lands in the middle of the stream, e.g. in
    the first state export of a live rescale or the first Arrow batch of a NEXMark source."""
    pa.array([0])
    gc.freeze()  # the modules it imported are as permanent as the rest: see ``FreezeAtStart``


class FreezeAtStart:
    """An ``on_step`` hook that moves every object alive after the worker's first step out of
    the cyclic garbage collector's generations (``gc.freeze``), once.

    By its first step a worker has imported its modules (pyarrow, pandas, pyspark: 60,000-80,000
    objects), built its dataflows and loaded whatever the user's function set up before them.
    A full (generation 2) collection traverses every reference of every tracked object, so
    those start-up objects made each one cost 30-60 ms here, a stall every few hundred small
    epochs that set the p99 of their latency.  Frozen objects are still freed by reference
    counting; only cycles among them wait for ``run_worker``'s ``gc.unfreeze`` at the end (a
    Spark executor reuses its Python workers, so nothing stays frozen after the job).
    """

    def __init__(self) -> None:
        self.done = False

    def __call__(self, worker: Worker) -> None:
        if not self.done:
            self.done = True
            gc.freeze()


def run_worker(
    fn: Callable[[Worker], Any],
    index: int,
    peers: int,
    listener: socket.socket,
    addresses: list[Address],
    secret: bytes,
    job: str,
    configure: Callable[[Worker], None] | None = None,
    max_frame: int | None = None,
    report_to: tuple[str, int, str] | None = None,
    spec: Any = None,
    reporter: Reporter | None = None,
    roster: list[int] | None = None,
    joining: bool = False,
) -> Any:
    """Join the mesh as worker ``index``, run ``fn(worker)`` and step to completion.

    ``spec`` (a ``tokenflow.job.JobSpec``) gives the routing table and the snapshot to
    restore; with ``spec.control`` the worker obeys commands from the coordinator at
    ``report_to``.  ``reporter``: an open ``Reporter`` to use instead of connecting to
    ``report_to`` (the Spark runtime opens it before the mesh, to send heartbeats while the mesh
    forms; its owner closes it).  Returns ``fn``'s result.  Raises whatever ``fn`` or the mesh
    raises (``PeerLostError`` names a lost peer); the mesh is closed either way.

    ``peers`` is the number of worker slots; ``roster`` the workers of the job now (default
    every slot); ``joining``: this worker joins the running job (``tokenflow.membership``).
    """
    use_system_allocator()
    threading.Thread(target=warm_arrow, name="warm-arrow", daemon=True).start()
    kwargs = {} if max_frame is None else {"max_frame": max_frame}
    mesh = TcpMesh(index, peers, listener, secret, job, **kwargs)
    try:
        try:
            # a joining worker that cannot reach the roster finds the job ended: give up sooner
            mesh.connect(addresses, members=roster, timeout=JOIN_TIMEOUT if joining else 30.0)
        except MeshSetupError as exc:
            if not joining:
                raise
            # the job ended while this worker was starting to join it (its peers closed their
            # listeners): nothing joined, nothing to report (the driver's join says so)
            log.warning("worker %d did not join the job: %s", index, exc)
            return None
        allocator = TcpAllocator(mesh)
        table = spec.table if joining and spec is not None else None  # the job's, not the roster's
        worker = Worker(allocator, table, roster=roster, joining=joining)
        worker.on_step.append(FreezeAtStart())
        if configure is not None:
            configure(worker)
        if spec is not None:
            spec.apply(worker)
        own = reporter is None
        if reporter is None:
            reporter = attach(worker, report_to)
        else:
            worker.on_step.append(reporter)
        agent = None
        watched = None
        if reporter is not None and spec is not None and spec.control:
            from tokenflow.control import ControlAgent

            agent = ControlAgent(reporter)
            worker.on_step.append(agent)
            watched = reporter.sock
            if watched is not None:  # a command wakes a parked worker
                mesh.watch(watched)
        try:
            result = fn(worker)
        except JobStopped:  # stopped by the control plane while feeding an input
            result = None
        worker.step_until_done()
        if agent is not None:
            agent.finish()  # a snapshot part still being written
            if watched is not None:  # no step reads it any more
                mesh.unwatch(watched)
        if reporter is not None:
            if own:
                reporter.close(worker)
            else:
                reporter(worker, force=True)
        allocator.shutdown()
        return result
    finally:
        mesh.close()
        gc.unfreeze()
