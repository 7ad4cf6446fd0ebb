"""tokenflow side by side with peer engines (issue 19, item 6): same machine, same input, one
run at a time.

Writes ``benchmarks/results/peers.md`` and ``peers.png`` (and prints the tables).

Engines: tokenflow on its ``thread``, ``process`` and ``spark`` (embedded ``local[2]``) runtimes
with 2 workers; Spark Structured Streaming on ``local[2]``; Bytewax with 2 processes (one worker
each); Pathway with 2 threads.  Bytewax and Pathway are the optional ``.[bench]`` dependencies;
an engine that is not installed is reported as such.

Workloads, generated once per run into a temporary directory and read by every engine:

* **word count**: ``--epochs`` epochs (default 100) of ``--words`` words (default 100,000) drawn
  with numpy from a fixed seed from a Zipf vocabulary of 10,000 made-up words, one Parquet file
  per epoch.  Every engine emits, per epoch, one ``(word, running count)`` row per distinct word
  of the epoch; the rows of every epoch are checked equal to a plain Python ``Counter`` loop.
* **NEXMark q1, q2, q5, q7**: the bids of ``--events`` events (default 300,000 at 10,000 events/s
  of event time) from ``tokenflow.nexmark.generator``, one Parquet file per 1 s epoch of event
  time.  Every engine's output is checked equal, as a multiset, to tokenflow's (thread runtime),
  whose queries the project's tests check against Spark SQL.

Protocol, the same for every engine: closed loop, **one epoch in flight**: epoch ``e + 1`` is
offered to the engine once the engine has emitted all of epoch ``e``'s output, and the engine
runs as fast as it can.  **Epoch latency** is the time from the epoch's input being offered to
the engine (the first moment any of it is handed over) to the engine's sink holding all of that
epoch's output (the last moment, over workers).  Per engine:

* tokenflow: offered when the worker loop sends the epoch (word count) or lifts the source's
  limit to let it through (NEXMark, ``SourceHandle.limit``); done when the probe on the query
  output passes the epoch on every worker.
* Spark Structured Streaming: a file stream source (``maxFilesPerTrigger=1``, one file per
  epoch, ``Trigger.AvailableNow``), so micro-batch ``e`` is epoch ``e``; offered at the
  micro-batch's trigger time (``StreamingQueryProgress.timestamp``, ms); done when
  ``foreachBatch`` has the batch's rows on the driver (``DataFrame.toArrow``).
* Bytewax: each worker's source partition hands the epoch over in one ``next_batch`` call (the
  time it returns) followed by an end-of-epoch marker for every shard; done when the sinks have
  the markers every stateful step emits once it has its inputs' markers.  Bytewax has no
  frontiers, so epoch completeness is these markers (user code).
* Pathway: a ``ConnectorSubject`` pushes the epoch's rows and commits (offered when it starts);
  done at ``pw.io.subscribe``'s ``on_time_end`` for the time of a marker row that flows with the
  epoch to the output.

For q5 and q7 (windows of 10 s) the results also give a **window latency**: from the offer of
the epoch holding a window's last events to the sink receiving the window's rows, for the
windows that end before the last epoch (an engine that closes windows by watermark needs to see
the next epoch).  Throughput is input records (words or bids) per second from epoch 1's offer
to the last epoch's done: epoch 0 is a warm-up for every engine and is left out of throughput
and latencies.

Each engine runs in its own child process (Bytewax's two processes are children of it), one
at a time, all workloads in turn; a workload that fails is reported as such.  Run:
``.venv/bin/python benchmarks/peers.py [--quick] [--engines ...] [--workloads ...]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pickle
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKERS = 2
SEED = 19
VOCABULARY = 10_000
SHARDS = 64
"""Keys of Bytewax's stateful steps (word count, q5/q7 first stage): words or auctions hashed."""
EPOCH_MS = 1000
QUERIES = ("q1", "q2", "q5", "q7")
WORKLOADS = ("wordcount", *QUERIES)
ENGINES = ("tokenflow-thread", "tokenflow-process", "tokenflow-spark", "spark-streaming", "bytewax",
           "pathway")
PEER_PACKAGE = {"bytewax": "bytewax", "pathway": "pathway", "spark-streaming": "pyspark"}
COLUMNS = {
    "q1": ["auction", "bidder", "price", "dateTime"],
    "q2": ["auction", "price"],
    "q5": ["window_start", "window_end", "auction", "count"],
    "q7": ["window_start", "window_end", "auction", "bidder", "price", "dateTime"],
}
WINDOW_MS = {"q5": 10_000, "q7": 10_000}
BID_DDL = "auction BIGINT, bidder BIGINT, price BIGINT, dateTime BIGINT, extra STRING"
MARKER_WORD = "\x00epoch"
"""Pathway's word count counts this word once per epoch: its count names the epoch."""
MTIME = 1_600_000_000
"""Modification time of epoch 0's files (Spark's file source takes the oldest first)."""

# -- input and the word count's logic ----------------------------------------------------------


def vocabulary() -> list[str]:
    """``VOCABULARY`` distinct made-up lower-case words of 2-12 letters (fixed seed)."""
    rng = np.random.default_rng(SEED)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        length = int(rng.integers(2, 13))
        words.setdefault(letters[rng.integers(0, 26, length)].tobytes().decode(), None)
    return list(words)


def emit_running(counts: Counter[str], totals: dict[str, int]) -> list[tuple[str, int]]:
    """Add an epoch's ``counts`` to ``totals``; the epoch's ``(word, running count)`` rows."""
    out = []
    for word, n in counts.items():
        total = totals.get(word, 0) + n
        totals[word] = total
        out.append((word, total))
    return out


def epoch_digest(records: list[tuple[Any, Any]]) -> str:
    """One hash of an epoch's ``(word, count)`` rows, independent of their order."""
    canonical = sorted((str(w), int(c)) for w, c in records)
    return hashlib.sha256(repr(canonical).encode()).hexdigest()


