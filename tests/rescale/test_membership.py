"""Workers joining and leaving a running job: a word count scaled 2 -> 3 -> 4 -> 3 -> 2
workers while it runs produces exactly a plain ``Counter``'s running counts, the joined workers
really own and hand back bins, and the protocol's guards hold."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from typing import Any

import cloudpickle
import pytest
from running_counts import running_counts

from tokenflow import execute
from tokenflow.job import start
from tokenflow.membership import MembershipError
from tokenflow.rescale import megaphone_fold

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's Python workers

FEEDERS = 2
SLOTS = 4
EPOCHS = 60
BINS = 64


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def word_count(pace: float) -> Any:
    """The running word count fed by the job's first ``FEEDERS`` workers, one epoch per
    ``pace`` seconds; a worker that joined later feeds nothing and returns what it produced."""

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
                deadline = time.monotonic() + pace
                while time.monotonic() < deadline:
                    worker.step_or_park(0.005)
            inp.close()
        worker.step_until_done()
        return {"out": capture.by_time(), "moved": [s.bins for s in handle.moved],
                "keys": len(handle.state.data), "joined": joined, "left": worker.left}

    return run


def oracle() -> dict[int, Counter[Any]]:
    return running_counts([w for worker in range(FEEDERS) for w in words(worker, e)]
                          for e in range(EPOCHS))


def merged(results: list[Any]) -> dict[int, Counter[Any]]:
    out: dict[int, Counter[Any]] = {}
    for r in results:
        if r is None:
            continue
        for t, records in r["out"].items():
            out.setdefault(t, Counter()).update(records)
    return out


def test_scale_out_and_in_while_running() -> None:
    handle = start(word_count(pace=0.08), workers=FEEDERS, runtime="thread", bins=BINS,
                   slots=SLOTS)
    time.sleep(0.3)
    rosters = [handle.scale(3), handle.scale(4)]
    time.sleep(0.3)
    rosters += [handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=120)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle()
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] for r in joined)
    # the joined workers owned bins (they produced output and handed their bins back)
    assert all(r["out"] and sum(r["moved"]) > 0 for r in joined)
    assert all(r["keys"] == 0 for r in joined)
    assert sum(r["keys"] for r in results[:FEEDERS]) > 0


def test_add_worker_needs_a_free_slot() -> None:
    handle = start(word_count(pace=0.02), workers=FEEDERS, runtime="thread", bins=BINS)
    with pytest.raises(MembershipError, match="no free worker slot"):
        handle.add_worker()
    assert merged(handle.result(timeout=60)) == oracle()


def test_slots_without_joins_change_nothing() -> None:
    """A job with free slots that never grows gives the same output as one without."""
    results = execute(word_count(pace=0.0), workers=FEEDERS, runtime="thread", slots=SLOTS)
    assert merged(results) == oracle()
    assert results[FEEDERS:] == [None] * (SLOTS - FEEDERS)


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_scale_out_and_in_on_the_process_runtime() -> None:
    """Worker processes start, join the mesh and bootstrap while the job runs, then hand
    their bins back and exit; the output is the oracle's."""
    handle = start(word_count(pace=0.15), workers=FEEDERS, runtime="process", bins=BINS,
                   slots=SLOTS)
    time.sleep(1.0)
    rosters = [handle.scale(3), handle.scale(4), handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=180)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle()
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] and r["keys"] == 0 for r in joined)
    assert all(sum(r["moved"]) > 0 for r in joined)


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_scale_out_and_in_on_spark(spark: Any) -> None:
    """Each joining worker runs as a one-task barrier stage of its own on the same
    SparkSession while the first stage keeps running; the output is the oracle's."""
    handle = start(word_count(pace=0.15), workers=FEEDERS, runtime="spark", bins=BINS,
                   slots=SLOTS, spark=spark)
    time.sleep(2.0)
    rosters = [handle.scale(3), handle.scale(4), handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=300)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle()
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] and r["keys"] == 0 for r in joined)
    assert all(sum(r["moved"]) > 0 for r in joined)
