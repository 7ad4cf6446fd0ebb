"""PySpark's Python worker daemon with tokenflow's worker modules imported before it forks.

Spark runs one daemon per executor (the module named by ``spark.python.daemon.module``,
SPARK-22959; by default ``pyspark.daemon``) and forks a Python worker from it whenever a task
needs one and none is idle.  With ``spark.python.worker.reuse`` workers are kept between
tasks, but after a worker dies (a crash, a SIGKILL in a recovery trial) the barrier stage the
driver relaunches gets freshly forked workers, and each one imported tokenflow, pyarrow, numpy
and pandas again before it could restore its state: the same cost the process runtime's
forkserver avoids (``tokenflow.process.PRELOAD``).  This daemon imports those modules once,
freezes them out of the cyclic garbage collector (as ``tokenflow.cluster.warm_arrow`` does in
a worker), then runs ``pyspark.daemon.manager()`` unchanged: its forked workers start with
them imported.

``tokenflow.spark.session.get_session`` selects it for ``local[n]`` masters, where the
executors run the driver's interpreter.  On a cluster, set ``spark.python.daemon.module`` to
``tokenflow.spark.daemon`` yourself once every executor's Python can import tokenflow (a
daemon module that cannot be imported fails every Python task of the session).

A fresh worker's first task also adds the session's SparkFiles directory to ``sys.path`` and
calls ``importlib.invalidate_caches()`` (``pyspark.worker_util.setup_spark_files``), which
makes every ``zipimporter`` in ``sys.path_importer_cache`` read its archive's directory
again: about 14 of them for ``pyspark.zip`` once pyspark's worker modules are imported, each
re-reading the same 1,485 entries (PySpark 4.3.0), 0.2-0.4 s of a restarted barrier stage on a
2-core machine.  The daemon drops those cached importers before it forks (``forget_zip_importers``).
"""

from __future__ import annotations

import gc
import importlib
import sys
import zipimport

PRELOAD = ["tokenflow.process", "tokenflow.cluster", "tokenflow.comm.tcp", "tokenflow.worker",
           "tokenflow.spark.runtime", "tokenflow.recovery", "tokenflow.io.sources", "cloudpickle",
           "pandas", "pyarrow.ipc", "pyspark.worker", "pyspark.daemon"]
"""What a tokenflow task imports anyway (pyarrow and numpy come through these), and what
``pyspark.daemon`` imports in each forked worker (``pyspark.worker``, 0.14 s)."""


def preload() -> None:
    """Import ``PRELOAD`` and pay pyarrow's first-conversion cost; then ``gc.freeze``.

    A module that fails to import is skipped: the worker imports it itself and reports the
    error where the user sees it (in the task), not as a daemon that never starts."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001,S112 - the task will import it and fail visibly
            continue
    try:
        from tokenflow.cluster import warm_arrow

        warm_arrow()  # (it freezes what it imported)
    except Exception:  # noqa: BLE001 - as above
        gc.freeze()


def forget_zip_importers() -> int:
    """Drop the ``zipimport.zipimporter`` entries of ``sys.path_importer_cache``; returns how
    many.  The cache may be cleared at any time: a later import from the archive makes a new
    importer from ``zipimport``'s own directory cache, without reading the archive again,
    and ``importlib.invalidate_caches()`` has no zip importer left to re-read."""
    stale = [path for path, finder in sys.path_importer_cache.items()
             if isinstance(finder, zipimport.zipimporter)]
    for path in stale:
        del sys.path_importer_cache[path]
    return len(stale)


def main() -> None:
    preload()
    forget_zip_importers()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
