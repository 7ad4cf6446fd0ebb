"""The TCP mesh: worker processes connected all-to-all, authenticated, every frame sealed.

Source: docs/ARCHITECTURE.md ("Execution model", "Data plane", "Security"), docs/SECURITY.md;
timely's ``communication/allocator/zero_copy``.  Worker ``i`` connects to every ``j < i`` and
accepts from every ``j > i``; each connection first passes the handshake of
``tokenflow.comm.auth``, which gives it two fresh keys, and every later frame is sealed with
them (AES-256-GCM with a per-direction sequence number, ``tokenflow.comm.frames``).

The worker thread does all the reading and sending itself, on non-blocking sockets: each
``receive()`` reads what has arrived on every connection (length checked before a body is
read, tag verified before anything is decoded) and appends the decoded messages to their
channels' FIFOs; ``park(timeout)`` waits in ``epoll`` for the first byte from any peer, so a
message wakes the worker in one hop (no receiver thread to wake first, no GIL to hand over),
and another thread's ``wake()`` ends the wait through a socket pair watched there too;
``flush()`` seals its buffered messages and sends them in one ``sendmsg`` per peer; what a
full socket does not take waits in the connection's queue and goes out as the peer reads
(``poll`` and ``park`` watch for room), so a send never blocks the worker: two workers
sending to each other at once, or one waiting for the control plane while a peer sends to
it, cannot block each other.

The listener keeps running for the whole job so that stray connections are refused while the
job goes on, within limits: one deadline for a whole handshake (``handshake_timeout``), at
most ``max_pending`` connections awaiting authentication (the oldest is closed for a new
one), an accept loop that backs off and goes on through ``EMFILE`` and other errors, and
refusals logged rate-limited: the first of each kind in full, then a count per
``log_interval``.

A peer that closes its connection without a (sealed) goodbye frame is reported as
``PeerLostError`` naming that worker; a frame that fails its checks as ``FrameRefusedError``
naming it: the job fails fast instead of hanging or running on tampered data.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

from tokenflow.comm.auth import (
    AuthenticationError,
    Session,
    accept_handshake,
    connect_handshake,
    job_secret,
)
from tokenflow.comm.frames import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    KIND_ARROW,
    KIND_GOODBYE,
    KIND_PICKLE,
    MAX_SEALED_PAYLOAD,
    TAG_SIZE,
    FrameError,
    FrameOpener,
    _describe,
    allocate,
    decode_message,
    encode_payload,
)

log = logging.getLogger("tokenflow.comm.tcp")

Address = tuple[str, int]

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a connection has for the whole handshake (every read and write together)."""

MAX_PENDING = 64
"""Connections a listener keeps awaiting authentication; beyond it the oldest is closed."""

LOG_INTERVAL = 10.0
"""Seconds over which refused connections and accept failures are counted into one line."""

_ACCEPT_POLL = 0.5  # seconds: how often the accept loop looks at its log and at close()
_FRAMES_PER_READ = 256  # frames read from one connection per pass (the rest on the next)
_LISTENER_GONE = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK}
_WAKE = object()  # the selector key data of the wake-up socket (``TcpMesh.wake``)


class PeerLostError(ConnectionError):
    """A peer worker's connection closed unexpectedly (the worker died or was killed)."""

    def __init__(self, worker: int, address: Address | None, detail: str) -> None:
        where = f" at {address[0]}:{address[1]}" if address else ""
        super().__init__(f"lost connection to worker {worker}{where}: {detail}")
        self.worker = worker


class FrameRefusedError(ConnectionError):
    """A peer sent a frame this worker refused (malformed, oversized, of an unknown kind, or
    failing its integrity check): a failure in its own right, not the consequence of another
    worker's."""

    def __init__(self, worker: int, address: Address | None, detail: str) -> None:
        where = f" at {address[0]}:{address[1]}" if address else ""
        super().__init__(f"refused a frame from worker {worker}{where}: {detail}")
        self.worker = worker


class MeshSetupError(ConnectionError):
    """The mesh could not be formed (peers unreachable or failing authentication)."""


