"""``ColumnarState.take(bins)`` of every NEXMark query state, on random states.

``take`` removes the rows of some bins without rebuilding the state (``take_rows``: a hash and
a mask filter of the held keys).  For each ``ColumnarState`` subclass the queries use (q3's
``JoinState``, q4's ``AuctionBook`` and ``CategoryAverages``, q5's ``WindowCounts``, q5's and
q7's ``WindowMaxState`` keyed and worker-local, q8's ``WindowState``), on random states, random
bin counts and random sets of bins (empty, all, some absent or out of range):

* ``take(bins)`` returns exactly what ``export(bins)`` returned (table by table: schema, rows
  and their order);
* afterwards ``export()`` is exactly the earlier ``export()`` without those bins;
* the old whole-state path (export everything, ``clear``, ``load`` what stays) on a twin
  state, as an oracle: the same taken tables, the same rows left (in any order), the same
  ``pending_times()``, and the same results when both states then finish their work;
* ``take`` never calls ``rows``, ``export``, ``clear``, ``load`` or ``add_rows`` (no pass that
  rebuilds the state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nexmark_states import add_random_windows

from tokenflow.nexmark.queries import q3, q4, q5, q8
from tokenflow.nexmark.queries._windows import ColumnarState, WindowMaxState

Rng = np.random.Generator

# -- random states, built through each state's own operations --------------------------------


def auction_book(rng: Rng) -> q4.AuctionBook:
    book = q4.AuctionBook()
    ids = rng.choice(10_000, size=int(rng.integers(0, 400)), replace=False)
    for chunk in np.array_split(ids, int(rng.integers(1, 4))):
        n = len(chunk)
        date = rng.integers(0, 1_000, n)
        book.add_auctions(pa.table({"id": chunk.astype(np.int64),
                                    "category": rng.integers(0, 5, n),
                                    "reserve": rng.integers(0, 100, n), "dateTime": date,
                                    "expires": date + rng.integers(1, 1_000, n)}))
        book.match_waiting()
        m = int(rng.integers(0, 600))
        # bids for held auctions and for auctions not seen (they wait)
        book.add_bids(rng.choice(np.r_[ids, rng.integers(10_000, 10_300, 50)], size=m),
                      rng.integers(0, 200, m), rng.integers(0, 1_500, m))
    if rng.random() < 0.5:
        book.close(int(rng.integers(0, 1_500)))
    if rng.random() < 0.3:
        book.prune_waiting(int(rng.integers(0, 1_500)))
    return book


def category_averages(rng: Rng) -> q4.CategoryAverages:
    state = q4.CategoryAverages()
    for t in sorted(rng.choice(1_000, size=int(rng.integers(0, 12)), replace=False).tolist()):
        n = int(rng.integers(1, 40))
        state.add(t, pa.RecordBatch.from_arrays(
            [pa.array(rng.integers(0, 30, n)), pa.array(rng.integers(0, 500, n))],
            schema=q4.WINNER_SCHEMA))
    if rng.random() < 0.7:
        state.advance(int(rng.integers(0, 1_000)))
    return state


def window_counts(rng: Rng) -> q5.WindowCounts:
    state = q5.WindowCounts(size=10, slide=5)
    for _ in range(int(rng.integers(0, 8))):
        n = int(rng.integers(1, 60))
        state.add(rng.integers(0, 6, n) * 5, rng.integers(0, 300, n), rng.integers(1, 4, n))
    return state


MAX_SCHEMA = pa.schema([("window_start", pa.int64()), ("window_end", pa.int64()),
                        ("auction", pa.int64()), ("count", pa.int64())])


def window_max(key: str | None) -> Callable[[Rng], WindowMaxState]:
    def make(rng: Rng) -> WindowMaxState:
        state = WindowMaxState("count", MAX_SCHEMA, key)
        for _ in range(int(rng.integers(0, 6))):
            n = int(rng.integers(1, 50))
            start = rng.integers(0, 5, n) * 10
            state.add(pa.table({"window_start": start, "window_end": start + 10,
                                "auction": rng.integers(0, 500, n),
                                "count": rng.integers(0, 4, n)}, schema=MAX_SCHEMA))
        return state

    return make


def window_state(rng: Rng) -> q8.WindowState:
    state = q8.WindowState(size=10)
    add_random_windows(state, rng, int(rng.integers(0, 300)))  # beyond COMPACT_AFTER a window
    return state


def join_state(rng: Rng) -> q3.JoinState:
    state = q3.JoinState()
    people = rng.choice(5_000, size=int(rng.integers(0, 300)), replace=False).astype(np.int64)
    for time, ids in enumerate(np.array_split(people, int(rng.integers(1, 5)))):
        n = len(ids)
        state.add_persons(ids, pa.RecordBatch.from_arrays(
            [pa.array([f"n{i}" for i in ids.tolist()]), pa.array(["c"] * n, pa.utf8()),
             pa.array(rng.choice(["OR", "ID", "CA"], n).tolist(), pa.utf8())],
            schema=q3.PERSON_SCHEMA), 10 * time)
        m = int(rng.integers(0, 60))
        state.match_auctions(rng.integers(0, 10**6, m),
                             rng.choice(np.r_[people, rng.integers(5_000, 5_100, 20)], size=m),
                             10 * time + 5)
    return state


# -- what each state does next (to compare a taken state with the oracle's) ------------------


def rows_of(table: pa.Table | pa.RecordBatch) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.values()) for r in table.to_pylist())


def finish_book(state: q4.AuctionBook) -> Any:
    expires, category, price = state.close(None)
    return Counter(zip(expires.tolist(), category.tolist(), price.tolist(), strict=True))


def finish_averages(state: q4.CategoryAverages) -> Any:
    return rows_of(state.advance(None))


def finish_counts(state: q5.WindowCounts) -> Any:
    return sum((rows_of(b) for b in state.retire(None)), Counter())


def finish_max(state: WindowMaxState) -> Any:
    return [(end, rows_of(rows)) for end, rows in state.retire(None, True)]


def finish_windows(state: q8.WindowState) -> Any:
    return [(end, rows_of(state.close(end))) for end in state.pending_times()]


def finish_join(state: q3.JoinState) -> Any:
    """Auctions of every seller id: the matches, and what then waits."""
    sellers = np.arange(5_100, dtype=np.int64)
    rows, ids, times = state.match_auctions(np.arange(len(sellers)), sellers, 10**4)
    matched = rows_of(state.output(rows, ids)) if len(rows) else Counter()
    return matched, rows_of(state.waiting_table()), Counter(times.tolist())


STATES: dict[str, tuple[Callable[[Rng], ColumnarState], Callable[[Any], Any]]] = {
    "q3-join": (join_state, finish_join),
    "q4-book": (auction_book, finish_book),
    "q4-averages": (category_averages, finish_averages),
    "q5-counts": (window_counts, finish_counts),
    "q5-max-keyed": (window_max("window_start"), finish_max),
    "q7-max-local": (window_max(None), finish_max),
    "q8-windows": (window_state, finish_windows),
}


def test_q8_windows_are_compacted() -> None:
    """``WindowState`` merges every ``COMPACT_AFTER`` batches (arrays) added to a window into
    one, and still holds every row, in order."""
    state = q8.WindowState(size=10)
    ids = np.arange(1_000)
    for chunk in np.array_split(ids, 500):
        state.add_persons(10, pa.RecordBatch.from_arrays(
            [pa.array(chunk), pa.array([str(i) for i in chunk.tolist()])],
            schema=q8.PERSON_SCHEMA))
        state.add_sellers(10, chunk)
    assert len(state.persons[10]) < 500 // q8.COMPACT_AFTER + q8.COMPACT_AFTER
    assert len(state.sellers[10]) < 500 // q8.COMPACT_AFTER + q8.COMPACT_AFTER
    held = pa.Table.from_batches(state.persons[10])
    assert held.column("id").to_pylist() == ids.tolist()
    assert np.concatenate(state.sellers[10]).tolist() == ids.tolist()


def test_q8_compacted_sellers_are_distinct() -> None:
    """A compacted seller array holds each seller of its batches once (the join needs only
    the distinct sellers), and no seller is lost; batches added since stay as added."""
    state = q8.WindowState(size=10)
    rng = np.random.default_rng(2)
    added = []
    for _ in range(3 * q8.COMPACT_AFTER + 5):
        batch = rng.integers(0, 50, 20)  # a few hot sellers: many repeats
        added.append(batch)
        state.add_sellers(10, batch)
    arrays = state.sellers[10]
    compacted = [a for a in arrays if len(a) > 20]
    assert len(compacted) == 3
    for a in compacted:
        assert len(np.unique(a)) == len(a)
    assert set(np.concatenate(arrays).tolist()) == set(np.concatenate(added).tolist())
    assert [a.tolist() for a in arrays[-5:]] == [a.tolist() for a in added[-5:]]


# -- the oracle and the checks ----------------------------------------------------------------


def old_take(state: ColumnarState, bins: Iterable[int]) -> dict[int, pa.Table]:
    """The whole-state path ``take`` replaced: export all, reload what stays."""
    gone = set(bins)
    everything = state.export()
    taken = {b: t for b, t in everything.items() if b in gone}
    if taken:
        state.clear()
        state.load({b: t for b, t in everything.items() if b not in gone})
    return taken


def sorted_rows(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in table.column_names])


def only_columns_of(x: pa.Table, y: pa.Table) -> pa.Table:
    """``y`` without the columns ``x`` lacks, which must be all null in ``y``: an export
    concatenates only the parts holding rows, so a part emptied by a take leaves the
    columns of later exports (the other parts' rows carried them as nulls)."""
    extra = [c for c in y.column_names if c not in x.column_names]
    for c in extra:
        assert y.column(c).null_count == y.num_rows, c
    return y.select(x.column_names)


def same_tables(a: Mapping[int, pa.Table], b: Mapping[int, pa.Table], ordered: bool,
                what: str, emptied: bool = False) -> None:
    """Equal table by table (rows sorted unless ``ordered``); ``emptied``: ``b`` may have
    extra all-null columns of parts ``a``'s state no longer holds."""
    assert sorted(a) == sorted(b), (what, sorted(a), sorted(b))
    for k in a:
        x, y = a[k], only_columns_of(a[k], b[k]) if emptied else b[k]
        x, y = (x, y) if ordered else (sorted_rows(x), sorted_rows(y))
        assert x.schema == y.schema, (what, k, x.schema, y.schema)
        assert x.equals(y), (what, k, x.to_pylist(), y.to_pylist())


def forbid_rebuilds(state: ColumnarState) -> None:
    """Make every whole-state method fail on this instance (``take`` must not use them)."""
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("take rebuilt the state")

    for method in ("rows", "export", "clear", "load", "add_rows"):
        setattr(state, method, fail)


def allow_rebuilds(state: ColumnarState) -> None:
    for method in ("rows", "export", "clear", "load", "add_rows"):
        delattr(state, method)


def check(kind: str, seed: int, bins: int, choice: str) -> None:
    make, finish = STATES[kind]
    state, twin = make(np.random.default_rng(seed)), make(np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    home = int(rng.integers(0, bins)) if bins else 0
    state.attach(bins, home)
    twin.attach(bins, home)
    before = state.export()
    n = max(bins, 1)
    if choice == "none":
        gone: list[int] = []
    elif choice == "all":
        gone = list(range(n))
    elif choice == "held":
        present = sorted(before)
        gone = rng.choice(present, size=len(present) // 2, replace=False).tolist() \
            if present else []
    else:  # some bins, with repeats, bins holding nothing and bins out of range
        gone = rng.integers(-2, n + 3, size=int(rng.integers(0, n + 4))).tolist()
    wanted = state.export(gone)

    forbid_rebuilds(state)
    taken = state.take(gone)
    allow_rebuilds(state)

    same_tables(taken, wanted, ordered=True, what=f"{kind}: take(bins) == export(bins)")
    left = {b: t for b, t in before.items() if b not in set(gone)}
    same_tables(state.export(), left, ordered=True, emptied=True,
                what=f"{kind}: export() after == export() before minus bins")
    expected = old_take(twin, gone)
    same_tables(taken, expected, ordered=True, what=f"{kind}: the oracle's taken tables")
    same_tables(state.export(), twin.export(), ordered=False, what=f"{kind}: the oracle's rest")
    assert state.pending_times() == twin.pending_times(), kind
    assert state.take(gone) == {}, kind  # taken: nothing of those bins is left
    assert finish(state) == finish(twin), kind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), bins=st.sampled_from([0, 1, 8, 64, 256]),
       choice=st.sampled_from(["none", "all", "held", "random"]))
@pytest.mark.parametrize("kind", sorted(STATES))
def test_take_is_export_then_discard_without_a_rebuild(kind: str, seed: int, bins: int,
                                                        choice: str) -> None:
    check(kind, seed, bins, choice)


@pytest.mark.parametrize("kind", sorted(STATES))
def test_take_of_empty_states(kind: str) -> None:
    make, _ = STATES[kind]
    state = make(np.random.default_rng(0))
    state.clear()
    state.attach(16, 3)
    assert state.take(range(16)) == {}
    assert state.export() == {}


def test_a_taken_state_loads_back() -> None:
    """What ``take`` returns loads into another worker's state: together the two export
    every row of the original (any order within a bin)."""
    for kind, (make, _) in sorted(STATES.items()):
        if kind == "q7-max-local":
            continue  # worker-local rows merge on the home bin: covered by the oracle check
        state, other = make(np.random.default_rng(5)), make(np.random.default_rng(6))
        other.clear()
        state.attach(64, 0)
        other.attach(64, 32)
        before = state.export()
        taken = state.take(range(32, 64))
        other.load(taken)
        after = {**state.export(), **other.export()}
        same_tables(after, before, ordered=False, what=kind)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), bins=st.sampled_from([1, 8, 64, 256]),
       workers=st.integers(1, 3))
