"""Repeated takes from the NEXMark states that memoize their keys' bins (``ChunkBins``): q5's
``WindowCounts`` and q8's ``WindowState``.

Migrations take bins out of a state again and again (fluid: one bin per step; a worker's steps
one after another), and between two takes the operator goes on adding rows; before a step,
the router lets the state prepare (``prepare_take``: hash the held keys).
Checked on random states and random sequences of adds, prepares (finished or cut short by
their deadline) and takes:

* every take returns what the whole-state path (export all, reload what stays) returns on a
  twin state that never prepares, and both then export the same rows and finish alike;
* ``prepare_take`` never changes what ``export`` returns;
* once prepared, a take hashes only the rows it takes (the old path hashed every held key at
  every take, so each take cost as much as taking everything);
* ``ChunkBins`` gives the bins ``Exchange(column=)`` routes by, hashes a chunk once, and a copy
  of a state (pickle) takes the same rows.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nexmark_states import add_random_windows

from tokenflow.dataflow.routing import column_hashes
from tokenflow.nexmark.queries import _windows, q5, q8
from tokenflow.nexmark.queries._windows import ChunkBins, ColumnarState
from tokenflow.state.bins import BinSplit, bins_of

Rng = np.random.Generator


def grow_counts(state: q5.WindowCounts, rng: Rng) -> None:
    """A few partial-count batches, in windows that overlap the held ones."""
    for _ in range(int(rng.integers(1, 12))):
        n = int(rng.integers(1, 80))
        state.add(rng.integers(0, 6, n) * 5, rng.integers(0, 400, n), rng.integers(1, 4, n))


def grow_windows(state: q8.WindowState, rng: Rng) -> None:
    """A few batches of persons and sellers (sellers repeat) in a few windows."""
    add_random_windows(state, rng, int(rng.integers(1, 40)))


def finish_counts(state: q5.WindowCounts) -> Any:
    return [b.to_pylist() for b in state.retire(None)]


def finish_windows(state: q8.WindowState) -> Any:
    return {end: sorted(state.close(end).to_pylist(), key=str) for end in state.pending_times()}


KINDS: dict[str, tuple[Callable[[], ColumnarState], Callable[[Any, Rng], None],
                       Callable[[Any], Any]]] = {
    "q5-counts": (lambda: q5.WindowCounts(size=10, slide=5), grow_counts, finish_counts),
    "q8-windows": (lambda: q8.WindowState(size=10), grow_windows, finish_windows),
}


def whole_state_take(state: ColumnarState, bins: list[int]) -> dict[int, pa.Table]:
    """The path memoized takes replace: export everything, reload what stays."""
    everything = state.export()
    gone = set(bins)
    taken = {b: everything[b] for b in sorted(gone) if b in everything}
    if taken:
        state.clear()
        state.load({b: everything[b] for b in everything if b not in gone})
    return taken


def sorted_tables(tables: dict[int, pa.Table]) -> dict[int, list[dict[str, Any]]]:
    """Per bin, the rows in a canonical order (columns of parts absent from a table are
    null-filled by ``export``: dropped here with their nulls)."""
    out = {}
    for b, t in tables.items():
        rows = [{k: v for k, v in r.items() if v is not None} for r in t.to_pylist()]
        out[b] = sorted(rows, key=lambda r: sorted(r.items()))
    return out


def canonical(kind: str, tables: dict[int, pa.Table]) -> dict[int, Any]:
    """What two states holding the same data export alike: q5's partial counts summed per
    (window, auction) (its rows are partials as held, so a state that compacted at other
    times holds other rows of the same sums); q8's rows in a canonical order."""
    if kind != "q5-counts":
        return sorted_tables(tables)
    out: dict[int, Any] = {b: [] for b in tables}
    if isinstance(tables, BinSplit):  # all bins' rows in one table already: no slice per bin
        rows = tables.table.select(["window_end", "auction", "count"]).append_column(
            "bin", pa.array(np.repeat(tables.bins, tables.rows())))
    else:
        rows = pa.concat_tables(
            [t.select(["window_end", "auction", "count"]).append_column("bin", pa.array([b] * len(t)))
             for b, t in tables.items()]) if tables else None
    if rows is not None:  # one group-by over every bin (pyarrow's, not the state's own code)
        sums = rows.group_by(["bin", "window_end", "auction"]).aggregate([("count", "sum")])
        for b, end, auction, total in zip(*(sums[c].to_pylist() for c in (
                "bin", "window_end", "auction", "count_sum")), strict=True):
            out[b].append(((end, auction), total))
    return {b: sorted(v) for b, v in out.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), bins=st.sampled_from([1, 8, 64]))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_takes_between_adds_and_prepares_match_the_whole_state_path(
        kind: str, seed: int, bins: int) -> None:
    make, grow, finish = KINDS[kind]
    state, twin = make(), make()
    state.attach(bins, 0)
    twin.attach(bins, 0)
    rng = np.random.default_rng(seed)
    for _ in range(int(rng.integers(1, 10))):
        for _ in range(int(rng.integers(1, 12))):  # q5: enough adds to compact some windows
            step = int(rng.integers(0, 2**31))
            grow(state, np.random.default_rng(step))
            grow(twin, np.random.default_rng(step))
        if rng.random() < 0.6:
            before = state.export()
            # a deadline already passed (nothing, or one window, is prepared) or none
            state.prepare_take(0.0 if rng.random() < 0.3 else math.inf)
            after = state.export()
            assert sorted_tables(after) == sorted_tables(before), kind
        gone = rng.choice(bins, size=int(rng.integers(0, bins + 1)), replace=False).tolist()
        taken = state.take(gone)
        expected = whole_state_take(twin, gone)
        assert canonical(kind, taken) == canonical(kind, expected), (kind, gone)
        assert canonical(kind, state.export()) == canonical(kind, twin.export()), kind
        assert state.pending_times() == twin.pending_times(), kind
    assert finish(state) == finish(twin), kind


