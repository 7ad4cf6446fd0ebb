"""Runtimes benchmark: writes ``benchmarks/results/runtimes.md`` (and prints the table).

A 2-worker word count (``examples/wordcount.py``'s ``count_words``) over Python's documentation
text (``pydoc_data.topics``), run in one invocation on the ``thread``, ``process`` and ``spark``
(``local[2]``) runtimes, next to plain Python doing the same counting (``collections.Counter``
per epoch over the same batches).

Input: the 79 topics, in sorted order, repeated ``--repeat`` times; epoch ``e`` is topic
``e % 79``.  As in the example, worker ``i`` gets lines ``i::2`` of the topic, tokenized (here
in the driver, before timing, so every contender counts the very same word batches).  Workers
run ``lag`` epochs ahead of the completed output (the example's default, 4).

Measured (``time.perf_counter``):

* job s: the ``execute`` call on the driver (includes starting processes / the Spark stage;
  excludes the Spark session's start-up, which is timed apart);
* dataflow s: inside worker 0, from its first send to its probe passing the last epoch;
* words/s: total words / job s, and / dataflow s;
* epoch latency p50/p99: inside worker 0, from just before epoch ``e``'s batch is sent to the
  end of the first step after which its probe has passed ``e`` (checked after every step by
  an ``on_step`` hook).  For plain Python: the time to count one epoch.

Every run's total word counts are checked against the plain ``Counter`` before anything is
reported.  Run: ``.venv/bin/python benchmarks/runtimes.py`` (about 1.5 minutes, mostly Spark).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cloudpickle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import wordcount  # noqa: E402 - examples/ is not a package

from tokenflow import execute  # noqa: E402
from tokenflow.worker import Worker  # noqa: E402

cloudpickle.register_pickle_by_value(wordcount)  # process/Spark workers cannot import examples/

RESULTS = ROOT / "benchmarks" / "results"
WORKERS = 2
LAG = 4

Batches = list[list[list[str]]]
"""``batches[topic][worker]``: the words worker ``worker`` sends for a topic."""


def load_batches() -> Batches:
    """Each topic's lines split between the workers (line ``i`` to worker ``i % 2``), tokenized."""
    return [[wordcount.tokenize("\n".join(text.splitlines()[w::WORKERS])) for w in range(WORKERS)]
            for text in wordcount.load_topics()]


def make_job(batches: Batches, epochs: int) -> Callable[[Worker], dict[str, Any]]:
    """The worker function: count words of ``epochs`` epochs; worker 0 times every epoch."""

    def job(worker: Worker) -> dict[str, Any]:
        def build(scope: Any) -> tuple[Any, Any, Counter[str]]:
            inp, words = scope.new_input()
            counts = wordcount.count_words(words)
            totals: Counter[str] = Counter()
            seen = counts.inspect_batch(lambda t, batch: totals.update(dict(batch)))
            return inp, seen.probe(), totals

        inp, probe, totals = worker.dataflow(build)
        sent_at: list[float] = []
        done_at: list[float] = []
        if worker.index == 0:
            def watch(_: Worker) -> None:  # after every step: which epochs has the probe passed?
                now = time.perf_counter()
                while len(done_at) < len(sent_at) and not probe.less_than(len(done_at) + 1):
                    done_at.append(now)

            worker.on_step.append(watch)
        start = time.perf_counter()
        for epoch in range(epochs):
            sent_at.append(time.perf_counter())
            inp.send_batch(batches[epoch % len(batches)][worker.index])
            inp.advance_to(epoch + 1)
            worker.step_while(lambda: probe.less_than(inp.time - LAG))
        inp.close()
        worker.step_while(lambda: not probe.done())
        seconds = time.perf_counter() - start
        latencies = [d - s for s, d in zip(sent_at, done_at, strict=True)] if worker.index == 0 else []
        return {"totals": totals, "seconds": seconds, "latencies": latencies}

    return job


def plain(batches: Batches, epochs: int) -> tuple[Counter[str], float, list[float]]:
    """``Counter`` per epoch over the same batches, emitting ``(word, count)`` lists."""
    totals: Counter[str] = Counter()
    latencies = []
    start = time.perf_counter()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        counts: Counter[str] = Counter()
        for batch in batches[epoch % len(batches)]:
            counts.update(batch)
        records = list(counts.items())
        latencies.append(time.perf_counter() - t0)
        totals.update(dict(records))
    return totals, time.perf_counter() - start, latencies


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (inclusive method; the value itself for one sample)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def row(name: str, words: int, job: float, dataflow: float, latencies: list[float]) -> list[str]:
    return [name, f"{job:.2f}", f"{words / job:,.0f}", f"{dataflow:.2f}", f"{words / dataflow:,.0f}",
            f"{percentile(latencies, 50) * 1e3:.2f}", f"{percentile(latencies, 99) * 1e3:.2f}"]