@pytest.mark.parametrize("kind", sorted(STATES))
def test_take_to_is_take_grouped_by_new_owner(kind: str, seed: int, bins: int,
                                              workers: int) -> None:
    """``take_to(bins, workers)`` (a migration step's one table per new owner) holds, per
    worker, exactly the rows ``take`` returns for that worker's bins (any order), leaves the
    same rest, and loaded on the new owner exports what loading the per-bin tables does."""
    make, finish = STATES[kind]
    state, twin = make(np.random.default_rng(seed)), make(np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    home = int(rng.integers(0, bins))
    state.attach(bins, home)
    twin.attach(bins, home)
    moving = rng.choice(bins, size=int(rng.integers(0, bins + 1)), replace=False).tolist()
    targets = {b: int(rng.integers(0, workers)) for b in moving}

    grouped = state.take_to(np.array(list(targets), dtype=np.int64),
                            np.array(list(targets.values()), dtype=np.int64))
    per_bin = twin.take(moving)

    assert set(grouped) <= set(range(workers)), kind
    for w in range(workers):
        bins_of_w = [b for b, t in targets.items() if t == w and b in per_bin]
        if not bins_of_w:
            assert w not in grouped or grouped[w].num_rows == 0, (kind, w)
            continue
        whole = pa.concat_tables([per_bin[b] for b in bins_of_w], promote_options="default")
        got = grouped[w]
        assert rows_of(got.select(whole.column_names)) == rows_of(whole), (kind, w)
        fresh, oracle = make(np.random.default_rng(7)), make(np.random.default_rng(7))
        for s in (fresh, oracle):
            s.clear()
            s.attach(bins, 0)
        fresh.load({min(bins_of_w): got})
        oracle.load({b: per_bin[b] for b in bins_of_w})
        same_tables(fresh.export(), oracle.export(), ordered=False, what=f"{kind}: loaded")
    same_tables(state.export(), twin.export(), ordered=False, what=f"{kind}: the rest")
    assert finish(state) == finish(twin), kind


def raise_bids(state: ColumnarState) -> None:
    """q4's book updates its open auctions' best prices in place (``np.maximum.at``)."""
    if isinstance(state, q4.AuctionBook) and len(state.open["id"]):
        ids = state.open["id"]
        state.add_bids(ids, np.full(len(ids), 10**6), np.zeros(len(ids), dtype=np.int64))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), bins=st.sampled_from([0, 1, 8, 256]),
       some=st.booleans())
