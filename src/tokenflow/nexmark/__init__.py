"""NEXMark: a Beam-compatible, vectorized event generator and a dataflow source for it.

Source: docs/NEXMARK.md.  ``generate(first_n, count, config)`` returns the person,
auction and bid events of event numbers ``[first_n, first_n + count)`` as Arrow record batches,
equal field for field to Apache Beam's NEXMark generator (one ``java.util.Random(eventId)`` per
event); ``nexmark_source(scope, events, config)`` emits them into a dataflow, timestamped by
event time in ms.
"""

from tokenflow.nexmark.generator import (
    AUCTION_SCHEMA,
    BASE_TIME_MS,
    BID_SCHEMA,
    KINDS,
    PERSON_SCHEMA,
    SCHEMAS,
    GeneratorConfig,
    events_for_worker,
    expected_counts,
    generate,
    nexmark_source,
    worker_blocks,
    write_parquet,
)
from tokenflow.nexmark.javarandom import JavaRandom, LaneRandom

__all__ = [
    "AUCTION_SCHEMA",
    "BASE_TIME_MS",
    "BID_SCHEMA",
    "KINDS",
    "PERSON_SCHEMA",
    "SCHEMAS",
    "GeneratorConfig",
    "JavaRandom",
    "LaneRandom",
    "events_for_worker",
    "expected_counts",
    "generate",
    "nexmark_source",
    "worker_blocks",
    "write_parquet",
]
