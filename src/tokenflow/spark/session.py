"""One SparkSession per driver process, created on first use and reused.

Start-up time is recorded apart from job time (``startup_seconds``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

DAEMON_MODULE = "tokenflow.spark.daemon"
"""The Python worker daemon of ``local[n]`` sessions: PySpark's, with tokenflow's worker
modules imported before it forks (``tokenflow.spark.daemon``)."""

_SESSION: Any = None
_MASTER: str | None = None
startup_seconds: float = 0.0
"""Seconds the first ``get_session`` call spent starting Spark (0 when it was reused)."""


def get_session(master: str | None = None, app_name: str = "tokenflow", **conf: str) -> Any:
    """The process's SparkSession, started on first use with ``master`` (default ``local[2]``).

    A ``local[n]`` session forks its Python workers from ``tokenflow.spark.daemon``, which
    has imported tokenflow, pyarrow and pandas once (``conf`` may set another
    ``spark.python.daemon.module``), and runs ``warm_up`` before it is returned.

    Raises:
        RuntimeError: when a session already runs with a different master.
    """
    global _SESSION, _MASTER, startup_seconds
    from pyspark.sql import SparkSession

    if running():
        if master is not None and master != _MASTER and not _compatible(master, _MASTER):
            raise RuntimeError(f"a SparkSession with master {_MASTER} is running; asked for {master}")
        return _SESSION
    master = master or "local[2]"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    start = time.perf_counter()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):  # executors run this interpreter: it imports tokenflow
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
    for key, value in conf.items():
        builder = builder.config(key, value)
    _SESSION = builder.getOrCreate()
    _SESSION.sparkContext.setLogLevel("ERROR")
    _MASTER = master
    if master.startswith("local"):
        warm_up(_SESSION, master)
    startup_seconds = time.perf_counter() - start
    return _SESSION


def warm_up(session: Any, master: str) -> None:
    """Run a tiny job on every task slot of a new ``local`` session: a barrier stage over
    parallelized items (``RDD.barrier().mapPartitions``), as a job's.

    A session's first stage with a Python function pays Spark's one-time costs: the JVM
    loads its scheduler and barrier code, and the Python daemon starts and forks a worker
    per slot.  Measured on a 2-core machine (with a DataFrame stage then): 5.6-7.1 s before
    the first job's tasks ran, 0.2-0.3 s for the next.  Paid here, they count as start-up
    (``startup_seconds``) instead of falling on the session's first job.  A warm-up that
    fails is ignored: the job that needs the same machinery reports the error itself.
    """
    from tokenflow.execute import local_slots

    slots = local_slots(master) or 1

    def touch(items: Any) -> Any:
        yield sum(1 for _ in items)

    try:
        # a barrier stage over parallelized items, one partition a slot: the path of a
        # job's tasks and of its local-table inputs (``tokenflow.spark.inputs``)
        session.sparkContext.parallelize(range(slots), slots).barrier() \
            .mapPartitions(touch).collect()
    except Exception:  # noqa: BLE001,S110 - see the docstring
        pass


def _compatible(asked: str, running: str | None) -> bool:
    """``local[n]`` sessions can serve jobs of up to n workers."""
    if running is None:
        return False
    return asked.startswith("local[") and running.startswith("local[") and \
        _local_slots(asked) <= _local_slots(running)


def _local_slots(master: str) -> int:
    inner = master[len("local["):-1]
    return os.cpu_count() or 1 if inner == "*" else int(inner)


def running() -> bool:
    """Whether this process has a live session (``get_session`` would reuse it)."""
    return _SESSION is not None and _SESSION.sparkContext._jsc is not None


def stop_session() -> None:
    """Stop the session (tests and the CLI call this at exit)."""
    global _SESSION, _MASTER
    if _SESSION is not None:
        _SESSION.stop()
    _SESSION = None
    _MASTER = None
