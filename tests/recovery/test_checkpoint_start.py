"""The checkpoint interval of an attempt begins once every worker has started: a checkpoint
asked for while worker processes still start waits for them, and its ``paused`` counted the
start-up (1.3 s on a slow VM for a job whose checkpoints then paused it ~0.2 s)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from recovery_jobs import NAME, committed_rows, wait_for, wordcount

from tokenflow import recovery
from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import committed_epochs


def test_every_attempt_checkpoints_only_once_its_workers_have_started(
        tmp_path: Path, table: Any, expected: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[bool] = []  # per take_snapshot call: had every worker started?
    take_snapshot = recovery.take_snapshot

    def recording(hub: Any, workers: list[int], *args: Any, **kwargs: Any) -> Any:
        started.append(set(workers) <= hub.started())
        return take_snapshot(hub, workers, *args, **kwargs)

    monkeypatch.setattr(recovery, "take_snapshot", recording)
    pids = tmp_path / "pids"
    pids.mkdir()
    ckpt = tmp_path / "ckpt"
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pids=str(pids), pace=0.03),
                          workers=2, runtime="process", checkpoint=ckpt, interval=0.02, name=NAME)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 2)
    before = len(started)
    os.kill(int(sorted(pids.iterdir())[0].name.split("-")[0]), signal.SIGKILL)
    job.result(timeout=180)
    assert job.failures == 1
    assert committed_rows(tmp_path / "out") == expected
    assert len(started) > before + 1  # the restarted attempt checkpointed too
    assert all(started), started
