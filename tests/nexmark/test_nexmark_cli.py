"""``tokenflow nexmark generate`` and ``tokenflow nexmark query`` (the typer app in-process).

Expected values come from the spec (docs/NEXMARK.md): Beam's field names, the 1:3:46
proportions, event times ``base + n * 1000 // rate`` ms, Q1's ``price * 89 // 100``.

``generate`` on a full disk (``pyarrow.parquet.write_table`` patched to write half a file and
raise ``ENOSPC``): no partial or temporary file is left, the command exits 1 naming the file,
and an earlier complete output in the same directory still reads as it was.  A shorter output
replaces a longer one whole (no stale parts).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tokenflow.cli import app
from tokenflow.io.times import InputError
from tokenflow.nexmark import GeneratorConfig, generate, write_parquet

pytestmark = pytest.mark.timeout(120)

BASE_TIME_MS = 1_436_918_400_000  # 2015-07-15T00:00:00Z
BEAM_FIELDS = {
    "person": ["id", "name", "emailAddress", "creditCard", "city", "state", "dateTime", "extra"],
    "auction": ["id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires",
                "seller", "category", "extra"],
    "bid": ["auction", "bidder", "price", "dateTime", "extra"],
}
UNKNOWN = "unknown query 'q9'; available: q0, q1, q2, q3, q4, q5, q7, q8"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_generate_writes_beam_parquet(tmp_path: Path) -> None:
    events, rate = 5_000, 2_000
    code, out, err = invoke("nexmark", "generate", "--events", str(events), "--rate", str(rate),
                            "--output", str(tmp_path / "data"))
    assert code == 0, err
    tables = {kind: pq.read_table(tmp_path / "data" / kind) for kind in BEAM_FIELDS}
    for kind, fields in BEAM_FIELDS.items():
        assert tables[kind].schema.names == fields
        assert re.search(rf"{kind}: {tables[kind].num_rows:,} rows", out)
    # 1:3:46 out of every 50 events.
    assert [tables[k].num_rows for k in BEAM_FIELDS] == [100, 300, 4_600]
    # Event n has dateTime base + n * 500 µs // 1000: persons are events 0, 50, 100, ...
    person_times = tables["person"].column("dateTime").to_numpy()
    np.testing.assert_array_equal(person_times, BASE_TIME_MS + np.arange(0, events, 50) // 2)
    ids = tables["person"].column("id").to_numpy()
    np.testing.assert_array_equal(ids, 1000 + np.arange(100))
    for kind in BEAM_FIELDS:
        times = tables[kind].column("dateTime").to_numpy()
        assert (np.diff(times) >= 0).all() and times[-1] < BASE_TIME_MS + events * 1000 // rate
    assert set(tables["auction"].column("category").to_pylist()) <= {10, 11, 12, 13, 14}


def test_generate_needs_events(tmp_path: Path) -> None:
    code, _, err = invoke("nexmark", "generate", "--output", str(tmp_path))
    assert code == 2 and "--events" in err


def test_query_q1_prints_rate_and_latency(tmp_path: Path) -> None:
    events = 20_000
    code, out, err = invoke("nexmark", "query", "--query", "q1", "--events", str(events),
                            "--workers", "2", "--runtime", "thread", "--output", str(tmp_path / "q1"))
    assert code == 0, err
    match = re.search(r"q1: 20,000 events .* thread, 2 workers: [\d.]+ s, ([\d,]+) events/s", out)
    assert match is not None, out
    assert int(match.group(1).replace(",", "")) > 0
    assert re.search(r"p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    assert "output: 18,400 rows" in out  # 46 bids per 50 events

    # The written dataset: every bid with price * 89 // 100, compared with the generated bids.
    written = ds.dataset(str(tmp_path / "q1"), format="parquet", partitioning=ds.partitioning(
        pa.schema([("epoch", pa.int64())]), flavor="hive")).to_table()
    assert written.num_rows == 18_400
    assert written.schema.names[:4] == ["auction", "bidder", "price", "dateTime"]
    code, _, err = invoke("nexmark", "generate", "--events", str(events), "--output",
                          str(tmp_path / "events"))
    assert code == 0, err
    bids = pq.read_table(tmp_path / "events" / "bid").sort_by("dateTime")
    mine = written.sort_by("dateTime")
    assert mine.column("dateTime").equals(bids.column("dateTime"))
    got = sorted(zip(*(mine.column(c).to_pylist() for c in ("dateTime", "auction", "bidder", "price")),
                     strict=True))
    want = sorted(zip(bids.column("dateTime").to_pylist(), bids.column("auction").to_pylist(),
                      bids.column("bidder").to_pylist(),
                      [p * 89 // 100 for p in bids.column("price").to_pylist()], strict=True))
    assert got == want
    # Partitions are the 1 s epochs holding each bid.
    times = written.column("epoch").to_numpy()
    np.testing.assert_array_equal(times, written.column("dateTime").to_numpy() // 1000 * 1000)


def test_query_short_form() -> None:
    """``tokenflow nexmark --query qN ...`` is the same as ``tokenflow nexmark query ...``."""
    code, out, err = invoke("nexmark", "--query", "q2", "--events", "10000", "--workers", "1")
    assert code == 0, err
    assert re.search(r"q2: 10,000 events .* 1 workers: .* events/s", out), out


@pytest.mark.parametrize("form", [["nexmark", "query"], ["nexmark"]])
def test_unknown_query_exits_2(form: list[str]) -> None:
    code, out, err = invoke(*form, "--query", "q9", "--events", "1000")
    assert code == 2
    assert UNKNOWN in err
    assert "events/s" not in out


def test_master_needs_spark_runtime() -> None:
    code, _, err = invoke("nexmark", "query", "--query", "q1", "--master", "local[2]")
    assert code == 2 and "--master applies to --runtime spark only" in err


def full_disk(monkeypatch: pytest.MonkeyPatch, fail_on: int) -> list[str]:
    """Make call ``fail_on`` (0-based) of ``pyarrow.parquet.write_table`` write the first half of
    the file and raise ``OSError(ENOSPC)``, as a full disk does; returns the paths written to."""
    real = pq.write_table
    calls: list[str] = []

    def write_table(table: pa.Table, where: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(str(where))
        if len(calls) - 1 != fail_on:
            real(table, where, *args, **kwargs)
            return
        sink = pa.BufferOutputStream()
        real(table, sink, *args, **kwargs)
        data = sink.getvalue().to_pybytes()
        with open(where, "wb") as file:
            file.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", write_table)
    return calls


def listing(root: Path) -> dict[str, list[str]]:
    """Every name (hidden ones too) in each kind's directory."""
    return {kind: sorted(os.listdir(root / kind)) for kind in BEAM_FIELDS}


