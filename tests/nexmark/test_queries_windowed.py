"""NEXMark q4, q5, q7 (token-held state, windows retired when the frontier passes) against Spark SQL.

* 100,000 events at 1,000 events/s (100 s of event time: 21 sliding and 10 tumbling windows,
  ~6,000 auctions), ``nexmark_source`` at 1 ms granularity (about one bid per logical time),
  thread runtime: q4 and q5 on 2 workers, q7 on 1 and 2 workers.  Expected values come from
  the modules' ``SPARK_SQL`` run by Spark (``local[4]``) over temp views of the same events:
  q5/q7 rows equal as multisets, q4's last running average per category equals Spark's final
  average, and q4's whole running sequence equals one computed from Spark's winning bids.
* Operator semantics on hand-fed inputs: an auction closes exactly when the bid frontier
  reaches ``expires`` (not before), early bids wait for their auction, a window is emitted only
  once the frontier has passed its end.
* The state objects: matching rules, buffering and pruning, running sums, snapshot/restore.

Source: docs/NEXMARK.md ("Queries"); the timestamp-tokens paper §5–§7.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenflow import execute
from tokenflow.nexmark import AUCTION_SCHEMA, BID_SCHEMA, GeneratorConfig, generate, nexmark_source
from tokenflow.nexmark.queries import q4, q5, q7
from tokenflow.nexmark.queries._windows import WindowMaxState
from tokenflow.spark.io import collect

pytestmark = pytest.mark.timeout(300)

EVENTS = 100_000
RATE = 1_000
CONFIG = GeneratorConfig(rate=RATE)


# -- harness ------------------------------------------------------------------------------------


def run_dataflow(module: ModuleType, workers: int, granularity_ms: int = 1,
                 events: int = EVENTS) -> tuple[pd.DataFrame, list[tuple[int, pa.RecordBatch]]]:
    """Run ``module.build`` over ``nexmark_source`` on the thread runtime; return the output rows
    (columns ``module.COLUMNS``) and every output message ``(time, batch)``."""

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            streams = nexmark_source(scope, events, CONFIG, batch=10_000,
                                     granularity_ms=granularity_ms)
            return collect(module.build(streams, CONFIG))

        return worker.dataflow(build)

    captures = execute(job, workers=workers)
    messages = [m for c in captures for m in c.events]
    for _, batch in messages:
        assert batch.schema.names == module.COLUMNS
    table = pa.Table.from_batches([b for _, b in messages], schema=module.SCHEMA)
    return table.to_pandas(), messages


def canonical(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return frame.loc[:, columns].sort_values(columns, kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def events() -> dict[str, pa.RecordBatch]:
    return generate(0, EVENTS, CONFIG)


@pytest.fixture(scope="module")
def spark_sql(spark: Any, events: dict[str, pa.RecordBatch]) -> Callable[[str], pd.DataFrame]:
    """Run a query over temp views ``auction`` and ``bid`` of the same events (the columns the
    queries read), registered just before each query (other modules may drop them)."""
    frames = {
        "auction": spark.createDataFrame(
            events["auction"].select(["id", "category", "reserve", "dateTime", "expires"]).to_pandas()),
        "bid": spark.createDataFrame(
            events["bid"].select(["auction", "bidder", "price", "dateTime"]).to_pandas()),
    }

    def run(sql: str) -> pd.DataFrame:
        for name, frame in frames.items():
            frame.createOrReplaceTempView(name)
        return spark.sql(sql).toPandas()

    return run


# -- q4 -----------------------------------------------------------------------------------------


def expected_running_average(winners: pd.DataFrame) -> pd.DataFrame:
    """Running average per category over winning prices in ``expires`` order, one row per
    (category, expires) — the dataflow's documented output — from Spark's winners."""
    w = winners.sort_values(["category", "expires", "id"], kind="stable").copy()
    w["sum"] = w.groupby("category")["price"].cumsum()
    w["n"] = w.groupby("category").cumcount() + 1
    w["avg_price"] = w["sum"].astype("float64") / w["n"].astype("float64")
    last = w.groupby(["category", "expires"]).tail(1).rename(columns={"expires": "time"})
    return canonical(last, q4.COLUMNS)


@pytest.mark.spark
def test_q4_running_average_matches_spark(spark_sql: Callable[[str], pd.DataFrame]) -> None:
    rows, messages = run_dataflow(q4, workers=2, granularity_ms=1)
    final = spark_sql(q4.SPARK_SQL)
    winners = spark_sql(q4.WINNERS_SQL)
    assert list(final.columns) == q4.COLUMNS
    assert sorted(final["category"]) == [10, 11, 12, 13, 14]
    assert len(winners) > 2_000  # most of the ~6,000 auctions get a qualifying bid

    q4.compare(rows, final)  # the last running average per category is Spark's final one
    running = expected_running_average(winners)
    pd.testing.assert_frame_equal(canonical(rows, q4.COLUMNS), running, check_exact=True)

    # Every row is sent at its logical time (the closing time), one row per category and time.
    for time, batch in messages:
        assert set(batch.column("time").to_pylist()) == {time}
    assert not rows.duplicated(["category", "time"]).any()
    assert len(rows) > 10 * len(final)


def test_q4_compare_reports_a_difference() -> None:
    ours = pd.DataFrame({"category": [10, 10, 11], "avg_price": [5.0, 7.5, 3.0],
                         "time": [100, 200, 150]})
    spark = pd.DataFrame({"category": [10, 11], "avg_price": [7.5, 3.0], "time": [200, 150]})
    q4.compare(ours, spark)  # the last row of category 10 is (7.5, 200)
    with pytest.raises(AssertionError, match="1 of 2 categories differ"):
        q4.compare(ours, spark.assign(avg_price=[7.5, 3.25]))
    with pytest.raises(AssertionError, match="categories differ"):
        q4.compare(ours.iloc[:2], spark)


# -- q5 -----------------------------------------------------------------------------------------


@pytest.mark.spark
def test_q5_hot_items_match_spark(spark_sql: Callable[[str], pd.DataFrame]) -> None:
    from tokenflow.nexmark.queries import compare

    rows, messages = run_dataflow(q5, workers=2, granularity_ms=1)
    expected = spark_sql(q5.SPARK_SQL)
    assert list(expected.columns) == q5.COLUMNS
    compare("q5", rows, expected)
    pd.testing.assert_frame_equal(canonical(rows, q5.COLUMNS), canonical(expected, q5.COLUMNS))

    # 100 s of bids: windows starting every 5 s from 5 s before the first bid; all 10 s long.
    starts = sorted(set(rows["window_start"]))
    assert len(starts) == 21
    assert all(s % q5.SLIDE_MS == 0 for s in starts)
    assert (rows["window_end"] - rows["window_start"] == q5.SIZE_MS).all()
    assert rows.groupby("window_start").size().max() > 1  # ties are all kept
    for time, batch in messages:  # a window's rows are sent at its end
        assert set(batch.column("window_end").to_pylist()) == {time}


# -- q7 -----------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize(("workers", "granularity_ms"), [(1, 1000), (2, 1)])
def test_q7_highest_bid_matches_spark(spark_sql: Callable[[str], pd.DataFrame], workers: int,
                                      granularity_ms: int) -> None:
    from tokenflow.nexmark.queries import compare

    rows, messages = run_dataflow(q7, workers=workers, granularity_ms=granularity_ms)
    expected = spark_sql(q7.SPARK_SQL)
    assert list(expected.columns) == q7.COLUMNS
    compare("q7", rows, expected)
    pd.testing.assert_frame_equal(canonical(rows, q7.COLUMNS), canonical(expected, q7.COLUMNS))
    assert rows["window_start"].nunique() == 10
    assert ((rows["dateTime"] >= rows["window_start"]) & (rows["dateTime"] < rows["window_end"])).all()
    for time, batch in messages:
        assert set(batch.column("window_end").to_pylist()) == {time}


# -- operators on hand-fed inputs ---------------------------------------------------------------


def auction_batch(ident: int, category: int, reserve: int, date: int, expires: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{
        "id": ident, "itemName": "item", "description": "d", "initialBid": 1, "reserve": reserve,
        "dateTime": date, "expires": expires, "seller": 1000, "category": category, "extra": ""}],
        schema=AUCTION_SCHEMA)


def bid_batch(rows: list[tuple[int, int, int]]) -> pa.RecordBatch:
    """Bids ``(auction, price, dateTime)``."""
    return pa.RecordBatch.from_pylist(
        [{"auction": a, "bidder": 1001, "price": p, "dateTime": d, "extra": ""} for a, p, d in rows],
        schema=BID_SCHEMA)


def captured_past(capture: Any, time: int) -> bool:
    """True once the captured stream's frontier is past ``time`` (all its data has arrived)."""
    if not capture.frontiers:
        return False
    frontier = capture.frontiers[-1]
    return not frontier or min(frontier) > time


