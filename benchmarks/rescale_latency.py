"""Issue 16's latency acceptance point on NEXMark (the seed's section 5 figure): epoch latency over
time while q4, q5 and q8 rescale 2 -> 3 -> 4 -> 3 -> 2 at half of their maximum throughput, per
migration strategy.

Writes the section "NEXMark q4/q5/q8: epoch latency through 2 -> 3 -> 4 -> 3 -> 2" at the end of
``benchmarks/results/rescale.md`` (replacing that section of an earlier run; the word-count
sections that ``benchmarks/rescale.py`` writes are kept), ``benchmarks/results/rescale.nexmark.png``
(latency over time, one panel per query x strategy, the migration windows shaded) and
``benchmarks/results/rescale.nexmark.json`` (every epoch of every run).

A script of its own rather than a mode of ``rescale.py``: that one drives a hand-written word
count on its own send grid; this one goes through ``tokenflow.nexmark.run.run_query`` (its
sources, its per-epoch latency, its migration reports), so the two share nothing but the
targets.

Per query (``run_query`` on the ``process`` runtime, 4 worker processes, the routing table
starting on workers 0 and 1: the roster changes among the started processes, as in the
word-count section; 10,000 auctions in flight as in ``rescale_nexmark.py``, epochs of 100 ms):

1. **Maximum throughput**: the same elastic job without rescaling, closed loop (``lag`` 4
   epochs in flight per worker), events/s from the first send to the last output.  A short
   calibration run first; the measured run's epochs then have the size the paced runs will have
   (event-time rate = half the calibration), so both measure the same per-epoch costs.
2. **Paced runs** at half of the measured maximum (``run_query(pace=...)``, open loop: every
   source worker sends an epoch once its first event is due at the pace, counted from the
   first epoch passing its probe, so all workers offer an epoch at the same moment; the
   generator's rate is the pace, but its events are a whole number of microseconds apart
   (Beam's ``rateToPeriodUs``), so above about 300,000 events/s event time runs faster than
   the wall clock (at 698,000 events/s: 1,000,000 events a second of event time, so an epoch
   of 100 ms of event time is offered every 143 ms: ``epoch_seconds``); ``lag`` 10,000: never
   limited),
   ``SECONDS`` long: once without rescaling (the reference: its rows are the expected output,
   its latencies the noise floor) and once per strategy with the roster changed to 3, 4, 3, 2
   when worker 0 has sent the epochs of ``CHANGES`` seconds (``rescale_at``: the epochs
   offered at those wall-clock points of the paced input).  Fluid uses 256 bins (one bin per
   step), the others 4,096.

Measures, per run: epoch latency (``run_query``: the last worker's output frontier passing the
epoch less the last worker's send of it); a *migration window* per change from worker 0's
request (its send of the epoch that triggered it) until the output passed the change's last
step (``ChangeReport.end``); *steady*: epochs sent after ``WARMUP`` s and before the first
request; *during migration*: epochs whose [sent, passed] overlaps a window; *zero throughput*:
wall-clock periods of one epoch (``epoch_seconds``, from the first send; after ``WARMUP``) in
which no epoch's output completed, the longest run of them (2 or more: throughput zero for two
consecutive epochs).  Every run's rows must equal the reference's.

Run: ``nice -n 10 .venv/bin/python benchmarks/rescale_latency.py`` (about 12 minutes on 2
cores) or ``--quick`` (q5 only, shorter runs: a smoke test, writes nothing); ``--report``
rewrites the section and the plot from the saved JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
QUERIES = ("q4", "q5", "q8")
STRATEGIES = ("all-at-once", "fluid", "batched")
WORKERS = 4
START = 2
ROSTERS = (3, 4, 3, 2)
GRANULARITY = 100
"""Epoch length, ms of event time (``epoch_seconds`` of wall time at the paced rate)."""
CHANGES = (10.0, 20.0, 30.0, 40.0)
"""Seconds of paced input after which worker 0 asks for each roster of ``ROSTERS``."""
SECONDS = 50.0
WARMUP = 2.0
IN_FLIGHT = 10_000
CALIBRATION_RATE = 30_000
P99_RATIO_TARGET, P99_TARGET_MS, MAX_TARGET_MS = 2.0, 100.0, 250.0
BLOCK_TARGET_MS = 5.0
HEADING = "\n## NEXMark q4/q5/q8: epoch latency through 2 -> 3 -> 4 -> 3 -> 2"
READING = "\n### Reading the NEXMark run"


def config(rate: int) -> Any:
    from tokenflow.nexmark.generator import GeneratorConfig

    return GeneratorConfig(rate=rate, num_in_flight_auctions=IN_FLIGHT)


def maximum(query: str, seconds: float) -> dict[str, Any]:
    """Closed-loop events/s of the elastic job on 2 of 4 workers, no rescaling: a calibration
    run, then a run whose epochs have the size of the paced runs'."""
    from tokenflow.nexmark.run import run_query

    def run(rate: int, events: int) -> float:
        r = run_query(query, events, workers=WORKERS, runtime="process", roster=START,
                      granularity_ms=GRANULARITY, lag=4, generator=config(rate))
        return float(r.events_per_second)

    calibration = run(CALIBRATION_RATE, int(CALIBRATION_RATE * seconds / 2))
    rate = int(calibration / 2)
    measured = run(rate, int(calibration * seconds))
    return {"calibration": calibration, "calibration_rate": CALIBRATION_RATE,
            "rate": rate, "events_per_second": measured}


