"""Migrating keyed operators: Megaphone's router in front of any operator whose state is a
``BinnedState`` keyed by the columns its inputs are exchanged by.

Source: Hoffmann, Lattuada, McSherry et al., *Megaphone* (VLDB 2019: F routes by a routing
table that changes at logical times and hands a bin's state over at the time of its move);
the timestamp-tokens paper §5 (an operator holds tokens for the times its state has pending
work; a state restored elsewhere re-mints them); docs/ARCHITECTURE.md ("Elasticity").

``keyed_operator(inputs, columns, name, constructor, elastic)`` builds the same operator as
``unary_frontier`` / ``binary_frontier`` with ``Exchange(column=c)`` pacts (``elastic`` None),
or, with an ``Elastic``, a migrating one:

* **F** (``megaphone.router``) takes the place of the exchanges: it routes each Arrow batch by
  the bin of its key column through the routing table version in effect at the batch's time.
  For a move of bin ``b`` away from its worker at ``t`` it holds a token at ``t`` on every input
  of the operator, waits until the operator has applied every record before ``t`` (its input
  frontier has no time ``< t``; it has then also done everything its frontier at ``t``
  allows, e.g. closed the windows ending at or before ``t``), takes the bin's state out of the
  operator's state (``take`` when the state has one, else ``export`` + ``discard``) and sends
  it at ``t`` to the new owner.
* **S** is the operator itself, built from the same ``constructor``: its inputs unwrap F's
  records; a state message is queued with a token held at its time ``t`` and loaded
  (``BinnedState.load``) in slices of bins, about ``megaphone.SLICE_SECONDS`` of loading per
  invocation (``megaphone.LoadQueue``); until a time's parts are all in, the input frontiers
  the operator sees stay at ``t`` (``megaphone.ClampedFrontier``), and then the operator's
  tokens *adopt* the loaded state's pending times (``HeldTokens.adopt``: tokens minted from
  the held token at ``t``; pending times are ``>= t``) and the held token is dropped.
  After a take, the old owner's tokens *release* the times its remaining state no longer
  needs (``HeldTokens.release``), before the operator's next invocation.

Why loading as it arrives is correct: records of a moved bin at times ``>= t`` reach only
the new owner, and its input frontier cannot pass ``t`` before the old owner's token at ``t``
is dropped, after the last slice of the state is sent, nor (as the operator sees it) before
the queued slices are loaded; so the new owner acts on the bin (closes a window, retires
an auction) only after it has loaded the state.  What it may do before is *add* records at
times ``>= t`` to its state; the state types must merge loaded rows with such rows in either
order (sums, maxima, appends, an auction whose bids arrived first: all of the NEXMark states
qualify).  The old owner's frontier is held at ``t`` until the take, so it never acts on the
bin at a time after ``t``.

Requirements on ``constructor(capability, info) -> logic(*inputs, output)`` (the contract of
the generic operators): declare exactly one state with ``info.state(name, state)`` (a
``BinnedState`` whose rows are keyed by the inputs' ``columns``), hold its tokens in an object
with ``adopt``/``release`` and pass it to ``migrates(info, tokens)``, read every input every
invocation, and mint tokens only at the state's ``pending_times()``.  Times: ``int``.

Checkpoints: the declared state is registered with the worker (key
``<operator path>:<name>/<state name>``, as ``OperatorBuilder.state`` names it) under the
operator's own routing table, so a checkpoint exports it per bin; a worker is not idle for a
checkpoint at ``e`` while a move at a time ``<= e`` is unsent (``megaphone`` module notes).
Restored, the operator starts from the table it had at the checkpoint's epoch, ``info.state``
returns the state with the bins this worker owns there already loaded, and the constructor
mints its tokens at ``pending_times()`` as it does for an ordinary restore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability, CapabilityRef, CapabilitySet
from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.operators.builder import OperatorBuilder, OperatorInput, operator_key
from tokenflow.dataflow.operators.generic import OperatorInfo, binary_frontier, unary_frontier
from tokenflow.dataflow.routing import column_hashes, partition_arrow
from tokenflow.dataflow.state import BinnedState
from tokenflow.rescale.megaphone import (
    ByTarget,
    ClampedFrontier,
    LoadQueue,
    MigrationHandle,
    Shared,
    Splitter,
    checkpointable,
    register_state,
    router,
    unpacked,
)
from tokenflow.state.bins import RoutingTable, bins_of

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


class HeldTokens(Protocol):
    """The tokens an operator holds for its state's pending times."""

    def adopt(self, ref: CapabilityRef | Capability, times: Iterable[Any]) -> None:
        """Hold a token covering each of ``times`` (minting from ``ref``, where none is held
        yet: the token the wrapper held at the time of the moved state, ``LoadQueue``)."""

    def release(self, times: Iterable[Any]) -> None:
        """Hold tokens for ``times`` only (the state's remaining pending times)."""


