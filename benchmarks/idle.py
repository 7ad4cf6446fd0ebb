"""Idle benchmark: what a worker with nothing to do costs, and how soon it hears another thread.

Writes ``benchmarks/results/idle.md`` and ``idle.png`` (and prints the table).  A streaming job spends most of
its life waiting for input; timely parks such a worker until something wakes it.  Two phases
per run, 2 workers, each worker's own figures:

* **idle**: the dataflow's only source holds its token and has nothing to emit for
  ``--idle`` seconds (a reader thread that finds nothing, then ends the source).  Measured: the
  worker thread's CPU time (``time.thread_time``) per second of waiting, and how long after
  the reader's last ``info.activate()`` the source ran (*end seen*, ms).
* **ticks**: a reader thread calls ``info.activate()`` every ``--period`` ms (``--ticks``
  times), as a source fed by a client library's thread does (``tokenflow.pubsub``'s
  ``subscribe``, a Kafka consumer); the source records the delay from each call to its own
  next run.  Measured: that delay (p50, p99, max, ms) and the worker's CPU per second.

Each tree (this repository's ``src/``, and with ``--baseline REV`` that commit's, exported with
``git archive``) runs in a child process per runtime, the trees alternating round by round
(``--rounds``); the table gives medians over rounds and workers.

Run: ``.venv/bin/python benchmarks/idle.py [--baseline REV] [--runtimes thread,process]``
(each run 12-16 s: 3 rounds of two trees on three runtimes took 3.5-4.7 min here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _provenance import exported, provenance  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORKERS = 2


# -- the job (runs in the child, with the tree under test on PYTHONPATH) ------------------------


def make_job(idle: float, ticks: int, period: float) -> Any:
    """The worker function: the idle phase, then the ticks phase; returns its figures."""

    def job(worker: Any) -> dict[str, Any]:
        from tokenflow.dataflow.operators.generic import source

        def reader_source(scope: Any, name: str, schedule: list[float]) -> Any:
            """A source whose reader thread calls ``info.activate()`` at ``schedule`` (seconds
            after the constructor); the source logs how late it ran after each call and ends
            after the last."""
            delays: list[float] = []
            called: list[float] = []

            def constructor(cap: Any, info: Any) -> Any:
                held = [cap]

                def read() -> None:
                    start = time.perf_counter()
                    for at in schedule:
                        time.sleep(max(0.0, start + at - time.perf_counter()))
                        called.append(time.perf_counter())
                        info.activate()

                threading.Thread(target=read, daemon=True, name=f"reader-{name}").start()

                def logic(output: Any) -> None:
                    now = time.perf_counter()
                    while len(delays) < len(called):
                        delays.append(now - called[len(delays)])
                    if held and len(delays) == len(schedule):
                        held.pop().drop()

                return logic

            source(scope, name, constructor).probe()
            return delays

        out: dict[str, Any] = {}
        for phase, schedule in (("idle", [idle]),
                                ("ticks", [period * (k + 1) for k in range(ticks)])):
            delays = worker.dataflow(lambda scope, s=schedule, p=phase: reader_source(scope, p, s))
            cpu, wall, steps = time.thread_time(), time.perf_counter(), worker.steps
            worker.step_until_done()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            out[phase] = {"cpu_per_s": cpu / wall, "steps_per_s": (worker.steps - steps) / wall,
                          "wall": wall, "delays": delays}
        return out

    return job


def child(args: argparse.Namespace) -> None:
    from tokenflow import execute

    if args.runtime == "spark":
        from tokenflow.spark import session

        session.get_session(f"local[{WORKERS}]")
    try:
        results = execute(make_job(args.idle, args.ticks, args.period / 1e3), workers=WORKERS,
                          runtime=args.runtime)
    finally:
        if args.runtime == "spark":
            session.stop_session()
    print(json.dumps(results), flush=True)


# -- the driver ----------------------------------------------------------------------------------


def run_child(src: Path, runtime: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--runtime", runtime,
               "--idle", str(args.idle), "--ticks", str(args.ticks), "--period", str(args.period)]
    done = subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{runtime} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def summarize(runs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Medians over rounds and workers of each figure (delays pooled per round)."""
    def med(values: list[float]) -> float:
        return statistics.median(values)

    workers = [w for run in runs for w in run]
    ticks = [[d for w in run for d in w["ticks"]["delays"]] for run in runs]
    return {
        "idle_cpu": med([w["idle"]["cpu_per_s"] for w in workers]) * 1e3,
        "idle_steps": med([w["idle"]["steps_per_s"] for w in workers]),
        "end_seen": med([w["idle"]["delays"][0] for w in workers]) * 1e3,
        "tick_p50": med([float(np.percentile(t, 50)) for t in ticks]) * 1e3,
        "tick_p99": med([float(np.percentile(t, 99)) for t in ticks]) * 1e3,
        "tick_max": max(max(t) for t in ticks) * 1e3,
        "tick_cpu": med([w["ticks"]["cpu_per_s"] for w in workers]) * 1e3,
    }


