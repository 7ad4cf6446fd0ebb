"""``Builder`` and ``Tracker``: timely's examples and small hand-computed scopes."""

import pytest

from tokenflow.order import Increment, Product, ProductSummary
from tokenflow.progress import Antichain, Builder, CycleError, Source, Target, Tracker

PS = ProductSummary
PID = ProductSummary(Increment(0), Increment(0))


def one_to_one(summary):
    """Connectivity of a node with one input and one output."""
    return [[Antichain([summary])]]


def three_node_cycle(summaries=(0, 0, 1), names=None):
    builder = Builder()
    for node, delta in enumerate(summaries):
        builder.add_node(
            node, 1, 1, one_to_one(Increment(delta)), name=None if names is None else names[node]
        )
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(2, 0), Target(0, 0))
    return builder


def drain_pushed(tracker):
    return sorted(tracker.pushed().drain())


# -- timely's reachability example ---------------------------------------------------------


def test_three_node_cycle_timely_example():
    tracker, _ = three_node_cycle().build()
    tracker.update_source(Source(0, 0), 17, 1)
    tracker.propagate_all()
    pushed = drain_pushed(tracker)
    targets = sorted(c for c in pushed if not c[0][0].is_source)
    assert targets == [
        ((Target(0, 0), 18), 1),
        ((Target(1, 0), 17), 1),
        ((Target(2, 0), 17), 1),
    ]
    sources = sorted(c for c in pushed if c[0][0].is_source)
    assert sources == [
        ((Source(0, 0), 17), 1),
        ((Source(1, 0), 17), 1),
        ((Source(2, 0), 18), 1),
    ]
    assert tracker.frontier(Target(0, 0)) == [18]
    assert tracker.frontier(Source(0, 0)) == [17]
    assert tracker.tracking_anything()

    tracker.update_source(Source(0, 0), 17, -1)
    tracker.propagate_all()
    pushed = drain_pushed(tracker)
    targets = sorted(c for c in pushed if not c[0][0].is_source)
    assert targets == [
        ((Target(0, 0), 18), -1),
        ((Target(1, 0), 17), -1),
        ((Target(2, 0), 17), -1),
    ]
    assert len(pushed) == 6
    for loc in (Source(0, 0), Source(1, 0), Source(2, 0), Target(0, 0), Target(1, 0)):
        assert tracker.frontier(loc) == []
    assert not tracker.tracking_anything()


def test_three_node_cycle_scope_summary_and_outputs():
    # Node 0 doubles as the scope boundary: its output is the scope input, its input the
    # scope output.  Source(0,0) -> 1 -> 2 (+1) -> Target(0,0): summary Increment(1).
    tracker, scope_summary = three_node_cycle().build()
    assert scope_summary == [[Antichain([Increment(1)])]]
    tracker.update_source(Source(0, 0), 17, 1)
    tracker.propagate_all()
    outputs = tracker.pushed_output()
    assert len(outputs) == 1
    assert outputs[0].drain() == [(18, 1)]
    tracker.update_target(Target(1, 0), 20, 1)
    tracker.propagate_all()
    assert outputs[0].drain() == [(21, 1)]
    tracker.update_source(Source(0, 0), 17, -1)
    tracker.propagate_all()
    assert outputs[0].drain() == [(18, -1)]


def test_pointstamps_in_same_round_that_cancel_do_nothing():
    tracker, _ = three_node_cycle().build()
    tracker.update_source(Source(0, 0), 5, 1)
    tracker.update_source(Source(0, 0), 5, -1)
    tracker.update_target(Target(2, 0), 3, -1)
    tracker.update_target(Target(2, 0), 3, 1)
    tracker.propagate_all()
    assert tracker.pushed().is_empty()
    assert not tracker.tracking_anything()