def test_q4_closes_when_the_bid_frontier_reaches_expires() -> None:
    def job(worker: Any) -> list[Any]:
        def build(scope: Any) -> Any:
            a_in, auctions = scope.new_input("auction")
            b_in, bids = scope.new_input("bid")
            out = q4.build({"auction": auctions, "bid": bids}, None)
            return a_in, b_in, collect(out)

        a_in, b_in, capture = worker.dataflow(build)
        seen = []

        def advance(t: int) -> None:
            a_in.advance_to(t)
            b_in.advance_to(t)
            worker.step_while(lambda: not captured_past(capture, t - 1))
            seen.append((t, [(time, b.to_pylist()) for time, b in capture.events]))

        # auction 1: category 10, reserve 100, open [0, 50)
        a_in.send_batch(auction_batch(1, 10, 100, 0, 50))
        b_in.send_batch(bid_batch([(1, 150, 0), (1, 99, 0)]))  # 99 is below the reserve
        advance(10)
        # a bid for auction 2 arrives before the auction itself (same ms, other input first)
        b_in.advance_to(20)
        b_in.send_batch(bid_batch([(2, 400, 20), (1, 120, 20)]))
        worker.step()
        a_in.advance_to(20)
        a_in.send_batch(auction_batch(2, 10, 300, 20, 60))
        # auction 1's best: 150, then 10_000 at 49; a bid at 50 == its expires is too late
        advance(49)
        b_in.send_batch(bid_batch([(1, 10_000, 49)]))
        advance(50)
        b_in.send_batch(bid_batch([(1, 20_000, 50), (2, 500, 50)]))
        advance(51)  # auction 1 closed at 50 with 10_000
        advance(61)  # auction 2 closed at 60 with 500
        a_in.close()
        b_in.close()
        worker.step_while(lambda: not captured_past(capture, 10**15))
        return seen

    seen = execute(job, workers=1)[0]
    by_step = dict(seen)
    assert by_step[10] == [] and by_step[49] == [] and by_step[50] == []
    assert by_step[51] == [(50, [{"category": 10, "avg_price": 10_000.0, "time": 50}])]
    assert by_step[61][-1] == (60, [{"category": 10, "avg_price": (10_000 + 500) / 2, "time": 60}])


