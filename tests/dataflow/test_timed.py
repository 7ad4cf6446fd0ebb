"""Timed records (``InputHandle.send_at``, ``tokenflow.dataflow.operators.timed``).

A timed stream's messages carry ``(time, record)`` pairs at a message time ≤ every pair's time.
Checked here: the handle refuses a time before its epoch and sends the pairs at its epoch; a
token-holding operator built on ``TimedBuffer`` (one token at its least buffered time) emits
every time's records exactly when the frontier says the time is complete, in time order, on 1
and 2 workers, against a brute-force oracle over random schedules (times out of order within a
message, epochs spanning many times); and the frontier after it never passes a time whose
output is still to come.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.dataflow.capability import Capability, CapabilityError
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary
from tokenflow.dataflow.operators.timed import (
    TimedBatches,
    TimedBuffer,
    coalesce_times,
    least_time,
    timed_key,
)
from tokenflow.execute import execute

pytestmark = pytest.mark.timeout(120)


def test_send_at_sends_pairs_at_the_epoch_and_refuses_earlier_times() -> None:
    def job(worker: Any) -> list[tuple[int, list[Any]]]:
        seen: list[tuple[int, list[Any]]] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            stream.inspect_batch(lambda t, batch: seen.append((t, list(batch))))
            return handle

        handle = worker.dataflow(dataflow)
        handle.advance_to(10)
        handle.send_at(17, "b")
        handle.send_at(10, "a")
        with pytest.raises(CapabilityError):
            handle.send_at(9, "too early")
        handle.advance_to(20)
        handle.close()
        worker.step_until_done()
        return seen

    (seen,) = execute(job, workers=1)
    assert seen == [(10, [(17, "b"), (10, "a")])]


def buffered_count(stream: Any) -> Any:
    """Sums per (time, key) with one token at the least buffered time: every complete time's
    sums go out as one timed message, least time first."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = TimedBuffer()
        holder: list[Capability | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                buf.add(batch)
                held = holder[0]
                if held is None or ref.time < held.time:
                    if held is not None:
                        held.drop()
                    holder[0] = ref.retain()
            held = holder[0]
            if held is None:
                return
            out: list[Any] = []
            for t in buf.pop_before(least_time([input.frontier])):
                sums: Counter[str] = Counter()
                for key, n in buf.take(t):
                    sums[key] += n
                out += [(t, (key, total)) for key, total in sorted(sums.items())]
            if out:
                output.give_batch(held, out)
            least = buf.least()
            if least is None:
                held.drop()
                holder[0] = None
            elif least > held.time:
                held.downgrade(least)

        return logic

    return unary(stream, Exchange(timed_key(lambda r: r[0])), "TimedSum", constructor,
                 notify=True)


schedules = st.lists(  # per epoch: an advance (>= 0) and timed records (offset, key, n)
    st.tuples(st.integers(0, 4),
              st.lists(st.tuples(st.integers(0, 6), st.sampled_from("abcd"), st.integers(1, 3)),
                       max_size=6)),
    min_size=1, max_size=8)


@settings(max_examples=15, deadline=None)
@given(schedule=schedules, workers=st.sampled_from([1, 2]))
def test_timed_token_operator_matches_oracle(schedule: list[Any], workers: int) -> None:
    # the oracle: per time, the sum per key over all workers' records
    expected: Counter[tuple[int, str]] = Counter()
    epoch = 0
    for advance, records in schedule:
        epoch += advance
        for offset, key, n in records:
            expected[(epoch + offset, key)] += n * workers  # every worker sends the schedule

    def job(worker: Any) -> tuple[list[Any], list[str]]:
        got: list[Any] = []
        problems: list[str] = []
        passed: list[Any] = [None]  # the least probe frontier time seen after the last step

        def check(t: int, batch: list[Any]) -> None:
            for pair in batch:  # safety: output at a time the probe had already passed
                if passed[0] is not None and (passed[0] == -1 or pair[0] < passed[0]):
                    problems.append(f"{pair} after the probe passed it ({passed[0]})")
                got.append((t, pair))

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            out = buffered_count(stream)
            out.inspect_batch(check)
            return handle, out.probe()

        handle, probe = worker.dataflow(dataflow)
        epoch = 0
        for advance, records in schedule:
            epoch += advance
            handle.advance_to(epoch)
            for offset, key, n in records:
                handle.send_at(epoch + offset, (key, n))
            worker.step()
            frontier = probe.with_frontier()
            passed[0] = min(frontier) if frontier else -1
        handle.close()
        worker.step_until_done()
        return got, problems

    merged: Counter[tuple[int, str]] = Counter()
    for got, problems in execute(job, workers=workers):
        assert not problems
        times = [pair[0] for _, pair in got]
        assert times == sorted(times)  # complete times leave least first
        for message_time, (t, (key, total)) in got:
            assert message_time <= t  # a timed message's time covers its pairs
            assert (t, key) not in merged  # one sum per (time, key): emitted once complete
            merged[(t, key)] = total
    assert merged == expected


def test_timed_buffer_orders_times_and_reports_new_ones() -> None:
    buf = TimedBuffer()
    assert buf.add([(5, "x"), (3, "y"), (5, "z")]) == [5, 3]
    assert buf.add([(3, "w"), (9, "v")]) == [9]
    assert buf.least() == 3
    assert buf.pop_before(9) == [3, 5]
    assert buf.take(3) == ["y", "w"] and buf.take(5) == ["x", "z"]
    assert buf.least() == 9 and buf.pop_before(None) == [9]


def test_timed_batches_hand_over_complete_rows_sorted_and_keep_the_rest() -> None:
    rng = random.Random(7)
    pending = TimedBatches()
    rows: list[tuple[int, int]] = []  # (time, arrival), the oracle
    taken: list[tuple[int, int]] = []
    bound = 0
    for step in range(30):
        batch = [(bound + rng.randrange(0, 12), len(rows) + i) for i in range(rng.randrange(0, 6))]
        rows += batch
        if batch:
            times, ids = zip(*batch, strict=True)
            assert pending.add(pa.RecordBatch.from_arrays(
                [pa.array(times, pa.int64()), pa.array(ids, pa.int64())],
                names=["time", "id"])) == min(times)
        assert pending.least() == min((t for t, _ in rows if (t, _) not in taken), default=None)
        bound += rng.randrange(0, 4)
        done = pending.take_before(bound if step < 29 else None)
        want = sorted((r for r in rows if r not in taken and (step == 29 or r[0] < bound)),
                      key=lambda r: r[0])  # stable: arrival order within a time
        got = [] if done is None else list(zip(done.column("time").to_pylist(),
                                               done.column("id").to_pylist(), strict=True))
        assert got == want
        taken += got
    assert pending.least() is None and sorted(taken) == sorted(rows)


def test_send_batch_at_refuses_rows_before_the_epoch() -> None:
    def job(worker: Any) -> list[Any]:
        seen: list[Any] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            stream.inspect_batch(lambda t, b: seen.append((t, b.column("time").to_pylist())))
            return handle

        handle = worker.dataflow(dataflow)
        handle.advance_to(5)
        handle.send_batch_at(pa.RecordBatch.from_arrays([pa.array([9, 5], pa.int64())],
                                                        names=["time"]))
        with pytest.raises(CapabilityError):
            handle.send_batch_at(pa.RecordBatch.from_arrays([pa.array([6, 4], pa.int64())],
                                                            names=["time"]))
        handle.close()
        worker.step_until_done()
        return seen

    assert execute(job, workers=1) == [[(5, [9, 5])]]


batch_schedules = st.lists(  # per step: per epoch (advance >= 0) a batch of values, or none
    st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 99), max_size=4)),
             max_size=4),
    min_size=1, max_size=6)


