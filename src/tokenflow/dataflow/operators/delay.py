"""``delay``: move records to later times, released when the frontier reaches them.

Source: timely's ``delay.rs`` (built on a notificator: a token per new time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.capability import CapabilityError
from tokenflow.dataflow.operators.generic import unary_notify
from tokenflow.order.partial_order import less_equal

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream


def delay(stream: Stream, fn: Callable[[Any, Any], Any], name: str = "Delay") -> Stream:
    """Send each record at ``fn(record, time)`` (≥ its time) once that time is complete.

    Raises:
        CapabilityError: when ``fn`` returns a time earlier than (or incomparable to) the
            record's time, naming the operator, time and record.
    """
    pending: dict[Any, list[Any]] = {}

    def logic(inp: Any, out: Any, notificator: Any) -> None:
        for ref, batch in inp:
            t = ref.time
            for x in batch:
                new_time = fn(x, t)
                if not less_equal(t, new_time):
                    raise CapabilityError(
                        f"operator {name!r}: delay of record {x!r} from time {t!r} to "
                        f"{new_time!r} goes back in time"
                    )
                bucket = pending.get(new_time)
                if bucket is None:
                    pending[new_time] = bucket = []
                    notificator.notify_at(ref.delayed(new_time))
                bucket.append(x)

        def emit(cap: Any, _: Any) -> None:
            data = pending.pop(cap.time, None)
            if data:
                out.give_batch(cap, data)

        notificator.for_each(emit)

    return unary_notify(stream, "pipeline", name, (), logic)
