"""Reachability: the ``Builder`` of a scope's graph and the ``Tracker`` of its pointstamps.

Source: notes on timely-dataflow's ``progress/`` ("Subgraph-Level Reachability Tracker",
"Propagate along the Subgraph", "is_global()"); timely's ``progress/reachability.rs``.

The tracker keeps, for every port, the counts of pointstamps *at* that port (``pointstamps``)
and, for the ports whose frontier someone watches as it changes (*observed* ports: inputs of
operators that ``notify``, and every port on a cycle), the counts of upstream frontier elements
that could result in a time there (``implications``, the port's frontier).  ``propagate_all``
moves changes of the former into the latter along arcs precomputed from each port to the
first observed ports downstream (path summaries composed over the unobserved ports between),
recording every change of an observed port's frontier in ``pushed()``.  The frontier of any
other port is computed from its predecessors' when asked (``frontier``, ``lazy_changes``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from tokenflow.order.partial_order import less_equal
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
        self.notify: list[bool] = []

    def add_node(
        self,
        index: int,
        inputs: int,
        outputs: int,
        summary: Connectivity,
        name: str | None = None,
        notify: bool = True,
    ) -> None:
        """Declare operator ``index`` with ``inputs`` × ``outputs`` summaries.

        ``notify``: the operator reads its input frontiers as they change (is scheduled when
        they do), so the tracker maintains them eagerly; without it they are computed when
        asked (``Tracker.lazy_changes``, ``Tracker.frontier``).

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
            self.notify.append(True)
        self.nodes[index] = [[Antichain(a) for a in row] for row in summary]
        self.edges[index] = [[] for _ in range(outputs)]
        self.shape[index] = (inputs, outputs)
        self.notify[index] = notify
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


Summaries = tuple[Any, ...] | None
"""The path summaries of an arc of the tracker's graph; None for the identity (time unchanged),
which is ≤ every summary."""


def _compose(first: Summaries, second: Summaries) -> Summaries:
    """The minimal summaries of ``first`` followed by ``second`` (``()``: no time survives)."""
    if first is None:
        return second
    if second is None:
        return first
    composed = Antichain()
    for a in first:
        for b in second:
            c = a.followed_by(b)
            if c is not None:
                composed.insert(c)
    return tuple(composed)


def _merge(arcs: dict[Location, Summaries], location: Location, summaries: Summaries) -> None:
    """Add ``summaries`` to the arc to ``location`` (keeping the minimal ones)."""
    if location not in arcs:
        arcs[location] = summaries
        return
    old = arcs[location]
    if old is None or summaries is None:
        arcs[location] = None
    else:
        arcs[location] = tuple(Antichain(old + summaries))


def _minimal(times: list[Any]) -> list[Any]:
    """The minimal elements of ``times`` (a fresh list; ``times`` may be reordered)."""
    if len(times) < 2:
        return times
    if times[0].__class__ is int:
        return [min(times)]
    times.sort()  # a total order extending the partial order: no time after one below it
    out: list[Any] = []
    for t in times:
        if not any(less_equal(f, t) for f in out):
            out.append(t)
    return out


def _on_cycles(succ: dict[Location, list[tuple[Location, Summaries]]]) -> set[Location]:
    """The locations of the strongly connected components with more than one location."""
    index: dict[Location, int] = {}
    low: dict[Location, int] = {}
    stack: list[Location] = []
    on_stack: set[Location] = set()
    cyclic: set[Location] = set()
    for root in succ:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, 0)]
        while work:
            loc, i = work[-1]
            nexts = succ[loc]
            if i < len(nexts):
                work[-1] = (loc, i + 1)
                nxt = nexts[i][0]
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[loc] = min(low[loc], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[loc])
            if low[loc] == index[loc]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == loc:
                        break
                if len(component) > 1:
                    cyclic.update(component)
    return cyclic


