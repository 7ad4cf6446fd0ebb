"""Keyed operator state: bins and routing tables (``bins``), and per-bin snapshots of a job's
state at an epoch (``snapshot``)."""

from tokenflow.state.bins import DEFAULT_BINS, RoutingTable, bins_of
from tokenflow.state.snapshot import (
    Snapshot,
    SnapshotError,
    WorkerPart,
    commit_snapshot,
    committed_epochs,
    delete_snapshot,
    prune,
    snapshot_dir,
    write_worker_part,
)

__all__ = ["DEFAULT_BINS", "RoutingTable", "Snapshot", "SnapshotError", "WorkerPart", "bins_of",
           "commit_snapshot", "committed_epochs", "delete_snapshot", "prune", "snapshot_dir",
           "write_worker_part"]