def test_q7_window_is_emitted_once_the_frontier_passes_its_end() -> None:
    def job(worker: Any) -> list[Any]:
        def build(scope: Any) -> Any:
            b_in, bids = scope.new_input("bid")
            return b_in, collect(q7.build({"bid": bids}, None))

        b_in, capture = worker.dataflow(build)
        seen = []
        b_in.send_batch(bid_batch([(1, 5, 0), (2, 9, 0), (3, 9, 0)]))
        for t in (9_000, 9_999, 10_000, 10_001):
            b_in.advance_to(t)
            if t == 9_999:
                b_in.send_batch(bid_batch([(4, 9, 9_999), (5, 100, 10_000)]))
            worker.step_while(lambda t=t: not captured_past(capture, t - 1))
            seen.append(len(capture.events))
        b_in.close()
        worker.step_while(lambda: not captured_past(capture, 10**15))
        return [seen, [(time, b.to_pylist()) for time, b in capture.events]]

    counts, events = execute(job, workers=1)[0]
    assert counts == [0, 0, 0, 1]  # window [0, 10000) retired once the frontier passed 10000
    assert events[0][0] == 10_000
    assert sorted((r["auction"], r["price"]) for r in events[0][1]) == [(2, 9), (3, 9), (4, 9)]
    assert events[1][0] == 20_000 and [r["auction"] for r in events[1][1]] == [5]


# -- state objects ------------------------------------------------------------------------------


