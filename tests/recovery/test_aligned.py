"""Aligned checkpoints (``tokenflow.control``): sources do not wait for the driver or for
another worker's capture; records of the checkpoint's epoch and later wait at an operator's
input until its worker has captured, and records sent before the epoch after a capture wait
until every worker has.  A checkpoint taken that way restores to output identical to a
failure-free run; records an operator sends at the epoch or later while its worker aligns are
stored as channel state and sent again by the restored job; a checkpoint whose captures are
not a consistent cut is discarded and taken again by the quiescent protocol; a SIGKILL while
aligning or right after a capture is recovered."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from recovery_jobs import NAME, committed_rows, wait_for, wordcount

from tokenflow import execute
from tokenflow.control import take_snapshot
from tokenflow.dataflow.operators.builder import OperatorBuilder
from tokenflow.io import to_parquet
from tokenflow.io.sources import replayable_source, table_splits
from tokenflow.job import start
from tokenflow.recovery import CheckpointedJob
from tokenflow.state.snapshot import committed_epochs
from tokenflow.worker import Traffic

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_the_barrier_holds_later_records_and_the_defer_keeps_earlier_ones() -> None:
    traffic = Traffic()
    assert not traffic.holds(10) and not traffic.defers(3)
    traffic.barrier = 10
    assert traffic.holds(10) and traffic.holds(11) and not traffic.holds(9)
    assert traffic.holds((12, 0)) and not traffic.holds((9, 5))  # nested: the outer time
    woken: list[str] = []

    class Input:
        def release(self) -> None:
            woken.append("input")

    traffic.held.append(Input())
    for held in traffic.lift():
        held.release()
    assert traffic.barrier is None and not traffic.held and woken == ["input"]
    pushed: list[Any] = []

    class Pusher:
        def push(self, message: Any) -> None:
            pushed.append(message)

    traffic.defer = 10
    assert traffic.defers(9) and not traffic.defers(10)
    traffic.deferred.append((Pusher(), (9, ["a"])))
    traffic.deferred.append((Pusher(), (8, ["b"])))
    assert traffic.release_deferred() == 2
    assert pushed == [(9, ["a"]), (8, ["b"])] and traffic.defer is None


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_an_aligned_checkpoint_of_a_running_job_restores_to_the_same_output(
        tmp_path: Path, table, expected, runtime: str) -> None:
    """Snapshots taken while the sources keep running: each is aligned (no source waited for
    the driver), and a job restored from the last one and run to the end commits what a
    failure-free run commits."""
    out, snap = tmp_path / "out", str(tmp_path / "snap")
    handle = start(wordcount(table, str(out), pace=0.01), workers=2, runtime=runtime, name=NAME)
    stats: list = []
    previous = None
    for _ in range(3):
        epoch = take_snapshot(handle.hub, [0, 1], snap, NAME, handle.spec.table, stop=False,
                              alive=lambda: handle.running, previous=previous, stats=stats)
        previous = epoch if epoch is not None else previous
        time.sleep(0.1)
    handle.result(timeout=180)
    assert stats and all(s.protocol == "aligned" and not s.discarded for s in stats), stats
    assert all(s.phases["captured"] <= s.phases["written"] for s in stats)
    # restore the last snapshot into a fresh output directory: the epochs after it are
    # recomputed from the recorded positions, those before it come from the first run
    assert previous is not None and committed_epochs(snap)[-1] == previous
    resumed = CheckpointedJob(wordcount(table, str(out)), workers=2, runtime=runtime,
                              checkpoint=snap, interval=0.2, name=NAME, restore=True)
    resumed.run()
    assert [e.epoch for e in resumed.events if e.kind == "restore"] == [previous]
    assert committed_rows(out) == expected


def eager_wordcount(table: Any, output: str, pace: float = 0.0, verify: bool = False) -> Any:
    """The word count with an operator that forwards each record at its time + 2 at once
    (holding no token there first): such records can cross an aligned checkpoint's cut.  Those
    sent while the worker aligns are the checkpoint's channel state; one sent before the
    ``hold`` round began is not recorded, and the driver must see the cut is not consistent."""
    from tokenflow.dataflow.operators.stateful import state_machine

    def job(worker: Any) -> None:
        def build(scope: Any) -> None:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", max_rows=100)

            def slow(batch: Any) -> list[tuple[str, int]]:
                if pace:
                    time.sleep(pace)
                return [(w, 1) for w in batch.column("word").to_pylist()]

            pairs = words.map_batch(slow)
            builder = OperatorBuilder("Later", scope)
            inp = builder.new_input(pairs, "pipeline")
            out, later = builder.new_output()

            def constructor(caps: list[Any]) -> Any:
                for cap in caps:
                    cap.drop()

                def logic(frontiers: Any) -> None:
                    for ref, batch in inp:
                        out.give_batch(ref.delayed(ref.time + 2), list(batch))

                return logic

            builder.build(constructor)
            counts = state_machine(later, lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            to_parquet(counts, output, columns=["word", "count"], verify=verify)

        worker.dataflow(build)

    return job


@pytest.mark.parametrize(("runtime", "after"), [("thread", 3), ("process", 2)])
def test_records_sent_across_the_cut_are_channel_state_and_sent_again_on_restore(
        tmp_path: Path, table, runtime: str, after: int) -> None:
    """The eager operator sends at ``t + 2`` as soon as it receives ``t``, so while a worker
    aligns at ``e`` it sends at ``e`` and ``e + 1`` before capturing: those messages are the
    checkpoint's channel state (``SnapshotStats.crossing``) and the checkpoint stands.  A job
    restored from it (at ``after`` workers: the state's home bin may have another owner) sends
    them again: every epoch from the snapshot on is recomputed and checked against what the
    failure-free part of the run committed (``verify=True`` fails on any difference), and
    the output equals an uninterrupted run's."""
    whole = tmp_path / "whole"
    execute(eager_wordcount(table, str(whole)), workers=2, name=NAME)
    out, snap = tmp_path / "out", str(tmp_path / "snap")
    handle = start(eager_wordcount(table, str(out), pace=0.01), workers=2, runtime=runtime,
                   name=NAME)
    stats: list[Any] = []
    previous = None
    while not (stats and stats[-1].crossing) and handle.running:
        epoch = take_snapshot(handle.hub, [0, 1], snap, NAME, handle.spec.table, stop=False,
                              alive=lambda: handle.running, previous=previous, stats=stats,
                              margin=2)
        previous = epoch if epoch is not None else previous
    handle.result(timeout=180)
    assert stats and stats[-1].crossing > 0, [(s.protocol, s.crossing, s.discarded) for s in stats]
    assert stats[-1].protocol == "aligned" and committed_epochs(snap)[-1] == stats[-1].epoch
    execute(eager_wordcount(table, str(out), verify=True), workers=after, runtime=runtime,
            restore=snap, name=NAME)
    assert committed_rows(out) == committed_rows(whole)


def test_a_checkpoint_whose_cut_is_not_consistent_is_taken_again_by_the_quiescent_protocol(
        tmp_path: Path, table) -> None:
    whole = tmp_path / "whole"
    execute(eager_wordcount(table, str(whole)), workers=2, name=NAME)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = CheckpointedJob(eager_wordcount(table, str(out), pace=0.01), workers=2,
                          runtime="thread", checkpoint=ckpt, interval=0.05, name=NAME)
    job.start()
    wait_for(lambda: any(s.discarded for s in job.stats), timeout=120)
    job.stop()
    job.result(timeout=120)
    from tokenflow.control import ALIGNED_ATTEMPTS

    fallback = [s for s in job.stats if s.discarded]  # retried aligned, then quiescent
    assert all(s.protocol == "quiescent" or len(s.discarded) < ALIGNED_ATTEMPTS for s in fallback)
    assert all(len(s.discarded) <= ALIGNED_ATTEMPTS for s in fallback)
    # restart from the last checkpoint (a quiescent one or an aligned one): same output
    resumed = CheckpointedJob(eager_wordcount(table, str(out)), workers=2, runtime="thread",
                              checkpoint=ckpt, interval=0.05, name=NAME, restore=True)
    resumed.run()
    assert committed_rows(out) == committed_rows(whole)


@pytest.mark.parametrize("point", ["checkpoint.align", "checkpoint.resumed"])
def test_sigkill_during_an_aligned_checkpoint_is_recovered(tmp_path: Path, table, expected,
                                                           point: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process SIGKILLs itself while aligning (its barrier up, records waiting at its
    inputs) or right after its capture (sources resumed, part not written, records before the
    epoch kept back), armed once a checkpoint is committed."""
    trigger, ckpt = tmp_path / "trigger", tmp_path / "ckpt"
    monkeypatch.setenv("TOKENFLOW_CRASH", f"{point}={trigger}")
    job = CheckpointedJob(wordcount(table, str(tmp_path / "out"), pace=0.01), workers=2,
                          runtime="process", checkpoint=ckpt, interval=0.1, name=NAME)
    job.start()
    wait_for(lambda: len(committed_epochs(ckpt)) >= 1)
    trigger.touch()
    job.result(timeout=180)
    assert not trigger.exists(), f"no worker reached {point}: the test proves nothing"
    assert job.failures == 1
    assert committed_rows(tmp_path / "out") == expected
    assert any(s.protocol == "aligned" for s in job.stats)
    assert os.listdir(ckpt)



BUSY = {0: [10, 11, 13, 20], 1: [12]}
"""``busy`` (``fake_worker``): the times at which each worker's view has operator tokens."""


def fake_worker(hub: Any, w: int, how: str) -> None:
    """A worker that speaks the control protocol without a job: its aligned capture never
    comes (``stuck``) or reports counters that do not add up (``crossed``: a record sent before
    its sender's capture and received after its receiver's; ``crossed-once``: only at the
    first attempt); quiescent snapshots work."""
    from tokenflow.state.snapshot import write_worker_part

    link = hub.link(w)
    sent = 0
    attempts = 0

    def write(m: dict[str, Any], reply: dict[str, Any]) -> None:
        part = write_worker_part(m["root"], job=m["job"], epoch=m["epoch"], worker=w,
                                 bins=64, states={}, meta={})
        link.send({**reply, "kind": "written", "index_path": part.index_path,
                   "crc32": part.crc32, "bytes_written": part.bytes_written,
                   "bytes_reused": part.bytes_reused})
    while True:
        m = link.poll(10.0)
        if m is None or m["kind"] == "stop":
            return
        kind, r = m["kind"], m["round"]
        reply: dict[str, Any] = {"worker": w, "round": r}
        if kind == "hold":
            busy = BUSY[w] if how == "busy" else []
            link.send({**reply, "kind": "held", "point": 10 + sent, "granularity": 1,
                       "busy": busy})
        elif kind == "checkpoint" and how == "busy":
            link.send({**reply, "kind": "captured", "epoch": m["epoch"], "sent": 0,
                       "received": 0, "settled": True})
            write(m, reply)
        elif kind == "checkpoint" and how.startswith("crossed"):
            attempts += 1
            crossed = how == "crossed" or attempts == 1
            link.send({**reply, "kind": "captured", "epoch": m["epoch"],
                       "sent": 5 * w if crossed else 0, "received": 0, "settled": True})
            if not crossed:
                write(m, reply)
        elif kind == "pause_at":
            link.send({**reply, "kind": "paused", "epoch": m["epoch"]})
        elif kind == "drain":
            link.send({**reply, "kind": "idle", "sent": 0, "received": 0, "settled": True})
        elif kind == "snapshot":
            link.send({**reply, "kind": "captured", "epoch": m["epoch"]})
            write(m, reply)
        elif kind == "resume":
            sent += 1


def snapshot_of_fake_workers(tmp_path: Path, how: str, align_timeout: float) -> tuple[Any, list]:
    """``take_snapshot`` (stopping) of two ``fake_worker`` threads; its epoch and stats."""
    import threading

    from tokenflow.control import QueueHub
    from tokenflow.state.bins import RoutingTable

    hub = QueueHub(2)
    threads = [threading.Thread(target=fake_worker, args=(hub, w, how), daemon=True)
               for w in (0, 1)]
    for t in threads:
        t.start()
    stats: list = []
    epoch = take_snapshot(hub, [0, 1], str(tmp_path / "snap"), NAME, RoutingTable.even(2, 64),
                          stop=True, stats=stats, align_timeout=align_timeout)
    for t in threads:
        t.join(10)
    return epoch, stats


@pytest.mark.parametrize("how", ["stuck", "crossed", "crossed-once"])
def test_an_aligned_checkpoint_that_fails_is_taken_again_by_the_quiescent_protocol(
        tmp_path: Path, how: str) -> None:
    """Captures that are not a consistent cut are tried again aligned at a later epoch, up to
    ``ALIGNED_ATTEMPTS`` in all, then quiescent; an alignment that does not complete goes
    quiescent at once."""
    from tokenflow.control import ALIGNED_ATTEMPTS

    epoch, stats = snapshot_of_fake_workers(tmp_path, how, align_timeout=0.5)
    assert epoch is not None and committed_epochs(tmp_path / "snap") == [epoch]
    (s,) = stats
    if how == "crossed-once":
        assert s.protocol == "aligned" and len(s.discarded) == 1
    else:
        assert s.protocol == "quiescent"
        assert len(s.discarded) == (1 if how == "stuck" else ALIGNED_ATTEMPTS)
    assert s.stuck == (how == "stuck")
    assert ("did not complete" if how == "stuck" else "not a consistent cut") in s.discarded[0]


def test_an_input_sets_aside_records_at_the_barrier_and_hands_over_those_behind_them() -> None:
    """A channel does not order times: a record before the barrier behind one at it must still
    come (waiting for it behind the held one kept a q4 alignment from ever completing)."""
    from collections import deque

    from tokenflow.dataflow.operators.builder import OperatorCore, OperatorInput

    class Puller:
        def __init__(self, messages: list[Any]) -> None:
            self.queue = deque(messages)

        def pull(self) -> Any:
            return self.queue.popleft() if self.queue else None

    traffic = Traffic()
    core = OperatorCore("Op", 1, (0, 1), 1, 0, True)
    puller = Puller([(10, ["at"]), (9, ["before"]), (12, ["after"])])
    inp = OperatorInput(core, 0, puller, traffic)
    inp.frontier.update_iter([(0, 1)])
    traffic.barrier = 10
    got = [(ref.time, batch) for ref, batch in inp]
    assert got == [(9, ["before"])] and traffic.received == 1 and traffic.held == [inp]
    traffic.barrier = 12  # a later barrier: the record at 10 comes, the one at 12 still waits
    traffic.lift()
    traffic.barrier = 12
    assert [(ref.time, batch) for ref, batch in inp] == [(10, ["at"])]
    assert traffic.held == [inp]
    for held in traffic.lift():
        assert held is inp
    assert [(ref.time, batch) for ref, batch in inp] == [(12, ["after"])]
    assert traffic.received == 3


def test_an_aligned_checkpoint_is_not_taken_at_a_time_an_operator_holds_a_token_at(
        tmp_path: Path) -> None:
    """The common epoch skips the times the workers report ``busy`` (an operator would send
    there during the alignment): points 10, busy 10-13 (over both workers), so epoch 14."""
    epoch, stats = snapshot_of_fake_workers(tmp_path, "busy", align_timeout=5.0)
    assert epoch == 14 and stats[0].protocol == "aligned" and not stats[0].discarded