@settings(max_examples=15, deadline=None)
@given(schedule=batch_schedules, workers=st.sampled_from([1, 2]))
def test_coalesce_times_keeps_every_row_and_its_time(schedule: list[Any], workers: int) -> None:
    """Batches at many times between two steps leave ``coalesce_times`` as one timed batch:
    every row once with its message time in the column, the message at the least of them;
    after an exchange the receiver's frontier still covers every row.  (Arrival order: the
    next test; here a receiver may merge two senders' messages of one time.)"""

    def job(worker: Any) -> list[tuple[int, list[int], list[int], bool]]:
        seen: list[tuple[int, list[int], list[int], bool]] = []
        probe_frontier: list[Any] = [None]

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            timed = coalesce_times(stream, "t")
            routed = timed.exchange(column="v")
            routed.inspect_batch(lambda t, b: seen.append(
                (t, b.column("t").to_pylist(), b.column("v").to_pylist(),
                 # no row behind the frontier this worker's probe had already passed
                 probe_frontier[0] is None or all(x >= probe_frontier[0]
                                                  for x in b.column("t").to_pylist()))))
            return handle, routed.probe()

        handle, probe = worker.dataflow(dataflow)
        epoch = 0
        for step in schedule:
            for advance, values in step:
                epoch += advance
                handle.advance_to(epoch)
                if values:
                    handle.send_batch(pa.record_batch({"v": pa.array(values, pa.int64())}))
            worker.step()
            frontier = probe.with_frontier()
            probe_frontier[0] = min(frontier) if frontier else None
        handle.close()
        worker.step_until_done()
        return seen

    expected: Counter[tuple[int, int]] = Counter()
    epoch = 0
    for step in schedule:
        for advance, values in step:
            epoch += advance
            expected.update((epoch, v) for v in values)
    got: Counter[tuple[int, int]] = Counter()
    for seen in execute(job, workers=workers):
        for message_time, times, values, behind_ok in seen:
            assert behind_ok
            assert times and message_time <= min(times)  # the time covers every row
            if workers == 1:  # nothing split off by the exchange: sent at the least time
                assert message_time == min(times)
            got.update(zip(times, values, strict=True))
    assert got == Counter({k: n * workers for k, n in expected.items()})


def test_coalesce_times_sends_one_message_per_activation_and_refuses_bad_input() -> None:
    def job(worker: Any) -> list[tuple[int, list[int]]]:
        seen: list[tuple[int, list[int]]] = []

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            coalesce_times(stream, "t").inspect_batch(
                lambda t, b: seen.append((t, b.column("t").to_pylist())))
            return handle

        handle = worker.dataflow(dataflow)
        for epoch in (3, 4, 7):
            handle.advance_to(epoch)
            handle.send_batch(pa.record_batch({"v": pa.array([epoch] * 2, pa.int64())}))
        handle.close()
        worker.step_until_done()
        return seen

    assert execute(job, workers=1) == [[(3, [3, 3, 4, 4, 7, 7])]]

    def bad(batch: Any) -> Any:
        def job(worker: Any) -> None:
            def dataflow(scope: Any) -> Any:
                handle, stream = scope.new_input()
                coalesce_times(stream, "t", name="Hours")
                return handle

            handle = worker.dataflow(dataflow)
            handle.advance_to(5)
            handle.send_batch(batch)
            handle.close()
            worker.step_until_done()

        return job

    with pytest.raises(Exception, match=r"Hours: needs RecordBatches at int times, got a list "
                                        r"at 5"):
        execute(bad([1, 2]), workers=1)
    with pytest.raises(Exception, match=r"Hours: the batch at 5 already has a column 't'"):
        execute(bad(pa.record_batch({"t": pa.array([1])})), workers=1)
