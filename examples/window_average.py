"""The paper's §5 example: a tumbling windowed average written with explicit timestamp tokens.

Source: the timestamp-tokens paper (Lattuada, McSherry et al., *Timestamp tokens: a better
coordination primitive for data-processing systems*, 2022) §5 and §5.1 (Figure 5).  The operator
receives timestamped integer values and reports the average of every window of ``window`` time
units at the timestamp of the start of the next window (the window's end), and nothing for
windows without data.  Its state is an ordered map ``window_end -> [Capability, sum, count]``:

- on the first data of a window it *retains* the message's token and *downgrades* it to the
  window end (it may produce output there, and only there);
- when the input frontier has passed a window end (no time ``< end`` can still arrive) it sends
  the average with that token and *drops* it — retiring many windows at once, in order, when
  the frontier jumps.

The sums and counts (``window_end -> [sum, count]``) are the operator's declared state: a
worker-local ``LocalState`` (the operator is pipelined), which the system can snapshot and, on
a restore, hand to the worker owning this worker's home bin (merging the windows of several
old workers by adding their sums and counts); the tokens are re-minted at its window ends.

Data: the Les Misérables character co-occurrence graph shipped with ``networkx``
(``networkx.les_miserables_graph()``, 254 edges, Knuth's Stanford GraphBase data): edge ``i`` in
the graph's edge order is the event at time ``i`` and its weight (number of co-occurrences) is
the value.  Worker ``w`` reads edges ``i`` with ``i % workers == w``; records ``(i, weight)`` are
exchanged by window so that each window is averaged on one worker.

Run ``python examples/window_average.py --workers 2 --window 10``.
"""

from __future__ import annotations

import argparse
import bisect
from typing import Any

import networkx as nx

from tokenflow import Capability, Stream, execute
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import OperatorInfo, unary_frontier
from tokenflow.dataflow.state import LocalState
from tokenflow.worker import Worker

Sums = dict[int, list[Any]]
"""Open windows: window end -> ``[sum of values, count]``."""


def merge_sums(into: Sums, other: Sums) -> Sums:
    """``into`` with ``other``'s windows added (sums and counts of a window both hold add up)."""
    for end, (total, count) in other.items():
        held = into.setdefault(end, [0, 0])
        held[0] += total
        held[1] += count
    return into


def edge_weights() -> list[int]:
    """The Les Misérables co-occurrence weights in the graph's (deterministic) edge order."""
    return [int(w) for _, _, w in nx.les_miserables_graph().edges(data="weight")]


def window_average(stream: Stream, window: int, name: str = "WindowAverage") -> Stream:
    """Averages of the ``(index, value)`` records of each window ``[k*window, (k+1)*window)``.

    Each average is sent at time ``(k+1)*window`` (the window end) once the input frontier has
    passed it; windows without data produce nothing.  Pipeline pact: a window's records must
    already be on one worker.

    Raises:
        ValueError: when ``window <= 0``.
    """
    if window <= 0:
        raise ValueError(f"window must be > 0, got {window}")

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        state = info.state("sums", LocalState(dict, merge_sums, times=lambda w: w.keys(),
                                              empty=lambda w: not w))
        sums: Sums = state.value  # window end -> [sum, count] (restored windows included)
        # window end -> token (restored windows get theirs from the initial token)
        tokens: dict[int, Capability] = {end: capability.delayed(end) for end in sums}
        ends: list[int] = sorted(tokens)  # the map's keys, sorted
        capability.drop()  # the initial token at time 0: no output unprompted

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                t = ref.time
                end = t - t % window + window
                acc = sums.get(end)
                if acc is None:
                    token = ref.retain()  # an owned token at the message's time ...
                    token.downgrade(end)  # ... moved to the end of its window
                    tokens[end] = token
                    acc = sums[end] = [0, 0]
                    bisect.insort(ends, end)
                acc[0] += sum(value for _, value in batch)
                acc[1] += len(batch)
            # Retire every window whose end the frontier has passed, in order.
            frontier = input.frontier
            closed = 0
            for end in ends:
                if frontier.less_than(end):
                    break
                token = tokens.pop(end)
                total, count = sums.pop(end)
                with output.session(token) as session:  # output at the token's time: end
                    session.give(total / count)
                token.drop()  # release the ability to produce at `end`
                closed += 1
            del ends[:closed]

        return logic

    return unary_frontier(stream, "pipeline", name, constructor)


def main(workers: int = 2, window: int = 10) -> dict[int, float]:
    """Run the example on ``workers`` workers; returns ``{window end: average weight}``."""
    weights = edge_weights()

    def job(worker: Worker) -> Capture:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            averages = window_average(stream.exchange(lambda r: r[0] // window), window)
            return inp, averages.capture()

        inp, capture = worker.dataflow(build)
        for i in range(worker.index, len(weights), worker.peers):
            inp.advance_to(i)  # event time = edge index
            inp.send((i, weights[i]))
            worker.step()
        inp.close()
        return capture  # execute steps the worker until the dataflow completes

    result: dict[int, float] = {}
    for capture in execute(job, workers=workers):
        for end, averages in capture.by_time().items():
            if end in result or len(averages) != 1:
                raise RuntimeError(f"window ending at {end} reported more than once")
            result[end] = averages[0]
    return dict(sorted(result.items()))


def _cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="number of workers (threads)")
    parser.add_argument("--window", type=int, default=10, help="window length in time units")
    args = parser.parse_args()
    averages = main(args.workers, args.window)
    print(f"{'window':>14}  {'average weight':>14}")
    for end, avg in averages.items():
        print(f"[{end - args.window:>5}, {end:>5})  {avg:>14.3f}")


if __name__ == "__main__":
    _cli()
