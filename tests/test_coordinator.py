"""The driver's coordinator under hostile or careless clients (docs/ARCHITECTURE.md,
"Security": the coordinator faces the network).

* 1,000 slow connections cost no thread each and at most ``MAX_PENDING`` descriptors, and a
  real worker's reports still arrive; a hello has one deadline, however slowly it trickles in.
* Out of descriptors (``EMFILE``), the accepting thread backs off and goes on.
* A report with a malformed field is refused with its reason logged, the connection goes on,
  and the CLI's table renders; a frame that is not msgpack is refused naming why.
* Refusals are logged rate-limited, with a count.
* Heartbeats and ``Liveness``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from rich.console import Console

from tokenflow.cli import progress_table
from tokenflow.coordinator import MAX_PENDING, Coordinator, Liveness, Reporter

VALID = {"worker": 0, "steps": 3, "elapsed": 1.5, "records_in": 30,
         "frontiers": {"D": {"1:A": ["4"]}}, "done": False}


def frame(obj: Any) -> bytes:
    data = msgpack.packb(obj)
    return struct.pack("!I", len(data)) + data


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class FakeWorker:
    """What ``Reporter`` reads from a worker."""

    index = 0
    steps = 7
    metrics = {"records_in": 70}
    dataflows_running = 1

    def frontiers(self) -> dict[str, dict[str, list[Any]]]:
        return {"D": {"1:A": [5]}}


def authenticated(coordinator: Coordinator) -> socket.socket:
    sock = socket.create_connection(coordinator.address, timeout=5)
    sock.sendall(frame({"token": coordinator.token}))
    return sock


# -- slow and silent connections -----------------------------------------------------------------

FLOOD = textwrap.dedent("""
    import socket, sys
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    held = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=20)
        s.sendall(b"\\x00\\x00")  # half a length prefix, then nothing
        held.append(s)
    print("open", flush=True)
    sys.stdin.readline()
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_thousand_slow_connections_cost_bounded_threads_and_fds() -> None:
    coordinator = Coordinator()
    try:
        threads, fds = threading.active_count(), open_fds()
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, *map(str, coordinator.address), "1000"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "open\n"
            # every connection was accepted; all but MAX_PENDING were dropped for newer ones
            assert wait_until(lambda: coordinator.refused >= 1000 - MAX_PENDING, 10), coordinator.refused
            assert threading.active_count() - threads <= 0
            assert open_fds() - fds <= MAX_PENDING + 4  # + the pipes to the flood process
            reporter = Reporter(coordinator.endpoint)
            reporter(FakeWorker(), force=True)
            assert wait_until(lambda: 0 in coordinator.reports, 5), "a real worker was shut out"
            assert coordinator.reports[0]["records_in"] == 70
            reporter.close()
        finally:
            flood.kill()
            flood.wait()
    finally:
        coordinator.close()


def test_the_hello_has_one_deadline() -> None:
    """A hello trickling in a byte every 0.2 s is cut off at the deadline (1 s here), not
    kept alive by each byte."""
    coordinator = Coordinator(hello_timeout=1.0)
    try:
        sock = socket.create_connection(coordinator.address, timeout=5)
        start = time.monotonic()
        hello = frame({"token": "x" * 64})
        closed = None
        for byte in hello:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = time.monotonic() - start
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1) == b"":
                    closed = time.monotonic() - start
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = time.monotonic() - start
                break
        sock.close()
        assert closed is not None and 0.9 <= closed < 2.5, closed
        assert coordinator.refused == 1
    finally:
        coordinator.close()