def write_inputs(root: Path, epochs: int, words: int, events: int) -> dict[str, Any]:
    """The words and the bids, one Parquet file per epoch, and the word count's reference."""
    from tokenflow.nexmark import GeneratorConfig, generate

    rng = np.random.default_rng((SEED, 1))
    vocab = pa.array(vocabulary(), pa.string())
    p = 1.0 / np.arange(1, VOCABULARY + 1)
    p /= p.sum()
    (root / "words").mkdir(parents=True)
    totals: dict[str, int] = {}
    reference = []
    for e in range(epochs):
        table = pa.table({"word": vocab.take(pa.array(rng.choice(VOCABULARY, size=words, p=p)))})
        path = root / "words" / f"epoch-{e:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (MTIME + e, MTIME + e))
        reference.append(epoch_digest(emit_running(Counter(table.column("word").to_pylist()), totals)))

    bid = generate(0, events, GeneratorConfig())["bid"]
    bids = bid if isinstance(bid, pa.Table) else pa.Table.from_batches([bid])
    bids = bids.sort_by("dateTime")
    times = bids.column("dateTime").to_numpy()
    starts = np.unique(times - times % EPOCH_MS)
    bounds = np.searchsorted(times, np.r_[starts, starts[-1] + EPOCH_MS])
    for folder in ("bid", "spark"):
        (root / "nexmark" / folder).mkdir(parents=True)
    for i in range(len(starts)):
        path = root / "nexmark" / "bid" / f"epoch-{i:05d}.parquet"
        pq.write_table(bids.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])), path)
        os.utime(path, (MTIME + i, MTIME + i))
        shutil.copy2(path, root / "nexmark" / "spark" / path.name)
    # Spark's watermark closes a window only when a later event arrives: one bid a day after
    # the last event ends its stream (its own windows never close, so it adds no output row).
    sentinel = pa.table({"auction": [1], "bidder": [1], "price": [1],
                         "dateTime": [int(times[-1]) + 86_400_000], "extra": [""]}, schema=bids.schema)
    path = root / "nexmark" / "spark" / f"epoch-{len(starts):05d}.parquet"
    pq.write_table(sentinel, path)
    os.utime(path, (MTIME + len(starts), MTIME + len(starts)))
    meta = {
        "epochs": epochs, "words": [words] * epochs, "wordcount_reference": reference,
        "bid_epochs": [int(t) for t in starts], "bids": [int(n) for n in np.diff(bounds)],
        "events": events,
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return meta


def epoch_count(meta: dict[str, Any], workload: str) -> int:
    return meta["epochs"] if workload == "wordcount" else len(meta["bid_epochs"])


def input_counts(meta: dict[str, Any], workload: str) -> list[int]:
    return meta["words"] if workload == "wordcount" else meta["bids"]


# -- tokenflow ---------------------------------------------------------------------------------


def count_lists(words: Any) -> Any:
    """The README-style word count: exchange, a Counter per pending epoch, running totals."""

    def constructor(capability: Any, info: Any) -> Any:
        capability.drop()
        pending: dict[int, tuple[Any, Counter[str]]] = {}
        totals: dict[str, int] = {}

        def logic(input: Any, output: Any) -> None:
            for ref, batch in input:
                if ref.time not in pending:
                    pending[ref.time] = (ref.retain(), Counter())
                pending[ref.time][1].update(batch)
            for epoch in sorted(pending):
                if input.frontier.less_equal(epoch):
                    break
                token, counts = pending.pop(epoch)
                output.session(token).give_batch(emit_running(counts, totals))
                token.drop()

        return logic

    return words.exchange().unary_frontier("pipeline", "CountWords", constructor)


def tokenflow_wordcount_job(directory: str, epochs: int) -> Callable[[Any], Any]:
    def job(worker: Any) -> dict[str, Any]:
        halves = []
        for e in range(epochs):
            column = pq.read_table(f"{directory}/epoch-{e:05d}.parquet").column("word")
            lo = len(column) * worker.index // worker.peers
            hi = len(column) * (worker.index + 1) // worker.peers
            halves.append(column.slice(lo, hi - lo).to_pylist())
        seen: list[tuple[int, Any]] = []

        def build(scope: Any) -> tuple[Any, Any]:
            inp, stream = scope.new_input()
            probe = count_lists(stream).inspect_batch(lambda t, b: seen.append((t, b))).probe()
            return inp, probe

        inp, probe = worker.dataflow(build)
        offered, done = [], []
        for e in range(epochs):
            offered.append(time.time())
            inp.send_batch(halves[e])
            inp.advance_to(e + 1)
            worker.step_while(lambda: probe.less_than(e + 1))  # noqa: B023 - called at once
            done.append(time.time())
        inp.close()
        worker.step_while(lambda: not probe.done())
        records: dict[int, list[Any]] = {}
        for t, batch in seen:
            records.setdefault(t, []).extend(batch)
        return {"offered": offered, "done": done, "records": records}

    return job


def tokenflow_nexmark_job(directory: str, name: str, epoch_list: list[int]) -> Callable[[Any], Any]:
    """The query of ``tokenflow.nexmark.queries`` over the bid files, one epoch in flight (the
    loop of ``tokenflow.nexmark.run.run_query`` with ``lag=1``), output batches timed."""

    def job(worker: Any) -> dict[str, Any]:
        from tokenflow.io.sources import replayable_source, table_splits
        from tokenflow.nexmark.generator import GeneratorConfig
        from tokenflow.nexmark.queries import load

        bids = pq.read_table(directory)
        query = load(name)
        seen: list[tuple[float, int, Any]] = []

        def build(scope: Any) -> tuple[Any, Any]:
            stream, handle = replayable_source(scope, "Peers.bid", table_splits(bids, 16, time="dateTime"),
                                               "dateTime", granularity=EPOCH_MS)
            out = query.build({"bid": stream}, GeneratorConfig())
            probe = out.inspect_batch(lambda t, b: seen.append((time.time(), t, b))).probe()
            return handle, probe

        handle, probe = worker.dataflow(build)
        offered: dict[int, float] = {}
        passed: dict[int, float] = {}
        done = 0
        while True:
            now = time.time()
            while done < len(epoch_list) and not probe.less_equal(epoch_list[done]):
                passed[epoch_list[done]] = now
                done += 1
            if probe.done():
                break
            if done < len(epoch_list) and epoch_list[done] not in offered:
                offered[epoch_list[done]] = now
            handle.limit(epoch_list[done + 1] if done + 1 < len(epoch_list) else None)
            worker.step_or_park()
        finish = time.time()
        handle.limit(None)
        for t in epoch_list[done:]:
            passed.setdefault(t, finish)
        return {"offered": offered, "passed": passed,
                "rows": [(at, t, b) for at, t, b in seen if b.num_rows]}

    return job


def run_tokenflow(runtime: str, workload: str, data: Path, meta: dict[str, Any]) -> dict[str, Any]:
    from tokenflow import execute

    options: dict[str, Any] = {"master": f"local[{WORKERS}]"} if runtime == "spark" else {}
    if workload == "wordcount":
        epochs = meta["epochs"]
        results = execute(tokenflow_wordcount_job(str(data / "words"), epochs), workers=WORKERS,
                          runtime=runtime, **options)
        merged: dict[int, list[Any]] = {}
        for r in results:
            for t, records in r["records"].items():
                merged.setdefault(t, []).extend(records)
        return {"offered": [min(r["offered"][e] for r in results) for e in range(epochs)],
                "done": [max(r["done"][e] for r in results) for e in range(epochs)],
                "digests": [epoch_digest(merged.get(e, [])) for e in range(epochs)]}
    epoch_list = meta["bid_epochs"]
    results = execute(tokenflow_nexmark_job(str(data / "nexmark" / "bid"), workload, epoch_list),
                      workers=WORKERS, runtime=runtime, **options)
    windows: dict[int, float] = {}
    batches = []
    for r in results:
        for at, t, batch in r["rows"]:
            batches.append(batch)
            windows[t] = max(windows.get(t, 0.0), at)
    return {"offered": [min(r["offered"][t] for r in results) for t in epoch_list],
            "done": [max(r["passed"][t] for r in results) for t in epoch_list],
            "windows": windows if workload in WINDOW_MS else {},
            "table": pa.Table.from_batches(batches).select(COLUMNS[workload]) if batches else None}


# -- Spark Structured Streaming ----------------------------------------------------------------


def spark_query(name: str, bids: Any) -> Any:
    """NEXMark ``name`` on a streaming DataFrame of bids (append mode, 0 s watermark)."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual alias

    if name == "q1":
        return bids.select("auction", "bidder", F.expr("price * 89 DIV 100").alias("price"), "dateTime")
    if name == "q2":
        return bids.where("auction % 123 = 0").select("auction", "price")
    bids = bids.withColumn("ts", F.timestamp_millis("dateTime")).withWatermark("ts", "0 seconds")
    if name == "q5":  # two chained streaming aggregations (Spark >= 3.4): counts, then the max
        counts = bids.groupBy(F.window("ts", "10 seconds", "5 seconds"), "auction").count()
        best = counts.groupBy(F.window_time("window").alias("end")).agg(
            F.max("count").alias("top"), F.collect_list(F.struct("window", "auction", "count")).alias("rows"))
        return (best.select(F.explode(F.filter("rows", lambda r: r["count"] == F.col("top"))).alias("r"))
                .select(F.unix_millis("r.window.start").alias("window_start"),
                        F.unix_millis("r.window.end").alias("window_end"), "r.auction", "r.count"))
    # q7: a streaming aggregation cannot keep "every row with the maximum", so the window's bids
    # are collected and the maximum ones kept after it (stateless)
    top = bids.groupBy(F.window("ts", "10 seconds")).agg(
        F.max("price").alias("top"),
        F.collect_list(F.struct("auction", "bidder", "price", "dateTime")).alias("rows"))
    return (top.select(F.unix_millis("window.start").alias("window_start"),
                       F.unix_millis("window.end").alias("window_end"),
                       F.explode(F.filter("rows", lambda r: r["price"] == F.col("top"))).alias("r"))
            .select("window_start", "window_end", "r.auction", "r.bidder", "r.price", "r.dateTime"))


def run_spark_streaming(spark: Any, workload: str, data: Path, meta: dict[str, Any],
                        scratch: Path) -> dict[str, Any]:
    if workload == "wordcount":
        source = spark.readStream.schema("word STRING").option("maxFilesPerTrigger", 1).parquet(
            str(data / "words"))
        query, mode = source.groupBy("word").count(), "update"
    else:
        folder = "spark" if workload in WINDOW_MS else "bid"
        source = spark.readStream.schema(BID_DDL).option("maxFilesPerTrigger", 1).parquet(
            str(data / "nexmark" / folder))
        query, mode = spark_query(workload, source), "append"
    batches: dict[int, tuple[float, pa.Table]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        table = frame.toArrow()
        batches[batch_id] = (time.time(), table)

    stream = (query.writeStream.outputMode(mode).foreachBatch(sink).trigger(availableNow=True)
              .option("checkpointLocation", str(scratch / f"spark-{workload}")).start())
    stream.awaitTermination()
    progress = {p["batchId"]: p for p in stream.recentProgress}
    n = epoch_count(meta, workload)
    expected = input_counts(meta, workload)
    for e in range(n):
        if progress[e]["numInputRows"] != expected[e]:
            raise RuntimeError(f"micro-batch {e} read {progress[e]['numInputRows']} rows, epoch {e} "
                               f"has {expected[e]}: batches are not epochs")
    offered = [datetime.fromisoformat(progress[e]["timestamp"]).timestamp() for e in range(n)]
    done = [batches[e][0] for e in range(n)]
    if workload == "wordcount":
        digests = [epoch_digest(zip(*(batches[e][1].column(c).to_pylist() for c in ("word", "count")),
                                    strict=True)) for e in range(n)]  # type: ignore[arg-type]
        return {"offered": offered, "done": done, "digests": digests}
    windows: dict[int, float] = {}
    tables = []
    for at, table in batches.values():
        if table.num_rows:
            tables.append(table.select(COLUMNS[workload]))
            if workload in WINDOW_MS:
                for end in set(table.column("window_end").to_pylist()):
                    windows[end] = max(windows.get(end, 0.0), at)
    return {"offered": offered, "done": done, "windows": windows,
            "table": pa.concat_tables(tables) if tables else None}


# -- Bytewax -----------------------------------------------------------------------------------


def run_bytewax(workload: str, data: Path, meta: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Two Bytewax processes (``bytewax.testing.cluster_main``, one worker each) on this host."""
    n = epoch_count(meta, workload)
    gate = scratch / f"bytewax-{workload}.gate"
    np.memmap(gate, dtype=np.int64, mode="w+", shape=(WORKERS, n + 1)).flush()
    ports = []
    for _ in range(WORKERS):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    procs = []
    for p in range(WORKERS):
        log = (scratch / f"bytewax-{workload}-{p}.log").open("w")
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--bytewax-proc", str(p), "--data", str(data),
             "--workloads", workload, "--ports", ",".join(ports), "--gate", str(gate),
             "--result", str(scratch / f"bytewax-{workload}-{p}.pkl")],
            stdout=log, stderr=subprocess.STDOUT))
    for p, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise RuntimeError("Bytewax processes did not finish in 900 s") from None
        if rc:
            tail = (scratch / f"bytewax-{workload}-{p}.log").read_text()[-1500:]
            raise RuntimeError(f"Bytewax process {p} exited with {rc}: {tail}")
    parts = [pickle.loads((scratch / f"bytewax-{workload}-{p}.pkl").read_bytes()) for p in range(WORKERS)]
    offered = [min(part["offered"][e] for part in parts) for e in range(n)]
    marks: dict[int, float] = {}
    for part in parts:
        for e, at in part["done"]:
            marks[e] = max(marks.get(e, 0.0), at)
    done = [marks[e] for e in range(n)]
    if workload == "wordcount":
        merged: dict[int, list[Any]] = {}
        for part in parts:
            for e, records in part["records"].items():
                merged.setdefault(e, []).extend(records)
        return {"offered": offered, "done": done,
                "digests": [epoch_digest(merged.get(e, [])) for e in range(n)]}
    rows = [row for part in parts for row in part["rows"]]
    windows: dict[int, float] = {}
    for part in parts:
        for end, at in part["windows"].items():
            windows[end] = max(windows.get(end, 0.0), at)
    table = pa.table([pa.array(c, pa.int64()) for c in zip(*rows, strict=True)],
                     names=COLUMNS[workload]) if rows else None
    return {"offered": offered, "done": done, "windows": windows, "table": table}


