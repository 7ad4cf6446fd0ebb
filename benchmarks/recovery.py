"""Recovery benchmark: what checkpoints cost, how fast a job recovers from a killed worker, what
incremental checkpoints save, and which embedded store suits per-bin state.

Writes ``benchmarks/results/recovery.md``, ``benchmarks/results/recovery.png`` (throughput and
epoch latency around a kill) and ``benchmarks/results/recovery_breakdown.png`` (where each
recovery's time went), and prints the tables.  The machine is shared (2 cores), so comparisons
are made side by side in one run: variants alternate round by round (A B C, C B A, ...), the
tables give medians and a ratio is the median over the rounds of the per-round ratio.
Single rounds spread far wider than a 5 % target: the *control* variant, which never
checkpoints, ran at 0.61-1.25x *none* per round in two runs on 2026-12-01.  So section 1
takes 5 rounds on process and 3 on Spark (it took 3 and 2).

1. **Checkpoint cost** (2 workers).  NEXMark q4, q5, q8 through
   ``tokenflow.nexmark.run.run_query(q, events, workers=2, runtime="process", output=DIR,
   checkpoint=..., checkpoint_interval=1.0)`` (1 s epochs at 10,000 events/s of event time,
   events per query chosen so that a run lasts about 10 s or more).  Variants, all writing the
   same committed Parquet sink: *none* (``checkpoint=None``: plain ``execute``), *control*
   (``checkpoint=DIR`` but the checkpoint loop of ``CheckpointedJob`` replaced by a plain wait:
   the job runs under the control plane, its workers report to the coordinator and poll for
   commands after every step, and no checkpoint is ever taken), *quiescent* (a checkpoint every
   1 s by the quiescent protocol, ``CheckpointedJob(aligned=False)``: sources stop at the
   checkpoint's epoch, the job drains, every worker waits for the verdict; the protocol before
   aligned checkpoints) and *checkpoint* (every 1 s by the aligned protocol, the default:
   records of the checkpoint's epoch and later wait at the operators' inputs until their worker
   has captured, each worker captures and resumes on its own; ``tokenflow.control``).
   Reported: events/s and per-epoch latency p50/p99 (``QueryResult``), the worker processes'
   CPU seconds in the job function (``QueryResult.worker_cpu_s``: ``time.process_time`` of
   each worker, every thread, the snapshot writer's included), where the slowest epochs lie (how many of each
   run's ten slowest epochs are within 5 epochs after a checkpoint's epoch), and per checkpoint
   its ``SnapshotStats``: ``paused`` (from ``hold`` until every worker captured its state), the
   protocol phases (for the aligned protocol the workers' own: ``run up``, ``align``,
   ``capture``, the longest of the workers), how long the sources stood still, the inputs
   holding records back at the captures, bytes written and reused, ``total`` (until the
   manifest is written), aligned attempts discarded as not a consistent cut.  Every run's
   output (collected rows and the committed dataset read back with ``read_committed``) must
   equal the first run's.  Then, since at full load an epoch's latency is mostly its wait
   behind the epochs in flight, the p99 once more at half load (``measure_paced``: each query
   offered open-loop at half of its *none* throughput, *none* and *checkpoint* alternating,
   with the worst latency of the epochs around each checkpoint).  Then the same on Spark
   ``local[2]`` (*none*, *quiescent* and *checkpoint*, fewer rounds).  Checkpoints that fail
   (``CheckpointedJob`` logs a warning and goes on) are counted.

2. **Recovery time** with about 100 MB of operator state.  A job (run by a separate *driver*
   process, this script with ``--child``, like ``benchmarks/kill_trials.py``) keeps a
   ``state_machine`` (``KeyedState``) of int keys with 100-byte values, as many as make the
   pickled state about ``--state-mb`` MB (a full checkpoint's stored bytes are reported).  Its
   replayable table source (8 splits, ``table_splits``) holds the keys' initial records at
   epoch 0, then ``--updates`` updates per epoch of 0.1 s to ``--hot`` hot keys (so a few % of
   the bins change between checkpoints); each update emits ``(key, version)``, written per
   epoch by ``to_parquet``.  The job is paced by wall clock: epoch ``t`` is released to the
   source (``SourceHandle.limit``) at ``t0 + 0.1 s * t``, ``t0`` fixed by this script for all
   attempts, so input that piled up while the job was down (a backlog) is replayed at full
   speed, as from a log.  ``CheckpointedJob`` (checkpoints every 1 s) runs it; once the first
   checkpoint is committed and the job has caught up, this script SIGKILLs one of the two
   current worker processes (their pids are written by the job function on each attempt) at a
   random moment (uniform over the next 2 s), polls ``<output>/_tokenflow_manifest.json`` every
   5 ms until an epoch newer than any committed before the kill appears (*recovered in*), waits
   for a checkpoint of the new attempt, and kills again.  The breakdown comes from timestamps
   (``time.time()``, one clock for all processes): *detect* (kill until the runtime's
   ``execute`` raised in the driver: the process runtime sees the child exit and stops the
   other worker, Spark aborts the barrier stage), *wake* (until ``CheckpointedJob`` noticed and
   logged the restart), *verify* (``latest_usable``: the newest checkpoint read back whole and
   checked), *start* (until both new workers are in the job function and have generated
   their input table, about 0.2 s: ``JobSpec`` with the snapshot opened, process spawn or
   barrier-stage launch, imports, mesh), *load* (building the
   dataflow, which loads each worker's bins of the state from the checkpoint), *replay* (until
   the first new epoch is committed: the epochs since the checkpoint are recomputed, their
   output discarded, then the next one committed).  Every killed run's committed output must
   equal a failure-free run's.  On ``process`` and on Spark ``local[2]`` (stage relaunch
   included).

3. The PNG: rows committed per 100 ms and each epoch's latency (commit seen by the poller
   minus the epoch's release time) around the last kill of each runtime's first run, with the
   checkpoints (``hold`` to ``captured``; commit); the second PNG stacks each
   kill's breakdown.  For scale, the Spark part also times a trivial job's barrier stage on the
   warm session (``execute`` until both workers are in the job function).

4. **Incremental vs full checkpoint** of the same state (``write_worker_part`` with and
   without ``previous=``, then ``commit_snapshot``): the keyed state of part 2 split between 2
   workers (``RoutingTable.even(2)``), a first checkpoint, then about ``--changed`` of the bins
   modified (every key in them) and a second checkpoint written incrementally and in full,
   alternating which goes first.  Bytes written and reused, seconds; ``KeyedState.export`` (the
   capture, the same for both) timed apart.

5. **Embedded store** for the per-bin Arrow IPC blobs of that state: (a) our files
   (``write_worker_part`` + ``commit_snapshot``, read with ``Snapshot.read``); (b) SQLite in WAL
   mode (stdlib ``sqlite3``, one table ``(state, bin) -> blob`` per worker, one transaction per
   checkpoint), with ``synchronous=FULL`` (the commit is durable, like our fsynced files) and
   ``NORMAL`` (in WAL mode the commit is not fsynced: not durable across power loss); (c) LMDB
   (``lmdb`` binding, default durable commit; only if importable: ``pip install lmdb``, not a
   project dependency).  Each old worker writes its own store (serializing its tables to IPC
   included in every variant); then a full write, an incremental write of the changed bins, a
   read of the bins a new third worker owns after a 2 -> 3 rescale (1/3, from both stores) and
   of all bins (decoded to tables in every variant).  Reads come from the page cache.

Run: ``.venv/bin/python benchmarks/recovery.py`` (23 minutes measured on 2 shared cores, more
on a slower VM), or ``--quick`` (a few minutes: fewer events and rounds, a 20 MB state, fewer kills).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import logging
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _provenance import provenance  # a sibling module: benchmarks run as scripts

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
WORKERS = 2
BINS = 4096
INTERVAL = 1.0
"""Seconds between checkpoints (the CLI's default)."""
THROUGHPUT_TARGET = 0.95
P99_TARGET_MS = 2.0
RECOVERY_TARGET_S = 3.0
VALUE_BYTES = 100
EPOCH_S = 0.1
"""Wall-clock length of an epoch of the recovery job."""
SPLITS = 8
JOB = "bench.recovery"
SEED = 20_251
MB = 1e6


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def alternating(variants: Sequence[str], rounds: int) -> Iterable[tuple[int, str]]:
    """``(round, variant)`` with the order reversed every other round."""
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else list(reversed(variants))):
            yield r, v


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def spread(values: Sequence[float], digits: int = 2) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def committed_table(path: Path | str) -> pa.Table:
    """The committed dataset, rows sorted by every column (partition column included)."""
    from tokenflow.io import read_committed

    table = read_committed(str(path))
    columns = sorted(table.column_names)
    table = table.select(columns)
    return table.sort_by([(c, "ascending") for c in columns]) if table.num_rows else table


# == 1. checkpoint cost ==========================================================================


@dataclass
class CostRun:
    events_per_second: float
    p50_ms: float
    p99_ms: float
    seconds: float
    cpu_s: float | None
    checkpoints: list[dict[str, Any]]
    failed: list[str] = field(default_factory=list)
    """Checkpoints that failed (``CheckpointedJob`` logs them and goes on)."""
    slow_near: int = 0
    """Of the run's ``SLOW`` slowest epochs, those within ``NEAR`` epochs after a checkpoint's
    epoch (its own included)."""


@dataclass
class CostRow:
    query: str
    runtime: str
    events: int
    variants: list[str]
    runs: dict[str, list[CostRun]] = field(default_factory=dict)
    rows: int = 0
    committed_rows: int = 0
    epochs: int = 0
    error: str | None = None

    def med(self, variant: str, attr: str) -> float:
        return median(getattr(r, attr) for r in self.runs[variant])

    def paired(self, variant: str, attr: str, base: str = "none") -> list[float]:
        return [getattr(a, attr) / getattr(b, attr)
                for a, b in zip(self.runs[variant], self.runs[base], strict=False)]

    def delta(self, variant: str, attr: str, base: str = "none") -> list[float]:
        return [getattr(a, attr) - getattr(b, attr)
                for a, b in zip(self.runs[variant], self.runs[base], strict=False)]

    def stats(self, variant: str = "checkpoint") -> list[dict[str, Any]]:
        return [s for r in self.runs.get(variant, []) for s in r.checkpoints]


class FailedCheckpoints(logging.Handler):
    """Collects the \"checkpoint failed\" warnings of ``tokenflow.recovery``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "checkpoint failed" in message:
            self.messages.append(message)


def spark_launch(rounds: int = 3) -> list[float]:
    """Seconds from ``execute`` until both workers of a trivial job entered the job function,
    on the running Spark session (``local[2]``, Python workers reused)."""
    from tokenflow import execute

    def job(worker: Any) -> float:
        return time.time()

    out = []
    for _ in range(rounds):
        began = time.time()
        entered = execute(job, workers=WORKERS, runtime="spark", master="local[2]")
        out.append(max(entered) - began)
    return out


SLOW = 10
"""The slowest epochs of a run looked at (about the p99 of its thousand or so)."""
NEAR = 5
"""Epochs after a checkpoint's epoch (its own included) counted as near it."""
CHECKPOINTING = ("quiescent", "checkpoint")
"""The variants that take checkpoints."""


def slow_near_checkpoints(latencies: Sequence[float], epochs: Sequence[int],
                          checkpoints: Iterable[int]) -> int:
    """How many of the ``SLOW`` slowest epochs lie within ``NEAR`` epochs after a checkpoint's."""
    index = {t: i for i, t in enumerate(epochs)}
    near: set[int] = set()
    for e in checkpoints:
        i = index.get(e)
        if i is not None:
            near.update(range(i, i + NEAR))
    slowest = sorted(range(len(latencies)), key=lambda i: -latencies[i])[:SLOW]
    return sum(i in near for i in slowest)


def _no_checkpoints(self: Any, attempt: Any) -> None:
    """``CheckpointedJob._checkpoint_loop`` for the *control* variant: wait for the job, never
    checkpoint."""
    attempt.handle.wait()


