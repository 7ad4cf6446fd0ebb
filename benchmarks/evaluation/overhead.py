"""What a timestamp costs: the rolling word count closed-loop, as fast as one worker can go.

The open-loop runs (``granularity.py``) say *where* each mechanism stops keeping up; this says
*why*, in µs.  One worker (``thread`` runtime) pushes ``RECORDS`` records through the rolling
word count with tokens, notifications and watermarks, and through two controls: ``pass-through``
(the input, an exchange and a stateless operator that forwards each batch at its own time: every
per-message and per-timestamp cost of the runtime, no coordination logic of its own) and
``tokens + hop`` (tokens with one more pipelined pass-through operator in front of the count,
the hop ``assign_watermarks`` adds to the watermark dataflow).  Records carry their own
timestamp (one timestamp per record) or share one per 1,024 records; the worker takes one step
per ``B`` records sent (``B`` timestamps per step at one timestamp per record: an open-loop
worker that keeps up takes one step per timestamp or few, one that falls behind takes many
timestamps per step).  Wall-clock µs per record, the median of three alternating rounds.

The three mechanisms also run on *timed records* (``wordcount.TIMED_MECHANISMS``) at one
timestamp per record: each record is sent as ``(time, record)`` under the input's epoch
(``InputHandle.send_at``) and the input advances once per step, past every time sent, instead
of once per record: what a timestamp costs each mechanism once the data path no longer sends a
message per timestamp.

Writes ``benchmarks/results/evaluation_overhead.{md,png,json}``; ``--quick``: fewer records, to
a temporary directory.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.evaluation.harness import (  # noqa: E402
    WORDS,
    Abort,
    header,
    load_end,
    log,
    machine,
    run_script,
    table,
)
from benchmarks.evaluation.wordcount import MECHANISMS, TIMED_MECHANISMS, _noop, word  # noqa: E402
from tokenflow import execute  # noqa: E402
from tokenflow.dataflow.channels import Exchange  # noqa: E402
from tokenflow.dataflow.stream import Stream  # noqa: E402

RECORDS = 40_000
STEPS = [1, 16, 256]
SHARING = [1, 1024]
"""Records per timestamp."""


def pass_through(stream: Stream, abort: Abort) -> Stream:
    return _noop(stream, Exchange(key=word), "PassThrough")


def tokens_hop(stream: Stream, abort: Abort) -> Stream:
    return MECHANISMS["tokens"](_noop(stream, "pipeline", "Hop"), abort)


VARIANTS: dict[str, Any] = {"pass-through": pass_through, **MECHANISMS, "tokens + hop": tokens_hop}
TIMED: dict[str, Any] = {f"timed {name}": build for name, build in TIMED_MECHANISMS.items()}
"""The mechanisms on timed records (one timestamp per record, the input advanced per step)."""


def once(build: Any, records: int, per_step: int, sharing: int, timed: bool = False) -> float:
    """µs per record for one closed-loop run (``timed``: records sent with ``send_at``, the
    input advanced past them once per step)."""

    def job(worker: Any) -> float:
        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            return handle, build(stream, Abort()).probe()

        handle, probe = worker.dataflow(dataflow)
        handle.advance_to(1)
        worker.step_while(lambda: probe.less_than(1))
        data = [(WORDS[(i * 2654435761) % 4096], i) for i in range(records)]
        start = time.perf_counter()
        t = 1
        if timed:
            for i, record in enumerate(data):
                handle.send_at(i + 2, record)
                if i % per_step == per_step - 1:
                    handle.advance_to(i + 3)
                    worker.step()
            handle.close()
            worker.step_until_done()
            return (time.perf_counter() - start) / records * 1e6
        for i, record in enumerate(data):
            if i % sharing == 0:
                t += 1
                handle.advance_to(t)
            handle.send(record)
            if i % per_step == per_step - 1:
                worker.step()
        handle.close()
        worker.step_until_done()
        return (time.perf_counter() - start) / records * 1e6

    return float(execute(job, workers=1)[0])


def measure(quick: bool) -> dict[str, Any]:
    started = machine()
    records = 5_000 if quick else RECORDS
    rounds = 1 if quick else 3
    samples: dict[tuple[str, int, int], list[float]] = {}
    for _ in range(rounds):  # alternate the variants within each round
        for sharing in SHARING:
            for per_step in STEPS:
                for name, build in VARIANTS.items():
                    n = records if sharing == 1 else records * 4
                    n //= 8 if per_step == 1 else 1  # the slowest configurations, shorter
                    samples.setdefault((name, sharing, per_step), []).append(
                        once(build, n, per_step, sharing))
                if sharing == 1:
                    for name, build in TIMED.items():
                        n = records // (8 if per_step == 1 else 1)
                        samples.setdefault((name, 1, per_step), []).append(
                            once(build, n, per_step, 1, timed=True))
    rows = [{"variant": name, "sharing": sharing, "per_step": per_step,
             "us": statistics.median(v), "samples": v}
            for (name, sharing, per_step), v in samples.items()]
    for r in rows:
        log(f"{r['variant']:<14} {r['sharing']:>5} rec/ts {r['per_step']:>4} rec/step "
            f"{r['us']:.1f} µs/record")
    return {"machine": started, "load_end": load_end(), "quick": quick, "rows": rows,
            "records": records, "rounds": rounds}


def find(rows: list[dict[str, Any]], name: str, sharing: int, per_step: int) -> float:
    return float(next(r["us"] for r in rows if r["variant"] == name and r["sharing"] == sharing
                      and r["per_step"] == per_step))


def report(data: dict[str, Any]) -> str:
    rows = data["rows"]
    lines = ["# Evaluation: what a timestamp costs (closed loop)", "", header(data), "",
             "The rolling word count pushed as fast as one worker (`thread` runtime) goes, "
             f"{data['records']:,} records per run at one timestamp per record "
             f"({4 * data['records']:,} at 1,024 records per timestamp; an eighth of that at one "
             "record per step); wall-clock µs per "
             f"record, the median of {data['rounds']} alternating rounds.  *Records per step*: "
             "how many records (hence timestamps, at one per record) the worker sends between "
             "two steps.  `pass-through`: input, exchange and a forwarding operator only (the "
             "runtime's own per-message and per-timestamp cost); `tokens + hop`: tokens with one "
             "more pipelined operator in front (the hop `assign_watermarks` adds).", ""]
    for sharing in SHARING:
        label = "one timestamp per record" if sharing == 1 else f"{sharing:,} records per timestamp"
        lines += [f"## {label[0].upper() + label[1:]}", ""]
        body = []
        for per_step in STEPS:
            base = find(rows, "pass-through", sharing, per_step)
            cells = [str(per_step)]
            for name in VARIANTS:
                us = find(rows, name, sharing, per_step)
                cells.append(f"{us:.1f}" if name == "pass-through" else
                             f"{us:.1f} ({us - base:+.1f})")
            body.append(cells)
        lines += [table(["records per step", *[f"{n} µs" for n in VARIANTS]], body), "",
                  "In brackets: µs more (or less) than `pass-through`: what the mechanism adds.", ""]
    if any(r["variant"].startswith("timed ") for r in rows):
        body = []
        for per_step in STEPS:
            cells = [str(per_step)]
            for name in MECHANISMS:
                us = find(rows, f"timed {name}", 1, per_step)
                cells.append(f"{us:.1f} ({us - find(rows, name, 1, per_step):+.1f})")
            body.append(cells)
        lines += ["## One timestamp per record, timed records", "",
                  "The mechanisms on timed records (`InputHandle.send_at`: each record sent as "
                  "`(time, record)` under the input's epoch, the input advanced past them once "
                  "per step, so one message per step instead of one per timestamp); in "
                  "brackets: the difference to the same mechanism above (a message per "
                  "timestamp).", "",
                  table(["records (= timestamps) per step",
                         *[f"timed {n} µs" for n in MECHANISMS]], body), ""]
        tt = find(rows, "timed tokens", 1, 256)
        tn = find(rows, "timed notifications", 1, 256)
        lines += [f"On timed records at 256 per step, notifications cost {tn / tt:.2f}× what "
                  f"tokens cost ({tn:.1f} vs {tt:.1f} µs per timestamp).", ""]
    t1 = find(rows, "tokens", 1, 1)
    n1 = find(rows, "notifications", 1, 1)
    t256 = find(rows, "tokens", 1, 256)
    n256 = find(rows, "notifications", 1, 256)
    p1 = find(rows, "pass-through", 1, 1)
    lines += [f"At one timestamp per record, notifications cost {n1 / t1:.2f}× what tokens cost "
              f"with one timestamp per step ({n1:.1f} vs {t1:.1f} µs) and {n256 / t256:.2f}× "
              f"with 256 per step ({n256:.1f} vs {t256:.1f} µs); the runtime's own cost of a "
              f"timestamp (`pass-through`) is {p1:.1f} µs at one per step.", "",
              "![µs per record by mechanism and records per step](evaluation_overhead.png)", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    rows = data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    width = 0.8 / len(VARIANTS)
    for ax, sharing in zip(axes, SHARING, strict=True):
        for k, name in enumerate(VARIANTS):
            xs = [i + (k - len(VARIANTS) / 2 + 0.5) * width for i in range(len(STEPS))]
            ax.bar(xs, [find(rows, name, sharing, s) for s in STEPS], width, label=name)
        ax.set_xticks(range(len(STEPS)), [f"{s} per step" for s in STEPS])
        ax.set_yscale("log")
        ax.set_title("one timestamp per record" if sharing == 1 else
                     f"{sharing:,} records per timestamp")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("µs per record (wall clock)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Rolling word count, closed loop, 1 worker (shared 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    run_script("evaluation_overhead", __doc__, measure, report, plot)


if __name__ == "__main__":
    main()
