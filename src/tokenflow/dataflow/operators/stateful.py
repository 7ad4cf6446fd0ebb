"""Stateful operators whose state lives in bins: ``stateful_unary``, ``stateful_binary`` and
the per-key ``state_machine``.

Source: Megaphone (Hoffmann et al., VLDB 2019: ``stateful_unary`` / ``stateful_binary`` whose
logic sees the state of the bins it owns, and ``state_machine``); timely dataflow's
``aggregation/state_machine.rs`` (records stashed per time and applied in time order once the
input frontier passes the time); the timestamp-tokens paper §5 (one token per pending time).

Records are exchanged by key through the job's routing table (``key -> bin -> worker``), so all
records of a key meet on the owner of its bin, and its state is there.  Each operator keeps:

* the user's ``KeyedState`` (``key -> value``), and
* ``PendingRecords``: records received per logical time, waiting for the input frontier to pass
  that time; the operator holds one token per pending time (``pending_times()``), so a restored
  operator re-mints exactly those tokens.

When the input frontier passes a pending time ``t`` (no more records at ``t`` can arrive), the
operator hands ``t``'s records to the logic, in time order, and sends what it produces at
``t``.  Both states are declared with ``OperatorBuilder.state``, so a snapshot holds them per
bin and a job restored at another worker count loads the bins each worker owns.

Times: any partially ordered times (pending times complete in an order compatible with it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorBuilder, OperatorInput, Session
from tokenflow.dataflow.routing import column_hashes
from tokenflow.dataflow.state import (
    BinnedState,
    KeyedState,
    TrackedDict,
    group_by_bin,
    key_bins,
    pickled,
    split_by_bin,
    unpickled,
)
from tokenflow.state.bins import bins_of

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream

Key = Callable[[Any], Any]


class PendingRecords(BinnedState):
    """Batches received per logical time that wait for the frontier to pass it.

    ``key`` (list records) or ``column`` (Arrow batches) gives each record's key, from which
    ``export`` computes its bin; the pending times are the held tokens' times.
    """

    def __init__(self, key: Key | None, column: str | None) -> None:
        self.by_time: dict[Any, list[Any]] = {}
        self._key = key
        self._column = column

    def add(self, time: Any, batch: Any) -> None:
        self.by_time.setdefault(time, []).append(batch)

    def pop(self, time: Any) -> list[Any]:
        return self.by_time.pop(time, [])

    def pending_times(self) -> list[Any]:
        return list(self.by_time)

    def _bins(self, batch: Any) -> np.ndarray:
        if isinstance(batch, (pa.RecordBatch, pa.Table)):
            if self._column is None:
                keys = batch.to_pylist()
                return key_bins(keys if self._key is None else [self._key(r) for r in keys],
                                self.bins)
            return bins_of(column_hashes(batch.column(self._column)), self.bins)
        keys = batch if self._key is None else [self._key(r) for r in batch]
        return key_bins(keys, self.bins)

    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        parts: dict[int, dict[Any, list[Any]]] = {}
        for time, batches in self.by_time.items():
            for batch in batches:
                if isinstance(batch, list):
                    split: Mapping[int, Any] = group_by_bin(batch, self._bins(batch), bins)
                else:
                    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
                    split = split_by_bin(table, self._bins(batch), bins)
                for b, part in split.items():
                    parts.setdefault(b, {}).setdefault(time, []).append(part)
        return {b: pickled(by_time) for b, by_time in parts.items()}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        for b in sorted(parts):
            for by_time in unpickled(parts[b]):
                for time, batches in by_time.items():
                    self.by_time.setdefault(time, []).extend(batches)


def _records(batches: list[Any]) -> Any:
    """The batches of one time as one batch: a list, or one Arrow table."""
    if not batches:
        return []
    if all(isinstance(b, list) for b in batches):
        return batches[0] if len(batches) == 1 else list(chain.from_iterable(batches))
    tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in batches]
    return pa.concat_tables(tables, promote_options="permissive")


class _TimeTokens:
    """One token per pending time, minted from a message's ref (or, after a restore, from
    the operator's initial token)."""

    __slots__ = ("tokens",)

    def __init__(self, initial: Capability, times: Iterable[Any]) -> None:
        self.tokens: dict[Any, Capability] = {t: initial.delayed(t) for t in times}

    def hold(self, ref: Any) -> None:
        if ref.time not in self.tokens:
            self.tokens[ref.time] = ref.retain()

    def ready(self, inputs: list[OperatorInput]) -> list[Any]:
        """Pending times no input frontier can still reach, in an order compatible with the
        partial order: Python's ``<`` on ``int`` and on ``Product`` (a tuple, compared
        lexicographically) extends the product order, so sorting is enough."""
        return sorted(t for t in self.tokens if not any(i.frontier.less_equal(t) for i in inputs))


