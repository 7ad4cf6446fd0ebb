"""Replayable sources: input divided into splits with positions, per-epoch position ranges,
pausing at an epoch boundary, and restarting from recorded positions at any worker count.

Sources: distributed-DBSP design, "Input" (every input has a position; the division of input
into steps is durable and recorded), "Input/output synchronization" (a snapshot at step ``e``
holds all the input before ``e`` and none after it) and "Scaling input" (Kafka-like partitions
assigned to workers, so that a restart at another worker count re-assigns them);
docs/ARCHITECTURE.md, "Sources, sinks and the control plane"; Kafka's partition offsets and Spark Structured
Streaming's source offsets (a source is replayable when it can re-read from a recorded offset).

Model:

* A source's input is a set of **splits**: units of input read in order, independent of the
  worker count (one Parquet file, one slice of the NEXMark event stream, one hash partition of
  an Arrow table, one file of a directory).  Each has a stable string ``key``.  The **position**
  of a split is the integer offset of its next unread row; a source's position is the map
  ``key -> offset``.
* Splits are assigned to workers by ``assign_splits`` (sorted keys, split ``k`` to worker
  ``k % peers``): a pure function of the keys and the worker count, so a job restarted at
  another worker count re-assigns the same splits from the union of the recorded positions.
* A split's rows are sorted by its event-time column (lateness 0; checked, see ``InputError``).
  The source merges its splits in event-time order: the **logical time** of a row is
  ``time - time % granularity``; the source's token is held at the least logical time any of
  its splits may still produce; the rows of one logical time read in one round are sent as one
  message per output (a time whose rows straddle a read boundary may arrive in two).
* Per logical time ``t`` the source records, per split, the offset range ``[first, end)`` it
  read at ``t`` (``SourceHandle.epochs``, or ``on_epoch(t, ranges)`` once ``t`` is complete on
  this worker): the durable division of the input into steps.
* ``SourceHandle.pause_at(e)`` makes the source emit everything before ``e`` and nothing at or
  after ``e``, then hold its token and stay idle until ``resume()``; ``positions()`` then gives
  each split's first offset at a time ``>= e``, so a job started with those positions and
  ``start=e`` continues exactly where this one paused.
* The control plane (``tokenflow.control``: snapshots, checkpoints) pauses with ``hold_at`` and
  lifts with ``release_hold``, a pause of its own: the source stops at the earlier of the two,
  and a checkpoint's ``release_hold`` leaves a pause the job set in place.

Per-batch work is vectorized (numpy / Arrow per read chunk); Python loops run per split, per
logical time and per read round, never per row.
"""

from __future__ import annotations

import heapq
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenflow.dataflow.operators.builder import OperatorBuilder
from tokenflow.dataflow.routing import column_routes
from tokenflow.io.times import InputError, column_times, event_times, round_down
from tokenflow.nexmark.generator import KINDS, GeneratorConfig, event_kinds, generate

DEFAULT_HISTORY = 4096
"""Logical times whose offset ranges a ``SourceHandle`` keeps in ``epochs``."""

OnEpoch = Callable[[int, dict[str, tuple[int, int]]], None]
"""``on_epoch(t, ranges)``: logical time ``t`` is complete on this worker; ``ranges`` maps
split key to the offsets ``[first, end)`` read at ``t``."""


# -- splits ----------------------------------------------------------------------------------


def assign_splits(keys: Sequence[str], peers: int) -> list[list[str]]:
    """The split keys of each of ``peers`` workers: sorted keys, the ``k``-th to worker
    ``k % peers`` (each worker's list in key order).

    A pure function of the key set and ``peers``: every worker computes the same assignment,
    and a restart at another worker count only re-deals the same keys.

    Raises:
        ValueError: ``peers < 1`` or a repeated key (naming it).
    """
    if peers < 1:
        raise ValueError(f"peers must be >= 1, got {peers}")
    ordered = sorted(keys)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a == b:
            raise ValueError(f"split key {a!r} appears more than once")
    return [ordered[w::peers] for w in range(peers)]


