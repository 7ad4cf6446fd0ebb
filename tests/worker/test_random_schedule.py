"""Randomized schedules: 2-4 workers on a ``ManualFabric``, driven from one thread.

Every data and progress message between workers is held by the fabric until the driver
delivers it; each iteration the driver either feeds an input (send / ``advance_to`` / close),
steps a random worker, or delivers a random pending message (FIFO per link only).  Three
dataflows run side by side on the same workers:

(a) input -> map -> exchange -> per-epoch keyed count (``unary_frontier``) -> capture, and the
    input broadcast to every worker;
(b) an iterative loop: values enter, are exchanged inside the loop and halved until 0, fed back
    through ``inner.feedback(1)``; what leaves is counted per epoch;
(c) a ``binary_frontier`` equi-join, per epoch, of two exchanged inputs.

SAFETY: check operators on the streams assert, for every received message, that the input
frontier is still <= its time (the runtime raises ``ProgressSafetyError`` on the same condition,
which fails the test too), that frontiers never move backwards, and that the records a worker
had at a time when its frontier passed that time are all it ever gets there.  Per-epoch outputs,
emitted when the frontier passed the epoch, must equal totals computed here from the input plan.
LIVENESS: after the inputs close, rounds of "deliver everything, step every worker" make every
``step()`` return False within ``LIVENESS_ROUNDS`` and every capture's frontier empty.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from tokenflow.comm.manual import ManualFabric
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.operators.builder import (
    OperatorInput,
    OperatorOutput,
    ProgressSafetyError,
)
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import OperatorInfo, binary_frontier, unary_frontier
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.stream import Stream
from tokenflow.order import Product
from tokenflow.order.partial_order import less_equal
from tokenflow.progress.broadcast import Progcaster
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.worker import Worker

SEEDS = 192
SEED_CHUNKS = 8
B_MAX = 200
"""Loop inputs are below ``B_MAX``, so a value is halved at most ``B_MAX.bit_length()`` times."""
LIVENESS_ROUNDS = 2 * B_MAX.bit_length() + 8
"""Each loop iteration costs at most two rounds (the exchange inside the loop needs a delivery,
the feedback edge goes back to a lower operator index, scheduled at the next step), plus a few
rounds for progress to settle."""
KEYS_A = 5
KEYS_B = 3
KEYS_C = 4

# -- instrumentation ---------------------------------------------------------------------------


class CheckLog:
    """What one worker's check operator saw on one stream."""

    def __init__(self, name: str, min_time: Any) -> None:
        self.name = name
        self.worker = -1
        self.seen: dict[Any, list[Any]] = defaultdict(list)
        self.passed: dict[Any, list[Any]] = {}  # time -> sorted records when the frontier passed
        self.frontier: list[Any] = [min_time]
        self.messages = 0


def check(stream: Stream, name: str) -> tuple[Stream, CheckLog]:
    """Pass ``stream`` through, asserting the safety properties on every message."""
    log = CheckLog(name, stream.scope.min_time)

    def constructor(cap: Capability, info: OperatorInfo) -> Callable[..., None]:
        cap.drop()
        log.worker = info.worker_index

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, batch in inp:
                t = ref.time
                if not inp.frontier.less_equal(t):
                    raise AssertionError(
                        f"{name} @ worker {log.worker}: message at {t!r} arrived behind the "
                        f"frontier {inp.frontier.frontier()!r}"
                    )
                if t in log.passed:
                    raise AssertionError(
                        f"{name} @ worker {log.worker}: message at {t!r} after the frontier "
                        "had passed it"
                    )
                log.messages += 1
                log.seen[t].extend(batch)
                out.give_batch(ref, list(batch))
            new = inp.frontier.frontier()
            old = log.frontier
            for n in new:
                if not any(less_equal(o, n) for o in old):
                    raise AssertionError(
                        f"{name} @ worker {log.worker}: frontier went back from {old!r} "
                        f"to {new!r}"
                    )
            log.frontier = new
            for t, records in log.seen.items():
                if t not in log.passed and not inp.frontier.less_equal(t):
                    log.passed[t] = sorted(records)

        return logic

    return unary_frontier(stream, "pipeline", f"Check[{name}]", constructor), log


