"""Flink-style in-band watermarks: ``assign_watermarks``, ``WatermarkPact``,
``tumbling_watermark`` (compared with the token-based ``tumbling``), ``forward_watermarks``."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from tokenflow import WorkerError, execute
from tokenflow.dataflow.operators.generic import unary
from tokenflow.dataflow.operators.watermark import (
    MAX_WATERMARK,
    LateDataError,
    Watermark,
    WatermarkPusher,
    assign_watermarks,
    broadcast_copies,
    forward_watermarks,
    strip_watermarks,
    tumbling_watermark,
)
from tokenflow.dataflow.operators.window import tumbling

pytestmark = pytest.mark.timeout(30)

EPOCHS = [0, 2, 9, 10, 25, 26, 27, 60, 61]


def make_data(workers: int, seed: int) -> list[list[tuple[int, list[tuple[int, int, int]]]]]:
    """Per worker: ``[(epoch start, (event_time, key, value) records in random order)]``."""
    rng = random.Random(seed)
    data = []
    for _ in range(workers):
        per_worker = []
        for i, start in enumerate(EPOCHS):
            stop = EPOCHS[i + 1] if i + 1 < len(EPOCHS) else start + 12
            n = 0 if i == 3 else rng.randrange(1, 10)
            per_worker.append((start, [(rng.randrange(start, stop), rng.randrange(6),
                                        rng.randrange(50)) for _ in range(n)]))
        data.append(per_worker)
    return data


def retime(stream: Any) -> Any:
    """Send each ``(t, key, value)`` record at message time ``t``."""

    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                by_time: dict[int, list[Any]] = defaultdict(list)
                for record in batch:
                    by_time[record[0]].append(record)
                for t, records in by_time.items():
                    out.give_batch(ref, records, t)

        return logic

    return unary(stream, "pipeline", "Retime", constructor)


def key_sums(start: int, end: int, records: list[Any]) -> list[tuple[int, int, int, int]]:
    acc: dict[int, int] = defaultdict(int)
    for _, k, v in records:
        acc[k] += v
    return [(k, start, end, s) for k, s in sorted(acc.items())]


def run(data: Any, outputs: Any, workers: int) -> list[Any]:
    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            retimed = retime(stream)
            return inp, retimed.probe(), outputs(retimed)

        inp, probe, result = worker.dataflow(build)
        for start, records in data[worker.index]:
            inp.advance_to(start)
            worker.step_while(lambda: probe.less_than(start))  # noqa: B023 - called right here
            inp.send_batch(list(records))
        inp.close()
        return result

    return execute(job, workers=workers)


def sorted_by_time(capture: Any) -> dict[int, list]:
    return {t: sorted(v) for t, v in capture.by_time().items()}


def key(record: Any) -> int:
    return int(record[1])


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_tumbling_watermark_equals_tumbling_per_worker(workers: int) -> None:
    data = make_data(workers, seed=workers)

    def outputs(s: Any) -> Any:
        keyed = s.exchange(key)
        tokens = tumbling(keyed, 4, key_sums).capture()
        marks = strip_watermarks(tumbling_watermark(assign_watermarks(keyed), 4, key_sums))
        # the same, exchanging data inside the watermark channel instead of before
        marks_keyed = strip_watermarks(
            tumbling_watermark(assign_watermarks(s), 4, key_sums, key=key))
        return tokens, marks.capture(), marks_keyed.capture()

    results = run(data, outputs, workers)
    total = 0
    for tokens, marks, marks_keyed in results:
        expected = sorted_by_time(tokens)
        total += len(expected)
        assert sorted_by_time(marks) == expected
        assert sorted_by_time(marks_keyed) == expected
        assert tokens.done and marks.done and marks_keyed.done
    assert total >= 10


@pytest.mark.parametrize("workers", [2, 3])
def test_assign_watermarks_in_band(workers: int) -> None:
    data = make_data(workers, seed=40 + workers)
    results = run(data, lambda s: (s.capture(), assign_watermarks(s).capture()), workers)
    for index, (plain, marked) in enumerate(results):
        records = marked.records()
        data_records = [r for r in records if not isinstance(r, Watermark)]
        assert Counter(data_records) == Counter(plain.records())  # data passes unchanged
        marks = [r for r in records if isinstance(r, Watermark)]
        assert {m.worker for m in marks} == {index}
        counts = Counter(m.time for m in marks)
        assert set(counts.values()) == {workers}  # one copy per downstream worker
        values = list(dict.fromkeys(m.time for m in marks))
        assert values == sorted(values) and values[-1] == MAX_WATERMARK
        assert set(values) <= set(EPOCHS) | {MAX_WATERMARK}  # frontier values: epoch starts
        assert len(values) >= 4
        # each watermark is sent at its own time, and no later data is behind it
        watermark = 0
        for time, batch in marked.events:
            for r in batch:
                if isinstance(r, Watermark):
                    assert time == r.time
                    watermark = r.time
                else:
                    assert r[0] == time >= watermark
        assert marked.done


def test_forward_watermarks_chain() -> None:
    data = make_data(2, seed=9)

    def outputs(s: Any) -> Any:
        keyed = s.exchange(key)
        chain = assign_watermarks(keyed)
        chain = forward_watermarks(chain)
        chain = forward_watermarks(chain, key=lambda r: r[2])  # reshuffle in the channel
        chain = forward_watermarks(chain, key=key)  # and back
        windows = strip_watermarks(tumbling_watermark(chain, 6, key_sums))
        return tumbling(keyed, 6, key_sums).capture(), windows.capture(), chain.capture()

    for tokens, marks, chain in run(data, outputs, 2):
        assert sorted_by_time(marks) == sorted_by_time(tokens)
        assert marks.done and chain.done
        last = [r for r in chain.records() if isinstance(r, Watermark)][-1]
        assert last.time == MAX_WATERMARK


def test_windows_close_on_watermarks_not_on_the_frontier() -> None:
    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            out = tumbling_watermark(stream, 5, lambda s, e, r: [(s, e, r)])
            return inp, out.probe(), out.capture()

        inp, probe, capture = worker.dataflow(build)
        inp.advance_to(1)
        inp.send("a")
        inp.advance_to(20)  # the frontier passes [0, 5) ...
        for _ in range(20):
            worker.step()
        before = list(capture.records())  # ... but no watermark arrived: nothing closes
        inp.send_batch([Watermark(5, 0)])  # in band, at time 20; reaches the end of [0, 5)
        worker.step_while(lambda: probe.less_than(5))
        after = capture.by_time()
        inp.send_batch([Watermark(MAX_WATERMARK, 0)])
        inp.close()
        return before, after, capture

    ((before, after, capture),) = execute(job, workers=1)
    assert before == []
    assert after == {5: [(0, 5, ["a"]), Watermark(5, 0)]}  # the window, then the watermark
    assert capture.records()[-1] == Watermark(MAX_WATERMARK, 0)
    assert capture.done


def test_late_data_is_an_error() -> None:
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            tumbling_watermark(stream, 5, lambda s, e, r: [r])
            return inp

        inp = worker.dataflow(build)
        inp.advance_to(1)
        inp.send_batch([Watermark(10, 0)])  # promises nothing before 10 ...
        inp.advance_to(2)
        inp.send("late")  # ... and breaks the promise
        inp.close()

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert isinstance(info.value.__cause__, LateDataError)
    assert "[0, 5)" in str(info.value.__cause__)


def test_watermark_from_unknown_worker_is_an_error() -> None:
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            tumbling_watermark(stream, 5, lambda s, e, r: [r])
            return inp

        inp = worker.dataflow(build)
        inp.send(Watermark(3, 4))
        inp.close()

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert isinstance(info.value.__cause__, ValueError)
    assert "worker 4" in str(info.value.__cause__)


def test_tumbling_watermark_rejects_bad_size() -> None:
    def job(worker: Any) -> None:
        worker.dataflow(lambda scope: tumbling_watermark(scope.new_input()[1], 0, key_sums))

    with pytest.raises(WorkerError) as info:
        execute(job, workers=1)
    assert isinstance(info.value.__cause__, ValueError)


class Recorder:
    def __init__(self, log: list[Any], worker: int) -> None:
        self.log = log
        self.worker = worker

    def push(self, message: Any) -> None:
        self.log.append((self.worker, message))


def test_watermark_pusher_pipelines_data_and_deals_watermarks_in_order() -> None:
    log: list[Any] = []
    pusher = WatermarkPusher([Recorder(log, 0), Recorder(log, 1), Recorder(log, 2)], 1, None,
                             None)
    w5, w6 = Watermark(5, 1), Watermark(6, 1)
    pusher.push((5, ["d1", "d2"]))
    pusher.push((5, ["d3", w5, w5]))
    pusher.push((5, [w5, "d4"]))  # a run of copies split over two batches
    pusher.push((6, [w6, w6, w6]))
    assert log == [
        (1, (5, ["d1", "d2"])),
        (1, (5, ["d3"])),
        (0, (5, [w5])), (1, (5, [w5])),
        (2, (5, [w5])),
        (1, (5, ["d4"])),
        (0, (6, [w6])), (1, (6, [w6])), (2, (6, [w6])),
    ]


def test_watermark_pusher_exchanges_data_by_key() -> None:
    log: list[Any] = []
    pusher = WatermarkPusher([Recorder(log, 0), Recorder(log, 1)], 0, lambda r: r, None)
    pusher.push((3, list(range(20)) + broadcast_copies(3, 0, 2)))
    data = [(w, r) for w, (_, batch) in log for r in batch if not isinstance(r, Watermark)]
    assert sorted(r for _, r in data) == list(range(20))
    assert {w for w, _ in data} == {0, 1}  # spread over both workers
    marks = [(w, r) for w, (_, batch) in log for r in batch if isinstance(r, Watermark)]
    assert marks == [(0, Watermark(3, 0)), (1, Watermark(3, 0))]  # after the data, one each
    assert log[-2:] == [(0, (3, [Watermark(3, 0)])), (1, (3, [Watermark(3, 0)]))]
    by_record = {r: w for w, r in data}
    log.clear()
    pusher.push((4, list(range(20))))
    assert all(by_record[r] == w for w, (_, batch) in log for r in batch)  # stable routing


def test_watermark_record() -> None:
    assert broadcast_copies(5, 1, 3) == [Watermark(5, 1)] * 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        Watermark(1, 0).time = 2  # type: ignore[misc]
