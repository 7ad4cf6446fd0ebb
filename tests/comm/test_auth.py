"""The mesh handshake (``tokenflow.comm.auth``) over socketpairs, both sides in threads: mutual
success; refusal of a wrong secret (on either side), a wrong job, a wrong peer, a replayed MAC,
oversized, garbage and non-handshake frames; and no unpickling before authentication."""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tokenflow.comm.auth import (
    AuthenticationError,
    FrameError,
    accept_handshake,
    connect_handshake,
    new_secret,
)
from tokenflow.comm.frames import HANDSHAKE_MAX_FRAME, KIND_HANDSHAKE, KIND_PICKLE, encode_message

SECRET = b"s" * 32
JOB = "job-a"


def header(kind: int, length: int) -> bytes:
    return b"tF" + bytes([kind, 0]) + (0).to_bytes(4, "big") + length.to_bytes(8, "big")


def hs_frame(obj: Any) -> bytes:
    payload = msgpack.packb(obj)
    return header(KIND_HANDSHAKE, len(payload)) + payload


def hs_read(sock: socket.socket) -> dict[str, Any]:
    """Read one handshake frame by hand (not through the module under test)."""
    head = recv_n(sock, 16)
    assert head[:3] == b"tF" + bytes([KIND_HANDSHAKE])
    n = int.from_bytes(head[8:16], "big")
    return msgpack.unpackb(recv_n(sock, n))  # type: ignore[no-any-return]


def recv_n(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def mac(secret: bytes, *parts: bytes | int | str) -> bytes:
    """The protocol's MAC, written out from its specification: HMAC-SHA256 over the parts, each
    as a 4-byte big-endian length and its bytes (ints as 8-byte signed big-endian, str UTF-8)."""
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "big", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        h.update(len(p).to_bytes(4, "big") + p)
    return h.digest()


Outcome = tuple[str, Any]  # ("ok", result) or ("error", exception)


def run_pair(connector: Callable[[socket.socket], Any],
             acceptor: Callable[[socket.socket], Any]) -> tuple[Outcome, Outcome]:
    """Run both sides on the two ends of a socketpair, each in its own thread; each side closes
    its end when done (as the mesh does), so the other side sees EOF instead of hanging."""
    a, b = socket.socketpair()
    outcomes: dict[str, Outcome] = {}

    def side(name: str, fn: Callable[[socket.socket], Any], sock: socket.socket) -> None:
        sock.settimeout(5)
        try:
            outcomes[name] = ("ok", fn(sock))
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            outcomes[name] = ("error", exc)
        finally:
            sock.close()

    threads = [threading.Thread(target=side, args=("c", connector, a)),
               threading.Thread(target=side, args=("a", acceptor, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "handshake hung"
    return outcomes["c"], outcomes["a"]


def refused(outcome: Outcome, kind: type[BaseException], match: str = "") -> BaseException:
    status, value = outcome
    assert status == "error", f"expected a refusal, got success {value!r}"
    assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
    assert match in str(value), f"{match!r} not in {value}"
    return value


def connect(secret: bytes = SECRET, job: str = JOB, me: int = 1,
            peer: int = 0) -> Callable[[socket.socket], Any]:
    return lambda s: connect_handshake(s, secret, job, me, peer)


def accept(secret: bytes = SECRET, job: str = JOB, me: int = 0) -> Callable[[socket.socket], Any]:
    return lambda s: accept_handshake(s, secret, job, me)


# -- success -----------------------------------------------------------------------------------


@pytest.mark.parametrize("me, peer", [(1, 0), (5, 2), (0, 3)])
def test_handshake_succeeds_both_sides(me: int, peer: int) -> None:
    secret = new_secret()
    c, a = run_pair(connect(secret, me=me, peer=peer), accept(secret, me=peer))
    assert c == ("ok", None)
    assert a == ("ok", me), "the acceptor learns the connecting worker's index"


def test_new_secret_is_fresh() -> None:
    secrets = {new_secret() for _ in range(20)}
    assert len(secrets) == 20 and all(len(s) == 32 for s in secrets)


def test_spec_client_is_accepted() -> None:
    """A client written from the protocol description alone passes: the acceptor's MAC checks
    out and our MAC is taken (positive control for the rogue clients below)."""

    def client(sock: socket.socket) -> dict[str, Any]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 3, "nonce": nc}))
        reply = hs_read(sock)
        assert reply["worker"] == 0
        assert hmac.compare_digest(reply["mac"], mac(SECRET, "accept", JOB, nc, reply["nonce"], 3, 0))
        sock.sendall(hs_frame({"mac": mac(SECRET, "connect", JOB, reply["nonce"], nc, 3, 0)}))
        return hs_read(sock)

    c, a = run_pair(client, accept())
    assert c == ("ok", {"ok": True})
    assert a == ("ok", 3)


# -- wrong secret, job, peer -------------------------------------------------------------------


def test_connector_refuses_acceptor_with_wrong_secret() -> None:
    c, a = run_pair(connect(SECRET), accept(b"x" * 32))
    refused(c, AuthenticationError, "worker 0 does not know the job secret")
    refused(a, EOFError)  # the connector hung up instead of answering


def test_acceptor_refuses_connector_with_wrong_secret() -> None:
    """A client that does not check the acceptor's MAC and answers with one made from a wrong
    secret is refused, and never told ``ok``."""

    def rogue(sock: socket.socket) -> dict[str, Any]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 1, "nonce": nc}))
        reply = hs_read(sock)
        sock.sendall(hs_frame({"mac": mac(b"wrong" * 6, "connect", JOB, reply["nonce"], nc, 1, 0)}))
        return hs_read(sock)

    c, a = run_pair(rogue, accept())
    refused(a, AuthenticationError, "failed the secret check")
    refused(c, EOFError)


