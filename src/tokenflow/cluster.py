"""Running one worker of a multi-process job: mesh formation, the worker loop, shutdown.

Shared by the ``process`` runtime (local processes) and the ``spark`` runtime (barrier tasks):
both give each worker its index, the peers' addresses, the per-job secret and the user's
function (cloudpickled), and collect its cloudpickled result.
"""

from __future__ import annotations

import gc
import logging
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
