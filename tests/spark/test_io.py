"""Spark data in and out: ``from_dataframe``, ``to_parquet``, ``collect``.

* ``from_dataframe`` on every runtime (a Spark DataFrame on ``spark``, an Arrow table on
  ``thread`` / ``process``): the per-epoch records equal the input grouped by its time column
  (grouped independently with pandas), ``collect`` brings every record to the driver, the input
  frontier advances while the partition is still being read (earlier epochs complete, later
  rows still to come), and timestamp columns become ms since the Unix epoch (floored).
* Bad input fails the job with ``InputError`` naming the input, column, row and value:
  out-of-order rows within ``lateness`` are accepted, beyond it rejected — whatever the batch
  boundaries; a null time, a string time column, unsorted input without lateness, a time before
  the first epoch.
* ``to_parquet`` commits ``path/time=<t>/part-<k>.parquet`` for each epoch with data (names
  independent of the worker count),
  leaves no ``.tmp`` files, and ``spark.read.parquet(path)`` reads back exactly the input rows;
  re-running the job into the same path replaces the files instead of duplicating rows.

Spark barrier jobs here: 4 (read, write twice, a failing one).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenflow import WorkerError, execute
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import sink
from tokenflow.spark import InputError, collect, from_dataframe, to_parquet
from tokenflow.worker import Worker

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 180.0
ROWS = 800
EPOCHS = 50
COLUMNS = ["id", "t", "value", "name"]

FrontierLog = list[tuple[list[int], dict[int, int]]]
"""Per sink activation: the input frontier and the records received so far, counted by time."""


# -- input data and its independent expectations --------------------------------------------


def events_frame() -> pd.DataFrame:
    """``id`` (unique), ``t`` (event time 0..49, shuffled), ``value``, ``name`` (with a null)."""
    rng = np.random.default_rng(11)
    names = np.array(["ann", "bob", "", "çé", "dora"], dtype=object)
    name_col = names[rng.integers(0, len(names), ROWS)]
    name_col[5] = None
    return pd.DataFrame({
        "id": np.arange(ROWS, dtype=np.int64),
        "t": rng.integers(0, EPOCHS, ROWS).astype(np.int64),
        "value": rng.normal(size=ROWS),
        "name": name_col,
    })


def stamps_frame() -> pd.DataFrame:
    """``ts``: UTC timestamps with µs parts (sub-millisecond), not sorted."""
    base = pd.Timestamp("2024-02-29 23:59:59.998", tz="UTC")
    offsets_us = [0, 1, 999, 1000, 1500, 2001, 86_400_000_000, 3, 123_456_789]
    return pd.DataFrame({
        "sid": np.arange(len(offsets_us), dtype=np.int64),
        "ts": [base + pd.Timedelta(microseconds=o) for o in offsets_us],
    })


def rows_by_time(frame: pd.DataFrame, time: str) -> dict[int, list[tuple[Any, ...]]]:
    """The frame's rows (as tuples, NaN-free) grouped by ``time``, each group sorted."""
    return {int(t): sorted(_row_key(r) for r in group.to_dict("records"))
            for t, group in frame.groupby(time)}


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((k, None if v is None or (isinstance(v, float) and np.isnan(v)) else v)
                 for k, v in sorted(row.items()))


