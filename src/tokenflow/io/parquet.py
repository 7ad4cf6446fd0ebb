"""A committing Parquet sink: ``to_parquet``, and readers that honour its manifest.

Source: distributed-DBSP design, "Output" (output is produced per step; ``write(step, output)``
discards a step produced before, optionally checking that the new output matches the old, and
appends the next one).  Here a step is an epoch: each epoch is committed whole, by renaming,
with its files named independently of the number of workers W, and the dataset manifest is
written after the epoch directories it lists.  Runtime-neutral: pyarrow, numpy and the
dataflow layer only, no pyspark.

Protocol (one dataset directory ``path``; ``<p>`` is the partition column name, ``<b>`` an
epoch, or with ``granularity`` the first time of a bin ``[b, b + granularity)``)::

    writer, every worker           when its input frontier has passed epoch b:
        _staging/<p>=<b>/.<run>-<worker>-<seq>.parquet.tmp   pq.write_table, then os.replace to
        _staging/<p>=<b>/<run>-<worker>-<seq>.parquet        and send (b, that path, rows,
                                                              worker, seq, row hash) to the
                                                              committer
    committer, one worker          when its input frontier has passed epoch b (so every
                                   worker has staged its file of b):
        .<p>=<b>.<id>.commit/part-00000.parquet ...   staged files hard-linked in, by
                                                      (worker, seq), numbered from 0
        .<p>=<b>.<id>.commit/_manifest.json, _SUCCESS  (files, rows, bytes, row hash)
        <p>=<b>  -> .<p>=<b>.<id>.trash               the old epoch, if any, moved aside
        .<p>=<b>.<id>.commit -> <p>=<b>               the commit point of epoch b
        rm -r .<p>=<b>.<id>.trash
        _tokenflow_manifest.json                      tmp + os.replace, after each activation
                                                      of the committer that changed anything

Every name a reader could trip over starts with ``_`` or ``.``, which pyarrow datasets and
Spark skip, so ``pyarrow.dataset.dataset(path)`` and ``spark.read.parquet(path)`` read whole
epochs only, at any moment, even after a kill (there is a short window during the swap of an
epoch that already existed in which that epoch is absent, never partial).

Re-runs: an earlier run's output is never wiped up front.  Each epoch the new run commits
replaces the old directory whole, whatever the old and new worker counts; once the new run's
frontier has passed an epoch it wrote nothing for, the old epoch directory of that value is
removed; when the stream ends, every ``<p>=*`` directory the run did not commit is removed.  So
a complete run leaves exactly its own output, and a killed one leaves "epochs below the
manifest's ``frontier`` from this run, later ones possibly from an earlier run", each epoch
whole.

Replays (exactly-once recovery): a run whose worker has ``worker.replay`` set (a restart after a
crash, from the last checkpoint or from scratch) or whose state was restored from a snapshot
(``worker.restore``) re-executes epochs the failed run may have committed.  Such a run treats
the epochs the dataset manifest lists when it starts (after the clean-up above, which also
lists epochs committed whole before a kill cut the manifest update short) as the job's output
so far:

* a listed epoch is not committed again: its staged files are deleted and its directory is
  left untouched (readers never see it vanish); with ``verify=True`` the replayed rows are
  compared with the committed ones as a multiset (row count and an order-independent row
  hash, the same at any worker count, recorded in each epoch's ``_manifest.json`` at commit
  time; an epoch committed without one is read back) and a difference fails the job;
* an epoch not listed is committed as usual (appended);
* a listed epoch the frontier passes without the replay writing anything is kept (with
  ``verify``, rows there are a difference); after a restore from the snapshot at epoch e, the
  job's epochs below e are those the restored committer state records, and other listed
  epochs below e, like unlisted directories, are removed as in a re-run;
* after a restore from the snapshot at epoch e, output the job had before e (epochs committed,
  or staged and since committed by the failed run) that the dataset no longer holds is a gap
  the replay cannot fill: the job fails naming the epochs and the path.  A manifest
  ``frontier`` below e alone is no gap (it is written with commits and lags over epochs
  without rows; epochs the snapshot held are committed by the replay).

A replay trusts the manifest to be its own job's: a replay over another job's output keeps that
output (``verify=True`` detects it as a difference).

Not handled: two jobs writing the same ``path`` at once; durability across power loss (no
fsync: a kill of any process is survived, a crash of the machine may not be); object stores
(the protocol needs ``os.rename``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenflow.dataflow.operators.generic import unary_frontier
from tokenflow.dataflow.state import LocalState
from tokenflow.faults import crash_point

if TYPE_CHECKING:
    from tokenflow.dataflow.capability import Capability
    from tokenflow.dataflow.channels import ChannelHost, Pull, Push
    from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
    from tokenflow.dataflow.operators.generic import OperatorInfo
    from tokenflow.dataflow.stream import Stream

__all__ = [
    "COMMITTER",
    "EPOCH_MANIFEST",
    "FORMAT",
    "MANIFEST",
    "STAGING",
    "SUCCESS",
    "ManifestError",
    "ParquetSinkError",
    "ToWorker",
    "committed_epochs",
    "read_committed",
    "read_manifest",
    "to_parquet",
]

FORMAT = 1
"""Version of the manifests' layout (``"format"`` in both)."""
MANIFEST = "_tokenflow_manifest.json"
"""The dataset manifest, ``path/_tokenflow_manifest.json``."""
EPOCH_MANIFEST = "_manifest.json"
"""Per committed epoch, ``path/<p>=<b>/_manifest.json``: its files, rows and bytes."""
SUCCESS = "_SUCCESS"
"""Empty marker in every committed epoch directory (the Hadoop/Spark convention)."""
STAGING = "_staging"
"""Where writers stage their files until the committer moves them in."""

COMMITTER = 0
"""The worker index of the committer."""
_READ_ATTEMPTS = 20


class ParquetSinkError(RuntimeError):
    """Writing or committing an epoch failed: names the operator, the epoch and the path."""


