"""Sources of joining and leaving workers (``tokenflow.resplit``, ``tokenflow.io.handover``):
a worker that joins a running job with ``sources`` reads a share of every source's remaining
work from a logical time on, and a leaving worker hands its share away; every event or line is
read exactly once (the offset ranges the workers read tile every split), the joiner reads part
of the input, and the output equals an independent oracle's (pandas for NEXMark q5, a
``Counter`` for a word count over a directory of files dropped while the job runs)."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from tokenflow.io.directory import directory_source
from tokenflow.io.handover import HandoverError
from tokenflow.io.sources import nexmark_splits
from tokenflow.job import start
from tokenflow.nexmark.generator import GeneratorConfig, generate
from tokenflow.nexmark.queries import q5
from tokenflow.nexmark.run import run_query
from tokenflow.rescale import megaphone_fold
from tokenflow.resplit import assign

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")]

BINS = 64


def test_assign_moves_only_what_evens_the_shares() -> None:
    owned = {0: [f"s{i:02d}" for i in range(0, 16, 2)], 1: [f"s{i:02d}" for i in range(1, 16, 2)]}
    moves = assign(owned, [0, 1, 2])  # 8 + 8 -> 6 / 5 / 5: only the newcomer receives
    assert sorted(to for _, to in moves.values()) == [2] * 5
    shares = Counter({w: len(k) for w, k in owned.items()})
    for _, (old, new) in moves.items():
        shares[old] -= 1
        shares[new] += 1
    assert sorted(shares.values()) == [5, 5, 6]
    # worker 1 leaves: exactly its splits move, to the workers below their share
    assert assign({0: ["a", "b"], 1: ["c", "d"], 2: ["e"]}, [0, 2]) == {"c": (1, 0),
                                                                        "d": (1, 2)}
    assert assign({}, [0]) == {} and assign({0: ["a"]}, [0]) == {}
    with pytest.raises(ValueError):
        assign({0: ["a"]}, [])


# -- NEXMark q5 --------------------------------------------------------------------------------


def q5_oracle(events: int, config: GeneratorConfig) -> pd.DataFrame:
    """Q5 in pandas over the generated bids: per sliding window, the auctions with the most
    bids (ties kept)."""
    bids = generate(0, events, config)["bid"].to_pandas()[["auction", "dateTime"]]
    start = bids["dateTime"] - bids["dateTime"] % q5.SLIDE_MS
    windows = pd.concat([pd.DataFrame({"window_start": start - k * q5.SLIDE_MS,
                                       "auction": bids["auction"]})
                         for k in range(q5.SIZE_MS // q5.SLIDE_MS)])
    counts = windows.groupby(["window_start", "auction"]).size().rename("count").reset_index()
    top = counts[counts["count"] == counts.groupby("window_start")["count"].transform("max")]
    top = top.assign(window_end=top["window_start"] + q5.SIZE_MS)[q5.COLUMNS]
    return top.sort_values(q5.COLUMNS).reset_index(drop=True)


def tiles(read: dict[int, dict[str, list[tuple[int, int]]]], rows: dict[str, int]) -> None:
    """The offset ranges the workers read tile every split's ``[0, rows)``: each row once."""
    for key, n in rows.items():
        ranges = sorted(r for by_split in read.values() for r in by_split.get(key, []))
        position = 0
        for first, end in ranges:
            assert first == position, f"split {key}: {ranges} (read twice or skipped)"
            position = end
        assert position == n, f"split {key}: read up to {position} of {n}"


PACED_EVENTS = 600_000
"""Events of the paced runs (``pace``): offered over a fixed stretch of wall-clock time, so the
job still runs when the joins and leaves come however fast or loaded the machine is, and does
not eat the CPU the joining workers start with; run as fast as they go, 1.2M-2.4M events were
needed for that margin (and each test took 9-17 s, a third of it the reference)."""


@pytest.mark.parametrize("runtime,events,pace", [
    ("thread", 600_000, None),  # as fast as it goes: the join and leave take ~ms on threads
    ("process", PACED_EVENTS, PACED_EVENTS / 5),  # 5 s of input; the leave is done by ~2.5 s
])
def test_nexmark_q5_sources_follow_a_joining_and_a_leaving_worker(runtime: str, events: int,
                                                                  pace: float | None) -> None:
    nexmark_case(runtime, events, 0.5 if runtime == "thread" else 1.0, pace=pace)