def epoch_seconds(pace: int) -> float:
    """Wall seconds between two epochs offered at ``pace`` events/s: an epoch holds
    ``GRANULARITY`` ms of event time, and the generator's event time runs at a whole number of
    microseconds per event (``GeneratorConfig.inter_event_delay_us``)."""
    event_rate = 1_000_000 / config(pace).inter_event_delay_us
    return GRANULARITY / 1000 * event_rate / pace


def paced(query: str, pace: int, seconds: float, strategy: str | None,
          changes: tuple[float, ...]) -> dict[str, Any]:
    """One paced run (``strategy`` None: without rescaling); plain data."""
    from tokenflow.nexmark.run import run_query

    events = int(pace * seconds)
    epochs_per_second = 1 / epoch_seconds(pace)
    options: dict[str, Any] = {}
    if strategy is not None:
        options = {"rescale_at": [(int(round(s * epochs_per_second)), n)
                                  for s, n in zip(changes, ROSTERS, strict=True)],
                   "strategy": strategy, "bins": 256 if strategy == "fluid" else None}
    began = time.time()
    load = os.getloadavg()[0]
    r = run_query(query, events, workers=WORKERS, runtime="process", roster=START,
                  elastic=True, granularity_ms=GRANULARITY, lag=10_000, pace=float(pace),
                  generator=config(pace), **options)
    return {
        "query": query, "strategy": strategy or "none", "pace": pace, "events": events,
        "wall": time.time() - began, "load": [load, os.getloadavg()[0]],
        "started": r.started, "sent": [s - r.started for s in r.sent_at],
        "latency_ms": r.latencies_ms, "epochs": r.epoch_times, "seconds": r.seconds,
        "epoch_seconds": epoch_seconds(pace),
        "rows": r.rows, "requests": [int(round(s * epochs_per_second)) for s in changes]
        if strategy is not None else [],
        "migrations": [{"time": m.time, "end": m.end, "steps": m.steps, "bins": m.bins,
                        "before": m.before, "after": m.after,
                        "longest_take": m.longest_take, "longest_load": m.longest_load,
                        "longest_take_cpu": m.longest_take_cpu,
                        "longest_load_cpu": m.longest_load_cpu,
                        "longest_take_held": m.longest_take_held,
                        "longest_load_held": m.longest_load_held,
                        "timeline": [{k: (v - r.started if k != "time" and v > 1e9 else v)
                                      for k, v in e.items()} for e in m.timeline]}
                       for m in r.migrations],
    }


