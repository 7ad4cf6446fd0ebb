"""Publish/subscribe over real sockets: jobs on the thread and process runtimes publish, plain
clients and a second job subscribe; every epoch received is compared with what the job sent."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from tokenflow import execute
from tokenflow.order.product import Product
from tokenflow.pubsub import AuthenticationError, Catalog, Publisher, Subscription, lookup, wire
from tokenflow.pubsub.catalog import request

EPOCHS = 40


def rows(worker: int, epoch: int) -> list[dict[str, int]]:
    """What worker ``worker`` sends at ``epoch`` (no rows at every seventh epoch)."""
    return [{"w": worker, "e": epoch, "i": i} for i in range(0 if epoch % 7 == 3 else 1 + epoch % 5)]


def expected(workers: int) -> dict[int, Counter[tuple[int, int, int]]]:
    out: dict[int, Counter[tuple[int, int, int]]] = {}
    for e in range(EPOCHS):
        c = Counter((r["w"], r["e"], r["i"]) for w in range(workers) for r in rows(w, e))
        if c:
            out[e] = c
    return out


def publishing_job(pace: float, expect: int = 1) -> Any:
    """Publishes ``rows`` as topic ``rows``, an epoch every ``pace`` s; the finished stream
    stays served until ``expect`` subscribers have joined and drained (up to 30 s)."""
    def job(worker: Any) -> None:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            stream.publish("rows", linger=30.0, expect=expect)
            return inp

        inp = worker.dataflow(build)
        for e in range(EPOCHS):
            for r in rows(worker.index, e):
                inp.send(r)
            inp.advance_to(e + 1)
            deadline = time.monotonic() + pace
            while time.monotonic() < deadline:
                worker.step_or_park(0.002)
        inp.close()

    return job


def received(epochs: list[Any]) -> dict[int, Counter[tuple[int, int, int]]]:
    out: dict[int, Counter[tuple[int, int, int]]] = {}
    for epoch in epochs:
        assert epoch.time not in out, f"epoch {epoch.time} delivered twice"
        table = epoch.batch.to_pydict()
        out[epoch.time] = Counter(zip(table["w"], table["e"], table["i"], strict=True))
    return out


def run_with_subscribers(runtime: str, workers: int) -> tuple[list[Any], list[Any]]:
    """Run the publishing job with an ``earliest`` subscriber from the start and a ``latent``
    one that joins once the first has received ten epochs; returns both one's epochs."""
    results: list[Any] = [None, None]
    tenth = threading.Event()
    with Catalog() as catalog:
        def early() -> None:
            try:
                with Subscription(catalog.url, "rows", catalog.token, start="earliest") as sub:
                    results[0] = []
                    for epoch in sub:
                        results[0].append(epoch)
                        if len(results[0]) == 10:
                            tenth.set()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                results[0] = exc
            tenth.set()

        def late() -> None:
            tenth.wait(60)
            try:
                with Subscription(catalog.url, "rows", catalog.token, start="latent") as sub:
                    results[1] = sub.epochs()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                results[1] = exc

        threads = [threading.Thread(target=early), threading.Thread(target=late)]
        for t in threads:
            t.start()
        execute(publishing_job(0.02, expect=2), workers=workers, runtime=runtime,
                catalog=catalog.endpoint)
        for t in threads:
            t.join(30)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results[0], results[1]


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_subscribers_see_whole_epochs(runtime: str) -> None:
    truth = expected(2)
    early, late = run_with_subscribers(runtime, 2)
    got = received(early)
    assert got == truth  # every epoch, each whole, from both partitions
    got_late = received(late)
    assert got_late, "the late subscriber saw nothing"
    first = min(got_late)
    assert first >= 10
    assert got_late == {e: c for e, c in truth.items() if e >= first}  # whole epochs, no hole


