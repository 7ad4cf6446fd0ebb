"""Jobs of the tests of checkpointed migrating operators: a running word count whose per-word
fold is ``megaphone_fold`` (its bins move between workers while the job runs), read from a
replayable table source so a restored job replays from the checkpoint's positions."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

import cloudpickle
import numpy as np
import pyarrow as pa

from tokenflow.state.bins import RoutingTable

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAME = "tests.migrating.wordcount"
SLOTS = 4
"""Worker processes (or threads): the roster changes among them (2 -> 3 -> 4 -> 3 -> 2)."""


def words_table(epochs: int, rows: int, seed: int = 7) -> pa.Table:
    """Words of a Zipf(1.3) law over 400 made-up words at sorted times ``[0, epochs)``."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(400)])
    t = np.sort(rng.integers(0, epochs, rows))
    return pa.table({"t": t, "word": vocabulary[rng.zipf(1.3, rows) % len(vocabulary)]})


def initial_table(bins: int) -> RoutingTable:
    """Bins spread over workers 0 and 1 of ``SLOTS`` (the others own none yet)."""
    return RoutingTable(RoutingTable.even(2, bins).owners, range(SLOTS))


def count(w: str, n: int, c: int | None) -> tuple[int, list[tuple[str, int]]]:
    return (c or 0) + n, [(w, (c or 0) + n)]


def migrating_wordcount(table: pa.Table, *, bins: int = 256, pace: float = 0.0,
                        output: str | None = None, triggers: list[tuple[int, int]] | None = None,
                        strategy: str = "batched") -> Any:
    """The running word count ``(word, count so far)`` per occurrence through
    ``megaphone_fold``.  ``output``: a committed Parquet dataset (else the job returns
    ``{"out": {time: Counter}, "issued": [(time, moves)]}`` per worker); ``pace``: seconds of
    sleep per batch of 100 rows; ``triggers``: ``[(epoch, n)]``, worker 0 spreads the bins over
    workers ``0..n-1`` once its source sends a row at ``epoch`` or later (only triggers at or
    after the epoch a restored run starts at fire)."""

    def job(worker: Any) -> Any:
        from tokenflow.io import to_parquet
        from tokenflow.io.sources import replayable_source, table_splits
        from tokenflow.rescale import megaphone_fold

        pending = sorted(triggers or []) if worker.index == 0 else []
        handles: list[Any] = []

        def pairs(batch: Any) -> list[tuple[str, int]]:
            if pace:
                time.sleep(pace)
            return [(w, 1) for w in batch.column("word").to_pylist()]

        def trigger(t: int, batch: Any) -> None:
            while pending and pending[0][0] <= t:
                handles[0].controller.rescale_roster(list(range(pending.pop(0)[1])), strategy)

        def build(scope: Any) -> Any:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", max_rows=100)
            stream = words.inspect_batch(trigger)  # (the same dataflow on every worker)
            handle = megaphone_fold(stream.map_batch(pairs), count,
                                    initial=initial_table(bins))
            handles.append(handle)
            if output is not None:
                to_parquet(handle.stream, output, columns=["word", "count"])
                return None
            return handle.stream.capture()

        capture = worker.dataflow(build)
        restored = getattr(worker, "restore", None)
        if restored is not None and worker.index == 0:  # triggers before the restored epoch
            while pending and pending[0][0] < int(restored.epoch):
                pending.pop(0)
        worker.step_until_done()
        if capture is None:
            return None
        out = {t: Counter(records) for t, records in capture.by_time().items()}
        return {"out": out, "issued": list(handles[0].controller.issued)}

    return job


def merged(results: list[Any]) -> dict[int, Counter[Any]]:
    """The per-time multisets of every worker's captured output, merged."""
    out: dict[int, Counter[Any]] = {}
    for r in results:
        for t, c in (r or {}).get("out", {}).items():
            out.setdefault(t, Counter()).update(c)
    return out


def oracle(table: pa.Table) -> dict[int, Counter[Any]]:
    """What the running word count emits per time (a plain ``Counter``)."""
    from running_counts import running_counts

    times = table.column("t").to_pylist()
    words = table.column("word").to_pylist()
    last = max(times) + 1
    per: list[list[str]] = [[] for _ in range(last)]
    for t, w in zip(times, words, strict=True):
        per[t].append(w)
    return {t: c for t, c in running_counts(per).items() if c}
