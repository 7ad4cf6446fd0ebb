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
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pids=str(pids), pace=0.03),
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


def test_manifests_are_committed_and_pruned_on_a_lower_priority_thread(
        tmp_path: Path, table, expected, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's bookkeeping after the workers' parts are written (commit the manifest,
    prune old checkpoints) runs on a thread ``COMMIT_NICE`` below the driver's priority, so
    that it does not take CPU from the workers' next epochs; the job's output is unchanged."""
    import threading

    import tokenflow.control as control
    import tokenflow.recovery as recovery

    seen: list[tuple[str, int]] = []

    def where() -> None:
        seen.append((threading.current_thread().name,
                     os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    commit, prune = control.commit_snapshot, recovery.prune
    monkeypatch.setattr(control, "commit_snapshot", lambda *a, **k: (where(), commit(*a, **k))[1])
    monkeypatch.setattr(recovery, "prune", lambda *a, **k: (where(), prune(*a, **k))[1])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                          runtime="thread", checkpoint=tmp_path / "ckpt", interval=0.1, name=NAME)
    job.run()
    assert committed_rows(tmp_path / "out") == expected
    assert len(seen) >= 4, seen  # at least two checkpoints: a commit and a prune each
    expected_nice = min(base + recovery.COMMIT_NICE, 19)
    assert all(name.startswith("tokenflow-commit") and nice == expected_nice
               for name, nice in seen), seen
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the driver's own thread is unchanged
