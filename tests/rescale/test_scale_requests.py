"""``tokenflow scale``'s path into a running job, without a job: a ``ScaleCoordinator`` takes
token-authenticated scale requests (msgpack, never pickle), refuses malformed ones and
connections without the token, and a ``ScaleDriver`` answers each with the outcome of the
``JobHandle.rescale`` it made (here a stub that records the calls)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tokenflow.coordinator import Reporter
from tokenflow.rescale.remote import (
    ScaleCoordinator,
    ScaleDriver,
    control_file,
    read_control_file,
    request_scale,
)

pytestmark = pytest.mark.timeout(60)


class StubHandle:
    """Records ``rescale`` calls; refuses rosters above ``workers`` like ``JobHandle``."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.calls: list[tuple[int, str]] = []
        self.done = threading.Event()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def rescale(self, roster: int, strategy: str = "batched") -> int:
        if roster > self.workers:
            raise ValueError(f"roster {list(range(roster))} is not within the job's "
                             f"{self.workers} workers")
        self.calls.append((roster, strategy))
        return 10 * roster


def test_requests_reach_the_driver_and_get_its_answer() -> None:
    coordinator = ScaleCoordinator()
    handle = StubHandle(4)
    driver = ScaleDriver(handle, [(0.05, 3)], "batched", coordinator).start()
    try:
        answer = request_scale(coordinator.endpoint, 2, "fluid", timeout=10)
        assert answer == {"kind": "scaled", "workers": 2, "steps": 20}
        refused = request_scale(coordinator.endpoint, 9, timeout=10)
        assert refused["kind"] == "scale_failed" and "not within" in refused["error"]
        deadline = time.monotonic() + 5
        while len(handle.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        handle.done.set()
        driver.stop()
        coordinator.close()
    assert sorted(handle.calls) == [(2, "fluid"), (3, "batched")]
    assert sorted((e.source, e.workers) for e in driver.events) == \
        [("request", 2), ("request", 9), ("schedule", 3)]
    # a scale request does not take the place of a worker's control link
    assert coordinator.connected() == []


def test_wrong_token_and_malformed_requests_are_refused() -> None:
    coordinator = ScaleCoordinator()
    try:
        host, port, _ = coordinator.endpoint
        with pytest.raises(ConnectionError):
            request_scale((host, port, "not-the-token"), 2, timeout=5)
        client = Reporter(coordinator.endpoint)
        assert client.sock is not None
        for bad in ({"kind": "scale", "workers": 0}, {"kind": "scale", "workers": "2"},
                    {"kind": "scale", "workers": 2, "strategy": "sideways"}):
            client.send(bad)
        deadline = time.monotonic() + 5
        while coordinator.refused < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        client.close()
        assert coordinator.refused >= 4  # the wrong token, then the three bad requests
        assert coordinator.requests.empty()
    finally:
        coordinator.close()


def test_control_file_is_private_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "control.json"
    with control_file(path, ("127.0.0.1", 4242, "secret"), "job-a", 3):
        assert path.stat().st_mode & 0o777 == 0o600
        data = read_control_file(path)
        assert (data["host"], data["port"], data["token"], data["workers"]) == \
            ("127.0.0.1", 4242, "secret", 3)
    assert not path.exists()
    path.write_text(json.dumps({"host": "x"}))
    with pytest.raises(ValueError):
        read_control_file(path)


def test_answers_after_the_job_ended() -> None:
    coordinator = ScaleCoordinator()
    handle = StubHandle(2)
    handle.done.set()
    driver = ScaleDriver(handle, (), "batched", coordinator)
    try:
        result: dict[str, Any] = {}
        asker = threading.Thread(target=lambda: result.update(
            request_scale(coordinator.endpoint, 1, timeout=10)))
        asker.start()
        deadline = time.monotonic() + 5
        while coordinator.requests.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        driver.start()
        asker.join(10)
        assert result == {"kind": "scale_failed", "error": "the job has ended"}
    finally:
        driver.stop()
        coordinator.close()
