"""Replayable sources (``tokenflow.io.sources``, ``tokenflow.io.directory``) on the thread runtime.

* A table source emits every row exactly once, at its logical time, in time order per worker,
  equal to a pandas groupby; its recorded offset ranges cover each worker's splits.
* Split assignment: the same keys for any worker count, every key on exactly one worker,
  balanced; a key column puts equal keys in the same split whatever the table.
* Pause at ``e`` and restart at another worker count from the union of the positions with
  ``start=e``: run 1 emits exactly the rows before ``e``, run 2 exactly the others (table,
  Parquet, NEXMark); pausing and resuming within one run loses and repeats nothing.
* Parquet: a read at an offset reads only the row group holding it; a restarted run never
  reads row groups wholly before its positions.
* NEXMark: the three streams equal ``generate(0, events, config)`` by kind, each event
  generated once.
* Directory: files dropped (hidden name + rename) while the job runs are each read exactly once
  by one worker, and the job ends at the end marker; a restart skips the files done.
* Bad input: an unsorted split, or positions that do not match ``start``, fail with
  ``InputError`` naming the split, row and value; so do a null in the time column (naming
  source, split or file, column and row, also past the first read), a split that cannot be
  read (a truncated Parquet file, a CSV value that does not fit the declared schema: no
  ``ArrowInvalid`` reaches the caller), and a timed directory file holding a null time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import tokenflow.io.sources as sources_module
from tokenflow import WorkerError, execute
from tokenflow.dataflow.operators.capture import Capture, capture
from tokenflow.io.directory import FILE_DONE, directory_source
from tokenflow.io.sources import (
    InputError,
    ParquetSplit,
    SourceHandle,
    Split,
    TableSplit,
    assign_splits,
    nexmark_splits,
    nexmark_streams,
    parquet_splits,
    replayable_source,
    table_splits,
)
from tokenflow.nexmark.generator import KINDS, GeneratorConfig, generate
from tokenflow.worker import Worker

ROWS = 3000
TIMES = 200
GRANULARITY = 10


def events_table(rows: int = ROWS, seed: int = 5) -> pa.Table:
    """``id`` (unique), ``t`` in ``[0, TIMES)`` (unsorted), ``k`` (a key), ``v``."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": np.arange(rows, dtype=np.int64),
        "t": rng.integers(0, TIMES, rows).astype(np.int64),
        "k": rng.integers(0, 97, rows).astype(np.int64),
        "v": rng.normal(size=rows),
    })


def oracle(table: pa.Table, granularity: int) -> dict[int, list[int]]:
    """Ids per logical time ``t - t % granularity``, computed with pandas."""
    frame = table.to_pandas()
    frame["logical"] = frame["t"] // granularity * granularity
    return {int(t): sorted(g["id"].tolist()) for t, g in frame.groupby("logical")}


