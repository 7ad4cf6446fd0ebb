"""Stable, vectorized routing of batch records to workers (the exchange pact's hash).

Source: docs/ARCHITECTURE.md ("Data plane": "Exchange routes by a stable hash, never Python's salted
``hash()`` of str").  The hash is defined here, the same in every process, on every runtime and
for list and Arrow batches alike, so a key meets itself whichever stream it travels on:

* integers (``int`` and ``bool`` keys, integer and boolean columns): ``mix64(value as
  uint64)``, with ``mix64`` the SplitMix64 finalizer;
* floats (``float`` keys, floating-point columns): a float equal to an integer in int64 range
  hashes as that integer (``1.0 == 1``, ``-0.0 == 0``: keys equal in Python meet, whichever
  was seen first), any other float as ``mix64`` of its IEEE 754 bits (``hash_floats``);
* strings and bytes: ``M * sum((b[j] + 1) * B**j)`` over the UTF-8 bytes ``b``, modulo 2**64
  (``hash_strings``);
* anything else: the string hash of ``str(key)``;

and the job's exchanges send a hash to the owner of its bin in the job's ``RoutingTable``
(``tokenflow.state.bins``: the bin is the hash's top ``log2(S)`` bits), so keyed state can
move between workers bin by bin.  Without a table a hash goes to worker
``(hash >> 32) * peers >> 32`` (``routes_for``): its high 32 bits scaled to ``[0, peers)``,
the bits the final multiplications mix best.  Strings are hashed with
numpy over the Arrow buffers in a fixed number of vector operations per batch (a prefix sum over
all the bytes), whatever the strings' lengths: on the ``thread`` runtime every numpy call on
more than a few hundred elements, every fancy index and most pyarrow calls hand the GIL to
another worker, so the number of such calls, not only their work, is the cost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import compress, pairwise, repeat
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenflow.state.bins import RoutingTable

POLY_BASE = 0x9E3779B97F4A7C15
"""The odd base ``B`` of the string polynomial (invertible modulo 2**64)."""
STRING_MULTIPLIER = 0xD6E8FEB86659FD93
"""The odd multiplier ``M`` of the string hash, which carries the polynomial's low bits (all
there is of a one-byte string) into the high bits that ``routes_for`` uses."""
_POLY_BASE_INVERSE = pow(POLY_BASE, -1, 2**64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
SPAN_BYTES = 1 << 20
"""Bytes hashed per prefix sum: a larger batch is hashed in row ranges of about this size."""
_TAKE = pc.get_function("take")
"""Looked up once: ``pyarrow.compute.take`` looks the function up per call, releasing the GIL."""


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over a uint64 array (wrapping arithmetic); ``x`` is not changed."""
    # Array integer arithmetic wraps silently in numpy (only scalar overflow warns).
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


_CACHED_POWERS = 2 * SPAN_BYTES
"""Most powers kept between calls (two tables of 16 MiB): a row range of about ``SPAN_BYTES``
fits, and one value longer than that gets tables of its own, dropped after its hash."""


