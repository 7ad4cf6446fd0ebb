"""The driver's coordinator under hostile or careless clients (docs/ARCHITECTURE.md,
"Security": the coordinator faces the network).

* 1,000 slow connections cost no thread each and at most ``MAX_PENDING`` descriptors, and a
  real worker's reports still arrive; a hello has one deadline, however slowly it trickles in.
* Out of descriptors (``EMFILE``), the accepting thread backs off and goes on.
* A report with a malformed field is refused with its reason logged, the connection goes on,
  and the CLI's table renders; a frame that is not msgpack is refused naming why.
* Refusals are logged rate-limited, with a count.
* Heartbeats and ``Liveness``.
* The link's protocol, checked by a client written from the module docstring of
  ``tokenflow.coordinator``: the token never travels, and a relay between a real ``Reporter``
  and the coordinator can neither inject (in the clear or posing as sealed), nor replay frames
  in either direction: the receiver logs the refusal, drops the connection and delivers
  nothing; a wrong token is refused on both sides.
"""

from __future__ import annotations

import hashlib
import hmac
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
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from rich.console import Console

from tokenflow.cli import progress_table
from tokenflow.comm.frames import FrameOpener, FrameSealer
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


def read_hello(sock: socket.socket) -> dict[str, Any]:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "closed"
            buf += chunk
        return buf
    (n,) = struct.unpack("!I", exactly(4))
    reply = msgpack.unpackb(exactly(n))
    assert isinstance(reply, dict)
    return reply


def parts(*items: bytes | str) -> bytes:
    out = b""
    for item in items:
        data = item.encode() if isinstance(item, str) else item
        out += struct.pack("!I", len(data)) + data
    return out


KIND_MESSAGE = 32


class Client:
    """The worker's side of the link, from the module docstring of ``tokenflow.coordinator``."""

    def __init__(self, coordinator: Coordinator, token: str | None = None) -> None:
        token = coordinator.token if token is None else token
        self.sock = socket.create_connection(coordinator.address, timeout=5)
        key = HKDF(hashes.SHA256(), 32, None, b"tokenflow coordinator v2 auth").derive(token.encode())
        nonce_w = os.urandom(16)
        self.sock.sendall(frame({"v": 2, "nonce": nonce_w}))
        reply = read_hello(self.sock)
        nonce_c = reply["nonce"]
        expected = hmac.new(key, parts("coordinator accept", nonce_w, nonce_c), hashlib.sha256).digest()
        self.genuine = hmac.compare_digest(reply["mac"], expected)
        self.sock.sendall(frame({"mac": hmac.new(key, parts("coordinator connect", nonce_c, nonce_w),
                                                 hashlib.sha256).digest()}))
        keys = HKDF(hashes.SHA256(), 64, nonce_w + nonce_c,
                    parts("tokenflow coordinator v2 keys")).derive(token.encode())
        self.sealer, self.opener = FrameSealer(keys[:32]), FrameOpener(keys[32:])

    def send_payload(self, payload: bytes) -> None:
        self.sock.sendall(self.sealer.seal_control(KIND_MESSAGE, payload))

    def send(self, obj: Any) -> None:
        self.send_payload(msgpack.packb(obj))

    def read(self) -> dict[str, Any]:
        kind, _, payload = self.opener.read(self.sock, 1 << 16)
        assert kind == KIND_MESSAGE
        reply = msgpack.unpackb(bytes(payload))
        assert isinstance(reply, dict)
        return reply


def authenticated(coordinator: Coordinator) -> Client:
    client = Client(coordinator)
    assert client.genuine
    return client


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


@pytest.mark.parametrize("step", [1, 2])
def test_the_hello_has_one_deadline(step: int) -> None:
    """A hello trickling in a byte every 0.2 s is cut off at the deadline (1 s here), not
    kept alive by each byte; the deadline covers both of the worker's frames."""
    coordinator = Coordinator(hello_timeout=1.0)
    try:
        sock = socket.create_connection(coordinator.address, timeout=5)
        start = time.monotonic()
        hello = frame({"v": 2, "nonce": os.urandom(16)})
        if step == 2:
            sock.sendall(hello)
            read_hello(sock)
            hello = frame({"mac": os.urandom(32)})
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
            client = authenticated(coordinator)
            client.send({**VALID, field: value})
            client.send({**VALID, "worker": 1})  # the connection goes on
            assert wait_until(lambda: 1 in coordinator.reports, 5)
            client.sock.close()
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
            client = authenticated(coordinator)
            client.send_payload(payload)
            assert client.sock.recv(1) == b""  # closed by the coordinator
            client.sock.close()
            assert wait_until(lambda: coordinator.refused == 1, 5)
        assert reason in caplog.text
    finally:
        coordinator.close()


