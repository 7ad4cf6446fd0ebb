"""``Tracker`` against a brute-force oracle on random graphs and random pointstamp updates.

The oracle is written independently of the tracker.  Its graph is plain data:

* ``shapes[node] = (inputs, outputs)``;
* ``conn[node][input][output]``: a list of raw summaries, ``(delta, bound)`` for int times
  (``bound`` ``None`` means unbounded; a result ``> bound`` is dropped) or ``(a, b)`` for
  ``Product`` times (adds ``a`` to the outer and ``b`` to the inner coordinate);
* ``edges``: ``((src_node, src_port), (dst_node, dst_port))`` pairs.

The frontier at a location is the set of minimal elements of { path(t) : pointstamp (l, t) with
positive accumulated count, path from l to the location (the empty path included) }.  It is
computed as a fixed point: per location an antichain of the minimal times found so far; a new
(location, time) is dropped when some known time there is <= it (everything it reaches is then
>= something the known time reaches, since applying a summary is monotone), otherwise it is
inserted and pushed along edges (time unchanged) and operator summaries.  This terminates
because every cycle strictly advances time: a time coming back around a cycle is dominated by
the one that started it, so only finitely many non-dominated (location, time) pairs exist (all
come from paths without repeated locations).

Every node also gets a random ``notify`` flag.  The tracker maintains frontiers only at
*observed* locations (inputs of notify nodes, every location on a cycle; the oracle finds cycles
by searching, from each location, for a path back to it) and computes the others when asked; the
property checks both against the same oracle, including the changes ``lazy_changes`` reports
between calls made at random rounds.
"""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.order import Increment, Product, ProductSummary
from tokenflow.progress import Antichain, Builder, CycleError, Source, Target

# -- the oracle ----------------------------------------------------------------------------


def time_le(a, b):
    if isinstance(a, int):
        return a <= b
    return a[0] <= b[0] and a[1] <= b[1]


def apply(raw, t):
    """Apply a raw summary to a time; None when the time is dropped."""
    if isinstance(t, int):
        delta, bound = raw
        r = t + delta
        return None if bound is not None and r > bound else r
    return (t[0] + raw[0], t[1] + raw[1])


def raw_is_identity(raw, product):
    return raw == (0, 0) if product else raw[0] == 0


def raw_le(s1, s2, product):
    """Summary order: s1 <= s2 when s1 never gives a later time and drops no more times."""
    if product:
        return s1[0] <= s2[0] and s1[1] <= s2[1]
    inf = float("inf")
    slack1 = inf if s1[1] is None else s1[1] - s1[0]
    slack2 = inf if s2[1] is None else s2[1] - s2[0]
    return s1[0] <= s2[0] and slack1 >= slack2


def minimal_summaries(raws, product):
    distinct = list(dict.fromkeys(raws))
    return [
        s for s in distinct if not any(o != s and raw_le(o, s, product) for o in distinct)
    ]


def all_locations(graph):
    shapes = graph["shapes"]
    locs = []
    for node, (inputs, outputs) in enumerate(shapes):
        locs.extend(Target(node, i) for i in range(inputs))
        locs.extend(Source(node, o) for o in range(outputs))
    return locs


def successors(graph, loc, t):
    """One step from (loc, t): along edges (time unchanged) or operator summaries."""
    out = []
    if loc.is_source:
        for (sn, sp), (tn, tp) in graph["edges"]:
            if (sn, sp) == (loc.node, loc.port):
                out.append((Target(tn, tp), t))
    else:
        for o, raws in enumerate(graph["conn"][loc.node][loc.port]):
            for raw in raws:
                r = apply(raw, t)
                if r is not None:
                    out.append((Source(loc.node, o), r))
    return out


def oracle_frontiers(graph, counts, skip_self=None):
    """Minimal reachable times per location from the positively counted pointstamps.

    With ``skip_self``, pointstamps at that location only contribute through non-empty paths.
    """
    front = {loc: [] for loc in all_locations(graph)}
    work = deque()
    for (loc, t), c in counts.items():
        if c > 0:
            if loc == skip_self:
                work.extend(successors(graph, loc, t))
            else:
                work.append((loc, t))
    while work:
        loc, t = work.popleft()
        current = front[loc]
        if any(time_le(f, t) for f in current):
            continue
        front[loc] = [f for f in current if not time_le(t, f)] + [t]
        work.extend(successors(graph, loc, t))
    return front