def ids_by_time(captures: list[Capture]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for cap in captures:
        for t, batch in cap.events:
            out.setdefault(t, []).extend(batch.column("id").to_pylist())
    return {t: sorted(ids) for t, ids in out.items()}


def all_ids(captures: list[Capture]) -> list[int]:
    return [i for cap in captures for _, b in cap.events for i in b.column("id").to_pylist()]


def check_stream(cap: Capture, granularity: int) -> None:
    """Messages in time order, each row at its logical time, frontier monotone and ended."""
    times = [t for t, _ in cap.events]
    assert times == sorted(times), times
    for t, batch in cap.events:
        raw = batch.column("t").to_numpy()
        assert (raw - raw % granularity == t).all(), (t, raw)
    fronts = [f[0] for f in cap.frontiers if f]
    assert fronts == sorted(fronts), cap.frontiers
    assert cap.frontiers[-1] == []


Build = Callable[[Any, dict[str, int] | None, int | None, int | None], tuple[Any, SourceHandle]]
"""``build(scope, positions, start, pause_at)`` -> (stream, handle)."""


def run_job(build: Build, workers: int, positions: dict[str, int] | None = None,
            start: int | None = None, pause_at: int | None = None
            ) -> list[tuple[Capture, dict[str, int], SourceHandle]]:
    """Run the source; with ``pause_at``, each worker steps until paused, records its
    positions and closes the source."""

    def job(worker: Worker) -> tuple[Capture, dict[str, int], SourceHandle]:
        def dataflow(scope: Any) -> tuple[Capture, SourceHandle]:
            stream, handle = build(scope, positions, start, pause_at)
            return capture(stream), handle

        cap, handle = worker.dataflow(dataflow)
        if pause_at is not None:
            worker.step_while(lambda: not handle.paused)
            assert handle.frontier is None or handle.frontier >= pause_at
            recorded = handle.positions()
            handle.close()
        worker.step_until_done()
        if pause_at is None:
            recorded = handle.positions()
        return cap, recorded, handle

    return execute(job, workers=workers, runtime="thread")


def union(positions: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in positions:
        assert not set(p) & set(out), "a split recorded by two workers"
        out.update(p)
    return out


def check_restart(build: Build, whole: dict[int, list[int]], w1: int, w2: int, epoch: int,
                  splits: list[Split], between: Callable[[], None] | None = None
                  ) -> tuple[dict[str, int], list[Any]]:
    """Pause run 1 at ``epoch`` on ``w1`` workers, restart run 2 on ``w2`` from its positions."""
    first = run_job(build, w1, pause_at=epoch)
    positions = union([p for _, p, _ in first])
    assert sorted(positions) == sorted(s.key for s in splits)
    got1 = ids_by_time([c for c, _, _ in first])
    assert got1 == {t: ids for t, ids in whole.items() if t < epoch}
    if between is not None:
        between()
    second = run_job(build, w2, positions=positions, start=epoch)
    got2 = ids_by_time([c for c, _, _ in second])
    assert got2 == {t: ids for t, ids in whole.items() if t >= epoch}
    everything = all_ids([c for c, _, _ in first]) + all_ids([c for c, _, _ in second])
    assert len(everything) == len(set(everything)) == sum(len(v) for v in whole.values())
    return positions, second


# -- table source ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_table_source_emits_each_row_once_at_its_time(workers: int) -> None:
    table = events_table()
    splits = table_splits(table, 16, key="k", time="t")

    def build(scope: Any, positions: Any, start: Any, pause_at: Any) -> Any:
        return replayable_source(scope, "Events", splits, "t", granularity=GRANULARITY,
                                 max_rows=64)

    results = run_job(build, workers)
    assert ids_by_time([c for c, _, _ in results]) == oracle(table, GRANULARITY)
    assert sorted(all_ids([c for c, _, _ in results])) == list(range(ROWS))
    for cap, positions, handle in results:
        check_stream(cap, GRANULARITY)
        assert handle.done and handle.frontier is None
        # Every split read to its end, and the recorded ranges tile [0, rows) per split.
        rows = {s.key: s.rows for s in splits}
        assert positions == {k: rows[k] for k in handle.keys}
        covered: dict[str, list[tuple[int, int]]] = {}
        for t in sorted(handle.epochs):
            for key, rng in handle.epochs[t].items():
                covered.setdefault(key, []).append(rng)
        for key, ranges in covered.items():
            flat = [x for r in ranges for x in r]
            assert flat[0] == 0 and flat[-1] == rows[key] and flat == sorted(flat), (key, ranges)


def test_split_assignment_is_worker_count_independent_and_balanced() -> None:
    table = events_table()
    keys = [s.key for s in table_splits(table, 16, key="k", time="t")]
    assert keys == [s.key for s in table_splits(events_table(seed=9), 16)]  # no W anywhere
    for peers in range(1, 7):
        assigned = assign_splits(list(reversed(keys)), peers)
        flat = [k for mine in assigned for k in mine]
        assert sorted(flat) == sorted(keys) and len(set(flat)) == len(keys)
        sizes = [len(mine) for mine in assigned]
        assert max(sizes) - min(sizes) <= 1, sizes
        assert assigned == assign_splits(keys, peers)  # the key order does not matter
    # Equal keys go to the same split whatever the rest of the table.
    part_of = {}
    for split in table_splits(table, 16, key="k"):
        for k in set(split.data.column("k").to_pylist()):
            assert part_of.setdefault(k, split.key) == split.key
    for split in table_splits(table.slice(0, 500), 16, key="k"):
        for k in set(split.data.column("k").to_pylist()):
            assert part_of[k] == split.key
    with pytest.raises(ValueError, match="more than once"):
        assign_splits(["a", "b", "a"], 2)


@pytest.mark.parametrize(("w1", "w2"), [(2, 3), (3, 1)])
def test_table_pause_then_restart_at_another_worker_count(w1: int, w2: int) -> None:
    table = events_table()
    splits = table_splits(table, 16, key="k", time="t")
    epoch = 120

    def build(scope: Any, positions: Any, start: Any, pause_at: Any) -> Any:
        return replayable_source(scope, "Events", splits, "t", granularity=GRANULARITY,
                                 positions=positions, start=start, pause_at=pause_at,
                                 max_rows=50)

    positions, second = check_restart(build, oracle(table, GRANULARITY), w1, w2, epoch, splits)
    # Each position is the split's first row at a time >= epoch.
    for split in splits:
        times = split.data.column("t").to_numpy()
        assert positions[split.key] == int(np.searchsorted(times, epoch)), split.key
    for cap, _, _ in second:
        check_stream(cap, GRANULARITY)
        assert all(t >= epoch for t, _ in cap.events)


def test_pause_and_resume_within_one_run() -> None:
    table = events_table()
    splits = table_splits(table, 8, time="t")
    epoch = 70

    def job(worker: Worker) -> tuple[Capture, list[int], dict[int, dict[str, tuple[int, int]]]]:
        completed: list[int] = []

        def build(scope: Any) -> tuple[Capture, SourceHandle]:
            stream, handle = replayable_source(scope, "Events", splits, "t", granularity=GRANULARITY,
                                               max_rows=40,
                                               on_epoch=lambda t, ranges: completed.append(t))
            return capture(stream), handle

        cap, handle = worker.dataflow(build)
        handle.pause_at(epoch)
        worker.step_while(lambda: not handle.paused)
        assert handle.frontier == epoch
        assert all(t < epoch for t, _ in cap.events)
        before = len(cap.events)
        for _ in range(20):  # paused: nothing more comes out, the token stays
            worker.step_or_park(0.001)
        assert len(cap.events) == before and handle.frontier == epoch and handle.paused
        with pytest.raises(ValueError, match="already emitted"):
            handle.pause_at(epoch - 2 * GRANULARITY)
        handle.resume()
        worker.step_until_done()
        return cap, completed, handle.epochs

    results = execute(job, workers=2, runtime="thread")
    assert ids_by_time([c for c, _, _ in results]) == oracle(table, GRANULARITY)
    for cap, completed, epochs in results:
        check_stream(cap, GRANULARITY)
        assert completed == sorted(epochs)  # on_epoch: each time once, in order, when complete


def test_the_control_planes_hold_is_apart_from_the_jobs_pause() -> None:
    """A snapshot round's ``hold_at`` / ``release_hold`` neither moves nor lifts a pause the job
    set: the source stops at the earlier of the two, and after the hold is released it still
    stops at the job's pause (before, the hold overwrote it and the release cleared it)."""
    table = events_table()
    splits = table_splits(table, 8, time="t")
    own, early, late = 90, 50, 130

    def build(scope: Any) -> tuple[Capture, SourceHandle]:
        stream, handle = replayable_source(scope, "Events", splits, "t", granularity=GRANULARITY,
                                           max_rows=40, pause_at=own)
        return capture(stream), handle

    def job(worker: Worker) -> Capture:
        cap, handle = worker.dataflow(build)
        assert handle.job_pause == own
        handle.hold_at(late)  # later than the job's pause: the job's pause holds
        worker.step_while(lambda: not handle.paused)
        assert handle.frontier == own and max(t for t, _ in cap.events) < own
        handle.release_hold()  # a discarded attempt's resume: the job's pause stays
        for _ in range(20):
            worker.step_or_park(0.001)
        assert handle.paused and handle.frontier == own and handle.job_pause == own
        assert max(t for t, _ in cap.events) < own
        handle.resume()
        handle.hold_at(own + 2 * GRANULARITY)  # the job lifted its pause: the hold alone
        worker.step_while(lambda: not handle.paused)
        assert handle.frontier == own + 2 * GRANULARITY
        handle.release_hold()
        worker.step_until_done()
        return cap

    results = execute(job, workers=2, runtime="thread")
    assert ids_by_time(results) == oracle(table, GRANULARITY)

    def early_hold(worker: Worker) -> list[int]:
        cap, handle = worker.dataflow(build)
        handle.hold_at(early)  # earlier than the job's pause: the hold stops it first
        worker.step_while(lambda: not handle.paused)
        stops = [handle.frontier]
        handle.release_hold()  # on to the job's pause, and no further
        worker.step_while(lambda: not handle.paused)
        stops.append(handle.frontier)
        assert max(t for t, _ in cap.events) < own
        handle.resume()
        worker.step_until_done()
        return stops

    assert execute(early_hold, workers=2, runtime="thread") == [[early, own]] * 2


# -- Parquet ---------------------------------------------------------------------------------


def write_parquet_files(root: Path, table: pa.Table, files: int, row_group: int) -> None:
    """``files`` files (in two subdirectories), each sorted by ``t``, in row groups."""
    frame = table.to_pandas()
    for i in range(files):
        part = frame.iloc[i::files].sort_values("t", kind="stable")
        directory = root / f"day={i % 2}"
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False),
                       directory / f"part-{i}.parquet", row_group_size=row_group)
    (root / "_SUCCESS").write_text("")


