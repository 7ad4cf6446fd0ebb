"""Live rescaling benchmark (issue 16): epoch latency of a running word count while its state
moves between workers (``tokenflow.rescale.megaphone_fold``), per migration strategy.

Writes ``benchmarks/results/rescale.md`` and ``benchmarks/results/rescale.png`` (and prints the
report).

Workload: a running word count written as the README shows it, ``megaphone_fold(words.map(lambda
w: (w, 1)), fold)`` emitting ``(word, running count)`` per word, on the ``process`` runtime with 4
worker processes.  The routing table starts as ``RoutingTable(RoutingTable.even(2, bins).owners,
range(4))`` (workers 2 and 3 own no bin), and the driver calls ``JobHandle.rescale(3)``,
``rescale(4)``, ``rescale(3)``, ``rescale(2)`` at fixed seconds after the first epoch (roster
2 -> 3 -> 4 -> 3 -> 2), with one strategy per run: all-at-once, fluid, batched.  Words: a Zipf(1.0)
law over 10,000 made-up words (numpy, fixed seed); every one of the 4 workers sends its quarter
of each epoch (one list batch), epoch ``e`` at logical time ``e + 1``, open loop on a wall-clock
grid shared by the workers (epoch ``e`` due at ``origin + e / rate``, whether or not earlier
epochs are done).

The rate is half of the maximum throughput, measured first in the same run: the same job without
rescaling, closed loop (each worker sends its next epoch as soon as the output has passed the
epoch 4 before it), with the 2-worker table and then the 4-worker one; epochs of ``S`` words
with ``S`` chosen so that the maximum is about twice the open-loop epoch rate (one calibration
run, then the measured runs); the lower of the two maxima counts.  The open-loop epochs have the
same ``S`` words at ``--rate`` epochs/s (``S`` rounded so that ``S * rate`` is half that maximum).

Per epoch and per worker: ``sent`` (``time.time()`` just before the worker's batch is handed to
the input) and ``done`` (``time.time()`` after the first step after which the worker's probe on
the output has passed the epoch).  An epoch's latency is the largest ``done - sent`` over the 4
workers.  A *migration window* runs from the driver's ``rescale`` request until the output has
passed the logical time of the change's last step (on every worker); an epoch is *during
migration* when its ``[first sent, last done]`` overlaps a window; *steady* epochs are the others,
after a warm-up.  Also measured: the largest gap between two consecutive completions on a worker
and the longest run of epoch periods (on the send grid) in which a worker saw no epoch complete;
the bins and bytes of each step (``handle.moved``, ``StepStats``, summed over the old owners);
how long each worker spent in each migration call (``take(bins)`` of a slice on the
old owner, ``load`` on the new one: wrapped with a timer inside the job) and its longest steps
(wall and thread CPU time); worker CPU time.

Besides the three measured runs (not with ``--quick``): two references without
rescaling at the same rate: ``megaphone_fold`` and ``state_machine`` (same fold, no migration
machinery, routed by the same 2-worker table given as the job's spec).

Every run's output is checked before any figure is printed: per word, the largest running count
emitted (on any worker) and the final state (the union of the workers' states, each word on
exactly one worker) equal a plain ``Counter`` over the same words, and as many records came out
as words went in.  The steps issued are checked against the tables ``RoutingTable.rebalanced``
gives (only bins whose owner changes move; scale-in moves exactly the leaving worker's bins).

Run: ``.venv/bin/python benchmarks/rescale.py`` (about 10 minutes) or ``--quick`` (about 1.5
minutes: 64 bins, 3 s between rescales, a shorter maximum-throughput measurement, no reference runs).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKERS = 4
ROSTERS = (3, 4, 3, 2)
"""``JobHandle.rescale(n)`` in this order (roster ``0..n-1``), starting from 2 workers."""
STRATEGIES = ("all-at-once", "fluid", "batched")
SEED = 16
VOCABULARY = 10_000
IN_FLIGHT = 4
"""Epochs in flight per worker in the closed-loop maximum-throughput runs."""
P99_RATIO_TARGET = 2.0
P99_TARGET_MS = 100.0
MAX_TARGET_MS = 250.0
LONG_STEP_MS = 40.0
"""Steps at least this long are matched against Python's full (generation 2) collections."""
BLOCK_TARGET_MS = 5.0
KEPT = "\n## Reading this run"
"""A hand-written section of ``rescale.md`` from this heading on is kept when the script rewrites
the file (update it after a new run)."""
MOVE_SLACK = 0.02
"""Scale-out W -> W+1 may move at most 1/(W+1) + 2 % of the bins per step."""


# -- the words -----------------------------------------------------------------------------------


def vocabulary() -> list[str]:
    """``VOCABULARY`` distinct made-up lower-case words of 2-12 letters (fixed seed)."""
    rng = np.random.default_rng(SEED)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        length = int(rng.integers(2, 13))
        words.setdefault(letters[rng.integers(0, 26, length)].tobytes().decode(), None)
    return list(words)


def zipf_cdf() -> np.ndarray:
    p = 1.0 / np.arange(1, VOCABULARY + 1)
    return np.cumsum(p / p.sum())


def share(cdf: np.ndarray, worker: int, epoch: int, words: int, salt: int = 0) -> np.ndarray:
    """Vocabulary indices of worker ``worker``'s share of epoch ``epoch`` (``words`` in all)."""
    n = words // WORKERS + (1 if worker < words % WORKERS else 0)
    rng = np.random.default_rng((SEED, salt, epoch, worker))
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), VOCABULARY - 1)


def expected_counts(words: int, epochs: int, salt: int) -> dict[str, int]:
    """The plain ``Counter`` of every word every worker sends in a run."""
    cdf, vocab = zipf_cdf(), vocabulary()
    counts: Counter[str] = Counter()
    for w in range(WORKERS):
        for e in range(epochs):
            counts.update(vocab[i] for i in share(cdf, w, e, words, salt).tolist())
    return dict(counts)


