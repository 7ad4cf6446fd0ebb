"""The command line of exactly-once recovery: ``tokenflow run --checkpoint``, ``resume``,
``checkpoints`` and ``stop`` (``tokenflow.cli`` over ``tokenflow.recovery``).

The driver-kill test is a real fault: the ``tokenflow run`` process is SIGKILLed (its worker
processes die with it) after two checkpoints committed, and ``tokenflow resume`` finishes the
job; the committed Parquet output equals a failure-free run's, epoch by epoch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from recovery_jobs import committed_rows, wordcount, words_table
from typer.testing import CliRunner

from tokenflow import execute
from tokenflow.cli import app, parse_interval
from tokenflow.io import read_committed
from tokenflow.state.snapshot import committed_epochs

TESTS = str(Path(__file__).resolve().parent)

JOB = """
import sys

sys.path.insert(0, {tests!r})
from recovery_jobs import wordcount, words_table

job = wordcount(words_table(), {out!r}, pace={pace})
"""

SUMMARY = re.compile(r"checkpoints: last committed epoch (\d+|-), (\d+) taken, (\d+) restarts, "
                     r"median checkpoint pause [\d.]+ ms")


def all_rows(path: Path) -> list[tuple[Any, ...]]:
    """Every committed row of the dataset at ``path``, its columns in name order, sorted."""
    table = read_committed(str(path))
    return sorted(zip(*(table.column(c).to_pylist() for c in sorted(table.column_names)),
                      strict=True))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Any, ...]]:
    """The committed rows of a failure-free run (threads, no checkpoints)."""
    out = tmp_path_factory.mktemp("whole") / "out"
    execute(wordcount(words_table(), str(out)), workers=2)
    rows = committed_rows(out)
    assert len(rows) == words_table().num_rows
    return rows


def job_file(tmp_path: Path, pace: float) -> tuple[Path, Path]:
    """A job module writing to ``tmp_path/out``; returns its path and the output's."""
    out = tmp_path / "out"
    path = tmp_path / "ckpt_job.py"
    path.write_text(JOB.format(tests=TESTS, out=str(out), pace=pace))
    return path, out


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def listed_epochs(stdout: str) -> list[int]:
    """The epochs in the first column of the ``checkpoints`` table."""
    return [int(m) for m in re.findall(r"^│\s+(\d+) │", stdout, re.M)]


# -- run to completion, list ---------------------------------------------------------------------


def test_run_with_checkpoints_then_list_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             expected: list[tuple[Any, ...]]) -> None:
    path, out = job_file(tmp_path, pace=0.01)
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("run", "ckpt_job.py:job", "--runtime", "process", "--workers", "2",
                                  "--checkpoint", "ckpt", "--checkpoint-interval", "200ms", "-q")
    assert code == 0, stderr
    ckpt = tmp_path / "ckpt"
    definition = json.loads((ckpt / "JOB.json").read_text())
    assert definition == {"target": f"{path}:job", "cwd": str(tmp_path), "workers": 2,
                          "runtime": "process", "master": None, "name": "ckpt_job.py:job",
                          "interval": 0.2, "bins": definition["bins"]}
    epochs = committed_epochs(ckpt)
    assert epochs, "no checkpoint was taken"
    match = SUMMARY.search(stdout)
    assert match is not None, stdout
    assert match.group(1) == str(epochs[-1]) and int(match.group(2)) >= len(epochs)
    assert match.group(3) == "0"
    assert committed_rows(out) == expected

    code, stdout, stderr = invoke("checkpoints", "ckpt")
    assert code == 0, stderr
    assert listed_epochs(stdout) == epochs
    assert stdout.count("│ ok ") == len(epochs), stdout

    # A fresh run over a directory with checkpoints is refused: resume it instead.
    code, _, stderr = invoke("run", "ckpt_job.py:job", "-r", "process", "--checkpoint", "ckpt", "-q")
    assert code == 2 and "tokenflow resume" in stderr
    assert json.loads((ckpt / "JOB.json").read_text()) == definition  # left as it was