class LeastToken:
    """``HeldTokens`` for an operator holding ONE token at its state's least pending time in
    a ``CapabilitySet`` (e.g. NEXMark Q4's operators)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: CapabilitySet) -> None:
        self.tokens = tokens

    def adopt(self, ref: CapabilityRef | Capability, times: Iterable[Any]) -> None:
        least = min(times, default=None)
        if least is None:
            return
        first = self.tokens.first()
        if first is None or least < first.time:
            self.tokens.insert(ref.delayed(least))

    def release(self, times: Iterable[Any]) -> None:
        least = min(times, default=None)
        first = self.tokens.first()
        if least is None:
            self.tokens.clear()
        elif first is not None and first.time < least:
            self.tokens.downgrade([least])


@dataclass
class Migration:
    """What a migrating operator's constructor declared: its state and its tokens."""

    state: BinnedState | None = None
    tokens: HeldTokens | None = None


@dataclass(frozen=True)
class MigratingInfo(OperatorInfo):
    """``OperatorInfo`` of a migrating operator (``info.state`` does not register the state
    for snapshots: it moves between workers instead)."""

    migration: Migration = field(default_factory=Migration)


def migrates(info: OperatorInfo, tokens: HeldTokens) -> None:
    """Tell a migrating operator's wrapper which object holds the operator's tokens (a no-op
    for an ordinary operator)."""
    if isinstance(info, MigratingInfo):
        info.migration.tokens = tokens


@dataclass
class Elastic:
    """Build a query's keyed operators as migrating operators (``keyed_operator``).

    Attributes:
        initial: the first routing table (default the job's, ``Worker.routing``).
        lead: logical time units the controllers stay ahead of the data frontier.
        measure: every worker records every step (``StepStats.total``: bytes of its state).
        handles: the migrating operators built on this worker, in order.
    """

    initial: RoutingTable | None = None
    lead: int = 1
    measure: bool = False
    handles: list[MigrationHandle] = field(default_factory=list)


def keyed_operator(inputs: Sequence[Stream], columns: Sequence[str], name: str,
                   constructor: Callable[[Any, OperatorInfo], Callable[..., Any]],
                   elastic: Elastic | None = None) -> Stream:
    """A one- or two-input operator whose input ``i`` is keyed by the Arrow column
    ``columns[i]``: with ``elastic`` None exactly ``unary_frontier`` / ``binary_frontier``
    over ``Exchange(column=...)`` pacts, else ``migrating_operator`` (see the module notes).

    Raises:
        ValueError: not one or two inputs, or not one column per input.
    """
    if len(inputs) != len(columns) or len(inputs) not in (1, 2):
        raise ValueError(f"{name}: one or two inputs with one key column each, got "
                         f"{len(inputs)} inputs and columns {list(columns)}")
    if elastic is None:
        if len(inputs) == 1:
            return unary_frontier(inputs[0], Exchange(column=columns[0]), name, constructor)
        return binary_frontier(inputs[0], inputs[1], Exchange(column=columns[0]),
                               Exchange(column=columns[1]), name, constructor)
    handle = migrating_operator(inputs, columns, name, constructor, initial=elastic.initial,
                                lead=elastic.lead, measure=elastic.measure)
    elastic.handles.append(handle)
    return handle.stream


def column_splitter(column: str, bins: int, peers: int) -> Splitter:
    """Cut Arrow batches by the owner of the bin of ``column``'s stable hash (the bin
    ``Exchange(column=column)`` routes by)."""

    def split(batch: Any, owners: np.ndarray) -> Iterator[tuple[int, Any]]:
        targets = owners[bins_of(column_hashes(batch.column(column)), bins)]
        return partition_arrow(batch, targets, peers)

    return split


class _Unwrapped:
    """An ``OperatorInput`` look-alike over a ``ByTarget`` channel from F: yields the data
    parts, hands state messages to ``load(ref, tables)`` as they come; its ``frontier`` is
    the input's, held at the times of moved state not loaded yet (``ClampedFrontier``)."""

    __slots__ = ("inner", "load", "frontier")

    def __init__(self, inner: OperatorInput, load: Callable[[CapabilityRef, Any], None],
                 floor: Callable[[], list[Any]]) -> None:
        self.inner = inner
        self.load = load
        self.frontier = ClampedFrontier(inner.frontier, floor)

    def __iter__(self) -> Iterator[tuple[CapabilityRef, Any]]:
        for ref, batch in self.inner:
            for _, kind, payload in batch:
                if kind == "d":
                    yield ref, unpacked(payload)
                else:
                    self.load(ref, payload)

    def next(self) -> tuple[CapabilityRef, Any] | None:
        """Unsupported: iterate the input instead (a message may hold several parts)."""
        raise NotImplementedError("iterate a migrating operator's input")

    def for_each(self, fn: Callable[[CapabilityRef, Any], None]) -> None:
        for ref, batch in self:
            fn(ref, batch)