def bytewax_process(args: argparse.Namespace) -> None:
    """One Bytewax process of ``run_bytewax``: build the flow, run it, pickle what it saw."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import DynamicSource, StatelessSourcePartition
    from bytewax.operators import StatefulBatchLogic
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import cluster_main

    proc, workload, data = args.bytewax_proc, args.workloads[0], Path(args.data)
    meta = json.loads((data / "meta.json").read_text())
    n = epoch_count(meta, workload)
    gate = np.memmap(args.gate, dtype=np.int64, mode="r+", shape=(WORKERS, n + 1))
    keys = [str(s) for s in range(SHARDS)]
    # markers each epoch's done needs at the sinks (of both processes together)
    needed = {"wordcount": SHARDS, "q1": WORKERS, "q2": WORKERS}.get(workload, 1)

    # -- this worker's share of every epoch, as items, before the run --
    items: list[list[Any]] = []
    if workload == "wordcount":
        for e in range(n):
            column = pq.read_table(data / "words" / f"epoch-{e:05d}.parquet").column("word")
            lo, hi = len(column) * proc // WORKERS, len(column) * (proc + 1) // WORKERS
            items.append(column.slice(lo, hi - lo).to_pylist() + [("END", e, proc, k) for k in keys])
    else:
        for e in range(n):
            bids = pq.read_table(data / "nexmark" / "bid" / f"epoch-{e:05d}.parquet")
            rows = list(zip(*(bids.column(c).to_pylist() for c in ("auction", "bidder", "price", "dateTime")),
                            strict=True))[proc::WORKERS]
            markers = [("END", e, proc)] if workload in ("q1", "q2") else [("END", e, proc, k) for k in keys]
            items.append(rows + markers)
        if workload in WINDOW_MS:  # end of input: close every window
            items.append([("END", n, proc, k) for k in keys])
    bounds = [t + EPOCH_MS for t in meta.get("bid_epochs", [])] + [2**62]
    offered: dict[int, float] = {}
    seen: dict[str, Any] = {"done": [], "records": {}, "rows": [], "windows": {}}

    class Partition(StatelessSourcePartition):
        def __init__(self) -> None:
            self.epoch = 0
            self.awake: datetime | None = None

        def next_batch(self) -> list[Any]:
            e = self.epoch
            if e >= len(items):
                raise StopIteration
            if e > 0 and int(gate[:, e - 1].sum()) < needed:  # one epoch in flight
                self.awake = datetime.now(UTC) + timedelta(microseconds=200)
                return []
            self.awake = None
            self.epoch += 1
            offered[e] = time.time()
            return items[e]

        def next_awake(self) -> datetime | None:
            return self.awake

    class Source(DynamicSource):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Partition:
            return Partition()

    class SinkPartition(StatelessSinkPartition):
        def write_batch(self, batch: list[Any]) -> None:
            now = time.time()
            for item in batch:
                if workload in ("q1", "q2"):
                    if item[0].__class__ is str:
                        seen["done"].append((item[1], now))
                        gate[proc, item[1]] += 1
                    else:
                        seen["rows"].append(item)
                    continue
                value = item[1]
                if workload == "wordcount":
                    seen["records"].setdefault(value[0], []).extend(value[1])
                    seen["done"].append((value[0], now))
                    gate[proc, value[0]] += 1
                elif value[0] == "END":
                    seen["done"].append((value[1], now))
                    gate[proc, value[1]] += 1
                else:
                    seen["rows"].extend(value[2])
                    seen["windows"][value[1] + WINDOW_MS[workload]] = now

        def close(self) -> None:
            pass

    class Sink(DynamicSink):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> SinkPartition:
            return SinkPartition()

    class WordCount(StatefulBatchLogic):
        """Per shard of words: this epoch's counts; emitted once both partitions' markers came."""

        def __init__(self) -> None:
            self.pending: Counter[str] = Counter()
            self.totals: dict[str, int] = {}
            self.markers = 0

        def on_batch(self, values: list[Any]) -> tuple[list[Any], bool]:
            out, run = [], []
            for v in values:
                if v.__class__ is str:
                    run.append(v)
                    continue
                self.pending.update(run)
                run = []
                self.markers += 1
                if self.markers == WORKERS:
                    self.markers = 0
                    out.append((v[1], emit_running(self.pending, self.totals)))
                    self.pending = Counter()
            self.pending.update(run)
            return out, False

        def snapshot(self) -> None:
            return None

    class WindowStage(StatefulBatchLogic):
        """q5/q7 per key: open windows closed once ``inputs`` markers of an epoch came; the first
        stage (per shard of auctions) sends its candidates, the second (one key) the maxima."""

        def __init__(self, first: bool) -> None:
            self.first = first
            self.inputs = WORKERS if first else SHARDS
            self.windows: dict[int, Any] = {}
            self.markers: dict[int, int] = {}

        def add(self, v: Any) -> None:
            if workload == "q7":  # v: a bid (first stage) or ("W", start, rows)
                rows = [v] if self.first else v[2]
                start = v[3] - v[3] % WINDOW_MS["q7"] if self.first else v[1]
                best = self.windows.get(start)
                top = rows[0][2]
                if best is None or top > best[0]:
                    self.windows[start] = [top, list(rows)]
                elif top == best[0]:
                    best[1].extend(rows)
            elif self.first:  # q5, a bid: counted in its two sliding windows
                last = v[3] - v[3] % 5000
                for start in (last - 5000, last):
                    self.windows.setdefault(start, Counter())[v[0]] += 1
            else:  # q5 candidates (auction, count) of one shard
                best = self.windows.get(v[1])
                top = v[2][0][1]
                if best is None or top > best[0]:
                    self.windows[v[1]] = [top, list(v[2])]
                elif top == best[0]:
                    best[1].extend(v[2])

        def close(self, bound: int) -> list[Any]:
            out = []
            for start in sorted(s for s in self.windows if s + WINDOW_MS[workload] <= bound):
                held = self.windows.pop(start)
                if workload == "q5" and self.first:
                    top = max(held.values())
                    out.append(("W", start, [(a, c) for a, c in held.items() if c == top]))
                elif workload == "q5":
                    out.append(("W", start, [(start, start + 10_000, a, c) for a, c in held[1]]))
                elif self.first:
                    out.append(("W", start, held[1]))
                else:
                    out.append(("W", start, [(start, start + 10_000, *row) for row in held[1]]))
            return out

        def on_batch(self, values: list[Any]) -> tuple[list[Any], bool]:
            out = []
            for v in values:
                if v[0] != "END":
                    self.add(v)
                    continue
                count = self.markers.get(v[1], 0) + 1
                if count < self.inputs:
                    self.markers[v[1]] = count
                    continue
                self.markers.pop(v[1], None)
                out.extend(self.close(bounds[v[1]]))
                out.append(("END", v[1]))
            return out, False

        def snapshot(self) -> None:
            return None

    flow = Dataflow(f"peers_{workload}")
    stream = op.input("bids" if workload != "wordcount" else "words", flow, Source())
    if workload == "wordcount":
        keyed = op.key_on("shard", stream,
                          lambda x: x[3] if x.__class__ is tuple else keys[zlib.crc32(x.encode()) % SHARDS])
        op.output("out", op.stateful_batch("count", keyed, lambda _: WordCount()), Sink())
    elif workload == "q1":
        op.output("out", op.map("q1", stream, lambda b: b if b[0].__class__ is str else
                                (b[0], b[1], b[2] * 89 // 100, b[3])), Sink())
    elif workload == "q2":
        op.output("out", op.filter_map("q2", stream, lambda b: b if b[0].__class__ is str else
                                       ((b[0], b[2]) if b[0] % 123 == 0 else None)), Sink())
    else:
        keyed = op.key_on("shard", stream, lambda x: x[3] if x[0].__class__ is str else keys[x[0] % SHARDS])
        local = op.stateful_batch("local", keyed, lambda _: WindowStage(first=True))
        merged = op.map("all", local, lambda kv: ("all", kv[1]))
        op.output("out", op.stateful_batch("global", merged, lambda _: WindowStage(first=False)), Sink())

    addresses = [f"127.0.0.1:{port}" for port in args.ports.split(",")]
    cluster_main(flow, addresses, proc)
    seen["offered"] = offered
    Path(args.result).write_bytes(pickle.dumps(seen))


# -- Pathway -----------------------------------------------------------------------------------


def pathway_query(pw: Any, name: str, bids: Any) -> Any:
    if name == "q1":
        return bids.select(auction=pw.this.auction, bidder=pw.this.bidder,
                           price=pw.this.price * 89 // 100, dateTime=pw.this.dateTime)
    if name == "q2":
        return bids.filter(pw.this.auction % 123 == 0).select(pw.this.auction, pw.this.price)
    behavior = pw.temporal.exactly_once_behavior()
    if name == "q5":
        counts = bids.windowby(bids.dateTime, window=pw.temporal.sliding(hop=5000, duration=10_000, origin=0),
                               instance=bids.auction, behavior=behavior).reduce(
            window_start=pw.this._pw_window_start, window_end=pw.this._pw_window_end,
            auction=pw.this._pw_instance, count=pw.reducers.count())
        top = counts.groupby(counts.window_start).reduce(counts.window_start,
                                                         top=pw.reducers.max(counts["count"]))
        return counts.join(top, counts.window_start == top.window_start,
                           counts["count"] == top.top).select(
            counts.window_start, counts.window_end, counts.auction, counts["count"])
    top = bids.windowby(bids.dateTime, window=pw.temporal.tumbling(duration=10_000, origin=0),
                        behavior=behavior).reduce(
        window_start=pw.this._pw_window_start, window_end=pw.this._pw_window_end,
        top=pw.reducers.max(pw.this.price))
    windowed = bids.select(pw.this.auction, pw.this.bidder, pw.this.price, pw.this.dateTime,
                           window_start=pw.this.dateTime - pw.this.dateTime % 10_000)
    return top.join(windowed, top.window_start == windowed.window_start, top.top == windowed.price).select(
        top.window_start, top.window_end, windowed.auction, windowed.bidder, windowed.price,
        windowed.dateTime)


def run_pathway(workload: str, data: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Pathway in this process (``PATHWAY_THREADS=2``), fed by a ``ConnectorSubject``."""
    import pathway as pw
    from pathway.internals.parse_graph import G

    G.clear()
    n = epoch_count(meta, workload)
    payloads: list[list[dict[str, Any]]] = []
    if workload == "wordcount":
        for e in range(n):
            words = pq.read_table(data / "words" / f"epoch-{e:05d}.parquet").column("word").to_pylist()
            payloads.append([{"words": words[i:i + 10_000]} for i in range(0, len(words), 10_000)]
                            + [{"words": [MARKER_WORD]}])
    else:
        for e in range(n):
            bids = pq.read_table(data / "nexmark" / "bid" / f"epoch-{e:05d}.parquet")
            columns = {c: bids.column(c).to_pylist() for c in ("auction", "bidder", "price", "dateTime")}
            rows = [{"marker": False, "idx": e, "auction": a, "bidder": b, "price": p, "dateTime": d}
                    for a, b, p, d in zip(*columns.values(), strict=True)]
            payloads.append(rows + [{"marker": True, "idx": e, "auction": 0, "bidder": 0, "price": 0,
                                     "dateTime": int(meta["bid_epochs"][e])}])
    gate = threading.Event()
    gate.set()
    offered: dict[int, float] = {}
    done: dict[int, float] = {}
    epochs_at: dict[int, list[int]] = {}  # Pathway time -> epochs whose marker it holds
    pending: dict[int, list[Any]] = {}  # Pathway time -> word count rows
    records: dict[int, list[Any]] = {}
    rows: Counter[tuple[int, ...]] = Counter()
    windows: dict[int, float] = {}
    failure: list[BaseException] = []

    class Subject(pw.io.python.ConnectorSubject):
        def run(self) -> None:
            for e, payload in enumerate(payloads):
                while not gate.wait(1.0):  # one epoch in flight
                    if failure:
                        return
                gate.clear()
                offered[e] = time.time()
                for row in payload:
                    self.next(**row)
                self.commit()

    if workload == "wordcount":
        class WordsSchema(pw.Schema):
            words: list[str]

        table = pw.io.python.read(Subject(), schema=WordsSchema, autocommit_duration_ms=None)
        words = table.flatten(pw.this.words).select(word=pw.this.words)
        out = words.groupby(pw.this.word).reduce(pw.this.word, count=pw.reducers.count())

        def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            if not is_addition:
                return
            if row["word"] == MARKER_WORD:
                epochs_at.setdefault(time, []).append(row["count"] - 1)
            else:
                pending.setdefault(time, []).append((row["word"], row["count"]))
    else:
        class BidSchema(pw.Schema):
            marker: bool
            idx: int
            auction: int
            bidder: int
            price: int
            dateTime: int  # noqa: N815 - NEXMark's field name

        table = pw.io.python.read(Subject(), schema=BidSchema, autocommit_duration_ms=None)
        result = pathway_query(pw, workload, table.filter(~pw.this.marker))
        names = COLUMNS[workload]
        # a marker row per epoch joins the output, so every epoch has a time with a change
        markers = table.filter(pw.this.marker).select(
            **{names[0]: -1, names[1]: pw.this.idx}, **{c: -1 for c in names[2:]})
        out = pw.Table.concat_reindex(result, markers)

        def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            values = tuple(int(row[c]) for c in names)
            if values[0] == -1:
                if is_addition:
                    epochs_at.setdefault(time, []).append(values[1])
                return
            rows[values] += 1 if is_addition else -1
            if workload in WINDOW_MS:
                windows[values[1]] = max(windows.get(values[1], 0.0), _now())

    def on_time_end(time: int) -> None:
        now = _now()
        for e in epochs_at.pop(time, []):
            done[e] = now
            records[e] = pending.pop(time, [])
            gate.set()

    pw.io.subscribe(out, on_change=on_change, on_time_end=on_time_end)
    try:
        pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    except BaseException as exc:
        failure.append(exc)
        gate.set()
        raise
    if workload == "wordcount":
        if pending:
            raise RuntimeError(f"Pathway rows at times without an epoch marker: {sorted(pending)[:5]}")
        return {"offered": [offered[e] for e in range(n)], "done": [done[e] for e in range(n)],
                "digests": [epoch_digest(records.get(e, [])) for e in range(n)]}
    if any(c < 0 for c in rows.values()):
        raise RuntimeError("Pathway retracted a row it never inserted")
    flat = [r for r, c in rows.items() for _ in range(c)]
    table_out = pa.table([pa.array(c, pa.int64()) for c in zip(*flat, strict=True)],
                         names=COLUMNS[workload]) if flat else None
    return {"offered": [offered[e] for e in range(n)], "done": [done[e] for e in range(n)],
            "windows": windows, "table": table_out}


