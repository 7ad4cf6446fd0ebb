"""Issue 16's first acceptance point, in full: NEXMark q4, q5 and q8 with migrating state,
rosters 2 -> 3 -> 4 -> 3 -> 2 at random points, 50 random schedules on the process runtime and
on Spark, each output compared with a run that never rescales; plus the state moved per change.

Writes ``benchmarks/results/rescale_nexmark.md`` and ``rescale_nexmark.json`` (and prints the
report).

Each schedule ``i`` (seeded by ``i``): query ``q4``, ``q5`` or ``q8`` in turn; runtime Spark
(``local[4]``) for every fifth, else process; 4 worker processes whose roster starts at workers
0..1; a random strategy (all-at-once, fluid, batched; 4,096 bins, 256 for fluid, which moves one
bin per step); and the four changes at random points:
either at four distinct random epochs of the input (worker 0 asks once its sources have sent
that epoch, ``run_query(rescale_at=...)``; even ``i``) or at four random wall-clock seconds
within the reference run's duration (the driver's ``JobHandle.rescale`` through the control
plane, ``rescale_schedule``; odd ``i``; a change the job outlived is reported as not made).
The events: ``--events`` (default 300,000) at 20,000 events/s of event time (15 s), epochs
of 200 ms, 10,000 auctions in flight (the generator's default of 100 leaves Q4 a few hundred
open auctions: too few keys for the 2 % margin); the epoch points lie in the middle 60 % of
the input, the wall-clock ones between 15 % and 65 % of a run without rescaling on the same
runtime (start-up included, the shorter of two runs).

The reference per query is the ordinary build (plain exchanges, no ``tokenflow.rescale``) on
the thread runtime with 2 workers; the rows of every schedule's run must equal it exactly
(``pandas`` frame equality after sorting by every column).  Moves are measured
(``measure=True``) and checked per change: scale-out from W to W+1 owners moves at most
``1/(W+1) + 2 %`` of the state's bytes, all to the newcomer (``ChangeReport.share``: each
step's bytes against the bytes held at that step, as the state changes while a fluid or
batched change runs); scale-in
moves exactly the bins the leaving worker owned (the table before the change rebuilt from the
moves worker 0 sent), only from it, and with all-at-once exactly its bytes.

With ``--join`` the job starts 2 worker processes (Spark: tasks) in 4 slots and every change is
a wall-clock one in which worker processes **join** the running query and **leave** it
(``run_query(max_workers=4)``: ``JobHandle.scale``, ``tokenflow.membership``) instead of the
roster changing among 4 started processes; the changes follow each other (a join waits for its
process) from random seconds within the first half of a run without rescaling; results in
``rescale_nexmark_join.md`` / ``.json``.

Run: ``.venv/bin/python benchmarks/rescale_nexmark.py`` (``--schedules 50``, about 15 minutes
on a 2-core machine) or ``--schedules 6`` for a quick look.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUERIES = ("q4", "q5", "q8")
RATE = 20_000
GRANULARITY = 200
IN_FLIGHT = 10_000
"""Auctions in flight (the generator's default, 100, leaves Q4 a state of a few hundred open
auctions, too few keys for a 2 % margin on the bytes a third of the bins hold)."""
WORKERS = 4
ROSTERS = (3, 4, 3, 2)
FLUID_BINS = 256
"""Bins of the routing table for ``fluid`` (one bin per step; 4,096 bins made one run take
minutes: every step takes a bin out of the state by rebuilding the rest, and with
``measure`` every worker exports its whole state at every step)."""


def generator() -> Any:
    from tokenflow.nexmark.generator import GeneratorConfig

    return GeneratorConfig(rate=RATE, num_in_flight_auctions=IN_FLIGHT)


def violations(result: Any, strategy: str) -> list[str]:
    """The move bounds of the module docstring that ``result`` breaks (empty: none)."""
    out = []
    for c in result.migrations:
        if len(c.after) > len(c.before):
            newcomers = sorted(set(c.after) - set(c.before))
            if c.receivers != newcomers:
                out.append(f"change {c.index}: bins went to {c.receivers}, not {newcomers}")
            bound = 1 / len(c.after) + 0.02
            if c.total_bytes and c.share > bound:
                out.append(f"change {c.index}: moved {c.share:.3f} of the state > {bound:.3f}")
        elif len(c.after) < len(c.before):
            leaving = sorted(set(c.before) - set(c.after))
            if c.senders != leaving:
                out.append(f"change {c.index}: bins came from {c.senders}, not {leaving}")
            owned = sorted(b for w in leaving for b in c.owned_before.get(w, []))
            if c.moved_bins != owned:
                out.append(f"change {c.index}: moved {len(c.moved_bins)} bins, the leaving "
                           f"worker owned {len(owned)}")
            if strategy == "all-at-once" and \
                    c.moved_bytes != sum(c.sender_bytes.get(w, 0) for w in leaving):
                out.append(f"change {c.index}: moved {c.moved_bytes} bytes, the leaving worker "
                           f"held {sum(c.sender_bytes.get(w, 0) for w in leaving)}")
    return out


def run_schedule(i: int, events: int, references: dict[str, pd.DataFrame],
                 durations: dict[tuple[str, str], float], epochs: int,
                 join: bool = False) -> dict[str, Any]:
    from tokenflow.nexmark.run import run_query
    from tokenflow.rescale import STRATEGIES

    rng = random.Random(i)
    query = QUERIES[i % len(QUERIES)]
    runtime = "spark" if i % 5 == 4 else "process"
    strategy = rng.choice(STRATEGIES)
    expected = references[query]
    options: dict[str, Any] = {"workers": WORKERS, "roster": 2}
    if join:  # worker processes join and leave; only the driver's wall-clock changes
        seconds = durations[(query, runtime)]
        at = sorted(round(rng.uniform(0.0, 0.5) * seconds, 3) for _ in ROSTERS)
        options = {"workers": 2, "max_workers": WORKERS,
                   "rescale_schedule": list(zip(at, ROSTERS, strict=True))}
        when = [f"{a:.2f} s" for a in at]
    elif i % 2 == 0:
        points = sorted(rng.sample(range(int(epochs * 0.2), int(epochs * 0.8)), len(ROSTERS)))
        options["rescale_at"] = list(zip(points, ROSTERS, strict=True))
        when = [f"epoch {p}" for p in points]
    else:
        seconds = durations[(query, runtime)]
        at = sorted(round(rng.uniform(0.15, 0.65) * seconds, 3) for _ in ROSTERS)
        options["rescale_schedule"] = list(zip(at, ROSTERS, strict=True))
        when = [f"{a:.2f} s" for a in at]
    began = time.perf_counter()
    result = run_query(query, events, generator=generator(), runtime=runtime,
                       master="local[4]" if runtime == "spark" else None,
                       granularity_ms=GRANULARITY, strategy=strategy, measure=True,
                       bins=FLUID_BINS if strategy == "fluid" else None, **options)
    elapsed = time.perf_counter() - began
    try:
        pd.testing.assert_frame_equal(result.rows.reset_index(drop=True),
                                      expected.reset_index(drop=True), check_dtype=False)
        same = True
    except AssertionError:
        same = False
    made = len(result.migrations)
    return {
        "schedule": i, "query": query, "runtime": runtime, "strategy": strategy,
        "bins": FLUID_BINS if strategy == "fluid" else 4096,
        "trigger": "epochs" if i % 2 == 0 and not join else "seconds", "when": when,
        "changes_made": made, "rows": len(result.rows), "same_output": same,
        "violations": violations(result, strategy), "seconds": round(elapsed, 2),
        "fractions": [round(c.share, 4) if c.total_bytes else None for c in result.migrations],
        "moved_over_first_total": [round(c.fraction, 4) if c.total_bytes else None
                                   for c in result.migrations],
        "rosters": [[c.before, c.after] for c in result.migrations],
        "moved_bytes": [c.moved_bytes for c in result.migrations],
        "total_bytes": [c.total_bytes for c in result.migrations],
        "errors": [e.error for e in result.rescales if e.error],
    }


def report(rows: list[dict[str, Any]], args: argparse.Namespace, header: dict[str, Any]) -> str:
    same = sum(r["same_output"] for r in rows)
    clean = sum(not r["violations"] for r in rows)
    complete = sum(r["changes_made"] == len(ROSTERS) for r in rows)
    made = sum(r["changes_made"] for r in rows)
    held = sum(f is not None for r in rows for f in r["fractions"])
    join = getattr(args, "join", False)
    lines = [
        "# NEXMark q4/q5/q8 with migrating state: 2 -> 3 -> 4 -> 3 -> 2 at random points"
        + (", worker processes joining and leaving" if join else ""),
        "",
        f"Run {header['when']} on {header['machine']} (load average {header['load']}), "
        f"`benchmarks/rescale_nexmark.py --schedules {args.schedules} --events {args.events}"
        f"{' --join' if join else ''}`. " + header["provenance"],
        "",
        f"* **Output identical to the run without rescaling: {same} of {len(rows)} schedules.**",
        f"* Move bounds held (scale-out <= 1/(W+1) + 2 % of the state bytes, all to the "
        f"newcomer; scale-in exactly the leaving worker's bins): {clean} of {len(rows)}.",
        f"* All four changes made while the job ran: {complete} of {len(rows)} (a wall-clock "
        f"change after the job ended is not made; the output must still match); of the "
        f"{made} changes made, {held} came with state held (the others, wall-clock changes "
        f"in the first few tenths of a second, before the sources had sent anything: they "
        f"still move the bins, and the output must still match).",
        "",
        "Per change, the part of the state's bytes moved (`ChangeReport.share`: each step's "
        "bytes against the bytes held at that step), over the changes made with state held:",
        "",
    ]
    steps: dict[str, list[float]] = {}
    for r in rows:
        for (before, after), f in zip(r["rosters"], r["fractions"], strict=True):
            if f is not None:  # None: no state held yet when the change came
                steps.setdefault(f"{len(before)} -> {len(after)}", []).append(f)
    lines += ["| change | changes measured | mean fraction moved | max | bound |",
              "|---|---|---|---|---|"]
    for key in ("2 -> 3", "3 -> 4", "4 -> 3", "3 -> 2"):
        fs = steps.get(key, [])
        if not fs:
            continue
        w_after = int(key.split()[-1])
        bound = f"{1 / w_after + 0.02:.3f}" if key in ("2 -> 3", "3 -> 4") else \
            "the leaving worker's bins"
        lines.append(f"| {key} | {len(fs)} | {sum(fs) / len(fs):.3f} | {max(fs):.3f} | {bound} |")
    lines += ["", "| # | query | runtime | strategy | changes at | made | rows | same output | "
              "bounds | s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bounds = "ok" if not r["violations"] else "; ".join(r["violations"])
        lines.append(f"| {r['schedule']} | {r['query']} | {r['runtime']} | {r['strategy']} | "
                     f"{', '.join(r['when'])} | {r['changes_made']} | {r['rows']:,} | "
                     f"{'yes' if r['same_output'] else '**NO**'} | {bounds} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=50)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--no-write", action="store_true", help="Print only.")
    parser.add_argument("--report-only", action="store_true",
                        help="Rewrite the report from the saved JSON (no runs).")
    parser.add_argument("--join", action="store_true",
                        help="Worker processes join and leave the running query (2 started, "
                             "4 slots); results in rescale_nexmark_join.*")
    args = parser.parse_args()
    stem = "rescale_nexmark_join" if args.join else "rescale_nexmark"
    if args.report_only:
        saved = json.loads((RESULTS / f"{stem}.json").read_text())
        args.schedules, args.events = len(saved["schedules"]), saved["events"]
        text = report(saved["schedules"], args, saved["header"])
        print(text)
        (RESULTS / f"{stem}.md").write_text(text)
        return
    warnings.simplefilter("ignore")
    from tokenflow.nexmark.run import epoch_plan, run_query

    sys.path.insert(0, str(HERE))
    from _provenance import provenance

    header = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "provenance": provenance(),
              "machine": f"{os.cpu_count()} cores",
              "load": " / ".join(f"{x:.1f}" for x in os.getloadavg())}
    epochs = len(epoch_plan(args.events, generator(), GRANULARITY))
    references: dict[str, pd.DataFrame] = {}
    durations: dict[tuple[str, str], float] = {}
    runtimes = sorted({"spark" if i % 5 == 4 else "process" for i in range(args.schedules)})
    for q in QUERIES:
        references[q] = run_query(q, args.events, generator=generator(), workers=2,
                                  granularity_ms=GRANULARITY).rows
        for runtime in runtimes:  # how long a run lasts, start-up included (wall-clock changes)
            walls = []
            for _ in range(2):  # the shorter of two: the machine is shared
                began = time.perf_counter()
                plain = run_query(q, args.events, generator=generator(), workers=WORKERS,
                                  runtime=runtime,
                                  master="local[4]" if runtime == "spark" else None,
                                  granularity_ms=GRANULARITY)
                walls.append(time.perf_counter() - began)
            durations[(q, runtime)] = min(walls)
            pd.testing.assert_frame_equal(plain.rows.reset_index(drop=True),
                                          references[q].reset_index(drop=True), check_dtype=False)
            print(f"reference {q} on {runtime}: {len(plain.rows):,} rows, "
                  f"{durations[(q, runtime)]:.2f} s", flush=True)
    results = []
    try:
        for i in range(args.schedules):
            r = run_schedule(i, args.events, references, durations, epochs, args.join)
            results.append(r)
            print(f"schedule {i}: {r['query']} {r['runtime']} {r['strategy']} at {r['when']}: "
                  f"same output {r['same_output']}, {r['changes_made']} changes, "
                  f"violations {r['violations'] or 'none'} ({r['seconds']} s)", flush=True)
    finally:
        if any(r["runtime"] == "spark" for r in results):
            from tokenflow.spark.session import stop_session

            stop_session()
    header["load_end"] = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(results, args, header)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{stem}.md").write_text(text)
        (RESULTS / f"{stem}.json").write_text(
            json.dumps({"header": header, "events": args.events, "schedules": results}, indent=1))


if __name__ == "__main__":
    main()
