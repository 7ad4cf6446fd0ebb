"""The control plane's snapshot rounds: replies to an abandoned round are never mistaken for
the current one's, a failed round leaves the job running, and asynchronous snapshots resume
the job before their files are written."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from recovery_jobs import NAME, committed_rows, wordcount, words_table

from tokenflow import execute
from tokenflow.control import ControlError, take_snapshot
from tokenflow.job import start
from tokenflow.state.snapshot import Snapshot, committed_epochs


@pytest.fixture(scope="module")
def table():
    return words_table(epochs=40, rows=6000)


@pytest.fixture(scope="module")
def expected(table, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    execute(wordcount(table, str(out)), workers=2, name=NAME)
    return committed_rows(out)


def test_a_failed_round_leaves_the_job_running_and_stale_replies_are_ignored(
        tmp_path: Path, table, expected) -> None:
    handle = start(wordcount(table, str(tmp_path / "out"), pace=0.003), workers=2, name=NAME)
    workers = [0, 1]
    with pytest.raises(ControlError, match="within"):
        # no worker can answer in a microsecond: the round fails and is abandoned
        take_snapshot(handle.hub, workers, str(tmp_path / "snap"), NAME, handle.spec.table,
                      stop=False, timeout=1e-6, alive=lambda: handle.running)
    # a reply that looks right but belongs to no round
    handle.hub.replies.put({"kind": "held", "worker": 0, "point": 10**9, "granularity": 1,
                            "round": -1})
    epoch = take_snapshot(handle.hub, workers, str(tmp_path / "snap"), NAME, handle.spec.table,
                          stop=False, alive=lambda: handle.running)
    assert epoch is not None and epoch < 10**9  # the stale 'held' was not taken
    handle.result(timeout=120)
    assert committed_epochs(tmp_path / "snap") == [epoch]
    assert committed_rows(tmp_path / "out") == expected


def test_snapshots_build_on_the_previous_one(tmp_path: Path, table) -> None:
    handle = start(wordcount(table, str(tmp_path / "out"), pace=0.02), workers=2, name=NAME)
    stats: list = []
    first = take_snapshot(handle.hub, [0, 1], str(tmp_path / "snap"), NAME, handle.spec.table,
                          stop=False, alive=lambda: handle.running, stats=stats)
    time.sleep(0.2)  # the sources move on meanwhile (the job takes about 0.6 s)
    again = take_snapshot(handle.hub, [0, 1], str(tmp_path / "snap"), NAME, handle.spec.table,
                          stop=False, alive=lambda: handle.running, previous=first, stats=stats)
    handle.result(timeout=120)
    assert first is not None and again is not None
    assert again > first
    assert stats[1].bytes_reused > 0  # word counts of words not seen since are referenced
    assert stats[1].phases["captured"] <= stats[1].phases["written"]
    Snapshot.open(tmp_path / "snap", again).verify()


def test_a_written_reply_may_overtake_a_slower_workers_capture() -> None:
    """Worker 0 captures, writes and reports ``written`` before worker 1 reports ``captured``:
    the round goes on (a race the recovery benchmark hit in 21 of 394 checkpoints)."""
    from tokenflow.control import QueueHub, gather

    hub = QueueHub(2)
    for message in ({"kind": "captured", "worker": 0}, {"kind": "written", "worker": 0},
                    {"kind": "captured", "worker": 1}, {"kind": "written", "worker": 1}):
        hub.replies.put({**message, "round": 7})
    stash: list = []
    assert sorted(gather(hub, "captured", [0, 1], 5.0, None, 7, stash)) == [0, 1]
    assert sorted(gather(hub, "written", [0, 1], 5.0, None, 7, stash)) == [0, 1]
    hub.replies.put({"kind": "idle", "worker": 0, "round": 7})
    with pytest.raises(ControlError, match="expected 'captured'"):
        gather(hub, "captured", [0], 5.0, None, 7, [])


class _NobodyConnects:
    """A coordinator no worker ever connects to."""

    def connected(self) -> set[int]:
        return set()

    def send(self, worker: int, message: dict) -> None:
        raise AssertionError("nothing is sent to a worker that never connected")


def test_a_command_waits_for_an_unconnected_worker_only_as_long_as_its_own_timeout() -> None:
    """``JobHandle.rescale(timeout=0.3)`` on a job whose worker 0 never connects fails after
    about 0.3 s naming the command's timeout, not after the hub's 60 s connect timeout; a
    send outside any command still waits ``connect_timeout``."""
    import threading

    from tokenflow.control import CoordinatorHub, command_deadline
    from tokenflow.job import JobHandle, JobSpec

    hub = CoordinatorHub(_NobodyConnects(), connect_timeout=60.0)
    ended = threading.Event()
    handle = JobHandle(JobSpec(name="nobody", routing={}), 2, hub, run=lambda: [ended.wait(30)])
    try:
        began = time.monotonic()
        with pytest.raises(ControlError, match=r"worker 0 did not connect .*command's timeout"):
            handle.rescale(2, timeout=0.3)
        assert time.monotonic() - began < 5.0
    finally:
        ended.set()
        handle.wait(5.0)

    quick = CoordinatorHub(_NobodyConnects(), connect_timeout=0.2)
    with pytest.raises(ControlError, match=r"within 0\.2 s$"):
        quick.send(1, {"kind": "x"})
    # nested blocks keep the earlier deadline; another thread's block does not apply here
    slow = CoordinatorHub(_NobodyConnects(), connect_timeout=60.0)
    began = time.monotonic()
    with command_deadline(0.3), command_deadline(30.0), pytest.raises(ControlError):
        slow.send(0, {"kind": "x"})
    assert time.monotonic() - began < 5.0
    other: list[float] = []

    def elsewhere() -> None:
        with command_deadline(0.1):
            time.sleep(0.5)
            other.append(1.0)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    began = time.monotonic()
    with pytest.raises(ControlError, match=r"within 0\.6 s$"):
        CoordinatorHub(_NobodyConnects(), connect_timeout=0.6).send(0, {"kind": "x"})
    assert time.monotonic() - began >= 0.55
    thread.join()
    assert other == [1.0]


def test_a_worker_is_parked_only_while_it_waits_with_nothing_to_run() -> None:
    """``Worker.parked`` is what a checkpoint's writer waits for (``_WhenParked``)."""
    from tokenflow.comm.manual import ManualAllocator, ManualFabric
    from tokenflow.worker import Worker

    seen: list[bool] = []

    class Watching(ManualAllocator):
        def park(self, timeout: float) -> None:
            seen.append(worker.parked)

    worker = Worker(Watching(ManualFabric(1), 0))
    worker.dataflow(lambda scope: scope.new_input()[0])  # running: a worker parks only then
    while worker.step_or_park(0.0) and not seen:
        pass  # the dataflow's first steps run its operators
    assert seen == [True] and not worker.parked
    worker.activations.activate((0,))
    worker.step_or_park(0.0)  # something to run: no park
    assert seen == [True] and not worker.parked
    # a thread waiting for the park wakes when it comes, not at its timeout
    import threading

    woke: list[float] = []
    waiter = threading.Thread(target=lambda: woke.append(
        (worker.wait_parked(30.0), time.monotonic())[1]))
    waiter.start()
    time.sleep(0.2)  # the waiter is blocked on the event by now (or sees the park at once)
    parked_at = time.monotonic()
    worker.step_or_park(0.0)
    waiter.join(10)
    assert woke and woke[0] - parked_at < 10.0
    assert not worker.wait_parked(0.01)  # no longer parked


