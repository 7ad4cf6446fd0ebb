"""Workers joining and leaving a running job: a word count scaled 2 -> 3 -> 4 -> 3 -> 2
workers while it runs produces exactly a plain ``Counter``'s running counts, the joined workers
really own and hand back bins, and the protocol's guards hold."""

from __future__ import annotations

import sys
import time
from typing import Any

import cloudpickle
import membership_jobs
import pytest
from membership_jobs import FEEDERS, counting, merged, oracle, word_count

from tokenflow import execute
from tokenflow.job import start
from tokenflow.membership import MembershipError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's Python workers
cloudpickle.register_pickle_by_value(membership_jobs)

SLOTS = 4
BINS = 64


def test_scale_out_and_in_while_running() -> None:
    handle = start(word_count(pace=0.08), workers=FEEDERS, runtime="thread", bins=BINS,
                   slots=SLOTS)
    time.sleep(0.3)
    rosters = [handle.scale(3), handle.scale(4)]
    time.sleep(0.3)
    rosters += [handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=120)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle(results)
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] for r in joined)
    # the joined workers owned bins (they produced output and handed their bins back)
    assert all(r["out"] and sum(r["moved"]) > 0 for r in joined)
    assert all(r["keys"] == 0 for r in joined)
    assert sum(r["keys"] for r in results[:FEEDERS]) > 0


def test_add_worker_needs_a_free_slot() -> None:
    handle = start(word_count(pace=0.02), workers=FEEDERS, runtime="thread", bins=BINS)
    with pytest.raises(MembershipError, match="no free worker slot"):
        handle.add_worker()
    results = handle.result(timeout=60)
    assert merged(results) == oracle(results)


def test_slots_without_joins_change_nothing() -> None:
    """A job with free slots that never grows gives the same output as one without."""
    results = execute(word_count(pace=0.0), workers=FEEDERS, runtime="thread", slots=SLOTS)
    assert merged(results) == oracle(results)
    assert results[FEEDERS:] == [None] * (SLOTS - FEEDERS)


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_scale_out_and_in_on_the_process_runtime() -> None:
    """Worker processes start, join the mesh and bootstrap while the job runs, then hand
    their bins back and exit; the output is the oracle's."""
    # 60 epochs over 6 s; the four changes were done ~2.5 s after the start (each join starts
    # a process)
    handle = start(word_count(pace=0.1), workers=FEEDERS, runtime="process", bins=BINS,
                   slots=SLOTS)
    time.sleep(0.5)
    rosters = [handle.scale(3), handle.scale(4), handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=180)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle(results)
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] and r["keys"] == 0 for r in joined)
    assert all(sum(r["moved"]) > 0 for r in joined)


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_scale_out_and_in_on_spark(spark: Any) -> None:
    """Each joining worker runs as a one-task barrier stage of its own on the same
    SparkSession while the first stage keeps running; the output is the oracle's."""
    # 60 epochs over 6 s; the four changes were done ~3 s after the start, ~10 s in a session
    # that ran no job yet (this file alone: the stage of the job itself then starts late too)
    handle = start(word_count(pace=0.1), workers=FEEDERS, runtime="spark", bins=BINS,
                   slots=SLOTS, spark=spark)
    time.sleep(1.0)
    rosters = [handle.scale(3), handle.scale(4), handle.scale(3), handle.scale(2)]
    results = handle.result(timeout=300)
    assert rosters == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert merged(results) == oracle(results)
    joined = results[FEEDERS:]
    assert all(r["joined"] and r["left"] and r["keys"] == 0 for r in joined)
    assert all(sum(r["moved"]) > 0 for r in joined)


def ended_dataflows(worker: Any) -> str:
    """A job whose dataflows end at once while its workers' code goes on for a while."""
    def build(scope: Any) -> Any:
        inp, stream = scope.new_input()
        return inp, stream.probe()

    inp, _ = worker.dataflow(build)
    if not worker.joining:
        inp.send(worker.index)
        inp.close()
    worker.step_until_done()
    time.sleep(1.0)
    return "joiner" if worker.joining else "member"


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_a_join_that_cannot_complete_is_abandoned_and_the_job_ends(runtime: str) -> None:
    """Joining a job whose dataflows ended fails (nobody serves the bootstrap, or the members
    are gone) with ``ControlError``; the worker started for it is told to end, so the job's
    ``result()`` returns instead of waiting forever for a joiner that never joins."""
    from tokenflow.control import ControlError

    handle = start(ended_dataflows, workers=2, runtime=runtime, slots=3)
    time.sleep(0.5)
    with pytest.raises(ControlError):
        handle.add_worker(timeout=2.0)
    assert sorted(handle.roster) == [0, 1]
    results = handle.result(timeout=60)
    assert results[:2] == ["member", "member"]


