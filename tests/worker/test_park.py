"""Parking (``Worker.step_or_park``): a parked worker wakes for an activation from another
thread (``Worker.activate``, ``unpark``; timely's ``SyncActivator``) and for its delayed
activations (``activate_after``), on every allocator, instead of when a timeout passes.

The parks below are given a 30 s timeout: a test that returns at all has been woken (the
bounds asserted are ten times looser than the machine could need)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.comm.test_hardening import JOB, SECRET, form_mesh
from tokenflow import execute
from tokenflow.comm.manual import ManualAllocator, ManualFabric
from tokenflow.comm.tcp import TcpAllocator, TcpMesh, bind_listener
from tokenflow.comm.thread import ThreadFabric
from tokenflow.control import QueueHub
from tokenflow.dataflow.operators.generic import source
from tokenflow.worker import Activations, Worker

LONG = 30.0  # a park's timeout: never reached by a test that passes
WOKEN_WITHIN = 10.0  # seconds: a woken park returned (far below LONG)


def running(worker: Worker) -> Worker:
    """``worker`` with a dataflow that keeps running (an input left open): a worker parks only
    then (timely's rule)."""
    worker.dataflow(lambda scope: scope.new_input()[0])
    return worker


@pytest.fixture(params=["thread", "tcp"])
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    """A worker of a two-worker job whose peer stays silent, over each real allocator, with a
    running dataflow."""
    if request.param == "thread":
        yield running(Worker(ThreadFabric(2).allocator(0)))
        return
    listeners = [bind_listener(), bind_listener()]
    addresses = [tuple(s.getsockname()[:2]) for s in listeners]
    meshes = [TcpMesh(i, 2, listeners[i], SECRET, JOB) for i in range(2)]
    form_mesh(meshes, [addresses, addresses])  # type: ignore[list-item]
    yield running(Worker(TcpAllocator(meshes[0])))
    for mesh in meshes:
        mesh.close()


def timed(call: Callable[[], Any]) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began


def later(delay: float, action: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_activation_from_another_thread_ends_the_park(worker: Worker) -> None:
    for _ in range(3):
        worker.step_or_park(0.0)  # this thread steps the worker; the dataflow has started
    thread = later(0.2, lambda: worker.activate((7,)))
    took = timed(lambda: worker.step_or_park(LONG))
    thread.join()
    assert 0.15 < took < WOKEN_WITHIN
    assert worker.activations.is_empty()  # the step consumed the activation


def test_unpark_before_the_park_is_not_lost(worker: Worker) -> None:
    for _ in range(3):
        worker.step_or_park(0.0)
    threading.Thread(target=worker.unpark).start()
    time.sleep(0.1)  # the wake-up is pending when the worker comes to park
    assert timed(lambda: worker.step_or_park(LONG)) < WOKEN_WITHIN
    # it was consumed: the next park waits for its timeout
    assert timed(lambda: worker.step_or_park(0.2)) >= 0.15


def test_a_delayed_activation_ends_the_park_when_due(worker: Worker) -> None:
    for _ in range(3):
        worker.step_or_park(0.0)
    worker.activate_after((3,), 0.3)
    took = timed(lambda: worker.step_or_park(LONG))
    assert 0.29 <= took < WOKEN_WITHIN  # not before it is due
    assert worker.activations.is_empty()
    assert worker.activations.empty_for() is None


def test_a_worker_without_a_running_dataflow_does_not_park() -> None:
    """Nothing would wake it (timely's rule): ``execute`` steps a worker once more after its
    function returns, which used to wait out a whole park."""
    worker = Worker(ThreadFabric(2).allocator(0))
    assert timed(lambda: worker.step_or_park(LONG)) < WOKEN_WITHIN
    assert not worker.step_or_park(LONG)


def test_activations_from_the_stepping_thread_do_not_wake() -> None:
    """Only another thread's activation pays for a wake-up (a syscall on the TCP mesh)."""
    wakes: list[int] = []

    class Counting(ManualAllocator):
        def wake(self) -> None:
            wakes.append(threading.get_ident())

    worker = Worker(Counting(ManualFabric(1), 0))
    worker.step_or_park(0.0)
    worker.activate((1,))
    worker.activate_after((2,), 5.0)
    assert wakes == []
    other = threading.Thread(target=lambda: (worker.activate((1,)), worker.activate_after((2,), 5.0)))
    other.start()
    other.join()
    assert wakes == [other.ident, other.ident]


def test_delayed_activations_come_due_in_order() -> None:
    activations = Activations()
    activations.activate_after((2,), 1.0)  # far apart: a loaded machine's late sleep is fine
    activations.activate_after((1,), 0.1)
    activations.activate_after((), 0.0)  # ends a park only
    assert activations.advance() and activations.is_empty()
    bound = activations.empty_for()
    assert bound is not None and 0.0 < bound <= 0.1
    time.sleep(0.15)
    assert activations.advance()
    assert activations.for_extensions(()) == [1]
    assert not activations.advance()
    time.sleep(0.9)
    assert activations.advance()
    assert activations.for_extensions(()) == [2]
    assert activations.empty_for() is None and not activations.advance()


def test_a_command_wakes_a_thread_runtime_worker() -> None:
    """The ``thread`` runtime's control plane calls the worker's ``unpark`` with each command
    (the TCP runtimes' workers watch the coordinator's socket instead)."""
    hub = QueueHub(2)
    woken: list[int] = []
    link = hub.link(1, lambda: woken.append(1))
    hub.send(1, {"kind": "resume"})
    hub.send(0, {"kind": "resume"})  # worker 0 gave no wake function
    assert woken == [1]
    assert link.poll() == {"kind": "resume"}


def test_an_operator_polls_with_activate_after() -> None:
    """A source that asks to run again after a delay (``info.activate_after``) runs exactly
    as often as it asks, no sooner than asked, and the job ends when it drops its token."""
    runs, delay = 6, 0.05

    def job(worker: Worker) -> list[float]:
        seen: list[float] = []

        def build(scope: Any) -> None:
            def constructor(cap: Any, info: Any) -> Any:
                held = [cap]

                def logic(output: Any) -> None:
                    seen.append(time.monotonic())
                    if len(seen) == runs:
                        held.pop().drop()
                    else:
                        info.activate_after(delay)

                return logic

            source(scope, "Poll", constructor).probe()

        worker.dataflow(build)
        worker.step_until_done()
        return seen

    for seen in execute(job, workers=2, runtime="thread"):
        assert len(seen) == runs
        gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
        assert min(gaps) >= delay * 0.98
