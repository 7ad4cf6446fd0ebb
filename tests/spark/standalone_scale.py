"""Run by ``tests/spark/test_standalone.py`` in a process of its own (one SparkContext per
process): a word count on a Spark standalone cluster grows 2 -> 3 -> 4 workers and shrinks back
to 2 while it runs; prints ``OK`` and the rosters when the output is a ``Counter``'s.

The workers the job started with feed an epoch every ``PACE`` s until the driver has made the
four changes (it then creates a marker file: the cluster runs on this machine), and ``TAIL``
epochs more: the input runs through every change however long the stage and the joins take to
start, and stops soon after the last one (a fixed 60 epochs of 0.2 s ran ~8 s past it).

Usage: ``python standalone_scale.py spark://HOST:PORT``.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tokenflow.job import start
from tokenflow.rescale import megaphone_fold
from tokenflow.spark import session

FEEDERS, SLOTS = 2, 4
PACE = 0.2
"""Seconds per epoch of input."""
TAIL = 5
"""Epochs fed after the driver's marker appeared: data still flows after the last change."""
MAX_EPOCHS = 600
"""Feeders stop here even without the marker (the driver's ``scale`` then failed)."""


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def word_count(marker: str) -> Callable[[Any], dict[str, Any]]:
    def run(worker: Any) -> dict[str, Any]:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
            return inp, handle.stream.capture()

        inp, capture = worker.dataflow(build)
        joined = worker.joining
        fed, last = 0, MAX_EPOCHS
        if not joined:
            while fed < last:
                inp.send_batch(words(worker.index, fed))
                fed += 1
                inp.advance_to(fed)
                if last == MAX_EPOCHS and os.path.exists(marker):
                    last = min(fed + TAIL, MAX_EPOCHS)
                deadline = time.monotonic() + PACE
                while time.monotonic() < deadline:
                    worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return {"out": capture.by_time(), "joined": joined, "left": worker.left, "fed": fed}

    return run


def oracle(fed: list[int]) -> Counter[Any]:
    """The running counts of the words worker ``w`` fed in its epochs ``0..fed[w]-1``."""
    counts: Counter[str] = Counter()
    out: Counter[Any] = Counter()
    for e in range(max(fed)):
        seen: Counter[str] = Counter()
        for w, n in enumerate(fed):
            if e < n:
                seen.update(words(w, e))
        for word, n in seen.items():
            for i in range(1, n + 1):
                out[(e, (word, counts[word] + i))] += 1
            counts[word] += n
    return out


def main() -> None:
    spark = session.get_session(sys.argv[1])
    marker = os.path.abspath("scaled")
    began = time.monotonic()
    handle = start(word_count(marker), workers=FEEDERS, runtime="spark", slots=SLOTS, spark=spark,
                   bins=64)
    time.sleep(3.0)
    rosters, changed = [], []
    for n in (3, 4, 3, 2):
        rosters.append(handle.scale(n))
        changed.append(round(time.monotonic() - began, 1))
    with open(marker, "w"):
        pass
    results = handle.result(timeout=300)
    print("changes done at", changed, "s, job done at", round(time.monotonic() - began, 1), "s")
    got: Counter[Any] = Counter()
    for r in results:
        for t, records in r["out"].items():
            got.update((t, rec) for rec in records)
    fed = [r["fed"] for r in results[:FEEDERS]]
    joined = [r["joined"] and r["left"] and bool(r["out"]) for r in results[FEEDERS:]]
    print("rosters", rosters, "joined-left-owned", joined, "fed", fed)
    print("OK" if got == oracle(fed) and all(joined) and min(fed) < MAX_EPOCHS else "MISMATCH")
    spark.stop()


if __name__ == "__main__":
    main()
