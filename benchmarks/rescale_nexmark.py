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

With ``--join`` worker processes **join** the running job and **leave** it
(``tokenflow.membership``: ``JobHandle.scale`` from the driver's ``rescale_schedule``) instead of
the roster changing among started processes: 2 workers (Spark: tasks) in 4 slots go
2 -> 3 -> 4 -> 3 -> 2.  The workloads are q4, q5, q8 and a running word count
(``megaphone_fold``, fed by workers 0 and 1 at a fixed pace; its reference is a ``Counter``
oracle, ``tests/running_counts.py``), in turn; Spark (``local[4]``: as many task slots as the
peak roster) for ``i % 5`` in 1, 3 (20 of 50), else process.  The four changes are asked at
random seconds between 5 % and 40 % of a run without rescaling on the same runtime (each
waits for the one before: a join starts a worker process and waits for it), on inputs long
enough (``JOIN_EVENTS``) for all four to finish while the job runs.  Besides the byte bound,
the bins moved are checked: a scale-out to W+1 owners moves at most ``ceil(S/(W+1))`` of the S
bins.  The results are a section of ``rescale_nexmark.md`` (``rescale_nexmark_join.json``).

Run: ``.venv/bin/python benchmarks/rescale_nexmark.py`` (``--schedules 50``, about 15 minutes
on a 2-core machine) or ``--schedules 6`` for a quick look; ``--join`` about 20 minutes
(the JSON is saved after every schedule; ``--start N`` goes on from schedule N).
"""

from __future__ import annotations

import argparse
import json
import math
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
JOIN_WORKLOADS = ("q4", "q5", "q8", "wordcount")
JOIN_EVENTS = {"q4": 2_000_000, "q5": 4_000_000, "q8": 4_000_000}
"""Events per query with ``--join`` (a 2-core machine shared with other measurements): long
enough for the four changes, each of which waits for the one before, to finish in the job."""
JOIN_WINDOW = (0.05, 0.40)
"""The changes are asked at random seconds within this part of a run without rescaling."""
WC_FEEDERS = 2
WC_EPOCHS = 400
WC_WORDS = 500
"""Words per feeding worker and epoch."""
WC_VOCABULARY = 20_000
WC_PACE = 0.05
"""Seconds per epoch of the running word count (20 s of input)."""
FLUID_BINS = 256
"""Bins of the routing table for ``fluid`` (one bin per step; 4,096 bins made one run take
minutes: every step takes a bin out of the state by rebuilding the rest, and with
``measure`` every worker exports its whole state at every step)."""


def generator() -> Any:
    from tokenflow.nexmark.generator import GeneratorConfig

    return GeneratorConfig(rate=RATE, num_in_flight_auctions=IN_FLIGHT)


def violations(migrations: list[Any], strategy: str, bins: int | None = None) -> list[str]:
    """The move bounds of the module docstring that the ``ChangeReport``s break (empty: none);
    with ``bins``, a scale-out to W+1 owners must also move at most ``ceil(bins/(W+1))``."""
    out = []
    for c in migrations:
        if len(c.after) > len(c.before):
            newcomers = sorted(set(c.after) - set(c.before))
            if c.receivers != newcomers:
                out.append(f"change {c.index}: bins went to {c.receivers}, not {newcomers}")
            if bins is not None and c.bins > math.ceil(bins / len(c.after)):
                out.append(f"change {c.index}: moved {c.bins} bins > "
                           f"{math.ceil(bins / len(c.after))}")
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
            if strategy == "all-at-once" and c.total_bytes and \
                    c.moved_bytes != sum(c.sender_bytes.get(w, 0) for w in leaving):
                out.append(f"change {c.index}: moved {c.moved_bytes} bytes, the leaving worker "
                           f"held {sum(c.sender_bytes.get(w, 0) for w in leaving)}")
    return out


def run_schedule(i: int, events: int, references: dict[str, pd.DataFrame],
                 durations: dict[tuple[str, str], float], epochs: int) -> dict[str, Any]:
    from tokenflow.nexmark.run import run_query
    from tokenflow.rescale import STRATEGIES

    rng = random.Random(i)
    query = QUERIES[i % len(QUERIES)]
    runtime = "spark" if i % 5 == 4 else "process"
    strategy = rng.choice(STRATEGIES)
    expected = references[query]
    options: dict[str, Any] = {"workers": WORKERS, "roster": 2}
    if i % 2 == 0:
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
        "trigger": "epochs" if i % 2 == 0 else "seconds", "when": when,
        "changes_made": made, "rows": len(result.rows), "same_output": same,
        "violations": violations(result.migrations, strategy), "seconds": round(elapsed, 2),
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


JOIN_BEGIN = "<!-- rescale_nexmark.py --join: begin -->"
JOIN_END = "<!-- rescale_nexmark.py --join: end -->"


def write_report(text: str, join: bool) -> None:
    """Write ``rescale_nexmark.md``: the ``--join`` section between its markers (replacing
    an earlier one, else appended), or the rest of the file (keeping the ``--join`` section)."""
    path = RESULTS / "rescale_nexmark.md"
    old = path.read_text() if path.exists() else ""
    if JOIN_BEGIN in old:
        before, rest = old.split(JOIN_BEGIN, 1)
        section = JOIN_BEGIN + rest.split(JOIN_END, 1)[0] + JOIN_END + "\n"
    else:
        before, section = old, ""
    if join:
        section = f"{JOIN_BEGIN}\n{text}{JOIN_END}\n"
    else:
        before = text
    path.write_text(before.rstrip("\n") + "\n\n" + section if section else before)


def wc_words(worker: int, epoch: int) -> list[str]:
    """What feeding worker ``worker`` sends at ``epoch``: half uniform over the vocabulary
    (many keys, so a third of the bins hold about a third of the state), half skewed."""
    rng = random.Random(worker * 1_000_003 + epoch)
    return [f"w{rng.randrange(WC_VOCABULARY)}" if rng.random() < 0.5
            else f"w{int(rng.paretovariate(1.2)) % 100}" for _ in range(WC_WORDS)]


def wc_oracle() -> dict[int, Any]:
    """The running counts a plain ``Counter`` gives, per epoch."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from running_counts import running_counts

    return running_counts([w for k in range(WC_FEEDERS) for w in wc_words(k, e)]
                          for e in range(WC_EPOCHS))


def wc_job(bins: int, slots: int) -> Any:
    """The running word count: workers ``0..WC_FEEDERS-1`` feed one epoch per ``WC_PACE``
    seconds into a ``megaphone_fold``; a worker that joined feeds nothing.  Each worker
    returns its output by time and its ``report.collect`` part."""

    def run(worker: Any) -> dict[str, Any]:
        from tokenflow.rescale import megaphone_fold
        from tokenflow.rescale.report import collect
        from tokenflow.state.bins import RoutingTable

        initial = RoutingTable(RoutingTable.even(WC_FEEDERS, bins).owners, range(slots))

        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]),
                                    initial=initial, name="WordCount")
            return inp, handle, handle.stream.capture()

        inp, handle, capture = worker.dataflow(build)
        if not worker.joining:
            for e in range(WC_EPOCHS):
                for w in wc_words(worker.index, e):
                    inp.send(w)
                inp.advance_to(e + 1)
                deadline = time.monotonic() + WC_PACE
                while time.monotonic() < deadline:
                    worker.step_or_park(0.005)
        inp.close()
        worker.step_until_done()
        return {"out": capture.by_time(), "moved": collect([handle])}

    return run