class ManifestError(ValueError):
    """``path`` has no readable ``_tokenflow_manifest.json`` (or one for another layout), or a
    committed epoch could not be read consistently; names the path."""


# -- records to Arrow --------------------------------------------------------------------------


def _as_table(batches: list[Any], columns: list[str] | None, name: str) -> pa.Table:
    """One table from the batches of an epoch: Arrow batches/tables, lists of dicts, or lists of
    tuples named by ``columns``.

    Raises:
        TypeError: tuples (or other unnamed records) and no ``columns``.
    """
    if all(isinstance(b, (pa.RecordBatch, pa.Table)) for b in batches):
        tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in batches]
        return pa.concat_tables(tables)
    rows = [r for b in batches for r in b]
    if rows and isinstance(rows[0], dict):
        return pa.Table.from_pylist(rows)
    if columns is None:
        raise TypeError(f"{name}: records are {type(rows[0]).__name__}, give columns=[...] names")
    return pa.Table.from_arrays([pa.array(list(c)) for c in zip(*rows, strict=True)], names=columns)


# -- a multiset hash of rows ---------------------------------------------------------------------

HASH_FORMAT = 1
"""Version of the row hash recorded in ``_manifest.json`` (``"hash_format"``)."""
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)
_PRIME = np.uint64(0x100000001B3)
_FLOAT_TAG = np.uint64(0x243F6A8885A308D3)
_HASH_SLICE = 16384


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _column_hashes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A uint64 hash per value, the same for equal values whatever the chunking, the integer
    width, or whether the column is typed null (a null hashes as ``_NULL_HASH`` in any type)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    if pa.types.is_null(kind) or len(array) == 0:
        return np.full(len(array), _NULL_HASH, dtype=np.uint64)
    hashes: np.ndarray
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        filled = pc.fill_null(array.cast(pa.int64()) if pa.types.is_boolean(kind) else array, 0)
        hashes = _mix(np.asarray(filled.to_numpy(zero_copy_only=False)).astype(np.int64).view(np.uint64))
    elif pa.types.is_floating(kind):
        floats = np.asarray(pc.fill_null(array.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False))
        floats = np.where(floats == 0.0, 0.0, floats)  # -0.0 == 0.0
        floats[np.isnan(floats)] = np.nan  # one NaN
        hashes = _mix(floats.view(np.uint64) ^ _FLOAT_TAG)
    elif (pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_time(kind)
          or pa.types.is_duration(kind)):  # by their integer value in their unit
        raw = pc.fill_null(array.view(pa.int64() if kind.bit_width == 64 else pa.int32()), 0)
        hashes = _mix(np.asarray(raw.to_numpy(zero_copy_only=False)).astype(np.int64).view(np.uint64))
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
          or pa.types.is_large_binary(kind)):
        hashes = _bytes_hashes(array)
    else:  # decimals, nested and other types: by their Python representation
        hashes = _bytes_hashes(pa.array([repr(v) for v in array.to_pylist()], pa.large_string()))
    if array.null_count:
        hashes[~np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)] = _NULL_HASH
    return hashes