def test_refusals_are_logged_rate_limited_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = Coordinator()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            for _ in range(30):
                client = Client(coordinator, token="wrong")
                assert not client.genuine  # the coordinator's MAC is under the real token
                assert client.sock.recv(1) == b""
                client.sock.close()
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


# -- the link against an on-path attacker --------------------------------------------------------


class Relay:
    """A TCP relay between one worker and the coordinator that records what it forwards in
    each direction and can inject bytes into either."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.to_coordinator = bytearray()
        self.to_worker = bytearray()
        self.worker_side: socket.socket | None = None
        self.coordinator_side: socket.socket | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def endpoint(self, token: str) -> tuple[str, int, str]:
        return "127.0.0.1", self.port, token

    def _run(self) -> None:
        worker, _ = self.listener.accept()
        coordinator = socket.create_connection(self.target)
        self.worker_side, self.coordinator_side = worker, coordinator
        threading.Thread(target=self._pump, args=(worker, coordinator, self.to_coordinator),
                         daemon=True).start()
        self._pump(coordinator, worker, self.to_worker)

    def _pump(self, src: socket.socket, dst: socket.socket, captured: bytearray) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with self.lock:
                if not data:  # one side closed: close the other
                    for sock in (src, dst):
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    return
                captured += data
                try:
                    dst.sendall(data)
                except OSError:
                    pass

    def inject(self, towards: str, data: bytes) -> None:
        with self.lock:
            sock = self.coordinator_side if towards == "coordinator" else self.worker_side
            assert sock is not None
            sock.sendall(data)

    def wire(self) -> bytes:
        with self.lock:
            return bytes(self.to_coordinator + self.to_worker)

    def close(self) -> None:
        self.listener.close()
        for sock in (self.worker_side, self.coordinator_side):
            if sock is not None:
                sock.close()


def through_relay(coordinator: Coordinator) -> tuple[Relay, Reporter]:
    relay = Relay(coordinator.address)
    reporter = Reporter(relay.endpoint(coordinator.token))
    assert reporter.sock is not None
    reporter(FakeWorker(), force=True)
    assert wait_until(lambda: 0 in coordinator.reports, 5)
    return relay, reporter


def assert_token_not_on_the_wire(relay: Relay, token: str) -> None:
    wire = relay.wire()
    assert wire, "nothing was relayed"
    assert token.encode() not in wire and bytes.fromhex(token) not in wire


def test_the_token_never_travels_and_frames_are_sealed() -> None:
    coordinator = Coordinator()
    relay, reporter = through_relay(coordinator)
    try:
        reporter.send({"kind": "idle", "worker": 0, "sent": 12345678, "received": 1})
        assert coordinator.inbox.get(timeout=5)["sent"] == 12345678
        coordinator.send(0, {"kind": "pause_at", "epoch": 4242, "note": "secret-plan"})
        assert reporter.poll(timeout=5) == {"kind": "pause_at", "epoch": 4242, "note": "secret-plan"}
        assert coordinator.reports[0]["records_in"] == 70
        assert_token_not_on_the_wire(relay, coordinator.token)
        wire = relay.wire()
        for clear in (b"records_in", b"frontiers", b"secret-plan", b"pause_at", b"idle"):
            assert clear not in wire, clear  # confidentiality: no payload in the clear
        assert coordinator.refused == 0
    finally:
        reporter.close()
        relay.close()
        coordinator.close()


FORGED_REPORT = {**VALID, "records_in": 999}
FORGED_COMMAND = {"kind": "stop", "reason": "maintenance window"}


def forged(obj: dict[str, Any], how: str) -> bytes:
    """``obj`` as the old link's frame in the clear, or sealed under a key the attacker made up."""
    if how == "clear":
        return frame(obj)
    return bytes(FrameSealer(os.urandom(32)).seal_control(KIND_MESSAGE, msgpack.packb(obj)))


