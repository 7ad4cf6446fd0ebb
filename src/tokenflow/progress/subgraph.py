"""``Subgraph``: a scope of child operators whose progress it tracks.

Source: notes on timely-dataflow's ``progress/`` ("Subgraph", "Schedule", "Extract Progress"); timely's
``progress/subgraph.rs``.  Child 0 stands for the world outside the scope: its outputs are the
scope's inputs and its inputs are the scope's outputs.  A subgraph is itself an operator of its
parent scope (``Operate``): it turns the parent's frontier into pointstamps at child 0's outputs
(``accept_frontier``), counts records entering the scope (``harvest_inputs``), exchanges its
children's progress with its peers through a ``Progcaster`` and reports to the parent, as
consumed / produced records and internal capabilities, what it learned (``propagate_pointstamps``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Protocol

from tokenflow.progress.antichain import Antichain, MutableAntichain
from tokenflow.progress.broadcast import Progcaster
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.progress.location import Location, Source
from tokenflow.progress.operate import Operate
from tokenflow.progress.reachability import Builder, Connectivity
from tokenflow.progress.shared_progress import SharedProgress


class Activations(Protocol):
    """The worker's record of which operator paths asked to be scheduled."""

    def activate(self, path: tuple[int, ...]) -> None: ...

    def for_extensions(self, path: tuple[int, ...]) -> list[int]: ...


class PerOperatorState:
    """A child of a subgraph: the operator, its edges and its shared progress."""

    __slots__ = (
        "name",
        "index",
        "local",
        "notify",
        "inputs",
        "outputs",
        "operator",
        "edges",
        "weights",
        "shared_progress",
        "internal_summary",
    )

    def __init__(self, operator: Operate | None, index: int, inputs: int, outputs: int) -> None:
        self.index = index
        self.operator = operator
        self.inputs = inputs
        self.outputs = outputs
        self.edges: list[list[Location]] = [[] for _ in range(outputs)]
        # Per edge, how many copies of each produced record it delivers in total across
        # workers (``peers`` for a broadcast channel, else 1).
        self.weights: list[list[int]] = [[] for _ in range(outputs)]
        if operator is None:
            self.name = "External"
            self.local = False
            self.notify = True
            self.shared_progress = SharedProgress(inputs, outputs)
            self.internal_summary: Connectivity = []
        else:
            self.name = operator.name
            self.local = operator.local
            self.notify = operator.notify
            summary, shared = operator.get_internal_summary()
            if len(summary) != inputs or any(len(row) != outputs for row in summary):
                raise ValueError(f"operator {self.name!r}: summary shape does not match its ports")
            self.internal_summary = summary
            self.shared_progress = shared

    def schedule(self) -> bool:
        if self.operator is not None:
            return self.operator.schedule()
        if any(not f.is_empty() for f in self.shared_progress.frontiers):
            raise RuntimeError(f"operator {self.name!r} was shut down but still receives progress")
        return False

    def shut_down(self) -> None:
        if self.operator is not None:
            self.operator = None
            self.name = f"{self.name}(shut down)"

    def extract_progress(self, pointstamps: ChangeBatch[Any], temp_active: list[int]) -> None:
        """Move consumeds, internals and produceds into pointstamp changes of this scope."""
        sp = self.shared_progress
        index = self.index
        for port, consumed in enumerate(sp.consumeds):
            if consumed._updates:
                target = Location(index, port, False)
                for time, delta in consumed.drain():
                    pointstamps.update((target, time), -delta)
        for port, internal in enumerate(sp.internals):
            if internal._updates:
                source = Location(index, port, True)
                for time, delta in internal.drain():
                    pointstamps.update((source, time), delta)
        for port, produced in enumerate(sp.produceds):
            if produced._updates:
                targets = self.edges[port]
                weights = self.weights[port]
                for time, delta in produced.drain():
                    for target, weight in zip(targets, weights, strict=True):
                        pointstamps.update((target, time), delta * weight)
                for target in targets:
                    heapq.heappush(temp_active, target.node)


