"""Changed-bin tracking: a checkpoint exports only the bins a state changed since the last
committed one and references the others, and what it commits is what exporting everything
would have committed — through failed rounds, restores (at the same or another worker
count), Megaphone-style bin moves (``KeyedState.take`` / ``load``) and pruning (keep=2).

The property test drives the real worker side (``ControlAgent._capture``: ``ChangeLog`` and
the background part writer) and the driver's commit and prune, against an oracle: a deep copy
of every worker's state taken at each capture."""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tokenflow.control import ControlAgent
from tokenflow.dataflow.state import KeyedState, LocalState, TrackedDict, key_bins, unpickled
from tokenflow.state import RoutingTable, Snapshot, commit_snapshot, prune
from tokenflow.state.changes import Capture, ChangeLog
from tokenflow.state.snapshot import WorkerPart, write_worker_part

BINS = 16
JOB = "changed-bins"
KEYED = "0:Op/keys"
LOCAL = "0:Op/local"
KEYS = [*range(40), *(f"k{i}" for i in range(20))]


# -- KeyedState's own tracking ---------------------------------------------------------------


def attached() -> KeyedState[Any, Any]:
    state: KeyedState[Any, Any] = KeyedState()
    state.attach(BINS, 0)
    return state


def bin_of(key: Any) -> int:
    return int(key_bins([key], BINS)[0])


def test_reads_writes_and_deletes_mark_their_bins() -> None:
    state = attached()
    for k in range(10):
        state[k] = [k]
    assert state.take_changes() == {bin_of(k) for k in range(10)}
    assert state.take_changes() == set()
    state[3].append(1)  # a read (the value may be mutated in place)
    assert state.take_changes() == {bin_of(3)}
    del state[4]
    state.data.pop(5)
    assert state.take_changes() == {bin_of(4), bin_of(5)}
    assert 6 in state and len(state) == 8 and sorted(state) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert state.take_changes() == set()  # membership, len and iteration are no change
    state.data.setdefault(11, []).append(2)
    state.data.update({12: []})
    assert state.take_changes() == {bin_of(11), bin_of(12)}
    list(state.data.values())
    assert state.take_changes() == {bin_of(k) for k in state}


def test_export_of_some_bins_equals_the_full_export_of_those_bins() -> None:
    state = attached()
    for k in KEYS:
        state[k] = k
    full = state.export()
    some = sorted(full)[::3]
    part = state.export(some)
    assert sorted(part) == some
    for b in some:
        assert unpickled(part[b]) == unpickled(full[b])
    assert {k for b in full for k in unpickled(full[b])[0]} == set(KEYS)


def test_resolve_calls_between_before_each_state_export() -> None:
    """A checkpoint writer's exports are separate pieces: ``between`` runs before each one,
    so the writer can yield to its worker (``tokenflow.control``) between states."""
    events: list[str] = []
    capture = Capture(later={
        name: (lambda name=name: events.append(f"export {name}") or {})  # type: ignore[misc]
        for name in ("a", "b", "c")})
    capture.resolve(lambda: events.append("between"))
    assert events == ["between", "export a", "between", "export b", "between", "export c"]
    assert capture.later == {} and sorted(capture.tables) == ["a", "b", "c"]


def test_take_load_discard_and_restore_marks() -> None:
    a, b = attached(), attached()
    for k in KEYS:
        a[k] = k
    a.take_changes()
    moved = sorted(a.export())[:2]
    tables = a.take(moved)
    assert sorted(tables) == moved
    assert a.take_changes() == set(moved)
    b.load(tables)
    assert b.take_changes() == set(moved)
    assert {k for k in b} == {k for k in KEYS if bin_of(k) in moved}
    assert not any(bin_of(k) in moved for k in a)
    b.discard([moved[0]])
    assert b.take_changes() == {moved[0]}
    c = attached()
    c.load(a.export())
    c.mark_unchanged()
    assert c.take_changes() == set() and dict(c.data) == dict(a.data)


def test_the_touched_record_stays_bounded() -> None:
    state = attached()
    state.data.limit = 100  # (raised to 65,536 at the first fold)
    for k in range(200_000):
        state[k] = k
        del state[k]
    assert len(state.data.touched) <= 2 * (1 << 16)
    assert state.take_changes()  # the folded bins still count as changed
    assert len(state) == 0 and state.export() == {}


