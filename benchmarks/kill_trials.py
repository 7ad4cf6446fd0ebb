"""Kill and corruption trials for exactly-once recovery (``tokenflow.recovery``).

Writes ``benchmarks/results/kill_trials.md`` (and prints it).  Each trial runs a job with
checkpoints every ``--interval`` seconds in a separate *driver* process (this script with
``--child``), injects one real fault, lets recovery do its work and compares the job's committed
Parquet output, epoch by epoch, with a failure-free run of the same job (computed first, once per
workload and runtime).  A trial passes only if the two are identical: the same epochs, each with
the same multiset of rows.

Workloads: NEXMark q4, q5 and q8 (``run_query(..., output=, checkpoint=)``, ``--events`` events
at 10,000 events/s of event time, 1 s epochs) and a running word count (cumulative count per
word per occurrence, ``state_machine``, a replayable table source paced to run a few seconds).
Runtimes: ``process`` (2 worker processes) and ``spark`` (Spark ``local[2]``, 2 barrier tasks).

Faults (picked round-robin, the moment at random):

* ``worker``: SIGKILL of one worker process (process runtime: a child of the driver; Spark: a
  Python worker forked by the executor's daemon, ``tokenflow.spark.daemon`` on ``local[n]``)
  at a random moment after the first checkpoint (uniform over the first 60 % of what is left
  of the failure-free run's span, from its first committed epoch to its end: start-up
  excluded, so the kill lands while the job runs); the driver restarts the job from the
  latest checkpoint by itself.
* ``driver``: SIGKILL of the driver process (its workers die with it: PDEATHSIG on ``process``,
  the JVM on ``spark``) at a random moment after the first checkpoint, then a new driver resumes
  from the checkpoint directory (what ``tokenflow resume DIR`` does).
* ``snapshot.part``: a worker SIGKILLs itself while writing its part of a checkpoint (after its
  blob file, before its index: ``tokenflow.faults``).
* ``parquet.commit``: the sink's committer SIGKILLs itself in the middle of committing an epoch
  (files moved in, directory not yet renamed into place).
* ``snapshot.commit``: the driver SIGKILLs itself before writing a checkpoint's manifest; a new
  driver resumes.
* ``checkpoint.align`` / ``checkpoint.resumed``: a worker SIGKILLs itself in an aligned
  checkpoint (``tokenflow.control``) while aligning (its barrier up, records of the epoch and
  later waiting at its inputs) / right after its capture (sources resumed, its part not yet
  written, other workers possibly still aligning).

Corruption trials (``--corruptions``): a job is stopped at a checkpoint (graceful stop), its
latest checkpoint is damaged (truncate or flip bytes of a blob file, delete a worker index or
the manifest), a new driver resumes: it must fall back to the previous checkpoint (with a log
line naming the damaged file) and still produce identical output.

Run: ``.venv/bin/python benchmarks/kill_trials.py [--trials 100] [--corruptions 20]`` (about
30 minutes on 2 shared cores); ``--quick`` runs 8 + 4 trials.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = ("wordcount", "q4", "q5", "q8")
FAULTS = ("worker", "driver", "snapshot.part", "parquet.commit", "snapshot.commit", "checkpoint.align",
          "checkpoint.resumed")
CRASH_POINTS = ("snapshot.part", "parquet.commit", "snapshot.commit", "checkpoint.align",
                "checkpoint.resumed")
"""Faults injected by a crash point (``tokenflow.faults``) rather than a SIGKILL from outside."""
CORRUPTIONS = ("truncate", "flip", "index", "manifest")
WORDCOUNT = "benchmarks.kill_trials.wordcount"
EVENTS = {"q4": 1_500_000, "q5": 3_000_000, "q8": 3_000_000}
"""Events per NEXMark query: each run lasts about 5 s on 2 processes, so a fault lands."""
SPARK_DAEMONS = ("tokenflow.spark.daemon", "pyspark.daemon")
"""Modules of the Python worker daemons that fork a Spark task's worker (``local[n]``
sessions use tokenflow's; a session configured otherwise, PySpark's)."""
ATTEMPTS = 3
"""Times a trial is run again (another random moment) when its fault did not fire."""


# -- the jobs (run in the child driver) -----------------------------------------------------------


def words_table(epochs: int = 120, rows: int = 60_000, seed: int = 11) -> pa.Table:
    """Words from a Zipf(1.2) law over 2,000 made-up words, times ``[0, epochs)`` sorted."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(2000)])
    t = np.sort(rng.integers(0, epochs, rows))
    return pa.table({"t": t, "word": vocabulary[rng.zipf(1.2, rows) % len(vocabulary)]})