def measure_cost(queries: list[str], events: dict[str, int], rounds: int, runtime: str,
                 variants: list[str], work: Path) -> list[CostRow]:
    from unittest import mock

    import pandas as pd

    from tokenflow.execute import WorkerError
    from tokenflow.nexmark.run import run_query
    from tokenflow.recovery import CheckpointedJob

    options = {"master": "local[2]"} if runtime == "spark" else {}
    rows = []
    for name in queries:
        row = CostRow(name, runtime, events[name], variants, {v: [] for v in variants})
        reference: pd.DataFrame | None = None
        committed_ref: pa.Table | None = None
        try:
            for r, variant in alternating(variants, rounds):
                d = work / f"cost-{runtime}-{name}-{variant}-{r}"
                patch: Any = contextlib.nullcontext()
                if variant == "control":
                    patch = mock.patch.object(CheckpointedJob, "_checkpoint_loop", _no_checkpoints)
                elif variant == "quiescent":
                    patch = mock.patch.object(CheckpointedJob, "__init__", functools.partialmethod(
                        CheckpointedJob.__init__, aligned=False))
                failures = FailedCheckpoints()
                logging.getLogger("tokenflow.recovery").addHandler(failures)
                with patch:
                    result = run_query(name, events[name], rate=10_000, workers=WORKERS,
                                       runtime=runtime, output=d / "out",
                                       checkpoint=None if variant == "none" else d / "ckpt",
                                       checkpoint_interval=INTERVAL, **options)
                logging.getLogger("tokenflow.recovery").removeHandler(failures)
                committed = committed_table(d / "out")
                if reference is None:
                    reference, committed_ref = result.rows, committed
                    row.rows, row.committed_rows = len(result.rows), committed.num_rows
                    row.epochs = len(result.epoch_times)
                    check = "reference"
                else:
                    pd.testing.assert_frame_equal(result.rows, reference, check_exact=True)
                    assert committed.equals(committed_ref), \
                        f"{name} {variant}: committed output differs from the first run's"
                    check = "identical to the reference"
                if variant not in CHECKPOINTING and result.checkpoints:
                    raise AssertionError(f"{name} {variant}: took {len(result.checkpoints)} checkpoints")
                row.runs[variant].append(CostRun(
                    result.events_per_second, result.latency_p50_ms, result.latency_p99_ms,
                    result.seconds, result.worker_cpu_s,
                    [asdict(s) for s in result.checkpoints], failures.messages,
                    slow_near_checkpoints(result.latencies_ms, result.epoch_times,
                                          (s.epoch for s in result.checkpoints))))
                print(f"  {runtime} {name} round {r + 1} {variant}: {result.events_per_second:,.0f} "
                      f"events/s, p99 {result.latency_p99_ms:.0f} ms, {len(result.checkpoints)} "
                      f"checkpoints, output {check}", flush=True)
                shutil.rmtree(d, ignore_errors=True)
        except (WorkerError, AssertionError) as exc:
            row.error = str(exc).splitlines()[0][:300]
            print(f"  {runtime} {name}: FAILED: {row.error}", flush=True)
        rows.append(row)
    return rows


PACED_SECONDS = 10.0
"""Seconds of input each half-load run of section 1 offers."""
PACED_LAG = 16
"""Epochs a worker may have in flight in a half-load run (high: the load stays open-loop)."""


def measure_paced(cost: list[CostRow], rounds: int, work: Path) -> list[dict[str, Any]]:
    """Section 1 at half load: each process query of ``cost`` offered open-loop
    (``run_query(pace=)``) at half of its *none* throughput measured there, ``PACED_SECONDS`` of
    input, *none* and *checkpoint* alternating.  Per run: p50/p99 and, per checkpoint, the worst
    latency of the epochs from the one before its epoch to two after it.  Every run's committed
    output must equal the first paced run's."""
    from tokenflow.nexmark.run import run_query

    out = []
    for row in cost:
        if row.runtime != "process" or row.error or not row.runs.get("none"):
            continue
        pace = 0.5 * row.med("none", "events_per_second")
        events = int(pace * PACED_SECONDS)
        entry: dict[str, Any] = {"query": row.query, "pace": pace, "events": events,
                                 "runs": {"none": [], "checkpoint": []}}
        reference: pa.Table | None = None
        for r, variant in alternating(["none", "checkpoint"], rounds):
            d = work / f"paced-{row.query}-{variant}-{r}"
            result = run_query(row.query, events, rate=10_000, workers=WORKERS, runtime="process",
                               output=d / "out", checkpoint_interval=INTERVAL, pace=pace,
                               checkpoint=None if variant == "none" else d / "ckpt", lag=PACED_LAG)
            committed = committed_table(d / "out")
            if reference is None:
                reference = committed
            elif not committed.equals(reference):
                raise AssertionError(f"{row.query} at half load, {variant}: committed output "
                                     "differs from the first paced run's")
            index = {t: i for i, t in enumerate(result.epoch_times)}
            lat = result.latencies_ms
            at = [index.get(c.epoch) for c in result.checkpoints]
            around = [max(lat[max(0, i - 1):i + 3]) for i in at if i is not None]
            entry["runs"][variant].append({
                "p50_ms": result.latency_p50_ms, "p99_ms": result.latency_p99_ms,
                "epochs": len(lat), "checkpoints": len(result.checkpoints), "around_ms": around})
            print(f"  process {row.query} at {pace:,.0f} events/s, round {r + 1} {variant}: p50 "
                  f"{result.latency_p50_ms:.1f} ms, p99 {result.latency_p99_ms:.1f} ms, "
                  f"{len(result.checkpoints)} checkpoints", flush=True)
            shutil.rmtree(d, ignore_errors=True)
        out.append(entry)
    return out


def paced_delta(entry: dict[str, Any]) -> list[float]:
    """Per round, the checkpoint run's p99 minus the *none* run's (ms)."""
    return [a["p99_ms"] - b["p99_ms"]
            for a, b in zip(entry["runs"]["checkpoint"], entry["runs"]["none"], strict=False)]


def paced_lines(paced: list[dict[str, Any]], rounds: int) -> list[str]:
    lines = ["### Epoch latency at half load (process)", "",
             "The p99 target measured where latency is defined: above, at full load, an epoch's "
             "latency is mostly its wait behind the epochs in flight, which moves by tens of ms "
             "from run to run (the *control* variant, which never checkpoints, lands at -5 to "
             "+20 ms).  Here each query is offered open-loop (`run_query(pace=)`: every worker "
             "offers an epoch at the same moment) at half of its *none* throughput above, "
             f"{PACED_SECONDS:g} s of input, up to {PACED_LAG} epochs in flight, *none* and "
             f"*checkpoint* alternating, {rounds} rounds; every run's committed output equals the "
             "first's.  *around a checkpoint*: per checkpoint, the worst latency of the epochs "
             "from the one before its epoch to two after it (median and max over the runs' "
             "checkpoints).", "",
             "| query | offered events/s | variant | p50 ms | p99 ms | p99 − none, ms (median; "
             "per round) | around a checkpoint, ms (median / max) | checkpoints per run | "
             "p99 target |",
             "|---|---:|---|---:|---:|---|---|---:|---|"]
    for e in paced:
        for v in ("none", "checkpoint"):
            runs = e["runs"][v]
            if not runs:
                continue
            p50, p99 = median(x["p50_ms"] for x in runs), median(x["p99_ms"] for x in runs)
            n_ck = median(x["checkpoints"] for x in runs)
            if v == "none":
                lines.append(f"| {e['query']} | {e['pace']:,.0f} | {v} | {p50:.1f} | {p99:.1f} | | | "
                             f"{n_ck:.0f} | |")
                continue
            d = paced_delta(e)
            around = [a for x in runs for a in x["around_ms"]]
            near = f"{median(around):.1f} / {max(around):.1f}" if around else ""
            lines.append(f"| {e['query']} | {e['pace']:,.0f} | {v} | {p50:.1f} | {p99:.1f} | "
                         f"{median(d):+.1f} ({spread(d, 1)}) | {near} | {n_ck:.0f} | "
                         f"{verdict(median(d) <= P99_TARGET_MS)} |")
    return lines + [""]


# == 2. recovery: the job (run in the child driver) ================================================


def value_of(key: int) -> bytes:
    """The initial 100-byte value of ``key``."""
    return (key.to_bytes(8, "little") * 13)[:VALUE_BYTES]


def fold(key: int, version: int, current: bytes | None) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """Version 0 creates the key's value (no output); an update stamps the version into the
    value's last 8 bytes and emits ``(key, version)``."""
    if current is None:
        current = value_of(key)
    if version == 0:
        return current, ()
    return current[:-8] + version.to_bytes(8, "little"), ((key, version),)


def input_table(keys: int, hot: int, updates: int, epochs: int, seed: int) -> pa.Table:
    """Epoch 0: every key with version 0; epochs 1..``epochs``: ``updates`` records each, keys
    drawn from ``hot`` hot keys, versions unique and increasing."""
    rng = np.random.default_rng(seed)
    hot_keys = rng.choice(keys, size=hot, replace=False).astype(np.int64)
    t = np.concatenate([np.zeros(keys, np.int64), np.repeat(np.arange(1, epochs + 1), updates)])
    key = np.concatenate([np.arange(keys, dtype=np.int64),
                          hot_keys[rng.integers(0, hot, epochs * updates)]])
    version = np.concatenate([np.zeros(keys, np.int64), np.arange(1, epochs * updates + 1)])
    return pa.table({"t": t, "key": key, "v": version})


def recovery_job(spec: dict[str, Any]) -> Callable[[Any], None]:
    output, marks, t0, epoch_s = spec["output"], spec["marks"], spec["t0"], spec["epoch_s"]
    keys, hot, updates, epochs = spec["keys"], spec["hot"], spec["updates"], spec["epochs"]

    def job(worker: Any) -> None:
        from tokenflow.dataflow.operators.stateful import state_machine
        from tokenflow.io import to_parquet
        from tokenflow.io.sources import replayable_source, table_splits

        start = time.time()
        table = input_table(keys, hot, updates, epochs, SEED)
        splits = table_splits(table, SPLITS, time="t")
        generated = time.time()

        def pairs(batch: Any) -> list[tuple[int, int]]:
            return list(zip(batch.column("key").to_pylist(), batch.column("v").to_pylist(),
                            strict=True))

        def build(scope: Any) -> Any:
            stream, handle = replayable_source(scope, "updates", splits, time="t")
            out = state_machine(stream.map_batch(pairs), fold)
            to_parquet(out, output, columns=["key", "v"])
            return handle

        handle = worker.dataflow(build)
        built = time.time()
        restore = getattr(worker, "restore", None)
        line = json.dumps({"pid": os.getpid(), "worker": worker.index, "start": start,
                           "generated": generated, "built": built,
                           "restore": None if restore is None else int(restore.epoch)})
        fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        while True:
            if epoch_s > 0:
                due = int((time.time() - t0) / epoch_s) + 1  # epochs < due are released
                handle.limit(due if due <= epochs else None)
            if not worker.step_or_park(0.005):
                break

    return job


def child(spec: dict[str, Any]) -> None:
    """Run the recovery job (``spec["checkpoint"]`` None: plain ``execute``, the failure-free
    reference) and write a JSON summary to ``spec["summary"]``."""
    import tokenflow.job as job_module

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    failed: list[float] = []
    original = job_module.JobHandle._run

    def timed_run(self: Any, run: Callable[[], list[Any]]) -> None:
        original(self, run)
        if self._error is not None:  # when the runtime's execute raised: the failure seen
            failed.append(time.time())

    job_module.JobHandle._run = timed_run  # type: ignore[method-assign]
    options: dict[str, Any] = {"master": "local[2]"} if spec["runtime"] == "spark" else {}
    fn = recovery_job(spec)
    summary: dict[str, Any] = {"started": time.time()}
    try:
        if spec["checkpoint"] is None:
            from tokenflow import execute

            execute(fn, workers=WORKERS, runtime=spec["runtime"], name=JOB, **options)
        else:
            from tokenflow.recovery import CheckpointedJob

            job = CheckpointedJob(fn, WORKERS, spec["runtime"], checkpoint=spec["checkpoint"],
                                  interval=spec["interval"], name=JOB, restarts=spec["restarts"],
                                  **options)
            try:
                job.run()
            finally:
                summary.update(failures=job.failures, stats=[asdict(s) for s in job.stats],
                               events=[asdict(e) for e in job.events])
    finally:
        summary.update(failed=failed, ended=time.time())
        Path(spec["summary"]).write_text(json.dumps(summary))


# == 2. recovery: the trials (this process) ========================================================


