"""Per-bin state snapshots: round trips, reads that touch only the requested bins, corruption
and crash trials, commit checks, pruning, and other filesystems."""

import json
import os
import pickle
import tempfile
import uuid
import zlib

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.state import (
    RoutingTable,
    Snapshot,
    SnapshotError,
    commit_snapshot,
    committed_epochs,
    delete_snapshot,
    prune,
    snapshot_dir,
    write_worker_part,
)

BINS = 16
JOB = "nexmark-q4"


pytestmark = pytest.mark.usefixtures("one_blob_per_bin")  # the per-bin blobs of a full capture


def ints_table(b, n):
    return pa.table({"key": pa.array(range(b * 100, b * 100 + n), pa.int64()),
                     "value": pa.array([f"v{b}-{i}" for i in range(n)])})


def pickled_table(b, n):
    return pa.table({"blob": pa.array([pickle.dumps((b, i, {"x": [i] * i})) for i in range(n)],
                                      pa.binary())})


def sample_states(routing, worker):
    """Two states with different schemas over ``worker``'s bins; bin 0 of ``ints`` is empty."""
    owned = routing.owned_by(worker).tolist()
    return {f"{JOB}/{worker}/ints": {b: ints_table(b, b % 5) for b in owned},
            f"{JOB}/pickled": {b: pickled_table(b, 1 + b % 3) for b in owned}}


def write_snapshot(root, epoch, workers=2, bins=BINS, job=JOB, states=sample_states, filesystem=None):
    """Write and commit a snapshot; returns its routing table."""
    routing = RoutingTable.even(workers, bins)
    parts = [write_worker_part(root, job=job, epoch=epoch, worker=w, bins=bins,
                               states=states(routing, w), meta={"offset": 10 * w},
                               filesystem=filesystem)
             for w in range(workers)]
    commit_snapshot(root, job=job, epoch=epoch, bins=bins, routing=routing, parts=parts,
                    meta={"sources": [1, 2]}, filesystem=filesystem)
    return routing


def part_path(root, epoch, worker, suffix):
    return os.path.join(snapshot_dir(str(root), epoch), f"worker-{worker:05d}.{suffix}")


def read_index(root, epoch, worker):
    with open(part_path(root, epoch, worker, "json")) as f:
        return json.load(f)


