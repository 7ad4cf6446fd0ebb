"""Word count benchmark (issue 17): tokenflow against one thread doing the same counting.

Writes ``benchmarks/results/wordcount.md`` and ``wordcount.png`` (and prints the table).

Input: ``--epochs`` epochs (default 100) of ``--words`` words (default 100,000) drawn from a
Zipf vocabulary of 10,000 made-up words (probability of rank ``k`` ∝ ``1 / k``), generated with
numpy from a fixed seed; worker ``w`` of 2 draws its half of epoch ``e`` from the seed
``(SEED, e, w)`` and sends it as one batch.  The user code is what a README reader writes:

* **list**: ``words.exchange()`` then a ``unary_frontier`` keeping a ``Counter`` per pending
  epoch (with the epoch's token) and a dict of running totals; when the input frontier passes
  an epoch it emits one ``(word, running count)`` per distinct word of the epoch;
* **arrow**: each half is a ``RecordBatch`` with a ``word`` column, ``exchange(column="word")``,
  ``pyarrow.compute.value_counts`` per received batch; at the end of an epoch the counts are
  summed per word (``group_by``), the running totals (a numpy array over the words seen so far,
  found with ``index_in``) updated, and one ``(word, count)`` batch emitted.

Variants: one epoch in flight (the next epoch is sent when the previous one's output is
complete), 4 epochs in flight, and *paced*: one epoch offered every ``--period`` s (epoch
latency, send to probe passed).  Baselines in the same run, over the very same words: a
single-thread plain ``Counter`` loop with the same running totals (the list code's logic
without a dataflow), the same Arrow logic in one thread over whole epochs, and a bare
``value_counts`` over each epoch's words (the "pyarrow kernel").  Ratios are words/s of a run
over words/s of its baseline.

Every run's output (every epoch's ``(word, running count)`` records) is checked equal to the
plain loop's (a digest of the sorted records per epoch) before any figure is printed.

Each tokenflow run happens in a child process importing ``tokenflow`` from a given ``src/``
(this repository's, or with ``--baseline REV`` also that commit's, exported with ``git
archive``), interleaved, so before and after are measured in one sitting.

Timing (``time.perf_counter`` inside worker 0): from just before its first send until its
probe has passed the last epoch; the ``execute`` call as a whole (processes' start-up
included) is shown apart.  Run: ``.venv/bin/python benchmarks/wordcount.py [--quick]
[--baseline REV] [--runtimes process,spark]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from _provenance import exported, provenance  # a sibling module: benchmarks run as scripts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKERS = 2
SEED = 17
VOCABULARY = 10_000
VARIANTS = ("list, 1 in flight", "list, 4 in flight", "arrow, 1 in flight", "list, paced",
            "list, small epochs")
SMALL_IN_FLIGHT = 8
"""Epochs in flight when measuring the small epochs' maximum rate."""
OPEN_LOOP_LIMIT = 10_000
"""Most epochs in flight in an open-loop run (it stops offering beyond, rather than run away)."""

# -- the words ---------------------------------------------------------------------------------


def vocabulary() -> list[str]:
    """``VOCABULARY`` distinct made-up lower-case words of 2-12 letters (fixed seed)."""
    rng = np.random.default_rng(SEED)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        length = int(rng.integers(2, 13))
        words.setdefault(letters[rng.integers(0, 26, length)].tobytes().decode(), None)
    return list(words)


def zipf_probabilities() -> np.ndarray:
    p = 1.0 / np.arange(1, VOCABULARY + 1)
    return p / p.sum()


