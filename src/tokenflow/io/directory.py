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
its row range), not re-derived: a restart takes its positions, and files not yet taken get
epochs of the new run's rounds (at or after ``start``).  (The alternative, bucketing a file's
modification time, is reproducible across runs but needs a lateness bound on the write-to-rename
delay and on the clock skew between writers and workers, beyond which a file falls behind the
frontier.)

With a ``time`` column, each file is a split sorted by it (see ``replayable_source``); files
must arrive in event-time order: the worker holds its token at the latest logical time it has
emitted (a later file may still hold rows at it), and a file with a row before the token fails
with ``InputError``.  Pausing at ``e`` then completes once a row at or after ``e`` was read (or
the input ended).
"""

from __future__ import annotations

import os
import time as clock
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from tokenflow.dataflow.routing import stable_hash
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
    _Waker,
    restored,
)
from tokenflow.state.bins import RoutingTable

FILE_DONE = -1
"""The position of a file that has been read to its end."""

FORMATS = ("parquet", "csv", "json")


class FileSplit(Split):
    """One file of a watched directory: Parquet (read by row group, see ``ParquetSplit``), CSV
    or JSON lines (read whole with ``pyarrow.csv`` / ``pyarrow.json`` on first use, then
    sliced).  ``schema`` fixes the column types of CSV / JSON files (otherwise inferred per
    file)."""

    def __init__(self, key: str, path: str, format: str, schema: pa.Schema | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown file format {format!r}; available: {', '.join(FORMATS)}")
        self.key = key
        self.path = path
        self.format = format
        self.schema = schema
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
        self.waker: _Waker | None = None

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
        epoch = max(current, floor)
        for name in self._owned(new):
            self.taken.add(name)
            offset = self.restored.get(name, 0)
            if offset == FILE_DONE:
                continue
            split = FileSplit(name, os.path.join(self.path, name), self.format, self.schema)
            state = _State(name, split, offset, None if self.timed else epoch)
            self.states.append(state)
            self.live.append(state)

    def _bound(self) -> int | None:
        if self.ending:
            return None
        floor = self.tokens[0].time if self.tokens else 0
        if self.timed:
            return max(floor, self.max_emitted if self.max_emitted is not None else floor)
        return max(floor, self.last_round if self.last_round is not None else floor)

    def _idle(self) -> None:
        if self.waker is None:
            self.waker = _Waker(self.activate)
        self.waker.at(self.next_poll)

    def _stop(self) -> None:
        if self.waker is not None:
            self.waker.close()
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
    return streams[0], handle


__all__ = ["FILE_DONE", "FORMATS", "FileSplit", "directory_source"]
