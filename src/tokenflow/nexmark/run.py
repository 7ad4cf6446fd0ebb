"""Run a NEXMark query as a tokenflow job, measure it, and compute its Spark SQL reference.

Source: docs/NEXMARK.md (generator, queries, the published events/s anchors);
``tokenflow.nexmark.queries`` (the query modules).

``run_query`` reads the events through the replayable NEXMark source
(``tokenflow.io.sources.nexmark_streams``: ``SPLITS`` W-independent splits of the event stream,
each worker generating its splits' events itself, so generation is part of the measured time, as
in the published anchors) or, with ``input``, through table sources over the files.  Epoch ``t``
(a multiple of ``granularity_ms``, ms since the Unix epoch) holds the events with
``t <= dateTime < t + granularity_ms``, at logical time ``t``.

Per epoch ``t`` every worker records the wall time (``time.time()``, s) when its sources' tokens
have passed ``t`` (all its input of the epoch is sent) and when a probe on the query output first
shows the output frontier past ``t`` (no more output at times ``<= t`` can appear).  The epoch's
latency is ``max over workers(passed) - max over workers(sent)``, in ms.  A worker keeps at most
``lag`` of its epochs in flight (sent but not passed) by limiting its sources
(``SourceHandle.limit``), so under full load an epoch's latency includes waiting behind up to
``lag - 1`` others; without ``pace`` the limit is raised in halves of ``lag``
(``closed_loop_limit``).  For a windowed query, whose rows carry their window's end time, an epoch
passes as soon as no output at or before it can appear, which is before the window holding it
closes.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tokenflow.nexmark.generator import KINDS, GeneratorConfig, write_parquet
from tokenflow.nexmark.queries import load, reads_extra
from tokenflow.rescale.megaphone import DataEndedError
from tokenflow.worker import PARK_CAP

SPLITS = 16
"""Splits of the NEXMark source (W-independent units of the event stream, see
``tokenflow.io.sources.nexmark_splits``): a job can be restored at up to this many workers
without idle ones."""


@dataclass
class QueryResult:
    """What ``run_query`` measured.

    Attributes:
        query: the query name (``q0`` ...).
        events: events generated (all kinds, all workers).
        workers, runtime: how the job ran.
        rows: the query output (columns ``COLUMNS`` of the query), sorted by all columns.
        seconds: job seconds: from the first worker starting to send input to the last
            worker seeing its output frontier empty (wall clock; excludes starting processes
            or Spark tasks and building the dataflow).
        events_per_second: ``events / seconds``.
        latency_p50_ms, latency_p99_ms: percentiles of the per-epoch latencies (NaN without
            epochs).
        latencies_ms: per epoch (in time order), ms from the epoch's input fully sent to the
            output frontier passing it.
        epoch_times: the epochs' logical times (ms since the Unix epoch).
        granularity_ms: the epoch length in ms of event time.
        output: the Parquet dataset directory, when one was written.
        checkpoints: with ``checkpoint=``, what each checkpoint cost
            (``tokenflow.control.SnapshotStats``), in order.
        failures: with ``checkpoint=``, worker failures the job recovered from (the other
            measurements are then those of the last attempt).
        rescales: with ``rescale_schedule`` or a ``ScaleCoordinator``, the rescales the driver
            asked for (``tokenflow.rescale.remote.RescaleEvent``), in order.
        migrations: with ``elastic``, what each table change moved
            (``tokenflow.rescale.report.ChangeReport``, bytes only with ``measure``).
        sent_at: per epoch (as ``epoch_times``), the wall time (``time.time()``, s) when the
            last of the source workers had sent it; ``sent_at[i] + latencies_ms[i] / 1000`` is
            when the output passed it.
        started: the wall time the first source worker began sending (s).
        worker_cpu_s: CPU seconds (user + system, all threads: ``time.process_time``) the
            processes of the workers with sources spent in the job function, summed (the last
            attempt's; the thread runtime's workers share one process, each counting it all).
        read: per worker slot, per source split, the offset ranges ``[first, end)`` its
            sources emitted (merged; from ``SourceHandle.epochs``, the last
            ``DEFAULT_HISTORY`` epochs): with ``move_sources``, which worker read what.
    """

    query: str
    events: int
    workers: int
    runtime: str
    rows: pd.DataFrame
    seconds: float
    events_per_second: float
    latency_p50_ms: float
    latency_p99_ms: float
    latencies_ms: list[float] = field(default_factory=list)
    epoch_times: list[int] = field(default_factory=list)
    granularity_ms: int = 1000
    output: str | None = None
    checkpoints: list[Any] = field(default_factory=list)
    failures: int = 0
    rescales: list[Any] = field(default_factory=list)
    migrations: list[Any] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    started: float = float("nan")
    worker_cpu_s: float = float("nan")
    read: dict[int, dict[str, list[tuple[int, int]]]] = field(default_factory=dict)


def epoch_plan(events: int, config: GeneratorConfig, granularity_ms: int) -> list[tuple[int, int, int]]:
    """``(t, first, end)`` for every non-empty epoch: the events ``[first, end)`` have
    ``t <= dateTime < t + granularity_ms``; ``t`` is a multiple of ``granularity_ms``.

    Raises:
        ValueError: for ``events < 0`` or ``granularity_ms <= 0``.
    """
    if events < 0:
        raise ValueError(f"events must be >= 0, got {events}")
    if granularity_ms <= 0:
        raise ValueError(f"granularity_ms must be > 0, got {granularity_ms}")
    if events == 0:
        return []
    delay_us = config.inter_event_delay_us
    base = config.base_time_ms

    def first_at(t: int) -> int:  # the least n with timestamp(n) >= t
        if t <= base:
            return 0
        return min(events, -(-(t - base) * 1000 // delay_us))

    first_time = int(config.timestamp(0))
    last_time = int(config.timestamp(events - 1))
    plan = []
    for t in range(first_time - first_time % granularity_ms, last_time + 1, granularity_ms):
        lo, hi = first_at(t), first_at(t + granularity_ms)
        if hi > lo:
            plan.append((t, lo, hi))
    return plan


def file_plan(tables: dict[str, pa.Table], granularity_ms: int) -> list[tuple[int, int, int]]:
    """``(t, 0, 0)`` for every epoch ``t`` (a multiple of ``granularity_ms``) holding an event of
    ``tables`` (``dateTime`` columns, ms), in time order."""
    if granularity_ms <= 0:
        raise ValueError(f"granularity_ms must be > 0, got {granularity_ms}")
    times = [t.column("dateTime").to_numpy() for t in tables.values() if t.num_rows]
    if not times:
        return []
    epochs = np.unique(np.concatenate(times) // granularity_ms * granularity_ms)
    return [(int(t), 0, 0) for t in epochs]


def closed_loop_limit(passed: int, sent: int, lag: int) -> int:
    """How many epochs of the plan a worker's sources may have sent, in closed loop.

    ``passed`` of its epochs have passed the probe and ``sent`` have been sent (``passed <=
    sent``; a restored source can start with more than ``lag`` in flight).  At most ``lag``
    epochs are released beyond ``passed``, and the sources are refilled in halves: nothing
    more is released while fewer than ``max(1, lag // 2)`` could be, then the window is filled
    up to ``passed + lag`` at once, so a source activation generates that many epochs
    together.  Returns an index into the plan's epochs (``>= sent``).

    Refilling one epoch as each one passed (what this replaced) let the epochs' grouping
    depend on history: q8 at full load settled into two-epoch activations that finished
    together (epoch p99 about 20 ms), and after any disturbance, such as a checkpoint's stop
    at its epoch, into a mixture of one- and two-epoch activations for the rest of the run
    (p99 about 26 ms; ``docs/ARCHITECTURE.md``, "Aligned checkpoints").

    Raises:
        ValueError: ``lag < 1``.
    """
    if lag < 1:
        raise ValueError(f"lag must be >= 1 epoch, got {lag}")
    if passed + lag - sent < max(1, lag // 2):
        return sent
    return passed + lag


def run_query(name: str, events: int, rate: int = 10_000, workers: int = 2, runtime: str = "thread",
              master: str | None = None, output: str | os.PathLike[str] | None = None,
              granularity_ms: int = 1000, lag: int = 4,
              report_to: tuple[str, int, str] | None = None,
              input: str | os.PathLike[str] | None = None, routing: str = "bins",
              checkpoint: str | os.PathLike[str] | None = None, checkpoint_interval: float = 1.0,
              resume: bool = False, publish: str | None = None,
              catalog: tuple[str, int, str] | None = None, subscribers: int = 0,
              elastic: bool = False, roster: int | None = None,
              rescale_schedule: Sequence[tuple[float, int]] = (),
              rescale_at: Sequence[tuple[int, int]] = (), strategy: str = "batched",
              measure: bool = False, bins: int | None = None, coordinator: Any = None,
              generator: GeneratorConfig | None = None,
              on_rescale: Callable[[Any], None] | None = None,
              max_workers: int | None = None, pace: float | None = None,
              move_sources: bool = False) -> QueryResult:
    """Run NEXMark query ``name`` over events ``[0, events)`` generated at ``rate`` events/s, or
    over the events in the Parquet datasets under ``input``.

    Args:
        name: a query of ``tokenflow.nexmark.queries.QUERIES``.
        events: number of events (all kinds; person:auction:bid = 1:3:46).
        rate: events per second of event time (``GeneratorConfig.rate``); the job runs as fast
            as it can, the rate only spaces the events' ``dateTime``.
        workers: number of workers.
        runtime: ``thread``, ``process`` or ``spark``.
        master: Spark master URL (``spark`` only; default ``local[workers]``).
        output: a directory; when given, the workers write the output as a committed Parquet
            dataset ``output/epoch=<t>/part-<k>.parquet`` (``tokenflow.io.to_parquet``;
            ``epoch`` is the logical time of the rows rounded down to a multiple of
            ``granularity_ms``, ms); each epoch replaces the same epoch of an earlier run whole,
            and epochs this run did not write are removed when it ends; read it with
            ``tokenflow.io.read_committed``.
        granularity_ms: epoch length in ms of event time (the input's logical times are
            ``dateTime`` rounded down to a multiple of it).
        lag: epochs a worker may have in flight (>= 1); without ``pace`` its sources are
            refilled in halves of it (``closed_loop_limit``).
        report_to: a coordinator endpoint for live progress (``tokenflow.coordinator``);
            with ``checkpoint`` on ``process`` or ``spark`` pass that ``Coordinator`` as
            ``coordinator`` too (the checkpoints' commands go through it).
        input: a directory with ``person``, ``auction`` and ``bid`` Parquet datasets (as
            ``tokenflow nexmark generate`` writes them); ``events`` and ``rate`` are then
            ignored.  The driver reads and checks it first (``tokenflow.nexmark.files``); each
            worker reads it again and streams its splits of each kind (``table_splits``), so on
            a cluster it must be a path all workers can read.
        routing: ``"bins"`` (keyed exchanges through the job's routing table, the default) or
            ``"direct"`` (a key's hash picks the worker directly, without bins: only for
            measuring what the routing table costs).
        checkpoint: a directory; when given, the job takes a checkpoint every
            ``checkpoint_interval`` seconds there and restarts from the latest one when a
            worker fails (``tokenflow.recovery.CheckpointedJob``; with ``output``, the
            committed dataset is the same as a failure-free run's).
        resume: continue the job from the latest checkpoint under ``checkpoint`` (after the
            driver died); without it that directory must hold no checkpoint.
        publish: a topic: the query output is published under it (``tokenflow.pubsub``; one
            partition per worker, columns ``COLUMNS``, epochs of ``granularity_ms``) in the
            catalog ``catalog`` (``(host, port, token)``, e.g. ``Catalog().endpoint``); with
            ``subscribers``, the publishers stay open (up to 120 s) after the query ends
            until that many subscribers have joined and received everything.
        elastic: build the query's stateful operators as migrating operators
            (``tokenflow.rescale.migrate``: their bins move between workers at logical times
            while the job runs; ``ELASTIC`` queries only: q4, q5, q8).  Implied by the rescale
            options below.  The worker processes stay ``workers``; the *roster* (the workers
            owning bins) changes.
        roster: start with the bins spread over workers ``0..roster-1`` (default all).
        rescale_schedule: ``[(seconds after the start, n)]``: the driver spreads the state
            over workers ``0..n-1`` at those times (``JobHandle.rescale`` through the
            control plane; the job runs under it, ``tokenflow.job.start``).
        rescale_at: ``[(k, n)]``: worker 0 spreads the state over workers ``0..n-1`` once its
            sources have sent epoch ``k`` (an index into the job's epochs): at a logical
            point of the input, for tests.  A point reached only as the data ends has no
            time left to move bins at: a ``RuntimeWarning`` says it was not carried out.
        strategy: the migration strategy (``batched``, ``fluid``, ``all-at-once``).
        measure: every worker records its state bytes at every step (``migrations`` then
            carry ``total_bytes``; costs one export of the state per step and worker).
        bins: bins of the migrating operators' routing table (a power of two; default
            4,096): fewer make ``fluid`` (one bin per step) take fewer steps.
        generator: the generator's parameters (default ``GeneratorConfig(rate=rate)``; when
            given, ``rate`` is ignored), e.g. more ``num_in_flight_auctions`` for a larger Q4
            state.
        coordinator: the driver's ``Coordinator`` when the job runs under the control plane
            (default: ``start`` makes one); a ``tokenflow.rescale.remote.ScaleCoordinator``
            also brings requests from ``tokenflow scale``.
        on_rescale: called with each ``RescaleEvent`` (from the driver's rescale thread).
        max_workers: worker slots, more than ``workers``: the job starts ``workers`` worker
            processes (or Spark tasks) and the rescales start and stop others, which join the
            running job and leave it (``tokenflow.membership``) instead of changing the roster
            among the ``workers`` it started with; the sources stay on the first ``workers``.
        pace: offered load in events per wall-clock second (open loop): each source worker
            sends the first epoch at once and epoch ``(t, first, end)`` of ``epoch_plan`` no
            earlier than ``first / pace`` seconds after the first epoch passed its probe,
            parking in between; ``lag`` still bounds the epochs in flight (raise it to keep the
            load open-loop).  The first epoch passing is one moment for all workers (within a
            progress message), so they offer each epoch together, as input arriving on a
            schedule would; paced from each worker's own start, workers that started some ms
            apart offered every epoch that far apart, and an epoch's latency then depended on
            how that offset fell against the others' work.  Default None: as fast as ``lag``
            allows.  Generated events only (not with ``input``).
        move_sources: with ``max_workers``, a joining worker also reads a share of the
            source's remaining splits from a logical time on and a leaving one hands its
            share away (``JobHandle.move_sources``, ``tokenflow.resplit``); without, the
            sources stay on the first ``workers``.

    Returns:
        A ``QueryResult`` (rows, events/s, per-epoch latency percentiles, job seconds).

    Raises:
        ValueError: an unknown query or runtime, ``events < 0``, ``workers < 1``,
            ``granularity_ms <= 0``, ``lag < 1``, ``rate <= 0``, ``master`` without spark,
            ``publish`` without ``catalog``, ``elastic`` for a query without migrating
            state, ``max_workers`` with ``checkpoint``, a roster outside ``1..workers``, an unknown
            strategy, or ``pace <= 0`` or with ``input``.
        InputError: ``input`` is missing, not Parquet, lacks a column or has a null
            ``dateTime`` (naming the path, column and row).
        WorkerError: a worker failed.
    """
    from tokenflow.execute import execute
    from tokenflow.nexmark.files import read_events

    module = load(name)
    if lag < 1:
        raise ValueError(f"lag must be >= 1 epoch, got {lag}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if master is not None and runtime != "spark":
        raise ValueError("master applies to runtime 'spark' only")
    if routing not in ("bins", "direct"):
        raise ValueError(f"routing must be 'bins' or 'direct', got {routing!r}")
    if publish is not None and catalog is None:
        raise ValueError(f"publishing {name} as {publish!r} needs a catalog (catalog=Catalog().endpoint)")
    if pace is not None and (pace <= 0 or input is not None):
        raise ValueError(f"pace must be > 0 events/s over generated events, got {pace!r}"
                         + (" with input" if input is not None else ""))
    elastic = elastic or bool(rescale_schedule) or bool(rescale_at) or roster is not None
    initial = None
    if elastic:
        from tokenflow.rescale import STRATEGIES
        from tokenflow.state.bins import DEFAULT_BINS, RoutingTable

        if not getattr(module, "ELASTIC", False):
            raise ValueError(f"{name} has no migrating state (elastic queries: q4, q5, q8)")
        if checkpoint is not None and max_workers is not None and max_workers > workers:
            raise ValueError("workers joining and leaving (max_workers) are not checkpointed: "
                             "run without checkpoint, or rescale among the started workers")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown migration strategy {strategy!r}; choose one of "
                             f"{', '.join(STRATEGIES)}")
        slots = max_workers or workers
        if slots < workers or (max_workers is not None and (roster is not None or rescale_at)):
            raise ValueError("max_workers must be >= workers, without roster or rescale_at")
        for n in [roster or workers, *(n for _, n in rescale_schedule), *(n for _, n in rescale_at)]:
            if not 1 <= n <= slots:
                raise ValueError(f"a roster of {n} workers: the job has {slots} worker "
                                 f"{'slots' if max_workers else 'processes'}")
        initial = RoutingTable(RoutingTable.even(roster or workers, bins or DEFAULT_BINS).owners,
                               range(slots))
    config = generator if generator is not None else GeneratorConfig(rate=rate)
    source = None
    if input is not None:
        source = os.path.abspath(os.fspath(input))
        tables = read_events(source, extra=reads_extra(module))
        events = sum(t.num_rows for t in tables.values())
        plan = file_plan(tables, granularity_ms)
        del tables
    else:
        plan = epoch_plan(events, config, granularity_ms)
    columns = list(module.COLUMNS)
    directory = None
    if output is not None:
        directory = os.path.abspath(os.fspath(output))
        os.makedirs(directory, exist_ok=True)

    epoch_list = [t for t, _, _ in plan]
    offsets = [first / pace for _, first, _ in plan] if pace is not None else None
    """Seconds after the first epoch passed before which a worker does not send each later
    epoch (``pace``)."""

    def job(worker: Any) -> dict[str, Any]:
        from tokenflow.io.parquet import to_parquet
        from tokenflow.io.sources import nexmark_streams, replayable_source, table_splits
        from tokenflow.nexmark.queries import load as load_query
        from tokenflow.spark.io import collect

        cpu = time.process_time()
        query = load_query(name)
        if routing == "direct":
            worker.routing = None
        scaling = None
        if elastic:
            from tokenflow.rescale.migrate import Elastic

            scaling = Elastic(initial=initial, measure=measure)

        def build(scope: Any) -> Any:
            if source is None:  # without the ``extra`` padding unless the query reads it
                streams, handle = nexmark_streams(scope, events, config, splits=SPLITS,
                                                  granularity=granularity_ms,
                                                  extra=reads_extra(query))
                handles = [handle]
            else:  # every worker reads the files and takes its splits of each kind
                tables = read_events(source, extra=reads_extra(query))
                streams, handles = {}, []
                for kind in KINDS:
                    streams[kind], handle = replayable_source(
                        scope, f"Nexmark.{kind}", table_splits(tables[kind], SPLITS, time="dateTime"),
                        "dateTime", granularity=granularity_ms)
                    handles.append(handle)
            out = query.build(streams, config) if scaling is None else \
                query.build(streams, config, elastic=scaling)
            if directory is not None:
                to_parquet(out, directory, columns=columns, name=f"{name}.Parquet",
                           granularity=granularity_ms, partition="epoch")
            if publish is not None:
                out.publish(publish, columns=columns, expect=subscribers,
                            linger=120.0 if subscribers else 5.0)
            return handles, out.probe(f"{name}.Probe"), collect(out, f"{name}.Collect")

        handles, probe, captured = worker.dataflow(build, name=f"nexmark-{name}")
        sent: dict[int, float] = {}
        passed: dict[int, float] = {}
        done_sending = done_passing = 0  # epochs of ``epoch_list`` sent / passed so far

        triggers = sorted(rescale_at) if worker.index == 0 else []
        start = time.time()
        due = 1  # with ``pace``: epochs of ``epoch_list`` whose time to be sent has come
        paced_from: float | None = None  # with ``pace``: when the first epoch passed
        while True:
            frontiers = [h.frontier for h in handles if h.frontier is not None]
            least = min(frontiers) if frontiers else None
            now = time.time()
            while done_sending < len(epoch_list) and (least is None or epoch_list[done_sending] < least):
                sent[epoch_list[done_sending]] = now
                done_sending += 1
            while triggers and triggers[0][0] <= done_sending and scaling is not None:
                point, n = triggers.pop(0)
                for h in scaling.handles:
                    try:
                        h.controller.rescale_roster(list(range(n)), strategy)
                    except DataEndedError as exc:  # the point came with the end of the data
                        warnings.warn(f"rescale_at ({point}, {n}) not carried out: {exc}",
                                      RuntimeWarning, stacklevel=1)
            while done_passing < done_sending and not probe.less_equal(epoch_list[done_passing]):
                passed[epoch_list[done_passing]] = now
                done_passing += 1
            if probe.done() or worker.stopped or worker.left:  # done, stopped, or it left
                break
            park = PARK_CAP  # progress (a message) wakes the worker before
            if offsets is None:  # closed loop: refilled in halves of ``lag``
                ahead = closed_loop_limit(done_passing, done_sending, lag)
            else:  # at most ``lag`` of this worker's epochs in flight: sent but not passed
                ahead = done_passing + lag
                if paced_from is None and done_passing:
                    paced_from = passed[epoch_list[0]]
                while paced_from is not None and due < len(offsets) \
                        and paced_from + offsets[due] <= now:
                    due += 1
                ahead = min(ahead, due)
                if paced_from is not None and due < len(offsets):
                    # park no longer than until the next epoch is due
                    park = max(0.0, min(park, paced_from + offsets[due] - time.time()))
            limit = epoch_list[ahead] if ahead < len(epoch_list) else None
            for h in handles:
                h.limit(limit)
            worker.step_or_park(park)
        if triggers and scaling is not None and not (worker.stopped or worker.left):
            warnings.warn(f"rescale_at points {triggers} not carried out: the job has "
                          f"{len(epoch_list)} epochs", RuntimeWarning, stacklevel=1)
        finish = time.time()
        for h in handles:  # a query that reads only some kinds is done before the others
            h.limit(None)
        for t in epoch_list[done_sending:]:
            sent.setdefault(t, finish)
        for t in epoch_list[done_passing:]:
            passed.setdefault(t, finish)
        batches = [b for _, b in captured.events]
        table = None
        if batches:
            try:
                table = pa.Table.from_batches(batches).combine_chunks()
            except pa.ArrowInvalid:  # batches with slightly different schemas
                table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                                         promote_options="permissive").combine_chunks()
        moved = None
        if scaling is not None:
            from tokenflow.rescale.report import collect as collect_moves

            moved = collect_moves(scaling.handles)
        read: dict[str, list[tuple[int, int]]] = {}
        for h in handles:
            for ranges in h.epochs.values():
                for split, (first, end) in ranges.items():
                    read.setdefault(split, []).append((first, end))
        return {"table": table, "sent": sent, "passed": passed, "start": start, "end": finish,
                "cpu": time.process_time() - cpu,
                "moved": moved, "read": {k: _merged(v) for k, v in read.items()}}

    options: dict[str, Any] = {}
    if runtime == "spark":
        options["master"] = master
    if report_to is not None:
        options["report_to"] = report_to
    if catalog is not None:
        options["catalog"] = catalog
    checkpoints: list[Any] = []
    failures = 0
    rescales: list[Any] = []
    if max_workers is not None and max_workers > workers:
        options["slots"] = max_workers
    if checkpoint is None and (rescale_schedule or coordinator is not None):
        from tokenflow.job import start
        from tokenflow.rescale.remote import ScaleDriver

        handle = start(job, workers, runtime, name=f"nexmark.{name}", coordinator=coordinator,
                       **options)
        handle.move_sources = move_sources
        driver = ScaleDriver(handle, rescale_schedule, strategy, coordinator, on_rescale).start()
        try:
            results = handle.result()
        finally:
            driver.stop()
        rescales = driver.events
    elif checkpoint is None:
        results = execute(job, workers=workers, runtime=runtime, **options)
    else:
        from tokenflow.recovery import CheckpointedJob

        if coordinator is not None:
            options["coordinator"] = coordinator  # the one the workers report to
        runner = CheckpointedJob(job, workers, runtime, checkpoint=checkpoint,
                                 interval=checkpoint_interval, name=f"nexmark.{name}",
                                 restore=resume, rescale_schedule=rescale_schedule,
                                 strategy=strategy, **options)
        results = runner.run()
        checkpoints, failures, rescales = runner.stats, runner.failures, runner.rescales

    read = {w: r["read"] for w, r in enumerate(results) if r is not None}
    joined = [r for r in results[workers:] if r is not None]  # workers that joined later
    results = results[:workers]  # the workers with the sources: their epochs' times count
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    epoch_times = [t for t, _, _ in plan]
    sent_at = [max(r["sent"][t] for r in results) for t in epoch_times]
    latencies = [1000.0 * (max(r["passed"][t] for r in results) - s)
                 for t, s in zip(epoch_times, sent_at, strict=True)]
    started = min(r["start"] for r in results)
    worker_cpu = sum(r["cpu"] for r in results)
    results = results + joined
    outputs = [r["table"] for r in results if r["table"] is not None]
    rows = _frame(outputs, columns)
    p50, p99 = (float(np.percentile(latencies, q)) for q in (50, 99)) if latencies else (np.nan, np.nan)
    migrations: list[Any] = []
    if elastic and initial is not None and not failures and not resume:  # (restored: no start)
        from tokenflow.rescale.report import summarize

        migrations = summarize([r["moved"] or {} for r in results], initial)
    return QueryResult(
        query=name, events=events, workers=workers, runtime=runtime, rows=rows, seconds=seconds,
        events_per_second=events / seconds if seconds > 0 else float("inf"),
        latency_p50_ms=p50, latency_p99_ms=p99, latencies_ms=latencies, epoch_times=epoch_times,
        granularity_ms=granularity_ms, output=directory, checkpoints=checkpoints, failures=failures,
        rescales=rescales, migrations=migrations, sent_at=sent_at, started=started,
        worker_cpu_s=worker_cpu, read=read)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, adjacent ones joined (overlapping ones are kept apart)."""
    out: list[tuple[int, int]] = []
    for first, end in sorted(ranges):
        if out and out[-1][1] == first:
            out[-1] = (out[-1][0], end)
        else:
            out.append((first, end))
    return out


def _frame(tables: list[pa.Table], columns: list[str]) -> pd.DataFrame:
    """The rows of ``tables`` as one DataFrame with ``columns``, sorted by all of them."""
    if not tables:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    table = table.select(columns)
    return table.sort_by([(c, "ascending") for c in columns]).to_pandas()


def spark_reference(name: str, events: int, rate: int = 10_000, master: str | None = None) -> pd.DataFrame:
    """The query's ``SPARK_SQL`` result over the same events (the independent engine).

    Writes events ``[0, events)`` (``GeneratorConfig(rate=rate)``) as Parquet into a temporary
    directory (``write_parquet``), registers the temp views ``person``, ``auction`` and
    ``bid`` on the process's Spark session (``tokenflow.spark.session.get_session(master)``:
    the running session, else a new one, default ``local[2]``), runs ``SPARK_SQL`` and returns
    its rows sorted by all columns.  The views are dropped afterwards.

    Raises:
        ValueError: an unknown query.
    """
    from tokenflow.spark.session import get_session

    module = load(name)
    spark = get_session(master)
    columns = list(module.COLUMNS)
    with tempfile.TemporaryDirectory(prefix="nexmark-") as root:
        write_parquet(root, events, rate=rate)
        try:
            for kind in KINDS:
                spark.read.parquet(os.path.join(root, kind)).createOrReplaceTempView(kind)
            frame = spark.sql(module.SPARK_SQL).toPandas()
        finally:
            for kind in KINDS:
                spark.catalog.dropTempView(kind)
    if list(frame.columns) != columns:
        raise ValueError(f"{name}: SPARK_SQL returned columns {list(frame.columns)}, expected {columns}")
    return frame.sort_values(columns, kind="stable").reset_index(drop=True)


__all__ = ["QueryResult", "closed_loop_limit", "epoch_plan", "file_plan", "run_query",
           "spark_reference"]
