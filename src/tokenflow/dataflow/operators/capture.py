"""``capture``: record a stream's messages and frontier for inspection.  Source: timely's
``capture`` module (``Event::Messages`` / ``Event::Progress``)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.operators.generic import sink

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


class Capture:
    """What one worker saw of a stream: ``events`` as ``(time, batch)`` in arrival order and
    ``frontiers``, the input frontier after each change."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, Any]] = []
        self.frontiers: list[list[Any]] = []

    def by_time(self) -> dict[Any, list[Any]]:
        """Records grouped by time (``list`` batches as lists, Arrow batches as row dicts)."""
        out: dict[Any, list[Any]] = defaultdict(list)
        for time, batch in self.events:
            out[time].extend(batch.to_pylist() if hasattr(batch, "to_pylist") else batch)
        return dict(out)

    def records(self) -> list[Any]:
        """Every record, in arrival order."""
        return [r for _, batch in self.events
                for r in (batch.to_pylist() if hasattr(batch, "to_pylist") else batch)]

    @property
    def done(self) -> bool:
        """True once the captured stream's frontier became empty."""
        return bool(self.frontiers) and not self.frontiers[-1]


def capture(stream: Stream, name: str = "Capture") -> Capture:
    """Record every message of ``stream`` on this worker; returns the ``Capture``."""
    result = Capture()

    def logic(inp: Any) -> None:
        for ref, batch in inp:
            result.events.append((ref.time, batch))
        current = inp.frontier.frontier()
        if not result.frontiers or result.frontiers[-1] != current:
            result.frontiers.append(current)

    sink(stream, "pipeline", name, logic)
    return result