@pytest.mark.parametrize("how", ["clear", "sealed"])
def test_a_relay_cannot_inject_a_report(caplog: pytest.LogCaptureFixture, how: str) -> None:
    coordinator = Coordinator()
    relay, reporter = through_relay(coordinator)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            before = coordinator.snapshot()
            relay.inject("coordinator", forged(FORGED_REPORT, how))
            assert wait_until(lambda: coordinator.refused == 1, 5), "the forged report was not refused"
            assert wait_until(lambda: coordinator.connected() == [], 5)  # dropped
            time.sleep(0.1)
            assert coordinator.snapshot() == before  # nothing forged delivered
            assert coordinator.inbox.empty()
            with pytest.raises(ConnectionError):  # the relay passed the coordinator's close on
                reporter.poll(timeout=5)
        assert "closing the connection" in caplog.text
        assert_token_not_on_the_wire(relay, coordinator.token)
    finally:
        reporter.close()
        relay.close()
        coordinator.close()


@pytest.mark.parametrize("how", ["clear", "sealed"])
def test_a_relay_cannot_inject_a_command(caplog: pytest.LogCaptureFixture, how: str) -> None:
    coordinator = Coordinator()
    relay, reporter = through_relay(coordinator)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            before = coordinator.snapshot()
            relay.inject("worker", forged(FORGED_COMMAND, how))
            with pytest.raises(ConnectionError):  # not the forged command
                reporter.poll(timeout=5)
            assert reporter.sock is None  # dropped
            assert "refused a frame from the coordinator" in caplog.text
            assert wait_until(lambda: coordinator.connected() == [], 5)
            assert coordinator.snapshot() == before and coordinator.inbox.empty()
        assert_token_not_on_the_wire(relay, coordinator.token)
    finally:
        reporter.close()
        relay.close()
        coordinator.close()


@pytest.mark.parametrize("towards", ["coordinator", "worker"])
def test_a_replayed_frame_is_refused(caplog: pytest.LogCaptureFixture, towards: str) -> None:
    coordinator = Coordinator()
    relay, reporter = through_relay(coordinator)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            if towards == "coordinator":
                mark = len(relay.to_coordinator)
                reporter.send({"kind": "idle", "worker": 0, "sent": 1, "received": 1})
                assert coordinator.inbox.get(timeout=5)["kind"] == "idle"
                recorded = bytes(relay.to_coordinator[mark:])
                relay.inject("coordinator", recorded)
                assert wait_until(lambda: coordinator.refused == 1, 5), "the replay was taken"
                assert wait_until(lambda: coordinator.connected() == [], 5)
                assert coordinator.inbox.empty()
                assert "failed its integrity check" in caplog.text
            else:
                mark = len(relay.to_worker)
                coordinator.send(0, {"kind": "pause_at", "epoch": 40})
                assert reporter.poll(timeout=5) == {"kind": "pause_at", "epoch": 40}
                recorded = bytes(relay.to_worker[mark:])
                relay.inject("worker", recorded)
                with pytest.raises(ConnectionError):
                    reporter.poll(timeout=5)
                assert "failed its integrity check" in caplog.text
                assert wait_until(lambda: coordinator.connected() == [], 5)
    finally:
        reporter.close()
        relay.close()
        coordinator.close()


def test_a_wrong_token_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    coordinator = Coordinator()
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            reporter = Reporter((*coordinator.address, "0" * 32))
            assert reporter.sock is None  # the coordinator's MAC did not verify under this token
            reporter(FakeWorker(), force=True)
            assert wait_until(lambda: coordinator.refused == 1, 5)
        assert "bad token" in caplog.text and "failed the token check" in caplog.text
        assert coordinator.reports == {} and coordinator.connected() == []
    finally:
        coordinator.close()


def test_the_old_hello_with_the_token_in_the_clear_is_refused() -> None:
    coordinator = Coordinator()
    try:
        sock = socket.create_connection(coordinator.address, timeout=5)
        sock.sendall(frame({"token": coordinator.token}))
        try:
            sock.sendall(frame(VALID))
            assert sock.recv(1) == b""
        except ConnectionResetError:  # closed with the report unread
            pass
        sock.close()
        assert wait_until(lambda: coordinator.refused == 1, 5)
        assert coordinator.reports == {}
    finally:
        coordinator.close()


