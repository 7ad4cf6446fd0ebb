"""State benchmark: what routing through bins costs, and snapshot/restore throughput.

Writes ``benchmarks/results/state.md`` and ``benchmarks/results/state.png`` (and prints the
tables).  The machine is shared (2 cores), so every comparison is made side by side in one run:
the variants alternate round by round (A B, B A, A B, ...) and medians are reported; read the
ratios, not the absolute figures.  A ratio is the median over the rounds of the per-round ratio
(the two runs of a round are adjacent in time and share the machine's load).

1. **Routing table vs direct hash** (2 workers, ``process`` runtime).  Keyed exchanges send a
   key to ``owners[bin(hash)]`` of the job's ``RoutingTable`` (4,096 bins), against the direct
   ``routes_for(hash, 2)`` of the same stable hash (``routing="direct"``, or
   ``worker.routing = None`` before the dataflow is built).

   * NEXMark q4, q5, q8 through ``tokenflow.nexmark.run.run_query(..., routing=...)``: events/s
     and per-epoch latency p50/p99 (1 s epochs at 10,000 events/s of event time), and the
     worker processes' CPU seconds (``getrusage(RUSAGE_CHILDREN)`` around each run, less the
     median CPU of 1,000-event runs: process start-up).  Every run's output rows must equal the
     first run's (asserted before any figure is printed).
   * Word count: words drawn from a Zipf(1.0) law over a vocabulary of 10,000 made-up words
     (numpy, fixed seed), each worker sending its half of every epoch in list batches of
     ``--batch`` words; ``stream.exchange(lambda w: w)`` then a ``unary_frontier`` counting per
     epoch (``collections.Counter``).  Variant ``arrow``: the same words as one-column Arrow
     batches, ``Exchange(column="word")``, counted per epoch with ``pyarrow.compute.value_counts``.
     Timed from the first worker's first batch (after a barrier, so both start together) to the
     last worker's completion (``perf_counter``, the system's monotonic clock), with each worker's
     ``process_time`` over the same span; every run's per-epoch counts must equal
     ``numpy.bincount`` of the input, each word counted on exactly one worker.
   * Per message, no dataflow: ``column_routes(column, 2)`` vs
     ``column_routes(column, RoutingTable.even(2))`` on 1,588 words (a string column) and on
     1,588 int64 keys, and their parts (hashing, the direct range reduction, ``bins_of``, the
     ``owners[bin]`` gather), µs per call in alternating blocks.

2. **Snapshot and restore** (``tokenflow.state.snapshot``).  ``KeyedState``s of word -> count
   (``counts``) and word -> list of 16 ints (``lists``) sized to about ``--sizes`` MB of live
   state, live size being the pickled size of the dict (``pickle`` protocol 5); the deep size
   (``sys.getsizeof`` of the dict, every key, every value and every list item) is reported
   apart.  The keys are split between 2 old workers by ``RoutingTable.even(2)``; each exports all
   its bins (``KeyedState.export``, one cloudpickled dict per bin) and writes its part
   (``write_worker_part``), then ``commit_snapshot``.  Restore as 3 workers: each opens the
   snapshot and reads the bins it owns in ``RoutingTable.even(2).rebalanced(range(3))``
   (``Snapshot.read``), then ``KeyedState.load``.  Also a columnar state: an Arrow table of
   (key int64, value float64) rows (live size = ``Table.nbytes``) exported with
   ``split_by_bin(table, bins_of(hash_ints(keys), 4096))`` and loaded by concatenating the bins
   read (``concat_tables`` + ``combine_chunks``).  The reference next to each: the same old
   workers' state written whole (``pickle.dump`` / Arrow IPC file, fsynced like the snapshot)
   and read back whole.  The restored state is checked against the original.  The files live
   under ``--dir`` (default: a temporary directory), so reads come from the page cache: this is
   the CPU path, not the disk.

Run: ``.venv/bin/python benchmarks/state.py`` (about 7 minutes on 2 shared cores), or
``--quick`` (under 2 minutes; fewer events, smaller states).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from _provenance import provenance  # a sibling module: benchmarks run as scripts

from tokenflow import execute
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.generic import unary_frontier
from tokenflow.dataflow.routing import column_hashes, column_routes, hash_ints, routes_for
from tokenflow.dataflow.state import KeyedState, key_bins, split_by_bin
from tokenflow.state.bins import DEFAULT_BINS, RoutingTable, bins_of
from tokenflow.state.snapshot import Snapshot, commit_snapshot, write_worker_part

RESULTS = Path(__file__).parent / "results"
WORKERS = 2
BINS = DEFAULT_BINS
THROUGHPUT_TARGET = 0.95
"""bins/direct events/s (or words/s) must be at least this."""
P99_TARGET = 1.2
"""bins/direct epoch latency p99 must be at most this."""
MEGAPHONE_P99 = 2.5
"""Megaphone (Hoffmann et al., VLDB 2019): about 2.5x the p99 latency of the native exchange at
2^12 bins (its bin-count experiment)."""
MOVED_LIMIT = 1 / 3 + 0.02
"""Going from 2 to 3 workers, at most a third of the state (plus 2 %) may change worker."""
VOCABULARY = 10_000
ZIPF_EXPONENT = 1.0
SEED = 20_191
LIST_LENGTH = 16
MESSAGE_ROWS = 1_588
"""Rows of the microbenchmark's message: what one worker of the core word count routes per
epoch at 1,024 words per batch (``benchmarks/results/core.md``)."""
MB = 1e6


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def alternating(variants: Sequence[str], rounds: int) -> Iterable[tuple[int, str]]:
    """``(round, variant)`` with the order reversed every other round (A B, B A, ...)."""
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else list(reversed(variants))):
            yield r, v


# -- 1a. NEXMark ------------------------------------------------------------------------------


@dataclass
class Run:
    """One ``run_query`` run: its figures and its worker processes' CPU seconds."""

    events_per_second: float
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_s: float


