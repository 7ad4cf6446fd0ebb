"""Run by ``tests/spark/test_standalone.py`` in a process of its own (one SparkContext per
process): a word count on a Spark standalone cluster grows 2 -> 3 -> 4 workers and shrinks back
to 2 while it runs; prints ``OK`` and the rosters when the output is a ``Counter``'s.

Usage: ``python standalone_scale.py spark://HOST:PORT``.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from typing import Any

from tokenflow.job import start
from tokenflow.rescale import megaphone_fold
from tokenflow.spark import session

FEEDERS, SLOTS, EPOCHS = 2, 4, 60


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def run(worker: Any) -> dict[str, Any]:
    def build(scope: Any) -> Any:
        inp, stream = scope.new_input()
        handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
        return inp, handle.stream.capture()

    inp, capture = worker.dataflow(build)
    joined = worker.joining
    if joined:
        inp.close()
    else:
        for e in range(EPOCHS):
            inp.send_batch(words(worker.index, e))
            inp.advance_to(e + 1)
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
    worker.step_until_done()
    return {"out": capture.by_time(), "joined": joined, "left": worker.left}


def oracle() -> Counter[Any]:
    counts: Counter[str] = Counter()
    out: Counter[Any] = Counter()
    for e in range(EPOCHS):
        seen: Counter[str] = Counter()
        for w in range(FEEDERS):
            seen.update(words(w, e))
        for word, n in seen.items():
            for i in range(1, n + 1):
                out[(e, (word, counts[word] + i))] += 1
            counts[word] += n
    return out


def main() -> None:
    spark = session.get_session(sys.argv[1])
    handle = start(run, workers=FEEDERS, runtime="spark", slots=SLOTS, spark=spark, bins=64)
    time.sleep(3.0)
    rosters = [handle.scale(n) for n in (3, 4, 3, 2)]
    results = handle.result(timeout=300)
    got: Counter[Any] = Counter()
    for r in results:
        for t, records in r["out"].items():
            got.update((t, rec) for rec in records)
    joined = [r["joined"] and r["left"] and bool(r["out"]) for r in results[FEEDERS:]]
    print("rosters", rosters, "joined-left-owned", joined)
    print("OK" if got == oracle() and all(joined) else "MISMATCH")
    spark.stop()


if __name__ == "__main__":
    main()
