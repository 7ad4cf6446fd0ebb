"""Operator state the system can snapshot, restore and move: state kept per bin.

Source: Megaphone (Hoffmann et al., VLDB 2019: operator state is partitioned into bins that a
routing table assigns to workers, so a bin's state can move at a logical time); the
distributed-DBSP design, "Fault tolerance" (state checkpointed per worker) and "Scaling state"
(fixed sharding); Selvatici, *Rescaling of Timely Dataflow* §4.2 (stateful operators keep
their state per bin).

A stateful operator declares its state with ``OperatorBuilder.state(name, state)``; the worker
then knows it by a key that is the same on every run of the same dataflow (dataflow name,
operator path and name, state name), can export it per bin for a snapshot, and loads the bins
it owns when a job is restored — at any worker count, since a key's bin does not depend on W.

``BinnedState`` is the protocol.  Three implementations cover the project's operators:

* ``KeyedState``: a ``dict`` from key to value (any picklable Python objects); a key's bin is
  the top bits of its stable routing hash, the hash the exchange pact routes by, so the keys a
  worker holds are exactly those of the bins it owns.  Bins are computed only when exporting.
* ``LocalState``: state of a worker rather than of keys (e.g. a pipeline operator's buffer);
  exported under the *home bin* of the worker (the least bin it owns) and loaded by the worker
  that owns that bin after a restore, which may merge several such parts.
* query-specific classes (``tokenflow.nexmark.queries``) holding columnar state implement the
  protocol directly, splitting their Arrow/numpy rows by the bin of their key column
  (``split_by_bin``).

Each also reports ``pending_times()``: the times of pending work for which its operator holds
tokens, so an operator restoring the state re-mints exactly those tokens.

**Changed bins.**  A state may record which of its bins changed (``take_changes``), so that a
checkpoint exports only those and references the others in the previous checkpoint's files
(``tokenflow.state.changes``).  ``KeyedState`` does: every key read or written through it (or
through its ``data`` dict) since the last capture counts as changed, so a value mutated in
place after being read is caught.  The other states do not track (``take_changes`` returns
None): a checkpoint exports them whole and the snapshot writer finds their unchanged bins by
checksum, as before.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, ClassVar, Generic, TypeVar

import cloudpickle
import numpy as np
import pyarrow as pa

from tokenflow.dataflow.routing import stable_hash
from tokenflow.state.bins import BinSplit, bins_of

K = TypeVar("K")
V = TypeVar("V")
S = TypeVar("S")

PICKLE_SCHEMA = pa.schema([("pickle", pa.binary())])
"""Layout of a bin whose state is Python objects: one row, the cloudpickled object."""
SIZE_SAMPLE = 32
"""Items a ``KeyedState`` pickles to estimate its bytes per key (``bin_bytes``)."""


def pickled(value: Any) -> pa.Table:
    """``value`` as a one-row ``PICKLE_SCHEMA`` table (cloudpickle; for the job's own storage
    only: snapshots are never read from outside the job)."""
    return pa.table({"pickle": pa.array([cloudpickle.dumps(value)], pa.binary())})


def unpickled(table: pa.Table) -> list[Any]:
    """The objects of a ``PICKLE_SCHEMA`` table, one per row.

    Raises:
        ValueError: the table has no ``pickle`` column.
    """
    if "pickle" not in table.column_names:
        raise ValueError(f"expected a pickled-state table, got columns {table.column_names}")
    return [cloudpickle.loads(v) for v in table.column("pickle").to_pylist()]


def split_by_bin(table: pa.Table, bin_of_row: np.ndarray,
                 wanted: Iterable[int] | None = None) -> BinSplit:
    """Rows of ``table`` grouped by their bin (``bin_of_row[i]`` for row ``i``): a mapping of
    each bin present (and in ``wanted``, when given) to its rows, in their order; vectorized:
    one sort and one take, no table object per bin until one is asked for (``BinSplit``).

    Raises:
        ValueError: ``bin_of_row`` does not have one entry per row.
    """
    if len(bin_of_row) != table.num_rows:
        raise ValueError(f"{len(bin_of_row)} bins for {table.num_rows} rows")
    keep = None if wanted is None else \
        np.isin(bin_of_row, np.fromiter(wanted, dtype=np.int64))
    rows = np.arange(len(bin_of_row)) if keep is None else np.flatnonzero(keep)
    if len(rows) == 0:
        none = np.zeros(0, dtype=np.int64)
        return BinSplit(table.slice(0, 0), none, none, none)
    order = rows[np.argsort(bin_of_row[rows], kind="stable")]
    sorted_bins = np.asarray(bin_of_row, dtype=np.int64)[order]
    starts = np.flatnonzero(np.r_[True, sorted_bins[1:] != sorted_bins[:-1]])
    stops = np.r_[starts[1:], len(sorted_bins)]
    return BinSplit(table.take(pa.array(order)), sorted_bins[starts], starts, stops)


def group_by_bin(items: list[Any], bin_of_item: np.ndarray,
                 wanted: Iterable[int] | None = None) -> dict[int, list[Any]]:
    """``items`` grouped by their bin (``bin_of_item[i]`` for item ``i``), keeping their order
    within a bin; only the bins in ``wanted`` when given.  (A plain dict loop: measured faster
    than a sort and slices for 500K keys, 0.13 s against 0.19 s.)"""
    keep = None if wanted is None else set(wanted)
    out: dict[int, list[Any]] = {}
    for item, b in zip(items, bin_of_item.tolist(), strict=True):
        if keep is None or b in keep:
            out.setdefault(b, []).append(item)
    return out


def key_bins(keys: list[Any] | np.ndarray, bins: int) -> np.ndarray:
    """Bin of each key (int64): ``bins_of(stable_hash(keys), bins)``, the bin the exchange
    pact routes the key by."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    return bins_of(stable_hash(keys), bins)


