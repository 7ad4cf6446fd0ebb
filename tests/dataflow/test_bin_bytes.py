"""``BinnedState.bin_bytes``: the bytes of state per bin a rescale chooses its moving bins by.
A ``KeyedState`` estimates them from its bin index (keys per bin times a sampled size per
key); a state without such an index does not weigh itself (None: the bins' counts decide)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tokenflow.dataflow.state import KeyedState, LocalState, key_bins


@given(st.dictionaries(st.text(min_size=1, max_size=6), st.integers(), max_size=300),
       st.sampled_from([1, 16, 256]))
def test_keyed_state_weighs_each_bin_by_its_keys(data: dict[str, int], bins: int) -> None:
    state: KeyedState[str, int] = KeyedState()
    state.attach(bins, 0)
    for k, v in data.items():
        state[k] = v
    estimate = state.bin_bytes()
    assert estimate.shape == (bins,)
    keys_per_bin = np.bincount(key_bins(list(data), bins), minlength=bins) if data \
        else np.zeros(bins)
    assert ((estimate > 0) == (keys_per_bin > 0)).all()
    held = keys_per_bin > 0
    if held.any():  # one size per key: the estimate is proportional to the keys per bin
        per_key = estimate[held] / keys_per_bin[held]
        assert np.allclose(per_key, per_key[0])
    exported = np.zeros(bins)  # the oracle: the bins an export writes
    for b, table in state.export().items():
        exported[b] += table.nbytes
    assert ((exported > 0) == held).all()


def test_keyed_state_forgets_the_bytes_of_deleted_and_taken_keys() -> None:
    state: KeyedState[str, list[int]] = KeyedState()
    state.attach(64, 0)
    for i in range(200):
        state[f"k{i}"] = list(range(i % 7))
    bins = key_bins([f"k{i}" for i in range(200)], 64)
    gone = sorted(set(bins.tolist()))[:5]
    state.take(gone)
    del state["k199"]
    estimate = state.bin_bytes()
    assert not estimate[gone].any()
    left = [f"k{i}" for i in range(199) if bins[i] not in gone]
    assert (estimate > 0).sum() == len(set(key_bins(left, 64).tolist()))


def test_a_state_without_a_bin_index_does_not_weigh_itself() -> None:
    state: LocalState[list[int]] = LocalState(list, lambda a, b: a + b)
    state.attach(16, 5)
    state.value.extend(range(1000))
    assert state.bin_bytes() is None
