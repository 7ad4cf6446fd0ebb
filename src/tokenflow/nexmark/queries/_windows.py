"""Shared pieces of the windowed NEXMark queries (Q5, Q7): frontier bounds, Arrow helpers and
the "rows with the window's maximum" operator.

Source: the timestamp-tokens paper §5 (one token per open window, retired in order of window end
once the input frontier passes it) and §7.4 (Q7: a local then a global maximum, two stateful
operators); docs/NEXMARK.md ("Queries": Q5, Q7).

Units: times and window bounds are ms since the Unix epoch (the logical times of
``nexmark_source``); prices are cents.  All times are ``int`` (no iterative scopes).

State: every stateful operator of the queries declares its state object with
``OperatorInfo.state`` (Megaphone, Hoffmann et al., VLDB 2019: state kept per bin, so the
system snapshots it per bin and a job restored at another worker count loads, on each worker,
the bins it owns).  The objects derive from ``ColumnarState``: their rows are Arrow tables and
numpy arrays, exported per bin of the stable hash of their key column — the hash the
operator's ``Exchange(column=...)`` routes by — with one hash and one ``split_by_bin`` per
export, never in the operators' hot path.  An operator restoring such a state mints one token
per ``pending_times()`` from its initial token (the timestamp-tokens paper §5).
"""

from __future__ import annotations

import heapq
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability, CapabilityRef
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary, unary_frontier
from tokenflow.dataflow.routing import column_hashes, hash_ints
from tokenflow.dataflow.state import BinnedState, split_by_bin
from tokenflow.dataflow.stream import Stream
from tokenflow.rescale.migrate import Elastic, keyed_operator, migrates
from tokenflow.state.bins import bins_of

INT64_MIN = np.iinfo(np.int64).min


def frontier_bound(frontier: Any) -> int | None:
    """The least time still possible on an input with ``int`` times, or None when the frontier
    is empty (the input has ended).  ``frontier`` is an ``OperatorInput.frontier``."""
    elements = frontier.frontier()
    return min(elements) if elements else None


def passed(bound: int | None, end: int, inclusive: bool) -> bool:
    """True when no more data for a window ending at ``end`` can arrive.

    ``inclusive=False``: the window's data carries times ``< end`` (raw events), so the window
    is complete once the frontier is ``>= end``; ``inclusive=True``: its data may carry time
    ``end`` itself (partial results sent at the window end), so it needs the frontier ``> end``.
    """
    if bound is None:
        return True
    return bound > end if inclusive else bound >= end


def drain(input: OperatorInput) -> tuple[list[Any], CapabilityRef | None]:
    """Every waiting message's batch, and the ref with the least time (None when none came).

    The least ref is valid only during the current invocation; it can mint a token for any
    time at or after every message received in it.
    """
    batches: list[Any] = []
    least: CapabilityRef | None = None
    for ref, batch in input:
        batches.append(batch)
        if least is None or ref.time < least.time:
            least = ref
    return batches, least


class WindowTokens:
    """One token per open window, held at the window's end (paper §5).

    ``initial`` mints the tokens of the windows a restored state already holds; ``mint`` adds
    one for each new window end from an invocation's least message ref; ``pop`` hands a
    window's token over when it is retired (the caller sends with it, then drops it);
    ``least`` is the earliest end held.  As ``tokenflow.rescale.migrate.HeldTokens``:
    ``adopt`` is ``mint`` (the windows of state moved in), ``release`` drops the tokens of
    windows the state no longer holds (moved out).
    """

    __slots__ = ("_tokens", "_ends")

    def __init__(self, initial: Capability, ends: Iterable[int]) -> None:
        self._tokens: dict[int, Capability] = {t: initial.delayed(t) for t in ends}
        self._ends: list[int] = sorted(self._tokens)  # a heap of the held ends (and stale ones)

    def mint(self, least: CapabilityRef | Capability, ends: Iterable[int]) -> None:
        """A token at each of ``ends`` not held yet, from ``least`` (valid this invocation).

        Raises:
            CapabilityError: an end before ``least``'s time.
        """
        tokens = self._tokens
        for end in ends:
            if end not in tokens:
                tokens[end] = least.delayed(end)
                heapq.heappush(self._ends, end)

    adopt = mint

    def release(self, ends: Iterable[int]) -> None:
        """Drop the tokens of the windows not in ``ends``."""
        keep = set(ends)
        for end in [e for e in self._tokens if e not in keep]:
            self._tokens.pop(end).drop()

    def least(self) -> int | None:
        """The earliest window end held, or None."""
        ends, tokens = self._ends, self._tokens
        while ends and ends[0] not in tokens:
            heapq.heappop(ends)
        return ends[0] if ends else None

    def pop(self, end: int) -> Capability:
        """The token of the window ending at ``end``, no longer held here."""
        return self._tokens.pop(end)


def coalesce(stream: Stream, name: str = "Coalesce") -> Stream:
    """Forward, per invocation, every batch received as ONE record batch at the least time.

    Use before an exchange of a stream with many tiny messages (``nexmark_source`` at 1 ms
    granularity sends about one bid per message): the exchange then hashes and splits one batch
    per invocation instead of one per message.  Moving rows to an earlier time is always
    allowed (the least ref covers it) and keeps ``dateTime >= logical time``, the property the
    NEXMark operators rely on; they window by ``dateTime``, never by message time.  Pipeline
    pact, no state, holds no token.
    """

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            batches, least = drain(input)
            if least is None:
                return
            if len(batches) == 1:
                output.give_batch(least, batches[0])
                return
            table = concat(batches)
            if table.num_rows:
                output.give_batch(least, to_batch(table, table.schema))

        return logic

    return unary(stream, "pipeline", name, constructor)


