"""Liveness of the ``process`` and ``spark`` runtimes (docs/ARCHITECTURE.md, "Execution model").

* A SIGSTOPped worker sends no heartbeats: the job fails within seconds naming it as stalled,
  and the job's other workers are gone afterwards.
* ``timeout=S`` ends a job that never ends.
* A worker process dies with its driver: SIGKILL or SIGTERM to a driver script, or SIGINT to
  the ``tokenflow`` command, leaves no worker running.
* On Spark, a worker that dies or raises is named with its Python error, never a Java stack
  trace; a ``local[n]`` master with too few slots is refused at once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tokenflow.execute import JobTimeoutError, WorkerError, execute
from tokenflow.worker import Worker

pytestmark = pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, never reaped by a container's init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # pragma: no cover - no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after up to ``seconds`` s."""
    end = time.monotonic() + seconds
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def read_pids(directory: Path, workers: int, seconds: float = 60.0) -> list[int]:
    end = time.monotonic() + seconds
    while True:
        files = [directory / str(i) for i in range(workers)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        assert time.monotonic() < end, f"the workers did not start: {sorted(os.listdir(directory))}"
        time.sleep(0.1)


def stalling_job(pid_dir: str, stop_at: int | None = 10) -> Callable[[Worker], Any]:
    """Each worker writes its pid to ``pid_dir/<index>`` and feeds epochs forever through an
    exchange; worker 1 SIGSTOPs itself at epoch ``stop_at`` (after writing the time to
    ``pid_dir/stopped``), so the others wait for it forever."""

    def job(worker: Worker) -> None:
        Path(pid_dir, str(worker.index)).write_text(str(os.getpid()))

        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            return inp, stream.exchange(lambda x: x).probe()

        inp, probe = worker.dataflow(build)
        epoch = 0
        while True:
            if worker.index == 1 and epoch == stop_at:
                Path(pid_dir, "stopped").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGSTOP)
            inp.send_batch([epoch])
            inp.advance_to(epoch + 1)
            worker.step_while(lambda e=epoch + 1: probe.less_than(e))
            epoch += 1
            time.sleep(0.01)

    return job


STALLED = re.compile(r"^worker 1 stalled: no heartbeat for (\d+\.\d) s")


def check_stall(info: pytest.ExceptionInfo[WorkerError], pid_dir: Path, workers: int) -> None:
    """Worker 1 is named as stalled within 10 s of its stop, and every worker is gone soon."""
    named = time.time()
    assert info.value.worker == 1, str(info.value)
    match = STALLED.match(str(info.value))
    assert match is not None, str(info.value)
    assert 3.0 <= float(match.group(1)) < 10.0
    assert named - float((pid_dir / "stopped").read_text()) < 10.0
    pids = read_pids(pid_dir, workers, seconds=0)
    assert wait_gone(pids, 10.0) == []


def test_sigstopped_worker_is_named_and_the_others_end(tmp_path: Path) -> None:
    with pytest.raises(WorkerError) as info:
        execute(stalling_job(str(tmp_path)), workers=3, runtime="process", heartbeat_timeout=3,
                timeout=120)
    check_stall(info, tmp_path, 3)


def never_ending() -> Callable[[Worker], None]:
    """A worker function that never returns (a closure: pickled by value, so Spark's workers,
    which cannot import this module, run it too)."""

    def run(worker: Worker) -> None:
        while True:
            worker.step()
            time.sleep(0.01)

    return run


def test_process_timeout_ends_a_never_ending_job() -> None:
    start = time.monotonic()
    with pytest.raises(JobTimeoutError, match=r"timed out after 1 s") as info:
        execute(never_ending(), workers=2, runtime="process", timeout=1)
    assert isinstance(info.value, TimeoutError) and info.value.worker == -1
    assert time.monotonic() - start < 6  # 1 s, plus spawning and ending two processes


# -- orphans -------------------------------------------------------------------------------------

DRIVER = textwrap.dedent('''
    """A driver whose job never ends; each worker writes its pid to $PID_DIR/<index>."""
    import os
    import time
    from pathlib import Path

    from tokenflow.execute import execute


    def job(worker):
        Path(os.environ["PID_DIR"], str(worker.index)).write_text(str(os.getpid()))
        while True:
            worker.step()
            time.sleep(0.01)


    if __name__ == "__main__":
        execute(job, workers=2, runtime="process")
''')


