"""The job's catalog of published topics: topic -> partitions -> addresses, with schema and
time type, behind a token.

Source: the Strymon publish/subscribe protocol ("After consulting the catalog about the address
of a publisher ..."); docs/ARCHITECTURE.md ("Publish/subscribe").  The catalog runs on the
driver, next to the coordinator; every publisher partition registers there when its dataflow is
built (and again once its schema is known); subscribers ask it where to connect.

Exchange (``tokenflow.pubsub.wire`` frames): the catalog greets with ``HELLO {"role":
"catalog", "nonce": Ns}``; the client sends ``LIST {"mac": MAC(token, "catalog", Ns), "nonce":
Nc}`` or ``REGISTER`` (the same plus the partition's fields); the catalog answers ``CATALOG
{"mac": MAC(token, "catalog-reply", Nc), "topics": {...}}``, so each side knows the other holds
the token.  A topic entry::

    {"time": "int" | "product" | None (not known yet), "schema": [[name, type], ...] | None,
     "partitions": [{"partition": p, "host": str, "port": int}, ...], "count": P}
"""

from __future__ import annotations

import secrets
import socket
import threading
import time as clock
from collections.abc import Callable
from typing import Any

import msgpack

from tokenflow.pubsub import wire
from tokenflow.pubsub.server import Endpoint

MAX_TOPICS = 1024
MAX_PARTITIONS = 4096


class Catalog:
    """A catalog server.  Use as a context manager or ``close()`` it.

    Args:
        host, port: where to listen (port 0: a free port; ``url`` says which).
        token: the token clients and publishers must hold (default: a fresh one; also the
            token the job's publishers accept from subscribers).

    Attributes:
        url: ``tokenflow://host:port``.
        endpoint: ``(host, port, token)``, what ``execute(..., catalog=...)`` takes.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self.token = token or wire.new_token()
        self._topics: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._server = Endpoint("catalog", {"role": "catalog"}, self._handle, host, port)
        bound, self.port = self._server.address
        self.host = host if host not in ("0.0.0.0", "") else socket.gethostname()
        self.url = f"tokenflow://{self.host}:{self.port}"
        self.endpoint = (self.host, self.port, self.token)

    @property
    def refused(self) -> int:
        """Connections refused so far."""
        return self._server.refused

    def topics(self) -> dict[str, dict[str, Any]]:
        """A copy of the registered topics."""
        with self._lock:
            return {k: {**v, "partitions": list(v["partitions"])} for k, v in self._topics.items()}

    def _handle(self, sock: socket.socket, nonce: bytes, peer: str) -> None:
        kind, meta, _ = wire.receive(sock, (wire.LIST, wire.REGISTER))
        wire.check_mac(self.token, "catalog", nonce, meta)
        client_nonce = wire.field(meta, "nonce", bytes, "catalog request")
        if kind == wire.REGISTER:
            self._register(meta)
        wire.send(sock, wire.CATALOG, {"mac": wire.mac(self.token, "catalog-reply", client_nonce),
                                       "topics": self.topics()})

    def _register(self, meta: dict[str, Any]) -> None:
        what = "REGISTER"
        topic = wire.field(meta, "topic", str, what)
        partition = wire.field(meta, "partition", int, what)
        count = wire.field(meta, "partitions", int, what)
        host = wire.field(meta, "host", str, what)
        port = wire.field(meta, "port", int, what)
        time_type = meta.get("time")
        schema = meta.get("schema")
        if not topic or len(topic) > 200 or not 0 <= partition < count <= MAX_PARTITIONS \
                or not 0 < port < 65536 or time_type not in (None, "int", "product") \
                or not (schema is None or isinstance(schema, list) and all(
                    isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
                    for c in schema)):
            raise wire.ProtocolError(f"REGISTER of {wire.shown(meta)} is malformed")
        with self._lock:
            entry = self._topics.get(topic)
            if entry is None:
                if len(self._topics) >= MAX_TOPICS:
                    raise wire.ProtocolError(f"more than {MAX_TOPICS} topics")
                entry = self._topics[topic] = {"time": time_type, "schema": schema,
                                               "partitions": [], "count": count}
            if entry["count"] != count or None not in (entry["time"], time_type) \
                    and entry["time"] != time_type:
                raise wire.ProtocolError(f"topic {topic!r} is registered with {entry['count']} "
                                         f"{entry['time']} partitions, not {count} {time_type}")
            if time_type is not None:
                entry["time"] = time_type
            if schema is not None:
                entry["schema"] = schema
            before = {**entry, "partitions": list(entry["partitions"])}
            entry["partitions"] = [p for p in entry["partitions"] if p["partition"] != partition]
            entry["partitions"].append({"partition": partition, "host": host, "port": port})
            entry["partitions"].sort(key=lambda p: p["partition"])
            if len(msgpack.packb(self._topics, use_bin_type=True)) > wire.MAX_META - 1024:
                self._topics[topic] = before  # the catalog must still fit in one reply
                if not before["partitions"]:
                    del self._topics[topic]
                raise wire.ProtocolError(f"the catalog is full: registering {topic!r} would make "
                                         f"its reply exceed {wire.MAX_META} bytes")

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(url: str, token: str, kind: int = wire.LIST,
            fields: dict[str, Any] | Callable[[str], dict[str, Any]] | None = None,
            timeout: float = 10.0) -> dict[str, Any]:
    """One exchange with the catalog at ``url``; returns its topics.  ``fields`` (of a
    ``REGISTER``) may be a function of the local address the connection uses (what a publisher
    advertises, as the catalog's host reaches it there).

    Raises:
        wire.AuthenticationError: the catalog refused the token, or did not prove it holds it.
        wire.ProtocolError: a malformed reply.
        OSError: no catalog there.
    """
    host, port = wire.parse_url(url)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        _, hello, _ = wire.receive(sock, (wire.HELLO,))
        if hello.get("role") != "catalog":
            raise wire.ProtocolError(f"{url} is not a tokenflow catalog")
        server_nonce = wire.field(hello, "nonce", bytes, "HELLO")
        mine = secrets.token_bytes(wire.NONCE_SIZE)
        if callable(fields):
            fields = fields(sock.getsockname()[0])
        wire.send(sock, kind, {**(fields or {}), "mac": wire.mac(token, "catalog", server_nonce),
                               "nonce": mine})
        reply_kind, reply, _ = wire.receive(sock, (wire.CATALOG, wire.REFUSED))
        if reply_kind == wire.REFUSED:
            raise wire.AuthenticationError(f"catalog {url} refused: {reply.get('reason')}")
        wire.check_mac(token, "catalog-reply", mine, reply)
        topics = reply.get("topics")
        if not isinstance(topics, dict):
            raise wire.ProtocolError("CATALOG without topics")
        return topics


def lookup(url: str, topic: str, token: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """The catalog entry of ``topic``, waiting up to ``timeout`` s until every partition has
    registered.

    Raises:
        LookupError: the topic (or some partition of it) is not there in time; the message
            lists the topics the catalog has.
        wire.AuthenticationError: a wrong token.
    """
    token = wire.token_from(token)
    deadline = clock.monotonic() + timeout
    while True:
        topics = request(url, token, timeout=min(timeout, 10.0))
        entry = topics.get(topic)
        if isinstance(entry, dict) and len(entry.get("partitions", ())) == entry.get("count"):
            return entry
        if clock.monotonic() > deadline:
            have = ", ".join(sorted(topics)) or "none"
            raise LookupError(f"catalog {url} has no complete topic {topic!r} after {timeout} s "
                              f"(topics: {have})")
        clock.sleep(0.05)
