"""``tokenflow demo``: flights, NEXMark q4 and q7 on Spark in one command, then q5 published
and subscribed to.

Run in-process on the test session's Spark (``local[4]`` serves the demo's ``local[2]``), with
20,000 NEXMark events at 1,000 events/s (20 s of event time, two 10 s windows) so it stays quick.
Checks: exit 0 and the session left running (the command stops only a session it started); the
closing table names all three jobs with their event counts; the written outputs agree with the
independent engines — q7's Parquet rows with Spark SQL, q4's last average per category with
Spark SQL's, the flights' hourly rows with pandas' count of airport-hours.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

from tokenflow.cli import app
from tokenflow.flights import flights_csv_path
from tokenflow.nexmark.queries import load
from tokenflow.nexmark.run import spark_reference

EVENTS = 20_000
RATE = 1_000


@pytest.mark.spark
def test_demo_runs_three_jobs_and_writes_checked_outputs(spark: Any, tmp_path: Path) -> None:
    from tokenflow.spark.session import running

    result = CliRunner().invoke(app, ["demo", "--events", str(EVENTS), "--rate", str(RATE),
                                      "--output", str(tmp_path), "--quiet"])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert running()  # the test session's Spark was reused, not stopped
    out = result.stdout

    # The closing table: one row per job, with its events and a positive rate.
    assert re.search(r"flights\s+│\s+336,776\s+│", out), out
    for query in ("q4", "q7"):
        assert re.search(rf"{query}\s+│\s+20,000\s+│", out), out
    assert len(re.findall(r"events/s", out)) >= 3
    # publish/subscribe: q5's output read back by a second job and by `tokenflow subscribe`
    # (the command compares both with the query's rows and exits 1 when they differ)
    assert re.search(r"q5 published\s+│\s+20,000\s+│", out), out
    assert out.count("the same rows as the query's output") == 2, out

    # q7: every bid with its window's maximum price, as Spark SQL finds it.
    columns = list(load("q7").COLUMNS)
    q7 = ds.dataset(str(tmp_path / "q7"), format="parquet").to_table()
    got = q7.select(columns).to_pandas().sort_values(columns).reset_index(drop=True)
    want = spark_reference("q7", EVENTS, rate=RATE)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert len(got) >= 2  # two windows

    # q4: the last running average per category equals Spark SQL's average of winning prices.
    epochs = ds.partitioning(pa.schema([("epoch", pa.int64())]), flavor="hive")
    q4 = ds.dataset(str(tmp_path / "q4"), format="parquet", partitioning=epochs).to_table().to_pandas()
    last = q4.sort_values("time").groupby("category")["avg_price"].last().sort_index()
    ref = spark_reference("q4", EVENTS, rate=RATE).set_index("category")["avg_price"].sort_index()
    pd.testing.assert_series_equal(last, ref, check_names=False, rtol=1e-12)
    assert (q4["epoch"] == q4["time"] // 1000 * 1000).all()  # 1 s epoch partitions

    # Flights: one row per (origin, scheduled hour) with a flight, as pandas counts them.
    hourly = ds.dataset(str(tmp_path / "flights" / "hourly"), format="parquet",
                        partitioning="hive").to_table()
    raw = pd.read_csv(flights_csv_path(), usecols=["origin", "time_hour"])
    assert hourly.num_rows == raw.drop_duplicates().shape[0]
    assert (tmp_path / "flights" / "daily_delay.png").stat().st_size > 1000
