"""Megaphone migration: a running word count whose bins move between workers at logical
times produces exactly the output of a run without moves (and of a plain Counter), and only
the bins whose owner changes move."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
from running_counts import running_counts

from tokenflow import execute
from tokenflow.dataflow.state import key_bins
from tokenflow.rescale import STRATEGIES, megaphone_fold, plan
from tokenflow.state.bins import RoutingTable

WORKERS = 4
EPOCHS = 40
BINS = 64


def words(worker: int, epoch: int) -> list[str]:
    rng = random.Random(worker * 1000 + epoch)
    return [f"w{int(rng.paretovariate(1.2)) % 50}" for _ in range(30)]


def tables() -> list[RoutingTable]:
    """2 -> 3 -> 4 -> 3 -> 2 active workers out of 4 (the others own no bin)."""
    start = RoutingTable(RoutingTable.even(2, BINS).owners, range(WORKERS))
    out = [start]
    for roster in ([0, 1, 2], [0, 1, 2, 3], [0, 1, 3], [1, 3]):
        out.append(out[-1].rebalanced(roster))
    return out


def job(schedule: dict[int, RoutingTable], strategy: str, pace: float = 0.0) -> Any:
    """The running word count; worker 0 asks for ``schedule[e]`` before epoch ``e``; with
    ``pace``, each epoch lasts that many seconds (steps in between)."""
    import time

    def run(worker: Any) -> dict[str, Any]:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]),
                                    initial=tables()[0])
            return inp, handle, handle.stream.capture()

        inp, handle, capture = worker.dataflow(build)
        for e in range(EPOCHS):
            if worker.index == 0 and e in schedule:
                handle.controller.rescale(schedule[e], strategy, batch_bins=4)
            for w in words(worker.index, e):
                inp.send(w)
            inp.advance_to(e + 1)
            for _ in range(3):
                worker.step()
            deadline = time.monotonic() + pace
            while time.monotonic() < deadline:
                worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return {"out": capture.by_time(), "moved": list(handle.moved),
                "loads": list(handle.shared.loads),
                "keys": sorted(handle.state.data),
                "issued": list(handle.controller.issued)}

    return run


def outputs(results: list[dict[str, Any]]) -> dict[int, Counter[Any]]:
    merged: dict[int, Counter[Any]] = {}
    for r in results:
        for t, records in r["out"].items():
            merged.setdefault(t, Counter()).update(records)
    return merged


def oracle() -> dict[int, Counter[Any]]:
    return running_counts([w for worker in range(WORKERS) for w in words(worker, e)]
                          for e in range(EPOCHS))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_moves_keep_the_output_and_move_only_changed_bins(strategy: str) -> None:
    ts = tables()
    schedule = {8: ts[1], 16: ts[2], 24: ts[3], 32: ts[4]}
    results = execute(job(schedule, strategy), workers=WORKERS, runtime="thread")
    assert outputs(results) == oracle()
    # every changed bin moved exactly once per step of its table change, by its old owner
    expected_moves = sum(len(m) for a, b in zip(ts, ts[1:], strict=False)
                         for step in plan(a, b, strategy) for m in [step])
    moved = sum(s.bins for r in results for s in r["moved"])
    assert moved == expected_moves
    assert sum(s.bytes for r in results for s in r["moved"]) > 0
    # at the end each worker holds exactly the keys of the bins it owns in the last table
    final = ts[-1]
    for w, r in enumerate(results):
        if r["keys"]:
            owners = final.owners[key_bins(r["keys"], BINS)]
            assert set(owners.tolist()) == {w}
    assert not results[0]["keys"] and not results[2]["keys"]  # workers 0 and 2 own no bin


def all_at_once_in_small_slices(monkeypatch: pytest.MonkeyPatch, budget: float) -> Any:
    """The four all-at-once changes on the thread runtime with ``budget`` seconds of
    migration work per activation (``SLICE_SECONDS``) and slices down to one bin; the
    workers' results, their output checked against the oracle."""
    import tokenflow.rescale.megaphone as mp

    monkeypatch.setattr(mp, "SLICE_SECONDS", budget)
    monkeypatch.setattr(mp, "MAX_SLICES", 10_000)
    ts = tables()
    results = execute(job({8: ts[1], 16: ts[2], 24: ts[3], 32: ts[4]}, "all-at-once"),
                      workers=WORKERS, runtime="thread")
    assert outputs(results) == oracle()
    return results


