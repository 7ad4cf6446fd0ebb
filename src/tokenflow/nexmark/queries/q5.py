"""NEXMark Q5, hot items: per sliding window (10 s, every 5 s), the auctions with the most bids.

Source: docs/NEXMARK.md ("Queries": Q5, hot items: bids per auction in sliding windows of 10 s
every 5 s; the auctions with the maximum count); the timestamp-tokens paper §5 (one token per open window,
windows retired in order once the frontier passes their end) and §6.3.

Output columns (``COLUMNS``): ``window_start``, ``window_end`` (ms since the Unix epoch;
windows ``[k * 5_000, k * 5_000 + 10_000)`` aligned to the epoch, so a bid at ``dateTime`` is in
the two windows starting at ``dateTime - dateTime % 5000`` and 5 s before), ``auction``,
``count`` (bids of that auction in the window) — all int64.  Only the auctions whose count is
the window's maximum (ties all kept); windows without bids produce nothing.  A window's rows are
sent at logical time ``window_end``.

Dataflow:

0. ``Q5PreCount`` (pipeline, stateless): per invocation, the bids received are counted per
   ``(window, auction)`` with one lexsort and a run-length pass (numpy) and sent as one batch
   at the least time received (a combiner: one exchanged batch per invocation).
1. ``Q5Count`` (partial counts exchanged by ``auction``): the partial counts are appended to
   their windows (``WindowCounts``); each open window holds one token at its end.  When the
   frontier reaches a window's end its partials are summed per auction (merged into the
   window's running sums, ``WindowCounts.summed``), and the auctions with this worker's
   maximum count — the only possible global winners, as all bids of an auction meet on one
   worker — are sent at time ``window_end`` and the token dropped.
2. ``Q5GlobalMax`` (exchange by ``window_start``): the worker owning a window keeps the
   candidates with the largest count and sends them once its frontier has passed
   ``window_end`` (``_windows.window_max``).

State: ``Q5Count`` declares its ``WindowCounts`` as ``"counts"`` (partial counts per bin of
``auction``, the key of its exchange); ``Q5GlobalMax`` its ``WindowMaxState`` (per bin of
``window_start``).  ``Q5PreCount`` keeps nothing between invocations.  Restored from a
snapshot, each operator re-mints one token per open window end (``pending_times()``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary
from tokenflow.dataflow.stream import Stream
from tokenflow.io.times import round_down
from tokenflow.nexmark.queries._windows import (
    ChunkBins,
    ColumnarState,
    Taken,
    WindowTokens,
    concat,
    drain,
    frontier_bound,
    group_slices,
    int_column,
    key_hashes,
    passed,
    window_max,
)
from tokenflow.rescale.migrate import Elastic, keyed_operator, migrates

SIZE_MS = 10_000
"""Window length (ms)."""
SLIDE_MS = 5_000
"""Distance between window starts (ms)."""

COLUMNS: list[str] = ["window_start", "window_end", "auction", "count"]
ELASTIC = True
"""``build(..., elastic=Elastic())`` builds the stateful operators as migrating ones
(``tokenflow.rescale.migrate``): their bins move between workers while the job runs."""
SCHEMA = pa.schema([(c, pa.int64()) for c in COLUMNS])

SPARK_SQL = f"""
SELECT window_start, window_end, auction, `count`
FROM (
  SELECT window_start, window_start + {SIZE_MS} AS window_end, auction, COUNT(*) AS `count`,
         MAX(COUNT(*)) OVER (PARTITION BY window_start) AS max_count
  FROM (
    SELECT auction, explode(sequence(s - {SIZE_MS - SLIDE_MS}, s, {SLIDE_MS})) AS window_start
    FROM (SELECT auction, dateTime - pmod(dateTime, {SLIDE_MS}) AS s FROM bid)
  )
  GROUP BY window_start, auction
)
WHERE `count` = max_count
"""
"""Spark SQL over the temp view ``bid``: the same rows as the dataflow (as a multiset)."""

COMPACT_AFTER = 16
"""Partial count arrays a window accumulates before they are merged into its sums
(``WindowCounts.summed``).  A merge sorts only the new partials but passes over the sums
once, so fewer partials a time spread the same sorting over shorter steps: q5 paced at
500K events/s, epoch p99 10.7-14.1 ms against 18.0-20.8 ms with 64, at the same p50 and the
same closed-loop throughput (1.32M events/s, three and two runs interleaved)."""

KEY_BITS = 47
"""Auction ids in ``[0, 2**KEY_BITS)`` are ordered with their bin by one int64 sort key,
``bin << KEY_BITS | auction``, which stays positive for every bin (below ``MAX_BINS``,
``2**16``); other ids take a slower lexsort."""


COUNTS_SCHEMA = pa.schema([("window_end", pa.int64()), ("auction", pa.int64()),
                           ("count", pa.int64())])
"""``WindowCounts`` as exported rows: a partial count of ``auction``'s bids in the window
ending at ``window_end`` (ms); an auction may have several rows in a window (its count is
their sum)."""


Partial = tuple[np.ndarray, np.ndarray]
"""Partial counts: ``(auctions, counts)``, int64 arrays of equal length."""


class WindowCounts(ColumnarState):
    """Partial bid counts per ``(window, auction)`` for the open windows of one worker.

    State (plain, snapshot-able): ``partials: dict[window_end_ms, list[Partial]]`` (an auction
    may repeat across partials).  Tokens are not state: the operator holds one per key of
    ``partials`` (``pending_times``).  A window's first partial is usually its sums
    (``summed``): distinct auctions ordered by (bin, auction), into which the partials that
    arrive are merged every ``COMPACT_AFTER``; the others are ordered by bin when added.  A
    migration's take of a few runs of bins cuts every partial into zero-copy slices.

    As a ``BinnedState`` (``ColumnarState``): the partials (``COUNTS_SCHEMA``, summed per
    window and auction, in (bin, auction) order) keyed by ``auction``.  Summed, a state's
    bytes spread over the bins as its auctions do: as held, a hot auction's rows in every new
    partial weighed its bin, and a scale-out moved 28 % of the bytes where the bound is
    1/4 + 2 %.  The window size and slide are the operator's parameters, not exported.

    Raises:
        ValueError: (constructor) when ``slide`` does not divide ``size`` or either is <= 0.
    """

    take_per_bin = True  # bins memoized per chunk: a take costs about its share

    def __init__(self, size: int = SIZE_MS, slide: int = SLIDE_MS) -> None:
        if size <= 0 or slide <= 0 or size % slide:
            raise ValueError(f"need 0 < slide dividing size, got size={size}, slide={slide}")
        self.size = size
        self.slide = slide
        self.partials: dict[int, list[Partial]] = {}
        self._bins = ChunkBins()  # bins of the partials' auctions, hashed once across takes

    def add(self, start: np.ndarray, auction: np.ndarray, count: np.ndarray,
            compact: bool = True) -> None:
        """Add partial counts: ``count[i]`` bids of ``auction[i]`` in the window starting at
        ``start[i]`` (ms), in any order (``partial_counts`` output, possibly concatenated).

        Each window's new partial is ordered by the bins of its auctions (hashed here, once;
        rows of a bin keep their order) and its bins remembered, so a migration's take of a
        few runs of bins cuts it into slices instead of filtering it both ways: at half load
        a window holds dozens of partials of thousands of rows, and one-bin takes that
        filtered each of them ran 5-12 ms.  ``compact`` (False for loaded rows: a load is
        part of a migration step) merges a window's partials into its sums once it holds
        more than ``COMPACT_AFTER``."""
        if len(start) == 0:
            return
        size = self.bins or 1
        order = np.argsort(start, kind="stable")
        start, auction, count = start[order], auction[order], count[order]
        found = ChunkBins.of_keys(auction, size)
        keys, lo, hi = group_slices(start)
        for s, a, b in zip(keys.tolist(), lo.tolist(), hi.tolist(), strict=True):
            by_bin = a + np.argsort(found[a:b], kind="stable")  # radix sort of uint16
            partial = (auction[by_bin], count[by_bin])
            self._bins.put(partial[0], found[by_bin], size, True)
            parts = self.partials.setdefault(s + self.size, [])
            parts.append(partial)
            if compact and len(parts) > COMPACT_AFTER:
                self.partials[s + self.size] = [self.summed(parts)[0]]

    def summed(self, parts: list[Partial]) -> tuple[Partial, np.ndarray]:
        """``parts`` summed per auction, ordered by (bin, auction), and the bin of each of
        its rows (uint16; remembered, so a take cuts the sums into slices).

        The leading parts that are such sums already (a previous result, or the slices of it
        a take kept: bins ascending, sort keys rising strictly across them) are kept as they
        are; only the parts after them are sorted (one int64 key per row, ``KEY_BITS``),
        then merged with them by a stable argsort, which finds the two sorted runs and merges
        them in one linear pass; equal keys are summed.  A compaction thus sorts what arrived
        since the last one, not the whole window again."""
        size = self.bins or 1
        found = self._bins.lookup([p[0] for p in parts], _itself, size)
        base_keys: list[np.ndarray] = []
        last = -1
        for part, bins in zip(parts, found, strict=True):
            if not self._bins.ascending(part[0]):
                break
            key = _sort_key(bins, part[0])  # type: ignore[arg-type]
            if key is None or (len(key) and (key[0] <= last or bool((key[1:] <= key[:-1]).any()))):
                break
            last = int(key[-1]) if len(key) else last
            base_keys.append(key)
        k = len(base_keys)
        if k == 1 and len(parts) == 1:
            return parts[0], found[0]  # type: ignore[return-value]
        auctions = np.concatenate([np.zeros(0, np.int64), *(p[0] for p in parts)])
        counts = np.concatenate([np.zeros(0, np.int64), *(p[1] for p in parts)])
        bins = np.concatenate([np.zeros(0, np.uint16), *found])  # type: ignore[arg-type]
        based = sum(len(b) for b in base_keys)
        key = _sort_key(bins[based:], auctions[based:])
        if key is None:  # ids outside the sort key's range: every part sorted again
            order = np.lexsort((auctions, bins))
            ordered = auctions[order]
            first = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        else:
            # the parts after the base sorted, then merged with it: timsort (a stable
            # argsort) finds the two sorted runs and merges them in one linear pass
            rest = np.argsort(key)
            order = np.argsort(np.concatenate([*base_keys, key[rest]]), kind="stable")
            order = np.concatenate([np.arange(based), based + rest])[order]
            key = np.concatenate([*base_keys, key])[order]
            first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        one = order[first]  # a row of each auction
        out = (auctions[one], np.add.reduceat(counts[order], first) if len(first) else counts)
        out_bins = bins[one]
        self._bins.put(out[0], out_bins, size, True)
        return out, out_bins

    def retire(self, bound: int | None) -> list[pa.RecordBatch]:
        """Remove the windows the bid frontier ``bound`` has reached (``end <= bound``; all when
        None) and return, per window by end, its auctions with the maximum count (``SCHEMA``,
        in auction order)."""
        out = []
        for end in sorted(e for e in self.partials if passed(bound, e, inclusive=False)):
            (auctions, counts), _ = self.summed(self.partials.pop(end))
            best = np.flatnonzero(counts == counts.max())
            best = best[np.argsort(auctions[best])]
            n = len(best)
            out.append(pa.RecordBatch.from_arrays(
                [pa.array(np.full(n, end - self.size, dtype=np.int64)),
                 pa.array(np.full(n, end, dtype=np.int64)),
                 pa.array(auctions[best]), pa.array(counts[best])], schema=SCHEMA))
        return out

    def pending_times(self) -> list[int]:
        """Window ends that need a token."""
        return sorted(self.partials)

    def _table(self, windows: dict[int, list[Partial]]) -> tuple[pa.Table, np.ndarray]:
        """``COUNTS_SCHEMA`` rows of ``windows``, each window summed (``summed``: its rows in
        (bin, auction) order, so a state's bytes spread over the bins as its auctions do)
        and their bins."""
        ends, auctions, counts, bins = [], [], [], []
        for end, parts in windows.items():
            (a, c), b = self.summed(parts)
            ends.append(np.full(len(a), end, dtype=np.int64))
            auctions.append(a)
            counts.append(c)
            bins.append(b)
        table = pa.table([np.concatenate(ends), np.concatenate(auctions), np.concatenate(counts)],
                         schema=COUNTS_SCHEMA)
        return table, np.concatenate(bins)

    def held_rows(self) -> int:
        """The partial counts' rows (at least the summed rows ``rows()`` gives)."""
        return sum(len(p[0]) for parts in self.partials.values() for p in parts)

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        """The windows' counts summed per auction, as ``COUNTS_SCHEMA`` rows (``summed``; the
        state is not changed)."""
        if not self.partials:
            return [(COUNTS_SCHEMA.empty_table(), np.zeros(0, dtype=np.uint64))]
        table, _ = self._table(self.partials)
        return [(table, key_hashes(table, "auction"))]

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the partial counts of the auctions of ``member`` bins (``ChunkBins.split``:
        one gather over the held rows' bins finds the partials with rows going; a window's
        sums give up runs of bins as slices; other partials are filtered each way, consecutive
        small ones first concatenated into one), then summed per window (``summed``: the
        rows ``rows()`` gives those bins, in its order), their bins known (not hashed again);
        a window left without partials is forgotten (its token is released)."""
        if not self.partials:
            return [Taken(COUNTS_SCHEMA.empty_table(), np.zeros(0, dtype=np.uint64), False)]
        taken, left = self._bins.split(self.partials, _first, _itself, member, _cut,
                                       _merge, _piece)
        self.partials = left
        if not taken:
            return [Taken(COUNTS_SCHEMA.empty_table(), np.zeros(0, dtype=np.uint64), True)]
        table, bins = self._table(taken)
        return [Taken(table, None, True, bins)]

    def _keys(self) -> list[np.ndarray]:
        """Every held partial's auctions, window by window, in order."""
        return [_first(p) for parts in self.partials.values() for p in parts]

    def prepare_take(self, deadline: float) -> bool:
        """Hash the held auctions a take would hash (``ChunkBins.warm``) until ``deadline``
        (``time.perf_counter()`` seconds); True when all are.  Partials are not merged here:
        new ones keep coming while a step waits."""
        return self._bins.warm(self._keys(), _itself, self.bins or 1, deadline)

    def add_rows(self, part: int, table: pa.Table) -> None:
        ends = int_column(table, "window_end")
        self.add(ends - self.size, int_column(table, "auction"), int_column(table, "count"),
                 compact=False)

    def clear(self) -> None:
        self.partials = {}

    def snapshot(self) -> dict[str, Any]:
        """``{"size", "slide", "windows": {end: pa.Table(auction, count)}}`` (summed)."""
        windows = {}
        for end, parts in self.partials.items():
            (auctions, counts), _ = self.summed(parts)
            windows[end] = pa.table({"auction": auctions, "count": counts})
        return {"size": self.size, "slide": self.slide, "windows": windows}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()`` result."""
        self.size = int(snapshot["size"])
        self.slide = int(snapshot["slide"])
        self.partials = {
            int(end): [(int_column(t, "auction"), int_column(t, "count"))]
            for end, t in snapshot["windows"].items()}


def _sort_key(bins: np.ndarray, auctions: np.ndarray) -> np.ndarray | None:
    """One int64 per row ordering rows by (bin, auction): ``bin << KEY_BITS | auction``; None
    when an auction id is outside ``[0, 2**KEY_BITS)``."""
    if len(auctions) and (auctions.min() < 0 or auctions.max() >= 1 << KEY_BITS):
        return None
    return (bins.astype(np.int64) << KEY_BITS) | auctions


def _first(partial: Partial) -> np.ndarray:
    """A partial's auctions: what its bins are remembered by, and its key column."""
    return partial[0]


def _itself(auctions: np.ndarray) -> np.ndarray:
    """The key column of a partial's auctions: the array itself."""
    return auctions


def _cut(partial: Partial, mask: np.ndarray) -> Partial:
    """The rows of a partial where ``mask`` is set."""
    return partial[0][mask], partial[1][mask]


def _piece(partial: Partial, lo: int, hi: int) -> Partial:
    """The rows ``[lo, hi)`` of a partial (views, no copy)."""
    return partial[0][lo:hi], partial[1][lo:hi]


def _merge(partials: list[Partial]) -> Partial:
    """One partial of the rows of ``partials``, in their order (not summed: an auction may
    repeat, as it may across partials)."""
    return np.concatenate([p[0] for p in partials]), np.concatenate([p[1] for p in partials])


def partial_counts(auction: np.ndarray, date: np.ndarray, size: int = SIZE_MS,
                   slide: int = SLIDE_MS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bids (``auction`` ids, ``date`` = dateTime ms) counted per ``(window start, auction)``
    over every window holding them (``size // slide`` each), with one sort and a run-length
    pass.  Returns int64 arrays ``(start, auction, count)`` sorted by (start, auction).

    The pair is sorted as one int64 key, ``slides since the least start * auction span +
    auction offset``: a batch's bids span few windows and a bounded range of auctions, and one
    key sorts in about a third of the time of ``np.lexsort`` on two (4,600 bids: 0.43 against
    1.1 ms).  A key that could pass 2**62 falls back to the lexsort."""
    if len(auction) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    last = round_down(date, slide)
    copies = size // slide
    least, low = int(last.min()), int(auction.min())
    span = int(auction.max()) - low + 1
    slot = (last - least) // slide + (copies - 1)  # the latest window's slot; >= 0 for all
    if (int(slot.max()) + 1) * span < 1 << 62:
        keys = np.concatenate([(slot - i) * span for i in range(copies)])
        keys += np.tile(auction - low, copies)
        keys.sort()
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        counts = np.diff(np.r_[first, len(keys)]).astype(np.int64)
        pairs = keys[first]
        slots = pairs // span
        return (slots - (copies - 1)) * slide + least, pairs - slots * span + low, counts
    starts = np.concatenate([last - i * slide for i in range(copies)])
    auctions = np.tile(auction, copies)
    order = np.lexsort((auctions, starts))
    starts = starts[order]
    auctions = auctions[order]
    change = np.r_[True, (starts[1:] != starts[:-1]) | (auctions[1:] != auctions[:-1])]
    first = np.flatnonzero(change)
    counts = np.diff(np.r_[first, len(starts)]).astype(np.int64)
    return starts[first], auctions[first], counts


PARTIAL_SCHEMA = pa.schema([("window_start", pa.int64()), ("auction", pa.int64()),
                            ("count", pa.int64())])
"""Stage 0 output: partial bid counts per (window, auction)."""


def pre_count(bids: Stream, name: str = "Q5PreCount") -> Stream:
    """Stage 0 (pipeline, stateless): per invocation, the bids received counted per
    ``(window_start, auction)`` (``partial_counts``), sent as one ``PARTIAL_SCHEMA`` batch at
    the least time received.  Moving rows to that earlier time is allowed (its ref covers it)
    and keeps every row's windows ending after its time.  Shrinks the exchange by auction to
    one batch per invocation, instead of one per message at 1 ms granularity."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            batches, least = drain(input)
            if least is None:
                return
            table = concat(batches)
            if table.num_rows == 0:
                return
            start, auction, count = partial_counts(int_column(table, "auction"),
                                                   int_column(table, "dateTime"))
            output.give_batch(least, pa.RecordBatch.from_arrays(
                [pa.array(start), pa.array(auction), pa.array(count)], schema=PARTIAL_SCHEMA))

        return logic

    return unary(bids, "pipeline", name, constructor)


def count_candidates(partials: Stream, name: str = "Q5Count",
                     elastic: Elastic | None = None) -> Stream:
    """Stage 1: per window, this worker's auctions with the most bids, sent at ``window_end``.

    Input: ``PARTIAL_SCHEMA`` batches (``pre_count``), exchanged by ``auction`` here.  Tokens:
    one per open window, minted at its end from the least message ref of the invocation that
    opened it (every bid's windows end after its ``dateTime`` >= its message time), dropped
    after the window's candidates are sent.  State: ``"counts"``, a ``WindowCounts``;
    restored from a snapshot, its windows get their tokens from the initial token.
    ``elastic``: a migrating operator (``tokenflow.rescale.migrate``).
    """

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        held = info.state("counts", WindowCounts())
        tokens = WindowTokens(capability, held.pending_times())
        migrates(info, tokens)
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            batches, least = drain(input)
            if batches and least is not None:
                table = concat(batches)
                held.add(int_column(table, "window_start"), int_column(table, "auction"),
                         int_column(table, "count"))
                tokens.mint(least, held.partials)
            for batch in held.retire(frontier_bound(input.frontier)):
                cap = tokens.pop(int(batch.column("window_end")[0].as_py()))
                output.give_batch(cap, batch)
                cap.drop()

        return logic

    return keyed_operator([partials], ["auction"], name, constructor, elastic)


def build(streams: dict[str, Stream], config: Any = None, elastic: Elastic | None = None) -> Stream:
    """Q5 over ``nexmark_source`` streams (uses ``streams["bid"]``); ``config`` is unused.
    With ``elastic`` both stateful operators migrate (``tokenflow.rescale.migrate``).

    Returns the stream of ``SCHEMA`` record batches, one per window at time ``window_end``.
    """
    local = count_candidates(pre_count(streams["bid"]), elastic=elastic)
    return window_max(local, Exchange(column="window_start"), "count", SCHEMA, inclusive=True,
                      name="Q5GlobalMax", elastic=elastic)


__all__ = ["COLUMNS", "COUNTS_SCHEMA", "ELASTIC", "PARTIAL_SCHEMA", "SCHEMA", "SIZE_MS", "SLIDE_MS",
           "SPARK_SQL", "WindowCounts", "build", "count_candidates", "partial_counts", "pre_count"]
