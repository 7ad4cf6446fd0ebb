"""The latest row per key of a published stream, for subscribers that join with a snapshot.

Beyond the Strymon protocol (where a late subscriber gets no state and must wait for the next
latent epoch): a stream whose rows are *upserts* by a key (a running count per word, the
current price per auction) can be summarized by its latest row per key.  A publisher with
``publish(topic, key=[...])`` folds the epochs its retention lets go into that table; a
subscriber joining with ``start="snapshot"`` asks for the table *as of a frontier* ``C`` (the
minimal antichain of all partitions' lower frontiers, so every partition has completed every
epoch it covers): the folded table plus the retained epochs that ``C`` has passed, then every
epoch ``≥ C`` as usual.  Like Materialize's ``SUBSCRIBE ... AS OF`` followed by updates.

Shapes: frames are ``tokenflow.pubsub.wire`` DATA frames; the table is a ``pyarrow.Table`` with
the stream's schema; "latest" is the order frames were produced in.  Work is per batch (an
Arrow ``group_by`` over a row index), never per row in Python.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from tokenflow.pubsub import wire

_INDEX = "__tokenflow_row"


def latest_per_key(table: pa.Table, key: list[str]) -> pa.Table:
    """The last row of ``table`` for each distinct ``key`` (order of last occurrence kept)."""
    if table.num_rows == 0:
        return table
    indexed = table.append_column(_INDEX, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    last = indexed.group_by(key, use_threads=False).aggregate([(_INDEX, "max")])
    rows = np.sort(last.column(f"{_INDEX}_max").to_numpy())
    return table.take(pa.array(rows))


def frame_batch(frame: bytes) -> pa.RecordBatch:
    """The Arrow batch of a DATA frame."""
    _, meta_len, body_len = wire.HEADER.unpack_from(frame)
    return wire.decode_batch(frame[wire.HEADER.size + meta_len:])


def as_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch."""
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema) if not batches else \
        pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class KeyedCompaction:
    """The folded table of one publisher partition.

    Args:
        key: the key columns.

    Raises (from ``fold``):
        ValueError: a batch lacks a key column.
    """

    def __init__(self, key: list[str]) -> None:
        self.key = list(key)
        self.table: pa.Table | None = None

    def _merged(self, frames: Iterable[bytes]) -> pa.Table | None:
        batches = [frame_batch(f) for f in frames]
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return self.table
        for name in self.key:
            if name not in batches[0].schema.names:
                raise ValueError(f"snapshot key column {name!r} is not in the published schema "
                                 f"{batches[0].schema.names}")
        parts = ([self.table] if self.table is not None else []) + [pa.Table.from_batches([b])
                                                                    for b in batches]
        return latest_per_key(pa.concat_tables(parts, promote_options="permissive"), self.key)

    def fold(self, frames: Iterable[bytes]) -> None:
        """Fold DATA frames (of epochs let go, oldest first) into the table."""
        self.table = self._merged(frames)

    def snapshot(self, frames: Iterable[bytes]) -> pa.Table | None:
        """The table with ``frames`` (complete epochs still retained) folded in, leaving the
        folded table as it is; None when there is nothing."""
        return self._merged(frames)
