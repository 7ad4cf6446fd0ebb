"""Fig. 6 of the timestamp-tokens paper: latency as the timestamp quantum varies.

The rolling word count (``wordcount.py``) with tokens, notifications and watermarks, one worker
(``thread`` runtime), input offered open-loop (``harness.py``) at two loads, timestamps quantized
to powers of two from 2^10 ns (1 µs: one timestamp per record at every rate this machine
reaches) to 2^24 ns (17 ms).  Then, at one timestamp per record (2^10 ns), a ladder of offered
rates (x1.41 per step) per mechanism until it does not finish: the highest rate each sustains
and the lowest at which it fails — the issue's acceptance target compares the two.

Writes ``benchmarks/results/evaluation_granularity.{md,png,json}``.  ``--quick`` runs fewer
quanta and shorter runs (a smoke test, not for the record).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.evaluation.harness import (  # noqa: E402
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
from benchmarks.evaluation.wordcount import MECHANISMS  # noqa: E402

LOW, HIGH = 15_000, 200_000
"""Offered loads (records/s): LOW is below what tokens sustain at one timestamp per record
(about 30,000/s on this machine), HIGH is near the one-worker maximum at a coarse quantum
(about 300,000/s)."""
LADDER = [5_000, 7_000, 10_000, 14_000, 20_000, 28_000, 40_000, 56_000, 80_000]
FINEST = 2**10


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
    ladder: list[dict[str, Any]] = []
    rates = LADDER[1:6:2] if quick else LADDER
    failed: set[str] = set()
    for rate in rates:  # the mechanisms side by side at each rate, until each has failed
        for name, build in MECHANISMS.items():
            if name in failed:
                continue
            row = confirmed(lambda build=build, rate=rate, name=name: run_wordcount(
                build, Load(rate, FINEST, duration=duration),
                params={"mechanism": name, "load": rate}).row())
            ladder.append(row)
            log(f"ladder {name:<13} {rate:>7,}/s p50 {fmt_ms(row['p50']):>6} "
                f"p99.9 {fmt_ms(row['p999']):>6} {row['dnf'] or ''}")
            if row["dnf"]:  # confirmed: it failed twice in a row
                failed.add(name)
        if len(failed) == len(MECHANISMS):
            break
    return {"machine": started, "load_end": load_end(), "quick": quick, "loads": [LOW, HIGH],
            "quanta": quanta, "rows": rows, "ladder": ladder, "duration": duration}


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
    lines = ["# Evaluation, Fig. 6: timestamp granularity", "", header(data), "",
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
    s = ladder_summary(data["ladder"])
    lines += ["## One timestamp per record (quantum 2^10 ns): offered rate until DNF", ""]
    body = []
    for r in sorted(data["ladder"], key=lambda r: (r["mechanism"], r["load"])):
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
        lines += [f"**Acceptance target** (tokens sustain ≥ 10× the rate at which notifications "
                  f"DNF, at one timestamp per record): tokens sustained "
                  f"{fmt_rate(tok['sustained'])} records/s, notifications did not finish at "
                  f"{fmt_rate(notif['dnf_at'])} records/s: {ratio:.2f}× — **{verdict}**.", ""]
    else:
        lines += ["**Acceptance target** (tokens ≥ 10× the rate at which notifications DNF): "
                  "not decidable from this run (see the ladder).", ""]
    lines += ["![p50, p99.9 and max latency per quantum, two loads](evaluation_granularity.png)",
              ""]
    return "\n".join(lines)


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
    run_script("evaluation_granularity", __doc__, sweep, report, plot)


if __name__ == "__main__":
    main()