class PortInformation:
    """Per-port state of the tracker.

    * ``pointstamps``: counts of the pointstamps *at* this port;
    * ``implications``: its frontier, maintained only when ``observed`` (see ``Tracker``);
    * ``output_summaries[o]``: the summaries from this port to scope output ``o``;
    * ``forward``: the arcs ``(observed location, summaries)`` from this port to the first
      observed ports on its paths, summaries composed along the unobserved ports in between;
    * ``backward``: the arcs ``(port, summaries)`` from its direct predecessors;
    * ``delivered``: for an unobserved input, the frontier last reported by ``lazy_changes``.
    """

    __slots__ = ("location", "pointstamps", "implications", "output_summaries", "observed",
                 "forward", "backward", "delivered")

    def __init__(self, location: Location, scope_outputs: int) -> None:
        self.location = location
        self.pointstamps = MutableAntichain()
        self.implications = MutableAntichain()
        self.output_summaries: list[Antichain] = [Antichain() for _ in range(scope_outputs)]
        self.observed = True
        self.forward: list[tuple[Location, Summaries]] = []
        self.backward: list[tuple[PortInformation, Summaries]] = []
        self.delivered: list[Any] = []


class PerOperator:
    """Port information for every input (``targets``) and output (``sources``) of a node;
    ``lazy``: its inputs whose frontier is computed when asked."""

    __slots__ = ("targets", "sources", "lazy")

    def __init__(self, node: int, inputs: int, outputs: int, scope_outputs: int) -> None:
        self.targets = [PortInformation(Target(node, i), scope_outputs) for i in range(inputs)]
        self.sources = [PortInformation(Source(node, o), scope_outputs) for o in range(outputs)]
        self.lazy: list[PortInformation] = []