class _Powers:
    """``B**j`` and ``M * B**-j`` modulo 2**64 for ``j < size``, grown by doubling up to
    ``_CACHED_POWERS`` (thread-safe: readers take the current pair, a grower replaces it
    whole); larger requests are built for the caller and not kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables = self._build(1 << 12)

    @staticmethod
    def _build(size: int) -> tuple[np.ndarray, np.ndarray]:
        out = []
        for first, factor in ((1, POLY_BASE), (STRING_MULTIPLIER, _POLY_BASE_INVERSE)):
            table = np.full(size, factor, dtype=np.uint64)
            table[0] = first
            np.multiply.accumulate(table, out=table)
            out.append(table)
        return out[0], out[1]

    def at_least(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        tables = self.tables
        if len(tables[0]) >= size:
            return tables
        if size > _CACHED_POWERS:
            return self._build(size)
        with self._lock:
            if len(self.tables[0]) < size:
                self.tables = self._build(1 << (size - 1).bit_length())
            return self.tables


_POWERS = _Powers()


def hash_strings(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hashes (uint64, one per value) of an Arrow string or binary array; nulls hash to 0.

    For value bytes ``b``: ``M * sum((b[j] + 1) * B**j) mod 2**64`` with ``B = POLY_BASE`` and
    ``M = STRING_MULTIPLIER`` (the ``+ 1`` makes trailing zero bytes count).  Vectorized over
    the whole data buffer: ``P[k] = sum((b[j] + 1) * B**j, j < k)`` by one multiply, one add
    and one cumulative sum, then per value ``(P[end] - P[start]) * M * B**-start`` (``B`` is
    odd, so invertible); eight numpy calls per ``SPAN_BYTES`` of data.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    width = 8 if large else 4
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32, count=n + 1,
                            offset=array.offset * width)
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, dtype=np.uint8))
    out = _hash_spans(data, offsets)
    if array.null_count:
        out[np.asarray(array.is_null())] = 0
    return out


def hash_texts(texts: list[str]) -> np.ndarray:
    """``hash_strings`` of Python strings, straight from their UTF-8 bytes (no Arrow array: the
    first ``pa.array`` of a Python list in a process imports pandas, ~0.2 s)."""
    encoded = [t.encode() for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(list(map(len, encoded)), out=offsets[1:])
    return _hash_spans(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)


def _hash_spans(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``_hash_rows`` in row ranges of about ``SPAN_BYTES`` each (the power tables stay small)."""
    n = len(offsets) - 1
    if int(offsets[-1]) - int(offsets[0]) <= SPAN_BYTES:
        return _hash_rows(data, offsets)
    cuts = np.searchsorted(offsets, np.arange(int(offsets[0]), int(offsets[-1]), SPAN_BYTES),
                           side="right") - 1
    bounds = sorted({0, n, *cuts.tolist()})
    return np.concatenate([_hash_rows(data, offsets[lo : hi + 1]) for lo, hi in pairwise(bounds)])


