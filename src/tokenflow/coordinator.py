"""The driver's coordinator: workers report progress to it, and it sends them commands.

Source: docs/ARCHITECTURE.md ("Execution model": the driver runs a coordinator to which
workers report frontiers and metrics, and through which checkpoint and rescale commands flow).
The endpoint faces the network, so it never unpickles: frames are a 4-byte big-endian length
and a msgpack map of at most ``MAX_REPORT`` bytes, and a connection must present the job's
token in its first frame.  The connection is two-way: after the hello the worker sends reports
and control replies, the coordinator sends commands (``tokenflow.control``).

Report shape (msgpack map)::

    {"worker": int, "steps": int, "elapsed": float (s since the worker started),
     "records_in": int, "frontiers": {dataflow: {operator: [time as str, ...]}}, "done": bool}

Control messages in either direction are maps with a ``"kind"`` string (a command such as
``{"kind": "pause_at", "epoch": 40}``, or a reply such as ``{"kind": "idle", "worker": 1,
...}``); replies are queued in ``Coordinator.inbox`` rather than taken as reports.
"""

from __future__ import annotations

import hmac
import logging
import queue
import secrets
import select
import socket
import struct
import threading
import time
from typing import Any

import msgpack

log = logging.getLogger("tokenflow.coordinator")

MAX_REPORT = 64 * 1024
_LEN = struct.Struct("!I")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _read(sock: socket.socket) -> dict[str, Any]:
    (n,) = _LEN.unpack(_recv_exactly(sock, 4))
    if n > MAX_REPORT:
        raise ValueError(f"report of {n} bytes exceeds {MAX_REPORT}")
    obj = msgpack.unpackb(_recv_exactly(sock, n), raw=False)
    if not isinstance(obj, dict):
        raise ValueError("report is not a map")
    return obj


def _write(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = msgpack.packb(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


class Coordinator:
    """Receives worker reports on ``address``; ``snapshot()`` returns the latest per worker."""

    def __init__(self, host: str = "127.0.0.1", token: str | None = None) -> None:
        self.token = token or secrets.token_hex(16)
        self._sock = socket.create_server((host, 0))
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.reports: dict[int, dict[str, Any]] = {}
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        """Control replies from workers (maps with a ``"kind"``), in arrival order."""
        self.refused = 0
        self._links: dict[int, socket.socket] = {}
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._serve, daemon=True, name="tokenflow-coordinator").start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn, addr), daemon=True).start()

    def _handle(self, conn: socket.socket, addr: Any) -> None:
        try:
            conn.settimeout(10)
            hello = _read(conn)
            token = hello.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
                raise PermissionError("bad token")
            conn.settimeout(None)
            while True:
                report = _read(conn)
                worker = report.get("worker")
                if not isinstance(worker, int) or isinstance(worker, bool) or worker < 0:
                    raise ValueError("report without a worker index")
                with self._lock:
                    self._links[worker] = conn
                if isinstance(report.get("kind"), str):
                    self.inbox.put(report)
                    continue
                report["received"] = time.time()
                with self._lock:
                    self.reports[worker] = report
        except EOFError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bad client is refused, the job goes on
            self.refused += 1
            log.warning("coordinator refused %s:%s: %s", addr[0], addr[1], exc)
        finally:
            conn.close()

    def send(self, worker: int, message: dict[str, Any]) -> None:
        """Send a command (a map with a ``"kind"``) to ``worker``.

        Raises:
            KeyError: the worker has not connected (it connects when it starts).
            OSError: its connection failed.
        """
        with self._lock:
            conn = self._links[worker]
        with self._send_lock:
            _write(conn, message)

    def connected(self) -> list[int]:
        """Workers whose connection is open, ascending."""
        with self._lock:
            return sorted(self._links)

    def snapshot(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self.reports.items()}

    def reset(self) -> None:
        """Forget all reports (before the next job on the same coordinator)."""
        with self._lock:
            self.reports.clear()

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    @property
    def endpoint(self) -> tuple[str, int, str]:
        """``(host, port, token)`` to hand to workers."""
        return self.address[0], self.address[1], self.token


class Reporter:
    """A worker-side ``on_step`` hook sending a report at most every ``interval`` seconds."""

    def __init__(self, endpoint: tuple[str, int, str], interval: float = 0.25) -> None:
        host, port, token = endpoint
        self.interval = interval
        self.start = time.monotonic()
        self.last = 0.0
        self.sock: socket.socket | None = None
        try:
            self.sock = socket.create_connection((host, port), timeout=5)
            _write(self.sock, {"token": token})
        except OSError as exc:
            log.warning("cannot reach the coordinator at %s:%s: %s", host, port, exc)
            self.sock = None

    def send(self, message: dict[str, Any]) -> None:
        """Send a control reply now (``message`` has a ``"kind"`` and the worker index).

        Raises:
            ConnectionError: the coordinator cannot be reached.
        """
        if self.sock is None:
            raise ConnectionError("no connection to the coordinator")
        _write(self.sock, message)

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None:
        """The next command from the coordinator, or None if none came within ``timeout``
        seconds (0: do not wait; None: wait until one comes).

        Raises:
            ConnectionError: the coordinator closed the connection or sent a malformed frame.
        """
        if self.sock is None:
            raise ConnectionError("no connection to the coordinator")
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        try:
            return _read(self.sock)
        except (EOFError, ValueError, OSError, msgpack.UnpackException) as exc:
            raise ConnectionError(f"coordinator connection failed: {exc}") from exc

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
        try:
            data = msgpack.packb(report)
            if len(data) > MAX_REPORT:  # too many operators: keep the totals
                report["frontiers"] = {}
                data = msgpack.packb(report)
            self.sock.sendall(_LEN.pack(len(data)) + data)
        except OSError:
            self.sock = None

    def close(self, worker: Any) -> None:
        self(worker, force=True)
        if self.sock is not None:
            self.sock.close()


def attach(worker: Any, endpoint: tuple[str, int, str] | None) -> Reporter | None:
    """Install a ``Reporter`` on ``worker`` when a coordinator endpoint is given."""
    if endpoint is None:
        return None
    reporter = Reporter(endpoint)
    worker.on_step.append(reporter)
    return reporter
