"""Spark fixtures: one SparkSession (``local[4]``) for the whole test session.

``local[4]`` has four task slots, so the barrier stages of both 2- and 4-worker jobs run on it
(``get_session`` hands the running session to any ``local[n]`` request with ``n <= 4``).  The
session starts on first use (~20 s) and stops when the test session ends.  Spark tests carry the
``spark`` marker: ``-m "not spark"`` skips them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:  # the examples directory is not a package
    sys.path.insert(0, EXAMPLES)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: needs a local SparkSession (slow start-up, ~20 s)")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session-wide SparkSession (``local[4]``), stopped at the end of the test session."""
    pytest.importorskip("pyspark")
    from tokenflow.spark import session

    spark = session.get_session("local[4]")
    try:
        yield spark
    finally:
        session.stop_session()
