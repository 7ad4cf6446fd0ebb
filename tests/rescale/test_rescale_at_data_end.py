"""A rescale asked for just as the data ends: Megaphone's control source must still let the
job finish.  The control source (worker 0) holds a token ahead of the data frontier and is
activated by the router when that frontier moves; when a requested step and the end of the
data reached it in the same invocation, it sent the step and kept its token, and nothing
activated it again: the routed operators' frontier stopped there and the job never ended
(seen as a hang of the migration kill trials)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tokenflow import execute
from tokenflow.rescale import STRATEGIES, megaphone_fold
from tokenflow.state.bins import RoutingTable

WORKERS = 3
BINS = 32
EPOCHS = 3
STEP_LIMIT = 20_000  # steps of 1 ms parks at most: 20 s, far beyond this job's needs


def words(worker: int, epoch: int) -> list[str]:
    return [f"w{(worker * 7 + epoch * 3 + i) % 11}" for i in range(20)]


def running_counts(scope: Any, initial: RoutingTable | None = None) -> Any:
    """An input of words, their running counts in a Megaphone fold, and a probe on them."""
    inp, stream = scope.new_input()
    handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                            lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]), initial=initial)
    return inp, handle, handle.stream.probe()


def job(strategy: str) -> Any:
    start = RoutingTable(RoutingTable.even(2, BINS).owners, range(WORKERS))
    target = start.rebalanced([0, 1, 2])

    def run(worker: Any) -> dict[str, Any]:
        inp, handle, probe = worker.dataflow(lambda scope: running_counts(scope, start))
        for e in range(EPOCHS):
            for w in words(worker.index, e):
                inp.send(w)
            inp.advance_to(e + 1)
            worker.step_while(lambda e=e: probe.less_equal(e))
        controller = handle.controller
        asked: list[int] = []
        if worker.index == 0:
            activate = controller.activate

            def activate_and_ask() -> None:
                """The router's activation for the end of the data: ask for the rescale
                before the control source runs, so it sees both at once."""
                activate()
                if not asked:
                    asked.append(0)  # (rescale activates the source again: ask once)
                    asked[0] = controller.rescale(target, strategy)

            controller.activate = activate_and_ask
        inp.close()
        steps = 0
        while worker.step_or_park(0.001):
            steps += 1
            if steps > STEP_LIMIT:
                raise AssertionError(f"worker {worker.index}: the job did not end within "
                                     f"{STEP_LIMIT} steps (frontiers {worker.frontiers()})")
        return {"asked": asked, "state": dict(handle.state.data),
                "moved": sum(s.bins for s in handle.moved)}

    return run


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_rescale_asked_as_the_data_ends_lets_the_job_finish(strategy: str) -> None:
    results = execute(job(strategy), workers=WORKERS, runtime="thread")
    assert results[0]["asked"] and results[0]["asked"][0] > 0, "no rescale was asked"
    expected = Counter(w for worker in range(WORKERS) for e in range(EPOCHS)
                       for w in words(worker, e))
    merged: dict[str, int] = {}
    for r in results:
        assert not set(merged) & set(r["state"]), "a word on two workers"
        merged.update(r["state"])
    assert merged == dict(expected)
    assert sum(r["moved"] for r in results) > 0, "the steps sent at the end moved nothing"


def test_a_rescale_asked_after_the_data_ended_is_refused_not_acknowledged() -> None:
    """Once the control source has seen the end of the data it holds no token, so a step
    can no longer be sent: ``JobHandle.rescale`` must say the change was not carried out
    (it used to return the planned steps while nothing moved) and the routing table stays."""
    import threading
    import time

    from tokenflow.control import ControlError
    from tokenflow.job import start

    ended, release = threading.Event(), threading.Event()

    def run(worker: Any) -> dict[str, Any]:
        inp, handle, probe = worker.dataflow(running_counts)
        for w in words(worker.index, 0):
            inp.send(w)
        inp.close()
        worker.step_while(lambda: not probe.done())
        if worker.index == 0:
            worker.step_while(lambda: not handle.controller.ended)
            ended.set()
        deadline = time.monotonic() + 30
        while not release.is_set() and time.monotonic() < deadline:
            worker.step_or_park(0.005)  # keeps answering the control plane
        return {"owners": handle.controller.table.owners.tolist(),
                "changes": len(handle.controller.changes), "state": dict(handle.state.data)}

    handle = start(run, workers=2, runtime="thread", bins=BINS)
    try:
        assert ended.wait(30), "the control source never saw the end of the data"
        with pytest.raises(ControlError, match="not carried out: the data of every migrating"):
            handle.rescale(1)
    finally:
        release.set()
    results = handle.result(timeout=60)
    assert results[0]["changes"] == 0
    assert results[0]["owners"] == RoutingTable.even(2, BINS).owners.tolist()
    merged = {**results[0]["state"], **results[1]["state"]}
    assert merged == dict(Counter(w for worker in range(2) for w in words(worker, 0)))
