"""Stateful operators in bins: results against oracles, state export/load per bin."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow import execute
from tokenflow.dataflow.operators.stateful import (
    REMOVE,
    PendingRecords,
    state_machine,
    stateful_binary,
    stateful_unary,
)
from tokenflow.dataflow.routing import stable_hash
from tokenflow.dataflow.state import KeyedState, LocalState, key_bins, split_by_bin
from tokenflow.state.bins import RoutingTable


def _running_counts(epochs: list[list[str]]) -> dict[int, Counter[tuple[str, int]]]:
    """Oracle: per epoch, the (word, running count) emitted for each occurrence."""
    totals: Counter[str] = Counter()
    out: dict[int, Counter[tuple[str, int]]] = {}
    for t, words in enumerate(epochs):
        emitted: Counter[tuple[str, int]] = Counter()
        for w in words:
            totals[w] += 1
            emitted[(w, totals[w])] += 1
        out[t] = emitted
    return out


def _feed(worker: Any, epochs: list[list[Any]], build: Any) -> Any:
    handle, captured = worker.dataflow(build)
    for t, records in enumerate(epochs):
        handle.advance_to(t)
        mine = records[worker.index::worker.peers]
        if mine:
            handle.send_batch(list(mine))
    handle.close()
    return captured


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_state_machine_word_count_matches_oracle(workers: int) -> None:
    rng = random.Random(workers)
    epochs = [[rng.choice("abcdefghij") for _ in range(rng.randrange(0, 40))] for _ in range(8)]

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            handle, words = scope.new_input()
            pairs = words.map(lambda w: (w, 1))
            counts = state_machine(pairs, lambda w, n, c: ((c or 0) + n, [(w, (c or 0) + n)]))
            return handle, counts.capture()
        return _feed(worker, epochs, build)

    results = execute(job, workers=workers)
    got: dict[int, Counter[tuple[str, int]]] = {}
    for cap in results:
        for t, batch in cap.events:
            got.setdefault(t, Counter()).update(batch)
    expected = {t: c for t, c in _running_counts(epochs).items() if c}
    # The fold of one word within one epoch runs in arrival order, so the multiset of counts
    # per (word, epoch) is the oracle's even if the order of equal words differs.
    assert got == expected


def test_state_machine_remove_forgets_the_key() -> None:
    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            handle, words = scope.new_input()

            def fold(key: str, value: int, current: int | None) -> tuple[Any, list[Any]]:
                total = (current or 0) + value
                return (REMOVE, [(key, total)]) if total >= 2 else (total, [])

            counts = state_machine(words.map(lambda w: (w, 1)), fold)
            return handle, counts.capture()
        return _feed(worker, [["a"], ["a"], ["a"], ["a"]], build)

    (cap,) = execute(job, workers=1)
    assert sorted((t, r) for t, b in cap.events for r in b) == [(1, ("a", 2)), (3, ("a", 2))]


def test_stateful_unary_sees_arrow_tables_and_state_per_key() -> None:
    def logic(t: int, records: Any, state: KeyedState[Any, Any], session: Any) -> None:
        for key, value in zip(records.column("k").to_pylist(), records.column("v").to_pylist(),
                              strict=True):
            state[key] = state.get(key, 0) + value
            session.give((t, key, state[key]))

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            handle, stream = scope.new_input()
            out = stateful_unary(stream, logic, column="k")
            return handle, out.capture()
        handle, cap = worker.dataflow(build)
        for t in range(3):
            handle.advance_to(t)
            if worker.index == 0:
                handle.send_batch(pa.record_batch({"k": [1, 2, 1], "v": [t, 1, 1]}))
        handle.close()
        return cap

    results = execute(job, workers=2)
    rows = sorted(r for cap in results for _, b in cap.events for r in b)
    # key 1 gets t and 1 in epoch t (running 1, 3, 6), key 2 gets 1 per epoch
    assert [r for r in rows if r[1] == 1] == [(0, 1, 0), (0, 1, 1), (1, 1, 2), (1, 1, 3),
                                             (2, 1, 5), (2, 1, 6)]
    assert [r for r in rows if r[1] == 2] == [(0, 2, 1), (1, 2, 2), (2, 2, 3)]


def test_stateful_binary_joins_both_sides() -> None:
    def logic(t: int, left: list[Any], right: list[Any], state: KeyedState[Any, Any],
              session: Any) -> None:
        for key, name in left:
            state.setdefault(key, [name, []])[0] = name
        for key, amount in right:
            state.setdefault(key, [None, []])[1].append(amount)
        for key in {k for k, _ in left} | {k for k, _ in right}:
            name, amounts = state[key]
            if name is not None and amounts:
                session.give((key, name, sum(amounts)))

    def job(worker: Any) -> Any:
        def build(scope: Any) -> Any:
            h1, people = scope.new_input()
            h2, payments = scope.new_input()
            out = stateful_binary(people, payments, logic, key_left=lambda r: r[0],
                                  key_right=lambda r: r[0])
            return h1, h2, out.capture()
        h1, h2, cap = worker.dataflow(build)
        if worker.index == 0:
            h2.send_batch([(7, 10), (8, 5)])
            h1.advance_to(1)
            h2.advance_to(1)
            h1.send_batch([(7, "ann"), (8, "bob")])
            h2.send_batch([(7, 1)])
        h1.close()
        h2.close()
        return cap

    results = execute(job, workers=2)
    assert sorted((t, r) for cap in results for t, b in cap.events for r in b) == \
        [(1, (7, "ann", 11)), (1, (8, "bob", 5))]


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.one_of(st.integers(-2**40, 2**40), st.text(max_size=6)), st.integers(),
                       max_size=60), st.integers(1, 5))
def test_keyed_state_exports_each_key_once_in_its_routing_bin(data: dict[Any, int], workers: int) -> None:
    state: KeyedState[Any, int] = KeyedState()
    state.attach(256, 0)
    state.data.update(data)
    parts = state.export()
    table = RoutingTable.even(workers, 256)
    seen: dict[Any, int] = {}
    for b, part in parts.items():
        restored: KeyedState[Any, int] = KeyedState()
        restored.attach(256, 0)
        restored.load({b: part})
        for k in restored:
            assert k not in seen
            seen[k] = restored[k]
            assert key_bins([k], 256)[0] == b
    assert seen == data
    # loading the bins a worker owns gives exactly the keys routed to it
    for w in range(workers):
        mine: KeyedState[Any, int] = KeyedState()
        mine.attach(256, 0)
        mine.load({b: p for b, p in parts.items() if table.owner(b) == w})
        routed = {k for k in data if table.routes(stable_hash([k]))[0] == w}
        assert set(mine) == routed
    if parts:
        first = min(parts)
        state.discard([first])
        assert set(state) == {k for k in data if key_bins([k], 256)[0] != first}


def test_pending_records_round_trip_by_bin() -> None:
    held = PendingRecords(key=lambda r: r[0], column=None)
    held.attach(64, 0)
    held.add(3, [("a", 1), ("b", 2)])
    held.add(5, [("a", 3)])
    arrow = PendingRecords(key=None, column="k")
    arrow.attach(64, 0)
    arrow.add(4, pa.record_batch({"k": ["x", "y", "x"], "v": [1, 2, 3]}))
    for state in (held, arrow):
        parts = state.export()
        back = PendingRecords(state._key, state._column)
        back.attach(64, 0)
        back.load(parts)
        assert sorted(back.pending_times()) == sorted(state.pending_times())
        for t in state.pending_times():
            def rows(batches: list[Any]) -> list[Any]:
                return sorted(map(repr, (r for b in batches
                                         for r in (b if isinstance(b, list) else b.to_pylist()))))
            assert rows(back.by_time[t]) == rows(state.by_time[t])


def test_local_state_merges_parts_of_several_workers() -> None:
    def new() -> LocalState[dict[int, int]]:
        return LocalState(dict, lambda a, b: {**a, **b}, times=lambda v: v.keys())

    one, two = new(), new()
    one.attach(16, 0)
    two.attach(16, 8)
    one.value.update({1: 10})
    two.value.update({2: 20})
    merged = new()
    merged.attach(16, 0)
    merged.load({**one.export(), **two.export()})
    assert merged.value == {1: 10, 2: 20}
    assert merged.pending_times() == [1, 2]
    assert one.export([3]) == {}


def test_split_by_bin_groups_rows() -> None:
    table = pa.table({"x": list(range(10))})
    bins = pa.array([3, 1, 3, 0, 1, 1, 2, 3, 0, 2]).to_numpy()
    parts = split_by_bin(table, bins)
    assert {b: p.column("x").to_pylist() for b, p in parts.items()} == \
        {0: [3, 8], 1: [1, 4, 5], 2: [6, 9], 3: [0, 2, 7]}
    assert set(split_by_bin(table, bins, wanted=[1, 2])) == {1, 2}
    with pytest.raises(ValueError):
        split_by_bin(table, bins[:3])
