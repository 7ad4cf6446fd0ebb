"""Random content for NEXMark query states, shared by the tests of their takes
(tests/nexmark/test_columnar_take.py, tests/nexmark/test_chunk_bins.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tokenflow.nexmark.queries import q8


def add_random_windows(state: q8.WindowState, rng: np.random.Generator, count: int) -> None:
    """``count`` batches of 0-7 persons or sellers (ids below 400, sellers repeating) added to
    windows ending at 10, 20, 30 or 40 (a ``WindowState`` of size 10)."""
    for _ in range(count):
        end = int(rng.integers(1, 5)) * 10
        n = int(rng.integers(0, 8))
        if rng.random() < 0.5:
            ids = rng.integers(0, 400, n)
            state.add_persons(end, pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array([f"p{i}" for i in ids.tolist()])],
                schema=q8.PERSON_SCHEMA))
        else:
            state.add_sellers(end, rng.integers(0, 400, n))
