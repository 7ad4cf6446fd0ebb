"""Progress safety with workers joining and leaving at random points (issue 16's property).

One thread drives up to ``SLOTS`` workers on a ``ManualFabric`` whose messages wait until the
test delivers them, in a random order that keeps each sender -> receiver connection FIFO (as a
TCP connection or the thread fabric does).  Each iteration feeds the input of a worker that
started with the job, steps a random worker, delivers a random message, or advances the
membership protocol by one action: a worker starts to join (it builds the dataflows and says
hello), one worker of the roster admits it, the bootstrap server is asked to serve it, worker 0
is asked to lend the joined worker its input token (then every worker is asked whether it
applied worker 0's batches that count it, and the joiner is let release it; it feeds its own
words from the lent epoch), Megaphone is asked to spread the bins over a roster, a worker is
asked to leave, one other worker dismisses it.  Every command is carried out by the
``MembershipAgent`` between two of its worker's steps, as the control plane does.

The dataflow: words -> Megaphone running count (bins move to joined workers and back) ->
capture; the words broadcast to every worker of the roster (copies follow the roster) and
counted per epoch when the frontier passes it; the counts exchanged by the job's static table.

SAFETY: the runtime raises ``ProgressSafetyError`` for a message that arrives behind its
input's frontier, and a per-epoch count emitted when the frontier passed the epoch must be
final (the test compares every emitted count with the input plan); the running counts must
be a plain ``Counter``'s.  LIVENESS: once the membership actions are done and the inputs
closed, rounds of "deliver everything, step every worker" end every worker's dataflow.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict, deque
from typing import Any

import pytest
from running_counts import running_counts

from tokenflow.comm.manual import ManualFabric
from tokenflow.dataflow.operators.generic import unary_frontier
from tokenflow.membership import MembershipAgent
from tokenflow.rescale import megaphone_fold
from tokenflow.state.bins import RoutingTable
from tokenflow.worker import Worker

SLOTS = 5
FEEDERS = 2
EPOCHS = 400
"""At most this many epochs per feeder; inputs close once the membership plan is done."""
JOINER_EPOCHS = 30
"""Epochs a joined worker with a lent input feeds (from the lent epoch)."""
BINS = 32
SEEDS = 40
LIVENESS_ROUNDS = 60


class FifoFabric(ManualFabric):
    """A ``ManualFabric`` delivering each connection's messages in the order they were sent
    (across channels), as real transports do."""

    def __init__(self, peers: int) -> None:
        super().__init__(peers)
        self.order: dict[tuple[int, int], deque[tuple[int, int, int]]] = defaultdict(deque)

    def push(self, identifier: int, sender: int, receiver: int, message: Any) -> None:
        super().push(identifier, sender, receiver, message)
        self.order[(sender, receiver)].append((identifier, sender, receiver))

    def deliver_random(self, rng: random.Random) -> bool:
        pairs = [p for p, q in self.order.items() if q]
        if not pairs:
            return False
        pair = self.order[rng.choice(pairs)]
        for _ in range(min(len(pair), rng.randint(1, 8))):  # a burst, as a socket read
            assert self.deliver_link(*pair.popleft())
        return True

    def deliver_everything(self) -> None:
        for q in self.order.values():
            while q:
                assert self.deliver_link(*q.popleft())


class Link:
    """A worker's control link: replies collected for the test's driver."""

    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.replies.append(dict(message))


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 7919 + epoch)
    return [f"w{rng.randrange(12)}" for _ in range(rng.randrange(0, 6))]


def build(worker: Worker) -> dict[str, Any]:
    handles: dict[str, Any] = {}

    def dataflow(scope: Any) -> None:
        inp, stream = scope.new_input()
        handles["input"] = inp
        mega = megaphone_fold(stream.map(lambda w: (w, 1)),
                              lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
        handles["mega"] = mega
        handles["running"] = mega.stream.capture()
        # a second migrating fold fed by the first: on a joined worker its router routes the
        # first fold's output, so it must know the steps sent before it joined
        mega2 = megaphone_fold(mega.stream.map(lambda r: (r[1] % 5, 1)),
                               lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]),
                               name="Megaphone2")
        handles["mega2"] = mega2
        handles["chained"] = mega2.stream.capture()

        def per_epoch(cap: Any, info: Any) -> Any:
            cap.drop()
            pending: dict[int, tuple[Any, int]] = {}

            def logic(inp: Any, out: Any) -> None:
                for ref, batch in inp:
                    token, n = pending.get(ref.time, (None, 0))
                    pending[ref.time] = (token or ref.retain(), n + len(batch))
                for t in sorted(pending):
                    if not inp.frontier.less_equal(t):
                        token, n = pending.pop(t)
                        with out.session(token) as session:
                            session.give((info.worker_index, n))
                        token.drop()

            return logic

        counted = unary_frontier(stream.broadcast(), "pipeline", "PerEpoch", per_epoch)
        handles["per_epoch"] = counted.exchange(lambda r: r[0]).capture()

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
        self.epoch: dict[int, int] = dict.fromkeys(range(FEEDERS), 0)  # next epoch each feeds
        self.first: dict[int, int] = dict.fromkeys(range(FEEDERS), 0)  # first epoch each fed
        self.closed: dict[int, bool] = dict.fromkeys(range(FEEDERS), False)
        self.actions: deque[Any] = deque()
        self.commands: dict[int, deque[dict[str, Any]]] = defaultdict(deque)
        self.ever: list[int] = []  # every worker that ran
        for i in range(FEEDERS):
            self.start(i, list(range(FEEDERS)), joining=False)

    def start(self, i: int, roster: list[int], joining: bool, lent: bool = False) -> None:
        worker = Worker(self.fabric.allocator(i), RoutingTable.even(FEEDERS, BINS), roster=roster,
                        joining=joining)
        link = Link()
        agent = MembershipAgent(link)
        worker.on_step.append(self.agent_hook(i))
        self.workers[i], self.links[i], self.agents[i] = worker, link, agent
        self.handles[i] = build(worker)
        self.ever.append(i)
        if joining and not lent:
            self.handles[i]["input"].close()

    def agent_hook(self, i: int) -> Any:
        def hook(worker: Worker) -> None:
            while self.commands[i]:
                self.agents[i].handle(worker, self.commands[i].popleft())
            self.agents[i].poll(worker)
        return hook

    def step(self, i: int) -> bool:
        return self.workers[i].step()

    def replies(self, i: int, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.links[i].replies if r["kind"] == kind]

    # -- membership as a sequence of small actions, each waiting for what it needs ---------

    def plan_join(self) -> None:
        k = self.next_slot
        self.next_slot += 1
        members = list(self.roster)
        lent = self.rng.random() < 0.7

        def begin() -> bool:
            self.start(k, [*members, k], joining=True, lent=lent)
            if lent:
                self.closed[k] = False  # fed once its input holds the lent token
            return True

        def greeted() -> bool:
            return bool(self.replies(k, "hello"))

        admits = [self.admit(w, k) for w in members]

        def all_admitted() -> bool:
            return all(self.replies(w, "admitted") and
                       any(r["joiner"] == k for r in self.replies(w, "admitted"))
                       for w in members)

        def bootstrap() -> bool:
            floors = [[df, w, seq] for w in members for r in self.replies(w, "admitted")
                      if r["joiner"] == k for df, seq in r["floors"]]
            self.commands[members[0]].append({"kind": "bootstrap", "joiner": k,
                                              "floors": floors})
            return True

        def joined() -> bool:
            if self.replies(k, "joined"):
                self.roster = sorted([*self.roster, k])
                return True
            return False

        self.actions.extend([begin, greeted, *admits, all_admitted, bootstrap, joined,
                             *(self.plan_lend(k) if lent else []), self.rescale_to_roster])

    def plan_lend(self, k: int) -> list[Any]:
        """Worker 0 lends ``k`` its input token; ``k`` may release it once every other worker
        applied worker 0's batches up to the floors it reported."""
        asked: dict[int, int] = {}

        def ask() -> bool:
            self.commands[0].append({"kind": "lend", "joiner": k})
            return True

        def lent() -> bool:
            replies = [r for r in self.replies(0, "lent") if r["joiner"] == k]
            if not replies:
                return False
            for w in self.roster:  # the lender too: it applies its own batches as received
                asked[w] = len(self.replies(w, "applied")) + 1
                self.commands[w].append({"kind": "applied?", "lender": 0,
                                         "floors": replies[0]["floors"]})
            return True

        def applied() -> bool:
            return all(len(self.replies(w, "applied")) >= n for w, n in asked.items())

        def release() -> bool:
            self.commands[k].append({"kind": "release"})
            return True

        def released() -> bool:
            return bool(self.replies(k, "released"))

        return [ask, lent, applied, release, released]

    def admit(self, w: int, k: int) -> Any:
        def act() -> bool:
            self.commands[w].append({"kind": "admit", "joiner": k})
            return True
        return act

    def rescale_to_roster(self) -> bool:
        for name in ("mega", "mega2"):
            self.handles[0][name].controller.rescale_roster(list(self.roster))
        return True

    def plan_leave(self) -> None:
        if len(self.roster) <= FEEDERS:
            return
        k = self.roster[-1]
        rest = [w for w in self.roster if w != k]

        def move_away() -> bool:
            for name in ("mega", "mega2"):
                self.handles[0][name].controller.rescale_roster(rest)
            return True

        def ask() -> bool:
            self.feed(k, close=True)  # a worker holding an input token cannot leave
            self.commands[k].append({"kind": "leave"})
            return True

        def ready() -> bool:
            return bool(self.replies(k, "ready"))

        dismissals = [self.dismiss(w, k) for w in rest]

        def left() -> bool:
            return bool(self.replies(k, "left"))

        forgets = [self.forget(w, k) for w in rest]

        def forgotten() -> bool:
            if all(any(r["leaver"] == k for r in self.replies(w, "forgotten")) for w in rest):
                self.roster = rest
                return True
            return False

        self.actions.extend([move_away, ask, ready, *dismissals, left, *forgets, forgotten])

    def forget(self, w: int, k: int) -> Any:
        def act() -> bool:
            self.commands[w].append({"kind": "forget", "leaver": k})
            return True
        return act

    def dismiss(self, w: int, k: int) -> Any:
        def act() -> bool:
            self.commands[w].append({"kind": "dismiss", "leaver": k})
            return True
        return act

    # -- driving ---------------------------------------------------------------------------

    def feed(self, i: int, close: bool = False) -> None:
        if self.closed.get(i, True):
            return
        if i not in self.epoch:  # a joined worker: from the lent epoch on, once it holds it
            inp = self.handles[i]["input"]
            if not inp.ready and not close:
                return
            if inp.closed or not inp.ready:
                inp.close()
                self.closed[i] = True
                return
            self.epoch[i] = self.first[i] = inp.time  # its releases wait for the protocol
        e = self.epoch[i]
        if close or e == EPOCHS or (i >= FEEDERS and e == self.first[i] + JOINER_EPOCHS):
            self.handles[i]["input"].close()
            self.closed[i] = True
            return
        inp = self.handles[i]["input"]
        for w in words(i, e):
            inp.send(w)
        inp.advance_to(e + 1)
        self.epoch[i] = e + 1

    def feed_any(self) -> None:
        """Feed one of the open inputs (the feeders', and joined workers' with a lent token)."""
        open_inputs = [i for i, closed in self.closed.items() if not closed]
        if open_inputs:
            self.feed(self.rng.choice(open_inputs))

    def running(self) -> list[int]:
        return [i for i, w in self.workers.items() if not w.left]

    def run(self, iterations: int) -> None:
        rng = self.rng
        joins = rng.randint(1, SLOTS - FEEDERS)
        plan = ["join"] * joins + ["leave"] * rng.randint(joins // 2, joins)
        rng.shuffle(plan)
        for _ in range(iterations):
            r = rng.random()
            if r < 0.04 and plan and not self.actions:
                (self.plan_join if plan.pop() == "join" else self.plan_leave)()
            elif r < 0.25 and self.actions:
                if self.actions[0]():
                    self.actions.popleft()
            elif r < 0.40:
                self.feed_any()
            elif r < 0.70:
                self.step(rng.choice(self.running()))
            else:
                self.fabric.deliver_random(rng)
        # finish the membership actions and the inputs, then settle
        for _ in range(2000):
            if not self.actions:
                break
            if self.actions[0]():
                self.actions.popleft()
            self.fabric.deliver_random(rng)
            self.step(rng.choice(self.running()))
            if rng.random() < 0.05:
                self.fabric.deliver_everything()
            if rng.random() < 0.05:  # migrations complete as the data frontier moves on
                self.feed_any()
        assert not self.actions, "the membership protocol did not complete"
        for i in sorted(self.closed):
            self.feed(i, close=True)
        for _ in range(LIVENESS_ROUNDS):
            self.fabric.deliver_everything()
            if not any([self.step(i) for i in self.running()]):
                return
        raise AssertionError(f"not finished after {LIVENESS_ROUNDS} rounds: workers "
                             f"{self.running()} still running")


def flat(per_epoch: dict[int, Counter[Any]]) -> Counter[Any]:
    return Counter({(e, r): n for e, c in per_epoch.items() for r, n in c.items()})


def oracle_chained(first: Counter[Any]) -> Counter[Any]:
    """The second fold's running counts, per key ``count % 5`` of the first fold's outputs."""
    epochs = max((e for e, _ in first), default=-1) + 1
    return flat(running_counts([c % 5 for (t, (_, c)), n in first.items() if t == e
                                for _ in range(n)] for e in range(epochs)))


def fed_words(job: Job, e: int) -> list[str]:
    """The words of epoch ``e`` every worker fed (feeders from 0, joined ones from the epoch
    they were lent)."""
    return [w for worker in sorted(job.epoch) if job.first[worker] <= e < job.epoch[worker]
            for w in words(worker, e)]


def oracle_running(job: Job) -> Counter[Any]:
    """The running counts of the epochs every worker fed."""
    return flat(running_counts(fed_words(job, e) for e in range(max(job.epoch.values()))))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_joins_and_leaves_are_progress_safe(seed: int) -> None:
    job = Job(random.Random(seed))
    job.run(1500)
    running: Counter[Any] = Counter()
    per_epoch: Counter[tuple[int, int]] = Counter()  # (worker, epoch) -> emissions
    counted: dict[int, int] = defaultdict(int)
    for i in job.ever:
        for t, records in job.handles[i]["running"].by_time().items():
            running.update((t, r) for r in records)
        for t, records in job.handles[i]["per_epoch"].by_time().items():
            for w, n in records:
                per_epoch[(w, t)] += 1
                counted[t] += n
    assert running == oracle_running(job)
    chained: Counter[Any] = Counter()
    for i in job.ever:
        for t, records in job.handles[i]["chained"].by_time().items():
            chained.update((t, r) for r in records)
    assert chained == oracle_chained(running)
    # a per-epoch count is emitted once per worker, when the frontier passed the epoch: it
    # is final; the words broadcast to between FEEDERS and SLOTS workers are all counted
    assert set(per_epoch.values()) == {1}
    for e in range(max(job.epoch.values())):
        total = len(fed_words(job, e))
        assert total * FEEDERS <= counted[e] <= total * SLOTS, (e, counted[e], total)
    assert len(job.ever) > FEEDERS  # someone joined
