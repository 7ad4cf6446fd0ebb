"""``Worker``: builds dataflows and steps them (layer 5 of docs/ARCHITECTURE.md).

Source: timely's ``worker.rs``.  Every worker of a job builds the same dataflows in the same
order, so channel identifiers agree across workers.  ``step()`` pulls in arrived messages,
activates the operators they are for, schedules each dataflow (its root ``Subgraph``) and
returns whether any dataflow is still running.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tokenflow.dataflow.channel_state import KEY as CHANNEL_STATE
from tokenflow.dataflow.channel_state import ChannelState
from tokenflow.dataflow.input import JobStopped
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.state import BinnedState
from tokenflow.order.summary import Increment
from tokenflow.progress.broadcast import Progcaster
from tokenflow.progress.location import Source, Target
from tokenflow.progress.subgraph import Subgraph, SubgraphBuilder
from tokenflow.state.bins import DEFAULT_BINS, RoutingTable

R = TypeVar("R")

PARK_CAP = 0.1
"""The longest ``step_or_park`` waits without a timeout of its own, in seconds.  A parked
worker wakes for a message, for an activation from another thread (``Worker.activate``,
``Worker.unpark``) and for its next delayed activation (``activate_after``); the cap only
bounds the wait for a change another thread makes without waking it."""

MEMBERSHIP_CHANNEL = 0xFFFF_FFF0
"""The channel identifier of membership messages between workers (bootstrap state,
farewells); dataflow channels count up from 0."""


class Activations:
    """Paths of operators that asked to be scheduled, now or after a delay (timely's
    ``Activations``: ``activate``, ``activate_after``; ``advance`` moves the delayed ones that
    are due in, ``empty_for`` bounds a park by the next one)."""

    __slots__ = ("_active", "_timers", "_sequence")

    def __init__(self) -> None:
        self._active: set[tuple[int, ...]] = set()
        self._timers: list[tuple[float, int, tuple[int, ...]]] = []  # heap: (due, seq, path)
        self._sequence = itertools.count()

    def activate(self, path: tuple[int, ...]) -> None:
        self._active.add(path)

    def activate_after(self, path: tuple[int, ...], delay: float) -> None:
        """Activate ``path`` once ``delay`` seconds (``time.monotonic``) have passed; the
        empty path only ends a park (the worker steps; ``on_step`` hooks run)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._sequence), path))

    def advance(self) -> bool:
        """Activate the delayed paths that are due; True when any was (the worker must step,
        not park)."""
        timers = self._timers
        if not timers:
            return False
        now = time.monotonic()
        if timers[0][0] > now:
            return False
        while timers and timers[0][0] <= now:
            path = heapq.heappop(timers)[2]
            if path:
                self._active.add(path)
        return True

    def empty_for(self) -> float | None:
        """Seconds until the next delayed activation is due (0 when one is), None if none."""
        timers = self._timers
        return max(0.0, timers[0][0] - time.monotonic()) if timers else None

    def for_extensions(self, path: tuple[int, ...]) -> list[int]:
        """Child indices of ``path`` to schedule; consumes requests for the direct children
        (deeper requests stay for the child scope to consume)."""
        n = len(path)
        out: list[int] = []
        done: list[tuple[int, ...]] = []
        # A snapshot: a token garbage collected on another thread may activate concurrently.
        for p in list(self._active):
            if len(p) > n and p[:n] == path:
                out.append(p[n])
                if len(p) == n + 1:
                    done.append(p)
        for p in done:
            self._active.discard(p)
        return out

    def is_empty(self) -> bool:
        return not self._active


def outermost(time: Any) -> Any:
    """A time's outermost coordinate: a nested scope's ``Product`` times nest the outer one
    first; a top-level time is itself."""
    while isinstance(time, tuple):
        time = time[0]
    return time