def plot(words: int, runs: list[tuple[str, float, float, list[float]]], path: Path) -> None:
    """Save the table as a PNG: words/s and epoch latency p50/p99 per runtime.

    ``runs``: ``(runtime, job s, dataflow s, epoch latencies in s)``, the figures the table shows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, FormatStrFormatter

    y = list(range(len(runs)))
    fig, (speed, latency) = plt.subplots(1, 2, figsize=(15, 1.1 * len(runs) + 2), sharey=True)
    for offset, label, values, fmt in (
        (-0.2, "whole job (execute call)", [words / r[1] for r in runs], "{:,.0f}"),
        (0.2, "dataflow (inside worker 0)", [words / r[2] for r in runs], "{:,.0f}"),
    ):
        speed.bar_label(speed.barh([i + offset for i in y], values, 0.4, label=label), fmt=fmt, padding=2)
    for offset, label, q in ((-0.2, "p50", 50), (0.2, "p99", 99)):
        values = [percentile(r[3], q) * 1e3 for r in runs]
        latency.bar_label(latency.barh([i + offset for i in y], values, 0.4, label=label),
                          fmt="{:.2f}", padding=2)
    speed.set(yticks=y, yticklabels=[r[0] for r in runs], xscale="log", xlabel="words/s (log scale)",
              title=f"Word count throughput ({words:,} words)")
    speed.xaxis.set_major_formatter(EngFormatter())
    latency.set(xscale="log", xlabel="epoch latency, ms (log scale)",
                title="Epoch latency (send → probe passed; plain: count one epoch)")
    latency.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    for ax in (speed, latency):
        ax.margins(x=0.25)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    speed.invert_yaxis()  # the table's order, top to bottom
    fig.suptitle(f"Runtimes benchmark: {WORKERS}-worker word count (shared machine: figures are noisy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="passes over the topics (default 10)")
    parser.add_argument("--no-spark", action="store_true", help="skip the spark runtime")
    args = parser.parse_args()

    load = os.getloadavg()[0]  # the machine may be shared: note how busy it was
    batches = load_batches()
    epochs = len(batches) * args.repeat
    words = sum(len(batches[e % len(batches)][w]) for e in range(epochs) for w in range(WORKERS))
    job = make_job(batches, epochs)
    rows: list[list[str]] = []
    runs: list[tuple[str, float, float, list[float]]] = []  # the same figures, for the plot
    notes: list[str] = []

    expected, seconds, latencies = plain(batches, epochs)
    assert sum(expected.values()) == words
    rows.append(row("plain Python (1 thread)", words, seconds, seconds, latencies))
    runs.append(("plain Python (1 thread)", seconds, seconds, latencies))

    def measure(name: str, runtime: str, **options: Any) -> None:
        start = time.perf_counter()
        results = execute(job, workers=WORKERS, runtime=runtime, **options)
        job_seconds = time.perf_counter() - start
        totals: Counter[str] = Counter()
        for result in results:
            totals.update(result["totals"])
        if totals != expected:
            raise AssertionError(f"{name}: word counts differ from plain Python")
        rows.append(row(name, words, job_seconds, results[0]["seconds"], results[0]["latencies"]))
        runs.append((name, job_seconds, results[0]["seconds"], results[0]["latencies"]))
        print(f"  {name}: {job_seconds:.2f} s", file=sys.stderr)

    measure("thread", "thread")
    measure("process", "process")
    if not args.no_spark:
        from tokenflow.spark import session

        start = time.perf_counter()
        session.get_session(f"local[{WORKERS}]")
        startup = time.perf_counter() - start
        notes.append(f"Spark session start-up (`local[{WORKERS}]`, `get_session`): {startup:.2f} s, "
                     "not counted in any job time.")
        try:
            measure("spark local[2], 1st job", "spark", master=f"local[{WORKERS}]")
            measure("spark local[2], 2nd job", "spark", master=f"local[{WORKERS}]")
        finally:
            session.stop_session()

    header = ["runtime", "job s", "words/s (job)", "dataflow s", "words/s (dataflow)",
              "epoch p50 ms", "epoch p99 ms"]
    table = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        "# Runtimes benchmark",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{when}; 1-minute load average {load:.1f} at the start; one run of "
        f"`benchmarks/runtimes.py --repeat {args.repeat}`.",
        "",
        f"Word count (`examples/wordcount.py`'s `count_words`), {WORKERS} workers, over Python's "
        f"documentation text (`pydoc_data.topics`, {len(batches)} topics) repeated {args.repeat} "
        f"times: {epochs} epochs, {words:,} words; workers run up to {LAG} epochs ahead of the "
        "completed output. Plain Python counts the same batches with `collections.Counter`.",
        "",
        *table,
        "",
        "![Words/s and epoch latency p50/p99 per runtime](runtimes.png)",
        "",
        *notes,
        "",
        "- *job s*: the `execute` call on the driver (starting processes / the Spark stage included).",
        "- *dataflow s*: inside worker 0, first send to its probe passing the last epoch.",
        "- *epoch p50/p99*: inside worker 0, from just before an epoch's batch is sent to the step "
        "after which the probe has passed the epoch (all workers' counts for it are out); for "
        "plain Python, the time to count one epoch.",
        "- Every run's word totals were checked equal to plain Python's.",
        "",
    ])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "runtimes.md").write_text(text)
    plot(words, runs, RESULTS / "runtimes.png")
    print(text)


if __name__ == "__main__":
    main()
