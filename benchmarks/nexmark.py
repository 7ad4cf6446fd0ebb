"""NEXMark benchmark: events/s per query on Spark ``local[2]`` with 2 workers, and the generator alone.

Source of the anchors and targets: docs/NEXMARK.md ("Published figures": the nexmark-flink
reference run, events/s per core, generator included); the project's targets: q0-q3 and q8 must
reach 2x their per-core figure on two workers; q4 >= 69,000, q5 >= 44,000, q7 >= 25,000 events/s;
the generator >= 500,000 events/s per worker.

* **Queries.**  Each query runs ``--repeat`` times through ``tokenflow.nexmark.run.run_query``
  (``runtime="spark"``, ``master=local[2]``, 2 workers, ``--events`` events at 10,000 events/s of
  event time, 1 s epochs): each worker generates its share of the events inside the job, so the
  generator's cost is included as in the anchors.  Reported: the median job events/s (wall clock
  from the first worker sending to the last output frontier empty; Spark start-up and task
  launch are excluded and reported apart), events/s per worker, the anchor, the target, and the
  median run's per-epoch latency p50/p99 (ms, input of a 1 s epoch sent -> output frontier past
  it, up to 4 epochs in flight).
* **Generator.**  ``events_for_worker`` alone (no dataflow) on one core, by this process's CPU
  time (the machine is shared), best of ``--repeat``.

Prints the tables, appends them to ``benchmarks/results/nexmark.md`` and writes
``benchmarks/results/nexmark.png`` (events/s per query next to the anchor and target).

* **Before/after** (``--baseline REV``): each round runs every query once with ``src/`` of
  commit ``REV`` and once with this tree's, each in a child process of its own (Spark started
  in each), interleaved, so both sides share the machine's drift; reported per query: the
  median events/s and latency of each side and their ratio, after checking both sides' output
  rows equal.  Appended to ``benchmarks/results/nexmark.md`` as its own section.

Run: ``.venv/bin/python benchmarks/nexmark.py [--events N] [--repeat R] [--query q0 q4 ...]
[--baseline REV]``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tokenflow.nexmark import GeneratorConfig, events_for_worker, generate  # noqa: E402
from tokenflow.nexmark.queries import QUERIES  # noqa: E402
from tokenflow.nexmark.run import QueryResult, run_query  # noqa: E402

RESULTS = Path(__file__).parent / "results"
WORKERS = 2
MASTER = f"local[{WORKERS}]"
ANCHORS = {"q0": 155_000, "q1": 158_000, "q2": 175_000, "q3": 152_000, "q4": 34_300,
           "q5": 22_100, "q7": 12_300, "q8": 146_000}
"""nexmark-flink events/s per core, generator included (docs/NEXMARK.md, "Published figures")."""
TARGETS = {"q0": 2 * 155_000, "q1": 2 * 158_000, "q2": 2 * 175_000, "q3": 2 * 152_000, "q4": 69_000,
           "q5": 44_000, "q7": 25_000, "q8": 2 * 146_000}
"""The project's targets for 2 workers, events/s."""
GENERATOR_TARGET = 500_000
"""The project's generator target, events/s per worker."""


