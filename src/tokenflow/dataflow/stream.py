"""``Stream``: the output of an operator, to which other operators connect.

Source: timely's ``dataflow/stream.rs``.  Library operators are available both as functions in
``tokenflow.dataflow.operators`` and as methods here, for chaining.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.channels import Push, Tee
from tokenflow.progress.location import Location

if TYPE_CHECKING:
    from tokenflow.dataflow.operators.capture import Capture
    from tokenflow.dataflow.operators.iterate import LoopHandle
    from tokenflow.dataflow.operators.probe import ProbeHandle
    from tokenflow.dataflow.scope import Scope


class Stream:
    """A stream of ``(time, batch)`` messages produced at output ``source`` of ``scope``."""

    __slots__ = ("source", "scope", "tee", "name")

    def __init__(self, source: Location, scope: Scope, tee: Tee, name: str) -> None:
        self.source = source
        self.scope = scope
        self.tee = tee
        self.name = name

    def connect_to(self, target: Location, pusher: Push, weight: int = 1) -> None:
        """Add the edge to ``target`` and deliver this stream's messages to ``pusher``.

        ``weight``: copies of each record the channel delivers across workers (the number of
        workers for a broadcast channel), so progress tracking counts every copy.
        """
        self.scope.connect(self.source, target, weight)
        self.tee.add_pusher(pusher)

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    # -- library operators as methods --------------------------------------------------------

    def map(self, fn: Callable[[Any], Any], name: str = "Map") -> Stream:
        from tokenflow.dataflow.operators.map import map as op

        return op(self, fn, name)

    def map_batch(self, fn: Callable[[Any], Any], name: str = "MapBatch") -> Stream:
        from tokenflow.dataflow.operators.map import map_batch

        return map_batch(self, fn, name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], name: str = "FlatMap") -> Stream:
        from tokenflow.dataflow.operators.map import flat_map

        return flat_map(self, fn, name)

    def filter(self, predicate: Callable[[Any], bool], name: str = "Filter") -> Stream:
        from tokenflow.dataflow.operators.map import filter as op

        return op(self, predicate, name)

    def exchange(self, key: Callable[[Any], Any] | None = None, column: str | None = None,
                 name: str = "Exchange") -> Stream:
        from tokenflow.dataflow.operators.exchange import exchange

        return exchange(self, key, column, name)

    def broadcast(self, name: str = "Broadcast") -> Stream:
        from tokenflow.dataflow.operators.exchange import broadcast

        return broadcast(self, name)

    def concat(self, *others: Stream, name: str = "Concat") -> Stream:
        from tokenflow.dataflow.operators.concat import concat

        return concat(self, *others, name=name)

    def inspect(self, fn: Callable[[Any], None], name: str = "Inspect") -> Stream:
        from tokenflow.dataflow.operators.inspect import inspect

        return inspect(self, fn, name)

    def inspect_batch(self, fn: Callable[[Any, Any], None], name: str = "Inspect") -> Stream:
        from tokenflow.dataflow.operators.inspect import inspect_batch

        return inspect_batch(self, fn, name)

    def probe(self, name: str = "Probe") -> ProbeHandle:
        from tokenflow.dataflow.operators.probe import probe

        return probe(self, name)

    def probe_with(self, handle: ProbeHandle, name: str = "Probe") -> Stream:
        from tokenflow.dataflow.operators.probe import probe_with

        return probe_with(self, handle, name)

    def capture(self, name: str = "Capture") -> Capture:
        from tokenflow.dataflow.operators.capture import capture

        return capture(self, name)

    def delay(self, fn: Callable[[Any, Any], Any], name: str = "Delay") -> Stream:
        from tokenflow.dataflow.operators.delay import delay

        return delay(self, fn, name)

    def partition(self, parts: int, route: Callable[[Any], tuple[int, Any]],
                  name: str = "Partition") -> list[Stream]:
        from tokenflow.dataflow.operators.partition import partition

        return partition(self, parts, route, name)

    def branch(self, predicate: Callable[[Any], bool], name: str = "Branch") -> tuple[Stream, Stream]:
        from tokenflow.dataflow.operators.partition import branch

        return branch(self, predicate, name)

    def tumbling(self, size: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                 name: str = "Tumbling") -> Stream:
        from tokenflow.dataflow.operators.window import tumbling

        return tumbling(self, size, reduce, name)

    def sliding(self, size: int, slide: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                name: str = "Sliding") -> Stream:
        from tokenflow.dataflow.operators.window import sliding

        return sliding(self, size, slide, reduce, name)

    def assign_watermarks(self, name: str = "AssignWatermarks") -> Stream:
        from tokenflow.dataflow.operators.watermark import assign_watermarks

        return assign_watermarks(self, name)

    def tumbling_watermark(self, size: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                           key: Callable[[Any], Any] | None = None,
                           name: str = "TumblingWatermark") -> Stream:
        from tokenflow.dataflow.operators.watermark import tumbling_watermark

        return tumbling_watermark(self, size, reduce, key, name)

    def strip_watermarks(self, name: str = "StripWatermarks") -> Stream:
        from tokenflow.dataflow.operators.watermark import strip_watermarks

        return strip_watermarks(self, name)

    def enter(self, inner: Scope) -> Stream:
        from tokenflow.dataflow.operators.iterate import enter

        return enter(self, inner)

    def leave(self) -> Stream:
        from tokenflow.dataflow.operators.iterate import leave

        return leave(self)

    def connect_loop(self, handle: LoopHandle) -> None:
        from tokenflow.dataflow.operators.iterate import connect_loop

        connect_loop(self, handle)

    def unary(self, pact: Any, name: str, constructor: Any) -> Stream:
        from tokenflow.dataflow.operators.generic import unary

        return unary(self, pact, name, constructor)

    def unary_frontier(self, pact: Any, name: str, constructor: Any) -> Stream:
        from tokenflow.dataflow.operators.generic import unary_frontier

        return unary_frontier(self, pact, name, constructor)

    def unary_notify(self, pact: Any, name: str, init: Iterable[Any], logic: Any) -> Stream:
        from tokenflow.dataflow.operators.generic import unary_notify

        return unary_notify(self, pact, name, init, logic)

    def binary(self, other: Stream, pact1: Any, pact2: Any, name: str, constructor: Any) -> Stream:
        from tokenflow.dataflow.operators.generic import binary

        return binary(self, other, pact1, pact2, name, constructor)

    def binary_frontier(self, other: Stream, pact1: Any, pact2: Any, name: str,
                        constructor: Any) -> Stream:
        from tokenflow.dataflow.operators.generic import binary_frontier

        return binary_frontier(self, other, pact1, pact2, name, constructor)

    def sink(self, pact: Any, name: str, logic: Any) -> None:
        from tokenflow.dataflow.operators.generic import sink

        sink(self, pact, name, logic)
