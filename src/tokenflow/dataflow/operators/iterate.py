"""Iteration: ``enter`` / ``leave`` a nested scope and ``feedback`` / ``connect_loop`` edges.

Source: notes on timely-dataflow's ``progress/`` ("Subgraph": child 0 bridges to the parent); timely's
``dataflow/operators/{enterleave,feedback}.rs``.  Records entering get time
``Product(t, 0)``; a feedback edge advances the iteration coordinate by its summary; leaving
drops it (``Product(t, i) -> t``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.channels import Tee
from tokenflow.dataflow.operators.builder import OperatorBuilder
from tokenflow.order.product import Product
from tokenflow.order.summary import Increment, ProductSummary
from tokenflow.progress.antichain import Antichain
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.progress.location import Source, Target

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream


class IngressNub:
    """Pushes outer messages into the nested scope, counting them for ``harvest_inputs``."""

    __slots__ = ("counter", "tee")

    def __init__(self, counter: ChangeBatch[Any], tee: Tee) -> None:
        self.counter = counter
        self.tee = tee

    def push(self, message: Any) -> None:
        time, batch = message
        inner = Product(time, 0)
        self.counter.update(inner, len(batch))
        self.tee.push((inner, batch))


class EgressNub:
    """Pushes inner messages to the outer scope, dropping the iteration coordinate."""

    __slots__ = ("tee",)

    def __init__(self, tee: Tee) -> None:
        self.tee = tee

    def push(self, message: Any) -> None:
        time, batch = message
        self.tee.push((time[0], batch))


def enter(stream: Stream, inner: Scope) -> Stream:
    """Bring ``stream`` (of ``inner``'s parent scope) into ``inner``.

    Raises:
        ValueError: when ``inner`` is not a child scope of the stream's scope.
    """
    from tokenflow.dataflow.stream import Stream

    if inner.parent is not stream.scope:
        raise ValueError(f"enter: scope {inner.name!r} is not nested in {stream.scope.name!r}")
    port, counter = inner.builder.new_input()
    tee = Tee()
    stream.connect_to(Target(inner.index, port), IngressNub(counter, tee))
    return Stream(Source(0, port), inner, tee, f"{stream.name}.enter")


def leave(stream: Stream) -> Stream:
    """Take ``stream`` out of its nested scope into the parent scope.

    Raises:
        ValueError: for a stream of a root scope.
    """
    from tokenflow.dataflow.stream import Stream

    inner = stream.scope
    outer = inner.parent
    if outer is None:
        raise ValueError(f"leave: stream {stream.name!r} is in a root scope")
    port = inner.builder.new_output()
    tee = Tee()
    stream.connect_to(Target(0, port), EgressNub(tee))
    return Stream(Source(inner.index, port), outer, tee, f"{stream.name}.leave")


class LoopHandle:
    """The open end of a feedback edge; close it with ``stream.connect_loop(handle)``."""

    def __init__(self, builder: OperatorBuilder, summary: Any, output: Any) -> None:
        self.builder = builder
        self.summary = summary
        self.output = output
        self.connected = False


def feedback(scope: Scope, summary: Any = 1) -> tuple[LoopHandle, Stream]:
    """A feedback edge in ``scope``: data sent into the handle re-appears on the returned
    stream at ``summary.results_in(time)`` (dropped when that overflows).

    ``summary`` is an ``int`` (iterations to add) or a path summary of the scope's times.

    Raises:
        ValueError: when ``summary`` does not strictly advance time.
    """
    if isinstance(summary, int):
        if summary <= 0:
            raise ValueError(f"feedback summary must be >= 1 iteration, got {summary}")
        if not isinstance(scope.identity, ProductSummary):
            raise ValueError("feedback with an int summary needs an iterative scope")
        summary = ProductSummary(scope.identity.outer, Increment(summary))
    builder = OperatorBuilder("Feedback", scope, notify=False)
    output, stream = builder.new_output()
    return LoopHandle(builder, summary, output), stream


def connect_loop(stream: Stream, handle: LoopHandle) -> None:
    """Feed ``stream`` into the feedback edge ``handle``.

    Raises:
        RuntimeError: when the handle is already connected.
    """
    if handle.connected:
        raise RuntimeError("feedback handle is already connected")
    handle.connected = True
    builder = handle.builder
    summary = handle.summary
    output = handle.output
    inp = builder.new_input_connection(stream, "pipeline", [Antichain.from_elem(summary)])
    results_in: Callable[[Any], Any] = summary.results_in

    def constructor(caps: Any) -> Any:
        caps[0].drop()

        def logic(frontiers: Any) -> None:
            for ref, batch in inp:
                new_time = results_in(ref.time)
                if new_time is not None:
                    output.give_batch(ref, batch, time=new_time)

        return logic

    builder.build(constructor)
