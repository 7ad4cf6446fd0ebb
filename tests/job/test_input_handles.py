"""Snapshots of jobs fed by ``InputHandle`` loops: the control plane pauses the handle at an
epoch (``advance_to`` and sends past it wait), the job stops with ``JobStopped`` ending the
worker code, and a restored run of the same code drops the input before the snapshot's epoch:
both runs' output together equals an uninterrupted run's."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tokenflow import execute
from tokenflow.dataflow.operators.stateful import state_machine
from tokenflow.job import start

EPOCHS = 60
NAME = "tests.input-handle-wordcount"


def epochs_of_words(seed: int = 5) -> list[list[str]]:
    rng = random.Random(seed)
    return [[f"w{rng.randrange(40)}" for _ in range(rng.randrange(0, 30))] for _ in range(EPOCHS)]


def wordcount(words: list[list[str]], delay: float = 0.0, keep: list[Any] | None = None) -> Any:
    """README-style: the worker code feeds its share of each epoch and waits for the probe;
    ``keep`` receives each worker's capture as soon as it is built."""

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            handle, stream = scope.new_input("words")
            counts = state_machine(stream.map(lambda w: (w, 1)),
                                   lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            return handle, counts.probe(), counts.capture()

        handle, probe, captured = worker.dataflow(build)
        if keep is not None:
            keep.append(captured)
        for epoch, batch in enumerate(words):
            handle.advance_to(epoch)
            mine = batch[worker.index::worker.peers]
            if mine:
                handle.send_batch(mine)
            handle.advance_to(epoch + 1)
            worker.step_while(lambda e=epoch: probe.less_than(e + 1))
            time.sleep(delay)
        handle.close()
        return captured

    return job


def output(*runs: list[Any]) -> dict[int, Counter[Any]]:
    """Per logical time, the multiset of records the captures of ``runs`` hold."""
    out: dict[int, Counter[Any]] = {}
    for results in runs:
        for capture in results:
            if capture is None:  # a worker function ended by JobStopped returns nothing
                continue
            for t, batch in capture.events:
                out.setdefault(t, Counter()).update(batch)
    return out


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_input_handle_job_snapshot_and_restore(tmp_path: Path, before: int, after: int) -> None:
    words = epochs_of_words(before + after)
    expected = output(execute(wordcount(words), workers=before, name=NAME))
    captures: list[Any] = []  # the thread runtime shares memory: keep run 1's captures here

    def job(worker: Any) -> Any:
        inner = wordcount(words, delay=0.01, keep=captures)
        return inner(worker)

    handle = start(job, workers=before, name=NAME)
    time.sleep(0.2)
    epoch = handle.snapshot(str(tmp_path))
    first = handle.result(timeout=60)
    assert 0 < epoch < EPOCHS
    assert all(r is None for r in first)  # every worker function was ended by JobStopped
    assert len(captures) == before
    assert max(output(captures)) < epoch  # nothing at or after the pause epoch in run 1
    second = execute(wordcount(words), workers=after, restore=str(tmp_path), name=NAME)
    assert output(captures, second) == expected
