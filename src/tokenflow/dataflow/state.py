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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

import cloudpickle
import numpy as np
import pyarrow as pa

from tokenflow.dataflow.routing import stable_hash
from tokenflow.state.bins import bins_of

K = TypeVar("K")
V = TypeVar("V")
S = TypeVar("S")

PICKLE_SCHEMA = pa.schema([("pickle", pa.binary())])
"""Layout of a bin whose state is Python objects: one row, the cloudpickled object."""


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
                 wanted: Iterable[int] | None = None) -> dict[int, pa.Table]:
    """Rows of ``table`` grouped by their bin (``bin_of_row[i]`` for row ``i``), one table
    per bin present (and in ``wanted``, when given); vectorized: one sort and one take.

    Raises:
        ValueError: ``bin_of_row`` does not have one entry per row.
    """
    if len(bin_of_row) != table.num_rows:
        raise ValueError(f"{len(bin_of_row)} bins for {table.num_rows} rows")
    if table.num_rows == 0:
        return {}
    keep = np.ones(len(bin_of_row), dtype=bool) if wanted is None else \
        np.isin(bin_of_row, np.fromiter(wanted, dtype=np.int64))
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        return {}
    order = rows[np.argsort(bin_of_row[rows], kind="stable")]
    ordered = table.take(pa.array(order))
    sorted_bins = bin_of_row[order]
    starts = np.flatnonzero(np.r_[True, sorted_bins[1:] != sorted_bins[:-1]])
    stops = np.r_[starts[1:], len(sorted_bins)]
    return {int(sorted_bins[s]): ordered.slice(s, e - s)
            for s, e in zip(starts.tolist(), stops.tolist(), strict=True)}


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


class BinnedState(ABC):
    """State of one operator on one worker that can be exported and loaded per bin.

    Implementations keep whatever layout suits their operator; the system only calls the
    methods below, between invocations of the operator (never concurrently with its logic).
    """

    bins: int = 0
    """The job's bin count ``S``, set when the state is registered (``attach``)."""
    home_bin: int = 0
    """The least bin this worker owns: where worker-local state is exported."""

    def attach(self, bins: int, home_bin: int) -> None:
        """Called once when the operator declares the state."""
        self.bins = bins
        self.home_bin = home_bin

    @abstractmethod
    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        """The state of ``bins`` (all held when None) as one Arrow table per non-empty bin;
        the state is not changed."""

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

    def pending_times(self) -> list[Any]:
        """Times at which the operator holds tokens because of this state (default none)."""
        return []


class KeyedState(BinnedState, MutableMapping[K, V]):
    """A ``dict`` from key to value, exported per bin of the key's stable routing hash.

    Keys must be what the operator's exchange routes by (``int`` or ``str`` hash by value,
    anything else by ``str(key)``), so that the keys on a worker are those of its bins.
    ``times``, when given, maps a value to the times its operator holds tokens for.
    """

    def __init__(self, times: Callable[[V], Iterable[Any]] | None = None) -> None:
        self.data: dict[K, V] = {}
        self._times = times

    def __getitem__(self, key: K) -> V:
        return self.data[key]

    def __setitem__(self, key: K, value: V) -> None:
        self.data[key] = value

    def __delitem__(self, key: K) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def _grouped(self, bins: Iterable[int] | None) -> dict[int, list[K]]:
        """Keys by bin (only ``bins`` when given), from one vectorized hash of all keys."""
        keys = list(self.data)
        return group_by_bin(keys, key_bins(keys, self.bins or 1), bins)

    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        data = self.data
        return {b: pickled({k: data[k] for k in keys}) for b, keys in self._grouped(bins).items()}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        for table in parts.values():
            for mapping in unpickled(table):
                self.data.update(mapping)

    def discard(self, bins: Iterable[int]) -> None:
        for keys in self._grouped(bins).values():
            for k in keys:
                del self.data[k]

    def take(self, bins: Iterable[int]) -> dict[int, pa.Table]:
        """``export(bins)`` then ``discard(bins)``, hashing the keys once."""
        data = self.data
        out = {}
        for b, keys in self._grouped(bins).items():
            out[b] = pickled({k: data[k] for k in keys})
            for k in keys:
                del data[k]
        return out

    def pending_times(self) -> list[Any]:
        if self._times is None:
            return []
        return sorted({t for v in self.data.values() for t in self._times(v)})


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


__all__ = ["PICKLE_SCHEMA", "BinnedState", "KeyedState", "LocalState", "group_by_bin", "key_bins",
           "pickled",
           "split_by_bin", "unpickled"]