def expected_ms(frame: pd.DataFrame) -> dict[int, int]:
    """``sid`` -> ms since the Unix epoch (floored), computed by pandas."""
    ms = (frame["ts"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    return dict(zip(frame["sid"].tolist(), ms.astype(np.int64).tolist(), strict=True))


# -- jobs ------------------------------------------------------------------------------------


def frontier_log(stream: Any) -> FrontierLog:
    """A sink noting, at each activation, its input frontier and what it has received so far."""
    log: FrontierLog = []
    seen: Counter[int] = Counter()

    def logic(inp: Any) -> None:
        for ref, batch in inp:
            seen[ref.time] += len(batch)
        log.append((list(inp.frontier.frontier()), dict(seen)))

    sink(stream, "pipeline", "FrontierLog", logic)
    return log


def read_job(worker: Worker) -> tuple[Capture, FrontierLog, Capture]:
    """Read ``events`` (by ``t``, 4 rows per activation) and ``stamps`` (by ``ts``)."""

    def build(scope: Any) -> tuple[Capture, FrontierLog, Capture]:
        events = from_dataframe(scope, "events", "t", max_rows=4)
        stamps = from_dataframe(scope, "stamps", "ts")
        return collect(events), frontier_log(events), collect(stamps)

    return worker.dataflow(build)


def source_job(time: str, lateness: int = 0, max_rows: int = 65536) -> Callable[[Worker], Capture]:
    def job(worker: Worker) -> Capture:
        return worker.dataflow(
            lambda scope: collect(from_dataframe(scope, "events", time, lateness, max_rows)))

    return job


def parquet_job(path: str) -> Callable[[Worker], Capture]:
    def job(worker: Worker) -> Capture:
        def build(scope: Any) -> Capture:
            events = from_dataframe(scope, "events", "t", max_rows=64)
            to_parquet(events, path)
            return collect(events)

        return worker.dataflow(build)

    return job


def run(job: Callable[[Worker], Any], runtime: str, workers: int, inputs: dict[str, Any],
        sort_by: dict[str, str] | None, request: pytest.FixtureRequest) -> list[Any]:
    """``execute`` with ``inputs`` as Spark DataFrames on spark, Arrow tables elsewhere."""
    options: dict[str, Any] = {}
    if runtime == "spark":
        spark = request.getfixturevalue("spark")
        options["spark"] = spark
        inputs = {name: spark.createDataFrame(frame) for name, frame in inputs.items()}
    else:
        inputs = {name: pa.Table.from_pandas(frame, preserve_index=False)
                  for name, frame in inputs.items()}
        if runtime == "process":
            options["timeout"] = TIMEOUT
    return execute(job, workers=workers, runtime=runtime, inputs=inputs, sort_by=sort_by, **options)


RUNTIMES = [
    pytest.param("thread", 1, id="thread-1"),
    pytest.param("thread", 2, id="thread-2"),
    pytest.param("thread", 4, id="thread-4"),
    pytest.param("process", 2, id="process-2"),
    pytest.param("spark", 2, id="spark-2", marks=pytest.mark.spark),
]


# -- from_dataframe and collect --------------------------------------------------------------


@pytest.mark.parametrize(("runtime", "workers"), RUNTIMES)
def test_from_dataframe_per_epoch_frontier_and_timestamps(runtime: str, workers: int,
                                                          request: pytest.FixtureRequest) -> None:
    events, stamps = events_frame(), stamps_frame()
    results = run(read_job, runtime, workers, {"events": events, "stamps": stamps},
                  {"events": "t", "stamps": "ts"}, request)
    assert len(results) == workers

    # Per-epoch records equal the input grouped by time; collect() has every record.
    got: dict[int, list[tuple[Any, ...]]] = {}
    for cap, _, _ in results:
        for t, records in cap.by_time().items():
            got.setdefault(t, []).extend(_row_key(r) for r in records)
    assert {t: sorted(rs) for t, rs in got.items()} == rows_by_time(events, "t")
    collected = [_row_key(r) for cap, _, _ in results for r in cap.records()]
    assert Counter(collected) == Counter(_row_key(r) for r in events.to_dict("records"))

    # On every worker the frontier never goes backwards and ends empty, and at every
    # activation of the sink all epochs before its frontier are complete.
    intermediate: list[int] = []  # per worker, frontiers strictly inside the epoch range
    passed_while_reading = []  # per worker: an epoch completed while rows were still unread
    for worker, (cap, log, _) in enumerate(results):
        fronts = cap.frontiers
        assert fronts and fronts[-1] == [], (worker, fronts)
        assert all(len(f) <= 1 for f in fronts), fronts
        times = [f[0] for f in fronts if f]
        assert times == sorted(times), (worker, fronts)
        intermediate.append(len({t for t in times if 0 < t < EPOCHS - 1}))
        final = Counter({t: len(rs) for t, rs in cap.by_time().items()})
        reading = False
        for frontier, seen in log:
            if frontier:
                done = {t: n for t, n in seen.items() if t < frontier[0]}
                assert done == {t: n for t, n in final.items() if t < frontier[0]}, \
                    (worker, frontier)
                reading |= frontier[0] > 0 and sum(seen.values()) < final.total()
        passed_while_reading.append(reading)
    # The frontier passes through intermediate epochs while the input is still being read.  The
    # frontier is global (the least input position over all workers), so with several workers a
    # worker may finish reading before the others' progress reaches it (thread scheduling);
    # the worker still reading when the others are done sees its own position.  With one worker
    # this holds on that worker.
    assert max(intermediate) >= 3, intermediate
    assert any(passed_while_reading), passed_while_reading

    # Timestamps become ms since the Unix epoch (sub-ms parts floored).
    stamped = {r["sid"]: t for _, _, cap in results for t, rs in cap.by_time().items() for r in rs}
    assert stamped == expected_ms(stamps)


# -- bad input (thread runtime, one worker: rows are the input's rows) -----------------------


def run_events(times: list[Any], time: str = "event_time", lateness: int = 0,
               max_rows: int = 65536, runtime: str = "thread") -> list[Capture]:
    table = pa.table({time: times, "row": list(range(len(times)))})
    options: dict[str, Any] = {"timeout": TIMEOUT} if runtime == "process" else {}
    return execute(source_job(time, lateness, max_rows), workers=1, runtime=runtime,
                   inputs={"events": table}, **options)


def _input_error(excinfo: pytest.ExceptionInfo[WorkerError], runtime: str = "thread") -> str:
    if runtime == "thread":
        assert isinstance(excinfo.value.__cause__, InputError), repr(excinfo.value.__cause__)
    message = str(excinfo.value)
    assert "InputError" in message and "'events'" in message, message
    return message


@pytest.mark.parametrize("max_rows", [1, 3, 65536])
def test_out_of_order_within_lateness_is_accepted(max_rows: int) -> None:
    times = [0, 5, 3, 6, 10, 8, 8, 12, 11, 10]
    (cap,) = run_events(times, lateness=2, max_rows=max_rows)
    frame = pd.DataFrame({"event_time": times, "row": range(len(times))})
    assert {t: sorted(_row_key(r) for r in rs) for t, rs in cap.by_time().items()} == \
        rows_by_time(frame, "event_time")
    assert cap.frontiers[-1] == []


@pytest.mark.parametrize("max_rows", [1, 2, 4, 65536])
def test_beyond_lateness_is_an_error_naming_column_row_and_value(max_rows: int) -> None:
    # Row 4 (time 6) is 3 behind the latest time 9: more than lateness=2, in every batching.
    with pytest.raises(WorkerError) as excinfo:
        run_events([0, 5, 3, 9, 6, 12], lateness=2, max_rows=max_rows)
    message = _input_error(excinfo)
    assert "'event_time'" in message and "row 4" in message, message
    assert re.search(r"\b6\b", message) and "lateness=2" in message, message


@pytest.mark.parametrize("max_rows", [1, 65536])
def test_unsorted_without_lateness_is_an_error_naming_the_row(max_rows: int) -> None:
    with pytest.raises(WorkerError) as excinfo:
        run_events([0, 2, 2, 7, 5, 9], max_rows=max_rows)
    message = _input_error(excinfo)
    assert "'event_time'" in message and "row 4" in message and "sorted" in message, message


def test_null_time_is_an_error_naming_column_and_row() -> None:
    with pytest.raises(WorkerError) as excinfo:
        run_events([0, 1, None, 3])
    message = _input_error(excinfo)
    assert "'event_time'" in message and "row 2" in message and "null" in message, message


def test_whole_float_times_are_integer_times() -> None:
    (cap,) = run_events([0.0, 1.0, 1.0, 3.0])
    assert {t: sorted(r["row"] for r in rs) for t, rs in cap.by_time().items()} == \
        {0: [0], 1: [1, 2], 3: [3]}


@pytest.mark.parametrize("bad", [2.5, float("inf"), float("nan")])
def test_non_integer_float_time_is_an_error_naming_column_row_and_value(bad: float) -> None:
    with pytest.raises(WorkerError) as excinfo:
        run_events([0.0, 1.0, bad, 3.0], max_rows=2)  # row 2 is the second batch's first
    message = _input_error(excinfo)
    assert "'event_time'" in message and "row 2" in message and repr(bad) in message, message
    assert "non-integer event time" in message, message


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_string_time_column_is_an_error_naming_the_column(runtime: str) -> None:
    with pytest.raises(WorkerError) as excinfo:
        run_events(["2024-01-01", "2024-01-02"], runtime=runtime)
    message = _input_error(excinfo, runtime)
    assert "'event_time'" in message and "string" in message, message


def test_time_before_the_first_epoch_is_an_error_not_retimed() -> None:
    stamps = pd.DataFrame({"ts": pd.to_datetime(["1969-12-31 23:59:59.9995", "1970-01-01 00:00:00.000"],
                                                utc=True)})
    with pytest.raises(WorkerError) as excinfo:
        execute(source_job("ts"), workers=1,
                inputs={"events": pa.Table.from_pandas(stamps, preserve_index=False)})
    message = _input_error(excinfo)
    assert "'ts'" in message and "row 0" in message and "-1" in message, message


@pytest.mark.spark
def test_null_time_fails_the_spark_job_naming_column_and_row(request: pytest.FixtureRequest) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3], "t": [4.0, np.nan, 6.0]})
    spark = request.getfixturevalue("spark")
    df = spark.createDataFrame(frame).selectExpr("id", "CAST(t AS BIGINT) AS t")
    assert df.where("t IS NULL").count() == 1
    with pytest.raises(WorkerError) as excinfo:
        execute(source_job("t"), workers=2, runtime="spark", spark=spark,
                inputs={"events": df}, sort_by={"events": "t"})
    message = str(excinfo.value)
    # Nulls sort first, so the null is row 0 of its worker's partition.
    assert "InputError" in message and "'t'" in message and "row 0" in message, message
    assert "null" in message, message