def half_indices(epoch: int, worker: int, words: int) -> np.ndarray:
    """Vocabulary indices of worker ``worker``'s half of epoch ``epoch``."""
    rng = np.random.default_rng((SEED, epoch, worker))
    return rng.choice(VOCABULARY, size=words // WORKERS, p=zipf_probabilities())


def half_lists(worker: int, epochs: int, words: int) -> list[list[str]]:
    vocab = np.array(vocabulary(), dtype=object)
    return [vocab[half_indices(e, worker, words)].tolist() for e in range(epochs)]


def half_batches(worker: int, epochs: int, words: int) -> list[pa.RecordBatch]:
    vocab = pa.array(vocabulary(), pa.string())
    return [pa.record_batch({"word": vocab.take(half_indices(e, worker, words))})
            for e in range(epochs)]


# -- the user logic (shared by the dataflow and the single-thread baselines) -------------------


def emit_running(counts: Counter[str], totals: dict[str, int]) -> list[tuple[str, int]]:
    """Add an epoch's ``counts`` to ``totals``; the epoch's ``(word, running count)`` records."""
    out = []
    for word, n in counts.items():
        total = totals.get(word, 0) + n
        totals[word] = total
        out.append((word, total))
    return out


class ArrowTotals:
    """Running totals per word, batch at a time: the words seen so far and a count each."""

    def __init__(self) -> None:
        self.words = pa.array([], pa.string())
        self.totals = np.zeros(0, dtype=np.int64)

    def add(self, parts: list[pa.StructArray]) -> pa.RecordBatch:
        """Add ``value_counts`` results of one epoch; that epoch's ``(word, count)`` batch."""
        table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(p) for p in parts])
        if len(parts) > 1:
            table = table.group_by("values").aggregate([("counts", "sum")]).rename_columns(
                ["values", "counts"])
        words, counts = table.column("values").combine_chunks(), table.column("counts")
        at = pc.index_in(words, value_set=self.words)
        new = at.is_null()
        fresh = words.filter(new)
        if len(fresh):
            at = pc.if_else(new, pc.add(pc.cumulative_sum(pc.cast(new, pa.int64())),
                                        len(self.words) - 1), at)
            self.words = pa.concat_arrays([self.words, fresh])
            self.totals = np.concatenate([self.totals, np.zeros(len(fresh), np.int64)])
        at_np = at.to_numpy()
        self.totals[at_np] += counts.to_numpy()
        return pa.record_batch({"word": words, "count": self.totals[at_np]})


def count_lists(words: Any) -> Any:
    """The list word count on a stream of word lists (README style)."""

    def constructor(capability: Any, info: Any) -> Any:
        capability.drop()
        pending: dict[int, tuple[Any, Counter[str]]] = {}  # epoch -> (token, counts)
        totals: dict[str, int] = {}

        def logic(input: Any, output: Any) -> None:
            for ref, batch in input:
                if ref.time not in pending:
                    pending[ref.time] = (ref.retain(), Counter())
                pending[ref.time][1].update(batch)
            for epoch in sorted(pending):
                if input.frontier.less_equal(epoch):
                    break
                token, counts = pending.pop(epoch)
                output.session(token).give_batch(emit_running(counts, totals))
                token.drop()

        return logic

    return words.exchange().unary_frontier("pipeline", "CountWords", constructor)


def count_arrow(words: Any) -> Any:
    """The Arrow word count on a stream of ``RecordBatch``es with a ``word`` column."""

    def constructor(capability: Any, info: Any) -> Any:
        capability.drop()
        pending: dict[int, tuple[Any, list[pa.StructArray]]] = {}
        totals = ArrowTotals()

        def logic(input: Any, output: Any) -> None:
            for ref, batch in input:
                if ref.time not in pending:
                    pending[ref.time] = (ref.retain(), [])
                pending[ref.time][1].append(pc.value_counts(batch.column("word")))
            for epoch in sorted(pending):
                if input.frontier.less_equal(epoch):
                    break
                token, parts = pending.pop(epoch)
                output.session(token).give_batch(totals.add(parts))
                token.drop()

        return logic

    return words.exchange(column="word").unary_frontier("pipeline", "CountWords", constructor)


def digest(per_epoch: dict[int, list[tuple[str, int]]]) -> str:
    """One hash of every epoch's records, independent of their order and of the batching."""
    h = hashlib.sha256()
    for epoch in sorted(per_epoch):
        h.update(repr((epoch, sorted(per_epoch[epoch]))).encode())
    return h.hexdigest()


# -- single-thread baselines -------------------------------------------------------------------