class SubgraphBuilder:
    """Collects a scope's children and edges before the ``Subgraph`` is frozen.

    Args:
        name: the scope's name (shown in errors).
        path: the worker-unique path of this scope (its index within each ancestor).
        identity: the identity path summary of the scope's timestamps.
        to_inner: maps a parent time to this scope's time (``t -> Product(t, 0)``).
        to_outer: maps this scope's time to the parent's (``Product(t, i) -> t``).
        summarize: maps an inner path summary to the parent's (``ProductSummary -> .outer``).
    """

    def __init__(
        self,
        name: str,
        path: tuple[int, ...],
        identity: Any,
        to_inner: Callable[[Any], Any] = lambda t: t,
        to_outer: Callable[[Any], Any] = lambda t: t,
        summarize: Callable[[Any], Any] = lambda s: s,
    ) -> None:
        self.name = name
        self.path = path
        self.identity = identity
        self.to_inner = to_inner
        self.to_outer = to_outer
        self.summarize = summarize
        self.children: list[PerOperatorState | None] = [None]
        self.child_count = 1
        self.edge_stash: list[tuple[Location, Location, int]] = []
        self.per_worker_edges: set[tuple[Location, Location]] = set()
        self.input_messages: list[ChangeBatch[Any]] = []
        self.output_capabilities: list[MutableAntichain] = []

    def allocate_child_id(self) -> int:
        """Reserve the index of the next child."""
        index = self.child_count
        self.child_count += 1
        self.children.append(None)
        return index

    def add_child(self, operator: Operate, index: int) -> None:
        """Install ``operator`` at the reserved ``index``."""
        self.children[index] = PerOperatorState(operator, index, operator.inputs, operator.outputs)

    def connect(self, source: Location, target: Location, weight: int = 1,
                per_worker: bool = False) -> None:
        """Record the edge ``source → target``; ``weight`` is the number of copies of each
        record the edge's channel delivers across workers (``peers`` for broadcast);
        ``per_worker``: one copy per worker of the roster, so the weight follows the roster
        when workers join or leave (``Subgraph.set_copies``)."""
        self.edge_stash.append((source, target, weight))
        if per_worker:
            self.per_worker_edges.add((source, target))

    def new_input(self) -> tuple[int, ChangeBatch[Any]]:
        """A new scope input; returns its index and the counter the ingress pusher writes."""
        counter: ChangeBatch[Any] = ChangeBatch()
        self.input_messages.append(counter)
        return len(self.input_messages) - 1, counter

    def new_output(self) -> int:
        """A new scope output; returns its index."""
        self.output_capabilities.append(MutableAntichain())
        return len(self.output_capabilities) - 1

    def child_name(self, index: int) -> str:
        child = self.children[index] if index < len(self.children) else None
        return child.name if child is not None else f"child {index}"

    def build(self, progcaster: Progcaster, activations: Activations) -> Subgraph:
        """Freeze the scope: check the graph and build its reachability tracker.

        Raises:
            CycleError: for a cycle without a strictly advancing summary.
            RuntimeError: when a reserved child index was never filled.
        """
        inputs = len(self.input_messages)
        outputs = len(self.output_capabilities)
        self.children[0] = PerOperatorState(None, 0, outputs, inputs)
        builder = Builder(self.identity)
        builder.add_node(0, outputs, inputs, [[Antichain() for _ in range(inputs)]
                                              for _ in range(outputs)], name=f"{self.name}(scope)")
        for index, child in enumerate(self.children):
            if child is None:
                raise RuntimeError(f"scope {self.name!r}: child {index} was reserved but not built")
            if index:
                builder.add_node(index, child.inputs, child.outputs, child.internal_summary,
                                 name=child.name, notify=child.notify)
        for source, target, weight in self.edge_stash:
            builder.add_edge(source, target)
            child = self.children[source.node]
            assert child is not None
            child.edges[source.port].append(target)
            child.weights[source.port].append(weight)
        tracker, scope_summary = builder.build()
        return Subgraph(self, tracker, scope_summary, progcaster, activations)


