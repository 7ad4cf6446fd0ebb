"""How the process runtime starts its workers (``tokenflow.process.start_context``): forked by a
forkserver that imported the worker's modules once, yet each worker sees the driver's
environment, ``sys.path`` and working directory as of the ``execute`` call, as a freshly spawned
interpreter would — crash points (``TOKENFLOW_CRASH``) and user settings travel that way."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tokenflow import execute


def seen_by_worker(worker: Any) -> dict[str, Any]:
    worker.step()  # after its first step a worker has frozen what it started with
    return {"env": os.environ.get("TOKENFLOW_TEST_SETTING"), "cwd": os.getcwd(),
            "path": list(sys.path), "ppid": os.getppid(), "frozen": gc.get_freeze_count()}


def test_workers_see_the_drivers_environment_as_of_each_call(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    execute(seen_by_worker, workers=1, runtime="process")  # the forkserver runs from here on
    monkeypatch.setenv("TOKENFLOW_TEST_SETTING", "first")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    first = execute(seen_by_worker, workers=2, runtime="process")
    monkeypatch.setenv("TOKENFLOW_TEST_SETTING", "second")
    second = execute(seen_by_worker, workers=2, runtime="process")
    assert [w["env"] for w in first] == ["first", "first"]
    assert [w["env"] for w in second] == ["second", "second"]
    for w in first + second:
        assert w["cwd"] == str(tmp_path)
        assert w["path"][0] == str(tmp_path / "lib")
        assert w["ppid"] != os.getpid()  # forked by the server, not by this driver
        assert w["frozen"] > 10_000  # the modules' objects are out of the collector's way


def test_a_job_defined_in_the_driver_script_runs(tmp_path: Path) -> None:
    """A user's script calling ``execute`` under ``if __name__ == "__main__"`` with a function
    of its own (the worker re-imports the script as ``__mp_main__``, as with ``spawn``)."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(
        "from tokenflow import execute\n"
        "def job(worker):\n"
        "    return worker.index * 10\n"
        "if __name__ == '__main__':\n"
        "    print(execute(job, workers=2, runtime='process'))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[0, 10]"