@pytest.mark.parametrize("kind", sorted(STATES))
def test_export_later_is_the_export_at_the_call(kind: str, seed: int, bins: int,
                                                some: bool) -> None:
    """A checkpoint's capture reads a state with ``export_later`` and its writer thread
    runs the export while the operator goes on: whatever the operator then does to the
    state (in-place updates, closing windows, takes), the export is the state's at the
    capture, table for table (a twin state built alike is the oracle)."""
    make, finish = STATES[kind]
    state, twin = make(np.random.default_rng(seed)), make(np.random.default_rng(seed))
    home = int(np.random.default_rng(seed + 1).integers(0, bins)) if bins else 0
    state.attach(bins, home)
    twin.attach(bins, home)
    wanted = list(range(0, max(bins, 1), 2)) if some else None
    later = state.export_later(wanted)
    raise_bids(state)
    finish(state)
    state.take(range(max(bins, 1)))
    same_tables(later(), twin.export(wanted), ordered=True,
                what=f"{kind}: export_later() after the state changed")


def test_take_to_refuses_bins_and_owners_of_different_lengths() -> None:
    """A migration step's bins and new owners pair up one to one: a mismatch is an error
    naming both lengths, and the state keeps every row."""
    make, _ = STATES[sorted(STATES)[0]]
    state = make(np.random.default_rng(3))
    state.attach(8, 0)
    before = state.export()
    with pytest.raises(ValueError, match="3 bins but 2 new owners"):
        state.take_to(np.array([0, 1, 2]), np.array([1, 1]))
    same_tables(state.export(), before, ordered=False, what="after the refused take")


