"""Flights benchmark: tokenflow's hourly statistics against Spark SQL's, in one run.

The job (``tokenflow.flights``): per origin airport and scheduled hour of the 336,776 NYC
flights of 2013, departures, cancellations, the mean and the exact 90th percentile of the
departure delay (19,486 rows).  Measured side by side, in ``--rounds`` interleaved rounds on
one SparkSession (``local[2]``, started before any timing):

* **Spark SQL**: the same aggregation (``count``, ``sum``, ``avg``, ``percentile(.., 0.9)``, the
  exact percentile with numpy's linear interpolation) over a DataFrame made from the Arrow
  table (``createDataFrame`` not timed), warm (one untimed run first), ``toArrow()`` timed.
* **tokenflow spark**: ``run_flights_timed(runtime="spark")``, 2 workers on ``local[2]`` (the
  ``execute`` call: the table carried to the workers as Arrow and the job).
* **tokenflow process / thread**: the same with 2 worker processes (spawn included) / threads.
* **tokenflow spark, Spark DataFrame input**: the same job fed a DataFrame made from the table,
  which takes the hash-repartition path every run took before (the "before" figure).
* **DataFrame → workers**: a job that only reads its input partition, with the table passed as
  Arrow (``arrow_partitions``) and, for comparison, as a Spark DataFrame (the hash-repartition path
  every input took before); rows/s per worker = rows / 2 / the ``execute`` seconds (the fixed
  cost of a barrier stage included; the empty stage is reported apart).
* **Where the time goes**: the empty barrier stage, an empty process job (spawning two
  workers), and ``hourly_table`` over the whole year in one call (the computation alone).

Every tokenflow result is checked equal to Spark SQL's (counts exact, floats within 1e-12
relative or 1e-12 absolute: numpy's interpolation formula leaves 2.2e-16 where Spark
has 0) before any figure is printed.  Figures are the median over rounds (ratios: the median
of each round's ratio) and the best round.  Prints the table and writes
``benchmarks/results/flights.md`` and ``flights.png``.

Run: ``.venv/bin/python benchmarks/flights.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _provenance import provenance  # noqa: E402

from tokenflow.execute import execute  # noqa: E402
from tokenflow.flights import (  # noqa: E402
    COLUMNS,
    HOURLY_SCHEMA,
    flights_job,
    hourly_table,
    load_flights,
    run_flights_timed,
)

RESULTS = Path(__file__).parent / "results"
WORKERS = 2
MASTER = f"local[{WORKERS}]"


def spark_sql(spark: Any, frame: Any) -> pa.Table:
    """The aggregation in Spark SQL, as a ``HOURLY_SCHEMA`` table sorted by (time_hour, origin)."""
    from pyspark.sql import functions as F  # noqa: N812

    out = frame.groupBy("origin", "time_hour").agg(
        F.count("dep_time").alias("departures"),
        F.sum(F.col("dep_time").isNull().cast("long")).alias("cancelled"),
        F.avg(F.col("dep_delay").cast("double")).alias("mean_dep_delay"),
        F.percentile(F.col("dep_delay").cast("double"), F.lit(0.9)).alias("p90_dep_delay"),
    ).toArrow()
    return out.select(HOURLY_SCHEMA.names).cast(HOURLY_SCHEMA) \
        .sort_by([("time_hour", "ascending"), ("origin", "ascending")])


def check_equal(name: str, got: pa.Table, want: pa.Table) -> None:
    """Raise ``AssertionError`` unless ``got`` equals ``want`` row by row (floats to 1e-12
    relative or absolute)."""
    if got.num_rows != want.num_rows:
        raise AssertionError(f"{name}: {got.num_rows} rows, Spark SQL has {want.num_rows}")
    for column in ("origin", "time_hour", "departures", "cancelled"):
        if not got.column(column).equals(want.column(column)):
            raise AssertionError(f"{name}: column {column} differs from Spark SQL's")
    for column in ("mean_dep_delay", "p90_dep_delay"):
        a = got.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        b = want.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True,
                                   err_msg=f"{name}: {column}")


def drain_job() -> Callable[[Any], int]:
    def job(worker: Any) -> int:
        return sum(b.num_rows for b in worker.inputs["flights"])

    return job


def empty_job() -> Callable[[Any], None]:
    def job(worker: Any) -> None:
        return None

    return job


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()

    import pyspark

    from tokenflow.spark.session import get_session

    load_start = os.getloadavg()[0]
    table = load_flights().select(COLUMNS)
    rows = table.num_rows
    start = time.perf_counter()
    spark = get_session(MASTER)
    startup = time.perf_counter() - start
    frame = spark.createDataFrame(table)
    old_frame = spark.createDataFrame(table)  # as a Spark DataFrame input: the old path
    want = spark_sql(spark, frame)  # warm-up, untimed
    check_equal("hourly_table (one call)", hourly_table(
        pc.cast(table.column("time_hour"), pa.int64()).to_numpy(), table.column("origin"),
        table.column("dep_time"), table.column("dep_delay")).sort_by(
        [("time_hour", "ascending"), ("origin", "ascending")]), want)

    figures: dict[str, list[float]] = {}

    def note(name: str, seconds: float) -> None:
        figures.setdefault(name, []).append(seconds)
        print(f"  {name}: {seconds:.2f} s", file=sys.stderr, flush=True)

    times_ms = pc.cast(table.column("time_hour"), pa.int64()).to_numpy()
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        seconds, got = timed(lambda: spark_sql(spark, frame))
        check_equal("Spark SQL (again)", got, want)
        note("Spark SQL", seconds)
        for runtime in ("spark", "process", "thread"):
            run = run_flights_timed(workers=WORKERS, runtime=runtime, master=MASTER, flights=table)
            check_equal(f"tokenflow {runtime}", run.table, want)
            note(f"tokenflow {runtime}", run.seconds)
        # The path every run took before Arrow tables went as IPC chunks: a Spark DataFrame
        # input, hash-repartitioned and sorted by Spark.
        seconds, results = timed(lambda: execute(
            flights_job(None), workers=WORKERS, runtime="spark", spark=spark,
            inputs={"flights": old_frame}, sort_by={"flights": "time_hour"}))
        old = pa.concat_tables([r[0] for r in results]).sort_by(
            [("time_hour", "ascending"), ("origin", "ascending")])
        check_equal("tokenflow spark (Spark DataFrame input)", old, want)
        note("tokenflow spark, Spark DataFrame input (old path)", seconds)
        for name, data in (("arrow", table), ("spark-df", old_frame)):
            seconds, counts = timed(lambda data=data: execute(
                drain_job(), workers=WORKERS, runtime="spark", spark=spark,
                inputs={"flights": data}, sort_by={"flights": "time_hour"}))
            if sum(counts) != rows:
                raise AssertionError(f"{name}: workers read {counts} rows, not {rows}")
            note(f"DataFrame -> workers ({name})", seconds)
        note("empty Spark stage", timed(lambda: execute(empty_job(), workers=WORKERS,
                                                        runtime="spark", spark=spark))[0])
        note("empty process job", timed(lambda: execute(empty_job(), workers=WORKERS,
                                                        runtime="process"))[0])
        note("hourly_table (one call)", timed(lambda: hourly_table(
            times_ms, table.column("origin"), table.column("dep_time"),
            table.column("dep_delay")))[0])
    load_end = os.getloadavg()[0]

    sql = figures["Spark SQL"]

    def ratio(name: str) -> tuple[float, float]:
        per_round = [a / b for a, b in zip(figures[name], sql, strict=True)]
        return statistics.median(per_round), min(per_round)

    lines = ["| measurement | median s | best s | × Spark SQL (median of rounds) "
             "| rows/s per worker (median) |", "|---|---:|---:|---:|---:|"]
    for name, values in figures.items():
        med, best = statistics.median(values), min(values)
        r_med, _ = ratio(name)
        per_worker = f"{rows / WORKERS / med:,.0f}" if name.startswith(("DataFrame", "tokenflow")) else ""
        lines.append(f"| {name} | {med:.2f} | {best:.2f} | {r_med:.2f} | {per_worker} |")
    table_md = "\n".join(lines)
    print(table_md)

    targets = [
        ("tokenflow spark <= 1.5x Spark SQL", ratio("tokenflow spark")[0], 1.5),
        ("tokenflow process <= 1x Spark SQL", ratio("tokenflow process")[0], 1.0),
    ]
    stage = statistics.median(figures["empty Spark stage"])
    conv = rows / WORKERS / statistics.median(figures["DataFrame -> workers (arrow)"])
    net = [d - e for d, e in zip(figures["DataFrame -> workers (arrow)"],
                                 figures["empty Spark stage"], strict=True)]
    conv_net = rows / WORKERS / max(statistics.median(net), 1e-9)
    verdicts = [f"- {label}: {value:.2f}x — {'met' if value <= limit else 'NOT met'}"
                for label, value, limit in targets]
    verdicts.append(f"- DataFrame -> workers >= 1M rows/s per worker: {conv:,.0f} with the "
                    f"barrier stage's fixed cost ({stage:.2f} s) included — "
                    f"{'met' if conv >= 1e6 else 'NOT met'}; {conv_net:,.0f} without it "
                    f"(the median of each round's drain minus its empty stage) — "
                    f"{'met' if conv_net >= 1e6 else 'NOT met'}")
    print("\n".join(verdicts))

    plot(figures, RESULTS / "flights.png")
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        "# Flights benchmark",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, pyarrow {pa.__version__}, numpy {np.__version__}; {when}; "
        f"1-minute load average {load_start:.1f} at the start, {load_end:.1f} at the end (the "
        f"machine is shared with other sessions' benchmarks). {provenance()}",
        "",
        f"`benchmarks/flights.py --rounds {args.rounds}`: {rows:,} flights, {WORKERS} workers, "
        f"Spark `{MASTER}` (session start-up {startup:.2f} s, not timed). Every tokenflow "
        f"result was checked equal to Spark SQL's ({want.num_rows:,} rows) before these figures.",
        "",
        table_md,
        "",
        "![seconds per measurement](flights.png)",
        "",
        "Targets (issue 17), median of per-round ratios:",
        "",
        *verdicts,
        "",
    ])
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "flights.md"
    notes = path.read_text().split("\n## ", 1)[1] if path.exists() and "\n## " in path.read_text() else None
    path.write_text(text + ("\n## " + notes if notes else ""))
    print(f"wrote {path}")


def plot(figures: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(figures)
    med = [statistics.median(figures[n]) for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.barh(names, med, color=["#888" if n == "Spark SQL" else "#3a7" for n in names])
    for i, n in enumerate(names):
        ax.plot(figures[n], [i] * len(figures[n]), "k.", markersize=4)
    ax.axvline(med[names.index("Spark SQL")], color="grey", linestyle="--", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (bar: median; dots: rounds)")
    ax.set_title("Flights 2013 hourly statistics: tokenflow vs Spark SQL (local[2])")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
