"""NEXMark test configuration: registers the ``spark`` marker (as tests/spark/conftest.py does),
so ``-m "not spark"`` skips the Spark SQL comparisons when only tests/nexmark is collected."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: needs a local SparkSession (slow start-up, ~20 s)")