def keyed_count(keyed: Stream, name: str) -> Stream:
    """Per epoch and key of ``(key, int)`` records (exchanged by key), emit ``(key, count,
    sum)`` once the frontier has passed the epoch."""

    def constructor(cap: Capability, info: OperatorInfo) -> Callable[..., None]:
        cap.drop()
        pending: dict[Any, tuple[Capability, dict[int, list[int]]]] = {}
        emitted: set[Any] = set()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, batch in inp:
                t = ref.time
                if t in emitted:
                    raise AssertionError(f"{name}: data at {t!r} after its count was emitted")
                entry = pending.get(t)
                if entry is None:
                    entry = pending[t] = (ref.retain(), {})
                for k, x in batch:
                    agg = entry[1].setdefault(k, [0, 0])
                    agg[0] += 1
                    agg[1] += x
            for t in sorted(pending):
                if not inp.frontier.less_equal(t):
                    held, aggs = pending.pop(t)
                    emitted.add(t)
                    with out.session(held) as session:
                        session.give_iterator(sorted((k, c, s) for k, (c, s) in aggs.items()))
                    held.drop()

        return logic

    return unary_frontier(keyed, "pipeline", name, constructor)


def join_constructor(cap: Capability, info: OperatorInfo) -> Callable[..., None]:
    """Per-epoch equi-join of ``(key, value)`` records, emitted once both frontiers passed."""
    cap.drop()
    state: dict[Any, tuple[Capability, dict[int, list[Any]], dict[int, list[Any]]]] = {}
    emitted: set[Any] = set()

    def logic(left: OperatorInput, right: OperatorInput, out: OperatorOutput) -> None:
        for side, inp in ((1, left), (2, right)):
            for ref, batch in inp:
                t = ref.time
                if t in emitted:
                    raise AssertionError(f"Join: data at {t!r} after the epoch was joined")
                entry = state.get(t)
                if entry is None:
                    entry = state[t] = (ref.retain(), {}, {})
                records = entry[1] if side == 1 else entry[2]
                for k, v in batch:
                    records.setdefault(k, []).append(v)
        for t in sorted(state):
            if not left.frontier.less_equal(t) and not right.frontier.less_equal(t):
                held, lefts, rights = state.pop(t)
                emitted.add(t)
                joined = [(k, lv, rv) for k, lvs in lefts.items() for lv in lvs
                          for rv in rights.get(k, ())]
                if joined:
                    out.give_batch(held, sorted(joined))
                held.drop()

    return logic


# -- the dataflows -----------------------------------------------------------------------------


class Handles:
    """One worker's inputs, check logs and captures."""

    def __init__(self) -> None:
        self.inputs: dict[str, InputHandle] = {}
        self.logs: dict[str, CheckLog] = {}
        self.captures: dict[str, Capture] = {}