def test_negative_count_in_earlier_round_then_positive():
    tracker, _ = three_node_cycle().build()
    tracker.update(Target(1, 0), 4, -1)  # consumption reported before the production
    tracker.propagate_all()
    assert tracker.pushed().is_empty()
    assert tracker.frontier(Target(1, 0)) == []
    tracker.update(Source(2, 0), 6, 1)
    tracker.propagate_all()
    assert tracker.frontier(Target(1, 0)) == [6]
    tracker.pushed().drain()
    tracker.update(Target(1, 0), 4, 1)  # the count returns to 0: still nothing at 4
    tracker.propagate_all()
    assert tracker.frontier(Target(1, 0)) == [6]
    assert tracker.pushed().is_empty()


def test_is_global():
    tracker, _ = three_node_cycle().build()
    tracker.update_source(Source(0, 0), 17, 1)
    tracker.propagate_all()
    assert tracker.is_global(Source(0, 0), 17)
    # A second pointstamp at Target(1, 0) with the same time is redundant there.
    tracker.update_target(Target(1, 0), 17, 1)
    tracker.propagate_all()
    assert not tracker.is_global(Target(1, 0), 17)
    assert tracker.is_global(Source(0, 0), 17)
    # An earlier pointstamp at Source(0, 0) dominates 17.
    tracker.update_source(Source(0, 0), 16, 1)
    tracker.propagate_all()
    assert not tracker.is_global(Source(0, 0), 17)
    assert tracker.is_global(Source(0, 0), 16)


# -- acyclicity ----------------------------------------------------------------------------


def test_identity_cycle_is_rejected_with_names():
    builder = three_node_cycle((0, 0, 0), names=["input", "map", "filter"])
    with pytest.raises(CycleError) as info:
        builder.build()
    message = str(info.value)
    assert "map" in message and "filter" in message and "input" in message
    assert isinstance(info.value, ValueError)


def test_cycle_with_one_increment_builds():
    tracker, _ = three_node_cycle((0, 0, 1), names=["input", "map", "feedback"]).build()
    assert isinstance(tracker, Tracker)
    tracker, _ = three_node_cycle((1, 0, 0)).build()
    assert isinstance(tracker, Tracker)


def test_identity_self_loop_is_rejected():
    builder = Builder()
    builder.add_node(0, 1, 1, one_to_one(Increment(0)), name="loop")
    builder.add_edge(Source(0, 0), Target(0, 0))
    with pytest.raises(CycleError, match="loop"):
        builder.build()


def test_advancing_self_loop_builds():
    builder = Builder()
    builder.add_node(0, 1, 1, one_to_one(Increment(2)), name="loop")
    builder.add_edge(Source(0, 0), Target(0, 0))
    tracker, summary = builder.build()
    tracker.update_target(Target(0, 0), 1, 1)
    tracker.propagate_all()
    assert tracker.frontier(Source(0, 0)) == [3]
    assert tracker.frontier(Target(0, 0)) == [1]


def test_cycle_through_disconnected_ports_is_not_a_cycle():
    # 0 -> 1 -> 0, but node 1's input is not connected to its output: no cycle.
    builder = Builder()
    builder.add_node(0, 1, 1, one_to_one(Increment(0)), name="a")
    builder.add_node(1, 1, 1, [[Antichain()]], name="b")
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(0, 0))
    tracker, _ = builder.build()
    tracker.update_target(Target(0, 0), 0, 1)
    tracker.propagate_all()
    assert tracker.frontier(Target(1, 0)) == [0]
    assert tracker.frontier(Source(1, 0)) == []


def test_identity_cycle_in_product_scope_is_rejected():
    builder = Builder(PID)
    builder.add_node(0, 1, 1, [[Antichain()]], name="scope")
    builder.add_node(1, 2, 1, [[Antichain([PID])], [Antichain([PID])]], name="concat")
    builder.add_node(2, 1, 1, one_to_one(PS(Increment(1), Increment(0))), name="bump")
    builder.add_node(3, 1, 1, one_to_one(PID), name="noop")
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(1, 0), Target(3, 0))
    builder.add_edge(Source(2, 0), Target(1, 1))
    builder.add_edge(Source(3, 0), Target(1, 1))  # concat -> noop -> concat: identity cycle
    with pytest.raises(CycleError) as info:
        builder.build()
    assert "concat" in str(info.value) and "noop" in str(info.value)


