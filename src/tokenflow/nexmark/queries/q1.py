"""NEXMark Q1: currency conversion of bid prices, ``price * 89 // 100``.

Source: docs/NEXMARK.md ("Queries": Q1, price conversion ``price * 89 // 100``); Beam's ``Query1``
(dollars to euros, Java ``long`` arithmetic: ``price * 89 / 100``, equal to floor division for the
generator's prices, which are positive).

Output ``COLUMNS``: ``auction, bidder, price, dateTime`` (``int64``; ``price`` in converted cents,
``dateTime`` in ms since the Unix epoch).  Logical time: the time of the input bid message
(stateless, pipeline pact, one output batch per input batch, vectorized with numpy).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tokenflow.dataflow.stream import Stream
from tokenflow.nexmark.generator import BID_SCHEMA, GeneratorConfig

COLUMNS: list[str] = ["auction", "bidder", "price", "dateTime"]
SCHEMA: pa.Schema = pa.schema([BID_SCHEMA.field(c) for c in COLUMNS])

SPARK_SQL = "SELECT auction, bidder, (price * 89) DIV 100 AS price, dateTime FROM bid"


def convert(batch: Any) -> pa.RecordBatch:
    """``batch``'s bids with ``price`` replaced by ``price * 89 // 100`` (Arrow in, Arrow out)."""
    price = batch.column("price").to_numpy()
    return pa.RecordBatch.from_arrays(
        [batch.column("auction"), batch.column("bidder"), pa.array(price * 89 // 100),
         batch.column("dateTime")], schema=SCHEMA)


def build(streams: dict[str, Stream], config: GeneratorConfig) -> Stream:
    """The converted bids (one operator, ``Q1``)."""
    return streams["bid"].map_batch(convert, name="Q1")
