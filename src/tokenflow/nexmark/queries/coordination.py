"""NEXMark Q4 and Q7 written with Naiad-style notifications and Flink-style watermarks.

Source: the timestamp-tokens paper §7.4 ("The original implementation leverages timestamp
tokens [...].  We augmented it by writing the same queries with Naiad-style notifications and
Flink-style watermarks"); ``q4.py`` and ``q7.py`` (the token versions, whose state objects and
output these variants share).  Used by ``benchmarks/evaluation/nexmark.py``; each variant's
output equals the token version's on the same events (tests/nexmark/test_queries_coordination.py).

``BUILDERS[query][mechanism]`` is a ``build(streams, config) -> Stream`` like a query module's,
for ``query`` in ``q4``, ``q7`` and ``mechanism`` in ``tokens`` (the query module's own
``build``), ``notifications``, ``watermarks``.  Same inputs (``nexmark_source`` streams: Arrow
batches, message time <= every row's ``dateTime``), same output rows at the same logical times.

Notifications (``FrontierNotificator``, a token per requested time, delivered in time order once
every input frontier has passed it; the operators never read a frontier themselves):

- Q4 close: a notification at ``expires - 1`` for every distinct ``expires`` of the arriving
  auctions (it fires when both frontiers are ``>= expires``: no bid that could win can still
  come); on it, the auctions with ``expires`` up to there close and buffered bids older than it
  are dropped.  The token version holds ONE token, at the least open ``expires``, and reads the
  bid frontier instead — the paper's §6.3 contrast: notifications need a system interaction per
  distinct closing time.
- Q4 average: a notification per distinct winner time.
- Q7 local / global maximum: a notification per window (at ``end - 1`` for the local stage,
  whose rows have times ``< end``; at ``end`` for the global one).

Watermarks (the library's idiom, ``tokenflow.dataflow.operators.watermark``: ``assign_watermarks``
after each source stream, every operator reads through a ``WatermarkPact`` and tracks the
minimum of its upstream workers' latest watermarks, holds ONE token for its output watermark and
forwards that watermark to every downstream worker; ``strip_watermarks`` at the end):

- Q4 close: auction and bid watermarks tracked apart; buffered bids older than the auction
  watermark are dropped, auctions with ``expires <=`` the bid watermark close; output watermark
  ``min(auction wm, bid wm, least open expires)``.
- Q4 average: winners fold in once the watermark has passed their time.
- Q7: a window's local maximum leaves once the watermark reaches its end, the global one once
  the watermark is past it.

State: these variants declare no ``OperatorInfo.state`` (they are for measuring coordination,
not for snapshots).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, binary, unary, unary_notify
from tokenflow.dataflow.operators.watermark import (
    MAX_WATERMARK,
    Watermark,
    WatermarkPact,
    WatermarkTracker,
    assign_watermarks,
    broadcast_copies,
    strip_watermarks,
)
from tokenflow.dataflow.stream import Stream
from tokenflow.nexmark.queries import q4, q7
from tokenflow.nexmark.queries._windows import (
    WindowMaxState,
    coalesce,
    concat,
    drain,
    group_slices,
    int_column,
    to_batch,
)

MECHANISMS: tuple[str, ...] = ("tokens", "notifications", "watermarks")


def _split(input: OperatorInput, tracker: WatermarkTracker) -> tuple[list[Any], bool]:
    """Drain ``input``: its data batches, and whether its watermark advanced."""
    batches: list[Any] = []
    advanced = False
    for _ref, batch in input:
        if isinstance(batch, list):
            data = [r for r in batch if type(r) is not Watermark]
            if tracker.observe(batch):
                advanced = True
            if data:
                batches.append(data)
        else:
            batches.append(batch)
    return batches, advanced


def _bound(wm: int) -> int | None:
    """A watermark as a frontier bound (None: the stream ended)."""
    return None if wm == MAX_WATERMARK else wm


def _emit_winners(output: OperatorOutput, cap: Capability, expires: np.ndarray,
                  category: np.ndarray, price: np.ndarray) -> None:
    """Send closed auctions' ``(category, price)`` at their ``expires`` (one message each)."""
    if not len(expires):
        return
    keys, lo, hi = group_slices(expires)
    winners = pa.RecordBatch.from_arrays([pa.array(category), pa.array(price)],
                                         schema=q4.WINNER_SCHEMA)
    for t, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist(), strict=True):
        output.give_batch(cap, winners.slice(a, b - a), time=t)


def _emit_averages(output: OperatorOutput, cap: Capability, rows: pa.Table) -> None:
    """Send ``q4.SCHEMA`` rows, one message per time (rows sorted by time)."""
    if not rows.num_rows:
        return
    keys, lo, hi = group_slices(int_column(rows, "time"))
    batch = pa.RecordBatch.from_arrays([rows.column(c).combine_chunks() for c in q4.COLUMNS],
                                       schema=q4.SCHEMA)
    for t, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist(), strict=True):
        output.give_batch(cap, batch.slice(a, b - a), time=t)


