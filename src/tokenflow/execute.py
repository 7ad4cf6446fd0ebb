"""``execute``: run a worker function on W workers.

Source: docs/ARCHITECTURE.md ("Execution model"); timely's ``execute.rs``.  ``fn(worker)`` builds
dataflows and drives their inputs; after it returns, the worker keeps stepping until its
dataflows complete.  Returns the per-worker results in worker order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tokenflow.comm.thread import ThreadFabric, WorkerAborted
from tokenflow.control import ControlAgent
from tokenflow.coordinator import attach
from tokenflow.dataflow.input import JobStopped
from tokenflow.inputs import partition_inputs
from tokenflow.job import JobSpec, job_name
from tokenflow.state.bins import DEFAULT_BINS
from tokenflow.worker import Worker

R = TypeVar("R")

RUNTIMES = ("thread", "process", "spark")
STOP_WAIT = 1.0
"""Seconds the thread runtime waits for its workers to stop after a timeout."""


class WorkerError(RuntimeError):
    """A worker raised, died or stalled; ``worker`` is its index (-1: the job as a whole) and
    ``__cause__`` the original error."""

    def __init__(self, worker: int, error: BaseException, message: str | None = None) -> None:
        super().__init__(message or f"worker {worker} failed: {type(error).__name__}: {error}")
        self.worker = worker


class JobTimeoutError(WorkerError, TimeoutError):
    """The job ran longer than ``execute(..., timeout=S)``; its workers were stopped.  Both a
    ``WorkerError`` (``worker`` -1) and a ``TimeoutError``."""

    def __init__(self, message: str) -> None:
        super().__init__(-1, TimeoutError(message), message)


class ContentionWarning(UserWarning):
    """More workers than cores (or task slots): the job runs, slowly."""


def available_cores() -> int:
    """CPUs this process may run on (``sched_getaffinity`` where there is one, else
    ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def contention(workers: int, cores: int | None, what: str = "core") -> str | None:
    """``"100 workers on 2 cores: expect contention"`` when ``workers > cores``, else None
    (``what``: the singular of what ``cores`` counts)."""
    if cores is None or workers <= cores:
        return None
    return f"{workers} workers on {cores} {what}{'' if cores == 1 else 's'}: expect contention"


def local_slots(master: str) -> int | None:
    """Task slots of a ``local``, ``local[n]``, ``local[*]`` or ``local[n, retries]`` Spark
    master; None for other masters."""
    if master == "local":
        return 1
    if not master.startswith("local[") or not master.endswith("]"):
        return None
    inner = master[len("local["):-1].split(",")[0].strip()
    if inner == "*":
        return available_cores()
    return int(inner) if inner.isdigit() else None


def capacity_warning(workers: int, runtime: str, master: str | None = None) -> str | None:
    """The warning a job of ``workers`` workers gets on ``runtime``, or None: ``"100 workers
    on 2 cores: expect contention"`` (``ContentionWarning``) when they exceed the cores this
    process may use (``process``; ``spark`` on a ``local`` master), or, on ``local[n]`` with
    ``n < workers``, that the barrier stage cannot run (the Spark runtime raises
    ``ValueError`` then).  ``master`` defaults to ``local[W]``; other masters are checked by
    the Spark runtime against the cluster's default parallelism."""
    if runtime == "thread":
        return None
    if runtime == "spark":
        master = master or f"local[{workers}]"
        slots = local_slots(master)
        if slots is None:
            return None
        if workers > slots:
            return f"{workers} workers need {workers} task slots; {master} has {slots}"
    return contention(workers, available_cores())


def execute(fn: Callable[[Worker], R], workers: int = 1, runtime: str = "thread",
            **options: Any) -> list[R]:
    """Run ``fn`` on ``workers`` workers of the given runtime and return their results.

    Runtimes: ``thread`` (W workers in this process), ``process`` (W local processes joined by
    the TCP mesh, see ``tokenflow.process``), ``spark`` (W PySpark barrier tasks, see
    ``tokenflow.spark``; ``master=`` picks the cluster, default ``local[W]``).  ``options`` go
    to the runtime; every runtime takes ``inputs={name: table}`` and ``sort_by={name: column}``
    (see ``tokenflow.inputs``; read them with ``tokenflow.spark.from_dataframe``) and
    ``report_to=Coordinator(...).endpoint`` (workers report progress to the driver).

    Liveness options (every runtime): ``timeout=S`` (seconds; the job fails with
    ``JobTimeoutError`` and its workers stop), ``heartbeat_timeout=S`` (default 10; ``process``
    and ``spark``: a worker that sends no heartbeat for that long, e.g. a SIGSTOPped one, fails
    the job as stalled and the others are ended; None: never; the ``thread`` runtime, whose
    workers cannot stop alone, ignores it).  See docs/ARCHITECTURE.md ("Execution model").

    Publish/subscribe (every runtime): ``catalog=Catalog(...).endpoint`` (``tokenflow.pubsub``)
    lets the job's ``Stream.publish`` register its topics there.

    State options (every runtime): ``bins=`` (bins of the routing table, default 4,096),
    ``restore=DIR`` (start from the latest committed snapshot under ``DIR``, or ``epoch=``'s,
    at this worker count: ``tokenflow.job``), ``name=`` (the job's name; default the
    function's qualified name, which a restored snapshot must match).

    Raises:
        ValueError: for an unknown runtime or fewer than one worker.
        WorkerError: when a worker raises, dies or stalls (the first failure; the others
            stop).
        JobTimeoutError: the job outlived ``timeout``.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; available: {', '.join(RUNTIMES)}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    spec = options.pop("spec", None)
    bins, restore = options.pop("bins", DEFAULT_BINS), options.pop("restore", None)
    epoch, name = options.pop("epoch", None), options.pop("name", None)
    catalog = options.pop("catalog", None)
    if spec is None:
        spec = JobSpec.create(name or job_name(fn), workers, bins, restore, epoch)
    if catalog is not None:
        spec.catalog = tuple(catalog)
    options["spec"] = spec
    if runtime != "thread":
        # Runtimes above this layer are looked up by name (a plugin registry, so that the
        # layers below never import them).
        import importlib

        module = importlib.import_module(f"tokenflow.{runtime}")
        return module.execute_runtime(fn, workers, **options)  # type: ignore[no-any-return]
    inputs = partition_inputs(options.pop("inputs", None), workers, options.pop("sort_by", None))
    report_to = options.pop("report_to", None)
    hub = options.pop("control_hub", None)
    timeout = options.pop("timeout", None)
    slots = int(options.pop("slots", workers))
    options.pop("heartbeat_timeout", None)  # threads cannot stall one by one
    options.pop("spec")
    if options:
        raise ValueError(f"the thread runtime takes no options but inputs/sort_by/report_to/"
                         f"timeout/heartbeat_timeout/slots, got {sorted(options)}")
    if slots < workers:
        raise ValueError(f"slots ({slots}) must be >= workers ({workers})")
    fabric = ThreadFabric(slots)
    results: list[Any] = [None] * slots
    threads: list[threading.Thread] = []

    def run(i: int, roster: list[int] | None = None) -> None:
        joining = roster is not None
        try:
            worker = Worker(fabric.allocator(i), spec.table if joining else None,
                            roster=roster or list(range(workers)), joining=joining)
            worker.inputs = inputs[i] if i < workers else {}
            spec.apply(worker)
            reporter = attach(worker, report_to)
            agent = ControlAgent(hub.link(i, worker.unpark)) if hub is not None else None
            if agent is not None:
                worker.on_step.append(agent)
            try:
                results[i] = fn(worker)
            except JobStopped:
                pass  # stopped by the control plane while feeding an input
            worker.step_until_done()
            if agent is not None:
                agent.finish()  # a snapshot part still being written
                hub.finish(i)
            if reporter is not None:
                reporter.close(worker)
        except WorkerAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            fabric.abort(i, exc)

    def launch(k: int, roster: list[int]) -> None:  # a worker joining the running job
        thread = threading.Thread(target=run, args=(k, roster), name=f"tokenflow-worker-{k}",
                                  daemon=True)
        threads.append(thread)
        thread.start()

    if hub is not None:
        hub.launch = launch
    if workers == 1 and timeout is None and slots == 1:
        run(0)
    else:
        threads.extend(threading.Thread(target=run, args=(i,), name=f"tokenflow-worker-{i}",
                                        daemon=True) for i in range(workers))
        for t in list(threads):
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        joined = 0
        while joined < len(threads):  # threads of joining workers are appended meanwhile
            threads[joined].join(None if deadline is None else
                                 max(0.0, deadline - time.monotonic()))
            if threads[joined].is_alive():
                break
            joined += 1
        if any(t.is_alive() for t in threads):
            message = f"job timed out after {timeout:g} s"
            fabric.abort(-1, TimeoutError(message))  # every worker stops at its next step
            end = time.monotonic() + STOP_WAIT
            for t in threads:
                t.join(max(0.0, end - time.monotonic()))
            stuck = [i for i, t in enumerate(threads) if t.is_alive()]
            if stuck:
                message += f" (workers {stuck} still running: they do not step)"
            raise JobTimeoutError(message)
    if fabric.error is not None:
        worker, error = fabric.error
        raise WorkerError(worker, error) from error
    return results
