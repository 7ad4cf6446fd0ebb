"""Workers joining and leaving a running job (issue 16): what a join and a leave cost, and what
the roster machinery costs when nobody joins.

Writes ``benchmarks/results/membership.md`` and ``.json`` and prints the report.

Workload: the running word count of ``tests/rescale/test_membership.py`` made bigger: workers 0
and 1 (the job's first two) each send ``--words`` words per epoch (Zipf-like over 5,000 words)
at ``--rate`` epochs/s on a wall-clock grid, through ``megaphone_fold`` (emitting ``(word,
running count)``), on the ``process`` runtime with 4 worker slots.  The driver (``JobHandle``)
scales 2 -> 3 -> 4 -> 3 -> 2 workers, ``--gap`` s apart: a join starts a worker *process*, which
dials the others and is bootstrapped from worker 0 (``tokenflow.membership``), then Megaphone
moves its share of the bins to it; a leave moves its bins back and lets it go.  With
``--runtime spark`` the same on Spark ``local[4]`` (the session started first, untimed): a join
is a one-task barrier stage of its own on the same SparkSession; results go to
``membership_spark.md`` / ``.json``.

Measured, all ``time.time()`` on one machine:

* per scale call: its wall time; per join, from the driver's ``add_worker`` to the joiner's
  ``joined`` (progress state installed) and to the first step after which the joiner owns a key
  (*join to first owned bin*);
* on the bootstrap server: how long serving took between two steps (``progress_states()`` and the
  send: the only time an existing worker spends on a join), and the pickled size of the state;
* on the existing workers: their longest step during the scale calls against their longest step
  in the steady windows (a stall would show here);
* epoch latency (per epoch the later feeder's send -> probe passed) p50/p99/max, steady vs
  during the scale calls; and the output checked against a ``Counter`` first;
* **roster overhead**: the same job without scaling, unpaced (each feeder sends its next epoch
  when the probe has passed the one 4 before), with 2 slots and with 4 slots (a job with free
  slots keeps its progress state and counts its tokens), in alternating rounds; the ratio of
  their throughputs.

Run: ``.venv/bin/python benchmarks/membership.py`` (about 2 minutes) or ``--quick``;
``--runtime spark`` for Spark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _provenance import provenance  # a sibling module: benchmarks run as scripts

RESULTS = Path(__file__).resolve().parent / "results"
FEEDERS = 2
SLOTS = 4
VOCABULARY = 5_000


def words_for(worker: int, epoch: int, n: int) -> list[str]:
    rng = np.random.default_rng(worker * 1_000_003 + epoch)
    ranks = np.minimum(rng.zipf(1.3, n), VOCABULARY)
    return [f"w{r}" for r in ranks.tolist()]


def make_job(cfg: dict[str, Any]) -> Any:
    def run(worker: Any) -> dict[str, Any]:
        from tokenflow.rescale import megaphone_fold

        def build(scope: Any) -> Any:
            inp, stream = scope.new_input()
            handle = megaphone_fold(stream.map(lambda w: (w, 1)),
                                    lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)]))
            return inp, handle, handle.stream.probe()

        inp, handle, probe = worker.dataflow(build)
        counts: Counter[str] = Counter()
        agent = next((h for h in worker.on_step if hasattr(h, "membership")), None)
        steps: list[tuple[float, float]] = []  # (end, duration) of each step
        owned_at: list[float] = []
        joined = worker.joining
        step = worker.step

        def timed_step() -> bool:
            t0 = time.perf_counter()
            busy = step()
            end = time.perf_counter()
            steps.append((time.time(), end - t0))
            if joined and not owned_at and handle.state.data:
                owned_at.append(time.time())
            return busy

        worker.step = timed_step  # type: ignore[method-assign]
        sent: list[float] = []
        done: list[float] = []
        cpu0 = time.process_time()
        if joined:
            inp.close()
        else:
            rate, epochs, n = cfg["rate"], cfg["epochs"], cfg["words"]
            origin = cfg["origin"]
            for e in range(epochs):
                if rate:
                    due = origin + e / rate
                    while time.time() < due:
                        worker.step_or_park(min(0.002, max(0.0, due - time.time())))
                else:
                    while probe.less_than(e - 3):
                        worker.step_or_park(0.001)
                batch = words_for(worker.index, e, n)
                counts.update(batch)
                sent.append(time.time())
                inp.send_batch(batch)
                inp.advance_to(e + 1)
                worker.step()
                while len(done) < len(sent) and not probe.less_than(len(done) + 1):
                    done.append(time.time())
            inp.close()
        while worker.step_or_park(0.002):
            while len(done) < len(sent) and not probe.less_than(len(done) + 1):
                done.append(time.time())
        while len(done) < len(sent):
            done.append(time.time())
        return {"index": worker.index, "joined": joined, "left": worker.left, "sent": sent,
                "cpu": time.process_time() - cpu0,
                "done": done, "steps": steps, "owned_at": owned_at[0] if owned_at else None,
                "served": list(agent.membership.served) if agent is not None else [],
                "state_bytes": list(agent.membership.state_bytes) if agent is not None else [],
                "keys": {k: v for k, v in handle.state.data.items()}, "counts": counts}

    return run


def check(results: list[Any]) -> None:
    """The final state (the union over workers, each word on one) is a ``Counter``'s."""
    expected: Counter[str] = Counter()
    for r in results[:FEEDERS]:
        expected.update(r["counts"])
    state: dict[str, int] = {}
    for r in results:
        if r is None:
            continue
        for k, v in r["keys"].items():
            assert k not in state, f"word {k!r} on two workers"
            state[k] = v
    assert state == dict(expected), "the final state differs from a Counter's"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def where(runtime: str, slots: int) -> dict[str, Any]:
    """``execute``/``start`` options of ``runtime`` for a job of ``slots`` slots."""
    return {"runtime": runtime, "slots": slots,
            **({"master": f"local[{SLOTS}]"} if runtime == "spark" else {})}


