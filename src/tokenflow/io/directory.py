"""``directory_source``: the files dropped into a directory while a job runs, each read once.

Source: Spark Structured Streaming's file source (a directory is polled; each new file is read
once; a file must appear atomically, by a move/rename, to be read whole); distributed-DBSP
design, "Input" and "Scaling input" (positions recorded per input partition; partitions assigned
to workers so that a restart at another worker count re-assigns them); docs/ARCHITECTURE.md,
"Sources, sinks and the control plane".

Protocol for writers: write a file under a hidden name (starting with ``.`` or ``_``, which the
source never reads), then rename it to its final name in the same directory (``os.replace``,
atomic on POSIX file systems); never change a file after the rename.  To end the input, create
the file named ``end_marker`` after the last data file was renamed into place.

Exactly once, with any number of workers and across restarts:

1. *One reader per file.*  The owner of a file is
   ``RoutingTable.even(peers).routes(stable_hash([name]))``: a pure function of its name and the
   worker count, the same on every worker, so exactly one worker of the job takes the file.
2. *Whole files only.*  A name becomes visible only through the rename, after its content is
   complete, and names starting with ``.`` or ``_`` are skipped, so a file is never read while
   being written.
3. *Each file once per run.*  The owner remembers every name it has taken and reads each file
   in order of its rows, from offset 0 (or the restored offset), exactly once.
4. *Across restarts.*  ``positions()`` maps every taken file to ``FILE_DONE`` or to the offset
   of its next row (and keeps the restored entries of the files this worker owns), so the
   union over workers covers every file taken.  A restarted source (any worker count) skips
   the files recorded ``FILE_DONE`` and resumes the others at their offsets.
5. *Ending.*  Once a listing shows ``end_marker``, the worker lists the directory once more:
   that listing starts after the marker was seen, hence after every rename that preceded the
   marker's creation, so it finds every data file (a single listing could miss a name renamed
   into place while it was running).  The worker reads what it took and then drops its token.

Epochs without a ``time`` column: a file's rows all get the epoch of the poll round in which
its owner first listed it.  Rounds are aligned to the wall clock: round ``t`` (ms since the
Unix epoch, a multiple of ``poll`` in ms) is ``[t, t + poll)``, and the owner lists once per
round.  So every worker gives epoch ``t`` the same meaning ("first seen during ``[t, t +
poll)``") without talking to the others (given synchronized clocks), and no two workers ever
give a file an epoch, since only its owner takes it.  The owner holds its token at the round
of its last listing (later listings fall in the same or later rounds; a clock that goes back is
ignored) and at the least epoch of its unfinished files, so an epoch completes one round after
it was listed.  The division epoch -> files is *recorded* (``SourceHandle.epochs``, per file
its row range), not re-derived.  (The alternative, bucketing a file's modification time, is
reproducible across runs but needs a lateness bound on the write-to-rename delay and on the
clock skew between writers and workers, beyond which a file falls behind the frontier.)

Exactly once across crash restarts (the distributed-DBSP design, "Input/output
synchronization": the division of the input into epochs is durable before any output of an
epoch is released, and a replay puts every input record in the epoch it had).  Positions alone
do not give that without a ``time`` column: a file taken after the last checkpoint whose epoch
the sink committed before a crash would get an epoch of the new run's rounds, and its rows
would be committed twice.  So, when the worker has an input log (``worker.input_log``, a
``tokenflow.io.inputlog.InputLog``, as under ``tokenflow.recovery.CheckpointedJob``), the
source logs the division under its source key (``source_key``, as its positions):

* *What.*  Per epoch, one Python list of ``(file, first, end)``: every file its owner assigned
  to that epoch and the row range ``[first, end)`` it read there (``first`` is 0, or a
  restored offset; an empty file is logged with ``first == end``).
* *When.*  Whenever the source's token moves from epoch ``a`` to ``b`` (a new round, a pause,
  the end), *before* the token moves, every epoch in ``[a, b)`` is sealed: the epochs with
  files in ascending order and the rest as empty seals, chained so that this worker's seals
  cover every epoch its token passed (``InputLog.seal``; the end of the input is sealed with
  ``seal_last``; a source closed early seals what it emitted).  The sink commits an epoch only
  once every worker's token has passed it, so an epoch with output is logged before any of it
  is committed.  A job stopped by the control plane (``worker.stopped``) seals nothing more.
* *Replay.*  A run that restores a snapshot of epoch ``e`` (or has ``worker.replay`` set, from
  the source's first epoch) reads the logged epochs from ``e`` up to the first one not logged
  (``InputLog.replay``: logged means sealed by every worker of one run) from *every* old
  worker's seals (a view of the log as worker 0 of 1; ``InputLog``'s own share, old workers
  ``w % W' == w'``, would hand a file to a worker that does not own it under the new count
  ``W'``).  Each worker re-reads the logged files it owns under ``W'`` (item 1), exactly their
  logged row ranges, at their logged epochs, before anything else: a file logged at an epoch
  wins over its recorded position.  Files not logged (taken after the last logged epoch, or
  never) are taken again as new files, in rounds at or after the first epoch not logged, so
  never in a logged epoch; the run seals from that epoch on.  When the logged input ended
  (every old worker sealed its end), the replay ends the source without listing again.
  Epochs before ``e`` are in the snapshot (their files are ``FILE_DONE`` in the positions),
  and an epoch a failed run sealed on some workers only is not logged: not every worker's
  token passed it, so the sink committed none of its output, and taking its files again in
  new epochs duplicates nothing.  A fresh run (no restore, no replay) refuses a log
  that already holds epochs of the source (``InputLog.ensure_fresh``).
* *Cost.*  One seal per token move per worker, i.e. at most one per poll round while the
  source runs (also for rounds without files, since a worker's seals must cover every epoch
  its token passes): a small file written and fsynced (file and directory) on the worker
  thread, a median of about 1.3 ms on a local disk (with a tail of 10-20 ms on a loaded
  machine); the log is truncated with the checkpoints.  A replay reads every old worker's
  seals from the restored epoch on, on every worker.

With a ``time`` column, each file is a split sorted by it (see ``replayable_source``); files
must arrive in event-time order: the worker holds its token at the latest logical time it has
emitted (a later file may still hold rows at it), and a file with a row before the token fails
with ``InputError``.  Pausing at ``e`` then completes once a row at or after ``e`` was read (or
the input ended).  Nothing is logged then: a row's epoch comes from the row, so a replay from
the positions puts every row in the epoch it had (a committing sink discards the epochs it
committed before the crash whole, and rows of later epochs are read once, from the recorded
offsets).  Only a file that breaks the event-time order (rows at an epoch the frontier had
passed before the crash) behaves differently in a replay: its rows there are dropped with the
committed epoch instead of failing the job.
"""