def test_acceptor_refuses_replayed_mac() -> None:
    """A MAC made with the right secret but for another session's nonce is refused: the MAC is
    bound to this connection's nonces."""

    def replayer(sock: socket.socket) -> dict[str, Any]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 1, "nonce": nc}))
        hs_read(sock)
        stale = b"\x00" * 16  # not the acceptor's nonce of this session
        sock.sendall(hs_frame({"mac": mac(SECRET, "connect", JOB, stale, nc, 1, 0)}))
        return hs_read(sock)

    c, a = run_pair(replayer, accept())
    refused(a, AuthenticationError, "failed the secret check")
    refused(c, EOFError)


def test_mac_of_other_worker_is_refused() -> None:
    """A peer claiming to be worker 2 but answering with worker 1's MAC is refused."""

    def impostor(sock: socket.socket) -> dict[str, Any]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 2, "nonce": nc}))
        reply = hs_read(sock)
        sock.sendall(hs_frame({"mac": mac(SECRET, "connect", JOB, reply["nonce"], nc, 1, 0)}))
        return hs_read(sock)

    c, a = run_pair(impostor, accept())
    refused(a, AuthenticationError, "claiming to be worker 2")
    refused(c, EOFError)


def test_wrong_job_refused() -> None:
    c, a = run_pair(connect(job="job-b"), accept(job="job-a"))
    refused(a, AuthenticationError, "job")
    assert "job-b" in str(a[1]) and "job-a" in str(a[1])
    refused(c, EOFError)  # refused before the acceptor said anything


def test_wrong_job_same_secret_mac_does_not_transfer() -> None:
    """Jobs sharing a secret still do not accept each other's MACs (the job is MACed)."""

    def other_job(sock: socket.socket) -> dict[str, Any]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 1, "nonce": nc}))
        reply = hs_read(sock)
        sock.sendall(hs_frame({"mac": mac(SECRET, "connect", "job-b", reply["nonce"], nc, 1, 0)}))
        return hs_read(sock)

    c, a = run_pair(other_job, accept())
    refused(a, AuthenticationError, "failed the secret check")


def test_connector_refuses_wrong_peer_index() -> None:
    c, a = run_pair(connect(me=2, peer=1), accept(me=0))
    refused(c, AuthenticationError, "expected worker 1, reached worker 0")


# -- malformed handshakes ----------------------------------------------------------------------


def test_oversized_handshake_frame_refused_without_reading() -> None:
    leftover: dict[str, bytes] = {}

    def attacker(sock: socket.socket) -> None:
        sock.sendall(header(KIND_HANDSHAKE, 1 << 30) + b"A" * 1000)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # keep the socket open until the acceptor is done

    def acceptor(sock: socket.socket) -> int:
        try:
            return accept_handshake(sock, SECRET, JOB, 0)
        finally:
            leftover["unread"] = recv_n(sock, 1000)  # the payload bytes are all still there

    c, a = run_pair(attacker, acceptor)
    refused(a, FrameError, f"{1 << 30} bytes exceeds the limit of {HANDSHAKE_MAX_FRAME}")
    assert leftover == {"unread": b"A" * 1000}


def test_oversized_reply_refused_by_connector() -> None:
    def evil_acceptor(sock: socket.socket) -> None:
        hs_read(sock)
        sock.sendall(header(KIND_HANDSHAKE, HANDSHAKE_MAX_FRAME + 1))

    c, a = run_pair(connect(), evil_acceptor)
    refused(c, FrameError, "exceeds the limit")


