"""Snapshots of a job's keyed operator state at an epoch, stored per bin.

Source: distributed-DBSP design, "Fault tolerance" (a per-worker state database whose commit
by every worker forms a checkpoint, the basis for recovery only once every worker's part is
durable) and "Scale in and out" (a restarted job redistributes state to another worker
count).

Each worker writes its part: for every named state and every bin in which that state has
rows, one Arrow IPC stream of the bin's table, all concatenated in ``worker-<w>.bins``, and an
index ``worker-<w>.json`` giving each blob's offset, length, crc32 and row count.  The driver
checks every part and writes ``MANIFEST.json`` last; only then is the snapshot committed.  A
job restarted at another worker count reads, per new worker, exactly the blobs of the bins it
owns under the new routing table (one ranged read per run of adjacent blobs), and nothing else.

Layout under ``root`` (a directory on a ``pyarrow.fs.FileSystem``)::

    snapshot-<epoch, 20 digits>/
        worker-<w:05d>.bins   IPC streams, one per (state, bin), concatenated
        worker-<w:05d>.json   {"format", "job", "epoch", "bins", "worker",
                               "states": {state: {bin: [offset, length, crc32, rows]
                                                  or [offset, length, crc32, rows,
                                                      epoch, worker]
                                                  (either + [first row])}},
                               "meta", "bins_crc32"}
        MANIFEST.json         {"format", "job", "epoch", "bins", "routing", "workers",
                               "parts": {w: crc32 of worker-<w>.json}, "meta", "created"}

Incremental snapshots (checkpoints, ``tokenflow.recovery``): a worker that passes the entries
of its previous committed part as ``previous`` writes only the blobs whose bytes changed (same
crc32 and length: unchanged); the index entry of an unchanged blob names where it lives, with
two more fields, the epoch and the worker of the ``.bins`` file that holds it.  When the state
recorded which bins it changed (``changed=``, ``tokenflow.state.changes``), only those are
handed over and serialized; the others are referenced without being looked at, and the changed
bins are packed into shared blobs: consecutive bins of one schema up to ``GROUP_ROWS`` rows form one
IPC stream (one record batch), whose entries all name the stream and add the bin's first row
in it.  A windowed query's checkpoint changes thousands of bins of a few hundred bytes each,
whose serialization one by one cost tens of ms of the worker's interpreter; a group is
serialized in one call.  A state handed over as a ``BinSplit`` (``split_by_bin``: rows
ordered by bin) is packed by runs of consecutive bins, each one slice of its table, without
a table object per bin.  A full capture (a state that does not record its changes) packs its
small bins (``SMALL_BIN_BYTES``) the same way, rewritten at every checkpoint, and gives its
larger bins a blob each, found unchanged by checksum.  A reader decodes a shared blob once and
slices each bin's rows.  ``prune`` keeps
the ``.bins`` files that retained snapshots still point into (and drops the rest of those
older directories, manifest first).

Every file is written under a hidden temporary name (``.<name>.<hex>.tmp``) in its directory
and renamed into place; on a local filesystem the file is fsynced before, and its directory
after, the rename.  Checksums are ``zlib.crc32``: they detect corruption and truncation, not
tampering (the snapshot lives in the job's own storage).
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from tokenflow.faults import crash_point
from tokenflow.state.bins import BinSplit, RoutingTable, check_bins

FORMAT = 1
"""Version of the snapshot layout written and read by this module."""
MANIFEST = "MANIFEST.json"
"""Name of the file whose presence commits a snapshot."""

_DIR_RE = re.compile(r"snapshot-(\d{20})")
_MAX_EPOCH = 10**20 - 1
_WRITE_BUFFER = 1 << 20
_MAX_READ = 64 << 20
"""Adjacent blobs are fetched together up to this many bytes per ranged read."""

GROUP_ROWS = 16384
"""Changed bins of an incremental part are packed into shared blobs of about this many rows
(consecutive bins of one schema; rows, not bytes, since a bin's table may be a slice of a
larger one whose buffers it shares)."""
_GROUP_BINS = 512
"""At most this many bins share a blob."""
SMALL_BIN_BYTES = 4096
"""In a full capture, bins smaller than this (estimated, below) are packed into shared blobs
like the changed bins of an incremental one: serializing a bin on its own cost about 40 us of
the worker's interpreter (cProfile of q8's writes, the step loop running), as long as writing
some 20 KB of state (``benchmarks/results/recovery.md``, section 5), so finding a small one
unchanged by checksum saves less than it costs; larger bins get a blob each, reused when
unchanged."""
_SAMPLES = 4
"""Bins of a state whose bytes per row are measured (``_small_bins``)."""


def _small_bins(per_bin: list[tuple[int, pa.Table]]) -> set[int]:
    """The bins of one state to pack: those whose rows times the state's bytes per row are
    under ``SMALL_BIN_BYTES``.  Bytes per row is the largest of a few bins' (``nbytes``): that
    costs about 5 us a bin (a bin is often a slice of a larger table), too much to ask of every
    bin, and the bins of one state hold rows of one kind (a columnar state's rows; a keyed
    state's one pickled dict per bin, whose size makes every such bin large)."""
    bins = [(b, t) for b, t in per_bin if t.num_rows]
    if not bins:
        return set()
    step = max(1, len(bins) // _SAMPLES)
    per_row = max(t.nbytes / t.num_rows for _, t in bins[::step][:_SAMPLES])
    return {b for b, t in bins if t.num_rows * per_row < SMALL_BIN_BYTES}


# (state, bin, worker, offset, length, crc32, rows, epoch, first row): the blob lives in
# snapshot-<epoch>/worker-<worker>.bins; the bin's rows are [first, first + rows) of it
_Blob = tuple[str, int, int, int, int, int, int, int, int]
Entry = list[int]
"""An absolute blob reference: ``[offset, length, crc32, rows, epoch, worker]``, plus the
bin's first row when the blob is shared by several bins."""


@dataclass(frozen=True)
class _Index:
    """A parsed worker index: state -> bin -> entry (see the layout), meta, file crc."""

    states: dict[str, dict[int, list[int]]]
    meta: dict[str, Any]
    bins_crc32: int


class SnapshotError(Exception):
    """A snapshot that is missing, uncommitted, of another job or bin count, or corrupt; the
    message names the file involved and what is wrong."""


@dataclass(frozen=True)
class WorkerPart:
    """One worker's written part of a snapshot, handed to ``commit_snapshot``.

    Attributes:
        worker: the writer's worker index.
        index_path: path of its ``worker-<w>.json`` on the snapshot's filesystem.
        crc32: ``zlib.crc32`` of the index file's bytes.
        bytes_written: bytes of the ``.bins`` and ``.json`` files together.
        bytes_reused: bytes of unchanged blobs referenced in earlier snapshots' files.
        entries: every blob of the part as an absolute ``Entry``, by state and bin: the
            ``previous`` of this worker's next incremental part once this one is committed.
    """

    worker: int
    index_path: str
    crc32: int
    bytes_written: int
    bytes_reused: int = 0
    entries: dict[str, dict[int, Entry]] | None = field(default=None, compare=False, repr=False)


# -- paths and filesystem helpers ------------------------------------------------------------


def _join(parent: str, name: str) -> str:
    if parent == "/":
        return "/" + name
    stripped = parent.rstrip("/")
    return f"{stripped}/{name}" if stripped else name


def _dir_name(epoch: int) -> str:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= _MAX_EPOCH:
        raise ValueError(f"a snapshot epoch must be an int in [0, 10**20), got {epoch!r}")
    return f"snapshot-{epoch:020d}"


def _part_name(worker: int, suffix: str) -> str:
    return f"worker-{worker:05d}.{suffix}"


def snapshot_dir(root: str | os.PathLike[str], epoch: int) -> str:
    """Directory of the snapshot at ``epoch`` under ``root``: ``root/snapshot-<20 digits>``.

    Raises:
        ValueError: ``epoch`` not an int in ``[0, 10**20)``.
    """
    return _join(os.fspath(root), _dir_name(epoch))


def _resolve(root: str | os.PathLike[str],
             filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the root's path on it: ``filesystem`` as given, else the URI's
    filesystem (``scheme://...``), else the local one with an absolute path."""
    path = os.fspath(root)
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
        return fs, inner
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _local_path(fs: pafs.FileSystem, path: str) -> str | None:
    """The OS path of ``path`` if ``fs`` is local (possibly through sub-tree views)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    if isinstance(fs, pafs.SubTreeFileSystem):
        return _local_path(fs.base_fs, _join(fs.base_path, path.lstrip("/")))
    return None


def fsync_path(os_path: str) -> None:
    """Flush a local file or directory to disk (a directory: the names renamed into it);
    nothing off POSIX."""
    if os.name != "posix":
        return
    fd = os.open(os_path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(fs: pafs.FileSystem, tmp: str, final: str) -> None:
    """Rename ``tmp`` to ``final`` (replacing it), fsyncing the file first and the directory
    after on a local filesystem."""
    local = _local_path(fs, tmp)
    if local is not None:
        fsync_path(local)
    fs.move(tmp, final)
    if local is not None:
        fsync_path(os.path.dirname(local) or ".")


def _tmp_name(directory: str, name: str) -> str:
    return _join(directory, f".{name}.{uuid.uuid4().hex}.tmp")


def _write_file(fs: pafs.FileSystem, directory: str, name: str, chunks: Iterable[Any]) -> tuple[int, int]:
    """Write ``chunks`` (bytes-like) atomically to ``directory/name``.

    Returns:
        ``(bytes, crc32)`` of the written file.
    """
    tmp = _tmp_name(directory, name)
    size, crc = 0, 0
    try:
        with fs.open_output_stream(tmp, compression=None, buffer_size=_WRITE_BUFFER) as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        _publish(fs, tmp, _join(directory, name))
    except BaseException:
        _delete_quietly(fs, tmp)
        raise
    return size, crc


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass


def _make_dir(fs: pafs.FileSystem, root: str, directory: str) -> None:
    """Create ``directory`` (and parents); on a local filesystem fsync ``root`` so that the
    new entry is durable."""
    if fs.get_file_info(directory).type == pafs.FileType.Directory:
        return
    fs.create_dir(directory, recursive=True)
    local = _local_path(fs, root)
    if local is not None:
        fsync_path(local)


def _read_whole(fs: pafs.FileSystem, path: str, what: str) -> bytes:
    """All bytes of ``path``.

    Raises:
        SnapshotError: the file is missing or unreadable (``what`` describes it).
    """
    try:
        with fs.open_input_file(path) as f:
            return bytes(f.read())
    except FileNotFoundError as exc:
        raise SnapshotError(f"{path}: {what} is missing") from exc
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read {what}: {exc}") from exc


def _dumps(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """``value`` as a JSON-ready dict (``{}`` for None).

    Raises:
        TypeError / ValueError: not JSON-serializable (with NaN/inf refused).
    """
    document = dict(value or {})
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what} must be JSON-serializable: {exc}") from exc
    return document


def _check_non_negative(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


# -- writing ---------------------------------------------------------------------------------


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker of the Arrow IPC stream format (continuation token, length 0)."""


def _ipc_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC stream (schema message, its record batches, end marker), the
    bytes ``pa.ipc.new_stream(...).write_table(table)`` writes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _has_dictionary(kind: pa.DataType) -> bool:
    """Whether ``kind`` or a type nested in it is dictionary-encoded (the stream then also
    carries dictionary messages, which ``RecordBatch.serialize`` does not write)."""
    return pa.types.is_dictionary(kind) or any(
        _has_dictionary(kind.field(i).type) for i in range(kind.num_fields))


class _Encoder:
    """Encodes bin tables as Arrow IPC streams byte for byte like ``_ipc_bytes``, but from
    the schema message (serialized once per schema, not per bin), each record batch's
    ``serialize()`` and the end marker: about a third of the interpreter time per bin of a
    stream writer, which matters since a checkpoint of a windowed query serializes thousands
    of small bins on the worker's interpreter.  Schemas with dictionary-encoded fields go
    through the stream writer."""

    def __init__(self) -> None:
        self._schema: pa.Schema | None = None
        self._message: pa.Buffer | None = None  # None: the schema needs the stream writer

    def pieces(self, table: pa.Table) -> list[Any]:
        """The stream's bytes, as buffers to be written one after the other."""
        schema = table.schema
        if self._schema is None or not (schema is self._schema
                                        or schema.equals(self._schema, check_metadata=True)):
            self._schema = schema
            dictionary = any(_has_dictionary(f.type) for f in schema)
            self._message = None if dictionary else schema.serialize()
        if self._message is None:
            return [_ipc_bytes(table)]
        return [self._message, *(batch.serialize() for batch in table.to_batches()), _EOS]


_Checked = list[tuple[str, "list[tuple[int, pa.Table]] | BinSplit"]]
"""Per state (by name): its non-empty bins as (bin, table) sorted by bin, or a ``BinSplit``."""


def _checked_states(states: Mapping[str, Mapping[int, pa.Table]], bins: int) -> _Checked:
    """``states`` sorted by name and bin, with argument errors raised before any write.  A
    ``BinSplit`` is checked as a whole (its bins in range) and kept as it is."""
    out: _Checked = []
    for state in sorted(states):
        if not isinstance(state, str):
            raise TypeError(f"state names must be str, got {state!r}")
        given = states[state]
        if isinstance(given, BinSplit):
            if len(given.bins) and not (0 <= given.bins[0] and given.bins[-1] < bins):
                bad = given.bins[(given.bins < 0) | (given.bins >= bins)][0]
                raise ValueError(f"state {state!r}: bin {int(bad)} is not an int in [0, {bins})")
            out.append((state, given))
            continue
        per_bin = []
        for b, table in given.items():
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < bins:
                raise ValueError(f"state {state!r}: bin {b!r} is not an int in [0, {bins})")
            if not isinstance(table, pa.Table):
                raise TypeError(f"state {state!r} bin {b}: expected a pyarrow.Table, "
                                f"got {type(table).__name__}")
            per_bin.append((int(b), table))
        out.append((state, sorted(per_bin, key=lambda item: item[0])))
    return out


def _packs(split: BinSplit, chosen: np.ndarray) -> Iterator[tuple[int, int]]:
    """Index ranges ``[i, j)`` of ``split``'s bins to pack into shared blobs: maximal runs of
    consecutive ``chosen`` bins, cut before ``GROUP_ROWS`` rows or ``_GROUP_BINS`` bins (a
    run is one slice of the split's table).  A pack ends with the bin that brings its rows to
    ``GROUP_ROWS`` or more.  Python work per pack, not per bin: a q5 part of some 1,300 bins
    took 1.4 ms of its writer's CPU bin by bin (cProfile)."""
    mask = np.asarray(chosen, dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    cumulative = np.concatenate(([0], np.cumsum(split.rows(), dtype=np.int64)))
    for start, end in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        i = start
        while i < end:
            # one past the bin whose rows take the pack to GROUP_ROWS (> i: a bin has rows)
            full = int(np.searchsorted(cumulative, cumulative[i] + GROUP_ROWS, side="left"))
            j = min(end, i + _GROUP_BINS, full)
            yield i, j
            i = j


class _BlobWriter:
    """Serializes the non-empty bins of each state, recording the index as it goes; a blob
    equal (crc32 and length) to the ``previous`` part's entry is referenced, not written.  For
    a state in ``changed`` (an incremental capture) every bin of the ``previous`` part not in
    its changed set is referenced without being serialized."""

    def __init__(self, states: _Checked, epoch: int,
                 worker: int, previous: Mapping[str, Mapping[int, Sequence[int]]] | None,
                 changed: Mapping[str, set[int]] | None = None,
                 between: Callable[[], None] | None = None) -> None:
        self.states = states
        self.between = between
        self.epoch = epoch
        self.worker = worker
        self.previous = previous or {}
        self.changed = changed or {}
        self.index: dict[str, dict[str, list[int]]] = {}
        self.entries: dict[str, dict[int, Entry]] = {}
        self.reused = 0

    def _keep_unchanged(self, state: str, entries: dict[str, list[int]],
                        absolute: dict[int, Entry]) -> None:
        """Reference every bin of the previous part that the incremental capture of
        ``state`` did not change."""
        changed = self.changed[state]
        shared = set()  # a shared blob's bytes count once
        for b, old in self.previous[state].items():
            if b in changed:
                continue
            entries[str(b)] = absolute[b] = [int(x) for x in old]
            if len(old) == 7:
                if (old[4], old[5], old[0]) in shared:
                    continue
                shared.add((old[4], old[5], old[0]))
            self.reused += int(old[1])

    def _groups(self, state: str, per_bin: list[tuple[int, pa.Table]], offset: int,
                entries: dict[str, list[int]], absolute: dict[int, Entry]) -> Iterable[pa.Buffer]:
        """The changed bins of an incremental ``state``, or the small bins of a full one,
        packed into shared blobs (module docstring), recording their entries; the first blob
        starts at ``offset``."""
        group: list[tuple[int, pa.Table]] = []
        size = 0

        def close() -> pa.Buffer:
            nonlocal offset
            table = pa.concat_tables([t for _, t in group])
            if not any(_has_dictionary(f.type) for f in table.schema):
                table = table.combine_chunks()  # one record batch: one IPC message, not one a bin
            blob = self._blob(table, ((b, t.num_rows) for b, t in group), offset, entries,
                              absolute)
            offset += blob.size
            return blob

        for b, table in per_bin:
            if table.num_rows == 0:
                continue
            if group and (size >= GROUP_ROWS or len(group) >= _GROUP_BINS
                          or not table.schema.equals(group[0][1].schema, check_metadata=True)):
                yield close()
                group, size = [], 0
            group.append((b, table))
            size += table.num_rows
        if group:
            yield close()

    def _blob(self, table: pa.Table, group: Iterable[tuple[int, int]], offset: int,
              entries: dict[str, list[int]], absolute: dict[int, Entry]) -> pa.Buffer:
        """``table`` (the rows of ``group``'s (bin, rows) in order) as one shared blob at
        ``offset``, recording the bins' entries."""
        if self.between is not None:
            self.between()
        blob = _ipc_bytes(table)
        crc = zlib.crc32(blob)
        size, epoch, worker = blob.size, self.epoch, self.worker  # looked up once, not per bin
        first = 0
        for b, rows in group:
            entries[str(b)] = [offset, size, crc, rows, first]
            absolute[b] = [offset, size, crc, rows, epoch, worker, first]
            first += rows
        return blob

    def _split_blobs(self, split: BinSplit, chosen: np.ndarray, offset: int,
                     entries: dict[str, list[int]], absolute: dict[int, Entry],
                     ) -> Iterable[pa.Buffer]:
        """``_groups`` for a ``BinSplit``: each run of ``chosen`` bins is one slice of its
        table, serialized without a table object per bin."""
        bins, starts, rows = split.bins.tolist(), split.starts.tolist(), split.rows().tolist()
        for i, j in _packs(split, chosen):
            table = split.table.slice(starts[i], starts[j - 1] + rows[j - 1] - starts[i])
            blob = self._blob(table, zip(bins[i:j], rows[i:j], strict=True), offset, entries,
                              absolute)
            offset += blob.size
            yield blob

    def chunks(self) -> Iterable[Any]:
        offset = 0
        encoder = _Encoder()
        pending: list[Any] = []
        pending_size = 0
        for state, per_bin in self.states:
            entries = self.index.setdefault(state, {})
            absolute = self.entries.setdefault(state, {})
            before = self.previous.get(state, {})
            if state in self.changed:
                self._keep_unchanged(state, entries, absolute)
            blobs: Iterable[pa.Buffer]
            single: Iterable[tuple[int, pa.Table]]
            if isinstance(per_bin, BinSplit):
                rows = per_bin.rows()
                if state in self.changed or not len(rows):
                    chosen = np.ones(len(rows), dtype=bool)
                else:  # small bins shared, large ones compared with ``previous``
                    per_row = per_bin.table.nbytes / int(rows.sum())
                    chosen = rows * per_row < SMALL_BIN_BYTES
                blobs = self._split_blobs(per_bin, chosen, offset, entries, absolute)
                single = ((b, per_bin[b]) for b in per_bin.bins[~chosen].tolist())
            elif state in self.changed:
                blobs, single = self._groups(state, per_bin, offset, entries, absolute), []
            else:  # a full capture: small bins shared, large ones compared with ``previous``
                small = _small_bins(per_bin)
                blobs = self._groups(state, [(b, t) for b, t in per_bin if b in small], offset,
                                     entries, absolute)
                single = [(b, t) for b, t in per_bin if b not in small]
            for blob in blobs:
                offset += blob.size
                pending.append(blob)
                pending_size += blob.size
                if pending_size >= _WRITE_BUFFER:
                    yield b"".join(pending)
                    pending, pending_size = [], 0
            for b, table in single:
                if table.num_rows == 0:
                    continue
                if self.between is not None:
                    self.between()
                pieces = encoder.pieces(table)
                size, crc = 0, 0
                for piece in pieces:
                    size += len(piece)
                    crc = zlib.crc32(piece, crc)
                old = before.get(b)
                if old is not None and len(old) == 6 and old[1] == size and old[2] == crc \
                        and old[3] == table.num_rows:
                    entries[str(b)] = absolute[b] = [int(x) for x in old]
                    self.reused += size
                    continue
                entries[str(b)] = [offset, size, crc, table.num_rows]
                absolute[b] = [offset, size, crc, table.num_rows, self.epoch, self.worker]
                offset += size
                pending.extend(pieces)
                pending_size += size
                if pending_size >= _WRITE_BUFFER:  # one write (and file crc) per MB, not per piece
                    yield b"".join(pending)
                    pending, pending_size = [], 0
        if pending:
            yield b"".join(pending)


def _checked_changes(checked: _Checked,
                     changed: Mapping[str, Iterable[int] | None] | None,
                     previous: Mapping[str, Mapping[int, Sequence[int]]] | None,
                     bins: int) -> dict[str, set[int]]:
    """The incremental states of ``changed`` (those not None) with their changed bins,
    checked: each is in ``previous`` with absolute entries, and exports only changed bins."""
    out: dict[str, set[int]] = {}
    names = {state for state, _ in checked}
    for state, marks in (changed or {}).items():
        if marks is None:
            continue
        if state not in names:
            raise ValueError(f"changed bins given for state {state!r}, which is not in states")
        if previous is None or state not in previous:
            raise ValueError(f"state {state!r}: changed bins given without its previous "
                             f"entries (an incremental capture needs them)")
        if any(len(e) not in (6, 7) for e in previous[state].values()):
            raise ValueError(f"state {state!r}: previous entries must be absolute "
                             f"(WorkerPart.entries)")
        marked = {int(b) for b in marks}
        if marked and not (0 <= min(marked) and max(marked) < bins):
            raise ValueError(f"state {state!r}: changed bins must be in [0, {bins})")
        out[state] = marked
    for state, per_bin in checked:
        if state in out:
            given = per_bin.bins.tolist() if isinstance(per_bin, BinSplit) else \
                [b for b, _ in per_bin]
            extra = sorted(b for b in given if b not in out[state])
            if extra:
                raise ValueError(f"state {state!r}: bins {extra[:5]} exported but not marked "
                                 f"changed")
    return out


def write_worker_part(root: str | os.PathLike[str], *, job: str, epoch: int, worker: int, bins: int,
                      states: Mapping[str, Mapping[int, pa.Table]],
                      meta: Mapping[str, Any] | None = None,
                      filesystem: pafs.FileSystem | None = None,
                      previous: Mapping[str, Mapping[int, Sequence[int]]] | None = None,
                      changed: Mapping[str, Iterable[int] | None] | None = None,
                      between: Callable[[], None] | None = None) -> WorkerPart:
    """Write ``worker``'s part of the snapshot at ``epoch``: its ``.bins`` blobs, then its
    ``.json`` index, each atomically; writing the same part again replaces it.

    Args:
        root: snapshot root (a local path, a URI, or a path on ``filesystem``).
        job: the job's name, recorded and checked on open.
        epoch: the snapshot's epoch, an int in ``[0, 10**20)``.
        worker: the writer's worker index (>= 0).
        bins: the job's bin count (a power of two).
        states: per state name, per bin in ``[0, bins)``, the bin's rows (any schema);
            empty tables are skipped, a state with no rows is still listed.
        meta: the worker's JSON-serializable metadata (e.g. source positions).
        filesystem: a ``pyarrow.fs.FileSystem`` (default: from ``root``).
        previous: the ``entries`` of this worker's part of an earlier *committed* snapshot
            under ``root`` (incremental: blobs whose bytes did not change are referenced
            there instead of written again).
        changed: per state, the bins changed since ``previous`` (an incremental capture,
            ``tokenflow.state.changes``): ``states`` then holds the tables of changed bins
            only (a changed bin without a table, or with an empty one, is gone), and every
            other bin of the state's ``previous`` entries is referenced without being
            serialized; None for a state (or no ``changed``): ``states`` holds all its bins.
        between: called before each blob is serialized (a writer on a worker's background
            thread waits there while the worker is busy: ``tokenflow.control``).

    Returns:
        The ``WorkerPart`` to pass to ``commit_snapshot``.

    Raises:
        ValueError / TypeError: bad arguments (nothing is written), among them changed bins
            for a state without previous entries, or a table for a bin not marked changed.
        SnapshotError: the snapshot at ``epoch`` is already committed.
        OSError: the filesystem failed (no partial file is left under a final name).
    """
    if not isinstance(job, str):
        raise TypeError(f"job must be a str, got {job!r}")
    name = _dir_name(epoch)
    _check_non_negative(worker, "worker")
    check_bins(bins)
    checked = _checked_states(states, bins)
    incremental = _checked_changes(checked, changed, previous, bins)
    meta_doc = _json_object(meta, "worker meta")
    fs, base = _resolve(root, filesystem)
    directory = _join(base, name)
    manifest = _join(directory, MANIFEST)
    if fs.get_file_info(manifest).type != pafs.FileType.NotFound:
        raise SnapshotError(f"{manifest}: the snapshot at epoch {epoch} is already committed; "
                            f"its parts cannot be rewritten")
    _make_dir(fs, base, directory)
    blobs = _BlobWriter(checked, epoch, worker, previous, incremental, between)
    bins_size, bins_crc = _write_file(fs, directory, _part_name(worker, "bins"), blobs.chunks())
    crash_point("snapshot.part")
    index = {"format": FORMAT, "job": job, "epoch": epoch, "bins": bins, "worker": worker,
             "states": blobs.index, "meta": meta_doc, "bins_crc32": bins_crc}
    index_name = _part_name(worker, "json")
    index_size, index_crc = _write_file(fs, directory, index_name, [_dumps(index)])
    return WorkerPart(worker, _join(directory, index_name), index_crc, bins_size + index_size,
                      blobs.reused, blobs.entries)


def _check_parts(fs: pafs.FileSystem, directory: str, job: str, epoch: int, bins: int,
                 routing: RoutingTable, parts: Sequence[WorkerPart]) -> set[tuple[int, int]]:
    """Every roster member has exactly one part, whose index is in place, unchanged (crc32)
    and of this job, epoch, bin count and worker.  Returns ``(epoch, worker)`` of every
    ``.bins`` file the parts read blobs from (``Snapshot.files``)."""
    workers = [p.worker for p in parts]
    if len(set(workers)) != len(workers):
        raise SnapshotError(f"{directory}: several parts for one worker: {sorted(workers)}")
    if set(workers) != set(routing.roster):
        raise SnapshotError(f"{directory}: parts of workers {sorted(workers)} do not match the "
                            f"routing table's roster {list(routing.roster)}")
    files: set[tuple[int, int]] = set()
    for part in parts:
        path = _join(directory, _part_name(part.worker, "json"))
        if part.index_path != path:
            raise SnapshotError(f"{part.index_path}: part of worker {part.worker} is not in this "
                                f"snapshot (expected {path})")
        data = _read_whole(fs, path, f"the index of worker {part.worker}")
        if zlib.crc32(data) != part.crc32:
            raise SnapshotError(f"{path}: index changed after it was written (crc32 "
                                f"{zlib.crc32(data):#010x}, part says {part.crc32:#010x})")
        index = _parse_index(path, data, job=job, epoch=epoch, bins=bins, worker=part.worker)
        files.add((epoch, part.worker))
        for entries in index.states.values():
            files.update((e[4], e[5]) for e in entries.values() if len(e) >= 6)
    return files


def commit_snapshot(root: str | os.PathLike[str], *, job: str, epoch: int, bins: int,
                    routing: RoutingTable, parts: Sequence[WorkerPart],
                    meta: Mapping[str, Any] | None = None,
                    filesystem: pafs.FileSystem | None = None) -> str:
    """Commit the snapshot at ``epoch``: check every part, then write ``MANIFEST.json``
    atomically (the snapshot becomes a basis for recovery only then).

    Args:
        routing: the routing table in force at ``epoch`` (``bins`` bins); its roster must be
            exactly the workers of ``parts``.
        parts: one ``WorkerPart`` per worker, as returned by ``write_worker_part``.
        meta: JSON-serializable job metadata.

    Returns:
        The path of ``MANIFEST.json``.

    Raises:
        SnapshotError: a part's index is missing, changed since it was written (crc32), or
            of another job/epoch/bin count/worker; parts not matching the roster.
        ValueError / TypeError: bad arguments.
    """
    name = _dir_name(epoch)
    check_bins(bins)
    if routing.bins != bins:
        raise ValueError(f"the routing table has {routing.bins} bins, the snapshot {bins}")
    meta_doc = _json_object(meta, "snapshot meta")
    fs, base = _resolve(root, filesystem)
    directory = _join(base, name)
    files = _check_parts(fs, directory, job, epoch, bins, routing, parts)
    ordered = sorted(parts, key=lambda p: p.worker)
    manifest = {"format": FORMAT, "job": job, "epoch": epoch, "bins": bins,
                "routing": routing.to_json(), "workers": [p.worker for p in ordered],
                "parts": {str(p.worker): p.crc32 for p in ordered}, "meta": meta_doc,
                "created": datetime.now(UTC).isoformat()}
    crash_point("snapshot.commit")
    _write_file(fs, directory, MANIFEST, [_dumps(manifest)])
    _remember_files(fs, _join(directory, MANIFEST), epoch, frozenset(files))
    return _join(directory, MANIFEST)


# -- listing and deleting --------------------------------------------------------------------


def _snapshot_dirs(fs: pafs.FileSystem, base: str) -> dict[int, str]:
    """Epoch -> directory of every ``snapshot-<20 digits>`` directory under ``base``."""
    selector = pafs.FileSelector(base, allow_not_found=True)
    out = {}
    for info in fs.get_file_info(selector):
        match = _DIR_RE.fullmatch(info.base_name)
        if match and info.type == pafs.FileType.Directory:
            out[int(match.group(1))] = info.path
    return out


def _committed(fs: pafs.FileSystem, base: str) -> tuple[list[int], dict[int, str]]:
    dirs = _snapshot_dirs(fs, base)
    epochs = sorted(dirs)
    infos = fs.get_file_info([_join(dirs[e], MANIFEST) for e in epochs])
    return [e for e, info in zip(epochs, infos, strict=True) if info.type == pafs.FileType.File], dirs


def committed_epochs(root: str | os.PathLike[str],
                     filesystem: pafs.FileSystem | None = None) -> list[int]:
    """Epochs of the committed snapshots (those with a ``MANIFEST.json``) under ``root``,
    ascending; ``[]`` if ``root`` does not exist.  Other entries are ignored."""
    fs, base = _resolve(root, filesystem)
    return _committed(fs, base)[0]


def _delete_dir(fs: pafs.FileSystem, directory: str) -> None:
    """Delete the manifest first (a crash leaves an uncommitted directory, not a broken
    committed snapshot), then the directory."""
    _delete_quietly(fs, _join(directory, MANIFEST))
    fs.delete_dir(directory)


def delete_snapshot(root: str | os.PathLike[str], epoch: int,
                    filesystem: pafs.FileSystem | None = None) -> None:
    """Delete the snapshot at ``epoch`` (committed or not); nothing if there is none."""
    fs, base = _resolve(root, filesystem)
    directory = _join(base, _dir_name(epoch))
    if fs.get_file_info(directory).type == pafs.FileType.Directory:
        _delete_dir(fs, directory)


_FILES: dict[tuple[str, int, int | None, int | None], frozenset[tuple[int, int]]] = {}
"""``_referenced``'s memory: the files of a committed snapshot, by its manifest's path, epoch,
modification time and size (a committed snapshot never changes; one written again after its
directory was deleted has another manifest).  The driver prunes after every checkpoint and
otherwise parsed every kept snapshot's indexes (thousands of entries each) every time."""
_FILES_KEPT = 64


def _referenced(fs: pafs.FileSystem, base: str, epochs: Iterable[int]) -> set[tuple[int, int]]:
    """``(epoch, worker)`` of every ``.bins`` file the snapshots at ``epochs`` read blobs
    from (their own and earlier ones); unreadable snapshots reference nothing."""
    out: set[tuple[int, int]] = set()
    for epoch in epochs:
        manifest = _join(_join(base, _dir_name(epoch)), MANIFEST)
        key = _files_key(fs, manifest, epoch)
        files = None if key is None else _FILES.get(key)
        if files is None:
            try:
                files = frozenset(Snapshot.open(base, epoch, filesystem=fs).files())
            except SnapshotError:
                continue
            _remember_files(fs, manifest, epoch, files)
        out |= files
    return out


def _files_key(fs: pafs.FileSystem, manifest: str,
               epoch: int) -> tuple[str, int, int | None, int | None] | None:
    """``_FILES``'s key of the snapshot whose manifest is at ``manifest``; None where the
    filesystem gives no modification time (nothing is remembered there)."""
    info = fs.get_file_info(manifest)
    if info.type != pafs.FileType.File or info.mtime_ns is None:
        return None
    return (f"{type(fs).__name__}:{info.path}", epoch, info.mtime_ns, info.size)


def _remember_files(fs: pafs.FileSystem, manifest: str, epoch: int,
                    files: frozenset[tuple[int, int]]) -> None:
    """Remember the files of the committed snapshot at ``manifest`` (``_FILES``): the commit
    knows them from the indexes it checked, so the prune after it parses none again."""
    key = _files_key(fs, manifest, epoch)
    if key is None:
        return
    if len(_FILES) >= _FILES_KEPT:
        _FILES.pop(next(iter(_FILES)))
    _FILES[key] = files


def prune(root: str | os.PathLike[str], keep: int = 2,
          filesystem: pafs.FileSystem | None = None) -> list[int]:
    """Delete all committed snapshots but the ``keep`` newest, and the uncommitted snapshot
    directories older than the newest committed one (newer ones may be being written).  Of
    an older directory whose ``.bins`` files a kept (incremental) snapshot still reads, only
    those files stay; its manifest goes first, so it is no longer a committed snapshot.

    Returns:
        The epochs deleted (whole, or but for the files a kept snapshot reads), ascending.

    Raises:
        ValueError: ``keep < 1``.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"prune must keep at least one snapshot, got keep={keep!r}")
    fs, base = _resolve(root, filesystem)
    committed, dirs = _committed(fs, base)
    if not committed:
        return []
    kept = set(committed[-keep:])
    referenced = _referenced(fs, base, sorted(kept))
    doomed = [e for e in sorted(dirs) if e not in kept and e < committed[-1]]
    for epoch in doomed:
        still = {w for e, w in referenced if e == epoch}
        if not still:
            _delete_dir(fs, dirs[epoch])
            continue
        _delete_quietly(fs, _join(dirs[epoch], MANIFEST))
        for info in fs.get_file_info(pafs.FileSelector(dirs[epoch])):
            if info.base_name not in {_part_name(w, "bins") for w in still}:
                _delete_quietly(fs, info.path)
    return doomed


# -- reading ---------------------------------------------------------------------------------


def _field(document: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    value = document.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise SnapshotError(f"{path}: field {key!r} is missing or not of type "
                            f"{getattr(kind, '__name__', kind)} (got {value!r:.80})")
    return value


def _load_json(path: str, data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"{path}: {what} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise SnapshotError(f"{path}: {what} is not a JSON object")
    if document.get("format") != FORMAT:
        raise SnapshotError(f"{path}: {what} has format {document.get('format')!r:.40}, "
                            f"expected {FORMAT}")
    return document


def _expect(path: str, what: str, found: Any, expected: Any) -> None:
    if found != expected:
        raise SnapshotError(f"{path}: {what} {found!r}, expected {expected!r}")


def _parse_entries(path: str, state: str, entries: Any, bins: int) -> dict[int, list[int]]:
    if not isinstance(entries, dict):
        raise SnapshotError(f"{path}: state {state!r} is not a JSON object")
    out = {}
    values: list[Any] = []
    for key, entry in entries.items():
        if type(entry) is not list or len(entry) not in (4, 5, 6, 7) or not key.isdigit() \
                or int(key) >= bins:
            raise _malformed_entry(path, state, key, entry)
        out[int(key)] = entry
        values += entry
    # every value an int >= 0, checked at once (an index holds thousands of entries)
    if not set(map(type, values)) <= {int} or (values and min(values) < 0):
        key, entry = next((k, e) for k, e in entries.items()
                          if not all(type(x) is int and x >= 0 for x in e))
        raise _malformed_entry(path, state, key, entry)
    return out


def _malformed_entry(path: str, state: str, key: str, entry: Any) -> SnapshotError:
    return SnapshotError(f"{path}: state {state!r}: malformed entry for bin {key!r:.20}: "
                         f"{entry!r:.80}")


def _parse_index(path: str, data: bytes, *, job: str, epoch: int, bins: int, worker: int) -> _Index:
    """A worker index, checked against the snapshot's identity."""
    document = _load_json(path, data, "worker index")
    _expect(path, "index of job", _field(document, "job", str, path), job)
    _expect(path, "index of epoch", _field(document, "epoch", int, path), epoch)
    _expect(path, "index with bin count", _field(document, "bins", int, path), bins)
    _expect(path, "index of worker", _field(document, "worker", int, path), worker)
    bins_crc32 = _field(document, "bins_crc32", int, path)
    meta = _field(document, "meta", dict, path)
    states = {state: _parse_entries(path, state, entries, bins)
              for state, entries in _field(document, "states", dict, path).items()}
    return _Index(states, meta, bins_crc32)


def _parse_manifest(path: str, data: bytes, epoch: int) -> dict[str, Any]:
    """The manifest's fields, type-checked; ``routing`` as a ``RoutingTable``."""
    document = _load_json(path, data, "manifest")
    _expect(path, "manifest of epoch", _field(document, "epoch", int, path), epoch)
    bins = _field(document, "bins", int, path)
    try:
        check_bins(bins)
        routing = RoutingTable.from_json(_field(document, "routing", dict, path))
    except ValueError as exc:
        raise SnapshotError(f"{path}: {exc}") from exc
    _expect(path, "routing table with bin count", routing.bins, bins)
    workers = _field(document, "workers", list, path)
    parts = _field(document, "parts", dict, path)
    valid = all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in workers)
    if not valid or sorted(parts) != sorted(str(w) for w in workers) \
            or not all(isinstance(c, int) for c in parts.values()):
        raise SnapshotError(f"{path}: malformed workers {workers!r:.80} / parts {parts!r:.80}")
    return {"job": _field(document, "job", str, path), "bins": bins, "routing": routing,
            "workers": sorted(workers), "parts": {int(w): c for w, c in parts.items()},
            "meta": _field(document, "meta", dict, path)}


class Snapshot:
    """A committed snapshot, open for reading bins (``Snapshot.open``).

    Attributes:
        epoch: the snapshot's epoch.
        job: the job's name.
        bins: the bin count.
        routing: the routing table in force at ``epoch``.
        workers: the writer workers, ascending.
        meta: the job metadata given to ``commit_snapshot``.
        bytes_read: blob bytes read so far per writer worker (index reads excluded).
    """

    def __init__(self, fs: pafs.FileSystem, directory: str, epoch: int, manifest: dict[str, Any],
                 indexes: dict[int, _Index]) -> None:
        self._fs = fs
        self._dir = directory
        self._root = directory.rsplit("/", 1)[0] if "/" in directory else ""
        self.epoch = epoch
        self.job: str = manifest["job"]
        self.bins: int = manifest["bins"]
        self.routing: RoutingTable = manifest["routing"]
        self.workers: list[int] = manifest["workers"]
        self.meta: dict[str, Any] = manifest["meta"]
        self._indexes = indexes
        self._blobs = self._merge(indexes)
        self.bytes_read: dict[int, int] = dict.fromkeys(self.workers, 0)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, root: str | os.PathLike[str], epoch: int | None = None, *, job: str | None = None,
             bins: int | None = None, filesystem: pafs.FileSystem | None = None) -> Snapshot:
        """Open the latest committed snapshot under ``root`` (or the one at ``epoch``),
        reading its manifest and every worker index.

        Args:
            job: if given, the job the snapshot must belong to.
            bins: if given, the bin count the snapshot must have.

        Raises:
            SnapshotError: no committed snapshot (at ``epoch``); a manifest that is not valid
                JSON or has a wrong format or fields; another job's snapshot; another bin
                count; a worker index that is missing, differs from the manifest's crc32, or
                is malformed.
        """
        fs, base = _resolve(root, filesystem)
        if epoch is None:
            committed = committed_epochs(base, fs)
            if not committed:
                raise SnapshotError(f"{base}: no committed snapshot (no snapshot-*/{MANIFEST})")
            epoch = committed[-1]
        directory = _join(base, _dir_name(epoch))
        path = _join(directory, MANIFEST)
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            state = "does not exist" if fs.get_file_info(directory).type == pafs.FileType.NotFound \
                else f"is not committed (no {MANIFEST})"
            raise SnapshotError(f"{path}: the snapshot at epoch {epoch} {state}")
        manifest = _parse_manifest(path, _read_whole(fs, path, "the manifest"), epoch)
        if job is not None and manifest["job"] != job:
            raise SnapshotError(f"{path}: snapshot of job {manifest['job']!r}, expected {job!r}")
        if bins is not None and manifest["bins"] != bins:
            raise SnapshotError(f"{path}: snapshot of {manifest['bins']} bins, expected {bins}")
        indexes = {w: cls._load_index(fs, directory, manifest, epoch, w) for w in manifest["workers"]}
        return cls(fs, directory, epoch, manifest, indexes)

    @staticmethod
    def _load_index(fs: pafs.FileSystem, directory: str, manifest: dict[str, Any], epoch: int,
                    worker: int) -> _Index:
        path = _join(directory, _part_name(worker, "json"))
        data = _read_whole(fs, path, f"the index of worker {worker}")
        expected = manifest["parts"][worker]
        if zlib.crc32(data) != expected:
            raise SnapshotError(f"{path}: index of worker {worker} is corrupt (crc32 "
                                f"{zlib.crc32(data):#010x}, manifest says {expected:#010x})")
        return _parse_index(path, data, job=manifest["job"], epoch=epoch, bins=manifest["bins"],
                            worker=worker)

    def _merge(self, indexes: dict[int, _Index]) -> dict[str, dict[int, _Blob]]:
        """State -> bin -> blob over all workers; a (state, bin) in two parts is an error."""
        out: dict[str, dict[int, _Blob]] = {}
        for w, index in sorted(indexes.items()):
            for state, entries in index.states.items():
                merged = out.setdefault(state, {})
                for b, entry in entries.items():
                    if b in merged:
                        raise SnapshotError(f"{self._bins_path(w)}: state {state!r} bin {b} is "
                                            f"also in the part of another worker")
                    offset, length, crc, rows = entry[:4]
                    epoch, worker = (entry[4], entry[5]) if len(entry) >= 6 else (self.epoch, w)
                    first = entry[-1] if len(entry) in (5, 7) else -1
                    if epoch > self.epoch or (epoch == self.epoch and worker != w):
                        raise SnapshotError(f"{self._bins_path(w)}: state {state!r} bin {b} "
                                            f"refers to a later snapshot (epoch {epoch})")
                    merged[b] = (state, b, worker, offset, length, crc, rows, epoch, first)
        return out

    def _bins_path(self, worker: int, epoch: int | None = None) -> str:
        if epoch is None or epoch == self.epoch:
            return _join(self._dir, _part_name(worker, "bins"))
        return _join(_join(self._root, _dir_name(epoch)), _part_name(worker, "bins"))

    def entries(self, worker: int, routing: RoutingTable) -> dict[str, dict[int, Entry]]:
        """The blobs of the bins ``worker`` owns under ``routing``, as absolute ``Entry``s:
        the ``previous`` of that worker's first incremental part after a restore, when
        ``routing`` is this snapshot's table (otherwise ``{}``: the bins moved, write in full)."""
        mine, theirs = routing.to_json(), self.routing.to_json()
        if mine["bins"] != theirs["bins"] or mine["owners"] != theirs["owners"]:
            return {}  # (the table's version may differ: only who owns what matters)
        owned = set(routing.owned_by(worker).tolist())
        return {state: {b: [blob[3], blob[4], blob[5], blob[6], blob[7], blob[2]]
                        + ([blob[8]] if blob[8] >= 0 else [])
                        for b, blob in blobs.items() if b in owned}
                for state, blobs in self._blobs.items()}

    def files(self) -> set[tuple[int, int]]:
        """``(epoch, worker)`` of every ``.bins`` file this snapshot reads blobs from: its own
        parts' and, when incremental, earlier snapshots' under the same root."""
        out = {(self.epoch, w) for w in self.workers}
        for blobs in self._blobs.values():
            out.update((blob[7], blob[2]) for blob in blobs.values())
        return out

    def worker_meta(self, worker: int) -> dict[str, Any]:
        """The metadata ``worker`` wrote with its part.

        Raises:
            KeyError: ``worker`` wrote no part of this snapshot.
        """
        if worker not in self._indexes:
            raise KeyError(f"worker {worker} has no part in the snapshot at epoch {self.epoch}")
        return dict(self._indexes[worker].meta)

    def states(self) -> list[str]:
        """Names of the states written by any worker, sorted."""
        return sorted(self._blobs)

    def stored_bytes(self, state: str | None = None) -> dict[int, int]:
        """Blob bytes per writer worker according to the indexes (of ``state``, or all)."""
        out = dict.fromkeys(self.workers, 0)
        for name, blobs in self._blobs.items():
            if state is None or name == state:
                seen = set()
                for blob in blobs.values():
                    if blob[8] >= 0:  # a shared blob counts once
                        where = (blob[7], blob[2], blob[3])
                        if where in seen:
                            continue
                        seen.add(where)
                    out[blob[2]] = out.get(blob[2], 0) + blob[4]
        return out

    def read(self, state: str, bins: Iterable[int]) -> dict[int, pa.Table]:
        """The tables of ``state`` in ``bins``: ``{bin: table}`` for the bins holding rows
        (an unknown state gives ``{}``).  Only these blobs' bytes are read, one ranged read
        per run of adjacent blobs; every blob is verified before anything is returned.

        Raises:
            ValueError: a bin outside ``[0, bins)``.
            SnapshotError: a missing or truncated ``.bins`` file, a crc32 mismatch, or a blob
                that does not decode to its recorded row count (naming file, state and bin).
        """
        wanted = sorted(set(bins))
        if wanted and not (0 <= wanted[0] and wanted[-1] < self.bins):
            raise ValueError(f"bins must be in [0, {self.bins}), got {wanted[0]}..{wanted[-1]}")
        blobs = self._blobs.get(state, {})
        out: dict[int, pa.Table] = {}
        for epoch, worker, group in _by_file(blobs[b] for b in wanted if b in blobs):
            out.update(self._read_file(worker, epoch, group))
        return {b: out[b] for b in sorted(out)}

    def _read_file(self, worker: int, epoch: int, blobs: list[_Blob],
                   decode: bool = True) -> dict[int, pa.Table]:
        """``blobs`` (sorted by offset) of worker ``worker``'s file of ``epoch``, each checked
        against its crc32; decoded to ``{bin: table}``, or with ``decode=False`` only
        checked (``{}``: a blob whose bytes match its crc32 decodes as it was written)."""
        path = self._bins_path(worker, epoch)
        out: dict[int, pa.Table] = {}
        try:
            handle = self._fs.open_input_file(path)
        except OSError as exc:
            state, b = blobs[0][0], blobs[0][1]
            raise SnapshotError(f"{path}: cannot open the blobs of state {state!r} (bin {b}, ...): "
                                f"{exc}") from exc
        with handle:
            for run in _runs(blobs):
                start = run[0][3]
                size = run[-1][3] + run[-1][4] - start
                data = pa.py_buffer(handle.read_at(size, start))
                with self._lock:
                    self.bytes_read[worker] = self.bytes_read.get(worker, 0) + data.size
                if not decode:
                    _check_run(path, data, start, run)
                    continue
                shared: dict[int, pa.Table] = {}  # offset -> a shared blob's whole table
                for blob in run:
                    out[blob[1]] = _decode(path, data, start, blob, shared)
        return out

    def verify(self) -> None:
        """Read every worker's whole ``.bins`` file and check it against its index's
        ``bins_crc32``, and every blob referenced in earlier snapshots' files against its
        crc32 (all counted in ``bytes_read``).  Nothing is decoded: bytes that match their
        crc32 decode as they were written, and a restore decodes (and checks again) what it
        reads.  100 MB of state with 3 % of the bins changed since the full snapshot it
        refers to: 0.07 s on a slow 2-core VM, where decoding the ~4,000 referenced blobs too
        took 0.18-0.23 s.

        Raises:
            SnapshotError: a missing or corrupt ``.bins`` file (naming it).
        """
        for state in self.states():
            older = (blob for blob in self._blobs[state].values() if blob[7] != self.epoch)
            for epoch, worker, group in _by_file(older):
                self._read_file(worker, epoch, group, decode=False)
        for worker in self.workers:
            path = self._bins_path(worker)
            data = _read_whole(self._fs, path, f"the blobs of worker {worker}")
            with self._lock:
                self.bytes_read[worker] += len(data)
            expected = self._indexes[worker].bins_crc32
            if zlib.crc32(data) != expected:
                raise SnapshotError(f"{path}: blobs of worker {worker} are corrupt (crc32 "
                                    f"{zlib.crc32(data):#010x}, index says {expected:#010x})")

    def __repr__(self) -> str:
        return (f"Snapshot(job={self.job!r}, epoch={self.epoch}, bins={self.bins}, "
                f"workers={self.workers}, states={len(self._blobs)})")


def _by_file(blobs: Iterable[_Blob]) -> list[tuple[int, int, list[_Blob]]]:
    """``blobs`` grouped by the file holding them: ``(epoch, worker, blobs by offset)``, in
    order of epoch and worker."""
    files: dict[tuple[int, int], list[_Blob]] = {}
    for blob in blobs:
        files.setdefault((blob[7], blob[2]), []).append(blob)
    return [(epoch, worker, sorted(group, key=lambda blob: blob[3]))
            for (epoch, worker), group in sorted(files.items())]


def _runs(blobs: list[_Blob]) -> Iterable[list[_Blob]]:
    """Blobs (sorted by offset) grouped into runs of adjacent ones of at most ``_MAX_READ``
    bytes (a single larger blob forms its own run)."""
    run: list[_Blob] = []
    for blob in blobs:
        if run and blob[3] == run[-1][3]:  # the same shared blob
            run.append(blob)
            continue
        if run and (blob[3] != run[-1][3] + run[-1][4] or blob[3] + blob[4] - run[0][3] > _MAX_READ):
            yield run
            run = []
        run.append(blob)
    if run:
        yield run


def _decode(path: str, data: pa.Buffer, start: int, blob: _Blob,
            shared: dict[int, pa.Table] | None = None) -> pa.Table:
    """The table of one blob within ``data`` (read from offset ``start``), verified; of a
    shared blob, the bin's rows (the whole blob decoded once per ``shared`` cache)."""
    state, b, _, offset, length, crc, rows, _, first = blob
    where = f"{path}: state {state!r} bin {b} (offset {offset}, {length} bytes)"
    if first >= 0:
        whole = None if shared is None else shared.get(offset)
        if whole is None:
            whole = _decode_stream(where, data, start, offset, length, crc)
            if shared is not None:
                shared[offset] = whole
        if first + rows > whole.num_rows:
            raise SnapshotError(f"{where}: rows [{first}, {first + rows}) of a shared blob of "
                                f"{whole.num_rows} rows")
        return whole.slice(first, rows)
    table = _decode_stream(where, data, start, offset, length, crc)
    if table.num_rows != rows:
        raise SnapshotError(f"{where}: {table.num_rows} rows, index says {rows}")
    return table


def _check_run(path: str, data: pa.Buffer, start: int, run: list[_Blob]) -> None:
    """Check every blob of ``run`` (read from offset ``start`` of ``path`` into ``data``)
    against its crc32, a shared blob once, naming its bins."""
    spans: dict[tuple[int, int, int], list[int]] = {}
    for blob in run:
        spans.setdefault((blob[3], blob[4], blob[5]), []).append(blob[1])
    for (offset, length, crc), bins in spans.items():
        named = f"bin {bins[0]}" if len(bins) == 1 else f"bins {bins}"
        _checked(f"{path}: state {run[0][0]!r} {named} (offset {offset}, {length} bytes)",
                 data, start, offset, length, crc)


def _checked(where: str, data: pa.Buffer, start: int, offset: int, length: int,
             crc: int) -> pa.Buffer:
    """The ``length`` bytes at ``offset`` within ``data`` (read from offset ``start``).

    Raises:
        SnapshotError: they are cut short by the end of the file, or their crc32 is not ``crc``.
    """
    if offset - start + length > data.size:
        raise SnapshotError(f"{where}: file truncated (read {max(0, data.size - offset + start)} "
                            f"bytes)")
    view = data.slice(offset - start, length)
    if zlib.crc32(view) != crc:
        raise SnapshotError(f"{where}: crc32 {zlib.crc32(view):#010x}, index says {crc:#010x}")
    return view


def _decode_stream(where: str, data: pa.Buffer, start: int, offset: int, length: int,
                   crc: int) -> pa.Table:
    """The IPC stream at ``offset`` within ``data`` (read from offset ``start``), its crc32
    checked."""
    view = _checked(where, data, start, offset, length, crc)
    try:
        return pa.ipc.open_stream(view).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SnapshotError(f"{where}: cannot decode the Arrow IPC stream: {exc}") from exc


__all__ = ["FORMAT", "MANIFEST", "Snapshot", "SnapshotError", "WorkerPart", "commit_snapshot",
           "committed_epochs", "delete_snapshot", "fsync_path", "prune", "snapshot_dir",
           "write_worker_part"]