@pytest.mark.parametrize("fail_on", [0, 2])  # the person part, the bid part
def test_generate_on_a_full_disk_keeps_the_previous_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_on: int) -> None:
    root = tmp_path / "data"
    code, _, err = invoke("nexmark", "generate", "--events", "2000", "--output", str(root))
    assert code == 0, err
    before = {kind: pq.read_table(root / kind) for kind in BEAM_FIELDS}

    calls = full_disk(monkeypatch, fail_on)
    code, out, err = invoke("nexmark", "generate", "--events", "3000", "--output", str(root))
    kind = list(BEAM_FIELDS)[fail_on]
    final = root / kind / "part-00000.parquet"
    assert code == 1, (out, err)
    assert f"cannot write {str(final)!r}: No space left on device" in err, err
    written = Path(calls[fail_on])
    assert written.parent == root / kind and written.name.startswith("."), written  # hidden
    assert listing(root) == {k: ["part-00000.parquet"] for k in BEAM_FIELDS}
    for k in BEAM_FIELDS:
        assert pq.read_table(root / k).equals(before[k]), k


def test_generate_on_a_full_disk_leaves_no_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    full_disk(monkeypatch, 1)
    code, _, err = invoke("nexmark", "generate", "--events", "2000", "--output", str(root))
    assert code == 1 and str(root / "auction" / "part-00000.parquet") in err, err
    assert listing(root) == {k: [] for k in BEAM_FIELDS}


def test_shorter_output_replaces_a_longer_one_whole(tmp_path: Path) -> None:
    config = GeneratorConfig(rate=1000)
    write_parquet(tmp_path, 5_000, config=config, batch=300, part_events=1_000)
    assert listing(tmp_path)["bid"] == [f"part-0000{i}.parquet" for i in range(5)]
    counts = write_parquet(tmp_path, 2_500, config=config, batch=300, part_events=1_000)
    assert listing(tmp_path) == {k: [f"part-0000{i}.parquet" for i in range(3)] for k in BEAM_FIELDS}
    whole = generate(0, 2_500, config)
    for kind, batch in whole.items():
        assert counts[kind] == batch.num_rows
        assert pq.read_table(tmp_path / kind).equals(pa.Table.from_batches([batch]))


def test_query_bad_input_found_by_a_worker_exits_2(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver checks ``--input`` first; a worker that finds bad data later (the files
    changed in between) also ends the command with exit 2 and the message, not a traceback."""
    import tokenflow.nexmark.files as files

    write_parquet(tmp_path, 2_000)
    real = files.read_events
    calls: list[object] = []
    message = "'/x/bid/part-00000.parquet', column 'price', row 3: null (value None)"

    def read_events(directory: Any, **options: Any) -> Any:
        calls.append(directory)
        if len(calls) > 1:  # the workers' reads
            raise InputError(message)
        return real(directory, **options)

    monkeypatch.setattr(files, "read_events", read_events)
    code, out, err = invoke("nexmark", "query", "--query", "q1", "--input", str(tmp_path),
                            "--workers", "2", "--quiet")
    assert code == 2, (out, err)
    assert f"bad input: {message}" in err and "Traceback" not in err, err