def test_a_reporter_refuses_a_coordinator_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    """An impostor that answers the hello without knowing the token gets no reports."""
    impostor = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def serve() -> None:
        conn, _ = impostor.accept()
        with conn:
            hello = read_hello(conn)
            conn.sendall(frame({"nonce": os.urandom(16), "mac": os.urandom(32)}))
            conn.settimeout(2)
            got.extend(msgpack.packb(hello))
            try:
                while chunk := conn.recv(65536):
                    got.extend(chunk)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    token = "ab" * 16
    with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
        reporter = Reporter(("127.0.0.1", impostor.getsockname()[1], token))
        reporter(FakeWorker(), force=True)
    thread.join(5)
    impostor.close()
    assert reporter.sock is None and "failed the token check" in caplog.text
    assert b"records_in" not in got and token.encode() not in got


# -- the Spark tasks' address exchange ----------------------------------------------------------


def test_workers_exchange_their_addresses_through_the_coordinator(caplog: pytest.LogCaptureFixture) -> None:
    """Each worker gets every worker's ``(host, port)`` in worker order, whatever order they
    sent theirs in; a second set for the same job (a re-attempted stage) is answered too; a
    malformed address is refused with its reason and the connection goes on."""
    coordinator = Coordinator()
    done = threading.Event()
    server = threading.Thread(target=coordinator.gather_addresses,
                              args=("job-a", 3, done.is_set), daemon=True)
    server.start()
    reporters = [Reporter(coordinator.endpoint) for _ in range(3)]
    try:
        with caplog.at_level(logging.WARNING, logger="tokenflow.coordinator"):
            reporters[0].send({"kind": "mesh_address", "worker": 0, "job": "job-a", "host": "h0",
                               "port": 0})
            assert wait_until(lambda: coordinator.refused == 1, 10)
        assert "'port' must be a port number" in caplog.text
        for attempt in range(2):
            got: dict[int, Any] = {}

            def exchange(i: int, attempt: int = attempt, got: dict[int, Any] = got) -> None:
                got[i] = reporters[i].exchange_addresses(i, "job-a", f"h{i}", 1000 * attempt + i + 1,
                                                         timeout=30)

            threads = [threading.Thread(target=exchange, args=(i,)) for i in (2, 0, 1)]
            for t in threads:
                t.start()
                time.sleep(0.05)
            for t in threads:
                t.join(30)
            expected = [(f"h{i}", 1000 * attempt + i + 1) for i in range(3)]
            assert got == {0: expected, 1: expected, 2: expected}
        with pytest.raises(TimeoutError, match="no peer addresses"):
            reporters[0].exchange_addresses(0, "job-b", "h0", 1, timeout=0.3)  # nobody serves job-b
    finally:
        done.set()
        server.join(5)
        for r in reporters:
            r.close()
        coordinator.close()
    assert not server.is_alive()


def test_a_held_reply_names_its_busy_times_as_a_short_list_of_ints() -> None:
    """The busy times of a ``held`` reply (``tokenflow.control``) are checked like its other
    fields: a list of at most 64 ints, or absent."""
    from tokenflow.coordinator import ReportError, validate_reply

    held = {"kind": "held", "worker": 0, "point": 10, "granularity": 1}
    validate_reply(held)
    validate_reply({**held, "busy": [10, 15]})
    for bad in ([1.5], "10", [True], list(range(65)), {"10": 1}):
        with pytest.raises(ReportError, match="bad 'busy'"):
            validate_reply({**held, "busy": bad})


def test_a_captured_reply_names_its_channel_state_as_a_count() -> None:
    """``crossing`` (messages stored as channel state) is summed by the driver: an int >= 0."""
    from tokenflow.coordinator import ReportError, validate_reply

    captured = {"kind": "captured", "worker": 1, "epoch": 40, "sent": 5, "received": 5}
    validate_reply(captured)
    validate_reply({**captured, "crossing": 3})
    for bad in (-1, 1.5, "3", True, [3]):
        with pytest.raises(ReportError, match="bad 'crossing'"):
            validate_reply({**captured, "crossing": bad})
