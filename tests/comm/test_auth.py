"""The mesh handshake (``tokenflow.comm.auth``) over socketpairs, both sides in threads: mutual
success with keys that follow the specification (HKDF written out here) and differ per
connection and direction; refusal of a wrong secret (on either side), a wrong job, version or
peer, a replayed MAC, oversized, garbage and non-handshake frames; one deadline for the whole
handshake against a trickling peer; and no unpickling before authentication."""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tokenflow.comm.auth import (
    AuthenticationError,
    FrameError,
    Session,
    accept_handshake,
    connect_handshake,
    job_secret,
    new_secret,
)
from tokenflow.comm.frames import (
    HANDSHAKE_MAX_FRAME,
    KIND_GOODBYE,
    KIND_HANDSHAKE,
    KIND_PICKLE,
    KIND_READY,
    FrameIntegrityError,
    decode_message,
    encode_payload,
)

SECRET = b"s" * 32
JOB = "job-a"


def header(kind: int, length: int, flags: int = 0) -> bytes:
    return b"tF" + bytes([kind, flags]) + (0).to_bytes(4, "big") + length.to_bytes(8, "big")


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


def encode(*parts: bytes | int | str) -> bytes:
    """The protocol's encoding of a sequence, written out from its specification: each part as
    a 4-byte big-endian length and its bytes (ints as 8-byte signed big-endian, str UTF-8)."""
    out = b""
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "big", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        out += len(p).to_bytes(4, "big") + p
    return out


def mac(secret: bytes, *parts: bytes | int | str) -> bytes:
    """The protocol's MAC: HMAC-SHA256 keyed with the secret over the encoded parts."""
    return hmac.new(secret, encode(*parts), hashlib.sha256).digest()


def keys(secret: bytes, job: str, nc: bytes, ns: bytes, i: int, j: int) -> tuple[bytes, bytes]:
    """The connection's keys from the specification: HKDF-SHA256, salt ``Nc|Ns``, info
    ``"tokenflow mesh v2 keys"|job|i|j``, 64 bytes = (connector → acceptor, acceptor →
    connector)."""
    okm = HKDF(hashes.SHA256(), 64, nc + ns, encode("tokenflow mesh v2 keys", job, i, j)).derive(secret)
    return okm[:32], okm[32:]


def nonce(seq: int) -> bytes:
    return bytes(4) + seq.to_bytes(8, "big")


def read_sealed(sock: socket.socket, key: bytes, seq: int) -> tuple[int, bytes]:
    """Read and open one sealed frame by hand: ``(kind, payload)``."""
    head = recv_n(sock, 16)
    assert head[:2] == b"tF" and head[3] == 1
    body = recv_n(sock, int.from_bytes(head[8:16], "big"))
    return head[2], AESGCM(key).decrypt(nonce(seq), body, head)


def pickle_frame(message: Any) -> bytes:
    """A data frame in the clear, as version 1 of the protocol sent them."""
    payload = pickle.dumps(message, protocol=5)
    return header(KIND_PICKLE, len(payload)) + payload


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
    assert c[0] == "ok" and isinstance(c[1], Session) and c[1].peer == peer
    assert a[0] == "ok" and a[1].peer == me, "the acceptor learns the connecting worker's index"


def test_new_secret_is_fresh() -> None:
    secrets = {new_secret() for _ in range(20)}
    assert len(secrets) == 20 and all(len(s) == 32 for s in secrets)


def test_spec_client_is_accepted() -> None:
    """A client written from the protocol description alone passes: the acceptor's MAC checks
    out, our MAC is taken, the acceptor's key confirmation opens with the key derived here
    (HKDF, frame 0 of its direction), and a frame sealed here with ours reaches the acceptor
    (positive control for the rogue clients below)."""
    got: dict[str, Any] = {}

    def client(sock: socket.socket) -> tuple[int, bytes]:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 3, "nonce": nc}))
        reply = hs_read(sock)
        assert reply["worker"] == 0
        assert hmac.compare_digest(reply["mac"], mac(SECRET, "accept", JOB, nc, reply["nonce"], 3, 0))
        sock.sendall(hs_frame({"mac": mac(SECRET, "connect", JOB, reply["nonce"], nc, 3, 0)}))
        out_key, in_key = keys(SECRET, JOB, nc, reply["nonce"], 3, 0)
        ready = read_sealed(sock, in_key, 0)
        payload = pickle.dumps((1, ["from the spec client"]), protocol=5)
        head = header(KIND_PICKLE, len(payload) + 16, flags=1)
        sock.sendall(head + AESGCM(out_key).encrypt(nonce(0), payload, head))
        sock.recv(1)  # until the acceptor is done
        return ready

    def acceptor(sock: socket.socket) -> int:
        session = accept_handshake(sock, SECRET, JOB, 0)
        kind, _, payload = session.opener.read(sock, 1 << 20)
        got["message"] = decode_message(kind, payload)
        return session.peer

    c, a = run_pair(client, acceptor)
    assert c == ("ok", (KIND_READY, b""))
    assert a == ("ok", 3)
    assert got["message"] == (1, ["from the spec client"])


