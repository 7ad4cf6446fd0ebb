"""Fig. 7 of the timestamp-tokens paper: strong and weak scaling of the rolling word count.

1 and 2 workers (this machine has 2 cores, shared with other people's jobs), on the ``thread``
runtime (one process: the GIL runs one worker's Python at a time) and the ``process`` runtime
(one process per worker, joined by the TCP mesh); a coarse (2^20 ns, about 1 ms) and a fine
(2^10 ns, one timestamp per record) quantum; tokens, notifications and watermarks.  Strong
scaling keeps the total offered rate at ``RATE``; weak scaling offers ``RATE`` per worker.

Writes ``benchmarks/results/evaluation_scaling.{md,png,json}``; ``--quick``: shorter runs, to a
temporary directory.
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

RATE = 20_000
"""Records/s: the total for strong scaling, per worker for weak scaling."""
QUANTA = {"coarse": 2**20, "fine": 2**10}
CONFIGS = [("1 worker", 1, RATE), ("2 workers, strong", 2, RATE),
           ("2 workers, weak", 2, 2 * RATE)]
RUNTIMES = ("thread", "process")


def measure(quick: bool) -> dict[str, Any]:
    started = machine()
    duration = 1.5 if quick else 2.0
    rows = []
    for runtime in RUNTIMES:
        for qname, q in QUANTA.items():
            for config, workers, rate in CONFIGS:
                for name, build in MECHANISMS.items():
                    row = confirmed(lambda b=build, r=rate, q=q, w=workers, rt=runtime, n=name,
                                    c=config, g=qname: run_wordcount(
                        b, Load(r, q, duration=duration), w, rt,
                        params={"mechanism": n, "config": c, "granularity": g}).row())
                    rows.append(row)
                    log(f"{runtime:<7} {qname:<6} {config:<18} {name:<13} "
                        f"p50 {fmt_ms(row['p50']):>6} p99.9 {fmt_ms(row['p999']):>6} "
                        f"max {fmt_ms(row['max']):>6} {row['dnf'] or ''}")
    return {"machine": started, "load_end": load_end(), "quick": quick, "rows": rows, "duration": duration}


def report(data: dict[str, Any]) -> str:
    rows = data["rows"]
    lines = ["# Evaluation, Fig. 7: scaling", "", header(data), "",
             "The rolling word count of Fig. 6 at 1 and 2 workers.  **This machine has 2 cores, "
             "shared with other users' jobs**: 2 workers is all the scaling it can show, and on "
             "the `thread` runtime the two workers share one Python interpreter lock, so they "
             "add coordination work without adding a core.  Strong scaling: "
             f"{fmt_rate(RATE)} records/s in total; weak scaling: {fmt_rate(RATE)} records/s per "
             "worker.  Latency per record, p50 / p99.9 / max in ms; DNF: a latency above 1 s.  "
             f"{data['duration']:.1f} s per run (0.5 s warm-up); the three mechanisms run one "
             "after the other at each point; one run on a shared machine.", ""]
    body = []
    for runtime in RUNTIMES:
        for qname, q in QUANTA.items():
            for config, _workers, rate in CONFIGS:
                mine = {r["mechanism"]: r for r in rows if r["runtime"] == runtime
                        and r["granularity"] == qname and r["config"] == config}
                body.append([runtime, f"{qname}, {quantum_label(q)}", config, fmt_rate(rate),
                             *[cell(mine[m]) for m in MECHANISMS]])
    lines += [table(["runtime", "quantum", "workers", "offered records/s",
                     *[f"{m} p50 / p99.9 / max" for m in MECHANISMS]], body, "lllrrrr"), "",
              RETRY_NOTE, ""]
    lines += ["![p50 and p99.9 latency per configuration](evaluation_scaling.png)", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    colors = {"tokens": "tab:blue", "notifications": "tab:red", "watermarks": "tab:green"}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey=True)
    for i, runtime in enumerate(RUNTIMES):
        for j, (qname, q) in enumerate(QUANTA.items()):
            ax = axes[i][j]
            for k, name in enumerate(MECHANISMS):
                xs, p50, p999, dnf = [], [], [], []
                for c, (config, _w, _r) in enumerate(CONFIGS):
                    r = next(r for r in data["rows"] if r["runtime"] == runtime
                             and r["granularity"] == qname and r["config"] == config
                             and r["mechanism"] == name)
                    x = c + (k - 1) * 0.08
                    if r["dnf"]:
                        dnf.append(x)
                    else:
                        xs.append(x)
                        p50.append(r["p50"])
                        p999.append(r["p999"])
                ax.plot(xs, p50, "o", color=colors[name], label=f"{name} p50")
                ax.plot(xs, p999, "^", color=colors[name], mfc="none", label=f"{name} p99.9")
                ax.plot(dnf, [1000] * len(dnf), "x", color=colors[name], ms=9)
            ax.set_xticks(range(len(CONFIGS)), [c[0] for c in CONFIGS], fontsize=8)
            ax.set_yscale("log")
            ax.set_title(f"{runtime} runtime, {qname} quantum ({quantum_label(q)})", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("latency (ms); x at 1 s: DNF")
    axes[1][0].set_ylabel("latency (ms); x at 1 s: DNF")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Rolling word count, strong ({RATE:,}/s total) and weak ({RATE:,}/s per "
                 "worker) scaling on a shared 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    run_script("evaluation_scaling", __doc__, measure, report, plot)


if __name__ == "__main__":
    main()
