"""A committing Parquet sink: ``to_parquet``, and readers that honour its manifest.

Source: distributed-DBSP design, "Output" (output is produced per step; producing a step again,
e.g. after a failure, must not duplicate it).  Here a step is an epoch: each epoch is committed
whole, by renaming, with its files named independently of the number of workers W, and the
dataset manifest is written after the epoch directories it lists.  Runtime-neutral: pyarrow and
the dataflow layer only, no pyspark.

Protocol (one dataset directory ``path``; ``<p>`` is the partition column name, ``<b>`` an
epoch, or with ``granularity`` the first time of a bin ``[b, b + granularity)``)::

    writer, every worker           when its input frontier has passed epoch b:
        _staging/<p>=<b>/.<run>-<worker>-<seq>.parquet.tmp   pq.write_table, then os.replace to
        _staging/<p>=<b>/<run>-<worker>-<seq>.parquet        and send (b, that path, rows,
                                                              worker, seq) to the committer
    committer, one worker          when its input frontier has passed epoch b (so every
                                   worker has staged its file of b):
        .<p>=<b>.<id>.commit/part-00000.parquet ...   staged files renamed in, ordered by
                                                      (worker, seq), numbered from 0
        .<p>=<b>.<id>.commit/_manifest.json, _SUCCESS
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

Not handled: two jobs writing the same ``path`` at once; durability across power loss (no
fsync: a kill of any process is survived, a crash of the machine may not be); object stores
(the protocol needs ``os.rename``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from tokenflow.dataflow.operators.generic import unary_frontier
from tokenflow.dataflow.state import LocalState

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
               partition: str = "time") -> Stream:
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
            another layout.
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
    return unary_frontier(staged, ToWorker(COMMITTER), f"{name}.Commit",
                          _commit_constructor(root, name, partition, granularity, last_time))


def _stage_constructor(root: str, columns: list[str] | None, name: str, partition: str,
                       bin_of: Callable[[Any], Any], last_time: Callable[[Any], Any]) -> Any:
    """The writers: per worker, stage each completed epoch in one hidden file and tell the
    committer ``(epoch, staged path relative to root, rows, worker, seq)``."""

    def constructor(cap: Capability, info: OperatorInfo) -> Any:
        run = uuid.uuid4().hex[:12]
        worker = info.worker_index
        # epoch -> batches not yet staged (state: snapshotted, and restored at any W)
        batches_of: LocalState[dict[Any, list[Any]]] = info.state(
            "pending", LocalState(dict, _merge_lists, times=list, empty=_is_empty))
        tokens: dict[Any, Capability] = {b: cap.delayed(b) for b in batches_of.value}
        cap.drop()
        seq = [0]

        def stage(b: Any, batches: list[Any]) -> tuple[str | None, int, int]:
            """Write ``batches`` (epoch ``b``) to a staged file: ``(path relative to root or
            None when there are no rows, rows, sequence number)``."""
            table = _as_table(batches, columns, name)
            number = seq[0]
            seq[0] += 1
            if table.num_rows == 0:
                return None, 0, number
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
            return relative, table.num_rows, number

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
                relative, rows, number = stage(b, pending.pop(b, []))
                out.session(held).give((b, relative, rows, worker, number))
                held.drop()

        return logic

    return constructor


class _Committer:
    """The committer's state and file operations (on the one worker records are routed to)."""

    def __init__(self, root: str, name: str, partition: str, granularity: int | None) -> None:
        self.root = root
        self.name = name
        self.partition = partition
        self.granularity = granularity
        self.run = uuid.uuid4().hex[:12]
        self.manifest_path = os.path.join(root, MANIFEST)
        self.epochs: dict[str, dict[str, Any]] = {}
        self.committed: set[str] = set()  # epoch directories committed by this run
        self.others: dict[str, Any] = {}  # epoch directories of earlier runs: dir -> value
        self.frontier: Any = None
        self.dirty = False
        self.finished = False

    # -- start-up: recover from an earlier, possibly killed, run -------------------------------

    def start(self, keep: set[str] | None = None) -> None:
        """Clean up after an earlier run: finish or undo interrupted swaps, remove staging
        (but the staged files in ``keep``: paths relative to the root that a restored
        committer still has to commit), unfinished commit directories and tmp files (all
        hidden), and reconcile the dataset manifest with the epoch directories present.

        Writers cannot stage before this runs: their input frontier stays at the first time
        until every worker, this one included, has built the dataflow.

        Raises:
            ParquetSinkError: the manifest is unreadable or of another layout, or a file
                operation failed (naming the path).
        """
        root = self.root
        if not os.path.isdir(root):
            if os.path.exists(root):
                raise ParquetSinkError(f"operator {self.name!r}: {root} is not a directory")
            return
        try:
            self._recover(root, keep or set())
        except OSError as error:
            raise ParquetSinkError(f"operator {self.name + '.Commit'!r}: cannot clean up {root} "
                                   f"after an earlier run: {error}") from error

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

    def commit(self, b: Any, records: list[tuple[Any, str | None, int, int, int]]) -> int:
        """Move the staged files of epoch ``b`` into a fresh directory and swap it in; returns
        the epoch's rows.

        Raises:
            ParquetSinkError: a rename or write failed (naming the epoch and the path).
        """
        root = self.root
        directory = _epoch_dir(self.partition, b)
        final = os.path.join(root, directory)
        commit_id = uuid.uuid4().hex[:16]
        work = os.path.join(root, f".{directory}.{commit_id}.commit")
        trash = os.path.join(root, f".{directory}.{commit_id}.trash")
        files: list[dict[str, Any]] = []
        moved_aside = False
        try:
            os.makedirs(work)
            ordered = sorted((r for r in records if r[1] is not None), key=lambda r: (r[3], r[4]))
            for i, (_, relative, rows, _, _) in enumerate(ordered):
                assert relative is not None
                target = os.path.join(work, f"part-{i:05d}.parquet")
                os.rename(os.path.join(root, relative), target)
                files.append({"name": os.path.basename(target), "rows": rows,
                              "bytes": os.path.getsize(target)})
            own = {"format": FORMAT, "partition": self.partition, "value": _json_value(b),
                   "dir": directory, "files": files, "rows": sum(f["rows"] for f in files),
                   "bytes": sum(f["bytes"] for f in files), "run": self.run, "commit": commit_id}
            _write_json(os.path.join(work, EPOCH_MANIFEST), own)
            with open(os.path.join(work, SUCCESS), "wb"):
                pass
            if os.path.lexists(final):
                os.rename(final, trash)
                moved_aside = True
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
        try:
            os.rmdir(os.path.join(root, STAGING, directory))
        except OSError:
            pass
        self.epochs[str(_json_value(b))] = _dataset_entry(own)
        self.committed.add(directory)
        self.dirty = True
        return int(own["rows"])

    def advance(self, frontier: list[Any]) -> list[str]:
        """Note the committer's input frontier; returns the directories of earlier runs to
        remove now (epochs the frontier has passed that this run wrote nothing for, or all of
        them once the stream has ended), already dropped from the manifest."""
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
                doomed.append(directory)
                del self.others[directory]
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
                        last_time: Callable[[Any], Any]) -> Any:
    """The committer: every staged record is routed to one worker, which holds a token per
    epoch being collected and commits the epoch once its input frontier has passed it."""

    def constructor(cap: Capability, info: OperatorInfo) -> Any:
        active = info.worker_index == COMMITTER
        # epoch -> staged records, and the epoch directories committed so far (state: a job
        # restored from a snapshot continues this run's commits rather than undoing them)
        held: LocalState[dict[str, Any]] = info.state(
            "commits", LocalState(_new_commits, _merge_commits, times=lambda v: list(v["pending"])))
        records_of: dict[Any, list[Any]] = held.value["pending"]
        tokens: dict[Any, Capability] = {b: cap.delayed(b) for b in records_of}
        cap.drop()
        committer = _Committer(root, name, partition, granularity)
        committer.committed = held.value["committed"]
        if active:
            committer.start(keep={r[1] for records in records_of.values() for r in records
                                  if r[1] is not None})

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
