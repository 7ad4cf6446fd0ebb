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
"""

from __future__ import annotations

import gc
import importlib

PRELOAD = ["tokenflow.process", "tokenflow.cluster", "tokenflow.comm.tcp", "tokenflow.worker",
           "tokenflow.spark.runtime", "cloudpickle", "pandas", "pyarrow.ipc"]
"""What a tokenflow task imports anyway (pyarrow and numpy come through these)."""


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


def main() -> None:
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