class Tracker:
    """Tracks pointstamp counts and propagates their implications through a scope.

    Feed actual events with ``update_source`` / ``update_target`` (capability changes at
    outputs; messages sent to / consumed at inputs), then call ``propagate_all``; read the
    frontier changes of the observed ports from ``pushed()``, those of a node's other inputs
    from ``lazy_changes(node)`` and of the scope outputs (node 0's inputs) from
    ``pushed_output()``.

    *Observed* ports are the inputs of nodes declared with ``notify`` and every port on a cycle.
    Only their frontiers are maintained as pointstamps change: a change travels along
    precomputed arcs from port to observed port, so its cost does not grow with the number of
    unobserved ports in between (a chain of operators that never look at their frontier costs
    nothing).  The frontier of an unobserved port is computed when asked, from its direct
    predecessors' (memoized until the next ``propagate_all`` that changes anything); unobserved
    ports form no cycle, so this terminates.  Both are exact: a frontier is the set of minimal
    times that any positively counted pointstamp could result in at the port.
    """

    def __init__(self, builder: Builder) -> None:
        self.nodes: list[Connectivity] = [c for c in builder.nodes if c is not None]
        self.edges = builder.edges
        self.names = builder.names
        scope_outputs = builder.shape[0][0] if builder.nodes else 0
        self.per_operator = [
            PerOperator(node, inputs, outputs, scope_outputs)
            for node, (inputs, outputs) in enumerate(builder.shape)
        ]
        self.target_changes: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.source_changes: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.worklist: list[tuple[Any, Location, int]] = []
        self._pushed: ChangeBatch[tuple[Location, Any]] = ChangeBatch()
        self.output_changes: list[ChangeBatch[Any]] = [ChangeBatch() for _ in range(scope_outputs)]
        self.total_counts = 0
        self._round = 0  # advanced whenever a pointstamp frontier changes
        self._memo: dict[PortInformation, list[Any]] = {}  # unobserved frontiers this round
        self._memo_round = 0
        succ = self._successors(builder.identity)
        cyclic = _on_cycles(succ)
        for node, per_op in enumerate(self.per_operator):
            for info in per_op.sources:
                info.observed = info.location in cyclic
            for info in per_op.targets:
                info.observed = builder.notify[node] or info.location in cyclic
            per_op.lazy = [info for info in per_op.targets if not info.observed]
        for loc, nexts in succ.items():
            for nxt, summaries in nexts:
                self._port(nxt).backward.append((self._port(loc), summaries))
        self._compress(succ)
        self._summarize_outputs(builder.identity, scope_outputs)

    def _port(self, location: Location) -> PortInformation:
        per_op = self.per_operator[location.node]
        return per_op.sources[location.port] if location.is_source else per_op.targets[location.port]

    def _successors(self, identity: Any) -> dict[Location, list[tuple[Location, Summaries]]]:
        """The direct arcs of the graph: edges (identity) and operators' internal summaries."""
        succ: dict[Location, list[tuple[Location, Summaries]]] = {}
        for node, outputs in enumerate(self.edges):
            for port, targets in enumerate(outputs):
                succ[Source(node, port)] = [(target, None) for target in targets]
        for node, conn in enumerate(self.nodes):
            for i, row in enumerate(conn):
                arcs: list[tuple[Location, Summaries]] = []
                for o, antichain in enumerate(row):
                    summaries = tuple(antichain)
                    if summaries:
                        identical = len(summaries) == 1 and summaries[0] == identity
                        arcs.append((Source(node, o), None if identical else summaries))
                succ[Target(node, i)] = arcs
        return succ

    def _compress(self, succ: dict[Location, list[tuple[Location, Summaries]]]) -> None:
        """Set every port's ``forward`` arcs: to the observed ports it reaches through
        unobserved ones only (depth first over the unobserved ports, which form no cycle)."""
        arcs: dict[Location, dict[Location, Summaries]] = {}
        for root in succ:
            stack = [root]
            while stack:
                loc = stack[-1]
                if loc in arcs:
                    stack.pop()
                    continue
                pending = [n for n, _ in succ[loc] if not self._port(n).observed and n not in arcs]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                merged: dict[Location, Summaries] = {}
                for nxt, summaries in succ[loc]:
                    if self._port(nxt).observed:
                        _merge(merged, nxt, summaries)
                        continue
                    for far, more in arcs[nxt].items():
                        composed = _compose(summaries, more)
                        if composed != ():
                            _merge(merged, far, composed)
                arcs[loc] = merged
        for loc, merged in arcs.items():
            self._port(loc).forward = list(merged.items())

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
        per_operator = self.per_operator
        for (loc, time), diff in changes.drain():
            per_op = per_operator[loc.node]
            info = per_op.sources[loc.port] if loc.is_source else per_op.targets[loc.port]
            for t, d in info.pointstamps.update(time, diff):
                self._round += 1
                self.total_counts += d
                for output, summaries in enumerate(info.output_summaries):
                    out_changes = self.output_changes[output]
                    for summary in summaries:
                        out_time = summary.results_in(t)
                        if out_time is not None:
                            out_changes.update(out_time, d)
                if info.observed:
                    heapq.heappush(worklist, (t, loc, d))
                else:
                    _push_forward(worklist, info.forward, t, d)

    def propagate_all(self) -> None:
        """Propagate buffered pointstamp changes to the observed ports' frontiers."""
        self._absorb(self.target_changes)
        self._absorb(self.source_changes)
        worklist = self.worklist
        heappop = heapq.heappop
        pushed = self._pushed
        per_operator = self.per_operator
        while worklist:
            time, loc, diff = heappop(worklist)
            while worklist and worklist[0][0] == time and worklist[0][1] == loc:
                diff += heappop(worklist)[2]
            if not diff:
                continue
            node, port, is_source = loc
            per_op = per_operator[node]
            info = per_op.sources[port] if is_source else per_op.targets[port]
            for t, d in info.implications.update(time, diff):
                _push_forward(worklist, info.forward, t, d)
                pushed.update((loc, t), d)

    # -- queries ---------------------------------------------------------------------------

    def pushed(self) -> ChangeBatch[tuple[Location, Any]]:
        """Frontier changes ``((location, time), ±1)`` of the observed ports, produced by
        ``propagate_all`` (drain it)."""
        return self._pushed

    def pushed_output(self) -> list[ChangeBatch[Any]]:
        """Per scope output, changes of the times that pointstamps could result in there."""
        return self.output_changes

    def observes(self, location: Location) -> bool:
        """True when ``location``'s frontier is maintained as pointstamps change (its changes
        appear in ``pushed()``); otherwise it is computed when asked."""
        return self._port(location).observed

    def lazy_changes(self, node: int) -> list[tuple[tuple[Location, Any], int]]:
        """Changes ``((Target, time), ±1)`` of ``node``'s unobserved input frontiers since the
        previous call (the first call reports them from empty).

        A scope calls this before it schedules an operator without ``notify``, which reads its
        input frontiers only while it runs.
        """
        lazy = self.per_operator[node].lazy
        if not lazy:
            return []
        changes: list[tuple[tuple[Location, Any], int]] = []
        for info in lazy:
            new = self._lazy_frontier(info)
            old = info.delivered
            if new != old:
                changes.extend(((info.location, t), -1) for t in old if t not in new)
                changes.extend(((info.location, t), 1) for t in new if t not in old)
                info.delivered = new
        return changes

    def _lazy_frontier(self, info: PortInformation) -> list[Any]:
        """The frontier of the unobserved port ``info`` (a list the caller must not change)."""
        memo = self._memo
        if self._memo_round != self._round:
            memo.clear()
            self._memo_round = self._round
        frontier = memo.get(info)
        if frontier is not None:
            return frontier
        stack = [info]
        while stack:  # predecessors first; the unobserved ports form no cycle
            top = stack[-1]
            pending = [p for p, _ in top.backward if not p.observed and p not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if top not in memo:
                memo[top] = _minimal(self._contributions(top))
        return memo[info]

    def _contributions(self, info: PortInformation) -> list[Any]:
        """The times at ``info`` from its own pointstamps' frontier and from each element of
        each direct predecessor's frontier, once per minimal summary (with repetitions)."""
        times = info.pointstamps.frontier()
        for pred, summaries in info.backward:
            frontier = pred.implications.frontier() if pred.observed else self._lazy_frontier(pred)
            if summaries is None:
                times.extend(frontier)
                continue
            for t in frontier:
                for summary in summaries:
                    result = summary.results_in(t)
                    if result is not None:
                        times.append(result)
        return times

    def _implications(self, info: PortInformation) -> MutableAntichain:
        if info.observed:
            return info.implications
        implications = MutableAntichain()
        implications.update_iter((t, 1) for t in self._contributions(info))
        return implications

    def is_global(self, location: Location, time: Any) -> bool:
        """True when the pointstamps at ``(location, time)`` alone hold back the frontier there:
        ``time`` is minimal among them and no other pointstamp could result in ``time`` or
        earlier at ``location``."""
        info = self._port(location)
        if time not in info.pointstamps.frontier():
            return False
        implications = self._implications(info)
        return not implications.less_than(time) and implications.count_for(time) == 1

    def tracking_anything(self) -> bool:
        """True while any pointstamp is outstanding in the scope."""
        return self.total_counts > 0

    def is_done(self, node: int) -> bool:
        """True when ``node`` holds no capability and no input of it may receive more data."""
        per_op = self.per_operator[node]
        return all(s.pointstamps.is_empty() for s in per_op.sources) and all(
            (t.implications.is_empty() if t.observed else not self._lazy_frontier(t))
            for t in per_op.targets
        )

    def node_state(self, node: int) -> PerOperator:
        """The port information of ``node``, with the ``implications`` of its unobserved ports
        computed now (a count per contribution of a direct predecessor or own pointstamp)."""
        per_op = self.per_operator[node]
        for info in (*per_op.targets, *per_op.sources):
            if not info.observed:
                info.implications = self._implications(info)
        return per_op

    def frontier(self, location: Location) -> list[Any]:
        """The current frontier at ``location`` (a fresh list)."""
        info = self._port(location)
        return info.implications.frontier() if info.observed else list(self._lazy_frontier(info))


def _push_forward(
    worklist: list[tuple[Any, Location, int]],
    forward: list[tuple[Location, Summaries]],
    time: Any,
    diff: int,
) -> None:
    """Queue ``(time, diff)`` along each of ``forward``'s arcs."""
    for target, summaries in forward:
        if summaries is None:
            heapq.heappush(worklist, (time, target, diff))
            continue
        for summary in summaries:
            result = summary.results_in(time)
            if result is not None:
                heapq.heappush(worklist, (result, target, diff))