def grown(kind: str, seed: int, rounds: int) -> Any:
    """A state of ``kind`` over 64 bins, grown ``rounds`` times from ``seed``."""
    make, grow, _ = KINDS[kind]
    state = make()
    state.attach(64, 0)
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        grow(state, rng)
    return state


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of every ``column_hashes`` call ``ChunkBins`` and ``key_hashes`` make."""
    calls: list[int] = []

    def counting(column: Any) -> np.ndarray:
        calls.append(len(column))
        return column_hashes(column)

    monkeypatch.setattr(_windows, "column_hashes", counting)
    return calls


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_prepared_take_hashes_only_the_rows_it_takes(kind: str, hashed: list[int]) -> None:
    state = grown(kind, seed=7, rounds=40)
    assert state.prepare_take(math.inf)
    held = sum(t.num_rows for t in state.export().values())
    hashed.clear()  # what the prepare and the export hashed
    taken = state.take(range(0, 64, 8))  # an eighth of the bins
    rows = sum(t.num_rows for t in taken.values())
    assert 0 < rows < held / 4, (rows, held)
    # the taken rows' hashes for the split by bin (each part's once), nothing held
    assert sum(hashed) <= rows, (kind, hashed, rows, held)


def test_a_q8_prepare_merges_each_windows_loose_batches_into_one_chunk_ordered_by_bin() -> None:
    """``WindowState.prepare_take`` merges the batches added since a window's last merge, as
    ``add_persons``/``add_sellers`` do every ``COMPACT_AFTER``: the take then cuts a few
    chunks ordered by bin (slices) instead of every batch.  A passed deadline merges nothing;
    the rows of each bin keep their order (export, row for row)."""
    state = grown("q8-windows", seed=3, rounds=30)
    before = chunk_groups(state)
    loose = {g for g, chunks in before.items() if len(chunks) > 1}
    assert loose  # windows holding several unmerged batches: the case under test
    exported = {b: t.to_pylist() for b, t in state.export().items()}
    assert not state.prepare_take(0.0)
    assert {g: len(c) for g, c in chunk_groups(state).items()} == \
        {g: len(c) for g, c in before.items()}
    assert state.prepare_take(math.inf)
    after = chunk_groups(state)
    for group in loose:  # its unmerged batches are one chunk now
        assert len(after[group]) < len(before[group]), group
    for group, chunks in after.items():  # merges, ordered by bin (a last single batch
        for keys in chunks[:-1]:            # added after the merges is left as it came)
            found = bins_of(column_hashes(pa.array(keys)), 64).astype(np.int64)
            assert (np.diff(found) >= 0).all(), group
    assert {b: t.to_pylist() for b, t in state.export().items()} == exported


def chunk_groups(state: Any) -> dict[tuple[int, int], list[np.ndarray]]:
    """Per (part, window end), the key array of each chunk held (q5: partials' auctions; q8:
    persons' ids, then sellers)."""
    if isinstance(state, q5.WindowCounts):
        return {(0, e): [a for a, _ in parts] for e, parts in state.partials.items()}
    groups = {(0, e): [b.column("id").to_numpy() for b in batches]
              for e, batches in state.persons.items()}
    groups.update({(1, e): list(arrays) for e, arrays in state.sellers.items()})
    return groups


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_take_merges_each_window_it_cuts_twice_and_the_next_take_hashes_nothing_kept(
        kind: str, hashed: list[int]) -> None:
    state = grown(kind, seed=5, rounds=60)
    assert state.prepare_take(math.inf)
    gone = list(range(0, 64, 4))

    def cut(keys: np.ndarray) -> bool:
        return bool(np.isin(bins_of(column_hashes(pa.array(keys)), 64), gone).any())

    merged = {g for g, chunks in chunk_groups(state).items() if sum(map(cut, chunks)) > 1}
    assert merged  # the case under test occurs
    hashed.clear()
    state.take(gone)
    after = chunk_groups(state)
    for group in merged:  # one chunk of what stays (or none, when the take emptied it)
        assert len(after.get(group, [])) <= 1, (group, len(after[group]))
    hashed.clear()
    taken = state.take(range(1, 64, 4))  # the merged chunks' bins were kept with them
    rows = sum(t.num_rows for t in taken.values())
    assert rows > 0
    assert sum(hashed) <= rows, (kind, hashed, rows)


def add_to_both(states: tuple[q8.WindowState, ...], ids: np.ndarray, sellers: np.ndarray) -> None:
    """Add persons ``ids`` (named ``p<id>``) and ``sellers`` to the window ending at 10 of
    each of ``states``."""
    persons = pa.record_batch([pa.array(ids), pa.array([f"p{k}" for k in ids])],
                              schema=q8.PERSON_SCHEMA)
    for state in states:
        state.add_persons(10, persons)
        state.add_sellers(10, sellers)


def test_a_merged_run_is_ordered_by_bin_and_the_next_one_bin_take_slices_it() -> None:
    """q8: a one-bin take merges a window's small chunks (``split(merge=)``) and orders the
    merged rows by bin (``reorder``), so what stays ascends and the next one-bin take (a
    fluid migration's next step) cuts it into zero-copy slices instead of filtering it; both
    takes give what the whole-state path gives."""
    def ascending(a: np.ndarray) -> bool:
        return bool((np.diff(bins_of(column_hashes(pa.array(a)), 64).astype(np.int64)) >= 0).all())

    _, _, finish = KINDS["q8-windows"]
    state, twin = q8.WindowState(size=10), q8.WindowState(size=10)
    rng = np.random.default_rng(3)
    for s in (state, twin):
        s.attach(64, 0)
    for i in range(q8.COMPACT_AFTER // 2):  # small chunks in one window, none compacted
        ids = np.arange(i * 50, i * 50 + 50, dtype=np.int64)
        add_to_both((state, twin), ids, rng.integers(0, 5_000, 50))
    assert sorted_tables(state.take([5])) == sorted_tables(whole_state_take(twin, [5]))
    (merged,) = key_arrays(state)  # one array of what stays of the window's sellers
    assert len(merged) > 1_000 and ascending(merged)
    assert sorted_tables(state.take([6])) == sorted_tables(whole_state_take(twin, [6]))
    assert all(np.shares_memory(k, merged) for k in key_arrays(state))  # slices, not copies
    assert sorted_tables(state.export()) == sorted_tables(twin.export())
    assert finish(state) == finish(twin)


def test_one_bin_takes_leave_a_q8_window_compacted_and_taking_what_the_whole_state_path_takes(
        ) -> None:
    """A fluid migration's one-bin takes cut each chunk ordered by bin that holds the bin
    into two pieces, and new batches keep coming: ``_compact`` merges a window's adjacent
    chunks of the fewest rows as batches are added and when a step prepares, so a prepared
    window holds at most ``MOST_CHUNKS`` chunks (40 takes cut about 200 pieces), and every
    take still gives what the whole-state path gives."""
    _, _, finish = KINDS["q8-windows"]
    state, twin = q8.WindowState(size=10), q8.WindowState(size=10)
    for s in (state, twin):
        s.attach(64, 0)
    rng = np.random.default_rng(11)

    def add(batches: int) -> None:
        for _ in range(batches):
            add_to_both((state, twin), rng.integers(0, 1_000_000, 40),
                        rng.integers(0, 1_000_000, 40))

    add(4 * q8.COMPACT_AFTER)
    most = 0
    for b in range(40):
        add(8)
        assert state.prepare_take(math.inf)
        assert len(state.persons[10]) <= q8.MOST_CHUNKS
        assert len(state.sellers[10]) <= q8.MOST_CHUNKS
        assert sorted_tables(state.take([b])) == sorted_tables(whole_state_take(twin, [b]))
        most = max(most, len(state.persons[10]))
    assert most > q8.MOST_CHUNKS  # the takes did cut chunks into pieces
    assert sorted_tables(state.export()) == sorted_tables(twin.export())
    assert finish(state) == finish(twin)


def key_arrays(state: Any) -> list[np.ndarray]:
    """The numpy key arrays held (q5: partials' auctions; q8: seller arrays)."""
    if isinstance(state, q5.WindowCounts):
        return [a for parts in state.partials.values() for a, _ in parts]
    return [a for arrays in state.sellers.values() for a in arrays]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compacted_chunks_are_sorted_by_bin_and_a_take_of_bin_runs_slices_them(kind: str) -> None:
    make, grow, finish = KINDS[kind]
    state, twin = make(), make()
    state.attach(64, 0)
    twin.attach(64, 0)
    for r in range(80):  # enough adds per window to compact
        grow(state, np.random.default_rng(r))
        grow(twin, np.random.default_rng(r))
    compacted = [a for a in key_arrays(state)
                 if len(a) > 1 and (np.diff(bins_of(column_hashes(pa.array(a)), 64)) >= 0).all()
                 and len(a) > 80]
    assert compacted  # compaction ordered the rows by bin
    gone = list(range(16, 32)) + list(range(48, 56))  # two runs of bins, as a rebalance moves
    assert sorted_tables(state.take(gone)) == sorted_tables(whole_state_take(twin, gone))
    assert sorted_tables(state.export()) == sorted_tables(twin.export())
    assert state.pending_times() == twin.pending_times()
    # what stays of a compacted chunk is slices of it, not copies
    kept = key_arrays(state)
    assert any(np.shares_memory(k, c) for k in kept for c in compacted)
    assert finish(state) == finish(twin)


def test_chunk_bins_route_as_the_exchange_and_hash_a_chunk_once(hashed: list[int]) -> None:
    memo = ChunkBins()
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 10**9, int(rng.integers(0, 500))) for _ in range(30)]
    got = memo.lookup(chunks, lambda a: a, 256)
    for chunk, b in zip(chunks, got, strict=True):
        assert b is not None
        assert b.tolist() == bins_of(column_hashes(pa.array(chunk)), 256).tolist()
    assert sum(hashed) == sum(map(len, chunks))
    memo.lookup(chunks, lambda a: a, 256)
    assert sum(hashed) == sum(map(len, chunks))  # memoized: nothing hashed again
    # another bin count is another routing: hashed anew
    again = memo.lookup(chunks[:1], lambda a: a, 16)
    assert again[0] is not None
    assert again[0].tolist() == bins_of(column_hashes(pa.array(chunks[0])), 16).tolist()
    # a deadline already passed: new chunks are left for later, known ones answered
    fresh = [rng.integers(0, 10**9, 50)]
    assert memo.lookup(fresh, lambda a: a, 256, deadline=time.perf_counter() - 1) == [None]
    assert not memo.warm(fresh, lambda a: a, 256, time.perf_counter() - 1)
    assert memo.warm(fresh, lambda a: a, 256, math.inf)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_pickled_state_takes_the_same_rows(kind: str) -> None:
    state = grown(kind, seed=11, rounds=10)
    state.prepare_take(math.inf)
    copy = pickle.loads(pickle.dumps(state))
    assert sorted_tables(copy.take(range(0, 64, 3))) == sorted_tables(state.take(range(0, 64, 3)))
    assert sorted_tables(copy.export()) == sorted_tables(state.export())


