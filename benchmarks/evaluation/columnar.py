"""The rolling word count on columnar timed records: Arrow batches with a time column.

The same computation as ``wordcount.py`` (per input record ``(word, count, offer_ns)`` at the
record's time, records applied in time order, a time only once it is complete), with the data
path batch-at-a-time: records are Arrow rows ``(time, word, offer)`` (``word``: an int id of
one of 4,096 words, as ``harness.word_record`` picks them), sent by the input under its current
epoch (``InputHandle.send_batch_at``: every row's time ≥ the message's time), exchanged by the
``word`` column, counted with numpy, and timed by the latency sink per batch.  The counting
(``Counter.apply``) is shared code; the three mechanisms differ only in how the count learns
that a time is complete and what it holds meanwhile:

- ``tokens``: one ``Capability`` at the least buffered time; when the input frontier moves,
  every complete row is counted in one batch and sent as one message under that token, which
  is then downgraded to the least time still buffered;
- ``notifications``: a token per distinct buffered time (``ref.delayed(t)``, handed to a
  ``FrontierNotificator``), each delivered separately; the delivered times' rows are counted in
  one batch (the data path stays batch-at-a-time) and each time's rows are sent under its own
  token, as a notification's output is;
- ``watermarks``: ``assign_watermarks`` after the input; the count reads data and in-band
  watermarks through a ``WatermarkPact`` and counts the rows below the watermark in one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.evaluation.harness import Abort
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary
from tokenflow.dataflow.operators.timed import TimedBatches, least_time
from tokenflow.dataflow.operators.watermark import (
    MAX_WATERMARK,
    Watermark,
    WatermarkPact,
    WatermarkTracker,
    assign_watermarks,
)
from tokenflow.dataflow.stream import Stream

VOCABULARY = 4096
INPUT = pa.schema([("time", pa.int64()), ("word", pa.int64()), ("offer", pa.int64())])
OUTPUT = pa.schema([("time", pa.int64()), ("word", pa.int64()), ("count", pa.int64()),
                    ("offer", pa.int64())])


def make_batch(first: int, worker: int, offers: np.ndarray, times: np.ndarray) -> pa.RecordBatch:
    """Records ``first .. first + len(offers) - 1`` of ``worker`` as one input batch: the word
    ids ``harness.word_record`` would pick, their offer times (ns) and logical times."""
    index = np.arange(first, first + len(offers), dtype=np.int64)
    words = (index * 2654435761 + worker * 40503) % VOCABULARY
    return pa.RecordBatch.from_arrays([pa.array(times), pa.array(words), pa.array(offers)],
                                      schema=INPUT)


class Counter:
    """The running count per word id: ``apply`` a batch sorted by time, get each row's count
    after it (rows of one word in batch order, i.e. time order, then arrival)."""

    __slots__ = ("totals",)

    def __init__(self) -> None:
        self.totals = np.zeros(VOCABULARY, dtype=np.int64)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        words = batch.column("word").to_numpy()
        n = len(words)
        order = np.argsort(words, kind="stable")
        ranked = words[order]
        starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
        lengths = np.diff(np.r_[starts, n])
        occurrence = np.arange(n) - np.repeat(starts, lengths)
        counts = np.empty(n, dtype=np.int64)
        counts[order] = self.totals[ranked] + occurrence + 1
        self.totals += np.bincount(words, minlength=VOCABULARY)
        return pa.RecordBatch.from_arrays(
            [batch.column("time"), batch.column("word"), pa.array(counts),
             batch.column("offer")], schema=OUTPUT)


def _exchange() -> Exchange:
    return Exchange(column="word")


def _drain(input: OperatorInput) -> None:
    for _ref, _batch in input:
        pass


def tokens(stream: Stream, abort: Abort, name: str = "CountTokensColumnar") -> Stream:
    """The columnar rolling count holding one token at its least buffered time."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        pending = TimedBatches()
        counter = Counter()
        holder: list[Capability | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _drain(input)
                pending.clear()
                if holder[0] is not None:
                    holder[0].drop()
                    holder[0] = None
                return
            for ref, batch in input:
                pending.add(batch)
                held = holder[0]
                if held is None or ref.time < held.time:
                    if held is not None:
                        held.drop()
                    holder[0] = ref.retain()
            held = holder[0]
            if held is None:
                return
            done = pending.take_before(least_time([input.frontier]))
            if done is not None:
                output.give_batch(held, counter.apply(done))
            least = pending.least()
            if least is None:
                held.drop()
                holder[0] = None
            elif least > held.time:
                held.downgrade(least)

        return logic

    return unary(stream, _exchange(), name, constructor, notify=True)


def notifications(stream: Stream, abort: Abort, name: str = "CountNotifyColumnar") -> Stream:
    """The columnar rolling count with a notification per distinct buffered time, each time's
    output sent under its own token."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        pending = TimedBatches()
        counter = Counter()
        requested: set[int] = set()
        box: list[FrontierNotificator | None] = [None]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            notificator = box[0]
            if notificator is None:
                notificator = box[0] = FrontierNotificator([input.frontier])
            if abort:
                _drain(input)
                pending.clear()
                for cap in notificator.pending + notificator.available:
                    cap.drop()
                notificator.pending, notificator.available = [], []
                return
            for ref, batch in input:
                pending.add(batch)
                for t in np.unique(batch.column("time").to_numpy()).tolist():
                    if t not in requested:
                        requested.add(t)
                        notificator.notify_at(ref.delayed(t))
            delivered: list[Capability] = []
            while (cap := notificator.next()) is not None:
                delivered.append(cap)
            if not delivered:
                return
            done = pending.take_before(delivered[-1].time + 1)
            assert done is not None
            counted = counter.apply(done)
            times = counted.column("time").to_numpy()
            ends = np.searchsorted(times, [c.time for c in delivered], side="right").tolist()
            start = 0
            for cap, end in zip(delivered, ends, strict=True):
                output.give_batch(cap, counted.slice(start, end - start))
                start = end
                requested.discard(cap.time)
                cap.drop()

        return logic

    return unary(stream, _exchange(), name, constructor, notify=True)


def watermarks(stream: Stream, abort: Abort, name: str = "CountWatermarksColumnar") -> Stream:
    """The columnar rolling count closed by in-band watermarks."""
    data = assign_watermarks(stream)

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker = info.worker_index
        pending = TimedBatches()
        counter = Counter()
        tracker = WatermarkTracker(info.peers, capability.time, name)
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            if abort:
                _drain(input)
                pending.clear()
                if holder[0] is not None:
                    holder[0].drop()
                    holder[0] = None
                return
            advanced = False
            for _ref, batch in input:
                if type(batch) is list:
                    if tracker.observe([r for r in batch if type(r) is Watermark]):
                        advanced = True
                else:
                    pending.add(batch)
            cap = holder[0]
            if not advanced or cap is None:
                return
            wm = tracker.current
            if wm <= cap.time:
                return
            done = pending.take_before(wm)
            if done is not None:
                output.give_batch(cap, counter.apply(done))
            if wm == MAX_WATERMARK:
                output.give_batch(cap, [Watermark(wm, worker)])
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, [Watermark(wm, worker)])

        return logic

    return unary(data, WatermarkPact(column="word"), name, constructor)


def warm() -> None:
    """Run the columnar code paths once on a small batch (``Counter.apply``, ``TimedBatches``'s
    concatenation, filter and sort), so that the modules pyarrow and numpy load on first use
    are loaded before a run's clock starts rather than stalling its first step (the same for
    every mechanism)."""
    offers = np.arange(8, dtype=np.int64)
    pending = TimedBatches()
    pending.add(make_batch(0, 0, offers, offers[::-1].copy()))
    pending.add(make_batch(8, 0, offers, offers))
    done = pending.take_before(4)
    assert done is not None
    Counter().apply(done)
    np.unique(offers)
    np.searchsorted(offers, [3], side="right")


warm()


MECHANISMS: dict[str, Callable[[Stream, Abort], Stream]] = {
    "tokens": tokens, "notifications": notifications, "watermarks": watermarks,
}
