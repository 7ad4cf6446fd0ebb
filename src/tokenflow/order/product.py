"""``Product(outer, inner)``: the timestamp of nested (iteration) scopes.

Source: notes on timely-dataflow's ``progress/`` (nested subgraphs); timely's ``order::Product``.
"""

from __future__ import annotations

from typing import Any

from tokenflow.order.partial_order import less_equal


class Product(tuple):  # type: ignore[type-arg]
    """A pair of timestamps ordered by the *product* order.

    ``Product(a, b).less_equal(Product(c, d))`` iff ``a ≤ c`` and ``b ≤ d`` (partial order).
    Python's ``<`` compares lexicographically (a total order extending the product order), which
    is what sorting and priority queues use.  Immutable and hashable (a 2-tuple).
    """

    __slots__ = ()

    def __new__(cls, outer: Any, inner: Any) -> Product:
        return tuple.__new__(cls, (outer, inner))

    @property
    def outer(self) -> Any:
        """The timestamp of the enclosing scope."""
        return self[0]

    @property
    def inner(self) -> Any:
        """The iteration coordinate of this scope."""
        return self[1]

    def less_equal(self, other: Product) -> bool:
        return less_equal(self[0], other[0]) and less_equal(self[1], other[1])

    def less_than(self, other: Product) -> bool:
        return self != other and self.less_equal(other)

    def minimum_like(self) -> Product:
        """The least ``Product`` with the same nesting shape as ``self``."""
        from tokenflow.order.partial_order import minimum

        return Product(minimum(self[0]), minimum(self[1]))

    def __repr__(self) -> str:
        return f"({self[0]!r}, {self[1]!r})"

    def __getnewargs__(self) -> tuple[Any, Any]:  # pickling
        return (self[0], self[1])
