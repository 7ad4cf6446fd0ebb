"""The state of the library's windows, watermark operators and ``hourly_stats`` as
``BinnedState``s: exported per bin, restored at 1, 2 and 3 workers, and on running dataflows.

* State classes (``open_windows``, ``KeyedWindows``, ``held_watermark``, ``tracked_watermark``,
  ``PendingHours``): filled through the calls their operators make, exported (through an Arrow
  IPC stream, as a snapshot stores them) and loaded for ``W in (1, 2, 3)`` into ``W`` fresh
  states with the bins each owns under ``RoutingTable.even(2).rebalanced(range(W))``: (a) a
  keyed row is on exactly the worker its exchange routes it to, a worker-local part on the
  owner of the bin it was exported under; (b) the union is the original (rows, pending
  times); (c) finishing the computation on the split states gives the original's outputs.
* Dataflows (thread runtime, ``execute``): ``tumbling``, ``sliding`` and ``tumbling_watermark``
  stopped while windows are open: ``worker.export_states()`` holds exactly those windows, with
  their ends (``tumbling``, ``sliding``) or the output watermark (``tumbling_watermark``) as
  pending times.  Then the exports are written as a committed snapshot and the job restored
  from it at 1 and 3 workers (``execute(..., restore=...)``): the restored operators finish the
  open windows, and the outputs before the snapshot plus those after the restore are those of
  an uninterrupted run.

Source: Megaphone (Hoffmann et al., VLDB 2019: state in bins, moved with the routing table);
the timestamp-tokens paper §5 (tokens re-minted at the restored state's pending times).
"""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from roundtrip import OLD, WORKERS, exported, fresh, restore

from tokenflow import execute
from tokenflow.dataflow.operators.watermark import (
    MAX_WATERMARK,
    KeyedWindows,
    Watermark,
    WatermarkTracker,
    assign_watermarks,
    forward_watermarks,
    held_watermark,
    strip_watermarks,
    tracked_watermark,
    tumbling_watermark,
)
from tokenflow.dataflow.operators.window import merge_windows, open_windows, sliding, tumbling
from tokenflow.dataflow.routing import column_routes, stable_hash
from tokenflow.flights import HOUR, HOUR_MS, PendingHours, hourly_table
from tokenflow.state.snapshot import commit_snapshot, write_worker_part

pytestmark = pytest.mark.timeout(60)



# -- harness ------------------------------------------------------------------------------------










Record = tuple[int, int, int]
"""``(event time, key, value)``."""


def records(seed: int, n: int, times: range, keys: int = 7) -> list[Record]:
    rng = random.Random(seed)
    return [(rng.choice(times), rng.randrange(keys), rng.randrange(100)) for _ in range(n)]


def add_to_windows(windows: dict[int, list[Any]], batch: list[Record], size: int) -> None:
    """What ``tumbling``/``tumbling_watermark`` do with a batch: append to the window of each
    record's time."""
    for r in batch:
        windows.setdefault(r[0] - r[0] % size + size, []).append(r)


def key_of(record: Record) -> int:
    return record[1]


def key_sums(start: int, end: int, rows: list[Record]) -> list[tuple[int, int, int, int]]:
    acc: dict[int, int] = defaultdict(int)
    for _, k, v in rows:
        acc[k] += v
    return [(k, start, end, s) for k, s in sorted(acc.items())]


# -- state classes --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", WORKERS)
def test_open_windows_are_worker_local(workers: int) -> None:
    """``tumbling``/``sliding``'s ``LocalState``: each old worker's windows go whole to the
    owner of its home bin; windows of several old workers merge (records concatenated)."""
    old = [fresh(open_windows, OLD, w) for w in range(2)]
    for w, state in enumerate(old):
        add_to_windows(state.value, records(w, 40, range(0, 30)), 10)
    parts = exported(*old)
    assert sorted(parts) == [0, 2048]  # the home bins of the two old workers
    routing, split = restore(open_windows, parts, workers)
    for w, state in enumerate(split):  # (a) an old worker's windows are on its home's owner
        mine = [old[i] for i, home in enumerate((0, 2048)) if routing.owner(home) == w]
        expected: dict[int, list[Any]] = {}
        for o in mine:
            merge_windows(expected, o.value)
        assert state.value == expected
        assert state.pending_times() == sorted(expected)
    # (b) the same records per window; the same window ends pending
    union: dict[int, Counter[Record]] = defaultdict(Counter)
    for state in split:
        for end, rows in state.value.items():
            union[end].update(rows)
    original: dict[int, Counter[Record]] = defaultdict(Counter)
    for state in old:
        for end, rows in state.value.items():
            original[end].update(rows)
    assert union == original
    assert sorted({t for s in split for t in s.pending_times()}) == [10, 20, 30]
    assert open_windows().export() == {}  # nothing open: nothing exported
    assert open_windows(tokens=False).pending_times() == []