def _stateful(name: str, streams: list[Stream], keys: list[Key | None], columns: list[str | None],
              logic: Callable[..., Any], state: KeyedState[Any, Any] | None) -> Stream:
    scope = streams[0].scope
    builder = OperatorBuilder(name, scope)
    inputs = [builder.new_input(s, Exchange(k, c)) for s, k, c in zip(streams, keys, columns, strict=True)]
    output, out_stream = builder.new_output()
    values = builder.state("keys", state if state is not None else KeyedState())
    pending = [builder.state(f"pending{i}", PendingRecords(k, c))
               for i, (k, c) in enumerate(zip(keys, columns, strict=True))]

    def constructor(capabilities: list[Capability]) -> Any:
        initial = capabilities[0]
        tokens = _TimeTokens(initial, {t for p in pending for t in p.pending_times()})
        initial.drop()

        def run(frontiers: Any) -> None:
            for inp, held in zip(inputs, pending, strict=True):
                for ref, batch in inp:
                    if len(batch):
                        tokens.hold(ref)
                        held.add(ref.time, batch)
            for t in tokens.ready(inputs):
                cap = tokens.tokens.pop(t)
                records = [_records(held.pop(t)) for held in pending]
                with output.session(cap) as session:
                    logic(t, *records, values, session)
                cap.drop()

        return run

    builder.build(constructor)
    return out_stream


def stateful_unary(stream: Stream, logic: Callable[[Any, Any, KeyedState[Any, Any], Session], Any],
                   key: Key | None = None, column: str | None = None, name: str = "StatefulUnary",
                   state: KeyedState[Any, Any] | None = None) -> Stream:
    """A keyed operator whose logic sees the state of the bins this worker owns.

    Records are exchanged by ``key(record)`` (list batches; None: the record itself) or by the
    Arrow ``column``, and stashed per time.  Once the input frontier has passed a time ``t``
    (in time order), ``logic(t, records, state, session)`` runs once with all of this
    worker's records at ``t`` (a ``list``, or a ``pa.Table`` for Arrow batches), the
    ``KeyedState`` ``state`` (``key -> value``, any picklable values, keyed like the exchange)
    and a ``Session`` at ``t``; whatever it gives goes out at time ``t``.

    Both the stash and ``state`` are snapshotted per bin and restored (at any worker count)
    with the job; tokens: one per stashed time.

    Raises:
        whatever ``logic`` raises; ``KeyError`` for an unknown ``column``.
    """
    return _stateful(name, [stream], [key], [column], logic, state)


def stateful_binary(left: Stream, right: Stream,
                    logic: Callable[[Any, Any, Any, KeyedState[Any, Any], Session], Any],
                    key_left: Key | None = None, key_right: Key | None = None,
                    column_left: str | None = None, column_right: str | None = None,
                    name: str = "StatefulBinary", state: KeyedState[Any, Any] | None = None) -> Stream:
    """Two keyed inputs sharing one ``KeyedState`` (e.g. a join keeping both sides).

    Like ``stateful_unary``: records of both inputs are exchanged by their keys and stashed
    per time; once both input frontiers have passed ``t``, ``logic(t, left_records,
    right_records, state, session)`` runs once (either side may be empty).
    """
    return _stateful(name, [left, right], [key_left, key_right], [column_left, column_right],
                     logic, state)


REMOVE = object()
"""Returned as the new value by a ``state_machine`` fold to forget the key."""


def fold_records(records: Iterable[Any], data: dict[Any, Any],
                 fold: Callable[[Any, Any, Any], tuple[Any, Iterable[Any]]],
                 get_key: Key, whole: bool, session: Session) -> None:
    """Apply a ``state_machine`` fold to ``records`` in order: ``fold(key, value, current)``
    with ``value`` the record itself when ``whole``, else ``record[1]``; the new value replaces
    the key's (``REMOVE`` forgets it) and the outputs go to ``session``.

    A ``KeyedState``'s ``TrackedDict`` is updated through the plain ``dict`` methods, each key
    marked in its ``touched`` record (measured: through its overriding methods this loop took
    2.7x as long as over a plain ``dict``; this way about 1.06x)."""
    mark: Callable[[Any], None] | None = None
    if isinstance(data, TrackedDict):
        mark = data.touched.add
        get, put, pop = (dict.get.__get__(data), dict.__setitem__.__get__(data),
                         dict.pop.__get__(data))
    else:
        get, put, pop = data.get, data.__setitem__, data.pop
    for record in records:
        k = get_key(record)
        if mark is not None:
            mark(k)
        new, outputs = fold(k, record if whole else record[1], get(k))
        if new is REMOVE:
            pop(k, None)
        else:
            put(k, new)
        session.give_iterator(outputs)
    if isinstance(data, TrackedDict):
        data.maybe_flush()  # fold the marks into the state's bin index once they are many


def state_machine(stream: Stream, fold: Callable[[Any, Any, Any], tuple[Any, Iterable[Any]]],
                  key: Key | None = None, name: str = "StateMachine",
                  state: KeyedState[Any, Any] | None = None) -> Stream:
    """A per-key fold over ``(key, value)`` records (timely's ``state_machine``).

    For each record, in time order (records of one time in arrival order on the key's worker),
    ``fold(key, value, current)`` returns ``(new, outputs)``: ``current`` is the key's value
    (None the first time), ``new`` replaces it (``REMOVE`` forgets the key) and ``outputs``
    (an iterable of records) is sent at the record's time.  ``key`` extracts the key from a
    record (default ``record[0]``; the value is then ``record[1]``).

    Example: a running word count emitting ``(word, count)`` each time a word is seen::

        counts = pairs.state_machine(lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
    """
    get_key = key if key is not None else (lambda r: r[0])

    def logic(t: Any, records: list[Any], values: KeyedState[Any, Any], session: Session) -> None:
        fold_records(records, values.data, fold, get_key, key is not None, session)

    return _stateful(name, [stream], [get_key], [None], logic, state)


__all__ = ["REMOVE", "PendingRecords", "state_machine", "stateful_binary", "stateful_unary"]
