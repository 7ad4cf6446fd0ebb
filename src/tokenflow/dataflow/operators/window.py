"""Event-time windows built on timestamp tokens: ``tumbling`` and ``sliding``.

Source: the timestamp-tokens paper §5 (Lattuada, McSherry et al., 2022; the tumbling windowed
average: "the operator maintains
the current average for open windows … and a timestamp token to produce the output at the
timestamp of the next open window"; "the operator can use ordered data structures to
efficiently retire multiple windows at once, should the frontier advance suddenly").

Shapes and units:

- Times are ``int`` event-time units (the dataflow's own timestamps: a record's window is
  decided by the time of the message that carries it, not by a field of the record).
- A window is the half-open interval ``[start, start + size)``; starts are aligned to 0, so
  tumbling windows are ``[k*size, (k+1)*size)`` and sliding windows start at every multiple of
  ``slide`` (a time ``t`` belongs to every window ``[s, s + size)`` with ``s % slide == 0`` and
  ``s <= t < s + size``; the last of them starts at ``t - t % slide``, and for small ``t`` the
  first may start before 0, e.g. ``[-3, 3)`` for ``size=6, slide=3``).
- ``reduce(start, end, records)`` gets the window's records as a ``list`` (in arrival order on
  this worker; rows of Arrow batches as dicts) and returns an iterable of output records, which
  are sent at time ``end`` — the start of the next tumbling window, as in the paper.

Token discipline: the operator drops its initial token, keeps exactly one ``Capability`` per open
window (``ref.delayed(end)`` on the window's first data), and once the input frontier has passed
the window end (``not input.frontier.less_than(end)``) sends the window's output with that
token and drops it.  Windows are retired in order of their ends, many per invocation when the
frontier jumps.  Windows that received no data hold no token and produce nothing.

Both operators use the pipeline pact: each worker windows the records it holds.  Exchange by
key beforehand (``stream.exchange(key)``) when a window's records must meet on one worker.

State: the open windows (``window end -> records``) live in a declared ``LocalState``
(``open_windows``; Megaphone, Hoffmann et al., VLDB 2019: state the system can snapshot and
move), worker-local since the pact is: a snapshot holds each worker's windows under its home
bin; a job restored at another worker count loads them on the owner of that bin, merging the
windows of several old workers (records concatenated), and re-mints one token per window end
(``pending_times()``) from the initial token.  The tokens themselves are not state.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tokenflow.dataflow.capability import Capability
from tokenflow.dataflow.operators.builder import OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.generic import OperatorInfo, unary_frontier
from tokenflow.dataflow.state import LocalState

if TYPE_CHECKING:
    from tokenflow.dataflow.stream import Stream

Reduce = Callable[[int, int, list[Any]], Iterable[Any]]
"""``reduce(start, end, records) -> iterable of output records`` for one closed window."""


def rows(batch: Any) -> list[Any]:
    """A batch's records as a list (``list`` batches as is, Arrow batches as row dicts)."""
    if isinstance(batch, list):
        return batch
    to_pylist = getattr(batch, "to_pylist", None)
    if to_pylist is not None:
        return to_pylist()  # type: ignore[no-any-return]
    return list(batch)


def check_int_time(time: Any, name: str) -> int:
    """Return ``time`` if it is an ``int``, else raise a ``TypeError`` naming operator ``name``.

    Raises:
        TypeError: for non-integer times (e.g. ``Product`` times inside an iterative scope).
    """
    if type(time) is not int:
        raise TypeError(
            f"operator {name!r}: event-time windows need int times, got {time!r} "
            f"({type(time).__name__}); use them outside iterative scopes"
        )
    return time


def call_reduce(reduce: Reduce, start: int, end: int, records: list[Any], name: str) -> list[Any]:
    """``list(reduce(start, end, records))`` with a clear error when reduce returns None."""
    result = reduce(start, end, records)
    if result is None:
        raise TypeError(
            f"operator {name!r}: reduce({start}, {end}, records) returned None; it must return "
            "an iterable of output records (e.g. a list, possibly empty)"
        )
    return result if isinstance(result, list) else list(result)


def check_window_sizes(size: int, slide: int, name: str) -> None:
    """Validate window parameters for operator ``name``.

    Raises:
        TypeError: when ``size`` or ``slide`` is not an int.
        ValueError: when ``size <= 0``, ``slide <= 0`` or ``slide > size``.
    """
    for label, value in (("size", size), ("slide", slide)):
        if type(value) is not int:
            raise TypeError(f"operator {name!r}: window {label} must be an int, got {value!r}")
        if value <= 0:
            raise ValueError(f"operator {name!r}: window {label} must be > 0, got {value}")
    if slide > size:
        raise ValueError(
            f"operator {name!r}: slide {slide} is larger than size {size} (windows would "
            "leave gaps; use slide <= size)"
        )


Windows = dict[int, list[Any]]
"""Open windows of one worker: window end -> its records, in arrival order."""


