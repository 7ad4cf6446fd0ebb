"""The publish/subscribe wire format: framed msgpack metadata with Arrow IPC bodies, token
authentication, and the validation every frame from outside a job passes.

Source: the Strymon publish/subscribe protocol (its three messages: ``InitialFrontierSnapshot``,
``LowerFrontierUpdate``, ``DataMessage``; "the time and data fields are put into separate
multi-part slots", so a filtered message is dropped without decoding its data);
docs/ARCHITECTURE.md ("Publish/subscribe"); docs/SECURITY.md (nothing from outside a job is
unpickled).

Frame (both directions)::

    header  9 bytes, big-endian: kind (u8) | meta length M (u32) | body length B (u32)
    meta    M bytes: one msgpack map (M <= MAX_META)
    body    B bytes: one Arrow IPC stream (schema + one record batch), or empty (B <= limit)

A receiver checks the kind against the kinds it expects *before* reading further, the two
lengths against its limits, then decodes the map with msgpack's own limits (no extension types,
no pickle anywhere).  Times travel as msgpack integers (``int``) or nested two-element arrays
(``tokenflow.order.Product``), at most ``MAX_TIME_DEPTH`` deep.

Authentication: the server's first frame (``HELLO``) carries a fresh 16-byte nonce; the client's
first frame carries ``mac = HMAC-SHA256(token, "tokenflow pubsub v1" | role | nonce)``.  The
token never travels; a client without it cannot produce the MAC, a replayed MAC fails against a
new nonce.  (Frames are not encrypted: run the endpoints on a private network or behind TLS
when the data is secret.)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time as clock
from collections.abc import Iterable
from typing import Any

import msgpack
import pyarrow as pa

from tokenflow.order.product import Product

VERSION = 1
"""Protocol version carried in ``HELLO``."""
MAX_META = 64 * 1024
"""Largest msgpack metadata map (bytes)."""
MAX_BODY = 64 * 1024 * 1024
"""Default largest Arrow body (bytes) a subscriber accepts; a publisher accepts none."""
MAX_TIME_DEPTH = 8
"""Deepest nesting of ``Product`` times on the wire."""
MAX_ANTICHAIN = 4096
"""Most elements of an antichain on the wire."""
NONCE_SIZE = 16
HELLO_TIMEOUT = 10.0
"""Seconds a connection has to authenticate: its first frame must be whole by then, however
slowly it trickles in (``set_deadline``)."""

HEADER = struct.Struct("!BII")

# Frame kinds.
HELLO = 1
"""server -> client: ``{"v", "nonce", "role", ...}`` (publisher: topic, partition, partitions, time)."""
SUBSCRIBE = 2
"""client -> publisher: ``{"mac", "topic"}`` (first frame of a subscriber)."""
SNAPSHOT = 3
"""publisher -> client: the seed's ``InitialFrontierSnapshot`` ``{"lower", "upper", "dropped"}``."""
FILTER = 4
"""client -> publisher: ``{"drop_upto": antichain, "since": antichain | None, "snapshot_at":
antichain | None}``; data flows after it."""
LOWER = 5
"""publisher -> client: the seed's ``LowerFrontierUpdate`` ``{"updates": [[time, +1|-1], ...]}``."""
DATA = 6
"""publisher -> client: the seed's ``DataMessage`` ``{"time"}`` + an Arrow body (or, once, for a
subscriber joining with a snapshot: ``{"snapshot": antichain}`` + the latest rows per key)."""
REFUSED = 7
"""server -> client: ``{"reason"}``, then the connection closes."""
BYE = 8
"""publisher -> client: ``{"reason"}`` (slow subscriber, shutdown); resume from your frontier."""
LIST = 9
"""client -> catalog: ``{"mac"}``; answered with ``CATALOG``."""
CATALOG = 10
"""catalog -> client: ``{"topics": {topic: {"time", "schema", "partitions": [...]}}}``."""
REGISTER = 11
"""publisher -> catalog: ``{"mac", "topic", "partition", "partitions", "host", "port", "time",
"schema"}``; answered with ``CATALOG``."""
KINDS = {HELLO: "HELLO", SUBSCRIBE: "SUBSCRIBE", SNAPSHOT: "SNAPSHOT", FILTER: "FILTER",
         LOWER: "LOWER", DATA: "DATA", REFUSED: "REFUSED", BYE: "BYE", LIST: "LIST",
         CATALOG: "CATALOG", REGISTER: "REGISTER"}
