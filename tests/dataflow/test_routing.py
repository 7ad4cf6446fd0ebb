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


@st.composite
def with_last(draw: st.DrawFn) -> tuple[list[object], list[int], int, int]:
    records, routes, peers = draw(batches_with_routes())
    peers = draw(st.sampled_from([peers, 20]))  # 20 > MASKED_PEERS: the sorted path
    return records, routes, peers, draw(st.integers(0, peers - 1))


def split_in_order(records: list[object], routes: list[int], peers: int,
                   last: int) -> list[tuple[int, list[object]]]:
    """The oracle: non-empty parts in worker order, ``last``'s moved to the end."""
    parts = [(w, [r for r, route in zip(records, routes, strict=True) if route == w])
             for w in range(peers)]
    return [p for p in parts if p[1] and p[0] != last] + [p for p in parts if p[1] and p[0] == last]


@given(with_last())
def test_the_last_workers_part_comes_last_after_before_last(
        case: tuple[list[object], list[int], int, int]) -> None:
    records, routes, peers, last = case
    events: list[object] = []
    for worker, part in partition_list(records, routes, peers, last, lambda: events.append("before")):
        events.append((worker, part))
    parts = [e for e in events if e != "before"]
    assert parts == split_in_order(records, routes, peers, last)
    others = [w for w, _ in parts if w != last]
    # called once, between the other workers' parts and last's, when both exist
    expected_calls = 1 if others and len(parts) > len(others) else 0
    assert events.count("before") == expected_calls
    if expected_calls:
        assert events.index("before") == len(events) - 2


@given(with_last())
def test_arrow_parts_come_in_the_same_order(case: tuple[list[object], list[int], int, int]) -> None:
    import numpy as np
    import pyarrow as pa

    from tokenflow.dataflow.routing import partition_arrow

    records, routes, peers, last = case
    batch = pa.record_batch({"i": pa.array(range(len(records)), pa.int64())})
    events: list[object] = []
    for w, part in partition_arrow(batch, np.array(routes, np.int64), peers, last,
                                   lambda: events.append("before")):
        events.append((w, part.column(0).to_pylist()))
    parts = [e for e in events if e != "before"]
    assert parts == split_in_order(list(range(len(records))), routes, peers, last)
    if "before" in events:  # only right before last's part, after another worker's
        assert events.count("before") == 1 and events.index("before") == len(events) - 2 > 0
        assert parts[-1][0] == last  # type: ignore[index]


def test_a_large_batch_reaches_other_workers_before_the_local_part_is_split() -> None:
    """``ExchangePusher`` with a ``flush``: remote parts pushed, then flush, then the local part;
    a small batch is not flushed early."""
    from tokenflow.dataflow.channels import EAGER_RECORDS, ExchangePusher

    log: list[object] = []

    class Recorder:
        def __init__(self, worker: int) -> None:
            self.worker = worker

        def push(self, message: tuple[int, list[object]]) -> None:
            log.append((self.worker, len(message[1])))

    pusher = ExchangePusher([Recorder(w) for w in range(3)], None, None, local=1,
                            flush=lambda: log.append("flush"))
    big = list(range(EAGER_RECORDS * 3))
    pusher.push((0, big))
    assert [e if e == "flush" else e[0] for e in log] == [0, 2, "flush", 1]  # type: ignore[index]
    assert sum(e[1] for e in log if e != "flush") == len(big)  # type: ignore[index]
    log.clear()
    pusher.push((0, list(range(30))))
    assert "flush" not in log and sorted(e[0] for e in log) == [0, 1, 2]  # type: ignore[index]


def test_a_large_arrow_batch_keeps_the_order_and_calls_before_last_once() -> None:
    import numpy as np
    import pyarrow as pa

    from tokenflow.dataflow.routing import partition_arrow

    n = 20_000  # above the per-worker selection threshold
    routes = np.random.default_rng(3).integers(0, 3, n)
    batch = pa.record_batch({"i": pa.array(range(n), pa.int64())})
    events: list[object] = []
    for w, part in partition_arrow(batch, routes, 3, 1, lambda: events.append("before")):
        events.append((w, part.column(0).to_pylist()))
    assert events == [(0, np.flatnonzero(routes == 0).tolist()),
                      (2, np.flatnonzero(routes == 2).tolist()), "before",
                      (1, np.flatnonzero(routes == 1).tolist())]


@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.booleans(),
                          st.floats(allow_nan=False), st.text(max_size=3)), min_size=1, max_size=30))
def test_keys_equal_in_python_hash_equal_in_any_mix_and_layout(keys: list[object]) -> None:
    """``1``, ``1.0`` and ``True`` are one dict key, so they must route together whichever
    is seen first (the router memoizes by equality); the hash of a key does not depend on
    the other keys of its batch, nor on list vs Arrow column."""
    import numpy as np
    import pyarrow as pa

    from tokenflow.dataflow.routing import column_hashes, stable_hash

    hashes = stable_hash(keys)
    alone = [int(stable_hash([k])[0]) for k in keys]
    assert hashes.tolist() == alone
    for k, h in zip(keys, alone, strict=True):
        if isinstance(k, float) and k.is_integer() and abs(k) < 2**63:
            assert h == int(stable_hash([int(k)])[0])
        if isinstance(k, bool):
            assert h == int(stable_hash([int(k)])[0])
    floats = [k for k in keys if type(k) is float]
    if floats:
        column = column_hashes(pa.array(floats, pa.float64()))
        assert column.tolist() == stable_hash(floats).tolist()
        assert stable_hash(np.array(floats)).tolist() == column.tolist()


@given(st.lists(st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=2)), max_size=40),
                min_size=1, max_size=6),
       st.one_of(st.integers(1, 5), st.sampled_from([254, 255, 256, 300])), st.integers(1, 30))
def test_a_key_router_routes_each_record_as_its_key_alone_would(
        batches: list[list[object]], peers: int, capacity: int) -> None:
    """Whatever the memo holds (keys seen before, a few new among many known, most new, a
    memo cleared at ``capacity``) and after whatever the last batch held, every record
    routes where its key's hash alone sends it, at worker counts around the one-byte
    routes' limit too."""
    from tokenflow.dataflow.routing import KeyRouter, route_hashes, stable_hash

    router = KeyRouter(None, peers, capacity=capacity)
    for batch in batches:
        if not batch:
            continue
        expected = [int(route_hashes(stable_hash([k]), peers)[0]) for k in batch]
        assert list(router.routes(batch)) == expected
