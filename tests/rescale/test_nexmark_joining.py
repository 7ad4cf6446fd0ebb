"""NEXMark with worker processes that join and leave the running query: q5 on the process
runtime and q8 on Spark (each joining worker a barrier stage of its own) go 2 -> 3 -> 4 -> 3 -> 2
workers while they run, and the output is exactly a run's that never rescales (the ordinary,
non-migrating build on the thread runtime); each scale-out moves bins to the newcomer only and
each scale-in exactly the leaving worker's."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from tokenflow.nexmark.run import run_query

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.filterwarnings("ignore::tokenflow.execute.ContentionWarning")]

EVENTS = 1_000_000
GRANULARITY = 100
SCHEDULE = [(0.0, 3), (0.5, 4), (1.0, 3), (1.5, 2)]
"""Seconds after the start : workers; each change waits for the one before (a join starts a
worker process and waits for it), so they follow each other as fast as they go."""


def check(query: str, runtime: str, events: int = EVENTS, **options: Any) -> None:
    reference = run_query(query, events, workers=2, granularity_ms=GRANULARITY).rows
    result = run_query(query, events, workers=2, runtime=runtime, max_workers=4,
                       granularity_ms=GRANULARITY, rescale_schedule=SCHEDULE, **options)
    assert [(e.workers, e.error) for e in result.rescales] == [(n, None) for _, n in SCHEDULE]
    assert len(reference) > 0
    pd.testing.assert_frame_equal(result.rows.reset_index(drop=True),
                                  reference.reset_index(drop=True), check_dtype=False)
    changes = [(c.before, c.after) for c in result.migrations]
    assert changes == [([0, 1], [0, 1, 2]), ([0, 1, 2], [0, 1, 2, 3]),
                       ([0, 1, 2, 3], [0, 1, 2]), ([0, 1, 2], [0, 1])]
    for c in result.migrations:
        if len(c.after) > len(c.before):
            assert c.receivers == [max(c.after)]  # the worker that just joined
        else:
            (leaving,) = set(c.before) - set(c.after)
            assert c.senders == [leaving] and c.moved_bins == c.owned_before[leaving]


def test_q5_workers_join_and_leave_on_the_process_runtime() -> None:
    check("q5", "process", 3 * EVENTS)  # long enough for four changes on a loaded machine


@pytest.mark.spark
def test_q8_workers_join_and_leave_on_spark(spark: Any) -> None:
    check("q8", "spark", 3 * EVENTS, master="local[4]")  # joins start Spark stages: slower
