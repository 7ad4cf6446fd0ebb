"""The ``PartialOrder`` protocol and the order functions used on every timestamp.

Source: notes on timely-dataflow's ``progress/`` ("Concepts"), timely's ``order.rs``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PartialOrder(Protocol):
    """A value with a partial order, in addition to Python's total order (``<``).

    ``less_equal(other)`` must be reflexive, antisymmetric and transitive, and the total order
    given by ``<`` must extend it (``a.less_equal(b)`` implies ``a <= b``), so that sorting by
    ``<`` never places a time before one that is less than it.
    """

    def less_equal(self, other: Any) -> bool: ...

    def less_than(self, other: Any) -> bool: ...


def less_equal(a: Any, b: Any) -> bool:
    """``a ≤ b`` in the partial order; plain ``int`` times use the integer order."""
    if a.__class__ is int:
        return bool(a <= b)
    return bool(a.less_equal(b))


def less_than(a: Any, b: Any) -> bool:
    """``a < b`` in the partial order: ``a ≤ b`` and ``a != b``."""
    if a.__class__ is int:
        return bool(a < b)
    return bool(a.less_than(b))


def minimum(time_type: type | Any) -> Any:
    """The least element of a timestamp type (``0`` for ``int``).

    Accepts either the type (``int``) or an example time (``Product(3, 4)`` gives
    ``Product(0, 0)``, nested products recursively).

    Raises:
        TypeError: for a type that is neither ``int`` nor has a ``minimum()`` method.
    """
    if time_type is int or time_type.__class__ is int:
        return 0
    if isinstance(time_type, type):
        if hasattr(time_type, "minimum"):
            return time_type.minimum()  # type: ignore[attr-defined]
        raise TypeError(f"timestamp type {time_type!r} has no minimum()")
    if hasattr(time_type, "minimum_like"):
        return time_type.minimum_like()
    raise TypeError(f"timestamp {time_type!r} has no minimum()")
