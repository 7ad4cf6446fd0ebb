"""The driver's coordinator: workers report progress to it, and it sends them commands.

Source: docs/ARCHITECTURE.md ("Execution model": the driver runs a coordinator to which
workers report frontiers and metrics, and through which checkpoint and rescale commands flow;
"Security": the coordinator faces the network and never unpickles; docs/SECURITY.md, "The
coordinator link").  The connection is two-way: the worker sends reports, heartbeats and
control replies, the coordinator sends commands (``tokenflow.control``).

Handshake (the *hello*): three frames of a 4-byte big-endian length and a msgpack map of at most
``MAX_HELLO`` bytes each, all within ``HELLO_TIMEOUT`` seconds of the connection (one deadline
for the whole exchange).  ``Nw`` and ``Nc`` are fresh 16-byte nonces of the worker and the
coordinator, ``A`` = HKDF-SHA256(the job's token, info "tokenflow coordinator v2 auth"), and
``MAC`` HMAC-SHA256 keyed with ``A`` over length-prefixed parts
(``tokenflow.comm.auth._mac``); the token itself never travels:

1. worker → coordinator  ``{"v": 2, "nonce": Nw}``
2. coordinator → worker  ``{"nonce": Nc, "mac": MAC("coordinator accept"|Nw|Nc)}``
3. worker → coordinator  ``{"mac": MAC("coordinator connect"|Nc|Nw)}``

The worker checks the coordinator's MAC (a party without the token cannot pose as the
coordinator), the coordinator the worker's.  Both then hold ``derive_keys``: HKDF-SHA256 of the
token salted with ``Nw|Nc``, one AES-256-GCM key per direction, fresh for every connection.
Every later frame in either direction is a *sealed* mesh frame (``tokenflow.comm.frames``:
16-byte header as associated data, payload encrypted, 16-byte tag, the nonce the frame's
sequence number in its direction) of kind ``KIND_MESSAGE`` whose payload is a msgpack map of at
most ``MAX_REPORT`` bytes.  A forged, altered, replayed, reordered or dropped frame fails its
tag check; the receiver then logs the refusal and closes the connection, and nothing of the
frame is decoded.

Report shape (msgpack map; every field is checked, a report that fails is refused and logged)::

    {"worker": int >= 0, "steps": int >= 0, "elapsed": float >= 0 (s since the worker started),
     "records_in": int >= 0, "frontiers": {dataflow: {operator: [time as str, ...]}},
     "done": bool}

Heartbeat (``Reporter.start_heartbeat``: about one a second from a thread of the worker, whether
or not it steps; the driver declares a worker stalled when they stop, see ``Liveness``)::

    {"kind": "heartbeat", "worker": int, "job": str, "done": bool}

Control messages in either direction are maps with a ``"kind"`` string (a command such as
``{"kind": "checkpoint", "epoch": 40, ...}``, or a reply such as ``{"kind": "captured", "worker": 1,
...}``); replies are queued in ``Coordinator.inbox`` rather than taken as reports.

Hardening (the endpoint is reachable by anyone on the network): one thread serves the listening
socket and every connection that has not yet sent its hello (at most ``MAX_PENDING`` at once:
the oldest is dropped for a new one), so slow or silent connections cost neither threads nor
more than ``MAX_PENDING`` descriptors; only authenticated connections get a thread.  Running
out of descriptors (``EMFILE``) pauses accepting with a back-off instead of ending the thread.
Refusals are logged at most once per ``LOG_INTERVAL`` seconds, with a count.
"""

from __future__ import annotations

import errno
import hmac
import logging
import math
import os
import queue
import secrets
import select
import selectors
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import msgpack
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tokenflow.comm.auth import NONCE_SIZE, _mac, _parts
from tokenflow.comm.frames import KEY_SIZE, FrameOpener, FrameSealer
from tokenflow.comm.frames import FrameError as SealedFrameError

log = logging.getLogger("tokenflow.coordinator")

MAX_REPORT = 64 * 1024
"""Largest frame payload (bytes) after the hello."""
MAX_HELLO = 4096
"""Largest payload (bytes) of each of the hello's frames."""
HELLO_TIMEOUT = 10.0
"""Seconds a new connection has to complete its whole hello (both of its frames)."""
PROTOCOL_VERSION = 2
"""Coordinator protocol (1: the token in the hello and every frame in the clear; 2: a nonce
exchange authenticated with the token, then sealed frames)."""
KIND_MESSAGE = 32
"""Kind of the sealed frames after the hello (their payload is one msgpack map)."""
MAX_PENDING = 128
"""Connections without a hello kept at once (the oldest is dropped for a new one)."""
ACCEPT_BATCH = 16
"""Connections accepted per round of the serving loop before reading hellos again."""
LOG_INTERVAL = 5.0
"""Seconds between two log lines about refusals (or ``EMFILE``); the rest are counted."""
MAX_WORKER = 1 << 20
"""Worker indices are below this."""
HEARTBEAT_INTERVAL = 1.0
"""Seconds between two heartbeats of a worker."""
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
"""Seconds without a heartbeat after which the driver declares a worker stalled."""
_LEN = struct.Struct("!I")
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_AUTH_INFO = b"tokenflow coordinator v2 auth"
_KEY_INFO = "tokenflow coordinator v2 keys"

