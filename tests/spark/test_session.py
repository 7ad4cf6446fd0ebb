"""``tokenflow.spark.session.warm_up``: a new ``local`` session runs Spark's first-job costs
(JVM code for SQL, Arrow, shuffles and barrier stages; the Python daemon and one worker per
slot) before it is returned, so the session's first tokenflow job does not pay them."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_warm_up_runs_a_barrier_stage_on_every_slot(spark: Any) -> None:
    from tokenflow.spark.session import warm_up

    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    warm_up(spark, "local[4]")
    jobs = sorted(set(tracker.getJobIdsForGroup(None)) - before)
    assert jobs, "the warm-up ran no Spark job"
    stages = [tracker.getStageInfo(s) for j in jobs for s in tracker.getJobInfo(j).stageIds]
    tasks = sorted(s.numTasks for s in stages if s is not None)
    assert tasks and tasks[-1] == 4  # the barrier stage: one task per slot of local[4]
    assert all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in jobs)


def test_a_failing_warm_up_does_not_fail_the_session() -> None:
    from tokenflow.spark.session import warm_up

    class Broken:
        def createDataFrame(self, *args: Any) -> Any:  # noqa: N802 - Spark's name
            raise RuntimeError("no executors")

    warm_up(Broken(), "local[2]")  # returns: the first job will report the error itself