def exchange_after_handshake(secret: bytes = SECRET) -> tuple[Outcome, Outcome]:
    """Both sides handshake, then each seals two messages and opens the other's two."""

    def talk(session: Session, sock: socket.socket, who: str) -> list[Any]:
        frames = [session.sealer.seal(7, encode_payload((k, [f"{who} {k}"]))) for k in range(2)]
        sock.sendall(b"".join(bytes(f) for f in frames))
        out = []
        for _ in range(2):
            kind, _, payload = session.opener.read(sock, 1 << 20)
            out.append(decode_message(kind, payload))
        return out

    return run_pair(lambda s: talk(connect_handshake(s, secret, JOB, 1, 0), s, "connector"),
                    lambda s: talk(accept_handshake(s, secret, JOB, 0), s, "acceptor"))


def test_sessions_interoperate_in_both_directions() -> None:
    c, a = exchange_after_handshake()
    assert c == ("ok", [(0, ["acceptor 0"]), (1, ["acceptor 1"])])
    assert a == ("ok", [(0, ["connector 0"]), (1, ["connector 1"])])


def test_keys_differ_per_connection_and_direction() -> None:
    """Two connections between the same workers with the same secret get four different
    keys: a frame recorded on one connection (or echoed back) opens on no other."""
    sessions = [run_pair(connect(), accept()) for _ in range(2)]
    sealers = [side[1].sealer for pair in sessions for side in pair]
    probe = [bytes(s.seal_control(KIND_GOODBYE)) for s in sealers]
    assert len(set(probe)) == 4
    # the connector's first frame of connection 0 does not open as connection 1's
    a, b = socket.socketpair()
    with a, b:
        a.sendall(probe[0])
        with pytest.raises(FrameIntegrityError):
            sessions[1][1][1].opener.read(b, 1 << 20)
        a.sendall(probe[0])  # nor echoed back to the connector that sent it
        with pytest.raises(FrameIntegrityError):
            sessions[0][0][1].opener.read(b, 1 << 20)


def test_version_1_peer_refused() -> None:
    """A hello without ``"v"`` (protocol 1, whose frames were not sealed) is refused."""

    def old(sock: socket.socket) -> dict[str, Any]:
        sock.sendall(hs_frame({"job": JOB, "worker": 1, "nonce": os.urandom(16)}))
        return hs_read(sock)

    c, a = run_pair(old, accept())
    refused(a, AuthenticationError, "peer speaks mesh protocol 1, this worker speaks 2")
    assert a[1].reason == "wrong version"  # type: ignore[attr-defined]


def test_acceptor_without_key_confirmation_refused() -> None:
    """An acceptor that answers step 4 in the clear (protocol 1's ``{"ok": True}``) is
    refused: the connector wants a frame sealed with the new key."""

    def old_acceptor(sock: socket.socket) -> None:
        hello = hs_read(sock)
        ns = os.urandom(16)
        sock.sendall(hs_frame({"worker": 0, "nonce": ns,
                               "mac": mac(SECRET, "accept", JOB, hello["nonce"], ns, 1, 0)}))
        hs_read(sock)
        sock.sendall(hs_frame({"ok": True}))
        sock.recv(1)

    c, a = run_pair(connect(), old_acceptor)
    refused(c, AuthenticationError, "worker 0 did not confirm the keys")


def test_handshake_deadline_covers_the_whole_handshake() -> None:
    """A peer that sends its hello one byte every 0.1 s (so no single read ever times out)
    is dropped when the handshake's one deadline passes."""
    hello = hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": os.urandom(16)})

    def trickler(sock: socket.socket) -> None:
        for byte in hello:
            sock.sendall(bytes([byte]))
            time.sleep(0.1)
        hs_read(sock)

    start = time.monotonic()
    c, a = run_pair(trickler, lambda s: accept_handshake(s, SECRET, JOB, 0,
                                                         deadline=time.monotonic() + 0.8))
    refused(a, TimeoutError, "deadline passed")
    assert time.monotonic() - start < 8, "the trickler would have needed ~6 s"