def joiner_dies(when: str) -> Any:
    """A word count whose joined worker SIGKILLs itself ``"before"`` it joins or ``"after"``
    it joined and ran for 0.5 s; the other workers feed 100 epochs over 10 s."""

    def run(worker: Any) -> str:
        import os
        import signal

        if worker.joining and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        inp, _ = worker.dataflow(counting)
        if worker.joining:
            inp.close()
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
            os.kill(os.getpid(), signal.SIGKILL)
        for e in range(100):
            for i in range(30):
                inp.send(f"w{(i * 7 + e) % 50}")
            inp.advance_to(e + 1)
            deadline = time.monotonic() + 0.1
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return "member"

    return run


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_joined_worker_that_dies_fails_the_job_clearly(when: str) -> None:
    """SIGKILL of a joining worker (before its join completed, or after it owned bins) fails
    the job at once with the worker named, and a command that can no longer be answered
    says why (the job failed, and how) rather than only that replies stopped."""
    from tokenflow.control import ControlError
    from tokenflow.execute import WorkerError

    handle = start(joiner_dies(when), workers=2, runtime="process", bins=BINS, slots=3)
    time.sleep(0.5)
    began = time.monotonic()
    if when == "before":
        with pytest.raises(ControlError, match=r"the job failed: worker 2 was killed by SIGKILL"):
            handle.scale(3)
    else:
        assert handle.scale(3) == [0, 1, 2]
        time.sleep(1.0)  # the joiner has died by now
        with pytest.raises(ControlError, match=r"the job failed: worker 2 was killed by SIGKILL") \
                as failed:
            handle.scale(2)  # remove_worker, whose rescale is a command of its own
        assert str(failed.value).count("the job failed") == 1
    with pytest.raises(WorkerError, match=r"worker 2 was killed by SIGKILL"):
        handle.result(timeout=30)
    assert time.monotonic() - began < 15  # well before the feeders' 10 s of epochs end


def busy_member(sleep: float, mark: str | None = None) -> Any:
    """A word count whose worker 1 spends ``sleep`` s in user code before its fourth epoch
    (answering no command meanwhile), creating the file ``mark`` as it starts to; a joined
    worker only closes its input.  Returns each worker's output records as
    ``(time, (word, running count))``."""

    def run(worker: Any) -> list[tuple[int, Any]]:
        def build(scope: Any) -> Any:
            inp, handle = counting(scope)
            return inp, handle.stream.capture()

        inp, capture = worker.dataflow(build)
        if not worker.joining:
            for e in range(30):
                if e == 3 and worker.index == 1:  # after steps: connected to the coordinator
                    if mark is not None:
                        open(mark, "w").close()  # noqa: SIM115 - an empty marker file
                    time.sleep(sleep)
                inp.send_batch([f"w{(i * 7 + e * worker.index) % 50}" for i in range(30)])
                inp.advance_to(e + 1)
                worker.step_or_park(0.01)
        inp.close()
        worker.step_until_done()
        return [(t, r) for t, batch in capture.by_time().items() for r in batch]

    return run


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_a_join_that_times_out_in_a_live_job_is_abandoned_and_the_output_is_right(
        tmp_path: Any) -> None:
    """A member that answers no command (busy in user code) makes ``add_worker`` time out
    after one member already admitted the joiner; the joiner is abandoned, the roster stays,
    the command fails within its timeout and the job ends with the output of a run that no
    worker tried to join."""
    from collections import Counter

    from tokenflow.control import ReplyTimeout

    mark = tmp_path / "asleep"
    handle = start(busy_member(4.0, str(mark)), workers=2, runtime="process", bins=BINS,
                   slots=3)
    while not mark.exists():
        time.sleep(0.01)
        assert handle.running
    began = time.monotonic()
    with pytest.raises(ReplyTimeout, match=r"no 'admitted' reply from workers \[1\]"):
        handle.add_worker(timeout=1.0)
    assert time.monotonic() - began < 3.0  # the timeout, not the member's sleep
    assert handle.roster == [0, 1]
    results = handle.result(timeout=60)
    alone = execute(busy_member(0.0), workers=2, runtime="thread", bins=BINS)
    assert results[2] == []  # the abandoned joiner produced nothing
    assert Counter(r for w in results[:2] for r in w) == Counter(r for w in alone for r in w)
    assert sum(len(w) for w in alone) > 0
