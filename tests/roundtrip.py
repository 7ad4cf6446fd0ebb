"""Shared harness of the state round-trip tests: export binned states as a snapshot stores
them (Arrow IPC), and load them into fresh states of another worker count."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import TypeVar

import pyarrow as pa

from tokenflow.dataflow.state import BinnedState
from tokenflow.state.bins import RoutingTable

OLD = RoutingTable.even(2)
"""The routing table of the job the snapshot was taken from."""
WORKERS = (1, 2, 3)

S = TypeVar("S", bound=BinnedState)


def ipc(table: pa.Table) -> pa.Table:
    """``table`` written to and read back from an Arrow IPC stream (a snapshot's storage)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


def exported(*states: BinnedState) -> dict[int, pa.Table]:
    """Every bin of ``states`` (one old worker each), through IPC; a bin in two, or an empty
    bin, is an error."""
    out: dict[int, pa.Table] = {}
    for state in states:
        for b, table in state.export().items():
            assert b not in out, f"bin {b} exported twice"
            assert table.num_rows > 0
            out[b] = ipc(table)
    return out


def fresh(make: Callable[[], S], table: RoutingTable, worker: int) -> S:
    """A new state attached as ``worker`` of ``table`` would attach it."""
    state = make()
    owned = table.owned_by(worker)
    state.attach(table.bins, int(owned[0]) if len(owned) else -1)
    return state


def restore(make: Callable[[], S], parts: Mapping[int, pa.Table],
            workers: int) -> tuple[RoutingTable, list[S]]:
    """``workers`` fresh states, each loaded with the bins it owns under the new table."""
    table = OLD.rebalanced(range(workers))
    states = []
    for w in range(workers):
        state = fresh(make, table, w)
        state.load({b: p for b, p in parts.items() if table.owner(b) == w})
        states.append(state)
    return table, states