def test_attach_after_filling_reindexes_under_the_new_bin_count() -> None:
    state: KeyedState[Any, Any] = KeyedState()
    for k in KEYS:
        state[k] = k
    state.export()  # indexed under one bin (not attached)
    state.attach(BINS, 0)
    parts = state.export()
    for b, table in parts.items():
        assert all(bin_of(k) == b for k in unpickled(table)[0])


def test_tracked_dict_pickles_its_items_and_marks() -> None:
    import pickle

    data: TrackedDict[str, int] = TrackedDict({"a": 1})
    assert data.touched == set()
    data["b"] = 2
    again = pickle.loads(pickle.dumps(data))
    assert type(again) is TrackedDict
    assert dict(again) == {"a": 1, "b": 2} and again.touched == {"b"}


# -- the writer's contract -------------------------------------------------------------------


def test_writer_refuses_changed_bins_without_previous_entries(tmp_path: Any) -> None:
    states = {"s": {1: pa.table({"x": [1]})}}
    with pytest.raises(ValueError, match="without its previous"):
        write_worker_part(tmp_path, job=JOB, epoch=1, worker=0, bins=BINS, states=states,
                          changed={"s": {1}})
    first = write_worker_part(tmp_path, job=JOB, epoch=1, worker=0, bins=BINS, states=states)
    with pytest.raises(ValueError, match="not marked changed"):
        write_worker_part(tmp_path, job=JOB, epoch=2, worker=0, bins=BINS, states=states,
                          previous=first.entries, changed={"s": {2}})


def test_change_log_keeps_the_marks_of_uncommitted_captures() -> None:
    state = attached()
    log = ChangeLog()
    base = {KEYED: {}}
    state[1] = 1
    first = log.capture({KEYED: state}, 5, None, None)
    assert first.changed[KEYED] is None  # no base: full
    state[2] = 2
    second = log.capture({KEYED: state}, 6, 5, base)  # built on 5 (committed)
    assert second.changed[KEYED] == {bin_of(2)}
    state[3] = 3
    third = log.capture({KEYED: state}, 7, 5, base)  # 6 was never committed
    assert third.changed[KEYED] == {bin_of(2), bin_of(3)}
    fourth = log.capture({KEYED: state}, 8, 7, base)
    assert fourth.changed[KEYED] == set() and fourth.tables[KEYED] == {}


# -- the property test -----------------------------------------------------------------------


class FakeLink:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(dict(message))

    def poll(self, timeout: float | None = 0.0) -> dict[str, Any] | None:
        return None


class FakeWorker:
    def __init__(self, index: int, routing: RoutingTable, restore: Snapshot | None) -> None:
        self.index = index
        self.routing = routing
        self.restore = restore
        self.sources: dict[str, Any] = {}
        owned = routing.owned_by(index)
        home = int(owned[0]) if len(owned) else -1
        keyed: KeyedState[Any, Any] = KeyedState()
        local: LocalState[set[Any]] = LocalState(set, lambda a, b: a | b)
        self.states: dict[str, Any] = {KEYED: keyed, LOCAL: local}
        for key, state in self.states.items():
            state.attach(BINS, home)
            if restore is not None:
                state.load(restore.read(key, owned.tolist()))
                state.mark_unchanged()
        self.link = FakeLink()
        self.agent = ControlAgent(self.link)

    @property
    def keyed(self) -> KeyedState[Any, Any]:
        return self.states[KEYED]  # type: ignore[no-any-return]


def snapshot_contents(root: str, epoch: int) -> tuple[dict[Any, Any], set[Any]]:
    """Every key -> value of the keyed state (each key checked to sit in its own bin) and the
    union of the local sets, as committed at ``epoch``."""
    snapshot = Snapshot.open(root, epoch, job=JOB, bins=BINS)
    snapshot.verify()
    keyed: dict[Any, Any] = {}
    for b, table in snapshot.read(KEYED, range(BINS)).items():
        for mapping in unpickled(table):
            assert all(bin_of(k) == b for k in mapping)
            assert not set(mapping) & set(keyed)
            keyed.update(mapping)
    local: set[Any] = set()
    for table in snapshot.read(LOCAL, range(BINS)).values():
        for value in unpickled(table):
            local |= value
    return keyed, local