@pytest.mark.parametrize(("how", "sig"), [("script", signal.SIGKILL), ("script", signal.SIGTERM),
                                          ("cli", signal.SIGINT)])
def test_workers_end_with_their_driver(tmp_path: Path, how: str, sig: signal.Signals) -> None:
    """SIGKILL and SIGTERM to a script calling ``execute``, SIGINT to ``tokenflow run``: no
    worker survives 10 s; SIGTERM exits 1 with a message, SIGINT 130."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    command = [sys.executable, str(script)] if how == "script" else \
        [sys.executable, "-m", "tokenflow.cli", "run", f"{script}:job", "-w", "2", "-r", "process", "-q"]
    log = tmp_path / "driver.err"
    with log.open("w") as stderr:
        driver = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PID_DIR": str(pid_dir)},
                                  stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        pids = read_pids(pid_dir, 2)
        driver.send_signal(sig)
        driver.wait(timeout=10)
        left = wait_gone(pids, 10.0)
    finally:
        driver.kill()
        driver.wait()
        for pid in read_pids(pid_dir, 2, seconds=0):  # do not leave orphans behind on failure
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert left == [], "workers outlived their driver"
    err = log.read_text()
    if sig == signal.SIGKILL:
        assert driver.returncode == -signal.SIGKILL
    elif sig == signal.SIGTERM:
        assert driver.returncode == 1, err
        assert "the driver got SIGTERM: terminated the job's 2 worker processes" in err
    else:
        assert driver.returncode == 130, err
        assert "error: interrupted" in err


# -- spark ---------------------------------------------------------------------------------------


@pytest.mark.spark
def test_spark_sigstopped_worker_is_named_and_the_others_end(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(WorkerError) as info:
        execute(stalling_job(str(tmp_path)), workers=3, runtime="spark", spark=spark,
                heartbeat_timeout=3, timeout=120)
    check_stall(info, tmp_path, 3)


def dying_job(how: str) -> Callable[[Worker], Any]:
    """Worker 1 raises or exits its process; the others step until the job fails."""

    def job(worker: Worker) -> int:
        if worker.index == 1:
            time.sleep(0.3)
            if how == "raise":
                raise ValueError("boom in worker 1")
            os._exit(1)
        while True:
            worker.step()
            time.sleep(0.01)

    return job


@pytest.mark.spark
@pytest.mark.parametrize(("how", "reason"), [
    ("raise", "ValueError: boom in worker 1"),
    ("exit", "Python worker exited unexpectedly (crashed)"),
])
def test_spark_worker_failure_names_it_without_java_frames(spark: Any, how: str, reason: str) -> None:
    with pytest.raises(WorkerError) as info:
        execute(dying_job(how), workers=2, runtime="spark", spark=spark, timeout=120)
    error = info.value
    assert error.worker == 1
    assert str(error).startswith(f"worker 1 failed: {reason}"), str(error)
    chain = [error, error.__cause__, None if error.__suppress_context__ else error.__context__]
    assert not any("at org.apache" in str(e) for e in chain if e is not None)


def test_stage_error_takes_the_worker_and_the_last_python_line() -> None:
    """The text of a barrier stage that failed on a Python exception raised outside the
    worker code (Spark 4's format): worker from ``ResultTask(stage, partition)``, reason from
    the traceback's last line, no Java frames."""
    from tokenflow.spark.runtime import stage_error

    text = ("An error occurred while calling o76.collectToPython.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover "
            "from a failed barrier ResultStage. Most recent failure reason: Stage failed because "
            "barrier task ResultTask(3, 2) finished unsuccessfully.\n"
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "/x/runtime.py", line 70, in task\n    gathered = ctx.allGather(x)\n'
            "             ^^^^^^^^^^^^^^^^\n"
            "OSError: [Errno 98] Address already in use\n\n"
            "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
            "(PythonRunner.scala:600)\n\tat scala.Option.getOrElse(Option.scala:201)\n")
    error = stage_error(text)
    assert getattr(error, "worker", None) == 2
    assert str(error) == "worker 2 failed: OSError: [Errno 98] Address already in use"


@pytest.mark.spark
def test_spark_timeout_and_too_few_slots(spark: Any) -> None:
    start = time.monotonic()
    with pytest.raises(JobTimeoutError, match="timed out after 1 s"):
        execute(never_ending(), workers=2, runtime="spark", spark=spark, timeout=1)
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match=r"5 workers need 5 task slots .*local\[4\] has 4"):
        execute(lambda w: None, workers=5, runtime="spark", spark=spark)