@dataclass
class QueryRow:
    query: str
    events: int
    runs: dict[str, list[Run]] = field(default_factory=lambda: {"bins": [], "direct": []})
    rows: int = 0
    startup_cpu_s: float = 0.0
    """Median CPU s of a run of 1,000 events (process start-up and imports), subtracted from
    every run's CPU s."""
    error: str | None = None
    """Why the query could not be measured (a variant failed), or None."""

    def med(self, variant: str, attr: str) -> float:
        return median(getattr(r, attr) for r in self.runs[variant])

    def paired(self, attr: str) -> list[float]:
        """Per-round ratios bins/direct (the two runs of a round are adjacent in time)."""
        return [getattr(b, attr) / getattr(d, attr)
                for b, d in zip(self.runs["bins"], self.runs["direct"], strict=True)]

    def ratio(self, attr: str) -> float:
        """Median over the rounds of bins/direct."""
        return median(self.paired(attr))

    def cpu_ratio(self) -> float:
        """Median over the rounds of bins/direct job CPU s (start-up CPU subtracted)."""
        base = self.startup_cpu_s
        return median((b.cpu_s - base) / (d.cpu_s - base)
                      for b, d in zip(self.runs["bins"], self.runs["direct"], strict=True))


def children_cpu() -> float:
    """CPU s (user + system) of this process's waited-for children: the worker processes."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_nexmark(queries: list[str], events: int, rounds: int) -> list[QueryRow]:
    import pandas as pd

    from tokenflow.execute import WorkerError
    from tokenflow.nexmark.run import run_query

    run_query("q0", 20_000, workers=WORKERS, runtime="process")  # warm the page cache and imports
    rows = []
    for name in queries:
        row = QueryRow(name, events)
        reference: pd.DataFrame | None = None
        try:
            startup = []
            for _, variant in alternating(["bins", "direct"], 2):
                cpu = children_cpu()
                run_query(name, 1_000, workers=WORKERS, runtime="process", routing=variant)
                startup.append(children_cpu() - cpu)
            row.startup_cpu_s = median(startup)
            for r, variant in alternating(["bins", "direct"], rounds):
                cpu = children_cpu()
                result = run_query(name, events, rate=10_000, workers=WORKERS, runtime="process",
                                   routing=variant)
                cpu = children_cpu() - cpu
                if reference is None:
                    reference, row.rows = result.rows, len(result.rows)
                    check = "reference"
                else:
                    pd.testing.assert_frame_equal(result.rows, reference, check_exact=True)
                    check = "identical to the reference"
                row.runs[variant].append(Run(result.events_per_second, result.latency_p50_ms,
                                             result.latency_p99_ms, cpu))
                print(f"  {name} round {r + 1} {variant}: {len(result.rows):,} rows, {check}",
                      flush=True)
        except WorkerError as exc:  # reported, not measured
            row.error = str(exc)
            print(f"  {name}: FAILED: {exc}", flush=True)
        rows.append(row)
    return rows


# -- 1b. word count ---------------------------------------------------------------------------


def vocabulary(size: int, seed: int) -> list[str]:
    """``size`` distinct lowercase made-up words of 2 to 10 letters."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words: dict[str, None] = {}
    while len(words) < size:
        words.setdefault(letters[rng.integers(0, 26, int(rng.integers(2, 11)))].tobytes().decode())
    return list(words)


def zipf_stream(words: int, seed: int) -> np.ndarray:
    """``words`` vocabulary indices (uint16) drawn with ``P(rank k) ~ 1 / k**ZIPF_EXPONENT``."""
    rng = np.random.default_rng(seed + 1)
    p = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF_EXPONENT
    return rng.choice(VOCABULARY, size=words, p=p / p.sum()).astype(np.uint16)


def count_per_epoch(stream: Any, pact: Any, finished: dict[int, Any], arrow: bool) -> Any:
    """Hold each epoch's words with a retained token; once the input frontier passes the
    epoch, keep its counts in ``finished`` (a ``Counter``, or Arrow ``value_counts``) and send
    the number of distinct words."""

    def constructor(cap: Any, info: Any) -> Callable[[Any, Any], None]:
        cap.drop()
        pending: dict[int, tuple[Any, Any]] = {}

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                entry = pending.get(ref.time)
                if entry is None:
                    entry = pending[ref.time] = (ref.retain(), [] if arrow else collections.Counter())
                if arrow:
                    entry[1].append(batch.column(0))
                else:
                    entry[1].update(batch)
            for t in sorted(pending):
                if inp.frontier.less_equal(t):
                    break
                token, counts = pending.pop(t)
                if arrow:
                    counts = pc.value_counts(pa.chunked_array(counts, pa.string()))
                finished[t] = counts
                out.give_batch(token, [len(counts)])
                token.drop()

        return logic

    return unary_frontier(stream, pact, "CountPerEpoch", constructor)


def barrier(worker: Any) -> None:
    """Return once every worker has called ``barrier`` (a one-record exchange whose frontier
    empties only when all workers have closed their input), so that the timed part starts
    together on every worker and not when each has finished preparing its batches."""

    def build(scope: Any) -> tuple[Any, Any]:
        inp, stream = scope.new_input()
        return inp, stream.exchange(lambda x: x).probe()

    inp, probe = worker.dataflow(build, name="barrier")
    inp.send_batch([worker.index])
    inp.close()
    worker.step_while(lambda: not probe.done())


