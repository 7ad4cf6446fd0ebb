"""Periodic checkpoints with a hold margin (sources may emit ``margin`` more epochs after
``hold``) recover exactly-once like those without, and report how long sources stood still."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from recovery_jobs import NAME, committed_rows, wait_for, wordcount

from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import committed_epochs


@pytest.mark.parametrize("margin", [0, 3])
def test_a_killed_worker_is_recovered_whatever_the_margin(tmp_path: Path, table, expected,
                                                         margin: int) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    ckpt = tmp_path / "ckpt"
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pids=str(pids), pace=0.01),
                          workers=2, runtime="process", checkpoint=ckpt, interval=0.2, name=NAME,
                          margin=margin)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 2)
    victim = sorted(pids.iterdir())[0]
    os.kill(int(victim.name.split("-")[0]), signal.SIGKILL)
    job.result(timeout=180)
    assert job.failures == 1
    assert committed_rows(tmp_path / "out") == expected
    assert job.stats
    # the sources stand still at most from ``hold`` until the capture
    assert all(0.0 <= s.stalled <= s.paused for s in job.stats), \
        [(s.stalled, s.paused) for s in job.stats]


def test_a_negative_margin_is_refused(tmp_path: Path, table) -> None:
    with pytest.raises(ValueError, match="margin"):
        CheckpointedJob(wordcount(table, str(tmp_path / "out")), checkpoint=tmp_path / "c",
                        margin=-1)
