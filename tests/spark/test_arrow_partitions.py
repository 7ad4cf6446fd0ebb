"""Local tables on the Spark runtime (``tokenflow.spark.inputs.arrow_partitions``): worker ``i``
reads rows ``i, i + W, ...`` of each table, sorted by its time column, as Arrow batches.

The expected shares are computed here with pandas (position modulo W, stable sort by time);
the decoding test builds its IPC chunks with ``pyarrow.ipc`` directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tokenflow.execute import WorkerError, execute
from tokenflow.spark.inputs import Chunk, split_inputs
from tokenflow.spark.runtime import TAG


def expected_share(frame: pd.DataFrame, worker: int, workers: int, time: str) -> list[dict[str, Any]]:
    share = frame.iloc[worker::workers]
    return share.sort_values(time, kind="stable").to_dict("records")


def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(3)
    events = pd.DataFrame({"t": rng.integers(0, 50, 1000), "id": np.arange(1000),
                           "name": [f"n{i % 7}" for i in range(1000)]})
    stamps = pd.DataFrame({"ts": pd.to_datetime(rng.integers(0, 10**6, 301), unit="ms", utc=True),
                           "sid": np.arange(301)})
    return events, stamps


def reader() -> Any:
    """A worker function returning its inputs' rows (a closure: Spark tasks cannot import
    this test module, so cloudpickle must send it by value)."""

    def read_inputs(worker: Any) -> dict[str, list[dict[str, Any]]]:
        return {name: [row for b in batches for row in b.to_pylist()]
                for name, batches in worker.inputs.items()}

    return read_inputs


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return pa.Table.from_pandas(frame, preserve_index=False).to_pylist()


@pytest.mark.spark
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_workers_read_their_share_sorted_and_reproducible(spark: Any, workers: int) -> None:
    events, stamps = frames()
    inputs = {"events": pa.Table.from_pandas(events, preserve_index=False), "stamps": stamps}
    runs = [execute(reader(), workers=workers, runtime="spark", spark=spark, inputs=inputs,
                    sort_by={"events": "t", "stamps": "ts"}) for _ in range(2)]
    assert runs[0] == runs[1]
    for i, got in enumerate(runs[0]):
        want_events = _records(pd.DataFrame(expected_share(events, i, workers, "t")))
        want_stamps = _records(pd.DataFrame(expected_share(stamps, i, workers, "ts")))
        assert got["events"] == want_events, i
        assert got["stamps"] == want_stamps, i


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_shares_of_unequal_chunk_counts_reach_their_workers(spark: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunks of 111 rows, 1,001 events on 3 workers are 4, 4 and 3 chunks (the last
    worker's list padded with an empty one): every worker still reads exactly its share, and
    the second input, whose chunks follow the first's, too."""
    import tokenflow.spark.inputs as spark_inputs

    monkeypatch.setattr(spark_inputs, "CHUNK_ROWS", 111)
    rng = np.random.default_rng(5)
    events = pd.DataFrame({"t": rng.integers(0, 50, 1001), "id": np.arange(1001)})
    stamps = pd.DataFrame({"u": rng.integers(0, 9, 500), "sid": np.arange(500)})
    got = execute(reader(), workers=3, runtime="spark", spark=spark,
                  inputs={"events": events, "stamps": stamps}, sort_by={"events": "t", "stamps": "u"})
    for i, res in enumerate(got):
        assert res["events"] == _records(pd.DataFrame(expected_share(events, i, 3, "t"))), i
        assert res["stamps"] == _records(pd.DataFrame(expected_share(stamps, i, 3, "u"))), i