def test_auction_book_matching_rules_buffering_and_snapshot() -> None:
    book = q4.AuctionBook()
    book.add_auctions(pa.Table.from_batches([auction_batch(7, 12, 100, 1_000, 2_000)]))
    auction = np.array([7, 7, 7, 7, 7, 8, 9, 10], dtype=np.int64)
    price = np.array([100, 5_000, 9_000, 99, 300, 700, 800, 900], dtype=np.int64)
    date = np.array([1_000, 999, 2_000, 1_999, 1_500, 1_200, 900, 1_000], dtype=np.int64)
    book.add_bids(auction, price, date)  # qualifying for 7: 100 (at start), 99 no, 300
    assert book.open["best"].tolist() == [300]
    assert book.waiting["auction"].tolist() == [8, 9, 10]  # auctions not seen yet

    snap = book.snapshot()
    copy = q4.AuctionBook()
    copy.restore(snap)
    book.add_bids(np.array([7]), np.array([400]), np.array([1_600]))  # in place: not in snap
    # auction frontier 1000: no auction with dateTime < 1000 can arrive, so the bid at 900
    # goes; one at 1000 may still meet an auction of dateTime 1000
    book.prune_waiting(1_000)
    assert book.waiting["auction"].tolist() == [8, 10]
    book.add_auctions(pa.Table.from_batches([auction_batch(8, 10, 500, 1_100, 1_800)]))
    book.match_waiting()
    assert book.waiting["auction"].tolist() == [10]
    book.prune_waiting(None)  # the auctions ended
    assert book.waiting["auction"].tolist() == []
    assert book.pending_times() == [1_800]
    assert [a.tolist() for a in book.close(1_799)] == [[], [], []]
    assert [a.tolist() for a in book.close(2_000)] == [[1_800, 2_000], [10, 12], [700, 400]]
    assert book.least_expires() is None

    assert copy.open["best"].tolist() == [300]  # the snapshot did not follow later changes
    assert copy.waiting["auction"].tolist() == [8, 9, 10]
    copy.add_bids(np.array([7]), np.array([350]), np.array([1_700]))  # restored state is writable
    assert [a.tolist() for a in copy.close(None)] == [[2_000], [12], [350]]


def test_category_averages_fold_in_time_order_and_snapshot() -> None:
    state = q4.CategoryAverages()

    def winners(rows: list[tuple[int, int]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([{"category": c, "price": p} for c, p in rows],
                                          schema=q4.WINNER_SCHEMA)

    state.add(30, winners([(10, 300)]))
    state.add(10, winners([(10, 100), (11, 50)]))
    state.add(10, winners([(10, 200)]))
    state.add(40, winners([(11, 70)]))
    assert state.pending_times() == [10]
    out = state.advance(31).to_pylist()
    assert out == [{"category": 10, "avg_price": 150.0, "time": 10},
                   {"category": 11, "avg_price": 50.0, "time": 10},
                   {"category": 10, "avg_price": 200.0, "time": 30}]
    assert state.pending_times() == [40]
    snap = state.snapshot()
    assert state.advance(None).to_pylist() == [{"category": 11, "avg_price": 60.0, "time": 40}]
    restored = q4.CategoryAverages()
    restored.restore(snap)
    assert restored.advance(None).to_pylist() == [{"category": 11, "avg_price": 60.0, "time": 40}]
    assert restored.sums == {10: 600, 11: 120} and restored.counts == {10: 3, 11: 2}


def test_category_averages_take_a_timed_batch_as_one_pending_entry_per_time() -> None:
    """Stage 1 sends one batch of many closing times (``PENDING_SCHEMA``); held with
    ``add_timed``, it folds in as the same rows held with ``add`` per time would, even when
    an exchange left its rows out of time order."""
    rows = [(10, 300, 30), (10, 100, 10), (11, 50, 10), (10, 200, 10), (11, 70, 40)]
    timed = q4.CategoryAverages()
    timed.add_timed(pa.RecordBatch.from_pylist(
        [{"category": c, "price": p, "time": t} for c, p, t in rows],
        schema=q4.PENDING_SCHEMA))
    by_time = q4.CategoryAverages()
    for t in sorted({t for _, _, t in rows}):
        by_time.add(t, pa.RecordBatch.from_pylist(
            [{"category": c, "price": p} for c, p, u in rows if u == t], schema=q4.WINNER_SCHEMA))
    assert [t for t, _ in timed.pending] == [10, 30, 40]
    assert timed.pending_times() == by_time.pending_times() == [10]
    assert timed.advance(31).to_pylist() == by_time.advance(31).to_pylist()
    assert timed.advance(None).to_pylist() == by_time.advance(None).to_pylist()
    assert timed.sums == by_time.sums == {10: 600, 11: 120}


@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), st.integers(-(10**7), 10**7)),
                max_size=60),
       st.sampled_from([(10_000, 5_000), (10_000, 2_000), (3, 1), (5, 5)]),
       st.sampled_from([0, 2**61]))