def has_identity_cycle(graph, product):
    """Kahn's algorithm on the graph of edges and identity operator connections."""
    arcs = {loc: [] for loc in all_locations(graph)}
    for (sn, sp), (tn, tp) in graph["edges"]:
        arcs[Source(sn, sp)].append(Target(tn, tp))
    for node, rows in enumerate(graph["conn"]):
        for i, row in enumerate(rows):
            for o, raws in enumerate(row):
                if any(raw_is_identity(raw, product) for raw in raws):
                    arcs[Target(node, i)].append(Source(node, o))
    indegree = dict.fromkeys(arcs, 0)
    for succ in arcs.values():
        for s in succ:
            indegree[s] += 1
    ready = [loc for loc, d in indegree.items() if d == 0]
    removed = 0
    while ready:
        loc = ready.pop()
        removed += 1
        for s in arcs[loc]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    return removed < len(arcs)


def oracle_observed(graph):
    """Inputs of notify nodes, and every location from which a non-empty path leads back."""
    arcs = {loc: [] for loc in all_locations(graph)}
    for (sn, sp), (tn, tp) in graph["edges"]:
        arcs[Source(sn, sp)].append(Target(tn, tp))
    for node, rows in enumerate(graph["conn"]):
        for i, row in enumerate(rows):
            for o, raws in enumerate(row):
                if raws:
                    arcs[Target(node, i)].append(Source(node, o))
    observed = set()
    for loc in arcs:
        seen, todo = set(), list(arcs[loc])
        while todo:
            nxt = todo.pop()
            if nxt not in seen:
                seen.add(nxt)
                todo.extend(arcs[nxt])
        if loc in seen or (not loc.is_source and graph["notify"][loc.node]):
            observed.add(loc)
    return observed


def oracle_is_global(graph, counts, loc, t):
    """The pointstamps at (loc, t) alone hold back loc's frontier: t is minimal among loc's
    positive pointstamps, and without them nothing at or before t could reach loc."""
    own = [s for (l2, s), c in counts.items() if l2 == loc and c > 0]
    if t not in own or any(s != t and time_le(s, t) for s in own):
        return False
    others = {key: c for key, c in counts.items() if key != (loc, t)}
    return not any(time_le(f, t) for f in oracle_frontiers(graph, others)[loc])


def oracle_implication_count(graph, product, counts, front, loc, t):
    """How many (upstream location, frontier time, minimal summary) pairs give ``t`` at loc,
    plus one when ``t`` is a minimal positive pointstamp at ``loc`` itself."""
    own = [s for (l2, s), c in counts.items() if l2 == loc and c > 0]
    n = 1 if t in own and not any(s != t and time_le(s, t) for s in own) else 0
    if loc.is_source:
        for i in range(graph["shapes"][loc.node][0]):
            raws = minimal_summaries(graph["conn"][loc.node][i][loc.port], product)
            for f in front[Target(loc.node, i)]:
                n += sum(1 for raw in raws if apply(raw, f) == t)
    else:
        for (sn, sp), (tn, tp) in graph["edges"]:
            if (tn, tp) == (loc.node, loc.port):
                n += sum(1 for f in front[Source(sn, sp)] if f == t)
    return n


# -- building the tracker from the same data -----------------------------------------------


def to_summary(raw, product):
    if product:
        return ProductSummary(Increment(raw[0]), Increment(raw[1]))
    delta, bound = raw
    return Increment(delta) if bound is None else Increment(delta, bound)


def to_time(t, product):
    return Product(*t) if product else t


def build(graph, product):
    builder = Builder(ProductSummary(Increment(0), Increment(0)) if product else None)
    for node, (inputs, outputs) in enumerate(graph["shapes"]):
        conn = [
            [Antichain(to_summary(raw, product) for raw in graph["conn"][node][i][o])
             for o in range(outputs)]
            for i in range(inputs)
        ]
        builder.add_node(node, inputs, outputs, conn, name=f"op{node}",
                         notify=graph["notify"][node])
    for (sn, sp), (tn, tp) in graph["edges"]:
        builder.add_edge(Source(sn, sp), Target(tn, tp))
    return builder


# -- strategies ----------------------------------------------------------------------------