def run_wordcount(runtime: str, strategy: str, bins: int,
                  schedule: list[tuple[float, int]]) -> dict[str, Any]:
    """Run the word count on ``runtime`` (rescaled by joins and leaves along ``schedule``
    when given); its output per time, ``ChangeReport``s and ``RescaleEvent``s."""
    from collections import Counter

    from tokenflow.job import start
    from tokenflow.rescale.remote import ScaleDriver
    from tokenflow.rescale.report import summarize
    from tokenflow.state.bins import RoutingTable

    slots = WORKERS if schedule else WC_FEEDERS
    options: dict[str, Any] = {"slots": slots} if schedule else {}
    if runtime == "spark":
        options["master"] = f"local[{WORKERS}]"
    handle = start(wc_job(bins, slots), WC_FEEDERS, runtime, name="wordcount", bins=bins,
                   **options)
    driver = ScaleDriver(handle, schedule, strategy).start()
    try:
        results = handle.result()
    finally:
        driver.stop()
    out: dict[int, Counter[Any]] = {}
    for r in results:
        if r is not None:
            for t, records in r["out"].items():
                out.setdefault(t, Counter()).update(records)
    initial = RoutingTable(RoutingTable.even(WC_FEEDERS, bins).owners, range(slots))
    parts = [r["moved"] if r is not None else {} for r in results]
    return {"out": out, "migrations": summarize(parts, initial), "rescales": driver.events}


