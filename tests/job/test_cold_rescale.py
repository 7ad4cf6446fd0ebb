"""Snapshot a running job at an epoch boundary, stop it, restart it from the snapshot at
another worker count: the union of both runs' output equals an uninterrupted run's.

Runs the control plane end to end (``tokenflow.job.start`` -> ``JobHandle.snapshot`` ->
``execute(restore=...)``) over a replayable table source and a binned ``state_machine``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tokenflow import execute
from tokenflow.dataflow.operators.stateful import state_machine
from tokenflow.io.sources import replayable_source, table_splits
from tokenflow.job import start
from tokenflow.state.snapshot import Snapshot, SnapshotError

EPOCHS = 40
NAME = "tests.wordcount"


def words_table(seed: int = 7, rows: int = 4000) -> pa.Table:
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(300)])
    t = np.sort(rng.integers(0, EPOCHS, rows))
    return pa.table({"t": t, "word": vocabulary[rng.zipf(1.3, rows) % len(vocabulary)]})


def wordcount(table: pa.Table, pause_at: int | None = None) -> Any:
    """A running word count: ``(word, count so far)`` per occurrence, at its epoch."""

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", pause_at=pause_at, max_rows=200)
            pairs = words.map_batch(lambda b: [(w, 1) for w in b.column("word").to_pylist()])
            counts = state_machine(pairs, lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            return counts.capture()

        return worker.dataflow(build)

    return job


def by_time(results: list[Any]) -> dict[int, Counter[Any]]:
    out: dict[int, Counter[Any]] = {}
    for capture in results:
        for t, batch in capture.events:
            out.setdefault(t, Counter()).update(batch)
    return out


def merged(*runs: list[Any]) -> dict[int, Counter[Any]]:
    out: dict[int, Counter[Any]] = {}
    for results in runs:
        for t, counts in by_time(results).items():
            out.setdefault(t, Counter()).update(counts)
    return out


@pytest.mark.parametrize(("before", "after", "pause"), [(2, 3, 12), (3, 2, 25), (2, 4, 5)])
def test_cold_rescale_on_threads_matches_an_uninterrupted_run(tmp_path: Path, before: int, after: int,
                                                              pause: int) -> None:
    table = words_table(seed=before * 10 + after)
    expected = by_time(execute(wordcount(table), workers=before, name=NAME))
    handle = start(wordcount(table, pause_at=pause), workers=before, name=NAME)
    epoch = handle.snapshot(str(tmp_path))
    first = handle.result(timeout=60)
    assert 0 < epoch <= pause
    assert max(by_time(first), default=-1) < epoch  # nothing at or after the pause epoch
    second = execute(wordcount(table), workers=after, restore=str(tmp_path), name=NAME)
    assert merged(first, second) == expected


@pytest.mark.usefixtures("one_blob_per_bin")  # shared blobs are read whole
def test_restore_reads_only_bins_whose_owner_changed(tmp_path: Path) -> None:
    table = words_table(rows=20_000)
    handle = start(wordcount(table, pause_at=30), workers=2, name=NAME)
    handle.snapshot(str(tmp_path))
    handle.result(timeout=60)
    snapshot = Snapshot.open(str(tmp_path), job=NAME)
    stored = sum(snapshot.stored_bytes().values())
    new = snapshot.routing.rebalanced(range(3))
    foreign = 0
    for w in range(3):
        reader = Snapshot.open(str(tmp_path), job=NAME)
        for state in reader.states():
            reader.read(state, new.owned_by(w).tolist())
        foreign += sum(n for writer, n in reader.bytes_read.items() if writer != w)
    assert stored > 0
    assert foreign / stored <= 1 / 3 + 0.02


def test_restoring_another_jobs_snapshot_fails_naming_the_file(tmp_path: Path) -> None:
    table = words_table()
    handle = start(wordcount(table, pause_at=10), workers=2, name=NAME)
    handle.snapshot(str(tmp_path))
    handle.result(timeout=60)
    with pytest.raises(SnapshotError, match="MANIFEST.json.*other-job|other-job.*MANIFEST"):
        execute(wordcount(table), workers=2, restore=str(tmp_path), name="other-job")
    with pytest.raises(SnapshotError, match="bins"):
        execute(wordcount(table), workers=2, restore=str(tmp_path), name=NAME, bins=1024)


@pytest.mark.parametrize("runtime", ["process", pytest.param("spark", marks=pytest.mark.spark)])
def test_cold_rescale_2_to_3_on_processes_and_spark(tmp_path: Path, runtime: str,
                                                    request: pytest.FixtureRequest) -> None:
    options: dict[str, Any] = {}
    if runtime == "spark":
        options["spark"] = request.getfixturevalue("spark")  # local[4]: room for 3 workers
    table = words_table(seed=3)
    expected = by_time(execute(wordcount(table), workers=2, name=NAME))
    handle = start(wordcount(table, pause_at=15), workers=2, runtime=runtime, name=NAME, **options)
    epoch = handle.snapshot(str(tmp_path), timeout=120)
    first = handle.result(timeout=120)
    assert 0 < epoch <= 15
    second = execute(wordcount(table), workers=3, runtime=runtime, restore=str(tmp_path), name=NAME,
                     **options)
    assert merged(first, second) == expected


def wordcount_to_parquet(table: pa.Table, path: str, pause_at: int | None = None) -> Any:
    """The running word count written with the committing Parquet sink, in bins of 4 epochs."""

    def job(worker: Any) -> None:
        from tokenflow.io import to_parquet

        def build(scope: Any) -> None:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", pause_at=pause_at, max_rows=200)
            pairs = words.map_batch(lambda b: [(w, 1) for w in b.column("word").to_pylist()])
            counts = state_machine(pairs, lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            to_parquet(counts, path, columns=["word", "count"], granularity=4)

        worker.dataflow(build)

    return job


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_cold_rescale_with_the_committing_sink(tmp_path: Path, before: int, after: int) -> None:
    from tokenflow.io import read_committed

    table = words_table(seed=11)
    whole, cut, snap = tmp_path / "whole", tmp_path / "cut", tmp_path / "snap"
    execute(wordcount_to_parquet(table, str(whole)), workers=before, name=NAME)
    handle = start(wordcount_to_parquet(table, str(cut), pause_at=18), workers=before, name=NAME)
    handle.snapshot(str(snap))
    handle.result(timeout=60)
    execute(wordcount_to_parquet(table, str(cut)), workers=after, restore=str(snap), name=NAME)

    def rows(path: Path) -> list[tuple[Any, ...]]:
        data = read_committed(str(path))
        return sorted(zip(*(data.column(c).to_pylist() for c in ("time", "word", "count")),
                          strict=True))

    assert rows(cut) == rows(whole)
    assert len(rows(whole)) == table.num_rows


@pytest.mark.parametrize(("before", "after", "runtime"), [(2, 3, "thread"), (3, 2, "thread"),
                                                          (2, 4, "process")])
def test_flights_cold_rescale_matches_an_uninterrupted_run(tmp_path: Path, before: int, after: int,
                                                           runtime: str) -> None:
    """The flights job (hourly statistics per airport, months written with to_parquet) over
    two months of 2013, snapshotted mid-way and restored at another worker count: the
    statistics and the committed dataset equal an uninterrupted run's."""
    from tokenflow.flights import COLUMNS, flights_job, load_flights, read_hourly

    table = load_flights().select(COLUMNS).slice(0, 50_000)  # about two months of 2013
    whole, cut, snap = tmp_path / "whole", tmp_path / "cut", tmp_path / "snap"
    name = "tests.flights"
    uninterrupted = execute(flights_job(table, str(whole), max_rows=2000), workers=before,
                            runtime=runtime, name=name)
    times = table.column("time_hour").cast(pa.int64()).to_numpy()
    pause = int(np.quantile(times, 0.4))  # ms since the Unix epoch: 40 % of the way through
    pause -= pause % 1000
    handle = start(flights_job(table, str(cut), max_rows=2000, pause_at=pause), workers=before,
                   runtime=runtime, name=name)
    handle.snapshot(str(snap), timeout=120)
    first = handle.result(timeout=120)
    second = execute(flights_job(table, str(cut), max_rows=2000), workers=after, runtime=runtime,
                     restore=str(snap), name=name)

    def stats(*runs: list[Any]) -> list[tuple[Any, ...]]:
        tables = [rows for results in runs for rows, _ in results]
        return sorted(tuple(r.values()) for t in tables for r in t.to_pylist())

    assert stats(first, second) == stats(uninterrupted)
    assert stats(second), "nothing left for the restored run: the test would prove nothing"
    assert read_hourly(cut).equals(read_hourly(whole))