class Traffic:
    """Records this worker's operators pushed into channels (``sent``: each record counted
    once per worker that receives it) and pulled out of them (``received``).  Summed over all
    workers of a job, ``sent == received`` once no data message is in flight; the checks that
    a snapshot is a consistent cut rely on it (``tokenflow.control``).

    An aligned snapshot at epoch ``e`` (``tokenflow.control``) also uses two gates here, and
    ``crossing``: the messages this worker's operators pushed at times the barrier holds
    (``cross``), of which those at or after ``e`` are the checkpoint's channel state:

    * ``barrier``: ``e`` until this worker has captured its state, else None.  An operator
      input then sets aside every message at a time at or after ``e`` (by its outermost
      coordinate) instead of handing it to its operator, until ``lift()``
      (``OperatorInput.next``; the messages behind one still come); a held message is not
      counted in ``received`` until it is handed over.  ``held``: the inputs holding one.
    * ``defer``: ``e`` from this worker's capture until every worker has captured, else None.
      A message pushed meanwhile at a time before ``e`` is counted in ``sent`` but kept in
      ``deferred`` instead of entering its channel, until ``release_deferred()``
      (``CountingPush``): no worker that has not captured yet receives it.
    """

    __slots__ = ("sent", "received", "barrier", "held", "defer", "deferred", "crossing")

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.barrier: int | None = None
        self.held: list[Any] = []
        self.defer: int | None = None
        self.deferred: list[tuple[Any, Any]] = []
        self.crossing: list[tuple[tuple[int, ...], int, Any, int]] = []

    def cross(self, path: tuple[int, ...], port: int, message: Any, counted: int) -> None:
        """Record a message an operator pushed at a time the barrier holds (``counted``: what
        the push added to ``sent``): if it is at or after the checkpoint's epoch, it crosses
        the cut and is stored as channel state (``tokenflow.dataflow.channel_state``)."""
        self.crossing.append((path, port, message, counted))

    def take_crossing(self, epoch: int) -> tuple[list[tuple[tuple[int, ...], int, Any]], int]:
        """The recorded messages at or after ``epoch`` (outermost coordinate) as channel-state
        entries, with the count they added to ``sent``; forgets every record."""
        entries, counted = [], 0
        for path, port, message, n in self.crossing:
            if outermost(message[0]) >= epoch:
                entries.append((path, port, message))
                counted += n
        self.crossing = []
        return entries, counted

    def holds(self, time: Any) -> bool:
        """True while a barrier is up and ``time`` (its outermost coordinate: a nested scope's
        ``Product`` times nest the outer one first) is at or after it."""
        barrier = self.barrier
        if barrier is None:
            return False
        return bool(outermost(time) >= barrier)

    def defers(self, time: Any) -> bool:
        """True while ``defer`` is set and ``time`` (its outermost coordinate) is before it."""
        defer = self.defer
        if defer is None:
            return False
        return bool(outermost(time) < defer)

    def lift(self) -> list[Any]:
        """Take the barrier down; returns the inputs that held a message (wake their operators:
        ``OperatorInput.release``)."""
        self.barrier = None
        held, self.held = self.held, []
        return held

    def release_deferred(self) -> int:
        """Stop deferring and push the deferred messages, in order; returns how many."""
        self.defer = None
        deferred, self.deferred = self.deferred, []
        for pusher, message in deferred:
            pusher.push(message)
        return len(deferred)


