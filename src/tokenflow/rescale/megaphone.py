"""Megaphone: move keyed state between workers at logical times, while the job runs.

Source: Hoffmann, Lattuada, McSherry et al., *Megaphone: Latency-conscious state migration for
distributed streaming dataflows* (VLDB 2019); the distributed-DBSP design, "Scaling state"
(bins, so a change of W moves about 1/(W+1) of the state); docs/ARCHITECTURE.md ("Elasticity").

A keyed operator built with ``megaphone_fold`` is two operators on every worker sharing the
operator's state (worker-local memory, the paper's design):

* **F, the router**, reads the data and a *control* stream (broadcast).  Control records are
  bin moves ``(bin, old owner, new owner)`` at a logical time ``t``: records at times ``>= t``
  route by the new owners.  F routes a record at time ``s`` once the control frontier has passed
  ``s`` (every move that applies to ``s`` is known).  For each move *from* its own worker at
  ``t``, F holds a token at ``t``; once S on its worker has applied every record before ``t``
  (S's input frontier has no time ``< t``), F takes the bin's state out of S and sends it, at
  ``t``, to the new owner, then drops the token.
* **S, the state**, receives routed records and moved state (one exchange channel), stashes them
  per time, and when its input frontier passes ``t`` loads the state that arrived at ``t``, then
  folds ``t``'s records in arrival order: records at ``t`` of a moved bin only arrive at the new
  owner, and S there applies none of them before the state sent at ``t``.

The **controller** (``control_stream``, held on worker 0) keeps its token ``lead`` ahead of the
data frontier, so F routes records of the current epochs at once; ``Controller.rescale(table,
strategy)`` turns the difference between the current and the new routing table into steps at
consecutive times ahead of the data: *all-at-once* (one step), *fluid* (one bin per step) or
*batched* (the default: rounds in which each worker sends at most one batch of bins and
receives at most one).  Only bins whose owner changes move.

**Checkpoints** (docs/ARCHITECTURE.md, "Elasticity", "Checkpoints of migrating operators"):
a migrating operator registers its state with the worker (S's values and its stash of records
waiting per time), so a checkpoint exports it per bin like any operator state.  A worker does
not report itself settled for a checkpoint at epoch ``e`` while its router still has a move at
a time ``<= e`` to send or records at such times to route (``Controller.settled``): at the
checkpoint every bin's state is on the owner the routing table in effect at ``e`` names, and
no move is in flight.  The worker's part
records that table (``Controller.table_at(e)``, ``ROUTING_META``); a restored operator starts
from it (rebalanced onto the restored worker count when that differs) with no step pending,
loads the bins it owns there and re-mints tokens for its stashed times; it sends no step at
a time below ``e`` (``Controller.floor``).  The router keeps the table versions in effect
from the last committed checkpoint's epoch on (``Controller.keep_from``), so the next
checkpoint finds its table even once the data frontier has passed later steps.  Jobs whose
workers join and leave (``tokenflow.membership``) are not checkpointed.

Times: ``int`` (control times are ``data frontier + lead``, consecutive per step).  Records:
``list`` batches.
"""

from __future__ import annotations

import bisect
import collections
import time as _time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from tokenflow.comm.frames import schema_message
from tokenflow.dataflow.channels import Broadcast, Message, Push
from tokenflow.dataflow.operators.builder import OperatorBuilder, operator_key
from tokenflow.dataflow.operators.stateful import PendingRecords, fold_records
from tokenflow.dataflow.routing import MASKED_PEERS, partition_list
from tokenflow.dataflow.state import BinnedState, KeyBins, KeyedState, pickled
from tokenflow.faults import crash_point
from tokenflow.progress.antichain import Antichain
from tokenflow.rescale.clock import Activation
from tokenflow.state.bins import RoutingTable

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream

STRATEGIES = ("all-at-once", "fluid", "batched")
BATCH_SHARE = 4
"""The ``batched`` strategy's batches hold up to ``bins // BATCH_SHARE`` bins (``batch_size``)."""
SLICE_SECONDS = 0.003
"""Wall-time budget of one activation's migration work on one worker: the old owner takes and
sends a step's bins in slices while the last slice's time still fits in it (then yields to
the worker loop, holding the step's tokens), the new owner loads arriving parts in slices
the same way (``LoadQueue``).  An activation's first slice always runs.  Slices that merely
started before the budget ran out ran on past it: in a paced q5 batched run, activations of
2-3 slices used 4.2-5.4 ms of CPU where no single slice used more than 2.1 ms."""
PREPARE_SECONDS = 0.001
"""Seconds an activation of F spends at most preparing the state for a coming step's take
(``BinnedState.prepare_take``): work it would otherwise do inside the step's first slice."""
MAX_SLICES = 16
"""A step's bins go out in at most this many slices (a slice holds at least ``1/MAX_SLICES``
of them): a state whose every ``take`` pays a pass over all its rows (a columnar state hashes
and filters its keys) would otherwise pay that pass once per bin."""
ROUTING_META = "migrating"
"""Key of a checkpoint part's metadata holding each migrating operator's routing table at the
checkpoint's epoch: ``{operator key: RoutingTable.to_json()}`` (``Controller.table_at``)."""


class Move(NamedTuple):
    """Bin ``bin`` moves from worker ``old`` to worker ``new``.  A named tuple: a 4,096-bin
    change has 1,024-1,365 of them, built on worker 0 (``plan``) and again on every worker
    from the control records, in the step of the epoch the change was asked in (1,365 frozen
    dataclasses took 0.55 ms to build, named tuples 0.23 ms)."""

    bin: int
    old: int
    new: int


