"""NEXMark events read back from Parquet (``tokenflow.nexmark.files``, ``run_query(input=...)``).

* A query over the files ``write_parquet`` wrote gives the same rows as over generated events
  (q3: a join across kinds; q4: auctions closing at ``expires``), on 2 and 3 workers.
* ``read_kind`` casts narrower integer columns, keeps only the schema's columns and sorts by
  ``dateTime``.
* Bad input is an ``InputError`` naming the path (and column, and row): a missing directory, a
  file that is not Parquet, a missing column, a column of the wrong type, a null ``dateTime``;
  the CLI exits 2 with the same message.
* Time units (docs/NEXMARK.md: times are ms since the Unix epoch): ``dateTime`` / ``expires``
  written as ``timestamp[s|ms|us|ns]`` (with or without time zone, as Spark writes them) give
  exactly the q5 / q4 rows of the int64-ms input; files of one dataset may use different
  units; float and string times are refused naming the file, column and type.
* Nulls in a column a query reads (``bid.auction``, ``bid.price``, ``auction.seller``,
  ``auction.expires``, ``person.id`` ...) and impossible values (a negative ``dateTime``,
  price or id, ``expires`` before ``dateTime``) are an ``InputError`` naming the file of the
  right kind, the column, the row and the value, and the CLI exits 2 with it: never a wrong
  answer or an internal exception.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tokenflow.cli import app
from tokenflow.nexmark import SCHEMAS, GeneratorConfig, generate, write_parquet
from tokenflow.nexmark.files import read_events, read_kind
from tokenflow.nexmark.run import run_query
from tokenflow.spark.io import InputError

EVENTS = 20_000
RATE = 1_000


@pytest.fixture(scope="module")
def events_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("events")
    write_parquet(root, EVENTS, rate=RATE)
    return root


@pytest.mark.parametrize(("name", "workers"), [("q3", 2), ("q4", 3)])
def test_query_over_files_equals_generated(events_dir: Path, name: str, workers: int) -> None:
    generated = run_query(name, EVENTS, rate=RATE, workers=workers)
    from_files = run_query(name, 0, workers=workers, input=events_dir)
    assert from_files.events == EVENTS
    assert len(generated.rows) > 0
    pd.testing.assert_frame_equal(from_files.rows, generated.rows)
    assert from_files.epoch_times == generated.epoch_times


def test_read_kind_casts_selects_and_sorts(tmp_path: Path) -> None:
    bids = generate(0, 2_000, GeneratorConfig(rate=RATE))["bid"]
    order = np.random.default_rng(7).permutation(bids.num_rows)
    shuffled = pa.Table.from_batches([bids]).take(order)
    narrow = shuffled.set_column(shuffled.schema.get_field_index("price"), "price",
                                 shuffled.column("price").cast(pa.int32()))
    narrow = narrow.append_column("note", pa.array(["x"] * narrow.num_rows))
    (tmp_path / "bid").mkdir()
    pq.write_table(narrow, tmp_path / "bid" / "part-0.parquet")

    table = read_kind(tmp_path, "bid")
    assert table.schema == SCHEMAS["bid"]
    assert table.equals(pa.Table.from_batches([bids]))  # generated bids are in dateTime order


def _copy(events_dir: Path, tmp_path: Path) -> Path:
    root = tmp_path / "events"
    for kind in ("person", "auction", "bid"):
        (root / kind).mkdir(parents=True)
        table = pq.read_table(events_dir / kind)
        pq.write_table(table, root / kind / "part-0.parquet")
    return root


def test_missing_directory_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no person events at '.*nowhere/person'"):
        read_events(tmp_path / "nowhere")


def test_not_parquet_names_the_path(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    (root / "bid" / "part-0.parquet").write_bytes(b"this is not a parquet file\n" * 10)
    with pytest.raises(InputError, match=r"cannot read Parquet dataset '.*events/bid'"):
        read_events(root)


def test_missing_column_names_it(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / "auction" / "part-0.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["expires"]), path)
    with pytest.raises(InputError, match=r"events/auction/part-0.parquet': no column 'expires'"):
        read_events(root)


def test_without_the_padding_it_is_neither_read_nor_needed(events_dir: Path,
                                                             tmp_path: Path) -> None:
    """``extra=False`` (a query that does not read it): every kind is the full table less
    ``extra``, and files without that column are read; with the padding asked for, such a
    file is refused naming the column."""
    full, bare = read_events(events_dir), read_events(events_dir, extra=False)
    for kind in ("person", "auction", "bid"):
        assert "extra" not in bare[kind].column_names
        assert bare[kind].equals(full[kind].drop_columns(["extra"]))
    root = _copy(events_dir, tmp_path)
    path = root / "bid" / "part-0.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["extra"]), path)
    assert read_kind(root, "bid", extra=False).equals(bare["bid"])
    with pytest.raises(InputError, match=r"events/bid/part-0.parquet': no column 'extra'"):
        read_kind(root, "bid")


def _replace_column(path: Path, name: str, make: Callable[[list[Any]], pa.Array]) -> None:
    """Rewrite the Parquet file at ``path`` with column ``name`` replaced by ``make(values)``."""
    table = pq.read_table(path)
    column = make(table.column(name).to_pylist())
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, column), path)


def test_wrong_type_names_the_column(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    _replace_column(root / "bid" / "part-0.parquet", "price",
                    lambda prices: pa.array([f"p{v}" for v in prices]))
    with pytest.raises(InputError, match=r"column 'price' has type string, expected int64"):
        read_events(root)


def test_null_event_time_names_the_row(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    _replace_column(root / "person" / "part-0.parquet", "dateTime",
                    lambda times: pa.array(times[:5] + [None] + times[6:], pa.int64()))
    with pytest.raises(InputError, match=r"person/part-0.parquet', column 'dateTime', row 5: null"):
        read_events(root)


def test_cli_bad_input_exits_2(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    (root / "bid" / "part-0.parquet").write_bytes(b"garbage")
    result = CliRunner().invoke(app, ["nexmark", "--query", "q2", "--input", str(root), "--quiet"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "bad input: cannot read Parquet dataset" in result.stderr and "bid" in result.stderr


def test_cli_query_over_files(events_dir: Path) -> None:
    result = CliRunner().invoke(app, ["nexmark", "query", "--query", "q2", "--input", str(events_dir),
                                      "--quiet"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert f"q2: {EVENTS:,} events from {events_dir}" in result.stdout
    expected = run_query("q2", EVENTS, rate=RATE)
    assert f"output: {len(expected.rows):,} rows" in result.stdout


# -- time units ------------------------------------------------------------------------------

KINDS_ALL = ("person", "auction", "bid")
SMALL_EVENTS = 5_000
SMALL_RATE = 100  # 50 s of event time: about ten q5 windows


@pytest.fixture(scope="module")
def whole_seconds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small events whose times (``dateTime``, ``expires``) are floored to whole seconds, as
    int64 ms: every time unit (down to ``timestamp[s]``) represents them exactly."""
    root = tmp_path_factory.mktemp("seconds")
    write_parquet(root, SMALL_EVENTS, rate=SMALL_RATE)
    for kind in ("person", "auction", "bid"):
        path = root / kind / "part-00000.parquet"
        table = pq.read_table(path)
        for name in ("dateTime", "expires"):
            if name in table.column_names:
                whole = table.column(name).to_numpy() // 1000 * 1000
                table = table.set_column(table.schema.get_field_index(name), name, pa.array(whole))
        pq.write_table(table, path)
    return root


