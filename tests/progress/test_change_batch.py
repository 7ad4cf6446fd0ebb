"""``ChangeBatch``: consolidated ``key -> diff`` updates, checked against a dict model."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.progress import ChangeBatch


def consolidated(model):
    return {k: v for k, v in model.items() if v}


def check_contents(batch, model):
    expected = consolidated(model)
    pairs = batch.iter()
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys after compaction: {pairs}"
    assert all(d != 0 for _, d in pairs)
    assert dict(pairs) == expected
    assert sorted(batch) == sorted(expected.items())
    assert len(batch) == len(expected)
    assert batch.is_empty() == (not expected)
    assert bool(batch) == bool(expected)


# -- examples ------------------------------------------------------------------------------


def test_updates_accumulate_and_cancel():
    batch = ChangeBatch()
    assert batch.is_empty()
    batch.update("a", 1)
    batch.update("b", 2)
    batch.update("a", 3)
    assert sorted(batch.iter()) == [("a", 4), ("b", 2)]
    batch.update("a", -4)
    assert batch.iter() == [("b", 2)]
    assert len(batch) == 1
    batch.update("b", -2)
    assert batch.is_empty()
    assert not batch
    assert batch.drain() == []


def test_zero_diffs_are_ignored():
    batch = ChangeBatch([("a", 0), ("b", 0)])
    assert batch.is_empty()
    batch.update("a", 0)
    assert len(batch) == 0


def test_new_from_and_constructor():
    assert ChangeBatch.new_from(("x", 3), 5).iter() == [(("x", 3), 5)]
    assert sorted(ChangeBatch([("a", 1), ("b", -1), ("a", 1)]).iter()) == [("a", 2), ("b", -1)]


def test_drain_empties_the_batch():
    batch = ChangeBatch([(1, 1), (2, -3), (1, 1)])
    assert sorted(batch.drain()) == [(1, 2), (2, -3)]
    assert batch.is_empty()
    assert batch.drain() == []
    batch.update(1, 1)
    assert batch.iter() == [(1, 1)]


def test_iter_does_not_drain():
    batch = ChangeBatch([(1, 1)])
    assert batch.iter() == [(1, 1)]
    assert list(batch) == [(1, 1)]
    assert batch.iter() == [(1, 1)]


def test_drain_into_moves_everything():
    a = ChangeBatch([(1, 1), (2, 2)])
    b = ChangeBatch([(1, -1), (3, 3)])
    a.drain_into(b)
    assert a.is_empty()
    assert sorted(b.iter()) == [(2, 2), (3, 3)]


def test_many_updates_to_one_key_stay_small():
    batch = ChangeBatch()
    for _ in range(1000):
        batch.update("k", 1)
        batch.update("k", -1)
    # Only keys with a non-zero total are held.
    assert len(batch._updates) <= 1
    assert batch.is_empty()


def test_equality_and_clear():
    assert ChangeBatch([(1, 1), (2, 0)]) == ChangeBatch([(1, 2), (1, -1)])
    assert ChangeBatch([(1, 1)]) != ChangeBatch([(1, 2)])
    batch = ChangeBatch([(1, 1)])
    batch.clear()
    assert batch.is_empty()
    assert batch == ChangeBatch()


# -- property test against a dict model ----------------------------------------------------

keys = st.integers(min_value=0, max_value=5)
diffs = st.integers(min_value=-3, max_value=3)
ops = st.one_of(
    st.tuples(st.just("update"), keys, diffs),
    st.tuples(st.just("extend"), st.lists(st.tuples(keys, diffs), max_size=40)),
    st.tuples(st.just("iter")),
    st.tuples(st.just("drain")),
    st.tuples(st.just("is_empty")),
    st.tuples(st.just("len")),
    st.tuples(st.just("compact")),
    st.tuples(st.just("drain_into")),
)


@settings()
@given(st.lists(ops, max_size=80))
def test_change_batch_matches_dict_model(operations):
    batch = ChangeBatch()
    model: dict[int, int] = {}
    other = ChangeBatch()
    other_model: dict[int, int] = {}
    for op in operations:
        kind = op[0]
        if kind == "update":
            _, k, d = op
            batch.update(k, d)
            model[k] = model.get(k, 0) + d
        elif kind == "extend":
            batch.extend(op[1])
            for k, d in op[1]:
                model[k] = model.get(k, 0) + d
        elif kind == "iter":
            assert dict(batch.iter()) == consolidated(model)
        elif kind == "drain":
            drained = batch.drain()
            assert dict(drained) == consolidated(model)
            assert len(drained) == len(consolidated(model))
            model = {}
            assert batch.is_empty()
        elif kind == "is_empty":
            assert batch.is_empty() == (not consolidated(model))
        elif kind == "len":
            assert len(batch) == len(consolidated(model))
        elif kind == "compact":
            batch.compact()
            assert len(batch._updates) == len(consolidated(model))
        elif kind == "drain_into":
            batch.drain_into(other)
            for k, d in model.items():
                other_model[k] = other_model.get(k, 0) + d
            model = {}
            assert batch.is_empty()
            check_contents(other, other_model)
    check_contents(batch, model)
    check_contents(other, other_model)


@settings()
@given(st.lists(st.integers(min_value=0, max_value=11), min_size=33, max_size=150))
def test_long_update_sequences_stay_consolidated(codes):
    # The batch holds exactly the keys with a non-zero total after every update.
    batch = ChangeBatch()
    model: dict[int, int] = {}
    for code in codes:
        k, d = code >> 1, (1 if code & 1 else -1)
        batch.update(k, d)
        model[k] = model.get(k, 0) + d
        assert len(batch._updates) == len(consolidated(model))
    check_contents(batch, model)
