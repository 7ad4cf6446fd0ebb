"""``tokenflow.cluster``: what every worker process (process runtime, Spark barrier task) sets up
before it joins the mesh: here, pyarrow's allocator (``use_system_allocator``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from tokenflow import execute
from tokenflow.cluster import ARROW_POOL_VARIABLE, use_system_allocator


@pytest.fixture
def default_pool() -> Iterator[None]:
    """Restore this process's default pool after a test that changes it."""
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


@pytest.mark.usefixtures("default_pool")
def test_the_system_allocator_becomes_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARROW_POOL_VARIABLE, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "system"
    before = pa.system_memory_pool().bytes_allocated()
    values = pa.array(range(100_000))  # allocated from the new default
    assert values.buffers()[1] is not None
    assert pa.system_memory_pool().bytes_allocated() >= before + 800_000
    assert pa.default_memory_pool().backend_name == "system"


@pytest.mark.usefixtures("default_pool")
@pytest.mark.parametrize("name", ["mimalloc", "jemalloc", " MIMALLOC "])
def test_a_pool_named_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    try:
        getattr(pa, f"{name.strip().lower()}_memory_pool")()
    except NotImplementedError:
        pytest.skip(f"this pyarrow is built without {name.strip()}")
    monkeypatch.setenv(ARROW_POOL_VARIABLE, name)
    pa.set_memory_pool(pa.system_memory_pool())
    assert use_system_allocator() == name.strip().lower()


@pytest.mark.usefixtures("default_pool")
def test_an_unknown_pool_name_leaves_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARROW_POOL_VARIABLE, "tcmalloc")
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    assert use_system_allocator() == "mimalloc"


def pool_of_worker(worker: Any) -> str:
    return str(pa.default_memory_pool().backend_name)


def test_process_workers_allocate_with_the_system_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARROW_POOL_VARIABLE, raising=False)
    assert execute(pool_of_worker, workers=2, runtime="process") == ["system", "system"]
    # set after the forkserver imported pyarrow: the worker still reads it
    monkeypatch.setenv(ARROW_POOL_VARIABLE, "mimalloc")
    assert execute(pool_of_worker, workers=2, runtime="process") == ["mimalloc", "mimalloc"]


@pytest.mark.spark
def test_spark_barrier_tasks_allocate_with_the_system_allocator(spark: Any) -> None:
    def pool(worker: Any) -> str:  # nested: pickled by value for the task
        import pyarrow

        return str(pyarrow.default_memory_pool().backend_name)

    assert execute(pool, workers=2, runtime="spark") == ["system", "system"]
