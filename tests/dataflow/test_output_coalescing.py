"""Small batches given within one invocation travel as one message, in order.

``OperatorOutput`` coalesces consecutive ``RecordBatch``es of the same time and schema, each
under ``COALESCE_ROWS`` rows, and consecutive small ``list`` batches of the same time;
anything else (another time, another schema, the other kind of batch, a large batch, the end
of the invocation) sends what is pending first.  Outside an invocation (an ``InputHandle``)
every batch is its own message.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tokenflow.dataflow.operators.builder import COALESCE_ROWS
from tokenflow.dataflow.operators.capture import Capture
from tokenflow.dataflow.operators.generic import unary
from tokenflow.dataflow.routing import column_routes
from tokenflow.execute import execute
from tokenflow.state.bins import RoutingTable
from tokenflow.worker import Worker


def xs(values: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, pa.int64())], ["x"])


BIG = xs(list(range(COALESCE_ROWS)))


def emit_sequence(cap: Any, info: Any) -> Any:
    """For each input message at ``t``: three small ``x`` batches at ``t``, two list batches,
    a ``y`` batch, two ``x`` batches at ``t + 1``, a batch of ``COALESCE_ROWS`` rows at
    ``t + 1``, one more ``x`` batch at ``t + 1``, then list batches at ``t + 1``, ``t`` and
    ``t`` (the last left pending until the invocation ends)."""
    cap.drop()

    def logic(inp: Any, out: Any) -> None:
        for ref, _batch in inp:
            t = ref.time
            for start in (0, 3, 6):
                out.give_batch(ref, xs([start, start + 1, start + 2]))
            given = ["list record"]
            out.give_batch(ref, given)
            given.append("appended after giving")  # the output keeps its own copy
            out.give_batch(ref, ["second", "list"])
            out.give_batch(ref, pa.record_batch([pa.array(["a", "b"])], ["y"]))
            out.give_batch(ref, xs([10]), time=t + 1)
            out.give_batch(ref, xs([11, 12]), time=t + 1)
            out.give_batch(ref, BIG, time=t + 1)
            out.give_batch(ref, xs([13]), time=t + 1)
            out.give_batch(ref, ["at t+1"], time=t + 1)
            out.give_batch(ref, ["back at t"])
            out.give_batch(ref, ["still t"])

    return logic


def plain(batch: Any) -> Any:
    return batch.to_pydict() if isinstance(batch, pa.RecordBatch) else batch


def emitted(constructor: Any) -> list[tuple[int, Any]]:
    """The ``(time, batch)`` messages a ``unary`` operator built by ``constructor`` sends on one
    worker when it is given a single input message at time 0."""

    def job(worker: Worker) -> list[tuple[int, Any]]:
        def build(scope: Any) -> tuple[Any, Capture]:
            inp, stream = scope.new_input()
            return inp, unary(stream, "pipeline", "Emit", constructor).capture()

        inp, cap = worker.dataflow(build)
        inp.send_batch(["go"])
        inp.close()
        worker.step_until_done()
        return [(t, b) for t, b in cap.events]

    (events,) = execute(job, workers=1)
    return events


def test_one_message_per_run_of_small_batches_in_order() -> None:
    events = emitted(emit_sequence)
    assert [(t, plain(b)) for t, b in events] == [
        (0, {"x": list(range(9))}),           # three batches, one message
        (0, ["list record", "second", "list"]),  # list batches: one message, after them
        (0, {"y": ["a", "b"]}),                # another schema: its own message
        (1, {"x": [10, 11, 12]}),              # another time: a new run
        (1, {"x": list(range(COALESCE_ROWS))}),  # a large batch goes as it is, after the run
        (1, {"x": [13]}),                      # a list batch sends the pending run first
        (1, ["at t+1"]),                       # another time: a new list message
        (0, ["back at t", "still t"]),         # pending at the end of the invocation: sent
    ]
    assert events[4][1] is BIG  # not copied


def test_input_handle_batches_are_not_coalesced() -> None:
    def job(worker: Worker) -> list[int]:
        def build(scope: Any) -> tuple[Any, Capture]:
            inp, stream = scope.new_input()
            return inp, stream.capture()

        inp, cap = worker.dataflow(build)
        for start in (0, 2, 4):
            inp.send_batch(xs([start, start + 1]))
        inp.close()
        worker.step_until_done()
        return [b.num_rows for _, b in cap.events]

    assert execute(job, workers=1) == [[2, 2, 2]]


@pytest.mark.parametrize("workers", [2, 3])
def test_coalesced_exchange_keeps_every_row_once(workers: int) -> None:
    """Many one-row batches per invocation, exchanged by column: every row arrives once, on
    the worker of its key, in fewer messages than batches."""
    rows_per_worker = 500

    def split_rows(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, batch in inp:
                for i in range(batch.num_rows):
                    out.give_batch(ref, batch.slice(i, 1))

        return logic

    def job(worker: Worker) -> tuple[list[int], int]:
        def build(scope: Any) -> tuple[Any, Capture]:
            inp, stream = scope.new_input()
            ones = unary(stream, "pipeline", "Split", split_rows)
            return inp, ones.exchange(column="x").capture()

        inp, cap = worker.dataflow(build)
        base = worker.index * rows_per_worker
        inp.send_batch(xs(list(range(base, base + rows_per_worker))))
        inp.close()
        worker.step_until_done()
        values = [v for _, b in cap.events for v in b.column("x").to_pylist()]
        return values, len(cap.events)

    results = execute(job, workers=workers)
    everything = sorted(v for values, _ in results for v in values)
    assert everything == list(range(workers * rows_per_worker))
    for w, (values, messages) in enumerate(results):
        table = RoutingTable.even(workers)
        assert column_routes(pa.array(values, pa.int64()), table).tolist() == [w] * len(values)
        assert messages < len(values)  # coalesced: not one message per row


def test_large_list_batches_pass_uncopied_and_runs_stop_at_the_limit() -> None:
    """A list of ``COALESCE_ROWS`` records is its own message, the very object given; small
    lists are sent once ``COALESCE_ROWS`` records are pending."""
    big = list(range(COALESCE_ROWS))
    half = COALESCE_ROWS // 2

    def emit(cap: Any, info: Any) -> Any:
        cap.drop()

        def logic(inp: Any, out: Any) -> None:
            for ref, _batch in inp:
                out.give_batch(ref, [-1])
                out.give_batch(ref, big)
                for _ in range(3):
                    out.give_batch(ref, list(range(half)))

        return logic

    batches = [b for _, b in emitted(emit)]
    assert [len(b) for b in batches] == [1, COALESCE_ROWS, COALESCE_ROWS, half]
    assert batches[1] is big
    assert batches[2] == list(range(half)) * 2
