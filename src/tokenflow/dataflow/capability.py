"""Timestamp tokens: ``Capability``, ``CapabilityRef`` and ``CapabilitySet``.

Source: the timestamp-tokens paper §3–§4 (Lattuada, McSherry et al., *Timestamp tokens: a
better coordination primitive for data-processing systems*, 2022: token life-cycle,
``TimestampToken``, ``TimestampTokenRef`` and ``retain``); docs/ARCHITECTURE.md ("Timestamp
tokens in Python").

A ``Capability`` lets its holder produce data at its time (or later) on one output port.  Its
creation and copies add ``+1`` at ``(port, time)`` in the operator's shared bookkeeping
(``SharedProgress.internals``), ``downgrade`` moves the count to a later time, and ``drop``
(or, as a backstop, garbage collection) subtracts it.  The system reads the bookkeeping after
each operator invocation and broadcasts the net changes; a token changed outside an invocation
of its operator (dropped by worker code, garbage collected) asks, through its ``activate`` hook,
for the operator to be scheduled so that the change is reported.

Threads: a token belongs to the thread that created it (its worker's).  On the ``thread``
runtime all workers share one heap, and the cycle collector runs on whichever thread happens to
allocate, so ``__del__`` may run on another worker's thread.  It then does not touch the
bookkeeping ``ChangeBatch`` (not thread-safe) but queues the release with
``ChangeBatch.defer``; the owner folds it in when it next reads the batch (after the operator's
next invocation, which the ``activate`` hook requests).  ``drop()`` itself is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from threading import get_ident
from typing import Any

from tokenflow.order.partial_order import less_equal
from tokenflow.progress.change_batch import ChangeBatch


class CapabilityError(RuntimeError):
    """Misuse of a timestamp token (names the operator, port and times involved)."""


class Capability:
    """An owned timestamp token for ``time`` on output ``port`` of operator ``operator``.

    Copy with ``copy()`` or ``delayed(t)``; release with ``drop()``.  ``drop()``, ``downgrade``
    and the copies must be used on the owning worker's thread (the one that created the token);
    only the garbage-collection backstop may run elsewhere.
    """

    __slots__ = ("_time", "_internal", "_port", "_operator", "_valid", "_activate", "_owner")

    def __init__(self, time: Any, internal: ChangeBatch[Any], port: int, operator: str,
                 activate: Callable[[], None] | None = None) -> None:
        self._time = time
        self._internal = internal
        self._port = port
        self._operator = operator
        self._activate = activate  # schedules the operator so it reports the bookkeeping
        self._owner = get_ident()  # the thread whose worker owns ``internal``
        self._valid = True
        internal.update(time, 1)
        if activate is not None:
            activate()

    @property
    def time(self) -> Any:
        """The token's timestamp."""
        if not self._valid:
            raise CapabilityError(f"{self._operator}: capability was dropped (time {self._time!r})")
        return self._time

    @property
    def port(self) -> int:
        """The output port the token is for."""
        return self._port

    @property
    def operator(self) -> str:
        return self._operator

    @property
    def valid(self) -> bool:
        """False once dropped."""
        return self._valid

    def _check(self) -> None:
        if not self._valid:
            raise CapabilityError(
                f"{self._operator}: capability for output {self._port} at time {self._time!r} "
                "was used after drop()"
            )

    def delayed(self, time: Any) -> Capability:
        """A new token at ``time`` (≥ this token's time) for the same port.

        Raises:
            CapabilityError: when ``time`` is earlier than or incomparable to ``self.time``.
        """
        self._check()
        if not less_equal(self._time, time):
            raise CapabilityError(
                f"{self._operator}: cannot delay capability at {self._time!r} to {time!r} "
                "(not later in the partial order)"
            )
        return Capability(time, self._internal, self._port, self._operator, self._activate)

    def downgrade(self, time: Any) -> None:
        """Move this token to the later ``time``.

        Raises:
            CapabilityError: when ``time`` is earlier than or incomparable to ``self.time``.
        """
        if not self._valid:
            self._check()
        old = self._time
        if time == old:
            return
        if not less_equal(old, time):
            raise CapabilityError(
                f"{self._operator}: cannot downgrade capability at {old!r} to {time!r} "
                "(not later in the partial order)"
            )
        internal = self._internal
        internal.update(time, 1)
        internal.update(old, -1)
        self._time = time
        if self._activate is not None:
            self._activate()

    def copy(self) -> Capability:
        """Another token at the same time and port."""
        self._check()
        return Capability(self._time, self._internal, self._port, self._operator, self._activate)

    __copy__ = copy

    def hand_over(self) -> Any:
        """Give this token to another worker: it stops being valid here *without* being
        released (the count it added stays, now owned by the worker that adopts it:
        ``tokenflow.membership`` lends a joining worker its inputs' tokens this way).  Returns
        its time.

        Raises:
            CapabilityError: the token was dropped or handed over already.
        """
        self._check()
        self._valid = False
        return self._time

    def drop(self) -> None:
        """Release the token (idempotent)."""
        if self._valid:
            self._valid = False
            self._internal.update(self._time, -1)
            if self._activate is not None:
                self._activate()

    def __del__(self) -> None:
        # Backstop: a token that is garbage collected is released, like Rust's Drop.
        if not getattr(self, "_valid", False):
            return
        if get_ident() == self._owner:
            self.drop()
            return
        # Collected on another thread (the cycle collector runs on whichever thread
        # allocates): queue the release for the owner instead of mutating its batch, then ask
        # for the operator to be scheduled so the owner folds it in and reports it.  The order
        # matters: queued first, so an owner that is just finishing an invocation either sees
        # the release or is no longer running when ``activate`` checks.
        self._valid = False
        self._internal.defer(self._time, -1)
        if self._activate is not None:
            self._activate()

    def __repr__(self) -> str:
        state = "" if self._valid else ", dropped"
        return f"Capability(time={self._time!r}, port={self._port}{state})"


