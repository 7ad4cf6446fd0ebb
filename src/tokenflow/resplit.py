"""The driver's side of re-splitting sources: a joining worker gets a share of every source's
remaining work, a leaving worker hands its share away, at a logical time ``t``.

Source: Selvatici, *Rescaling of Timely Dataflow* (ETH, 2019), §6.2 (new workers receive no
capabilities, so sources cannot run on them; here they do); Megaphone (Hoffmann et al., VLDB
2019: an assignment that changes at a logical time); the distributed-DBSP design, "Scaling
input".  The workers' side, and why nothing is read twice or lost, is
``tokenflow.io.handover``; docs/ARCHITECTURE.md, "Sources of joining and leaving workers".

``move_sources(hub, old, new, ...)`` runs one re-split through the control plane
(``JobHandle.add_worker(sources=True)`` and ``remove_worker`` call it):

1. ``fence`` to every worker of ``old`` and ``new``: each source proposes a point and holds
   there; the replies say which splits each worker still reads.
2. Per source, ``t`` is the greatest point (a multiple of the source's epoch length), and the
   new assignment: the unfinished splits spread evenly over the workers of ``new`` that can
   take them, moving as few as possible (``assign``), a leaving worker's finished splits
   with them (their positions); for an untimed directory source, the name table rebalanced
   over them.
3. A worker of ``new`` that joined and holds no counted token of the source is lent one by a
   fenced worker (``tokenflow.membership.lend_begin``; the copy's time is at or before its
   fence, hence at or before ``t``).
4. ``resplit`` to every worker (its part of the plan), then the lends are completed
   (``lend_finish``: released once every worker applied the lender's count), then
   ``resplit?``: each worker replies ``resplit_done`` once every piece handed to it arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SourceMove:
    """What one re-split did to one source.

    Attributes:
        key: the source's key (``tokenflow.io.sources.source_key``).
        mode: ``"splits"`` or ``"names"`` (an untimed directory source).
        at: the logical time ``t`` of the change (None: the source had ended, nothing moved).
        moves: split key -> ``(old owner, new owner)`` (``splits`` only).
        roster: the workers reading the source from ``t`` on.
        read: worker -> rows (positions) its share had emitted when the re-split completed.
    """

    key: str
    mode: str
    at: int | None
    moves: dict[str, tuple[int, int]] = field(default_factory=dict)
    roster: list[int] = field(default_factory=list)
    read: dict[int, int] = field(default_factory=dict)


def assign(owned: Mapping[int, Sequence[str]], roster: Sequence[int]) -> dict[str, tuple[int, int]]:
    """The fewest moves that spread the splits of ``owned`` (worker -> split keys) evenly over
    ``roster``: ``{split: (old owner, new owner)}`` for the splits that move.  Counts differ
    by at most one; the larger shares go to the workers that hold most already; a worker
    keeps its splits in key order up to its share, and the rest (and every split of a worker
    outside ``roster``) go to the workers below their share, in roster order.  A pure
    function of its arguments.

    Raises:
        ValueError: an empty ``roster`` while there are splits.
    """
    total = sum(len(keys) for keys in owned.values())
    if not total:
        return {}
    if not roster:
        raise ValueError(f"{total} splits and no worker to read them")
    members = sorted(set(roster))
    base, extra = divmod(total, len(members))
    order = sorted(members, key=lambda w: (-len(owned.get(w, ())), w))
    share = {w: base + (1 if i < extra else 0) for i, w in enumerate(order)}
    pool: list[tuple[str, int]] = []
    held: dict[int, int] = {}
    for w in sorted(owned):
        keys = sorted(owned[w])
        keep = share.get(w, 0)
        held[w] = min(keep, len(keys))
        pool.extend((key, w) for key in keys[keep:])
    pool.sort()
    moves: dict[str, tuple[int, int]] = {}
    for w in members:
        while held.get(w, 0) < share[w]:
            key, old = pool.pop(0)
            moves[key] = (old, w)
            held[w] = held.get(w, 0) + 1
    return moves


def move_sources(hub: Any, old: Sequence[int], new: Sequence[int], timeout: float,
                 alive: Callable[[], bool], margin: int = 2) -> list[SourceMove]:
    """Re-split every source of the job from the workers ``old`` to ``new`` (see the module
    docstring); returns what moved, per source.  ``margin``: epochs (of each source's
    length; poll rounds for a directory) a source may still emit while the driver gathers
    the points.

    Raises:
        HandoverError: a source that cannot hand its work over (the fences are lifted first).
        ControlError: a worker did not answer within ``timeout`` s, or the job ended.
    """
    from tokenflow.control import gather
    from tokenflow.io.handover import HandoverError
    from tokenflow.membership import lend_begin, lend_finish

    everyone = sorted(set(old) | set(new))
    for w in everyone:
        hub.send(w, {"kind": "fence", "margin": margin})
    fenced = gather(hub, "fenced", everyone, timeout, alive)
    errors = [str(r["error"]) for r in fenced.values() if r.get("error")]
    plans, lends, report = plan(fenced, new)
    if errors:
        for w in everyone:
            hub.send(w, {"kind": "resplit", "sources": {k: {"t": None} for k in
                                                        fenced[w]["sources"]}})
        raise HandoverError("; ".join(errors))
    replies = {pair: lend_begin(hub, pair[0], pair[1], names, timeout, alive)
               for pair, names in sorted(lends.items())}
    short = [f"worker {lender} lent worker {joiner} {reply['inputs']} of {len(lends[lender, joiner])}"
             for (lender, joiner), reply in replies.items()
             if int(reply["inputs"]) < len(lends[lender, joiner])]
    if short:  # a fenced holder always has its tokens: a broken invariant, nothing moved
        for w in everyone:
            hub.send(w, {"kind": "resplit", "sources": {k: {"t": None} for k in
                                                        fenced[w]["sources"]}})
        raise HandoverError("source tokens could not be lent: " + "; ".join(short))
    for w in everyone:
        hub.send(w, {"kind": "resplit", "sources": plans[w]})
    for (lender, joiner), reply in replies.items():
        lend_finish(hub, everyone, lender, joiner, reply, timeout, alive)
    for w in everyone:
        hub.send(w, {"kind": "resplit?"})
    done = gather(hub, "resplit_done", everyone, timeout, alive)
    for move in report:
        move.read = {w: int(r["read"][move.key]) for w, r in done.items()
                     if move.key in r.get("read", {})}
    return report


def plan(fenced: Mapping[int, Mapping[str, Any]], new: Sequence[int],
         ) -> tuple[dict[int, dict[str, dict[str, Any]]], dict[tuple[int, int], list[str]],
                    list[SourceMove]]:
    """Phase 2 from the workers' ``fenced`` replies (worker -> reply) and the new roster:
    per worker its ``resplit`` part of each source, the lends to make (``(lender, joiner)``
    -> source keys) and what moves, per source.  A pure function of its arguments."""
    keys = sorted({key for r in fenced.values() for key in r["sources"]})
    plans: dict[int, dict[str, dict[str, Any]]] = {w: {} for w in fenced}
    lends: dict[tuple[int, int], list[str]] = {}
    report = []
    for key in keys:
        infos = {w: r["sources"][key] for w, r in fenced.items() if key in r["sources"]}
        report.append(_plan(key, infos, list(new), plans, lends))
    return plans, lends, report


def _plan(key: str, infos: dict[int, dict[str, Any]], new: list[int],
          plans: dict[int, dict[str, dict[str, Any]]] | None,
          lends: dict[tuple[int, int], list[str]]) -> SourceMove:
    """The new assignment of source ``key`` from the workers' ``fenced`` replies ``infos``;
    fills ``plans`` (worker -> source -> its part) and ``lends`` ((lender, joiner) -> keys)."""
    mode = next(iter(infos.values()))["mode"]
    points = [int(i["point"]) for i in infos.values() if i["point"] is not None]
    holders = sorted(w for w, i in infos.items() if i["holds"])
    able = [w for w in sorted(new) if w in infos and (infos[w]["holds"] or infos[w]["waiting"])]
    if not points or not holders or not able:  # ended everywhere: nothing left to move
        if plans is not None:
            for w in infos:
                plans[w][key] = {"t": None}
        return SourceMove(key, mode, None, roster=holders)
    step = max(int(i["step"]) for i in infos.values())
    t = -(-max(points) // step) * step
    move = SourceMove(key, mode, t, roster=able)
    if mode == "splits":
        move.moves = assign({w: infos[w]["keys"] for w in holders}, able)
        takers = [w for w in able if infos[w]["holds"]] or able
        finished = [(k, w) for w in sorted(infos) if w not in new for k in infos[w]["done"]]
        for i, (k, w) in enumerate(finished):  # their positions go with them
            move.moves[k] = (w, takers[i % len(takers)])
        needs = sorted({to for _, to in move.moves.values() if infos[to]["waiting"]})
        for w in infos:
            part = {"t": t, "give": {k: to for k, (src, to) in move.moves.items() if src == w},
                    "take": sum(1 for _, to in move.moves.values() if to == w)}
            if plans is not None:
                plans[w][key] = part
    else:
        senders = [w for w in sorted(infos) if not infos[w]["waiting"]]
        needs = [w for w in able if infos[w]["waiting"]]
        for w in infos:
            part = {"t": t, "roster": able, "send": w in senders,
                    "take": sum(1 for s in senders if s != w) if w in able else 0}
            if plans is not None:
                plans[w][key] = part
    for w in needs:
        lends.setdefault((holders[0], w), []).append(key)
    return move


__all__ = ["SourceMove", "assign", "move_sources", "plan"]
