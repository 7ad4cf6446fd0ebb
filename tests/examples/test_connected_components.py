"""examples/connected_components.py as a test: labels equal ``min(component)`` from networkx."""

from __future__ import annotations

import random

import connected_components as cc  # examples/ (tests/examples/conftest.py puts it on sys.path)
import networkx as nx
import pytest

from tokenflow import execute

WORKERS = [1, 2, 3]


def expected_labels(graph: nx.Graph) -> dict[int, int]:
    """``node -> min(component)`` computed by networkx."""
    return {n: min(comp) for comp in nx.connected_components(graph) for n in comp}


def les_miserables_expected(min_weight: float) -> tuple[nx.Graph, dict[int, int]]:
    g = nx.les_miserables_graph()
    ids = {name: i for i, name in enumerate(sorted(g.nodes))}
    h = nx.Graph()
    h.add_nodes_from(ids.values())
    h.add_edges_from((ids[u], ids[v]) for u, v, w in g.edges(data="weight") if w >= min_weight)
    return h, expected_labels(h)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("min_weight", [2, 3])
def test_les_miserables(workers: int, min_weight: int) -> None:
    graph, expected = les_miserables_expected(min_weight)
    assert nx.number_connected_components(graph) > 10  # a non-trivial instance
    assert cc.main(workers=workers, min_weight=min_weight) == expected


@pytest.mark.parametrize("workers", WORKERS)
def test_karate_plus_florentine(workers: int) -> None:
    graph = nx.disjoint_union(nx.karate_club_graph(), nx.florentine_families_graph())
    expected = expected_labels(graph)
    assert sorted(set(expected.values())) == [0, 34]
    nodes, edges = cc.karate_florentine()
    assert cc.components(nodes, edges, workers) == expected


@pytest.mark.parametrize("workers", WORKERS)
def test_long_shuffled_path_needs_many_iterations(workers: int) -> None:
    """A path whose ids are shuffled: the least label has to travel up to ~n hops."""
    n = 150
    order = list(range(n))
    random.Random(7).shuffle(order)
    edges = list(zip(order, order[1:], strict=False))
    graph = nx.Graph(edges)
    nodes = list(range(n)) + [n, n + 1]  # plus two isolated nodes
    graph.add_nodes_from([n, n + 1])
    expected = expected_labels(graph)
    assert cc.components(nodes, edges, workers) == expected


def test_differential_workers_1_2_3() -> None:
    results = [cc.main(workers=w, min_weight=3) for w in WORKERS]
    assert results[0] == results[1] == results[2]


def test_cli_prints_component_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    cc.cli(["--workers", "2", "--min-weight", "2"])
    out = capsys.readouterr().out.splitlines()
    graph, _ = les_miserables_expected(2)
    sizes = sorted((len(c) for c in nx.connected_components(graph)), reverse=True)
    assert out[0] == f"77 nodes, {graph.number_of_edges()} edges: {len(sizes)} components"
    assert out[1] == f"sizes (largest first): {sizes}"


@pytest.mark.parametrize("workers", WORKERS)
def test_edges_arriving_after_labels(workers: int) -> None:
    """Labels are propagated first (no edges yet), then the edges arrive: an edge from an
    already labelled node must forward that label."""
    graph = nx.disjoint_union(nx.karate_club_graph(), nx.florentine_families_graph())
    nodes, edges = sorted(graph.nodes), list(graph.edges)

    def job(worker):  # type: ignore[no-untyped-def]
        index, peers = worker.index, worker.peers

        def build(scope):  # type: ignore[no-untyped-def]
            edge_input, edge_stream = scope.new_input("Edges")
            label_input, label_stream = scope.new_input("Labels")
            result = cc.connected_components(edge_stream, label_stream)
            return edge_input, label_input, result.capture()

        edge_input, label_input, cap = worker.dataflow(build)
        label_input.send_batch([(n, n) for n in nodes[index::peers]])
        label_input.close()
        for _ in range(50):  # labels reach the loop's state before any edge exists
            worker.step()
        mine = edges[index::peers]
        edge_input.send_batch(mine + [(v, u) for u, v in mine])
        edge_input.close()
        return cap

    labels = {}
    for cap in execute(job, workers=workers):
        for time, batch in cap.events:
            assert time == 0
            for node, label in batch:
                assert node not in labels
                labels[node] = label
    assert labels == expected_labels(graph)
