"""``concat``: merge streams of one scope into one.  Source: timely's ``concat.rs``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.builder import OperatorBuilder

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def concat(first: Stream, *others: Stream, name: str = "Concat") -> Stream:
    """All records of ``first`` and ``others``, at their own times.

    Raises:
        ValueError: when a stream belongs to another scope.
    """
    builder = OperatorBuilder(name, first.scope, notify=False)
    inputs = [builder.new_input(s, "pipeline") for s in (first, *others)]
    output, stream = builder.new_output()

    def constructor(caps: Any) -> Any:
        caps[0].drop()

        def logic(frontiers: Any) -> None:
            for inp in inputs:
                for ref, batch in inp:
                    output.give_batch(ref, batch)

        return logic

    builder.build(constructor)
    return stream
