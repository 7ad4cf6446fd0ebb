"""``Progcaster``: broadcasts a scope's pointstamp changes to every worker.

Source: docs/ARCHITECTURE.md ("Execution model"), Selvatici, *Rescaling of Timely Dataflow* (ETH,
2019: progress sequence numbers); timely's ``progress/broadcast.rs``.  Each batch a worker sends
is tagged ``(sender, seq)`` with ``seq`` counting up from 0 per sender and scope, so a receiver
can check it sees every batch of every peer exactly once and in order (and a joining worker can
later bootstrap from a peer).  A batch is applied atomically: it is delivered whole into the
receiver's ``ChangeBatch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tokenflow.progress.change_batch import ChangeBatch


class ProgressSequenceError(RuntimeError):
    """A progress batch arrived out of order or twice: the channel lost or duplicated one."""


class Push(Protocol):
    def push(self, message: Any) -> None: ...


class Pull(Protocol):
    def pull(self) -> Any | None: ...


ProgressBatch = tuple[int, int, list[tuple[Any, int]]]
"""``(sender worker index, sequence number, [((Location, time), diff), ...])``."""


class Progcaster:
    """Sends local progress batches to all peers (itself included) and receives theirs.

    Args:
        index: this worker's index.
        pushers: one pusher per worker index, in worker order.
        puller: this worker's end of the progress channel.
        name: the scope's name, for error messages.
    """

    def __init__(self, index: int, pushers: Sequence[Push], puller: Pull, name: str) -> None:
        self.index = index
        self.pushers = list(pushers)
        self.puller = puller
        self.name = name
        self.sequence = 0
        self.received: dict[int, int] = {}  # sender -> next expected sequence number
        self.sent_batches = 0
        self.sent_updates = 0

    def send(self, changes: ChangeBatch[Any]) -> None:
        """Broadcast and clear ``changes`` (nothing is sent when they consolidate to empty)."""
        updates = changes.drain()
        if not updates:
            return
        message: ProgressBatch = (self.index, self.sequence, updates)
        self.sequence += 1
        self.sent_batches += 1
        self.sent_updates += len(updates)
        for pusher in self.pushers:
            pusher.push(message)

    def recv(self, into: ChangeBatch[Any]) -> bool:
        """Move every received batch into ``into``; True when anything arrived.

        Raises:
            ProgressSequenceError: when a peer's batches skip or repeat a sequence number.
        """
        got = False
        pull = self.puller.pull
        received = self.received
        while True:
            message = pull()
            if message is None:
                return got
            sender, seq, updates = message
            expected = received.get(sender, 0)
            if seq != expected:
                raise ProgressSequenceError(
                    f"scope {self.name!r}: progress batch {seq} from worker {sender} "
                    f"arrived at worker {self.index}, expected batch {expected}"
                )
            received[sender] = seq + 1
            into.extend(updates)
            got = True