def scaled_run(cfg: dict[str, Any], gap: float, runtime: str) -> dict[str, Any]:
    from tokenflow.job import start

    cfg = {**cfg, "origin": time.time() + 4.0}
    handle = start(make_job(cfg), workers=FEEDERS, **where(runtime, SLOTS))
    calls = []
    time.sleep(max(0.0, cfg["origin"] - time.time()) + gap)
    for n in (3, 4, 3, 2):
        t0 = time.time()
        before = list(handle.roster)
        handle.scale(n)
        calls.append({"to": n, "begin": t0, "end": time.time(), "from": before})
        time.sleep(gap)
    results = handle.result(timeout=600)
    check(results)
    return {"results": results, "calls": calls}


def throughput_run(cfg: dict[str, Any], slots: int, runtime: str) -> tuple[float, float]:
    """Words/s (wall) and CPU µs per word (both worker processes) of one unpaced run."""
    from tokenflow import execute

    cfg = {**cfg, "rate": 0, "origin": 0.0}
    results = execute(make_job(cfg), workers=FEEDERS, **where(runtime, slots))
    feeders = results[:FEEDERS]
    elapsed = max(r["done"][-1] for r in feeders) - min(r["sent"][0] for r in feeders)
    check(results)
    words = cfg["epochs"] * cfg["words"] * FEEDERS
    return words / elapsed, sum(r["cpu"] for r in feeders) / words * 1e6