int_summary = st.tuples(
    st.integers(min_value=0, max_value=3),
    st.one_of(st.none(), st.none(), st.integers(min_value=2, max_value=20)),
)
product_summary = st.tuples(st.integers(min_value=0, max_value=2), st.integers(0, 2))
int_time = st.integers(min_value=0, max_value=10)
product_time = st.tuples(st.integers(min_value=0, max_value=4), st.integers(0, 4))


@st.composite
def scenarios(draw, product):
    n = draw(st.integers(min_value=2, max_value=6))
    shapes = [
        (draw(st.integers(min_value=1, max_value=2)), draw(st.integers(min_value=1, max_value=2)))
        for _ in range(n)
    ]
    summary = product_summary if product else int_summary
    conn = [
        [[draw(st.lists(summary, max_size=2)) for _ in range(outputs)] for _ in range(inputs)]
        for inputs, outputs in shapes
    ]
    sources = [(node, o) for node, (_, outputs) in enumerate(shapes) for o in range(outputs)]
    targets = [(node, i) for node, (inputs, _) in enumerate(shapes) for i in range(inputs)]
    edges = draw(
        st.lists(
            st.tuples(st.sampled_from(sources), st.sampled_from(targets)), max_size=2 * n + 2
        )
    )
    notify = [draw(st.booleans()) for _ in range(n)]
    graph = {"shapes": shapes, "conn": conn, "edges": edges, "notify": notify}
    locations = all_locations(graph)
    # A small pool of pointstamps makes repeated, cancelling and negative updates likely.
    pool = draw(
        st.lists(
            st.tuples(st.sampled_from(locations), product_time if product else int_time),
            min_size=1,
            max_size=6,
            unique=True,
        )
    )
    rounds = draw(
        st.lists(
            st.lists(
                st.tuples(st.sampled_from(pool), st.sampled_from([-2, -1, -1, 1, 1, 1, 2])),
                max_size=8,
            ),
            min_size=1,
            max_size=4,
        )
    )
    # Per round, whether to ask every node for its lazy frontier changes afterwards.
    asks = draw(st.lists(st.booleans(), min_size=len(rounds), max_size=len(rounds)))
    return graph, list(zip(rounds, asks, strict=True))


# -- the property --------------------------------------------------------------------------


def check_tracker_against_oracle(graph, rounds, product):
    builder = build(graph, product)
    if has_identity_cycle(graph, product):
        try:
            builder.build()
        except CycleError:
            return
        raise AssertionError("a cycle of identity summaries was accepted")
    tracker, _ = builder.build()  # must not raise: every cycle advances time

    def key(t):
        return tuple(t) if product else t

    locations = all_locations(graph)
    observed = oracle_observed(graph)
    assert {loc for loc in locations if tracker.observes(loc)} == observed
    scope_outputs = graph["shapes"][0][0]
    counts: dict = {}
    old = {loc: [] for loc in locations}
    delivered = {loc: [] for loc in locations if loc not in observed and not loc.is_source}
    output_counts = [dict() for _ in range(scope_outputs)]
    for updates, ask in rounds:
        for (loc, t), diff in updates:
            tracker.update(loc, to_time(t, product), diff)
            counts[(loc, t)] = counts.get((loc, t), 0) + diff
        tracker.propagate_all()
        new = oracle_frontiers(graph, counts)

        # Frontiers, observed or computed when asked.
        for loc in locations:
            got = tracker.frontier(loc)
            if product:
                assert all(isinstance(t, Product) for t in got)
            assert sorted(key(t) for t in got) == sorted(new[loc]), loc

        # pushed(): per observed location, the net changes are exactly the frontier difference.
        pushed: dict = {}
        for (loc, t), d in tracker.pushed().drain():
            pushed.setdefault(loc, {})[key(t)] = pushed.get(loc, {}).get(key(t), 0) + d
        for loc in observed:
            expected = {t: -1 for t in old[loc] if t not in new[loc]}
            expected.update({t: 1 for t in new[loc] if t not in old[loc]})
            got = {t: d for t, d in pushed.get(loc, {}).items() if d}
            assert got == expected, loc
        assert set(pushed) <= observed

        # lazy_changes(): per unobserved input, the difference since the previous call.
        if ask:
            lazy: dict = {}
            for node in range(len(graph["shapes"])):
                for (loc, t), d in tracker.lazy_changes(node):
                    assert loc.node == node
                    lazy.setdefault(loc, {})[key(t)] = lazy.get(loc, {}).get(key(t), 0) + d
            assert set(lazy) <= set(delivered)
            for loc, before in delivered.items():
                expected = {t: -1 for t in before if t not in new[loc]}
                expected.update({t: 1 for t in new[loc] if t not in before})
                assert {t: d for t, d in lazy.get(loc, {}).items() if d} == expected, loc
                delivered[loc] = new[loc]

        assert tracker.tracking_anything() == any(c > 0 for c in counts.values())
        for node, (inputs, _outputs) in enumerate(graph["shapes"]):
            done = all(not new[Target(node, i)] for i in range(inputs)) and not any(
                c > 0 for (l2, _), c in counts.items() if l2.is_source and l2.node == node
            )
            assert tracker.is_done(node) == done, node

        # is_global, for every frontier time and pointstamp time.  Implication counts of the
        # unobserved locations (computed by node_state) count each direct predecessor's
        # frontier elements; observed ones count along the tracker's precomputed arcs.
        for loc in locations:
            per_op = tracker.node_state(loc.node)
            info = per_op.sources[loc.port] if loc.is_source else per_op.targets[loc.port]
            probes = set(new[loc]) | {t for (l2, t) in counts if l2 == loc}
            for t in probes:
                if t in new[loc]:
                    got = info.implications.count_for(to_time(t, product))
                    if loc in observed:
                        assert got >= 1, (loc, t)
                    else:
                        count = oracle_implication_count(graph, product, counts, new, loc, t)
                        assert got == count, (loc, t)
                expected_global = oracle_is_global(graph, counts, loc, t)
                assert tracker.is_global(loc, to_time(t, product)) == expected_global, (loc, t)

        # pushed_output(): accumulated changes at each scope output (node 0's inputs) have as
        # minimal positive elements the times reachable there by non-empty paths.
        for o, batch in enumerate(tracker.pushed_output()):
            for t, d in batch.drain():
                output_counts[o][key(t)] = output_counts[o].get(key(t), 0) + d
            assert all(c >= 0 for c in output_counts[o].values())
            positive = [t for t, c in output_counts[o].items() if c > 0]
            minimal = sorted(t for t in positive if not any(
                s != t and time_le(s, t) for s in positive))
            reached = oracle_frontiers(graph, counts, skip_self=Target(0, o))[Target(0, o)]
            assert minimal == sorted(reached), o

        old = new


