"""``inspect`` and ``inspect_batch``: observe records as they pass.  Source: timely's
``inspect.rs``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.generic import unary

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def inspect_batch(stream: Stream, fn: Callable[[Any, Any], None], name: str = "Inspect") -> Stream:
    """Call ``fn(time, batch)`` for every batch; the stream passes through unchanged."""

    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                fn(ref.time, batch)
                out.give_batch(ref, batch)

        return logic

    return unary(stream, "pipeline", name, constructor)


def inspect(stream: Stream, fn: Callable[[Any], None], name: str = "Inspect") -> Stream:
    """Call ``fn(record)`` for every record; the stream passes through unchanged."""

    def each(time: Any, batch: Any) -> None:
        for x in batch:
            fn(x)

    return inspect_batch(stream, each, name)