def _bytes_hashes(array: pa.Array) -> np.ndarray:
    """A uint64 hash per value of a string or binary array (equal bytes hash alike in all four
    types), computed on the Arrow buffers without Python objects: a polynomial over the bytes
    of each value, mixed with its length (null slots get whatever their range holds), in
    slices of ``_HASH_SLICE`` values to bound the temporary arrays (a few times the bytes)."""
    binary = array.cast(pa.large_binary())
    if len(binary) > _HASH_SLICE:
        return np.concatenate([_bytes_hashes(binary.slice(i, _HASH_SLICE))
                               for i in range(0, len(binary), _HASH_SLICE)])
    n = len(binary)
    _, offsets_buffer, data_buffer = binary.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[binary.offset:binary.offset + n + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    sums = np.zeros(n, dtype=np.uint64)
    if last > first and data_buffer is not None:
        data = np.frombuffer(data_buffer, dtype=np.uint8)[first:last]
        starts = offsets[:-1] - first
        position = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
        powers = np.cumprod(np.full(int(lengths.max()), _PRIME, dtype=np.uint64))
        terms = (data.astype(np.uint64) + np.uint64(1)) * powers[position]
        filled = lengths > 0
        sums[filled] = np.add.reduceat(terms, starts[filled])
    return _mix(sums ^ _mix(lengths.astype(np.uint64) + np.uint64(1)))


def _rows_hash(table: pa.Table) -> int:
    """An order-independent hash of ``table`` as a multiset of rows: the sum modulo 2**64 of a
    per-row hash (columns taken by name, in sorted order), so the same rows give the same
    value however they are split into files or batches and in whatever order, e.g. at any
    worker count.  Equal values of a column hash alike across integer widths and chunkings,
    and a null alike in any type (a worker whose rows of a column are all null stages it typed
    null); ints and floats of equal value do not.  ``HASH_FORMAT`` names this layout.
    """
    if table.num_rows == 0:
        return 0
    acc = np.zeros(table.num_rows, dtype=np.uint64)
    for name in sorted(table.column_names):
        salt = _bytes_hashes(pa.array([name], pa.large_string()))[0]
        acc = _mix(acc * _PRIME + (_column_hashes(table.column(name)) ^ salt))
    return int(np.sum(acc, dtype=np.uint64))


# -- small file-system helpers -----------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """``value`` as JSON: ints stay ints, anything else becomes its ``str``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    return value


def _write_json(path: str, document: dict[str, Any]) -> None:
    """Replace ``path`` by ``document`` atomically (hidden tmp file in the same directory, then
    ``os.replace``); the tmp file is removed on error."""
    directory, base = os.path.split(path)
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        _remove_file(tmp)
        raise


def _read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a JSON object")
    return document


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _link(source: str, target: str) -> None:
    """A second name for ``source`` (a hard link; a copy where links are not supported)."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        shutil.copyfile(source, target)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _epoch_dir(partition: str, value: Any) -> str:
    return f"{partition}={value}"


def _parse_value(text: str) -> Any:
    """A partition directory's value: an int when it spells one, else the string."""
    return int(text) if re.fullmatch(r"-?\d+", text) else text


class _OnePusher:
    __slots__ = ("pusher",)

    def __init__(self, pusher: Push) -> None:
        self.pusher = pusher

    def push(self, message: Any) -> None:
        self.pusher.push(message)


class ToWorker:
    """A pact sending every record to worker ``index`` (the committer's input).

    Like ``Exchange`` with a constant key, but the target is known before any record is sent
    (keyed exchanges route through the job's routing table, which may move keys).
    """

    name = "ToWorker"

    def __init__(self, index: int = COMMITTER) -> None:
        self.index = index

    def connect(self, host: ChannelHost, identifier: int, path: tuple[int, ...]) -> tuple[Push, Pull]:
        pushers, puller = host.allocate(identifier, path)
        return _OnePusher(pushers[self.index]), puller


# -- the sink ----------------------------------------------------------------------------------


def to_parquet(stream: Stream, path: str | os.PathLike[str], columns: list[str] | None = None,
               name: str = "ToParquet", granularity: int | None = None,
               partition: str = "time", verify: bool = False) -> Stream:
    """Write ``stream`` as a Parquet dataset ``path/<partition>=<b>/part-NNNNN.parquet``, one
    directory per epoch, each committed whole once every worker's input has passed it.

    Records: Arrow ``RecordBatch``es or tables, lists of dicts, or lists of tuples named by
    ``columns``.  Each worker stages its rows of an epoch in one hidden file; one committer
    worker moves the staged files of the epoch into a fresh directory (``part-00000.parquet``,
    ``part-00001.parquet``, ... ordered by writing worker, so names do not depend on W or on
    which worker wrote them), adds ``_manifest.json`` (files, rows, bytes) and ``_SUCCESS``,
    swaps it in place of any earlier directory of that epoch, and records the commit in
    ``path/_tokenflow_manifest.json``::

        {"format": 1, "partition": "time", "granularity": null, "run": "<hex id>",
         "frontier": 7,            # every epoch < 7 of this run is committed; null: the stream
                                   # ended and the dataset is exactly this run's output
         "epochs": {"3": {"value": 3, "dir": "time=3", "files": ["part-00000.parquet"],
                          "rows": 120, "bytes": 4242, "run": "<hex id>", "commit": "<hex id>"}}}

    Epochs with no rows on any worker get no directory.  ``spark.read.parquet(path)`` and
    ``pyarrow.dataset.dataset(path, partitioning="hive")`` read the dataset at any moment
    (hidden names for everything unfinished); ``read_committed(path)`` reads exactly the
    manifest's epochs.  See the module docstring for the full protocol and for re-runs (an
    earlier run's epochs are replaced one by one, never wiped first).

    Replay (exactly-once recovery, see the module docstring): when the committer's worker has
    ``worker.replay`` set or was restored from a snapshot (``worker.restore``), epochs the
    dataset manifest already lists are not committed again (their staged files are deleted,
    their directories left untouched) and only new epochs are appended; listed epochs the
    replay writes nothing for are kept.  Each epoch's ``_manifest.json`` records the row hash
    ``verify`` compares (``"hash"``, 16 hex digits, ``"hash_format": 1``; also per file).

    With ``granularity`` (integer times only), times ``[b, b + granularity)`` go to
    ``<partition>=<b>`` (``b = t - t % granularity``), committed once the frontier passes
    ``b + granularity - 1``.

    Args:
        stream: the records to write (any runtime: ``thread``, ``process``, ``spark``; on a
            cluster ``path`` must be a shared file system every worker can rename within).
        path: the dataset directory (created when missing).
        columns: column names for tuple records.
        name: operator name (the writers; the committer is ``<name>.Commit``), used in errors.
        granularity: bin width in time units, or None for one epoch per time.
        partition: the partition column name (not starting with ``_`` or ``.``, no ``=`` or
            path separator).
        verify: in replay mode, check that each replayed epoch already committed has the same
            rows as the committed one, as a multiset (row count and an order-independent hash
            of the rows: independent of worker count, file split and row order; ints and
            floats of equal value differ, a null is a null in any type); a difference fails
            the job.  No effect outside replay mode.

    Returns:
        The committer's output: on the committer worker one ``(epoch, rows)`` record per
        committed epoch, at a time of that epoch; probe it to wait for commits (its frontier
        passes an epoch once the epoch's commit is on disk).

    Raises:
        ValueError: ``granularity <= 0`` or a bad ``partition`` name.
        TypeError: tuples and no ``columns``; a non-integer time with ``granularity`` (from
            the operator, naming it and the time).
        ParquetSinkError: (from the operators, failing the job) a write, rename or manifest
            update failed, e.g. a full disk or a read-only directory (naming the operator, the
            epoch and the path; the tmp file is removed), or ``path`` holds a manifest of
            another layout; in replay mode, with ``verify`` a replayed epoch differs from the
            committed one (naming the operator, the epoch, its directory and the rows
            committed and replayed; the committed epoch is left as it was), and after a
            restore output the job had before the snapshot's epoch is missing (naming the
            range of epochs and the path).
    """
    if granularity is not None and granularity <= 0:
        raise ValueError(f"{name}: granularity must be > 0, got {granularity}")
    if (not partition or partition[0] in "_." or "=" in partition or "/" in partition
            or os.sep in partition):
        raise ValueError(f"{name}: bad partition column name {partition!r} (non-empty, not "
                         "starting with '_' or '.', no '=' or '/')")
    root = os.path.abspath(os.fspath(path))

    def bin_of(t: Any) -> Any:
        if granularity is None:
            return t
        if not isinstance(t, int):
            raise TypeError(f"{name}: granularity needs integer times, got time {t!r}")
        return t - t % granularity

    def last_time(b: Any) -> Any:
        return b if granularity is None else b + granularity - 1

    staged = unary_frontier(stream, "pipeline", name,
                            _stage_constructor(root, columns, name, partition, bin_of, last_time))
    worker = getattr(stream.scope, "worker", None)
    return unary_frontier(staged, ToWorker(COMMITTER), f"{name}.Commit",
                          _commit_constructor(root, name, partition, granularity, last_time, verify,
                                              worker))


def _stage_constructor(root: str, columns: list[str] | None, name: str, partition: str,
                       bin_of: Callable[[Any], Any], last_time: Callable[[Any], Any]) -> Any:
    """The writers: per worker, stage each completed epoch in one hidden file and tell the
    committer ``(epoch, staged path relative to root, rows, worker, seq, row hash)`` (the hash:
    ``_rows_hash`` of the file's rows, 0 without rows)."""

    def constructor(cap: Capability, info: OperatorInfo) -> Any:
        run = uuid.uuid4().hex[:12]
        worker = info.worker_index
        # epoch -> batches not yet staged (state: snapshotted, and restored at any W)
        batches_of: LocalState[dict[Any, list[Any]]] = info.state(
            "pending", LocalState(dict, _merge_lists, times=list, empty=_is_empty))
        tokens: dict[Any, Capability] = {b: cap.delayed(b) for b in batches_of.value}
        cap.drop()
        seq = [0]

        def stage(b: Any, batches: list[Any]) -> tuple[str | None, int, int, int]:
            """Write ``batches`` (epoch ``b``) to a staged file: ``(path relative to root or
            None when there are no rows, rows, sequence number, row hash)``."""
            table = _as_table(batches, columns, name)
            number = seq[0]
            seq[0] += 1
            if table.num_rows == 0:
                return None, 0, number, 0
            digest = _rows_hash(table)
            relative = os.path.join(STAGING, _epoch_dir(partition, b),
                                    f"{run}-{worker:05d}-{number:06d}.parquet")
            final = os.path.join(root, relative)
            directory, base = os.path.split(final)
            tmp = os.path.join(directory, f".{base}.tmp")
            try:
                os.makedirs(directory, exist_ok=True)
                pq.write_table(table, tmp)
                os.replace(tmp, final)
            except Exception as error:
                _remove_file(tmp)
                raise ParquetSinkError(
                    f"operator {name!r} (worker {worker}): cannot write epoch {b!r} to {final}: "
                    f"{type(error).__name__}: {error}") from error
            except BaseException:
                _remove_file(tmp)
                raise
            return relative, table.num_rows, number, digest

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            pending = batches_of.value
            for ref, batch in inp:
                b = bin_of(ref.time)
                if b not in tokens:
                    tokens[b] = ref.retain()
                pending.setdefault(b, []).append(batch)
            ready = [b for b in tokens if not inp.frontier.less_equal(last_time(b))]
            for b in ready:
                held = tokens.pop(b)
                relative, rows, number, digest = stage(b, pending.pop(b, []))
                out.session(held).give((b, relative, rows, worker, number, digest))
                held.drop()

        return logic

    return constructor


class _Committer:
    """The committer's state and file operations (on the one worker records are routed to)."""

    def __init__(self, root: str, name: str, partition: str, granularity: int | None,
                 verify: bool = False, replay: bool = False, restart: int | None = None) -> None:
        self.root = root
        self.name = name
        self.label = f"{name}.Commit"
        self.partition = partition
        self.granularity = granularity
        self.verify = verify
        self.replay = replay
        """Replay mode: epochs the dataset manifest lists are kept, not committed again."""
        self.restart = restart
        """The epoch of the snapshot this run was restored from, or None."""
        self.run = uuid.uuid4().hex[:12]
        self.manifest_path = os.path.join(root, MANIFEST)
        self.epochs: dict[str, dict[str, Any]] = {}
        self.committed: set[str] = set()  # epoch directories of this job (committed, or kept)
        self.others: dict[str, Any] = {}  # epoch directories of earlier runs: dir -> value
        self.prior: dict[str, dict[str, Any]] = {}  # replay: dir -> entry listed at the start
        self.had_manifest = False
        self.frontier: Any = None
        self.dirty = False
        self.finished = False

    # -- start-up: recover from an earlier, possibly killed, run -------------------------------

    def start(self, keep: set[str] | None = None, restored: set[str] | None = None,
              held: dict[str, list[str]] | None = None) -> None:
        """Clean up after an earlier run: finish or undo interrupted swaps, remove staging
        (but the staged files in ``keep``: paths relative to the root that a restored
        committer still has to commit), unfinished commit directories and tmp files (all
        hidden), and reconcile the dataset manifest with the epoch directories present.  In
        replay mode, note the epochs the manifest then lists (kept, not committed again) and,
        after a restore, check that no output the job had when the snapshot was taken is lost
        (``_check_gap``: ``restored``, the epoch directories it had committed, and ``held``,
        epoch directory -> staged files of the epochs it was still collecting).

        Writers cannot stage before this runs: their input frontier stays at the first time
        until every worker, this one included, has built the dataflow.

        Raises:
            ParquetSinkError: the manifest is unreadable or of another layout, a file
                operation failed (naming the path), or output committed before the restored
                snapshot is missing (naming the epochs and the path).
        """
        root = self.root
        if not os.path.isdir(root):
            if os.path.exists(root):
                raise ParquetSinkError(f"operator {self.name!r}: {root} is not a directory")
        else:
            try:
                self._recover(root, keep or set())
            except OSError as error:
                raise ParquetSinkError(f"operator {self.label!r}: cannot clean up {root} "
                                       f"after an earlier run: {error}") from error
        if self.replay:
            self.prior = {entry["dir"]: entry for entry in self.epochs.values()}
            if self.restart is not None:
                self._check_gap(restored or set(), held or {})

    def _check_gap(self, restored: set[str], held: dict[str, list[str]]) -> None:
        """Replay from the snapshot at ``restart``: fail when output of epochs before it is
        lost, since the replay starts at ``restart`` and cannot produce it again: an epoch the
        job had committed (``restored``) that the dataset no longer lists, or an epoch the
        snapshot still held staged (``held``) that is not listed and whose staged files are
        gone (a later run committed them; that output was then removed).  A manifest
        ``frontier`` below ``restart`` by itself is no gap: the frontier is written with
        commits, so it lags over epochs without rows, and this run commits the held epochs."""
        missing = [d for d in restored if d not in self.prior]
        missing += [d for d, paths in held.items() if d not in self.prior and d not in restored
                    and not all(os.path.exists(os.path.join(self.root, p)) for p in paths)]
        if not missing:
            return
        values = sorted((_parse_value(d.split("=", 1)[1]) for d in missing),
                        key=lambda v: (isinstance(v, str), v))
        if all(isinstance(v, int) for v in values):
            span = f"epochs [{values[0]}, {self.restart})"
        else:
            span = f"epochs before {self.restart}"
        shown = ", ".join(_epoch_dir(self.partition, v) for v in values[:10])
        if len(values) > 10:
            shown += f", ... ({len(values)} in all)"
        if not self.had_manifest:
            state = f"{self.root} has no {MANIFEST}"
        elif self.frontier is None:
            state = f"its {MANIFEST} says the stream ended (frontier null)"
        else:
            state = f"its {MANIFEST} has frontier {self.frontier!r}"
        raise ParquetSinkError(
            f"operator {self.label!r}: output is missing from {self.root}: {span}: the job had "
            f"written {shown} by its snapshot at epoch {self.restart} (committed, or staged and "
            f"committed later), but they are not in the dataset ({state}); a replay from epoch "
            f"{self.restart} cannot write them again: put them back, restore an earlier "
            "snapshot, or rerun the job from scratch")

    def _recover(self, root: str, keep: set[str]) -> None:
        prefix = f"{self.partition}="
        entries = sorted(os.listdir(root))
        for entry in entries:  # an interrupted swap: put the old epoch back
            match = re.fullmatch(r"\.(.+)\.[0-9a-f]+\.trash", entry)
            if match and match.group(1).startswith(prefix):
                final = os.path.join(root, match.group(1))
                if os.path.exists(final):
                    _remove_tree(os.path.join(root, entry))
                else:
                    os.rename(os.path.join(root, entry), final)
        for entry in entries:
            full = os.path.join(root, entry)
            if re.fullmatch(r"\..+\.[0-9a-f]+\.(commit|removed)", entry):
                _remove_tree(full)
            elif entry.startswith(".") and entry.endswith(".tmp") and os.path.isfile(full):
                _remove_file(full)
        staging = os.path.join(root, STAGING)
        if os.path.exists(staging) and not keep:
            shutil.rmtree(staging)
        elif os.path.exists(staging):
            for folder, _, names in os.walk(staging):
                for file_name in names:
                    full = os.path.join(folder, file_name)
                    if os.path.relpath(full, root) not in keep:
                        _remove_file(full)
        try:
            document = _read_json(self.manifest_path)
        except ValueError as error:
            raise ParquetSinkError(f"operator {self.name + '.Commit'!r}: unreadable manifest "
                                   f"{self.manifest_path}: {error} (remove it to start over)") from error
        if document is not None:
            if document.get("format") != FORMAT or document.get("partition") != self.partition:
                raise ParquetSinkError(
                    f"operator {self.name + '.Commit'!r}: {self.manifest_path} is a dataset of format "
                    f"{document.get('format')!r} partitioned by {document.get('partition')!r}, "
                    f"not format {FORMAT} by {self.partition!r}; write elsewhere or remove it")
            self.epochs = dict(document.get("epochs", {}))
            self.frontier = document.get("frontier")
            self.had_manifest = True
        listed = {entry["dir"]: key for key, entry in self.epochs.items()}
        present = {e for e in os.listdir(root)
                   if e.startswith(prefix) and os.path.isdir(os.path.join(root, e))}
        changed = False
        for directory, key in listed.items():  # listed but gone (a removal cut short)
            if directory not in present:
                del self.epochs[key]
                changed = True
        for directory in sorted(present):
            value = _parse_value(directory[len(prefix):])
            self.others[directory] = value
            try:
                own = _read_json(os.path.join(root, directory, EPOCH_MANIFEST))
            except ValueError:
                own = None
            if own is None:
                continue  # not ours (or an older layout): removed once this run passes it
            key = str(_json_value(value))
            if self.epochs.get(key, {}).get("commit") != own.get("commit"):
                # Committed whole, but the run was killed before the dataset manifest said so.
                self.epochs[key] = _dataset_entry(own)
                changed = True
        if changed:
            self._write_manifest()

    # -- commits -----------------------------------------------------------------------------

    def commit(self, b: Any, records: list[tuple[Any, ...]]) -> int:
        """Link the staged files of epoch ``b`` into a fresh directory and swap it in, then
        drop the staged names; returns the epoch's rows.  The staged files stay until the
        commit rename, so a crash before it loses nothing: the restarted committer (restored
        from a checkpoint that still lists them as staged) commits them again.  In replay
        mode an epoch the manifest listed at the start is not committed again
        (``_discard``).

        Raises:
            ParquetSinkError: a rename or write failed (naming the epoch and the path); with
                ``verify``, a replayed epoch differs from the committed one.
        """
        root = self.root
        directory = _epoch_dir(self.partition, b)
        if self.replay and directory in self.prior:
            return self._discard(b, directory, records)
        final = os.path.join(root, directory)
        commit_id = uuid.uuid4().hex[:16]
        work = os.path.join(root, f".{directory}.{commit_id}.commit")
        trash = os.path.join(root, f".{directory}.{commit_id}.trash")
        files: list[dict[str, Any]] = []
        moved_aside = False
        try:
            os.makedirs(work)
            ordered = sorted((r for r in records if r[1] is not None), key=lambda r: (r[3], r[4]))
            digests = []
            for i, record in enumerate(ordered):
                relative, rows = record[1], record[2]
                assert relative is not None
                digest = self._record_hash(b, record)
                digests.append(digest)
                target = os.path.join(work, f"part-{i:05d}.parquet")
                _link(os.path.join(root, relative), target)
                files.append({"name": os.path.basename(target), "rows": rows,
                              "bytes": os.path.getsize(target), "hash": f"{digest:016x}"})
            own = {"format": FORMAT, "partition": self.partition, "value": _json_value(b),
                   "dir": directory, "files": files, "rows": sum(f["rows"] for f in files),
                   "bytes": sum(f["bytes"] for f in files), "run": self.run, "commit": commit_id,
                   "hash": f"{sum(digests) % 2**64:016x}", "hash_format": HASH_FORMAT}
            _write_json(os.path.join(work, EPOCH_MANIFEST), own)
            with open(os.path.join(work, SUCCESS), "wb"):
                pass
            if os.path.lexists(final):
                os.rename(final, trash)
                moved_aside = True
            crash_point("parquet.commit")
            os.rename(work, final)  # the commit point of epoch b
        except OSError as error:
            if moved_aside and not os.path.exists(final):
                try:
                    os.rename(trash, final)
                except OSError:
                    pass
            _remove_tree(work)
            raise ParquetSinkError(f"operator {self.name + '.Commit'!r}: cannot commit epoch "
                                   f"{b!r} to {final}: {error}") from error
        if moved_aside:
            _remove_tree(trash)
        for record in ordered:  # committed: the staged names go
            _remove_file(os.path.join(root, record[1]))
        try:
            os.rmdir(os.path.join(root, STAGING, directory))
        except OSError:
            pass
        self.epochs[str(_json_value(b))] = _dataset_entry(own)
        self.committed.add(directory)
        self.dirty = True
        return int(own["rows"])

    def _record_hash(self, b: Any, record: tuple[Any, ...]) -> int:
        """The row hash of a writer's staged file (sent with it; read from the file for a
        record restored from a snapshot of an older version, which did not send it).

        Raises:
            ParquetSinkError: the staged file cannot be read (naming the epoch and the path).
        """
        if len(record) > 5:
            return int(record[5])
        if record[1] is None:
            return 0
        staged = os.path.join(self.root, record[1])
        try:
            return _rows_hash(pq.read_table(staged))
        except (OSError, pa.ArrowException) as error:
            raise ParquetSinkError(f"operator {self.label!r}: cannot read the staged file of "
                                   f"epoch {b!r}, {staged}: {error}") from error

    def _committed_digest(self, b: Any, directory: str) -> tuple[int, int]:
        """``(rows, row hash)`` of a committed epoch: from its ``_manifest.json``, or, for an
        epoch committed without a hash (an older version), by reading its files.

        Raises:
            ParquetSinkError: the committed files cannot be read (naming the epoch and path).
        """
        final = os.path.join(self.root, directory)
        try:
            own = _read_json(os.path.join(final, EPOCH_MANIFEST))
        except (OSError, ValueError):
            own = None
        if own is not None and own.get("hash_format") == HASH_FORMAT and isinstance(own.get("hash"), str):
            return int(own.get("rows", 0)), int(own["hash"], 16)
        if own is not None:
            names = [f["name"] for f in own.get("files", [])]
        else:
            names = list(self.prior[directory].get("files", []))
        rows = total = 0
        try:
            for file_name in names:
                table = pq.read_table(os.path.join(final, file_name))
                rows += table.num_rows
                total += _rows_hash(table)
        except (OSError, pa.ArrowException) as error:
            raise ParquetSinkError(f"operator {self.label!r}: cannot read committed epoch {b!r} "
                                   f"in {final} to verify its replay: {error}") from error
        return rows, total % 2**64

    def _discard(self, b: Any, directory: str, records: list[tuple[Any, ...]]) -> int:
        """Replay mode: epoch ``b`` is committed already; delete its staged files, leave the
        committed directory untouched and return its rows.

        Raises:
            ParquetSinkError: with ``verify``, the replayed rows differ from the committed ones
                as a multiset (naming the epoch, the directory and both row counts).
        """
        entry = self.prior[directory]
        final = os.path.join(self.root, directory)
        problem = None
        if self.verify:
            new_rows = sum(int(r[2]) for r in records)
            new_hash = sum(self._record_hash(b, r) for r in records) % 2**64
            old_rows, old_hash = self._committed_digest(b, directory)
            if (old_rows, old_hash) != (new_rows, new_hash):
                problem = (f"operator {self.label!r}: replayed epoch {b!r} differs from its committed "
                           f"output {final}: {old_rows} rows committed (hash {old_hash:016x}), "
                           f"{new_rows} rows replayed (hash {new_hash:016x}); the committed epoch "
                           "is left as it is")
        for record in records:
            if record[1] is not None:
                _remove_file(os.path.join(self.root, record[1]))
        try:
            os.rmdir(os.path.join(self.root, STAGING, directory))
        except OSError:
            pass
        self.committed.add(directory)
        if problem is not None:
            raise ParquetSinkError(problem)
        return int(entry.get("rows", 0))

    def _own(self, directory: str, value: Any) -> bool:
        """Replay mode: is epoch directory ``directory`` (listed or not) output of this job
        that the replay passed without writing?  Listed at the start, and not below the
        restored snapshot's epoch (what the job had committed below it is in ``committed``
        already, restored with the state; other epochs below it are an earlier job's)."""
        if directory not in self.prior:
            return False
        if self.restart is None or not isinstance(value, int) or isinstance(value, bool):
            return True
        last = value if self.granularity is None else value + self.granularity - 1
        return last >= self.restart

    def _keep(self, directory: str, value: Any) -> None:
        """Replay mode: the frontier passed epoch ``value`` of this job's earlier run without
        the replay writing anything for it: keep it (with ``verify``, rows there are a
        mismatch).

        Raises:
            ParquetSinkError: with ``verify``, the kept epoch has rows (naming the epoch, the
                directory and both row counts).
        """
        self.committed.add(directory)
        rows = int(self.prior[directory].get("rows", 0))
        if self.verify and rows:
            raise ParquetSinkError(
                f"operator {self.label!r}: replayed epoch {value!r} differs from its committed "
                f"output {os.path.join(self.root, directory)}: {rows} rows committed, 0 rows "
                "replayed; the committed epoch is left as it is")

    def advance(self, frontier: list[Any]) -> list[str]:
        """Note the committer's input frontier; returns the directories of earlier runs to
        remove now (epochs the frontier has passed that this run wrote nothing for, or all of
        them once the stream has ended), already dropped from the manifest.  In replay mode
        the job's own epochs among them are kept (``_own``, ``_keep``).

        Raises:
            ParquetSinkError: with ``verify``, see ``_keep``.
        """
        value: Any
        if not frontier:
            value = None
        elif len(frontier) == 1 and isinstance(frontier[0], int) and not isinstance(frontier[0], bool):
            f = frontier[0]
            value = f if self.granularity is None else f - f % self.granularity
        else:
            value = [_json_value(t) for t in frontier]
        # Written with the next commit or removal (a lower bound meanwhile), and at the end.
        self.frontier = value
        if value is None:
            self.dirty = True
        doomed: list[str] = []
        if not self.others:
            return doomed
        for directory, v in list(self.others.items()):
            if directory in self.committed:
                del self.others[directory]
            elif not frontier or (isinstance(value, int) and isinstance(v, int) and v < value):
                del self.others[directory]
                if self.replay and self._own(directory, v):
                    self._keep(directory, v)
                else:
                    doomed.append(directory)
        if doomed:
            gone = set(doomed)
            self.epochs = {k: e for k, e in self.epochs.items()
                           if e["dir"] not in gone or e["dir"] in self.committed}
            self.dirty = True
        return doomed

    def remove(self, directories: Iterable[str]) -> None:
        """Remove epoch directories of earlier runs (moved to a hidden name first, so readers
        never see half of one)."""
        for directory in directories:
            final = os.path.join(self.root, directory)
            aside = os.path.join(self.root, f".{directory}.{uuid.uuid4().hex[:16]}.removed")
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                continue
            except OSError as error:
                raise ParquetSinkError(f"operator {self.name + '.Commit'!r}: cannot remove "
                                       f"{final} of an earlier run: {error}") from error
            _remove_tree(aside)

    def _write_manifest(self) -> None:
        document = {"format": FORMAT, "partition": self.partition, "granularity": self.granularity,
                    "run": self.run, "frontier": self.frontier, "epochs": self.epochs}
        os.makedirs(self.root, exist_ok=True)
        _write_json(self.manifest_path, document)
        self.dirty = False

    def write_manifest(self, epochs: list[Any]) -> None:
        """Write the dataset manifest if anything changed.

        Raises:
            ParquetSinkError: naming the epochs just committed and the manifest path.
        """
        if not self.dirty:
            return
        try:
            self._write_manifest()
        except OSError as error:
            raise ParquetSinkError(f"operator {self.name + '.Commit'!r}: cannot record the commit "
                                   f"of epochs {epochs!r} in {self.manifest_path}: {error}") from error

    def finish(self) -> None:
        """The stream ended: drop the staging directory."""
        _remove_tree(os.path.join(self.root, STAGING))
        self.finished = True


def _merge_lists(a: dict[Any, list[Any]], b: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    """Per-epoch lists of two workers' pending batches, joined (restoring at fewer workers)."""
    for key, items in b.items():
        a.setdefault(key, []).extend(items)
    return a


def _is_empty(value: dict[Any, Any]) -> bool:
    return not value


def _new_commits() -> dict[str, Any]:
    return {"pending": {}, "committed": set()}


def _merge_commits(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    _merge_lists(a["pending"], b["pending"])
    a["committed"] |= b["committed"]
    return a


def _dataset_entry(own: dict[str, Any]) -> dict[str, Any]:
    """The dataset manifest's entry for an epoch, from the epoch's own ``_manifest.json``."""
    return {"value": own.get("value"), "dir": own["dir"],
            "files": [f["name"] for f in own.get("files", [])], "rows": own.get("rows", 0),
            "bytes": own.get("bytes", 0), "run": own.get("run"), "commit": own.get("commit")}


def _commit_constructor(root: str, name: str, partition: str, granularity: int | None,
                        last_time: Callable[[Any], Any], verify: bool, worker: Any) -> Any:
    """The committer: every staged record is routed to one worker, which holds a token per
    epoch being collected and commits the epoch once its input frontier has passed it.

    ``worker`` (the scope's, the one ``info.state`` registers with) tells whether this run
    replays: ``worker.replay``, or state restored from ``worker.restore``."""

    def constructor(cap: Capability, info: OperatorInfo) -> Any:
        active = info.worker_index == COMMITTER
        # epoch -> staged records, and the epoch directories committed so far (state: a job
        # restored from a snapshot continues this run's commits rather than undoing them)
        held: LocalState[dict[str, Any]] = info.state(
            "commits", LocalState(_new_commits, _merge_commits, times=lambda v: list(v["pending"])))
        records_of: dict[Any, list[Any]] = held.value["pending"]
        tokens: dict[Any, Capability] = {b: cap.delayed(b) for b in records_of}
        cap.drop()
        restore = getattr(worker, "restore", None)
        restart = None if restore is None else int(restore.epoch)
        replay = bool(getattr(worker, "replay", False)) or restore is not None
        committer = _Committer(root, name, partition, granularity, verify=verify, replay=replay,
                               restart=restart)
        restored = set(held.value["committed"])
        committer.committed = held.value["committed"]
        if active:
            staged = {_epoch_dir(partition, b): [r[1] for r in records if r[1] is not None]
                      for b, records in records_of.items()}
            committer.start(keep={p for paths in staged.values() for p in paths}, restored=restored,
                            held=staged)

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, batch in inp:
                for record in batch:
                    b = record[0]
                    if b not in tokens:
                        tokens[b] = ref.retain()
                    records_of.setdefault(b, []).append(record)
            if not active or committer.finished:
                return
            ready = [b for b in tokens if not inp.frontier.less_equal(last_time(b))]
            try:
                ready.sort()
            except TypeError:
                pass
            for b in ready:
                token = tokens.pop(b)
                rows = committer.commit(b, records_of.pop(b, []))
                out.session(token).give((b, rows))
                token.drop()
            frontier = inp.frontier.frontier()
            doomed = committer.advance(frontier)
            committer.write_manifest(ready)
            committer.remove(doomed)
            if not frontier:
                committer.finish()

        return logic

    return constructor


# -- readers -----------------------------------------------------------------------------------


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The dataset manifest ``path/_tokenflow_manifest.json`` as a dict (layout in
    ``to_parquet``).

    Raises:
        ManifestError: no manifest (e.g. not written by this sink, or no epoch committed yet),
            unreadable JSON, or another format (naming the path).
    """
    manifest = os.path.join(os.fspath(path), MANIFEST)
    try:
        document = _read_json(manifest)
    except (OSError, ValueError) as error:
        raise ManifestError(f"{manifest}: unreadable dataset manifest: {error}") from error
    if document is None:
        raise ManifestError(f"{os.fspath(path)}: no {MANIFEST}: not a dataset committed by "
                            "tokenflow's to_parquet (or nothing committed yet)")
    if document.get("format") != FORMAT:
        raise ManifestError(f"{manifest}: format {document.get('format')!r}, this reader "
                            f"knows format {FORMAT}")
    return document


def committed_epochs(path: str | os.PathLike[str]) -> list[Any]:
    """The committed epochs of the dataset at ``path``, sorted (ints, or strings for
    non-integer times).

    Raises:
        ManifestError: see ``read_manifest``.
    """
    epochs = [_parse_value(e["dir"].split("=", 1)[1]) for e in read_manifest(path)["epochs"].values()]
    return sorted(epochs, key=lambda v: (isinstance(v, str), v))


class _Changed(Exception):
    """An epoch changed (was swapped) while being read."""


def _partition_type(values: list[Any]) -> pa.DataType:
    """Spark's partition discovery: int when every value fits 32 bits, else long; strings
    otherwise."""
    if all(isinstance(v, int) for v in values):
        if all(-(2**31) <= v < 2**31 for v in values):
            return pa.int32()
        return pa.int64()
    return pa.string()


def read_committed(path: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """The rows of the committed epochs of the dataset at ``path``, epoch by epoch in order,
    with the partition column (named as in the manifest, e.g. ``time``) holding each row's
    epoch, typed as Spark's partition discovery types it (int32 when every value fits, else
    int64, string for non-integer epochs); it replaces a data column of the same name, as in
    Spark.

    Only the manifest's epochs are read, and of each only the files its ``_manifest.json``
    lists: stray files, other directories and anything staged or hidden are ignored.  An epoch
    swapped by a running job while being read is read again.

    Args:
        path: the dataset directory.
        columns: columns to return (data columns and/or the partition column), default all.

    Raises:
        ManifestError: no or unreadable manifest, or a committed epoch whose files cannot be
            read consistently (naming the path).
    """
    root = os.fspath(path)
    for attempt in range(_READ_ATTEMPTS):
        manifest = read_manifest(root)
        try:
            return _read_epochs(root, manifest, columns)
        except _Changed as changed:
            if attempt == _READ_ATTEMPTS - 1:
                raise ManifestError(f"{root}: {changed}") from None
            time.sleep(min(0.01 * 2**attempt, 0.2))
    raise AssertionError("unreachable")


def _read_epochs(root: str, manifest: dict[str, Any], columns: list[str] | None) -> pa.Table:
    partition = manifest["partition"]
    entries = list(manifest["epochs"].values())
    values = [_parse_value(e["dir"].split("=", 1)[1]) for e in entries]
    order = sorted(range(len(entries)), key=lambda i: (isinstance(values[i], str), values[i]))
    kind = _partition_type(values)
    data_columns = None if columns is None else [c for c in columns if c != partition]
    tables = []
    for i in order:
        directory = os.path.join(root, entries[i]["dir"])
        own_path = os.path.join(directory, EPOCH_MANIFEST)
        try:
            own = _read_json(own_path)
        except ValueError as error:
            raise ManifestError(f"{own_path}: {error}") from error
        if own is None:
            raise _Changed(f"committed epoch directory {directory} has no {EPOCH_MANIFEST} "
                           "(being replaced, or an interrupted commit the next run repairs)")
        parts = []
        try:
            for f in own["files"]:
                parts.append(pq.read_table(os.path.join(directory, f["name"]), columns=data_columns))
        except FileNotFoundError as error:
            raise _Changed(f"a file of committed epoch {directory} vanished: {error}") from None
        again = _read_json(own_path)
        if again is None or again.get("commit") != own.get("commit"):
            raise _Changed(f"committed epoch {directory} changed while being read")
        if not parts:
            continue
        table = pa.concat_tables(parts, promote_options="default")
        if partition in table.column_names:
            table = table.drop_columns([partition])
        value = str(values[i]) if kind == pa.string() else values[i]
        tables.append(table.append_column(partition, pa.array([value] * table.num_rows, kind)))
    if not tables:
        names = [partition] if columns is None else list(columns)
        return pa.table({c: pa.array([], kind if c == partition else pa.null()) for c in names})
    table = pa.concat_tables(tables, promote_options="default")
    if columns is not None:
        table = table.select(list(columns))
    return table