class KeyBins:
    """``key_bins`` of list-batch keys, memoized per distinct key: a batch of known keys costs
    one dict lookup each (2,000 Zipf words: 0.20 ms with the key extraction, against 0.54 ms
    hashing every key).  Keys that cannot be dict keys are hashed every time; the memo is
    cleared when it would pass ``capacity`` keys (as ``routing.KeyRouter``'s).

    Args:
        bins: the job's bin count.
        capacity: most keys remembered.
    """

    __slots__ = ("bins", "capacity", "_memo")

    def __init__(self, bins: int, capacity: int = 1 << 20) -> None:
        self.bins = bins
        self.capacity = capacity
        self._memo: dict[Any, int] = {}

    def __call__(self, keys: list[Any]) -> np.ndarray:
        """The bin of each of ``keys`` (int64), as ``key_bins(keys, bins)``."""
        memo = self._memo
        try:
            return np.fromiter(map(memo.__getitem__, keys), np.int64, len(keys))
        except KeyError:
            pass
        except TypeError:  # an unhashable key
            return key_bins(keys, self.bins)
        try:
            missing = list(set(keys).difference(memo))
        except TypeError:  # an unhashable key after a hashable one not seen yet
            return key_bins(keys, self.bins)
        if len(memo) + len(missing) > self.capacity:
            memo.clear()
            missing = list(set(keys))
        memo.update(zip(missing, key_bins(missing, self.bins).tolist(), strict=True))
        return np.fromiter(map(memo.__getitem__, keys), np.int64, len(keys))