def test_handshake_frame_at_limit_is_read() -> None:
    """A hello of exactly ``HANDSHAKE_MAX_FRAME`` bytes (an extra padding field) is accepted."""
    nonce = os.urandom(16)
    pad = HANDSHAKE_MAX_FRAME
    while True:
        payload = msgpack.packb({"job": JOB, "worker": 1, "nonce": nonce, "pad": "p" * pad})
        if len(payload) <= HANDSHAKE_MAX_FRAME:
            break
        pad -= len(payload) - HANDSHAKE_MAX_FRAME
    payload = msgpack.packb({"job": JOB, "worker": 1, "nonce": nonce, "pad": "p" * pad})
    assert len(payload) == HANDSHAKE_MAX_FRAME

    def padded(sock: socket.socket) -> dict[str, Any]:
        sock.sendall(header(KIND_HANDSHAKE, len(payload)) + payload)
        return hs_read(sock)

    c, a = run_pair(padded, accept())
    assert c[0] == "ok" and c[1]["worker"] == 0, "the acceptor answered the hello"
    refused(a, EOFError)  # then the client hung up


@pytest.mark.parametrize("payload", [
    b"\xc1\xc1\xc1",                          # 0xc1 is never valid msgpack
    b"\x92\x01",                              # truncated array
    msgpack.packb([JOB, 1, b"n" * 16]),       # valid msgpack, not a map
    msgpack.packb({"job": JOB}) + b"\x00",    # trailing bytes
    msgpack.packb({1: 2}),                    # non-string keys: no job
], ids=["invalid", "truncated", "not-a-map", "trailing", "int-keys"])
def test_garbage_handshake_refused(payload: bytes) -> None:
    def sender(sock: socket.socket) -> None:
        sock.sendall(header(KIND_HANDSHAKE, len(payload)) + payload)
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, AuthenticationError)
    refused(c, EOFError)


@pytest.mark.parametrize("hello", [
    {"job": JOB, "worker": "1", "nonce": b"n" * 16},     # worker not an int
    {"job": JOB, "nonce": b"n" * 16},                     # no worker
    {"job": JOB, "worker": 1, "nonce": "n" * 16},         # nonce not bytes
    {"job": JOB, "worker": 1},                            # no nonce
], ids=["worker-str", "no-worker", "nonce-str", "no-nonce"])
def test_bad_hello_fields_refused(hello: dict[str, Any]) -> None:
    def sender(sock: socket.socket) -> None:
        sock.sendall(hs_frame(hello))
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, AuthenticationError, "handshake field")
    refused(c, EOFError)


def test_not_a_frame_refused() -> None:
    def sender(sock: socket.socket) -> None:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: worker\r\n\r\n")
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, FrameError, "magic")


# -- nothing is unpickled before authentication ------------------------------------------------


class Bomb:
    """Unpickling a ``Bomb`` writes its marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def test_bomb_detonates_when_unpickled(tmp_path: Path) -> None:
    """Positive control: the payload below does run code when unpickled."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(Bomb(str(marker))))
    assert marker.read_text() == "unpickled"


def test_pickle_frame_refused_before_authentication(tmp_path: Path) -> None:
    marker = tmp_path / "bomb"
    frame = b"".join(bytes(memoryview(b)) for b in encode_message(0, (0, [Bomb(str(marker))])))
    assert frame[2] == KIND_PICKLE

    def sender(sock: socket.socket) -> None:
        sock.sendall(frame)
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, AuthenticationError, f"expected a handshake frame, got kind {KIND_PICKLE}")
    assert not marker.exists(), "a payload was unpickled before authentication"


def test_pickle_in_handshake_frame_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "bomb"
    payload = pickle.dumps(Bomb(str(marker)), protocol=5)

    def sender(sock: socket.socket) -> None:
        sock.sendall(header(KIND_HANDSHAKE, len(payload)) + payload)
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, AuthenticationError, "malformed handshake")
    assert not marker.exists()


def test_pickle_after_failed_mac_not_unpickled(tmp_path: Path) -> None:
    """Data sent right behind a wrong MAC is never read."""
    marker = tmp_path / "bomb"
    data = b"".join(bytes(memoryview(b)) for b in encode_message(0, (0, [Bomb(str(marker))])))

    def rogue(sock: socket.socket) -> None:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"job": JOB, "worker": 1, "nonce": nc}))
        reply = hs_read(sock)
        sock.sendall(hs_frame({"mac": mac(b"w" * 32, "connect", JOB, reply["nonce"], nc, 1, 0)})
                     + data)
        hs_read(sock)

    c, a = run_pair(rogue, accept())
    refused(a, AuthenticationError, "failed the secret check")
    assert not marker.exists()
