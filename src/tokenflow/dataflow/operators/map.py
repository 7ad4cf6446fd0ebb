"""Record-wise operators: ``map``, ``map_batch``, ``flat_map``, ``filter``.

Each runs on the pipeline pact (no data movement) and sends one output batch per input batch at
the input's time.  Source: timely's ``dataflow/operators/{map,filter}.rs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.generic import unary

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def _stateless(stream: Stream, name: str, transform: Callable[[Any], Any]) -> Stream:
    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                out.give_batch(ref, transform(batch))

        return logic

    return unary(stream, "pipeline", name, constructor)


def map(stream: Stream, fn: Callable[[Any], Any], name: str = "Map") -> Stream:  # noqa: A001
    """``fn(record)`` for every record of a list batch."""
    return _stateless(stream, name, lambda batch: [fn(x) for x in batch])


def map_batch(stream: Stream, fn: Callable[[Any], Any], name: str = "MapBatch") -> Stream:
    """``fn(batch) -> batch`` for every batch (the vectorized form: Arrow or list in, out)."""
    return _stateless(stream, name, fn)


def flat_map(stream: Stream, fn: Callable[[Any], Iterable[Any]], name: str = "FlatMap") -> Stream:
    """Every record of ``fn(record)`` for every record."""
    return _stateless(stream, name, lambda batch: [y for x in batch for y in fn(x)])


def filter(stream: Stream, predicate: Callable[[Any], bool], name: str = "Filter") -> Stream:  # noqa: A001
    """Records for which ``predicate(record)`` is true."""
    return _stateless(stream, name, lambda batch: [x for x in batch if predicate(x)])