def test_a_writer_waits_for_its_worker_to_park_but_not_longer_than_its_bounds(monkeypatch) -> None:
    """Before a piece of a checkpoint's write: at once when the worker is parked; else until
    it parks, or ``WRITER_WAIT`` has passed; and over a whole part no longer than
    ``WRITER_WAIT_TOTAL`` (a worker that never parks still gets its part written)."""
    import tokenflow.control as control

    class Busy:
        parked = False

        def wait_parked(self, timeout: float) -> bool:
            if not self.parked:
                time.sleep(timeout)
            return self.parked

    monkeypatch.setattr(control, "WRITER_PIECE", 0.0)
    monkeypatch.setattr(control, "WRITER_WAIT", 0.05)
    monkeypatch.setattr(control, "WRITER_WAIT_TOTAL", 30.0)
    began = time.monotonic()
    control._WhenParked(Busy())()
    assert time.monotonic() - began >= 0.05
    idle = Busy()
    idle.parked = True
    monkeypatch.setattr(control, "WRITER_WAIT", 30.0)  # it would wait this long if it waited
    began = time.monotonic()
    control._WhenParked(idle)()
    assert time.monotonic() - began < 5.0
    monkeypatch.setattr(control, "WRITER_WAIT", 0.05)
    monkeypatch.setattr(control, "WRITER_WAIT_TOTAL", 0.1)
    gate, began = control._WhenParked(Busy()), time.monotonic()
    for _ in range(60):  # 3 s of waits without the total bound
        gate()
    assert 0.1 <= time.monotonic() - began < 2.0