def _now() -> float:
    return time.time()


# -- one engine's child process ----------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run every requested workload on one engine; append one JSON line per workload."""
    engine, data = args.child, Path(args.data)
    meta = json.loads((data / "meta.json").read_text())
    scratch = Path(tempfile.mkdtemp(prefix=f"peers-{engine}-", dir=data))
    spark = None
    if engine == "spark-streaming":
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(f"local[{WORKERS}]").appName("peers")
                 .config("spark.sql.shuffle.partitions", str(WORKERS))
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    elif engine == "tokenflow-spark":
        from tokenflow.spark.session import get_session

        get_session(f"local[{WORKERS}]")
    try:
        for workload in args.workloads:
            start = time.time()
            try:
                if engine.startswith("tokenflow-"):
                    result = run_tokenflow(engine.split("-", 1)[1], workload, data, meta)
                elif engine == "spark-streaming":
                    result = run_spark_streaming(spark, workload, data, meta, scratch)
                elif engine == "bytewax":
                    result = run_bytewax(workload, data, meta, scratch)
                else:
                    result = run_pathway(workload, data, meta)
                result["status"] = "ok"
            except Exception as exc:  # reported in the table, not dropped
                traceback.print_exc()
                result = {"status": f"failed: {type(exc).__name__}: {str(exc).strip()[:300]}"}
            table = result.pop("table", None)
            if table is not None:
                path = data / "out" / f"{engine}-{workload}.parquet"
                path.parent.mkdir(exist_ok=True)
                pq.write_table(table.cast(pa.schema([(c, pa.int64()) for c in COLUMNS[workload]])), path)
                result["output"] = str(path)
            result.update(engine=engine, workload=workload, wall=time.time() - start)
            result["windows"] = {str(k): v for k, v in result.get("windows", {}).items()}
            with open(args.result, "a") as f:
                f.write(json.dumps(result) + "\n")
            print(f"  {engine} {workload}: {result['status']} ({result['wall']:.1f} s)", flush=True)
    finally:
        if spark is not None:
            spark.stop()
        elif engine == "tokenflow-spark":
            from tokenflow.spark.session import stop_session

            stop_session()


