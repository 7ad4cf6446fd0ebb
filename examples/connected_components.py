"""Connected components by label propagation in an iterative scope.

Every node starts with its own id as label; inside ``scope.iterative`` a keyed operator (records
exchanged by node) keeps each node's best (least) label and, whenever a node's label decreases,
sends the new label to the node's neighbours through a ``feedback`` edge (one iteration per
hop).  Labels that do not improve are dropped, so once no label changes nothing circulates, the
loop's frontier empties and the dataflow completes.  Each improvement also leaves the loop; a
final operator keeps the least label per node and emits it when the epoch is complete.  The
result is ``label[n] = min(component of n)``.

Graph: networkx's Les Misérables co-appearance graph restricted to edges of weight
``>= min_weight`` (every character is kept, so weakly linked ones become small components),
nodes relabelled to ints in sorted name order.  The state inside the loop spans the whole run,
so one run computes the components of one graph (all records are sent in epoch 0).

State: ``propagate`` keeps each node's adjacency list and best label in two ``KeyedState``s
keyed by node (the key both its inputs are exchanged by); ``least_label`` is a
``stateful_unary`` whose stash of labels per epoch is kept per bin of the node.  Both are
declared, so the system can snapshot them per bin and restore them at another worker count.

Run::

    python examples/connected_components.py --workers 2 --min-weight 2
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from tokenflow import InputHandle, execute
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorBuilder, Session
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.stateful import stateful_unary
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.state import KeyedState
from tokenflow.dataflow.stream import Stream
from tokenflow.worker import Worker

Edge = tuple[int, int]
Label = tuple[int, int]
"""``(node, label)``."""


def les_miserables(min_weight: float = 2) -> tuple[list[int], list[Edge]]:
    """Nodes ``0..76`` (characters in sorted name order), edges of weight >= ``min_weight``."""
    import networkx as nx

    g = nx.les_miserables_graph()
    ids = {name: i for i, name in enumerate(sorted(g.nodes))}
    edges = [(ids[u], ids[v]) for u, v, w in g.edges(data="weight") if w >= min_weight]
    return sorted(ids.values()), edges


def karate_florentine() -> tuple[list[int], list[Edge]]:
    """The disjoint union of Zachary's karate club (nodes 0..33) and the Florentine families
    (nodes 34..48, relabelled consecutively by networkx)."""
    import networkx as nx

    g = nx.disjoint_union(nx.karate_club_graph(), nx.florentine_families_graph())
    return sorted(g.nodes), [(int(u), int(v)) for u, v in g.edges]


def _first(record: tuple[int, int]) -> int:
    return record[0]


def propagate(edges: Stream, proposals: Stream, name: str = "Propagate") -> tuple[Stream, Stream]:
    """The loop body: ``(to_neighbours, improvements)``.

    Args:
        edges: directed edges ``(src, dst)`` (give both directions for an undirected graph),
            exchanged by ``src``.
        proposals: label proposals ``(node, label)``, exchanged by ``node``.

    Returns:
        ``to_neighbours``: ``(neighbour, label)`` proposals, sent when a node's label
        decreased (or when an edge arrives from an already labelled node); connect it to the
        loop's feedback.  ``improvements``: ``(node, label)`` each time a node's label
        decreased.
    """
    builder = OperatorBuilder(name, edges.scope, notify=False)
    edge_in = builder.new_input(edges, Exchange(_first))
    label_in = builder.new_input(proposals, Exchange(_first))
    to_neighbours, neighbour_stream = builder.new_output()
    improved, improved_stream = builder.new_output()
    # node -> neighbours and node -> least label seen, per bin of the node (no tokens held)
    adjacency: dict[int, list[int]] = builder.state("adjacency", KeyedState()).data
    best: dict[int, int] = builder.state("best", KeyedState()).data

    def constructor(capabilities: list[Any]) -> Any:
        for cap in capabilities:
            cap.drop()

        def logic(frontiers: Any) -> None:
            for ref, batch in edge_in:
                late: list[Label] = []  # edges from nodes already labelled
                for src, dst in batch:
                    adjacency.setdefault(src, []).append(dst)
                    label = best.get(src)
                    if label is not None:
                        late.append((dst, label))
                to_neighbours.give_batch(ref, late)
            for ref, batch in label_in:
                smallest: dict[int, int] = {}
                for node, label in batch:
                    if label < smallest.get(node, label + 1):
                        smallest[node] = label
                changed = [(n, lab) for n, lab in smallest.items() if lab < best.get(n, lab + 1)]
                if not changed:
                    continue
                best.update(changed)
                out: list[Label] = []
                for node, label in changed:
                    out.extend((nbr, label) for nbr in adjacency.get(node, ()))
                to_neighbours.give_batch(ref, out)
                improved.give_batch(ref, changed)

        return logic

    builder.build(constructor)
    return neighbour_stream, improved_stream


def least_label(stream: Stream, name: str = "LeastLabel") -> Stream:
    """Per epoch, the least label of each node: ``(node, label)`` records at the epoch's time,
    emitted once the input frontier has passed it (exchanged by node; ``stateful_unary``
    stashes each epoch's proposals per bin of the node, one token per pending epoch)."""

    def least(t: Any, records: list[Label], state: KeyedState[Any, Any], session: Session) -> None:
        labels: dict[int, int] = {}
        for node, label in records:
            if label < labels.get(node, label + 1):
                labels[node] = label
        session.give_batch(sorted(labels.items()))

    return stateful_unary(stream, least, key=_first, name=name)


def connected_components(edges: Stream, labels: Stream) -> Stream:
    """Final ``(node, min label reachable)`` per epoch, from undirected ``edges`` (both
    directions) and initial ``labels`` ``(node, node)``."""

    def loop(inner: Scope) -> Stream:
        handle, feedback = inner.feedback(1)
        proposals = labels.enter(inner).concat(feedback)
        to_neighbours, improvements = propagate(edges.enter(inner), proposals)
        to_neighbours.connect_loop(handle)
        return improvements.leave()

    return least_label(edges.scope.iterative(loop, name="LabelPropagation"))


def components(nodes: list[int], edges: list[Edge], workers: int = 2) -> dict[int, int]:
    """``label[node]`` = least node id in the node's component, for an undirected graph.

    ``nodes``: every node id (isolated ones too); ``edges``: ``(u, v)`` pairs, once each.
    Worker ``i`` reads ``nodes[i::workers]`` and ``edges[i::workers]``.
    """

    def job(worker: Worker) -> Capture:
        index, peers = worker.index, worker.peers

        def build(scope: Scope) -> tuple[InputHandle, InputHandle, Capture]:
            edge_input, edge_stream = scope.new_input("Edges")
            label_input, label_stream = scope.new_input("Labels")
            result = connected_components(edge_stream, label_stream)
            return edge_input, label_input, result.capture()

        edge_input, label_input, cap = worker.dataflow(build)
        mine = edges[index::peers]
        edge_input.send_batch(mine + [(v, u) for u, v in mine])
        label_input.send_batch([(n, n) for n in nodes[index::peers]])
        edge_input.close()
        label_input.close()
        return cap

    labels: dict[int, int] = {}
    for cap in execute(job, workers=workers):
        for time, batch in cap.events:
            if time != 0:
                raise RuntimeError(f"label at time {time}, expected only epoch 0")
            for node, label in batch:
                if node in labels:
                    raise RuntimeError(f"node {node} labelled on two workers")
                labels[node] = label
    return labels


def main(workers: int = 2, min_weight: float = 2) -> dict[int, int]:
    """Component labels of the Les Misérables graph (edges of weight >= ``min_weight``)."""
    nodes, edges = les_miserables(min_weight)
    return components(nodes, edges, workers)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker threads (default 2)")
    parser.add_argument("--min-weight", type=float, default=2,
                        help="keep Les Misérables edges of at least this weight (default 2)")
    parser.add_argument("--graph", choices=["lesmis", "karate+florentine"], default="lesmis")
    args = parser.parse_args(argv)
    if args.graph == "lesmis":
        nodes, edges = les_miserables(args.min_weight)
    else:
        nodes, edges = karate_florentine()
    labels = components(nodes, edges, args.workers)
    sizes = Counter(labels.values())
    print(f"{len(nodes)} nodes, {len(edges)} edges: {len(sizes)} components")
    print("sizes (largest first):", sorted(sizes.values(), reverse=True))


if __name__ == "__main__":
    cli()