def _as_unit(source: Path, target: Path, kind: pa.DataType, split: bool = False) -> Path:
    """A copy of the dataset ``source`` with every time column as type ``kind`` (converted from
    int64 ms with integer arithmetic); ``split``: each kind as two files, the first half
    keeping int64 ms."""
    ticks = {"ms": 1, "us": 1000, "ns": 1_000_000}  # per ms
    for name in KINDS_ALL:
        (target / name).mkdir(parents=True)
        table = converted = pq.read_table(source / name)
        for column in ("dateTime", "expires"):
            if column in table.column_names:
                ms = table.column(column).to_numpy()
                raw = ms // 1000 if kind.unit == "s" else ms * ticks[kind.unit]  # exact
                converted = converted.set_column(table.schema.get_field_index(column), column,
                                                 pa.array(raw).cast(kind))
        if split:
            half = table.num_rows // 2
            pq.write_table(table.slice(0, half), target / name / "part-0.parquet")
            pq.write_table(converted.slice(half), target / name / "part-1.parquet")
        else:
            pq.write_table(converted, target / name / "part-0.parquet")
    return target


@pytest.mark.parametrize("kind", [
    pa.timestamp("us"), pa.timestamp("ns"), pa.timestamp("s"), pa.timestamp("ms"),
    pa.timestamp("us", tz="UTC"), pa.timestamp("ns", tz="America/Los_Angeles"),
], ids=str)
def test_timestamp_times_give_the_same_q5(whole_seconds_dir: Path, tmp_path: Path,
                                          kind: pa.DataType) -> None:
    original = run_query("q5", 0, workers=2, input=whole_seconds_dir)
    assert len(original.rows) > 0
    root = _as_unit(whole_seconds_dir, tmp_path / "events", kind)
    stored = pa.timestamp("ms", kind.tz) if kind.unit == "s" else kind  # Parquet has no seconds
    assert pq.read_schema(root / "bid" / "part-0.parquet").field("dateTime").type == stored
    converted = run_query("q5", 0, workers=2, input=root)
    pd.testing.assert_frame_equal(converted.rows, original.rows)
    assert converted.epoch_times == original.epoch_times


