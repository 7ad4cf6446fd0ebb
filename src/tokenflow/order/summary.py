"""Path summaries: how a timestamp advances along a dataflow path.

Source: notes on timely-dataflow's ``progress/`` ("Output Summarizer"); timely's ``PathSummary``
trait.
``results_in(t)`` returns the least time a message at ``t`` becomes after the path, or ``None``
when the result would pass the declared bound (the message can never arrive);
``followed_by(other)`` composes two paths (``None`` on overflow).  Summaries are themselves
partially ordered, so the minimal summaries between two locations form an ``Antichain``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tokenflow.order.partial_order import less_equal

MAX_TIME = 2**64 - 1
"""Largest integer timestamp (timely's ``u64::MAX``); ``Increment`` never produces more."""


@runtime_checkable
class PathSummary(Protocol):
    """What a path does to a timestamp; partially ordered like timestamps."""

    def results_in(self, time: Any) -> Any | None: ...

    def followed_by(self, other: Any) -> Any | None: ...

    def less_equal(self, other: Any) -> bool: ...

    def less_than(self, other: Any) -> bool: ...


class Increment:
    """Summary for ``int`` times: add ``delta`` (≥ 0), never beyond ``bound``."""

    __slots__ = ("delta", "bound")

    def __init__(self, delta: int = 0, bound: int = MAX_TIME) -> None:
        if delta < 0:
            raise ValueError(f"Increment delta must be >= 0, got {delta}")
        self.delta = delta
        self.bound = bound

    def results_in(self, time: int) -> int | None:
        result = time + self.delta
        return result if result <= self.bound else None

    def followed_by(self, other: Increment) -> Increment | None:
        delta = self.delta + other.delta
        # ``t`` survives both steps iff ``t + self.delta <= self.bound`` and
        # ``t + delta <= other.bound``, i.e. ``t + delta <= min(self.bound + other.delta,
        # other.bound)``: ``self.bound`` limits the intermediate time, not the final one.
        bound = min(self.bound + other.delta, other.bound)
        return Increment(delta, bound) if delta <= bound else None

    def less_equal(self, other: Increment) -> bool:
        # ``self`` never gives a later time, and is defined wherever ``other`` is (a bounded
        # summary must not be taken as <= an unbounded one: it drops more times).
        return self.delta <= other.delta and self.bound - self.delta >= other.bound - other.delta

    def less_than(self, other: Increment) -> bool:
        return self != other and self.less_equal(other)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Increment)
            and self.delta == other.delta
            and self.bound == other.bound
        )

    def __lt__(self, other: Increment) -> bool:
        # A total order extending ``less_equal``.
        return (self.delta, self.delta - self.bound) < (other.delta, other.delta - other.bound)

    def __hash__(self) -> int:
        return hash(("Increment", self.delta, self.bound))

    def __repr__(self) -> str:
        if self.bound == MAX_TIME:
            return f"Increment({self.delta})"
        return f"Increment({self.delta}, bound={self.bound})"


class ProductSummary:
    """Summary for ``Product`` times: ``outer`` applies to ``.outer``, ``inner`` to ``.inner``."""

    __slots__ = ("outer", "inner")

    def __init__(self, outer: Any, inner: Any) -> None:
        self.outer = outer
        self.inner = inner

    def results_in(self, time: Any) -> Any | None:
        from tokenflow.order.product import Product

        outer = self.outer.results_in(time[0])
        if outer is None:
            return None
        inner = self.inner.results_in(time[1])
        if inner is None:
            return None
        return Product(outer, inner)

    def followed_by(self, other: ProductSummary) -> ProductSummary | None:
        outer = self.outer.followed_by(other.outer)
        inner = self.inner.followed_by(other.inner)
        if outer is None or inner is None:
            return None
        return ProductSummary(outer, inner)

    def less_equal(self, other: ProductSummary) -> bool:
        return less_equal(self.outer, other.outer) and less_equal(self.inner, other.inner)

    def less_than(self, other: ProductSummary) -> bool:
        return self != other and self.less_equal(other)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProductSummary)
            and self.outer == other.outer
            and self.inner == other.inner
        )

    def __lt__(self, other: ProductSummary) -> bool:
        return (self.outer, self.inner) < (other.outer, other.inner)

    def __hash__(self) -> int:
        return hash(("ProductSummary", self.outer, self.inner))

    def __repr__(self) -> str:
        return f"ProductSummary({self.outer!r}, {self.inner!r})"


def identity_summary(time: Any) -> Any:
    """The summary that leaves times shaped like ``time`` unchanged (timely's ``Default``)."""
    if time.__class__ is int:
        return Increment(0)
    return ProductSummary(identity_summary(time[0]), identity_summary(time[1]))


def is_identity(summary: Any) -> bool:
    """True when ``summary`` does not strictly advance any time (a zero increment everywhere)."""
    if isinstance(summary, Increment):
        return summary.delta == 0
    if isinstance(summary, ProductSummary):
        return is_identity(summary.outer) and is_identity(summary.inner)
    raise TypeError(f"unknown path summary {summary!r}")