# -- the job ---------------------------------------------------------------------------------------


def make_job(cfg: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    """The worker function.  ``cfg``: ``mode`` (``open``: epoch ``e`` due at ``origin + e *
    period``; ``closed``: ``IN_FLIGHT`` epochs in flight), ``owners`` (initial table), ``words``
    per epoch, ``epochs``, ``origin``, ``period``, ``salt`` (varies the words between runs)."""

    def job(worker: Any) -> dict[str, Any]:
        from tokenflow.dataflow.operators.stateful import state_machine
        from tokenflow.dataflow.state import KeyedState
        from tokenflow.rescale import megaphone_fold
        from tokenflow.state.bins import RoutingTable

        cdf, vocab = zipf_cdf(), vocabulary()
        epochs = cfg["epochs"]
        batches = [[vocab[i] for i in share(cdf, worker.index, e, cfg["words"], cfg["salt"]).tolist()]
                   for e in range(epochs)]
        # The whole run's input, made up front, is millions of references in lists that
        # Python's cyclic GC traverses at every full (generation 2) collection, which a source
        # reading its input as it goes does not pay: move it out of the collector's reach
        # (the job's own objects are still collected).  The worker runtime also freezes what
        # exists after its first step (tokenflow.cluster.FreezeAtStart), this input included;
        # freezing here does not depend on that.  "gc_as_before": leave it to the runtime.
        if not cfg.get("gc_as_before"):
            gc.collect()
            gc.freeze()
        gcs: list[tuple[float, float, int]] = []  # (wall end, seconds, generation), gen >= 1
        gc_began = [0.0]

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                gc_began[0] = time.perf_counter()
            elif info["generation"] >= 1:
                gcs.append((time.time(), time.perf_counter() - gc_began[0], info["generation"]))

        gc.callbacks.append(on_gc)
        last: dict[str, int] = {}
        emitted = [0]

        def sink(_: Any, batch: list[tuple[str, int]]) -> None:
            last.update(batch)  # a word's counts rise with time on each worker
            emitted[0] += len(batch)

        table = RoutingTable(np.asarray(cfg["owners"]), range(worker.peers))
        plain = KeyedState() if cfg.get("operator") == "state_machine" else None

        def build(scope: Any) -> tuple[Any, Any, Any]:
            inp, stream = scope.new_input()
            pairs = stream.map(lambda w: (w, 1))
            fold = lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)])  # noqa: E731
            if plain is not None:  # the reference: no migration machinery, the job's table
                out = state_machine(pairs, fold, state=plain)
                return inp, None, out.inspect_batch(sink).probe()
            handle = megaphone_fold(pairs, fold, initial=table)
            return inp, handle, handle.stream.inspect_batch(sink).probe()

        inp, handle, probe = worker.dataflow(build)

        calls: list[tuple[str, float, float, int]] = []  # (kind, wall end, seconds, bins)
        state = handle.state if handle is not None else plain

        def timed(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
            def call(arg: Any) -> Any:
                t0 = time.perf_counter()
                result = method(arg)
                calls.append((kind, time.time(), time.perf_counter() - t0, len(arg)))
                return result
            return call

        if handle is not None:  # a step's state leaves its old owner in take(bins) slices
            handle.shared.take = timed("take", handle.shared.take)
        state.load = timed("load", state.load)  # type: ignore[method-assign]

        long_steps: list[tuple[float, float, float]] = []  # (wall end, s, CPU s), steps >= 2 ms
        counted = {"steps": 0, "parked": 0}

        def step(timeout: float) -> None:
            if worker.activations.is_empty():
                worker.allocator.park(timeout)
                counted["parked"] += 1
            t0, c0 = time.perf_counter(), time.thread_time()
            worker.step()
            dt = time.perf_counter() - t0
            counted["steps"] += 1
            if dt >= 0.002:
                long_steps.append((time.time(), dt, time.thread_time() - c0))

        inp.advance_to(1)  # the empty epoch 0: every worker has built its dataflow and words
        while probe.less_than(1):
            step(0.01)
        ready = time.time()
        sent = [0.0] * epochs
        done: list[float] = []

        def watch(_: Any) -> None:  # after every step: which epochs has the probe passed?
            now = time.time()
            while len(done) < epochs and not probe.less_than(len(done) + 2):
                done.append(now)

        worker.on_step.append(watch)
        cpu, wall = time.process_time(), time.time()
        for e in range(epochs):
            if cfg["mode"] == "open":
                due = cfg["origin"] + e * cfg["period"]
                while (now := time.time()) < due:
                    step(min(due - now, 0.01))
            else:
                while len(done) < e + 1 - IN_FLIGHT:
                    step(0.01)
            sent[e] = time.time()
            inp.send_batch(batches[e])
            inp.advance_to(e + 2)
        inp.close()
        while len(done) < epochs:
            step(0.01)
        cpu, wall = time.process_time() - cpu, time.time() - wall
        gc.callbacks.remove(on_gc)
        state_bytes = sum(t.nbytes for t in KeyedState.export(state).values())  # unwrapped
        return {"state_bytes": state_bytes, "ready": ready, "sent": sent, "done": done,
                "cpu": cpu, "wall": wall,
                "steps": counted["steps"], "parked": counted["parked"], "long_steps": long_steps,
                "gcs": gcs,
                "calls": calls, "last": last, "emitted": emitted[0],
                "state": dict(state.data),
                "moved": [(s.time, s.bins, s.bytes) for s in handle.moved] if handle else [],
                "issued": [(t, [(m.bin, m.old, m.new) for m in moves])
                           for t, moves in handle.controller.issued] if handle else []}

    return job


def run_job(cfg: dict[str, Any], schedule: list[tuple[float, int]] | None = None,
            strategy: str = "batched") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start the job on the process runtime, call ``rescale(n, strategy)`` at ``origin + at``
    for each ``(at, n)`` of ``schedule``; the per-worker results and the requests made."""
    from tokenflow.execute import ContentionWarning
    from tokenflow.job import JobSpec, job_name, start
    from tokenflow.state.bins import RoutingTable

    warnings.simplefilter("ignore", ContentionWarning)  # 4 workers on 2 cores: said in the report
    fn = make_job(cfg)
    # the job's own table: what state_machine routes by (megaphone_fold takes ``initial``)
    table = RoutingTable(np.asarray(cfg["owners"]), range(WORKERS))
    spec = JobSpec(job_name(fn), table.to_json(), control=True)
    handle = start(fn, workers=WORKERS, runtime="process", spec=spec)
    requests = []
    for at, n in schedule or []:
        delay = cfg["origin"] + at - time.time()
        if delay > 0:
            time.sleep(delay)
        asked = time.time()
        steps = handle.rescale(n, strategy)
        requests.append({"roster": n, "asked": asked, "acked": time.time(), "steps": steps})
    return handle.result(timeout=600), requests


def check_output(results: list[dict[str, Any]], cfg: dict[str, Any], label: str) -> None:
    """The output and the final state equal a plain ``Counter`` over the same words."""
    expected = expected_counts(cfg["words"], cfg["epochs"], cfg["salt"])
    emitted: dict[str, int] = {}
    for r in results:
        for word, count in r["last"].items():
            emitted[word] = max(emitted.get(word, 0), count)
    if emitted != expected:
        wrong = sorted(w for w in set(emitted) | set(expected) if emitted.get(w) != expected.get(w))
        raise AssertionError(f"{label}: final running counts differ from the Counter for "
                             f"{len(wrong)} words, e.g. {wrong[:5]}")
    if sum(r["emitted"] for r in results) != sum(expected.values()):
        raise AssertionError(f"{label}: {sum(r['emitted'] for r in results)} records out for "
                             f"{sum(expected.values())} words in")
    final: dict[str, int] = {}
    for r in results:
        if set(final) & set(r["state"]):
            raise AssertionError(f"{label}: a word's state is on two workers at the end")
        final.update(r["state"])
    if final != expected:
        raise AssertionError(f"{label}: the final state differs from the Counter")


# -- figures ---------------------------------------------------------------------------------------


def percentile(values: Any, q: float) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q)) if len(values) else float("nan")


def tables(bins: int) -> list[Any]:
    """The routing tables the driver's rescales lead to, in order (``rescale_roster``)."""
    from tokenflow.state.bins import RoutingTable

    out = [RoutingTable(RoutingTable.even(2, bins).owners, range(WORKERS))]
    for n in ROSTERS:
        out.append(out[-1].rebalanced(range(n)))
    return out


def migration_calls(r: dict[str, Any]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """A worker's ``(wall end, ms)`` of each step's ``take`` (export and forget the moving
    bins' state), and of each load."""
    exports, loads = [], []
    for kind, end, seconds, bins in r["calls"]:
        if kind == "take":
            if bins:  # a worker that moves nothing in a step still calls take([])
                exports.append((end, seconds * 1e3))
        else:
            loads.append((end, seconds * 1e3))
    return exports, loads


def check_steps(requests: list[dict[str, Any]], issued: list[Any], moved: dict[int, list[int]],
                bins: int) -> list[dict[str, Any]]:
    """Each request's steps (worker 0's controller, in order), checked against the tables
    ``rebalanced`` gives and against what the old owners report moved."""
    ts = tables(bins)
    changes, k = [], 0
    for i, req in enumerate(requests):
        steps = issued[k:k + req["steps"]]
        k += req["steps"]
        before, after = ts[i], ts[i + 1]
        moves = [m for _, ms in steps for m in ms]
        if sorted(m[0] for m in moves) != before.moved(after).tolist():
            raise AssertionError(f"rescale to {req['roster']}: the moves are not the changed bins")
        if any(m[1] != before.owner(m[0]) or m[2] != after.owner(m[0]) for m in moves):
            raise AssertionError(f"rescale to {req['roster']}: a move with the wrong owners")
        per_step = []
        for t, ms in steps:
            got = moved.get(t, [0, 0])
            if got[0] != len(ms):
                raise AssertionError(f"step at {t}: {got[0]} bins reported moved, {len(ms)} issued")
            per_step.append({"time": t, "bins": got[0], "bytes": got[1]})
        owners_before, owners_after = set(before.owners.tolist()), set(after.owners.tolist())
        leaving = sorted(owners_before - owners_after)
        changes.append({
            "roster": req["roster"], "from": len(owners_before), "to": len(owners_after),
            "leaving": leaving, "leaving_bins": sum(len(before.owned_by(w)) for w in leaving),
            "existing": sorted(owners_before), "asked": req["asked"], "acked": req["acked"],
            "steps": per_step, "last_time": steps[-1][0] if steps else None,
            "bins": len(moves), "bytes": sum(s["bytes"] for s in per_step)})
    if k != len(issued):
        raise AssertionError(f"{len(issued) - k} steps issued beyond the requests")
    return changes


def analyse(results: list[dict[str, Any]], requests: list[dict[str, Any]], cfg: dict[str, Any],
            bins: int) -> dict[str, Any]:
    origin, period, n = cfg["origin"], cfg["period"], cfg["epochs"]
    warmup, settle = cfg["warmup"], cfg["settle"]
    sent = np.array([r["sent"] for r in results])  # workers x epochs
    done = np.array([r["done"] for r in results])
    latency = (done - sent).max(axis=0) * 1e3
    first_sent, last_done = sent.min(axis=0), done.max(axis=0)
    due = origin + np.arange(n) * period
    from_due = (last_done - due) * 1e3
    lag = (sent - due).max(axis=0) * 1e3

    moved: dict[int, list[int]] = {}
    for r in results:
        for t, b, nbytes in r["moved"]:
            entry = moved.setdefault(t, [0, 0])
            entry[0] += b
            entry[1] += nbytes
    changes = check_steps(requests, results[0]["issued"], moved, bins)
    calls = [migration_calls(r) for r in results]
    in_window = np.zeros(n, dtype=bool)
    settling = np.zeros(n, dtype=bool)
    for c in changes:
        last = c["last_time"]  # epoch e travels at time e + 1
        c["end"] = float(last_done[last - 1]) if last is not None and last - 1 < n \
            else float(last_done[-1])
        mask = (first_sent <= c["end"]) & (last_done >= c["asked"])
        c["epochs"] = np.flatnonzero(mask)
        in_window |= mask
        settling |= (first_sent > c["end"]) & (first_sent <= c["end"] + settle)
        lat = latency[mask]
        before = latency[(first_sent >= c["asked"] - 1.0) & (first_sent < c["asked"])]
        c["before_max"] = float(before.max()) if len(before) else float("nan")
        c["state_bytes"] = sum(r["state_bytes"] for r in results)
        c["p99"], c["max"] = percentile(lat, 99), float(lat.max()) if len(lat) else 0.0
        c["max_due"] = float(from_due[mask].max()) if len(lat) else 0.0
        inside = [(w, ms) for w, (ex, _) in enumerate(calls) for end, ms in ex
                  if c["asked"] <= end <= c["end"]]
        c["export_ms"], c["export_worker"] = max(((ms, w) for w, ms in inside), default=(0.0, -1))
        c["load_ms"] = max((ms for _, ld in calls for end, ms in ld
                            if c["asked"] <= end <= c["end"]), default=0.0)
    settling &= ~in_window
    steady = ~in_window & ~settling & (first_sent >= origin + warmup)

    # output progress per worker: gaps between completions, runs of empty send-grid periods
    gap, gap_worker, gap_at, empty_run, empty_at = 0.0, 0, 0.0, 0, 0.0
    for w in range(len(results)):
        d = done[w]
        diffs = np.diff(d)
        i = int(np.argmax(diffs))
        if diffs[i] > gap:
            gap, gap_worker, gap_at = float(diffs[i]), w, float(d[i])
        buckets = np.floor((d - origin) / period).astype(int)
        seen = np.zeros(buckets.max() - buckets.min() + 1, dtype=bool)
        seen[buckets - buckets.min()] = True
        run = 0
        for j, s in enumerate(seen):
            run = 0 if s else run + 1
            if run > empty_run:
                empty_run, empty_at = run, (buckets.min() + j - run + 1) * period
    gap_in_window = any(gap_at <= c["end"] and gap_at + gap >= c["asked"] for c in changes)
    empty_in_window = any(origin + empty_at <= c["end"]
                          and origin + empty_at + empty_run * period >= c["asked"] for c in changes)

    # blocking: the migration's own calls, first on each worker against the later ones
    exports = [ms for ex, _ in calls for _, ms in ex]
    loads = [ms for _, ld in calls for _, ms in ld]
    first_export = [ex[0][1] if ex else None for ex, _ in calls]
    later_export = [max((ms for _, ms in ex[1:]), default=None) for ex, _ in calls]
    long_in: dict[int, tuple[float, float]] = {}  # worker -> (wall ms, CPU ms) of the longest
    long_out: dict[int, tuple[float, float]] = {}
    for w, r in enumerate(results):
        for end_at, seconds, cpu in r["long_steps"]:
            if end_at < origin + warmup:
                continue
            step = (seconds * 1e3, cpu * 1e3)
            if any(c["asked"] <= end_at <= c["end"] for c in changes):
                if any(c["asked"] <= end_at <= c["end"] and w in c["existing"] for c in changes):
                    long_in[w] = max(long_in.get(w, step), step)
            else:
                long_out[w] = max(long_out.get(w, step), step)
    # Python's full collections against the long steps (after the warm-up)
    gc2: list[tuple[int, float]] = []  # per worker: gen-2 collections, the longest (ms)
    long_gc: list[tuple[int, int]] = []  # per worker: steps >= LONG_STEP_MS, those with a gen 2
    for r in results:
        full = [(end, sec) for end, sec, g in r.get("gcs", []) if g == 2
                and end >= origin + warmup]
        gc2.append((len(full), max((sec * 1e3 for _, sec in full), default=0.0)))
        long = [(end_at, sec) for end_at, sec, _ in r["long_steps"]
                if end_at >= origin + warmup and sec * 1e3 >= LONG_STEP_MS]
        with_gc = sum(1 for end_at, sec in long
                      if any(end_at - sec <= g_end <= end_at for g_end, _ in full))
        long_gc.append((len(long), with_gc))
    steady_lat, migr_lat, settle_lat = latency[steady], latency[in_window], latency[settling]
    steady_p99, migr_p99 = percentile(steady_lat, 99), percentile(migr_lat, 99)
    migr_max = float(migr_lat.max()) if len(migr_lat) else float("nan")
    block = max(exports + loads, default=0.0)
    return {
        "origin": origin, "latency": latency, "sent": first_sent, "in_window": in_window,
        "settling": settling, "steady": steady, "from_due": from_due,
        "lag_p99": percentile(lag, 99), "lag_max": float(lag.max()),
        "steady_p50": percentile(steady_lat, 50), "steady_p99": steady_p99,
        "steady_max": float(steady_lat.max()) if len(steady_lat) else float("nan"),
        "steady_n": int(steady.sum()),
        "migr_p99": migr_p99, "migr_max": migr_max, "migr_n": int(in_window.sum()),
        "settle_p99": percentile(settle_lat, 99),
        "settle_max": float(settle_lat.max()) if len(settle_lat) else float("nan"),
        "settle_n": int(settling.sum()), "all_max": float(latency.max()),
        "gap_ms": gap * 1e3, "gap_worker": gap_worker, "gap_at": gap_at - origin,
        "gap_in_window": gap_in_window, "empty_run": empty_run, "empty_at": empty_at,
        "empty_in_window": empty_in_window, "block_ms": block, "exports": len(exports),
        "loads": len(loads), "first_export": first_export, "later_export": later_export,
        "max_load": [max((ms for _, ms in ld), default=None) for _, ld in calls],
        "long_in": long_in, "long_out": long_out, "changes": changes,
        "gc2": gc2, "long_gc": long_gc,
        "cpu": [r["cpu"] / r["wall"] for r in results],
        "steps_per_s": [r["steps"] / r["wall"] for r in results],
        "parked": [r["parked"] / max(1, r["steps"]) for r in results],
        "targets": {
            "p99": migr_p99 <= P99_RATIO_TARGET * steady_p99 and migr_p99 <= P99_TARGET_MS,
            "max": migr_max <= MAX_TARGET_MS,
            "zero": empty_run < 2,
            "block": block <= BLOCK_TARGET_MS,
        },
    }


# -- maximum throughput --------------------------------------------------------------------------


def max_throughput(words: int, epochs: int, owners: list[int], salt: int,
                   startup: float) -> dict[str, Any]:
    """Closed loop, no rescaling: words/s from the first send to the last completion (the
    latest over the workers)."""
    cfg = {"mode": "closed", "owners": owners, "words": words, "epochs": epochs,
           "origin": time.time() + startup, "period": 0.0, "salt": salt}
    results, _ = run_job(cfg)
    check_output(results, cfg, f"closed loop, {len(set(owners))} workers, {words} words/epoch")
    start = min(r["sent"][0] for r in results)
    end = max(r["done"][-1] for r in results)
    return {"words": words, "epochs": epochs, "rate": words * epochs / (end - start),
            "seconds": end - start}


# -- report ----------------------------------------------------------------------------------------


def yes(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def ms(value: float | None) -> str:
    return "" if value is None or value != value else f"{value:.1f}"


def plot(runs: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]],
         cfg: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*runs.items(), *[(f"reference: {k}", a) for k, a in references.items()]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 2.9 * len(panels) + 0.8), sharex=True,
                             squeeze=False)
    top = max(max(float(a["latency"].max()) for _, a in panels), MAX_TARGET_MS) * 1.5
    for ax, (label, a) in zip(axes[:, 0], panels, strict=True):
        origin = a["origin"]
        x = a["sent"] - origin
        lat = a["latency"]
        ax.plot(x, lat, lw=0.7, color="tab:blue", label="epoch latency (largest over the workers)")
        ax.scatter(x[a["in_window"]], lat[a["in_window"]], s=5, color="tab:red", zorder=3,
                   label="epochs during migration")
        ax.scatter(x[a["settling"]], lat[a["settling"]], s=5, color="tab:purple", zorder=3,
                   label=f"epochs sent ≤ {cfg['settle']:g} s after a window (settling)")
        for i, c in enumerate(a["changes"]):
            ax.axvspan(c["asked"] - origin, c["end"] - origin, color="tab:red", alpha=0.12,
                       label="migration window" if i == 0 else None)
            ax.axvline(c["asked"] - origin, color="tab:red", lw=1)
            ax.annotate(f"rescale({c['roster']})", (c["asked"] - origin, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(3, -11),
                        textcoords="offset points", color="tab:red", fontsize=8)
        ax.axhline(P99_TARGET_MS, color="tab:orange", ls="--", lw=1, label="100 ms")
        ax.axhline(MAX_TARGET_MS, color="black", ls=":", lw=1, label="250 ms")
        if a["steady_p99"] == a["steady_p99"] and a["changes"]:
            ax.axhline(2 * a["steady_p99"], color="tab:green", ls="--", lw=1, label="2 × steady p99")
        ax.set_yscale("log")
        ax.set_ylim(0.5, top)
        ax.set_ylabel("latency (ms)")
        title = f"{label}: steady p50 {a['steady_p50']:.0f} ms, p99 {a['steady_p99']:.0f} ms"
        if a["changes"]:
            title += f"; during migration p99 {a['migr_p99']:.0f} ms, max {a['migr_max']:.0f} ms"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(loc="lower left", fontsize=6.5, ncol=4)
    axes[-1, 0].set_xlabel("seconds since the first epoch was due (x: the epoch's first send)")
    fig.suptitle(f"Running word count with megaphone_fold, process runtime, {WORKERS} worker "
                 f"processes on {os.cpu_count()} cores, roster 2→3→4→3→2, {cfg['rate']:g} "
                 f"epochs/s × {cfg['words']:,} words, {cfg['bins']} bins", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def targets_table(runs: dict[str, dict[str, Any]], settle: float) -> list[str]:
    lines = [
        "| strategy | load average at start, end | steady epochs | steady p50 ms | steady p99 ms | "
        "migration epochs | "
        "migration p99 ms | p99 ≤ 2× steady p99 and ≤ 100 ms | migration max ms | max ≤ 250 ms | "
        f"settling (≤ {settle:.3g} s after a window): epochs, p99, max ms | largest gap without "
        "output progress | throughput never zero 2 epochs running | longest migration call ms "
        "| ≤ 5 ms |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---|---|---:|---|",
    ]
    for strategy, a in runs.items():
        t = a["targets"]
        lines.append(
            f"| {strategy} | {a['load'][0]:.1f}, {a['load'][1]:.1f} | {a['steady_n']} | "
            f"{ms(a['steady_p50'])} | {ms(a['steady_p99'])} | "
            f"{a['migr_n']} | {ms(a['migr_p99'])} | {yes(t['p99'])} "
            f"({a['migr_p99'] / a['steady_p99']:.1f}× steady) | {ms(a['migr_max'])} | "
            f"{yes(t['max'])} | {a['settle_n']}, {ms(a['settle_p99'])}, {ms(a['settle_max'])} | "
            f"{a['gap_ms']:.0f} ms (worker {a['gap_worker']} at {a['gap_at']:.1f} s"
            f"{', in a window' if a['gap_in_window'] else ', outside the windows'}) | "
            f"{yes(t['zero'])}: longest run {a['empty_run']} empty periods (from "
            f"{a['empty_at']:.1f} s{', in a window' if a['empty_in_window'] else ''}) | "
            f"{a['block_ms']:.1f} | {yes(t['block'])} |")
    return lines


def changes_table(runs: dict[str, dict[str, Any]], bins: int) -> list[str]:
    lines = [
        f"| strategy | change | steps | bins moved (of {bins}) | moved state against the bound | "
        "bytes moved (of the state's bytes at the end) | largest step: bins (bytes) | window ms "
        "| epochs | p99 ms | max ms | max from due ms | max in the second before the request ms "
        "| longest take ms (worker) | longest load ms |",
        "|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for strategy, a in runs.items():
        for c in a["changes"]:
            frac = c["bins"] / bins
            big = max(c["steps"], key=lambda s: s["bins"]) if c["steps"] else {"bins": 0, "bytes": 0}
            step_frac = big["bins"] / bins
            if c["to"] > c["from"]:
                limit = 1 / c["to"] + MOVE_SLACK
                bound = (f"scale-out: largest step {step_frac:.3f}, whole change {frac:.3f} of "
                         f"the bins; ≤ 1/{c['to']} + 2 % = {limit:.3f}: "
                         f"{yes(step_frac <= limit and frac <= limit)}")
            else:
                exact = c["bins"] == c["leaving_bins"]
                bound = (f"scale-in: leaving worker {', '.join(map(str, c['leaving']))} owned "
                         f"{c['leaving_bins']} bins; {c['bins']} moved, all from it: "
                         f"{yes(exact)}")
            lines.append(
                f"| {strategy} | {c['from']}→{c['to']} | {len(c['steps'])} | {c['bins']} | "
                f"{bound} | {c['bytes']:,} ({c['bytes'] / c['state_bytes']:.3f}) | "
                f"{big['bins']} ({big['bytes']:,}) | {(c['end'] - c['asked']) * 1e3:.0f} | "
                f"{len(c['epochs'])} | {ms(c['p99'])} | {ms(c['max'])} | {ms(c['max_due'])} | "
                f"{ms(c['before_max'])} | {c['export_ms']:.1f} "
                f"({c['export_worker']}) | {c['load_ms']:.1f} |")
    return lines


def wall_cpu(step: tuple[float, float] | None) -> str:
    return "" if step is None else f"{step[0]:.1f} ({step[1]:.1f})"


def workers_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| run | worker | CPU / wall | steps/s | steps that parked first | first take "
        "ms | later take, max ms | load, max ms | longest step in a window (owners "
        "before the change): wall (CPU) ms | longest step outside the windows: wall (CPU) ms "
        f"| gen-2 GCs: count, longest ms | steps >= {LONG_STEP_MS:.0f} ms: count (with a gen-2 "
        "GC in them) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, a in runs.items():
        for w in range(WORKERS):
            lines.append(
                f"| {label} | {w} | {a['cpu'][w]:.2f} | {a['steps_per_s'][w]:,.0f} | "
                f"{a['parked'][w]:.0%} | {ms(a['first_export'][w])} | {ms(a['later_export'][w])} | "
                f"{ms(a['max_load'][w])} | {wall_cpu(a['long_in'].get(w))} | "
                f"{wall_cpu(a['long_out'].get(w))} | {a['gc2'][w][0]}, {a['gc2'][w][1]:.1f} | "
                f"{a['long_gc'][w][0]} ({a['long_gc'][w][1]}) |")
    return lines


def report(runs: dict[str, dict[str, Any]],
           references: dict[str, dict[str, Any]], maxima: list[dict[str, Any]],
           cfg: dict[str, Any], args: argparse.Namespace, load: float, when: str) -> str:
    from _provenance import provenance  # a sibling module: benchmarks run as scripts

    import tokenflow.rescale.megaphone as mp

    bins = cfg["bins"]
    lines = [
        "# Live rescaling benchmark (issue 16)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs: the {WORKERS} worker processes "
        f"(and the driver) share {os.cpu_count()} cores, so every figure below includes their "
        f"contention; Python {platform.python_version()}, numpy {np.__version__}; {when}; "
        f"1-minute load average {load:.1f} at the start (the machine is shared with other "
        f"work). {provenance()}",
        "",
        f"One run of `benchmarks/rescale.py{' --quick' if args.quick else ''}`. Workload: a "
        f"running word count, `megaphone_fold(words.map(lambda w: (w, 1)), fold)` emitting "
        f"`(word, running count)`, on the `process` runtime with {WORKERS} worker processes, "
        f"{bins} bins (batched: at most {mp.batch_size(bins)} bins per batch), lead 1. Initial table "
        f"`RoutingTable(RoutingTable.even(2, {bins}).owners, range(4))`; the driver calls "
        f"`JobHandle.rescale(n, strategy)` with n = 3, 4, 3, 2 at "
        + ", ".join(f"{at:g} s" for at in cfg["at"])
        + f" after the first epoch was due; {cfg['epochs']} epochs "
        f"({cfg['epochs'] / cfg['rate']:g} s) per run, one run per strategy. Words: Zipf(1.0) "
        f"over {VOCABULARY:,} made-up words, every worker sending a quarter of each epoch.",
        "",
        "## Load: half of the maximum throughput",
        "",
    ]
    if maxima:
        lines += [
            "Maximum measured first, in the same run: the same job without rescaling, closed "
            f"loop (each worker sends its next epoch as soon as its probe has passed the epoch "
            f"{IN_FLIGHT} before it), words/s from the first send to the last completion over "
            "the workers; a calibration run picks the epoch size at which the maximum is about "
            "twice the open-loop epoch rate:",
            "",
            "| table | words/epoch | epochs | seconds | words/s | epochs/s |",
            "|---|---:|---:|---:|---:|---:|",
            *[f"| {m['label']} | {m['words']:,} | {m['epochs']} | {m['seconds']:.2f} | "
              f"{m['rate']:,.0f} | {m['rate'] / m['words']:.1f} |" for m in maxima],
            "",
            f"Maximum taken: {cfg['max_rate']:,.0f} words/s (the lower of the measured runs, "
            "calibration excluded). ",
        ]
    else:
        lines += ["Words per epoch given with `--words` (no maximum measured). "]
    lines[-1] += (f"Open loop at half of it: **{cfg['rate']:g} epochs/s × {cfg['words']:,} "
                  f"words** ({cfg['rate'] * cfg['words']:,.0f} words/s), epoch `e` due at "
                  "`origin + e / rate` on every worker whether or not earlier epochs are done.")
    lines += [
        "",
        "## Targets, per strategy",
        "",
        "Latency of an epoch: the largest, over the 4 workers, of *done − sent* (wall clock: "
        "just before the worker hands its batch to the input, then after the first step after "
        "which its probe on the output has passed the epoch). Migration window: from the "
        "driver's `rescale` request until the output has passed the logical time of the "
        "change's last step on every worker. *During migration*: epochs whose [first send, last "
        f"completion] overlaps a window; *settling*: the other epochs sent ≤ {cfg['settle']:g} s "
        f"after a window ended; *steady*: the rest, after a {cfg['warmup']:g} s warm-up.",
        "",
        *targets_table(runs, cfg["settle"]),
        "",
        "![Epoch latency over time, one panel per strategy](rescale.png)",
        "",
        "- *largest gap*: between two consecutive epoch completions seen by one worker. *Empty "
        f"periods*: epoch periods ({1e3 / cfg['rate']:g} ms) of the send grid in which a worker "
        "saw no epoch complete; the longest run over the workers (2 or more: throughput was "
        "zero for two consecutive epochs).",
        "- *longest migration call*: the longest `take(bins)` (export and forget the moving "
        "bins' state) of one slice of a step on its old owner, or `load` of one slice of "
        "arriving parts on the new owner (wrapped with a timer inside the job; an activation "
        "may run several slices back to back: `StepStats.longest` measures those blocks). "
        "A step leaves its old owner in slices of "
        f"bins, about {1e3 * mp.SLICE_SECONDS:g} ms of taking per activation (at most "
        f"{mp.MAX_SLICES} slices a step), and is loaded the same way; its tokens and the new "
        "owner's frontier stay at the step's time until the last slice is in. Steps also "
        "carry the worker's regular work; their lengths are under *Workers*.",
        "",
        "## Per change",
        "",
        *changes_table(runs, bins),
        "",
        "- *bins moved*, *bytes moved*: `handle.moved` (`StepStats` of every old owner, summed "
        "per step); the moves were checked equal to the bins whose owner differs between the "
        "`RoutingTable.rebalanced` tables, each from its old to its new owner. *Bytes*: Arrow "
        "bytes of the exported bins (one pickled dict per bin), as `StepStats.bytes` counts them.",
        "- *max from due*: the epoch's last completion less its due time on the send grid (a "
        "worker busy migrating sends late; the latency columns count from the actual send). "
        "*Max in the second before the request*: the largest latency of the epochs sent in the "
        "second before it, i.e. how loaded the job already was when the change began. *The "
        "state's bytes at the end*: every worker's whole state exported the same way after the "
        "last epoch (the vocabulary is nearly all seen within the first seconds, so the state "
        "hardly grows after the first change).",
        "",
    ]
    if references:
        lines += [
            "## References without rescaling (same rate and words)",
            "",
            "| run | load average at start, end | steady epochs | p50 ms | p99 ms | max ms | "
            "largest gap ms | longest run of empty periods |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *[f"| {label} | {a['load'][0]:.1f}, {a['load'][1]:.1f} | {a['steady_n']} | "
              f"{ms(a['steady_p50'])} | {ms(a['steady_p99'])} | "
              f"{ms(a['steady_max'])} | {a['gap_ms']:.0f} | {a['empty_run']} |"
              for label, a in references.items()],
            "",
            "- `state_machine` routes by the job's table (`RoutingTable(RoutingTable.even(2, "
            f"{bins}).owners, range(4))`, given as the job's spec): the same fold and words "
            "without the migration machinery (no router, no control stream).",
            "",
        ]
    lines += [
        "## Workers",
        "",
        *workers_table({**runs, **{f"reference: {k}": a for k, a in references.items()}}),
        "",
        "- *CPU / wall*: `time.process_time()` over the run's wall time, per worker process. "
        "*Steps that parked first*: steps before which the worker had nothing activated and "
        "parked (waiting for messages up to the time to the next send); the others ran at once.",
        "- *first take*: the first step this worker sent bins away; *later*: the "
        "longest of its other steps. *Longest step*: wall time of one `worker.step()` (after "
        "the warm-up) and, in brackets, the CPU time its thread used meanwhile: a step much "
        "longer than its CPU time waited for a core (4 workers, the driver and other work on 2 "
        "cores), not for the migration.",
        "- *gen-2 GCs*: Python's full cyclic-garbage collections in the worker process after the "
        "warm-up (`gc.callbacks`), how many and the longest; *steps >= "
        f"{LONG_STEP_MS:.0f} ms*: how many steps took that long, and in brackets how many of "
        "them had a full collection end inside them. The runs pre-generate their whole input "
        "as Python lists of words (50 s of it: about 7 million references per worker), and "
        "`gc.freeze()` moves it out of the collector's reach once made; the reference *input "
        "not frozen by the benchmark* leaves that to the worker runtime, which freezes what "
        "exists after a worker's first step (`FreezeAtStart`), this input included.",
        "",
        f"Send lag (a worker's send after its due time): p99 "
        f"{max(a['lag_p99'] for a in runs.values()):.1f} ms, max "
        f"{max(a['lag_max'] for a in runs.values()):.1f} ms over the strategy runs.",
        "",
        "Every run's output was checked before these figures were printed: per word, the "
        "largest running count emitted (on any worker) equals a plain `Counter` over the same "
        "words, and so does the union of the workers' final states (each word on exactly one "
        "worker), and as many records came out as words went in.",
        "",
    ]
    return "\n".join(lines)


def open_run(label: str, cfg: dict[str, Any], strategy: str | None,
             dump: Path | None = None) -> dict[str, Any]:
    """One open-loop run (with the rescale schedule when ``strategy`` is given), checked and
    analysed; the raw results pickled under ``dump`` when given."""
    print(f"{label}: {cfg['epochs']} epochs at {cfg['rate']:g}/s x {cfg['words']} words ...",
          file=sys.stderr)
    cfg = {**cfg, "origin": time.time() + cfg["startup"]}
    schedule = list(zip(cfg["at"], ROSTERS, strict=True)) if strategy else None
    load = os.getloadavg()[0]
    results, requests = run_job(cfg, schedule, strategy or "batched")
    load = (load, os.getloadavg()[0])
    early = cfg["origin"] - max(r["ready"] for r in results)
    print(f"  workers ready {early:.1f} s before the first epoch was due", file=sys.stderr)
    if early < 0:
        raise RuntimeError(f"{label}: the workers were ready {-early:.1f} s after the first "
                           "epoch was due: raise --startup")
    if dump is not None:
        import pickle

        dump.mkdir(parents=True, exist_ok=True)
        name = "".join(ch if ch.isalnum() else "_" for ch in label)
        with open(dump / f"{name}.pickle", "wb") as f:
            pickle.dump({"cfg": cfg, "results": results, "requests": requests}, f)
    check_output(results, cfg, label)
    return {**analyse(results, requests, cfg, cfg["bins"]), "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="64 bins, 3 s between rescales, no reference runs "
                             "(~1.5 minutes)")
    parser.add_argument("--bins", type=int, default=256)
    parser.add_argument("--rate", type=float, default=20.0, help="epochs/s of the open loop")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between rescales")
    parser.add_argument("--startup", type=float, default=15.0,
                        help="seconds from starting a job to its first epoch (process start-up)")
    parser.add_argument("--words", type=int, help="words per epoch (default: half the measured "
                                                  "maximum)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--dump", type=Path, help="also pickle every run's raw results here")
    args = parser.parse_args()
    if args.quick:
        args.bins, args.interval = 64, 3.0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    load = os.getloadavg()[0]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from tokenflow.state.bins import RoutingTable

    two = RoutingTable.even(2, args.bins).owners.tolist()
    four = RoutingTable.even(4, args.bins).owners.tolist()
    maxima: list[dict[str, Any]] = []
    if args.words:
        words, max_rate = args.words, 2.0 * args.words * args.rate
    else:
        seconds = 4.0 if args.quick else 8.0
        print("maximum throughput: calibration ...", file=sys.stderr)
        first = max_throughput(4_000, int(seconds * 10), two, 1, args.startup)
        maxima.append({**first, "label": "2 workers own bins (calibration)"})
        words = max(WORKERS, round(first["rate"] / (2 * args.rate)))
        tables_ = [("2 workers own bins", two, 2)]
        if not args.quick:
            tables_.append(("4 workers own bins", four, 3))
        for label, owners, salt in tables_:
            print(f"maximum throughput: {label}, {words} words/epoch ...", file=sys.stderr)
            m = max_throughput(words, int(seconds * 2 * args.rate), owners, salt, args.startup)
            maxima.append({**m, "label": label})
        max_rate = min(m["rate"] for m in maxima[1:])
        words = max(WORKERS, round(max_rate / 2 / args.rate))
    cfg: dict[str, Any] = {
        "mode": "open", "owners": two, "words": words, "bins": args.bins,
        "epochs": int(round(args.interval * (len(ROSTERS) + 1) * args.rate)),
        "period": 1.0 / args.rate, "rate": args.rate, "max_rate": max_rate,
        "at": [args.interval * (i + 1) for i in range(len(ROSTERS))], "startup": args.startup,
        "warmup": min(2.0, args.interval / 2), "settle": min(2.0, args.interval / 3)}
    strategies = args.strategies.split(",")
    runs = {s: open_run(s, {**cfg, "salt": 10 + i}, s, args.dump) for i, s in enumerate(strategies)}
    references: dict[str, dict[str, Any]] = {}
    if not args.quick:
        references = {
            "megaphone_fold, no rescaling": open_run("reference: megaphone_fold", {
                **cfg, "salt": 20}, None, args.dump),
            "state_machine, no rescaling": open_run("reference: state_machine", {
                **cfg, "salt": 21, "operator": "state_machine"}, None, args.dump),
            "megaphone_fold, no rescaling, input not frozen by the benchmark": open_run(
                "reference: megaphone_fold, input not frozen by the benchmark", {
                    **cfg, "salt": 22, "gc_as_before": True}, None, args.dump)}
    text = report(runs, references, maxima, cfg, args, load, when)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / "rescale.md"
        kept = path.read_text().partition(KEPT)[1:] if path.exists() else ("", "")
        path.write_text(text + "".join(kept))
        plot(runs, references, cfg, RESULTS / "rescale.png")


if __name__ == "__main__":
    main()
