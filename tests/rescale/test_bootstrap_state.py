"""The progress state a joining worker is bootstrapped from stays small however long the job
has run: it holds the pointstamps outstanding now, not the history (issue 16: "bootstrap state
transferred <= 64 KB after 10^6 epochs")."""

from __future__ import annotations

import pickle
from typing import Any

from tokenflow import execute

CHECKPOINTS = (500, 4_000, 20_000)  # 40x more epochs, not one more byte (the benchmark: 10^6)


def job(worker: Any) -> dict[str, dict[int, int]]:
    def build(scope: Any) -> Any:
        inp, stream = scope.new_input()
        counted = stream.exchange(lambda r: r).map(lambda r: r * 2).broadcast()
        return inp, counted.probe()

    inp, probe = worker.dataflow(build)
    sizes, entries = {}, {}
    for e in range(1, CHECKPOINTS[-1] + 1):
        inp.send(e)
        inp.advance_to(e)
        while probe.less_than(e):
            worker.step()
        if e in CHECKPOINTS:
            sizes[e] = len(pickle.dumps(worker.progress_states()))
            entries[e] = sum(len(counts) for _, counts in worker.progress_states().values())
    inp.close()
    return {"sizes": sizes, "entries": entries}


def test_bootstrap_state_does_not_grow_with_epochs() -> None:
    """One worker of a job with a free slot (so it keeps its progress state), 20,000 epochs."""
    got = execute(job, workers=1, runtime="thread", slots=2)[0]
    entries, sizes = got["entries"], got["sizes"]
    assert len(set(entries.values())) == 1, entries  # the same pointstamps outstanding
    assert max(sizes.values()) <= min(sizes.values()) + 64, sizes  # a few digits longer
    assert max(sizes.values()) < 64 * 1024, sizes
