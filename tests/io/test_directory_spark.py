"""The directory source on Spark: files dropped into a directory while a 2-worker job runs on
the Spark runtime are each processed exactly once, and the output is committed per epoch, on
the suite's session (``local[4]``).  The same job on a literal ``local[2]`` master (2 task slots
for 2 workers) runs in ``tests/spark/test_differential.py``'s child process, which has a JVM of
its own for that master."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenflow import execute
from tokenflow.io import read_committed, read_manifest, to_parquet
from tokenflow.io.directory import directory_source

FILES = 12
ROWS = 250


def drop(directory: Path, name: str, table: pa.Table) -> None:
    """Write under a hidden name, then rename: the source never sees a partial file."""
    hidden = directory / f".{name}.tmp"
    pq.write_table(table, hidden)
    os.replace(hidden, directory / name)


def run_directory_job(tmp_path: Path, **options: Any) -> None:
    """Drop ``FILES`` files into a directory while a 2-worker Spark job (``execute`` with
    ``options``: ``spark=`` or ``master=``) reads it and commits to Parquet; check that every
    row is committed once, each epoch whole, each file in one epoch."""
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()

    def job(worker: Any) -> None:
        def build(scope: Any) -> None:
            rows, _ = directory_source(scope, "inbox", str(inbox), poll=0.05)
            to_parquet(rows, str(out), name="Committed")

        worker.dataflow(build)

    def writer() -> None:
        for i in range(FILES):
            ids = list(range(i * ROWS, (i + 1) * ROWS))
            drop(inbox, f"part-{i:03d}.parquet", pa.table({"id": ids, "file": [i] * ROWS}))
            if i == 0:  # the job is running once the first file has reached the sink
                deadline = time.monotonic() + 120
                while not out.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            time.sleep(0.2)
        (inbox / "_END").touch()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        execute(job, workers=2, runtime="spark", **options)
    finally:
        thread.join()
    data = read_committed(str(out))
    ids = data.column("id").to_pylist()
    assert sorted(ids) == list(range(FILES * ROWS))  # every row, none twice
    manifest = read_manifest(str(out))
    assert manifest["frontier"] is None  # the stream ended and everything is committed
    epochs = manifest["epochs"]
    assert len(epochs) >= 2  # files arriving over seconds land in several epochs
    for entry in epochs.values():  # each epoch committed whole: its files and marker
        directory = out / entry["dir"]
        assert (directory / "_SUCCESS").exists()
        assert sum(pq.read_table(directory / f).num_rows for f in entry["files"]) == entry["rows"]
    # a file's rows all carry one epoch (a file is read by one worker, at one poll round)
    per_file: dict[int, set[Any]] = {}
    for f, t in zip(data.column("file").to_pylist(), data.column("time").to_pylist(), strict=True):
        per_file.setdefault(f, set()).add(t)
    assert all(len(times) == 1 for times in per_file.values())


@pytest.mark.spark
def test_files_dropped_while_a_spark_job_runs_are_committed_once(tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    run_directory_job(tmp_path, spark=request.getfixturevalue("spark"))