class Worker:
    """One worker of a job.

    Args:
        allocator: the worker's allocator (``index``, ``peers``, ``allocate``, ``receive``,
            ``flush``, ``park``).
        routing: the job's routing table (bin -> worker); default: ``DEFAULT_BINS`` bins in
            even contiguous ranges over the ``peers`` workers.
    """

    def __init__(self, allocator: Any, routing: RoutingTable | None = None,
                 roster: list[int] | None = None, joining: bool = False) -> None:
        self.allocator = allocator
        self.index: int = allocator.index
        self.slots: int = allocator.peers
        """Worker slots of the job's mesh: the most workers it can have at once."""
        self.roster: list[int] = sorted(roster) if roster is not None else list(range(self.slots))
        """The workers of the job now (slot indices, ascending); changes when workers join
        or leave (``tokenflow.membership``)."""
        self.peers: int = len(self.roster)
        """The number of workers of the job now (``len(roster)``)."""
        if joining and routing is None:
            raise ValueError(f"worker {self.index}: a worker joining a running job needs the "
                             "job's routing table (its default depends on the roster)")
        self.joining = joining
        """True until this worker, started to join a running job, has received its progress
        state from a running one (``bootstrap``); its dataflows do not run before."""
        self.elastic = joining or len(self.roster) < self.slots
        """Workers may join or leave: every dataflow keeps its progress state."""
        self.left = False
        """Set once this worker has left the job (``tokenflow.membership``)."""
        self.membership: list[Any] = []
        """Membership messages received from other workers (``tokenflow.membership``)."""
        self.leave_checks: list[Callable[[], str | None]] = []
        """Asked before this worker may leave the job: each returns why not yet (e.g. a
        migrating operator still owns bins here), or None."""
        self._membership_pushers: list[Any] = []
        self._membership_puller: Any = None
        self._bootstrap_state: tuple[Any, list[int]] | None = None
        self._routing_adopted = False  # a joiner with migrating operators: worker 0's steps
        if self.elastic:
            self._membership_pushers, self._membership_puller = \
                allocator.allocate(MEMBERSHIP_CHANNEL)
        self.routing: RoutingTable | None = routing if routing is not None else \
            RoutingTable.even(self.peers, DEFAULT_BINS)
        """Where keyed exchanges send a key's bin; fixed before the first dataflow is built."""
        self.states: dict[str, BinnedState] = {}
        """Declared operator state by stable key (``OperatorBuilder.state``)."""
        self.restore: Any = None
        """A snapshot reader (``tokenflow.state.snapshot.Snapshot``) whose bins this worker
        loads into every state it declares, or None."""
        self.replay = False
        """True when this run re-executes epochs a failed run of the same job may already
        have produced (recovery from a checkpoint, or a restart before the first one):
        committing sinks then discard epochs already committed (``tokenflow.recovery``)."""
        self.input_log: Any = None
        """The job's durable input log for this worker (``tokenflow.io.inputlog.InputLog``),
        or None when the job runs without checkpoints."""
        self.rescalers: list[Any] = []
        """Controllers of migrating operators (``tokenflow.rescale``) on this worker, asked by
        the control plane's ``rescale`` command (``rescale_roster(roster, strategy)``)."""
        self.catalog: tuple[str, int, str] | None = None
        """``(host, port, token)`` of the job's publish/subscribe catalog, or None."""
        self._sources: dict[str, Any] = {}  # key -> handle, or weakref.ref to an input handle
        self.adopters: dict[str, Any] = {}
        """On a joining worker: per input key, the input operator's ``OperatorCore`` (what a
        token lent to it is made for, even after the worker code dropped the handle)."""
        self._lent: list[tuple[Any, tuple[int, ...], int]] = []  # (LentToken, path, lend round)
        self._lends = 0  # lends adopted (one "lent" message per lend round)
        self._releases = 0  # releases the driver sent (one per lend round, in order)
        self.traffic = Traffic()
        self.stopped = False
        """Set by ``stop()``: the control plane ended the job (after a snapshot)."""
        self.activations = Activations()
        self._identifiers = 0
        self._dataflow_count = 0
        self._dataflows: dict[int, Subgraph] = {}
        self._channel_paths: dict[int, tuple[int, ...]] = {}
        self.inputs: dict[str, Any] = {}
        """This worker's partition of each named job input (see ``tokenflow.inputs``)."""
        self.on_step: list[Callable[[Worker], None]] = []
        """Hooks called after every step (metrics reporters); keep them cheap."""
        self._claims_checked = False
        self.steps = 0
        self.parked = False
        """True while the worker waits in ``step_or_park`` with nothing to run: read from
        another thread, e.g. a checkpoint's writer, which works while it is set
        (``tokenflow.control``; ``wait_parked``)."""
        self._parked_event: threading.Event | None = None  # made by the first ``wait_parked``
        # the thread that parks this worker; None until it first tries: an activation made
        # before then is seen when it does (``step_or_park`` sets this before it looks)
        self._stepper: int | None = None
        self.metrics: dict[str, int] = {"records_in": 0}
        """Counters reported to the coordinator (``records_in``: records entering dataflows)."""

    # -- construction ----------------------------------------------------------------------

    def register_state(self, key: str, state: BinnedState) -> None:
        """Declare operator state under ``key`` (stable across runs of the same dataflows):
        attach it to the routing table and, when restoring, load the bins this worker owns.

        Raises:
            ValueError: ``key`` is already declared.
        """
        if key in self.states:
            raise ValueError(f"worker {self.index}: operator state {key!r} declared twice")
        # routing None: exchanges hash straight to workers (a benchmark baseline); state is
        # still binned as under the default table
        routing = self.routing if self.routing is not None else RoutingTable.even(self.peers)
        owned = routing.owned_by(self.index)
        state.attach(routing.bins, int(owned[0]) if len(owned) else -1)
        self.states[key] = state
        if self.restore is not None:
            state.load(self.restore.read(key, owned.tolist()))
            state.mark_unchanged()  # the next checkpoint builds on this snapshot

    def channel_state(self) -> ChannelState:
        """This worker's ``ChannelState`` (the messages sent across an aligned checkpoint's
        cut), declared on first use."""
        state = self.states.get(CHANNEL_STATE)
        if state is None:
            state = ChannelState()
            self.register_state(CHANNEL_STATE, state)
        assert isinstance(state, ChannelState)
        return state

    def restored_messages(self, path: tuple[int, ...]) -> list[tuple[int, Any]]:
        """The ``(port, (time, batch))`` messages the operator at ``path`` sent across the cut
        of the snapshot this worker restores (``tokenflow.dataflow.channel_state``), once."""
        state = self.states.get(CHANNEL_STATE)
        return state.take(path) if isinstance(state, ChannelState) else []

    def register_source(self, key: str, handle: Any, weak: bool = False) -> None:
        """Declare a replayable source (its ``SourceHandle``: ``pause_at``, ``resume``,
        ``paused``, ``positions``, ``safe_point``, ``close``) under a stable ``key``, so the
        control plane can pause it and snapshots record its positions.  ``weak``: hold it by
        a weak reference (an ``InputHandle`` the worker code drops is released, closing its
        input, as before).

        Raises:
            ValueError: ``key`` is already declared.
        """
        if key in self._sources:
            raise ValueError(f"worker {self.index}: source {key!r} declared twice")
        self._sources[key] = weakref.ref(handle) if weak else handle

    @property
    def sources(self) -> dict[str, Any]:
        """The declared sources still alive, by key."""
        out = {}
        for key, entry in self._sources.items():
            handle = entry() if isinstance(entry, weakref.ref) else entry
            if handle is not None:
                out[key] = handle
        return out

    def restored_positions(self, key: str) -> tuple[dict[str, int], int] | None:
        """When restoring: the positions to restart source ``key`` from (the union of every
        old worker's recorded positions of that key: split key -> offset) and the snapshot's
        epoch, where the source starts; None otherwise."""
        if self.restore is None:
            return None
        positions: dict[str, int] = {}
        for w in self.restore.workers:
            positions.update(self.restore.worker_meta(w).get("sources", {}).get(key, {}))
        return positions, int(self.restore.epoch)

    def stop(self) -> None:
        """End every dataflow of this worker now (after a snapshot, when the job stops): its
        sources are closed and ``step`` returns False."""
        self.stopped = True
        for handle in self.sources.values():
            close = getattr(handle, "close", None)
            if close is not None:
                close()
        self._dataflows.clear()

    def export_states(self, bins: Any = None) -> dict[str, Mapping[int, Any]]:
        """Every declared state's bins (all held when ``bins`` is None), by key: what a
        snapshot writes (``{key: {bin: pa.Table}}``)."""
        return {key: state.export(bins) for key, state in self.states.items()}

    def new_identifier(self) -> int:
        """The next channel identifier (the same sequence on every worker)."""
        ident = self._identifiers
        self._identifiers += 1
        return ident

    def allocate(self, identifier: int, path: tuple[int, ...]) -> tuple[list[Any], Any]:
        """Pushers and puller of channel ``identifier``, delivering to the operator at ``path``."""
        self._channel_paths[identifier] = path
        return self.allocator.allocate(identifier)  # type: ignore[no-any-return]

    def activate(self, path: tuple[int, ...]) -> None:
        """Schedule the operator at ``path`` at the next step.  Safe from any thread: called
        from another thread than the one stepping the worker, it also ends the worker's park
        (``unpark``; timely's ``SyncActivator``), e.g. a source fed by a reader thread."""
        self.activations.activate(path)
        self._unpark_if_elsewhere()

    def activate_after(self, path: tuple[int, ...], delay: float) -> None:
        """Schedule the operator at ``path`` once ``delay`` seconds have passed (timely's
        ``activate_after``): a parked worker wakes for it.  The empty path only makes the
        worker step (its ``on_step`` hooks run).  Safe from any thread."""
        self.activations.activate_after(path, delay)
        self._unpark_if_elsewhere()

    def _unpark_if_elsewhere(self) -> None:
        """``unpark`` when called from another thread than the one parking this worker (the
        stepping thread's own activations are seen before it parks)."""
        stepper = self._stepper
        if stepper is not None and stepper != threading.get_ident():
            self.unpark()

    def unpark(self) -> None:
        """From any thread: end the worker's current or next park at once (its allocator's
        ``wake``), so that it steps and sees what that thread changed."""
        wake = getattr(self.allocator, "wake", None)
        if wake is not None:
            wake()

    def flush(self) -> None:
        """Send what is buffered for other workers now (exchanges of large batches call it
        before splitting off this worker's own part; a step also flushes at its start and
        end).

        Raises:
            PeerLostError: (process and Spark runtimes) a peer's connection is gone.
        """
        self.allocator.flush()

    def progcaster(self, path: tuple[int, ...], name: str) -> Progcaster:
        """A progress channel for the scope at ``path``."""
        pushers, puller = self.allocate(self.new_identifier(), path)
        return Progcaster(self.index, pushers, puller, name, self.roster)

    def dataflow(self, build: Callable[[Scope], R], name: str | None = None) -> R:
        """Build a dataflow with integer times: ``build(scope)``'s result is returned.

        Raises:
            CycleError: when the graph has a cycle without a feedback summary.
        """
        if self.restore is not None and CHANNEL_STATE in self.restore.states():
            self.channel_state()  # loaded before the operators are built (they take theirs)
        index = self._dataflow_count
        self._dataflow_count += 1
        name = name or f"Dataflow{index}"
        builder = SubgraphBuilder(name, (index,), Increment(0))
        scope = Scope(self, builder, 0, Increment(0))
        result = build(scope)
        subgraph = builder.build(self.progcaster((index,), name), self.activations)
        if self.elastic:
            subgraph.track_state()
            subgraph.progcaster.track_held()
            if not self.joining:  # the initial token of every output, which it holds
                for child in subgraph.children[1:]:
                    for port in range(child.outputs):
                        subgraph.progcaster.held.update((Source(child.index, port), scope.min_time), 1)
        subgraph.get_internal_summary()
        subgraph.set_external_summary()
        self._dataflows[index] = subgraph
        return result

    # -- execution -------------------------------------------------------------------------

    def step(self) -> bool:
        """Do one round of work; True while any dataflow is running.

        Raises:
            WorkerAborted: when another worker of the job failed.
            SnapshotError: (first step of a restored worker) the snapshot holds operator
                state that no operator of this job declared, which would be lost silently.
        """
        if self.restore is not None and not self._claims_checked:
            self._check_claims()
        if self.left:
            return False
        self.allocator.flush()  # what worker code sent since the last step goes out first
        self.activations.advance()  # delayed activations now due
        paths = self._channel_paths
        for identifier in self.allocator.receive():
            path = paths.get(identifier)
            if path is not None:
                self.activations.activate(path)
            elif identifier == MEMBERSHIP_CHANNEL:
                self._receive_membership()
        if self.joining:
            self.steps += 1
            for hook in self.on_step:
                hook(self)
            return True  # nothing runs before the progress state arrives
        self.activations.for_extensions(())  # dataflows are scheduled at every step anyway
        finished = []
        for index, subgraph in self._dataflows.items():
            if not subgraph.schedule():
                finished.append(index)
        for index in finished:
            del self._dataflows[index]
        self.allocator.flush()
        self.steps += 1
        for hook in self.on_step:
            hook(self)
        return bool(self._dataflows)

    # -- membership (tokenflow.membership drives these) -----------------------------------

    def _receive_membership(self) -> None:
        while (message := self._membership_puller.pull()) is not None:
            if message[0] == "bootstrap":
                self._bootstrap_state = (message[1], message[2])
            elif message[0] == "lent":
                self._adopt_inputs(message[1])
            elif message[0] == "source":  # a source's work handed here (tokenflow.io.handover)
                self.sources[message[1]].receive(message[2])
            elif message[0] == "routing":
                for controller, history in zip(self.rescalers, message[1], strict=True):
                    controller.adopt(history)
                self._routing_adopted = True
            else:
                self.membership.append(message)
        if self._bootstrap_state is not None and (self._routing_adopted or not self.rescalers):
            states, roster = self._bootstrap_state
            self._bootstrap_state = None
            self._bootstrap(states, roster)

    def send_membership(self, worker: int, message: tuple[Any, ...]) -> None:
        """Send a membership message to ``worker`` (goes out at the next flush)."""
        self._membership_pushers[worker].push(message)

    def set_roster(self, roster: list[int], progress: list[int] | None = None) -> dict[int, int]:
        """Make ``roster`` the job's workers: broadcast copies go to them from now on, and
        progress batches to ``progress`` (default ``roster``; a leaving worker still needs
        them while it finishes what it received).  Call between steps.  Returns, per
        dataflow, the sequence number of this worker's next progress batch (the first a newly
        added worker receives).

        Raises:
            ValueError: a slot outside the mesh, or a roster without this worker.
        """
        members = sorted(set(roster))
        if not members or members[0] < 0 or members[-1] >= self.slots:
            raise ValueError(f"worker {self.index}: roster {members} outside the job's "
                             f"{self.slots} worker slots")
        if self.index not in members and not self.left:
            raise ValueError(f"worker {self.index}: roster {members} does not include it")
        self.roster = members
        self.peers = len(members)
        floors = {}
        targets = members if progress is None else sorted(set(progress))
        for index, subgraph in self._dataflows.items():
            floors[index] = subgraph.progcaster.set_roster(targets)
            subgraph.set_copies(len(members))
        return floors

    def progress_sequences(self) -> dict[int, int]:
        """Per running dataflow, the sequence number of this worker's next progress batch
        (every batch it sent so far is below it)."""
        return {index: subgraph.progcaster.sequence for index, subgraph in self._dataflows.items()}

    def progress_states(self) -> dict[int, Any]:
        """Per running dataflow, its ``Subgraph.progress_state()`` (between steps)."""
        return {index: subgraph.progress_state() for index, subgraph in self._dataflows.items()}

    def received_batches(self) -> dict[int, dict[int, int]]:
        """Per running dataflow, per sender, how many progress batches it has applied."""
        return {index: dict(subgraph.progcaster.received)
                for index, subgraph in self._dataflows.items()}

    def _bootstrap(self, states: dict[int, Any], roster: list[int]) -> None:
        if not self.joining:
            raise RuntimeError(f"worker {self.index}: a progress state arrived, but it is not "
                               "joining")
        missing = sorted(set(self._dataflows) - set(states))
        if missing:
            raise RuntimeError(f"worker {self.index}: joining, but the job runs no dataflow "
                               f"{missing} (it ended, or this worker built other dataflows)")
        self.set_roster(roster)
        for index, subgraph in self._dataflows.items():
            received, counts = states[index]
            subgraph.bootstrap(received, counts)
            self.activations.activate(subgraph.path)
        self.joining = False

    # -- inputs lent to a joining worker (``tokenflow.membership``) ----------------------------

    def lend_inputs(self, keys: list[str] | None = None) -> dict[str, Any]:
        """Copy the token of each open ``InputHandle`` of this worker's running dataflows (or,
        with ``keys``, of those inputs and sources: a source lends one token per output) and
        hand the copies over (counted in this worker's progress stream from its next step on,
        owned by the joining worker that adopts them); ``{key: time}``, the time None for an
        input this worker has closed (the joiner closes it too) or a source that ended."""
        from tokenflow.dataflow.input import InputHandle

        lent = {}
        for key, handle in self.sources.items():
            if (key not in keys) if keys is not None else not isinstance(handle, InputHandle):
                continue
            path: tuple[int, ...] = getattr(handle, "path", ())
            subgraph = self._dataflows.get(path[0]) if len(path) == 2 else None
            if subgraph is None:
                continue
            at = handle.lend()
            lent[key] = at
            if at is not None:
                for port in range(getattr(handle, "ports", 1)):
                    subgraph.progcaster.disown((Source(path[1], port), at))
        return lent

    def _adopt_inputs(self, lent: dict[str, Any]) -> None:
        from tokenflow.dataflow.input import lent_token

        handles = self.sources
        for key, at in lent.items():
            core = self.adopters.get(key)
            if core is None:
                raise RuntimeError(f"worker {self.index}: was lent a token for input {key!r}, "
                                   "which it does not have (did it build other dataflows?)")
            handle: Any = handles.get(key)
            if at is None:  # closed on the lender: nothing more comes into it
                if handle is not None and not hasattr(handle, "adopt_lent"):
                    handle.close()
                    handle.ready = True
                continue
            lent_tokens = [lent_token(core, at, port) for port in range(core.outputs)]
            if hasattr(handle, "adopt_lent"):  # a source: one token per output
                handle.adopt_lent([token for token, _ in lent_tokens])
            elif handle is not None:
                handle.adopt(lent_tokens[0][0])
            else:  # the worker code dropped the handle: the input is closed here
                lent_tokens[0][0].drop()
            subgraph = self._dataflows.get(core.path[0])
            for port, (_, gate) in enumerate(lent_tokens):
                if subgraph is not None:
                    subgraph.progcaster.own((Source(core.path[1], port), at))
                self._lent.append((gate, core.path, self._lends + 1))
        self._lends += 1
        self._release_due()

    def release_lent(self) -> None:
        """Let the tokens of the next lend round be released (every worker has applied the
        lender's count); when they have not arrived yet, they are released as they come."""
        self._releases += 1
        self._release_due()

    def _release_due(self) -> None:
        keep = []
        for gate, path, round_ in self._lent:
            if round_ <= self._releases:
                gate.release()
                self.activations.activate(path)  # the operator reports what was held back
            else:
                keep.append((gate, path, round_))
        self._lent = keep

    def holds_tokens(self) -> list[str]:
        """Tokens this worker's operators hold now, as ``"operator output port at times"``
        (empty: none); a worker leaving the job must hold none."""
        held = []
        for subgraph in self._dataflows.values():
            for (location, at), count in subgraph.progcaster.held.iter():
                if count:
                    held.append(f"{subgraph.children[location.node].name} output {location.port} "
                                f"at {at!r} (x{count})")
        return held

    def leave(self) -> None:
        """End this worker's part of the job (it has left: ``step`` returns False)."""
        self.left = True
        self._dataflows.clear()

    def _check_claims(self) -> None:
        from tokenflow.state.snapshot import SnapshotError

        self._claims_checked = True
        unclaimed = sorted(set(self.restore.states()) - set(self.states))
        if unclaimed:
            declared = ", ".join(sorted(self.states)) or "none"
            raise SnapshotError(
                f"worker {self.index}: the snapshot of epoch {self.restore.epoch} holds state "
                f"{', '.join(unclaimed)} that no operator of this job declares (declared: "
                f"{declared}); restoring would lose it. Did the job's operators change since "
                f"the snapshot? Restore with the job that wrote it.")

    def step_or_park(self, timeout: float | None = None) -> bool:
        """Sleep if a dataflow is running, nothing asked to run and no message is waiting,
        then ``step()`` (timely's order: park first, so a step's effects are seen at once; and
        timely's rule: no park without a dataflow, which nothing would wake).

        The park ends when a message arrives, when another thread activates an operator or
        calls ``unpark``, when the next delayed activation is due (``activate_after``), or
        after ``timeout`` seconds (default ``PARK_CAP``).  A loop that waits for a wall-clock
        time, not for the dataflow, uses ``step_until``.
        """
        self._stepper = threading.get_ident()
        activations = self.activations
        if not activations.advance() and activations.is_empty() and self._dataflows:
            wait = PARK_CAP if timeout is None else timeout
            due = activations.empty_for()
            if due is not None and due < wait:
                wait = due
            self.parked = True
            event = self._parked_event
            if event is not None:
                event.set()
            try:
                self.allocator.park(wait)
            finally:
                self.parked = False
                if event is not None:
                    event.clear()
        return self.step()

    def wait_parked(self, timeout: float) -> bool:
        """From another thread: block until this worker parks (``parked``), for at most
        ``timeout`` seconds; True when it is parked.  Blocks on an event the worker sets as it
        parks, so the waiting thread does not wake (and ask the worker's thread for the
        interpreter) until then."""
        event = self._parked_event
        if event is None:
            event = self._parked_event = threading.Event()
        return self.parked or event.wait(timeout)

    def step_while(self, condition: Callable[[], bool]) -> None:
        """Step until ``condition()`` is false.

        Raises:
            JobStopped: the control plane stopped the job (its dataflows are gone).
        """
        while condition():
            if self.stopped:
                raise JobStopped(f"worker {self.index}: the job was stopped")
            self.step_or_park()

    def step_until(self, deadline: float) -> None:
        """Step until wall-clock time ``deadline`` (seconds since the Unix epoch, as
        ``time.time()``), parking in between for no longer than the time left: for offering
        input on a schedule (an epoch every ``period`` s) without sending late by up to a
        park's ``PARK_CAP``.

        Raises:
            JobStopped: the control plane stopped the job (its dataflows are gone).
        """
        while (left := deadline - time.time()) > 0:
            if self.stopped:
                raise JobStopped(f"worker {self.index}: the job was stopped")
            self.step_or_park(min(left, PARK_CAP))

    def step_until_done(self) -> None:
        """Step until every dataflow of this worker has completed."""
        while self.step_or_park():
            pass

    @property
    def dataflows_running(self) -> int:
        return len(self._dataflows)

    def aligned_at(self, epoch: int, strict: bool = False) -> bool:
        """True when this worker's view of every running dataflow holds no message in flight
        at a time before ``epoch``, and every token before ``epoch`` belongs to an operator
        whose inputs' frontiers are all at or after ``epoch`` (it has received everything
        before ``epoch``; e.g. a sink holding an unfinished bin of epochs); ``strict``: no
        token before ``epoch`` at all (such an operator may be about to act on the frontier
        it has just reached on another worker: ``tokenflow.control`` waits a little for it).
        Conservative (timely's progress safety): a message another worker sent is seen in
        flight here until its receiver has consumed it.  Checks the top-level scopes (a
        nested scope's work appears there as its tokens and messages)."""
        for subgraph in self._dataflows.values():
            tracker = subgraph.tracker
            for node, per_op in enumerate(tracker.per_operator):
                for info in per_op.targets:
                    if any(t < epoch for t in info.pointstamps.frontier()):
                        return False
                if node and any(t < epoch for info in per_op.sources
                                for t in info.pointstamps.frontier()):
                    if strict:
                        return False
                    for port in range(len(per_op.targets)):
                        if any(t < epoch for t in tracker.frontier(Target(node, port))):
                            return False
        return True

    def token_times(self, since: int) -> set[int]:
        """The times at or after ``since`` (outermost coordinates) at which operators other
        than this worker's sources hold tokens, in this worker's view of every running
        dataflow (every worker's tokens: progress tracking), e.g. the ends of a window
        operator's open windows: times at which they may still send.  An aligned checkpoint
        avoids them (``tokenflow.control``)."""
        sources = {tuple(h.path) for h in self.sources.values() if getattr(h, "path", ())}
        out: set[int] = set()
        for index, subgraph in self._dataflows.items():
            for node, per_op in enumerate(subgraph.tracker.per_operator):
                if not node or (index, node) in sources:
                    continue
                for info in per_op.sources:
                    out.update(int(t) for t in map(outermost, info.pointstamps.positive())
                               if t >= since)
        return out

    def frontiers(self) -> dict[str, dict[str, list[Any]]]:
        """Per running dataflow, the input frontier of each top-level operator (by name).

        An empty list means the operator will see no more data.
        """
        report: dict[str, dict[str, list[Any]]] = {}
        for subgraph in self._dataflows.values():
            ops: dict[str, list[Any]] = {}
            for child in subgraph.children[1:]:
                if child.inputs:
                    frontier: list[Any] = []
                    state = subgraph.tracker.node_state(child.index)
                    for port in range(child.inputs):
                        for t in state.targets[port].implications.frontier():
                            if t not in frontier:
                                frontier.append(t)
                    ops[f"{child.index}:{child.name}"] = sorted(frontier)
            report[subgraph.name] = ops
        return report
