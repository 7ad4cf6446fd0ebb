"""Joining with a snapshot: the latest row per key as of the frontier every partition has
passed, then every later epoch; checked against the stream's own history (pandas as the
independent engine for "latest row per key")."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow.pubsub import Catalog, Epoch, Publisher, Snapshot, Subscription, wire
from tokenflow.pubsub.compaction import latest_per_key


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(-(2**63), 2**63 - 1)),
                max_size=40))
def test_latest_per_key_is_pandas_last(rows: list[tuple[int, int, int]]) -> None:
    frame = pd.DataFrame(rows, columns=["a", "b", "v"]).astype("int64")
    got = latest_per_key(pa.Table.from_pandas(frame, preserve_index=False), ["a", "b"]).to_pandas()
    want = frame.drop_duplicates(["a", "b"], keep="last").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)


def keyed_publishers(token: str, catalog: Catalog, retain: int) -> list[Publisher]:
    pubs = [Publisher("prices", p, 2, token, retain_bytes=retain, key=["k"]) for p in range(2)]
    for pub in pubs:
        pub.register(catalog.url, "int")
        pub.advance([0])
    return pubs


@pytest.mark.parametrize("retain", [0, 2_000, 1 << 30])
def test_snapshot_then_updates_equal_the_history(retain: int) -> None:
    rng = random.Random(retain)
    token = wire.new_token()
    history: list[tuple[int, int, int]] = []  # (epoch, key, value) in publishing order
    with Catalog(token=token) as catalog:
        pubs = keyed_publishers(token, catalog, retain)

        def epoch(e: int, final: bool = False) -> None:
            for p, pub in enumerate(pubs):
                keys = [k for k in rng.sample(range(40), 8) if k % 2 == p]  # keys live in one partition
                rows = [(e, k, rng.randrange(1000)) for k in keys]
                history.extend(rows)
                pub.data(e, pa.RecordBatch.from_pydict({"k": [k for _, k, _ in rows],
                                                        "v": [v for _, _, v in rows],
                                                        "t": [e] * len(rows)}))
                pub.advance([] if final else [e + 1])

        for e in range(30):
            epoch(e)
        pubs[1].data(30, pa.RecordBatch.from_pydict({"k": [1], "v": [-1], "t": [30]}))
        history.append((30, 1, -1))  # epoch 30 is active on partition 1 when we join
        sub = Subscription(catalog.url, "prices", token, start="snapshot")
        for e in range(31, 40):
            epoch(e, final=e == 39)
        items = sub.epochs()
        for pub in pubs:
            pub.advance([])
            pub.finish(linger=1)
    first, rest = items[0], items[1:]
    assert isinstance(first, Snapshot) and all(isinstance(i, Epoch) for i in rest)
    assert first.as_of == [30]  # both partitions had passed epoch 29, not 30
    truth = pd.DataFrame(history, columns=["t", "k", "v"])
    before = truth[truth.t < 30].drop_duplicates("k", keep="last").set_index("k")["v"].to_dict()
    assert first.batch is not None
    assert dict(zip(first.batch.column("k").to_pylist(), first.batch.column("v").to_pylist(),
                    strict=True)) == before
    assert [i.time for i in rest] == list(range(30, 40))
    for item in rest:
        rows = sorted(zip(item.batch.column("k").to_pylist(), item.batch.column("v").to_pylist(),
                          strict=True))
        assert rows == sorted((k, v) for t, k, v in history if t == item.time)


def test_snapshot_of_a_stream_without_key_is_refused() -> None:
    token = wire.new_token()
    pub = Publisher("plain", 0, 1, token)
    with Catalog(token=token) as catalog:
        pub.register(catalog.url, "int")
        pub.advance([5])
        sub = Subscription(catalog.url, "plain", token, start="snapshot")
        with pytest.raises(wire.ProtocolError, match="without a key"):
            sub.epochs(limit=1)
    pub.finish(linger=0)
