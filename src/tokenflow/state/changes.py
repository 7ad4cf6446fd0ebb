"""Incremental capture: which bins of each operator state a checkpoint must export again.

Source: the distributed-DBSP design, "Fault tolerance" (checkpoints are incremental: a
worker's state database writes what changed since its last committed version); the issue
"Exactly-once recovery" (only bins changed since the last checkpoint are written).

A worker's states record the bins they changed (``BinnedState.take_changes``).  At each
capture, ``ChangeLog.capture`` takes those marks and logs them under the capture's epoch; the
bins to export for a checkpoint built on the committed checkpoint at epoch ``p`` are the union
of the marks logged by every capture after ``p`` (this one included).  A capture whose round
failed (a part not written, the manifest not committed) therefore loses nothing: its marks stay
in the log until a later checkpoint built on an epoch at or after it is asked for, which can
only happen once that later checkpoint's base is committed.  Marks at or before the ``p`` a
capture names are dropped: the driver only ever names the latest committed checkpoint, so
no later capture builds on an earlier one.

The capture of a state is *full* (every bin exported, the snapshot writer finds the unchanged
ones by checksum) when the state does not track its changes (``take_changes`` returns None),
when there is no base (the first checkpoint, the base's entries unknown to this worker, or a
state the base does not hold), and *incremental* otherwise: only the changed bins are
exported, a changed bin that exports nothing is gone, and every other bin of the base's part
is referenced where the base found it (``write_worker_part(changed=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa


class TrackedState(Protocol):
    """What ``ChangeLog`` needs of a state (``tokenflow.dataflow.state.BinnedState``)."""

    def take_changes(self) -> set[int] | None: ...

    def export_later(self, bins: Any = None) -> Callable[[], Mapping[int, pa.Table]]: ...


@dataclass
class Capture:
    """One worker's captured states: ``resolve()`` (on the writer's thread) makes them ready
    for ``write_worker_part``.

    Attributes:
        tables: state key -> bin -> table, for the bins exported (all bins of a full
            capture; the changed bins of an incremental one); complete after ``resolve``.
        changed: state key -> the changed bins (incremental) or None (full capture); the
            ``changed`` argument of ``write_worker_part``.
        exported: bins exported over all states (a measure of the capture's work); complete
            after ``resolve``.
        later: state key -> its export as of the capture, not run yet
            (``BinnedState.export_later``).
    """

    tables: dict[str, Mapping[int, pa.Table]] = field(default_factory=dict)
    changed: dict[str, set[int] | None] = field(default_factory=dict)
    exported: int = 0
    later: dict[str, Callable[[], Mapping[int, pa.Table]]] = field(default_factory=dict)

    @property
    def full(self) -> list[str]:
        """Keys of the states captured in full."""
        return sorted(k for k, c in self.changed.items() if c is None)

    def resolve(self, between: Callable[[], None] | None = None) -> Capture:
        """Run the exports left for later, calling ``between()`` before each (a writer that
        yields to its worker between pieces of work: ``tokenflow.control``); returns this
        capture, complete.

        Raises:
            whatever a state's export raises (the capture's marks are already logged).
        """
        for key, export in self.later.items():
            if between is not None:
                between()
            self.tables[key] = export()
            self.exported += len(self.tables[key])
        self.later = {}
        return self


class ChangeLog:
    """A worker's log of the bins its states changed, per capture not yet known committed
    (see the module docstring)."""

    def __init__(self) -> None:
        self._log: dict[str, list[tuple[int, set[int]]]] = {}

    def pending(self, key: str) -> set[int]:
        """The bins of state ``key`` logged by captures not yet covered by a committed base."""
        out: set[int] = set()
        for _, marks in self._log.get(key, []):
            out |= marks
        return out

    def capture(self, states: Mapping[str, TrackedState], epoch: int, previous: int | None,
                base: Mapping[str, Mapping[int, Sequence[int]]] | None) -> Capture:
        """Capture every state for the checkpoint at ``epoch`` built on the committed one at
        ``previous`` whose part (this worker's entries, by state and bin) is ``base``
        (None or ``previous`` None: a full capture of every state).  What a state's
        ``export_later`` leaves for later runs in ``Capture.resolve``.

        The marks are taken and logged before any export, so an export that raises loses
        none of them.

        Raises:
            whatever a state's ``export_later`` raises.
        """
        marks: dict[str, set[int] | None] = {}
        for key, state in states.items():
            taken = state.take_changes()
            marks[key] = taken
            log = self._log.setdefault(key, [])
            if taken is not None:
                log.append((epoch, taken))
            if previous is not None:
                log[:] = [(e, m) for e, m in log if e > previous]
        out = Capture()
        for key, state in states.items():
            if marks[key] is None or previous is None or base is None or key not in base:
                out.later[key] = state.export_later()
                out.changed[key] = None
            else:
                bins = self.pending(key)
                if bins:
                    out.later[key] = state.export_later(sorted(bins))
                else:
                    out.tables[key] = {}
                out.changed[key] = bins
        return out


__all__ = ["Capture", "ChangeLog", "TrackedState"]