def plain_loop(epochs: int, words: int, period: float = 0.0) -> dict[str, Any]:
    """The list logic in one thread, epoch after epoch (sleeping ``period`` s before each
    epoch but the first when given, as the paced runs wait)."""
    halves = [half_lists(w, epochs, words) for w in range(WORKERS)]
    totals: dict[str, int] = {}
    out: dict[int, list[tuple[str, int]]] = {}
    latencies = []
    start = time.perf_counter()
    for e in range(epochs):
        if period and e:
            time.sleep(period)
        t0 = time.perf_counter()
        counts: Counter[str] = Counter()
        for half in halves:
            counts.update(half[e])
        out[e] = emit_running(counts, totals)
        latencies.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "latencies": latencies, "digest": digest(out)}


def arrow_loop(epochs: int, words: int) -> dict[str, Any]:
    """The Arrow logic in one thread over each whole epoch, and a bare ``value_counts``."""
    halves = [half_batches(w, epochs, words) for w in range(WORKERS)]
    whole = [pa.concat_arrays([h[e].column("word") for h in halves]) for e in range(epochs)]
    totals = ArrowTotals()
    out: dict[int, list[tuple[str, int]]] = {}
    start = time.perf_counter()
    for e in range(epochs):
        batch = totals.add([pc.value_counts(whole[e])])
        out[e] = list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    for e in range(epochs):
        pc.value_counts(whole[e])
    kernel = time.perf_counter() - start
    return {"seconds": seconds, "kernel": kernel, "digest": digest(out)}


# -- one tokenflow run (in a child process) ----------------------------------------------------


def make_job(variant: str, epochs: int, words: int, period: float, in_flight: int | None = None,
             rate: float | None = None) -> Callable[[Any], Any]:
    """The worker function of one run.  Time 0 is an empty epoch every worker must pass
    first (a barrier after generating the words); epoch ``e``'s words travel at time ``e + 1``.

    ``in_flight`` overrides the variant's epochs in flight; ``rate`` (epochs/s) offers the
    epochs open loop on a shared wall-clock grid, whatever the output's progress (at most
    ``OPEN_LOOP_LIMIT`` in flight), and measures each epoch's latency from its due time."""
    arrow = variant.startswith("arrow")
    if in_flight is None:
        in_flight = 4 if "4 in flight" in variant else 1
    paced = "paced" in variant
    if rate is not None:
        in_flight = OPEN_LOOP_LIMIT

    def job(worker: Any) -> dict[str, Any]:
        batches: list[Any] = (half_batches if arrow else half_lists)(worker.index, epochs, words)
        seen: list[tuple[int, Any]] = []

        def build(scope: Any) -> tuple[Any, Any]:
            inp, stream = scope.new_input()
            counted = (count_arrow if arrow else count_lists)(stream)
            # kept for the output check: a list batch as a tuple, which the garbage collector
            # stops tracking (a tuple of str/int tuples), so the check's own memory (millions of
            # records by the end) does not make the job's collections longer than a user's
            probe = counted.inspect_batch(lambda t, batch: seen.append(
                (t, tuple(batch) if isinstance(batch, list) else batch))).probe()
            return inp, probe

        inp, probe = worker.dataflow(build)
        barrier(worker, inp, probe)
        sent_at: list[float] = []
        done_at: list[float] = []

        def watch(_: Any) -> None:  # after every step: which epochs has the probe passed?
            now = time.perf_counter()
            while len(done_at) < len(sent_at) and not probe.less_than(len(done_at) + 2):
                done_at.append(now)

        worker.on_step.append(watch)
        origin = float(int(time.time() + 1.5)) if rate is not None else 0.0
        start = time.perf_counter()
        first, cpu = start, time.thread_time()  # from the first send (after an open loop's wait)
        late: list[float] = []  # open loop: how long after its due time each epoch went out
        for epoch in range(epochs):
            if paced and epoch:
                if epoch == 1:  # epoch 0 warms up; then offer on a shared wall-clock grid
                    origin = float(int(time.time() + 1.5))
                wait_until(worker, origin + (epoch - 1) * period)
            if rate is not None:
                due = origin + epoch / rate
                wait_until(worker, due)
                late.append(max(0.0, time.time() - due))
            if not sent_at:
                first, cpu = time.perf_counter(), time.thread_time()
            sent_at.append(time.perf_counter())
            inp.send_batch(batches[epoch])
            inp.advance_to(epoch + 2)
            worker.step_while(lambda: probe.less_than(inp.time - (in_flight - 1)))
        inp.close()
        worker.step_while(lambda: not probe.done())
        end, cpu = time.perf_counter(), time.thread_time() - cpu
        seconds, active = end - start, end - first
        latencies = [d - s for s, d in zip(sent_at, done_at, strict=True)]
        if rate is not None:
            latencies = [lat + lag for lat, lag in zip(latencies, late, strict=True)]
        return {"seconds": seconds, "cpu": cpu, "active": active,
                "latencies": latencies[1:] if paced else latencies,
                "records": records_of(seen), "origin": origin}

    return job