class Subgraph:
    """A frozen scope: schedules its children and tracks their progress (``Operate``)."""

    local = False
    notify = True

    def __init__(
        self,
        builder: SubgraphBuilder,
        tracker: Any,
        scope_summary: Connectivity,
        progcaster: Progcaster,
        activations: Activations,
    ) -> None:
        self.name = builder.name
        self.path = builder.path
        self.inputs = len(builder.input_messages)
        self.outputs = len(builder.output_capabilities)
        self.children: list[PerOperatorState] = [c for c in builder.children if c is not None]
        self.incomplete = [True] * len(self.children)
        self.incomplete[0] = False
        self.incomplete_count = len(self.children) - 1
        self.activations = activations
        self.temp_active: list[int] = []
        self.input_messages = builder.input_messages
        self.output_capabilities = builder.output_capabilities
        self.local_pointstamp: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.final_pointstamp: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.tracker = tracker
        self.progcaster = progcaster
        self._per_worker = [(c, port, i) for c in self.children for port, targets in
                            enumerate(c.edges) for i, target in enumerate(targets)
                            if (Location(c.index, port, True), target) in builder.per_worker_edges]
        self.accumulated: ChangeBatch[tuple[Location, Any]] | None = None
        """Every pointstamp change this scope applied, consolidated (``track_state``): the
        progress state a worker joining the job starts from."""
        self.shared_progress = SharedProgress(self.inputs, self.outputs)
        self.scope_summary = scope_summary
        self.to_inner = builder.to_inner
        self.to_outer = builder.to_outer
        self.summarize = builder.summarize
        activations.activate(self.path)

    # -- Operate ---------------------------------------------------------------------------

    def get_internal_summary(self) -> tuple[Connectivity, SharedProgress]:
        """Summaries from scope inputs to outputs (in parent time) and initial capabilities."""
        summary: Connectivity = [
            [Antichain() for _ in range(self.outputs)] for _ in range(self.inputs)
        ]
        for i, row in enumerate(self.scope_summary):
            for o, antichain in enumerate(row):
                for s in antichain:
                    summary[i][o].insert(self.summarize(s))
        for child in self.children:
            child.extract_progress(self.final_pointstamp, self.temp_active)
        self.propagate_pointstamps()
        return summary, self.shared_progress

    def set_external_summary(self) -> None:
        self.propagate_pointstamps()
        for child in self.children:
            if child.operator is not None:
                child.operator.set_external_summary()

    def schedule(self) -> bool:
        """Accept the parent's frontier, exchange progress, run active children, send progress.

        Returns True while any child is incomplete or any pointstamp is outstanding.
        """
        self.accept_frontier()
        self.harvest_inputs()
        self.progcaster.recv(self.final_pointstamp)
        self.propagate_pointstamps()
        temp_active = self.temp_active
        for index in self.activations.for_extensions(self.path):
            heapq.heappush(temp_active, index)
        previous = 0
        while temp_active:
            index = heapq.heappop(temp_active)
            if index > previous:
                self.activate_child(index)
                previous = index
        self.progcaster.send(self.local_pointstamp)
        if not self.final_pointstamp.is_empty():
            self.activations.activate(self.path)
        return self.incomplete_count > 0 or self.tracker.tracking_anything()

    # -- internals -------------------------------------------------------------------------

    def activate_child(self, index: int) -> bool:
        child = self.children[index]
        if not child.notify:  # its frontiers were not pushed: it reads them only now
            frontiers = child.shared_progress.frontiers
            for (location, time), diff in self.tracker.lazy_changes(index):
                frontiers[location.port].update(time, diff)
        incomplete = child.schedule()
        if incomplete != self.incomplete[index]:
            self.incomplete_count += 1 if incomplete else -1
            self.incomplete[index] = incomplete
        if not incomplete and child.operator is not None and self.tracker.is_done(index):
            child.shut_down()
        if child.local:
            child.extract_progress(self.local_pointstamp, self.temp_active)
        else:
            child.extract_progress(self.final_pointstamp, self.temp_active)
        return incomplete

    def accept_frontier(self) -> None:
        """Move the parent's frontier changes into pointstamps at child 0's outputs."""
        to_inner = self.to_inner
        for port, changes in enumerate(self.shared_progress.frontiers):
            if changes._updates:
                source = Source(0, port)
                for time, diff in changes.drain():
                    self.tracker.update_source(source, to_inner(time), diff)

    def harvest_inputs(self) -> None:
        """Count records that entered the scope as messages at the inputs they feed."""
        for port, counter in enumerate(self.input_messages):
            if counter._updates:
                source = Source(0, port)
                targets = self.children[0].edges[port]
                weights = self.children[0].weights[port]
                for time, delta in counter.drain():
                    for target, weight in zip(targets, weights, strict=True):
                        self.local_pointstamp.update((target, time), delta * weight)
                    self.local_pointstamp.update((source, time), -delta)

    def propagate_pointstamps(self) -> None:
        """Apply exchanged changes, propagate, and hand frontiers to children and the parent."""
        sp = self.shared_progress
        to_outer = self.to_outer
        tracker = self.tracker
        for (location, time), delta in self.final_pointstamp.drain():
            if location.node == 0:
                if location.is_source:
                    sp.consumeds[location.port].update(to_outer(time), -delta)
                else:
                    sp.produceds[location.port].update(to_outer(time), delta)
            else:
                tracker.update(location, time, delta)
                if self.accumulated is not None:
                    self.accumulated.update((location, time), delta)
        tracker.propagate_all()
        children = self.children
        temp_active = self.temp_active
        for (location, time), diff in tracker.pushed().drain():
            if not location.is_source:
                child = children[location.node]
                if child.notify:
                    heapq.heappush(temp_active, location.node)
                child.shared_progress.frontiers[location.port].update(time, diff)
        for output, changes in enumerate(tracker.pushed_output()):
            if changes._updates:
                outer = [(to_outer(t), d) for t, d in changes.drain()]
                for t, d in self.output_capabilities[output].update_iter(outer):
                    sp.internals[output].update(t, d)

    # -- membership (workers joining and leaving a running job) ---------------------------

    def track_state(self) -> None:
        """Keep the accumulated pointstamp changes from now on (call before
        ``get_internal_summary``, which applies the initial tokens), so that this worker can
        bootstrap a joining one (``progress_state``).

        Raises:
            NotImplementedError: the scope has nested scopes (their trackers are not
                bootstrapped yet).
        """
        nested = [c.name for c in self.children[1:] if not c.local]
        if nested:
            raise NotImplementedError(
                f"scope {self.name!r}: workers cannot join a job whose dataflow has nested "
                f"scopes yet ({', '.join(nested)})")
        if self.accumulated is None:
            self.accumulated = ChangeBatch()

    def progress_state(self) -> tuple[dict[int, int], list[tuple[tuple[Location, Any], int]]]:
        """``(received, counts)``: per sender, how many of its progress batches the counts
        include, and the scope's pointstamp counts (Selvatici's "progress state": the
        accumulation plus the last sequence number included per worker).  Taken between
        steps, when every received batch has been applied.

        Raises:
            RuntimeError: ``track_state`` was not called.
        """
        if self.accumulated is None:
            raise RuntimeError(f"scope {self.name!r} does not track its progress state")
        return dict(self.progcaster.received), self.accumulated.iter()

    def bootstrap(self, received: dict[int, int],
                  counts: list[tuple[tuple[Location, Any], int]]) -> None:
        """Start a joining worker's tracker from a running worker's ``progress_state``; the
        batches each sender sent before ``received[sender]`` are skipped when they arrive."""
        self.progcaster.bootstrap(received)
        if self.accumulated is not None:
            self.accumulated = ChangeBatch()
        for (location, time), delta in counts:
            self.final_pointstamp.update((location, time), delta)
        self.propagate_pointstamps()

    def set_copies(self, copies: int) -> None:
        """The number of workers a per-worker (broadcast) edge now delivers to."""
        for child, port, i in self._per_worker:
            child.weights[port][i] = copies

    def tracked_frontier(self, location: Location) -> list[Any]:
        """The frontier at ``location`` of this scope (for inspection and tests)."""
        return self.tracker.frontier(location)

