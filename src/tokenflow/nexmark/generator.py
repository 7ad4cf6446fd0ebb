"""A vectorized, Beam-compatible NEXMark event generator, and a dataflow source for it.

Source: docs/NEXMARK.md ("Generator"), which follows Apache Beam's
``sdks/java/testing/nexmark/.../sources/generator`` (``GeneratorConfig``, ``Generator`` and
``model/{Person,Auction,Bid,Strings,Price,Long}Generator``).  Event number ``n`` (0, 1, ...)
has ``eventId = first_event_id + n`` and draws every random value from its own
``java.util.Random(eventId)``, so any range of events can be generated independently and the
output equals Beam's event for event.

Vectorization: a range of event numbers is split by kind (``eventId % 50``: 0 person, 1–3
auction, else bid); each kind keeps one 48-bit LCG state per event ("lane", see
``javarandom.LaneRandom``) and performs the spec's draws in the spec's order on all its lanes
at once.  Conditional draws (a cold seller/auction/bidder) advance only the lanes that take
them; rejection loops of ``nextInt(bound)`` re-draw only the rejected lanes; strings are built
position by position over a ``(lanes, max length)`` byte matrix with a keep mask (per-lane
lengths, spaces, Java's ``trim``), then turned into Arrow ``utf8`` arrays without Python
objects per event.

Results are Arrow record batches with Beam's field names; ``int64`` ids, prices (cents) and
times (ms since the Unix epoch), ``utf8`` strings.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenflow.io.times import round_down
from tokenflow.nexmark.javarandom import INT_MAX, LaneRandom

BASE_TIME_MS = 1_436_918_400_000
"""2015-07-15T00:00:00Z in ms since the Unix epoch (Beam's ``NexmarkUtils.BASE_TIME``)."""

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION  # 50
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
MIN_STRING_LENGTH = 3

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter",
               "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")

KINDS = ("person", "auction", "bid")
"""Event kinds, in the order of ``nexmark_source``'s outputs."""

PERSON_SCHEMA = pa.schema([
    ("id", pa.int64()), ("name", pa.utf8()), ("emailAddress", pa.utf8()),
    ("creditCard", pa.utf8()), ("city", pa.utf8()), ("state", pa.utf8()),
    ("dateTime", pa.int64()), ("extra", pa.utf8()),
])
AUCTION_SCHEMA = pa.schema([
    ("id", pa.int64()), ("itemName", pa.utf8()), ("description", pa.utf8()),
    ("initialBid", pa.int64()), ("reserve", pa.int64()), ("dateTime", pa.int64()),
    ("expires", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
    ("extra", pa.utf8()),
])
BID_SCHEMA = pa.schema([
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
    ("dateTime", pa.int64()), ("extra", pa.utf8()),
])
SCHEMAS: dict[str, pa.Schema] = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}
PADDING = "extra"
"""Every kind's last field: padding up to the kind's average event size, drawn last from the
event's own generator, so leaving it out changes no other field (``generate(extra=False)``)."""


def schema(kind: str, extra: bool = True) -> pa.Schema:
    """The schema of ``kind``'s events, without the ``extra`` padding when ``extra`` is False."""
    full = SCHEMAS[kind]
    return full if extra else full.remove(full.get_field_index(PADDING))

CHUNK = 65_536
"""Events generated per vectorized pass inside ``generate`` (bounds temporary memory)."""