def test_steps_sent_and_loaded_in_one_bin_slices_keep_the_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no time budget (one slice per activation) and slices allowed down to one bin, an
    all-at-once step leaves its old owner over several activations and is loaded over several
    on the new one; records at the step's time wait for the last slice on both ends."""
    results = all_at_once_in_small_slices(monkeypatch, budget=0.0)
    ts = tables()
    steps = [s for r in results for s in r["moved"]]
    assert sum(s.bins for s in steps) == sum(len(m) for a, b in zip(ts, ts[1:], strict=False)
                                             for m in plan(a, b, "all-at-once"))
    assert max(s.slices for s in steps) > 1  # a step went out over several activations
    assert all(s.due <= s.sent and s.longest > 0 for s in steps if s.slices)
    # an activation's thread CPU time is recorded
    assert any(s.longest_cpu > 0 for s in steps)
    loads = [s for r in results for s in r["loads"]]
    assert loads and max(s.slices for s in loads) > 1
    assert all(s.arrived <= s.loaded for s in loads)
    assert any(s.longest_cpu > 0 for s in loads)
    # the time an activation held its worker is recorded, between its CPU and wall time
    assert any(s.longest_held > 0 for s in steps) and any(s.longest_held > 0 for s in loads)
    for s in [*steps, *loads]:
        assert s.longest_cpu - 0.002 <= s.longest_held <= s.longest


def test_slices_of_one_activation_are_measured_as_one_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget no step exhausts, a step's slices all run in one activation of F: the
    worker ran nothing else between them, so its longest block of work (``StepStats.longest``)
    is at least the wall time of all its takes together, not that of its longest slice."""
    results = all_at_once_in_small_slices(monkeypatch, budget=10.0)
    steps = [s for r in results for s in r["moved"] if s.slices]
    assert max(s.slices for s in steps) > 1  # the case under test: several slices a step
    for s in steps:
        assert s.longest >= s.taking, (s.slices, s.longest, s.taking)


def test_plan_moves_only_changed_bins_and_batched_rounds_are_matchings() -> None:
    a = RoutingTable(RoutingTable.even(2, 256).owners, range(4))
    b = a.rebalanced([0, 1, 2, 3])
    changed = set(np.flatnonzero(a.owners != b.owners).tolist())
    for strategy in STRATEGIES:
        steps = plan(a, b, strategy, batch_bins=8)
        moved = [m.bin for step in steps for m in step]
        assert sorted(moved) == sorted(changed)
        assert all(m.old == a.owner(m.bin) and m.new == b.owner(m.bin) for s in steps for m in s)
    assert len(plan(a, b, "all-at-once")) == 1
    assert len(plan(a, b, "fluid")) == len(changed)
    for step in plan(a, b, "batched", batch_bins=8):
        pairs = {(m.old, m.new) for m in step}
        assert len({o for o, _ in pairs}) == len(pairs) == len({n for _, n in pairs})
        assert all(sum(1 for m in step if (m.old, m.new) == p) <= 8 for p in pairs)


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_keep_the_output(seed: int) -> None:
    """Random rosters at random epochs, random strategy: the output is always the oracle's."""
    rng = random.Random(seed)
    table = tables()[0]
    schedule: dict[int, RoutingTable] = {}
    for e in sorted(rng.sample(range(1, EPOCHS - 2), rng.randint(1, 6))):
        roster = sorted(rng.sample(range(WORKERS), rng.randint(1, WORKERS)))
        table = table.rebalanced(roster)
        schedule[e] = table
    results = execute(job(schedule, rng.choice(STRATEGIES)), workers=WORKERS, runtime="thread")
    assert outputs(results) == oracle()