def wordcount_job(stream: np.ndarray, words: list[str], epochs: int, batch: int, arrow: bool,
                  direct: bool) -> Callable[[Any], tuple[float, float, float, dict[int, dict[str, int]]]]:
    """The job function: ``(start, end, cpu s, {epoch: {word: count}})`` per worker (``cpu s``:
    the worker process's CPU time over the timed part)."""

    def job(worker: Any) -> tuple[float, float, float, dict[int, dict[str, int]]]:
        if direct:
            worker.routing = None  # exchanges route by the direct hash
        per_epoch = len(stream) // epochs
        w, peers = worker.index, worker.peers
        vocab = pa.array(words, pa.string())
        batches: list[list[Any]] = []
        for e in range(epochs):
            first = e * per_epoch
            mine = stream[first + per_epoch * w // peers: first + per_epoch * (w + 1) // peers]
            chunks = [mine[i: i + batch] for i in range(0, len(mine), batch)]
            if arrow:
                batches.append([pa.record_batch([vocab.take(pa.array(c))], ["word"]) for c in chunks])
            else:
                batches.append([list(map(words.__getitem__, c.tolist())) for c in chunks])
        # load the kernels before timing (a fresh process)
        column_routes(vocab.slice(0, 2_000), worker.routing if worker.routing is not None else peers)
        pc.value_counts(vocab.slice(0, 100))
        finished: dict[int, Any] = {}

        def build(scope: Any) -> Any:
            inp, stream_ = scope.new_input()
            if arrow:
                counted = count_per_epoch(stream_, Exchange(column="word"), finished, True)
            else:
                counted = count_per_epoch(stream_.exchange(lambda word: word), "pipeline", finished,
                                          False)
            return inp, counted.probe()

        inp, _probe = worker.dataflow(build)
        barrier(worker)
        start, cpu = time.perf_counter(), time.process_time()
        for e, parts in enumerate(batches):
            for b in parts:
                inp.send_batch(b)
            inp.advance_to(e + 1)
            worker.step()
        inp.close()
        worker.step_until_done()
        end, cpu = time.perf_counter(), time.process_time() - cpu
        counts: dict[int, dict[str, int]] = {}
        for t, c in finished.items():
            if arrow:
                counts[t] = dict(zip(c.field("values").to_pylist(), c.field("counts").to_pylist(),
                                     strict=True))
            else:
                counts[t] = dict(c)
        return start, end, cpu, counts

    return job


@dataclass
class WordCountRow:
    variant: str
    words: int
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"bins": [], "direct": []})
    cpu_s: dict[str, list[float]] = field(default_factory=lambda: {"bins": [], "direct": []})
    """The workers' CPU s over the timed part, summed over the workers."""

    def rate(self, routing: str) -> float:
        return self.words / median(self.seconds[routing])

    def paired(self) -> list[float]:
        """Per-round words/s ratios bins/direct."""
        return [d / b for b, d in zip(self.seconds["bins"], self.seconds["direct"], strict=True)]

    def ratio(self) -> float:
        """Median over the rounds of words/s bins/direct."""
        return median(self.paired())

    def cpu_ratio(self) -> float:
        """Median over the rounds of CPU s bins/direct."""
        return median(b / d for b, d in zip(self.cpu_s["bins"], self.cpu_s["direct"], strict=True))


def expected_counts(stream: np.ndarray, words: list[str], epochs: int) -> dict[int, dict[str, int]]:
    per_epoch = len(stream) // epochs
    out = {}
    for e in range(epochs):
        counts = np.bincount(stream[e * per_epoch: (e + 1) * per_epoch], minlength=VOCABULARY)
        out[e] = {words[i]: int(counts[i]) for i in np.flatnonzero(counts).tolist()}
    return out


def measure_wordcount(epochs: int, per_epoch: int, batch: int, rounds: int) -> list[WordCountRow]:
    words = vocabulary(VOCABULARY, SEED)
    stream = zipf_stream(epochs * per_epoch, SEED)
    expected = expected_counts(stream, words, epochs)
    rows = []
    for arrow in (False, True):
        row = WordCountRow("arrow" if arrow else "list", len(stream))
        for r, routing in alternating(["bins", "direct"], rounds):
            job = wordcount_job(stream, words, epochs, batch, arrow, routing == "direct")
            results = execute(job, workers=WORKERS, runtime="process")
            merged: dict[int, dict[str, int]] = {}
            for _, _, _, counts in results:
                for t, c in counts.items():
                    target = merged.setdefault(t, {})
                    assert not target.keys() & c.keys(), f"epoch {t}: a word counted on two workers"
                    target.update(c)
            assert merged == expected, f"{row.variant}/{routing}: counts differ from the input's"
            row.seconds[routing].append(max(x[1] for x in results) - min(x[0] for x in results))
            row.cpu_s[routing].append(sum(x[2] for x in results))
            print(f"  word count {row.variant} round {r + 1} {routing}: counts correct", flush=True)
        rows.append(row)
    return rows


# -- 1c. routing one message ------------------------------------------------------------------


