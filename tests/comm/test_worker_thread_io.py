"""The mesh's reading and sending on the worker thread (``tokenflow.comm.tcp``): a send never
blocks the worker, two workers sending to each other at once both get on, a worker that does
not read holds nothing up but its own queue, and a peer's death is seen by a parked worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.comm.test_hardening import JOB, SECRET, drain, form_mesh
from tokenflow.comm.tcp import PeerLostError, TcpAllocator, TcpMesh, bind_listener

BIG = 8 << 20  # bytes per message: far more than a loopback socket buffers


@pytest.fixture
def pair() -> Iterator[tuple[list[TcpMesh], list[TcpAllocator]]]:
    listeners = [bind_listener(), bind_listener()]
    addresses = [tuple(s.getsockname()[:2]) for s in listeners]
    meshes = [TcpMesh(i, 2, listeners[i], SECRET, JOB) for i in range(2)]
    form_mesh(meshes, [addresses, addresses])  # type: ignore[list-item]
    yield meshes, [TcpAllocator(m) for m in meshes]
    for mesh in meshes:
        mesh.close()


def big(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, BIG, dtype=np.uint8)


def test_a_send_to_a_worker_that_does_not_read_returns_at_once(
        pair: tuple[list[TcpMesh], list[TcpAllocator]]) -> None:
    meshes, allocators = pair
    pushers, _ = allocators[0].allocate(7)
    _, puller = allocators[1].allocate(7)
    payloads = [big(k) for k in range(4)]
    for k, payload in enumerate(payloads):
        pushers[1].push((k, payload))
    allocators[0].flush()  # worker 1 reads nothing meanwhile: this must not wait for it
    assert meshes[0].unsent > 0, "the socket took 32 MB at once: the test shows nothing"
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(payloads):
        assert time.monotonic() < deadline, f"{len(got)} of {len(payloads)} arrived"
        meshes[0].poll(0.01)  # the sender's worker goes on stepping: the rest goes out
        allocators[1].receive()
        message = puller.pull()
        if message is not None:
            got.append(message)
    assert [k for k, _ in got] == list(range(len(payloads)))
    for (_, received), sent in zip(got, payloads, strict=True):
        assert np.array_equal(received, sent)
    assert meshes[0].unsent == 0


def test_two_workers_sending_to_each_other_at_once_both_get_on(
        pair: tuple[list[TcpMesh], list[TcpAllocator]]) -> None:
    """Each flushes 32 MB to the other before either reads: with blocking sends both would
    wait for the other to read, forever."""
    meshes, allocators = pair
    channels = [a.allocate(3) for a in allocators]
    for i in range(2):
        for k in range(4):
            channels[i][0][1 - i].push((k, big(10 * i + k)))
        allocators[i].flush()
    for i in range(2):
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 4:
            assert time.monotonic() < deadline, f"worker {i}: {len(got)} of 4 arrived"
            for mesh in meshes:
                mesh.poll(0.005)
            allocators[i].receive()
            message = channels[i][1].pull()
            if message is not None:
                got.append(message)
        assert all(np.array_equal(m, big(10 * (1 - i) + k)) for k, m in got)


def test_messages_keep_their_order_across_a_full_socket(
        pair: tuple[list[TcpMesh], list[TcpAllocator]]) -> None:
    meshes, allocators = pair
    pushers, _ = allocators[0].allocate(5)
    _, puller = allocators[1].allocate(5)
    pushers[1].push((0, big(0)))
    allocators[0].flush()
    for k in range(1, 200):  # small ones queue behind the big one
        pushers[1].push((k, [k]))
        allocators[0].flush()
    assert [k for k, _ in drain(allocators[1], puller, 200, timeout=30)] == list(range(200))


PEER = r"""
import sys, time
from tokenflow.comm.tcp import TcpMesh, bind_listener
listener = bind_listener()
print(listener.getsockname()[1], flush=True)
mesh = TcpMesh(1, 2, listener, b"k" * 32, "hardening")
mesh.connect([("127.0.0.1", int(sys.argv[1])), None])
print("connected", flush=True)
time.sleep(60)
"""


def test_a_parked_worker_sees_its_peer_sigkilled() -> None:
    listener = bind_listener()
    mesh = TcpMesh(0, 2, listener, SECRET, JOB)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(listener.getsockname()[1])],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert peer.stdout is not None
        port = int(peer.stdout.readline())
        mesh.connect([None, ("127.0.0.1", port)], timeout=20)  # type: ignore[list-item]
        assert peer.stdout.readline().strip() == "connected"
        mesh.park(0.05)
        assert mesh.failure is None
        os.kill(peer.pid, signal.SIGKILL)
        started = time.monotonic()
        while mesh.failure is None and time.monotonic() - started < 10:
            mesh.park(1.0)  # woken by the closed connection, not by the timeout
        assert isinstance(mesh.failure, PeerLostError), mesh.failure
        assert mesh.failure.worker == 1
        with pytest.raises(PeerLostError):
            TcpAllocator(mesh).receive()
    finally:
        peer.kill()
        peer.wait()
        mesh.close()


def test_a_watched_socket_ends_a_park_and_keeps_its_data(
        pair: tuple[list[TcpMesh], list[TcpAllocator]]) -> None:
    """A control command (a byte on a watched socket) wakes a parked worker at once instead
    of after its park's timeout; the mesh leaves the bytes to the socket's owner; a watched
    socket its owner closes is dropped, and ``unwatch`` restores the full park."""
    import socket

    meshes, _ = pair
    mesh = meshes[0]
    ours, theirs = socket.socketpair()
    mesh.watch(ours)
    try:
        started = time.monotonic()
        mesh.park(0.5)  # nothing readable: the whole timeout
        assert time.monotonic() - started >= 0.45

        theirs.sendall(b"x")
        started = time.monotonic()
        mesh.park(2.0)
        assert time.monotonic() - started < 1.0  # woken by the command, not the timeout
        assert ours.recv(1) == b"x"  # left for the owner
        assert not mesh.events  # and not taken for a peer's message

        mesh.unwatch(ours)
        theirs.sendall(b"y")
        started = time.monotonic()
        mesh.park(0.5)  # no longer watched: data on it does not end the park
        assert time.monotonic() - started >= 0.45

        mesh.watch(ours)
        fd = ours.fileno()
        ours.close()  # the owner closes it (the coordinator went away) ...
        theirs.close()
        ours, theirs = socket.socketpair()  # ... and the descriptor is reused
        assert fd in (ours.fileno(), theirs.fileno())
        mesh.watch(ours)  # the closed one was dropped: no "already registered"
        theirs.sendall(b"z")
        started = time.monotonic()
        mesh.park(2.0)
        assert time.monotonic() - started < 1.0
    finally:
        ours.close()
        theirs.close()
