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

    def connect_to(self, target: Location, pusher: Push, weight: int = 1,
                   per_worker: bool = False) -> None:
        """Add the edge to ``target`` and deliver this stream's messages to ``pusher``.

        ``weight``: copies of each record the channel delivers across workers (the number of
        workers for a broadcast channel), so progress tracking counts every copy;
        ``per_worker``: the weight is the number of workers and follows the roster.
        """
        self.scope.connect(self.source, target, weight, per_worker)
        self.tee.add_pusher(pusher)

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    # -- library operators as methods --------------------------------------------------------

    def map(self, fn: Callable[[Any], Any], name: str = "Map") -> Stream:
        """Apply ``fn`` to every record: ``fn(record) -> record``, one output per input record.

        In: ``list`` batches (iterating an Arrow ``RecordBatch`` yields its columns, so use
        ``map_batch`` for Arrow).  Out: one ``list`` batch per input batch, at the input
        message's time.  Pipeline pact (records stay on this worker); stateless.

        Raises:
            Whatever ``fn`` raises, at run time (out of ``worker.step()``; ``WorkerError`` from
            ``execute``).

        Delegates to ``tokenflow.dataflow.operators.map.map``.
        """
        from tokenflow.dataflow.operators.map import map as op

        return op(self, fn, name)

    def map_batch(self, fn: Callable[[Any], Any], name: str = "MapBatch") -> Stream:
        """Apply ``fn`` to every whole batch: ``fn(batch) -> batch`` (the vectorized form).

        In and out: ``list`` or Arrow ``RecordBatch`` (``fn`` may change the kind, e.g. Arrow in,
        Arrow out after ``pyarrow.compute``); the output batch is sent at the input message's
        time, and an empty result sends nothing.  Pipeline pact; stateless.  ``fn`` must not
        keep and later mutate a ``list`` it returns (it may be sent without a copy).

        Raises:
            Whatever ``fn`` raises, at run time; ``TypeError`` at run time when the result has
            no ``len``.

        Delegates to ``tokenflow.dataflow.operators.map.map_batch``.
        """
        from tokenflow.dataflow.operators.map import map_batch

        return map_batch(self, fn, name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], name: str = "FlatMap") -> Stream:
        """Replace every record by the records of ``fn(record)`` (any iterable, maybe empty).

        In: ``list`` batches.  Out: one ``list`` batch per input batch (flattened, in order), at
        the input message's time.  Pipeline pact; stateless.

        Raises:
            Whatever ``fn`` raises, at run time; ``TypeError`` when ``fn`` returns a
            non-iterable.

        Delegates to ``tokenflow.dataflow.operators.map.flat_map``.
        """
        from tokenflow.dataflow.operators.map import flat_map

        return flat_map(self, fn, name)

    def filter(self, predicate: Callable[[Any], bool], name: str = "Filter") -> Stream:
        """Keep the records for which ``predicate(record)`` is true.

        In: ``list`` batches (for Arrow, use ``map_batch`` with ``RecordBatch.filter``).  Out:
        ``list`` batches at the input message's time; a batch left empty is not sent.
        Pipeline pact; stateless.

        Raises:
            Whatever ``predicate`` raises, at run time.

        Delegates to ``tokenflow.dataflow.operators.map.filter``.
        """
        from tokenflow.dataflow.operators.map import filter as op

        return op(self, predicate, name)

    def exchange(self, key: Callable[[Any], Any] | None = None, column: str | None = None,
                 name: str = "Exchange") -> Stream:
        """Move every record to the worker that owns its key; records and times are unchanged.

        Exchange pact: ``key(record)`` for ``list`` batches (None: the record itself is the
        key), or the Arrow ``column`` (hashed vectorized) for ``RecordBatch``es; an Arrow batch
        without ``column`` is routed by ``key(row)`` over its rows as dicts (the row itself
        when ``key`` is None).  The key's stable hash
        (int64 by value, ``str`` by UTF-8 bytes, anything else by ``str()``; never Python's
        salted ``hash()``) picks one of the job's bins, and the worker's ``RoutingTable`` picks
        the bin's owner, so a key goes to the same worker on every runtime.  Out: the parts of
        each batch, same kind (``list`` or Arrow), at the same time.

        Raises:
            KeyError: at run time when ``column`` is not a column of an Arrow batch (with more
                than one worker).
            TypeError: at run time for a batch that is neither a ``list`` nor an Arrow batch.

        Delegates to ``tokenflow.dataflow.operators.exchange.exchange``.
        """
        from tokenflow.dataflow.operators.exchange import exchange

        return exchange(self, key, column, name)

    def broadcast(self, name: str = "Broadcast") -> Stream:
        """Send every record to every worker (each worker gets a copy of each batch).

        Broadcast pact: each receiving worker gets its own ``list``, Arrow batches are shared;
        times are unchanged.  Progress tracking counts the ``peers`` copies (the edge weight).

        Delegates to ``tokenflow.dataflow.operators.exchange.broadcast``.
        """
        from tokenflow.dataflow.operators.exchange import broadcast

        return broadcast(self, name)

    def concat(self, *others: Stream, name: str = "Concat") -> Stream:
        """Merge this stream and ``others`` (of the same scope) into one stream.

        In and out: batches of any kind, passed through unchanged at their own times, in the
        order the inputs are read (this stream first at each invocation).  Pipeline pact.

        Raises:
            ValueError: when a stream belongs to another scope.

        Delegates to ``tokenflow.dataflow.operators.concat.concat``.
        """
        from tokenflow.dataflow.operators.concat import concat

        return concat(self, *others, name=name)

    def inspect(self, fn: Callable[[Any], None], name: str = "Inspect") -> Stream:
        """Call ``fn(record)`` for every record; the stream passes through unchanged.

        In: ``list`` batches (an Arrow batch would be walked by column; use ``inspect_batch``).
        Out: the same batches at the same times.  Pipeline pact.

        Raises:
            Whatever ``fn`` raises, at run time.

        Delegates to ``tokenflow.dataflow.operators.inspect.inspect``.
        """
        from tokenflow.dataflow.operators.inspect import inspect

        return inspect(self, fn, name)

    def inspect_batch(self, fn: Callable[[Any, Any], None], name: str = "Inspect") -> Stream:
        """Call ``fn(time, batch)`` for every batch; the stream passes through unchanged.

        In and out: ``list`` or Arrow batches, unchanged, at their times.  Pipeline pact.
        ``fn`` must not mutate the batch.

        Raises:
            Whatever ``fn`` raises, at run time.

        Delegates to ``tokenflow.dataflow.operators.inspect.inspect_batch``.
        """
        from tokenflow.dataflow.operators.inspect import inspect_batch

        return inspect_batch(self, fn, name)

    def probe(self, name: str = "Probe") -> ProbeHandle:
        """A ``ProbeHandle`` that tracks this stream's frontier on this worker.

        Use ``handle.less_than(t)`` / ``less_equal(t)`` / ``done()`` from worker code, e.g.
        ``worker.step_while(lambda: probe.less_than(t))``.  Until the probe first runs the
        handle reports the scope's minimum time.  Pipeline pact; no stream is returned.

        Delegates to ``tokenflow.dataflow.operators.probe.probe``.
        """
        from tokenflow.dataflow.operators.probe import probe

        return probe(self, name)

    def probe_with(self, handle: ProbeHandle, name: str = "Probe") -> Stream:
        """Pass the stream through while ``handle`` tracks its frontier.

        Several streams may share one handle (its frontier is then their combined frontier).
        In and out: the same batches at the same times.  Pipeline pact.

        Delegates to ``tokenflow.dataflow.operators.probe.probe_with``.
        """
        from tokenflow.dataflow.operators.probe import probe_with

        return probe_with(self, handle, name)

    def capture(self, name: str = "Capture") -> Capture:
        """Record every message and frontier change this worker sees; returns the ``Capture``.

        ``Capture.events``: ``(time, batch)`` in arrival order (batches as received, ``list``
        or Arrow); ``frontiers``: the input frontier after each change; ``by_time()`` and
        ``records()`` flatten Arrow rows to dicts; ``done`` once the frontier is empty.
        Pipeline pact: it holds this worker's share only.  The stream ends here.

        Delegates to ``tokenflow.dataflow.operators.capture.capture``.
        """
        from tokenflow.dataflow.operators.capture import capture

        return capture(self, name)

    def publish(self, topic: str, **options: Any) -> Any:
        """Serve this stream as ``topic`` to subscribers, a partition per worker, registered in
        the job's catalog (run the job with ``execute(..., catalog=Catalog().endpoint)``).
        Whole epochs only reach subscribers (the Strymon publish/subscribe protocol).  Returns
        this worker's ``Publisher``; ``options`` and errors as for ``tokenflow.pubsub.publish``.

        Delegates to ``tokenflow.pubsub.publish`` (looked up by name: that layer is above this
        one).
        """
        import importlib

        return importlib.import_module("tokenflow.pubsub").publish(self, topic, **options)

    def delay(self, fn: Callable[[Any, Any], Any], name: str = "Delay") -> Stream:
        """Send each record at the later time ``fn(record, time)``, once that time is complete.

        In: ``list`` batches.  Out: ``list`` batches at the new times, each released when the
        input frontier has passed it (one token per pending time, Naiad-style notification).
        Pipeline pact.  ``fn(record, time)`` must return a time ≥ ``time``.

        Raises:
            CapabilityError: at run time when ``fn`` returns an earlier or incomparable time
                (names the operator, the record and both times).

        Delegates to ``tokenflow.dataflow.operators.delay.delay``.
        """
        from tokenflow.dataflow.operators.delay import delay

        return delay(self, fn, name)

    def partition(self, parts: int, route: Callable[[Any], tuple[int, Any]],
                  name: str = "Partition") -> list[Stream]:
        """Split the stream into ``parts`` streams: ``route(record) -> (index, value)``.

        In: ``list`` batches.  Out: ``parts`` streams of ``list`` batches; ``value`` goes to
        stream ``index`` at the input message's time (empty parts are not sent).  Pipeline pact.

        Raises:
            IndexError: at run time when ``route`` returns an index outside
                ``0..parts-1`` (names the record and time).

        Delegates to ``tokenflow.dataflow.operators.partition.partition``.
        """
        from tokenflow.dataflow.operators.partition import partition

        return partition(self, parts, route, name)

    def branch(self, predicate: Callable[[Any], bool], name: str = "Branch") -> tuple[Stream, Stream]:
        """Split the stream by ``predicate``: returns ``(false_stream, true_stream)``.

        In: ``list`` batches.  Out: two streams of ``list`` batches at the input times; a record
        goes to the second when ``predicate(record)`` is true.  Pipeline pact.

        Raises:
            Whatever ``predicate`` raises, at run time.

        Delegates to ``tokenflow.dataflow.operators.partition.branch``.
        """
        from tokenflow.dataflow.operators.partition import branch

        return branch(self, predicate, name)

    def tumbling(self, size: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                 name: str = "Tumbling") -> Stream:
        """Tumbling event-time windows ``[k*size, (k+1)*size)``, reduced when they close.

        In: batches (``list``; Arrow rows become dicts) on a stream with ``int`` times; a record
        is in the window of its message time.  Out: the records ``reduce(start, end, records)``
        returns (``records`` a ``list``, this worker's only), as one ``list`` batch at time
        ``end`` once the input frontier has passed ``end``.  One token per open window; windows
        without data produce nothing.  Pipeline pact: exchange by key first to gather a key.

        Raises:
            ValueError: when ``size <= 0``.
            TypeError: when ``size`` is not an ``int``; at run time for a non-``int`` time or
                a ``reduce`` returning None.

        Delegates to ``tokenflow.dataflow.operators.window.tumbling``.
        """
        from tokenflow.dataflow.operators.window import tumbling

        return tumbling(self, size, reduce, name)

    def sliding(self, size: int, slide: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                name: str = "Sliding") -> Stream:
        """Sliding event-time windows ``[s, s + size)`` for every multiple ``s`` of ``slide``.

        As ``tumbling`` (``int`` times, ``reduce(start, end, records)`` at time ``end`` once the
        frontier passes it, ``list`` output, pipeline pact), but a record is in every window
        containing its time (``size / slide`` of them when ``slide`` divides ``size``).

        Raises:
            ValueError: when ``size <= 0``, ``slide <= 0`` or ``slide > size``.
            TypeError: when ``size`` or ``slide`` is not an ``int``; at run time for a
                non-``int`` time or a ``reduce`` returning None.

        Delegates to ``tokenflow.dataflow.operators.window.sliding``.
        """
        from tokenflow.dataflow.operators.window import sliding

        return sliding(self, size, slide, reduce, name)

    def assign_watermarks(self, name: str = "AssignWatermarks") -> Stream:
        """Pass the data through and add in-band ``Watermark`` records from the input frontier.

        In: any batches with ``int`` times.  Out: the same data plus, whenever the frontier
        advances to ``w``, ``peers`` copies of ``Watermark(w, worker)`` in a ``list`` batch at
        time ``w`` (``MAX_WATERMARK`` when the frontier empties); the operator holds one token
        for its output watermark.  Pipeline pact; read the result through a ``WatermarkPact``
        (``tumbling_watermark`` does).

        Raises:
            TypeError: at run time when a frontier time is not an ``int``.

        Delegates to ``tokenflow.dataflow.operators.watermark.assign_watermarks``.
        """
        from tokenflow.dataflow.operators.watermark import assign_watermarks

        return assign_watermarks(self, name)

    def tumbling_watermark(self, size: int, reduce: Callable[[int, int, list[Any]], Iterable[Any]],
                           key: Callable[[Any], Any] | None = None,
                           name: str = "TumblingWatermark") -> Stream:
        """Tumbling windows closed by in-band watermarks (the Flink idiom); same output as
        ``tumbling``.

        In: data and ``Watermark`` records (``list`` batches, ``int`` times), e.g. from
        ``assign_watermarks``.  Out: ``reduce(start, end, records)`` results at time ``end``
        once the minimum of the upstream workers' latest watermarks reaches ``end``, with the
        operator's own watermarks forwarded (strip them with ``strip_watermarks``).
        ``WatermarkPact``: data stays on its worker (or is exchanged by ``key``), every worker
        gets every upstream worker's watermarks.  The input frontier is not consulted.

        Raises:
            ValueError: when ``size <= 0``; at run time for a watermark from an unknown worker.
            TypeError: when ``size`` is not an ``int``; at run time for a non-``int`` time.
            LateDataError: at run time for data behind the watermark (a closed window).

        Delegates to ``tokenflow.dataflow.operators.watermark.tumbling_watermark``.
        """
        from tokenflow.dataflow.operators.watermark import tumbling_watermark

        return tumbling_watermark(self, size, reduce, key, name)

    def strip_watermarks(self, name: str = "StripWatermarks") -> Stream:
        """The stream without its ``Watermark`` records.

        In: ``list`` batches with watermarks interleaved (batches without any pass as they are,
        Arrow included).  Out: the data records at the same times; batches left empty are not
        sent.  Pipeline pact.

        Delegates to ``tokenflow.dataflow.operators.watermark.strip_watermarks``.
        """
        from tokenflow.dataflow.operators.watermark import strip_watermarks

        return strip_watermarks(self, name)

    def enter(self, inner: Scope) -> Stream:
        """This stream, brought into the nested scope ``inner`` (from ``scope.iterative``).

        Records are unchanged; a message at time ``t`` enters at ``Product(t, 0)``.  No operator
        and no data movement (an edge into the inner scope's child 0).

        Raises:
            ValueError: when ``inner`` is not a child scope of this stream's scope.

        Delegates to ``tokenflow.dataflow.operators.iterate.enter``.
        """
        from tokenflow.dataflow.operators.iterate import enter

        return enter(self, inner)

    def leave(self) -> Stream:
        """This stream, taken out of its nested scope into the parent scope.

        Records are unchanged; ``Product(t, i)`` becomes ``t`` (the iteration coordinate is
        dropped).

        Raises:
            ValueError: for a stream of a root scope.

        Delegates to ``tokenflow.dataflow.operators.iterate.leave``.
        """
        from tokenflow.dataflow.operators.iterate import leave

        return leave(self)

    def connect_loop(self, handle: LoopHandle) -> None:
        """Feed this stream into the feedback edge ``handle`` (from ``scope.feedback(summary)``).

        Each batch re-appears on the feedback stream at ``summary.results_in(time)`` (one more
        iteration by default); a batch whose new time would pass the summary's bound is
        dropped.  Pipeline pact.

        Raises:
            RuntimeError: when ``handle`` is already connected.
            ValueError: when this stream is not in the handle's scope.

        Delegates to ``tokenflow.dataflow.operators.iterate.connect_loop``.
        """
        from tokenflow.dataflow.operators.iterate import connect_loop

        connect_loop(self, handle)

    def unary(self, pact: Any, name: str, constructor: Any) -> Stream:
        """A custom operator with this stream as its one input and one output.

        ``constructor(capability, info)`` gets the output's token at the minimum time and an
        ``OperatorInfo`` (drop the token unless the operator produces data unprompted) and
        returns ``logic(input, output)``, called when data arrives or on ``info.activate()``
        (not on frontier changes).  ``input`` yields ``(CapabilityRef, batch)``, batch ``list``
        or Arrow; send with ``output.session(ref)`` or ``output.give_batch(ref, batch)``.
        ``pact``: ``"pipeline"``, ``"broadcast"``, a key function or ``Exchange(...)``.

        Raises:
            ValueError: for an unknown pact name.
            CapabilityError: at run time for token misuse (stale ref, uncovered time, ...).

        Delegates to ``tokenflow.dataflow.operators.generic.unary``.
        """
        from tokenflow.dataflow.operators.generic import unary

        return unary(self, pact, name, constructor)

    def unary_frontier(self, pact: Any, name: str, constructor: Any) -> Stream:
        """Like ``unary``, but ``logic`` also runs when the input frontier changes.

        For operators that act on completeness (``input.frontier.less_than(t)`` et al.), such
        as windows that retire held tokens.  Same arguments, pacts and errors as ``unary``.

        Delegates to ``tokenflow.dataflow.operators.generic.unary_frontier``.
        """
        from tokenflow.dataflow.operators.generic import unary_frontier

        return unary_frontier(self, pact, name, constructor)

    def unary_notify(self, pact: Any, name: str, init: Iterable[Any], logic: Any) -> Stream:
        """A unary operator with a ``FrontierNotificator`` (Naiad-style notifications).

        ``init``: times to be notified at from the start (tokens minted from the initial one).
        ``logic(input, output, notificator)`` runs on data and frontier changes; it requests a
        notification with ``notificator.notify_at(ref.retain())`` (or ``ref.delayed(t)``) and
        receives the token back through ``notificator.for_each(fn)`` / ``next()`` once the input
        frontier has passed that time.  Batches as for ``unary``.

        Raises:
            ValueError: for an unknown pact name.
            CapabilityError: when an ``init`` time is earlier than the scope's minimum time;
                at run time for token misuse.

        Delegates to ``tokenflow.dataflow.operators.generic.unary_notify``.
        """
        from tokenflow.dataflow.operators.generic import unary_notify

        return unary_notify(self, pact, name, init, logic)

    def binary(self, other: Stream, pact1: Any, pact2: Any, name: str, constructor: Any) -> Stream:
        """A custom operator with two inputs (this stream and ``other``) and one output.

        ``constructor(capability, info)`` returns ``logic(input1, input2, output)``, called when
        data arrives on either input (or on ``info.activate()``); ``pact1`` and ``pact2`` are the
        inputs' pacts (e.g. the same ``Exchange`` key on both for a join).  Batches as for
        ``unary``.

        Raises:
            ValueError: when ``other`` belongs to another scope, or for an unknown pact name.
            CapabilityError: at run time for token misuse.

        Delegates to ``tokenflow.dataflow.operators.generic.binary``.
        """
        from tokenflow.dataflow.operators.generic import binary

        return binary(self, other, pact1, pact2, name, constructor)

    def binary_frontier(self, other: Stream, pact1: Any, pact2: Any, name: str,
                        constructor: Any) -> Stream:
        """Like ``binary``, but ``logic`` also runs when either input frontier changes.

        Same arguments, pacts and errors as ``binary``.

        Delegates to ``tokenflow.dataflow.operators.generic.binary_frontier``.
        """
        from tokenflow.dataflow.operators.generic import binary_frontier

        return binary_frontier(self, other, pact1, pact2, name, constructor)

    def sink(self, pact: Any, name: str, logic: Any) -> None:
        """End the stream in ``logic(input)``, called on data and on frontier changes.

        ``input`` yields ``(CapabilityRef, batch)`` (``list`` or Arrow) and has ``frontier``; the
        operator has no output.  ``pact`` as for ``unary``.

        Raises:
            ValueError: for an unknown pact name.

        Delegates to ``tokenflow.dataflow.operators.generic.sink``.
        """
        from tokenflow.dataflow.operators.generic import sink

        sink(self, pact, name, logic)