_CONTEXT = b"tokenflow pubsub v1"


class ProtocolError(ValueError):
    """A frame broke the protocol: unknown or unexpected kind, a length over its limit, bad
    msgpack, a missing or mistyped field, a malformed time or Arrow body.  The message says
    which."""


class AuthenticationError(ProtocolError):
    """The peer's MAC did not match the token (or the server refused ours)."""


def new_token() -> str:
    """A fresh random token (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def token_from(token: str | None) -> str:
    """``token``, else ``$TOKENFLOW_TOKEN``.

    Raises:
        ValueError: neither is set.
    """
    token = token or os.environ.get("TOKENFLOW_TOKEN")
    if not token:
        raise ValueError("a publish/subscribe token is needed: pass token= or set TOKENFLOW_TOKEN")
    return token


def mac(token: str, role: str, nonce: bytes) -> bytes:
    """``HMAC-SHA256(token, "tokenflow pubsub v1" | role | nonce)`` (32 bytes)."""
    return hmac.new(token.encode(), b"|".join([_CONTEXT, role.encode(), nonce]),
                    hashlib.sha256).digest()


def check_mac(token: str, role: str, nonce: bytes, meta: dict[str, Any]) -> None:
    """Raises ``AuthenticationError`` unless ``meta["mac"]`` is the MAC of ``nonce``."""
    got = meta.get("mac")
    if not isinstance(got, bytes) or not hmac.compare_digest(got, mac(token, role, nonce)):
        raise AuthenticationError("wrong or missing token")


# -- times -----------------------------------------------------------------------------------

def encode_time(time: Any) -> Any:
    """A time as msgpack-able data: ``int`` as is, ``Product`` as ``[outer, inner]``.

    Raises:
        TypeError: any other time type.
    """
    if isinstance(time, Product):
        return [encode_time(time[0]), encode_time(time[1])]
    if isinstance(time, int) and not isinstance(time, bool):
        return time
    raise TypeError(f"publish/subscribe carries int or Product times, not {type(time).__name__} "
                    f"({time!r})")


def decode_time(value: Any, depth: int = 0) -> Any:
    """The inverse of ``encode_time``.

    Raises:
        ProtocolError: not an int or a two-element array, or nested too deep.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2 and depth < MAX_TIME_DEPTH:
        return Product(decode_time(value[0], depth + 1), decode_time(value[1], depth + 1))
    raise ProtocolError(f"malformed time {shown(value)}")


def time_kind(time: Any) -> str:
    """``"int"`` or ``"product"`` (the catalog's time type of a topic)."""
    return "product" if isinstance(time, Product) else "int"


def encode_antichain(times: Iterable[Any]) -> list[Any]:
    return [encode_time(t) for t in times]


def decode_antichain(value: Any) -> list[Any]:
    """Raises ``ProtocolError`` unless ``value`` is a list of at most ``MAX_ANTICHAIN`` times."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_ANTICHAIN:
        raise ProtocolError(f"malformed antichain {shown(value)}")
    return [decode_time(v) for v in value]


# -- Arrow bodies ----------------------------------------------------------------------------

def encode_batch(batch: pa.RecordBatch) -> bytes:
    """One record batch as an Arrow IPC stream (schema + batch)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def decode_batch(body: bytes) -> pa.RecordBatch:
    """The record batch of an IPC stream body, validated in full.

    Raises:
        ProtocolError: not exactly one valid record batch.
    """
    try:
        reader = pa.ipc.open_stream(body)
        batches = list(reader)
        if len(batches) != 1:
            raise ProtocolError(f"an Arrow body holds one batch, this one {len(batches)}")
        batches[0].validate(full=True)
        return batches[0]
    except (pa.ArrowException, ValueError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"malformed Arrow body ({exc})") from None


# -- frames ----------------------------------------------------------------------------------

def frame(kind: int, meta: dict[str, Any], body: bytes = b"") -> bytes:
    """The bytes of one frame."""
    packed = msgpack.packb(meta, use_bin_type=True)
    if len(packed) > MAX_META:
        raise ValueError(f"{KINDS.get(kind, kind)} metadata of {len(packed)} bytes exceeds {MAX_META}")
    return HEADER.pack(kind, len(packed), len(body)) + packed + body


