"""Stable, vectorized routing of batch records to workers (the exchange pact's hash).

Source: DESIGN.md ("Data plane": "Exchange routes by a stable hash, never Python's salted
``hash()`` of str").  The hash is defined here, the same in every process, on every runtime and
for list and Arrow batches alike, so a key meets itself whichever stream it travels on:

* integers (``int`` keys, integer columns): ``mix64(value as uint64)``;
* strings and bytes: ``mix64(FNV-1a 64 of the UTF-8 bytes)``;
* anything else: the string hash of ``str(key)``;

where ``mix64`` is the SplitMix64 finalizer (so ``hash % peers`` spreads evenly).  Strings are
hashed with numpy over the Arrow buffers, one vector operation per byte position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over a uint64 array (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def hash_strings(array: pa.Array) -> np.ndarray:
    """``mix64(FNV-1a 64)`` of each value's bytes for an Arrow string/binary array (nulls → 0)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    out = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return out
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + n + 1].astype(np.int64)
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, np.uint8))
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    order = np.argsort(-lengths, kind="stable")  # longest first: active lanes form a prefix
    starts_sorted = starts[order]
    lengths_sorted = lengths[order]
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    longest = int(lengths_sorted[0]) if n else 0
    # active[k] = number of values longer than k
    active = np.searchsorted(-lengths_sorted, -np.arange(longest), side="left")
    with np.errstate(over="ignore"):
        for k in range(longest):
            m = int(active[k])
            h[:m] ^= data[starts_sorted[:m] + k]
            h[:m] *= FNV_PRIME
    out[order] = mix64(h)
    if array.null_count:
        out[np.asarray(array.is_null())] = 0
    return out


def hash_ints(values: np.ndarray) -> np.ndarray:
    """``mix64`` of int64 values."""
    return mix64(values.astype(np.int64, copy=False).view(np.uint64))


def stable_hash(keys: Sequence[Any] | np.ndarray) -> np.ndarray:
    """64-bit hashes of ``keys``, equal across processes, runtimes and batch layouts.

    Integers (within int64) hash by value, strings by their UTF-8 bytes, everything else by its
    ``str`` form — so ``1`` and ``"1"`` differ but each is stable.
    """
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iub":
        return hash_ints(keys)
    try:  # the common cases convert in C: all strings, or all int64
        array = pa.array(keys)
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            return hash_strings(array)
        if pa.types.is_integer(array.type) and array.null_count == 0:
            return hash_ints(array.to_numpy())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    keys = list(keys)
    out = np.zeros(len(keys), dtype=np.uint64)
    ints = [i for i, k in enumerate(keys)
            if type(k) in (int, bool) or isinstance(k, np.integer)]
    ints = [i for i in ints if _INT64_MIN <= int(keys[i]) <= _INT64_MAX]
    if ints:
        out[ints] = hash_ints(np.array([int(keys[i]) for i in ints], dtype=np.int64))
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
    """Worker index per hash: ``hash % peers`` as int64."""
    return (hashes % np.uint64(peers)).astype(np.int64)


def _string_like(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)
    )


def column_routes(column: pa.Array | pa.ChunkedArray, peers: int) -> np.ndarray:
    """Worker index per row of an Arrow column, vectorized (nulls route to worker 0).

    String and binary columns are dictionary-encoded first so each distinct value is hashed
    once; integer columns hash their values; other types hash their string form.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if _string_like(kind):
        encoded = column.dictionary_encode()
        per_value = routes_for(hash_strings(encoded.dictionary), peers)
        indices = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
        routes = per_value[indices] if len(per_value) else np.zeros(len(column), np.int64)
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        values = column.fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False)
        routes = routes_for(hash_ints(values), peers)
    else:
        routes = routes_for(hash_strings(column.cast(pa.string())), peers)
    if column.null_count:
        routes = np.where(np.asarray(column.is_null()), 0, routes)
    return routes


class KeyRouter:
    """Stable routing of list-batch records by ``key(record)``, memoized per distinct key.

    ``key=None`` routes by the record itself.
    Hashing runs vectorized over the keys not seen before; known keys cost one dict lookup.
    The memo is cleared when it holds ``capacity`` keys.
    """

    __slots__ = ("key", "peers", "capacity", "_cache")

    def __init__(self, key: Callable[[Any], Any] | None, peers: int,
                 capacity: int = 1 << 20) -> None:
        self.key = key
        self.peers = peers
        self.capacity = capacity
        self._cache: dict[Any, int] = {}

    def routes(self, batch: list[Any]) -> list[int]:
        """Worker index per record of ``batch``."""
        keys = batch if self.key is None else list(map(self.key, batch))
        cache = self._cache
        try:
            return list(map(cache.__getitem__, keys))
        except KeyError:
            pass
        missing = [k for k in dict.fromkeys(keys) if k not in cache]
        if len(cache) + len(missing) > self.capacity:
            cache.clear()
            missing = list(dict.fromkeys(keys))
        for k, r in zip(missing, routes_for(stable_hash(missing), self.peers).tolist(), strict=True):
            cache[k] = r
        return list(map(cache.__getitem__, keys))


def partition_list(batch: list[Any], routes: list[int], peers: int) -> Iterator[tuple[int, list[Any]]]:
    """Split ``batch`` by ``routes`` into ``(worker, part)`` pairs (non-empty parts only)."""
    n = len(batch)
    if n == 1:
        yield routes[0], batch
        return
    arr = np.array(routes, dtype=np.int64)
    first = routes[0]
    if not (arr != first).any():
        yield first, batch
        return
    order = np.argsort(arr, kind="stable")
    counts = np.bincount(arr, minlength=peers)
    reordered = itemgetter(*order.tolist())(batch)
    start = 0
    for worker in range(peers):
        c = int(counts[worker])
        if c:
            yield worker, list(reordered[start : start + c])
            start += c


def partition_arrow(batch: Any, routes: np.ndarray, peers: int) -> Iterator[tuple[int, Any]]:
    """Split an Arrow batch by ``routes`` into ``(worker, part)`` pairs (non-empty only)."""
    order = np.argsort(routes, kind="stable")
    counts = np.bincount(routes, minlength=peers)
    if (counts == len(batch)).any():
        yield int(np.argmax(counts)), batch
        return
    reordered = batch.take(pa.array(order))
    start = 0
    for worker in range(peers):
        c = int(counts[worker])
        if c:
            yield worker, reordered.slice(start, c)
            start += c


def partition_batch(
    batch: Any, peers: int, key: Callable[[Any], Any] | None, column: str | None,
    router: KeyRouter | None = None,
) -> Iterator[tuple[int, Any]]:
    """Split ``batch`` into ``(worker, part)`` pairs, skipping empty parts.

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
            routes = column_routes(batch.column(column), peers)
        else:
            rows = batch.to_pylist()
            routes = routes_for(stable_hash(rows if key is None else [key(r) for r in rows]), peers)
        yield from partition_arrow(batch, routes, peers)
        return
    if not isinstance(batch, list):
        raise TypeError(f"batches are lists or Arrow record batches, got {type(batch).__name__}")
    if router is None:
        router = KeyRouter(key, peers)
    yield from partition_list(batch, router.routes(batch), peers)