def wait_until(worker: Any, deadline: float) -> None:
    """``Worker.step_until(deadline)``, or the same loop for a tree from before it existed
    (``--baseline``)."""
    step_until = getattr(worker, "step_until", None)
    if step_until is not None:
        step_until(deadline)
        return
    while (left := deadline - time.time()) > 0:
        worker.step_or_park(min(left, 0.01))


def barrier(worker: Any, inp: Any, probe: Any) -> None:
    """Pass the empty epoch 0 (every worker has generated its words)."""
    inp.advance_to(1)
    worker.step_while(lambda: probe.less_than(1))


def records_of(seen: list[tuple[int, Any]]) -> dict[int, list[tuple[str, int]]]:
    """Output batches ``(time, batch)`` as records per epoch (epoch = time - 1)."""
    records: dict[int, list[tuple[str, int]]] = {}
    for t, batch in seen:
        if isinstance(batch, pa.RecordBatch):
            batch = list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
        records.setdefault(t - 1, []).extend(batch)
    return records


def merged_digest(results: list[dict[str, Any]]) -> str:
    """``digest`` of all workers' output records together."""
    merged: dict[int, list[tuple[str, int]]] = {}
    for result in results:
        for t, records in result["records"].items():
            merged.setdefault(t, []).extend(records)
    return digest(merged)


def child(args: argparse.Namespace) -> None:
    """Run the requested variants on one runtime; print one JSON line per run."""
    from tokenflow import execute

    options: dict[str, Any] = {}
    if args.runtime == "spark":
        from tokenflow.spark import session

        session.get_session(f"local[{WORKERS}]")
        options["master"] = f"local[{WORKERS}]"
    try:
        for variant in args.variants.split(";"):
            extra: dict[str, Any] = {}
            if "small" in variant:  # the maximum rate first, then open loop at half of it
                epochs, words = args.small_epochs, args.small_words
                most = execute(make_job(variant, epochs, words, args.period, SMALL_IN_FLIGHT),
                               workers=WORKERS, runtime=args.runtime, **options)
                extra = {"max_rate": epochs / most[0]["seconds"], "max_digest": merged_digest(most)}
                job = make_job(variant, epochs, words, args.period, rate=extra["max_rate"] / 2)
            else:
                epochs = args.paced_epochs if "paced" in variant else args.epochs
                words = args.words
                job = make_job(variant, epochs, words, args.period)
            start = time.perf_counter()
            results = execute(job, workers=WORKERS, runtime=args.runtime, **options)
            job_seconds = time.perf_counter() - start
            if len({r["origin"] for r in results}) != 1:
                raise RuntimeError("the workers paced their epochs on different grids")
            print(json.dumps({"variant": variant, "runtime": args.runtime, "epochs": epochs,
                              "words": words, "seconds": results[0]["seconds"],
                              "job_seconds": job_seconds, "latencies": results[0]["latencies"],
                              "cpu": [r["cpu"] for r in results],
                              "active": [r["active"] for r in results],
                              "digest": merged_digest(results), **extra}),
                  flush=True)
    finally:
        if args.runtime == "spark":
            session.stop_session()


# -- profiling (py-spy) ------------------------------------------------------------------------

STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (step, substrings of a frame), tried on each frame from the innermost outwards
    ("parked (waiting)", ("TcpMesh.park", "EpollSelector.select", "Condition.wait")),
    ("socket", ("sendmsg", "read_frame", "_recv_into", "recv_exactly", "read_header")),
    ("sealing (AES-GCM)", ("FrameSealer.seal", "FrameOpener.open", "allocate")),
    ("serialization", ("encode_payload", "decode_message", "pickle")),
    ("routing / exchange", ("routing.py", "ExchangePusher")),
    ("user logic", ("wordcount.py", "collections/__init__.py")),
    ("progress", ("Progcaster", "Tracker", "propagate", "ChangeBatch", "Antichain",
                  "progress/", "probe.py", "Capability")),
    ("operators, channels", ("dataflow/",)),
    ("step loop, activations", ("worker.py", "tcp.py")),
)


SKIPPED = ("half_lists", "half_batches", "records_of", "dataflow (", "barrier (")
"""Frames of the job outside its timed loop (generating words, building, the barrier)."""


def step_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for step, needles in STEPS:
            if any(n in frame for n in needles):
                return step
    return "other"


def breakdown(raw: Path) -> dict[str, Counter[str]]:
    """Samples per step and thread kind (worker main thread; receiver threads, in trees from
    before the worker thread read its sockets itself) of the worker processes, during the
    timed loop only (not generating words or converting output)."""
    out: dict[str, Counter[str]] = {"main": Counter(), "receivers": Counter()}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if any("tokenflow-recv-" in f for f in frames):
            kind = "receivers"
        elif any("make_job.<locals>.job" in f for f in frames):
            if any(n in stack for n in SKIPPED):
                continue
            kind = "main"
        else:
            continue
        out[kind][step_of(frames[frames.index(next(f for f in frames if "thread (" in f)):])] += int(count)
    return out


def profile_run(src: Path, variant: str,
                args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Counter[str]]]:
    """One run of ``variant`` under py-spy with ``tokenflow`` from ``src``: its figures and
    samples per step."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.txt"
        command = [str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses",
                   "--nonblocking", "--idle", "--threads", "--rate", str(PROFILE_RATE), "--format",
                   "raw", "-o", str(raw), "--", sys.executable, str(Path(__file__).resolve()),
                   "--child", "--runtime", args.runtimes.split(",")[0], "--variants", variant,
                   "--epochs", str(args.epochs), "--words", str(args.words), "--paced-epochs", "2",
                   "--period", "1"]
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env=dict(os.environ, PYTHONPATH=str(src)))
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        run = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))
        return run, breakdown(raw)


KEPT = "\n## Where an epoch's time goes"
"""wordcount.md from this heading on is written by hand (profiles, before/after) and kept."""

PROFILE_RATE = 1000
"""py-spy samples per second."""


def profile(args: argparse.Namespace) -> None:
    """Run each variant's job under py-spy (every worker process, idle samples included) and
    print where an epoch's wall-clock time goes on the worker main threads, per step: each
    step's share of their samples times the measured time per epoch (and the receiver
    threads' samples off the socket, in ms per epoch)."""
    with ExitStack() as stack:
        trees = [("after" if args.baseline else "this tree", ROOT / "src")]
        if args.baseline:
            trees.insert(0, ("before", stack.enter_context(exported(args.baseline))))
        for variant in args.profile.split(";"):
            columns = []
            for tree, src in trees:
                run, steps = profile_run(src, variant, args)
                epoch_ms = run["seconds"] / run["epochs"] * 1e3
                main_total = max(1, sum(steps["main"].values()))
                per_receiver = WORKERS * PROFILE_RATE * run["epochs"] / 1e3  # samples per ms/epoch
                columns.append((tree, epoch_ms, {
                    step: (steps["main"][step] / main_total * epoch_ms,
                           steps["receivers"][step] / per_receiver)
                    for step, _ in (*STEPS, ("other", ()))}))
            print(f"\n{variant}, {args.runtimes.split(',')[0]} runtime, {args.epochs} epochs under py-spy: "
                  "ms per epoch (worker main threads' wall clock; receiver threads off the socket)")
            print("| step | " + " | ".join(f"{tree}: main | {tree}: receivers" for tree, _, _ in columns)
                  + " |\n|---|" + "---:|---:|" * len(columns))
            for step, _ in (*STEPS, ("other", ())):
                off_socket = not step.startswith(("socket", "parked"))
                cells = [f"{c[step][0]:.2f} | {f'{c[step][1]:.2f}' if off_socket else ''}"
                         for _, _, c in columns]
                print(f"| {step} | " + " | ".join(cells) + " |")
            print("| **epoch** | " + " | ".join(f"**{ms:.2f}** | " for _, ms, _ in columns) + " |")


