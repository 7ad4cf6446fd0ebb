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


def partition_batch(
    batch: Any, peers: int, key: Callable[[Any], Any] | None, column: str | None
) -> Iterator[tuple[int, Any]]:
    """Split ``batch`` into ``(worker, part)`` pairs, skipping empty parts.

    Raises:
        KeyError: when ``column`` is not a column of the Arrow batch.
        TypeError: for a batch that is neither a ``list`` nor an Arrow batch.
    """
    n = len(batch)
    if n == 0:
        return
    if isinstance(batch, (pa.RecordBatch, pa.Table)):
        if column is not None:
            if column not in batch.schema.names:
                raise KeyError(f"exchange column {column!r} not in batch columns "
                               f"{batch.schema.names}")
            values = batch.column(column).to_numpy(zero_copy_only=False)
        else:
            assert key is not None
            values = np.asarray([key(r) for r in batch.to_pylist()])
        routes = routes_for(stable_hash(values), peers)
        for worker in range(peers):
            idx = np.flatnonzero(routes == worker)
            if len(idx):
                yield worker, batch.take(pa.array(idx))
        return
    if not isinstance(batch, list):
        raise TypeError(f"batches are lists or Arrow record batches, got {type(batch).__name__}")
    if key is None:
        raise TypeError("a list batch needs an exchange key function (column= is for Arrow)")
    routes = routes_for(stable_hash([key(r) for r in batch]), peers)
    order = np.argsort(routes, kind="stable")
    counts = np.bincount(routes, minlength=peers)
    if n == 1:
        yield int(routes[0]), batch
        return
    reordered = itemgetter(*order.tolist())(batch)
    start = 0
    for worker in range(peers):
        c = int(counts[worker])
        if c:
            yield worker, list(reordered[start : start + c])
            start += c
