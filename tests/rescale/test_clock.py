"""``SliceClock``: a slice's wall clock, CPU time and the time it held its worker, with real
preemption (a busy rival process pinned to the same CPU) and a real wait (a sleep)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tokenflow.rescale.clock import SliceClock, run_queue_wait, voluntary_switches

linux = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat") or not hasattr(os, "sched_setaffinity")
    or voluntary_switches() < 0, reason="needs Linux's per-thread scheduler counters")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _ran(pid: int) -> float:
    """Seconds process ``pid`` has run on a CPU (``/proc/PID/schedstat``, first field)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) * 1e-9


@pytest.fixture
def crowded() -> Iterator[None]:
    """This thread and a busy rival process pinned to one CPU, both runnable."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(rival.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        deadline = time.monotonic() + 5
        while _ran(rival.pid) < 0.05 and time.monotonic() < deadline:  # the rival is spinning
            _spin(0.01)
        yield
    finally:
        os.sched_setaffinity(0, before)
        rival.kill()
        rival.wait()


@linux
def test_preemption_is_not_held(crowded: None) -> None:
    waited = run_queue_wait()
    clock = SliceClock()
    _spin(0.4)
    wall, cpu, held = clock.stop()
    assert wall >= 0.4
    assert cpu < 0.75 * wall  # the rival had a share of the CPU: the spin was preempted
    assert run_queue_wait() - waited > 0.1  # ... and the scheduler counted the wait
    # held is the CPU time (or, if the thread blocked for a moment, wall less the run-queue
    # wait: CPU plus that moment), not the preempted wall clock
    assert cpu <= held < min(cpu + 0.05, 0.75 * wall)


@linux
def test_a_slice_that_waits_holds_its_wait_but_not_its_preemption(crowded: None) -> None:
    clock = SliceClock()
    _spin(0.2)
    time.sleep(0.1)  # the slice's own wait: held
    _spin(0.2)
    wall, cpu, held = clock.stop()
    assert cpu < 0.75 * (wall - 0.1)  # preempted while spinning
    assert cpu + 0.1 <= held + 0.005  # the sleep is held
    assert held < 0.8 * wall  # the preemption is not


@linux
def test_a_sleep_is_held_without_cpu() -> None:
    clock = SliceClock()
    time.sleep(0.05)
    wall, cpu, held = clock.stop()
    assert held >= 0.05 and held > 0.9 * wall and cpu < 0.01

