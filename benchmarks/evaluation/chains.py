"""Fig. 8 of the timestamp-tokens paper: latency with a chain of idle operators.

The rolling word count, gated by a second input: the input filtered to nothing, then a chain of
8 ... 256 no-op operators (``wordcount.gated``).  The count may emit a time only once the
chain's frontier (tokens, notifications) or watermark (watermarks) has passed it, so the chain's
coordination cost is on the measured path although no record ever enters it:

- tokens / notifications: the chain's operators are never scheduled (no data) and do not
  ``notify``, so progress tracking maintains no frontier for them: a frontier change crosses
  the chain in one step, whatever its length (every channel an exchange, as the paper's);
- watermarks-X: every operator reads through a ``WatermarkPact`` and forwards each watermark to
  every worker (the library's ``forward_watermarks``);
- watermarks-P: every operator forwards its own worker's watermark on a pipeline channel, no
  watermark crosses workers (the paper's "unrealistic" best case for watermarks).

1 worker on the ``thread`` runtime, 2 workers on the ``process`` runtime (one core each on this
shared 2-core machine); ``RATE`` records/s per worker; timestamps quantized to 2^20 ns (about
1 ms: about one timestamp per record), every chain length, and to 2^24 ns (17 ms), at 8 and 256
operators.

Writes ``benchmarks/results/evaluation_chains.{md,png,json}``; ``--quick``: fewer lengths,
shorter runs, to a temporary directory.
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
from benchmarks.evaluation.wordcount import CHAIN_MECHANISMS, gated  # noqa: E402

RATE = 2_000
"""Records/s per worker."""
LENGTHS = [8, 16, 32, 64, 128, 256]
QUANTA = [2**20, 2**24]
SETUPS = [(1, "thread"), (2, "process")]


def measure(quick: bool) -> dict[str, Any]:
    started = machine()
    duration = 1.5 if quick else 2.0
    lengths = [8, 64, 256] if quick else LENGTHS
    rows = []
    for q in QUANTA:
        for workers, runtime in SETUPS:
            # the coarse quantum only at the ends of the chain range (time budget)
            for n in lengths if q == QUANTA[0] else [lengths[0], lengths[-1]]:
                for name in CHAIN_MECHANISMS:
                    row = confirmed(lambda q=q, w=workers, rt=runtime, n=n, m=name: run_wordcount(
                        gated(m, n), Load(RATE * w, q, duration=duration), w, rt,
                        params={"mechanism": m, "length": n}).row())
                    rows.append(row)
                    log(f"{quantum_label(q):>18} {workers}w {n:>4} ops {name:<13} "
                        f"p50 {fmt_ms(row['p50']):>6} p99.9 {fmt_ms(row['p999']):>6} "
                        f"max {fmt_ms(row['max']):>6} {row['dnf'] or ''}")
    return {"machine": started, "load_end": load_end(), "quick": quick, "rows": rows, "lengths": lengths,
            "duration": duration}


def find(rows: list[dict[str, Any]], q: int, workers: int, n: int, name: str) -> dict[str, Any]:
    return next(r for r in rows if r["quantum"] == q and r["workers"] == workers
                and r["length"] == n and r["mechanism"] == name)


def present(rows: list[dict[str, Any]], q: int, workers: int, lengths: list[int]) -> list[int]:
    """The chain lengths measured at quantum ``q`` with ``workers``."""
    return [n for n in lengths if any(r["quantum"] == q and r["workers"] == workers
                                      and r["length"] == n for r in rows)]


def target(rows: list[dict[str, Any]], lengths: list[int]) -> list[str]:
    """The acceptance target, per quantum and worker count: tokens' latency at the longest
    chain <= 2x that at the shortest."""
    out = []
    lo, hi = lengths[0], lengths[-1]
    for q in QUANTA:
        for workers, _runtime in SETUPS:
            a, b = find(rows, q, workers, lo, "tokens"), find(rows, q, workers, hi, "tokens")
            if a["dnf"] or b["dnf"]:
                out.append(f"- {quantum_label(q)}, {workers} worker(s): tokens DNF at "
                           f"{lo if a['dnf'] else hi} operators — **not met**")
                continue
            r50, r999 = b["p50"] / a["p50"], b["p999"] / a["p999"]
            verdict = "met" if r50 <= 2 else "not met"
            out.append(f"- {quantum_label(q)}, {workers} worker(s): p50 {fmt_ms(a['p50'])} ms at "
                       f"{lo} → {fmt_ms(b['p50'])} ms at {hi} operators ({r50:.2f}×; p99.9 "
                       f"{r999:.2f}×) — **{verdict}**")
    return out


def report(data: dict[str, Any]) -> str:
    rows, lengths = data["rows"], data["lengths"]
    lines = ["# Evaluation, Fig. 8: chains of idle operators", "", header(data), "",
             "The rolling word count gated by a chain of no-op operators that never receive a "
             "record (see `benchmarks/evaluation/chains.py`).  "
             f"{fmt_rate(RATE)} records/s per worker; 1 worker on the `thread` runtime, 2 "
             "workers on the `process` runtime (2 shared cores).  Latency per record, "
             "p50 / p99.9 / max in ms; DNF: above 1 s.  "
             f"{data['duration']:.1f} s per run (0.5 s warm-up); at each point the four "
             "mechanisms run one after the other; one run on a shared machine.", ""]
    for q in QUANTA:
        for workers, runtime in SETUPS:
            lines += [f"## {quantum_label(q)}, {workers} worker(s) (`{runtime}`)", ""]
            body = [[str(n), *[cell(find(rows, q, workers, n, m)) for m in CHAIN_MECHANISMS]]
                    for n in present(rows, q, workers, lengths)]
            lines += [table(["idle operators", *[f"{m} p50 / p99.9 / max"
                                                 for m in CHAIN_MECHANISMS]], body), ""]
    lines += [RETRY_NOTE, ""]
    lines += ["**Acceptance target** (tokens' latency at 256 idle operators ≤ 2× that at 8; "
              "judged on p50):", "", *target(rows, lengths), "",
              "![latency vs chain length](evaluation_chains.png)", ""]
    return "\n".join(lines)


LABEL = {"p50": "p50", "p999": "p99.9", "max": "max"}


def plot(data: dict[str, Any], path: Path) -> None:
    colors = {"tokens": "tab:blue", "notifications": "tab:red", "watermarks-P": "tab:olive",
              "watermarks-X": "tab:green"}
    rows, lengths = data["rows"], data["lengths"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey=True)
    for i, q in enumerate(QUANTA):
        for j, (workers, runtime) in enumerate(SETUPS):
            ax = axes[i][j]
            here = present(rows, q, workers, lengths)
            for name in CHAIN_MECHANISMS:
                mine = [find(rows, q, workers, n, name) for n in here]
                for stat, style in (("p50", "-"), ("p999", "--")):
                    ax.plot([n for n, r in zip(here, mine, strict=True) if not r["dnf"]],
                            [r[stat] for r in mine if not r["dnf"]], style, marker="o", ms=3,
                            color=colors[name], label=f"{name} {LABEL[stat]}")
                dnf = [n for n, r in zip(here, mine, strict=True) if r["dnf"]]
                ax.plot(dnf, [1000] * len(dnf), "x", color=colors[name], ms=9)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.set_title(f"{workers} worker(s), {runtime}; quantum {quantum_label(q)}",
                         fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("idle operators in the chain")
    for ax in axes[:, 0]:
        ax.set_ylabel("latency (ms): p50 solid, p99.9 dashed")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("Word count gated by a chain of idle operators (shared 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    run_script("evaluation_chains", __doc__, measure, report, plot)


if __name__ == "__main__":
    main()