def send(sock: socket.socket, kind: int, meta: dict[str, Any], body: bytes = b"") -> None:
    sock.sendall(frame(kind, meta, body))


_DEADLINE = threading.local()


def set_deadline(when: float | None) -> None:
    """The next frame this thread receives must be whole by ``when`` (a ``time.monotonic()``
    instant; None: no deadline), else ``receive`` raises ``TimeoutError``.  A socket timeout
    bounds each ``recv`` only, so a peer sending a byte now and then would otherwise hold the
    connection for ever; a server sets this before a peer's first frame.  ``receive`` clears
    it (the deadline covers one frame)."""
    _DEADLINE.when = when


def _recv_exactly(sock: socket.socket, n: int, deadline: float | None = None,
                  timeout: float | None = None) -> bytes:
    if n == 0:
        return b""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - clock.monotonic()
            if left <= 0:
                raise TimeoutError(f"frame not whole in time ({got} of {n} bytes)")
            sock.settimeout(left if timeout is None else min(left, timeout))
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def receive(sock: socket.socket, expected: Iterable[int],
            max_body: int = 0) -> tuple[int, dict[str, Any], bytes]:
    """Read one frame of a kind in ``expected``: ``(kind, meta, body)`` (by the thread's
    deadline, if ``set_deadline`` set one).

    Raises:
        ProtocolError: an unexpected kind, a length over ``MAX_META`` / ``max_body``, or
            metadata that is not a msgpack map with string keys.
        ConnectionError / OSError / TimeoutError: the connection ended or timed out.
    """
    deadline = getattr(_DEADLINE, "when", None)
    if deadline is None:
        return _receive(sock, expected, max_body, None, None)
    timeout = sock.gettimeout()
    try:
        return _receive(sock, expected, max_body, deadline, timeout)
    finally:
        _DEADLINE.when = None
        sock.settimeout(timeout)


def _receive(sock: socket.socket, expected: Iterable[int], max_body: int, deadline: float | None,
             timeout: float | None) -> tuple[int, dict[str, Any], bytes]:
    kind, meta_len, body_len = HEADER.unpack(_recv_exactly(sock, HEADER.size, deadline, timeout))
    allowed = set(expected)
    if kind not in allowed:
        names = "/".join(KINDS.get(k, str(k)) for k in sorted(allowed))
        raise ProtocolError(f"expected a {names} frame, got kind {kind}")
    if meta_len > MAX_META:
        raise ProtocolError(f"{KINDS[kind]} metadata of {meta_len} bytes exceeds {MAX_META}")
    if body_len > max_body:
        raise ProtocolError(f"{KINDS[kind]} body of {body_len} bytes exceeds {max_body}")
    meta = unpack_meta(_recv_exactly(sock, meta_len, deadline, timeout), KINDS[kind])
    return kind, meta, _recv_exactly(sock, body_len, deadline, timeout)


def unpack_meta(data: bytes, what: str) -> dict[str, Any]:
    """Decode a metadata map (msgpack, no extension types, bounded sizes).

    Raises:
        ProtocolError: not a map with string keys.
    """
    try:
        meta = msgpack.unpackb(data, raw=False, strict_map_key=True,
                               max_str_len=MAX_META, max_bin_len=MAX_META,
                               max_array_len=MAX_ANTICHAIN * 2, max_map_len=1024,
                               max_ext_len=0)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types on garbage
        raise ProtocolError(f"{what} metadata is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"{what} metadata is not a map")
    return meta


def field(meta: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``meta[name]`` checked to be of ``kind``.

    Raises:
        ProtocolError: missing or of another type.
    """
    value = meta.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ProtocolError(f"{what}: field {name!r} missing or malformed ({shown(value)})")
    return value


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (for error messages about peer input)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_url(url: str) -> tuple[str, int]:
    """``tokenflow://host:port`` (or ``host:port``) as ``(host, port)``.

    Raises:
        ValueError: no port, or a port out of range.
    """
    rest = url.split("://", 1)[1] if "://" in url else url
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected tokenflow://HOST:PORT, got {url!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
