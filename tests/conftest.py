"""Shared test configuration.

* Hypothesis profiles: ``ci`` (the default; >= 500 examples per property) and ``dev``.
* The ``spark`` marker (``-m "not spark"`` skips the tests that need a SparkSession).
* ``spark``: one SparkSession (``local[4]``) for the whole test session (per pytest-xdist
  process: ``make test`` runs two), started on first use (~20 s) and stopped at the end.
  ``local[4]`` has four task slots, so the barrier stages of both 2- and 4-worker jobs run on
  it (``get_session`` hands the running session to any ``local[n]`` request with ``n <= 4``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:  # shared test helpers (``roundtrip``) import from here
    sys.path.insert(0, TESTS)

settings.register_profile(
    "ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: needs a local SparkSession (slow start-up, ~20 s)")


@pytest.fixture
def one_blob_per_bin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bin of a full capture in a blob of its own (``SMALL_BIN_BYTES = 0``): for tests of
    that path, whose bins are small enough that a full capture would pack them into shared
    blobs (tested in ``tests/state/test_small_bins.py``)."""
    from tokenflow.state import snapshot

    monkeypatch.setattr(snapshot, "SMALL_BIN_BYTES", 0)


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
