"""Checkpoints of a running job capture only the bins its ``KeyedState`` changed since the last
committed checkpoint (``tokenflow.state.changes``), and the output is still exactly-once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from recovery_jobs import NAME, committed_rows, wordcount, words_table

from tokenflow import execute
from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import Snapshot


@pytest.fixture(scope="module")
def table():
    return words_table(epochs=60, rows=12_000)


@pytest.fixture(scope="module")
def expected(table, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    execute(wordcount(table, str(out)), workers=2, name=NAME)
    return committed_rows(out)


def keyed_bins(root: Path) -> int:
    """Bins of the word counts (the ``state_machine``'s ``KeyedState``) in the latest
    checkpoint, over both workers."""
    snapshot = Snapshot.open(root)
    keyed = [s for s in snapshot.states() if s.endswith("/keys")]
    assert keyed, snapshot.states()
    return sum(len(snapshot.entries(w, snapshot.routing).get(k, {}))
               for w in snapshot.workers for k in keyed)


def test_checkpoints_capture_only_the_changed_bins(tmp_path: Path, table, expected) -> None:
    ckpt = tmp_path / "ckpt"
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                          runtime="thread", checkpoint=ckpt, interval=0.05, name=NAME)
    job.run()
    assert committed_rows(tmp_path / "out") == expected
    assert len(job.stats) >= 3, "too few checkpoints: the test proves nothing"
    held = keyed_bins(ckpt)
    assert held > 50
    # after the first, a checkpoint exports the bins whose words came since the last one
    # (plus the sink's worker-local states, which do not track: one bin each), not all of
    # them: the rare words' bins are referenced in earlier files
    later = [s.bins_exported for s in job.stats[1:]]
    assert min(later) < held, (later, held)
    assert all(s.bytes_reused > 0 for s in job.stats[1:])


def test_a_resumed_job_captures_only_what_changed_since_the_restore(tmp_path: Path, table,
                                                                    expected) -> None:
    ckpt = tmp_path / "ckpt"
    first = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.02), workers=2,
                            runtime="process", checkpoint=ckpt, interval=0.1, name=NAME)
    first.start()
    deadline = time.monotonic() + 120
    while len(first.stats) < 2 and first.running and time.monotonic() < deadline:
        time.sleep(0.02)
    first.stop()
    first.result(timeout=120)
    held = keyed_bins(ckpt)
    resumed = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.02), workers=2,
                              runtime="process", checkpoint=ckpt, interval=0.1, name=NAME,
                              restore=True)
    resumed.run()
    assert committed_rows(tmp_path / "out") == expected
    assert resumed.stats, "no checkpoint after the restore: the test proves nothing"
    assert resumed.stats[0].bytes_reused > 0
    assert resumed.stats[0].bins_exported < held, (resumed.stats[0].bins_exported, held)