def _add_bids(book: q4.AuctionBook, batches: list[Any]) -> None:
    if batches:
        book.add_bids(np.concatenate([int_column(b, "auction") for b in batches]),
                      np.concatenate([int_column(b, "price") for b in batches]),
                      np.concatenate([int_column(b, "dateTime") for b in batches]))


# -- Q4 with notifications ---------------------------------------------------------------------


def q4_close_notify(auctions: Stream, bids: Stream, name: str = "Q4CloseNotify") -> Stream:
    """Q4 stage 1 with a notification per distinct closing time (see the module notes)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        book = q4.AuctionBook()
        requested: set[int] = set()
        box: list[FrontierNotificator | None] = [None]

        def logic(auction_in: OperatorInput, bid_in: OperatorInput,
                  output: OperatorOutput) -> None:
            notificator = box[0]
            if notificator is None:
                notificator = box[0] = FrontierNotificator([auction_in.frontier,
                                                            bid_in.frontier])
            auction_batches, least = drain(auction_in)
            if auction_batches and least is not None:
                table = pa.Table.from_batches(auction_batches)
                if table.num_rows:
                    book.add_auctions(table)
                    for e in np.unique(int_column(table, "expires")).tolist():
                        if e not in requested:
                            requested.add(e)
                            notificator.notify_at(least.delayed(e - 1))
                    book.match_waiting()
            bid_batches, _ = drain(bid_in)
            _add_bids(book, bid_batches)
            while True:
                cap = notificator.next()
                if cap is None:
                    return
                t = cap.time
                requested.discard(t + 1)
                book.prune_waiting(t + 1)
                _emit_winners(output, cap, *book.close(t + 1))
                cap.drop()

        return logic

    return binary(auctions, bids, Exchange(column="id"), Exchange(column="auction"), name,
                  constructor, notify=True)


def q4_average_notify(winners: Stream, name: str = "Q4AverageNotify") -> Stream:
    """Q4 stage 2 with a notification per distinct winner time."""
    held = q4.CategoryAverages()
    requested: set[int] = set()

    def logic(input: OperatorInput, output: OperatorOutput,
              notificator: FrontierNotificator) -> None:
        for ref, batch in input:
            held.add(ref.time, batch)
            if ref.time not in requested:
                requested.add(ref.time)
                notificator.notify_at(ref.retain())
        while True:
            cap = notificator.next()
            if cap is None:
                return
            requested.discard(cap.time)
            _emit_averages(output, cap, held.advance(cap.time + 1))
            cap.drop()

    return unary_notify(winners, Exchange(column="category"), name, [], logic)


def q4_notifications(streams: dict[str, Stream], config: Any = None) -> Stream:
    """Q4 (``q4.SCHEMA`` rows at their times) with Naiad-style notifications."""
    auctions = coalesce(streams["auction"], name="Q4CoalesceAuctions")
    bids = coalesce(streams["bid"], name="Q4CoalesceBids")
    return q4_average_notify(q4_close_notify(auctions, bids))


# -- Q4 with watermarks ------------------------------------------------------------------------


def q4_close_watermark(auctions: Stream, bids: Stream, name: str = "Q4CloseWatermark") -> Stream:
    """Q4 stage 1 closed by in-band watermarks (inputs from ``assign_watermarks``)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        book = q4.AuctionBook()
        wm_auction = WatermarkTracker(peers, capability.time, name)
        wm_bid = WatermarkTracker(peers, capability.time, name)
        holder: list[Capability | None] = [capability]

        def logic(auction_in: OperatorInput, bid_in: OperatorInput,
                  output: OperatorOutput) -> None:
            auction_batches, a_moved = _split(auction_in, wm_auction)
            bid_batches, b_moved = _split(bid_in, wm_bid)
            cap = holder[0]
            if cap is None:
                return
            if auction_batches:
                table = pa.Table.from_batches(auction_batches)
                if table.num_rows:
                    book.add_auctions(table)
                    book.match_waiting()
            _add_bids(book, bid_batches)
            if a_moved:
                book.prune_waiting(_bound(wm_auction.current))
            if b_moved:
                _emit_winners(output, cap, *book.close(_bound(wm_bid.current)))
            if not (a_moved or b_moved):
                return
            least = book.least_expires()
            wm = min(wm_auction.current, wm_bid.current,
                     MAX_WATERMARK if least is None else least)
            if wm <= cap.time:
                return
            if wm == MAX_WATERMARK:
                output.give_batch(cap, broadcast_copies(wm, worker, peers))
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, broadcast_copies(wm, worker, peers))

        return logic

    return binary(auctions, bids, WatermarkPact(column="id"), WatermarkPact(column="auction"),
                  name, constructor)


