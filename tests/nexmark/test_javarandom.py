"""``tokenflow.nexmark.javarandom`` against java.util.Random.

Expectations come from (1) literal values printed by OpenJDK 17's ``java.util.Random`` (a
throwaway Java program, values pasted below) and (2) ``RefRandom``, an independent scalar
transcription of the JDK algorithm written here (Java ``int`` overflow emulated explicitly).
"""

from __future__ import annotations

import numpy as np
import pytest

from tokenflow.nexmark.javarandom import JavaRandom, LaneRandom, jump_constants

pytestmark = pytest.mark.timeout(60)


def _int32(x: int) -> int:
    """Java's ``(int)`` cast: keep the low 32 bits, two's complement."""
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


class RefRandom:
    """java.util.Random as in OpenJDK 17's ``Random.java``, one line per Java statement."""

    def __init__(self, seed: int) -> None:
        self.seed = (seed ^ 0x5DEECE66D) & ((1 << 48) - 1)

    def next(self, bits: int) -> int:
        self.seed = (self.seed * 0x5DEECE66D + 0xB) & ((1 << 48) - 1)
        return _int32(self.seed >> (48 - bits))

    def next_int(self) -> int:
        return self.next(32)

    def next_int_bound(self, bound: int) -> int:
        r = self.next(31)
        m = bound - 1
        if (bound & m) == 0:
            return _int32((bound * r) >> 31)
        u = r
        while True:
            r = u % bound
            if _int32(u - r + m) >= 0:  # Java: `u - r + m < 0` means the int overflowed
                return r
            u = self.next(31)

    def next_double(self) -> float:
        return ((self.next(26) << 27) + self.next(27)) * (1.0 / (1 << 53))


# Printed by OpenJDK 17.0.15 (java.util.Random).
JAVA_VALUES = {
    "new Random(42).nextInt()": -1170105035,
    "new Random(42).nextInt(10)": 0,
    "new Random(0).nextInt()": -1155484576,
    "new Random(42).nextDouble()": 0.7275636800328681,
    "new Random(0).nextDouble()": 0.730967787376657,
}
SEQ_123456789_INTS = [-1442945365, -1016548095, 1962592967, 1094656688, 1677212580]
SEQ_123456789_DOUBLES = [0.664038103272266, 0.45695178590520646, 0.39050647939140426]
SEQ_MINUS7_BOUNDS = [1, 2, 3, 13, 26, 97, 1000, 1 << 30, (1 << 30) + 1, 2147483647]
SEQ_MINUS7_VALUES = [0, 1, 1, 3, 18, 53, 591, 338837718, 184135245, 425474944]
SEQ_5_REJECTING = [379250092, 189533474, 1049914506, 991787854, 963357722, 918177321, 596500747,
                   742486560]  # new Random(5): 8 x nextInt(2**30 + 1), ~50% of draws rejected
FIRST_DRAW_REJECTED = {0: 516548029, 7: 20678044, 99: 836448458}  # nextInt(2**30 + 1)
SEED_MAX = (2**63 - 1, [1155099827, 225, 12866])  # nextInt(), nextInt(1000), nextInt(1 << 20)
SEED_MIN = (-(2**63), [-1155484576, 5, 23])  # nextInt(), nextInt(13), nextInt(26)
SEED_1000000 = [10, 4, 0, 7, 8, 480, -1884064316, 0.4783029776868002]


@pytest.mark.parametrize("impl", [RefRandom, JavaRandom])
def test_known_java_values(impl: type) -> None:
    def draw_int(r: object, bound: int | None = None) -> int:
        if isinstance(r, RefRandom):
            return r.next_int() if bound is None else r.next_int_bound(bound)
        assert isinstance(r, JavaRandom)
        return r.next_int(bound)

    assert draw_int(impl(42)) == JAVA_VALUES["new Random(42).nextInt()"]
    assert draw_int(impl(42), 10) == JAVA_VALUES["new Random(42).nextInt(10)"]
    assert draw_int(impl(0)) == JAVA_VALUES["new Random(0).nextInt()"]
    assert impl(42).next_double() == JAVA_VALUES["new Random(42).nextDouble()"]
    assert impl(0).next_double() == JAVA_VALUES["new Random(0).nextDouble()"]
    r = impl(123456789)
    assert [draw_int(r) for _ in range(5)] == SEQ_123456789_INTS
    r = impl(123456789)
    assert [r.next_double() for _ in range(3)] == SEQ_123456789_DOUBLES
    r = impl(-7)
    assert [draw_int(r, b) for b in SEQ_MINUS7_BOUNDS] == SEQ_MINUS7_VALUES
    r = impl(5)
    assert [draw_int(r, (1 << 30) + 1) for _ in range(8)] == SEQ_5_REJECTING
    for seed, value in FIRST_DRAW_REJECTED.items():
        assert draw_int(impl(seed), (1 << 30) + 1) == value
    seed, (a, b, c) = SEED_MAX
    r = impl(seed)
    assert [draw_int(r), draw_int(r, 1000), draw_int(r, 1 << 20)] == [a, b, c]
    seed, (a, b, c) = SEED_MIN
    r = impl(seed)
    assert [draw_int(r), draw_int(r, 13), draw_int(r, 26)] == [a, b, c]
    r = impl(1_000_000)
    got = [draw_int(r, b) for b in (11, 9, 4, 13, 26, 10000)] + [draw_int(r), r.next_double()]
    assert got == SEED_1000000


