"""``Product`` timestamps: the product partial order versus Python's lexicographic ``<``."""

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.order import PartialOrder, Product, less_equal, less_than, minimum

coord = st.integers(min_value=0, max_value=6)
flat_products = st.builds(Product, coord, coord)
nested_products = st.builds(Product, flat_products, coord)


def product_le(a, b):
    """Reference product order on (possibly nested) pairs of ints, written independently."""
    if isinstance(a, int):
        return a <= b
    return product_le(a[0], b[0]) and product_le(a[1], b[1])


# -- examples ------------------------------------------------------------------------------


def test_product_is_a_pair_with_outer_and_inner():
    p = Product(3, 7)
    assert p.outer == 3
    assert p.inner == 7
    assert tuple(p) == (3, 7)
    assert isinstance(p, PartialOrder)


def test_product_order_is_coordinatewise_not_lexicographic():
    a, b = Product(1, 5), Product(2, 3)
    # Incomparable in the product order ...
    assert not a.less_equal(b)
    assert not b.less_equal(a)
    assert not less_equal(a, b)
    assert not less_equal(b, a)
    assert not less_than(a, b)
    assert not less_than(b, a)
    # ... although lexicographically a < b.
    assert a < b
    assert not b < a


def test_product_less_equal_and_less_than_examples():
    assert Product(1, 2).less_equal(Product(1, 2))
    assert not Product(1, 2).less_than(Product(1, 2))
    assert Product(1, 2).less_equal(Product(1, 3))
    assert Product(1, 2).less_than(Product(1, 3))
    assert Product(1, 2).less_than(Product(2, 2))
    assert Product(1, 2).less_than(Product(4, 9))
    assert not Product(1, 3).less_equal(Product(1, 2))
    assert not Product(2, 0).less_equal(Product(1, 9))
    assert less_than(Product(0, 0), Product(0, 1))
    assert not less_than(Product(0, 1), Product(0, 0))


def test_nested_product_order():
    a = Product(Product(1, 5), 0)
    b = Product(Product(2, 3), 0)
    assert not less_equal(a, b) and not less_equal(b, a)
    assert less_equal(Product(Product(1, 3), 2), Product(Product(2, 3), 2))
    assert less_than(Product(Product(1, 3), 2), Product(Product(1, 3), 3))
    assert not less_equal(Product(Product(1, 3), 4), Product(Product(1, 3), 3))


def test_int_order_functions():
    assert less_equal(3, 3)
    assert less_equal(3, 4)
    assert not less_equal(4, 3)
    assert less_than(3, 4)
    assert not less_than(3, 3)


def test_sorting_products_is_lexicographic():
    times = [Product(2, 0), Product(1, 5), Product(1, 2), Product(0, 9)]
    assert sorted(times) == [Product(0, 9), Product(1, 2), Product(1, 5), Product(2, 0)]


def test_minimum():
    assert minimum(int) == 0
    assert minimum(17) == 0
    assert minimum(Product(3, 4)) == Product(0, 0)
    m = minimum(Product(Product(3, 4), 5))
    assert m == Product(Product(0, 0), 0)
    assert isinstance(m, Product) and isinstance(m.outer, Product)


def test_minimum_of_unknown_type_raises():
    import pytest

    with pytest.raises(TypeError):
        minimum(str)
    with pytest.raises(TypeError):
        minimum("abc")


def test_product_hash_equality_and_pickle():
    assert Product(1, 2) == Product(1, 2)
    assert Product(1, 2) != Product(2, 1)
    assert len({Product(1, 2), Product(1, 2), Product(2, 1)}) == 2
    for p in (Product(1, 2), Product(Product(3, 4), 5)):
        q = pickle.loads(pickle.dumps(p))
        assert q == p
        assert type(q) is Product
        assert type(q.outer) is type(p.outer)


def test_product_repr():
    assert repr(Product(1, 2)) == "(1, 2)"
    assert repr(Product(Product(1, 2), 3)) == "((1, 2), 3)"


# -- properties ----------------------------------------------------------------------------


@settings()
@given(st.one_of(st.tuples(flat_products, flat_products), st.tuples(nested_products, nested_products)))
def test_less_equal_matches_reference_product_order(pair):
    a, b = pair
    assert a.less_equal(b) == product_le(a, b)
    assert less_equal(a, b) == product_le(a, b)
    assert a.less_than(b) == (product_le(a, b) and a != b)
    assert less_than(a, b) == (product_le(a, b) and a != b)


@settings()
@given(st.one_of(st.tuples(flat_products, flat_products), st.tuples(nested_products, nested_products)))
def test_python_lt_is_lexicographic_and_extends_partial_order(pair):
    a, b = pair
    # Lexicographic: compare the outer coordinate first, then the inner one.
    if a.outer != b.outer:
        assert (a < b) == (a.outer < b.outer)
    else:
        assert (a < b) == (a.inner < b.inner)
    # Total order extending the partial order.
    if a.less_equal(b):
        assert a <= b
    if a.less_than(b):
        assert a < b
    assert (a < b) + (b < a) + (a == b) == 1


@settings()
@given(flat_products, flat_products, flat_products)
def test_product_order_is_a_partial_order(a, b, c):
    assert a.less_equal(a)
    if a.less_equal(b) and b.less_equal(a):
        assert a == b
    if a.less_equal(b) and b.less_equal(c):
        assert a.less_equal(c)
    assert minimum(a).less_equal(a)