def q4_average_watermark(winners: Stream, name: str = "Q4AverageWatermark") -> Stream:
    """Q4 stage 2: winners fold in once the watermark has passed their time."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        held = q4.CategoryAverages()
        tracker = WatermarkTracker(peers, capability.time, name)
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            advanced = False
            for ref, batch in input:
                if isinstance(batch, list):
                    if tracker.observe(batch):
                        advanced = True
                elif batch.num_rows:
                    held.add(ref.time, batch)
            cap = holder[0]
            if not advanced or cap is None:
                return
            wm = tracker.current
            _emit_averages(output, cap, held.advance(_bound(wm)))
            if wm == MAX_WATERMARK:
                output.give_batch(cap, broadcast_copies(wm, worker, peers))
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, broadcast_copies(wm, worker, peers))

        return logic

    return unary(winners, WatermarkPact(column="category"), name, constructor)


def q4_watermarks(streams: dict[str, Stream], config: Any = None) -> Stream:
    """Q4 (``q4.SCHEMA`` rows at their times) with Flink-style in-band watermarks."""
    auctions = assign_watermarks(coalesce(streams["auction"], name="Q4CoalesceAuctions"),
                                 name="Q4AuctionWatermarks")
    bids = assign_watermarks(coalesce(streams["bid"], name="Q4CoalesceBids"),
                             name="Q4BidWatermarks")
    return strip_watermarks(q4_average_watermark(q4_close_watermark(auctions, bids)))


# -- Q7 with notifications ---------------------------------------------------------------------


def _window_max_notify(stream: Stream, pact: Any, inclusive: bool, key: str | None,
                       prepare: Callable[[pa.Table], pa.Table] | None, name: str) -> Stream:
    """``_windows.window_max`` with a notification per window: at ``end - 1`` when the window's
    rows have times ``< end`` (``inclusive=False``), at ``end`` otherwise."""
    held = WindowMaxState("price", q7.SCHEMA, key)
    shift = 0 if inclusive else 1

    def logic(input: OperatorInput, output: OperatorOutput,
              notificator: FrontierNotificator) -> None:
        batches, least = drain(input)
        if batches and least is not None:
            table = concat(batches)
            if prepare is not None:
                table = prepare(table)
            before = set(held.windows)
            held.add(table)
            for end in sorted(set(held.windows) - before):
                notificator.notify_at(least.delayed(end - shift))
        while True:
            cap = notificator.next()
            if cap is None:
                return
            for end, rows in held.retire(cap.time + 1, inclusive):
                if rows.num_rows:
                    output.give_batch(cap, to_batch(rows, q7.SCHEMA), time=end)
            cap.drop()

    return unary_notify(stream, pact, name, [], logic)


def q7_notifications(streams: dict[str, Stream], config: Any = None) -> Stream:
    """Q7 (``q7.SCHEMA`` rows at ``window_end``) with Naiad-style notifications."""
    local = _window_max_notify(streams["bid"], "pipeline", False, None, q7.with_windows,
                               "Q7LocalMaxNotify")
    return _window_max_notify(local, Exchange(column="window_start"), True, "window_start",
                              None, "Q7GlobalMaxNotify")


# -- Q7 with watermarks ------------------------------------------------------------------------


def _window_max_watermark(stream: Stream, pact: Any, inclusive: bool, key: str | None,
                          prepare: Callable[[pa.Table], pa.Table] | None, name: str) -> Stream:
    """``_windows.window_max`` closed by in-band watermarks: a window leaves once the
    watermark reaches its end (``inclusive=False``) or passes it."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        held = WindowMaxState("price", q7.SCHEMA, key)
        tracker = WatermarkTracker(peers, capability.time, name)
        holder: list[Capability | None] = [capability]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            batches, advanced = _split(input, tracker)
            cap = holder[0]
            if cap is None:
                return
            if batches:
                table = concat(batches)
                if prepare is not None:
                    table = prepare(table)
                held.add(table)
            if not advanced:
                return
            wm = tracker.current
            for end, rows in held.retire(_bound(wm), inclusive):
                if rows.num_rows:
                    output.give_batch(cap, to_batch(rows, q7.SCHEMA), time=end)
            if wm == MAX_WATERMARK:
                output.give_batch(cap, broadcast_copies(wm, worker, peers))
                cap.drop()
                holder[0] = None
                return
            cap.downgrade(wm)
            output.give_batch(cap, broadcast_copies(wm, worker, peers))

        return logic

    return unary(stream, pact, name, constructor)


def q7_watermarks(streams: dict[str, Stream], config: Any = None) -> Stream:
    """Q7 (``q7.SCHEMA`` rows at ``window_end``) with Flink-style in-band watermarks."""
    bids = assign_watermarks(streams["bid"], name="Q7BidWatermarks")
    local = _window_max_watermark(bids, WatermarkPact(), False, None, q7.with_windows,
                                  "Q7LocalMaxWatermark")
    glob = _window_max_watermark(local, WatermarkPact(column="window_start"), True,
                                 "window_start", None, "Q7GlobalMaxWatermark")
    return strip_watermarks(glob)


BUILDERS: dict[str, dict[str, Callable[[dict[str, Stream], Any], Stream]]] = {
    "q4": {"tokens": q4.build, "notifications": q4_notifications, "watermarks": q4_watermarks},
    "q7": {"tokens": q7.build, "notifications": q7_notifications, "watermarks": q7_watermarks},
}
"""``BUILDERS[query][mechanism]``: the query's dataflow built with that coordination style."""

__all__ = ["BUILDERS", "MECHANISMS", "q4_notifications", "q4_watermarks", "q7_notifications",
           "q7_watermarks"]