def analyse(run: dict[str, Any]) -> dict[str, Any]:
    results, calls = run["results"], run["calls"]
    feeders = results[:FEEDERS]
    latencies = [(min(r["sent"][e] for r in feeders), max(r["done"][e] - r["sent"][e] for r in feeders))
                 for e in range(len(feeders[0]["sent"]))]
    windows = [(c["begin"], c["end"] + 0.5) for c in calls]

    def during(t: float) -> bool:
        return any(b <= t < e for b, e in windows)

    warm = latencies[0][0] + 2.0
    steady = [lat for t, lat in latencies if t >= warm and not during(t)]
    scaling = [lat for t, lat in latencies if during(t)]
    step_steady = [d for r in feeders for t, d in r["steps"] if t >= warm and not during(t)]
    step_scaling = [d for r in feeders for t, d in r["steps"] if during(t)]
    joins = []
    for c in calls:
        if c["to"] > len(c["from"]):
            k = c["to"] - 1
            r = results[k]
            joins.append({"worker": k, "call_s": c["end"] - c["begin"],
                          "first_owned_s": (r["owned_at"] - c["begin"]) if r and r["owned_at"] else None})
    served = [s for r in results if r for s in r["served"]]
    sizes = [b for r in results if r for b in r["state_bytes"]]
    return {"steady": steady, "scaling": scaling, "step_steady": step_steady,
            "step_scaling": step_scaling, "joins": joins, "served": served, "sizes": sizes,
            "calls": [{"to": c["to"], "seconds": c["end"] - c["begin"]} for c in calls]}


