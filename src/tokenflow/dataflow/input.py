"""``InputHandle``: feeds a dataflow from worker code, one epoch at a time.

Source: the timestamp-tokens paper §4.2 (tokens that notify the system when modified, used
outside operators to control inputs); timely's ``dataflow/operators/input.rs``; the
distributed-DBSP design, "Input" (a restarted job reads every step after its checkpoint once).

An input handle takes part in snapshots like a replayable source (``tokenflow.control``): when
the control plane pauses it at epoch ``e``, the worker code's ``advance_to(t)`` with ``t > e``
moves the handle to ``e`` and steps the worker there until the job resumes (then it goes on to
``t``) or stops (then ``JobStopped`` ends the worker function).  Its position is the epoch: a
job restored from a snapshot of epoch ``e`` runs the same worker code again, and the handle
drops what it is given before ``e`` (already in the snapshot), so a deterministic input loop
feeds every epoch exactly once.

With an input log (``worker.input_log``, a ``tokenflow.io.inputlog.InputLog``; the
distributed-DBSP design, "Input" and "Input/output synchronization") the worker code need not
be deterministic.  The handle logs every batch it sends at its epoch, and when it moves past
an epoch (``advance_to``, a snapshot pause, ``close``) it seals that epoch — the file is
durable — *before* it downgrades or drops its token: no output of an epoch can be released
before the epoch's input is durable, since output waits for the frontier to pass the epoch.  A
run that restores a snapshot of epoch ``e`` (or any run with ``worker.replay`` set, from the
handle's first epoch) replays the logged epochs from ``e`` on, at their epochs, on its first
step or first call, and then drops what the worker code gives before the first epoch not
logged (``Replay.until``); from there on the worker code's input is logged again.  When the
logged input ended (every old worker closed its handle), the handle closes after the replay
and ignores the worker code.  A run that neither restores nor replays refuses a log that
already holds epochs of its input.  Limits: epochs must be ints; a handle that is garbage
collected rather than closed logs no end (a restored run then takes the epochs after its last
seal from the worker code); the job stopping after a snapshot (``Worker.stop``) logs no end.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenflow.dataflow.capability import Capability, CapabilityError
from tokenflow.dataflow.operators.builder import (
    BATCH_SIZE,
    OperatorBuilder,
    OperatorOutput,
    operator_key,
)
from tokenflow.order.partial_order import less_equal
from tokenflow.progress.change_batch import ChangeBatch

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream


class JobStopped(RuntimeError):
    """The control plane stopped the job (after a snapshot) while the worker code was feeding
    an input; the runtimes end the worker function quietly when it propagates."""


class LentToken(ChangeBatch[Any]):
    """The bookkeeping of an input token another worker lent this one, a worker that joined a
    running job (``tokenflow.membership``, "Inputs on a joining worker").

    The lender counted the token (+1 in its progress stream) and handed its copy over, so the
    token's creation is not counted again here.  Later updates go to the input operator's own
    bookkeeping (``internal``), except releases (-1: a drop, the old time of a downgrade): they
    wait for ``release()``, called once every worker has applied the lender's +1 — a worker
    that saw this worker's -1 first could let its frontier pass the lent time while the lender
    still held its own token there.  Holding a release back only holds frontiers back, which
    is always safe.
    """

    def __init__(self, internal: ChangeBatch[Any]) -> None:
        super().__init__()
        self.target = internal
        """The output's bookkeeping this one feeds (sessions accept the token for it)."""
        self._created = False
        self._held: list[tuple[Any, int]] = []
        self.released = False
        """True once releases go through (every worker applied the lender's count)."""

    def update(self, key: Any, diff: int) -> None:
        if diff == 1 and not self._created:
            self._created = True  # the adopted token itself: the lender counted it
            return
        if diff < 0 and not self.released:
            self._held.append((key, diff))
            return
        self.target.update(key, diff)

    def defer(self, key: Any, diff: int) -> None:  # the garbage-collection backstop
        if diff < 0 and not self.released:
            self._held.append((key, diff))  # list.append is atomic; released on the owner
            return
        self.target.defer(key, diff)

    def release(self) -> None:
        """Let the held releases and all later ones through (call on the owning worker)."""
        self.released = True
        held, self._held = self._held, []
        for key, diff in held:
            self.target.update(key, diff)


