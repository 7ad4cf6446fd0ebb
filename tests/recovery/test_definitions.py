"""Checkpoint directories: the job definition, the choice of checkpoint to restore, and the
arguments ``CheckpointedJob`` refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from recovery_jobs import NAME, wordcount, words_table

from tokenflow.job import start
from tokenflow.recovery import (
    CheckpointedJob,
    RecoveryError,
    latest_usable,
    read_definition,
    write_definition,
)
from tokenflow.state.snapshot import SnapshotError


def test_definition_round_trip_and_errors(tmp_path: Path) -> None:
    definition = {"target": "mod:fn", "workers": 2, "runtime": "process"}
    write_definition(str(tmp_path), definition)
    assert read_definition(str(tmp_path)) == definition
    with pytest.raises(RecoveryError, match="no job definition"):
        read_definition(str(tmp_path / "elsewhere"))
    (tmp_path / "JOB.json").write_text("[1, 2]")
    with pytest.raises(RecoveryError, match="not a JSON object"):
        read_definition(str(tmp_path))
    (tmp_path / "JOB.json").write_text("{oops")
    with pytest.raises(RecoveryError, match="unreadable"):
        read_definition(str(tmp_path))


def test_another_jobs_checkpoint_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    table = words_table(epochs=20, rows=2000)
    handle = start(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2, name=NAME)
    handle.snapshot(str(tmp_path / "ckpt"))
    handle.result(timeout=60)
    assert latest_usable(str(tmp_path / "ckpt"), NAME) is not None
    skipped: list[int] = []
    with pytest.raises(SnapshotError, match="other.job"):
        latest_usable(str(tmp_path / "ckpt"), "other.job", on_fallback=lambda e, why: skipped.append(e))
    assert skipped == []
    with pytest.raises(ValueError, match="resume"):
        CheckpointedJob(wordcount(table, str(tmp_path / "out")), checkpoint=tmp_path / "ckpt", name=NAME)
    assert latest_usable(str(tmp_path / "empty"), NAME) is None


@pytest.mark.parametrize(("options", "message"), [({"interval": 0}, "interval"),
                                                  ({"keep": 1}, "keep"),
                                                  ({"restarts": -1}, "restarts")])
def test_bad_arguments(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointedJob(lambda worker: None, checkpoint=tmp_path, **options)


def test_restarts_are_bounded(tmp_path: Path) -> None:
    """A job that fails every time fails for good after ``restarts`` recoveries."""
    def job(worker):
        raise RuntimeError("always")

    failing = CheckpointedJob(job, workers=1, runtime="thread", checkpoint=tmp_path, restarts=2,
                              interval=0.05)
    with pytest.raises(Exception, match="always"):
        failing.run()
    assert failing.failures == 2