def concat(batches: Sequence[Any], schema: pa.Schema | None = None) -> pa.Table:
    """One Arrow table of record batches / tables (``schema`` is needed when empty)."""
    parts = [b for b in batches if len(b)]
    if not parts:
        if schema is None:
            raise ValueError("concat of no batches needs a schema")
        return schema.empty_table()
    if all(isinstance(b, pa.RecordBatch) for b in parts):
        return pa.Table.from_batches(parts)  # one call: no per-batch table objects
    return pa.concat_tables([b if isinstance(b, pa.Table) else pa.Table.from_batches([b])
                             for b in parts])


def to_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """``table`` (columns of ``schema``, in that order) as one RecordBatch."""
    table = table.select(schema.names).combine_chunks()  # one chunk per column
    return pa.RecordBatch.from_arrays(
        [table.column(name).chunk(0) if table.column(name).num_chunks == 1
         else table.column(name).combine_chunks() for name in schema.names], schema=schema)


def int_column(table: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` as an int64 numpy array (one copy at most).

    Raises:
        KeyError: when the column is missing.
    """
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def group_slices(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a sorted key array: ``(unique keys, start offsets, stop offsets)`` of its runs."""
    if len(keys) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return keys[:0], empty, empty
    starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate((np.zeros(1, dtype=starts.dtype), starts))
    stops = np.concatenate((starts[1:], np.array([len(keys)], dtype=starts.dtype)))
    return keys[starts], starts, stops


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-d numeric array, ascending: ``np.unique(values)`` by a sort
    and a comparison of neighbours.  numpy 2.4's ``np.unique`` hashes first and then sorts
    the distinct values: for 58K ``int64`` sellers of a q8 window (a few arrays each already
    distinct) it took 6.3-6.9 ms where this takes 0.5 ms.  (``group_slices(np.sort(values))[0]``
    gives the same values at twice the cost, 1.2 ms: it also finds each run's bounds.)"""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


_NO_HASHES = np.zeros(0, dtype=np.uint64)

PART = "part"
"""Column telling which part of a ``ColumnarState`` a row of an exported table belongs to."""
SIZE_ROWS = 10_000
"""Most rows a ``ColumnarState`` weighs per bin for a rescale (``bin_bytes``)."""


def key_hashes(table: pa.Table, column: str) -> np.ndarray:
    """Stable routing hash (uint64) per row of ``table``'s key ``column``: what
    ``Exchange(column=column)`` routes the row by (``column_hashes``)."""
    return column_hashes(table.column(column))


HASH_GROUP = 1 << 16
"""Rows ``ChunkBins`` hashes in one call (about a millisecond): chunks are hashed together up
to it, so a state of many small chunks pays few calls, and ``warm`` checks its deadline
between groups."""


MERGE_ROWS = 4096
"""Chunks below this many rows that a take cuts are merged with their small neighbours first
(``ChunkBins.split``): two cuts of a chunk cost tens of microseconds whatever its size, a copy
of its rows a few nanoseconds each, so for small chunks one copy and two cuts of the run is
the cheaper; a larger chunk (a window's compacted rows) is cut on its own, without the copy."""


SLICE_ROWS = 8
"""Fewest rows a chunk whose bins ascend needs for ``ChunkBins.split`` to cut it into slices;
a smaller one is cut as any other (merged with its small neighbours first when several have
rows to take): its cuts cost more than copying its rows.  Alone on a core, a take from a
q8 state of ten 1-row person batches and 23 seller arrays of 2 took 1.05 ms warm with every
ascending chunk sliced, 0.73-0.78 ms with these merged.  Eight rows of random bins among
hundreds ascend by chance about once in 40,000 (1 in 8!), so from 8 rows up only chunks ordered on purpose are
sliced: a window's compacted chunks and the pieces a take leaves of them.  Those pieces are
often short (the rows of the few bins above a taken one), and a fluid migration's next take
touches them again; with 64 here they were cut by masks, 35 chunks a take (paced q8 fluid,
35 s, 149 one-bin takes: the per-chunk loop's p90 1.6 ms with 64, 0.7-0.9 ms with 8)."""

SLICE_RUNS = 8
"""Most runs of bins a take may hold for ``ChunkBins.split`` to cut a bin-sorted chunk into
slices (a rebalanced routing table moves two or three); more, and it is cut by a mask."""


class ChunkBins:
    """The bin of every row of a columnar state's key chunks, computed once per chunk.

    A ``ColumnarState`` holds its rows in chunks it replaces but never changes in place (numpy
    arrays, record batches).  Migrations take bins out again and again (fluid: a one-bin step
    after another), and hashing every held key at every take made each cost as much as taking
    everything.  Here a chunk's keys are hashed once, ahead of a step (``prepare_take``) or at
    the first take that sees it, and the bins kept for later takes: a take then costs one
    gather of the held rows' bins (``member[bins]``) plus the work on the rows it takes.  What
    a take keeps of a chunk is a new chunk: ``put`` hands it the kept rows' bins, so it is not
    hashed again.  A chunk a state orders by bin when it compacts (``sort_by_bin``) is cut
    without a pass over its rows: a rebalanced routing table moves two or three runs of
    bins, and such a chunk gives up each run as a slice and keeps the rows between as slices
    (q8 persons of a third of the bins, 205K rows in 16 chunks, alone on one core: 3.7-4.1 ms
    by masks, 0.2 ms by slices; ordering the 16 chunks once cost 3.1 ms).

    Entries are keyed by the chunk's identity and dropped when the chunk is freed (a weak
    reference), so bins of chunks the state let go take no memory; the memo is not state (it
    is not pickled: a copy starts empty).  Bins are ``uint16`` (``MAX_BINS``).
    """

    __slots__ = ("_memo", "__weakref__")

    def __init__(self) -> None:
        self._memo: dict[int, tuple[weakref.ref[Any], int, np.ndarray, bool]] = {}

    def lookup(self, chunks: Sequence[Any], keys: Callable[[Any], pa.Array | np.ndarray],
               bins: int, deadline: float | None = None) -> list[np.ndarray | None]:
        """The bins (``uint16``, one per row) of each of ``chunks`` among ``bins`` bins, as
        ``Exchange(column=)`` hashes its key column ``keys(chunk)`` (an int64 numpy array or
        an Arrow array).  Chunks not seen before are hashed together, in groups of
        ``HASH_GROUP`` rows; with a ``deadline`` (``time.perf_counter()`` seconds) no group is
        started after it, and the chunks left are None (``warm`` uses this)."""
        memo = self._memo
        found: list[np.ndarray | None] = [None] * len(chunks)
        missing: list[int] = []
        for i, chunk in enumerate(chunks):
            entry = memo.get(id(chunk))
            if entry is not None and entry[0]() is chunk and entry[1] == bins:
                found[i] = entry[2]
            else:
                missing.append(i)
        at = 0
        while at < len(missing):
            if deadline is not None and time.perf_counter() >= deadline:
                break
            group: list[int] = []
            arrays: list[Any] = []
            rows = 0
            while at < len(missing) and (not group or rows < HASH_GROUP):
                arrays.append(keys(chunks[missing[at]]))
                rows += len(arrays[-1])
                group.append(missing[at])
                at += 1
            if all(isinstance(x, np.ndarray) for x in arrays):
                joined: Any = pa.array(np.concatenate(arrays))
            else:
                joined = pa.concat_arrays([pa.array(x) if isinstance(x, np.ndarray) else x
                                           for x in arrays])
            every = self.of_keys(joined, bins)
            offsets = np.cumsum([0, *map(len, arrays)]).tolist()
            for i, lo, hi in zip(group, offsets, offsets[1:], strict=False):
                found[i] = every[lo:hi]
                self.put(chunks[i], every[lo:hi], bins)
        return found

    def split(self, groups: Mapping[Any, Sequence[Any]], memo: Callable[[Any], Any],
              keys: Callable[[Any], pa.Array | np.ndarray], member: np.ndarray,
              cut: Callable[[Any, np.ndarray], Any],
              merge: Callable[[list[Any]], Any] | None = None,
              piece: Callable[[Any, int, int], Any] | None = None,
              reorder: Callable[[Any, np.ndarray], Any] | None = None,
              ) -> tuple[dict[Any, list[Any]], dict[Any, list[Any]]]:
        """Split the chunks of ``groups`` (e.g. per window end) by the bins in ``member`` (bool
        per bin): ``(taken, kept)``, per group, the rows of those bins (``cut(chunk, mask)`` of
        each chunk holding some, in chunk order) and the chunks that stay (untouched ones as
        they are, the others cut to their remaining rows, with those rows' bins remembered);
        a group left without chunks is absent from ``kept``.  ``memo(chunk)`` is the object
        its bins are remembered by (the chunk itself, or its key array when the chunk is a
        tuple, which takes no weak reference) and ``keys(memo(chunk))`` its key column.

        One gather over all the held rows' bins and one ``logical_or.reduceat`` find the
        chunks with rows to take, so the per-chunk work is for those only.  With ``merge``
        (one chunk of the rows of several, in their order), a run of consecutive chunks under
        ``MERGE_ROWS`` rows of which several have rows to take is merged first and cut once
        each way: a chunk of a few hundred keys holds a row of nearly every bin, so a take of
        even one bin touches all of them; what stays of the run is then one chunk (with its
        rows' bins), which the next take (a fluid migration's next step) finds whole.  With
        ``piece`` (``piece(chunk, lo, hi)``: its rows ``[lo, hi)``, zero-copy) a chunk whose
        bins ascend (``sort_by_bin``) gives up and keeps its rows as slices when ``member``
        holds at most ``SLICE_RUNS`` runs of bins (``RoutingTable.rebalanced`` moves two or
        three): no pass over its rows.  With ``reorder`` (``reorder(chunk, order)``: its rows
        in ``order``) a merged run is first put in the order of its rows' bins (stable: rows
        of one bin keep their order), so what stays of it ascends and the next takes cut it
        into slices: a fluid migration's one-bin steps otherwise filtered each window's
        merged chunk both ways, step after step."""
        runs: tuple[np.ndarray, np.ndarray] | None = None
        if piece is not None:
            edges = np.flatnonzero(np.diff(np.r_[0, member.astype(np.int8), 0]))
            if len(edges) <= 2 * SLICE_RUNS:
                runs = edges[0::2], edges[1::2]
        chunks = [c for cs in groups.values() for c in cs]
        objects = [memo(c) for c in chunks]
        found = self.lookup(objects, keys, len(member))
        # a chunk whose bins ascend is cut into slices (never merged): its rows in the runs
        # are found by binary searches, the others' by one gather over their rows' bins
        cuts: dict[int, tuple[list[int], list[int]]] = {}
        if runs is not None:
            edges = np.concatenate(runs)
            past = edges > np.iinfo(np.uint16).max  # a stop at MAX_BINS: the chunk's end
            small = edges.clip(max=np.iinfo(np.uint16).max).astype(np.uint16)  # as stored
            for i, obj in enumerate(objects):
                f: np.ndarray = found[i]  # type: ignore[assignment]
                if len(f) >= SLICE_ROWS and self.ascending(obj):
                    at = np.searchsorted(f, small)
                    at[past] = len(f)
                    cuts[i] = (at[:len(runs[0])].tolist(), at[len(runs[0]):].tolist())
        gathered = [np.zeros(0, np.uint16) if i in cuts else f for i, f in enumerate(found)]
        hit = member[np.concatenate([np.zeros(0, np.uint16), *gathered])]  # type: ignore[list-item]
        offsets = np.cumsum([0, *(len(f) for f in gathered)])  # type: ignore[arg-type]
        sizes = np.diff(offsets)
        starts = offsets[:-1][sizes > 0]  # reduceat needs non-empty segments
        any_hit = np.logical_or.reduceat(hit, starts) if len(starts) else hit[:0]
        touched = set(np.flatnonzero(sizes > 0)[any_hit].tolist())
        sliced = {i for i, (lo, hi) in cuts.items()
                  if any(b > a for a, b in zip(lo, hi, strict=True))}
        touched |= sliced
        taken: dict[Any, list[Any]] = {}
        kept: dict[Any, list[Any]] = {}
        at = 0
        for group, members in groups.items():
            staying: list[Any] = []
            first, at = at, at + len(members)
            for lo, hi in self._runs(found, touched, cuts.keys(), first, at, merge is not None):
                ordered: bool | None = None  # (None: put finds out)
                if hi - lo > 1:  # consecutive small chunks, several cut: one copy, one cut
                    chunk = merge(list(members[lo - first:hi - first]))  # type: ignore[misc]
                    seg = hit[offsets[lo]:offsets[hi]]
                    bins: np.ndarray = np.concatenate(found[lo:hi])  # type: ignore[arg-type]
                    if reorder is not None:
                        order = np.argsort(bins, kind="stable")
                        chunk, seg, bins, ordered = reorder(chunk, order), seg[order], \
                            bins[order], True
                elif lo in touched:
                    chunk = members[lo - first]
                    if lo in sliced:
                        self._slice(chunk, found[lo], cuts[lo], memo, piece, len(member),  # type: ignore[arg-type]
                                    taken.setdefault(group, []), staying)
                        continue
                    seg = hit[offsets[lo]:offsets[hi]]
                    bins = found[lo]  # type: ignore[assignment]
                else:
                    staying.append(members[lo - first])
                    continue
                taken.setdefault(group, []).append(cut(chunk, seg))
                self.put(memo(taken[group][-1]), bins[seg], len(member), ordered)
                if not seg.all():
                    stay = ~seg
                    staying.append(cut(chunk, stay))
                    self.put(memo(staying[-1]), bins[stay], len(member), ordered)
            if staying:
                kept[group] = staying
        return taken, kept

    def _slice(self, chunk: Any, bins: np.ndarray, rows: tuple[list[int], list[int]],
               memo: Callable[[Any], Any], piece: Callable[[Any, int, int], Any], size: int,
               taken: list[Any], staying: list[Any]) -> None:
        """Split a chunk with ascending ``bins`` by the rows ``[start, stop)`` of each run of
        bins taken (``rows``: the starts and the stops): the rows of each run go to ``taken``,
        the ones between to ``staying``, all as ``piece`` slices (their bins remembered), in
        row order."""
        n = len(bins)
        starts, stops = rows
        at = 0
        for lo, hi in zip(starts, stops, strict=True):
            if hi <= lo:
                continue
            if lo > at:
                staying.append(piece(chunk, at, lo))
                self.put(memo(staying[-1]), bins[at:lo], size, True)
            taken.append(chunk if lo == 0 and hi == n else piece(chunk, lo, hi))
            self.put(memo(taken[-1]), bins[lo:hi], size, True)
            at = hi
        if at < n:
            staying.append(piece(chunk, at, n))
            self.put(memo(staying[-1]), bins[at:n], size, True)

    @staticmethod
    def _runs(found: Sequence[np.ndarray | None], touched: set[int], sliced: Collection[int],
              first: int, end: int, merging: bool) -> list[tuple[int, int]]:
        """The chunks ``[first, end)`` of one group as ranges ``[lo, hi)``: a range of several
        is a run of consecutive chunks under ``MERGE_ROWS`` rows, none of them ``sliced`` (cut
        by binary searches, if at all), of which more than one has rows to take (merged, then
        cut once each way); every other chunk is a range of its own."""
        ranges: list[tuple[int, int]] = []
        lo = first
        for i in range(first, end + 1):
            small = (i < end and merging and i not in sliced
                     and len(found[i]) < MERGE_ROWS)  # type: ignore[arg-type]
            if small:
                continue
            if sum(j in touched for j in range(lo, i)) > 1:
                ranges.append((lo, i))
            else:
                ranges.extend((j, j + 1) for j in range(lo, i))
            if i < end:
                ranges.append((i, i + 1))
            lo = i + 1
        return ranges

    @staticmethod
    def of_keys(keys: pa.Array | np.ndarray, bins: int) -> np.ndarray:
        """The bin (``uint16``, one per key) of each of ``keys`` among ``bins`` bins, as
        ``Exchange(column=)`` routes it; not remembered (``put`` does that).  An int64 numpy
        array is hashed as ``column_hashes`` hashes it, without the trip through Arrow."""
        if isinstance(keys, np.ndarray) and keys.dtype == np.int64:
            hashes = hash_ints(keys)
        else:
            hashes = column_hashes(keys if isinstance(keys, pa.Array) else pa.array(keys))
        return bins_of(hashes, bins).astype(np.uint16)

    def warm(self, chunks: Sequence[Any], keys: Callable[[Any], pa.Array | np.ndarray],
             bins: int, deadline: float) -> bool:
        """Hash the chunks not seen yet until ``deadline``; True when none is left."""
        return all(b is not None for b in self.lookup(chunks, keys, bins, deadline))

    def put(self, chunk: Any, found: np.ndarray, bins: int, ascending: bool | None = None) -> None:
        """Remember ``found`` (one per row) as the bins of ``chunk``'s keys among ``bins``,
        and whether they ascend (None: find out)."""
        key = id(chunk)
        memo = self._memo
        if ascending is None:
            ascending = len(found) < 2 or bool((found[1:] >= found[:-1]).all())
        memo[key] = (weakref.ref(chunk, lambda _: memo.pop(key, None)), bins, found, ascending)

    def ascending(self, chunk: Any) -> bool:
        """Whether ``chunk``'s remembered bins ascend (False when none are remembered)."""
        entry = self._memo.get(id(chunk))
        return entry is not None and entry[0]() is chunk and entry[3]

    def sort_by_bin(self, chunk: Any, memo: Callable[[Any], Any],
                    keys: Callable[[Any], pa.Array | np.ndarray], bins: int,
                    reorder: Callable[[Any, np.ndarray], Any]) -> Any:
        """``chunk`` with its rows in the order of their bins among ``bins`` (stable:
        rows of one bin keep their order), its bins remembered; ``reorder(chunk, order)``
        takes its rows in ``order``.  A take of a run of bins then cuts such a chunk into
        slices (``split``)."""
        found = self.lookup([memo(chunk)], keys, bins)[0]
        assert found is not None
        if self.ascending(memo(chunk)):
            return chunk
        order = np.argsort(found, kind="stable")
        ordered = reorder(chunk, order)
        self.put(memo(ordered), found[order], bins, True)
        return ordered

    def __reduce__(self) -> tuple[type[ChunkBins], tuple[()]]:
        return ChunkBins, ()  # a copy (pickle, deepcopy) starts empty


class Taken(NamedTuple):
    """One part's rows taken out of a ``ColumnarState`` (``ColumnarState.take_rows``)."""

    rows: pa.Table
    """The taken rows: the columns ``rows()`` gives the part, in the order it gives them."""
    hashes: np.ndarray | None
    """Their key hashes (uint64, one per row), or None for worker-local rows (or when
    ``bins`` is given)."""
    held: bool
    """The part held rows before the take (``export`` then concatenates it, even when none of
    its rows were taken: its columns are in every exported table)."""
    bins: np.ndarray | None = None
    """The bin of each row among the state's ``bins`` (one per row, any integer dtype) when
    the state knows them (``ChunkBins``): the take then does not hash the rows again."""


class ColumnarState(BinnedState):
    """A query operator's state whose rows are Arrow tables, exported per bin of their key.

    A subclass with several kinds of rows (e.g. persons and waiting auctions) lists each kind's
    columns in ``PARTS``; it implements ``rows`` (each part as a table with the stable hash of
    its key per row: the hash its input exchange routes that key by; None for worker-local
    rows), ``add_rows`` (add loaded rows of a part: the rows of several bins and old workers,
    any order; a single part gets the table as exported), ``clear`` and ``take_rows``.

    ``export`` concatenates the parts (a ``PART`` column tells them apart when there are
    several; missing columns are null), computes every row's bin from its hash (one
    ``bins_of``) and splits the table by bin (one ``split_by_bin``); worker-local rows go
    whole to the home bin.  ``load`` concatenates the loaded tables and hands each part's rows
    to ``add_rows`` once.  ``take`` (and ``discard``) removes the rows of some bins with
    ``take_rows``: one vectorized pass over the keys (hash, bin, mask) and a filter, then the
    taken rows alone are assembled and split as ``export`` does.  A subclass whose
    ``take_rows`` reuses its keys' bins between takes (``ChunkBins``; q5's ``WindowCounts``,
    q8's ``WindowState``) implements ``prepare_take``: the router hashes its keys while a
    step waits, and a take then costs a gather over the held rows' bins and the work on the
    rows it takes (a q5 state of 193K rows in 144 partials, alone on one core: a one-bin
    take 4.6-7.7 ms median hashing every key, 3.8-5.9 ms with the bins memoized).

    A migration step takes with ``take_to`` (one table per new owner, not one per bin: a
    q5 step of 1,365 bins, alone on one core, went from 15-29 ms of take plus 1.3-18 ms of
    pickling and 4.4-4.8 ms of unpickling and loading to 13-22, 0.8-1.4 and 1.4-2.6 ms).

    ``take_per_bin`` is False here: a step is taken in one call, since a take that hashes
    every held key would pay that pass once per slice.  A subclass whose takes cost about
    their share of the state (its bins memoized, cut by binary searches) and whose one-call
    takes are long sets it True (q5's ``WindowCounts``), and a step leaves in slices of
    about ``SLICE_SECONDS``, each still one table per new owner (``take_to``).  Slices come
    a worker step apart, so a sliced step's window is longer: q8's ``WindowState``, whose
    one-call takes of a third of the bins run 2-4 ms at half load, stays False.  Tried when
    takes hashed every key (``benchmarks/rescale_latency.py`` at half load), slices were
    worse: a step's window grew from 38-58 ms to 89-131 ms (q5 all-at-once) and q8
    all-at-once's migration p99 to 377 ms.
    """

    PARTS: ClassVar[tuple[tuple[str, ...], ...]] = ()
    take_per_bin: ClassVar[bool] = False  # a take hashes all keys unless a subclass memoizes

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        """Per part (in ``PARTS`` order): its rows (at least its ``PARTS`` columns) and the
        key hash per row (uint64; None: worker-local rows, exported under the home bin).
        Values the state does not change afterwards (copy an array it updates in place):
        ``export_later`` splits them by bin on a checkpoint's writer thread."""
        raise NotImplementedError

    def add_rows(self, part: int, table: pa.Table) -> None:
        """Add loaded rows (the columns of ``PARTS[part]``) of part ``part``."""
        raise NotImplementedError

    def clear(self) -> None:
        """Forget every row."""
        raise NotImplementedError

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the rows whose key's bin ``b`` has ``member[b]`` (a bool array of length
        ``bins or 1``) and return them per part (in ``PARTS`` order): exactly the rows, columns
        and row order ``rows()`` gives those bins, so that ``take`` returns what ``export``
        did.  Worker-local rows go all or none: by ``member[home_bin]``.  The rows kept must
        export as before, row for row."""
        raise NotImplementedError

    def in_bins(self, hashes: np.ndarray, member: np.ndarray) -> np.ndarray:
        """Mask (bool per row) of the key ``hashes`` (uint64) whose bin is a member."""
        return member[bins_of(hashes, len(member))]

    def local_member(self, member: np.ndarray) -> bool:
        """Whether worker-local rows (exported under the home bin) are among ``member``."""
        return 0 <= self.home_bin < len(member) and bool(member[self.home_bin])

    def held_rows(self) -> int | None:
        """About how many rows the state holds (cheap: no table built), or None when it
        cannot tell; ``bin_bytes`` weighs the state only up to ``SIZE_ROWS``."""
        return None

    def bin_bytes(self) -> np.ndarray | None:
        """Rows per bin, over all parts, times the parts' mean bytes per row (their
        ``pa.Table.nbytes`` over their rows; worker-local rows under the home bin), from
        ``rows()`` and one ``bins_of`` over their hashes.  One mean for all parts: ``export``
        puts the parts' rows in one table with the union of their columns (a part's missing
        columns null), so a row weighs about the same whichever part it comes from.  None
        above ``SIZE_ROWS`` held rows (``held_rows``): ``rows()`` builds the parts' tables
        (q5's sums its windows: 20-30 ms for 180,000 rows; q8's 20,000 rows took 4 ms),
        longer than a worker may be held, and at that size the bins' counts alone move within
        a few tenths of a percent of their share of the rows (the standard deviation of a
        quarter of the bins' share of N equal rows is ``sqrt(0.1875 / N)``: 0.004 at
        10,000)."""
        held = self.held_rows()
        if held is not None and held > SIZE_ROWS:
            return None
        size = self.bins or 1
        rows = np.zeros(size)
        nbytes = 0
        for table, hashes in self.rows():
            if table.num_rows == 0:
                continue
            nbytes += table.nbytes
            if hashes is None:
                rows[min(max(self.home_bin, 0), size - 1)] += table.num_rows
            else:
                rows += np.bincount(bins_of(hashes, size), minlength=size)
        total = rows.sum()
        return rows * (nbytes / total) if total else rows

    def export(self, bins: Iterable[int] | None = None) -> Mapping[int, pa.Table]:
        return self.export_later(bins)()

    def export_later(self, bins: Iterable[int] | None = None) -> Callable[[], Mapping[int, pa.Table]]:
        """Gathers ``rows()`` now; the split by bin (``split_by_bin``: one sort and one take
        into a ``BinSplit``, about 1.5 ms for a synthetic q5-like part of 13,000 rows in 3,917
        bins, where a table per bin cost 5.5 ms) runs when called."""
        parts = [Taken(t, h, t.num_rows > 0) for t, h in self.rows()]
        wanted = None if bins is None else list(bins)
        size, home = self.bins or 1, self.home_bin
        return lambda: self._split(parts, wanted, size, home)

    def _split(self, parts: Sequence[Taken], bins: Iterable[int] | None, size: int,
               home: int) -> Mapping[int, pa.Table]:
        """The rows of ``parts`` per bin of ``size`` bins, worker-local rows under ``home``,
        as ``export`` returns them (parts not ``held`` are left out of the concatenation)."""
        table, row_bins = self._assembled(parts, size)
        if table is None:
            return {}
        if row_bins is None:
            if bins is not None and home not in set(bins):
                return {}
            return {home: table}
        # one chunk per column: a take from many chunks (parts, windows) costs per chunk
        return split_by_bin(table.combine_chunks(), row_bins, bins)

    def _assembled(self, parts: Sequence[Taken], size: int,
                   ) -> tuple[pa.Table | None, np.ndarray | None]:
        """The rows of the ``held`` parts as one table (a ``PART`` column when there are
        several) and each row's bin among ``size`` bins (from the parts' ``bins``, else their
        hashes; None: worker-local rows); (None, None) when no row."""
        tables: list[pa.Table] = []
        row_bins: list[np.ndarray] = []
        local = False
        tagged = len(parts) > 1
        for i, (table, h, held, known) in enumerate(parts):
            if not held:
                continue
            if tagged:
                table = table.append_column(PART, pa.array(np.full(table.num_rows, i, np.int8)))
            tables.append(table)
            if known is not None:
                row_bins.append(known)
            elif h is None:
                local = True
            else:
                row_bins.append(bins_of(h, size))
        if not tables:
            return None, None
        table = tables[0] if len(tables) == 1 else \
            pa.concat_tables(tables, promote_options="default")
        if table.num_rows == 0:
            return None, None
        return table, None if local else np.concatenate(row_bins)

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        tables = [parts[b] for b in sorted(parts) if parts[b].num_rows]
        if not tables:
            return
        table = tables[0] if len(tables) == 1 else \
            pa.concat_tables(tables, promote_options="default")
        # one chunk per column: a migration step loads hundreds of bins (one chunk each), and
        # the filters, casts and takes below cost per chunk
        table = table.combine_chunks()
        if PART not in table.column_names:
            self.add_rows(0, table)
            return
        # each exported table holds its parts in runs (part 0's rows, then part 1's): slice
        # the runs, where a filter per part copied every row (7 of 11 ms of a q8 load)
        tags, starts, stops = group_slices(int_column(table, PART))
        runs: dict[int, list[pa.Table]] = {}
        for tag, lo, hi in zip(tags.tolist(), starts.tolist(), stops.tolist(), strict=True):
            runs.setdefault(tag, []).append(table.slice(lo, hi - lo))
        for i, columns in enumerate(self.PARTS):
            if i in runs:
                mine = runs[i][0] if len(runs[i]) == 1 else pa.concat_tables(runs[i])
                self.add_rows(i, mine.select(list(columns)))

    def discard(self, bins: Iterable[int]) -> None:
        self.take(bins)

    def take_to(self, bins: np.ndarray, owners: np.ndarray) -> dict[int, pa.Table]:
        """The state of ``bins`` (integer array), no longer held here, as one table per new
        owner (``owners[i]`` receives ``bins[i]``; an integer array of the same length): the
        rows of all the bins that go to a worker, in this state's row order (``load`` takes
        rows of any bins, so a migration step need not split them by bin).  Same rows as
        ``take(bins)`` grouped by worker; the cost of ``take`` without its split into one
        table per bin (a step of 1,365 of 4,096 bins: 1,365 tables to build, pickle and
        concatenate again on the new owner).  Bins outside ``[0, bins)`` are ignored.

        Raises:
            ValueError: ``bins`` and ``owners`` of different lengths.
        """
        bins = np.asarray(bins, dtype=np.int64)
        owners = np.asarray(owners, dtype=np.int64)
        if len(bins) != len(owners):
            raise ValueError(f"take_to: {len(bins)} bins but {len(owners)} new owners")
        size = self.bins or 1
        owner = np.full(size, -1, dtype=np.int64)
        inside = (bins >= 0) & (bins < size)
        owner[bins[inside]] = owners[inside]
        member = owner >= 0
        if not member.any():
            return {}
        table, row_bins = self._assembled(self.take_rows(member), size)
        if table is None:
            return {}
        if row_bins is None:  # worker-local rows: whole, to the home bin's new owner
            return {int(owner[self.home_bin]): table}
        owners_taken = owner[member]
        if (owners_taken == owners_taken[0]).all():  # one new owner: no pass over the rows
            return {int(owners_taken[0]): table}
        dest = owner[row_bins]
        workers = np.flatnonzero(np.bincount(dest))
        return {int(w): table.filter(pa.array(dest == w)) for w in workers.tolist()}

    def take(self, bins: Iterable[int]) -> Mapping[int, pa.Table]:
        """``export(bins)`` then ``discard(bins)``: the state of ``bins`` (one table per
        non-empty bin, as ``export(bins)`` returns it), no longer held here.

        Cost: one vectorized pass over the state's keys (hash, bin, membership mask) and one
        filter of its arrays (``take_rows``), then the taken rows alone are concatenated and
        split by bin; the rows kept are not rebuilt.  Bins outside ``[0, bins)`` are ignored.
        """
        member = np.zeros(self.bins or 1, dtype=bool)
        wanted = np.fromiter(bins, dtype=np.int64)
        member[wanted[(wanted >= 0) & (wanted < len(member))]] = True
        if not member.any():
            return {}
        return self._split(self.take_rows(member), None, self.bins or 1, self.home_bin)


class WindowMaxState(ColumnarState):
    """Per open window, the rows with the largest ``value`` seen so far (ties all kept).

    State (plain, snapshot-able): ``windows: dict[window_end_ms, (max_value, [pa.Table])]``.
    Tokens are not state: the operator holds one per key of ``windows`` (see ``pending_times``).

    As a ``BinnedState``: the rows (``schema``) of every window, exported per bin of the
    ``key`` column (the column the operator's input is exchanged by, e.g. ``window_start``),
    or whole under the home bin when ``key`` is None (a pipeline operator: worker-local).
    Loading adds the rows with ``add``: per window the largest maximum wins, equal maxima
    keep all their rows, so the parts of several old workers merge into their joint maximum.
    """

    def __init__(self, value: str, schema: pa.Schema, key: str | None = None) -> None:
        self.value = value
        self.schema = schema
        self.key = key
        self.windows: dict[int, tuple[int, list[pa.Table]]] = {}

    def held_rows(self) -> int:
        return sum(t.num_rows for _, parts in self.windows.values() for t in parts)

    def rows(self) -> list[tuple[pa.Table, np.ndarray | None]]:
        table = concat([t for _, parts in self.windows.values() for t in parts], self.schema)
        return [(table, None if self.key is None else key_hashes(table, self.key))]

    def add_rows(self, part: int, table: pa.Table) -> None:
        self.add(table.select(self.schema.names).cast(self.schema))

    def take_rows(self, member: np.ndarray) -> list[Taken]:
        """Remove the rows of ``member`` bins: one hash of the key column over every held
        row, one filter for the taken rows and one per held part with rows taken; a window
        left without rows is forgotten (its token is released).  Worker-local (``key`` None):
        everything when the home bin is a member, else nothing."""
        parts = [t for _, kept in self.windows.values() for t in kept]
        held = any(t.num_rows for t in parts)
        if not held or (self.key is None and not self.local_member(member)):
            return [Taken(self.schema.empty_table(), None if self.key is None else _NO_HASHES,
                          held)]
        table = concat(parts, self.schema)
        if self.key is None:
            self.windows = {}
            return [Taken(table, None, True)]
        hashes = key_hashes(table, self.key)
        mask = self.in_bins(hashes, member)
        if not mask.any():
            return [Taken(table.slice(0, 0), _NO_HASHES, True)]
        at = 0
        for end, (best, kept) in list(self.windows.items()):
            left: list[pa.Table] = []
            for t in kept:
                seg = mask[at:at + t.num_rows]
                at += t.num_rows
                if not seg.any():
                    left.append(t)
                elif not seg.all():
                    left.append(t.filter(pa.array(~seg)))
            if any(t.num_rows for t in left):
                self.windows[end] = (best, left)
            else:
                del self.windows[end]
        return [Taken(table.filter(pa.array(mask)), hashes[mask], True)]

    def clear(self) -> None:
        self.windows = {}

    def add(self, table: pa.Table) -> None:
        """Merge rows (columns of ``schema``, including ``window_end`` and ``value``).

        Vectorized: sort by window end, one max per window (``np.maximum.reduceat``), keep the
        rows equal to their window's max; then per window present (a few per batch) compare
        with the held max: larger replaces, equal appends, smaller is ignored.
        """
        if table.num_rows == 0:
            return
        ends = int_column(table, "window_end")
        order = np.argsort(ends, kind="stable")
        ends = ends[order]
        values = int_column(table, self.value)[order]
        keys, starts, stops = group_slices(ends)
        maxima = np.maximum.reduceat(values, starts)
        counts = stops - starts
        keep = values == np.repeat(maxima, counts)
        kept_order = order[keep]
        kept_ends = ends[keep]
        kept = table.take(pa.array(kept_order))
        _, kstarts, kstops = group_slices(kept_ends)
        for end, best, lo, hi in zip(keys.tolist(), maxima.tolist(), kstarts.tolist(),
                                     kstops.tolist(), strict=True):
            part = kept.slice(lo, hi - lo)
            held = self.windows.get(end)
            if held is None or best > held[0]:
                self.windows[end] = (best, [part])
            elif best == held[0]:
                held[1].append(part)

    def retire(self, bound: int | None, inclusive: bool) -> list[tuple[int, pa.Table]]:
        """Remove and return ``(end, rows)`` of the windows ``bound`` has passed, by end."""
        done = sorted(end for end in self.windows if passed(bound, end, inclusive))
        return [(end, concat(self.windows.pop(end)[1], self.schema)) for end in done]

    def pending_times(self) -> list[int]:
        """Window ends that need a token (one per open window)."""
        return sorted(self.windows)

    def snapshot(self) -> dict[str, Any]:
        """``{"value", "windows": {end: (max, pa.Table)}}`` (Arrow tables are immutable)."""
        return {"value": self.value,
                "windows": {end: (best, concat(parts, self.schema))
                            for end, (best, parts) in self.windows.items()}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the state by a ``snapshot()`` result."""
        self.value = snapshot["value"]
        self.windows = {int(end): (int(best), [table])
                        for end, (best, table) in snapshot["windows"].items()}


def window_max(stream: Stream, pact: Any, value: str, schema: pa.Schema, inclusive: bool,
               prepare: Callable[[pa.Table], pa.Table] | None = None,
               name: str = "WindowMax", elastic: Elastic | None = None) -> Stream:
    """Per window, the rows whose ``value`` is the window's maximum (ties all kept).

    Input: Arrow batches; ``prepare(table)`` (vectorized, optional) turns the batches received
    in one invocation into rows of ``schema``, which must contain ``window_start``,
    ``window_end`` (ms) and ``value``.  Output: one RecordBatch of ``schema`` per window, at time
    ``window_end``, once the input frontier has passed the window (``passed(..., inclusive)``).

    Tokens (paper §5): the initial token is dropped; one ``Capability`` per open window, minted
    at its end from the least message ref of the invocation that opened it, used to send the
    window's rows and dropped when it is retired.  Windows are retired in order of their ends,
    many per invocation when the frontier jumps.

    State: ``"windows"``, a ``WindowMaxState`` keyed by the exchange's column (``pact`` an
    ``Exchange(column=...)``), or worker-local for any other pact; restored from a snapshot, it
    gets its tokens from the initial token (one per ``pending_times()``).

    ``elastic`` (with an ``Exchange(column=...)`` pact): a migrating operator whose bins move
    between workers while the job runs (``tokenflow.rescale.migrate.keyed_operator``).

    Raises:
        ValueError: ``pact`` is an ``Exchange`` without a ``column`` (rows are Arrow), or
            ``elastic`` with another pact.
        CapabilityError: when a row's ``window_end`` is before its message's time (it cannot
            be sent at its end).
    """
    key: str | None = None
    if isinstance(pact, Exchange):
        if pact.column is None:
            raise ValueError(f"operator {name!r}: window_max exchanges Arrow rows by a column; "
                             "use Exchange(column=...)")
        key = pact.column
    elif elastic is not None:
        raise ValueError(f"operator {name!r}: only an exchanged window_max can migrate")

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        held = info.state("windows", WindowMaxState(value, schema, key))
        tokens = WindowTokens(capability, held.pending_times())
        migrates(info, tokens)
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            batches, least = drain(input)
            if batches and least is not None:
                table = concat(batches)
                if prepare is not None:
                    table = prepare(table)
                held.add(table)
                tokens.mint(least, held.windows)
            for end, rows in held.retire(frontier_bound(input.frontier), inclusive):
                cap = tokens.pop(end)
                if rows.num_rows:
                    output.give_batch(cap, to_batch(rows, schema))
                cap.drop()

        return logic

    if key is not None:
        return keyed_operator([stream], [key], name, constructor, elastic)
    return unary_frontier(stream, pact, name, constructor)


__all__ = ["PART", "ColumnarState", "Taken", "WindowMaxState", "WindowTokens", "coalesce", "concat", "drain",
           "frontier_bound", "group_slices", "int_column", "key_hashes", "passed", "to_batch",
           "window_max"]