def lent_token(core: Any, time: Any, port: int = 0) -> tuple[Capability, LentToken]:
    """A token at ``time`` for output ``port`` of the input or source operator ``core`` (its
    ``OperatorCore``) that another worker lent this one, and its bookkeeping."""
    gate = LentToken(core.internal[port])
    return Capability(time, gate, port, core.name, core.wake), gate


class InputHandle:
    """Sends records at the current epoch; ``advance_to`` moves the epoch, ``close`` ends input.

    The handle owns the input's capability: while it is open, the frontier downstream cannot
    pass ``time``.  A handle the worker code drops is garbage collected, closing its input.
    """

    __slots__ = ("_output", "_metrics", "_cap", "_activate", "_buffer", "name", "_worker",
                 "_start", "_pause", "_sent_at_time", "_user_time", "_log", "_key", "_replay",
                 "_ended", "path", "ready", "__weakref__")

    def __init__(self, output: OperatorOutput, capability: Capability, activate: Any,
                 name: str, metrics: dict[str, int] | None = None, worker: Any = None,
                 start: Any = None, log: Any = None, key: str | None = None) -> None:
        """``log``: the worker's input log (``InputLog``) or None; ``key``: the handle's key
        in it (the key it registers under as a source).

        Raises:
            TypeError: a log is given and the epochs are not ints.
            InputLogError: the log cannot be read, or a run that does not replay finds epochs
                of this input already logged.
        """
        self._output = output
        self._metrics = metrics if metrics is not None else {}
        self._cap: Capability | None = capability
        self._activate = activate
        self._buffer: list[Any] = []
        self.name = name
        self._worker = worker
        self._start = start  # a restored job's epoch: input before it is in the snapshot
        self._pause: Any = None
        self._sent_at_time = False  # something was sent at the current epoch
        self._user_time = capability.time  # the epoch the worker code is at
        if start is not None and not less_equal(start, capability.time):
            capability.downgrade(start)  # restored: the input starts at the snapshot's epoch
        self._log = log
        self._key = key if key is not None else name
        self._replay: Any = None  # the log's Replay, until it has been given
        self._ended = False  # closed by the replay: the logged input ended
        self.path: tuple[int, ...] = ()
        """The input operator's path: (dataflow index, operator index) at the top level."""
        self.ready = True
        """False on a worker that joined a running job until the job lends this input a
        token (``JobHandle.add_worker(inputs=True)``; the input is then open at the lender's
        epoch, or closed when the lender had closed it); until then it can only be closed."""
        if log is not None:
            self._open_log(start)

    # -- the input log ---------------------------------------------------------------------

    def _open_log(self, start: Any) -> None:
        """Bind the log to the worker count and, on a run that replays, plan the replay: from
        the handle's epoch (a restored snapshot's) to the first epoch not logged, which then
        becomes the epoch before which the worker code's input is dropped."""
        log, cap = self._log, self._cap
        assert cap is not None
        since = cap.time
        if type(since) is not int:
            raise TypeError(f"input {self.name!r}: the input log needs int epochs, got {since!r}")
        worker = self._worker
        log.bind(int(getattr(worker, "peers", 1)))
        if start is None and not getattr(worker, "replay", False):
            log.ensure_fresh(self._key, since)
            return
        plan = log.replay(self._key, since)
        if plan.until == since:
            return  # nothing logged from the snapshot's epoch on
        self._replay = plan
        if plan.until is not None:
            self._start = plan.until

    def _ensure_replayed(self) -> None:
        """Give the planned replay (once): each logged epoch's batches at that epoch, then move
        to the first epoch not logged (or close, when the logged input ended)."""
        plan = self._replay
        if plan is None:
            return
        self._replay = None
        cap = self._cap
        if cap is None:
            return
        for epoch in plan.epochs:
            batches = plan.batches(epoch)
            if epoch != cap.time:
                cap.downgrade(epoch)
            for batch in batches:
                self._output.give_batch(cap, batch)
                self._metrics["records_in"] = self._metrics.get("records_in", 0) + len(batch)
        if plan.until is None:
            self._ended = True
            cap.drop()
            self._cap = None
        elif plan.until != cap.time:
            cap.downgrade(plan.until)
        self._sent_at_time = False
        self._activate()

    def _log_batch(self, cap: Capability, batch: Any) -> None:
        if self._log is not None:
            self._log.append(self._key, cap.time, [batch])

    def _seal(self, cap: Capability, until: Any) -> None:
        """Before the token leaves its epoch for ``until`` (None: it is dropped): make the
        epoch's input durable."""
        if self._log is None or getattr(self._worker, "stopped", False):
            return
        if until is None:
            self._log.seal_last(self._key, cap.time)
        else:
            self._log.seal(self._key, cap.time, until)

    @property
    def time(self) -> Any:
        """The current epoch.

        Raises:
            CapabilityError: after ``close()``.
        """
        self._ensure_replayed()
        if self._cap is None:
            raise CapabilityError(f"input {self.name!r} is closed")
        return self._cap.time

    @property
    def closed(self) -> bool:
        self._ensure_replayed()
        return self._cap is None

    def send(self, record: Any) -> None:
        """Send one record at the current epoch (buffered into batches).

        Raises:
            CapabilityError: after ``close()``, or on a worker that joined a running job before
                the job lent this input a token (``ready``).
        """
        if self._replay is not None:
            self._ensure_replayed()
        if self._cap is None:
            if self._ended:
                return  # the logged input ended: the worker code's input is not used
            self._check_stopped()
            raise CapabilityError(f"input {self.name!r} is closed: cannot send {record!r}")
        if not self.ready:
            self._live()  # raises: a joining worker's input without a lent token
        if self._replayed():
            return
        self._wait_if_paused()
        self._buffer.append(record)
        if len(self._buffer) >= BATCH_SIZE:
            self.flush()

    def send_at(self, time: Any, record: Any) -> None:
        """Send ``record`` as the *timed record* ``(time, record)``, buffered with the other
        records into a message at the current epoch (``tokenflow.dataflow.operators.timed``).

        ``time`` may be any time at or after the current epoch, so one message (and one
        progress update when the handle advances) carries records of many times: the message's
        epoch is ≤ every record's time, as differential dataflow sends update batches under a
        capability ≤ their updates' times.  The frontier downstream still says which record
        times are complete: a record at ``time`` travels in a message at or before ``time``, so
        none can arrive once the frontier has passed it.  Consumers read ``(time, record)``
        pairs (the timestamp-tokens paper §5: an operator that coordinates at its own
        granularity, not one message per timestamp).

        Raises:
            CapabilityError: ``time`` is earlier than the current epoch (``advance_to``), or the
                handle cannot send (see ``send``).
        """
        at = self._user_time
        if not (time >= at if type(time) is int and type(at) is int else less_equal(at, time)):
            raise CapabilityError(
                f"input {self.name!r}: a timed record at {time!r} is earlier than the current "
                f"epoch {at!r}")
        self.send((time, record))

    def send_batch_at(self, batch: Any, column: str = "time") -> None:
        """Send an Arrow ``RecordBatch`` of timed records at the current epoch: ``column``
        (int64) holds each row's time, at or after the epoch (the columnar form of
        ``send_at``; ``tokenflow.dataflow.operators.timed``).

        Raises:
            CapabilityError: a row's time is earlier than the current epoch, or the handle
                cannot send (see ``send``).
        """
        if batch.num_rows:
            least = int(np.min(batch.column(column).to_numpy()))
            at = self._user_time
            if not less_equal(at, least):
                raise CapabilityError(
                    f"input {self.name!r}: a timed row at {least!r} is earlier than the current "
                    f"epoch {at!r}")
        self.send_batch(batch)

    def send_batch(self, batch: Any) -> None:
        """Send a whole batch (``list`` or ``RecordBatch``) at the current epoch."""
        self._ensure_replayed()
        if self._ended:
            return
        self.flush()
        cap = self._live()
        if self._replayed():
            return
        self._wait_if_paused()
        cap = self._live()
        self._sent_at_time = True
        self._log_batch(cap, batch)
        self._output.give_batch(cap, batch)
        self._metrics["records_in"] = self._metrics.get("records_in", 0) + len(batch)
        self._activate()

    def flush(self) -> None:
        """Push buffered records now."""
        self._ensure_replayed()
        if self._buffer:
            cap = self._live()
            batch = self._buffer
            self._buffer = []
            self._sent_at_time = True
            self._log_batch(cap, batch)
            self._output.give_batch(cap, batch)
            self._metrics["records_in"] = self._metrics.get("records_in", 0) + len(batch)
            self._activate()

    def advance_to(self, time: Any) -> None:
        """Move to epoch ``time`` (≥ the current one); earlier epochs become complete.

        Raises:
            CapabilityError: when ``time`` is earlier than the current epoch, or after close.
            InputLogError: sealing the epoch in the input log failed.
        """
        self._ensure_replayed()
        if self._ended:
            self._user_time = time
            return
        cap = self._live()
        if not less_equal(self._user_time, time):
            raise CapabilityError(
                f"input {self.name!r}: cannot advance from epoch {self._user_time!r} to {time!r}"
            )
        self._user_time = time
        if self._start is not None and not less_equal(self._start, time):
            return  # replaying what the snapshot holds: the input stays at its epoch
        self.flush()
        while self._pause is not None and not less_equal(time, self._pause):
            self._hold()  # a snapshot pause: wait at the pause epoch until resumed or stopped
            cap = self._live()
        if time != cap.time:
            if less_equal(cap.time, time):
                self._seal(cap, time)  # durable before the token moves on
            self._sent_at_time = False
        cap.downgrade(time)
        self._activate()

    def close(self) -> None:
        """End the input: no more records, its frontier becomes empty (idempotent).  With an
        input log, the end is sealed first (not when the job was stopped: it goes on after a
        restore)."""
        self._ensure_replayed()
        if self._cap is not None:
            self.flush()
            self._seal(self._cap, None)
            self._cap.drop()
            self._cap = None
            self._activate()

    def _replayed(self) -> bool:
        """True while the current epoch is before a restored job's start (drop the input)."""
        return self._start is not None and not less_equal(self._start, self._user_time)

    def _wait_if_paused(self) -> None:
        """Before sending at the current epoch: hold while it is at or after a pause epoch."""
        while self._pause is not None and self._cap is not None and \
                less_equal(self._pause, self._cap.time):
            self._hold()

    def _hold(self) -> None:
        """Move to the pause epoch and step the worker until the pause lifts or moves, or the
        job stops.

        Raises:
            JobStopped: the job stopped at the pause.
        """
        cap = self._live()
        if cap.time != self._pause:
            self._sent_at_time = False
            self._seal(cap, self._pause)  # durable before the token moves to the pause
            cap.downgrade(self._pause)
            self._activate()
        at = cap.time
        worker = self._worker
        if worker is None:
            raise CapabilityError(f"input {self.name!r}: paused, but no worker to step")
        pause = self._pause
        # until the pause lifts or moves (the control plane's final pause epoch may be later
        # than the one it held the input at first): the caller then checks again
        while self._pause == pause and not getattr(worker, "stopped", False):
            worker.step_or_park()
        if getattr(worker, "stopped", False):
            raise JobStopped(f"input {self.name!r}: the job stopped at epoch {at!r}")

    # -- the control plane's view (``tokenflow.control``) --------------------------------------

    granularity = 1
    """Epochs are consecutive integers (any time type works; pauses use the handle's times)."""

    @property
    def frontier(self) -> Any:
        """The handle's epoch (None once closed)."""
        self._ensure_replayed()
        return None if self._cap is None else self._cap.time

    def safe_point(self) -> Any:
        """The least epoch the handle can pause at now: its epoch, or the next one when it has
        sent at it (None once closed)."""
        self._ensure_replayed()
        if self._cap is None:
            return None
        t = self._cap.time
        return t + 1 if self._sent_at_time or self._buffer else t

    def pause_at(self, epoch: Any) -> None:
        """Let ``advance_to`` go no further than ``epoch`` until ``resume()``.

        Raises:
            ValueError: the handle already sent data at or after ``epoch``.
        """
        self._ensure_replayed()
        cap = self._cap
        if cap is not None and not less_equal(cap.time, epoch) and cap.time != epoch:
            raise ValueError(f"input {self.name!r}: cannot pause at {epoch!r}: already at "
                             f"epoch {cap.time!r}")
        if cap is not None and cap.time == epoch and (self._sent_at_time or self._buffer):
            raise ValueError(f"input {self.name!r}: cannot pause at {epoch!r}: records were "
                             "already sent at it")
        self._pause = epoch

    def resume(self) -> None:
        """Lift a pause."""
        self._pause = None

    # An input's pauses are all the control plane's (a user's own ``advance_to`` is how a job
    # holds its input): its hold is the pause itself.
    hold_at = pause_at
    release_hold = resume
    job_pause = None

    @property
    def paused(self) -> bool:
        """True once paused at the pause epoch (or closed)."""
        self._ensure_replayed()
        return self._cap is None or (self._pause is not None and self._cap.time == self._pause)

    def positions(self) -> dict[str, Any]:
        """Nothing to record: the handle restarts at the snapshot's epoch (see the module)."""
        return {}

    def _check_stopped(self) -> None:
        if getattr(self._worker, "stopped", False):
            raise JobStopped(f"input {self.name!r}: the job was stopped")

    def _live(self) -> Capability:
        if self._cap is None:
            self._check_stopped()
            raise CapabilityError(f"input {self.name!r} is closed")
        if not self.ready:
            raise CapabilityError(
                f"input {self.name!r}: this worker joined a running job and holds no token for "
                "it yet; the job lends it one with add_worker(inputs=True) (wait with "
                "worker.step_while(lambda: not handle.ready)), or close the input")
        return self._cap

    # -- lending the token to a joining worker (``tokenflow.membership``) ------------------------

    def lend(self) -> Any:
        """Copy this handle's token at its current epoch and hand the copy over (counted in
        this worker's progress stream, owned by the worker that adopts it); its time, or None
        when the input is closed or not ready."""
        self._ensure_replayed()
        if self._cap is None or not self.ready or self._ended:
            return None
        self.flush()  # what was sent at the epoch goes first
        return self._cap.copy().hand_over()

    def adopt(self, token: Capability) -> None:
        """Take ``token``, lent by another worker (``lend`` there, ``lent_token`` here), in
        place of the uncounted one a joining worker starts with.  A closed handle drops it at
        once (the drop is held back with its ``LentToken``)."""
        old, self._cap = self._cap, token
        if old is None:
            token.drop()
            self._cap = None
        else:
            old.drop()  # the uncounted initial token: nothing was counted
            self._user_time = token.time
            self.ready = True
        self._activate()


