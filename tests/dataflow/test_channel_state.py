"""``ChannelState``: the messages sent across an aligned checkpoint's cut, stored under the
worker's home bin, loaded by the bin's owner on restore and handed to each operator once; the
bins it was loaded from are exported again (empty) so that a later checkpoint built on the
restored snapshot does not keep messages that were already sent again."""

from __future__ import annotations

import pyarrow as pa

from tokenflow.dataflow.channel_state import SCHEMA, ChannelState
from tokenflow.worker import Traffic


def state(home: int) -> ChannelState:
    s = ChannelState()
    s.attach(64, home)
    return s


def test_export_load_round_trip_hands_each_operator_its_messages_once() -> None:
    batch = pa.record_batch({"x": [1, 2]})
    entries = [((0, 5), 0, (12, ["a", "b"])), ((0, 5), 1, (13, batch)), ((1, 2, 3), 0, (12, [("w", 1)]))]
    writer = state(home=7)
    writer.record(entries)
    exported = writer.export()
    assert list(exported) == [7] and exported[7].schema == SCHEMA and exported[7].num_rows == 3
    assert writer.export([1, 2]) == {}  # not a bin it exports under
    other = state(home=9)
    other.record([((0, 5), 0, (14, ["c"]))])
    reader = state(home=0)
    reader.load({7: exported[7], 9: other.export()[9]})
    first = reader.take((0, 5))
    assert [(p, m[0]) for p, m in first] == [(0, 12), (1, 13), (0, 14)]
    assert first[0][1][1] == ["a", "b"] and first[1][1][1].equals(batch)
    assert reader.take((0, 5)) == []  # once
    assert reader.take((1, 2, 3)) == [(0, (12, [("w", 1)]))]
    assert reader.take((4,)) == []


def test_changes_name_the_home_bin_when_messages_come_or_go_and_the_loaded_bins() -> None:
    s = state(home=3)
    assert s.take_changes() == set()
    s.record([])
    assert s.take_changes() == set()  # nothing then, nothing now
    s.record([((0, 1), 0, (5, [1]))])
    assert s.take_changes() == {3}
    s.record([])
    assert s.take_changes() == {3}  # gone: the bin is written empty
    restored = state(home=3)
    other = state(home=8)
    other.record([((0, 1), 0, (5, [1]))])
    restored.load({8: other.export()[8]})
    restored.mark_unchanged()
    assert restored.take_changes() == {8}  # the next checkpoint empties the loaded bin
    assert restored.export([8]) == {}
    assert restored.take_changes() == set()


def test_traffic_keeps_only_the_records_at_or_after_the_epoch() -> None:
    traffic = Traffic()
    traffic.cross((0, 1), 0, (9, ["early"]), 1)
    traffic.cross((0, 1), 0, (10, ["a", "b"]), 4)  # e.g. a broadcast to two workers
    traffic.cross((0, 2), 1, ((11, 3), ["nested"]), 1)  # a nested time: its outer coordinate
    entries, counted = traffic.take_crossing(10)
    assert entries == [((0, 1), 0, (10, ["a", "b"])), ((0, 2), 1, ((11, 3), ["nested"]))]
    assert counted == 5 and traffic.crossing == []
