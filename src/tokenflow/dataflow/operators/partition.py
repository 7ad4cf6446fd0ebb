"""``partition`` and ``branch``: split one stream into several.  Source: timely's
``partition.rs`` and ``branch.rs``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.builder import OperatorBuilder

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def partition(
    stream: Stream, parts: int, route: Callable[[Any], tuple[int, Any]], name: str = "Partition"
) -> list[Stream]:
    """``parts`` streams; ``route(record) -> (index, value)`` sends ``value`` to stream ``index``.

    Raises:
        IndexError: when ``route`` returns an index outside ``0..parts-1`` (names the record).
    """
    builder = OperatorBuilder(name, stream.scope, notify=False)
    inp = builder.new_input(stream, "pipeline")
    outs = [builder.new_output() for _ in range(parts)]

    def constructor(caps: Any) -> Any:
        for c in caps:
            c.drop()

        def logic(frontiers: Any) -> None:
            for ref, batch in inp:
                buckets: list[list[Any]] = [[] for _ in range(parts)]
                for x in batch:
                    index, value = route(x)
                    if not 0 <= index < parts:
                        raise IndexError(
                            f"operator {name!r}: record {x!r} at time {ref.time!r} routed to "
                            f"part {index}, but there are {parts} parts"
                        )
                    buckets[index].append(value)
                for (out, _), bucket in zip(outs, buckets, strict=True):
                    if bucket:
                        out.give_batch(ref, bucket)

        return logic

    builder.build(constructor)
    return [s for _, s in outs]


def branch(
    stream: Stream, predicate: Callable[[Any], bool], name: str = "Branch"
) -> tuple[Stream, Stream]:
    """``(false_stream, true_stream)``: records go to the second when ``predicate`` holds."""
    false_s, true_s = partition(stream, 2, lambda x: (1 if predicate(x) else 0, x), name)
    return false_s, true_s
