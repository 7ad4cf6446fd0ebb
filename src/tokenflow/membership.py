"""Workers joining and leaving a running job: the roster, progress bootstrap, farewells.

Source: Selvatici, *Rescaling of Timely Dataflow* (ETH, 2019: §3 new-worker initialization,
§3.4 the bootstrap protocol with progress sequence numbers); the distributed-DBSP design,
"Scaling state" (hot scale in and out); docs/ARCHITECTURE.md ("Elasticity").

A job started with more worker *slots* than workers (``execute(..., slots=M)``) can grow into
the free slots and shrink again while it runs.  The driver (``JobHandle.add_worker`` /
``remove_worker``) runs the protocol through the control plane; workers carry it out between
steps (``MembershipAgent``, driven by the ``ControlAgent``):

**Join** of worker ``k``.  The runtime starts ``k`` with ``joining=True``: it connects to the
others, builds the job's dataflows (its operators receive no counted initial tokens) and runs
none of them yet; it says ``hello``.  The driver sends ``admit`` to every worker of the roster:
each adds ``k`` to its roster between two steps (its progress batches and broadcast copies go
to ``k`` from then on) and replies with, per dataflow, the sequence number of its next progress
batch, the first ``k`` receives from it (``admitted``).  The driver then asks one worker, the
*bootstrap server*, to ``bootstrap`` ``k``: once the server has applied every peer's batches up
to those numbers (it keeps stepping meanwhile: it never stops for the protocol, unlike the
seed's server), it sends ``k``, between two steps, its progress state: per dataflow the
accumulated pointstamp counts and how many batches of each sender they include.  ``k`` starts
its trackers from it, skips the batches it receives that the state already includes, and runs;
it says ``joined``.  Every batch a worker sent after admitting ``k`` reaches ``k``, and the
state includes every batch before the numbers it waited for, so ``k`` sees each batch exactly
once (the seed fills gaps by asking the server for ranges; waiting for the numbers instead
needs no log at the server).

A join that fails (a worker does not answer in time, or the job's dataflows ended before
the bootstrap: nobody will serve it) is *abandoned*: the driver sends ``abandon`` to ``k``,
which stops (``Worker.stop``) and leaves (``Worker.leave``) without having joined, so that
its worker code returns and the job can end; its slot is not reused.  Members that admitted
``k`` keep it in their rosters; ``k`` owns no bins and holds no token, so the job's output is
that of a run nobody joined (tested with a member that answered ``admit`` too late, in a job
that went on).  Abandoning ends a join that failed; it is not a way to cancel one that is
going on.

**Leave** of worker ``k``.  The driver first moves ``k``'s state away (a Megaphone rescale to
a roster without ``k``), then sends ``leave`` to ``k``: once ``k`` holds no token and every
``Worker.leave_checks`` passes (no migrating operator still owns bins on it), it replies
``ready``.  The driver sends ``dismiss`` to every other worker: each removes ``k`` from its
roster between two steps (no more data or broadcast copies for ``k``; its progress batches
still go to ``k``) and sends ``k`` a farewell after its last message to ``k``.  With a farewell
from every worker, everything sent to ``k`` is in its queues: ``k`` steps until it has
processed it and its operators released their tokens (its frontiers still advance), replies
``left`` and ends.  The driver then sends ``forget``: the others stop sending progress to ``k``
and say goodbye on the mesh, which lets ``k``'s process close its connections.

Runtimes: ``thread`` (a thread per joining worker), ``process`` (a process: it dials the
roster, and since slots are never reused every member is below it and accepts), ``spark`` (a
one-task barrier stage of its own on the job's SparkSession, next to the running stage; the
master needs a task slot per worker slot).

**Inputs of a joined worker** (``lend``).  The driver asks the roster's first worker, the
lender, to lend ``k`` its input tokens: between two steps it copies the token of each open
``InputHandle`` and hands the copy over (its +1 stays in the lender's progress stream), and after
its next step it sends ``k`` the epochs (``("lent", {key: epoch})``) and the driver the sequence
numbers of its next batches (``lent``).  ``k``'s handles adopt the tokens and may send at once;
their releases wait (``LentToken``) until the driver has heard from every worker of the roster,
the lender and ``k`` included, that it applied the lender's batches below those numbers
(``applied?`` / ``applied``) and tells ``k`` to ``release``: no worker can then see ``k``'s -1
before the lender's +1.

**Sources of a joined or leaving worker** (``fence``, ``resplit``, ``resplit?``): the driver
(``tokenflow.resplit.move_sources``) re-splits every replayable source's remaining work at a
logical time ``t``; a joined worker's source is lent a fenced worker's tokens with ``lend``
(``keys``: the sources); the workers' side is ``tokenflow.io.handover``.

Not yet: nested scopes (iteration) in an elastic job, checkpoints of an elastic job, reusing a
slot a worker left, handing over a directory source with a time column.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable
from typing import Any

COMMANDS = ("admit", "bootstrap", "leave", "dismiss", "forget", "address", "lend", "applied?",
            "release", "fence", "resplit", "resplit?", "abandon")
"""Control-plane commands the ``MembershipAgent`` carries out."""


class MembershipError(RuntimeError):
    """A worker could not join or leave (names the worker and what was missing)."""


class MembershipAgent:
    """The worker side of the membership protocol, run between steps by the ``ControlAgent``.

    Args:
        link: the worker's control-plane link (``send``).
    """

    def __init__(self, link: Any) -> None:
        self.link = link
        self._hello = False
        self._joined = False
        self._bootstraps: list[tuple[int, dict[int, dict[int, int]]]] = []
        self._leaving = False
        self._ready = False
        self._farewells: set[int] = set()
        self._lends: list[tuple[int, dict[str, Any], int]] = []  # (joiner, lent, at step)
        self._checks: list[tuple[int, dict[int, int]]] = []  # (lender, floors)
        self._resplit: list[str] = []  # sources of the last re-split (phase 2)
        self._resplit_asked = False  # the driver waits for their pieces (``resplit?``)
        self.served: list[float] = []
        """Seconds each bootstrap this worker served took (between two of its steps)."""
        self.state_bytes: list[int] = []
        """Pickled size of each progress state this worker sent."""

    def handle(self, worker: Any, message: dict[str, Any]) -> None:
        """Carry out one membership command (between steps).

        Raises:
            MembershipError: a command this worker cannot carry out.
        """
        kind = message["kind"]
        if kind == "admit":
            joiner = int(message["joiner"])
            driving = [r for r in worker.rescalers if getattr(r, "driving", False)]
            if driving:  # the routing steps sent so far, before any later one (same connection)
                worker.send_membership(joiner, ("routing", [r.history() for r in worker.rescalers]))
            floors = worker.set_roster([*worker.roster, joiner])
            self.link.send({"kind": "admitted", "worker": worker.index, "joiner": joiner,
                            "floors": [[df, seq] for df, seq in floors.items()]})
        elif kind == "bootstrap":
            floors: dict[int, dict[int, int]] = {}
            for df, sender, seq in message["floors"]:
                floors.setdefault(int(df), {})[int(sender)] = int(seq)
            self._bootstraps.append((int(message["joiner"]), floors))
        elif kind == "leave":
            self._leaving = True
        elif kind == "abandon":  # this worker's join failed (module docstring)
            if worker.joining:
                worker.stop()
                worker.leave()
        elif kind == "dismiss":
            leaver = int(message["leaver"])
            rest = [w for w in worker.roster if w != leaver]
            worker.set_roster(rest, progress=[*rest, leaver])
            worker.send_membership(leaver, ("farewell", worker.index))
            self.link.send({"kind": "dismissed", "worker": worker.index, "leaver": leaver})
        elif kind == "lend":  # copies of this worker's input (or source) tokens for a joiner
            keys = message.get("keys")
            lent = worker.lend_inputs(None if keys is None else [str(k) for k in keys])
            self._lends.append((int(message["joiner"]), lent, worker.steps))
        elif kind == "fence":  # a re-split's phase 1 (tokenflow.io.handover, tokenflow.resplit)
            margin = int(message.get("margin", 2))
            reply = {}
            try:
                for key, handle in worker.sources.items():
                    if hasattr(handle, "fence"):
                        reply[key] = handle.fence(margin)
            except RuntimeError as exc:  # a source that cannot hand over: the driver says why
                for key in reply:
                    worker.sources[key].reassign({"t": None})  # lift the fences again
                self.link.send({"kind": "fenced", "worker": worker.index, "sources": {},
                                "error": f"worker {worker.index}: {exc}"[:2000]})
                return
            self.link.send({"kind": "fenced", "worker": worker.index, "sources": reply})
        elif kind == "resplit":  # phase 2: the new assignment from t on
            sources = worker.sources
            for key, plan in message["sources"].items():
                sources[key].reassign(plan)
            self._resplit = list(message["sources"])
        elif kind == "resplit?":  # reply once every piece the re-split brings has arrived
            self._resplit_asked = True
        elif kind == "applied?":  # has this worker applied the lender's batches with the +1?
            floors = {int(df): int(seq) for df, seq in message["floors"]}
            self._checks.append((int(message["lender"]), floors))
        elif kind == "release":  # every worker counts the lent tokens: they may be released
            worker.release_lent()
            self.link.send({"kind": "released", "worker": worker.index})
        elif kind == "address":  # where a joining worker dials this one
            mesh = getattr(worker.allocator, "mesh", None)
            address = mesh.addresses[worker.index] if mesh is not None else None
            self.link.send({"kind": "address", "worker": worker.index,
                            "address": list(address) if address is not None else None})
        elif kind == "forget":
            leaver = int(message["leaver"])
            worker.set_roster(list(worker.roster))  # no more progress batches to it
            goodbye = getattr(worker.allocator, "goodbye", None)
            if goodbye is not None:
                goodbye(leaver)  # what is buffered for it goes out first, then the goodbye
            self.link.send({"kind": "forgotten", "worker": worker.index, "leaver": leaver})
        else:
            raise MembershipError(f"worker {worker.index}: unknown membership command {kind!r}")

    def poll(self, worker: Any) -> None:
        """Advance the protocol after a step: greet, serve bootstraps, leave when ready."""
        if worker.joining and not self._hello:
            self._hello = True
            self.link.send({"kind": "hello", "worker": worker.index})
        if self._hello and not worker.joining and not self._joined:
            self._joined = True
            self.link.send({"kind": "joined", "worker": worker.index})
        if self._bootstraps:
            self._serve(worker)
        if self._lends:
            self._lent(worker)
        if self._checks:
            self._answer_checks(worker)
        if self._resplit_asked:
            sources = worker.sources
            keys = [key for key in self._resplit if key in sources]
            if all(sources[key].handed_over for key in keys):
                self._resplit_asked = False
                self.link.send({"kind": "resplit_done", "worker": worker.index,
                                "read": {key: sources[key].rows_read for key in keys}})
        if self._leaving:
            self._leave(worker)

    def _lent(self, worker: Any) -> None:
        """After a step since the copies were made (their +1 is in a batch sent by now): tell
        the joiner its tokens, and the driver the batches every worker must apply first."""
        for entry in list(self._lends):
            joiner, lent, at = entry
            if worker.steps > at:
                worker.send_membership(joiner, ("lent", lent))
                self.link.send({"kind": "lent", "worker": worker.index, "joiner": joiner,
                                "inputs": sum(at is not None for at in lent.values()),
                                "floors": [[df, seq] for df, seq
                                           in worker.progress_sequences().items()]})
                self._lends.remove(entry)

    def _answer_checks(self, worker: Any) -> None:
        received = worker.received_batches()
        for entry in list(self._checks):
            lender, floors = entry
            if _applied(received, {df: {lender: seq} for df, seq in floors.items()}):
                self.link.send({"kind": "applied", "worker": worker.index})
                self._checks.remove(entry)

    def _serve(self, worker: Any) -> None:
        received = worker.received_batches()
        for entry in list(self._bootstraps):
            joiner, floors = entry
            if _applied(received, floors):
                began = time.perf_counter()
                states = worker.progress_states()
                worker.send_membership(joiner, ("bootstrap", states, list(worker.roster)))
                self.served.append(time.perf_counter() - began)
                self.state_bytes.append(len(pickle.dumps(states)))
                self._bootstraps.remove(entry)

    def _leave(self, worker: Any) -> None:
        for message in worker.membership:
            if message[0] == "farewell":
                self._farewells.add(int(message[1]))
        worker.membership.clear()
        if not self._ready:
            if any(check() for check in worker.leave_checks):
                return  # state still to hand away
            self._ready = True
            self.link.send({"kind": "ready", "worker": worker.index})
            return
        others = set(worker.roster) - {worker.index}
        if not others <= self._farewells or not worker.activations.is_empty() \
                or worker.holds_tokens():
            return  # what was sent here is processed, and its tokens released, first
        worker.leave()
        self._leaving = False
        self.link.send({"kind": "left", "worker": worker.index})


def _applied(received: dict[int, dict[int, int]], floors: dict[int, dict[int, int]]) -> bool:
    """True when, per dataflow and sender, the batches below ``floors[df][sender]`` are among
    those applied (``received``: ``Worker.received_batches()``)."""
    return all(received.get(df, {}).get(sender, 0) >= seq
               for df, by_sender in floors.items() for sender, seq in by_sender.items())


# -- the driver's side ----------------------------------------------------------------------


def _gather(hub: Any, kind: str, workers: Iterable[int], timeout: float,
            alive: Callable[[], bool], stash: list[dict[str, Any]] | None = None,
            ) -> dict[int, dict[str, Any]]:
    """One reply of ``kind`` from each of ``workers`` (``tokenflow.control.gather``)."""
    from tokenflow.control import gather  # the control layer imports this module

    return gather(hub, kind, workers, timeout, alive, stash=stash)


def addresses(hub: Any, roster: list[int], slots: int, timeout: float,
              alive: Callable[[], bool]) -> list[tuple[str, int] | None]:
    """The mesh addresses of the workers of ``roster``, by slot (None for the others): what a
    runtime that did not see them (Spark: the tasks exchange them among themselves) hands a
    joining worker.

    Raises:
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
        MembershipError: a worker has no mesh address.
    """
    for w in roster:
        hub.send(w, {"kind": "address"})
    out: list[tuple[str, int] | None] = [None] * slots
    for w, reply in _gather(hub, "address", roster, timeout, alive).items():
        if reply.get("address") is None:
            raise MembershipError(f"worker {w} has no mesh address")
        host, port = reply["address"]
        out[w] = (str(host), int(port))
    return out


def join(hub: Any, roster: list[int], joiner: int, timeout: float,
         alive: Callable[[], bool]) -> None:
    """Drive the join of worker ``joiner`` (already started, ``joining=True``) into a job
    whose workers are ``roster``.

    Raises:
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
    """
    _gather(hub, "hello", [joiner], timeout, alive)
    for w in roster:
        hub.send(w, {"kind": "admit", "joiner": joiner})
    admitted = _gather(hub, "admitted", roster, timeout, alive)
    floors = [[df, w, seq] for w, reply in admitted.items() for df, seq in reply["floors"]]
    server = roster[0]
    hub.send(server, {"kind": "bootstrap", "joiner": joiner, "floors": floors})
    _gather(hub, "joined", [joiner], timeout, alive)


def lend(hub: Any, roster: list[int], joiner: int, timeout: float,
         alive: Callable[[], bool]) -> int:
    """Give worker ``joiner`` (joined, in ``roster``) a token for each open input: the lender
    (the roster's first worker) copies its own tokens at their current epochs and hands the
    copies over; once every worker has applied the lender's progress batches that count them,
    the joiner may release them.  Returns the number of inputs lent.

    Raises:
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
    """
    reply = lend_begin(hub, roster[0], joiner, None, timeout, alive)
    lend_finish(hub, roster, roster[0], joiner, reply, timeout, alive)
    return int(reply["inputs"])


def lend_begin(hub: Any, lender: int, joiner: int, keys: list[str] | None, timeout: float,
               alive: Callable[[], bool]) -> dict[str, Any]:
    """Have ``lender`` copy its tokens of every open input (``keys`` None) or of the inputs
    and sources ``keys`` and hand them to ``joiner``; returns its ``lent`` reply (``inputs``:
    tokens lent, ``floors``: its progress batches that count them).

    Raises:
        ControlError: no reply within ``timeout`` s, or the job ended.
    """
    command: dict[str, Any] = {"kind": "lend", "joiner": joiner}
    if keys is not None:
        command["keys"] = list(keys)
    hub.send(lender, command)
    return _gather(hub, "lent", [lender], timeout, alive)[lender]


def lend_finish(hub: Any, roster: list[int], lender: int, joiner: int, reply: dict[str, Any],
                timeout: float, alive: Callable[[], bool]) -> None:
    """Once every worker of ``roster`` has applied the lender's batches below the floors of
    its ``lent`` reply, let ``joiner`` release the lent tokens.

    Raises:
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
    """
    # every worker, the lender too: a worker applies its own batches as it receives them, so
    # its view may still lack the copy's count when it sees the joiner release the token
    for w in roster:
        hub.send(w, {"kind": "applied?", "lender": lender, "floors": reply["floors"]})
    _gather(hub, "applied", roster, timeout, alive)
    hub.send(joiner, {"kind": "release"})
    _gather(hub, "released", [joiner], timeout, alive)


def leave(hub: Any, roster: list[int], leaver: int, timeout: float,
          alive: Callable[[], bool]) -> None:
    """Drive the departure of worker ``leaver`` from ``roster`` (its state already moved away:
    it replies ``ready`` only when it holds no token and owns nothing).

    Raises:
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
    """
    hub.send(leaver, {"kind": "leave"})
    _gather(hub, "ready", [leaver], timeout, alive)
    others = [w for w in roster if w != leaver]
    for w in others:
        hub.send(w, {"kind": "dismiss", "leaver": leaver})
    stash: list[dict[str, Any]] = []  # "left" may come before the last "dismissed"
    _gather(hub, "dismissed", others, timeout, alive, stash)
    _gather(hub, "left", [leaver], timeout, alive, stash)
    for w in others:
        hub.send(w, {"kind": "forget", "leaver": leaver})
    _gather(hub, "forgotten", others, timeout, alive)


__all__ = ["COMMANDS", "MembershipAgent", "MembershipError", "addresses", "join", "leave", "lend",
           "lend_begin", "lend_finish"]