class Job:
    """Workers, the committed checkpoints' oracle and the driver's ``previous``."""

    def __init__(self, root: str, workers: int) -> None:
        self.root = root
        self.routing = RoutingTable.even(workers, BINS)
        self.workers = [FakeWorker(w, self.routing, None) for w in range(workers)]
        self.previous: int | None = None
        self.epoch = 0
        self.oracle: dict[int, tuple[dict[Any, Any], set[Any]]] = {}
        self.touched: set[int] = set()  # bins changed since the last committed checkpoint
        self.blocker = os.path.join(root, "blocker")
        with open(self.blocker, "w") as handle:
            handle.write("a file: a part cannot be written under it")

    def owner(self, key: Any) -> FakeWorker:
        return self.workers[self.routing.owner(bin_of(key))]

    def contents(self) -> tuple[dict[Any, Any], set[Any]]:
        keyed: dict[Any, Any] = {}
        local: set[Any] = set()
        for w in self.workers:
            keyed.update(copy.deepcopy(dict(dict.items(w.keyed.data))))
            local |= w.states[LOCAL].value
        return keyed, local

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "put":
            _, key, value = op
            self.owner(key).keyed[key] = [value]
            self.touched.add(bin_of(key))
        elif kind == "mutate":  # in place, after a read through the state or its dict
            _, key, value = op
            state = self.owner(key).keyed
            if key in state:
                (state[key] if value % 2 else state.data.get(key)).append(value)
                self.touched.add(bin_of(key))
        elif kind == "delete":
            _, key = op
            state = self.owner(key).keyed
            if key in state:
                del state[key]
                self.touched.add(bin_of(key))
        elif kind == "local":
            _, worker, value = op
            self.workers[worker % len(self.workers)].states[LOCAL].value.add(value)
        elif kind == "move":  # Megaphone: the old owner takes the bin, the new one loads it
            _, b, to = op
            to %= len(self.workers)
            old = self.routing.owner(b)
            if old != to and len(self.routing.owned_by(old)) > 1:  # everyone keeps a bin
                tables = self.workers[old].keyed.take([b])
                self.workers[to].keyed.load(tables)
                owners = self.routing.owners.copy()
                owners[b] = to
                self.routing = RoutingTable(owners, self.routing.roster)
                for w in self.workers:
                    w.routing = self.routing
                self.touched.add(b)
        elif kind == "checkpoint":
            self.checkpoint(op[1])
        elif kind == "restore":
            self.restore(op[1])

    def checkpoint(self, failure: str | None) -> None:
        self.epoch += 1
        epoch = self.epoch
        expected = self.contents()
        parts, failed = [], False
        for w in self.workers:
            root = self.blocker if failure == f"write{w.index}" else self.root
            message = {"kind": "snapshot", "root": root, "job": JOB, "epoch": epoch,
                       "previous": self.previous}
            w.agent._capture(w, message)
            w.agent.finish()
            captured, reply = w.link.sent[-2], w.link.sent[-1]
            assert captured["kind"] == "captured"
            if reply["kind"] != "written":
                failed = True
                continue
            if captured["full"] == 1:  # the keyed state's capture was incremental: it
                # exported only bins changed since the last committed checkpoint
                exported = reply["bins_exported"] - len(w.states[LOCAL].export())
                assert exported <= len(self.touched)
            parts.append(WorkerPart(w.index, reply["index_path"], int(reply["crc32"]),
                                    int(reply["bytes_written"])))
        if failed or failure == "commit":
            return  # the driver does not commit: previous stays, the marks must survive
        commit_snapshot(self.root, job=JOB, epoch=epoch, bins=BINS, routing=self.routing,
                        parts=parts)
        self.previous = epoch
        self.oracle[epoch] = expected
        self.touched = set()
        prune(self.root, keep=2)
        assert snapshot_contents(self.root, epoch) == expected

    def restore(self, workers: int) -> None:
        if self.previous is None:
            return
        snapshot = Snapshot.open(self.root, job=JOB, bins=BINS)
        assert snapshot.epoch == self.previous
        count = workers or len(snapshot.workers)
        self.routing = snapshot.routing if count == len(snapshot.workers) else \
            RoutingTable.even(count, BINS)
        self.workers = [FakeWorker(w, self.routing, snapshot) for w in range(count)]
        assert self.contents() == self.oracle[snapshot.epoch]
        self.touched = set()


