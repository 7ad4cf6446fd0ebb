"""What the migrations of a job moved: per table change, bins and bytes, over all workers.

Source: the distributed-DBSP design, "Scaling state" (a change of roster should move about
``1/(W+1)`` of the state, ``hash % W`` moves ``W/(W+1)``); issue 16's acceptance (state moved
per step <= ``1/(W+1) + 2 %`` of the state bytes on scale-out, exactly the leaving worker's
bins on scale-in).

Each worker returns ``collect(handles)`` (plain data: picklable across processes and Spark
tasks); the driver merges them with ``summarize(parts)`` into one ``ChangeReport`` per table
change (one ``Controller.rescale`` that moved bins), summed over the job's migrating
operators.  Bytes are Arrow bytes (``pa.Table.nbytes`` of the exported bins).  The
``total`` bytes need operators built with ``measure=True`` (every worker records every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tokenflow.rescale.megaphone import MigrationHandle
from tokenflow.state.bins import RoutingTable


def collect(handles: Sequence[MigrationHandle]) -> dict[str, Any]:
    """This worker's part: per operator, its recorded steps and, on worker 0 (the driving
    controller), the table changes and the steps issued.

    Returns:
        ``{operator: {"moved": [StepStats as dict], "loads": [LoadStats as dict],
        "changes": [(time, table json)],
        "issued": [(time, [(bin, old, new)])], "initial": table json}}``.
    """
    out: dict[str, Any] = {}
    for h in handles:
        c = h.controller
        part: dict[str, Any] = {"moved": [asdict(s) for s in h.moved],
                                "loads": [asdict(s) for s in h.shared.loads]}
        if c.driving:
            part["changes"] = [(t, table.to_json()) for t, table in c.changes]
            part["issued"] = [(t, [(m.bin, m.old, m.new) for m in moves]) for t, moves in c.issued]
        out[h.name] = part
    return out


@dataclass
class ChangeReport:
    """One table change (all its steps), summed over the job's migrating operators.

    Attributes:
        index: the change's position (0: the first change).
        time: the logical time of its first step (the earliest over operators).
        before, after: workers owning bins before and after (sorted).
        bins: bins that changed owner (the union over operators: they all move the same
            bins, each at its own times).
        senders, receivers: workers that gave / got bins.
        moved_bytes: state bytes sent, over all operators and workers.
        total_bytes: state bytes held by all workers at the change's first step (needs
            ``measure``; 0 otherwise).
        share: the part of the state the change moved, each step's bytes taken against the
            bytes held at that step (state grows and shrinks while a fluid or batched change
            runs), averaged over the operators weighted by their bytes at the first step
            (``measure``; equals ``moved_bytes / total_bytes`` for one step).
        sender_bytes: per sender, the bytes of all its state at the first step (``measure``).
        owned_before: per sender, the bins it owned before the change.
        moved_bins: the bins that changed owner.
        operators: per operator, ``(moved_bytes, total_bytes)``.
        steps: the change's steps (distinct step times, over operators).
        end: the logical time of its last step (the latest over operators): the change is
            complete once the output frontier has passed it.
        longest_take, longest_load: the longest block of the change's own work on one
            worker, seconds: one activation's prepares, takes and flush on a sender, one
            ``LoadQueue.run``'s loads on a receiver (``StepStats.longest``,
            ``LoadStats.longest``; ``tokenflow.rescale.clock.Activation``).
        longest_take_cpu, longest_load_cpu: the most thread CPU time one such block used,
            seconds (``longest_cpu``; below the wall time when the OS ran other processes
            meanwhile).
        longest_take_held, longest_load_held: the most time one block held its worker,
            seconds (``longest_held``, ``tokenflow.rescale.clock.SliceClock``: its CPU
            time, plus its own waits if it blocked, without the time the OS or a virtual
            machine's host gave others meanwhile).
        timeline: per step time (over operators and workers), wall-clock seconds
            (``time.time()``): ``due`` (the first sender's first take began), ``sent`` (the
            last sender flushed its last slice), ``arrived`` (the first part reached a
            receiver's operator), ``loaded`` (the last receiver loaded its last part), and
            ``taking`` / ``loading``: the slices' seconds summed over workers; a key is
            missing when no worker recorded it.
    """

    index: int
    time: int
    before: list[int]
    after: list[int]
    bins: int
    senders: list[int]
    receivers: list[int]
    moved_bytes: int
    total_bytes: int
    sender_bytes: dict[int, int] = field(default_factory=dict)
    owned_before: dict[int, list[int]] = field(default_factory=dict)
    moved_bins: list[int] = field(default_factory=list)
    operators: dict[str, tuple[int, int]] = field(default_factory=dict)
    share: float = float("nan")
    steps: int = 0
    end: int = 0
    longest_take: float = 0.0
    longest_load: float = 0.0
    longest_take_cpu: float = 0.0
    longest_load_cpu: float = 0.0
    longest_take_held: float = 0.0
    longest_load_held: float = 0.0
    timeline: list[dict[str, float]] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        """``moved_bytes / total_bytes`` (NaN without totals)."""
        return self.moved_bytes / self.total_bytes if self.total_bytes else float("nan")


def _owners_of(table: RoutingTable) -> list[int]:
    return sorted(w for w, c in table.counts().items() if c)


def change_counts(parts: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per migrating operator, the table changes its controller on worker 0 made (they differ
    when the job ended between two operators' changes); operators without a driving part
    (worker 0's) are left out."""
    out: dict[str, int] = {}
    for p in parts:
        for name, part in p.items():
            if "changes" in part and name not in out:
                out[name] = len(part["changes"])
    return dict(sorted(out.items()))


def summarize(parts: Sequence[dict[str, Any]], initial: RoutingTable) -> list[ChangeReport]:
    """Merge the workers' ``collect`` parts (indexed by worker) into one report per change.

    The tables before and after each change are rebuilt from ``initial`` by applying the
    moves worker 0 issued (not from the tables it planned), so a step that was planned but
    never sent shows up as a difference from ``changes``.

    Every migrating operator has a controller of its own on worker 0, and a rescale asks them
    one after the other: a job that ends in between leaves some operators one change ahead of
    the others.  The reports then cover the changes every operator made (the common prefix);
    ``change_counts(parts)`` gives each operator's own count.
    """
    names = sorted({name for p in parts for name in p})
    per_op: dict[str, list[dict[str, Any]]] = {}
    counts = set()
    for name in names:
        driving = [p[name] for p in parts if name in p and "changes" in p[name]]
        if not driving:
            continue
        d = driving[0]
        starts = [int(t) for t, _ in d["changes"]]
        counts.add(len(starts))
        if not starts:  # no change was made (e.g. the job ended before the first)
            per_op[name] = []
            continue
        ranges = list(zip(starts, [*starts[1:], None], strict=True))
        owners = initial.owners.copy()
        changes = []
        for lo, hi in ranges:
            before = owners.copy()
            issued = [(int(t), step) for t, step in d["issued"]
                      if t >= lo and (hi is None or t < hi)]
            moves = [m for _, step in issued for m in step]
            for b, _, new in moves:
                owners[b] = new
            moved = total = 0
            sender_bytes: dict[int, int] = {}
            per_step: dict[int, list[int]] = {}  # step time -> [bytes moved, bytes held]
            for w, p in enumerate(parts):
                for s in p.get(name, {}).get("moved", []):
                    if s["time"] >= lo and (hi is None or s["time"] < hi):
                        moved += s["bytes"]
                        step = per_step.setdefault(s["time"], [0, 0])
                        step[0] += s["bytes"]
                        step[1] += s["total"]
                    if s["time"] == lo:
                        total += s["total"]
                        sender_bytes[w] = s["total"]
            share = sum(m / t for m, t in per_step.values() if t)
            changes.append({"time": lo, "before": before, "after": owners.copy(), "moves": moves,
                            "moved": moved, "total": total, "sender_bytes": sender_bytes,
                            "share": share, "times": {t for t, _ in issued},
                            "timing": _timing(parts, name, lo, hi)})
        per_op[name] = changes
    reports = []
    for k in range(min(counts, default=0)):  # the changes every operator made
        entries = {name: changes[k] for name, changes in per_op.items()}
        first = min(entries.values(), key=lambda e: e["time"])
        moves = [m for e in entries.values() for m in e["moves"]]
        senders = sorted({old for _, old, _ in moves})
        before_table = RoutingTable(first["before"], range(int(first["before"].max()) + 1))
        held: dict[int, int] = {}
        for e in entries.values():
            for w, n in e["sender_bytes"].items():
                if w in senders:
                    held[w] = held.get(w, 0) + n
        reports.append(ChangeReport(
            index=k, time=int(first["time"]),
            before=_owners_of(before_table),
            after=_owners_of(RoutingTable(first["after"], range(int(first["after"].max()) + 1))),
            bins=len({b for b, _, _ in moves}), senders=senders,
            receivers=sorted({new for _, _, new in moves}),
            moved_bytes=sum(e["moved"] for e in entries.values()),
            total_bytes=sum(e["total"] for e in entries.values()),
            sender_bytes=held,
            owned_before={w: np.flatnonzero(first["before"] == w).tolist() for w in senders},
            moved_bins=sorted({b for b, _, _ in moves}),
            operators={name: (e["moved"], e["total"]) for name, e in entries.items()},
            share=sum(e["share"] * e["total"] for e in entries.values()) /
            sum(e["total"] for e in entries.values())
            if any(e["total"] for e in entries.values()) else float("nan"),
            steps=len({t for e in entries.values() for t in e["times"]}),
            end=max((t for e in entries.values() for t in e["times"]), default=int(first["time"])),
            **_merged_timing([e["timing"] for e in entries.values()])))
    return reports


_EARLIEST = ("due", "arrived")
_LATEST = ("sent", "loaded")


def _timing(parts: Sequence[dict[str, Any]], name: str, lo: int,
            hi: int | None) -> dict[int, dict[str, float]]:
    """Per step time in ``[lo, hi)``: the operator's ``timeline`` entry (``ChangeReport``)
    and its longest take and load slices (``longest_take``, ``longest_load``)."""
    out: dict[int, dict[str, float]] = {}
    for p in parts:
        part = p.get(name, {})
        for kind, stats in (("take", part.get("moved", [])), ("load", part.get("loads", []))):
            for s in stats:
                t = int(s["time"])
                if t < lo or (hi is not None and t >= hi) or not s.get("slices"):
                    continue
                entry = out.setdefault(t, {"time": float(t)})
                first, last = ("due", "sent") if kind == "take" else ("arrived", "loaded")
                entry[first] = min(entry.get(first, s[first]), s[first])
                entry[last] = max(entry.get(last, s[last]), s[last])
                spent = "taking" if kind == "take" else "loading"
                entry[spent] = entry.get(spent, 0.0) + s[spent]
                longest = f"longest_{kind}"
                entry[longest] = max(entry.get(longest, 0.0), s["longest"])
                for clock in ("cpu", "held"):
                    entry[f"{longest}_{clock}"] = max(entry.get(f"{longest}_{clock}", 0.0),
                                                      s.get(f"longest_{clock}", 0.0))
    return out


def _merged_timing(timings: Sequence[dict[int, dict[str, float]]]) -> dict[str, Any]:
    """``longest_take``, ``longest_load`` and ``timeline`` of a change from its operators'
    ``_timing``."""
    merged: dict[int, dict[str, float]] = {}
    for timing in timings:
        for t, entry in timing.items():
            into = merged.setdefault(t, {"time": float(t)})
            for key, value in entry.items():
                if key in _EARLIEST:
                    into[key] = min(into.get(key, value), value)
                elif key in _LATEST or key.startswith("longest_"):
                    into[key] = max(into.get(key, value), value)
                elif key != "time":
                    into[key] = into.get(key, 0.0) + value
    timeline = [merged[t] for t in sorted(merged)]
    longest = {key: max((e.get(key, 0.0) for e in timeline), default=0.0)
               for key in ("longest_take", "longest_load", "longest_take_cpu", "longest_load_cpu",
                           "longest_take_held", "longest_load_held")}
    return {**longest,
            "timeline": [{k: v for k, v in e.items() if not k.startswith("longest_")}
                         for e in timeline]}


__all__ = ["ChangeReport", "change_counts", "collect", "summarize"]