MAX_GATHERS = 64
"""Jobs whose address exchange (``gather_addresses``) may be under way on one coordinator."""


class FrameError(ValueError):
    """A malformed frame: too long, not msgpack, or not a map (the message says which)."""


class ReportError(ValueError):
    """A well-formed frame whose fields are wrong (the message names the field)."""


def _decode(data: bytes, what: str) -> dict[str, Any]:
    """The msgpack map in ``data``.

    Raises:
        FrameError: ``data`` is not one msgpack map with string keys.
    """
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for bad input
        raise FrameError(f"{what} of {len(data)} bytes is not valid msgpack: "
                         f"{type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"{what} is a msgpack {type(obj).__name__}, not a map")
    return obj


def _frame_length(header: bytes, limit: int, what: str) -> int:
    (n,) = _LEN.unpack(header)
    if n > limit:
        raise FrameError(f"{what} of {n} bytes exceeds the limit of {limit}")
    return int(n)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _read(sock: socket.socket, limit: int = MAX_HELLO) -> dict[str, Any]:
    """One hello frame (length and msgpack map) from a blocking socket.

    Raises:
        EOFError: the connection closed; FrameError: a malformed frame; OSError.
    """
    n = _frame_length(_recv_exactly(sock, 4), limit, "hello")
    return _decode(_recv_exactly(sock, n), "hello")


def _write(sock: socket.socket, obj: dict[str, Any]) -> None:
    """Send one hello frame."""
    data = msgpack.packb(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


# -- keys and sealed frames ------------------------------------------------------------------


def auth_key(token: str) -> bytes:
    """The hello's MAC key: HKDF-SHA256 of the token (no salt, info
    "tokenflow coordinator v2 auth")."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_AUTH_INFO).derive(token.encode())


def derive_keys(token: str, nonce_w: bytes, nonce_c: bytes) -> tuple[bytes, bytes]:
    """The connection's two 32-byte frame keys: ``(worker → coordinator, coordinator →
    worker)``: HKDF-SHA256 of the token, salted with ``Nw|Nc``, info the length-prefixed
    ``"tokenflow coordinator v2 keys"``, 64 bytes split in two."""
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=nonce_w + nonce_c,
               info=_parts(_KEY_INFO)).derive(token.encode())
    return okm[:KEY_SIZE], okm[KEY_SIZE:]


def _hello_nonce(msg: dict[str, Any]) -> bytes:
    nonce = msg.get("nonce")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_SIZE:
        raise PermissionError(f"hello without a {NONCE_SIZE}-byte nonce")
    return nonce


def _hello_mac(msg: dict[str, Any]) -> bytes:
    mac = msg.get("mac")
    return mac if isinstance(mac, bytes) else b""


def _read_sealed(sock: socket.socket, opener: FrameOpener) -> dict[str, Any]:
    """The next sealed frame's map; nothing is decoded before its tag verified.

    Raises:
        tokenflow.comm.frames.FrameError: bad magic, not sealed, over ``MAX_REPORT``, or
            (``FrameIntegrityError``) a failed tag check.
        FrameError: a verified frame of another kind or whose payload is not a msgpack map.
        EOFError, OSError.
    """
    kind, _, payload = opener.read(sock, MAX_REPORT)
    if kind != KIND_MESSAGE:
        raise FrameError(f"frame of kind {kind}, expected {KIND_MESSAGE}")
    return _decode(bytes(payload), "frame")


class _Channel:
    """An authenticated connection: its socket and its two directions' keys."""

    __slots__ = ("sock", "sealer", "opener", "lock")

    def __init__(self, sock: socket.socket, sealer: FrameSealer, opener: FrameOpener) -> None:
        self.sock = sock
        self.sealer = sealer
        self.opener = opener
        self.lock = threading.Lock()  # seal and send as one step (frames in sequence order)

    def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message)
        with self.lock:
            self.sock.sendall(self.sealer.seal_control(KIND_MESSAGE, data))