def plot(summaries: dict[tuple[str, str], dict[str, float]], path: Path) -> None:
    """Two panels: idle worker CPU (ms/s) and the tick delay (p50, p99; ms, log scale), a bar
    per runtime and tree."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{runtime}\n{tree}" for runtime, tree in summaries]
    x = list(range(len(labels)))
    fig, (cpu, delay) = plt.subplots(1, 2, figsize=(12, 4.5))
    cpu.bar(x, [s["idle_cpu"] for s in summaries.values()], color="tab:blue")
    cpu.set(ylabel="ms of worker CPU per second", title="An idle worker's CPU")
    width = 0.4
    delay.bar([i - width / 2 for i in x], [s["tick_p50"] for s in summaries.values()], width,
              label="p50")
    delay.bar([i + width / 2 for i in x], [s["tick_p99"] for s in summaries.values()], width,
              label="p99")
    delay.set(ylabel="ms (log scale)", yscale="log",
              title="From another thread's info.activate() to the operator's run")
    delay.legend()
    for ax in (cpu, delay):
        ax.set_xticks(x, labels, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of the idle phase")
    parser.add_argument("--ticks", type=int, default=150, help="activations of the ticks phase")
    parser.add_argument("--period", type=float, default=20.0, help="ms between ticks")
    parser.add_argument("--runtimes", default="thread,process", help="comma-separated: thread,process,spark")
    parser.add_argument("--baseline", help="also measure this commit's src/ (before/after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runtime", default="thread", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    started = time.perf_counter()
    runtimes = args.runtimes.split(",")
    with ExitStack() as stack:
        trees = [("this tree", ROOT / "src")]
        if args.baseline:
            trees = [(f"before ({args.baseline})", stack.enter_context(exported(args.baseline))),
                     ("after", ROOT / "src")]
        runs: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
        for round_ in range(args.rounds):
            for runtime in runtimes:
                for tree, src in trees:
                    print(f"round {round_ + 1}: {runtime}, {tree}", file=sys.stderr, flush=True)
                    runs.setdefault((runtime, tree), []).append(run_child(src, runtime, args))
    header = ("| runtime | tree | idle: worker CPU, ms/s | idle: steps/s | idle: end seen after, ms | "
              "ticks: delay p50 ms | p99 ms | max ms | ticks: worker CPU, ms/s |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    summaries = {key: summarize(rounds) for key, rounds in runs.items()}
    for (runtime, tree), s in summaries.items():
        rows.append(f"| {runtime} | {tree} | {s['idle_cpu']:.2f} | {s['idle_steps']:.0f} | "
                    f"{s['end_seen']:.2f} | "
                    f"{s['tick_p50']:.3f} | {s['tick_p99']:.3f} | {s['tick_max']:.2f} | "
                    f"{s['tick_cpu']:.2f} |")
    table = header + "\n" + "\n".join(rows)
    print(table)
    findings = []
    if args.baseline:
        for runtime in runtimes:
            before = summaries[(runtime, trees[0][0])]
            after = summaries[(runtime, "after")]
            findings.append(
                f"* {runtime}: an idle worker uses {after['idle_cpu']:.1f} ms of CPU per second "
                f"instead of {before['idle_cpu']:.1f} ({before['idle_cpu'] / after['idle_cpu']:.1f}x "
                f"less; {after['idle_steps']:.0f} steps/s instead of {before['idle_steps']:.0f}); "
                f"an activation from another thread runs its operator after "
                f"{after['tick_p50']:.2f} ms (p50; p99 {after['tick_p99']:.2f}) instead of "
                f"{before['tick_p50']:.2f} (p99 {before['tick_p99']:.2f}).")
    if args.no_write:
        return
    minutes = (time.perf_counter() - started) / 60
    text = "\n\n".join([
        "# Idle workers: CPU while waiting, and the delay of an activation from another thread",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {minutes:.1f} min. Machine: {platform.platform()}, "
        f"`os.cpu_count()` = {os.cpu_count()} (shared with other jobs). Python "
        f"{platform.python_version()}. {provenance()}",
        f"2 workers per run; idle phase {args.idle:g} s, then {args.ticks} ticks every "
        f"{args.period:g} ms; {args.rounds} rounds, trees alternating; medians over rounds and "
        "workers (tick delays pooled per round; max over all). What is measured and how: the "
        "docstring of `benchmarks/idle.py`.",
        table,
        *(["\n".join(findings)] if findings else []),
        "![Idle CPU and activation delay](idle.png)",
        f"Regenerate: `.venv/bin/python benchmarks/idle.py --runtimes {args.runtimes}"
        f"{f' --baseline {args.baseline}' if args.baseline else ''} --rounds {args.rounds}`",
    ]) + "\n"
    (RESULTS / "idle.md").write_text(text)
    plot(summaries, RESULTS / "idle.png")
    print(f"wrote {RESULTS / 'idle.md'}")


if __name__ == "__main__":
    main()