def test_spark_timestamps_give_the_same_q4(whole_seconds_dir: Path, tmp_path: Path) -> None:
    """Q4 reads ``expires`` too: as ``timestamp[us]`` (what Spark writes) it is ms again."""
    original = run_query("q4", 0, workers=2, input=whole_seconds_dir)
    assert len(original.rows) > 0
    root = _as_unit(whole_seconds_dir, tmp_path / "events", pa.timestamp("us", tz="UTC"))
    pd.testing.assert_frame_equal(run_query("q4", 0, workers=2, input=root).rows, original.rows)


def test_files_of_one_dataset_may_use_different_units(whole_seconds_dir: Path,
                                                      tmp_path: Path) -> None:
    root = _as_unit(whole_seconds_dir, tmp_path / "events", pa.timestamp("ns"), split=True)
    for name in KINDS_ALL:
        assert read_kind(root, name).equals(read_kind(whole_seconds_dir, name))


def test_dates_are_midnight_utc_in_ms(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    _replace_column(root / "person" / "part-0.parquet", "dateTime",
                    lambda times: pa.array([t // 86_400_000 for t in times], pa.int32())
                    .cast(pa.date32()))
    times = read_kind(root, "person").column("dateTime").to_numpy()
    want = pq.read_table(events_dir / "person").column("dateTime").to_numpy()
    np.testing.assert_array_equal(times, want // 86_400_000 * 86_400_000)


@pytest.mark.parametrize(("kind", "column", "make", "type_name"), [
    ("bid", "dateTime", lambda v: pa.array([float(x) for x in v]), "double"),
    ("auction", "expires", lambda v: pa.array([str(x) for x in v]), "string"),
    ("person", "dateTime", lambda v: pa.array([Decimal(x) for x in v]), "decimal128"),
    ("bid", "price", lambda v: pa.array([float(x) for x in v]), "double"),
    ("person", "name", lambda v: pa.array(range(len(v))), "int64"),
])
def test_refused_types_name_file_column_and_type(events_dir: Path, tmp_path: Path, kind: str,
                                                 column: str, make: Callable[[list[Any]], pa.Array],
                                                 type_name: str) -> None:
    root = _copy(events_dir, tmp_path)
    _replace_column(root / kind / "part-0.parquet", column, make)
    with pytest.raises(InputError, match=rf"{kind}/part-0.parquet': column '{column}' has type "
                                         rf"{type_name}"):
        read_events(root)


# -- nulls and impossible values -------------------------------------------------------------

NULL_ROW = 7


def _with_null(values: list[Any], kind: pa.DataType) -> pa.Array:
    return pa.array(values[:NULL_ROW] + [None] + values[NULL_ROW + 1:], kind)


NULLS = [("bid", "auction"), ("bid", "price"), ("bid", "dateTime"), ("auction", "seller"),
         ("auction", "expires"), ("auction", "category"), ("auction", "reserve"),
         ("person", "id"), ("person", "state")]


@pytest.mark.parametrize(("kind", "column"), NULLS)
def test_null_in_a_column_the_queries_read_names_file_column_and_row(
        events_dir: Path, tmp_path: Path, kind: str, column: str) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / kind / "part-0.parquet"
    _replace_column(path, column, lambda v: _with_null(v, SCHEMAS[kind].field(column).type))
    with pytest.raises(InputError) as excinfo:
        read_events(root)
    message = str(excinfo.value)
    assert message.startswith(f"{str(path)!r}, column {column!r}, row {NULL_ROW}: null"), message


def test_null_in_an_optional_column_is_kept(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    _replace_column(root / "bid" / "part-0.parquet", "extra",
                    lambda v: _with_null(v, pa.utf8()))
    assert read_kind(root, "bid").column("extra").null_count == 1


@pytest.mark.parametrize(("kind", "column"), [("bid", "auction"), ("auction", "expires"),
                                              ("person", "id"), ("bid", "price")])
def test_cli_null_exits_2_naming_file_column_and_row(events_dir: Path, tmp_path: Path,
                                                     kind: str, column: str) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / kind / "part-0.parquet"
    _replace_column(path, column, lambda v: _with_null(v, pa.int64()))
    result = CliRunner().invoke(app, ["nexmark", "query", "--query", "q5", "--input", str(root),
                                      "--quiet"])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert f"bad input: {str(path)!r}, column {column!r}, row {NULL_ROW}: null" in result.stderr
    assert "Traceback" not in result.stderr and "output:" not in result.stdout


def _set_value(path: Path, column: str, row: int, value: int) -> None:
    _replace_column(path, column,
                    lambda v: pa.array(v[:row] + [value] + v[row + 1:], pa.int64()))


def test_negative_date_time_names_the_auction_file(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / "auction" / "part-0.parquet"
    _set_value(path, "dateTime", 3, -5)
    with pytest.raises(InputError) as excinfo:
        read_events(root)
    message = str(excinfo.value)
    assert message.startswith(f"{str(path)!r}, column 'dateTime', row 3: value -5 ms"), message
    assert "negative" in message, message
    result = CliRunner().invoke(app, ["nexmark", "query", "--query", "q4", "--input", str(root),
                                      "--quiet"])
    assert result.exit_code == 2 and str(path) in result.stderr, (result.stdout, result.stderr)


@pytest.mark.parametrize(("kind", "column", "value", "why"), [
    ("bid", "price", -100, "is negative (price is a price in cents)"),
    ("auction", "seller", -1, "is negative (seller is a person id)"),
    ("person", "id", -7, "is negative (id is an id)"),
    ("bid", "dateTime", 253_402_300_800_000, "after the year 9999"),
])
def test_impossible_values_name_file_column_row_and_value(events_dir: Path, tmp_path: Path,
                                                          kind: str, column: str, value: int,
                                                          why: str) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / kind / "part-0.parquet"
    _set_value(path, column, 11, value)
    with pytest.raises(InputError) as excinfo:
        read_events(root)
    message = str(excinfo.value)
    assert message.startswith(f"{str(path)!r}, column {column!r}, row 11: value {value}"), message
    assert why in message, message


def test_expires_before_date_time_names_the_row(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / "auction" / "part-0.parquet"
    table = pq.read_table(path)
    date = table.column("dateTime")[4].as_py()
    _set_value(path, "expires", 4, date - 1)
    with pytest.raises(InputError, match=rf"column 'expires', row 4: value {date - 1} ms is before "
                                         rf"the auction's dateTime {date} ms"):
        read_events(root)


def test_uint64_beyond_int64_is_refused(events_dir: Path, tmp_path: Path) -> None:
    root = _copy(events_dir, tmp_path)
    path = root / "bid" / "part-0.parquet"
    _replace_column(path, "bidder", lambda v: pa.array(v[:2] + [2**64 - 1] + v[3:], pa.uint64()))
    with pytest.raises(InputError, match=r"column 'bidder', row 2: value 18446744073709551615 is "
                                         r"out of range of int64"):
        read_events(root)