@pytest.mark.spark
def test_nexmark_q5_sources_follow_workers_on_spark(spark: Any) -> None:
    # 8 s of input: a join starts a Spark stage, ~7 s in a session that ran no job yet
    nexmark_case("spark", PACED_EVENTS, 2.0, master="local[4]", pace=PACED_EVENTS / 8)


def nexmark_case(runtime: str, events: int, stay: float, **options: Any) -> None:
    """q5 on 2 workers; a third joins with a share of the generator's splits at a random
    time and leaves ``stay`` s later, handing what is left of them back."""
    rng = random.Random()
    join = rng.uniform(0.05, 0.4)
    schedule = [(join, 3), (join + stay, 2)]
    result = run_query("q5", events, workers=2, runtime=runtime, max_workers=3,
                       granularity_ms=100, rescale_schedule=schedule, move_sources=True,
                       **options)
    assert [(e.workers, e.error) for e in result.rescales] == [(3, None), (2, None)], schedule
    expected = q5_oracle(events, GeneratorConfig(rate=10_000))
    got = result.rows[q5.COLUMNS].sort_values(q5.COLUMNS).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    tiles(result.read, {s.key: s.rows for s in nexmark_splits(events, splits=16, block=5000)})
    joined = sum(end - first for ranges in result.read[2].values() for first, end in ranges)
    assert 0 < joined < events, f"the joined worker read {joined} of {events} events"


def test_nexmark_q8_sources_follow_workers_through_2_3_4_3_2_on_processes() -> None:
    """Each join re-splits the generator's splits onto the newcomer, each leave hands the
    leaver's back; q8's output is a run's that never rescales, every event read once."""
    events = PACED_EVENTS  # over 7 s; the four changes were done by ~4 s (a join starts a process)
    reference = run_query("q8", events, workers=2, granularity_ms=100).rows
    result = run_query("q8", events, workers=2, runtime="process", max_workers=4,
                       granularity_ms=100, move_sources=True, pace=events / 7,
                       rescale_schedule=[(0.2, 3), (0.6, 4), (1.2, 3), (1.8, 2)])
    assert [(e.workers, e.error) for e in result.rescales] == [(3, None), (4, None), (3, None),
                                                               (2, None)]
    assert len(reference) > 0
    pd.testing.assert_frame_equal(result.rows.reset_index(drop=True),
                                  reference.reset_index(drop=True), check_dtype=False)
    tiles(result.read, {s.key: s.rows for s in nexmark_splits(events, splits=16, block=5000)})
    assert all(result.read.get(w) for w in (2, 3)), "a joined worker generated no event"


# -- a word count over a directory -----------------------------------------------------------


def drop(directory: Path, name: str, lines: list[str]) -> None:
    """Write a CSV file under a hidden name, then rename it into place."""
    hidden = directory / f".{name}.tmp"
    pcsv.write_csv(pa.table({"line": lines}), hidden)
    os.replace(hidden, directory / name)


def file_lines(index: int) -> list[str]:
    rng = random.Random(index)
    return [" ".join(f"w{int(rng.paretovariate(1.1)) % 40}" for _ in range(rng.randint(1, 8)))
            for _ in range(rng.randint(5, 30))]


