"""While a tokenflow stage runs on a ``local`` master, the loggers that print a failed task's
Java stack trace are off (``runtime._quiet_task_logs``: the driver reports the failure
itself); afterwards each has its own level back, job after job (the JVM handles are resolved
once per SparkContext)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenflow.spark.runtime import QUIET_LOGGERS, _quiet_task_logs


def level(spark: Any, name: str) -> str:
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    return str(log4j.LogManager.getLogger(name).getLevel().toString())


@pytest.mark.spark
def test_task_loggers_are_off_during_a_stage_and_restored_after(spark: Any) -> None:
    sc = spark.sparkContext
    configurator = sc._jvm.org.apache.logging.log4j.core.config.Configurator
    levels = sc._jvm.org.apache.logging.log4j.Level
    before = {name: level(spark, name) for name in QUIET_LOGGERS}
    try:
        configurator.setLevel(QUIET_LOGGERS[0], levels.DEBUG)
        for _ in range(2):
            with _quiet_task_logs(sc, local=True):
                assert {level(spark, n) for n in QUIET_LOGGERS} == {"OFF"}
            assert level(spark, QUIET_LOGGERS[0]) == "DEBUG"
            assert [level(spark, n) for n in QUIET_LOGGERS[1:]] == \
                [before[n] for n in QUIET_LOGGERS[1:]]
        with _quiet_task_logs(sc, local=False):  # a cluster's logs are the user's
            assert level(spark, QUIET_LOGGERS[0]) == "DEBUG"
    finally:
        for name, value in before.items():
            configurator.setLevel(name, levels.toLevel(value))
