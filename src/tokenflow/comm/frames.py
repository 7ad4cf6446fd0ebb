"""Length-prefixed frames of the intra-job worker mesh, and their protection.

Source: docs/ARCHITECTURE.md ("Data plane", "Security"), docs/SECURITY.md ("Wire format").

Every frame starts with a 16-byte header — magic ``b"tF"``, kind (u8), flags (u8), channel
(u32), length (u64), big-endian — followed by ``length`` bytes.  Every reader checks the
declared length against a limit *before* reading the rest.

* Handshake frames (``KIND_HANDSHAKE``, flags 0) carry small msgpack maps in the clear
  (``tokenflow.comm.auth``); nothing else is ever read in the clear.
* Every frame after the handshake is **sealed** (flag ``FLAG_SEALED``): its body is the
  AES-256-GCM encryption of the payload followed by the 16-byte tag, so ``length`` is the
  payload's size plus ``TAG_SIZE``.  The header is the associated data (authenticated, not
  encrypted: kind, channel and size are visible on the wire).  The 96-bit nonce is implicit:
  four zero bytes and the frame's sequence number in its direction (u64, from 0), so each
  direction of each connection (its own key, ``tokenflow.comm.auth.derive_keys``) accepts
  frames only in the order they were sealed: an injected, altered, replayed, reordered or
  dropped frame fails the tag check of the frame it lands on, and ``FrameOpener`` raises
  ``FrameIntegrityError`` before a byte of the payload is decoded.  After ``REKEY_BYTES`` of
  payload under one key both sides move to the next key (HKDF-Expand of the current one).

Payloads: data messages ``(time, batch)`` are pickle protocol 5 for list batches
(``KIND_PICKLE``) or Arrow IPC for ``RecordBatch``es (``KIND_ARROW``: u32 length and pickled
time, then one IPC stream).  An Arrow payload is written straight into a frame-shaped buffer
and encrypted in place, so a batch's bytes are copied once (IPC serialization) and encrypted
once on the sender, and decrypted in place and read zero-copy on the receiver.  A small batch
(``SMALL_ARROW``) is the same stream assembled from its schema's cached message and the
batch's own message, four times cheaper than the stream writer for the tens-of-rows messages
a fine-grained epoch sends.
"""

from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any

import pyarrow as pa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

MAGIC = b"tF"
HEADER = struct.Struct("!2sBBIQ")
HEADER_SIZE = HEADER.size  # 16 bytes

KIND_PICKLE = 1
KIND_ARROW = 2
KIND_GOODBYE = 3
KIND_READY = 4
"""The acceptor's first sealed frame (empty): the handshake's key confirmation."""
KIND_HANDSHAKE = 16

FLAG_SEALED = 1
"""Flags bit 0: the body is ciphertext and tag (every frame after the handshake)."""

TAG_SIZE = 16
"""Bytes of the AES-GCM tag at the end of a sealed frame's body."""

KEY_SIZE = 32
"""Bytes of a per-direction AES-256-GCM key."""

DEFAULT_MAX_FRAME = 1 << 30
"""Largest payload accepted on an authenticated connection (1 GiB)."""

HANDSHAKE_MAX_FRAME = 4096
"""Largest payload accepted before authentication."""

MAX_SEALED_PAYLOAD = (1 << 31) - 1 - TAG_SIZE
"""Largest payload one frame can seal (the AEAD library takes under 2 GiB per call)."""

REKEY_BYTES = 1 << 36
"""Payload bytes (64 GiB) sealed under one key before both sides move to the next: 2^32 AES
blocks per key, which keeps AES-GCM's advantage bound near 2^-64 (within the 2^-57 margin of
"The Transport Layer Security (TLS) Protocol Version 1.3", section 5.5)."""

_NONCE = struct.Struct("!IQ")
_TIME_LEN = struct.Struct("!I")
_REKEY_INFO = b"tokenflow mesh v2 rekey"
_POOL_THRESHOLD = 1 << 16


class FrameError(ConnectionError):
    """A malformed or oversized frame: the connection that sent it is closed.

    Attributes:
        reason: a short category for rate-limited logs ("bad frame", "oversized frame",
            "integrity check failed").
    """

    reason = "bad frame"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class FrameIntegrityError(FrameError):
    """A sealed frame failed its tag check: it was forged, altered, replayed, reordered, or
    frames before it were dropped.  Nothing of it was decoded."""

    reason = "integrity check failed"


