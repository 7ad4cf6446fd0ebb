"""A rolling upgrade step (``JobHandle.replace_worker``): a new worker joins, every bin of the
replaced worker moves straight to it in one layout change (no other bin moves, nothing goes
through a third worker), the replaced worker leaves, and the running counts are a plain
``Counter``'s."""

from __future__ import annotations

import sys
import time

import cloudpickle
import membership_jobs
import pytest
from membership_jobs import FEEDERS, merged, oracle, word_count

from tokenflow.job import start
from tokenflow.state.bins import RoutingTable

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(membership_jobs)

SLOTS = 5
BINS = 64


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_replace_moves_exactly_the_replaced_workers_bins_to_the_new_one(runtime: str) -> None:
    handle = start(word_count(pace=0.08), workers=FEEDERS, runtime=runtime, bins=BINS,
                   slots=SLOTS)
    time.sleep(0.5)
    assert handle.scale(3) == [0, 1, 2]
    time.sleep(0.5)
    new = handle.replace_worker(2)
    results = handle.result(timeout=180)
    assert new == 3 and handle.roster == [0, 1, 3]
    assert merged(results) == oracle(results)
    *_, (before_roster, before), (after_roster, after) = results[0]["changes"]
    assert before_roster == [0, 1, 2] and after_roster == [0, 1, 3]
    # one layout change: the bins of 2 went to 3, every other bin stayed where it was
    assert [a for b, a in zip(before, after, strict=True) if b == 2] == [3] * before.count(2)
    assert [(b, a) for b, a in zip(before, after, strict=True) if b != 2 and a != b] == []
    assert before.count(2) > 0
    assert results[2]["joined"] and results[2]["left"] and results[2]["keys"] == 0
    assert results[3]["joined"] and results[3]["keys"] > 0  # it holds 2's state now


def test_replaced_table_moves_one_workers_bins() -> None:
    table = RoutingTable.even(3, 16)
    replaced = table.replaced(1, 7)
    assert replaced.roster == (0, 2, 7) and replaced.version == table.version + 1
    assert replaced.moved(table).tolist() == table.owned_by(1).tolist()
    assert replaced.owned_by(7).tolist() == table.owned_by(1).tolist()
    with pytest.raises(ValueError, match="worker 5 is not in the roster"):
        table.replaced(5, 7)