def merge_windows(into: Windows, other: Windows) -> Windows:
    """``into`` with ``other``'s windows added: the union of the windows, the records of a
    window both hold concatenated (``into``'s first).  ``other`` is not changed."""
    for end, records in other.items():
        held = into.get(end)
        if held is None:
            into[end] = list(records)
        else:
            held.extend(records)
    return into


def open_windows(tokens: bool = True) -> LocalState[Windows]:
    """A worker-local ``LocalState`` of open windows (``value``: ``Windows``), merged with
    ``merge_windows``; ``pending_times()`` are the window ends when the operator holds one
    token per open window (``tokens``), else none.  Empty: nothing is exported."""
    return LocalState(dict, merge_windows, times=(lambda w: w.keys()) if tokens else None,
                      empty=lambda w: not w)


def _windowed(stream: Stream, size: int, slide: int, reduce: Reduce, name: str) -> Stream:
    """The shared operator: windows ``[s, s + size)`` for every multiple ``s`` of ``slide``."""
    check_window_sizes(size, slide, name)

    def constructor(capability: Capability, info: OperatorInfo) -> Any:
        state = info.state("windows", open_windows())
        windows: Windows = state.value  # window end -> records (restored ones included)
        # One token per open window, at its end (paper §5); ends also in a heap, to retire
        # them in order.  A restored state's windows get theirs from the initial token.
        tokens: dict[int, Capability] = {end: capability.delayed(end) for end in windows}
        ends: list[int] = sorted(tokens)
        capability.drop()  # no output unprompted: only windows with data hold tokens

        def logic(input: OperatorInput, output: OperatorOutput) -> None:
            for ref, batch in input:
                t = check_int_time(ref.time, name)
                records = rows(batch)
                start = t - t % slide  # the last window containing t
                while start > t - size:
                    end = start + size
                    window = windows.get(end)
                    if window is None:
                        # First data of this window: keep a token at its end (paper §5).
                        windows[end] = list(records)
                        tokens[end] = ref.delayed(end)
                        heapq.heappush(ends, end)
                    else:
                        window.extend(records)
                    start -= slide
            frontier = input.frontier
            while ends and not frontier.less_than(ends[0]):
                end = heapq.heappop(ends)
                cap = tokens.pop(end)
                out = call_reduce(reduce, end - size, end, windows.pop(end), name)
                if out:
                    output.give_batch(cap, out)
                cap.drop()

        return logic

    return unary_frontier(stream, "pipeline", name, constructor)


def tumbling(stream: Stream, size: int, reduce: Reduce, name: str = "Tumbling") -> Stream:
    """Tumbling event-time windows ``[k*size, (k+1)*size)``, reduced at their ends.

    Each record of ``stream`` belongs to the window containing its message time.  Once the
    input frontier passes a window's end, ``reduce(start, end, records)`` is called with the
    window's records (a ``list``, this worker's only; arrival order) and its results are sent
    at time ``end``.  Windows without data produce nothing and hold no token.  Pipeline pact:
    exchange by key beforehand to gather a key's records on one worker.

    Args:
        stream: a stream with ``int`` times (event-time units).
        size: the window length in time units (> 0).
        reduce: ``(start, end, records) -> iterable`` of output records.
        name: the operator's name.

    Returns:
        The stream of ``reduce`` outputs, each at its window's end time.

    Raises:
        ValueError: when ``size <= 0``.
        TypeError: when ``size`` is not an int; at run time when a message time is not an int
            or ``reduce`` returns None.

    Source: the timestamp-tokens paper §5 (tumbling windowed average).
    """
    check_window_sizes(size, size, name)
    return _windowed(stream, size, size, reduce, name)


def sliding(
    stream: Stream, size: int, slide: int, reduce: Reduce, name: str = "Sliding"
) -> Stream:
    """Sliding event-time windows ``[s, s + size)`` for every multiple ``s`` of ``slide``.

    A record at time ``t`` belongs to every such window containing ``t`` (``size / slide`` of
    them when ``slide`` divides ``size``).  Each open window holds one token at its end; once the
    input frontier passes the end, ``reduce(start, end, records)`` runs and its results are sent
    at time ``end``.  ``sliding(s, n, n, f)`` equals ``tumbling(s, n, f)``.  Windows without data
    produce nothing.  Pipeline pact, as for ``tumbling``.

    Args:
        stream: a stream with ``int`` times (event-time units).
        size: the window length in time units (> 0).
        slide: the distance between window starts (0 < slide <= size).
        reduce: ``(start, end, records) -> iterable`` of output records.
        name: the operator's name.

    Returns:
        The stream of ``reduce`` outputs, each at its window's end time.

    Raises:
        ValueError: when ``size <= 0``, ``slide <= 0`` or ``slide > size``.
        TypeError: when ``size`` or ``slide`` is not an int; at run time when a message time
            is not an int or ``reduce`` returns None.

    Source: the timestamp-tokens paper §5 and §6.3 (windows with a continuous slide).
    """
    return _windowed(stream, size, slide, reduce, name)
