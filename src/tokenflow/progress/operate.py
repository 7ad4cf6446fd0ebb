"""The ``Operate`` protocol: what a scope needs from each child (operator or subgraph).

Source: notes on timely-dataflow's ``progress/`` ("Subgraph", "Schedule"); timely's
``progress/operate.rs``.
"""

from __future__ import annotations

from typing import Protocol

from tokenflow.progress.reachability import Connectivity
from tokenflow.progress.shared_progress import SharedProgress


class Operate(Protocol):
    """A schedulable child of a scope.

    ``local`` is True when the child's progress statements describe only this worker (they are
    broadcast to all workers); a nested ``Subgraph`` is not local — its statements are already
    global.  ``notify`` asks to be scheduled when an input frontier changes.
    """

    name: str
    inputs: int
    outputs: int
    local: bool
    notify: bool

    def get_internal_summary(self) -> tuple[Connectivity, SharedProgress]:
        """Input→output path summaries and the shared progress (with initial capabilities)."""
        ...

    def set_external_summary(self) -> None:
        """Called once after the scope is built."""
        ...

    def schedule(self) -> bool:
        """Run once; return True while the child must not be shut down (work remains)."""
        ...