def join_schedule(i: int, references: dict[str, Any],
                  durations: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Schedule ``i`` of ``--join`` (see the module docstring): run, compare, check."""
    from tokenflow.nexmark.run import run_query
    from tokenflow.rescale import STRATEGIES

    rng = random.Random(1000 + i)
    workload = JOIN_WORKLOADS[i % len(JOIN_WORKLOADS)]
    runtime = "spark" if i % 5 in (1, 3) else "process"
    strategy = rng.choice(STRATEGIES)
    bins = FLUID_BINS if strategy == "fluid" else 4096
    seconds = durations[(workload, runtime)]
    at = sorted(round(rng.uniform(*JOIN_WINDOW) * seconds, 2) for _ in ROSTERS)
    schedule = list(zip(at, ROSTERS, strict=True))
    began = time.perf_counter()
    if workload == "wordcount":
        run = run_wordcount(runtime, strategy, bins, schedule)
        same = run["out"] == references[workload]
        migrations, rescales = run["migrations"], run["rescales"]
        rows = sum(c.total() for c in run["out"].values())
    else:
        result = run_query(workload, JOIN_EVENTS[workload], generator=generator(),
                           runtime=runtime, master=f"local[{WORKERS}]" if runtime == "spark"
                           else None, granularity_ms=GRANULARITY, strategy=strategy,
                           measure=True, bins=bins, workers=2, max_workers=WORKERS,
                           rescale_schedule=schedule)
        expected = references[workload]
        try:
            pd.testing.assert_frame_equal(result.rows.reset_index(drop=True),
                                          expected.reset_index(drop=True), check_dtype=False)
            same = True
        except AssertionError:
            same = False
        migrations, rescales, rows = result.migrations, result.rescales, len(result.rows)
    elapsed = time.perf_counter() - began
    expected_rosters = [[[0, 1], [0, 1, 2]], [[0, 1, 2], [0, 1, 2, 3]],
                        [[0, 1, 2, 3], [0, 1, 2]], [[0, 1, 2], [0, 1]]]
    made = [[c.before, c.after] for c in migrations]
    moved_vs_bound = []
    for c in migrations:
        if len(c.after) > len(c.before):
            moved_vs_bound.append(f"{c.bins} <= {math.ceil(bins / len(c.after))}")
        else:
            owned = sum(len(c.owned_before.get(w, [])) for w in set(c.before) - set(c.after))
            moved_vs_bound.append(f"{c.bins} {'=' if c.bins == owned else '!='} {owned}")
    return {
        "schedule": i, "query": workload, "runtime": runtime, "strategy": strategy,
        "bins": bins, "trigger": "seconds", "when": [f"{a:.2f} s" for a in at],
        "asked_at": [round(e.seconds, 2) for e in rescales],
        "scaled": [e.workers for e in rescales if e.error is None],
        "errors": [e.error for e in rescales if e.error],
        "changes_made": len(migrations),
        "rosters_as_expected": made == expected_rosters[:len(made)],
        "rows": rows, "same_output": same, "seconds": round(elapsed, 2),
        "violations": violations(migrations, strategy, bins),
        "bins_moved": moved_vs_bound,
        "fractions": [round(c.share, 4) if c.total_bytes else None for c in migrations],
        "rosters": made,
        "moved_bytes": [c.moved_bytes for c in migrations],
        "total_bytes": [c.total_bytes for c in migrations],
    }


def join_report(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """The ``--join`` section of ``rescale_nexmark.md``."""
    n = len(rows)
    same = sum(r["same_output"] for r in rows)
    clean = sum(not r["violations"] and r["rosters_as_expected"] for r in rows)
    complete = sum(r["changes_made"] == len(ROSTERS) and len(r["scaled"]) == len(ROSTERS)
                   for r in rows)
    lines = [
        "## Worker processes joining and leaving: q4, q5, q8 and a running word count",
        "",
        f"Run {header['when']} on {header['machine']} (load average {header['load']} at the "
        f"start, {header.get('load_end', '?')} at the end; niceness "
        f"{header.get('nice', '?')}), `benchmarks/rescale_nexmark.py --join --schedules {n}`. "
        + header["provenance"],
        "",
        "The job starts 2 workers (process runtime: processes; Spark `local[4]`: barrier "
        "tasks) in 4 slots; at four random seconds the driver scales it 2 -> 3 -> 4 -> 3 -> 2 "
        "(`JobHandle.scale`: a worker process or a one-task Spark stage joins, is bootstrapped "
        "and gets its share of the bins; a leaving one hands its bins back and exits).  Events: "
        + ", ".join(f"{q} {e:,}" for q, e in JOIN_EVENTS.items())
        + f" (20,000 events/s of event time, epochs of {GRANULARITY} ms, 10,000 auctions in "
        f"flight); the word count: {WC_FEEDERS} workers feed {WC_WORDS} words each per epoch, "
        f"{WC_EPOCHS} epochs at {WC_PACE} s, vocabulary {WC_VOCABULARY:,}.  References: the "
        "ordinary (non-migrating) build on the thread runtime for the queries, a `Counter`'s "
        "running counts for the word count.  Changes asked at random seconds between "
        f"{JOIN_WINDOW[0]:.0%} and {JOIN_WINDOW[1]:.0%} of a run without rescaling on the same "
        "runtime (" + ", ".join(f"{k} {s:.1f} s" for k, s in
                                sorted(header["durations"].items())) + "); each change waits "
        "for the one before.",
        "",
        f"* **Output identical to the reference: {same} of {n} schedules.**",
        f"* All four changes completed while the job ran: {complete} of {n}.",
        f"* Rosters 2 -> 3 -> 4 -> 3 -> 2 and move bounds held (scale-out to W+1: at most "
        f"ceil(S/(W+1)) of the S bins, all to the newcomer, <= 1/(W+1) + 2 % of the state "
        f"bytes for the queries; scale-in: exactly the leaving worker's bins, with all-at-once "
        f"exactly its bytes): {clean} of {n}.",
        "",
        "| workload | runtime | schedules | identical | all four changes |",
        "|---|---|---|---|---|",
    ]
    for w in JOIN_WORKLOADS:
        for rt in ("process", "spark"):
            sel = [r for r in rows if r["query"] == w and r["runtime"] == rt]
            if sel:
                lines.append(f"| {w} | {rt} | {len(sel)} | {sum(r['same_output'] for r in sel)}"
                             f" | {sum(r['changes_made'] == len(ROSTERS) for r in sel)} |")
    steps: dict[str, list[float]] = {}
    for r in rows:
        for (before, after), f in zip(r["rosters"], r["fractions"], strict=True):
            if f is not None:
                steps.setdefault(f"{len(before)} -> {len(after)}", []).append(f)
    lines += ["", "Per change, the share of the queries' state bytes moved (`ChangeReport.share`;"
              " the word count's `megaphone_fold` records no state totals):", "",
              "| change | changes measured | mean | max | bound |", "|---|---|---|---|---|"]
    for key in ("2 -> 3", "3 -> 4", "4 -> 3", "3 -> 2"):
        fs = steps.get(key, [])
        if fs:
            bound = f"{1 / int(key.split()[-1]) + 0.02:.3f}" if key in ("2 -> 3", "3 -> 4") \
                else "the leaving worker's bins"
            lines.append(f"| {key} | {len(fs)} | {sum(fs) / len(fs):.3f} | {max(fs):.3f} | "
                         f"{bound} |")
    lines += ["", "Changes asked at: seconds after the job started; scales began at: when the "
              "driver started each (it waits for the one before).  Bins moved vs bound per "
              "change (scale-out `moved <= ceil(S/(W+1))`, scale-in `moved = the leaving "
              "worker's`); fraction: the share of the state's bytes moved (`-`: not measured).",
              "",
              "| # | workload | runtime | strategy | bins | changes asked at | scales began at "
              "| changes completed | identical | bins moved vs bound | fraction of bytes | "
              "bounds | s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bounds = "ok" if not r["violations"] and r["rosters_as_expected"] else \
            "; ".join(r["violations"]) or "rosters differ"
        fractions = ", ".join("-" if f is None else f"{f:.3f}" for f in r["fractions"])
        lines.append(
            f"| {r['schedule']} | {r['query']} | {r['runtime']} | {r['strategy']} | {r['bins']:,}"
            f" | {', '.join(r['when'])} | {', '.join(f'{a:.2f}' for a in r['asked_at'])} | "
            f"{r['changes_made']} of 4 | {'yes' if r['same_output'] else '**NO**'} | "
            f"{'; '.join(r['bins_moved'])} | {fractions} | {bounds} | {r['seconds']} |")
    excursions = [f"schedule {r['schedule']} ({r['query']}, {r['runtime']}, {r['strategy']}) "
                  f"change {k} ({len(before)} -> {len(after)}): {f:.3f} > "
                  f"{1 / len(after) + 0.02:.3f} with {total:,} bytes held"
                  for r in rows for k, ((before, after), f, total) in
                  enumerate(zip(r["rosters"], r["fractions"], r["total_bytes"], strict=True))
                  if f is not None and len(after) > len(before) and f > 1 / len(after) + 0.02]
    if excursions:
        lines += ["", "Byte bound exceeded (the bins moved were exactly the rebalanced table's: "
                  "a bin's share of the bytes depends on the keys it holds, and a small state, "
                  "e.g. windows that just opened, has few keys per bin): "
                  + "; ".join(excursions) + "."]
    if any(r["errors"] for r in rows):
        lines += ["", "Errors: " + "; ".join(f"schedule {r['schedule']}: {e}" for r in rows
                                              for e in r["errors"])]
    return "\n".join(lines) + "\n"


def run_join(args: argparse.Namespace, header: dict[str, Any]) -> None:
    """``--join``: references, durations, then the schedules (saved after each)."""
    from tokenflow.nexmark.run import run_query

    path = RESULTS / "rescale_nexmark_join.json"
    done: list[dict[str, Any]] = []
    if args.start:
        saved = json.loads(path.read_text())
        done = [r for r in saved["schedules"] if r["schedule"] < args.start]
        header = saved["header"]
    indices = range(args.start, args.schedules)
    wanted = {(JOIN_WORKLOADS[i % len(JOIN_WORKLOADS)],
               "spark" if i % 5 in (1, 3) else "process") for i in indices}
    references: dict[str, Any] = {}
    durations: dict[tuple[str, str], float] = {}
    if any(rt == "spark" for _, rt in wanted):
        from tokenflow.spark.session import get_session

        get_session(f"local[{WORKERS}]")  # started before anything is timed
    try:
        for w in JOIN_WORKLOADS:
            runtimes = sorted(rt for ww, rt in wanted if ww == w)
            if not runtimes:
                continue
            if w == "wordcount":
                references[w] = wc_oracle()
            else:
                references[w] = run_query(w, JOIN_EVENTS[w], generator=generator(), workers=2,
                                          granularity_ms=GRANULARITY).rows
            for rt in runtimes:  # how long a run lasts without rescaling (and its output)
                began = time.perf_counter()
                if w == "wordcount":
                    same = run_wordcount(rt, "batched", 4096, [])["out"] == references[w]
                else:
                    plain = run_query(w, JOIN_EVENTS[w], generator=generator(), workers=2,
                                      runtime=rt, master=f"local[{WORKERS}]" if rt == "spark"
                                      else None, granularity_ms=GRANULARITY)
                    same = plain.rows.reset_index(drop=True).equals(
                        references[w].reset_index(drop=True))
                durations[(w, rt)] = time.perf_counter() - began
                print(f"reference {w} on {rt}: {durations[(w, rt)]:.2f} s, same output {same}",
                      flush=True)
        header.setdefault("durations", {})
        header["durations"].update({f"{w} {rt}": round(s, 2) for (w, rt), s in durations.items()})
        results = list(done)
        for i in indices:
            r = join_schedule(i, references, durations)
            results.append(r)
            print(f"schedule {i}: {r['query']} {r['runtime']} {r['strategy']} at {r['when']} "
                  f"(began {r['asked_at']}): same output {r['same_output']}, "
                  f"{r['changes_made']} changes, bins {r['bins_moved']}, violations "
                  f"{r['violations'] or 'none'}, errors {r['errors'] or 'none'} "
                  f"({r['seconds']} s)", flush=True)
            header["load_end"] = " / ".join(f"{x:.1f}" for x in os.getloadavg())
            if not args.no_write:
                path.write_text(json.dumps({"header": header, "schedules": results}, indent=1))
    finally:
        if any(rt == "spark" for _, rt in wanted):
            from tokenflow.spark.session import stop_session

            stop_session()
    text = join_report(results, header)
    print(text)
    if not args.no_write:
        write_report(text, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=50)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--no-write", action="store_true", help="Print only.")
    parser.add_argument("--report-only", action="store_true",
                        help="Rewrite the report from the saved JSON (no runs).")
    parser.add_argument("--join", action="store_true",
                        help="Worker processes join and leave the running job (2 started, "
                             "4 slots); q4, q5, q8 and a running word count; a section of "
                             "rescale_nexmark.md")
    parser.add_argument("--start", type=int, default=0,
                        help="--join: go on from this schedule (keeping the saved ones before)")
    args = parser.parse_args()
    if args.report_only:
        if args.join:
            saved = json.loads((RESULTS / "rescale_nexmark_join.json").read_text())
            text = join_report(saved["schedules"], saved["header"])
        else:
            saved = json.loads((RESULTS / "rescale_nexmark.json").read_text())
            args.schedules, args.events = len(saved["schedules"]), saved["events"]
            text = report(saved["schedules"], args, saved["header"])
        print(text)
        write_report(text, args.join)
        return
    warnings.simplefilter("ignore")
    RESULTS.mkdir(exist_ok=True)
    sys.path.insert(0, str(HERE))
    from _provenance import provenance

    header: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "provenance": provenance(), "machine": f"{os.cpu_count()} cores",
        "load": " / ".join(f"{x:.1f}" for x in os.getloadavg()), "nice": os.nice(0)}
    if args.join:
        run_join(args, header)
        return
    from tokenflow.nexmark.run import epoch_plan, run_query

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
            r = run_schedule(i, args.events, references, durations, epochs)
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
        (RESULTS / "rescale_nexmark.json").write_text(
            json.dumps({"header": header, "events": args.events, "schedules": results}, indent=1))
        write_report(text, join=False)


if __name__ == "__main__":
    main()