def bind_listener(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket for a worker (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:  # pragma: no cover - platform limits
            pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:  # pragma: no cover
        pass


class RefusalLog:
    """Rate-limited log of refused connections for one listener.

    The first refusal of each reason in an interval is logged in full (address and detail);
    the others are only counted, and ``flush`` logs one line with the counts once the
    interval is over (or when forced): "worker 0 refused 9,412 connections in the last 10 s:
    9,000 bad handshake, 412 handshake deadline".  Thread-safe.

    Args:
        index: the worker's index (in every line).
        interval: seconds per counting interval.
    """

    def __init__(self, index: int, interval: float = LOG_INTERVAL) -> None:
        self.index = index
        self.interval = interval
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._counts: Counter[str] = Counter()
        self._suppressed = 0
        self.lines = 0
        """Lines logged so far (tests bound it)."""

    def record(self, address: Any, reason: str, detail: str) -> None:
        """Count one refused connection from ``address`` for ``reason``."""
        with self._lock:
            self._roll(time.monotonic())
            first = reason not in self._counts
            self._counts[reason] += 1
            if first:
                self.lines += 1
                where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
                log.warning("worker %d refused a connection from %s: %s", self.index, where, detail)
            else:
                self._suppressed += 1

    def flush(self, force: bool = False) -> None:
        """Log the counts if the interval is over (or ``force``) and anything went unlogged."""
        with self._lock:
            now = time.monotonic()
            if force:
                self._emit(now)
            else:
                self._roll(now)

    def _roll(self, now: float) -> None:
        if now - self._start >= self.interval:
            self._emit(now)

    def _emit(self, now: float) -> None:
        if self._suppressed:
            total = sum(self._counts.values())
            kinds = ", ".join(f"{n:,} {reason}" for reason, n in self._counts.most_common())
            self.lines += 1
            elapsed = now - self._start
            log.warning("worker %d refused %s connections in the last %s s: %s (the first of "
                        "each kind logged above)", self.index, f"{total:,}",
                        f"{elapsed:.0f}" if elapsed >= 10 else f"{elapsed:.1f}", kinds)
        self._start = now
        self._counts.clear()
        self._suppressed = 0


class TcpMesh:
    """This worker's connections to every peer.

    Args:
        index: this worker's index.
        peers: number of workers.
        listener: a bound, listening socket (see ``bind_listener``).
        secret: the per-job secret (mixed with ``TOKENFLOW_SECRET_FILE``'s contents when
            that is set: ``tokenflow.comm.auth.job_secret``).
        job: the job's name (part of the handshake).
        max_frame: largest accepted frame payload in bytes.
        handshake_timeout: seconds for a whole handshake, accepted or dialled.
        max_pending: connections awaiting authentication at once (beyond it the oldest is
            closed), which bounds the threads and file descriptors strangers can take.
        log_interval: seconds over which refusals and accept failures are counted per line.
    """

    def __init__(self, index: int, peers: int, listener: socket.socket, secret: bytes, job: str,
                 max_frame: int = DEFAULT_MAX_FRAME, handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 max_pending: int = MAX_PENDING, log_interval: float = LOG_INTERVAL) -> None:
        self.index = index
        self.peers = peers
        self.listener = listener
        self.secret = job_secret(secret)
        self.job = job
        self.max_frame = min(max_frame, MAX_SEALED_PAYLOAD)
        self.handshake_timeout = handshake_timeout
        self.max_pending = max(1, max_pending)
        self.addresses: list[Address | None] = []
        self.sockets: dict[int, socket.socket] = {}
        self.sessions: dict[int, Session] = {}
        self.queues: dict[int, deque[Any]] = {}
        self.events: deque[int] = deque()
        self.failure: BaseException | None = None
        self.goodbyes: set[int] = set()
        self.refused = 0
        """Connections refused so far (failed or abandoned handshakes)."""
        self.accept_failures = 0
        """``accept`` calls that failed so far (``EMFILE`` and the like)."""
        self.refusals = RefusalLog(index, log_interval)
        self.closing = False
        self._closed = threading.Event()
        self._registered = threading.Condition()
        self._queues_lock = threading.Lock()
        self._send_locks: dict[int, threading.Lock] = {}
        self._pending: dict[socket.socket, float] = {}  # accepted, unauthenticated -> since
        self._evicted: set[socket.socket] = set()
        self._claimed: set[int] = set()
        self._claims: dict[socket.socket, int] = {}  # claimed, not yet registered
        self._pending_changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._selector = selectors.DefaultSelector()
        self._peers: dict[int, _Peer] = {}  # open connections
        self._watched: list[socket.socket] = []  # end a park when readable, read by their owner
        self._io = threading.RLock()  # one thread reads or writes the sockets at a time
        # ``wake()``: a byte written to one end ends a ``park`` waiting on the other
        self._wake_reader, self._wake_writer = socket.socketpair()
        for end in (self._wake_reader, self._wake_writer):
            end.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, _WAKE)
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def address(self) -> Address:
        host, port = self.listener.getsockname()[:2]
        return host, port

    @property
    def pending(self) -> int:
        """Connections accepted and still in their handshake."""
        return len(self._pending)

    # -- setup -----------------------------------------------------------------------------

    def connect(self, addresses: Sequence[Address | None], timeout: float = 30.0,
                members: list[int] | None = None) -> None:
        """Form the mesh with the workers at ``addresses`` (indexed by worker slot; None for a
        slot without a worker).  ``members``: the workers to connect to now (default every
        slot); each dials the members below it and accepts the others, so a worker joining a
        running job later (in a higher slot, slots are never reused) dials every member and
        the members accept it (``tokenflow.membership``).

        Raises:
            MeshSetupError: when a peer cannot be reached or authenticated within ``timeout``.
        """
        self.addresses = [tuple(a) if a is not None else None  # type: ignore[misc]
                          for a in addresses]
        members = list(range(self.peers)) if members is None else sorted(members)
        accept = threading.Thread(target=self._accept_loop, name=f"tokenflow-accept-{self.index}",
                                  daemon=True)
        accept.start()
        self._threads.append(accept)
        deadline = time.monotonic() + timeout
        for j in members:
            if j < self.index:
                sock, session = self._dial(j, deadline)
                self._register(j, sock, session)
        expected = [j for j in members if j != self.index]
        with self._registered:
            while not all(j in self.sockets for j in expected):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [j for j in expected if j not in self.sockets]
                    raise MeshSetupError(
                        f"worker {self.index}: workers {missing} did not connect within {timeout:.0f} s"
                    )
                self._registered.wait(min(left, 0.5))

    def _dial(self, j: int, deadline: float) -> tuple[socket.socket, Session]:
        address = self.addresses[j]
        if address is None:
            raise MeshSetupError(f"worker {self.index}: no address for worker {j}")
        host, port = address
        last: BaseException | None = None
        while time.monotonic() < deadline:
            sock: socket.socket | None = None
            try:
                left = deadline - time.monotonic()
                sock = socket.create_connection((host, port), timeout=max(0.01, min(5.0, left)))
                _tune(sock)
                session = connect_handshake(
                    sock, self.secret, self.job, self.index, j,
                    deadline=min(deadline, time.monotonic() + self.handshake_timeout))
                sock.settimeout(None)
                return sock, session
            except (OSError, EOFError) as exc:
                last = exc
                if sock is not None:
                    _close(sock)
                if isinstance(exc, AuthenticationError):
                    break
                time.sleep(0.05)
        raise MeshSetupError(f"worker {self.index} could not connect to worker {j} at "
                             f"{host}:{port}: {last}")

    def _accept_loop(self) -> None:
        """Accept connections until ``close()``, handing each to a handshake thread.

        Never exits on an error: ``EMFILE`` / ``ENFILE`` (out of file descriptors) and other
        ``accept`` failures are logged once, counted, and retried with a growing back-off
        (the oldest pending handshake is closed to free a descriptor); the count is logged
        when ``accept`` works again, and every ``log_interval`` while it does not.
        """
        listener = self.listener
        try:
            listener.settimeout(_ACCEPT_POLL)
        except OSError:  # closed before the loop started
            return
        failures = 0
        first_failure = last_report = 0.0
        last_error = ""
        backoff = 0.0
        while not self.closing:
            self.refusals.flush()
            try:
                sock, addr = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self.closing:
                    return
                if exc.errno in _LISTENER_GONE:
                    log.error("worker %d: the listener failed (%s); no more connections are "
                              "accepted", self.index, _describe(exc))
                    return
                now = time.monotonic()
                failures += 1
                self.accept_failures += 1
                last_error = _describe(exc)
                if failures == 1:
                    first_failure = last_report = now
                    log.warning("worker %d: accept failed (%s); backing off and retrying, "
                                "further failures are counted", self.index, last_error)
                elif now - last_report >= self.refusals.interval:
                    last_report = now
                    log.warning("worker %d: accept failed %d times in %.0f s (last: %s); still "
                                "retrying", self.index, failures, now - first_failure, last_error)
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._evict_oldest()
                backoff = min(1.0, backoff * 2 if backoff else 0.01)
                self._closed.wait(backoff)
                continue
            if failures:
                log.warning("worker %d: accept works again after %d failures in %.1f s (last: %s)",
                            self.index, failures, time.monotonic() - first_failure, last_error)
                failures = 0
                backoff = 0.0
            self._admit_connection(sock, addr)

    def _admit_connection(self, sock: socket.socket, addr: Any) -> None:
        """Start ``sock``'s handshake, closing the oldest pending one first if there are
        ``max_pending`` already (and waiting until its thread is gone)."""
        with self._pending_changed:
            while len(self._pending) >= self.max_pending and not self.closing:
                self._evict_oldest_locked()
                self._pending_changed.wait(0.5)
            if self.closing:
                _close(sock)
                return
            self._pending[sock] = time.monotonic()
        try:
            threading.Thread(target=self._accept_one, args=(sock, addr), daemon=True,
                             name=f"tokenflow-handshake-{self.index}").start()
        except RuntimeError as exc:  # can't start new thread
            self._refuse(sock, addr, "no thread", f"could not start a handshake thread: {exc}")

    def _evict_oldest(self) -> None:
        with self._pending_changed:
            self._evict_oldest_locked()

    def _evict_oldest_locked(self) -> None:
        for sock in self._pending:  # insertion order: the oldest first
            if sock not in self._evicted:
                self._evicted.add(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes its handshake thread
                except OSError:
                    pass
                return

    def _claim(self, sock: socket.socket, peer: int) -> None:
        """``accept_handshake``'s admission check, before the key confirmation is sent: the
        peer's index is one that dials us and not yet connected, and the connection was not
        closed for a newer one; from here on it no longer counts as pending."""
        with self._pending_changed:
            if sock in self._evicted:
                raise AuthenticationError("closed while awaiting authentication", "evicted")
            if not self.index < peer < self.peers:
                raise AuthenticationError(f"unexpected peer index {peer}", "wrong peer")
            if peer in self._claimed:
                raise AuthenticationError(f"worker {peer} is already connected", "wrong peer")
            self._claimed.add(peer)
            self._claims[sock] = peer
            self._pending.pop(sock, None)
            self._pending_changed.notify_all()

    def _accept_one(self, sock: socket.socket, addr: Any) -> None:
        since = time.monotonic()
        try:
            session = accept_handshake(sock, self.secret, self.job, self.index,
                                       deadline=since + self.handshake_timeout,
                                       admit=lambda peer: self._claim(sock, peer))
            sock.settimeout(None)
            _tune(sock)
            self._register(session.peer, sock, session)
        except Exception as exc:  # noqa: BLE001 - every failure refuses the connection
            with self._pending_changed:
                evicted = sock in self._evicted
            if self.closing:
                _close(sock)
            else:
                self._refuse(sock, addr, *self._classify(exc, evicted, since))
            with self._pending_changed:  # a genuine peer whose handshake failed late may retry
                peer = self._claims.pop(sock, None)
                if peer is not None:
                    self._claimed.discard(peer)
        finally:
            with self._pending_changed:
                self._pending.pop(sock, None)
                self._evicted.discard(sock)
                self._claims.pop(sock, None)
                self._pending_changed.notify_all()

    def _classify(self, exc: Exception, evicted: bool, since: float) -> tuple[str, str]:
        """``(reason, detail)`` of a failed handshake: a short category for the counts and a
        message that always says what went wrong."""
        if evicted:
            return "evicted", (f"closed after {time.monotonic() - since:.1f} s unauthenticated: "
                               f"more than {self.max_pending} connections awaiting authentication "
                               "(the oldest is closed first)")
        if isinstance(exc, TimeoutError):
            return "handshake deadline", f"no handshake within {self.handshake_timeout:g} s ({exc})"
        if isinstance(exc, EOFError):
            return "closed during handshake", str(exc)
        if isinstance(exc, ConnectionResetError | BrokenPipeError):
            return "closed during handshake", _describe(exc)
        if isinstance(exc, AuthenticationError | FrameError):
            return exc.reason, str(exc)
        if isinstance(exc, OSError):
            return "socket error", _describe(exc)
        return "bad handshake", _describe(exc)

    def _refuse(self, sock: socket.socket, addr: Any, reason: str, detail: str) -> None:
        with self._pending_changed:
            self.refused += 1
        self.refusals.record(addr, reason, detail)
        _close(sock)

    def _register(self, j: int, sock: socket.socket, session: Session) -> None:
        sock.setblocking(False)
        conn = _Peer(j, sock, session.opener)
        with self._registered:
            self.sockets[j] = sock
            self.sessions[j] = session
            self._send_locks[j] = threading.Lock()
            self._peers[j] = conn
            # (epoll: a worker parked in select sees a connection registered meanwhile)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._registered.notify_all()

    # -- data path -------------------------------------------------------------------------

    def queue(self, channel: int) -> deque[Any]:
        q = self.queues.get(channel)
        if q is None:
            with self._queues_lock:
                q = self.queues.setdefault(channel, deque())
        return q

    def deliver_local(self, channel: int, message: Any) -> None:
        self.queue(channel).append(message)
        self.events.append(channel)

    def poll(self, timeout: float = 0.0) -> None:
        """Read every frame that has arrived, waiting up to ``timeout`` s for the first byte
        when none has; a failure is kept for ``check()``."""
        with self._io:
            if self.closing:
                return
            if self._watched:
                self._drop_closed()
            for key, mask in self._selector.select(timeout):  # (close() takes _io to close it)
                if key.data is None:  # a watched socket: its owner reads it
                    continue
                if key.data is _WAKE:
                    self._drain_wake()
                    continue
                if mask & selectors.EVENT_READ:
                    self._read(key.data)
                if mask & selectors.EVENT_WRITE and key.data.peer in self._peers:
                    try:
                        self._write(key.data)
                    except PeerLostError as exc:
                        self._forget(key.data.peer)
                        self._fail(exc)

    def wake(self) -> None:
        """From any thread: end the current or next ``poll``/``park`` wait at once (a worker
        parked with nothing to do then steps; ``Worker.unpark``).  Cheap and never blocks: a
        wake-up already pending is enough, so a full socket buffer is not an error."""
        if self.closing:
            return
        try:
            self._wake_writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending (full buffer), or the mesh is closing

    def _drain_wake(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def watch(self, sock: socket.socket) -> None:
        """Also end a ``poll``/``park`` wait as soon as ``sock`` is readable, leaving what
        arrived for its owner to read: a worker parked with nothing to do then sees a command
        of the driver's control plane (``tokenflow.control``) at once, not when its park times
        out (up to ``PARK_CAP`` later, for each command of a checkpoint's rounds).  The owner
        must read ``sock`` on every step, or a park returns at once while data waits; a
        watched socket its owner closes is dropped at the next ``poll``."""
        with self._io:
            self._drop_closed()
            if not self.closing and sock not in self._watched:
                self._selector.register(sock, selectors.EVENT_READ, None)
                self._watched.append(sock)

    def unwatch(self, sock: socket.socket) -> None:
        """Stop ``watch``ing ``sock`` (nothing happens if it is not watched)."""
        with self._io:
            if sock in self._watched:
                self._watched.remove(sock)
                if not self.closing:
                    try:
                        self._selector.unregister(sock)
                    except (KeyError, ValueError, OSError):
                        pass

    def _drop_closed(self) -> None:
        """Unregister watched sockets their owner closed (their descriptor may be reused)."""
        for sock in [s for s in self._watched if s.fileno() < 0]:
            self.unwatch(sock)

    def _read(self, conn: _Peer) -> None:
        """Read and deliver the frames ``conn``'s socket has, up to ``_FRAMES_PER_READ``
        (the caller holds ``_io``)."""
        j, sock = conn.peer, conn.sock
        try:
            for _ in range(_FRAMES_PER_READ):
                frame = conn.read_frame(self.max_frame)
                if frame is None:
                    return
                kind, channel, payload = frame
                self.bytes_received += payload.nbytes + HEADER_SIZE + TAG_SIZE
                if kind == KIND_PICKLE or kind == KIND_ARROW:
                    self.queue(channel).append(decode_message(kind, payload))
                    self.events.append(channel)
                elif kind == KIND_GOODBYE:
                    self.goodbyes.add(j)
                else:
                    raise FrameError(f"unexpected frame kind {kind}")
        except EOFError as exc:
            self._forget(j)
            if j not in self.goodbyes and not self.closing:
                self._fail(PeerLostError(j, self._addr(j), f"connection closed ({exc})"))
        except FrameError as exc:
            where = self._addr(j)
            log.error("worker %d: refused a frame from worker %d%s, closing the connection: %s",
                      self.index, j, f" at {where[0]}:{where[1]}" if where else "", exc)
            self._forget(j)
            self._fail(FrameRefusedError(j, where, str(exc)))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except OSError as exc:
            self._forget(j)
            if not self.closing:
                self._fail(PeerLostError(j, self._addr(j), str(exc)))

    def _forget(self, j: int) -> None:
        """Stop reading from peer ``j`` (its connection ended or was refused)."""
        conn = self._peers.pop(j, None)
        if conn is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass

    def _addr(self, j: int) -> Address | None:
        return self.addresses[j] if j < len(self.addresses) else None

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error

    def send_messages(self, j: int, messages: list[tuple[int, Any]]) -> None:
        """Serialize, seal and send ``(channel, message)`` pairs to peer ``j``, in order.

        Every message is serialized before any is sealed, so a message that cannot be
        serialized raises with no sequence number used.

        Raises:
            PeerLostError: when the connection is gone.
            FrameError: a message over the largest sealable frame.
            whatever pickling raises.
        """
        payloads = [(channel, encode_payload(message)) for channel, message in messages]
        for _, payload in payloads:
            if payload.size > MAX_SEALED_PAYLOAD:
                raise FrameError(f"a message of {payload.size} bytes exceeds the largest frame "
                                 f"({MAX_SEALED_PAYLOAD} bytes)", reason="oversized frame")
        with self._send_locks[j]:
            sealer = self.sessions[j].sealer
            self._sendmsg(j, [sealer.seal(channel, payload) for channel, payload in payloads])

    def send_control(self, j: int, kind: int) -> None:
        """Seal and send an empty control frame (``KIND_GOODBYE``) to peer ``j``.

        Raises:
            PeerLostError: when the connection is gone.
        """
        with self._send_locks[j]:
            self._sendmsg(j, [self.sessions[j].sealer.seal_control(kind)])

    def _sendmsg(self, j: int, buffers: list[Any]) -> None:
        """Queue ``buffers`` for peer ``j`` and send what its socket takes now; the rest goes
        out from ``poll`` as room appears (the caller holds the send lock).

        Raises:
            PeerLostError: the connection is gone.
        """
        peer = self._peers.get(j)
        if peer is None:
            raise PeerLostError(j, self._addr(j), "send failed: the connection is closed")
        views = [memoryview(b).cast("B") for b in buffers]
        self.bytes_sent += sum(v.nbytes for v in views)
        peer.outgoing.extend(views)
        with self._io:
            self._write(peer)

    def _write(self, peer: _Peer) -> None:
        """``sendmsg`` of ``peer``'s queued bytes, in chunks, until the socket is full (then
        ``poll`` waits for room) or the queue is empty (the caller holds ``_io``).

        Raises:
            PeerLostError: the connection is gone.
        """
        queue, sock = peer.outgoing, peer.sock
        try:
            while queue:
                chunk = list(islice(queue, 512))
                try:
                    sent = sock.sendmsg(chunk)
                except BlockingIOError:
                    break
                for view in chunk:  # drop fully sent buffers, trim a partially sent one
                    if sent < view.nbytes:
                        if sent:
                            queue[0] = view[sent:]
                        break
                    sent -= view.nbytes
                    queue.popleft()
        except OSError as exc:
            raise PeerLostError(peer.peer, self._addr(peer.peer), f"send failed: {exc}") from exc
        if bool(queue) != peer.waiting_for_room and peer.peer in self._peers:
            peer.waiting_for_room = bool(queue)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if queue else 0)
            self._selector.modify(sock, events, peer)

    @property
    def unsent(self) -> int:
        """Bytes queued for the peers that their sockets have not taken yet."""
        return sum(v.nbytes for peer in list(self._peers.values()) for v in peer.outgoing)

    def check(self) -> None:
        """Raise the first failure seen reading from the peers."""
        if self.failure is not None:
            raise self.failure

    def park(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a message (returns at once when one is waiting or a
        failure is known), reading what arrives."""
        if self.events or self.failure is not None:
            return
        self.poll(timeout)

    # -- shutdown --------------------------------------------------------------------------

    def shutdown(self, timeout: float = 30.0) -> None:
        """Say goodbye to every peer, wait for theirs, and close all sockets."""
        for j in list(self.sockets):
            try:
                self.send_control(j, KIND_GOODBYE)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while ((len(self.goodbyes) < len(self.sockets) or self.unsent)
               and self.failure is None and time.monotonic() < deadline):
            self.poll(0.05)  # (not park: undelivered messages must not stop the reading)
        self.close()

    def close(self) -> None:
        """Close every connection, pending handshake and the listener; log the refusal counts
        not logged yet."""
        if self.closing:
            return
        self.closing = True
        self._closed.set()
        with self._io:
            self._selector.close()
        for end in (self._wake_reader, self._wake_writer):
            _close(end)
        for sock in list(self.sockets.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(sock)
        with self._pending_changed:
            for sock in list(self._pending):
                self._evicted.add(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._pending_changed.notify_all()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept (Linux)
        except OSError:
            pass
        _close(self.listener)
        self.refusals.flush(force=True)


class _Peer:
    """One peer's connection (non-blocking): the frame being read and how much of it has
    arrived; the sealed bytes waiting for room in the socket."""

    __slots__ = ("peer", "sock", "opener", "header", "body", "got", "kind", "channel",
                 "outgoing", "waiting_for_room")

    def __init__(self, peer: int, sock: socket.socket, opener: FrameOpener) -> None:
        self.peer = peer
        self.sock = sock
        self.opener = opener
        self.header = memoryview(bytearray(HEADER_SIZE))
        self.body: memoryview | None = None  # None: reading a header
        self.got = 0
        self.kind = self.channel = 0
        self.outgoing: deque[memoryview] = deque()  # sealed bytes the socket has not taken
        self.waiting_for_room = False  # registered for EVENT_WRITE

    def read_frame(self, max_payload: int) -> tuple[int, int, memoryview] | None:
        """The next frame, opened (``FrameOpener.read``'s checks, in the same order), or None
        when the socket has no more bytes now (what arrived is kept for the next call).

        Raises:
            EOFError: the peer closed the connection.  FrameError: as ``FrameOpener.read``.
            OSError: the connection failed.
        """
        sock = self.sock
        while True:
            target = self.header if self.body is None else self.body
            try:
                n = sock.recv_into(target[self.got:])
            except BlockingIOError:
                return None
            if n == 0:
                raise EOFError(f"connection closed after {self.got} of {target.nbytes} bytes "
                               f"of a frame's {'header' if self.body is None else 'body'}")
            self.got += n
            if self.got < target.nbytes:
                continue
            self.got = 0
            if self.body is None:
                self.kind, self.channel, length = self.opener.expect(bytes(self.header),
                                                                     max_payload)
                self.body = allocate(length)
            else:
                body, self.body = self.body, None
                return self.kind, self.channel, self.opener.open(bytes(self.header), body)


class TcpPusher:
    """Buffers messages for a remote peer until the allocator flushes."""

    __slots__ = ("outbox", "channel")

    def __init__(self, outbox: list[Any], channel: int) -> None:
        self.outbox = outbox
        self.channel = channel

    def push(self, message: Any) -> None:
        self.outbox.append((self.channel, message))


class LocalPusher:
    """Delivers to this worker's own queue without serialization."""

    __slots__ = ("mesh", "channel")

    def __init__(self, mesh: TcpMesh, channel: int) -> None:
        self.mesh = mesh
        self.channel = channel

    def push(self, message: Any) -> None:
        self.mesh.deliver_local(self.channel, message)


class QueuePuller:
    __slots__ = ("queue",)

    def __init__(self, queue: deque[Any]) -> None:
        self.queue = queue

    def pull(self) -> Any | None:
        q = self.queue
        return q.popleft() if q else None


class TcpAllocator:
    """Allocator over a ``TcpMesh`` (same interface as ``ThreadAllocator``)."""

    def __init__(self, mesh: TcpMesh) -> None:
        self.mesh = mesh
        self.index = mesh.index
        self.peers = mesh.peers
        self.outboxes: list[list[Any]] = [[] for _ in range(mesh.peers)]

    def allocate(self, identifier: int) -> tuple[list[Any], QueuePuller]:
        pushers: list[Any] = []
        for j in range(self.peers):
            if j == self.index:
                pushers.append(LocalPusher(self.mesh, identifier))
            else:
                pushers.append(TcpPusher(self.outboxes[j], identifier))
        return pushers, QueuePuller(self.mesh.queue(identifier))

    def receive(self) -> set[int]:
        """Channels with new messages (reads what the peers sent first).

        Raises:
            PeerLostError: when a peer's connection was lost.
            FrameRefusedError: a peer's frame failed its checks.
        """
        self.mesh.poll()
        self.mesh.check()
        events = self.mesh.events
        out: set[int] = set()
        while events:
            out.add(events.popleft())
        return out

    def flush(self) -> None:
        """Serialize, seal and send every buffered message (one ``sendmsg`` per peer)."""
        for j, outbox in enumerate(self.outboxes):
            if outbox:
                self.mesh.send_messages(j, outbox)
                outbox.clear()

    def park(self, timeout: float) -> None:
        self.mesh.park(timeout)

    def wake(self) -> None:
        """From any thread: end this worker's current or next ``park`` at once."""
        self.mesh.wake()

    def pump(self, timeout: float) -> None:
        """Read what the peers sent (queued for the next ``receive``) and send what waits for
        room, waiting up to ``timeout`` s for either: for a worker waiting outside its step
        loop (for the driver's verdict), whose peers may wait for it to read before they can
        go on."""
        self.mesh.poll(timeout)

    def goodbye(self, j: int) -> None:
        """Send what is buffered for worker ``j``, then the mesh's goodbye: nothing more goes
        to ``j`` (it is leaving the job)."""
        outbox = self.outboxes[j]
        if outbox:
            self.mesh.send_messages(j, outbox)
            outbox.clear()
        self.mesh.send_control(j, KIND_GOODBYE)

    def shutdown(self) -> None:
        self.flush()
        self.mesh.shutdown()