class BinnedState(ABC):
    """State of one operator on one worker that can be exported and loaded per bin.

    Implementations keep whatever layout suits their operator; the system only calls the
    methods below, between invocations of the operator (never concurrently with its logic).
    """

    bins: int = 0
    """The job's bin count ``S``, set when the state is registered (``attach``)."""
    home_bin: int = 0
    """The least bin this worker owns: where worker-local state is exported."""
    take_per_bin: ClassVar[bool] = True
    """Whether taking some bins out (``take``, ``export`` + ``discard``) costs about their
    share of the state: a migration step then leaves its old owner in slices of bins
    (``tokenflow.rescale.megaphone``).  False for a state whose every take pays a costly
    pass over all its rows (a ``ColumnarState`` that hashes every held key per take), which
    a step takes in one call: per slice, that pass would be paid once per slice."""

    def attach(self, bins: int, home_bin: int) -> None:
        """Called once when the operator declares the state."""
        self.bins = bins
        self.home_bin = home_bin

    @abstractmethod
    def export(self, bins: Iterable[int] | None = None) -> Mapping[int, pa.Table]:
        """The state of ``bins`` (all held when None) as one Arrow table per non-empty bin;
        the state is not changed."""

    def export_later(self, bins: Iterable[int] | None = None) -> Callable[[], Mapping[int, pa.Table]]:
        """``export(bins)`` as of now, to be called later, possibly on another thread (a
        checkpoint's writer) while the operator goes on changing this state: a capture
        stops the worker only for what must be read now.  The default exports now and
        returns the tables; a state whose rows are values it never changes in place (Arrow
        tables, arrays it replaces) gathers them now and leaves the rest (the split into
        one table per bin) to the call (``ColumnarState``).

        Raises:
            whatever ``export`` raises (now, or when the returned function is called).
        """
        tables = self.export(bins)
        return lambda: tables

    @abstractmethod
    def load(self, parts: Mapping[int, pa.Table]) -> None:
        """Add the state of the given bins (tables as ``export`` returns them, possibly
        written by other workers of another run); called before the operator first runs."""

    def discard(self, bins: Iterable[int]) -> None:
        """Forget the state of ``bins`` (after they moved to another worker).

        Raises:
            NotImplementedError: for states that cannot be split (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot discard bins")

    def prepare_take(self, deadline: float) -> bool:
        """Make the next ``take`` cheaper (e.g. hash held keys, merge small chunks), working
        until ``deadline`` (``time.perf_counter()`` seconds) at most; True when nothing is
        left to prepare.  Called by a migrating operator's router while a step that moves
        bins away from this worker waits for its time (``tokenflow.rescale.megaphone``), so
        that the step's slices find the work done.  Must not change what ``export`` returns.
        The default has nothing to prepare."""
        return True

    def pending_times(self) -> list[Any]:
        """Times at which the operator holds tokens because of this state (default none)."""
        return []

    def bin_bytes(self) -> np.ndarray | None:
        """Bytes of state per bin: a float64 array of ``bins`` entries (0 for a bin not held),
        the weights a rescale chooses the bins that move by (``RoutingTable.rebalanced``
        with ``sizes``), or None when the state does not weigh its bins (the default), or not
        cheaply now: the bins' counts then decide which move.  Called between two steps of
        the worker, which it holds meanwhile: an implementation estimates from what it
        indexes (keys or rows per bin), it does not serialize; what counts is the bins'
        proportions."""
        return None

    def take_changes(self) -> set[int] | None:
        """The bins whose exported table may differ from what it was at the previous call (or
        at ``mark_unchanged``, or when the state was created empty), and forget them: the
        bins a checkpoint must export again.  A bin whose rows all went (taken, discarded,
        deleted) is included.  None (the default): the state does not track its changes,
        and every bin must be exported."""
        return None

    def mark_unchanged(self) -> None:
        """Forget the changes recorded so far: the state now holds exactly what the snapshot
        it was just loaded from holds (called by the worker after a restore's ``load``).
        The default does nothing (a state that does not track has nothing to forget)."""
        return None


class TrackedDict(dict[K, V]):
    """A ``dict`` that records in ``touched`` every key read or written through it.

    Reads count because a value read may be mutated in place (``d[k].append(x)``); iterating
    ``values()`` or ``items()`` (or ``copy()``) touches every key.  Membership tests, ``len``,
    ``keys()`` and iterating the keys touch nothing.  ``dict.__getitem__(d, k)`` and the other
    unbound ``dict`` methods bypass the record (the state's own export uses them).

    Once more than ``limit`` keys are touched, ``flush()`` is called (``KeyedState`` folds
    them into its bin index, keeping the record's memory bounded).
    """

    __slots__ = ("flush", "limit", "touched")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self.touched: set[Any] = set()
        self.limit = 1 << 16
        self.flush: Callable[[], None] | None = None

    def __reduce__(self) -> Any:
        return (TrackedDict, (dict(dict.items(self)),), {"touched": set(self.touched)})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.touched = set(state.get("touched", ()))

    def maybe_flush(self) -> None:
        """Call ``flush`` once more than ``limit`` keys are touched."""
        if len(self.touched) > self.limit and self.flush is not None:
            self.flush()

    def __getitem__(self, key: K) -> V:
        self.touched.add(key)
        return dict.__getitem__(self, key)

    def get(self, key: K, default: Any = None) -> Any:  # type: ignore[override]
        self.touched.add(key)
        return dict.get(self, key, default)

    def __setitem__(self, key: K, value: V) -> None:
        self.touched.add(key)
        dict.__setitem__(self, key, value)
        self.maybe_flush()

    def __delitem__(self, key: K) -> None:
        self.touched.add(key)
        dict.__delitem__(self, key)

    def pop(self, key: K, *default: Any) -> Any:  # type: ignore[override]
        self.touched.add(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[K, V]:
        item = dict.popitem(self)
        self.touched.add(item[0])
        return item

    def setdefault(self, key: K, default: Any = None) -> Any:  # type: ignore[override]
        self.touched.add(key)
        out = dict.setdefault(self, key, default)
        self.maybe_flush()
        return out

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        other = dict(*args, **kwargs)
        self.touched.update(other)
        dict.update(self, other)
        self.maybe_flush()

    def __ior__(self, other: Any) -> TrackedDict[K, V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self.touched.update(dict.keys(self))
        dict.clear(self)

    def values(self) -> Any:
        self.touched.update(dict.keys(self))
        return dict.values(self)

    def items(self) -> Any:
        self.touched.update(dict.keys(self))
        return dict.items(self)

    def copy(self) -> dict[K, V]:
        self.touched.update(dict.keys(self))
        return dict(dict.items(self))


class KeyedState(BinnedState, MutableMapping[K, V]):
    """A ``dict`` from key to value, exported per bin of the key's stable routing hash.

    Keys must be what the operator's exchange routes by (``int`` or ``str`` hash by value,
    anything else by ``str(key)``), so that the keys on a worker are those of its bins.
    ``times``, when given, maps a value to the times its operator holds tokens for.

    ``data`` is the underlying ``TrackedDict``: use it as a plain ``dict`` (a fold may hold on
    to it).  Every key read or written through the state or ``data`` is recorded and, when
    ``take_changes`` (or an export) next runs, hashed once to its bin (one vectorized hash of
    the touched keys), which is then counted as changed; a bin index (bin -> keys) kept that
    way lets ``export(bins)``, ``take`` and ``discard`` visit only the keys of those bins.
    Not seen: a value mutated in place after the capture that followed its last read through
    the state (hold values across epochs only through the state, or write them back).
    """

    def __init__(self, times: Callable[[V], Iterable[Any]] | None = None) -> None:
        self.data: TrackedDict[K, V] = TrackedDict()
        self.data.flush = self._index
        self._times = times
        self._members: dict[int, dict[K, None]] = {}  # bin -> its keys (indexed ones)
        self._changed: set[int] = set()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.data.flush = self._index  # (a TrackedDict pickles its items and marks only)

    def attach(self, bins: int, home_bin: int) -> None:
        if bins != self.bins and self._members:  # indexed under another bin count: redo
            for keys in self._members.values():
                self.data.touched.update(keys)
            self._members = {}
        super().attach(bins, home_bin)

    def __getitem__(self, key: K) -> V:
        return self.data[key]

    def __setitem__(self, key: K, value: V) -> None:
        self.data[key] = value

    def __delitem__(self, key: K) -> None:
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self.data, key)

    def __iter__(self) -> Iterator[K]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def _index(self) -> None:
        """Fold the touched keys into the bin index; their bins count as changed."""
        data = self.data
        touched = data.touched
        if not touched:
            return
        keys = list(touched)
        touched.clear()
        members, changed = self._members, self._changed
        present = dict.__contains__
        for k, b in zip(keys, key_bins(keys, self.bins or 1).tolist(), strict=True):
            changed.add(b)
            if present(data, k):
                group = members.get(b)
                if group is None:
                    group = members[b] = {}
                group[k] = None
            else:
                group = members.get(b)
                if group is not None:
                    group.pop(k, None)
                    if not group:
                        del members[b]
        data.limit = max(1 << 16, 2 * len(data))

    def _bins(self, bins: Iterable[int] | None) -> list[int]:
        self._index()
        if bins is None:
            return sorted(self._members)
        return sorted(b for b in set(bins) if b in self._members)

    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        data, members, get = self.data, self._members, dict.__getitem__
        return {b: pickled({k: get(data, k) for k in members[b]}) for b in self._bins(bins)}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        data, members = self.data, self._members
        for b, table in parts.items():
            for mapping in unpickled(table):
                dict.update(data, mapping)
                members.setdefault(b, {}).update(dict.fromkeys(mapping))
                self._changed.add(b)

    def discard(self, bins: Iterable[int]) -> None:
        data = self.data
        for b in self._bins(bins):
            for k in self._members.pop(b):
                dict.__delitem__(data, k)
            self._changed.add(b)

    def take(self, bins: Iterable[int]) -> dict[int, pa.Table]:
        """``export(bins)`` then ``discard(bins)``, visiting only those bins' keys."""
        data, out = self.data, {}
        for b in self._bins(bins):
            out[b] = pickled({k: dict.pop(data, k) for k in self._members.pop(b)})
            self._changed.add(b)
        return out

    def take_changes(self) -> set[int]:
        self._index()
        changed, self._changed = self._changed, set()
        return changed

    def mark_unchanged(self) -> None:
        self._index()
        self._changed = set()

    def pending_times(self) -> list[Any]:
        if self._times is None:
            return []
        return sorted({t for v in dict.values(self.data) for t in self._times(v)})

    def bin_bytes(self) -> np.ndarray:
        """Keys per bin (from the bin index) times the mean pickled size of up to
        ``SIZE_SAMPLE`` of them: no pass over the values."""
        self._index()
        out = np.zeros(self.bins or 1)
        if not self._members:
            return out
        bins = np.fromiter(self._members, np.int64, len(self._members))
        counts = np.fromiter((len(k) for k in self._members.values()), np.float64, len(bins))
        sample = dict(itertools.islice(dict.items(self.data), SIZE_SAMPLE))
        per_key = len(cloudpickle.dumps(sample)) / max(1, len(sample))
        keep = bins < len(out)
        out[bins[keep]] = counts[keep] * per_key
        return out


class LocalState(BinnedState, Generic[S]):
    """Worker-local state (not keyed): ``value`` (made by ``factory``) is exported whole under
    this worker's home bin; ``merge(value, other)`` folds in a part loaded from another
    worker's snapshot (several old workers' parts may land on one new worker).

    ``times(value)`` lists the times the operator holds tokens for.
    """

    def __init__(self, factory: Callable[[], S], merge: Callable[[S, S], S],
                 times: Callable[[S], Iterable[Any]] | None = None,
                 empty: Callable[[S], bool] | None = None) -> None:
        self.value: S = factory()
        self._merge = merge
        self._times = times
        self._empty = empty

    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        if bins is not None and self.home_bin not in set(bins):
            return {}
        if self._empty is not None and self._empty(self.value):
            return {}
        return {self.home_bin: pickled(self.value)}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        for b in sorted(parts):
            for other in unpickled(parts[b]):
                self.value = self._merge(self.value, other)

    def pending_times(self) -> list[Any]:
        if self._times is None:
            return []
        return sorted(set(self._times(self.value)))


__all__ = ["PICKLE_SCHEMA", "BinnedState", "KeyBins", "KeyedState", "LocalState", "TrackedDict",
           "group_by_bin", "key_bins", "pickled", "split_by_bin", "unpickled"]
