"""Locations in a dataflow scope: an operator's input port (target) or output port (source).

Source: notes on timely-dataflow's ``progress/`` ("Per-Port Information"); timely's ``Location``.
A *pointstamp* is a ``(Location, time)`` pair.
"""

from __future__ import annotations

from typing import NamedTuple


class Location(NamedTuple):
    """Port ``port`` of operator ``node``; ``is_source`` for output ports, else input ports."""

    node: int
    port: int
    is_source: bool

    def __repr__(self) -> str:
        kind = "Source" if self.is_source else "Target"
        return f"{kind}({self.node}, {self.port})"


def Source(node: int, port: int) -> Location:  # noqa: N802 - reads like timely's constructor
    """The output port ``port`` of operator ``node``."""
    return Location(node, port, True)


def Target(node: int, port: int) -> Location:  # noqa: N802
    """The input port ``port`` of operator ``node``."""
    return Location(node, port, False)
