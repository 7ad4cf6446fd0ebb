"""A replayable source's remaining work handed to other workers at a logical time ``t``.

Source: Selvatici, *Rescaling of Timely Dataflow* (ETH, 2019), §6.2: a new worker receives no
capabilities, so no source can run on it; Megaphone (Hoffmann et al., VLDB 2019): an
assignment changes at a logical time, the old one for times ``< t``, the new one from ``t``
on; the distributed-DBSP design, "Scaling input" (input partitions re-assigned to workers).
The driver's side is ``tokenflow.resplit``; docs/ARCHITECTURE.md, "Sources of joining and
leaving workers".

Each worker's source operator (``tokenflow.io.sources._Reader``) keeps one ``Handover``
(``reader.moves``) and takes part in two phases, both run between steps:

1. ``fence(reader, margin)``: the source proposes ``point``, an epoch boundary after
   everything it has emitted (its safe point plus ``margin`` epochs), emits nothing at or
   after it and holds its token at or before it until phase 2 (a directory source lists no
   more files); it reports the splits it still reads (``keys``), those read to their end
   (``done``), whether it holds its token (``holds``) and whether it waits for a lent one
   (``waiting``: a worker that joined, whose operators hold only uncounted tokens).
2. ``reassign(reader, plan)``: the driver chose ``t`` (the greatest point) and the new
   assignment.  *Splits* (files, Parquet files, NEXMark generator slices): a giver keeps
   emitting a moving split's rows before ``t`` and, once its next row is at or after ``t``
   (or it ended), removes it and sends its offset to the receiver (a membership message on
   the mesh, ``("source", key, piece)``); a split already read to its end goes at once.  A
   receiver holds its token at ``t`` until every split it expects has arrived, then reads
   them from their offsets.  *Names* (an untimed directory: files are owned by a routing
   table of their names, and each file's rows get the epoch its owner first listed it in):
   every worker switches to the table rebalanced over the new roster for epochs ``>= t``
   and sends each new owner the names it has taken that the new table gives that owner;
   a worker lists again only once it knows every name another worker took (it holds its
   token at ``t`` until then), at epochs ``>= t``.

Why nothing is read twice or lost: a split's rows before ``t`` are emitted by its old
owner only (a giver stops at ``t``; a receiver starts at the offset of the first row at or
after ``t``), so the offsets partition the split.  A file name is taken by at most one
worker: the old owner before the fence, the new owner afterwards, which skips every name
taken by any worker before.  Why no frontier passes a time still to be read: a receiver's
token stays at or before ``t`` from phase 1 (the fence) until the splits arrive, and a
joined worker's token is a copy of a fenced worker's (``tokenflow.membership.lend``).

Positions (``SourceHandle.positions``, what snapshots record): a split is reported by the
worker that holds it, so the union over workers still names each split once once the
handover is complete; names a leaving worker hands over are recorded as done by their
receiver.  Not supported (``HandoverError``): sources with a ``time`` column over a directory
(files are splits with rows ``>= t`` still being read by their owner), a source logging its
division into epochs (``worker.input_log``: only under checkpoints, which a job with free
worker slots refuses), a source paused (by a snapshot round or by the job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class HandoverError(RuntimeError):
    """A source cannot hand its work over (names the source and why)."""


class Handover:
    """One source reader's state in a re-split (see the module docstring).

    Attributes:
        deciding: between phase 1 and phase 2 (fenced).
        fence: the point proposed in phase 1 (an epoch, or None).
        at: ``t`` of the last reassignment (None before any).
        give: split key -> receiving worker, for splits still to hand over at ``at``.
        expected: pieces (splits or name lists) the current reassignment brings here; None
            until phase 2 arrived.
        arrived: pieces received for it so far.
        pending: pieces that arrived before phase 2 reached this worker.
        handed: split key -> offset, for the splits this worker gave away in the last one.
        received: split key -> offset, for the splits handed to this worker.
        adopt_table: a directory source on a worker that never ran it (joined): it takes the
            name table from the senders' messages.
    """

    def __init__(self) -> None:
        self.deciding = False
        self.fence: int | None = None
        self.at: int | None = None
        self.give: dict[str, int] = {}
        self.expected: int | None = None
        self.arrived = 0
        self.pending: list[Any] = []
        self.handed: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.adopt_table = False

    @property
    def complete(self) -> bool:
        """Every piece the current reassignment brings here has arrived."""
        return not self.deciding and (self.expected is None or self.arrived >= self.expected)

    def bound(self, frontier: int | None) -> int | None:
        """The time the source's token must not pass now (None: no limit): the fence while
        deciding (the token's own time when there is no fence: a joined worker), ``t`` while
        pieces are still to come."""
        if self.deciding:
            return self.fence if self.fence is not None else frontier
        if not self.complete:
            return self.at
        return None


def moves_of(reader: Any) -> Handover:
    """``reader.moves``, created on first use."""
    if reader.moves is None:
        reader.moves = Handover()
    return reader.moves  # type: ignore[no-any-return]


def _mode(reader: Any) -> str:
    """``"names"`` for an untimed directory source, else ``"splits"``.

    Raises:
        HandoverError: a directory source with a time column, or one with an input log.
    """
    if not hasattr(reader, "taken"):
        return "splits"
    if reader.timed:
        raise HandoverError(f"source {reader.name!r}: a directory source with a time column "
                            "cannot hand its files over yet (its files are splits still being "
                            "read at times >= t); use one without time=, or keep its workers")
    if reader.log is not None:
        raise HandoverError(f"source {reader.name!r}: a directory source with an input log "
                            "(checkpoints) cannot hand its files over (a job with free worker "
                            "slots is not checkpointed)")
    return "names"


def fence(reader: Any, margin: int) -> dict[str, Any]:
    """Phase 1 on this worker (see the module docstring); returns what the driver needs:
    ``mode``, ``point``, ``step`` (the epoch length the common ``t`` is a multiple of),
    ``keys``, ``done``, ``holds``, ``waiting``.

    Raises:
        HandoverError: the source cannot hand its work over, or a snapshot round paused it.
    """
    mode = _mode(reader)
    moves = moves_of(reader)
    with reader.lock:
        if reader.pause is not None:
            by = "a snapshot round" if reader.held is not None else \
                f"the job (pause_at {reader.own_pause})"
            raise HandoverError(f"source {reader.name!r} is paused by {by}: its work cannot "
                                "be handed over at the same time")
        waiting = bool(reader.waiting)
        holds = bool(reader.tokens) and not waiting
        step = int(reader.granularity)
        point = None
        if holds:
            frontier = int(reader.tokens[0].time)
            emitted = reader.max_emitted
            after = frontier if emitted is None else max(frontier, (emitted // step + 1) * step)
            if mode == "names":  # rounds of the wall clock: from the next round on
                step = int(reader.poll_ms)
                last = reader.last_round if reader.last_round is not None else frontier
                after = max(after, last + step)
            point = -(-after // step) * step + margin * step
        moves.deciding, moves.fence = True, point
        moves.expected, moves.arrived = None, 0
    keys = [st.key for st in reader.live] if mode == "splits" else []
    done = [st.key for st in reader.states if st.done] if mode == "splits" else []
    return {"mode": mode, "point": point, "step": int(reader.granularity) if mode == "splits"
            else 1, "keys": sorted(keys), "done": sorted(done), "holds": holds,
            "waiting": waiting}


def reassign(reader: Any, plan: Mapping[str, Any]) -> None:
    """Phase 2 on this worker: ``plan`` has ``t`` (None: the source ended everywhere, only
    lift the fence), ``take`` (pieces expected here) and, for splits, ``give`` (split key ->
    receiving worker), for names ``roster`` (the workers that own names from ``t`` on) and
    ``send`` (this worker ran the source before: it sends its taken names).

    Raises:
        HandoverError: a split to give that this worker does not hold.
    """
    moves = moves_of(reader)
    worker = reader.job_worker
    with reader.lock:
        moves.deciding, moves.fence = False, None
        t = plan.get("t")
        if t is None:
            moves.expected = None
            _wake(reader)
            return
        moves.at = int(t)
        moves.expected = int(plan.get("take", 0))
        moves.handed = {}
        if "give" in plan:
            by_key = {st.key: st for st in reader.states}
            for key, receiver in plan["give"].items():
                st = by_key.get(key)
                if st is None:
                    raise HandoverError(f"worker {worker.index}: source {reader.name!r} was "
                                        f"asked to give split {key!r}, which it does not hold")
                moves.give[key] = int(receiver)
                if st.done or st not in reader.live:
                    hand(reader, st)
        else:
            _switch_names(reader, [int(w) for w in plan["roster"]], bool(plan.get("send")))
        pending, moves.pending = moves.pending, []
        for piece in pending:
            _take(reader, piece)
    _wake(reader)


def _wake(reader: Any) -> None:
    """Schedule the source when it runs: a source that ended or waits for lent tokens has
    nothing to do (and its dataflow may have ended: an activation there would stay pending,
    which keeps a leaving worker from leaving)."""
    if reader.tokens and not reader.waiting:
        reader.activate()


def _switch_names(reader: Any, roster: list[int], send: bool) -> None:
    """A directory source: from ``t`` on, names are owned by the table rebalanced over
    ``roster``.  A worker that ran the source (``send``) rebalances its table and sends every
    other worker of ``roster`` the names it took that the new table gives that worker (and
    the table); a joined one takes the table from those messages."""
    from tokenflow.io.directory import FILE_DONE

    moves = reader.moves
    worker = reader.job_worker
    index = worker.index
    leaving = index not in roster
    moves.adopt_table = not send
    if send:
        names = sorted(set(reader.taken) | set(reader.restored))
        reader.table = reader.table.rebalanced(roster)
        table_json = reader.table.to_json()
        owners = _owners(reader, names)
        for w in roster:
            if w != index:
                mine = {n: (FILE_DONE if leaving else None)
                        for n, o in zip(names, owners, strict=True) if o == w}
                worker.send_membership(w, ("source", reader.key, ("names", table_json, mine)))
    if leaving:
        reader.ending = True  # reads what it took, then ends
    elif not reader.finished:
        reader.ending = False  # lists again (from t on, under the new table)


def _owners(reader: Any, names: Sequence[str]) -> list[int]:
    from tokenflow.dataflow.routing import stable_hash

    if not names:
        return []
    return [int(w) for w in reader.table.routes(stable_hash(list(names))).tolist()]


def hand(reader: Any, st: Any) -> None:
    """Give split ``st`` away at ``t``: its offset (the first row at or after ``t``, or its
    end) goes to its receiver, and this worker stops reading and reporting it."""
    moves = reader.moves
    receiver = moves.give.pop(st.key)
    if st in reader.live:
        reader.live.remove(st)
    reader.states.remove(st)
    moves.handed[st.key] = int(st.offset)
    reader.job_worker.send_membership(
        receiver, ("source", reader.key, ("split", st.key, int(st.offset), bool(st.done))))


def hand_off(reader: Any) -> None:
    """After the splits' chunks were read: give away each moving split whose next row is at
    or after ``t`` or that ended (called from the source's logic)."""
    moves = reader.moves
    t = moves.at
    for st in list(reader.live):
        if st.key in moves.give and (st.done or (st.buffered() and
                                                 int(st.logical[st.cursor]) >= t)):
            hand(reader, st)


def split_cutoff(reader: Any, st: Any, cutoff: int) -> int:
    """The cutoff for split ``st``: ``t`` for a split being given away, when lower."""
    moves = reader.moves
    if moves is not None and st.key in moves.give and moves.at is not None:
        return min(cutoff, moves.at)
    return cutoff


def receive(reader: Any, piece: tuple[Any, ...]) -> None:
    """A piece of a handover arrived (from ``_receive_membership``, between steps)."""
    moves = moves_of(reader)
    with reader.lock:
        if moves.deciding or moves.expected is None:
            moves.pending.append(piece)  # phase 2 has not reached this worker yet
            return
        _take(reader, piece)
    _wake(reader)


def _take(reader: Any, piece: tuple[Any, ...]) -> None:
    from tokenflow.io.sources import _State

    moves = reader.moves
    kind = piece[0]
    if kind == "split":
        _, key, offset, done = piece
        st = _State(key, reader.splits[key], int(offset))
        st.done = bool(done)
        reader.states.append(st)
        if not st.done:
            reader.live.append(st)
        moves.received[key] = int(offset)
    elif kind == "names":
        _, table_json, names = piece
        if moves.adopt_table:  # a joined worker: the table every sender computed
            from tokenflow.state.bins import RoutingTable

            reader.table = RoutingTable.from_json(table_json)
        for name, offset in names.items():
            reader.taken.add(name)
            if offset is not None:
                reader.restored[name] = int(offset)
    else:
        raise HandoverError(f"source {reader.name!r}: unknown handover piece {kind!r}")
    moves.arrived += 1


__all__ = ["Handover", "HandoverError", "fence", "hand", "hand_off", "moves_of",
           "reassign", "receive", "split_cutoff"]