def test_checkpoints_names_a_corrupt_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenflow.recovery import CheckpointedJob

    out = tmp_path / "out"
    CheckpointedJob(wordcount(words_table(), str(out), pace=0.01), workers=2, runtime="thread",
                    checkpoint=tmp_path / "ckpt", interval=0.1).run()
    epochs = committed_epochs(tmp_path / "ckpt")
    assert epochs
    bins = tmp_path / "ckpt" / f"snapshot-{epochs[-1]:020d}" / "worker-00001.bins"
    data = bytearray(bins.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bins.write_bytes(bytes(data))
    monkeypatch.setenv("COLUMNS", "200")
    code, stdout, _ = invoke("checkpoints", str(tmp_path / "ckpt"))
    assert code == 0
    assert listed_epochs(stdout) == epochs
    assert re.search(rf"│\s+{epochs[-1]} │.*corrupt: worker-00001\.bins", stdout), stdout


# -- the driver dies: resume ---------------------------------------------------------------------


def test_driver_killed_then_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    expected: list[tuple[Any, ...]]) -> None:
    """SIGKILL of the ``tokenflow run --checkpoint`` driver (2 workers) after two checkpoints;
    ``tokenflow resume --workers 3`` finishes the job from the latest one.  (Resuming at the
    same worker count: ``test_stop_file_stops_a_checkpointed_run_and_resume_finishes``.)"""
    workers = 3
    path, out = job_file(tmp_path, pace=0.03)
    ckpt = tmp_path / "ckpt"
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tokenflow.cli", "run", f"{path.name}:job", "--runtime", "process",
             "--workers", "2", "--checkpoint", str(ckpt), "--checkpoint-interval", "200ms", "-q"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(committed_epochs(ckpt)) >= 2 or driver.poll() is not None)
        assert driver.poll() is None, "the job ended before the kill: " + \
            (tmp_path / "driver.log").read_text()
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # the workers die with the driver anyway
        except ProcessLookupError:
            pass
        driver.wait(30)
    assert driver.returncode == -signal.SIGKILL
    partial = committed_rows(out) if out.exists() else []
    assert len(partial) < len(expected), "the kill came too late to prove anything"

    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("resume", str(ckpt), "--workers", str(workers), "-q")
    assert code == 0, stderr + stdout
    assert committed_rows(out) == expected
    records = re.search(rf"process, {workers} workers: [\d.]+ s wall, ([\d,]+) records in", stdout)
    assert records is not None, stdout
    assert int(records.group(1).replace(",", "")) < len(expected)  # started from a checkpoint
    assert SUMMARY.search(stdout) is not None, stdout
    assert json.loads((ckpt / "JOB.json").read_text())["workers"] == workers


# -- stop ------------------------------------------------------------------------------------------


def test_stop_file_stops_a_checkpointed_run_and_resume_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expected: list[tuple[Any, ...]]) -> None:
    _, out = job_file(tmp_path, pace=0.03)
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "ckpt"

    # What `tokenflow stop DIR` does (checked below), from another thread once a checkpoint
    # committed: CliRunner swaps sys.stdout, so two commands cannot run at once in-process.
    asker = threading.Thread(target=lambda: (wait_for(lambda: len(committed_epochs(ckpt)) >= 1),
                                             (ckpt / ".stop-request").touch()))
    asker.start()
    code, stdout, stderr = invoke("run", "ckpt_job.py:job", "-w", "2", "--checkpoint", "ckpt",
                                  "--checkpoint-interval", "100ms", "-q")
    asker.join()
    assert code == 0, stderr
    stopped = re.search(r"stopped at the checkpoint of epoch (\d+) in (\S+); continue with: "
                        r"tokenflow resume (\S+)", stdout)
    assert stopped is not None, stdout
    assert int(stopped.group(1)) == committed_epochs(ckpt)[-1]
    assert not (ckpt / ".stop-request").exists()
    assert len(committed_rows(out)) < len(expected)
    code, stdout, stderr = invoke("resume", "ckpt", "-q")
    assert code == 0, stderr
    assert committed_rows(out) == expected


def test_the_stop_request_file_is_shared() -> None:
    from tokenflow import cli, recovery

    assert cli.STOP_REQUEST == recovery.STOP_REQUEST == ".stop-request"


def test_stop_command_writes_the_request(tmp_path: Path) -> None:
    code, stdout, _ = invoke("stop", str(tmp_path))
    assert code == 0 and (tmp_path / ".stop-request").exists()
    code, _, stderr = invoke("stop", str(tmp_path / "missing"))
    assert code == 2 and "--checkpoint" in stderr


# -- bad usage -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("1s", 1.0), ("500ms", 0.5), ("2.5", 2.5), ("1m", 60.0),
                                               (" 0.25s ", 0.25), (".5", 0.5)])
def test_parse_interval(text: str, seconds: float) -> None:
    assert parse_interval(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "0", "0ms", "-1s", "1h", "1 s s", ""])
def test_bad_interval_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    job_file(tmp_path, pace=0.0)
    monkeypatch.chdir(tmp_path)
    code, out, stderr = invoke("run", "ckpt_job.py:job", "--checkpoint", "ckpt",
                               f"--checkpoint-interval={text}")
    assert code == 2
    assert "error: bad --checkpoint-interval" in stderr and "500ms" in stderr
    assert out == "" and not (tmp_path / "ckpt").exists()


def test_checkpoint_options_that_do_not_combine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_file(tmp_path, pace=0.0)
    monkeypatch.chdir(tmp_path)
    code, _, stderr = invoke("run", "ckpt_job.py:job", "--checkpoint-interval", "1s")
    assert code == 2 and "--checkpoint-interval needs --checkpoint" in stderr
    code, _, stderr = invoke("run", "ckpt_job.py:job", "--checkpoint", "a", "--snapshot-dir", "b")
    assert code == 2 and "tokenflow resume" in stderr


def test_resume_without_a_definition_exits_2(tmp_path: Path) -> None:
    code, out, stderr = invoke("resume", str(tmp_path))
    assert code == 2
    assert "JOB.json: no job definition" in stderr and "--checkpoint" in stderr
    assert out == ""
    (tmp_path / "JOB.json").write_text('{"target": "x:y", "workers": 0}')
    code, _, stderr = invoke("resume", str(tmp_path))
    assert code == 2 and "bad 'workers'" in stderr


