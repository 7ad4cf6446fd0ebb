"""``FrontierNotificator``: Naiad notifications on timestamp tokens.

Source: timely's notificator test vector (``dataflow/operators/generic/notificator.rs``), with
``Product`` times.  A notification at ``t`` is delivered once no frontier element is ``<= t``
in the product order; deliveries come in lexicographic order, duplicates merged.

Worked by hand for the vector below.  Frontier ``{(5,7), (6,1)}``:
``(1,1)``, ``(1,2)``, ``(3,5)`` have outer < 5, below both elements -> delivered;
``(5,4)``: ``(5,7)`` has 7 > 4 and ``(6,1)`` has 6 > 5 -> delivered;
``(6,0)``: ``(5,7)`` has 7 > 0, ``(6,1)`` has 1 > 0 -> delivered;
``(6,2)`` >= ``(6,1)`` and ``(5,8)`` >= ``(5,7)`` -> held.
Frontier ``{(6,10)}``: ``(5,8)`` (5 < 6) and ``(6,2)`` (2 < 10) are both delivered.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from tokenflow.comm.manual import ManualFabric
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import unary_notify
from tokenflow.dataflow.operators.probe import ProbeHandle
from tokenflow.dataflow.scope import Scope
from tokenflow.execute import execute
from tokenflow.order import Product
from tokenflow.progress.antichain import MutableAntichain
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.worker import Worker

P = Product
REQUESTS = [P(3, 5), P(5, 4), P(1, 2), P(1, 1), P(1, 1), P(5, 4), P(6, 0), P(6, 2), P(5, 8)]


def drain_times(notificator: FrontierNotificator) -> list[Any]:
    """Times delivered by ``next()`` until it returns None (tokens are dropped)."""
    out = []
    while (cap := notificator.next()) is not None:
        out.append(cap.time)
        cap.drop()
    return out


def make_vector() -> tuple[FrontierNotificator, MutableAntichain, ChangeBatch[Any]]:
    frontier = MutableAntichain.new_bottom(P(0, 0))
    internal: ChangeBatch[Any] = ChangeBatch()
    root = Capability(P(0, 0), internal, 0, "Notify")
    notificator = FrontierNotificator([frontier])
    for t in REQUESTS:
        notificator.notify_at(root.delayed(t))
    root.drop()
    return notificator, frontier, internal


def test_timely_notificator_vector_with_products() -> None:
    notificator, frontier, internal = make_vector()
    assert notificator.next() is None  # everything is >= the bottom element (0, 0)
    assert dict(internal.iter()) == {P(3, 5): 1, P(5, 4): 2, P(1, 2): 1, P(1, 1): 2, P(6, 0): 1,
                                     P(6, 2): 1, P(5, 8): 1}

    frontier.update_iter([(P(5, 7), 1), (P(6, 1), 1), (P(0, 0), -1)])
    assert sorted(frontier.frontier()) == [P(5, 7), P(6, 1)]
    assert drain_times(notificator) == [P(1, 1), P(1, 2), P(3, 5), P(5, 4), P(6, 0)]
    assert notificator.next() is None
    # Delivered tokens were dropped by us; merged duplicates by the notificator.
    assert dict(internal.iter()) == {P(6, 2): 1, P(5, 8): 1}
    assert notificator.pending_times() == [P(5, 8), P(6, 2)]

    frontier.update_iter([(P(6, 10), 1), (P(5, 7), -1), (P(6, 1), -1)])
    assert drain_times(notificator) == [P(5, 8), P(6, 2)]
    assert notificator.next() is None
    assert dict(internal.iter()) == {}
    assert notificator.pending_times() == []


def test_frontier_passed_and_is_dominated() -> None:
    notificator, frontier, _ = make_vector()
    frontier.update_iter([(P(5, 7), 1), (P(6, 1), 1), (P(0, 0), -1)])
    assert notificator.frontier_passed(P(6, 0)) and notificator.frontier_passed(P(4, 100))
    assert not notificator.frontier_passed(P(5, 7)) and not notificator.frontier_passed(P(7, 1))
    assert notificator.is_dominated(P(9, 9))  # pending (1, 1) <= (9, 9)
    assert not notificator.is_dominated(P(0, 5))  # nothing pending is <= (0, 5)


def test_for_each_drops_tokens_and_allows_new_requests() -> None:
    notificator, frontier, internal = make_vector()
    frontier.update_iter([(P(5, 7), 1), (P(6, 1), 1), (P(0, 0), -1)])
    delivered: list[Any] = []

    def fn(cap: Capability, n: FrontierNotificator) -> None:
        delivered.append(cap.time)
        if cap.time == P(1, 1):
            n.notify_at(cap.delayed(P(2, 1)))  # complete already: delivered in this loop too

    notificator.for_each(fn)
    # (2, 1) is requested while (1, 2) ... (6, 0) are queued; it is delivered after them
    # (timely semantics: the queue is refilled only when empty).
    assert delivered == [P(1, 1), P(1, 2), P(3, 5), P(5, 4), P(6, 0), P(2, 1)]
    assert dict(internal.iter()) == {P(6, 2): 1, P(5, 8): 1}


def test_notificator_watches_every_frontier() -> None:
    a = MutableAntichain.new_bottom(0)
    b = MutableAntichain.new_bottom(0)
    internal: ChangeBatch[Any] = ChangeBatch()
    root = Capability(0, internal, 0, "Two")
    notificator = FrontierNotificator([a, b])
    for t in (4, 2, 7):
        notificator.notify_at(root.delayed(t))
    root.drop()
    a.update_iter([(0, -1), (10, 1)])
    assert notificator.next() is None  # b still at 0
    b.update_iter([(0, -1), (3, 1)])
    assert drain_times(notificator) == [2]
    b.update_iter([(3, -1)])  # b done: a (10) decides
    assert drain_times(notificator) == [4, 7]


# -- end to end -------------------------------------------------------------------------------

EPOCHS = 4
INIT_TIME = 6


def records_for(worker: int, epoch: int) -> list[int]:
    return [worker * 100 + epoch * 10 + i for i in range(epoch + 2)]


def count_dataflow(scope: Scope, log: dict[str, Any]) -> tuple[InputHandle, ProbeHandle, Capture]:
    """Input -> exchange -> unary_notify counting per time -> capture."""
    inp, stream = scope.new_input("In")
    counts: dict[Any, int] = defaultdict(int)

    def logic(data: OperatorInput, out: OperatorOutput, notificator: FrontierNotificator) -> None:
        for ref, batch in data:
            counts[ref.time] += len(batch)
            notificator.notify_at(ref.retain())

        def fire(cap: Capability, _: FrontierNotificator) -> None:
            t = cap.time
            assert not data.frontier.less_equal(t), (t, data.frontier.frontier())
            log["notified"].append(t)
            out.session(cap).give((t, counts.pop(t, 0)))

        notificator.for_each(fire)

    counted = unary_notify(stream.exchange(lambda x: x), "pipeline", "CountNotify",
                           [INIT_TIME], logic)
    return inp, counted.probe(), counted.capture()


def expected_counts(peers: int) -> dict[int, list[tuple[int, int]]]:
    totals = {e: sum(len(records_for(w, e)) for w in range(peers)) for e in range(EPOCHS)}
    return {e: [(e, n)] for e, n in totals.items()}


def check_counts(captures: list[Capture], logs: list[dict[str, Any]], peers: int) -> None:
    merged: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for cap in captures:
        for t, records in cap.by_time().items():
            for time, n in records:
                assert time == t
                merged[t][time] += n
    expected = expected_counts(peers)
    assert {t: sorted(d.items()) for t, d in merged.items() if t != INIT_TIME} == expected
    # The init notification fires once per worker, with nothing counted.
    assert sorted(merged[INIT_TIME].items()) == [(INIT_TIME, 0)]
    assert sum(1 for cap in captures for t, _ in cap.events if t == INIT_TIME) == peers
    for log in logs:
        assert log["notified"] == sorted(log["notified"])  # in time order
        assert len(log["notified"]) == len(set(log["notified"]))  # once per time
        assert INIT_TIME in log["notified"]
    assert all(cap.done for cap in captures)


def test_unary_notify_end_to_end_on_two_workers() -> None:
    def job(worker: Worker) -> tuple[Capture, dict[str, Any]]:
        log: dict[str, Any] = {"notified": []}
        inp, probe, cap = worker.dataflow(lambda scope: count_dataflow(scope, log))
        for epoch in range(EPOCHS):
            inp.send_batch(records_for(worker.index, epoch))
            inp.advance_to(epoch + 1)
            worker.step_while(lambda t=epoch + 1: probe.less_than(t))
            # The epoch's notification has fired here: its count is in the capture.
            assert any(t == epoch for t, _ in cap.events) or not records_for(worker.index, epoch)
        inp.close()
        worker.step_while(lambda: not probe.done())
        return cap, log

    results = execute(job, workers=2)
    check_counts([c for c, _ in results], [log for _, log in results], 2)


@pytest.mark.parametrize("seed", range(10))
def test_unary_notify_under_random_delivery(seed: int) -> None:
    rng = random.Random(seed)
    peers = rng.randint(2, 3)
    fabric = ManualFabric(peers)
    workers = [Worker(fabric.allocator(i)) for i in range(peers)]
    logs: list[dict[str, Any]] = [{"notified": []} for _ in range(peers)]
    built = [w.dataflow(lambda scope, log=log: count_dataflow(scope, log))
             for w, log in zip(workers, logs, strict=True)]
    plans = [[("send", e) for e in range(EPOCHS)] for _ in range(peers)]
    while any(plans):
        r = rng.random()
        if r < 0.2:
            i = rng.choice([i for i, p in enumerate(plans) if p])
            _, epoch = plans[i].pop(0)
            inp = built[i][0]
            inp.send_batch(records_for(i, epoch))
            inp.advance_to(epoch + 1)
            if not plans[i]:
                inp.close()
        elif r < 0.6:
            fabric.deliver_one(rng)
        else:
            rng.choice(workers).step()
    for _ in range(20):
        fabric.deliver_all()
        if not any([w.step() for w in workers]) and fabric.pending_count() == 0:
            break
    else:
        raise AssertionError("not done after 20 rounds")
    check_counts([b[2] for b in built], logs, peers)