def _take(state: BinnedState) -> Callable[[list[int]], Mapping[int, pa.Table]]:
    take = getattr(state, "take", None)
    if take is not None:
        return take  # type: ignore[no-any-return]

    def export_and_discard(bins: list[int]) -> Mapping[int, pa.Table]:
        parts = state.export(bins)
        if parts:
            state.discard(bins)
        return parts

    return export_and_discard


def migrating_operator(inputs: Sequence[Stream], columns: Sequence[str], name: str,
                       constructor: Callable[[Any, OperatorInfo], Callable[..., Any]], *,
                       initial: RoutingTable | None = None, lead: int = 1,
                       measure: bool = False, spread: bool = True) -> MigrationHandle:
    """The operator of ``constructor`` (``logic(*inputs, output)``, see the module notes)
    behind a Megaphone router: its bins move between workers at logical times.

    Args:
        inputs: Arrow record batch streams, input ``i`` keyed by column ``columns[i]``.
        initial: the starting routing table (default the job's); workers outside its roster
            own nothing until a step gives them bins.
        lead: logical time units the controller stays ahead of the data frontier.
        measure: record every step on every worker with the bytes of its whole state.
        spread: a change's steps one data time step apart (``megaphone.control_stream``):
            between consecutive epochs of data, not all between two of them.

    Returns:
        A ``MigrationHandle`` (``stream``: the operator's output; ``controller``: worker 0
        drives it; ``moved``: the steps this worker recorded).

    Raises:
        NotImplementedError: the job has free worker slots (workers join and leave) and takes
            checkpoints or is restored (``megaphone.checkpointable``).
        ValueError: (when the dataflow is built) the constructor declared no state or no
            tokens, or two states.
    """
    scope = inputs[0].scope
    worker = scope.worker
    checkpointable(worker, name)
    table = initial or worker.routing or RoutingTable.even(scope.peers)
    migration = Migration()
    released = [False]
    shared = Shared(take=lambda bins: {})

    def declare(state_name: str, state: Any) -> Any:
        if migration.state is not None:
            raise ValueError(f"{name}: a migrating operator holds one state, got a second "
                             f"({state_name!r})")
        key = f"{operator_key(op.core.path, name)}/{state_name}"
        register_state(worker, key, state, controller.table)  # (the restored table, if any)
        if state.home_bin < 0:
            state.home_bin = 0
        controller.states.append(key)
        controller.bin_bytes = state.bin_bytes
        migration.state = state
        shared.take = _take(state)
        shared.per_bin = bool(getattr(state, "take_per_bin", True))
        shared.take_to = getattr(state, "take_to", None)
        shared.prepare = getattr(state, "prepare_take", shared.prepare)
        shared.sizes = lambda: {b: t.nbytes for b, t in state.export().items()}
        return state

    # by slot: the owners include workers that joined after this one built the operator
    peers = getattr(worker, "slots", scope.peers)
    splits = [column_splitter(c, table.bins, peers) for c in columns]
    routed, controller = router(list(inputs), splits, table, shared, lead, measure, name,
                                spread=spread)

    op = OperatorBuilder(name, scope, notify=True)
    op_inputs = [op.new_input(s, ByTarget()) for s in routed]
    output, stream = op.new_output()
    activate = op.activator()
    info = MigratingInfo(name, op.index, scope.worker_index, scope.peers, activate, declare,
                         op.delayed_activator(), migration)

    def after_take() -> None:
        released[0] = True
        activate()

    shared.released = after_take

    def build(caps: list[Any]) -> Any:
        logic = constructor(caps[0], info)
        state, tokens = migration.state, migration.tokens
        if state is None or tokens is None:
            raise ValueError(f"{name}: a migrating operator must declare its state "
                             f"(info.state) and its tokens (migrates(info, tokens))")

        loads = LoadQueue(state.load, shared.loads)

        def loaded(token: Capability) -> None:  # a time's parts are all in: hold its tokens
            tokens.adopt(token, state.pending_times())

        wrapped = [_Unwrapped(inp, loads.add, loads.floor) for inp in op_inputs]

        def run(frontiers: Any) -> Any:
            if released[0]:
                released[0] = False
                tokens.release(state.pending_times())
            loads.run(loaded)  # parts queued before: the operator then acts on them
            result = logic(*wrapped, output)
            # the frontier the logic acted on: F may take state the operator has applied
            # every record before (and done all its work before: closed windows, auctions)
            # only as far as this, not as far as the loads below let the frontier move
            applied = [e for inp in wrapped for e in inp.frontier.frontier()]
            if loads.pending:
                loads.run(loaded)  # parts that came in this invocation
                activate()  # run again: more slices, or the clamped frontier moved
            shared.applied = applied
            if shared.waiting:
                shared.activate_router()
            return result

        return run

    op.build(build)
    return MigrationHandle(name, controller, shared, stream)


__all__ = ["Elastic", "HeldTokens", "LeastToken", "Migration", "MigratingInfo", "column_splitter",
           "keyed_operator", "migrates", "migrating_operator"]