def test_java_random_next_long_and_bad_bounds() -> None:
    # nextLong() = (next(32) << 32) + next(32); new Random(42).nextLong() per OpenJDK 17.
    assert JavaRandom(42).next_long() == -5025562857975149833
    with pytest.raises(ValueError):
        JavaRandom(1).next_int(0)
    with pytest.raises(ValueError):
        JavaRandom(1).next_int(2**31)


SEEDS = np.concatenate([
    np.arange(0, 300, dtype=np.int64),
    np.array([-1, -7, 2**63 - 1, -(2**63), 2**48, 2**48 - 1, 123456789, 10**12 + 3]),
    np.random.default_rng(7).integers(-(2**62), 2**62, size=200),
])


def test_lanes_match_scalar_reference_all_lanes() -> None:
    lanes = LaneRandom(SEEDS)
    refs = [RefRandom(int(s)) for s in SEEDS]
    for bound in [None, 1, 2, 64, 1 << 30, 3, 13, 26, 97, 1000, 10000, (1 << 30) + 1,
                  (1 << 30) + 1, 2147483647, "double", 17]:
        if bound is None:
            got = lanes.next_int()
            want = [r.next_int() for r in refs]
        elif bound == "double":
            got = lanes.next_double()
            want = [r.next_double() for r in refs]
        else:
            got = lanes.next_int_bounded(bound)
            want = [r.next_int_bound(bound) for r in refs]
        assert got.tolist() == want, bound
    assert lanes.state.tolist() == [r.seed for r in refs]


def test_lanes_match_scalar_reference_subsets_and_per_lane_bounds() -> None:
    rng = np.random.default_rng(11)
    lanes = LaneRandom(SEEDS)
    refs = [RefRandom(int(s)) for s in SEEDS]
    candidates = np.array([1, 2, 4, 7, 13, 26, 111, 1010, 1 << 29, (1 << 30) + 1, 2147483647])
    for step in range(40):
        subset = np.flatnonzero(rng.random(len(SEEDS)) < 0.5)
        rng.shuffle(subset)  # any order
        kind = step % 4
        if kind == 0:
            bounds = rng.choice(candidates, size=len(subset))
            got = lanes.next_int_bounded(bounds, subset)
            want = [refs[i].next_int_bound(int(b)) for i, b in zip(subset, bounds, strict=True)]
        elif kind == 1:
            got = lanes.next_int_bounded((1 << 30) + 1, subset)  # heavy rejection, scalar bound
            want = [refs[i].next_int_bound((1 << 30) + 1) for i in subset]
        elif kind == 2:
            got = lanes.next_double(subset)
            want = [refs[i].next_double() for i in subset]
        else:
            got = lanes.next_int(subset)
            want = [refs[i].next_int() for i in subset]
        assert got.tolist() == want, step
        assert lanes.state.tolist() == [r.seed for r in refs], step  # others did not move


def test_next_int_block_matches_successive_next_int() -> None:
    rng = np.random.default_rng(3)
    lanes = LaneRandom(SEEDS)
    refs = [RefRandom(int(s)) for s in SEEDS]
    for width in (0, 1, 14, 70):  # 70 > the 64 precomputed jump constants
        counts = rng.integers(0, width + 1, size=len(SEEDS))
        block = lanes.next_int_block(counts)
        assert block.shape == (len(SEEDS), int(counts.max()))
        for i, r in enumerate(refs):
            assert block[i, : counts[i]].tolist() == [r.next_int() for _ in range(counts[i])]
        assert lanes.state.tolist() == [r.seed for r in refs]
    unsigned = LaneRandom(SEEDS).next_int_block(np.full(len(SEEDS), 3), signed=False)
    signed = LaneRandom(SEEDS).next_int_block(np.full(len(SEEDS), 3))
    assert unsigned.dtype == np.uint32
    assert (unsigned.view(np.int32) == signed).all()


def test_peek_steps_are_each_lanes_next_states_without_advancing() -> None:
    lanes = LaneRandom(SEEDS)
    before = lanes.state.copy()
    steps = lanes.peek_steps(70)  # 70 > the 64 precomputed jump constants
    assert steps.shape == (70, len(SEEDS))
    assert (lanes.state == before).all()
    for i, seed in enumerate(SEEDS):
        r = RefRandom(int(seed))
        for j in range(70):
            r.next(31)
            assert int(steps[j, i]) == r.seed, (i, j)


def test_jump_constants_compose_single_steps() -> None:
    a, c = jump_constants(5)
    s = 0x123456789AB
    stepped = s
    for j in range(5):
        stepped = (stepped * 0x5DEECE66D + 0xB) & ((1 << 48) - 1)
        assert (int(a[j]) * s + int(c[j])) & ((1 << 48) - 1) == stepped


def test_lane_bounds_are_validated() -> None:
    lanes = LaneRandom(np.arange(3))
    with pytest.raises(ValueError):
        lanes.next_int_bounded(0)
    with pytest.raises(ValueError):
        lanes.next_int_bounded(np.array([5, 0, 3]))