def new_input(scope: Scope, name: str = "Input") -> tuple[InputHandle, Stream]:
    """An ``(InputHandle, Stream)`` pair in ``scope``; the handle registers with the worker
    for snapshots under its operator's path and name (the same on every run of the job)."""
    builder = OperatorBuilder(name, scope, notify=False)
    output, stream = builder.new_output()
    holder: list[Capability] = []
    ref: list[Any] = []  # a weak reference to the handle, once made

    def logic(frontiers: Any) -> bool:
        handle = ref[0]() if ref else None
        if handle is not None and handle._replay is not None:
            handle._ensure_replayed()  # the first step gives a logged replay
        return False

    def constructor(capabilities: list[Capability]) -> Any:
        holder.extend(capabilities)
        return logic

    builder.build(constructor)
    worker = scope.worker
    key = operator_key(builder.core.path, name)
    lookup = getattr(worker, "restored_positions", None)
    restored = lookup(key) if lookup is not None else None
    log = getattr(worker, "input_log", None)
    activate = builder.activator()
    handle = InputHandle(output, holder[0], activate, name,
                         getattr(worker, "metrics", None), worker,
                         None if restored is None else restored[1], log, key)
    handle.path = builder.core.path
    if getattr(worker, "joining", False):
        handle.ready = False
        adopters = getattr(worker, "adopters", None)
        if adopters is not None:
            adopters[key] = builder.core
    if handle._replay is not None:
        ref.append(weakref.ref(handle))
        activate()
    register = getattr(worker, "register_source", None)
    if register is not None:
        register(key, handle, weak=True)
    return handle, stream
