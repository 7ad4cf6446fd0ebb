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

EVENTS = 600_000
"""Paced (``pace``): the sources offer them over a fixed stretch of wall-clock time, so the job
is still running when the four changes come however fast or loaded the machine is (run as fast
as it goes, 1M events could end before the fourth change under load, and 3M made each test
~25 s, half of it the reference run), and they leave the CPU to the joining workers' start-up."""
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
    # 6 s of input; the four changes are done ~1.6 s after the start (a join starts a process)
    check("q5", "process", pace=EVENTS / 6)


@pytest.mark.spark
def test_q8_workers_join_and_leave_on_spark(spark: Any) -> None:
    # 10 s of input: joins start Spark stages, slower; in a session that ran no job yet (this
    # file alone) the four changes were done ~9 s after the start, the input ran till ~17 s
    check("q8", "spark", master="local[4]", pace=EVENTS / 10)