@pytest.mark.spark
def test_shares_too_large_for_parallelize_go_as_a_dataframe(
        spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Over ``MAX_SHARE_BYTES`` per worker (here 1 byte) the tables go as a Spark DataFrame,
    split by a hash of their rows (not round-robin): every row still reaches exactly one
    worker, each worker's rows sorted by time, and the log says why."""
    import logging

    import tokenflow.spark.inputs as spark_inputs

    monkeypatch.setattr(spark_inputs, "MAX_SHARE_BYTES", 1)
    caplog.set_level(logging.INFO, logger="tokenflow.spark.runtime")
    events, stamps = frames()
    got = execute(reader(), workers=2, runtime="spark", spark=spark,
                  inputs={"events": events, "stamps": stamps}, sort_by={"events": "t", "stamps": "ts"})
    assert sorted(r["id"] for res in got for r in res["events"]) == list(range(1000))
    assert sorted(r["sid"] for res in got for r in res["stamps"]) == list(range(301))
    for res in got:
        assert [r["t"] for r in res["events"]] == sorted(r["t"] for r in res["events"])
    assert "go to Spark as a DataFrame" in caplog.text


@pytest.mark.spark
def test_a_worker_without_rows_gets_an_empty_input(spark: Any) -> None:
    table = pa.table({"t": [5], "v": ["only"]})
    got = execute(reader(), workers=2, runtime="spark", spark=spark, inputs={"e": table},
                  sort_by={"e": "t"})
    assert got == [{"e": [{"t": 5, "v": "only"}]}, {"e": []}]


@pytest.mark.spark
def test_a_table_next_to_a_spark_dataframe_reaches_the_workers(spark: Any) -> None:
    events, stamps = frames()
    inputs = {"events": pa.Table.from_pandas(events, preserve_index=False),
              "stamps": spark.createDataFrame(stamps)}
    results = execute(reader(), workers=2, runtime="spark", spark=spark, inputs=inputs,
                      sort_by={"events": "t", "stamps": "ts"})
    got = sorted((r["id"], r["t"], r["name"]) for res in results for r in res["events"])
    assert got == sorted(zip(events["id"], events["t"], events["name"], strict=True))
    assert sorted(r["sid"] for res in results for r in res["stamps"]) == list(range(301))
    for res in results:
        times = [r["t"] for r in res["events"]]
        assert times == sorted(times)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, batch.schema)
    writer.write_batch(batch)
    writer.close()
    return sink.getvalue().to_pybytes()


def _chunks(rows: list[tuple[int, int, int, pa.RecordBatch]]) -> list[Chunk]:
    """(input tag, worker, seq, batch) per chunk, as ``arrow_partitions`` holds them."""
    return [(k, worker, seq, _ipc(batch)) for k, worker, seq, batch in rows]


def test_split_inputs_decodes_chunks_per_input_in_order() -> None:
    a1 = pa.record_batch({"t": [1, 2], "x": ["a", "b"]})
    a2 = pa.record_batch({"t": [3], "x": ["c"]})
    b1 = pa.record_batch({"ts": pa.array([7], pa.timestamp("ms", tz="UTC"))})
    batches = iter(_chunks([(0, 1, 0, a1), (0, 1, 1, a2), (1, 1, 0, b1)]))
    got = split_inputs(batches, [("a", ["t", "x"]), ("b", ["ts"])], TAG, partition=1)
    assert [b.to_pylist() for b in got["a"]] == [a1.to_pylist(), a2.to_pylist()]
    assert [b.schema for b in got["b"]] == [b1.schema]  # the table's own types (ms, UTC)
    with pytest.raises(RuntimeError, match="already consumed"):
        list(got["a"])


def test_split_inputs_refuses_a_chunk_of_another_worker() -> None:
    a1 = pa.record_batch({"t": [1]})
    got = split_inputs(iter(_chunks([(0, 0, 0, a1)])), [("a", ["t"])], TAG, partition=1)
    with pytest.raises(RuntimeError, match=r"partition 1 holds a chunk for worker 0"):
        list(got["a"])


def test_split_inputs_of_an_empty_partition() -> None:
    got = split_inputs(iter([]), [("a", ["t"]), ("b", ["u"])], TAG, partition=0)
    assert {name: list(v) for name, v in got.items()} == {"a": [], "b": []}


@pytest.mark.spark
def test_bad_sort_column_names_the_input(spark: Any) -> None:
    with pytest.raises((KeyError, WorkerError), match="no column 'missing'"):
        execute(reader(), workers=2, runtime="spark", spark=spark,
                inputs={"e": pa.table({"t": [1]})}, sort_by={"e": "missing"})