def _hash_rows(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``hash_strings`` of the values between consecutive ``offsets`` into ``data``."""
    first, last = int(offsets[0]), int(offsets[-1])
    size = last - first
    powers, scaled_inverses = _POWERS.at_least(size + 1)
    prefix = np.empty(size + 1, dtype=np.uint64)
    prefix[0] = 0
    terms = prefix[1:]
    np.multiply(data[first:last], powers[:size], out=terms)
    terms += powers[:size]
    np.cumsum(prefix, out=prefix)
    if first:
        offsets = offsets - first
    at = prefix[offsets]
    h = at[1:] - at[:-1]
    h *= scaled_inverses[offsets[:-1]]
    return h


def hash_ints(values: np.ndarray) -> np.ndarray:
    """``mix64`` of int64 values."""
    return mix64(values.astype(np.int64, copy=False).view(np.uint64))


_TWO_63 = float(2**63)


def hash_floats(values: np.ndarray) -> np.ndarray:
    """Hashes (uint64) of float64 values: ``hash_ints`` of the integer for a value equal to an
    integer in int64 range (so ``1.0`` meets ``1`` and ``-0.0`` meets ``0``), ``mix64`` of
    the IEEE 754 bits for any other value (NaNs hash by their bits)."""
    values = values.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        integral = (np.floor(values) == values) & (np.abs(values) < _TWO_63)
    out = mix64(values.view(np.uint64))
    if integral.any():
        out[integral] = hash_ints(values[integral].astype(np.int64))
    return out


def stable_hash(keys: Sequence[Any] | np.ndarray) -> np.ndarray:
    """64-bit hashes of ``keys``, equal across processes, runtimes and batch layouts.

    Integers (within int64) hash by value, floats with ``hash_floats`` (an integral float as
    its integer), strings by their UTF-8 bytes, everything else by its ``str`` form — so ``1``
    and ``1.0`` meet, ``1`` and ``"1"`` differ, and each is stable.  Keys equal in Python but
    of other types (``Decimal(1)`` and ``1``, or tuples mixing them) hash by their different
    ``str`` forms: use one type per key.
    """
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iub":
        return hash_ints(keys)
    if isinstance(keys, np.ndarray) and keys.dtype.kind == "f":
        return hash_floats(keys)
    keys = list(keys)
    kinds = set(map(type, keys))
    if kinds == {str}:
        return hash_texts(keys)
    if kinds == {float}:
        return hash_floats(np.array(keys, dtype=np.float64))
    if kinds == {str, type(None)}:  # as a string array with nulls: None hashes to 0
        out = hash_texts(["" if k is None else k for k in keys])
        out[[k is None for k in keys]] = 0
        return out
    if kinds == {int}:
        try:
            return hash_ints(np.array(keys, dtype=np.int64))
        except OverflowError:  # beyond int64: hashed as text below
            pass
    out = np.zeros(len(keys), dtype=np.uint64)
    ints = [i for i, k in enumerate(keys)
            if type(k) in (int, bool) or isinstance(k, np.integer)]
    ints = [i for i in ints if _INT64_MIN <= int(keys[i]) <= _INT64_MAX]
    if ints:
        out[ints] = hash_ints(np.array([int(keys[i]) for i in ints], dtype=np.int64))
    floats = [i for i, k in enumerate(keys) if isinstance(k, (float, np.floating))]
    if floats:
        out[floats] = hash_floats(np.array([keys[i] for i in floats], dtype=np.float64))
        ints += floats
    if len(ints) < len(keys):
        taken = set(ints)
        rest = [i for i in range(len(keys)) if i not in taken]
        texts = [k if isinstance(k, (str, bytes)) else str(k) for k in (keys[i] for i in rest)]
        if all(isinstance(t, str) for t in texts):
            array = pa.array(texts, type=pa.string())
        else:
            array = pa.array([t.encode() if isinstance(t, str) else t for t in texts],
                             type=pa.binary())
        out[rest] = hash_strings(array)
    return out


def routes_for(hashes: np.ndarray, peers: int) -> np.ndarray:
    """Worker index per uint64 hash, as int64: ``(hash >> 32) * peers >> 32`` (the high 32
    bits scaled to ``[0, peers)``, Lemire's multiply-shift range reduction); ``hashes`` is not
    changed.  For ``peers = 2**k`` that is ``hash >> (64 - k)``, one vector call instead of
    three."""
    if peers & (peers - 1) == 0:
        if peers == 1:
            return np.zeros(len(hashes), dtype=np.int64)
        return (hashes >> np.uint64(65 - peers.bit_length())).view(np.int64)
    high = hashes >> np.uint64(32)
    high *= np.uint64(peers)
    high >>= np.uint64(32)
    return high.view(np.int64)


Target = int | RoutingTable
"""Where hashes route to: a worker count (``routes_for``) or a ``RoutingTable`` (hash -> bin ->
owner, the job's exchanges)."""


def route_hashes(hashes: np.ndarray, target: Target) -> np.ndarray:
    """Worker index per uint64 hash (int64): ``routes_for(hashes, target)`` for a worker
    count, ``target.routes(hashes)`` (the owner of the hash's bin) for a routing table."""
    if isinstance(target, RoutingTable):
        return target.routes(hashes)
    return routes_for(hashes, target)


def _null_route(target: Target) -> int:
    """Where a null key goes: the route of hash 0 (worker 0, or the owner of bin 0)."""
    return target.owner(0) if isinstance(target, RoutingTable) else 0


def _string_like(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)
    )


def column_hashes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Stable uint64 hash per row of an Arrow column (nulls hash to 0), vectorized: string and
    binary columns with ``hash_strings``, integer and boolean columns by value
    (``hash_ints``), floating-point columns with ``hash_floats``, other types by their string
    form."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if _string_like(kind):
        return hash_strings(column)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        ints = column.fill_null(0) if column.null_count else column
        return hash_ints(ints.cast(pa.int64()).to_numpy(zero_copy_only=False))
    if pa.types.is_floating(kind):
        floats = column.fill_null(0) if column.null_count else column
        hashes = hash_floats(floats.cast(pa.float64()).to_numpy(zero_copy_only=False))
        if column.null_count:
            hashes[np.asarray(column.is_null())] = 0
        return hashes
    hashes = hash_strings(column.cast(pa.string()))
    if column.null_count:
        hashes[np.asarray(column.is_null())] = 0
    return hashes


def column_routes(column: pa.Array | pa.ChunkedArray, peers: Target,
                  cache: dict[Any, int] | None = None) -> np.ndarray:
    """Worker index per row of an Arrow column, vectorized (nulls route as hash 0: to worker 0,
    or to the owner of bin 0 when ``peers`` is a ``RoutingTable``).

    Rows hash with ``column_hashes``; small string columns look their values up in ``cache``
    (a value -> worker map the caller keeps across batches, valid for one ``peers``).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if cache is not None and len(column) <= 64 and _string_like(column.type):
        values = column.to_pylist()
        known = list(map(cache.get, values))
        if None in known:
            missing = [i for i, r in enumerate(known) if r is None and values[i] is not None]
            if missing:
                fresh = route_hashes(hash_strings(column.take(pa.array(missing))), peers)
                if len(cache) > 1 << 20:
                    cache.clear()
                for i, r in zip(missing, fresh.tolist(), strict=True):
                    cache[values[i]] = known[i] = r
            null = _null_route(peers)
            known = [null if r is None else r for r in known]
        return np.array(known, dtype=np.int64)
    routes = route_hashes(column_hashes(column), peers)
    if column.null_count:
        routes = np.where(np.asarray(column.is_null()), _null_route(peers), routes)
    return routes


class KeyRouter:
    """Stable routing of list-batch records by ``key(record)``, memoized per distinct key.

    ``key=None`` routes by the record itself; ``peers`` is a worker count or the job's
    ``RoutingTable`` (then a key goes to the owner of its bin).
    Hashing runs vectorized over the keys not seen before; known keys cost one dict lookup.
    The memo is cleared when it holds ``capacity`` keys.

    For up to ``BYTE_ROUTES`` workers a batch of known keys costs one ``itemgetter`` call
    (50,000 words: 1.0 ms); a batch with keys not seen before (the tail of a Zipf vocabulary
    brings a few in most batches for a long time) costs one pass of ``dict.get`` with a
    default byte, which marks the new keys' positions, then work on those positions only
    (1-364 new words in 50,000, alone on one core: 1.5-1.9 ms, where a failed
    ``itemgetter``, a ``set`` of the batch and a second pass took 2.4-2.9 ms).  After a
    batch with new keys the next one starts with the marking pass; after a batch of mostly
    new keys (a quarter or more of its distinct keys: a stream's first
    batches, or keys that rarely repeat) the next one skips it for a ``set`` of the batch.
    """

    __slots__ = ("key", "peers", "capacity", "_cache", "_bytes", "_missed")

    def __init__(self, key: Callable[[Any], Any] | None, peers: Target,
                 capacity: int = 1 << 20) -> None:
        self.key = key
        self.peers = peers
        self.capacity = capacity
        self._cache: dict[Any, int] = {}
        workers = int(peers.owners.max()) + 1 if isinstance(peers, RoutingTable) else peers
        self._bytes = workers <= BYTE_ROUTES
        self._missed: bool | None = None  # the last batch held new keys (None: mostly, or none yet)

    def routes(self, batch: list[Any]) -> Sequence[int]:
        """Worker index per record of ``batch``: one byte each (``bytes``) for up to
        ``BYTE_ROUTES`` workers, else a ``list``."""
        keys = batch if self.key is None else list(map(self.key, batch))
        cache = self._cache
        if not self._bytes:
            try:
                return list(map(cache.__getitem__, keys))
            except KeyError:
                self._learn(set(keys).difference(cache), keys)
                return list(map(cache.__getitem__, keys))
        if self._missed is None:  # the last batch was mostly new keys: so is this one, likely
            return self._learn_all(keys)
        if not self._missed and len(keys) > 1:
            try:  # one C call for all lookups (a tuple): the fastest pass when all are known
                return bytes(itemgetter(*keys)(cache))
            except KeyError:
                pass
        routes = bytes(map(cache.get, keys, repeat(_UNSEEN)))
        self._missed = _UNSEEN in routes
        if not self._missed:
            return routes
        at = np.flatnonzero(np.frombuffer(routes, dtype=np.uint8) == _UNSEEN)
        if 4 * len(at) > len(keys):
            return self._learn_all(keys)
        unseen = itemgetter(*at.tolist())(keys) if len(at) > 1 else (keys[at[0]],)
        if not self._learn(set(unseen), keys):  # the memo was cleared
            return bytes(map(cache.__getitem__, keys))
        patched = np.frombuffer(routes, dtype=np.uint8).copy()
        patched[at] = np.fromiter(map(cache.__getitem__, unseen), dtype=np.uint8, count=len(at))
        return patched.tobytes()

    def _learn_all(self, keys: list[Any]) -> bytes:
        """Routes of a batch of mostly new ``keys``: memoize the new ones, look all up."""
        cache = self._cache
        distinct = set(keys)
        missing = distinct.difference(cache)
        self._learn(missing, keys)
        self._missed = None if 4 * len(missing) > len(distinct) else True
        return bytes(map(cache.__getitem__, keys))

    def _learn(self, missing: set[Any], keys: list[Any]) -> bool:
        """Hash and memoize ``missing`` (keys of the batch ``keys`` the memo does not hold);
        when that would pass ``capacity``, clear the memo and memoize every key of ``keys``
        instead.  False when the memo was cleared."""
        cache = self._cache
        kept = len(cache) + len(missing) <= self.capacity
        if not kept:
            cache.clear()
            missing = set(keys)
        fresh = list(missing)
        for k, r in zip(fresh, route_hashes(stable_hash(fresh), self.peers).tolist(), strict=True):
            cache[k] = r
        return kept


BYTE_ROUTES = 255
"""Most workers whose routes ``KeyRouter`` packs one byte a record (byte 255 marks a key the
memo has not seen)."""
_UNSEEN = 255


def _beyond(worker: int, peers: int) -> ValueError:
    """A route to ``worker`` in a split for ``peers`` workers: its records would be dropped
    (e.g. a splitter sized by the workers at build time while workers joined since)."""
    return ValueError(f"a record is routed to worker {worker}, beyond the {peers} workers the "
                      f"batch is split for")


def _last(peers: int, last: int | None) -> list[int]:
    """Worker indices ``0..peers-1`` with ``last`` (when one of them) moved to the end."""
    order = list(range(peers))
    if last is not None and 0 <= last < peers:
        order.append(order.pop(last))
    return order


def partition_list(batch: list[Any], routes: Sequence[int], peers: int, last: int | None = None,
                   before_last: Callable[[], None] | None = None) -> Iterator[tuple[int, list[Any]]]:
    """Split ``batch`` by ``routes`` (a ``list``, or ``bytes``: one byte per record) into
    ``(worker, part)`` pairs (non-empty parts only, in worker order but ``last``'s part at the
    end, each part keeping the batch's order).  Parts are built as they are taken;
    ``before_last`` is called before ``last``'s part is built when other parts came first (an
    exchange sends those to their workers there, before splitting off its own).

    C-level passes only: with up to ``MASKED_PEERS`` workers, per worker a ``translate`` of
    the route bytes into a 0/1 mask and an ``itertools.compress`` by it; beyond, a stable
    ``sorted`` of the record indices by route and one ``itemgetter``.
    """
    n = len(batch)
    if peers <= MASKED_PEERS:
        mask = routes if isinstance(routes, bytes) else bytes(routes)
        counts = np.bincount(np.frombuffer(mask, dtype=np.uint8), minlength=peers).tolist()
        if len(counts) > peers:
            raise _beyond(len(counts) - 1, peers)
        for worker in _last(peers, last):
            count = counts[worker]
            if count == n:
                yield worker, batch
            elif count:
                if worker == last and before_last is not None:
                    before_last()
                yield worker, list(compress(batch, mask.translate(_SELECT[worker])))
        return
    routes = list(routes)
    first = routes[0]
    count_first = routes.count(first)
    if count_first == n:
        yield first, batch
        return
    order = sorted(range(n), key=routes.__getitem__)
    reordered = itemgetter(*order)(batch)
    start = 0
    parts = []
    for worker in range(peers):
        c = count_first if worker == first else routes.count(worker)
        if c:
            parts.append((worker, list(reordered[start : start + c])))
            start += c
    if start != n:
        raise _beyond(max(routes), peers)
    parts.sort(key=lambda part: part[0] == last)  # stable: worker order, ``last`` at the end
    for k, (worker, part) in enumerate(parts):
        if k and worker == last and before_last is not None:
            before_last()
        yield worker, part


MASKED_PEERS = 16
"""Most workers ``partition_list`` splits for with one mask pass per worker."""
_SELECT = [bytes(w) + b"\1" + bytes(255 - w) for w in range(MASKED_PEERS)]
"""``translate`` tables: byte ``w`` becomes 1, every other byte 0."""


def partition_arrow(batch: Any, routes: np.ndarray, peers: int, last: int | None = None,
                    before_last: Callable[[], None] | None = None) -> Iterator[tuple[int, Any]]:
    """Split an Arrow batch by ``routes`` into ``(worker, part)`` pairs (non-empty only, in
    worker order but ``last``'s part at the end; ``before_last`` as in ``partition_list``).

    Large batches on few workers take one vectorized selection per worker; otherwise the rows
    are put in worker order with one stable radix ``argsort`` of the routes and one ``take``,
    and each part is a zero-copy slice (four vector calls: cheapest for the small batches
    exchanges mostly carry; the ``take`` wraps the order without a conversion and calls the
    function looked up once, three GIL releases instead of six).
    """
    counts = np.bincount(routes, minlength=peers).tolist()
    if len(counts) > peers:
        raise _beyond(len(counts) - 1, peers)
    n = len(batch)
    if max(counts) == n:
        yield counts.index(n), batch
        return
    if peers <= 8 and n > 16_384:
        for worker in _last(peers, last):
            if counts[worker]:
                if worker == last and before_last is not None:
                    before_last()
                yield worker, batch.take(np.flatnonzero(routes == worker))
        return
    narrow = routes.astype(np.uint8 if peers <= 256 else np.uint16 if peers <= 65_536 else np.int64)
    order = np.argsort(narrow, kind="stable").astype(np.int64, copy=False)
    indices = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(order)])
    reordered = _TAKE.call([batch, indices])
    starts = np.cumsum([0, *counts]).tolist()
    for worker in _last(peers, last):
        if counts[worker]:
            if worker == last and before_last is not None:
                before_last()
            yield worker, reordered.slice(starts[worker], counts[worker])


def partition_batch(
    batch: Any, peers: int, key: Callable[[Any], Any] | None, column: str | None,
    router: KeyRouter | None = None, table: RoutingTable | None = None, last: int | None = None,
    before_last: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Split ``batch`` into ``(worker, part)`` pairs for ``peers`` workers, skipping empty
    parts, in worker order but ``last``'s part at the end, built after the others are taken
    and after a call of ``before_last`` (see ``partition_list``); routes through ``table``
    (key -> bin -> owner) when given, else by ``routes_for``.  A ``router`` keeps its own
    target (the table it was made with).

    Raises:
        KeyError: when ``column`` is not a column of the Arrow batch.
        TypeError: for a batch that is neither a ``list`` nor an Arrow batch.
    """
    if len(batch) == 0:
        return
    if isinstance(batch, (pa.RecordBatch, pa.Table)):
        if column is not None:
            if column not in batch.schema.names:
                raise KeyError(f"exchange column {column!r} not in batch columns "
                               f"{batch.schema.names}")
            target: Target = table if table is not None else peers
            routes = column_routes(batch.column(column), target,
                                   router._cache if router is not None else None)
        else:
            rows = batch.to_pylist()
            routes = route_hashes(stable_hash(rows if key is None else [key(r) for r in rows]),
                                  table if table is not None else peers)
        yield from partition_arrow(batch, routes, peers, last, before_last)
        return
    if not isinstance(batch, list):
        raise TypeError(f"batches are lists or Arrow record batches, got {type(batch).__name__}")
    if router is None:
        router = KeyRouter(key, table if table is not None else peers)
    yield from partition_list(batch, router.routes(batch), peers, last, before_last)
