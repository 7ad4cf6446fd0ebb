"""Inputs on a worker that joined a running job (``JobHandle.add_worker(inputs=True)``): the
job lends it a token for each open input at worker 0's epoch, its worker code feeds words from
there, and the running counts are a plain ``Counter``'s over everything every worker fed; a
joiner without lent tokens can only close its inputs, and says why when it tries to send."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from typing import Any

import cloudpickle
import pytest
from running_counts import running_counts

from tokenflow.dataflow.capability import CapabilityError
from tokenflow.job import start
from tokenflow.rescale import megaphone_fold

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FEEDERS = 2
SLOTS = 3
EPOCHS = 50
JOINER_EPOCHS = 12
BINS = 64


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 40}" for _ in range(20)]


def word_count(pace: float, feed_on_join: bool) -> Any:
    """Workers started with the job feed epochs ``0..EPOCHS-1``; a joined worker waits for
    its input's token and feeds ``JOINER_EPOCHS`` epochs from the epoch it was lent (or, with
    ``feed_on_join`` False, tries to send, records the error and closes)."""

    def run(worker: Any) -> dict[str, Any]:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
            return inp, handle.stream.capture()

        inp, capture = worker.dataflow(build)
        joined = worker.joining
        fed: list[int] = []
        error = None
        if joined and not feed_on_join:
            try:
                inp.send("x")
            except CapabilityError as exc:
                error = str(exc)
            inp.close()
            epochs: range = range(0)
        elif joined:
            worker.step_while(lambda: not inp.ready)
            epochs = range(0) if inp.closed else range(inp.time, min(inp.time + JOINER_EPOCHS,
                                                                     EPOCHS))
        else:
            epochs = range(EPOCHS)
        for e in epochs:
            for w in words(worker.index, e):
                inp.send(w)
            fed.append(e)
            inp.advance_to(e + 1)
            deadline = time.monotonic() + pace
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return {"out": capture.by_time(), "fed": fed, "joined": joined, "error": error}

    return run


def merged(results: list[Any]) -> dict[int, Counter[Any]]:
    out: dict[int, Counter[Any]] = {}
    for r in results:
        if r is not None:
            for t, records in r["out"].items():
                out.setdefault(t, Counter()).update(records)
    return out


def oracle(results: list[Any]) -> dict[int, Counter[Any]]:
    """Running counts over what every worker reports it fed, epoch by epoch."""
    fed = [(r_index, set(r["fed"])) for r_index, r in enumerate(results) if r is not None]
    return running_counts([w for worker, epochs in fed if e in epochs
                           for w in words(worker, e)] for e in range(EPOCHS))


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_a_joined_worker_feeds_its_lent_input(runtime: str) -> None:
    handle = start(word_count(pace=0.05, feed_on_join=True), workers=FEEDERS, runtime=runtime,
                   bins=BINS, slots=SLOTS)
    time.sleep(0.6)
    k = handle.add_worker(inputs=True)
    handle.rescale(handle.roster)  # it also owns bins, so its words are counted there too
    results = handle.result(timeout=180)
    assert k == FEEDERS
    joined = results[k]
    assert joined["joined"] and joined["fed"]
    assert 0 < joined["fed"][0] < EPOCHS  # it started at the job's epoch, not at 0
    assert merged(results) == oracle(results)


def test_a_joined_worker_without_lent_inputs_cannot_send() -> None:
    handle = start(word_count(pace=0.02, feed_on_join=False), workers=FEEDERS, runtime="thread",
                   bins=BINS, slots=SLOTS)
    time.sleep(0.3)
    k = handle.add_worker()
    results = handle.result(timeout=120)
    assert "joined a running job and holds no token" in results[k]["error"]
    assert "add_worker(inputs=True)" in results[k]["error"]
    assert merged(results) == oracle(results)
