"""``KeyBins`` (``tokenflow.dataflow.state``): the memoized bins of list-batch keys equal
``key_bins``'s, which hashes every key (the bin ``Exchange`` routes a key by), whatever the
order of the batches, the keys' types, and a memo cleared at its capacity."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.dataflow.state import KeyBins, key_bins

keys = st.one_of(st.text(max_size=6), st.integers(-10**12, 10**12),
                 st.tuples(st.text(max_size=3), st.integers(0, 99)))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(keys, max_size=40), min_size=1, max_size=6),
       bins=st.sampled_from([1, 7, 256, 4096]), capacity=st.integers(1, 50))
def test_memoized_bins_equal_hashed_bins(batches: list[list[Any]], bins: int,
                                         capacity: int) -> None:
    memo = KeyBins(bins, capacity)
    for batch in batches:
        assert memo(batch).tolist() == key_bins(batch, bins).tolist()


def test_unhashable_keys_are_hashed_every_time() -> None:
    memo = KeyBins(64)
    batch: list[Any] = [["a", 1], ["b", 2], ["a", 1]]
    assert memo(batch).tolist() == key_bins(batch, 64).tolist()
    assert memo(["x", "y"]).tolist() == key_bins(["x", "y"], 64).tolist()
    mixed: list[Any] = ["new", ["b", 2]]  # a key the memo lacks comes first
    assert memo(mixed).tolist() == key_bins(mixed, 64).tolist()
