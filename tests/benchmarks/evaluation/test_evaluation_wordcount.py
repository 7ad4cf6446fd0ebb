"""The evaluation's rolling word count computes the same thing in every coordination style.

``benchmarks/evaluation/wordcount.py`` (the timestamp-tokens paper's §7.2 microbenchmark with
tokens, notifications and watermarks, and §7.3's count gated by a chain of idle operators) is
only worth timing if the styles agree: here each runs closed-loop on the same records (several
per time, times out of order within an epoch's batch, 1 and 2 workers) and every style's output
``(time, word, count, offered)`` multiset equals the one computed by a plain loop.  Also the
harness's log-binned histogram.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:  # the benchmarks are run from the repository root
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from benchmarks.evaluation import columnar  # noqa: E402
from benchmarks.evaluation.harness import Abort, Histogram  # noqa: E402
from benchmarks.evaluation.wordcount import (  # noqa: E402
    CHAIN_MECHANISMS,
    MECHANISMS,
    TIMED_MECHANISMS,
    gated,
)
from tokenflow import execute  # noqa: E402

pytestmark = pytest.mark.timeout(60)

WORDS = ["a", "rose", "is", "b", "c"]
RECORDS = [(t, WORDS[(i * 7 + t) % len(WORDS)], 1000 * t + i) for t in range(1, 30, 3)
           for i in range(6)]
"""``(time, word, offered)``: six records per time, ten times."""


def expected() -> Counter[tuple[int, str, int, int]]:
    counts: Counter[str] = Counter()
    out: Counter[tuple[int, str, int, int]] = Counter()
    for t in sorted({t for t, _, _ in RECORDS}):
        for tt, w, off in RECORDS:
            if tt == t:
                counts[w] += 1
                out[(t, w, counts[w], off)] += 1
    return out


def run(build: Any, workers: int) -> Counter[tuple[int, str, int, int]]:
    def job(worker: Any) -> list[tuple[int, tuple[str, int, int]]]:
        got: list[tuple[int, Any]] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            build(stream, Abort()).inspect_batch(
                lambda t, batch: got.extend((t, r) for r in batch if type(r) is tuple))
            return handle

        handle = worker.dataflow(dataflow)
        for t in sorted({t for t, _, _ in RECORDS}):
            handle.advance_to(t)
            for i, (tt, w, off) in enumerate(RECORDS):
                if tt == t and i % worker.peers == worker.index:
                    handle.send((w, off))
            worker.step()
        handle.close()
        worker.step_until_done()
        return got

    # counts depend on the order of records within one time; compare per (time, word) the
    # multiset of counts and the multiset of offered values instead of exact triples
    out: Counter[tuple[int, str, int, int]] = Counter()
    for got in execute(job, workers=workers):
        for t, (w, c, off) in got:
            out[(t, w, c, off)] += 1
    return out


def run_timed(build: Any, workers: int, epoch_every: int = 9) -> Counter[tuple[int, str, int, int]]:
    """The records as timed records (``send_at``): the input advances only every
    ``epoch_every`` time units, so one message holds several times, out of order."""

    def job(worker: Any) -> list[tuple[int, tuple[str, int, int]]]:
        got: list[tuple[int, Any]] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            build(stream, Abort()).inspect_batch(
                lambda t, batch: got.extend(r for r in batch if type(r) is tuple))
            return handle

        handle = worker.dataflow(dataflow)
        times = sorted({t for t, _, _ in RECORDS})
        for start in range(0, times[-1] + 1, epoch_every):
            handle.advance_to(start)
            for i, (tt, w, off) in reversed(list(enumerate(RECORDS))):
                if start <= tt < start + epoch_every and i % worker.peers == worker.index:
                    handle.send_at(tt, (w, off))
            worker.step()
        handle.close()
        worker.step_until_done()
        return got

    out: Counter[tuple[int, str, int, int]] = Counter()
    for got in execute(job, workers=workers):
        for t, (w, c, off) in got:
            out[(t, w, c, off)] += 1
    return out


def run_columnar(build: Any, workers: int, epoch_every: int = 9) -> Counter[tuple[int, str, int, int]]:
    """The records as columnar timed records (Arrow rows ``(time, word id, offer)``, one
    batch per epoch of ``epoch_every`` time units, rows out of time order)."""

    def job(worker: Any) -> list[tuple[int, int, int, int]]:
        got: list[tuple[int, int, int, int]] = []

        def take(t: int, batch: Any) -> None:
            if type(batch) is list:  # watermarks
                return
            assert min(batch.column("time").to_pylist(), default=t) >= t
            got.extend(zip(*(batch.column(c).to_pylist()
                             for c in ("time", "word", "count", "offer")), strict=True))

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            build(stream, Abort()).inspect_batch(take)
            return handle

        handle = worker.dataflow(dataflow)
        times = sorted({t for t, _, _ in RECORDS})
        for start in range(0, times[-1] + 1, epoch_every):
            handle.advance_to(start)
            rows = [(tt, WORDS.index(w), off) for i, (tt, w, off) in reversed(list(enumerate(RECORDS)))
                    if start <= tt < start + epoch_every and i % worker.peers == worker.index]
            if rows:
                handle.send_batch_at(pa.RecordBatch.from_arrays(
                    [pa.array(np.array(c, dtype=np.int64)) for c in zip(*rows, strict=True)],
                    schema=columnar.INPUT))
            worker.step()
        handle.close()
        worker.step_until_done()
        return got

    out: Counter[tuple[int, str, int, int]] = Counter()
    for got in execute(job, workers=workers):
        for t, w, c, off in got:
            out[(t, WORDS[w], c, off)] += 1
    return out


def by_time_word(c: Counter[tuple[int, str, int, int]]) -> dict[tuple[int, str], Any]:
    groups: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
    for (t, w, count, off), n in c.items():
        counts, offs = groups.setdefault((t, w), ([], []))
        counts.extend([count] * n)
        offs.extend([off] * n)
    return {k: (sorted(a), sorted(b)) for k, (a, b) in groups.items()}


@pytest.mark.parametrize("workers", [1, 2])
def test_mechanisms_agree(workers: int) -> None:
    want = by_time_word(expected())
    for name, build in MECHANISMS.items():
        assert by_time_word(run(build, workers)) == want, name
    for name in CHAIN_MECHANISMS:
        assert by_time_word(run(gated(name, 3), workers)) == want, f"gated {name}"
    for name, build in TIMED_MECHANISMS.items():
        assert by_time_word(run_timed(build, workers)) == want, f"timed {name}"
    for name, build in columnar.MECHANISMS.items():
        assert by_time_word(run_columnar(build, workers)) == want, f"columnar {name}"


def test_histogram() -> None:
    h = Histogram()
    values = [1, 5, 15, 16, 17, 1000, 10**6, 10**9]
    for v in values:
        h.add(v)
    assert h.count == len(values)
    assert h.max == 10**9
    assert h.percentile(1.0) == 10**9
    assert h.percentile(0.5) in range(16, 19)  # the 4th value, 16, to within its bin
    for v in values[4:]:
        index = next(i for i in range(len(h.counts)) if h.upper(i) >= v)
        assert h.upper(index) <= v * 1.125
    h.since = 100
    h.record(200, 50)  # offered before ``since``: not counted
    assert h.count == len(values)
    v = Histogram()  # the vectorized path bins exactly as the scalar one
    many = [0, 3, 15, 16, 17, 31, 32, 33, 2**20 - 1, 2**20, 2**20 + 1, 12345678, 10**9, 2**40 - 1]
    v.add_array(np.array(many + values, dtype=np.int64))
    for x in many:
        h.add(x)
    assert v.counts == h.counts and v.max == h.max