# -- to_parquet -------------------------------------------------------------------------------


def _files(root: Path) -> dict[int, list[str]]:
    """Committed epoch -> its part file names (W-independent: ``part-NNNNN.parquet``)."""
    out: dict[int, list[str]] = {}
    for f in root.rglob("*.parquet"):
        if any(p.name.startswith(("_", ".")) for p in f.relative_to(root).parents if p.name):
            continue  # staging and hidden files are not part of the dataset
        t = re.fullmatch(r"time=(-?\d+)", f.parent.name)
        assert t and re.fullmatch(r"part-\d{5}\.parquet", f.name) and f.parent.parent == root, f
        out.setdefault(int(t.group(1)), []).append(f.name)
    return {t: sorted(names) for t, names in out.items()}


@pytest.mark.spark
@pytest.mark.parametrize("runtime", ["thread", "spark"])
def test_to_parquet_one_file_per_epoch_and_worker_readable_by_spark(
        runtime: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    spark = request.getfixturevalue("spark")
    events = events_frame()
    root = tmp_path / "out"
    # The input rows, with the partition column ``time`` equal to ``t``.
    expected_rows = Counter((r["id"], r["t"], r["value"], r["name"], r["t"])
                            for r in events.to_dict("records"))
    listings = []
    for _ in range(2):  # the second run writes the same epochs again into the same path
        caps = run(parquet_job(str(root)), runtime, 2, {"events": events}, {"events": "t"}, request)

        files = _files(root)
        assert set(files) == set(events["t"].tolist())
        assert [p for p in root.rglob("*") if ".tmp" in p.name] == []
        for t, names in files.items():  # each epoch holds exactly the rows of that epoch
            ids = sorted(i for n in names for i in pq.read_table(root / f"time={t}" / n)
                         .column("id").to_pylist())
            assert ids == sorted(r["id"] for cap in caps for r in cap.by_time().get(t, [])), t

        back = spark.read.parquet(str(root))
        assert set(back.columns) == {*COLUMNS, "time"}
        rows = Counter(tuple(r) for r in back.select(*COLUMNS, "time").collect())
        assert rows == expected_rows  # same rows, none twice
        listings.append(sorted(files))
    assert listings[0] == listings[1]


def test_to_parquet_granularity_groups_times_into_epoch_bins(tmp_path: Path) -> None:
    """With ``granularity=4`` times 0..9 land in ``epoch=0``, ``epoch=4``, ``epoch=8``, each
    holding exactly the rows of the bin's times."""
    events = pd.DataFrame({"id": np.arange(40), "t": np.arange(40) % 10,
                           "value": np.arange(40) * 1.5, "name": [f"n{i}" for i in range(40)]})
    root = tmp_path / "binned"

    def job(worker: Worker) -> Capture:
        def build(scope: Any) -> Capture:
            stream = from_dataframe(scope, "events", "t", max_rows=3)
            to_parquet(stream, str(root), granularity=4, partition="epoch")
            return collect(stream)

        return worker.dataflow(build)

    caps = execute(job, workers=2, runtime="thread",
                   inputs={"events": pa.Table.from_pandas(events, preserve_index=False)},
                   sort_by={"events": "t"})
    seen: Counter[int] = Counter()
    bins = set()
    for directory in root.glob("epoch=*"):
        b = int(directory.name.split("=")[1])
        bins.add(b)
        table = pq.read_table(directory)
        ids = sorted(table.column("id").to_pylist())
        expected = sorted(r["id"] for cap in caps for t, rows in cap.by_time().items()
                          if t - t % 4 == b for r in rows)
        assert ids == expected, b
        assert all(b <= t < b + 4 for t in table.column("t").to_pylist())
        seen.update(ids)
    assert bins == {0, 4, 8}
    assert seen == Counter(range(40))  # every row once


def test_to_parquet_rejects_bad_granularity(tmp_path: Path) -> None:
    def job(worker: Worker) -> None:
        def build(scope: Any) -> None:
            _, stream = scope.new_input("in")
            to_parquet(stream, str(tmp_path), granularity=0, name="Out")

        worker.dataflow(build)

    with pytest.raises(WorkerError, match="Out: granularity must be > 0"):
        execute(job, workers=1, runtime="thread")


@pytest.mark.spark
def test_spark_partitions_are_reproducible(request: pytest.FixtureRequest) -> None:
    """Each worker reads the same rows on every run (a hash of the row picks its partition;
    Spark's round-robin ``repartition(W)`` depends on the order partitions are read in)."""
    events = events_frame()
    runs = [run(source_job("t"), "spark", 2, {"events": events}, {"events": "t"}, request)
            for _ in range(2)]
    shares = [[sorted(r["id"] for r in cap.records()) for cap in caps] for caps in runs]
    assert shares[0] == shares[1]
    assert sorted(i for share in shares[0] for i in share) == sorted(events["id"].tolist())
    assert all(share for share in shares[0])  # both workers got rows
