"""How long migration work held its worker, told apart from the time the OS or the machine
took from the worker meanwhile.

The live-rescaling target "no existing worker blocked > 5 ms" (after the latency spike of
the bootstrap server in Selvatici, *Rescaling of Timely Dataflow*, §5) is about the
migration's own work.  On a shared machine a
slice's wall clock also counts time the thread did not run: the OS preempting it for other
processes (4 worker processes on 2 cores) and time a virtual machine's host takes from its
CPU.  ``SliceClock`` measures wall clock, thread CPU time and ``held``, the part that was the
slice's own: CPU time, plus the thread's own waits if it blocked.  Linux only for the
per-thread counters (``/proc/thread-self/schedstat``, ``getrusage(RUSAGE_THREAD)``);
elsewhere ``held`` is the wall clock.
"""

from __future__ import annotations

import time
from typing import Protocol

try:
    import resource as _resource
except ImportError:  # pragma: no cover - not POSIX
    _resource = None  # type: ignore[assignment]


def run_queue_wait() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU since it started
    (Linux ``/proc/thread-self/schedstat``, its second field, ns): time the OS gave other
    threads and processes.  0.0 where the file cannot be read (not Linux)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def voluntary_switches() -> int:
    """Times the calling thread has blocked (given up its CPU to wait: a lock, the GIL, I/O,
    a sleep; ``getrusage(RUSAGE_THREAD).ru_nvcsw``); -1 where that is not available."""
    who = getattr(_resource, "RUSAGE_THREAD", None) if _resource is not None else None
    return -1 if who is None else _resource.getrusage(who).ru_nvcsw


class SliceClock:
    """The clocks of one migration slice, started at construction.  ``stop()`` gives seconds
    ``(wall, cpu, held)``: wall clock (``perf_counter``), the thread's CPU time
    (``thread_time``) and ``held``, how long the slice's own work kept the worker from
    anything else:

    - its CPU time when the thread never blocked in the slice (``voluntary_switches``
      unchanged): the rest of the wall time went to other processes (the OS preempted the
      thread; 4 worker processes on 2 cores) or to the machine (interrupts, a virtual
      machine's host), not to the slice;
    - otherwise the wall time less the thread's ``run_queue_wait``: its own waits count.

    Without Linux's per-thread counters ``held`` is the wall time."""

    __slots__ = ("wall", "cpu", "waited", "blocks")

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        self.waited, self.blocks = run_queue_wait(), voluntary_switches()

    def stop(self) -> tuple[float, float, float]:
        wall = time.perf_counter() - self.wall
        cpu = min(wall, time.thread_time() - self.cpu)
        blocks = voluntary_switches()
        if blocks == self.blocks and blocks >= 0:
            return wall, cpu, cpu
        return wall, cpu, min(wall, max(cpu, wall - (run_queue_wait() - self.waited)))


class Worked(Protocol):
    """A migration step's or load's record of its longest block of work (seconds)."""

    longest: float
    longest_cpu: float
    longest_held: float


class Activation:
    """The migration work of one activation of an operator, measured as one block: the worker
    runs nothing else between its slices (takes, prepares, loads), so the block, not each
    slice, is what held the worker.  ``work(record)`` before each piece of work (the clock
    starts at the first), ``stop()`` after the last: each record worked for keeps the
    largest ``SliceClock`` reading (wall, CPU, held) of any block that worked for it.  An
    activation that did no work measures nothing (``idle``)."""

    __slots__ = ("_clock", "_records")

    def __init__(self) -> None:
        self._clock: SliceClock | None = None
        self._records: list[Worked] = []

    @property
    def idle(self) -> bool:
        """No work yet in this activation."""
        return self._clock is None

    def may_start(self, deadline: float, expected: float) -> bool:
        """Whether work expected to take ``expected`` seconds may start: the block's first
        always, later work only when it would end by ``deadline`` (``time.perf_counter()``
        seconds)."""
        return self._clock is None or time.perf_counter() + expected <= deadline

    def work(self, record: Worked) -> None:
        """Some work for ``record`` is about to run."""
        if self._clock is None:
            self._clock = SliceClock()
        if not any(r is record for r in self._records):
            self._records.append(record)

    def stop(self) -> None:
        """The block ended: fold its clocks into every record it worked for."""
        if self._clock is None:
            return
        wall, cpu, held = self._clock.stop()
        self._clock = None
        for r in self._records:
            r.longest = max(r.longest, wall)
            r.longest_cpu = max(r.longest_cpu, cpu)
            r.longest_held = max(r.longest_held, held)
        self._records = []


__all__ = ["Activation", "SliceClock", "Worked", "run_queue_wait", "voluntary_switches"]