def measure_messages(rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """µs per call (median over ``rounds`` alternating blocks of ``calls`` calls)."""
    words = vocabulary(VOCABULARY, SEED)
    stream = zipf_stream(MESSAGE_ROWS, SEED + 7)
    columns = {
        "string": pa.array([words[i] for i in stream.tolist()], pa.string()),
        "int64": pa.array(np.random.default_rng(SEED).integers(0, 10**9, MESSAGE_ROWS), pa.int64()),
    }
    table = RoutingTable.even(WORKERS)
    out: dict[str, dict[str, float]] = {}
    for kind, column in columns.items():
        hashes = column_hashes(column)
        bins = bins_of(hashes, BINS)
        assert np.array_equal(column_routes(column, table), table.owners[bins])
        assert np.array_equal(column_routes(column, table), column_routes(column, WORKERS))
        work: dict[str, Callable[[], Any]] = {
            "column_routes, direct": lambda c=column: column_routes(c, WORKERS),
            "column_routes, table": lambda c=column: column_routes(c, table),
            "hash (column_hashes)": lambda c=column: column_hashes(c),
            "direct: routes_for": lambda h=hashes: routes_for(h, WORKERS),
            "table: bins_of + owners[bin]": lambda h=hashes: table.routes(h),
            "bins_of alone": lambda h=hashes: bins_of(h, BINS),
            "owners[bin] gather alone": lambda b=bins: table.owners[b],
        }
        samples: dict[str, list[float]] = {k: [] for k in work}
        for _, name in alternating(list(work), rounds):
            fn = work[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
        out[kind] = {k: median(v) for k, v in samples.items()}
    return out


# -- 2. snapshots -----------------------------------------------------------------------------


def deep_size(data: dict[str, Any]) -> int:
    """``sys.getsizeof`` of the dict, its keys, its values and (lists) their items."""
    size = sys.getsizeof(data) + sum(map(sys.getsizeof, data))
    for value in data.values():
        size += sys.getsizeof(value)
        if isinstance(value, list):
            size += sum(map(sys.getsizeof, value))
    return size


def make_dict(kind: str, n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    keys = (f"word{i:09d}" for i in range(n))
    if kind == "counts":
        return dict(zip(keys, rng.integers(1, 100_000, n).tolist(), strict=False))
    return dict(zip(keys, rng.integers(0, 1 << 20, (n, LIST_LENGTH)).tolist(), strict=False))


def sized_dict(kind: str, megabytes: float, seed: int) -> dict[str, Any]:
    """A dict of ``kind`` whose pickled size is about ``megabytes`` MB."""
    sample = 20_000
    per_key = len(pickle.dumps(make_dict(kind, sample, seed), protocol=5)) / sample
    return make_dict(kind, max(1, int(megabytes * MB / per_key)), seed)


def fsynced_write(path: Path, chunks: Iterable[Any]) -> int:
    size = 0
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            size += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return size


@dataclass
class SnapRow:
    kind: str
    target_mb: float
    keys: int
    live_bytes: int
    deep_bytes: int
    snapshot_bytes: int = 0
    export_s: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    plain_write_s: list[float] = field(default_factory=list)
    plain_read_s: list[float] = field(default_factory=list)
    bytes_read: int = 0
    moved: list[float] = field(default_factory=list)
    """Per new worker: the fraction of the bytes it read that came from another worker's file
    (a new worker has no file of its own, so its fraction is 1)."""
    moved_bytes: int = 0

    @property
    def write_mb_s(self) -> float:
        return self.live_bytes / MB / median(e + w for e, w in zip(self.export_s, self.write_s, strict=True))

    @property
    def restore_mb_s(self) -> float:
        return self.bytes_read / MB / median(r + x for r, x in zip(self.read_s, self.load_s, strict=True))

    @property
    def restore_keys_s(self) -> float:
        return self.keys / median(r + x for r, x in zip(self.read_s, self.load_s, strict=True))

    @property
    def plain_write_mb_s(self) -> float:
        return self.live_bytes / MB / median(self.plain_write_s)

    @property
    def plain_read_mb_s(self) -> float:
        return self.live_bytes / MB / median(self.plain_read_s)

    @property
    def moved_fraction(self) -> float:
        return self.moved_bytes / self.bytes_read


OLD = RoutingTable.even(WORKERS, BINS)
NEW = OLD.rebalanced(range(3))
JOB = "bench-state"


def _restore(root: str, state: str, load: Callable[[dict[int, pa.Table]], Any]
             ) -> tuple[float, float, list[Any], list[dict[int, int]]]:
    """Each of the 3 new workers opens the snapshot, reads its bins and loads them; returns
    read s, load s (summed over the workers), what each loaded, and each one's bytes read per
    writer."""
    read_s = load_s = 0.0
    loaded, per_reader = [], []
    for w in range(3):
        start = time.perf_counter()
        snap = Snapshot.open(root, job=JOB, bins=BINS)
        tables = snap.read(state, NEW.owned_by(w).tolist())
        middle = time.perf_counter()
        loaded.append(load(tables))
        load_s += time.perf_counter() - middle
        read_s += middle - start
        per_reader.append(dict(snap.bytes_read))
    stored = sum(snap.stored_bytes(state).values())
    assert sum(sum(d.values()) for d in per_reader) == stored, "a blob was not read exactly once"
    return read_s, load_s, loaded, per_reader


def _account(row: SnapRow, per_reader: list[dict[int, int]]) -> None:
    row.bytes_read = sum(sum(d.values()) for d in per_reader)
    row.moved = [sum(b for w, b in d.items() if w != reader) / max(1, sum(d.values()))
                 for reader, d in enumerate(per_reader)]
    row.moved_bytes = sum(sum(b for w, b in d.items() if w != reader)
                          for reader, d in enumerate(per_reader))


def snapshot_keyed(kind: str, megabytes: float, rounds: int, workdir: Path) -> SnapRow:
    data = sized_dict(kind, megabytes, SEED)
    row = SnapRow(kind, megabytes, len(data), len(pickle.dumps(data, protocol=5)), deep_size(data))
    owners = OLD.owners[key_bins(list(data), BINS)].tolist()
    old: list[KeyedState[str, Any]] = [KeyedState() for _ in range(WORKERS)]
    for (key, value), w in zip(data.items(), owners, strict=True):
        old[w].data[key] = value
    for w, state in enumerate(old):
        state.attach(BINS, int(OLD.owned_by(w)[0]))

    def load(tables: dict[int, pa.Table]) -> KeyedState[str, Any]:
        state: KeyedState[str, Any] = KeyedState()
        state.attach(BINS, 0)
        state.load(tables)
        return state

    for r, variant in alternating(["snapshot", "plain"], rounds):
        root = workdir / f"{kind}-{megabytes:g}-{r}"
        if variant == "plain":
            root.mkdir()
            start = time.perf_counter()
            for w, state in enumerate(old):
                fsynced_write(root / f"worker-{w}.pickle", [pickle.dumps(state.data, protocol=5)])
            middle = time.perf_counter()
            restored: dict[str, Any] = {}
            for w in range(WORKERS):
                restored.update(pickle.loads((root / f"worker-{w}.pickle").read_bytes()))
            row.plain_read_s.append(time.perf_counter() - middle)
            row.plain_write_s.append(middle - start)
            assert len(restored) == len(data)
            del restored
        else:
            _write_snapshot(root, row, kind, [state.export for state in old])
            read_s, load_s, loaded, per_reader = _restore(str(root), kind, load)
            row.read_s.append(read_s)
            row.load_s.append(load_s)
            _account(row, per_reader)
            if r == 0:  # the restored state is the original, each key on the owner of its bin
                assert sum(len(s) for s in loaded) == len(data)
                for w, state in enumerate(loaded):
                    keys = list(state.data)
                    assert (NEW.owners[key_bins(keys, BINS)] == w).all()
                    assert all(data[k] == v for k, v in state.data.items())
            del loaded
        shutil.rmtree(root)
        print(f"  {kind} {megabytes:g} MB round {r + 1} {variant}: restored state checked", flush=True)
    return row


def snapshot_arrow(megabytes: float, rounds: int, workdir: Path) -> SnapRow:
    n = max(1, int(megabytes * MB / 16))
    rng = np.random.default_rng(SEED)
    keys = rng.integers(-(2**62), 2**62, n)
    table = pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array(rng.random(n))})
    row = SnapRow("arrow", megabytes, n, table.nbytes, table.nbytes)
    bins = bins_of(hash_ints(keys), BINS)
    owner = OLD.owners[bins]
    old = [(table.filter(pa.array(owner == w)), bins[owner == w]) for w in range(WORKERS)]

    def load(tables: dict[int, pa.Table]) -> pa.Table:
        if not tables:
            return table.schema.empty_table()
        return pa.concat_tables(list(tables.values())).combine_chunks()

    for r, variant in alternating(["snapshot", "plain"], rounds):
        root = workdir / f"arrow-{megabytes:g}-{r}"
        if variant == "plain":
            root.mkdir()
            start = time.perf_counter()
            for w, (part, _) in enumerate(old):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_file(sink, part.schema) as writer:
                    writer.write_table(part)
                fsynced_write(root / f"worker-{w}.arrow", [sink.getvalue()])
            middle = time.perf_counter()
            restored = pa.concat_tables(
                [pa.ipc.open_file(pa.memory_map(str(root / f"worker-{w}.arrow"))).read_all()
                 for w in range(WORKERS)]).combine_chunks()
            row.plain_read_s.append(time.perf_counter() - middle)
            row.plain_write_s.append(middle - start)
            assert restored.num_rows == n
            del restored
        else:
            _write_snapshot(root, row, "rows",
                            [functools.partial(split_by_bin, part, part_bins)
                             for part, part_bins in old])
            read_s, load_s, loaded, per_reader = _restore(str(root), "rows", load)
            row.read_s.append(read_s)
            row.load_s.append(load_s)
            _account(row, per_reader)
            if r == 0:
                assert sum(t.num_rows for t in loaded) == n
                for w, t in enumerate(loaded):
                    k = t.column("key").to_numpy()
                    assert (NEW.owners[bins_of(hash_ints(k), BINS)] == w).all()
                got = np.sort(np.concatenate([t.column("key").to_numpy() for t in loaded]))
                assert np.array_equal(got, np.sort(keys))
                total = sum(pc.sum(t.column("value")).as_py() or 0.0 for t in loaded)
                assert abs(total - float(np.sum(table.column("value").to_numpy()))) < 1e-6 * n
            del loaded
        shutil.rmtree(root)
        print(f"  arrow {megabytes:g} MB round {r + 1} {variant}: restored state checked", flush=True)
    return row


# -- report -----------------------------------------------------------------------------------


def plot(queries: list[QueryRow], counts: list[WordCountRow], snaps: list[SnapRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5.6))
    queries = [q for q in queries if q.error is None]
    names = [q.query for q in queries] + [f"wc {c.variant}" for c in counts]
    throughput = [q.ratio("events_per_second") for q in queries] + [c.ratio() for c in counts]
    p99 = [q.ratio("latency_p99_ms") for q in queries]
    x = np.arange(len(names))
    ax.bar(x - 0.2, throughput, width=0.4, label="throughput bins/direct (median of rounds)")
    ax.bar(x[: len(p99)] + 0.2, p99, width=0.4, label="latency p99 bins/direct (median of rounds)")
    rounds = [q.paired("events_per_second") for q in queries] + [c.paired() for c in counts]
    for i, values in enumerate(rounds):
        ax.scatter([i - 0.2] * len(values), values, s=10, color="black", zorder=3,
                   label="per round" if i == 0 else None)
    for i, q in enumerate(queries):
        values = q.paired("latency_p99_ms")
        ax.scatter([i + 0.2] * len(values), values, s=10, color="black", zorder=3)
    ax.axhline(THROUGHPUT_TARGET, color="tab:blue", linestyle="--", linewidth=1,
               label=f"throughput target >= {THROUGHPUT_TARGET}")
    ax.axhline(P99_TARGET, color="tab:orange", linestyle="--", linewidth=1,
               label=f"p99 target <= {P99_TARGET}")
    ax.axhline(1.0, color="0.5", linewidth=0.5)
    ax.set_xticks(x, names)
    ax.set_ylabel("ratio, routing table (4,096 bins) / direct hash")
    ax.set_title("(a) cost of the routing table, 2 workers, process runtime")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    p99_rounds = [v for q in queries for v in q.paired("latency_p99_ms")]
    top = max([1.4, *throughput, *p99, *(v for r in rounds for v in r), *p99_rounds])
    ax.set_ylim(0, min(top, 5.0) * 1.05)

    styles = {"counts": "tab:blue", "lists": "tab:green", "arrow": "tab:red"}
    for kind, color in styles.items():
        rows = sorted((s for s in snaps if s.kind == kind), key=lambda s: s.live_bytes)
        if not rows:
            continue
        sizes = [s.live_bytes / MB for s in rows]
        label = "Arrow columnar" if kind == "arrow" else f"pickled {kind}"
        bx.plot(sizes, [s.write_mb_s for s in rows], marker="o", color=color, label=f"{label}: write")
        bx.plot(sizes, [s.restore_mb_s for s in rows], marker="s", linestyle="--", color=color,
                label=f"{label}: restore")
    bx.set_xscale("log")
    bx.set_yscale("log")
    sizes_all = sorted({round(s.live_bytes / MB, 1) for s in snaps})
    if sizes_all:
        bx.set_xticks(sizes_all, [f"{v:g}" for v in sizes_all])
        bx.minorticks_off()
        rates = [v for s in snaps for v in (s.write_mb_s, s.restore_mb_s)]
        ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
                 if min(rates) / 2 <= t <= max(rates) * 2]
        bx.set_yticks(ticks, [f"{t:g}" for t in ticks])
    bx.set_xlabel("live state, MB (pickled size; Arrow: table bytes)")
    bx.set_ylabel("MB/s")
    bx.set_title("(b) snapshot write (2 workers) / restore (3 workers)")
    bx.grid(which="both", alpha=0.3)
    bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _write_snapshot(root: Path, row: Any, state: str,
                    exports: list[Callable[[], dict[int, pa.Table]]]) -> None:
    """Old worker ``w`` exports its bins (``exports[w]()``) and writes its part; then the
    snapshot is committed.  Adds export and write seconds and the snapshot's bytes to ``row``."""
    export_s = write_s = 0.0
    parts = []
    for w, export in enumerate(exports):
        start = time.perf_counter()
        exported = export()
        middle = time.perf_counter()
        parts.append(write_worker_part(root, job=JOB, epoch=1, worker=w, bins=BINS,
                                       states={state: exported}))
        write_s += time.perf_counter() - middle
        export_s += middle - start
        del exported
    start = time.perf_counter()
    commit_snapshot(root, job=JOB, epoch=1, bins=BINS, routing=OLD, parts=parts)
    write_s += time.perf_counter() - start
    row.export_s.append(export_s)
    row.write_s.append(write_s)
    row.snapshot_bytes = sum(p.bytes_written for p in parts)


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def spread(values: list[float], digits: int = 2) -> str:
    """``min–max`` of ``values`` (one value when they round alike)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def report(args: argparse.Namespace, command: str, queries: list[QueryRow], counts: list[WordCountRow],
           messages: dict[str, dict[str, float]], snaps: list[SnapRow], phases: dict[str, float]) -> str:
    now = datetime.datetime.now(datetime.UTC)
    lines = [
        "# State: the routing table's cost, snapshot and restore",
        "",
        f"{now:%Y-%m-%d %H:%M} UTC.  Machine: {platform.platform()}, {platform.machine()}, "
        f"`os.cpu_count()` = {os.cpu_count()} (shared with other jobs).  Python "
        f"{platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}.  "
        f"The run took {sum(phases.values()) / 60:.1f} min ("
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in phases.items()) + f").  {provenance()}",
        "",
        "The machine is shared, so absolute figures move from run to run: every comparison below "
        "is measured side by side in this run, the variants alternating round by round (A B, B A, "
        "...), and the tables give medians.  Read the ratios; the absolute events/s and MB/s only "
        "place them.  What is measured and how: the docstring of `benchmarks/state.py`.",
        "",
        f"Regenerate: `{command}`",
        "",
        "## 1. What routing through 4,096 bins costs",
        "",
        f"2 workers, `process` runtime; *bins*: keyed exchanges send a key to `owners[bin]` of "
        f"`RoutingTable.even(2)` (4,096 bins); *direct*: the same stable hash reduced straight to "
        f"a worker (`routing=\"direct\"`, `worker.routing = None`).  {args.rounds} rounds per "
        f"workload.  Targets: throughput bins/direct >= {THROUGHPUT_TARGET}, p99 bins/direct <= "
        f"{P99_TARGET}; for reference, Megaphone (Hoffmann et al., VLDB 2019) reports about "
        f"{MEGAPHONE_P99}x the native exchange's p99 latency at 2^12 bins.",
        "",
        f"### NEXMark ({queries[0].events:,} events at 10,000 events/s of event time, 1 s epochs, "
        f"generator included)" if queries else "### NEXMark (not run)",
        "",
        "Every run's output rows were asserted identical to the first run's (both routings) "
        "before any figure was taken.",
        "",
        "| query | events/s bins | events/s direct | ratio | per-round ratios | CPU ratio | "
        "p50 ms bins | p50 ms direct | p99 ms bins | p99 ms direct | p99 ratio | "
        "per-round p99 ratios | throughput target | p99 target | rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for q in queries:
        if q.error is not None:
            lines.append(f"| {q.query} | not measured: {q.error.splitlines()[0]} |" + " |" * 13)
            continue
        tr, pr = q.ratio("events_per_second"), q.ratio("latency_p99_ms")
        lines.append(
            f"| {q.query} | {q.med('bins', 'events_per_second'):,.0f} | "
            f"{q.med('direct', 'events_per_second'):,.0f} | {tr:.3f} | "
            f"{spread(q.paired('events_per_second'))} | {q.cpu_ratio():.3f} | "
            f"{q.med('bins', 'latency_p50_ms'):.1f} | {q.med('direct', 'latency_p50_ms'):.1f} | "
            f"{q.med('bins', 'latency_p99_ms'):.1f} | {q.med('direct', 'latency_p99_ms'):.1f} | "
            f"{pr:.2f} | {spread(q.paired('latency_p99_ms'))} | "
            f"{verdict(tr >= THROUGHPUT_TARGET)} | {verdict(pr <= P99_TARGET)} | {q.rows:,} |")
    startup = [q.startup_cpu_s for q in queries if q.error is None]
    lines += [
        "",
        "*events/s*, *p50*, *p99*: medians over the rounds of each variant.  *ratio*, *p99 ratio*: "
        "the median over the rounds of bins/direct (each round's two runs are adjacent in time, so "
        "they share the machine's load; the median of one variant over the median of the other "
        "can differ); *per-round ratios*: their range.  *CPU ratio*: the median over the rounds "
        "of the worker processes' CPU seconds (user + system, `getrusage(RUSAGE_CHILDREN)`), "
        "bins/direct, less the CPU of a 1,000-event run (process start-up and imports, "
        + (f"{spread(startup, 1)} s" if startup else "n/a")
        + "): below 1 means the table used less CPU; less sensitive to other jobs' load than "
        "wall time, though not immune.",
        "",
    ]
    if counts:
        lines += [
            f"### Word count ({args.epochs} epochs x {args.epoch_words:,} words, Zipf({ZIPF_EXPONENT}) "
            f"over {VOCABULARY:,} words, batches of {args.batch:,} words)",
            "",
            "Every run's per-epoch counts were asserted equal to `numpy.bincount` of the input, each "
            "word counted on one worker only.",
            "",
            "| variant | words/s bins | words/s direct | ratio | per-round ratios | CPU ratio | "
            "target |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for c in counts:
            exchange = "`exchange(lambda w: w)`, list batches" if c.variant == "list" else \
                "`Exchange(column=\"word\")`, Arrow batches"
            lines.append(f"| {exchange} | {c.rate('bins'):,.0f} | {c.rate('direct'):,.0f} | "
                         f"{c.ratio():.3f} | {spread(c.paired())} | {c.cpu_ratio():.3f} | "
                         f"{verdict(c.ratio() >= THROUGHPUT_TARGET)} |")
        lines += [
            "",
            "*words/s*: words / (last worker's end − first worker's start of the timed part, which "
            "starts after a barrier); *ratio*: median over the rounds of bins/direct; *CPU ratio*: "
            "median over the rounds of the two worker processes' CPU seconds over the timed part "
            "(`time.process_time`), bins/direct.",
            "",
        ]
    lines += [
        f"### Routing one message ({MESSAGE_ROWS:,} rows, 2 workers, no dataflow)",
        "",
        f"µs per call, median of {args.message_rounds} alternating blocks of "
        f"{args.message_calls:,} calls.",
        "",
        "| call | " + " | ".join(f"{k} keys" for k in messages) + " |",
        "|---|" + "---:|" * len(messages),
    ]
    names = list(next(iter(messages.values())))
    for name in names:
        lines.append(f"| `{name}` | " + " | ".join(f"{messages[k][name]:.2f}" for k in messages) + " |")
    extra = {k: m["column_routes, table"] - m["column_routes, direct"] for k, m in messages.items()}
    share = {k: m["owners[bin] gather alone"] / m["column_routes, direct"] for k, m in messages.items()}
    lines += [
        "| table - direct (`column_routes`) | " + " | ".join(f"{extra[k]:+.2f}" for k in messages) + " |",
        "| gather / `column_routes, direct` | " + " | ".join(f"{share[k]:.1%}" for k in messages) + " |",
        "",
    ]
    measured = [q for q in queries if q.error is None]
    gather = ", ".join(
        f"{messages[k]['owners[bin] gather alone']:.1f} µs per {MESSAGE_ROWS:,}-row message "
        f"({share[k]:.0%} of routing it directly) for {k} keys" for k in messages)
    workloads: list[tuple[str, float, list[float], float]] = (
        [(q.query, q.ratio("events_per_second"), q.paired("events_per_second"), q.cpu_ratio())
         for q in measured]
        + [(f"word count ({c.variant})", c.ratio(), c.paired(), c.cpu_ratio()) for c in counts])
    below = [w for w in workloads if w[1] < THROUGHPUT_TARGET]
    if below:
        misses = "; ".join(
            f"{name} at {ratio:.3f} (per-round {spread(rounds)}, "
            + ("straddling 1" if max(rounds) >= 1.0 else "every round below 1")
            + f"; CPU ratio {cpu:.3f})"
            for name, ratio, rounds, cpu in below)
        throughput_text = f"{verdict(False)} by {misses}"
    else:
        throughput_text = f"{verdict(bool(workloads))} by every workload measured"
    p99_above = [(q.query, q.ratio("latency_p99_ms"), q.paired("latency_p99_ms")) for q in measured
                 if q.ratio("latency_p99_ms") > P99_TARGET]
    if p99_above:
        p99_text = f"{verdict(False)} by " + "; ".join(
            f"{name} at {ratio:.2f} (per-round {spread(rounds)})" for name, ratio, rounds in p99_above)
    elif measured:
        p99_text = f"{verdict(True)} by every query measured"
    else:
        p99_text = "not measured (no NEXMark query ran)"
    failed = [q for q in queries if q.error is not None]
    all_rounds = [v for w in workloads for v in w[2]]
    spread_all = spread(all_rounds) if all_rounds else ""
    noisy = bool(all_rounds) and max(all_rounds) - min(all_rounds) > 4 * (1 - THROUGHPUT_TARGET)
    cpu_all = spread([w[3] for w in workloads]) if workloads else ""
    lines += [
        "**Where the routing table's cost goes.**  Both routings hash the key the same way "
        "(`column_hashes`, or `stable_hash` for list keys); the direct one then reduces the hash to "
        "a worker with one shift (`routes_for`, for a power-of-two worker count), the table takes "
        "the bin with one shift (`bins_of`) and then gathers `owners[bin]`, one numpy fancy index "
        "over the message.  The extra work is that gather plus a Python call per message, not "
        f"per record: {gather}; hashing is most of the routing cost.  With 2 workers both "
        "routings send every key to the same worker (the hash's top bit; asserted in the "
        "microbenchmark), so the comparison isolates the routing computation from load balance.  "
        "List exchanges memoize each key's route (`KeyRouter`), so the table only costs on a "
        "key's first message; Arrow exchanges hash every row of every message, next to which the "
        "gather is small.  A message also pays for splitting the batch, the channel and "
        "progress tracking, so at dataflow scale the gather is a smaller share still.",
        "",
        f"**Targets.**  Throughput bins/direct >= {THROUGHPUT_TARGET}: {throughput_text}.  "
        f"p99 bins/direct <= {P99_TARGET}: {p99_text}.  A p99 over 100 epochs is close to a "
        "maximum and moves a lot between runs on a shared machine (see the per-round ranges).  "
        + (f"The wall-clock ratios of single rounds spread over {spread_all}"
           + (", far wider than the 5 % the throughput target resolves, so a median of this many "
              "rounds can land on either side of it from one run to the next" if noisy else "")
           + "; the workers' CPU seconds, less disturbed by other jobs, give bins/direct "
           f"{cpu_all} over all workloads.  " if workloads else "")
        +
        f"For scale, Megaphone (Hoffmann et al., VLDB 2019) reports about {MEGAPHONE_P99}x the "
        "p99 latency at 2^12 bins; there the routing table lives in a routing operator that "
        "receives table changes through the dataflow, while here it is a fixed array the "
        "exchange consults, changed only when a job restarts."
        + ("" if not failed else "  Not measured: " + ", ".join(q.query for q in failed)
           + " (the direct variant failed; see the table)."),
        "",
    ]
    if snaps:
        lines += [
            "## 2. Snapshot and restore throughput",
            "",
            f"2 old workers (`RoutingTable.even(2)`) export and write their parts, then "
            f"`commit_snapshot`; 3 new workers (`RoutingTable.even(2).rebalanced(range(3))`) each "
            f"open the snapshot, read the bins they own and load them.  Median of {args.snap_rounds} "
            f"rounds alternating with the *plain* reference (the same old workers' state written "
            f"whole, `pickle` protocol 5 / Arrow IPC file, fsynced, and read back whole).  Files on "
            f"the local disk, read back from the page cache: the CPU path.",
            "",
            "*live MB*: the pickled size of the dict (Arrow: `Table.nbytes`); *deep MB*: "
            "`sys.getsizeof` of the dict, its keys, its values and their list items (Arrow: "
            "`Table.nbytes`).  *write MB/s*: live MB / (export + `write_worker_part` + "
            "`commit_snapshot`), the workers one after the other; *restore MB/s*: snapshot bytes "
            "read / (open + read + load), the three new workers one after the other; *keys/s*: "
            "keys (Arrow: rows) loaded per second of restore.  *moved*: the fraction of all bytes "
            "read that came from another worker's file (worker 2 is new and reads only other files; "
            "workers 0 and 1 read only their own).",
            "",
            "| state | live MB | deep MB | keys | snapshot bytes per live MB | export s | write s | "
            "write MB/s | plain write MB/s | restore read s | load s | restore MB/s | keys/s | "
            "plain read MB/s | moved (new workers 0/1/2) | moved target |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for s in snaps:
            label = "Arrow (key int64, value float64)" if s.kind == "arrow" else \
                ("word -> count" if s.kind == "counts" else f"word -> list of {LIST_LENGTH} ints")
            lines.append(
                f"| {label} | {s.live_bytes / MB:.1f} | {s.deep_bytes / MB:.1f} | {s.keys:,} | "
                f"{s.snapshot_bytes / (s.live_bytes / MB) / MB:.3f} MB | {median(s.export_s):.2f} | "
                f"{median(s.write_s):.2f} | {s.write_mb_s:.0f} | {s.plain_write_mb_s:.0f} | "
                f"{median(s.read_s):.2f} | {median(s.load_s):.2f} | {s.restore_mb_s:.0f} | "
                f"{s.restore_keys_s:,.0f} | {s.plain_read_mb_s:.0f} | {s.moved_fraction:.3f} "
                f"({'/'.join(f'{m:.2f}' for m in s.moved)}) | "
                f"{verdict(s.moved_fraction <= MOVED_LIMIT)} (<= {MOVED_LIMIT:.3f}) |")
        pickled_rows = [s for s in snaps if s.kind != "arrow"]
        arrow_rows = [s for s in snaps if s.kind == "arrow"]
        lines += [""]
        if pickled_rows and arrow_rows:
            export_share = median(median(s.export_s) / median(e + w for e, w in zip(s.export_s, s.write_s,
                                                                                   strict=True))
                                  for s in pickled_rows)
            largest = max(s.live_bytes for s in snaps)
            big = [s for s in snaps if s.live_bytes >= 0.9 * largest]

            def at_largest(kinds: set[str], attr: str) -> float:
                return median(getattr(s, attr) for s in big if s.kind in kinds)

            pickled_kinds, arrow_kind = {"counts", "lists"}, {"arrow"}
            per_bin = median((s.snapshot_bytes - s.live_bytes) / BINS for s in snaps)
            smallest = min(snaps, key=lambda s: s.live_bytes)
            deep_ratio = median(s.deep_bytes / s.live_bytes for s in pickled_rows)
            moved_ok = all(s.moved_fraction <= MOVED_LIMIT for s in snaps)
            low, high = (f"{f(x.moved_fraction for x in snaps):.3f}" for f in (min, max))
            moved_range = low if low == high else f"{low} to {high}"
            lines += [
                "Reading the table.  Size: a snapshot holds the state plus a fixed cost per "
                f"non-empty bin, about {per_bin:,.0f} bytes (the schema and framing of one Arrow IPC "
                "stream per bin and its index entry; pickled states also repeat a small pickle header "
                f"per bin), so with all {BINS:,} bins in use a small state's snapshot is much larger "
                f"than the state ({smallest.snapshot_bytes / smallest.live_bytes:.2f}x at "
                f"{smallest.live_bytes / MB:.0f} MB) and the excess vanishes as the state grows.  "
                f"Python objects take about {deep_ratio:.0f}x their pickled size in memory (deep "
                "size), so per MB of *memory* the snapshot is much smaller.  Writing the pickled "
                f"states is dominated by `KeyedState.export` (median {export_share:.0%} of the write "
                "time: every key's bin computed, then one dict per bin built and pickled in Python); "
                f"at the largest size the snapshot writes at {at_largest(pickled_kinds, 'write_mb_s'):.0f}"
                f" MB/s against {at_largest(pickled_kinds, 'plain_write_mb_s'):.0f} MB/s for pickling "
                "the same dicts whole, and restores at "
                f"{at_largest(pickled_kinds, 'restore_mb_s'):.0f} MB/s against "
                f"{at_largest(pickled_kinds, 'plain_read_mb_s'):.0f} MB/s for unpickling them whole "
                "(medians of the two pickled kinds).  The columnar state is not pickled: "
                "`split_by_bin` is one sort and one take, and loading concatenates the bins read; "
                f"at the largest size it writes at {at_largest(arrow_kind, 'write_mb_s'):.0f} MB/s "
                f"and restores at {at_largest(arrow_kind, 'restore_mb_s'):.0f} MB/s, "
                f"{at_largest(arrow_kind, 'write_mb_s') / at_largest(pickled_kinds, 'write_mb_s'):.1f}x"
                " and "
                f"{at_largest(arrow_kind, 'restore_mb_s') / at_largest(pickled_kinds, 'restore_mb_s'):.1f}x"
                " the pickled states.  The plain Arrow read memory-maps the file and concatenates "
                "(no decoding, no per-bin work).  Rebalancing from 2 to 3 workers moves to the new worker "
                "the bins `rebalanced` gives it and nothing else: "
                + moved_range + " of the bytes read came from another "
                f"worker's file (target <= {MOVED_LIMIT:.3f}: {verdict(moved_ok)})"
                + "; the three new workers together read every blob once.",
                "",
            ]
    lines += ["![bins/direct ratios and snapshot throughput](state.png)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events, smaller states (< 2 min)")
    parser.add_argument("--events", type=int, help="NEXMark events per run (default 1,000,000; "
                        "quick 200,000)")
    parser.add_argument("--query", nargs="*", default=["q4", "q5", "q8"])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per routing variant (default 7; quick 3)")
    parser.add_argument("--epochs", type=int, help="word count epochs (default 50; quick 20)")
    parser.add_argument("--epoch-words", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000, help="words per batch")
    parser.add_argument("--message-rounds", type=int, default=15)
    parser.add_argument("--message-calls", type=int, default=2_000)
    parser.add_argument("--sizes", type=float, nargs="*",
                        help="live state sizes in MB (default 10 50 100; quick 2 5 10)")
    parser.add_argument("--snap-rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write the snapshots (default: a temporary directory)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.events = args.events or (200_000 if args.quick else 1_000_000)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.epochs = args.epochs or (20 if args.quick else 50)
    args.sizes = args.sizes or ([2.0, 5.0, 10.0] if args.quick else [10.0, 50.0, 100.0])
    command = ".venv/bin/python benchmarks/state.py" + (" --quick" if args.quick else "")
    started = time.perf_counter()
    phases: dict[str, float] = {}

    print(f"NEXMark {', '.join(args.query)}: {args.events:,} events, {args.rounds} rounds", flush=True)
    queries = measure_nexmark(args.query, args.events, args.rounds) if args.query else []
    phases["NEXMark"] = time.perf_counter() - started
    print(f"word count: {args.epochs} epochs x {args.epoch_words:,} words", flush=True)
    counts = measure_wordcount(args.epochs, args.epoch_words, args.batch, args.rounds)
    phases["word count"] = time.perf_counter() - started - sum(phases.values())
    print("routing one message", flush=True)
    messages = measure_messages(args.message_rounds, args.message_calls)
    phases["messages"] = time.perf_counter() - started - sum(phases.values())
    snaps: list[SnapRow] = []
    workdir = Path(tempfile.mkdtemp(prefix="state-bench-", dir=args.dir))
    try:
        for size in args.sizes:
            for kind in ("counts", "lists"):
                snaps.append(snapshot_keyed(kind, size, args.snap_rounds, workdir))
            snaps.append(snapshot_arrow(size, args.snap_rounds, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    phases["snapshots"] = time.perf_counter() - started - sum(phases.values())
    print("phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()), flush=True)

    text = report(args, command, queries, counts, messages, snaps, phases)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "state.md").write_text(text)
        plot(queries, counts, snaps, RESULTS / "state.png")
        print(f"wrote {RESULTS / 'state.md'} and {RESULTS / 'state.png'}")


if __name__ == "__main__":
    main()