def _describe(exc: BaseException) -> str:
    """``"Type: message"``, or the type alone for exceptions with an empty message (msgpack's
    ``FormatError``), so a log line always says what went wrong."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- payloads ----------------------------------------------------------------------------------


class Payload:
    """A serialized message ready to be sealed.

    Attributes:
        kind: ``KIND_PICKLE``, ``KIND_ARROW`` or a control kind.
        data: the payload bytes (a memoryview of ``len(data)`` bytes).
        frame: ``None``, or a writable memoryview of ``HEADER_SIZE + len(data) + TAG_SIZE``
            bytes whose middle *is* ``data``: the sealer writes the header and the tag around
            it and encrypts the payload in place (the Arrow path).
    """

    __slots__ = ("kind", "data", "frame")

    def __init__(self, kind: int, data: Any, frame: memoryview | None = None) -> None:
        self.kind = kind
        self.data = memoryview(data).cast("B")
        self.frame = frame

    @property
    def size(self) -> int:
        return self.data.nbytes


SMALL_ARROW = 1 << 16
"""Record batches of at most this many bytes are encoded from their cached schema message
and their own IPC message (``_small_stream``); larger ones are written straight into the
frame."""
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The IPC stream's end-of-stream marker."""
_SCHEMA_MESSAGES: dict[Any, Any] = {}
"""schema -> its encapsulated IPC message, or None when it has dictionaries (then the stream
writer is used: a batch's own message does not carry them)."""


def _has_dictionaries(types: Any) -> bool:
    return any(pa.types.is_dictionary(t) or
               _has_dictionaries([t.field(i).type for i in range(t.num_fields)])
               for t in types)


def schema_message(schema: pa.Schema) -> pa.Buffer | None:
    """``schema``'s encapsulated IPC message (cached per schema), or None when it has
    dictionaries: a batch's own IPC message (``RecordBatch.serialize``, which writes only a
    slice's rows) does not carry them, so such a batch needs the stream writer."""
    message = _SCHEMA_MESSAGES.get(schema, False)
    if message is False:
        message = None if _has_dictionaries(schema.types) else schema.serialize()
        if len(_SCHEMA_MESSAGES) >= 256:
            _SCHEMA_MESSAGES.clear()
        _SCHEMA_MESSAGES[schema] = message
    return message  # type: ignore[no-any-return]


def _small_stream(batch: pa.RecordBatch) -> list[Any] | None:
    """The buffers of a one-batch IPC stream (schema message, batch message, end of stream)
    for a small batch without dictionaries, else None: about 5 us where the stream writer
    takes about 20 (a NEXMark or flights epoch sends many such messages)."""
    if batch.get_total_buffer_size() > SMALL_ARROW:
        return None
    message = schema_message(batch.schema)
    if message is None:
        return None
    return [message, batch.serialize(), _EOS]


def encode_payload(message: Any) -> Payload:
    """Serialize a data message: ``(time, RecordBatch)`` as Arrow IPC written into a
    frame-shaped buffer (``Payload.frame``), anything else as pickle protocol 5.

    Raises:
        whatever pickling or Arrow serialization raises (no state changes anywhere).
    """
    if isinstance(message, tuple) and len(message) == 2 and isinstance(message[1], pa.RecordBatch):
        time_, batch = message
        time_bytes = pickle.dumps(time_, protocol=5)
        parts = _small_stream(batch)
        if parts is not None:
            views = [memoryview(part).cast("B") for part in parts]
            prefix = _TIME_LEN.size + len(time_bytes)
            n = prefix + sum(view.nbytes for view in views)
            frame = allocate(HEADER_SIZE + n + TAG_SIZE)
            start = HEADER_SIZE
            _TIME_LEN.pack_into(frame, start, len(time_bytes))
            frame[start + _TIME_LEN.size : start + prefix] = time_bytes
            at = start + prefix
            for view in views:
                frame[at : at + view.nbytes] = view
                at += view.nbytes
            return Payload(KIND_ARROW, frame[start : start + n], frame)
        mock = pa.MockOutputStream()  # measure first, then write once into an exact buffer
        with pa.ipc.new_stream(mock, batch.schema) as writer:
            writer.write_batch(batch)
        prefix = _TIME_LEN.size + len(time_bytes)
        n = prefix + mock.size()
        frame = memoryview(pa.allocate_buffer(HEADER_SIZE + n + TAG_SIZE)).cast("B")
        start = HEADER_SIZE
        _TIME_LEN.pack_into(frame, start, len(time_bytes))
        frame[start + _TIME_LEN.size : start + prefix] = time_bytes
        body = pa.py_buffer(frame[start + prefix : start + n])
        with pa.ipc.new_stream(pa.FixedSizeBufferWriter(body), batch.schema) as writer:
            writer.write_batch(batch)
        return Payload(KIND_ARROW, frame[start : start + n], frame)
    return Payload(KIND_PICKLE, pickle.dumps(message, protocol=5))


