"""Library operators on 1 and 2 workers against plain-Python expectations.

Every worker ``w`` feeds ``worker_data(w, e)`` at epochs ``e = 0 .. EPOCHS-1`` into one input
(``send_batch``, then ``advance_to(e + 1)``), closes it, and returns its captures; the expected
outputs are computed here from ``worker_data`` alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tokenflow.comm.thread import ThreadFabric
from tokenflow.dataflow.capability import CapabilityError
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import unary
from tokenflow.dataflow.operators.probe import ProbeHandle
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.stream import Stream
from tokenflow.execute import WorkerError, execute
from tokenflow.order import Product
from tokenflow.worker import Worker

EPOCHS = 3
PEERS = [1, 2]

Results = list[dict[str, Any]]


def worker_data(w: int, e: int) -> list[int]:
    return [w * 1000 + e * 100 + i for i in range(4 + 3 * e + w)]


def all_data(peers: int) -> dict[int, list[int]]:
    return {e: [x for w in range(peers) for x in worker_data(w, e)] for e in range(EPOCHS)}


def run(peers: int, build: Callable[[Scope, Stream], dict[str, Any]],
        data: Callable[[int, int], Any] = worker_data) -> Results:
    """Run ``build(scope, input_stream)`` on ``peers`` workers; returns each worker's dict
    (captures and anything else ``build`` returned) once every dataflow is complete."""

    def job(worker: Worker) -> dict[str, Any]:
        def b(scope: Scope) -> tuple[InputHandle, dict[str, Any]]:
            inp, stream = scope.new_input("In")
            return inp, build(scope, stream)

        inp, out = worker.dataflow(b)
        for e in range(EPOCHS):
            inp.send_batch(data(worker.index, e))
            inp.advance_to(e + 1)
        inp.close()
        out["worker"] = worker.index
        return out

    results = execute(job, workers=peers)
    for r in results:
        for v in r.values():
            if isinstance(v, Capture):
                assert v.done
    return results


def order_key(record: Any) -> Any:
    """Sort key for records (Arrow rows come back as dicts, which do not compare)."""
    return sorted(record.items()) if isinstance(record, dict) else record


def merged(results: Results, name: str) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for r in results:
        for t, records in r[name].by_time().items():
            out[t].extend(records)
    return {t: sorted(v, key=order_key) for t, v in out.items()}


def own(results: Results, name: str, w: int) -> dict[Any, list[Any]]:
    return {t: sorted(v, key=order_key) for t, v in results[w][name].by_time().items()}


def nonempty(d: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    return {t: sorted(v) for t, v in d.items() if v}


# -- record-wise operators ---------------------------------------------------------------------


@pytest.mark.parametrize("peers", PEERS)
def test_map_filter_flat_map_stay_on_their_worker(peers: int) -> None:
    results = run(peers, lambda scope, s: {
        "map": s.map(lambda x: x * 3 + 1).capture(),
        "filter": s.filter(lambda x: x % 3 == 0).capture(),
        "flat_map": s.flat_map(lambda x: [x] * (x % 3)).capture(),
    })
    for w in range(peers):
        mine = {e: worker_data(w, e) for e in range(EPOCHS)}
        assert own(results, "map", w) == nonempty({e: [x * 3 + 1 for x in xs]
                                                   for e, xs in mine.items()})
        assert own(results, "filter", w) == nonempty({e: [x for x in xs if x % 3 == 0]
                                                      for e, xs in mine.items()})
        assert own(results, "flat_map", w) == nonempty({e: [x for x in xs for _ in range(x % 3)]
                                                        for e, xs in mine.items()})
    assert merged(results, "map") == {e: sorted(x * 3 + 1 for x in xs)
                                      for e, xs in all_data(peers).items()}


@pytest.mark.parametrize("peers", PEERS)
def test_map_batch_sees_whole_batches(peers: int) -> None:
    results = run(peers, lambda scope, s: {
        "sizes": s.map_batch(lambda b: [(len(b), sum(b))]).capture(),
    })
    for w in range(peers):
        assert own(results, "sizes", w) == {
            e: [(len(worker_data(w, e)), sum(worker_data(w, e)))] for e in range(EPOCHS)}


@pytest.mark.parametrize("peers", PEERS)
def test_map_batch_on_arrow(peers: int) -> None:
    def data(w: int, e: int) -> pa.RecordBatch:
        xs = worker_data(w, e)
        return pa.record_batch({"x": pa.array(xs, pa.int64())})

    def double(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch({"x": pc.multiply(batch.column("x"), 2)})

    results = run(peers, lambda scope, s: {"out": s.map_batch(double).capture()}, data)
    for r in results:
        assert all(isinstance(b, pa.RecordBatch) for _, b in r["out"].events)
    assert merged(results, "out") == {e: [{"x": 2 * x} for x in sorted(xs)]
                                      for e, xs in all_data(peers).items()}


# -- moving data between workers ---------------------------------------------------------------


@pytest.mark.parametrize("peers", PEERS)
def test_exchange_routes_each_key_to_one_worker(peers: int) -> None:
    results = run(peers, lambda scope, s: {"out": s.exchange(lambda x: x % 7).capture()})
    assert merged(results, "out") == {e: sorted(xs) for e, xs in all_data(peers).items()}
    owner: dict[int, set[int]] = defaultdict(set)
    for w, r in enumerate(results):
        for x in r["out"].records():
            owner[x % 7].add(w)
    assert all(len(ws) == 1 for ws in owner.values()), owner
    assert len(owner) == 7
    if peers == 2:
        assert {w for ws in owner.values() for w in ws} == {0, 1}  # really spread out


@pytest.mark.parametrize("peers", PEERS)
def test_exchange_with_string_keys_and_pact(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        words = s.map(lambda x: (f"w{x % 5}", x))

        def forward(cap: Any, info: Any) -> Any:
            cap.drop()

            def logic(inp: Any, out: Any) -> None:
                for ref, batch in inp:
                    out.give_batch(ref, [(info.worker_index, r) for r in batch])

            return logic

        return {"out": unary(words, Exchange(lambda kv: kv[0]), "Tag", forward).capture()}

    results = run(peers, build)
    seen = [r for res in results for r in res["out"].records()]
    assert sorted(kv for _, kv in seen) == sorted(
        (f"w{x % 5}", x) for xs in all_data(peers).values() for x in xs)
    workers_per_key: dict[str, set[int]] = defaultdict(set)
    for w, (word, _) in seen:
        workers_per_key[word].add(w)
    assert all(len(ws) == 1 for ws in workers_per_key.values())


@pytest.mark.parametrize("peers", PEERS)
def test_broadcast_gives_every_worker_everything(peers: int) -> None:
    results = run(peers, lambda scope, s: {"out": s.broadcast().capture()})
    expected = {e: sorted(xs) for e, xs in all_data(peers).items()}
    for w in range(peers):
        assert own(results, "out", w) == expected


@pytest.mark.parametrize("peers", PEERS)
def test_arrow_batches_exchange_by_column(peers: int) -> None:
    def data(w: int, e: int) -> pa.RecordBatch:
        xs = worker_data(w, e)
        return pa.record_batch({
            "k": pa.array([x % 6 for x in xs], pa.int64()),
            "name": pa.array([f"n{x % 4}" for x in xs], pa.string()),
            "v": pa.array(xs, pa.int64()),
        })

    results = run(peers, lambda scope, s: {
        "by_k": s.exchange(column="k").capture(),
        "by_name": s.exchange(column="name").capture(),
    }, data)
    rows = {e: sorted((x % 6, f"n{x % 4}", x) for x in xs) for e, xs in all_data(peers).items()}
    for name, column in (("by_k", "k"), ("by_name", "name")):
        got = {t: sorted((r["k"], r["name"], r["v"]) for r in recs)
               for t, recs in merged(results, name).items()}
        assert got == rows  # every row exactly once, at its time
        owner: dict[Any, set[int]] = defaultdict(set)
        for w, r in enumerate(results):
            assert all(isinstance(b, pa.RecordBatch) for _, b in r[name].events)
            for row in r[name].records():
                owner[row[column]].add(w)
        assert all(len(ws) == 1 for ws in owner.values()), (name, owner)


def test_exchange_with_a_missing_column_fails() -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        return {"out": s.exchange(column="nope").capture()}

    def data(w: int, e: int) -> pa.RecordBatch:
        return pa.record_batch({"k": pa.array([1, 2, 3], pa.int64())})

    with pytest.raises(WorkerError) as info:
        run(2, build, data)
    assert "nope" in str(info.value)


# -- combining and observing -------------------------------------------------------------------


@pytest.mark.parametrize("peers", PEERS)
def test_concat(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        evens = s.filter(lambda x: x % 2 == 0)
        tens = s.map(lambda x: x * 10)
        return {"out": evens.concat(tens, s).capture()}

    results = run(peers, build)
    expected = {e: sorted([x for x in xs if x % 2 == 0] + [x * 10 for x in xs] + xs)
                for e, xs in all_data(peers).items()}
    assert merged(results, "out") == expected


@pytest.mark.parametrize("peers", PEERS)
def test_inspect_and_inspect_batch(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        seen: list[int] = []
        batches: list[tuple[Any, int]] = []
        out = s.inspect(seen.append).inspect_batch(lambda t, b: batches.append((t, len(b))))
        return {"seen": seen, "batches": batches, "out": out.capture()}

    results = run(peers, build)
    for w, r in enumerate(results):
        mine = [x for e in range(EPOCHS) for x in worker_data(w, e)]
        assert r["seen"] == mine  # every record, in order
        assert r["batches"] == [(e, len(worker_data(w, e))) for e in range(EPOCHS)]
        assert r["out"].records() == mine  # passed through unchanged


@pytest.mark.parametrize("peers", PEERS)
def test_probe_tracks_completed_epochs(peers: int) -> None:
    def job(worker: Worker) -> list[tuple[int, list[Any]]]:
        def build(scope: Scope) -> tuple[InputHandle, ProbeHandle, Capture]:
            inp, s = scope.new_input("In")
            out = s.exchange(lambda x: x)
            return inp, out.probe(), out.capture()

        inp, probe, cap = worker.dataflow(build)
        assert probe.less_equal(0)  # nothing complete before the first step
        complete_at: list[tuple[int, list[Any]]] = []
        for e in range(EPOCHS):
            inp.send_batch(worker_data(worker.index, e))
            inp.advance_to(e + 1)
            worker.step_while(lambda t=e + 1: probe.less_than(t))
            assert not probe.less_than(e + 1) and probe.less_equal(e + 1)
            # Epoch e is complete: what this worker got at e is final.
            complete_at.append((e, sorted(cap.by_time().get(e, []))))
        inp.close()
        worker.step_while(lambda: not probe.done())
        assert probe.with_frontier() == []
        final = cap.by_time()
        assert all(sorted(final.get(e, [])) == records for e, records in complete_at)
        return complete_at

    results = execute(job, workers=peers)
    for e in range(EPOCHS):
        assert sorted(x for r in results for x in r[e][1]) == sorted(all_data(peers)[e])


@pytest.mark.parametrize("peers", PEERS)
def test_probe_with_shares_one_handle(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        handle = ProbeHandle()
        out = s.probe_with(handle).map(lambda x: -x)
        return {"handle": handle, "out": out.capture()}

    results = run(peers, build)
    for r in results:
        assert r["handle"].done()
    assert merged(results, "out") == {e: sorted(-x for x in xs)
                                      for e, xs in all_data(peers).items()}


@pytest.mark.parametrize("peers", PEERS)
def test_capture_records_events_and_frontiers(peers: int) -> None:
    results = run(peers, lambda scope, s: {"out": s.capture()})
    for w, r in enumerate(results):
        cap: Capture = r["out"]
        assert cap.events == [(e, worker_data(w, e)) for e in range(EPOCHS)]
        assert cap.records() == [x for e in range(EPOCHS) for x in worker_data(w, e)]
        # Frontiers move forward epoch by epoch (some may be skipped) and end empty.
        assert cap.frontiers[-1] == []
        fronts = [f[0] for f in cap.frontiers[:-1]]
        assert fronts == sorted(fronts) and set(fronts) <= set(range(EPOCHS + 1))
        assert cap.done


# -- delay ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("peers", PEERS)
def test_delay_moves_records_to_later_times(peers: int) -> None:
    results = run(peers, lambda scope, s: {"out": s.delay(lambda x, t: t + x % 4).capture()})
    expected: dict[int, list[int]] = defaultdict(list)
    for e, xs in all_data(peers).items():
        for x in xs:
            expected[e + x % 4].append(x)
    assert merged(results, "out") == nonempty(expected)


def test_delay_releases_only_after_the_frontier_passed() -> None:
    worker = Worker(ThreadFabric(1).allocator(0))

    def build(scope: Scope) -> tuple[InputHandle, Capture, ProbeHandle]:
        inp, s = scope.new_input("In")
        out = s.delay(lambda x, t: t + 2)
        return inp, out.capture(), out.probe()

    inp, cap, probe = worker.dataflow(build)
    inp.send_batch([1, 2, 3])  # at 0, released at 2
    for epoch, visible in ((1, False), (2, False), (3, True)):
        inp.advance_to(epoch)
        for _ in range(10):
            worker.step()
        assert bool(cap.events) is visible, epoch
        assert probe.less_equal(2) is not visible  # the delay holds a token at 2 until then
    assert cap.events == [(2, [1, 2, 3])]
    inp.close()
    for _ in range(10):
        worker.step()
    assert probe.done() and cap.done


def test_delay_back_in_time_is_an_error() -> None:
    worker = Worker(ThreadFabric(1).allocator(0))

    def build(scope: Scope) -> InputHandle:
        inp, s = scope.new_input("In")
        s.delay(lambda x, t: t - 1, name="Rewind").capture()
        return inp

    inp = worker.dataflow(build)
    inp.advance_to(5)
    inp.send_batch(["rec"])
    with pytest.raises(CapabilityError) as info:
        for _ in range(5):
            worker.step()
    message = str(info.value)
    assert "Rewind" in message and "'rec'" in message and "5" in message and "4" in message


def test_delay_error_through_execute_names_the_worker() -> None:
    def job(worker: Worker) -> None:
        def build(scope: Scope) -> InputHandle:
            inp, s = scope.new_input("In")
            s.delay(lambda x, t: t - 1 if x == "bad" else t, name="Rewind").capture()
            return inp

        inp = worker.dataflow(build)
        inp.advance_to(3)
        inp.send_batch(["bad"] if worker.index == 1 else ["good"])
        inp.close()

    with pytest.raises(WorkerError, match="worker 1") as info:
        execute(job, workers=2)
    assert isinstance(info.value.__cause__, CapabilityError)
    assert "Rewind" in str(info.value) and "'bad'" in str(info.value)


# -- partition / branch ------------------------------------------------------------------------


@pytest.mark.parametrize("peers", PEERS)
def test_partition_and_branch(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        parts = s.partition(3, lambda x: (x % 3, x * 10))
        low, high = s.branch(lambda x: x % 100 >= 5)
        out = {f"p{i}": p.capture() for i, p in enumerate(parts)}
        out["low"] = low.capture()
        out["high"] = high.capture()
        return out

    results = run(peers, build)
    data = all_data(peers)
    for i in range(3):
        assert merged(results, f"p{i}") == nonempty(
            {e: [x * 10 for x in xs if x % 3 == i] for e, xs in data.items()})
    assert merged(results, "low") == nonempty({e: [x for x in xs if x % 100 < 5]
                                               for e, xs in data.items()})
    assert merged(results, "high") == nonempty({e: [x for x in xs if x % 100 >= 5]
                                                for e, xs in data.items()})


def test_partition_out_of_range_names_the_record() -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        return {"p": s.partition(2, lambda x: (5, x), name="Split")[0].capture()}

    with pytest.raises(WorkerError) as info:
        run(1, build)
    assert isinstance(info.value.__cause__, IndexError)
    assert "Split" in str(info.value) and "part 5" in str(info.value)


# -- iteration ---------------------------------------------------------------------------------


def collatz_steps(x: int) -> list[int]:
    """The values an input visits in the loop below: x, next(x), ... until 1 (inclusive)."""
    out = [x]
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        out.append(x)
    return out


@pytest.mark.parametrize("peers", PEERS)
def test_iterate_enter_leave_feedback(peers: int) -> None:
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        small = s.map(lambda x: x % 30 + 1)

        def loop(inner: Scope) -> tuple[Stream, Capture]:
            handle, fed = inner.feedback(1)
            body = small.enter(inner).concat(fed).exchange(lambda x: x)
            inside = body.capture()
            body.filter(lambda x: x != 1).map(
                lambda x: x // 2 if x % 2 == 0 else 3 * x + 1).connect_loop(handle)
            return body.leave(), inside

        left, inside = scope.iterative(loop)
        return {"left": left.capture(), "inside": inside}

    results = run(peers, build)
    expected_left: dict[int, list[int]] = defaultdict(list)
    expected_inside: dict[Any, list[int]] = defaultdict(list)
    for e, xs in all_data(peers).items():
        for x in xs:
            for i, v in enumerate(collatz_steps(x % 30 + 1)):
                expected_left[e].append(v)
                expected_inside[Product(e, i)].append(v)
    assert merged(results, "left") == nonempty(expected_left)
    assert merged(results, "inside") == nonempty(expected_inside)
    assert all(isinstance(t, Product) for r in results for t, _ in r["inside"].events)


@pytest.mark.parametrize("peers", PEERS)
def test_feedback_with_larger_step_and_counts(peers: int) -> None:
    """A feedback summary of 2 iterations: each pass adds 2 to the inner coordinate."""
    def build(scope: Scope, s: Stream) -> dict[str, Any]:
        def loop(inner: Scope) -> Capture:
            handle, fed = inner.feedback(2)
            body = s.map(lambda x: x % 4).enter(inner).concat(fed)
            body.filter(lambda x: x > 0).map(lambda x: x - 1).connect_loop(handle)
            return body.capture()

        return {"inside": scope.iterative(loop)}

    results = run(peers, build)
    expected: dict[Any, list[int]] = defaultdict(list)
    for e, xs in all_data(peers).items():
        for x in xs:
            for k in range(x % 4 + 1):
                expected[Product(e, 2 * k)].append(x % 4 - k)
    assert merged(results, "inside") == nonempty(expected)


def test_iteration_misuse() -> None:
    worker = Worker(ThreadFabric(1).allocator(0))
    checked: list[str] = []

    def build(scope: Scope) -> None:
        _, s = scope.new_input("In")
        with pytest.raises(ValueError, match="root scope"):
            s.leave()
        with pytest.raises(ValueError, match="iterative"):
            scope.feedback(1)

        def loop(inner: Scope) -> None:
            with pytest.raises(ValueError, match=">= 1"):
                inner.feedback(0)

            def nested(inner2: Scope) -> None:
                with pytest.raises(ValueError, match="not nested"):
                    s.enter(inner2)  # s lives two scopes up
                checked.append("nested")

            inner.iterative(nested, name="Nested")
            handle, fed = inner.feedback(1)
            body = s.enter(inner).concat(fed)
            body.filter(lambda x: False).connect_loop(handle)
            with pytest.raises(RuntimeError, match="already connected"):
                body.connect_loop(handle)
            checked.append("loop")

        scope.iterative(loop)

    worker.dataflow(build)
    assert checked == ["nested", "loop"]
    running = [worker.step() for _ in range(5)]
    assert not running[-1]  # the input handle was garbage: its token released, all complete


def test_mixing_scopes_without_enter_fails_the_build() -> None:
    worker = Worker(ThreadFabric(1).allocator(0))

    def build(scope: Scope) -> None:
        _, s = scope.new_input("In")

        def loop(inner: Scope) -> None:
            handle, fed = inner.feedback(1)
            fed.connect_loop(handle)
            s.concat(fed)  # fed is in the loop scope, s outside

        scope.iterative(loop)

    with pytest.raises(ValueError, match="another scope"):
        worker.dataflow(build)