def build_all(worker: Worker) -> Handles:
    h = Handles()

    def build_a(scope: Scope) -> None:
        inp, stream = scope.new_input("A")
        h.inputs["a"] = inp
        mapped = stream.map(lambda x: (x % KEYS_A, x)).exchange(lambda kv: kv[0])
        mapped, h.logs["a.exchanged"] = check(mapped, "a.exchanged")
        _, h.logs["a.broadcast"] = check(stream.broadcast(), "a.broadcast")
        counted = keyed_count(mapped, "CountA")
        counted, h.logs["a.counts"] = check(counted, "a.counts")
        h.captures["a"] = counted.capture()

    def build_b(scope: Scope) -> None:
        inp, stream = scope.new_input("B")
        h.inputs["b"] = inp

        def loop(inner: Scope) -> Stream:
            handle, fed_back = inner.feedback(1)
            body = stream.enter(inner).concat(fed_back).exchange(lambda v: v)
            body, h.logs["b.loop"] = check(body, "b.loop")
            body.map(lambda v: v // 2).filter(lambda v: v > 0).connect_loop(handle)
            return body.leave()

        left = scope.iterative(loop)
        left, h.logs["b.left"] = check(left, "b.left")
        keyed = left.map(lambda x: (x % KEYS_B, x)).exchange(lambda kv: kv[0])
        counted, h.logs["b.counts"] = check(keyed_count(keyed, "CountB"), "b.counts")
        h.captures["b"] = counted.capture()

    def build_c(scope: Scope) -> None:
        left_in, left = scope.new_input("CL")
        right_in, right = scope.new_input("CR")
        h.inputs["cl"] = left_in
        h.inputs["cr"] = right_in
        left, h.logs["c.left"] = check(left.exchange(lambda kv: kv[0]), "c.left")
        right, h.logs["c.right"] = check(right.exchange(lambda kv: kv[0]), "c.right")
        joined = binary_frontier(left, right, "pipeline", "pipeline", "Join", join_constructor)
        joined, h.logs["c.joined"] = check(joined, "c.joined")
        h.captures["c"] = joined.capture()

    worker.dataflow(build_a, "A")
    worker.dataflow(build_b, "B")
    worker.dataflow(build_c, "C")
    return h


# -- input plans and expected results ----------------------------------------------------------

Action = tuple[str, Any]


def make_plan(rng: random.Random, make_record: Callable[[], Any]) -> tuple[list[Action],
                                                                           list[tuple[int, Any]]]:
    """Random actions for one input handle and the ``(epoch, record)`` pairs they send."""
    actions: list[Action] = []
    sent: list[tuple[int, Any]] = []
    epoch = 0
    for _ in range(rng.randint(1, 4)):
        for _ in range(rng.randint(0, 5)):
            record = make_record()
            actions.append(("send", record))
            sent.append((epoch, record))
        epoch += rng.randint(1, 2)
        actions.append(("advance", epoch))
    for _ in range(rng.randint(0, 2)):
        record = make_record()
        actions.append(("send", record))
        sent.append((epoch, record))
    actions.append(("close", None))
    return actions, sent


def by_epoch(sent: list[tuple[int, Any]]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for epoch, record in sent:
        out[epoch].append(record)
    return out


def expected_counts(values: dict[int, list[int]], modulus: int) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for epoch, xs in values.items():
        aggs: dict[int, list[int]] = {}
        for x in xs:
            agg = aggs.setdefault(x % modulus, [0, 0])
            agg[0] += 1
            agg[1] += x
        if aggs:
            out[epoch] = sorted((k, c, s) for k, (c, s) in aggs.items())
    return out


def halvings(v: int) -> list[int]:
    """``v, v // 2, ...`` while positive: what the loop sees of an input ``v > 0``."""
    out = []
    while v > 0:
        out.append(v)
        v //= 2
    return out


def union_by_time(parts: list[dict[Any, list[Any]]]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for part in parts:
        for t, records in part.items():
            out[t].extend(records)
    return {t: sorted(records) for t, records in out.items() if records}


def sorted_dict(d: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    return {t: sorted(v) for t, v in d.items() if v}


# -- the driver --------------------------------------------------------------------------------


class Run:
    """One randomized execution; ``stats`` for the summary test."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.peers = rng.randint(2, 4)
        self.fabric = ManualFabric(self.peers)
        self.workers = [Worker(self.fabric.allocator(i)) for i in range(self.peers)]
        self.handles = [build_all(w) for w in self.workers]
        self.plans: list[tuple[InputHandle, list[Action]]] = []
        self.sent: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        makers: dict[str, Callable[[], Any]] = {
            "a": lambda: rng.randrange(1000),
            "b": lambda: rng.randrange(1, B_MAX),
            "cl": lambda: (rng.randrange(KEYS_C), rng.randrange(100)),
            "cr": lambda: (rng.randrange(KEYS_C), rng.randrange(100, 200)),
        }
        for h in self.handles:
            for name, maker in makers.items():
                actions, sent = make_plan(rng, maker)
                self.plans.append((h.inputs[name], actions))
                self.sent[name].extend(sent)
        self.liveness_rounds = -1
        self.steps = 0

    def feed(self) -> None:
        """Run the next action of a random input that has actions left."""
        i = self.rng.randrange(len(self.plans))
        handle, actions = self.plans[i]
        kind, arg = actions.pop(0)
        if kind == "send":
            handle.send(arg)
        elif kind == "advance":
            handle.advance_to(arg)
        else:
            handle.close()
        if not actions:
            self.plans.pop(i)

    def step_random(self) -> None:
        self.rng.choice(self.workers).step()
        self.steps += 1

    def run(self) -> None:
        rng = self.rng
        fabric = self.fabric
        p_input = rng.uniform(0.1, 0.4)
        p_deliver = rng.uniform(0.2, 0.8)
        while self.plans:
            r = rng.random()
            if r < p_input:
                self.feed()
            elif rng.random() < p_deliver and fabric.deliver_one(rng):
                pass
            else:
                self.step_random()
        for _ in range(rng.randrange(150)):
            if rng.random() < p_deliver and fabric.deliver_one(rng):
                continue
            self.step_random()
        for round_ in range(LIVENESS_ROUNDS):
            fabric.deliver_all()
            running = [w.step() for w in self.workers]
            if not any(running) and fabric.pending_count() == 0:
                self.liveness_rounds = round_ + 1
                break
        else:
            raise AssertionError(
                f"seed {self.seed}: still running after {LIVENESS_ROUNDS} liveness rounds: "
                f"dataflows per worker {[w.dataflows_running for w in self.workers]}, "
                f"{fabric.pending_count()} messages pending"
            )

    def check_results(self) -> None:
        handles = self.handles
        seed = self.seed
        # Liveness: every worker is done, every stream's frontier is empty.
        for w in self.workers:
            assert w.dataflows_running == 0, seed
            assert w.step() is False, seed
        for h in handles:
            for name, cap in h.captures.items():
                assert cap.done, f"seed {seed}: capture {name} frontier {cap.frontiers[-1:]}"
            for name, log in h.logs.items():
                assert log.frontier == [], f"seed {seed}: {name} frontier {log.frontier}"
                # Finality: what a worker had at a time when its frontier passed it is all it got.
                assert set(log.passed) == set(log.seen), (seed, name)
                for t, records in log.seen.items():
                    assert log.passed[t] == sorted(records), (seed, name, t)

        def seen(name: str) -> dict[Any, list[Any]]:
            return union_by_time([h.logs[name].seen for h in handles])

        def captured(name: str) -> dict[Any, list[Any]]:
            return union_by_time([h.captures[name].by_time() for h in handles])

        # (a) every record once, routed by key; counts final and exact.
        a_in = by_epoch(self.sent["a"])
        assert seen("a.exchanged") == sorted_dict(
            {e: [(x % KEYS_A, x) for x in xs] for e, xs in a_in.items()}), seed
        for h in handles:  # exchange: a key lives on one worker only
            for records in h.logs["a.exchanged"].seen.values():
                for other in handles:
                    if other is not h:
                        keys = {k for rs in other.logs["a.exchanged"].seen.values() for k, _ in rs}
                        assert not keys & {k for k, _ in records}, seed
        assert captured("a") == expected_counts(a_in, KEYS_A), seed
        for h in handles:  # broadcast: every worker sees every record
            assert sorted_dict(h.logs["a.broadcast"].seen) == sorted_dict(a_in), seed
        assert seen("a.counts") == captured("a"), seed
        # (b) the loop: iteration i of epoch e carries v >> i for every input v of epoch e.
        b_in = by_epoch(self.sent["b"])
        expected_loop: dict[Any, list[int]] = defaultdict(list)
        expected_left: dict[int, list[int]] = defaultdict(list)
        for e, vs in b_in.items():
            for v in vs:
                for i, x in enumerate(halvings(v)):
                    expected_loop[Product(e, i)].append(x)
                    expected_left[e].append(x)
        assert seen("b.loop") == sorted_dict(expected_loop), seed
        assert seen("b.left") == sorted_dict(expected_left), seed
        assert captured("b") == expected_counts(expected_left, KEYS_B), seed
        # (c) the per-epoch join.
        left = by_epoch(self.sent["cl"])
        right = by_epoch(self.sent["cr"])
        expected_join = {}
        for e in left:
            rows = [(k, lv, rv) for k, lv in left[e] for k2, rv in right.get(e, []) if k == k2]
            if rows:
                expected_join[e] = sorted(rows)
        assert seen("c.left") == sorted_dict(left), seed
        assert seen("c.right") == sorted_dict(right), seed
        assert captured("c") == expected_join, seed


def run_seed(seed: int) -> Run:
    run = Run(seed)
    run.run()
    run.check_results()
    return run


@pytest.mark.parametrize("chunk", range(SEED_CHUNKS))
def test_random_schedules(chunk: int) -> None:
    """SEEDS seeds in SEED_CHUNKS chunks: safety, finality and liveness for each."""
    runs = [run_seed(seed) for seed in range(chunk, SEEDS, SEED_CHUNKS)]
    assert len(runs) == SEEDS // SEED_CHUNKS
    # The schedules really are varied: worker counts and message interleavings differ.
    assert {r.peers for r in runs} >= {2, 3, 4}
    assert all(r.fabric.delivered_count > 0 for r in runs)
    assert all(1 <= r.liveness_rounds <= LIVENESS_ROUNDS for r in runs)


def test_manual_fabric_holds_messages_until_delivered() -> None:
    """Data does not move between workers before the driver delivers it."""
    fabric = ManualFabric(2)
    workers = [Worker(fabric.allocator(i)) for i in range(2)]
    handles = [build_all(w) for w in workers]
    for h in handles:
        h.inputs["a"].send(KEYS_A)  # key 0
        h.inputs["a"].advance_to(1)
    for _ in range(5):
        for w in workers:
            w.step()
    assert all(not h.captures["a"].events for h in handles)
    assert fabric.pending_count() > 0
    for _ in range(LIVENESS_ROUNDS):
        fabric.deliver_all()
        for w in workers:
            w.step()
    counts = union_by_time([h.captures["a"].by_time() for h in handles])
    assert counts == {0: [(0, 2, 2 * KEYS_A)]}


def test_manual_fabric_preserves_link_fifo() -> None:
    """deliver_one never reorders the messages of one (channel, sender, receiver) link."""
    fabric = ManualFabric(3)
    allocators = [fabric.allocator(i) for i in range(3)]
    pushers = {i: allocators[i].allocate(7)[0] for i in range(3)}
    pullers = {i: allocators[i].allocate(7)[1] for i in range(3)}
    for n in range(50):
        for sender in range(3):
            for receiver in range(3):
                pushers[sender][receiver].push((sender, n))
    rng = random.Random(5)
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    orders = set()
    while fabric.deliver_one(rng):
        for receiver in range(3):
            while (m := pullers[receiver].pull()) is not None:
                got[receiver].append(m)
    for receiver in range(3):
        assert allocators[receiver].receive() == {7}
        for sender in range(3):
            assert [n for s, n in got[receiver] if s == sender] == list(range(50))
        orders.add(tuple(s for s, _ in got[receiver]))
    assert len(orders) == 3  # senders interleave differently at each receiver
    assert fabric.pending_count() == 0 and fabric.delivered_count == 450


# -- the test can fail: a runtime that breaks the progress safety rule is caught ---------------


def _unsafe_send(self: Progcaster, changes: ChangeBatch[Any]) -> None:
    """Send releases (negative updates) in a batch *before* the increments that go with them:
    the violation of "the +1 for produced messages travels with or before the release"."""
    updates = changes.drain()
    for part in ([u for u in updates if u[1] < 0], [u for u in updates if u[1] > 0]):
        if part:
            message = (self.index, self.sequence, part)
            self.sequence += 1
            for pusher in self.pushers:
                pusher.push(message)


def _unchecked_next(self: OperatorInput) -> tuple[Any, Any] | None:
    """``OperatorInput.next`` without the runtime's ProgressSafetyError check."""
    from tokenflow.dataflow.capability import CapabilityRef

    message = self._puller.pull()
    if message is None:
        return None
    time, batch = message
    self.consumed.update(time, len(batch))
    ref = CapabilityRef(time, self._internals, self._summaries, self._op.name)
    self._refs.append(ref)
    return ref, batch


@pytest.mark.parametrize("runtime_check", [True, False])
def test_broken_progress_order_is_detected(monkeypatch: pytest.MonkeyPatch,
                                           runtime_check: bool) -> None:
    """With releases sent ahead of increments, seeds must fail: some through the runtime's
    ProgressSafetyError, or (runtime check disabled) through this test's per-message check."""
    monkeypatch.setattr(Progcaster, "send", _unsafe_send)
    if not runtime_check:
        monkeypatch.setattr(OperatorInput, "next", _unchecked_next)
    wanted = "ProgressSafetyError" if runtime_check else "arrived behind the frontier"
    outcomes: list[str] = []
    for seed in range(40):
        try:
            run_seed(seed)
            outcomes.append("ok")
        except (ProgressSafetyError, AssertionError, RuntimeError) as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
            if wanted in outcomes[-1]:
                break
    assert any(wanted in o for o in outcomes), outcomes