def test_parquet_split_seek_reads_only_the_needed_row_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = events_table(1000)
    pq.write_table(table, tmp_path / "one.parquet", row_group_size=100)
    calls: list[int] = []
    original = pq.ParquetFile.read_row_group

    def spy(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        calls.append(i)
        return original(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    (split,) = parquet_splits(str(tmp_path / "one.parquet"))
    assert split.key == "one.parquet" and split.rows == 1000 and calls == []
    batch = split.read(537, 10)
    assert batch is not None and batch.column("id").to_pylist() == list(range(537, 547))
    assert calls == [5]
    rest = split.read(547, 1000)  # to the end of the row group only
    assert rest is not None and rest.column("id").to_pylist() == list(range(547, 600))
    assert calls == [5]  # the group is kept
    assert split.read(1000, 10) is None
    assert calls == [5]


def test_parquet_pause_then_restart_reads_only_later_row_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = events_table()
    write_parquet_files(tmp_path, table, files=6, row_group=60)
    splits: list[Split] = list(parquet_splits(str(tmp_path)))
    assert [s.key for s in splits] == sorted(s.key for s in splits)
    assert [s.key for s in splits][:2] == ["day=0/part-0.parquet", "day=0/part-2.parquet"]
    epoch = 90

    def build(scope: Any, positions: Any, start: Any, pause_at: Any) -> Any:
        return replayable_source(scope, "Files", parquet_splits(str(tmp_path)), "t",
                                 granularity=GRANULARITY, positions=positions, start=start,
                                 pause_at=pause_at, max_rows=32)

    calls: list[tuple[str, int]] = []
    original = pq.ParquetFile.read_row_group
    real_open = ParquetSplit._open

    def spy(self: pq.ParquetFile, i: int, *args: Any, **kwargs: Any) -> pa.Table:
        calls.append((self._test_key, i))  # type: ignore[attr-defined]
        return original(self, i, *args, **kwargs)

    def open_and_tag(self: ParquetSplit) -> Any:
        file, ends = real_open(self)
        file._test_key = self.key  # type: ignore[attr-defined]
        return file, ends

    monkeypatch.setattr(ParquetSplit, "_open", open_and_tag)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    positions, _ = check_restart(build, oracle(table, GRANULARITY), 2, 3, epoch, splits,
                                 between=calls.clear)
    # Run 2 read only row groups holding rows at or after the recorded positions.
    assert calls
    for key, group in calls:
        meta = pq.ParquetFile(tmp_path / key).metadata
        end = sum(meta.row_group(g).num_rows for g in range(group + 1))
        assert end > positions[key], (key, group, positions[key])
    assert any(positions[key] >= 60 for key in positions)  # some groups were skipped


# -- NEXMark ---------------------------------------------------------------------------------

EVENTS = 12_000
CONFIG = GeneratorConfig()
NEXMARK_GRANULARITY = 100  # ms
NexmarkResult = tuple[dict[str, Capture], dict[str, int]]


def nexmark_job(positions: dict[str, int] | None = None, start: int | None = None,
                pause_at: int | None = None, extra: bool = True) -> Callable[[Worker], NexmarkResult]:
    def job(worker: Worker) -> NexmarkResult:
        def build(scope: Any) -> tuple[dict[str, Capture], SourceHandle]:
            streams, handle = nexmark_streams(scope, EVENTS, CONFIG, splits=6, block=700,
                                              granularity=NEXMARK_GRANULARITY,
                                              positions=positions, start=start,
                                              pause_at=pause_at, max_rows=500, extra=extra)
            return {kind: capture(s) for kind, s in streams.items()}, handle

        caps, handle = worker.dataflow(build)
        if pause_at is not None:
            worker.step_while(lambda: not handle.paused)
            recorded = handle.positions()
            handle.close()
        worker.step_until_done()
        if pause_at is None:
            recorded = handle.positions()
        return caps, recorded

    return job


def nexmark_frames(results: list[NexmarkResult]) -> dict[str, pd.DataFrame]:
    """Per kind, every row received (sorted by all columns); checks each row's logical time."""
    out = {}
    for kind in KINDS:
        batches = []
        for caps, _ in results:
            cap = caps[kind]
            times = [t for t, _ in cap.events]
            assert times == sorted(times)
            for t, batch in cap.events:
                raw = batch.column("dateTime").to_numpy()
                assert (raw - raw % NEXMARK_GRANULARITY == t).all()
                batches.append(batch)
        out[kind] = sorted_frame(pa.Table.from_batches(batches).to_pandas())
    return out


def sorted_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("extra", [True, False])
def test_nexmark_streams_equal_the_generator_each_event_generated_once(
        monkeypatch: pytest.MonkeyPatch, extra: bool) -> None:
    """Also without the ``extra`` padding (a query that does not read it): the same events
    less that column."""
    generated: list[int] = []
    real_generate = sources_module.generate

    def counting(first: int, count: int, config: Any = None, **options: Any) -> Any:
        generated.append(count)
        return real_generate(first, count, config, **options)

    monkeypatch.setattr(sources_module, "generate", counting)
    results = execute(nexmark_job(extra=extra), workers=2, runtime="thread")
    assert sum(generated) == EVENTS
    expected = generate(0, EVENTS, CONFIG, extra=extra)
    assert all(("extra" in expected[kind].schema.names) == extra for kind in KINDS)
    got = nexmark_frames(results)
    for kind in KINDS:
        assert_frame_equal(got[kind], sorted_frame(expected[kind].to_pandas()))
    splits = nexmark_splits(EVENTS, CONFIG, splits=6, block=700)
    assert union([p for _, p in results]) == {s.key: s.rows for s in splits}
    assert sum(s.rows for s in splits) == EVENTS
    # read() gives the positions without generating: event numbers of split 1 from offset 690.
    skeleton = splits[1].read(690, 100)
    assert skeleton is not None
    assert skeleton.column("event").to_pylist() == [*range(1390, 1400)]


def test_nexmark_pause_then_restart_at_another_worker_count() -> None:
    epoch = CONFIG.base_time_ms + 600
    first = execute(nexmark_job(pause_at=epoch), workers=3, runtime="thread")
    positions = union([p for _, p in first])
    second = execute(nexmark_job(positions=positions, start=epoch), workers=2, runtime="thread")
    before, after = nexmark_frames(first), nexmark_frames(second)
    expected = generate(0, EVENTS, CONFIG)
    for kind in KINDS:
        whole = expected[kind].to_pandas()
        assert (before[kind]["dateTime"] < epoch).all() and (after[kind]["dateTime"] >= epoch).all()
        assert_frame_equal(before[kind], sorted_frame(whole[whole["dateTime"] < epoch]))
        assert_frame_equal(after[kind], sorted_frame(whole[whole["dateTime"] >= epoch]))


def assert_frame_equal(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


# -- directory -------------------------------------------------------------------------------


def drop_file(directory: Path, name: str, table: pa.Table, format: str) -> None:
    """Write ``table`` under a hidden name, then rename it to ``name`` (the writer protocol)."""
    hidden = directory / f".{name}.tmp"
    if format == "parquet":
        pq.write_table(table, hidden)
    else:
        pcsv.write_csv(table, hidden)
    os.replace(hidden, directory / name)


def end_input(directory: Path) -> None:
    (directory / ".END.tmp").write_text("")
    os.replace(directory / ".END.tmp", directory / "_END")


DirectoryResult = tuple[Capture, dict[str, int], dict[int, dict[str, tuple[int, int]]]]


def directory_job(path: Path, format: str, positions: dict[str, int] | None = None,
                  started: threading.Event | None = None) -> Callable[[Worker], DirectoryResult]:
    def job(worker: Worker) -> DirectoryResult:
        cap, handle = worker.dataflow(lambda scope: _capture_directory(scope, path, format, positions))
        if started is not None:
            started.set()
        worker.step_until_done()
        return cap, handle.positions(), handle.epochs

    return job


def _capture_directory(scope: Any, path: Path, format: str,
                       positions: dict[str, int] | None) -> tuple[Capture, SourceHandle]:
    stream, handle = directory_source(scope, "Drop", str(path), format=format, poll=0.05,
                                      positions=positions, max_rows=7)
    return capture(stream), handle


def test_directory_source_reads_files_dropped_while_running_once(tmp_path: Path) -> None:
    table = events_table(600)
    chunks = {f"part-{i}.parquet": table.slice(i * 100, 100) for i in range(6)}
    started = threading.Event()

    def writer() -> None:
        started.wait(10)
        for name, chunk in chunks.items():
            time.sleep(0.04)
            drop_file(tmp_path, name, chunk, "parquet")
        end_input(tmp_path)

    thread = threading.Thread(target=writer)
    thread.start()
    began = time.time()
    try:
        results = execute(directory_job(tmp_path, "parquet", started=started), workers=2,
                          runtime="thread")
    finally:
        thread.join()
    assert time.time() - began < 8
    ids = all_ids([c for c, _, _ in results])
    assert sorted(ids) == list(range(600)) and len(ids) == len(set(ids))
    # Each file taken by exactly one worker, read to its end, at one epoch.
    assert union([p for _, p, _ in results]) == dict.fromkeys(chunks, FILE_DONE)
    for cap, positions, epochs in results:
        assert cap.frontiers[-1] == []
        fronts = [f[0] for f in cap.frontiers if f]
        assert fronts == sorted(fronts)
        file_epoch = {name: t for t, ranges in epochs.items() for name in ranges}
        assert sorted(file_epoch) == sorted(positions)
        for t, ranges in epochs.items():
            for rng in ranges.values():
                assert rng == (0, 100) and t % 50 == 0 and t >= began * 1000 - 50
        # Files written later never get an earlier epoch.
        order = sorted(file_epoch, key=lambda n: int(n.split("-")[1].split(".")[0]))
        assert [file_epoch[n] for n in order] == sorted(file_epoch[n] for n in order)
        for t, batch in cap.events:
            first = batch.column("id").to_numpy() // 100
            assert all(file_epoch[f"part-{f}.parquet"] == t for f in set(first.tolist()))


def test_directory_restart_skips_done_files_at_another_worker_count(tmp_path: Path) -> None:
    table = events_table(400)
    for i in range(2):
        drop_file(tmp_path, f"a{i}.csv", table.slice(i * 100, 100), "csv")
    end_input(tmp_path)
    first = execute(directory_job(tmp_path, "csv"), workers=2, runtime="thread")
    positions = union([p for _, p, _ in first])
    assert positions == {"a0.csv": FILE_DONE, "a1.csv": FILE_DONE}
    assert sorted(all_ids([c for c, _, _ in first])) == list(range(200))

    os.remove(tmp_path / "_END")
    for i in range(2):
        drop_file(tmp_path, f"b{i}.csv", table.slice(200 + i * 100, 100), "csv")
    end_input(tmp_path)
    positions["a1.csv"] = 40  # as if a1 had been read up to row 40
    second = execute(directory_job(tmp_path, "csv", positions), workers=3, runtime="thread")
    ids = all_ids([c for c, _, _ in second])
    assert sorted(ids) == [*range(140, 200), *range(200, 400)]
    final = union([p for _, p, _ in second])
    assert final == {"a0.csv": FILE_DONE, "a1.csv": FILE_DONE, "b0.csv": FILE_DONE,
                     "b1.csv": FILE_DONE}


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("max_rows", [2, 100])
def test_unsorted_split_is_an_input_error_naming_split_row_and_value(max_rows: int) -> None:
    bad = TableSplit("bad/0", pa.table({"id": [0, 1, 2, 3, 4], "t": [0, 1, 5, 3, 6]}))
    good = TableSplit("good/0", pa.table({"id": [9], "t": [2]}))

    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(
            replayable_source(scope, "Events", [bad, good], "t", max_rows=max_rows)[0]))

    with pytest.raises(WorkerError) as excinfo:
        execute(job, workers=1, runtime="thread")
    assert isinstance(excinfo.value.__cause__, InputError), repr(excinfo.value.__cause__)
    message = str(excinfo.value.__cause__)
    for part in ("'Events'", "'bad/0'", "'t'", "row 3", "value 3", "after 5"):
        assert part in message, message


def test_positions_that_do_not_match_start_are_an_input_error() -> None:
    table = events_table(300)
    splits = table_splits(table, 4, time="t")

    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(
            replayable_source(scope, "Events", splits, "t", granularity=GRANULARITY,
                              positions={s.key: 0 for s in splits}, start=100)[0]))

    with pytest.raises(WorkerError) as excinfo:
        execute(job, workers=2, runtime="thread")
    message = str(excinfo.value.__cause__)
    assert isinstance(excinfo.value.__cause__, InputError)
    assert "start epoch 100" in message and "row 0" in message and "does not match" in message
    with pytest.raises(WorkerError, match="pause_at=105 is not a multiple"):
        execute(lambda w: w.dataflow(lambda scope: replayable_source(
            scope, "Events", splits, "t", granularity=GRANULARITY, pause_at=105)), workers=1)


def _input_error(job: Callable[[Worker], Any], workers: int = 1) -> str:
    """The message of the ``InputError`` that fails ``job`` (the cause of its ``WorkerError``)."""
    with pytest.raises(WorkerError) as excinfo:
        execute(job, workers=workers, runtime="thread")
    cause = excinfo.value.__cause__
    assert isinstance(cause, InputError), repr(cause)
    return str(cause)


def _parquet_job(path: Path, max_rows: int) -> Callable[[Worker], None]:
    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(replayable_source(
            scope, "Files", parquet_splits(str(path)), "t", granularity=GRANULARITY,
            max_rows=max_rows)[0]))
        worker.step_until_done()

    return job


