"""Channel state of an aligned checkpoint: the messages an operator sent at or after the
checkpoint's epoch before its worker captured its state.

Source: Chandy and Lamport, "Distributed Snapshots: Determining Global States of Distributed
Systems" (ACM TOCS 1985: a consistent global state is the processes' states plus the messages
in flight across the cut, recorded per channel); Flink's unaligned checkpoints persist
in-flight buffers the same way.  The protocol around it is ``tokenflow.control``.

An aligned checkpoint at epoch ``e`` captures each worker once every time before ``e`` is done
on it.  An operator may still send at a time ``>= e`` before that capture: Q4's closing
auctions send their winners at ``expires`` as soon as the bid frontier reaches it, and about
half of Q4's epoch boundaries are some auction's ``expires``.  The receiver sets such a
message aside at its barrier (``Traffic``), so the sender's state no longer holds what the
message carries while the receiver's capture does not hold it either: without channel state
the captures are not a consistent cut and the checkpoint is taken again.

Here the sender records each message it pushes at a time at or after its barrier while the
barrier is up (``OperatorOutput``, ``Traffic.crossing``); at the capture, those at or after
``e`` are left out of its ``sent`` count and stored with its part as this state, under its
home bin.  A worker restoring the snapshot that owns that bin loads them, and each operator
pushes its own again on its first scheduling, from its output port and with its initial
tokens still held, so progress tracking counts them as that operator's output at their times.
Nothing else changes: in the running job the messages went on as usual, after the receivers'
captures.

Layout: one Arrow table per home bin, ``path`` (the operator's path, ``"0.5"``), ``port``
(int32, its output port) and ``message`` (``pickle`` of ``(time, batch)``: the snapshot is the
job's own storage, as for its definition).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from tokenflow.dataflow.state import BinnedState

KEY = "tokenflow.channels"
"""The state's key in a snapshot."""

SCHEMA = pa.schema([("path", pa.string()), ("port", pa.int32()), ("message", pa.large_binary())])

Entry = tuple[tuple[int, ...], int, Any]
"""``(operator path, output port, (time, batch))``."""


class ChannelState(BinnedState):
    """The messages a worker's operators sent across an aligned checkpoint's cut (``record`` at
    each capture), and, on a restored worker, those loaded for its operators to send again
    (``take``)."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._loaded: dict[tuple[int, ...], list[tuple[int, Any]]] = {}
        self._changed: set[int] = set()
        # bins loaded from a snapshot: their messages are pushed again now, so the next
        # checkpoint writes them empty (unless this worker's own capture has some there)
        self._stale: set[int] = set()

    def record(self, entries: list[Entry]) -> None:
        """The messages of the capture being taken (replacing the previous capture's)."""
        if entries or self._entries:
            self._changed.add(self.home_bin)
        self._entries = list(entries)

    def take(self, path: tuple[int, ...]) -> list[tuple[int, Any]]:
        """The restored ``(port, (time, batch))`` messages of the operator at ``path``, once."""
        return self._loaded.pop(tuple(path), [])

    def export(self, bins: Iterable[int] | None = None) -> Mapping[int, pa.Table]:
        wanted = None if bins is None else set(bins)
        if not self._entries or (wanted is not None and self.home_bin not in wanted):
            return {}
        table = pa.table({
            "path": [".".join(map(str, path)) for path, _, _ in self._entries],
            "port": pa.array([port for _, port, _ in self._entries], pa.int32()),
            "message": pa.array([pickle.dumps(m, protocol=5) for _, _, m in self._entries],
                                pa.large_binary()),
        }, schema=SCHEMA)
        return {self.home_bin: table}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        for b, table in parts.items():
            self._stale.add(b)
            for path, port, message in zip(table.column("path").to_pylist(),
                                           table.column("port").to_pylist(),
                                           table.column("message").to_pylist(), strict=True):
                key = tuple(int(p) for p in path.split("."))
                self._loaded.setdefault(key, []).append((int(port), pickle.loads(message)))

    def discard(self, bins: Iterable[int]) -> None:
        return None  # worker-local: nothing moves with bins

    def take_changes(self) -> set[int]:
        changed = self._changed | self._stale
        self._changed, self._stale = set(), set()
        return changed