def wordcount(output: str, pace: float) -> Any:
    """The running word count (``(word, count so far)`` per occurrence), committed per epoch;
    ``pace`` seconds of sleep per batch of 500 words."""
    table = words_table()

    def job(worker: Any) -> None:
        from tokenflow.dataflow.operators.stateful import state_machine
        from tokenflow.io import to_parquet
        from tokenflow.io.sources import replayable_source, table_splits

        def pairs(batch: Any) -> list[tuple[str, int]]:
            time.sleep(pace)
            return [(w, 1) for w in batch.column("word").to_pylist()]

        def build(scope: Any) -> None:
            words, _ = replayable_source(scope, "words", table_splits(table, 8, time="t"),
                                         time="t", max_rows=500)
            counts = state_machine(words.map_batch(pairs),
                                   lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            to_parquet(counts, output, columns=["word", "count"])

        worker.dataflow(build)

    return job


def child(spec: dict[str, Any]) -> None:
    """Run one job (with checkpoints, or ``checkpoint`` None for the reference) and write a
    JSON summary to ``spec["summary"]``."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary: dict[str, Any] = {}
    options: dict[str, Any] = {}
    if spec["runtime"] == "spark":
        options["master"] = "local[2]"
    if spec["workload"] == "wordcount":
        from tokenflow import execute
        from tokenflow.recovery import CheckpointedJob

        fn = wordcount(spec["output"], spec["pace"])
        if spec["checkpoint"] is None:
            execute(fn, workers=2, runtime=spec["runtime"], name=WORDCOUNT, **options)
        else:
            job = CheckpointedJob(fn, 2, spec["runtime"], checkpoint=spec["checkpoint"],
                                  interval=spec["interval"], name=WORDCOUNT,
                                  restore=spec["resume"], **options)
            job.run()
            summary = {"failures": job.failures, "checkpoints": len(job.stats),
                       "events": [asdict(e) for e in job.events]}
    else:
        from tokenflow.nexmark.run import run_query

        result = run_query(spec["workload"], spec["events"], workers=2, runtime=spec["runtime"],
                           output=spec["output"], checkpoint=spec["checkpoint"],
                           checkpoint_interval=spec["interval"], resume=spec["resume"],
                           **options)
        summary = {"failures": result.failures, "checkpoints": len(result.checkpoints)}
    Path(spec["summary"]).write_text(json.dumps(summary))


# -- the trials (this process) --------------------------------------------------------------------


@dataclass
class Trial:
    workload: str
    runtime: str
    fault: str
    fault_at: float | None  # seconds after the driver started (None: the fault never fired)
    recovered_in: float | None  # seconds from the kill to the next epoch committed
    failures: int | None
    identical: bool
    detail: str = ""


def committed(path: Path) -> list[tuple[Any, ...]]:
    """The committed output as sorted rows (partition value first)."""
    from tokenflow.io import read_committed

    table = read_committed(str(path))
    columns = sorted(table.column_names)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def launch(spec: dict[str, Any], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(Path(spec["summary"]).with_suffix(".log"), "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})}, cwd=Path(__file__).resolve().parent.parent)


def workers_of(driver: int, runtime: str) -> list[int]:
    """Pids of the worker processes of the job driven by ``driver``."""
    import psutil

    try:
        tree = psutil.Process(driver).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in tree:
        try:
            cmd = " ".join(p.cmdline())
            parent = " ".join(p.parent().cmdline()) if p.parent() else ""
        except psutil.Error:
            continue
        if runtime == "process" and ("spawn_main" in cmd or "multiprocessing.forkserver" in parent):
            out.append(p.pid)  # spawned, or forked by the runtime's forkserver (its children)
        elif runtime == "spark" and any(d in parent and d in cmd for d in SPARK_DAEMONS):
            out.append(p.pid)  # forked by the executor's Python worker daemon
    return out


def epochs_committed(output: Path) -> int:
    manifest = output / "_tokenflow_manifest.json"
    try:
        return len(json.loads(manifest.read_text()).get("epochs", {}))
    except (OSError, ValueError):
        return -1


def run_trial(workload: str, runtime: str, fault: str, base: dict[str, Any], reference: list[Any],
              span: float, rng: random.Random, work: Path) -> Trial:
    work.mkdir(parents=True)
    ckpt, output = work / "ckpt", work / "out"
    spec = {**base, "workload": workload, "runtime": runtime, "output": str(output),
            "checkpoint": str(ckpt), "resume": False, "summary": str(work / "summary.json")}
    spec["events"] = EVENTS.get(workload, base["events"])
    env: dict[str, str] = {}
    trigger = work / "trigger"
    if fault in CRASH_POINTS:
        trigger.touch()
        env["TOKENFLOW_CRASH"] = f"{fault}={trigger}"
    began = time.monotonic()
    driver = launch(spec, env)
    fault_at = recovered_in = None
    detail = ""
    if fault in ("worker", "driver"):
        from tokenflow.state.snapshot import committed_epochs

        first = None  # when the job's first epoch was committed
        while not committed_epochs(ckpt) and driver.poll() is None:
            if first is None and epochs_committed(output) > 0:
                first = time.monotonic()
            time.sleep(0.005)
        ran = 0.0 if first is None else time.monotonic() - first
        time.sleep(rng.uniform(0.0, 0.6 * max(0.0, span - ran)))
        victims = workers_of(driver.pid, runtime) if fault == "worker" else [driver.pid]
        if driver.poll() is None and victims:
            seen = epochs_committed(output)
            victim = rng.choice(victims)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            fault_at = killed - began
            if fault == "driver":
                driver.wait()
                os.killpg(driver.pid, signal.SIGKILL)  # anything left of its session
                driver = launch({**spec, "resume": True})
            while driver.poll() is None and epochs_committed(output) <= seen:
                time.sleep(0.005)
            if epochs_committed(output) > seen:
                recovered_in = time.monotonic() - killed
        else:
            detail = "the job ended before the fault"
    code = driver.wait(timeout=900)
    if fault in ("snapshot.commit",) and code != 0 and not trigger.exists():
        fault_at = time.monotonic() - began  # the driver died at the crash point: resume
        driver = launch({**spec, "resume": True})
        code = driver.wait(timeout=900)
    if fault in CRASH_POINTS:
        if trigger.exists():
            detail = "the crash point was not reached"
        elif fault_at is None:
            fault_at = float("nan")
    failures = None
    if code != 0:
        detail = f"driver exited with {code}; see {Path(spec['summary']).with_suffix('.log')}"
        identical = False
    else:
        summary = json.loads(Path(spec["summary"]).read_text())
        failures = summary.get("failures")
        identical = committed(output) == reference
    return Trial(workload, runtime, fault, fault_at, recovered_in, failures, identical, detail)


def corruption_trial(workload: str, runtime: str, how: str, base: dict[str, Any],
                     reference: list[Any], work: Path) -> Trial:
    from tokenflow.recovery import STOP_REQUEST
    from tokenflow.state.snapshot import committed_epochs, snapshot_dir

    work.mkdir(parents=True)
    ckpt, output = work / "ckpt", work / "out"
    spec = {**base, "workload": workload, "runtime": runtime, "output": str(output),
            "checkpoint": str(ckpt), "resume": False, "summary": str(work / "summary.json")}
    spec["events"] = EVENTS.get(workload, base["events"])
    driver = launch(spec)
    while len(committed_epochs(ckpt)) < 2 and driver.poll() is None:
        time.sleep(0.005)
    (ckpt / STOP_REQUEST).touch()  # graceful stop: a last checkpoint, then the job ends
    driver.wait(timeout=900)
    epochs = committed_epochs(ckpt)
    if len(epochs) < 2:
        return Trial(workload, runtime, f"corrupt:{how}", None, None, None, False,
                     f"only {len(epochs)} checkpoints before the job ended")
    latest = Path(snapshot_dir(ckpt, epochs[-1]))
    blob = sorted(latest.glob("worker-*.bins"))[0]
    if how == "truncate":
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    elif how == "flip":
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xA5
        blob.write_bytes(bytes(data))
    elif how == "index":
        (latest / blob.name.replace(".bins", ".json")).unlink()
    else:
        (latest / "MANIFEST.json").unlink()
    driver = launch({**spec, "resume": True})
    code = driver.wait(timeout=900)
    if code != 0:
        return Trial(workload, runtime, f"corrupt:{how}", None, None, None, False,
                     f"resume exited with {code}")
    summary = json.loads(Path(spec["summary"]).read_text())
    log = Path(spec["summary"]).with_suffix(".log").read_text(errors="replace")
    fell_back = f"starting from the checkpoint at epoch {epochs[0]}" in log
    detail = f"fell back from epoch {epochs[-1]} to {epochs[0]}" if fell_back else \
        "did not fall back to the previous checkpoint"
    return Trial(workload, runtime, f"corrupt:{how}", None, None, summary.get("failures"),
                 committed(output) == reference and fell_back, detail)


def reference_run(workload: str, runtime: str, base: dict[str, Any], work: Path) -> tuple[list[Any], float]:
    """The failure-free run's committed output and its *span*: seconds from its first committed
    epoch to its end (the time a job runs, without the driver's and Spark's start-up, within
    which a kill must land)."""
    work.mkdir(parents=True)
    spec = {**base, "workload": workload, "runtime": runtime, "output": str(work / "out"),
            "checkpoint": None, "resume": False, "summary": str(work / "summary.json")}
    spec["events"] = EVENTS.get(workload, base["events"])
    driver = launch(spec)
    first = None
    while driver.poll() is None:
        if first is None and epochs_committed(work / "out") > 0:
            first = time.monotonic()
        time.sleep(0.005)
    if driver.wait(timeout=900) != 0:
        raise SystemExit(f"the failure-free {workload} run on {runtime} failed; see {work}")
    end = time.monotonic()
    return committed(work / "out"), end - (end if first is None else first)


NOT_FIRED = ("the job ended before the fault", "the crash point was not reached")
"""How a trial whose fault never fired ends its ``detail``."""


def report(trials: list[Trial], args: argparse.Namespace, seconds: float) -> str:
    lines = ["# Kill and corruption trials", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC.  Machine: {platform.platform()}, "
             f"`os.cpu_count()` = {os.cpu_count()} (shared).  {len(trials)} trials in "
             f"{seconds / 60:.1f} min; checkpoints every {args.interval} s; NEXMark "
             f"{args.events:,} events.  What each fault is and how a trial is judged: the "
             "docstring of `benchmarks/kill_trials.py`.", "",
             "Regenerate: `.venv/bin/python benchmarks/kill_trials.py`", ""]
    ok = sum(t.identical for t in trials)
    fired = [t for t in trials if not t.detail.startswith(NOT_FIRED)]
    lines += [f"**{ok} of {len(trials)} trials produced output identical to the failure-free run; "
              f"the fault fired in {len(fired)} of them, {sum(t.identical for t in fired)} of "
              f"which identical** (a trial whose fault never fired tests nothing).", ""]
    lines += ["## By fault and runtime", "", "| fault | runtime | trials | fault fired | identical | "
              "recovered in (s, median / max) |", "|---|---|---:|---:|---:|---|"]
    groups: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.fault, t.runtime), []).append(t)
    for (fault, runtime), group in sorted(groups.items()):
        times = [t.recovered_in for t in group if t.recovered_in is not None]
        rec = f"{np.median(times):.2f} / {max(times):.2f}" if times else "-"
        went = sum(not t.detail.startswith(NOT_FIRED) for t in group)
        lines.append(f"| {fault} | {runtime} | {len(group)} | {went} | "
                     f"{sum(t.identical for t in group)} | {rec} |")
    lines += ["", "*recovered in*: from the SIGKILL to the next epoch committed by the sink "
              "(worker and driver kills; a driver kill includes starting a new driver).", "",
              "## Every trial", "", "| # | workload | runtime | fault | at (s) | failures seen | "
              "identical | note |", "|---:|---|---|---|---:|---:|---|---|"]
    for i, t in enumerate(trials):
        at = "-" if t.fault_at is None or t.fault_at != t.fault_at else f"{t.fault_at:.2f}"
        lines.append(f"| {i} | {t.workload} | {t.runtime} | {t.fault} | {at} | "
                     f"{'-' if t.failures is None else t.failures} | {'yes' if t.identical else '**no**'} | "
                     f"{t.detail} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--corruptions", type=int, default=20)
    parser.add_argument("--runtimes", default="process,spark")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--pace", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated subset of {', '.join(FAULTS)}")
    parser.add_argument("--output", default=str(RESULTS / "kill_trials.md"))
    parser.add_argument("--child")
    parser.add_argument("--from-log", help="write the report from the printed lines of an "
                                           "interrupted run (its stdout) instead of running trials")
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.from_log:
        text = Path(args.from_log).read_text()
        trials = [eval(line.split(": ", 1)[1], {"Trial": Trial, "nan": float("nan")})  # noqa: S307
                  for line in text.splitlines() if line.startswith(("trial ", "corruption "))]
        report_text = report(trials, args, float("nan")).replace(
            "trials in nan min", "trials (an interrupted run, reported from its log)")
        Path(args.output).write_text(report_text)
        print(report_text)
        return
    if args.quick:
        args.trials, args.corruptions = 8, 4
    rng = random.Random(args.seed)
    runtimes = args.runtimes.split(",")
    faults = args.faults.split(",")
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    base = {"events": args.events, "interval": args.interval, "pace": args.pace}
    work = Path(tempfile.mkdtemp(prefix="tokenflow-trials-"))
    began = time.monotonic()
    references: dict[tuple[str, str], tuple[list[Any], float]] = {}
    for runtime in runtimes:
        for workload in WORKLOADS:
            references[workload, runtime] = reference_run(workload, runtime, base,
                                                          work / f"ref-{workload}-{runtime}")
            rows, span = references[workload, runtime]
            print(f"reference {workload} on {runtime}: {len(rows):,} rows, {span:.1f} s from "
                  "the first committed epoch to the end", flush=True)
    trials: list[Trial] = []
    for i in range(args.trials):
        workload = WORKLOADS[i % len(WORKLOADS)]
        runtime = runtimes[(i // len(WORKLOADS)) % len(runtimes)]
        fault = faults[(i // (len(WORKLOADS) * len(runtimes))) % len(faults)]
        reference, span = references[workload, runtime]
        for attempt in range(ATTEMPTS):
            trial = run_trial(workload, runtime, fault, base, reference, span, rng,
                              work / f"trial-{i}-{attempt}")
            if trial.fault_at is not None or not trial.identical:
                break  # the fault fired (or something failed): the trial counts
        trials.append(trial)
        print(f"trial {i}: {trial}", flush=True)
    for i in range(args.corruptions):
        workload = WORKLOADS[i % len(WORKLOADS)]
        runtime = runtimes[(i // len(WORKLOADS)) % len(runtimes)]
        how = CORRUPTIONS[i % len(CORRUPTIONS)]
        trial = corruption_trial(workload, runtime, how, base, references[workload, runtime][0],
                                 work / f"corrupt-{i}")
        trials.append(trial)
        print(f"corruption {i}: {trial}", flush=True)
    text = report(trials, args, time.monotonic() - began)
    RESULTS.mkdir(exist_ok=True)
    Path(args.output).write_text(text)
    print(text)
    if all(t.identical for t in trials):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory kept for inspection: {work}")


if __name__ == "__main__":
    main()
