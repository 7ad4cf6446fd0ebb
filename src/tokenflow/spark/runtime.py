"""The ``spark`` runtime: workers as one PySpark barrier stage.

Source: docs/ARCHITECTURE.md ("Execution model": the driver starts a SparkSession and launches the W workers
as one barrier stage; each task opens a listening socket, exchanges addresses through the
job's coordinator (``Coordinator.gather_addresses``; ``BarrierTaskContext.allGather`` without
one: it answers only after a 1 s poll in all tasks but the last), authenticates its peers and
forms the TCP mesh, builds the dataflow and runs it).  The stage runs over the job's input
partitions, so worker ``i`` reads partition ``i``: an RDD (``RDD.barrier().mapPartitions``)
of the chunks of local tables (``tokenflow.spark.inputs.arrow_partitions``) or of nothing
(a job without inputs), or a DataFrame of Spark DataFrame inputs, read as Arrow batches
(``mapInArrow(..., barrier=True)``).  Each task returns its worker's cloudpickled result.
An RDD stage skips the SQL planning and Arrow conversion of a DataFrame one: an empty
2-task stage took 0.17 s against 0.29 s (medians of 7, slow 2-core VM).

Liveness: every task sends heartbeats to a driver-side ``Coordinator`` (the one serving
``report_to`` if it lives in this process, else one the runtime opens) from the moment it
starts; a monitor thread on the driver declares a worker stalled after ``heartbeat_timeout``
seconds without one (``tokenflow.coordinator.Liveness``), or the job timed out after
``timeout`` seconds, and cancels the stage's job group (``SparkContext.cancelJobGroup``: Spark
kills the tasks and their Python workers).  A stage Spark fails (a worker's Python process died
or raised outside the worker code) is reported as ``worker i failed: <its last Python error
line>``, without the Java stack trace; on a ``local`` master the executor's log lines about the
failed task are silenced for the duration of the stage.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle
import pyarrow as pa

from tokenflow.comm.auth import new_secret
from tokenflow.comm.tcp import bind_listener
from tokenflow.coordinator import DEFAULT_HEARTBEAT_TIMEOUT, Coordinator, Liveness
from tokenflow.spark import session as spark_session

log = logging.getLogger(__name__)

TAG = "__tf_input"
RESULT_SCHEMA = "worker int, ok boolean, payload binary"
ADDRESS_TIMEOUT = 600.0
"""Seconds a task waits for its peers' mesh addresses (all of a barrier stage's tasks start
together, so they normally arrive within milliseconds)."""


def _prefix(k: int) -> str:
    return f"__tf{k}_"


def _task_host() -> str:
    host = os.environ.get("TOKENFLOW_HOST")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:  # pragma: no cover
        return "127.0.0.1"


Outcome = tuple[int, bool, bytes]
"""What a task returns: ``(worker, ok, payload)``, the payload its cloudpickled result, or
(not ok) its cloudpickled ``(error text, whether the error is a consequence of another)``."""


def _make_task(payload: bytes, secret: bytes, job: str, workers: int,
               inputs: list[tuple[str, list[str]]], local: bool,
               report_to: tuple[str, int, str] | None,
               spec: Any = None,
               heartbeat_to: tuple[str, int, str] | None = None,
               slots: int | None = None,
               joiner: tuple[int, list[Any], list[int]] | None = None,
               ) -> Callable[[Iterator[Any]], Outcome]:
    """The barrier task of worker ``partitionId`` of ``workers`` (``slots`` slots), or, with
    ``joiner = (slot, addresses, roster)``, of a worker joining the running job: a stage of its
    own that dials the roster at ``addresses`` (``tokenflow.membership``).  It takes its
    partition's items (``split_inputs``) and returns its ``Outcome``."""
    slots = workers if slots is None else slots
    elastic = slots > workers

    def task(batches: Iterator[Any]) -> Outcome:
        from pyspark import BarrierTaskContext

        from tokenflow.cluster import run_worker
        from tokenflow.coordinator import Reporter
        from tokenflow.spark.inputs import split_inputs

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId() if joiner is None else joiner[0]
        reporter = Reporter(report_to) if report_to is not None else None
        beats = reporter if heartbeat_to is not None and heartbeat_to == report_to else \
            Reporter(heartbeat_to) if heartbeat_to is not None else None
        if beats is not None:
            beats.start_heartbeat(index, job)
        try:
            host = "127.0.0.1" if local else _task_host()
            listener = bind_listener("0.0.0.0" if not local else "127.0.0.1", 0)
            port = listener.getsockname()[1]
            roster: list[int] | None = list(range(workers)) if elastic else None
            addresses: list[Any] = [None] * slots
            if joiner is None and beats is not None:  # through the job's coordinator
                gathered = beats.exchange_addresses(index, job, host, port, ADDRESS_TIMEOUT)
                addresses[:len(gathered)] = gathered
            elif joiner is None:  # no coordinator (heartbeat_timeout=None): Spark's barrier
                for item in ctx.allGather(json.dumps([index, host, port])):
                    i, h, p = json.loads(item)
                    addresses[i] = (h, p)
            else:
                addresses = list(joiner[1])
                addresses[index] = (host, port)
                roster = list(joiner[2])
            try:
                fn = cloudpickle.loads(payload)
                worker_inputs = split_inputs(batches, inputs, TAG)

                def configure(worker: Any) -> None:
                    worker.inputs = worker_inputs

                result = run_worker(fn, index, slots, listener, addresses, secret, job, configure,
                                    report_to=report_to, spec=spec, reporter=reporter,
                                    roster=roster, joining=joiner is not None)
                out: Outcome = (index, True, cloudpickle.dumps(result))
            except BaseException as exc:  # noqa: BLE001 - returned to the driver with its traceback
                import traceback

                from tokenflow.process import _is_consequence

                out = (index, False, cloudpickle.dumps((f"{type(exc).__name__}: {exc}\n"
                                                        f"{traceback.format_exc()}",
                                                        _is_consequence(exc))))
        finally:
            for r in {id(r): r for r in (beats, reporter) if r is not None}.values():
                r.close()
        return out

    return task