def test_q5_partial_counts_equal_counting_every_window_of_every_bid(
        bids: list[tuple[int, int]], window: tuple[int, int], far: int) -> None:
    """Against a ``Counter`` over each bid's windows (starts ``s`` with ``s % slide == 0`` and
    ``s <= date < s + size``); ``far`` spreads the auction ids past what one int64 sort key
    holds, so the lexsort path runs too."""
    size, slide = window
    auction = np.array([a + (far if i % 2 else 0) for i, (a, _) in enumerate(bids)],
                       dtype=np.int64)
    date = np.array([d for _, d in bids], dtype=np.int64)
    expected: Counter[tuple[int, int]] = Counter()
    for a, d in zip(auction.tolist(), date.tolist(), strict=True):
        last = d - d % slide
        for start in range(last - size + slide, last + 1, slide):
            expected[(start, a)] += 1
    start, auc, count = q5.partial_counts(auction, date, size, slide)
    got = list(zip(start.tolist(), auc.tolist(), count.tolist(), strict=True))
    assert got == sorted((s, a, c) for (s, a), c in expected.items())


def test_q5_partial_counts_and_window_counts() -> None:
    auction = np.array([1, 2, 1, 1, 3], dtype=np.int64)
    date = np.array([4_999, 5_000, 5_001, 12_000, 14_999], dtype=np.int64)
    start, auc, count = q5.partial_counts(auction, date)
    got = sorted(zip(start.tolist(), auc.tolist(), count.tolist(), strict=True))
    assert got == [(-5_000, 1, 1), (0, 1, 2), (0, 2, 1), (5_000, 1, 2), (5_000, 2, 1),
                   (5_000, 3, 1), (10_000, 1, 1), (10_000, 3, 1)]
    state = q5.WindowCounts()
    state.add(start, auc, count)
    state.add(np.array([0], dtype=np.int64), np.array([2], dtype=np.int64),
              np.array([1], dtype=np.int64))  # auction 2 ties auction 1 in [0, 10000)
    restored = q5.WindowCounts()
    restored.restore(state.snapshot())
    assert state.pending_times() == restored.pending_times() == [5_000, 10_000, 15_000, 20_000]
    for s in (state, restored):
        out = [b.to_pylist() for b in s.retire(10_000)]
        assert out == [
            [{"window_start": -5_000, "window_end": 5_000, "auction": 1, "count": 1}],
            [{"window_start": 0, "window_end": 10_000, "auction": 1, "count": 2},
             {"window_start": 0, "window_end": 10_000, "auction": 2, "count": 2}],
        ]
        assert s.pending_times() == [15_000, 20_000]
    with pytest.raises(ValueError, match="slide dividing size"):
        q5.WindowCounts(10_000, 3_000)


def test_window_max_state_keeps_ties_and_replaces_on_larger() -> None:
    state = WindowMaxState("price", q7.SCHEMA)
    bids = pa.table({"auction": [1, 2, 3, 4], "bidder": [9, 9, 9, 9], "price": [5, 8, 8, 7],
                     "dateTime": [0, 1, 10_001, 2]})
    state.add(q7.with_windows(bids))
    snap = state.snapshot()
    state.add(q7.with_windows(pa.table({"auction": [5], "bidder": [9], "price": [8],
                                        "dateTime": [3]})))
    state.add(q7.with_windows(pa.table({"auction": [6], "bidder": [9], "price": [6],
                                        "dateTime": [10_002]})))
    assert state.retire(9_999, inclusive=False) == []
    done = state.retire(10_000, inclusive=False)
    assert [(end, sorted(t.column("auction").to_pylist())) for end, t in done] == [(10_000, [2, 5])]
    assert state.retire(20_000, inclusive=True) == []  # inclusive: needs the frontier > end
    assert [end for end, _ in state.retire(20_001, inclusive=True)] == [20_000]
    restored = WindowMaxState("price", q7.SCHEMA)
    restored.restore(snap)
    assert [(end, t.column("auction").to_pylist()) for end, t in restored.retire(None, True)] == \
        [(10_000, [2]), (20_000, [3])]