@pytest.mark.parametrize("workers", WORKERS)
def test_keyed_windows_follow_their_keys(workers: int) -> None:
    """``tumbling_watermark(key=...)``'s ``KeyedWindows``: records per bin of their key."""
    (state,) = [fresh(lambda: KeyedWindows(key_of), OLD, 0)]
    add_to_windows(state.value, records(3, 200, range(0, 30), keys=50), 10)
    parts = exported(state)
    assert len(parts) > 10
    routing, split = restore(lambda: KeyedWindows(key_of), parts, workers)
    union: dict[int, Counter[Record]] = defaultdict(Counter)
    for w, s in enumerate(split):
        for end, rows in s.value.items():
            routes = routing.routes(stable_hash([key_of(r) for r in rows]))
            assert (routes == w).all()  # (a)
            union[end].update(rows)
        assert s.pending_times() == []  # the watermark token covers the windows
    assert union == {end: Counter(rows) for end, rows in state.value.items()}  # (b)
    # (c) closing every window on the split states gives the same per-key sums
    expected = sorted(r for end in sorted(state.value)
                      for r in key_sums(end - 10, end, state.value[end]))
    got = sorted(r for s in split for end in sorted(s.value)
                 for r in key_sums(end - 10, end, s.value[end]))
    assert got == expected
    # discard: the bins that moved away are forgotten, the others kept
    gone = sorted(parts)[::2]
    state.discard(gone)
    assert sorted(state.export()) == sorted(set(parts) - set(gone))


@pytest.mark.parametrize("workers", WORKERS)
def test_watermark_states_merge_to_the_least(workers: int) -> None:
    """Held output watermarks and trackers of several old workers merge to their minimum;
    a tracker restored for another number of upstream workers restarts them at it."""
    marks = [fresh(held_watermark, OLD, w) for w in range(2)]
    marks[0].value, marks[1].value = 40, 25
    trackers = [fresh(tracked_watermark, OLD, w) for w in range(2)]
    for state, latest in zip(trackers, ([40, 45], [30, 50]), strict=True):
        tracker = WatermarkTracker(2, 0, "T")
        tracker.observe([Watermark(t, i) for i, t in enumerate(latest)])
        state.value = tracker
    mark_parts, tracker_parts = exported(*marks), exported(*trackers)
    routing, mark_split = restore(held_watermark, mark_parts, workers)
    _, tracker_split = restore(tracked_watermark, tracker_parts, workers)
    for w in range(workers):
        homes = [i for i, home in enumerate((0, 2048)) if routing.owner(home) == w]
        expected = [min([40, 25][i] for i in homes)] if homes else []
        assert mark_split[w].pending_times() == expected
        tracker_value = tracker_split[w].value
        if not homes:
            assert tracker_value is None and tracker_split[w].pending_times() == []
            continue
        least = min([40, 30][i] for i in homes)
        assert tracker_split[w].pending_times() == [least]
        live = WatermarkTracker(workers, 0, "T")
        live.resume(tracker_value)
        assert live.current == least
        # the same number of upstream workers keeps each one's watermark, else all restart
        assert live.latest == ([[40, 45], [30, 50]][homes[0]] if workers == 2 else [least] * workers)
    ended = fresh(tracked_watermark, OLD, 0)
    ended.value = WatermarkTracker(2, MAX_WATERMARK, "T")
    assert ended.pending_times() == []  # the token was dropped at MAX_WATERMARK
    done = fresh(held_watermark, OLD, 0)
    assert done.export() == {} and done.pending_times() == []


def flights(seed: int, n: int, hours: int) -> list[tuple[int, pa.RecordBatch]]:
    """Flights as ``hourly_stats`` receives them: ``(hour ms, batch of origin, dep_time,
    dep_delay)``, several batches per hour, nulls for cancelled flights."""
    rng = np.random.default_rng(seed)
    origins = np.array(["EWR", "JFK", "LGA", "BOS", "SFO", "ORD", "ATL"])
    out = []
    for _ in range(n):
        size = int(rng.integers(1, 30))
        cancelled = rng.random(size) < 0.1
        delay = rng.integers(-10, 120, size)
        batch = pa.record_batch({
            "origin": pa.array(rng.choice(origins, size)),
            "dep_time": pa.array(rng.integers(0, 2359, size), mask=cancelled),
            "dep_delay": pa.array(delay, mask=cancelled),
        })
        out.append((int(rng.integers(0, hours)) * HOUR_MS, batch))
    return out


