"""The ``tokenflow`` command: runs a job module on the thread and process runtimes, reports the
records total and per-worker results, exits 1 naming a failed worker and 2 on a bad target.
(The spark runtime is covered by the Spark tests.)"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tokenflow import __version__
from tokenflow.cli import app, least_frontier, progress_table, worker_error_line
from tokenflow.execute import WorkerError

EPOCHS = 6
PER_EPOCH = 250

JOB = textwrap.dedent(f'''
    """A test job: each worker sends {EPOCHS} epochs of {PER_EPOCH} distinct numbers, exchanged
    by value; each returns how many records it received."""

    EPOCHS = {EPOCHS}
    PER_EPOCH = {PER_EPOCH}


    def job(worker):
        def build(scope):
            inp, stream = scope.new_input()
            out = stream.exchange(lambda x: x)
            return inp, out.probe(), out.capture()

        inp, probe, cap = worker.dataflow(build)
        for epoch in range(EPOCHS):
            start = (worker.index * EPOCHS + epoch) * PER_EPOCH
            inp.send_batch(list(range(start, start + PER_EPOCH)))
            inp.advance_to(epoch + 1)
            worker.step_while(lambda: probe.less_than(epoch + 1))
        inp.close()
        return len(cap.records())


    def failing(worker):
        """Worker 1 raises after its first epoch; the others wait on a probe that cannot pass."""
        def build(scope):
            inp, stream = scope.new_input()
            return inp, stream.exchange(lambda x: x).probe()

        inp, probe = worker.dataflow(build)
        for epoch in range(EPOCHS):
            if worker.index == 1 and epoch == 1:
                raise ValueError("boom in the job")
            inp.send_batch([worker.index])
            inp.advance_to(epoch + 1)
            worker.step_while(lambda: probe.less_than(epoch + 1))
        inp.close()


    NOT_A_FUNCTION = 3
''')

SUMMARY = re.compile(r"(\w+), (\d+) workers: [\d.]+ s wall, ([\d,]+) records in, [\d,]+ records/s")


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``cli_test_job.py`` in a temporary directory, which is also the current directory."""
    path = tmp_path / "cli_test_job.py"
    path.write_text(JOB)
    monkeypatch.chdir(tmp_path)
    return path


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def check_success(stdout: str, runtime: str, workers: int) -> None:
    """The summary names the runtime and workers, totals every record sent, and the per-worker
    results (records received) add up to the same total."""
    match = SUMMARY.search(stdout)
    assert match is not None, stdout
    assert match.group(1) == runtime and int(match.group(2)) == workers
    total = workers * EPOCHS * PER_EPOCH
    assert int(match.group(3).replace(",", "")) == total
    received = {int(i): int(n) for i, n in re.findall(r"^worker (\d+): (\d+)$", stdout, re.M)}
    assert sorted(received) == list(range(workers))
    assert sum(received.values()) == total


# -- running jobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 3])
def test_thread_runtime_dotted_module(job_file: Path, workers: int) -> None:
    code, out, err = invoke("run", "cli_test_job:job", "--workers", str(workers), "--runtime", "thread")
    assert code == 0, err
    check_success(out, "thread", workers)
    # Not a terminal: the live table prints its last frame, every worker done.
    rows = re.findall(r"│\s+(\d+) │.*│\s+(\S+)\s+│$", err, re.M)
    assert rows == [(str(i), "yes") for i in range(workers)]


def test_quiet_has_no_table(job_file: Path) -> None:
    code, out, err = invoke("run", str(job_file) + ":job", "-w", "2", "--quiet")
    assert code == 0, err
    check_success(out, "thread", 2)
    assert "records in" not in err and "┃" not in err


def test_process_runtime_file_path(job_file: Path) -> None:
    """A module given by path is pickled by value: the worker processes never import it."""
    code, out, err = invoke("run", str(job_file) + ":job", "--workers", "2", "--runtime", "process", "-q")
    assert code == 0, err
    check_success(out, "process", 2)


def test_console_script_process_runtime(job_file: Path) -> None:
    """The real entry point in a fresh interpreter, importing the module from the current dir."""
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli", "run", "cli_test_job:job",
                           "-w", "2", "-r", "process", "-q"],
                          cwd=job_file.parent, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    check_success(proc.stdout, "process", 2)