def launch(spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    log = open(Path(spec["summary"]).with_suffix(".log"), "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


class Poller:
    """Polls the dataset manifest every 5 ms (parsing it only when it changed) and records when
    each epoch first appears: ``seen[epoch] = (time.time(), rows)``."""

    def __init__(self, output: Path) -> None:
        self.path = output / "_tokenflow_manifest.json"
        self.seen: dict[int, tuple[float, int]] = {}
        self.newest = -1
        self._stamp: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(0.005)

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return
        now = time.time()
        try:
            epochs = json.loads(self.path.read_text()).get("epochs", {})
        except (OSError, ValueError):
            return
        self._stamp = stamp
        for key, entry in epochs.items():
            epoch = int(key)
            if epoch not in self.seen:
                self.seen[epoch] = (now, int(entry.get("rows", 0)))
                self.newest = max(self.newest, epoch)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def read_marks(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def current_workers(marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The marks of the latest attempt's workers (the last mark of each worker index)."""
    latest: dict[int, dict[str, Any]] = {}
    for m in marks:
        if m["worker"] not in latest or m["start"] > latest[m["worker"]]["start"]:
            latest[m["worker"]] = m
    return list(latest.values())


@dataclass
class Kill:
    runtime: str
    run: int
    index: int
    at: float
    victim: int
    seen_epoch: int
    recovered_in: float | None = None
    restored_epoch: int | None = None
    parts: dict[str, float] = field(default_factory=dict)
    note: str = ""


@dataclass
class RecoveryRun:
    runtime: str
    run: int
    kills: list[Kill]
    identical: bool
    failures: int | None
    stats: list[dict[str, Any]]
    seen: dict[int, tuple[float, int]]
    t0: float
    checkpoint_times: list[float]
    pauses: list[tuple[float, float]]
    failed_checkpoints: list[str]
    full_after: dict[str, int] = field(default_factory=dict)
    """Full-size checkpoints (over half the largest) by what came before them: ``load`` (the
    job's first checkpoint with state), ``restart`` or ``failed`` (a failed checkpoint), or
    ``other``."""
    detail: str = ""


PARTS = ("detect", "wake", "verify", "start", "load", "replay")


def breakdown(kill: Kill, summary: dict[str, Any], marks: list[dict[str, Any]], out_at: float) -> None:
    """Fill ``kill.parts`` from the driver's and workers' timestamps (see the docstring)."""
    failed = [t for t in summary.get("failed", []) if t >= kill.at]
    events = summary.get("events", [])
    restart = [e for e in events if e["kind"] == "restart" and e["at"] >= kill.at]
    restore = [e for e in events if e["kind"] == "restore" and e["at"] >= kill.at]
    starts = sorted((m for m in marks if m["start"] >= kill.at), key=lambda m: m["start"])[:WORKERS]
    if not (failed and restart and restore and len(starts) == WORKERS):
        kill.note = "incomplete timestamps"
        return
    kill.restored_epoch = restore[0]["epoch"]
    stamps = [kill.at, failed[0], restart[0]["at"], restore[0]["at"],
              max(m["generated"] for m in starts), max(m["built"] for m in starts), out_at]
    kill.parts = {name: b - a for name, a, b in zip(PARTS, stamps[:-1], stamps[1:], strict=True)}


def recovery_trials(runtime: str, runs: int, kills: int, params: dict[str, Any],
                    reference: pa.Table, work: Path, rng: random.Random,
                    keep: bool = False) -> list[RecoveryRun]:
    """``runs`` runs of the job on ``runtime``, each with ``kills`` kills."""
    return [recovery_run(runtime, run, kills, params, reference, work, rng, keep)
            for run in range(runs)]


def recovery_run(runtime: str, run: int, kills: int, params: dict[str, Any], reference: pa.Table,
                 work: Path, rng: random.Random, keep: bool) -> RecoveryRun:
    from tokenflow.state.snapshot import committed_epochs

    lead = 3.0 if runtime == "process" else 15.0
    d = work / f"recovery-{runtime}-{run}"
    d.mkdir(parents=True)
    ckpt, output, marks_path = d / "ckpt", d / "out", d / "marks.jsonl"
    spec = {**params, "runtime": runtime, "output": str(output), "checkpoint": str(ckpt),
            "marks": str(marks_path), "summary": str(d / "summary.json"),
            "interval": INTERVAL, "restarts": kills + 2, "epoch_s": EPOCH_S,
            "t0": time.time() + lead}
    output.mkdir()
    poller = Poller(output)
    driver = launch(spec)
    done: list[Kill] = []
    detail = ""

    def alive() -> bool:
        return driver.poll() is None

    def caught_up() -> bool:
        due = int((time.time() - spec["t0"]) / EPOCH_S)
        return due >= 1 and poller.newest >= due - 10  # within a second of the input

    def loaded() -> bool:  # a checkpoint after the initial epoch: it holds the whole state
        epochs = committed_epochs(ckpt)
        return bool(epochs) and epochs[-1] >= 1

    while alive() and not (loaded() and caught_up()):
        time.sleep(0.02)
    for k in range(kills):
        if not alive():
            detail = f"the job ended after {len(done)} of {kills} kills"
            break
        time.sleep(rng.uniform(0.0, 2.0 * INTERVAL))
        workers = current_workers(read_marks(marks_path))
        pids = [m for m in workers if m["start"] >= (done[-1].at if done else 0.0)]
        if len(pids) != WORKERS or not alive():
            detail = f"no current workers to kill (kill {k})"
            break
        victim = rng.choice(pids)
        poller.poll()
        seen = poller.newest
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError:
            detail = f"worker {victim['worker']} was gone before kill {k}"
            break
        kill = Kill(runtime, run, k, time.time(), victim["worker"], seen)
        # the first epoch newer than any committed before the kill, committed by a new attempt
        recovered = None
        while alive() and recovered is None:
            time.sleep(0.002)
            newer = [(t, e) for e, (t, _) in poller.seen.items() if e > seen]
            if newer:
                first_at, _ = min(newer)
                attempt = [m for m in read_marks(marks_path) if m["start"] > kill.at]
                if len(attempt) >= WORKERS and first_at > max(m["built"] for m in attempt):
                    recovered = first_at
                elif len(attempt) < WORKERS:
                    seen = max(e for _, e in newer)  # output of the old attempt, still draining
        if recovered is None:
            kill.note = "the job ended before new output"
            done.append(kill)
            break
        kill.recovered_in = recovered - kill.at
        done.append(kill)
        print(f"  {runtime} run {run} kill {k}: worker {victim['worker']} (pid {victim['pid']}), "
              f"new output after {kill.recovered_in:.2f} s", flush=True)
        before = set(committed_epochs(ckpt))
        while alive() and not (set(committed_epochs(ckpt)) - before and caught_up()):
            time.sleep(0.02)
    code = driver.wait(timeout=1800)
    poller.poll()
    poller.stop()
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    marks = read_marks(marks_path)
    for kill in done:
        if kill.recovered_in is not None:
            breakdown(kill, summary, marks, kill.at + kill.recovered_in)
    identical = False
    if code != 0:
        detail = (detail + "; " if detail else "") + f"driver exited with {code} (log: {d}/summary.log)"
    else:
        identical = committed_table(output).equals(reference)
    checkpoint_times = [e["at"] for e in summary.get("events", []) if e["kind"] == "checkpoint"
                        and e.get("epoch") is not None]
    # each committed checkpoint's pause: [commit - total, commit - total + paused]
    pauses = [(at - st["total"], at - st["total"] + st["paused"])
              for at, st in zip(checkpoint_times, summary.get("stats", []), strict=False)]
    full_after: dict[str, int] = {}
    stats_iter = iter(summary.get("stats", []))
    largest = max((st["bytes_written"] for st in summary.get("stats", [])), default=0)
    last = "load"
    for e in summary.get("events", []):
        if e["kind"] == "restart":
            last = "restart"
        elif e["kind"] == "checkpoint" and e.get("epoch") is None:
            last = "failed"
        elif e["kind"] == "checkpoint":
            st = next(stats_iter, None)
            if st is None or st["epoch"] == 0:
                continue
            if st["bytes_written"] > 0.5 * largest:
                full_after[last] = full_after.get(last, 0) + 1
            last = "other"
    result = RecoveryRun(runtime, run, done, identical, summary.get("failures"),
                         summary.get("stats", []), dict(poller.seen), spec["t0"],
                         checkpoint_times, pauses,
                         [e["detail"] for e in summary.get("events", [])
                          if e["kind"] == "checkpoint" and e.get("epoch") is None],
                         full_after, detail)
    print(f"  {runtime} run {run}: {len(done)} kills, {summary.get('failures')} failures recovered, "
          f"output {'identical to' if identical else 'DIFFERENT from'} the failure-free run"
          + (f" ({detail})" if detail else ""), flush=True)
    if identical and not keep:
        shutil.rmtree(d, ignore_errors=True)
    return result


def reference_run(params: dict[str, Any], work: Path) -> tuple[pa.Table, float]:
    """The failure-free output (process runtime, no checkpoints, unpaced)."""
    d = work / "recovery-reference"
    d.mkdir(parents=True)
    spec = {**params, "runtime": "process", "output": str(d / "out"), "checkpoint": None,
            "marks": str(d / "marks.jsonl"), "summary": str(d / "summary.json"), "epoch_s": 0.0,
            "t0": 0.0, "interval": INTERVAL, "restarts": 0}
    began = time.monotonic()
    code = launch(spec).wait(timeout=1800)
    if code != 0:
        raise SystemExit(f"the failure-free recovery job failed; see {d}/summary.log")
    table = committed_table(d / "out")
    shutil.rmtree(d, ignore_errors=True)
    return table, time.monotonic() - began


def state_keys(megabytes: float) -> int:
    """Keys whose pickled ``{key: value_of(key)}`` is about ``megabytes`` MB."""
    import pickle

    sample = 20_000
    per_key = len(pickle.dumps({k: value_of(k) for k in range(sample)}, protocol=5)) / sample
    return int(megabytes * MB / per_key)


# == 4. and 5. incremental checkpoints and embedded stores ==========================================


@dataclass
class StoreRow:
    store: str
    write_s: list[float] = field(default_factory=list)
    incremental_s: list[float] = field(default_factory=list)
    subset_s: list[float] = field(default_factory=list)
    all_s: list[float] = field(default_factory=list)
    disk_bytes: int = 0


@dataclass
class IncrementalResult:
    keys: int
    live_bytes: int
    blob_bytes: int
    changed_bins: int
    bins_used: int
    export_s: list[float] = field(default_factory=list)
    reexport_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    incremental_s: list[float] = field(default_factory=list)
    full_bytes: int = 0
    incremental_bytes: int = 0
    incremental_reused: int = 0
    tracked_capture_s: list[float] = field(default_factory=list)
    """The capture of the changed bins only (``ChangeLog.capture``: the states' marks)."""
    tracked_s: list[float] = field(default_factory=list)
    tracked_bytes: int = 0
    tracked_reused: int = 0
    tracked_bins: int = 0
    """Bins the tracked capture exported (both workers)."""


def split_state(keys: int) -> tuple[list[Any], np.ndarray]:
    """The recovery job's state for ``keys`` keys as 2 workers' ``KeyedState``s (by
    ``RoutingTable.even(2)``), and every key's bin."""
    from tokenflow.dataflow.state import KeyedState, key_bins
    from tokenflow.state.bins import RoutingTable

    table = RoutingTable.even(WORKERS, BINS)
    all_keys = list(range(keys))
    bins = key_bins(all_keys, BINS)
    owners = table.owners[bins].tolist()
    states: list[KeyedState[int, bytes]] = [KeyedState() for _ in range(WORKERS)]
    for key, w in zip(all_keys, owners, strict=True):
        states[w].data[key] = value_of(key)
    for w, state in enumerate(states):
        state.attach(BINS, int(table.owned_by(w)[0]))
    return states, bins


def change_bins(states: list[Any], bins: np.ndarray, chosen: np.ndarray, version: int) -> None:
    """Stamp ``version`` into the value of every key whose bin is in ``chosen``."""
    stamp = version.to_bytes(8, "little")
    table_owner = np.isin(bins, chosen)
    for key in np.flatnonzero(table_owner).tolist():
        for state in states:
            if key in state.data:
                state.data[key] = state.data[key][:-8] + stamp
                break


def measure_incremental(keys: int, changed: float, rounds: int, work: Path,
                        rng: np.random.Generator) -> tuple[IncrementalResult, list[dict[int, pa.Table]]]:
    """Part 4; also returns the last exports (each worker's bins), which part 5 stores."""
    import pickle

    from tokenflow.state.bins import RoutingTable
    from tokenflow.state.changes import ChangeLog
    from tokenflow.state.snapshot import Snapshot, commit_snapshot, write_worker_part

    routing = RoutingTable.even(WORKERS, BINS)
    states, bins = split_state(keys)
    live = sum(len(pickle.dumps(s.data, protocol=5)) for s in states)
    n_changed = max(1, round(changed * BINS))
    result = IncrementalResult(keys, live, 0, n_changed, len(set(bins.tolist())))
    exports: list[dict[int, pa.Table]] = []
    for r in range(rounds):
        root = work / f"incremental-{r}"
        logs = [ChangeLog() for _ in states]
        start = time.perf_counter()  # the first capture: every bin (the states index their keys)
        # (a KeyedState exports at the capture: ``resolve``, the writer's part, has nothing left)
        captures = [log.capture({"kv": s}, 1, None, None).resolve()
                    for log, s in zip(logs, states, strict=True)]
        result.export_s.append(time.perf_counter() - start)
        exports = [c.tables["kv"] for c in captures]
        parts = [write_worker_part(root, job=JOB, epoch=1, worker=w, bins=BINS, states={"kv": e})
                 for w, e in enumerate(exports)]
        commit_snapshot(root, job=JOB, epoch=1, bins=BINS, routing=routing, parts=parts)
        result.full_bytes = sum(p.bytes_written for p in parts)
        chosen = rng.choice(BINS, n_changed, replace=False)
        change_bins(states, bins, chosen, 1_000 + r)
        start = time.perf_counter()  # tracked: only the bins the states marked changed
        tracked = [log.capture({"kv": s}, 4, 1, p.entries).resolve()
                   for log, s, p in zip(logs, states, parts, strict=True)]
        result.tracked_capture_s.append(time.perf_counter() - start)
        result.tracked_bins = sum(c.exported for c in tracked)
        start = time.perf_counter()  # untracked: every bin, the writer finds the changed ones
        changed_exports = [s.export() for s in states]
        result.reexport_s.append(time.perf_counter() - start)
        variants = ["tracked", "incremental", "full"]
        for variant in (variants if r % 2 == 0 else list(reversed(variants))):
            epoch = {"incremental": 2, "full": 3, "tracked": 4}[variant]
            start = time.perf_counter()
            if variant == "tracked":
                new = [write_worker_part(root, job=JOB, epoch=epoch, worker=w, bins=BINS,
                                         states=c.tables, previous=parts[w].entries,
                                         changed=c.changed)
                       for w, c in enumerate(tracked)]
            else:
                new = [write_worker_part(root, job=JOB, epoch=epoch, worker=w, bins=BINS,
                                         states={"kv": e},
                                         previous=parts[w].entries if variant == "incremental"
                                         else None)
                       for w, e in enumerate(changed_exports)]
            commit_snapshot(root, job=JOB, epoch=epoch, bins=BINS, routing=routing, parts=new)
            seconds = time.perf_counter() - start
            if variant == "incremental":
                result.incremental_s.append(seconds)
                result.incremental_bytes = sum(p.bytes_written for p in new)
                result.incremental_reused = sum(p.bytes_reused for p in new)
            elif variant == "tracked":
                result.tracked_s.append(seconds)
                result.tracked_bytes = sum(p.bytes_written for p in new)
                result.tracked_reused = sum(p.bytes_reused for p in new)
            else:
                result.full_s.append(seconds)
        if r == 0:  # the incremental checkpoints read back as the changed state
            expected = {b: t for e in changed_exports for b, t in e.items()}
            for epoch in (2, 4):
                snap = Snapshot.open(root, epoch, job=JOB, bins=BINS)
                snap.verify()
                tables = snap.read("kv", range(BINS))
                assert tables.keys() == expected.keys()
                assert all(tables[b].equals(expected[b]) for b in chosen.tolist() if b in expected)
            result.blob_bytes = sum(snap.stored_bytes("kv").values())
        shutil.rmtree(root)
        print(f"  incremental round {r + 1}: full {result.full_s[-1]:.2f} s, incremental "
              f"{result.incremental_s[-1]:.2f} s, tracked {result.tracked_s[-1]:.2f} s (capture "
              f"{result.tracked_capture_s[-1]:.3f} s instead of {result.reexport_s[-1]:.2f} s)",
              flush=True)
        exports = changed_exports
    return result, exports


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def _disk(path: Path) -> int:
    """Bytes allocated under ``path`` (LMDB's file is sparse)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


class ArrowFiles:
    name = "Arrow IPC files + manifest (ours)"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.parts: list[Any] = []

    def write(self, exports: list[dict[int, pa.Table]], epoch: int, incremental: bool) -> int:
        from tokenflow.state.bins import RoutingTable
        from tokenflow.state.snapshot import commit_snapshot, write_worker_part

        previous = self.parts if incremental else [None] * len(exports)
        parts = [write_worker_part(self.root, job=JOB, epoch=epoch, worker=w, bins=BINS,
                                   states={"kv": e}, previous=p.entries if p is not None else None)
                 for w, (e, p) in enumerate(zip(exports, previous, strict=True))]
        commit_snapshot(self.root, job=JOB, epoch=epoch, bins=BINS,
                        routing=RoutingTable.even(WORKERS, BINS), parts=parts)
        self.parts = parts
        return sum(p.bytes_written for p in parts)

    def read(self, wanted: list[int]) -> dict[int, pa.Table]:
        from tokenflow.state.snapshot import Snapshot

        return Snapshot.open(self.root, job=JOB, bins=BINS).read("kv", wanted)

    def close(self) -> None:
        pass


class SQLiteStore:
    def __init__(self, root: Path, synchronous: str) -> None:
        self.name = f"SQLite, WAL, synchronous={synchronous}"
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.dbs = []
        for w in range(WORKERS):
            db = sqlite3.connect(root / f"worker-{w}.db", isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute("CREATE TABLE IF NOT EXISTS blobs (state TEXT, bin INTEGER, blob BLOB, "
                       "PRIMARY KEY (state, bin)) WITHOUT ROWID")
            self.dbs.append(db)

    def write(self, exports: list[dict[int, pa.Table]], epoch: int, incremental: bool) -> int:
        size = 0
        for db, export in zip(self.dbs, exports, strict=True):
            rows = [("kv", b, _ipc(t)) for b, t in export.items()]
            size += sum(len(r[2]) for r in rows)
            db.execute("BEGIN")
            db.executemany("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        return size

    def read(self, wanted: list[int]) -> dict[int, pa.Table]:
        out: dict[int, pa.Table] = {}
        marks = ",".join("?" * len(wanted))
        for db in self.dbs:
            for b, blob in db.execute(f"SELECT bin, blob FROM blobs WHERE state = 'kv' AND bin IN "
                                      f"({marks})", wanted):
                out[b] = _decode(blob)
        return out

    def close(self) -> None:
        for db in self.dbs:
            db.close()


class LMDBStore:
    name = "LMDB (sync commit)"

    def __init__(self, root: Path) -> None:
        import lmdb

        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.envs = [lmdb.open(str(root / f"worker-{w}"), map_size=1 << 32, sync=True)
                     for w in range(WORKERS)]

    @staticmethod
    def key(b: int) -> bytes:
        return b"kv/" + b.to_bytes(4, "big")

    def write(self, exports: list[dict[int, pa.Table]], epoch: int, incremental: bool) -> int:
        size = 0
        for env, export in zip(self.envs, exports, strict=True):
            with env.begin(write=True) as txn:
                for b, t in export.items():
                    blob = _ipc(t)
                    size += len(blob)
                    txn.put(self.key(b), blob)
        return size

    def read(self, wanted: list[int]) -> dict[int, pa.Table]:
        out: dict[int, pa.Table] = {}
        for env in self.envs:
            with env.begin() as txn:
                for b in wanted:
                    blob = txn.get(self.key(b))
                    if blob is not None:
                        out[b] = _decode(blob)
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


def measure_stores(exports: list[dict[int, pa.Table]], keys: int, changed: float, rounds: int,
                   work: Path, rng: np.random.Generator
                   ) -> tuple[list[StoreRow], int, int, dict[str, float]]:
    """Part 5.  Returns the rows, the blob bytes of a full write and of the subset read, and
    parts of our read: ``open`` (``Snapshot.open``), ``crc_subset`` / ``crc_all`` (crc32 of the
    blobs read)."""
    import zlib

    from tokenflow.state.bins import RoutingTable
    from tokenflow.state.snapshot import Snapshot

    makers: dict[str, Callable[[Path], Any]] = {
        "arrow": ArrowFiles,
        "sqlite-full": lambda p: SQLiteStore(p, "FULL"),
        "sqlite-normal": lambda p: SQLiteStore(p, "NORMAL"),
    }
    try:
        import lmdb  # noqa: F401

        makers["lmdb"] = LMDBStore
    except ImportError:
        print("  lmdb is not installed: LMDB not measured (pip install lmdb)", flush=True)
    subset = RoutingTable.even(WORKERS, BINS).rebalanced(range(3)).owned_by(2).tolist()
    everything = list(range(BINS))
    blobs = {b: _ipc(t) for e in exports for b, t in e.items()}
    full_blobs = sum(map(len, blobs.values()))
    subset_blobs = sum(len(blobs[b]) for b in subset if b in blobs)
    timings: dict[str, list[float]] = {"open": [], "crc_subset": [], "crc_all": []}
    for _ in range(3):
        start = time.perf_counter()
        for b in subset:
            if b in blobs:
                zlib.crc32(blobs[b])
        timings["crc_subset"].append(time.perf_counter() - start)
        start = time.perf_counter()
        for blob in blobs.values():
            zlib.crc32(blob)
        timings["crc_all"].append(time.perf_counter() - start)
    del blobs
    # the incremental write: a few % of bins changed (new versions of the same tables)
    n_changed = max(1, round(changed * BINS))
    rows = {name: StoreRow(name) for name in makers}
    labels = {}
    for r, name in alternating(list(makers), rounds):
        root = work / f"store-{name}-{r}"
        store = makers[name](root)
        labels[name] = store.name
        row = rows[name]
        start = time.perf_counter()
        store.write(exports, 1, False)
        row.write_s.append(time.perf_counter() - start)
        row.disk_bytes = _disk(root)
        chosen = set(rng.choice(BINS, n_changed, replace=False).tolist())
        changed_exports = [{b: (t if b not in chosen else
                                pa.table({"pickle": pa.array([t.column(0)[0].as_py() + b"!"],
                                                             pa.binary())}))
                            for b, t in e.items()} for e in exports]
        start = time.perf_counter()
        store.write([{b: t for b, t in e.items() if b in chosen} for e in changed_exports]
                    if name != "arrow" else changed_exports, 2, True)
        row.incremental_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        got = store.read(subset)
        row.subset_s.append(time.perf_counter() - start)
        if name == "arrow":
            start = time.perf_counter()
            Snapshot.open(root, job=JOB, bins=BINS)
            timings["open"].append(time.perf_counter() - start)
        assert sorted(got) == sorted(b for b in subset if any(b in e for e in exports)), name
        start = time.perf_counter()
        got = store.read(everything)
        row.all_s.append(time.perf_counter() - start)
        expected = {b: t for e in changed_exports for b, t in e.items()}
        assert got.keys() == expected.keys(), name
        if r == 0:
            assert all(got[b].equals(expected[b]) for b in chosen if b in expected), name
        store.close()
        shutil.rmtree(root)
        print(f"  store {name} round {r + 1}: write {row.write_s[-1]:.2f} s, incremental "
              f"{row.incremental_s[-1]:.2f} s, read 1/3 {row.subset_s[-1]:.2f} s, all "
              f"{row.all_s[-1]:.2f} s", flush=True)
    out = list(rows.values())
    for row in out:
        row.store = labels[row.store]
    return out, full_blobs, subset_blobs, {k: median(v) for k, v in timings.items() if v}


# == report ======================================================================================


def ms(x: float) -> str:
    return f"{1000 * x:.0f}"


PHASES = ("hold", "pause", "drain", "run up", "align", "capture", "write", "commit")
"""Per-checkpoint steps in the tables: ``hold`` (both protocols), ``pause`` and ``drain``
(quiescent), ``run up`` and ``align`` (aligned: the workers' own, the longest of them),
``capture`` (quiescent: from quiescence until every worker captured; aligned: the longest
worker's export), ``write`` and ``commit``."""


def phase_durations(stats: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per checkpoint, seconds spent in each protocol step (``PHASES``: differences of
    ``phases``, or the workers' ``worker_phases`` for the aligned protocol)."""
    driver = [("hold", None, "held"), ("pause", "held", "paused"), ("drain", "paused", "idle"),
              ("capture", "idle", "captured"), ("write", "captured", "written"),
              ("commit", "written", None)]
    out: dict[str, list[float]] = {n: [] for n in PHASES}
    for s in stats:
        p = s.get("phases", {})
        for name, a, b in driver:
            start = 0.0 if a is None else p.get(a)
            end = s["total"] if b is None else p.get(b)
            if start is not None and end is not None:
                out[name].append(end - start)
        for name, seconds in (s.get("worker_phases") or {}).items():
            if name in out:
                out[name].append(seconds)
    return out


def cost_section(rows: list[CostRow]) -> tuple[list[str], list[str]]:
    """Lines of part 1 and the misses (for the summary)."""
    lines: list[str] = []
    misses: list[str] = []
    for runtime in ("process", "spark"):
        rs = [r for r in rows if r.runtime == runtime]
        if not rs:
            continue
        variants = rs[0].variants
        rounds = max(len(v) for r in rs for v in r.runs.values())
        lines += [f"### {runtime}" + (" (Spark `local[2]`)" if runtime == "spark" else ""), "",
                  f"{rounds} rounds per variant ({' / '.join(variants)}), alternating.  "
                  "Every run's collected rows and committed dataset were asserted identical to "
                  "the first run's.", "",
                  "| query | events | variant | events/s | ratio to none | per-round ratios | "
                  "p50 ms | p99 ms | p99 − none, ms (median; per round) | worker CPU s | "
                  "checkpoints per run | throughput target | p99 target |",
                  "|---|---:|---|---:|---:|---|---:|---:|---|---:|---:|---|---|"]
        for r in rs:
            if r.error is not None:
                lines.append(f"| {r.query} | {r.events:,} | — | failed: {r.error} | | | | | | | | | |")
                misses.append(f"{runtime} {r.query}: failed")
                continue
            for v in variants:
                if not r.runs[v]:
                    continue
                cpu = "" if r.runs[v][0].cpu_s is None else f"{r.med(v, 'cpu_s'):.1f}"
                n_ck = median(len(x.checkpoints) for x in r.runs[v])
                if v == "none":
                    lines.append(f"| {r.query} | {r.events:,} | {v} | {r.med(v, 'events_per_second'):,.0f} | "
                                 f"1 | | {r.med(v, 'p50_ms'):.0f} | {r.med(v, 'p99_ms'):.0f} | | {cpu} | "
                                 f"{n_ck:.0f} | | |")
                    continue
                ratio = median(r.paired(v, "events_per_second"))
                deltas = r.delta(v, "p99_ms")
                t_ok, p_ok = ratio >= THROUGHPUT_TARGET, median(deltas) <= P99_TARGET_MS
                targets = (verdict(t_ok), verdict(p_ok)) if v == "checkpoint" else ("", "")
                if v == "checkpoint":
                    if not t_ok:
                        misses.append(f"{runtime} {r.query} throughput {ratio:.3f}")
                    if not p_ok:
                        misses.append(f"{runtime} {r.query} p99 {median(deltas):+.0f} ms")
                lines.append(
                    f"| {r.query} | {r.events:,} | {v} | {r.med(v, 'events_per_second'):,.0f} | "
                    f"{ratio:.3f} | {spread(r.paired(v, 'events_per_second'))} | "
                    f"{r.med(v, 'p50_ms'):.0f} | {r.med(v, 'p99_ms'):.0f} | {median(deltas):+.0f} "
                    f"({spread(deltas, 0)}) | {cpu} | {n_ck:.0f} | {targets[0]} | {targets[1]} |")
        lines += ["", "Per checkpoint (all runs of the variant; medians, max in brackets; ms; "
                  "*discarded*: aligned attempts not a consistent cut, taken again by the quiescent "
                  "protocol; *held*: inputs holding records of the checkpoint's epoch or later at the "
                  "captures, both workers; *slow near*: of each run's "
                  f"{SLOW} slowest epochs, those within {NEAR} epochs after a checkpoint's epoch, "
                  "summed over the runs):",
                  "", "| query | variant | checkpoints | failed | discarded | paused | hold | pause at | "
                  "drain | run up | align | capture | write (async) | commit | total | sources "
                  "stalled | stalled share of job time | held | MB written | slow near |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  "---:|---:|---:|"]
        for r in rs:
            for v in (v for v in variants if v in CHECKPOINTING):
                stats = r.stats(v)
                if r.error is not None or not stats:
                    continue
                ph = phase_durations(stats)
                share = median(sum(s.get("stalled", s["paused"]) for s in x.checkpoints) / x.seconds
                               for x in r.runs[v])
                stalled = [s.get("stalled", s["paused"]) for s in stats]
                lines.append(
                    f"| {r.query} | {v} | {len(stats)} | {sum(len(x.failed) for x in r.runs[v])} | "
                    f"{sum(1 for s in stats if s.get('discarded'))} | "
                    f"{ms(median(s['paused'] for s in stats))} "
                    f"({ms(max(s['paused'] for s in stats))}) | "
                    + " | ".join(ms(median(ph[n])) if ph[n] else "" for n in PHASES)
                    + f" | {ms(median(s['total'] for s in stats))} | "
                    f"{ms(median(stalled))} ({ms(max(stalled))}) | {share:.1%} | "
                    f"{median(s.get('held', 0) for s in stats):.0f} | "
                    f"{median(s['bytes_written'] for s in stats) / MB:.2f} | "
                    f"{sum(x.slow_near for x in r.runs[v])} of {SLOW * len(r.runs[v])} |")
        lines.append("")
    return lines, misses


def recovery_section(runs: list[RecoveryRun], params: dict[str, Any], reference_s: float,
                     spark_launch: list[float] | None) -> tuple[list[str], list[str]]:
    lines: list[str] = []
    misses: list[str] = []
    lines += [
        f"State: {params['keys']:,} int keys with {VALUE_BYTES}-byte values in a `state_machine` "
        f"(`KeyedState`), {params['hot']} hot keys receiving {params['updates']:,} updates per "
        f"{EPOCH_S:g} s epoch ({params['updates'] / EPOCH_S:,.0f} updates/s, each one output row); "
        f"checkpoints every {INTERVAL:g} s.  The failure-free reference ran unpaced on `process` "
        f"without checkpoints ({reference_s:.0f} s).", ""]
    lines += ["| runtime | runs | kills | recovered | output identical | recovered in s: p50 | p95 | "
              "max | target (p95 <= 3 s) | state stored (a full checkpoint) MB | checkpoint paused "
              "ms / sources stalled ms (median / max) | MB written per checkpoint (median) | "
              "checkpoints committed / failed |",
              "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|---:|---|"]
    for runtime in ("process", "spark"):
        rs = [r for r in runs if r.runtime == runtime]
        if not rs:
            continue
        kills = [k for r in rs for k in r.kills]
        times = [k.recovered_in for k in kills if k.recovered_in is not None]
        stats = [s for r in rs for s in r.stats if s["epoch"] > 0]  # after the input began
        first = [max(s["bytes_written"] + s["bytes_reused"] for s in r.stats) for r in rs if r.stats]
        identical = sum(r.identical for r in rs)
        if times:
            p95 = pct(times, 95)
            ok = p95 <= RECOVERY_TARGET_S and len(times) == len(kills)
            if not ok:
                misses.append(f"recovery p95 on {runtime} {p95:.2f} s")
            cells = f"{pct(times, 50):.2f} | {p95:.2f} | {max(times):.2f} | {verdict(ok)}"
        else:
            cells = "— | — | — | not measured"
            misses.append(f"recovery on {runtime}: no kill recovered")
        if identical < len(rs):
            misses.append(f"{runtime}: {len(rs) - identical} run(s) with output different from "
                          "the failure-free run")
        stalled = [s.get("stalled", s["paused"]) for s in stats]
        paused = (f"{ms(median(s['paused'] for s in stats))} / {ms(max(s['paused'] for s in stats))}"
                  f"; {ms(median(stalled))} / {ms(max(stalled))}") if stats else "—"
        written = f"{median(s['bytes_written'] for s in stats[1:] or stats) / MB:.1f}" if stats else "—"
        lines.append(f"| {runtime} | {len(rs)} | {len(kills)} | {len(times)} | {identical} of {len(rs)} "
                     f"| {cells} | {median(first) / MB if first else 0:.0f} | {paused} | {written} | "
                     f"{sum(len(r.stats) for r in rs)} / {sum(len(r.failed_checkpoints) for r in rs)} |")
    lines += ["", "Where the time went (medians over the kills; seconds; see the docstring for the "
              "exact stamps):", "",
              "| runtime | kills | detect | wake | verify | start | load | replay | total | "
              "epochs replayed (median) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for runtime in ("process", "spark"):
        kills = [k for r in runs if r.runtime == runtime for k in r.kills if k.parts]
        if not kills:
            continue
        cells = " | ".join(f"{median(k.parts[p] for k in kills):.2f}" for p in PARTS)
        replayed = [k.seen_epoch - k.restored_epoch + 1 for k in kills if k.restored_epoch is not None]
        lines.append(f"| {runtime} | {len(kills)} | {cells} | "
                     f"{median(k.recovered_in for k in kills if k.recovered_in is not None):.2f} | "
                     f"{median(replayed) if replayed else 0:.0f} |")
    lines += ["", "Every kill:", "", "| runtime | run | kill | worker | recovered in s | restored "
              "epoch | epochs replayed | " + " | ".join(PARTS) + " | note |",
              "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(PARTS) + "---|"]
    for r in runs:
        for k in r.kills:
            rec = "—" if k.recovered_in is None else f"{k.recovered_in:.2f}"
            n_replayed = "" if k.restored_epoch is None else str(k.seen_epoch - k.restored_epoch + 1)
            parts = " | ".join(f"{k.parts[p]:.2f}" if p in k.parts else "" for p in PARTS)
            lines.append(f"| {r.runtime} | {r.run} | {k.index} | {k.victim} | {rec} | "
                         f"{'' if k.restored_epoch is None else k.restored_epoch} | {n_replayed} | "
                         f"{parts} | {k.note} |")
    reasons: dict[str, int] = {}
    for r in runs:
        for why in r.failed_checkpoints:
            reasons[why.split(", worker")[0][:90]] = reasons.get(why.split(", worker")[0][:90], 0) + 1
    if reasons:
        lines += ["", "Failed checkpoints (the job went on; the next checkpoint was taken "
                  f"{INTERVAL:g} s later): " + "; ".join(f"{n} x \"{why}\"" for why, n in reasons.items())
                  + "."]
    lines += ["", *recovery_commentary(runs, spark_launch)]
    notes = [f"{r.runtime} run {r.run}: {r.detail}" for r in runs if r.detail]
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    lines.append("")
    return lines, misses


def recovery_commentary(runs: list[RecoveryRun], spark_launch: list[float] | None) -> list[str]:
    """What the breakdown says, from the figures."""
    out = []
    for runtime in ("process", "spark"):
        kills = [k for r in runs if r.runtime == runtime for k in r.kills if k.parts]
        if not kills:
            continue
        med = {p: median(k.parts[p] for k in kills) for p in PARTS}
        total = median(k.recovered_in for k in kills if k.recovered_in is not None)
        top = sorted(PARTS, key=lambda p: -med[p])[:2]
        no_wake = [k.recovered_in - k.parts["wake"] for k in kills if k.recovered_in is not None]
        stats = [s for r in runs if r.runtime == runtime for s in r.stats if s["epoch"] > 0]
        capture = [s["phases"]["captured"] - s["phases"].get("idle", 0.0) for s in stats
                   if "captured" in s.get("phases", {})]
        share = (median(c / s["paused"] for c, s in zip(capture, stats, strict=False)
                        if s["paused"] > 0) if capture else 0.0)
        if med["wake"] > 0.1:
            wake = (f"*wake* ({med['wake']:.2f} s) is the supervisor's tick: "
                    f"`CheckpointedJob._checkpoint_loop` sleeps `interval` ({INTERVAL:g} s) on an "
                    "event that the job ending does not set, so a failure the runtime reported at "
                    "once is acted on only at the next tick (uniform over the interval); without it "
                    f"the recoveries would take p50 {pct(no_wake, 50):.2f} s, p95 "
                    f"{pct(no_wake, 95):.2f} s.  ")
        else:
            wake = (f"*wake* ({med['wake']:.2f} s): the supervisor acts on the failed job at once.  ")
        out.append(
            f"*{runtime}*: of the median {total:.2f} s, *{top[0]}* takes {med[top[0]]:.2f} s and "
            f"*{top[1]}* {med[top[1]]:.2f} s.  " + wake + f"*detect* is {med['detect']:.2f} s"
            + (" (the driver waits on each worker's process sentinel)" if runtime == "process"
               else " (the task's Python worker dies, Spark fails the task and aborts the barrier "
                    "stage)")
            + ((f"; for scale, a trivial job on this warm Spark session, its Python workers "
                f"reused, entered the job function {median(spark_launch):.2f} s after `execute` "
                f"(median of {len(spark_launch)}); after a kill the new tasks' Python workers "
                "are fresh processes that import tokenflow and pyarrow again, and the slots of "
                "the aborted stage must be free first")
               if runtime == "spark" and spark_launch else "")
            + f"; *start* ({med['start']:.2f} s) is "
            + ("forking two workers from the runtime's forkserver, which imported tokenflow, "
               "pyarrow and numpy once, and the mesh"
               if runtime == "process" else
               "a new barrier stage: task scheduling, Python workers forked by "
               "`tokenflow.spark.daemon` (tokenflow, pyarrow, pandas and PySpark's worker "
               "imported before the fork, its cached zip importers dropped), the mesh")
            + f"; *load* ({med['load']:.2f} s) reads and unpickles each worker's half of the "
            f"state; *replay* ({med['replay']:.2f} s) recomputes the epochs since the checkpoint "
            "from the backlog, discarding their output, and commits the next one.  Each "
            f"checkpoint of this state paused the job for {ms(median(s['paused'] for s in stats))} "
            f"ms (median), {share:.0%} of it in *capture* (the changed bins only: "
            f"{median(s.get('bins_exported', 0) for s in stats):.0f} bins exported per "
            "checkpoint, median).")
        out.append("")
    return out


def report(args: argparse.Namespace, command: str, cost: list[CostRow], runs: list[RecoveryRun],
           params: dict[str, Any], reference_s: float, incremental: IncrementalResult | None,
           stores: list[StoreRow], full_blobs: int, subset_blobs: int,
           phases: dict[str, float], extra: dict[str, Any]) -> str:
    import pyarrow

    now = extra.get("when") or datetime.datetime.now(datetime.UTC)
    lines = [
        "# Recovery: checkpoint cost, recovery time, incremental checkpoints, the state store",
        "",
        f"{now:%Y-%m-%d %H:%M} UTC.  Machine: {platform.platform()}, {platform.machine()}, "
        f"`os.cpu_count()` = {os.cpu_count()} (shared with other jobs).  Python "
        f"{platform.python_version()}, pyarrow {pyarrow.__version__}, numpy {np.__version__}, "
        f"SQLite {sqlite3.sqlite_version}"
        + (f", LMDB {'.'.join(map(str, __import__('lmdb').version()))}"
           if any(s.store.startswith("LMDB") for s in stores) else "")
        + f".  The run took {sum(phases.values()) / 60:.1f} min ("
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in phases.items()) + ").  "
        + extra.get("neighbours", "") + extra.get("provenance", provenance()),
        "",
        "The machine is shared, so absolute figures move from run to run: every comparison below "
        "is measured side by side in this run, variants alternating round by round, and the "
        "tables give medians.  Read the ratios.  What is measured and how: the docstring of "
        "`benchmarks/recovery.py`.",
        "",
        f"Regenerate: `{command}`",
        "",
    ]
    cost_lines, cost_misses = cost_section(cost)
    rec_lines, rec_misses = (recovery_section(runs, params, reference_s, extra.get("spark_launch"))
                             if runs else ([], []))
    lines += ["## Summary", ""]
    lines += summary_lines(cost, cost_misses, runs, rec_misses, incremental, stores, full_blobs,
                           extra.get("paced", []))
    lines += issues_lines(cost, runs)
    if cost:
        lines += ["## 1. What checkpoints every 1 s cost (NEXMark, 2 workers)", "",
                  f"Targets: events/s with checkpoints >= {THROUGHPUT_TARGET} x without, epoch "
                  f"latency p99 at most +{P99_TARGET_MS:g} ms.  *none*: no checkpoint directory "
                  "(plain `execute`); *control*: under the control plane (coordinator, per-step "
                  "command polling) but never checkpointing; *quiescent*: a checkpoint every 1 s "
                  "by the quiescent protocol (`CheckpointedJob(aligned=False)`, the protocol "
                  "before aligned checkpoints); *checkpoint*: every 1 s by the aligned protocol "
                  "(the default; the targets apply to it).  Ratios and p99 differences are "
                  "against *none*, per round.", ""]
        lines += cost_lines
        if extra.get("paced"):
            lines += paced_lines(extra["paced"], extra.get("paced_rounds", 0))
        lines += cost_commentary(cost)
    if runs:
        lines += ["## 2. Recovery time after SIGKILL of a worker", ""]
        lines += rec_lines
        lines += ["![throughput and latency around a kill](recovery.png)", "",
                  "![where each recovery's time went](recovery_breakdown.png)", ""]
    job_capture = [s["phases"]["captured"] - s["phases"]["idle"] for r in runs for s in r.stats
                   if s["epoch"] > 0 and "idle" in s["phases"] and "captured" in s["phases"]]
    if incremental is not None:
        lines += incremental_lines(incremental, median(job_capture) if job_capture else None)
    if stores:
        capture = median(incremental.reexport_s) if incremental is not None else float("nan")
        lines += store_lines(stores, full_blobs, subset_blobs, args.rounds_store, capture,
                             extra.get("read_parts", {}))
    return "\n".join(lines)


def paced_summary(paced: Sequence[dict[str, Any]]) -> str:
    """The half-load p99 sentence of summary item 1 (empty without half-load runs)."""
    done = [e for e in paced if e["runs"]["checkpoint"] and e["runs"]["none"]]
    if not done:
        return ""
    deltas = {e["query"]: median(paced_delta(e)) for e in done}
    met = sum(d <= P99_TARGET_MS for d in deltas.values())
    return ("  At half load (process, open loop): p99 change "
            + ", ".join(f"{q} {d:+.1f} ms" for q, d in deltas.items())
            + f"; target <= +{P99_TARGET_MS:g} ms: {verdict(met == len(deltas))}"
            + (f" ({met} of {len(deltas)} met)" if met < len(deltas) else ""))


def summary_lines(cost: list[CostRow], cost_misses: list[str], runs: list[RecoveryRun],
                  rec_misses: list[str], incremental: IncrementalResult | None,
                  stores: list[StoreRow], full_blobs: int,
                  paced: Sequence[dict[str, Any]] = ()) -> list[str]:
    out = []
    measured = [r for r in cost if r.error is None and "checkpoint" in r.runs and r.runs["checkpoint"]]
    if measured:
        t = ", ".join(f"{r.query}{'' if r.runtime == 'process' else ' (Spark)'} "
                      f"{median(r.paired('checkpoint', 'events_per_second')):.3f}" for r in measured)
        p = ", ".join(f"{r.query}{'' if r.runtime == 'process' else ' (Spark)'} "
                      f"{median(r.delta('checkpoint', 'p99_ms')):+.0f} ms" for r in measured)
        tp = [m for m in cost_misses if "throughput" in m or "failed" in m]
        pp = [m for m in cost_misses if "p99" in m]
        n = len(measured)
        out += [f"1. **Checkpoint cost** — throughput with/without checkpoints (median of the "
                f"per-round ratios): {t}; target >= {THROUGHPUT_TARGET}: {verdict(not tp)}"
                + (f" ({n - len(tp)} of {n} met; missed: {', '.join(tp)})"
                   if tp else "")
                + f".  Epoch latency p99 change: {p}; target <= +{P99_TARGET_MS:g} ms: "
                f"{verdict(not pp)}" + (f" ({n - len(pp)} of {n} met)" if pp else "") + "."
                + paced_summary(paced), ""]
    for runtime in ("process", "spark"):
        times = [k.recovered_in for r in runs if r.runtime == runtime for k in r.kills
                 if k.recovered_in is not None]
        rs = [r for r in runs if r.runtime == runtime]
        if not rs:
            continue
        kills = sum(len(r.kills) for r in rs)
        ok = bool(times) and pct(times, 95) <= RECOVERY_TARGET_S and len(times) == kills
        fig = (f"p50 {pct(times, 50):.2f} s, p95 {pct(times, 95):.2f} s, max {max(times):.2f} s over "
               f"{len(times)} of {kills} kills") if times else "no kill recovered"
        stored = [max(s["bytes_written"] + s["bytes_reused"] for s in r.stats) for r in rs if r.stats]
        size = f"{median(stored) / MB:.0f} MB" if stored else "?"
        out += [f"2. **Recovery on {runtime}** ({size} of state in the checkpoint): {fig}; target p95 <= "
                f"{RECOVERY_TARGET_S:g} s: {verdict(ok)}; output identical to the failure-free run "
                f"in {sum(r.identical for r in rs)} of {len(rs)} runs.", ""]
    if incremental is not None:
        out += [f"4. **Incremental checkpoint** with {incremental.changed_bins / BINS:.0%} of the bins "
                f"changed: {incremental.incremental_bytes / MB:.1f} MB written instead of "
                f"{incremental.full_bytes / MB:.1f} MB, {median(incremental.incremental_s):.2f} s "
                f"instead of {median(incremental.full_s):.2f} s"
                + (f" (tracked bins: {incremental.tracked_bytes / MB:.1f} MB in "
                   f"{median(incremental.tracked_s):.2f} s)" if incremental.tracked_s else "")
                + f"; the capture takes {median(incremental.reexport_s):.2f} s exporting every bin"
                + (f", {median(incremental.tracked_capture_s):.3f} s exporting only the bins the "
                   "state marked changed" if incremental.tracked_capture_s else "") + ".", ""]
    if stores:
        best_w = min(stores, key=lambda s: median(s.write_s))
        best_r = min(stores, key=lambda s: median(s.subset_s))
        out += [f"5. **Store** — fastest durable full write: {best_w.store}; fastest 1/3 read: "
                f"{best_r.store} (details and the choice in section 5).", ""]
    return out


def cost_commentary(cost: list[CostRow]) -> list[str]:
    measured = [r for r in cost if r.error is None and r.stats()]
    if not measured:
        return []
    parts = []
    for r in measured:
        where = "" if r.runtime == "process" else " on Spark"
        per = r.epochs / max(1.0, median(len(x.checkpoints) for x in r.runs["checkpoint"]))
        ph = phase_durations(r.stats())
        text = (f"{r.query}{where}: aligned, sources stalled "
                f"{ms(median(s.get('stalled', s['paused']) for s in r.stats()))} ms per checkpoint "
                f"(align {ms(median(ph['align'])) if ph['align'] else '?'} ms, capture "
                f"{ms(median(ph['capture'])) if ph['capture'] else '?'} ms), "
                f"{sum(x.slow_near for x in r.runs['checkpoint'])} of "
                f"{SLOW * len(r.runs['checkpoint'])} slowest epochs near a checkpoint")
        if r.stats("quiescent"):
            text += (f"; quiescent: stalled "
                     f"{ms(median(s.get('stalled', s['paused']) for s in r.stats('quiescent')))} "
                     f"ms, {sum(x.slow_near for x in r.runs['quiescent'])} of "
                     f"{SLOW * len(r.runs['quiescent'])} slowest epochs near a checkpoint, "
                     f"throughput {median(r.paired('quiescent', 'events_per_second')):.3f}, p99 "
                     f"{median(r.delta('quiescent', 'p99_ms')):+.0f} ms")
        text += f"; one checkpoint per {per:.0f} epochs"
        cpus = [a.cpu_s / b.cpu_s for a, b in zip(r.runs["checkpoint"], r.runs["none"], strict=False)
                if a.cpu_s and b.cpu_s]  # (saved runs from before worker_cpu_s have none)
        if cpus:
            text += f", worker CPU checkpoint/none {median(cpus):.3f}"
        if r.runs.get("control"):
            text += f", the control plane alone {median(r.paired('control', 'events_per_second')):.3f}"
        parts.append(text)
    rounds = [v for r in measured for v in r.paired("checkpoint", "events_per_second")]
    failed = sum(len(x.failed) for r in measured for v in CHECKPOINTING for x in r.runs.get(v, []))
    discarded = sum(1 for r in measured for s in r.stats() if s.get("discarded"))
    return ["**Reading the tables.**  Both protocols start alike (*hold*: each worker names its "
            "safe point plus a margin of one epoch and its sources go on up to it while the "
            "driver picks the common epoch).  *Quiescent*: sources finish the epochs before the "
            "common one and stop (*pause at*), the job drains (*drain*; every worker then waits "
            "for the verdict without stepping) and every worker captures (*capture*: the bins "
            "changed since the last committed checkpoint) and resumes.  *Aligned*: sources finish "
            "the epochs before the common one (*run up*) and the worker steps on until the job "
            "has finished them (*align*; records of the epoch or later that other workers send "
            "meanwhile wait at its operators' inputs: *held*), then it captures (*capture*) and "
            "resumes at once, without a message from the driver or another worker.  The parts "
            "are written asynchronously (*write*, a thread of each worker) and the driver commits "
            "the manifest (*commit*).  *paused* runs from *hold* to the last capture (aligned: "
            "the sources of a worker that captured run meanwhile); *sources stalled* is what a "
            "worker measured: from the step after which all its sources stood still until they "
            "resumed (the longest of the workers).  "
            + "; ".join(parts) + ".  "
            f"Single rounds' throughput ratios spread over {spread(rounds)} on this shared "
            "machine, so a median of this many rounds can land on either side of the 5 % target "
            "from one run to the next; the workers' CPU seconds, less disturbed by other jobs, "
            "show what checkpoints add to the work."
            + (f"  {failed} checkpoint(s) failed during these runs." if failed else "")
            + (f"  {discarded} aligned checkpoint(s) were discarded as not a consistent cut and "
               "taken again by the quiescent protocol." if discarded else ""), ""]


def issues_lines(cost: list[CostRow], runs: list[RecoveryRun]) -> list[str]:
    """What the measurements show about the library, with the figures."""
    out = []
    failed_cost = sum(len(x.failed) for r in cost for x in r.runs.get("checkpoint", []))
    taken_cost = sum(len(r.stats()) for r in cost)
    failed_rec = sum(len(r.failed_checkpoints) for r in runs)
    taken_rec = sum(len(r.stats) for r in runs)
    if failed_cost or failed_rec:
        out.append(f"* **Checkpoints fail on a race**: {failed_rec} of {failed_rec + taken_rec} "
                   f"checkpoints of the recovery job and {failed_cost} of "
                   f"{failed_cost + taken_cost} of the NEXMark runs failed with \"expected "
                   "'captured' replies, worker N sent {'kind': 'written', ...}\": the driver "
                   "gathers `captured` from every worker (`tokenflow.control._gather`), but a "
                   "worker that captured early has already started its background write and its "
                   "`written` reply of the same round can arrive before a slower worker's "
                   "`captured`; `_gather` treats any other kind as a protocol error.  The job "
                   "goes on and the next checkpoint comes an interval later, so recovery falls "
                   "back further (more replay) but output stays exactly-once.")
    wake = [k.parts["wake"] for r in runs for k in r.kills if k.parts]
    if wake and median(wake) > 0.1:
        out.append(f"* **Restart waits for the checkpoint tick**: *wake* took {median(wake):.2f} s "
                   f"(median, up to {max(wake):.2f} s) of each recovery: "
                   "`CheckpointedJob._checkpoint_loop` sleeps `self._wake.wait(self.interval)`, "
                   "and nothing sets `_wake` when the job's thread ends, so a failure is handled "
                   "only at the next tick (a job that ends normally also returns up to "
                   "`interval` late).")
    full: dict[str, int] = {}
    for r in runs:
        for why, n in r.full_after.items():
            full[why] = full.get(why, 0) + n
    if full.get("restart", 0) + full.get("failed", 0):
        out.append(f"* **Incremental checkpoints start over**: of the recovery job's checkpoints, "
                   f"{sum(full.values())} wrote more than half the state: {full.get('load', 0)} "
                   f"first checkpoints after the initial load (expected), {full.get('restart', 0)} "
                   f"first checkpoints after a restart, {full.get('failed', 0)} checkpoints right "
                   f"after a failed one, {full.get('other', 0)} others.")
    elif full:
        out.append(f"* **Incremental checkpoints**: of the recovery job's {taken_rec} committed "
                   f"checkpoints, {sum(full.values())} wrote more than half the state: "
                   f"{full.get('load', 0)} first checkpoints after the initial load (one per run)"
                   + (f" and {full.get('other', 0)} right after one of those: when the first "
                      "checkpoint comes while a worker still holds the initial records pending "
                      "(`PendingRecords`: its fold applies them once the frontier passes epoch "
                      "0), the next one writes that worker's keyed state, now filled"
                      if full.get("other", 0) else "")
                   + "; the first checkpoint after each restart built on the restored one and "
                   "wrote only the bins changed since.")
    stats = [s for r in runs for s in r.stats if s["epoch"] > 0 and "captured" in s["phases"]
             and "idle" in s["phases"] and s["paused"] > 0]
    if stats:
        capture = median((s["phases"]["captured"] - s["phases"]["idle"]) / s["paused"] for s in stats)
        size = median(max(s["bytes_written"] + s["bytes_reused"] for s in r.stats)
                      for r in runs if r.stats) / MB
        exported = [s.get("bins_exported", 0) for s in stats]
        out.append(f"* **The capture**: with {size:.0f} MB of `KeyedState`, *capture* is "
                   f"{capture:.0%} of each checkpoint's pause "
                   f"({ms(median(s['paused'] for s in stats))} ms median); a capture exported "
                   f"{median(exported):.0f} bins (median, both workers; max {max(exported)}) of "
                   f"the {BINS:,} holding keys: the bins the state marked changed since the last "
                   "committed checkpoint (`KeyedState` tracks them; `tokenflow.state.changes`).")
    if out:
        out = ["Also seen (details in the sections):", "", *out, ""]
    return out


def incremental_lines(inc: IncrementalResult, job_capture: float | None) -> list[str]:
    tracked = bool(inc.tracked_s)
    rows = [
        f"| first (full) | {inc.full_bytes / MB:.1f} | 0 | — | {median(inc.export_s):.2f} | — |",
        f"| second, full | {inc.full_bytes / MB:.1f} | 0 | {median(inc.full_s):.2f} | "
        f"{median(inc.reexport_s):.2f} | {inc.blob_bytes / MB / median(inc.full_s):.0f} |",
        f"| second, incremental by checksum (every bin captured) | {inc.incremental_bytes / MB:.2f} | "
        f"{inc.incremental_reused / MB:.1f} | {median(inc.incremental_s):.2f} | "
        f"{median(inc.reexport_s):.2f} | {inc.blob_bytes / MB / median(inc.incremental_s):.0f} |"]
    if tracked:
        rows.append(
            f"| second, incremental by tracked bins (changed bins captured) | "
            f"{inc.tracked_bytes / MB:.2f} | {inc.tracked_reused / MB:.1f} | "
            f"{median(inc.tracked_s):.2f} | {median(inc.tracked_capture_s):.3f} | "
            f"{inc.blob_bytes / MB / median(inc.tracked_s):.0f} |")
    text = [
        "## 4. Incremental vs full checkpoint (same state)", "",
        f"The recovery job's state: {inc.keys:,} keys, {inc.live_bytes / MB:.0f} MB pickled, "
        f"{inc.blob_bytes / MB:.0f} MB of blobs in {inc.bins_used:,} bins over 2 workers.  After a "
        f"full checkpoint, every key of {inc.changed_bins} bins ({inc.changed_bins / BINS:.1%}) was "
        f"changed and a second checkpoint written in full, incrementally with every bin captured "
        f"(`export()`; `previous=`: the writer finds the unchanged bins by crc32)"
        + (" and incrementally with only the changed bins captured (`ChangeLog.capture`: the "
           "bins `KeyedState` marked changed; `changed=`: the other bins are referenced unread)"
           if tracked else "")
        + f", alternating the order; {len(inc.full_s)} rounds, medians.  Write = "
        "`write_worker_part` for both workers + `commit_snapshot` (files fsynced); capture = "
        "the export that precedes it (what pauses the job).", "",
        "| checkpoint | MB written | MB referenced (reused) | write s | capture s (both "
        "workers) | write MB/s of state |", "|---|---:|---:|---:|---:|---:|", *rows, "",
        f"Incremental by checksum writes {inc.incremental_bytes / inc.full_bytes:.1%} of the bytes "
        f"and takes {median(inc.incremental_s) / median(inc.full_s):.0%} of the full write's time: "
        "it still serializes every bin to IPC and checksums it to find the unchanged ones, after "
        f"a capture that pickles every bin ({median(inc.reexport_s):.2f} s here for both workers "
        "one after the other)."]
    if tracked:
        text[-1] += (
            f"  With tracked bins the capture exports {inc.tracked_bins} bins "
            f"({inc.tracked_bins / max(1, inc.bins_used):.1%} of those holding keys) in "
            f"{median(inc.tracked_capture_s) * 1000:.0f} ms, "
            f"{median(inc.reexport_s) / max(1e-9, median(inc.tracked_capture_s)):.0f}x less than "
            f"capturing every bin, and the write takes {median(inc.tracked_s):.2f} s "
            f"({median(inc.tracked_s) / median(inc.full_s):.0%} of the full write)")
        text[-1] += (f"; in the job of section 2 each worker captures in parallel with the other: "
                     f"{job_capture * 1000:.0f} ms per checkpoint, median." if job_capture is not None
                     else ".")
    return [*text, ""]


def store_lines(stores: list[StoreRow], full_blobs: int, subset_blobs: int, rounds: int,
                capture_s: float, read_parts: dict[str, float]) -> list[str]:
    arrow = next(s for s in stores if s.store.startswith("Arrow"))
    lines = [
        "## 5. Which embedded store for per-bin state", "",
        f"The same per-bin Arrow IPC blobs ({full_blobs / MB:.0f} MB in {BINS:,} bins, 2 workers "
        f"each writing its own store; serialization to IPC included everywhere); {rounds} rounds, "
        "stores alternating, medians.  *write*: a full checkpoint, durable on return (our files "
        "and the LMDB commit are fsynced; SQLite as its `synchronous` setting says); "
        "*incremental*: a second checkpoint with 3 % of the bins changed (ours: `previous=`, the "
        "others: one transaction replacing those rows); *read 1/3*: the bins a new third worker "
        f"owns after a 2 -> 3 rescale ({subset_blobs / MB:.0f} MB from both stores), decoded; "
        "*read all*: every bin (a restart at the same worker count).  Reads from the page cache.",
        "", "| store | write s | write MB/s | incremental s | read 1/3 s | read 1/3 MB/s | "
        "read all s | read all MB/s | on disk after full write, MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in stores:
        lines.append(
            f"| {s.store} | {median(s.write_s):.2f} | {full_blobs / MB / median(s.write_s):.0f} | "
            f"{median(s.incremental_s):.2f} | {median(s.subset_s):.2f} | "
            f"{subset_blobs / MB / median(s.subset_s):.0f} | {median(s.all_s):.2f} | "
            f"{full_blobs / MB / median(s.all_s):.0f} | {s.disk_bytes / MB:.0f} |")
    durable = [s for s in stores if "NORMAL" not in s.store]
    best_w = min(durable, key=lambda s: median(s.write_s))
    best_r = min(durable, key=lambda s: median(s.subset_s))
    comparison = []
    for other in durable:
        if other is arrow:
            continue
        comparison.append(
            f"{other.store} takes {median(other.write_s) / median(arrow.write_s):.2f}x our time "
            f"for the full write, {median(other.subset_s) / median(arrow.subset_s):.2f}x for the "
            f"1/3 read and {median(other.all_s) / median(arrow.all_s):.2f}x for reading all")
    if best_w is arrow and best_r is arrow:
        winner = "Our files are the fastest durable store here for writing and for reading."
    else:
        gains = []
        for label, best, attr in (("the full write", best_w, "write_s"),
                                  ("the 1/3 read", best_r, "subset_s")):
            if best is not arrow:
                saved = median(getattr(arrow, attr)) - median(getattr(best, attr))
                share = 1 - median(getattr(best, attr)) / median(getattr(arrow, attr))
                gains.append(f"{best.store.split(' (')[0]} is faster at {label} by "
                             f"{saved:.2f} s ({share:.0%})")
        if best_w is best_r and len(gains) == 2:
            gains[1] = gains[1].replace(f"{best_r.store.split(' (')[0]} is faster at ", "at ")
        winner = (" and ".join(gains) + f" at {full_blobs / MB:.0f} MB: small next to what a "
                  "checkpoint of this state costs before any byte is stored (the capture: "
                  f"{capture_s:.2f} s for both halves in one process, section 4) and next to a "
                  "recovery's start-up (section 2).")
    if read_parts:
        winner += (f"  Our 1/3 read ({median(arrow.subset_s):.2f} s) includes opening the "
                   f"snapshot (manifest and the two workers' JSON indexes of up to {BINS:,} "
                   f"entries each: {read_parts.get('open', float('nan')):.3f} s) and checking a "
                   f"crc32 per blob ({read_parts.get('crc_subset', float('nan')):.3f} s; "
                   f"{read_parts.get('crc_all', float('nan')):.3f} s for all bins); our write "
                   "fsyncs each worker's two files and the directory after each rename, and the "
                   "manifest, where an LMDB commit syncs once per environment.")
    lines += [
        "",
        "*incremental*: our files are handed the whole capture and find the unchanged bins by "
        "crc32 (every bin serialized again); SQLite and LMDB were handed only the changed bins, "
        "which needs the operator to track the bins it changed (`KeyedState` does not), so that "
        "column favours them.  SQLite's size on disk includes its WAL (the data are written "
        "twice: to the WAL at commit, then into the database file at the WAL checkpoint).",
        "",
        "**Conclusion.**  " + "; ".join(comparison) + ".  " + winner + "  "
        "We keep the Arrow files: the blobs are Arrow IPC already, so a store would add only an "
        "index, and ours is a JSON file per worker with a crc32 per blob (every read is "
        "verified, which neither SQLite nor LMDB does by default); the files are immutable once "
        "written, which is what makes incremental checkpoints (a reference into an earlier file), "
        "two versions (the fallback) and pruning simple; they go through `pyarrow.fs`, so a "
        "checkpoint directory can live on HDFS or an object store that every Spark executor "
        "reaches, where SQLite (unsafe on network filesystems) and LMDB (a memory-mapped local "
        "file, one writer per file) cannot; and they add no dependency.  A rescale reads each new "
        "worker's bins with one ranged read per run of adjacent blobs, as the 1/3 column shows.",
        ""]
    return lines


def plot(runs: list[RecoveryRun], path: Path, breakdown_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # per runtime, the last kill of the first run (no later kill in the window)
    shown: list[tuple[RecoveryRun, Kill]] = []
    for runtime in ("process", "spark"):
        for r in runs:
            done = [k for k in r.kills if r.runtime == runtime and k.recovered_in is not None]
            if done:
                shown.append((r, done[-1]))
                break
    if shown:
        fig, axes = plt.subplots(2, len(shown), figsize=(6.5 * len(shown), 7), squeeze=False,
                                 sharex="col")
        for col, (r, kill) in enumerate(shown):
            lo, hi = kill.at - 3.0, kill.at + (kill.recovered_in or 0) + 4.0
            seen = sorted((t - kill.at, e, rows) for e, (t, rows) in r.seen.items() if lo <= t <= hi)
            edges = np.arange(lo - kill.at, hi - kill.at + 0.1, 0.1)
            rows_per = np.histogram([s[0] for s in seen], bins=edges, weights=[s[2] for s in seen])[0]
            ax, bx = axes[0][col], axes[1][col]
            ax.bar(edges[:-1], rows_per, width=0.1, align="edge", color="tab:blue")
            ax.set_ylabel("rows committed per 100 ms")
            ax.set_title(f"{r.runtime}: SIGKILL of worker {kill.victim} at 0 s, new output after "
                         f"{kill.recovered_in:.2f} s", fontsize=10)
            latency = [(s[0], s[0] + kill.at - (r.t0 + s[1] * EPOCH_S)) for s in seen]
            bx.plot([x for x, _ in latency], [y for _, y in latency], marker=".", linestyle="-",
                    color="tab:orange", markersize=3)
            bx.set_ylabel("epoch latency, s (committed − released)")
            bx.set_xlabel("seconds from the kill")
            for axis in (ax, bx):
                for i, other in enumerate(k for k in r.kills if lo <= k.at <= hi):
                    axis.axvline(other.at - kill.at, color="red", linewidth=1.5,
                                 label="SIGKILL of a worker" if i == 0 else None)
                axis.axvline(kill.recovered_in or 0, color="green", linestyle="--", linewidth=1,
                             label="first new epoch committed")
                for i, c in enumerate(t for t in r.checkpoint_times if lo <= t <= hi):
                    axis.axvline(c - kill.at, color="0.5", linestyle=":", linewidth=1,
                                 label="checkpoint committed" if i == 0 else None)
                for i, (a, b) in enumerate(p for p in r.pauses if lo <= p[0] <= hi):
                    axis.axvspan(a - kill.at, b - kill.at, color="tab:purple", alpha=0.25,
                                 label="checkpoint: hold to captured (sources stand still only at its end)"
                                 if i == 0 else None)
                axis.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    kills = [k for r in runs for k in r.kills if k.parts]
    if kills:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(kills) + 2), 4.5))
        colors = plt.get_cmap("tab10")
        bottom = np.zeros(len(kills))
        for i, p in enumerate(PARTS):
            values = np.array([k.parts[p] for k in kills])
            ax.bar(range(len(kills)), values, bottom=bottom, color=colors(i), label=p)
            bottom += values
        ax.axhline(RECOVERY_TARGET_S, color="red", linestyle="--", linewidth=1,
                   label=f"target p95 {RECOVERY_TARGET_S:g} s")
        ax.set_ylim(0, max(RECOVERY_TARGET_S, float(bottom.max())) * 1.12)
        ax.set_xticks(range(len(kills)), [f"{k.runtime[0]}{k.run}.{k.index}" for k in kills],
                      fontsize=7, rotation=90)
        ax.set_xlabel("kill (p = process, s = Spark local[2]; run.kill)")
        ax.set_ylabel("seconds from SIGKILL to the first new epoch committed")
        ax.set_title("where each recovery's time went")
        ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        fig.savefig(breakdown_path, dpi=110)
        plt.close(fig)


# == main ========================================================================================


class Neighbours:
    """Samples, every 5 s, the Python scripts other than this benchmark's process tree that are
    running on the machine (the machine is shared), and the load average."""

    def __init__(self) -> None:
        self.samples = 0
        self.seen: dict[str, int] = {}
        self.load: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(5.0):
            try:
                mine = {me.pid} | {c.pid for c in me.children(recursive=True)}
            except psutil.Error:
                continue
            names = set()
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = proc.info.get("cmdline") or []
                if proc.info["pid"] in mine or not cmd or "python" not in os.path.basename(cmd[0]):
                    continue
                script = next((a for a in cmd[1:] if a.endswith(".py") or a == "pytest"), None)
                if script is not None:  # the last two path parts: enough to recognise it
                    names.add("/".join(script.split("/")[-2:]))
            self.samples += 1
            self.load.append(os.getloadavg()[0])
            for name in names:
                self.seen[name] = self.seen.get(name, 0) + 1

    def describe(self) -> str:
        self._stop.set()
        if not self.samples:
            return ""
        ranked = sorted(self.seen.items(), key=lambda item: -item[1])
        others = ", ".join(f"`{n}` in {c / self.samples:.0%}" for n, c in ranked[:4])
        if len(ranked) > 4:
            others += (f" and {len(ranked) - 4} more (each in at most "
                       f"{ranked[4][1] / self.samples:.0%})")
        return (f"Other Python scripts seen running (sampled every 5 s, share of samples): "
                f"{others or 'none'}; "
                f"1-minute load average median {median(self.load):.1f} (2 cores).  ")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes, smaller everything")
    parser.add_argument("--query", nargs="*", default=["q4", "q5", "q8"])
    parser.add_argument("--events", nargs="*", help="events per query, e.g. q4=3000000")
    parser.add_argument("--rounds", type=int, help="rounds per variant (default 5; quick 2)")
    parser.add_argument("--spark-query", nargs="*", default=["q4", "q5", "q8"])
    parser.add_argument("--spark-rounds", type=int, help="Spark rounds (default 3; quick 1)")
    parser.add_argument("--state-mb", type=float, help="pickled state MB (default 100; quick 20)")
    parser.add_argument("--hot", type=int, default=100)
    parser.add_argument("--updates", type=int, default=1000, help="updates per 0.1 s epoch")
    parser.add_argument("--kills", type=int, help="kills per run (default 5; quick 2)")
    parser.add_argument("--runs", type=int, help="runs per runtime (default 2; quick 1)")
    parser.add_argument("--runtimes", default="process,spark")
    parser.add_argument("--changed", type=float, default=0.03, help="fraction of bins changed")
    parser.add_argument("--rounds-store", type=int, default=None, help="default 3; quick 2")
    parser.add_argument("--skip", nargs="*", default=[], choices=["cost", "paced", "spark-cost",
                                                                   "recovery", "incremental", "stores"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", help="work directory parent (default: a temporary directory)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--save", help="also pickle the measurements to this file")
    parser.add_argument("--load", help="write the report and plots from measurements saved with "
                        "--save (measures nothing)")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    quick = args.quick
    events = {"q4": 600_000, "q5": 2_000_000, "q8": 2_000_000} if quick else \
        {"q4": 3_000_000, "q5": 10_000_000, "q8": 10_000_000}
    for item in args.events or []:
        q, n = item.split("=")
        events[q] = int(n)
    args.rounds = args.rounds or (2 if quick else 5)
    args.spark_rounds = args.spark_rounds or (1 if quick else 3)
    args.state_mb = args.state_mb or (20.0 if quick else 100.0)
    args.kills = args.kills or (2 if quick else 5)
    args.runs = args.runs or (1 if quick else 2)
    args.rounds_store = args.rounds_store or (2 if quick else 3)
    command = ".venv/bin/python benchmarks/recovery.py" + (" --quick" if quick else "")
    if args.load:
        import pickle

        saved = pickle.loads(Path(args.load).read_bytes())
        args.rounds_store = saved.pop("rounds_store")
        write_report(args, **saved)
        return
    rng = random.Random(args.seed)
    nprng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix="recovery-bench-", dir=args.dir))
    phases: dict[str, float] = {}
    began = time.perf_counter()
    neighbours = Neighbours()

    def phase(name: str) -> None:
        phases[name] = time.perf_counter() - began - sum(phases.values())

    cost: list[CostRow] = []
    runs: list[RecoveryRun] = []
    incremental: IncrementalResult | None = None
    stores: list[StoreRow] = []
    full_blobs = subset_blobs = 0
    extra: dict[str, Any] = {}
    keys = state_keys(args.state_mb)
    # epochs of 0.1 s: the initial load and first checkpoint, then a cycle per kill (random
    # wait, recovery, a checkpoint of the new attempt), then a tail; the same for every run
    params = {"keys": keys, "hot": args.hot, "updates": args.updates, "kills": args.kills,
              "epochs": int((12.0 + 0.1 * args.state_mb + 8.0 * args.kills + 4.0) / EPOCH_S)}
    reference_s = 0.0
    try:
        if "cost" not in args.skip and args.query:
            print(f"1. checkpoint cost, process: {', '.join(args.query)}, {args.rounds} rounds", flush=True)
            from tokenflow.nexmark.run import run_query

            run_query("q0", 20_000, workers=WORKERS, runtime="process")  # warm caches and imports
            cost += measure_cost(args.query, events, args.rounds, "process",
                                 ["none", "control", "quiescent", "checkpoint"], work)
            phase("cost (process)")
            if "paced" not in args.skip:
                print("1. checkpoint cost at half load, process", flush=True)
                extra["paced"] = measure_paced(cost, args.rounds, work)
                extra["paced_rounds"] = args.rounds
                phase("cost at half load (process)")
        if "spark-cost" not in args.skip and args.spark_query and "spark" in args.runtimes:
            print(f"1. checkpoint cost, Spark local[2]: {', '.join(args.spark_query)}", flush=True)
            from tokenflow.spark.session import stop_session

            cost += measure_cost(args.spark_query, events, args.spark_rounds, "spark",
                                 ["none", "quiescent", "checkpoint"], work)
            extra["spark_launch"] = spark_launch()
            stop_session()
            phase("cost (Spark)")
        if "recovery" not in args.skip:
            print(f"2. recovery: {keys:,} keys (~{args.state_mb:g} MB), {args.runs} runs x "
                  f"{args.kills} kills per runtime", flush=True)
            reference, reference_s = reference_run(params, work)
            print(f"  reference: {reference.num_rows:,} rows in {reference_s:.0f} s", flush=True)
            for runtime in args.runtimes.split(","):
                runs += recovery_trials(runtime, args.runs, args.kills, params, reference, work, rng,
                                        args.keep)
            phase("recovery")
        if "incremental" not in args.skip or "stores" not in args.skip:
            print("4. incremental vs full", flush=True)
            incremental, exports = measure_incremental(keys, args.changed, args.rounds_store,
                                                         work, nprng)
            phase("incremental")
            if "stores" not in args.skip:
                print("5. stores", flush=True)
                stores, full_blobs, subset_blobs, extra["read_parts"] = measure_stores(
                    exports, keys, args.changed, args.rounds_store, work, nprng)
                phase("stores")
            if "incremental" in args.skip:
                incremental = None
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    extra["neighbours"] = neighbours.describe()
    extra["when"] = datetime.datetime.now(datetime.UTC)  # a report rewritten with --load keeps these
    extra["provenance"] = provenance()
    measured: dict[str, Any] = {
        "command": command, "cost": cost, "runs": runs, "params": params,
        "reference_s": reference_s, "incremental": incremental, "stores": stores,
        "full_blobs": full_blobs, "subset_blobs": subset_blobs, "phases": phases, "extra": extra}
    if args.save:
        import pickle

        data = pickle.dumps({**measured, "rounds_store": args.rounds_store})
        Path(args.save + ".tmp").write_bytes(data)
        os.replace(args.save + ".tmp", args.save)
    write_report(args, **measured)


def write_report(args: argparse.Namespace, command: str, cost: list[CostRow], runs: list[RecoveryRun],
                 params: dict[str, Any], reference_s: float, incremental: IncrementalResult | None,
                 stores: list[StoreRow], full_blobs: int, subset_blobs: int,
                 phases: dict[str, float], extra: dict[str, Any]) -> None:
    text = report(args, command, cost, runs, params, reference_s, incremental, stores, full_blobs,
                  subset_blobs, phases, extra)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "recovery.md").write_text(text)
        plot(runs, RESULTS / "recovery.png", RESULTS / "recovery_breakdown.png")
        print(f"wrote {RESULTS / 'recovery.md'} and the PNGs")


if __name__ == "__main__":
    main()
