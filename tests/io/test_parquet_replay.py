"""Replay mode of the committing Parquet sink (``to_parquet``): the idempotent-output rule of the
distributed-DBSP design ("Output": a step produced before is discarded, optionally checked).

* A run that crashed after committing epochs < K, replayed from scratch with ``worker.replay``:
  the committed epochs keep their directory (same inode) and commit id, the rest is appended,
  and the dataset equals a failure-free run and the input, at 2 -> 2, 2 -> 1 and 1 -> 2 workers
  (the last two with ``verify=True``: the same rows written by other workers verify as equal).
* A run snapshotted at epoch e that crashed after committing epochs past e, restored from the
  snapshot at another worker count: every epoch the crashed run committed is kept as it was.
* ``verify=True`` with different replayed rows (a value changed, a row dropped, an epoch with no
  rows at all) fails naming the operator, the epoch, the directory and both row counts, and
  leaves the committed epoch as it was; without ``verify`` the committed epoch is kept.
* An epoch committed without a row hash (an older version) is verified by reading its files.
* Output committed before the snapshot and then deleted: the restored replay fails naming the
  missing range and the path; a manifest frontier below the snapshot's epoch alone is no gap.
* Without replay a re-run still replaces the committed epochs (as before).

Expected rows come from the input table (pyarrow), apart from the job.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tokenflow import WorkerError, execute
from tokenflow.io import ParquetSinkError, committed_epochs, read_committed, to_parquet
from tokenflow.io.parquet import MANIFEST, STAGING
from tokenflow.io.sources import replayable_source, table_splits
from tokenflow.job import start
from tokenflow.worker import Worker

EPOCHS = 10
K = 4
"""The scratch-replay tests crash once every epoch < K is committed."""
COLUMNS = ("t", "k", "s", "z")
Row = tuple[Any, ...]


def input_table(seed: int = 3, rows: int = 400, epochs: int = EPOCHS) -> pa.Table:
    """Rows at every epoch; ``s`` has nulls, ``z`` is almost always null (a worker whose share
    of an epoch has no ``z`` stages that column typed null)."""
    rng = np.random.default_rng(seed)
    t = np.sort(np.concatenate([np.arange(epochs), rng.integers(0, epochs, rows - epochs)]))
    k = rng.integers(0, 60, rows)
    return pa.table({
        "t": t,
        "k": k,
        "s": pa.array([None if v % 7 == 0 else f"s{v}" for v in k.tolist()], pa.string()),
        "z": pa.array([v if v == 1 else None for v in k.tolist()], pa.int64()),
    })


def expected(table: pa.Table) -> dict[int, Counter[Row]]:
    """Per epoch, the input rows as a multiset."""
    out: dict[int, Counter[Row]] = {}
    for r in table.to_pylist():
        out.setdefault(r["t"], Counter())[tuple(r[c] for c in COLUMNS)] += 1
    return out


def by_epoch(data: pa.Table) -> dict[int, Counter[Row]]:
    out: dict[int, Counter[Row]] = {}
    for r in data.to_pylist():
        out.setdefault(r["time"], Counter())[tuple(r[c] for c in COLUMNS)] += 1
    return out


SCHEMA = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("s", pa.string()), ("z", pa.int64()),
                    ("time", pa.int32())])


def visible(root: Path) -> dict[int, Counter[Row]]:
    """What a plain pyarrow reader sees (given the schema: a worker whose rows of ``z`` are all
    null stages that column typed null, which pyarrow does not cast from the first file's)."""
    return by_epoch(ds.dataset(str(root), schema=SCHEMA, format="parquet", partitioning="hive").to_table())


def manifest(root: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((root / MANIFEST).read_text())
    return document


def epoch_state(root: Path) -> dict[int, tuple[int, str]]:
    """Per committed epoch: the inode of its directory and the commit id of its _manifest.json."""
    out = {}
    for epoch in committed_epochs(root):
        directory = root / f"time={epoch}"
        own = json.loads((directory / "_manifest.json").read_text())
        out[epoch] = (directory.stat().st_ino, own["commit"])
    return out


def assert_dataset(root: Path, want: dict[int, Counter[Row]]) -> None:
    assert by_epoch(read_committed(root)) == want
    assert visible(root) == want
    assert not (root / STAGING).exists()
    assert sorted(p.name for p in root.iterdir() if p.name[:1] in "._") == [MANIFEST]


# -- jobs ----------------------------------------------------------------------------------------


def feed_job(root: Path, table: pa.Table, crash_at: int | None = None, replay: bool = False,
             verify: bool = False) -> Callable[[Worker], None]:
    """Worker code feeds an InputHandle: at each epoch, worker w sends rows w, w + W, ... of that
    epoch (so an epoch's rows do not depend on W) in one Arrow batch.  With ``crash_at`` the
    workers wait until every epoch < crash_at is committed, then fail (a simulated crash)."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for r in table.to_pylist():
        rows.setdefault(r["t"], []).append(r)
    last = max(rows, default=-1) + 1

    def job(worker: Worker) -> None:
        if replay:
            worker.replay = True

        def build(scope: Any) -> Any:
            handle, stream = scope.new_input()
            return handle, to_parquet(stream, str(root), verify=verify).probe()

        handle, probe = worker.dataflow(build)
        for t in range(last):
            mine = rows.get(t, [])[worker.index::worker.peers]
            if mine:
                handle.send_batch(pa.RecordBatch.from_pylist(mine))
            handle.advance_to(t + 1)
            if crash_at is not None and t + 1 == crash_at:
                worker.step_while(lambda: probe.less_than(crash_at))
                raise RuntimeError("simulated crash")
        handle.close()

    return job


def source_job(root: Path, table: pa.Table, pause_at: int | None = None, crash_at: int | None = None,
               replay: bool = False, verify: bool = False,
               gate: threading.Event | None = None) -> Callable[[Worker], None]:
    """A replayable table source (restored from a snapshot at its recorded positions) into the
    sink; with ``crash_at`` the committer's worker fails once it has committed an epoch >= it.
    With ``gate`` the job lifts its own pause once the gate is set (a snapshot's resume leaves
    a pause the job set in place)."""

    def job(worker: Worker) -> None:
        if replay:
            worker.replay = True
        handles = []

        def build(scope: Any) -> None:
            stream, source = replayable_source(scope, "rows", table_splits(table, 4, time="t"),
                                               time="t", pause_at=pause_at, max_rows=40)
            handles.append(source)
            commits = to_parquet(stream, str(root), verify=verify)
            if crash_at is not None:
                def crash(_: Any, batch: list[tuple[int, int]]) -> None:
                    if any(epoch >= crash_at for epoch, _ in batch):
                        raise RuntimeError("simulated crash")

                commits.inspect_batch(crash)

        worker.dataflow(build)
        if gate is not None:
            while not gate.is_set():
                worker.step_or_park()
            handles[0].resume()

    return job


def crash_before_k(root: Path, table: pa.Table, workers: int) -> dict[int, tuple[int, str]]:
    """Run until every epoch < K is committed, then crash; returns their ``epoch_state``."""
    with pytest.raises(WorkerError, match="simulated crash"):
        execute(feed_job(root, table, crash_at=K), workers=workers)
    state = epoch_state(root)
    assert sorted(state) == list(range(K))
    assert manifest(root)["frontier"] == K
    return state


# -- replay from scratch ------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "verify"), [(2, 2, False), (2, 1, True), (1, 2, True)])
def test_replay_keeps_committed_epochs_and_appends_the_rest(tmp_path: Path, before: int, after: int,
                                                            verify: bool) -> None:
    table = input_table(seed=before * 10 + after)
    want = expected(table)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    execute(feed_job(whole, table), workers=after)
    assert by_epoch(read_committed(whole)) == want

    old = crash_before_k(cut, table, before)
    old_run = manifest(cut)["run"]
    execute(feed_job(cut, table, replay=True, verify=verify), workers=after)

    new = epoch_state(cut)
    assert sorted(new) == list(range(EPOCHS))
    assert {t: new[t] for t in old} == old  # same directory, same commit: never re-committed
    assert len({new[t][1] for t in range(EPOCHS)}) == EPOCHS
    document = manifest(cut)
    assert document["frontier"] is None and document["run"] != old_run
    assert {t: e["run"] for t, e in ((int(k), e) for k, e in document["epochs"].items())} == \
        {t: old_run if t < K else document["run"] for t in range(EPOCHS)}
    assert_dataset(cut, want)
    assert by_epoch(read_committed(cut)) == by_epoch(read_committed(whole))


def test_without_replay_a_rerun_still_replaces_the_committed_epochs(tmp_path: Path) -> None:
    table = input_table()
    old = crash_before_k(tmp_path, table, 2)
    execute(feed_job(tmp_path, table), workers=2)
    new = epoch_state(tmp_path)
    assert all(new[t][1] != old[t][1] for t in old)  # each epoch committed again
    assert_dataset(tmp_path, expected(table))


# -- verify ---------------------------------------------------------------------------------------


def altered(table: pa.Table, how: str, epoch: int = 2) -> tuple[pa.Table, int, int]:
    """``table`` with the rows of ``epoch`` changed; returns it and the epoch's rows before/after."""
    rows = table.to_pylist()
    mine = [i for i, r in enumerate(rows) if r["t"] == epoch]
    if how == "changed":  # same count, one value differs
        rows[mine[0]]["k"] += 1000
    elif how == "dropped":
        del rows[mine[-1]]
    elif how == "missing":  # the replay sends nothing at all at this epoch
        rows = [r for r in rows if r["t"] != epoch]
    else:
        raise ValueError(how)
    new = pa.Table.from_pylist(rows, schema=table.schema)
    return new, len(mine), sum(1 for r in rows if r["t"] == epoch)


@pytest.mark.parametrize("how", ["changed", "dropped", "missing"])
def test_verify_rejects_a_different_replay_naming_the_epoch(tmp_path: Path, how: str) -> None:
    table = input_table()
    old = crash_before_k(tmp_path, table, 2)
    other, rows_before, rows_after = altered(table, how)

    with pytest.raises(WorkerError) as excinfo:
        execute(feed_job(tmp_path, other, replay=True, verify=True), workers=2)
    cause = excinfo.value.__cause__
    assert isinstance(cause, ParquetSinkError), repr(cause)
    message = str(cause)
    assert "'ToParquet.Commit'" in message and "epoch 2 " in message, message
    assert str(tmp_path / "time=2") in message, message
    assert f"{rows_before} rows committed" in message and f"{rows_after} rows replayed" in message, message
    assert epoch_state(tmp_path) == old  # nothing re-committed, epoch 2 as it was
    assert by_epoch(read_committed(tmp_path)) == {t: c for t, c in expected(table).items() if t < K}

    # Without verify the committed epoch wins: the dataset holds the first run's epoch 2.
    execute(feed_job(tmp_path, other, replay=True), workers=2)
    want = expected(other)
    want[2] = expected(table)[2]
    assert {t: epoch_state(tmp_path)[t] for t in old} == old
    assert_dataset(tmp_path, want)


@pytest.mark.parametrize("same", [True, False])
def test_verify_reads_the_files_of_an_epoch_committed_without_a_hash(tmp_path: Path, same: bool) -> None:
    table = input_table()
    old = crash_before_k(tmp_path, table, 2)
    for t in old:  # as an older version wrote them: no row hash
        path = tmp_path / f"time={t}" / "_manifest.json"
        own = json.loads(path.read_text())
        assert len(own.pop("hash")) == 16 and own.pop("hash_format") == 1
        assert all(len(f.pop("hash")) == 16 for f in own["files"])
        path.write_text(json.dumps(own))
    replayed = table if same else altered(table, "changed")[0]
    if same:
        execute(feed_job(tmp_path, replayed, replay=True, verify=True), workers=1)
        assert {t: epoch_state(tmp_path)[t] for t in old} == old
        assert_dataset(tmp_path, expected(table))
    else:
        with pytest.raises(WorkerError) as excinfo:
            execute(feed_job(tmp_path, replayed, replay=True, verify=True), workers=1)
        assert isinstance(excinfo.value.__cause__, ParquetSinkError)
        assert "epoch 2 " in str(excinfo.value.__cause__)


# -- replay from a snapshot -------------------------------------------------------------------------

NAME = "tests.parquet-replay"
PAUSE = 5
CRASH = 7


def crash_after_snapshot(cut: Path, snap: Path, table: pa.Table, workers: int) -> tuple[int, dict[int, Any]]:
    """Snapshot the job at PAUSE, let it go on (the job lifts its pause), crash it once an
    epoch >= CRASH is committed; returns the snapshot's epoch and the ``epoch_state`` the
    crashed run left."""
    gate = threading.Event()
    handle = start(source_job(cut, table, pause_at=PAUSE, crash_at=CRASH, gate=gate),
                   workers=workers, name=NAME)
    try:
        epoch = handle.snapshot(str(snap), stop=False)
    finally:
        gate.set()
    with pytest.raises(WorkerError, match="simulated crash"):
        handle.result(timeout=60)
    assert 0 < epoch <= PAUSE
    state = epoch_state(cut)
    assert set(range(CRASH + 1)) <= set(state)  # committed past the snapshot's epoch
    return epoch, state


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_replay_from_a_snapshot_keeps_what_the_crashed_run_committed(tmp_path: Path, before: int,
                                                                      after: int) -> None:
    table = input_table(seed=before + 2 * after)
    cut, snap = tmp_path / "cut", tmp_path / "snap"
    _, old = crash_after_snapshot(cut, snap, table, before)
    execute(source_job(cut, table, replay=True, verify=True), workers=after, restore=str(snap), name=NAME)
    new = epoch_state(cut)
    assert {t: new[t] for t in old} == old
    assert sorted(new) == list(range(EPOCHS)) and manifest(cut)["frontier"] is None
    assert_dataset(cut, expected(table))


def test_restore_without_the_replay_flag_is_a_replay_too(tmp_path: Path) -> None:
    table = input_table(seed=9)
    cut, snap = tmp_path / "cut", tmp_path / "snap"
    _, old = crash_after_snapshot(cut, snap, table, 2)
    execute(source_job(cut, table), workers=2, restore=str(snap), name=NAME)
    assert {t: epoch_state(cut)[t] for t in old} == old
    assert_dataset(cut, expected(table))


def test_output_deleted_before_the_snapshot_is_a_gap_naming_range_and_path(tmp_path: Path) -> None:
    table = input_table(seed=5)
    cut, snap = tmp_path / "cut", tmp_path / "snap"
    epoch, old = crash_after_snapshot(cut, snap, table, 2)
    assert epoch >= 3
    shutil.rmtree(cut / "time=1")
    shutil.rmtree(cut / "time=2")
    with pytest.raises(WorkerError) as excinfo:
        execute(source_job(cut, table, replay=True), workers=2, restore=str(snap), name=NAME)
    cause = excinfo.value.__cause__
    assert isinstance(cause, ParquetSinkError), repr(cause)
    message = str(cause)
    assert f"epochs [1, {epoch})" in message and str(cut) in message, message
    assert "time=1, time=2" in message and "'ToParquet.Commit'" in message, message
    assert epoch_state(cut) == {t: s for t, s in old.items() if t not in (1, 2)}  # left as it was


def test_a_manifest_frontier_below_the_snapshot_epoch_alone_is_no_gap(tmp_path: Path) -> None:
    # Rows at epochs 0, 1 and 8, 9 only: the manifest's frontier is written with commits, so
    # while the job is paused at the snapshot it lags behind the snapshot's epoch.
    table = pa.table({"t": [0, 0, 1, 1, 8, 8, 9], "k": [1, 2, 3, 4, 5, 6, 7],
                      "s": ["a", None, "c", "d", "e", "f", "g"], "z": pa.array([None] * 7, pa.int64())})
    cut, snap = tmp_path / "cut", tmp_path / "snap"
    handle = start(source_job(cut, table, pause_at=PAUSE), workers=2, name=NAME)
    handle.snapshot(str(snap))
    handle.result(timeout=60)
    execute(source_job(cut, table, replay=True, verify=True), workers=2, restore=str(snap), name=NAME)
    assert committed_epochs(cut) == [0, 1, 8, 9]
    assert_dataset(cut, expected(table))
