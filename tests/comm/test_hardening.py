"""The mesh under attack (docs/SECURITY.md): two ``TcpMesh`` workers in this process.

* Injection relay: a proxy between worker 1 and worker 0 passes the genuine handshake and then
  injects a pickle bomb (in the clear, or posing as a sealed frame), replays, reorders or
  drops a frame: worker 0 fails the connection with ``FrameRefusedError`` naming worker 1, the
  frames before it were delivered, and the bomb never runs.
* 1,000 slow connections (a byte every 2 s, reopened when closed): the threads and file
  descriptors of the listening worker stay bounded by ``max_pending``, the refusals are logged
  in a handful of lines with a count, and a genuine peer still connects and the mesh works.
* The accept loop survives ``EMFILE``, patched into ``accept`` and real (``RLIMIT_NOFILE`` in
  a subprocess): one line when it starts, one with the count when accepting works again, and
  a peer connects afterwards.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenflow.comm.tcp import (
    FrameRefusedError,
    RefusalLog,
    TcpAllocator,
    TcpMesh,
    bind_listener,
)

SECRET = b"k" * 32
JOB = "hardening"


def recv_n(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def form_mesh(meshes: list[TcpMesh], addresses: list[list[tuple[str, int]]],
              timeout: float = 20.0) -> None:
    """``connect`` every mesh (each with its own view of the addresses) in threads."""
    errors: list[BaseException] = []

    def run(mesh: TcpMesh, addrs: list[tuple[str, int]]) -> None:
        try:
            mesh.connect(addrs, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(m, a)) for m, a in zip(meshes, addresses, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]


def drain(allocator: TcpAllocator, puller: Any, count: int, timeout: float = 10.0) -> list[Any]:
    """Pull ``count`` messages (raising a failure the mesh reports)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        allocator.receive()
        message = puller.pull()
        if message is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"got {len(got)} of {count} messages: {got}")
            allocator.park(0.02)
        else:
            got.append(message)
    return got


