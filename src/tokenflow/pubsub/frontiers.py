"""Lower and upper frontiers of a published stream, and the epoch filter built from them.

Source: the Strymon publish/subscribe protocol, "Design": the *lower frontier* is the antichain of
minimal active epochs (timely's frontier), the *upper frontier* the antichain of maximal epochs
observed; a subscriber that drops every time ``t ≤ u`` for some ``u`` of the upper frontier it
saw on joining only ever sees epochs that were latent then, so never part of an epoch.  Several
partitions: the filter is the maximal antichain of all their upper frontiers, the lower
frontier the minimal antichain of theirs.

Times are ``int`` or ``tokenflow.order.Product`` (any type with ``less_equal``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenflow.order.partial_order import less_equal


def minimal(times: Iterable[Any]) -> list[Any]:
    """The antichain of minimal elements of ``times`` (duplicates removed)."""
    out: list[Any] = []
    for t in times:
        if any(less_equal(o, t) for o in out):
            continue
        out = [o for o in out if not less_equal(t, o)]
        out.append(t)
    return out


def maximal(times: Iterable[Any]) -> list[Any]:
    """The antichain of maximal elements of ``times`` (duplicates removed)."""
    out: list[Any] = []
    for t in times:
        if any(less_equal(t, o) for o in out):
            continue
        out = [o for o in out if not less_equal(o, t)]
        out.append(t)
    return out


def passed(frontier: Iterable[Any], time: Any) -> bool:
    """True when no element of ``frontier`` is ``≤ time``: epoch ``time`` is complete."""
    return not any(less_equal(f, time) for f in frontier)


@dataclass
class UpperFrontier:
    """The maximal antichain of the times inserted so far (the seed's upper frontier)."""

    elements: list[Any] = field(default_factory=list)

    def insert(self, time: Any) -> bool:
        """Add ``time``; True when the antichain changed."""
        elements = self.elements
        if len(elements) == 1 and elements[0].__class__ is int and time.__class__ is int:
            if time <= elements[0]:
                return False
            elements[0] = time
            return True
        if any(less_equal(time, u) for u in elements):
            return False
        self.elements = [u for u in elements if not less_equal(u, time)]
        self.elements.append(time)
        return True


@dataclass
class EpochFilter:
    """Which epochs a subscriber takes: time ``t`` passes when no element of ``drop_upto`` is
    ``≥ t`` and, with ``since``, some element of ``since`` is ``≤ t``.

    ``drop_upto`` is the (merged) upper frontier at joining (epochs possibly active then);
    ``since`` is a resume position: the subscriber's lower frontier when it was disconnected
    (every epoch not ``≥`` it was already delivered).  Both are antichains.
    """

    drop_upto: list[Any] = field(default_factory=list)
    since: list[Any] | None = None

    def passes(self, time: Any) -> bool:
        for u in self.drop_upto:
            if less_equal(time, u):
                return False
        if self.since is None:
            return True
        return any(less_equal(s, time) for s in self.since)

    def relax(self, lower: Iterable[Any]) -> None:
        """Forget the elements of ``drop_upto`` that ``lower`` has passed: no time ``≤`` them
        can arrive any more (the seed: the filter ends once the lower frontier dominates it)."""
        lower = list(lower)
        self.drop_upto = [u for u in self.drop_upto if not passed(lower, u)]
