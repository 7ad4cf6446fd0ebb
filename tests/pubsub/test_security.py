"""Security of publish/subscribe (issue 18, acceptance "Security"; docs/SECURITY.md).

* A wrong or missing token is refused by the catalog (``LIST`` and ``REGISTER`` through
  ``catalog.request``, and raw frames without a MAC) and by a publisher (a ``Subscription``
  whose token the catalog accepts but the publisher does not; raw ``SUBSCRIBE`` frames): one
  ``REFUSED`` frame, one WARNING line naming the peer, one count in ``refused`` each.
* A client refuses a fake catalog and a fake publisher (servers written here) that cannot prove
  they hold the token: a MAC under another token, none, the client's own MAC reflected, or a
  genuine reply recorded earlier and replayed; the same fakes holding the token are accepted.
* 10^4 fuzzed frames against the catalog and both publishers of a two-worker job (thread
  runtime) while it publishes: random bytes, truncated frames, oversized length fields, valid
  headers with garbage msgpack or an Arrow body, first frames without / with a wrong MAC,
  frames of unexpected kinds, authenticated requests with malformed fields, authenticated
  subscribers sending a malformed ``FILTER``, connections that send nothing.  Afterwards both
  endpoints still serve (a ``LIST``, a ``Subscription`` from the earliest epoch), the stream a
  subscriber receives (one subscribed during the whole fuzzing, one after it) equals the job's
  capture and a recomputation of its input, every refusal is logged exactly once (the WARNING
  records, matched to the fuzzing connections by port, equal the connections expected to be
  refused, and the endpoints' ``refused`` counters), and no unpickling ran outside the job's
  workers (``pickle.loads``/``load``/``Unpickler``, ``cloudpickle.loads`` recorded).
* A peer that trickles its first frame is cut after ``wire.HELLO_TIMEOUT`` in total.
* An authenticated subscriber's mistyped ``FILTER`` sent before the first epoch is refused
  once, without failing the job.
"""

from __future__ import annotations

import logging
import pickle
import random
import secrets
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from tokenflow import execute
from tokenflow.pubsub import AuthenticationError, Catalog, Publisher, Subscription, wire
from tokenflow.pubsub.catalog import request

LOGGER = "tokenflow.pubsub"
TOPIC = "nums"
FUZZ_FRAMES = 10_000
"""Fuzzed frames in all (the issue's 10^4); connections that send nothing come on top."""
SILENT_CONNECTIONS = 200
LEGIT_LISTS = 50
CLIENT_THREADS = 4
RECORDS_PER_EPOCH = 10
MIN_EPOCHS = 100


# -- helpers ---------------------------------------------------------------------------------

