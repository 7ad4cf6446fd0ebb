"""The Python workers of a ``local[n]`` session are forked from ``tokenflow.spark.daemon``,
which imported tokenflow's worker modules before forking (a worker relaunched after a crash
starts with them imported: Spark recovery's stage start fell from 1.6 to 0.9 s median in
``benchmarks/recovery.py``)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_local_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    from tokenflow.spark.daemon import PRELOAD

    def _worker_view(_: Any) -> tuple[str, bool]:  # nested: pickled by value for the task
        import sys

        spec = getattr(sys.modules["__main__"], "__spec__", None)
        return (spec.name if spec is not None else "", "tokenflow.comm.tcp" in sys.modules)

    daemon, preloaded = spark.sparkContext.parallelize([0], 1).map(_worker_view).collect()[0]
    assert daemon == "tokenflow.spark.daemon"
    assert preloaded  # imported by the daemon: this task never imports it itself
    assert "tokenflow.comm.tcp" in PRELOAD


def test_preload_imports_and_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``preload`` imports every module of ``PRELOAD`` it can and skips one that fails."""
    import gc

    from tokenflow.spark import daemon

    monkeypatch.setattr(daemon, "PRELOAD", ["colorsys", "no_such_module_here"])
    sys.modules.pop("colorsys", None)
    gc.unfreeze()  # whatever an earlier test froze: the count below is preload's
    assert gc.get_freeze_count() == 0
    daemon.preload()
    assert "colorsys" in sys.modules and "no_such_module_here" not in sys.modules
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