@pytest.mark.parametrize("max_rows", [7, 1000])
def test_null_time_in_a_parquet_split_names_source_file_column_and_row(
        tmp_path: Path, max_rows: int) -> None:
    table = events_table(300).sort_by("t")
    times = table.column("t").to_pylist()
    times[123] = None
    table = table.set_column(table.schema.get_field_index("t"), "t", pa.array(times, pa.int64()))
    (tmp_path / "day=1").mkdir()
    pq.write_table(table, tmp_path / "day=1" / "b.parquet", row_group_size=50)
    pq.write_table(events_table(10).sort_by("t"), tmp_path / "a.parquet")
    message = _input_error(_parquet_job(tmp_path, max_rows))
    assert message.startswith("source 'Files', split 'day=1/b.parquet'"), message
    assert str(tmp_path / "day=1" / "b.parquet") in message, message
    assert "column 't', row 123: null event time" in message, message


def test_truncated_parquet_split_is_an_input_error(tmp_path: Path) -> None:
    pq.write_table(events_table(500).sort_by("t"), tmp_path / "a.parquet", row_group_size=100)
    data = (tmp_path / "a.parquet").read_bytes()
    splits = parquet_splits(str(tmp_path))
    (tmp_path / "a.parquet").write_bytes(data[: len(data) // 2])  # e.g. a full disk

    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(replayable_source(scope, "Files", splits, "t")[0]))
        worker.step_until_done()

    message = _input_error(job)
    assert message.startswith("source 'Files', split 'a.parquet', column 't', row 0: cannot read "
                              "the split"), message


def test_split_read_error_names_the_row_the_read_started_at() -> None:
    class Broken(Split):
        key = "broken/0"

        def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
            if offset >= 20:
                raise pa.ArrowInvalid("bad bytes")
            return pa.record_batch({"t": pa.array(range(offset, offset + 10), pa.int64())})

    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(
            replayable_source(scope, "Src", [Broken()], "t", max_rows=10)[0]))
        worker.step_until_done()

    assert _input_error(job) == ("source 'Src', split 'broken/0', column 't', row 20: cannot read "
                                 "the split: ArrowInvalid: bad bytes")


