"""The NEXMark query states as ``BinnedState``s: export per bin, restore at 1, 2 and 3 workers.

Each state class is filled from generated events (``generate(0, 20_000, GeneratorConfig(rate=500))``:
40 s of event time, so several windows are open at once) through the methods its operator
calls, in the order it calls them, chunk by chunk of event time.  Half-way, its bins are
exported (each table through an Arrow IPC stream, as a snapshot stores it) and, for
``W in (1, 2, 3)``, loaded into ``W`` fresh states, each given the bins it owns under
``RoutingTable.even(2).rebalanced(range(W))`` (the table of a job snapshotted at 2 workers and
restored at ``W``).  Checked:

(a) every row lands on exactly one worker, the one its input exchange routes its key to
    (``column_routes`` through the new table); a worker-local part lands on the owner of the
    bin it was exported under;
(b) the union of the restored states equals the original: same rows, same pending times;
(c) continuing the computation — the second half of the events routed as the exchanges route
    them — gives the same outputs as the original state does (the union over workers, after
    the query's global stage where its first stage is worker-local or per key).

Source: Megaphone (Hoffmann et al., VLDB 2019: state in bins that move between workers with
the routing table); the timestamp-tokens paper §5 (tokens re-minted from ``pending_times``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from roundtrip import OLD, WORKERS, S, exported, fresh, restore

from tokenflow.dataflow.routing import column_routes
from tokenflow.nexmark import GeneratorConfig, generate
from tokenflow.nexmark.queries import q3, q4, q5, q7, q8
from tokenflow.nexmark.queries._windows import WindowMaxState, int_column
from tokenflow.state.bins import RoutingTable

pytestmark = pytest.mark.timeout(300)

CONFIG = GeneratorConfig(rate=500)
EVENTS = 20_000
CHUNK_MS = 2_000
"""Event time per step (ms): each step feeds the events of one chunk of ``dateTime``."""


# -- harness ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def events() -> dict[str, pa.RecordBatch]:
    return generate(0, EVENTS, CONFIG)


def steps(events: dict[str, pa.RecordBatch]) -> list[tuple[int, dict[str, pa.Table]]]:
    """The events cut into chunks of ``CHUNK_MS`` of ``dateTime``: ``[(chunk end, {kind:
    rows})]``, in time order (every kind has a table, possibly empty)."""
    first = min(int(pc.min(b.column("dateTime")).as_py()) for b in events.values())
    last = max(int(pc.max(b.column("dateTime")).as_py()) for b in events.values())
    out = []
    for lo in range(first - first % CHUNK_MS, last + 1, CHUNK_MS):
        rows = {}
        for kind, batch in events.items():
            date = int_column(batch, "dateTime")
            rows[kind] = pa.Table.from_batches([batch]).filter(
                pa.array((date >= lo) & (date < lo + CHUNK_MS)))
        out.append((lo + CHUNK_MS, rows))
    return out










def originals(make: Callable[[], S], workers: int = 1) -> list[S]:
    """The states of the old job's first ``workers`` workers (one holds every key)."""
    return [fresh(make, OLD, w) for w in range(workers)]


def routed(table: pa.Table, column: str, routing: RoutingTable, worker: int) -> pa.Table:
    """The rows of ``table`` its exchange by ``column`` sends to ``worker``."""
    if table.num_rows == 0:
        return table
    return table.filter(pa.array(column_routes(table.column(column), routing) == worker))


def assert_on_owner(rows: pa.Table, column: str, routing: RoutingTable, worker: int) -> None:
    """(a): every row of ``rows`` is routed (by ``column``) to ``worker``."""
    if rows.num_rows:
        routes = column_routes(rows.column(column), routing)
        assert (routes == worker).all(), \
            f"{int((routes != worker).sum())} rows of worker {worker} belong elsewhere"


