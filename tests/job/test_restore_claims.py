"""Restoring a snapshot into a job whose operators declare other state fails with a message
naming the unclaimed state, instead of silently dropping it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tokenflow import execute
from tokenflow.dataflow.input import JobStopped
from tokenflow.dataflow.operators.stateful import state_machine
from tokenflow.job import start
from tokenflow.state.snapshot import SnapshotError


def job_with(operator: str) -> Any:
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            counts = state_machine(stream.map(lambda x: (x % 5, 1)),
                                   lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]), name=operator)
            return inp, counts.probe()

        inp, probe = worker.dataflow(build)
        try:
            for e in range(100):
                inp.send(e)
                inp.advance_to(e + 1)
                worker.step_while(lambda e=e: probe.less_than(e + 1))
                time.sleep(0.01)
            inp.close()
            worker.step_until_done()
        except JobStopped:
            pass

    return job


def test_restoring_into_other_operators_names_the_lost_state(tmp_path: Path) -> None:
    handle = start(job_with("Counts"), workers=2, name="claims")
    time.sleep(0.3)
    handle.snapshot(str(tmp_path), timeout=60)
    handle.result(timeout=60)
    execute(job_with("Counts"), workers=2, restore=str(tmp_path), name="claims")  # same job: fine
    with pytest.raises(Exception, match="no operator of this job declares") as info:
        execute(job_with("Renamed"), workers=2, restore=str(tmp_path), name="claims")
    cause = info.value.__cause__ or info.value
    assert isinstance(cause, SnapshotError) and "Counts" in str(cause)
