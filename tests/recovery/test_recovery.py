"""Exactly-once recovery (``tokenflow.recovery``): a job that fails restarts from its latest
checkpoint and its committed output equals a failure-free run's, epoch by epoch."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from recovery_jobs import NAME, committed_rows, wait_for, wordcount

from tokenflow import execute, recovery
from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import committed_epochs, snapshot_dir


def test_a_worker_that_raises_is_recovered_on_threads(tmp_path: Path, table, expected) -> None:
    fail = tmp_path / "fail"
    fail.touch()
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.002, fail=str(fail)),
                          workers=2, runtime="thread", checkpoint=tmp_path / "ckpt",
                          interval=0.05, name=NAME)
    job.run()
    assert not fail.exists(), "the failure was not injected: the test proves nothing"
    assert job.failures == 1
    assert [e.kind for e in job.events].count("restart") == 1
    assert committed_rows(tmp_path / "out") == expected


def test_sigkill_of_a_worker_process_is_recovered(tmp_path: Path, table, expected,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Also: every attempt asks for checkpoints only once all its workers have started (one
    asked for during their start-up waited for it and counted it as its pause)."""
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
                          workers=2, runtime="process", checkpoint=ckpt, interval=0.05, name=NAME)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 2)
    before = len(started)
    victim = sorted(pids.iterdir())[1]
    os.kill(int(victim.name.split("-")[0]), signal.SIGKILL)
    job.result(timeout=180)
    assert job.failures == 1
    assert len(list(pids.iterdir())) == 4  # two attempts of two workers
    assert committed_rows(tmp_path / "out") == expected
    assert len(started) > before + 1  # the restarted attempt checkpointed too
    assert all(started), started


@pytest.mark.parametrize("point", ["snapshot.part", "parquet.commit"])
def test_sigkill_at_a_crash_point_is_recovered(tmp_path: Path, table, expected, point: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process SIGKILLs itself in the middle of writing its checkpoint part, or in
    the middle of committing an epoch of the sink (``tokenflow.faults``)."""
    trigger = tmp_path / "trigger"
    trigger.touch()
    monkeypatch.setenv("TOKENFLOW_CRASH", f"{point}={trigger}")
    ckpt = tmp_path / "ckpt"
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                          runtime="process", checkpoint=ckpt, interval=0.2, name=NAME)
    job.run()
    assert not trigger.exists(), f"no process reached {point}: the test proves nothing"
    assert job.failures == 1
    assert committed_rows(tmp_path / "out") == expected


def corrupt(directory: Path, how: str) -> str:
    """Damage the checkpoint in ``directory``; returns the name the fallback must mention."""
    bins = sorted(directory.glob("worker-*.bins"))[0]
    if how == "truncate":
        bins.write_bytes(bins.read_bytes()[: bins.stat().st_size // 2])
    elif how == "flip":
        data = bytearray(bins.read_bytes())
        data[len(data) // 3] ^= 0x5A
        bins.write_bytes(bytes(data))
    elif how == "index":
        (directory / bins.name.replace(".bins", ".json")).unlink()
        return bins.name.replace(".bins", ".json")
    elif how == "manifest":
        (directory / "MANIFEST.json").unlink()
        return ""
    return bins.name


@pytest.mark.parametrize("how", ["truncate", "flip", "index", "manifest"])
def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, table, expected,
                                                             how: str) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = CheckpointedJob(wordcount(table, str(out), pace=0.01), workers=2, runtime="thread",
                          checkpoint=ckpt, interval=0.05, name=NAME)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 2)
    job.stop()
    job.result(timeout=120)
    epochs = committed_epochs(ckpt)
    assert len(epochs) == 2  # the previous one and the stop's
    name = corrupt(Path(snapshot_dir(ckpt, epochs[-1])), how)
    resumed = CheckpointedJob(wordcount(table, str(out)), workers=2, runtime="thread",
                              checkpoint=ckpt, interval=0.05, name=NAME, restore=True)
    resumed.run()
    restore = [e for e in resumed.events if e.kind == "restore"]
    assert restore[0].epoch == epochs[0]
    if name:
        fallback = [e for e in resumed.events if e.kind == "fallback"]
        assert fallback[0].epoch == epochs[-1] and name in fallback[0].detail
    assert committed_rows(out) == expected


def test_a_crash_while_committing_an_epoch_staged_before_the_checkpoint(
        tmp_path: Path, table, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink commits bins of 4 epochs, so a checkpoint holds staged, uncommitted files; the
    committer is SIGKILLed in the middle of committing one of them (armed only once a
    checkpoint exists).  The restarted committer still finds the staged files and commits
    them: nothing is lost (a commit that moved them into its unfinished directory lost
    them)."""
    whole = tmp_path / "whole"
    execute(wordcount(table, str(whole), granularity=4), workers=2, name=NAME)
    trigger, ckpt = tmp_path / "trigger", tmp_path / "ckpt"
    monkeypatch.setenv("TOKENFLOW_CRASH", f"parquet.commit={trigger}")
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01, granularity=4),
                          workers=2, runtime="process", checkpoint=ckpt, interval=0.1, name=NAME)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 1)
    trigger.touch()
    job.result(timeout=180)
    assert not trigger.exists(), "the committer was not killed: the test proves nothing"
    assert job.failures == 1
    assert committed_rows(tmp_path / "out") == committed_rows(whole)


def test_the_first_checkpoint_after_a_restore_is_incremental(tmp_path: Path, table) -> None:
    """A restarted worker builds its first part on the restored checkpoint's blobs (same
    routing table), so it writes only the bins that changed since."""
    ckpt = tmp_path / "ckpt"
    first = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                            runtime="thread", checkpoint=ckpt, interval=0.05, name=NAME)
    first.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 1)
    first.stop()
    first.result(timeout=120)
    resumed = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                              runtime="thread", checkpoint=ckpt, interval=0.05, name=NAME,
                              restore=True)
    resumed.run()
    assert resumed.stats, "no checkpoint after the restore: the test proves nothing"
    assert resumed.stats[0].bytes_reused > 0
