"""§7.4 of the timestamp-tokens paper: NEXMark Q4 and Q7 with tokens, notifications, watermarks.

The query variants are ``tokenflow.nexmark.queries.coordination.BUILDERS`` (the token versions
are the queries themselves).  First each variant's output is checked equal to the token
version's on the same 50,000 events (2 workers, closed loop); then each runs open-loop at
rising offered rates until it does not finish, 2 workers on the ``process`` runtime.

Open loop (``drive_events``): events come from the NEXMark generator at the offered rate
(``GeneratorConfig(rate=r)``, so event time advances one ms per ms of offering; the generator
spaces events by whole µs, so rates above 1,000,000 events/s replay 1,000,000 events/s of event
time faster than the clock: two logical ms per ms at 2,000,000); the event numbers are dealt to
the workers in blocks of about 10 ms of event time.  At the end of each wall-clock ms
the events of that event-time ms are sent (one message per kind, at that ms) and the inputs
advance past it, so logical time ``m`` is *closed* at ``t0 + (m - base + 1)`` ms.  Only the
columns the queries read are generated into the batches.  The latency of logical time ``m`` is
the clock when the query's output frontier passes ``m`` (on a worker: each worker records its
own observation) minus the clock when ``m`` closed — the paper's per-timestamp latency.  DNF:
above 1 s.

Writes ``benchmarks/results/evaluation_nexmark.{md,png,json}``; ``--quick``: fewer rates,
shorter runs, to a temporary directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import pyarrow as pa

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.evaluation.harness import (  # noqa: E402
    DNF_NS,
    NS,
    RETRY_NOTE,
    Abort,
    Histogram,
    Load,
    WorkerReport,
    agree_start,
    confirmed,
    fmt_ms,
    fmt_rate,
    header,
    load_end,
    log,
    machine,
    merge,
    run_script,
    table,
)
from tokenflow import execute  # noqa: E402
from tokenflow.nexmark import GeneratorConfig, generate, nexmark_source  # noqa: E402
from tokenflow.nexmark.generator import worker_blocks  # noqa: E402
from tokenflow.nexmark.queries import compare_exact, q4, q7  # noqa: E402
from tokenflow.nexmark.queries.coordination import BUILDERS, MECHANISMS  # noqa: E402
from tokenflow.spark.io import collect  # noqa: E402

QUERIES = ("q4", "q7")
RATES = [25_000, 100_000, 250_000, 500_000, 1_000_000, 2_000_000, 4_000_000]
MAX_EVENTS = 5_000_000
"""Events per run at most (generation time and memory): faster runs are shorter (>= 1 s)."""
GENERATOR_MAX = 1_000_000
"""The generator spaces events by whole µs (Beam's ``rateToPeriodUs``): above 1,000,000 events/s
event time runs at 1,000,000 events/s and the harness offers it faster (``speed``)."""
WORKERS = 2
RUNTIME = "process"
COLUMNS = {"auction": ["id", "category", "reserve", "dateTime", "expires"],
           "bid": ["auction", "bidder", "price", "dateTime"]}
OUTPUT = {"q4": (q4.COLUMNS, "time"), "q7": (q7.COLUMNS, "window_end")}


# -- equality of the variants ------------------------------------------------------------------


def check_equal(events: int = 50_000) -> dict[str, str]:
    """Run every variant closed-loop on the same events (2 workers, ``thread``); compare rows
    and their logical times with the token version's.  Returns ``query -> verdict``."""
    verdicts = {}
    for query in QUERIES:
        config = GeneratorConfig(rate=1_000 if query == "q4" else 200)
        results = {}
        for mechanism in MECHANISMS:
            build_query = BUILDERS[query][mechanism]

            def job(worker: Any, build_query: Any = build_query, config: Any = config) -> Any:
                def build(scope: Any) -> Any:
                    return collect(build_query(nexmark_source(scope, events, config), config))
                return worker.dataflow(build)

            frames = []
            for capture in execute(job, workers=WORKERS):
                for t, batch in capture.events:
                    frame = batch.to_pandas()
                    frame["_time"] = t
                    frames.append(frame)
            results[mechanism] = pd.concat(frames, ignore_index=True)
        columns = [*OUTPUT[query][0], "_time"]
        for mechanism in MECHANISMS[1:]:
            compare_exact(results[mechanism], results["tokens"], columns)  # raises if not
        verdicts[query] = (f"equal: {len(results['tokens']):,} rows at "
                           f"{results['tokens']['_time'].nunique():,} times, every variant")
        log(f"{query}: {verdicts[query]}")
    return verdicts


# -- the open loop -----------------------------------------------------------------------------


def worker_events(rate: int, duration: float, worker: int, peers: int
                  ) -> tuple[int, dict[str, pa.RecordBatch], dict[str, np.ndarray]]:
    """This worker's share of ``duration`` s of events at ``rate``: the base time (ms), the
    rows per kind (the columns the queries read) and per kind the row offset of every ms.

    The event numbers are cut into blocks of about 10 ms of event time, dealt to the workers
    round-robin (``worker_blocks``), so each worker generates only its own events."""
    generator_rate = min(rate, GENERATOR_MAX)
    if 1_000_000 % generator_rate:
        raise ValueError(f"{rate} events/s: the generator needs a whole number of µs per event")
    speed = rate / generator_rate
    config = GeneratorConfig(rate=generator_rate)
    n = int(rate * (duration + 0.5))
    parts = [generate(first, count, config)
             for first, count in worker_blocks(worker, peers, n, max(1_000, rate // 100))]
    base = config.base_time_ms
    span = int(duration * 1000 * speed) + 501
    rows: dict[str, pa.RecordBatch] = {}
    offsets: dict[str, np.ndarray] = {}
    for kind, columns in COLUMNS.items():
        batch = pa.Table.from_batches([p[kind].select(columns) for p in parts]).combine_chunks()
        rows[kind] = batch.to_batches()[0] if batch.num_rows else \
            pa.RecordBatch.from_pylist([], schema=batch.schema)
        dates = rows[kind].column("dateTime").to_numpy()
        offsets[kind] = np.searchsorted(dates, base + np.arange(span + 1), side="left")
    return base, rows, offsets


def drive_events(worker: Any, handles: dict[str, Any], probe: Any, load: Load,
                 events: tuple[int, dict[str, pa.RecordBatch], dict[str, np.ndarray]]
                 ) -> WorkerReport:
    """Offer the events open-loop (see the module notes) and record per-time latency.

    Event time runs ``speed = rate / min(rate, GENERATOR_MAX)`` times faster than the clock:
    logical time ``m`` closes at ``t0 + (m - base + 1) / speed`` ms."""
    base, rows, offsets = events
    report = WorkerReport(worker.index)
    hist = Histogram()
    abort = Abort()
    clock = time.monotonic_ns
    for h in handles.values():
        h.advance_to(1)
    worker.step_while(lambda: probe.less_than(1))
    for h in handles.values():
        h.advance_to(base)
    t0 = agree_start(worker)  # event time m closes at t0 + (m - base + 1) ms on every worker
    cpu0 = time.thread_time()
    speed = load.rate / min(load.rate, GENERATOR_MAX)
    ms_ns = 1_000_000 / speed  # clock ns per ms of event time
    since = base + int(load.warmup * 1000 * speed)
    end = t0 + int(load.duration * NS)
    closed = base  # every time < closed has been sent and closed
    done = base  # every time < done has its latency recorded
    last = int(load.duration * 1000 * speed)

    def close_ns(m: int) -> int:
        return t0 + int((m - base + 1) * ms_ns)

    def observe(now: int, low: int) -> None:
        nonlocal done
        upto = closed if low < 0 else min(low, closed)
        while done < upto:
            if done >= since:
                hist.add(now - close_ns(done))
            done += 1
        if done < closed and now - close_ns(done) > DNF_NS:
            abort.set(f"time {done - base} ms {(now - close_ns(done)) / 1e9:.2f} s late")

    while True:
        now = clock()
        if now >= end:
            break
        due = min(base + int((now - t0) / ms_ns), base + last)
        if due > closed:
            report.behind_ns = max(report.behind_ns, now - close_ns(closed))
        if closed < due:
            while closed < due:
                i = closed - base
                for kind, h in handles.items():
                    lo, hi = int(offsets[kind][i]), int(offsets[kind][i + 1])
                    if hi > lo:
                        h.advance_to(closed)
                        h.send_batch(rows[kind].slice(lo, hi - lo))
                closed += 1
                report.offered += sum(int(offsets[k][i + 1] - offsets[k][i]) for k in handles)
            for h in handles.values():  # only when it moves: advance_to activates the input
                h.advance_to(closed)
        wake = close_ns(closed)
        worker.step_or_park(max(0.0, min((wake - clock()) / NS, 0.002)))
        report.steps += 1
        frontier = probe.with_frontier()
        observe(clock(), min(frontier) if frontier else -1)
        if abort.set_:
            break
    report.cpu = time.thread_time() - cpu0
    for h in handles.values():
        h.close()
    deadline = clock() + int(load.drain_limit * NS)
    while worker.step_or_park(0.002):
        frontier = probe.with_frontier()
        observe(clock(), min(frontier) if frontier else -1)
        if clock() > deadline and not abort.set_:
            abort.set(f"drain longer than {load.drain_limit:.0f} s")
    observe(clock(), -1)
    if hist.max > DNF_NS:
        abort.set(f"latency {hist.max / 1e9:.2f} s")
    report.dnf = abort.reason if abort.set_ else None
    report.hist = hist
    report.seconds = (clock() - t0) / NS
    return report


def run(query: str, mechanism: str, load: Load) -> dict[str, Any]:
    build_query = BUILDERS[query][mechanism]
    rate = int(load.rate)

    def job(worker: Any) -> WorkerReport:
        events = worker_events(rate, load.duration, worker.index, worker.peers)

        def dataflow(scope: Any) -> Any:
            handles, streams = {}, {}
            for kind in COLUMNS:
                handles[kind], streams[kind] = scope.new_input(name=kind)
            return handles, build_query(streams, None).probe()

        handles, probe = worker.dataflow(dataflow)
        return drive_events(worker, handles, probe, load, events)

    reports = execute(job, workers=WORKERS, runtime=RUNTIME,
                      timeout=load.duration + load.drain_limit + 120)
    return merge({"query": query, "mechanism": mechanism, "rate": rate,
                  "duration": load.duration}, reports).row()


def measure(quick: bool) -> dict[str, Any]:
    started = machine()
    verdicts = check_equal(20_000 if quick else 50_000)
    duration = 1.5 if quick else 2.0
    rates = RATES[:3] if quick else RATES
    rows: list[dict[str, Any]] = []
    for query in QUERIES:
        failed: set[str] = set()
        for rate in rates:
            for mechanism in MECHANISMS:
                if mechanism in failed:
                    rows.append({"query": query, "mechanism": mechanism, "rate": rate,
                                 "dnf": "not run: DNF at a lower rate", "skipped": True})
                    continue
                seconds = min(duration, max(1.0, MAX_EVENTS / rate - 0.5))
                row = confirmed(lambda q=query, m=mechanism, r=rate, d=seconds: run(
                    q, m, Load(r, 1_000_000, duration=d)))
                rows.append(row)
                log(f"{query} {rate:>8,}/s {mechanism:<13} p50 {fmt_ms(row['p50']):>6} "
                    f"p99.9 {fmt_ms(row['p999']):>6} max {fmt_ms(row['max']):>6} "
                    f"{row['dnf'] or ''}")
                if row["dnf"]:
                    failed.add(mechanism)
            if len(failed) == len(MECHANISMS):
                break
    return {"machine": started, "load_end": load_end(), "quick": quick, "rows": rows, "verdicts": verdicts,
            "duration": duration}


# -- report --------------------------------------------------------------------------------------


def report(data: dict[str, Any]) -> str:
    rows = data["rows"]
    lines = ["# Evaluation, §7.4: NEXMark Q4 and Q7", "", header(data), "",
             f"{WORKERS} workers on the `{RUNTIME}` runtime (this machine's 2 cores, shared).  "
             "Events from the NEXMark generator offered open-loop at the given rate (event time "
             "advancing 1 ms per ms), one logical time per ms; latency of a logical time from the "
             "moment the input closed it to the moment the query's output frontier passed it "
             "(p50 / p99.9 / max, ms); DNF: above 1 s.  "
             f"{data['duration']:.1f} s per run (shorter above {fmt_rate(MAX_EVENTS / 2.5)} "
             f"events/s: at most {fmt_rate(MAX_EVENTS)} events, at least 1 s; 0.5 s warm-up); "
             "at each rate the three "
             "mechanisms run one after the other; one run on a shared machine.", "",
             "Outputs checked before measuring (closed loop, 2 workers, the same events for "
             "every variant; rows and their logical times compared exactly):", ""]
    lines += [f"- {q.upper()}: {v}" for q, v in data["verdicts"].items()]
    lines.append("")
    for query in QUERIES:
        mine = [r for r in rows if r["query"] == query]
        rates = sorted({r["rate"] for r in mine})
        lines += [f"## NEXMark {query.upper()}", ""]
        body = []
        for rate in rates:
            cells = [fmt_rate(rate), str(WORKERS)]
            for mechanism in MECHANISMS:
                r = next(x for x in mine if x["rate"] == rate and x["mechanism"] == mechanism)
                cells += (["DNF", "", ""] if r["dnf"] else
                          [fmt_ms(r["p50"]) + (" †" if r.get("retried") else ""),
                           fmt_ms(r["p999"]), fmt_ms(r["max"])])
            body.append(cells)
        headers = ["events/s", "workers"]
        for mechanism in MECHANISMS:
            headers += [f"{mechanism} p50", "p99.9", "max"]
        lines += [table(headers, body), ""]
        dnfs = [r for r in mine if r["dnf"] and not r.get("skipped")]
        if dnfs:
            lines += ["Why each DNF: " + "; ".join(
                f"{r['mechanism']} at {fmt_rate(r['rate'])}/s: {r['dnf']}" for r in dnfs), ""]
    lines += [RETRY_NOTE, "", "![p50 and p99.9 per offered rate](evaluation_nexmark.png)", ""]
    return "\n".join(lines)


LABEL = {"p50": "p50", "p999": "p99.9", "max": "max"}


def plot(data: dict[str, Any], path: Path) -> None:
    colors = {"tokens": "tab:blue", "notifications": "tab:red", "watermarks": "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, query in zip(axes, QUERIES, strict=True):
        for mechanism in MECHANISMS:
            mine = sorted((r for r in data["rows"] if r["query"] == query
                           and r["mechanism"] == mechanism), key=lambda r: r["rate"])
            ok = [r for r in mine if not r["dnf"]]
            for stat, style in (("p50", "-"), ("p999", "--")):
                ax.plot([r["rate"] for r in ok], [r[stat] for r in ok], style, marker="o",
                        ms=3, color=colors[mechanism], label=f"{mechanism} {LABEL[stat]}")
            first = next((r for r in mine if r["dnf"] and not r.get("skipped")), None)
            if first:
                ax.plot([first["rate"]], [1000], "x", color=colors[mechanism], ms=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered events/s (2 workers)")
        ax.set_title(f"NEXMark {query.upper()} (x at 1 s: first DNF)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("latency per logical time (ms)")
    axes[0].legend(fontsize=7)
    fig.suptitle("NEXMark open loop, tokens vs notifications vs watermarks (shared 2-core "
                 "machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    run_script("evaluation_nexmark", __doc__, measure, report, plot)


if __name__ == "__main__":
    main()
