"""Path summaries: ``Increment`` (int times) and ``ProductSummary`` (``Product`` times)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.order import (
    MAX_TIME,
    Increment,
    PathSummary,
    Product,
    ProductSummary,
    identity_summary,
    is_identity,
    less_equal,
    less_than,
)

deltas = st.integers(min_value=0, max_value=8)
bounds = st.one_of(st.just(MAX_TIME), st.integers(min_value=0, max_value=30))
increments = st.builds(Increment, deltas, bounds)
int_times = st.integers(min_value=0, max_value=30)
product_summaries = st.builds(ProductSummary, increments, increments)
product_times = st.builds(Product, int_times, int_times)


def then(summary, time):
    """Apply ``summary`` to ``time``, propagating ``None`` (a dropped message)."""
    return None if time is None else summary.results_in(time)


def le_or_top(a, b):
    """Partial order on results where ``None`` (dropped) is above every time."""
    if b is None:
        return True
    if a is None:
        return False
    return less_equal(a, b)


# -- Increment -----------------------------------------------------------------------------


def test_increment_results_in():
    assert Increment(0).results_in(5) == 5
    assert Increment(3).results_in(5) == 8
    assert Increment(1).results_in(0) == 1
    assert isinstance(Increment(1), PathSummary)


def test_increment_bound_drops_times():
    assert Increment(5, bound=10).results_in(8) is None
    assert Increment(5, bound=10).results_in(5) == 10
    assert Increment(5, bound=10).results_in(6) is None
    assert Increment(0, bound=3).results_in(3) == 3
    assert Increment(0, bound=3).results_in(4) is None


def test_increment_overflow_at_max_time():
    assert Increment(1).results_in(MAX_TIME) is None
    assert Increment(1).results_in(MAX_TIME - 1) == MAX_TIME
    assert Increment(0).results_in(MAX_TIME) == MAX_TIME
    assert Increment(MAX_TIME).followed_by(Increment(1)) is None
    assert Increment(MAX_TIME - 3).followed_by(Increment(3)) == Increment(MAX_TIME)


def test_increment_negative_delta_rejected():
    with pytest.raises(ValueError):
        Increment(-1)


def test_increment_followed_by_examples():
    assert Increment(2).followed_by(Increment(3)) == Increment(5)
    assert Increment(2).followed_by(Increment(3)).results_in(1) == 6
    assert Increment(4, bound=10).followed_by(Increment(7, bound=10)) is None
    # The first bound limits the intermediate time, the second one the final time.
    composed = Increment(0, bound=1).followed_by(Increment(1, bound=10))
    assert composed is not None
    assert composed.results_in(1) == 2  # 1 -> 1 (<= 1) -> 2 (<= 10)
    assert composed.results_in(2) is None  # 2 exceeds the first bound
    composed = Increment(3, bound=5).followed_by(Increment(2))
    assert composed.results_in(2) == 7
    assert composed.results_in(3) is None


def test_increment_order():
    assert Increment(1).less_equal(Increment(1))
    assert Increment(1).less_equal(Increment(2))
    assert not Increment(2).less_equal(Increment(1))
    assert Increment(1).less_than(Increment(2))
    assert not Increment(1).less_than(Increment(1))
    assert less_than(Increment(0), Increment(3))
    assert sorted([Increment(3), Increment(0), Increment(2)]) == [
        Increment(0),
        Increment(2),
        Increment(3),
    ]


def test_bounded_increment_is_not_below_unbounded_one():
    # Increment(1, bound=5) drops times that Increment(1) delivers, so it must not be
    # considered <= Increment(1) (an antichain of summaries would otherwise discard the
    # unbounded path and under-approximate where times can go).
    bounded, unbounded = Increment(1, bound=5), Increment(1)
    assert unbounded.less_equal(bounded)
    assert not bounded.less_equal(unbounded)
    assert bounded != unbounded


def test_identity_helpers():
    assert identity_summary(5) == Increment(0)
    ident = identity_summary(Product(Product(1, 2), 3))
    assert ident == ProductSummary(ProductSummary(Increment(0), Increment(0)), Increment(0))
    assert ident.results_in(Product(Product(1, 2), 3)) == Product(Product(1, 2), 3)
    assert is_identity(Increment(0))
    assert not is_identity(Increment(1))
    assert is_identity(ProductSummary(Increment(0), Increment(0)))
    assert not is_identity(ProductSummary(Increment(0), Increment(1)))
    assert not is_identity(ProductSummary(Increment(1), Increment(0)))
    with pytest.raises(TypeError):
        is_identity(3)


# -- ProductSummary ------------------------------------------------------------------------


def test_product_summary_results_in():
    s = ProductSummary(Increment(0), Increment(1))
    r = s.results_in(Product(3, 4))
    assert r == Product(3, 5)
    assert isinstance(r, Product)
    assert ProductSummary(Increment(2), Increment(0)).results_in(Product(3, 4)) == Product(5, 4)
    assert ProductSummary(Increment(0), Increment(5, bound=10)).results_in(Product(0, 8)) is None
    assert ProductSummary(Increment(5, bound=10), Increment(0)).results_in(Product(8, 0)) is None


def test_product_summary_followed_by():
    a = ProductSummary(Increment(1), Increment(0))
    b = ProductSummary(Increment(0), Increment(2))
    assert a.followed_by(b) == ProductSummary(Increment(1), Increment(2))
    assert a.followed_by(b).results_in(Product(0, 0)) == Product(1, 2)
    over = ProductSummary(Increment(0), Increment(MAX_TIME))
    assert over.followed_by(ProductSummary(Increment(0), Increment(1))) is None


def test_product_summary_order_is_product_order():
    a = ProductSummary(Increment(1), Increment(0))
    b = ProductSummary(Increment(0), Increment(1))
    assert not a.less_equal(b) and not b.less_equal(a)
    c = ProductSummary(Increment(1), Increment(1))
    assert a.less_equal(c) and b.less_equal(c)
    assert a.less_than(c) and not c.less_than(a)
    assert not c.less_than(c)
    assert hash(c) == hash(ProductSummary(Increment(1), Increment(1)))


# -- properties ----------------------------------------------------------------------------


@settings()
@given(increments, increments, int_times)
def test_increment_followed_by_composes(s1, s2, t):
    sequential = then(s2, s1.results_in(t))
    composed = s1.followed_by(s2)
    if sequential is not None:
        # Conservative: a time that survives the path must survive the composed summary.
        assert composed is not None
        assert composed.results_in(t) == sequential
    elif composed is not None:
        assert composed.results_in(t) is None
    if composed is None:
        # None only when every time is dropped along the path (even the least one).
        assert then(s2, s1.results_in(0)) is None


@settings()
@given(product_summaries, product_summaries, product_times)
def test_product_summary_followed_by_composes(s1, s2, t):
    sequential = then(s2, s1.results_in(t))
    composed = s1.followed_by(s2)
    if sequential is not None:
        assert composed is not None
        assert composed.results_in(t) == sequential
    elif composed is not None:
        assert composed.results_in(t) is None


@settings()
@given(increments, increments, int_times, int_times)
def test_increment_results_in_is_monotone(s1, s2, t1, t2):
    if s1.less_equal(s2):
        assert le_or_top(s1.results_in(t1), s2.results_in(t1))
    if t1 <= t2:
        assert le_or_top(s1.results_in(t1), s1.results_in(t2))
    r = s1.results_in(t1)
    assert r is None or r >= t1
    # Python's < extends the partial order (used to sort antichains of summaries).
    if s1.less_than(s2):
        assert s1 < s2
    if s1.less_equal(s2) and s2.less_equal(s1):
        assert s1 == s2 and hash(s1) == hash(s2)


@settings()
@given(product_summaries, product_summaries, product_times)
def test_product_summary_results_in_is_monotone(s1, s2, t):
    if s1.less_equal(s2):
        assert le_or_top(s1.results_in(t), s2.results_in(t))
    r = s1.results_in(t)
    if r is not None:
        assert less_equal(t, r)
        assert r == Product(t.outer + s1.outer.delta, t.inner + s1.inner.delta)
