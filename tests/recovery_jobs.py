"""Jobs the recovery tests run: a paced running word count written with the committing
Parquet sink, which can be told to fail or that records its worker processes' pids."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pyarrow as pa

from tokenflow.dataflow.operators.stateful import state_machine
from tokenflow.io import read_committed, to_parquet
from tokenflow.io.sources import replayable_source, table_splits

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAME = "tests.recovery.wordcount"


def words_table(epochs: int = 60, rows: int = 12_000, seed: int = 5) -> pa.Table:
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(500)])
    t = np.sort(rng.integers(0, epochs, rows))
    return pa.table({"t": t, "word": vocabulary[rng.zipf(1.3, rows) % len(vocabulary)]})


def wordcount(table: pa.Table, output: str, pids: str | None = None, pace: float = 0.0,
              fail: str | None = None, granularity: int | None = None) -> Any:
    """A running word count ``(word, count so far)`` per occurrence, committed per epoch to
    ``output``.  ``pids``: a directory where each worker process writes a file named by its
    pid; ``pace``: seconds to sleep per batch of 100 rows (so the job runs long enough to be
    killed); ``fail``: a file whose presence makes worker 1 raise once, at an epoch >= 20
    (the file is removed first); ``granularity``: the sink commits bins of that many epochs."""

    def job(worker: Any) -> None:
        if pids is not None:
            Path(pids, f"{os.getpid()}-{worker.index}").touch()

        def slow(batch: Any) -> list[tuple[str, int]]:
            if pace:
                time.sleep(pace)
            return [(w, 1) for w in batch.column("word").to_pylist()]

        def check(t: int, batch: Any) -> None:
            if fail is not None and worker.index == 1 and t >= 20 and os.path.exists(fail):
                os.remove(fail)
                raise RuntimeError(f"injected failure at epoch {t}")

        def build(scope: Any) -> None:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", max_rows=100)
            pairs = words.map_batch(slow)
            if fail is not None:
                pairs = pairs.inspect_batch(check)
            counts = state_machine(pairs, lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            to_parquet(counts, output, columns=["word", "count"], granularity=granularity)

        worker.dataflow(build)

    return job


def committed_rows(path: str | Path) -> list[tuple[Any, ...]]:
    """Every committed row as ``(epoch, word, count)``, sorted: per-epoch multisets."""
    data = read_committed(str(path))
    return sorted(zip(*(data.column(c).to_pylist() for c in ("time", "word", "count")), strict=True))


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    """Poll ``condition()`` every 10 ms until it holds; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
