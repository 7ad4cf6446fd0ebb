"""``tokenflow subscribe`` against a publishing job: epochs written as Parquet equal what the
job sent; a wrong token exits 1 naming the refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tokenflow import execute
from tokenflow.pubsub import Catalog

sys.path.insert(0, str(Path(__file__).parent / "pubsub"))
from test_pubsub import EPOCHS, expected, rows  # noqa: E402


def job_waiting_for_a_subscriber(worker: Any) -> None:
    """Publishes ``rows`` once a subscriber is connected to this worker's partition (the CLI
    process may start slowly on a busy machine)."""
    def build(scope: Any) -> Any:
        inp, stream = scope.new_input()
        return inp, stream.publish("rows", linger=10.0)

    inp, publisher = worker.dataflow(build)
    deadline = time.monotonic() + 120
    while not publisher.log.subscribers and time.monotonic() < deadline:
        worker.step_or_park(0.01)
    for e in range(EPOCHS):
        for r in rows(worker.index, e):
            inp.send(r)
        inp.advance_to(e + 1)
        worker.step()
    inp.close()


def subscribe_cli(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenflow", "subscribe", url, "rows", *args],
                          env={**os.environ, "TOKENFLOW_TOKEN": token}, capture_output=True,
                          text=True, timeout=120)


def test_subscribe_writes_whole_epochs_as_parquet(tmp_path: Path) -> None:
    with Catalog() as catalog:
        job = threading.Thread(target=execute, args=(job_waiting_for_a_subscriber,),
                               kwargs={"workers": 2, "runtime": "thread", "catalog": catalog.endpoint})
        job.start()
        done = subscribe_cli(catalog.url, catalog.token, "--start", "earliest", "--output",
                             str(tmp_path / "out"))
        job.join(60)
    assert done.returncode == 0, done.stdout + done.stderr
    got = {}
    for part in (tmp_path / "out").glob("epoch=*/part-0.parquet"):
        table = pq.read_table(part).to_pydict()
        got[int(part.parent.name.split("=")[1])] = Counter(zip(table["w"], table["e"], table["i"],
                                                               strict=True))
    assert got == expected(2)
    assert f"{len(got)} epochs" in done.stdout


def test_subscribe_with_a_wrong_token_fails_clearly() -> None:
    with Catalog() as catalog:
        done = subscribe_cli(catalog.url, "wrong", "--timeout", "2")
    assert done.returncode == 1
    assert "refused" in done.stderr + done.stdout
