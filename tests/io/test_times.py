"""Time units of input columns (``tokenflow.io.times``): every unit converted or refused.

Expected values are computed independently of the code under test: with Python's ``datetime``
(UTC, integer arithmetic on ``timedelta``) and floor division by the unit's ticks per ms.

* ``timestamp[s|ms|us|ns]`` (with or without time zone) and ``date32`` / ``date64`` become ms
  since the Unix epoch, floored (a time before 1970 just below a whole ms is the ms before it).
* Integers of any width are taken as ms; a ``uint64`` beyond int64 and a ``timestamp[s]``
  beyond int64 ms are refused (not wrapped around).
* Whole floats are accepted only where allowed; strings, decimals, durations and booleans are
  refused; a null is refused, naming the row.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenflow.io.times import InputError, column_times, epoch_ms, event_times, round_down

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
INSTANTS = [
    dt.datetime(2015, 7, 15, 0, 0, 0, 999_999, tzinfo=dt.UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999_500, tzinfo=dt.UTC),  # -0.5 ms -> -1 ms
    dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2262, 4, 11, tzinfo=dt.UTC),  # near the end of timestamp[ns]
]


def where(i: int) -> str:
    return f"input 'x', column 't', row {i}"


def expected_ms(instant: dt.datetime) -> int:
    delta = instant - EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros // 1000  # floor


@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Kolkata", "America/New_York"])
@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_become_floored_ms(unit: str, tz: str | None) -> None:
    keep = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 1}[unit]  # µs representable in the unit
    instants = [i.replace(microsecond=i.microsecond // keep * keep) for i in INSTANTS]
    naive = [i.replace(tzinfo=None) for i in instants]
    array = pa.array(naive, pa.timestamp("us")).cast(pa.timestamp(unit, tz))  # exact: whole µs
    got = epoch_ms(array, where)
    assert got.dtype == np.int64
    assert got.tolist() == [expected_ms(i) for i in instants]


def test_sub_microsecond_nanoseconds_floor() -> None:
    array = pa.array([-1, 1, 999_999, 1_000_000, -1_000_001], pa.timestamp("ns"))
    assert epoch_ms(array, where).tolist() == [-1, 0, 0, 1, -2]


def test_dates_become_ms_at_midnight_utc() -> None:
    days = [dt.date(2015, 7, 15), dt.date(1969, 12, 31), dt.date(1970, 1, 1)]
    want = [(d - dt.date(1970, 1, 1)).days * 86_400_000 for d in days]
    assert epoch_ms(pa.array(days, pa.date32()), where).tolist() == want
    assert epoch_ms(pa.array(days, pa.date64()), where).tolist() == want


@pytest.mark.parametrize("kind", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(),
                                  pa.uint32(), pa.uint64()])
def test_integers_are_taken_as_ms(kind: pa.DataType) -> None:
    assert epoch_ms(pa.array([0, 5, 100], kind), where).tolist() == [0, 5, 100]


def test_uint64_beyond_int64_is_refused_not_wrapped() -> None:
    with pytest.raises(InputError, match=r"row 1: event time 9223372036854775808 is out of range"):
        epoch_ms(pa.array([1, 2**63], pa.uint64()), where)


def test_seconds_beyond_int64_ms_are_refused_not_wrapped() -> None:
    with pytest.raises(InputError, match=r"row 2: event time 10000000000000000 s is out of range"):
        epoch_ms(pa.array([0, 1, 10**16], pa.timestamp("s")), where)


def test_whole_floats_only_where_allowed() -> None:
    assert epoch_ms(pa.array([1.0, 2.0]), where).tolist() == [1, 2]
    with pytest.raises(InputError, match=r"row 1: non-integer event time 2.5"):
        epoch_ms(pa.array([1.0, 2.5]), where)
    with pytest.raises(InputError, match=r"row 0: dateTime has type double, not an integer \(ms\), "
                                         r"a timestamp or a date \(value 1.0\)"):
        epoch_ms(pa.array([1.0, 2.0]), where, floats=False, what="dateTime")


@pytest.mark.parametrize(("array", "type_name"), [
    (pa.array(["2015-07-15"]), "string"),
    (pa.array([Decimal("1.5")]), "decimal128"),
    (pa.array([dt.timedelta(seconds=1)]), "duration"),
    (pa.array([True]), "bool"),
])
def test_other_types_are_refused_naming_the_type(array: pa.Array, type_name: str) -> None:
    with pytest.raises(InputError, match=rf"input 'x', column 't', row 0: event time has type "
                                         rf"{type_name}"):
        epoch_ms(array, where)


@pytest.mark.parametrize("kind", [pa.int64(), pa.timestamp("us"), pa.date32(), pa.float64()])
def test_null_is_refused_naming_the_row(kind: pa.DataType) -> None:
    raw = pa.int32() if kind == pa.date32() else pa.int64()
    chunked = pa.chunked_array([pa.array([0, 1], raw), pa.array([2, None], raw)]).cast(kind)
    with pytest.raises(InputError, match=r"input 'x', column 't', row 3: null event time"):
        epoch_ms(chunked, where)


def test_event_times_and_column_times_name_input_column_and_row() -> None:
    batch = pa.record_batch({"t": pa.array([0, None], pa.timestamp("ms"))})
    with pytest.raises(InputError, match=r"input 'events', column 't', row 11: null event time"):
        event_times(batch, "t", "events", 10)
    with pytest.raises(InputError, match=r"source 'S', split 'k': no time column 'u'"):
        column_times(batch, "u", "source 'S', split 'k'", 0)


@given(st.lists(st.integers(-(2**62), 2**62), max_size=50), st.integers(1, 10**9))
def test_round_down_is_the_largest_multiple_of_step_not_above_each_value(values: list[int],
                                                                           step: int) -> None:
    """Against Python's integers: ``v - v % step`` (floored for negative values too)."""
    got = round_down(np.array(values, dtype=np.int64), step)
    assert got.dtype == np.int64
    assert got.tolist() == [v - v % step for v in values]
