"""Cold rescale of the library's stateful operators through the control plane: a job fed by
``InputHandle`` loops runs tumbling and sliding windows, the keyed watermark window, a
``stateful_unary``, a ``state_machine`` and a ``stateful_binary``; it is snapshotted at an
epoch chosen by the control plane, stopped, and restored at another worker count.  Every
operator's output over both runs equals an uninterrupted run's.  (Reduces emit per record or
per key, so that the output does not depend on how records are spread over workers.)"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenflow import execute
from tokenflow.dataflow.input import JobStopped
from tokenflow.dataflow.operators.stateful import state_machine, stateful_binary, stateful_unary
from tokenflow.dataflow.operators.watermark import (
    assign_watermarks,
    strip_watermarks,
    tumbling_watermark,
)
from tokenflow.dataflow.operators.window import sliding, tumbling
from tokenflow.job import start

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

EPOCHS = 40
NAME = "tests.library-operators"
OPERATORS = 6
Record = tuple[int, int, int]  # (epoch, key, value)


def data(seed: int = 3) -> list[list[Record]]:
    rng = random.Random(seed)
    return [[(t, rng.randrange(9), rng.randrange(100)) for _ in range(rng.randrange(0, 12))]
            for t in range(EPOCHS)]


def every_record(start: int, end: int, rows: list[Record]) -> list[Any]:
    return [(start, end, r) for r in rows]


def key_sums(start: int, end: int, rows: list[Record]) -> list[Any]:
    sums: Counter[int] = Counter()
    for _, k, v in rows:
        sums[k] += v
    return sorted((start, end, k, s) for k, s in sums.items())


def running_sum(t: int, records: list[Record], state: Any, session: Any) -> None:
    for _, k, v in sorted(records):
        state[k] = state.get(k, 0) + v
        session.give((k, state[k]))


def joined_sums(t: int, left: list[Record], right: list[Record], state: Any, session: Any) -> None:
    """Per key, running sums of the values on each side (both sides' records of one time)."""
    for side, rows in ((0, left), (1, right)):
        for _, k, v in sorted(rows):
            sums = state.setdefault(k, [0, 0])
            sums[side] += v
    for k in sorted({r[1] for r in left} | {r[1] for r in right}):
        session.give((k, tuple(state[k])))


def build(scope: Any) -> tuple[Any, list[Any], list[Any]]:
    handle, stream = scope.new_input("records")
    keyed = stream.exchange(lambda r: r[1])
    outputs = [
        tumbling(stream, 5, every_record),
        sliding(stream, 6, 3, every_record),
        strip_watermarks(tumbling_watermark(assign_watermarks(stream), 5, key_sums,
                                            key=lambda r: r[1])),
        stateful_unary(keyed, running_sum, key=lambda r: r[1]),
        # a running count per key: its outputs do not depend on the arrival order of one
        # time's records (a running sum's intermediate values would)
        state_machine(stream.map(lambda r: (r[1], 1)),
                      lambda k, v, c: ((c or 0) + v, [(k, (c or 0) + v)])),
        stateful_binary(stream.filter(lambda r: r[2] % 2 == 0), stream.filter(lambda r: r[2] % 2 == 1),
                        joined_sums, key_left=lambda r: r[1], key_right=lambda r: r[1]),
    ]
    return handle, [o.probe() for o in outputs], [o.capture() for o in outputs]


def job_for(epochs: list[list[Record]], delay: float = 0.0) -> Any:
    def job(worker: Any) -> list[Counter[Any]]:
        handle, probes, captures = worker.dataflow(build)
        try:
            for t, rows in enumerate(epochs):
                handle.advance_to(t)
                mine = rows[worker.index::worker.peers]
                if mine:
                    handle.send_batch(mine)
                handle.advance_to(t + 1)
                worker.step_while(lambda e=t: any(p.less_than(e + 1) for p in probes))
                time.sleep(delay)
            handle.close()
            worker.step_while(lambda: not all(p.done() for p in probes))
        except JobStopped:
            pass  # snapshotted and stopped: return what was produced so far
        return [Counter((t, r) for t, batch in c.events for r in batch) for c in captures]

    return job


def merged(*runs: list[list[Counter[Any]]]) -> list[Counter[Any]]:
    out = [Counter() for _ in range(OPERATORS)]
    for results in runs:
        for per_operator in results:
            for i, counts in enumerate(per_operator):
                out[i].update(counts)
    return out


_EXPECTED: dict[int, list[Counter[Any]]] = {}


def expected(seed: int) -> list[Counter[Any]]:
    if seed not in _EXPECTED:
        _EXPECTED[seed] = merged(execute(job_for(data(seed)), workers=2, name=NAME))
    return _EXPECTED[seed]


def snapshot_and_restore(root: Path, seed: int, before: int, after: int, runtime: str,
                         wait: float, delay: float = 0.02, **options: Any) -> list[Counter[Any]]:
    handle = start(job_for(data(seed), delay=delay), workers=before, runtime=runtime, name=NAME,
                   **options)
    time.sleep(wait)
    handle.snapshot(str(root), timeout=120)
    first = handle.result(timeout=120)
    second = execute(job_for(data(seed)), workers=after, runtime=runtime, restore=str(root),
                     name=NAME, **options)
    return merged(first, second)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True)
@given(seed=st.integers(0, 3), before=st.integers(1, 3), after=st.integers(1, 4),
       wait=st.floats(0.0, 0.3))
def test_operators_restore_at_any_epoch_on_threads(tmp_path_factory: pytest.TempPathFactory,
                                                   seed: int, before: int, after: int,
                                                   wait: float) -> None:
    got = snapshot_and_restore(tmp_path_factory.mktemp("snap"), seed, before, after, "thread", wait)
    for operator, (mine, theirs) in enumerate(zip(got, expected(seed), strict=True)):
        assert mine == theirs, f"operator {operator}"


@pytest.mark.parametrize(("runtime", "before", "after"), [
    ("process", 2, 3), pytest.param("spark", 3, 2, marks=pytest.mark.spark),
])
def test_operators_restore_on_processes_and_spark(tmp_path: Path, runtime: str, before: int,
                                                  after: int, request: pytest.FixtureRequest) -> None:
    options: dict[str, Any] = {}
    if runtime == "spark":
        options["spark"] = request.getfixturevalue("spark")
    # 40 epochs of 0.1 s: the snapshot (requested 3 s after the start, process or Spark
    # start-up included) lands mid-run
    got = snapshot_and_restore(tmp_path, 1, before, after, runtime, 3.0, delay=0.1, **options)
    for operator, (mine, theirs) in enumerate(zip(got, expected(1), strict=True)):
        assert mine == theirs, f"operator {operator}"
