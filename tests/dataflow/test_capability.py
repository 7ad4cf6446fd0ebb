"""Timestamp tokens: misuse raises ``CapabilityError`` naming operator and times; the token
life-cycle (retain / downgrade / copy / drop / garbage collection) shows in downstream frontiers;
``CapabilitySet`` semantics.

Source: the timestamp-tokens paper §3-§4 (Lattuada, McSherry et al., 2022), docs/ARCHITECTURE.md
("Timestamp tokens in Python").  Dataflows run on one ``Worker`` over a ``ThreadFabric(1)`` stepped
from the test thread, so an error raised by operator logic comes out of ``worker.step()``.
"""

from __future__ import annotations

import gc
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tokenflow.comm.thread import ThreadFabric
from tokenflow.dataflow.capability import Capability, CapabilityError, CapabilityRef, CapabilitySet
from tokenflow.dataflow.input import InputHandle
from tokenflow.dataflow.operators.builder import OperatorBuilder, OperatorInput, OperatorOutput
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import OperatorInfo, source, unary
from tokenflow.dataflow.operators.probe import ProbeHandle
from tokenflow.dataflow.scope import Scope
from tokenflow.dataflow.stream import Stream
from tokenflow.order import Product
from tokenflow.progress.change_batch import ChangeBatch
from tokenflow.worker import Worker

Logic = Callable[[OperatorInput, OperatorOutput], None]


def new_worker() -> Worker:
    return Worker(ThreadFabric(1).allocator(0))


def settle(worker: Worker, rounds: int = 30) -> bool:
    """Step ``rounds`` times; returns whether the worker is still running."""
    running = True
    for _ in range(rounds):
        running = worker.step()
    return running


def names(pattern_parts: list[str]) -> str:
    """A regex requiring every part, in this order, in the message."""
    return ".*".join(re.escape(p) for p in pattern_parts)