def test_sizes_per_bin_pack_within_a_control_frame_and_malformed_ones_are_refused() -> None:
    """``pack_sizes`` / ``unpack_sizes``: the bytes per bin a rescale chooses its bins by, in a
    ``bin_bytes`` reply and a ``rescale`` command.  Up to ``SIZE_ENTRIES`` bins they come back
    as sent (float32); more bins are summed over groups and spread evenly (totals per group
    kept), and every packing fits a control frame (``MAX_REPORT``) as msgpack."""
    import msgpack
    import numpy as np

    from tokenflow.control import SIZE_ENTRIES, pack_sizes, unpack_sizes
    from tokenflow.coordinator import MAX_REPORT

    rng = np.random.default_rng(3)
    for bins in (1, 64, 4096, SIZE_ENTRIES, 1 << 16):
        sizes = np.round(rng.uniform(0, 5000, bins) * (rng.random(bins) < 0.3))
        packed = pack_sizes(sizes)
        assert len(msgpack.packb({"kind": "rescale", "sizes": packed})) < MAX_REPORT
        back = unpack_sizes(msgpack.unpackb(msgpack.packb(packed)), bins)
        group = packed["group"]
        assert group == max(1, bins // SIZE_ENTRIES)
        assert np.allclose(back.reshape(-1, group).sum(axis=1),
                           sizes.reshape(-1, group).sum(axis=1), rtol=1e-6)
        if group == 1:
            assert np.allclose(back, sizes, rtol=1e-6)
    good = pack_sizes(np.ones(64))
    for bad in (None, {}, {"group": 0, "bytes": good["bytes"]},
                {"group": 1, "bytes": good["bytes"][:-4]}, {"group": 3, "bytes": good["bytes"]},
                {"group": 1, "bytes": np.full(64, -1, "<f4").tobytes()},
                {"group": 1, "bytes": np.full(64, np.inf, "<f4").tobytes()},
                {"group": 1, "bytes": "x" * 256}):
        with pytest.raises(ControlError, match="malformed sizes per bin"):
            unpack_sizes(bad, 64)


def test_a_worker_sums_its_operators_bytes_per_bin_unless_one_is_unweighed() -> None:
    """``bin_bytes`` on a worker: the sum over its migrating operators' states; an operator
    without a state adds nothing; one whose state does not weigh itself (None), or one of
    another bin count, makes the reply unweighed, so the driver sends no sizes (the bins'
    counts decide) rather than a sum that leaves that state's bytes out."""
    from types import SimpleNamespace

    import numpy as np

    from tokenflow.control import _held_bytes

    a = SimpleNamespace(bin_bytes=lambda: np.array([1.0, 0.0, 2.0, 0.0]))
    b = SimpleNamespace(bin_bytes=lambda: np.array([0.0, 3.0, 1.0, 0.0]))
    none = SimpleNamespace(bin_bytes=None)
    unweighed = SimpleNamespace(bin_bytes=lambda: None)
    sizes, weighed = _held_bytes([a, none, b])
    assert weighed and sizes is not None and sizes.tolist() == [1.0, 3.0, 3.0, 0.0]
    assert _held_bytes([none]) == (None, True)
    assert _held_bytes([a, unweighed])[1] is False
    other_table = SimpleNamespace(bin_bytes=lambda: np.ones(8))
    assert _held_bytes([a, other_table]) == (None, False)


class _OneWorkerGone:
    """A hub whose worker 0 answers ``bin_bytes`` and whose worker 1 has returned."""

    def __init__(self) -> None:
        self.replies: list[dict] = []

    def send(self, worker: int, message: dict) -> None:
        if worker == 0 and message["kind"] == "bin_bytes":
            from tokenflow.control import pack_sizes

            self.replies.append({"kind": "bin_bytes", "worker": 0, "round": message["round"],
                                 "weighed": True, "bins": 4,
                                 "sizes": pack_sizes(np.array([1.0, 2.0, 0.0, 0.0]))})

    def receive(self, timeout: float) -> dict | None:
        if self.replies:
            return self.replies.pop(0)
        time.sleep(timeout)
        return None

    def gone(self) -> set[int]:
        return {1}

    def started(self) -> set[int]:
        return {0, 1}


def test_bytes_per_bin_are_not_awaited_from_a_worker_that_returned() -> None:
    """A worker that returned answers no ``bin_bytes``: the driver leaves the choice to the
    bins' counts at once (no sizes) instead of waiting out ``SIZES_TIMEOUT``."""
    import threading

    from tokenflow.job import SIZES_TIMEOUT, JobHandle, JobSpec

    ended = threading.Event()
    handle = JobHandle(JobSpec(name="gone", routing={}), 2, _OneWorkerGone(),
                       run=lambda: [ended.wait(30)])
    try:
        began = time.monotonic()
        assert handle._bin_bytes(SIZES_TIMEOUT) is None
        assert time.monotonic() - began < SIZES_TIMEOUT / 2
    finally:
        ended.set()
        handle.wait(5.0)
