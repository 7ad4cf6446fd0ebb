"""Bootstrap state after 10^6 epochs (issue 16: "bootstrap state transferred <= 64 KB after
10^6 epochs").

A joining worker starts its progress trackers from a running worker's progress state
(``tokenflow.membership``): per dataflow the consolidated pointstamp counts and how many
batches of each sender they include.  This script runs one worker of a job with a free slot
(so it keeps that state, as a bootstrap server does) through ``--epochs`` epochs of a small
dataflow (input -> exchange -> map -> broadcast -> probe, one record per epoch) and records,
at each power of ten, the pickled size of the state it would send and its number of
pointstamp entries.  Prints a table and writes ``benchmarks/results/bootstrap_state.md``.

Run: ``.venv/bin/python benchmarks/bootstrap_state.py [--epochs 1000000]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _provenance import provenance  # a sibling module: benchmarks run as scripts

from tokenflow import execute

RESULTS = Path(__file__).resolve().parent / "results"
LIMIT = 64 * 1024
"""The issue's bound on the state transferred, bytes."""


def job(epochs: int) -> Any:
    marks = {10**k for k in range(3, 10) if 10**k <= epochs} | {epochs}

    def run(worker: Any) -> list[tuple[int, int, int, float]]:
        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            return inp, stream.exchange(lambda r: r).map(lambda r: r * 2).broadcast().probe()

        inp, probe = worker.dataflow(build)
        rows = []
        start = time.perf_counter()
        for e in range(1, epochs + 1):
            inp.send(e)
            inp.advance_to(e)
            while probe.less_than(e):
                worker.step()
            if e in marks:
                states = worker.progress_states()
                entries = sum(len(counts) for _, counts in states.values())
                rows.append((e, len(pickle.dumps(states)), entries, time.perf_counter() - start))
        inp.close()
        return rows

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1_000_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = execute(job(args.epochs), workers=1, runtime="thread", slots=2)[0]
    worst = max(size for _, size, _, _ in rows)
    lines = [
        "# Bootstrap state after many epochs",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; 1-minute load "
        f"average {load:.1f} at the start. {provenance()}",
        "",
        f"One worker of a job with a free slot (thread runtime), {args.epochs:,} epochs of one "
        "record each through input -> exchange -> map -> broadcast -> probe; at each mark the "
        "progress state a bootstrap server would send a joining worker "
        "(`Worker.progress_states()`, pickled).",
        "",
        "| epochs | state bytes (pickled) | pointstamp entries | seconds so far |",
        "|---:|---:|---:|---:|",
        *[f"| {e:,} | {size:,} | {entries} | {secs:.0f} |" for e, size, entries, secs in rows],
        "",
        f"Largest: {worst:,} bytes against the bound of {LIMIT:,} "
        f"({'met' if worst <= LIMIT else '**missed**'}): the state holds the pointstamps "
        "outstanding now and a counter per sender, not the history, so it stays the same size "
        "however long the job has run.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "bootstrap_state.md").write_text(text)


if __name__ == "__main__":
    main()
