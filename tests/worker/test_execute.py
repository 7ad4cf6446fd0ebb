"""``execute`` and the ``Worker``: argument errors, failures in one worker, cycle detection and
activation (an operator is scheduled only when something happened to it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tokenflow.comm.thread import ThreadFabric
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.operators.builder import OperatorBuilder, OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary
from tokenflow.dataflow.operators.probe import ProbeHandle
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.stream import Stream
from tokenflow.execute import WorkerError, execute
from tokenflow.progress.reachability import CycleError
from tokenflow.worker import Worker


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tokenflow-worker-")]


# -- arguments ---------------------------------------------------------------------------------


def test_unknown_runtime() -> None:
    with pytest.raises(ValueError, match="unknown runtime 'gpu'.*thread"):
        execute(lambda w: None, workers=1, runtime="gpu")


@pytest.mark.parametrize("workers", [0, -2])
def test_workers_must_be_positive(workers: int) -> None:
    with pytest.raises(ValueError, match=f"workers must be >= 1, got {workers}"):
        execute(lambda w: None, workers=workers)


@pytest.mark.parametrize("workers", [1, 3])
def test_results_in_worker_order(workers: int) -> None:
    assert execute(lambda w: (w.index, w.peers), workers=workers) == [
        (i, workers) for i in range(workers)]


# -- a failing worker ----------------------------------------------------------------------------


def failing_job(bad_worker: int, epochs: int = 50) -> Callable[[Worker], int]:
    """Every worker runs input -> exchange -> Boom -> probe; Boom raises on ``bad_worker`` when
    it sees a record of epoch 3.  The healthy workers are busy waiting on the probe, which can
    never pass epoch 3 now."""

    def job(worker: Worker) -> int:
        def boom(cap: Capability, info: OperatorInfo) -> Callable[..., None]:
            cap.drop()

            def logic(inp: OperatorInput, out: OperatorOutput) -> None:
                for ref, batch in inp:
                    if info.worker_index == bad_worker and ref.time == 3:
                        raise ZeroDivisionError(f"boom at {ref.time}")
                    out.give_batch(ref, batch)

            return logic

        def build(scope: Scope) -> tuple[InputHandle, ProbeHandle]:
            inp, s = scope.new_input("In")
            return inp, unary(s.exchange(lambda x: x), "pipeline", "Boom", boom).probe()

        inp, probe = worker.dataflow(build)
        for epoch in range(epochs):
            inp.send_batch(list(range(worker.peers * 4)))  # every worker gets records
            inp.advance_to(epoch + 1)
            worker.step_while(lambda t=epoch + 1: probe.less_than(t))
        inp.close()
        return worker.index

    return job


@pytest.mark.parametrize(("workers", "bad"), [(1, 0), (2, 1), (3, 0), (4, 2)])
def test_operator_error_names_its_worker_and_stops_the_others(workers: int, bad: int) -> None:
    before = len(worker_threads())
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        execute(failing_job(bad), workers=workers)
    elapsed = time.monotonic() - start
    assert elapsed < 5.0
    err = info.value
    assert err.worker == bad
    assert f"worker {bad} failed" in str(err)
    assert "ZeroDivisionError" in str(err) and "boom at 3" in str(err)
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert len(worker_threads()) == before  # every worker thread has finished


def test_error_in_the_worker_function_after_building() -> None:
    def job(worker: Worker) -> None:
        inp = worker.dataflow(lambda scope: scope.new_input("In")[0])
        inp.send("x")
        if worker.index == 1:
            raise KeyError("no such thing")
        # worker 0 waits forever for a dataflow that worker 1 never closes
        worker.step_until_done()

    start = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 failed: KeyError") as info:
        execute(job, workers=2)
    assert time.monotonic() - start < 5.0
    assert info.value.worker == 1


def test_the_same_job_without_the_error_completes() -> None:
    assert execute(failing_job(bad_worker=99, epochs=6), workers=3) == [0, 1, 2]


# -- cycles --------------------------------------------------------------------------------------


def build_with_cycle(scope: Scope) -> None:
    """Alpha -> Beta -> Gamma -> Alpha with identity summaries only."""
    alpha = OperatorBuilder("Alpha", scope)
    _, a_out = alpha.new_output()
    b_out = a_out.map(lambda x: x, name="Beta")
    c_out = b_out.filter(lambda x: True, name="Gamma")
    alpha.new_input(c_out, "pipeline")

    def constructor(caps: list[Capability]) -> Callable[[Any], None]:
        for c in caps:
            c.drop()
        return lambda frontiers: None

    alpha.build(constructor)


def test_cycle_without_feedback_is_rejected_naming_its_operators() -> None:
    worker = Worker(ThreadFabric(1).allocator(0))
    with pytest.raises(CycleError) as info:
        worker.dataflow(build_with_cycle)
    message = str(info.value)
    for name in ("Alpha", "Beta", "Gamma"):
        assert name in message
    assert "feedback" in message


def test_cycle_inside_an_iterative_scope_is_rejected() -> None:
    def build(scope: Scope) -> None:
        _, s = scope.new_input("In")

        def loop(inner: Scope) -> None:
            entered = s.enter(inner)
            build_with_cycle(inner)
            entered.leave()

        scope.iterative(loop)

    worker = Worker(ThreadFabric(1).allocator(0))
    with pytest.raises(CycleError, match="Alpha"):
        worker.dataflow(build)


def test_cycle_error_through_execute() -> None:
    def job(worker: Worker) -> None:
        worker.dataflow(build_with_cycle)

    with pytest.raises(WorkerError, match="CycleError") as info:
        execute(job, workers=2)
    assert isinstance(info.value.__cause__, CycleError)


def test_the_same_cycle_through_a_feedback_edge_is_fine() -> None:
    def build(scope: Scope) -> Any:
        inp, s = scope.new_input("In")

        def loop(inner: Scope) -> Stream:
            handle, fed = inner.feedback(1)
            body = s.enter(inner).concat(fed)
            body.map(lambda x: x - 1, name="Beta").filter(lambda x: x > 0, name="Gamma") \
                .connect_loop(handle)
            return body.leave()

        return inp, scope.iterative(loop).capture()

    def job(worker: Worker) -> Any:
        inp, cap = worker.dataflow(build)
        inp.send_batch([3])
        inp.close()
        return cap

    (cap,) = execute(job, workers=1)
    assert sorted(cap.records()) == [1, 2, 3]


# -- activation ------------------------------------------------------------------------------------


def quiet_operator(stream: Stream, name: str, notify: bool, log: list[int]) -> Stream:
    """A unary operator that counts its invocations (into ``log``) and forwards its input."""

    def constructor(cap: Capability, info: OperatorInfo) -> Callable[..., None]:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            log.append(1)
            for ref, batch in inp:
                out.give_batch(ref, batch)

        return logic

    return unary(stream, "pipeline", name, constructor, notify=notify)


@pytest.mark.parametrize("peers", [1, 2])
def test_idle_operators_are_not_scheduled(peers: int) -> None:
    busy_epochs = 25

    def job(worker: Worker) -> dict[str, Any]:
        plain: list[int] = []
        frontier_aware: list[int] = []
        busy: list[int] = []

        def build(scope: Scope) -> tuple[InputHandle, InputHandle, ProbeHandle, ProbeHandle]:
            busy_in, busy_s = scope.new_input("Busy")
            quiet_in, quiet_s = scope.new_input("Quiet")
            busy_probe = quiet_operator(busy_s.exchange(lambda x: x), "BusyOp", True,
                                        busy).probe()
            quiet_operator(quiet_s, "QuietPlain", False, plain)
            quiet_probe = quiet_operator(quiet_s, "QuietFrontier", True, frontier_aware).probe()
            return busy_in, quiet_in, busy_probe, quiet_probe

        busy_in, quiet_in, busy_probe, quiet_probe = worker.dataflow(build)
        for epoch in range(busy_epochs):
            busy_in.send_batch(list(range(10)))
            busy_in.advance_to(epoch + 1)
            worker.step_while(lambda t=epoch + 1: busy_probe.less_than(t))
        after_busy = (len(plain), len(frontier_aware), len(busy))
        quiet_in.advance_to(1)  # one frontier change for the quiet operators
        worker.step_while(lambda: quiet_probe.less_than(1))
        after_advance = (len(plain), len(frontier_aware))
        busy_in.close()
        quiet_in.close()
        return {"after_busy": after_busy, "after_advance": after_advance}

    for r in execute(job, workers=peers):
        plain, frontier_aware, busy = r["after_busy"]
        assert plain == 1  # the initial scheduling only
        assert frontier_aware == 1
        assert busy >= busy_epochs  # the busy operator did run, once per epoch at least
        # The quiet input's frontier moved once: the frontier-aware operator ran once more,
        # the plain one (scheduled only for data) not at all.
        assert r["after_advance"] == (1, 2)


# -- timeout and capacity --------------------------------------------------------------------------


def never_ending(worker: Worker) -> None:
    while True:
        worker.step()
        time.sleep(0.01)


@pytest.mark.parametrize("workers", [1, 2])
def test_timeout_stops_a_never_ending_job(workers: int) -> None:
    """``timeout=1`` fails the job after about a second with an error that is both a
    ``WorkerError`` and a ``TimeoutError``, and its worker threads end."""
    from tokenflow.execute import JobTimeoutError

    start = time.monotonic()
    with pytest.raises(JobTimeoutError, match=r"^job timed out after 1 s$") as info:
        execute(never_ending, workers=workers, timeout=1)
    assert 1.0 <= time.monotonic() - start < 2.5
    assert isinstance(info.value, WorkerError) and isinstance(info.value, TimeoutError)
    assert info.value.worker == -1
    assert worker_threads() == []


def test_capacity_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    ex = importlib.import_module("tokenflow.execute")  # the package re-exports the function

    monkeypatch.setattr(ex, "available_cores", lambda: 2)
    assert ex.capacity_warning(100, "process") == "100 workers on 2 cores: expect contention"
    assert ex.capacity_warning(2, "process") is None
    assert ex.capacity_warning(100, "thread") is None
    assert ex.capacity_warning(3, "spark") == "3 workers on 2 cores: expect contention"  # local[3]
    assert ex.capacity_warning(4, "spark", "local[2]") == "4 workers need 4 task slots; local[2] has 2"
    assert ex.capacity_warning(4, "spark", "spark://host:7077") is None
    assert ex.local_slots("local[*]") == 2 and ex.local_slots("local[3, 2]") == 3
    assert ex.contention(3, 1) == "3 workers on 1 core: expect contention"


# -- stepping until a wall-clock time ------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["thread", "process"])
def test_step_until_keeps_the_dataflow_running_and_returns_at_the_deadline(runtime: str) -> None:
    """Data sent before ``step_until`` is processed while it waits (the worker steps), and it
    returns only once the deadline has passed."""

    def job(worker: Worker) -> tuple[list[int], float, int]:
        seen: list[int] = []

        def build(scope: Scope) -> tuple[InputHandle, ProbeHandle]:
            inp, stream = scope.new_input()
            return inp, stream.inspect(seen.append).probe()

        inp, probe = worker.dataflow(build)
        inp.send(worker.index)
        inp.advance_to(1)
        deadline = time.time() + 0.2
        steps = worker.steps
        worker.step_until(deadline)
        after = time.time() - deadline
        inp.close()
        worker.step_until_done()
        return seen, after, worker.steps - steps

    for seen, after, steps in execute(job, workers=2, runtime=runtime):
        assert len(seen) == 1  # its own record, processed during the wait (no exchange)
        assert after >= 0  # never returns early
        assert steps >= 2
