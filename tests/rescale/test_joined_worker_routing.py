"""Records reach workers that joined after an operator was built: a migrating operator
(``tokenflow.rescale.migrate``) splits its inputs by worker *slot*, not by the roster's size when
it was built.  It split by ``scope.peers`` (2 on the workers the job started with), so once a
joined worker 2 owned bins, the rows routed to it were dropped (NEXMark q5 with processes
joining lost bids: 176 rows instead of 180); a split now refuses a route beyond its workers
instead of dropping the records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tokenflow.dataflow.routing import partition_arrow, partition_list
from tokenflow.nexmark.run import run_query


def test_q5_rows_reach_a_worker_that_joined() -> None:
    events = 300_000
    reference = run_query("q5", events, workers=2, granularity_ms=100).rows
    result = run_query("q5", events, workers=2, runtime="thread", max_workers=3,
                       granularity_ms=100, rescale_schedule=[(0.0, 3)])
    assert [(e.workers, e.error) for e in result.rescales] == [(3, None)]
    (change,) = result.migrations
    assert (change.before, change.after, change.receivers) == ([0, 1], [0, 1, 2], [2])
    pd.testing.assert_frame_equal(result.rows.reset_index(drop=True),
                                  reference.reset_index(drop=True), check_dtype=False)


@pytest.mark.parametrize("rows", [10, 20_000])  # the sorting and the per-worker selection
def test_an_arrow_split_refuses_a_route_beyond_its_workers(rows: int) -> None:
    batch = pa.RecordBatch.from_pydict({"k": np.arange(rows)})
    routes = np.arange(rows) % 3
    assert sum(len(p) for _, p in partition_arrow(batch, routes, 3)) == rows
    with pytest.raises(ValueError, match="routed to worker 2, beyond the 2 workers"):
        list(partition_arrow(batch, routes, 2))


@pytest.mark.parametrize("peers", [2, 20])  # the masks and the sorting
def test_a_list_split_refuses_a_route_beyond_its_workers(peers: int) -> None:
    records = list(range(40))
    routes = [r % (peers + 1) for r in records]
    with pytest.raises(ValueError, match=f"routed to worker {peers}, beyond the {peers} workers"):
        list(partition_list(records, bytes(routes) if peers < 16 else routes, peers))
    assert sum(len(p) for _, p in partition_list(records, routes, peers + 1)) == 40
