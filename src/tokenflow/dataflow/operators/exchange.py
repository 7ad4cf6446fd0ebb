"""``exchange`` and ``broadcast``: move records between workers without changing them.

Source: timely's ``dataflow/operators/{exchange,broadcast}.rs``; docs/ARCHITECTURE.md ("Data plane").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.channels import Broadcast, Exchange
from tokenflow.dataflow.operators.generic import unary

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def _forward(cap: Any, info: Any) -> Any:
    cap.drop()

    def logic(inp: Any, out: Any) -> None:
        for ref, batch in inp:
            out.give_batch(ref, batch)

    return logic


def exchange(
    stream: Stream,
    key: Callable[[Any], Any] | None = None,
    column: str | None = None,
    name: str = "Exchange",
) -> Stream:
    """Send each record to the worker its key routes to (``tokenflow.dataflow.routing``: a
    stable hash of ``key(record)``, or of the Arrow ``column``)."""
    return unary(stream, Exchange(key, column), name, _forward)


def broadcast(stream: Stream, name: str = "Broadcast") -> Stream:
    """Send every record to every worker."""
    return unary(stream, Broadcast(), name, _forward)
