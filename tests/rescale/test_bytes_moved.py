"""A rescale chooses the bins that move by the state's bytes (``JobHandle.rescale`` gathers
``bin_bytes`` from every worker; ``RoutingTable.rebalanced`` with ``sizes``): a state skewed
into exactly the bins that the bin counts alone would move (the donors' highest bins) still
moves about ``1/(W+1)`` of its keys going from 2 to 3 workers, with the same number of bins,
where moving by index would move half of them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from tokenflow.dataflow.state import key_bins
from tokenflow.job import start
from tokenflow.state.bins import RoutingTable

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BINS = 64
SLOTS = 3
KEYS = 300
"""Keys in the bins the counts alone would move, and as many in all the others."""
EPOCHS = 80
PACE = 0.03


def initial() -> RoutingTable:
    """Bins over workers 0 and 1 of the three (worker 2 owns none until the rescale)."""
    return RoutingTable(RoutingTable.even(2, BINS).owners, range(SLOTS))


def skewed_keys() -> tuple[list[str], list[str]]:
    """``(heavy, light)``: ``KEYS`` keys in the bins ``rebalanced`` without sizes moves from
    ``initial()`` to three workers, and ``KEYS`` in the other bins."""
    by_index = initial().rebalanced(range(SLOTS))
    moving = set(initial().moved(by_index).tolist())
    candidates = [f"key{i}" for i in range(40 * KEYS)]
    bins = key_bins(candidates, BINS).tolist()
    heavy = [k for k, b in zip(candidates, bins, strict=True) if b in moving][:KEYS]
    light = [k for k, b in zip(candidates, bins, strict=True) if b not in moving][:KEYS]
    assert len(heavy) == len(light) == KEYS
    return heavy, light


def job(keys: list[str], ready: str) -> Any:
    """Workers 0 and 1 feed their half of ``keys`` at epoch 0, then one known key per epoch
    for ``EPOCHS`` epochs, ``PACE`` s apart, and each creates the file ``ready/<index>`` once
    its state holds keys (epoch 0 folded); every worker returns the keys it holds at the end
    and the bins it sent away."""

    def run(worker: Any) -> dict[str, Any]:
        from tokenflow.rescale import megaphone_fold

        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda k: (k, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]),
                                    initial=initial())
            return inp, handle

        inp, handle = worker.dataflow(build)
        if worker.index < 2:
            for k in keys[worker.index::2]:
                inp.send(k)
            for e in range(1, EPOCHS):
                inp.advance_to(e)
                inp.send(keys[e % len(keys)])
                if len(handle.state.data) and not os.path.exists(f"{ready}/{worker.index}"):
                    open(f"{ready}/{worker.index}", "w").close()
                deadline = time.monotonic() + PACE
                while time.monotonic() < deadline:
                    worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return {"keys": sorted(handle.state.data), "bins_sent": sum(s.bins for s in handle.moved)}

    return run


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_skewed_state_moves_one_share_of_its_keys_not_the_bins_by_index(
        runtime: str, tmp_path: Path) -> None:
    heavy, light = skewed_keys()
    keys = [k for pair in zip(heavy, light, strict=True) for k in pair]
    handle = start(job(keys, str(tmp_path)), workers=SLOTS, runtime=runtime, bins=BINS)
    deadline = time.monotonic() + 60
    while not all((tmp_path / str(w)).exists() for w in (0, 1)) and handle.running and \
            time.monotonic() < deadline:
        time.sleep(0.02)  # until the state is there to be weighed
    assert handle.running, "the job ended before the rescale: raise EPOCHS or PACE"
    handle.rescale(SLOTS)
    results = handle.result(timeout=120)

    held = [set(r["keys"]) for r in results]
    assert set().union(*held) == set(keys)  # every key held once, none lost
    assert sum(len(h) for h in held) == len(keys)
    moved = len(held[2]) / len(keys)  # every key the newcomer holds moved to it
    assert 0.25 <= moved <= 1 / 3 + 0.02, f"moved {moved:.3f} of the keys"
    # the same number of bins as the counts alone decide: only which ones differ
    by_index = initial().moved(initial().rebalanced(range(SLOTS)))
    assert sum(r["bins_sent"] for r in results) == len(by_index)