from __future__ import annotations

import os
import time as clock
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from tokenflow.dataflow.routing import stable_hash
from tokenflow.io.inputlog import InputLog, InputLogError
from tokenflow.io.sources import (
    DEFAULT_HISTORY,
    OnEpoch,
    ParquetSplit,
    SourceHandle,
    Split,
    _as_batch,
    _build,
    _Reader,
    _State,
    restored,
    source_key,
)
from tokenflow.io.times import InputError
from tokenflow.state.bins import RoutingTable

FILE_DONE = -1
"""The position of a file that has been read to its end."""

FORMATS = ("parquet", "csv", "json")


class FileSplit(Split):
    """One file of a watched directory: Parquet (read by row group, see ``ParquetSplit``), CSV
    or JSON lines (read whole with ``pyarrow.csv`` / ``pyarrow.json`` on first use, then
    sliced).  ``schema`` fixes the column types of CSV / JSON files (otherwise inferred per
    file).  ``stop``: read the rows before it only (a logged row range being replayed); a file
    that ends before ``stop`` fails with ``InputError``."""

    def __init__(self, key: str, path: str, format: str, schema: pa.Schema | None = None,
                 stop: int | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown file format {format!r}; available: {', '.join(FORMATS)}")
        self.key = key
        self.path = path
        self.format = format
        self.schema = schema
        self.stop = stop
        self._parquet = ParquetSplit(key, path) if format == "parquet" else None
        self._data: pa.RecordBatch | None = None

    def _load(self) -> pa.RecordBatch:
        if self._data is None:
            if self.format == "csv":
                import pyarrow.csv as pcsv

                options = pcsv.ConvertOptions(column_types=self.schema) if self.schema else None
                table = pcsv.read_csv(self.path, convert_options=options)
            else:
                import pyarrow.json as pjson

                parse = pjson.ParseOptions(explicit_schema=self.schema) if self.schema else None
                table = pjson.read_json(self.path, parse_options=parse)
            self._data = _as_batch(table)
        return self._data

    def read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        if self.stop is not None:
            if offset >= self.stop:
                self._data = None  # the logged range is read: free it
                return None
            max_rows = min(max_rows, self.stop - offset)
        batch = self._read(offset, max_rows)
        if self.stop is not None and (batch is None or batch.num_rows == 0):
            raise InputError(f"file {self.path!r} ends at row {offset}, but the input log "
                             f"records rows up to {self.stop} of it (was it changed or "
                             "replaced after it was read?)")
        return batch

    def _read(self, offset: int, max_rows: int) -> pa.RecordBatch | None:
        if self._parquet is not None:
            return self._parquet.read(offset, max_rows)
        data = self._load()
        if offset >= data.num_rows:
            self._data = None  # read to the end: free it
            return None
        return data.slice(offset, max_rows)


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


class _DirectoryReader(_Reader):
    """A ``_Reader`` whose splits are the files of a directory, found by polling."""

    def __init__(self, scope: Any, name: str, path: str, format: str, time: str | None,
                 poll: float, end_marker: str | None, granularity: int,
                 positions: Mapping[str, int] | None, start: int | None, pause_at: int | None,
                 max_rows: int, history: int, on_epoch: OnEpoch | None,
                 schema: pa.Schema | None) -> None:
        super().__init__(name, ("out",), time or "(poll round)", granularity if time else 1,
                         start, pause_at, max_rows, history, on_epoch)
        if poll <= 0:
            raise ValueError(f"{name}: poll must be > 0 s, got {poll}")
        if format not in FORMATS:
            raise ValueError(f"{name}: unknown format {format!r}; available: {', '.join(FORMATS)}")
        self.path = path
        self.format = format
        self.timed = time is not None
        self.poll_ms = max(1, round(poll * 1000))
        self.end_marker = end_marker
        self.schema = schema
        self.worker = scope.worker_index
        self.table = RoutingTable.even(scope.peers)
        restored = dict(positions or {})
        mine = self._owned(sorted(restored))
        self.restored = {n: int(restored[n]) for n in mine}
        self.taken: set[str] = set()
        self.last_round: int | None = None  # ms: the round of the last listing
        self.next_poll = 0.0  # time.monotonic() of the next listing
        self.ending = False
        self.wake_at: float | None = None  # the next listing's time, once asked to be woken
        # the input log (files without a time column only): see the module docstring
        self.job_worker = scope.worker
        self.log: Any = None if self.timed else getattr(scope.worker, "input_log", None)
        self.key = source_key(scope, name)
        self.seal_from: int | None = None  # the least epoch this run seals (None: ended)
        self.assigned: dict[int, dict[str, int]] = {}  # epoch -> file -> first offset, unsealed
        self.by_name: dict[str, _State] = {}

    def _owned(self, names: list[str]) -> list[str]:
        if not names:
            return []
        owners = self.table.routes(stable_hash(names))
        return [n for n, w in zip(names, owners.tolist(), strict=True) if w == self.worker]

    def positions(self) -> dict[str, int]:
        out = {n: o for n, o in self.restored.items()}
        for st in self.states:
            out[st.key] = FILE_DONE if st.done else st.offset
        return out

    def _list(self) -> list[str]:
        try:
            with os.scandir(self.path) as entries:
                return [e.name for e in entries if e.is_file()]
        except FileNotFoundError:
            return []

    def _discover(self) -> None:
        if self.ending or self.paused or clock.monotonic() < self.next_poll:
            return
        moves = self.moves
        if moves is not None and not moves.complete:
            return  # a re-split: fenced, or names other workers took still to come
        now_ms = int(clock.time() * 1000)
        current = now_ms - now_ms % self.poll_ms
        if self.last_round is not None:
            current = max(current, self.last_round)  # a clock that went back
        self.last_round = current
        wait_ms = current + self.poll_ms - now_ms
        self.next_poll = clock.monotonic() + max(wait_ms, 1) / 1000
        names = self._list()
        if self.end_marker is not None and self.end_marker in names:
            names = self._list()  # sees every file renamed into place before the marker
            self.ending = True
        new = sorted(n for n in names
                     if _visible(n) and n != self.end_marker and n not in self.taken)
        floor = self.tokens[0].time if self.tokens else 0
        epoch = max(current, floor, self.seal_from or 0)  # never a replayed (logged) epoch
        if moves is not None and moves.at is not None:
            epoch = max(epoch, moves.at)  # from a re-split's t on: the new table
        for name in self._owned(new):
            self.taken.add(name)
            offset = self.restored.get(name, 0)
            if offset == FILE_DONE:
                continue
            self._add(name, offset, None if self.timed else epoch, None)

    def _add(self, name: str, offset: int, epoch: int | None, stop: int | None) -> None:
        """Start reading file ``name`` at ``offset`` (up to ``stop``), all its rows at
        ``epoch`` (None: times from the ``time`` column)."""
        split = FileSplit(name, os.path.join(self.path, name), self.format, self.schema, stop)
        state = _State(name, split, offset, epoch)
        self.states.append(state)
        self.live.append(state)
        self.by_name[name] = state
        if self.log is not None and epoch is not None and stop is None:
            self.assigned.setdefault(epoch, {})[name] = offset

    def _bound(self) -> int | None:
        if self.ending:
            return None
        floor = self.tokens[0].time if self.tokens else 0
        if self.timed:
            return max(floor, self.max_emitted if self.max_emitted is not None else floor)
        return max(floor, self.last_round if self.last_round is not None else floor,
                   self.seal_from or 0)

    def _idle(self) -> None:
        if self.wake_at != self.next_poll:  # once per listing: the worker parks until then
            self.wake_at = self.next_poll
            self.activate_after(max(0.0, self.next_poll - clock.monotonic()))

    # -- the input log ----------------------------------------------------------------------

    def plan(self) -> None:
        """With an input log: bind it and, on a run that restores or replays, start the replay
        of the logged epochs from the source's first epoch on (every file of them this worker
        owns, at its logged epoch and row range); on a fresh run, check the log holds none.

        Raises:
            InputLogError: the log cannot be read, or a fresh run finds epochs of this source
                already logged.
        """
        log, worker = self.log, self.job_worker
        if log is None:
            return
        log.bind(int(getattr(worker, "peers", 1)))
        since = int(self.tokens[0].time) if self.tokens else 0
        if self.start is not None:
            since = max(since, self.start)
        if getattr(worker, "restore", None) is None and not getattr(worker, "replay", False):
            log.ensure_fresh(self.key, since)
            self.seal_from = since
            return
        # Every old worker's seals (a view of the log as one worker of one), not only the
        # share of the old workers w with w % W' == this worker: a file is replayed by its
        # owner under this run's worker count, whichever old worker logged it.
        view = InputLog(log.root, log.job, 0, peers=1)
        plan = view.replay(self.key, since)
        self.seal_from = plan.until
        if plan.until is None:
            self.ending = True  # the logged input ended: replay it, then end (no listing)
        entries: dict[str, tuple[int, int, int]] = {}
        for epoch in plan.epochs:
            for batch in plan.batches(epoch):
                for name, first, end in batch:
                    if name in entries:
                        raise InputLogError(f"{log.directory(self.key)}: file {name!r} is logged "
                                            f"at epochs {entries[name][0]} and {epoch}")
                    entries[name] = (epoch, int(first), int(end))
        for name in self._owned(sorted(entries)):
            epoch, first, end = entries[name]
            self.taken.add(name)
            self._add(name, first, epoch, end)

    def _advance(self, time: int | None) -> None:
        """Seal the epochs the token leaves in the input log first (see the module
        docstring), then move it."""
        if self.log is not None and self.tokens and \
                not getattr(self.job_worker, "stopped", False):
            self._seal(int(self.tokens[0].time), None if time is None else int(time))
        super()._advance(time)

    def _seal(self, a: int, b: int | None) -> None:
        """The token moves from epoch ``a`` to ``b`` (None: it is dropped): seal every epoch
        in ``[a, b)`` from ``seal_from`` on, each with the files assigned to it and their
        row ranges, chained so that the seals cover ``[max(a, seal_from), b)``."""
        low = self.seal_from
        if low is None or (b is not None and b <= max(a, low)):
            return
        low = max(a, low)
        ended = b is None and self.ending and all(st.done for st in self.states)
        points = sorted({low, *(e for e in self.assigned if e > low and (b is None or e < b))})
        log = self.log
        for i, epoch in enumerate(points):
            files = self._division(epoch)
            if files:
                log.append(self.key, epoch, [files])
            if i + 1 < len(points):
                log.seal(self.key, epoch, points[i + 1])
            elif b is not None:
                log.seal(self.key, epoch, b)
            elif ended:
                log.seal_last(self.key, epoch)
            else:  # closed before the input ended: what was emitted up to here
                log.seal(self.key, epoch, epoch + 1)
        self.seal_from = b if b is not None else (None if ended else points[-1] + 1)

    def _division(self, epoch: int) -> list[tuple[str, int, int]]:
        """``(file, first, end)`` of every file assigned to ``epoch``: read whole (or empty),
        or with rows emitted (a source closed early); files with nothing emitted stay
        unlogged (a replay takes them again as new files)."""
        assigned = self.assigned.pop(epoch, {})
        ranges = self.epochs.get(epoch, {})
        out = []
        for name, first in sorted(assigned.items()):
            emitted = ranges.get(name)
            if self.by_name[name].done:
                out.append((name, *(emitted or (first, first))))
            elif emitted is not None:
                out.append((name, *emitted))
        return out

    def _stop(self) -> None:
        for st in self.states:  # free loaded files
            if isinstance(st.split, FileSplit):
                st.split._data = None


def directory_source(scope: Any, name: str, path: str, format: str = "parquet",
                     time: str | None = None, poll: float = 0.2, end_marker: str | None = "_END",
                     granularity: int = 1, positions: Mapping[str, int] | None = None,
                     start: int | None = None, pause_at: int | None = None,
                     max_rows: int = 65536, on_epoch: OnEpoch | None = None,
                     history: int = DEFAULT_HISTORY,
                     schema: pa.Schema | None = None) -> tuple[Any, SourceHandle]:
    """A stream of the rows of the files that appear in directory ``path`` (not its
    subdirectories), each file read by one worker, once (see the module docstring for the
    writer protocol, the exactly-once argument and how epochs are chosen).

    Args:
        format: ``parquet``, ``csv`` (``pyarrow.csv``) or ``json`` (JSON lines,
            ``pyarrow.json``).
        time: an event-time column (then files are splits sorted by it, logical time
            ``time - time % granularity``); None: rows get the epoch of the poll round in which
            the file was first listed (ms since the Unix epoch, a multiple of ``poll`` ms).
        poll: seconds between listings (and the length of a round).
        end_marker: the file whose appearance ends the input (None: the source runs until
            ``SourceHandle.close()``).
        positions: the union of the ``SourceHandle.positions()`` of a previous run: file name
            -> ``FILE_DONE`` or the offset of its next row.
        start, pause_at, max_rows, on_epoch, history: as for ``replayable_source``.
        schema: column types of CSV / JSON files.

    Returns:
        ``(stream, handle)``.

    Raises:
        ValueError: a bad format, poll or granularity.
        InputError (at run time): with ``time``, a file not sorted by it, holding a row before
            the source's frontier, or a null or bad value in it (naming source, file, column,
            row and value); a file that cannot be read or parsed (e.g. a CSV value that does
            not fit ``schema``, a truncated Parquet file; naming source, file and row).
    """
    positions, start = restored(scope, name, positions, start)
    reader = _DirectoryReader(scope, name, os.fspath(path), format, time, poll, end_marker,
                              granularity, positions, start, pause_at, max_rows, history,
                              on_epoch, schema)
    streams, handle = _build(scope, reader)
    reader.plan()
    return streams[0], handle


__all__ = ["FILE_DONE", "FORMATS", "FileSplit", "directory_source"]