class Split(ABC):
    """One unit of a source's input, read in order by offset.

    Attributes:
        key: a stable name, the same in every run and for every worker count (it names the
            split in positions and epochs).
    """

    key: str

    @abstractmethod
    def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        """Rows ``[offset, offset + n)`` of the split, ``1 <= n <= max_rows``, or None at the
        end (an empty batch also counts as the end)."""

    @property
    def rows(self) -> int | None:
        """Number of rows, when known without reading (None otherwise)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r})"


@dataclass(frozen=True)
class Parts:
    """A chunk of a ``MultiSplit``: ``n`` positions and the rows they produce on each output.

    Attributes:
        times: event time per position (int64, shape ``(n,)``, non-decreasing).
        batches: output name -> ``(rows, index)``; ``index`` (int64, ascending, values in
            ``[0, n)``) is the position of each row within the chunk, or None when the rows
            are the positions one for one.
    """

    times: np.ndarray
    batches: Mapping[str, tuple[pa.RecordBatch, np.ndarray | None]]


class MultiSplit(Split):
    """A split whose positions produce rows on several outputs at once (e.g. one NEXMark event
    is a person, an auction or a bid); ``read_parts`` is what the source reads.

    Attributes:
        outputs: the output names, in the order of the source's streams.
    """

    outputs: tuple[str, ...]

    @abstractmethod
    def read_parts(self, offset: int, max_rows: int) -> Parts | None:
        """Positions ``[offset, offset + n)``, ``1 <= n <= max_rows``, or None at the end."""


def _as_batch(data: pa.RecordBatch | pa.Table, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """One RecordBatch holding the rows of ``data`` (copies only when it has several chunks)."""
    if isinstance(data, pa.RecordBatch):
        return data
    if data.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=schema or data.schema)
    batches = data.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.concat_batches(batches)


class TableSplit(Split):
    """A split over an in-memory Arrow table or batch (read by zero-copy slicing)."""

    def __init__(self, key: str, data: pa.Table | pa.RecordBatch) -> None:
        self.key = key
        self._batch = _as_batch(data)

    @property
    def rows(self) -> int:
        return self._batch.num_rows

    @property
    def data(self) -> pa.RecordBatch:
        """All the split's rows."""
        return self._batch

    def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        if offset >= self._batch.num_rows:
            return None
        return self._batch.slice(offset, max_rows)

    def __getstate__(self) -> dict[str, Any]:
        # As an Arrow IPC stream: a slice is written without the rest of its buffers (pickling
        # the slice itself would carry the whole table's buffers in every split).
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self._batch.schema) as writer:
            writer.write_batch(self._batch)
        return {"key": self.key, "ipc": sink.getvalue()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.key = state["key"]
        reader = pa.ipc.open_stream(state["ipc"])
        batches = list(reader)
        self._batch = (batches[0] if len(batches) == 1 else
                       pa.concat_batches(batches) if batches else
                       pa.RecordBatch.from_pylist([], schema=reader.schema))


def table_splits(table: pa.Table | pa.RecordBatch, splits: int = 16, key: str | None = None, *,
                 time: str | None = None, name: str = "table") -> list[TableSplit]:
    """``table`` divided into ``splits`` parts, independently of the worker count.

    Row ``i`` goes to part ``routes_for(stable_hash(row's key), splits)`` when ``key`` names a
    column (``tokenflow.dataflow.routing.column_routes``: the job-wide stable hash, so equal
    keys share a part in every process and run; null keys go to part 0), otherwise to part
    ``i % splits``.  With ``time``, each part is sorted by that column (stable, vectorized:
    one ``np.lexsort`` of (part, time) and one ``take`` for the whole table).  Keys are
    ``"<name>/<k>-of-<splits>"`` (zero-padded), so positions recorded with another split count
    are rejected rather than misread.

    Raises:
        ValueError: ``splits < 1``.
        KeyError: a ``key`` column the table lacks.
        InputError: a bad time column (see ``tokenflow.io.times.event_times``).
    """
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    n = table.num_rows
    if key is not None:
        if key not in table.schema.names:
            raise KeyError(f"table_splits: no key column {key!r} (columns: {table.schema.names})")
        part = column_routes(table.column(key), splits)
    else:
        part = np.arange(n, dtype=np.int64) % splits
    if time is not None:
        times = event_times(table, time, name, 0)
        order = np.lexsort((times, part))
    else:
        order = np.argsort(part, kind="stable")
    ordered = _as_batch(table.take(pa.array(order, type=pa.int64())), table.schema)
    counts = np.bincount(part, minlength=splits)
    starts = np.concatenate(([0], np.cumsum(counts)))
    width = len(str(splits - 1))
    return [TableSplit(f"{name}/{k:0{width}d}-of-{splits}",
                       ordered.slice(int(starts[k]), int(counts[k])))
            for k in range(splits)]


class ParquetSplit(Split):
    """One Parquet file, read one row group at a time.

    ``read(offset, ...)`` finds the row group holding ``offset`` from the file's metadata and
    reads only that group (groups before it are never read); the group last read is kept, so
    consecutive reads smaller than a group read it once.  The file is opened on first use
    (the split pickles without an open file).
    """

    def __init__(self, key: str, path: str) -> None:
        self.key = key
        self.path = path
        self._file: pq.ParquetFile | None = None
        self._ends: np.ndarray | None = None
        self._cached: tuple[int, pa.RecordBatch] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["key"], state["path"])  # type: ignore[misc]

    def _open(self) -> tuple[pq.ParquetFile, np.ndarray]:
        if self._file is None or self._ends is None:
            self._file = pq.ParquetFile(self.path)
            meta = self._file.metadata
            counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self._ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        return self._file, self._ends

    @property
    def rows(self) -> int:
        _, ends = self._open()
        return int(ends[-1]) if len(ends) else 0

    def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        file, ends = self._open()
        if not len(ends) or offset >= int(ends[-1]):
            self._cached = None
            return None
        group = int(np.searchsorted(ends, offset, side="right"))  # first group ending after offset
        if self._cached is None or self._cached[0] != group:
            self._cached = (group, _as_batch(file.read_row_group(group), file.schema_arrow))
        batch = self._cached[1]
        first = int(ends[group]) - batch.num_rows
        return batch.slice(offset - first, max_rows)