def hour_stats(state: PendingHours) -> list[dict[str, Any]]:
    """What ``hourly_stats`` computes for every pending hour of ``state``."""
    rows = state.table()
    if rows is None:
        return []
    return hourly_table(rows.column(HOUR).to_numpy(), rows.column("origin"),
                        rows.column("dep_time"), rows.column("dep_delay")).to_pylist()


@pytest.mark.parametrize("workers", WORKERS)
def test_pending_hours_follow_their_origin(workers: int) -> None:
    state = fresh(PendingHours, OLD, 0)
    for hour, batch in flights(5, 60, 6):
        state.add(batch.append_column(HOUR, pa.array([hour] * batch.num_rows, pa.int64())))
    parts = exported(state)
    routing, split = restore(PendingHours, parts, workers)
    total = 0
    for w, s in enumerate(split):
        table = s.table()
        if table is not None:
            assert (column_routes(table.column("origin"), routing) == w).all()  # (a)
            total += table.num_rows
    original = state.table()
    assert original is not None and total == original.num_rows
    union = Counter(tuple(sorted(r.items())) for s in split if s.table() is not None
                    for r in s.table().to_pylist())  # type: ignore[union-attr]
    assert union == Counter(tuple(sorted(r.items())) for r in original.to_pylist())  # (b)
    # one token each, at the least pending hour: the least of them is the old one's
    assert min(t for s in split for t in s.pending_times()) == state.pending_times()[0]
    assert all(s.pending_times() == [min(s.table().column(HOUR).to_pylist())]  # type: ignore[union-attr]
               for s in split if s.table() is not None)
    expected = hour_stats(state)  # (c) the same statistics per (origin, hour)
    got = [r for s in split for r in hour_stats(s)]
    key = lambda r: (r["time_hour"], r["origin"])  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)


# -- dataflows: export while windows are open, then restore at another worker count ----------


SIZE = 5
"""Window length of the dataflows below (time units)."""
CUT = 12
"""The epoch of the snapshot: data before it is in, windows ending after it are open."""
END = 24
NAME = "state-roundtrip"


def data(worker: int, times: range) -> list[Record]:
    return records(100 + worker + 10 * times.start, 30, times)


def every_record(start: int, end: int, rows: list[Record]) -> list[tuple[int, int, Record]]:
    """A reduce whose outputs do not depend on how a window's records are spread."""
    return [(start, end, r) for r in rows]


def build(scope: Any) -> tuple[Any, list[Any], list[Any]]:
    inp, stream = scope.new_input()
    outputs = [
        tumbling(stream, SIZE, every_record),
        sliding(stream, 6, 3, every_record),
        strip_watermarks(tumbling_watermark(assign_watermarks(stream), SIZE, key_sums,
                                            key=key_of)),
        strip_watermarks(tumbling_watermark(assign_watermarks(stream, name="AssignLocal"), SIZE,
                                            every_record, name="TumblingWatermarkLocal")),
        strip_watermarks(forward_watermarks(assign_watermarks(stream, name="AssignForward"),
                                            key=key_of)),
    ]
    return inp, [o.probe() for o in outputs], [o.capture() for o in outputs]


def feed(worker: Any, inp: Any, rows: list[Record]) -> None:
    for t in sorted({r[0] for r in rows}):
        inp.advance_to(t)
        inp.send_batch([r for r in rows if r[0] == t])


def outputs(captures: list[Any]) -> list[Counter[tuple[int, Any]]]:
    return [Counter((t, r) for t, batch in c.events for r in batch) for c in captures]


def run_until_cut(workers: int) -> list[tuple[dict[str, dict[int, pa.Table]],
                                             list[Counter[tuple[int, Any]]]]]:
    """A job fed the data before ``CUT``, stopped at ``CUT``: per worker, its exported states
    and the outputs it had sent."""
    barrier = threading.Barrier(workers)

    def job(worker: Any) -> Any:
        inp, probes, captures = worker.dataflow(build)
        feed(worker, inp, data(worker.index, range(0, CUT)))
        inp.advance_to(CUT)
        worker.step_while(lambda: any(p.less_than(CUT) for p in probes))
        states = worker.export_states()
        sent = outputs(captures)
        barrier.wait()  # nobody sends more (e.g. a final watermark) before all exported
        inp.close()
        return states, sent

    return execute(job, workers=workers)


def by_name(states: dict[str, dict[int, pa.Table]], operator: str, state: str) -> dict[int, pa.Table]:
    (key,) = [k for k in states if k.endswith(f":{operator}/{state}")]
    return states[key]