# -- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_failing_job_exits_1_naming_the_worker(job_file: Path, runtime: str) -> None:
    code, out, err = invoke("run", "cli_test_job:failing", "-w", "3", "-r", runtime, "-q")
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: worker 1 failed: ValueError: boom in the job"]
    assert "Traceback" not in err and "records in" not in out


@pytest.mark.parametrize(("target", "message"), [
    ("cli_test_job", "expected MODULE:FUNCTION, got 'cli_test_job'"),
    ("cli_test_job:", "expected MODULE:FUNCTION"),
    ("no_such_module_xyz:job", "no module named 'no_such_module_xyz'"),
    ("cli_test_job:nope", "module 'cli_test_job' has no attribute 'nope'"),
    ("cli_test_job:NOT_A_FUNCTION", "cli_test_job:NOT_A_FUNCTION is not callable"),
    ("missing/job.py:job", "no such file: 'missing/job.py'"),
])
def test_bad_target_exits_2(job_file: Path, target: str, message: str) -> None:
    code, out, err = invoke("run", target)
    assert code == 2
    assert f"error: bad MODULE:FUNCTION: {message}" in err
    assert out == ""


def test_module_raising_on_import_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_job.py").write_text("import no_such_dependency_xyz\ndef job(w): pass\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("run", "broken_job:job")
    assert code == 2
    assert "cannot import 'broken_job': ModuleNotFoundError" in err
    assert "no_such_dependency_xyz" in err


def test_master_needs_spark(job_file: Path) -> None:
    code, _, err = invoke("run", "cli_test_job:job", "--master", "local[2]")
    assert code == 2 and "--master applies to --runtime spark only" in err


def test_unknown_runtime_exits_2(job_file: Path) -> None:
    code, _, _ = invoke("run", "cli_test_job:job", "--runtime", "gpu")
    assert code == 2


def test_version() -> None:
    code, out, _ = invoke("--version")
    assert code == 0 and out.strip() == f"tokenflow {__version__}"


# -- display helpers -------------------------------------------------------------------------------


def test_least_frontier() -> None:
    assert least_frontier({}) == "-"
    assert least_frontier({"Dataflow0": {"1:Map": [], "2:Probe": []}}) == "-"
    assert least_frontier({"Dataflow0": {"1:Map": ["12"], "2:Probe": ["9"]},
                           "Dataflow1": {"1:Count": ["10"]}}) == "9"
    assert least_frontier({"D": {"1:X": ["(1, 2)"]}}) == "(1, 2)"


