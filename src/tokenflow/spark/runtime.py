"""The ``spark`` runtime: workers as one PySpark barrier stage.

Source: docs/ARCHITECTURE.md ("Execution model": the driver starts a SparkSession and launches the W workers
as one barrier stage; each task opens a listening socket, exchanges addresses with
``BarrierTaskContext.allGather``, authenticates its peers and forms the TCP mesh, builds the
dataflow and runs it).  The stage runs over the job's input DataFrames (if any), so worker ``i``
reads Spark partition ``i`` as Arrow batches (``mapInArrow(..., barrier=True)``); each task
returns its worker's cloudpickled result.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pyarrow as pa

from tokenflow.comm.auth import new_secret
from tokenflow.comm.tcp import bind_listener
from tokenflow.spark import session as spark_session

TAG = "__tf_input"
RESULT_SCHEMA = "worker int, ok boolean, payload binary"


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


def _make_task(payload: bytes, secret: bytes, job: str, workers: int,
               inputs: list[tuple[str, list[str]]], local: bool,
               report_to: tuple[str, int, str] | None,
               spec: Any = None) -> Callable[..., Iterator[pa.RecordBatch]]:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import BarrierTaskContext

        from tokenflow.cluster import run_worker
        from tokenflow.spark.inputs import split_inputs

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        host = "127.0.0.1" if local else _task_host()
        listener = bind_listener("0.0.0.0" if not local else "127.0.0.1", 0)
        port = listener.getsockname()[1]
        gathered = ctx.allGather(json.dumps([index, host, port]))
        addresses: list[tuple[str, int]] = [("", 0)] * workers
        for item in gathered:
            i, h, p = json.loads(item)
            addresses[i] = (h, p)
        try:
            fn = cloudpickle.loads(payload)
            worker_inputs = split_inputs(batches, inputs, TAG)

            def configure(worker: Any) -> None:
                worker.inputs = worker_inputs

            result = run_worker(fn, index, workers, listener, addresses, secret, job, configure,
                                report_to=report_to, spec=spec)
            out = [index, True, cloudpickle.dumps(result)]
        except BaseException as exc:  # noqa: BLE001 - returned to the driver with its traceback
            import traceback

            from tokenflow.process import _is_consequence

            out = [index, False, cloudpickle.dumps((f"{type(exc).__name__}: {exc}\n"
                                                    f"{traceback.format_exc()}",
                                                    _is_consequence(exc)))]
        yield pa.RecordBatch.from_pylist(
            [{"worker": out[0], "ok": out[1], "payload": out[2]}],
            schema=pa.schema([("worker", pa.int32()), ("ok", pa.bool_()), ("payload", pa.binary())]),
        )

    return task


def _input_frame(spark: Any, inputs: dict[str, Any], workers: int,
                 sort_by: dict[str, str]) -> tuple[Any, list[tuple[str, list[str]]]]:
    """One DataFrame with all inputs, columns prefixed per input and a tag column, split into
    ``workers`` partitions by a hash of every column (reproducible: the same rows go to the same
    partition on every run, unlike a round-robin ``repartition(W)``, whose assignment depends on
    the order Spark reads the input in) and sorted by each input's time column within
    partitions."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    frames = []
    layout: list[tuple[str, list[str]]] = []
    order = [F.col(TAG)]
    for k, (name, df) in enumerate(inputs.items()):
        if isinstance(df, pa.Table):
            df = spark.createDataFrame(df.to_pandas())
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


def execute_runtime(fn: Callable[[Any], Any], workers: int, master: str | None = None,
                    inputs: dict[str, Any] | None = None, sort_by: dict[str, str] | None = None,
                    spark: Any = None, report_to: tuple[str, int, str] | None = None,
                    spec: Any = None) -> list[Any]:
    """Run ``fn`` on ``workers`` barrier tasks of Spark; returns per-worker results in order.

    Args:
        fn: the worker function (cloudpickled).
        workers: number of workers = barrier tasks (the cluster needs that many free slots).
        master: Spark master URL (default ``local[W]``); ignored when ``spark`` is given.
        inputs: named DataFrames (or Arrow tables) that workers read with ``from_dataframe``:
            each is repartitioned into ``workers`` partitions, partition ``i`` going to worker
            ``i``.
        sort_by: per input, the event-time column to sort partitions by.
        spark: an existing SparkSession to use.
        report_to: a coordinator endpoint ``(host, port, token)`` for progress reports.
        spec: the job's ``tokenflow.job.JobSpec`` (routing table, snapshot to restore,
            control plane).

    Raises:
        WorkerError: when a worker fails (naming it), or Spark fails the stage.
    """
    from tokenflow.execute import WorkerError

    spark = spark or spark_session.get_session(master or f"local[{workers}]")
    secret = new_secret()
    job = f"tokenflow-spark-{secrets.token_hex(4)}"
    local = spark.sparkContext.master.startswith("local")
    layout: list[tuple[str, list[str]]] = []
    if inputs:
        frame, layout = _input_frame(spark, inputs, workers, sort_by or {})
    else:
        frame = spark.range(0, workers, numPartitions=workers).select()
    task = _make_task(cloudpickle.dumps(fn), secret, job, workers, layout, local, report_to, spec)
    start = time.perf_counter()
    try:
        rows = frame.mapInArrow(task, RESULT_SCHEMA, barrier=True).collect()
    except Exception as exc:
        raise WorkerError(-1, RuntimeError(f"Spark failed the barrier stage: {_short(exc)}")) from exc
    execute_runtime.last_job_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    results: list[Any] = [None] * workers
    failures = []
    for row in rows:
        value = cloudpickle.loads(row["payload"])
        if row["ok"]:
            results[row["worker"]] = value
        else:
            message, consequence = value
            failures.append((consequence, row["worker"], message))
    if failures:
        # name a root cause, not a worker that only lost its connection to the failed one
        failures.sort()
        _, worker, message = failures[0]
        raise WorkerError(worker, RuntimeError(message), f"worker {worker} failed: {message}")
    return results


def _short(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return text[:500]
