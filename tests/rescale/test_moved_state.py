"""``MovedState``: a step's state message pickles only the rows of the moved bins, even when
each bin's table is a slice of the operator's whole state (pickling a sliced ``pa.Table``
writes its parent's buffers whole)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.state import split_by_bin
from tokenflow.rescale.megaphone import MovedState, PackedBatch, moved_parts, unpacked


def test_a_pickled_step_holds_only_the_moved_rows_and_round_trips() -> None:
    n, bins = 200_000, 1024
    whole = pa.table({"key": np.arange(n, dtype=np.int64),
                      "name": pa.array([f"item-{i}" for i in range(n)]),
                      "count": np.ones(n, dtype=np.int64)})
    parts = split_by_bin(whole, np.arange(n) % bins)
    moved = {b: parts[b] for b in range(0, bins, 3)}  # a third of the bins, each a slice
    rows = sum(t.num_rows for t in moved.values())
    sliced = sum(t.nbytes for t in moved.values())
    data = pickle.dumps(MovedState(moved), protocol=5)
    assert len(data) < 2 * sliced + 10_000  # a dict of the slices pickles the whole ~30x over
    back = moved_parts(pickle.loads(data))
    assert sorted(back) == sorted(moved)
    assert sum(t.num_rows for t in back.values()) == rows
    for b, t in moved.items():
        assert back[b].equals(t)


def test_tables_of_different_schemas_and_plain_dicts() -> None:
    a = pa.table({"x": [1, 2]})
    b = pa.table({"y": ["u"]})
    back = moved_parts(pickle.loads(pickle.dumps(MovedState({3: a, 5: b}))))
    assert back[3].equals(a) and back[5].equals(b)
    assert moved_parts({1: a}) == {1: a}
    assert moved_parts(pickle.loads(pickle.dumps(MovedState({})))) == {}


def test_a_data_part_pickles_only_its_rows_and_unpickles_as_the_batch() -> None:
    n = 100_000
    batch = pa.record_batch({"a": np.arange(n), "s": pa.array([f"x{i}" for i in range(n)])})
    part = batch.slice(1_000, 25_000)
    data = pickle.dumps(PackedBatch(part), protocol=5)
    assert len(data) < 1.1 * part.nbytes + 2_000  # the slice pickled alone: the whole batch
    back = pickle.loads(data)
    assert isinstance(back, pa.RecordBatch) and back.equals(part)
    assert unpacked(PackedBatch(part)) is part and unpacked([1]) == [1]


def test_a_data_part_with_dictionaries_round_trips() -> None:
    """A batch's own IPC message carries no dictionaries: such a part pickles whole."""
    batch = pa.record_batch({"k": pa.array(range(100)),
                             "d": pa.array(["x", "y"] * 50).dictionary_encode()})
    part = batch.slice(10, 5)
    assert pickle.loads(pickle.dumps(PackedBatch(part), protocol=5)).equals(part)
