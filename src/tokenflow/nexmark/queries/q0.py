"""NEXMark Q0: pass-through of bids (measures the cost of the source and the framework).

Source: docs/NEXMARK.md ("Queries": Q0, pass-through of bids); Beam's ``Query0``.

Output ``COLUMNS``: ``auction, bidder, price, dateTime, extra`` — every bid, unchanged (ids
``int64``, ``price`` in cents, ``dateTime`` in ms since the Unix epoch, ``extra`` ``utf8``).
Logical time: the time of the input bid message (one output batch per input batch, pipeline
pact, stateless).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tokenflow.dataflow.stream import Stream
from tokenflow.nexmark.generator import BID_SCHEMA, GeneratorConfig

COLUMNS: list[str] = ["auction", "bidder", "price", "dateTime", "extra"]
SCHEMA: pa.Schema = pa.schema([BID_SCHEMA.field(c) for c in COLUMNS])

SPARK_SQL = "SELECT auction, bidder, price, dateTime, extra FROM bid"
READS_EXTRA = True
"""Q0 passes ``extra`` through: its events are generated with the padding."""


def build(streams: dict[str, Stream], config: GeneratorConfig) -> Stream:
    """The bids, passed through one (column-selecting) operator named ``Q0``."""

    def select(batch: Any) -> pa.RecordBatch:
        return batch.select(COLUMNS)

    return streams["bid"].map_batch(select, name="Q0")
