"""NEXMark Q2: selection, the bids on every ``auction_skip``-th auction (``auction % 123 == 0``).

Source: docs/NEXMARK.md ("Queries": Q2, ``auction % 123 == 0``); Beam's ``Query2``.  The modulus is
``config.auction_skip`` (default 123, the value ``SPARK_SQL`` uses).

Output ``COLUMNS``: ``auction, price`` (``int64``; ``price`` in cents).  Logical time: the time
of the input bid message (stateless, pipeline pact, vectorized filter; messages left empty are
not sent).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tokenflow.dataflow.stream import Stream
from tokenflow.io.times import round_down
from tokenflow.nexmark.generator import BID_SCHEMA, GeneratorConfig

COLUMNS: list[str] = ["auction", "price"]
SCHEMA: pa.Schema = pa.schema([BID_SCHEMA.field(c) for c in COLUMNS])

SPARK_SQL = "SELECT auction, price FROM bid WHERE auction % 123 = 0"


def build(streams: dict[str, Stream], config: GeneratorConfig) -> Stream:
    """Bids with ``auction % config.auction_skip == 0``, projected to ``COLUMNS`` (``Q2``)."""
    skip = config.auction_skip

    def select(batch: Any) -> pa.RecordBatch:
        auction = batch.column("auction").to_numpy()
        keep = round_down(auction, skip) == auction  # auction % skip == 0, without the slow %
        return batch.select(COLUMNS).filter(pa.array(keep))

    return streams["bid"].map_batch(select, name="Q2")