# -- validation ------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(msg: dict[str, Any], name: str) -> int:
    value = msg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReportError(f"{name!r} must be an integer >= 0, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _worker_index(msg: dict[str, Any]) -> int:
    worker = msg.get("worker")
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < MAX_WORKER:
        raise ReportError(f"'worker' must be an integer in [0, {MAX_WORKER}), got {_show(worker)}")
    return worker


def validate_report(msg: dict[str, Any]) -> dict[str, Any]:
    """The report in ``msg`` with exactly the fields of the module docstring's shape.

    Raises:
        ReportError: naming the first field that is missing, of the wrong type or out of range.
    """
    report: dict[str, Any] = {"worker": _worker_index(msg)}
    for name in ("steps", "records_in"):
        report[name] = _count(msg, name)
    elapsed = msg.get("elapsed")
    if not isinstance(elapsed, int | float) or isinstance(elapsed, bool) or \
            not math.isfinite(elapsed) or elapsed < 0:
        raise ReportError(f"'elapsed' must be a finite number >= 0, got {_show(elapsed)}")
    report["elapsed"] = float(elapsed)
    done = msg.get("done")
    if not isinstance(done, bool):
        raise ReportError(f"'done' must be a boolean, got {_show(done)}")
    report["done"] = done
    frontiers = msg.get("frontiers")
    if not isinstance(frontiers, dict):
        raise ReportError(f"'frontiers' must be a map, got {_show(frontiers)}")
    for dataflow, ops in frontiers.items():
        if not isinstance(ops, dict):
            raise ReportError(f"'frontiers'[{_show(dataflow)}] must be a map, got {_show(ops)}")
        for op, times in ops.items():
            if not isinstance(times, list) or not all(isinstance(t, str) for t in times):
                raise ReportError(f"'frontiers'[{_show(dataflow)}][{_show(op)}] must be a list of "
                                  f"strings, got {_show(times)}")
    report["frontiers"] = frontiers
    return report


_REPLY_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "held": {"point": lambda v: v is None or _is_int(v), "granularity": lambda v: _is_int(v) and v >= 1,
             "align": lambda v: v is None or isinstance(v, bool),
             "busy": lambda v: v is None or (isinstance(v, list) and len(v) <= 64
                                             and all(_is_int(t) for t in v))},
    "idle": {"sent": lambda v: _is_int(v) and v >= 0, "received": lambda v: _is_int(v) and v >= 0},
    "written": {"index_path": lambda v: isinstance(v, str), "crc32": lambda v: _is_int(v) and v >= 0,
                "bytes_written": lambda v: _is_int(v) and v >= 0,
                "bytes_reused": lambda v: v is None or (_is_int(v) and v >= 0)},
    "captured": {"epoch": lambda v: _is_int(v) and v >= 0,
                 "sent": lambda v: v is None or (_is_int(v) and v >= 0),
                 "received": lambda v: v is None or (_is_int(v) and v >= 0),
                 "held": lambda v: v is None or (_is_int(v) and v >= 0),
                 "crossing": lambda v: v is None or (_is_int(v) and v >= 0),
                 "phases": lambda v: v is None or (isinstance(v, dict) and len(v) <= 16 and all(
                     isinstance(k, str) and isinstance(x, int | float) and not isinstance(x, bool)
                     for k, x in v.items()))},
    "write_failed": {"error": lambda v: isinstance(v, str) and len(v) <= 4096},
    "rescaled": {"steps": lambda v: _is_int(v) and v >= 0,
                 "error": lambda v: v is None or (isinstance(v, str) and len(v) <= 4096)},
}
"""Fields the control plane (``tokenflow.control``) reads from each kind of reply."""


def validate_reply(msg: dict[str, Any]) -> None:
    """Check a control reply's ``worker`` and the fields ``tokenflow.control`` reads.

    Raises:
        ReportError: naming the offending field.
    """
    _worker_index(msg)
    for name, ok in _REPLY_FIELDS.get(msg["kind"], {}).items():
        if not ok(msg.get(name)):
            raise ReportError(f"{msg['kind']!r} reply: bad {name!r}: {_show(msg.get(name))}")


# -- logging ---------------------------------------------------------------------------------


class _Throttled:
    """Log lines about one kind of event at most once per ``interval`` seconds, counting the
    ones in between (reported with the next line, or by ``flush``)."""

    def __init__(self, what: str, interval: float = LOG_INTERVAL) -> None:
        self.what = what
        self.interval = interval
        self.total = 0
        self._held = 0
        self._last = -math.inf
        self._latest = ""
        self._lock = threading.Lock()

    def note(self, detail: str) -> None:
        with self._lock:
            self._latest = detail
            if time.monotonic() - self._last < self.interval:
                self._held += 1
            else:
                self._emit(self.total + 1)
            self.total += 1  # after the line: whoever sees the count sees the line logged

    def flush(self) -> None:
        with self._lock:
            if self._held and time.monotonic() - self._last >= self.interval:
                self._emit(self.total)

    def _emit(self, total: int) -> None:
        more = f" (and {self._held} more in the last {self.interval:.0f} s; {total} in all)" \
            if self._held else ""
        log.warning("coordinator %s %s%s", self.what, self._latest, more)
        self._held = 0
        self._last = time.monotonic()


# -- the coordinator -------------------------------------------------------------------------