def decode_message(kind: int, payload: bytes | bytearray | memoryview) -> Any:
    """The message carried by a data frame's payload (call only on an opened sealed frame).

    Raises:
        FrameError: for an unknown kind or an unreadable payload.
    """
    try:
        if kind == KIND_PICKLE:
            return pickle.loads(payload)
        if kind == KIND_ARROW:
            view = memoryview(payload)
            (n,) = _TIME_LEN.unpack_from(view, 0)
            time_ = pickle.loads(view[4 : 4 + n])
            reader = pa.ipc.open_stream(pa.py_buffer(view[4 + n :]))
            return time_, reader.read_next_batch()
    except FrameError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a malformed frame
        raise FrameError(f"malformed frame of kind {kind}: {_describe(exc)}") from exc
    raise FrameError(f"unknown frame kind {kind}")


def encode_control(kind: int, payload: bytes = b"", channel: int = 0) -> bytes:
    """A frame of ``kind`` with a raw payload in the clear (handshake messages only: after the
    handshake every frame is sealed by a ``FrameSealer``)."""
    return HEADER.pack(MAGIC, kind, 0, channel, len(payload)) + payload


# -- reading -----------------------------------------------------------------------------------


def recv_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    """Read exactly ``n`` bytes, by ``deadline`` (``time.monotonic()`` seconds) if given: the
    deadline bounds the whole read, not each ``recv`` (a peer trickling one byte at a time
    cannot stretch it).

    Raises:
        EOFError: when the peer closes the connection first (with the bytes read so far).
        TimeoutError: when the deadline passes first.
    """
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf), deadline)
    return buf


def allocate(n: int) -> memoryview:
    """A writable buffer of ``n`` bytes: Arrow's memory pool for large ones (no zero-filling,
    pages reused across frames), a ``bytearray`` for small ones."""
    if n >= _POOL_THRESHOLD:
        return memoryview(pa.allocate_buffer(n)).cast("B")
    return memoryview(bytearray(n))


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> None:
    """Fill ``view`` from ``sock`` (see ``recv_exactly``)."""
    n = view.nbytes
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"deadline passed after {got} of {n} bytes")
            sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError as exc:
            raise TimeoutError(f"deadline passed after {got} of {n} bytes") from exc
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k


def parse_header(header: bytes) -> tuple[int, int, int, int]:
    """``(kind, flags, channel, length)`` of a ``HEADER_SIZE``-byte header.

    Raises:
        FrameError: bad magic.
    """
    magic, kind, flags, channel, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {magic!r}")
    return kind, flags, channel, length


def read_header(sock: socket.socket, deadline: float | None = None) -> tuple[int, int, int, int, bytes]:
    """Read and check one header: ``(kind, flags, channel, length, header bytes)``.

    Raises:
        FrameError: bad magic.  EOFError, TimeoutError: as ``recv_exactly``.
    """
    header = bytes(recv_exactly(sock, HEADER_SIZE, deadline))
    return (*parse_header(header), header)


def read_frame(sock: socket.socket, max_payload: int,
               deadline: float | None = None) -> tuple[int, int, bytearray]:
    """Read one frame in the clear (the handshake's): ``(kind, channel, payload)``.

    Raises:
        FrameError: bad magic, a sealed frame, or a declared length over ``max_payload``
            (nothing more is read).
        EOFError: the peer closed the connection at a frame boundary or inside a frame.
        TimeoutError: ``deadline`` passed.
    """
    kind, flags, channel, length, _ = read_header(sock, deadline)
    if flags:
        raise FrameError(f"unexpected frame flags {flags:#x} on a frame in the clear")
    if length > max_payload:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_payload} bytes",
                         reason="oversized frame")
    payload = recv_exactly(sock, length, deadline) if length else bytearray()
    return kind, channel, payload


# -- sealing -----------------------------------------------------------------------------------


class _Direction:
    """One direction's key, sequence number and rekeying (shared by sealer and opener)."""

    def __init__(self, key: bytes, rekey_bytes: int) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"a frame key has {KEY_SIZE} bytes, not {len(key)}")
        self._key = key
        self._aead = AESGCM(key)
        self._used = 0
        self.rekey_bytes = rekey_bytes
        self.seq = 0
        """The sequence number of the next frame (frames sealed or opened so far)."""

    def _nonce(self) -> bytes:
        if self.seq >= 1 << 64:  # pragma: no cover - 2^64 frames
            raise FrameError("sequence numbers exhausted")
        return _NONCE.pack(0, self.seq)

    def _advance(self, n: int) -> None:
        self.seq += 1
        self._used += n
        if self._used >= self.rekey_bytes:
            self._key = HKDFExpand(hashes.SHA256(), KEY_SIZE, _REKEY_INFO).derive(self._key)
            self._aead = AESGCM(self._key)
            self._used = 0