def batch_size(bins: int) -> int:
    """Bins per batch of the ``batched`` strategy for a table of ``bins`` bins: a quarter of
    them (64 of 256, 1,024 of 4,096).

    A fixed count (it was 64) made a 4,096-bin change take 22-36 rounds, and a round costs its
    senders about a pass over their whole state whatever the bins it moves (a columnar state's
    ``take`` rebuilds what stays), plus a progress exchange before the next: NEXMark q4 at half
    its throughput saw 2-3.6 s of latency.  A share of the bins keeps a change at 2-4 rounds
    (scale-out from W to W+1: each old owner sends about ``bins / (W (W+1))`` bins to the
    newcomer, which receives one batch per round).
    """
    return max(1, bins // BATCH_SHARE)


def plan(old: RoutingTable, new: RoutingTable, strategy: str = "batched",
         batch_bins: int | None = None) -> list[list[Move]]:
    """The steps that take ``old`` to ``new``: lists of moves, one list per logical time
    (``batched``: batches of ``batch_bins`` bins, default ``batch_size(old.bins)``).

    Raises:
        ValueError: an unknown strategy, or tables of different bin counts.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown migration strategy {strategy!r}; choose one of {STRATEGIES}")
    if old.bins != new.bins:
        raise ValueError(f"routing tables of {old.bins} and {new.bins} bins")
    changed = np.flatnonzero(old.owners != new.owners)
    moves = list(map(Move._make, zip(changed.tolist(), old.owners[changed].tolist(),
                                     new.owners[changed].tolist(), strict=True)))
    if not moves:
        return []
    if strategy == "all-at-once":
        return [moves]
    if strategy == "fluid":
        return [[m] for m in moves]
    if batch_bins is None:
        batch_bins = batch_size(old.bins)
    chunks: collections.deque[list[Move]] = collections.deque()
    by_pair: dict[tuple[int, int], list[Move]] = collections.defaultdict(list)
    for m in moves:
        by_pair[(m.old, m.new)].append(m)
    for pair_moves in by_pair.values():
        for i in range(0, len(pair_moves), batch_bins):
            chunks.append(pair_moves[i:i + batch_bins])
    rounds: list[list[Move]] = []
    while chunks:  # greedy: each worker sends at most one chunk and receives at most one
        senders: set[int] = set()
        receivers: set[int] = set()
        this: list[Move] = []
        for _ in range(len(chunks)):
            chunk = chunks.popleft()
            if chunk[0].old in senders or chunk[0].new in receivers:
                chunks.append(chunk)
                continue
            senders.add(chunk[0].old)
            receivers.add(chunk[0].new)
            this.extend(chunk)
        rounds.append(this)
    return rounds


class MovedState:
    """The state of the bins one step moves to one worker, as F sends it: ``parts()`` gives
    ``{bin: pa.Table}`` back.

    The bins' tables are concatenated into one single-chunk table (when their schemas agree)
    and pickled as one Arrow IPC stream of one record batch.  With one chunk per bin, IPC wrote
    one message per bin and ``parts()`` sliced across hundreds of chunks (a q8 step of 1,365
    bins: 17 ms of unpickling and slicing, 4 ms now; 2.6 MB pickled, 2.0 MB now); the rows
    are copied once instead.  A bin's table is usually a slice of the operator's whole state
    (``split_by_bin``), and pickling a sliced ``pa.Table`` writes its parent's buffers whole
    (pyarrow): sending 1,365 of 4,096 bins as a ``{bin: slice}`` dict pickled every byte of
    the state 1,365 times (gigabytes for a 1 MB NEXMark q5 state, seconds of sealing and
    sending).  An IPC stream writes only the rows of the slices.
    """

    __slots__ = ("bins", "lengths", "table", "loose")

    def __init__(self, parts: dict[int, pa.Table]) -> None:
        self.bins: list[int] = sorted(parts)
        self.lengths: list[int] = [parts[b].num_rows for b in self.bins]
        self.table: pa.Table | None = None
        self.loose: dict[int, pa.Table] = {}
        if not self.bins:
            return
        try:  # one chunk: IPC writes one record batch, and parts() slices in O(1) per bin
            self.table = pa.concat_tables([parts[b] for b in self.bins]).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # schemas differ: one table per bin
            self.loose, self.bins, self.lengths = dict(parts), [], []

    def parts(self) -> dict[int, pa.Table]:
        out = dict(self.loose)
        offset = 0
        for b, n in zip(self.bins, self.lengths, strict=True):
            assert self.table is not None
            out[b] = self.table.slice(offset, n)
            offset += n
        return out

    @staticmethod
    def _ipc(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    @staticmethod
    def _read(data: bytes) -> pa.Table:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

    def __getstate__(self) -> dict[str, Any]:
        return {"bins": self.bins, "lengths": self.lengths,
                "table": None if self.table is None else self._ipc(self.table),
                "loose": {b: self._ipc(t) for b, t in self.loose.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.bins, self.lengths = state["bins"], state["lengths"]
        self.table = None if state["table"] is None else self._read(state["table"])
        self.loose = {b: self._read(d) for b, d in state["loose"].items()}


def moved_parts(payload: Any) -> dict[int, pa.Table]:
    """The ``{bin: pa.Table}`` of a state message (a ``MovedState`` or such a dict)."""
    return payload.parts() if isinstance(payload, MovedState) else payload


class ClampedFrontier:
    """An input frontier as an operator may act on it while moved state waits to be loaded:
    the input's own frontier joined with the times of the parts still waiting (``floor()``),
    so the operator does nothing at those times before the state is in.  Offers what the
    operators read of an ``OperatorInput.frontier``: ``frontier()``, ``less_equal``,
    ``less_than``, ``is_empty``."""

    __slots__ = ("inner", "floor")

    def __init__(self, inner: Any, floor: Callable[[], list[Any]]) -> None:
        self.inner = inner
        self.floor = floor

    def _joined(self) -> Any:
        floor = self.floor()
        if not floor:
            return self.inner
        return Antichain([*self.inner.frontier(), *floor])

    def frontier(self) -> list[Any]:
        joined = self._joined()
        return joined.frontier() if joined is self.inner else joined.elements()

    def less_equal(self, time: Any) -> bool:
        return bool(self._joined().less_equal(time))

    def less_than(self, time: Any) -> bool:
        return bool(self._joined().less_than(time))

    def is_empty(self) -> bool:
        return bool(self._joined().is_empty())


class LoadQueue:
    """Moved state that arrived on its new owner, loaded in slices (per ``run`` at least one
    slice, and another only while the last one's time still fits in ``SLICE_SECONDS``).

    ``add(ref, payload)`` queues a state message (a ``MovedState`` or ``{bin: pa.Table}``) at
    ``ref.time`` and holds a token at that time (``ref.retain()``) until every part queued at
    it is loaded; ``floor()`` lists the times with parts still waiting (the operator's input
    frontier is clamped to them: ``ClampedFrontier``); ``run(done)`` loads slices of bins and,
    when the parts of some time are all in, calls ``done(token)`` with the earliest token held
    (e.g. mint the operator's tokens for the loaded state's pending times from it), then
    drops the tokens of the times completed.  Returns True
    when anything was loaded (the operator should run again: its clamped frontier moved).
    """

    __slots__ = ("load", "queue", "holds", "slice", "stats", "log")

    def __init__(self, load: Callable[[dict[int, pa.Table]], None],
                 log: list[LoadStats] | None = None) -> None:
        self.load = load
        self.queue: collections.deque[tuple[Any, dict[int, pa.Table]]] = collections.deque()
        self.holds: dict[Any, Any] = {}
        self.slice = 64
        self.stats: dict[Any, LoadStats] = {}
        self.log: list[LoadStats] = [] if log is None else log
        """Every time's ``LoadStats``, appended once all its parts are loaded."""

    def add(self, ref: Any, payload: Any) -> None:
        parts = moved_parts(payload)
        if ref.time not in self.holds:
            self.holds[ref.time] = ref.retain()
            self.stats[ref.time] = LoadStats(ref.time, _time.time())
        self.queue.append((ref.time, dict(parts)))

    def floor(self) -> list[Any]:
        return list(self.holds)

    @property
    def pending(self) -> bool:
        return bool(self.holds)

    def run(self, done: Callable[[Any], None] = lambda token: None) -> bool:
        if not self.holds:
            return False
        deadline = _time.perf_counter() + SLICE_SECONDS
        clock = Activation()  # this run's loading, as one block
        last = 0.0
        while self.queue and clock.may_start(deadline, last):
            time, parts = self.queue[0]
            chunk = sorted(parts)[:self.slice]
            stats = self.stats[time]
            clock.work(stats)
            began = _time.perf_counter()
            self.load({b: parts.pop(b) for b in chunk})
            last = _time.perf_counter() - began
            stats.slices += 1
            stats.loading += last
            want = len(chunk) * SLICE_SECONDS / max(last, 1e-6)
            self.slice = max(1, int(min(max(want, len(chunk) / 2), 4 * len(chunk))))
            if not parts:
                self.queue.popleft()
        waiting = {time for time, _ in self.queue}
        complete = [t for t in self.holds if t not in waiting]
        if complete:
            # mint from the earliest token held: state partly loaded for another time (a
            # step before this one whose parts came later) may be pending before this time
            done(self.holds[min(self.holds)])
        clock.stop()
        for time in complete:
            self.holds.pop(time).drop()
            stats = self.stats.pop(time)
            stats.loaded = _time.time()
            self.log.append(stats)
        return True


@dataclass
class StepStats:
    """One migration step as one worker saw it: ``bins`` it sent at logical time ``time``,
    their state's ``bytes`` (Arrow bytes: ``pa.Table.nbytes`` of the exported bins) and, when
    the operator measures (``measure=True``), ``total``: the bytes of all the state it held
    just before the step (every worker records every step then, senders or not).  Measuring,
    ``bytes`` counts the moved bins' tables in that same export (like with like: a step goes
    out in slices, and a slice's tables can carry fewer columns than the whole state's);
    otherwise it sums the tables of the slices sent.

    Timings (wall clock, ``time.time()`` s; 0 when nothing was sent): ``due`` when the first
    slice's take began (S had applied every record before ``time``), ``sent`` when the last
    slice was flushed to the mesh; ``slices`` taken and the wall time of all their takes
    (``taking``, s).  Per activation of F that worked for the step (``clock.Activation``: its
    prepares, takes and the flush of what they sent, as one block, since the worker ran
    nothing else meanwhile): the ``longest`` one's wall time (s), the most thread CPU time one
    used (``longest_cpu``, s, ``time.thread_time``) and the most time one held the worker
    (``longest_held``, s, ``clock.SliceClock``: its CPU time, plus its own waits if it
    blocked; not the time the OS or a virtual machine's host gave others meanwhile)."""

    time: int
    bins: int
    bytes: int
    total: int = 0
    due: float = 0.0
    sent: float = 0.0
    slices: int = 0
    longest: float = 0.0
    taking: float = 0.0
    longest_cpu: float = 0.0
    longest_held: float = 0.0


@dataclass
class LoadStats:
    """The moved state one worker received at logical time ``time``: when its first part
    reached the operator (``arrived``) and when the last was loaded (``loaded``; wall clock,
    ``time.time()`` s), the ``slices`` loaded and the wall time of all (``loading``, s); per
    ``LoadQueue.run`` that loaded some of it (its slices as one block: ``clock.Activation``),
    the ``longest`` one's wall time (s), the most thread CPU time one used (``longest_cpu``)
    and the most time one held the worker (``longest_held``, s, as ``StepStats``)."""

    time: int
    arrived: float
    loaded: float = 0.0
    slices: int = 0
    longest: float = 0.0
    loading: float = 0.0
    longest_cpu: float = 0.0
    longest_held: float = 0.0


class DataEndedError(RuntimeError):
    """A rescale asked for after a migrating operator's data ended: its control source has
    sent its last step and dropped its token, so no logical time is left to move bins at
    (the operator's state is final and stays where it is)."""


class Controller:
    """Requests migrations (on worker 0; the other workers' controllers are inert).

    Attributes:
        table: the routing table after every requested step.
        issued: ``(time, moves)`` of every step sent.
        changes: ``(first step time, table)`` per ``rescale`` call that moved bins, in
            order: the step times from one entry to the next belong to that table change.
    """

    def __init__(self, table: RoutingTable, lead: int) -> None:
        self.table = table
        self.lead = lead
        self.issued: list[tuple[int, list[Move]]] = []
        self._adopted: list[tuple[int, list[Move]]] = []
        self.changes: list[tuple[int, RoutingTable]] = []
        self._steps: collections.deque[tuple[list[Move], RoutingTable | None]] = \
            collections.deque()
        self.activate: Callable[[], None] = lambda: None
        self.driving = False
        """True on the worker whose control source sends the steps (worker 0)."""
        self.ended = False
        """True once the driving control source has seen the end of the data and dropped its
        token: ``rescale`` then raises ``DataEndedError``."""
        self.floor = 0
        """No step is sent at a time below it: a restored operator's checkpoint epoch (its
        restored stash and pending work are at earlier times, on the owners of that table;
        a move at ``t`` takes only state the old owner's frontier has passed ``t`` for)."""
        self.key = ""
        """The operator's stable key (its router's path and name): where a checkpoint part
        records its routing table (``ROUTING_META``)."""
        self.states: list[str] = []
        """Keys of the operator states this worker registered for it (``Worker.states``)."""
        self.bin_bytes: Callable[[], np.ndarray | None] | None = None
        """The bytes of the operator's state on this worker per bin (its state's
        ``BinnedState.bin_bytes``; None: no state declared): what the control plane's
        ``bin_bytes`` command sums over workers, for ``rescale_roster``'s ``sizes``."""
        self.settled: Callable[[int], str | None] = lambda epoch: None
        """``settled(e)``: why this worker's router is not ready for a checkpoint at epoch
        ``e`` (a move at a time ``<= e`` not sent yet), or None."""
        self.table_at: Callable[[int], RoutingTable] = lambda epoch: self.table
        """``table_at(e)``: the routing table this worker's router has in effect at time ``e``."""
        self.keep_from: int | None = None
        """In a checkpointed or restored job, the least epoch a checkpoint may still ask
        ``table_at`` for (the restored epoch, then the last committed checkpoint's, which the
        control plane sets at each capture): the router keeps the table versions in effect
        from it on even once its data frontier has passed them.  None: no checkpoint asks."""

    def rescale(self, table: RoutingTable, strategy: str = "batched",
                batch_bins: int | None = None) -> int:
        """Move to ``table`` in steps of ``strategy``; returns the number of steps.

        Raises:
            ValueError: an unknown strategy or a table of another bin count (``plan``).
            DataEndedError: the data has ended (``ended``); nothing changes.
        """
        if self.ended:
            raise DataEndedError(f"{self.key or 'a migrating operator'}: its data has ended, "
                                 "so no time is left to move bins at (its state is final)")
        steps = plan(self.table, table, strategy, batch_bins)
        for i, step in enumerate(steps):
            self._steps.append((step, table if i == 0 else None))
        self.table = table
        self.activate()
        return len(steps)

    def history(self) -> list[tuple[int, list[tuple[int, int, int]]]]:
        """The steps sent so far as ``(time, [(bin, old, new), ...])`` (on worker 0): what a
        worker joining the job needs to route as the others do (its routers never saw them)."""
        return [(t, [(m.bin, m.old, m.new) for m in moves]) for t, moves in self.issued]

    def adopt(self, history: list[Any]) -> None:
        """On a joining worker: the steps worker 0 sent before it was admitted; the router
        applies them before its first control record (Selvatici §3.5: the routing state a new
        worker needs besides its progress state)."""
        self._adopted = [(int(t), list(map(Move._make, moves))) for t, moves in history]

    def take_adopted(self) -> list[tuple[int, list[Move]]]:
        adopted, self._adopted = self._adopted, []
        return adopted

    def rescale_roster(self, roster: list[int], strategy: str = "batched",
                       sizes: np.ndarray | None = None) -> int:
        """Move to the table that spreads the bins evenly over ``roster`` moving the fewest
        (``RoutingTable.rebalanced``; with ``sizes``, the job's state bytes per bin summed
        over workers and operators, the bins that move are chosen by bytes); returns the
        number of steps (0 on workers but 0).

        Raises:
            ValueError: ``sizes`` not one finite, non-negative number per bin.
        """
        if not self.driving:
            return 0
        return self.rescale(self.table.rebalanced(roster, sizes), strategy)

    def replace_owner(self, old: int, new: int, strategy: str = "batched") -> int:
        """Move every bin of worker ``old`` to worker ``new`` and nothing else
        (``RoutingTable.replaced``: a rolling upgrade); returns the number of steps (0 on
        workers but 0)."""
        if not self.driving:
            return 0
        return self.rescale(self.table.replaced(old, new), strategy)

    @property
    def busy(self) -> bool:
        """Steps requested but not sent yet."""
        return bool(self._steps)


STEP_MOVES = 64
"""Moves of the data frontier ``control_stream`` keeps to find the data's time step."""
STEP_QUANTILE = 0.9
"""The quantile of the recent moves ``data_step`` scales its floor from."""
STEP_FLOOR = 0.1
"""A move counts towards the data's time step when it is at least this share of the
``STEP_QUANTILE`` quantile of the recent moves (``data_step``)."""


def data_step(moves: Iterable[Any]) -> Any:
    """The data's time step from recent moves of a data frontier (ints): the least move of at
    least ``STEP_FLOOR`` times their ``STEP_QUANTILE`` quantile (1 when there are none).

    The least move alone is not it: a frontier downstream of tokens at data-dependent times
    crawls within an epoch (q4's ``Q4Average`` follows the least open auction's ``expires``:
    in a traced half-load run 284 of its 514 moves were 1 ms, most others 97-100 ms), and
    fluid steps one such move apart all fell in one epoch, which waited for all 85 of them (a
    migration p99 of 96-114 ms).  A high quantile alone is not it either: a job running ahead
    of real time moves several epochs at once (and seconds after a stall), and with steps
    that far apart q4's fluid changes in ``rescale_nexmark.py --join`` ran about half again
    as long, some not finishing before the job ended."""
    ordered = sorted(moves)
    if not ordered:
        return 1
    floor = STEP_FLOOR * ordered[int(STEP_QUANTILE * (len(ordered) - 1))]
    return next(m for m in ordered if m >= floor)


def control_stream(scope: Scope, initial: RoutingTable, follow: Callable[[], list[Any]],
                   lead: int = 1, name: str = "MegaphoneControl",
                   spread: bool = False) -> tuple[Stream, Controller]:
    """The control source: worker 0 holds a token ``lead`` ahead of ``follow()`` (the data
    frontier; ``[]`` when the data is done) and sends each requested step at its own time:
    at consecutive times, or with ``spread`` one *data time step* apart (``data_step`` of the
    recent moves of the data frontier, 1 before any: 1 for consecutive integer epochs, 100 for
    NEXMark's 100 ms epochs), so each falls between two epochs of data.  The
    frontier's first move is not a step: it leaves the dataflow's initial time (0, or a time
    before a restored epoch) for the data's first epoch, and taken as one it put a change's
    steps 1.4e12 ms (NEXMark's epoch times) apart, after the end of the data.

    At consecutive integer times a fluid change's 85 steps all fell between two NEXMark
    epochs and ran back to back, each a pass over its senders' state and a progress exchange,
    while the next epoch waited behind all of them (1.2-1.4 s for q4).  One step per data
    time interleaves them with the epochs (Megaphone's fluid migration: one bin per timestamp,
    with data at every timestamp).  All steps are still sent at once (at their future times):
    nothing waits on the data frontier."""
    from tokenflow.dataflow.operators.generic import source

    controller = Controller(initial, lead)

    def constructor(cap: Any, info: Any) -> Any:
        if info.worker_index != 0:
            cap.drop()
            return lambda output: None
        controller.activate = info.activate
        controller.driving = True
        held = [cap]
        seen: list[Any] = []
        recent: collections.deque[Any] = collections.deque(maxlen=STEP_MOVES)
        moves = [0]

        def logic(output: Any) -> None:
            if not held:
                return
            token = held[0]
            frontier = follow()
            if frontier:  # the data's time step: from the recent moves of the data frontier
                if seen and min(frontier) > seen[0]:
                    moves[0] += 1
                    if moves[0] > 1:  # the first is from the dataflow's initial time (0, or
                        recent.append(min(frontier) - seen[0])  # before a restored epoch)
                seen[:] = [min(frontier)]
            if controller._steps:
                base = max(token.time, controller.floor,
                           min(frontier) + lead if frontier else token.time)
                stride = data_step(recent)
                while controller._steps:
                    step, table = controller._steps.popleft()
                    token.downgrade(base)
                    output.give_batch(token, [(m.bin, m.old, m.new) for m in step])
                    controller.issued.append((base, step))
                    if table is not None:
                        controller.changes.append((base, table))
                    base += stride if spread else 1
                token.downgrade(base)
                if frontier:
                    return  # the router activates this source when the data frontier moves
            if not frontier:  # the data is done (and the steps above, if any, are sent)
                held.pop().drop()
                controller.ended = True
                return
            if min(frontier) + lead > token.time:
                token.downgrade(min(frontier) + lead)

        return logic

    return source(scope, name, constructor), controller


class PackedBatch:
    """A data part of F (an Arrow ``RecordBatch``) on its way to another worker: unpickles as
    the ``RecordBatch`` itself, pickled as Arrow IPC messages of its own rows; read locally
    (same process), ``unpacked`` gives the batch.

    F's parts are zero-copy slices of one reordered batch (``partition_arrow``), and pickling
    a sliced ``RecordBatch`` writes its parent's buffers whole: every worker received the
    whole batch instead of its part (4x the bytes with 4 workers).
    """

    __slots__ = ("batch",)

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple[Any, ...]:
        message = schema_message(self.batch.schema)
        if message is None:  # dictionaries: the batch pickles whole (its own message lacks them)
            return (_same, (self.batch,))
        return (_read_batch, (message.to_pybytes(), self.batch.serialize().to_pybytes()))


def _same(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _read_batch(schema: bytes, batch: bytes) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(batch), pa.ipc.read_schema(pa.py_buffer(schema)))


def unpacked(payload: Any) -> Any:
    """A data part as F sent it (a ``PackedBatch`` read in the same process gives its batch)."""
    return payload.batch if isinstance(payload, PackedBatch) else payload


class ByTarget:
    """A pact sending each ``(target, payload)`` record to worker ``target``."""

    name = "ByTarget"

    def connect(self, host: Any, identifier: int, path: tuple[int, ...]) -> tuple[Any, Any]:
        pushers, puller = host.allocate(identifier, path)
        return _TargetPusher(pushers), puller


class _TargetPusher:
    __slots__ = ("pushers",)

    def __init__(self, pushers: list[Push]) -> None:
        self.pushers = pushers

    def push(self, message: Message) -> None:
        time, batch = message
        parts: dict[int, list[Any]] = {}
        for record in batch:
            if isinstance(record[2], pa.RecordBatch):  # pickled compactly if sent away
                record = (record[0], record[1], PackedBatch(record[2]))
            parts.setdefault(record[0], []).append(record)
        for target, part in parts.items():
            self.pushers[target].push((time, part))


@dataclass
class Shared:
    """What the router F and the state operator S of one worker share (worker-local memory).

    Attributes:
        take: ``take(bins) -> {bin: pa.Table}``: export the state of ``bins`` and forget it.
        take_to: the state's ``take_to(bins, new owners) -> {new owner: pa.Table}`` when it
            has one (a ``ColumnarState``): F then sends each new owner one table of all its
            bins' rows per slice (or per step taken in one call), keyed by the least of those
            bins (the state's ``load`` takes rows of any bins), instead of one table per bin.
        sizes: bytes per bin of all the state held (``pa.Table.nbytes`` of each bin's
            table in a full export; measuring).
        per_bin: the state's ``take_per_bin``: F takes a step's bins in slices (else in one
            call, then sends).
        prepare: the state's ``prepare_take(deadline)``: F calls it while a step moving bins
            away waits for S, at most ``PREPARE_SECONDS`` per activation, until it returns
            True once for that step.
        applied: S's input frontier (elements of all its inputs) when it last ran: F sends a
            bin's state at ``t`` once no element is ``< t``.
        waiting: F waits for S (S activates F after each run).
        released: called by F after a take: S releases the tokens of the state it no longer
            holds.
        moved: this worker's migration steps (``StepStats``), in order.
        loads: the moved state this worker received and loaded (``LoadStats``), in order.
    """

    take: Callable[[list[int]], Mapping[int, pa.Table]]
    take_to: Callable[[np.ndarray, np.ndarray], dict[int, pa.Table]] | None = None
    sizes: Callable[[], dict[int, int]] = dict
    per_bin: bool = True
    prepare: Callable[[float], bool] = lambda deadline: True
    applied: list[Any] = field(default_factory=lambda: [0])
    activate_router: Callable[[], None] = lambda: None
    released: Callable[[], None] = lambda: None
    waiting: bool = False
    moved: list[StepStats] = field(default_factory=list)
    loads: list[LoadStats] = field(default_factory=list)


@dataclass
class MigrationHandle:
    """A worker's view of one migrating operator: its ``controller`` (worker 0 drives it),
    ``stream`` (its output) and the ``moved`` steps this worker recorded."""

    name: str
    controller: Controller
    shared: Shared
    stream: Stream

    @property
    def moved(self) -> list[StepStats]:
        return self.shared.moved


@dataclass
class MegaphoneHandle(MigrationHandle):
    """``megaphone_fold``'s handle; ``state`` is the worker's ``KeyedState``."""

    keyed: KeyedState[Any, Any] = field(default_factory=KeyedState)

    @property
    def state(self) -> KeyedState[Any, Any]:
        return self.keyed


def _owners_at(versions: list[tuple[int, np.ndarray]], time: int) -> np.ndarray:
    """The owners in effect at ``time``: the latest version from a time ``<= time``."""
    i = bisect.bisect_right(versions, time, key=lambda v: v[0]) - 1
    if i < 0:
        raise AssertionError(f"no routing table version for time {time} (oldest kept: "
                             f"{versions[0][0]})")
    return versions[i][1]


Splitter = Callable[[Any, np.ndarray], Iterable[tuple[int, Any]]]
"""``split(batch, owners) -> [(worker, part)]``: a data batch cut by the owner of each record's
bin (``owners``: worker per bin, the routing table version in effect at the batch's time)."""


def _checkpointed(worker: Any) -> bool:
    """The worker takes checkpoints (it has an input log) or restores one."""
    return getattr(worker, "input_log", None) is not None or \
        getattr(worker, "restore", None) is not None


def checkpointable(worker: Any, name: str) -> None:
    """Refuse a migrating operator in a checkpointed or restored job whose workers may join or
    leave (``tokenflow.membership``): its roster and slots are not part of a checkpoint.

    Raises:
        NotImplementedError: the job has free worker slots and takes checkpoints or restores.
    """
    if getattr(worker, "elastic", False) and _checkpointed(worker):
        raise NotImplementedError(
            f"{name}: a job whose workers join and leave (worker slots beyond its workers) is "
            f"not checkpointed: the roster and the joined workers' progress state are not part "
            f"of a checkpoint; run it without free slots to combine rescaling and checkpoints")


def restored_table(worker: Any, key: str, table: RoutingTable, peers: int) -> RoutingTable:
    """The routing table a migrating operator starts from: ``table``, or when the worker
    restores a checkpoint, the table the operator had at the checkpoint's epoch (the parts'
    ``ROUTING_META``), rebalanced onto workers ``0..peers-1`` when its roster is another
    (a restore at another worker count); a checkpoint without it (written by a job without
    this operator) gives the job's table rebalanced the same way."""
    snapshot = getattr(worker, "restore", None)
    if snapshot is None:
        return table
    saved = None
    for w in snapshot.workers:
        saved = snapshot.worker_meta(w).get(ROUTING_META, {}).get(key)
        if saved is not None:
            break
    restored = RoutingTable.from_json(saved) if saved is not None else table
    if restored.bins != table.bins:
        raise ValueError(f"{key}: the checkpoint's routing table has {restored.bins} bins, the "
                         f"operator {table.bins}")
    if set(restored.roster) != set(range(peers)) or int(restored.owners.max()) >= peers:
        restored = restored.rebalanced(range(peers))
    return restored


def register_state(worker: Any, key: str, state: BinnedState, table: RoutingTable) -> None:
    """Declare a migrating operator's ``state`` with the worker under ``key`` (so checkpoints
    export it per bin) and attach it to the operator's own ``table``; when restoring, load the
    bins this worker owns in ``table`` (``Worker.register_state`` does the same with the job's
    table).

    Raises:
        ValueError: ``key`` is already declared.
    """
    states = getattr(worker, "states", None)
    owned = table.owned_by(worker.index)
    state.attach(table.bins, int(owned[0]) if len(owned) else -1)
    if states is None:
        return
    if key in states:
        raise ValueError(f"worker {worker.index}: operator state {key!r} declared twice")
    states[key] = state
    snapshot = getattr(worker, "restore", None)
    if snapshot is not None:
        state.load(snapshot.read(key, owned.tolist()))
        state.mark_unchanged()


class _Send:
    """A step at ``time`` this worker's router sends bins at (or, measuring, only records):
    the tokens it holds at ``time`` on every output until the last slice is out, the moves
    from this worker, their ``bins`` and ``news`` (new owners) as arrays, the position of
    the first bin not yet taken (``taken``), the bins of the next ``slice``, the Arrow
    ``bytes`` sent so far and ``started`` (None before the first slice; then the bytes of the
    whole state when measuring, else 0).

    Arrays, since a slice is cut from them without a pass of Python over its bins: a take
    is code a worker runs rarely, so it runs with its caches cold, and alone on a core, 1 s
    after the thread last ran, walking a dict of 1,365 bins (``take_to`` filling its owner
    array from one) cost 1.3 ms of a 5 ms take of a small q8 state."""

    __slots__ = ("time", "tokens", "moves", "bins", "news", "taken", "least", "slice",
                 "bytes", "started", "due", "slices", "longest", "taking", "longest_cpu",
                 "longest_held", "prepared")

    def __init__(self, time: int, tokens: list[Any], moves: list[Move]) -> None:
        self.time = time
        self.tokens = tokens
        self.moves = moves
        self.bins = np.fromiter((m.bin for m in moves), dtype=np.int64, count=len(moves))
        self.news = np.fromiter((m.new for m in moves), dtype=np.int64, count=len(moves))
        self.taken = 0
        self.least = -(-len(moves) // MAX_SLICES)
        self.slice = max(self.least, min(len(moves), 8))
        self.bytes = 0
        self.started: int | None = None
        self.due = 0.0
        self.slices = 0
        self.longest = 0.0
        self.taking = 0.0
        self.longest_cpu = 0.0
        self.longest_held = 0.0
        self.prepared = False  # the state's ``prepare_take`` said it was done

    def next_slice(self, bins: int, seconds: float) -> int:
        """Bins of the next slice after one of ``bins`` took ``seconds``: scaled towards half
        of ``SLICE_SECONDS`` (at most halved or doubled at once), never below ``least``.

        Half, since a bin's cost varies within a step: in paced q5 runs a slice scaled to the
        whole budget from the last one's rate took up to 2.5x the last's per bin (2.3 ms for
        330 bins, then 5.7 ms for 342).  Aimed at half, the longest slice of a run (four
        all-at-once changes; two runs each of q5 and q8) used 3.0-3.7 ms of CPU, where q5's
        had used 4.4-5.7 ms aimed at the whole budget (five runs)."""
        want = min(max(bins * SLICE_SECONDS / 2 / max(seconds, 1e-6), bins / 2), 2 * bins)
        return max(self.least, 1, int(want))

    def left(self) -> int:
        """Bins not taken yet."""
        return len(self.bins) - self.taken


def router(streams: list[Stream], split: list[Splitter], table: RoutingTable, shared: Shared,
           lead: int = 1, measure: bool = False,
           name: str = "Megaphone", spread: bool = False) -> tuple[list[Stream], Controller]:
    """F, the router of a migrating operator with one input per stream of ``streams``.

    Output ``i`` carries input ``i``'s records as ``(worker, "d", part)`` and, on output 0,
    moved state as ``(worker, "s", MovedState)`` (``moved_parts`` gives its ``{bin:
    pa.Table}``); connect each with ``ByTarget()``.
    A record at time ``s`` is routed once the control frontier has passed ``s``, by the
    routing table version in effect at ``s`` (``split(batch, owners)``).  For a step at ``t``
    moving bins away from this worker (every step when ``measure``), F holds a token at ``t``
    on every output until S has applied every record before ``t`` (``shared.applied``), then
    takes the bins' state (``shared.take``) and sends it at ``t`` to their new owners, in
    slices when the state's take costs per bin (``shared.per_bin``, a ``BinnedState``'s
    ``take_per_bin``; else in one take): each activation takes and sends slices of the step's
    bins while the last slice's time still fits in ``SLICE_SECONDS``, then yields to the
    worker loop (activating itself again); the tokens at ``t``
    are dropped with the last slice, so the new owners' frontiers stay at ``t`` until every
    slice is out.  Logically nothing changes (all of a step's bins move at ``t``); the work is
    spread over several steps of the worker.  What an activation sent is flushed to the mesh
    at once (``Worker.flush``), not after the rest of the worker's step.
    ``table`` is the operator's table at the start (a restored one, ``restored_table``).
    The controller's ``settled`` and ``table_at`` answer the checkpoint protocol.

    Returns:
        The routed streams (one per input) and the ``Controller`` (registered with the
        worker's ``rescalers``).
    """
    scope = streams[0].scope
    worker = scope.worker
    data_frontier: list[Any] = [[0]]
    control, controller = control_stream(scope, table, lambda: data_frontier[0], lead,
                                         f"{name}.Control", spread=spread)
    worker.rescalers.append(controller)

    builder = OperatorBuilder(f"{name}.Route", scope)
    data_ins = [builder.new_input(s, "pipeline") for s in streams]
    control_in = builder.new_input(control, Broadcast())
    outs = []
    routed = []
    for _ in streams:
        out, stream = builder.new_output()
        outs.append(out)
        routed.append(stream)
    me = scope.worker_index
    flush: Callable[[], None] = getattr(worker, "flush", lambda: None)
    controller.key = operator_key(builder.core.path, name)
    table = controller.table = restored_table(worker, controller.key, table, scope.peers)
    if getattr(worker, "restore", None) is not None:
        controller.floor = int(worker.restore.epoch)
    if _checkpointed(worker):
        controller.keep_from = controller.floor  # checkpoints ask ``table_at`` (epochs >= it)

    def constructor(caps: list[Any]) -> Any:
        for cap in caps:
            cap.drop()
        versions: list[tuple[int, np.ndarray]] = [(-(1 << 62), table.owners.copy())]
        waiting: dict[tuple[int, int], tuple[Any, list[Any]]] = {}  # (input, time) -> token, batches
        sends: list[_Send] = []  # steps at which this worker sends (or measures), in order
        shared.activate_router = builder_activate = builder.activator()
        sent_now = [False]
        last_take = [0.0]  # seconds the latest slice's take took, of any step

        def send_slices(send: _Send, deadline: float, clock: Activation) -> bool:
            """Take and send slices of ``send``'s bins until they are all sent (True) or the
            activation's budget would be passed (False): a slice starts only when the last
            one's time (of this step or, for its first slice, the step before) still fits
            before ``deadline``, or as the activation's first work (``clock``: the
            activation's migration work, as one block).  A fluid migration's steps fall due
            together when the worker is behind; without an estimate for a step's first slice
            each of them would start in the block whatever the budget left."""
            last = last_take[0]
            while send.left():
                if not clock.may_start(deadline, last):
                    return False
                clock.work(send)
                at = send.taken
                send.taken = min(len(send.bins), at + send.slice)
                chunk, news = send.bins[at:send.taken], send.news[at:send.taken]
                if not send.slices:
                    send.due = _time.time()
                began = _time.perf_counter()
                by_target: dict[int, dict[int, Any]] = collections.defaultdict(dict)
                parts: Mapping[int, Any]
                if shared.take_to is not None:  # one table per new owner, under its least bin
                    parts = shared.take_to(chunk, news)
                    for target, rows in parts.items():
                        by_target[target][int(chunk[news == target].min())] = rows
                else:
                    parts = shared.take(chunk.tolist())
                    for b, target in zip(chunk.tolist(), news.tolist(), strict=True):
                        if b in parts:
                            by_target[target][b] = parts[b]
                last = last_take[0] = _time.perf_counter() - began
                send.slices += 1
                send.taking += last
                if shared.per_bin:
                    send.slice = send.next_slice(len(chunk), last)
                crash_point("megaphone.move")  # taken out here, not yet sent: in flight
                if by_target:
                    outs[0].give_batch(send.tokens[0], [(target, "s", MovedState(tables))
                                                        for target, tables in by_target.items()])
                    sent_now[0] = True
                if not measure:
                    send.bytes += sum(tb.nbytes for tb in parts.values())
            return True

        def settled(epoch: int) -> str | None:
            due = [send.time for send in sends if send.time <= epoch]
            if due:
                return f"{name}: worker {me} has {len(due)} moves at times <= {epoch} to send"
            held = [t for _, t in waiting if t <= epoch]
            if held:  # records this router holds are in no state: route them first
                return f"{name}: worker {me} holds records at {min(held)} to route"
            return None

        def table_at(epoch: int) -> RoutingTable:
            return RoutingTable(_owners_at(versions, epoch), table.roster)

        controller.settled = settled
        controller.table_at = table_at

        def owns_nothing() -> str | None:  # asked before this worker may leave the job
            owned = int(np.count_nonzero(versions[-1][1] == me))
            if owned or sends:
                return f"{name}: worker {me} still owns {owned} bins ({len(sends)} steps to send)"
            return None

        worker.leave_checks.append(owns_nothing)

        def route(i: int, time: int, token: Any, batches: list[Any]) -> None:
            owners = _owners_at(versions, time)
            records = [(t, "d", part) for batch in batches for t, part in split[i](batch, owners)]
            if records:
                outs[i].give_batch(token, records, time=time)

        def apply(time: int, moves: list[Move]) -> None:
            owners = _owners_at(versions, time).copy()
            for m in moves:
                owners[m.bin] = m.new
            bisect.insort(versions, (time, owners), key=lambda v: v[0])
            for later in range(len(versions)):  # a step applies to later versions too
                t, later_owners = versions[later]
                if t > time:
                    for m in moves:
                        later_owners[m.bin] = m.new

        def logic(frontiers: Any) -> None:
            for time, moves in controller.take_adopted():  # a joined worker: steps before it
                apply(time, moves)
            for ref, batch in control_in:
                moves = list(map(Move._make, batch))
                apply(ref.time, moves)
                mine = [m for m in moves if m.old == me]
                if mine or measure:
                    sends.append(_Send(ref.time, [ref.retain_for_output(o)
                                                  for o in range(len(outs))], mine))
            control_frontier = control_in.frontier
            for i, data_in in enumerate(data_ins):
                for ref, batch in data_in:
                    if not len(batch):
                        continue
                    if control_frontier.less_equal(ref.time):
                        held = waiting.get((i, ref.time))
                        if held is None:
                            waiting[(i, ref.time)] = (ref.retain_for_output(i), [batch])
                        else:
                            held[1].append(batch)
                    else:
                        route(i, ref.time, ref, [batch])
            for key in sorted(waiting, key=lambda k: k[1]):
                if not control_frontier.less_equal(key[1]):
                    token, batches = waiting.pop(key)
                    route(key[0], key[1], token, batches)
                    token.drop()
            elements = [e for data_in in data_ins for e in data_in.frontier.frontier()]
            now = [min(elements)] if elements else []
            if now != data_frontier[0]:
                data_frontier[0] = now
                controller.activate()  # the control source follows the data frontier
            # versions no record can use any more (none may still arrive, none waits here)
            # and no checkpoint's ``table_at`` may ask for
            low = min([*now, *(t for _, t in waiting)], default=None)
            if low is not None and controller.keep_from is not None:
                low = min(low, controller.keep_from)
            if low is not None and len(versions) > 1:
                keep = bisect.bisect_right(versions, low, key=lambda v: v[0]) - 1
                if keep > 0:
                    del versions[:keep]
            deadline = _time.perf_counter() + SLICE_SECONDS
            finished: list[_Send] = []
            clock = Activation()  # this activation's migration work, as one block
            for send in list(sends):
                if send.started is None:
                    applied = shared.applied
                    if applied and min(applied) < send.time:
                        # S has not applied every record before t yet: meanwhile make the
                        # take cheaper (hash keys), a little per activation until done (a
                        # call passes over the state's chunks; F runs at every message)
                        if send.moves and not send.prepared and \
                                clock.may_start(deadline, PREPARE_SECONDS):
                            clock.work(send)
                            send.prepared = shared.prepare(
                                _time.perf_counter() + PREPARE_SECONDS)
                        continue
                    if not shared.per_bin:  # one take: each would pass over all the state
                        send.slice = send.left() or 1
                    if measure:  # the whole state's bytes per bin, just before the step
                        sizes = shared.sizes()
                        send.started = sum(sizes.values())
                        send.bytes = sum(sizes.get(m.bin, 0) for m in send.moves)
                    else:
                        send.started = 0
                if send.left() and not send_slices(send, deadline, clock):
                    builder_activate()  # more of this step's bins next time; later steps wait
                    break
                finished.append(send)
                for token in send.tokens:
                    token.drop()
                sends.remove(send)
                if send.moves:
                    shared.released()
            if sent_now[0]:
                sent_now[0] = False
                flush()  # the state goes out now, not after the rest of this worker's step
            clock.stop()
            for send in finished:
                shared.moved.append(StepStats(
                    send.time, len(send.moves), send.bytes, send.started or 0, send.due,
                    _time.time() if send.slices else 0.0, send.slices, send.longest,
                    send.taking, send.longest_cpu, send.longest_held))
            shared.waiting = bool(sends)

        return logic

    builder.build(constructor)
    return routed, controller


def megaphone_fold(stream: Stream, fold: Callable[[Any, Any, Any], tuple[Any, Iterable[Any]]],
                   key: Callable[[Any], Any] | None = None, *, initial: RoutingTable | None = None,
                   lead: int = 1, name: str = "Megaphone") -> MegaphoneHandle:
    """A per-key fold (as ``state_machine``) whose bins can move between workers at logical
    times: ``fold(key, value, current) -> (new, outputs)``, ``outputs`` sent at the record's
    time; ``key`` extracts the key (default ``record[0]``, the value then ``record[1]``).

    Args:
        initial: the starting routing table (default the job's); its roster may leave workers
            without bins (they own nothing until a step gives them some).
        lead: logical time units the controller stays ahead of the data frontier.

    Returns:
        A ``MegaphoneHandle``: ``stream`` (the outputs), ``controller`` (call ``rescale`` on
        worker 0), ``moved`` and ``state``.

    Checkpoints: the values (a ``KeyedState``) and the records waiting per time (a
    ``PendingRecords``) are registered with the worker as ``<S's path>:<name>.State/values``
    and ``.../pending``; restored, the operator starts from the checkpoint's routing table
    (``initial`` is then ignored) and holds a token per waiting time (module notes).

    Raises:
        NotImplementedError: the job has free worker slots (workers join and leave) and takes
            checkpoints or is restored (``checkpointable``).
    """
    scope = stream.scope
    worker = scope.worker
    checkpointable(worker, name)
    table = initial or worker.routing or RoutingTable.even(scope.peers)
    get_key = key if key is not None else (lambda r: r[0])
    state: KeyedState[Any, Any] = KeyedState()
    shared = Shared(take=state.take)
    pickled({})  # pyarrow imports pandas on its first table: not in the first migration step
    peers = getattr(worker, "slots", scope.peers)  # joining workers take free slots
    bins = table.bins

    bins_of_keys = KeyBins(bins)

    def split(records: list[Any], owners: np.ndarray) -> Iterable[tuple[int, Any]]:
        targets = owners[bins_of_keys(list(map(get_key, records)))]
        routes = targets.astype(np.uint8).tobytes() if peers <= MASKED_PEERS else targets.tolist()
        return partition_list(records, routes, peers)

    # -- S: the state ----------------------------------------------------------------------
    stash = PendingRecords(get_key, None)
    (routed,), controller = router([stream], [split], table, shared, lead, name=name)
    state_op = OperatorBuilder(f"{name}.State", scope)
    state_in = state_op.new_input(routed, ByTarget())
    out, outputs = state_op.new_output()
    prefix = operator_key(state_op.core.path, f"{name}.State")
    owners = controller.table
    register_state(worker, f"{prefix}/values", state, owners)
    register_state(worker, f"{prefix}/pending", stash, owners)
    controller.states = [f"{prefix}/values", f"{prefix}/pending"]
    controller.bin_bytes = state.bin_bytes

    activate = state_op.activator()

    def state_constructor(caps: list[Any]) -> Any:
        # a restored stash's times get their tokens from the initial token
        tokens: dict[int, Any] = {t: caps[0].delayed(t) for t in stash.pending_times()}
        caps[0].drop()
        data = state.data
        # moved state is loaded in slices (LoadQueue) and the frontier S acts on stays at
        # the move's time until it is all in: this worker folds no record of a moved bin at
        # or after that time before the bin's values (the old owner's token at the time
        # holds the input frontier there until its last slice is sent)
        loads = LoadQueue(lambda parts: state.load(parts), shared.loads)  # (late bound)
        frontier = ClampedFrontier(state_in.frontier, loads.floor)

        def logic(frontiers: Any) -> None:
            for ref, batch in state_in:
                for _, kind, payload in batch:
                    if kind == "s":
                        loads.add(ref, payload)
                    else:
                        if ref.time not in tokens:
                            tokens[ref.time] = ref.retain()
                        stash.add(ref.time, unpacked(payload))
            if loads.run() and loads.pending:
                activate()  # more slices to load
            for t in sorted(tokens):
                if frontier.less_equal(t):
                    break
                token = tokens.pop(t)
                with out.session(token) as session:
                    for part in stash.pop(t):
                        fold_records(part, data, fold, get_key, key is not None, session)
                token.drop()
            shared.applied = frontier.frontier()
            if shared.waiting:
                shared.activate_router()

        return logic

    state_op.build(state_constructor)
    return MegaphoneHandle(name, controller, shared, outputs, state)