def as_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch (what an operator receives in one message)."""
    table = table.combine_chunks()
    return table.to_batches()[0] if table.num_rows else \
        pa.RecordBatch.from_pylist([], schema=table.schema)


def dealt(table: pa.Table, workers: int, worker: int) -> pa.Table:
    """The rows ``i`` of ``table`` with ``i % workers == worker`` (a source's round-robin)."""
    return table.filter(pa.array(np.arange(table.num_rows) % workers == worker))


def multiset(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


def half(all_steps: list[Any]) -> tuple[list[Any], list[Any]]:
    middle = len(all_steps) // 2
    return all_steps[:middle], all_steps[middle:]


# -- q3: JoinState --------------------------------------------------------------------------------


def q3_inputs(rows: dict[str, pa.Table]) -> tuple[pa.Table, pa.Table]:
    """The join's inputs, filtered as ``q3.build`` filters them."""
    auctions = rows["auction"].filter(pc.equal(rows["auction"].column("category"), q3.CATEGORY))
    persons = rows["person"].filter(pc.is_in(rows["person"].column("state"),
                                             value_set=pa.array(q3.STATES)))
    return auctions.select(["id", "seller"]), persons.select(["id", *q3.PERSON_SCHEMA.names])


def q3_feed(state: q3.JoinState, t: int, auctions: pa.Table,
            persons: pa.Table) -> list[dict[str, Any]]:
    """One invocation of ``Q3Join``: auctions first, then persons; its output rows (+ time)."""
    out: list[dict[str, Any]] = []
    matches = [state.match_auctions(int_column(auctions, "id"), int_column(auctions, "seller"), t),
               state.add_persons(int_column(persons, "id"),
                                 as_batch(persons.select(q3.PERSON_SCHEMA.names)), t)]
    for rows, ids, times in matches:
        if len(rows):
            for row, time in zip(state.output(rows, ids).to_pylist(), times.tolist(), strict=True):
                out.append({**row, "time": time})
    return out


@pytest.mark.parametrize("workers", WORKERS)
def test_q3_join_state_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    before, after = half(steps(events))
    (state,) = originals(q3.JoinState)
    for t, rows in before:
        q3_feed(state, t, *q3_inputs(rows))
    assert state.waiting and state.person_row  # both sides hold rows at the snapshot
    assert state.pending_times() == []
    parts = exported(state)
    routing, split = restore(q3.JoinState, parts, workers)

    # (a) persons on the owner of their id, waiting auctions on the owner of their seller
    persons = state.person_table()
    for w, s in enumerate(split):
        assert_on_owner(s.person_table(), "id", routing, w)
        assert_on_owner(s.waiting_table(), "seller", routing, w)
    # (b) the same persons (with their message times) and the same waiting lists, once each
    union = pa.concat_tables([s.person_table() for s in split])
    assert union.num_rows == persons.num_rows
    assert multiset(union.to_pylist()) == multiset(persons.to_pylist())
    waiting: dict[int, list[tuple[int, int]]] = {}
    for s in split:
        assert not set(waiting) & set(s.waiting)
        waiting.update(s.waiting)
        assert s.pending_times() == []
    assert waiting == state.waiting
    # (c) the rest of the stream gives the same matches at the same times
    expected: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    for t, rows in after:
        auctions, people = q3_inputs(rows)
        expected += q3_feed(state, t, auctions, people)
        for w, s in enumerate(split):
            got += q3_feed(s, t, routed(auctions, "seller", routing, w),
                           routed(people, "id", routing, w))
    assert len(expected) > 10
    assert multiset(got) == multiset(expected)


# -- q4: AuctionBook and CategoryAverages -----------------------------------------------------


def q4_steps(events: dict[str, pa.RecordBatch]) -> list[tuple[pa.Table, pa.Table, int, int]]:
    """``Q4Close`` invocations: ``(auctions, bids, auction bound, bid bound)``; the auction
    channel lags one chunk behind the bids, so early bids wait for their auction."""
    out = []
    previous = None
    for end, rows in steps(events):
        auctions = previous if previous is not None else rows["auction"].slice(0, 0)
        out.append((auctions, rows["bid"], end - CHUNK_MS, end))
        previous = rows["auction"]
    return out


def close_step(book: q4.AuctionBook, auctions: pa.Table, bids: pa.Table, auction_bound: int,
               bid_bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One invocation of ``Q4Close``, as its logic calls the book."""
    if auctions.num_rows:
        book.add_auctions(auctions)
        book.match_waiting()
    if bids.num_rows:
        book.add_bids(int_column(bids, "auction"), int_column(bids, "price"),
                      int_column(bids, "dateTime"))
    book.prune_waiting(auction_bound)
    return book.close(bid_bound)


def closed(result: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[tuple[int, int, int]]:
    return list(zip(*(a.tolist() for a in result), strict=True))


def book_tables(book: q4.AuctionBook) -> tuple[pa.Table, pa.Table]:
    snap = book.snapshot()
    return snap["open"], snap["waiting"]


@pytest.mark.parametrize("workers", WORKERS)
def test_q4_auction_book_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    all_steps = q4_steps(events)
    (book,) = originals(q4.AuctionBook)
    for i, step in enumerate(all_steps):  # to the first step past the middle with bids waiting
        close_step(book, *step)
        if i >= len(all_steps) // 2 and len(book.waiting["auction"]):
            break
    after = all_steps[i + 1:]
    open_rows, waiting_rows = book_tables(book)
    assert open_rows.num_rows > 10 and waiting_rows.num_rows > 0
    parts = exported(book)
    routing, split = restore(q4.AuctionBook, parts, workers)

    # (a) open auctions by id, waiting bids by auction (the same key value)
    for w, s in enumerate(split):
        o, wt = book_tables(s)
        assert_on_owner(o, "id", routing, w)
        assert_on_owner(wt, "auction", routing, w)
        assert (np.diff(s.open["id"]) > 0).all()  # still sorted by id
    # (b) the same open auctions (best prices included) and waiting bids; each worker's token
    # is at its least expires, the least of them the original's
    opens = pa.concat_tables([book_tables(s)[0] for s in split])
    waits = pa.concat_tables([book_tables(s)[1] for s in split])
    assert multiset(opens.to_pylist()) == multiset(open_rows.to_pylist())
    assert multiset(waits.to_pylist()) == multiset(waiting_rows.to_pylist())
    for s in split:
        assert s.pending_times() == ([] if len(s.open["expires"]) == 0
                                     else [int(s.open["expires"].min())])
    assert min(t for s in split for t in s.pending_times()) == book.pending_times()[0]
    # (c) the same auctions close with the same winning prices at the same times
    expected: list[tuple[int, int, int]] = []
    got: list[tuple[int, int, int]] = []
    for auctions, bids, a_bound, b_bound in after:
        expected += closed(close_step(book, auctions, bids, a_bound, b_bound))
        for w, s in enumerate(split):
            got += closed(close_step(s, routed(auctions, "id", routing, w),
                                     routed(bids, "auction", routing, w), a_bound, b_bound))
    expected += closed(close_step(book, auctions.slice(0, 0), bids.slice(0, 0), None, None))
    for s in split:
        got += closed(close_step(s, auctions.slice(0, 0), bids.slice(0, 0), None, None))
    assert len(expected) > 100
    assert sorted(got) == sorted(expected)


def winner_groups(events: dict[str, pa.RecordBatch]) -> list[tuple[int, list[tuple[int, pa.RecordBatch]]]]:
    """Per ``Q4Close`` step: its bid bound and its winners grouped by closing time, as the
    stage-1 output messages ``(expires, RecordBatch(category, price))``."""
    book = q4.AuctionBook()
    out = []
    for step in q4_steps(events):
        expires, category, price = close_step(book, *step)
        groups = []
        for t in sorted(set(expires.tolist())):
            pick = expires == t
            groups.append((t, pa.RecordBatch.from_arrays(
                [pa.array(category[pick]), pa.array(price[pick])], schema=q4.WINNER_SCHEMA)))
        out.append((step[3], groups))
    return out


def average_step(state: q4.CategoryAverages, groups: list[tuple[int, pa.RecordBatch]],
                 bound: int | None) -> list[dict[str, Any]]:
    """One invocation of ``Q4Average``: hold the winners, advance to ``bound``."""
    for t, batch in groups:
        if batch.num_rows:
            state.add(t, batch)
    return state.advance(bound).to_pylist()


def routed_groups(groups: list[tuple[int, pa.RecordBatch]], routing: RoutingTable,
                  worker: int) -> list[tuple[int, pa.RecordBatch]]:
    out = []
    for t, batch in groups:
        mine = routed(pa.Table.from_batches([batch]), "category", routing, worker)
        if mine.num_rows:
            out.append((t, mine.combine_chunks().to_batches()[0]))
    return out


@pytest.mark.parametrize("workers", WORKERS)
def test_q4_category_averages_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    before, after = half(winner_groups(events))
    lag = 3 * CHUNK_MS  # the frontier trails the closing times: winners wait at the snapshot
    (state,) = originals(q4.CategoryAverages)
    for bound, groups in before:
        average_step(state, groups, bound - lag)
    assert state.pending and state.sums
    parts = exported(state)
    routing, split = restore(q4.CategoryAverages, parts, workers)

    pending = state.rows()[1][0]
    for w, s in enumerate(split):
        totals, held = (t for t, _ in s.rows())
        assert_on_owner(totals, "category", routing, w)  # (a)
        assert_on_owner(held, "category", routing, w)
    # (b) the same totals and pending winners; the least pending time is the original's
    sums: dict[int, int] = {}
    counts: dict[int, int] = {}
    for s in split:
        assert not set(sums) & set(s.sums)
        sums.update(s.sums)
        counts.update(s.counts)
    assert sums == state.sums and counts == state.counts
    held = pa.concat_tables([s.rows()[1][0] for s in split])
    assert multiset(held.to_pylist()) == multiset(pending.to_pylist())
    assert min(t for s in split for t in s.pending_times()) == state.pending_times()[0]
    assert {t for s in split for t, _ in s.pending} == {t for t, _ in state.pending}
    # (c) the same running averages, at the same times
    expected: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    for bound, groups in [*after, (None, [])]:
        b = None if bound is None else bound - lag
        expected += average_step(state, groups, b)
        for w, s in enumerate(split):
            got += average_step(s, routed_groups(groups, routing, w), b)
    assert len(expected) > 50
    assert multiset(got) == multiset(expected)


# -- q5: WindowCounts, and the global maximum -------------------------------------------------


def partials(bids: pa.Table) -> pa.Table:
    """``Q5PreCount``'s output for ``bids``: ``PARTIAL_SCHEMA`` rows."""
    start, auction, count = q5.partial_counts(int_column(bids, "auction"),
                                              int_column(bids, "dateTime"))
    return pa.table([start, auction, count], schema=q5.PARTIAL_SCHEMA)


def count_step(state: q5.WindowCounts, rows: pa.Table, bound: int | None) -> list[pa.RecordBatch]:
    """One invocation of ``Q5Count``."""
    if rows.num_rows:
        state.add(int_column(rows, "window_start"), int_column(rows, "auction"),
                  int_column(rows, "count"))
    return state.retire(bound)


def window_winners(batches: list[pa.RecordBatch], value: str) -> Counter[tuple[Any, ...]]:
    """The rows with their window's maximum ``value`` over every worker's candidates."""
    if not batches:
        return Counter()
    table = pa.Table.from_batches(batches)
    best = table.group_by("window_end").aggregate([(value, "max")])
    joined = table.join(best, "window_end")
    return multiset(joined.filter(pc.equal(joined.column(value), joined.column(f"{value}_max")))
                    .drop_columns([f"{value}_max"]).to_pylist())


@pytest.mark.parametrize("workers", WORKERS)
def test_q5_window_counts_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    before, after = half(steps(events))
    (state,) = originals(q5.WindowCounts)
    done: list[pa.RecordBatch] = []
    for end, rows in before:  # the bid frontier trails the chunks by one
        done += count_step(state, partials(rows["bid"]), end - CHUNK_MS)
    assert len(state.pending_times()) >= 2 and done
    parts = exported(state)
    routing, split = restore(q5.WindowCounts, parts, workers)

    def totals(s: q5.WindowCounts) -> dict[tuple[int, int], int]:
        table = s.rows()[0][0]
        return dict(zip(zip(int_column(table, "window_end").tolist(),
                            int_column(table, "auction").tolist(), strict=True),
                        int_column(table, "count").tolist(), strict=True))

    merged: dict[tuple[int, int], int] = {}
    for w, s in enumerate(split):
        assert_on_owner(s.rows()[0][0], "auction", routing, w)  # (a)
        mine = totals(s)
        assert not set(mine) & set(merged)
        merged.update(mine)
    assert merged == totals(state)  # (b) the same counts per window and auction
    assert sorted({t for s in split for t in s.pending_times()}) == state.pending_times()
    # (c) the same winners per window once every worker's candidates meet
    expected: list[pa.RecordBatch] = []
    got: list[pa.RecordBatch] = []
    for end, rows in [*after, (None, None)]:
        table = partials(rows["bid"]) if rows is not None else q5.PARTIAL_SCHEMA.empty_table()
        bound = None if end is None else end - CHUNK_MS
        expected += count_step(state, table, bound)
        for w, s in enumerate(split):
            got += count_step(s, routed(table, "auction", routing, w), bound)
    assert len(expected) >= 4  # windows retired after the snapshot
    assert window_winners(got, "count") == window_winners(expected, "count")


def max_step(state: WindowMaxState, rows: pa.Table, bound: int | None,
             inclusive: bool) -> list[pa.RecordBatch]:
    """One invocation of ``window_max``: add the rows, retire what ``bound`` has passed."""
    state.add(rows)
    return [table.combine_chunks().to_batches()[0]
            for _, table in state.retire(bound, inclusive) if table.num_rows]


def max_rows(state: WindowMaxState) -> Counter[tuple[Any, ...]]:
    return multiset(state.rows()[0][0].to_pylist())


def window_maxima(state: WindowMaxState) -> dict[int, int]:
    return {end: best for end, (best, _) in state.windows.items()}


@pytest.mark.parametrize("workers", WORKERS)
def test_q5_global_max_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    """``Q5GlobalMax``: candidates keyed by ``window_start``; it trails ``Q5Count`` by a
    chunk, so windows are open at the snapshot."""
    counts = q5.WindowCounts()
    feed = []
    for end, rows in steps(events):
        candidates = count_step(counts, partials(rows["bid"]), end)
        feed.append((end, pa.Table.from_batches(candidates, schema=q5.SCHEMA)))
    before, after = half(feed)

    def make() -> WindowMaxState:
        return WindowMaxState("count", q5.SCHEMA, key="window_start")

    (state,) = originals(make)
    for end, table in before:
        max_step(state, table, end - 2 * CHUNK_MS, inclusive=True)
    assert state.pending_times()
    parts = exported(state)
    routing, split = restore(make, parts, workers)
    for w, s in enumerate(split):
        assert_on_owner(s.rows()[0][0], "window_start", routing, w)  # (a)
    union: Counter[tuple[Any, ...]] = Counter()
    for s in split:
        union += max_rows(s)
    assert union == max_rows(state)  # (b)
    assert sorted(t for s in split for t in s.pending_times()) == state.pending_times()
    expected: list[pa.RecordBatch] = []
    got: list[pa.RecordBatch] = []
    for end, table in [*after, (None, q5.SCHEMA.empty_table())]:
        bound = None if end is None else end - 2 * CHUNK_MS
        expected += max_step(state, table, bound, inclusive=True)
        for w, s in enumerate(split):
            got += max_step(s, routed(table, "window_start", routing, w), bound, inclusive=True)
    assert expected
    assert multiset(pa.Table.from_batches(got).to_pylist()) == \
        multiset(pa.Table.from_batches(expected).to_pylist())  # (c)


# -- q7: WindowMaxState, worker-local and keyed ----------------------------------------------


@pytest.mark.parametrize("workers", WORKERS)
def test_q7_local_max_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    """``Q7LocalMax`` is pipelined: each old worker's windows are exported under its home bin
    and land whole on that bin's new owner, where the local maxima of several old workers
    merge; the global maximum of every window is unchanged."""
    before, after = half(steps(events))

    def make() -> WindowMaxState:
        return WindowMaxState("price", q7.SCHEMA)

    old = originals(make, 2)
    for end, rows in before:
        table = q7.with_windows(rows["bid"])
        for j, s in enumerate(old):
            max_step(s, dealt(table, 2, j), end - CHUNK_MS, inclusive=False)
    assert all(s.pending_times() for s in old)
    parts = exported(*old)
    assert sorted(parts) == [int(OLD.owned_by(w)[0]) for w in range(2)]  # the home bins
    routing, split = restore(make, parts, workers)

    def joint(states: list[WindowMaxState]) -> tuple[dict[int, int], Counter[tuple[Any, ...]]]:
        best: dict[int, int] = {}
        for s in states:
            for end, value in window_maxima(s).items():
                best[end] = max(best.get(end, value), value)
        rows: Counter[tuple[Any, ...]] = Counter()
        for s in states:
            for end, (value, tables) in s.windows.items():
                if value == best[end]:
                    rows += multiset(pa.concat_tables(tables).to_pylist())
        return best, rows

    # (a) each old worker's windows are on the owner of its home bin, and only there: a new
    # worker holds the joint maxima of the old workers whose home bins it owns, or nothing
    homes = {int(OLD.owned_by(w)[0]): s for w, s in enumerate(old)}
    for w, s in enumerate(split):
        mine = [o for b, o in homes.items() if routing.owner(b) == w]
        assert joint([s]) == joint(mine)
        assert bool(s.windows) == bool(mine)
    # (b) per window, the joint maximum and its rows are the old workers'; the pending times
    # are the union of theirs
    assert joint(split) == joint(old)
    assert sorted({t for s in split for t in s.pending_times()}) == \
        sorted({t for s in old for t in s.pending_times()})
    if workers == 2:  # nothing merged: each new worker holds exactly an old one's windows
        assert [max_rows(s) for s in split] == [max_rows(s) for s in old]
    # (c) the same global maxima once the rest of the bids (dealt round-robin) are in
    expected: list[pa.RecordBatch] = []
    got: list[pa.RecordBatch] = []
    for end, rows in [*after, (None, None)]:
        table = q7.with_windows(rows["bid"]) if rows is not None else q7.SCHEMA.empty_table()
        bound = None if end is None else end - CHUNK_MS
        for j, s in enumerate(old):
            expected += max_step(s, dealt(table, 2, j), bound, False)
        for j, s in enumerate(split):
            got += max_step(s, dealt(table, workers, j), bound, False)
    assert len({b.column("window_end")[0].as_py() for b in expected}) >= 2
    assert window_winners(got, "price") == window_winners(expected, "price")


@pytest.mark.parametrize("workers", WORKERS)
def test_q7_global_max_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    """``Q7GlobalMax``: rows keyed by ``window_start``, the column it is exchanged by."""
    before, after = half(steps(events))

    def make() -> WindowMaxState:
        return WindowMaxState("price", q7.SCHEMA, key="window_start")

    (state,) = originals(make)
    for end, rows in before:
        max_step(state, q7.with_windows(rows["bid"]), end - CHUNK_MS, inclusive=True)
    assert state.pending_times()
    parts = exported(state)
    routing, split = restore(make, parts, workers)
    union: Counter[tuple[Any, ...]] = Counter()
    for w, s in enumerate(split):
        assert_on_owner(s.rows()[0][0], "window_start", routing, w)  # (a)
        union += max_rows(s)
    assert union == max_rows(state)  # (b)
    assert sorted(t for s in split for t in s.pending_times()) == state.pending_times()
    expected: list[pa.RecordBatch] = []
    got: list[pa.RecordBatch] = []
    for end, rows in [*after, (None, None)]:
        table = q7.with_windows(rows["bid"]) if rows is not None else q7.SCHEMA.empty_table()
        bound = None if end is None else end - CHUNK_MS
        expected += max_step(state, table, bound, inclusive=True)
        for w, s in enumerate(split):
            got += max_step(s, routed(table, "window_start", routing, w), bound, inclusive=True)
    assert len(expected) >= 2
    assert multiset(pa.Table.from_batches(got).to_pylist()) == \
        multiset(pa.Table.from_batches(expected).to_pylist())  # (c)


# -- q8: WindowState ---------------------------------------------------------------------------


def q8_step(state: q8.WindowState, persons: pa.Table, auctions: pa.Table,
            bound: int | None, ends: set[int]) -> list[dict[str, Any]]:
    """One invocation of ``Q8Join``: persons, then auctions, to their windows; then the
    windows both frontiers (``bound``) have passed close, in order (``ends``: the open window
    ends, the operator's tokens)."""
    if persons.num_rows:
        unique, rows = state.windows(int_column(persons, "dateTime"))
        people = persons.select(q8.PERSON_SCHEMA.names).cast(q8.PERSON_SCHEMA)
        for end, index in zip(unique.tolist(), rows, strict=True):
            ends.add(end)
            state.add_persons(end, people.take(pa.array(index)).combine_chunks().to_batches()[0])
    if auctions.num_rows:
        unique, rows = state.windows(int_column(auctions, "dateTime"))
        sellers = int_column(auctions, "seller")
        for end, index in zip(unique.tolist(), rows, strict=True):
            ends.add(end)
            state.add_sellers(end, sellers[index])
    out: list[dict[str, Any]] = []
    for end in sorted(e for e in ends if bound is None or e <= bound):
        ends.discard(end)
        out += state.close(end).to_pylist()
    return out


def q8_tables(state: q8.WindowState) -> tuple[pa.Table, pa.Table]:
    persons, sellers = (t for t, _ in state.rows())
    return persons, sellers


@pytest.mark.parametrize("workers", WORKERS)
def test_q8_window_state_round_trip(events: dict[str, pa.RecordBatch], workers: int) -> None:
    before, after = half(steps(events))
    (state,) = originals(q8.WindowState)
    ends: set[int] = set()
    for end, rows in before:
        q8_step(state, rows["person"], rows["auction"], end - CHUNK_MS, ends)
    assert state.pending_times() == sorted(ends) and len(ends) >= 1
    persons, sellers = q8_tables(state)
    assert persons.num_rows and sellers.num_rows
    parts = exported(state)
    routing, split = restore(q8.WindowState, parts, workers)
    for w, s in enumerate(split):
        p, a = q8_tables(s)
        assert_on_owner(p, "id", routing, w)  # (a)
        assert_on_owner(a, "seller", routing, w)
    # (b) the same persons and sellers per window; the union of pending times is the original's
    assert multiset(pa.concat_tables([q8_tables(s)[0] for s in split]).to_pylist()) == \
        multiset(persons.to_pylist())
    assert multiset(pa.concat_tables([q8_tables(s)[1] for s in split]).to_pylist()) == \
        multiset(sellers.to_pylist())
    assert sorted({t for s in split for t in s.pending_times()}) == state.pending_times()
    # (c) the same (window, person) rows
    split_ends = [set(s.pending_times()) for s in split]
    expected: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    for end, rows in [*after, (None, None)]:
        if rows is None:
            person_rows = events["person"].slice(0, 0)
            auction_rows = events["auction"].slice(0, 0)
            p_table, a_table = pa.Table.from_batches([person_rows]), \
                pa.Table.from_batches([auction_rows])
        else:
            p_table, a_table = rows["person"], rows["auction"]
        bound = None if end is None else end - CHUNK_MS
        expected += q8_step(state, p_table, a_table, bound, ends)
        for w, s in enumerate(split):
            got += q8_step(s, routed(p_table, "id", routing, w),
                           routed(a_table, "seller", routing, w), bound, split_ends[w])
    assert len(expected) > 5
    assert multiset(got) == multiset(expected)


def test_states_attach_without_a_job() -> None:
    """A state used outside a job (``bins`` never attached) exports everything to bin 0."""
    book = q4.AuctionBook()
    book.add_auctions(pa.table({"id": [3, 1], "category": [10, 11], "reserve": [1, 1],
                                "dateTime": [0, 0], "expires": [5, 9]}))
    parts = book.export()
    assert list(parts) == [0]
    copy = q4.AuctionBook()
    copy.load(parts)
    assert copy.open["id"].tolist() == [1, 3] and copy.pending_times() == [5]


def test_discard_keeps_the_other_bins(events: dict[str, pa.RecordBatch]) -> None:
    """``discard`` forgets exactly the rows of the given bins (after they moved away)."""
    (state,) = originals(q8.WindowState)
    ends: set[int] = set()
    for end, rows in steps(events)[:3]:
        q8_step(state, rows["person"], rows["auction"], end - 3 * CHUNK_MS, ends)
    parts = state.export()
    gone = sorted(parts)[: len(parts) // 2]
    state.discard(gone)
    assert sorted(state.export()) == sorted(set(parts) - set(gone))

