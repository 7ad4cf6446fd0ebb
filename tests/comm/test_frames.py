"""Frames of the worker mesh (``tokenflow.comm.frames``): encode/decode round trips of list and
Arrow batches with integer and ``Product`` times, and ``read_frame``'s refusals over a real
``socket.socketpair()`` (bad magic, over-long declared length refused before the payload is read,
truncation, malformed payloads)."""

from __future__ import annotations

import pickle
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from tokenflow.comm.frames import (
    HEADER_SIZE,
    KIND_ARROW,
    KIND_GOODBYE,
    KIND_PICKLE,
    FrameError,
    decode_message,
    encode_control,
    encode_message,
    read_frame,
)
from tokenflow.order import Product

# The wire header, written out independently of the module: magic "tF", kind u8, flags u8,
# channel u32, payload length u64, all big-endian.


def header(kind: int, channel: int, length: int, magic: bytes = b"tF") -> bytes:
    return magic + bytes([kind, 0]) + channel.to_bytes(4, "big") + length.to_bytes(8, "big")


def join(buffers: list[Any]) -> bytes:
    return b"".join(bytes(memoryview(b)) for b in buffers)


def parse(frame: bytes) -> tuple[int, int, bytes]:
    """``(kind, channel, payload)`` of one whole frame, checking the header by hand."""
    assert frame[:2] == b"tF"
    assert frame[3] == 0  # flags
    kind = frame[2]
    channel = int.from_bytes(frame[4:8], "big")
    length = int.from_bytes(frame[8:16], "big")
    assert length == len(frame) - 16, "declared length must be the payload's length"
    return kind, channel, frame[16:]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def unread(sock: socket.socket) -> bytes:
    """Everything already waiting on ``sock`` (without blocking)."""
    sock.setblocking(False)
    chunks = []
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(10)
    return b"".join(chunks)


def sample_batch(rows: int = 5) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "key": pa.array(list(range(rows)), pa.int64()),
        "name": pa.array([None if i % 3 == 0 else f"w{i}" for i in range(rows)], pa.string()),
        "x": pa.array([i / 4 for i in range(rows)], pa.float64()),
    })


TIMES = [0, 7, 2**40, Product(3, 1), Product(Product(1, 2), 5)]


# -- encode / decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("time", TIMES, ids=repr)
def test_list_batch_round_trip(time: Any) -> None:
    batch = ["a", ("b", 2), None, b"\x00\xff", 3.5, {"k": [1, 2]}, "é" * 3]
    frame = join(encode_message(42, (time, batch)))
    kind, channel, payload = parse(frame)
    assert (kind, channel) == (KIND_PICKLE, 42)
    assert payload[:2] == b"\x80\x05", "lists travel as pickle protocol 5"
    out_time, out_batch = decode_message(kind, payload)
    assert out_batch == batch
    assert out_time == time
    assert type(out_time) is type(time)  # a Product stays a Product (not a plain tuple)


@pytest.mark.parametrize("time", TIMES, ids=repr)
def test_arrow_batch_round_trip(time: Any) -> None:
    batch = sample_batch(1000)
    frame = join(encode_message(2**32 - 1, (time, batch)))
    kind, channel, payload = parse(frame)
    assert (kind, channel) == (KIND_ARROW, 2**32 - 1)
    # Arrow payload: u32 length of the pickled time, the pickled time, one Arrow IPC stream.
    n = int.from_bytes(payload[:4], "big")
    assert pickle.loads(payload[4 : 4 + n]) == time
    ipc = pa.ipc.open_stream(pa.py_buffer(payload[4 + n :])).read_all()
    assert ipc.to_batches()[0].equals(batch)
    out_time, out_batch = decode_message(kind, bytearray(payload))
    assert out_time == time and type(out_time) is type(time)
    assert isinstance(out_batch, pa.RecordBatch)
    assert out_batch.schema == batch.schema
    assert out_batch.to_pydict() == batch.to_pydict()


def test_arrow_empty_batch_and_sliced_batch() -> None:
    empty = sample_batch(0)
    _, out = decode_message(KIND_ARROW, parse(join(encode_message(1, (0, empty))))[2])
    assert out.num_rows == 0 and out.schema == empty.schema
    sliced = sample_batch(100).slice(37, 11)
    _, out = decode_message(KIND_ARROW, parse(join(encode_message(1, (0, sliced))))[2])
    assert out.to_pydict()["key"] == list(range(37, 48))


def test_non_batch_messages_are_pickled() -> None:
    """A progress batch (any picklable object, not a ``(time, RecordBatch)`` pair)."""
    message = [((0, 1, 2), 5, -1), ((0, 1, 2), 6, 1)]
    kind, channel, payload = parse(join(encode_message(3, message)))
    assert (kind, channel) == (KIND_PICKLE, 3)
    assert decode_message(kind, payload) == message


def test_control_frame() -> None:
    assert encode_control(KIND_GOODBYE) == header(KIND_GOODBYE, 0, 0)
    assert encode_control(16, b"hello", channel=9) == header(16, 9, 5) + b"hello"


# -- read_frame over a socket ------------------------------------------------------------------


