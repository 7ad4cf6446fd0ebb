"""The paper's microbenchmark dataflow in three coordination styles, on one runtime.

"a single stateful operator that computes the overall rolling count of unique words observed on
the inputs.  Every time the operator receives a word, it updates the internal count, and sends an
output message with the updated value." (the timestamp-tokens paper, §7.2)

Input records are ``(word, offer_ns)``; they are exchanged by word.  Every style produces the
same output: per input record ``(word, count, offer_ns)`` at the record's time, records applied
in time order (a time only once it is complete, so the counts are deterministic).  What
differs is how the operator learns that a time is complete:

- ``tokens``: one ``Capability`` held at the least time with buffered records; when the input
  frontier moves, every buffered time before it is counted and sent in time order and the one
  token is downgraded to the next buffered time (the paper's §5: the operator, not the system,
  decides how often to talk to progress tracking).
- ``notifications``: Naiad-style, ``unary_notify`` with a ``FrontierNotificator``: a token per
  distinct buffered time (``notify_at(ref.retain())``), each delivered separately once the
  frontier passes it.
- ``watermarks``: Flink-style, the library's idiom: ``assign_watermarks`` after the input, the
  counting operator reads data and in-band watermarks through a ``WatermarkPact`` and counts the
  buffered times below the minimum of its upstream workers' watermarks; it is not scheduled on
  frontier changes at all.

``gated`` builds the §7.3 (Fig. 8) dataflow: the same counting operator with a second input fed
by a chain of ``n`` idle no-op operators (the input filtered to nothing, then ``n`` hops): the
count may only emit a time once the chain's frontier (or watermark) has passed it too.

Every operator checks the harness's ``Abort`` flag first: when set it drops what it holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from benchmarks.evaluation.harness import Abort
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, binary, unary, unary_notify
from tokenflow.dataflow.operators.timed import TimedBuffer, least_time, timed_key
from tokenflow.dataflow.operators.watermark import (
    MAX_WATERMARK,
    Watermark,
    WatermarkPact,
    WatermarkTracker,
    assign_watermarks,
    forward_watermarks,
    has_watermark,
)
from tokenflow.dataflow.stream import Stream


def word(record: tuple[str, int]) -> str:
    return record[0]


class Buffer:
    """Records waiting for their time to complete: ``time -> records`` and a heap of times."""

    __slots__ = ("by_time", "heap", "counts")

    def __init__(self) -> None:
        self.by_time: dict[int, list[Any]] = {}
        self.heap: list[int] = []
        self.counts: dict[str, int] = {}

    def add(self, t: int, batch: list[Any]) -> bool:
        """Buffer ``batch`` at ``t``; True when ``t`` is a new time."""
        held = self.by_time.get(t)
        if held is None:
            self.by_time[t] = list(batch)
            heapq.heappush(self.heap, t)
            return True
        held.extend(batch)
        return False

    def least(self) -> int | None:
        return self.heap[0] if self.heap else None

    def count(self, t: int) -> list[tuple[str, int, int]]:
        """Apply time ``t``'s records (removed) to the counts; the output tuples."""
        counts = self.counts
        out = []
        for w, offered in self.by_time.pop(t):
            c = counts.get(w, 0) + 1
            counts[w] = c
            out.append((w, c, offered))
        return out

    def pop_before(self, bound: int | None) -> list[int]:
        """Times ``< bound`` (all when None), least first, removed from the heap."""
        heap = self.heap
        done = []
        while heap and (bound is None or heap[0] < bound):
            done.append(heapq.heappop(heap))
        return done

    def clear(self) -> None:
        self.by_time.clear()
        self.heap.clear()


def _bound(*frontiers: Any) -> int | None:
    """The least time still possible on any of the inputs (None: all ended)."""
    least: int | None = None
    for f in frontiers:
        for t in f.frontier():
            if least is None or t < least:
                least = t
    return least


