"""NEXMark Q7, highest bid: per tumbling 10 s window, every bid with the window's maximum price.

Source: docs/NEXMARK.md ("Queries": Q7, highest bid per tumbling 10 s window, all bids with the
maximum price);
the timestamp-tokens paper §7.4 ("Q7 has two stateful operators with two consecutive data
exchanges") and §5 (one token per open window, retired when the frontier passes its end).

Output columns (``COLUMNS``): ``window_start``, ``window_end`` (ms since the Unix epoch,
windows ``[k * 10_000, (k + 1) * 10_000)`` aligned to the epoch, by the bid's ``dateTime``),
``auction``, ``bidder``, ``price`` (cents), ``dateTime`` (ms) — all int64.  A window's rows are
sent at logical time ``window_end``.

Dataflow:

1. ``LocalMax`` (pipeline): each worker keeps, per open window, the bids of its share with the
   largest price so far (vectorized per invocation: window of every bid, max per window with
   ``np.maximum.reduceat``, rows equal to it); once the bid frontier reaches the window end it
   sends them at time ``window_end`` and drops the window's token.
2. ``GlobalMax`` (exchange by ``window_start``): the worker owning a window keeps the rows with
   the largest of the local maxima and sends them once its frontier has passed ``window_end``.

State: both stages declare a ``_windows.WindowMaxState`` (``window_max``): ``LocalMax``'s is
worker-local (pipeline pact: a snapshot holds it under the worker's home bin, and a job
restored at another worker count merges the local maxima of the old workers that land on one
worker, which leaves the global maximum unchanged); ``GlobalMax``'s is kept per bin of
``window_start``, the column it is exchanged by.  Either re-mints one token per open window.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tokenflow.dataflow.channels import Exchange
from tokenflow.dataflow.stream import Stream
from tokenflow.io.times import round_down
from tokenflow.nexmark.queries._windows import int_column, window_max

WINDOW_MS = 10_000
"""Tumbling window length (ms)."""

COLUMNS: list[str] = ["window_start", "window_end", "auction", "bidder", "price", "dateTime"]
SCHEMA = pa.schema([(c, pa.int64()) for c in COLUMNS])

SPARK_SQL = f"""
SELECT window_start, window_end, auction, bidder, price, dateTime
FROM (
  SELECT window_start, window_start + {WINDOW_MS} AS window_end, auction, bidder, price, dateTime,
         MAX(price) OVER (PARTITION BY window_start) AS max_price
  FROM (SELECT auction, bidder, price, dateTime,
               dateTime - pmod(dateTime, {WINDOW_MS}) AS window_start FROM bid)
)
WHERE price = max_price
"""
"""Spark SQL over the temp view ``bid``: the same rows as the dataflow (as a multiset)."""


def with_windows(bids: pa.Table, size: int = WINDOW_MS) -> pa.Table:
    """Bids (``auction, bidder, price, dateTime``) as rows of ``SCHEMA``: the tumbling window
    ``[dateTime - dateTime % size, + size)`` of each bid, computed vectorized.

    Raises:
        KeyError: when a bid column is missing.
    """
    date = int_column(bids, "dateTime")
    start = round_down(date, size)
    return pa.table({
        "window_start": start, "window_end": start + size,
        "auction": bids.column("auction"), "bidder": bids.column("bidder"),
        "price": bids.column("price"), "dateTime": bids.column("dateTime"),
    }, schema=SCHEMA)


def build(streams: dict[str, Stream], config: Any = None) -> Stream:
    """Q7 over ``nexmark_source`` streams (uses ``streams["bid"]``); ``config`` is unused.

    Returns the stream of ``SCHEMA`` record batches, one per window at time ``window_end``.
    """
    local = window_max(streams["bid"], "pipeline", "price", SCHEMA, inclusive=False,
                       prepare=with_windows, name="Q7LocalMax")
    return window_max(local, Exchange(column="window_start"), "price", SCHEMA, inclusive=True,
                      name="Q7GlobalMax")


__all__ = ["COLUMNS", "SCHEMA", "SPARK_SQL", "WINDOW_MS", "build", "with_windows"]