def test_progress_table_rows() -> None:
    snapshot = {0: {"steps": 1200, "elapsed": 2.0, "records_in": 5000,
                    "frontiers": {"D": {"1:A": ["7"], "2:B": ["4"]}}, "done": False},
                2: {"steps": 3, "elapsed": 0.5, "records_in": 0, "frontiers": {}, "done": True}}
    buffer = io.StringIO()
    Console(file=buffer, width=120).print(progress_table(snapshot, 3, "title"))
    rows = [[c.strip() for c in line.split("│")[1:-1]]
            for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert rows == [["0", "1,200", "5,000", "2,500", "4", "no"],
                    ["1", "-", "-", "-", "-", "waiting"],
                    ["2", "3", "0", "0", "-", "yes"]]


def test_worker_error_line_drops_repeated_prefix() -> None:
    inner = RuntimeError("worker 2 failed: KeyError: 'x'\nTraceback ...")
    wrapped = WorkerError(2, inner)
    wrapped.__cause__ = inner
    assert worker_error_line(wrapped) == "worker 2 failed: KeyError: 'x'"
    plain = WorkerError(0, ValueError("bad\nsecond line"))
    assert worker_error_line(plain) == "worker 0 failed: ValueError: bad"


# -- snapshot, stop and restore -----------------------------------------------------------------

WORDCOUNT = textwrap.dedent('''
    """A running word count over a replayable table source, written with to_parquet to OUT
    (a path relative to the current directory); slowed down so that a stop lands mid-run."""
    import os
    import time

    import numpy as np
    import pyarrow as pa

    from tokenflow.dataflow.operators.stateful import state_machine
    from tokenflow.io import to_parquet
    from tokenflow.io.sources import replayable_source, table_splits

    rng = np.random.default_rng(1)
    TABLE = pa.table({"t": np.sort(rng.integers(0, 60, 6_000)),
                      "word": np.array([f"w{i}" for i in range(50)])[rng.integers(0, 50, 6_000)]})


    def slow(batch):
        time.sleep(0.02)
        return [(w, 1) for w in batch.column("word").to_pylist()]


    def job(worker):
        out = os.path.abspath(os.environ["WORDCOUNT_OUT"])

        def build(scope):
            words, _ = replayable_source(scope, "words", table_splits(TABLE, 4, time="t"),
                                         time="t", max_rows=100)
            counts = state_machine(words.map_batch(slow),
                                   lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            to_parquet(counts, out, columns=["word", "count"], granularity=5)

        worker.dataflow(build)
''')


def test_snapshot_stop_and_restore_at_another_worker_count(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --snapshot-dir --stop-after`` stops mid-run with a snapshot; ``run --restore`` at
    3 workers finishes; the committed dataset equals an uninterrupted run's."""
    from tokenflow.io import read_committed

    (tmp_path / "wc_job.py").write_text(WORDCOUNT)
    monkeypatch.chdir(tmp_path)

    def rows(path: str) -> list[tuple[object, ...]]:
        data = read_committed(path)
        return sorted(zip(*(data.column(c).to_pylist() for c in ("time", "word", "count")),
                          strict=True))

    monkeypatch.setenv("WORDCOUNT_OUT", "whole")
    code, _, _ = invoke("run", "wc_job.py:job", "--workers", "2", "--runtime", "process", "-q")
    assert code == 0
    monkeypatch.setenv("WORDCOUNT_OUT", "cut")
    code, stdout, _ = invoke("run", "wc_job.py:job", "--workers", "2", "--runtime", "process", "-q",
                             "--snapshot-dir", "snaps", "--stop-after", "1.5")
    assert code == 0, stdout
    epoch = int(re.search(r"snapshot of epoch (\d+) in snaps", stdout).group(1))  # type: ignore[union-attr]
    assert 0 <= epoch < 60
    code, stdout, _ = invoke("snapshots", "snaps")
    assert code == 0 and re.search(rf"\b{epoch}\b.*wc_job.py:job", stdout), stdout
    code, stdout, _ = invoke("run", "wc_job.py:job", "--workers", "3", "--runtime", "process", "-q",
                             "--restore", "snaps")
    assert code == 0, stdout
    assert rows("cut") == rows("whole")
    code, _, stderr = invoke("run", "wc_job.py:job", "--workers", "2", "-q", "--restore", "snaps",
                             "--name", "another")
    assert code == 1 and "another" in stderr and "MANIFEST.json" in stderr


def test_stop_asks_the_job_through_its_snapshot_directory(tmp_path: Path) -> None:
    code, _, stderr = invoke("stop", str(tmp_path / "missing"))
    assert code == 2 and "no snapshot directory" in stderr
    code, _, _ = invoke("stop", str(tmp_path))
    assert code == 0 and (tmp_path / ".stop-request").exists()


# -- timeout, capacity warning -------------------------------------------------------------------

FOREVER = textwrap.dedent('''
    import time


    def job(worker):
        while True:
            worker.step()
            time.sleep(0.01)
''')


def test_timeout_fails_a_never_ending_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    (tmp_path / "forever_job.py").write_text(FOREVER)
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    code, out, err = invoke("run", "forever_job:job", "-w", "2", "--timeout", "1", "-q")
    assert code == 1
    assert err.strip() == "error: job timed out after 1 s"
    assert time.monotonic() - start < 5


def test_more_workers_than_cores_prints_one_warning(job_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setattr(importlib.import_module("tokenflow.execute"), "available_cores", lambda: 1)
    code, out, err = invoke("run", "cli_test_job:job", "-w", "2", "-r", "process", "-q")
    assert code == 0, err
    check_success(out, "process", 2)
    assert err.count("warning: 2 workers on 1 core: expect contention") == 1, err
    assert "ContentionWarning" not in err