class CapabilityRef:
    """A borrowed token for one received message, valid only during the invocation.

    ``retain()`` turns it into an owned ``Capability``; using it after the operator invocation
    that received it raises ``CapabilityError``.
    """

    __slots__ = ("_time", "_internals", "_summaries", "_operator", "_valid", "_activate")

    def __init__(
        self,
        time: Any,
        internals: Sequence[ChangeBatch[Any]],
        summaries: Sequence[Any],
        operator: str,
        activate: Callable[[], None] | None = None,
    ) -> None:
        self._time = time
        self._internals = internals
        self._summaries = summaries  # per output: Antichain of summaries from the input
        self._operator = operator
        self._activate = activate  # handed to the tokens it mints
        self._valid = True

    @property
    def time(self) -> Any:
        """The message's timestamp."""
        self._check()
        return self._time

    @property
    def valid(self) -> bool:
        return self._valid

    def _check(self) -> None:
        if not self._valid:
            raise CapabilityError(
                f"{self._operator}: CapabilityRef for time {self._time!r} used after the "
                "operator invocation that received it (call retain() to keep a token)"
            )

    def _invalidate(self) -> None:
        self._valid = False

    def covers(self, output: int, time: Any) -> bool:
        """True when this ref allows producing at ``time`` on ``output``."""
        if output >= len(self._summaries):
            return False
        for summary in self._summaries[output]:
            produced = summary.results_in(self._time)
            if produced is not None and less_equal(produced, time):
                return True
        return False

    def delayed_for_output(self, time: Any, output: int) -> Capability:
        """An owned token at ``time`` for ``output``.

        Raises:
            CapabilityError: when the ref is stale, the output is not connected to the input
                that received the message, or ``time`` is not covered.
        """
        self._check()
        if not self.covers(output, time):
            raise CapabilityError(
                f"{self._operator}: a message at {self._time!r} does not allow output at "
                f"{time!r} on output {output}"
            )
        return Capability(time, self._internals[output], output, self._operator, self._activate)

    def delayed(self, time: Any) -> Capability:
        """``delayed_for_output(time, 0)``."""
        return self.delayed_for_output(time, 0)

    def retain_for_output(self, output: int) -> Capability:
        """An owned token at this ref's time for ``output``."""
        return self.delayed_for_output(self.time, output)

    def retain(self) -> Capability:
        """An owned token at this ref's time for output 0."""
        return self.delayed_for_output(self.time, 0)

    def __repr__(self) -> str:
        state = "" if self._valid else ", expired"
        return f"CapabilityRef(time={self._time!r}{state})"


class CapabilitySet:
    """A set of capabilities for one port whose times form an antichain.

    Useful for operators that hold "the least times of data still pending": ``insert`` keeps only
    minimal tokens, ``downgrade(frontier)`` replaces the held tokens by ones at the given
    frontier elements (each must be ≥ some held token).
    """

    def __init__(self, capabilities: Iterable[Capability] = ()) -> None:
        self._elements: list[Capability] = []
        for c in capabilities:
            self.insert(c)

    def insert(self, capability: Capability) -> None:
        """Add ``capability`` unless a held token is ≤ it; drop held tokens ≥ it."""
        t = capability.time
        for held in self._elements:
            if less_equal(held.time, t):
                capability.drop()
                return
        keep = []
        for held in self._elements:
            if less_equal(t, held.time):
                held.drop()
            else:
                keep.append(held)
        keep.append(capability)
        self._elements = keep

    def delayed(self, time: Any) -> Capability:
        """A token at ``time`` minted from a held token ≤ ``time``.

        Raises:
            CapabilityError: when no held token is ≤ ``time``.
        """
        for held in self._elements:
            if less_equal(held.time, time):
                return held.delayed(time)
        raise CapabilityError(
            f"no capability in {[c.time for c in self._elements]!r} allows time {time!r}"
        )

    def downgrade(self, frontier: Iterable[Any]) -> None:
        """Hold exactly tokens for the elements of ``frontier`` (an empty one drops all).

        Raises:
            CapabilityError: when a frontier element is not ≥ some held token.
        """
        new = [self.delayed(t) for t in frontier]
        for held in self._elements:
            held.drop()
        self._elements = []
        for c in new:
            self.insert(c)

    def first(self) -> Capability | None:
        return self._elements[0] if self._elements else None

    def times(self) -> list[Any]:
        return [c.time for c in self._elements]

    def clear(self) -> None:
        for held in self._elements:
            held.drop()
        self._elements = []

    def is_empty(self) -> bool:
        return not self._elements

    def __iter__(self) -> Iterator[Capability]:
        return iter(list(self._elements))

    def __len__(self) -> int:
        return len(self._elements)