# -- the driver --------------------------------------------------------------------------------


def run_child(src: Path, runtime: str, variants: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(src))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--runtime", runtime,
               "--variants", ";".join(variants), "--epochs", str(args.epochs),
               "--words", str(args.words), "--paced-epochs", str(args.paced_epochs),
               "--period", str(args.period), "--small-epochs", str(args.small_epochs),
               "--small-words", str(args.small_words)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{runtime} run failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def percentile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['variant']}\n{r['runtime']}" + (f" ({r['tree']})" if r["tree"] else "")
              for r in rows]
    y = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.8))
    bars = ax.barh(y, [r["ratio"] for r in rows], color=[
        "tab:gray" if r["runtime"] == "1 thread" else "tab:orange" if r["tree"] == "before"
        else "tab:blue" for r in rows])
    ax.bar_label(bars, labels=[f"{r['ratio']:.2f}×  ({r['rate'] / 1e6:.2f}M words/s)"
                               for r in rows], padding=3)
    ax.set(yticks=y, yticklabels=labels, xlabel="words/s ÷ the single-thread baseline's",
           title="Word count, 2 workers: throughput relative to one thread doing the same work")
    ax.invert_yaxis()
    ax.margins(x=0.3)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cpu_cells(run: dict[str, Any], words: int, baseline_rate: float | None) -> str:
    """The *worker CPU* and *bound* cells of a run: the workers' mean thread CPU time per
    epoch (and the share of the timed loop's wall time it is), and the ratio to the baseline
    that workers as busy as that would reach if they never waited (words per epoch over CPU
    time per epoch, against the baseline's words/s)."""
    per_epoch = sum(run["cpu"]) / len(run["cpu"]) / run["epochs"]
    busy = sum(run["cpu"]) / sum(run["active"])
    bound = "" if baseline_rate is None else f"{words / per_epoch / baseline_rate:.2f}"
    return f" {per_epoch * 1e3:.2f} ({busy:.0%}) | {bound} |"