def report(a: dict[str, Any], overhead: list[tuple[tuple[float, float], tuple[float, float]]],
           cfg: dict[str, Any], extra: dict[str, Any]) -> str:
    def ms(x: float | None) -> str:
        return "–" if x is None else f"{x * 1e3:.1f}"

    ratios = [four[0] / two[0] for two, four in overhead]
    cpu = [four[1] / two[1] for two, four in overhead]
    lines = [
        "# Workers joining and leaving a running job", "",
        f"Measured {extra['when']:%Y-%m-%d %H:%M} UTC by `{extra['command']}` ({extra['seconds']:.0f} s, "
        f"load average {extra['load'][0]:.2f} at the start, {extra['load'][1]:.2f} at the end; "
        f"{os.cpu_count()} cores).  {extra['provenance']}", "",
        f"Running word count (`megaphone_fold`), {extra['runtime']} runtime"
        + (f" (Spark `local[{SLOTS}]`, session started before, untimed)"
           if extra["runtime"] == "spark" else "")
        + f", {SLOTS} worker slots, workers 0 "
        f"and 1 feeding {cfg['words']:,} words each per epoch at {cfg['rate']} epochs/s; the driver "
        f"scales 2 -> 3 -> 4 -> 3 -> 2 workers {cfg['gap']:g} s apart (each join starts a worker "
        + ("as a one-task barrier stage of its own on the same SparkSession"
           if extra["runtime"] == "spark" else "process")
        + " that is bootstrapped from worker 0, then Megaphone gives it its share of the "
        "bins).  The final state was checked against a `Counter` before any figure.", "",
        "| scale call | seconds |", "|---|---:|"]
    lines += [f"| to {c['to']} workers | {c['seconds']:.2f} |" for c in a["calls"]]
    lines += ["", "| join | add_worker + rescale, s | join to first owned bin, s | target |",
              "|---|---:|---:|---|"]
    for j in a["joins"]:
        fo = j["first_owned_s"]
        lines.append(f"| worker {j['worker']} | {j['call_s']:.2f} | "
                     f"{'–' if fo is None else f'{fo:.2f}'} | ≤ 2 s: "
                     f"{'met' if fo is not None and fo <= 2.0 else '**missed**'} |")
    served = a["served"]
    lines += ["",
              "Bootstrap server: serving a join took "
              + ", ".join(f"{s * 1e6:.0f}" for s in served) + " µs between "
              f"two of its steps (target: no existing worker blocked > 5 ms: "
              f"{'met' if served and max(served) <= 0.005 else '**missed**'}); the progress state "
              f"sent was {', '.join(str(b) for b in a['sizes'])} bytes (pickled).", "",
              f"Steps of the feeding workers: longest {ms(max(a['step_steady']))} ms in steady "
              f"windows, {ms(max(a['step_scaling']))} ms during the scale calls (p99 "
              f"{ms(pct(a['step_steady'], 99))} / {ms(pct(a['step_scaling'], 99))} ms).", "",
              "| epochs | count | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|",
              f"| steady | {len(a['steady'])} | {ms(pct(a['steady'], 50))} | {ms(pct(a['steady'], 99))} | "
              f"{ms(max(a['steady']))} |",
              f"| during scale calls | {len(a['scaling'])} | {ms(pct(a['scaling'], 50))} | "
              f"{ms(pct(a['scaling'], 99))} | {ms(max(a['scaling']))} |", "",
              "**Roster overhead** (the same job unpaced, no scaling, "
              f"{cfg.get('overhead_epochs', 0):,} epochs a run; words/s with 2 slots and with "
              f"{SLOTS} slots, in rounds alternating the order): "
              + "; ".join(f"{two[0] / 1e3:.0f}K vs {four[0] / 1e3:.0f}K" for two, four in overhead)
              + f".  Throughput ratio {SLOTS} slots / 2 slots: median "
              f"{float(np.median(ratios)):.3f} (per round {', '.join(f'{r:.2f}' for r in ratios)}: "
              "the machine's noise is larger than the bound).  CPU time per word, both workers, "
              f"{SLOTS} slots / 2 slots: median {float(np.median(cpu)):.3f} (per round "
              f"{', '.join(f'{r:.2f}' for r in cpu)}; CPU µs per word "
              + "; ".join(f"{two[1]:.2f} vs {four[1]:.2f}" for two, four in overhead)
              + f").  Target: overhead ≤ 5 %, read on the CPU ratio (≤ 1.05): "
              f"{'met' if float(np.median(cpu)) <= 1.05 else '**missed**'}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--words", type=int, default=2_000)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--gap", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=6, help="overhead rounds (each: 2 runs)")
    parser.add_argument("--overhead-epochs", type=int, default=1000)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--runtime", choices=["process", "spark"], default="process")
    args = parser.parse_args()
    gap = 2.0 if args.quick else args.gap
    rounds = 2 if args.quick else args.rounds
    epochs = int((4 * gap + gap + 4) * args.rate)
    cfg = {"words": args.words, "rate": args.rate, "epochs": epochs, "gap": gap,
           "overhead_epochs": args.overhead_epochs}
    if args.runtime == "spark":
        from tokenflow.spark.session import get_session

        get_session(f"local[{SLOTS}]")
    load0, began = os.getloadavg()[0], time.time()
    print("scaled run", flush=True)
    analysed = analyse(scaled_run(cfg, gap, args.runtime))
    overhead = []
    for i in range(rounds):
        print(f"overhead round {i + 1}", flush=True)
        tp_cfg = {**cfg, "epochs": args.overhead_epochs}
        if i % 2:  # alternate the order, so that a drift of the machine falls on both
            four = throughput_run(tp_cfg, SLOTS, args.runtime)
            two = throughput_run(tp_cfg, 2, args.runtime)
        else:
            two = throughput_run(tp_cfg, 2, args.runtime)
            four = throughput_run(tp_cfg, SLOTS, args.runtime)
        overhead.append((two, four))
    extra = {"when": datetime.datetime.now(datetime.UTC), "load": (load0, os.getloadavg()[0]),
             "seconds": time.time() - began, "provenance": provenance(), "runtime": args.runtime,
             "command": " ".join([".venv/bin/python benchmarks/membership.py", *sys.argv[1:]])}
    text = report(analysed, overhead, cfg, extra)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        stem = "membership" if args.runtime == "process" else f"membership_{args.runtime}"
        (RESULTS / f"{stem}.md").write_text(text)
        (RESULTS / f"{stem}.json").write_text(json.dumps(
            {"calls": analysed["calls"], "joins": analysed["joins"], "served_s": analysed["served"],
             "state_bytes": analysed["sizes"],
             "overhead_runs_2_vs_4_slots": overhead,  # (words/s, CPU us per word) each
             }, indent=1))


if __name__ == "__main__":
    main()