def test_exports_hold_the_open_windows() -> None:
    """Stopped at ``CUT``: each worker's export holds its open windows (``[10, 15)``, and the
    sliding ``[9, 15)``) and their pending times; the watermark operators hold their token at
    ``CUT``."""
    results = run_until_cut(2)
    routing = OLD
    for w, (states, sent) in enumerate(results):
        mine = data(w, range(0, CUT))
        # tumbling: worker-local, under the worker's home bin; the open window ends at 15
        parts = by_name(states, "Tumbling", "windows")
        assert list(parts) == [int(routing.owned_by(w)[0])]
        windows = fresh(open_windows, routing, w)
        windows.load(parts)
        assert windows.pending_times() == [15]
        assert Counter(windows.value[15]) == Counter(r for r in mine if r[0] >= 10)
        # sliding [s, s + 6) every 3: the one window ending after CUT with data is [9, 15)
        parts = by_name(states, "Sliding", "windows")
        windows = fresh(open_windows, routing, w)
        windows.load(parts)
        assert windows.pending_times() == [15]
        assert Counter(windows.value[15]) == Counter(r for r in mine if r[0] >= 9)
        # the output so far: the windows that closed before CUT, nothing more
        assert {t for t, _ in sent[0]} <= {5, 10} and {t for t, _ in sent[1]} <= {3, 6, 9, 12}
    # tumbling_watermark by key: the open window's records, per bin of their key, on the
    # worker owning the bin; its token is at the watermark CUT, the window end is not a token
    keyed: Counter[Record] = Counter()
    for w, (states, _) in enumerate(results):
        parts = by_name(states, "TumblingWatermark", "windows")
        for b, table in parts.items():
            assert routing.owner(b) == w
            windows = fresh(lambda: KeyedWindows(key_of), routing, w)
            windows.load({b: table})
            assert list(windows.value) == [15]
            rows = windows.value[15]
            assert (routing.routes(stable_hash([key_of(r) for r in rows])) == w).all()
            keyed.update(rows)
        mark = fresh(tracked_watermark, routing, w)
        mark.load(by_name(states, "TumblingWatermark", "watermark"))
        assert mark.pending_times() == [CUT]
        held = fresh(held_watermark, routing, w)
        held.load(by_name(states, "AssignWatermarks", "watermark"))
        assert held.pending_times() == [CUT]
    assert keyed == Counter(r for w in range(2) for r in data(w, range(0, CUT)) if r[0] >= 10)
    for w, (states, _) in enumerate(results):  # forward_watermarks: only its tracker
        mark = fresh(tracked_watermark, routing, w)
        mark.load(by_name(states, "ForwardWatermarks", "watermark"))
        assert mark.pending_times() == [CUT] and mark.value.latest == [CUT, CUT]
    local = fresh(lambda: open_windows(tokens=False), routing, 0)
    local.load(by_name(results[0][0], "TumblingWatermarkLocal", "windows"))
    assert local.pending_times() == [] and list(local.value) == [15]


@pytest.mark.parametrize("workers", [1, 3])
def test_restored_job_finishes_the_open_windows(tmp_path: Any, workers: int) -> None:
    """Snapshot at ``CUT`` on 2 workers, restored at ``workers``: before + after equals an
    uninterrupted run, for every operator."""
    results = run_until_cut(2)
    parts = [write_worker_part(tmp_path, job=NAME, epoch=CUT, worker=w, bins=OLD.bins,
                               states=states) for w, (states, _) in enumerate(results)]
    commit_snapshot(tmp_path, job=NAME, epoch=CUT, bins=OLD.bins, routing=OLD, parts=parts)
    rest = [r for w in range(2) for r in data(w, range(CUT, END))]

    def resumed(worker: Any) -> Any:
        inp, _, captures = worker.dataflow(build)
        inp.advance_to(CUT)
        feed(worker, inp, rest[worker.index::worker.peers])
        inp.close()
        return captures

    after = execute(resumed, workers=workers, restore=str(tmp_path), name=NAME)

    def whole(worker: Any) -> Any:
        inp, _, captures = worker.dataflow(build)
        feed(worker, inp, data(worker.index, range(0, CUT)) + data(worker.index, range(CUT, END)))
        inp.close()
        return captures

    full = execute(whole, workers=2)
    for op in range(5):
        expected = sum((outputs(c)[op] for c in full), Counter())
        got = sum((sent[op] for _, sent in results), Counter()) + \
            sum((outputs(c)[op] for c in after), Counter())
        assert len(expected) > 10
        assert got == expected, f"operator {op}"