def test_short_nonce_refused() -> None:
    def sender(sock: socket.socket) -> None:
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": b"n"}))
        hs_read(sock)

    c, a = run_pair(sender, accept())
    refused(a, AuthenticationError, "'nonce' has 1 bytes, not 16")


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
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": nc}))
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
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": nc}))
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
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 2, "nonce": nc}))
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
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": nc}))
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
        payload = msgpack.packb({"v": 2, "job": JOB, "worker": 1, "nonce": nonce, "pad": "p" * pad})
        if len(payload) <= HANDSHAKE_MAX_FRAME:
            break
        pad -= len(payload) - HANDSHAKE_MAX_FRAME
    payload = msgpack.packb({"v": 2, "job": JOB, "worker": 1, "nonce": nonce, "pad": "p" * pad})
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
    error = refused(a, AuthenticationError)
    refused(c, EOFError)
    reason = str(error).split(": ", 1)[1]  # "malformed handshake: <what msgpack said>"
    assert reason.strip() and error.reason == "bad handshake", f"no reason given: {error}"  # type: ignore[attr-defined]
    if payload == b"\xc1\xc1\xc1":
        assert str(error) == "malformed handshake: FormatError"  # msgpack's own message is empty


@pytest.mark.parametrize("hello", [
    {"v": 2, "job": JOB, "worker": "1", "nonce": b"n" * 16},     # worker not an int
    {"v": 2, "job": JOB, "worker": True, "nonce": b"n" * 16},    # worker a bool
    {"v": 2, "job": JOB, "nonce": b"n" * 16},                     # no worker
    {"v": 2, "job": JOB, "worker": 1, "nonce": "n" * 16},         # nonce not bytes
    {"v": 2, "job": JOB, "worker": 1},                            # no nonce
], ids=["worker-str", "worker-bool", "no-worker", "nonce-str", "no-nonce"])
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
    frame = pickle_frame((0, [Bomb(str(marker))]))
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
    data = pickle_frame((0, [Bomb(str(marker))]))

    def rogue(sock: socket.socket) -> None:
        nc = os.urandom(16)
        sock.sendall(hs_frame({"v": 2, "job": JOB, "worker": 1, "nonce": nc}))
        reply = hs_read(sock)
        sock.sendall(hs_frame({"mac": mac(b"w" * 32, "connect", JOB, reply["nonce"], nc, 1, 0)})
                     + data)
        hs_read(sock)

    c, a = run_pair(rogue, accept())
    refused(a, AuthenticationError, "failed the secret check")
    assert not marker.exists()


# -- a secret the job does not carry (TOKENFLOW_SECRET_FILE) -----------------------------------


def test_job_secret_without_file_is_the_secret() -> None:
    assert job_secret(SECRET, environ={}) == SECRET


def test_job_secret_mixes_the_file(tmp_path: Path) -> None:
    """HKDF-SHA256(ikm = file contents stripped, salt = job secret, info "tokenflow job secret
    v2"): different from the job secret, and different for another file or another job."""
    site, other = tmp_path / "site", tmp_path / "other"
    site.write_text("a" * 64 + "\n")
    other.write_text("b" * 64)
    mixed = job_secret(SECRET, environ={"TOKENFLOW_SECRET_FILE": str(site)})
    assert mixed == HKDF(hashes.SHA256(), 32, SECRET, b"tokenflow job secret v2").derive(b"a" * 64)
    assert mixed != SECRET
    assert mixed != job_secret(SECRET, environ={"TOKENFLOW_SECRET_FILE": str(other)})
    assert mixed != job_secret(b"t" * 32, environ={"TOKENFLOW_SECRET_FILE": str(site)})


def test_job_secret_file_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="TOKENFLOW_SECRET_FILE=.*cannot be read"):
        job_secret(SECRET, environ={"TOKENFLOW_SECRET_FILE": str(tmp_path / "missing")})
    (tmp_path / "short").write_text("tiny\n")
    with pytest.raises(ValueError, match="holds 4 bytes; it needs at least 16"):
        job_secret(SECRET, environ={"TOKENFLOW_SECRET_FILE": str(tmp_path / "short")})


def test_worker_without_the_secret_file_cannot_join(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that share the file form the mesh; one that knows only the job secret (what
    a reader of the closure knows) is refused."""
    from tokenflow.comm.tcp import MeshSetupError, TcpMesh, bind_listener

    site = tmp_path / "site"
    site.write_text(os.urandom(32).hex())
    monkeypatch.setenv("TOKENFLOW_SECRET_FILE", str(site))

    def pair(second_has_file: bool) -> list[BaseException | None]:
        listeners = [bind_listener(), bind_listener()]
        addresses = [s.getsockname()[:2] for s in listeners]
        first = TcpMesh(0, 2, listeners[0], SECRET, JOB)
        if not second_has_file:
            monkeypatch.delenv("TOKENFLOW_SECRET_FILE")
        meshes = [first, TcpMesh(1, 2, listeners[1], SECRET, JOB)]
        outcome: list[BaseException | None] = [None, None]

        def run(i: int) -> None:
            try:
                meshes[i].connect(addresses, timeout=3)
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for m in meshes:
            m.close()
        return outcome

    assert pair(second_has_file=True) == [None, None]
    refused_pair = pair(second_has_file=False)
    assert isinstance(refused_pair[1], MeshSetupError)
    assert "worker 0 does not know the job secret" in str(refused_pair[1])
