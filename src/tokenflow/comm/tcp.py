"""The TCP mesh: worker processes connected all-to-all, authenticated, framed.

Source: docs/ARCHITECTURE.md ("Execution model", "Data plane", "Security"); timely's
``communication/allocator/zero_copy``.  Worker ``i`` connects to every ``j < i`` and accepts
from every ``j > i``; each connection first passes the HMAC handshake of
``tokenflow.comm.auth``.  One receiver thread per peer reads frames (length checked before the
payload is read), decodes them and appends them to the channel's FIFO; the worker thread sends
its buffered messages on ``flush()`` in one ``sendmsg`` per peer.  The listener keeps running
for the whole job so that stray connections are refused and logged while the job goes on.

A peer that closes its connection without a goodbye frame is reported as ``PeerLostError``
naming that worker: the job fails fast instead of hanging.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Any

from tokenflow.comm.auth import AuthenticationError, accept_handshake, connect_handshake
from tokenflow.comm.frames import (
    DEFAULT_MAX_FRAME,
    KIND_ARROW,
    KIND_GOODBYE,
    KIND_PICKLE,
    FrameError,
    decode_message,
    encode_control,
    encode_message,
    read_frame,
)

log = logging.getLogger("tokenflow.comm.tcp")

Address = tuple[str, int]


class PeerLostError(ConnectionError):
    """A peer worker's connection closed unexpectedly (the worker died or was killed)."""

    def __init__(self, worker: int, address: Address | None, detail: str) -> None:
        where = f" at {address[0]}:{address[1]}" if address else ""
        super().__init__(f"lost connection to worker {worker}{where}: {detail}")
        self.worker = worker


class FrameRefusedError(ConnectionError):
    """A peer sent a frame this worker refused (malformed, oversized, of an unknown kind): a
    failure in its own right, not the consequence of another worker's."""

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
    sock.listen(64)
    return sock


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:  # pragma: no cover - platform limits
            pass


