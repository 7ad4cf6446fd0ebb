"""NEXMark Q8: monitor new users — persons who registered and created an auction in the same
tumbling 10 s window.

Source: docs/NEXMARK.md ("Queries": Q8, persons who created auctions in the same tumbling 10 s
window → (id, name, window start)); Beam's ``Query8``.

Output ``COLUMNS``: ``window_start, window_end, id, name`` — distinct rows; ``window_start`` and
``window_end`` in ms since the Unix epoch (``int64``), the window being
``[window_start, window_end)``, ``window_end = window_start + 10_000``; windows are aligned to
the Unix epoch (``window_start % 10_000 == 0``).  A person ``(id, name)`` is reported for a
window when its ``person.dateTime`` and the ``dateTime`` of at least one auction with
``auction.seller == id`` both fall in the window.

Dataflow: ``Q8Persons`` projects persons to ``(id, name, dateTime)`` and ``Q8Auctions``
auctions to ``(seller, dateTime)``; ``Q8Join`` receives persons exchanged by ``id`` and
auctions by ``seller`` (``Exchange(column=...)``).  Records go to windows by their ``dateTime``
column (not by message time; a message's time must be ``<=`` the ``dateTime`` of its rows, as
``nexmark_source`` guarantees).  ``WindowState`` keeps, per open window, the persons' Arrow
rows and the sellers' ids; the operator holds one token per open window, at its end (taken
with ``ref.delayed(end)`` from the window's first message, as ``window.py`` does), and once
neither input frontier is before the end it emits the window's persons whose id is among its
sellers (``pyarrow.compute.is_in``) at logical time ``window_end``, drops the token and the
window's state.  Windows are retired in order of their ends, several per activation when the
frontiers jump.

State: ``Q8Join`` declares its ``WindowState`` as ``"windows"``: persons per bin of ``id``,
sellers per bin of ``seller`` (the columns the inputs are exchanged by).  Restored from a
snapshot, the operator re-mints one token per open window end (``pending_times()``) from its
initial token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo
from tokenflow.dataflow.stream import Stream
from tokenflow.io.times import round_down
from tokenflow.nexmark.generator import GeneratorConfig
from tokenflow.nexmark.queries._windows import (
    ChunkBins,
    ColumnarState,
    Taken,
    WindowTokens,
    distinct,
    group_slices,
    int_column,
    key_hashes,
)
from tokenflow.rescale.migrate import Elastic, keyed_operator, migrates

COLUMNS: list[str] = ["window_start", "window_end", "id", "name"]
ELASTIC = True
"""``build(..., elastic=Elastic())`` builds the stateful operators as migrating ones
(``tokenflow.rescale.migrate``): their bins move between workers while the job runs."""
SCHEMA: pa.Schema = pa.schema([("window_start", pa.int64()), ("window_end", pa.int64()),
                               ("id", pa.int64()), ("name", pa.utf8())])
WINDOW_MS = 10_000
"""Tumbling window length in ms."""
COMPACT_AFTER = 64
"""A window's last this many person batches (seller arrays) are merged into one."""
MOST_CHUNKS = 12
"""Chunks (person batches, seller arrays) a window holds before its two adjacent ones of the
fewest rows together are merged into one, ordered by bin (``_compact``), as batches are added
and while a migration step waits: a take cuts every chunk holding rows of the bins it takes, at
tens of microseconds a cut, and a one-bin take leaves two pieces of each chunk ordered by bin
that holds the bin.  A paced q8 run at 600,000 events/s whose fluid steps (one bin each) came
without waiting held up to 95 chunks in a window, and a take cut them in 5.5 ms of CPU
(2026-12-01)."""
MERGED_ROWS = 16_384
"""Most rows ``_compact`` merges into one chunk (about 1 ms at 60 ns a row)."""
COMPACT_SECONDS = 0.0005
"""Time after which ``_compact`` starts no further merge when called as batches are added."""

# Spark's ``window`` (aligned to the Unix epoch, session time zone UTC) assigns the windows
# independently of the dataflow's arithmetic.
SPARK_SQL = """
SELECT DISTINCT unix_millis(p.w.start) AS window_start, unix_millis(p.w.end) AS window_end,
       p.id, p.name
FROM (SELECT id, name, window(timestamp_millis(dateTime), '10 seconds') AS w FROM person) p
JOIN (SELECT seller, window(timestamp_millis(dateTime), '10 seconds') AS w FROM auction) a
  ON p.id = a.seller AND p.w.start = a.w.start
"""

