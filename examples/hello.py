"""Timely dataflow's "hello world": an input, an ``exchange`` by value, and an ``inspect``.

Source: timely's ``examples/hello.rs``.  Worker 0 sends the value ``round`` in epoch ``round``
(with ``every_worker_sends=True`` every worker sends it, so the exchange has data from every
worker to route); the stream is exchanged by value, so each value lands on the worker chosen
by the stable hash of the value; ``inspect`` prints ``worker i: seen x at time t``.  After each
epoch the workers advance their inputs and step until the probe shows the epoch complete.

Run::

    python examples/hello.py --workers 2 --rounds 10
"""

from __future__ import annotations

import argparse
import threading
from typing import NamedTuple

from tokenflow import InputHandle, ProbeHandle, Scope, execute
from tokenflow.worker import Worker


class Seen(NamedTuple):
    """One record observed by ``inspect``.

    ``round`` is the epoch the observing worker's own input was in when it saw the record
    (epochs are 0-based; ``rounds`` once its input is past the last epoch).
    """

    worker: int
    time: int
    value: int
    round: int


def run(workers: int = 2, rounds: int = 10, every_worker_sends: bool = False,
        quiet: bool = True) -> list[Seen]:
    """Run hello world and return every observation (in no particular order across workers).

    Args:
        workers: number of worker threads.
        rounds: number of epochs ``0 .. rounds-1``; epoch ``r`` carries the value ``r``.
        every_worker_sends: every worker (not only worker 0) sends ``r`` in epoch ``r``.
        quiet: do not print the observations.
    """
    seen: list[Seen] = []
    lock = threading.Lock()

    def job(worker: Worker) -> None:
        index = worker.index
        current = [0]  # this worker's input epoch, read by the inspect callback

        def observe(time: int, batch: list[int]) -> None:
            rows = [Seen(index, time, x, current[0]) for x in batch]
            if not quiet:
                print("\n".join(f"worker {index}: seen {x} at time {time}" for x in batch))
            with lock:
                seen.extend(rows)

        def build(scope: Scope) -> tuple[InputHandle, ProbeHandle]:
            inp, stream = scope.new_input()
            probe = stream.exchange(lambda x: x).inspect_batch(observe).probe()
            return inp, probe

        inp, probe = worker.dataflow(build)
        for r in range(rounds):
            if index == 0 or every_worker_sends:
                inp.send(r)
            inp.advance_to(r + 1)
            current[0] = r + 1
            worker.step_while(lambda: probe.less_than(inp.time))
            # ``inp.time`` is r + 1: every record of epoch r has been inspected everywhere.
        inp.close()

    execute(job, workers=workers)
    return seen


def main(workers: int = 2, rounds: int = 10, quiet: bool = False) -> list[tuple[int, int, int]]:
    """Run hello world and return ``(worker, time, value)`` for every record seen."""
    return [(s.worker, s.time, s.value) for s in run(workers, rounds, quiet=quiet)]


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker threads (default 2)")
    parser.add_argument("--rounds", type=int, default=10, help="epochs to run (default 10)")
    args = parser.parse_args(argv)
    main(args.workers, args.rounds)


if __name__ == "__main__":
    cli()
