"""``ChangeReport.steps`` / ``end``: a change's step count and last step time, over operators
(where a latency benchmark's migration window ends)."""

from __future__ import annotations

from typing import Any

from tokenflow.rescale.report import summarize
from tokenflow.state.bins import RoutingTable

INITIAL = RoutingTable(RoutingTable.even(2, 8).owners, range(4))


def test_steps_and_end_span_every_operators_steps_of_the_change() -> None:
    # operator a: 2 -> 3 in steps at 10 and 11, then 3 -> 2 at 40; b: 2 -> 3 at 12, 3 -> 2 at 41
    a = {"changes": [(10, {}), (40, {})],
         "issued": [(10, [(0, 0, 2)]), (11, [(4, 1, 2)]), (40, [(0, 2, 0), (4, 2, 1)])],
         "moved": []}
    b = {"changes": [(12, {}), (41, {})],
         "issued": [(12, [(0, 0, 2), (4, 1, 2)]), (41, [(0, 2, 0), (4, 2, 1)])], "moved": []}
    parts: list[dict[str, Any]] = [{"a": a, "b": b}, {"a": {"moved": []}, "b": {"moved": []}}]
    out, back = summarize(parts, INITIAL)
    assert (out.time, out.end, out.steps) == (10, 12, 3)
    assert (back.time, back.end, back.steps) == (40, 41, 2)
    assert out.after == [0, 1, 2] and back.after == [0, 1]