@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_moves_on_the_process_runtime() -> None:
    ts = tables()
    schedule = {8: ts[1], 16: ts[2], 24: ts[3], 32: ts[4]}
    results = execute(job(schedule, "batched"), workers=WORKERS, runtime="process")
    assert outputs(results) == oracle()
    assert sum(s.bins for r in results for s in r["moved"]) == sum(
        int((a.owners != b.owners).sum()) for a, b in zip(ts, ts[1:], strict=False))


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_rescale_from_the_driver(runtime: str) -> None:
    """``JobHandle.rescale`` through the control plane, while the job runs paced: the output
    is still the oracle's and bins moved to the roster."""
    import time

    from tokenflow.job import start

    handle = start(job({}, "batched", pace=0.05), workers=WORKERS, runtime=runtime, bins=BINS)
    time.sleep(0.5)
    steps = [handle.rescale(3), handle.rescale([0, 1, 2, 3], "fluid")]
    time.sleep(0.3)
    steps.append(handle.rescale([3], "all-at-once"))
    results = handle.result(timeout=120)
    assert outputs(results) == oracle()
    assert steps[0] > 0 and steps[2] == 1
    assert [bool(r["keys"]) for r in results] == [False, False, False, True]


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")
def test_moves_on_spark(spark: Any) -> None:
    """The running word count through 2 -> 3 -> 4 -> 3 -> 2 as four barrier tasks of the test
    session's ``local[4]``: the oracle's output, and every changed bin moved once."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import it
    ts = tables()
    schedule = {8: ts[1], 16: ts[2], 24: ts[3], 32: ts[4]}
    results = execute(job(schedule, "batched"), workers=WORKERS, runtime="spark",
                      master="local[4]")
    assert outputs(results) == oracle()
    assert sum(s.bins for r in results for s in r["moved"]) == sum(
        int((a.owners != b.owners).sum()) for a, b in zip(ts, ts[1:], strict=False))


def test_spread_steps_are_one_data_time_step_apart_not_the_first_jump() -> None:
    """With ``spread``, a change's steps are one data time step apart (``data_step`` of the
    moves of the data frontier after its first, which leaves the initial time for the data's first epoch
    (a restored NEXMark job's frontier jumps 0 -> 1.4e12 ms; taken as a step, a change's
    steps landed after the end of the data).  Before any real step is seen: consecutive."""
    from tokenflow.rescale.megaphone import control_stream

    start = 1_436_918_400_000

    def run(worker: Any) -> list[list[int]]:
        frontier = [0]
        table = tables()[0]

        def build(scope: Any) -> Any:
            return control_stream(scope, table, lambda: list(frontier), spread=True)[1]

        controller = worker.dataflow(build)
        controller.activate()
        worker.step()  # the source sees the initial time
        changes = []
        for times, roster in (([start], [0, 1, 2]), ([start + 500, start + 1000], [0, 1, 2, 3])):
            for t in times:
                frontier[:] = [t]
                controller.activate()
                worker.step()
            before = len(controller.issued)
            controller.rescale(controller.table.rebalanced(roster), "fluid")
            worker.step()
            changes.append([t for t, _ in controller.issued[before:]])
        frontier[:] = []
        controller.activate()
        worker.step_until_done()
        return changes

    first, second = execute(run, workers=1, runtime="thread")[0]
    assert len(first) > 1 and len(second) > 1
    assert first[0] == start + 1 and np.diff(first).tolist() == [1] * (len(first) - 1)
    assert second[0] > first[-1] and np.diff(second).tolist() == [500] * (len(second) - 1)


def test_the_data_step_is_an_epoch_not_a_crawl_within_one_nor_a_catch_up() -> None:
    """A frontier that crawls within its epochs (q4's ``Q4Average``, fed by tokens at
    auctions' expiry times: most moves 1 ms, the others 95-100 ms) and now and then catches up
    by seconds: its data step is the epoch, so a fluid change puts one step in each epoch
    rather than all of them in one.  A job ahead of real time moves by one or several epochs:
    its step is one epoch (not the several, which made fluid changes run longer); integer
    epochs give 1, no moves 1."""
    from tokenflow.rescale.megaphone import STEP_MOVES, data_step

    rng = np.random.default_rng(4)
    for _ in range(20):
        moves = [int(m) for m in rng.choice([1, 1, 1, 2, 5], STEP_MOVES)]
        epochs = rng.choice(STEP_MOVES, STEP_MOVES * 2 // 5, replace=False)
        for i in epochs[:-3]:
            moves[i] = int(rng.integers(95, 101))
        for i in epochs[-3:]:  # catch-ups after stalls
            moves[i] = int(rng.integers(300, 4_500))
        assert 95 <= data_step(moves) <= 100
        # ahead of real time: one or several epochs of 200 at once, and the crawl
        ahead = [int(m) for m in rng.choice([1, 2, 200, 400, 600, 1_000], STEP_MOVES)]
        if 200 in ahead:
            assert data_step(ahead) == 200
    assert data_step([1] * 40 + [3]) == 1
    assert data_step([]) == 1
    assert data_step([100] * 10) == 100
    assert data_step([200, 400, 400, 800, 1_000, 1_000]) == 200  # a least epoch move


def test_checkpointed_router_keeps_the_table_of_an_epoch_its_data_passed() -> None:
    """A checkpoint captured at epoch ``e`` after the data frontier passed later steps asks
    ``table_at(e)``: with ``keep_from`` at or below ``e`` (a checkpointed job's), the router
    still has the table in effect at ``e``; versions before ``keep_from`` are dropped."""
    ts = tables()

    def run(worker: Any) -> list[Any]:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]),
                                    initial=ts[0])
            return inp, handle, handle.stream.probe()

        inp, handle, probe = worker.dataflow(build)
        controller = handle.controller
        controller.keep_from = 0
        for e in range(30):  # every worker's data frontier passes e before any goes on
            if worker.index == 0 and e in (5, 10):
                controller.rescale(ts[1] if e == 5 else ts[2], "all-at-once")
            inp.send(f"w{e}")
            inp.advance_to(e + 1)
            while probe.less_than(e + 1):
                worker.step()
        tables_seen = [controller.table_at(e).owners.tolist() for e in (3, 7, 25)]
        controller.keep_from = 20
        inp.advance_to(31)
        while probe.less_than(31):
            worker.step()
        try:
            controller.table_at(3)
            dropped = False
        except AssertionError:
            dropped = True
        inp.close()
        worker.step_until_done()
        return [tables_seen, dropped, controller.table_at(25).owners.tolist(),
                [t for t, _ in controller.issued]]

    results = execute(run, workers=WORKERS, runtime="thread")
    first, second = results[0][3]  # the two steps, on worker 0: epochs 3, 7, 25 around them
    assert 3 < first <= 7 < second <= 20
    for seen, dropped, later, _ in results:
        assert seen == [ts[0].owners.tolist(), ts[1].owners.tolist(), ts[2].owners.tolist()]
        assert dropped and later == ts[2].owners.tolist()


def test_a_slice_is_sized_for_half_the_budget_at_the_last_rate_and_at_most_doubles() -> None:
    """``_Send.next_slice``: the last slice's rate scaled to half of ``SLICE_SECONDS`` (a
    bin's cost varies within a step), within [half, twice] the last slice and never below
    ``least`` (a step goes out in at most ``MAX_SLICES``)."""
    import tokenflow.rescale.megaphone as mp

    budget = mp.SLICE_SECONDS
    send = mp._Send(0, [], [mp.Move(b, 0, 1) for b in range(1_600)])
    assert send.least == 1_600 // mp.MAX_SLICES
    assert send.next_slice(400, budget / 2) == 400  # at the target rate: the same again
    assert send.next_slice(400, budget) == 200  # twice the target: halved
    assert send.next_slice(400, budget / 8) == 800  # far below: at most doubled
    assert send.next_slice(400, budget * 10) == 200  # far above: at most halved
    assert send.next_slice(120, budget) == send.least  # never below a 16th of the step
    assert send.next_slice(150, budget / 3) == 225  # 150 * (budget / 2) / (budget / 3)
