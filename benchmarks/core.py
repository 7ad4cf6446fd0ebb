"""Core benchmark (issue: coordination core): writes ``benchmarks/results/core.md``.

1. Word count on the ``thread`` runtime (2 workers) next to a plain-Python loop doing the same
   counting, measured side by side in one run (the machine is shared, so only ratios mean
   something).  Input: the English text of Python's own documentation (``pydoc_data.topics``),
   repeated; batches of ``--batch`` words; an epoch every 10 batches.  Two variants:

   * ``list``:  batches are Python lists of ``str``; each worker pre-aggregates a batch with
     ``collections.Counter``, exchanges ``(word, count)`` pairs by word and sums them per epoch;
     the plain loop runs ``Counter.update`` over the same batches.
   * ``arrow``: batches are Arrow string arrays; ``pyarrow.compute.value_counts`` per batch,
     exchange of ``(word, count)`` record batches by column, per-epoch sums; the
     plain loop runs ``value_counts`` on the same batches and sums per epoch the same way
     (``dictionary_encode`` + ``numpy.bincount``).
   * ``arrow, pipeline``: the ``arrow`` dataflow with a pipeline pact instead of the exchange
     (each worker sums its own share; the driver adds the workers' counts): the runtime's
     per-batch overhead without the routing work the plain loop does not do.

2. ``propagate_all`` on a 256-operator chain: µs per pointstamp change (a capability at the
   head of the chain downgraded epoch by epoch; each downgrade is two changes, −1 and +1).

Run with ``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenflow import execute
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.generic import unary, unary_frontier
from tokenflow.order.summary import Increment
from tokenflow.progress import Antichain, Builder, Source, Target

RESULTS = Path(__file__).parent / "results"
EPOCH_BATCHES = 10


def load_words() -> list[str]:
    import pydoc_data.topics as topics

    text = " ".join(topics.topics[k] for k in sorted(topics.topics))
    return re.findall(r"[a-z']+", text.lower())


# -- list variant ---------------------------------------------------------------------------


def plain_list(batches: list[list[str]], repeat: int) -> tuple[float, int]:
    start = time.perf_counter()
    distinct = 0
    for _ in range(repeat):
        for e in range(0, len(batches), EPOCH_BATCHES):
            counts: collections.Counter[str] = collections.Counter()
            for b in batches[e : e + EPOCH_BATCHES]:
                counts.update(b)
            distinct += len(counts)
    return time.perf_counter() - start, distinct


def preaggregate(stream: Any) -> Any:
    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                out.give_batch(ref, list(collections.Counter(batch).items()))

        return logic

    return unary(stream, "pipeline", "PreAggregate", constructor)


def sum_per_epoch(stream: Any, pact: Any) -> Any:
    def constructor(cap: Any, info: Any) -> Any:
        cap.drop()
        pending: dict[int, tuple[Any, collections.Counter[str]]] = {}

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                entry = pending.get(ref.time)
                if entry is None:
                    entry = pending[ref.time] = (ref.retain(), collections.Counter())
                counts = entry[1]
                for word, c in batch:
                    counts[word] += c
            for t in sorted(pending):
                if inp.frontier.less_equal(t):
                    break
                token, counts = pending.pop(t)
                out.give_batch(token, [len(counts)])
                token.drop()

        return logic

    return unary_frontier(stream, pact, "SumPerEpoch", constructor)


def dataflow_list(batches: list[list[str]], repeat: int, workers: int) -> tuple[float, int]:
    def job(worker: Any) -> int:
        def build(scope: Any) -> Any:
            inp, words = scope.new_input()
            sums = sum_per_epoch(preaggregate(words), Exchange(lambda kv: kv[0]))
            return inp, sums.capture()

        inp, cap = worker.dataflow(build)
        epoch = 0
        for _ in range(repeat):
            for e in range(0, len(batches), EPOCH_BATCHES):
                for j, b in enumerate(batches[e : e + EPOCH_BATCHES]):
                    if j % worker.peers == worker.index:
                        inp.send_batch(b)
                epoch += 1
                inp.advance_to(epoch)
                worker.step()
        inp.close()
        worker.step_until_done()
        return sum(sum(b) for _, b in cap.events)

    start = time.perf_counter()
    distinct = sum(execute(job, workers=workers))
    return time.perf_counter() - start, distinct


# -- arrow variant --------------------------------------------------------------------------


def _value_counts(array: pa.Array) -> pa.RecordBatch:
    vc = pc.value_counts(array)
    return pa.RecordBatch.from_arrays([vc.field("values"), vc.field("counts")], ["word", "n"])


def _epoch_sum(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    """Sum ``n`` per ``word`` over ``parts``: dictionary-encode the words, ``bincount`` by code."""
    words = pa.concat_arrays([p.column(0) for p in parts])
    counts = np.concatenate([p.column(1).to_numpy() for p in parts])
    encoded = pc.dictionary_encode(words)
    sums = np.bincount(encoded.indices.to_numpy(), weights=counts).astype(np.int64)
    return pa.RecordBatch.from_arrays([encoded.dictionary, pa.array(sums)], ["word", "n"])


def plain_arrow(batches: list[pa.Array], repeat: int) -> tuple[float, int]:
    start = time.perf_counter()
    distinct = 0
    for _ in range(repeat):
        for e in range(0, len(batches), EPOCH_BATCHES):
            parts = [_value_counts(b) for b in batches[e : e + EPOCH_BATCHES]]
            distinct += _epoch_sum(parts).num_rows
    return time.perf_counter() - start, distinct


def dataflow_arrow(batches: list[pa.Array], repeat: int, workers: int,
                   exchange: bool = True) -> tuple[float, int]:
    def job(worker: Any) -> int:
        def build(scope: Any) -> Any:
            inp, words = scope.new_input()
            counted = words.map_batch(_value_counts, "ValueCounts")

            def constructor(cap: Any, info: Any) -> Any:
                cap.drop()
                pending: dict[int, tuple[Any, list[pa.RecordBatch]]] = {}

                def logic(inp: Any, out: Any) -> None:
                    for ref, batch in inp:
                        entry = pending.get(ref.time)
                        if entry is None:
                            entry = pending[ref.time] = (ref.retain(), [])
                        entry[1].append(batch)
                    for t in sorted(pending):
                        if inp.frontier.less_equal(t):
                            break
                        token, parts = pending.pop(t)
                        summed = _epoch_sum(parts)
                        # exchange: distinct words (each word on one worker); pipeline: words
                        out.give_batch(token, [summed.num_rows if exchange
                                               else int(pc.sum(summed.column("n")).as_py())])
                        token.drop()

                return logic

            pact = Exchange(column="word") if exchange else "pipeline"
            sums = unary_frontier(counted, pact, "SumPerEpoch", constructor)
            return inp, sums.capture()

        inp, cap = worker.dataflow(build)
        epoch = 0
        for _ in range(repeat):
            for e in range(0, len(batches), EPOCH_BATCHES):
                for j, b in enumerate(batches[e : e + EPOCH_BATCHES]):
                    if j % worker.peers == worker.index:
                        inp.send_batch(b)
                epoch += 1
                inp.advance_to(epoch)
                worker.step()
        inp.close()
        worker.step_until_done()
        return sum(sum(b) for _, b in cap.events)

    start = time.perf_counter()
    distinct = sum(execute(job, workers=workers))
    return time.perf_counter() - start, distinct


# -- propagate_all on a chain ---------------------------------------------------------------


def chain_propagation(length: int, epochs: int) -> float:
    """µs per pointstamp change: a capability at the chain head downgraded ``epochs`` times."""
    builder = Builder(Increment(0))
    for node in range(length):
        builder.add_node(node, 1, 1, [[Antichain([Increment(0)])]])
    for node in range(length - 1):
        builder.add_edge(Source(node, 0), Target(node + 1, 0))
    tracker, _ = builder.build()
    head = Source(0, 0)
    tracker.update_source(head, 0, 1)
    tracker.propagate_all()
    tracker.pushed().drain()
    start = time.perf_counter()
    for t in range(epochs):
        tracker.update_source(head, t + 1, 1)
        tracker.update_source(head, t, -1)
        tracker.propagate_all()
        tracker.pushed().drain()
    elapsed = time.perf_counter() - start
    return elapsed / (2 * epochs) * 1e6


def plot(rows: list[tuple[str, float, float, float]], chain: list[tuple[int, float]], workers: int,
         path: Path) -> None:
    """Save the tables as a PNG: words/s and ratio per variant, ``propagate_all`` cost per length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, FormatStrFormatter, LogLocator, NullFormatter

    variants = [r[0] for r in rows]
    x = np.arange(len(rows))
    fig, (speed, ratio, prop) = plt.subplots(1, 3, figsize=(16, 5))
    for offset, column, label in ((-0.2, 1, "plain Python loop"),
                                  (0.2, 2, f"dataflow (thread, {workers} workers)")):
        bars = speed.bar(x + offset, [r[column] for r in rows], 0.4, label=label)
        speed.bar_label(bars, fmt=lambda v: f"{v / 1e6:.1f} M")
    speed.set(xticks=x, xticklabels=variants, yscale="log", xlabel="batch type",
              ylim=(min(min(r[1:3]) for r in rows) / 3, max(max(r[1:3]) for r in rows) * 5),
              ylabel="words/s (log scale)", title="Word count throughput (median trial)")
    speed.legend(loc="upper right")
    bars = ratio.bar(x, [r[3] for r in rows], 0.5,
                     color=["tab:green" if r[3] >= 0.5 else "tab:orange" for r in rows])
    ratio.bar_label(bars, fmt="%.2f")
    ratio.axhline(0.5, color="red", linestyle="--", label="target ≥ 0.50")
    ratio.set(xticks=x, xticklabels=variants, ylim=(0, max(1.0, *(r[3] * 1.15 for r in rows))),
              xlabel="batch type", ylabel="dataflow words/s ÷ plain loop words/s",
              title="Dataflow vs plain loop (higher is better)")
    ratio.legend()
    lengths, micros = [c[0] for c in chain], [c[1] for c in chain]
    prop.plot(lengths, micros, marker="o")
    for n, us in chain:
        prop.annotate(f"{us:,.1f} µs", (n, us), textcoords="offset points", xytext=(6, -12))
    prop.set(xscale="log", yscale="log", xlabel="operators in the chain (log scale)",
             ylabel="µs per pointstamp change (log scale)", title="propagate_all on an operator chain")
    prop.set_xticks(lengths, [str(n) for n in lengths])
    prop.margins(0.15)
    for ax, formatter in ((speed, EngFormatter()), (prop, FormatStrFormatter("%g"))):
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(formatter)
        ax.yaxis.set_minor_formatter(NullFormatter())
    prop.grid(True, which="both", alpha=0.3)
    fig.suptitle("Core benchmark (shared machine: compare ratios, not absolute figures)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="words per batch (>= 1000)")
    parser.add_argument("--repeat", type=int, default=32, help="passes over the text")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5, help="alternating runs per variant")
    args = parser.parse_args(argv)

    words = load_words()
    list_batches = [words[i : i + args.batch] for i in range(0, len(words), args.batch)]
    arrow_batches = [pa.array(b, type=pa.string()) for b in list_batches]
    n = len(words) * args.repeat
    rows = []
    def arrow_pipeline(batches: list[pa.Array], repeat: int, workers: int) -> tuple[float, int]:
        return dataflow_arrow(batches, repeat, workers, exchange=False)

    for variant, plain, flow, batches in (
        ("list", plain_list, dataflow_list, list_batches),
        ("arrow", plain_arrow, dataflow_arrow, arrow_batches),
        ("arrow, pipeline", plain_arrow, arrow_pipeline, arrow_batches),
    ):
        plain_t, flow_t = [], []
        for _ in range(args.trials):  # alternate so both see the same machine load
            t, d_plain = plain(batches, args.repeat)  # type: ignore[operator]
            plain_t.append(t)
            t, d_flow = flow(batches, args.repeat, args.workers)  # type: ignore[operator]
            flow_t.append(t)
            if variant == "arrow, pipeline":  # counts all words, not distinct ones
                d_plain = n
            if d_plain != d_flow:
                sys.exit(f"{variant}: dataflow counted {d_flow} distinct words, plain {d_plain}")
        p, f = statistics.median(plain_t), statistics.median(flow_t)
        rows.append((variant, n / p, n / f, p / f))
        print(f"{variant:6s} plain {n / p / 1e6:6.2f} M words/s   dataflow ({args.workers} workers) "
              f"{n / f / 1e6:6.2f} M words/s   ratio {p / f:.2f}")

    chain = [(length, chain_propagation(length, 2000 if length <= 64 else 400))
             for length in (8, 64, 256)]
    for length, us in chain:
        print(f"propagate_all chain of {length:3d}: {us:8.2f} µs per pointstamp change")

    RESULTS.mkdir(exist_ok=True)
    lines = [
        "# Core benchmark",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Input: Python's documentation text ({len(words):,} words) × {args.repeat}; "
        f"batches of {args.batch} words; an epoch every {EPOCH_BATCHES} batches; median of "
        f"{args.trials} alternating trials. `thread` runtime, {args.workers} workers "
        "(one process: the GIL serializes them, so this measures overhead, not speed-up).",
        "",
        "## Word count: dataflow vs the same counting in a plain loop",
        "",
        "| variant | plain loop (words/s) | dataflow (words/s) | ratio | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for variant, p, f, r in rows:
        verdict = "met" if r >= 0.5 else "missed"
        lines.append(f"| {variant} | {p:,.0f} | {f:,.0f} | {r:.2f} | ≥ 0.50 ({verdict}) |")
    lines += [
        "",
        "Reading the rows: `arrow, pipeline` is the runtime's own cost per batch (progress",
        "tracking, scheduling, channels) next to the same counting.  The two exchange variants",
        "also route every batch, work the single-process plain loop does not do: `arrow` hashes",
        "the batch's distinct words (about 780 of 4,096) and splits the batch, which costs about",
        "as much as `value_counts` itself; `list` runs a Python key function and a Python sum per",
        "(word, count) pair, per-record work `Counter.update` does in C.",
        "",
        "## `propagate_all` on an operator chain",
        "",
        "| operators | µs per pointstamp change |",
        "|---:|---:|",
    ]
    lines += [f"| {length} | {us:.2f} |" for length, us in chain]
    lines += [
        "",
        "A pointstamp change at the head of a chain of N operators moves the frontier of all 2N",
        "ports downstream, so the cost grows linearly with N.",
        "",
        "![Word count words/s and ratio to the plain loop; propagate_all µs per change](core.png)",
        "",
    ]
    (RESULTS / "core.md").write_text("\n".join(lines))
    plot(rows, chain, args.workers, RESULTS / "core.png")
    print(f"wrote {RESULTS / 'core.md'} and {RESULTS / 'core.png'}")


if __name__ == "__main__":
    main()
