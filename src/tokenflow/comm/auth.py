"""Mutual authentication of mesh peers with the per-job secret, and per-connection keys.

Source: docs/ARCHITECTURE.md ("Security"), docs/SECURITY.md ("Handshake and keys");
"HMAC-based Extract-and-Expand Key Derivation Function (HKDF)" (RFC 5869) for the keys.
Nothing is unpickled before this handshake succeeds; handshake frames are msgpack maps of at
most ``HANDSHAKE_MAX_FRAME`` bytes, read in the clear.  ``i`` is the connecting worker, ``j``
the accepting one, ``Nc`` and ``Ns`` fresh 16-byte nonces, ``MAC`` HMAC-SHA256 keyed with the
job secret over length-prefixed parts (``_mac``):

1. connector → acceptor  ``{"v": 2, "job", "worker": i, "nonce": Nc}``
2. acceptor → connector  ``{"worker": j, "nonce": Ns, "mac": MAC("accept"|job|Nc|Ns|i|j)}``
3. connector → acceptor  ``{"mac": MAC("connect"|job|Ns|Nc|i|j)}``
4. acceptor → connector  a *sealed* ``KIND_READY`` frame (sequence number 0): key confirmation.

Both sides then hold the keys of ``derive_keys`` — HKDF-SHA256 of the secret, salted with
``Nc|Ns``, bound to the job and both indices — one per direction, fresh for every connection;
every later frame is sealed with them (``tokenflow.comm.frames.FrameSealer``).  Either side
closes the connection on a wrong MAC, job, version or peer, an oversized frame, or when the
whole handshake overruns its deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgpack
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tokenflow.comm.frames import (
    HANDSHAKE_MAX_FRAME,
    KEY_SIZE,
    KIND_HANDSHAKE,
    KIND_READY,
    REKEY_BYTES,
    FrameError,
    FrameIntegrityError,
    FrameOpener,
    FrameSealer,
    _describe,
    encode_control,
    read_frame,
)

SECRET_FILE_ENV = "TOKENFLOW_SECRET_FILE"
"""Environment variable naming a file whose contents every worker mixes into the job secret
(``job_secret``): a secret that does not travel with the job (e.g. in a Spark task closure)."""

PROTOCOL_VERSION = 2
"""Mesh protocol version (1: frames after the handshake in the clear; 2: sealed frames)."""

NONCE_SIZE = 16
"""Bytes of each side's handshake nonce."""

_KEY_INFO = "tokenflow mesh v2 keys"


class AuthenticationError(ConnectionError):
    """A peer failed the handshake (wrong secret, job, version or peer, or a malformed
    handshake).

    Attributes:
        reason: a short category for rate-limited logs ("bad handshake", "wrong secret",
            "wrong job", "wrong peer").
    """

    reason = "bad handshake"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class Session:
    """The authenticated connection's state after the handshake.

    Attributes:
        peer: the other worker's index.
        sealer: seals this side's frames (its direction's key).
        opener: opens the peer's frames (the other direction's key).
    """

    __slots__ = ("peer", "sealer", "opener")

    def __init__(self, peer: int, sealer: FrameSealer, opener: FrameOpener) -> None:
        self.peer = peer
        self.sealer = sealer
        self.opener = opener


def new_secret() -> bytes:
    """A fresh 32-byte per-job secret."""
    return secrets.token_bytes(32)


def job_secret(secret: bytes, environ: Mapping[str, str] | None = None) -> bytes:
    """The key the mesh authenticates with: ``secret`` (the per-job secret the launcher gave
    the worker) as it is, or — when ``TOKENFLOW_SECRET_FILE`` names a file — 32 bytes of
    HKDF-SHA256 with the file's contents (surrounding whitespace stripped) as input keying
    material and ``secret`` as salt.  Then a reader of the job's closure, which carries
    ``secret`` only, cannot join or read the mesh; every worker of the job needs the same
    file (a worker without it fails the handshake: "does not know the job secret").

    Raises:
        OSError: the file cannot be read.
        ValueError: the file holds fewer than 16 bytes.
    """
    environ = os.environ if environ is None else environ
    path = environ.get(SECRET_FILE_ENV)
    if not path:
        return secret
    try:
        site = Path(path).read_bytes().strip()
    except OSError as exc:
        raise OSError(f"{SECRET_FILE_ENV}={path!r} cannot be read: {exc}") from exc
    if len(site) < 16:
        raise ValueError(f"{SECRET_FILE_ENV}={path!r} holds {len(site)} bytes; it needs at least 16 "
                         "(e.g. `openssl rand -hex 32`)")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=secret,
                info=b"tokenflow job secret v2").derive(site)