def test_dag_builds():
    builder = Builder()
    builder.add_node(0, 0, 2, [], name="source")
    builder.add_node(1, 1, 1, one_to_one(Increment(0)), name="map")
    builder.add_node(2, 2, 1, [[Antichain([Increment(0)])], [Antichain([Increment(0)])]])
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(0, 1), Target(2, 1))
    builder.add_edge(Source(1, 0), Target(2, 0))
    tracker, summary = builder.build()
    assert summary == [[], []]  # two scope inputs, no scope outputs
    tracker.update_source(Source(0, 0), 3, 1)
    tracker.update_source(Source(0, 1), 5, 1)
    tracker.propagate_all()
    assert tracker.frontier(Target(1, 0)) == [3]
    assert tracker.frontier(Target(2, 1)) == [5]
    assert tracker.frontier(Target(2, 0)) == [3]
    assert tracker.frontier(Source(2, 0)) == [3]


# -- builder validation --------------------------------------------------------------------


def test_builder_rejects_bad_shapes_and_edges():
    builder = Builder()
    with pytest.raises(ValueError):
        builder.add_node(0, 1, 1, [[Antichain(), Antichain()]])
    with pytest.raises(ValueError):
        builder.add_node(0, 2, 1, [[Antichain()]])
    builder.add_node(0, 1, 1, one_to_one(Increment(0)))
    with pytest.raises(ValueError):
        builder.add_edge(Target(0, 0), Source(0, 0))
    with pytest.raises(ValueError):
        builder.add_edge(Source(0, 1), Target(0, 0))
    with pytest.raises(ValueError):
        builder.add_edge(Source(0, 0), Target(0, 1))
    with pytest.raises(ValueError):
        builder.add_edge(Source(0, 0), Target(3, 0))


def test_builder_rejects_missing_nodes():
    builder = Builder()
    builder.add_node(0, 1, 1, one_to_one(Increment(0)))
    builder.add_node(2, 1, 1, one_to_one(Increment(0)))
    with pytest.raises(ValueError):
        builder.build()


# -- bounded summaries ---------------------------------------------------------------------


def bounded_node(summaries):
    builder = Builder()
    builder.add_node(0, 1, 1, [[Antichain(summaries)]], name="op")
    builder.add_node(1, 1, 0, [[]], name="sink")
    builder.add_edge(Source(0, 0), Target(1, 0))
    return builder.build()[0]


def test_tracker_drops_times_beyond_bound():
    tracker = bounded_node([Increment(1, bound=5)])
    tracker.update_target(Target(0, 0), 4, 1)
    tracker.update_target(Target(0, 0), 7, 1)
    tracker.propagate_all()
    assert tracker.frontier(Source(0, 0)) == [5]
    tracker.update_target(Target(0, 0), 4, -1)
    tracker.propagate_all()
    assert tracker.frontier(Target(0, 0)) == [7]
    assert tracker.frontier(Source(0, 0)) == []  # 7 + 1 > 5: dropped
    assert tracker.frontier(Target(1, 0)) == []


def test_tracker_keeps_unbounded_alternative_summary():
    tracker = bounded_node([Increment(1, bound=5), Increment(1)])
    tracker.update_target(Target(0, 0), 7, 1)
    tracker.propagate_all()
    assert tracker.frontier(Source(0, 0)) == [8]
    assert tracker.frontier(Target(1, 0)) == [8]


def test_tracker_keeps_incomparable_bounded_summaries():
    tracker = bounded_node([Increment(1, bound=5), Increment(2, bound=100)])
    tracker.update_target(Target(0, 0), 3, 1)
    tracker.propagate_all()
    assert tracker.frontier(Source(0, 0)) == [4]
    tracker.update_target(Target(0, 0), 3, -1)
    tracker.update_target(Target(0, 0), 7, 1)
    tracker.propagate_all()
    assert tracker.frontier(Source(0, 0)) == [9]