class TcpMesh:
    """This worker's connections to every peer.

    Args:
        index: this worker's index.
        peers: number of workers.
        listener: a bound, listening socket (see ``bind_listener``).
        secret: the per-job secret.
        job: the job's name (part of the handshake).
        max_frame: largest accepted frame payload in bytes.
    """

    def __init__(self, index: int, peers: int, listener: socket.socket, secret: bytes, job: str,
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.index = index
        self.peers = peers
        self.listener = listener
        self.secret = secret
        self.job = job
        self.max_frame = max_frame
        self.addresses: list[Address] = []
        self.sockets: dict[int, socket.socket] = {}
        self.queues: dict[int, deque[Any]] = {}
        self.events: deque[int] = deque()
        self.condition = threading.Condition()
        self.parked = False
        self.failure: BaseException | None = None
        self.goodbyes: set[int] = set()
        self.refused = 0
        self.closing = False
        self._registered = threading.Condition()
        self._queues_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def address(self) -> Address:
        host, port = self.listener.getsockname()[:2]
        return host, port

    # -- setup -----------------------------------------------------------------------------

    def connect(self, addresses: list[Address], timeout: float = 30.0) -> None:
        """Form the mesh with the workers at ``addresses`` (indexed by worker).

        Raises:
            MeshSetupError: when a peer cannot be reached or authenticated within ``timeout``.
        """
        self.addresses = [tuple(a) for a in addresses]  # type: ignore[misc]
        accept = threading.Thread(target=self._accept_loop, name=f"tokenflow-accept-{self.index}",
                                  daemon=True)
        accept.start()
        self._threads.append(accept)
        deadline = time.monotonic() + timeout
        for j in range(self.index):
            self._register(j, self._dial(j, deadline))
        with self._registered:
            while len(self.sockets) < self.peers - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [j for j in range(self.peers) if j != self.index and j not in self.sockets]
                    raise MeshSetupError(
                        f"worker {self.index}: workers {missing} did not connect within {timeout:.0f} s"
                    )
                self._registered.wait(min(left, 0.5))

    def _dial(self, j: int, deadline: float) -> socket.socket:
        host, port = self.addresses[j]
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, port), timeout=5)
                _tune(sock)
                connect_handshake(sock, self.secret, self.job, self.index, j)
                sock.settimeout(None)
                return sock
            except (OSError, EOFError) as exc:
                last = exc
                if isinstance(exc, AuthenticationError):
                    break
                time.sleep(0.05)
        raise MeshSetupError(f"worker {self.index} could not connect to worker {j} at "
                             f"{host}:{port}: {last}")

    def _accept_loop(self) -> None:
        while not self.closing:
            try:
                sock, addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._accept_one, args=(sock, addr), daemon=True,
                             name=f"tokenflow-handshake-{self.index}").start()

    def _accept_one(self, sock: socket.socket, addr: Any) -> None:
        try:
            sock.settimeout(10)
            peer = accept_handshake(sock, self.secret, self.job, self.index)
            if not self.index < peer < self.peers or peer in self.sockets:
                raise AuthenticationError(f"unexpected peer index {peer}")
            sock.settimeout(None)
            _tune(sock)
            self._register(peer, sock)
        except (OSError, EOFError, FrameError, AuthenticationError) as exc:
            self.refused += 1
            log.warning("worker %d refused a connection from %s:%s: %s", self.index, addr[0],
                        addr[1], exc)
            try:
                sock.close()
            except OSError:  # pragma: no cover
                pass

    def _register(self, j: int, sock: socket.socket) -> None:
        with self._registered:
            self.sockets[j] = sock
            self._registered.notify_all()
        thread = threading.Thread(target=self._receive_loop, args=(j, sock), daemon=True,
                                  name=f"tokenflow-recv-{self.index}-from-{j}")
        thread.start()
        self._threads.append(thread)

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

    def _wake(self) -> None:
        if self.parked:
            with self.condition:
                self.condition.notify()

    def _receive_loop(self, j: int, sock: socket.socket) -> None:
        max_frame = self.max_frame
        try:
            while True:
                kind, channel, payload = read_frame(sock, max_frame)
                self.bytes_received += len(payload) + 16
                if kind == KIND_PICKLE or kind == KIND_ARROW:
                    self.queue(channel).append(decode_message(kind, payload))
                    self.events.append(channel)
                    self._wake()
                elif kind == KIND_GOODBYE:
                    self.goodbyes.add(j)
                    self._wake()
                else:
                    raise FrameError(f"unexpected frame kind {kind}")
        except EOFError as exc:
            if j not in self.goodbyes and not self.closing:
                self._fail(PeerLostError(j, self._addr(j), f"connection closed ({exc})"))
        except FrameError as exc:
            log.error("worker %d: refused a frame from worker %d: %s", self.index, j, exc)
            self._fail(FrameRefusedError(j, self._addr(j), str(exc)))
        except OSError as exc:
            if not self.closing:
                self._fail(PeerLostError(j, self._addr(j), str(exc)))

    def _addr(self, j: int) -> Address | None:
        return self.addresses[j] if j < len(self.addresses) else None

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        with self.condition:
            self.condition.notify_all()

    def send(self, j: int, buffers: list[Any]) -> None:
        """Send framed buffers to peer ``j`` (``sendmsg`` in chunks, resuming partial writes).

        Raises:
            PeerLostError: when the connection is gone.
        """
        sock = self.sockets[j]
        try:
            views = [memoryview(b).cast("B") for b in buffers]
            self.bytes_sent += sum(v.nbytes for v in views)
            while views:
                chunk = views[:512]
                sent = sock.sendmsg(chunk)
                # drop fully sent buffers, trim a partially sent one
                k = 0
                while k < len(chunk) and sent >= chunk[k].nbytes:
                    sent -= chunk[k].nbytes
                    k += 1
                views = views[k:]
                if sent:
                    views[0] = views[0][sent:]
        except OSError as exc:
            raise PeerLostError(j, self._addr(j), f"send failed: {exc}") from exc

    def check(self) -> None:
        """Raise the first failure seen by a receiver thread."""
        if self.failure is not None:
            raise self.failure

    def park(self, timeout: float) -> None:
        with self.condition:
            self.parked = True  # set before looking, so a concurrent delivery wakes us
            try:
                if self.events or self.failure is not None:
                    return
                self.condition.wait(timeout)
            finally:
                self.parked = False

    # -- shutdown --------------------------------------------------------------------------

    def shutdown(self, timeout: float = 30.0) -> None:
        """Say goodbye to every peer, wait for theirs, and close all sockets."""
        for _j, sock in list(self.sockets.items()):
            try:
                sock.sendall(encode_control(KIND_GOODBYE))
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while len(self.goodbyes) < len(self.sockets) and self.failure is None:
            if time.monotonic() > deadline:
                break
            self.park(0.05)
        self.close()

    def close(self) -> None:
        self.closing = True
        for sock in list(self.sockets.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        try:
            self.listener.close()
        except OSError:  # pragma: no cover
            pass


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
        """Channels with new messages.

        Raises:
            PeerLostError: when a peer's connection was lost.
        """
        self.mesh.check()
        events = self.mesh.events
        out: set[int] = set()
        while events:
            out.add(events.popleft())
        return out

    def flush(self) -> None:
        """Serialize and send every buffered message."""
        for j, outbox in enumerate(self.outboxes):
            if outbox:
                buffers: list[Any] = []
                for channel, message in outbox:
                    buffers.extend(encode_message(channel, message))
                outbox.clear()
                self.mesh.send(j, buffers)

    def park(self, timeout: float) -> None:
        self.mesh.park(timeout)

    def shutdown(self) -> None:
        self.flush()
        self.mesh.shutdown()