def test_checkpoints_of_an_empty_or_missing_directory(tmp_path: Path) -> None:
    code, stdout, _ = invoke("checkpoints", str(tmp_path))
    assert code == 0 and "no committed checkpoint" in stdout
    code, _, stderr = invoke("checkpoints", str(tmp_path / "missing"))
    assert code == 2 and "no checkpoint directory" in stderr


def test_nexmark_query_stopped_at_a_checkpoint_and_resumed(tmp_path: Path) -> None:
    """``nexmark query --checkpoint DIR``: a stop request ends the run at a checkpoint, and
    ``--resume`` finishes it; the committed output equals a run without checkpoints."""
    from tokenflow.nexmark.run import run_query
    from tokenflow.recovery import STOP_REQUEST

    whole, out, ckpt = tmp_path / "whole", tmp_path / "out", tmp_path / "ckpt"
    run_query("q5", 1_000_000, workers=2, output=whole)
    common = ["nexmark", "query", "--query", "q5", "--events", "1000000", "--workers", "2",
              "--output", str(out), "--checkpoint", str(ckpt), "--checkpoint-interval", "50ms",
              "--quiet"]

    def ask_to_stop() -> None:
        while not committed_epochs(ckpt):
            time.sleep(0.005)
        (ckpt / STOP_REQUEST).touch()

    threading.Thread(target=ask_to_stop, daemon=True).start()
    code, stdout, _ = invoke(*common)
    assert code == 0 and "checkpoints:" in stdout
    stopped_at = committed_epochs(ckpt)[-1]
    assert len(read_committed(str(out))) < len(read_committed(str(whole)))  # it did stop early
    code, stdout, stderr = invoke(*common)
    assert code == 2 and "resume" in stderr  # a fresh run over a used directory
    code, stdout, _ = invoke(*common, "--resume")
    assert code == 0, stdout
    assert committed_epochs(ckpt)[-1] >= stopped_at

    assert all_rows(out) == all_rows(whole)


@pytest.mark.parametrize("command", [
    ["nexmark", "query", "--query", "q4", "--events", "300000"],
    ["flights"],
], ids=["nexmark", "flights"])
def test_built_in_jobs_take_checkpoints_on_the_process_runtime(tmp_path: Path,
                                                               command: list[str]) -> None:
    """``nexmark query`` and ``flights`` with ``--checkpoint`` on ``process``: the workers
    report to the command's coordinator, and the checkpoints' commands reach them through
    it (they went to another coordinator before, and no checkpoint was ever taken)."""
    ckpt = tmp_path / "ckpt"
    code, stdout, stderr = invoke(*command, "--runtime", "process", "--workers", "2",
                                  "--output", str(tmp_path / "out"), "--checkpoint", str(ckpt),
                                  "--checkpoint-interval", "100ms", "--quiet")
    assert code == 0, stdout + stderr
    taken = re.search(r"checkpoints: (\d+) in ", stdout)
    assert taken is not None and int(taken.group(1)) > 0, stdout
    assert committed_epochs(ckpt)


def test_start_refuses_report_to_without_its_coordinator() -> None:
    """Workers take commands from the coordinator they report to: ``report_to`` alone on
    ``process`` would leave the handle's commands unanswered, so ``start`` refuses it."""
    from tokenflow.coordinator import Coordinator
    from tokenflow.job import start

    display = Coordinator(host="127.0.0.1")
    try:
        with pytest.raises(ValueError, match="without coordinator="):
            start(lambda worker: None, 2, "process", report_to=display.endpoint)
    finally:
        display.close()


def test_nexmark_query_with_checkpoints_follows_a_rescale_schedule(tmp_path: Path) -> None:
    """``nexmark query --checkpoint DIR --rescale-schedule``: the migrating state moves
    between checkpoints and the committed output equals a run that never rescaled;
    ``--elastic`` (live ``tokenflow scale`` requests) is still refused with checkpoints."""
    from tokenflow.nexmark.run import run_query

    whole, out, ckpt = tmp_path / "whole", tmp_path / "out", tmp_path / "ckpt"
    run_query("q5", 1_000_000, workers=3, output=whole)
    common = ["nexmark", "query", "--query", "q5", "--events", "1000000", "--workers", "3",
              "--checkpoint", str(ckpt), "--checkpoint-interval", "100ms", "--quiet"]
    code, stdout, stderr = invoke(*common, "--output", str(out),
                                  "--rescale-schedule", "0.3s:2,0.8s:3")
    assert code == 0, stdout + stderr
    taken = re.search(r"checkpoints: (\d+) in ", stdout)
    assert taken is not None and int(taken.group(1)) > 0, stdout
    assert re.search(r"migration 1 at time \d+: workers \[0, 1, 2\] -> \[0, 1\]", stdout), stdout

    assert all_rows(out) == all_rows(whole)
    code, _, stderr = invoke(*common, "--output", str(tmp_path / "other"), "--elastic")
    assert code == 2 and "--elastic and --max-workers cannot be combined with --checkpoint" \
        in stderr
