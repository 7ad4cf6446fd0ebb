"""Flink-style in-band watermarks as a library idiom on timestamp tokens.

Source: the timestamp-tokens paper §4 ("We can also implement Flink-style watermarks, with
operators that explicitly hold timestamp tokens for their output watermarks and downgrade them
whenever these watermarks advance"), §2.1 (Flink: watermarks "interleaved in the stream of data
itself, and each operator is required to produce them in their output streams as well") and §7
(watermarks re-implemented on the same runtime to compare them with tokens and notifications).

Design (one stream, watermarks in band):

- A ``Watermark(time, worker)`` record travels inside ordinary ``list`` batches, between data
  records, and promises that *the worker that sent it* sends no more data with a time
  ``< time`` on this stream.  ``MAX_WATERMARK`` ends the stream (Flink's ``MAX_WATERMARK``).
- A watermark must reach every downstream worker while data stays pipelined (or is exchanged
  by key), through the *same* FIFO channel as the data, so that it never overtakes data sent
  before it.  ``WatermarkPact`` is that channel: data goes to this worker (or by key) and
  watermark records are dealt to the workers round-robin.  A producer therefore emits each
  watermark as ``peers`` consecutive copies (``broadcast_copies``), like timely's broadcast
  (one copy per worker, then an exchange), so the progress tracker counts every copy it
  delivers.  With a pipeline consumer (``capture``, ``strip_watermarks``) a worker simply sees
  its own ``peers`` copies.
- ``assign_watermarks`` turns the token world into watermarks: it passes data through and, when
  its input frontier advances, sends ``Watermark(min frontier, worker)``.  It holds one token
  for its output watermark and downgrades it as the watermark advances.
- Consumers (``tumbling_watermark``, ``forward_watermarks``) track the latest watermark of every
  upstream worker; their input watermark is the minimum of those.  They decide from it alone —
  not from the input frontier — and must forward their own output watermark downstream.  Unlike
  an operator on tokens, which the system can bypass while it is idle (paper §5.2), a watermark
  operator is invoked on every watermark and must re-emit it, at every stage of a dataflow.

Times are ``int`` event-time units; a ``Watermark(w, ·)`` record is always sent at time ``w``.

State (Megaphone, Hoffmann et al., VLDB 2019: declared per bin so that the system can snapshot
it and restore it at another worker count): every operator declares what it keeps between
invocations with ``OperatorInfo.state``:

- ``"watermark"``: a worker-local ``LocalState`` — ``assign_watermarks``' held output
  watermark (an ``int``), or a consumer's ``WatermarkTracker`` (latest watermark per upstream
  worker, its minimum; the output-watermark token is held at that minimum).  Its
  ``pending_times()`` is the held token's time; parts of several old workers merge to the
  minimum (watermarks are lower bounds, so a lower one is always safe).  A restored consumer
  restarts every upstream worker at the restored minimum when the worker count changed.
- ``"windows"`` (``tumbling_watermark``): the open windows — worker-local (``open_windows``)
  when data is pipelined, ``KeyedWindows`` (per bin of ``key(record)``, the bin the
  ``WatermarkPact`` routes the record by) when exchanged by ``key``.  These windows hold no
  tokens of their own: the output-watermark token, at or before every open window's end,
  covers their output.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.channels import ChannelHost, Message, Pull, Push
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary, unary_frontier
from tokenflow.dataflow.operators.window import (
    Reduce,
    Windows,
    call_reduce,
    check_int_time,
    check_window_sizes,
    merge_windows,
    open_windows,
    rows,
)
from tokenflow.dataflow.routing import KeyRouter, partition_batch
from tokenflow.dataflow.state import BinnedState, LocalState, key_bins, pickled, unpickled
from tokenflow.state.bins import RoutingTable

if TYPE_CHECKING:
    from collections.abc import Callable

    from tokenflow.dataflow.stream import Stream

MAX_WATERMARK: int = 2**63 - 1
"""The final watermark: the sending worker's stream has ended (Flink's ``MAX_WATERMARK``)."""


@dataclass(frozen=True, slots=True)
class Watermark:
    """An in-band watermark: worker ``worker`` sends no more data at times ``< time``.

    Attributes:
        time: the watermark, in event-time units (``MAX_WATERMARK`` at the end of the stream).
        worker: the index of the upstream worker that sent it.
    """

    time: int
    worker: int


class LateDataError(RuntimeError):
    """Data arrived for a window its operator had already closed on a watermark."""


def broadcast_copies(time: int, worker: int, peers: int) -> list[Watermark]:
    """``peers`` copies of ``Watermark(time, worker)``: one per downstream worker.

    Send them consecutively (one ``give_batch``) so that a ``WatermarkPact`` deals exactly one
    copy to each worker.
    """
    return [Watermark(time, worker)] * peers


def has_watermark(batch: Any) -> bool:
    """True when a ``list`` batch holds a ``Watermark`` record (a C-speed scan of types)."""
    return isinstance(batch, list) and Watermark in map(type, batch)


def split_runs(batch: list[Any]) -> list[tuple[bool, list[Any]]]:
    """Split ``batch`` into maximal runs ``(is_watermark, records)`` keeping their order."""
    runs: list[tuple[bool, list[Any]]] = []
    current: list[Any] = []
    kind = False
    for record in batch:
        is_wm = type(record) is Watermark
        if is_wm != kind and current:
            runs.append((kind, current))
            current = []
        kind = is_wm
        current.append(record)
    if current:
        runs.append((kind, current))
    return runs


# -- the channel ---------------------------------------------------------------------------


class WatermarkPusher:
    """Routes data like ``Pipeline`` (or ``Exchange(key)``) and deals watermarks round-robin.

    One pusher exists per (channel, sending worker); its round-robin position persists across
    batches, so a producer's ``peers`` consecutive copies reach ``peers`` distinct workers even
    if a session split them over two batches.  All records from one sender to one receiver
    travel through one FIFO, so a watermark never overtakes data sent before it.  Keyed data
    goes where ``Exchange`` would send it: to the owner of the key's bin in ``table`` (the
    job's ``RoutingTable``; without one, ``routes_for`` over the pushers), so keyed state is on
    the worker that owns its bin.
    """

    __slots__ = ("pushers", "local", "key", "column", "next_target", "table", "router")

    def __init__(self, pushers: Sequence[Push], local: int, key: Callable[[Any], Any] | None,
                 column: str | None, table: RoutingTable | None = None) -> None:
        self.pushers = list(pushers)
        self.local = local
        self.key = key
        self.column = column
        self.next_target = 0
        self.table = table
        self.router = KeyRouter(key, table if table is not None else len(self.pushers))

    def _data(self, time: Any, batch: Any) -> None:
        pushers = self.pushers
        if (self.key is None and self.column is None) or len(pushers) == 1:
            pushers[self.local].push((time, batch))
            return
        for worker, part in partition_batch(batch, len(pushers), self.key, self.column,
                                             self.router, self.table):
            pushers[worker].push((time, part))

    def _watermarks(self, time: Any, records: list[Any]) -> None:
        pushers = self.pushers
        peers = len(pushers)
        target = self.next_target
        parts: dict[int, list[Any]] = {}
        for record in records:
            parts.setdefault(target, []).append(record)
            target = (target + 1) % peers
        self.next_target = target
        for worker, part in parts.items():
            pushers[worker].push((time, part))

    def push(self, message: Message) -> None:
        """Route one ``(time, batch)`` message."""
        time, batch = message
        if not has_watermark(batch):
            self._data(time, batch)
            return
        for is_wm, run in split_runs(batch):
            if is_wm:
                self._watermarks(time, run)
            else:
                self._data(time, run)


class WatermarkPact:
    """The in-band watermark channel: data pipelined (or exchanged), watermarks to all workers.

    Args:
        key: ``record -> key`` to exchange data records (None: data stays on its worker).
        column: for Arrow batches, the key column to exchange by.

    Watermark records are dealt round-robin over the workers, so producers send each watermark
    as ``peers`` consecutive copies (``broadcast_copies``).
    """

    name = "WatermarkPact"
    replayable = False
    """A watermark's copies name their sender and are dealt one per worker: not channel state
    (``tokenflow.dataflow.channels.Pact``)."""

    def __init__(self, key: Callable[[Any], Any] | None = None, column: str | None = None) -> None:
        self.key = key
        self.column = column

    def connect(self, host: ChannelHost, identifier: int,
                path: tuple[int, ...]) -> tuple[Push, Pull]:
        """Allocate the channel on ``host`` and wrap its pushers in a ``WatermarkPusher``."""
        pushers, puller = host.allocate(identifier, path)
        return WatermarkPusher(pushers, host.index, self.key, self.column,
                               getattr(host, "routing", None)), puller


# -- operators -----------------------------------------------------------------------------


def _merge_marks(into: int | None, other: int | None) -> int | None:
    """Held output watermarks of several old workers: the least (None: nothing held)."""
    if into is None:
        return other
    return into if other is None else min(into, other)


def held_watermark() -> LocalState[int | None]:
    """``assign_watermarks``' state: the time of its output-watermark token (``value``; None
    once it sent ``MAX_WATERMARK`` and dropped it, or when nothing was restored)."""
    return LocalState(lambda: None, _merge_marks, times=lambda v: [] if v is None else [v],
                      empty=lambda v: v is None)


def assign_watermarks(stream: Stream, name: str = "AssignWatermarks") -> Stream:
    """Pass ``stream``'s data through and add in-band watermarks from its input frontier.

    Whenever the input frontier advances to ``w`` the operator downgrades its output-watermark
    token to ``w`` and sends ``peers`` copies of ``Watermark(w, worker_index)`` at time ``w``
    (after every data record it passed before); when the frontier empties it sends
    ``MAX_WATERMARK`` and drops the token.  Data is pipelined in and out unchanged.

    Consume the result through a ``WatermarkPact`` (as ``tumbling_watermark`` and
    ``forward_watermarks`` do), which delivers one copy of each watermark to every worker.

    State: ``"watermark"`` (``held_watermark``), the token's time; a restored operator holds
    its token there again (the least of the merged old workers' times).

    Args:
        stream: a stream with ``int`` times.
        name: the operator's name.

    Returns:
        The data of ``stream`` with ``Watermark`` records interleaved.

    Source: the timestamp-tokens paper §4 (a token held for the output watermark).
    """

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        state = info.state("watermark", held_watermark())
        restored = state.value is not None
        if restored:  # hold the token at the old watermark
            token = capability.delayed(state.value)
            capability.drop()
            capability = token
        state.value = capability.time
        holder: list[Capability | None] = [capability]  # the output-watermark token
        sent: list[int | None] = [None]  # the last watermark this run sent

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                output.give_batch(ref, batch)
            cap = holder[0]
            if cap is None:
                return
            frontier = input.frontier.frontier()
            wm = MAX_WATERMARK if not frontier else check_int_time(min(frontier), name)
            # A restored operator also sends its restored watermark once its input reaches it:
            # consumers on workers that restored no tracker state (a job restored at more
            # workers) start from the least time and need every upstream worker's watermark.
            if wm > cap.time or (restored and sent[0] is None and wm == cap.time):
                if wm > cap.time:
                    cap.downgrade(wm)
                state.value = wm
                sent[0] = wm
                output.give_batch(cap, broadcast_copies(wm, worker, peers))
            if wm == MAX_WATERMARK:
                cap.drop()
                holder[0] = None
                state.value = None

        return logic

    return unary_frontier(stream, "pipeline", name, constructor)


class WatermarkTracker:
    """The input watermark of a consumer: the minimum over upstream workers' latest watermarks.

    The consumer holds its output-watermark token at ``current`` (dropped at
    ``MAX_WATERMARK``); the tracker is the value of its ``"watermark"`` state
    (``tracked_watermark``).

    Args:
        peers: the number of upstream workers.
        initial: the watermark assumed before a worker sent one (the scope's minimum time).
    """

    __slots__ = ("latest", "current", "name")

    def __init__(self, peers: int, initial: int, name: str) -> None:
        self.latest = [initial] * peers
        self.current = initial
        self.name = name

    def observe(self, records: Iterable[Any]) -> bool:
        """Record the watermarks among ``records``; True when the minimum advanced.

        Raises:
            ValueError: for a watermark naming a worker outside ``0..peers-1``.
        """
        latest = self.latest
        for record in records:
            if type(record) is Watermark:
                w = record.worker
                if not 0 <= w < len(latest):
                    raise ValueError(
                        f"operator {self.name!r}: {record!r} names worker {w}, but there are "
                        f"{len(latest)} workers"
                    )
                if record.time > latest[w]:
                    latest[w] = record.time
        low = min(latest)
        if low > self.current:
            self.current = low
            return True
        return False

    def resume(self, restored: WatermarkTracker) -> None:
        """Continue from a restored tracker: its minimum, and its per-worker watermarks when
        it tracked as many upstream workers (else every worker restarts at the minimum)."""
        self.current = restored.current
        if len(restored.latest) == len(self.latest):
            self.latest = list(restored.latest)
        else:
            self.latest = [restored.current] * len(self.latest)

    def ended(self) -> bool:
        """True once every upstream worker sent ``MAX_WATERMARK``."""
        return self.current == MAX_WATERMARK


def _merge_trackers(into: WatermarkTracker | None,
                    other: WatermarkTracker | None) -> WatermarkTracker | None:
    """Trackers of several old workers as one: per-worker and overall minima (per worker only
    when they tracked as many upstream workers)."""
    if into is None or other is None:
        return other if into is None else into
    if len(into.latest) == len(other.latest):
        into.latest = [min(a, b) for a, b in zip(into.latest, other.latest, strict=True)]
    into.current = min(into.current, other.current)
    if len(into.latest) != len(other.latest):
        into.latest = [into.current] * len(into.latest)
    return into


def tracked_watermark() -> LocalState[WatermarkTracker | None]:
    """A consumer's ``"watermark"`` state: its ``WatermarkTracker`` (None until the operator
    installs its own, or when nothing was restored); ``pending_times()`` is the token's time,
    ``current``, until ``MAX_WATERMARK``."""
    return LocalState(lambda: None, _merge_trackers,
                      times=lambda t: [] if t is None or t.ended() else [t.current],
                      empty=lambda t: t is None)


def _track(capability: Capability, info: OperatorInfo, name: str,
           ends: Iterable[int] = ()) -> tuple[WatermarkTracker, Capability | None]:
    """Declare a consumer's ``"watermark"`` state; return its live tracker and the
    output-watermark token: the initial one, or after a restore one minted at the restored
    watermark (or at an earlier restored window end ``ends``, whose output it must send), or
    None when the restored stream had ended."""
    state = info.state("watermark", tracked_watermark())
    tracker = WatermarkTracker(info.peers, capability.time, name)
    restored = state.value
    state.value = tracker
    if restored is None:
        return tracker, capability
    tracker.resume(restored)
    if tracker.ended():
        capability.drop()
        return tracker, None
    token = capability.delayed(min([tracker.current, *ends]))
    capability.drop()
    return tracker, token


def _data_records(batch: Any) -> tuple[list[Any], list[Any]]:
    """``(data, watermarks)`` of a batch (fast path: a batch without watermarks)."""
    if not has_watermark(batch):
        return rows(batch), []
    data = [r for r in batch if type(r) is not Watermark]
    marks = [r for r in batch if type(r) is Watermark]
    return data, marks


class KeyedWindows(BinnedState):
    """Open windows of records exchanged by ``key`` (``value``: window end -> records, in
    arrival order), exported per bin of ``key(record)`` — the bin ``WatermarkPact(key)``
    routes the record by, so a worker restored with the bins it owns holds exactly the records
    of the keys routed to it.  Each bin's table is one pickled ``Windows`` (``PICKLE_SCHEMA``);
    loading merges windows (``merge_windows``).  Holds no tokens (``pending_times()`` is
    empty): the consumer's output-watermark token covers the windows' output.
    """

    def __init__(self, key: Callable[[Any], Any]) -> None:
        self.value: Windows = {}
        self._key = key

    def _bins_of(self, records: list[Any]) -> np.ndarray:
        """Bin of each record's key (int64), as the exchange computes it."""
        key = self._key
        return key_bins([key(r) for r in records], self.bins or 1)

    def _by_bin(self, bins: Iterable[int] | None) -> dict[int, Windows]:
        wanted = None if bins is None else set(bins)
        out: dict[int, Windows] = {}
        for end, records in self.value.items():
            if not records:
                continue
            of_row = self._bins_of(records)
            order = np.argsort(of_row, kind="stable")
            sorted_bins = of_row[order]
            cuts = np.flatnonzero(np.r_[True, sorted_bins[1:] != sorted_bins[:-1]])
            stops = np.r_[cuts[1:], len(order)]
            for lo, hi in zip(cuts.tolist(), stops.tolist(), strict=True):
                b = int(sorted_bins[lo])
                if wanted is None or b in wanted:
                    out.setdefault(b, {})[end] = [records[i] for i in order[lo:hi].tolist()]
        return out

    def export(self, bins: Iterable[int] | None = None) -> dict[int, pa.Table]:
        return {b: pickled(windows) for b, windows in self._by_bin(bins).items()}

    def load(self, parts: Mapping[int, pa.Table]) -> None:
        for b in sorted(parts):
            for windows in unpickled(parts[b]):
                merge_windows(self.value, windows)

    def discard(self, bins: Iterable[int]) -> None:
        gone = np.fromiter(bins, dtype=np.int64)
        for end in list(self.value):
            records = self.value[end]
            keep = ~np.isin(self._bins_of(records), gone) if records else np.zeros(0, bool)
            kept = [r for r, k in zip(records, keep.tolist(), strict=True) if k]
            if kept:
                self.value[end] = kept
            else:
                del self.value[end]


def tumbling_watermark(
    stream: Stream,
    size: int,
    reduce: Reduce,
    key: Callable[[Any], Any] | None = None,
    name: str = "TumblingWatermark",
) -> Stream:
    """Tumbling windows closed by in-band watermarks (the Flink idiom), same output as ``tumbling``.

    ``stream`` carries data and ``Watermark`` records (from ``assign_watermarks`` or another
    watermark operator).  It is read through a ``WatermarkPact``: data stays on its worker (or is
    exchanged by ``key``) and every worker receives every upstream worker's watermarks.  A window
    ``[start, end)`` closes when the minimum of the upstream workers' latest watermarks reaches
    ``end``; then ``reduce(start, end, records)`` runs and its results are sent at time ``end``
    — exactly what ``tumbling`` sends.  The input frontier is never consulted (the operator is
    not even scheduled on frontier changes).

    The operator holds one token, for its output watermark, downgrades it when its input
    watermark advances and forwards that watermark (``peers`` copies at its time); at
    ``MAX_WATERMARK`` it closes every window, forwards it and drops the token.  As the paper
    notes (§5.2, §7.3), it must be invoked on every watermark and must forward watermarks even
    when idle — unlike ``tumbling``, which the system bypasses until its frontier moves.
    Remove the watermarks with ``strip_watermarks`` to compare with ``tumbling``.

    State: ``"windows"`` (worker-local ``open_windows``, or ``KeyedWindows`` by ``key``) and
    ``"watermark"`` (``tracked_watermark``); see the module notes.

    Args:
        stream: data and watermarks, with ``int`` times.
        size: the window length in time units (> 0).
        reduce: ``(start, end, records) -> iterable`` of output records.
        key: exchange data by this key before windowing (None: pipeline).
        name: the operator's name.

    Returns:
        Window outputs at their end times, with the forwarded watermarks interleaved.

    Raises:
        ValueError: when ``size <= 0``; at run time for a watermark naming an unknown worker.
        LateDataError: at run time when data arrives for an already closed window (upstream
            broke its watermark promise).

    Source: the timestamp-tokens paper §4 and §7 (Flink-style watermarks on the same runtime).
    """
    check_window_sizes(size, size, name)

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        state = info.state("windows", KeyedWindows(key) if key is not None
                           else open_windows(tokens=False))
        windows: Windows = state.value
        ends: list[int] = sorted(windows)  # a heap of the open windows' ends
        tracker, token = _track(capability, info, name, ends[:1])
        holder: list[Capability | None] = [token]  # the output-watermark token

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            advanced = False
            for ref, batch in input:
                t = check_int_time(ref.time, name)
                data, marks = _data_records(batch)
                if data:
                    end = t - t % size + size
                    if end <= tracker.current:
                        raise LateDataError(
                            f"operator {name!r}: data at time {t} arrived after the watermark "
                            f"{tracker.current} closed its window [{end - size}, {end})"
                        )
                    records = windows.get(end)
                    if records is None:
                        windows[end] = list(data)
                        heapq.heappush(ends, end)
                    else:
                        records.extend(data)
                if marks and tracker.observe(marks):
                    advanced = True
            cap = holder[0]
            if not advanced or cap is None:
                return
            wm = tracker.current
            while ends and ends[0] <= wm:
                end = heapq.heappop(ends)
                out = call_reduce(reduce, end - size, end, windows.pop(end), name)
                if out:
                    output.give_batch(cap, out, end)  # cap.time (old watermark) < end
            cap.downgrade(wm)
            output.give_batch(cap, broadcast_copies(wm, worker, peers))
            if wm == MAX_WATERMARK:
                cap.drop()
                holder[0] = None

        return logic

    return unary(stream, WatermarkPact(key), name, constructor)


def forward_watermarks(
    stream: Stream, key: Callable[[Any], Any] | None = None, name: str = "ForwardWatermarks"
) -> Stream:
    """A no-op watermark operator: passes data on and forwards its input watermark.

    Reads ``stream`` through a ``WatermarkPact`` (data pipelined or exchanged by ``key``,
    watermarks from every upstream worker), passes data through unchanged and, whenever the
    minimum of the upstream workers' latest watermarks advances, downgrades its output-watermark
    token and sends that watermark on (``peers`` copies).  A chain of these is the paper's §7.3
    watermark configuration ("watermarks-X" with ``WatermarkPact`` exchanges at every step).

    State: ``"watermark"`` (``tracked_watermark``: the tracker, whose minimum is the token's
    time); data is not held between invocations.

    Args:
        stream: data and watermarks, with ``int`` times.
        key: exchange data by this key (None: pipeline).
        name: the operator's name.

    Returns:
        The data with this operator's watermarks interleaved.
    """

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        worker, peers = info.worker_index, info.peers
        tracker, token = _track(capability, info, name)
        holder: list[Capability | None] = [token]

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            advanced = False
            for ref, batch in input:
                if not has_watermark(batch):
                    output.give_batch(ref, batch)
                    continue
                data = [r for r in batch if type(r) is not Watermark]
                if data:
                    output.give_batch(ref, data)
                if tracker.observe(batch):
                    advanced = True
            cap = holder[0]
            if advanced and cap is not None:
                wm = tracker.current
                cap.downgrade(wm)
                output.give_batch(cap, broadcast_copies(wm, worker, peers))
                if wm == MAX_WATERMARK:
                    cap.drop()
                    holder[0] = None

        return logic

    return unary(stream, WatermarkPact(key), name, constructor)


def strip_watermarks(stream: Stream, name: str = "StripWatermarks") -> Stream:
    """``stream`` without its ``Watermark`` records (pipelined; batches without any pass as is)."""

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        capability.drop()

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                if not has_watermark(batch):
                    output.give_batch(ref, batch)
                    continue
                data = [r for r in batch if type(r) is not Watermark]
                if data:
                    output.give_batch(ref, data)

        return logic

    return unary(stream, "pipeline", name, constructor)
