"""Epoch atomicity of publish/subscribe against the published stream's capture: the
publisher's ``PartitionLog`` and the subscriber's ``EpochAssembler`` driven through real frames
(``tokenflow.pubsub.wire``), without sockets, with subscribers joining, leaving, being
disconnected and resuming at random instants of random streams.

Oracle: the stream itself.  Every partition's data frames are recorded per time (the capture);
a subscriber's join filter is computed independently from the upper frontiers it was sent;
at the end each subscriber must have received, exactly once and each in one piece, precisely
the epochs that (a) carry data, (b) pass its join filter and (c) its final position has passed.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from tokenflow.order.partial_order import less_equal
from tokenflow.order.product import Product
from tokenflow.pubsub import wire
from tokenflow.pubsub.assembler import EpochAssembler
from tokenflow.pubsub.frontiers import EpochFilter, maximal, minimal, passed
from tokenflow.pubsub.log import PartitionLog

INSTANTS = 10_000
"""Join and leave instants per configuration (partitions x time type)."""


def universe(kind: str, rng: random.Random) -> list[Any]:
    """The times of a stream, in a random linear extension of their order."""
    if kind == "int":
        return list(range(rng.randint(3, 12)))
    a, b = rng.randint(2, 4), rng.randint(2, 4)
    times = [Product(i, j) for i in range(a) for j in range(b)]
    out: list[Any] = []
    remaining = set(times)
    while remaining:  # pick any minimal remaining time: a random topological order
        ready = [t for t in remaining if not any(less_equal(o, t) and o != t for o in remaining)]
        choice = rng.choice(sorted(ready))
        out.append(choice)
        remaining.remove(choice)
    return out


def stream_events(order: list[Any], partitions: int, rng: random.Random) -> list[tuple[Any, ...]]:
    """A random interleaving of every partition's events: ``("data", p, t, body)`` at a time
    the partition has not completed, ``("frontier", p, antichain)`` when it completes one."""
    per_partition: list[list[tuple[Any, ...]]] = []
    for p in range(partitions):
        events: list[tuple[Any, ...]] = []
        done = 0
        n = 0
        while done < len(order):
            remaining = order[done:]
            if rng.random() < 0.6:
                t = rng.choice(remaining[:3])
                events.append(("data", p, t, f"p{p}-{n}".encode()))
                n += 1
            else:
                done += 1
                events.append(("frontier", p, minimal(order[done:])))
        per_partition.append(events)
    cursors = [0] * partitions
    merged = []
    while any(c < len(e) for c, e in zip(cursors, per_partition, strict=True)):
        p = rng.choice([i for i in range(partitions) if cursors[i] < len(per_partition[i])])
        merged.append(per_partition[p][cursors[p]])
        cursors[p] += 1
    return merged


class Client:
    """A subscriber of every partition, fed frames through ``PartitionLog`` queues."""

    def __init__(self, logs: list[PartitionLog], name: str, start: str,
                 rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random(name)
        self.logs = logs
        self.name = name
        self.start = start
        self.assembler = EpochAssembler(len(logs))
        self.subs: list[Any] = [None] * len(logs)
        self.marks: list[int] = [0] * len(logs)
        self.snapshots: list[Any] = [None] * len(logs)
        self.join_upper: list[Any] | None = None
        self.received: list[tuple[Any, list[bytes]]] = []
        self.refused = False

    def snapshot(self, p: int) -> None:
        snap, sub, mark = self.logs[p].join(f"{self.name}/{p}")
        self.snapshots[p], self.subs[p], self.marks[p] = snap, sub, mark

    def filter_all(self) -> None:
        key = "upper" if self.start == "latent" else "dropped"
        uppers = [getattr(s, key) for s in self.snapshots]
        filt = EpochFilter(maximal(t for u in uppers for t in u))
        self.join_upper = [t for u in uppers for t in u]
        self.assembler.filter = filt
        for p, log in enumerate(self.logs):
            self.assembler.snapshot(p, self.snapshots[p].lower, self.snapshots[p].known)
            log.start(self.subs[p], self.marks[p], EpochFilter(list(filt.drop_upto)))

    def disconnect(self, p: int) -> None:
        self.drain()
        self.logs[p].leave(self.subs[p])
        self.subs[p] = None

    def resume(self, p: int) -> None:
        snap, sub, mark = self.logs[p].join(f"{self.name}/{p}")
        assert self.assembler.filter is not None
        filt = EpochFilter(list(self.assembler.filter.drop_upto), self.assembler.last_position)
        self.assembler.snapshot(p, snap.lower, snap.known)
        try:
            self.logs[p].start(sub, mark, filt)
        except ValueError:
            self.refused = True
            return
        self.subs[p] = sub

    def drain(self) -> None:
        for p in self.rng.sample(range(len(self.logs)), len(self.logs)):
            sub = self.subs[p]
            if sub is None:
                continue
            for data in sub.take(0) or []:
                self.frame(p, data)

    def frame(self, p: int, data: bytes) -> None:
        kind, meta_len, body_len = wire.HEADER.unpack_from(data)
        meta = wire.unpack_meta(data[wire.HEADER.size:wire.HEADER.size + meta_len], "test")
        body = data[wire.HEADER.size + meta_len:]
        assert len(body) == body_len
        if kind == wire.DATA:
            self.assembler.data(p, wire.decode_time(meta["time"]), body)
        elif kind == wire.LOWER:
            updates = [(wire.decode_time(t), d) for t, d in meta["updates"]]
            self.received.extend(self.assembler.lower(p, updates, bool(meta.get("replayed"))))

    def leave(self) -> None:
        self.drain()
        for p, log in enumerate(self.logs):
            if self.subs[p] is not None:
                log.leave(self.subs[p])


def check(client: Client, capture: dict[Any, Counter[bytes]]) -> None:
    times = [t for t, _ in client.received]
    assert len(times) == len(set(times)), f"{client.name}: an epoch delivered twice: {times}"
    for t, bodies in client.received:
        assert Counter(bodies) == capture[t], f"{client.name}: epoch {t} partial or mixed"
    position = client.assembler.last_position
    if client.refused:
        return  # refused to resume: what it got is checked above, nothing more is owed
    if position is None or client.join_upper is None:
        assert not times
        return
    upper = client.join_upper  # independent of EpochFilter: drop every t <= some upper
    expected = {t for t in capture
                if not any(less_equal(t, u) for u in upper) and passed(position, t)}
    assert set(times) == expected, (f"{client.name}: holes or extra epochs: got {sorted(times)}, "
                                    f"expected {sorted(expected)}")


def run_stream(kind: str, partitions: int, seed: int, instants: int) -> tuple[int, int]:
    """One random stream with subscribers joining and leaving at ``instants`` random instants;
    returns (join/leave instants used, epochs delivered)."""
    rng = random.Random(seed)
    order = universe(kind, rng)
    events = stream_events(order, partitions, rng)
    # Retention: all, none (only incomplete epochs' frames: resumes may be refused), a little.
    retain = rng.choice([1 << 30, 0, 100])
    logs = [PartitionLog(retain_bytes=retain) for _ in range(partitions)]
    capture: dict[Any, Counter[bytes]] = defaultdict(Counter)
    # Subscriber plans: join instant, per-partition snapshot instants, leave instant.
    clients: list[Client] = []
    plans: dict[int, list[tuple[str, Client, Any]]] = defaultdict(list)
    used = 0
    counter = itertools.count()
    while used < instants:
        join = rng.randrange(len(events) + 1)
        client = Client(logs, f"s{next(counter)}", rng.choice(["latent", "latent", "earliest"]),
                        random.Random(rng.random()))
        snaps = sorted(join + rng.randrange(4) for _ in range(partitions))
        for p, at in zip(rng.sample(range(partitions), partitions), snaps, strict=True):
            plans[at].append(("snapshot", client, p))
        plans[snaps[-1] + rng.randrange(3)].append(("filter", client, None))
        leave = snaps[-1] + 3 + int(rng.expovariate(1 / 25))
        if rng.random() < 0.3:
            p = rng.randrange(partitions)
            plans[leave].append(("disconnect", client, p))
            leave += 1 + rng.randrange(10)
            plans[leave].append(("resume", client, p))
            leave += 1 + rng.randrange(10)
        plans[leave].append(("leave", client, None))
        clients.append(client)
        used += 2
    filtered: set[Client] = set()
    for i in range(max([len(events), *plans]) + 1):
        for action, client, p in plans.get(i, []):
            if action == "snapshot":
                client.snapshot(p)
            elif action == "filter":
                client.filter_all()
                filtered.add(client)
            elif client in filtered and not client.refused:
                getattr(client, action)(*(() if p is None else (p,)))
        if i < len(events):
            event = events[i]
            if event[0] == "data":
                _, p, t, body = event
                capture[t][body] += 1
                logs[p].data(t, wire.frame(wire.DATA, {"time": wire.encode_time(t)}, body))
            else:
                logs[event[1]].advance(event[2])
        for client in filtered:
            if rng.random() < 0.5:
                client.drain()
    delivered = 0
    for client in clients:
        assert client in filtered
        assert retain < 1 << 30 or not client.refused
        check(client, capture)
        delivered += len(client.received)
    return used, delivered


@pytest.mark.parametrize("kind", ["int", "product"])
@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_no_partial_epochs_holes_or_duplicates(kind: str, partitions: int) -> None:
    used = delivered = 0
    seed = 0
    while used < INSTANTS:
        u, d = run_stream(kind, partitions, seed * 10 + partitions, 200)
        used += u
        delivered += d
        seed += 1
    assert delivered > INSTANTS // 10  # the subscribers did see epochs, not only empty runs


def test_latent_join_skips_active_epochs_then_gets_everything() -> None:
    """The seed's example: completed 0..2, active 3 and 5 at joining: epochs up to 5 are
    dropped (no hole at 5 after delivering 4), epoch 6 on arrive whole."""
    log = PartitionLog()
    for t in (0, 1, 2, 3, 5):
        log.data(t, wire.frame(wire.DATA, {"time": t}, f"a{t}".encode()))
    log.advance([3])
    client = Client([log], "s", "latent")
    client.snapshot(0)
    client.filter_all()
    for t in (3, 4, 5, 6):
        log.data(t, wire.frame(wire.DATA, {"time": t}, f"b{t}".encode()))
    log.advance([7])
    client.drain()
    assert [t for t, _ in client.received] == [6]
    assert client.received[0][1] == [b"b6"]


def test_resume_refused_when_retention_let_the_epoch_go() -> None:
    log = PartitionLog(retain_bytes=0)
    client = Client([log], "s", "earliest")
    client.snapshot(0)
    client.filter_all()
    log.data(0, wire.frame(wire.DATA, {"time": 0}, b"x"))
    log.advance([1])
    client.drain()
    client.disconnect(0)
    log.data(1, wire.frame(wire.DATA, {"time": 1}, b"y"))
    log.advance([2])  # epoch 1 complete and, with no retention, let go
    client.resume(0)
    assert client.refused


def test_slow_subscriber_is_disconnected_not_waited_for() -> None:
    dropped = []
    log = PartitionLog(max_queue=1000, on_overflow=dropped.append)
    client = Client([log], "s", "latent")
    client.snapshot(0)
    client.filter_all()
    for t in range(100):
        log.data(t, wire.frame(wire.DATA, {"time": t}, b"z" * 100))
    assert len(dropped) == 1 and dropped[0].overflowed and dropped[0].closed
    assert log.subscribers == []  or all(s.closed for s in log.subscribers)
