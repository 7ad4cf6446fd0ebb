"""A worker part's blobs are encoded from each schema's message and the batches' own
serialization (``tokenflow.state.snapshot._Encoder``): byte for byte the Arrow IPC stream the
stream writer produces, so parts written before and after read alike and an unchanged bin keeps
its crc32 (an incremental part references it instead of writing it again)."""

from __future__ import annotations

import pyarrow as pa

from tokenflow.state.bins import RoutingTable
from tokenflow.state.snapshot import Snapshot, _Encoder, _ipc_bytes, commit_snapshot, write_worker_part


def _tables() -> list[pa.Table]:
    plain = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", None, "c"]})
    chunked = pa.concat_tables([plain, plain.slice(1)])  # two batches
    nested = pa.table({"s": pa.array([{"x": 1, "y": [1.5]}, {"x": 2, "y": []}])})
    meta = plain.replace_schema_metadata({"owner": "q5"})
    words = pa.table({"w": pa.array(["a", "b", "a"]).dictionary_encode()})
    listed = pa.table({"l": pa.array([["a", "b"]], pa.list_(pa.dictionary(pa.int8(), pa.string())))})
    return [plain, chunked, plain, nested, meta, plain, words, listed, plain.slice(0, 1)]


def test_encoded_blobs_are_the_stream_writers_bytes() -> None:
    encoder = _Encoder()  # one encoder across schemas, as a part reuses it across bins and states
    for table in _tables():
        assert b"".join(bytes(p) for p in encoder.pieces(table)) == _ipc_bytes(table).to_pybytes()


def test_part_round_trip(tmp_path) -> None:
    tables = _tables()
    states = {"a": dict(enumerate(tables)), "b": {7: tables[3], 9: tables[6]}}
    part = write_worker_part(tmp_path, job="j", epoch=3, worker=0, bins=16, states=states)
    commit_snapshot(tmp_path, job="j", epoch=3, bins=16, routing=RoutingTable.even(1, 16),
                    parts=[part])
    snap = Snapshot.open(tmp_path, 3, job="j")
    for name, per_bin in states.items():
        read = snap.read(name, per_bin)
        assert {b: t.equals(per_bin[b], check_metadata=True) for b, t in read.items()} == \
            {b: True for b in per_bin}


def _bin(b: int, version: int) -> pa.Table:
    return pa.table({"key": pa.array([b * 10 + i for i in range(b % 3 + 1)], pa.int64()),
                     "version": pa.array([version] * (b % 3 + 1), pa.int64())})


def test_incremental_part_packs_changed_bins_into_shared_blobs(tmp_path) -> None:
    """Changed bins share blobs (one entry per bin, naming the blob and its first row), read
    back bin by bin; a later incremental part references a shared blob's bins unchanged."""
    bins, routing = 16, RoutingTable.even(1, 16)
    expected = {b: _bin(b, 0) for b in range(12)}
    part = write_worker_part(tmp_path, job="j", epoch=1, worker=0, bins=bins, states={"s": expected})
    commit_snapshot(tmp_path, job="j", epoch=1, bins=bins, routing=routing, parts=[part])
    previous = part.entries
    for epoch, changed in ((2, {1, 2, 3, 5, 8, 13}), (3, {2, 9}), (4, {0, 1, 3, 13})):
        tables = {b: _bin(b, epoch) for b in changed if b != 9}  # bin 9: emptied
        part = write_worker_part(tmp_path, job="j", epoch=epoch, worker=0, bins=bins,
                                 states={"s": tables}, previous=previous, changed={"s": changed})
        commit_snapshot(tmp_path, job="j", epoch=epoch, bins=bins, routing=routing, parts=[part])
        expected.update(tables)
        if 9 in changed:
            expected.pop(9, None)
        assert part.entries is not None
        offsets = [part.entries["s"][b][0] for b in tables]
        assert len(set(offsets)) == 1, "the changed bins share one blob"
        previous = part.entries
        snap = Snapshot.open(tmp_path, epoch, job="j")
        snap.verify()
        read = snap.read("s", range(bins))
        assert sorted(read) == sorted(expected)
        assert all(read[b].equals(expected[b]) for b in expected)
        assert snap.entries(0, routing) == {"s": previous["s"]}