@dataclass
class Row:
    query: str
    runs: list[QueryResult]

    @property
    def median(self) -> QueryResult:
        ordered = sorted(self.runs, key=lambda r: r.events_per_second)
        return ordered[len(ordered) // 2]


def measure_query(name: str, events: int, repeat: int) -> Row:
    runs = []
    for _ in range(repeat):
        runs.append(run_query(name, events, rate=10_000, workers=WORKERS, runtime="spark", master=MASTER))
        print(f"  {name}: {runs[-1].events_per_second:,.0f} events/s", flush=True)
    return Row(name, runs)


def measure_generator(events: int, batch: int, repeat: int) -> tuple[float, float]:
    """Best (wall s, CPU s) of ``repeat`` passes generating ``events`` events in blocks of ``batch``."""
    config = GeneratorConfig()
    generate(0, 1000, config)  # warm up imports and the Arrow memory pool
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        rows = 0
        wall, cpu = time.perf_counter(), time.process_time()
        for data in events_for_worker(0, 1, events, batch, config):
            rows += sum(b.num_rows for b in data.values())
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        assert rows == events
    return best_wall, best_cpu


def plot(rows: list[Row], path: Path) -> None:
    """Bars: median events/s per query (log scale), with the per-core anchor and the target."""
    names = [r.query for r in rows]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([i - 0.2 for i in x], [r.median.events_per_second for r in rows], width=0.4,
           label=f"tokenflow, Spark {MASTER}, {WORKERS} workers")
    ax.bar([i + 0.2 for i in x], [ANCHORS[n] for n in names], width=0.4, color="0.7",
           label="nexmark-flink, per core")
    ax.scatter(list(x), [TARGETS[n] for n in names], marker="_", s=600, color="red", zorder=3,
               label="target (2 workers)")
    ax.set_xticks(list(x), names)
    ax.set_yscale("log")
    ax.set_ylabel("events/s (generator included)")
    ax.set_title("NEXMark throughput per query")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def child(args: argparse.Namespace) -> None:
    """One side of a before/after round: every query once; one JSON line each."""
    from tokenflow.spark.session import get_session, stop_session

    get_session(MASTER)
    try:
        run_query("q0", 20_000, workers=WORKERS, runtime="spark", master=MASTER)  # warm up
        for name in args.query:
            r = run_query(name, args.events, rate=10_000, workers=WORKERS, runtime="spark",
                          master=MASTER)
            digest = hashlib.sha256(r.rows.to_csv(index=False).encode()).hexdigest()
            print(json.dumps({"query": name, "eps": r.events_per_second, "p50": r.latency_p50_ms,
                              "p99": r.latency_p99_ms, "rows": len(r.rows), "digest": digest}),
                  flush=True)
    finally:
        stop_session()


def before_after(args: argparse.Namespace) -> None:
    """``--baseline``: interleaved rounds of both trees, a ratio table (see the docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _provenance import exported, provenance

    load = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with exported(args.baseline) as old:
        trees = [("before", old), ("after", Path(__file__).resolve().parents[1] / "src")]
        for round_ in range(args.repeat):
            for tree, src in trees:
                print(f"  round {round_ + 1}: {tree}", file=sys.stderr, flush=True)
                done = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--child", "--events",
                     str(args.events), "--query", *args.query],
                    env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True, text=True,
                    check=False)
                if done.returncode:
                    raise RuntimeError(f"{tree} run failed:\n{done.stderr[-4000:]}")
                runs[tree] += [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    for name in args.query:
        digests = {r["digest"] for side in runs.values() for r in side if r["query"] == name}
        if len(digests) != 1:
            raise AssertionError(f"{name}: output rows differ between runs or trees")

    def med(tree: str, name: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[tree] if r["query"] == name)

    lines = [
        "",
        f"## Before/after, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; "
        f"1-minute load average {load:.1f} at the start. {provenance()} *Before*: commit "
        f"{args.baseline}; *after*: this tree. Spark {MASTER}, {WORKERS} workers, "
        f"{args.events:,} events at 10,000 events/s of event time, 1 s epochs, generator "
        f"included; {args.repeat} interleaved rounds (a child process per tree and round), "
        "medians. Every run's output rows were checked equal across runs and trees.",
        "",
        "| query | before events/s | after events/s | after / before | before p50 / p99 ms | "
        "after p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in args.query:
        b, a = med("before", name, "eps"), med("after", name, "eps")
        lines.append(f"| {name} | {b:,.0f} | {a:,.0f} | {a / b:.2f} | "
                     f"{med('before', name, 'p50'):.1f} / {med('before', name, 'p99'):.1f} | "
                     f"{med('after', name, 'p50'):.1f} / {med('after', name, 'p99'):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        with (RESULTS / "nexmark.md").open("a") as f:
            f.write(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--query", nargs="+", default=list(QUERIES), choices=QUERIES)
    parser.add_argument("--generator-events", type=int, default=2_000_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--baseline", help="instead: before (this commit) / after (this tree)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    if args.baseline:
        before_after(args)
        return

    from tokenflow.spark.session import get_session, stop_session

    start = time.perf_counter()
    get_session(MASTER)
    startup = time.perf_counter() - start
    print(f"Spark start-up ({MASTER}): {startup:.1f} s", flush=True)
    try:
        run_query("q0", 20_000, workers=WORKERS, runtime="spark", master=MASTER)  # warm the Python workers
        rows = [measure_query(name, args.events, args.repeat) for name in args.query]
    finally:
        stop_session()
    gen_wall, gen_cpu = measure_generator(args.generator_events, 65_536, args.repeat)

    lines = [
        "",
        f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}. "
        f"Spark {MASTER}, {WORKERS} workers, {args.events:,} events at 10,000 events/s of event time, "
        f"1 s epochs, generator included; median of {args.repeat} runs.  Spark start-up "
        f"{startup:.1f} s, not counted.",
        "",
        "| query | events/s | per worker | x anchor per core | anchor (per core) | target | "
        "latency p50 ms | p99 ms | output rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.median
        verdict = "met" if r.events_per_second >= TARGETS[row.query] else "**missed**"
        lines.append(
            f"| {row.query} | {r.events_per_second:,.0f} | {r.events_per_second / WORKERS:,.0f} | "
            f"{r.events_per_second / ANCHORS[row.query]:.1f} | {ANCHORS[row.query]:,} | "
            f">= {TARGETS[row.query]:,} ({verdict}) | {r.latency_p50_ms:.1f} | {r.latency_p99_ms:.1f} | "
            f"{len(r.rows):,} |")
    gen_verdict = "met" if args.generator_events / gen_cpu >= GENERATOR_TARGET else "**missed**"
    lines += [
        "",
        f"Generator alone (`events_for_worker`, 1 worker, blocks of 65,536 events, "
        f"{args.generator_events:,} events, best of {args.repeat}): "
        f"{args.generator_events / gen_cpu:,.0f} events/s by CPU time "
        f"({args.generator_events / gen_wall:,.0f} by wall time); target >= {GENERATOR_TARGET:,} "
        f"per worker ({gen_verdict}).",
        "",
        "![events/s per query](nexmark.png)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        plot(rows, RESULTS / "nexmark.png")
        path = RESULTS / "nexmark.md"
        if not path.exists():
            path.write_text("# NEXMark on tokenflow\n\nSee `benchmarks/nexmark.py` for what is measured "
                            "and how.\n")
        with path.open("a") as f:
            f.write(text)
        print(f"appended to {path}; plot {RESULTS / 'nexmark.png'}")


if __name__ == "__main__":
    main()
