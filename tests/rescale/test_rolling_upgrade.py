"""A rolling upgrade step (``JobHandle.replace_worker``): a new worker joins, every bin of the
replaced worker moves straight to it in one layout change (no other bin moves, nothing goes
through a third worker), the replaced worker leaves, and the running counts are a plain
``Counter``'s."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from typing import Any

import cloudpickle
import pytest
from running_counts import running_counts

from tokenflow.job import start
from tokenflow.rescale import megaphone_fold
from tokenflow.state.bins import RoutingTable

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FEEDERS = 2
SLOTS = 5
EPOCHS = 60
BINS = 64


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def run(worker: Any) -> dict[str, Any]:
    def build(scope: Any) -> Any:
        inp, stream = scope.new_input()
        handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
        return inp, handle, handle.stream.capture()

    inp, handle, capture = worker.dataflow(build)
    joined = worker.joining
    if joined:
        inp.close()
    else:
        for e in range(EPOCHS):
            for w in words(worker.index, e):
                inp.send(w)
            inp.advance_to(e + 1)
            deadline = time.monotonic() + 0.08
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
    worker.step_until_done()
    changes = [(list(table.roster), table.owners.tolist()) for _, table
               in handle.controller.changes] if worker.index == 0 else []
    return {"out": capture.by_time(), "keys": len(handle.state.data), "joined": joined,
            "left": worker.left, "changes": changes}


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_replace_moves_exactly_the_replaced_workers_bins_to_the_new_one(runtime: str) -> None:
    handle = start(run, workers=FEEDERS, runtime=runtime, bins=BINS, slots=SLOTS)
    time.sleep(0.5)
    assert handle.scale(3) == [0, 1, 2]
    time.sleep(0.5)
    new = handle.replace_worker(2)
    results = handle.result(timeout=180)
    assert new == 3 and handle.roster == [0, 1, 3]
    out: dict[int, Counter[Any]] = {}
    for r in results:
        if r is not None:
            for t, records in r["out"].items():
                out.setdefault(t, Counter()).update(records)
    assert out == running_counts([w for worker in range(FEEDERS) for w in words(worker, e)]
                                 for e in range(EPOCHS))
    *_, (before_roster, before), (after_roster, after) = results[0]["changes"]
    assert before_roster == [0, 1, 2] and after_roster == [0, 1, 3]
    # one layout change: the bins of 2 went to 3, every other bin stayed where it was
    assert [a for b, a in zip(before, after, strict=True) if b == 2] == [3] * before.count(2)
    assert [(b, a) for b, a in zip(before, after, strict=True) if b != 2 and a != b] == []
    assert before.count(2) > 0
    assert results[2]["joined"] and results[2]["left"] and results[2]["keys"] == 0
    assert results[3]["joined"] and results[3]["keys"] > 0  # it holds 2's state now


def test_replaced_table_moves_one_workers_bins() -> None:
    table = RoutingTable.even(3, 16)
    replaced = table.replaced(1, 7)
    assert replaced.roster == (0, 2, 7) and replaced.version == table.version + 1
    assert replaced.moved(table).tolist() == table.owned_by(1).tolist()
    assert replaced.owned_by(7).tolist() == table.owned_by(1).tolist()
    with pytest.raises(ValueError, match="worker 5 is not in the roster"):
        table.replaced(5, 7)
