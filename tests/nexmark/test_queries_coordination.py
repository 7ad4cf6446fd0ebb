"""NEXMark Q4 and Q7 with notifications and with watermarks equal the token versions.

``tokenflow.nexmark.queries.coordination`` rewrites the queries' coordination (the
timestamp-tokens paper §7.4); the evaluation benchmark compares their latency, which only means
something if they compute the same thing.  Here: 15,000 events at 1,000 events/s for Q4 (15 s
of event time, about 900 auctions) and 30,000 at 200 events/s for Q7 (150 s: 15 windows),
``nexmark_source`` at 1 ms granularity,
thread runtime, 1 and 2 workers: every variant's output rows (as a multiset) and the logical
time of every row equal the token version's (and each row is sent at the time it names).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from tokenflow import execute
from tokenflow.nexmark import GeneratorConfig, nexmark_source
from tokenflow.nexmark.queries import compare_exact, q4, q7
from tokenflow.nexmark.queries.coordination import BUILDERS, MECHANISMS
from tokenflow.spark.io import collect

pytestmark = pytest.mark.timeout(120)

EVENTS = {"q4": 15_000, "q7": 30_000}
CONFIGS = {"q4": GeneratorConfig(rate=1_000), "q7": GeneratorConfig(rate=200)}
COLUMNS = {"q4": q4.COLUMNS, "q7": q7.COLUMNS}
TIME = {"q4": "time", "q7": "window_end"}
"""The column that holds each row's logical time."""


def run(query: str, mechanism: str, workers: int) -> pd.DataFrame:
    """The variant's output rows, with each row's logical time in ``_time``."""
    build_query = BUILDERS[query][mechanism]
    config = CONFIGS[query]

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            streams = nexmark_source(scope, EVENTS[query], config, batch=5_000)
            return collect(build_query(streams, config))

        return worker.dataflow(build)

    frames = []
    for capture in execute(job, workers=workers):
        for time, batch in capture.events:
            assert batch.schema.names == COLUMNS[query], (query, mechanism)
            frame = batch.to_pandas()
            frame["_time"] = time
            frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)
    assert (rows[TIME[query]] == rows["_time"]).all(), (query, mechanism, "row sent at another time")
    return rows


@pytest.mark.parametrize("query", ["q4", "q7"])
def test_variants_equal_tokens(query: str) -> None:
    expected = run(query, "tokens", 1)
    assert expected["_time"].nunique() >= 10, "too few output times to compare"
    columns = [*COLUMNS[query], "_time"]
    for mechanism in MECHANISMS:
        for workers in (1, 2):
            if mechanism == "tokens" and workers == 1:
                continue
            compare_exact(run(query, mechanism, workers), expected, columns)

