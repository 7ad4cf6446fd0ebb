"""Fig. 6 of the timestamp-tokens paper: latency as the timestamp quantum varies.

The rolling word count (``wordcount.py``) with tokens, notifications and watermarks, one worker
(``thread`` runtime), input offered open-loop (``harness.py``) at two loads, timestamps quantized
to powers of two from 2^10 ns (1 µs: one timestamp per record at every rate this machine
reaches) to 2^24 ns (17 ms).  Then, at one timestamp per record (2^10 ns), a ladder of offered
rates (x1.41 per step) per mechanism until it does not finish: the highest rate each sustains
and the lowest at which it fails — the issue's acceptance target compares the two.

The same ladder is then run on *timed records* (``wordcount.TIMED_MECHANISMS``): the input
sends each record as ``(time, record)`` under its current epoch (``InputHandle.send_at``) and
advances once per harness turn, at the same moments as before, instead of advancing to every
record's time and so sending one message per timestamp; the records, their times and the output
are the same, and each mechanism still learns about every time from the frontier (tokens: one
token at the least buffered time; notifications: a token and a delivery per distinct time;
watermarks: the input frontier as in-band watermarks).

Writes ``benchmarks/results/evaluation_granularity.{md,png,json}``.  ``--quick`` runs fewer
quanta and shorter runs (a smoke test, not for the record).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.evaluation import columnar  # noqa: E402
from benchmarks.evaluation.harness import (  # noqa: E402
    RESULTS,
    RETRY_NOTE,
    Load,
    cell,
    confirmed,
    fmt_ms,
    fmt_rate,
    header,
    load_end,
    log,
    machine,
    quantum_label,
    run_script,
    run_wordcount,
    table,
)
from benchmarks.evaluation.wordcount import MECHANISMS, TIMED_MECHANISMS  # noqa: E402

LOW, HIGH = 15_000, 200_000
"""Offered loads (records/s): LOW is below what tokens sustain at one timestamp per record
(about 30,000/s on this machine), HIGH is near the one-worker maximum at a coarse quantum
(about 300,000/s)."""
LADDER = [5_000, 7_000, 10_000, 14_000, 20_000, 28_000, 40_000, 56_000, 80_000]
TIMED_LADDER = [20_000, 28_000, 40_000, 56_000, 80_000, 113_000, 160_000, 226_000, 320_000,
                452_000, 640_000]
"""The ladder on timed records (one timestamp per record too), x1.41 per step."""
COLUMNAR_LADDER = [20_000, 28_000, 40_000, 56_000, 80_000, 113_000, 160_000, 320_000, 640_000,
                   1_280_000, 2_560_000]
"""The ladder on columnar timed records: x1.41 per step up to 160,000, then x2 (a mechanism
that sustains the top rate has a lower bound there)."""
FINEST = 2**10


LADDERS_ONLY = "--ladders"
"""Command-line flag: measure the three ladders only and keep the quantum sweep of the saved
``evaluation_granularity.json`` (its own header is kept with it, as ``sweep_machine``)."""


def ladders(quick: bool) -> dict[str, Any]:
    """The ladders of ``sweep`` only; the quantum sweep comes from the saved results."""
    started = machine()
    duration = 1.5 if quick else 2.0
    old = json.loads((RESULTS / "evaluation_granularity.json").read_text())
    data = measure_ladders(quick, duration)
    data.update(machine=started, load_end=load_end(), quick=quick, loads=old["loads"],
                quanta=old["quanta"], rows=old["rows"], duration=duration,
                sweep_machine=old.get("sweep_machine", old["machine"]),
                sweep_load_end=old.get("sweep_load_end", old.get("load_end")))
    return data


def measure_ladders(quick: bool, duration: float) -> dict[str, Any]:
    """The three one-timestamp-per-record ladders (see the module notes)."""
    return {
        "ladder": run_ladder(LADDER[1:6:2] if quick else LADDER, duration),
        "timed_ladder": run_ladder(TIMED_LADDER[:6:2] if quick else TIMED_LADDER, duration,
                                   "timed"),
        "columnar_ladder": run_ladder(COLUMNAR_LADDER[:9:4] if quick else COLUMNAR_LADDER,
                                      duration, "columnar"),
    }


def sweep(quick: bool) -> dict[str, Any]:
    started = machine()
    quanta = [2**k for k in ((10, 16, 22) if quick else range(10, 25, 2))]
    duration = 1.5 if quick else 2.0
    rows: list[dict[str, Any]] = []
    for load in (LOW, HIGH):
        for q in quanta:
            for name, build in MECHANISMS.items():  # side by side at each point
                row = confirmed(lambda build=build, q=q, load=load, name=name: run_wordcount(
                    build, Load(load, q, duration=duration),
                    params={"mechanism": name, "load": load}).row())
                rows.append(row)
                log(f"load {load:>7,} {quantum_label(q):>22} {name:<13} "
                    f"p50 {fmt_ms(row['p50']):>6} p99.9 {fmt_ms(row['p999']):>6} "
                    f"max {fmt_ms(row['max']):>6} cpu/rec {row['cpu_us']:.1f} µs "
                    f"{row['dnf'] or ''}")
    data = {"machine": started, "load_end": load_end(), "quick": quick, "loads": [LOW, HIGH],
            "quanta": quanta, "rows": rows, "duration": duration}
    data.update(measure_ladders(quick, duration))
    return data


def run_ladder(rates: list[int], duration: float, path: str = "message") -> list[dict[str, Any]]:
    """At one timestamp per record, the mechanisms side by side at each rate of ``rates``
    until each has failed (twice in a row, ``confirmed``).  ``path``: ``message`` (a message
    per timestamp, ``wordcount.MECHANISMS``), ``timed`` (timed records, one by one) or
    ``columnar`` (Arrow batches with a time column, ``columnar.MECHANISMS``)."""
    mechanisms = {"message": MECHANISMS, "timed": TIMED_MECHANISMS,
                  "columnar": columnar.MECHANISMS}[path]
    make_batch = columnar.make_batch if path == "columnar" else None
    ladder: list[dict[str, Any]] = []
    failed: set[str] = set()
    for rate in rates:
        for name, build in mechanisms.items():
            if name in failed:
                continue
            row = confirmed(lambda build=build, rate=rate, name=name: run_wordcount(
                build, Load(rate, FINEST, duration=duration),
                params={"mechanism": name, "load": rate}, timed=path == "timed",
                make_batch=make_batch).row())
            ladder.append(row)
            log(f"{path} ladder {name:<13} {rate:>9,}/s p50 "
                f"{fmt_ms(row['p50']):>6} p99.9 {fmt_ms(row['p999']):>6} {row['dnf'] or ''}")
            if row["dnf"]:
                failed.add(name)
        if len(failed) == len(mechanisms):
            break
    return ladder


def ladder_summary(ladder: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mechanism: the highest rate sustained below its first failure, the first failing
    rate (None if none failed)."""
    out: dict[str, dict[str, Any]] = {}
    for name in MECHANISMS:
        mine = sorted((r for r in ladder if r["mechanism"] == name), key=lambda r: r["load"])
        first_fail = next((r["load"] for r in mine if r["dnf"]), None)
        ok = [r["load"] for r in mine if not r["dnf"]
              and (first_fail is None or r["load"] < first_fail)]
        out[name] = {"sustained": max(ok) if ok else None, "dnf_at": first_fail,
                     "any_ok_above": [r["load"] for r in mine if not r["dnf"]
                                      and first_fail is not None and r["load"] > first_fail]}
    return out


