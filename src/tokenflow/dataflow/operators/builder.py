"""The generic operator builder: any number of inputs and outputs, logic built on tokens.

Source: the timestamp-tokens paper §4 (sessions guarded by tokens, refs valid for one
invocation), §5 (example operator); timely's ``dataflow/operators/generic/builder_rc.rs``.

Usage::

    builder = OperatorBuilder("Count", scope)
    data = builder.new_input(stream, Exchange(key))
    out, counts = builder.new_output()

    def constructor(capabilities):
        for cap in capabilities:          # one token per output, at the minimum time
            cap.drop()
        def logic(frontiers):
            for ref, batch in data:        # ref: CapabilityRef, batch: list | RecordBatch
                out.give_batch(ref, [len(batch)])
        return logic

    builder.build(constructor)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from tokenflow.dataflow.capability import Capability, CapabilityError, CapabilityRef
from tokenflow.dataflow.channels import Pact, Pull, Tee, as_pact
from tokenflow.order.partial_order import less_equal
from tokenflow.progress.antichain import Antichain, MutableAntichain
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.progress.location import Source, Target
from tokenflow.progress.reachability import Connectivity
from tokenflow.progress.shared_progress import SharedProgress

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream

B = TypeVar("B")

BATCH_SIZE = 1024
"""Records a ``Session`` buffers before pushing them as one batch."""
COALESCE_ROWS = 8192
"""Arrow and list batches below this many rows given within one invocation are coalesced
into messages of up to about this many rows (``OperatorOutput``)."""


class ProgressSafetyError(RuntimeError):
    """A message reached an input whose frontier had already passed its time."""


class OperatorInput:
    """An operator's input port: iterate it for ``(CapabilityRef, batch)`` pairs.

    ``frontier`` is the input's ``MutableAntichain``: a lower bound on the times of messages
    that may still arrive.
    """

    __slots__ = ("_puller", "consumed", "frontier", "_internals", "_summaries", "_op", "_refs",
                 "port", "_traffic", "_held")

    def __init__(self, op: OperatorCore, port: int, puller: Pull, traffic: Any = None) -> None:
        self._puller = puller
        self._traffic = traffic
        self._held: list[Any] = []  # messages set aside at a checkpoint barrier (``Traffic``)
        self.consumed: ChangeBatch[Any] = ChangeBatch()
        self.frontier = MutableAntichain()
        self._internals = op.internal
        self._summaries: list[Antichain] = []
        self._op = op
        self._refs: list[CapabilityRef] = []
        self.port = port

    def next(self) -> tuple[CapabilityRef, Any] | None:
        """The next received message, or None when none is waiting.  While a checkpoint
        barrier is up (``Traffic.barrier``) a message at or after it is set aside instead (the
        messages behind it still come: a channel does not order times), and handed over once
        the barrier is down."""
        traffic = self._traffic
        message = None
        held = self._held
        if held:
            for i, m in enumerate(held):
                if not traffic.holds(m[0]):
                    message = held.pop(i)
                    break
            else:
                if self not in traffic.held:  # set aside under an earlier barrier
                    traffic.held.append(self)
        if message is None:
            while True:
                message = self._puller.pull()
                if message is None:
                    return None
                if traffic is None or traffic.barrier is None or not traffic.holds(message[0]):
                    break
                if not held:
                    held = self._held = []
                    traffic.held.append(self)
                held.append(message)  # waits for this worker's capture
        time, batch = message
        if not self.frontier.less_equal(time):
            raise ProgressSafetyError(
                f"operator {self._op.name!r} input {self.port}: message at time {time!r} "
                f"arrived after the frontier {self.frontier.frontier()!r} passed it"
            )
        n = len(batch)
        self.consumed.update(time, n)
        if self._traffic is not None:
            self._traffic.received += n
        ref = CapabilityRef(time, self._internals, self._summaries, self._op.name, self._op.wake)
        self._refs.append(ref)
        return ref, batch

    def __iter__(self) -> Iterator[tuple[CapabilityRef, Any]]:
        while True:
            item = self.next()
            if item is None:
                return
            yield item

    def for_each(self, fn: Callable[[CapabilityRef, Any], None]) -> None:
        """Call ``fn(ref, batch)`` for every waiting message."""
        for ref, batch in self:
            fn(ref, batch)

    def release(self) -> None:
        """Schedule the operator after a checkpoint barrier held a message back here (it is
        handed over at the next ``next``)."""
        self._op.wake()

    def _expire(self) -> None:
        for ref in self._refs:
            ref._invalidate()
        self._refs.clear()


class Session:
    """Sends records at one time on one output, buffering single records into batches."""

    __slots__ = ("_output", "_time")

    def __init__(self, output: OperatorOutput, time: Any) -> None:
        self._output = output
        self._time = time

    @property
    def time(self) -> Any:
        return self._time

    def give(self, record: Any) -> None:
        """Send one record."""
        out = self._output
        if out._buffer_time != self._time:
            out._flush()
            out._buffer_time = self._time
        out._buffer.append(record)
        if len(out._buffer) >= BATCH_SIZE:
            out._flush()

    def give_iterator(self, records: Any) -> None:
        """Send every record of an iterable."""
        self._output._extend(self._time, records, BATCH_SIZE)

    def give_batch(self, batch: Any) -> None:
        """Send a whole batch (``list`` or ``RecordBatch``) without copying it."""
        out = self._output
        if out._buffer:
            out._flush()
        out._push(self._time, batch)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self._output._flush()


class OperatorOutput:
    """An operator's output port; data is sent through sessions opened with a token.

    Within one invocation, consecutive Arrow ``RecordBatch``es given at the same time with the
    same schema, each under ``COALESCE_ROWS`` rows, travel as one message (concatenated when the
    invocation ends, the time or schema changes, anything else is sent, or ``COALESCE_ROWS``
    rows are pending); so do consecutive ``list`` batches under ``COALESCE_ROWS`` records
    given at the same time (copied into one list, with the records of ``Session.give``): the
    cost of a message (routing, channel, progress) is paid per invocation rather than per
    small batch.  Order on the output is kept.
    """

    __slots__ = ("port", "tee", "produced", "_internal", "_op", "_buffer", "_buffer_time",
                 "_arrow", "_arrow_time", "_arrow_rows", "_traffic")

    def __init__(self, op: OperatorCore, port: int, tee: Tee, traffic: Any = None) -> None:
        self.port = port
        self.tee = tee
        self._traffic = traffic  # the worker's ``Traffic``: a message across a checkpoint's cut
        self.produced: ChangeBatch[Any] = ChangeBatch()
        self._internal = op.internal[port]
        self._op = op
        self._buffer: list[Any] = []
        self._buffer_time: Any = None
        self._arrow: list[pa.RecordBatch] = []
        self._arrow_time: Any = None
        self._arrow_rows = 0

    def _time_for(self, cap: Capability | CapabilityRef, time: Any) -> Any:
        if isinstance(cap, Capability):
            if not cap.valid:
                raise CapabilityError(
                    f"operator {self._op.name!r} output {self.port}: session opened with a "
                    f"dropped capability (time {cap._time!r})"
                )
            internal = cap._internal
            if internal is not self._internal and \
                    getattr(internal, "target", None) is not self._internal:  # a lent token's
                raise CapabilityError(
                    f"operator {self._op.name!r} output {self.port}: session opened with a token "
                    f"for output {cap.port} of operator {cap.operator!r} (time {cap._time!r})"
                )
            t = cap._time if time is None else time
            if time is not None and not less_equal(cap._time, time):
                raise CapabilityError(
                    f"operator {self._op.name!r} output {self.port}: no token covers time "
                    f"{time!r} (capability at {cap._time!r})"
                )
            return t
        if isinstance(cap, CapabilityRef):
            t = cap.time if time is None else time  # .time raises when the ref expired
            if not cap.covers(self.port, t):
                raise CapabilityError(
                    f"operator {self._op.name!r} output {self.port}: the message at "
                    f"{cap.time!r} gives no token for time {t!r} on this output"
                )
            return t
        raise CapabilityError(
            f"operator {self._op.name!r}: session needs a Capability or CapabilityRef, "
            f"got {type(cap).__name__}"
        )

    def session(self, cap: Capability | CapabilityRef, time: Any = None) -> Session:
        """A session at ``time`` (default: the token's time), checked against ``cap``.

        Raises:
            CapabilityError: when the token is dropped, expired, for another port, or does
                not cover ``time``.
        """
        return Session(self, self._time_for(cap, time))

    def give_batch(self, cap: Capability | CapabilityRef, batch: Any, time: Any = None) -> None:
        """Send ``batch`` at the token's time (or ``time``): one message, or part of one when
        small batches are coalesced (see the class docstring)."""
        t = self._time_for(cap, time)
        if type(batch) is list and self._op.running and len(batch) < COALESCE_ROWS:
            self._extend(t, batch, COALESCE_ROWS)
            return
        if self._buffer:
            self._flush()
        if type(batch) is pa.RecordBatch and self._op.running:
            n = batch.num_rows
            if 0 < n < COALESCE_ROWS:
                if self._arrow and (self._arrow_time != t or self._arrow[0].schema != batch.schema):
                    self._flush_arrow()
                self._arrow.append(batch)
                self._arrow_time = t
                self._arrow_rows += n
                if self._arrow_rows >= COALESCE_ROWS:
                    self._flush_arrow()
                return
        self._push(t, batch)

    def _extend(self, time: Any, records: Any, limit: int) -> None:
        """Add ``records`` to the list buffer at ``time`` (sending what is pending first when
        the time changes); send the buffer once it holds ``limit`` records or more."""
        if self._buffer_time != time:
            self._flush()
            self._buffer_time = time
        self._buffer.extend(records)
        if len(self._buffer) >= limit:
            self._flush()

    def _push(self, time: Any, batch: Any) -> None:
        if self._arrow:
            self._flush_arrow()
        self._emit(time, batch)

    def _emit(self, time: Any, batch: Any) -> None:
        n = len(batch)
        if n:
            self.produced.update(time, n)
            traffic = self._traffic
            if traffic is not None and traffic.barrier is not None and traffic.holds(time) \
                    and self.tee.replayable:
                sent = traffic.sent  # an aligned checkpoint's channel state, maybe
                self.tee.push((time, batch))
                traffic.cross(self._op.path, self.port, (time, batch), traffic.sent - sent)
            else:
                self.tee.push((time, batch))

    def _flush_arrow(self) -> None:
        pending = self._arrow
        self._arrow = []
        self._arrow_rows = 0
        self._emit(self._arrow_time, pending[0] if len(pending) == 1 else pa.concat_batches(pending))

    def _flush(self) -> None:
        if self._arrow:
            self._flush_arrow()
        if self._buffer:
            batch = self._buffer
            self._buffer = []
            self._push(self._buffer_time, batch)


class CountingPush:
    """Counts the records a channel will deliver (``len(batch) * weight``: an exchange delivers
    each record once, a broadcast once per worker) into the worker's ``Traffic.sent``, and
    keeps a message back while ``Traffic.defer`` says so (an aligned snapshot)."""

    __slots__ = ("_pusher", "_traffic", "_weight")

    def __init__(self, pusher: Any, traffic: Any, weight: int) -> None:
        self._pusher = pusher
        self._traffic = traffic
        self._weight = weight

    def push(self, message: Any) -> None:
        traffic = self._traffic
        traffic.sent += len(message[1]) * self._weight
        if traffic.defer is not None and traffic.defers(message[0]):
            traffic.deferred.append((self._pusher, message))
            return
        self._pusher.push(message)


Logic = Callable[[list[MutableAntichain]], Any]


class OperatorCore:
    """The ``Operate`` implementation behind every operator built with ``OperatorBuilder``."""

    local = True

    def __init__(self, name: str, index: int, path: tuple[int, ...], peers: int,
                 min_time: Any, notify: bool) -> None:
        self.name = name
        self.index = index
        self.path = path
        self.peers = peers
        self.min_time = min_time
        self.notify = notify
        self.inputs = 0
        self.outputs = 0
        self.internal: list[ChangeBatch[Any]] = []
        self.input_ports: list[OperatorInput] = []
        self.output_ports: list[OperatorOutput] = []
        self.summary: Connectivity = []
        self.shared_progress = SharedProgress(0, 0)
        self.logic: Logic | None = None
        self.frontiers: list[MutableAntichain] = []
        self.running = False
        self.activate: Callable[[tuple[int, ...]], None] | None = None
        self.restored: list[tuple[int, Any]] = []
        """Messages this operator sent across the cut of the snapshot its worker restores
        (``tokenflow.dataflow.channel_state``): pushed again at its first scheduling."""

    def wake(self) -> None:
        """A token of this operator changed: outside an invocation, schedule the operator so
        that it reports the change (inside one, ``schedule`` collects it anyway)."""
        if not self.running and self.activate is not None:
            self.activate(self.path)

    def get_internal_summary(self) -> tuple[Connectivity, SharedProgress]:
        for internal in self.shared_progress.internals:
            internal.update(self.min_time, self.peers)
        return self.summary, self.shared_progress

    def set_external_summary(self) -> None:
        pass

    def schedule(self) -> bool:
        sp = self.shared_progress
        for port, changes in enumerate(sp.frontiers):
            if changes._updates:
                self.input_ports[port].frontier.update_iter(changes.drain())
        assert self.logic is not None
        self.running = True
        try:
            if self.restored:  # its initial tokens are still counted: they cover any time
                for port, (time, batch) in self.restored:
                    self.output_ports[port]._emit(time, batch)
                self.restored = []
            incomplete = self.logic(self.frontiers)
        finally:
            for out in self.output_ports:
                out._flush()
            for inp in self.input_ports:
                inp._expire()
            self.running = False
        for port, inp in enumerate(self.input_ports):
            inp.consumed.drain_into(sp.consumeds[port])
        for port, internal in enumerate(self.internal):
            internal.drain_into(sp.internals[port])
        for port, out in enumerate(self.output_ports):
            out.produced.drain_into(sp.produceds[port])
        return bool(incomplete)


class _Uncounted(ChangeBatch[Any]):
    """The bookkeeping of the initial tokens a worker joining a running job hands its
    operators: no worker counted them, so they may only be dropped (a data message sent with
    one is refused as a token of another port; a copy or a downgrade raises here)."""

    def __init__(self, operator: str, port: int) -> None:
        super().__init__()
        self._operator = operator
        self._port = port
        self._created = False

    def update(self, key: Any, diff: int) -> None:
        if diff == 1 and not self._created:
            self._created = True  # the token's own creation
            return
        if diff == -1:
            return  # dropped: nothing was counted
        raise CapabilityError(
            f"{self._operator}: output {self._port}'s initial token on a worker that joined a "
            "running job can only be dropped (no worker counted it; operators on joining "
            "workers produce data only from tokens of records they receive)")


def operator_key(path: tuple[int, ...], name: str) -> str:
    """An operator's stable key, ``<path joined by ".">:<name>``: the same on every run of the
    same dataflows (state, sources and routing tables are recorded under it)."""
    return f"{'.'.join(map(str, path))}:{name}"


class OperatorBuilder:
    """Declares an operator's inputs and outputs, then builds it from a constructor.

    Args:
        name: the operator's name (shown in errors and progress reports).
        scope: the scope to add it to.
        notify: schedule the operator when an input frontier changes (default True).
    """

    def __init__(self, name: str, scope: Scope, notify: bool = True) -> None:
        self.scope = scope
        index = scope.allocate_child_id()
        self.index = index
        self.core = OperatorCore(name, index, scope.path + (index,), scope.peers,
                                 scope.min_time, notify)
        self._pending_connections: list[list[Antichain] | None] = []
        self._built = False

    @property
    def name(self) -> str:
        return self.core.name

    def new_input(self, stream: Stream, pact: Pact | Any = None) -> OperatorInput:
        """An input connected to ``stream`` with identity summaries to every output."""
        return self.new_input_connection(stream, pact, None)

    def new_input_connection(
        self, stream: Stream, pact: Pact | Any, connection: Sequence[Any] | None
    ) -> OperatorInput:
        """An input with per-output summaries ``connection[o]`` (a summary, an ``Antichain``
        of summaries, or None for "not connected"); None means identity to every output.
        """
        if stream.scope is not self.scope:
            raise ValueError(
                f"operator {self.name!r}: stream {stream.name!r} belongs to another scope "
                "(use enter/leave to cross scopes)"
            )
        core = self.core
        port = core.inputs
        pact = as_pact(pact)
        identifier = self.scope.new_identifier()
        pusher, puller = pact.connect(self.scope.worker, identifier, core.path)
        copies = getattr(pact, "copies", None)
        weight = copies(self.scope.peers) if copies is not None else 1
        traffic = getattr(self.scope.worker, "traffic", None)
        if traffic is not None:
            pusher = CountingPush(pusher, traffic, weight)
        stream.connect_to(Target(self.index, port), pusher, weight, copies is not None)
        if not getattr(pact, "replayable", True):
            stream.tee.replayable = False
        inp = OperatorInput(core, port, puller, traffic)
        core.inputs += 1
        core.input_ports.append(inp)
        core.frontiers.append(inp.frontier)
        self._pending_connections.append(
            None if connection is None else [_as_antichain(c) for c in connection]
        )
        return inp

    def new_output(self) -> tuple[OperatorOutput, Stream]:
        """A new output port and the stream it produces."""
        from tokenflow.dataflow.stream import Stream

        core = self.core
        port = core.outputs
        core.outputs += 1
        core.internal.append(ChangeBatch())
        tee = Tee()
        out = OperatorOutput(core, port, tee, getattr(self.scope.worker, "traffic", None))
        core.output_ports.append(out)
        stream = Stream(Source(self.index, port), self.scope, tee, f"{self.name}.out{port}")
        return out, stream

    def build(self, constructor: Callable[[list[Capability]], Logic]) -> None:
        """Create the operator: ``constructor(capabilities)`` returns ``logic(frontiers)``.

        ``capabilities`` holds one token per output at the minimum time; ``logic`` is called at
        each scheduling with the list of input frontiers and may return True to stay scheduled
        (work left that no input or frontier change will trigger).
        """
        if self._built:
            raise RuntimeError(f"operator {self.name!r} was already built")
        self._built = True
        core = self.core
        identity = self.scope.identity
        summary: Connectivity = []
        for conn in self._pending_connections:
            if conn is None:
                row = [Antichain.from_elem(identity) for _ in range(core.outputs)]
            else:
                if len(conn) != core.outputs:
                    raise ValueError(
                        f"operator {self.name!r}: connection lists {len(conn)} outputs, "
                        f"operator has {core.outputs}"
                    )
                row = conn
            summary.append(row)
        core.summary = summary
        for port, inp in enumerate(core.input_ports):
            inp._summaries = summary[port]
        core.shared_progress = SharedProgress(core.inputs, core.outputs)
        if getattr(self.scope.worker, "joining", False):
            # a worker joining a running job: the others never counted tokens of its own
            core.peers = 0
            capabilities = [Capability(self.scope.min_time, _Uncounted(core.name, o), o,
                                       core.name) for o in range(core.outputs)]
        else:
            capabilities = [
                Capability(self.scope.min_time, core.internal[o], o, core.name, core.wake)
                for o in range(core.outputs)
            ]
        for internal in core.internal:
            internal.clear()  # the scope assumes every worker starts with one token per output
        core.logic = constructor(capabilities)
        restored = getattr(self.scope.worker, "restored_messages", None)
        if restored is not None:
            core.restored = restored(core.path)
        core.activate = self.scope.worker.activate
        self.scope.add_operator(core, self.index)
        self.scope.worker.activate(core.path)

    def state(self, name: str, state: B) -> B:
        """Declare ``state`` (a ``BinnedState``) as this operator's state called ``name``.

        The worker can then snapshot it per bin and, when the job is restored from a snapshot,
        has already loaded the bins it owns into it when this returns (mint the tokens of its
        ``pending_times()`` in the constructor).  The state's key is stable across runs of the
        same dataflow: ``<operator path>:<operator name>/<name>``.

        Raises:
            ValueError: the same name is declared twice for this operator.
        """
        key = f"{operator_key(self.core.path, self.name)}/{name}"
        register = getattr(self.scope.worker, "register_state", None)
        if register is not None:
            register(key, state)
        return state

    def activator(self) -> Callable[[], None]:
        """A function that asks for this operator to be scheduled."""
        worker = self.scope.worker
        path = self.core.path
        return lambda: worker.activate(path)

    def delayed_activator(self) -> Callable[[float], None]:
        """A function ``(seconds)`` that asks for this operator to be scheduled once that much
        time has passed (``Worker.activate_after``)."""
        worker = self.scope.worker
        path = self.core.path
        return lambda delay: worker.activate_after(path, delay)


def _as_antichain(c: Any) -> Antichain:
    if c is None:
        return Antichain()
    if isinstance(c, Antichain):
        return c
    return Antichain.from_elem(c)


