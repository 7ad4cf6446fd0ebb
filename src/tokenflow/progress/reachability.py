"""Reachability: the ``Builder`` of a scope's graph and the ``Tracker`` of its pointstamps.

Source: notes on timely-dataflow's ``progress/`` ("Subgraph-Level Reachability Tracker",
"Propagate along the Subgraph", "is_global()"); timely's ``progress/reachability.rs``.

The tracker keeps, for every port, the counts of pointstamps *at* that port (``pointstamps``)
and the counts of frontier elements of upstream ports that could result in a time there
(``implications``, the port's frontier).  ``propagate_all`` moves changes of the former into the
latter along edges (time unchanged) and operator connections (time advanced by the path
summaries), recording every change of a port's frontier in ``pushed()``.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from tokenflow.order.summary import Increment, is_identity
from tokenflow.progress.antichain import Antichain, MutableAntichain
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.progress.location import Location, Source, Target

# nodes[node][input][output] is the Antichain of path summaries from that input to that output.
Connectivity = list[list[Antichain]]


class CycleError(ValueError):
    """A cycle in the dataflow graph along which no summary strictly advances time."""


class Builder:
    """Collects a scope's operators (with their internal summaries) and edges.

    Args:
        identity: the summary that leaves times unchanged (``Increment(0)`` for ``int`` times,
            ``ProductSummary(Increment(0), Increment(0))`` for ``Product`` times).
    """

    def __init__(self, identity: Any = None) -> None:
        self.identity = identity if identity is not None else Increment(0)
        self.nodes: list[Connectivity | None] = []
        self.edges: list[list[list[Location]]] = []
        self.shape: list[tuple[int, int]] = []
        self.names: list[str] = []

    def add_node(
        self,
        index: int,
        inputs: int,
        outputs: int,
        summary: Connectivity,
        name: str | None = None,
    ) -> None:
        """Declare operator ``index`` with ``inputs`` × ``outputs`` summaries.

        Raises:
            ValueError: when ``summary`` is not ``inputs`` lists of ``outputs`` antichains.
        """
        if len(summary) != inputs or any(len(row) != outputs for row in summary):
            raise ValueError(
                f"node {index} ({name or '?'}): summary must be {inputs} x {outputs} antichains"
            )
        while len(self.nodes) <= index:
            self.nodes.append(None)
            self.edges.append([])
            self.shape.append((0, 0))
            self.names.append(f"node {len(self.names)}")
        self.nodes[index] = [[Antichain(a) for a in row] for row in summary]
        self.edges[index] = [[] for _ in range(outputs)]
        self.shape[index] = (inputs, outputs)
        if name is not None:
            self.names[index] = name

    def add_edge(self, source: Location, target: Location) -> None:
        """Connect output ``source`` to input ``target``.

        Raises:
            ValueError: when either end names a port that was not declared.
        """
        if not source.is_source or target.is_source:
            raise ValueError(f"edge must go from a Source to a Target, got {source} -> {target}")
        for loc, count in ((source, 1), (target, 0)):
            if loc.node >= len(self.nodes) or self.nodes[loc.node] is None:
                raise ValueError(f"edge {source} -> {target}: node {loc.node} was not added")
            ports = self.shape[loc.node][count]
            if loc.port >= ports:
                raise ValueError(
                    f"edge {source} -> {target}: {self.names[loc.node]} has only {ports} "
                    f"{'outputs' if count else 'inputs'}"
                )
        self.edges[source.node][source.port].append(target)

    def _check_acyclic(self) -> None:
        """Reject cycles on which every summary is the identity (time never advances)."""
        succ: dict[Location, list[Location]] = {}
        for node, outputs in enumerate(self.edges):
            for port, targets in enumerate(outputs):
                succ.setdefault(Source(node, port), []).extend(targets)
        for node, conn in enumerate(self.nodes):
            if conn is None:
                continue
            for i, row in enumerate(conn):
                for o, antichain in enumerate(row):
                    if any(is_identity(s) for s in antichain):
                        succ.setdefault(Target(node, i), []).append(Source(node, o))
        white, grey, black = 0, 1, 2
        color: dict[Location, int] = {}
        for start in list(succ):
            if color.get(start, white) != white:
                continue
            stack: list[tuple[Location, int]] = [(start, 0)]
            path: list[Location] = [start]
            color[start] = grey
            while stack:
                loc, i = stack[-1]
                nexts = succ.get(loc, [])
                if i < len(nexts):
                    stack[-1] = (loc, i + 1)
                    nxt = nexts[i]
                    c = color.get(nxt, white)
                    if c == grey:
                        cycle = path[path.index(nxt) :] + [nxt]
                        names: list[str] = []
                        for loc2 in cycle:
                            name = self.names[loc2.node]
                            if not names or names[-1] != name:
                                names.append(name)
                        raise CycleError(
                            "dataflow cycle without a strictly advancing path summary: "
                            + " -> ".join(names)
                            + " (add a feedback edge with a non-zero summary)"
                        )
                    if c == white:
                        color[nxt] = grey
                        stack.append((nxt, 0))
                        path.append(nxt)
                else:
                    color[loc] = black
                    stack.pop()
                    path.pop()

    def build(self) -> tuple[Tracker, Connectivity]:
        """Freeze the graph.

        Returns:
            ``(tracker, scope_summary)`` where ``scope_summary[i][o]`` is the antichain of
            summaries from scope input ``i`` (node 0's output ``i``) to scope output ``o``
            (node 0's input ``o``).

        Raises:
            CycleError: for a cycle without a strictly advancing summary, naming its operators.
            ValueError: when node indices are not contiguous from 0.
        """
        for index, conn in enumerate(self.nodes):
            if conn is None:
                raise ValueError(f"node {index} was never added")
        self._check_acyclic()
        tracker = Tracker(self)
        scope_inputs = self.shape[0][1] if self.nodes else 0
        scope_outputs = self.shape[0][0] if self.nodes else 0
        summary: Connectivity = []
        for i in range(scope_inputs):
            port = tracker.per_operator[0].sources[i]
            summary.append([Antichain(port.output_summaries[o]) for o in range(scope_outputs)])
        return tracker, summary


class PortInformation:
    """Per-port state: ``pointstamps`` at the port, ``implications`` (its frontier), and the
    summaries from this port to each scope output."""

    __slots__ = ("pointstamps", "implications", "output_summaries")

    def __init__(self, scope_outputs: int) -> None:
        self.pointstamps = MutableAntichain()
        self.implications = MutableAntichain()
        self.output_summaries: list[Antichain] = [Antichain() for _ in range(scope_outputs)]

    def is_global(self, time: Any) -> bool:
        """True when the single pointstamp ``(self, time)`` alone holds the frontier here."""
        dominated = self.implications.less_than(time)
        redundant = self.implications.count_for(time) > 1
        return not dominated and not redundant


class PerOperator:
    """Port information for every input (``targets``) and output (``sources``) of a node."""

    __slots__ = ("targets", "sources")

    def __init__(self, inputs: int, outputs: int, scope_outputs: int) -> None:
        self.targets = [PortInformation(scope_outputs) for _ in range(inputs)]
        self.sources = [PortInformation(scope_outputs) for _ in range(outputs)]


class Tracker:
    """Tracks pointstamp counts and propagates their implications through a scope.

    Feed actual events with ``update_source`` / ``update_target`` (capability changes at
    outputs; messages sent to / consumed at inputs), then call ``propagate_all``; read the
    frontier changes of every port from ``pushed()`` and of the scope outputs (node 0's inputs)
    from ``pushed_output()``.
    """

    def __init__(self, builder: Builder) -> None:
        self.nodes: list[Connectivity] = [c for c in builder.nodes if c is not None]
        self.edges = builder.edges
        self.names = builder.names
        scope_outputs = builder.shape[0][0] if builder.nodes else 0
        self.per_operator = [
            PerOperator(inputs, outputs, scope_outputs) for inputs, outputs in builder.shape
        ]
        self.target_changes: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.source_changes: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.worklist: list[tuple[Any, Location, int]] = []
        self._pushed: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.output_changes: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(scope_outputs)]
        self.total_counts = 0
        self._summarize_outputs(builder.identity, scope_outputs)

    def _summarize_outputs(self, identity: Any, scope_outputs: int) -> None:
        """Least summaries from every port to every scope output (backwards search)."""
        reverse: dict[Location, list[Location]] = {}
        for node, outputs in enumerate(self.edges):
            for port, targets in enumerate(outputs):
                for target in targets:
                    reverse.setdefault(target, []).append(Source(node, port))
        work: deque[tuple[Location, int, Any]] = deque(
            (Target(0, o), o, identity) for o in range(scope_outputs)
        )
        while work:
            loc, output, summary = work.popleft()
            if loc.is_source:
                for input_port, row in enumerate(self.nodes[loc.node]):
                    for op_summary in row[loc.port]:
                        combined = op_summary.followed_by(summary)
                        if combined is None:
                            continue
                        info = self.per_operator[loc.node].targets[input_port]
                        if info.output_summaries[output].insert(combined):
                            work.append((Target(loc.node, input_port), output, combined))
            else:
                for source in reverse.get(loc, ()):
                    info = self.per_operator[source.node].sources[source.port]
                    if info.output_summaries[output].insert(summary):
                        work.append((source, output, summary))

    # -- updates ---------------------------------------------------------------------------

    def update_target(self, target: Location, time: Any, diff: int) -> None:
        """Messages at ``time`` sent to (+) or consumed at (-) input ``target``."""
        self.target_changes.update((target, time), diff)

    def update_source(self, source: Location, time: Any, diff: int) -> None:
        """Capabilities at ``time`` acquired (+) or released (-) at output ``source``."""
        self.source_changes.update((source, time), diff)

    def update(self, location: Location, time: Any, diff: int) -> None:
        """``update_source`` or ``update_target`` by the kind of ``location``."""
        if location.is_source:
            self.source_changes.update((location, time), diff)
        else:
            self.target_changes.update((location, time), diff)

    # -- propagation -----------------------------------------------------------------------

    def _absorb(self, changes: ChangeBatch[tuple[Location, Any]]) -> None:
        worklist = self.worklist
        for (loc, time), diff in changes.drain():
            per_op = self.per_operator[loc.node]
            info = per_op.sources[loc.port] if loc.is_source else per_op.targets[loc.port]
            for t, d in info.pointstamps.update(time, diff):
                self.total_counts += d
                for output, summaries in enumerate(info.output_summaries):
                    out_changes = self.output_changes[output]
                    for summary in summaries:
                        out_time = summary.results_in(t)
                        if out_time is not None:
                            out_changes.update(out_time, d)
                heapq.heappush(worklist, (t, loc, d))

    def propagate_all(self) -> None:
        """Propagate buffered pointstamp changes to every port's implications (frontier)."""
        self._absorb(self.target_changes)
        self._absorb(self.source_changes)
        worklist = self.worklist
        heappop = heapq.heappop
        pushed = self._pushed
        nodes = self.nodes
        edges = self.edges
        per_operator = self.per_operator
        while worklist:
            time, loc, diff = heappop(worklist)
            while worklist and worklist[0][0] == time and worklist[0][1] == loc:
                diff += heappop(worklist)[2]
            if not diff:
                continue
            node, port, is_source = loc
            if is_source:
                info = per_operator[node].sources[port]
                for t, d in info.implications.update(time, diff):
                    for target in edges[node][port]:
                        heapq.heappush(worklist, (t, target, d))
                    pushed.update((loc, t), d)
            else:
                info = per_operator[node].targets[port]
                for t, d in info.implications.update(time, diff):
                    for output, summaries in enumerate(nodes[node][port]):
                        source = Location(node, output, True)
                        for summary in summaries:
                            new_time = summary.results_in(t)
                            if new_time is not None:
                                heapq.heappush(worklist, (new_time, source, d))
                    pushed.update((loc, t), d)

    # -- queries ---------------------------------------------------------------------------

    def pushed(self) -> ChangeBatch[tuple[Location, Any]]:
        """Frontier changes ``((location, time), ±1)`` produced by ``propagate_all`` (drain it)."""
        return self._pushed

    def pushed_output(self) -> list[ChangeBatch[Any]]:
        """Per scope output, changes of the times that pointstamps could result in there."""
        return self.output_changes

    def is_global(self, location: Location, time: Any) -> bool:
        """True when the pointstamp ``(location, time)`` alone holds back the frontier there."""
        per_op = self.per_operator[location.node]
        info = per_op.sources[location.port] if location.is_source else per_op.targets[location.port]
        return info.is_global(time)

    def tracking_anything(self) -> bool:
        """True while any pointstamp is outstanding in the scope."""
        return self.total_counts > 0

    def node_state(self, node: int) -> PerOperator:
        return self.per_operator[node]

    def frontier(self, location: Location) -> list[Any]:
        """The current frontier (implications) at ``location``."""
        per_op = self.per_operator[location.node]
        info = per_op.sources[location.port] if location.is_source else per_op.targets[location.port]
        return info.implications.frontier()