@settings()
@given(scenarios(product=False))
def test_tracker_matches_oracle_int_times(scenario):
    graph, rounds = scenario
    check_tracker_against_oracle(graph, rounds, product=False)


@settings()
@given(scenarios(product=True))
def test_tracker_matches_oracle_product_times(scenario):
    graph, rounds = scenario
    check_tracker_against_oracle(graph, rounds, product=True)


# -- the oracle itself, on hand-made cases -------------------------------------------------


def test_oracle_on_three_node_cycle():
    graph = {
        "notify": [True, True, True],
        "shapes": [(1, 1), (1, 1), (1, 1)],
        "conn": [[[[(0, None)]]], [[[(0, None)]]], [[[(1, None)]]]],
        "edges": [((0, 0), (1, 0)), ((1, 0), (2, 0)), ((2, 0), (0, 0))],
    }
    front = oracle_frontiers(graph, {(Source(0, 0), 17): 1})
    assert front[Target(0, 0)] == [18]
    assert front[Target(1, 0)] == [17]
    assert front[Target(2, 0)] == [17]
    assert front[Source(2, 0)] == [18]
    assert not has_identity_cycle(graph, product=False)
    graph["conn"][2] = [[[(0, 7)]]]
    assert has_identity_cycle(graph, product=False)
    assert oracle_frontiers(graph, {(Source(0, 0), 17): -1})[Target(0, 0)] == []


def test_oracle_on_product_loop():
    graph = {
        "shapes": [(1, 1), (1, 1)],
        "conn": [[[[(0, 0)]]], [[[(0, 1), (1, 0)]]]],
        "edges": [((0, 0), (1, 0)), ((1, 0), (0, 0))],
    }
    front = oracle_frontiers(graph, {(Source(0, 0), (2, 2)): 1, (Target(1, 0), (3, 0)): 2})
    assert sorted(front[Target(1, 0)]) == [(2, 2), (3, 0)]
    assert sorted(front[Source(1, 0)]) == [(2, 3), (3, 1), (4, 0)]
    assert sorted(front[Target(0, 0)]) == [(2, 3), (3, 1), (4, 0)]