def collect(errors: list[str], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn``, which must raise ``CapabilityError``; append the error's message (not the
    exception: its traceback would keep the frames' tokens alive)."""
    try:
        fn(*args, **kwargs)
    except CapabilityError as exc:
        errors.append(str(exc))
    else:
        errors.append(f"no error from {fn!r}")


def mentions(message: str, *parts: str) -> bool:
    """True when every part occurs in ``message`` (in any order)."""
    return all(p in message for p in parts)


def run_unary(logic_factory: Callable[[Capability, OperatorInfo], Logic], name: str,
              epochs: list[tuple[int, list[Any]]], close: bool = True
              ) -> tuple[Worker, InputHandle]:
    """Input -> unary ``name`` on one worker; sends ``records`` at each ``epoch``, stepping
    after each epoch (errors from the operator propagate)."""
    worker = new_worker()

    def build(scope: Scope) -> InputHandle:
        inp, stream = scope.new_input("In")
        unary(stream, "pipeline", name, logic_factory).capture()
        return inp

    inp = worker.dataflow(build)
    for epoch, records in epochs:
        inp.advance_to(epoch)
        for r in records:
            inp.send(r)
        inp.flush()
        settle(worker, 3)
    if close:
        inp.close()
    return worker, inp


# -- misuse --------------------------------------------------------------------------------------


def test_downgrade_to_an_earlier_time() -> None:
    seen: list[str] = []

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.downgrade(5)
        with pytest.raises(CapabilityError) as exc:
            cap.downgrade(3)
        seen.append(str(exc.value))
        assert cap.time == 5  # unchanged by the failed downgrade
        cap.drop()
        return lambda inp, out: None

    worker, _ = run_unary(ctor, "Backwards", [])
    assert not settle(worker)
    assert re.search(names(["Backwards", "5", "3"]), seen[0]), seen[0]


def test_downgrade_backwards_inside_logic_propagates_from_step() -> None:
    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, _ in inp:
                held = ref.retain()
                held.downgrade(ref.time - 1)

        return logic

    with pytest.raises(CapabilityError, match=names(["Late", "downgrade", "4", "3"])):
        run_unary(ctor, "Late", [(4, ["x"])])


def test_downgrade_to_an_incomparable_product_time() -> None:
    seen: list[str] = []

    def build(scope: Scope) -> None:
        def inner(sub: Scope) -> None:
            def ctor(cap: Capability, info: OperatorInfo) -> Callable[[OperatorOutput], None]:
                assert cap.time == Product(0, 0)
                cap.downgrade(Product(1, 0))
                with pytest.raises(CapabilityError) as exc:
                    cap.downgrade(Product(0, 1))
                seen.append(str(exc.value))
                with pytest.raises(CapabilityError):
                    cap.delayed(Product(0, 5))  # incomparable too
                cap.downgrade(Product(1, 1))  # comparable: fine
                assert cap.time == Product(1, 1)
                cap.drop()
                return lambda out: None

            source(sub, "Sideways", ctor)

        scope.iterative(inner)

    worker = new_worker()
    worker.dataflow(build)
    assert not settle(worker)
    assert re.search(names(["Sideways", "(1, 0)", "(0, 1)"]), seen[0]), seen[0]


def test_delayed_backwards() -> None:
    errors: list[str] = []  # messages: a kept exception would keep its frames' tokens alive

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, _ in inp:
                collect(errors, ref.delayed, 2)
                held = ref.retain()
                collect(errors, held.delayed, 2)
                held.drop()

        return logic

    worker, _ = run_unary(ctor, "Delayer", [(6, ["x"])])
    assert not settle(worker)
    assert len(errors) == 2
    for message in errors:
        assert re.search(names(["Delayer", "6", "2"]), message), message


def _two_output_dataflow(logic_for: Callable[[OperatorInput, OperatorOutput, OperatorOutput,
                                              list[Capability]], None]) -> Worker:
    worker = new_worker()

    def build(scope: Scope) -> InputHandle:
        inp, stream = scope.new_input("In")
        builder = OperatorBuilder("TwoOut", scope)
        data = builder.new_input(stream, "pipeline")
        out0, s0 = builder.new_output()
        out1, s1 = builder.new_output()
        s0.capture()
        s1.capture()

        def constructor(caps: list[Capability]) -> Callable[[Any], None]:
            held = list(caps)
            return lambda frontiers: logic_for(data, out0, out1, held)

        builder.build(constructor)
        return inp

    inp = worker.dataflow(build)
    inp.advance_to(2)
    inp.send("x")
    inp.close()
    return worker


def test_session_with_another_output_ports_token() -> None:
    def logic(data: OperatorInput, out0: OperatorOutput, out1: OperatorOutput,
              caps: list[Capability]) -> None:
        for ref, _ in data:
            for1 = ref.retain_for_output(1)
            out1.session(for1).give("fine")  # right port
            out0.session(for1).give("wrong")  # raises

    worker = _two_output_dataflow(logic)
    with pytest.raises(CapabilityError, match=names(["TwoOut", "output 0", "output 1", "2"])):
        settle(worker)


def test_initial_token_of_other_port_is_rejected() -> None:
    def logic(data: OperatorInput, out0: OperatorOutput, out1: OperatorOutput,
              caps: list[Capability]) -> None:
        out1.give_batch(caps[0], ["wrong"])

    worker = _two_output_dataflow(logic)
    with pytest.raises(CapabilityError, match=names(["TwoOut", "output 1", "output 0", "0"])):
        settle(worker)


def test_session_with_another_operators_token() -> None:
    stolen: list[Capability] = []

    def owner(cap: Capability, info: OperatorInfo) -> Logic:
        cap.downgrade(7)
        stolen.append(cap)  # kept, not dropped: still valid
        return lambda inp, out: None

    def thief(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for _ref, batch in inp:
                out.session(stolen[0]).give_iterator(batch)

        return logic

    worker = new_worker()

    def build(scope: Scope) -> InputHandle:
        inp, stream = scope.new_input("In")
        unary(stream, "pipeline", "Owner", owner)
        unary(stream, "pipeline", "Thief", thief).capture()
        return inp

    inp = worker.dataflow(build)
    inp.send("x")
    inp.flush()
    with pytest.raises(CapabilityError, match=names(["Thief", "Owner", "7"])):
        settle(worker)
    assert stolen[0].valid


def test_capability_ref_used_after_its_invocation() -> None:
    stash: list[CapabilityRef] = []
    errors: list[str] = []

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, batch in inp:
                if not stash:
                    stash.append(ref)
                    assert ref.valid
                    out.session(ref).give_iterator(batch)  # fine during its invocation
                    continue
                old = stash[0]
                assert not old.valid
                collect(errors, old.retain)
                collect(errors, out.session, old)
                collect(errors, out.give_batch, old, ["late"])
                collect(errors, getattr, old, "time")
                collect(errors, old.delayed, 9)
                out.session(ref).give_iterator(batch)

        return logic

    worker, _ = run_unary(ctor, "Stash", [(3, ["a"]), (4, ["b"])])
    assert not settle(worker)
    assert len(errors) == 5
    for message in errors:
        assert re.search(names(["Stash", "CapabilityRef", "3", "after"]), message), message


def test_output_at_a_time_no_held_token_covers() -> None:
    errors: list[str] = []

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, _ in inp:
                later = ref.delayed(7)
                out.session(later, time=9).give("ok")  # later than the token: covered
                collect(errors, out.session, later, time=5)
                collect(errors, out.session, ref, time=2)
                collect(errors, out.give_batch, later, ["x"], time=6)
                later.drop()

        return logic

    worker, _ = run_unary(ctor, "Early", [(4, ["x"])])
    assert not settle(worker)
    assert len(errors) == 3
    assert re.search(names(["Early", "5", "7"]), errors[0]), errors[0]
    assert re.search(names(["Early", "4", "2"]), errors[1]), errors[1]
    assert re.search(names(["Early", "6", "7"]), errors[2]), errors[2]


def test_dropped_capability_used_for_a_session() -> None:
    errors: list[str] = []

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()
        cap.drop()  # idempotent
        collect(errors, cap.downgrade, 1)
        collect(errors, cap.delayed, 1)
        collect(errors, cap.copy)
        collect(errors, getattr, cap, "time")

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, _ in inp:
                held = ref.retain()
                held.drop()
                assert not held.valid
                collect(errors, out.session, held)
                collect(errors, out.give_batch, held, ["x"])

        return logic

    worker, _ = run_unary(ctor, "Dropper", [(8, ["x"])])
    assert not settle(worker)
    assert len(errors) == 6
    for message in errors[:4]:
        assert mentions(message, "Dropper", "0", "drop"), message
    for message in errors[4:]:
        assert re.search(names(["Dropper", "dropped", "8"]), message), message


def test_input_handle_advance_backwards_and_use_after_close() -> None:
    worker = new_worker()
    inp = worker.dataflow(lambda scope: scope.new_input("Feed")[0])
    inp.advance_to(3)
    with pytest.raises(CapabilityError, match=names(["Feed", "3", "1"])):
        inp.advance_to(1)
    assert inp.time == 3
    inp.close()
    assert inp.closed
    for use in (lambda: inp.advance_to(4), lambda: inp.send_batch(["x"]), lambda: inp.time):
        with pytest.raises(CapabilityError, match="Feed.*closed"):
            use()
    inp.close()  # idempotent
    assert not settle(worker)


def test_input_handle_send_after_close_raises() -> None:
    worker = new_worker()
    inp = worker.dataflow(lambda scope: scope.new_input("Feed")[0])
    inp.close()
    with pytest.raises(CapabilityError, match="Feed.*closed"):
        inp.send("x")


# -- life-cycle seen downstream ----------------------------------------------------------------


class Holder:
    """An operator holding tokens on command from worker code (``commands`` run at its next
    invocation); it keeps what it retains in ``held``."""

    def __init__(self) -> None:
        self.held: dict[str, Capability] = {}
        self.commands: list[Callable[[Holder, OperatorOutput], None]] = []
        self.activate: Callable[[], None] = lambda: None
        self.invocations = 0

    def constructor(self, cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()
        self.activate = info.activate

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            self.invocations += 1
            for ref, batch in inp:
                if "main" not in self.held:
                    self.held["main"] = ref.retain()
                out.session(ref).give_iterator(batch)
            while self.commands:
                self.commands.pop(0)(self, out)

        return logic

    def run(self, worker: Worker, command: Callable[[Holder, OperatorOutput], None]) -> None:
        self.commands.append(command)
        self.activate()
        settle(worker, 5)


def holder_dataflow() -> tuple[Worker, InputHandle, Holder, ProbeHandle, Capture]:
    worker = new_worker()
    holder = Holder()

    def build(scope: Scope) -> tuple[InputHandle, ProbeHandle, Capture]:
        inp, stream = scope.new_input("In")
        held: Stream = unary(stream, "pipeline", "Holder", holder.constructor)
        return inp, held.probe(), held.capture()

    inp, probe, cap = worker.dataflow(build)
    return worker, inp, holder, probe, cap


def test_retain_downgrade_copy_drop_shape_the_downstream_frontier() -> None:
    worker, inp, holder, probe, cap = holder_dataflow()
    inp.send("a")  # epoch 0: the holder retains a token at 0
    inp.advance_to(10)
    inp.close()
    settle(worker, 5)
    assert probe.with_frontier() == [0]
    assert cap.frontiers[-1] == [0]

    holder.run(worker, lambda h, out: h.held["main"].downgrade(3))
    assert probe.with_frontier() == [3]

    def to_five(h: Holder, out: OperatorOutput) -> None:
        h.held["main"].downgrade(5)
        out.session(h.held["main"]).give("at5")

    holder.run(worker, to_five)
    assert probe.with_frontier() == [5]
    assert probe.less_than(6) and probe.less_equal(5) and not probe.less_than(5)
    assert (5, ["at5"]) in cap.events

    def copy_and_delay(h: Holder, out: OperatorOutput) -> None:
        h.held["copy"] = h.held["main"].copy()
        h.held["seven"] = h.held["main"].delayed(7)

    holder.run(worker, copy_and_delay)
    assert probe.with_frontier() == [5]

    holder.run(worker, lambda h, out: h.held.pop("main").drop())
    assert probe.with_frontier() == [5]  # the copy still holds 5
    assert probe.less_than(6)

    holder.run(worker, lambda h, out: h.held.pop("copy").drop())
    assert probe.with_frontier() == [7]
    assert not probe.less_than(6)

    holder.run(worker, lambda h, out: h.held.pop("seven").drop())
    assert probe.done()
    assert cap.done
    assert not settle(worker)
    assert cap.by_time() == {0: ["a"], 5: ["at5"]}


def test_tokens_released_by_reference_counting_inside_an_invocation() -> None:
    worker, inp, holder, probe, cap = holder_dataflow()
    inp.send("a")
    inp.close()
    settle(worker, 5)
    assert probe.with_frontier() == [0]
    holder.run(worker, lambda h, out: h.held.clear())  # no drop(): the last reference goes
    assert probe.done()
    assert not settle(worker)


@pytest.mark.parametrize("cycle", [False, True])
def test_garbage_collected_capability_is_released(cycle: bool) -> None:
    """A token that is never dropped is released when it is garbage collected, even outside
    any invocation of its operator, and the dataflow then completes."""
    worker, inp, holder, probe, cap = holder_dataflow()
    inp.send("a")
    inp.close()
    settle(worker, 5)
    assert probe.with_frontier() == [0]
    token = holder.held.pop("main")
    if cycle:
        box: dict[str, Any] = {"token": token}
        box["self"] = box  # only the cycle collector can free it
        del box
    del token
    gc.collect()
    assert not settle(worker, 10)
    assert probe.done()
    assert cap.done


class OwnerCheckedBatch(ChangeBatch[Any]):
    """A ``ChangeBatch`` that records the thread of every call that changes its list directly."""

    __slots__ = ("writers",)

    def __init__(self) -> None:
        super().__init__()
        self.writers: list[int] = []

    def update(self, key: Any, diff: int) -> None:
        self.writers.append(threading.get_ident())
        super().update(key, diff)

    def extend(self, updates: Any) -> None:
        self.writers.append(threading.get_ident())
        super().extend(updates)


def collect_on_another_thread() -> int:
    """Run the cycle collector on a new thread (as a peer worker's allocation would on the
    ``thread`` runtime); returns that thread's id."""
    ident: list[int] = []

    def run() -> None:
        ident.append(threading.get_ident())
        gc.collect()

    thread = threading.Thread(target=run, name="other-worker")
    thread.start()
    thread.join()
    return ident[0]


def test_capability_collected_on_another_thread_defers_its_release() -> None:
    """``__del__`` on a thread other than the owner's leaves the owner's batch alone, queues the
    release and asks for the operator to run; the owner's next read applies the release."""
    internal = OwnerCheckedBatch()
    woken: list[int] = []
    owner = threading.get_ident()
    kept = Capability(1, internal, 0, "Op", lambda: woken.append(threading.get_ident()))
    gc.disable()  # no collection on this thread until the other thread has run one
    try:
        box: dict[str, Any] = {"caps": [kept.copy(), kept.delayed(2), kept.delayed(3)]}
        box["self"] = box  # only the cycle collector can free the three tokens
        del box
        woken.clear()
        collector = collect_on_another_thread()
    finally:
        gc.enable()
    assert collector != owner
    assert set(internal.writers) == {owner}  # the collecting thread never touched the list
    assert woken == [collector] * 3  # every release asks for the operator to be scheduled
    reported: ChangeBatch[Any] = ChangeBatch()
    internal.drain_into(reported)  # what ``OperatorCore.schedule`` does after an invocation
    assert counts(reported) == {1: 1}  # three +1 and three -1 cancel; ``kept`` remains
    assert internal.is_empty()
    kept.drop()  # on the owner's thread: applied at once
    assert counts(internal) == {1: -1}


def test_capability_collected_on_another_thread_is_reported() -> None:
    """A token of a running dataflow collected on another thread: the queued release activates
    its operator, whose next invocation reports it, and the dataflow completes."""
    worker, inp, holder, probe, cap = holder_dataflow()
    inp.send("a")
    inp.close()
    settle(worker, 5)
    assert probe.with_frontier() == [0]
    invocations = holder.invocations
    gc.disable()
    try:
        box: dict[str, Any] = {"token": holder.held.pop("main")}
        box["self"] = box
        del box
        collect_on_another_thread()
    finally:
        gc.enable()
    assert probe.with_frontier() == [0]  # nothing is reported before the owner steps
    assert not settle(worker, 10)
    assert holder.invocations > invocations  # scheduled because the release activated it
    assert probe.done()
    assert cap.done


def test_source_token_held_until_dropped() -> None:
    worker = new_worker()
    state: dict[str, Any] = {}

    def ctor(cap: Capability, info: OperatorInfo) -> Callable[[OperatorOutput], None]:
        state["cap"] = cap
        state["activate"] = info.activate

        def logic(out: OperatorOutput) -> None:
            c = state.get("cap")
            if c is None:
                return
            n = state.setdefault("n", 0)
            out.session(c).give(n)
            state["n"] = n + 1
            if n < 3:
                c.downgrade(c.time + 2)
                info.activate()
            else:
                c.drop()
                state.pop("cap")

        return logic

    def build(scope: Scope) -> tuple[ProbeHandle, Capture]:
        stream = source(scope, "Counter", ctor)
        return stream.probe(), stream.capture()

    probe, cap = worker.dataflow(build)
    assert not settle(worker)
    assert cap.by_time() == {0: [0], 2: [1], 4: [2], 6: [3]}
    assert probe.done()


# -- CapabilitySet ------------------------------------------------------------------------------


def counts(batch: ChangeBatch[Any]) -> dict[Any, int]:
    return dict(batch.iter())


def test_capability_set_insert_keeps_minimal_tokens() -> None:
    internal: ChangeBatch[Any] = ChangeBatch()

    def cap(a: int, b: int) -> Capability:
        return Capability(Product(a, b), internal, 0, "SetOp")

    s = CapabilitySet()
    a, b = cap(1, 2), cap(2, 1)
    s.insert(a)
    s.insert(b)
    assert sorted(s.times()) == [Product(1, 2), Product(2, 1)]
    dominated = cap(2, 2)
    s.insert(dominated)  # >= (1, 2): dropped, the set is unchanged
    assert not dominated.valid
    assert sorted(s.times()) == [Product(1, 2), Product(2, 1)]
    s.insert(cap(0, 3))  # incomparable to both: kept
    assert sorted(s.times()) == [Product(0, 3), Product(1, 2), Product(2, 1)]
    s.insert(cap(1, 1))  # <= (1, 2) and (2, 1): those are dropped
    assert not a.valid and not b.valid
    assert sorted(s.times()) == [Product(0, 3), Product(1, 1)]
    assert len(s) == 2
    # The bookkeeping holds exactly one count per held token.
    assert counts(internal) == {Product(0, 3): 1, Product(1, 1): 1}


def test_capability_set_downgrade_and_delayed() -> None:
    internal: ChangeBatch[Any] = ChangeBatch()
    s = CapabilitySet([Capability(Product(0, 3), internal, 0, "SetOp"),
                       Capability(Product(1, 1), internal, 0, "SetOp")])
    minted = s.delayed(Product(4, 4))
    assert minted.time == Product(4, 4)
    with pytest.raises(CapabilityError, match=re.escape("(0, 0)")):
        s.delayed(Product(0, 0))
    minted.drop()
    s.downgrade([Product(1, 4), Product(2, 1)])
    assert sorted(s.times()) == [Product(1, 4), Product(2, 1)]
    assert counts(internal) == {Product(1, 4): 1, Product(2, 1): 1}
    with pytest.raises(CapabilityError, match=re.escape("(0, 5)")):
        s.downgrade([Product(0, 5)])  # not >= any held token
    assert sorted(s.times()) == [Product(1, 4), Product(2, 1)]  # unchanged on error
    assert counts(internal) == {Product(1, 4): 1, Product(2, 1): 1}
    s.downgrade([Product(3, 3), Product(3, 5)])  # (3, 5) >= (3, 3): only (3, 3) kept
    assert s.times() == [Product(3, 3)]
    assert counts(internal) == {Product(3, 3): 1}
    first = s.first()
    assert first is not None and first.time == Product(3, 3)
    s.downgrade([])
    assert s.is_empty() and s.first() is None
    assert counts(internal) == {}


def test_capability_set_clear_and_iteration() -> None:
    internal: ChangeBatch[Any] = ChangeBatch()
    s = CapabilitySet(Capability(t, internal, 0, "SetOp") for t in (5, 3, 4))
    assert s.times() == [3]  # ints are totally ordered: only the least survives
    assert [c.time for c in s] == [3]
    assert counts(internal) == {3: 1}
    s.clear()
    assert s.is_empty() and counts(internal) == {}


def test_capability_copy_and_bookkeeping() -> None:
    internal: ChangeBatch[Any] = ChangeBatch()
    c = Capability(2, internal, 1, "Op")
    assert (c.time, c.port, c.operator) == (2, 1, "Op")
    d = c.copy()
    e = c.delayed(5)
    assert counts(internal) == {2: 2, 5: 1}
    c.downgrade(4)
    assert counts(internal) == {2: 1, 4: 1, 5: 1}
    c.downgrade(4)  # same time: no change
    assert counts(internal) == {2: 1, 4: 1, 5: 1}
    for x in (c, d, e):
        x.drop()
    assert counts(internal) == {}
    assert "dropped" in repr(c)


def test_token_times_are_the_operators_tokens_not_the_sources() -> None:
    """``Worker.token_times``: every time (not only the least) at which an operator holds a
    token, at or after the bound; the input's own token is left out."""
    held: list[Capability] = []

    def ctor(cap: Capability, info: OperatorInfo) -> Logic:
        cap.drop()

        def logic(inp: OperatorInput, out: OperatorOutput) -> None:
            for ref, _ in inp:
                held.extend(ref.delayed(t) for t in (10, 15, 20))

        return logic

    worker, inp = run_unary(ctor, "Windows", [(4, ["x"])], close=False)
    inp.advance_to(6)
    settle(worker, 3)
    assert worker.token_times(0) == {10, 15, 20}  # the input's token at 6 is not one
    assert worker.token_times(15) == {15, 20}
    for cap in held[:2]:
        cap.drop()
    settle(worker, 3)
    assert worker.token_times(0) == {20}
    for cap in held[2:]:
        cap.drop()
    inp.close()
    settle(worker)