@dataclass(frozen=True)
class GeneratorConfig:
    """Generator parameters, with the defaults of docs/NEXMARK.md / Beam's ``NexmarkConfiguration``.

    Attributes:
        rate: events per second (``firstEventRate = nextEventRate``, one generator).
        first_event_id: ``eventId`` of event number 0 (the seed offset).
        base_time_ms: event time of event number 0, ms since the Unix epoch.
        avg_person_byte_size, avg_auction_byte_size, avg_bid_byte_size: ``nextExtra`` targets.
        hot_auction_ratio, hot_sellers_ratio, hot_bidders_ratio: ``nextInt(ratio) > 0`` picks
            the hot auction / seller / bidder.
        num_in_flight_auctions: auctions a bid may pick from (also sets auction lengths).
        num_active_people: people a new auction or bid may pick from.
        auction_skip: Q2's ``auction % auction_skip == 0`` (for the queries; not used here).
        out_of_order_group_size: must be 1 (events in event-time order).
    """

    rate: int = 10_000
    first_event_id: int = 0
    base_time_ms: int = BASE_TIME_MS
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    auction_skip: int = 123
    out_of_order_group_size: int = 1

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0 events/s, got {self.rate}")
        if self.first_event_id < 0:
            raise ValueError(f"first_event_id must be >= 0, got {self.first_event_id}")
        if self.out_of_order_group_size != 1:
            raise NotImplementedError("only out_of_order_group_size=1 (events in time order)")
        for name in ("hot_auction_ratio", "hot_sellers_ratio", "hot_bidders_ratio",
                     "num_active_people"):
            if not 1 <= getattr(self, name) < INT_MAX - PERSON_ID_LEAD:
                raise ValueError(f"{name} must be in [1, 2**31 - 12), got {getattr(self, name)}")
        if not 0 <= self.num_in_flight_auctions < INT_MAX - AUCTION_ID_LEAD - 1:
            raise ValueError(f"num_in_flight_auctions out of range: {self.num_in_flight_auctions}")
        if 2 * (self.auction_horizon_events * self.inter_event_delay_us // 1000 + 1) >= INT_MAX:
            raise NotImplementedError("auction lengths beyond 2**31 ms (Beam's nextLong path)")

    @property
    def inter_event_delay_us(self) -> int:
        """µs between events: ``(1_000_000 + rate // 2) // rate`` (Beam's ``rateToPeriodUs``)."""
        return (1_000_000 + self.rate // 2) // self.rate

    @property
    def auction_horizon_events(self) -> int:
        """Events until ``num_in_flight_auctions`` more auctions exist: ``100 * 50 // 3 = 1666``."""
        return self.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION

    def timestamp(self, n: Any) -> Any:
        """Event time (ms) of event number(s) ``n``: ``base + n * delay_us // 1000``."""
        return self.base_time_ms + (n * self.inter_event_delay_us) // 1000


# -- id arithmetic (vectorized; Beam's Person/AuctionGenerator) ----------------------------------


def last_base0_person_id(event_id: np.ndarray) -> np.ndarray:
    """The last person id (base 0) created at or before ``event_id``: ``event_id // 50``."""
    return event_id // PROPORTION_DENOMINATOR


def last_base0_auction_id(event_id: np.ndarray) -> np.ndarray:
    """The last auction id (base 0) created at or before ``event_id`` (Beam's ``lastBase0AuctionId``)."""
    epoch, off = np.divmod(event_id, PROPORTION_DENOMINATOR)
    person = off < PERSON_PROPORTION
    epoch = epoch - person
    off = np.where(person | (off >= PERSON_PROPORTION + AUCTION_PROPORTION),
                   AUCTION_PROPORTION - 1, off - PERSON_PROPORTION)
    return epoch * AUCTION_PROPORTION + off


def _next_base0_person_id(rng: LaneRandom, lanes: np.ndarray, event_id: np.ndarray,
                          config: GeneratorConfig) -> np.ndarray:
    num = last_base0_person_id(event_id) + 1
    active = np.minimum(num, config.num_active_people)
    return num - active + rng.next_int_bounded(active + PERSON_ID_LEAD, lanes)


def _next_base0_auction_id(rng: LaneRandom, lanes: np.ndarray, event_id: np.ndarray,
                           config: GeneratorConfig) -> np.ndarray:
    last = last_base0_auction_id(event_id)
    lo = np.maximum(last - config.num_in_flight_auctions, 0)
    return lo + rng.next_int_bounded(last - lo + 1 + AUCTION_ID_LEAD, lanes)


def _next_price(rng: LaneRandom) -> np.ndarray:
    """``Math.round(Math.pow(10, nextDouble() * 6) * 100)``: cents in ``[100, 10**8]``."""
    return np.floor(np.power(10.0, rng.next_double() * 6.0) * 100.0 + 0.5).astype(np.int64)


# -- strings as byte matrices ---------------------------------------------------------------------


def prefix_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """bool ``(len(lengths), width)``: row ``i`` true in its first ``lengths[i]`` columns.
    Compared as int16 when ``width`` allows (a quarter of int64's bytes: 4,600 rows of 84
    columns in 0.16 ms instead of 0.53)."""
    if width < np.iinfo(np.int16).max:
        clipped = np.minimum(lengths, width).astype(np.int16)
        return np.arange(width, dtype=np.int16) < clipped[:, None]
    return np.arange(width) < np.asarray(lengths)[:, None]


class Text:
    """Per-lane ASCII strings: ``chars`` (uint8, shape ``(lanes, width)``) and ``keep`` (bool,
    same shape); a lane's string is its kept bytes in column order."""

    __slots__ = ("chars", "keep")

    def __init__(self, chars: np.ndarray, keep: np.ndarray) -> None:
        self.chars = chars
        self.keep = keep

    @staticmethod
    def constant(text: str, lanes: int) -> Text:
        """The same string in every lane."""
        raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        return Text(np.broadcast_to(raw, (lanes, len(raw))), np.ones((lanes, len(raw)), dtype=bool))

    @staticmethod
    def choice(options: tuple[str, ...], index: np.ndarray) -> Text:
        """``options[index[i]]`` in lane ``i``."""
        width = max(len(o) for o in options)
        table = np.zeros((len(options), width), dtype=np.uint8)
        for i, o in enumerate(options):
            table[i, : len(o)] = np.frombuffer(o.encode("ascii"), dtype=np.uint8)
        lengths = np.array([len(o) for o in options])
        return Text(table[index], prefix_mask(lengths[index], width))

    @staticmethod
    def concat(*parts: Text) -> Text:
        """Lane-wise concatenation."""
        return Text(np.hstack([p.chars for p in parts]), np.hstack([p.keep for p in parts]))

    def lengths(self) -> np.ndarray:
        """int64 length of each lane's string."""
        return self.keep.sum(axis=1, dtype=np.int64)

    def to_arrow(self) -> pa.Array:
        """A ``utf8`` Arrow array (one string per lane)."""
        lanes = len(self.keep)
        offsets = np.zeros(lanes + 1, dtype=np.int32)
        np.cumsum(self.keep.sum(axis=1, dtype=np.int32), out=offsets[1:])
        data = np.ascontiguousarray(self.chars)[self.keep]
        return pa.StringArray.from_buffers(lanes, pa.py_buffer(offsets), pa.py_buffer(data))


_SPACE = 32
_LOWER_A = 97


def next_string(rng: LaneRandom, max_length: int) -> Text:
    """Beam's ``nextString(random, maxLength)`` for every lane of ``rng``.

    Length ``3 + nextInt(maxLength - 3)``; per character ``nextInt(13) == 0`` gives a space,
    else ``'a' + nextInt(26)`` (a second draw); Java's ``trim()`` strips the spaces at both
    ends (see ``string_characters``).
    """
    length = MIN_STRING_LENGTH + rng.next_int_bounded(max_length - MIN_STRING_LENGTH)
    raw = string_characters(rng, length)
    return _trim(raw.chars, raw.keep)


_LIMIT26 = np.uint32(((1 << 31) // 26) * 26)
"""``nextInt(26)`` rejects ``next(31)`` at or above this; ``nextInt(13)``'s zone starts higher."""
_INV13 = np.uint32(pow(13, -1, 1 << 32))
_MULTIPLES13 = np.uint32(((1 << 32) - 1) // 13)
"""``x`` (uint32) is a multiple of 13 iff ``x * _INV13`` (mod 2**32) is at most this: one
multiply and a compare, where numpy's integer ``%`` costs several times more."""
_SHIFT31 = np.uint64(17)


def string_characters(rng: LaneRandom, length: np.ndarray) -> Text:
    """The ``length[i]`` characters ``nextString`` draws in lane ``i`` after its length draw
    (untrimmed: ``keep`` marks them), equal to ``next_string_stepwise`` but without a loop
    over positions.

    A character takes one draw (``nextInt(13) == 0``: a space) or two (a letter flag, then
    ``nextInt(26)``).  All ``2 * max(length)`` draws a lane could need are computed at once
    (``LaneRandom.peek_steps``, one row per draw); which of them *start* a character has a
    closed form: draw ``m`` does iff ``m - s`` is even, where ``s`` is one past the last draw
    before ``m`` whose flag was a space (0 if none).  (After a space flag the next draw
    starts a character whatever came before; in a run of letter flags, starts alternate.)
    So the starts are one ``maximum.accumulate`` and a parity, and a lane's ``j``-th start
    is its ``j``-th character.  A call in which any computed draw falls in a rejection zone
    (a re-draw in Java; probability about 1e-8 a draw) is done by ``next_string_stepwise``.
    """
    length = np.asarray(length, dtype=np.int64)
    lanes = len(length)
    width = int(length.max()) if lanes else 0
    if width == 0:
        return Text(np.zeros((lanes, 0), dtype=np.uint8), np.zeros((lanes, 0), dtype=bool))
    draws = 2 * width
    states = rng.peek_steps(draws)  # (draws, lanes): the state after draw m
    values = (states >> _SHIFT31).astype(np.uint32)  # next(31) of draw m
    if values.max() >= _LIMIT26:
        return next_string_stepwise(rng, length)
    letter = values * _INV13 > _MULTIPLES13  # as a flag draw: nextInt(13) != 0
    small = np.int16 if draws < np.iinfo(np.int16).max else np.int32
    draw = np.arange(draws, dtype=small)[:, None]
    run_start = np.empty((draws, lanes), dtype=small)  # s above, per draw and lane
    run_start[0] = 0
    np.maximum.accumulate(np.where(letter[:-1], small(-1), draw[:-1]), axis=0, out=run_start[1:])
    run_start[1:] += 1
    starts = ((draw - run_start) & 1) == 0
    position = np.cumsum(starts, axis=0, dtype=small)  # characters started up to draw m
    taken = starts & (position <= length[None, :])
    at = np.flatnonzero(taken.T)  # lane by lane, each lane's characters in order
    data = (values.T.ravel()[at + 1] % np.uint32(26)).astype(np.uint8) + np.uint8(_LOWER_A)
    data[~letter.T.ravel()[at]] = _SPACE
    keep = prefix_mask(length, width)
    chars = np.zeros((lanes, width), dtype=np.uint8)
    chars[keep] = data
    last = (position < length[None, :]).sum(axis=0)  # the draw starting each lane's last character
    used = np.where(length > 0, last + 1 + letter[np.minimum(last, draws - 1), np.arange(lanes)], 0)
    rng.advance(states.T, used)
    return Text(chars, keep)


def _trim(chars: np.ndarray, used: np.ndarray) -> Text:
    """Java's ``String.trim()`` of each lane's used characters (all of them ASCII >= ' ')."""
    width = chars.shape[1]
    solid = used & (chars > _SPACE)
    has = solid.any(axis=1)
    start = np.argmax(solid, axis=1)
    end = width - np.argmax(solid[:, ::-1], axis=1)
    position = np.arange(width)
    keep = used & (position >= start[:, None]) & (position < end[:, None]) & has[:, None]
    return Text(chars, keep)


def next_string_stepwise(rng: LaneRandom, length: np.ndarray,
                         lanes: np.ndarray | None = None) -> Text:
    """The characters of ``nextString`` after its length draw, position by position: each step
    draws ``nextInt(13)`` (and ``nextInt(26)`` for a letter) for the lanes still inside their
    ``length``; rejection loops re-draw only the rejected lanes.  Untrimmed: ``keep`` marks the
    ``length`` characters of each lane."""
    length = np.asarray(length, dtype=np.int64)
    count = len(length)
    width = int(length.max()) if count else 0
    chars = np.zeros((count, width), dtype=np.uint8)
    for j in range(width):
        active = np.flatnonzero(length > j)
        sub = active if lanes is None else lanes[active]
        is_letter = rng.next_int_bounded(13, sub) != 0
        column = np.full(len(active), _SPACE, dtype=np.uint8)
        column[is_letter] = _LOWER_A + rng.next_int_bounded(26, sub[is_letter])
        chars[active, j] = column
    return Text(chars, prefix_mask(length, width))


def next_exact_string(rng: LaneRandom, lengths: np.ndarray) -> Text:
    """Beam's ``nextExactString(random, length)`` per lane: one ``nextInt()`` per 6 characters,
    character ``'a' + rnd % 26`` (Java's signed remainder), then ``rnd /= 26`` (truncating).

    Computed on ``|rnd|`` as ``uint32`` (numpy divides by a scalar constant fast): for a
    negative ``rnd`` the digits are negated, ``'a' - (|rnd| % 26)``, done as a ``uint8``
    multiply by 255 (``-1`` modulo 256).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    draws = (lengths + 5) // 6
    raw = rng.next_int_block(draws, signed=False)  # (lanes, K) 32-bit patterns
    lanes, k = raw.shape
    negative = raw >> np.uint32(31)  # 1 for a negative int
    sign = np.uint8(1) - (negative.astype(np.uint8) << np.uint8(1))  # 1 or 255
    magnitude = raw * (np.uint32(1) - (negative << np.uint32(1)))  # |rnd| modulo 2**32
    digits = np.empty((6, lanes, k), dtype=np.uint8)
    for i in range(6):
        quotient = magnitude // np.uint32(26)
        magnitude -= quotient * np.uint32(26)
        digits[i] = magnitude  # < 26: the cast to uint8 keeps it
        magnitude = quotient
    digits *= sign
    digits += np.uint8(_LOWER_A)
    chars = digits.transpose(1, 2, 0).reshape(lanes, 6 * k)
    return Text(chars, prefix_mask(lengths, 6 * k))


def next_extra(rng: LaneRandom, current_size: np.ndarray, average_size: int) -> Text:
    """Beam's ``nextExtra(random, currentSize, desiredAverageSize)`` per lane.

    ``""`` when ``current > average``; else ``d = average - current``,
    ``delta = Math.round(0.2 * d)``, length ``d - delta + (delta ? nextInt(2 * delta) : 0)``
    filled by ``next_exact_string``.
    """
    current = np.asarray(current_size, dtype=np.int64)
    d = average_size - current
    empty = current > average_size
    delta = np.floor(d * 0.2 + 0.5).astype(np.int64)  # Java Math.round (half up)
    size = d - delta
    draw = np.flatnonzero(~empty & (delta != 0))
    if len(draw):
        size[draw] += rng.next_int_bounded(2 * delta[draw], draw)
    size[empty] = 0
    return next_exact_string(rng, size)


# -- the three event kinds ------------------------------------------------------------------------


def _persons(n: np.ndarray, config: GeneratorConfig, extra: bool = True) -> pa.RecordBatch:
    """Person events for event numbers ``n`` (int64, all of kind person); ``extra``: with the
    padding column."""
    event_id = n + config.first_event_id
    rng = LaneRandom(event_id)
    lanes = len(n)
    ident = last_base0_person_id(event_id) + FIRST_PERSON_ID
    first = rng.next_int_bounded(len(FIRST_NAMES))
    last = rng.next_int_bounded(len(LAST_NAMES))
    name = Text.concat(Text.choice(FIRST_NAMES, first), Text.constant(" ", lanes),
                       Text.choice(LAST_NAMES, last))
    user = next_string(rng, 7)
    domain = next_string(rng, 5)
    email = Text.concat(user, Text.constant("@", lanes), domain, Text.constant(".com", lanes))
    card = np.full((lanes, 19), _SPACE, dtype=np.uint8)
    for group in range(4):
        value = rng.next_int_bounded(10_000)
        for digit in range(4):
            card[:, group * 5 + 3 - digit] = 48 + value % 10
            value = value // 10
    credit = Text(card, np.ones((lanes, 19), dtype=bool))
    city = Text.choice(US_CITIES, rng.next_int_bounded(len(US_CITIES)))
    state = Text.choice(US_STATES, rng.next_int_bounded(len(US_STATES)))
    columns = [pa.array(ident), name.to_arrow(), email.to_arrow(), credit.to_arrow(),
               city.to_arrow(), state.to_arrow(), pa.array(config.timestamp(n))]
    if extra:
        current = 8 + name.lengths() + email.lengths() + 19 + city.lengths() + state.lengths()
        columns.append(next_extra(rng, current, config.avg_person_byte_size).to_arrow())
    return pa.RecordBatch.from_arrays(columns, schema=schema("person", extra))


def _auctions(n: np.ndarray, config: GeneratorConfig, extra: bool = True) -> pa.RecordBatch:
    """Auction events for event numbers ``n`` (int64, all of kind auction); ``extra``: with the
    padding column."""
    event_id = n + config.first_event_id
    rng = LaneRandom(event_id)
    ident = last_base0_auction_id(event_id) + FIRST_AUCTION_ID
    hot = rng.next_int_bounded(config.hot_sellers_ratio) > 0
    seller = (last_base0_person_id(event_id) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    cold = np.flatnonzero(~hot)
    if len(cold):
        seller[cold] = _next_base0_person_id(rng, cold, event_id[cold], config)
    seller += FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + rng.next_int_bounded(NUM_CATEGORIES)
    initial_bid = _next_price(rng)
    time = config.timestamp(n)
    horizon = config.timestamp(n + config.auction_horizon_events) - time
    expires = time + 1 + rng.next_int_bounded(np.maximum(2 * horizon, 1))
    item = next_string(rng, 20)
    description = next_string(rng, 100)
    reserve = initial_bid + _next_price(rng)
    columns = [pa.array(ident), item.to_arrow(), description.to_arrow(), pa.array(initial_bid),
               pa.array(reserve), pa.array(time), pa.array(expires), pa.array(seller),
               pa.array(category)]
    if extra:
        current = 8 + item.lengths() + description.lengths() + 40
        columns.append(next_extra(rng, current, config.avg_auction_byte_size).to_arrow())
    return pa.RecordBatch.from_arrays(columns, schema=schema("auction", extra))


def _bids(n: np.ndarray, config: GeneratorConfig, extra: bool = True) -> pa.RecordBatch:
    """Bid events for event numbers ``n`` (int64, all of kind bid); ``extra``: with the padding
    column."""
    event_id = n + config.first_event_id
    rng = LaneRandom(event_id)
    hot = rng.next_int_bounded(config.hot_auction_ratio) > 0
    auction = (last_base0_auction_id(event_id) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    cold = np.flatnonzero(~hot)
    if len(cold):
        auction[cold] = _next_base0_auction_id(rng, cold, event_id[cold], config)
    auction += FIRST_AUCTION_ID
    hot = rng.next_int_bounded(config.hot_bidders_ratio) > 0
    bidder = (last_base0_person_id(event_id) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    cold = np.flatnonzero(~hot)
    if len(cold):
        bidder[cold] = _next_base0_person_id(rng, cold, event_id[cold], config)
    bidder += FIRST_PERSON_ID
    price = _next_price(rng)
    columns = [pa.array(auction), pa.array(bidder), pa.array(price), pa.array(config.timestamp(n))]
    if extra:
        current = np.full(len(n), 32, dtype=np.int64)
        columns.append(next_extra(rng, current, config.avg_bid_byte_size).to_arrow())
    return pa.RecordBatch.from_arrays(columns, schema=schema("bid", extra))


_BUILDERS = {"person": _persons, "auction": _auctions, "bid": _bids}


def event_kinds(n: np.ndarray, config: GeneratorConfig) -> np.ndarray:
    """Kind of each event number: 0 person, 1 auction, 2 bid (``eventId % 50``: 0, 1–3, 4–49)."""
    rem = (n + config.first_event_id) % PROPORTION_DENOMINATOR
    return (rem >= PERSON_PROPORTION).astype(np.int8) + (rem >= PERSON_PROPORTION + AUCTION_PROPORTION)


def _generate_chunk(first_n: int, count: int, config: GeneratorConfig,
                    extra: bool = True) -> dict[str, pa.RecordBatch]:
    n = np.arange(first_n, first_n + count, dtype=np.int64)
    kinds = event_kinds(n, config)
    out = {}
    for k, kind in enumerate(KINDS):
        lanes = n[kinds == k]
        out[kind] = _BUILDERS[kind](lanes, config, extra) if len(lanes) else _empty(kind, extra)
    return out


def _empty(kind: str, extra: bool = True) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema(kind, extra))


def generate(first_n: int, count: int, config: GeneratorConfig | None = None,
             extra: bool = True) -> dict[str, pa.RecordBatch]:
    """The events with event numbers ``[first_n, first_n + count)``, by kind.

    Returns ``{"person": ..., "auction": ..., "bid": ...}``, each an Arrow ``RecordBatch``
    (schemas ``PERSON_SCHEMA`` etc.) in event-number order, hence ``dateTime`` order.  With
    ``extra`` False every kind's ``extra`` padding is neither generated nor returned
    (``schema(kind, False)``); every other value is the same: the padding is each event's
    last draw (about half of the generator's time: 0.49M events/s with it, 1.08M without,
    one core, 2026-12-01).

    Raises:
        ValueError: for a negative ``first_n`` or ``count``.
    """
    config = config or GeneratorConfig()
    if first_n < 0 or count < 0:
        raise ValueError(f"first_n and count must be >= 0, got {first_n}, {count}")
    parts = [_generate_chunk(s, min(CHUNK, first_n + count - s), config, extra)
             for s in range(first_n, first_n + count, CHUNK)]
    if not parts:
        return {kind: _empty(kind, extra) for kind in KINDS}
    if len(parts) == 1:
        return parts[0]
    out = {}
    for kind in KINDS:
        batches = [p[kind] for p in parts]
        kind_schema = schema(kind, extra)
        out[kind] = pa.RecordBatch.from_arrays(
            [pa.concat_arrays([b.column(i) for b in batches]) for i in range(len(kind_schema))],
            schema=kind_schema)
    return out


def worker_blocks(worker: int, peers: int, total: int, batch: int) -> Iterator[tuple[int, int]]:
    """``(first_n, count)`` of worker ``worker``'s blocks: event numbers ``[0, total)`` cut into
    blocks of ``batch``, block ``b`` going to worker ``b % peers`` (in increasing order)."""
    if not 0 <= worker < peers:
        raise ValueError(f"worker {worker} not in [0, {peers})")
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    for first in range(worker * batch, total, peers * batch):
        yield first, min(batch, total - first)


def events_for_worker(worker: int, peers: int, total: int, batch: int = 10_000,
                      config: GeneratorConfig | None = None) -> Iterator[dict[str, pa.RecordBatch]]:
    """Worker ``worker``'s share of events ``[0, total)``: one ``generate`` result per block of
    ``batch`` events (see ``worker_blocks``), in event-time order within the worker."""
    config = config or GeneratorConfig()
    for first, count in worker_blocks(worker, peers, total, batch):
        yield generate(first, count, config)


PART_EVENTS = 1_000_000
"""Events per part file of ``write_parquet`` (bounds the memory one part takes to write)."""

_PART = re.compile(r"part-(\d{5,})\.parquet")


def _write_error(exc: OSError, path: str) -> OSError:
    """``exc`` as an ``OSError`` whose ``filename`` is ``path`` (the file being written)."""
    if exc.errno is not None:
        return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), path)
    error = OSError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    error.filename = path
    return error


def write_parquet(directory: str | os.PathLike[str], events: int, rate: int = 10_000,
                  config: GeneratorConfig | None = None, batch: int = 100_000,
                  part_events: int = PART_EVENTS) -> dict[str, int]:
    """Write events ``[0, events)`` as ``directory/{person,auction,bid}/part-NNNNN.parquet``.

    Part ``k`` of each kind holds that kind's events among ``[k * part_events,
    (k + 1) * part_events)`` (one part, ``part-00000.parquet``, when ``events <= part_events``,
    also for 0 events), in ``dateTime`` order, in row groups of at most ``batch`` rows.
    ``config`` (default: ``GeneratorConfig(rate=rate)``) wins over ``rate``.  Returns the
    number of rows written per kind.

    All or nothing: every part is written (``pyarrow.parquet.write_table``) under a hidden
    temporary name in its final directory (``.part-NNNNN.parquet.<pid>-<random>.tmp``, which
    Arrow, Spark and ``tokenflow.nexmark.files`` skip); only when every part of every kind is
    complete are they renamed into place (``os.replace``), after which the ``part-NNNNN.parquet``
    files of an earlier, longer output beyond this one's parts are removed.  On an error (e.g. a
    full disk) the temporary files are removed and an earlier output in ``directory`` is left
    as it was (a failure between two renames, which need no space, could still mix them).

    Raises:
        OSError: creating a directory or writing or renaming a file failed; ``filename`` is the
            final path of the part being written (e.g. ``errno.ENOSPC`` for a full disk).
        ValueError: ``events < 0``, ``batch < 1`` or ``part_events < 1``.
    """
    if events < 0 or batch < 1 or part_events < 1:
        raise ValueError(f"need events >= 0, batch >= 1 and part_events >= 1, got {events}, "
                         f"{batch}, {part_events}")
    config = config or GeneratorConfig(rate=rate)
    root = os.fspath(directory)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    parts = max(1, -(-events // part_events))
    counts = dict.fromkeys(KINDS, 0)
    staged: list[tuple[str, str]] = []  # (temporary, final) paths
    try:
        for kind in KINDS:
            os.makedirs(os.path.join(root, kind), exist_ok=True)
        for k in range(parts):
            first = k * part_events
            count = max(0, min(part_events, events - first))
            blocks = [generate(s, min(batch, first + count - s), config)
                      for s in range(first, first + count, batch)]
            for kind in KINDS:
                table = pa.Table.from_batches([b[kind] for b in blocks], schema=SCHEMAS[kind])
                final = os.path.join(root, kind, f"part-{k:05d}.parquet")
                temporary = os.path.join(root, kind, f".part-{k:05d}.parquet.{token}.tmp")
                staged.append((temporary, final))
                try:
                    pq.write_table(table, temporary, row_group_size=batch)
                except OSError as exc:
                    raise _write_error(exc, final) from exc
                counts[kind] += table.num_rows
            del blocks
        for temporary, final in staged:
            try:
                os.replace(temporary, final)
            except OSError as exc:
                raise _write_error(exc, final) from exc
    except BaseException:
        for temporary, _ in staged:
            try:
                os.remove(temporary)
            except FileNotFoundError:
                pass
        raise
    for kind in KINDS:  # parts of an earlier, longer output
        folder = os.path.join(root, kind)
        for name in os.listdir(folder):
            match = _PART.fullmatch(name)
            if match is not None and int(match.group(1)) >= parts:
                os.remove(os.path.join(folder, name))
    return counts


# -- dataflow source ------------------------------------------------------------------------------


def nexmark_source(scope: Any, events: int, config: GeneratorConfig | None = None,
                   batch: int = 10_000, granularity_ms: int = 1,
                   name: str = "Nexmark") -> dict[str, Any]:
    """Three streams ``{"person", "auction", "bid"}`` of Arrow batches of events ``[0, events)``.

    Each worker generates its blocks (``worker_blocks(worker, peers, events, batch)``), one block
    per activation, and sends each kind's rows of one logical time as one message; a record's
    logical time is its ``dateTime`` in ms (floored to a multiple of ``granularity_ms`` when that
    is > 1, to send fewer, larger messages).  The operator holds one token per output, at most
    the time of the next event it will produce; after a block it downgrades them to the first
    time of its next block, and drops them after its last.
    """
    from tokenflow.dataflow.operators.builder import OperatorBuilder

    config = config or GeneratorConfig()
    if granularity_ms <= 0:
        raise ValueError(f"granularity_ms must be > 0, got {granularity_ms}")
    builder = OperatorBuilder(name, scope, notify=False)
    ports = [builder.new_output() for _ in KINDS]
    activate = builder.activator()
    # a worker that joined the running job generates nothing: the blocks stay with the
    # workers the job started with (its tokens would be uncounted)
    blocks = [] if getattr(scope.worker, "joining", False) else \
        list(worker_blocks(scope.worker_index, scope.peers, events, batch))
    metrics = getattr(scope.worker, "metrics", {})

    def floor(t: int) -> int:
        return t - t % granularity_ms

    def constructor(caps: list[Any]) -> Any:
        tokens: list[Any] = list(caps)
        position = [0]

        def finish() -> None:
            for cap in tokens:
                cap.drop()
            tokens.clear()

        def logic(frontiers: list[Any]) -> bool:
            if not tokens:
                return False
            i = position[0]
            if i >= len(blocks):
                finish()
                return False
            first, count = blocks[i]
            start = floor(int(config.timestamp(first)))
            for cap in tokens:
                if cap.time < start:
                    cap.downgrade(start)
            data = generate(first, count, config)
            metrics["records_in"] = metrics.get("records_in", 0) + count
            for (output, _), cap, kind in zip(ports, tokens, KINDS, strict=True):
                records = data[kind]
                if not records.num_rows:
                    continue
                times = records.column("dateTime").to_numpy()
                if granularity_ms > 1:
                    times = round_down(times, granularity_ms)
                bounds = np.flatnonzero(np.diff(times)) + 1
                starts = [0, *bounds.tolist()]
                ends = [*bounds.tolist(), len(times)]
                for s, e in zip(starts, ends, strict=True):
                    output.give_batch(cap, records.slice(s, e - s), time=int(times[s]))
            position[0] = i + 1
            if i + 1 < len(blocks):
                following = floor(int(config.timestamp(blocks[i + 1][0])))
                for cap in tokens:
                    cap.downgrade(following)
                activate()
            else:
                finish()
            return False

        return logic

    builder.build(constructor)
    return {kind: stream for kind, (_, stream) in zip(KINDS, ports, strict=True)}


def expected_counts(first_n: int, count: int, config: GeneratorConfig | None = None) -> dict[str, int]:
    """How many persons, auctions and bids event numbers ``[first_n, first_n + count)`` hold."""
    config = config or GeneratorConfig()
    lo = first_n + config.first_event_id
    hi = lo + count

    def upto(x: int, r: int) -> int:  # ids in [0, x) with id % 50 < r
        q, m = divmod(x, PROPORTION_DENOMINATOR)
        return q * r + min(m, r)

    persons = upto(hi, 1) - upto(lo, 1)
    auctions = upto(hi, 4) - upto(lo, 4) - persons
    return {"person": persons, "auction": auctions, "bid": count - persons - auctions}


__all__ = [
    "AUCTION_SCHEMA", "BASE_TIME_MS", "BID_SCHEMA", "KINDS", "PADDING", "PERSON_SCHEMA", "SCHEMAS",
    "GeneratorConfig", "events_for_worker", "expected_counts", "generate", "last_base0_auction_id",
    "last_base0_person_id", "nexmark_source", "schema", "worker_blocks", "write_parquet",
]
