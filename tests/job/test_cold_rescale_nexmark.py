"""Cold rescale of NEXMark queries: snapshot a running query at an epoch boundary, stop, and
restart it from the snapshot at another worker count; the union of both runs' output (rows
with their logical times) equals an uninterrupted run's, exactly.

The queries keep their state in declared ``BinnedState``s (``tokenflow.nexmark.queries``) and
read the replayable NEXMark source (``tokenflow.io.sources.nexmark_streams``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenflow import execute
from tokenflow.io.sources import nexmark_streams
from tokenflow.job import start
from tokenflow.nexmark.generator import GeneratorConfig
from tokenflow.nexmark.queries import load

EVENTS = 60_000
GRANULARITY = 1000  # ms of event time per epoch
CONFIG = GeneratorConfig(rate=2_000)  # 60,000 events over 30 s of event time: 30 epochs


def query_job(name: str, pause_at: int | None = None) -> Any:
    def job(worker: Any) -> Any:
        query = load(name)

        def build(scope: Any) -> Any:
            streams, _ = nexmark_streams(scope, EVENTS, CONFIG, splits=8, block=1000,
                                         granularity=GRANULARITY, pause_at=pause_at, max_rows=2000)
            return query.build(streams, CONFIG).capture()

        return worker.dataflow(build)

    return job


def rows(*runs: list[Any]) -> Counter[Any]:
    out: Counter[Any] = Counter()
    for results in runs:
        for capture in results:
            for t, batch in capture.events:
                out.update((t, tuple(r.values())) for r in batch.to_pylist())
    return out


_EXPECTED: dict[str, Counter[Any]] = {}


def _expected(name: str) -> Counter[Any]:
    """The uninterrupted run's output on 2 workers, computed once per query for all the tests
    here: the queries' output does not depend on W, so the runs before and after a rescale of
    any worker counts are compared with the same 2-worker run (which also checks that)."""
    if name not in _EXPECTED:
        _EXPECTED[name] = rows(execute(query_job(name), workers=2, name=f"tests.nexmark.{name}"))
    return _EXPECTED[name]


def first_epoch() -> int:
    t = int(CONFIG.timestamp(0))
    return t - t % GRANULARITY


@pytest.mark.parametrize(("name", "before", "after", "pause"), [
    (name, before, after, pause)
    for name, pauses in (("q3", (9, 17, 24)), ("q4", (12, 20, 6)), ("q5", (14, 7, 21)),
                         ("q8", (11, 22, 16)))
    for (before, after), pause in zip(((2, 3), (3, 2), (2, 4)), pauses, strict=True)
] + [("q7", 2, 3, 15)])
def test_query_cold_rescale_matches_an_uninterrupted_run(tmp_path: Path, name: str, before: int,
                                                         after: int, pause: int) -> None:
    job_name = f"tests.nexmark.{name}"
    expected = _expected(name)
    assert expected, "the query produced no output: the test would prove nothing"
    pause_epoch = first_epoch() + pause * GRANULARITY
    handle = start(query_job(name, pause_at=pause_epoch), workers=before, name=job_name)
    epoch = handle.snapshot(str(tmp_path), timeout=120)
    first = handle.result(timeout=120)
    assert first_epoch() <= epoch <= pause_epoch
    second = execute(query_job(name), workers=after, restore=str(tmp_path), name=job_name)
    assert rows(first, second) == expected
    assert rows(second), "nothing left for the restored run: the test would prove nothing"


@pytest.mark.parametrize(("name", "runtime"), [
    ("q4", "process"), ("q8", "process"), pytest.param("q5", "spark", marks=pytest.mark.spark),
])
def test_query_cold_rescale_2_to_3_on_processes_and_spark(tmp_path: Path, name: str, runtime: str,
                                                         request: pytest.FixtureRequest) -> None:
    options: dict[str, Any] = {}
    if runtime == "spark":
        options["spark"] = request.getfixturevalue("spark")  # local[4]: room for 3 workers
    job_name = f"tests.nexmark.{name}"
    expected = _expected(name)
    handle = start(query_job(name, pause_at=first_epoch() + 13 * GRANULARITY), workers=2,
                   runtime=runtime, name=job_name, **options)
    handle.snapshot(str(tmp_path), timeout=120)
    first = handle.result(timeout=120)
    second = execute(query_job(name), workers=3, runtime=runtime, restore=str(tmp_path),
                     name=job_name, **options)
    assert rows(first, second) == expected


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(["q3", "q4", "q5", "q7", "q8"]), before=st.integers(1, 4),
       after=st.integers(1, 4), pause=st.integers(0, 31))
def test_snapshot_at_any_epoch_and_any_worker_counts(tmp_path_factory: pytest.TempPathFactory,
                                                     name: str, before: int, after: int,
                                                     pause: int) -> None:
    """Property: whatever the pause epoch (including before the first and after the last
    event) and the worker counts before and after, the two runs' output together is the
    uninterrupted run's."""
    root = tmp_path_factory.mktemp("snap")
    job_name = f"tests.nexmark.{name}"
    handle = start(query_job(name, pause_at=first_epoch() + pause * GRANULARITY), workers=before,
                   name=job_name)
    handle.snapshot(str(root), timeout=120)
    first = handle.result(timeout=120)
    second = execute(query_job(name), workers=after, restore=str(root), name=job_name)
    assert rows(first, second) == _expected(name)
