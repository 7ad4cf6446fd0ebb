"""``tokenflow.io.inputlog``: the durable input log of ``InputHandle`` loops.

Oracles are the batches the tests append (Python lists and Arrow data, compared by value and
type), hand-computed replay ranges (which epochs every worker of a run sealed), and files the
tests damage themselves (a flipped byte, a cut-off tail, another job's file).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tokenflow.io.inputlog import END, InputLog, InputLogError, truncate

JOB = "tests.inputlog"
KEY = "0.1:words"


def logs(root: Path, peers: int, run: str | None = None, job: str = JOB) -> list[InputLog]:
    return [InputLog(root, job, w, peers=peers, run=run) for w in range(peers)]


def batches_of(worker: int, epoch: int) -> list[Any]:
    """Three kinds of batches, distinct per worker and epoch."""
    return [
        [f"w{worker}e{epoch}a", (worker, epoch), {"k": [1, 2]}],
        pa.record_batch({"x": pa.array([epoch, worker], pa.int64()), "s": ["a", None]}),
        pa.table({"y": pa.array([worker * 1.5], pa.float64())}),
    ]


def same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if type(x) is not type(y):
            return False
        if isinstance(x, pa.RecordBatch | pa.Table):
            if not x.equals(y):
                return False
        elif x != y:
            return False
    return True


def test_round_trip_lists_and_arrow(tmp_path: Path) -> None:
    written = logs(tmp_path, 2)
    for epoch in range(3):
        for w, log in enumerate(written):
            log.append(KEY, epoch, batches_of(w, epoch)[:1])
            log.append(KEY, epoch, batches_of(w, epoch)[1:])
            log.seal(KEY, epoch)
    reader = InputLog(tmp_path, JOB, 0, peers=1)  # one worker replays both old workers
    got = reader.read(KEY, 0)
    assert list(got) == [0, 1, 2]
    for epoch in range(3):
        assert same(got[epoch], batches_of(0, epoch) + batches_of(1, epoch))
    assert reader.last_sealed(KEY) == 2
    plan = reader.replay(KEY, 1)
    assert (plan.since, plan.until, plan.last, plan.epochs) == (1, 3, 2, [1, 2])


def test_appended_lists_are_logged_as_they_were(tmp_path: Path) -> None:
    log = InputLog(tmp_path, JOB, 0, peers=1)
    batch = ["a", "b"]
    log.append(KEY, 0, [batch])
    batch.append("changed later")  # pickled at append: not logged
    log.seal(KEY, 0)
    assert log.read(KEY, 0) == {0: [["a", "b"]]}


def test_empty_epochs_gaps_and_the_end(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.seal(KEY, 0)                         # an empty epoch, sealed
    log.append(KEY, 1, [["x"]])
    log.seal(KEY, 1, until=5)                # moved 1 -> 5: epochs 2..4 are empty
    log.append(KEY, 5, [["y"]])
    assert log.replay(KEY, 0).until == 5     # epoch 5 is not sealed yet
    log.seal_last(KEY, 5)                    # closed at 5: every later epoch is empty
    plan = log.replay(KEY, 0)
    assert plan.ended and plan.until is None and plan.last == 5
    assert log.read(KEY, 0) == {0: [], 1: [["x"]], 5: [["y"]]}
    assert log.read(KEY, 3) == {5: [["y"]]}  # 3 is inside the sealed gap
    assert log.replay(KEY, 7).ended          # after the end: logged as empty
    with pytest.raises(InputLogError, match="already sealed"):
        log.append(KEY, 9, [["z"]])


def test_epoch_sealed_by_some_workers_only_is_not_replayed(tmp_path: Path) -> None:
    w0, w1 = logs(tmp_path, 2)
    for epoch in range(3):
        w0.append(KEY, epoch, [[f"a{epoch}"]])
        w0.seal(KEY, epoch)
    for epoch in range(2):
        w1.append(KEY, epoch, [[f"b{epoch}"]])
        w1.seal(KEY, epoch)
    w1.append(KEY, 2, [["b2 unsealed"]])  # a crash before worker 1 sealed epoch 2
    reader = InputLog(tmp_path, JOB, 0, peers=1)
    plan = reader.replay(KEY, 0)
    assert plan.until == 2 and plan.last == 1
    assert reader.read(KEY, 0) == {0: [["a0"], ["b0"]], 1: [["a1"], ["b1"]]}
    with pytest.raises(InputLogError, match="already holds epochs 0..1"):
        reader.ensure_fresh(KEY, 0)
    reader.ensure_fresh(KEY, 2)  # nothing logged from 2 on


def test_run_with_a_worker_that_sealed_nothing_logged_nothing(tmp_path: Path) -> None:
    w0, _ = logs(tmp_path, 2)  # worker 1 failed before its first seal
    for epoch in range(3):
        w0.append(KEY, epoch, [[f"a{epoch}"]])
        w0.seal(KEY, epoch)
    reader = InputLog(tmp_path, JOB, 0, peers=1)
    assert reader.replay(KEY, 0).until == 0
    assert reader.read(KEY, 0) == {}
    assert reader.last_sealed(KEY) is None


@pytest.mark.parametrize("new", [1, 2, 4])
def test_old_workers_map_to_new_ones_by_index_modulo(tmp_path: Path, new: int) -> None:
    old = logs(tmp_path, 3)
    for w, log in enumerate(old):
        log.append(KEY, 0, [[f"old{w}"]])
        log.seal(KEY, 0)
    shares = [InputLog(tmp_path, JOB, w, peers=new).read(KEY, 0) for w in range(new)]
    for w, share in enumerate(shares):
        expected = [[f"old{o}"] for o in range(3) if o % new == w]
        assert share == ({0: expected} if expected else {})
    assert sorted(b[0] for s in shares for b in s.get(0, [])) == ["old0", "old1", "old2"]


def test_successive_runs_chain_and_the_greatest_tag_wins(tmp_path: Path) -> None:
    first = logs(tmp_path, 2, run="a")
    for epoch in range(5):
        for w, log in enumerate(first):
            log.append(KEY, epoch, [[f"a{w}.{epoch}"]])
            log.seal(KEY, epoch)
    first[0].append(KEY, 5, [["a0.5 partial"]])
    first[0].seal(KEY, 5)  # worker 1 of run a never sealed 5
    second = logs(tmp_path, 3, run="b")  # restarted at 5 with 3 workers
    for epoch in (5, 6):
        for w, log in enumerate(second):
            log.append(KEY, epoch, [[f"b{w}.{epoch}"]])
            log.seal(KEY, epoch)
    reader = InputLog(tmp_path, JOB, 0, peers=1)
    got = reader.read(KEY, 3)
    assert got == {3: [["a0.3"], ["a1.3"]], 4: [["a0.4"], ["a1.4"]],
                   5: [["b0.5"], ["b1.5"], ["b2.5"]], 6: [["b0.6"], ["b1.6"], ["b2.6"]]}
    assert reader.replay(KEY, 3).until == 7
    # a run "c" that logged epoch 4 completely too (cannot happen in the protocol): c > a
    for w, log in enumerate(logs(tmp_path, 1, run="c")):
        log.append(KEY, 4, [[f"c{w}.4"]])
        log.seal(KEY, 4)
    assert reader.read(KEY, 4)[4] == [["c0.4"]]


def test_default_tag_attempt_removes_its_own_stale_seals(tmp_path: Path) -> None:
    first = InputLog(tmp_path, JOB, 0, peers=1)  # default tag: w00001-from<4>
    first.append(KEY, 4, [["old4"]])
    first.seal(KEY, 4)
    first.append(KEY, 5, [["old5"]])
    first.seal(KEY, 5)
    # a second attempt restarting at 4 (e.g. its read happened to stop there) shares the tag
    second = InputLog(tmp_path, JOB, 0, peers=1)
    second.append(KEY, 4, [["new4"]])
    second.seal(KEY, 4, until=6)
    assert [s.epoch for s in second.seals(KEY)] == [4]
    assert second.read(KEY, 4) == {4: [["new4"]]}
    assert second.replay(KEY, 4).until == 6


def test_corrupt_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.append(KEY, 0, batches_of(0, 0))
    path = log.seal(KEY, 0)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x40
    Path(path).write_bytes(bytes(data))
    with pytest.raises(InputLogError, match="crc32") as info:
        log.read(KEY, 0)
    assert path in str(info.value)


@pytest.mark.parametrize("keep", [0, 10, -1, -30])
def test_truncated_file_is_an_error_naming_it(tmp_path: Path, keep: int) -> None:
    (log,) = logs(tmp_path, 1)
    log.append(KEY, 0, batches_of(0, 0))
    path = log.seal(KEY, 0)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(InputLogError, match="truncated") as info:
        log.read(KEY, 0)
    assert path in str(info.value)


def test_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.append(KEY, 0, [["x"]])
    path = log.seal(KEY, 0)
    plan = log.replay(KEY, 0)
    os.unlink(path)
    with pytest.raises(InputLogError) as info:
        plan.batches(0)
    assert path in str(info.value)


def test_foreign_names_are_an_error(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.seal(KEY, 0)
    stray = Path(log.directory(KEY)) / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(InputLogError, match="notes.txt"):
        log.replay(KEY, 0)


def test_another_jobs_log_is_rejected(tmp_path: Path) -> None:
    (log,) = logs(tmp_path / "a", 1)
    log.append(KEY, 0, [["mine"]])
    path = log.seal(KEY, 0)
    with pytest.raises(InputLogError, match="not of 'other'") as info:
        InputLog(tmp_path / "a", "other", 0)
    assert "job.json" in str(info.value)
    # a file of job A copied into job B's log: caught when read
    (other,) = logs(tmp_path / "b", 1, job="other")
    os.makedirs(other.directory(KEY), exist_ok=True)
    shutil.copy(path, other.directory(KEY))
    with pytest.raises(InputLogError, match="job") as info:
        other.read(KEY, 0)
    assert Path(path).name in str(info.value)
    with pytest.raises(InputLogError, match="not of 'other'"):
        truncate(tmp_path / "a", 1, job="other")


def test_file_of_another_input_is_rejected(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.append("0.2:other", 0, [["x"]])
    path = log.seal("0.2:other", 0)
    os.makedirs(log.directory(KEY), exist_ok=True)
    shutil.copy(path, log.directory(KEY))
    with pytest.raises(InputLogError, match="input '0.2:other'"):
        log.read(KEY, 0)


def test_truncate_removes_only_epochs_before_the_checkpoint(tmp_path: Path) -> None:
    w0, w1 = logs(tmp_path, 2)
    for epoch in range(6):
        for w, log in enumerate((w0, w1)):
            if w == 1 and epoch == 2:
                continue
            if w == 1 and epoch == 1:
                log.append(KEY, 1, [["b1"]])
                log.seal(KEY, 1, until=3)  # worker 1 went from 1 straight to 3
                continue
            log.append(KEY, epoch, [[f"{w}.{epoch}"]])
            log.seal(KEY, epoch)
    before = {s.epoch: s for s in w0.seals(KEY) if s.worker == 1}
    removed = truncate(tmp_path, 2, job=JOB)
    assert removed == 3  # worker 0's epochs 0, 1 and worker 1's epoch 0
    left = {(s.worker, s.epoch) for s in w0.seals(KEY)}
    assert left == {(0, 2), (0, 3), (0, 4), (0, 5), (1, 1), (1, 3), (1, 4), (1, 5)}
    assert before[1].until == 3  # kept: it says epoch 2 is empty for worker 1
    reader = InputLog(tmp_path, JOB, 0, peers=1)
    assert reader.read(KEY, 2) == {2: [["0.2"]], 3: [["0.3"], ["1.3"]], 4: [["0.4"], ["1.4"]],
                                   5: [["0.5"], ["1.5"]]}
    assert reader.replay(KEY, 0).until == 0  # epochs 0, 1 are gone
    assert truncate(tmp_path, 2) == 0
    assert truncate(tmp_path / "nothing", 5) == 0


def test_out_of_order_use_is_an_error(tmp_path: Path) -> None:
    (log,) = logs(tmp_path, 1)
    log.append(KEY, 3, [["x"]])
    with pytest.raises(InputLogError, match="epoch 3 is unsealed"):
        log.append(KEY, 4, [["y"]])
    with pytest.raises(InputLogError, match="epoch 3 is unsealed"):
        log.seal(KEY, 4)
    log.seal(KEY, 3, until=5)
    with pytest.raises(InputLogError, match="already sealed"):
        log.seal(KEY, 4)
    with pytest.raises(InputLogError, match="until"):
        log.seal(KEY, 6, until=6)
    with pytest.raises(InputLogError, match="ints"):
        log.append(KEY, -1, [])
    unbound = InputLog(tmp_path, JOB, 0)
    with pytest.raises(ValueError, match="bind"):
        unbound.seal(KEY, 7)
    unbound.bind(1)
    with pytest.raises(ValueError, match="bound to 1"):
        unbound.bind(2)
    with pytest.raises(ValueError):
        InputLog(tmp_path, JOB, 0, run="bad tag!")
    assert END > 10 ** 19
