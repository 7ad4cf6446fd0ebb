"""NEXMark q4, q5 and q8 with migrating state: rosters changing 2 -> 3 -> 4 -> 3 -> 2 at random
points of the input give exactly the output of a run that never rescales (the ordinary,
non-migrating build on the thread runtime), on the thread, process and Spark runtimes; and
what each change moved is measured and bounded.

The reference runs build the queries without ``tokenflow.rescale`` (plain ``Exchange``
pacts), so agreement is with independent code; they are themselves checked against Spark SQL
by tests/nexmark.  Moves are asked for by worker 0 once its sources have sent a random epoch
(``run_query(rescale_at=...)``), so they happen while the state is held, at logical times
the controller picks ahead of the data.

Bounds (issue 16's acceptance, on ``measure=True`` runs, over all of a query's migrating
operators): a change from ``W`` to ``W + 1`` owners moves ``S/(W+1)`` bins, all to the
newcomer, and at most ``1/(W+1) + 2 %`` of the state's bytes (``ChangeReport.share``: each
step's bytes against the bytes held at that step; checked on a larger input, where a bin holds
enough keys for 2 % to be a margin); a change that drops a
worker moves exactly the bins that worker owned (the table before the change is rebuilt from
the moves worker 0 sent, not from ``RoutingTable.rebalanced``), from it only, and with
``all-at-once`` exactly its bytes.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import pandas as pd
import pytest

from tokenflow.nexmark.generator import GeneratorConfig
from tokenflow.nexmark.queries import q5, q8
from tokenflow.nexmark.run import epoch_plan, run_query
from tokenflow.rescale import STRATEGIES

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")]

SMALL = (100_000, 5_000, 500)
"""events, events/s of event time, epoch ms: 20 s of event time in 40 epochs (the equality
tests; windows of 10 s stay open across several moves)."""
LARGE = (500_000, 50_000, 100)
"""10 s in 100 epochs, about ten times the state (the byte bounds: with a few hundred keys a
bin's bytes vary too much for a 2 % margin)."""
WORKERS = 4
BINS = {False: 4096, True: 256}
"""Bins of the routing table: fluid moves one per step."""
ROSTERS = [3, 4, 3, 2]
"""After starting on workers 0..1."""
QUERIES = ["q4", "q5", "q8"]


IN_FLIGHT = 10_000
"""Auctions in flight for the byte bounds (the generator's default, 100, leaves Q4 a state of
a few hundred open auctions: a third of the bins holds a third of them give or take 15 %)."""


def config(size: tuple[int, int, int]) -> GeneratorConfig:
    return GeneratorConfig(rate=size[1], num_in_flight_auctions=IN_FLIGHT if size == LARGE else 100)


@functools.cache
def reference(query: str, size: tuple[int, int, int] = SMALL) -> pd.DataFrame:
    """The query without migrating state, on the thread runtime."""
    events, _, granularity = size
    return run_query(query, events, workers=2, granularity_ms=granularity,
                     generator=config(size)).rows


def random_points(rng: random.Random, size: tuple[int, int, int] = SMALL,
                  lo: float = 0.25, hi: float = 0.8) -> list[tuple[int, int]]:
    """2 -> 3 -> 4 -> 3 -> 2 at four distinct random epochs between ``lo`` and ``hi`` of the
    input."""
    events, _, granularity = size
    n = len(epoch_plan(events, config(size), granularity))
    points = sorted(rng.sample(range(max(1, int(n * lo)), int(n * hi)), len(ROSTERS)))
    return list(zip(points, ROSTERS, strict=True))


def run(query: str, strategy: str, rng: random.Random, size: tuple[int, int, int] = SMALL,
        **options: Any) -> Any:
    """The query on 4 workers starting at 2; ``fluid`` (one bin per step) with 256 bins and
    without measuring (every worker would export its whole state at each of the steps)."""
    events, _, granularity = size
    fluid = strategy == "fluid"
    return run_query(query, events, workers=WORKERS, granularity_ms=granularity,
                     roster=2, strategy=strategy, measure=not fluid, bins=BINS[fluid],
                     generator=config(size), **options)


def same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert len(expected) > 0
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True),
                                  check_dtype=False)


Q8_WINDOW_MS = 10_000


def empty_by_design(query: str, time: int, granularity: int) -> bool:
    """Whether a change at logical ``time`` may find no state at all: q8 keeps only its open
    tumbling windows, and a change in a window's first epoch comes after the previous window
    was retired and before any record of the new one was admitted (a CI run saw a 3 -> 2 change
    at ``...420001`` with 0 bytes held)."""
    return query == "q8" and time % Q8_WINDOW_MS <= granularity