def test_read_frames_over_socketpair(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    big = sample_batch(200_000)  # several MB: the writer must run beside the reader
    messages: list[tuple[int, Any]] = [
        (5, (Product(1, 0), [1, 2, 3])),
        (6, (4, big)),
        (7, (Product(2, 3), sample_batch(3))),
    ]
    buffers: list[Any] = []
    for channel, message in messages:
        buffers.extend(encode_message(channel, message))
    buffers.append(encode_control(KIND_GOODBYE))
    writer = threading.Thread(target=lambda: a.sendall(join(buffers)))
    writer.start()
    got = [read_frame(b, 1 << 30) for _ in range(4)]
    writer.join()
    assert [(k, c) for k, c, _ in got] == [(KIND_PICKLE, 5), (KIND_ARROW, 6), (KIND_ARROW, 7),
                                          (KIND_GOODBYE, 0)]
    assert got[3][2] == b""
    assert decode_message(got[0][0], got[0][2]) == (Product(1, 0), [1, 2, 3])
    time, batch = decode_message(got[1][0], got[1][2])
    assert time == 4 and batch.equals(big)
    time, batch = decode_message(got[2][0], got[2][2])
    assert time == Product(2, 3) and batch.to_pydict() == sample_batch(3).to_pydict()


def test_bad_magic(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(header(KIND_PICKLE, 0, 3, magic=b"Tf") + b"abc")
    with pytest.raises(FrameError, match="magic"):
        read_frame(b, 1 << 20)
    assert unread(b) == b"abc"  # nothing after the header was consumed


def test_http_request_is_not_a_frame(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(FrameError, match="magic"):
        read_frame(b, 1 << 20)


def test_oversized_length_refused_before_reading(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    limit = 4096
    body = bytes(range(256)) * 8  # 2 KB of the (claimed 1 GiB) payload already sent
    a.sendall(header(KIND_PICKLE, 1, 1 << 30) + body)
    with pytest.raises(FrameError, match=f"{1 << 30} bytes exceeds the limit of {limit}"):
        read_frame(b, limit)
    assert unread(b) == body, "the payload must not be read once the length is refused"


def test_length_limit_is_inclusive(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(header(KIND_PICKLE, 2, 100) + b"x" * 100)
    assert read_frame(b, 100) == (KIND_PICKLE, 2, bytearray(b"x" * 100))
    a.sendall(header(KIND_PICKLE, 2, 101) + b"y" * 101)
    with pytest.raises(FrameError, match="exceeds the limit of 100"):
        read_frame(b, 100)
    assert unread(b) == b"y" * 101


def test_zero_length_frame(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(header(KIND_GOODBYE, 0, 0) + header(KIND_PICKLE, 1, 1) + b"z")
    assert read_frame(b, 0) == (KIND_GOODBYE, 0, bytearray())
    assert read_frame(b, 1) == (KIND_PICKLE, 1, bytearray(b"z"))


@pytest.mark.parametrize("sent", [
    b"",                                           # closed at a frame boundary
    b"tF\x01",                                     # inside the header
    header(KIND_PICKLE, 0, 100) + b"p" * 60,       # inside the payload
], ids=["boundary", "header", "payload"])
def test_truncated_frame(pair: tuple[socket.socket, socket.socket], sent: bytes) -> None:
    a, b = pair
    a.sendall(sent)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError, match="connection closed"):
        read_frame(b, 1 << 20)


# -- malformed payloads ------------------------------------------------------------------------


TIME3 = b"\x00\x00\x00\x05" + pickle.dumps(3, protocol=5)  # a valid time prefix (time 3)


def valid_arrow_payload() -> bytes:
    return parse(join(encode_message(0, (3, sample_batch(10)))))[2]


@pytest.mark.parametrize("kind, payload", [
    (KIND_PICKLE, b"not a pickle"),
    (KIND_PICKLE, b""),
    (KIND_PICKLE, pickle.dumps([1, 2, 3], protocol=5)[:-3]),   # truncated pickle
    (KIND_ARROW, b""),                                       # no time length
    (KIND_ARROW, b"\x00\x00\x00\x09abc"),                     # time length past the end
    (KIND_ARROW, TIME3),                                      # time, then no IPC stream
    (KIND_ARROW, TIME3 + b"garbage" * 10),                    # IPC stream is garbage
    (KIND_ARROW, valid_arrow_payload()[:-40]),               # truncated IPC stream
    (99, b"anything"),                                       # unknown kind
    (KIND_GOODBYE, b""),                                     # control frames carry no message
], ids=["pickle-garbage", "pickle-empty", "pickle-truncated", "arrow-empty",
        "arrow-time-overrun", "arrow-no-ipc", "arrow-ipc-garbage", "arrow-ipc-truncated",
        "unknown-kind", "goodbye"])
def test_malformed_payload(kind: int, payload: bytes) -> None:
    with pytest.raises(FrameError, match=f"(malformed|unknown) frame (of )?kind {kind}"):
        decode_message(kind, payload)


def test_valid_arrow_payload_decodes() -> None:
    """Positive control for the malformed cases built from it."""
    assert valid_arrow_payload().startswith(TIME3)
    time, batch = decode_message(KIND_ARROW, valid_arrow_payload())
    assert time == 3 and batch.num_rows == 10


def test_frame_header_size() -> None:
    assert HEADER_SIZE == 16