def _parts(*parts: bytes | int | str) -> bytes:
    """Each part as a 4-byte big-endian length and its bytes (ints 8-byte signed big-endian,
    str UTF-8): an unambiguous encoding of the sequence."""
    out = bytearray()
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "big", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        out += len(p).to_bytes(4, "big")
        out += p
    return bytes(out)


def _mac(secret: bytes, *parts: bytes | int | str) -> bytes:
    return hmac.new(secret, _parts(*parts), hashlib.sha256).digest()


def derive_keys(secret: bytes, job: str, nonce_c: bytes, nonce_s: bytes, connector: int,
                acceptor: int) -> tuple[bytes, bytes]:
    """The connection's two 32-byte frame keys: ``(connector → acceptor, acceptor →
    connector)``.

    HKDF-SHA256 (RFC 5869) with the job secret as input keying material, ``Nc|Ns`` as salt and
    the length-prefixed parts ``"tokenflow mesh v2 keys"|job|i|j`` as info, 64 bytes split in
    two.  Fresh nonces make the keys of every connection different, so a frame recorded on one
    connection does not open on another, in either direction.
    """
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=nonce_c + nonce_s,
               info=_parts(_KEY_INFO, job, connector, acceptor)).derive(secret)
    return okm[:KEY_SIZE], okm[KEY_SIZE:]


def _sendall(sock: socket.socket, deadline: float | None, data: bytes | memoryview) -> None:
    """``sendall`` within ``deadline`` (a peer that does not read cannot hold us past it)."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("handshake deadline passed")
        sock.settimeout(left)
    sock.sendall(data)


def _send(sock: socket.socket, deadline: float | None, obj: dict[str, Any]) -> None:
    _sendall(sock, deadline, encode_control(KIND_HANDSHAKE, msgpack.packb(obj)))


def _recv(sock: socket.socket, deadline: float | None) -> dict[str, Any]:
    kind, _, payload = read_frame(sock, HANDSHAKE_MAX_FRAME, deadline)
    if kind != KIND_HANDSHAKE:
        raise AuthenticationError(f"expected a handshake frame, got kind {kind}")
    try:
        obj = msgpack.unpackb(bytes(payload), raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any msgpack failure is a malformed handshake
        raise AuthenticationError(f"malformed handshake: {_describe(exc)}") from exc
    if not isinstance(obj, dict):
        raise AuthenticationError(f"malformed handshake: a {type(obj).__name__}, not a map")
    return obj


def _shown(value: Any, limit: int = 60) -> str:
    """A peer-supplied value for a log line: its repr (no raw newlines), cut to ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(obj: dict[str, Any], name: str, kind: type) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise AuthenticationError(f"handshake field {name!r} missing or not {kind.__name__}")
    return value


def _nonce(obj: dict[str, Any]) -> bytes:
    nonce: bytes = _field(obj, "nonce", bytes)
    if len(nonce) != NONCE_SIZE:
        raise AuthenticationError(f"handshake field 'nonce' has {len(nonce)} bytes, not {NONCE_SIZE}")
    return nonce


