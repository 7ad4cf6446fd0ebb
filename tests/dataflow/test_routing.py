"""``partition_list``: a list batch split by routes, checked against a per-record oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenflow.dataflow.routing import partition_list


@st.composite
def batches_with_routes(draw: st.DrawFn) -> tuple[list[object], list[int], int]:
    peers = draw(st.integers(1, 6))
    n = draw(st.integers(1, 80))
    records = draw(st.lists(st.one_of(st.integers(), st.text(max_size=4)), min_size=n, max_size=n))
    routes = draw(st.lists(st.integers(0, peers - 1), min_size=n, max_size=n))
    return records, routes, peers


@given(batches_with_routes())
def test_parts_hold_each_workers_records_in_batch_order(case: tuple[list[object], list[int], int]) -> None:
    records, routes, peers = case
    parts = list(partition_list(records, routes, peers))
    expected = [(w, [r for r, route in zip(records, routes, strict=True) if route == w])
                for w in range(peers)]
    assert parts == [(w, part) for w, part in expected if part]  # worker order, no empty parts
    assert all(isinstance(part, list) for _, part in parts)


def test_a_batch_bound_for_one_worker_is_passed_as_it_is() -> None:
    records = ["a", "b", "c"]
    ((worker, part),) = partition_list(records, [2, 2, 2], 3)
    assert worker == 2 and part is records
