"""``tokenflow.nexmark`` generator and source against independent expectations.

* ``ref_event``: a plain scalar re-implementation of docs/NEXMARK.md's draws (one ``RefRandom`` —
  java.util.Random transcribed here — per event), compared field by field with the vectorized
  generator on the first 500 events, a window at event 1,000,000 and a non-default config.
* Literal events and SHA-256 digests of 100,000+ events printed by a throwaway Java 17
  program that follows Beam's generator classes with ``java.util.Random`` (format: one line per
  event, ``P|id|name|email|card|city|state|dateTime|extra``, ``A|id|itemName|description|
  initialBid|reserve|dateTime|expires|seller|category|extra``, ``B|auction|bidder|price|
  dateTime|extra``).
* Counting and range properties from the spec (1:3:46, dateTime formula, id ranges).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenflow import execute
from tokenflow.nexmark import (
    BASE_TIME_MS,
    SCHEMAS,
    GeneratorConfig,
    events_for_worker,
    expected_counts,
    generate,
    nexmark_source,
    worker_blocks,
    write_parquet,
)
from tokenflow.nexmark.generator import next_string_stepwise, schema, string_characters
from tokenflow.nexmark.javarandom import LaneRandom

pytestmark = pytest.mark.timeout(120)

MASK48 = (1 << 48) - 1


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


class RefRandom:
    """java.util.Random (OpenJDK 17), scalar."""

    def __init__(self, seed: int) -> None:
        self.seed = (seed ^ 0x5DEECE66D) & MASK48

    def next(self, bits: int) -> int:
        self.seed = (self.seed * 0x5DEECE66D + 0xB) & MASK48
        return _int32(self.seed >> (48 - bits))

    def next_int(self, bound: int | None = None) -> int:
        if bound is None:
            return self.next(32)
        r = self.next(31)
        m = bound - 1
        if bound & m == 0:
            return (bound * r) >> 31
        u = r
        while True:
            r = u % bound
            if _int32(u - r + m) >= 0:
                return r
            u = self.next(31)

    def next_double(self) -> float:
        return ((self.next(26) << 27) + self.next(27)) / float(1 << 53)


# -- the spec, scalar ------------------------------------------------------------------------

FIRST = "Peter,Paul,Luke,John,Saul,Vicky,Kate,Julie,Sarah,Deiter,Walter".split(",")
LAST = "Shultz,Abrams,Spencer,White,Bartels,Walton,Smith,Jones,Noris".split(",")
CITIES = ("Phoenix,Los Angeles,San Francisco,Boise,Portland,Bend,Redmond,Seattle,Kent,"
          "Cheyenne").split(",")
STATES = "AZ,CA,ID,OR,WA,WY".split(",")


def java_round(x: float) -> int:
    return math.floor(x + 0.5)


def ref_string(r: RefRandom, max_length: int) -> str:
    out = []
    for _ in range(3 + r.next_int(max_length - 3)):
        out.append(" " if r.next_int(13) == 0 else chr(ord("a") + r.next_int(26)))
    return "".join(out).strip(" ")


def ref_exact_string(r: RefRandom, length: int) -> str:
    out = []
    rnd = n = 0
    for _ in range(length):
        if n == 0:
            rnd = r.next_int()
            n = 6
        rem = int(math.fmod(rnd, 26))  # Java's % keeps the dividend's sign
        out.append(chr(ord("a") + rem))
        rnd = int(rnd / 26)  # Java's / truncates toward zero
        n -= 1
    return "".join(out)


def ref_extra(r: RefRandom, current: int, average: int) -> str:
    if current > average:
        return ""
    d = average - current
    delta = java_round(d * 0.2)
    return ref_exact_string(r, d - delta + (0 if delta == 0 else r.next_int(2 * delta)))


def ref_price(r: RefRandom) -> int:
    return java_round(math.pow(10.0, r.next_double() * 6.0) * 100.0)


def ref_last_person(event_id: int) -> int:
    return event_id // 50


def ref_last_auction(event_id: int) -> int:
    epoch, off = divmod(event_id, 50)
    if off < 1:
        epoch -= 1
        off = 2
    elif off >= 4:
        off = 2
    else:
        off -= 1
    return epoch * 3 + off


def ref_next_person(r: RefRandom, event_id: int, active_people: int = 1000) -> int:
    num = ref_last_person(event_id) + 1
    active = min(num, active_people)
    return num - active + r.next_int(active + 10)


def ref_next_auction(r: RefRandom, event_id: int, in_flight: int = 100) -> int:
    last = ref_last_auction(event_id)
    lo = max(last - in_flight, 0)
    return lo + r.next_int(last - lo + 1 + 10)


def ref_time(n: int, rate: int, base: int = BASE_TIME_MS) -> int:
    return base + n * ((1_000_000 + rate // 2) // rate) // 1000


def ref_event(n: int, rate: int = 10_000, first_event_id: int = 0) -> tuple[str, dict]:
    """Event number ``n`` per docs/NEXMARK.md, as (kind, Beam-named fields)."""
    event_id = first_event_id + n
    r = RefRandom(event_id)
    t = ref_time(n, rate)
    rem = event_id % 50
    if rem < 1:
        name = FIRST[r.next_int(11)] + " " + LAST[r.next_int(9)]
        email = ref_string(r, 7) + "@" + ref_string(r, 5) + ".com"
        card = " ".join(f"{r.next_int(10000):04d}" for _ in range(4))
        city = CITIES[r.next_int(10)]
        state = STATES[r.next_int(6)]
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        return "person", {"id": ref_last_person(event_id) + 1000, "name": name, "emailAddress": email,
                          "creditCard": card, "city": city, "state": state, "dateTime": t,
                          "extra": ref_extra(r, size, 200)}
    if rem < 4:
        if r.next_int(4) > 0:
            seller = ref_last_person(event_id) // 100 * 100
        else:
            seller = ref_next_person(r, event_id)
        category = 10 + r.next_int(5)
        initial = ref_price(r)
        horizon = ref_time(n + 1666, rate) - t
        expires = t + 1 + r.next_int(max(2 * horizon, 1))
        item = ref_string(r, 20)
        desc = ref_string(r, 100)
        reserve = initial + ref_price(r)
        extra = ref_extra(r, 8 + len(item) + len(desc) + 40, 500)
        return "auction", {"id": ref_last_auction(event_id) + 1000, "itemName": item,
                           "description": desc, "initialBid": initial, "reserve": reserve,
                           "dateTime": t, "expires": expires, "seller": seller + 1000,
                           "category": category, "extra": extra}
    if r.next_int(2) > 0:
        auction = ref_last_auction(event_id) // 100 * 100
    else:
        auction = ref_next_auction(r, event_id)
    if r.next_int(4) > 0:
        bidder = ref_last_person(event_id) // 100 * 100 + 1
    else:
        bidder = ref_next_person(r, event_id)
    price = ref_price(r)
    return "bid", {"auction": auction + 1000, "bidder": bidder + 1000, "price": price, "dateTime": t,
                   "extra": ref_extra(r, 32, 100)}


def ref_events(first: int, count: int, **kw: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"person": [], "auction": [], "bid": []}
    for n in range(first, first + count):
        kind, row = ref_event(n, **kw)
        out[kind].append(row)
    return out


def rows(data: dict[str, pa.RecordBatch]) -> dict[str, list[dict]]:
    return {kind: batch.to_pylist() for kind, batch in data.items()}


def assert_same_events(got: dict[str, list[dict]], want: dict[str, list[dict]]) -> None:
    for kind in ("person", "auction", "bid"):
        assert len(got[kind]) == len(want[kind]), kind
        for i, (g, w) in enumerate(zip(got[kind], want[kind], strict=True)):
            for field in w:  # field by field, for a readable failure
                assert g[field] == w[field], (kind, i, field)
            assert list(g) == list(w), kind


# -- field-by-field comparisons ----------------------------------------------------------------


def test_first_500_events_field_by_field() -> None:
    assert_same_events(rows(generate(0, 500)), ref_events(0, 500))


def test_window_at_one_million_field_by_field() -> None:
    assert_same_events(rows(generate(1_000_000, 500)), ref_events(1_000_000, 500))


def test_other_config_field_by_field() -> None:
    config = GeneratorConfig(rate=1000, first_event_id=7)
    got = rows(generate(40_000, 300, config))
    assert_same_events(got, ref_events(40_000, 300, rate=1000, first_event_id=7))


# Printed by the Java program (events 0-5 and 1,000,000-1,000,004, rate 10,000).
JAVA_PERSON_0 = ("P|1000|Peter Jones|nhd@xcat.com|7241 7320 9143 4888|Portland|WY|1436918400000|"
                 "WN_HS_bnpkkiwhwana_L^`KZjdgsid`K]MLU[aaOH`ztxbulvlxtkn_ZZ^T\\mqgdjzvlkymsmfrhkfVYSXK"
                 "_OY[aVYVKa\\X^]RO]OYguwiduWJNQLLaMLHOTaHY_J[YKWaUOSJN_VHWXZ]`SgbnjqeVVQ\\[[")
JAVA_AUCTION_2 = ("A|1001|z ck w|cwlachrnkfzkygsu edjytotggvasbt z yjjszhhsqtrgzblkaolzkhlldqedvgj "
                  "fdbvswemnzshmwipqrzqfkd|25626290|28805847|1436918400000|1436918400202|1000|12|")
JAVA_BID_4 = ("B|1000|1001|32530001|1436918400000|fdiysaV^]NLVsbolvyqwgticfdrwdyiyofziYMU\\Z`UaTQO]"
              "[NX\\RM]WPYTOuwogvszlxjrcNOORM")
JAVA_PERSON_1000000 = ("P|21000|Walter Bartels|iwr@slvg.com|6116 7972 7395 9909|Phoenix|ID|"
                       "1436918500000|")
JAVA_AUCTION_1000003 = ("A|61002|kntlf|zmlhzksbliixyzgfmibyn  q umrpehggvaomrfgvpdakmm oxjmrdrrwtx "
                        "jgor xvznlrtaiprjgumq krnmiwzkzajdwd|24415014|26958646|1436918500000|"
                        "1436918500202|21000|10|")
JAVA_BID_1000004 = ("B|60927|21001|1291|1436918500000|Y[MYJZLRST`IYW[UaSlmaiedzjnekjifpfqtZNQPMLRSNOT_"
                    "hivreagyxdgnIIHTV\\h")
JAVA_BIDS_FIRST_ID_7 = [  # rate 1000, first_event_id 7: event numbers 0, 1, 2
    "B|1000|1001|3126206|1436918400000|byxajvVIJV^VKUUY`RJaVNU`^QIWNHgdvnfxZQ]H_PbustqrpqasinNX`Q[_YKKNP\\",
    "B|1000|1001|381373|1436918400001|tvifttQHQ]]PgmsejhHYJQY^dlgjuzOJJXTIknsmohhrndveLW`UZ\\LV^\\S\\UIHPQ"
    "\\jalhaxxy",
    "B|1000|1001|3968405|1436918400002|^H[JKaP]JVKP_JOO[_UV\\]THpgkzeagvhzskkjkgkx\\^O[SPQMVX\\T\\UN",
]
JAVA_SHA256 = {  # sha256 of the Java program's output (one "\n"-terminated line per event)
    (0, 100_000, 10_000, 0): "0f5ec116e86615818a4e2ca33d7514b4b6176c4c9ad4216e207438d857e10075",
    (1_000_000, 50_000, 10_000, 0): "a9e86c182e6b289be422916d24bd8b3c74bb9becd23e26c11406ada9f8909c2a",
    (0, 20_000, 1000, 7): "4be68d17086c90b76b3253d61dd12d4a551b9cad36dc6b3b59a24f86675df0d3",
}


def java_lines(first: int, count: int, config: GeneratorConfig) -> list[str]:
    """The generator's events ``[first, first + count)`` in the Java program's line format."""
    data = generate(first, count, config)
    columns = {kind: [[str(v) for v in col.to_pylist()] for col in batch.columns]
               for kind, batch in data.items()}
    cursor = {"person": 0, "auction": 0, "bid": 0}
    tags = {"person": "P", "auction": "A", "bid": "B"}
    lines = []
    for n in range(first, first + count):
        rem = (n + config.first_event_id) % 50
        kind = "person" if rem < 1 else "auction" if rem < 4 else "bid"
        i = cursor[kind]
        cursor[kind] += 1
        lines.append("|".join([tags[kind]] + [col[i] for col in columns[kind]]))
    return lines


def test_literal_events_printed_by_java() -> None:
    lines = java_lines(0, 6, GeneratorConfig())
    assert lines[0] == JAVA_PERSON_0
    assert lines[2].startswith(JAVA_AUCTION_2)
    assert lines[4] == JAVA_BID_4
    lines = java_lines(1_000_000, 5, GeneratorConfig())
    assert lines[0].startswith(JAVA_PERSON_1000000)
    assert lines[3].startswith(JAVA_AUCTION_1000003)
    assert lines[4] == JAVA_BID_1000004
    assert java_lines(0, 3, GeneratorConfig(rate=1000, first_event_id=7)) == JAVA_BIDS_FIRST_ID_7


@pytest.mark.parametrize(("first", "count", "rate", "first_id"), list(JAVA_SHA256))
def test_digest_matches_java(first: int, count: int, rate: int, first_id: int) -> None:
    lines = java_lines(first, count, GeneratorConfig(rate=rate, first_event_id=first_id))
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode("ascii")).hexdigest()
    assert digest == JAVA_SHA256[(first, count, rate, first_id)]


# -- string helpers ------------------------------------------------------------------------------


def _inverse_step(state: int) -> int:
    return ((state - 0xB) * pow(0x5DEECE66D, -1, 1 << 48)) & MASK48


def _forced_states(zone: int) -> list[int]:
    """States whose first ``nextString`` character hits a rejection zone: ``nextInt(13)``
    rejects ``next(31) >= 2147483637`` (zone 13); ``nextInt(26)``, drawn after a letter flag,
    rejects ``>= 2147483624`` (zone 26)."""
    if zone == 13:
        return [_inverse_step(s1) for s1 in ((2147483640 << 17) | 12345, 2147483647 << 17)]
    states = []
    for low in range(1, 500):
        s1 = _inverse_step((2147483630 << 17) | low)  # the letter draw falls in the zone
        if (s1 >> 17) % 13 != 0 and (s1 >> 17) < 2147483637:
            states.append(_inverse_step(s1))
        if len(states) == 2:
            return states
    raise AssertionError("no state found")


@pytest.mark.parametrize("zone", [13, 26])
def test_string_fast_path_equals_stepwise_including_rejections(zone: int) -> None:
    rng = np.random.default_rng(5)
    seeds = rng.integers(0, 2**62, size=3000)
    lengths = rng.integers(3, 100, size=3000)
    forced = _forced_states(zone)
    fast = LaneRandom(seeds)
    fast.state[: len(forced)] = forced
    slow = LaneRandom(seeds)
    slow.state[:] = fast.state
    a = string_characters(fast, lengths)
    b = next_string_stepwise(slow, lengths)
    assert (fast.state == slow.state).all()
    assert (a.keep == b.keep).all()
    assert (np.where(a.keep, a.chars, 0) == np.where(b.keep, b.chars, 0)).all()
    for i, state in enumerate(forced):  # and against the scalar reference
        r = RefRandom(0)
        r.seed = state
        expected = "".join(" " if r.next_int(13) == 0 else chr(97 + r.next_int(26))
                           for _ in range(lengths[i]))
        assert bytes(a.chars[i][a.keep[i]]).decode() == expected
        assert int(fast.state[i]) == r.seed


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lanes=st.integers(0, 300), most=st.integers(0, 100))
def test_string_characters_equal_the_stepwise_draws(seed: int, lanes: int, most: int) -> None:
    """The closed form (no rejection in these draws: probability ~1e-8 each) against the
    position-by-position draw, and its first lanes against the scalar reference."""
    rng = np.random.default_rng(seed)
    seeds = rng.integers(-(2**63), 2**63 - 1, size=lanes)
    lengths = rng.integers(0, most + 1, size=lanes)
    fast, slow = LaneRandom(seeds), LaneRandom(seeds)
    a = string_characters(fast, lengths)
    b = next_string_stepwise(slow, lengths)
    assert (fast.state == slow.state).all()
    assert a.keep.shape == b.keep.shape and (a.keep == b.keep).all()
    assert (np.where(a.keep, a.chars, 0) == np.where(b.keep, b.chars, 0)).all()
    for i in range(min(lanes, 3)):
        r = RefRandom(int(seeds[i]))
        expected = "".join(" " if r.next_int(13) == 0 else chr(97 + r.next_int(26))
                           for _ in range(lengths[i]))
        assert bytes(a.chars[i][a.keep[i]]).decode() == expected
        assert int(fast.state[i]) == r.seed


def test_strings_are_trimmed_and_bounded() -> None:
    data = generate(0, 20_000)
    for column, max_length in (("itemName", 19), ("description", 99)):
        values = data["auction"].column(column).to_pylist()
        assert all(v == v.strip(" ") and len(v) <= max_length for v in values)
        assert any(" " in v for v in values)
        assert set("".join(values)) <= set(" abcdefghijklmnopqrstuvwxyz")
    extras = data["bid"].column("extra").to_pylist()
    assert {len(e) for e in extras} == set(range(54, 82))  # 68 - 14 + nextInt(28)
    assert set("".join(extras)) <= {chr(c) for c in range(ord("H"), ord("z") + 1)}


# -- counts, times, ranges ---------------------------------------------------------------------


@pytest.mark.parametrize(("first", "count", "first_id"), [(0, 50_000, 0), (17, 1234, 0), (3, 4321, 49)])
def test_proportions_1_3_46(first: int, count: int, first_id: int) -> None:
    config = GeneratorConfig(first_event_id=first_id)
    data = generate(first, count, config)
    kinds = [(n + first_id) % 50 for n in range(first, first + count)]
    want = {"person": sum(k == 0 for k in kinds), "auction": sum(1 <= k <= 3 for k in kinds)}
    want["bid"] = count - want["person"] - want["auction"]
    assert {k: b.num_rows for k, b in data.items()} == want == expected_counts(first, count, config)
    if first == 0 and count % 50 == 0:
        assert want == {"person": count // 50, "auction": 3 * count // 50, "bid": 46 * count // 50}


@pytest.mark.parametrize(("rate", "delay_us"), [(10_000, 100), (3, 333_333), (7, 142_857), (1, 1_000_000)])
def test_date_time_formula(rate: int, delay_us: int) -> None:
    config = GeneratorConfig(rate=rate)
    assert config.inter_event_delay_us == delay_us
    data = generate(0, 200, config)
    times = {"person": [], "auction": [], "bid": []}
    for n in range(200):
        rem = n % 50
        kind = "person" if rem < 1 else "auction" if rem < 4 else "bid"
        times[kind].append(1_436_918_400_000 + n * delay_us // 1000)
    for kind, batch in data.items():
        assert batch.column("dateTime").to_pylist() == times[kind]


def test_base_time_is_2015_07_15_utc() -> None:
    import datetime

    assert BASE_TIME_MS == int(datetime.datetime(2015, 7, 15, tzinfo=datetime.UTC).timestamp() * 1000)
    assert GeneratorConfig().base_time_ms == BASE_TIME_MS


def test_id_ranges() -> None:
    first, count = 200_000, 60_000
    data = generate(first, count)
    n = np.arange(first, first + count)
    person_n, auction_n, bid_n = n[n % 50 == 0], n[(n % 50 >= 1) & (n % 50 < 4)], n[n % 50 >= 4]
    person = data["person"].to_pydict()
    auction = data["auction"].to_pydict()
    bid = data["bid"].to_pydict()
    assert person["id"] == (1000 + person_n // 50).tolist()
    assert auction["id"] == list(range(1000 + first // 50 * 3, 1000 + (first + count) // 50 * 3))
    for i, k in enumerate(auction_n.tolist()):
        lp = k // 50  # last person, base 0 (> 1000 here, so 1000 people are active)
        seller = auction["seller"][i] - 1000
        assert seller == lp // 100 * 100 or lp + 1 - 1000 <= seller <= lp + 10
        assert 10 <= auction["category"][i] <= 14
        t = auction["dateTime"][i]
        assert t < auction["expires"][i] <= t + 2 * 167  # horizon: 1666 events = 166.6 ms
        assert auction["reserve"][i] >= auction["initialBid"][i] + 100
        assert 100 <= auction["initialBid"][i] <= 10**8
    hot_auctions = hot_bidders = 0
    for i, k in enumerate(bid_n.tolist()):
        lp = k // 50
        la = k // 50 * 3 + 2  # last auction, base 0, for a bid
        a = bid["auction"][i] - 1000
        if a == la // 100 * 100:
            hot_auctions += 1
        else:
            assert la - 100 <= a <= la + 10
        b = bid["bidder"][i] - 1000
        if b == lp // 100 * 100 + 1:
            hot_bidders += 1
        else:
            assert lp + 1 - 1000 <= b <= lp + 10
        assert 100 <= bid["price"][i] <= 10**8
    # P(hot) = 1 - 1/2 for auctions, 1 - 1/4 for bidders (plus a small chance of a cold hit).
    assert 0.48 < hot_auctions / len(bid_n) < 0.53
    assert 0.73 < hot_bidders / len(bid_n) < 0.77


def test_schemas_and_types() -> None:
    data = generate(0, 100)
    assert data["person"].schema.names == ["id", "name", "emailAddress", "creditCard", "city", "state",
                                           "dateTime", "extra"]
    assert data["auction"].schema.names == ["id", "itemName", "description", "initialBid", "reserve",
                                            "dateTime", "expires", "seller", "category", "extra"]
    assert data["bid"].schema.names == ["auction", "bidder", "price", "dateTime", "extra"]
    for kind, batch in data.items():
        assert batch.schema == SCHEMAS[kind]
        for field in batch.schema:
            assert field.type in (pa.int64(), pa.utf8())
        batch.validate(full=True)


def test_generate_is_chunk_independent_and_handles_empty() -> None:
    whole = generate(60_000, 140_000)  # crosses internal chunk boundaries
    parts = [generate(60_000, 70_001), generate(130_001, 69_999)]
    for kind in ("person", "auction", "bid"):
        joined = pa.Table.from_batches([p[kind] for p in parts])
        assert pa.Table.from_batches([whole[kind]]).equals(joined)
    empty = generate(5, 0)
    assert all(b.num_rows == 0 and b.schema == SCHEMAS[k] for k, b in empty.items())
    with pytest.raises(ValueError):
        generate(-1, 5)


@pytest.mark.parametrize(("first", "count"), [(0, 500), (60_000, 140_000), (7, 0)])
def test_events_without_the_padding_are_the_same_events_less_that_column(first: int,
                                                                         count: int) -> None:
    """``extra=False`` (a query that does not read the padding): every kind's batch is the full
    batch without ``extra``, value for value (the padding is each event's last draw), across
    internal chunks and for no events."""
    full, bare = generate(first, count), generate(first, count, extra=False)
    for kind in ("person", "auction", "bid"):
        assert "extra" in full[kind].schema.names and "extra" not in bare[kind].schema.names
        assert bare[kind].schema == schema(kind, extra=False)
        expected = full[kind].drop_columns(["extra"])
        assert bare[kind].equals(expected), kind
        bare[kind].validate(full=True)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        GeneratorConfig(rate=0)
    with pytest.raises(NotImplementedError):
        GeneratorConfig(out_of_order_group_size=2)
    with pytest.raises(ValueError):
        GeneratorConfig(hot_bidders_ratio=0)


# -- sharing out, Parquet, dataflow ------------------------------------------------------------


def test_events_for_worker_partitions_in_time_order() -> None:
    total, batch, peers = 23_456, 1000, 3
    whole = generate(0, total)
    shares = [list(events_for_worker(w, peers, total, batch)) for w in range(peers)]
    assert [len(s) for s in shares] == [8, 8, 8]  # 24 blocks, the last partial
    assert list(worker_blocks(2, peers, total, batch))[-1] == (23_000, 456)
    for kind in ("person", "auction", "bid"):
        for share in shares:
            times = np.concatenate([b[kind].column("dateTime").to_numpy() for b in share])
            assert (np.diff(times) >= 0).all()
        blocks = sorted((b for s in shares for b in s), key=lambda d: d["bid"].column("dateTime")[0].as_py())
        joined = pa.Table.from_batches([b[kind] for b in blocks])
        assert joined.equals(pa.Table.from_batches([whole[kind]]))


def test_write_parquet_round_trip(tmp_path: Path) -> None:
    counts = write_parquet(tmp_path, 12_345, rate=1000, batch=5000)
    whole = generate(0, 12_345, GeneratorConfig(rate=1000))
    assert counts == {k: b.num_rows for k, b in whole.items()}
    for kind, batch in whole.items():
        table = pq.read_table(tmp_path / kind)
        assert table.equals(pa.Table.from_batches([batch]))


def _run_source(workers: int, events: int, batch: int, granularity: int = 1) -> list[dict]:
    def job(worker: object) -> dict:
        def build(scope: object) -> tuple[dict, dict]:
            streams = nexmark_source(scope, events, GeneratorConfig(), batch=batch,
                                     granularity_ms=granularity)
            return ({k: s.capture() for k, s in streams.items()},
                    {k: s.probe() for k, s in streams.items()})

        captures, probes = worker.dataflow(build)  # type: ignore[attr-defined]
        worker.step_while(lambda: not all(p.done() for p in probes.values()))  # type: ignore[attr-defined]
        return captures

    return execute(job, workers=workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_source_emits_every_event_at_its_date_time(workers: int) -> None:
    events, batch = 23_000, 2_000
    results = _run_source(workers, events, batch)
    whole = generate(0, events)
    for kind in ("person", "auction", "bid"):
        messages = [m for r in results for m in r[kind].events]
        for time, records in messages:
            assert set(records.column("dateTime").to_pylist()) == {time}
        key = ["dateTime"] + [c for c in SCHEMAS[kind].names if c != "dateTime"]
        got = pa.Table.from_batches([b for _, b in messages], schema=SCHEMAS[kind])
        want = pa.Table.from_batches([whole[kind]])
        order = [(c, "ascending") for c in key]
        assert got.sort_by(order).equals(want.sort_by(order))
        for r in results:
            frontiers = [f[0] if f else None for f in r[kind].frontiers]
            assert frontiers[-1] is None  # the tokens were dropped
            steps = [f for f in frontiers if f is not None]
            assert steps == sorted(steps)
            assert len(steps) >= 3  # the token was downgraded block by block


def test_source_granularity_floors_times() -> None:
    results = _run_source(1, 9_000, 3_000, granularity=250)
    messages = [m for kind in ("person", "auction", "bid") for m in results[0][kind].events]
    assert messages
    for time, records in messages:
        times = records.column("dateTime").to_numpy()
        assert time % 250 == 0
        assert ((times >= time) & (times < time + 250)).all()
    assert sum(len(b) for _, b in messages) == 9_000