# -- the driver --------------------------------------------------------------------------------


def installed(engine: str) -> bool:
    package = PEER_PACKAGE.get(engine)
    return package is None or importlib.util.find_spec(package) is not None


def run_engine(engine: str, workloads: list[str], data: Path, timeout: float) -> list[dict[str, Any]]:
    """The engine's child process; a workload it did not report is a failed row."""
    result = data / f"result-{engine}.jsonl"
    log = data / f"log-{engine}.txt"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if engine == "pathway":
        env["PATHWAY_THREADS"] = str(WORKERS)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", engine, "--data", str(data),
               "--result", str(result), "--workloads", *workloads]
    reason = None
    with log.open("w") as out:
        try:
            proc = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  check=False)
            if proc.returncode:
                reason = f"child exited with {proc.returncode}"
        except subprocess.TimeoutExpired:
            reason = f"no result within {timeout:.0f} s"
    rows = [json.loads(line) for line in result.read_text().splitlines()] if result.exists() else []
    for line in log.read_text().splitlines():
        if line.startswith(f"  {engine} "):
            print(line, flush=True)
    got = {r["workload"] for r in rows}
    for workload in workloads:
        if workload not in got:
            rows.append({"engine": engine, "workload": workload,
                         "status": f"failed: {reason or 'not reported'}; log: "
                                   f"{log.read_text()[-300:].strip()!r}"})
    return rows


