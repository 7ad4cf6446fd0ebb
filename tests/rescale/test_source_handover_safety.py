"""Progress safety of re-splitting sources while workers join and leave (``tokenflow.resplit``,
``tokenflow.io.handover``), at random points of a run on a manual fabric.

One thread drives up to ``SLOTS`` workers on a FIFO ``ManualFabric`` (messages wait until the
test delivers them, each connection in order).  Each iteration steps a random worker, delivers
a random burst of messages, or advances the membership protocol by one action; joins and
leaves (a join only while the job's dataflows run) each re-split the source as
``move_sources`` does: ``fence`` to every worker of both
rosters, the plan from their replies (``tokenflow.resplit.plan``), the lends of source tokens
to joined workers, ``resplit``, ``applied?`` / ``release``, then ``resplit?``.  Any worker of the
roster may leave (its splits go to the others first), not only joined ones.

The dataflow: a replayable source over 8 splits of a table with times ``0..EPOCHS-1`` (a few
rows per read, so the protocol falls between reads) -> per-epoch row counts on each worker,
emitted when the worker's frontier passes the epoch; and the rows broadcast to every worker
of the roster (messages between workers behind frontiers would be caught there).

SAFETY: the runtime raises ``ProgressSafetyError`` for a message behind its frontier; every
row id is emitted by exactly one worker, and the per-epoch counts (each final when emitted)
add up to the table's rows of that epoch.  LIVENESS: once the plan is done, rounds of "deliver
everything, step every worker" end every worker's dataflow.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict, deque
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_membership_safety import FifoFabric, Link

from tokenflow.dataflow.operators.generic import unary_frontier
from tokenflow.io.sources import replayable_source, table_splits
from tokenflow.membership import MembershipAgent
from tokenflow.resplit import plan
from tokenflow.state.bins import RoutingTable
from tokenflow.worker import Worker

SLOTS = 5
FEEDERS = 2
EPOCHS = 80
ROWS = 2400
SPLITS = 8
SEEDS = 30
LIVENESS_ROUNDS = 3000


def table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({"id": np.arange(ROWS), "t": np.sort(rng.integers(0, EPOCHS, ROWS))})


def build(worker: Worker) -> dict[str, Any]:
    handles: dict[str, Any] = {}

    def dataflow(scope: Any) -> None:
        rows, handles["source"] = replayable_source(scope, "Rows", table_splits(table(), SPLITS,
                                                                                time="t"),
                                                    "t", max_rows=1)

        def per_epoch(cap: Any, info: Any) -> Any:
            cap.drop()
            pending: dict[int, tuple[Any, int]] = {}

            def logic(inp: Any, out: Any) -> None:
                for ref, batch in inp:
                    token, n = pending.get(ref.time, (None, 0))
                    pending[ref.time] = (token or ref.retain(), n + batch.num_rows)
                for t in sorted(pending):
                    if not inp.frontier.less_equal(t):
                        token, n = pending.pop(t)
                        with out.session(token) as session:
                            session.give((info.worker_index, n))
                        token.drop()

            return logic

        handles["counts"] = unary_frontier(rows, "pipeline", "PerEpoch", per_epoch).capture()
        handles["ids"] = rows.map_batch(lambda b: b.column("id").to_pylist()).capture()
        handles["broadcast"] = rows.map_batch(lambda b: [b.num_rows]).broadcast().probe()

    worker.dataflow(dataflow)
    return handles


class Job:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.fabric = FifoFabric(SLOTS)
        self.workers: dict[int, Worker] = {}
        self.agents: dict[int, MembershipAgent] = {}
        self.links: dict[int, Link] = {}
        self.handles: dict[int, dict[str, Any]] = {}
        self.roster = list(range(FEEDERS))
        self.next_slot = FEEDERS
        self.actions: deque[Any] = deque()
        self.commands: dict[int, deque[dict[str, Any]]] = defaultdict(deque)
        self.resplits = 0
        self.moved = 0  # splits the re-splits moved
        for i in range(FEEDERS):
            self.start(i, list(range(FEEDERS)), joining=False)

    def start(self, i: int, roster: list[int], joining: bool) -> None:
        worker = Worker(self.fabric.allocator(i), RoutingTable.even(FEEDERS, 32), roster=roster,
                        joining=joining)
        self.links[i] = Link()
        self.agents[i] = MembershipAgent(self.links[i])
        worker.on_step.append(self.hook(i))
        self.workers[i] = worker
        self.handles[i] = build(worker)

    def hook(self, i: int) -> Any:
        def hook(worker: Worker) -> None:
            while self.commands[i]:
                self.agents[i].handle(worker, self.commands[i].popleft())
            self.agents[i].poll(worker)
        return hook

    def replies(self, i: int, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.links[i].replies if r["kind"] == kind]

    def send(self, w: int, message: dict[str, Any]) -> bool:
        self.commands[w].append(message)
        return True

    def count(self, workers: list[int], kind: str) -> dict[int, int]:
        return {w: len(self.replies(w, kind)) for w in workers}

    def wait(self, before: dict[int, int], kind: str) -> Any:
        return lambda: all(len(self.replies(w, kind)) > n for w, n in before.items())

    # -- the protocol as small actions ------------------------------------------------------

    def plan_resplit(self, old: list[int], new: list[int]) -> list[Any]:
        everyone = sorted(set(old) | set(new))
        state: dict[str, Any] = {}

        def fence() -> bool:
            state["fenced"] = self.count(everyone, "fenced")
            for w in everyone:
                self.send(w, {"kind": "fence", "margin": self.rng.randint(0, 3)})
            return True

        def fenced() -> bool:
            if not self.wait(state["fenced"], "fenced")():
                return False
            replies = {w: self.replies(w, "fenced")[-1] for w in everyone}
            assert not any(r.get("error") for r in replies.values()), replies
            state["plans"], lends, report = plan(replies, new)
            self.moved += sum(len(move.moves) for move in report)
            state["lends"] = sorted(lends.items())
            state["lent"] = {}
            return True

        def lend() -> bool:
            for (lender, joiner), keys in state["lends"]:
                state["lent"][lender, joiner] = len(self.replies(lender, "lent"))
                self.send(lender, {"kind": "lend", "joiner": joiner, "keys": keys})
            return True

        def lent() -> bool:
            return all(len(self.replies(lender, "lent")) > n
                       for (lender, _), n in state["lent"].items())

        def resplit() -> bool:
            for w in everyone:
                self.send(w, {"kind": "resplit", "sources": state["plans"][w]})
            state["applied"] = self.count(everyone, "applied")
            for (lender, _), _ in state["lends"]:
                floors = self.replies(lender, "lent")[-1]["floors"]
                for w in everyone:
                    self.send(w, {"kind": "applied?", "lender": lender, "floors": floors})
            return True

        def applied() -> bool:
            need = len(state["lends"])
            return all(len(self.replies(w, "applied")) >= n + need
                       for w, n in state["applied"].items())

        def release() -> bool:
            state["released"] = self.count([j for (_, j), _ in state["lends"]], "released")
            for (_, joiner), _ in state["lends"]:
                self.send(joiner, {"kind": "release"})
            return True

        def released() -> bool:
            return self.wait(state["released"], "released")()

        def ask() -> bool:
            state["done"] = self.count(everyone, "resplit_done")
            for w in everyone:
                self.send(w, {"kind": "resplit?"})
            return True

        def done() -> bool:
            if self.wait(state["done"], "resplit_done")():
                self.resplits += 1
                return True
            return False

        return [fence, fenced, lend, lent, resplit, applied, release, released, ask, done]

    def plan_join(self) -> None:
        if not all(self.workers[w].dataflows_running for w in self.roster):
            return  # the job is ending: nothing to join (its dataflows are gone)
        k = self.next_slot
        self.next_slot += 1
        members = list(self.roster)

        def begin() -> bool:
            self.start(k, [*members, k], joining=True)
            return True

        def admitted() -> bool:
            return all(any(r["joiner"] == k for r in self.replies(w, "admitted"))
                       for w in members)

        def bootstrap() -> bool:
            floors = [[df, w, seq] for w in members for r in self.replies(w, "admitted")
                      if r["joiner"] == k for df, seq in r["floors"]]
            return self.send(members[0], {"kind": "bootstrap", "joiner": k, "floors": floors})

        def joined() -> bool:
            if self.replies(k, "joined"):
                self.roster = sorted([*self.roster, k])
                return True
            return False

        self.actions.extend([begin, lambda: bool(self.replies(k, "hello")),
                             *(lambda w=w: self.send(w, {"kind": "admit", "joiner": k})
                               for w in members),
                             admitted, bootstrap, joined,
                             *self.plan_resplit(members, [*members, k])])

    def plan_leave(self) -> None:
        if len(self.roster) <= 1:
            return
        k = self.rng.choice(self.roster)
        rest = [w for w in self.roster if w != k]

        def forgotten() -> bool:
            if all(any(r["leaver"] == k for r in self.replies(w, "forgotten")) for w in rest):
                self.roster = rest
                return True
            return False

        self.actions.extend([*self.plan_resplit(list(self.roster), rest),
                             lambda: self.send(k, {"kind": "leave"}),
                             lambda: bool(self.replies(k, "ready")),
                             *(lambda w=w: self.send(w, {"kind": "dismiss", "leaver": k})
                               for w in rest),
                             lambda: bool(self.replies(k, "left")),
                             *(lambda w=w: self.send(w, {"kind": "forget", "leaver": k})
                               for w in rest),
                             forgotten])

    # -- driving ---------------------------------------------------------------------------

    def running(self) -> list[int]:
        return [i for i, w in self.workers.items() if not w.left]

    def run(self, iterations: int) -> None:
        rng = self.rng
        joins = rng.randint(1, SLOTS - FEEDERS)
        plan_ = ["join"] * joins + ["leave"] * rng.randint(1, joins)
        rng.shuffle(plan_)
        for _ in range(iterations):
            r = rng.random()
            if r < 0.03 and plan_ and not self.actions:
                (self.plan_join if plan_.pop() == "join" else self.plan_leave)()
            elif r < 0.30 and self.actions:
                if self.actions[0]():
                    self.actions.popleft()
            elif r < 0.65:
                self.workers[rng.choice(self.running())].step()
            else:
                self.fabric.deliver_random(rng)
        for _ in range(5000):
            if not self.actions:
                break
            if self.actions[0]():
                self.actions.popleft()
            self.fabric.deliver_random(rng)
            self.workers[rng.choice(self.running())].step()
            if rng.random() < 0.05:
                self.fabric.deliver_everything()
        assert not self.actions, "the protocol did not complete"
        for _ in range(LIVENESS_ROUNDS):
            self.fabric.deliver_everything()
            if not any([self.workers[i].step() for i in self.running()]):
                return
        raise AssertionError(f"workers {self.running()} still running")


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_resplits_read_every_row_once_and_are_progress_safe(seed: int) -> None:
    job = Job(random.Random(seed))
    job.run(1200)
    assert job.resplits >= 2 and len(job.workers) > FEEDERS  # a join and a leave re-split
    assert job.moved > 0  # splits changed hands while they were being read
    ids: Counter[int] = Counter()
    counted: Counter[int] = Counter()
    emissions: Counter[tuple[int, int]] = Counter()
    for handles in job.handles.values():
        for records in handles["ids"].by_time().values():
            ids.update(records)
        for t, records in handles["counts"].by_time().items():
            for w, n in records:
                counted[t] += n
                emissions[w, t] += 1
    assert ids == Counter(range(ROWS))  # every row once
    expected = Counter(table().column("t").to_pylist())
    assert counted == expected  # each per-epoch count was final when its frontier passed
    assert set(emissions.values()) == {1}