EMFILE = textwrap.dedent("""
    import json, logging, os, resource, sys, time
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from tokenflow.coordinator import Coordinator, Reporter

    class W:
        index, steps, metrics, dataflows_running = 0, 1, {"records_in": 1}, 0
        def frontiers(self):
            return {}

    coordinator = Coordinator()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
    print(json.dumps(coordinator.address), flush=True)
    sys.stdin.readline()  # the test opened many connections, held them, closed them
    reporter = Reporter(coordinator.endpoint)
    reporter(W(), force=True)
    end = time.monotonic() + 5
    while 0 not in coordinator.reports and time.monotonic() < end:
        time.sleep(0.05)
    print(json.dumps({"accepting": coordinator._thread.is_alive(),
                      "report": 0 in coordinator.reports}), flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE and /proc")
def test_accepting_survives_running_out_of_descriptors() -> None:
    """With a handful of descriptors left, 40 connections exhaust them (EMFILE): the
    coordinator logs it with a count, backs off, and a worker connecting later is served."""
    proc = subprocess.Popen([sys.executable, "-c", EMFILE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        host, port = json.loads(proc.stdout.readline())
        held = [socket.create_connection((host, port), timeout=5) for _ in range(40)]
        time.sleep(0.5)
        for sock in held:
            sock.close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(out) == {"accepting": True, "report": True}, err
    assert "cannot accept connections: EMFILE" in err, err


# -- malformed messages --------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("steps", "many", "'steps' must be an integer >= 0, got 'many'"),
    ("records_in", True, "'records_in' must be an integer >= 0, got True"),
    ("elapsed", -1.0, "'elapsed' must be a finite number >= 0, got -1.0"),
    ("elapsed", math.nan, "'elapsed' must be a finite number >= 0, got nan"),
    ("done", "yes", "'done' must be a boolean, got 'yes'"),
    ("frontiers", {"D": {"1:A": [4]}}, "'frontiers'['D']['1:A'] must be a list of strings"),
    ("frontiers", [1], "'frontiers' must be a map, got [1]"),
    ("worker", -1, "'worker' must be an integer in [0, 1048576), got -1"),
])
def test_a_malformed_report_is_refused_and_the_table_renders(
        caplog: pytest.LogCaptureFixture, field: str, value: Any, reason: str) -> None:
    coordinator = Coordinator()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            sock = authenticated(coordinator)
            sock.sendall(frame({**VALID, field: value}))
            sock.sendall(frame({**VALID, "worker": 1}))  # the connection goes on
            assert wait_until(lambda: 1 in coordinator.reports, 5)
            sock.close()
        assert 0 not in coordinator.reports
        assert coordinator.refused == 1
        assert reason in caplog.text
        buffer = io.StringIO()
        Console(file=buffer, width=120).print(progress_table(coordinator.snapshot(), 2, "t"))
        assert "waiting" in buffer.getvalue() and "1,500" not in buffer.getvalue()
    finally:
        coordinator.close()


def test_the_table_renders_a_bad_report_row() -> None:
    """Whatever reaches the snapshot, the live table's thread keeps rendering."""
    snapshot = {0: {"steps": "many", "elapsed": "x", "records_in": None, "frontiers": 3},
                1: {**VALID, "worker": 1}}
    buffer = io.StringIO()
    Console(file=buffer, width=120).print(progress_table(snapshot, 2, "t"))
    rows = [[c.strip() for c in line.split("│")[1:-1]]
            for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert rows == [["0", "?", "?", "?", "?", "bad report"], ["1", "3", "30", "20", "4", "no"]]


@pytest.mark.parametrize(("payload", "reason"), [
    (b"\xc1", "frame of 1 bytes is not valid msgpack: FormatError"),
    (msgpack.packb([1, 2]), "frame is a msgpack list, not a map"),
    (msgpack.packb({1: 2}), "not valid msgpack: ValueError: int is not allowed for map key"),
])
def test_a_frame_that_is_not_a_msgpack_map_is_refused_naming_why(
        caplog: pytest.LogCaptureFixture, payload: bytes, reason: str) -> None:
    coordinator = Coordinator()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            sock = authenticated(coordinator)
            sock.sendall(struct.pack("!I", len(payload)) + payload)
            assert sock.recv(1) == b""  # closed by the coordinator
            sock.close()
            assert wait_until(lambda: coordinator.refused == 1, 5)
        assert reason in caplog.text
    finally:
        coordinator.close()


def test_refusals_are_logged_rate_limited_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = Coordinator()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            for _ in range(30):
                sock = socket.create_connection(coordinator.address, timeout=5)
                sock.sendall(frame({"token": "wrong"}))
                sock.recv(1)
                sock.close()
            assert wait_until(lambda: coordinator.refused == 30, 5)
        lines = [r.getMessage() for r in caplog.records if r.name == "tokenflow.coordinator"]
        assert len(lines) == 1 and "bad token" in lines[0], lines
    finally:
        coordinator.close()


# -- heartbeats ----------------------------------------------------------------------------------


def test_heartbeats_reach_the_coordinator_and_end_done() -> None:
    coordinator = Coordinator()
    try:
        reporter = Reporter(coordinator.endpoint)
        reporter.start_heartbeat(3, "job-a", interval=0.05)
        assert wait_until(lambda: 3 in coordinator.heartbeats("job-a"), 5)
        first = coordinator.heartbeats("job-a")[3][0]
        assert wait_until(lambda: coordinator.heartbeats("job-a")[3][0] > first, 5)
        assert coordinator.heartbeats("job-b") == {} and coordinator.inbox.empty()
        reporter.close()
        assert wait_until(lambda: coordinator.heartbeats("job-a")[3][1], 5)  # done
        assert Coordinator.find(("elsewhere", coordinator.address[1], coordinator.token)) is coordinator
    finally:
        coordinator.close()
    assert Coordinator.find(coordinator.endpoint) is None


def test_liveness() -> None:
    live = Liveness(3, timeout=10.0, startup_grace=30.0)
    assert live.stalled(now=100.0) is None  # nobody heard from yet: not judged
    live.beat(0, at=100.0)
    live.beat(1, at=100.0)
    assert live.stalled(now=109.0) is None
    assert live.stalled(now=110.5) == (0, "stalled: no heartbeat for 10.5 s")
    live.beat(0, at=110.0)
    live.finish(1)
    assert live.stalled(now=119.0) is None
    assert live.stalled(now=130.5) == (0, "stalled: no heartbeat for 20.5 s")
    live.beat(0, at=130.0)
    assert live.stalled(now=131.0) == (2, "stalled: no heartbeat 31.0 s after the first worker's")
