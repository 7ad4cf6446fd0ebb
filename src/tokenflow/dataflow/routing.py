"""Stable, vectorized routing of batch records to workers (the exchange pact's hash).

Source: DESIGN.md ("Data plane": "Exchange routes by a stable hash, never Python's salted
``hash()`` of str").  Keys are hashed with ``pandas.util.hash_array`` (SipHash with a fixed key),
which is the same in every process and runs per batch in C.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
from pandas.util import hash_array


def stable_hash(keys: Any) -> np.ndarray:
    """64-bit hashes of ``keys`` (a sequence or array), equal across processes and runs.

    Integers hash as int64 values, everything else by its ``str`` form (so ``1`` and ``"1"``
    differ but each is stable).
    """
    arr = keys if isinstance(keys, np.ndarray) else np.asarray(keys)
    kind = arr.dtype.kind
    if kind in "iub":
        return hash_array(arr.astype(np.int64, copy=False))
    if kind == "f":
        return hash_array(arr.astype(np.float64, copy=False))
    if kind != "O":
        arr = arr.astype(object)
    else:
        arr = np.array([k if isinstance(k, str) else str(k) for k in arr], dtype=object)
    return hash_array(arr)


def routes_for(hashes: np.ndarray, peers: int) -> np.ndarray:
    """Worker index per hash: ``hash % peers`` as int64."""
    return (hashes % np.uint64(peers)).astype(np.int64)


def _string_like(dtype: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)
    )


def column_routes(column: pa.Array | pa.ChunkedArray, peers: int) -> np.ndarray:
    """Worker index per row of an Arrow column, vectorized.

    String and binary columns are dictionary-encoded first so each distinct value is hashed
    once; integer columns hash their values directly.  Nulls route to worker 0.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if _string_like(column.type):
        encoded = column.dictionary_encode()
        dictionary = encoded.dictionary.to_numpy(zero_copy_only=False).astype(object)
        per_value = routes_for(stable_hash(dictionary), peers)
        indices = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
        routes = per_value[indices] if len(per_value) else np.zeros(len(column), np.int64)
    else:
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        routes = routes_for(stable_hash(values), peers)
    if column.null_count:
        routes = np.where(column.is_null().to_numpy(zero_copy_only=False), 0, routes)
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
