"""``execute``: run a worker function on W workers.

Source: docs/ARCHITECTURE.md ("Execution model"); timely's ``execute.rs``.  ``fn(worker)`` builds
dataflows and drives their inputs; after it returns, the worker keeps stepping until its
dataflows complete.  Returns the per-worker results in worker order.
"""

from __future__ import annotations

import threading
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


class WorkerError(RuntimeError):
    """A worker raised; ``worker`` is its index and ``__cause__`` the original error."""

    def __init__(self, worker: int, error: BaseException, message: str | None = None) -> None:
        super().__init__(message or f"worker {worker} failed: {type(error).__name__}: {error}")
        self.worker = worker


def execute(fn: Callable[[Worker], R], workers: int = 1, runtime: str = "thread",
            **options: Any) -> list[R]:
    """Run ``fn`` on ``workers`` workers of the given runtime and return their results.

    Runtimes: ``thread`` (W workers in this process), ``process`` (W local processes joined by
    the TCP mesh, see ``tokenflow.process``), ``spark`` (W PySpark barrier tasks, see
    ``tokenflow.spark``; ``master=`` picks the cluster, default ``local[W]``).  ``options`` go
    to the runtime; every runtime takes ``inputs={name: table}`` and ``sort_by={name: column}``
    (see ``tokenflow.inputs``; read them with ``tokenflow.spark.from_dataframe``) and
    ``report_to=Coordinator(...).endpoint`` (workers report progress to the driver).

    State options (every runtime): ``bins=`` (bins of the routing table, default 4,096),
    ``restore=DIR`` (start from the latest committed snapshot under ``DIR``, or ``epoch=``'s,
    at this worker count: ``tokenflow.job``), ``name=`` (the job's name; default the
    function's qualified name, which a restored snapshot must match).

    Raises:
        ValueError: for an unknown runtime or fewer than one worker.
        WorkerError: when a worker raises (the first failure; the others stop).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; available: {', '.join(RUNTIMES)}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    spec = options.pop("spec", None)
    bins, restore = options.pop("bins", DEFAULT_BINS), options.pop("restore", None)
    epoch, name = options.pop("epoch", None), options.pop("name", None)
    if spec is None:
        spec = JobSpec.create(name or job_name(fn), workers, bins, restore, epoch)
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
    options.pop("spec")
    if options:
        raise ValueError(f"the thread runtime takes no options but inputs/sort_by, got {sorted(options)}")
    fabric = ThreadFabric(workers)
    results: list[Any] = [None] * workers

    def run(i: int) -> None:
        try:
            worker = Worker(fabric.allocator(i))
            worker.inputs = inputs[i]
            spec.apply(worker)
            reporter = attach(worker, report_to)
            if hub is not None:
                worker.on_step.append(ControlAgent(hub.link(i)))
            try:
                results[i] = fn(worker)
            except JobStopped:
                pass  # stopped by the control plane while feeding an input
            worker.step_until_done()
            if reporter is not None:
                reporter.close(worker)
        except WorkerAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            fabric.abort(i, exc)

    if workers == 1:
        run(0)
    else:
        threads = [threading.Thread(target=run, args=(i,), name=f"tokenflow-worker-{i}",
                                    daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if fabric.error is not None:
        worker, error = fabric.error
        raise WorkerError(worker, error) from error
    return results
