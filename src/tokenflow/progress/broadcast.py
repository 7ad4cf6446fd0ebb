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
    """Sends local progress batches to the workers of the roster (itself included) and
    receives theirs.

    Args:
        index: this worker's index.
        pushers: one pusher per worker slot, in slot order.
        puller: this worker's end of the progress channel.
        name: the scope's name, for error messages.
        roster: the slots batches go to (default: every slot).
    """

    def __init__(self, index: int, pushers: Sequence[Push], puller: Pull, name: str,
                 roster: Sequence[int] | None = None) -> None:
        self.index = index
        self.pushers = list(pushers)
        self.puller = puller
        self.name = name
        self.sequence = 0
        self.received: dict[int, int] = {}  # sender -> next expected sequence number
        self.sent_batches = 0
        self.sent_updates = 0
        self._targets = [self.pushers[j] for j in (range(len(self.pushers)) if roster is None
                                                    else roster)]
        self._roster = list(range(len(self.pushers))) if roster is None else sorted(roster)
        self._floors: dict[int, int] = {}  # sender -> batches below it are already accounted
        self.held: ChangeBatch[Any] = ChangeBatch()
        """This worker's own tokens (net source-location updates it sent), when
        ``track_held`` was called: a worker leaving the job must hold none."""
        self._track_held = False

    def track_held(self) -> None:
        """Count this worker's own tokens in ``held`` from now on."""
        self._track_held = True

    def disown(self, key: tuple[Any, Any]) -> None:
        """A token of this worker's (``(location, time)``) was handed to another worker: it
        no longer counts as held here (its +1 was or will be sent by this worker)."""
        if self._track_held:
            self.held.update(key, -1)

    def own(self, key: tuple[Any, Any]) -> None:
        """A token handed to this worker by another (which sent its +1) counts as held here."""
        if self._track_held:
            self.held.update(key, 1)

    @property
    def roster(self) -> list[int]:
        """The slots this worker's batches go to."""
        return list(self._roster)

    def set_roster(self, roster: Sequence[int]) -> int:
        """Send later batches to ``roster``; returns the sequence number of the next batch (the
        first a newly added worker receives from this one: Selvatici's bootstrap message)."""
        self._roster = sorted(set(roster))
        self._targets = [self.pushers[j] for j in self._roster]
        return self.sequence

    def bootstrap(self, received: dict[int, int]) -> None:
        """Start a joining worker's reception: ``received[sender]`` batches of each sender are
        already accounted for in the progress state it was given (Selvatici's bootstrap
        protocol); earlier batches that arrive are skipped, later ones must follow in order."""
        self.received = dict(received)
        self._floors = dict(received)

    def send(self, changes: ChangeBatch[Any]) -> None:
        """Broadcast and clear ``changes`` (nothing is sent when they consolidate to empty)."""
        updates = changes.drain()
        if not updates:
            return
        if self._track_held:
            held = self.held
            for (location, time), diff in updates:
                if location.is_source and location.node:
                    held.update((location, time), diff)
        message: ProgressBatch = (self.index, self.sequence, updates)
        self.sequence += 1
        self.sent_batches += 1
        self.sent_updates += len(updates)
        for pusher in self._targets:
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
            if seq < self._floors.get(sender, 0):
                continue  # accounted for in the bootstrap state
            if seq != expected:
                raise ProgressSequenceError(
                    f"scope {self.name!r}: progress batch {seq} from worker {sender} "
                    f"arrived at worker {self.index}, expected batch {expected}"
                )
            received[sender] = seq + 1
            into.extend(updates)
            got = True
