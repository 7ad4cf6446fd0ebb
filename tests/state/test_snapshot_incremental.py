"""Incremental snapshots: unchanged blobs are referenced in the previous snapshot's files, the
reader follows the references, ``prune`` keeps exactly the files still referenced, and a
corrupt referenced file is reported by name."""

import os

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.state import (
    RoutingTable,
    Snapshot,
    SnapshotError,
    commit_snapshot,
    committed_epochs,
    prune,
    snapshot_dir,
    write_worker_part,
)

BINS = 16
JOB = "incremental"


pytestmark = pytest.mark.usefixtures("one_blob_per_bin")  # per-bin blobs reused by checksum


def table(b, version):
    return pa.table({"key": pa.array(range(b * 10, b * 10 + 5), pa.int64()),
                     "version": pa.array([version] * 5, pa.int64())})


def checkpoint(root, epoch, versions, previous, workers=2):
    """Commit a snapshot whose bin ``b`` holds ``table(b, versions[b])``; ``previous`` holds
    each worker's entries of the last committed part (updated in place)."""
    routing = RoutingTable.even(workers, BINS)
    parts = []
    for w in range(workers):
        states = {"s": {b: table(b, versions[b]) for b in routing.owned_by(w).tolist()}}
        part = write_worker_part(root, job=JOB, epoch=epoch, worker=w, bins=BINS, states=states,
                                 previous=previous.get(w))
        parts.append(part)
    commit_snapshot(root, job=JOB, epoch=epoch, bins=BINS, routing=routing, parts=parts)
    for part in parts:
        previous[part.worker] = part.entries
    return parts


def read_versions(root, epoch=None):
    snapshot = Snapshot.open(root, epoch, job=JOB, bins=BINS)
    return {b: t.column("version")[0].as_py() for b, t in snapshot.read("s", range(BINS)).items()}


def test_only_changed_bins_are_written(tmp_path):
    previous: dict = {}
    versions = dict.fromkeys(range(BINS), 0)
    full = checkpoint(tmp_path, 1, versions, previous)
    versions[3] = 1
    versions[12] = 1
    incremental = checkpoint(tmp_path, 2, versions, previous)
    blob = sum(p.bytes_reused for p in incremental) / (BINS - 2)
    assert sum(p.bytes_reused for p in full) == 0
    # 14 unchanged bins referenced, 2 written
    assert sum(p.bytes_reused for p in incremental) == pytest.approx(14 * blob)
    written = os.path.getsize(os.path.join(snapshot_dir(tmp_path, 2), "worker-00000.bins")) + \
        os.path.getsize(os.path.join(snapshot_dir(tmp_path, 2), "worker-00001.bins"))
    assert written == pytest.approx(2 * blob, rel=0.05)
    assert read_versions(tmp_path, 2) == versions
    assert read_versions(tmp_path, 1) == dict.fromkeys(range(BINS), 0)
    Snapshot.open(tmp_path, 2).verify()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sets(st.integers(0, BINS - 1), max_size=5), min_size=1, max_size=6),
       st.integers(1, 3))
def test_any_history_reads_back_and_prunes_to_the_referenced_files(tmp_path_factory, changes, keep):
    root = tmp_path_factory.mktemp("inc")
    previous: dict = {}
    versions = dict.fromkeys(range(BINS), 0)
    checkpoint(root, 0, versions, previous)
    for epoch, changed in enumerate(changes, start=1):
        for b in changed:
            versions[b] = epoch
        checkpoint(root, epoch, versions, previous)
        prune(root, keep=keep)
        assert read_versions(root) == versions  # the oracle: the last values written
        assert committed_epochs(root) == list(range(max(0, epoch - keep + 1), epoch + 1))
        for kept in committed_epochs(root):
            Snapshot.open(root, kept).verify()  # every referenced file still there and intact


def test_a_corrupt_referenced_file_is_named(tmp_path):
    previous: dict = {}
    versions = dict.fromkeys(range(BINS), 0)
    checkpoint(tmp_path, 1, versions, previous)
    versions[0] = 2
    checkpoint(tmp_path, 2, versions, previous)
    old = os.path.join(snapshot_dir(tmp_path, 1), "worker-00001.bins")
    data = bytearray(open(old, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(old, "wb").write(bytes(data))
    with pytest.raises(SnapshotError, match="worker-00001.bins"):
        Snapshot.open(tmp_path, 2).verify()
    with pytest.raises(SnapshotError, match="snapshot-00000000000000000001/worker-00001.bins"):
        Snapshot.open(tmp_path, 2).read("s", range(BINS))


def test_verify_checks_referenced_blobs_by_crc32_without_decoding(tmp_path, monkeypatch):
    """``verify`` reads each blob an incremental snapshot takes from an older file and checks
    its crc32 (naming file, state and bin), without decoding it (the restore decodes)."""
    import json

    from tokenflow.state import snapshot as snapshot_module

    previous: dict = {}
    versions = dict.fromkeys(range(BINS), 0)
    checkpoint(tmp_path, 1, versions, previous)
    versions[0] = 2
    checkpoint(tmp_path, 2, versions, previous)

    def no_decoding(*args, **kwargs):
        raise AssertionError("verify decoded a blob")

    with monkeypatch.context() as patched:
        patched.setattr(snapshot_module.pa.ipc, "open_stream", no_decoding)
        Snapshot.open(tmp_path, 2).verify()

    with open(os.path.join(snapshot_dir(tmp_path, 1), "worker-00001.json")) as f:
        offset, length = json.load(f)["states"]["s"]["9"][:2]
    old = os.path.join(snapshot_dir(tmp_path, 1), "worker-00001.bins")
    data = bytearray(open(old, "rb").read())
    data[offset + length // 2] ^= 0xFF
    open(old, "wb").write(bytes(data))
    with pytest.raises(SnapshotError, match=r"worker-00001\.bins: state 's' bin 9 .*crc32"):
        Snapshot.open(tmp_path, 2).verify()


def test_a_commit_remembers_the_files_its_snapshot_reads(tmp_path, monkeypatch):
    """``prune`` after a commit uses the files the commit found in the indexes it checked
    (the same as ``Snapshot.files``), without opening the snapshot again."""
    import tokenflow.state.snapshot as snapshot

    monkeypatch.setattr(snapshot, "_FILES", {})
    previous: dict = {}
    versions = dict.fromkeys(range(BINS), 0)
    for epoch in range(4):
        versions[epoch] = epoch
        checkpoint(tmp_path, epoch, versions, previous)
        remembered = [f for k, f in snapshot._FILES.items() if k[1] == epoch]
        assert remembered == [frozenset(Snapshot.open(tmp_path, epoch).files())]
        assert (0, 1) in remembered[0] and (epoch, 0) in remembered[0]
    opened: list = []
    real_open = snapshot.Snapshot.open
    monkeypatch.setattr(snapshot.Snapshot, "open", lambda *a, **k: opened.append(a))
    assert prune(tmp_path, keep=2) == [0, 1]
    assert opened == []
    monkeypatch.setattr(snapshot.Snapshot, "open", real_open)
    assert read_versions(tmp_path) == versions
    for kept in (2, 3):
        Snapshot.open(tmp_path, kept).verify()  # the files of epochs 0 and 1 they read stayed
