"""``InputHandle``: feeds a dataflow from worker code, one epoch at a time.

Source: the timestamp-tokens paper §4.2 (tokens that notify the system when modified, used
outside operators to control inputs); timely's ``dataflow/operators/input.rs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.capability import Capability, CapabilityError
from tokenflow.dataflow.operators.builder import BATCH_SIZE, OperatorBuilder, OperatorOutput
from tokenflow.order.partial_order import less_equal

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream


class InputHandle:
    """Sends records at the current epoch; ``advance_to`` moves the epoch, ``close`` ends input.

    The handle owns the input's capability: while it is open, the frontier downstream cannot
    pass ``time``.
    """

    def __init__(self, output: OperatorOutput, capability: Capability, activate: Any,
                 name: str, metrics: dict[str, int] | None = None) -> None:
        self._output = output
        self._metrics = metrics if metrics is not None else {}
        self._cap: Capability | None = capability
        self._activate = activate
        self._buffer: list[Any] = []
        self.name = name

    @property
    def time(self) -> Any:
        """The current epoch.

        Raises:
            CapabilityError: after ``close()``.
        """
        if self._cap is None:
            raise CapabilityError(f"input {self.name!r} is closed")
        return self._cap.time

    @property
    def closed(self) -> bool:
        return self._cap is None

    def send(self, record: Any) -> None:
        """Send one record at the current epoch (buffered into batches).

        Raises:
            CapabilityError: after ``close()``.
        """
        if self._cap is None:
            raise CapabilityError(f"input {self.name!r} is closed: cannot send {record!r}")
        self._buffer.append(record)
        if len(self._buffer) >= BATCH_SIZE:
            self.flush()

    def send_batch(self, batch: Any) -> None:
        """Send a whole batch (``list`` or ``RecordBatch``) at the current epoch."""
        self.flush()
        cap = self._live()
        self._output.give_batch(cap, batch)
        self._metrics["records_in"] = self._metrics.get("records_in", 0) + len(batch)
        self._activate()

    def flush(self) -> None:
        """Push buffered records now."""
        if self._buffer:
            cap = self._live()
            batch = self._buffer
            self._buffer = []
            self._output.give_batch(cap, batch)
            self._metrics["records_in"] = self._metrics.get("records_in", 0) + len(batch)
            self._activate()

    def advance_to(self, time: Any) -> None:
        """Move to epoch ``time`` (≥ the current one); earlier epochs become complete.

        Raises:
            CapabilityError: when ``time`` is earlier than the current epoch, or after close.
        """
        cap = self._live()
        if not less_equal(cap.time, time):
            raise CapabilityError(
                f"input {self.name!r}: cannot advance from epoch {cap.time!r} to {time!r}"
            )
        self.flush()
        cap.downgrade(time)
        self._activate()

    def close(self) -> None:
        """End the input: no more records, its frontier becomes empty (idempotent)."""
        if self._cap is not None:
            self.flush()
            self._cap.drop()
            self._cap = None
            self._activate()

    def _live(self) -> Capability:
        if self._cap is None:
            raise CapabilityError(f"input {self.name!r} is closed")
        return self._cap


def new_input(scope: Scope, name: str = "Input") -> tuple[InputHandle, Stream]:
    """An ``(InputHandle, Stream)`` pair in ``scope``."""
    builder = OperatorBuilder(name, scope, notify=False)
    output, stream = builder.new_output()
    holder: list[Capability] = []

    def constructor(capabilities: list[Capability]) -> Any:
        holder.extend(capabilities)
        return lambda frontiers: False

    builder.build(constructor)
    handle = InputHandle(output, holder[0], builder.activator(), name,
                         getattr(scope.worker, "metrics", None))
    return handle, stream