def test_scope_summary_composes_bounds_conservatively():
    # scope input -> op (+0, intermediate bound 1) -> op2 (+1) -> scope output.
    builder = Builder()
    builder.add_node(0, 1, 1, [[Antichain()]], name="scope")
    builder.add_node(1, 1, 1, one_to_one(Increment(0, bound=1)), name="a")
    builder.add_node(2, 1, 1, one_to_one(Increment(1)), name="b")
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(2, 0), Target(0, 0))
    tracker, scope_summary = builder.build()
    (summary,) = scope_summary[0][0]
    assert summary.results_in(0) == 1
    assert summary.results_in(1) == 2  # 1 passes bound 1 at node a, then becomes 2
    assert summary.results_in(2) is None
    tracker.update_source(Source(0, 0), 1, 1)
    tracker.propagate_all()
    assert tracker.pushed_output()[0].drain() == [(2, 1)]
    assert tracker.frontier(Target(0, 0)) == [2]


# -- Product times -------------------------------------------------------------------------


def loop_scope():
    """scope(0) -> concat(1) -> feedback(2, +(0,1)) -> concat; concat -> scope output."""
    builder = Builder(PID)
    builder.add_node(0, 1, 1, [[Antichain()]], name="scope")
    builder.add_node(1, 2, 1, [[Antichain([PID])], [Antichain([PID])]], name="concat")
    builder.add_node(2, 1, 1, one_to_one(PS(Increment(0), Increment(1))), name="feedback")
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(2, 0), Target(1, 1))
    builder.add_edge(Source(1, 0), Target(0, 0))
    return builder.build()


def test_product_loop_frontiers():
    tracker, scope_summary = loop_scope()
    assert scope_summary == [[Antichain([PID])]]
    tracker.update_source(Source(0, 0), Product(1, 0), 1)
    tracker.update_source(Source(0, 0), Product(0, 3), 1)
    tracker.propagate_all()
    both = [Product(0, 3), Product(1, 0)]
    assert sorted(tracker.frontier(Target(1, 0))) == both
    assert sorted(tracker.frontier(Source(1, 0))) == both
    assert sorted(tracker.frontier(Target(0, 0))) == both
    assert sorted(tracker.frontier(Source(2, 0))) == [Product(0, 4), Product(1, 1)]
    assert sorted(tracker.frontier(Target(1, 1))) == [Product(0, 4), Product(1, 1)]
    assert all(isinstance(t, Product) for t in tracker.frontier(Target(1, 1)))
    assert sorted(tracker.pushed_output()[0].drain()) == [(Product(0, 3), 1), (Product(1, 0), 1)]
    tracker.pushed().drain()

    # Retire (0, 3) at the scope input while the loop still holds (0, 5).
    tracker.update_target(Target(1, 1), Product(0, 5), 1)
    tracker.update_source(Source(0, 0), Product(0, 3), -1)
    tracker.propagate_all()
    assert sorted(tracker.frontier(Target(1, 0))) == [Product(1, 0)]
    assert sorted(tracker.frontier(Target(1, 1))) == [Product(0, 5), Product(1, 1)]
    assert sorted(tracker.frontier(Source(1, 0))) == [Product(0, 5), Product(1, 0)]
    changes = dict(tracker.pushed().drain())
    assert changes[(Target(1, 0), Product(0, 3))] == -1
    assert changes[(Source(1, 0), Product(0, 3))] == -1
    assert changes[(Source(1, 0), Product(0, 5))] == 1
    assert changes[(Target(1, 1), Product(0, 4))] == -1
    assert changes[(Target(1, 1), Product(0, 5))] == 1
    assert (Source(2, 0), Product(0, 5)) not in changes
    assert changes[(Source(2, 0), Product(0, 4))] == -1
    assert changes[(Source(2, 0), Product(0, 6))] == 1


# -- observed and unobserved ports ---------------------------------------------------------


