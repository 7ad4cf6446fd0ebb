"""The open-loop harness of the timestamp-tokens paper's §7.1, for tokenflow.

"Our open-loop testing harness supplies the input at a specified rate, even if the system
itself becomes less responsive.  We record the observed latency in units of nanoseconds in a
histogram of logarithmically-sized bins.  If the system becomes overloaded and end-to-end
latency becomes greater than 1 second, the testing harness regards the experiment as failed."
(Lattuada, McSherry et al., *Timestamp tokens: a better coordination primitive for
data-processing systems*, 2022, §7.1.)

How it works here, on every worker (``drive``):

- Record ``i`` of a worker is *due* (offered) at ``t0 + i / r`` (``r``: the worker's share of
  the offered rate, ``time.monotonic_ns`` clock).  The loop hands records to the input in
  batches, when their *period* has ended: the quantum, or 2^20 ns (about 1 ms) when the quantum
  is coarser (Python pays ~50-100 µs per worker step, so waking once per record at coarse
  quanta would measure the harness's wake-ups; a record can produce no output before its
  quantum closes anyway, and 1 ms batches keep the work spread over a coarse quantum).  Then the
  input advances to the current quantum and the worker takes one step.  The loop sleeps until
  the next record's period ends or, when records were sent in the current quantum, until that
  quantum ends (to close it): the input's time moves when records need it to, not at every
  turn of the loop (timely's harness advances it at every turn, which costs nothing in Rust;
  here a step costs tens of µs, and a worker that spins advancing time through empty quanta
  measures its own spinning).  A record's *offer
  time* is when it was due, not when the loop got round to it, so a system that falls behind
  pays for it in latency (no coordinated omission).
- Record ``i`` carries the logical time ``offer - offer % quantum`` (the paper's timestamps
  quantized to powers of two, in ns); the input is advanced to the current quantum after every
  turn, so a time completes as soon as the wall clock has left its quantum.
- Latency is measured where the output is produced: the sink subtracts each output record's
  offer time (carried in the record) from the clock when the sink sees it, and adds it to a
  ``Histogram`` (8 bins per power of two: a percentile is known to within 12.5 %).
  ``--per-time`` measurements (the NEXMark queries, whose output rows do not correspond to
  single input records) use a probe instead: the latency of logical time ``t`` is the clock
  when the output frontier passes ``t`` minus the clock when the input closed ``t``.
- The first ``warmup`` seconds are not recorded.  A run *did not finish* (DNF) as soon as a
  recorded latency exceeds 1 s, or the output frontier lags the clock by more than 1 s; the
  worker then stops offering, tells its operators to drop what they hold (``Abort``) and
  drains.  A run is DNF when any worker's is.
- Workers start together: each advances its input to 1 and waits for the output frontier to
  pass it (every worker has built its dataflow), then all start offering at one agreed clock
  time (``agree_start``).  Clocks are ``CLOCK_MONOTONIC``, one per machine, so offer and
  output times compare across the processes of the ``process`` runtime.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenflow import execute
from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary
from tokenflow.dataflow.stream import Stream

NS = 1_000_000_000
DNF_NS = NS
"""A latency above this (1 s) makes a run "did not finish", as in the paper."""

SUB_BINS = 8
"""Histogram bins per power of two."""


class Histogram:
    """Latencies (ns) in logarithmically sized bins: exact below 16 ns, then 8 bins per
    power of two, so a value read back is within 12.5 % of the one recorded.  The largest
    value is kept exactly.  ``since`` (ns): values of records offered before it are ignored
    (the warm-up), see ``record``."""

    __slots__ = ("counts", "max", "since")

    def __init__(self) -> None:
        self.counts: list[int] = [0] * 64 * SUB_BINS
        self.max = 0
        self.since = 0

    def add(self, value: int) -> None:
        """Count one latency of ``value`` ns."""
        if value < 16:
            index = max(value, 0)
        else:
            e = value.bit_length() - 1
            index = (e - 2) * SUB_BINS + ((value >> (e - 3)) & 7)
        self.counts[index] += 1
        if value > self.max:
            self.max = value

    def add_array(self, values: np.ndarray) -> None:
        """Count every latency of ``values`` (ns, int64), vectorized (the same bins as
        ``add``)."""
        if len(values) == 0:
            return
        v = np.maximum(values.astype(np.int64), 0)
        index = v.copy()
        big = v >= 16
        if big.any():
            b = v[big]
            e = np.floor(np.log2(b.astype(np.float64))).astype(np.int64)
            e -= (b >> e) == 0  # float rounding at the edges of a power of two
            e += (b >> (e + 1)) > 0
            index[big] = (e - 2) * SUB_BINS + ((b >> (e - 3)) & 7)
        counts = self.counts
        binned = np.bincount(index)
        for i in np.flatnonzero(binned).tolist():
            counts[i] += int(binned[i])
        top = int(v.max())
        if top > self.max:
            self.max = top

    def record_array(self, now: int, offered: Any) -> None:
        """``record`` for every offer time of ``offered`` (an int64 Arrow array or numpy
        array, ns): vectorized, or one by one below 64 values (numpy's cost per call would
        otherwise be the sink's cost of a small batch)."""
        if len(offered) < 64:
            record = self.record
            for x in offered.to_pylist() if isinstance(offered, pa.Array) else offered.tolist():
                record(now, x)
            return
        values = offered.to_numpy() if isinstance(offered, pa.Array) else offered
        self.add_array(now - values[values >= self.since])

    def record(self, now: int, offered: int) -> None:
        """Count ``now - offered`` when ``offered`` is past the warm-up."""
        if offered >= self.since:
            self.add(now - offered)

    @staticmethod
    def upper(index: int) -> int:
        """The largest value bin ``index`` holds."""
        if index < 16:
            return index
        e, sub = index // SUB_BINS + 2, index % SUB_BINS
        return ((9 + sub) << (e - 3)) - 1

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merge(self, other: Histogram) -> Histogram:
        """Add ``other``'s counts to this histogram (returns it)."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.max = max(self.max, other.max)
        return self

    def percentile(self, p: float) -> int:
        """The upper bound of the bin holding the ``p``-quantile (0 < p <= 1), capped at the
        exact maximum; 0 when empty."""
        total = self.count
        if total == 0:
            return 0
        target = max(1, math.ceil(p * total))
        seen = 0
        for index, n in enumerate(self.counts):
            seen += n
            if seen >= target:
                return min(self.upper(index), self.max)
        return self.max


class Abort:
    """A worker-local flag: set when the run is abandoned (DNF), or true by itself once the
    clock passes ``deadline`` (ns; the end of the run's drain time).  Benchmark operators that
    see it drop their buffered records and held tokens so the dataflow drains at once; those
    with a loop per timestamp check it in the loop, so that a collapsed run ends in bounded
    time."""

    __slots__ = ("set_", "deadline", "reason")

    def __init__(self) -> None:
        self.set_ = False
        self.deadline = 2**63
        self.reason: str | None = None

    def set(self, reason: str | None = None) -> None:
        if not self.set_:
            self.reason = reason
        self.set_ = True

    def __bool__(self) -> bool:
        if not self.set_ and time.monotonic_ns() > self.deadline:
            self.set("drain time exceeded")
        return self.set_


@dataclass
class Load:
    """One open-loop run's parameters.

    Attributes:
        rate: records offered per second, all workers together.
        quantum_ns: timestamps are offer times rounded down to a multiple of this.
        duration: seconds of offering (warm-up included).
        warmup: seconds at the start whose records are not measured.
        drain_limit: seconds a worker may take to drain after offering before it aborts.
        period_ns: records are handed to the input when their period (the quantum, at most
            this) ends; see the module notes.
    """

    rate: float
    quantum_ns: int
    duration: float = 3.0
    warmup: float = 0.5
    drain_limit: float = 3.0
    period_ns: int = 2**20


@dataclass
class WorkerReport:
    """What one worker measured."""

    index: int
    offered: int = 0
    hist: Histogram = field(default_factory=Histogram)
    dnf: str | None = None
    steps: int = 0
    behind_ns: int = 0
    """The most the loop fell behind the offer schedule (ns)."""
    seconds: float = 0.0
    cpu: float = 0.0
    """CPU seconds of the worker's thread while offering."""


@dataclass
class Result:
    """A run: the workers' histograms merged."""

    params: dict[str, Any]
    offered: int
    hist: Histogram
    dnf: str | None
    seconds: float
    behind_ns: int
    cpu: float = 0.0
    """CPU seconds of the workers' threads while offering, summed."""

    @property
    def measured(self) -> int:
        return self.hist.count

    def ms(self, p: float) -> float:
        return self.hist.percentile(p) / 1e6

    def row(self) -> dict[str, Any]:
        """Params plus p50 / p99 / p99.9 / max in ms (None when DNF) and the DNF reason."""
        ok = self.dnf is None
        out = dict(self.params)
        out.update(offered=self.offered, measured=self.measured,
                   p50=self.ms(0.5) if ok else None, p99=self.ms(0.99) if ok else None,
                   p999=self.ms(0.999) if ok else None,
                   max=self.hist.max / 1e6 if ok else None, dnf=self.dnf,
                   behind_ms=self.behind_ns / 1e6,
                   cpu_us=1e6 * self.cpu / self.offered if self.offered else None)
        return out


def latency_sink(stream: Stream, hist: Histogram, abort: Abort, name: str = "Latency",
                 timed: bool = False) -> Stream:
    """Record, for every output tuple, the clock now minus its offer time (its last field;
    with ``timed``, the last field of the record of each ``(time, record)`` pair); anything
    else (watermark records) is ignored.  Sets ``abort`` at the first latency over 1 s.
    Forwards nothing; probe its output."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()
        clock = time.monotonic_ns
        record = hist.record

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for _ref, batch in input:
                now = clock()
                if type(batch) is not list:  # columnar: an Arrow batch with an offer column
                    hist.record_array(now, batch.column("offer"))
                    continue
                if timed:
                    for r in batch:
                        if type(r) is tuple:
                            record(now, r[1][-1])
                    continue
                for r in batch:
                    if type(r) is tuple:
                        record(now, r[-1])
            if hist.max > DNF_NS and not abort.set_:
                abort.set(f"latency {hist.max / 1e9:.2f} s")

        return logic

    return unary(stream, "pipeline", name, constructor)


WORDS = [f"w{i:04d}" for i in range(4096)]


def word_record(index: int, worker: int, offer_ns: int) -> tuple[str, int]:
    """Record ``index`` of ``worker``: ``(word, offer time)``; words spread over 4,096."""
    return (WORDS[(index * 2654435761 + worker * 40503) % 4096], offer_ns)


def agree_start(worker: Any, margin_ms: int = 20) -> int:
    """A clock time (ns) every worker of the job returns alike: ``margin_ms`` after the latest
    worker's call (each broadcasts its clock in a one-record dataflow and takes the maximum).
    Sleeping until it starts the workers' offer schedules together."""
    seen: list[int] = []

    def build(scope: Any) -> Any:
        handle, stream = scope.new_input(name="AgreeStart")
        probe = stream.broadcast().inspect(seen.append).probe()
        return handle, probe

    handle, probe = worker.dataflow(build)
    handle.send(time.monotonic_ns())
    handle.close()
    worker.step_while(lambda: not probe.done())
    start = max(seen) + margin_ms * 1_000_000
    while time.monotonic_ns() < start:
        time.sleep(max(0.0, (start - time.monotonic_ns()) / NS))
    return start


def drive(worker: Any, handle: Any, probe: Any, load: Load, hist: Histogram, abort: Abort,
          make: Callable[[int, int, int], Any] = word_record,
          per_time: Callable[[int, int], None] | None = None,
          timed: bool = False,
          make_batch: Callable[[int, int, np.ndarray, np.ndarray], Any] | None = None,
          ) -> WorkerReport:
    """Offer records open-loop on this worker and step it (see the module notes).

    ``make(i, worker_index, offer_ns)`` builds record ``i``; ``per_time(now, frontier)``, when
    given, is called after every step with the clock and the probe's least frontier time (or
    -1 when the output ended).  With ``timed`` each record goes out as the timed record
    ``(time, record)`` (``InputHandle.send_at``) at the input's current epoch instead of
    advancing the input to each record's time first: the records and their times, and the
    moments the input advances to close a quantum, are the same; one message carries the
    records of many times.  With ``make_batch(first, worker_index, offers, times)`` (columnar
    timed records, ``columnar.make_batch``) the records due are built as one Arrow batch per
    turn (numpy offer and time arrays, the same values as one by one) and sent with
    ``InputHandle.send_batch_at``.
    """
    report = WorkerReport(worker.index)
    clock = time.monotonic_ns
    q = int(load.quantum_ns)
    rate = load.rate / worker.peers
    interval = NS / rate
    handle.advance_to(1)
    worker.step_while(lambda: probe.less_than(1))
    t0 = agree_start(worker)
    cpu0 = time.thread_time()
    hist.since = t0 + int(load.warmup * NS)
    end = t0 + int(load.duration * NS)
    abort.deadline = end + int(load.drain_limit * NS)
    cur = 1
    sent = 0
    me = worker.index
    send = handle.send
    send_at = handle.send_at
    step = worker.step_or_park
    period = min(q, load.period_ns)
    next_offer = t0
    last_ts = 0  # the time of the last record sent
    while True:
        now = clock()
        if now >= end:
            break
        closed = now - now % period  # records offered before this are handed over now
        if next_offer < closed:
            report.behind_ns = max(report.behind_ns,
                                   now - (next_offer - next_offer % period + period))
        if make_batch is not None and next_offer < closed:
            due = np.arange(sent, math.ceil((closed - t0) / interval) + 1, dtype=np.int64)
            offers = t0 + (due * interval).astype(np.int64)
            offers = offers[offers < closed]
            times = offers - offers % q
            handle.send_batch_at(make_batch(sent, me, offers, times))
            last_ts = int(times[-1])
            sent += len(offers)
            next_offer = t0 + int(sent * interval)
        while next_offer < closed:
            ts = next_offer - next_offer % q
            if timed:
                send_at(ts, make(sent, me, next_offer))
            else:
                if ts > cur:
                    handle.advance_to(ts)
                    cur = ts
                send(make(sent, me, next_offer))
            last_ts = ts
            sent += 1
            next_offer = t0 + int(sent * interval)
        ts = now - now % q
        if last_ts >= cur and ts > cur:  # close the quantum of the records sent last
            handle.advance_to(ts)
            cur = ts
        else:
            handle.flush()
        # wake for the next record's period, or to close the quantum of records just sent
        wake = next_offer - next_offer % period + period
        if last_ts >= cur:
            wake = min(wake, cur + q)
        step(max(0.0, min((wake - clock()) / NS, 0.002)))
        report.steps += 1
        frontier = probe.with_frontier()
        low = min(frontier) if frontier else -1
        now = clock()
        if per_time is not None:
            per_time(now, low)
        if frontier and low > 1 and now - low > DNF_NS + q:
            abort.set(f"output frontier {(now - low) / 1e9:.2f} s behind")
        if abort.set_:
            break
    report.offered = sent
    report.cpu = time.thread_time() - cpu0
    handle.close()
    while worker.step_or_park(0.002):
        if per_time is not None:
            frontier = probe.with_frontier()
            per_time(clock(), min(frontier) if frontier else -1)
        bool(abort)  # sets it once the drain deadline has passed
    if hist.max > DNF_NS:
        abort.set(f"latency {hist.max / 1e9:.2f} s")
    report.dnf = abort.reason if abort.set_ else None
    report.hist = hist
    report.seconds = (clock() - t0) / NS
    return report


def merge(params: dict[str, Any], reports: Sequence[WorkerReport]) -> Result:
    """One ``Result`` from the workers' reports."""
    hist = Histogram()
    for r in reports:
        hist.merge(r.hist)
    dnfs = [f"worker {r.index}: {r.dnf}" for r in reports if r.dnf]
    return Result(params, sum(r.offered for r in reports), hist, "; ".join(dnfs) or None,
                  max(r.seconds for r in reports), max(r.behind_ns for r in reports),
                  sum(r.cpu for r in reports))


def run_wordcount(build: Callable[[Stream, Abort], Stream], load: Load, workers: int = 1,
                  runtime: str = "thread", params: dict[str, Any] | None = None,
                  timed: bool = False,
                  make_batch: Callable[[int, int, np.ndarray, np.ndarray], Any] | None = None,
                  ) -> Result:
    """Run ``build`` (input stream of ``(word, offer_ns)`` -> output tuples whose last field is
    the offer time; with ``timed``, ``(time, record)`` pairs of both, see ``drive``) open-loop
    under ``load`` and measure per-record latency."""

    def job(worker: Any) -> WorkerReport:
        hist = Histogram()
        abort = Abort()

        def dataflow(scope: Any) -> Any:
            handle, stream = scope.new_input()
            probe = latency_sink(build(stream, abort), hist, abort, timed=timed).probe()
            return handle, probe

        handle, probe = worker.dataflow(dataflow)
        return drive(worker, handle, probe, load, hist, abort, timed=timed,
                     make_batch=make_batch)

    budget = load.duration + load.drain_limit + 60
    reports = execute(job, workers=workers, runtime=runtime, timeout=budget)
    return merge(dict(params or {}, rate=load.rate, quantum=load.quantum_ns, workers=workers,
                      runtime=runtime, timed=timed, columnar=make_batch is not None), reports)


def confirmed(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s row; a run that did not finish is run once more and counts as DNF only if it
    fails again (other people's jobs share the machine: one stall can fail a run).  The row
    then says ``retried`` (the first attempt's reason)."""
    row = run()
    if row["dnf"]:
        again = run()
        again["retried"] = row["dnf"]
        return again
    return row


# -- reporting -------------------------------------------------------------------------------


def machine() -> str:
    """Date, machine and versions for the top of a result file."""
    import numpy
    import pyarrow

    from benchmarks._provenance import provenance

    load = os.getloadavg()
    return (f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
            f"{os.cpu_count()} cores (shared with other users' jobs; load average "
            f"{load[0]:.1f} when the script started, {{load_end}} when it ended), "
            f"Linux {platform.release()}, "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, "
            f"pyarrow {pyarrow.__version__}.  {provenance()}")


def header(data: dict[str, Any]) -> str:
    """The ``machine()`` line of a result, with the load average at its end filled in."""
    return str(data["machine"]).replace("{load_end}", f"{data.get('load_end', float('nan')):.1f}")


def load_end() -> float:
    """The 1-minute load average now (stored with a result when its runs are over)."""
    return os.getloadavg()[0]


def fmt_ms(value: float | None) -> str:
    """Milliseconds for a table cell (``DNF`` for None)."""
    if value is None:
        return "DNF"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(row: dict[str, Any]) -> str:
    """``p50 / p99.9 / max`` (ms) of a row, ``DNF``, and ``†`` when it finished only at the
    second attempt (``confirmed``)."""
    if row["dnf"]:
        return "DNF"
    mark = " †" if row.get("retried") else ""
    return f"{fmt_ms(row['p50'])} / {fmt_ms(row['p999'])} / {fmt_ms(row['max'])}{mark}"


RETRY_NOTE = ("† did not finish at the first attempt and finished at the second (a DNF counts "
              "only when it happens twice in a row: other people's jobs share the machine).")


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}"


def quantum_label(q: int) -> str:
    """``2^k ns (x)`` for a power-of-two quantum."""
    k = q.bit_length() - 1
    if q >= 1_000_000:
        human = f"{q / 1e6:.1f} ms"
    elif q >= 1_000:
        human = f"{q / 1e3:.0f} µs"
    else:
        human = f"{q} ns"
    return f"2^{k} ns ({human})"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align``: one of ``l``/``r`` per column (default: first left)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


RESULTS = Path(__file__).resolve().parents[1] / "results"


def output_dir(out: Path | None, quick: bool) -> Path:
    """Where a script writes: ``out``, else ``benchmarks/results`` (a temporary directory for
    ``--quick`` runs, which are not for the record)."""
    if out is None:
        out = Path(tempfile.gettempdir()) / "tokenflow-evaluation-quick" if quick else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_script(stem: str, doc: str | None, measure: Callable[[bool], dict[str, Any]],
               report: Callable[[dict[str, Any]], str],
               plot: Callable[[dict[str, Any], Path], None]) -> None:
    """The command line every evaluation script shares: ``--quick``, ``--load JSON`` (rewrite
    the report and plot from saved measurements) and ``--out DIR``; writes ``stem`` + ``.json``
    (when measured), ``.md`` and ``.png``."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--load", type=Path, help="rewrite the report from a saved JSON")
    parser.add_argument("--out", type=Path, help="output directory (default: "
                        "benchmarks/results; with --quick a temporary directory)")
    args = parser.parse_args()
    data = json.loads(args.load.read_text()) if args.load else measure(args.quick)
    out = output_dir(args.out, data["quick"])
    if not args.load:
        (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(report(data))
    plot(data, out / f"{stem}.png")
    log(f"wrote {out / stem}.md")


def log(message: str) -> None:
    print(message, flush=True)