@pytest.mark.parametrize("high", [False, True])
def test_window_sums_match_a_counter_with_any_auction_ids(high: bool) -> None:
    """``WindowCounts.summed`` merges new partials into a window's sums by an int64 key of
    (bin, auction) when ids fit ``KEY_BITS``, else by a lexsort: both give every window's
    maximum count as a brute-force count does, across compactions and takes."""
    rng = np.random.default_rng(11)
    state = q5.WindowCounts(size=10, slide=5)
    state.attach(64, 0)
    oracle: dict[int, dict[int, int]] = {}
    ids = rng.integers(0, 300, 2_000)
    if high:  # outside [0, 2**KEY_BITS): negative and huge ids
        ids = np.where(rng.random(len(ids)) < 0.5, -ids - 1, ids + (1 << q5.KEY_BITS) * 3)
    taken: list[pa.Table] = []
    for step in range(300):
        n = int(rng.integers(1, 40))
        start = rng.integers(0, 3, n) * 5
        auction = rng.choice(ids, n, replace=False)
        count = rng.integers(1, 4, n)
        state.add(start, auction, count)
        for s, a, c in zip(start.tolist(), auction.tolist(), count.tolist(), strict=True):
            window = oracle.setdefault(s + 10, {})
            window[a] = window.get(a, 0) + c
        if step % 97 == 96:  # a take of a run of bins, then its rows loaded back
            taken.extend(state.take(range(8 * (step // 97), 8 * (step // 97) + 8)).values())
            state.load({b: t for b, t in enumerate(taken)})
            taken.clear()
    sums = [a for a, _ in (parts[0] for parts in state.partials.values())
            if len(a) > 50 and len(np.unique(a)) == len(a)
            and (np.diff(bins_of(column_hashes(pa.array(a)), 64).astype(int)) >= 0).all()]
    assert sums  # windows compacted: their sums lead, distinct auctions in bin order
    got = {int(b.column("window_end")[0].as_py()):
           sorted(zip(b.column("auction").to_pylist(), b.column("count").to_pylist(), strict=True))
           for b in state.retire(None)}
    want = {}
    for end, window in oracle.items():
        top = max(window.values())
        want[end] = sorted((a, c) for a, c in window.items() if c == top)
    assert got == want


def test_a_take_of_the_last_bins_of_the_most_bins_slices_to_the_chunks_end() -> None:
    """A run of bins up to ``MAX_BINS`` (its stop, 65,536, does not fit the ``uint16`` the
    bins are kept in): the sliced partials give up their rows to their ends, as the
    whole-state path does; and the compacted sums stay ordered by bin for bins of
    ``2**15`` and more (their sort key ``bin << KEY_BITS | auction`` stays positive)."""
    from tokenflow.state.bins import MAX_BINS

    state, twin = q5.WindowCounts(size=10, slide=5), q5.WindowCounts(size=10, slide=5)
    state.attach(MAX_BINS, 0)
    twin.attach(MAX_BINS, 0)
    rng = np.random.default_rng(2)
    for _ in range(100):  # enough adds for each window to compact: sums over every bin
        n = 2_000
        args = (rng.integers(0, 2, n) * 5, rng.choice(10**9, n, replace=False),
                rng.integers(1, 4, n))
        state.add(*args)
        twin.add(*args)
    sums = state.partials[10][0][0]
    bins = bins_of(column_hashes(pa.array(sums)), MAX_BINS)
    assert len(sums) > 50_000 and (np.diff(bins) >= 0).all()  # bin-ordered past 2**15
    gone = list(range(MAX_BINS - 4_096, MAX_BINS))
    taken = state.take(gone)
    assert taken and max(taken) >= MAX_BINS - 64  # rows of the last bins were held
    assert canonical("q5-counts", taken) == canonical("q5-counts", whole_state_take(twin, gone))
    assert canonical("q5-counts", state.export()) == canonical("q5-counts", twin.export())
    assert finish_counts(state) == finish_counts(twin)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-2**63, 2**63 - 1), max_size=300),
       repeats=st.integers(1, 4), dtype=st.sampled_from(["int64", "uint16", "float64"]))
def test_distinct_is_numpys_unique(values: list[int], repeats: int, dtype: str) -> None:
    """``distinct`` (a sort and a comparison of neighbours) gives exactly ``np.unique``'s
    values, ascending, for repeated and unique keys of the dtypes the states hold."""
    if dtype == "float64":
        array = np.array(values * repeats, dtype=np.float64)
    else:  # each value wrapped into the dtype's range
        info = np.iinfo(dtype)
        span = int(info.max) - int(info.min) + 1
        array = np.array([v % span + int(info.min) for v in values * repeats], dtype=dtype)
    got = _windows.distinct(array)
    assert got.dtype == array.dtype
    assert got.tolist() == np.unique(array).tolist()