def analyse(run: dict[str, Any]) -> dict[str, Any]:
    """Windows, steady / migration percentiles, zero-throughput periods of one paced run."""
    sent = np.array(run["sent"])
    lat = np.array(run["latency_ms"])
    passed = sent + lat / 1000
    epochs = np.array(run["epochs"])
    windows = []
    period = run.get("epoch_seconds", GRANULARITY / 1000)  # JSON of older runs: 100 ms
    for k, m in zip(run["requests"], run["migrations"], strict=False):
        # worker 0 asked once it had sent epoch k-1; the first step is at the data frontier
        # then (+1), which may be an epoch before: the window starts at the earlier send
        at_step = np.flatnonzero(epochs <= m["time"])
        begin = float(min(sent[min(k, len(sent)) - 1], sent[at_step[-1]] if at_step.size else 0))
        after = np.flatnonzero(epochs >= m["end"])
        end = float(passed[after[0]]) if after.size else float(passed.max())
        windows.append((begin, max(end, begin + period)))  # at least one epoch long
    first = windows[0][0] if windows else float("inf")
    steady = lat[(sent >= WARMUP) & (sent < first)]
    during = np.zeros(len(lat), dtype=bool)
    for lo, hi in windows:
        during |= (sent <= hi) & (passed >= lo)
    mig = lat[during]
    last = float(passed.max())
    counts = np.bincount((passed / period).astype(int), minlength=int(last / period) + 1)
    counts = counts[: int(sent.max() / period) + 1]  # periods while input was offered
    longest, run_len, at = 0, 0, 0.0
    for i, c in enumerate(counts):
        if i * period < WARMUP:  # start-up (first epochs of a fresh job) is not counted
            continue
        run_len = run_len + 1 if c == 0 else 0
        if run_len > longest:
            longest, at = run_len, (i - run_len + 1) * period
    in_window = any(lo - period <= at <= hi for lo, hi in windows)

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    return {"windows": windows, "steady_n": int(steady.size), "steady_p50": pct(steady, 50),
            "steady_p99": pct(steady, 99), "mig_n": int(mig.size), "mig_p99": pct(mig, 99),
            "mig_max": float(mig.max()) if mig.size else float("nan"),
            "all_max": float(lat[sent >= WARMUP].max()), "zero_run": longest, "zero_at": at,
            "zero_in_window": in_window, "late_ms": 0.0}


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = sorted({r["query"] for r in runs})
    fig, axes = plt.subplots(len(queries), len(STRATEGIES), figsize=(15, 3.3 * len(queries)),
                             sharex=True, squeeze=False)
    for i, q in enumerate(queries):
        reference = next(r for r in runs if r["query"] == q and r["strategy"] == "none")
        for j, s in enumerate(STRATEGIES):
            ax = axes[i][j]
            run = next((r for r in runs if r["query"] == q and r["strategy"] == s), None)
            ax.plot(reference["sent"], reference["latency_ms"], color="0.7", lw=0.8,
                    label="no rescaling")
            if run is not None:
                for lo, hi in run["analysis"]["windows"]:
                    ax.axvspan(lo, hi + 0.05, color="tab:orange", alpha=0.3, lw=0)
                ax.plot(run["sent"], run["latency_ms"], color="tab:blue", lw=0.8, label=s)
            ax.axhline(P99_TARGET_MS, color="tab:green", ls="--", lw=0.8)
            ax.axhline(MAX_TARGET_MS, color="tab:red", ls="--", lw=0.8)
            ax.set_yscale("log")
            ax.set_title(f"{q}, {s} (pace {reference['pace']:,} events/s)", fontsize=9)
            if j == 0:
                ax.set_ylabel("epoch latency, ms")
            if i == len(queries) - 1:
                ax.set_xlabel("seconds since the first send")
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("NEXMark epoch latency through rosters 2 -> 3 -> 4 -> 3 -> 2 (shaded: migration "
                 "windows; dashed: 100 ms and 250 ms)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:,.1f}"


def report(runs: list[dict[str, Any]], maxima: dict[str, dict[str, Any]], header: str) -> str:
    lines = [HEADING, "", header, "", "Maximum throughput (closed loop, elastic job on workers "
             "0-1 of 4 processes, no rescaling) and the paced load:", "",
             "| query | calibration events/s (event-time rate 30,000) | measured events/s "
             "(event-time rate = half the calibration) | pace: offered events/s | an epoch "
             f"({GRANULARITY} ms of event time) offered every, ms |",
             "|---|---:|---:|---:|---:|"]
    for q, m in maxima.items():
        lines.append(f"| {q} | {m['calibration']:,.0f} | {m['events_per_second']:,.0f} | "
                     f"{m['pace']:,} | {epoch_seconds(m['pace']) * 1000:.0f} |")
    lines += ["", "| query | strategy | load avg start, end | steady epochs | steady p50 ms | "
              "steady p99 ms | migration epochs | migration p99 ms | p99 <= 2x steady and "
              "<= 100 ms | migration max ms | max <= 250 ms | longest run of zero-output "
              "epochs | never zero 2 epochs running | output identical | windows ms |",
              "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---|---|---|"]
    for r in runs:
        a = r["analysis"]
        if r["strategy"] == "none":
            p99_ok = max_ok = zero_ok = "(reference)"
        else:
            ratio = a["mig_p99"] / a["steady_p99"] if a["steady_p99"] else float("nan")
            p99_ok = ("**met**" if a["mig_p99"] <= min(P99_RATIO_TARGET * a["steady_p99"],
                                                       P99_TARGET_MS) else "**not met**") + \
                f" ({ratio:.1f}x)"
            max_ok = "**met**" if a["mig_max"] <= MAX_TARGET_MS else "**not met**"
        zero_ok = "**met**" if a["zero_run"] < 2 else "**not met**"
        where = f"{a['zero_run']} (at {a['zero_at']:.1f} s{', in a window' if a['zero_in_window'] else ''})"
        windows = ", ".join(f"{1000 * (hi - lo):.0f}" for lo, hi in a["windows"]) or "-"
        lines.append(
            f"| {r['query']} | {r['strategy']} | {r['load'][0]:.1f}, {r['load'][1]:.1f} | "
            f"{a['steady_n']} | {fmt(a['steady_p50'])} | {fmt(a['steady_p99'])} | {a['mig_n']} | "
            f"{fmt(a['mig_p99'])} | {p99_ok} | {fmt(a['mig_max'])} | {max_ok} | {where} | "
            f"{zero_ok} | {'yes' if r['identical'] else '**no**'} | {windows} |")
    lines += ["", "![NEXMark epoch latency over time per query and strategy](rescale.nexmark.png)",
              "", "Per change: steps, bins moved, the window from the request to the output "
              "passing the last step, the longest block of migration work on one worker, "
              "of taking (old owner: one activation's prepares, take slices and flush; runs "
              "saved before 2026-11-29 22:40 UTC measured single slices) and of loading (new owner: one "
              "run of load slices), ms: wall clock; in brackets *held*, the most time one "
              "block held its worker (`tokenflow.rescale.clock.SliceClock`: its thread CPU "
              "time if the thread never blocked in it, else the wall clock less the thread's "
              "run-queue wait; the time the OS ran other processes in between, 4 workers and "
              "the driver on 2 cores, or the virtual machine's host took, is not the "
              "migration blocking the worker) and the most thread CPU time one block used "
              "(`time.thread_time`). "
              f"*No worker blocked > {BLOCK_TARGET_MS:.0f} ms* judges *held* (runs saved "
              "before it was recorded: wall clock). Then where "
              "the window's time went (ms, wall clock, "
              "from the workers' `StepStats` / `LoadStats` through `ChangeReport.timeline`; "
              "the longest over the change's steps):", "",
              "| query | strategy | change | steps | bins | window ms | longest take block ms "
              "| longest load block ms | no worker blocked > 5 ms | request -> first take | "
              "first take -> last slice flushed | first take -> first part at a new owner | "
              "first part -> all loaded | all loaded -> output passed the step |",
              "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        for m, (lo, hi) in zip(r["migrations"], r["analysis"]["windows"], strict=False):
            steps = m.get("timeline", [])

            def span(a: str, b: str, steps: list[dict[str, float]] = steps) -> str:
                gaps = [e[b] - e[a] for e in steps if a in e and b in e]
                return fmt(1000 * max(gaps)) if gaps else "-"

            last = steps[-1] if steps else {}
            first = steps[0] if steps else {}
            request = fmt(1000 * (first["due"] - lo)) if "due" in first else "-"
            tail = fmt(1000 * (hi - last["loaded"])) if "loaded" in last else "-"
            block = 1000 * max(blocked(m, "take"), blocked(m, "load"))
            lines.append(f"| {r['query']} | {r['strategy']} | {len(m['before'])}->"
                         f"{len(m['after'])} | {m['steps']} | {m['bins']} | "
                         f"{1000 * (hi - lo):.0f} | {slice_ms(m, 'take')} | "
                         f"{slice_ms(m, 'load')} | "
                         f"{'**met**' if block <= BLOCK_TARGET_MS else '**not met**'} | "
                         f"{request} | {span('due', 'sent')} | {span('due', 'arrived')} | "
                         f"{span('arrived', 'loaded')} | {tail} |")
    return "\n".join(lines) + "\n"


def blocked(migration: dict[str, Any], kind: str) -> float:
    """Seconds the longest ``kind`` block of migration work held its worker:
    ``longest_{kind}_held`` (wall clock without the OS's preemption), or the wall clock in runs
    saved without it."""
    held = migration.get(f"longest_{kind}_held")
    return float(migration.get(f"longest_{kind}", 0.0) if held is None else held)


def slice_ms(migration: dict[str, Any], kind: str) -> str:
    """The longest ``kind`` block's wall ms, then in brackets the most ms one block held its
    worker and the most CPU ms one used (runs saved before these were recorded: fewer)."""
    wall = fmt(1000 * migration.get(f"longest_{kind}", 0.0))
    held = migration.get(f"longest_{kind}_held")
    cpu = migration.get(f"longest_{kind}_cpu")
    inner = [f"{fmt(1000 * v)} {name}" for name, v in (("held", held), ("CPU", cpu))
             if v is not None]
    return f"{wall} ({', '.join(inner)})" if inner else wall


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--report", action="store_true",
                        help="rewrite the report and plot from rescale.nexmark.json (no runs)")
    args = parser.parse_args()
    from _provenance import provenance

    if args.report:
        saved = json.loads((RESULTS / "rescale.nexmark.json").read_text())
        for r in saved["runs"]:
            r["analysis"] = analyse(r)
        write(saved["runs"], saved["maxima"], saved["header"])
        return

    queries = ["q5"] if args.quick else args.queries.split(",")
    seconds = 14.0 if args.quick else SECONDS
    changes = (4.0, 6.5, 9.0, 11.5) if args.quick else CHANGES
    strategies = ("batched",) if args.quick else STRATEGIES
    began = datetime.now(UTC)
    header = (f"Run {began:%Y-%m-%d %H:%M} UTC, `benchmarks/rescale_latency.py`, on "
              f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work; 4 worker "
              f"processes and the driver on them), Python {platform.python_version()}; 1-minute "
              f"load average {os.getloadavg()[0]:.1f} at the start. {provenance()} Load: half of "
              f"each query's measured maximum throughput, {seconds:.0f} s paced, epochs of "
              f"{GRANULARITY} ms of event time (offered every `epoch_seconds` of wall time: the "
              f"table below), roster changes at {', '.join(f'{s:.0f}' for s in changes)} s.")
    runs: list[dict[str, Any]] = []
    maxima: dict[str, dict[str, Any]] = {}
    for q in queries:
        m = maximum(q, 6.0 if args.quick else 10.0)
        m["pace"] = int(m["events_per_second"] / 2)
        maxima[q] = m
        print(f"{q}: max {m['events_per_second']:,.0f} events/s (calibration "
              f"{m['calibration']:,.0f}); pace {m['pace']:,}", flush=True)
        reference = paced(q, m["pace"], seconds, None, changes)
        for s in (None, *strategies):
            run = reference if s is None else paced(q, m["pace"], seconds, s, changes)
            run["identical"] = bool(run["rows"].equals(reference["rows"]))
            run["analysis"] = analyse(run)
            a = run["analysis"]
            print(f"  {q} {run['strategy']}: steady p99 {fmt(a['steady_p99'])} ms, migration p99 "
                  f"{fmt(a['mig_p99'])} max {fmt(a['mig_max'])} ms, zero run {a['zero_run']}, "
                  f"identical {run['identical']}, {run['wall']:.0f} s", flush=True)
            runs.append(run)
    if args.quick:
        return
    for r in runs:
        r["rows"] = len(r["rows"])
    (RESULTS / "rescale.nexmark.json").write_text(json.dumps(
        {"header": header, "maxima": maxima, "runs": runs}, indent=1, default=float))
    write(runs, maxima, header)


def write(runs: list[dict[str, Any]], maxima: dict[str, dict[str, Any]], header: str) -> None:
    """The plot and this section of ``rescale.md`` (a hand-written reading after the marker
    ``READING`` in the section is kept)."""
    plot(runs, RESULTS / "rescale.nexmark.png")
    text = report(runs, maxima, header)
    print(text)
    path = RESULTS / "rescale.md"
    old = path.read_text() if path.exists() else ""
    at = old.find(HEADING)
    kept = old[:at] if at >= 0 else old.rstrip("\n") + "\n"
    reading = old.find(READING, at) if at >= 0 else -1
    path.write_text(kept + text + (old[reading:] if reading >= 0 else ""))


if __name__ == "__main__":
    main()
