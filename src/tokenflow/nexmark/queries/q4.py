"""NEXMark Q4, average closing price per category (running average, as Megaphone does).

Source: docs/NEXMARK.md ("Queries": Q4, average closing price per category: an auction closes at
``expires``; its winning bid is the highest bid with ``price >= reserve`` and
``auction.dateTime <= bid.dateTime < expires``); the timestamp-tokens paper §6.3 (Megaphone's
Q4: a data-dependent closing time per auction, scheduled with held tokens) and §7.4 ("Q4 has a
two-stage dataflow where one of the operators handles tokens to calculate a data-dependent
windowed maximum").

Variant: the *running* average.  Every time a category receives winning prices, one row
``(category, avg_price, time)`` with the average of all winning prices of the category closed so
far (float64, cents) at ``time`` = the logical time of the change = the closing time
(``expires``, ms) of the auctions just closed.  "Changed" means the category's sum/count changed
(a row even if the average happens to repeat).  Auctions without a qualifying bid contribute
nothing.  The last row per category equals the batch query ``SPARK_SQL``.

Dataflow:

0. ``coalesce`` (pipeline) on auctions and bids: the batches one invocation receives go on as
   one batch at the least time (rows may move to an earlier time; ``dateTime >= time`` holds),
   so the exchanges below split one batch per invocation, not one per 1 ms message.
1. ``Q4Close`` (auctions exchanged by ``id``, bids by ``auction``; ``AuctionBook`` state): open
   auctions are numpy arrays sorted by id holding their best qualifying price so far; a batch
   of bids is matched with one ``searchsorted`` and applied with ``np.maximum.at``.  Bids for
   an auction not yet seen are buffered (an auction's ``dateTime`` is <= its qualifying bids',
   so it may arrive later on another channel) and dropped once the auction frontier has passed
   their ``dateTime`` (no auction that could accept them can still arrive).  An auction closes
   when the bid frontier reaches its ``expires`` (no bid with ``dateTime < expires`` can still
   come) or the input ends; ``(category, price, time)`` of the closed auctions with a winner
   (``time`` = ``expires``) go as one timed batch per invocation, sent at the least of its
   times: the operator coordinates at its own granularity (timestamp-tokens paper §5), where a
   message per distinct ``expires`` (most auctions close at a ms of their own) cost a routing,
   an encoding and a progress update each.
   Tokens: a ``CapabilitySet`` holding ONE token, at the least ``expires`` of the open
   auctions; it is replaced by an earlier one minted from an arriving auction's message and
   downgraded to the next least ``expires`` as auctions close (dropped when none is open).
2. ``Q4Average`` (exchange by ``category``; ``CategoryAverages`` state): winning prices wait
   per time (a row's ``time``: no row of a message is earlier than the message) until the
   frontier passes it, then, in time order, running sums/counts per category are advanced
   vectorized (lexsort by (category, time), cumulative sums) and one row per
   (category, time) is sent at that time.  Tokens: a ``CapabilitySet`` with one token at the
   least pending time.

State: ``Q4Close`` declares its ``AuctionBook`` as ``"book"`` (open auctions per bin of ``id``,
waiting bids per bin of ``auction``: the same value, the key both inputs are exchanged by) and
``Q4Average`` its ``CategoryAverages`` as ``"averages"`` (per bin of ``category``).  Restored
from a snapshot, each re-mints its one token at its state's ``pending_times()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tokenflow.dataflow.capability import Capability, CapabilitySet
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo
from tokenflow.dataflow.routing import column_hashes
from tokenflow.dataflow.stream import Stream
from tokenflow.nexmark.queries._windows import (
    ColumnarState,
    Taken,
    coalesce,
    drain,
    frontier_bound,
    group_slices,
    int_column,
    key_hashes,
)
from tokenflow.rescale.migrate import Elastic, LeastToken, keyed_operator, migrates

COLUMNS: list[str] = ["category", "avg_price", "time"]
ELASTIC = True
"""``build(..., elastic=Elastic())`` builds the stateful operators as migrating ones
(``tokenflow.rescale.migrate``): their bins move between workers while the job runs."""
SCHEMA = pa.schema([("category", pa.int64()), ("avg_price", pa.float64()), ("time", pa.int64())])
WINNER_SCHEMA = pa.schema([("category", pa.int64()), ("price", pa.int64())])
"""A closed auction's winning price: ``CategoryAverages``' pending rows of one time."""
PENDING_SCHEMA = pa.schema([*WINNER_SCHEMA, pa.field("time", pa.int64())])
"""Winners with the time they closed (``expires``, ms): stage 1's output (a batch sorted by
``time``, sent at its least ``time``) and ``CategoryAverages``' pending winners as exported
rows."""

SPARK_SQL = """
WITH winners AS (
  SELECT a.id, a.category, a.expires, MAX(b.price) AS price
  FROM auction a JOIN bid b ON b.auction = a.id
  WHERE b.price >= a.reserve AND b.dateTime >= a.dateTime AND b.dateTime < a.expires
  GROUP BY a.id, a.category, a.expires
)
SELECT category, AVG(CAST(price AS DOUBLE)) AS avg_price, MAX(expires) AS time
FROM winners GROUP BY category
"""
"""Spark SQL over the temp views ``auction`` and ``bid``: the final average per category over
all auctions (all close by the end of the input), at the latest closing time."""

WINNERS_SQL = """
SELECT a.id, a.category, a.expires, MAX(b.price) AS price
FROM auction a JOIN bid b ON b.auction = a.id
WHERE b.price >= a.reserve AND b.dateTime >= a.dateTime AND b.dateTime < a.expires
GROUP BY a.id, a.category, a.expires
"""
"""Spark SQL: the winning price of every auction with a qualifying bid (for tests)."""

_AUCTION_FIELDS = ("id", "category", "reserve", "dateTime", "expires", "best")
_BID_FIELDS = ("auction", "price", "dateTime")


class AuctionBook(ColumnarState):
    """Open auctions with their best qualifying price, and bids waiting for their auction.

    State (plain, snapshot-able): ``open`` — a dict of int64 numpy arrays ``id, category,
    reserve (cents), dateTime (ms), expires (ms), best (cents, -1 = no qualifying bid yet)``
    sorted by ``id``; ``waiting`` — ``auction, price, dateTime`` arrays of unmatched bids.
    Auction ids are unique (one ``add_auctions`` per id).

    As a ``BinnedState`` (``ColumnarState``): part 0, the open auctions keyed by ``id``;
    part 1, the waiting bids keyed by ``auction``.  ``pending_times()``: the least open
    ``expires`` (the operator's one token).
    """

    PARTS = (_AUCTION_FIELDS, _BID_FIELDS)

    def __init__(self) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self.open: dict[str, np.ndarray] = {k: empty for k in _AUCTION_FIELDS}
        self.waiting: dict[str, np.ndarray] = {k: empty for k in ("auction", "price", "dateTime")}

    def add_auctions(self, table: pa.Table) -> None:
        """Open the auctions of ``table`` (columns ``id, category, reserve, dateTime, expires``)."""
        if table.num_rows == 0:
            return
        new = {k: int_column(table, k) for k in _AUCTION_FIELDS[:-1]}
        new["best"] = np.full(table.num_rows, -1, dtype=np.int64)
        merged = {k: np.concatenate([self.open[k], new[k]]) for k in _AUCTION_FIELDS}
        order = np.argsort(merged["id"], kind="stable")
        self.open = {k: v[order] for k, v in merged.items()}

    def add_bids(self, auction: np.ndarray, price: np.ndarray, date: np.ndarray) -> None:
        """Apply bids to their open auctions; buffer those whose auction is not open."""
        found = self._apply(auction, price, date)
        lost = ~found
        if lost.any():
            self.waiting = {
                "auction": np.concatenate([self.waiting["auction"], auction[lost]]),
                "price": np.concatenate([self.waiting["price"], price[lost]]),
                "dateTime": np.concatenate([self.waiting["dateTime"], date[lost]]),
            }

    def match_waiting(self) -> None:
        """Apply the buffered bids whose auction has arrived, and forget them."""
        w = self.waiting
        if len(w["auction"]) == 0:
            return
        found = self._apply(w["auction"], w["price"], w["dateTime"])
        if found.any():
            self.waiting = {k: v[~found] for k, v in w.items()}

    def prune_waiting(self, auction_bound: int | None) -> None:
        """Drop buffered bids no auction can accept any more: those with ``dateTime`` below the
        auction frontier (``auction_bound``; all when None, the auction input has ended)."""
        w = self.waiting
        if len(w["auction"]) == 0:
            return
        if auction_bound is None:
            self.waiting = {k: v[:0] for k, v in w.items()}
            return
        keep = w["dateTime"] >= auction_bound
        if not keep.all():
            self.waiting = {k: v[keep] for k, v in w.items()}

    def _apply(self, auction: np.ndarray, price: np.ndarray, date: np.ndarray) -> np.ndarray:
        """Raise the best price of the open auctions the bids qualify for; return the mask of
        bids whose auction is open (qualifying or not)."""
        ids = self.open["id"]
        n = len(ids)
        if n == 0:
            return np.zeros(len(auction), dtype=bool)
        pos = np.minimum(np.searchsorted(ids, auction), n - 1)
        found = ids[pos] == auction
        at = pos[found]
        p = price[found]
        d = date[found]
        ok = (p >= self.open["reserve"][at]) & (d >= self.open["dateTime"][at]) & \
            (d < self.open["expires"][at])
        np.maximum.at(self.open["best"], at[ok], p[ok])
        return found

    def close(self, bid_bound: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Close the auctions with ``expires <= bid_bound`` (all when None: the bids ended).

        Returns ``(expires, category, price)`` of the closed auctions that have a winning bid,
        sorted by ``expires``.
        """
        o = self.open
        closing = np.ones(len(o["id"]), dtype=bool) if bid_bound is None else \
            o["expires"] <= bid_bound
        if not closing.any():
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        won = closing & (o["best"] >= 0)
        order = np.argsort(o["expires"][won], kind="stable")
        result = (o["expires"][won][order], o["category"][won][order], o["best"][won][order])
        self.open = {k: v[~closing] for k, v in o.items()}
        return result

    def least_expires(self) -> int | None:
        """The earliest closing time of the open auctions (None when none is open)."""
        e = self.open["expires"]
        return int(e.min()) if len(e) else None

    def pending_times(self) -> list[int]:
        """The times that need a token: ``[least_expires()]`` or ``[]``."""
        least = self.least_expires()
        return [] if least is None else [least]

    def held_rows(self) -> int:
        return len(self.open["id"]) + len(self.waiting["auction"])

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        snap = self.snapshot()
        return [(snap["open"], key_hashes(snap["open"], "id")),
                (snap["waiting"], key_hashes(snap["waiting"], "auction"))]

    def add_rows(self, part: int, table: pa.Table) -> None:
        if part == 0:
            merged = {k: np.concatenate([self.open[k], int_column(table, k)])
                      for k in _AUCTION_FIELDS}
            order = np.argsort(merged["id"], kind="stable")
            self.open = {k: v[order] for k, v in merged.items()}
        else:
            self.waiting = {k: np.concatenate([self.waiting[k], int_column(table, k)])
                            for k in _BID_FIELDS}

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the open auctions and waiting bids of ``member`` bins: one hash of the ids
        (``auction``) and one mask filter per array; the kept arrays stay sorted by ``id``."""
        out = []
        for arrays, key in ((self.open, "id"), (self.waiting, "auction")):
            keys = arrays[key]
            if len(keys) == 0:
                out.append(Taken(pa.table({k: v[:0] for k, v in arrays.items()}), keys[:0].view(
                    np.uint64), False))
                continue
            hashes = column_hashes(pa.array(keys))
            mask = self.in_bins(hashes, member)
            taken = {k: v[mask] for k, v in arrays.items()}
            if mask.any():
                keep = ~mask
                arrays.update({k: v[keep] for k, v in arrays.items()})
            out.append(Taken(pa.table(taken), hashes[mask], True))
        return out

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        """Add the rows of ``parts`` (``ColumnarState.load``), then apply the waiting bids
        whose auction is now open: a moved bin's bids may have arrived before its auctions'
        state (``tokenflow.rescale.migrate``)."""
        super().load(parts)
        self.match_waiting()

    def snapshot(self) -> dict[str, Any]:
        """``{"open": pa.Table, "waiting": pa.Table}`` (copies: ``best`` changes in place)."""
        return {"open": pa.table({k: v.copy() for k, v in self.open.items()}),
                "waiting": pa.table({k: v.copy() for k, v in self.waiting.items()})}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()`` result."""
        self.open = {k: int_column(snapshot["open"], k).copy() for k in _AUCTION_FIELDS}
        self.waiting = {k: int_column(snapshot["waiting"], k).copy()
                        for k in ("auction", "price", "dateTime")}


def close_auctions(auctions: Stream, bids: Stream, name: str = "Q4Close",
                   elastic: Elastic | None = None) -> Stream:
    """Stage 1: ``(category, price, time)`` (``PENDING_SCHEMA``, ``time`` = ``expires``)
    of every auction with a winning bid once the bid frontier has reached its ``expires`` (or
    the bids ended): one batch per invocation, sorted by ``time``, sent at its least ``time``.

    Inputs: auction batches (exchanged by ``id``) and bid batches (exchanged by ``auction``).
    Tokens: one, at the least open ``expires``, in a ``CapabilitySet`` (see the module notes).
    State: ``"book"``, an ``AuctionBook``; restored from a snapshot, its token is minted from
    the initial token.  ``elastic``: a migrating operator (``tokenflow.rescale.migrate``).
    """

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        state = info.state("book", AuctionBook())
        token = CapabilitySet(capability.delayed(t) for t in state.pending_times())
        migrates(info, LeastToken(token))
        capability.drop()

        def logic(auction_in: OperatorInput, bid_in: OperatorInput, output: OperatorOutput) -> None:
            auction_batches, least = drain(auction_in)
            if auction_batches and least is not None:
                table = pa.Table.from_batches(auction_batches)
                if table.num_rows:
                    state.add_auctions(table)
                    soonest = int(int_column(table, "expires").min())
                    token.insert(least.delayed(soonest))  # kept only if before the held one
                    state.match_waiting()
            bid_batches, _ = drain(bid_in)
            if bid_batches:
                state.add_bids(np.concatenate([int_column(b, "auction") for b in bid_batches]),
                               np.concatenate([int_column(b, "price") for b in bid_batches]),
                               np.concatenate([int_column(b, "dateTime") for b in bid_batches]))
            state.prune_waiting(frontier_bound(auction_in.frontier))
            expires, category, price = state.close(frontier_bound(bid_in.frontier))
            cap = token.first()
            if len(expires):
                assert cap is not None, "open auctions always hold a token"
                winners = pa.RecordBatch.from_arrays(
                    [pa.array(category), pa.array(price), pa.array(expires)],
                    schema=PENDING_SCHEMA)
                output.give_batch(cap, winners, time=int(expires[0]))
            least_open = state.least_expires()
            if least_open is None:
                token.clear()
            elif cap is not None and cap.time < least_open:
                token.downgrade([least_open])

        return logic

    return keyed_operator([auctions, bids], ["id", "auction"], name, constructor, elastic)


TOTALS_SCHEMA = pa.schema([("category", pa.int64()), ("sum", pa.int64()), ("count", pa.int64())])
"""``CategoryAverages``' running totals as exported rows (cents, auctions)."""


class CategoryAverages(ColumnarState):
    """Running sum and count of winning prices per category, and winners waiting for their time.

    State (plain, snapshot-able): ``sums``, ``counts``: ``dict[category, int]`` (cents, auctions);
    ``pending``: ``list[(time_ms, pa.RecordBatch(category, price))]``.

    As a ``BinnedState`` (``ColumnarState``): part 0, the totals (``TOTALS_SCHEMA``); part 1,
    the pending winners (``PENDING_SCHEMA``); both keyed by ``category``.
    ``pending_times()``: the least pending time (the operator's one token).
    """

    PARTS = (tuple(TOTALS_SCHEMA.names), tuple(PENDING_SCHEMA.names))

    def __init__(self) -> None:
        self.sums: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.pending: list[tuple[int, pa.RecordBatch]] = []

    def add(self, time: int, batch: pa.RecordBatch) -> None:
        """Hold winners ``(category, price)`` that closed at ``time``."""
        self.pending.append((time, batch))

    def add_timed(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Hold winners ``(category, price, time)`` (``PENDING_SCHEMA``, in any order): one
        pending entry per distinct ``time``, as ``add`` would hold them."""
        times = int_column(rows, "time")
        order = np.argsort(times, kind="stable")
        winners = pa.RecordBatch.from_arrays(
            [pa.array(int_column(rows, "category")[order]),
             pa.array(int_column(rows, "price")[order])], schema=WINNER_SCHEMA)
        keys, lo, hi = group_slices(times[order])
        for t, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist(), strict=True):
            self.pending.append((t, winners.slice(a, b - a)))

    def advance(self, bound: int | None) -> pa.Table:
        """Fold in, in time order, the winners with ``time < bound`` (all when None) and return
        one ``SCHEMA`` row per (category, time) that changed, sorted by (time, category)."""
        ready = [(t, b) for t, b in self.pending if bound is None or t < bound]
        if not ready:
            return SCHEMA.empty_table()
        self.pending = [(t, b) for t, b in self.pending if not (bound is None or t < bound)]
        # one pending entry per closing time: thousands a call, so their columns are read
        # once from one table, not entry by entry
        winners = pa.Table.from_batches([b for _, b in ready])
        times = np.repeat(np.fromiter((t for t, _ in ready), np.int64, len(ready)),
                          [b.num_rows for _, b in ready])
        cats = int_column(winners, "category")
        prices = int_column(winners, "price")
        order = np.lexsort((times, cats))
        times, cats, prices = times[order], cats[order], prices[order]
        keys, lo, hi = group_slices(cats)
        group = np.repeat(np.arange(len(keys)), hi - lo)
        total = np.cumsum(prices)
        before = (total[lo] - prices[lo])[group]  # cumulative sum before each category's run
        prev_sum = np.array([self.sums.get(k, 0) for k in keys.tolist()], dtype=np.int64)
        prev_count = np.array([self.counts.get(k, 0) for k in keys.tolist()], dtype=np.int64)
        sums = total - before + prev_sum[group]
        counts = np.arange(len(cats)) - lo[group] + 1 + prev_count[group]
        for k, s, c in zip(keys.tolist(), sums[hi - 1].tolist(), counts[hi - 1].tolist(),
                           strict=True):
            self.sums[k] = s
            self.counts[k] = c
        last = np.r_[(cats[1:] != cats[:-1]) | (times[1:] != times[:-1]), True]
        out_cat, out_time = cats[last], times[last]
        out_avg = sums[last].astype(np.float64) / counts[last].astype(np.float64)
        by_time = np.lexsort((out_cat, out_time))
        return pa.table({"category": out_cat[by_time], "avg_price": out_avg[by_time],
                         "time": out_time[by_time]}, schema=SCHEMA)

    def pending_times(self) -> list[int]:
        """The least pending time (the one token needed), or ``[]``."""
        return [min(t for t, _ in self.pending)] if self.pending else []

    def pending_table(self) -> pa.Table:
        """The pending winners as one ``PENDING_SCHEMA`` table of one chunk, in ``pending``
        order (hashing and filtering a table of one chunk per entry, thousands, was the most
        of a take's time)."""
        if not self.pending:
            return PENDING_SCHEMA.empty_table()
        winners = pa.Table.from_batches([b for _, b in self.pending]) \
            .select(["category", "price"]).cast(WINNER_SCHEMA).combine_chunks()
        times = np.repeat(np.fromiter((t for t, _ in self.pending), np.int64),
                          [len(b) for _, b in self.pending])
        return winners.append_column("time", pa.array(times, pa.int64()))

    def held_rows(self) -> int:
        return len(self.sums) + sum(b.num_rows for _, b in self.pending)

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        n = len(self.sums)
        totals = pa.table([np.fromiter(self.sums.keys(), np.int64, n),
                           np.fromiter(self.sums.values(), np.int64, n),
                           np.fromiter((self.counts[k] for k in self.sums), np.int64, n)],
                          schema=TOTALS_SCHEMA)
        pending = self.pending_table()
        return [(totals, key_hashes(totals, "category")),
                (pending, key_hashes(pending, "category"))]

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the totals and pending winners of ``member`` bins: one hash of the held
        categories and one of the pending winners' (a mask filter each); when some pending
        rows go, the rows left are held again as ``add_timed`` holds them (one entry per
        time), with one filter of all pending rows: filtering each entry that held a row of a
        taken category (a fifth of them) took 4.4-5.4 ms in a paced q4 fluid step
        (2026-12-01)."""
        n = len(self.sums)
        keys = np.fromiter(self.sums.keys(), np.int64, n)
        hashes = column_hashes(pa.array(keys))
        mask = self.in_bins(hashes, member)
        gone = keys[mask].tolist()
        totals = pa.table([keys[mask], np.fromiter(map(self.sums.__getitem__, gone), np.int64,
                                                   len(gone)),
                           np.fromiter(map(self.counts.__getitem__, gone), np.int64, len(gone))],
                          schema=TOTALS_SCHEMA)
        if gone:
            kept = keys[~mask].tolist()
            self.sums = dict(zip(kept, map(self.sums.__getitem__, kept), strict=True))
            self.counts = dict(zip(kept, map(self.counts.__getitem__, kept), strict=True))
        out = [Taken(totals, hashes[mask], n > 0)]
        if not self.pending:
            return [*out, Taken(PENDING_SCHEMA.empty_table(), hashes[:0], False)]
        pending = self.pending_table()
        cats = pending.column("category")
        phashes = column_hashes(cats)
        pmask = self.in_bins(phashes, member)
        if pmask.any():
            self.pending = []
            self.add_timed(pending.filter(pa.array(~pmask)))
        return [*out, Taken(pending.filter(pa.array(pmask)), phashes[pmask], pending.num_rows > 0)]

    def add_rows(self, part: int, table: pa.Table) -> None:
        if part == 0:
            for k, s, c in zip(int_column(table, "category").tolist(),
                               int_column(table, "sum").tolist(),
                               int_column(table, "count").tolist(), strict=True):
                self.sums[k] = s
                self.counts[k] = c
            return
        self.add_timed(table)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def snapshot(self) -> dict[str, Any]:
        """``{"sums", "counts": dict, "pending": [(time, RecordBatch)]}`` (copies of the dicts)."""
        return {"sums": dict(self.sums), "counts": dict(self.counts),
                "pending": list(self.pending)}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()`` result."""
        self.sums = {int(k): int(v) for k, v in snapshot["sums"].items()}
        self.counts = {int(k): int(v) for k, v in snapshot["counts"].items()}
        self.pending = [(int(t), b) for t, b in snapshot["pending"]]


def running_average(winners: Stream, name: str = "Q4Average",
                    elastic: Elastic | None = None) -> Stream:
    """Stage 2: exchange winners (``PENDING_SCHEMA`` batches) by ``category``; once the
    frontier passes a time, send one ``SCHEMA`` row per category whose average changed at
    that time (at that time, in time order).  Tokens: a ``CapabilitySet`` with one token at
    the least pending time.  State: ``"averages"``, a ``CategoryAverages``; restored from a
    snapshot, its token is minted from the initial token.  ``elastic``: a migrating operator
    (``tokenflow.rescale.migrate``)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        held = info.state("averages", CategoryAverages())
        token = CapabilitySet(capability.delayed(t) for t in held.pending_times())
        migrates(info, LeastToken(token))
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                held.add_timed(batch)  # its rows' times are >= the message's
                if token.is_empty() or ref.time < token.times()[0]:
                    token.insert(ref.retain())
            if token.is_empty():
                return
            rows = held.advance(frontier_bound(input.frontier))
            cap = token.first()
            if rows.num_rows:
                assert cap is not None, "pending winners always hold a token"
                keys, lo, hi = group_slices(int_column(rows, "time"))
                batch = pa.RecordBatch.from_arrays(
                    [rows.column(c).combine_chunks() for c in COLUMNS], schema=SCHEMA)
                for t, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist(), strict=True):
                    output.give_batch(cap, batch.slice(a, b - a), time=t)
            remaining = held.pending_times()
            if not remaining:
                token.clear()
            elif cap is not None and cap.time < remaining[0]:
                token.downgrade(remaining)

        return logic

    return keyed_operator([winners], ["category"], name, constructor, elastic)


def build(streams: dict[str, Stream], config: Any = None, elastic: Elastic | None = None) -> Stream:
    """Q4 over ``nexmark_source`` streams (uses ``auction`` and ``bid``); ``config`` is unused.
    With ``elastic`` both stateful operators migrate (``tokenflow.rescale.migrate``).

    Returns the stream of ``SCHEMA`` record batches (``category, avg_price, time``), each at
    its logical time ``time``.
    """
    auctions = coalesce(streams["auction"], name="Q4CoalesceAuctions")
    bids = coalesce(streams["bid"], name="Q4CoalesceBids")
    return running_average(close_auctions(auctions, bids, elastic=elastic), elastic=elastic)


def last_per_category(df: pd.DataFrame) -> pd.DataFrame:
    """The row with the largest ``time`` per category (the final running average)."""
    if df.empty:
        return df.loc[:, COLUMNS].reset_index(drop=True)
    last = df.sort_values(["category", "time"], kind="stable").groupby("category").tail(1)
    return last.loc[:, COLUMNS].sort_values("category").reset_index(drop=True)


def compare(dataflow_df: pd.DataFrame, spark_df: pd.DataFrame) -> None:
    """Assert that the last dataflow row per category equals Spark's final average exactly.

    Raises:
        AssertionError: with the differing rows (``category``, both averages and times).
    """
    ours = last_per_category(dataflow_df)
    theirs = spark_df.loc[:, COLUMNS].sort_values("category").reset_index(drop=True)
    merged = ours.merge(theirs, on="category", how="outer", suffixes=("_dataflow", "_spark"),
                        indicator=True)
    bad = merged[(merged["_merge"] != "both")
                 | (merged["avg_price_dataflow"] != merged["avg_price_spark"])
                 | (merged["time_dataflow"] != merged["time_spark"])]
    if len(bad):
        raise AssertionError(
            f"Q4: {len(bad)} of {len(merged)} categories differ (last running average per "
            f"category vs Spark's final average):\n{bad.to_string(index=False)}")


__all__ = ["COLUMNS", "ELASTIC", "PENDING_SCHEMA", "SCHEMA", "SPARK_SQL", "TOTALS_SCHEMA",
           "WINNERS_SQL", "WINNER_SCHEMA", "AuctionBook", "CategoryAverages", "build",
           "close_auctions", "compare", "last_per_category", "running_average"]
