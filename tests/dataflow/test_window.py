"""Event-time windows (``tumbling``, ``sliding``) against a brute-force grouping in plain Python.

Records ``(event_time, key, value)`` enter at coarse epochs and are re-timed to their event
times in random order (out-of-order data inside an epoch); epochs jump over several windows.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pytest

from tokenflow import WorkerError, execute
from tokenflow.dataflow.operators.generic import unary
from tokenflow.dataflow.operators.window import sliding, tumbling

pytestmark = pytest.mark.timeout(30)

# Epoch starts: gaps of several windows (e.g. 12 -> 30, 32 -> 58 -> 90) make the frontier jump.
EPOCHS = [0, 3, 4, 11, 12, 30, 31, 32, 58, 90]
KEYS = "abcde"


def make_data(workers: int, seed: int) -> list[list[tuple[int, list[tuple[int, str, int]]]]]:
    """Per worker: ``[(epoch start, records in random event-time order)]``."""
    rng = random.Random(seed)
    data = []
    for _ in range(workers):
        per_worker = []
        for i, start in enumerate(EPOCHS):
            stop = EPOCHS[i + 1] if i + 1 < len(EPOCHS) else start + 15
            n = 0 if i % 4 == 2 else rng.randrange(0, 12)
            records = [(rng.randrange(start, stop), rng.choice(KEYS), rng.randrange(100))
                       for _ in range(n)]
            per_worker.append((start, records))
        data.append(per_worker)
    return data


def retime(stream: Any) -> Any:
    """Send each ``(t, key, value)`` record at message time ``t`` (>= its epoch)."""

    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                by_time: dict[int, list[Any]] = defaultdict(list)
                for record in batch:
                    by_time[record[0]].append(record)
                for t, records in by_time.items():  # first-seen order: not sorted by time
                    out.give_batch(ref, records, t)

        return logic

    return unary(stream, "pipeline", "Retime", constructor)


def key_sums(start: int, end: int, records: list[Any]) -> list[tuple[str, int, int, int, int]]:
    """Per key: ``(key, start, end, sum of values, count)``."""
    acc: dict[str, list[int]] = {}
    for _, k, v in records:
        a = acc.setdefault(k, [0, 0])
        a[0] += v
        a[1] += 1
    return [(k, start, end, s, c) for k, (s, c) in sorted(acc.items())]


def run(data: Any, outputs: Callable[[Any], Any], workers: int) -> list[Any]:
    """Feed ``data`` epoch by epoch; ``outputs(retimed_stream)`` builds what each worker returns."""

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            return inp, outputs(retime(stream))

        inp, result = worker.dataflow(build)
        for start, records in data[worker.index]:
            inp.advance_to(start)
            if records:
                inp.send_batch(list(records))
            worker.step()
        inp.close()
        return result

    return execute(job, workers=workers)


def brute_force(data: Any, size: int, starts: Callable[[int], Iterable[int]]) -> dict[int, list]:
    """Expected outputs by window end: group every record into each window listed by starts."""
    acc: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for per_worker in data:
        for _, records in per_worker:
            for t, k, v in records:
                for s in starts(t):
                    a = acc[(s, k)]
                    a[0] += v
                    a[1] += 1
    out: dict[int, list] = defaultdict(list)
    for (s, k), (total, count) in acc.items():
        out[s + size].append((k, s, s + size, total, count))
    return {end: sorted(v) for end, v in out.items()}


def merged(captures: Iterable[Any]) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for cap in captures:
        for t, records in cap.by_time().items():
            out[t].extend(records)
    return {t: sorted(v) for t, v in out.items()}


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("size", [5, 7])
def test_tumbling_matches_brute_force(workers: int, size: int) -> None:
    data = make_data(workers, seed=100 * workers + size)
    captures = run(
        data,
        lambda s: tumbling(s.exchange(lambda r: r[1]), size, key_sums).capture(),
        workers,
    )
    expected = brute_force(data, size, lambda t: [t // size * size])
    assert len(expected) >= 8  # the data really spans many windows
    assert merged(captures) == expected
    assert all(c.done for c in captures)  # every window token was dropped


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(("size", "slide"), [(6, 2), (10, 3), (4, 4)])
def test_sliding_matches_brute_force(workers: int, size: int, slide: int) -> None:
    data = make_data(workers, seed=7 * workers + size + slide)

    def starts(t: int) -> list[int]:  # scan every aligned start that could contain t
        return [s for s in range(t - size - slide, t + 1) if s % slide == 0 and s <= t < s + size]

    captures = run(
        data,
        lambda s: sliding(s.exchange(lambda r: r[1]), size, slide, key_sums).capture(),
        workers,
    )
    assert merged(captures) == brute_force(data, size, starts)
    assert all(c.done for c in captures)


def test_sliding_with_slide_equal_size_is_tumbling() -> None:
    data = make_data(2, seed=5)
    captures = run(
        data,
        lambda s: (tumbling(s, 5, key_sums).capture(), sliding(s, 5, 5, key_sums).capture()),
        2,
    )
    for a, b in captures:
        assert a.by_time() == b.by_time()
        assert a.by_time()  # not vacuous


def test_empty_windows_produce_nothing_and_jumps_retire_in_order() -> None:
    calls: list[tuple[int, int]] = []

    def reduce(start: int, end: int, records: list[Any]) -> list[Any]:
        calls.append((start, end))
        return [(start, end, sorted(v for _, _, v in records))]

    data = [[(0, [(3, "a", 1), (1, "b", 2)]), (2, [(22, "a", 3), (47, "c", 4), (21, "c", 5)])]]
    (capture,) = run(data, lambda s: tumbling(s, 5, reduce).capture(), 1)
    assert calls == [(0, 5), (20, 25), (45, 50)]  # windows without data are never reduced
    assert capture.by_time() == {5: [(0, 5, [1, 2])], 25: [(20, 25, [3, 5])],
                                 50: [(45, 50, [4])]}
    times = [t for t, _ in capture.events]
    assert times == sorted(times)
    assert capture.done


def test_output_only_once_the_frontier_passes_the_window_end() -> None:
    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            out = tumbling(stream, 5, lambda s, e, r: [(s, e, r)])
            return inp, out.probe(), out.capture()

        inp, probe, capture = worker.dataflow(build)
        inp.advance_to(7)
        inp.send("x")
        inp.advance_to(9)
        worker.step_while(lambda: probe.less_than(9))
        before = capture.records()
        inp.advance_to(10)  # the frontier reaches the end of [5, 10): nothing < 10 can come
        worker.step_while(lambda: probe.less_than(10))
        after = capture.by_time()
        inp.close()
        return before, after

    ((before, after),) = execute(job, workers=1)
    assert before == []
    assert after == {10: [(5, 10, ["x"])]}


def test_arrow_batches_reach_reduce_as_row_dicts() -> None:
    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            out = tumbling(stream, 4, lambda s, e, r: [sum(row["v"] for row in r)])
            return inp, out.capture()

        inp, capture = worker.dataflow(build)
        inp.advance_to(1)
        inp.send_batch(pa.record_batch({"v": [1, 2, 3]}))
        inp.advance_to(2)
        inp.send_batch(pa.record_batch({"v": [10]}))
        inp.advance_to(5)
        inp.send_batch(pa.record_batch({"v": [100]}))
        inp.close()
        return capture

    (capture,) = execute(job, workers=1)
    assert capture.by_time() == {4: [16], 8: [100]}


def _build_error(make: Callable[[Any], Any]) -> BaseException:
    def job(worker: Any) -> None:
        def build(scope: Any) -> None:
            _, stream = scope.new_input()
            make(stream)

        worker.dataflow(build)

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert info.value.__cause__ is not None
    return info.value.__cause__


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda s: tumbling(s, 0, key_sums), ValueError, "size must be > 0"),
        (lambda s: tumbling(s, -3, key_sums), ValueError, "size must be > 0"),
        (lambda s: tumbling(s, 2.5, key_sums), TypeError, "size must be an int"),
        (lambda s: sliding(s, 0, 1, key_sums), ValueError, "size must be > 0"),
        (lambda s: sliding(s, 5, 0, key_sums), ValueError, "slide must be > 0"),
        (lambda s: sliding(s, 5, -1, key_sums), ValueError, "slide must be > 0"),
        (lambda s: sliding(s, 5, 6, key_sums), ValueError, "larger than size"),
    ],
)
def test_bad_sizes_raise(make: Callable[[Any], Any], error: type, words: str) -> None:
    cause = _build_error(make)
    assert isinstance(cause, error)
    assert words in str(cause)


def test_reduce_returning_none_is_a_clear_error() -> None:
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            tumbling(stream, 5, lambda s, e, r: None, name="Bad")  # type: ignore[arg-type, return-value]
            return inp

        inp = worker.dataflow(build)
        inp.send(1)
        inp.close()

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert isinstance(info.value.__cause__, TypeError)
    assert "'Bad'" in str(info.value.__cause__) and "returned None" in str(info.value.__cause__)


def test_non_integer_times_are_rejected() -> None:
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            scope.iterative(lambda inner: tumbling(stream.enter(inner), 5, key_sums).leave())
            return inp

        inp = worker.dataflow(build)
        inp.send((1, "a", 1))
        inp.close()

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert isinstance(info.value.__cause__, TypeError)
    assert "int times" in str(info.value.__cause__)