def exported_bytes(state: ColumnarState, bins: int) -> np.ndarray:
    """The oracle: each bin's ``pa.Table.nbytes`` in a full ``export()``."""
    out = np.zeros(bins)
    for b, table in state.export().items():
        out[b] += table.nbytes
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), bins=st.sampled_from([1, 8, 64, 256]))
@pytest.mark.parametrize("kind", sorted(STATES))
def test_bin_bytes_estimates_the_exported_shares(kind: str, seed: int, bins: int) -> None:
    """``bin_bytes`` (rows per bin times bytes per row, no export) against the exact bytes
    of ``export()``: the same bins hold state, and any set of bins holds about the same share
    of the bytes (what a rescale chooses bins by); ``held_rows`` (the cheap size that gates
    it) is at least the rows ``rows()`` gives."""
    state = STATES[kind][0](np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    state.attach(bins, int(rng.integers(0, bins)))
    assert state.held_rows() >= sum(t.num_rows for t, _ in state.rows()), kind
    estimate, exact = state.bin_bytes(), exported_bytes(state, bins)
    assert estimate is not None and estimate.shape == exact.shape == (bins,)
    assert ((estimate > 0) == (exact > 0)).all(), kind
    if not exact.any():
        return
    for _ in range(10):
        chosen = rng.random(bins) < 0.3
        share = estimate[chosen].sum() / estimate.sum()
        assert abs(share - exact[chosen].sum() / exact.sum()) <= 0.1, kind


def test_a_large_columnar_state_is_not_weighed() -> None:
    """Above ``SIZE_ROWS`` held rows ``bin_bytes`` is None (building the rows would hold the
    worker too long; the bins' counts decide), and ``rows()`` is not called."""
    from tokenflow.nexmark.queries._windows import SIZE_ROWS

    state = q5.WindowCounts(size=10, slide=5)
    rng = np.random.default_rng(5)
    n = SIZE_ROWS + 1
    state.add(rng.integers(0, 2, n) * 5, rng.integers(0, 10 * n, n), np.ones(n, np.int64))
    state.attach(64, 0)
    assert state.held_rows() > SIZE_ROWS
    forbid_rebuilds(state)
    assert state.bin_bytes() is None
