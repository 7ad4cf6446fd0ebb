"""The Python workers of a ``local[n]`` session are forked from ``tokenflow.spark.daemon``,
which imported tokenflow's worker modules before forking (a worker relaunched after a crash
starts with them imported: Spark recovery's stage start fell from 1.6 to 0.9 s median in
``benchmarks/recovery.py``), and dropped its cached zip importers (on a slow VM, from 1.77 to
0.79 s)."""

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


def test_forgotten_zip_importers_are_not_reread_and_imports_still_work(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh worker's first task adds a path and calls ``importlib.invalidate_caches()``:
    with the cached zip importers, every one re-reads its archive; after
    ``forget_zip_importers`` none does, and modules still import from the archive."""
    import importlib
    import zipfile
    import zipimport

    from tokenflow.spark.daemon import forget_zip_importers

    archive = tmp_path / "packed.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zpkg/__init__.py", "")
        z.writestr("zpkg/a.py", "A = 1\n")
        z.writestr("zpkg/sub/__init__.py", "")
        z.writestr("zpkg/sub/b.py", "B = 2\n")
        z.writestr("zpkg/sub/c.py", "C = 3\n")
    monkeypatch.syspath_prepend(str(archive))
    for name in ("zpkg", "zpkg.a", "zpkg.sub", "zpkg.sub.b", "zpkg.sub.c"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("zpkg.a")
    importlib.import_module("zpkg.sub.b")

    reads: list[str] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(path: str) -> Any:
        reads.append(path)
        return read_directory(path)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    importlib.invalidate_caches()
    ours = [p for p in reads if p.startswith(str(archive))]
    assert len(ours) >= 3  # the archive, zpkg and zpkg/sub importers each read it again

    reads.clear()
    assert forget_zip_importers() >= 3
    assert not any(isinstance(f, zipimport.zipimporter) for f in sys.path_importer_cache.values())
    monkeypatch.syspath_prepend(str(tmp_path / "spark-files"))  # what the first task adds
    importlib.invalidate_caches()
    assert importlib.import_module("zpkg.sub.c").C == 3  # a module not imported before
    assert [p for p in reads if p.startswith(str(archive))] == []