def connect_handshake(sock: socket.socket, secret: bytes, job: str, me: int, peer: int,
                      deadline: float | None = None, rekey_bytes: int = REKEY_BYTES) -> Session:
    """Authenticate to the acceptor ``peer`` as worker ``me``; the connection's ``Session``.

    Args:
        deadline: ``time.monotonic()`` time by which the whole handshake must be done.
        rekey_bytes: see ``tokenflow.comm.frames.REKEY_BYTES`` (both sides must agree).

    Raises:
        AuthenticationError: when the acceptor's MAC, identity or key confirmation is wrong.
        FrameError, EOFError: on a malformed handshake or a closed connection.
        TimeoutError: when ``deadline`` passes.
    """
    nonce_c = os.urandom(NONCE_SIZE)
    _send(sock, deadline, {"v": PROTOCOL_VERSION, "job": job, "worker": me, "nonce": nonce_c})
    reply = _recv(sock, deadline)
    worker = _field(reply, "worker", int)
    nonce_s = _nonce(reply)
    if worker != peer:
        raise AuthenticationError(f"expected worker {peer}, reached worker {worker}", "wrong peer")
    if not hmac.compare_digest(_field(reply, "mac", bytes),
                               _mac(secret, "accept", job, nonce_c, nonce_s, me, peer)):
        raise AuthenticationError(f"worker {peer} does not know the job secret", "wrong secret")
    _send(sock, deadline, {"mac": _mac(secret, "connect", job, nonce_s, nonce_c, me, peer)})
    out_key, in_key = derive_keys(secret, job, nonce_c, nonce_s, me, peer)
    session = Session(peer, FrameSealer(out_key, rekey_bytes), FrameOpener(in_key, rekey_bytes))
    try:
        kind, _, _ = session.opener.read(sock, HANDSHAKE_MAX_FRAME, deadline)
    except FrameIntegrityError as exc:
        raise AuthenticationError(f"worker {peer}'s key confirmation failed: {exc}",
                                  "wrong secret") from exc
    except FrameError as exc:
        raise AuthenticationError(f"worker {peer} did not confirm the keys: {exc}") from exc
    if kind != KIND_READY:
        raise AuthenticationError(f"worker {peer} sent frame kind {kind} instead of its key "
                                  "confirmation")
    return session


def accept_handshake(sock: socket.socket, secret: bytes, job: str, me: int,
                     deadline: float | None = None, rekey_bytes: int = REKEY_BYTES,
                     admit: Callable[[int], None] | None = None) -> Session:
    """Authenticate a connecting peer; the connection's ``Session`` (``session.peer`` is the
    connecting worker's index).

    Args:
        deadline: ``time.monotonic()`` time by which the whole handshake must be done (one
            deadline for every read and write, so a peer trickling bytes cannot extend it).
        rekey_bytes: see ``tokenflow.comm.frames.REKEY_BYTES``.
        admit: called with the peer's index once its MAC verified and before the key
            confirmation is sent; an ``AuthenticationError`` it raises refuses the peer (the
            mesh checks the index and claims the connection there).

    Raises:
        AuthenticationError: wrong version, job or MAC (secret), or malformed messages.
        FrameError: a handshake frame over the size limit or with bad magic.
        EOFError: the peer closed the connection.
        TimeoutError: ``deadline`` passed.
    """
    hello = _recv(sock, deadline)
    version = hello.get("v", 1)  # version 1 had no "v"
    if version != PROTOCOL_VERSION:
        raise AuthenticationError(f"peer speaks mesh protocol {_shown(version)}, this worker speaks "
                                  f"{PROTOCOL_VERSION}", "wrong version")
    if hello.get("job") != job:
        raise AuthenticationError(f"connection for job {_shown(hello.get('job'))}, this is {job!r}",
                                  "wrong job")
    peer = _field(hello, "worker", int)
    nonce_c = _nonce(hello)
    nonce_s = os.urandom(NONCE_SIZE)
    _send(sock, deadline, {"worker": me, "nonce": nonce_s,
                                    "mac": _mac(secret, "accept", job, nonce_c, nonce_s, peer, me)})
    reply = _recv(sock, deadline)
    if not hmac.compare_digest(_field(reply, "mac", bytes),
                               _mac(secret, "connect", job, nonce_s, nonce_c, peer, me)):
        raise AuthenticationError(f"connection claiming to be worker {peer} failed the secret check",
                                  "wrong secret")
    if admit is not None:
        admit(peer)
    in_key, out_key = derive_keys(secret, job, nonce_c, nonce_s, peer, me)
    session = Session(peer, FrameSealer(out_key, rekey_bytes), FrameOpener(in_key, rekey_bytes))
    _sendall(sock, deadline, session.sealer.seal_control(KIND_READY))
    return session


__all__ = [
    "PROTOCOL_VERSION",
    "AuthenticationError",
    "FrameError",
    "Session",
    "accept_handshake",
    "connect_handshake",
    "derive_keys",
    "job_secret",
    "new_secret",
]
