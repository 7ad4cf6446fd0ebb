"""The ``batched`` strategy's batch size scales with the table: a change of a 4,096-bin table
takes as few rounds as one of 256 bins (a round costs its senders a pass over their state)."""

from __future__ import annotations

from collections import Counter

import pytest

from tokenflow.rescale.megaphone import batch_size, plan
from tokenflow.state.bins import RoutingTable


@pytest.mark.parametrize("bins", [64, 256, 4096])
def test_batched_rounds_do_not_grow_with_the_bin_count(bins: int) -> None:
    table = RoutingTable(RoutingTable.even(2, bins).owners, range(4))
    rounds = []
    for n in (3, 4, 3, 2):
        new = table.rebalanced(list(range(n)))
        steps = plan(table, new, "batched")
        rounds.append(len(steps))
        for step in steps:  # each worker sends at most one batch and receives at most one
            pairs = Counter((m.old, m.new) for m in step)
            assert max(Counter(o for o, _ in pairs).values()) == 1
            assert max(Counter(w for _, w in pairs).values()) == 1
            assert max(pairs.values()) <= batch_size(bins)
        moved = sorted(m.bin for step in steps for m in step)
        assert moved == sorted(int(b) for b in (table.owners != new.owners).nonzero()[0])
        table = new
    assert rounds == [2, 3, 3, 2]
    assert len(plan(table, table.rebalanced([0, 1, 2]), "batched", batch_bins=1)) > 3