def _barrier_stage(partitions: Any, task: Callable[[Iterator[Any]], Outcome]) -> list[Outcome]:
    """Run ``task`` on every partition of ``partitions`` as one barrier stage; the tasks'
    outcomes.  ``partitions``: an RDD (``RDD.barrier().mapPartitions``) or a DataFrame, whose
    partitions a task reads as Arrow batches (``mapInArrow(barrier=True)``)."""
    if hasattr(partitions, "mapInArrow"):
        def arrow_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            worker, ok, payload = task(batches)
            yield pa.RecordBatch.from_pylist(
                [{"worker": worker, "ok": ok, "payload": payload}],
                schema=pa.schema([("worker", pa.int32()), ("ok", pa.bool_()),
                                  ("payload", pa.binary())]))

        rows = partitions.mapInArrow(arrow_task, RESULT_SCHEMA, barrier=True).collect()
        return [(int(r["worker"]), bool(r["ok"]), bytes(r["payload"])) for r in rows]

    def rdd_task(items: Iterator[Any]) -> Iterator[Outcome]:
        yield task(items)

    return list(partitions.barrier().mapPartitions(rdd_task).collect())


def _input_partitions(spark: Any, inputs: dict[str, Any], workers: int,
                      sort_by: dict[str, str]) -> tuple[Any, list[tuple[str, list[str]]]]:
    """All inputs in ``workers`` partitions, partition ``i`` for worker ``i``, and their layout.

    When every input is a local table (Arrow or pandas), the RDD of
    ``tokenflow.spark.inputs.arrow_partitions``: the driver splits and sorts them and Spark
    carries Arrow IPC chunks.  Otherwise (or when a worker's share would pass
    ``MAX_SHARE_BYTES``, logged) one DataFrame
    with columns prefixed per input and a tag column, split by a hash of every column
    (reproducible: the same rows go to the same partition on every run, unlike a round-robin
    ``repartition(W)``, whose assignment depends on the order Spark reads the input in) and
    sorted by each input's time column within partitions."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    from tokenflow.inputs import as_table
    from tokenflow.spark.inputs import MAX_SHARE_BYTES, arrow_partitions, is_local_table

    if all(is_local_table(df) for df in inputs.values()):
        carried = arrow_partitions(spark, inputs, workers, sort_by)
        if carried is not None:
            return carried
        log.info("a worker's share of the local input tables passes %d bytes: they go to "
                 "Spark as a DataFrame, split by a hash of their rows", MAX_SHARE_BYTES)
    frames = []
    layout: list[tuple[str, list[str]]] = []
    order = [F.col(TAG)]
    for k, (name, df) in enumerate(inputs.items()):
        if is_local_table(df):  # next to a Spark DataFrame: Arrow straight to Spark
            df = spark.createDataFrame(as_table(df, name))
        cols = list(df.columns)
        layout.append((name, cols))
        frames.append(df.select(F.lit(k).alias(TAG),
                                *[F.col(f"`{c}`").alias(_prefix(k) + c) for c in cols]))
        if name in sort_by:
            order.append(F.col(_prefix(k) + sort_by[name]).asc_nulls_first())
    union = frames[0]
    for f in frames[1:]:
        union = union.unionByName(f, allowMissingColumns=True)
    by_hash = union.repartition(workers, *[F.col(f"`{c}`") for c in union.columns])
    return by_hash.sortWithinPartitions(*order), layout


class _Monitor:
    """A driver thread watching a running stage: when a worker stalls (no heartbeat on
    ``coordinator`` for ``liveness.timeout`` s) or the job outlives ``timeout`` s, it records
    why (``verdict``: ``(worker, message, timed_out)``) and cancels the job group."""

    POLL = 0.25

    def __init__(self, sc: Any, group: str, job: str, coordinator: Coordinator | None,
                 liveness: Liveness | None, timeout: float | None) -> None:
        self.sc = sc
        self.group = group
        self.job = job
        self.coordinator = coordinator
        self.liveness = liveness
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.verdict: tuple[int, str, bool] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tokenflow-spark-monitor")

    def start(self) -> None:
        if self.deadline is not None or (self.coordinator is not None and self.liveness is not None):
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.POLL):
            verdict = self._check()
            if verdict is not None:
                self.verdict = verdict
                try:
                    self.sc.cancelJobGroup(self.group)
                except Exception:  # noqa: BLE001 - the stage may have ended meanwhile
                    pass
                return

    def _check(self) -> tuple[int, str, bool] | None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return -1, f"job {self.job} timed out after {self.timeout:g} s", True
        if self.coordinator is None or self.liveness is None:
            return None
        for worker, (at, done) in self.coordinator.heartbeats(self.job).items():
            if 0 <= worker < len(self.liveness.last):
                self.liveness.beat(worker, at)
                if done:
                    self.liveness.finish(worker)
        stalled = self.liveness.stalled()
        if stalled is None:
            return None
        return stalled[0], f"worker {stalled[0]} {stalled[1]}", False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


@contextmanager
def _job_group(sc: Any, group: str, description: str) -> Iterator[None]:
    """Run the block's Spark jobs in job group ``group`` (interrupted on cancel); the thread's
    previous group is restored afterwards."""
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {k: sc.getLocalProperty(k) for k in keys}
    sc.setJobGroup(group, description, interruptOnCancel=True)
    try:
        yield
    finally:
        for k, v in previous.items():
            sc.setLocalProperty(k, v)


QUIET_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                 "org.apache.spark.api.python.PythonRunner")
"""Loggers that print a Java stack trace for a failed task (silenced on ``local`` masters
while a stage runs: the driver reports the failure itself)."""


_LOG_HANDLES: tuple[Any, Any, Any, list[tuple[str, Any]]] | None = None
"""``(SparkContext, Configurator.setLevel, Level.OFF, [(name, logger)])``: the JVM handles
``_quiet_task_logs`` uses, resolved once per SparkContext (each attribute of a JVM path is a
py4j round trip: entering and leaving the block cost 14-26 ms per job resolving them, 2 ms
with them kept; an empty job takes 0.25-0.28 s here)."""


def _log_handles(sc: Any) -> tuple[Any, Any, list[tuple[str, Any]]]:
    global _LOG_HANDLES
    if _LOG_HANDLES is None or _LOG_HANDLES[0] is not sc:
        log4j = sc._jvm.org.apache.logging.log4j
        _LOG_HANDLES = (sc, log4j.core.config.Configurator.setLevel, log4j.Level.OFF,
                        [(name, log4j.LogManager.getLogger(name)) for name in QUIET_LOGGERS])
    return _LOG_HANDLES[1], _LOG_HANDLES[2], _LOG_HANDLES[3]


@contextmanager
def _quiet_task_logs(sc: Any, local: bool) -> Iterator[None]:
    levels: dict[str, Any] = {}
    set_level: Any = None
    try:
        if local:
            set_level, off, loggers = _log_handles(sc)
            for name, logger in loggers:
                levels[name] = logger.getLevel()
                set_level(name, off)
    except Exception:  # noqa: BLE001 - no JVM access (e.g. Spark Connect): keep the logs
        levels = {}
    try:
        yield
    finally:
        if levels:
            try:
                for name, level in levels.items():
                    set_level(name, level)
            except Exception:  # noqa: BLE001 # pragma: no cover - the session stopped
                pass


def _advertised(coordinator: Coordinator, local: bool) -> tuple[str, int, str]:
    """The endpoint of ``coordinator`` as tasks reach it."""
    host, port, token = coordinator.endpoint
    if not local:
        host = os.environ.get("TOKENFLOW_HOST") or socket.gethostbyname(socket.gethostname())
    return host, port, token


def _check_capacity(sc: Any, workers: int) -> None:
    """Warn (``ContentionWarning``) when the workers exceed the cores or the cluster's task
    slots.

    Raises:
        ValueError: a ``local[n]`` master has fewer than ``workers`` slots (Spark would wait
            for them for about 10 minutes, ``spark.scheduler.barrier.maxConcurrentTasksCheck``).
    """
    from tokenflow.execute import ContentionWarning, capacity_warning, contention, local_slots

    master = str(sc.master)
    slots = local_slots(master)
    if slots is not None and workers > slots:
        raise ValueError(f"{workers} workers need {workers} task slots (one barrier stage); "
                         f"{master} has {slots}: use local[{workers}] or fewer workers")
    if slots is not None:
        message = capacity_warning(workers, "spark", master)
    else:
        try:
            message = contention(workers, int(sc.defaultParallelism), "task slot")
        except Exception:  # noqa: BLE001 # pragma: no cover - no parallelism to compare with
            return
    if message is not None:
        warnings.warn(message, ContentionWarning, stacklevel=4)


def execute_runtime(fn: Callable[[Any], Any], workers: int, master: str | None = None,
                    inputs: dict[str, Any] | None = None, sort_by: dict[str, str] | None = None,
                    spark: Any = None, report_to: tuple[str, int, str] | None = None,
                    spec: Any = None, timeout: float | None = None,
                    heartbeat_timeout: float | None = DEFAULT_HEARTBEAT_TIMEOUT,
                    slots: int | None = None, control_hub: Any = None) -> list[Any]:
    """Run ``fn`` on ``workers`` barrier tasks of Spark; returns per-worker results in order.

    Args:
        fn: the worker function (cloudpickled).
        workers: number of workers = barrier tasks (the cluster needs that many free slots; a
            ``ContentionWarning`` when they exceed the slots or cores).
        master: Spark master URL (default ``local[W]``); ignored when ``spark`` is given.
        inputs: named DataFrames (or Arrow tables) that workers read with ``from_dataframe``:
            each is repartitioned into ``workers`` partitions, partition ``i`` going to worker
            ``i``.
        sort_by: per input, the event-time column to sort partitions by.
        spark: an existing SparkSession to use.
        report_to: a coordinator endpoint ``(host, port, token)`` for progress reports.
        spec: the job's ``tokenflow.job.JobSpec`` (routing table, snapshot to restore,
            control plane).
        timeout: seconds before the job is cancelled (None: no limit).
        heartbeat_timeout: seconds without a heartbeat after which a worker is stalled and the
            job cancelled (None: never).
        slots: worker slots (default ``workers``; the master needs that many task slots):
            with more, workers can join the running job (``JobHandle.add_worker``), each as a
            one-task barrier stage of its own on the same SparkSession while the first stage
            keeps running; the result then has one entry per slot (None for a slot never used).
        control_hub: the control plane's hub (given the ``launch`` of joining workers).

    Raises:
        ValueError: a ``local[n]`` master with fewer than ``workers`` task slots.
        WorkerError: when a worker fails, dies or stalls (naming it: ``worker 1 failed:
            ValueError: ...``, ``worker 1 stalled: no heartbeat for 10.2 s``), or Spark fails
            the stage for another reason (``worker`` -1).
        JobTimeoutError: the job outlived ``timeout``.
    """
    from tokenflow.execute import JobTimeoutError, WorkerError

    slots = workers if slots is None else slots
    spark = spark or spark_session.get_session(master or f"local[{slots}]")
    sc = spark.sparkContext
    secret = new_secret()
    job = f"tokenflow-spark-{secrets.token_hex(4)}"
    local = sc.master.startswith("local")
    _check_capacity(sc, slots)
    layout: list[tuple[str, list[str]]] = []
    if inputs:
        partitions, layout = _input_partitions(spark, inputs, workers, sort_by or {})
    else:
        partitions = sc.parallelize(range(workers), workers)
    own: Coordinator | None = None
    watched: Coordinator | None = None
    heartbeat_to: tuple[str, int, str] | None = None
    if heartbeat_timeout is not None:
        watched = Coordinator.find(report_to) if report_to is not None else None
        if watched is not None:
            heartbeat_to = report_to
        else:
            own = watched = Coordinator(host="127.0.0.1" if local else "0.0.0.0")
            heartbeat_to = _advertised(own, local)
    payload = cloudpickle.dumps(fn)
    task = _make_task(payload, secret, job, workers, layout, local, report_to, spec,
                      heartbeat_to, slots)
    liveness = None if heartbeat_timeout is None else Liveness(workers, heartbeat_timeout)
    monitor = _Monitor(sc, job, job, watched, liveness, timeout)
    joined: dict[int, list[Outcome]] = {}  # slot -> the outcome of its own stage
    joiners: list[threading.Thread] = []
    running = threading.Event()

    def launch(k: int, roster: list[int]) -> None:  # a worker joining the running job
        from tokenflow.membership import addresses

        where = addresses(control_hub, [w for w in roster if w != k], slots, 60.0,
                          running.is_set)
        joiner_task = _make_task(payload, secret, job, workers, [], local, report_to, spec,
                                 heartbeat_to, slots, (k, where, roster))
        if liveness is not None:
            liveness.watch(k)

        def stage() -> None:
            with _job_group(sc, job, f"tokenflow: worker {k} joins"):
                try:
                    joined[k] = _barrier_stage(sc.parallelize([k], 1), joiner_task)
                except Exception as exc:  # noqa: BLE001 - reported with the job's result
                    joined[k] = [(k, False, cloudpickle.dumps(
                        (f"the stage of joining worker {k} failed: {exc}"[:4000], False)))]

        thread = threading.Thread(target=stage, name=f"tokenflow-spark-join-{k}", daemon=True)
        joiners.append(thread)
        thread.start()

    if control_hub is not None and slots > workers:
        control_hub.launch = launch
    start = time.perf_counter()
    running.set()
    if watched is not None:  # the tasks' mesh addresses (see ``Coordinator.gather_addresses``)
        threading.Thread(target=watched.gather_addresses,
                         args=(job, workers, lambda: not running.is_set()), daemon=True,
                         name="tokenflow-spark-addresses").start()
    try:
        with _job_group(sc, job, f"tokenflow: {workers} workers"), _quiet_task_logs(sc, local):
            monitor.start()
            try:
                outcomes = _barrier_stage(partitions, task)
            except Exception as exc:
                monitor.stop()
                if monitor.verdict is not None:
                    worker, message, timed_out = monitor.verdict
                    if timed_out:
                        raise JobTimeoutError(message) from None
                    raise WorkerError(worker, TimeoutError(message), message) from None
                error = stage_error(str(exc))
                error.spark_error = str(exc)  # type: ignore[attr-defined]
                raise error from None
            finally:
                running.clear()
                for thread in joiners:  # a joined worker ends with the job (or left before)
                    thread.join(60.0)
                monitor.stop()
    finally:
        if watched is not None:
            watched.forget(job)
        if own is not None:
            own.close()
    execute_runtime.last_job_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    results: list[Any] = [None] * slots
    failures = []
    for worker, ok, payload in [*outcomes, *(o for k in sorted(joined) for o in joined[k])]:
        value = cloudpickle.loads(payload)
        if ok:
            results[worker] = value
        else:
            message, consequence = value
            failures.append((consequence, worker, message))
    if failures:
        # name a root cause, not a worker that only lost its connection to the failed one
        failures.sort()
        _, worker, message = failures[0]
        raise WorkerError(worker, RuntimeError(message), f"worker {worker} failed: {message}")
    return results


_TASK = (re.compile(r"barrier task ResultTask\(\d+, (\d+)\)"),
         re.compile(r"\b[Tt]ask (\d+)(?:\.\d+)? in stage"))
_JAVA_FRAME = re.compile(r"^\s+at [\w$.<>/]+\(.*\)$|^\s*\.\.\. \d+ more$|^Caused by: ")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|"
                             r"Failure|Stopped|Aborted))(?:: (.*))?$")


def stage_error(text: str) -> Exception:
    """A ``WorkerError`` for a barrier stage Spark failed, from its exception text: the failed
    task's partition (= worker index; -1 when the text names none) and the last line of the
    Python traceback in the text (``ValueError: boom``), or Spark's own reason for the task
    (``Python worker exited unexpectedly (crashed)``); never a Java stack frame."""
    from tokenflow.execute import WorkerError

    worker = -1
    for pattern in _TASK:
        match = pattern.search(text)
        if match:
            worker = int(match.group(1))
            break
    reason = _python_error(text) or _spark_reason(text)
    message = f"worker {worker} failed: {reason}" if worker >= 0 else \
        f"Spark failed the barrier stage: {reason}"
    return WorkerError(worker, RuntimeError(reason), message)


def _python_error(text: str) -> str | None:
    """The exception line ending the last Python traceback in ``text``, or None."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    last = None
    for line in text[at:].splitlines()[1:]:
        if _JAVA_FRAME.match(line):
            break
        if line and not line[0].isspace() and ":" in line or _EXCEPTION_LINE.match(line.strip()):
            last = line.strip()
    if last is None:
        return None
    for prefix in ("org.apache.spark.api.python.PythonException: ", "pyspark.errors.exceptions."):
        if last.startswith(prefix):
            last = last[len(prefix):]
    return last[:500]


def _spark_reason(text: str) -> str:
    """The first line of ``text`` giving the task's failure, without Java class names or
    Spark's advice."""
    candidates = []
    for line in text.splitlines():
        line = line.strip()
        if not line or _JAVA_FRAME.match(line) or line.startswith("An error occurred while calling"):
            continue
        candidates.append(line)
    preferred = [c for c in candidates if "Job aborted due to stage failure" not in c]
    line = (preferred or candidates or ["Spark failed the barrier stage"])[0]
    line = re.sub(r"^:?\s*(?:[a-z]+\.)+[A-Za-z]+(?:Exception|Error): ", "", line)
    return line.split(". Consider setting")[0].strip()[:500]