def small_row(run: dict[str, Any], plain: dict[str, Any], args: argparse.Namespace) -> str:
    """The table row of the small-epochs variant: its maximum rate (``SMALL_IN_FLIGHT`` in
    flight) against the plain loop over the same epochs, and the open-loop latency at half of
    that rate."""
    rate = run["max_rate"] * args.small_words
    plain_rate = args.small_epochs * args.small_words / plain["seconds"]
    lat = run["latencies"]
    return (f"| list, {args.small_words:,}-word epochs: max ({SMALL_IN_FLIGHT} in flight); "
            f"latency open loop at {run['max_rate'] / 2:,.0f} epochs/s (half) | {run['runtime']} | "
            f"{run['tree']} | {rate:,.0f} | {rate / plain_rate:.2f} | plain loop | "
            f"{run['job_seconds']:.2f} | {percentile(lat, 50) * 1e3:.2f} | "
            f"{percentile(lat, 99) * 1e3:.2f} |" + cpu_cells(run, args.small_words, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 epochs, 3 paced (~1 minute)")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--words", type=int, default=100_000, help="words per epoch")
    parser.add_argument("--paced-epochs", type=int, default=11, help="paced epochs (1st: warm-up)")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between paced epochs")
    parser.add_argument("--small-epochs", type=int, default=3000,
                        help="epochs of the small-epochs variant")
    parser.add_argument("--small-words", type=int, default=1000,
                        help="words per epoch of the small-epochs variant")
    parser.add_argument("--runtimes", default="process", help="comma-separated: thread,process,spark")
    parser.add_argument("--baseline", help="also measure this commit's src/ (before/after)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tree (best is kept)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--profile", metavar="VARIANTS",
                        help="instead: per-step breakdown of these ';'-separated variants under "
                             "py-spy (pip install py-spy) on the first of --runtimes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runtime", help=argparse.SUPPRESS)
    parser.add_argument("--variants", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.epochs, args.paced_epochs = 20, 4
    if args.profile:
        profile(args)
        return

    load = os.getloadavg()[0]
    total = args.epochs * args.words
    print(f"baselines over {args.epochs} epochs x {args.words:,} words ...", file=sys.stderr)
    plain = plain_loop(args.epochs, args.words)
    arrow = arrow_loop(args.epochs, args.words)
    if arrow["digest"] != plain["digest"]:
        raise AssertionError("the single-thread Arrow logic's output differs from the plain loop's")
    paced_plain = plain_loop(args.paced_epochs, args.words, args.period)
    paced_epoch = percentile(paced_plain["latencies"][1:], 50)
    plain_rate = total / plain["seconds"]
    arrow_rate = total / arrow["seconds"]
    kernel_rate = total / arrow["kernel"]
    plain_epoch = percentile(plain["latencies"], 50)

    trees: list[tuple[str, Path]] = []
    with ExitStack() as stack:
        if args.baseline:
            trees.append(("before", stack.enter_context(exported(args.baseline))))
        trees.append(("after" if args.baseline else "", ROOT / "src"))
        runs: list[dict[str, Any]] = []
        for runtime in args.runtimes.split(","):
            for round_ in range(args.rounds):
                for tree, src in trees:
                    print(f"  {runtime} {tree or 'this tree'} round {round_ + 1} ...", file=sys.stderr)
                    for run in run_child(src, runtime, list(VARIANTS), args):
                        run["tree"] = tree
                        runs.append(run)

    small_plain = plain_loop(args.small_epochs, args.small_words)
    for run in runs:
        expected = (small_plain if "small" in run["variant"] else
                    paced_plain if "paced" in run["variant"] else plain)["digest"]
        if run["digest"] != expected or run.get("max_digest", expected) != expected:
            raise AssertionError(f"{run['runtime']} {run['tree']} {run['variant']}: output differs "
                                 "from the plain loop's")

    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in runs:
        key = (run["runtime"], run["tree"], run["variant"])
        if key not in best or run["seconds"] < best[key]["seconds"]:
            best[key] = run

    rows: list[dict[str, Any]] = [
        {"variant": "plain Counter loop", "runtime": "1 thread", "tree": "", "rate": plain_rate,
         "ratio": 1.0, "p50": plain_epoch, "p99": percentile(plain["latencies"], 99)},
        {"variant": "Arrow logic (value_counts + totals)", "runtime": "1 thread", "tree": "",
         "rate": arrow_rate, "ratio": arrow_rate / plain_rate, "p50": None, "p99": None},
        {"variant": "bare value_counts kernel", "runtime": "1 thread", "tree": "",
         "rate": kernel_rate, "ratio": kernel_rate / plain_rate, "p50": None, "p99": None},
    ]
    table = ["| variant | runtime | tree | words/s (dataflow) | ratio | vs | job s | epoch p50 ms "
             "| epoch p99 ms | worker CPU ms/epoch (busy) | bound |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
             f"| plain `Counter` loop + totals | 1 thread | | {plain_rate:,.0f} | 1.00 | itself | "
             f"{plain['seconds']:.2f} | {plain_epoch * 1e3:.1f} | "
             f"{percentile(plain['latencies'], 99) * 1e3:.1f} | | |",
             f"| Arrow logic (value_counts, group_by, totals) | 1 thread | | {arrow_rate:,.0f} | "
             f"1.00 | itself | {arrow['seconds']:.2f} | | | | |",
             f"| bare `value_counts` kernel | 1 thread | | {kernel_rate:,.0f} | 1.00 | itself | "
             f"{arrow['kernel']:.2f} | | | | |"]
    plot_rows = []
    for (runtime, tree, variant), run in best.items():
        if "small" in variant:
            table.append(small_row(run, small_plain, args))
            continue
        words = run["epochs"] * args.words
        rate = words / run["seconds"]
        if variant.startswith("arrow"):
            ratio, versus = rate / kernel_rate, "kernel"
            extra = f" ({rate / arrow_rate:.2f} vs the Arrow logic)"
        else:
            ratio, versus, extra = rate / plain_rate, "plain loop", ""
        lat = run["latencies"]
        paced = "paced" in variant
        shown = f"{variant} ({args.period:g} s/epoch)" if paced else variant
        table.append(
            f"| {shown} | {runtime} | {tree} | {'' if paced else f'{rate:,.0f}'} | "
            f"{'' if paced else f'{ratio:.2f}{extra}'} | {'' if paced else versus} | "
            f"{run['job_seconds']:.2f} | {percentile(lat, 50) * 1e3:.1f} | "
            f"{percentile(lat, 99) * 1e3:.1f} |"
            + cpu_cells(run, args.words, None if paced else
                        kernel_rate if variant.startswith("arrow") else plain_rate))
        if paced:
            table[-1] += (f" p50 = {percentile(lat, 50) / plain_epoch:.2f}× the plain epoch "
                          f"({percentile(lat, 50) / paced_epoch:.2f}× the plain epoch after "
                          f"{args.period:g} s asleep, {paced_epoch * 1e3:.1f} ms)")
        else:
            plot_rows.append({"variant": variant, "runtime": runtime, "tree": tree, "rate": rate,
                              "ratio": ratio})
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        "# Word count benchmark (issue 17)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}, pyarrow {pa.__version__}; {when}; 1-minute load average "
        f"{load:.1f} at the start. {provenance()}",
        "",
        f"One run of `benchmarks/wordcount.py{' --quick' if args.quick else ''}"
        f"{f' --baseline {args.baseline}' if args.baseline else ''} --runtimes {args.runtimes}"
        f"{f' --rounds {args.rounds}' if args.rounds > 1 else ''}`: {args.epochs} epochs × "
        f"{args.words:,} words (Zipf over {VOCABULARY:,} words), {WORKERS} workers; paced: "
        f"{args.paced_epochs - 1} epochs (after one warm-up) offered every {args.period:g} s."
        + (f" Tree *before*: commit {args.baseline}; *after*: this tree. Best of {args.rounds} "
           "round(s) each, before and after interleaved." if args.baseline else ""),
        "",
        *table,
        "",
        "![Throughput relative to the single-thread baselines](wordcount.png)",
        "",
        "- *words/s (dataflow)*: inside worker 0, from its first send until its probe passed the "
        "last epoch. *job s*: the whole `execute` call (worker start-up included).",
        "- *ratio*: words/s over the baseline's in the same run: the plain `Counter` loop for list "
        "runs, the bare `value_counts` kernel for Arrow runs (in brackets: over the same Arrow "
        "logic in one thread).",
        "- *epoch p50/p99*: worker 0, from just before an epoch's batch is sent until the step "
        "after which its probe passed the epoch; plain loop: the time to count one epoch.",
        "- *worker CPU*: each worker thread's CPU time (`time.thread_time`) per epoch from its "
        "first send to the end of the timed loop, the mean over the workers, and in brackets its "
        "share of that wall time (the rest: waiting for data, progress or the next due "
        "epoch). *bound*: the ratio workers this busy per epoch would reach if they never "
        "waited, (words per epoch / CPU time per epoch) over the "
        "baseline's words/s; more epochs in flight can only remove waiting, so a run whose "
        "ratio is near its bound is limited by the work each worker does per word.",
        "- Every run's output (each epoch's `(word, running count)` records) was checked equal to "
        "the plain loop's.",
        "",
    ])
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / "wordcount.md"
        kept = path.read_text().partition(KEPT)[1:] if path.exists() else ("", "")
        path.write_text(text + "".join(kept))
        plot([*rows[:1], {**rows[2], "ratio": 1.0}, *plot_rows], RESULTS / "wordcount.png")


if __name__ == "__main__":
    main()