def check_moves(result: Any, strategy: str, bytes_bound: bool = False, query: str = "",
                granularity: int = SMALL[2]) -> None:
    """The bounds of the module docstring for every change of the run (the 2 % byte bound of
    scale-out only with ``bytes_bound``)."""
    changes = result.migrations
    assert [(c.before, c.after) for c in changes] == [
        ([0, 1], [0, 1, 2]), ([0, 1, 2], [0, 1, 2, 3]), ([0, 1, 2, 3], [0, 1, 2]),
        ([0, 1, 2], [0, 1])]
    bins = BINS[strategy == "fluid"]
    for c in changes:
        assert (c.total_bytes > 0 or strategy == "fluid"
                or empty_by_design(query, c.time, granularity)), c
        if len(c.after) > len(c.before):  # scale-out: only to the newcomer, about 1/(W+1)
            (newcomer,) = set(c.after) - set(c.before)
            assert c.receivers == [newcomer]
            assert c.bins in (bins // len(c.after), bins // len(c.after) + 1)
            if bytes_bound:
                assert c.share <= 1 / len(c.after) + 0.02, (c.index, c.share, c.operators)
        else:  # scale-in: exactly the leaving worker's bins, and all its state
            (leaving,) = set(c.before) - set(c.after)
            assert c.senders == [leaving]
            assert c.moved_bins == c.owned_before[leaving]
            if strategy == "all-at-once":
                assert c.moved_bytes == c.sender_bytes[leaving]


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rescaling_keeps_the_output_thread(query: str, strategy: str) -> None:
    rng = random.Random(f"{query}-{strategy}")
    result = run(query, strategy, rng, rescale_at=random_points(rng))
    same_rows(result.rows, reference(query))
    check_moves(result, strategy, query=query)


def test_a_rescale_point_beyond_the_data_says_it_was_not_carried_out() -> None:
    """``rescale_at`` at an epoch the job never reaches: a warning names the point (it was
    dropped without a word) and nothing moved; the output is still the reference's."""
    with pytest.warns(RuntimeWarning, match=r"rescale_at points \[\(1000000, 3\)\] not carried"):
        result = run("q5", "batched", random.Random(0), rescale_at=[(1_000_000, 3)])
    same_rows(result.rows, reference("q5"))
    assert result.migrations == []


@pytest.mark.parametrize("query", ["q5", "q8"])
def test_states_are_prepared_while_their_steps_wait(query: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The router lets a state whose bins are about to leave prepare its take
    (``prepare_take``: merge chunks, hash keys) while the step waits for its time, and the
    output is still the non-migrating run's."""
    state_class = {"q5": q5.WindowCounts, "q8": q8.WindowState}[query]
    prepared: list[float] = []
    original = state_class.prepare_take

    def counting(self: Any, deadline: float) -> bool:
        prepared.append(deadline)
        return original(self, deadline)

    monkeypatch.setattr(state_class, "prepare_take", counting)
    rng = random.Random(f"prepare-{query}")
    result = run(query, "batched", rng, rescale_at=random_points(rng))
    same_rows(result.rows, reference(query))
    assert prepared


@pytest.mark.parametrize("query", QUERIES)
def test_states_whose_takes_cost_per_bin_leave_in_slices(query: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With no time budget per activation, an all-at-once step of q5's window counts (bins
    memoized: ``take_per_bin``) leaves each old owner in several ``take_to`` slices, each one
    table per new owner; q4's states (a take hashes every key) and q8's (one-call takes are
    short) take a step in one call per old owner.  The output is the non-migrating run's
    either way."""
    import tokenflow.rescale.megaphone as mp
    from tokenflow.nexmark.queries._windows import ColumnarState

    monkeypatch.setattr(mp, "SLICE_SECONDS", 0.0)
    calls: dict[str, int] = {}
    take_to = ColumnarState.take_to

    def counting(self: ColumnarState, bins: Any, owners: Any) -> Any:
        calls[type(self).__name__] = calls.get(type(self).__name__, 0) + 1
        return take_to(self, bins, owners)

    monkeypatch.setattr(ColumnarState, "take_to", counting)
    rng = random.Random(f"slices-{query}")
    result = run(query, "all-at-once", rng, rescale_at=random_points(rng))
    same_rows(result.rows, reference(query))
    check_moves(result, "all-at-once", query=query)
    sending = sum(len(c.senders) for c in result.migrations)  # one step per change
    classes = {cls.__name__: cls for cls in ColumnarState.__subclasses__()}
    per_bin = {name for name in calls if classes[name].take_per_bin}
    assert per_bin == ({"WindowCounts"} if query == "q5" else set()), calls
    for name, count in calls.items():
        if name in per_bin:
            assert count > 2 * sending, (name, count, sending)
        else:
            assert count == sending, (name, count, sending)


@pytest.mark.parametrize("query", QUERIES)
def test_state_moved_per_change_is_bounded(query: str) -> None:
    """On the larger input (10,000 auctions in flight), with the changes after its first 30 %
    (the state built up): each scale-out moves at most ``1/(W+1) + 2 %`` of the state bytes."""
    rng = random.Random(f"bytes-{query}")
    result = run(query, "all-at-once", rng, LARGE,
                 rescale_at=random_points(rng, LARGE, 0.3, 0.8))
    same_rows(result.rows, reference(query, LARGE))
    check_moves(result, "all-at-once", bytes_bound=True, query=query,
                granularity=LARGE[2])


@pytest.mark.parametrize("query", QUERIES)
def test_rescaling_keeps_the_output_process(query: str) -> None:
    rng = random.Random(f"process-{query}")
    strategy = rng.choice(STRATEGIES)
    result = run(query, strategy, rng, runtime="process", rescale_at=random_points(rng))
    same_rows(result.rows, reference(query))
    check_moves(result, strategy, query=query)


@pytest.mark.spark
@pytest.mark.parametrize("query", QUERIES)
def test_rescaling_keeps_the_output_spark(spark: Any, query: str) -> None:
    rng = random.Random(f"spark-{query}")
    strategy = rng.choice(STRATEGIES)
    result = run(query, strategy, rng, runtime="spark", master="local[4]",
                 rescale_at=random_points(rng))
    same_rows(result.rows, reference(query))
    check_moves(result, strategy, query=query)


def test_driver_schedule_through_the_control_plane() -> None:
    """``rescale_schedule`` (seconds, the driver's ``JobHandle.rescale``) on the process
    runtime: the output is still the reference's and the rescales were acknowledged and
    carried out.  Paced over 4 s, so every change comes while input still flows (as fast
    as it goes, the job could end right after a change was acknowledged, before its steps'
    times came: one CI run saw 2 acknowledged, 1 carried out)."""
    events, rate, granularity = SMALL
    result = run_query("q5", events, rate=rate, workers=3, runtime="process",
                       granularity_ms=granularity, lag=1, roster=2, pace=events / 4,
                       rescale_schedule=[(0.2, 3), (0.6, 1), (1.0, 2)])
    same_rows(result.rows, reference("q5"))
    assert result.rescales and all(e.error is None for e in result.rescales), result.rescales
    assert [e.workers for e in result.rescales] == [3, 1, 2]
    assert len(result.migrations) == len(result.rescales)


def test_non_elastic_queries_and_bad_rosters_are_refused() -> None:
    with pytest.raises(ValueError, match="no migrating state"):
        run_query("q7", 1_000, elastic=True)
    with pytest.raises(ValueError, match="worker processes"):
        run_query("q5", 1_000, workers=2, rescale_at=[(1, 3)])
    with pytest.raises(ValueError, match="strategy"):
        run_query("q5", 1_000, elastic=True, strategy="sideways")
    with pytest.raises(ValueError, match="not checkpointed"):
        run_query("q5", 1_000, workers=2, max_workers=3, checkpoint="/nonexistent")


def test_take_is_export_then_discard() -> None:
    """``ColumnarState.take(bins)`` returns what ``export(bins)`` did and leaves exactly the
    other bins' rows (compared table by table with exports made before the take)."""
    import numpy as np
    import pyarrow as pa

    from tokenflow.nexmark import generate
    from tokenflow.nexmark.queries import q4, q5, q8
    from tokenflow.nexmark.queries._windows import int_column

    events = generate(0, 20_000, GeneratorConfig(rate=2_000))
    bids, auctions, persons = events["bid"], events["auction"], events["person"]
    counts = q5.WindowCounts()
    counts.add(*q5.partial_counts(int_column(bids, "auction"), int_column(bids, "dateTime")))
    book = q4.AuctionBook()
    book.add_auctions(pa.Table.from_batches([auctions]))
    book.add_bids(int_column(bids, "auction"), int_column(bids, "price"),
                  int_column(bids, "dateTime") - 10**9)  # none qualifies: all stay open
    joined = q8.WindowState()
    for batch, add in ((persons, joined.add_persons), (auctions, None)):
        ends, rows = joined.windows(int_column(batch, "dateTime"))
        for end, index in zip(ends.tolist(), rows, strict=True):
            if add is not None:
                add(end, batch.select(["id", "name"]).take(pa.array(index)))
            else:
                joined.add_sellers(end, int_column(batch, "seller")[index])
    rng = np.random.default_rng(7)
    for state in (counts, book, joined):
        state.attach(256, 0)
        before = state.export()
        assert len(before) > 50
        gone = sorted(rng.choice(sorted(before), size=len(before) // 3, replace=False).tolist())
        taken = state.take(gone)
        assert sorted(taken) == gone
        for b in gone:
            assert taken[b].equals(before[b]), (type(state).__name__, b)
        after = state.export()
        assert sorted(after) == sorted(set(before) - set(gone))
        for b, table in after.items():
            assert table.num_rows == before[b].num_rows, (type(state).__name__, b)
        assert state.take(gone) == {}