def parquet_splits(path: str) -> list[ParquetSplit]:
    """One split per Parquet file: ``path`` itself, or the files under directory ``path``
    (recursively, ending in ``.parquet``, skipping names that start with ``.`` or ``_`` as Spark
    and Arrow datasets do).  Keys are the files' paths relative to ``path`` (``/``-separated;
    the file name for a single file), in sorted order.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if os.path.isfile(path):
        return [ParquetSplit(os.path.basename(path), path)]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"parquet_splits: no file or directory {path!r}")
    found: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for f in files:
            if f.endswith(".parquet") and not f.startswith((".", "_")):
                full = os.path.join(root, f)
                found.append((os.path.relpath(full, path).replace(os.sep, "/"), full))
    return [ParquetSplit(k, p) for k, p in sorted(found)]


class NexmarkSplit(MultiSplit):
    """Split ``index`` of ``splits`` of the NEXMark events ``[0, events)``.

    Event numbers are cut into blocks of ``block`` consecutive numbers; this split reads blocks
    ``index, index + splits, index + 2 * splits, ...`` in order, so its event times are
    non-decreasing.  Its offset ``j`` is the ``j``-th event of those blocks: event number
    ``(index + (j // block) * splits) * block + j % block``.

    One read generates each event once: ``read_parts`` calls
    ``generate(first, count, config)`` for a run of consecutive event numbers within one block
    and returns all three kinds (outputs ``person``, ``auction``, ``bid``) with each row's
    position, so the three streams of ``nexmark_streams`` come from a single generation (rather
    than three sources each generating everything and keeping one kind).  ``read`` gives the
    positions alone, without generating the events: columns ``event`` (event number),
    ``kind`` (0 person, 1 auction, 2 bid) and ``dateTime`` (ms).  ``extra`` False: the events
    without their ``extra`` padding (``generate(extra=False)``: the same other values; a query
    that does not read it is spared about half of the generation), positions unchanged.
    """

    outputs = KINDS

    def __init__(self, index: int, splits: int, events: int, block: int,
                 config: GeneratorConfig | None = None, extra: bool = True) -> None:
        if not 0 <= index < splits:
            raise ValueError(f"split index {index} not in [0, {splits})")
        if block < 1 or events < 0:
            raise ValueError(f"block must be >= 1 and events >= 0, got {block}, {events}")
        self.index, self.splits, self.events, self.block = index, splits, events, block
        self.config = config or GeneratorConfig()
        self.extra = extra
        width = len(str(splits - 1))
        self.key = f"nexmark-b{block}/{index:0{width}d}-of-{splits}"

    @property
    def rows(self) -> int:
        blocks = -(-self.events // self.block)  # ceil
        mine = max(0, -(-(blocks - self.index) // self.splits))
        if not mine:
            return 0
        last = (self.index + (mine - 1) * self.splits) * self.block
        return (mine - 1) * self.block + min(self.block, self.events - last)

    def _run(self, offset: int, max_rows: int) -> tuple[int, int] | None:
        """``(first event number, count)`` of the read at ``offset``, or None at the end."""
        q, r = divmod(offset, self.block)
        first = (self.index + q * self.splits) * self.block + r
        count = min(max_rows, self.block - r, self.events - first)
        if count <= 0:
            return None
        return first, count

    def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        run = self._run(offset, max_rows)
        if run is None:
            return None
        n = np.arange(run[0], run[0] + run[1], dtype=np.int64)
        return pa.RecordBatch.from_arrays(
            [pa.array(n), pa.array(event_kinds(n, self.config)),
             pa.array(np.asarray(self.config.timestamp(n), dtype=np.int64))],
            names=["event", "kind", "dateTime"])

    def read_parts(self, offset: int, max_rows: int) -> Parts | None:
        run = self._run(offset, max_rows)
        if run is None:
            return None
        first, count = run
        n = np.arange(first, first + count, dtype=np.int64)
        kinds = event_kinds(n, self.config)
        data = generate(first, count, self.config, extra=self.extra)
        batches = {kind: (data[kind], np.flatnonzero(kinds == i)) for i, kind in enumerate(KINDS)}
        return Parts(np.asarray(self.config.timestamp(n), dtype=np.int64), batches)


def nexmark_splits(events: int, config: GeneratorConfig | None = None, splits: int = 16,
                   block: int = 5000, extra: bool = True) -> list[NexmarkSplit]:
    """The ``splits`` splits of NEXMark events ``[0, events)`` (see ``NexmarkSplit``; ``extra``
    False: without the ``extra`` padding).

    Raises:
        ValueError: ``splits < 1``, ``block < 1`` or ``events < 0``.
    """
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    return [NexmarkSplit(k, splits, events, block, config, extra) for k in range(splits)]


# -- the source operator ---------------------------------------------------------------------


class _State:
    """A split being read: ``offset`` is the position of its next unemitted row; the buffered
    chunk holds positions ``[offset - cursor, offset - cursor + len(times))``."""

    __slots__ = ("key", "split", "offset", "done", "times", "logical", "parts", "cursor",
                 "last_time", "fixed_time")

    def __init__(self, key: str, split: Split, offset: int, fixed_time: int | None = None) -> None:
        self.key = key
        self.split = split
        self.offset = offset
        self.done = False
        self.times: np.ndarray | None = None
        self.logical: np.ndarray | None = None
        self.parts: Mapping[str, tuple[pa.RecordBatch, np.ndarray | None]] = {}
        self.cursor = 0
        self.last_time: int | None = None
        self.fixed_time = fixed_time  # every row's time (directory files without a time column)

    def buffered(self) -> bool:
        return self.times is not None and self.cursor < len(self.times)


class _Reader:
    """The state and logic of one worker's replayable source operator (see the module
    docstring).  Subclasses add splits while running (``_discover``) and bound the times of
    splits still to come (``_bound``)."""

    def __init__(self, name: str, outputs: tuple[str, ...], time: str, granularity: int,
                 start: int | None, pause_at: int | None, max_rows: int, history: int,
                 on_epoch: OnEpoch | None) -> None:
        if granularity < 1:
            raise ValueError(f"{name}: granularity must be >= 1, got {granularity}")
        if max_rows < 1:
            raise ValueError(f"{name}: max_rows must be >= 1, got {max_rows}")
        for label, value in (("start", start), ("pause_at", pause_at)):
            if value is not None and value % granularity:
                raise ValueError(f"{name}: {label}={value} is not a multiple of "
                                 f"granularity={granularity}")
        self.name = name
        self.outputs = outputs
        self.time = time
        self.granularity = granularity
        self.start = start
        self.max_rows = max_rows
        self.history = history
        self.on_epoch = on_epoch
        self.states: list[_State] = []
        self.live: list[_State] = []
        self.epochs: dict[int, dict[str, tuple[int, int]]] = {}
        self._unfired: list[int] = []  # heap of recorded times not yet reported complete
        self._unfired_set: set[int] = set()
        self.lock = threading.RLock()
        self.own_pause: int | None = pause_at  # the job's (``SourceHandle.pause_at``)
        self.held: int | None = None  # the control plane's (``SourceHandle.hold_at``)
        self.limit: int | None = None  # flow control (``SourceHandle.limit``), not a pause
        self.paused = False
        self.closed = False
        self.finished = False
        self.tokens: list[Any] = []
        self.max_emitted: int | None = None
        self.activate: Callable[[], None] = lambda: None
        self.activate_after: Callable[[float], None] = lambda delay: None
        self.metrics: dict[str, int] = {}
        self.rows_read = 0  # positions this worker emitted (read) in this run
        self.waiting = False  # on a joined worker: its tokens are uncounted until it is lent some
        self.moves: Any = None  # ``tokenflow.io.handover.Handover``, once re-split
        self.splits: dict[str, Split] = {}  # every split by key (a static source's receivers)
        self.job_worker: Any = None
        self.key = name

    # -- hooks for dynamic sources ----------------------------------------------------------

    def _discover(self) -> None:
        """Add newly found splits to ``states`` / ``live`` (static sources: nothing)."""

    def _bound(self) -> int | None:
        """Least logical time a split not yet found may produce (None: no more splits)."""
        return None

    def _idle(self) -> None:
        """Called when the source waits for splits still to come (schedule a wake-up)."""

    def _stop(self) -> None:
        """Called once when the source ends or is closed."""

    # -- reading ----------------------------------------------------------------------------

    def _label(self, st: _State) -> str:
        """``source 'S', split 'k'`` (and the split's file, when it has one), for messages."""
        path = getattr(st.split, "path", None)
        where = f"source {self.name!r}, split {st.key!r}"
        return where if path is None or os.path.basename(path) == st.key else f"{where} ({path!r})"

    def _read(self, st: _State) -> Parts | pa.RecordBatch | pa.Table | None:
        """The split's next chunk at ``st.offset`` (``read_parts`` for a ``MultiSplit``).

        Raises:
            InputError: the split could not be read (an Arrow error such as a corrupt file
                or a CSV value of the wrong type, or an OS error), naming the source, split
                (file), time column and the offset of the first row of the failed read.
        """
        split = st.split
        try:
            if isinstance(split, MultiSplit):
                return split.read_parts(st.offset, self.max_rows)
            return split.read(st.offset, self.max_rows)
        except (OSError, pa.ArrowException) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"{self._label(st)}, column {self.time!r}, row {st.offset}: cannot "
                             f"read the split: {type(exc).__name__}: {reason}") from exc

    def _fill(self, st: _State) -> None:
        """Read the next chunk of ``st`` when its buffer is used up; mark it done at its end.

        Raises:
            InputError: see ``_read``; a null or bad value or type in the time column (naming
                source, split, column, row and value; ``tokenflow.io.times.column_times``).
        """
        if st.buffered() or st.done:
            return
        chunk = self._read(st)
        if isinstance(st.split, MultiSplit):
            parts = chunk
            if not isinstance(parts, Parts) or not len(parts.times):
                st.done = True
                return
            times = np.asarray(parts.times, dtype=np.int64)
            st.parts = parts.batches
        else:
            batch = chunk
            if not isinstance(batch, pa.RecordBatch | pa.Table) or batch.num_rows == 0:
                st.done = True
                return
            if isinstance(batch, pa.Table):
                batch = _as_batch(batch)
            if st.fixed_time is not None:
                times = np.full(batch.num_rows, st.fixed_time, dtype=np.int64)
            else:
                times = column_times(batch, self.time, self._label(st), st.offset)
            st.parts = {self.outputs[0]: (batch, None)}
        self._check_sorted(st, times)
        st.times = times
        st.logical = round_down(times, self.granularity) if self.granularity > 1 else times
        st.cursor = 0

    def _check_sorted(self, st: _State, times: np.ndarray) -> None:
        previous = np.empty(len(times), dtype=np.int64)
        previous[1:] = times[:-1]
        previous[0] = times[0] if st.last_time is None else st.last_time
        bad = np.flatnonzero(times < previous)
        if len(bad):
            row = int(bad[0])
            raise InputError(
                f"source {self.name!r}: split {st.key!r} is not sorted by column {self.time!r}: "
                f"row {st.offset + row} has value {int(times[row])} after "
                f"{int(previous[row])} (each split must be sorted by its time column)")
        st.last_time = int(times[-1])

    def _late(self, st: _State, floor: int) -> InputError:
        assert st.times is not None
        row = st.cursor
        value = int(st.times[row])
        if self.start is not None and floor == self.start:
            why = (f"before the start epoch {self.start}: the recorded position does not match "
                   f"the epoch")
        else:
            why = f"before the source's frontier {floor}"
        return InputError(f"source {self.name!r}: split {st.key!r} row {st.offset} has "
                          f"{self.time!r} value {value}, {why}")

    # -- progress bookkeeping ---------------------------------------------------------------

    def _record(self, key: str, logical: np.ndarray, first: int) -> None:
        """Note the offsets ``[first, first + len(logical))`` read at their logical times
        (``logical`` is sorted: a split's rows come in time order)."""
        epochs = self.epochs
        for s, e, t in _runs(logical):
            ranges = epochs.get(t)
            if ranges is None:
                ranges = epochs[t] = {}
                if t not in self._unfired_set:
                    self._unfired_set.add(t)
                    heapq.heappush(self._unfired, t)
            old = ranges.get(key)
            ranges[key] = (first + s if old is None else old[0], first + e)
        if len(epochs) > 2 * self.history:
            for t in sorted(epochs)[: len(epochs) - self.history]:
                if t not in self._unfired_set:
                    del epochs[t]

    def _advance(self, time: int | None) -> None:
        """Move every token to ``time`` (None: drop them) and report the completed times."""
        for cap in self.tokens:
            if time is None:
                cap.drop()
            elif cap.time < time:
                cap.downgrade(time)
        if time is None:
            self.tokens = []
        while self._unfired and (time is None or self._unfired[0] < time):
            t = heapq.heappop(self._unfired)
            self._unfired_set.discard(t)
            if self.on_epoch is not None:
                self.on_epoch(t, dict(self.epochs.get(t, {})))

    @property
    def pause(self) -> int | None:
        """The pause in effect: the earlier of the job's and the control plane's."""
        pauses = [p for p in (self.own_pause, self.held) if p is not None]
        return min(pauses) if pauses else None

    def _finish(self) -> None:
        self._advance(None)
        self.finished = True
        with self.lock:
            if self.pause is not None:
                self.paused = True
        self._stop()

    # -- the operator logic -----------------------------------------------------------------

    def frontier(self) -> int | None:
        return self.tokens[0].time if self.tokens else None

    def positions(self) -> dict[str, int]:
        return {st.key: st.offset for st in self.states}

    def logic(self, outputs: list[Any]) -> None:
        if not self.tokens or self.waiting:
            return
        if self.closed:
            self._finish()
            return
        if self.start is not None and self.tokens[0].time < self.start:
            self._advance(self.start)
        self._discover()
        emitted = 0
        while True:
            for st in self.live:
                self._fill(st)
            moves = self.moves
            if moves is not None and moves.give:
                from tokenflow.io.handover import hand_off

                hand_off(self)
            if any(st.done for st in self.live):
                self.live = [st for st in self.live if not st.done]
            live = self.live
            bound = self._bound()
            if moves is not None:  # fenced, or splits handed to this worker still to come
                held = moves.bound(self.frontier())
                if held is not None:
                    bound = held if bound is None else min(bound, held)
            low = min(int(st.logical[st.cursor]) for st in live) if live else None  # type: ignore[index]
            if bound is not None:
                low = bound if low is None else min(low, bound)
            if low is None:
                self._finish()
                return
            # Under the lock from reading the pause to emitting: a pause_at from another
            # thread waits for the round, then sees what it emitted.
            with self.lock:
                if not self._round(live, low):
                    return
                sent = self._emit(live, self._cutoff(live), outputs)
            if not sent:  # held below every row it has (a limit, a handover's bound)
                self._idle()
                return
            emitted += sent
            if emitted >= self.max_rows:
                self.activate()
                return

    def _round(self, live: list[_State], low: int) -> bool:
        """Move the token to ``low`` (the least time still to come); False when the round
        must not emit (paused at or before ``low``, or waiting for splits to appear)."""
        pause, limit = self.pause, self.limit
        if pause is not None and low >= pause:
            self._advance(low)
            self.paused = True
            return False
        self.paused = False
        if limit is not None and low >= limit:
            self._advance(low)
            return False
        fence = self.moves.fence if self.moves is not None and self.moves.deciding else None
        if fence is not None and low >= fence:  # a re-split is being decided
            self._advance(low)
            return False
        floor = self.tokens[0].time
        if low < floor:
            raise self._late(next(st for st in live if st.logical[st.cursor] == low), floor)  # type: ignore[index]
        self._advance(low)
        if not live:
            self._idle()
            return False
        return True

    def _cutoff(self, live: list[_State]) -> int:
        """Rows with times before the cutoff may all be sent now: every buffered row up to the
        least logical time at which some split's buffer ends, and none at or after a pause."""
        horizon = min(int(st.logical[-1]) for st in live)  # type: ignore[index]
        cutoff = horizon + self.granularity
        fence = self.moves.fence if self.moves is not None and self.moves.deciding else None
        for bound in (self.pause, self.limit, fence):
            if bound is not None:
                cutoff = min(cutoff, bound)
        return cutoff

    def _emit(self, live: list[_State], cutoff: int, outputs: list[Any]) -> int:
        """Send every buffered row with time ``< cutoff``, merged across splits in logical-time
        order, one message per (logical time, output); returns the positions consumed.

        When every row sent has one logical time (an epoch at a time: the usual round of a
        source that is kept one or a few epochs ahead), the splits' slices are only
        concatenated: no per-row times are gathered, ordered or split into runs."""
        pieces: dict[str, list[tuple[np.ndarray, pa.RecordBatch]]] = {o: [] for o in self.outputs}
        consumed = 0
        bounds: set[int] = set()  # the first and last logical time of each split's slice
        for st in live:
            assert st.times is not None and st.logical is not None
            lo = st.cursor
            end = cutoff
            if self.moves is not None and self.moves.give:
                from tokenflow.io.handover import split_cutoff

                end = split_cutoff(self, st, cutoff)
            hi = int(st.times.searchsorted(end))
            if hi <= lo:
                continue
            logical = st.logical[lo:hi]
            for out, (batch, index) in st.parts.items():
                if index is None:
                    pieces[out].append((logical, batch.slice(lo, hi - lo)))
                else:
                    r0, r1 = np.searchsorted(index, [lo, hi]).tolist()
                    if r1 > r0:
                        pieces[out].append((st.logical[index[r0:r1]], batch.slice(r0, r1 - r0)))
            bounds.update((int(logical[0]), int(logical[-1])))
            self._record(st.key, logical, st.offset)
            st.offset += hi - lo
            st.cursor = hi
            consumed += hi - lo
            if hi == len(st.times):  # free the chunk
                st.times = st.logical = None
                st.parts = {}
                st.cursor = 0
        self.metrics["records_in"] = self.metrics.get("records_in", 0) + consumed
        self.rows_read += consumed
        cap = self.tokens[0]
        one_time = next(iter(bounds)) if len(bounds) == 1 else None
        for port, out in enumerate(self.outputs):
            got = pieces[out]
            if not got:
                continue
            token = self.tokens[port] if port < len(self.tokens) else cap
            if one_time is not None:
                batch = got[0][1] if len(got) == 1 else _concat([g[1] for g in got])
                outputs[port].give_batch(token, batch, time=one_time)
                last = one_time
            else:
                logical, batch = got[0]
                if len(got) > 1:
                    logical = np.concatenate([g[0] for g in got])
                    batch = _concat([g[1] for g in got])
                    if (logical[1:] < logical[:-1]).any():
                        order = np.argsort(logical, kind="stable")
                        logical = logical[order]
                        batch = batch.take(pa.array(order))
                for s, e, t in _runs(logical):
                    outputs[port].give_batch(token, batch.slice(s, e - s), time=t)
                last = int(logical[-1])
            if self.max_emitted is None or last > self.max_emitted:
                self.max_emitted = last
        return consumed


def _runs(logical: np.ndarray) -> list[tuple[int, int, int]]:
    """``(start, end, time)`` of each run of equal values in a sorted non-empty ``logical``:
    one run, without a vector pass, when its first and last values are equal."""
    first = int(logical[0])
    if first == logical[-1]:
        return [(0, len(logical), first)]
    bounds = (np.flatnonzero(logical[1:] != logical[:-1]) + 1).tolist()
    return list(zip([0, *bounds], [*bounds, len(logical)], logical[[0, *bounds]].tolist(),
                    strict=True))


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of ``batches`` in order as one batch (schemas unified when they differ)."""
    first = batches[0].schema
    if all(b.schema == first for b in batches):
        return pa.concat_batches(batches)
    table = pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                             promote_options="permissive")
    return _as_batch(table)


class SourceHandle:
    """Worker-side control of one worker's share of a replayable source.

    Use it from the worker function (the thread that steps the worker); ``pause_at``,
    ``resume`` and ``close`` may also be called from another thread (a pause waits for the
    read round in progress, then applies to what follows it).  A handle does not pickle: on
    the ``process`` and ``spark`` runtimes return ``positions()`` / ``epochs`` from the worker
    function, not the handle.
    """

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        self.path: tuple[int, ...] = ()
        """The source operator's path (``(dataflow, operator)`` at the top level)."""
        self.ports = len(reader.outputs)
        """The source operator's outputs (one token each)."""

    @property
    def name(self) -> str:
        return self._reader.name

    @property
    def keys(self) -> list[str]:
        """This worker's split keys (known so far, for a directory source)."""
        return [st.key for st in self._reader.states]

    def positions(self) -> dict[str, int]:
        """Split key -> offset of its next unread row, for this worker's splits.  When
        ``paused``, the offset of each split's first row at a time ``>= e``."""
        return self._reader.positions()

    @property
    def epochs(self) -> dict[int, dict[str, tuple[int, int]]]:
        """Per logical time read (the last ``history`` of them), per split key, the offsets
        ``[first, end)`` read at that time: the division of this worker's input into steps."""
        epochs = self._reader.epochs
        keep = sorted(epochs)[-self._reader.history:]
        return {t: dict(epochs[t]) for t in keep}

    def pause_at(self, epoch: int) -> None:
        """From now on emit nothing at or after ``epoch``: send everything before it, then hold
        the token at ``epoch`` (or at the least time still to come, when later) and stay idle
        until ``resume()`` or another ``pause_at``.

        Raises:
            ValueError: ``epoch`` is not a multiple of the granularity, or rows at or after it
                were already emitted.
        """
        self._pause(own=True, epoch=epoch)

    def hold_at(self, epoch: int) -> None:
        """The control plane's pause (a snapshot or checkpoint round), kept apart from the
        job's: the source stops at the earlier of the two, and ``release_hold`` lifts only
        this one.  Errors as for ``pause_at``."""
        self._pause(own=False, epoch=epoch)

    def _pause(self, own: bool, epoch: int | None) -> None:
        """Set (``epoch``) or lift (None) the job's pause (``own``) or the control plane's."""
        r = self._reader
        if epoch is not None and epoch % r.granularity:
            raise ValueError(f"{r.name}: pause epoch {epoch} is not a multiple of "
                             f"granularity={r.granularity}")
        with r.lock:
            if epoch is not None and r.max_emitted is not None and r.max_emitted >= epoch:
                raise ValueError(f"{r.name}: cannot pause at {epoch}: rows at time "
                                 f"{r.max_emitted} were already emitted")
            before = r.pause
            if own:
                r.own_pause = epoch
            else:
                r.held = epoch
            if r.pause != before:  # the pause in effect moved: paused again once there
                r.paused = r.finished and r.pause is not None
        r.activate()

    def limit(self, epoch: int | None) -> None:
        """Flow control: emit nothing at or after ``epoch`` for now (None: no limit); unlike
        ``pause_at`` this is not a pause the control plane waits for, and raising the limit
        lets the source go on at once (e.g. a driver keeping a few epochs in flight)."""
        r = self._reader
        with r.lock:
            changed = r.limit != epoch
            r.limit = epoch
        if changed:
            r.activate()

    def resume(self) -> None:
        """Lift the job's pause: the source reads on (up to the control plane's, if any)."""
        self._pause(own=True, epoch=None)

    def release_hold(self) -> None:
        """Lift the control plane's pause (``hold_at``); a pause the job set stays."""
        self._pause(own=False, epoch=None)

    @property
    def job_pause(self) -> int | None:
        """The epoch the job paused this source at (``pause_at``), or None: the control plane
        holds it no later than that."""
        return self._reader.own_pause

    def close(self) -> None:
        """End the source now: drop its token at the next scheduling without reading more
        (after a pause, to shut a job down at the snapshot; positions stay as they are)."""
        r = self._reader
        with r.lock:
            r.closed = True
        r.activate()

    @property
    def granularity(self) -> int:
        """The source's epoch length: its logical times are multiples of it."""
        return int(self._reader.granularity)

    def safe_point(self) -> int | None:
        """The least epoch this source can pause at right now: the first multiple of the
        granularity after the latest time it has emitted, or its token's time when it has
        emitted nothing at or after it; None once it has ended having emitted nothing."""
        r = self._reader
        with r.lock:
            frontier, emitted, g = r.frontier(), r.max_emitted, r.granularity
        after = None if emitted is None else (emitted // g + 1) * g
        if frontier is None:
            return after
        return after if after is not None and after > frontier else int(frontier)

    @property
    def paused(self) -> bool:
        """True once a pause at ``e`` is in effect: everything before ``e`` is emitted and the
        source holds its token at ``e`` or later (or has ended)."""
        return self._reader.paused

    @property
    def done(self) -> bool:
        """True once the source has dropped its token (input exhausted or closed)."""
        return self._reader.finished

    @property
    def frontier(self) -> int | None:
        """The source's token time on this worker (None once ended)."""
        return self._reader.frontier()

    @property
    def rows_read(self) -> int:
        """Positions (rows, NEXMark events) this worker's share of the source has emitted."""
        return self._reader.rows_read

    # -- handing work to other workers (``tokenflow.io.handover``, ``tokenflow.resplit``) ----

    def fence(self, margin: int) -> dict[str, Any]:
        """Phase 1 of a re-split (``tokenflow.io.handover.fence``).

        Raises:
            HandoverError: this source cannot hand its work over.
        """
        from tokenflow.io.handover import HandoverError, fence

        if len(self.path) != 2:
            raise HandoverError(f"source {self.name!r} is inside a nested scope: its tokens "
                                "cannot be lent to a joining worker yet")
        return fence(self._reader, margin)

    def reassign(self, plan: Mapping[str, Any]) -> None:
        """Phase 2 of a re-split (``tokenflow.io.handover.reassign``)."""
        from tokenflow.io.handover import reassign

        reassign(self._reader, plan)

    def receive(self, piece: tuple[Any, ...]) -> None:
        """A piece of another worker's work handed to this one (a split and its offset, or
        the file names it took)."""
        from tokenflow.io.handover import receive

        receive(self._reader, piece)

    @property
    def handed_over(self) -> bool:
        """Every piece the last re-split brings this worker has arrived (True when none)."""
        moves = self._reader.moves
        return moves is None or moves.complete

    def lend(self) -> int | None:
        """Copy this source's tokens (one per output, all at one time) and hand the copies
        over to a joining worker (``Capability.hand_over``: their +1 stays in this worker's
        progress stream); returns their time, or None when the source holds none."""
        r = self._reader
        with r.lock:
            if not r.tokens or r.waiting:
                return None
            for cap in r.tokens:
                cap.copy().hand_over()
            return int(r.tokens[0].time)

    def adopt_lent(self, tokens: list[Any]) -> None:
        """Take ``tokens`` (one per output) lent by another worker in place of the uncounted
        ones a joined worker's source starts with; the source then reads what is handed to
        it."""
        r = self._reader
        with r.lock:
            old, r.tokens = r.tokens, list(tokens)
            r.waiting = False
            r.finished = False
        for cap in old:
            cap.drop()  # uncounted: nothing was counted
        r.activate()


def source_key(scope: Any, name: str) -> str:
    """The stable key of source ``name`` in ``scope`` (its scope path and name): under it the
    worker records the source's positions in a snapshot and finds them on restore."""
    return f"{'.'.join(map(str, scope.path))}/{name}"


def restored(scope: Any, name: str, positions: Mapping[str, int] | None,
             start: int | None) -> tuple[Mapping[str, int] | None, int | None]:
    """``(positions, start)`` for a source: those given, or, when the worker restores a
    snapshot and none were given, the positions the snapshot recorded for this source (the
    union over the old workers) and the snapshot's epoch."""
    lookup = getattr(scope.worker, "restored_positions", None)
    if positions is not None or lookup is None:
        return positions, start
    found = lookup(source_key(scope, name))
    if found is None:
        return positions, start
    return found


def _build(scope: Any, reader: _Reader) -> tuple[list[Any], SourceHandle]:
    """Add ``reader``'s operator to ``scope`` and register its handle with the worker (see
    ``source_key``); returns its streams (one per output)."""
    builder = OperatorBuilder(reader.name, scope, notify=False)
    ports = [builder.new_output() for _ in reader.outputs]
    reader.activate = builder.activator()
    reader.activate_after = builder.delayed_activator()
    worker_metrics = getattr(scope.worker, "metrics", None)
    if isinstance(worker_metrics, dict):
        reader.metrics = worker_metrics
    outputs = [p[0] for p in ports]

    def constructor(caps: list[Any]) -> Any:
        reader.tokens = list(caps)

        def logic(frontiers: list[Any]) -> bool:
            reader.logic(outputs)
            return False

        return logic

    builder.build(constructor)
    handle = SourceHandle(reader)
    handle.path = builder.core.path
    key = source_key(scope, reader.name)
    reader.key, reader.job_worker = key, scope.worker
    if getattr(scope.worker, "joining", False):  # tokens only once another worker lends some
        reader.waiting = True
        adopters = getattr(scope.worker, "adopters", None)
        if adopters is not None:
            adopters[key] = builder.core
    register = getattr(scope.worker, "register_source", None)
    if register is not None:
        register(key, handle)
    return [p[1] for p in ports], handle


def _static_reader(scope: Any, name: str, splits: Sequence[Split], outputs: tuple[str, ...],
                   time: str, granularity: int, positions: Mapping[str, int] | None,
                   start: int | None, pause_at: int | None, max_rows: int, history: int,
                   on_epoch: OnEpoch | None) -> _Reader:
    by_key = {s.key: s for s in splits}
    # a worker that joined the running job reads no split until some are handed to it
    # (``tokenflow.io.handover``)
    mine = [] if getattr(scope.worker, "joining", False) else \
        assign_splits([s.key for s in splits], scope.peers)[scope.worker_index]
    positions = dict(positions or {})
    unknown = sorted(set(positions) - set(by_key))
    if unknown:
        raise ValueError(f"{name}: positions for unknown splits {unknown[:5]} "
                         f"({len(unknown)} in all; splits are e.g. {sorted(by_key)[:3]})")
    reader = _Reader(name, outputs, time, granularity, start, pause_at, max_rows, history, on_epoch)
    reader.splits = by_key
    for key in mine:
        offset = int(positions.get(key, 0))
        if offset < 0:
            raise ValueError(f"{name}: negative position {offset} for split {key!r}")
        reader.states.append(_State(key, by_key[key], offset))
    reader.live = list(reader.states)
    return reader


def replayable_source(scope: Any, name: str, splits: Sequence[Split], time: str,
                      granularity: int = 1, positions: Mapping[str, int] | None = None,
                      start: int | None = None, pause_at: int | None = None,
                      max_rows: int = 65536, on_epoch: OnEpoch | None = None,
                      history: int = DEFAULT_HISTORY) -> tuple[Any, SourceHandle]:
    """A stream of Arrow batches read from ``splits``, timed by their column ``time``.

    Every worker builds the source with the same ``splits``; worker ``w`` reads
    ``assign_splits(keys, peers)[w]``, merging them in event-time order.  A row's logical time
    is ``time - time % granularity`` (integer times as they are, timestamps as ms since the
    Unix epoch, see ``tokenflow.io.times.epoch_ms``).  At most about ``max_rows`` rows are
    sent per activation (each split is read ``max_rows`` rows at a time).

    Args:
        positions: split key -> offset to start each split at (missing keys start at 0), e.g.
            the union of every worker's ``SourceHandle.positions()`` of a paused run.
        start: the epoch the job starts at (a multiple of ``granularity``): the source's token
            starts there, and a row before it is an error (the positions do not match it).
        pause_at: pause at this epoch from the start (see ``SourceHandle.pause_at``).
        on_epoch: called as ``on_epoch(t, ranges)`` once logical time ``t`` is complete on
            this worker (the token moved past it), with the offset ranges read at ``t``.
        history: logical times kept in ``SourceHandle.epochs``.

    Returns:
        ``(stream, handle)``.

    Raises:
        ValueError: bad arguments, repeated split keys, positions for unknown splits.
        InputError (at run time): a split not sorted by ``time`` (naming source, split,
            column, row and value), a row before ``start``, a null or bad time value or type,
            or a split that cannot be read (an Arrow or OS error, naming source, split and
            the row the failed read started at).
    """
    if splits and isinstance(splits[0], MultiSplit):
        raise TypeError(f"{name}: splits with several outputs go to replayable_streams")
    positions, start = restored(scope, name, positions, start)
    reader = _static_reader(scope, name, splits, ("out",), time, granularity, positions, start,
                            pause_at, max_rows, history, on_epoch)
    streams, handle = _build(scope, reader)
    return streams[0], handle


def replayable_streams(scope: Any, name: str, splits: Sequence[MultiSplit], time: str,
                       granularity: int = 1, positions: Mapping[str, int] | None = None,
                       start: int | None = None, pause_at: int | None = None,
                       max_rows: int = 65536, on_epoch: OnEpoch | None = None,
                       history: int = DEFAULT_HISTORY) -> tuple[dict[str, Any], SourceHandle]:
    """Like ``replayable_source`` for splits with several outputs (``MultiSplit``): one stream
    per output name, all driven by one token set (``time`` names the time in messages only;
    the splits give each position's time).

    Raises:
        ValueError: as ``replayable_source``, or splits with different outputs.
    """
    outputs = splits[0].outputs if splits else ()
    for s in splits:
        if s.outputs != outputs:
            raise ValueError(f"{name}: split {s.key!r} has outputs {s.outputs}, not {outputs}")
    positions, start = restored(scope, name, positions, start)
    reader = _static_reader(scope, name, splits, tuple(outputs), time, granularity, positions,
                            start, pause_at, max_rows, history, on_epoch)
    streams, handle = _build(scope, reader)
    return dict(zip(outputs, streams, strict=True)), handle


def nexmark_streams(scope: Any, events: int, config: GeneratorConfig | None = None,
                    splits: int = 16, block: int = 5000, granularity: int = 1,
                    positions: Mapping[str, int] | None = None, start: int | None = None,
                    pause_at: int | None = None, max_rows: int = 65536,
                    on_epoch: OnEpoch | None = None, name: str = "Nexmark",
                    extra: bool = True) -> tuple[dict[str, Any], SourceHandle]:
    """The NEXMark events ``[0, events)`` as three streams ``{"person", "auction", "bid"}``,
    replayable: ``replayable_streams`` over ``nexmark_splits(events, config, splits, block,
    extra)`` (each event generated once, see ``NexmarkSplit``; ``extra`` False: without the
    ``extra`` padding column); logical times are ``dateTime`` (ms) floored to
    ``granularity``."""
    parts = nexmark_splits(events, config, splits, block, extra)
    return replayable_streams(scope, name, parts, "dateTime", granularity, positions, start,
                              pause_at, max_rows, on_epoch)


__all__ = [
    "DEFAULT_HISTORY", "InputError", "MultiSplit", "NexmarkSplit", "OnEpoch", "ParquetSplit",
    "Parts", "SourceHandle", "Split", "TableSplit", "assign_splits", "nexmark_splits",
    "nexmark_streams", "parquet_splits", "replayable_source", "replayable_streams", "restored",
    "source_key", "table_splits",
]
