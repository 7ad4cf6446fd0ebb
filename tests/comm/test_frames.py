"""Frames of the worker mesh (``tokenflow.comm.frames``).

* Payloads: list and Arrow batches with integer and ``Product`` times round-trip, in the
  documented layout.
* Sealed frames: the wire format written out independently (header as associated data,
  AES-256-GCM with the nonce ``0^32 | seq``, rekeying by HKDF-Expand) matches what
  ``FrameSealer`` sends, and ``FrameOpener`` opens it; a flipped bit anywhere, a wrong key, a
  replayed, reordered or dropped frame, or a frame in the clear is refused before anything is
  decoded (a pickle bomb behind a bad tag never runs).
* ``read_frame`` (the handshake's reader in the clear) over a real ``socket.socketpair()``:
  bad magic, over-long declared length refused before the payload is read, truncation, sealed
  frames refused; ``recv_exactly``'s deadline bounds a whole read against a trickling peer.
* Malformed payloads raise ``FrameError``.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from tokenflow.comm.frames import (
    FLAG_SEALED,
    HEADER_SIZE,
    KIND_ARROW,
    KIND_GOODBYE,
    KIND_PICKLE,
    TAG_SIZE,
    FrameError,
    FrameIntegrityError,
    FrameOpener,
    FrameSealer,
    decode_message,
    encode_control,
    encode_payload,
    read_frame,
    recv_exactly,
)
from tokenflow.order import Product

# The wire header, written out independently of the module: magic "tF", kind u8, flags u8,
# channel u32, length u64, all big-endian.

KEY = bytes(range(32))


def header(kind: int, channel: int, length: int, magic: bytes = b"tF", flags: int = 0) -> bytes:
    return magic + bytes([kind, flags]) + channel.to_bytes(4, "big") + length.to_bytes(8, "big")


def nonce(seq: int) -> bytes:
    return bytes(4) + seq.to_bytes(8, "big")


def spec_seal(key: bytes, seq: int, kind: int, channel: int, payload: bytes) -> bytes:
    """A sealed frame built from the format's description alone."""
    head = header(kind, channel, len(payload) + 16, flags=1)
    return head + AESGCM(key).encrypt(nonce(seq), payload, head)


def plain(message: Any) -> tuple[int, bytes]:
    """``(kind, payload bytes)`` of a message."""
    p = encode_payload(message)
    return p.kind, bytes(p.data)


def seal(sealer: FrameSealer, channel: int, message: Any) -> bytes:
    return bytes(sealer.seal(channel, encode_payload(message)))


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


# -- payloads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("time", TIMES, ids=repr)
def test_list_batch_round_trip(time: Any) -> None:
    batch = ["a", ("b", 2), None, b"\x00\xff", 3.5, {"k": [1, 2]}, "é" * 3]
    kind, payload = plain((time, batch))
    assert kind == KIND_PICKLE
    assert payload[:2] == b"\x80\x05", "lists travel as pickle protocol 5"
    out_time, out_batch = decode_message(kind, payload)
    assert out_batch == batch
    assert out_time == time
    assert type(out_time) is type(time)  # a Product stays a Product (not a plain tuple)


@pytest.mark.parametrize("time", TIMES, ids=repr)
def test_arrow_batch_round_trip(time: Any) -> None:
    batch = sample_batch(1000)
    p = encode_payload((time, batch))
    assert p.kind == KIND_ARROW
    payload = bytes(p.data)
    # Arrow payload: u32 length of the pickled time, the pickled time, one Arrow IPC stream.
    n = int.from_bytes(payload[:4], "big")
    assert pickle.loads(payload[4 : 4 + n]) == time
    ipc = pa.ipc.open_stream(pa.py_buffer(payload[4 + n :])).read_all()
    assert ipc.to_batches()[0].equals(batch)
    # ... written into a frame-shaped buffer, with room for the header and the tag
    assert p.frame is not None and p.frame.nbytes == HEADER_SIZE + len(payload) + TAG_SIZE
    assert bytes(p.frame[HEADER_SIZE : HEADER_SIZE + len(payload)]) == payload
    out_time, out_batch = decode_message(p.kind, bytearray(payload))
    assert out_time == time and type(out_time) is type(time)
    assert isinstance(out_batch, pa.RecordBatch)
    assert out_batch.schema == batch.schema
    assert out_batch.to_pydict() == batch.to_pydict()


