"""Generic operators: ``source``, ``unary``, ``unary_frontier``, ``unary_notify``, ``binary``,
``binary_frontier``, ``sink``.

Source: the timestamp-tokens paper §3–§5 (Lattuada, McSherry et al., 2022); timely's
``dataflow/operators/generic/operator.rs``.
Each takes a *constructor* called once with the operator's initial token(s) and an
``OperatorInfo``, returning the *logic* called at every scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.notificator import FrontierNotificator
from tokenflow.dataflow.operators.builder import OperatorBuilder, OperatorInput, OperatorOutput

if TYPE_CHECKING:
    from tokenflow.dataflow.scope import Scope
    from tokenflow.dataflow.stream import Stream


@dataclass(frozen=True)
class OperatorInfo:
    """What an operator may want to know about itself when it is constructed."""

    name: str
    index: int
    worker_index: int
    peers: int
    activate: Callable[[], None]
    """Ask to be scheduled again (e.g. a source with more to produce)."""
    state: Callable[[str, Any], Any]
    """``info.state(name, binned_state)`` declares the operator's state (a
    ``tokenflow.dataflow.state.BinnedState``; see ``OperatorBuilder.state``) and returns it,
    loaded with this worker's bins when the job is restored: call it in the constructor,
    then mint tokens for its ``pending_times()``."""
    activate_after: Callable[[float], None]
    """``info.activate_after(seconds)``: be scheduled again once that much time has passed,
    e.g. a source polling an external system; the worker parks meanwhile (timely's
    ``activate_after``).  ``activate`` and this are safe to call from other threads."""


def _info(builder: OperatorBuilder) -> OperatorInfo:
    scope = builder.scope
    return OperatorInfo(builder.name, builder.index, scope.worker_index, scope.peers,
                        builder.activator(), builder.state, builder.delayed_activator())


def source(
    scope: Scope,
    name: str,
    constructor: Callable[[Capability, OperatorInfo], Callable[[OperatorOutput], Any]],
) -> Stream:
    """An operator with no inputs and one output.

    ``constructor(capability, info)`` returns ``logic(output)``; the source keeps producing
    while it holds a token and calls ``info.activate()`` to be scheduled again.
    """
    builder = OperatorBuilder(name, scope, notify=False)
    output, stream = builder.new_output()
    info = _info(builder)

    def build(caps: list[Capability]) -> Any:
        logic = constructor(caps[0], info)
        return lambda frontiers: logic(output)

    builder.build(build)
    return stream


def unary(
    stream: Stream,
    pact: Any,
    name: str,
    constructor: Callable[[Capability, OperatorInfo], Callable[[OperatorInput, OperatorOutput], Any]],
    notify: bool = False,
) -> Stream:
    """One input, one output; scheduled when data arrives (or on ``info.activate()``).

    ``constructor(capability, info)`` gets the output's initial token (drop it unless the
    operator produces data unprompted) and returns ``logic(input, output)``.
    """
    builder = OperatorBuilder(name, stream.scope, notify=notify)
    inp = builder.new_input(stream, pact)
    output, out_stream = builder.new_output()
    info = _info(builder)

    def build(caps: list[Capability]) -> Any:
        logic = constructor(caps[0], info)
        return lambda frontiers: logic(inp, output)

    builder.build(build)
    return out_stream


def unary_frontier(
    stream: Stream,
    pact: Any,
    name: str,
    constructor: Callable[[Capability, OperatorInfo], Callable[[OperatorInput, OperatorOutput], Any]],
) -> Stream:
    """Like ``unary`` but also scheduled when the input frontier changes (``input.frontier``)."""
    return unary(stream, pact, name, constructor, notify=True)


def unary_notify(
    stream: Stream,
    pact: Any,
    name: str,
    init: Iterable[Any],
    logic: Callable[[OperatorInput, OperatorOutput, FrontierNotificator], Any],
) -> Stream:
    """A unary operator with a ``FrontierNotificator`` (Naiad-style notifications).

    ``init`` lists times to be notified at from the start; ``logic(input, output,
    notificator)`` requests more with ``notificator.notify_at(ref.retain())`` and receives them
    from ``notificator.for_each(...)`` / ``next()`` once the input frontier has passed them.
    """
    builder = OperatorBuilder(name, stream.scope, notify=True)
    inp = builder.new_input(stream, pact)
    output, out_stream = builder.new_output()

    def build(caps: list[Capability]) -> Any:
        notificator = FrontierNotificator([inp.frontier])
        cap = caps[0]
        for t in init:
            notificator.notify_at(cap.delayed(t))
        cap.drop()
        return lambda frontiers: logic(inp, output, notificator)

    builder.build(build)
    return out_stream


def binary(
    left: Stream,
    right: Stream,
    pact_left: Any,
    pact_right: Any,
    name: str,
    constructor: Callable[
        [Capability, OperatorInfo], Callable[[OperatorInput, OperatorInput, OperatorOutput], Any]
    ],
    notify: bool = False,
) -> Stream:
    """Two inputs, one output; ``logic(input1, input2, output)``."""
    builder = OperatorBuilder(name, left.scope, notify=notify)
    in1 = builder.new_input(left, pact_left)
    in2 = builder.new_input(right, pact_right)
    output, out_stream = builder.new_output()
    info = _info(builder)

    def build(caps: list[Capability]) -> Any:
        logic = constructor(caps[0], info)
        return lambda frontiers: logic(in1, in2, output)

    builder.build(build)
    return out_stream


def binary_frontier(
    left: Stream,
    right: Stream,
    pact_left: Any,
    pact_right: Any,
    name: str,
    constructor: Callable[
        [Capability, OperatorInfo], Callable[[OperatorInput, OperatorInput, OperatorOutput], Any]
    ],
) -> Stream:
    """Like ``binary`` but also scheduled when either input frontier changes."""
    return binary(left, right, pact_left, pact_right, name, constructor, notify=True)


def sink(
    stream: Stream,
    pact: Any,
    name: str,
    logic: Callable[[OperatorInput], Any],
    notify: bool = True,
) -> None:
    """One input, no outputs; ``logic(input)`` at every scheduling."""
    builder = OperatorBuilder(name, stream.scope, notify=notify)
    inp = builder.new_input(stream, pact)
    builder.build(lambda caps: lambda frontiers: logic(inp))
