"""``tokenflow.rescale.report.summarize`` when the job ended between two operators' table
changes: worker 0 asks each migrating operator's controller in turn, so one operator can have
made a change another never made.  The report covers the changes every operator made (the
common prefix) instead of raising, and ``change_counts`` tells each operator's own count."""

from __future__ import annotations

from typing import Any

from tokenflow.rescale.report import change_counts, summarize
from tokenflow.state.bins import RoutingTable

BINS = 8
INITIAL = RoutingTable(RoutingTable.even(2, BINS).owners, range(4))  # workers 0, 1 of 4 slots


def step(time: int, bins: int, moved: int, total: int) -> dict[str, int]:
    return {"time": time, "bins": bins, "bytes": moved, "total": total}


def parts() -> list[dict[str, Any]]:
    """Operator ``a`` made three changes (2 -> 3 at 10, 3 -> 4 at 20, 4 -> 3 at 30), operator
    ``b`` only the first (2 -> 3 at 11): the job ended before worker 0 asked ``b`` again."""
    to3 = [(0, 0, 2), (4, 1, 2)]  # bins 0 and 4 go to the newcomer, worker 2
    a = {"changes": [(10, {}), (20, {}), (30, {})],
         "issued": [(10, to3), (20, [(1, 0, 3), (5, 1, 3)]), (30, [(1, 3, 0), (5, 3, 1)])],
         "moved": []}
    b = {"changes": [(11, {})], "issued": [(11, to3)], "moved": []}
    worker0 = {"a": {**a, "moved": [step(10, 1, 100, 400), step(20, 1, 70, 300)]},
               "b": {**b, "moved": [step(11, 1, 10, 40)]}}
    worker1 = {"a": {"moved": [step(10, 1, 120, 500), step(20, 1, 80, 350)]},
               "b": {"moved": [step(11, 1, 12, 50)]}}
    worker2 = {"a": {"moved": [step(10, 0, 0, 0), step(20, 0, 0, 200)]},
               "b": {"moved": [step(11, 0, 0, 0)]}}
    return [worker0, worker1, worker2]


def test_a_job_that_ends_between_two_operators_changes_reports_the_common_prefix() -> None:
    assert change_counts(parts()) == {"a": 3, "b": 1}
    (change,) = summarize(parts(), INITIAL)
    assert change.index == 0 and change.time == 10
    assert (change.before, change.after) == ([0, 1], [0, 1, 2])
    assert change.moved_bins == [0, 4] and change.senders == [0, 1] and change.receivers == [2]
    # ``a``'s first change ends where its second begins (time 20): that step is not counted
    assert change.operators == {"a": (220, 900), "b": (22, 90)}
    assert change.moved_bytes == 242 and change.total_bytes == 990
    assert change.sender_bytes == {0: 440, 1: 550}
    assert change.owned_before == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}


def test_an_operator_that_made_no_change_leaves_no_report() -> None:
    p = parts()
    p[0]["b"] = {"changes": [], "issued": [], "moved": []}
    assert change_counts(p) == {"a": 3, "b": 0}
    assert summarize(p, INITIAL) == []


def test_operators_that_agree_report_every_change() -> None:
    p = [{"a": part["a"]} for part in parts()]
    changes = summarize(p, INITIAL)
    assert [(c.before, c.after) for c in changes] == [
        ([0, 1], [0, 1, 2]), ([0, 1, 2], [0, 1, 2, 3]), ([0, 1, 2, 3], [0, 1, 2])]
    assert [c.moved_bytes for c in changes] == [220, 150, 0]
