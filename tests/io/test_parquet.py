"""The committing Parquet sink ``tokenflow.io.to_parquet`` and ``read_committed``.

* Rows written equal rows sent, epoch by epoch, at 1, 2 and 3 workers (Arrow batches), for
  dicts and tuples, and with ``granularity`` bins; epoch directories hold ``part-NNNNN.parquet``
  (numbered from 0, whatever W), ``_SUCCESS`` and ``_manifest.json``; the dataset manifest lists
  exactly the epochs with rows, with ``frontier`` null at the end; nothing hidden is left.
* A re-run at 2 then at 1 worker reads as exactly the second run (300 rows, not 396), with an
  epoch only the first run wrote removed, and stray files of an older layout gone.
* A failure inside the write of epoch k (thread), a SIGKILL after epoch k and a SIGKILL inside
  the write of epoch k (process) leave a dataset that ``pyarrow.dataset`` and ``read_committed``
  both read as exactly the epochs < k; a later run repairs it.
* A full disk and a read-only directory fail the job naming the operator, the epoch and the
  path, with no tmp file left; ``read_committed`` without a manifest names the path.

Expected rows come from ``sent_rows``, computed apart from the job.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tokenflow import WorkerError, execute
from tokenflow.io import ManifestError, ParquetSinkError, committed_epochs, read_committed, to_parquet
from tokenflow.io.parquet import MANIFEST, STAGING
from tokenflow.worker import Worker

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 60.0
EPOCHS = 8
EMPTY_EPOCH = 5
"""No worker sends rows at this epoch: it gets no directory."""

Row = tuple[Any, ...]


# -- the rows a job sends, computed apart from the job ---------------------------------------


def count(run: str, worker: int, t: int) -> int:
    """Rows worker ``worker`` sends at epoch ``t`` in run ``run`` (0 for some pairs)."""
    if run == "a":
        return 0 if t == EMPTY_EPOCH or (t + worker) % 3 == 0 else 4 + 3 * worker + t
    if run == "first":
        return 33  # 2 workers x 6 epochs x 33 = 396
    if run == "second":
        return 60  # 1 worker x 5 epochs x 60 = 300
    if run == "none":
        return 0
    raise ValueError(run)


def batch_rows(run: str, worker: int, t: int) -> list[dict[str, Any]]:
    return [{"run": run, "w": worker, "t": t, "i": i, "x": i * 0.5 + t}
            for i in range(count(run, worker, t))]


def sent_rows(run: str, workers: int, epochs: range, granularity: int | None = None
              ) -> dict[int, Counter[Row]]:
    """Per epoch (or bin), the rows sent as ``(run, w, t, i, x)``."""
    out: dict[int, Counter[Row]] = {}
    for t in epochs:
        b = t if granularity is None else t - t % granularity
        for w in range(workers):
            rows = batch_rows(run, w, t)
            if rows:
                out.setdefault(b, Counter()).update(tuple(r.values()) for r in rows)
    return out


def by_partition(table: pa.Table, partition: str = "time") -> dict[int, Counter[Row]]:
    out: dict[int, Counter[Row]] = {}
    for r in table.to_pylist():
        out.setdefault(r[partition], Counter())[(r["run"], r["w"], r["t"], r["i"], r["x"])] += 1
    return out


def visible(root: Path) -> pa.Table:
    """What a plain pyarrow reader sees (hive partitioning, hidden names skipped)."""
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table()


def hidden(path: Path, root: Path) -> bool:
    return any(part[:1] in "._" for part in path.relative_to(root).parts)


def epoch_listing(root: Path) -> dict[str, list[str]]:
    return {d.name: sorted(f.name for f in d.iterdir())
            for d in sorted(root.iterdir()) if d.is_dir() and d.name[:1] not in "._"}


def manifest(root: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((root / MANIFEST).read_text())
    return document


# -- jobs ----------------------------------------------------------------------------------------


def make_job(root: Path, run: str, epochs: range, kind: str = "arrow", granularity: int | None = None,
             partition: str = "time", wait_at: int | None = None,
             after_wait: Callable[[Worker], None] | None = None) -> Callable[[Worker], None]:
    """Each worker sends ``batch_rows(run, w, t)`` at each epoch ``t`` (in two batches), as Arrow
    batches, dicts or tuples.  With ``wait_at=k`` every worker waits after advancing to ``k``
    until the sink has committed every epoch < k, then calls ``after_wait(worker)``."""
    path = str(root)

    def job(worker: Worker) -> None:
        def build(scope: Any) -> Any:
            handle, stream = scope.new_input()
            columns = ["run", "w", "t", "i", "x"] if kind == "tuples" else None
            commits = to_parquet(stream, path, columns=columns, granularity=granularity,
                                 partition=partition)
            return handle, commits.probe()

        handle, probe = worker.dataflow(build)
        for t in epochs:
            rows = batch_rows(run, worker.index, t)
            for part in (rows[: len(rows) // 2], rows[len(rows) // 2:]):
                if not part:
                    continue
                if kind == "arrow":
                    handle.send_batch(pa.RecordBatch.from_pylist(part))
                elif kind == "dicts":
                    handle.send_batch(part)
                else:
                    handle.send_batch([tuple(r.values()) for r in part])
            handle.advance_to(t + 1)
            if wait_at is not None and t + 1 == wait_at:
                worker.step_while(lambda: probe.less_than(wait_at))
                if after_wait is not None:
                    after_wait(worker)
        handle.close()

    return job


def assert_committed(root: Path, expected: dict[int, Counter[Row]], partition: str = "time") -> None:
    """``read_committed`` and a plain pyarrow reader both see exactly ``expected``."""
    assert committed_epochs(root) == sorted(expected)
    assert by_partition(read_committed(root), partition) == expected
    assert by_partition(visible(root), partition) == expected


# -- rows and layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_rows_written_equal_rows_sent_per_epoch(workers: int, tmp_path: Path) -> None:
    root = tmp_path / "out"
    execute(make_job(root, "a", range(EPOCHS)), workers=workers)
    expected = sent_rows("a", workers, range(EPOCHS))
    assert EMPTY_EPOCH not in expected and len(expected) >= 4
    assert_committed(root, expected)

    table = read_committed(root)
    assert table.schema.field("time").type == pa.int32()  # as Spark's partition discovery
    assert table.column("time").to_pylist() == table.column("t").to_pylist()
    assert read_committed(root, columns=["i", "time"]).column_names == ["i", "time"]

    # One part file per worker with rows, numbered from 0, plus the markers.
    listing = epoch_listing(root)
    assert set(listing) == {f"time={t}" for t in expected}
    for t in expected:
        writers = sum(1 for w in range(workers) if count("a", w, t))
        parts = [f"part-{i:05d}.parquet" for i in range(writers)]
        assert listing[f"time={t}"] == sorted(["_SUCCESS", "_manifest.json", *parts]), t
    document = manifest(root)
    assert document["frontier"] is None and document["partition"] == "time"
    assert {int(k): e["rows"] for k, e in document["epochs"].items()} == \
        {t: sum(c.values()) for t, c in expected.items()}
    # Nothing hidden is left: no staging directory, no tmp, trash or commit directory.
    assert sorted(p.name for p in root.iterdir() if p.name[:1] in "._") == [MANIFEST]


@pytest.mark.parametrize("kind", ["dicts", "tuples"])
def test_record_kinds_and_granularity_bins(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "binned"
    execute(make_job(root, "a", range(10), kind=kind, granularity=4, partition="epoch"), workers=2)
    expected = sent_rows("a", 2, range(10), granularity=4)
    assert sorted(expected) == [0, 4, 8]
    assert_committed(root, expected, partition="epoch")
    assert manifest(root)["granularity"] == 4
    table = read_committed(root)
    assert all(b <= t < b + 4 for b, t in zip(table.column("epoch").to_pylist(),
                                               table.column("t").to_pylist(), strict=True))


# -- re-runs ------------------------------------------------------------------------------------


def test_rerun_at_fewer_workers_reads_as_exactly_the_second_run(tmp_path: Path) -> None:
    root = tmp_path / "out"
    # An older layout's leftovers: a file in an epoch both runs write, and an epoch of its own.
    old = pa.table({"run": ["old"], "w": [7], "t": [0], "i": [0], "x": [0.0]})
    (root / "time=0").mkdir(parents=True)
    pq.write_table(old, root / "time=0" / "worker-00007.parquet")
    (root / "time=99").mkdir()
    pq.write_table(old, root / "time=99" / "worker-00000.parquet")

    execute(make_job(root, "first", range(6)), workers=2)
    first = sent_rows("first", 2, range(6))
    assert sum(sum(c.values()) for c in first.values()) == 396
    assert_committed(root, first)
    assert all(files == ["_SUCCESS", "_manifest.json", "part-00000.parquet", "part-00001.parquet"]
               for files in epoch_listing(root).values())
    first_run = manifest(root)["run"]

    execute(make_job(root, "second", range(5)), workers=1)
    second = sent_rows("second", 1, range(5))
    assert sum(sum(c.values()) for c in second.values()) == 300
    assert_committed(root, second)  # time=5 of the first run is gone, nothing read twice
    assert visible(root).num_rows == 300
    assert epoch_listing(root) == {f"time={t}": ["_SUCCESS", "_manifest.json", "part-00000.parquet"]
                                   for t in range(5)}
    document = manifest(root)
    assert document["run"] != first_run and document["frontier"] is None
    assert {e["run"] for e in document["epochs"].values()} == {document["run"]}


# -- failures -----------------------------------------------------------------------------------

K = 4
"""The epoch at which the failure tests fail; epochs < K are committed before it."""


def partial_then(error: BaseException) -> Callable[..., None]:
    """A ``pq.write_table`` that writes half of a real file to the target, then raises."""
    real = pq.write_table

    def write_table(table: pa.Table, where: Any, *args: Any, **kwargs: Any) -> None:
        sink = pa.BufferOutputStream()
        real(table, sink, *args, **kwargs)
        data = sink.getvalue().to_pybytes()
        Path(where).write_bytes(data[: len(data) // 2])
        raise error

    return write_table


def test_failure_inside_a_write_leaves_exactly_the_committed_epochs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "out"
    real = pq.write_table
    failing = partial_then(RuntimeError("simulated crash while writing"))

    def write_table(table: pa.Table, where: Any, *args: Any, **kwargs: Any) -> None:
        # Worker 1's file of epoch K (staged names are <run>-<worker>-<seq>.parquet).
        if f"time={K}" in str(where) and re.search(r"-00001-\d+\.parquet", str(where)):
            failing(table, where, *args, **kwargs)
        real(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_table)
    with pytest.raises(WorkerError) as excinfo:
        execute(make_job(root, "first", range(EPOCHS), wait_at=K), workers=2)
    message = str(excinfo.value)
    assert "'ToParquet'" in message and f"epoch {K}" in message and f"time={K}" in message, message
    assert isinstance(excinfo.value.__cause__, ParquetSinkError), repr(excinfo.value.__cause__)

    expected = {t: c for t, c in sent_rows("first", 2, range(EPOCHS)).items() if t < K}
    assert_committed(root, expected)  # epochs < K whole, nothing of epoch K visible
    assert manifest(root)["frontier"] == K
    assert all(hidden(p, root) for p in root.rglob("*") if f"time={K}" in str(p) or ".tmp" in p.name)

    monkeypatch.setattr(pq, "write_table", real)
    execute(make_job(root, "first", range(EPOCHS)), workers=2)  # a later run repairs it
    assert_committed(root, sent_rows("first", 2, range(EPOCHS)))
    assert not (root / STAGING).exists()


def test_disk_full_fails_naming_operator_epoch_and_path_and_removes_the_tmp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "out"
    monkeypatch.setattr(pq, "write_table",
                        partial_then(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(WorkerError) as excinfo:
        execute(make_job(root, "first", range(3)), workers=2)
    cause = excinfo.value.__cause__
    assert isinstance(cause, ParquetSinkError), repr(cause)
    message = str(cause)
    assert "'ToParquet'" in message and "epoch 0" in message, message
    assert str(root / STAGING / "time=0") in message and "No space left" in message, message
    assert [p for p in root.rglob("*") if p.is_file()] == []  # the half-written tmp is gone


def test_read_only_directory_fails_naming_operator_epoch_and_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o555)
    try:
        if os.access(root, os.W_OK):  # root ignores permission bits: refuse as the kernel would
            real_mkdir = os.mkdir

            def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
                if str(path).startswith(str(root)):
                    raise PermissionError(errno.EACCES, "Permission denied", str(path))
                real_mkdir(path, *args, **kwargs)

            monkeypatch.setattr(os, "mkdir", mkdir)
        with pytest.raises(WorkerError) as excinfo:
            execute(make_job(root, "first", range(3)), workers=2)
        monkeypatch.undo()
    finally:
        root.chmod(0o755)
    message = str(excinfo.value)
    assert "'ToParquet'" in message and "epoch 0" in message, message
    assert str(root / STAGING / "time=0") in message and "Permission denied" in message, message
    assert list(root.iterdir()) == []
    with pytest.raises(ManifestError, match=re.escape(str(root))):
        read_committed(root)


def test_read_committed_ignores_stray_files_and_needs_a_manifest(tmp_path: Path) -> None:
    root = tmp_path / "out"
    with pytest.raises(ManifestError, match=re.escape(str(root))):
        read_committed(root)
    with pytest.raises(ManifestError, match="no _tokenflow_manifest.json"):
        committed_epochs(root)
    execute(make_job(root, "a", range(EPOCHS)), workers=2)
    expected = sent_rows("a", 2, range(EPOCHS))
    stray = pa.table({"run": ["stray"], "w": [9], "t": [0], "i": [0], "x": [0.0]})
    pq.write_table(stray, root / "time=0" / "part-00009.parquet")  # not in its _manifest.json
    (root / "time=77").mkdir()
    pq.write_table(stray, root / "time=77" / "part-00000.parquet")  # not a committed epoch
    assert committed_epochs(root) == sorted(expected)
    assert by_partition(read_committed(root)) == expected


# -- process runtime: SIGKILL ---------------------------------------------------------------------


def sigkill_job(root: Path, mid_write: bool) -> Callable[[Worker], None]:
    """Epochs 0..EPOCHS-1 on 2 workers; worker 1 dies at epoch K: killed by SIGKILL from the
    job once epochs < K are committed, or (``mid_write``) inside ``pq.write_table`` of its
    staged file of epoch K, leaving half a tmp file."""
    path = str(root)

    def job(worker: Worker) -> None:
        if mid_write and worker.index == 1:
            real = pq.write_table

            def write_table(table: pa.Table, where: Any, *args: Any, **kwargs: Any) -> None:
                if f"time={K}" in str(where):
                    sink = pa.BufferOutputStream()
                    real(table, sink)
                    data = sink.getvalue().to_pybytes()
                    Path(where).write_bytes(data[: len(data) // 2])
                    os.kill(os.getpid(), signal.SIGKILL)
                real(table, where, *args, **kwargs)

            pq.write_table = write_table  # this worker process only

        def build(scope: Any) -> Any:
            handle, stream = scope.new_input()
            return handle, to_parquet(stream, path).probe()

        handle, probe = worker.dataflow(build)
        for t in range(EPOCHS):
            handle.send_batch(pa.RecordBatch.from_pylist(batch_rows("first", worker.index, t)))
            handle.advance_to(t + 1)
            if t + 1 == K:
                worker.step_while(lambda: probe.less_than(K))
                if not mid_write and worker.index == 1:
                    handle.send_batch(pa.RecordBatch.from_pylist(batch_rows("first", 1, K)))
                    handle.flush()
                    worker.step()
                    os.kill(os.getpid(), signal.SIGKILL)
        handle.close()

    return job


@pytest.mark.parametrize("mid_write", [False, True], ids=["after-epoch", "inside-write"])
def test_sigkilled_worker_leaves_epochs_below_k_committed(mid_write: bool, tmp_path: Path) -> None:
    root = tmp_path / "out"
    with pytest.raises(WorkerError) as excinfo:
        execute(sigkill_job(root, mid_write), workers=2, runtime="process", timeout=TIMEOUT)
    assert "worker 1 was killed by SIGKILL" in str(excinfo.value)

    expected = {t: c for t, c in sent_rows("first", 2, range(EPOCHS)).items() if t < K}
    assert_committed(root, expected)
    assert manifest(root)["frontier"] == K
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name]
    if mid_write:  # the killed write's half file is there, under a hidden name
        assert leftovers and all(hidden(p, root) for p in leftovers), leftovers
    else:
        assert leftovers == []

    execute(make_job(root, "first", range(EPOCHS)), workers=3)  # a later run repairs it
    assert_committed(root, sent_rows("first", 3, range(EPOCHS)))
    assert [p.name for p in root.iterdir() if p.name[:1] in "._"] == [MANIFEST]


def test_a_run_without_rows_leaves_an_empty_committed_dataset(tmp_path: Path) -> None:
    root = tmp_path / "out"
    execute(make_job(root, "first", range(3)), workers=2)
    assert committed_epochs(root) == [0, 1, 2]
    execute(make_job(root, "none", range(0)), workers=2)  # closes at once, no rows
    assert committed_epochs(root) == [] and manifest(root)["frontier"] is None
    assert read_committed(root).num_rows == 0
    assert visible(root).num_rows == 0 and epoch_listing(root) == {}