def report(data: dict[str, Any]) -> str:
    rows, quanta = data["rows"], data["quanta"]
    lines = ["# Evaluation, Fig. 6: timestamp granularity", "", header(data), ""]
    if "sweep_machine" in data:
        lines += ["**The quantum sweep below comes from an earlier run** (the ladders only were "
                  "measured in the run above, `granularity.py --ladders`): " + header(
                      {"machine": data["sweep_machine"], "load_end": data["sweep_load_end"]}), ""]
    lines += [
             "The rolling word count (one stateful operator; an output per input word), one "
             "worker (`thread` runtime), input offered open-loop at a fixed rate; timestamps are "
             "offer times rounded down to the quantum; latency per record from its offer time "
             "to its output (p50 / p99.9 / max, ms; histogram bins within 12.5 %).  DNF: a "
             "latency above 1 s (or the output frontier 1 s behind).  "
             f"{data['duration']:.1f} s per run, the first 0.5 s not measured; the three "
             "mechanisms run one after the other at each point.  One run on a shared 2-core "
             "machine: compare columns, not runs on other days.", ""]
    for load in data["loads"]:
        lines += [f"## Offered load {fmt_rate(load)} records/s", ""]
        body = []
        for q in quanta:
            cells = [quantum_label(q), f"{min(1.0, 1e9 / (q * load)):.2g}"]
            for name in MECHANISMS:
                r = next(x for x in rows if x["load"] == load and x["quantum"] == q
                         and x["mechanism"] == name)
                cells.append(cell(r))
            body.append(cells)
        lines += [table(["quantum", "timestamps per record",
                         *[f"{m} p50 / p99.9 / max" for m in MECHANISMS]], body), ""]
    lines += ladder_report(data["ladder"], "## One timestamp per record (quantum 2^10 ns): "
                           "offered rate until DNF, a message per timestamp")
    if data.get("timed_ladder"):
        lines += ["The same ladder on **timed records**: the input sends `(time, record)` "
                  "pairs under its current epoch (`InputHandle.send_at`) and advances at the "
                  "same moments as above (once per harness turn), so a message carries the "
                  "records of many times; the records, their times and the output are the same "
                  "(checked by the tests), and each mechanism learns of every time from the "
                  "frontier as above. The count's output is timed records too (tokens and "
                  "watermarks: one message per invocation under the least token; "
                  "notifications: one message per delivered time).", ""]
        lines += ladder_report(data["timed_ladder"], "## One timestamp per record, timed records: "
                               "offered rate until DNF")
    if data.get("columnar_ladder"):
        lines += ["The same ladder on **columnar timed records** (`evaluation/columnar.py`): "
                  "the records due at each harness turn go to the input as one Arrow batch "
                  "with a time column (`InputHandle.send_batch_at`), are exchanged by the word "
                  "column and counted with numpy, the same code for the three mechanisms; "
                  "words are ids of the same 4,096 words. Tokens send the complete rows as one "
                  "batch under their one token; notifications request a token per distinct time "
                  "and send each delivered time's rows under its own token; watermarks count the "
                  "rows below the watermark. The ladder is x1.41 per step up to 160,000/s, then "
                  "x2.", ""]
        lines += ladder_report(data["columnar_ladder"], "## One timestamp per record, columnar "
                               "timed records: offered rate until DNF")
    lines += ["![p50, p99.9 and max latency per quantum, two loads](evaluation_granularity.png)",
              ""]
    return "\n".join(lines)


