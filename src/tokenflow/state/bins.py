"""Bins and the routing table: ``key -> bin -> worker``.

Source: distributed-DBSP design, "Scaling state" (fixed sharding: S shards assigned to workers
by an S-sized array, moving about ``1/(W+1)`` of the state when a worker is added, where
``hash % W`` moves ``W/(W+1)``); Megaphone (Hoffmann et al., VLDB 2019: keys are grouped in bins
whose owner is given by a routing table that changes at logical times); rescaling timely
dataflow §3.5.

A key's **bin** is the top ``log2(S)`` bits of its stable 64-bit routing hash
(``tokenflow.dataflow.routing.stable_hash``), so the bin of a key is the same in every process,
on every runtime and for every worker count.  A ``RoutingTable`` maps each of the ``S`` bins to
a worker index; an exchange sends a record to ``table.owners[bin(key)]``.  The first table of
a job gives every worker a contiguous, even range of bins; ``rebalanced`` derives the table of
another roster from an existing one moving as few bins as possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

DEFAULT_BINS = 4096
"""Bins per job unless configured otherwise (a power of two; Megaphone's 2**12)."""
MAX_BINS = 1 << 16
"""Largest supported bin count (bins are stored as ``uint16``)."""


def check_bins(bins: int) -> int:
    """``bins`` if it is a power of two in ``[1, MAX_BINS]``.

    Raises:
        ValueError: otherwise (naming the value).
    """
    if not isinstance(bins, (int, np.integer)) or bins < 1 or bins > MAX_BINS or bins & (bins - 1):
        raise ValueError(f"the bin count must be a power of two in [1, {MAX_BINS}], got {bins!r}")
    return int(bins)


def bins_of(hashes: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Bin per uint64 routing hash, as int64 in ``[0, bins)``: the hash's top ``log2(bins)``
    bits (the bits the hash finalizers mix best).  ``hashes`` is not changed."""
    if bins == 1:
        return np.zeros(len(hashes), dtype=np.int64)
    return (hashes >> np.uint64(65 - bins.bit_length())).view(np.int64)


class BinSplit(Mapping[int, pa.Table]):
    """The rows of one table grouped by bin, without a table object per bin: a mapping from
    each bin present to its rows, where bin ``bins[i]`` owns rows ``[starts[i], stops[i])``
    of ``table`` (rows ordered by bin).  A bin's table is a zero-copy slice, made when
    asked for; ``tokenflow.state.snapshot`` serializes a run of bins as one slice.  A state
    of thousands of small bins (a windowed query's) costs a few microseconds of interpreter
    per bin object, more than its rows.  ``split_by_bin`` (``tokenflow.dataflow.state``)
    builds it.

    Args:
        table: the rows, ordered by bin (columns are combined into one chunk each).
        bins: int64, the bins present, strictly ascending.
        starts, stops: int64, each bin's first row and one past its last (``starts[i] <
            stops[i] == starts[i + 1]``).

    Raises:
        ValueError: arrays of different lengths, bins not strictly ascending, or rows not
            covered exactly once in order.
    """

    __slots__ = ("table", "bins", "starts", "stops")

    def __init__(self, table: pa.Table, bins: np.ndarray, starts: np.ndarray,
                 stops: np.ndarray) -> None:
        bins, starts, stops = (np.asarray(a, dtype=np.int64) for a in (bins, starts, stops))
        if not len(bins) == len(starts) == len(stops):
            raise ValueError(f"{len(bins)} bins, {len(starts)} starts and {len(stops)} stops")
        if len(bins) and (bool((bins[1:] <= bins[:-1]).any()) or starts[0] != 0
                          or stops[-1] != table.num_rows or bool((stops <= starts).any())
                          or not np.array_equal(starts[1:], stops[:-1])):
            raise ValueError("bins must ascend strictly and their row ranges cover the table "
                             "in order, each non-empty")
        if not len(bins) and table.num_rows:
            raise ValueError(f"no bins for {table.num_rows} rows")
        self.table = table.combine_chunks() if any(
            c.num_chunks > 1 for c in table.columns) else table
        self.bins = bins
        self.starts = starts
        self.stops = stops

    def _position(self, b: object) -> int:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise KeyError(b)
        i = int(np.searchsorted(self.bins, b))
        if i == len(self.bins) or self.bins[i] != b:
            raise KeyError(b)
        return i

    def __getitem__(self, b: int) -> pa.Table:
        i = self._position(b)
        start = int(self.starts[i])
        return self.table.slice(start, int(self.stops[i]) - start)

    def __contains__(self, b: object) -> bool:
        try:
            self._position(b)
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(self.bins.tolist())

    def __len__(self) -> int:
        return len(self.bins)

    def rows(self) -> np.ndarray:
        """Rows per bin (int64, in ``bins`` order)."""
        return self.stops - self.starts

    def __repr__(self) -> str:
        return f"BinSplit({len(self.bins)} bins, {self.table.num_rows} rows)"


class RoutingTable:
    """Owner (worker index) of each of ``bins`` bins.

    Args:
        owners: worker index per bin (length a power of two).
        roster: the workers of the job (default: the distinct owners); a worker of the roster
            may own no bin.

    Raises:
        ValueError: a bin count that is not a power of two, a negative owner, or an owner
            missing from ``roster``.
    """

    __slots__ = ("owners", "roster", "version", "_owners_list")

    def __init__(self, owners: Sequence[int] | np.ndarray, roster: Iterable[int] | None = None,
                 version: int = 0) -> None:
        array = np.asarray(owners, dtype=np.int64)
        check_bins(len(array))
        if len(array) and int(array.min()) < 0:
            raise ValueError(f"routing table owners must be worker indices >= 0, got {int(array.min())}")
        self.owners = array
        self.owners.setflags(write=False)
        members = tuple(sorted(set(roster))) if roster is not None else \
            tuple(sorted(set(array.tolist())))
        missing = set(array.tolist()) - set(members)
        if missing:
            raise ValueError(f"routing table owners {sorted(missing)} are not in the roster {list(members)}")
        self.roster = members
        self.version = version
        self._owners_list: list[int] = array.tolist()

    @property
    def bins(self) -> int:
        """Number of bins ``S``."""
        return len(self.owners)

    @classmethod
    def even(cls, workers: int, bins: int = DEFAULT_BINS) -> RoutingTable:
        """Workers ``0..workers-1`` own contiguous, even ranges of bins (the first
        ``bins % workers`` workers one bin more).

        Raises:
            ValueError: ``workers < 1`` or a bad bin count.
        """
        check_bins(bins)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        counts = [bins // workers + (1 if w < bins % workers else 0) for w in range(workers)]
        return cls(np.repeat(np.arange(workers, dtype=np.int64), counts), range(workers))

    def route(self, bin_indices: np.ndarray) -> np.ndarray:
        """Owner per bin index (int64 array)."""
        return self.owners[bin_indices]

    def routes(self, hashes: np.ndarray) -> np.ndarray:
        """Owner per uint64 routing hash (int64 array): ``owners[bins_of(hashes)]``."""
        return self.owners[bins_of(hashes, len(self.owners))]

    def owner(self, bin_index: int) -> int:
        """Owner of one bin."""
        return self._owners_list[bin_index]

    def owned_by(self, worker: int) -> np.ndarray:
        """The bins ``worker`` owns, ascending (int64)."""
        return np.flatnonzero(self.owners == worker)

    def counts(self) -> dict[int, int]:
        """Bins per roster member (0 for a member owning none)."""
        values, counts = np.unique(self.owners, return_counts=True)
        out = {w: 0 for w in self.roster}
        out.update(zip(values.tolist(), counts.tolist(), strict=True))
        return out

    def rebalanced(self, roster: Iterable[int],
                   sizes: np.ndarray | Sequence[float] | None = None) -> RoutingTable:
        """The table for ``roster`` that moves the fewest bins from this one while giving
        every member ``bins // n`` or ``bins // n + 1`` bins (``n = len(roster)``).

        The ``bins % n`` shares one bin larger go to the members owning the most bins now
        (ties: lower index first).  The bins of departed members always move; a member above
        its share gives away its excess.  Without ``sizes``, members keep their lowest bins up
        to their share and the bins that move go, in bin order, to the members below their
        share, in ascending order.  Going from ``W`` to ``W + 1`` even members moves
        ``bins // (W + 1)`` or one more bin, all to the newcomer.

        With ``sizes`` (bytes of state per bin, one non-negative number per bin: the
        estimates the workers report, ``BinnedState.bin_bytes``), as many bins move, but a
        member above its share chooses the bins it gives by bytes: a systematic sample of its
        bins ranked by size (every ``owned / excess``-th, from the middle of each stride), so
        that what moves holds the excess bins' proportional part of its bytes within one
        bin's bytes, where bins chosen by index hold whatever they happen to (a small state
        fills its bins unevenly); the moving bins, largest first, go to the member below its
        share with the most bytes missing to ``total / n``.  Going from ``W`` to ``W + 1``
        members then moves about ``1/(W + 1)`` of the bytes (distributed-DBSP design,
        "Scaling state": the bound the bin count alone meets only on average).  The sample
        seeks no byte total: bins chosen to hit one are the ones whose size fits, and where
        large bins are transient (q4's bids waiting for their auction) what they leave moves
        more than its share by the time the step runs (docs/ARCHITECTURE.md).

        Raises:
            ValueError: an empty roster, a negative worker index, or ``sizes`` of another
                length than the bin count or with a negative or non-finite entry.
        """
        members = sorted(set(roster))
        if not members:
            raise ValueError("a routing table needs at least one worker")
        if members[0] < 0:
            raise ValueError(f"worker indices must be >= 0, got {members[0]}")
        n, bins = len(members), self.bins
        current = self.counts()
        larger = sorted(members, key=lambda w: (-current.get(w, 0), w))[: bins % n]
        share = {w: bins // n + (1 if w in larger else 0) for w in members}
        if sizes is not None:
            weights = _checked_sizes(sizes, bins)
            if weights.any():  # (no state held anywhere yet: no bytes to choose by)
                return self._rebalanced_by_size(members, share, weights)
        owners = self.owners.copy()
        kept = dict.fromkeys(members, 0)
        pool: list[int] = []
        for b, w in enumerate(self._owners_list):
            if w in kept and kept[w] < share[w]:
                kept[w] += 1
            else:
                pool.append(b)
        it = iter(pool)
        for w in members:
            for _ in range(share[w] - kept[w]):
                owners[next(it)] = w
        return RoutingTable(owners, members, self.version + 1)

    def _rebalanced_by_size(self, members: list[int], share: dict[int, int],
                            sizes: np.ndarray) -> RoutingTable:
        """``rebalanced`` with bytes per bin: see there."""
        target = float(sizes.sum()) / len(members)
        owners = self.owners.copy()
        held = {w: 0.0 for w in members}
        pool: list[int] = []
        for w in sorted(set(self._owners_list)):
            mine = np.flatnonzero(self.owners == w)
            if w not in share:
                pool.extend(mine.tolist())
                continue
            excess = len(mine) - share[w]
            if excess > 0:
                given = _spread_sample(sizes[mine], excess)
                pool.extend(mine[given].tolist())
                mine = np.delete(mine, given)
            held[w] = float(sizes[mine].sum())
        owned = self.counts()
        room = {w: max(0, share[w] - owned.get(w, 0)) for w in members}
        order = sorted(pool, key=lambda b: (-float(sizes[b]), b))
        for b in order:
            w = max((m for m in members if room[m] > 0),
                    key=lambda m: (target - held[m], -m))
            owners[b] = w
            room[w] -= 1
            held[w] += float(sizes[b])
        return RoutingTable(owners, members, self.version + 1)

    def replaced(self, old: int, new: int) -> RoutingTable:
        """The table where worker ``new`` takes every bin of ``old`` and ``old`` leaves the
        roster (a rolling upgrade's one layout change: no other bin moves).

        Raises:
            ValueError: ``old`` is not in the roster, or ``new`` is negative.
        """
        if old not in self.roster:
            raise ValueError(f"worker {old} is not in the roster {list(self.roster)}")
        if new < 0:
            raise ValueError(f"worker indices must be >= 0, got {new}")
        owners = np.where(self.owners == old, new, self.owners)
        roster = [w for w in self.roster if w != old] + [new]
        return RoutingTable(owners, roster, self.version + 1)

    def moved(self, other: RoutingTable) -> np.ndarray:
        """Bins whose owner differs between this table and ``other`` (same bin count).

        Raises:
            ValueError: different bin counts.
        """
        if other.bins != self.bins:
            raise ValueError(f"routing tables of {self.bins} and {other.bins} bins")
        return np.flatnonzero(self.owners != other.owners)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form: ``{"bins", "roster", "version", "owners"}`` (owners run-length
        encoded as ``[[owner, count], ...]``)."""
        runs: list[list[int]] = []
        for w in self._owners_list:
            if runs and runs[-1][0] == w:
                runs[-1][1] += 1
            else:
                runs.append([w, 1])
        return {"bins": self.bins, "roster": list(self.roster), "version": self.version,
                "owners": runs}

    @classmethod
    def from_json(cls, data: Any) -> RoutingTable:
        """The inverse of ``to_json``.

        Raises:
            ValueError: a malformed document (wrong types, run lengths not summing to
                ``bins``).
        """
        try:
            bins = int(data["bins"])
            owners = [int(w) for w, count in data["owners"] for _ in range(int(count))]
            roster = [int(w) for w in data["roster"]]
            version = int(data.get("version", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed routing table: {exc}") from exc
        if len(owners) != bins:
            raise ValueError(f"malformed routing table: {len(owners)} owners for {bins} bins")
        return cls(owners, roster, version)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RoutingTable) and self.roster == other.roster
                and np.array_equal(self.owners, other.owners))

    def __hash__(self) -> int:
        return hash((self.roster, self.owners.tobytes()))

    def __repr__(self) -> str:
        return f"RoutingTable(bins={self.bins}, roster={list(self.roster)}, counts={self.counts()})"


def _checked_sizes(sizes: np.ndarray | Sequence[float], bins: int) -> np.ndarray:
    """``sizes`` as float64, one finite non-negative number per bin.

    Raises:
        ValueError: another length, or a negative or non-finite entry.
    """
    array = np.asarray(sizes, dtype=np.float64)
    if array.shape != (bins,):
        raise ValueError(f"sizes per bin: expected {bins} numbers, got shape {array.shape}")
    if not np.isfinite(array).all() or (array < 0).any():
        raise ValueError("sizes per bin must be finite and >= 0")
    return array


def _spread_sample(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of ``k`` of ``values`` spread evenly over their ranking by value (the
    middle of each of ``k`` equal strides of the sorted order): their sum is within the
    largest value of ``k / len(values)`` of the total.  ``0 < k <= len(values)``."""
    order = np.argsort(values, kind="stable")
    ranks = ((np.arange(k) + 0.5) * len(values) / k).astype(np.int64)
    return np.sort(order[ranks])


__all__ = ["DEFAULT_BINS", "MAX_BINS", "BinSplit", "RoutingTable", "bins_of", "check_bins"]
