"""Exactly-once recovery of the directory source (``tokenflow.io.directory``) under real
faults: files dropped into a directory while a checkpointed job (``CheckpointedJob``) reads
them with ``directory_source`` and commits them with ``to_parquet``; a worker fails after a
checkpoint, once epochs after it are committed by the sink.  The restarted job must put every
file taken after the checkpoint back into the epoch it had (the input log), or the rows of a
file whose epoch was committed before the failure would be committed again in a new epoch."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenflow.execute import WorkerError
from tokenflow.io import read_committed, to_parquet
from tokenflow.io.directory import directory_source
from tokenflow.io.parquet import ManifestError
from tokenflow.io.parquet import committed_epochs as sink_epochs
from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import committed_epochs as checkpoints

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the process runtime spawns

ROWS = 100
NAME = "tests.io.directory_recovery"
FREEZE = 0.5
"""Seconds a worker is held (its thread paused, or its process SIGSTOPped) before the failure:
a checkpoint in flight commits meanwhile, none can start, so what is exposed after it is what
the restart sees."""


def drop(directory: Path, i: int) -> None:
    """File ``i``: rows ``id`` in ``[i * ROWS, (i + 1) * ROWS)``, written under a hidden name
    and renamed into place."""
    table = pa.table({"id": list(range(i * ROWS, (i + 1) * ROWS)), "file": [i] * ROWS})
    hidden = directory / f".part-{i:04d}.tmp"
    pq.write_table(table, hidden)
    os.replace(hidden, directory / f"part-{i:04d}.parquet")


def exposed(ckpt: str, out: str) -> tuple[int | None, list[int]]:
    """The latest committed checkpoint's epoch and the sink's committed epochs at or after
    it: epochs a restart from that checkpoint replays although they are already committed."""
    kept = checkpoints(ckpt)
    if not kept:
        return None, []
    try:
        committed = sink_epochs(out)
    except ManifestError:
        return kept[-1], []
    return kept[-1], [e for e in committed if e >= kept[-1]]


def directory_job(inbox: str, out: str, pids: str | None = None, fail: str | None = None,
                  ckpt: str | None = None) -> Callable[[Any], None]:
    """Read ``inbox`` with ``directory_source`` (epochs: poll rounds), commit to ``out``.
    ``pids``: each worker process touches ``<pid>-<worker>`` there.  ``fail``: while that file
    exists, the first worker to see a batch once the latest checkpoint under ``ckpt`` has sink
    epochs at or after it removes the file, records what was exposed in ``<fail>.json`` and
    raises (after checking again following a pause of its thread, during which no checkpoint
    can capture it: one already captured is committed by then, and no other can be)."""

    def job(worker: Any) -> None:
        if pids is not None:
            Path(pids, f"{os.getpid()}-{worker.index}").touch()

        def check(t: Any, batch: Any) -> None:
            if fail is None or ckpt is None or not os.path.exists(fail):
                return
            if not exposed(ckpt, out)[1]:
                return
            time.sleep(FREEZE)
            epoch, epochs = exposed(ckpt, out)
            if not epochs:
                return  # a checkpoint committed meanwhile: later
            try:
                os.remove(fail)
            except FileNotFoundError:
                return  # another worker raised
            Path(f"{fail}.json").write_text(json.dumps({"checkpoint": epoch, "epochs": epochs}))
            raise RuntimeError(f"injected failure at epoch {t}, after checkpoint {epoch} and "
                               f"committed epochs {epochs}")

        def build(scope: Any) -> None:
            rows, _ = directory_source(scope, "inbox", inbox, poll=0.05)
            # always there: a resumed job must have the same operators (the sink's state is
            # found by operator path)
            rows = rows.inspect_batch(check)
            to_parquet(rows, out, name="Committed")

        worker.dataflow(build)

    return job


class Writer:
    """Drops a file every ``pace`` s from a thread; once ``done`` is set, drops ``after`` more
    and then the end marker (so the failure always happens before the input ends)."""

    def __init__(self, inbox: Path, pace: float = 0.08, after: int = 10, limit: float = 120) -> None:
        self.inbox, self.pace, self.after, self.limit = inbox, pace, after, limit
        self.done = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit
        remaining = self.after
        while remaining > 0 and time.monotonic() < deadline:
            drop(self.inbox, self.count)
            self.count += 1
            if self.done.is_set():
                remaining -= 1
            time.sleep(self.pace)
        (self.inbox / "_END").touch()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def check_exactly_once(out: Path, files: int) -> None:
    data = read_committed(str(out))
    ids = data.column("id").to_pylist()
    assert len(ids) == files * ROWS, f"{len(ids) - files * ROWS:+d} rows"
    assert sorted(ids) == list(range(files * ROWS))  # every row, none twice
    per_file: dict[int, set[Any]] = {}
    for f, t in zip(data.column("file").to_pylist(), data.column("time").to_pylist(), strict=True):
        per_file.setdefault(f, set()).add(t)
    assert all(len(times) == 1 for times in per_file.values())  # a file in one epoch


def wait_for(condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


# Generous: a checkpoint that starts while the job ends can keep it alive for another 60-120 s
# (a worker that finished no longer answers; the driver waits for it, the other worker waits
# for the driver: tokenflow.control), rarely, but often enough to fail a tighter bound.
RESULT_TIMEOUT = 280


def restored_epoch(job: CheckpointedJob) -> int | None:
    restores = [e for e in job.events if e.kind == "restore"]
    return restores[-1].epoch if restores else None


def test_a_worker_that_raises_after_a_checkpoint_is_recovered_on_threads(tmp_path: Path) -> None:
    inbox, out, ckpt, fail = tmp_path / "inbox", tmp_path / "out", tmp_path / "ckpt", tmp_path / "fail"
    inbox.mkdir()
    fail.touch()
    job = CheckpointedJob(directory_job(str(inbox), str(out), fail=str(fail), ckpt=str(ckpt)),
                          workers=2, runtime="thread", checkpoint=ckpt, interval=0.2, name=NAME)
    with Writer(inbox) as writer:
        job.start()
        wait_for(lambda: not fail.exists())
    job.result(timeout=RESULT_TIMEOUT)
    assert job.failures == 1
    exposure = json.loads(Path(f"{fail}.json").read_text())
    # the restart replays epochs the sink had committed before the failure
    assert restored_epoch(job) is not None and restored_epoch(job) <= max(exposure["epochs"])
    check_exactly_once(out, writer.count)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failed_job_resumed_at_another_worker_count_replays_the_logged_epochs(
        tmp_path: Path, workers: int) -> None:
    """The 2-worker job fails for good (no restarts); resumed at 1 or 3 workers, each logged
    file goes to its owner under the new count, at its logged epoch."""
    inbox, out, ckpt, fail = tmp_path / "inbox", tmp_path / "out", tmp_path / "ckpt", tmp_path / "fail"
    inbox.mkdir()
    fail.touch()
    with Writer(inbox) as writer:
        first = CheckpointedJob(directory_job(str(inbox), str(out), fail=str(fail), ckpt=str(ckpt)),
                                workers=2, runtime="thread", checkpoint=ckpt, interval=0.2,
                                name=NAME, restarts=0)
        first.start()
        with pytest.raises(WorkerError, match="injected failure"):
            first.result(timeout=RESULT_TIMEOUT)
    exposure = json.loads(Path(f"{fail}.json").read_text())
    resumed = CheckpointedJob(directory_job(str(inbox), str(out)), workers=workers,
                              runtime="thread", checkpoint=ckpt, interval=0.2, name=NAME,
                              restore=True)
    resumed.run()
    assert restored_epoch(resumed) is not None
    assert restored_epoch(resumed) <= max(exposure["epochs"])
    check_exactly_once(out, writer.count)


def test_sigkill_of_a_worker_process_after_a_checkpoint_is_recovered(tmp_path: Path) -> None:
    inbox, out, ckpt, pids = tmp_path / "inbox", tmp_path / "out", tmp_path / "ckpt", tmp_path / "pids"
    inbox.mkdir()
    pids.mkdir()
    job = CheckpointedJob(directory_job(str(inbox), str(out), pids=str(pids)), workers=2,
                          runtime="process", checkpoint=ckpt, interval=0.2, name=NAME)
    began = time.monotonic()

    def trace(what: str) -> None:
        print(f"{time.monotonic() - began:7.3f} s: {what}")

    with Writer(inbox) as writer:
        job.start()
        victim = int(wait_for(lambda: sorted(p.name for p in pids.iterdir() if p.name.endswith("-1")))
                     [0].split("-")[0])
        trace(f"worker 1 is process {victim}")
        while True:
            wait_for(lambda: exposed(str(ckpt), str(out))[1])
            # Freeze the job: with a worker stopped no checkpoint and no sink epoch can commit
            # (after those in flight), so what is exposed now is what the restart sees.
            os.kill(victim, signal.SIGSTOP)
            time.sleep(FREEZE)
            checkpoint, epochs = exposed(str(ckpt), str(out))
            if epochs:
                os.kill(victim, signal.SIGKILL)
                trace(f"killed after checkpoint {checkpoint} and committed epochs {epochs}")
                break
            os.kill(victim, signal.SIGCONT)
            trace("a checkpoint committed meanwhile: go on")
    trace(f"{writer.count} files written")
    job.result(timeout=RESULT_TIMEOUT)
    trace(f"job ended: {[(e.kind, e.epoch) for e in job.events if e.kind != 'checkpoint']}")
    assert job.failures == 1
    assert len(list(pids.iterdir())) == 4  # two attempts of two workers
    restored = restored_epoch(job)  # committed epochs >= it were replayed:
    assert restored is not None and restored <= max(epochs), (restored, checkpoint, epochs)
    check_exactly_once(out, writer.count)