def directory_word_count(inbox: str) -> Any:
    def run(worker: Any) -> dict[str, Any]:
        def build(scope: Any) -> Any:
            lines, source = directory_source(scope, "Inbox", inbox, format="csv", poll=0.03)
            words = lines.map_batch(lambda b: [(w, 1) for line in b.column("line").to_pylist()
                                               for w in line.split()])
            counts = megaphone_fold(words, lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
            return source, counts.stream.capture()

        source, capture = worker.dataflow(build)
        joined = worker.joining
        worker.step_until_done()
        return {"out": capture.by_time(), "read": source.rows_read, "joined": joined,
                "left": worker.left,
                "ranges": [r for ranges in source.epochs.values() for r in ranges.items()]}

    return run


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_directory_word_count_sources_follow_a_joining_and_a_leaving_worker(
        runtime: str, tmp_path: Path) -> None:
    directory_case(runtime, tmp_path)


@pytest.mark.spark
def test_directory_word_count_sources_follow_workers_on_spark(spark: Any,
                                                              tmp_path: Path) -> None:
    """The joining worker is a one-task barrier stage of its own on the same session."""
    directory_case("spark", tmp_path, spark=spark)


def test_replacing_a_worker_hands_its_share_of_the_directory_to_the_new_one(
        tmp_path: Path) -> None:
    """A rolling upgrade step of a job whose workers read a directory: worker 1 is replaced
    by worker 2, which takes worker 1's files and bins."""
    directory_case("thread", tmp_path, replace=True)


def directory_case(runtime: str, tmp_path: Path, replace: bool = False,
                   **options: Any) -> None:
    """Files keep arriving while 2 workers count their words; a third joins with a share of
    the directory at a random time, later worker 1 (one the job started with) leaves and
    hands its share away (``replace``: worker 1 is replaced by the third in one step)."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        i = 0
        while not stop.is_set() or i < 10:
            drop(inbox, f"part-{i:04d}.csv", file_lines(i))
            written.append(i)
            i += 1
            time.sleep(0.02)
        (inbox / "_END").touch()

    handle = start(directory_word_count(str(inbox)), workers=2, runtime=runtime, bins=BINS,
                   slots=3, **options)
    handle.move_sources = True
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        rng = random.Random()
        time.sleep(rng.uniform(0.1, 0.5))
        if replace:
            assert handle.replace_worker(1) == 2  # 1's files and bins go to 2, then 1 leaves
        else:
            assert handle.scale(3) == [0, 1, 2]  # joins with a share of the directory
            time.sleep(rng.uniform(0.4, 0.8))
            handle.remove_worker(1)  # hands its share to workers 0 and 2
        time.sleep(0.4)
    finally:
        stop.set()
        thread.join()
    results = handle.result(timeout=120)
    expected = Counter(w for i in written for line in file_lines(i) for w in line.split())
    final: dict[str, int] = {}
    for r in results:
        for records in r["out"].values():
            for word, count in records:
                final[word] = max(final.get(word, 0), count)
    assert final == dict(expected)
    assert results[1]["left"] and results[2]["joined"]
    assert results[2]["read"] > 0, "the joined worker read no line"
    # every line of every file read once: each file's ranges, over the workers, tile it
    read: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for w, r in enumerate(results):
        for name, span in r["ranges"]:
            read.setdefault(w, {}).setdefault(name, []).append(tuple(span))
    tiles(read, {f"part-{i:04d}.csv": len(file_lines(i)) for i in written})
    moves = handle.source_moves
    if replace:
        assert [(m.mode, m.roster) for m in moves] == [("names", [0, 2])]
    else:
        assert [(m.mode, m.roster) for m in moves] == [("names", [0, 1, 2]), ("names", [0, 2])]


def test_a_timed_directory_source_refuses_to_hand_over_and_joined_jobs_to_snapshot(
        tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def job(worker: Any) -> None:
        def build(scope: Any) -> None:
            directory_source(scope, "Timed", str(inbox), format="csv", time="t", poll=0.03)

        worker.dataflow(build)
        worker.step_until_done()

    handle = start(job, workers=2, runtime="thread", bins=BINS, slots=3)
    try:
        time.sleep(0.2)
        with pytest.raises(HandoverError, match="time column"):
            handle.add_worker(sources=True)  # it joins; the fences are lifted again
        with pytest.raises(ValueError, match="not snapshotted"):
            handle.snapshot(str(tmp_path / "snapshot"))
    finally:
        (inbox / "_END").touch()
    handle.result(timeout=60)  # the job still ends: no source stays fenced


def test_a_source_the_job_paused_refuses_to_hand_over_naming_its_pause() -> None:
    """A handover while the job holds its own source at ``pause_at`` is refused, and the error
    says the job paused it (not a snapshot round, which holds it with ``hold_at``)."""
    from tokenflow.io.sources import replayable_source, table_splits

    table = pa.table({"t": list(range(100)), "v": list(range(100))})
    gate = threading.Event()
    paused: list[int] = []

    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            return replayable_source(scope, "Paused", table_splits(table, 4, time="t"), "t",
                                     pause_at=40, max_rows=10)[1]

        source = worker.dataflow(build)
        if worker.index < 2:
            worker.step_while(lambda: not source.paused)
            paused.append(worker.index)
            while not gate.is_set():
                worker.step_or_park()
            source.resume()
        worker.step_until_done()

    handle = start(job, workers=2, runtime="thread", bins=BINS, slots=3)
    try:
        deadline = time.monotonic() + 30
        while len(paused) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(HandoverError, match=r"'Paused' is paused by the job \(pause_at 40\)"):
            handle.add_worker(sources=True)
    finally:
        gate.set()
    handle.result(timeout=60)
