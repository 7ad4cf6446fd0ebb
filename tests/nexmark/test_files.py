"""NEXMark events read back from Parquet (``tokenflow.nexmark.files``, ``run_query(input=...)``).

* A query over the files ``write_parquet`` wrote gives the same rows as over generated events
  (q3: a join across kinds; q4: auctions closing at ``expires``), on 2 and 3 workers.
* ``read_kind`` casts narrower integer columns, keeps only the schema's columns and sorts by
  ``dateTime``.
* Bad input is an ``InputError`` naming the path (and column, and row): a missing directory, a
  file that is not Parquet, a missing column, a column of the wrong type, a null ``dateTime``;
  the CLI exits 2 with the same message.
"""

from __future__ import annotations

from collections.abc import Callable
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
from tokenflow.nexmark.files import read_events, read_kind, worker_share
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


def test_worker_share_round_robin() -> None:
    table = pa.table({"dateTime": pa.array(range(10), pa.int64())})
    shares = [worker_share(table, w, 3).column("dateTime").to_pylist() for w in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert worker_share(table.slice(0, 0), 1, 3).num_rows == 0


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
    with pytest.raises(InputError, match=r"events/auction': no column 'expires'"):
        read_events(root)


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
    with pytest.raises(InputError, match=r"null event time in column 'dateTime' at row 5"):
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
