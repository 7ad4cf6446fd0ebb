"""Length-prefixed frames of the intra-job worker mesh.

Source: docs/ARCHITECTURE.md ("Data plane", "Security").  A frame is a 16-byte header — magic
``b"tF"``, kind (u8), flags (u8), channel (u32), payload length (u64), big-endian — followed by
the payload.  Data messages ``(time, batch)`` travel as pickle protocol 5 for list
batches (``KIND_PICKLE``) or as Arrow IPC for ``RecordBatch``es (``KIND_ARROW``: u32 length and
pickled time, then one IPC stream).  Pickle is only ever read from peers that passed the HMAC
handshake (``tokenflow.comm.auth``).  Every reader checks the declared length against a limit
*before* reading the payload.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

import pyarrow as pa

MAGIC = b"tF"
HEADER = struct.Struct("!2sBBIQ")
HEADER_SIZE = HEADER.size  # 16 bytes

KIND_PICKLE = 1
KIND_ARROW = 2
KIND_GOODBYE = 3
KIND_HANDSHAKE = 16

DEFAULT_MAX_FRAME = 1 << 30
"""Largest payload accepted on an authenticated connection (1 GiB)."""

HANDSHAKE_MAX_FRAME = 4096
"""Largest payload accepted before authentication."""

_TIME_LEN = struct.Struct("!I")


class FrameError(ConnectionError):
    """A malformed or oversized frame: the connection that sent it is closed."""


def encode_message(channel: int, message: Any) -> list[bytes | memoryview | pa.Buffer]:
    """Frame ``message`` for ``channel``: header and payload buffers, ready for ``sendmsg``."""
    if isinstance(message, tuple) and len(message) == 2 and isinstance(message[1], pa.RecordBatch):
        time, batch = message
        time_bytes = pickle.dumps(time, protocol=5)
        mock = pa.MockOutputStream()  # measure first, then write once into an exact buffer
        with pa.ipc.new_stream(mock, batch.schema) as writer:
            writer.write_batch(batch)
        body = pa.allocate_buffer(mock.size())
        with pa.ipc.new_stream(pa.FixedSizeBufferWriter(body), batch.schema) as writer:
            writer.write_batch(batch)
        prefix = _TIME_LEN.pack(len(time_bytes)) + time_bytes
        header = HEADER.pack(MAGIC, KIND_ARROW, 0, channel, len(prefix) + body.size)
        return [header + prefix, body]
    payload = pickle.dumps(message, protocol=5)
    return [HEADER.pack(MAGIC, KIND_PICKLE, 0, channel, len(payload)), payload]


def encode_control(kind: int, payload: bytes = b"", channel: int = 0) -> bytes:
    """A frame of ``kind`` with a raw payload (handshake messages, goodbye)."""
    return HEADER.pack(MAGIC, kind, 0, channel, len(payload)) + payload


def decode_message(kind: int, payload: bytes | bytearray | memoryview) -> Any:
    """The message carried by a data frame's payload.

    Raises:
        FrameError: for an unknown kind or an unreadable payload.
    """
    try:
        if kind == KIND_PICKLE:
            return pickle.loads(payload)
        if kind == KIND_ARROW:
            view = memoryview(payload)
            (n,) = _TIME_LEN.unpack_from(view, 0)
            time = pickle.loads(view[4 : 4 + n])
            reader = pa.ipc.open_stream(pa.py_buffer(view[4 + n :]))
            return time, reader.read_next_batch()
    except FrameError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed frame
        raise FrameError(f"malformed frame of kind {kind}: {exc}") from exc
    raise FrameError(f"unknown frame kind {kind}")


def recv_exactly(sock: socket.socket, n: int) -> bytearray:
    """Read exactly ``n`` bytes.

    Raises:
        EOFError: when the peer closes the connection first (with the bytes read so far).
    """
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


def read_frame(sock: socket.socket, max_payload: int) -> tuple[int, int, bytearray]:
    """Read one frame: ``(kind, channel, payload)``.

    Raises:
        FrameError: bad magic, or a declared length over ``max_payload`` (nothing more is read).
        EOFError: the peer closed the connection at a frame boundary or inside a frame.
    """
    header = recv_exactly(sock, HEADER_SIZE)
    magic, kind, _flags, channel, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {bytes(magic)!r}")
    if length > max_payload:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_payload} bytes")
    payload = recv_exactly(sock, length) if length else bytearray()
    return kind, channel, payload
