"""``run_query(pace=...)``: an open-loop offered load on the wall clock."""

from __future__ import annotations

import pytest

from tokenflow.nexmark.generator import GeneratorConfig
from tokenflow.nexmark.run import epoch_plan, run_query


def test_paced_epochs_are_not_sent_early() -> None:
    events, rate, pace = 6_000, 20_000, 6_000.0  # 300 ms of event time offered over ~1 s
    plan = epoch_plan(events, GeneratorConfig(rate=rate), 50)
    paced = run_query("q5", events, rate=rate, workers=2, granularity_ms=50, lag=100, pace=pace)
    assert len(paced.sent_at) == len(plan) >= 5
    # the schedule starts when the first epoch passed (the last worker to see it: sent_at and
    # the latencies are the latest over the workers)
    paced_from = paced.sent_at[0] + paced.latencies_ms[0] / 1000
    for (_, first, _), sent in zip(plan[1:], paced.sent_at[1:], strict=True):
        assert sent - paced_from >= first / pace - 0.005  # never before its due time
    last = plan[-1][1] / pace
    assert paced.sent_at[-1] - paced_from < last + 0.5  # ... nor long after, when idle
    assert paced.seconds >= last
    assert paced.worker_cpu_s > 0  # measured (NaN when not)
    fast = run_query("q5", events, rate=rate, workers=2, granularity_ms=50, lag=100)
    assert fast.sent_at[-1] - fast.started < last / 2  # without pace: sent at once
    assert paced.rows.equals(fast.rows)


def test_pace_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pace"):
        run_query("q5", 100, pace=0.0)