def test_arrow_empty_batch_and_sliced_batch() -> None:
    empty = sample_batch(0)
    _, out = decode_message(*plain((0, empty)))
    assert out.num_rows == 0 and out.schema == empty.schema
    sliced = sample_batch(100).slice(37, 11)
    _, out = decode_message(*plain((0, sliced)))
    assert out.to_pydict()["key"] == list(range(37, 48))


@pytest.mark.parametrize("rows", [0, 1, 25, 3000, 40_000])
@pytest.mark.parametrize("kind", ["flat", "nested", "dictionary", "sliced", "metadata"])
def test_small_and_large_arrow_batches_of_every_shape_round_trip(kind: str, rows: int) -> None:
    """Small batches are encoded from the cached schema message and the batch's own message,
    large ones and batches with dictionaries by the stream writer: every shape decodes to an
    equal batch with its schema (metadata included), whichever path it took."""
    rng = np.random.default_rng(rows)
    base = {"i": pa.array(rng.integers(-5, 5, rows)),
            "s": pa.array([None if k % 7 == 0 else f"w{k % 13}" for k in range(rows)]),
            "f": pa.array(rng.normal(size=rows))}
    if kind == "nested":
        base["l"] = pa.array([[k, k + 1] if k % 3 else None for k in range(rows)])
        base["st"] = pa.array([{"a": k, "b": str(k)} for k in range(rows)])
    if kind == "dictionary":
        base["d"] = pa.array([f"c{k % 4}" for k in range(rows)]).dictionary_encode()
        base["ld"] = pa.array([[f"c{k % 4}"] for k in range(rows)],
                              pa.list_(pa.dictionary(pa.int8(), pa.string())))
    batch = pa.record_batch(base)
    if kind == "sliced":
        batch = pa.record_batch({**base, "pad": pa.array(range(rows))}).slice(rows // 3, rows // 3)
    if kind == "metadata":
        batch = batch.replace_schema_metadata({"origin": "test"})
    for _ in range(2):  # the second time from the cached schema message
        out_time, out = decode_message(*plain((7, batch)))
        assert out_time == 7
        assert out.schema == batch.schema and out.schema.metadata == batch.schema.metadata
        assert out.equals(batch)


def test_non_batch_messages_are_pickled() -> None:
    """A progress batch (any picklable object, not a ``(time, RecordBatch)`` pair)."""
    message = [((0, 1, 2), 5, -1), ((0, 1, 2), 6, 1)]
    kind, payload = plain(message)
    assert kind == KIND_PICKLE
    assert decode_message(kind, payload) == message


def test_control_frame() -> None:
    assert encode_control(KIND_GOODBYE) == header(KIND_GOODBYE, 0, 0)
    assert encode_control(16, b"hello", channel=9) == header(16, 9, 5) + b"hello"


# -- sealed frames: the format -----------------------------------------------------------------


@pytest.mark.parametrize("message", [(3, ["a", 1]), (Product(1, 2), sample_batch(50))],
                         ids=["pickle", "arrow"])
def test_sealed_frame_matches_the_specification(message: Any) -> None:
    """Frames 0 and 1 equal AES-256-GCM of the payload under nonce ``0^32 | seq`` with the
    header (flags 1, length = payload + 16) as associated data: the payload is encrypted."""
    sealer = FrameSealer(KEY)
    kind, payload = plain(message)
    first = seal(sealer, 9, message)
    second = seal(sealer, 9, message)
    assert first == spec_seal(KEY, 0, kind, 9, payload)
    assert second == spec_seal(KEY, 1, kind, 9, payload)
    assert first[HEADER_SIZE:] != second[HEADER_SIZE:], "each frame has its own nonce"
    assert first[3] == FLAG_SEALED
    assert payload[:64] not in first, "the payload does not travel in the clear"


def test_control_frames_are_sealed_too() -> None:
    sealer = FrameSealer(KEY)
    assert bytes(sealer.seal_control(KIND_GOODBYE)) == spec_seal(KEY, 0, KIND_GOODBYE, 0, b"")


def test_rekeying_follows_hkdf_expand() -> None:
    """After ``rekey_bytes`` of payload the next frame uses HKDF-Expand(SHA-256, 32,
    "tokenflow mesh v2 rekey") of the previous key; sequence numbers go on."""
    sealer = FrameSealer(KEY, rekey_bytes=100)
    kind, payload = plain(b"x" * 120)  # one frame over the limit
    assert seal(sealer, 1, b"x" * 120) == spec_seal(KEY, 0, kind, 1, payload)
    key2 = HKDFExpand(hashes.SHA256(), 32, b"tokenflow mesh v2 rekey").derive(KEY)
    assert seal(sealer, 1, b"x" * 120) == spec_seal(key2, 1, kind, 1, payload)


def test_seal_and_open_over_socketpair_with_rekeying(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    sealer, opener = FrameSealer(KEY, rekey_bytes=5000), FrameOpener(KEY, rekey_bytes=5000)
    big = sample_batch(200_000)  # several MB: the writer must run beside the reader
    messages: list[tuple[int, Any]] = [(5, (Product(1, 0), [1, 2, 3])), (6, (4, big))]
    messages += [(7, (i, sample_batch(100 + i))) for i in range(20)]  # ~20 rekeys
    frames = [seal(sealer, c, m) for c, m in messages] + [bytes(sealer.seal_control(KIND_GOODBYE))]
    writer = threading.Thread(target=lambda: a.sendall(b"".join(frames)))
    writer.start()
    got = [opener.read(b, 1 << 30) for _ in range(len(frames))]
    writer.join()
    assert [(k, c) for k, c, _ in got][:3] == [(KIND_PICKLE, 5), (KIND_ARROW, 6), (KIND_ARROW, 7)]
    assert got[-1][:2] == (KIND_GOODBYE, 0) and got[-1][2].nbytes == 0
    assert decode_message(got[0][0], got[0][2]) == (Product(1, 0), [1, 2, 3])
    time_, batch = decode_message(got[1][0], got[1][2])
    assert time_ == 4 and batch.equals(big)
    for i, (kind, _, payload) in enumerate(got[2:-1]):
        time_, batch = decode_message(kind, payload)
        assert time_ == i and batch.equals(sample_batch(100 + i))
    assert opener.seq == sealer.seq == len(frames)


# -- sealed frames: refusals -------------------------------------------------------------------


def frames_of(n: int, key: bytes = KEY) -> list[bytes]:
    sealer = FrameSealer(key)
    return [seal(sealer, 1, (i, [f"record {i}"])) for i in range(n)]


def read_all(sock: socket.socket, data: bytes, count: int,
             opener: FrameOpener | None = None) -> list[Any]:
    """Send ``data`` and open ``count`` frames; the decoded messages, or the exception."""
    opener = opener or FrameOpener(KEY)
    sock.sendall(data)
    return [decode_message(*opener.read(sock, 1 << 20)[::2]) for _ in range(count)]


def test_in_order_frames_open(pair: tuple[socket.socket, socket.socket]) -> None:
    """Positive control for the refusals below."""
    a, b = pair
    a.sendall(b"".join(frames_of(3)))
    opener = FrameOpener(KEY)
    assert [decode_message(k, p) for k, _, p in (opener.read(b, 1 << 20) for _ in range(3))] == [
        (0, ["record 0"]), (1, ["record 1"]), (2, ["record 2"])]


@pytest.mark.parametrize("case", ["replayed", "reordered", "dropped", "wrong-key"])
def test_replayed_reordered_dropped_or_foreign_frames_refused(
        pair: tuple[socket.socket, socket.socket], case: str) -> None:
    a, b = pair
    f = frames_of(3)
    stream = {"replayed": f[0] + f[0], "reordered": f[1] + f[0], "dropped": f[1],
              "wrong-key": frames_of(1, key=os.urandom(32))[0]}[case]
    opener = FrameOpener(KEY)
    a.sendall(stream)
    if case == "replayed":
        assert decode_message(*opener.read(b, 1 << 20)[::2]) == (0, ["record 0"])
    seq = opener.seq
    with pytest.raises(FrameIntegrityError, match=f"frame #{seq} .* failed its integrity check"):
        opener.read(b, 1 << 20)


@pytest.mark.parametrize("offset", [2, 3, 7, HEADER_SIZE, HEADER_SIZE + 5, -1],
                         ids=["kind", "flags", "channel", "body-start", "body", "tag"])
def test_flipped_bit_refused(pair: tuple[socket.socket, socket.socket], offset: int) -> None:
    a, b = pair
    frame = bytearray(frames_of(1)[0])
    frame[offset] ^= 0x01
    a.sendall(bytes(frame))
    with pytest.raises(FrameError) as info:
        FrameOpener(KEY).read(b, 1 << 20)
    if offset != 3:  # a cleared sealed flag is refused as a frame in the clear
        assert isinstance(info.value, FrameIntegrityError)


def test_changed_length_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    """A length cut short (the rest of the stream read as the next frame) fails the tag."""
    a, b = pair
    frame = bytearray(frames_of(1)[0])
    struct.pack_into("!Q", frame, 8, len(frame) - HEADER_SIZE - 1)
    a.sendall(bytes(frame))
    with pytest.raises(FrameIntegrityError):
        FrameOpener(KEY).read(b, 1 << 20)


def test_frame_in_the_clear_refused_after_handshake(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    body = pickle.dumps((0, ["injected"]), protocol=5)
    a.sendall(header(KIND_PICKLE, 1, len(body)) + body)
    with pytest.raises(FrameError, match="frame #0 of kind 1 is not sealed"):
        FrameOpener(KEY).read(b, 1 << 20)
    assert unread(b) == body, "the body of a frame in the clear is not even read"


class Bomb:
    """Unpickling a ``Bomb`` writes its marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def test_bomb_behind_a_bad_tag_never_runs(pair: tuple[socket.socket, socket.socket],
                                          tmp_path: Path) -> None:
    """A sealed-looking frame whose body is a pickle bomb and a made-up tag: refused, and the
    bomb (which does detonate when unpickled: the positive control) never runs."""
    a, b = pair
    marker = tmp_path / "bomb"
    body = pickle.dumps((0, [Bomb(str(marker))]), protocol=5)
    a.sendall(header(KIND_PICKLE, 1, len(body) + 16, flags=1) + body + bytes(16))
    with pytest.raises(FrameIntegrityError):
        FrameOpener(KEY).read(b, 1 << 20)
    assert not marker.exists()
    pickle.loads(body)
    assert marker.read_text() == "unpickled"


def test_sealed_oversized_length_refused_before_reading(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    body = b"A" * 2048
    a.sendall(header(KIND_PICKLE, 1, (1 << 30) + 16, flags=1) + body)
    with pytest.raises(FrameError, match=f"frame of {1 << 30} bytes exceeds the limit of 4096"):
        FrameOpener(KEY).read(b, 4096)
    assert unread(b) == body


def test_sealed_limit_counts_the_payload(pair: tuple[socket.socket, socket.socket]) -> None:
    """``max_payload`` is the payload's size: a frame of exactly that many bytes is read."""
    a, b = pair
    sealer, opener = FrameSealer(KEY), FrameOpener(KEY)
    frame = bytes(sealer.seal_control(KIND_PICKLE, pickle.dumps(list(range(30)), protocol=5)))
    n = len(frame) - HEADER_SIZE - TAG_SIZE
    a.sendall(frame)
    assert decode_message(*opener.read(b, n)[::2]) == list(range(30))
    a.sendall(bytes(sealer.seal_control(KIND_PICKLE, pickle.dumps(list(range(30)), protocol=5))))
    with pytest.raises(FrameError, match=f"exceeds the limit of {n - 1}"):
        opener.read(b, n - 1)


def test_truncated_sealed_frame(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(frames_of(1)[0][:-5])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError, match="connection closed"):
        FrameOpener(KEY).read(b, 1 << 20)


# -- recv_exactly's deadline -------------------------------------------------------------------


def test_deadline_bounds_the_whole_read(pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer sending one byte every 0.1 s never lets a single ``recv`` time out, but the
    read as a whole ends at its deadline."""
    a, b = pair
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.1):
            try:
                a.send(b"t")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="deadline passed after [1-9]"):
            recv_exactly(b, 1000, deadline=start + 0.6)
    finally:
        stop.set()
    assert 0.55 < time.monotonic() - start < 1.5


# -- read_frame: the handshake's reader in the clear ----------------------------------------


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


def test_sealed_frame_refused_in_the_clear(pair: tuple[socket.socket, socket.socket]) -> None:
    """The handshake reader takes no sealed frames (flags must be 0)."""
    a, b = pair
    a.sendall(frames_of(1)[0])
    with pytest.raises(FrameError, match="flags 0x1"):
        read_frame(b, 1 << 20)


# -- malformed payloads ------------------------------------------------------------------------


TIME3 = b"\x00\x00\x00\x05" + pickle.dumps(3, protocol=5)  # a valid time prefix (time 3)


def valid_arrow_payload() -> bytes:
    return plain((3, sample_batch(10)))[1]


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
