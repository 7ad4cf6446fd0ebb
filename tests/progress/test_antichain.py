"""``Antichain`` and ``MutableAntichain`` with int and ``Product`` times."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.order import Increment, Product, ProductSummary
from tokenflow.progress import Antichain, ChangeBatch, MutableAntichain
from tokenflow.progress.antichain import frontier_changes


def ple(a, b):
    """Reference order: ints by value, pairs coordinate-wise (written independently)."""
    if isinstance(a, int):
        return a <= b
    return a[0] <= b[0] and a[1] <= b[1]


def minimal(elements):
    """Reference minimal elements of a finite set, by brute force."""
    elements = set(elements)
    return sorted(e for e in elements if not any(f != e and ple(f, e) for f in elements))


# -- Antichain: timely's examples ----------------------------------------------------------


def test_antichain_insert_int():
    frontier = Antichain()
    assert frontier.is_empty()
    assert frontier.insert(2)
    assert not frontier.insert(3)
    assert not frontier.insert(2)
    assert frontier.insert(1)
    assert frontier.elements() == [1]
    assert len(frontier) == 1


def test_antichain_less_equal_less_than_int():
    frontier = Antichain.from_elem(2)
    assert frontier.less_equal(3)
    assert frontier.less_equal(2)
    assert not frontier.less_equal(1)
    assert frontier.less_than(3)
    assert not frontier.less_than(2)
    assert not frontier.less_than(1)
    empty = Antichain()
    assert not empty.less_equal(0)
    assert not empty.less_than(100)


def test_antichain_dominates():
    assert Antichain([1]).dominates(Antichain([2]))
    assert Antichain([1]).dominates(Antichain([1]))
    assert not Antichain([2]).dominates(Antichain([1]))
    assert Antichain([1]).dominates(Antichain())  # the empty frontier is beyond everything
    assert not Antichain().dominates(Antichain([5]))
    assert Antichain().dominates(Antichain())


# -- Antichain with Product times ----------------------------------------------------------


def test_antichain_product_keeps_incomparable_elements():
    a = Antichain()
    assert a.insert(Product(1, 5))
    assert a.insert(Product(2, 3))  # incomparable: both stay
    assert sorted(a.elements()) == [Product(1, 5), Product(2, 3)]
    assert not a.insert(Product(2, 5))  # dominated by both
    assert not a.insert(Product(1, 5))
    assert a.insert(Product(1, 3))  # below both: replaces them
    assert a.elements() == [Product(1, 3)]


def test_antichain_product_insert_removes_only_dominated():
    a = Antichain([Product(0, 4), Product(2, 2), Product(4, 0)])
    assert len(a) == 3
    assert a.insert(Product(1, 2))  # removes (2, 2) only
    assert sorted(a) == [Product(0, 4), Product(1, 2), Product(4, 0)]


def test_antichain_product_less_equal_less_than():
    a = Antichain([Product(1, 5), Product(2, 3)])
    assert a.less_equal(Product(1, 5))
    assert a.less_equal(Product(2, 3))
    assert a.less_equal(Product(3, 3))
    assert a.less_equal(Product(1, 9))
    assert not a.less_equal(Product(1, 4))  # lexicographically above (1, 5)'s rival, but not >=
    assert not a.less_equal(Product(0, 9))
    assert not a.less_equal(Product(9, 2))
    assert not a.less_than(Product(1, 5))
    assert a.less_than(Product(1, 6))
    assert a.less_than(Product(2, 5))


def test_antichain_product_dominates():
    a = Antichain([Product(1, 5), Product(2, 3)])
    assert a.dominates(Antichain([Product(2, 5)]))
    assert a.dominates(Antichain([Product(1, 7), Product(3, 3)]))
    assert not a.dominates(Antichain([Product(1, 4)]))
    assert not Antichain([Product(2, 5)]).dominates(a)
    assert Antichain([Product(0, 0)]).dominates(a)


def test_antichain_equality_and_hash():
    a = Antichain([Product(1, 5), Product(2, 3)])
    b = Antichain([Product(2, 3), Product(1, 5)])
    assert a == b
    assert hash(a) == hash(b)
    assert a != Antichain([Product(1, 5)])


def test_antichain_of_summaries():
    a = Antichain([Increment(3), Increment(1), Increment(2)])
    assert a.elements() == [Increment(1)]
    s = Antichain(
        [ProductSummary(Increment(1), Increment(0)), ProductSummary(Increment(0), Increment(1))]
    )
    assert len(s) == 2
    assert not s.insert(ProductSummary(Increment(1), Increment(1)))
    # The unbounded summary reaches strictly more times than the bounded one: keep it.
    b = Antichain([Increment(1, bound=5), Increment(1)])
    assert b.elements() == [Increment(1)]
    assert b.elements()[0].results_in(7) == 8


# -- MutableAntichain ----------------------------------------------------------------------


def test_mutable_antichain_timely_example():
    frontier = MutableAntichain.new_bottom(1)
    changes = frontier.update_iter([(1, -1), (2, 7)])
    assert changes == [(1, -1), (2, 1)]
    assert frontier.frontier() == [2]
    assert frontier.count_for(2) == 7
    assert frontier.count_for(1) == 0


def test_mutable_antichain_starts_empty():
    m = MutableAntichain()
    assert m.is_empty()
    assert m.frontier() == []
    assert not m.less_equal(0)
    assert m.update_iter([]) == []


def test_mutable_antichain_product_incomparable_elements():
    m = MutableAntichain()
    changes = m.update_iter([(Product(1, 5), 1), (Product(2, 3), 1)])
    assert sorted(changes) == [(Product(1, 5), 1), (Product(2, 3), 1)]
    assert sorted(m.frontier()) == [Product(1, 5), Product(2, 3)]
    # A dominated element does not change the frontier.
    assert m.update(Product(2, 5), 1) == []
    assert m.count_for(Product(2, 5)) == 1
    # Removing (1, 5) leaves (2, 3); (2, 5) is still dominated by it.
    assert m.update(Product(1, 5), -1) == [(Product(1, 5), -1)]
    assert m.frontier() == [Product(2, 3)]
    # Removing (2, 3) exposes (2, 5).
    assert sorted(m.update(Product(2, 3), -1)) == [(Product(2, 3), -1), (Product(2, 5), 1)]
    assert m.frontier() == [Product(2, 5)]
    assert m.less_equal(Product(3, 5))
    assert not m.less_equal(Product(3, 4))
    assert not m.less_than(Product(2, 5))
    assert m.less_than(Product(2, 6))


def test_mutable_antichain_transient_negative_counts():
    m = MutableAntichain()
    # A retraction that arrives before its insertion leaves a negative count: no frontier.
    assert m.update(Product(0, 0), -1) == []
    assert m.count_for(Product(0, 0)) == -1
    assert m.frontier() == []
    assert m.update(Product(3, 3), 1) == [(Product(3, 3), 1)]
    assert m.frontier() == [Product(3, 3)]
    # The matching +1 cancels it: (0, 0) has count 0 and is still not in the frontier.
    assert m.update(Product(0, 0), 1) == []
    assert m.count_for(Product(0, 0)) == 0
    assert m.frontier() == [Product(3, 3)]
    # Within one batch the net effect counts, not the order.
    changes = m.update_iter([(Product(1, 1), -1), (Product(1, 1), 2)])
    assert sorted(changes) == [(Product(1, 1), 1), (Product(3, 3), -1)]
    assert m.frontier() == [Product(1, 1)]
    assert m.count_for(Product(1, 1)) == 1
    changes = m.update_iter([(Product(1, 1), 1), (Product(1, 1), -2)])
    assert sorted(changes) == [(Product(1, 1), -1), (Product(3, 3), 1)]
    assert m.count_for(Product(1, 1)) == 0


def test_mutable_antichain_zero_diff_is_a_no_op():
    m = MutableAntichain()
    assert m.update(5, 0) == []
    assert m.update_iter([(5, 0)]) == []
    assert m.count_for(5) == 0
    m.update(3, 1)
    assert m.update(3, 0) == []
    assert m.update(7, 0) == []
    assert m.frontier() == [3]
    assert m.count_for(3) == 1


def test_mutable_antichain_counts_multiplicity():
    m = MutableAntichain()
    assert m.update(5, 2) == [(5, 1)]
    assert m.update(5, -1) == []
    assert m.count_for(5) == 1
    assert m.frontier() == [5]
    assert m.update(5, -1) == [(5, -1)]
    assert m.is_empty()


def test_frontier_changes_helper():
    m = MutableAntichain()
    batch = ChangeBatch([(3, 1), (1, 1), (1, -1)])
    changes = frontier_changes(batch, m)
    assert changes.iter() == [(3, 1)]
    assert batch.is_empty()
    assert m.frontier() == [3]


# -- properties ----------------------------------------------------------------------------

small = st.integers(min_value=0, max_value=4)
product_times = st.builds(Product, small, small)
int_times = st.integers(min_value=0, max_value=8)


@settings()
@given(st.lists(product_times, max_size=15), product_times)
def test_antichain_is_minimal_elements(inserted, probe):
    a = Antichain()
    seen = []
    for t in inserted:
        dominated = any(ple(s, t) for s in seen)
        assert a.insert(t) == (not dominated)
        seen.append(t)
        elems = a.elements()
        assert sorted(elems) == minimal(seen)
        for x in elems:
            for y in elems:
                assert x == y or not ple(x, y)
    assert a.less_equal(probe) == any(ple(s, probe) for s in seen)
    assert a.less_than(probe) == any(ple(s, probe) and s != probe for s in seen)
    assert Antichain([probe]).dominates(a) == all(ple(probe, s) for s in seen)
    assert a.dominates(Antichain([probe])) == any(ple(s, probe) for s in seen)


updates_product = st.lists(
    st.lists(st.tuples(product_times, st.integers(min_value=-2, max_value=2)), max_size=6),
    max_size=12,
)
updates_int = st.lists(
    st.lists(st.tuples(int_times, st.integers(min_value=-2, max_value=2)), max_size=6),
    max_size=12,
)


def _check_mutable_antichain(batches, probes, one_at_a_time):
    m = MutableAntichain()
    counts: dict = {}
    old = []
    for batch in batches:
        if one_at_a_time:
            # ``update`` must agree with ``update_iter``: the net changes over the batch.
            net: dict = {}
            for t, d in batch:
                for ft, fd in m.update(t, d):
                    net[ft] = net.get(ft, 0) + fd
            changes = [(t, d) for t, d in net.items() if d]
        else:
            changes = m.update_iter(batch)
        for t, d in batch:
            counts[t] = counts.get(t, 0) + d
        new = minimal(t for t, c in counts.items() if c > 0)
        assert sorted(m.frontier()) == new
        expected = {t: -1 for t in old if t not in new}
        expected.update({t: 1 for t in new if t not in old})
        assert len(changes) == len(expected)
        assert dict(changes) == expected
        for t in set(counts) | set(probes):
            assert m.count_for(t) == counts.get(t, 0)
        for p in probes:
            assert m.less_equal(p) == any(ple(f, p) for f in new)
            assert m.less_than(p) == any(ple(f, p) and f != p for f in new)
        assert m.is_empty() == (not new)
        old = new


@settings()
@given(updates_product, st.lists(product_times, max_size=3), st.booleans())
def test_mutable_antichain_matches_model_product(batches, probes, one_at_a_time):
    _check_mutable_antichain(batches, probes, one_at_a_time)


@settings()
@given(updates_int, st.lists(int_times, max_size=3), st.booleans())
def test_mutable_antichain_matches_model_int(batches, probes, one_at_a_time):
    _check_mutable_antichain(batches, probes, one_at_a_time)