_NO_HASHES = np.zeros(0, dtype=np.uint64)

PERSON_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.utf8())])
PERSON_ROWS = pa.schema([("window_end", pa.int64()), ("id", pa.int64()), ("name", pa.utf8())])
"""``WindowState``'s persons as exported rows (``window_end`` in ms)."""
SELLER_ROWS = pa.schema([("window_end", pa.int64()), ("seller", pa.int64())])
"""``WindowState``'s sellers as exported rows (``window_end`` in ms)."""


def _ids(batch: pa.RecordBatch) -> pa.Array:
    """A persons batch's key column."""
    return batch.column("id")


def _itself(chunk: Any) -> Any:
    """A chunk's own object: what its bins are remembered by (a sellers array: also its key
    column)."""
    return chunk


def _filter(batch: pa.RecordBatch, mask: np.ndarray) -> pa.RecordBatch:
    """The rows of a persons batch where ``mask`` is set."""
    return batch.filter(pa.array(mask))


def _merge_persons(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One persons batch of the rows of ``batches``, in their order."""
    return pa.concat_batches(batches)


def _slice_rows(batch: pa.RecordBatch, lo: int, hi: int) -> pa.RecordBatch:
    """Rows ``[lo, hi)`` of a persons batch (zero-copy)."""
    return batch.slice(lo, hi - lo)


def _take_rows(batch: pa.RecordBatch, order: np.ndarray) -> pa.RecordBatch:
    """A persons batch's rows in ``order``."""
    return batch.take(pa.array(order))


def _slice_ids(sellers: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Sellers ``[lo, hi)`` (a view)."""
    return sellers[lo:hi]


def _take_ids(sellers: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Sellers in ``order``."""
    return sellers[order]


def _compact(chunks: list[Any], stop: int, merge: Callable[[list[Any]], Any],
             deadline: float) -> bool:
    """While more than ``MOST_CHUNKS`` of ``chunks[:stop]`` are held, merge (in place) the
    two adjacent ones of the fewest rows together, ``merge(pair)``, if those are at most
    ``MERGED_ROWS``; no merge starts after ``deadline`` (``time.perf_counter()`` seconds).
    True when no merge is left to do."""
    while stop > MOST_CHUNKS:
        sizes = [len(c) for c in chunks[:stop]]
        pairs = [a + b for a, b in zip(sizes, sizes[1:], strict=False)]
        at = min(range(len(pairs)), key=pairs.__getitem__)
        if pairs[at] > MERGED_ROWS:
            return True
        if time.perf_counter() >= deadline:
            return False
        chunks[at:at + 2] = [merge(chunks[at:at + 2])]
        stop -= 1
    return True


def _mask(sellers: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The sellers where ``mask`` is set."""
    return sellers[mask]


class WindowState(ColumnarState):
    """The ``Q8Join`` state of one worker: the open windows' persons and sellers.

    Attributes:
        persons: window end (ms) -> Arrow batches of ``(id, name)`` of persons registered in
            the window (this worker's keys).
        sellers: window end (ms) -> ``int64`` arrays of the sellers of auctions created in
            the window.

    The operator's tokens (one per open window, at its end) are not part of the state: they
    follow from its keys (``pending_times()``); an operator restoring a snapshot must hold a
    token at or before the earliest of them to re-create them.

    As a ``BinnedState`` (``ColumnarState``): part 0, the persons (``PERSON_ROWS``) keyed by
    ``id``; part 1, the distinct sellers of each window (``SELLER_ROWS``) keyed by
    ``seller``.  The window size is the operator's parameter, not exported.
    """

    PARTS = (tuple(PERSON_ROWS.names), tuple(SELLER_ROWS.names))
    # take_per_bin stays False: a step is taken in one call (2-4 ms at half load); in slices
    # a step's first take to last slice was 14-44 ms instead of 4-5 (slices come a worker
    # step apart) and q8's migration p99 4.9-6.5x its steady p99 (rescale.md, "Runs of the
    # day": 2026-11-29 14:10)

    def __init__(self, size: int = WINDOW_MS) -> None:
        self.size = size
        self.persons: dict[int, list[pa.RecordBatch]] = {}
        self.sellers: dict[int, list[np.ndarray]] = {}
        self._loose: dict[tuple[int, int], int] = {}  # (part, end) -> batches added unmerged
        self._bins = ChunkBins()  # bins of the held ids and sellers, hashed once across takes

    def windows(self, times: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The distinct window ends of event ``times`` (ms) and, per end, the rows in it."""
        if len(times) == 0:
            return np.empty(0, dtype=np.int64), []
        ends = round_down(times, self.size) + self.size
        first = int(ends[0])
        if (ends == first).all():
            return np.array([first]), [np.arange(len(ends))]
        unique, inverse = np.unique(ends, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse, minlength=len(unique)))[:-1]
        return unique, np.split(order, bounds)

    def add_persons(self, end: int, rows: pa.RecordBatch) -> None:
        """Hold persons ``rows`` (``PERSON_SCHEMA``) of the window ending at ``end``.  Every
        ``COMPACT_AFTER`` batches added to a window are merged into one (a copy of their rows,
        ordered by the bins of their ids when the state has bins, rows of a bin in the order
        they came): a window's persons stay in a few hundred batches, not one per 1 ms
        message, so a take or a close handles few batches, and a migration takes a run of
        bins out of a merged batch as slices.  No rows: nothing (a window holds rows)."""
        if rows.num_rows == 0:
            return
        self._hold(self.persons.setdefault(end, []), (0, end), rows)

    def add_sellers(self, end: int, sellers: np.ndarray) -> None:
        """Hold the seller ids (int64) of auctions of the window ending at ``end``; every
        ``COMPACT_AFTER`` arrays added to a window are merged into one array of their distinct
        sellers (the join needs no more; the generator's hot sellers make a window's auctions
        about five per distinct seller, so this keeps the arrays that takes, snapshots and
        ``close`` go over a few times shorter), ordered by bin as ``add_persons`` orders
        persons.  No sellers: nothing."""
        if len(sellers) == 0:
            return
        self._hold(self.sellers.setdefault(end, []), (1, end), sellers)

    def _by_bin(self, chunk: Any, keys: Callable[[Any], Any],
                reorder: Callable[[Any, np.ndarray], Any]) -> Any:
        """A compacted chunk in the order of its keys' bins (when the state has bins), so that
        a migration takes its rows as slices (``ChunkBins.split``)."""
        if not self.bins:
            return chunk
        return self._bins.sort_by_bin(chunk, _itself, keys, self.bins, reorder)

    def _hold(self, held: list[Any], key: tuple[int, int], item: Any) -> None:
        """Append ``item`` to ``held`` (the chunks of ``key``: part 0 persons, 1 sellers, and
        the window end); the ``COMPACT_AFTER``-th item appended since the last merge (counted
        in ``_loose[key]``) merges them (``_merge_loose``)."""
        held.append(item)
        n = self._loose.get(key, 0) + 1
        if n < COMPACT_AFTER:
            self._loose[key] = n
        else:
            self._merge_loose(key, n)
            n = 0
        if len(held) - n > MOST_CHUNKS:
            _compact(held, len(held) - n, self._merge_by_bin(key[0]),
                     time.perf_counter() + COMPACT_SECONDS)

    def _merge_by_bin(self, part: int) -> Callable[[list[Any]], Any]:
        """How chunks of ``part`` (0 persons, 1 sellers) are merged into one ordered by bin."""
        return self._merge_persons_by_bin if part == 0 else self._merge_sellers_by_bin

    def _merge_persons_by_bin(self, batches: list[pa.RecordBatch]) -> pa.RecordBatch:
        """One persons batch of the rows of ``batches``, ordered by bin (stable)."""
        return self._by_bin(_merge_persons(batches), _ids, _take_rows)

    def _merge_sellers_by_bin(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The distinct sellers of ``arrays``, ordered by bin."""
        return self._by_bin(distinct(np.concatenate(arrays)), _itself, _take_ids)

    def _merge_loose(self, key: tuple[int, int], n: int) -> None:
        """Replace the last ``n`` chunks of ``key`` by one, ordered by bin: persons' rows
        copied, sellers made distinct (the join needs no more)."""
        part, end = key
        self._loose[key] = 0
        if part == 0:
            held = self.persons[end]
            held[-n:] = [self._merge_persons_by_bin(held[-n:])]
        else:
            arrays = self.sellers[end]
            arrays[-n:] = [self._merge_sellers_by_bin(arrays[-n:])]

    def close(self, end: int) -> pa.RecordBatch:
        """Forget the window ending at ``end``; its output rows (``SCHEMA``, distinct by
        ``(id, name)``)."""
        persons = self.persons.pop(end, [])
        self._loose.pop((0, end), None)
        self._loose.pop((1, end), None)
        sellers = self.sellers.pop(end, [])
        if not persons or not sellers:
            return _empty()
        table = pa.Table.from_batches(persons, schema=PERSON_SCHEMA)
        value_set = pa.array(distinct(np.concatenate(sellers)))
        found = table.filter(pc.is_in(table.column("id"), value_set=value_set))
        if found.num_rows > 1:
            ids = found.column("id").to_numpy()
            if len(distinct(ids)) < len(ids):  # a repeated id: distinct (id, name) rows
                found = found.group_by(["id", "name"], use_threads=False).aggregate([]) \
                    .select(["id", "name"])
        n = found.num_rows
        return pa.RecordBatch.from_arrays(
            [pa.array(np.full(n, end - self.size, dtype=np.int64)),
             pa.array(np.full(n, end, dtype=np.int64)),
             found.column("id").combine_chunks(), found.column("name").combine_chunks()],
            schema=SCHEMA)

    def pending_times(self) -> list[int]:
        """The open windows' ends (ms), ascending: one token each."""
        return sorted(set(self.persons) | set(self.sellers))

    def held_rows(self) -> int:
        return sum(b.num_rows for batches in self.persons.values() for b in batches) + \
            sum(len(a) for arrays in self.sellers.values() for a in arrays)

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        person_parts = [pa.Table.from_batches(batches, schema=PERSON_SCHEMA)
                        for batches in self.persons.values()]
        ends = [np.full(t.num_rows, end, dtype=np.int64)
                for end, t in zip(self.persons, person_parts, strict=True)]
        if person_parts:
            people = pa.concat_tables(person_parts)
            persons = pa.table([np.concatenate(ends), people.column("id"), people.column("name")],
                               schema=PERSON_ROWS)
        else:
            persons = PERSON_ROWS.empty_table()
        # distinct sellers per window (all the join needs): a hot seller's auctions would
        # otherwise weigh its bin with one row each, in snapshots and in migrations
        seller_arrays = [distinct(np.concatenate(arrays)) for arrays in self.sellers.values()]
        if seller_arrays:
            sellers = pa.table([np.concatenate([np.full(len(a), end, dtype=np.int64) for end, a
                                                in zip(self.sellers, seller_arrays, strict=True)]),
                                np.concatenate(seller_arrays).astype(np.int64, copy=False)],
                               schema=SELLER_ROWS)
        else:
            sellers = SELLER_ROWS.empty_table()
        return [(persons, key_hashes(persons, "id")), (sellers, key_hashes(sellers, "seller"))]

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the persons and sellers of ``member`` bins.

        One gather over the held rows' bins (hashed once per chunk, ``ChunkBins.split``)
        finds the persons batches (seller arrays) with rows going; each is filtered each way
        (consecutive small ones of a window, several with rows going, are concatenated into
        one first; a compacted one, ordered by bin, is sliced when the bins taken are a few
        runs: ``ChunkBins.split``), the kept rows a chunk of their own with their bins
        remembered.  The taken persons of a window
        come in batch order, its taken sellers distinct, as ``rows()`` gives them.  A window
        left without persons (sellers) is forgotten there; one left with neither releases its
        token."""
        self._loose = {}  # batches added before stay as they are
        held_persons = any(b.num_rows for batches in self.persons.values() for b in batches)
        taken, kept = self._bins.split(self.persons, _itself, _ids, member, _filter,
                                           _merge_persons, _slice_rows, _take_rows)
        self.persons = kept
        person_parts = [b for batches in taken.values() for b in batches]
        person_ends = [np.full(b.num_rows, end, dtype=np.int64)
                       for end, batches in taken.items() for b in batches]
        if person_parts:
            people = pa.Table.from_batches(person_parts, schema=PERSON_SCHEMA)
            persons = pa.table([np.concatenate(person_ends), people.column("id"),
                                people.column("name")], schema=PERSON_ROWS)
        else:
            persons = PERSON_ROWS.empty_table()
        # the taken batches' bins are remembered (``split``): not hashed again
        person_bins = np.concatenate([np.zeros(0, np.uint16), *self._bins.lookup(
            person_parts, _ids, self.bins or 1)])  # type: ignore[arg-type]
        held_sellers = any(len(a) for arrays in self.sellers.values() for a in arrays)
        gone, left = self._bins.split(self.sellers, _itself, _itself, member, _mask,
                                         np.concatenate, _slice_ids, _take_ids)
        self.sellers = left
        seller_parts = [(end, distinct(np.concatenate(arrays))) for end, arrays in gone.items()]
        if seller_parts:
            sellers_taken = pa.table(
                [np.concatenate([np.full(len(a), end, dtype=np.int64) for end, a in seller_parts]),
                 np.concatenate([a for _, a in seller_parts]).astype(np.int64, copy=False)],
                schema=SELLER_ROWS)
        else:
            sellers_taken = SELLER_ROWS.empty_table()
        return [Taken(persons, None, held_persons, person_bins),
                Taken(sellers_taken, key_hashes(sellers_taken, "seller"), held_sellers)]

    def _person_chunks(self) -> list[pa.RecordBatch]:
        """Every held batch of persons, window by window, in order."""
        return [b for batches in self.persons.values() for b in batches]

    def _seller_chunks(self) -> list[np.ndarray]:
        """Every held array of sellers, window by window, in order."""
        return [a for arrays in self.sellers.values() for a in arrays]

    def prepare_take(self, deadline: float) -> bool:
        """Ahead of a step's take, until ``deadline`` (``time.perf_counter()`` seconds):
        merge each window's batches added since its last merge (``COMPACT_AFTER`` bounds
        them, a take then cuts each) into one chunk ordered by bin, as ``add_persons`` does
        every ``COMPACT_AFTER`` batches, then hash the held ids and sellers a take would hash
        (``ChunkBins.warm``); True when all is done.  New batches keep coming while a step
        waits: those few are cut one by one.  A take of a third of the bins from a window of
        4 merged chunks and 54 loose batches cut 58 chunks; after this, 6 (traced q8 run).
        Then each window is compacted (``_compact``) until ``deadline``."""
        for key, n in list(self._loose.items()):
            if n < 2:
                continue
            if time.perf_counter() >= deadline:
                return False
            self._merge_loose(key, n)
        for part, held in enumerate((self.persons, self.sellers)):
            for chunks in held.values():
                if not _compact(chunks, len(chunks), self._merge_by_bin(part), deadline):
                    return False
        n = self.bins or 1
        return self._bins.warm(self._person_chunks(), _ids, n, deadline) and \
            self._bins.warm(self._seller_chunks(), _itself, n, deadline)

    def add_rows(self, part: int, table: pa.Table) -> None:
        ends = int_column(table, "window_end")
        order = np.argsort(ends, kind="stable")
        unique, starts, stops = group_slices(ends[order])
        if part == 0:
            rows = table.select(PERSON_SCHEMA.names).cast(PERSON_SCHEMA) \
                .take(pa.array(order)).combine_chunks()
            for end, lo, hi in zip(unique.tolist(), starts.tolist(), stops.tolist(), strict=True):
                self.persons.setdefault(end, []).extend(rows.slice(lo, hi - lo).to_batches())
        else:
            sellers = int_column(table, "seller")[order]
            for end, lo, hi in zip(unique.tolist(), starts.tolist(), stops.tolist(), strict=True):
                self.sellers.setdefault(end, []).append(sellers[lo:hi])

    def clear(self) -> None:
        self.persons = {}
        self.sellers = {}
        self._loose = {}

    def snapshot(self) -> dict[str, Any]:
        """The state as plain data: ``{"size": ms, "windows": [ends], "persons": {end:
        Table(id, name)}, "sellers": {end: int64 array}}`` (safe to pickle)."""
        ends = sorted(set(self.persons) | set(self.sellers))
        return {
            "size": self.size,
            "windows": ends,
            "persons": {e: pa.Table.from_batches(self.persons[e], schema=PERSON_SCHEMA)
                        for e in self.persons},
            "sellers": {e: np.concatenate(self.sellers[e]) for e in self.sellers},
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()``."""
        self.size = snapshot["size"]
        self._loose = {}
        self.persons = {e: t.combine_chunks().to_batches() or [] for e, t in snapshot["persons"].items()}
        self.sellers = {e: [np.asarray(a, dtype=np.int64)] for e, a in snapshot["sellers"].items()}


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=SCHEMA)


def join(persons: Stream, auctions: Stream, size: int = WINDOW_MS, name: str = "Q8Join",
         states: list[WindowState] | None = None, elastic: Elastic | None = None) -> Stream:
    """The windowed join of ``persons`` ``(id, name, dateTime)`` and ``auctions``
    ``(seller, dateTime)`` (see the module docstring).  The worker's ``WindowState`` is the
    operator's declared state ``"windows"``; ``states`` also receives it when given (tests).
    ``elastic``: a migrating operator (``tokenflow.rescale.migrate``)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        state = info.state("windows", WindowState(size))
        if states is not None:
            states.append(state)
        # one token per open window end: a restored state's windows get theirs from the
        # initial token, which is then dropped (only open windows hold tokens)
        tokens = WindowTokens(capability, state.pending_times())
        migrates(info, tokens)
        capability.drop()

        def open_windows(ref: Any, times: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
            unique, rows = state.windows(times)
            tokens.mint(ref, unique.tolist())
            return unique, rows

        def logic(person_in: OperatorInput, auction_in: OperatorInput, output: OperatorOutput) -> None:
            # one batch of persons and one array of sellers per window per activation: the
            # sources send a message per millisecond of event time, and every batch a window
            # holds costs each take, close and compaction a pass of its own
            people: dict[int, list[pa.RecordBatch]] = {}
            for ref, batch in person_in:
                unique, rows = open_windows(ref, batch.column("dateTime").to_numpy())
                persons = batch.select(PERSON_SCHEMA.names)
                if len(unique) == 1:
                    people.setdefault(int(unique[0]), []).append(persons)
                else:
                    for end, index in zip(unique.tolist(), rows, strict=True):
                        people.setdefault(end, []).append(persons.take(pa.array(index)))
            for end, batches in people.items():
                state.add_persons(end, batches[0] if len(batches) == 1 else
                                  pa.concat_batches(batches))
            sellers: dict[int, list[np.ndarray]] = {}
            for ref, batch in auction_in:
                unique, rows = open_windows(ref, batch.column("dateTime").to_numpy())
                column = batch.column("seller").to_numpy()
                for end, index in zip(unique.tolist(), rows, strict=True):
                    sellers.setdefault(end, []).append(column[index])
            for end, arrays in sellers.items():
                state.add_sellers(end, arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
            f1, f2 = person_in.frontier, auction_in.frontier
            while True:
                end = tokens.least()
                if end is None or f1.less_than(end) or f2.less_than(end):
                    break
                cap = tokens.pop(end)
                out = state.close(end)
                if out.num_rows:
                    output.give_batch(cap, out)
                cap.drop()

        return logic

    return keyed_operator([persons, auctions], ["id", "seller"], name, constructor, elastic)


def build(streams: dict[str, Stream], config: GeneratorConfig,
          states: list[WindowState] | None = None, elastic: Elastic | None = None) -> Stream:
    """Persons with an auction in the same 10 s window (``COLUMNS``, at time ``window_end``);
    with ``elastic`` the join's state migrates (``tokenflow.rescale.migrate``)."""

    def project_persons(batch: Any) -> pa.RecordBatch:
        return batch.select(["id", "name", "dateTime"])

    def project_auctions(batch: Any) -> pa.RecordBatch:
        return batch.select(["seller", "dateTime"])

    persons = streams["person"].map_batch(project_persons, name="Q8Persons")
    auctions = streams["auction"].map_batch(project_auctions, name="Q8Auctions")
    return join(persons, auctions, states=states, elastic=elastic)