def check(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Set ``row['check']``: the word count against the plain loop, NEXMark against tokenflow."""
    import pandas as pd

    reference: dict[str, Any] = {}
    for workload in QUERIES:
        for engine in ENGINES[:3]:
            row = next((r for r in rows if r["engine"] == engine and r["workload"] == workload
                        and r["status"] == "ok"), None)
            if row is not None and row.get("output"):
                reference[workload] = (engine, _sorted_frame(pd.read_parquet(row["output"]), workload))
                break
    for row in rows:
        if row["status"] != "ok":
            row["check"] = "-"
            continue
        if row["workload"] == "wordcount":
            wrong = [e for e, (a, b) in enumerate(zip(row["digests"], meta["wordcount_reference"],
                                                      strict=True)) if a != b]
            row["check"] = "equal" if not wrong else f"DIFFERS in {len(wrong)} epochs (first {wrong[0]})"
            continue
        if row["workload"] not in reference:
            row["check"] = "no tokenflow reference"
            continue
        engine, expected = reference[row["workload"]]
        got = (_sorted_frame(pd.read_parquet(row["output"]), row["workload"]) if row.get("output")
               else expected.iloc[:0])
        if got.equals(expected):
            row["check"] = "equal" if engine != row["engine"] else "reference"
        else:
            row["check"] = f"DIFFERS ({len(got):,} rows, {engine} has {len(expected):,})"


def _sorted_frame(frame: Any, workload: str) -> Any:
    columns = COLUMNS[workload]
    frame = frame[columns].astype("int64")
    return frame.sort_values(columns, kind="stable").reset_index(drop=True)


def metrics(row: dict[str, Any], meta: dict[str, Any]) -> None:
    """Throughput and latency percentiles of a checked run (epoch 0 left out)."""
    counts = input_counts(meta, row["workload"])
    offered, done = row["offered"], row["done"]
    latencies = [1e3 * (d - o) for o, d in zip(offered[1:], done[1:], strict=True)]
    row["rate"] = sum(counts[1:]) / (done[-1] - offered[1])
    row["p50"], row["p99"] = (float(np.percentile(latencies, q)) for q in (50, 99))
    if row["workload"] in WINDOW_MS:
        epochs = meta["bid_epochs"]
        index = {t: i for i, t in enumerate(epochs)}
        window = []
        for end, at in row["windows"].items():
            last = int(end) - EPOCH_MS  # the epoch holding the window's last events
            if index.get(last, 0) >= 1 and int(end) <= epochs[-1]:
                window.append(1e3 * (at - offered[index[last]]))
        row["windows_n"] = len(window)
        if window:
            row["w50"], row["w99"] = (float(np.percentile(window, q)) for q in (50, 99))


METHOD = [
    "## How each engine ran and was timed",
    "",
    "One epoch in flight everywhere: epoch e + 1 is offered once all of epoch e's output is at the "
    "sink. Epoch latency = done - offered; records/s = input records of epochs 1.. over the time "
    "from epoch 1's offer to the last epoch's done.",
    "",
    "* **tokenflow** (`thread`, `process`, `spark` on embedded `local[2]`; 2 workers): word count "
    "is the README-style dataflow (`exchange`, a `Counter` per pending epoch with its token, running "
    "totals), each worker sending its half of an epoch as one list; NEXMark is the project's "
    "queries (`tokenflow.nexmark.queries`) over a replayable source on the bid files, Arrow "
    "batches. Offered: the worker sends the epoch / lifts its source's limit to it (earliest "
    "worker); done: the probe on the output passes the epoch (latest worker).",
    "* **Spark Structured Streaming** (`local[2]`, 2 shuffle partitions, one session for all "
    "workloads, word count first): a Parquet file stream source with `maxFilesPerTrigger=1` and "
    "`Trigger.AvailableNow`, so micro-batch e is epoch e (checked by its input row count); word "
    "count `groupBy(word).count()` in update mode; q1/q2 `select`/`where`; q5 two chained "
    "streaming aggregations (counts per sliding window and auction, then the maximum per window "
    "with `collect_list`); q7 one aggregation per tumbling window keeping `max(price)` and "
    "`collect_list` of the window's bids, then the maximum ones (a streaming aggregation cannot "
    "keep \"every row equal to the maximum\" otherwise); windows by a 0 s watermark, so a window "
    "is emitted in the micro-batch after the one that moves the watermark past it (a bid one day "
    "later ends the stream). Offered: the micro-batch's trigger time (`StreamingQueryProgress."
    "timestamp`, ms); done: `foreachBatch` holds the rows on the driver (`toArrow`).",
    "* **Bytewax** (2 processes, `bytewax.testing.cluster_main`, one worker each): items are "
    "single words / single bids (Python tuples); word count and q5/q7's first stage are "
    f"`stateful_batch` steps keyed by {SHARDS} shards (crc32 of the word, auction mod {SHARDS}), "
    "q5/q7's second stage one key; q1/q2 `map`/`filter_map`. Bytewax has no frontiers, so each "
    "source partition follows an epoch with an end marker for every shard and each stateful step "
    "emits an epoch's rows (and closes the windows that end by it) once it has the markers of all "
    "its inputs; a window therefore closes at the end of its last epoch. Offered: `next_batch` "
    "returns the epoch (earliest partition); done: the sinks have every marker of the epoch; the "
    "sources learn it through a shared memory map (the gate for one epoch in flight).",
    "* **Pathway** (`PATHWAY_THREADS=2`): a `pw.io.python.ConnectorSubject` pushes the epoch and "
    "commits (word count: rows of 10,000-word lists flattened inside Pathway, since one row per "
    "word is ~3x slower; NEXMark: one row per bid); word count `groupby(word).reduce(count)`, its "
    "additions per time are the running counts; q1/q2 `select`/`filter`; q5/q7 `windowby` "
    "(sliding / tumbling, `exactly_once_behavior`), a `groupby` for the maximum and a `join` back. "
    "Offered: the subject starts pushing the epoch; done: `pw.io.subscribe`'s `on_time_end` for "
    "the time of a marker row that travels with the epoch to the output (a counted marker word; "
    "a marker table concatenated to the query output).",
]
"""How each engine was run and timed (written into peers.md)."""


def versions() -> str:
    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        java_version = (java.stderr.splitlines() or ["?"])[0]
    except OSError:
        java_version = "no java"
    return (f"Python {platform.python_version()}, pyspark {version('pyspark')} ({java_version}), "
            f"bytewax {version('bytewax')}, pathway {version('pathway')}, pyarrow {version('pyarrow')}, "
            f"numpy {version('numpy')}")


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def plot(rows: list[dict[str, Any]], engines: list[str], workloads: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(engines)
    for k, engine in enumerate(engines):
        xs, rates, p50, p99 = [], [], [], []
        for i, workload in enumerate(workloads):
            row = next((r for r in rows if r["engine"] == engine and r["workload"] == workload), None)
            if row is None or "rate" not in row:
                continue
            xs.append(i + (k - (len(engines) - 1) / 2) * width)
            rates.append(row["rate"])
            p50.append(row["p50"])
            p99.append(row["p99"])
        axes[0].bar(xs, rates, width, label=engine)
        bars = axes[1].bar(xs, p50, width, label=engine)
        axes[1].scatter(xs, p99, marker="_", s=60, color=bars.patches[0].get_facecolor() if bars.patches
                        else "k", zorder=3)
    for ax, label, title in ((axes[0], "input records/s", "Throughput (one epoch in flight)"),
                             (axes[1], "epoch latency, ms (bar p50, dash p99)", "Epoch latency")):
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.set_title(title)
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(engines), fontsize=8)
    fig.suptitle("tokenflow and peers, 2 workers each, same input, 2-core shared machine (one run)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdicts(rows: list[dict[str, Any]], workloads: list[str]) -> list[str]:
    """The issue's target, per workload and tokenflow runtime."""
    lines = ["| workload | tokenflow runtime | spark-streaming: p50 ÷ ours, our rate ÷ its | "
             "bytewax: p50 ÷ ours, our rate ÷ its | target met |", "|---|---|---|---|---|"]
    met_all = []
    spans: dict[str, list[tuple[float, float]]] = {"spark-streaming": [], "bytewax": []}
    for workload in workloads:
        peers = {e: next((r for r in rows if r["engine"] == e and r["workload"] == workload
                          and "rate" in r), None) for e in ("spark-streaming", "bytewax")}
        for engine in ENGINES[:3]:
            ours = next((r for r in rows if r["engine"] == engine and r["workload"] == workload
                         and "rate" in r), None)
            if ours is None:
                continue
            cells, met = [], True
            for name, peer in peers.items():
                if peer is None:
                    cells.append("no checked run")
                    met = False
                    continue
                ratio, rate = peer["p50"] / ours["p50"], ours["rate"] / peer["rate"]
                spans[name].append((ratio, rate))
                cells.append(f"{ratio:,.1f}x, {rate:,.2f}x")
                met = met and ratio >= 10 and rate >= 1
            met_all.append(met)
            lines.append(f"| {workload} | {engine.split('-', 1)[1]} | {cells[0]} | {cells[1]} | "
                         f"{'**met**' if met else 'not met'} |")
    lines.append("")
    lines.append(f"Met in {sum(met_all)} of {len(met_all)} (workload, runtime) pairs.")
    for name, pairs in spans.items():
        if pairs:
            ratios, rates = [p[0] for p in pairs], [p[1] for p in pairs]
            both = sum(1 for r, q in pairs if r >= 10 and q >= 1)
            lines.append(f"Against {name}: tokenflow's epoch p50 is {min(ratios):,.1f}x to "
                         f"{max(ratios):,.1f}x lower, at {min(rates):,.2f}x to {max(rates):,.2f}x its "
                         f"records/s; >= 10x lower at equal or higher records/s in {both} of {len(pairs)}.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20 epochs of 20,000 words, 120,000 NEXMark events (~4 min, mostly start-ups)")
    parser.add_argument("--epochs", type=int, help="word count epochs (default 100)")
    parser.add_argument("--words", type=int, help="words per epoch (default 100,000)")
    parser.add_argument("--events", type=int, help="NEXMark events (default 300,000: 30 epochs)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--bytewax-proc", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--gate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.bytewax_proc is not None:
        bytewax_process(args)
        return

    epochs = args.epochs or (20 if args.quick else 100)
    words = args.words or (20_000 if args.quick else 100_000)
    events = args.events or (120_000 if args.quick else 300_000)
    timeout = 600 if args.quick else 1200
    started = datetime.now(UTC)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        data = Path(tmp)
        t0 = time.time()
        meta = write_inputs(data, epochs, words, events)
        print(f"inputs written in {time.time() - t0:.1f} s: {epochs} epochs x {words:,} words; "
              f"{events:,} NEXMark events, {sum(meta['bids']):,} bids in {len(meta['bid_epochs'])} epochs",
              flush=True)
        for engine in args.engines:
            if not installed(engine):
                rows += [{"engine": engine, "workload": w, "status": "not installed "
                          "(`pip install -e '.[bench]'`)"} for w in args.workloads]
                print(f"  {engine}: not installed", flush=True)
                continue
            rows += run_engine(engine, args.workloads, data, timeout)
        check(rows, meta)
        for row in rows:
            if row.get("check") in ("equal", "reference"):
                metrics(row, meta)
    elapsed = (datetime.now(UTC) - started).total_seconds()
    load_after = os.getloadavg()[0]

    from _provenance import provenance  # a sibling module: benchmarks run as scripts

    lines = [
        "# tokenflow side by side with peers",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {elapsed / 60:.1f} min. Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, **shared with other work while this ran** (1-minute load average "
        f"{load_before:.1f} before, {load_after:.1f} after); every figure comes from **one run** (no "
        "repetitions), so expect noise of tens of percent, more for the p99s. " + versions()
        + " (Pathway 0.33 needs pyarrow < 26, so `.[bench]` installs 25.x). " + provenance(),
        "",
        f"Input: word count {epochs} epochs x {words:,} Zipf words (vocabulary {VOCABULARY:,}, seed "
        f"{SEED}); NEXMark {events:,} events of `tokenflow.nexmark.generator` ({sum(meta['bids']):,} "
        f"bids in {len(meta['bid_epochs'])} epochs of 1 s event time). Every engine: 2 workers "
        "(tokenflow 2 workers, Spark `local[2]`, Bytewax 2 processes, Pathway 2 threads), one epoch "
        "in flight, as fast as it goes. `benchmarks/peers.py`'s docstring defines offer and done "
        "per engine; epoch 0 is a warm-up left out of every figure.",
        "",
        "Every run's output was checked before any figure below was computed: the word count's "
        "(word, running count) rows of every epoch against a plain Python loop, NEXMark's rows as a "
        "multiset against tokenflow's (thread runtime; the project's tests check those queries against "
        "Spark SQL). A run that failed or whose output differs has no figures.",
        "",
        "| workload | engine | input records/s | epoch p50 ms | epoch p99 ms | window p50 ms | "
        "window p99 ms | output | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for workload in args.workloads:
        for engine in args.engines:
            row = next(r for r in rows if r["engine"] == engine and r["workload"] == workload)
            if "rate" in row:
                windows = row.get("windows_n")
                lines.append(
                    f"| {workload} | {engine} | {fmt(row['rate'])} | {fmt(row['p50'], 1)} | "
                    f"{fmt(row['p99'], 1)} | {fmt(row.get('w50'), 1)} | {fmt(row.get('w99'), 1)}"
                    f"{f' ({windows})' if windows else ''} | {row['check']} | {fmt(row.get('wall'), 1)} |")
            else:
                status = row["status"] if row["status"] != "ok" else row["check"]
                lines.append(f"| {workload} | {engine} | - | - | - | - | - | {status} | "
                             f"{fmt(row.get('wall'), 1)} |")
    lines += [
        "",
        "Window latency (q5, q7): from the offer of the epoch holding a window's last events to the "
        "sink receiving the window's rows, over the windows in brackets.",
        "",
        *METHOD,
        "",
        "## The issue's target",
        "",
        "\"tokenflow's epoch p50 is >= 10x lower than Spark Structured Streaming's and Bytewax's at "
        "equal or higher throughput\": per workload and tokenflow runtime, the peer's p50 over "
        "tokenflow's, and tokenflow's records/s over the peer's.",
        "",
        *verdicts(rows, args.workloads),
        "",
        "![throughput and epoch latency](peers.png)",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        plot(rows, args.engines, args.workloads, RESULTS / "peers.png")
        (RESULTS / "peers.md").write_text(text)
        print(f"wrote {RESULTS / 'peers.md'} and {RESULTS / 'peers.png'}")


if __name__ == "__main__":
    main()