keys = st.sampled_from([*range(8), "k0", "k1", "k2", "k3"])  # few: ops meet on keys
operations = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, st.integers(0, 9)),
    st.tuples(st.just("mutate"), keys, st.integers(0, 9)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("local"), st.integers(0, 3), st.integers(0, 5)),
    st.tuples(st.just("move"), st.integers(0, BINS - 1), st.integers(0, 3)),
    st.tuples(st.just("checkpoint"), st.sampled_from([None, None, None, "commit", "write0",
                                                       "write1"])),
    st.tuples(st.just("restore"), st.sampled_from([0, 0, 1, 2, 3])),
), max_size=60)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(1, 3))
# always tried: a value mutated in place after a read through ``data.get``; changes before a
# round whose commit failed, or whose part could not be written; a restore, then changes;
# a bin moved, then a failed round
@example([("put", 3, 1), ("checkpoint", None), ("mutate", 3, 2), ("checkpoint", None)], 2)
@example([("put", 3, 1), ("checkpoint", None), ("put", 3, 2), ("checkpoint", "commit"),
          ("checkpoint", None)], 2)
@example([("put", 1, 1), ("put", 2, 1), ("checkpoint", None), ("put", 1, 2), ("put", 2, 2),
          ("checkpoint", "write0"), ("checkpoint", "write1"), ("checkpoint", None)], 2)
@example([("put", 5, 1), ("checkpoint", None), ("restore", 0), ("put", 5, 3),
          ("checkpoint", None), ("restore", 0)], 2)
@example([("put", "k1", 1), ("checkpoint", None), ("move", 0, 1), ("move", 15, 0),
          ("put", "k1", 2), ("checkpoint", "commit"), ("restore", 3), ("checkpoint", None)], 2)
def test_incremental_checkpoints_commit_what_a_full_export_would(ops: list[tuple[Any, ...]],
                                                                 workers: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        job = Job(root, workers)
        for op in [*ops, ("checkpoint", None), ("restore", 0), ("checkpoint", None)]:
            job.apply(op)
        assert job.previous is not None
        assert snapshot_contents(root, job.previous) == job.contents()


def test_a_pickled_keyed_state_keeps_tracking() -> None:
    import pickle

    state = attached()
    state[1] = 1
    again = pickle.loads(pickle.dumps(state))
    assert dict(again.data) == {1: 1}
    assert again.take_changes() == {bin_of(1)}
    again.data.limit = 0
    again[2] = 2  # over the limit: folded at once
    assert not again.data.touched and again.take_changes() == {bin_of(2)}


def test_the_writer_runs_deferred_exports_with_a_short_switch_interval(tmp_path: Path) -> None:
    """A capture reads a columnar state's rows and leaves its split into bins to the part's
    writer thread (``export_later``); that thread runs with the short switch interval (so the
    worker's thread gets the GIL back within it) and the process's interval is restored after
    the write, whatever it was."""
    from tokenflow.control import WRITER_SWITCH_INTERVAL

    seen: dict[str, Any] = {}

    class Recording(LocalState[set[Any]]):
        def export_later(self, bins: Any = None) -> Any:
            def export() -> dict[int, pa.Table]:
                seen["thread"] = threading.current_thread().name
                seen["interval"] = sys.getswitchinterval()
                return {}
            return export

    worker = FakeWorker(0, RoutingTable.even(1, BINS), None)
    worker.states[LOCAL] = Recording(set, lambda a, b: a | b)
    worker.states[LOCAL].attach(BINS, 0)
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        worker.agent._capture(worker, {"kind": "snapshot", "root": str(tmp_path), "job": JOB,
                                       "epoch": 3, "previous": None})
        worker.agent.finish()
        assert worker.link.sent[-1]["kind"] == "written", worker.link.sent[-1]
        assert seen["thread"] != threading.current_thread().name
        assert seen["interval"] == WRITER_SWITCH_INTERVAL < 0.004
        assert sys.getswitchinterval() == 0.004
    finally:
        sys.setswitchinterval(before)