def test_catalog_lists_partitions_schema_and_time_type() -> None:
    with Catalog() as catalog:
        thread = threading.Thread(target=execute, args=(publishing_job(0.01),),
                                  kwargs={"workers": 2, "runtime": "thread", "catalog": catalog.endpoint})
        thread.start()
        entry = lookup(catalog.url, "rows", catalog.token, timeout=10)
        assert entry["count"] == 2 and [p["partition"] for p in entry["partitions"]] == [0, 1]
        with Subscription(catalog.url, "rows", catalog.token, start="earliest") as sub:
            sub.epochs(limit=1)
        thread.join(30)
        entry = catalog.topics()["rows"]
        assert entry["time"] == "int"
        assert [name for name, _ in entry["schema"]] == ["w", "e", "i"]
        with pytest.raises(AuthenticationError):
            request(catalog.url, "not the token")
        with pytest.raises(LookupError, match="rows"):
            lookup(catalog.url, "nope", catalog.token, timeout=0.2)


def product_batches(partition: int, t: Product) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"p": [partition] * 3, "a": [t[0]] * 3, "b": [t[1]] * 3})


def test_product_times_across_partitions_and_resume_since() -> None:
    """Two partitions of ``Product`` times, driven directly: a subscriber gets whole epochs in
    an order that extends the product order, and a second one resumes exactly at the first
    one's position."""
    token = wire.new_token()
    pubs = [Publisher("grid", p, 2, token) for p in range(2)]
    with Catalog(token=token) as catalog:
        for pub in pubs:
            pub.register(catalog.url, "product")
            pub.advance([Product(0, 0)])
        order = [Product(a, b) for a in range(3) for b in range(3)]
        sub = Subscription(catalog.url, "grid", token)
        for k, t in enumerate(order):
            for p, pub in enumerate(pubs):
                pub.data(t, product_batches(p, t))
                remaining = order[k + 1:]
                pub.advance([r for r in remaining if not any(o != r and o.less_equal(r) for o in remaining)])
        first = sub.epochs(limit=4)
        position = sub.position
        sub.close()
        resumed = Subscription(catalog.url, "grid", token, since=position).epochs()
        for pub in pubs:
            pub.finish(linger=1)
    times = [e.time for e in first + resumed]
    assert sorted(times) == sorted(order) and len(set(times)) == len(order)
    for e in first + resumed:
        assert sorted(e.batch.column("p").to_pylist()) == [0, 0, 0, 1, 1, 1]
        assert set(zip(e.batch.column("a").to_pylist(), e.batch.column("b").to_pylist(),
                       strict=True)) == {tuple(e.time)}
    for i, a in enumerate(times):  # never an epoch before one it depends on
        assert not any(b.less_than(a) for b in times[i + 1:])


def test_slow_subscriber_is_disconnected_and_resumes_exactly_once() -> None:
    token = wire.new_token()
    pub = Publisher("slow", 0, 1, token, max_queue=20_000)
    with Catalog(token=token) as catalog:
        pub.register(catalog.url, "int")
        pub.advance([0])
        sub = Subscription(catalog.url, "slow", token, buffer=1)
        # 60 epochs of 160 KB: more than the kernel's socket buffers take in (a send buffer
        # grows to 4 MB here), so the writer blocks and the queue overflows however fast
        # the writer thread drains it; with 8 KB epochs all fit in the buffers, and the
        # queue overflowed only when the writer happened to lag the burst (a flaky test)
        batch = pa.RecordBatch.from_pydict({"x": list(range(20_000))})
        for e in range(60):  # the subscriber reads nothing meanwhile: its queue overflows
            pub.data(e, batch)
            pub.advance([e + 1])
        pub.advance([])
        assert pub.disconnected >= 1
        epochs = sub.epochs()
        pub.finish(linger=1)
    assert [e.time for e in epochs] == list(range(60))
    assert all(e.batch.num_rows == 20_000 for e in epochs)
    assert sub.reconnects >= 1


