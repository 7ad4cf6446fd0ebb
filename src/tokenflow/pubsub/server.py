"""The listening side shared by publishers and the catalog: accept, greet with a nonce, hand the
connection to a handler, and refuse anything malformed with one log line.

Hardening (these endpoints face the network): at most ``MAX_CONNECTIONS`` connections are
served at once (more are closed at once, logged); a connection has ``wire.HELLO_TIMEOUT``
seconds in all to send its first (authenticating) frame, however slowly it trickles in, else
it is closed (a DEBUG line); a ``ProtocolError`` or a wrong token ends the connection with a
``REFUSED`` frame, one WARNING line on the ``tokenflow.pubsub`` logger and a count in
``refused``; nothing a peer sends is unpickled.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tokenflow.pubsub import wire

log = logging.getLogger("tokenflow.pubsub")

MAX_CONNECTIONS = 256
"""Connections served at once by one endpoint."""

Handler = Callable[[socket.socket, bytes, str], None]


class Endpoint:
    """A TCP endpoint that greets each connection with ``HELLO`` and runs ``handler(sock,
    nonce, peer)`` on a thread of its own.

    Args:
        what: a name for log lines (``"publisher bids/0"``, ``"catalog"``).
        hello: extra fields of the ``HELLO`` frame.
        handler: serves one authenticated-to-be connection; raises ``ProtocolError`` to refuse.
        host, port: where to listen (port 0: any free port; see ``address``).
    """

    def __init__(self, what: str, hello: dict[str, Any], handler: Handler,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.what = what
        self._hello = hello
        self._handler = handler
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.refused = 0
        """Connections refused so far (each logged once)."""
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name=f"tokenflow-{what}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._connections)

    def refuse(self, peer: str, reason: str, sock: socket.socket | None = None) -> None:
        """Log one refusal (and tell the peer why, best effort)."""
        with self._lock:
            self.refused += 1
        log.warning("%s refused %s: %s", self.what, peer, reason)
        if sock is not None:
            try:
                sock.settimeout(0.5)
                wire.send(sock, wire.REFUSED, {"reason": reason[:500]})
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                self._closed.wait(0.05)  # e.g. out of descriptors: back off
                continue
            peer = f"{addr[0]}:{addr[1]}"
            if not self._slots.acquire(blocking=False):
                self.refuse(peer, f"more than {MAX_CONNECTIONS} connections")
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True,
                             name=f"tokenflow-{self.what}-conn").start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            self._connections.add(sock)
        try:
            sock.settimeout(wire.HELLO_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = secrets.token_bytes(wire.NONCE_SIZE)
            wire.send(sock, wire.HELLO, {"v": wire.VERSION, "nonce": nonce, **self._hello})
            wire.set_deadline(time.monotonic() + wire.HELLO_TIMEOUT)  # for the first frame
            self._handler(sock, nonce, peer)
        except wire.ProtocolError as exc:
            self.refuse(peer, str(exc), sock)
        except (OSError, ConnectionError) as exc:
            if not self._closed.is_set():
                log.debug("%s: connection from %s ended: %s", self.what, peer, exc)
        except Exception as exc:  # noqa: BLE001 - a bad peer must never end the endpoint
            self.refuse(peer, f"{type(exc).__name__}: {exc}", sock)
        finally:
            wire.set_deadline(None)
            with self._lock:
                self._connections.discard(sock)
            sock.close()
            self._slots.release()

    def close(self) -> None:
        """Stop accepting and end every connection."""
        self._closed.set()
        self._sock.close()
        with self._lock:
            for s in list(self._connections):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)
