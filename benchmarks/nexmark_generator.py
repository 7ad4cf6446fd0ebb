"""NEXMark generator benchmark: events/s of ``tokenflow.nexmark`` on one core, no dataflow.

Generates worker 0 of 1's share of ``--events`` events (default 2,000,000, Beam-compatible
defaults: rate 10,000/s, 1:3:46 persons:auctions:bids) with ``events_for_worker`` for each
``--batch`` size, and reports events/s by wall-clock time and by this process's CPU time (the
machine may be shared; CPU time is the better measure of one core).  The best of ``--repeat``
runs is kept.  Target: >= 500,000 events/s.  Prints a table and appends it to
``benchmarks/results/nexmark_generator.md``.

Run: ``.venv/bin/python benchmarks/nexmark_generator.py [--events N] [--batch B ...]``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from pathlib import Path

from tokenflow.nexmark import GeneratorConfig, events_for_worker, generate

RESULTS = Path(__file__).parent / "results"
TARGET = 500_000


def measure(events: int, batch: int, config: GeneratorConfig) -> tuple[float, float, int, int]:
    """One pass over ``events`` events in blocks of ``batch``.

    Returns (wall seconds, CPU seconds, rows produced, bytes of Arrow data produced).
    """
    rows = size = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for data in events_for_worker(0, 1, events, batch, config):
        for records in data.values():
            rows += records.num_rows
            size += records.nbytes
    return time.perf_counter() - wall, time.process_time() - cpu, rows, size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[10_000, 65_536])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="do not append to the results file")
    args = parser.parse_args(argv)
    config = GeneratorConfig()
    generate(0, 1000, config)  # warm up imports and the Arrow memory pool

    lines = [
        "",
        f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}. "
        f"{args.events:,} events (rate {config.rate}/s), 1 worker, best of {args.repeat}.",
        "",
        "| batch (events) | wall s | CPU s | events/s (wall) | events/s (CPU) | MB/s (CPU) | target |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch in args.batch:
        best_wall = best_cpu = float("inf")
        rows = size = 0
        for _ in range(args.repeat):
            wall, cpu, rows, size = measure(args.events, batch, config)
            best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
        assert rows == args.events
        rate_cpu = args.events / best_cpu
        verdict = "met" if rate_cpu >= TARGET else "missed"
        lines.append(
            f"| {batch:,} | {best_wall:.2f} | {best_cpu:.2f} | {args.events / best_wall:,.0f} | "
            f"{rate_cpu:,.0f} | {size / best_cpu / 1e6:,.0f} | >= {TARGET:,} ({verdict}) |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / "nexmark_generator.md"
        if not path.exists():
            path.write_text("# NEXMark generator (tokenflow.nexmark, vectorized, Beam-compatible)\n\n"
                            "Events/s of `events_for_worker` alone (no dataflow); see "
                            "`benchmarks/nexmark_generator.py`.\n")
        with path.open("a") as f:
            f.write(text)
        print(f"appended to {path}")


if __name__ == "__main__":
    main()