def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def drain(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset ends it too)."""
    out = bytearray()
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    return bytes(out)


def kinds_in(data: bytes) -> list[int]:
    """The kinds of the whole frames in ``data`` (what a server sent before closing)."""
    kinds, at = [], 0
    while at + wire.HEADER.size <= len(data):
        kind, m, b = wire.HEADER.unpack_from(data, at)
        at += wire.HEADER.size + m + b
        if at > len(data):
            break
        kinds.append(kind)
    return kinds


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def refused_peer(record: logging.LogRecord) -> tuple[str, int]:
    """``(endpoint name, peer port)`` of a refusal line (``"%s refused %s: %s"``)."""
    assert record.msg == "%s refused %s: %s", record.getMessage()
    assert isinstance(record.args, tuple)
    what, peer, _ = record.args
    return str(what), int(str(peer).rpartition(":")[2])


def raw_frame(kind: int, meta: Any, body: bytes = b"") -> bytes:
    packed = msgpack.packb(meta, use_bin_type=True)
    return wire.HEADER.pack(kind, len(packed), len(body)) + packed + body


class Client:
    """One connection to an endpoint, as a fuzzer drives it."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.port = self.sock.getsockname()[1]
        self._hello: dict[str, Any] | None = None

    def hello(self) -> dict[str, Any]:
        if self._hello is None:
            _, self._hello, _ = wire.receive(self.sock, (wire.HELLO,))
        return self._hello

    def nonce(self) -> bytes:
        nonce: bytes = wire.field(self.hello(), "nonce", bytes, "HELLO")
        return nonce

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # the server refused before reading all of it

    def finish(self) -> bytes:
        """Half-close, read until the server closes; what it sent after ``HELLO`` (if read)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = drain(self.sock)
        self.sock.close()
        return data


class FakeServer:
    """A listening socket whose connections are served one after another by ``handler``."""

    def __init__(self, handler: Callable[[socket.socket, int], None]) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.url = f"tokenflow://127.0.0.1:{self.port}"
        self.errors: list[BaseException] = []
        self._handler = handler
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with sock:
                sock.settimeout(10)
                try:
                    self._handler(sock, n)
                except BaseException as exc:  # noqa: BLE001 - checked by the test
                    self.errors.append(exc)
            n += 1

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(5)


# -- wrong or missing token ------------------------------------------------------------------

def test_catalog_refuses_wrong_or_missing_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Catalog() as cat:
        fields = {"topic": "t", "partition": 0, "partitions": 1, "host": "127.0.0.1",
                  "port": 9, "time": "int", "schema": None}
        with pytest.raises(AuthenticationError, match="refused"):
            request(cat.url, "not-the-token", wire.LIST)
        with pytest.raises(AuthenticationError, match="refused"):
            request(cat.url, "not-the-token", wire.REGISTER, fields)
        with pytest.raises(AuthenticationError, match="refused"):
            request(cat.url, "", wire.REGISTER, fields)
        assert cat.topics() == {}, "a refused REGISTER registered"
        ports = []
        wrong_nonce = secrets.token_bytes(wire.NONCE_SIZE)
        for make in (lambda n: {"nonce": n},                                      # no mac
                     lambda n: {"mac": None, "nonce": n},
                     lambda n: {"mac": "x" * 32, "nonce": n},                      # not bytes
                     lambda n: {"mac": wire.mac(cat.token, "subscribe", n), "nonce": n},  # role
                     lambda n: {"mac": wire.mac(cat.token, "catalog", wrong_nonce), "nonce": n},
                     lambda n: {"mac": wire.mac(cat.token, "catalog", n)[:31], "nonce": n}):
            client = Client(("127.0.0.1", cat.port))
            client.send(raw_frame(wire.LIST, make(client.nonce())))
            assert kinds_in(client.finish()) == [wire.REFUSED]
            ports.append(client.port)
        assert cat.refused == 3 + len(ports)
        lines = [refused_peer(r) for r in refusals(caplog)]
        assert len(lines) == cat.refused and all(what == "catalog" for what, _ in lines)
        assert Counter(port for _, port in lines[3:]) == Counter(ports)
        assert request(cat.url, cat.token, wire.REGISTER, fields)["t"]["partitions"] == \
            [{"partition": 0, "host": "127.0.0.1", "port": 9}]
        assert cat.refused == len(refusals(caplog)) == 3 + len(ports)


def test_publisher_refuses_wrong_or_missing_token(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.delenv("TOKENFLOW_TOKEN", raising=False)
    with Catalog() as cat:
        # The catalog takes cat.token; this publisher holds another one.
        publisher = Publisher("t", 0, 1, "the-publishers-token")
        right = Publisher("r", 0, 1, cat.token)
        try:
            for p in (publisher, right):
                request(cat.url, cat.token, wire.REGISTER, {
                    "topic": p.topic, "partition": 0, "partitions": 1, "host": "127.0.0.1",
                    "port": p.address[1], "time": None, "schema": None})
            with pytest.raises(ValueError, match="token is needed"):
                Subscription(cat.url, "t")  # no token anywhere: refused before connecting
            with pytest.raises(AuthenticationError, match="catalog .* refused"):
                Subscription(cat.url, "t", "wrong", timeout=5)
            assert cat.refused == 1 and publisher.endpoint.refused == 0
            with pytest.raises(AuthenticationError, match="partition 0 of 't' refused"):
                Subscription(cat.url, "t", cat.token, timeout=5)
            assert publisher.endpoint.refused == 1
            ports = []
            for make in (lambda n: {"nonce": secrets.token_bytes(16), "topic": "r"},
                         lambda n: {"mac": b"", "nonce": secrets.token_bytes(16), "topic": "r"},
                         lambda n: {"mac": wire.mac("wrong", "subscribe", n),
                                    "nonce": secrets.token_bytes(16), "topic": "r"},
                         lambda n: {"mac": wire.mac(cat.token, "catalog", n),  # another role
                                    "nonce": secrets.token_bytes(16), "topic": "r"}):
                client = Client(right.address)
                client.send(raw_frame(wire.SUBSCRIBE, make(client.nonce())))
                assert kinds_in(client.finish()) == [wire.REFUSED]
                ports.append(client.port)
            assert right.endpoint.refused == len(ports)
            lines = [refused_peer(r) for r in refusals(caplog)]
            assert [what for what, _ in lines[:2]] == ["catalog", "publisher t/0"]
            assert Counter(lines[2:]) == Counter(("publisher r/0", p) for p in ports)
            with Subscription(cat.url, "r", cat.token, timeout=5) as sub:  # the right token works
                assert sub.partitions == 1
            assert len(refusals(caplog)) == 2 + len(ports)
        finally:
            publisher.endpoint.close()
            right.endpoint.close()


# -- clients refuse servers without the token ------------------------------------------------

def test_client_refuses_a_fake_catalog() -> None:
    token = wire.new_token()
    with Catalog(token=token) as real:
        # Record a genuine CATALOG reply (its MAC covers that request's nonce only).
        with socket.create_connection(("127.0.0.1", real.port)) as sock:
            _, hello, _ = wire.receive(sock, (wire.HELLO,))
            wire.send(sock, wire.LIST, {"mac": wire.mac(token, "catalog", hello["nonce"]),
                                        "nonce": secrets.token_bytes(wire.NONCE_SIZE)})
            _, genuine, _ = wire.receive(sock, (wire.CATALOG,))
    fake_topics = {TOPIC: {"time": "int", "schema": None, "count": 1,
                           "partitions": [{"partition": 0, "host": "127.0.0.1", "port": 9}]}}
    variants: list[tuple[str, Callable[[bytes, dict[str, Any]], dict[str, Any]]]] = [
        ("another token", lambda n, req: {"mac": wire.mac("guess", "catalog-reply", n)}),
        ("no mac", lambda n, req: {}),
        ("reflected", lambda n, req: {"mac": req["mac"]}),
        ("replayed", lambda n, req: {"mac": genuine["mac"]}),
    ]
    served: list[str] = []

    def fake(sock: socket.socket, n: int) -> None:
        name, make = variants[n % len(variants)] if n < 2 * len(variants) else ("genuine", None)
        served.append(name)
        nonce = secrets.token_bytes(wire.NONCE_SIZE)
        wire.send(sock, wire.HELLO, {"v": wire.VERSION, "nonce": nonce, "role": "catalog"})
        _, req, _ = wire.receive(sock, (wire.LIST,))
        assert hmac_ok(token, "catalog", nonce, req)  # the client proves itself first
        if make is None:
            meta = {"mac": wire.mac(token, "catalog-reply", req["nonce"])}
        elif name == "replayed":
            meta = dict(genuine)
        else:
            meta = make(req["nonce"], req)
        wire.send(sock, wire.CATALOG, {**meta, "topics": fake_topics})

    with FakeServer(fake) as server:
        for _ in variants:
            with pytest.raises(AuthenticationError, match="wrong or missing token"):
                request(server.url, token)
        for _ in variants:  # the same through a subscription
            with pytest.raises(AuthenticationError):
                Subscription(server.url, TOPIC, token, timeout=5)
        assert request(server.url, token) == fake_topics  # holding the token, it is believed
    assert not server.errors, server.errors
    assert served == [n for n, _ in variants] * 2 + ["genuine"]


def hmac_ok(token: str, role: str, nonce: bytes, meta: dict[str, Any]) -> bool:
    try:
        wire.check_mac(token, role, nonce, meta)
    except AuthenticationError:
        return False
    return True


def test_client_refuses_a_fake_publisher() -> None:
    with Catalog() as cat:
        token = cat.token
        # A genuine SNAPSHOT, recorded for replaying (its MAC covers that SUBSCRIBE's nonce).
        real = Publisher("t", 0, 1, token)
        try:
            with socket.create_connection(real.address) as sock:
                _, hello, _ = wire.receive(sock, (wire.HELLO,))
                wire.send(sock, wire.SUBSCRIBE, {"mac": wire.mac(token, "subscribe", hello["nonce"]),
                                                 "nonce": secrets.token_bytes(16), "topic": "t"})
                _, genuine, _ = wire.receive(sock, (wire.SNAPSHOT,))
        finally:
            real.endpoint.close()
        variants: list[tuple[str, Callable[[bytes, dict[str, Any]], dict[str, Any]]]] = [
            ("another token", lambda n, sub: {"mac": wire.mac("guess", "publisher", n)}),
            ("no mac", lambda n, sub: {}),
            ("reflected", lambda n, sub: {"mac": sub["mac"]}),
            ("replayed", lambda n, sub: {"mac": genuine["mac"]}),
        ]
        after: list[tuple[str, bytes]] = []

        def fake(sock: socket.socket, n: int) -> None:
            name, make = variants[n] if n < len(variants) else ("genuine", None)
            nonce = secrets.token_bytes(wire.NONCE_SIZE)
            wire.send(sock, wire.HELLO, {"v": wire.VERSION, "nonce": nonce, "role": "publisher",
                                         "topic": "t", "partition": 0, "partitions": 1})
            _, sub, _ = wire.receive(sock, (wire.SUBSCRIBE,))
            assert hmac_ok(token, "subscribe", nonce, sub)
            meta = ({"mac": wire.mac(token, "publisher", sub["nonce"])} if make is None
                    else make(sub["nonce"], sub))
            wire.send(sock, wire.SNAPSHOT, {**meta, "lower": [0], "upper": [], "dropped": []})
            after.append((name, drain(sock)))  # what the client sends next

        with FakeServer(fake) as server:
            request(cat.url, token, wire.REGISTER, {
                "topic": "t", "partition": 0, "partitions": 1, "host": "127.0.0.1",
                "port": server.port, "time": "int", "schema": None})
            for _ in variants:
                with pytest.raises(AuthenticationError, match="wrong or missing token"):
                    Subscription(cat.url, "t", token, timeout=5)
            sub = Subscription(cat.url, "t", token, timeout=5)  # the fake holding the token
            sub.close()
            wait_for(lambda: len(after) == len(variants) + 1, 10, "the fake's last connection")
        assert not server.errors, server.errors
        # Refused fakes got nothing more (no FILTER); the genuine one got its FILTER.
        assert after[:-1] == [(name, b"") for name, _ in variants]
        assert after[-1][0] == "genuine" and kinds_in(after[-1][1]) == [wire.FILTER]


# -- fuzzing ---------------------------------------------------------------------------------

@dataclass
class Target:
    name: str  # the endpoint's ``what`` in its log lines
    address: tuple[str, int]
    role: str  # "catalog" | "publisher"


@dataclass
class Outcome:
    target: str
    category: str
    port: int
    refused: bool  # expected
    frames: int  # fuzzed frames sent
    saw_refused: bool  # a REFUSED frame reached the client (not always: a reset may lose it)


class Fuzzer:
    """Fuzz cases against the catalog and the publishers of ``TOPIC``; each returns an
    ``Outcome`` with whether the endpoint must refuse the connection (and log it once)."""

    def __init__(self, token: str, topics: dict[str, Any]) -> None:
        self.token = token
        self.topics = topics

    # first frames: what a peer sends before it is authenticated

    def first_kinds(self, t: Target) -> tuple[int, ...]:
        return (wire.LIST, wire.REGISTER) if t.role == "catalog" else (wire.SUBSCRIBE,)

    def mac_role(self, t: Target) -> str:
        return "catalog" if t.role == "catalog" else "subscribe"

    def genuine_first(self, t: Target, c: Client, rng: random.Random) -> tuple[int, dict[str, Any]]:
        """A first frame that would be accepted: LIST, or SUBSCRIBE to ``TOPIC``."""
        meta: dict[str, Any] = {"mac": wire.mac(self.token, self.mac_role(t), c.nonce()),
                                "nonce": secrets.token_bytes(wire.NONCE_SIZE)}
        if t.role == "catalog":
            return wire.LIST, meta
        return wire.SUBSCRIBE, {**meta, "topic": TOPIC}

    def expect_first(self, t: Target, data: bytes) -> bool | None:
        """Refused (True), silent (False) or nothing sent (None), for a first frame without
        the token: the server checks the kind and both lengths from the header alone, and
        refuses any whole frame (it cannot carry the MAC)."""
        if not data:
            return None
        if len(data) < wire.HEADER.size:
            return False
        kind, m, b = wire.HEADER.unpack_from(data)
        if kind not in self.first_kinds(t) or m > wire.MAX_META or b > 0:
            return True
        return len(data) >= wire.HEADER.size + m

    def random_bytes(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        n = rng.choice([rng.randint(1, 8), rng.randint(9, 64), rng.randint(65, 3000)])
        data = bytearray(rng.randbytes(n))
        if n >= wire.HEADER.size:
            if rng.random() < 0.5:
                data[0] = rng.choice(self.first_kinds(t))
            if rng.random() < 0.4:
                data[1:5] = rng.randint(0, n).to_bytes(4, "big")
            if rng.random() < 0.5:
                data[5:9] = bytes(4)
        if rng.random() < 0.5:
            c.hello()  # else sent before reading HELLO
        expected = self.expect_first(t, bytes(data))
        assert expected is not None
        return expected, bytes(data)

    def truncated(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        kind, meta = self.genuine_first(t, c, rng)
        data = raw_frame(kind, meta)
        return False, data[:rng.randint(1, len(data) - 1)]

    def oversized(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        kind = rng.choice(self.first_kinds(t))
        if rng.random() < 0.5:
            m, b = rng.choice([wire.MAX_META + 1, 2**32 - 1, rng.randint(wire.MAX_META + 1, 2**32 - 1)]), 0
        else:
            m, b = rng.randint(0, 64), rng.choice([1, 2**32 - 1, rng.randint(1, 2**32 - 1)])
        if rng.random() < 0.5:
            c.hello()
        return True, wire.HEADER.pack(kind, m, b) + rng.randbytes(rng.randint(0, 512))

    def garbage_meta(self, rng: random.Random) -> bytes:
        choice = rng.randrange(10)
        if choice == 0:
            return b"\xc1"  # never used in msgpack
        if choice == 1:
            return b"\x93\x01"  # an array of 3, cut
        if choice == 2:
            return b"\x91" * rng.randint(100, 60_000) + b"\x00"  # deeply nested arrays
        if choice == 3:
            return msgpack.packb(msgpack.ExtType(rng.randint(0, 127), rng.randbytes(8)))
        if choice == 4:
            return b"\x82\x01\xc4\x01x\x02\xa1y"  # {1: b"x", 2: "y"}: int keys
        if choice == 5:
            return msgpack.packb(rng.choice([[1, 2], 7, "mac", b"mac", None, 1.5]))
        if choice == 6:
            return b"\xa2\xff\xfe"  # a str that is not UTF-8
        if choice == 7:
            return b"\xdb\xff\xff\xff\xff" + rng.randbytes(16)  # a 4 GiB str, declared
        if choice == 8:
            return b"\xdf\xff\xff\xff\xff"  # a map of 2^32 - 1 entries, declared
        while True:
            data = rng.randbytes(rng.randint(1, 200))
            try:
                if not isinstance(msgpack.unpackb(data), dict):
                    return data
            except Exception:  # noqa: BLE001 - garbage, as wanted
                return data

    def garbage_msgpack(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        meta = self.garbage_meta(rng)
        return True, wire.HEADER.pack(rng.choice(self.first_kinds(t)), len(meta), 0) + meta

    def arrow_body(self, rng: random.Random) -> bytes:
        batch = pa.RecordBatch.from_pylist([{"k": 1, "v": rng.randint(0, 9)}])
        body = wire.encode_batch(batch)
        choice = rng.randrange(3)
        if choice == 0:
            return body
        if choice == 1:  # the IPC continuation marker, then garbage
            return b"\xff\xff\xff\xff" + rng.randbytes(rng.randint(4, 400))
        cut = bytearray(body)
        for _ in range(8):
            cut[rng.randrange(len(cut))] = rng.randrange(256)
        return bytes(cut)

    def garbage_body(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        kind, meta = self.genuine_first(t, c, rng)  # even with the right MAC
        return True, raw_frame(kind, meta, self.arrow_body(rng))

    def bad_mac(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        kind, meta = self.genuine_first(t, c, rng)
        nonce = c.nonce()
        choice = rng.randrange(7)
        if choice == 0:
            del meta["mac"]  # a valid-looking first frame without a MAC
        elif choice == 1:
            meta["mac"] = rng.randbytes(32)
        elif choice == 2:
            meta["mac"] = wire.mac("not-the-token", self.mac_role(t), nonce)
        elif choice == 3:
            meta["mac"] = wire.mac(self.token, "publisher" if t.role == "catalog" else "catalog",
                                   nonce)
        elif choice == 4:
            meta["mac"] = wire.mac(self.token, self.mac_role(t), rng.randbytes(16))  # replayed
        elif choice == 5:
            meta["mac"] = rng.choice(["x" * 32, 7, None, [1, 2], {"a": 1}])
        else:
            meta["mac"] = meta["mac"][:rng.randint(0, 31)]
        if kind == wire.LIST and rng.random() < 0.5:
            kind = wire.REGISTER
            meta.update(topic=TOPIC, partition=0, partitions=2, host="10.0.0.66", port=666,
                        time="int", schema=None)  # a hijack, had the MAC been right
        return True, raw_frame(kind, meta)

    def unexpected_kind(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        choice = rng.randrange(4)
        if choice == 0:  # the server's own HELLO, reflected
            hello = c.hello()
            return True, raw_frame(wire.HELLO, hello)
        kind = rng.choice([k for k in range(256) if k not in self.first_kinds(t)])
        if choice == 1:  # with the right MAC and a plausible map
            _, meta = self.genuine_first(t, c, rng)
            return True, raw_frame(kind, meta)
        if choice == 2:
            return True, raw_frame(wire.DATA if rng.random() < 0.5 else kind,
                                   {"time": 3}, self.arrow_body(rng))
        return True, raw_frame(kind, {}) + rng.randbytes(rng.randint(0, 100))

    def bad_fields(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        kind, meta = self.genuine_first(t, c, rng)  # authenticated, then malformed
        if t.role == "publisher":
            variant = rng.randrange(5)
            if variant == 0:
                del meta["nonce"]
            elif variant == 1:
                meta["nonce"] = rng.choice(["n" * 16, 16, None, [1]])
            elif variant == 2:
                del meta["topic"]
            elif variant == 3:
                meta["topic"] = rng.choice(["other", "", "nums " * 100, 5, None, b"nums"])
            else:
                meta["topic"] = [TOPIC]
            return True, raw_frame(kind, meta)
        if rng.random() < 0.2:
            if rng.random() < 0.5:
                del meta["nonce"]
            else:
                meta["nonce"] = rng.choice(["n" * 16, 16, None])
            return True, raw_frame(rng.choice([wire.LIST, wire.REGISTER]), meta)
        good = {"topic": f"fuzz-{rng.randrange(10**6)}", "partition": 0, "partitions": 1,
                "host": "127.0.0.1", "port": 1234, "time": "int", "schema": [["v", "int64"]]}
        bad = rng.choice([
            {"topic": ""}, {"topic": "t" * 201}, {"topic": 5}, {"partition": 1},
            {"partition": -1}, {"partition": True}, {"partitions": 0},
            {"partitions": 4097, "partition": 0}, {"host": 7}, {"port": 0}, {"port": 65536},
            {"port": "80"}, {"time": "float"}, {"time": [1]}, {"schema": "v:int64"},
            {"schema": [["v"]]}, {"schema": [["v", 1]]}, {"schema": [[["v"], "x"]]},
            {"topic": TOPIC, "partitions": 3, "partition": 2},  # another partition count
            {"topic": TOPIC, "partitions": 2, "partition": 1, "time": "product"},  # time type
        ])
        for key in bad:
            if key not in good:
                raise AssertionError(key)
        return True, raw_frame(wire.REGISTER, {**meta, **good, **bad})

    # after authenticating (publishers): a malformed FILTER

    def subscribe(self, t: Target, c: Client, rng: random.Random) -> None:
        kind, meta = self.genuine_first(t, c, rng)
        c.send(raw_frame(kind, meta))
        _, snap, _ = wire.receive(c.sock, (wire.SNAPSHOT,))
        wire.check_mac(self.token, "publisher", meta["nonce"], snap)

    def bad_antichain(self, rng: random.Random, field: str) -> Any:
        def nest(depth: int) -> Any:
            return 1 if depth == 0 else [nest(depth - 1), 1]
        return rng.choice([
            *([None] if field == "drop_upto" else []),  # since=None is "no resume position"
            "x", 5, {"a": 1}, b"\x00", [True], [1.5], ["1"], [None], [[1, 2, 3]], [[1]],
            [nest(20)], [nest(9)], list(range(wire.MAX_ANTICHAIN + 1)),
            [[0, 0]], [[1, [2, 3]]], [5, [0, 0]],  # Product times on an int stream
        ])

    def filter_garbage(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        self.subscribe(t, c, rng)
        choice = rng.randrange(6)
        if choice == 0:
            meta = self.garbage_meta(rng)
            return True, wire.HEADER.pack(wire.FILTER, len(meta), 0) + meta
        if choice == 1:
            return True, raw_frame(wire.FILTER, {"drop_upto": []}, self.arrow_body(rng))
        if choice == 2:
            return True, wire.HEADER.pack(wire.FILTER, wire.MAX_META + 1 + rng.randrange(2**31), 0)
        if choice == 3:
            return True, raw_frame(rng.choice([wire.SUBSCRIBE, wire.LIST, wire.DATA, wire.HELLO,
                                               0, 200]), {"drop_upto": []})
        if choice == 4:
            data = raw_frame(wire.FILTER, {"drop_upto": [], "since": [2**62]})
            return False, data[:rng.randint(1, len(data) - 1)]
        field = rng.choice(["drop_upto", "since"])
        return True, raw_frame(wire.FILTER, {"drop_upto": [], field: self.bad_antichain(rng, field)})

    def filter_then_stray(self, t: Target, c: Client, rng: random.Random) -> tuple[bool, bytes]:
        """A well-formed FILTER that takes no epoch, then a stray frame: the publisher ends
        the subscription with a refusal (a subscriber sends nothing after FILTER)."""
        self.subscribe(t, c, rng)
        c.send(raw_frame(wire.FILTER, {"drop_upto": [], "since": [2**62]}))
        return True, rng.randbytes(rng.randint(1, 100))

    def run(self, t: Target, category: str, seed: int) -> Outcome:
        rng = random.Random(seed)
        c = Client(t.address)
        try:
            if category == "nothing":
                if rng.random() < 0.5:
                    c.hello()
                if rng.random() < 0.3:
                    c.sock.close()
                    return Outcome(t.name, category, c.port, False, 0, False)
                data = c.finish()
                return Outcome(t.name, category, c.port, False, 0, wire.REFUSED in kinds_in(data))
            if category == "legit":
                kind, meta = self.genuine_first(t, c, rng)
                c.send(raw_frame(kind, meta))
                _, reply, _ = wire.receive(c.sock, (wire.CATALOG,))
                wire.check_mac(self.token, "catalog-reply", meta["nonce"], reply)
                assert reply["topics"] == self.topics
                c.finish()
                return Outcome(t.name, category, c.port, False, 0, False)
            refused, data = getattr(self, category)(t, c, rng)
            c.send(data)
            reply = c.finish()
            return Outcome(t.name, category, c.port, refused, 1, wire.REFUSED in kinds_in(reply))
        finally:
            c.sock.close()


CATEGORIES = {  # category: (weight, roles)
    "random_bytes": (20, ("catalog", "publisher")),
    "truncated": (8, ("catalog", "publisher")),
    "oversized": (8, ("catalog", "publisher")),
    "garbage_msgpack": (12, ("catalog", "publisher")),
    "garbage_body": (6, ("catalog", "publisher")),
    "bad_mac": (12, ("catalog", "publisher")),
    "unexpected_kind": (8, ("catalog", "publisher")),
    "bad_fields": (8, ("catalog", "publisher")),
    "filter_garbage": (14, ("publisher",)),
    "filter_then_stray": (1, ("publisher",)),
}


def plan(targets: list[Target], seed: int) -> list[tuple[Target, str, int]]:
    """``FUZZ_FRAMES`` cases of one fuzzed frame each, then the connections that send
    nothing and a few genuine LISTs, shuffled."""
    rng = random.Random(seed)
    cases: list[tuple[Target, str, int]] = []
    for i in range(FUZZ_FRAMES):
        t = targets[0] if rng.random() < 0.4 else rng.choice(targets[1:])
        names = [c for c, (_, roles) in CATEGORIES.items() if t.role in roles]
        category = rng.choices(names, [CATEGORIES[c][0] for c in names])[0]
        cases.append((t, category, seed * 10**6 + i))
    for i in range(SILENT_CONNECTIONS):
        cases.append((rng.choice(targets), "nothing", seed * 10**6 + FUZZ_FRAMES + i))
    for i in range(LEGIT_LISTS):
        cases.append((targets[0], "legit", seed * 10**6 + 2 * FUZZ_FRAMES + i))
    rng.shuffle(cases)
    return cases


class UnpickleSpy:
    """Records every call of the patched unpickling entry points, with its thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        spy = self

        def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                spy.calls.append((name, threading.current_thread().name))
                return fn(*args, **kwargs)
            return recorded

        class Unpickler(pickle.Unpickler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                spy.calls.append(("pickle.Unpickler", threading.current_thread().name))
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(pickle, "loads", wrap("pickle.loads", pickle.loads))
        monkeypatch.setattr(pickle, "load", wrap("pickle.load", pickle.load))
        monkeypatch.setattr(pickle, "Unpickler", Unpickler)
        try:
            import cloudpickle
        except ImportError:  # pragma: no cover
            pass
        else:
            monkeypatch.setattr(cloudpickle, "loads", wrap("cloudpickle.loads", cloudpickle.loads))
            monkeypatch.setattr(cloudpickle, "load", wrap("cloudpickle.load", cloudpickle.load))

    def outside_workers(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if not c[1].startswith("tokenflow-worker-")]


def value(worker: int, epoch: int, i: int) -> int:
    return epoch * 1000 + worker * 100 + i


def rows(records: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[tuple[int, int]]:
    return sorted((r["k"], r["v"]) for r in records)


def test_pubsub_modules_hold_no_unpickler() -> None:
    """The spy patches module attributes: a pubsub module holding its own reference to an
    unpickler (``from pickle import loads``) would escape it, so there is none."""
    import tokenflow.pubsub as pubsub
    names = [n for n in sys.modules if n == pubsub.__name__ or n.startswith(pubsub.__name__ + ".")]
    assert len(names) > 5
    for name in names:
        for attr, obj in vars(sys.modules[name]).items():
            module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
            assert str(module).split(".")[0] not in ("pickle", "_pickle", "cloudpickle", "dill"), \
                f"{name}.{attr} is {obj!r}"


def test_fuzzed_frames_while_publishing(caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spy = UnpickleSpy(monkeypatch)
    pickle.loads(pickle.dumps(1))  # the spy sees a call from here ...
    assert spy.outside_workers() == [("pickle.loads", threading.current_thread().name)]
    spy.calls.clear()

    # The workers publish epoch after epoch until the test sets ``limit`` (then both have
    # sent every epoch below it), and keep the stream open until ``release``: the subscribers
    # read ``limit`` whole epochs and stop, without depending on how the stream's end is served
    # (under load a Subscription read to the end can fail: one partition's BYE reaches it
    # before the other partition's last frontier, and it tries to reconnect the finished one).
    lock = threading.Lock()
    limit = [sys.maxsize]
    release = threading.Event()
    publishers: dict[int, Publisher] = {}
    captures: dict[int, Any] = {}
    sent: dict[int, int] = {}
    failures: list[BaseException] = []

    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            records = stream.map(lambda x: {"k": x % 7, "v": x})
            captures[worker.index] = records.capture()
            publishers[worker.index] = records.publish(TOPIC)
            return inp

        inp = worker.dataflow(build)
        epoch = 0
        while True:
            with lock:
                if epoch >= limit[0] or release.is_set():
                    break
                sent[worker.index] = epoch + 1
            for i in range(RECORDS_PER_EPOCH):
                inp.send(value(worker.index, epoch, i))
            epoch += 1
            inp.advance_to(epoch)
            worker.step()
            time.sleep(0.005)
        while not release.wait(0.005):
            worker.step()
        inp.close()

    with Catalog() as cat:
        def run_job() -> None:
            try:
                execute(job, workers=2, runtime="thread", catalog=cat.endpoint)
            except BaseException as exc:  # noqa: BLE001 - checked below
                failures.append(exc)
                release.set()

        runner = threading.Thread(target=run_job, name="job-driver")
        runner.start()
        try:
            wait_for(lambda: request(cat.url, cat.token).get(TOPIC, {}).get("time") == "int"
                     and len(cat.topics()[TOPIC]["partitions"]) == 2, 30, "the topic's schema")
            topics = request(cat.url, cat.token)
            live: list[Any] = []
            during = Subscription(cat.url, TOPIC, cat.token, start="earliest")

            def listen() -> None:
                for epoch in during:
                    live.append(epoch)
                    if len(live) >= limit[0]:
                        break

            listener = threading.Thread(target=listen, name="live-subscriber")
            listener.start()

            targets = [Target("catalog", ("127.0.0.1", cat.port), "catalog")] + [
                Target(f"publisher {TOPIC}/{i}", publishers[i].address, "publisher")
                for i in sorted(publishers)]
            fuzzer = Fuzzer(cat.token, topics)
            cases = plan(targets, seed=18)
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                outcomes = list(pool.map(lambda c: fuzzer.run(*c), cases))

            # Both endpoints still serve.
            assert request(cat.url, cat.token) == topics == {TOPIC: {
                "time": "int", "schema": [["k", "int64"], ["v", "int64"]], "count": 2,
                "partitions": [{"partition": i, "host": "127.0.0.1",
                                "port": publishers[i].address[1]} for i in (0, 1)]}}
            assert not failures and not release.is_set(), "the job ended during the fuzzing"
            with Subscription(cat.url, TOPIC, cat.token, start="earliest") as after:
                with lock:  # no worker has begun epoch limit - 1: the listener sees the limit
                    limit[0] = max(sent.values()) + 1
                received = after.epochs(limit[0])
            listener.join(60)
            during.close()
        finally:
            release.set()
            runner.join(60)
        assert not runner.is_alive() and not listener.is_alive()
        assert not failures, failures
        # Every connection's handler has returned: the counts are final.
        wait_for(lambda: not [t for t in threading.enumerate()
                              if t.name.startswith(("tokenflow-catalog-conn",
                                                    f"tokenflow-publisher {TOPIC}/"))],
                 30, "the endpoints' connection threads")
        refused_by = {"catalog": cat.refused} | {
            f"publisher {TOPIC}/{i}": p.endpoint.refused for i, p in publishers.items()}

    # The job's output is what its input makes, and what both subscribers received.
    assert sent == {0: limit[0], 1: limit[0]} and limit[0] >= MIN_EPOCHS
    expected = {e: rows({"k": value(w, e, i) % 7, "v": value(w, e, i)}
                        for w in sent for i in range(RECORDS_PER_EPOCH))
                for e in range(limit[0])}
    captured: dict[int, list[dict[str, Any]]] = {}
    for cap in captures.values():
        assert cap.done
        for t, recs in cap.by_time().items():
            captured.setdefault(t, []).extend(recs)
    assert {t: rows(r) for t, r in captured.items()} == expected
    for epochs in (live, received):
        assert [e.time for e in epochs] == sorted(expected)  # each once, in order, no hole
        assert {e.time: rows(e.batch.to_pylist()) for e in epochs} == expected

    # Each refusal is logged exactly once, by the endpoint that refused, naming the peer.
    frames = sum(o.frames for o in outcomes)
    should = [o for o in outcomes if o.refused]
    lines = [refused_peer(r) for r in refusals(caplog)]
    assert frames == FUZZ_FRAMES
    missing = Counter((o.target, o.port) for o in should) - Counter(lines)
    extra = Counter(lines) - Counter((o.target, o.port) for o in should)
    assert not missing and not extra, (
        [o for o in should if (o.target, o.port) in missing],
        [o for o in outcomes if (o.target, o.port) in extra], extra)
    assert refused_by == {name: sum(o.target == name for o in should) for name in refused_by}
    assert sum(refused_by.values()) == len(lines) == len(should)
    assert not [o for o in outcomes if o.saw_refused and not o.refused]
    by_category = Counter(o.category for o in outcomes)
    assert all(by_category[c] > 0 for c in CATEGORIES), by_category

    # Nothing from outside the job's workers was unpickled.
    assert spy.outside_workers() == []
    print(f"\nfuzz: {frames} frames over {len(outcomes)} connections, {len(should)} refused "
          f"({refused_by}; {sum(o.saw_refused for o in should)} REFUSED frames read before a "
          f"reset); {len(received)} epochs; unpickling calls {len(spy.calls)}; "
          f"{dict(by_category)}")


def test_a_mistyped_filter_never_reaches_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    """A FILTER of Product times for an int topic, sent before the partition's first epoch
    (so nothing yet tells the publisher its time type, and there is nothing to replay): the
    worker's next ``data``/``advance`` must not raise (it would fail the publishing job), the
    subscriber is refused, once."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    token = wire.new_token()
    publisher = Publisher("t", 0, 1, token)
    try:
        client = Client(publisher.address)
        nonce = secrets.token_bytes(wire.NONCE_SIZE)
        client.send(raw_frame(wire.SUBSCRIBE, {"mac": wire.mac(token, "subscribe", client.nonce()),
                                               "nonce": nonce, "topic": "t"}))
        _, snap, _ = wire.receive(client.sock, (wire.SNAPSHOT,))
        wire.check_mac(token, "publisher", nonce, snap)
        client.send(raw_frame(wire.FILTER, {"drop_upto": [], "since": [[0, 0]]}))
        wait_for(lambda: publisher.endpoint.refused == 1 or len(publisher.log.subscribers) == 1
                 and publisher.log.subscribers[0].filter is not None, 10, "the FILTER")
        # What the publish operator calls on the worker.
        publisher.data(0, pa.RecordBatch.from_pylist([{"v": 1}]))
        publisher.advance([1])
        publisher.data(1, pa.RecordBatch.from_pylist([{"v": 2}]))
        publisher.advance([2])
        assert kinds_in(client.finish())[-1:] == [wire.REFUSED]
        assert len(refusals(caplog)) == 1, [r.getMessage() for r in refusals(caplog)]
        assert publisher.endpoint.refused == 1
    finally:
        publisher.endpoint.close()


# -- a first frame must be whole within HELLO_TIMEOUT ----------------------------------------

def test_a_trickled_first_frame_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer sending its first frame a byte at a time (each within the socket timeout) is
    cut when ``HELLO_TIMEOUT`` has passed in total, so it cannot hold one of the endpoint's
    ``MAX_CONNECTIONS`` slots for ever."""
    monkeypatch.setattr(wire, "HELLO_TIMEOUT", 1.0)
    with Catalog() as cat:
        sock = socket.create_connection(("127.0.0.1", cat.port), timeout=5)
        with sock:
            wire.receive(sock, (wire.HELLO,))
            sock.sendall(wire.HEADER.pack(wire.LIST, 60_000, 0))
            closed = False
            for _ in range(100):  # 10 s of a byte every 0.1 s: far below 60,000 bytes
                time.sleep(0.1)
                try:
                    sock.sendall(b"\x00")
                    if select.select([sock], [], [], 0)[0]:
                        closed = sock.recv(1) == b""
                except OSError:
                    closed = True
                if closed:
                    break
            assert closed, "the trickling peer still holds its connection"
        assert request(cat.url, cat.token) == {}  # the endpoint still serves
        assert cat.refused == 0