def rewrite_index(root, epoch, worker, index):
    """Write ``index`` as the worker's index and sign it in the manifest (its crc32), as a
    writer that wrote it so would have; returns the index's path."""
    path = part_path(root, epoch, worker, "json")
    data = json.dumps(index).encode()
    with open(path, "wb") as f:
        f.write(data)
    manifest_path = os.path.join(snapshot_dir(str(root), epoch), "MANIFEST.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["parts"][str(worker)] = zlib.crc32(data)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    return path


def blob_entry(root, epoch, worker, state, b):
    """``[offset, length, crc32, rows]`` of one blob, from the worker's index file."""
    with open(part_path(root, epoch, worker, "json")) as f:
        return json.load(f)["states"][state][str(b)]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def assert_tables(got, expected):
    assert sorted(got) == sorted(expected)
    for b, table in expected.items():
        assert got[b].equals(table), b


# -- round trips -----------------------------------------------------------------------------

tables = {
    "ints": lambda draw, n: pa.table({"k": pa.array(draw(st.lists(st.integers(-2**63, 2**63 - 1),
                                                                  min_size=n, max_size=n)),
                                                    pa.int64())}),
    "mixed": lambda draw, n: pa.table({
        "s": pa.array(draw(st.lists(st.text(max_size=8), min_size=n, max_size=n))),
        "f": pa.array(draw(st.lists(st.none() | st.floats(allow_nan=False), min_size=n, max_size=n)),
                      pa.float64())}),
    "pickled": lambda draw, n: pa.table({"b": pa.array(
        [pickle.dumps(x) for x in draw(st.lists(st.tuples(st.integers(), st.text(max_size=4)),
                                                min_size=n, max_size=n))], pa.binary())}),
}


@settings(max_examples=100)  # of the ci profile's 500: ~12 s of file writes at 500 examples
@given(data=st.data())
def test_round_trip_any_subset_of_bins(data):
    with tempfile.TemporaryDirectory() as root:
        round_trip(root, data)


def round_trip(root, data):
    """2-3 workers write random tables of three schemas in random bins; any subset of bins of
    any state reads back exactly as written."""
    workers = data.draw(st.integers(2, 3), label="workers")
    bins = data.draw(st.sampled_from([4, 8, 16]), label="bins")
    routing = RoutingTable.even(workers, bins)
    expected = {}
    for name, make in tables.items():
        chosen = data.draw(st.sets(st.integers(0, bins - 1)), label=f"bins of {name}")
        expected[name] = {b: make(data.draw, data.draw(st.integers(0, 4))) for b in sorted(chosen)}
    parts = []
    for w in range(workers):
        mine = {name: {b: t for b, t in per_bin.items() if routing.owner(b) == w}
                for name, per_bin in expected.items()}
        parts.append(write_worker_part(root, job=JOB, epoch=7, worker=w, bins=bins, states=mine,
                                       meta={"w": w}))
    commit_snapshot(root, job=JOB, epoch=7, bins=bins, routing=routing, parts=parts)
    snap = Snapshot.open(root, job=JOB, bins=bins)
    assert (snap.epoch, snap.workers, snap.routing) == (7, list(range(workers)), routing)
    assert snap.states() == sorted(tables)
    assert [snap.worker_meta(w) for w in range(workers)] == [{"w": w} for w in range(workers)]
    for name, per_bin in expected.items():
        subset = data.draw(st.sets(st.integers(0, bins - 1)), label=f"read {name}")
        want = {b: t for b, t in per_bin.items() if b in subset and t.num_rows}
        assert_tables(snap.read(name, subset), want)
    assert snap.read("no such state", range(bins)) == {}


def test_meta_stored_bytes_and_empty_tables(tmp_path):
    routing = write_snapshot(tmp_path, 5)
    snap = Snapshot.open(tmp_path)
    assert snap.meta == {"sources": [1, 2]} and snap.worker_meta(1) == {"offset": 10}
    state = f"{JOB}/0/ints"
    assert 0 not in snap.read(state, [0])  # an empty table is not stored
    assert snap.stored_bytes(state)[1] == 0  # worker 1 wrote no bins of worker 0's state
    total = snap.stored_bytes()
    assert total == {w: os.path.getsize(part_path(tmp_path, 5, w, "bins")) for w in range(2)}
    assert snap.states() == sorted([f"{JOB}/0/ints", f"{JOB}/1/ints", f"{JOB}/pickled"])
    assert_tables(snap.read(state, range(BINS)),
                  {b: ints_table(b, b % 5) for b in routing.owned_by(0).tolist() if b % 5})
    snap.verify()
    with pytest.raises(KeyError):
        snap.worker_meta(9)


def test_reading_bins_touches_only_their_bytes(tmp_path):
    old = write_snapshot(tmp_path, 1, workers=2)
    new = old.rebalanced(range(3))
    state = f"{JOB}/pickled"
    total = dict.fromkeys(range(2), 0)
    for w in new.roster:
        snap = Snapshot.open(tmp_path)
        owned = new.owned_by(w).tolist()
        got = snap.read(state, owned)
        assert sorted(got) == owned
        expected = dict.fromkeys(range(2), 0)
        for b in owned:
            expected[old.owner(b)] += blob_entry(tmp_path, 1, old.owner(b), state, b)[1]
        assert snap.bytes_read == expected
        for writer, n in expected.items():
            total[writer] += n
    assert total == Snapshot.open(tmp_path).stored_bytes(state)


def test_sparse_bins_within_one_file(tmp_path):
    write_snapshot(tmp_path, 1, workers=2)
    snap = Snapshot.open(tmp_path)
    state = f"{JOB}/pickled"
    wanted = [1, 3, 4, 7]  # all owned by worker 0, with gaps
    got = snap.read(state, wanted)
    assert sorted(got) == wanted
    assert snap.bytes_read == {0: sum(blob_entry(tmp_path, 1, 0, state, b)[1] for b in wanted), 1: 0}


# -- corruption ------------------------------------------------------------------------------


def test_flipped_byte_names_file_state_and_bin(tmp_path):
    write_snapshot(tmp_path, 1)
    state = f"{JOB}/pickled"
    offset, length, _, _ = blob_entry(tmp_path, 1, 0, state, 3)
    path = part_path(tmp_path, 1, 0, "bins")
    flip_byte(path, offset + length // 2)
    snap = Snapshot.open(tmp_path)
    with pytest.raises(SnapshotError) as err:
        snap.read(state, [2, 3, 4])
    message = str(err.value)
    assert path in message and repr(state) in message and "bin 3" in message and "crc32" in message
    assert sorted(snap.read(state, [2, 4])) == [2, 4]
    assert sorted(snap.read(state, range(8, BINS))) == list(range(8, BINS))
    with pytest.raises(SnapshotError, match="blobs of worker 0 are corrupt"):
        snap.verify()


def test_truncated_bins_file(tmp_path):
    write_snapshot(tmp_path, 1)
    state = f"{JOB}/pickled"
    offset, length, _, _ = blob_entry(tmp_path, 1, 1, state, 12)
    path = part_path(tmp_path, 1, 1, "bins")
    truncate(path, offset + length - 1)
    snap = Snapshot.open(tmp_path)
    with pytest.raises(SnapshotError) as err:
        snap.read(state, range(BINS))
    assert path in str(err.value) and "bin 12" in str(err.value) and "truncated" in str(err.value)
    assert sorted(snap.read(state, range(12))) == list(range(12))


def test_missing_bins_file(tmp_path):
    write_snapshot(tmp_path, 1)
    path = part_path(tmp_path, 1, 1, "bins")
    os.remove(path)
    snap = Snapshot.open(tmp_path)
    with pytest.raises(SnapshotError, match="cannot open") as err:
        snap.read(f"{JOB}/pickled", [9])
    assert path in str(err.value)


def test_blob_that_does_not_decode(tmp_path):
    """A blob whose bytes match the index crc32 but are not an IPC stream (indexes and manifest
    rewritten to match) fails to decode, naming the file, state and bin."""
    write_snapshot(tmp_path, 1)
    state = f"{JOB}/pickled"
    offset, length, _, rows = blob_entry(tmp_path, 1, 0, state, 2)
    bins_path = part_path(tmp_path, 1, 0, "bins")
    with open(bins_path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x07" * length)
    index = read_index(tmp_path, 1, 0)
    index["states"][state]["2"] = [offset, length, zlib.crc32(b"\x07" * length), rows]
    rewrite_index(tmp_path, 1, 0, index)
    snap = Snapshot.open(tmp_path)
    with pytest.raises(SnapshotError, match="cannot decode") as err:
        snap.read(state, [1, 2])
    assert bins_path in str(err.value) and "bin 2" in str(err.value)


@pytest.mark.parametrize("entry", [[-1, 10, 0, 1], [True, 10, 0, 1], [0, 1.5, 0, 1], [0, 10, 0],
                                   [0, 10, 0, 1, 2, 3, 4, 5], {"offset": 0}, "0,10,0,1"])
def test_a_malformed_index_entry_under_a_valid_checksum_is_named(tmp_path, entry):
    """Entries are checked one by one for shape and all at once for values: either way the
    error names the file, state and bin."""
    write_snapshot(tmp_path, 1)
    index = read_index(tmp_path, 1, 0)
    state = sorted(index["states"])[0]
    b = sorted(index["states"][state], key=int)[-1]
    index["states"][state][b] = entry
    index_path = rewrite_index(tmp_path, 1, 0, index)
    with pytest.raises(SnapshotError, match=f"state {state!r}: malformed entry for bin '{b}'") as err:
        Snapshot.open(tmp_path)
    assert index_path in str(err.value)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_worker_index_fails_open(tmp_path, damage):
    write_snapshot(tmp_path, 1)
    path = part_path(tmp_path, 1, 1, "json")
    if damage == "truncate":
        truncate(path, os.path.getsize(path) // 2)
    elif damage == "flip":
        flip_byte(path, 40)
    else:
        os.remove(path)
    with pytest.raises(SnapshotError, match="missing" if damage == "delete" else "crc32") as err:
        Snapshot.open(tmp_path)
    assert path in str(err.value)


def test_uncommitted_snapshot_is_skipped(tmp_path):
    write_snapshot(tmp_path, 1)
    write_snapshot(tmp_path, 2)
    manifest = os.path.join(snapshot_dir(str(tmp_path), 2), "MANIFEST.json")
    os.remove(manifest)
    assert committed_epochs(tmp_path) == [1]
    with pytest.raises(SnapshotError, match="not committed") as err:
        Snapshot.open(tmp_path, 2)
    assert manifest in str(err.value)
    with pytest.raises(SnapshotError, match="does not exist"):
        Snapshot.open(tmp_path, 3)
    assert Snapshot.open(tmp_path).epoch == 1
    os.remove(os.path.join(snapshot_dir(str(tmp_path), 1), "MANIFEST.json"))
    with pytest.raises(SnapshotError, match="no committed snapshot"):
        Snapshot.open(tmp_path)


def test_other_job_or_bin_count(tmp_path):
    write_snapshot(tmp_path, 1, job="other")
    assert Snapshot.open(tmp_path, job="other", bins=BINS).job == "other"
    with pytest.raises(SnapshotError, match=f"snapshot of job 'other', expected '{JOB}'") as err:
        Snapshot.open(tmp_path, job=JOB)
    assert "MANIFEST.json" in str(err.value)
    with pytest.raises(SnapshotError, match=f"snapshot of {BINS} bins, expected 4096"):
        Snapshot.open(tmp_path, bins=4096)


@pytest.mark.parametrize("garbage, match", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (lambda m: m.update(format=2), "format 2"),
    (lambda m: m.pop("job"), "'job'"),
    (lambda m: m.update(epoch=9), "manifest of epoch 9"),
    (lambda m: m.update(bins=3), "power of two"),
    (lambda m: m["routing"].update(owners=[[0, 3]]), "malformed routing table"),
    (lambda m: m.update(workers=[0, 1, 2]), "malformed workers"),
    (lambda m: m.update(meta=[]), "'meta'"),
])
def test_garbage_manifest(tmp_path, garbage, match):
    write_snapshot(tmp_path, 1)
    path = os.path.join(snapshot_dir(str(tmp_path), 1), "MANIFEST.json")
    if callable(garbage):
        with open(path) as f:
            document = json.load(f)
        garbage(document)
        garbage = json.dumps(document).encode()
    with open(path, "wb") as f:
        f.write(garbage)
    with pytest.raises(SnapshotError, match=match) as err:
        Snapshot.open(tmp_path)
    assert path in str(err.value)


# -- commit ----------------------------------------------------------------------------------


def test_commit_refuses_changed_or_missing_parts(tmp_path):
    routing = RoutingTable.even(2, BINS)
    parts = [write_worker_part(tmp_path, job=JOB, epoch=1, worker=w, bins=BINS,
                               states=sample_states(routing, w)) for w in range(2)]
    stale = parts[1]
    parts[1] = write_worker_part(tmp_path, job=JOB, epoch=1, worker=1, bins=BINS,
                                 states={"other": {9: ints_table(9, 2)}})
    with pytest.raises(SnapshotError, match="changed after it was written") as err:
        commit_snapshot(tmp_path, job=JOB, epoch=1, bins=BINS, routing=routing,
                        parts=[parts[0], stale])
    assert stale.index_path in str(err.value)
    with pytest.raises(SnapshotError, match="do not match the routing table's roster"):
        commit_snapshot(tmp_path, job=JOB, epoch=1, bins=BINS, routing=routing, parts=parts[:1])
    with pytest.raises(SnapshotError, match="index of job"):
        commit_snapshot(tmp_path, job="other", epoch=1, bins=BINS, routing=routing, parts=parts)
    os.remove(parts[0].index_path)
    with pytest.raises(SnapshotError, match="missing"):
        commit_snapshot(tmp_path, job=JOB, epoch=1, bins=BINS, routing=routing, parts=parts)
    assert committed_epochs(tmp_path) == []


def test_rewritten_part_replaces_the_old_one(tmp_path):
    routing = RoutingTable.even(2, BINS)
    write_worker_part(tmp_path, job=JOB, epoch=1, worker=0, bins=BINS,
                      states=sample_states(routing, 0))
    parts = [write_worker_part(tmp_path, job=JOB, epoch=1, worker=w, bins=BINS,
                               states={"s": {w: ints_table(w, 3)}}) for w in range(2)]
    commit_snapshot(tmp_path, job=JOB, epoch=1, bins=BINS, routing=routing, parts=parts)
    snap = Snapshot.open(tmp_path)
    assert snap.states() == ["s"]
    assert_tables(snap.read("s", range(BINS)), {0: ints_table(0, 3), 1: ints_table(1, 3)})
    with pytest.raises(SnapshotError, match="already committed"):
        write_worker_part(tmp_path, job=JOB, epoch=1, worker=0, bins=BINS, states={})


def test_bad_arguments_write_nothing(tmp_path):
    kwargs = {"job": JOB, "epoch": 1, "worker": 0, "bins": BINS}
    with pytest.raises(ValueError, match="bin 16"):
        write_worker_part(tmp_path, **kwargs, states={"s": {16: ints_table(0, 1)}})
    with pytest.raises(TypeError, match="pyarrow.Table"):
        write_worker_part(tmp_path, **kwargs, states={"s": {0: [1, 2]}})
    with pytest.raises(TypeError, match="JSON-serializable"):
        write_worker_part(tmp_path, **kwargs, states={}, meta={"x": object()})
    with pytest.raises(ValueError, match="epoch"):
        write_worker_part(tmp_path, **{**kwargs, "epoch": -1}, states={})
    with pytest.raises(ValueError, match="power of two"):
        write_worker_part(tmp_path, **{**kwargs, "bins": 12}, states={})
    assert os.listdir(tmp_path) == []


# -- crashes, temporary files, pruning -------------------------------------------------------


def test_temporary_files_are_never_final(tmp_path, monkeypatch):
    from tokenflow.state import snapshot

    write_snapshot(tmp_path, 1)
    directory = snapshot_dir(str(tmp_path), 1)
    assert sorted(os.listdir(directory)) == ["MANIFEST.json", "worker-00000.bins", "worker-00000.json",
                                             "worker-00001.bins", "worker-00001.json"]
    routing = RoutingTable.even(2, BINS)
    parts = [write_worker_part(tmp_path, job=JOB, epoch=2, worker=w, bins=BINS,
                               states=sample_states(routing, w)) for w in range(2)]

    def crash(fs, tmp, final):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(snapshot, "_publish", crash)
    with pytest.raises(OSError, match="simulated crash"):
        commit_snapshot(tmp_path, job=JOB, epoch=2, bins=BINS, routing=routing, parts=parts)
    monkeypatch.undo()
    second = snapshot_dir(str(tmp_path), 2)
    assert "MANIFEST.json" not in os.listdir(second)
    # a crash that also lost the clean-up leaves a hidden temporary manifest behind
    with open(os.path.join(second, f".MANIFEST.json.{uuid.uuid4().hex}.tmp"), "w") as f:
        f.write("{}")
    with open(os.path.join(tmp_path, ".snapshot-00000000000000000003.x.tmp"), "w") as f:
        f.write("junk")
    os.mkdir(os.path.join(tmp_path, "snapshot-12"))
    with open(os.path.join(tmp_path, "snapshot-00000000000000000004"), "w") as f:
        f.write("a file, not a directory")
    assert committed_epochs(tmp_path) == [1]
    assert Snapshot.open(tmp_path).epoch == 1
    with pytest.raises(SnapshotError, match="not committed"):
        Snapshot.open(tmp_path, 2)


def test_prune_keeps_the_two_newest(tmp_path):
    for epoch in (1, 3, 5, 7):
        write_snapshot(tmp_path, epoch)
    routing = RoutingTable.even(2, BINS)
    for epoch in (2, 9):  # uncommitted: one older than the newest commit, one newer
        write_worker_part(tmp_path, job=JOB, epoch=epoch, worker=0, bins=BINS,
                          states=sample_states(routing, 0))
    assert prune(tmp_path) == [1, 2, 3]
    assert committed_epochs(tmp_path) == [5, 7]
    assert sorted(os.listdir(tmp_path)) == [f"snapshot-{e:020d}" for e in (5, 7, 9)]
    assert prune(tmp_path, keep=1) == [5]
    delete_snapshot(tmp_path, 7)
    delete_snapshot(tmp_path, 7)
    assert committed_epochs(tmp_path) == []
    assert prune(tmp_path) == []
    with pytest.raises(ValueError, match="keep"):
        prune(tmp_path, keep=0)
    assert committed_epochs(tmp_path / "nowhere") == []


# -- filesystems -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["subtree", "local", "uri"])
def test_through_a_filesystem_object(tmp_path, kind):
    if kind == "subtree":
        fs, root = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), "snaps"
    elif kind == "local":
        fs, root = pafs.LocalFileSystem(), str(tmp_path / "snaps")
    else:
        fs, root = None, (tmp_path / "snaps").as_uri()
    routing = write_snapshot(root, 4, filesystem=fs)
    assert committed_epochs(root, filesystem=fs) == [4]
    assert os.path.exists(os.path.join(tmp_path, "snaps", "snapshot-00000000000000000004",
                                       "MANIFEST.json"))
    snap = Snapshot.open(root, job=JOB, filesystem=fs)
    state = f"{JOB}/pickled"
    assert_tables(snap.read(state, range(BINS)),
                  {b: pickled_table(b, 1 + b % 3) for b in range(BINS)})
    assert snap.routing == routing
    assert prune(root, keep=1, filesystem=fs) == []
    delete_snapshot(root, 4, filesystem=fs)
    assert committed_epochs(root, filesystem=fs) == []
