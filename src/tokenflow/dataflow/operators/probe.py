"""``probe``: watch a stream's frontier from worker code.  Source: timely's ``probe.rs``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.builder import OperatorBuilder
from tokenflow.progress.antichain import MutableAntichain

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


class ProbeHandle:
    """The frontier of a probed stream: lower bound of the times still to come.

    ``history`` records ``(time.perf_counter() seconds, frontier)`` at every change the probe
    observes, for measuring epoch latencies (``frontier_latencies``).
    """

    def __init__(self) -> None:
        self.frontier = MutableAntichain()
        self.history: list[tuple[float, list[Any]]] = []

    def less_than(self, time: Any) -> bool:
        """True while data at a time < ``time`` may still appear on the stream."""
        return self.frontier.less_than(time)

    def less_equal(self, time: Any) -> bool:
        """True while data at a time ≤ ``time`` may still appear on the stream."""
        return self.frontier.less_equal(time)

    def done(self) -> bool:
        """True once the stream's frontier is empty (it will carry no more data)."""
        return self.frontier.is_empty()

    def with_frontier(self) -> list[Any]:
        return self.frontier.frontier()


def probe_with(stream: Stream, handle: ProbeHandle, name: str = "Probe") -> Stream:
    """Pass ``stream`` through while ``handle`` tracks its frontier.

    Until the probe first runs, the handle reports the scope's minimum time (nothing is
    complete yet).
    """
    builder = OperatorBuilder(name, stream.scope, notify=True)
    inp = builder.new_input(stream, "pipeline")
    output, out_stream = builder.new_output()
    reported = [stream.scope.min_time]
    handle.frontier.update_iter([(stream.scope.min_time, 1)])

    def constructor(caps: Any) -> Any:
        caps[0].drop()

        def logic(frontiers: Any) -> None:
            for ref, batch in inp:
                output.give_batch(ref, batch)
            current = inp.frontier.frontier()
            if current != reported:
                changes = [(t, -1) for t in reported] + [(t, 1) for t in current]
                handle.frontier.update_iter(changes)
                reported[:] = current
                handle.history.append((time.perf_counter(), list(current)))

        return logic

    builder.build(constructor)
    return out_stream


def probe(stream: Stream, name: str = "Probe") -> ProbeHandle:
    """A ``ProbeHandle`` tracking ``stream``'s frontier."""
    handle = ProbeHandle()
    probe_with(stream, handle, name)
    return handle


def frontier_latencies(upstream: ProbeHandle, downstream: ProbeHandle) -> list[tuple[Any, float]]:
    """Per epoch, seconds from the upstream frontier passing it to the downstream one passing it.

    For each frontier value ``v`` the upstream probe reported (e.g. on a source's output: all
    input before ``v`` was sent), the latency is the time until the downstream probe (e.g. on
    the job's output: all results before ``v`` were produced) first reported a frontier ``>= v``
    or an empty one.  Integer times; both probes read on the same worker (one clock).  Returns
    ``[(v, seconds), ...]`` in upstream order.
    """
    out: list[tuple[Any, float]] = []
    down = downstream.history
    j = 0
    for t_up, frontier in upstream.history:
        if not frontier:
            continue
        v = min(frontier)
        while j < len(down) and down[j][1] and min(down[j][1]) < v:
            j += 1
        if j == len(down):
            break
        out.append((v, max(0.0, down[j][0] - t_up)))
    return out