class _Pending:
    """A connection whose hello is not complete: the bytes of its current hello frame and,
    once its first frame came, both nonces."""

    __slots__ = ("sock", "addr", "deadline", "buffer", "nonce_w", "nonce_c")

    def __init__(self, sock: socket.socket, addr: Any, deadline: float) -> None:
        self.sock = sock
        self.addr = addr
        self.deadline = deadline
        self.buffer = b""
        self.nonce_w: bytes | None = None
        self.nonce_c: bytes | None = None


def _where(addr: Any) -> str:
    try:
        return f"{addr[0]}:{addr[1]}"
    except (TypeError, IndexError):
        return str(addr)


_LIVE: weakref.WeakValueDictionary[tuple[int, str], Coordinator] = weakref.WeakValueDictionary()


class Coordinator:
    """Receives worker reports on ``address``; ``snapshot()`` returns the latest per worker.

    Attributes:
        reports: the latest report per worker (see the module docstring; plus ``received``,
            the ``time.time()`` it arrived).
        inbox: control replies, in arrival order.
        refused: connections and messages refused so far (bad hello, malformed frame or
            report, too many pending connections).
    """

    def __init__(self, host: str = "127.0.0.1", token: str | None = None,
                 max_pending: int = MAX_PENDING, hello_timeout: float = HELLO_TIMEOUT) -> None:
        self.token = token or secrets.token_hex(16)
        self._auth_key = auth_key(self.token)
        self._sock = socket.create_server((host, 0), backlog=1024)
        self._sock.setblocking(False)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.reports: dict[int, dict[str, Any]] = {}
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        """Control replies from workers (maps with a ``"kind"``), in arrival order."""
        self.max_pending = max_pending
        self.hello_timeout = hello_timeout
        self._refusals = _Throttled("refused")
        self._exhausted = _Throttled("cannot accept connections:")
        self._links: dict[int, _Channel] = {}
        self._beats: dict[str, dict[int, tuple[float, bool]]] = {}
        self._lock = threading.Lock()
        self._addresses: dict[str, dict[int, tuple[str, int, _Channel]]] = {}
        self._arrived = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="tokenflow-coordinator")
        self._thread.start()
        _LIVE[(self.address[1], self.token)] = self

    @property
    def refused(self) -> int:
        """Connections and messages refused so far."""
        return self._refusals.total

    @classmethod
    def find(cls, endpoint: tuple[str, int, str]) -> Coordinator | None:
        """The open coordinator of this process serving ``endpoint`` (matched by port and
        token: the host workers use may differ from the one it binds), or None."""
        found = _LIVE.get((endpoint[1], endpoint[2]))
        return None if found is None or found._closed else found

    def _refuse(self, addr: Any, reason: str) -> None:
        self._refusals.note(f"{_where(addr)}: {reason}")

    # -- serving -------------------------------------------------------------------------

    def _serve(self) -> None:
        """Accept connections and run their hellos (one thread for all of them); hand each
        authenticated connection to a thread of its own."""
        sel = selectors.DefaultSelector()
        pending: dict[socket.socket, _Pending] = {}  # in arrival order
        listening = True
        resume_at = 0.0
        backoff = 0.025
        try:
            sel.register(self._sock, selectors.EVENT_READ, None)
            while not self._closed:
                now = time.monotonic()
                if not listening and now >= resume_at:
                    sel.register(self._sock, selectors.EVENT_READ, None)
                    listening = True
                wake = min((p.deadline for p in pending.values()), default=now + 0.5)
                if not listening:
                    wake = min(wake, resume_at)
                try:
                    events = sel.select(max(0.0, min(0.5, wake - now)))
                except OSError:
                    if self._closed:
                        return
                    raise
                for key, _ in events:
                    if key.data is None:
                        accepted, exhausted = self._accept(sel, pending)
                        if exhausted:  # pause; longer each time a round accepts nothing
                            backoff = 0.05 if accepted else min(1.0, backoff * 2)
                            sel.unregister(self._sock)
                            listening = False
                            resume_at = time.monotonic() + backoff
                        else:
                            backoff = 0.025
                    else:
                        self._read_hello(sel, pending, key.data)
                now = time.monotonic()
                for p in [p for p in pending.values() if p.deadline <= now]:
                    self._drop(sel, pending, p, f"no complete hello within {self.hello_timeout:g} s")
                self._refusals.flush()
                self._exhausted.flush()
        except Exception:  # pragma: no cover - a bug here must not pass silently
            if not self._closed:
                log.exception("coordinator: the accepting thread failed")
        finally:
            for p in list(pending.values()):
                p.sock.close()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector,
                pending: dict[socket.socket, _Pending]) -> tuple[int, bool]:
        """Accept up to ``ACCEPT_BATCH`` connections; returns how many, and whether this
        process ran out of descriptors (the caller then pauses accepting for a while)."""
        accepted = 0
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self._sock.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if self._closed:
                    break
                if exc.errno in _RESOURCE_ERRNOS:
                    self._exhausted.note(f"{errno.errorcode.get(exc.errno or 0, exc.errno)} "
                                         f"({exc.strerror}); {len(pending)} connections await a "
                                         f"hello, dropping the oldest and backing off")
                    if pending:
                        oldest = next(iter(pending.values()))
                        self._drop(sel, pending, oldest, "dropped to free a descriptor")
                    return accepted, True
                continue  # ECONNABORTED and the like: that connection is gone, go on
            accepted += 1
            if len(pending) >= self.max_pending:
                oldest = next(iter(pending.values()))
                self._drop(sel, pending, oldest,
                           f"{self.max_pending} connections were awaiting a hello")
            conn.setblocking(False)
            entry = _Pending(conn, addr, time.monotonic() + self.hello_timeout)
            pending[conn] = entry
            sel.register(conn, selectors.EVENT_READ, entry)
        return accepted, False

    def _drop(self, sel: selectors.BaseSelector, pending: dict[socket.socket, _Pending],
              entry: _Pending, reason: str | None) -> None:
        pending.pop(entry.sock, None)
        try:
            sel.unregister(entry.sock)
        except (KeyError, ValueError):  # pragma: no cover
            pass
        if reason is not None:
            self._refuse(entry.addr, reason)  # counted before the peer can see the close
            entry.sock.close()

    def _read_hello(self, sel: selectors.BaseSelector, pending: dict[socket.socket, _Pending],
                    entry: _Pending) -> None:
        """Read what arrived of the current hello frame (never past its end) and act on a
        complete one: reply to the first (module docstring, step 2), check the second's MAC
        and hand the connection to a thread of its own."""
        try:
            if len(entry.buffer) < 4:
                want = 4 - len(entry.buffer)
            else:
                want = 4 + _frame_length(entry.buffer[:4], MAX_HELLO, "hello") - len(entry.buffer)
            chunk = entry.sock.recv(want)
        except BlockingIOError:
            return
        except FrameError as exc:  # pragma: no cover - checked when the length arrived
            self._drop(sel, pending, entry, str(exc))
            return
        except OSError as exc:
            self._drop(sel, pending, entry, f"before its hello: {exc}")
            return
        if not chunk:
            self._drop(sel, pending, entry, "closed before its hello")
            return
        entry.buffer += chunk
        if len(entry.buffer) < 4:
            return
        try:
            n = _frame_length(entry.buffer[:4], MAX_HELLO, "hello")
            if len(entry.buffer) < 4 + n:
                return
            hello = _decode(entry.buffer[4:], "hello")
            entry.buffer = b""
            if entry.nonce_c is None:
                self._hello_reply(entry, hello)
                return
            assert entry.nonce_w is not None
            expected = _mac(self._auth_key, "coordinator connect", entry.nonce_c, entry.nonce_w)
            if not hmac.compare_digest(_hello_mac(hello), expected):
                raise PermissionError("bad token")
        except (FrameError, PermissionError) as exc:
            self._drop(sel, pending, entry, str(exc))
            return
        except OSError as exc:
            self._drop(sel, pending, entry, f"cannot send its hello reply: {exc}")
            return
        self._drop(sel, pending, entry, None)
        to_coordinator, to_worker = derive_keys(self.token, entry.nonce_w, entry.nonce_c)
        channel = _Channel(entry.sock, FrameSealer(to_worker), FrameOpener(to_coordinator))
        try:
            entry.sock.setblocking(True)
        except OSError:  # pragma: no cover - closed under us
            entry.sock.close()
            return
        threading.Thread(target=self._link, args=(channel, entry.addr), daemon=True,
                         name="tokenflow-coordinator-link").start()

    def _hello_reply(self, entry: _Pending, hello: dict[str, Any]) -> None:
        """Check the first hello frame and send the coordinator's nonce and MAC.

        Raises:
            PermissionError: another protocol version or no nonce.
            OSError: the reply did not fit the socket's buffer at once (it is ~100 bytes).
        """
        version = hello.get("v", 1)
        if version != PROTOCOL_VERSION:
            raise PermissionError(f"hello of coordinator protocol {_show(version)}, not "
                                  f"{PROTOCOL_VERSION} (an older tokenflow worker?)")
        entry.nonce_w = _hello_nonce(hello)
        entry.nonce_c = os.urandom(NONCE_SIZE)
        data = msgpack.packb({"nonce": entry.nonce_c, "mac": _mac(
            self._auth_key, "coordinator accept", entry.nonce_w, entry.nonce_c)})
        frame = _LEN.pack(len(data)) + data
        if entry.sock.send(frame) != len(frame):  # pragma: no cover - a fresh socket's buffer
            raise OSError("partial send")

    def _link(self, channel: _Channel, addr: Any) -> None:
        """Serve one authenticated connection until it closes or sends a frame that is
        malformed or fails its integrity check; a frame with bad fields is refused (logged)
        and the connection goes on."""
        conn = channel.sock
        try:
            while not self._closed:
                try:
                    message = _read_sealed(conn, channel.opener)
                except (SealedFrameError, FrameError) as exc:  # before OSError: a ConnectionError
                    self._refuse(addr, f"closing the connection: {exc}")
                    return
                except (EOFError, OSError):
                    return
                try:
                    self._take(message, channel)
                except ReportError as exc:
                    self._refuse(addr, f"refused a message: {exc}")
        except Exception as exc:  # noqa: BLE001 - never let a client end the job
            self._refuse(addr, f"closing the connection after an internal error: "
                               f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                for w in [w for w, c in self._links.items() if c is channel]:
                    del self._links[w]
            conn.close()

    def _take(self, message: dict[str, Any], channel: _Channel) -> None:
        """File one message from an authenticated connection.

        Raises:
            ReportError: a field is missing or bad.
        """
        kind = message.get("kind")
        if kind is not None:
            if not isinstance(kind, str):
                raise ReportError(f"'kind' must be a string, got {_show(kind)}")
            if kind == "heartbeat":
                worker = _worker_index(message)
                job, done = message.get("job", ""), message.get("done", False)
                if not isinstance(job, str) or len(job) > 256 or not isinstance(done, bool):
                    raise ReportError("heartbeat: 'job' must be a string and 'done' a boolean")
                with self._lock:
                    beats = self._beats.setdefault(job, {})
                    beats[worker] = (time.monotonic(), done or beats.get(worker, (0.0, False))[1])
                return
            if kind == "mesh_address":
                self._take_address(message, channel)
                return
            validate_reply(message)
            with self._lock:
                self._links[message["worker"]] = channel
            self.inbox.put(message)
            return
        report = validate_report(message)
        report["received"] = time.time()
        with self._lock:
            self._links[report["worker"]] = channel
            self.reports[report["worker"]] = report

    def _take_address(self, message: dict[str, Any], channel: _Channel) -> None:
        """File a worker's listening address for ``gather_addresses``.

        Raises:
            ReportError: ``job``, ``host`` or ``port`` is missing or bad.
        """
        worker = _worker_index(message)
        job, host, port = message.get("job"), message.get("host"), message.get("port")
        if not isinstance(job, str) or not 0 < len(job) <= 256:
            raise ReportError(f"mesh_address: 'job' must be a string, got {_show(job)}")
        if not isinstance(host, str) or not 0 < len(host) <= 255:
            raise ReportError(f"mesh_address: 'host' must be a host name, got {_show(host)}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ReportError(f"mesh_address: 'port' must be a port number, got {_show(port)}")
        with self._lock:
            if job not in self._addresses and len(self._addresses) >= MAX_GATHERS:
                raise ReportError(f"mesh_address: more than {MAX_GATHERS} jobs gathering at once")
            self._addresses.setdefault(job, {})[worker] = (host, port, channel)
            self._arrived.notify_all()

    # -- API -------------------------------------------------------------------------------

    def gather_addresses(self, job: str, workers: int, done: Callable[[], bool]) -> None:
        """Serve ``job``'s address exchange until ``done()``: whenever workers ``0..workers-1``
        have each sent ``{"kind": "mesh_address", "worker", "job", "host", "port"}``, reply to
        each with ``{"kind": "mesh_addresses", "job", "addresses": [[host, port], ...]}`` (in worker
        order) and wait for the next set (a re-attempted stage).

        The Spark runtime's tasks exchange their mesh addresses this way rather than with
        ``BarrierTaskContext.allGather``, which returns only after a 1 s poll in every task
        but the last to arrive (measured: 1.00 s of a 1.2 s empty job).
        """
        wanted = set(range(workers))
        while not done():
            with self._lock:
                arrived = self._addresses.get(job, {})
                if not wanted <= arrived.keys():
                    self._arrived.wait(0.05)
                    continue
                entries = [arrived.pop(w) for w in range(workers)]
            reply = {"kind": "mesh_addresses", "job": job,
                     "addresses": [[host, port] for host, port, _ in entries]}
            for _, _, channel in entries:
                try:
                    channel.send(reply)
                except OSError:  # that task is gone: the stage fails and says why
                    pass
        with self._lock:
            self._addresses.pop(job, None)

    def send(self, worker: int, message: dict[str, Any]) -> None:
        """Send a command (a map with a ``"kind"``) to ``worker``, sealed.

        Raises:
            KeyError: the worker has not connected (it connects when it starts).
            OSError: its connection failed.
        """
        with self._lock:
            channel = self._links[worker]
        channel.send(message)

    def connected(self) -> list[int]:
        """Workers whose connection is open, ascending."""
        with self._lock:
            return sorted(self._links)

    def snapshot(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self.reports.items()}

    def heartbeats(self, job: str) -> dict[int, tuple[float, bool]]:
        """Per worker of ``job``: ``(time.monotonic() of its last heartbeat, whether it said it
        was done)``."""
        with self._lock:
            return dict(self._beats.get(job, {}))

    def forget(self, job: str) -> None:
        """Drop ``job``'s heartbeats and addresses (after it ended)."""
        with self._lock:
            self._beats.pop(job, None)
            self._addresses.pop(job, None)

    def reset(self) -> None:
        """Forget all reports (before the next job on the same coordinator)."""
        with self._lock:
            self.reports.clear()

    def close(self) -> None:
        self._closed = True
        _LIVE.pop((self.address[1], self.token), None)
        self._sock.close()

    @property
    def endpoint(self) -> tuple[str, int, str]:
        """``(host, port, token)`` to hand to workers."""
        return self.address[0], self.address[1], self.token


class Liveness:
    """Which worker of a job stopped sending heartbeats.

    A worker is *stalled* when its last heartbeat is more than ``timeout`` seconds old, or,
    never heard from, when another worker was first heard from more than ``startup_grace``
    seconds ago (all workers of a job start together; default ``max(60, 6 * timeout)``).
    Workers that finished (``finish``) are not watched.  Times are ``time.monotonic()`` s.
    """

    def __init__(self, workers: int, timeout: float, startup_grace: float | None = None) -> None:
        self.timeout = timeout
        self.startup_grace = max(60.0, 6 * timeout) if startup_grace is None else startup_grace
        self.last: list[float | None] = [None] * workers
        self.finished: set[int] = set()
        self.first: float | None = None

    def beat(self, worker: int, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        if self.first is None:
            self.first = at
        last = self.last[worker]
        self.last[worker] = at if last is None else max(last, at)

    def finish(self, worker: int) -> None:
        self.finished.add(worker)

    def watch(self, worker: int, at: float | None = None) -> None:
        """Watch ``worker`` (started now, e.g. joining a running job) as if it had just sent
        a heartbeat."""
        while len(self.last) <= worker:
            self.last.append(None)
        self.beat(worker, at)

    def stalled(self, now: float | None = None) -> tuple[int, str] | None:
        """The first stalled worker and why (``"stalled: no heartbeat for 10.2 s"``), or None."""
        now = time.monotonic() if now is None else now
        for worker, last in enumerate(self.last):
            if worker in self.finished:
                continue
            if last is not None and now - last > self.timeout:
                return worker, f"stalled: no heartbeat for {now - last:.1f} s"
            if last is None and self.first is not None and now - self.first > self.startup_grace:
                return worker, (f"stalled: no heartbeat {now - self.first:.1f} s after the first "
                                f"worker's")
        return None


class Reporter:
    """A worker-side ``on_step`` hook sending a report at most every ``interval`` seconds; it
    also sends control replies (``send``), receives commands (``poll``) and, once
    ``start_heartbeat`` is called, heartbeats from a thread of its own."""

    def __init__(self, endpoint: tuple[str, int, str], interval: float = 0.25) -> None:
        host, port, token = endpoint
        self.interval = interval
        self.start = time.monotonic()
        self.last = 0.0
        self.sock: socket.socket | None = None
        self._sealer: FrameSealer | None = None
        self._opener: FrameOpener | None = None
        self._lock = threading.Lock()  # one writer at a time: the worker and its heartbeat
        self._beating: threading.Event | None = None
        self._beat_thread: threading.Thread | None = None
        self._final: dict[str, Any] | None = None
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=5)
            self._sealer, self._opener = self._hello(sock, token)
            self.sock = sock
        except (OSError, EOFError, FrameError, PermissionError) as exc:
            log.warning("cannot reach the coordinator at %s:%s: %s", host, port, exc)
            if sock is not None:
                sock.close()

    @staticmethod
    def _hello(sock: socket.socket, token: str) -> tuple[FrameSealer, FrameOpener]:
        """The worker's side of the hello (module docstring); this connection's sealer and
        opener.

        Raises:
            PermissionError: the other side does not know the token (its MAC is wrong).
            FrameError, EOFError, OSError: a malformed reply or a failed connection.
        """
        key = auth_key(token)
        nonce_w = os.urandom(NONCE_SIZE)
        _write(sock, {"v": PROTOCOL_VERSION, "nonce": nonce_w})
        reply = _read(sock)
        nonce_c = _hello_nonce(reply)
        genuine = hmac.compare_digest(_hello_mac(reply),
                                      _mac(key, "coordinator accept", nonce_w, nonce_c))
        # answered even when the reply was wrong, so that the coordinator's refusal log names
        # a wrong token; the MAC is bound to both fresh nonces and opens nothing elsewhere
        _write(sock, {"mac": _mac(key, "coordinator connect", nonce_c, nonce_w)})
        if not genuine:
            raise PermissionError("it failed the token check (a wrong token, or not this job's "
                                  "coordinator)")
        to_coordinator, to_worker = derive_keys(token, nonce_w, nonce_c)
        return FrameSealer(to_coordinator), FrameOpener(to_worker)

    def _send(self, message: dict[str, Any]) -> bool:
        """Seal and send ``message``; False (and no connection from now on) when that fails."""
        data = msgpack.packb(message)
        with self._lock:
            if self.sock is None or self._sealer is None:
                return False
            try:
                self.sock.sendall(self._sealer.seal_control(KIND_MESSAGE, data))
                return True
            except OSError:
                self.sock = None
                return False

    def send(self, message: dict[str, Any]) -> None:
        """Send a control reply now (``message`` has a ``"kind"`` and the worker index).

        Raises:
            ConnectionError: the coordinator cannot be reached.
        """
        if not self._send(message):
            raise ConnectionError("no connection to the coordinator")

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None:
        """The next command from the coordinator, or None if none came within ``timeout``
        seconds (0: do not wait; None: wait until one comes).

        Raises:
            ConnectionError: the coordinator closed the connection, or sent a malformed frame
                or one that failed its integrity check (forged, altered, replayed: logged,
                and the connection is closed).
        """
        sock, opener = self.sock, self._opener
        if sock is None or opener is None:
            raise ConnectionError("no connection to the coordinator")
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            return None
        try:
            return _read_sealed(sock, opener)
        except (EOFError, ValueError, OSError) as exc:
            if isinstance(exc, SealedFrameError | FrameError):
                log.warning("refused a frame from the coordinator, closing the connection: %s", exc)
            self._disconnect()
            raise ConnectionError(f"coordinator connection failed: {exc}") from exc

    def _disconnect(self) -> None:
        with self._lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None

    def exchange_addresses(self, worker: int, job: str, host: str, port: int,
                           timeout: float) -> list[tuple[str, int]]:
        """Send this worker's listening address and wait for every worker's, from
        ``Coordinator.gather_addresses``; ``(host, port)`` per worker, in worker order.

        Raises:
            ConnectionError: no connection to the coordinator, or it closed.
            TimeoutError: no answer within ``timeout`` seconds.
            ReportError: the answer is not a list of ``[host, port]`` pairs.
        """
        self.send({"kind": "mesh_address", "worker": worker, "job": job, "host": host,
                   "port": port})
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.poll(left)
            if message is None or message.get("kind") != "mesh_addresses" or \
                    message.get("job") != job:
                continue
            pairs = message.get("addresses")
            if not isinstance(pairs, list) or not all(
                    isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _is_int(p[1])
                    for p in pairs):
                raise ReportError(f"mesh_addresses: expected [host, port] pairs, got {_show(pairs)}")
            return [(h, int(p)) for h, p in pairs]
        raise TimeoutError(f"worker {worker}: no peer addresses from the coordinator within "
                           f"{timeout:g} s")

    def start_heartbeat(self, worker: int, job: str, interval: float = HEARTBEAT_INTERVAL) -> None:
        """Send ``{"kind": "heartbeat", "worker", "job"}`` every ``interval`` s from a daemon
        thread until ``stop_heartbeat`` (or the connection fails)."""
        if self._beat_thread is not None or self.sock is None:
            return
        stop = self._beating = threading.Event()
        beat = {"kind": "heartbeat", "worker": worker, "job": job, "done": False}

        def run() -> None:
            while self._send(beat) and not stop.wait(interval):
                pass

        self._final = {**beat, "done": True}
        self._beat_thread = threading.Thread(target=run, daemon=True, name="tokenflow-heartbeat")
        self._beat_thread.start()

    def stop_heartbeat(self) -> None:
        """Stop the heartbeats and send a last one saying the worker is done."""
        if self._beating is None or self._beat_thread is None:
            return
        self._beating.set()
        self._beat_thread.join(timeout=5)
        if self._final is not None:
            self._send(self._final)
        self._beating = None

    def __call__(self, worker: Any, force: bool = False) -> None:
        now = time.monotonic()
        if self.sock is None or (not force and now - self.last < self.interval):
            return
        self.last = now
        frontiers = {df: {op: [str(t) for t in f] for op, f in ops.items()}
                     for df, ops in worker.frontiers().items()}
        report = {"worker": worker.index, "steps": worker.steps, "elapsed": now - self.start,
                  "records_in": int(worker.metrics.get("records_in", 0)),
                  "frontiers": frontiers, "done": worker.dataflows_running == 0}
        if len(msgpack.packb(report)) > MAX_REPORT:  # too many operators: keep the totals
            report["frontiers"] = {}
        self._send(report)

    def close(self, worker: Any = None) -> None:
        """Send a last report (when ``worker`` is given), stop the heartbeats and close."""
        if worker is not None:
            self(worker, force=True)
        self.stop_heartbeat()
        self._disconnect()


def attach(worker: Any, endpoint: tuple[str, int, str] | None) -> Reporter | None:
    """Install a ``Reporter`` on ``worker`` when a coordinator endpoint is given."""
    if endpoint is None:
        return None
    reporter = Reporter(endpoint)
    worker.on_step.append(reporter)
    return reporter