def _timed_directory_job(path: Path, format: str,
                         schema: pa.Schema | None = None) -> Callable[[Worker], None]:
    def job(worker: Worker) -> None:
        worker.dataflow(lambda scope: capture(directory_source(
            scope, "Drop", str(path), format=format, time="t", poll=0.02, max_rows=5,
            schema=schema)[0]))
        worker.step_until_done()

    return job


def test_csv_value_not_fitting_the_schema_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id,t\n0,1\n1,2\nseven,3\n")
    end_input(tmp_path)
    schema = pa.schema([("id", pa.int64()), ("t", pa.int64())])
    message = _input_error(_timed_directory_job(tmp_path, "csv", schema))
    assert message.startswith("source 'Drop', split 'a.csv', column 't', row 0: cannot read the "
                              "split: ArrowInvalid"), message
    assert "seven" in message, message


def test_null_time_in_a_directory_file_names_file_column_and_row(tmp_path: Path) -> None:
    drop_file(tmp_path, "a.parquet",
              pa.table({"id": [0, 1, 2, 3, 4, 5, 6], "t": pa.array([0, 1, 2, 3, 4, 5, None])}),
              "parquet")
    end_input(tmp_path)
    message = _input_error(_timed_directory_job(tmp_path, "parquet"))
    assert message == "source 'Drop', split 'a.parquet', column 't', row 6: null event time " \
                      "(value None)", message