class FrameSealer(_Direction):
    """Seals this side's outgoing frames of one connection (one direction's key).

    Args:
        key: the direction's 32-byte key (``tokenflow.comm.auth.derive_keys``).
        rekey_bytes: payload bytes sealed under one key (``REKEY_BYTES``; tests use less).

    Not thread-safe: the caller serializes sealing *and sending* (frames must hit the wire
    in sequence order).
    """

    def __init__(self, key: bytes, rekey_bytes: int = REKEY_BYTES) -> None:
        super().__init__(key, rekey_bytes)

    def seal(self, channel: int, payload: Payload) -> memoryview:
        """The whole sealed frame (header, ciphertext, tag) as one buffer; takes the next
        sequence number.  An Arrow payload is encrypted in place (its ``frame`` is returned).

        Raises:
            FrameError: a payload over ``MAX_SEALED_PAYLOAD`` (nothing is consumed).
        """
        n = payload.size
        if n > MAX_SEALED_PAYLOAD:
            raise FrameError(f"frame of {n} bytes exceeds the largest sealable frame "
                             f"({MAX_SEALED_PAYLOAD} bytes)")
        frame = payload.frame
        if frame is None:
            frame = allocate(HEADER_SIZE + n + TAG_SIZE)
        header = HEADER.pack(MAGIC, payload.kind, FLAG_SEALED, channel, n + TAG_SIZE)
        frame[:HEADER_SIZE] = header
        self._aead.encrypt_into(self._nonce(), payload.data, header, frame[HEADER_SIZE:])
        self._advance(n)
        return frame

    def seal_control(self, kind: int, payload: bytes = b"", channel: int = 0) -> memoryview:
        """A sealed control frame (``KIND_READY``, ``KIND_GOODBYE``)."""
        return self.seal(channel, Payload(kind, payload))


class FrameOpener(_Direction):
    """Reads and opens the peer's sealed frames of one connection, in sequence.

    Args:
        key: the direction's 32-byte key.
        rekey_bytes: as for ``FrameSealer`` (both sides must agree).

    Not thread-safe (one reader per connection).
    """

    def __init__(self, key: bytes, rekey_bytes: int = REKEY_BYTES) -> None:
        super().__init__(key, rekey_bytes)

    def open(self, header: bytes, body: bytearray | memoryview) -> memoryview:
        """Verify and decrypt ``body`` (ciphertext and tag) in place; the plaintext view.

        Raises:
            FrameIntegrityError: the tag does not verify for this header, this key and this
                sequence number (the payload must not be used).
        """
        view = memoryview(body)
        n = view.nbytes - TAG_SIZE
        try:
            self._aead.decrypt_into(self._nonce(), view, header, view[:n])
        except InvalidTag:
            kind = header[2] if len(header) > 2 else -1
            raise FrameIntegrityError(
                f"frame #{self.seq} (kind {kind}, {n} bytes) failed its integrity check: "
                "forged, altered, replayed or reordered, or frames before it were dropped"
            ) from None
        self._advance(n)
        return view[:n]

    def expect(self, header: bytes, max_payload: int) -> tuple[int, int, int]:
        """Check the next frame's ``HEADER_SIZE``-byte header before its body is read:
        ``(kind, channel, length of the body, tag included)``.

        Raises:
            FrameError: bad magic, a frame that is not sealed, or a payload over
                ``max_payload`` bytes.
        """
        kind, flags, channel, length = parse_header(header)
        if flags != FLAG_SEALED or length < TAG_SIZE:
            raise FrameError(f"frame #{self.seq} of kind {kind} is not sealed (flags {flags:#x}, "
                             f"{length} bytes): every frame after the handshake must be")
        if length - TAG_SIZE > max_payload:
            raise FrameError(f"frame of {length - TAG_SIZE} bytes exceeds the limit of "
                             f"{max_payload} bytes", reason="oversized frame")
        return kind, channel, length

    def read(self, sock: socket.socket, max_payload: int,
             deadline: float | None = None) -> tuple[int, int, memoryview]:
        """Read the next frame from a blocking socket and open it: ``(kind, channel,
        payload)``.

        The declared length is checked before the body is read (``expect``), and the payload
        is returned only after its tag verified.

        Raises:
            FrameError: as ``expect`` (nothing more is read).
            FrameIntegrityError: the tag check failed.
            EOFError, TimeoutError: as ``recv_exactly``.
        """
        header = bytes(recv_exactly(sock, HEADER_SIZE, deadline))
        kind, channel, length = self.expect(header, max_payload)
        body = allocate(length)
        _recv_into(sock, body, deadline)
        return kind, channel, self.open(header, body)