class Bomb:
    """Unpickling a ``Bomb`` writes its marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


# -- the injection relay -----------------------------------------------------------------------


class Relay:
    """A man in the middle between a connecting worker and the worker it dials.

    The connector-to-acceptor direction is forwarded frame by frame (a 16-byte header, then
    the declared length); frames 0 and 1 are the handshake (hello, MAC), frame ``2 + k`` is
    data frame ``k``.  ``tamper(k, frame)`` returns the bytes to forward in its place (hold
    frames to reorder them, return them twice to replay, add bytes to inject).  The other
    direction is forwarded as it comes.
    """

    def __init__(self, target: tuple[str, int],
                 tamper: Callable[[int, bytes], bytes] = lambda k, frame: frame) -> None:
        self.target = target
        self.tamper = tamper
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.data_frames = 0
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        self.socks += [client, server]
        threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()
        self._frames(client, server)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass

    def _frames(self, src: socket.socket, dst: socket.socket) -> None:
        index = 0
        try:
            while True:
                head = recv_n(src, 16)
                frame = head + recv_n(src, int.from_bytes(head[8:16], "big"))
                if index >= 2:
                    frame = self.tamper(index - 2, frame)
                    self.data_frames += 1
                dst.sendall(frame)
                index += 1
        except (OSError, EOFError):
            pass

    def close(self) -> None:
        for s in [self.listener, *self.socks]:
            s.close()


def injected_pickle(marker: Path, sealed_looking: bool) -> bytes:
    """A frame carrying a pickle bomb: in the clear (protocol 1's data frames), or with the
    sealed flag and a made-up tag."""
    body = pickle.dumps((0, [Bomb(str(marker))]), protocol=5)
    if sealed_looking:
        body += os.urandom(16)
    return b"tF" + bytes([1, 1 if sealed_looking else 0]) + (3).to_bytes(4, "big") + \
        len(body).to_bytes(8, "big") + body


def tamper_with(case: str, marker: Path) -> Callable[[int, bytes], bytes]:
    """The relay's tampering for ``case``; every case hits data frame 1 (sequence number 1),
    so frame 0 arrives intact and the receiver fails at frame #1."""
    held: dict[int, bytes] = {}

    def tamper(k: int, frame: bytes) -> bytes:
        held[k] = frame
        if k == 1 and case == "inject-clear":
            return injected_pickle(marker, sealed_looking=False) + frame
        if k == 1 and case == "inject-sealed":
            return injected_pickle(marker, sealed_looking=True) + frame
        if k == 1 and case == "replay":
            return held[0] + frame  # data frame 0 once more, before frame 1
        if k == 1 and case in ("reorder", "drop"):
            return b""  # hold frame 1 (reorder) or lose it (drop) ...
        if k == 2 and case == "reorder":
            return frame + held[1]  # ... and send it after frame 2
        return frame

    return tamper


@pytest.fixture
def relayed(request: Any, tmp_path: Path) -> Iterator[tuple[list[TcpMesh], Relay, str]]:
    """Workers 0 and 1, worker 1 dialling worker 0 through a ``Relay`` tampering as
    ``request.param`` says ("none": an honest relay)."""
    case = request.param
    listeners = [bind_listener(), bind_listener()]
    real = [tuple(sock.getsockname()[:2]) for sock in listeners]
    relay = Relay(real[0], tamper_with(case, tmp_path / "bomb"))  # type: ignore[arg-type]
    meshes = [TcpMesh(i, 2, listeners[i], SECRET, JOB) for i in range(2)]
    # worker 1 dials worker 0 through the relay; worker 0 knows worker 1's real address
    form_mesh(meshes, [real, [relay.address, real[1]]])  # type: ignore[list-item]
    yield meshes, relay, case
    relay.close()
    for mesh in meshes:
        mesh.close()


CASES = {
    "inject-clear": "frame #1 of kind 1 is not sealed",
    "inject-sealed": "frame #1 (kind 1, ",
    "replay": "frame #1 (kind 1, ",
    "reorder": "frame #1 (kind 1, ",
    "drop": "frame #1 (kind 1, ",
}


def send_four(meshes: list[TcpMesh]) -> tuple[TcpAllocator, Any]:
    """Worker 1 sends ``(k, ["record k"])`` for k = 0..3 on channel 3, one frame per flush;
    worker 0's allocator and puller."""
    sender, receiver = TcpAllocator(meshes[1]), TcpAllocator(meshes[0])
    pushers, _ = sender.allocate(3)
    _, puller = receiver.allocate(3)
    for k in range(4):
        pushers[0].push((k, [f"record {k}"]))
        sender.flush()
    return receiver, puller


@pytest.mark.parametrize("relayed", list(CASES), indirect=True)
def test_relay_tampering_fails_the_connection_naming_the_peer(
        relayed: tuple[list[TcpMesh], Relay, str], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    meshes, relay, case = relayed
    caplog.set_level(logging.ERROR, logger="tokenflow.comm.tcp")
    receiver, _ = send_four(meshes)
    def refused() -> bool:
        meshes[0].poll(0.05)  # the worker thread reads (and refuses) what arrived
        return meshes[0].failure is not None

    wait_for(refused, 10, "worker 0 to refuse a frame")
    error = meshes[0].failure
    assert isinstance(error, FrameRefusedError), error
    assert error.worker == 1
    assert f"refused a frame from worker 1 at {meshes[0].addresses[1][0]}:" in str(error)
    assert CASES[case] in str(error), str(error)
    if case != "inject-clear":
        assert "failed its integrity check" in str(error), str(error)
    # frame 0 was delivered, nothing after the bad frame was
    assert list(meshes[0].queue(3)) == [(0, ["record 0"])]
    with pytest.raises(FrameRefusedError):
        receiver.receive()  # the worker loop sees the failure
    assert not (tmp_path / "bomb").exists(), "the injected pickle was unpickled"
    logged = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("worker 0: refused a frame from worker 1 at 127.0.0.1:")
               for line in logged), logged


@pytest.mark.parametrize("relayed", ["none"], indirect=True)
def test_relay_that_only_forwards_changes_nothing(relayed: tuple[list[TcpMesh], Relay, str]) -> None:
    """Positive control: through an honest relay the messages arrive and nothing fails."""
    meshes, _, _ = relayed
    receiver, puller = send_four(meshes)
    assert drain(receiver, puller, 4) == [(k, [f"record {k}"]) for k in range(4)]
    assert meshes[0].failure is None


def test_bomb_detonates_when_unpickled(tmp_path: Path) -> None:
    """Positive control: the injected payload does run code when unpickled."""
    marker = tmp_path / "bomb"
    frame = injected_pickle(marker, sealed_looking=False)
    pickle.loads(frame[16:])
    assert marker.read_text() == "unpickled"


# -- 1,000 slow connections --------------------------------------------------------------------

SLOW_CLIENTS = r"""
import socket, sys, time
address = (sys.argv[1], int(sys.argv[2]))
count, seconds = int(sys.argv[3]), float(sys.argv[4])
socks, opened, failed = [], 0, 0
def dial():
    global opened, failed
    try:
        s = socket.create_connection(address, timeout=2)
        s.send(b"t")  # the first byte of a frame header, then (almost) nothing
        opened += 1
        return s
    except OSError:
        failed += 1
        return None
for _ in range(count):
    socks.append(dial())
print("open", opened, failed, flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    time.sleep(2)
    for i, s in enumerate(socks):  # one more byte each; reopen the ones the worker closed
        try:
            if s is None:
                raise OSError
            s.send(b"F")
        except OSError:
            if s is not None:
                s.close()
            socks[i] = dial()
print("done", opened, failed, flush=True)
"""


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_thousand_slow_connections_stay_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tokenflow.comm.tcp")
    listeners = [bind_listener(), bind_listener()]
    addresses = [tuple(s.getsockname()[:2]) for s in listeners]
    pending_cap = 64
    meshes = [TcpMesh(i, 2, listeners[i], SECRET, JOB, handshake_timeout=3.0,
                      max_pending=pending_cap, log_interval=60.0) for i in range(2)]
    threads0, fds0 = threading.active_count(), open_fds()
    formed: list[BaseException | None] = []
    worker0 = threading.Thread(target=lambda: formed.append(
        _connect_or_error(meshes[0], addresses)))  # type: ignore[arg-type]
    worker0.start()
    attacker = subprocess.Popen([sys.executable, "-c", SLOW_CLIENTS, *map(str, addresses[0]),
                                 "1000", "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert attacker.stdout is not None
        line = attacker.stdout.readline().split()
        assert line[0] == "open" and int(line[1]) >= 900, line  # the listener kept accepting
        peak_threads = peak_fds = 0
        flood = time.monotonic()
        # 3 s under the flood (reopened connections included), and on until the listener has
        # refused 900, for at most 8 s (a loaded machine's accept thread gets there later)
        while time.monotonic() - flood < 3.0 or \
                (meshes[0].refused < 900 and time.monotonic() - flood < 8.0):
            peak_threads = max(peak_threads, threading.active_count())
            peak_fds = max(peak_fds, open_fds())
            time.sleep(0.1)
        assert meshes[0].refused >= 900
        # bounded: the accept thread and one handshake thread per pending connection
        assert peak_threads <= threads0 + 1 + pending_cap + 1, (peak_threads, threads0)
        assert peak_fds <= fds0 + pending_cap + 2, (peak_fds, fds0)
        # a genuine peer gets through while the flood goes on, and the mesh carries data
        start = time.monotonic()
        meshes[1].connect(addresses, timeout=20)  # type: ignore[arg-type]
        worker0.join(20)
        assert formed == [None], formed
        assert time.monotonic() - start < 15
        assert attacker.poll() is None, "the flood was still on"
        allocators = [TcpAllocator(m) for m in meshes]
        channels = [a.allocate(5) for a in allocators]
        channels[1][0][0].push((1, ["through the flood"]))
        allocators[1].flush()
        channels[0][0][1].push((1, ["and back"]))
        allocators[0].flush()
        assert drain(allocators[0], channels[0][1], 1) == [(1, ["through the flood"])]
        assert drain(allocators[1], channels[1][1], 1) == [(1, ["and back"])]
    finally:
        for mesh in meshes:
            mesh.close()  # logs the refusal counts
        attacker.kill()
        attacker.wait()
    # rate-limited: the first refusal of each kind in full, then one line with the count
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenflow.comm.tcp"]
    refusal_lines = [line for line in lines if "worker 0 refused" in line]
    assert len(refusal_lines) <= 8, refusal_lines
    summary = [line for line in refusal_lines if "connections in the last" in line]
    assert len(summary) == 1, refusal_lines
    total = int(summary[0].split("refused ")[1].split(" connections")[0].replace(",", ""))
    assert 900 <= total <= meshes[0].refused
    assert "evicted" in summary[0], summary


def _connect_or_error(mesh: TcpMesh, addresses: list[tuple[str, int]]) -> BaseException | None:
    try:
        mesh.connect(addresses, timeout=25)
        return None
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        return exc


def test_refusal_log_counts_a_flood_in_few_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tokenflow.comm.tcp")
    refusals = RefusalLog(7, interval=0.2)
    for k in range(10_000):
        refusals.record(("10.0.0.1", 1000 + k % 50000), "bad handshake" if k % 10 else "wrong job",
                        f"detail {k}")
    time.sleep(0.25)
    refusals.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "worker 7 refused a connection from 10.0.0.1:1000: detail 0",
        "worker 7 refused a connection from 10.0.0.1:1001: detail 1",
        "worker 7 refused 10,000 connections in the last 0.3 s: 9,000 bad handshake, 1,000 wrong "
        "job (the first of each kind logged above)",
    ], lines
    assert refusals.lines == 3


# -- the accept loop through EMFILE ------------------------------------------------------------


class FlakyListener(socket.socket):
    """A listening socket whose ``accept`` fails with ``EMFILE`` ``failures`` times."""

    failures = 5

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return super().accept()


def test_accept_loop_survives_emfile(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tokenflow.comm.tcp")
    flaky = FlakyListener(socket.AF_INET, socket.SOCK_STREAM)
    flaky.bind(("127.0.0.1", 0))
    flaky.listen(16)
    listeners = [flaky, bind_listener()]
    addresses = [tuple(s.getsockname()[:2]) for s in listeners]
    meshes = [TcpMesh(i, 2, listeners[i], SECRET, JOB) for i in range(2)]
    try:
        form_mesh(meshes, [addresses, addresses], timeout=10)  # type: ignore[list-item]
        assert meshes[0].accept_failures == 5
        allocators = [TcpAllocator(m) for m in meshes]
        channels = [a.allocate(1) for a in allocators]
        channels[1][0][0].push((0, ["after EMFILE"]))
        allocators[1].flush()
        assert drain(allocators[0], channels[0][1], 1) == [(0, ["after EMFILE"])]
    finally:
        for mesh in meshes:
            mesh.close()
    lines = [r.getMessage() for r in caplog.records]
    accept_lines = [line for line in lines if "accept" in line]
    assert len(accept_lines) == 2, lines
    assert accept_lines[0].startswith("worker 0: accept failed (OSError: [Errno 24] Too many open "
                                      "files); backing off"), accept_lines
    assert "worker 0: accept works again after 5 failures in" in accept_lines[1], accept_lines


REAL_EMFILE = r"""
import json, logging, os, resource, socket, sys, threading, time
from tokenflow.comm.tcp import TcpAllocator, TcpMesh, bind_listener

lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("tokenflow.comm.tcp").addHandler(Keep())
logging.getLogger("tokenflow.comm.tcp").setLevel(logging.INFO)

listeners = [bind_listener(), bind_listener()]
addresses = [tuple(s.getsockname()[:2]) for s in listeners]
meshes = [TcpMesh(i, 2, listeners[i], b"s" * 32, "emfile", handshake_timeout=1.0) for i in range(2)]
stray = socket.create_connection(addresses[0])  # waits in worker 0's backlog
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
filler = []
while True:
    try:
        filler.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
formed = []
worker0 = threading.Thread(target=lambda: formed.append(meshes[0].connect(addresses, timeout=15)))
worker0.start()
deadline = time.monotonic() + 10
while meshes[0].accept_failures < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
failures_while_full = meshes[0].accept_failures
for fd in filler:
    os.close(fd)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
meshes[1].connect(addresses, timeout=10)
worker0.join(15)
allocators = [TcpAllocator(m) for m in meshes]
pushers, _ = allocators[1].allocate(0)
_, puller = allocators[0].allocate(0)
pushers[0].push((0, ["after EMFILE"]))
allocators[1].flush()
got = None
for _ in range(500):
    allocators[0].receive()
    got = puller.pull()
    if got is not None:
        break
    time.sleep(0.01)
stray.close()
for m in meshes:
    m.close()
print(json.dumps({"failures": failures_while_full, "formed": formed == [None], "got": got,
                  "lines": lines}))
"""


def test_accept_loop_survives_real_emfile() -> None:
    """Worker 0 runs out of file descriptors (``RLIMIT_NOFILE``) with a connection waiting:
    ``accept`` fails with EMFILE until descriptors are freed, then worker 1 connects."""
    out = subprocess.run([sys.executable, "-c", REAL_EMFILE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] >= 3, result
    assert result["formed"], result
    assert result["got"] == [0, ["after EMFILE"]], result
    lines = result["lines"]
    failed = [line for line in lines if "accept failed" in line]
    assert len(failed) == 1 and "Too many open files" in failed[0], lines
    again = [line for line in lines if "accept works again after" in line]
    assert len(again) == 1, lines
    assert int(again[0].split("after ")[1].split(" failures")[0]) >= 3, again
