"""Inputs on a worker that joined a running job (``JobHandle.add_worker(inputs=True)``): the
job lends it a token for each open input at worker 0's epoch, its worker code feeds words from
there, and the running counts are a plain ``Counter``'s over everything every worker fed; a
joiner without lent tokens can only close its inputs, and says why when it tries to send."""

from __future__ import annotations

import sys
import time

import cloudpickle
import membership_jobs
import pytest
from membership_jobs import FEEDERS, merged, oracle, word_count

from tokenflow.job import start

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(membership_jobs)

SLOTS = 3
EPOCHS = 50
BINS = 64


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_a_joined_worker_feeds_its_lent_input(runtime: str) -> None:
    handle = start(word_count(pace=0.05, epochs=EPOCHS, joiner_epochs=12), workers=FEEDERS,
                   runtime=runtime, bins=BINS, slots=SLOTS)
    time.sleep(0.6)
    k = handle.add_worker(inputs=True)
    handle.rescale(handle.roster)  # it also owns bins, so its words are counted there too
    results = handle.result(timeout=180)
    assert k == FEEDERS
    joined = results[k]
    assert joined["joined"] and joined["fed"]
    assert 0 < joined["fed"][0] < EPOCHS  # it started at the job's epoch, not at 0
    assert merged(results) == oracle(results, EPOCHS)


def test_a_joined_worker_without_lent_inputs_cannot_send() -> None:
    handle = start(word_count(pace=0.02, epochs=EPOCHS), workers=FEEDERS, runtime="thread",
                   bins=BINS, slots=SLOTS)
    time.sleep(0.3)
    k = handle.add_worker()
    results = handle.result(timeout=120)
    assert "joined a running job and holds no token" in results[k]["error"]
    assert "add_worker(inputs=True)" in results[k]["error"]
    assert merged(results) == oracle(results, EPOCHS)