def idle_chain(length):
    """source(0) -> `length` nodes that do not notify -> sink (notify)."""
    builder = Builder()
    builder.add_node(0, 0, 1, [], name="source", notify=False)
    for node in range(1, length + 1):
        builder.add_node(node, 1, 1, one_to_one(Increment(0)), name=f"noop{node}", notify=False)
        builder.add_edge(Source(node - 1, 0), Target(node, 0))
    builder.add_node(length + 1, 1, 0, [[]], name="sink")
    builder.add_edge(Source(length, 0), Target(length + 1, 0))
    return builder.build()[0]


def test_idle_chain_pushes_only_the_observed_input():
    tracker = idle_chain(64)
    sink = Target(65, 0)
    assert tracker.observes(sink)
    assert not any(tracker.observes(Target(n, 0)) for n in range(1, 65))
    tracker.update_source(Source(0, 0), 0, 1)
    tracker.propagate_all()
    assert drain_pushed(tracker) == [((sink, 0), 1)]
    for t in range(1, 4):
        tracker.update_source(Source(0, 0), t, 1)
        tracker.update_source(Source(0, 0), t - 1, -1)
        tracker.propagate_all()
        assert drain_pushed(tracker) == [((sink, t - 1), -1), ((sink, t), 1)]
    # Unobserved frontiers, computed when asked.
    assert tracker.frontier(Target(32, 0)) == [3]
    assert tracker.frontier(Source(64, 0)) == [3]
    assert tracker.lazy_changes(32) == [((Target(32, 0), 3), 1)]
    assert tracker.lazy_changes(32) == []
    tracker.update_target(Target(10, 0), 2, 1)  # a message inside the chain
    tracker.propagate_all()
    assert drain_pushed(tracker) == [((sink, 2), 1), ((sink, 3), -1)]
    assert tracker.frontier(Target(9, 0)) == [3]
    assert tracker.frontier(Target(11, 0)) == [2]
    assert sorted(tracker.lazy_changes(32)) == [((Target(32, 0), 2), 1), ((Target(32, 0), 3), -1)]
    assert tracker.is_global(Target(10, 0), 2)
    assert not tracker.is_done(32)
    tracker.update_target(Target(10, 0), 2, -1)
    tracker.update_source(Source(0, 0), 3, -1)
    tracker.propagate_all()
    assert drain_pushed(tracker) == [((sink, 2), -1)]
    assert tracker.is_done(32) and tracker.is_done(0)
    assert tracker.lazy_changes(32) == [((Target(32, 0), 2), -1)]
    assert not tracker.tracking_anything()


def test_unobserved_ports_on_a_cycle_are_observed():
    builder = Builder()
    for node, delta in enumerate((0, 0, 1)):
        builder.add_node(node, 1, 1, one_to_one(Increment(delta)), notify=node == 2)
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(2, 0), Target(0, 0))
    tracker, _ = builder.build()
    assert all(tracker.observes(loc) for n in range(3) for loc in (Source(n, 0), Target(n, 0)))


def test_summaries_compose_across_unobserved_nodes():
    builder = Builder()
    builder.add_node(0, 0, 1, [], name="source")
    builder.add_node(1, 1, 1, one_to_one(Increment(2)), name="a", notify=False)
    builder.add_node(2, 1, 1, [[Antichain([Increment(1, bound=10), Increment(3)])]], name="b",
                     notify=False)
    builder.add_node(3, 1, 0, [[]], name="sink")
    builder.add_edge(Source(0, 0), Target(1, 0))
    builder.add_edge(Source(1, 0), Target(2, 0))
    builder.add_edge(Source(2, 0), Target(3, 0))
    tracker, _ = builder.build()
    tracker.update_source(Source(0, 0), 5, 1)
    tracker.propagate_all()
    assert drain_pushed(tracker) == [((Target(3, 0), 8), 1)]  # 5 + 2 + 1 <= 10
    tracker.update_source(Source(0, 0), 8, 1)
    tracker.update_source(Source(0, 0), 5, -1)
    tracker.propagate_all()
    assert drain_pushed(tracker) == [((Target(3, 0), 8), -1), ((Target(3, 0), 13), 1)]
    assert tracker.frontier(Target(2, 0)) == [10]
