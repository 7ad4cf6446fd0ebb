"""Runtime-neutral data in and out of dataflows.

``to_parquet`` commits a Parquet dataset epoch by epoch (staged files, one committer, a
dataset manifest); ``read_committed`` / ``committed_epochs`` read exactly what it committed.
"""

from tokenflow.io.parquet import (
    ManifestError,
    ParquetSinkError,
    committed_epochs,
    read_committed,
    read_manifest,
    to_parquet,
)

# sources: see tokenflow.io.sources

__all__ = [
    "ManifestError",
    "ParquetSinkError",
    "committed_epochs",
    "read_committed",
    "read_manifest",
    "to_parquet",
]
