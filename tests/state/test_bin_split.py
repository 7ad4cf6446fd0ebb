"""``BinSplit``: a table's rows grouped by bin without a table per bin, as ``split_by_bin``
returns it, checked against a plain grouping; and the snapshot writer's path for it (runs of
bins serialized as one slice each), which must read back exactly what a dict of per-bin
tables does."""

from __future__ import annotations

import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.dataflow.state import split_by_bin
from tokenflow.state import RoutingTable, Snapshot, commit_snapshot, snapshot, write_worker_part
from tokenflow.state.bins import BinSplit

BINS = 32
JOB = "bin-split"


def grouped(table: pa.Table, bins: np.ndarray, wanted: set[int] | None) -> dict[int, list[Any]]:
    """The oracle: each bin's rows in table order, by a loop over the rows."""
    out: dict[int, list[Any]] = {}
    for row, b in zip(table.to_pylist(), bins.tolist(), strict=True):
        if wanted is None or b in wanted:
            out.setdefault(b, []).append(row)
    return out


def table_of(bins: list[int], version: int = 0) -> pa.Table:
    n = len(bins)
    return pa.table({"key": pa.array(np.arange(n) * 7 + version, pa.int64()),
                     "name": pa.array([f"r{i}-{version}" for i in range(n)])})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, BINS - 1), max_size=200),
       st.one_of(st.none(), st.sets(st.integers(0, BINS - 1))))
def test_split_by_bin_groups_rows_like_a_loop(bins: list[int], wanted: set[int] | None) -> None:
    table = table_of(bins)
    split = split_by_bin(table, np.array(bins, dtype=np.int64), wanted)
    expected = grouped(table, np.array(bins, dtype=np.int64), wanted)
    assert isinstance(split, BinSplit)
    assert list(split) == sorted(expected)
    assert len(split) == len(expected)
    assert {b: split[b].to_pylist() for b in split} == expected
    assert dict(split.items()).keys() == expected.keys()
    for b in range(BINS):
        assert (b in split) == (b in expected)
    missing = next((b for b in range(BINS) if b not in expected), None)
    if missing is not None:
        with pytest.raises(KeyError):
            split[missing]


def test_a_split_rejects_a_layout_that_does_not_cover_its_table() -> None:
    table = table_of([0, 0, 1])
    with pytest.raises(ValueError, match="ascend"):
        BinSplit(table, np.array([1, 0]), np.array([0, 2]), np.array([2, 3]))
    with pytest.raises(ValueError, match="cover"):
        BinSplit(table, np.array([0, 1]), np.array([0, 2]), np.array([1, 3]))  # row 1 left out
    with pytest.raises(ValueError, match="no bins"):
        BinSplit(table, np.zeros(0), np.zeros(0), np.zeros(0))
    with pytest.raises(KeyError):
        BinSplit(table, np.array([0, 1]), np.array([0, 2]), np.array([2, 3]))[True]


def commit(root: str, epoch: int, states: dict[str, Any], previous: Any = None,
           changed: Any = None, between: Any = None) -> Any:
    part = write_worker_part(root, job=JOB, epoch=epoch, worker=0, bins=BINS, states=states,
                             previous=previous, changed=changed, between=between)
    commit_snapshot(root, job=JOB, epoch=epoch, bins=BINS, routing=RoutingTable.even(1, BINS),
                    parts=[part])
    return part


def read_back(root: str) -> dict[int, list[Any]]:
    got = Snapshot.open(root).read("s", range(BINS))
    return {b: t.to_pylist() for b, t in got.items() if t.num_rows}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, BINS - 1), min_size=1, max_size=300),
       st.lists(st.integers(0, BINS - 1), max_size=300),
       st.sampled_from([1, 3, 40]))
def test_a_split_reads_back_like_a_dict_full_then_incremental(first: list[int], second: list[int],
                                                              small_rows: int) -> None:
    """A full capture (small bins packed, large ones alone; ``small_rows`` moves the line) and
    an incremental one of the bins ``second`` touches, each given as a ``BinSplit``: every
    bin reads back as the plain grouping of the rows given last for it."""
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as root:
        patch.setattr("tokenflow.state.snapshot.SMALL_BIN_BYTES", 16 * small_rows)
        patch.setattr("tokenflow.state.snapshot.GROUP_ROWS", 50)  # several packs per state
        table = table_of(first)
        bins = np.array(first, dtype=np.int64)
        part = commit(root, 1, {"s": split_by_bin(table, bins)})
        expected = grouped(table, bins, None)
        assert read_back(root) == expected

        later = table_of(second, version=1)
        changed = set(second)
        split = split_by_bin(later, np.array(second, dtype=np.int64))
        commit(root, 2, {"s": split}, previous=part.entries, changed={"s": changed})
        for b in changed:
            expected.pop(b, None)
        expected.update(grouped(later, np.array(second, dtype=np.int64), None))
        assert read_back(root) == expected


def test_between_runs_before_each_blob_and_bad_bins_write_nothing(tmp_path: Any) -> None:
    bins = np.repeat(np.arange(BINS), 3)
    calls: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tokenflow.state.snapshot.GROUP_ROWS", 10)  # 4 bins of 3 rows a pack
        part = commit(str(tmp_path), 1, {"s": split_by_bin(table_of(bins.tolist()), bins)},
                      between=lambda: calls.append(1))
    blobs = {tuple(e[:3]) for e in part.entries["s"].values()}
    assert len(calls) == len(blobs) == BINS // 4
    split = split_by_bin(table_of([1, BINS + 3]), np.array([1, BINS + 3]))
    with pytest.raises(ValueError, match=f"bin {BINS + 3} is not"):
        write_worker_part(str(tmp_path), job=JOB, epoch=2, worker=0, bins=BINS,
                          states={"s": split})
    assert not list(tmp_path.glob("snapshot-*2"))


def packs_oracle(rows: list[int], chosen: list[bool], group_rows: int,
                 group_bins: int) -> list[tuple[int, int]]:
    """``_packs``'s rule bin by bin: a run of chosen bins grows while it has fewer than
    ``group_bins`` bins and fewer than ``group_rows`` rows."""
    out, i, n = [], 0, len(rows)
    while i < n:
        if not chosen[i]:
            i += 1
            continue
        j, size = i, 0
        while j < n and chosen[j] and j - i < group_bins and (j == i or size < group_rows):
            size += rows[j]
            j += 1
        out.append((i, j))
        i = j
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=60),
       st.integers(1, 100), st.integers(1, 8))
def test_packs_cut_runs_of_chosen_bins_as_the_bin_by_bin_rule(
        bins: list[tuple[int, bool]], group_rows: int, group_bins: int) -> None:
    rows = [r for r, _ in bins]
    chosen = [c for _, c in bins]
    stops = np.cumsum(np.asarray(rows, dtype=np.int64))
    split = BinSplit(pa.table({"k": pa.array(np.zeros(sum(rows), dtype=np.int64))}),
                     np.arange(len(rows)), stops - np.asarray(rows, dtype=np.int64), stops)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(snapshot, "GROUP_ROWS", group_rows)
        patch.setattr(snapshot, "_GROUP_BINS", group_bins)
        packs = list(snapshot._packs(split, np.array(chosen, dtype=bool)))
    assert packs == packs_oracle(rows, chosen, group_rows, group_bins)