def ladder_report(ladder: list[dict[str, Any]], title: str) -> list[str]:
    """A ladder's table, its summary and the acceptance target's verdict (Markdown lines)."""
    s = ladder_summary(ladder)
    lines = [title, ""]
    body = []
    for r in sorted(ladder, key=lambda r: (r["mechanism"], r["load"])):
        body.append([r["mechanism"], fmt_rate(r["load"]), cell(r), r["dnf"] or ""])
    lines += [table(["mechanism", "offered records/s", "p50 / p99.9 / max (ms)", "why DNF"],
                    body, "lrrl"), "", RETRY_NOTE, ""]
    lines += [table(["mechanism", "highest rate sustained (records/s)", "first DNF at"],
                    [[m, fmt_rate(v["sustained"]) if v["sustained"] else "none",
                      fmt_rate(v["dnf_at"]) if v["dnf_at"] else "none in the ladder"]
                     for m, v in s.items()]), ""]
    tok, notif = s["tokens"], s["notifications"]
    if tok["sustained"] and notif["dnf_at"]:
        ratio = tok["sustained"] / notif["dnf_at"]
        verdict = "met" if ratio >= 10 else "not met"
        bound = "" if tok["dnf_at"] else " (tokens finished the whole ladder: a lower bound)"
        lines += [f"**Acceptance target** (tokens sustain ≥ 10× the rate at which notifications "
                  f"DNF, at one timestamp per record): tokens sustained "
                  f"{fmt_rate(tok['sustained'])} records/s, notifications did not finish at "
                  f"{fmt_rate(notif['dnf_at'])} records/s: {ratio:.2f}×{bound} — **{verdict}**.",
                  ""]
    else:
        lines += ["**Acceptance target** (tokens ≥ 10× the rate at which notifications DNF): "
                  "not decidable from this run (see the ladder).", ""]
    return lines


LABEL = {"p50": "p50", "p999": "p99.9", "max": "max"}


def plot(data: dict[str, Any], path: Path) -> None:
    colors = {"tokens": "tab:blue", "notifications": "tab:red", "watermarks": "tab:green"}
    styles = {"p50": "-", "p999": "--", "max": ":"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, load in zip(axes, data["loads"], strict=True):
        for name in MECHANISMS:
            mine = sorted((r for r in data["rows"] if r["load"] == load
                           and r["mechanism"] == name), key=lambda r: r["quantum"])
            xs = [r["quantum"].bit_length() - 1 for r in mine]
            for stat, style in styles.items():
                ys = [r[stat] if not r["dnf"] else float("nan") for r in mine]
                ax.plot(xs, ys, style, color=colors[name], marker="o", ms=3,
                        label=f"{name} {LABEL[stat]}" if stat == "p50" or ax is axes[0] else None)
            shift = 0.25 * (list(MECHANISMS).index(name) - 1)
            dnf = [x + shift for x, r in zip(xs, mine, strict=True) if r["dnf"]]
            ax.plot(dnf, [1000] * len(dnf), "x", color=colors[name], ms=8)
        ax.set_yscale("log")
        ax.set_xlabel("timestamp quantum (log2 ns)")
        ax.set_title(f"{load:,} records/s offered (x at 1 s: DNF)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("latency (ms): p50 solid, p99.9 dashed, max dotted")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Rolling word count, 1 worker: tokens vs notifications vs watermarks "
                 "(shared 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if LADDERS_ONLY in sys.argv:
        sys.argv.remove(LADDERS_ONLY)
        run_script("evaluation_granularity", __doc__, ladders, report, plot)
        return
    run_script("evaluation_granularity", __doc__, sweep, report, plot)


if __name__ == "__main__":
    main()