# -- the rolling count, three ways ----------------------------------------------------------


def tokens(stream: Stream, abort: Abort, name: str = "CountTokens") -> Stream:
    """The rolling count holding one token at its least buffered time (see module notes)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = Buffer()
        holder: list[Capability | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _abandon(input, buf, holder)
                return
            for ref, batch in input:
                t = ref.time
                if buf.add(t, batch):
                    held = holder[0]
                    if held is None:
                        holder[0] = ref.retain()
                    elif t < held.time:
                        held.drop()
                        holder[0] = ref.retain()
            held = holder[0]
            if held is None:
                return
            for t in buf.pop_before(_bound(input.frontier)):
                if abort:
                    return
                output.give_batch(held, buf.count(t), time=t)
            _follow_least(holder, buf.least())

        return logic

    return unary(stream, Exchange(key=word), name, constructor, notify=True)


def _follow_least(holder: list[Capability | None], least: int | None) -> None:
    """Keep the held token at the least buffered time: drop it when nothing is buffered,
    downgrade it when the least time moved on."""
    held = holder[0]
    if held is None:
        return
    if least is None:
        held.drop()
        holder[0] = None
    elif least > held.time:
        held.downgrade(least)


def _abandon(input: OperatorInput, buf: Buffer | TimedBuffer,
             holder: list[Capability | None]) -> None:
    """An aborted run (DNF): drain the input, drop what is buffered and the token held."""
    for _ref, _batch in input:
        pass
    buf.clear()
    if holder[0] is not None:
        holder[0].drop()
        holder[0] = None


def _abandon_notificator(notificator: FrontierNotificator) -> None:
    for cap in notificator.pending + notificator.available:
        cap.drop()
    notificator.pending = []
    notificator.available = []


def notifications(stream: Stream, abort: Abort, name: str = "CountNotify") -> Stream:
    """The rolling count with a notification (a token) per distinct buffered time."""
    buf = Buffer()

    def logic(input: OperatorInput, output: OperatorOutput,
              notificator: FrontierNotificator) -> None:
        if abort:
            _abandon(input, buf, [None])
            _abandon_notificator(notificator)
            return
        for ref, batch in input:
            if buf.add(ref.time, batch):
                notificator.notify_at(ref.retain())
        while True:
            cap = notificator.next()
            if cap is None:
                return
            if abort:
                cap.drop()
                return
            output.give_batch(cap, buf.count(cap.time))
            cap.drop()

    # one Buffer per operator instance: ``unary_notify`` takes logic, not a constructor, and
    # runs once per worker in this worker's dataflow, so the closure is per worker
    return unary_notify(stream, Exchange(key=word), name, [], logic)


def watermarks(stream: Stream, abort: Abort, name: str = "CountWatermarks") -> Stream:
    """The rolling count closed by in-band watermarks (the library's ``assign_watermarks``
    upstream, a ``WatermarkPact`` by word); forwards its output watermark downstream."""
    return _watermark_count(assign_watermarks(stream), None, abort, name)


def _watermark_count(data: Stream, gate: Stream | None, abort: Abort, name: str,
                     gate_pact: Any = None) -> Stream:
    """The watermark-closed count of ``data`` (with watermarks); with ``gate``, a second input
    whose watermark must also pass a time before it is counted."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        buf = Buffer()
        trackers = [WatermarkTracker(peers, capability.time, name)]
        if gate is not None:
            gate_peers = 1 if gate_pact == "pipeline" else peers
            trackers.append(WatermarkTracker(gate_peers, capability.time, name))
            if gate_pact == "pipeline":
                trackers[1].latest = [capability.time]
        holder: list[Capability | None] = [capability]

        def read(input: OperatorInput, tracker: WatermarkTracker, local: bool) -> bool:
            advanced = False
            for ref, batch in input:
                if has_watermark(batch):
                    data = [r for r in batch if type(r) is not Watermark]
                    if local:
                        batch = [Watermark(r.time, 0) for r in batch if type(r) is Watermark]
                    if tracker.observe(batch):
                        advanced = True
                else:
                    data = batch
                if data:
                    buf.add(ref.time, data)
            return advanced

        def close(output: OperatorOutput) -> None:
            cap = holder[0]
            if cap is None:
                return
            wm = min(t.current for t in trackers)
            if wm <= cap.time:
                return
            for t in buf.pop_before(wm):
                if abort:
                    return
                output.give_batch(cap, buf.count(t), time=t)
            if wm == MAX_WATERMARK:
                output.give_batch(cap, [Watermark(wm, worker)])
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, [Watermark(wm, worker)])

        if gate is None:
            def logic1(input: OperatorInput, output: OperatorOutput) -> None:
                if abort:
                    _abandon(input, buf, holder)
                    return
                if read(input, trackers[0], False):
                    close(output)
            return logic1

        def logic2(in1: OperatorInput, in2: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _abandon(in1, buf, holder)
                _abandon(in2, Buffer(), [None])
                return
            a = read(in1, trackers[0], False)
            b = read(in2, trackers[1], gate_pact == "pipeline")
            if a or b:
                close(output)
        return logic2

    if gate is None:
        return unary(data, WatermarkPact(key=word), name, constructor)
    pact2 = "pipeline" if gate_pact == "pipeline" else WatermarkPact()
    return binary(data, gate, WatermarkPact(key=word), pact2, name, constructor)


MECHANISMS: dict[str, Callable[[Stream, Abort], Stream]] = {
    "tokens": tokens, "notifications": notifications, "watermarks": watermarks,
}


# -- the rolling count on timed records (``tokenflow.dataflow.operators.timed``) ---------------
#
# The input sends ``(time, (word, offer_ns))`` pairs under one epoch per harness turn
# (``InputHandle.send_at``) instead of one message and one input advance per timestamp; the
# records' times, the moments the input advances and the output (``(time, (word, count,
# offer_ns))`` pairs) are the same for the three mechanisms.  What still differs is only how
# the count learns that a time is complete and what it holds meanwhile.


timed_word = timed_key(word)


def _count(counts: dict[str, int], t: int, records: list[Any], out: list[Any]) -> None:
    """Apply time ``t``'s records to ``counts``, appending ``(t, (word, count, offered))``."""
    for w, offered in records:
        c = counts.get(w, 0) + 1
        counts[w] = c
        out.append((t, (w, c, offered)))


def timed_tokens(stream: Stream, abort: Abort, name: str = "CountTokensTimed") -> Stream:
    """The rolling count on timed records, one token at its least buffered time: every
    complete time's output goes out as one timed message under it."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = TimedBuffer()
        counts: dict[str, int] = {}
        holder: list[Capability | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _abandon(input, buf, holder)
                return
            for ref, batch in input:
                buf.add(batch)
                held = holder[0]
                if held is None:
                    holder[0] = ref.retain()
                elif ref.time < held.time:
                    held.drop()
                    holder[0] = ref.retain()
            held = holder[0]
            if held is None:
                return
            out: list[Any] = []
            for t in buf.pop_before(least_time([input.frontier])):
                _count(counts, t, buf.take(t), out)
            if abort:
                return
            if out:
                output.give_batch(held, out)
            _follow_least(holder, buf.least())

        return logic

    return unary(stream, Exchange(key=timed_word), name, constructor, notify=True)


def timed_notifications(stream: Stream, abort: Abort, name: str = "CountNotifyTimed") -> Stream:
    """The rolling count on timed records with a notification (a token, ``ref.delayed(t)``)
    per distinct buffered time, each delivered and sent separately."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = TimedBuffer()
        counts: dict[str, int] = {}
        box: list[FrontierNotificator | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            notificator = box[0]
            if notificator is None:
                notificator = box[0] = FrontierNotificator([input.frontier])
            if abort:
                _abandon(input, buf, [None])
                _abandon_notificator(notificator)
                return
            for ref, batch in input:
                for t in buf.add(batch):
                    notificator.notify_at(ref.delayed(t))
            while True:
                cap = notificator.next()
                if cap is None:
                    return
                if abort:
                    cap.drop()
                    return
                t = cap.time
                buf.pop_before(t + 1)
                out: list[Any] = []
                _count(counts, t, buf.take(t), out)
                output.give_batch(cap, out)
                cap.drop()

        return logic

    return unary(stream, Exchange(key=timed_word), name, constructor, notify=True)


def timed_watermarks(stream: Stream, abort: Abort, name: str = "CountWatermarksTimed") -> Stream:
    """The rolling count on timed records closed by in-band watermarks (``assign_watermarks``
    upstream, a ``WatermarkPact`` by word): the records below the watermark go out as one timed
    message under its token."""
    data = assign_watermarks(stream)

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker = info.worker_index
        buf = TimedBuffer()
        counts: dict[str, int] = {}
        tracker = WatermarkTracker(info.peers, capability.time, name)
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _abandon(input, buf, holder)
                return
            advanced = False
            for _ref, batch in input:
                if has_watermark(batch):
                    if tracker.observe([r for r in batch if type(r) is Watermark]):
                        advanced = True
                    buf.add([r for r in batch if type(r) is not Watermark])
                else:
                    buf.add(batch)
            cap = holder[0]
            if not advanced or cap is None:
                return
            wm = tracker.current
            if wm <= cap.time:
                return
            out: list[Any] = []
            for t in buf.pop_before(wm):
                _count(counts, t, buf.take(t), out)
            if abort:
                return
            if out:
                output.give_batch(cap, out)
            if wm == MAX_WATERMARK:
                output.give_batch(cap, [Watermark(wm, worker)])
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, [Watermark(wm, worker)])

        return logic

    return unary(data, WatermarkPact(key=timed_word), name, constructor)


TIMED_MECHANISMS: dict[str, Callable[[Stream, Abort], Stream]] = {
    "tokens": timed_tokens, "notifications": timed_notifications, "watermarks": timed_watermarks,
}


# -- Fig. 8: the count gated by a chain of idle operators ------------------------------------


def _noop(stream: Stream, pact: Any, name: str) -> Stream:
    """A no-op operator: passes data on; scheduled only when data arrives (never, here)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                output.give_batch(ref, batch)

        return logic

    return unary(stream, pact, name, constructor)


def _forward_local(stream: Stream, name: str) -> Stream:
    """watermarks-P: a no-op that forwards its own worker's watermarks on a pipeline channel
    (no watermark ever crosses workers)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker = info.worker_index
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            latest = None
            for ref, batch in input:
                if not has_watermark(batch):
                    output.give_batch(ref, batch)
                    continue
                data = [r for r in batch if type(r) is not Watermark]
                if data:
                    output.give_batch(ref, data)
                for r in batch:
                    if type(r) is Watermark and (latest is None or r.time > latest):
                        latest = r.time
            cap = holder[0]
            if latest is None or cap is None or latest <= cap.time:
                return
            if latest == MAX_WATERMARK:
                output.give_batch(cap, [Watermark(latest, worker)])
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(latest)
            output.give_batch(cap, [Watermark(latest, worker)])

        return logic

    return unary(stream, "pipeline", name, constructor)


def _assign_local(stream: Stream, name: str = "AssignLocal") -> Stream:
    """``assign_watermarks`` for a pipeline consumer: one copy of each watermark, not
    ``peers`` (watermarks-P)."""
    from tokenflow.dataflow.operators.generic import unary_frontier

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker = info.worker_index
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                output.give_batch(ref, batch)
            cap = holder[0]
            if cap is None:
                return
            frontier = input.frontier.frontier()
            wm = MAX_WATERMARK if not frontier else min(frontier)
            if wm > cap.time:
                if wm == MAX_WATERMARK:
                    output.give_batch(cap, [Watermark(wm, worker)])
                    cap.drop()
                    holder[0] = None
                    return
                cap.downgrade(wm)
                output.give_batch(cap, [Watermark(wm, worker)])

        return logic

    return unary_frontier(stream, "pipeline", name, constructor)


def _drop_all(record: Any) -> bool:
    return False


def gated(mechanism: str, length: int) -> Callable[[Stream, Abort], Stream]:
    """The Fig. 8 dataflow for ``mechanism`` (``tokens``, ``notifications``, ``watermarks-P``,
    ``watermarks-X``) with a chain of ``length`` idle operators."""

    def build(stream: Stream, abort: Abort) -> Stream:
        idle = stream.filter(_drop_all, name="Idle")
        if mechanism in ("tokens", "notifications"):
            for i in range(length):
                idle = _noop(idle, Exchange(key=word), f"Noop{i}")
            return (_gated_tokens if mechanism == "tokens" else _gated_notify)(
                stream, idle, abort)
        if mechanism == "watermarks-X":
            idle = assign_watermarks(idle)
            for i in range(length):
                idle = forward_watermarks(idle, key=word, name=f"Forward{i}")
            return _watermark_count(assign_watermarks(stream), idle, abort, "CountGatedWM",
                                    gate_pact="exchange")
        if mechanism == "watermarks-P":
            idle = _assign_local(idle)
            for i in range(length):
                idle = _forward_local(idle, f"ForwardLocal{i}")
            return _watermark_count(assign_watermarks(stream), idle, abort, "CountGatedWM",
                                    gate_pact="pipeline")
        raise ValueError(f"unknown mechanism {mechanism!r}")

    return build


def _gated_tokens(data: Stream, gate: Stream, abort: Abort) -> Stream:
    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = Buffer()
        holder: list[Capability | None] = [None]

        def logic(in1: OperatorInput, in2: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _abandon(in1, buf, holder)
                _abandon(in2, Buffer(), [None])
                return
            for ref, batch in in1:
                t = ref.time
                if buf.add(t, batch):
                    held = holder[0]
                    if held is None:
                        holder[0] = ref.retain()
                    elif t < held.time:
                        held.drop()
                        holder[0] = ref.retain()
            for _ref, _batch in in2:
                pass
            held = holder[0]
            if held is None:
                return
            for t in buf.pop_before(_bound(in1.frontier, in2.frontier)):
                if abort:
                    return
                output.give_batch(held, buf.count(t), time=t)
            _follow_least(holder, buf.least())

        return logic

    return binary(data, gate, Exchange(key=word), "pipeline", "CountGatedTokens", constructor,
                  notify=True)


def _gated_notify(data: Stream, gate: Stream, abort: Abort) -> Stream:
    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        buf = Buffer()
        box: list[FrontierNotificator | None] = [None]

        def logic(in1: OperatorInput, in2: OperatorInput, output: OperatorOutput) -> None:
            notificator = box[0]
            if notificator is None:
                notificator = box[0] = FrontierNotificator([in1.frontier, in2.frontier])
            if abort:
                _abandon(in1, buf, [None])
                _abandon(in2, Buffer(), [None])
                _abandon_notificator(notificator)
                return
            for ref, batch in in1:
                if buf.add(ref.time, batch):
                    notificator.notify_at(ref.retain())
            for _ref, _batch in in2:
                pass
            while True:
                cap = notificator.next()
                if cap is None:
                    return
                if abort:
                    cap.drop()
                    return
                output.give_batch(cap, buf.count(cap.time))
                cap.drop()

        return logic

    return binary(data, gate, Exchange(key=word), "pipeline", "CountGatedNotify", constructor,
                  notify=True)


CHAIN_MECHANISMS = ("tokens", "notifications", "watermarks-P", "watermarks-X")
