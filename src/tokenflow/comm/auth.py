"""Mutual HMAC-SHA256 authentication of mesh peers with the per-job secret.

Source: docs/ARCHITECTURE.md ("Security": peers authenticate with a per-job secret before any frame is
read).  Nothing is unpickled before this handshake succeeds; handshake frames are msgpack maps of
at most ``HANDSHAKE_MAX_FRAME`` bytes.

1. connector → acceptor  ``{"job", "worker": i, "nonce": Nc}``
2. acceptor → connector  ``{"worker": j, "nonce": Ns, "mac": HMAC(secret, "accept"|Nc|Ns|i|j)}``
3. connector → acceptor  ``{"mac": HMAC(secret, "connect"|Ns|Nc|i|j)}``
4. acceptor → connector  ``{"ok": True}``

Either side closes the connection on a wrong MAC, a wrong job or an oversized frame.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
from typing import Any

import msgpack

from tokenflow.comm.frames import (
    HANDSHAKE_MAX_FRAME,
    KIND_HANDSHAKE,
    FrameError,
    encode_control,
    read_frame,
)


class AuthenticationError(ConnectionError):
    """A peer failed the handshake (wrong secret or job, or a malformed handshake)."""


def new_secret() -> bytes:
    """A fresh 32-byte per-job secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, *parts: bytes | int | str) -> bytes:
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for p in parts:
        if isinstance(p, int):
            p = p.to_bytes(8, "big", signed=True)
        elif isinstance(p, str):
            p = p.encode()
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.digest()


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(encode_control(KIND_HANDSHAKE, msgpack.packb(obj)))


def _recv(sock: socket.socket) -> dict[str, Any]:
    kind, _, payload = read_frame(sock, HANDSHAKE_MAX_FRAME)
    if kind != KIND_HANDSHAKE:
        raise AuthenticationError(f"expected a handshake frame, got kind {kind}")
    try:
        obj = msgpack.unpackb(bytes(payload), raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001
        raise AuthenticationError(f"malformed handshake: {exc}") from exc
    if not isinstance(obj, dict):
        raise AuthenticationError("malformed handshake: not a map")
    return obj


def _field(obj: dict[str, Any], name: str, kind: type) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise AuthenticationError(f"handshake field {name!r} missing or not {kind.__name__}")
    return value


def connect_handshake(sock: socket.socket, secret: bytes, job: str, me: int, peer: int) -> None:
    """Authenticate to the acceptor ``peer`` as worker ``me``.

    Raises:
        AuthenticationError: when the acceptor's MAC or identity is wrong.
        FrameError, EOFError: on a malformed handshake or a closed connection.
    """
    nonce_c = os.urandom(16)
    _send(sock, {"job": job, "worker": me, "nonce": nonce_c})
    reply = _recv(sock)
    worker = _field(reply, "worker", int)
    nonce_s = _field(reply, "nonce", bytes)
    if worker != peer:
        raise AuthenticationError(f"expected worker {peer}, reached worker {worker}")
    if not hmac.compare_digest(_field(reply, "mac", bytes),
                               _mac(secret, "accept", job, nonce_c, nonce_s, me, peer)):
        raise AuthenticationError(f"worker {peer} does not know the job secret")
    _send(sock, {"mac": _mac(secret, "connect", job, nonce_s, nonce_c, me, peer)})
    ok = _recv(sock)
    if ok.get("ok") is not True:
        raise AuthenticationError(f"worker {peer} refused the connection")


def accept_handshake(sock: socket.socket, secret: bytes, job: str, me: int) -> int:
    """Authenticate a connecting peer; returns its worker index.

    Raises:
        AuthenticationError: wrong job, wrong MAC (secret) or malformed messages.
        FrameError: a handshake frame over the size limit or with bad magic.
        EOFError: the peer closed the connection.
    """
    hello = _recv(sock)
    if hello.get("job") != job:
        raise AuthenticationError(f"connection for job {hello.get('job')!r}, this is {job!r}")
    peer = _field(hello, "worker", int)
    nonce_c = _field(hello, "nonce", bytes)
    nonce_s = os.urandom(16)
    _send(sock, {"worker": me, "nonce": nonce_s,
                 "mac": _mac(secret, "accept", job, nonce_c, nonce_s, peer, me)})
    reply = _recv(sock)
    if not hmac.compare_digest(_field(reply, "mac", bytes),
                               _mac(secret, "connect", job, nonce_s, nonce_c, peer, me)):
        raise AuthenticationError(f"connection claiming to be worker {peer} failed the secret check")
    _send(sock, {"ok": True})
    return peer


__all__ = [
    "AuthenticationError",
    "FrameError",
    "accept_handshake",
    "connect_handshake",
    "new_secret",
]
