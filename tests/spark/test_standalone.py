"""Workers joining and leaving a job on a Spark standalone cluster (a master and a worker
started from the PySpark package's own ``spark-class`` on this machine), not only on
``local[N]``: each joining worker is a barrier stage of its own next to the running one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

HERE = Path(__file__).resolve().parent
SPARK_CLASS = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master with one worker of 4 cores."""
    if shutil.which("java") is None:
        pytest.fail("java is needed for Spark (CI installs openjdk-17-jre-headless)")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_HOME": str(SPARK_CLASS.parent.parent), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_WORKER_DIR": str(tmp_path / "work"), "PYSPARK_PYTHON": sys.executable}
    logs = [open(tmp_path / name, "w") for name in ("master.log", "worker.log")]  # noqa: SIM115
    procs = [subprocess.Popen([str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port), "--webui-port",
                               str(free_port())], env=env, stdout=logs[0], stderr=subprocess.STDOUT)]
    try:
        deadline = time.monotonic() + 60
        while "I have been elected leader" not in (tmp_path / "master.log").read_text():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("the Spark master did not start:\n"
                                   + (tmp_path / "master.log").read_text()[-2000:])
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url, "--cores", "4",
             "--memory", "2g", "--host", "127.0.0.1", "--webui-port", str(free_port())],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT))
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text():
            if time.monotonic() > deadline or procs[1].poll() is not None:
                raise RuntimeError("the Spark worker did not register:\n"
                                   + (tmp_path / "worker.log").read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()


def test_scale_out_and_in_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, str(HERE / "standalone_scale.py"), cluster],
                          capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines and lines[-1] == "OK", \
        done.stdout[-3000:] + done.stderr[-3000:]
    assert "rosters [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]" in done.stdout