def test_wrong_token_refused_by_publisher() -> None:
    token = wire.new_token()
    pub = Publisher("t", 0, 1, token)
    with Catalog(token=token) as catalog:
        pub.register(catalog.url, "int")
        # the catalog needs its token too, so forge a direct connection to the publisher
        sub = Subscription.__new__(Subscription)
        sub.topic, sub._token, sub._timeout = "t", "wrong", 5.0
        sub._partitions, sub._sockets = [("127.0.0.1", pub.address[1])], [None]
        with pytest.raises(AuthenticationError):
            sub._connect(0)
    pub.finish(linger=0)
    assert pub.endpoint.refused == 1


def test_second_job_subscribes_as_a_source() -> None:
    truth = expected(2)
    got: dict[int, Counter[Any]] = {}
    with Catalog() as catalog:
        def reader(worker: Any) -> None:
            def build(scope: Any) -> Any:
                stream = scope.subscribe(catalog.url, "rows", catalog.token, start="earliest")
                return stream.capture()

            capture = worker.dataflow(build)
            worker.step_until_done()
            if worker.index == 0:
                for t, records in capture.by_time().items():
                    got[t] = Counter((r["w"], r["e"], r["i"]) for r in records)

        thread = threading.Thread(target=execute, args=(reader,),
                                  kwargs={"workers": 2, "runtime": "thread"})
        thread.start()
        execute(publishing_job(0.01), workers=2, runtime="thread", catalog=catalog.endpoint)
        thread.join(30)
    assert got == truth


def test_published_nexmark_query_equals_its_output() -> None:
    from tokenflow.nexmark.run import run_query

    got: list[Any] = []
    with Catalog() as catalog:
        def reader() -> None:
            with Subscription(catalog.url, "q5", catalog.token, start="earliest") as sub:
                got.extend(sub.epochs())

        thread = threading.Thread(target=reader)
        thread.start()
        result = run_query("q5", 60_000, workers=2, runtime="thread", publish="q5",
                           catalog=catalog.endpoint, subscribers=1)
        thread.join(30)
    rows = sorted(tuple(r.values()) for e in got for r in e.batch.to_pylist())
    assert rows == sorted(result.rows.itertuples(index=False, name=None))
    assert len(rows) > 0 and len({e.time for e in got}) == len(got)


def test_send_frames_keeps_order_across_small_and_large_frames() -> None:
    import random
    import socket as socketlib

    from tokenflow.pubsub.publisher import COALESCE_BYTES, send_frames

    rng = random.Random(7)
    frames = [bytes([i % 256]) * rng.choice([1, 100, COALESCE_BYTES - 1, COALESCE_BYTES,
                                             3 * COALESCE_BYTES]) for i in range(40)]
    a, b = socketlib.socketpair()
    received = bytearray()
    expected = b"".join(frames)

    def read() -> None:
        while len(received) < len(expected):
            received.extend(b.recv(1 << 20))

    reader = threading.Thread(target=read)
    reader.start()
    send_frames(a, frames)
    reader.join(10)
    a.close()
    b.close()
    assert bytes(received) == expected


def test_a_paused_reader_is_not_dropped_by_a_socket_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscriber that stops reading for many write-polling periods stays connected while
    its queue is within ``max_queue``: only the queue bound disconnects (counted, logged)."""
    from tokenflow.pubsub import publisher as publisher_module

    monkeypatch.setattr(publisher_module, "WRITE_POLL", 0.1)
    token = wire.new_token()
    pub = Publisher("paused", 0, 1, token, max_queue=1 << 30)
    with Catalog(token=token) as catalog:
        pub.register(catalog.url, "int")
        pub.advance([0])
        sub = Subscription(catalog.url, "paused", token, buffer=1)
        batch = pa.RecordBatch.from_pydict({"x": list(range(250_000))})  # 2 MB a frame
        for e in range(20):
            pub.data(e, batch)
            pub.advance([e + 1])
        pub.advance([])
        time.sleep(1.5)  # the reader holds one event, its socket fills: writes block
        epochs = sub.epochs()
        pub.finish(linger=5)
    assert [e.time for e in epochs] == list(range(20))
    assert sub.reconnects == 0 and pub.disconnected == 0
